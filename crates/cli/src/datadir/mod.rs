//! The data dir: where `flashpool serve` keeps its pool, and how a pool's members are found.
//!
//! Layout: `DIR/flashpool.lock` (held with an exclusive flock by the one process using the
//! pool, so a second server or a volume command run beside a server is refused instead of
//! corrupting the pool), `DIR/members.json` (the member record: where each member was last
//! seen, record.rs) and, for the embedded default, `DIR/drives/drive-N.img` (one file per
//! drive). Members may also be block devices or files anywhere, given with `--drive`.
//!
//! Opening never trusts names or order: every candidate (candidates.rs) is handed to the
//! engine's assembly, which takes members by the UUIDs in their superblocks, and the record
//! only names what is missing. A data dir that holds a record or any drive file is opened or
//! refused, never created over: a pool is created only in an empty data dir or over `--drive`s
//! that hold nothing recognisable (signature.rs) unless `--force`.

mod candidates;
mod creating;
pub mod record;
mod remove;
pub mod signature;

pub use remove::remove_drive;

use anyhow::{anyhow, bail, Context, Result};
use candidates::{dir_has_files, Candidates};
use creating::Creating;
use flashpool_engine::drive::{DriveRef, FileDrive, MemDrive};
use flashpool_engine::{Assembly, DriveStatus, OpenOptions, Pool, PoolConfig};
use record::{recorded, resolve, MemberEntry, MemberRecord};
use std::fs::{self, File};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A request refused because of the pool's state (a drive that is a member, a remove that
/// would leave the data without room or redundancy): the admin doors answer it as a conflict
/// (HTTP 409), not as a server failure.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// A test hook: with `FLASHPOOL_CRASH_AT=POINT` in the environment, this process kills
/// itself (SIGKILL, as `kill -9` would) when it reaches `point`, so end-to-end tests can crash
/// pool creation and member changes at a chosen moment. Points: `create-drives` (every new
/// drive made, no superblock written), `create-record` (the pool made, not yet recorded),
/// `member-record` (`drive add` / `drive replace` done in the pool, the new member not yet in
/// the member record).
pub(crate) fn crash_point(point: &str) {
    if std::env::var_os("FLASHPOOL_CRASH_AT").is_some_and(|v| v == point) {
        eprintln!("FLASHPOOL_CRASH_AT={point}: killing this process");
        // SAFETY: signalling this process.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

/// Refuses with `msg`.
pub fn refuse<T>(msg: String) -> Result<T> {
    Err(Refused(msg).into())
}

/// A drive path the request named that cannot be used (not a file or block device, cannot
/// be created there, no room for it): the request's fault, answered as a bad request (HTTP
/// 400), not as a server failure.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unusable(pub String);

/// `prepare_drive` for a drive a request named: its errors are [`Unusable`] unless refused.
fn prepare_named_drive(p: &Path, size: u64, force: bool) -> Result<NewDrive> {
    prepare_drive(p, size, false, force).map_err(|e| {
        if e.is::<Refused>() {
            e
        } else {
            Unusable(format!("{e:#}")).into()
        }
    })
}

/// The shape of a pool created on first use.
#[derive(Clone, Debug)]
pub struct PoolShape {
    pub drives: usize,
    pub k: usize,
    pub m: usize,
    /// The size the user named: a new pool's drive files are that size or the pool is
    /// refused. None: `DEFAULT_DRIVE_SIZE`, or as large as fits where the filesystem lacks
    /// room for that (`fitting_drive_size`).
    pub drive_size: Option<u64>,
    /// Memory drives (for benchmarks): nothing is kept after exit.
    pub memory: bool,
    /// Leave new drive files sparse instead of allocating them.
    pub sparse: bool,
    /// With `memory`: simulated SSDs of this device (scaled to `drive_size`).
    pub sim: Option<flashpool_sim::SimConfig>,
    /// With `sim`: the drives charge NAND timing in real time (else they are untimed).
    pub sim_real_time: bool,
}

impl Default for PoolShape {
    fn default() -> Self {
        PoolShape {
            drives: 5,
            k: 4,
            m: 1,
            drive_size: None,
            memory: false,
            sparse: false,
            sim: None,
            sim_real_time: false,
        }
    }
}

/// What to open, and what to do when there is nothing to open.
#[derive(Clone, Debug, Default)]
pub struct OpenRequest {
    /// The shape of a new pool.
    pub shape: PoolShape,
    /// Size of the `default` volume of a new pool.
    pub default_volume: u64,
    /// Devices or files given on the command line: a new pool's drives, or more places to
    /// look for the members of an existing one.
    pub drives: Vec<PathBuf>,
    /// Paths or globs to search for members that moved (kept in the record).
    pub search: Vec<String>,
    /// Create over drives that hold a filesystem, a partition table or another pool.
    pub force: bool,
    /// Create a pool when the data dir holds none.
    pub create: bool,
    /// Open without writing anything to the drives or the data dir.
    pub read_only: bool,
    /// When opening needs room to write (recovery ends with a checkpoint) and there is none
    /// (the filesystem under sparse drive files is full, or the pool is), open read-only
    /// instead of not at all, so what was flushed can still be read (`serve`).
    pub read_only_if_full: bool,
}

/// An open pool and the lock that keeps other processes out of its data dir.
pub struct DataDir {
    pub pool: Pool,
    pub dir: PathBuf,
    pub created: bool,
    _lock: Option<File>,
}

/// The default drive file `i` of a data dir.
pub fn drive_path(dir: &Path, i: usize) -> PathBuf {
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
            "{} is in use by another flashpool process (a running server? While one runs, `flashpool status`, `drive` and `volume` reach it through its admin socket {}, and `serve --api` serves the admin API over HTTP)",
            dir.display(),
            crate::admin::socket_path(dir).display()
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

/// The size of a new pool's drive files when the user names none.
const DEFAULT_DRIVE_SIZE: u64 = 1 << 30;

/// The smallest drive file a pool is made of when the default size does not fit: below it
/// creation is refused (a pool that small is no use, and the filesystem is nearly full).
const MIN_FITTED_DRIVE_SIZE: u64 = 64 << 20;

/// The size of `n` allocated drive files that fit in `free` bytes of a filesystem, leaving it a
/// tenth of that room (at least 64 MiB) and rounded down to 16 MiB; `None` below 64 MiB.
pub fn fitting_drive_size(free: u64, n: usize) -> Option<u64> {
    let margin = (free / 10).max(64 << 20);
    let size = free.saturating_sub(margin) / (n.max(1) as u64) / (16 << 20) * (16 << 20);
    (size >= MIN_FITTED_DRIVE_SIZE).then_some(size)
}

impl PoolShape {
    /// The size of each drive before any fitting to the filesystem.
    fn drive_size_or_default(&self) -> u64 {
        self.drive_size.unwrap_or(DEFAULT_DRIVE_SIZE)
    }
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

/// True when the data dir holds a pool (or what is left of one): a member record or any file
/// in its drives dir.
pub fn holds_pool(dir: &Path) -> bool {
    dir.join(record::RECORD_FILE).exists() || dir_has_files(&dir.join("drives"))
}

/// Opens the pool in `dir` (creating it when asked and the dir holds none).
pub fn open(dir: &Path, req: &OpenRequest) -> Result<DataDir> {
    if dir.exists() && !dir.is_dir() {
        bail!(
            "{} is not a directory: --data names the directory holding the pool (its drives, \
             member record and admin socket)",
            dir.display()
        );
    }
    if req.shape.memory {
        return open_memory(dir, req);
    }
    if !holds_pool(dir) && !req.create {
        bail!(
            "{} holds no pool (run `flashpool serve --data {}` to create one)",
            dir.display(),
            dir.display()
        );
    }
    if req.create {
        fs::create_dir_all(dir.join("drives"))
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let lock = lock(dir)?;
    if Creating::present(dir) {
        if !req.create {
            bail!(
                "the pool in {} was never completely created (its first `flashpool serve` was \
                 interrupted; nothing was ever served from it): `flashpool serve --data {}` \
                 creates it again",
                dir.display(),
                dir.display()
            );
        }
        let reuse = restart_creation(dir)?;
        return create(dir, req, lock, &reuse);
    }
    if !holds_pool(dir) {
        return create(dir, req, lock, &[]);
    }
    let record = match MemberRecord::load(dir) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("{e:#}; looking for the members without it");
            None
        }
    };
    let mut c = Candidates::default();
    if let Some(r) = &record {
        for m in &r.members {
            c.add(&resolve(dir, &m.path), true);
        }
    }
    c.add_dir(&dir.join("drives"))?;
    if let Some(r) = &record {
        for p in &r.pending {
            c.add_if_pool(&resolve(dir, p));
        }
    }
    for p in &req.drives {
        c.add(p, true);
    }
    let mut search: Vec<String> = record
        .as_ref()
        .map(|r| r.search.clone())
        .unwrap_or_default();
    for s in &req.search {
        if !search.contains(s) {
            search.push(s.clone());
        }
    }
    for s in &search {
        c.add_search(s);
    }
    let has_devices = record
        .as_ref()
        .is_some_and(|r| r.members.iter().any(|m| m.path.starts_with("/dev/")))
        || req.drives.iter().any(|p| p.starts_with("/dev"));
    if has_devices {
        c.add_block_devices();
    }
    let expect = record.as_ref().and_then(|r| r.pool_uuid().ok());
    let drives = std::mem::take(&mut c.drives);
    let a = Pool::assemble(drives, expect).map_err(|e| {
        anyhow!(
            "refusing to open the pool in {}: {e}{}; nothing was created or written",
            dir.display(),
            record
                .as_ref()
                .map(|r| explain_record(dir, r, &c))
                .unwrap_or_default()
        )
    })?;
    let report = report(dir, record.as_ref(), &a, &c);
    if let Err(e) = a.check() {
        let _ = e;
        let missing = a.down().iter().any(|m| m.state_name() == "missing");
        bail!(
            "refusing to open the pool in {}: {} of {} members missing or failed, parity covers {}; nothing was written\n{}{}",
            dir.display(),
            a.down().len(),
            a.slots.len(),
            a.parity(),
            report.join("\n"),
            if missing {
                format!(
                    "\n  a missing member that is elsewhere (moved, renamed, or added from a path \
                     this data dir never recorded) is found by searching for it: `flashpool serve \
                     --data {} --search 'PATH_OR_GLOB'` (for example '/dev/disk/by-id/*' or \
                     '/srv/drives/*.img'); the search is kept in {}",
                    dir.display(),
                    record::RECORD_FILE
                )
            } else {
                String::new()
            }
        );
    }
    for line in &report {
        if !line.starts_with("  present") {
            tracing::warn!("{}", line.trim());
        }
    }
    let opts = OpenOptions {
        pool_uuid: expect,
        read_only: req.read_only,
        ..OpenOptions::default()
    };
    let pool = match Pool::open_assembly(a, &opts) {
        Ok(p) => p,
        Err(flashpool_engine::Error::NoSpace) if req.read_only_if_full && !req.read_only => {
            tracing::error!(
                data = %dir.display(),
                "opening the pool needs room to write its recovery and there is none (the \
                 filesystem under the drive files is full, or the pool is): serving it \
                 read-only; free space and restart to write again"
            );
            drop(lock);
            let dd = open(
                dir,
                &OpenRequest {
                    read_only: true,
                    ..req.clone()
                },
            )?;
            dd.pool.mark_read_only(
                "no room to write the recovery at open (the filesystem under the drive files \
                 is full, or the pool is): free space and restart",
            );
            return Ok(dd);
        }
        Err(e) => {
            return Err(anyhow::Error::new(e))
                .with_context(|| format!("opening the pool in {}", dir.display()))
        }
    };
    if !req.read_only {
        save_record(dir, &pool, record.as_ref(), &search)?;
    }
    Ok(DataDir {
        pool,
        dir: dir.to_owned(),
        created: false,
        _lock: Some(lock),
    })
}

/// One line per member and per drive set aside: where each member is, or where it was last
/// seen and what is there now. A drive set aside in a member's slot is said with that member,
/// not again on a line of its own.
fn report(dir: &Path, record: Option<&MemberRecord>, a: &Assembly, c: &Candidates) -> Vec<String> {
    let mut lines = Vec::new();
    let mut said: Vec<&str> = Vec::new();
    for m in a.members() {
        let uuid = flashpool_engine::assembly::uuid_text(&m.uuid);
        if let Some(at) = &m.identity {
            lines.push(format!(
                "  present: member {} ({uuid}) {} at {at}",
                m.index,
                m.state_name()
            ));
            continue;
        }
        if m.state_name() == "retired" {
            continue;
        }
        let seen = record.and_then(|r| r.last_seen(dir, &uuid));
        let why = match &seen {
            None => "never recorded by this data dir".to_string(),
            Some(p) => {
                let set_aside = a.ignored.iter().find(|i| Path::new(&i.identity) == p);
                let what = match (c.why_unopened(p), set_aside) {
                    (Some(why), _) => why.to_string(),
                    (None, Some(i)) => {
                        said.push(&i.identity);
                        i.reason.clone()
                    }
                    (None, None) => "something else is there now".into(),
                };
                format!("last seen at {}: {what}", p.display())
            }
        };
        // "missing", or "failed" for a failed member whose drive was set aside.
        lines.push(format!(
            "  {}: member {} ({uuid}), {why}",
            m.state_name(),
            m.index
        ));
    }
    for i in a
        .ignored
        .iter()
        .filter(|i| !said.contains(&i.identity.as_str()))
    {
        lines.push(format!("  not a member: {}: {}", i.identity, i.reason));
    }
    lines
}

/// Where the record says the members were, for an error when none of them was found.
fn explain_record(dir: &Path, r: &MemberRecord, c: &Candidates) -> String {
    let mut s = format!(
        "; {} records pool {} with members",
        record::RECORD_FILE,
        r.pool
    );
    for m in &r.members {
        let p = resolve(dir, &m.path);
        s.push_str(&format!(
            " {} at {} ({})",
            m.index,
            p.display(),
            c.why_unopened(&p)
                .unwrap_or("present, not this pool's member")
        ));
    }
    s
}

/// Writes the member record: every present member's path now, a missing member's last path.
fn save_record(
    dir: &Path,
    pool: &Pool,
    old: Option<&MemberRecord>,
    search: &[String],
) -> Result<()> {
    let mut r = MemberRecord::new(&pool.uuid());
    r.search = search.to_vec();
    for d in pool.drives() {
        let path = if d.identity != "-" {
            recorded(dir, Path::new(&d.identity))
        } else {
            match old.and_then(|o| o.members.iter().find(|m| m.uuid == d.uuid)) {
                Some(m) => m.path.clone(),
                None => continue,
            }
        };
        r.members.push(MemberEntry {
            index: d.index,
            uuid: d.uuid,
            path,
        });
    }
    if old != Some(&r) {
        r.save(dir)?;
    }
    Ok(())
}

/// Records in the member record that `path` is about to become a member, before its
/// superblock can name it one: a crash (kill -9, power cut) between that superblock and the
/// record of the new member then leaves a record that still says where the member is. The
/// next save (the member recorded, or the open after a crash) drops it. A pool with no record
/// (in memory) has nothing to lose.
fn record_pending(dir: &Path, path: &Path) -> Result<()> {
    let Some(mut r) = MemberRecord::load(dir).ok().flatten() else {
        return Ok(());
    };
    let p = recorded(dir, path);
    if !r.pending.contains(&p) {
        r.pending.push(p);
        r.save(dir)?;
    }
    Ok(())
}

/// Opens (or updates the record of) an open pool after a member change.
pub fn record_members(dir: &Path, pool: &Pool) -> Result<()> {
    let old = MemberRecord::load(dir).ok().flatten();
    let search = old.as_ref().map(|r| r.search.clone()).unwrap_or_default();
    save_record(dir, pool, old.as_ref(), &search)
}

fn open_memory(dir: &Path, req: &OpenRequest) -> Result<DataDir> {
    let shape = &req.shape;
    if !req.drives.is_empty() {
        bail!("--memory and --drive exclude each other");
    }
    check_shape(shape.k, shape.m, shape.drives)?;
    let size = shape.drive_size_or_default();
    // A simulated drive holds its data and its FTL's tables; first its own limits (they name
    // the flag), then the machine's memory, before any drive is made.
    let sim = shape
        .sim
        .as_ref()
        .map(|cfg| crate::sim_drive::SimDrive::scaled(cfg, size));
    let per_drive = match &sim {
        Some(cfg) => {
            crate::sim_drive::SimDrive::check_size(cfg)?;
            size.saturating_add(cfg.memory_estimate())
        }
        None => size,
    };
    crate::memory::check_fits(
        shape.drives,
        per_drive,
        if sim.is_some() { "simulated" } else { "memory" },
        "use a smaller --drive-size or fewer --drives (or file drives)",
    )?;
    // Nothing of the pool is kept there, but the admin socket lives in it.
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let drives: Vec<DriveRef> = if let Some(cfg) = &sim {
        let clock = if shape.sim_real_time {
            crate::sim_drive::SimClock::Real(std::time::Instant::now())
        } else {
            crate::sim_drive::SimClock::Untimed
        };
        (0..shape.drives)
            .map(|i| {
                crate::sim_drive::SimDrive::with_clock(cfg, format!("sim:{i}"), clock.clone())
                    .map(|d| Arc::new(d) as DriveRef)
            })
            .collect::<Result<_>>()?
    } else {
        let mems: Vec<Arc<MemDrive>> = (0..shape.drives)
            .map(|i| {
                Arc::new(MemDrive::new(
                    shape.drive_size_or_default(),
                    format!("mem:{i}"),
                ))
            })
            .collect();
        // Touch every page now (one thread per drive): page faults would otherwise land on
        // the write path.
        std::thread::scope(|s| {
            for d in &mems {
                s.spawn(|| d.prefault());
            }
        });
        mems.into_iter().map(|d| d as DriveRef).collect()
    };
    let pool = Pool::create(
        drives,
        &pool_config(shape.k, shape.m, shape.drive_size_or_default()),
    )?;
    pool.create_volume("default", req.default_volume)?;
    Ok(DataDir {
        pool,
        dir: dir.to_owned(),
        created: true,
        _lock: None,
    })
}

/// A drive for a new pool or an added member: a block device or an existing file is used
/// whole after the signature check, a missing file is created at `size`.
pub struct NewDrive {
    pub path: PathBuf,
    /// True when this call created the file (removed again if the pool is not made).
    pub created: bool,
    pub drive: DriveRef,
}

/// Checks and opens (or creates) one drive for a new pool or a new member.
pub fn prepare_drive(p: &Path, size: u64, sparse: bool, force: bool) -> Result<NewDrive> {
    match fs::metadata(p) {
        Ok(md) => {
            let is_dev = md.file_type().is_block_device();
            if !is_dev && !md.is_file() {
                bail!("{} is neither a block device nor a file", p.display());
            }
            if !force {
                if let Some(what) =
                    signature::recognise(p).with_context(|| format!("reading {}", p.display()))?
                {
                    return refuse(format!(
                        "{} holds {what}: refusing to overwrite it (--force to use it anyway)",
                        p.display()
                    ));
                }
            }
            if !is_dev && md.len() == 0 {
                let f = File::options().write(true).open(p)?;
                f.set_len(size / 4096 * 4096)?;
            }
            let d = FileDrive::open(p).with_context(|| format!("opening {}", p.display()))?;
            Ok(NewDrive {
                path: p.to_owned(),
                created: false,
                drive: Arc::new(d),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = p.parent().filter(|p| !p.as_os_str().is_empty()) {
                if let Some(free) = free_bytes(parent) {
                    if free < size && !sparse {
                        bail!(
                            "{} has {} MiB free, the drive needs {} MiB: use a smaller --drive-size",
                            parent.display(),
                            free >> 20,
                            size >> 20
                        );
                    }
                }
            }
            let (d, allocated) = FileDrive::create_new(p, size, !sparse)
                .with_context(|| format!("creating {}", p.display()))?;
            if !sparse && !allocated {
                tracing::warn!(path = %p.display(), "the filesystem cannot preallocate: the drive file is sparse");
            }
            Ok(NewDrive {
                path: p.to_owned(),
                created: true,
                drive: Arc::new(d),
            })
        }
        Err(e) => Err(e).with_context(|| format!("{}", p.display())),
    }
}

/// Removes the files this command created (a refused creation leaves things as they were).
fn remove_created(drives: &[NewDrive]) {
    for d in drives.iter().filter(|d| d.created) {
        let _ = fs::remove_file(&d.path);
    }
}

/// Whether `k`+`m` protection on `n` drives makes a pool that keeps taking writes with a
/// member down: a stripe needs at least one data chunk and all `m` parity chunks on distinct
/// members, so with parity the pool needs `m` + 2 members (a 1+1 pool on two drives would turn
/// read-only at its first failure, and stay so until the drive returned).
fn check_shape(k: usize, m: usize, n: usize) -> Result<()> {
    if k + m > n {
        bail!(
            "protection {k}+{m} needs at least {} drives, {n} given",
            k + m
        );
    }
    if m > 0 && n < m + 2 {
        bail!(
            "protection {k}+{m} on {n} drives: with a member down only {} would be left, too \
             few for a stripe of 1 data and {m} parity chunks, and the pool would turn read-only; \
             use at least {} drives",
            n - 1,
            m + 2
        );
    }
    Ok(())
}

/// Undoes an interrupted creation (the marker is present: see `creating.rs`): removes the
/// drive files it made under `DIR/drives` and any member record it wrote. Returns the drives
/// it used outside the data dir (`--drive`), which the new creation may write over when they
/// hold nothing but a flashpool superblock (the interrupted creation's own).
fn restart_creation(dir: &Path) -> Result<Vec<PathBuf>> {
    let marker = Creating::load(dir)?
        .with_context(|| format!("{} vanished", dir.join(creating::MARKER_FILE).display()))?;
    let drives_dir = dir.join("drives");
    let mut outside = Vec::new();
    for p in marker.paths(dir) {
        if p.parent() == Some(drives_dir.as_path()) {
            match fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("removing {}", p.display())),
            }
        } else {
            outside.push(p);
        }
    }
    match fs::remove_file(dir.join(record::RECORD_FILE)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).context("removing the member record"),
    }
    if holds_pool(dir) {
        bail!(
            "{} was being created when a previous start was interrupted, and {} holds files \
             that creation did not make: refusing to create the pool over them (move them away \
             and start again)",
            dir.display(),
            drives_dir.display()
        );
    }
    tracing::warn!(
        data = %dir.display(),
        "the pool's creation was interrupted before it was complete (nothing was ever served \
         from it): creating it again"
    );
    Ok(outside)
}

fn create(dir: &Path, req: &OpenRequest, lock: File, reuse: &[PathBuf]) -> Result<DataDir> {
    let shape = &req.shape;
    let paths: Vec<PathBuf> = if req.drives.is_empty() {
        (0..shape.drives).map(|i| drive_path(dir, i)).collect()
    } else {
        req.drives.clone()
    };
    let n = paths.len();
    check_shape(shape.k, shape.m, n)?;
    let mut drive_size = shape.drive_size_or_default();
    let total = drive_size.saturating_mul(n as u64);
    // Only the drive files made here under DIR/drives take room from its filesystem.
    let free = if req.drives.is_empty() {
        free_bytes(dir)
    } else {
        None
    };
    if let Some(free) = free.filter(|&free| free < total) {
        // Default drive files that do not fit are made smaller; a size the user named is not.
        let fitted = fitting_drive_size(free, n).filter(|_| shape.drive_size.is_none());
        if shape.sparse {
            tracing::warn!(
                free_mib = free >> 20,
                drives_mib = total >> 20,
                "sparse drive files larger than the filesystem: writes get ENOSPC once it fills"
            );
        } else if let Some(size) = fitted {
            tracing::warn!(
                free_mib = free >> 20,
                drive_mib = size >> 20,
                default_mib = drive_size >> 20,
                "the filesystem has no room for drive files of the default size: made smaller (--drive-size to choose)"
            );
            drive_size = size;
        } else {
            bail!(
                "{} has {} MiB free, the pool's drives would take up to {} MiB: use a smaller --drive-size",
                dir.display(),
                free >> 20,
                total >> 20
            );
        }
    }
    // From here until the pool is complete and recorded, a crash leaves the marker: the next
    // start creates the pool again instead of refusing what is left of it forever.
    Creating::new(dir, &paths).save(dir)?;
    let mut made: Vec<NewDrive> = Vec::new();
    let result = (|| -> Result<Pool> {
        for p in &paths {
            // A drive the interrupted creation wrote its superblock to may be written again.
            let ours = reuse.contains(p) && signature::superblock(p).is_ok_and(|sb| sb.is_some());
            made.push(prepare_drive(
                p,
                drive_size,
                shape.sparse,
                req.force || ours,
            )?);
        }
        crash_point("create-drives");
        let drives: Vec<DriveRef> = made.iter().map(|d| d.drive.clone()).collect();
        let size = drives.iter().map(|d| d.info().size).min().unwrap_or(0);
        let pool = Pool::create(drives, &pool_config(shape.k, shape.m, size))?;
        pool.create_volume("default", req.default_volume)?;
        crash_point("create-record");
        save_record(dir, &pool, None, &req.search)?;
        Creating::remove(dir)?;
        Ok(pool)
    })();
    match result {
        Ok(pool) => Ok(DataDir {
            pool,
            dir: dir.to_owned(),
            created: true,
            _lock: Some(lock),
        }),
        Err(e) => {
            remove_created(&made);
            let _ = fs::remove_file(dir.join(record::RECORD_FILE));
            let _ = Creating::remove(dir);
            Err(e)
        }
    }
}

/// Opens an existing pool for a command that changes it; fails if there is none.
pub fn open_existing(dir: &Path) -> Result<DataDir> {
    open(dir, &OpenRequest::default())
}

/// Opens an existing pool without writing anything (status, lists).
pub fn open_read_only(dir: &Path) -> Result<DataDir> {
    open(
        dir,
        &OpenRequest {
            read_only: true,
            ..OpenRequest::default()
        },
    )
}

/// The path of the next default drive file: the first `drive-N.img` not taken.
fn next_drive_path(dir: &Path) -> PathBuf {
    (0..)
        .map(|i| drive_path(dir, i))
        .find(|p| !p.exists())
        .expect("some drive number is free")
}

/// Refuses `path` as a new member (`drive add`, `drive replace`) when it is one of this
/// pool's members: the same file or device as a member not retired, compared by device and
/// inode (by device number for block devices), so another spelling, a symlink or a hard link
/// is caught; or a drive whose superblock names this pool and a member slot not retired (a
/// member reached by a path the pool does not know, a missing member, a copy of one).
/// `--force` does not override this: it is for foreign or filesystem content, and writing a
/// new member over one of the pool's own destroys that member's chunks (on a degraded pool,
/// data). A retired member's drive holds nothing the pool needs and may be reused (`--force`,
/// since it holds a flashpool superblock).
fn refuse_own_member(pool: &Pool, path: &Path) -> Result<()> {
    let Ok(md) = fs::metadata(path) else {
        return Ok(()); // a new file
    };
    if !md.is_file() && !md.file_type().is_block_device() {
        return Ok(()); // `prepare_drive` says what it is
    }
    let drives = pool.drives();
    if let Some(d) = member_holding(&drives, &md) {
        return refuse(format!(
            "{} is member {} of this pool ({}, at {}): refusing to overwrite it (--force only \
             overrides foreign or filesystem content, never the pool's own members)",
            path.display(),
            d.index,
            member_state_words(d.state),
            d.identity
        ));
    }
    let sb = signature::superblock(path).with_context(|| format!("reading {}", path.display()))?;
    if let Some(sb) = sb.filter(|sb| sb.pool_uuid == pool.uuid()) {
        if let Some(d) = drives
            .iter()
            .find(|d| d.index == sb.drive_index as usize && d.state != "retired")
        {
            return refuse(format!(
                "{} holds member {} of this pool ({}{}): refusing to overwrite it (--force only \
                 overrides foreign or filesystem content, never the pool's own members); if it \
                 is a stale copy, wipe its first 8 KiB first",
                path.display(),
                d.index,
                member_state_words(d.state),
                if d.identity == "-" {
                    String::new()
                } else {
                    format!(", in use at {}", d.identity)
                }
            ));
        }
    }
    Ok(())
}

/// The member not retired whose drive is the file or device `md` describes, compared by
/// device and inode (by device number for block devices).
fn member_holding<'a>(drives: &'a [DriveStatus], md: &fs::Metadata) -> Option<&'a DriveStatus> {
    let id = candidates::identity(md);
    drives.iter().find(|d| {
        d.state != "retired"
            && d.identity != "-"
            && fs::metadata(&d.identity).is_ok_and(|m| candidates::identity(&m) == id)
    })
}

