//! Finding stripes on the drives by their self-describing chunk headers: a walk reads one
//! drive's chunks of a segment from the segment start, header after header, until one does not
//! check out; a segment scan merges the walks of every usable drive into stripe descriptors
//! (the drives walked at once where they wait for a device: [`Inner::walk_all`]).

use crate::aligned::AlignedBuf;
use crate::error::{Error, Result};
use crate::format::header::{ChunkHeader, ChunkLoc, Record, StripeKind};
use crate::format::BLOCK;
use crate::layout::SegmentTable;
use crate::pool::Inner;
use crate::stats::Stats;
use crate::stripe_index::SegmentStripes;
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
    /// Which of its data chunks lies on drive `d` over byte `off` of it, if one does.
    pub(crate) fn data_chunk_covering(&self, d: usize, off: u64) -> Option<usize> {
        self.chunks[..self.w]
            .iter()
            .position(|c| c.drive as usize == d && c.data_offset() <= off && off < c.end())
    }

    /// The members its chunks (data and parity) are on, as a mask.
    pub(crate) fn members(&self) -> u64 {
        self.chunks
            .iter()
            .fold(0, |m, c| m | crate::layout::member_bit(c.drive as usize))
    }

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

/// A block a stripe's records say it holds, which the volume's map still points at.
pub(crate) struct LiveBlock {
    pub vol: Arc<crate::pool::VolumeState>,
    pub lba: u64,
    /// Index of its chunk in the stripe, and where in the chunk's data it lies.
    pub chunk: usize,
    pub offset: usize,
    pub len: usize,
    pub flags: u8,
    pub crc: u32,
    /// The map entry that points at it here (a move must find it unchanged).
    pub entry: u64,
}

impl Inner {
    /// The blocks of stripe `desc` (from its records, when a full header copy was read) that
    /// the maps still point at: the ones a move must take along, or a lost chunk took.
    pub(crate) fn live_blocks(&self, desc: &StripeDesc) -> Vec<LiveBlock> {
        let mut out = Vec::new();
        for r in desc.records.iter().flatten() {
            let Record::Write {
                vol,
                lba,
                chunk,
                offset,
                len,
                flags,
                crc,
                ..
            } = *r
            else {
                continue;
            };
            let (Some(c), Some(v)) = (desc.chunks.get(chunk as usize), self.volume_by_id(vol))
            else {
                continue;
            };
            let entry = crate::map::Entry::in_chunk(c, offset, len, crc).encode();
            if v.map.get(lba) == entry {
                out.push(LiveBlock {
                    vol: v,
                    lba,
                    chunk: chunk as usize,
                    offset: offset as usize,
                    len: len as usize,
                    flags,
                    crc,
                    entry,
                });
            }
        }
        out
    }

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

