//! A full filesystem under the drive files is not a drive failure: a drive whose writes fail
//! with ENOSPC (or EDQUOT) stays in service, its missing chunks are rebuilt on read and queued
//! for repair; when the stripes cannot be written at all, hosts get ENOSPC, and no member is
//! failed (the product bug: three sparse drive files hit ENOSPC together and the pool marked
//! them failed and turned read-only).

mod common;

use common::*;
use flashpool_engine::drive::{Drive, DriveInfo, DriveRef, MemDrive};
use flashpool_engine::{Error, Pool};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
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