/// Refuses a `drive replace OLD PATH` whose PATH joined the pool already while OLD is out of
/// service: an earlier replace got past adding the new drive (killed, or its rebuild cut off)
/// and retrying it would only be refused as "PATH is a member". Says where that replace got
/// to and what finishes it, instead.
fn refuse_replace_begun(pool: &Pool, old: usize, path: &Path) -> Result<()> {
    let Ok(md) = fs::metadata(path) else {
        return Ok(()); // a new file: nothing was begun with it
    };
    let drives = pool.drives();
    let Some(new) = member_holding(&drives, &md).filter(|d| d.index != old && d.state == "active")
    else {
        return Ok(());
    };
    let Some(was) = drives.iter().find(|d| d.index == old) else {
        return Ok(());
    };
    match was.state {
        "retired" => refuse(format!(
            "{} is member {} of this pool already and member {old} is retired: the replace is \
             complete (`flashpool drive list` shows the members)",
            path.display(),
            new.index
        )),
        "failed" | "missing" => refuse(format!(
            "{} is member {} of this pool already and member {old} is {}: nothing is left to \
             replace it with; run `flashpool drive rebuild` to move member {old}'s data onto \
             the pool (an interrupted replace ends this way too; a running server rebuilds \
             after its --rebuild-delay)",
            path.display(),
            new.index,
            was.state
        )),
        _ => Ok(()),
    }
}

