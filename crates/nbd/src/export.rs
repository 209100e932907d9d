//! The storage interface the NBD server talks to: [`Export`] (one block
//! device), [`ExportSet`] (the named exports a server offers), [`Extent`]
//! (allocation status) and [`ExportError`] (an errno-like failure that maps
//! onto the NBD error values). The server never depends on a concrete
//! storage engine, only on these traits.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use crate::proto;

/// What went wrong in an export operation; each kind maps to one NBD error
/// value (see [`ErrorKind::nbd_errno`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Operation not permitted (read-only export): `NBD_EPERM`.
    Permission,
    /// Input/output error: `NBD_EIO`.
    Io,
    /// Out of memory: `NBD_ENOMEM`.
    NoMemory,
    /// Bad argument (range, flags): `NBD_EINVAL`.
    Invalid,
    /// No space left (thin pool full, write past the end): `NBD_ENOSPC`.
    NoSpace,
    /// Value too large: `NBD_EOVERFLOW`.
    Overflow,
    /// Operation not supported (e.g. a zero that cannot be fast): `NBD_ENOTSUP`.
    NotSupported,
    /// The server or backend is shutting down: `NBD_ESHUTDOWN`.
    Shutdown,
}

impl ErrorKind {
    /// The NBD wire error value for this kind.
    pub fn nbd_errno(self) -> u32 {
        match self {
            ErrorKind::Permission => proto::EPERM,
            ErrorKind::Io => proto::EIO,
            ErrorKind::NoMemory => proto::ENOMEM,
            ErrorKind::Invalid => proto::EINVAL,
            ErrorKind::NoSpace => proto::ENOSPC,
            ErrorKind::Overflow => proto::EOVERFLOW,
            ErrorKind::NotSupported => proto::ENOTSUP,
            ErrorKind::Shutdown => proto::ESHUTDOWN,
        }
    }

    /// Map a host `errno` value (as returned by a backend's `errno()`) to a
    /// kind. `EDQUOT` and `EFBIG` become `NoSpace` as the spec asks; anything
    /// unknown becomes `Io`.
    pub fn from_errno(errno: i32) -> ErrorKind {
        match errno {
            libc::EPERM | libc::EACCES | libc::EROFS => ErrorKind::Permission,
            libc::ENOMEM => ErrorKind::NoMemory,
            libc::EINVAL | libc::ERANGE => ErrorKind::Invalid,
            libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ErrorKind::NoSpace,
            libc::EOVERFLOW => ErrorKind::Overflow,
            libc::ENOTSUP | libc::ENOSYS => ErrorKind::NotSupported,
            libc::ESHUTDOWN => ErrorKind::Shutdown,
            _ => ErrorKind::Io,
        }
    }
}

/// An export operation failure: a kind plus a human-readable message (the
/// message travels to structured-reply clients in the error chunk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ExportError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ExportError {
            kind,
            message: message.into(),
        }
    }

    /// Build from a host errno value and a message.
    pub fn from_errno(errno: i32, message: impl Into<String>) -> Self {
        ExportError::new(ErrorKind::from_errno(errno), message)
    }
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for ExportError {}

impl From<std::io::Error> for ExportError {
    fn from(e: std::io::Error) -> Self {
        let kind = e
            .raw_os_error()
            .map(ErrorKind::from_errno)
            .unwrap_or(ErrorKind::Io);
        ExportError::new(kind, e.to_string())
    }
}

/// One run of bytes with a uniform allocation status (`base:allocation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Length in bytes (non-zero).
    pub len: u64,
    /// Not allocated in the backend (`NBD_STATE_HOLE`).
    pub hole: bool,
    /// Reads as zeroes (`NBD_STATE_ZERO`).
    pub zero: bool,
}

impl Extent {
    pub fn data(len: u64) -> Self {
        Extent {
            len,
            hole: false,
            zero: false,
        }
    }
    pub fn hole(len: u64) -> Self {
        Extent {
            len,
            hole: true,
            zero: true,
        }
    }
    pub fn zero(len: u64) -> Self {
        Extent {
            len,
            hole: false,
            zero: true,
        }
    }
    /// The `base:allocation` status flags of this extent.
    pub fn flags(&self) -> u32 {
        (if self.hole { proto::STATE_HOLE } else { 0 })
            | (if self.zero { proto::STATE_ZERO } else { 0 })
    }
}

/// `Err(Invalid)` unless `offset..offset+len` lies within an export of `size` bytes: the
/// range check an [`Export`] makes before it touches its storage.
pub fn check_range(size: u64, offset: u64, len: u64) -> Result<(), ExportError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(ExportError::new(ErrorKind::Invalid, "range beyond the end")),
    }
}

