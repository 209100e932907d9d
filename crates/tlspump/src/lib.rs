//! The TLS pump shared by flashpool's front-ends (NBD's `NBD_OPT_STARTTLS`, NVMe/TCP's TLS
//! secure channel): after a TLS handshake, two threads move bytes between the TLS session and
//! one end of a Unix socket pair, and the protocol code runs over the other end exactly as over
//! a plain socket.
//!
//! Why: an OpenSSL session cannot be read and written from two threads at once, while both
//! front-ends read requests on one thread and write responses from several. The pump is two
//! threads sharing the session under a mutex, the TCP socket non-blocking, so neither direction
//! waits for the other: `tls_to_plain` decrypts what the peer sends, `plain_to_tls` encrypts
//! what the server writes. When the peer goes away the plain end sees end-of-file; when the
//! server closes (or shuts) the plain end, the pump sends `close_notify` and shuts the socket.
//!
//! The server closing its end also ends a pump waiting for a peer that has stopped reading
//! (its socket full, the session's writes wanting to wait): what is left then gets
//! [`CLOSE_LINGER`] to go, and the pump ends, so neither its threads nor the socket outlive
//! the server's end. While the plain end is open, bounding how long a peer may take to read is
//! the server's job (a send timeout on its end: the pump then fills the socket pair and the
//! server's write times out).

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openssl::ssl::{ErrorCode, SslStream};

/// Once the server has closed (or shut) its end, how long what it wrote before may still take
/// to reach a peer whose socket is full; then the pump drops the rest and ends. A peer that
/// reads takes it within moments (a server's last words, an error report before it closes,
/// are not lost to a momentarily full socket); one that has stopped reading would otherwise
/// hold the pump's threads and the socket until it closes its own end.
pub const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// Sets or clears `O_NONBLOCK` on descriptor `fd`.
pub fn set_nonblocking(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl flag manipulation on a descriptor the caller keeps open; no memory is
    // passed.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = if on {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        if libc::fcntl(fd, libc::F_SETFL, flags) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Starts the pump for an established TLS session (its handshake done, the socket in blocking
/// mode: the pump makes it non-blocking). Returns the plain end of the socket pair; `name`
/// prefixes the two threads' names (`NAME-in`, `NAME-out`).
pub fn start<S>(stream: SslStream<S>, name: &str) -> io::Result<UnixStream>
where
    S: Read + Write + AsRawFd + Send + 'static,
{
    set_nonblocking(stream.get_ref().as_raw_fd(), true)?;
    let (plain, inner) = UnixStream::pair()?;
    let session = Arc::new(Mutex::new(stream));
    let inner2 = inner.try_clone()?;
    let s2 = Arc::clone(&session);
    std::thread::Builder::new()
        .name(format!("{name}-in"))
        .spawn(move || tls_to_plain(&session, inner))?;
    std::thread::Builder::new()
        .name(format!("{name}-out"))
        .spawn(move || plain_to_tls(&s2, inner2))?;
    Ok(plain)
}

/// Waits until `fd` is readable (`out` false) or writable (`out` true), at most a second.
fn wait_fd(fd: RawFd, out: bool) {
    wait_fd_or_shut(fd, out, None, Duration::from_secs(1));
}

/// Waits until `fd` is readable (`out` false) or writable (`out` true), or until the socket
/// `plain` (when given) is shut for reading (its peer closed or shut its end, or it was shut
/// here), at most `limit`. Returns whether `plain` is shut.
fn wait_fd_or_shut(fd: RawFd, out: bool, plain: Option<RawFd>, limit: Duration) -> bool {
    let mut p = [
        libc::pollfd {
            fd,
            events: if out { libc::POLLOUT } else { libc::POLLIN },
            revents: 0,
        },
        libc::pollfd {
            fd: plain.unwrap_or(-1),
            events: libc::POLLRDHUP,
            revents: 0,
        },
    ];
    let n = if plain.is_some() { 2 } else { 1 };
    let ms = limit.as_millis().clamp(1, 1000) as libc::c_int;
    // SAFETY: `n` valid pollfds for the duration of the call.
    let ready = unsafe { libc::poll(p.as_mut_ptr(), n, ms) };
    ready > 0 && plain.is_some() && p[1].revents & (libc::POLLRDHUP | libc::POLLHUP) != 0
}

type Session<S> = Arc<Mutex<SslStream<S>>>;

fn lock<S>(s: &Session<S>) -> std::sync::MutexGuard<'_, SslStream<S>> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// Decrypted bytes from the peer, to the plain end.
fn tls_to_plain<S: Read + Write + AsRawFd>(s: &Session<S>, mut plain: UnixStream) {
    let fd = lock(s).get_ref().as_raw_fd();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let r = lock(s).ssl_read(&mut buf);
        match r {
            Ok(0) => break,
            Ok(n) => {
                if plain.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if e.code() == ErrorCode::WANT_READ => wait_fd(fd, false),
            Err(e) if e.code() == ErrorCode::WANT_WRITE => wait_fd(fd, true),
            Err(e) => {
                if e.code() != ErrorCode::ZERO_RETURN {
                    tracing::debug!("TLS read: {e}");
                }
                break;
            }
        }
    }
    // The peer is gone: the session's reader sees the end of the stream.
    let _ = plain.shutdown(std::net::Shutdown::Both);
}

/// What the server writes on the plain end, encrypted to the peer. While the session cannot
/// take more (the peer is not reading), it watches the plain end too: once that is shut, what
/// is left gets [`CLOSE_LINGER`], then the pump ends.
fn plain_to_tls<S: Read + Write + AsRawFd>(s: &Session<S>, mut plain: UnixStream) {
    let fd = lock(s).get_ref().as_raw_fd();
    let plain_fd = plain.as_raw_fd();
    let mut buf = vec![0u8; 64 * 1024];
    // Until when the rest may take to go, once the plain end is seen shut.
    let mut linger: Option<Instant> = None;
    'outer: loop {
        // Once the plain end is shut this does not wait: the rest, then end-of-file.
        let n = match plain.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut at = 0;
        while at < n {
            let r = lock(s).ssl_write(&buf[at..n]);
            let out = match r {
                Ok(k) => {
                    at += k;
                    continue;
                }
                Err(e) if e.code() == ErrorCode::WANT_WRITE => true,
                Err(e) if e.code() == ErrorCode::WANT_READ => false,
                Err(e) => {
                    tracing::debug!("TLS write: {e}");
                    break 'outer;
                }
            };
            match linger {
                None => {
                    let limit = Duration::from_secs(1);
                    if wait_fd_or_shut(fd, out, Some(plain_fd), limit) {
                        linger = Some(Instant::now() + CLOSE_LINGER);
                    }
                }
                Some(until) => {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        tracing::debug!(
                            "TLS peer not reading after the plain end closed: dropping the rest"
                        );
                        break 'outer;
                    }
                    wait_fd_or_shut(fd, out, None, left);
                }
            }
        }
    }
    // The session ended: say so to the peer and close the socket for both pump halves.
    let mut st = lock(s);
    let _ = st.shutdown();
    // SAFETY: shutdown on a descriptor the session owns and keeps open.
    unsafe { libc::shutdown(st.get_ref().as_raw_fd(), libc::SHUT_RDWR) };
    drop(st);
    let _ = plain.shutdown(std::net::Shutdown::Both);
}
