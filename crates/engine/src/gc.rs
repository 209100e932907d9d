//! The cleaner: picks a victim segment, relocates its live blocks into the GC stream, and
//! marks it Reclaimed; a log record or the next checkpoint frees it (`reuse`).
//!
//! Liveness is exact and cheap: a write record in the victim is live when its volume's map
//! entry still points at the record's location. A block overwritten while it is being moved is
//! skipped (the relocation is a compare-and-swap on the map under the writer lock). A segment is
//! reclaimed only when its live byte count has reached zero, so no live block is ever dropped,
//! and it is reused only once recovery no longer needs it (see `reuse`). In a stamped log (every
//! pool made now) a move is an ordinary write record, applied in stamp order; in an older
//! unstamped log its record names where the block came from, and a recovery applies it only
//! if the block is still there.

use crate::error::{Error, Result};
use crate::format::header::{ChunkLoc, Record, StripeKind};
use crate::layout::{SegState, Stream};
use crate::map::Entry;
use crate::pool::Inner;
use crate::stats::Stats;
use std::sync::atomic::Ordering;

/// How the cleaner picks its victim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GcPolicy {
    /// The segment with the fewest live bytes.
    #[default]
    Greedy,
    /// The segment maximising (1 - u) * age / (1 + u), u its live fraction (Rosenblum and
    /// Ousterhout's LFS cost-benefit): old, cold segments are cleaned at higher utilisation.
    CostBenefit,
}

impl std::str::FromStr for GcPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "greedy" => Ok(GcPolicy::Greedy),
            "cost-benefit" => Ok(GcPolicy::CostBenefit),
            _ => Err(Error::invalid(format!(
                "GC policy {s:?}: greedy or cost-benefit"
            ))),
        }
    }
}

/// What a segment's space holds when written at today's width (`Inner::room_now`).
pub(crate) struct RoomNow {
    /// Data bytes per byte of data and parity in today's stripes.
    data_fraction: f64,
    /// Data bytes a whole segment holds in full stripes at today's width, counting each
    /// chunk's header at the most it takes for full stripes (`Inner::segment_data`): never
    /// more than a segment really holds, so a segment measured against it is never taken for
    /// emptier than it is. Measuring against full width while drives are out would make every
    /// segment look worth cleaning and the cleaner churn.
    segment_capacity: f64,
    /// Today's data width, the parity count and the chunk size.
    w: usize,
    m: usize,
    chunk: usize,
    /// Write records one stripe holds (its record budget over a relocation's record).
    records: f64,
    /// Bytes of a whole segment on the members in service.
    segment_bytes: f64,
}

/// Bytes of a relocation's write record (a stamped one; an unstamped move names its origin,
/// just as long): what each block moved takes of a stripe's record budget.
const MOVE_RECORD: usize = 32;

impl RoomNow {
    /// The share of a segment's bytes (data, parity and chunk headers) that `blocks` blocks of
    /// `bytes` stored bytes take when the cleaner rewrites them at today's width.
    ///
    /// A stripe closes when its data chunks are full or when its record budget is (one write
    /// record per block: room for full stripes at 2:1 compression). Blocks that compress
    /// further (zeros, repeating patterns: a few dozen bytes each) fill the budget first, so
    /// their stripes are narrow, a few kilobytes of data with a chunk of parity and full
    /// headers on m + 1 chunks, and a segment of them holds a small fraction of the data a
    /// segment of full stripes does. Measured by bytes alone, such a segment looked mostly
    /// empty, and cleaning it rewrote it block for block into as many stripes again: on a full
    /// pool with no host writes the cleaner moved hundreds of megabytes a minute, forever.
    /// The blocks are taken as `bytes / blocks` each (segments hold runs of like data).
    fn rewrite_share(&self, bytes: f64, blocks: f64) -> f64 {
        if blocks <= 0.0 || self.segment_bytes <= 0.0 {
            return 0.0;
        }
        let chunk = self.chunk as f64;
        let full = (self.w * self.chunk) as f64;
        let stripes = (blocks / self.records).max(bytes / full);
        let d = (bytes / stripes).min(full);
        let wc = ((d / chunk).ceil() as usize).clamp(1, self.w);
        let up = |x: f64| crate::format::round_up_block(x.ceil() as usize) as f64;
        let data = (wc - 1) as f64 * chunk + up(d - (wc - 1) as f64 * chunk);
        let lead = if wc > 1 { chunk } else { up(d) };
        let n = wc + self.m;
        let recs = (blocks / stripes * MOVE_RECORD as f64).ceil() as usize;
        let full_hdr = crate::format::header::header_len_with(n, recs) as f64;
        let short_hdr = crate::format::header::header_len_with(n, 0) as f64;
        let per_stripe = data
            + self.m as f64 * lead
            + (self.m + 1) as f64 * full_hdr
            + (wc - 1) as f64 * short_hdr;
        stripes * per_stripe / self.segment_bytes
    }
}

