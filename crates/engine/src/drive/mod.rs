//! The drive interface: the one small trait every storage backend implements.
//!
//! The engine only ever calls these few operations, so new backends (io_uring, an emulated
//! SSD from the simulator, a network drive) slot in without touching the engine. Offsets and
//! lengths are multiples of [`crate::aligned::ALIGN`] (4 KiB); buffers the engine passes are
//! 4 KiB-aligned when it can, and a backend with stricter needs (O_DIRECT) bounces the rest.

pub mod batch;
mod fault;
mod file;
mod mem;
mod record;

pub use batch::{BatchItem, FdTarget, IoOp};
pub use fault::*;
pub use file::FileDrive;
pub use mem::{CrashFate, MemDrive};
pub use record::{DriveLog, DriveOp, RecordingDrive};

use crate::aligned::ALIGN;
use std::io;
use std::sync::Arc;

/// What a drive says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriveInfo {
    /// Usable size in bytes (a multiple of 4 KiB).
    pub size: u64,
    /// A human identity: a path, or `mem:N` for memory drives.
    pub identity: String,
}

/// A block device as the pool engine sees it.
pub trait Drive: Send + Sync {
    /// Size and identity.
    fn info(&self) -> DriveInfo;
    /// Reads `buf.len()` bytes at `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `buf` at `offset`. It may sit in a volatile cache until [`Drive::flush`].
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Says `len` bytes at `offset` hold nothing the engine will read again (a freed
    /// segment), so a device with its own FTL can drop them instead of copying them in its
    /// garbage collection (TRIM, `BLKDISCARD`, NVMe deallocate). Afterwards the range may read
    /// as anything. The default does nothing: discarding is advice, never needed for
    /// correctness, and the engine ignores its errors.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }
    /// True when the drive is a file whose space comes from a host filesystem that can fill up
    /// under it (a sparse file; a copy-on-write filesystem, or one that must allocate to
    /// convert an unwritten extent, even for an allocated file): a write may then fail with
    /// ENOSPC or EDQUOT though the drive is sound, and the engine keeps it in service and
    /// answers hosts ENOSPC. False (the default) for everything else (a block device, memory,
    /// a simulated SSD): there ENOSPC says the device refused the write (a block device that
    /// shrank under the pool answers it past its new end), an I/O error like any other, and
    /// the member is failed.
    fn space_from_host_filesystem(&self) -> bool {
        false
    }
    /// True when the drive is a file that no longer has a name: deleted (or its last link
    /// replaced) while the pool holds it open. Reads and writes still work through the open
    /// file, so nothing else notices, but the next open cannot find it: the member will be
    /// missing after a restart. False (the default) for everything else.
    fn unlinked(&self) -> bool {
        false
    }
    /// The pool will not use this drive again (its member was retired): let go of what it
    /// holds, so a deleted drive file's space goes back to its filesystem and a device may be
    /// used elsewhere. Operations after it fail or do nothing. The default does nothing.
    fn release(&self) {}
    /// The file descriptor a batch ([`batch::run`]) may drive directly through io_uring, for
    /// drives that are a file or block device and nothing more; None (the default) makes a
    /// batch call the methods above, so wrappers that inject faults or record writes see
    /// every operation.
    fn fd_target(&self) -> Option<FdTarget> {
        None
    }
    /// True when an operation completes at once, without waiting for a device (memory
    /// drives): front-ends then run reads inline instead of handing them to a thread.
    fn completes_inline(&self) -> bool {
        false
    }
    /// What the device did with what it was given, for drives that can tell (a simulated
    /// SSD now; NVMe SMART data units later): the pool's end-to-end write amplification is
    /// media bytes programmed over host bytes. None (the default): unknown.
    fn media_counters(&self) -> Option<MediaCounters> {
        None
    }
    /// How long the drive's own reads and writes took, for drives that time themselves (a
    /// simulated SSD charging NAND timing). None (the default): not measured.
    fn latency(&self) -> Option<DriveLatency> {
        None
    }
}

/// A latency distribution in microseconds (see [`Drive::latency`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

/// A drive's read and write latency, as it measured them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DriveLatency {
    pub read: LatencySummary,
    pub write: LatencySummary,
}

/// A drive's own account of its media (see [`Drive::media_counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MediaCounters {
    /// Bytes the drive was asked to write (whole device pages: a partial page costs one).
    pub written_bytes: u64,
    /// Bytes programmed into the media: host pages plus the device's own GC and wear-leveling
    /// moves.
    pub programmed_bytes: u64,
    /// Bytes the device's GC and wear leveling moved.
    pub moved_bytes: u64,
    /// Blocks erased.
    pub erases: u64,
    /// Bytes the drive was told to discard (whole pages only).
    pub discarded_bytes: u64,
    /// Bytes the drive was asked to read (whole device pages).
    pub read_bytes: u64,
    /// Wear: the fewest and the most erases of any one block (0 when unknown), and the
    /// blocks counted (the mean is `erases / blocks`).
    pub erase_min: u64,
    pub erase_max: u64,
    pub blocks: u64,
}

impl MediaCounters {
    /// The device's write amplification: programmed / written (0 before any write).
    pub fn device_waf(&self) -> f64 {
        if self.written_bytes == 0 {
            0.0
        } else {
            self.programmed_bytes as f64 / self.written_bytes as f64
        }
    }

    /// Adds another drive's counters.
    pub fn add(&mut self, o: &MediaCounters) {
        self.written_bytes += o.written_bytes;
        self.programmed_bytes += o.programmed_bytes;
        self.moved_bytes += o.moved_bytes;
        self.erases += o.erases;
        self.discarded_bytes += o.discarded_bytes;
        self.read_bytes += o.read_bytes;
        self.erase_min = if self.blocks == 0 {
            o.erase_min
        } else {
            self.erase_min.min(o.erase_min)
        };
        self.erase_max = self.erase_max.max(o.erase_max);
        self.blocks += o.blocks;
    }
}

/// A shared drive handle.
pub type DriveRef = Arc<dyn Drive>;

/// Checks the alignment contract of the trait; backends call it first.
pub(crate) fn check_io(offset: u64, len: usize, size: u64) -> io::Result<()> {
    if !offset.is_multiple_of(ALIGN as u64) || !len.is_multiple_of(ALIGN) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unaligned drive I/O at {offset} len {len}"),
        ));
    }
    if offset.checked_add(len as u64).is_none_or(|end| end > size) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("drive I/O at {offset} len {len} past the end ({size} bytes)"),
        ));
    }
    Ok(())
}
