//! systemd-style socket activation: listening sockets inherited from the
//! parent as file descriptors 3.. when `LISTEN_PID` is our pid and
//! `LISTEN_FDS` says how many (libnbd's `[ server ]` syntax does this).

use std::io;
use std::net::TcpListener;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;

/// First inherited descriptor, per the sd_listen_fds convention.
pub const LISTEN_FDS_START: RawFd = 3;

/// An inherited listening socket.
pub enum Activated {
    Tcp(TcpListener),
    Unix(UnixListener),
}

/// Take the sockets passed by a service manager, if any (empty when the
/// variables are absent or meant for another process). The variables are
/// removed so children do not see them.
pub fn take_listen_fds() -> io::Result<Vec<Activated>> {
    let pid = std::env::var("LISTEN_PID").ok();
    let fds = std::env::var("LISTEN_FDS").ok();
    std::env::remove_var("LISTEN_PID");
    std::env::remove_var("LISTEN_FDS");
    std::env::remove_var("LISTEN_FDNAMES");
    let (Some(pid), Some(fds)) = (pid, fds) else {
        return Ok(Vec::new());
    };
    if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
        return Ok(Vec::new());
    }
    let n: i32 = fds
        .trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "bad LISTEN_FDS"))?;
    let mut out = Vec::new();
    for fd in LISTEN_FDS_START..LISTEN_FDS_START + n.max(0) {
        // SAFETY: fcntl on an inherited descriptor number; it only sets the
        // close-on-exec flag and fails harmlessly if the fd is not open.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let family = socket_family(fd)?;
        // SAFETY: the service manager handed this open descriptor to us
        // alone; from here on the OwnedFd is its only owner.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        out.push(match family {
            libc::AF_UNIX => Activated::Unix(UnixListener::from(owned)),
            libc::AF_INET | libc::AF_INET6 => Activated::Tcp(TcpListener::from(owned)),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "inherited fd is not a TCP or Unix socket",
                ))
            }
        });
    }
    Ok(out)
}

fn socket_family(fd: RawFd) -> io::Result<i32> {
    // SAFETY: sockaddr_storage is plain old data; getsockname writes at most
    // `len` bytes into it.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: valid pointers to `ss` and `len` for the duration of the call.
    let r = unsafe { libc::getsockname(fd, &mut ss as *mut _ as *mut libc::sockaddr, &mut len) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ss.ss_family as i32)
}