/// Background cleaning gave up until the pool changes: its last round gained no free segment
/// (`Inner::gc_background`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GcIdle {
    /// `Inner::gc_activity`, today's width and the members in service when it gave up.
    activity: u64,
    width: u8,
    up: usize,
}

impl Inner {
    /// What a segment's space holds at today's stripe width (narrower while drives are out),
    /// taken once per victim choice.
    pub(crate) fn room_now(&self) -> RoomNow {
        let up = self.members_up();
        let m = self.geo.m as usize;
        let w = (self.width.load(Ordering::Relaxed) as usize)
            .min(up.saturating_sub(m))
            .max(1);
        RoomNow {
            data_fraction: w as f64 / (w + m) as f64,
            segment_capacity: self.segment_data(up.max(w + m), w) as f64,
            w,
            m,
            chunk: self.geo.chunk_size as usize,
            records: (self.shape.record_budget / MOVE_RECORD).max(1) as f64,
            segment_bytes: (self.geo.segment_size * up.max(w + m) as u64) as f64,
        }
    }

    /// The space (data and parity bytes) a data stripe takes in its segment: what
    /// `written_slots` adds up, when the stripe completes and when recovery replays it.
    pub(crate) fn stripe_space(chunks: &[ChunkLoc], w: usize, m: usize) -> u64 {
        if w == 0 {
            // Records only (a segment-free record, a trim): the room its chunks take, so a
            // segment holding only such stripes is not mistaken for one of unknown space.
            return chunks.iter().map(|c| c.end() - c.offset).sum();
        }
        let data: u64 = chunks[..w].iter().map(|c| c.len as u64).sum();
        // The data's share of the stripe's space, parity included: the cleaner compares live
        // bytes with what that space holds at the width stripes have later.
        data * (w + m) as u64 / w.max(1) as u64
    }

    /// The fraction of a segment's space its live data would take if rewritten now: what
    /// cleaning it costs, against the one segment it frees. A segment written at another
    /// width than today's counts at today's: one written narrow while drives were out is
    /// worth cleaning once the pool is wider again (its data packs into less space), and one
    /// written wide is not worth cleaning while the pool is narrow (its data would take more).
    ///
    /// Two measures, the lower taken: live data against the space the segment's stripes took
    /// (exact for a segment filled with full stripes: headers cancel out), and against what a
    /// whole segment holds (`RoomNow::segment_capacity`), which sees the space a segment never
    /// received: one closed part-written (every open closes the segments open before it, a
    /// rebuild closes them before it starts) or filled with stripes sealed small by flushes.
    /// Without the second, such a segment counted as full for as long as its data lived, and a
    /// pool restarted often with cold data ran out of room far below its capacity.
    ///
    /// Neither sees blocks that compress far: their stripes close on the record budget, not
    /// on their data, so rewriting them takes as many narrow stripes as they have now. The
    /// higher of that and the share of the segment those stripes take rewritten
    /// (`RoomNow::rewrite_share`, from the segment's live blocks and bytes) counts.
    pub(crate) fn utilisation(&self, seg: usize, now: &RoomNow) -> f64 {
        let live = self.live[seg].load(Ordering::Relaxed) as f64;
        let blocks = self.live_count[seg].load(Ordering::Relaxed) as f64;
        let slots = self.written_slots[seg].load(Ordering::Relaxed) as f64;
        // What the space its stripes took holds at today's data fraction; unknown (0) for a
        // segment used before a restart from a version-1 checkpoint.
        let taken = slots * now.data_fraction;
        let room = taken.max(now.segment_capacity);
        (live / room).max(now.rewrite_share(live, blocks)).min(1.0)
    }

