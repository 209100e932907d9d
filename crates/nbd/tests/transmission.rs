//! Socket-level transmission tests: real sockets, hand-made requests.
//! Covers pipelining with out-of-order replies, structured reads with holes,
//! every refused request (unknown command, past the end, oversized, misused
//! flags), clients vanishing mid-request, no cross-connection stalls, and a
//! clean server shutdown that answers in-flight requests.

mod common;

use common::*;
use flashpool_nbd::proto::*;
use flashpool_nbd::wire;
use flashpool_nbd::{Config, Export};

#[test]
fn pipelined_requests_all_answered() {
    let srv = TestServer::start();
    let mut c = Raw::connect(&srv, false, false);
    // 64 writes sent back to back, then the replies in any order.
    let mut batch = Vec::new();
    for i in 0..64u64 {
        let data = pattern(4096 + i as usize * 512, i as u8);
        batch.extend_from_slice(&wire::encode_request(&wire::Request {
            flags: if i % 8 == 0 { CMD_FLAG_FUA } else { 0 },
            kind: CMD_WRITE,
            handle: 1000 + i,
            offset: i << 17,
            len: data.len() as u64,
        }));
        batch.extend_from_slice(&data);
    }
    c.send(&batch);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..64 {
        let (e, h) = c.simple();
        assert_eq!(e, 0);
        assert!(seen.insert(h), "duplicate reply {h}");
    }
    // 64 reads in flight; match payloads by handle.
    for i in 0..64u64 {
        c.request(0, CMD_READ, 5000 + i, i << 17, 4096 + i as u32 * 512, &[]);
    }
    for _ in 0..64 {
        let (e, h) = c.simple();
        assert_eq!(e, 0);
        let i = h - 5000;
        let got = c.recv(4096 + i as usize * 512);
        assert_eq!(got, pattern(4096 + i as usize * 512, i as u8), "handle {h}");
    }
    c.request(0, CMD_FLUSH, 1, 0, 0, &[]);
    assert_eq!(c.simple(), (0, 1));
}

#[test]
fn structured_reads_use_holes() {
    let srv = TestServer::start();
    let mut c = Raw::connect(&srv, true, true);
    // Hole only: one OFFSET_HOLE chunk, final.
    c.request(0, CMD_READ, 1, 0, 65536, &[]);
    let ch = c.chunk();
    assert_eq!(
        (ch.kind, ch.flags, ch.handle),
        (REPLY_TYPE_OFFSET_HOLE, REPLY_FLAG_DONE, 1)
    );
    assert_eq!(
        (wire::be64(&ch.data), wire::be32(&ch.data[8..])),
        (0, 65536)
    );
    // Data in the middle of a hole: hole, data, hole, NONE.
    let data = pattern(4096, 3);
    assert_eq!(c.write(2, 8192, &data), 0);
    c.request(0, CMD_READ, 3, 0, 16384, &[]);
    let mut image = vec![0xAAu8; 16384];
    loop {
        let ch = c.chunk();
        assert_eq!(ch.handle, 3);
        match ch.kind {
            REPLY_TYPE_OFFSET_HOLE => {
                let (o, l) = (
                    wire::be64(&ch.data) as usize,
                    wire::be32(&ch.data[8..]) as usize,
                );
                image[o..o + l].fill(0);
            }
            REPLY_TYPE_OFFSET_DATA => {
                let o = wire::be64(&ch.data) as usize;
                image[o..o + ch.data.len() - 8].copy_from_slice(&ch.data[8..]);
            }
            REPLY_TYPE_NONE => {}
            k => panic!("unexpected chunk {k}"),
        }
        if ch.flags & REPLY_FLAG_DONE != 0 {
            break;
        }
    }
    let mut want = vec![0u8; 16384];
    want[8192..12288].copy_from_slice(&data);
    assert_eq!(image, want);
    // With DF: exactly one content chunk covering everything.
    c.request(CMD_FLAG_DF, CMD_READ, 4, 0, 16384, &[]);
    let ch = c.chunk();
    assert_eq!(
        (ch.kind, ch.flags),
        (REPLY_TYPE_OFFSET_DATA, REPLY_FLAG_DONE)
    );
    assert_eq!(&ch.data[8..], &want[..]);
    // Block status sees the same layout; REQ_ONE gives one descriptor.
    c.request(0, CMD_BLOCK_STATUS, 5, 0, 16384, &[]);
    let ch = c.chunk();
    let d: Vec<(u32, u32)> = ch.data[4..]
        .chunks(8)
        .map(|x| (wire::be32(x), wire::be32(&x[4..])))
        .collect();
    assert_eq!(d, vec![(8192, 3), (4096, 0), (4096, 3)]);
    c.request(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 6, 8192, 8192, &[]);
    let ch = c.chunk();
    assert_eq!(ch.data.len(), 4 + 8);
    assert_eq!(wire::be32(&ch.data[4..]), 4096);
}

