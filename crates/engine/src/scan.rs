//! Finding stripes on the drives by their self-describing chunk headers: a walk reads one
//! drive's chunks of a segment from the segment start, header after header, until one does not
//! check out; a segment scan merges the walks of every usable drive into stripe descriptors.

use crate::aligned::AlignedBuf;
use crate::error::{Error, Result};
use crate::format::header::{ChunkHeader, ChunkLoc, Record, StripeKind};
use crate::format::BLOCK;
use crate::layout::SegmentTable;
use crate::pool::Inner;
use crate::stats::Stats;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a chunk header says about its stripe.
#[derive(Clone, Debug)]
pub struct StripeDesc {
    pub seq: u64,
    pub kind: StripeKind,
    pub segment: u32,
    pub w: usize,
    pub m: usize,
    pub parity_len: usize,
    pub chunks: Vec<ChunkLoc>,
    /// The stripe's log, when a full header copy was read.
    pub records: Option<Vec<Record>>,
}

impl StripeDesc {
    fn from_header(h: ChunkHeader) -> Self {
        StripeDesc {
            seq: h.seq,
            kind: h.kind,
            segment: h.segment,
            w: h.w as usize,
            m: h.m as usize,
            parity_len: h.parity_len as usize,
            chunks: h.chunks,
            records: h.records,
        }
    }
}

impl Inner {
    /// Reads the headers of drive `d`'s chunks in segment `seg`, in order.
    pub(crate) fn walk(&self, d: usize, seg: u32) -> Vec<ChunkHeader> {
        let Some(drive) = self.drives[d].usable() else {
            return Vec::new();
        };
        let base = SegmentTable::segment_base(&self.geo, seg);
        let end = base + self.geo.segment_size;
        let mut pos = base;
        let mut out = Vec::new();
        let mut first = AlignedBuf::zeroed(BLOCK);
        while pos + BLOCK as u64 <= end {
            if drive.read_at(pos, &mut first).is_err() {
                break;
            }
            Stats::add(&self.stats.media_read_bytes, BLOCK as u64);
            let Some(len) = ChunkHeader::peek_len(&first, &self.uuid) else {
                break;
            };
            let hdr = if len == BLOCK {
                ChunkHeader::decode(&first)
            } else {
                let mut full = AlignedBuf::zeroed(len);
                if pos + len as u64 > end || drive.read_at(pos, &mut full).is_err() {
                    break;
                }
                Stats::add(&self.stats.media_read_bytes, len as u64);
                ChunkHeader::decode(&full)
            };
            let Ok(h) = hdr else { break };
            let me = h.chunks[h.this_chunk as usize];
            if h.segment != seg || me.drive as usize != d || me.offset != pos || me.end() > end {
                break;
            }
            pos = me.end();
            out.push(h);
        }
        out
    }

    /// Every stripe found in segment `seg` on the usable drives, by sequence number; records
    /// are kept when `with_records`.
    pub(crate) fn scan_segment(&self, seg: u32, with_records: bool) -> BTreeMap<u64, StripeDesc> {
        let mut found: BTreeMap<u64, StripeDesc> = BTreeMap::new();
        for d in 0..self.drives.len() {
            for mut h in self.walk(d, seg) {
                if !with_records {
                    h.records = None;
                }
                match found.get_mut(&h.seq) {
                    Some(prev) => {
                        if prev.records.is_none() && h.records.is_some() {
                            prev.records = h.records;
                        }
                    }
                    None => {
                        found.insert(h.seq, StripeDesc::from_header(h));
                    }
                }
            }
        }
        found
    }

    /// The stripe whose data chunk on drive `d` covers byte `off`, from a cached scan of its
    /// segment (rescanned once on a miss, since the segment may have grown).
    pub(crate) fn find_stripe(&self, d: usize, off: u64) -> Result<(StripeDesc, usize)> {
        let seg = SegmentTable::segment_of(&self.geo, off);
        for rescan in [false, true] {
            let cached = self.seg_index.lock().get(&seg).cloned();
            let index = match cached {
                Some(i) if !rescan => i,
                _ => {
                    let i: Arc<Vec<StripeDesc>> =
                        Arc::new(self.scan_segment(seg, false).into_values().collect());
                    self.seg_index.lock().insert(seg, i.clone());
                    i
                }
            };
            let hit = index
                .iter()
                .rev()
                .filter(|s| s.kind == StripeKind::Data)
                .find_map(|s| {
                    s.chunks[..s.w]
                        .iter()
                        .position(|c| {
                            c.drive as usize == d && c.data_offset() <= off && off < c.end()
                        })
                        .map(|j| (s.clone(), j))
                });
            if let Some(h) = hit {
                return Ok(h);
            }
        }
        Err(Error::Unavailable(format!(
            "no stripe found covering drive {d} offset {off}"
        )))
    }
}