    /// The segment to clean next, if any holds garbage worth the work.
    /// Only segments closed before sequence number `before` are candidates: a cleaning run
    /// never picks what it wrote itself. Nor one with stripes still on their way to the
    /// drives ([`Inner::segment_settled`]).
    pub(crate) fn pick_victim(&self, before: u64) -> Option<(u32, f64)> {
        let room = self.room_now();
        let w = self.writer.lock();
        let now = w.next_seq;
        let policy = *self.gc_policy.lock();
        // (score, segment, utilisation) of the best candidate.
        let mut best: Option<(f64, u32, f64)> = None;
        for (i, st) in w.segs.states.iter().enumerate() {
            if *st != SegState::Used
                || w.segs.closed_seq[i] >= before
                || self.stripes_in_flight[i].load(Ordering::Relaxed) != 0
            {
                continue;
            }
            let u = self.utilisation(i, &room);
            if u > 0.97 {
                continue; // nothing to gain
            }
            let score = match policy {
                GcPolicy::Greedy => 1.0 - u,
                GcPolicy::CostBenefit => {
                    let age = (now - w.segs.closed_seq[i].min(now)) as f64 + 1.0;
                    (1.0 - u) * age / (1.0 + u)
                }
            };
            if best.is_none_or(|(b, _, _)| score > b) {
                best = Some((score, i as u32, u));
            }
        }
        best.map(|(_, s, u)| (s, u))
    }

    /// Re-appends, in the GC stream, every block of stripe `desc` the maps still point at.
    /// `urgent`: the move frees space (the cleaner), so it may use the cleaner's reserve.
    /// Moves out of a stripe with a chunk on a member out of service count as rebuilt
    /// (`Inner::rebuild_moved`).
    pub(crate) fn relocate_stripe(
        &self,
        desc: &crate::scan::StripeDesc,
        urgent: bool,
    ) -> Result<()> {
        self.relocate_stripe_counting(desc, urgent, &self.stats.crc_errors)
    }

    /// `relocate_stripe`, counting the chunks that fail their CRC in `mismatches`.
    pub(crate) fn relocate_stripe_counting(
        &self,
        desc: &crate::scan::StripeDesc,
        urgent: bool,
        mismatches: &crate::stats::Counter,
    ) -> Result<()> {
        if desc.kind != StripeKind::Data || desc.w == 0 {
            return Ok(());
        }
        let rebuilds = desc.members() & self.lost_mask() != 0;
        let live = self.live_blocks(desc);
        if live.is_empty() {
            return Ok(());
        }
        let (shards, _) = self.read_stripe_lost(desc, None, mismatches)?;
        for b in live {
            let bytes = &shards[b.chunk][b.offset..b.offset + b.len];
            self.move_block(
                &b.vol, b.lba, bytes, b.crc, b.flags, b.entry, urgent, rebuilds,
            )?;
        }
        Ok(())
    }

