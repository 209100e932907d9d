//! The checkpoint: the pool's whole metadata state at one point of the log (volumes, their
//! block maps, segment states), from which recovery rolls the log forward.
//!
//! It is written as ordinary erasure-coded stripes of kind `Checkpoint`; the superblock names
//! its sequence range, segments, length and CRC32C. Maps are stored as runs of consecutive
//! mapped blocks, so a dense volume costs 8 bytes per block and a sparse one 24 at worst.

use super::bytes::{Reader, Writer};
use super::FORMAT_VERSION;
use crate::error::{Error, Result};

const CP_MAGIC: [u8; 4] = *b"FPCP";
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
    pub next_volume_id: u32,
    /// One state byte per segment (see `SegmentState`).
    pub segment_states: Vec<u8>,
    pub volumes: Vec<VolumeImage>,
}

/// Streams a checkpoint out without first copying the maps.
pub struct CheckpointWriter {
    w: Writer,
}

impl CheckpointWriter {
    /// Starts a checkpoint with the pool-wide fields.
    pub fn new(next_volume_id: u32, segment_states: &[u8], volume_count: u32) -> Self {
        let mut w = Writer::with_capacity(1 << 16);
        w.bytes(&CP_MAGIC);
        w.u32(FORMAT_VERSION);
        w.u32(next_volume_id);
        w.u32(volume_count);
        w.u32(segment_states.len() as u32);
        w.bytes(segment_states);
        w.pad_to(8);
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
        if version != FORMAT_VERSION {
            return Err(Error::corrupt(format!("checkpoint version {version}")));
        }
        let next_volume_id = r.u32()?;
        let nvol = r.u32()? as usize;
        let nseg = r.u32()? as usize;
        let segment_states = r.take(nseg)?.to_vec();
        r.align(8)?;
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
            next_volume_id,
            segment_states,
            volumes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let mut w = CheckpointWriter::new(5, &[0, 1, 2], 2);
        w.volume(1, "a", 1 << 20, 1);
        w.run(0, &[1, 2, 3]);
        w.run(100, &[9]);
        w.end_volume();
        w.volume(3, "volume-b", 4096, 0);
        w.end_volume();
        let buf = w.finish();
        let img = CheckpointImage::decode(&buf).unwrap();
        assert_eq!(img.next_volume_id, 5);
        assert_eq!(img.segment_states, vec![0, 1, 2]);
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
}
