//! Shared helpers of the engine's integration tests: small pools on memory or file drives.
#![allow(dead_code)]

use flashpool_engine::drive::{
    CrashFate, Drive, DriveInfo, DriveOp, DriveRef, FileDrive, MemDrive,
};
use flashpool_engine::PoolConfig;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

pub const DRIVE_SIZE: u64 = 24 << 20;

/// The drive images a power cut after the first `cut` operations of `log` would leave, from
/// `base` (copied, not changed): a discard reads as zeros from then on (the harshest), and
/// with `torn_sectors` the write at `cut` reached only its first that many 512-byte sectors
/// (the rest keep their old contents).
pub fn image_at(
    base: &[Arc<MemDrive>],
    log: &[DriveOp],
    cut: usize,
    torn_sectors: Option<usize>,
) -> Vec<DriveRef> {
    as_refs(&crash_drives(base, log, cut, torn_sectors))
}

/// `image_at`'s drives, as memory drives (to cut again from).
pub fn crash_drives(
    base: &[Arc<MemDrive>],
    log: &[DriveOp],
    cut: usize,
    torn_sectors: Option<usize>,
) -> Vec<Arc<MemDrive>> {
    // Whatever `base` holds is the starting point, flushed or not.
    let drives: Vec<Arc<MemDrive>> = base
        .iter()
        .map(|d| Arc::new(d.crash(|_, _| CrashFate::Persisted)))
        .collect();
    for op in &log[..cut] {
        match op {
            DriveOp::Write {
                drive,
                offset,
                data,
            } => drives[*drive].write_at(*offset, data).unwrap(),
            DriveOp::Discard { drive, offset, len } => {
                drives[*drive].discard(*offset, *len).unwrap()
            }
            DriveOp::Flush { .. } => {}
        }
    }
    if let (
        Some(n),
        Some(DriveOp::Write {
            drive,
            offset,
            data,
        }),
    ) = (torn_sectors, log.get(cut))
    {
        let keep = (n * 512).min(data.len());
        let mut cur = vec![0u8; data.len()];
        drives[*drive].read_at(*offset, &mut cur).unwrap();
        cur[..keep].copy_from_slice(&data[..keep]);
        drives[*drive].write_at(*offset, &cur).unwrap();
    }
    drives
}

/// A small geometry that exercises segment rollover quickly.
pub fn small_config(k: usize, m: usize) -> PoolConfig {
    PoolConfig {
        k,
        m,
        chunk_size: 16 << 10,
        segment_size: 1 << 20,
        checkpoint_interval: 4 << 20,
    }
}

pub fn mem_drives(n: usize, tracked: bool) -> Vec<Arc<MemDrive>> {
    (0..n)
        .map(|i| {
            Arc::new(if tracked {
                MemDrive::tracked(DRIVE_SIZE, format!("mem:{i}"))
            } else {
                MemDrive::new(DRIVE_SIZE, format!("mem:{i}"))
            })
        })
        .collect()
}

pub fn as_refs<T: flashpool_engine::drive::Drive + 'static>(v: &[Arc<T>]) -> Vec<DriveRef> {
    v.iter().map(|d| d.clone() as DriveRef).collect()
}

pub fn file_drives(dir: &std::path::Path, n: usize) -> Vec<DriveRef> {
    (0..n)
        .map(|i| {
            Arc::new(FileDrive::create(&dir.join(format!("d{i}.img")), DRIVE_SIZE).unwrap())
                as DriveRef
        })
        .collect()
}

pub fn reopen_files(dir: &std::path::Path, n: usize) -> Vec<DriveRef> {
    (0..n)
        .map(|i| Arc::new(FileDrive::open(&dir.join(format!("d{i}.img"))).unwrap()) as DriveRef)
        .collect()
}

/// The seed of a randomized test: `FLASHPOOL_SEED` when set, else `default`. Printed with
/// `what`, so a failing run names the seed that reproduces it.
pub fn test_seed(what: &str, default: u64) -> u64 {
    let seed = std::env::var("FLASHPOOL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    eprintln!("{what}: seed {seed} (FLASHPOOL_SEED={seed} reproduces)");
    seed
}

/// A 4 KiB block whose every 8 bytes name the write that made it.
pub fn block_for(stamp: u64) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    for (i, c) in b.chunks_mut(8).enumerate() {
        c.copy_from_slice(&(stamp ^ ((i as u64) << 48)).to_le_bytes());
    }
    b
}

/// Bytes that do not compress (so every block is stored raw and aligned), from `seed`.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A gate that drive operations wait at while it is closed (a test drive calls `pass` in the
/// operation it holds back).
#[derive(Default)]
pub struct Gate {
    closed: Mutex<bool>,
    cv: Condvar,
    /// Operations waiting at the gate now.
    pub waiting: AtomicUsize,
}

impl Gate {
    pub fn set(&self, closed: bool) {
        *self.closed.lock().unwrap() = closed;
        self.cv.notify_all();
    }

    pub fn pass(&self) {
        let mut closed = self.closed.lock().unwrap();
        self.waiting.fetch_add(1, Ordering::SeqCst);
        while *closed {
            closed = self.cv.wait(closed).unwrap();
        }
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A memory drive whose writes and/or flushes pass a gate first (the operation waits while
/// the gate is closed), and whose writes fail while `fail` is set.
pub struct GatedDrive {
    pub inner: Arc<MemDrive>,
    writes: Option<Arc<Gate>>,
    flushes: Option<Arc<Gate>>,
    pub fail: AtomicBool,
}

impl GatedDrive {
    /// `inner` with its writes held at `writes` and its flushes at `flushes` (either may be
    /// None: not gated).
    pub fn new(
        inner: Arc<MemDrive>,
        writes: Option<Arc<Gate>>,
        flushes: Option<Arc<Gate>>,
    ) -> Arc<Self> {
        Arc::new(GatedDrive {
            inner,
            writes,
            flushes,
            fail: AtomicBool::new(false),
        })
    }
}

impl Drive for GatedDrive {
    fn info(&self) -> DriveInfo {
        self.inner.info()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if let Some(g) = &self.writes {
            g.pass();
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> io::Result<()> {
        if let Some(g) = &self.flushes {
            g.pass();
        }
        self.inner.flush()
    }
}
