//! A connection's byte streams, whatever carries them (TCP, Unix socket,
//! stdin/stdout): a read half, a write half and a "closer" that shuts the
//! socket down from another thread to unblock a reader or writer.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// Shuts down (part of) a connection from any thread.
pub type Closer = Arc<dyn Fn(Shutdown) + Send + Sync>;

pub struct Transport {
    pub reader: Box<dyn Read + Send>,
    pub writer: Box<dyn Write + Send>,
    pub closer: Closer,
    pub peer: String,
    /// The socket, for non-blocking reads while busy polling (None: cannot poll). It stays
    /// valid as long as `reader` lives.
    pub poll_fd: Option<RawFd>,
}

impl Transport {
    /// A TCP connection; sets `TCP_NODELAY` (replies are written whole).
    pub fn tcp(s: TcpStream) -> io::Result<Self> {
        s.set_nodelay(true)?;
        let peer = s
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "tcp".into());
        Self::socket(s, peer)
    }

    /// A Unix-domain stream connection.
    pub fn unix(s: UnixStream) -> io::Result<Self> {
        Self::socket(s, "unix".into())
    }

    /// A stream socket: reads on `s`, writes and shutdowns on clones of it.
    fn socket<S: Socket>(s: S, peer: String) -> io::Result<Self> {
        let w = s.try_clone_socket()?;
        let c = s.try_clone_socket()?;
        let poll_fd = Some(s.as_raw_fd());
        Ok(Transport {
            reader: Box::new(s),
            writer: Box::new(w),
            closer: Arc::new(move |how| c.shutdown_socket(how)),
            peer,
            poll_fd,
        })
    }

    /// Standard input and output (libnbd's `connect_command` passes a
    /// socketpair there). File descriptor 1 is pointed at /dev/null so that
    /// nothing else in the process can write into the protocol stream.
    pub fn stdio() -> io::Result<Self> {
        let rfd = dup(0)?;
        let wfd = dup(1)?;
        let cfd = dup(0)?;
        let devnull = File::options().write(true).open("/dev/null")?;
        // SAFETY: dup2 onto fd 1 with a valid open descriptor; fd 1 is then
        // /dev/null, and our protocol output goes through `wfd`.
        if unsafe { libc::dup2(devnull.as_raw_fd(), 1) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Transport {
            reader: Box::new(File::from(rfd)),
            writer: Box::new(File::from(wfd)),
            closer: Arc::new(move |how| {
                let how = match how {
                    Shutdown::Read => libc::SHUT_RD,
                    Shutdown::Write => libc::SHUT_WR,
                    Shutdown::Both => libc::SHUT_RDWR,
                };
                // SAFETY: shutdown on a descriptor this closure owns; on a
                // pipe it fails with ENOTSOCK, which is fine to ignore.
                unsafe { libc::shutdown(cfd.as_raw_fd(), how) };
            }),
            peer: "stdio".into(),
            poll_fd: None,
        })
    }
}

/// What `Transport::socket` needs of TCP and Unix streams alike.
trait Socket: Read + Write + AsRawFd + Send + Sync + Sized + 'static {
    fn try_clone_socket(&self) -> io::Result<Self>;
    /// Shuts the socket down; errors (already closed) are ignored.
    fn shutdown_socket(&self, how: Shutdown);
}

impl Socket for TcpStream {
    fn try_clone_socket(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn shutdown_socket(&self, how: Shutdown) {
        let _ = self.shutdown(how);
    }
}

impl Socket for UnixStream {
    fn try_clone_socket(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn shutdown_socket(&self, how: Shutdown) {
        let _ = self.shutdown(how);
    }
}

/// A duplicate of descriptor `fd` (close-on-exec), owned by the caller.
pub(crate) fn dup(fd: i32) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor (or -1) that nobody
    // else owns; we take ownership of it only on success.
    let n = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `n` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// Sets or clears `O_NONBLOCK` on a descriptor (the pump's, one copy for both front-ends).
pub(crate) use flashpool_tlspump::set_nonblocking;
