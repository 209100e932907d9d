//! The per-drive superblock: who this drive is, the pool's geometry, and where the latest
//! checkpoint lives. Two slots (blocks 0 and 1) are written alternately by generation, so a
//! torn superblock write always leaves the previous one intact.

use super::bytes::{crc_with_hole, Reader, Writer};
use super::{BLOCK, FORMAT_VERSION};
use crate::error::{Error, Result};

/// Magic at the start of every superblock.
pub const SB_MAGIC: [u8; 8] = *b"FLPOOLSB";
/// Offset of the checksum field.
const CRC_AT: usize = 12;
/// Most drives a pool may have.
pub const MAX_DRIVES: usize = 64;
/// Most segments one checkpoint may span (what fits in the superblock).
pub const MAX_CHECKPOINT_SEGMENTS: usize = 480;
/// A member in service.
pub const MEMBER_ACTIVE: u8 = 0;
/// A member out of service whose data is not yet rebuilt elsewhere.
pub const MEMBER_FAILED: u8 = 1;
/// A member out of service that nothing depends on any more (rebuilt or removed).
pub const MEMBER_RETIRED: u8 = 2;
/// Byte offset of the first data segment on every drive.
pub const DATA_START: u64 = 1 << 20;

/// The pool's shape, identical on every drive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Data chunks of a full stripe now.
    pub k: u8,
    /// Widest data width stripes may grow to as drives are added.
    pub k_max: u8,
    /// Parity chunks of every stripe.
    pub m: u8,
    /// Drives in the pool.
    pub drive_count: u16,
    /// Bytes of data per chunk (a multiple of 4 KiB).
    pub chunk_size: u32,
    /// Bytes of each segment on each drive.
    pub segment_size: u64,
    /// Segments per drive.
    pub segment_count: u32,
    /// Bytes of each drive the pool uses.
    pub drive_size: u64,
}

/// Where the latest checkpoint is: its stripes' sequence range and segments, length and CRC.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointRef {
    /// First sequence number of the checkpoint's stripes (0: no checkpoint yet).
    pub seq_start: u64,
    /// Last sequence number of the checkpoint's stripes; roll-forward starts after it.
    pub seq_end: u64,
    /// Length in bytes of the encoded checkpoint.
    pub len: u64,
    /// CRC32C of the encoded checkpoint.
    pub crc: u32,
    /// Segments holding the checkpoint's stripes.
    pub segments: Vec<u32>,
}

/// One drive's superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub pool_uuid: [u8; 16],
    pub drive_index: u16,
    /// UUID of every member drive, by index.
    pub members: Vec<[u8; 16]>,
    /// State of every member: `MEMBER_ACTIVE`, `MEMBER_FAILED` (out of service, data on it
    /// not yet rebuilt elsewhere) or `MEMBER_RETIRED` (out of service, nothing depends on it).
    pub member_state: Vec<u8>,
    pub geometry: Geometry,
    /// Bumped on every superblock write; the highest valid one wins.
    pub generation: u64,
    pub checkpoint: CheckpointRef,
}

