//! READs on an export's read queue (`Export::read_queue`, issue 16): the connection thread
//! starts each read and answers it when it completes, in completion order, while it goes on
//! with the requests behind it. The queue here delays each read by a rule of its offset (a
//! device that is slow in places) and completes reads in the order they come due, so the
//! tests see the server's side of reads that finish late and out of order: the fast read
//! answered before the slow one sent first, many in flight at once, the in-flight limit and
//! the byte budget kept without deadlock, disconnects that still answer every read started,
//! and a failed read answered with an error.

mod common;

use common::*;
use flashpool_nbd::proto::*;
use flashpool_nbd::wire;
use flashpool_nbd::{Config, Export, ExportError, MemExport, ReadDone, ReadQueue, StaticExports};
use std::collections::VecDeque;
use std::io::Read;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a read at an offset takes, and which offsets fail.
#[derive(Clone, Copy)]
struct Rules {
    /// Reads starting below this offset take `slow`.
    slow_below: u64,
    slow: Duration,
    /// Other reads take up to this much, by a hash of their offset (0: at once).
    jitter_ms: u64,
    /// A read starting here fails with EIO.
    fail_at: Option<u64>,
    /// A read starting here returns one byte short (a broken queue).
    short_at: Option<u64>,
    /// Every other wait with reads pending says the socket is readable when it may not be
    /// (as a poll that fired for bytes a read already took).
    spurious: bool,
    /// A descriptor (`ReadQueue::ready_fd`, a timerfd) that polls readable once a read is
    /// due, so a connection polling while reads are in flight (`Config::read_poll`) sees
    /// completions without a wait.
    ready_fd: bool,
}

struct DelayQueue {
    disk: Arc<MemExport>,
    rules: Rules,
    most: Arc<AtomicUsize>,
    /// (due, token, offset, len)
    pending: Vec<(Instant, u64, u64, usize)>,
    ready: VecDeque<(u64, u64, usize)>,
    waits: u64,
    /// Waits that slept for a read or the socket (shared with the test).
    sleeps: Arc<AtomicUsize>,
    timer: Option<std::os::fd::OwnedFd>,
}

impl DelayQueue {
    fn delay(&self, offset: u64) -> Duration {
        if offset < self.rules.slow_below {
            return self.rules.slow;
        }
        if self.rules.jitter_ms == 0 {
            return Duration::ZERO;
        }
        let h = offset.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
        Duration::from_millis(h % (self.rules.jitter_ms + 1))
    }

