//! The stripe chunk header: written in front of every chunk of every stripe, so each chunk on
//! a drive describes itself and a recovery scan can walk a segment drive by drive.
//!
//! Every header holds the stripe's sequence number and its chunk table (where every chunk of
//! the stripe lives, its length and CRC32C). The "full" headers, on data chunk 0 and on every
//! parity chunk (m + 1 copies, so any m lost drives leave one), also hold the stripe's
//! records: which volume blocks it stores and the trims and volume changes it logs.

use super::bytes::{crc_with_hole, Reader, Writer};
use super::{round_up_block, BLOCK, FORMAT_VERSION};
use crate::error::{Error, Result};

/// Magic at the start of every chunk header.
pub const HDR_MAGIC: [u8; 4] = *b"FPSH";
const CRC_AT: usize = 12;
const FIXED_LEN: usize = 64;
const CHUNK_ENTRY_LEN: usize = 24;
/// Longest volume name.
pub const MAX_NAME_LEN: usize = 255;

/// What a stripe carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StripeKind {
    /// Volume data and log records.
    Data = 0,
    /// A piece of a checkpoint.
    Checkpoint = 1,
}

/// Where one chunk of a stripe lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkLoc {
    /// Drive index.
    pub drive: u16,
    /// Header blocks in front of the chunk's data.
    pub hdr_blocks: u16,
    /// Bytes of data written after the header (a 4 KiB multiple).
    pub len: u32,
    /// Byte offset of the chunk's header on the drive.
    pub offset: u64,
    /// CRC32C of the chunk's `len` data bytes.
    pub crc: u32,
}

impl ChunkLoc {
    /// Byte offset on the drive of the chunk's first data byte.
    pub fn data_offset(&self) -> u64 {
        self.offset + self.hdr_blocks as u64 * BLOCK as u64
    }
    /// Byte offset just past the chunk.
    pub fn end(&self) -> u64 {
        self.data_offset() + self.len as u64
    }
}

/// One entry of a stripe's log.
///
/// `stamp`: the record's place in the pool's history, from a pool-wide counter taken under
/// the writer lock as the record is appended (so in the order the maps changed). Logs after a
/// version-4 checkpoint stamp every record but segment-free ones, and recovery applies them
/// in stamp order, not stripe order: a move applies without the write it moved, and a stripe
/// of an emptied segment may be overwritten before the next checkpoint. A stamped record is
/// encoded as the unstamped one with bit 7 of its kind set, followed by the stamp (u64).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// Volume block `lba` is stored in data chunk `chunk` at byte `offset` (a 32-byte multiple),
    /// `len` bytes long, with CRC32C `crc` of those bytes.
    ///
    /// `from` (unstamped logs only): a relocation (the cleaner, a rebuild, a repair) moved the
    /// block from the location whose encoded map entry this is, and applies only while the
    /// block is still there. A host write into an older stripe (opened before the
    /// relocation's, filled after it) may come later in time but earlier in the log: replaying
    /// the move unconditionally would bring the old contents back. Kind 1 without, kind 8
    /// with. A stamped write needs no `from`: the stamps order it.
    Write {
        vol: u32,
        lba: u64,
        chunk: u8,
        offset: u32,
        len: u16,
        flags: u8,
        crc: u32,
        from: Option<u64>,
        stamp: Option<u64>,
    },
    /// Segment `segment` is free from this point of the log on: the cleaner emptied it, the
    /// latest checkpoint covers every stripe it held, and the moves of its blocks come before
    /// this record. Recovery scans it for newer stripes from here (it may be written again).
    SegmentFree { segment: u32 },
    /// Blocks `[lba, lba + count)` of a volume now read as zeros.
    Trim {
        vol: u32,
        lba: u64,
        count: u64,
        stamp: Option<u64>,
    },
    /// A volume was created (`compression`: 0 off, 1 lz4, 2 zstd).
    VolumeCreate {
        vol: u32,
        size: u64,
        name: String,
        compression: u8,
        stamp: Option<u64>,
    },
    /// A volume's compression setting changed.
    VolumeCompression {
        vol: u32,
        compression: u8,
        stamp: Option<u64>,
    },
    /// A volume was deleted.
    VolumeDelete { vol: u32, stamp: Option<u64> },
    /// A volume was resized.
    VolumeResize {
        vol: u32,
        size: u64,
        stamp: Option<u64>,
    },
}

/// Bit 7 of a record's kind: the record ends with its stamp.
const STAMPED: u8 = 0x80;

