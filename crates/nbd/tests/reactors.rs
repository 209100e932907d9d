//! Reactors (`Config::reactors`, issue 16): a fixed set of threads serves every connection
//! past its handshake. The tests here always run on reactors (the rest of this crate's
//! tests run on them too when `FLASHPOOL_NBD_REACTORS` is set, as CI does): many
//! connections take no thread each, a request that blocks (a FLUSH held at a gate) holds
//! up neither the requests behind it on its connection nor other connections on the same
//! reactor, a client that stops reading its replies stalls only itself, and a shutdown
//! answers what the workers still hold before it returns.

mod common;

use common::*;
use flashpool_nbd::proto::*;
use flashpool_nbd::{Config, Export, ExportError, Extent, MemExport, StaticExports};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

fn reactors(n: usize) -> Config {
    Config {
        reactors: n,
        ..Config::default()
    }
}

/// Threads of this process now.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn many_connections_take_no_thread_each() {
    let srv = TestServer::start_with(reactors(2));
    let before = threads();
    let mut conns: Vec<Raw> = (0..24u64)
        .map(|i| {
            let mut c = Raw::connect(&srv, i % 2 == 0, false);
            let d = pattern(4096, i as u8);
            assert_eq!(c.write(1, i << 16, &d), 0);
            c
        })
        .collect();
    // The handshake threads end once they hand their connection over.
    let t0 = Instant::now();
    while threads() > before + 2 && t0.elapsed() < GUARD {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        threads() <= before + 2,
        "{} threads for 24 connections on 2 reactors (had {before})",
        threads()
    );
    // Every connection is still served, and reads its own data back.
    for (i, c) in conns.iter_mut().enumerate() {
        let d = pattern(4096, i as u8);
        if i % 2 == 0 {
            c.request(0, CMD_READ, 2, (i as u64) << 16, 4096, &[]);
            let ch = c.chunk();
            assert_eq!((ch.kind, ch.handle), (REPLY_TYPE_OFFSET_DATA, 2));
            assert_eq!(ch.data[8..], d[..]);
        } else {
            assert_eq!(c.read_simple(2, (i as u64) << 16, 4096).unwrap(), d);
        }
        c.disc();
    }
    srv.stop();
}

/// A memory export whose FLUSH waits until the test opens the gate; with `writes_wait`, its
/// writes too, and it says so (`write_would_block_now`, as a pool whose stripe buffers are
/// all taken does).
struct GatedFlush {
    disk: MemExport,
    writes_wait: bool,
    open: Mutex<bool>,
    opened: Condvar,
    /// FLUSHes that have started waiting.
    waiting: Mutex<usize>,
}

impl GatedFlush {
    /// Waits until a FLUSH (or a write, with `writes_wait`) is at the gate.
    fn wait_for_a_flush(&self) {
        let t0 = Instant::now();
        while *self.waiting.lock().unwrap() == 0 && t0.elapsed() < GUARD {
            std::thread::yield_now();
        }
        assert_eq!(*self.waiting.lock().unwrap(), 1, "the flush is at the gate");
    }

    /// Waits at the gate until it is open.
    fn gate(&self) {
        *self.waiting.lock().unwrap() += 1;
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
    }

