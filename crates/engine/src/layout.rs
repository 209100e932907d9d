//! Where stripes go: segment states and, per write stream, the open segment and each drive's
//! fill pointer inside it.
//!
//! A segment is the same byte range on every drive, the unit the cleaner will reclaim. Inside
//! an open segment every drive has its own fill pointer; a stripe takes the w + m least-filled
//! healthy drives (ties broken by a rotation on the sequence number, so parity rotates), and a
//! narrow stripe (a flush of a partial stripe) advances only the drives it used. Nothing is
//! ever written twice at the same place until its segment is freed.

use crate::error::{Error, Result};
use crate::format::superblock::{Geometry, DATA_START};

/// State of a segment, as stored in checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum SegState {
    /// Holds nothing the pool needs; may be (re)used.
    Free = 0,
    /// Closed, holding data.
    Used = 1,
    /// Holds the latest checkpoint.
    Checkpoint = 2,
    /// A stream is appending to it.
    Open = 3,
    /// Cleaned by GC: holds nothing live, free once the next checkpoint no longer needs it.
    /// Never stored: a checkpoint writes it as Free.
    Reclaimed = 4,
}

impl SegState {
    /// Decodes a checkpoint state byte.
    pub fn from_u8(v: u8) -> Result<SegState> {
        Ok(match v {
            0 => SegState::Free,
            1 => SegState::Used,
            2 => SegState::Checkpoint,
            3 => SegState::Open,
            _ => return Err(Error::corrupt(format!("segment state {v}"))),
        })
    }

    /// Used or open: the segment holds data, and the space its stripes took (the cleaner's
    /// measure, kept by checkpoints) means something.
    pub fn holds_data(self) -> bool {
        matches!(self, SegState::Used | SegState::Open)
    }
}

/// The write streams, each with its own open segment, so data of different lifetimes does
/// not mix: host writes (hot), GC relocations (cold, survived a cleaning), checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// Host data and log records.
    Data = 0,
    /// Checkpoints.
    Checkpoint = 1,
    /// Blocks relocated by the cleaner.
    Gc = 2,
}

/// Drives and offsets reserved for one stripe when it is opened.
#[derive(Clone, Debug)]
pub struct StripePlan {
    pub segment: u32,
    /// Data drives (w_max of them) followed by the m parity drives.
    pub drives: Vec<u16>,
    /// Byte offset on each of those drives where its chunk will start.
    pub offsets: Vec<u64>,
    /// Data chunks this stripe may fill.
    pub w_max: usize,
    /// True when the segment was opened for this stripe (any cached scan of it is stale).
    pub fresh: bool,
    /// Sequence number of the first stripe of the segment's current fill (every chunk header
    /// carries it, so a scan tells this fill's stripes from an earlier fill's).
    pub fill_start: u64,
}

struct Cursor {
    segment: Option<u32>,
    fill: Vec<u64>,
    /// Sequence number of the first stripe of the segment's current fill.
    fill_start: u64,
}

/// The bit of member `d` in a member mask (`SegmentTable::drives_used`, a rebuild's lost
/// members); none for an index past the mask (only a corrupt header names one).
pub(crate) fn member_bit(d: usize) -> u64 {
    1u64.checked_shl(d as u32).unwrap_or(0)
}

/// The bits of members `0..n`.
pub(crate) fn member_mask(n: usize) -> u64 {
    (0..n).fold(0, |m, d| m | member_bit(d))
}

/// Segment states and stream cursors; owned by the writer lock.
pub struct SegmentTable {
    geo: Geometry,
    pub states: Vec<SegState>,
    cursors: [Cursor; 3],
    /// Free segments kept back so a checkpoint can always be written.
    reserve: usize,
    /// Extra free segments kept back from host writes for the cleaner.
    gc_reserve: usize,
    /// The checkpoint segments the next checkpoint keeps (the latest durable checkpoint's,
    /// and while one is being written, its own too); every other segment in state
    /// Checkpoint is freed when the next checkpoint starts, so it counts toward the room
    /// that checkpoint has (`available`). None: not known, every one counts as kept.
    cp_keep: Option<Vec<u32>>,
    /// Sequence number at which each segment was closed (its age, for cost-benefit GC).
    pub closed_seq: Vec<u64>,
    /// Bit d set when segment s may hold a chunk on drive d: what a rebuild tests. Kept by
    /// checkpoints (version 5 on) and the roll-forward; all bits where unknown (segments an
    /// older checkpoint recorded, until they are rewritten).
    pub drives_used: Vec<u64>,
    /// Times each segment was opened for a fill since the pool opened (in memory only): a
    /// reader that checks a segment's stripes without the writer lock (scrub) compares it
    /// before and after, since a segment freed and filled again meanwhile has other chunks.
    pub opened: Vec<u64>,
    next_seq_hint: u64,
}

