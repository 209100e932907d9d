//! A connection whose thread cannot be started is dropped, and the server accepts the next
//! one: a failed spawn must not end the accept loop for everyone. The failure is real: the
//! process's address space is capped (RLIMIT_AS) just above what it uses, so the kernel
//! refuses the new thread's stack, then the cap is lifted. Its own test binary, since the cap
//! is process-wide, and no thread exits before it (glibc would reuse an exited thread's
//! cached stack instead of mapping one). The cap comes only once the server has served a
//! connection: a thread still starting (the accept loop's own, mapping its signal stack and
//! malloc arena) would otherwise meet it and abort the process, and that connection stays
//! open through the cap so its thread does not exit.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use flashpool_nvmet::status::Status;

/// The process's mapped address space in bytes (VmSize).
fn vm_size() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmSize:"))
        .expect("VmSize in /proc/self/status");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("VmSize in kB");
    kib * 1024
}

fn address_space_limit() -> libc::rlimit {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit we own.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) }, 0);
    r
}

fn set_address_space_limit(r: &libc::rlimit) {
    // SAFETY: setrlimit reads one rlimit we own.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, r) }, 0);
}

#[test]
fn a_failed_thread_spawn_drops_that_connection_and_the_server_accepts_on() {
    let srv = TestServer::start();
    let addr = srv.addr;
    // The accept loop is up and has started one connection thread, which stays open.
    let (mut first, _) = Host::admin(addr, NQN, false, false);
    assert_eq!(first.identify(1, 0).0, Status::SUCCESS);
    let saved = address_space_limit();
    // Room for small allocations in what is mapped already, none for a thread's stack
    // (2 MiB).
    let cap = libc::rlimit {
        rlim_cur: vm_size() + (512 << 10),
        rlim_max: saved.rlim_max,
    };
    set_address_space_limit(&cap);
    let refused = TcpStream::connect(addr).and_then(|mut s| {
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut b = [0u8; 1];
        s.read(&mut b)
    });
    set_address_space_limit(&saved);
    assert_eq!(
        refused.expect("the connection is closed, not left hanging"),
        0,
        "the connection without a thread is dropped"
    );
    // The accept loop lives on.
    let (mut a, _) = Host::admin(addr, NQN, false, false);
    assert_eq!(a.identify(1, 0).0, Status::SUCCESS);
    assert_eq!(first.identify(1, 0).0, Status::SUCCESS);
}
