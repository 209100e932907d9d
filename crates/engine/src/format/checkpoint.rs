//! The checkpoint: the pool's whole metadata state at one point of the log (volumes, their
//! block maps, segment states), from which recovery rolls the log forward.
//!
//! It is written as ordinary erasure-coded stripes of kind `Checkpoint`; the superblock names
//! its sequence range, segments, length and CRC32C. Maps are stored as runs of consecutive
//! mapped blocks, so a dense volume costs 8 bytes per block and a sparse one 24 at worst.
//!
//! The checkpoint has its own version, [`CHECKPOINT_VERSION`]: version 2 added the space each
//! segment's stripes took (what the cleaner measures live data against). Version 3 has the
//! same layout and says the log after it may hold segment-free and relocation records (kinds
//! 7 and 8), which a build that reads only up to version 2 would take for a torn log and cut
//! short: the version makes such a build refuse the pool instead. Version 4 has the same
//! layout again and says the log after it is stamped (`header::Record`): recovery applies its
//! records in stamp order, and an emptied segment may have been reused without a checkpoint,
//! leaving gaps in the stripe sequence that are not the end of the log. Version 5 adds which
//! members each segment's stripes have chunks on (what a rebuild tests to decide whether a
//! segment depends on a lost member); older versions read as "every member" for segments that
//! hold data, as the pool had it in memory. Version 1 (the pool format's first) is still read;
//! its segments' space is unknown until they are rewritten.

use super::bytes::{Reader, Writer};
use crate::error::{Error, Result};

const CP_MAGIC: [u8; 4] = *b"FPCP";
/// The version this build writes.
pub const CHECKPOINT_VERSION: u32 = 5;
/// The first version whose log after it is stamped.
pub const STAMPED_LOG_VERSION: u32 = 4;
/// The oldest version this build reads (no segment space).
const CHECKPOINT_VERSION_1: u32 = 1;
/// The first version with each segment's members.
const MEMBERS_VERSION: u32 = 5;
const END_OF_RUNS: u64 = u64::MAX;

/// One volume in a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeImage {
    pub id: u32,
    pub name: String,
    pub size: u64,
    /// Compression setting: 0 off, 1 lz4, 2 zstd.
    pub compression: u8,
    /// Runs of consecutive mapped blocks: first block and the map entries.
    pub runs: Vec<(u64, Vec<u64>)>,
}

/// A decoded checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointImage {
    /// The version it was written at.
    pub version: u32,
    pub next_volume_id: u32,
    /// One state byte per segment (see `SegmentState`).
    pub segment_states: Vec<u8>,
    /// Per segment, the bytes (data and parity) its stripes took since it was last opened,
    /// 0 where unknown or free; empty when the checkpoint predates the field (version 1).
    pub segment_space: Vec<u64>,
    /// Per segment, bit d set when its stripes may have a chunk on member d (0 for segments
    /// that hold no data); empty when the checkpoint predates the field (before version 5).
    pub segment_members: Vec<u64>,
    pub volumes: Vec<VolumeImage>,
}

/// Streams a checkpoint out without first copying the maps.
pub struct CheckpointWriter {
    w: Writer,
}

impl CheckpointWriter {
    /// Starts a checkpoint with the pool-wide fields; `segment_space` and `segment_members`
    /// have one entry per segment, like `segment_states`.
    pub fn new(
        next_volume_id: u32,
        segment_states: &[u8],
        segment_space: &[u64],
        segment_members: &[u64],
        volume_count: u32,
    ) -> Self {
        assert_eq!(
            segment_states.len(),
            segment_space.len(),
            "one space entry per segment"
        );
        assert_eq!(
            segment_states.len(),
            segment_members.len(),
            "one members entry per segment"
        );
        let mut w = Writer::with_capacity(1 << 16);
        w.bytes(&CP_MAGIC);
        w.u32(CHECKPOINT_VERSION);
        w.u32(next_volume_id);
        w.u32(volume_count);
        w.u32(segment_states.len() as u32);
        w.bytes(segment_states);
        w.pad_to(8);
        for s in segment_space {
            w.u64(*s);
        }
        for m in segment_members {
            w.u64(*m);
        }
        CheckpointWriter { w }
    }

    /// Starts a volume; its runs follow, then `end_volume`.
    pub fn volume(&mut self, id: u32, name: &str, size: u64, compression: u8) {
        self.w.u32(id);
        self.w.u16(name.len() as u16);
        self.w.u16(compression as u16);
        self.w.u64(size);
        self.w.bytes(name.as_bytes());
        self.w.pad_to(8);
    }

    /// Adds a run of mapped blocks starting at `lba`.
    pub fn run(&mut self, lba: u64, entries: &[u64]) {
        debug_assert!(!entries.is_empty());
        self.w.u64(lba);
        self.w.u64(entries.len() as u64);
        for e in entries {
            self.w.u64(*e);
        }
    }

    /// Ends the current volume.
    pub fn end_volume(&mut self) {
        self.w.u64(END_OF_RUNS);
        self.w.u64(0);
    }

    /// The encoded checkpoint.
    pub fn finish(self) -> Vec<u8> {
        self.w.buf
    }
}