    /// Re-appends one block (its stored bytes) in the GC stream, unless the map moved on from
    /// `expected` meanwhile; `rebuilds`: it leaves a stripe with a chunk on a member out of
    /// service (counted in `Inner::rebuild_moved`).
    #[allow(clippy::too_many_arguments)]
    fn move_block(
        &self,
        v: &crate::pool::VolumeState,
        lba: u64,
        bytes: &[u8],
        crc: u32,
        flags: u8,
        expected: u64,
        urgent: bool,
        rebuilds: bool,
    ) -> Result<()> {
        self.logged_in(Stream::Gc, urgent, |open| {
            if v.map.get(lba) != expected || v.deleted.load(Ordering::Relaxed) {
                return Ok(Some(())); // overwritten, trimmed or deleted meanwhile
            }
            let moved = self.append_mapped(open, v, lba, bytes, crc, flags, Some(expected));
            if moved.is_some() {
                Stats::add(&self.stats.gc_relocated_bytes, bytes.len() as u64);
                if rebuilds {
                    self.rebuild_moved
                        .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                }
            }
            Ok(moved)
        })
    }

    /// For a stripe parity cannot recover: moves every live block whose own bytes still read
    /// and check on their drive (a chunk fails its CRC when any byte of it rotted, but each
    /// block has its own CRC), so only the blocks really lost stay behind. Returns how many
    /// stayed, by (volume id, block).
    fn salvage_stripe(
        &self,
        desc: &crate::scan::StripeDesc,
        urgent: bool,
    ) -> Result<Vec<(u32, u64)>> {
        let mut left = Vec::new();
        let rebuilds = desc.members() & self.lost_mask() != 0;
        for b in self.live_blocks(desc) {
            let c = desc.chunks[b.chunk];
            // The block's bytes, read with the 4 KiB alignment direct I/O needs (compressed
            // blocks are packed at 32 bytes).
            let start = c.data_offset() + b.offset as u64;
            let first = start & !(crate::format::BLOCK as u64 - 1);
            let end = (start + b.len as u64).next_multiple_of(crate::format::BLOCK as u64);
            let mut buf = crate::aligned::AlignedBuf::zeroed((end - first) as usize);
            let bytes = (start - first) as usize..(start - first) as usize + b.len;
            let intact = self
                .drives
                .get(c.drive as usize)
                .and_then(|d| d.usable())
                .is_some_and(|d| d.read_at(first, &mut buf).is_ok())
                && crate::crc::checksum(&buf[bytes.clone()]) == b.crc;
            if intact {
                let (vol, lba, entry) = (&b.vol, b.lba, b.entry);
                self.move_block(
                    vol,
                    lba,
                    &buf[bytes],
                    b.crc,
                    b.flags,
                    entry,
                    urgent,
                    rebuilds,
                )?;
            } else {
                left.push((b.vol.id, b.lba));
            }
        }
        Ok(left)
    }

