//! The HTTP listeners of `flashpool serve` (`--metrics`, `--api`) against hostile or careless
//! clients, on the real binary: a huge declared `Content-Length`, bodies declared and never
//! sent, a 1 MiB header line, hundreds of idle connections. Each must leave the server
//! answering `/metrics` and `/api/v1/status`.
//!
//! Each of these stopped the earlier server on tiny_http 0.12 (docs/RELIABILITY.md, 48-51):
//! its request reader allocated the whole unread rest of a body when dropped (a declared
//! length of 2^63-1 aborted the process: "memory allocation ... failed"), drained unread
//! bodies without a read timeout on one of its four worker threads (four such connections
//! stopped a listener), buffered header lines without a bound, and died for good when
//! accepting ran out of file descriptors (`try_clone().unwrap()` in its accept thread).
//! The deadlines here are generous "never" bounds, not timings.

mod common;

use common::{s, Server, TempDir};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const TOKEN: &str = "0123456789abcdef-hardening-token";

/// Serialises server starts, so that the one started with a lower file-descriptor limit (the
/// limit of this process while it forks) does not hand that limit to another.
static START: Mutex<()> = Mutex::new(());

fn token_file(dir: &Path) -> PathBuf {
    let p = dir.join("api-token");
    std::fs::write(&p, format!("{TOKEN}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// A server with `--metrics` and `--api` on listeners of their own; with `nofile`, started
/// with that soft limit on open files.
fn start(tmp: &TempDir, nofile: Option<u64>) -> Server {
    let tok = token_file(&tmp.0);
    let args = [
        "--metrics",
        "127.0.0.1:0",
        "--api",
        "127.0.0.1:0",
        "--api-token-file",
        s(&tok),
    ];
    let _one = START.lock().unwrap_or_else(|e| e.into_inner());
    let Some(limit) = nofile else {
        return Server::start(&tmp.0.join("data"), &args);
    };
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on structs we own; the lower soft limit is in force only
    // while the server is forked (it inherits it), then the old one is put back.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut old), 0);
        let low = libc::rlimit {
            rlim_cur: limit.min(old.rlim_cur),
            rlim_max: old.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &low), 0);
    }
    let srv = std::panic::catch_unwind(|| Server::start(&tmp.0.join("data"), &args));
    // SAFETY: as above.
    unsafe { assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &old), 0) };
    srv.unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// One HTTP/1.0 request; its status code, or None when the connection failed or closed
/// without an answer.
fn request(addr: &str, method: &str, path: &str, token: bool) -> Option<u16> {
    let mut c = TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(10)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let auth = if token {
        format!("Authorization: Bearer {TOKEN}\r\n")
    } else {
        String::new()
    };
    write!(c, "{method} {path} HTTP/1.0\r\nHost: x\r\n{auth}\r\n").ok()?;
    let mut out = Vec::new();
    c.read_to_end(&mut out).ok()?;
    String::from_utf8_lossy(&out)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
}

