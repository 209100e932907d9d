//! The server's doors under abuse: idle and slow clients in handshake, the handshake
//! timeout, eviction of stale handshakes, and the limits on connections in handshake
//! (overall and per peer) and past it. Peers are told apart by loopback address
//! (127.0.0.x) or, on the Unix socket, by user id. The 500-connection flood is in
//! `flood.rs` (its own process, so it can count the server's threads).

mod common;

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::*;
use flashpool_nbd::proto::*;
use flashpool_nbd::Config;

/// A slow client that keeps haggling (an option every 100 ms, never an export) is cut at
/// the handshake timeout; an established connection idle for longer than that is not.
#[test]
fn handshake_timeout_cuts_slow_clients_only() {
    use std::io::{Read, Write};
    let timeout = Duration::from_secs(1);
    let srv = TestServer::start_with(Config {
        handshake_timeout: timeout,
        ..Config::default()
    });
    let mut est = Raw::connect(&srv, false, false);
    let t0 = Instant::now();
    let mut slow = srv.raw();
    slow.hello();
    let mut opt = b"IHAVEOPT".to_vec();
    opt.extend_from_slice(&OPT_STRUCTURED_REPLY.to_be_bytes());
    opt.extend_from_slice(&0u32.to_be_bytes());
    let cut = loop {
        std::thread::sleep(Duration::from_millis(100));
        // The server may close between our option and its reply (an ACK, 20 bytes): either
        // failing ends the loop.
        let mut ack = [0u8; 20];
        if slow.s.write_all(&opt).is_err() || slow.s.read_exact(&mut ack).is_err() {
            break t0.elapsed();
        }
        assert_eq!(flashpool_nbd::wire::be32(&ack[12..16]), REP_ACK);
        assert!(t0.elapsed() < timeout + GUARD, "slow client never cut");
    };
    assert!(
        cut >= timeout,
        "cut after {cut:?}, before the timeout {timeout:?}"
    );
    assert!(slow.closed_by_server());
    // The established connection has been idle past the timeout and still works.
    let d = pattern(4096, 4);
    assert_eq!(est.write(1, 0, &d), 0);
    assert_eq!(est.read_simple(2, 0, 4096).unwrap(), d);
}

/// Handshake slots: per peer and overall; the excess is closed at once, and a slot frees
/// when a handshake ends (in transmission: immediately; by leaving: once its thread ends).
#[test]
fn handshake_limits_per_peer_and_overall() {
    let srv = TestServer::start_with(Config {
        handshake_timeout: Duration::from_secs(600), // nothing expires here
        max_handshakes: 6,
        max_handshakes_per_peer: 3,
        ..Config::default()
    });
    let mut a: Vec<Raw> = (0..3).map(|_| srv.raw_from("127.0.0.1")).collect();
    for c in &mut a {
        assert!(c.greeted());
    }
    assert!(!srv.raw_from("127.0.0.1").greeted(), "4th from one peer");
    let mut b: Vec<Raw> = (0..3).map(|_| srv.raw_from("127.0.0.2")).collect();
    for c in &mut b {
        assert!(c.greeted());
    }
    assert!(!srv.raw_from("127.0.0.3").greeted(), "7th overall");
    // One of b enters transmission: its handshake slot is free before the GO reply.
    handshake_and_io(&mut b[0], 3);
    let mut c = srv.raw_from("127.0.0.3");
    assert!(c.greeted(), "a slot freed by GO");
    assert!(!srv.raw_from("127.0.0.4").greeted(), "full again");
    // One of a leaves: a slot for its peer frees once the server has seen it go.
    drop(a.pop());
    served_within(&srv, "127.0.0.1", GUARD, 5).expect("slot freed by a leaving client");
    // The waiting ones still complete their handshakes.
    handshake_and_io(&mut c, 6);
    handshake_and_io(&mut a[0], 7);
}