    /// Sets the timer to fire when the next pending read is due (at once if it is), or
    /// disarms it when none is pending; any expiry not yet read is cleared first.
    fn arm(&self) {
        use std::os::fd::AsRawFd;
        let Some(t) = &self.timer else { return };
        let mut count = 0u64;
        // SAFETY: reads at most 8 bytes into `count`, a u64 we own; the timerfd is
        // non-blocking, so with no expiry the read fails with EAGAIN (ignored).
        let _ = unsafe { libc::read(t.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
        let next = self.pending.iter().map(|p| p.0).min();
        let left = next.map(|due| due.saturating_duration_since(Instant::now()));
        let value = match left {
            // Zero would disarm: a read already due fires after a nanosecond.
            Some(d) => libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos().max(1) as libc::c_long,
            },
            None => libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
        };
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: value,
        };
        // SAFETY: `spec` is a valid itimerspec on our stack; a null old value is allowed.
        let rc = unsafe { libc::timerfd_settime(t.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        assert_eq!(rc, 0, "timerfd_settime");
    }
}

impl ReadQueue for DelayQueue {
    fn start(&mut self, token: u64, offset: u64, len: usize) {
        let due = Instant::now() + self.delay(offset);
        self.pending.push((due, token, offset, len));
        self.most.fetch_max(self.outstanding(), Ordering::SeqCst);
        self.arm();
    }
    fn submit(&mut self) {}
    fn poll(&mut self) {
        let now = Instant::now();
        self.pending.sort_by_key(|p| p.0);
        while self.pending.first().is_some_and(|p| p.0 <= now) {
            let (_, t, o, l) = self.pending.remove(0);
            self.ready.push_back((t, o, l));
        }
        self.arm();
    }
    fn wait(&mut self, fd: Option<RawFd>) -> std::io::Result<bool> {
        self.poll();
        if !self.ready.is_empty() {
            return Ok(false);
        }
        self.waits += 1;
        if self.rules.spurious && !self.pending.is_empty() && self.waits.is_multiple_of(2) {
            return Ok(true);
        }
        self.sleeps.fetch_add(1, Ordering::SeqCst);
        let timeout = match self.pending.first() {
            Some(p) => p.0.saturating_duration_since(Instant::now()).as_millis() as i32 + 1,
            None if fd.is_some() => -1,
            None => return Ok(false),
        };
        let mut pfd = libc::pollfd {
            fd: fd.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on our stack; a negative fd is ignored by poll.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout) };
        if n > 0 && pfd.revents != 0 {
            return Ok(true);
        }
        self.poll();
        Ok(false)
    }
    fn take(&mut self, f: &mut ReadDone<'_>) -> bool {
        let Some((token, offset, len)) = self.ready.pop_front() else {
            return false;
        };
        if self.rules.fail_at == Some(offset) {
            f(
                token,
                Err(ExportError::from_errno(libc::EIO, "injected read error")),
            );
        } else {
            let mut buf = vec![0u8; len];
            if self.rules.short_at == Some(offset) {
                buf.pop();
            }
            match self.disk.read(offset, &mut buf) {
                Ok(()) => f(token, Ok(Box::new(buf))),
                Err(e) => f(token, Err(e)),
            }
        }
        true
    }
    fn outstanding(&self) -> usize {
        self.pending.len() + self.ready.len()
    }
    fn ready_fd(&self) -> Option<RawFd> {
        use std::os::fd::AsRawFd;
        self.timer.as_ref().map(|t| t.as_raw_fd())
    }
}

const MIB: u64 = 1 << 20;

fn server(rules: Rules, config: Config) -> (TestServer, Arc<AtomicUsize>) {
    let (srv, most, _) = server_counting_sleeps(rules, config);
    (srv, most)
}

/// `server`, and the number of times a queue's wait slept.
fn server_counting_sleeps(
    rules: Rules,
    config: Config,
) -> (TestServer, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let disk = Arc::new(MemExport::new(SIZE));
    let most = Arc::new(AtomicUsize::new(0));
    let sleeps = Arc::new(AtomicUsize::new(0));
    let mut set = StaticExports::new();
    set.add("default", "delaying", {
        let (most, sleeps) = (most.clone(), sleeps.clone());
        QueuedExport::new(disk.clone(), move |disk| {
            let timer = rules.ready_fd.then(|| {
                use std::os::fd::FromRawFd;
                // SAFETY: timerfd_create takes no pointers; it returns a new descriptor or
                // -1 (checked).
                let fd = unsafe {
                    libc::timerfd_create(
                        libc::CLOCK_MONOTONIC,
                        libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
                    )
                };
                assert!(fd >= 0, "timerfd_create");
                // SAFETY: `fd` is the fresh descriptor above, owned by nobody else.
                unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
            });
            Box::new(DelayQueue {
                disk: disk.clone(),
                rules,
                most: most.clone(),
                pending: Vec::new(),
                ready: VecDeque::new(),
                waits: 0,
                sleeps: sleeps.clone(),
                timer,
            })
        })
    });
    (TestServer::start_exports(set, disk, config), most, sleeps)
}

/// Sends `n` reads of 64 KiB scattered over `data` (written from offset 0) in one burst and
/// checks each reply: one per request, the right bytes, not in the order sent (they complete
/// out of order).
fn scattered_reads(c: &mut Raw, data: &[u8], n: u64) {
    let off = |h: u64| (h * 167_936) % (data.len() as u64 - 65536);
    let mut reqs = Vec::new();
    for h in 0..n {
        reqs.extend(read_req(h, off(h), 65536));
    }
    c.send(&reqs);
    let mut order = Vec::new();
    for _ in 0..n {
        let (e, h) = c.simple();
        assert_eq!(e, 0);
        assert!(!order.contains(&h), "one reply per request");
        let o = off(h) as usize;
        assert_eq!(c.recv(65536), data[o..o + 65536], "reply {h}");
        order.push(h);
    }
    assert_ne!(
        order,
        (0..n).collect::<Vec<_>>(),
        "answered as they complete"
    );
}

fn quick() -> Rules {
    Rules {
        slow_below: 0,
        slow: Duration::ZERO,
        jitter_ms: 0,
        fail_at: None,
        short_at: None,
        spurious: false,
        ready_fd: false,
    }
}

/// A server whose connections poll their reads for up to 2 s (`Config::read_poll`, long
/// enough to cover every read of these tests), on queues that announce due reads by a
/// descriptor; with the queues' most reads in flight and their sleeps.
fn polling_server(rules: Rules) -> (TestServer, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let config = Config {
        read_poll: Duration::from_secs(2),
        max_pollers: 1,
        ..Config::default()
    };
    server_counting_sleeps(
        Rules {
            ready_fd: true,
            ..rules
        },
        config,
    )
}

/// Polling while reads are in flight (`Config::read_poll`), long enough to cover every
/// read here: the connection takes completions as they come, answers them out of order,
/// and never sleeps in the queue's wait while it serves them.
#[test]
fn a_connection_polling_its_reads_answers_them_as_they_complete_without_sleeping() {
    let (srv, most, sleeps) = polling_server(Rules {
        jitter_ms: 30,
        ..quick()
    });
    let mut c = srv.raw();
    c.hello();
    c.go("");
    let data = pattern(4 * MIB as usize, 5);
    assert_eq!(c.write(1, 0, &data), 0);
    scattered_reads(&mut c, &data, 32);
    assert!(most.load(Ordering::SeqCst) >= 8, "reads in flight at once");
    assert_eq!(
        sleeps.load(Ordering::SeqCst),
        0,
        "the connection slept in the queue's wait while polling"
    );
    c.disc();
    srv.stop();
}

/// While polling for a slow read, a request that arrives on the socket is taken at once: a
/// fast read sent after a slow one is answered first, and nothing sleeps.
#[test]
fn a_connection_polling_for_a_slow_read_takes_the_next_request_at_once() {
    let (srv, _, sleeps) = polling_server(Rules {
        slow_below: 4096,
        slow: Duration::from_millis(500),
        ..quick()
    });
    let mut c = srv.raw();
    c.hello();
    c.go("");
    let data = pattern(2 * MIB as usize, 8);
    assert_eq!(c.write(1, 0, &data), 0);
    // Two slow reads together (a lone read at depth 1 runs inline), then a fast one.
    let mut slow = read_req(2, 0, 4096);
    slow.extend(read_req(4, 0, 4096));
    c.send(&slow);
    std::thread::sleep(Duration::from_millis(100));
    c.send(&read_req(3, MIB, 4096));
    assert_eq!(c.simple(), (0, 3), "the fast read is answered first");
    assert_eq!(c.recv(4096), data[MIB as usize..MIB as usize + 4096]);
    for _ in 0..2 {
        let (e, h) = c.simple();
        assert!(e == 0 && (h == 2 || h == 4), "{e} {h}");
        assert_eq!(c.recv(4096), data[..4096]);
    }
    assert_eq!(sleeps.load(Ordering::SeqCst), 0, "slept while polling");
    c.disc();
    srv.stop();
}

#[test]
fn a_fast_read_is_answered_before_a_slow_one_sent_earlier() {
    let rules = Rules {
        slow_below: 4096,
        slow: Duration::from_millis(400),
        ..quick()
    };
    let (srv, _) = server(rules, Config::default());
    let mut c = srv.raw();
    c.hello();
    c.go("");
    let data = pattern(2 * MIB as usize, 7);
    assert_eq!(c.write(1, 0, &data), 0);
    let mut both = read_req(2, 0, 4096);
    both.extend(read_req(3, MIB, 4096));
    c.send(&both);
    assert_eq!(c.simple(), (0, 3), "the fast read is answered first");
    assert_eq!(c.recv(4096), data[MIB as usize..MIB as usize + 4096]);
    assert_eq!(c.simple(), (0, 2));
    assert_eq!(c.recv(4096), data[..4096]);
    c.disc();
    srv.stop();
}

#[test]
fn many_reads_are_in_flight_and_answered_as_they_complete() {
    let rules = Rules {
        jitter_ms: 30,
        ..quick()
    };
    let (srv, most) = server(rules, Config::default());
    let mut c = srv.raw();
    c.hello();
    c.go("");
    let data = pattern(8 * MIB as usize, 3);
    assert_eq!(c.write(1, 0, &data[..4 * MIB as usize]), 0);
    assert_eq!(c.write(1, 4 * MIB, &data[4 * MIB as usize..]), 0);
    scattered_reads(&mut c, &data, 48);
    assert!(
        most.load(Ordering::SeqCst) >= 8,
        "reads in flight at once: {}",
        most.load(Ordering::SeqCst)
    );
    c.disc();
    srv.stop();
}

#[test]
fn structured_reads_with_holes_read_only_their_data() {
    let rules = Rules {
        jitter_ms: 10,
        ..quick()
    };
    let (srv, _) = server(rules, Config::default());
    let mut c = Raw::connect(&srv, true, false);
    // Data at 64 KiB..128 KiB and 192 KiB..256 KiB; holes around.
    let a = pattern(65536, 11);
    let b = pattern(65536, 12);
    assert_eq!(c.write(1, 65536, &a), 0);
    assert_eq!(c.write(2, 196_608, &b), 0);
    let mut reqs = Vec::new();
    for h in 10..20u64 {
        reqs.extend(read_req(h, 0, 262_144));
    }
    c.send(&reqs);
    let mut want = vec![0u8; 262_144];
    want[65536..131_072].copy_from_slice(&a);
    want[196_608..].copy_from_slice(&b);
    let mut got: std::collections::HashMap<u64, Vec<u8>> = Default::default();
    let mut finished = 0;
    while finished < 10 {
        let ch = c.chunk();
        let buf = got.entry(ch.handle).or_insert_with(|| vec![0xAA; 262_144]);
        match ch.kind {
            REPLY_TYPE_OFFSET_DATA => {
                let o = wire::be64(&ch.data[..8]) as usize;
                buf[o..o + ch.data.len() - 8].copy_from_slice(&ch.data[8..]);
            }
            REPLY_TYPE_OFFSET_HOLE => {
                let o = wire::be64(&ch.data[..8]) as usize;
                let l = wire::be32(&ch.data[8..12]) as usize;
                buf[o..o + l].fill(0);
            }
            REPLY_TYPE_NONE => {}
            k => panic!("unexpected chunk type {k}"),
        }
        if ch.flags & REPLY_FLAG_DONE != 0 {
            finished += 1;
        }
    }
    assert_eq!(got.len(), 10);
    for (h, buf) in got {
        assert!(buf == want, "read {h} assembled from its chunks");
    }
    c.disc();
    srv.stop();
}

#[test]
fn the_in_flight_limit_bounds_the_queue() {
    let rules = Rules {
        jitter_ms: 20,
        ..quick()
    };
    let config = Config {
        max_in_flight_per_connection: 4,
        ..Config::default()
    };
    let (srv, most) = server(rules, config);
    let mut c = srv.raw();
    c.hello();
    c.go("");
    let mut reqs = Vec::new();
    for h in 0..40u64 {
        reqs.extend(read_req(h, h * 8192, 4096));
    }
    c.send(&reqs);
    for _ in 0..40 {
        let (e, _) = c.simple();
        assert_eq!(e, 0);
        c.recv(4096);
    }
    let m = most.load(Ordering::SeqCst);
    assert!(
        (2..=4).contains(&m),
        "at most 4 in flight, more than 1: {m}"
    );
    c.disc();
    srv.stop();
}

#[test]
fn reads_holding_the_whole_budget_do_not_deadlock_the_connection() {
    // Ten 8 MiB reads hold more than the 64 MiB budget (the least a connection gets), and a
    // write follows: its budget is freed only as the connection answers its own reads.
    let rules = Rules {
        slow_below: SIZE,
        slow: Duration::from_millis(30),
        ..quick()
    };
    let (srv, _) = server(rules, Config::default());
    let mut c = srv.raw();
    c.hello();
    c.go("");
    let data = pattern(8 * MIB as usize, 5);
    assert_eq!(c.write(1, 0, &data), 0);
    let mut reqs = Vec::new();
    for h in 10..20u64 {
        reqs.extend(read_req(h, 0, 8 * MIB));
    }
    let w = pattern(4096, 9);
    reqs.extend(wire::encode_request(&wire::Request {
        flags: 0,
        kind: CMD_WRITE,
        handle: 99,
        offset: 32 * MIB,
        len: 4096,
    }));
    reqs.extend_from_slice(&w);
    // Send from another thread: the server stops reading while its budget is held, and our
    // own send would block on a full socket before we read any reply.
    let mut tx = c.s.try_clone().unwrap();
    let sender = std::thread::spawn(move || std::io::Write::write_all(&mut tx, &reqs));
    let mut seen = Vec::new();
    for _ in 0..11 {
        let (e, h) = c.simple();
        assert_eq!(e, 0, "reply {h}");
        if h != 99 {
            assert!(c.recv(8 * MIB as usize) == data, "read {h}");
        }
        seen.push(h);
    }
    sender.join().unwrap().unwrap();
    seen.sort();
    assert_eq!(seen, [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 99]);
    assert_eq!(c.read_simple(100, 32 * MIB, 4096).unwrap(), w);
    c.disc();
    srv.stop();
}

#[test]
fn a_disconnect_answers_every_read_in_flight_first() {
    let rules = Rules {
        slow_below: SIZE,
        slow: Duration::from_millis(100),
        ..quick()
    };
    let (srv, _) = server(rules, Config::default());
    let mut c = srv.raw();
    c.hello();
    c.go("");
    let mut reqs = Vec::new();
    for h in 0..8u64 {
        reqs.extend(read_req(h, h * 4096, 4096));
    }
    reqs.extend(wire::encode_request(&wire::Request {
        flags: 0,
        kind: CMD_DISC,
        handle: 0,
        offset: 0,
        len: 0,
    }));
    c.send(&reqs);
    for _ in 0..8 {
        assert_eq!(c.simple().0, 0);
        c.recv(4096);
    }
    let mut rest = Vec::new();
    c.s.read_to_end(&mut rest).unwrap();
    assert!(
        rest.is_empty(),
        "nothing after the last reply, then the close"
    );
    srv.stop();
}

/// Sends `n` 4 KiB reads at once (handle h reads block h of written data) and checks that
/// read `bad` alone is answered with EIO and every other with its data.
fn one_read_fails(rules: Rules, n: u64, bad: u64) {
    let (srv, _) = server(rules, Config::default());
    let mut c = srv.raw();
    c.hello();
    c.go("");
    let data = pattern(n as usize * 4096, 2);
    assert_eq!(c.write(1, 0, &data), 0);
    let mut reqs = Vec::new();
    for h in 0..n {
        reqs.extend(read_req(h, h * 4096, 4096));
    }
    c.send(&reqs);
    for _ in 0..n {
        let (e, h) = c.simple();
        if h == bad {
            assert_eq!(e, EIO, "read {h}");
        } else {
            assert_eq!(e, 0, "read {h}");
            let o = h as usize * 4096;
            assert_eq!(c.recv(4096), data[o..o + 4096], "read {h}");
        }
    }
    c.disc();
    srv.stop();
}

#[test]
fn a_failed_read_is_answered_with_an_error_and_the_others_with_data() {
    let rules = Rules {
        jitter_ms: 5,
        fail_at: Some(3 * 4096),
        ..quick()
    };
    one_read_fails(rules, 8, 3);
}

/// A queue that hands back the wrong number of bytes gets the read an EIO, not a reply whose
/// framing is off (the data is written from the queue's buffer as it is).
#[test]
fn a_queued_read_of_the_wrong_length_is_an_error_not_a_broken_stream() {
    let rules = Rules {
        short_at: Some(2 * 4096),
        ..quick()
    };
    one_read_fails(rules, 4, 2);
}

#[test]
fn a_wait_that_says_readable_for_nothing_does_not_block_the_connection() {
    // The client sends all its reads and waits for every reply; the queue's wait claims the
    // socket is readable when nothing is there. A blocking read of the socket then would
    // wait for the client, which waits for us.
    let rules = Rules {
        jitter_ms: 15,
        spurious: true,
        ..quick()
    };
    let (srv, _) = server(rules, Config::default());
    let mut c = srv.raw();
    c.hello();
    c.go("");
    let data = pattern(1 << 20, 4);
    assert_eq!(c.write(1, 0, &data), 0);
    for round in 0..4u64 {
        let mut reqs = Vec::new();
        for h in 0..16u64 {
            reqs.extend(read_req(100 * round + h, h * 65536, 4096));
        }
        c.send(&reqs);
        for _ in 0..16 {
            let (e, h) = c.simple();
            assert_eq!(e, 0);
            let o = ((h % 100) * 65536) as usize;
            assert_eq!(c.recv(4096), data[o..o + 4096], "round {round} reply {h}");
        }
    }
    c.disc();
    srv.stop();
}