impl SegmentTable {
    /// A table with every segment free.
    pub fn new(geo: &Geometry) -> Self {
        let n = geo.segment_count as usize;
        let cursor = || Cursor {
            segment: None,
            fill: vec![0; geo.drive_count as usize],
            fill_start: 0,
        };
        SegmentTable {
            geo: geo.clone(),
            states: vec![SegState::Free; n],
            cursors: [cursor(), cursor(), cursor()],
            reserve: 0,
            gc_reserve: 0,
            cp_keep: None,
            closed_seq: vec![0; n],
            drives_used: vec![u64::MAX; n],
            opened: vec![0; n],
            next_seq_hint: 0,
        }
    }

    /// Sets how many free segments only checkpoints may take, and how many more only the
    /// cleaner and checkpoints may take.
    pub fn set_reserve(&mut self, checkpoint: usize, gc: usize) {
        self.reserve = checkpoint;
        self.gc_reserve = gc;
    }

    /// A drive was added: `n` members, stripes `k` data chunks wide from now on.
    pub fn grow(&mut self, n: usize, k: usize) {
        self.geo.drive_count = n as u16;
        self.geo.k = k as u8;
        for c in self.cursors.iter_mut() {
            c.fill.resize(n, 0);
        }
    }

    /// Free segments below which host writes clean first (foreground GC).
    pub fn low_water(&self) -> usize {
        self.reserve + self.gc_reserve + 1
    }

    /// Sets the checkpoint segments the next checkpoint keeps (see `cp_keep`).
    pub fn set_checkpoint_kept(&mut self, segments: Vec<u32>) {
        self.cp_keep = Some(segments);
    }

    /// Adds segments to those the next checkpoint keeps (one being written).
    pub fn keep_checkpoint_segments(&mut self, segments: impl IntoIterator<Item = u32>) {
        if let Some(k) = self.cp_keep.as_mut() {
            k.extend(segments);
        }
    }

    /// Segments in state Checkpoint that the next checkpoint frees before it writes: the
    /// checkpoint before the latest (kept until then, so a crash while superblocks are
    /// rewritten always leaves a whole checkpoint behind).
    pub fn checkpoint_spare(&self) -> usize {
        let Some(keep) = &self.cp_keep else {
            return 0;
        };
        self.states
            .iter()
            .enumerate()
            .filter(|(i, s)| **s == SegState::Checkpoint && !keep.contains(&(*i as u32)))
            .count()
    }

    /// The room the reserves are measured against: free segments, and those the next
    /// checkpoint frees before it writes. The checkpoint's reserve is what the next
    /// checkpoint may take, and the previous one's segments are part of it: counting only
    /// free segments, a pool filled before its first checkpoint since creation (one
    /// checkpoint's segments held) lost a segment of the cleaner's reserve to the next one
    /// (two held from then on), and host writes needed one segment more than the reserves
    /// after every restart.
    pub fn available(&self) -> usize {
        self.free_count() + self.checkpoint_spare()
    }

    /// Byte offset on every drive where segment `s` starts.
    pub fn segment_base(geo: &Geometry, s: u32) -> u64 {
        DATA_START + s as u64 * geo.segment_size
    }

    /// The segment holding drive byte offset `off`.
    pub fn segment_of(geo: &Geometry, off: u64) -> u32 {
        (off.saturating_sub(DATA_START) / geo.segment_size) as u32
    }

