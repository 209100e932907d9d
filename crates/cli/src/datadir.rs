//! The data dir: where `flashpool serve` keeps its pool.
//!
//! Layout: `DIR/drives/drive-N.img` (one sparse file per drive) and `DIR/flashpool.lock`, held
//! with an exclusive flock by the one process using the pool, so a second server or a volume
//! command run beside a server is refused instead of corrupting the pool.

use anyhow::{bail, Context, Result};
use flashpool_engine::drive::{DriveRef, FileDrive, MemDrive};
use flashpool_engine::{Pool, PoolConfig};
use std::fs::{self, File};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The shape of a pool created on first use.
#[derive(Clone, Debug)]
pub struct PoolShape {
    pub drives: usize,
    pub k: usize,
    pub m: usize,
    pub drive_size: u64,
    /// Memory drives (for benchmarks): nothing is kept after exit.
    pub memory: bool,
}

impl Default for PoolShape {
    fn default() -> Self {
        PoolShape {
            drives: 5,
            k: 4,
            m: 1,
            drive_size: 1 << 30,
            memory: false,
        }
    }
}

/// An open pool and the lock that keeps other processes out of its data dir.
pub struct DataDir {
    pub pool: Pool,
    pub dir: PathBuf,
    pub created: bool,
    _lock: Option<File>,
}

fn drive_path(dir: &Path, i: usize) -> PathBuf {
    dir.join("drives").join(format!("drive-{i}.img"))
}

fn lock(dir: &Path) -> Result<File> {
    let path = dir.join("flashpool.lock");
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on a valid, owned file descriptor.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        bail!(
            "{} is in use by another flashpool process (a running server?)",
            dir.display()
        );
    }
    Ok(f)
}