#[test]
fn zero_trim_cache_and_fast_zero() {
    let srv = TestServer::start();
    let mut c = Raw::connect(&srv, true, true);
    let data = pattern(65536, 9);
    assert_eq!(c.write(1, 0, &data), 0);
    c.request(CMD_FLAG_FAST_ZERO, CMD_WRITE_ZEROES, 2, 0, 4096, &[]);
    assert_eq!(c.status(), (0, 2));
    c.request(
        CMD_FLAG_NO_HOLE | CMD_FLAG_FUA,
        CMD_WRITE_ZEROES,
        3,
        4096,
        4096,
        &[],
    );
    assert_eq!(c.status(), (0, 3));
    c.request(CMD_FLAG_FUA, CMD_TRIM, 4, 8192, 8192, &[]);
    assert_eq!(c.status(), (0, 4));
    c.request(0, CMD_CACHE, 5, 0, 65536, &[]);
    assert_eq!(c.status(), (0, 5));
    let mut buf = vec![0u8; 65536];
    srv.disk.read(0, &mut buf).unwrap();
    assert!(buf[..16384].iter().all(|&b| b == 0));
    assert_eq!(&buf[16384..], &data[16384..]);
    let st = srv.disk.block_status(0, 16384).unwrap();
    assert!(
        st[0].hole && st[0].len == 4096,
        "zeroed page is a hole: {st:?}"
    );
    assert!(!st[1].hole, "NO_HOLE kept the page allocated: {st:?}");
}

#[test]
fn refused_requests_get_spec_errors() {
    let srv = TestServer::start();
    for structured in [false, true] {
        let mut c = Raw::connect(&srv, structured, false);
        let cases: Vec<(u16, u16, u64, u32, u32)> = vec![
            // (flags, command, offset, length, expected error)
            (0, 42, 0, 512, EINVAL),                        // unknown command
            (0, CMD_READ, SIZE - 512, 1024, EINVAL),        // read past the end
            (0, CMD_READ, u64::MAX - 10, 512, EINVAL),      // offset overflow
            (0, CMD_READ, 0, 0, EINVAL),                    // zero length
            (0, CMD_READ, 0, (64 << 20) + 1, EOVERFLOW),    // oversized read
            (CMD_FLAG_REQ_ONE, CMD_READ, 0, 512, EINVAL),   // flag of another command
            (1 << 12, CMD_READ, 0, 512, EINVAL),            // unknown flag bit
            (0, CMD_TRIM, SIZE, 512, EINVAL),               // trim past the end
            (CMD_FLAG_FAST_ZERO, CMD_TRIM, 0, 512, EINVAL), // FAST_ZERO on trim
            (0, CMD_WRITE_ZEROES, SIZE - 1, 2, ENOSPC),     // zero past the end
            (CMD_FLAG_DF, CMD_WRITE_ZEROES, 0, 512, EINVAL), // DF on zero
            (0, CMD_FLUSH, 0, 512, EINVAL),                 // flush with a length
            (0, CMD_CACHE, SIZE, 1, EINVAL),                // cache past the end
            (0, CMD_BLOCK_STATUS, 0, 512, EINVAL),          // no meta context
        ];
        for (i, &(flags, cmd, off, len, want)) in cases.iter().enumerate() {
            c.request(flags, cmd, 100 + i as u64, off, len, &[]);
            let (e, h) = c.status();
            assert_eq!(
                (e, h),
                (want, 100 + i as u64),
                "case {i} structured={structured}"
            );
        }
        // DF without structured replies is a misused flag too.
        if !structured {
            c.request(CMD_FLAG_DF, CMD_READ, 7, 0, 512, &[]);
            assert_eq!(c.status(), (EINVAL, 7));
        }
        // Writes past the end and with bad flags: the payload is consumed,
        // the connection stays in sync.
        c.request(0, CMD_WRITE, 8, SIZE - 2, 4, &[1, 2, 3, 4]);
        assert_eq!(c.status(), (ENOSPC, 8));
        c.request(CMD_FLAG_NO_HOLE, CMD_WRITE, 9, 0, 4, &[1, 2, 3, 4]);
        assert_eq!(c.status(), (EINVAL, 9));
        // Oversized write: the 65 MiB payload is skipped, then refused.
        let big = vec![0x5Au8; (65 << 20) as usize];
        c.request(0, CMD_WRITE, 10, 0, big.len() as u32, &big);
        assert_eq!(c.status(), (EOVERFLOW, 10));
        assert_eq!(c.write(11, 0, b"still in sync"), 0);
        c.disc();
        assert!(c.closed_by_server());
    }
}

