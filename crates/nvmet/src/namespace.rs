//! The storage interface the NVMe/TCP target serves: [`Namespace`] (one NVMe
//! namespace: fixed-size logical blocks of 512 or 4096 bytes) and
//! [`MemNamespace`], a RAM namespace for tests and the example server. The
//! target never depends on a concrete storage engine, only on this trait.

use std::sync::Mutex;

use thiserror::Error;

/// A namespace operation failure; each maps onto one NVMe status.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NsError {
    /// The LBA range lies (partly) past the end of the namespace.
    #[error("LBA range out of bounds")]
    OutOfRange,
    /// The namespace cannot be written.
    #[error("namespace is read-only")]
    ReadOnly,
    /// No space left to store the data (thin pool full).
    #[error("no space left")]
    NoSpace,
    /// The data could not be read back intact or written (an unrecovered media or data
    /// integrity error): Unrecovered Read Error or Write Fault, counted in the SMART log.
    #[error("media error: {0}")]
    Media(String),
    /// The namespace is gone (its volume deleted while the command was in flight): Invalid
    /// Namespace or Format, the status a command sent after the removal gets. Expected, so
    /// not logged per command.
    #[error("namespace removed")]
    Removed,
    /// Any other failure.
    #[error("I/O error: {0}")]
    Io(String),
}

/// One NVMe namespace. Offsets and lengths are in logical blocks of
/// [`Namespace::block_size`] bytes; buffers are whole blocks. Every method may be called
/// from several threads at once (queues, and commands in flight on one queue).
///
/// Durability: when [`Namespace::flush`] returns, every write that returned before it was
/// called is durable; a `write` with `fua` is durable when it returns.
pub trait Namespace: Send + Sync {
    /// Logical block size in bytes: 512 or 4096.
    fn block_size(&self) -> u32;
    /// Capacity in logical blocks.
    fn blocks(&self) -> u64;
    /// A stable 16-byte identifier, reported as the namespace's NGUID and UUID.
    fn uuid(&self) -> [u8; 16];
    /// Read `buf.len() / block_size` blocks starting at `lba`.
    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), NsError>;
    /// Write whole blocks starting at `lba`; `fua`: durable before returning.
    fn write(&self, lba: u64, data: &[u8], fua: bool) -> Result<(), NsError>;
    /// Make every completed write durable.
    fn flush(&self) -> Result<(), NsError>;
    /// Deallocate (trim) `count` blocks; later reads return zeros.
    fn deallocate(&self, lba: u64, count: u64) -> Result<(), NsError>;
    /// Write zeros to `count` blocks.
    fn write_zeroes(&self, lba: u64, count: u64) -> Result<(), NsError>;

    /// Reads several ranges, each `(lba, buffer)`; one result per range, in order. A
    /// namespace on devices overrides it to have every range's device reads in flight at
    /// once; the default reads them one after another.
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<Result<(), NsError>> {
        reads
            .iter_mut()
            .map(|(lba, buf)| self.read(*lba, buf))
            .collect()
    }
    /// Whether reading `count` blocks at `lba` may wait for a device. The target runs such
    /// reads on the queue's worker threads, so a slow read does not hold up the commands
    /// behind it, and the others inline on the queue's own thread (the fast path). Default:
    /// false (memory: every read inline).
    fn read_may_block(&self, _lba: u64, _count: u64) -> bool {
        false
    }
    /// Whether writing `count` blocks at `lba` (without FUA) may wait for a device; such
    /// writes run on worker threads. Default: false.
    fn write_may_block(&self, _lba: u64, _count: u64) -> bool {
        false
    }
    /// Whether [`Namespace::flush`] (and so a FUA write) may wait for a device; such
    /// commands run on worker threads. Default: true.
    fn flush_may_block(&self) -> bool {
        true
    }
    /// Unrecovered media and data integrity errors the storage behind this namespace has
    /// found so far, by any path (host reads, scrubs), for the SMART / Health log. Namespaces
    /// that share one store may all report the store's count: the target takes the largest
    /// value, not the sum. Default: 0 (none known).
    fn media_errors(&self) -> u64 {
        0
    }
    /// A queue of its own for one I/O queue's reads that may wait for a device: the
    /// connection thread starts them, goes on with the commands behind them, and answers
    /// each when it completes, instead of handing them to worker threads. Asked once per
    /// I/O queue and namespace, for the namespace's first read there that may block.
    /// Default: None (reads that may block go to the workers).
    fn read_queue(&self) -> Option<Box<dyn ReadQueue>> {
        None
    }
}

/// A finished queued read's bytes, owned: the response is sent from them (no copy), and they
/// are dropped once written.
pub type ReadData = Box<dyn AsRef<[u8]> + Send>;

/// What [`ReadQueue::take`] hands a finished read to: its token, and its data or error.
pub type ReadDone<'a> = dyn FnMut(u64, Result<ReadData, NsError>) + 'a;

