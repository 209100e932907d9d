//! The engine's error type, with the errno each error maps to at a protocol boundary.

use std::io;

/// Result with the engine's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Every way an engine call can fail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A drive or the OS failed an I/O beyond what the protection level can hide.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// The pool has no free space left for new data.
    #[error("no space left in the pool")]
    NoSpace,
    /// A request reaches past the end of a volume.
    #[error("request [{offset}, +{len}) is past the end of the volume ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// A caller passed an argument that can never be valid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A named object (volume, drive) does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// A named object already exists.
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// On-disk metadata failed a check (magic, version, checksum, consistency).
    #[error("corrupt or foreign pool metadata: {0}")]
    Corrupt(String),
    /// Too many drives are missing or failed to read the data.
    #[error("data unavailable: {0}")]
    Unavailable(String),
    /// The pool stopped accepting writes after an unrecoverable write failure.
    #[error("pool is read-only after a failure: {0}")]
    Failed(String),
    /// The request is refused in the pool's present state: doing it would leave data
    /// unavailable (failing a member beyond what parity covers). Valid at another time.
    #[error("refused: {0}")]
    Conflict(String),
}

impl Error {
    /// The POSIX errno that best describes this error (for NBD and other protocols).
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::NoSpace => libc::ENOSPC,
            Error::OutOfRange { .. } | Error::InvalidArgument(_) => libc::EINVAL,
            Error::NotFound(_) => libc::ENOENT,
            Error::AlreadyExists(_) => libc::EEXIST,
            Error::Corrupt(_) | Error::Unavailable(_) => libc::EIO,
            Error::Failed(_) => libc::EROFS,
            Error::Conflict(_) => libc::EBUSY,
        }
    }

    pub(crate) fn corrupt(msg: impl Into<String>) -> Self {
        Error::Corrupt(msg.into())
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
}