#[test]
fn read_only_export_refuses_writes() {
    let srv = TestServer::start();
    let mut c = srv.raw();
    c.hello();
    c.go("ro");
    c.request(0, CMD_WRITE, 1, 0, 4, b"abcd");
    assert_eq!(c.status(), (EPERM, 1));
    c.request(0, CMD_TRIM, 2, 0, 4096, &[]);
    assert_eq!(c.status(), (EPERM, 2));
    c.request(0, CMD_WRITE_ZEROES, 3, 0, 4096, &[]);
    assert_eq!(c.status(), (EPERM, 3));
    assert_eq!(c.read_simple(4, 0, 16).unwrap(), vec![0u8; 16]);
}

#[test]
fn bad_request_magic_disconnects() {
    let srv = TestServer::start();
    let mut c = Raw::connect(&srv, false, false);
    c.send(&[0xde; 28]);
    assert!(c.closed_by_server());
    let mut c = Raw::connect(&srv, false, false);
    assert_eq!(c.write(1, 0, b"ok"), 0);
}

#[test]
fn vanished_clients_lose_nothing_acknowledged() {
    let srv = TestServer::start();
    // Acknowledged write, then the client disappears without DISC.
    let data = pattern(8192, 11);
    {
        let mut c = Raw::connect(&srv, false, false);
        assert_eq!(c.write(1, 1 << 20, &data), 0);
    }
    // A client that dies halfway through a write payload.
    {
        let mut c = Raw::connect(&srv, false, false);
        c.request(0, CMD_WRITE, 2, 2 << 20, 65536, &[7u8; 1000]);
    }
    // A client that dies halfway through a request header.
    {
        let mut c = Raw::connect(&srv, false, false);
        c.send(
            &wire::encode_request(&wire::Request {
                flags: 0,
                kind: CMD_READ,
                handle: 3,
                offset: 0,
                len: 4096,
            })[..13],
        );
    }
    // A client that sends reads and leaves without reading the replies.
    {
        let mut c = Raw::connect(&srv, false, false);
        for i in 0..32 {
            c.request(0, CMD_READ, i, 0, 1 << 20, &[]);
        }
    }
    let mut c = Raw::connect(&srv, false, false);
    assert_eq!(c.read_simple(9, 1 << 20, 8192).unwrap(), data);
}

