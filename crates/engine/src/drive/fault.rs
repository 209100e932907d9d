//! A drive wrapper whose failures a test switches on and off: I/O errors, silent corruption.

use super::{Drive, DriveInfo, DriveRef};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The switches of a [`FaultDrive`], shared with the test that flips them.
#[derive(Default, Debug)]
pub struct FaultSwitch {
    /// Every read fails with EIO.
    pub fail_reads: AtomicBool,
    /// Every write and flush fails with EIO.
    pub fail_writes: AtomicBool,
    /// Reads succeed but return data with one bit flipped per 4 KiB block.
    pub corrupt_reads: AtomicBool,
}

impl FaultSwitch {
    /// Turns every kind of I/O failure on or off at once (a vanished drive).
    pub fn set_dead(&self, dead: bool) {
        self.fail_reads.store(dead, Ordering::SeqCst);
        self.fail_writes.store(dead, Ordering::SeqCst);
    }
}

/// Wraps a drive and injects the faults its [`FaultSwitch`] asks for.
pub struct FaultDrive {
    inner: DriveRef,
    switch: Arc<FaultSwitch>,
}

impl FaultDrive {
    /// Wraps `inner`; returns the drive and its switches.
    pub fn new(inner: DriveRef) -> (Arc<Self>, Arc<FaultSwitch>) {
        let switch = Arc::new(FaultSwitch::default());
        (
            Arc::new(FaultDrive {
                inner,
                switch: switch.clone(),
            }),
            switch,
        )
    }
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

impl Drive for FaultDrive {
    fn info(&self) -> DriveInfo {
        self.inner.info()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.switch.fail_reads.load(Ordering::Relaxed) {
            return Err(eio());
        }
        self.inner.read_at(offset, buf)?;
        if self.switch.corrupt_reads.load(Ordering::Relaxed) {
            for block in buf.chunks_mut(4096) {
                block[block.len() / 2] ^= 0x10;
            }
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if self.switch.fail_writes.load(Ordering::Relaxed) {
            return Err(eio());
        }
        self.inner.write_at(offset, buf)
    }

    fn flush(&self) -> io::Result<()> {
        if self.switch.fail_writes.load(Ordering::Relaxed) {
            return Err(eio());
        }
        self.inner.flush()
    }
}