/// Under pressure the stalest handshake gives way: once the peer's slots are full, a
/// newcomer is refused while every holder is fresh, and evicts the one longest in handshake
/// once that has been at it for a quarter of the handshake timeout. The others keep going.
#[test]
fn stale_handshakes_give_way_to_newcomers() {
    let timeout = Duration::from_secs(8); // a quarter: 2 s
    let srv = TestServer::start_with(Config {
        handshake_timeout: timeout,
        max_handshakes_per_peer: 3,
        ..Config::default()
    });
    let t0 = Instant::now();
    let mut a: Vec<Raw> = (0..3).map(|_| srv.raw_from("127.0.0.1")).collect();
    for c in &mut a {
        assert!(c.greeted());
    }
    let refused = !srv.raw_from("127.0.0.1").greeted();
    // (Only meaningful while the holders are fresh; a very slow machine may be past that.)
    assert!(
        refused || t0.elapsed() >= timeout / 4,
        "a fresh holder was evicted"
    );
    std::thread::sleep((timeout / 4 + Duration::from_millis(200)).saturating_sub(t0.elapsed()));
    let mut newcomer = srv.raw_from("127.0.0.1");
    assert!(newcomer.greeted(), "a stale holder did not give way");
    handshake_and_io(&mut newcomer, 12);
    assert!(a[0].closed_by_server(), "the stalest holder was evicted");
    handshake_and_io(&mut a[1], 13);
    handshake_and_io(&mut a[2], 14);
}

/// When every transmission slot is taken between accept and GO, the GO gets
/// `NBD_REP_ERR_POLICY` and haggling goes on; new connections are closed at once.
#[test]
fn go_refused_at_the_connection_limit() {
    let srv = TestServer::start_with(Config {
        max_connections: 1,
        ..Config::default()
    });
    let mut waiting = srv.raw();
    waiting.hello();
    let mut first = Raw::connect(&srv, false, false);
    let r = waiting.option_replies(OPT_GO, &go_payload("", &[]));
    assert_eq!(r.last().unwrap().kind, REP_ERR_POLICY);
    // Still haggling: LIST works.
    let r = waiting.option_replies(OPT_LIST, &[]);
    assert_eq!(r.last().unwrap().kind, REP_ACK);
    assert!(!srv.raw().greeted(), "new connection at the limit");
    // EXPORT_NAME cannot carry an error: a disconnect.
    waiting.option(OPT_EXPORT_NAME, b"");
    assert!(waiting.closed_by_server());
    first.disc();
    assert!(first.closed_by_server());
    served_within(&srv, "127.0.0.1", GUARD, 8).expect("served once the slot is free");
}

/// Unix-socket clients are one peer per user id: their flood fills that peer's slots
/// only, and TCP clients are still served.
#[test]
fn unix_socket_peers_are_limited_by_user() {
    let srv = TestServer::start_with(Config {
        max_handshakes_per_peer: 2,
        ..Config::default()
    });
    use std::io::Read;
    let mut idle: Vec<UnixStream> = (0..2)
        .map(|_| UnixStream::connect(&srv.sock).unwrap())
        .collect();
    for s in &mut idle {
        let mut g = [0u8; 18];
        s.read_exact(&mut g).unwrap();
        assert_eq!(&g[..8], b"NBDMAGIC");
    }
    let mut third = UnixStream::connect(&srv.sock).unwrap();
    third.set_read_timeout(Some(GUARD)).unwrap();
    let mut g = [0u8; 18];
    assert_eq!(
        third.read(&mut g).unwrap_or(0),
        0,
        "3rd from one user closed at once"
    );
    served_within(&srv, "127.0.0.1", Duration::ZERO, 9).expect("TCP client refused");
}

/// No handshake deadline (zero) and one too far to represent are both "no timeout": the
/// accept loop must not trip over them.
#[test]
fn handshake_timeout_zero_or_huge_means_none() {
    for t in [Duration::ZERO, Duration::MAX] {
        let srv = TestServer::start_with(Config {
            handshake_timeout: t,
            ..Config::default()
        });
        let mut idle = srv.raw();
        assert!(idle.greeted());
        served_within(&srv, "127.0.0.2", Duration::ZERO, 10).expect("served");
        served_within(&srv, "127.0.0.1", Duration::ZERO, 11).expect("served");
    }
}