/// Waits (up to `within`) for `/metrics` and `/api/v1/status` to answer 200, and for the
/// process to be running.
fn answers(srv: &mut Server, within: Duration) {
    let deadline = Instant::now() + within;
    let (m, a) = (srv.metrics.clone().unwrap(), srv.api.clone().unwrap());
    loop {
        if let Some(st) = srv.child.try_wait().unwrap() {
            let log: Vec<String> = srv.log.try_iter().collect();
            panic!("flashpool serve exited {st:?}: {log:#?}");
        }
        let got = (
            request(&m, "GET", "/metrics", false),
            request(&a, "GET", "/api/v1/status", true),
        );
        if got == (Some(200), Some(200)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the server stopped answering: /metrics {:?}, /api/v1/status {:?}",
            got.0,
            got.1
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Sends `head` on a new connection; the status code of the answer, or None for a close
/// without one (both are fine answers to a hostile request, as long as the server lives).
fn raw(addr: &str, head: &[u8]) -> Option<u16> {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    // The server may answer and close before all of it is sent.
    let _ = c.write_all(head);
    let mut out = [0u8; 64];
    let n = c.read(&mut out).unwrap_or(0);
    String::from_utf8_lossy(&out[..n])
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
}

#[test]
fn a_huge_declared_body_is_refused_and_the_server_lives_on() {
    let tmp = TempDir::new("http", "huge");
    let mut srv = start(&tmp, None);
    let (m, a) = (srv.metrics.clone().unwrap(), srv.api.clone().unwrap());
    let huge = "Content-Length: 9223372036854775807\r\n";
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    for (addr, head) in [
        (
            &m,
            format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{huge}\r\n"),
        ),
        (
            &m,
            format!("POST /nothing HTTP/1.1\r\nHost: x\r\n{huge}\r\n"),
        ),
        (
            &a,
            format!("GET /api/v1/status HTTP/1.1\r\nHost: x\r\n{huge}\r\n"),
        ),
        (
            &a,
            format!("POST /api/v1/volumes HTTP/1.1\r\nHost: x\r\n{auth}{huge}\r\n"),
        ),
    ] {
        let code = raw(addr, head.as_bytes());
        assert!(
            code.is_none_or(|c| c >= 400 || head.starts_with("GET /metrics")),
            "{head:?} answered {code:?}"
        );
        answers(&mut srv, Duration::from_secs(60));
    }
    // With the token, the declared length alone gets 413.
    let head = format!("POST /api/v1/volumes HTTP/1.1\r\nHost: x\r\n{auth}{huge}\r\n");
    assert_eq!(raw(&a, head.as_bytes()), Some(413));
    srv.stop();
}

#[test]
fn bodies_declared_and_never_sent_do_not_stop_a_listener() {
    let tmp = TempDir::new("http", "nobody");
    let mut srv = start(&tmp, None);
    let (m, a) = (srv.metrics.clone().unwrap(), srv.api.clone().unwrap());
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    let mut held = Vec::new();
    for i in 0..8 {
        for (addr, head) in [
            (
                &m,
                "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n".to_string(),
            ),
            (
                &a,
                format!(
                    "POST /api/v1/volumes HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 1000\r\n\r\n{{\"name\":\"v{i}\""
                ),
            ),
        ] {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(head.as_bytes()).unwrap();
            held.push(c);
        }
    }
    answers(&mut srv, Duration::from_secs(60));
    drop(held);
    srv.stop();
}

#[test]
fn a_huge_header_line_is_refused_and_the_server_lives_on() {
    let tmp = TempDir::new("http", "header");
    let mut srv = start(&tmp, None);
    for addr in [srv.metrics.clone().unwrap(), srv.api.clone().unwrap()] {
        let mut head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Long: ".to_vec();
        head.resize(head.len() + (1 << 20), b'a');
        head.extend_from_slice(b"\r\n\r\n");
        let code = raw(&addr, &head);
        assert!(code.is_none_or(|c| c == 431), "answered {code:?}");
        // Many header lines, each short.
        let mut head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n".to_vec();
        for i in 0..10_000 {
            head.extend_from_slice(format!("X-{i}: a\r\n").as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        let code = raw(&addr, &head);
        assert!(code.is_none_or(|c| c == 431), "answered {code:?}");
    }
    answers(&mut srv, Duration::from_secs(60));
    srv.stop();
}

/// 200 connections that send nothing, on a server allowed 160 open files: a listener serves
/// a bounded number of connections at once (64), closes those that send no request within its
/// header timeout, and a request queued behind them is answered. (The earlier server took a
/// thread and a file per connection without a bound; out of files, its accept thread died.)
#[test]
fn idle_connections_do_not_stop_a_listener() {
    let tmp = TempDir::new("http", "idle");
    let mut srv = start(&tmp, Some(160));
    let m = srv.metrics.clone().unwrap();
    let sock: std::net::SocketAddr = m.parse().unwrap();
    let idle: Vec<TcpStream> = (0..200)
        .filter_map(|_| TcpStream::connect_timeout(&sock, Duration::from_secs(2)).ok())
        .collect();
    assert!(idle.len() >= 64, "only {} connections", idle.len());
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        if let Some(st) = srv.child.try_wait().unwrap() {
            panic!("flashpool serve exited {st:?}");
        }
        if request(&m, "GET", "/metrics", false) == Some(200) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/metrics not answered behind idle connections"
        );
    }
    drop(idle);
    answers(&mut srv, Duration::from_secs(120));
    srv.stop();
}