    /// Moves every live block out of segment `seg`; marks it Reclaimed when none is left.
    /// `urgent` as for `relocate_stripe`: true for the cleaner, false for a rebuild, whose
    /// moves into narrower stripes may take more room than they free.
    /// The caller holds the cleaner's lock and found the segment Used under it (so it stays
    /// Used: only the cleaner moves a segment on from there).
    /// `lost_ok`: a stripe parity cannot recover (unreadable beyond its parity) is left where
    /// it is, with its live blocks, and the rest is moved (a repair: everything that can be
    /// saved is, and the segment stays in use holding what cannot); otherwise it fails the
    /// call (a cleaner cannot free such a segment anyway).
    pub(crate) fn clean_segment(&self, seg: u32, urgent: bool, lost_ok: bool) -> Result<bool> {
        let state = self.writer.lock().segs.states[seg as usize];
        debug_assert!(
            state == SegState::Used,
            "segment {seg} cleaned while {state:?}"
        );
        if state != SegState::Used {
            return Ok(false);
        }
        self.segment_settled(seg)?;
        if self.reclaim_if_dead_and_covered(seg) {
            return Ok(true);
        }
        let stripes = self.scan_segment(seg, true);
        // Blocks of stripes parity cannot recover that stay (with `lost_ok`).
        let mut lost = std::collections::HashSet::new();
        for desc in stripes.values() {
            match self.relocate_stripe(desc, urgent) {
                Err(Error::Unavailable(why)) if lost_ok => {
                    let left = self.salvage_stripe(desc, urgent)?;
                    tracing::warn!(
                        segment = seg,
                        seq = desc.seq,
                        %why,
                        blocks_left = left.len(),
                        "stripe parity cannot recover: its intact blocks moved, the lost ones left"
                    );
                    lost.extend(left);
                }
                r => r?,
            }
        }
        // What a recovery may need from the segment's stripes besides the blocks just moved:
        // `reuse` logs it again to free the segment without a checkpoint.
        // Stripes of an earlier fill (left where a drive ignored the discard) logged nothing
        // a recovery needs: everything they held was superseded before that fill was freed.
        // Every stripe names its fill's first, and the newest fill's is the highest.
        let fill_start = stripes.values().map(|d| d.fill_start).max().unwrap_or(0);
        let kept: Option<Vec<(u64, Record)>> = stripes
            .values()
            .filter(|d| d.kind == StripeKind::Data && d.seq >= fill_start)
            .map(|d| {
                d.records.as_ref().map(|recs| {
                    recs.iter()
                        .filter(|r| !matches!(r, Record::Write { .. } | Record::SegmentFree { .. }))
                        .map(|r| (d.seq, r.clone()))
                        .collect::<Vec<_>>()
                })
            })
            .collect::<Option<Vec<_>>>()
            .map(|v| v.into_iter().flatten().collect());
        self.reclaimed_records.lock().insert(seg, kept);
        if self.live[seg as usize].load(Ordering::Relaxed) != 0 {
            // Some stripe's records could not be read (every full header copy sits on a drive
            // that is lost, or behind a torn chunk, or rotted): find the blocks from the maps
            // instead, past those already known lost.
            self.relocate_by_map(seg, urgent, &lost, lost_ok)?;
        }
        let left = self.live[seg as usize].load(Ordering::Relaxed);
        let mut w = self.writer.lock();
        if left == 0 && w.segs.states[seg as usize] == SegState::Used {
            w.segs.states[seg as usize] = SegState::Reclaimed;
            Stats::add(&self.stats.gc_segments_cleaned, 1);
            return Ok(true);
        }
        if left != 0 {
            tracing::warn!(
                segment = seg,
                live_bytes = left,
                "segment still holds live data after cleaning; kept"
            );
        }
        Ok(false)
    }

    /// Waits until every stripe of closed segment `seg` is on the drives. A stripe sealed and
    /// queued for the stripe writers (or being written) holds blocks the maps point at as
    /// buffered, which count as its segment's live data only once written, and chunk headers
    /// no scan can find yet: until then the segment looks emptier than it is, and freeing it
    /// would lose the newest copies of those blocks. No stripe opens in a closed segment, and
    /// every one already open in it is sealed (the stream moved on), so this ends.
    fn segment_settled(&self, seg: u32) -> Result<()> {
        self.wait_completions(|_| self.stripes_in_flight[seg as usize].load(Ordering::Relaxed) != 0)
    }

    /// Marks segment `seg` reclaimed without reading it when nothing in it is live and the
    /// latest checkpoint covers it (closed before the checkpoint began): there is nothing to
    /// move, and nothing of its records to log again (`reuse` frees a covered segment with a
    /// flush alone), so the scan, one read per chunk header (1280 reads for a 32 MiB segment
    /// over five drives, 100-400 ms on a virtual disk), is not needed. True when it did. The
    /// caller waited for the segment's stripes ([`Inner::segment_settled`]), so its live count
    /// is complete.
    fn reclaim_if_dead_and_covered(&self, seg: u32) -> bool {
        if self.live[seg as usize].load(Ordering::Relaxed) != 0 {
            return false;
        }
        let Some((cp_start, _)) = self.checkpoint_span() else {
            return false;
        };
        let mut w = self.writer.lock();
        if w.segs.states[seg as usize] != SegState::Used
            || !w.segs.covered_by(seg, cp_start)
            || self.live[seg as usize].load(Ordering::Relaxed) != 0
        {
            return false;
        }
        w.segs.states[seg as usize] = SegState::Reclaimed;
        drop(w);
        self.reclaimed_records.lock().insert(seg, Some(Vec::new()));
        Stats::add(&self.stats.gc_segments_cleaned, 1);
        Stats::add(&self.stats.gc_segments_unread, 1);
        true
    }

