//! The creation marker: `DIR/creating.json`, present while a data dir's pool is being created.
//!
//! Creating a pool writes several things (the drive files, every drive's superblocks, the
//! `default` volume, the member record); a crash part-way (kill -9, power cut) leaves some of
//! them, which on their own look like a damaged pool that must never be created over. The
//! marker is written (atomically, then the directory synced) before the first drive is made,
//! and removed (the directory synced) once the pool is complete and recorded, before it is
//! served. A start that finds it knows creation never finished and nothing was ever served
//! from the data dir: it removes what creation made under `DIR/drives`, and creates the pool
//! again. Without the marker, a data dir holding anything of a pool is never created over.
//!
//! The file names every drive the creation uses, so a drive given with `--drive` (outside the
//! data dir) that the interrupted creation wrote a superblock to may be written again. JSON,
//! versioned and checksummed (CRC32C) like the member record.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// File name of the marker in a data dir.
pub const MARKER_FILE: &str = "creating.json";
const FORMAT: &str = "flashpool-creating";
const VERSION: u32 = 1;

/// The marker's content.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Creating {
    pub format: String,
    pub version: u32,
    /// Every drive the creation uses: relative to the data dir when inside it, else absolute.
    pub drives: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct Stored {
    #[serde(flatten)]
    marker: Creating,
    /// CRC32C of the content's canonical JSON (this struct without the field).
    crc32c: u32,
}

impl Creating {
    pub fn new(dir: &Path, drives: &[PathBuf]) -> Self {
        Creating {
            format: FORMAT.into(),
            version: VERSION,
            drives: drives
                .iter()
                .map(|p| super::record::recorded(dir, p))
                .collect(),
        }
    }

    fn crc(&self) -> Result<u32> {
        Ok(flashpool_engine::crc::checksum(&serde_json::to_vec(self)?))
    }

    /// True when `dir` holds a marker (whatever its state).
    pub fn present(dir: &Path) -> bool {
        dir.join(MARKER_FILE).exists()
    }

    /// Reads the marker of `dir`; `Ok(None)` when there is none.
    pub fn load(dir: &Path) -> Result<Option<Creating>> {
        let path = dir.join(MARKER_FILE);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let check = || -> Result<Creating> {
            let s: Stored = serde_json::from_str(&text).context("not a creation marker")?;
            let m = s.marker;
            if m.format != FORMAT {
                bail!("format {:?}, expected {FORMAT:?}", m.format);
            }
            if m.version == 0 || m.version > VERSION {
                bail!(
                    "marker version {}, this build reads 1 to {VERSION}",
                    m.version
                );
            }
            if m.crc()? != s.crc32c {
                bail!("checksum mismatch");
            }
            Ok(m)
        };
        check()
            .map(Some)
            .with_context(|| format!("{} is damaged", path.display()))
    }

    /// The drives, as paths.
    pub fn paths(&self, dir: &Path) -> Vec<PathBuf> {
        self.drives
            .iter()
            .map(|p| super::record::resolve(dir, p))
            .collect()
    }

    /// Writes the marker atomically (temporary file, fsync, rename, fsync of the dir).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(MARKER_FILE);
        let tmp = dir.join(format!("{MARKER_FILE}.tmp"));
        let text = serde_json::to_string_pretty(&Stored {
            marker: self.clone(),
            crc32c: self.crc()?,
        })? + "\n";
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            fs::File::open(dir)?.sync_all()
        };
        write().with_context(|| format!("writing {}", path.display()))
    }

    /// Removes the marker of `dir`, durably: once this returns, a crash cannot bring it back
    /// (a pool served after it must never be taken for an unfinished creation).
    pub fn remove(dir: &Path) -> Result<()> {
        let path = dir.join(MARKER_FILE);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
        }
        fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("syncing {}", dir.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Creating::load(dir.path()).unwrap().is_none());
        let m = Creating::new(
            dir.path(),
            &[dir.path().join("drives/drive-0.img"), "/dev/sdx".into()],
        );
        assert_eq!(m.drives, ["drives/drive-0.img", "/dev/sdx"]);
        m.save(dir.path()).unwrap();
        assert_eq!(Creating::load(dir.path()).unwrap(), Some(m.clone()));
        let p = dir.path().join(MARKER_FILE);
        let text = fs::read_to_string(&p).unwrap().replace("sdx", "sdy");
        fs::write(&p, text).unwrap();
        assert!(Creating::load(dir.path()).is_err());
        Creating::remove(dir.path()).unwrap();
        assert!(!Creating::present(dir.path()));
    }
}