    /// Every drive's walk of segment `seg`, by drive. A walk is one header read after another
    /// (each header says where the next chunk starts), so on drives that wait for a device
    /// (file and block devices: a few hundred synchronous reads per drive and segment, tens
    /// to hundreds of milliseconds on a virtual disk) the drives are walked at once, a thread
    /// each; memory and simulated drives, which answer at once, are walked in turn on the
    /// caller's thread, which keeps a single-threaded caller's I/O order (the simulation's)
    /// as it was. Either way each drive's reads keep their order and the walks come back in
    /// drive order, so the result does not depend on which finished first.
    pub(crate) fn walk_all(&self, seg: u32) -> Vec<Vec<ChunkHeader>> {
        let n = self.drives.len();
        let waits = |d: usize| {
            self.drives[d]
                .usable()
                .is_some_and(|dr| dr.fd_target().is_some())
        };
        if n < 2 || (0..n).filter(|&d| waits(d)).count() < 2 {
            return (0..n).map(|d| self.walk(d, seg)).collect();
        }
        std::thread::scope(|s| {
            let walks: Vec<_> = (0..n)
                .map(|d| {
                    let thread = if waits(d) {
                        std::thread::Builder::new()
                            .name("segment-scan".into())
                            .spawn_scoped(s, move || self.walk(d, seg))
                            .ok()
                    } else {
                        None
                    };
                    (d, thread)
                })
                .collect();
            walks
                .into_iter()
                .map(|(d, h)| match h {
                    Some(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                    // Not worth a thread, or none could be started: walked here.
                    None => self.walk(d, seg),
                })
                .collect()
        })
    }

    /// Every stripe found in segment `seg` on the usable drives, by sequence number; records
    /// are kept when `with_records`.
    pub(crate) fn scan_segment(&self, seg: u32, with_records: bool) -> BTreeMap<u64, StripeDesc> {
        let mut found: BTreeMap<u64, StripeDesc> = BTreeMap::new();
        for walk in self.walk_all(seg) {
            for mut h in walk {
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

    /// Scans segment `seg` and keeps what it found in the stripe index (replacing an older
    /// scan). A segment reused meanwhile leaves a stale entry, which the read path checks
    /// and rescans.
    pub(crate) fn index_segment(&self, seg: u32) -> SegmentStripes {
        let found: SegmentStripes = Arc::new(self.scan_segment(seg, false).into_values().collect());
        self.seg_index.lock().insert(seg, found.clone());
        found
    }

    /// The stripe whose data chunk on drive `d` covers byte `off`, from a cached scan of its
    /// segment (rescanned once on a miss, since the segment may have grown).
    pub(crate) fn find_stripe(&self, d: usize, off: u64) -> Result<(StripeDesc, usize)> {
        let seg = SegmentTable::segment_of(&self.geo, off);
        for rescan in [false, true] {
            let cached = self.seg_index.lock().get(seg);
            let index = match cached {
                Some(i) if !rescan => i,
                _ => self.index_segment(seg),
            };
            let hit = index
                .iter()
                .rev()
                .filter(|s| s.kind == StripeKind::Data)
                .find_map(|s| s.data_chunk_covering(d, off).map(|j| (s.clone(), j)));
            if let Some(h) = hit {
                return Ok(h);
            }
        }
        Err(Error::Unavailable(format!(
            "no stripe found covering drive {d} offset {off}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use crate::drive::{DriveRef, FileDrive};
    use crate::{Compression, Pool, PoolConfig};
    use std::sync::Arc;

    /// On file drives a segment's drives are walked at once (`walk_all`), and each walk comes
    /// back, in drive order, as walking the drives in turn gives it.
    #[test]
    fn walking_file_drives_at_once_finds_what_walking_them_in_turn_does() {
        let dir = tempfile::tempdir().unwrap();
        let drives: Vec<DriveRef> = (0..5)
            .map(|i| {
                let d = FileDrive::create(&dir.path().join(format!("d{i}.img")), 16 << 20);
                Arc::new(d.unwrap()) as DriveRef
            })
            .collect();
        assert!(
            drives.iter().all(|d| d.fd_target().is_some()),
            "file drives wait for a device: the threaded walk is the one under test"
        );
        let cfg = PoolConfig {
            k: 4,
            m: 1,
            chunk_size: 16 << 10,
            segment_size: 1 << 20,
            checkpoint_interval: 1 << 30,
        };
        let pool = Pool::create(drives, &cfg).unwrap();
        pool.create_volume_with("v", 8 << 20, Compression::Off)
            .unwrap();
        let vol = pool.volume("v").unwrap();
        // Three segments' worth of writes with trims among them (records besides writes).
        for lba in 0..900u64 {
            let mut b = vec![(lba % 251) as u8; 4096];
            b[0] = !b[1];
            vol.write(lba * 4096, &b).unwrap();
            if lba % 97 == 0 {
                vol.trim(lba.saturating_sub(3) * 4096, 4096).unwrap();
            }
        }
        pool.flush().unwrap();
        let inner = &pool.inner;
        let mut scanned = 0;
        for seg in 0..inner.geo.segment_count {
            // Each drive's walk, in drive order, as walking them in turn gives it.
            let walks = inner.walk_all(seg);
            let turns: Vec<_> = (0..inner.drives.len())
                .map(|d| inner.walk(d, seg))
                .collect();
            assert_eq!(format!("{walks:?}"), format!("{turns:?}"), "segment {seg}");
            // The scan built from them (`scan_segment`) finds the segment's stripes.
            let at_once = inner.scan_segment(seg, true);
            scanned += at_once.len();
        }
        assert!(scanned >= 40, "stripes found: {scanned}");
    }
}
