//! A queue's life ends when it should, whatever the host does: a host that stops reading its
//! responses cannot wedge its connection's thread or the server's shutdown (the socket write
//! times out after the send timeout, and shutdown shuts the sockets of connections that do not
//! stop by themselves after the shutdown grace); a host that keeps sending commands does not
//! outlive shutdown or its controller (liveness is checked before every PDU, not only when the
//! host is silent); and a connection that never completes its Connect is closed after the
//! connect deadline.
//!
//! The target's deadlines are set short here (`Deadlines` in its config; the defaults are
//! checked by a unit test, not waited out), so each test takes a few seconds; each test's own limits
//! (`SLACK`) are generous: they only catch a connection that never ends.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use flashpool_nvmet::connection::{self, End};
use flashpool_nvmet::pdu;
use flashpool_nvmet::status::Status;
use flashpool_nvmet::{Deadlines, Server, Target, TargetConfig};

/// Slack on top of the target's own timeouts before a test gives up.
const SLACK: Duration = Duration::from_secs(10);

/// How long the host's writes must make no progress before it takes it that the target has
/// stopped reading (well below the short send timeout below, which would drop it first).
const STALL: Duration = Duration::from_millis(500);

/// The test config with deadlines `d`.
fn config_with(d: Deadlines) -> TargetConfig {
    TargetConfig {
        deadlines: d,
        ..config()
    }
}

#[test]
fn a_host_that_stops_reading_does_not_block_shutdown() {
    // A send timeout no test waits for: only shutdown's shutting the sockets after its grace
    // can end the connection blocked writing.
    let d = Deadlines {
        send_timeout: Duration::from_secs(3600),
        shutdown_grace: Duration::from_millis(500),
        ..Deadlines::default()
    };
    let running = Server::bind("127.0.0.1:0", config_with(d))
        .unwrap()
        .spawn()
        .unwrap();
    // The review's trigger: ICReq, then commands (error responses: no Connect) never read.
    let mut h = Host::new(running.local_addr, false, false);
    let n = flood_until_the_target_stops_reading(&mut h.stream, STALL);
    println!("target stopped reading after about {n} commands");
    // And a well-behaved connection beside it.
    let (mut a, _) = Host::admin(running.local_addr, NQN, false, false);
    assert_eq!(a.identify(1, 0).0, Status::SUCCESS);
    within(d.shutdown_grace + SLACK, "shutdown_and_join", move || {
        running.shutdown_and_join().unwrap()
    });
    let mut b = [0u8; 1];
    assert_eq!(
        a.stream.read(&mut b).unwrap_or(0),
        0,
        "the other one closed"
    );
}

#[test]
fn a_host_that_stops_reading_is_dropped_after_the_send_timeout() {
    let d = Deadlines {
        send_timeout: Duration::from_secs(2),
        ..Deadlines::default()
    };
    let srv = TestServer::with(config_with(d));
    // A connected admin queue without keep-alive: nothing but the send timeout can end it.
    let (mut a, _) = Host::admin(srv.addr, NQN, false, false);
    assert_eq!(srv.target.controller_count(), 1);
    let n = flood_until_the_target_stops_reading(&mut a.stream, STALL);
    println!("target stopped reading after about {n} commands");
    let t0 = Instant::now();
    while srv.target.controller_count() > 0 {
        assert!(
            t0.elapsed() < 2 * d.send_timeout + SLACK,
            "the connection of a host that does not read was never dropped"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "dropped {:?} after the target stopped reading",
        t0.elapsed()
    );
    // The host sees it too: its writes fail once the target's socket is gone.
    a.stream
        .set_write_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let t0 = Instant::now();
    loop {
        match a.stream.write(&prop_get_pdu(1)) {
            Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            _ => assert!(t0.elapsed() < SLACK, "the host's socket still open"),
        }
    }
    // The server serves on.
    let (mut b, _) = Host::admin(srv.addr, NQN, false, false);
    assert_eq!(b.identify(1, 0).0, Status::SUCCESS);
}

#[test]
fn a_busy_host_does_not_outlive_shutdown() {
    // One connection served by `connection::serve` with a shutdown flag of the test's own:
    // nothing else (no server closing sockets) can end it.
    let target = Target::new(config());
    let stop = Arc::new(AtomicBool::new(false));
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (t, flag) = (target.clone(), stop.clone());
    let served = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        connection::serve(s, t, flag)
    });
    let mut a = Host::new(addr, false, false);
    assert_eq!(a.connect(NQN, 0, 0xFFFF, 0).0, Status::SUCCESS);
    // A command every 100 ms: the connection's read never waits long enough to time out.
    let host_done = Arc::new(AtomicBool::new(false));
    let done = host_done.clone();
    let host = std::thread::spawn(move || {
        let mut answered = 0;
        while !done.load(Ordering::Relaxed) {
            let cid = a.cid();
            if a.stream.write_all(&prop_get_pdu(cid)).is_err() {
                break;
            }
            match a.next_event() {
                Ok(Event::Completion(c)) => {
                    assert_eq!(Status::from_field(c.status), Status::SUCCESS);
                    answered += 1;
                }
                _ => break,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        answered
    });
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::Relaxed);
    let end = within(SLACK, "the busy connection after shutdown", move || {
        served.join().unwrap()
    });
    host_done.store(true, Ordering::Relaxed);
    assert!(matches!(end, End::TimedOut), "{end:?}");
    let answered = host.join().unwrap();
    assert!(
        answered >= 2,
        "the host was busy: {answered} commands answered"
    );
}