    fn release(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

impl Export for GatedFlush {
    fn size(&self) -> u64 {
        self.disk.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.disk.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        if self.writes_wait {
            self.gate();
        }
        self.disk.write(offset, data, fua)
    }
    fn write_would_block_now(&self) -> bool {
        self.writes_wait
    }
    fn flush(&self) -> Result<(), ExportError> {
        self.gate();
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.disk.trim(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.disk.write_zeroes(offset, len)
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, ExportError> {
        self.disk.block_status(offset, len)
    }
}

/// A server of one reactor over a gated export (its default).
fn gated_server(writes_wait: bool) -> (Arc<GatedFlush>, TestServer) {
    let gated = Arc::new(GatedFlush {
        disk: MemExport::new(SIZE),
        writes_wait,
        open: Mutex::new(false),
        opened: Condvar::new(),
        waiting: Mutex::new(0),
    });
    let mut set = StaticExports::new();
    set.add("gated", "", gated.clone());
    let srv = TestServer::start_exports(set, Arc::new(MemExport::new(4096)), reactors(1));
    (gated, srv)
}

#[test]
fn a_blocked_flush_holds_up_nothing_else_on_its_reactor() {
    // One reactor: every connection shares it.
    let (gated, srv) = gated_server(false);
    let mut a = Raw::connect(&srv, false, false);
    let d = pattern(8192, 7);
    assert_eq!(a.write(1, 0, &d), 0);
    a.request(0, CMD_FLUSH, 2, 0, 0, &[]);
    gated.wait_for_a_flush();
    // The same connection goes on past its flush, and so does another one.
    assert_eq!(a.read_simple(3, 0, 8192).unwrap(), d);
    let mut b = Raw::connect(&srv, true, false);
    assert_eq!(b.write(1, 1 << 20, &d), 0);
    b.request(0, CMD_READ, 2, 1 << 20, 8192, &[]);
    let ch = b.chunk();
    assert_eq!(ch.data[8..], d[..]);
    // Open the gate: the flush is answered, after everything sent behind it.
    gated.release();
    assert_eq!(a.simple(), (0, 2));
    a.disc();
    b.disc();
    srv.stop();
}

/// While the export says a write would wait (its write buffers all taken), writes run on the
/// reactor's workers: one stuck there holds up no read, on its connection or another.
#[test]
fn writes_that_would_wait_leave_the_reactor_free() {
    let (gated, srv) = gated_server(true);
    let d = pattern(4096, 5);
    gated.disk.write(1 << 20, &d, false).unwrap();
    let mut a = Raw::connect(&srv, false, false);
    a.request(0, CMD_WRITE, 1, 0, 4096, &d);
    gated.wait_for_a_flush();
    assert_eq!(a.read_simple(2, 1 << 20, 4096).unwrap(), d);
    let mut b = Raw::connect(&srv, false, false);
    assert_eq!(b.read_simple(1, 1 << 20, 4096).unwrap(), d);
    gated.release();
    assert_eq!(
        a.simple(),
        (0, 1),
        "the write is answered once its gate opens"
    );
    assert_eq!(a.read_simple(3, 0, 4096).unwrap(), d);
    a.disc();
    b.disc();
    srv.stop();
}

/// A shutdown waits for a request a worker is still running (within the drain timeout),
/// answers it, and only then closes the connection and returns.
#[test]
fn shutdown_answers_a_flush_still_at_its_worker_first() {
    let (gated, srv) = gated_server(false);
    let mut c = Raw::connect(&srv, false, false);
    c.request(0, CMD_FLUSH, 7, 0, 0, &[]);
    gated.wait_for_a_flush();
    let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopper = {
        let stopped = stopped.clone();
        std::thread::spawn(move || {
            srv.stop();
            stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        !stopped.load(std::sync::atomic::Ordering::SeqCst),
        "the server returned with a flush unanswered"
    );
    gated.release();
    assert_eq!(c.simple(), (0, 7), "the flush is answered during the drain");
    assert!(c.closed_by_server());
    stopper.join().unwrap();
    assert!(stopped.load(std::sync::atomic::Ordering::SeqCst));
}

#[test]
fn a_client_that_stops_reading_stalls_only_itself() {
    let srv = TestServer::start_with(Config {
        max_buffer_bytes_per_connection: 1 << 20,
        ..reactors(1)
    });
    let d = pattern(1 << 20, 3);
    let mut w = Raw::connect(&srv, false, false);
    assert_eq!(w.write(1, 0, &d), 0);
    // 256 MiB of reads whose replies nobody reads: far more than the socket buffers and the
    // connection's budget hold.
    let mut deaf = Raw::connect(&srv, false, false);
    for i in 0..256 {
        deaf.request(0, CMD_READ, i, 0, 1 << 20, &[]);
    }
    // Connections on the same (only) reactor are still served.
    for i in 0..20u64 {
        assert_eq!(
            w.read_simple(10 + i, i << 14, 4096).unwrap(),
            d[(i << 14) as usize..(i << 14) as usize + 4096]
        );
    }
    let mut other = Raw::connect(&srv, true, false);
    assert_eq!(other.write(1, 2 << 20, &d[..4096]), 0);
    // The deaf client, reading at last, gets every reply in full.
    for _ in 0..256 {
        let (e, _) = deaf.simple();
        assert_eq!(e, 0);
        assert_eq!(deaf.recv(1 << 20), d);
    }
    w.disc();
    other.disc();
    deaf.disc();
    srv.stop();
}

/// A test read queue over a memory disk. Inline (`rng` None): every read completes inside
/// `start` (as the engine's does for blocks that need no device read: unmapped, still in a
/// stripe buffer), with a descriptor to wait on that never becomes readable for them.
/// Shuffled (`rng` Some): no descriptor, and one read finishes per poll, drawn at random
/// from those started (seeded), so reads of several connections complete interleaved and
/// late.
struct TestQueue {
    disk: Arc<MemExport>,
    started: Vec<(u64, Vec<u8>)>,
    done: std::collections::VecDeque<(u64, Vec<u8>)>,
    rng: Option<u64>,
    never: Option<std::os::fd::OwnedFd>,
}

impl TestQueue {
    fn inline(disk: &Arc<MemExport>) -> Box<TestQueue> {
        use std::os::fd::FromRawFd;
        // SAFETY: eventfd takes no pointers; it returns a new descriptor or -1 (checked).
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: `fd` is the fresh descriptor above, owned by nobody else.
        let never = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        Box::new(TestQueue {
            disk: disk.clone(),
            started: Vec::new(),
            done: Default::default(),
            rng: None,
            never: Some(never),
        })
    }

    fn shuffled(disk: &Arc<MemExport>, seed: u64) -> Box<TestQueue> {
        Box::new(TestQueue {
            disk: disk.clone(),
            started: Vec::new(),
            done: Default::default(),
            rng: Some(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1),
            never: None,
        })
    }
}

impl flashpool_nbd::ReadQueue for TestQueue {
    fn start(&mut self, token: u64, offset: u64, len: usize) {
        let mut b = vec![0u8; len];
        self.disk.read(offset, &mut b).unwrap();
        if self.rng.is_some() {
            self.started.push((token, b));
        } else {
            self.done.push_back((token, b));
        }
    }
    fn submit(&mut self) {}
    fn poll(&mut self) {
        let Some(rng) = self.rng.as_mut().filter(|_| !self.started.is_empty()) else {
            return;
        };
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        let i = (*rng % self.started.len() as u64) as usize;
        self.done.push_back(self.started.swap_remove(i));
    }
    fn wait(&mut self, _fd: Option<std::os::fd::RawFd>) -> std::io::Result<bool> {
        self.poll();
        Ok(false)
    }
    fn take(&mut self, f: &mut flashpool_nbd::ReadDone<'_>) -> bool {
        let Some((t, b)) = self.done.pop_front() else {
            return false;
        };
        f(t, Ok(Box::new(b)));
        true
    }
    fn outstanding(&self) -> usize {
        self.started.len() + self.done.len()
    }
    fn ready_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.never.as_ref().map(|f| f.as_raw_fd())
    }
}

/// Reads that finish inside `start` are announced by no descriptor: the reactor still
/// answers them (it once waited for an event that never came).
#[test]
fn reads_finished_inside_start_are_answered_without_an_event() {
    let disk = Arc::new(MemExport::new(SIZE));
    let d = pattern(64 << 10, 9);
    disk.write(0, &d, false).unwrap();
    let mut set = StaticExports::new();
    set.add(
        "inline",
        "",
        QueuedExport::new(disk.clone(), |disk| TestQueue::inline(disk)),
    );
    let srv = TestServer::start_exports(set, disk, reactors(1));
    let mut c = Raw::connect(&srv, false, false);
    for round in 0..4u64 {
        c.send(
            &(0..16u64)
                .flat_map(|i| read_req(round * 100 + i, i * 4096, 4096))
                .collect::<Vec<_>>(),
        );
        for _ in 0..16 {
            let (e, h) = c.simple();
            assert_eq!(e, 0);
            let i = (h - round * 100) as usize;
            assert_eq!(c.recv(4096), d[i * 4096..(i + 1) * 4096]);
        }
    }
    c.disc();
    srv.stop();
}

/// An export whose read queues are shuffled `TestQueue`s, counting the queues made in `made`.
fn counted_queues(
    disk: Arc<MemExport>,
    made: Arc<std::sync::atomic::AtomicUsize>,
    seed: u64,
) -> Arc<QueuedExport> {
    QueuedExport::new(disk, move |disk| {
        let n = made.fetch_add(1, std::sync::atomic::Ordering::SeqCst) as u64;
        TestQueue::shuffled(disk, seed + n)
    })
}

/// A reactor makes one read queue per export and shares it among its connections to that
/// export (not one per connection); each connection gets exactly its own reads back though
/// they finish interleaved with the others', and the queue goes with the last connection.
#[test]
fn connections_on_a_reactor_share_one_read_queue_per_export() {
    let seed = std::env::var("SHARED_READS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed);
    eprintln!("seed {seed} (SHARED_READS_SEED to rerun)");
    let (a_disk, b_disk) = (
        Arc::new(MemExport::new(SIZE)),
        Arc::new(MemExport::new(SIZE)),
    );
    a_disk.write(0, &pattern(1 << 20, 1), false).unwrap();
    b_disk.write(0, &pattern(1 << 20, 2), false).unwrap();
    let (a_made, b_made) = (Arc::default(), Arc::default());
    let mut set = StaticExports::new();
    set.add(
        "a",
        "",
        counted_queues(a_disk.clone(), Arc::clone(&a_made), seed),
    );
    set.add(
        "b",
        "",
        counted_queues(b_disk.clone(), Arc::clone(&b_made), seed ^ 0xff),
    );
    let srv = TestServer::start_exports(set, a_disk.clone(), reactors(1));
    let made =
        |m: &Arc<std::sync::atomic::AtomicUsize>| m.load(std::sync::atomic::Ordering::SeqCst);
    for round in 0..2 {
        // Six connections to each export on the one reactor, each with 16 reads in flight.
        let mut conns: Vec<(Raw, Arc<MemExport>)> = (0..12)
            .map(|i| {
                let mut c = srv.raw();
                c.hello();
                c.go(if i % 2 == 0 { "a" } else { "b" });
                (
                    c,
                    if i % 2 == 0 {
                        a_disk.clone()
                    } else {
                        b_disk.clone()
                    },
                )
            })
            .collect();
        for (k, (c, _)) in conns.iter_mut().enumerate() {
            let k = k as u64;
            c.send(
                &(0..16u64)
                    .flat_map(|i| read_req(k << 8 | i, ((k * 16 + i) % 256) * 4096, 4096))
                    .collect::<Vec<_>>(),
            );
        }
        for (k, (c, disk)) in conns.iter_mut().enumerate() {
            let mut seen = [false; 16];
            for _ in 0..16 {
                let (e, h) = c.simple();
                assert_eq!(e, 0, "round {round} connection {k}");
                assert_eq!(h >> 8, k as u64, "connection {k} got another's reply");
                let i = (h & 0xff) as usize;
                assert!(!std::mem::replace(&mut seen[i], true), "handle {h} twice");
                let off = ((k * 16 + i) % 256) * 4096;
                let mut want = vec![0u8; 4096];
                disk.read(off as u64, &mut want).unwrap();
                assert_eq!(c.recv(4096), want, "connection {k} read {i}");
            }
        }
        assert_eq!(
            (made(&a_made), made(&b_made)),
            (round + 1, round + 1),
            "read queues made by round {round}"
        );
        // The queues go with their last connections (closed before the client sees the
        // end): the next round makes new ones.
        for (c, _) in &mut conns {
            c.disc();
            assert!(c.closed_by_server());
        }
    }
    srv.stop();
}