impl Record {
    /// The record's stamp, if it has one (segment-free records never do).
    pub fn stamp(&self) -> Option<u64> {
        match self {
            Record::Write { stamp, .. }
            | Record::Trim { stamp, .. }
            | Record::VolumeCreate { stamp, .. }
            | Record::VolumeCompression { stamp, .. }
            | Record::VolumeDelete { stamp, .. }
            | Record::VolumeResize { stamp, .. } => *stamp,
            Record::SegmentFree { .. } => None,
        }
    }

    /// Encoded length in bytes.
    pub fn encoded_len(&self) -> usize {
        let body = match self {
            Record::Write { from: None, .. } | Record::Trim { .. } => 24,
            Record::Write { from: Some(_), .. } => 32,
            Record::VolumeCreate { name, .. } => 16 + name.len().div_ceil(8) * 8,
            Record::VolumeDelete { .. }
            | Record::VolumeCompression { .. }
            | Record::SegmentFree { .. } => 8,
            Record::VolumeResize { .. } => 16,
        };
        body + if self.stamp().is_some() { 8 } else { 0 }
    }

    fn encode(&self, w: &mut Writer) {
        let start = w.buf.len();
        match self {
            Record::Write {
                vol,
                lba,
                chunk,
                offset,
                len,
                flags,
                crc,
                from,
                stamp,
            } => {
                debug_assert!(offset % 32 == 0 && *offset < (1 << 21));
                debug_assert!(*from != Some(0), "a relocation moves a mapped block");
                debug_assert!(
                    from.is_none() || stamp.is_none(),
                    "a stamped write names no origin"
                );
                w.u8(if from.is_some() { 8 } else { 1 });
                w.u8(*chunk);
                w.u8(*flags);
                w.u8(0);
                w.u32(*vol);
                w.u64(*lba);
                w.u16((offset / 32) as u16);
                w.u16(*len);
                w.u32(*crc);
                if let Some(f) = from {
                    w.u64(*f);
                }
            }
            Record::SegmentFree { segment } => {
                w.bytes(&[7, 0, 0, 0]);
                w.u32(*segment);
            }
            Record::Trim {
                vol, lba, count, ..
            } => {
                w.bytes(&[2, 0, 0, 0]);
                w.u32(*vol);
                w.u64(*lba);
                w.u64(*count);
            }
            Record::VolumeCreate {
                vol,
                size,
                name,
                compression,
                ..
            } => {
                w.u8(3);
                w.u8(name.len() as u8);
                w.u8(*compression);
                w.u8(0);
                w.u32(*vol);
                w.u64(*size);
                w.bytes(name.as_bytes());
                w.pad_to(8);
            }
            Record::VolumeDelete { vol, .. } => {
                w.bytes(&[4, 0, 0, 0]);
                w.u32(*vol);
            }
            Record::VolumeResize { vol, size, .. } => {
                w.bytes(&[5, 0, 0, 0]);
                w.u32(*vol);
                w.u64(*size);
            }
            Record::VolumeCompression {
                vol, compression, ..
            } => {
                w.bytes(&[6, *compression, 0, 0]);
                w.u32(*vol);
            }
        }
        if let Some(stamp) = self.stamp() {
            w.buf[start] |= STAMPED;
            w.u64(stamp);
        }
        debug_assert_eq!(w.buf.len() - start, self.encoded_len());
    }