#[test]
fn an_io_queue_stops_with_its_controller_even_while_busy() {
    let srv = TestServer::start();
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, false, false);
    a.set_queues(1);
    let mut io = Host::io(srv.addr, cntlid, 1, false, false);
    // The I/O queue writes a block every 50 ms, before and after its controller goes.
    let gone = Arc::new(AtomicBool::new(false));
    let seen_gone = gone.clone();
    let writer = std::thread::spawn(move || {
        let (mut before, mut after) = (0u32, 0u32);
        for lba in 0..2000u64 {
            let late = seen_gone.load(Ordering::SeqCst);
            let mut c = io.rw_cmd(0x01, 1, lba, 1);
            c.set_sgl(0, BS as u32, pdu::SGL_IN_CAPSULE);
            if io
                .stream
                .write_all(&pdu::capsule_cmd(&c, &[lba as u8 | 1; BS], false, false))
                .is_err()
            {
                return (before, after, true);
            }
            match io.next_event() {
                Ok(Event::Completion(done)) => {
                    assert_eq!(Status::from_field(done.status), Status::SUCCESS);
                    if late {
                        after += 1;
                    } else {
                        before += 1;
                    }
                }
                _ => return (before, after, true),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        (before, after, false)
    });
    std::thread::sleep(Duration::from_millis(500));
    drop(a);
    let t0 = Instant::now();
    while srv.target.controller_count() > 0 {
        assert!(
            t0.elapsed() < SLACK,
            "the controller outlived its admin queue"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    gone.store(true, Ordering::SeqCst);
    let (before, after, closed) = within(SLACK, "the I/O queue", move || writer.join().unwrap());
    assert!(before >= 2, "the queue was busy: {before} writes before");
    assert!(
        closed,
        "the I/O queue kept running after its controller was torn down"
    );
    // At most the write already in flight when the controller went can complete.
    assert!(after <= 1, "{after} writes ran on a torn-down controller");
}

#[test]
fn connections_that_never_connect_are_closed_at_the_deadline() {
    let deadline = Duration::from_secs(1);
    let srv = TestServer::with(config_with(Deadlines {
        connect_deadline: deadline,
        ..Deadlines::default()
    }));
    // Before the connections start, so before the target starts their deadlines.
    let started = Instant::now();
    // Silent from the start; an ICReq and nothing else; commands but never a Connect.
    let mut silent = Host::raw(srv.addr);
    let mut icreq_only = Host::new(srv.addr, false, false);
    let mut busy = Host::new(srv.addr, false, false);
    // A connected admin queue (no keep-alive) is not affected.
    let (mut a, _) = Host::admin(srv.addr, NQN, false, false);
    for h in [&mut silent, &mut icreq_only] {
        h.stream.set_read_timeout(Some(deadline + SLACK)).unwrap();
    }
    let busy = std::thread::spawn(move || {
        let t0 = Instant::now();
        loop {
            assert!(
                t0.elapsed() < deadline + SLACK,
                "a connection sending commands but no Connect stayed open"
            );
            if busy.stream.write_all(&prop_get_pdu(1)).is_err() {
                return;
            }
            match busy.next_event() {
                Ok(Event::Completion(c)) => {
                    assert_eq!(Status::from_field(c.status), Status::CMD_SEQ_ERROR)
                }
                _ => return,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let mut b = [0u8; 1];
    let t0 = Instant::now();
    assert_eq!(silent.stream.read(&mut b).unwrap_or(1), 0, "silent closed");
    assert_eq!(
        icreq_only.stream.read(&mut b).unwrap_or(1),
        0,
        "ICReq-only closed"
    );
    assert!(
        t0.elapsed() < deadline + SLACK,
        "closed by the deadline, not the test's read timeout"
    );
    assert!(
        started.elapsed() >= deadline,
        "closed at the deadline, not before: after {:?}",
        started.elapsed()
    );
    busy.join().unwrap();
    assert_eq!(
        a.identify(1, 0).0,
        Status::SUCCESS,
        "a connected queue lives on"
    );
}