/// A member state as a phrase for messages.
fn member_state_words(state: &str) -> &'static str {
    match state {
        "active" => "in service",
        "failed" => "failed, its data not rebuilt yet",
        "missing" => "missing, its data not rebuilt yet",
        _ => "not retired",
    }
}

/// Adds a drive to a pool (open here, or held by this process's server): `path` (a block
/// device or file, created at the pool's drive size if missing) or the next default drive
/// file. Returns the path.
pub fn add_drive(dir: &Path, pool: &Pool, path: Option<&Path>, force: bool) -> Result<PathBuf> {
    let path = path.map_or_else(|| next_drive_path(dir), Path::to_owned);
    refuse_own_member(pool, &path)?;
    let nd = prepare_named_drive(&path, pool.info().drive_size, force)?;
    record_pending(dir, &path)?;
    if let Err(e) = pool.add_drive_online(nd.drive.clone()) {
        record_members(dir, pool)?;
        remove_created(std::slice::from_ref(&nd));
        return Err(e.into());
    }
    crash_point("member-record");
    record_members(dir, pool)?;
    Ok(path)
}

/// Replaces member `old` by `path` (created at the pool's drive size if missing) and rebuilds
/// what depended on `old` onto the pool.
pub fn replace_drive(
    dir: &Path,
    pool: &Pool,
    old: usize,
    path: &Path,
    force: bool,
) -> Result<flashpool_engine::RebuildStatus> {
    let count = pool.info().drive_count;
    if old >= count {
        bail!("no member {old} (the pool has {count})");
    }
    refuse_replace_begun(pool, old, path)?;
    refuse_own_member(pool, path)?;
    let nd = prepare_named_drive(path, pool.info().drive_size, force)?;
    record_pending(dir, path)?;
    let st = match pool.replace_drive(old, nd.drive.clone()) {
        Ok(st) => st,
        Err(e) => {
            if !pool.drives().iter().any(|d| Path::new(&d.identity) == path) {
                remove_created(std::slice::from_ref(&nd));
            }
            record_members(dir, pool)?;
            return Err(e.into());
        }
    };
    crash_point("member-record");
    record_members(dir, pool)?;
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::fitting_drive_size;

    const MIB: u64 = 1 << 20;

    #[test]
    fn fitted_drive_files_leave_the_filesystem_room_and_are_never_tiny() {
        // The CI machine's case: 3446 MiB free, five drives: a tenth kept, 16 MiB multiples.
        assert_eq!(fitting_drive_size(3446 * MIB, 5), Some(608 * MIB));
        for free_mib in [0, 1, 64, 100, 383, 384, 400, 1000, 5120, 10 << 10, 1 << 20] {
            for n in [1, 3, 5, 8, 24] {
                let free = free_mib * MIB;
                match fitting_drive_size(free, n) {
                    Some(size) => {
                        assert!(size >= 64 * MIB && size % (16 * MIB) == 0, "{free_mib} {n}");
                        let left = free - size * n as u64;
                        assert!(left >= free / 10 && left >= 64 * MIB, "{free_mib} {n}");
                    }
                    // Refused only where 64 MiB drives would leave less than the margin.
                    None => assert!(
                        free < 64 * MIB * n as u64 + (free / 10).max(64 * MIB),
                        "{free_mib} {n}"
                    ),
                }
            }
        }
        assert_eq!(fitting_drive_size(96 * MIB, 5), None);
    }
}
