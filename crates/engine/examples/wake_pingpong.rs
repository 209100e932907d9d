//! What a wake-up costs on this machine: two threads ping-pong 28-byte requests and 16-byte
//! replies over a Unix stream socket pair (an NBD request and reply without data), the
//! server thread waiting for each request in each of the ways flashpool's servers wait:
//! a blocking `recv` (a connection thread between requests), `epoll_wait` (a reactor),
//! `poll` and io_uring's one-shot `POLL_ADD` with `io_uring_enter` (a connection thread with
//! reads in flight). Each way runs with the two threads on one CPU and on two different
//! CPUs (`sched_setaffinity`), since a wake-up across CPUs (an inter-processor interrupt,
//! on a VM possibly to a halted vCPU) can cost far more than a switch on one.
//!
//!     cargo run --release -p flashpool-engine --example wake_pingpong [ROUND_TRIPS] [ROUNDS]
//!
//! Prints the mean round trip of each way; no timing is asserted anywhere.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Instant;

const REQUEST: usize = 28;
const REPLY: usize = 16;

/// Pins the calling thread to `cpu`; false when the machine refuses.
fn pin(cpu: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes inside it; the call reads
    // `size_of::<cpu_set_t>()` bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// The CPUs this process may run on (its affinity mask), in order.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid set for sched_getaffinity to fill; CPU_ISSET
    // reads inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

fn recv(fd: i32, buf: &mut [u8], flags: i32) -> isize {
    // SAFETY: `buf` is ours to write for its length.
    unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) }
}

fn send(fd: i32, buf: &[u8]) {
    // SAFETY: `buf` is ours to read for its length.
    let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), 0) };
    assert_eq!(n, buf.len() as isize, "a short send on a socket pair");
}

/// Receives one request without blocking; false when none is there yet.
fn try_request(fd: i32, buf: &mut [u8; REQUEST]) -> bool {
    let n = recv(fd, buf, libc::MSG_DONTWAIT);
    assert!(
        n == REQUEST as isize || n < 0,
        "a partial request on a socket pair"
    );
    n == REQUEST as isize
}

/// Answers `n` requests, waiting for each the way `how` says.
fn server(how: &str, s: UnixStream, n: usize) {
    let fd = s.as_raw_fd();
    let mut req = [0u8; REQUEST];
    let reply = [0u8; REPLY];
    match how {
        "recv" => {
            for _ in 0..n {
                assert_eq!(recv(fd, &mut req, libc::MSG_WAITALL), REQUEST as isize);
                send(fd, &reply);
            }
        }
        "epoll" => {
            // SAFETY: plain system calls on descriptors this thread owns for the loop.
            let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            assert!(ep >= 0, "epoll_create1");
            let mut ev = libc::epoll_event {
                events: (libc::EPOLLIN | libc::EPOLLET) as u32,
                u64: 1,
            };
            // SAFETY: as above; `ev` outlives the call.
            assert_eq!(
                unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) },
                0
            );
            let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
            for _ in 0..n {
                while !try_request(fd, &mut req) {
                    // SAFETY: `evs` is ours for the call.
                    unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 4, -1) };
                }
                send(fd, &reply);
            }
            // SAFETY: our descriptor.
            unsafe { libc::close(ep) };
        }
        "poll" => {
            for _ in 0..n {
                while !try_request(fd, &mut req) {
                    let mut p = libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one pollfd we own.
                    unsafe { libc::poll(&mut p, 1, -1) };
                }
                send(fd, &reply);
            }
        }
        "io_uring" => {
            let mut ring = io_uring::IoUring::new(8).expect("io_uring");
            for _ in 0..n {
                while !try_request(fd, &mut req) {
                    let sqe = io_uring::opcode::PollAdd::new(
                        io_uring::types::Fd(fd),
                        libc::POLLIN as u32,
                    )
                    .build()
                    .user_data(1);
                    // SAFETY: a poll entry refers to no memory; the socket stays open.
                    unsafe { ring.submission().push(&sqe) }.expect("an empty ring has room");
                    ring.submit_and_wait(1).expect("io_uring_enter");
                    ring.completion().for_each(drop);
                }
                send(fd, &reply);
            }
        }
        other => unreachable!("no way {other}"),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let rounds: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(3);
    let cpus = allowed_cpus();
    let (Some(&first), Some(&last)) = (cpus.first(), cpus.last()) else {
        eprintln!("cannot read this process's CPU affinity");
        std::process::exit(1);
    };
    let uring = io_uring::IoUring::new(8).is_ok();
    if !uring {
        eprintln!("io_uring unavailable: its row is left out");
    }
    for round in 1..=rounds {
        for how in ["recv", "epoll", "poll", "io_uring"] {
            if how == "io_uring" && !uring {
                continue;
            }
            for (place, server_cpu) in [("one CPU", first), ("two CPUs", last)] {
                if place == "two CPUs" && first == last {
                    continue;
                }
                let (client, srv) = UnixStream::pair().expect("socketpair");
                let how_s = how.to_string();
                let t = std::thread::spawn(move || {
                    if !pin(server_cpu) {
                        eprintln!("cannot pin the server thread to CPU {server_cpu}");
                    }
                    server(&how_s, srv, n)
                });
                if !pin(first) {
                    eprintln!("cannot pin the client to CPU {first}");
                }
                let fd = client.as_raw_fd();
                let req = [1u8; REQUEST];
                let mut reply = [0u8; REPLY];
                let t0 = Instant::now();
                for _ in 0..n {
                    send(fd, &req);
                    assert_eq!(recv(fd, &mut reply, libc::MSG_WAITALL), REPLY as isize);
                }
                let us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
                t.join().expect("server thread");
                println!("round {round}  {how:8}  {place:8}  {us:7.2} us per round trip");
            }
        }
    }
}
