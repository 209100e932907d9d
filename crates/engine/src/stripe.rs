//! The open stripe: an in-memory stripe that host blocks and log records are appended to, and
//! its sealing into chunks (data, parity, headers) ready to write.
//!
//! Buffer layout: chunk i (data then parity) owns region i of `hmax + chunk_size` bytes; its
//! header is written right before its data, so header and data go out in one aligned write.
//! Data fills chunk 0, then chunk 1, and so on, so a block's place is fixed when it is
//! appended, and a flush can seal any prefix as a narrower stripe (w < k) with no padding.

use crate::aligned::AlignedBuf;
use crate::codec::ErasureCode;
use crate::compress::{raw_with_crc, RAW_WITH_CRC};
use crate::error::Result;
use crate::format::header::{header_len, ChunkHeader, ChunkLoc, Record, StripeKind};
use crate::format::{round_up_block, BLOCK};
use crate::layout::StripePlan;
use parking_lot::RwLock;
use std::sync::Arc;

/// A stripe buffer shared with readers while its blocks are not yet on the drives.
pub struct StripeBuf {
    pub seq: u64,
    /// Taken back (set to None) when the stripe is on the drives.
    pub data: RwLock<Option<AlignedBuf>>,
}

/// Sizes every stripe of a pool shares.
#[derive(Clone, Copy, Debug)]
pub struct StripeShape {
    pub k: usize,
    pub m: usize,
    pub chunk_size: usize,
    /// Byte budget of one stripe's records.
    pub record_budget: usize,
    /// Room kept for the largest header.
    pub hmax: usize,
}

impl StripeShape {
    /// The shape for k + m chunks of `chunk_size` bytes.
    pub fn new(k: usize, m: usize, chunk_size: usize) -> Self {
        // Room for one write record per block at 2:1 compression (relocations' records are the
        // longest, 32 bytes), plus trims and volume changes.
        let record_budget = (2 * k * chunk_size / BLOCK + 64) * 32 + 512;
        let hmax = header_len(k + m, None) + round_up_block(record_budget);
        StripeShape {
            k,
            m,
            chunk_size,
            record_budget,
            hmax,
        }
    }

    /// Bytes of one chunk region in a stripe buffer.
    pub fn region(&self) -> usize {
        self.hmax + self.chunk_size
    }

    /// Bytes of a whole stripe buffer.
    pub fn buffer_len(&self) -> usize {
        (self.k + self.m.max(1)) * self.region()
    }

    /// Most bytes one chunk takes on a drive.
    pub fn chunk_need(&self) -> u64 {
        self.region() as u64
    }
}

/// A stripe being filled.
pub struct OpenStripe {
    pub seq: u64,
    pub kind: StripeKind,
    pub plan: StripePlan,
    pub buf: Arc<StripeBuf>,
    shape: StripeShape,
    chunk: usize,
    fill: usize,
    pub records: Vec<Record>,
    record_bytes: usize,
    /// Bytes of data chunks written only to fill them out (packing tails).
    padding: usize,
    /// Per data chunk, the CRC32C of its first bytes and how many, folded from the CRCs of
    /// the blocks appended in order (`crc::combine`); None when something else wrote there.
    /// Sealing turns it into the chunk's CRC without reading the chunk again.
    crc_runs: Vec<Option<(u32, usize)>>,
}

impl OpenStripe {
    pub fn new(
        seq: u64,
        kind: StripeKind,
        plan: StripePlan,
        buf: Arc<StripeBuf>,
        shape: StripeShape,
    ) -> Self {
        OpenStripe {
            seq,
            kind,
            plan,
            buf,
            shape,
            chunk: 0,
            fill: 0,
            // One write record per uncompressed block (and a few more) without regrowing: the
            // records vector was reallocated ~8 times per stripe, ~1 % of a 4 KiB write.
            records: Vec::with_capacity(shape.k * shape.chunk_size / BLOCK + 8),
            record_bytes: 0,
            padding: 0,
            crc_runs: Vec::new(),
        }
    }