/// Reads of one namespace that one thread starts and completes itself, many in flight at
/// once, completing in any order ([`Namespace::read_queue`]). Used by one thread.
pub trait ReadQueue: Send {
    /// Starts reading `len` bytes (whole blocks) at `lba` (a range the target checked); the
    /// result comes out of [`ReadQueue::take`] under `token`.
    fn start(&mut self, token: u64, lba: u64, len: usize);
    /// Hands the reads started so far to the devices without waiting.
    fn submit(&mut self);
    /// Collects the reads finished so far, without waiting.
    fn poll(&mut self);
    /// Waits until a read finishes or `fd` (the connection's socket) is readable or hung up;
    /// true when `fd` may be (a poll can report bytes the caller read meanwhile: the caller
    /// checks before a read that would block). Returns at once when a finished read waits
    /// to be taken.
    fn wait(&mut self, fd: Option<std::os::fd::RawFd>) -> std::io::Result<bool>;
    /// Passes the next finished read (token, data or error) to `f`; false when none.
    fn take(&mut self, f: &mut ReadDone<'_>) -> bool;
    /// Reads started and not yet taken.
    fn outstanding(&self) -> usize;
    /// A descriptor that polls readable while a finished read waits to be collected (an
    /// io_uring's), for a thread waiting on several queues and its socket at once. None (the
    /// default): such a thread polls this queue every millisecond instead.
    fn ready_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

/// Check that `count` blocks from `lba` lie inside a namespace of `blocks` blocks.
pub fn check_range(blocks: u64, lba: u64, count: u64) -> Result<(), NsError> {
    match lba.checked_add(count) {
        Some(end) if end <= blocks => Ok(()),
        _ => Err(NsError::OutOfRange),
    }
}

/// A sparse in-memory namespace: blocks never written (or deallocated) read as zeros.
pub struct MemNamespace {
    block_size: u32,
    blocks: u64,
    uuid: [u8; 16],
    data: Mutex<std::collections::HashMap<u64, Box<[u8]>>>,
}

impl MemNamespace {
    /// A namespace of `bytes` (rounded down to whole blocks) with blocks of
    /// `block_size` (512 or 4096) bytes and identifier `uuid`.
    pub fn new(bytes: u64, block_size: u32, uuid: [u8; 16]) -> MemNamespace {
        assert!(
            block_size == 512 || block_size == 4096,
            "block size must be 512 or 4096"
        );
        MemNamespace {
            block_size,
            blocks: bytes / block_size as u64,
            uuid,
            data: Mutex::new(Default::default()),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, Box<[u8]>>> {
        // A panic while holding the lock cannot leave a half-written block map
        // inconsistent in a way that matters to a RAM disk: recover the guard.
        self.data.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check_buf(&self, lba: u64, len: usize) -> Result<u64, NsError> {
        let bs = self.block_size as usize;
        if !len.is_multiple_of(bs) {
            return Err(NsError::Io("buffer is not whole blocks".into()));
        }
        let count = (len / bs) as u64;
        check_range(self.blocks, lba, count)?;
        Ok(count)
    }
}

impl Namespace for MemNamespace {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn blocks(&self) -> u64 {
        self.blocks
    }
    fn uuid(&self) -> [u8; 16] {
        self.uuid
    }
    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), NsError> {
        self.check_buf(lba, buf.len())?;
        let bs = self.block_size as usize;
        let map = self.map();
        for (i, chunk) in buf.chunks_mut(bs).enumerate() {
            match map.get(&(lba + i as u64)) {
                Some(b) => chunk.copy_from_slice(b),
                None => chunk.fill(0),
            }
        }
        Ok(())
    }
    fn write(&self, lba: u64, data: &[u8], _fua: bool) -> Result<(), NsError> {
        self.check_buf(lba, data.len())?;
        let bs = self.block_size as usize;
        let mut map = self.map();
        for (i, chunk) in data.chunks(bs).enumerate() {
            map.insert(lba + i as u64, chunk.into());
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), NsError> {
        Ok(())
    }
    fn deallocate(&self, lba: u64, count: u64) -> Result<(), NsError> {
        check_range(self.blocks, lba, count)?;
        let mut map = self.map();
        if count as usize > map.len() {
            map.retain(|k, _| *k < lba || *k >= lba + count);
        } else {
            for b in lba..lba + count {
                map.remove(&b);
            }
        }
        Ok(())
    }
    fn write_zeroes(&self, lba: u64, count: u64) -> Result<(), NsError> {
        self.deallocate(lba, count)
    }
    fn flush_may_block(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_namespace_round_trip() {
        let ns = MemNamespace::new(1 << 20, 4096, [7; 16]);
        assert_eq!(ns.blocks(), 256);
        let data = vec![0xAB; 8192];
        ns.write(10, &data, false).unwrap();
        let mut buf = vec![1; 12288];
        ns.read(9, &mut buf).unwrap();
        assert!(buf[..4096].iter().all(|&b| b == 0));
        assert!(buf[4096..].iter().all(|&b| b == 0xAB));
        ns.deallocate(11, 1).unwrap();
        ns.read(11, &mut buf[..4096]).unwrap();
        assert!(buf[..4096].iter().all(|&b| b == 0));
        assert_eq!(ns.read(256, &mut buf[..4096]), Err(NsError::OutOfRange));
        assert_eq!(ns.write_zeroes(255, 2), Err(NsError::OutOfRange));
        assert_eq!(ns.deallocate(u64::MAX, 2), Err(NsError::OutOfRange));
    }
}
