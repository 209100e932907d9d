//! The member record: `DIR/members.json`, the pool's members as this data dir last saw them.
//!
//! Membership itself comes from the drives' superblocks; the record only says where to look
//! (the path each member was last seen at, and the search paths for members that moved) and
//! which pool this data dir holds, so a plain `flashpool serve --data DIR` reopens drives given
//! once with `--drive`, names a missing member by its path, and never takes another pool's
//! drives for its own. Versioned and checksummed (CRC32C) like every on-disk structure
//! (docs/FORMAT.md); written to a temporary file and renamed, so a crash leaves the old record
//! or the new one.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// File name of the record in a data dir.
pub const RECORD_FILE: &str = "members.json";
/// What the `format` field holds.
const FORMAT: &str = "flashpool-members";
/// The record version this build writes (and the newest it reads).
pub const RECORD_VERSION: u32 = 1;

/// One member as last seen.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemberEntry {
    pub index: usize,
    /// The member's UUID (from its superblock).
    pub uuid: String,
    /// Where it was last seen: relative to the data dir when inside it, else absolute.
    pub path: String,
}

/// The record's content.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemberRecord {
    pub format: String,
    pub version: u32,
    /// The pool this data dir holds.
    pub pool: String,
    pub members: Vec<MemberEntry>,
    /// Paths or globs searched for members that moved (for example `/dev/disk/by-id/*`).
    #[serde(default)]
    pub search: Vec<String>,
    /// Drives being made members right now (`drive add`, `drive replace`): recorded before
    /// the new drive's superblock names it a member, so that a crash before the member itself
    /// is recorded leaves a record that still says where to look. Searched at open (only when
    /// the path holds a flashpool superblock); dropped by the next save. Absent when empty,
    /// so a record without one is byte for byte what builds before it wrote (and read).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<String>,
}

/// The record as stored: the content and its checksum.
#[derive(Serialize, Deserialize)]
struct Stored {
    #[serde(flatten)]
    record: MemberRecord,
    /// CRC32C of the content's canonical JSON (this struct without the field).
    crc32c: u32,
}