    fn decode(r: &mut Reader) -> Result<Record> {
        let kind = r.u8()?;
        let stamped = kind & STAMPED != 0;
        let mut rec = match kind & !STAMPED {
            1 | 8 => {
                if kind == 8 | STAMPED {
                    return Err(Error::corrupt("stamped relocation record"));
                }
                let chunk = r.u8()?;
                let flags = r.u8()?;
                r.u8()?;
                let vol = r.u32()?;
                let lba = r.u64()?;
                let offset = r.u16()? as u32 * 32;
                let len = r.u16()?;
                let crc = r.u32()?;
                if len == 0 || len as usize > BLOCK + 32 {
                    return Err(Error::corrupt(format!("write record of {len} bytes")));
                }
                let from = if kind == 8 {
                    match r.u64()? {
                        0 => return Err(Error::corrupt("relocation of an unmapped block")),
                        f => Some(f),
                    }
                } else {
                    None
                };
                Record::Write {
                    vol,
                    lba,
                    chunk,
                    offset,
                    len,
                    flags,
                    crc,
                    from,
                    stamp: None,
                }
            }
            7 => {
                if stamped {
                    return Err(Error::corrupt("stamped segment-free record"));
                }
                r.take(3)?;
                Record::SegmentFree { segment: r.u32()? }
            }
            2 => {
                r.take(3)?;
                Record::Trim {
                    vol: r.u32()?,
                    lba: r.u64()?,
                    count: r.u64()?,
                    stamp: None,
                }
            }
            3 => {
                let n = r.u8()? as usize;
                let compression = r.u8()?;
                r.u8()?;
                let vol = r.u32()?;
                let size = r.u64()?;
                let name = std::str::from_utf8(r.take(n)?)
                    .map_err(|_| Error::corrupt("volume name is not UTF-8"))?
                    .to_owned();
                r.align(8)?;
                Record::VolumeCreate {
                    vol,
                    size,
                    name,
                    compression,
                    stamp: None,
                }
            }
            4 => {
                r.take(3)?;
                Record::VolumeDelete {
                    vol: r.u32()?,
                    stamp: None,
                }
            }
            5 => {
                r.take(3)?;
                Record::VolumeResize {
                    vol: r.u32()?,
                    size: r.u64()?,
                    stamp: None,
                }
            }
            6 => {
                let compression = r.u8()?;
                r.take(2)?;
                Record::VolumeCompression {
                    vol: r.u32()?,
                    compression,
                    stamp: None,
                }
            }
            k => return Err(Error::corrupt(format!("unknown record kind {k}"))),
        };
        if stamped {
            let s = r.u64()?;
            if s == 0 {
                return Err(Error::corrupt("record stamp 0"));
            }
            rec.set_stamp(s);
        }
        Ok(rec)
    }

    /// Gives the record a stamp (segment-free records take none).
    pub fn set_stamp(&mut self, s: u64) {
        match self {
            Record::Write { stamp, .. }
            | Record::Trim { stamp, .. }
            | Record::VolumeCreate { stamp, .. }
            | Record::VolumeCompression { stamp, .. }
            | Record::VolumeDelete { stamp, .. }
            | Record::VolumeResize { stamp, .. } => *stamp = Some(s),
            Record::SegmentFree { .. } => {
                debug_assert!(false, "segment-free records take no stamp")
            }
        }
    }
}

/// A decoded chunk header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub kind: StripeKind,
    pub pool_uuid: [u8; 16],
    pub seq: u64,
    pub segment: u32,
    /// Sequence number of the first stripe of this fill of the segment (the stripe that
    /// opened it since it was last free), so a scan tells this fill's stripes from an earlier
    /// fill's left on a drive that ignored the discard; 0 where unknown (written before the
    /// field, which was reserved).
    pub fill_start: u64,
    /// Index of this chunk in `chunks`.
    pub this_chunk: u8,
    /// Data chunks (the first `w` entries of `chunks`; the rest are parity).
    pub w: u8,
    /// Parity chunks.
    pub m: u8,
    /// Length of every parity chunk; data chunks are zero-extended to it for coding.
    pub parity_len: u32,
    pub chunks: Vec<ChunkLoc>,
    /// The stripe's log, present in full headers only.
    pub records: Option<Vec<Record>>,
}

/// Bytes a header takes on the drive, in whole blocks.
pub fn header_len(nchunks: usize, records: Option<&[Record]>) -> usize {
    let rec: usize = records.map_or(0, |r| r.iter().map(Record::encoded_len).sum());
    header_len_with(nchunks, rec)
}

/// `header_len` for a header of `nchunks` chunk entries and `record_bytes` bytes of records.
pub fn header_len_with(nchunks: usize, record_bytes: usize) -> usize {
    round_up_block(FIXED_LEN + nchunks * CHUNK_ENTRY_LEN + record_bytes)
}