/// A block device the server exports. All methods may be called from many
/// threads at once (several requests in flight, several connections).
///
/// The server has already checked every range against [`Export::size`]
/// before calling; lengths are never zero.
///
/// Durability contract (this is what makes `NBD_FLAG_CAN_MULTI_CONN` true):
/// when [`Export::flush`] returns, every write that returned before the flush
/// was called, on any connection, is persistent; a `write` with `fua = true`
/// is persistent when it returns.
pub trait Export: Send + Sync {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Fill `buf` with the bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError>;
    /// Write `data` at `offset`; with `fua`, persist it before returning.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError>;
    /// Persist every write that completed before this call.
    fn flush(&self) -> Result<(), ExportError>;
    /// Discard a range (contents afterwards are unspecified, zeroes in practice).
    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError>;
    /// Make a range read as zeroes (may deallocate it).
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ExportError>;
    /// Allocation status of `[offset, offset+len)`: consecutive extents from
    /// `offset`, covering at least one byte; may cover less or more than
    /// `len` (the server clips and merges).
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, ExportError>;

    /// Write zeroes without deallocating (`NBD_CMD_FLAG_NO_HOLE`). Defaults
    /// to [`Export::write_zeroes`]: reading zeroes is all the spec promises.
    fn write_zeroes_no_hole(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.write_zeroes(offset, len)
    }
    /// Whether zeroing is cheaper than writing zeroes (metadata only). When
    /// false, `NBD_CMD_FLAG_FAST_ZERO` requests fail fast with `ENOTSUP`.
    fn fast_zero(&self) -> bool {
        true
    }
    /// Reads several ranges, each `(offset, buffer)`; one result per range, in order.
    /// Exports on devices override it to have every range's device reads in flight at once;
    /// the default reads them one after another.
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<Result<(), ExportError>> {
        reads
            .iter_mut()
            .map(|(off, buf)| self.read(*off, buf))
            .collect()
    }
    /// Whether reading `[offset, offset+len)` may wait for a device (a drive read, not memory
    /// only). The server runs such reads on the connection's helper threads, so a slow read
    /// never holds up the requests behind it, and the others inline (the fast path).
    /// Default: false, every read inline.
    fn read_may_block(&self, _offset: u64, _len: u64) -> bool {
        false
    }
    /// Whether writing `len` bytes at `offset` may wait for a device (a write large enough to
    /// fill and write out stripes). The server runs such writes on helper threads, so the
    /// writes of one connection overlap. Default: false, every write inline.
    fn write_may_block(&self, _offset: u64, _len: u64) -> bool {
        false
    }
    /// Whether a write of any size may wait for a device right now (the export's write
    /// buffers are all taken while its devices catch up). Reactors, whose one thread serves
    /// many connections, then run writes on their workers. Default: false.
    fn write_would_block_now(&self) -> bool {
        false
    }
    /// A queue of reads the connection's own thread starts and completes itself (see
    /// [`ReadQueue`]), for exports whose reads wait for devices it can drive asynchronously.
    /// The server asks once per connection and then sends the reads that `read_may_block`
    /// there instead of to helper threads. Default: None (helpers, or inline).
    fn read_queue(&self) -> Option<Box<dyn ReadQueue>> {
        None
    }
    /// Called once per READ request the server answered after its checks passed, whether
    /// it succeeded, with the request's range and when the server began it (before it looked
    /// for holes): however the request reached the export, if at all (a structured reply
    /// answers holes without reading them and reads the data between them apart; a group of
    /// reads goes to `read_many`, queued ones to the read queue). An export that counts
    /// requests counts reads here. Default: nothing.
    fn read_answered(&self, _offset: u64, _len: u64, _started: Instant, _ok: bool) {}
    /// Prefetch hint (`NBD_CMD_CACHE`); default: nothing to do.
    fn cache(&self, _offset: u64, _len: u64) -> Result<(), ExportError> {
        Ok(())
    }
    /// Read-only exports advertise `NBD_FLAG_READ_ONLY`; the server then
    /// refuses writes, trims and zeroes with `EPERM`.
    fn read_only(&self) -> bool {
        false
    }
    /// Advertise `NBD_FLAG_ROTATIONAL`.
    fn rotational(&self) -> bool {
        false
    }
}

/// A finished read's bytes, owned: the server sends them from where they are (no copy into
/// the reply) and drops them once written, on whatever thread wrote them.
pub type ReadData = Box<dyn AsRef<[u8]> + Send>;

/// What [`ReadQueue::take`] hands a finished read to: its token, and its data or error.
pub type ReadDone<'a> = dyn FnMut(u64, Result<ReadData, ExportError>) + 'a;