    /// `len` bytes whose CRC32C is `crc` were stored at offset `off` of data chunk `chunk`.
    fn extend_crc_run(&mut self, chunk: usize, off: usize, len: usize, crc: u32) {
        if self.crc_runs.len() <= chunk {
            self.crc_runs.resize(chunk + 1, Some((0, 0)));
        }
        let run = &mut self.crc_runs[chunk];
        *run = match *run {
            Some((c, upto)) if upto == off => Some((crate::crc::combine(c, crc, len), off + len)),
            _ => None,
        };
    }

    /// Zeroes bytes `off..end` of data chunk `chunk` (a tail no block fills) and folds them
    /// into the chunk's CRC run.
    fn zero_tail(&mut self, chunk: usize, off: usize, end: usize) {
        let (from, to) = (self.data_pos(chunk, off), self.data_pos(chunk, end));
        let crc = self.buf.data.write().as_mut().map(|b| {
            b[from..to].fill(0);
            crate::crc::checksum(&b[from..to])
        });
        if let Some(c) = crc {
            self.extend_crc_run(chunk, off, end - off, c);
        }
    }

    /// True when nothing was appended.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.chunk == 0 && self.fill == 0
    }

    fn data_pos(&self, chunk: usize, off: usize) -> usize {
        chunk * self.shape.region() + self.shape.hmax + off
    }

    /// Where the next `len` bytes would go, moving to the next chunk when this one is full.
    fn place(&mut self, len: usize) -> Option<(usize, usize)> {
        if self.fill + len > self.shape.chunk_size {
            if self.chunk + 1 >= self.plan.w_max {
                return None;
            }
            // The chunk's unused tail is written as zeros: padding.
            self.zero_tail(self.chunk, self.fill, self.shape.chunk_size);
            self.padding += self.shape.chunk_size - self.fill;
            self.chunk += 1;
            self.fill = 0;
        }
        (self.chunk < self.plan.w_max).then_some((self.chunk, self.fill))
    }

    /// True when `rec` fits the record budget.
    pub fn has_record_room(&self, rec: &Record) -> bool {
        self.record_bytes + rec.encoded_len() <= self.shape.record_budget
    }

    /// Appends a log record; false when the budget is spent (seal, then retry).
    pub fn push_record(&mut self, rec: Record) -> bool {
        if !self.has_record_room(&rec) {
            return false;
        }
        self.record_bytes += rec.encoded_len();
        self.records.push(rec);
        true
    }

    /// Appends one stored block with its write record; returns its byte offset in the buffer
    /// and its stored length, or None when the stripe is full (seal, then retry). A raw 4 KiB
    /// block lands 4 KiB-aligned when it can; off alignment (after packed blocks) it is stored
    /// with its CRC32C in a trailer, so every stored form but the aligned one carries a full
    /// checksum. `crc` is the CRC32C of `data`; `from` is the map entry a relocation moves
    /// the block from, `stamp` the record's stamp (see `Record::Write`).
    #[allow(clippy::too_many_arguments)]
    pub fn append_block(
        &mut self,
        vol: u32,
        lba: u64,
        data: &[u8],
        crc: u32,
        flags: u8,
        from: Option<u64>,
        stamp: Option<u64>,
    ) -> Option<(u32, u32)> {
        debug_assert!(data.len() <= RAW_WITH_CRC && data.len().is_multiple_of(32));
        let probe = Record::Write {
            vol,
            lba,
            chunk: 0,
            offset: 0,
            len: data.len() as u16,
            flags,
            crc,
            from,
            stamp,
        };
        if !self.has_record_room(&probe) {
            return None;
        }
        let raw = data.len() == BLOCK;
        let want = if raw && !self.fill.is_multiple_of(BLOCK) {
            RAW_WITH_CRC
        } else {
            data.len()
        };
        let (chunk, off) = self.place(want)?;
        let trailer = raw && !off.is_multiple_of(BLOCK);
        let len = if trailer { RAW_WITH_CRC } else { data.len() };
        let pos = self.data_pos(chunk, off);
        let crc = {
            let mut g = self.buf.data.write();
            let b = g.as_mut().expect("open stripe owns its buffer");
            if trailer {
                raw_with_crc(data, crc, &mut b[pos..pos + len])
            } else {
                b[pos..pos + len].copy_from_slice(data);
                crc
            }
        };
        self.extend_crc_run(chunk, off, len, crc);
        self.fill += len;
        let rec = Record::Write {
            vol,
            lba,
            chunk: chunk as u8,
            offset: off as u32,
            len: len as u16,
            flags,
            crc,
            from,
            stamp,
        };
        self.push_record(rec);
        Some((pos as u32, len as u32))
    }

    /// Appends raw bytes (checkpoint payload); returns how many fit.
    pub fn append_bytes(&mut self, data: &[u8]) -> usize {
        let mut done = 0;
        while done < data.len() {
            let room = self.shape.chunk_size - self.fill;
            if room == 0 {
                if self.place(1).is_none() {
                    break;
                }
                continue;
            }
            let n = room.min(data.len() - done);
            let pos = self.data_pos(self.chunk, self.fill);
            let crc = crate::crc::checksum(&data[done..done + n]);
            self.extend_crc_run(self.chunk, self.fill, n, crc);
            {
                let mut g = self.buf.data.write();
                g.as_mut().expect("open stripe owns its buffer")[pos..pos + n]
                    .copy_from_slice(&data[done..done + n]);
            }
            self.fill += n;
            done += n;
        }
        done
    }

    /// True when no further block fits.
    pub fn is_full(&self) -> bool {
        (self.chunk + 1 >= self.plan.w_max && self.fill + BLOCK > self.shape.chunk_size)
            || self.record_bytes + 32 > self.shape.record_budget
    }

    /// Data bytes appended so far.
    pub fn payload_bytes(&self) -> usize {
        self.chunk * self.shape.chunk_size + self.fill
    }

    /// Fixes the stripe's final shape: data width, chunk lengths, headers and drive offsets.
    pub fn seal(mut self, pool_uuid: [u8; 16]) -> SealedStripe {
        let s = self.shape;
        let w = if self.fill == 0 {
            self.chunk
        } else {
            self.chunk + 1
        };
        let data_lens: Vec<usize> = (0..w)
            .map(|j| {
                if j + 1 < w {
                    s.chunk_size
                } else {
                    round_up_block(self.fill)
                }
            })
            .collect();
        if w > 0 && self.fill > 0 {
            // The last chunk's tail up to a whole block is written as zeros too.
            self.zero_tail(w - 1, self.fill, data_lens[w - 1]);
        }
        let parity_len = data_lens.first().copied().unwrap_or(0);
        let padding = self.padding
            + if w > 0 {
                round_up_block(self.fill) - self.fill
            } else {
                0
            };
        // Chunk i of the stripe -> slot in the plan (drives/offsets) and buffer region.
        let mut slots: Vec<usize> = (0..w).collect();
        if w == 0 {
            slots.push(0); // a record-only stripe keeps one header copy on data drive 0
        }
        slots.extend(self.plan.w_max..self.plan.w_max + s.m);
        let nchunks = slots.len();
        let full_hdr = header_len(nchunks, Some(&self.records)) / BLOCK;
        let short_hdr = header_len(nchunks, None) / BLOCK;
        debug_assert!(
            full_hdr * BLOCK <= s.hmax,
            "records overflow the header room"
        );
        let chunks: Vec<ChunkLoc> = slots
            .iter()
            .enumerate()
            .map(|(i, &slot)| {
                let full = i == 0 || i >= w.max(1);
                let len = if i < w { data_lens[i] } else { parity_len };
                ChunkLoc {
                    drive: self.plan.drives[slot],
                    hdr_blocks: if full { full_hdr } else { short_hdr } as u16,
                    len: len as u32,
                    offset: self.plan.offsets[slot],
                    crc: 0,
                }
            })
            .collect();
        // Buffer region of chunk i: data chunks use their own; parity chunks follow the k data
        // regions; the header-only chunk of a record-only stripe uses region 0.
        let regions: Vec<usize> = (0..nchunks)
            .map(|i| {
                if i < w.max(1) {
                    i
                } else {
                    s.k + (i - w.max(1))
                }
            })
            .collect();
        SealedStripe {
            seq: self.seq,
            kind: self.kind,
            segment: self.plan.segment,
            fill_start: self.plan.fill_start,
            w,
            m: s.m,
            parity_len,
            chunks,
            regions,
            records: self.records,
            padding,
            crc_runs: self.crc_runs,
            buf: self.buf,
            shape: s,
            pool_uuid,
        }
    }
}