    /// Re-appends every block whose map entry points into segment `seg`, read through the
    /// normal read path (reconstructing as needed). Slower than `relocate_stripe` (it walks
    /// every map), for the rare segment whose stripe records are unreadable.
    /// Blocks in `lost` are skipped; with `lost_ok` so is a block that does not read (parity
    /// cannot recover it), where it would fail the call otherwise.
    fn relocate_by_map(
        &self,
        seg: u32,
        urgent: bool,
        lost: &std::collections::HashSet<(u32, u64)>,
        lost_ok: bool,
    ) -> Result<()> {
        let rebuilds = self.writer.lock().segs.drives_used[seg as usize] & self.lost_mask() != 0;
        let vols: Vec<_> = self.volumes.read().by_id.values().cloned().collect();
        for v in vols {
            let mut found = Vec::new();
            v.map.for_each_run(|first, entries| {
                for (i, e) in entries.iter().enumerate() {
                    if let Some(Entry::Media { offset, .. }) = Entry::decode(*e) {
                        if crate::layout::SegmentTable::segment_of(&self.geo, offset) == seg {
                            found.push((first + i as u64, *e));
                        }
                    }
                }
            });
            let mut block = vec![0u8; crate::format::BLOCK];
            for (lba, expected) in found {
                if v.map.get(lba) != expected || lost.contains(&(v.id, lba)) {
                    continue;
                }
                match self.read_block(&v, lba, &mut block) {
                    Err(Error::Unavailable(_)) if lost_ok => continue,
                    r => r?,
                };
                let crc = crate::crc::checksum(&block);
                self.move_block(&v, lba, &block, crc, 0, expected, urgent, rebuilds)?;
            }
        }
        Ok(())
    }

    /// Cleans until more than `target` segments are free, or nothing is worth cleaning; then
    /// frees the cleaned segments. Returns how many were cleaned.
    pub(crate) fn gc_until(&self, target: usize) -> Result<usize> {
        self.gc_run(target, false)
    }

    /// `gc_until`; with `check_gain` (background cleaning) the run also stops once the
    /// segments it freed fall two behind what its measure of the victims promised (the sum of
    /// their free shares): cleaning that does not gain what it expects is not worth the drive
    /// writes. A writer's foreground cleaning goes on regardless (it needs the room).
    fn gc_run(&self, target: usize, check_gain: bool) -> Result<usize> {
        let _one_cleaner = self.gc_lock.lock();
        let mut cleaned = 0;
        let mut tried = 0;
        let run_start = self.writer.lock().next_seq;
        // Free and reclaimed segments when the run began, and the gain its victims promised.
        let mut start: Option<usize> = None;
        let mut promised = 0.0;
        loop {
            let (free, reclaimed) = {
                let w = self.writer.lock();
                let r = w
                    .segs
                    .states
                    .iter()
                    .filter(|s| **s == SegState::Reclaimed)
                    .count();
                (w.segs.available(), r)
            };
            if free + reclaimed > target || tried >= self.live.len() {
                break;
            }
            let have = free + reclaimed;
            let gained = have as f64 - *start.get_or_insert(have) as f64;
            if check_gain && promised - gained >= 2.0 {
                tracing::debug!(
                    promised,
                    gained,
                    cleaned,
                    "cleaning gains less than its measure promised: run stopped"
                );
                break;
            }
            let Some((victim, u)) = self.pick_victim(run_start) else {
                break;
            };
            tried += 1;
            match self.clean_segment(victim, true, false) {
                Ok(true) => {
                    cleaned += 1;
                    promised += 1.0 - u;
                }
                Ok(false) => {}
                // Out of room for relocations: free what was cleaned, then stop.
                Err(crate::error::Error::NoSpace) => break,
                Err(e) => return Err(e),
            }
            // Cleaned segments are unusable until freed: free them before the cleaner's own
            // stream runs short.
            let low = {
                let w = self.writer.lock();
                w.segs.available() <= w.segs.low_water()
            };
            if low {
                let low_water = self.writer.lock().segs.low_water();
                self.free_cleaned(low_water)?;
            }
        }
        self.free_cleaned(target)?;
        Stats::add(&self.stats.gc_runs, 1);
        Ok(cleaned)
    }

