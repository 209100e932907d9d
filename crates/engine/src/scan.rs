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
    /// First stripe of the segment fill it belongs to (0: unknown).
    pub fill_start: u64,
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
            fill_start: h.fill_start,
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
        let base = SegmentTable::segment_base(&self.geo, seg);
        let mut pos = base;
        let mut out = Vec::new();
        while let Some(h) = self.header_at(d, seg, pos) {
            pos = h.chunks[h.this_chunk as usize].end();
            out.push(h);
        }
        out
    }

    /// The chunk header at byte `pos` of drive `d`, if one of segment `seg` is there (and
    /// its chunk ends inside the segment).
    fn header_at(&self, d: usize, seg: u32, pos: u64) -> Option<ChunkHeader> {
        let drive = self.drives[d].usable()?;
        let end = SegmentTable::segment_base(&self.geo, seg) + self.geo.segment_size;
        if pos + BLOCK as u64 > end {
            return None;
        }
        let mut first = AlignedBuf::zeroed(BLOCK);
        drive.read_at(pos, &mut first).ok()?;
        Stats::add(&self.stats.media_read_bytes, BLOCK as u64);
        let len = ChunkHeader::peek_len(&first, &self.uuid)?;
        let h = if len == BLOCK {
            ChunkHeader::decode(&first)
        } else {
            let mut full = AlignedBuf::zeroed(len);
            if pos + len as u64 > end || drive.read_at(pos, &mut full).is_err() {
                return None;
            }
            Stats::add(&self.stats.media_read_bytes, len as u64);
            ChunkHeader::decode(&full)
        }
        .ok()?;
        let me = h.chunks[h.this_chunk as usize];
        (h.segment == seg && me.drive as usize == d && me.offset == pos && me.end() <= end)
            .then_some(h)
    }

    /// Whether segment `seg` was opened again after sequence number `after` (emptied and
    /// reused, or free until then), and if so the sequence number its newest fill starts at:
    /// a fill starts at the segment's beginning, so the first chunk header on some drive
    /// belongs to it, and every chunk header of a fill names the fill's first stripe (the
    /// newest fill names the highest; stripes below it are left over from an earlier fill). A
    /// fill that began at or before `after` and went on past it is not a new one. For headers
    /// written before they named it, the first header's own sequence number stands in. One
    /// header read per drive.
    pub(crate) fn rewritten_since(&self, seg: u32, after: u64) -> Option<u64> {
        let base = SegmentTable::segment_base(&self.geo, seg);
        (0..self.drives.len())
            .filter_map(|d| self.header_at(d, seg, base))
            .map(|h| {
                if h.fill_start > 0 {
                    h.fill_start
                } else {
                    h.seq
                }
            })
            .max()
            .filter(|&start| start > after)
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