#[test]
fn stalled_client_does_not_stall_others() {
    let srv = TestServer::start();
    // One client stops mid-payload and stays connected; another stops
    // reading its replies.
    let mut stuck = Raw::connect(&srv, false, false);
    stuck.request(0, CMD_WRITE, 1, 0, 1 << 20, &[1u8; 4096]);
    let mut deaf = Raw::connect(&srv, false, false);
    for i in 0..64 {
        deaf.request(0, CMD_READ, i, 0, 1 << 20, &[]);
    }
    // Others keep working, over TCP and many connections at once.
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let mut c = Raw::connect(&srv, t % 2 == 0, false);
            std::thread::spawn(move || {
                for i in 0..50u64 {
                    let off = (t << 22) + (i << 12);
                    let d = pattern(4096, (t * 50 + i) as u8);
                    assert_eq!(c.write(i, off, &d), 0);
                    if t % 2 == 1 {
                        assert_eq!(c.read_simple(i, off, 4096).unwrap(), d);
                    }
                }
                c.disc();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    drop(stuck);
    drop(deaf);
}

#[test]
fn shutdown_drains_and_returns() {
    let srv = TestServer::start();
    let mut idle = Raw::connect(&srv, false, false);
    let mut handshaking = srv.raw();
    handshaking.greeting();
    let mut busy = Raw::connect(&srv, false, false);
    // Requests already sent before shutdown get their replies.
    for i in 0..16u64 {
        busy.request(0, CMD_WRITE, i, i << 16, 4096, &pattern(4096, i as u8));
    }
    for _ in 0..16 {
        assert_eq!(busy.simple().0, 0);
    }
    let disk = srv.disk.clone();
    srv.stop(); // returns only after every connection is closed
    assert!(idle.closed_by_server());
    assert!(handshaking.closed_by_server());
    assert!(busy.closed_by_server());
    let mut b = vec![0u8; 4096];
    disk.read(15 << 16, &mut b).unwrap();
    assert_eq!(b, pattern(4096, 15));
}

#[test]
fn connection_limit_is_enforced() {
    let srv = TestServer::start_with(Config {
        max_connections: 2,
        ..Config::default()
    });
    let _a = Raw::connect(&srv, false, false);
    let _b = Raw::connect(&srv, false, false);
    let mut c = srv.raw();
    assert!(c.closed_by_server());
    drop(_a);
    // Once a slot frees up, connections are served again.
    let mut ok = false;
    for _ in 0..200 {
        let mut c = srv.raw();
        let mut g = [0u8; 8];
        if std::io::Read::read_exact(&mut c.s, &mut g).is_ok() {
            ok = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(ok);
}

#[test]
fn multi_conn_flush_covers_other_connections() {
    let srv = TestServer::start();
    let mut a = Raw::connect(&srv, false, false);
    let mut b = Raw::connect(&srv, true, false);
    let d = pattern(4096, 99);
    assert_eq!(a.write(1, 12288, &d), 0);
    b.request(0, CMD_FLUSH, 2, 0, 0, &[]);
    assert_eq!(b.status(), (0, 2));
    assert_eq!(a.read_simple(3, 12288, 4096).unwrap(), d);
    // A write acknowledged on `a` is visible to a read on `b`.
    b.request(0, CMD_READ, 4, 12288, 4096, &[]);
    let ch = b.chunk();
    assert_eq!(ch.kind, REPLY_TYPE_OFFSET_DATA);
    assert_eq!(&ch.data[8..], &d[..]);
}

/// Busy polling changes only how the connection thread waits: requests split across sends,
/// gaps shorter and longer than the poll window (so the adaptive window shrinks, grows and
/// backs off), two connections taking turns at the one poller slot, a client that leaves
/// while the server polls, and a shutdown while it polls all behave as without it; and as
/// with polling off.
#[test]
fn busy_polling_serves_like_blocking_reads() {
    use std::time::Duration;
    for (busy_poll, max_pollers) in [
        (Duration::from_millis(3), 1),
        (Duration::from_millis(3), 4),
        (Duration::ZERO, 1),
    ] {
        polling_case(Config {
            busy_poll,
            max_pollers,
            ..Config::default()
        });
    }
}

fn polling_case(config: Config) {
    use std::time::Duration;
    let srv = TestServer::start_with(config);
    let mut a = Raw::connect(&srv, false, false);
    let mut b = Raw::connect(&srv, false, false);
    for i in 0..40u64 {
        // Another connection busy at the same time: it polls when `a` does not hold the slot.
        let other = pattern(4096, 200 + i as u8);
        assert_eq!(b.write(5000 + i, (100 + i) * 4096, &other), 0);
        let d = pattern(4096, i as u8);
        if i % 4 == 1 {
            // Header now, payload after a pause inside (or past) the poll window.
            a.request(0, CMD_WRITE, i, i * 4096, 4096, &[]);
            std::thread::sleep(Duration::from_millis(if i % 8 == 1 { 1 } else { 6 }));
            a.send(&d);
            assert_eq!(a.simple(), (0, i));
        } else {
            assert_eq!(a.write(i, i * 4096, &d), 0);
        }
        if i % 10 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(a.read_simple(1000 + i, i * 4096, 4096).unwrap(), d);
        assert_eq!(
            b.read_simple(6000 + i, (100 + i) * 4096, 4096).unwrap(),
            other
        );
    }
    drop(b);
    // A client that leaves while its server polls: the connection ends cleanly.
    let mut gone = Raw::connect(&srv, false, false);
    assert_eq!(gone.write(1, 0, &pattern(4096, 7)), 0);
    drop(gone);
    // Shutdown while `a` polls or sleeps returns and closes it.
    srv.stop();
    assert!(a.closed_by_server());
}

/// Clients that enter with `NBD_OPT_EXPORT_NAME` never see the advertised 32 MiB maximum;
/// like the reference server and nbdkit we take READ and WRITE up to 64 MiB, with simple and
/// structured replies, within the default per-connection buffer budget.
#[test]
fn requests_up_to_64_mib_are_served() {
    let srv = TestServer::start();
    let big: Vec<u8> = pattern(1 << 20, 3).repeat(64);
    assert_eq!(big.len() as u64, SIZE);
    // EXPORT_NAME client (simple replies).
    let mut c = srv.raw();
    c.hello();
    c.option(OPT_EXPORT_NAME, b"default");
    assert_eq!(wire::be64(&c.recv(10)), SIZE);
    c.request(0, CMD_WRITE, 1, 0, big.len() as u32, &big);
    assert_eq!(c.simple(), (0, 1));
    assert_eq!(c.read_simple(2, 0, big.len() as u32).unwrap(), big);
    c.disc();
    // Structured replies: one data chunk carries the whole 64 MiB.
    let mut c = Raw::connect(&srv, true, false);
    c.request(0, CMD_READ, 3, 0, big.len() as u32, &[]);
    let ch = c.chunk();
    assert_eq!(
        (ch.kind, ch.flags, ch.handle),
        (REPLY_TYPE_OFFSET_DATA, REPLY_FLAG_DONE, 3)
    );
    assert_eq!(wire::be64(&ch.data[..8]), 0);
    assert!(ch.data[8..] == big[..], "64 MiB structured read differs");
    c.disc();
}