    /// What the cleaner's chance of gaining room depends on besides its own moves: host
    /// writes, trims, volume deletes and shrinks (`Inner::gc_activity`), the stripe width and
    /// the members in service.
    fn gc_idle_key(&self) -> GcIdle {
        GcIdle {
            activity: self.gc_activity.load(Ordering::SeqCst),
            width: self.width.load(Ordering::SeqCst),
            up: self.members_up(),
        }
    }

    /// Notes something that may give the cleaner room to gain (see `gc_idle_key`).
    pub(crate) fn gc_wake(&self) {
        self.gc_activity.fetch_add(1, Ordering::SeqCst);
    }

    /// True while background cleaning is idle: its last round gained no free segment and
    /// nothing changed since.
    pub(crate) fn gc_is_idle(&self) -> bool {
        let key = self.gc_idle_key();
        self.gc_idle.lock().is_some_and(|k| k == key)
    }

    /// One round of background cleaning towards `target` free segments. Each round must gain
    /// free segments: one that cleaned or moved something without gaining any (every victim's
    /// live data took as much room rewritten as the victim gave back) leaves background
    /// cleaning idle until something changes (`gc_idle_key`), so a full pool nobody writes
    /// to does not have its data moved round after round, wearing the drives for nothing.
    pub(crate) fn gc_background(&self, target: usize) -> Result<usize> {
        let key = self.gc_idle_key();
        if self.gc_idle.lock().is_some_and(|k| k == key) {
            return Ok(0);
        }
        let free_before = self.writer.lock().segs.free_count();
        let moved_before = self.stats.gc_relocated_bytes.load();
        let cleaned = self.gc_run(target, true)?;
        let free_after = self.writer.lock().segs.free_count();
        let moved = self.stats.gc_relocated_bytes.load() - moved_before;
        let worked = cleaned > 0 || moved > 0;
        let mut idle = self.gc_idle.lock();
        if worked && free_after <= free_before && free_after < target && self.gc_idle_key() == key {
            tracing::info!(
                free_segments = free_after,
                target,
                cleaned,
                moved_bytes = moved,
                "background cleaning gains no free segment: idle until the pool changes"
            );
            Stats::add(&self.stats.gc_idle_rounds, 1);
            *idle = Some(key);
        } else {
            *idle = None;
        }
        Ok(cleaned)
    }

    /// Frees the segments the cleaner emptied: by log records where the latest checkpoint
    /// covers them (`free_reclaimed`), then by a checkpoint if some are left and no more
    /// than `target` segments are free.
    fn free_cleaned(&self, target: usize) -> Result<()> {
        if !self
            .writer
            .lock()
            .segs
            .states
            .contains(&SegState::Reclaimed)
        {
            return Ok(());
        }
        // No room for the record's stripe (every free segment is the checkpoint's reserve):
        // a checkpoint, which may use that reserve, frees them instead.
        let no_room = match self.free_reclaimed() {
            Ok(_) => false,
            Err(Error::NoSpace) => true,
            Err(e) => return Err(e),
        };
        let reclaimed = {
            let w = self.writer.lock();
            if no_room || w.segs.available() <= target {
                w.segs
                    .states
                    .iter()
                    .filter(|s| **s == SegState::Reclaimed)
                    .count()
            } else {
                0
            }
        };
        if reclaimed > 0 {
            tracing::debug!(no_room, reclaimed, "checkpoint to free cleaned segments");
            self.checkpoint()?;
        }
        Ok(())
    }