/// A stripe whose shape is fixed, ready to encode and write.
pub struct SealedStripe {
    pub seq: u64,
    pub kind: StripeKind,
    pub segment: u32,
    /// First stripe of the segment's current fill (`StripePlan::fill_start`).
    pub fill_start: u64,
    pub w: usize,
    pub m: usize,
    pub parity_len: usize,
    pub chunks: Vec<ChunkLoc>,
    regions: Vec<usize>,
    pub records: Vec<Record>,
    /// Bytes of the data chunks that are packing tails, not data.
    pub padding: usize,
    /// The data chunks' CRCs as folded while they filled (see `OpenStripe::crc_runs`).
    crc_runs: Vec<Option<(u32, usize)>>,
    pub buf: Arc<StripeBuf>,
    pub shape: StripeShape,
    pool_uuid: [u8; 16],
}

/// One write a sealed stripe needs: `len` bytes from buffer position `pos` to `offset` on
/// `drive`, of which `hdr` bytes are header.
#[derive(Clone, Copy, Debug)]
pub struct ChunkWrite {
    pub drive: u16,
    pub offset: u64,
    pub pos: usize,
    pub len: usize,
    pub hdr: usize,
    pub parity: bool,
}

impl SealedStripe {
    /// Computes parity and CRCs and writes every chunk's header into the buffer; returns the
    /// drive writes to issue.
    pub fn encode(&mut self, codec: &dyn ErasureCode) -> Result<Vec<ChunkWrite>> {
        let s = self.shape;
        let region = s.region();
        let mut guard = self.buf.data.write();
        let buf = guard.as_mut().expect("sealed stripe owns its buffer");
        let l = self.parity_len;
        if self.w > 0 {
            // Zero-extend short data chunks to the parity length.
            for j in 0..self.w {
                let start = j * region + s.hmax + self.chunks[j].len as usize;
                buf[start..j * region + s.hmax + l].fill(0);
            }
            if self.m > 0 {
                let (data_part, parity_part) = buf.split_at_mut(s.k * region);
                let data: Vec<&[u8]> = (0..self.w)
                    .map(|j| &data_part[j * region + s.hmax..j * region + s.hmax + l])
                    .collect();
                let mut parity: Vec<&mut [u8]> = parity_part
                    .chunks_mut(region)
                    .take(self.m)
                    .map(|r| &mut r[s.hmax..s.hmax + l])
                    .collect();
                codec.encode(&data, &mut parity)?;
            }
        }
        for (i, c) in self.chunks.iter_mut().enumerate() {
            let start = self.regions[i] * region + s.hmax;
            let bytes = &buf[start..start + c.len as usize];
            // A data chunk filled in order has its CRC already; parity is read once here.
            c.crc = match self.crc_runs.get(i) {
                Some(&Some((crc, upto))) if i < self.w && upto == c.len as usize => {
                    debug_assert_eq!(crc, crate::crc::checksum(bytes), "folded CRC of chunk {i}");
                    crc
                }
                _ => crate::crc::checksum(bytes),
            };
        }
        let mut writes = Vec::with_capacity(self.chunks.len());
        for i in 0..self.chunks.len() {
            let full = i == 0 || i >= self.w.max(1);
            let hdr = ChunkHeader {
                kind: self.kind,
                pool_uuid: self.pool_uuid,
                seq: self.seq,
                segment: self.segment,
                fill_start: self.fill_start,
                this_chunk: i as u8,
                w: self.w as u8,
                m: self.m as u8,
                parity_len: l as u32,
                chunks: self.chunks.clone(),
                records: full.then(|| self.records.clone()),
            }
            .encode();
            debug_assert_eq!(hdr.len(), self.chunks[i].hdr_blocks as usize * BLOCK);
            let data_start = self.regions[i] * region + s.hmax;
            buf[data_start - hdr.len()..data_start].copy_from_slice(&hdr);
            writes.push(ChunkWrite {
                drive: self.chunks[i].drive,
                offset: self.chunks[i].offset,
                pos: data_start - hdr.len(),
                len: hdr.len() + self.chunks[i].len as usize,
                hdr: hdr.len(),
                parity: i >= self.w,
            });
        }
        Ok(writes)
    }