fn free_bytes(dir: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct we own; the path is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Pool settings for drives of `drive_size` bytes: segments small enough that a small pool
/// still has a few dozen of them.
pub fn pool_config(k: usize, m: usize, drive_size: u64) -> PoolConfig {
    let mut segment_size: u64 = 32 << 20;
    while segment_size > (1 << 20) && drive_size / segment_size < 32 {
        segment_size /= 2;
    }
    let chunk_size = if segment_size >= (8 << 20) {
        128 << 10
    } else {
        32 << 10
    };
    PoolConfig {
        k,
        m,
        chunk_size,
        segment_size,
        ..PoolConfig::default()
    }
}

/// Opens the pool in `dir`, creating it (and a `default` volume of `default_volume` bytes)
/// when the dir holds none.
pub fn open_or_create(dir: &Path, shape: &PoolShape, default_volume: u64) -> Result<DataDir> {
    if shape.memory {
        let mems: Vec<Arc<MemDrive>> = (0..shape.drives)
            .map(|i| Arc::new(MemDrive::new(shape.drive_size, format!("mem:{i}"))))
            .collect();
        // Touch every page now (one thread per drive): page faults would otherwise land on
        // the write path.
        std::thread::scope(|s| {
            for d in &mems {
                s.spawn(|| d.prefault());
            }
        });
        let drives: Vec<DriveRef> = mems.into_iter().map(|d| d as DriveRef).collect();
        let pool = Pool::create(drives, &pool_config(shape.k, shape.m, shape.drive_size))?;
        pool.create_volume("default", default_volume)?;
        return Ok(DataDir {
            pool,
            dir: dir.to_owned(),
            created: true,
            _lock: None,
        });
    }
    fs::create_dir_all(dir.join("drives"))
        .with_context(|| format!("creating {}", dir.display()))?;
    let lock = lock(dir)?;
    let existing = (0..).take_while(|&i| drive_path(dir, i).exists()).count();
    if existing > 0 {
        let drives = (0..existing)
            .map(|i| {
                let p = drive_path(dir, i);
                FileDrive::open(&p)
                    .map(|d| Arc::new(d) as DriveRef)
                    .with_context(|| format!("opening {}", p.display()))
            })
            .collect::<Result<Vec<_>>>()?;
        let pool =
            Pool::open(drives).with_context(|| format!("opening the pool in {}", dir.display()))?;
        return Ok(DataDir {
            pool,
            dir: dir.to_owned(),
            created: false,
            _lock: Some(lock),
        });
    }
    if shape.k + shape.m > shape.drives {
        bail!(
            "protection {}+{} needs at least {} drives, --drives is {}",
            shape.k,
            shape.m,
            shape.k + shape.m,
            shape.drives
        );
    }
    let total = shape.drive_size.saturating_mul(shape.drives as u64);
    if let Some(free) = free_bytes(dir) {
        if free < total {
            bail!(
                "{} has {} MiB free, the pool's drives would take up to {} MiB: use a smaller --drive-size",
                dir.display(),
                free >> 20,
                total >> 20
            );
        }
    }
    // Any failure from here on removes the drive files again, so a refused creation leaves
    // the data dir as it found it.
    let created = || -> Result<Pool> {
        let drives = (0..shape.drives)
            .map(|i| {
                let p = drive_path(dir, i);
                FileDrive::create(&p, shape.drive_size)
                    .map(|d| Arc::new(d) as DriveRef)
                    .with_context(|| format!("creating {}", p.display()))
            })
            .collect::<Result<Vec<_>>>()?;
        let pool = Pool::create(drives, &pool_config(shape.k, shape.m, shape.drive_size))?;
        pool.create_volume("default", default_volume)?;
        Ok(pool)
    };
    let pool = match created() {
        Ok(p) => p,
        Err(e) => {
            for i in 0..shape.drives {
                let _ = fs::remove_file(drive_path(dir, i));
            }
            return Err(e);
        }
    };
    Ok(DataDir {
        pool,
        dir: dir.to_owned(),
        created: true,
        _lock: Some(lock),
    })
}

/// Opens an existing pool (for volume commands); fails if there is none.
pub fn open_existing(dir: &Path) -> Result<DataDir> {
    if !drive_path(dir, 0).exists() {
        bail!(
            "{} holds no pool (run `flashpool serve --data {}` to create one)",
            dir.display(),
            dir.display()
        );
    }
    open_or_create(dir, &PoolShape::default(), 0)
}

/// Adds a file drive to the pool in `dir` (next `drive-N.img`, the size of the others) and
/// returns the reopened pool.
pub fn add_drive(dir: &Path) -> Result<DataDir> {
    if !drive_path(dir, 0).exists() {
        bail!("{} holds no pool", dir.display());
    }
    let lock = lock(dir)?;
    let existing = (0..).take_while(|&i| drive_path(dir, i).exists()).count();
    let drives = (0..existing)
        .map(|i| {
            let p = drive_path(dir, i);
            FileDrive::open(&p)
                .map(|d| Arc::new(d) as DriveRef)
                .with_context(|| format!("opening {}", p.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let size = fs::metadata(drive_path(dir, 0))?.len();
    let path = drive_path(dir, existing);
    let new = Arc::new(
        FileDrive::create(&path, size).with_context(|| format!("creating {}", path.display()))?,
    ) as DriveRef;
    match Pool::add_drive(drives, new) {
        Ok(pool) => Ok(DataDir {
            pool,
            dir: dir.to_owned(),
            created: false,
            _lock: Some(lock),
        }),
        Err(e) => {
            let _ = fs::remove_file(&path);
            Err(e.into())
        }
    }
}

/// Adds a file drive (next `drive-N.img`, the size of drive 0) to a running pool.
pub fn add_drive_online(dir: &Path, pool: &Pool) -> Result<PathBuf> {
    let existing = (0..).take_while(|&i| drive_path(dir, i).exists()).count();
    let size = fs::metadata(drive_path(dir, 0))?.len();
    let path = drive_path(dir, existing);
    let new = Arc::new(
        FileDrive::create(&path, size).with_context(|| format!("creating {}", path.display()))?,
    ) as DriveRef;
    if let Err(e) = pool.add_drive_online(new) {
        let _ = fs::remove_file(&path);
        return Err(e.into());
    }
    Ok(path)
}