    /// Whether a checkpoint that began at sequence number `cp_start` covers segment `s`
    /// (closed before it began: a recovery from it replays none of the segment's stripes).
    pub fn covered_by(&self, s: u32, cp_start: u64) -> bool {
        self.closed_seq[s as usize] < cp_start
    }

    /// Number of free segments.
    pub fn free_count(&self) -> usize {
        self.states.iter().filter(|s| **s == SegState::Free).count()
    }

    /// The segment a stream appends to, if any.
    pub fn open_segment(&self, stream: Stream) -> Option<u32> {
        self.cursors[stream as usize].segment
    }

    /// Closes a stream's open segment (it becomes Used, or stays as its stream wants).
    pub fn close(&mut self, stream: Stream) {
        if let Some(s) = self.cursors[stream as usize].segment.take() {
            self.states[s as usize] = match stream {
                Stream::Data | Stream::Gc => SegState::Used,
                Stream::Checkpoint => SegState::Checkpoint,
            };
            self.closed_seq[s as usize] = self.next_seq_hint;
        }
    }

    /// Opens a free segment for `stream`, its first stripe to be sequence number `seq`.
    fn open_new(&mut self, stream: Stream, urgent: bool, seq: u64) -> Result<u32> {
        let keep = match stream {
            Stream::Data | Stream::Gc if urgent => self.reserve,
            Stream::Data | Stream::Gc => self.reserve + self.gc_reserve,
            Stream::Checkpoint => 0,
        };
        if self.available() <= keep {
            return Err(Error::NoSpace);
        }
        let s = self
            .states
            .iter()
            .position(|s| *s == SegState::Free)
            .ok_or(Error::NoSpace)? as u32;
        self.close(stream);
        self.states[s as usize] = SegState::Open;
        self.drives_used[s as usize] = 0;
        self.opened[s as usize] += 1;
        let c = &mut self.cursors[stream as usize];
        c.segment = Some(s);
        c.fill.iter_mut().for_each(|f| *f = 0);
        c.fill_start = seq;
        Ok(s)
    }

    /// Reserves room for a stripe of up to `k` data chunks + `m` parity chunks, each needing
    /// at most `need` bytes, on healthy drives only. `urgent` lets a stripe that frees space
    /// (a trim, a volume delete, the cleaner's relocations) use the cleaner's reserve, so a full
    /// pool can always be emptied; writes that may take more room than they free (host data, a
    /// rebuild's relocations into narrower stripes) leave that reserve alone.
    pub fn plan(
        &mut self,
        stream: Stream,
        healthy: &[bool],
        need: u64,
        seq: u64,
        urgent: bool,
    ) -> Result<StripePlan> {
        let (k, m) = (self.geo.k as usize, self.geo.m as usize);
        let n = self.geo.drive_count as usize;
        let up = healthy.iter().filter(|h| **h).count();
        if up < m + 1 {
            return Err(Error::Unavailable(format!(
                "{up} healthy drives, need at least {}",
                m + 1
            )));
        }
        let w_max = k.min(up - m);
        let width = w_max + m;
        let z = self.geo.segment_size;
        self.next_seq_hint = seq;
        let mut fresh = false;
        for attempt in 0..2 {
            let c = &self.cursors[stream as usize];
            if let Some(seg) = c.segment {
                let mut cands: Vec<usize> = (0..n)
                    .filter(|&d| healthy[d] && c.fill[d] + need <= z)
                    .collect();
                if cands.len() >= width {
                    let rot = (seq % n as u64) as usize;
                    // The least-filled drives keep the segment balanced; rotating the roles
                    // inside that set by sequence number moves parity to every drive in turn.
                    cands.sort_by_key(|&d| (c.fill[d], (d + n - rot) % n));
                    cands.truncate(width);
                    cands.sort_unstable();
                    cands.rotate_left((seq % width as u64) as usize);
                    let base = Self::segment_base(&self.geo, seg);
                    return Ok(StripePlan {
                        segment: seg,
                        offsets: cands.iter().map(|&d| base + c.fill[d]).collect(),
                        drives: cands.iter().map(|&d| d as u16).collect(),
                        w_max,
                        fresh,
                        fill_start: c.fill_start,
                    });
                }
            }
            if attempt == 0 {
                self.open_new(stream, urgent, seq)?;
                fresh = true;
            }
        }
        Err(Error::invalid(format!(
            "a stripe needing {need} bytes per chunk does not fit a segment"
        )))
    }