    /// Buffer offset of data chunk `j`'s first byte.
    pub fn data_pos(&self, j: usize) -> usize {
        self.regions[j] * self.shape.region() + self.shape.hmax
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(kind: StripeKind, garbage: u8) -> OpenStripe {
        let shape = StripeShape::new(4, 1, 16384);
        let mut buf = AlignedBuf::zeroed(shape.buffer_len());
        buf.fill(garbage); // a reused buffer: stale bytes everywhere
        let plan = StripePlan {
            segment: 3,
            drives: (0..5).collect(),
            offsets: vec![1 << 20; 5],
            w_max: 4,
            fresh: false,
            fill_start: 9,
        };
        let sb = Arc::new(StripeBuf {
            seq: 9,
            data: RwLock::new(Some(buf)),
        });
        OpenStripe::new(9, kind, plan, sb, shape)
    }

    /// Every data chunk's CRC comes from the blocks' CRCs (no second pass over the data), and
    /// equals the CRC of what is written: raw blocks, packed ones, raw ones after packed ones
    /// (with a trailer), tails zeroed over a reused buffer.
    #[test]
    fn chunk_crcs_fold_from_block_crcs() {
        let mut o = open(StripeKind::Data, 0xA5);
        let mut lba = 0;
        let mut push = |o: &mut OpenStripe, data: Vec<u8>| {
            let crc = crate::crc::checksum(&data);
            lba += 1;
            o.append_block(1, lba, &data, crc, 0, None, None).is_some()
        };
        assert!(push(&mut o, vec![1; BLOCK]));
        assert!(push(&mut o, vec![2; 1056])); // packed
        assert!(push(&mut o, vec![3; BLOCK])); // raw off alignment: trailer
        while !o.is_full() {
            if !push(&mut o, (0..BLOCK).map(|i| i as u8).collect()) {
                break;
            }
        }
        // A short last chunk: seal a stripe two blocks into its second chunk.
        let mut short = open(StripeKind::Data, 0x5A);
        for i in 0..6 {
            assert!(push(&mut short, vec![i; if i == 4 { 608 } else { BLOCK }]));
        }
        for o in [o, short] {
            let mut s = o.seal([7; 16]);
            assert!(s.w >= 2);
            for i in 0..s.w {
                let run = s.crc_runs[i].expect("every data chunk filled in order");
                assert_eq!(
                    run.1, s.chunks[i].len as usize,
                    "chunk {i} folded to its end"
                );
            }
            let codec = crate::codec::XorParity;
            s.encode(&codec).unwrap();
            let g = s.buf.data.read();
            let b = g.as_ref().unwrap();
            for (i, c) in s.chunks.iter().enumerate() {
                let start = s.regions[i] * s.shape.region() + s.shape.hmax;
                assert_eq!(
                    c.crc,
                    crate::crc::checksum(&b[start..start + c.len as usize])
                );
            }
        }
    }
}