impl Superblock {
    /// Encodes into one 4 KiB block.
    pub fn encode(&self) -> Vec<u8> {
        let g = &self.geometry;
        let mut w = Writer::with_capacity(BLOCK);
        w.bytes(&SB_MAGIC);
        w.u32(FORMAT_VERSION);
        w.u32(0); // crc
        w.bytes(&self.pool_uuid);
        w.u16(self.drive_index);
        w.u16(g.drive_count);
        w.u8(g.k);
        w.u8(g.m);
        w.u8(g.k_max);
        w.u8(0);
        w.u32(g.chunk_size);
        w.u32(g.segment_count);
        w.u64(g.segment_size);
        w.u64(g.drive_size);
        w.u64(self.generation);
        let c = &self.checkpoint;
        w.u64(c.seq_start);
        w.u64(c.seq_end);
        w.u64(c.len);
        w.u32(c.crc);
        w.u32(c.segments.len() as u32);
        for s in &c.segments {
            w.u32(*s);
        }
        for m in &self.members {
            w.bytes(m);
        }
        for st in &self.member_state {
            w.u8(*st);
        }
        assert!(w.buf.len() <= BLOCK, "superblock overflows its block");
        w.buf.resize(BLOCK, 0);
        let crc = crc_with_hole(&w.buf, CRC_AT);
        w.buf[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        w.buf
    }

    /// Decodes and validates one superblock block.
    pub fn decode(buf: &[u8]) -> Result<Superblock> {
        if buf.len() < BLOCK {
            return Err(Error::corrupt("superblock shorter than a block"));
        }
        let buf = &buf[..BLOCK];
        let mut r = Reader::new(buf, "superblock");
        if r.array::<8>()? != SB_MAGIC {
            return Err(Error::corrupt("no flashpool superblock (bad magic)"));
        }
        let version = r.u32()?;
        if version != FORMAT_VERSION {
            return Err(Error::corrupt(format!(
                "superblock format version {version}, this build reads {FORMAT_VERSION}"
            )));
        }
        let crc = r.u32()?;
        if crc != crc_with_hole(buf, CRC_AT) {
            return Err(Error::corrupt("superblock checksum mismatch"));
        }
        let pool_uuid = r.array::<16>()?;
        let drive_index = r.u16()?;
        let drive_count = r.u16()?;
        let k = r.u8()?;
        let m = r.u8()?;
        // 0: written before the field existed; the pool never widens.
        let k_max = match r.u8()? {
            0 => k,
            w => w,
        };
        r.u8()?;
        let chunk_size = r.u32()?;
        let segment_count = r.u32()?;
        let segment_size = r.u64()?;
        let drive_size = r.u64()?;
        let generation = r.u64()?;
        let seq_start = r.u64()?;
        let seq_end = r.u64()?;
        let len = r.u64()?;
        let cp_crc = r.u32()?;
        let nseg = r.u32()? as usize;
        if nseg > MAX_CHECKPOINT_SEGMENTS {
            return Err(Error::corrupt(format!(
                "superblock lists {nseg} checkpoint segments"
            )));
        }
        let segments = (0..nseg).map(|_| r.u32()).collect::<Result<Vec<_>>>()?;
        let geometry = Geometry {
            k,
            k_max,
            m,
            drive_count,
            chunk_size,
            segment_size,
            segment_count,
            drive_size,
        };
        validate_geometry(&geometry)
            .map_err(|e| Error::corrupt(format!("superblock geometry: {e}")))?;
        if drive_index >= drive_count {
            return Err(Error::corrupt(format!(
                "drive index {drive_index} of {drive_count} drives"
            )));
        }
        let members = (0..drive_count)
            .map(|_| r.array::<16>())
            .collect::<Result<Vec<_>>>()?;
        let member_state = (0..drive_count)
            .map(|_| r.u8())
            .collect::<Result<Vec<_>>>()?;
        if member_state.iter().any(|s| *s > MEMBER_RETIRED) {
            return Err(Error::corrupt("unknown member state"));
        }
        if segments.iter().any(|&s| s >= segment_count) {
            return Err(Error::corrupt("checkpoint segment out of range"));
        }
        Ok(Superblock {
            pool_uuid,
            drive_index,
            members,
            member_state,
            geometry,
            generation,
            checkpoint: CheckpointRef {
                seq_start,
                seq_end,
                len,
                crc: cp_crc,
                segments,
            },
        })
    }

    /// Byte offset of the slot this generation is written to.
    pub fn slot_offset(generation: u64) -> u64 {
        (generation % 2) * BLOCK as u64
    }
}

/// Checks that a geometry is one this build can run (on creation and on decode); the error
/// says what is wrong, for the caller to wrap.
pub fn validate_geometry(g: &Geometry) -> std::result::Result<(), String> {
    let bad = |m: String| Err(m);
    if g.drive_count == 0 || g.drive_count as usize > MAX_DRIVES {
        return bad(format!("{} drives (1 to {MAX_DRIVES})", g.drive_count));
    }
    if g.k == 0 || g.k > g.k_max || g.m > 4 || (g.k_max + g.m) as usize > MAX_DRIVES {
        return bad(format!(
            "protection {}+{} (widest {}+{})",
            g.k, g.m, g.k_max, g.m
        ));
    }
    if (g.k + g.m) as usize > g.drive_count as usize {
        return bad(format!(
            "protection {}+{} on {} drives",
            g.k, g.m, g.drive_count
        ));
    }
    if g.chunk_size == 0 || !g.chunk_size.is_multiple_of(BLOCK as u32) || g.chunk_size > (2 << 20) {
        return bad(format!(
            "chunk size {} (4 KiB multiple, at most 2 MiB)",
            g.chunk_size
        ));
    }
    if !g.segment_size.is_multiple_of(BLOCK as u64)
        || g.segment_size < 4 * (g.chunk_size as u64 + 8 * BLOCK as u64)
    {
        return bad(format!(
            "segment size {} too small for chunk size {}",
            g.segment_size, g.chunk_size
        ));
    }
    if g.segment_count == 0 || DATA_START + g.segment_count as u64 * g.segment_size > g.drive_size {
        return bad(format!(
            "{} segments do not fit drives of {} bytes",
            g.segment_count, g.drive_size
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn sample() -> Superblock {
        Superblock {
            pool_uuid: [7; 16],
            drive_index: 2,
            members: vec![[1; 16], [2; 16], [3; 16]],
            member_state: vec![MEMBER_ACTIVE, MEMBER_FAILED, MEMBER_RETIRED],
            geometry: Geometry {
                k: 2,
                k_max: 8,
                m: 1,
                drive_count: 3,
                chunk_size: 16384,
                segment_size: 1 << 20,
                segment_count: 4,
                drive_size: 8 << 20,
            },
            generation: 9,
            checkpoint: CheckpointRef {
                seq_start: 3,
                seq_end: 5,
                len: 100,
                crc: 42,
                segments: vec![1, 2],
            },
        }
    }

    #[test]
    fn round_trip() {
        let sb = sample();
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
    }

    #[test]
    fn every_bit_flip_is_caught() {
        let enc = sample().encode();
        for bit in (0..BLOCK * 8).step_by(7) {
            let mut b = enc.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(Superblock::decode(&b).is_err(), "bit {bit}");
        }
        assert!(Superblock::decode(&vec![0u8; BLOCK]).is_err());
        assert!(Superblock::decode(&enc[..100]).is_err());
    }
}