    /// Records that `drive` now has data up to byte offset `end` in `stream`'s segment.
    pub fn advance(&mut self, stream: Stream, drive: u16, end: u64) {
        let seg = self.cursors[stream as usize]
            .segment
            .expect("advance without an open segment");
        let fill = end - Self::segment_base(&self.geo, seg);
        self.drives_used[seg as usize] |= 1 << drive;
        let f = &mut self.cursors[stream as usize].fill[drive as usize];
        debug_assert!(
            fill >= *f && fill <= self.geo.segment_size,
            "fill moves forward inside the segment"
        );
        *f = fill;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        Geometry {
            k: 2,
            k_max: 2,
            m: 1,
            drive_count: 4,
            chunk_size: 16384,
            segment_size: 1 << 20,
            segment_count: 3,
            drive_size: 8 << 20,
        }
    }

    /// The checkpoint before the latest is room for the next checkpoint (it frees it before
    /// it writes), and nothing else is: not the latest, not one being written, and none while
    /// the latest is not known.
    #[test]
    fn the_checkpoint_before_the_latest_counts_as_room() {
        let mut t = SegmentTable::new(&geo());
        t.set_reserve(1, 0);
        t.states[0] = SegState::Checkpoint;
        t.states[1] = SegState::Checkpoint;
        assert_eq!((t.checkpoint_spare(), t.available()), (0, 1), "unknown");
        t.set_checkpoint_kept(vec![1]);
        assert_eq!((t.checkpoint_spare(), t.available()), (1, 2));
        // Segment 2 is the last free one: hosts may take it, the checkpoint then has 0.
        assert!(t.open_new(Stream::Data, false, 1).is_ok());
        assert_eq!(t.available(), 1);
        assert!(matches!(
            t.open_new(Stream::Gc, true, 2),
            Err(Error::NoSpace)
        ));
        t.keep_checkpoint_segments([0]);
        assert_eq!(t.checkpoint_spare(), 0, "being written");
    }

    #[test]
    fn parity_rotates_and_segments_roll() {
        let mut t = SegmentTable::new(&geo());
        let healthy = [true; 4];
        let mut parity = vec![];
        for seq in 1..=8u64 {
            let p = t.plan(Stream::Data, &healthy, 20480, seq, false).unwrap();
            assert_eq!(p.drives.len(), 3);
            parity.push(p.drives[2]);
            // Parity and chunk 0 carry bigger headers: unequal advances must not pin parity.
            for (i, (d, off)) in p.drives.iter().zip(&p.offsets).enumerate() {
                let extra = if i == 0 || i == 2 { 4096 } else { 0 };
                t.advance(Stream::Data, *d, off + 20480 + extra);
            }
        }
        parity.sort();
        parity.dedup();
        assert_eq!(
            parity,
            vec![0, 1, 2, 3],
            "parity must rotate over every drive"
        );
        // Fill everything: the pool runs out of segments with a clear error.
        let mut err = None;
        for seq in 9..1000 {
            match t.plan(Stream::Data, &healthy, 20480, seq, false) {
                Ok(p) => p
                    .drives
                    .iter()
                    .zip(&p.offsets)
                    .for_each(|(d, o)| t.advance(Stream::Data, *d, o + 20480)),
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        assert!(matches!(err, Some(Error::NoSpace)));
    }

    #[test]
    fn degraded_plan_narrows() {
        let mut t = SegmentTable::new(&geo());
        let p = t
            .plan(Stream::Data, &[true, false, true, true], 20480, 1, false)
            .unwrap();
        assert_eq!(p.w_max, 2);
        assert!(!p.drives.contains(&1));
        let p = t
            .plan(Stream::Data, &[true, false, false, true], 20480, 1, false)
            .unwrap();
        assert_eq!((p.w_max, p.drives.len()), (1, 2));
        assert!(t
            .plan(Stream::Data, &[true, false, false, false], 20480, 1, false)
            .is_err());
    }
}
