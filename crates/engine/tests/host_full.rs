//! A full filesystem under the drive files is not a drive failure: a drive whose writes fail
//! with ENOSPC (or EDQUOT) stays in service, its missing chunks are rebuilt on read and queued
//! for repair; when the stripes cannot be written at all, hosts get ENOSPC, and no member is
//! failed (the product bug: three sparse drive files hit ENOSPC together and the pool marked
//! them failed and turned read-only). ENOSPC from a drive that is not a file on a host
//! filesystem (a block device that shrank under the pool) is an I/O error: that member is
//! failed like on any write error.

mod common;

use common::*;
use flashpool_engine::drive::{Drive, DriveInfo, DriveRef, MemDrive};
use flashpool_engine::{Error, Pool};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A drive whose writes fail with ENOSPC while `full` is set (a sparse file on a full
/// filesystem); reads keep working.
struct FullFs {
    inner: Arc<MemDrive>,
    full: Arc<AtomicBool>,
}

impl Drive for FullFs {
    fn info(&self) -> DriveInfo {
        self.inner.info()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if self.full.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn space_from_host_filesystem(&self) -> bool {
        true
    }
}

/// A block device that shrank under the pool (a loop device whose backing file was cut and
/// `losetup -c`): writes past its new end fail with ENOSPC, reads there come back short.
/// Unlike `FullFs` it is not a file on a host filesystem.
struct Shrunk {
    inner: Arc<MemDrive>,
    /// Bytes still there; u64::MAX: not shrunk yet.
    end: Arc<AtomicU64>,
}

impl Drive for Shrunk {
    fn info(&self) -> DriveInfo {
        self.inner.info()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if offset + buf.len() as u64 > self.end.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "failed to fill whole buffer",
            ));
        }
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if offset + buf.len() as u64 > self.end.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Five members, member 2 a `Shrunk` block device (not shrunk yet); a volume "v" of 8 MiB.
fn pool_with_a_block_device() -> (Pool, Vec<Arc<MemDrive>>, Arc<AtomicU64>) {
    let mems = mem_drives(5, false);
    let end = Arc::new(AtomicU64::new(u64::MAX));
    let drives: Vec<DriveRef> = mems
        .iter()
        .enumerate()
        .map(|(i, m)| {
            if i == 2 {
                Arc::new(Shrunk {
                    inner: m.clone(),
                    end: end.clone(),
                }) as DriveRef
            } else {
                m.clone() as DriveRef
            }
        })
        .collect();
    let pool = Pool::create(drives, &small_config(4, 1)).unwrap();
    pool.create_volume_with("v", 8 << 20, flashpool_engine::Compression::Off)
        .unwrap();
    (pool, mems, end)
}

/// ENOSPC from a block device is the device refusing the write, not a full host filesystem:
/// the member is failed like on any write error, so the pool says it is degraded and a second
/// failure is refused instead of taking every stripe it shares with the first (the product
/// bug: a shrunk loop-device member stayed active, every write to it failed, status said
/// "tolerates 1 more failure", and after `drive fail 0` thousands of blocks read EIO).
#[test]
fn enospc_from_a_block_device_fails_the_member() {
    let (pool, _mems, end) = pool_with_a_block_device();
    let vol = pool.volume("v").unwrap();
    for lba in 0..300u64 {
        vol.write(lba * 4096, &block_for(lba)).unwrap();
    }
    pool.flush().unwrap();
    // Cut to 2 MiB: its superblocks and first segments stay, later segments are past the end.
    end.store(2 << 20, Ordering::SeqCst);
    for lba in 300..2000u64 {
        vol.write(lba * 4096, &block_for(lba)).unwrap();
    }
    pool.flush().unwrap();
    let states: Vec<_> = pool.drives().iter().map(|d| d.state).collect();
    assert_eq!(states[2], "failed", "{:?}", pool.drives());
    assert!(
        pool.drive_failures()[2]
            .as_ref()
            .is_some_and(|f| f.reason.contains("did it shrink")),
        "{:?}",
        pool.drive_failures()
    );
    // One member down with m = 1: failing another is refused, and every block reads.
    assert!(pool.fail_drive(0).is_err(), "a second failure was accepted");
    let mut b = vec![0u8; 4096];
    for lba in 0..2000u64 {
        vol.read(lba * 4096, &mut b).unwrap();
        assert!(b == block_for(lba), "block {lba}");
    }
    // What was written while the member went out is rebuilt with the others' parity: the
    // rebuild moves everything off it, and then a further loss is survived.
    pool.rebuild().unwrap();
    pool.fail_drive(0).unwrap();
    for lba in 0..2000u64 {
        vol.read(lba * 4096, &mut b).unwrap();
        assert!(
            b == block_for(lba),
            "block {lba} after the rebuild and member 0 lost"
        );
    }
}

#[test]
fn enospc_from_drives_is_not_a_drive_failure() {
    let mems = mem_drives(5, false);
    let flags: Vec<Arc<AtomicBool>> = (0..5).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let drives: Vec<DriveRef> = mems
        .iter()
        .zip(&flags)
        .map(|(m, f)| {
            Arc::new(FullFs {
                inner: m.clone(),
                full: f.clone(),
            }) as DriveRef
        })
        .collect();
    let pool = Pool::create(drives, &small_config(4, 1)).unwrap();
    pool.create_volume_with("v", 8 << 20, flashpool_engine::Compression::Off)
        .unwrap();
    let vol = pool.volume("v").unwrap();
    // One drive's filesystem is full: writes go on, the drive stays in service.
    flags[2].store(true, Ordering::SeqCst);
    for lba in 0..600u64 {
        vol.write(lba * 4096, &block_for(lba)).unwrap();
    }
    pool.flush().unwrap();
    assert!(
        pool.drives().iter().all(|d| d.state == "active"),
        "{:?}",
        pool.drives()
    );
    let mut b = vec![0u8; 4096];
    for lba in 0..600u64 {
        vol.read(lba * 4096, &mut b).unwrap();
        assert!(b == block_for(lba), "block {lba}");
    }
    assert!(
        pool.repairs_pending() > 0,
        "stripes missing a chunk are not queued for repair"
    );
    // Space comes back: the repair rewrites them.
    flags[2].store(false, Ordering::SeqCst);
    assert!(pool.repair_pending().unwrap() > 0);
    let r = pool.scrub(false, None).unwrap();
    assert_eq!(r.bad_chunks, 0, "{r:?}");
    // Every filesystem full: hosts get ENOSPC, still no member failed.
    for f in &flags {
        f.store(true, Ordering::SeqCst);
    }
    let mut saw = None;
    for lba in 600..2000u64 {
        if let Err(e) = vol
            .write(lba * 4096, &block_for(lba))
            .and_then(|_| pool.flush())
        {
            saw = Some(e);
            break;
        }
    }
    assert!(matches!(saw, Some(Error::NoSpace)), "{saw:?}");
    // The pool is not read-only for it: front-ends keep the export writable (a read-only one
    // answers EPERM, which is not what happened), and the next write says ENOSPC again.
    assert!(
        vol.writable(),
        "a full host filesystem made the volume read-only"
    );
    let again = vol
        .write(0, &block_for(0))
        .and_then(|_| pool.flush())
        .unwrap_err();
    assert!(matches!(again, Error::NoSpace), "{again:?}");
    assert!(
        pool.drives().iter().all(|d| d.state == "active"),
        "{:?}",
        pool.drives()
    );
    for lba in 0..600u64 {
        vol.read(lba * 4096, &mut b).unwrap();
        assert!(
            b == block_for(lba),
            "block {lba} after the filesystems filled"
        );
    }
}

/// A member failed because its device shrank is not put back by the server's probe for
/// drives whose fault passed (a write and read-back in the reserved area at the front, which
/// the shrunk device still has): it would fail again at its next write past the new end, and
/// each return moves the segments written while it was out.
#[test]
fn a_shrunk_member_is_not_readmitted_by_the_probe() {
    let (pool, _mems, end) = pool_with_a_block_device();
    let vol = pool.volume("v").unwrap();
    end.store(2 << 20, Ordering::SeqCst);
    for lba in 0..2000u64 {
        vol.write(lba * 4096, &block_for(lba)).unwrap();
    }
    pool.flush().unwrap();
    assert_eq!(pool.drives()[2].state, "failed", "{:?}", pool.drives());
    assert_eq!(pool.readmit_healthy_drives(), Vec::<usize>::new());
    assert_eq!(pool.drives()[2].state, "failed", "{:?}", pool.drives());
    // Grown back (the backing file restored): the probe passes and the member returns.
    end.store(u64::MAX, Ordering::SeqCst);
    assert_eq!(pool.readmit_healthy_drives(), vec![2]);
    let mut b = vec![0u8; 4096];
    for lba in 0..2000u64 {
        vol.read(lba * 4096, &mut b).unwrap();
        assert!(b == block_for(lba), "block {lba}");
    }
}

/// A member in service whose chunks could not be written (its host filesystem full) holds
/// stripes one chunk short: until they are repaired the pool survives one failure fewer, and
/// says so (it said "tolerates 1 more failure" while those stripes had no parity left).
#[test]
fn chunks_a_full_filesystem_refused_count_against_protection() {
    let mems = mem_drives(5, false);
    let flags: Vec<Arc<AtomicBool>> = (0..5).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let drives: Vec<DriveRef> = mems
        .iter()
        .zip(&flags)
        .map(|(m, f)| {
            Arc::new(FullFs {
                inner: m.clone(),
                full: f.clone(),
            }) as DriveRef
        })
        .collect();
    // No checkpoint while the filesystem is full (this drive refuses every write, where a
    // real sparse file still takes overwrites of its superblock slots).
    let cfg = flashpool_engine::PoolConfig {
        checkpoint_interval: 1 << 30,
        ..small_config(4, 1)
    };
    let pool = Pool::create(drives, &cfg).unwrap();
    pool.create_volume_with("v", 8 << 20, flashpool_engine::Compression::Off)
        .unwrap();
    let vol = pool.volume("v").unwrap();
    for lba in 0..300u64 {
        vol.write(lba * 4096, &block_for(lba)).unwrap();
    }
    pool.flush().unwrap();
    assert_eq!(pool.info().failures_tolerated, 1);
    flags[2].store(true, Ordering::SeqCst);
    for lba in 300..900u64 {
        vol.write(lba * 4096, &block_for(lba)).unwrap();
    }
    pool.flush().unwrap();
    let info = pool.info();
    assert_eq!(info.members_down, 0, "{info:?}");
    assert_eq!(info.failures_tolerated, 0, "{info:?}");
    // Space back: the repair moves the short stripes' data into whole ones.
    flags[2].store(false, Ordering::SeqCst);
    assert!(pool.repair_pending().unwrap() > 0);
    let info = pool.info();
    assert_eq!(info.failures_tolerated, 1, "after the repair: {info:?}");
    // And it is true: any one member lost, every block reads.
    for lost in 0..5 {
        pool.fail_drive(lost).unwrap();
        let mut b = vec![0u8; 4096];
        for lba in 0..900u64 {
            vol.read(lba * 4096, &mut b).unwrap();
            assert!(b == block_for(lba), "block {lba} with member {lost} lost");
        }
        pool.readmit_drive(lost).unwrap();
    }
}
