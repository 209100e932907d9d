//! A drive wrapper that records every write, flush and discard of a set of drives into one ordered log,
//! so a crash-point test can rebuild the drive images as they stood at any point in time.

use super::{Drive, DriveInfo, DriveRef};
use parking_lot::Mutex;
use std::io;
use std::sync::Arc;

/// One recorded drive operation.
#[derive(Clone, Debug)]
pub enum DriveOp {
    /// A write of `data` at `offset` on drive `drive`.
    Write {
        drive: usize,
        offset: u64,
        data: Vec<u8>,
    },
    /// A completed flush of drive `drive`.
    Flush { drive: usize },
    /// A discard of `len` bytes at `offset` on drive `drive` (an image rebuilt from the log
    /// zeroes them: the harshest thing a discard may do).
    Discard { drive: usize, offset: u64, len: u64 },
}

/// The shared, ordered log of every recorded drive's operations.
#[derive(Default)]
pub struct DriveLog {
    ops: Mutex<Vec<DriveOp>>,
}

impl DriveLog {
    /// A new empty log.
    pub fn new() -> Arc<Self> {
        Arc::new(DriveLog::default())
    }

    /// Number of operations recorded so far.
    pub fn len(&self) -> usize {
        self.ops.lock().len()
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of the operations recorded so far.
    pub fn ops(&self) -> Vec<DriveOp> {
        self.ops.lock().clone()
    }
}

/// Records the writes and flushes of `inner` into a shared [`DriveLog`].
pub struct RecordingDrive {
    inner: DriveRef,
    index: usize,
    log: Arc<DriveLog>,
}

impl RecordingDrive {
    /// Wraps `inner`, tagging its operations with `index`.
    pub fn new(inner: DriveRef, index: usize, log: Arc<DriveLog>) -> Arc<Self> {
        Arc::new(RecordingDrive { inner, index, log })
    }
}

impl Drive for RecordingDrive {
    fn info(&self) -> DriveInfo {
        self.inner.info()
    }

    fn space_from_host_filesystem(&self) -> bool {
        self.inner.space_from_host_filesystem()
    }

    fn unlinked(&self) -> bool {
        self.inner.unlinked()
    }

    fn release(&self) {
        self.inner.release()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        // Log under the lock, after the write, so the log order is a valid completion order.
        let mut ops = self.log.ops.lock();
        self.inner.write_at(offset, buf)?;
        ops.push(DriveOp::Write {
            drive: self.index,
            offset,
            data: buf.to_vec(),
        });
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut ops = self.log.ops.lock();
        self.inner.discard(offset, len)?;
        ops.push(DriveOp::Discard {
            drive: self.index,
            offset,
            len,
        });
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.inner.flush()?;
        self.log
            .ops
            .lock()
            .push(DriveOp::Flush { drive: self.index });
        Ok(())
    }
}
