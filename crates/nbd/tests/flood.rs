//! The lock-out, tried as a new user would: 500 connections that never finish (never
//! even read) the handshake. Its own test binary, so the process's threads are the server's
//! and this test's: the flood must not cost a thread per idle connection.

mod common;

use std::time::Duration;

use common::*;
use flashpool_nbd::Config;

/// Threads of this process named like a connection thread (`nbd-conn-N`).
fn connection_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("nbd-conn-"))
        })
        .count()
}

/// 500 connections that never finish (never even read) the handshake: the lock-out
/// (128 of them locked every new client out until they closed) must not happen. Another
/// host is served at once, the flooding host itself within the handshake timeout, a
/// connection established before the flood is untouched, and the idle connections cost at
/// most a thread per handshake slot.
#[test]
fn five_hundred_idle_connections_lock_nobody_out() {
    let timeout = Duration::from_secs(5);
    let srv = TestServer::start_with(Config {
        handshake_timeout: timeout,
        ..Config::default()
    });
    let mut est = Raw::connect(&srv, false, false);
    let idle: Vec<std::net::TcpStream> = (0..500)
        .map(|_| connect_from("127.0.0.1", srv.addr).unwrap())
        .collect();
    // Another peer: served right away, well within the handshake timeout.
    let took = served_within(&srv, "127.0.0.2", Duration::ZERO, 1)
        .expect("a client from another address was refused during the flood");
    assert!(
        took < timeout,
        "a client from another address waited {took:?} (handshake timeout {timeout:?})"
    );
    // The other peer connected after the flood, so every idle connection has been accepted
    // by now (in order): at most one thread per connection in handshake from the flooding
    // peer (64), plus the established one, and a few ending (the other peer's; stale idle ones
    // evicted if the flood took longer than a quarter of the timeout). The rest were closed
    // at once: without the limit this would be one thread per idle connection.
    // Threads already ending (handed over, closed, evicted) leave within moments: counted
    // again for up to a second while above the bound, which does not move.
    let limit = Config::default().max_handshakes_per_peer + 8;
    let t0 = std::time::Instant::now();
    let mut threads = connection_threads();
    while threads > limit && t0.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(20));
        threads = connection_threads();
    }
    assert!(
        threads <= limit,
        "{threads} connection threads for 500 idle connections"
    );
    // The established connection did not notice.
    let d = pattern(4096, 9);
    assert_eq!(est.write(5, 9 << 12, &d), 0);
    assert_eq!(est.read_simple(6, 9 << 12, 4096).unwrap(), d);
    // The flooding host itself: served within the handshake timeout (its stalest idle
    // handshake gives way once it has idled for a quarter of it).
    let took = served_within(&srv, "127.0.0.1", timeout + GUARD, 2)
        .expect("the flooding host was never served");
    assert!(
        took < timeout,
        "the flooding host waited {took:?} (handshake timeout {timeout:?})"
    );
    // Every idle connection was closed by the server: the excess at once, the rest at the
    // timeout (a read sees the greeting, if any, then EOF).
    for (i, s) in idle.into_iter().enumerate() {
        s.set_read_timeout(Some(GUARD)).unwrap();
        let mut r = Raw { s };
        assert!(r.closed_by_server(), "idle connection {i} still open");
    }
    assert_eq!(
        est.write(7, 0, &d),
        0,
        "established connection after the flood"
    );
    est.disc();
    assert!(est.closed_by_server());
}
