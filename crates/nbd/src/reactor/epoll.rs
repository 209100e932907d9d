//! The two kernel objects a reactor waits with: an epoll set over its connections' sockets
//! and read queues' rings, and an eventfd other threads write to wake it (a new
//! connection, a worker's finished request, the server stopping).
//!
//! Written on `libc` rather than taken from `mio`: a reactor needs sockets edge-triggered
//! (it reads and writes each until `EAGAIN`, and only then waits) and io_uring descriptors
//! level-triggered (a ring polls readable while any completion waits, and its completions
//! are reaped by the queue's own `poll`), and mio registers everything edge-triggered. The
//! whole of it is three system calls.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Most events taken per wait.
const MAX_EVENTS: usize = 256;

/// An epoll set whose registrations carry a `u64` token.
pub(crate) struct Epoll {
    fd: OwnedFd,
    events: Vec<libc::epoll_event>,
}

/// How a descriptor is watched.
#[derive(Clone, Copy)]
pub(crate) enum Watch {
    /// A socket: readable, writable and hung up, edge-triggered.
    Socket,
    /// A descriptor that is readable while it has something to take (an io_uring, an
    /// eventfd), level-triggered.
    Readable,
}

impl Epoll {
    pub(crate) fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 takes no pointers; it returns a new descriptor or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Epoll {
            // SAFETY: `fd` is a fresh descriptor nobody else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            events: Vec::with_capacity(MAX_EVENTS),
        })
    }

    /// Watches `fd` and reports it under `token`.
    pub(crate) fn add(&self, fd: RawFd, token: u64, watch: Watch) -> io::Result<()> {
        let events = match watch {
            Watch::Socket => libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET,
            Watch::Readable => libc::EPOLLIN,
        };
        let mut ev = libc::epoll_event {
            events: events as u32,
            u64: token,
        };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call; the kernel copies
        // it. A bad `fd` makes the call fail, which is reported.
        let r = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Stops watching `fd` (errors, as for a descriptor already closed, are ignored: closing
    /// a descriptor takes it out of the set anyway).
    pub(crate) fn remove(&self, fd: RawFd) {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: as in `add`; the event is ignored by EPOLL_CTL_DEL but must be non-null on
        // old kernels.
        unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) };
    }

    /// Waits up to `timeout_ms` (-1: no limit) and appends the tokens of the descriptors
    /// that are ready to `out`.
    pub(crate) fn wait(&mut self, timeout_ms: i32, out: &mut Vec<u64>) -> io::Result<()> {
        self.events.clear();
        // SAFETY: the kernel writes at most MAX_EVENTS entries into `events`' spare capacity,
        // which holds MAX_EVENTS; the length is set to what it reports below.
        let n = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                self.events.as_mut_ptr(),
                MAX_EVENTS as i32,
                timeout_ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(())
            } else {
                Err(e)
            };
        }
        // SAFETY: epoll_wait initialised the first `n` (<= MAX_EVENTS) entries.
        unsafe { self.events.set_len(n as usize) };
        out.extend(self.events.iter().map(|e| e.u64));
        Ok(())
    }
}

/// An eventfd: `wake` from any thread makes it readable until `clear`.
pub(crate) struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    pub(crate) fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; it returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(EventFd {
            // SAFETY: `fd` is a fresh descriptor nobody else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Makes it readable (adds one to its counter; a full counter is readable already).
    pub(crate) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one`, which lives across the call.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Resets it to not readable.
    pub(crate) fn clear(&self) {
        let mut n: u64 = 0;
        // SAFETY: reads at most 8 bytes into `n`; non-blocking, so an empty counter returns
        // EAGAIN, which is fine.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
    }
}
