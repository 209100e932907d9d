//! The admin socket against clients that trickle their command: each has a deadline for its
//! whole command, so eight of them (every slot) lock the admin commands out for seconds, not
//! hours, and a command turned away meanwhile says the server is busy (it used to fail with
//! `Broken pipe`, the server's answer lost).

mod common;

use common::{flashpool, s, Server, TempDir};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn clients_trickling_their_command_hold_the_admin_socket_for_seconds_only() {
    let tmp = TempDir::new("admin-socket", "trickle");
    let data = tmp.0.join("data");
    let srv = Server::start(&data, &[]);
    let sock = data.join("admin.sock");
    let stop = Instant::now() + Duration::from_secs(30);
    let done = Arc::new(AtomicBool::new(false));
    let tricklers: Vec<_> = (0..8)
        .map(|_| {
            let mut c = UnixStream::connect(&sock).unwrap();
            let done = done.clone();
            std::thread::spawn(move || {
                // One byte a second, never a newline: under the old per-read timeout this held
                // its slot until 4 KiB had come, over an hour.
                while Instant::now() < stop && !done.load(Ordering::SeqCst) {
                    if c.write_all(b"s").is_err() {
                        return; // the server dropped it
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let busy = flashpool(&["status", "--data", s(&data)]);
    let err = String::from_utf8_lossy(&busy.stderr);
    assert!(!busy.status.success(), "every admin slot is taken: {err}");
    assert!(err.contains("busy"), "the refusal says why: {err}");

    // The tricklers' deadline passes: the slots are free again well before they stop.
    let mut answered = false;
    while Instant::now() + Duration::from_secs(5) < stop {
        std::thread::sleep(Duration::from_secs(1));
        if flashpool(&["status", "--data", s(&data)]).status.success() {
            answered = true;
            break;
        }
    }
    assert!(
        answered,
        "status never answered while the tricklers went on"
    );
    done.store(true, Ordering::SeqCst);
    for t in tricklers {
        t.join().unwrap();
    }
    srv.stop();
}