impl MemberRecord {
    /// A record for pool `pool` with no members yet.
    pub fn new(pool: &[u8; 16]) -> Self {
        MemberRecord {
            format: FORMAT.into(),
            version: RECORD_VERSION,
            pool: uuid::Uuid::from_bytes(*pool).to_string(),
            members: Vec::new(),
            search: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// The pool's UUID as bytes.
    pub fn pool_uuid(&self) -> Result<[u8; 16]> {
        Ok(*uuid::Uuid::parse_str(&self.pool)
            .with_context(|| format!("pool UUID {:?}", self.pool))?
            .as_bytes())
    }

    fn crc(&self) -> Result<u32> {
        Ok(flashpool_engine::crc::checksum(&serde_json::to_vec(self)?))
    }

    /// Reads the record of `dir`; `Ok(None)` when there is none.
    pub fn load(dir: &Path) -> Result<Option<MemberRecord>> {
        let path = dir.join(RECORD_FILE);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Self::decode(&text)
            .map(Some)
            .with_context(|| format!("{} is damaged", path.display()))
    }

    /// Parses and checks a stored record.
    pub fn decode(text: &str) -> Result<MemberRecord> {
        let s: Stored = serde_json::from_str(text).context("not a member record")?;
        let r = s.record;
        if r.format != FORMAT {
            bail!("format {:?}, expected {FORMAT:?}", r.format);
        }
        if r.version == 0 || r.version > RECORD_VERSION {
            bail!(
                "record version {}, this build reads 1 to {RECORD_VERSION}",
                r.version
            );
        }
        if r.crc()? != s.crc32c {
            bail!("checksum mismatch");
        }
        r.pool_uuid()?;
        Ok(r)
    }

    /// Encodes with its checksum.
    pub fn encode(&self) -> Result<String> {
        let stored = Stored {
            record: self.clone(),
            crc32c: self.crc()?,
        };
        Ok(serde_json::to_string_pretty(&stored)? + "\n")
    }

    /// Writes the record to `dir` atomically (temporary file, fsync, rename, fsync of the dir).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(RECORD_FILE);
        let tmp = dir.join(format!("{RECORD_FILE}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(self.encode().map_err(std::io::Error::other)?.as_bytes())?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            fs::File::open(dir)?.sync_all()
        };
        write().with_context(|| format!("writing {}", path.display()))
    }

    /// The path member `uuid` was last seen at, resolved against `dir`.
    pub fn last_seen(&self, dir: &Path, uuid: &str) -> Option<PathBuf> {
        self.members
            .iter()
            .find(|m| m.uuid == uuid)
            .map(|m| resolve(dir, &m.path))
    }
}

/// A recorded path made usable: relative ones are relative to the data dir.
pub fn resolve(dir: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_owned()
    } else {
        dir.join(p)
    }
}

/// A path as the record stores it: relative to the data dir when inside it, else absolute
/// (as given, not canonical: a `/dev/disk/by-id/...` link stays the name that survives a
/// reboot).
pub fn recorded(dir: &Path, p: &Path) -> String {
    let abs = |p: &Path| -> PathBuf {
        if p.is_absolute() {
            p.to_owned()
        } else {
            std::env::current_dir().map_or_else(|_| p.to_owned(), |c| c.join(p))
        }
    };
    let (a, d) = (abs(p), abs(dir));
    match a.strip_prefix(&d) {
        Ok(rel) => rel.display().to_string(),
        Err(_) => a.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> MemberRecord {
        let mut r = MemberRecord::new(&[7; 16]);
        r.members.push(MemberEntry {
            index: 0,
            uuid: uuid::Uuid::from_bytes([1; 16]).to_string(),
            path: "drives/drive-0.img".into(),
        });
        r.members.push(MemberEntry {
            index: 1,
            uuid: uuid::Uuid::from_bytes([2; 16]).to_string(),
            path: "/dev/disk/by-id/nvme-x".into(),
        });
        r.search.push("/dev/disk/by-id/*".into());
        r
    }

    #[test]
    fn round_trip_and_every_change_is_caught() {
        let r = sample();
        let text = r.encode().unwrap();
        assert_eq!(MemberRecord::decode(&text).unwrap(), r);
        // Any edit of the content without the checksum is refused.
        for (from, to) in [
            ("drive-0.img", "drive-9.img"),
            ("nvme-x", "nvme-y"),
            ("\"index\": 1", "\"index\": 2"),
            ("by-id/*", "by-id/?"),
        ] {
            assert!(text.contains(from), "{from}");
            let bad = text.replace(from, to);
            let e = MemberRecord::decode(&bad).unwrap_err();
            assert!(format!("{e:#}").contains("checksum"), "{from}: {e:#}");
        }
        assert!(MemberRecord::decode("{}").is_err());
        assert!(MemberRecord::decode("not json").is_err());
        let newer = text.replace("\"version\": 1", "\"version\": 2");
        assert!(format!("{:#}", MemberRecord::decode(&newer).unwrap_err()).contains("version"));
    }

    #[test]
    fn save_load_and_paths() {
        let dir = std::env::temp_dir().join(format!("fp-record-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        assert!(MemberRecord::load(&dir).unwrap().is_none());
        let r = sample();
        r.save(&dir).unwrap();
        assert_eq!(MemberRecord::load(&dir).unwrap().unwrap(), r);
        let u1 = uuid::Uuid::from_bytes([1; 16]).to_string();
        assert_eq!(
            r.last_seen(&dir, &u1).unwrap(),
            dir.join("drives/drive-0.img")
        );
        assert_eq!(
            recorded(&dir, &dir.join("drives/drive-3.img")),
            "drives/drive-3.img"
        );
        assert_eq!(recorded(&dir, Path::new("/dev/loop3")), "/dev/loop3");
        fs::write(dir.join(RECORD_FILE), "garbage").unwrap();
        assert!(MemberRecord::load(&dir).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