    /// Foreground cleaning by a writer that found the pool nearly full.
    pub(crate) fn gc_foreground(&self) -> Result<()> {
        let low = self.writer.lock().segs.low_water();
        self.gc_until(low + 1).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use crate::drive::{CrashFate, DriveRef, MemDrive};
    use crate::layout::SegmentTable;
    use crate::map::Entry;
    use crate::{Pool, PoolConfig};
    use std::sync::Arc;

    /// 4+1, 16 KiB chunks, 1 MiB segments: many segments on small memory drives.
    fn small() -> PoolConfig {
        PoolConfig {
            k: 4,
            m: 1,
            chunk_size: 16 << 10,
            segment_size: 1 << 20,
            checkpoint_interval: 1 << 30,
        }
    }

    fn block(v: u8) -> Vec<u8> {
        let mut b = vec![v; 4096];
        b[0] = !v;
        b
    }

    /// A host write into the data stream's open stripe, made after the cleaner moved the same
    /// block into a GC stripe opened later (so the host's record comes first in the log):
    /// after a crash the host's contents stand, not the moved older ones. Before relocation
    /// records named where they moved a block from, recovery replayed the move over the write.
    #[test]
    fn host_write_after_a_move_into_a_later_stripe_survives_recovery() {
        // Unstamped (no checkpoint yet: the move names its origin) and stamped.
        for stamped in [false, true] {
            host_write_after_a_move(stamped);
        }
    }

    fn host_write_after_a_move(stamped: bool) {
        let drives: Vec<Arc<MemDrive>> = (0..5)
            .map(|i| Arc::new(MemDrive::tracked(24 << 20, format!("mem:{i}"))))
            .collect();
        let refs = || -> Vec<DriveRef> { drives.iter().map(|d| d.clone() as DriveRef).collect() };
        let cfg = small();
        let pool = if stamped {
            Pool::create(refs(), &cfg).unwrap()
        } else {
            Pool::create_unstamped(refs(), &cfg).unwrap()
        };
        pool.create_volume_with("v", 8 << 20, crate::Compression::Off)
            .unwrap();
        if stamped {
            pool.checkpoint().unwrap();
        }
        assert_eq!(pool.inner.stamps.on(), stamped);
        let vol = pool.volume("v").unwrap();
        // Block 0 and a segment's worth of others, then the others again: block 0's segment
        // is nearly empty and closed.
        for round in 0..2u8 {
            for lba in 0..1200u64 {
                if round == 0 || lba != 0 {
                    vol.write(lba * 4096, &block(round + 1)).unwrap();
                }
            }
        }
        pool.flush().unwrap();
        let inner = &pool.inner;
        let v = inner
            .volume_by_id(inner.volumes.read().by_name["v"])
            .unwrap();
        let Some(Entry::Media { offset, .. }) = Entry::decode(v.map.get(0)) else {
            panic!("block 0 is on media");
        };
        let seg = SegmentTable::segment_of(&inner.geo, offset);
        // The data stream opens a stripe (the lower sequence number)...
        vol.write(1500 * 4096, &block(7)).unwrap();
        // ...the cleaner moves block 0 into the GC stream (a higher one)...
        assert!(
            inner.clean_segment(seg, true, false).unwrap(),
            "segment emptied"
        );
        // ...and the host overwrites block 0 into the older, still open stripe.
        vol.write(0, &block(9)).unwrap();
        pool.flush().unwrap();
        let copies: Vec<DriveRef> = drives
            .iter()
            .map(|d| Arc::new(d.crash(|_, _| CrashFate::Lost)) as DriveRef)
            .collect();
        drop(pool);
        let pool = Pool::open(copies).unwrap();
        let vol = pool.volume("v").unwrap();
        let mut b = vec![0u8; 4096];
        vol.read(0, &mut b).unwrap();
        assert!(
            b == block(9),
            "block 0 reads {}, not the host's 9 (stamped: {stamped})",
            b[1]
        );
        vol.read(1500 * 4096, &mut b).unwrap();
        assert!(b == block(7));
    }
}