/// Reads one thread starts and completes itself, many in flight at once, completing in any
/// order: how a connection thread keeps its client's queue depth of reads on the devices
/// without handing them to other threads. Used by one thread at a time: a connection thread
/// has one of its own; a reactor makes one per export its connections read and shares it
/// among them (every call from the reactor's thread), so a queue's tokens are the server's
/// to choose, not one connection's.
pub trait ReadQueue: Send {
    /// Starts reading `len` bytes at `offset` (a range the server checked); the result comes
    /// out of [`ReadQueue::take`] under `token`.
    fn start(&mut self, token: u64, offset: u64, len: usize);
    /// Hands the reads started so far to the devices without waiting.
    fn submit(&mut self);
    /// Collects the reads finished so far, without waiting.
    fn poll(&mut self);
    /// Hands the reads started to the devices (as [`ReadQueue::submit`]) and waits until a
    /// read finishes or `fd` (the connection's socket) is readable or hung up; true when
    /// `fd` may be (a poll can report bytes another read took meanwhile: the caller reads
    /// without blocking). Returns at once, the reads started handed over all the same, when
    /// a finished read waits to be taken.
    fn wait(&mut self, fd: Option<std::os::fd::RawFd>) -> std::io::Result<bool>;
    /// Passes the next finished read (token, data or error) to `f`; false when none.
    fn take(&mut self, f: &mut ReadDone<'_>) -> bool;
    /// Reads started and not yet taken.
    fn outstanding(&self) -> usize;
    /// A descriptor that polls readable while a finished read waits to be collected (an
    /// io_uring's), for a thread that waits on many queues and sockets at once (a reactor's
    /// epoll) instead of in [`ReadQueue::wait`]. None (the default): the reactor calls
    /// [`ReadQueue::poll`] every millisecond while this queue has reads in flight.
    fn ready_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

/// The set of exports a server offers, looked up by name at handshake time.
/// The empty name `""` is the default export.
pub trait ExportSet: Send + Sync {
    /// `(name, description)` of every export, for `NBD_OPT_LIST`.
    fn list(&self) -> Vec<(String, String)>;
    /// The export called `name` (`""` = the default), if any.
    fn get(&self, name: &str) -> Option<Arc<dyn Export>>;
    /// The canonical name of export `name` (for `NBD_INFO_NAME`); by default
    /// the name itself. A set whose default export has a real name should
    /// return it for `""`.
    fn canonical_name(&self, name: &str) -> String {
        name.to_string()
    }
    /// Human-readable description for `NBD_INFO_DESCRIPTION`; by default the
    /// one [`ExportSet::list`] gives for the canonical name.
    fn description(&self, name: &str) -> Option<String> {
        let canonical = self.canonical_name(name);
        self.list()
            .into_iter()
            .find(|(n, _)| *n == canonical)
            .map(|(_, d)| d)
            .filter(|d| !d.is_empty())
    }
}

/// An [`ExportSet`] over a fixed list of exports; the first one added (or
/// the one named by [`StaticExports::set_default`]) answers to `""`.
#[derive(Default, Clone)]
pub struct StaticExports {
    entries: Vec<(String, String, Arc<dyn Export>)>,
    default: Option<String>,
}

impl StaticExports {
    pub fn new() -> Self {
        Self::default()
    }
    /// Add an export with a description.
    pub fn add(
        &mut self,
        name: impl Into<String>,
        description: impl Into<String>,
        export: Arc<dyn Export>,
    ) {
        self.entries.push((name.into(), description.into(), export));
    }
    /// Make export `name` answer to the empty name.
    pub fn set_default(&mut self, name: impl Into<String>) {
        self.default = Some(name.into());
    }
    fn default_name(&self) -> Option<&str> {
        self.default
            .as_deref()
            .or_else(|| self.entries.first().map(|e| e.0.as_str()))
    }
}

impl ExportSet for StaticExports {
    fn list(&self) -> Vec<(String, String)> {
        self.entries
            .iter()
            .map(|(n, d, _)| (n.clone(), d.clone()))
            .collect()
    }
    fn get(&self, name: &str) -> Option<Arc<dyn Export>> {
        let name = self.canonical_name(name);
        self.entries
            .iter()
            .find(|e| e.0 == name)
            .map(|e| Arc::clone(&e.2))
    }
    fn canonical_name(&self, name: &str) -> String {
        if name.is_empty() {
            self.default_name().unwrap_or("").to_string()
        } else {
            name.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        assert_eq!(
            ErrorKind::from_errno(libc::ENOSPC).nbd_errno(),
            proto::ENOSPC
        );
        assert_eq!(
            ErrorKind::from_errno(libc::EDQUOT).nbd_errno(),
            proto::ENOSPC
        );
        assert_eq!(
            ErrorKind::from_errno(libc::EFBIG).nbd_errno(),
            proto::ENOSPC
        );
        assert_eq!(
            ErrorKind::from_errno(libc::EINVAL).nbd_errno(),
            proto::EINVAL
        );
        assert_eq!(ErrorKind::from_errno(libc::EROFS).nbd_errno(), proto::EPERM);
        assert_eq!(
            ErrorKind::from_errno(libc::ENOTSUP).nbd_errno(),
            proto::ENOTSUP
        );
        assert_eq!(ErrorKind::from_errno(9999).nbd_errno(), proto::EIO);
        assert_eq!(ErrorKind::Shutdown.nbd_errno(), proto::ESHUTDOWN);
    }

    #[test]
    fn extent_flags() {
        assert_eq!(
            Extent::hole(1).flags(),
            proto::STATE_HOLE | proto::STATE_ZERO
        );
        assert_eq!(Extent::zero(1).flags(), proto::STATE_ZERO);
        assert_eq!(Extent::data(1).flags(), 0);
    }
}