impl CheckpointImage {
    /// Decodes a checkpoint whose CRC the caller already checked.
    pub fn decode(buf: &[u8]) -> Result<CheckpointImage> {
        let mut r = Reader::new(buf, "checkpoint");
        if r.array::<4>()? != CP_MAGIC {
            return Err(Error::corrupt("checkpoint has a bad magic"));
        }
        let version = r.u32()?;
        if !(CHECKPOINT_VERSION_1..=CHECKPOINT_VERSION).contains(&version) {
            return Err(Error::corrupt(format!(
                "checkpoint version {version}, this build reads {CHECKPOINT_VERSION_1} to {CHECKPOINT_VERSION}"
            )));
        }
        let next_volume_id = r.u32()?;
        let nvol = r.u32()? as usize;
        let nseg = r.u32()? as usize;
        let segment_states = r.take(nseg)?.to_vec();
        r.align(8)?;
        // One u64 per segment, from the version that added the field on (else empty).
        let mut per_segment = |since: u32, what: &str| -> Result<Vec<u64>> {
            if version < since {
                return Ok(Vec::new());
            }
            if nseg > r.remaining() / 8 {
                return Err(Error::corrupt(format!(
                    "checkpoint of {nseg} segments is too short for their {what}"
                )));
            }
            (0..nseg).map(|_| r.u64()).collect()
        };
        let segment_space = per_segment(2, "space")?;
        let segment_members = per_segment(MEMBERS_VERSION, "members")?;
        let mut volumes = Vec::with_capacity(nvol.min(1024));
        for _ in 0..nvol {
            let id = r.u32()?;
            let n = r.u16()? as usize;
            let compression = r.u16()? as u8;
            let size = r.u64()?;
            let name = std::str::from_utf8(r.take(n)?)
                .map_err(|_| Error::corrupt("volume name is not UTF-8"))?
                .to_owned();
            r.align(8)?;
            let mut runs = Vec::new();
            loop {
                let lba = r.u64()?;
                let count = r.u64()? as usize;
                if lba == END_OF_RUNS {
                    break;
                }
                if count == 0 || count > r.remaining() / 8 {
                    return Err(Error::corrupt(format!("checkpoint run of {count} blocks")));
                }
                let entries = (0..count).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
                runs.push((lba, entries));
            }
            volumes.push(VolumeImage {
                id,
                name,
                size,
                compression,
                runs,
            });
        }
        if r.remaining() != 0 {
            return Err(Error::corrupt("trailing bytes after the checkpoint"));
        }
        Ok(CheckpointImage {
            version,
            next_volume_id,
            segment_states,
            segment_space,
            segment_members,
            volumes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let mut w = CheckpointWriter::new(5, &[0, 1, 2], &[0, 7 << 20, 0], &[0, 0b1011, 0], 2);
        w.volume(1, "a", 1 << 20, 1);
        w.run(0, &[1, 2, 3]);
        w.run(100, &[9]);
        w.end_volume();
        w.volume(3, "volume-b", 4096, 0);
        w.end_volume();
        let buf = w.finish();
        let img = CheckpointImage::decode(&buf).unwrap();
        assert_eq!(img.version, CHECKPOINT_VERSION);
        assert_eq!(img.next_volume_id, 5);
        assert_eq!(img.segment_states, vec![0, 1, 2]);
        assert_eq!(img.segment_space, vec![0, 7 << 20, 0]);
        assert_eq!(img.segment_members, vec![0, 0b1011, 0]);
        assert_eq!(
            img.volumes[0].runs,
            vec![(0, vec![1, 2, 3]), (100, vec![9])]
        );
        assert_eq!(img.volumes[1].name, "volume-b");
        for n in 0..buf.len() {
            assert!(
                CheckpointImage::decode(&buf[..n]).is_err(),
                "truncated at {n}"
            );
        }
    }

    /// A version-4 checkpoint (space, no members) still decodes, with the members unknown.
    #[test]
    fn version_4_is_read_without_segment_members() {
        let v5 = CheckpointWriter::new(1, &[1, 0], &[9, 0], &[3, 0], 0).finish();
        // magic, version, next id, volumes, segments (20), states padded to 8 (24), space (40).
        assert_eq!(v5.len(), 56);
        let mut v4 = v5[..40].to_vec();
        v4[4..8].copy_from_slice(&4u32.to_le_bytes());
        let img = CheckpointImage::decode(&v4).unwrap();
        assert_eq!(img.version, 4);
        assert_eq!(img.segment_space, vec![9, 0]);
        assert!(img.segment_members.is_empty());
        // The same bytes called version 5 are short of their members.
        let mut short = v4.clone();
        short[4..8].copy_from_slice(&5u32.to_le_bytes());
        assert!(CheckpointImage::decode(&short).is_err());
    }

    /// A version-1 checkpoint (no segment space), as the first format wrote it, still decodes:
    /// with the space unknown.
    #[test]
    fn version_1_is_read_without_segment_space() {
        let mut w = Writer::with_capacity(256);
        w.bytes(&CP_MAGIC);
        w.u32(1);
        w.u32(4); // next volume id
        w.u32(1); // volumes
        w.u32(3); // segments
        w.bytes(&[1, 0, 2]);
        w.pad_to(8);
        w.u32(2);
        w.u16(1);
        w.u16(0);
        w.u64(8192);
        w.bytes(b"v");
        w.pad_to(8);
        w.u64(1);
        w.u64(1);
        w.u64(0xC000_0000_0000_0001);
        w.u64(END_OF_RUNS);
        w.u64(0);
        let img = CheckpointImage::decode(&w.buf).unwrap();
        assert_eq!(img.segment_states, vec![1, 0, 2]);
        assert!(img.segment_space.is_empty());
        assert!(img.segment_members.is_empty());
        assert_eq!(img.volumes[0].runs, vec![(1, vec![0xC000_0000_0000_0001])]);
        let mut future = w.buf.clone();
        future[4..8].copy_from_slice(&(CHECKPOINT_VERSION + 1).to_le_bytes());
        let err = CheckpointImage::decode(&future).unwrap_err().to_string();
        assert!(
            err.contains(&format!("checkpoint version {}", CHECKPOINT_VERSION + 1)),
            "{err}"
        );
    }
}