impl ChunkHeader {
    /// Encodes into whole blocks (the length `header_len` gives).
    pub fn encode(&self) -> Vec<u8> {
        let records = self.records.as_deref();
        let total = header_len(self.chunks.len(), records);
        let mut w = Writer::with_capacity(total);
        w.bytes(&HDR_MAGIC);
        w.u16(FORMAT_VERSION as u16);
        w.u8(self.kind as u8);
        w.u8(records.is_some() as u8);
        w.u32(total as u32);
        w.u32(0); // crc
        w.bytes(&self.pool_uuid);
        w.u64(self.seq);
        w.u32(self.segment);
        w.u8(self.this_chunk);
        w.u8(self.w);
        w.u8(self.m);
        w.u8(self.chunks.len() as u8);
        w.u32(self.parity_len);
        w.u32(records.map_or(0, |r| r.len() as u32));
        w.u64(self.fill_start);
        debug_assert_eq!(w.buf.len(), FIXED_LEN);
        for c in &self.chunks {
            w.u16(c.drive);
            w.u16(c.hdr_blocks);
            w.u32(c.len);
            w.u64(c.offset);
            w.u32(c.crc);
            w.u32(0);
        }
        for r in records.unwrap_or(&[]) {
            r.encode(&mut w);
        }
        w.buf.resize(total, 0);
        let crc = crc_with_hole(&w.buf, CRC_AT);
        w.buf[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        w.buf
    }

    /// Total header length a header's first block announces, if that block looks like a
    /// header of `pool_uuid`; used by scans to know how much more to read.
    pub fn peek_len(first_block: &[u8], pool_uuid: &[u8; 16]) -> Option<usize> {
        if first_block.len() < FIXED_LEN
            || first_block[..4] != HDR_MAGIC
            || &first_block[16..32] != pool_uuid
        {
            return None;
        }
        let len = u32::from_le_bytes(first_block[8..12].try_into().ok()?) as usize;
        (len >= BLOCK && len.is_multiple_of(BLOCK) && len <= 64 * BLOCK).then_some(len)
    }

    /// Decodes and validates a whole header.
    pub fn decode(buf: &[u8]) -> Result<ChunkHeader> {
        let mut r = Reader::new(buf, "chunk header");
        if r.array::<4>()? != HDR_MAGIC {
            return Err(Error::corrupt("not a chunk header"));
        }
        let version = r.u16()? as u32;
        if version != FORMAT_VERSION {
            return Err(Error::corrupt(format!("chunk header version {version}")));
        }
        let kind = match r.u8()? {
            0 => StripeKind::Data,
            1 => StripeKind::Checkpoint,
            k => return Err(Error::corrupt(format!("unknown stripe kind {k}"))),
        };
        let full = r.u8()? & 1 == 1;
        let total = r.u32()? as usize;
        if total < FIXED_LEN || total > buf.len() || !total.is_multiple_of(BLOCK) {
            return Err(Error::corrupt(format!("chunk header length {total}")));
        }
        let crc = r.u32()?;
        if crc != crc_with_hole(&buf[..total], CRC_AT) {
            return Err(Error::corrupt("chunk header checksum mismatch"));
        }
        let pool_uuid = r.array::<16>()?;
        let seq = r.u64()?;
        let segment = r.u32()?;
        let this_chunk = r.u8()?;
        let w = r.u8()?;
        let m = r.u8()?;
        let nchunks = r.u8()? as usize;
        let parity_len = r.u32()?;
        let nrec = r.u32()? as usize;
        let fill_start = r.u64()?;
        if fill_start > seq {
            return Err(Error::corrupt(format!(
                "stripe {seq} says its segment's fill began at stripe {fill_start}"
            )));
        }
        let expect = if w == 0 {
            m as usize + 1
        } else {
            w as usize + m as usize
        };
        if nchunks != expect || this_chunk as usize >= nchunks {
            return Err(Error::corrupt(format!(
                "chunk header with {nchunks} chunks, w={w} m={m}"
            )));
        }
        let mut chunks = Vec::with_capacity(nchunks);
        for _ in 0..nchunks {
            let drive = r.u16()?;
            let hdr_blocks = r.u16()?;
            let len = r.u32()?;
            let offset = r.u64()?;
            let crc = r.u32()?;
            r.u32()?;
            if hdr_blocks == 0 || len % BLOCK as u32 != 0 || len > parity_len {
                return Err(Error::corrupt("bad chunk table entry"));
            }
            chunks.push(ChunkLoc {
                drive,
                hdr_blocks,
                len,
                offset,
                crc,
            });
        }
        let records = if full {
            let mut recs = Vec::with_capacity(nrec.min(total / 8));
            let mut rr = Reader::new(&buf[r.pos()..total], "chunk header records");
            for _ in 0..nrec {
                recs.push(Record::decode(&mut rr)?);
            }
            Some(recs)
        } else {
            None
        };
        Ok(ChunkHeader {
            kind,
            pool_uuid,
            seq,
            segment,
            fill_start,
            this_chunk,
            w,
            m,
            parity_len,
            chunks,
            records,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(records: bool) -> ChunkHeader {
        ChunkHeader {
            kind: StripeKind::Data,
            pool_uuid: [9; 16],
            seq: 77,
            segment: 3,
            fill_start: 70,
            this_chunk: 1,
            w: 2,
            m: 1,
            parity_len: 8192,
            chunks: (0..3)
                .map(|i| ChunkLoc {
                    drive: i,
                    hdr_blocks: 1,
                    len: 8192,
                    offset: 1 << 20,
                    crc: i as u32,
                })
                .collect(),
            records: records.then(|| {
                vec![
                    Record::Write {
                        vol: 1,
                        lba: 5,
                        chunk: 0,
                        offset: 4096,
                        len: 4096,
                        flags: 0,
                        crc: 3,
                        from: None,
                        stamp: None,
                    },
                    Record::Write {
                        vol: 1,
                        lba: 6,
                        chunk: 1,
                        offset: 96,
                        len: 1024,
                        flags: 1,
                        crc: 4,
                        from: Some(0xC000_0000_0100_0007),
                        stamp: None,
                    },
                    Record::Write {
                        vol: 1,
                        lba: 7,
                        chunk: 1,
                        offset: 4096,
                        len: 4128,
                        flags: 0,
                        crc: 5,
                        from: None,
                        stamp: Some(1 << 40),
                    },
                    Record::SegmentFree { segment: 11 },
                    Record::Trim {
                        vol: 1,
                        lba: 9,
                        count: 100,
                        stamp: None,
                    },
                    Record::Trim {
                        vol: 1,
                        lba: 19,
                        count: 3,
                        stamp: Some(12),
                    },
                    Record::VolumeCreate {
                        vol: 2,
                        size: 1 << 30,
                        name: "db-volume".into(),
                        compression: 2,
                        stamp: None,
                    },
                    Record::VolumeCreate {
                        vol: 3,
                        size: 1 << 20,
                        name: "x".into(),
                        compression: 0,
                        stamp: Some(13),
                    },
                    Record::VolumeCompression {
                        vol: 2,
                        compression: 1,
                        stamp: None,
                    },
                    Record::VolumeCompression {
                        vol: 3,
                        compression: 2,
                        stamp: Some(14),
                    },
                    Record::VolumeResize {
                        vol: 2,
                        size: 1 << 31,
                        stamp: None,
                    },
                    Record::VolumeResize {
                        vol: 3,
                        size: 1 << 21,
                        stamp: Some(15),
                    },
                    Record::VolumeDelete {
                        vol: 1,
                        stamp: None,
                    },
                    Record::VolumeDelete {
                        vol: 3,
                        stamp: Some(16),
                    },
                ]
            }),
        }
    }

    #[test]
    fn round_trip_full_and_short() {
        for full in [false, true] {
            let h = sample(full);
            let enc = h.encode();
            assert_eq!(enc.len() % BLOCK, 0);
            assert_eq!(ChunkHeader::peek_len(&enc, &[9; 16]), Some(enc.len()));
            assert_eq!(ChunkHeader::decode(&enc).unwrap(), h);
        }
    }

    #[test]
    fn a_fill_that_starts_after_its_stripe_is_refused() {
        let mut h = sample(false);
        h.fill_start = h.seq + 1;
        let err = ChunkHeader::decode(&h.encode()).unwrap_err().to_string();
        assert!(err.contains("fill began at stripe"), "{err}");
    }

    #[test]
    fn stamped_kinds_that_cannot_exist_are_refused() {
        let mut h = sample(true);
        h.records = Some(vec![Record::SegmentFree { segment: 1 }]);
        let mut enc = h.encode();
        let at = FIXED_LEN + h.chunks.len() * CHUNK_ENTRY_LEN;
        enc[at] |= STAMPED; // a segment-free record with a stamp bit (no stamp follows)
        let crc = crc_with_hole(&enc, CRC_AT);
        enc[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        let err = ChunkHeader::decode(&enc).unwrap_err().to_string();
        assert!(err.contains("stamped segment-free"), "{err}");
    }

    #[test]
    fn corruption_is_an_error_not_a_panic() {
        let enc = sample(true).encode();
        for bit in (0..enc.len() * 8).step_by(5) {
            let mut b = enc.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(ChunkHeader::decode(&b).is_err(), "bit {bit}");
        }
        for n in [0, 10, 63, 64, 100] {
            assert!(ChunkHeader::decode(&enc[..n]).is_err());
        }
    }
}
