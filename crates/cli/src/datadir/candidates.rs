//! The drives a data dir may be made of: every place a member could be, opened and handed to
//! the engine's assembly, which decides from the superblocks who is a member.
//!
//! Sources, in order: the paths the member record last saw, every file in `DIR/drives/`, the
//! `--drive` paths given now, the record's and the command line's search paths and globs
//! (for members that moved, e.g. `/dev/disk/by-id/*`), and, for a pool with block-device
//! members, every block device the kernel lists. The same file or device reached by two
//! names (a symlink, a by-id link) is opened once. Searched paths are opened only when they
//! start with a flashpool superblock's magic, so a search over every disk of a machine leaves
//! the others alone; the drives dir, the record and `--drive` are opened whatever they hold, so
//! a damaged or foreign drive there is named.

use anyhow::Result;
use flashpool_engine::drive::{DriveRef, FileDrive};
use std::collections::HashSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A path that could not be opened as a drive, and why.
#[derive(Clone, Debug)]
pub struct Unopened {
    pub path: PathBuf,
    pub reason: String,
}

/// The candidates found: drives opened, and paths that could not be.
#[derive(Default)]
pub struct Candidates {
    pub drives: Vec<DriveRef>,
    pub unopened: Vec<Unopened>,
    seen: HashSet<(u64, u64)>,
}

/// A file or block device's identity: (device, inode) for files, (0, rdev) for devices.
pub fn identity(md: &std::fs::Metadata) -> (u64, u64) {
    if md.file_type().is_block_device() {
        (0, md.rdev())
    } else {
        (md.dev(), md.ino())
    }
}

/// True for a regular file or a block device.
fn is_drive_like(md: &std::fs::Metadata) -> bool {
    md.is_file() || md.file_type().is_block_device()
}

/// True when the file starts with a flashpool superblock's magic in either slot.
fn has_pool_magic(p: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(p) else {
        return false;
    };
    let mut b = [0u8; 8];
    for off in [0u64, 4096] {
        if f.seek(SeekFrom::Start(off)).is_ok() && f.read_exact(&mut b).is_ok() && &b == b"FLPOOLSB"
        {
            return true;
        }
    }
    false
}

impl Candidates {
    /// Opens `p` as a drive unless it was opened already; a path that does not exist or fails
    /// to open is noted (when `note_missing`) and skipped.
    pub fn add(&mut self, p: &Path, note_missing: bool) {
        let md = match std::fs::metadata(p) {
            Ok(m) => m,
            Err(e) => {
                if note_missing {
                    self.unopened.push(Unopened {
                        path: p.to_owned(),
                        reason: e.to_string(),
                    });
                }
                return;
            }
        };
        if !is_drive_like(&md) || !self.seen.insert(identity(&md)) {
            return;
        }
        match FileDrive::open(p) {
            Ok(d) => self.drives.push(Arc::new(d) as DriveRef),
            Err(e) => self.unopened.push(Unopened {
                path: p.to_owned(),
                reason: format!("cannot open: {e}"),
            }),
        }
    }

    /// Adds every regular file of `dir` (sorted by name).
    pub fn add_dir(&mut self, dir: &Path) -> Result<()> {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return Ok(());
        };
        let mut paths: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths {
            self.add(&p, true);
        }
        Ok(())
    }

    /// Adds the paths a search pattern matches that hold a flashpool superblock.
    pub fn add_search(&mut self, pattern: &str) {
        let Ok(paths) = glob::glob(pattern) else {
            tracing::warn!(pattern, "not a valid search pattern; skipped");
            return;
        };
        for p in paths.flatten() {
            if has_pool_magic(&p) {
                self.add(&p, false);
            }
        }
    }

    /// Adds `p` when it holds a flashpool superblock (a drive a killed `drive add` or
    /// `drive replace` was making a member: it may hold nothing yet).
    pub fn add_if_pool(&mut self, p: &Path) {
        if has_pool_magic(p) {
            self.add(p, false);
        }
    }

    /// Adds the block devices the kernel lists (`/proc/partitions`, as md's assembly scans)
    /// that hold a flashpool superblock: where members that are block devices go when their
    /// names move (`/dev/nvme3n1` today, `/dev/nvme1n1` after a reboot).
    pub fn add_block_devices(&mut self) {
        let Ok(text) = std::fs::read_to_string("/proc/partitions") else {
            return;
        };
        for line in text.lines().skip(2) {
            if let Some(name) = line.split_whitespace().nth(3) {
                let p = Path::new("/dev").join(name);
                if has_pool_magic(&p) {
                    self.add(&p, false);
                }
            }
        }
    }

    /// The unopened entry for `p`, if it could not be opened.
    pub fn why_unopened(&self, p: &Path) -> Option<&str> {
        self.unopened
            .iter()
            .find(|u| u.path == p)
            .map(|u| u.reason.as_str())
    }
}

/// Files in a directory, if any (the drives dir holds nothing else).
pub fn dir_has_files(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut rd| rd.next().is_some())
}
