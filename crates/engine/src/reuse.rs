//! Segment reuse: a segment the cleaner emptied (Reclaimed) becomes free by the log, without
//! rewriting the block map, or at the next checkpoint.
//!
//! Stamped log (`stamp`; every pool from its first version-4 checkpoint on): recovery applies
//! records in stamp order, so the moves out of an emptied segment apply without the writes
//! they moved, and finds a segment written again by its first chunk header. So freeing a
//! segment takes only a flush of everything logged so far (the moves out of it among it), once
//! what its stripes logged since the checkpoint besides blocks (trims, volume changes:
//! `Inner::reclaimed_records`, kept when the cleaner read them) has been appended again with
//! its stamps. A segment the checkpoint covers has nothing to log again. One whose records
//! could not all be read, or whose records would cost more than a share of a checkpoint,
//! waits for the next checkpoint, which frees it (see `checkpoint`).
//!
//! Unstamped log (a pool an older build created, until its first checkpoint here): only a
//! segment the latest checkpoint covers (closed before the checkpoint began) goes by the log.
//! Recovery starts from the checkpoint, whose maps point into the segment only for blocks whose
//! moves out of it are in the log after the checkpoint; a `SegmentFree` record appended after
//! those moves, made durable with everything before it, lets recovery follow the moves, see the
//! record, and only then look in the segment for newer stripes. A segment written since the
//! checkpoint waits for the next one.
//!
//! Either way the freed range is discarded on every drive (`Drive::discard`) before anything
//! can be written there again, so a drive with its own FTL stops copying what we no longer
//! need.

use crate::error::Result;
use crate::format::header::Record;
use crate::layout::{SegState, SegmentTable, Stream};
use crate::pool::Inner;
use crate::stats::Stats;

/// Records logged again to free segments may take up to 1/`RELOG_SHARE` of the last
/// checkpoint's size per freeing round (at least `MIN_RELOG_ROOM` bytes); past that, the next
/// checkpoint is the cheaper way (a trim-heavy segment).
const RELOG_SHARE: u64 = 16;
const MIN_RELOG_ROOM: u64 = 4096;

impl Inner {
    /// The latest checkpoint's first and last sequence numbers; None before the first one
    /// (recovery then replays every segment's stripes).
    pub(crate) fn checkpoint_span(&self) -> Option<(u64, u64)> {
        let sb = self.sb.lock();
        (sb.checkpoint.len != 0).then_some((sb.checkpoint.seq_start, sb.checkpoint.seq_end))
    }

    /// Frees by the log every reclaimed segment that can go that way (see the module
    /// documentation); returns how many. Takes the checkpoint lock, so no checkpoint frees
    /// them meanwhile (a record for a segment a checkpoint already freed would name a free
    /// segment, and the records kept to log again are those after the latest checkpoint).
    pub(crate) fn free_reclaimed(&self) -> Result<usize> {
        let _no_checkpoint = self.cp_lock.lock();
        let Some((cp_start, cp_end)) = self.checkpoint_span() else {
            return Ok(0);
        };
        let stamped = self.stamps.on();
        let (covered, written_since, relog_room): (Vec<u32>, Vec<u32>, u64) = {
            let w = self.writer.lock();
            let reclaimed = (0..w.segs.states.len())
                .filter(|&s| w.segs.states[s] == SegState::Reclaimed)
                .map(|s| s as u32);
            let (covered, since) = reclaimed.partition(|&s| w.segs.covered_by(s, cp_start));
            (
                covered,
                since,
                (w.last_cp_bytes / RELOG_SHARE).max(MIN_RELOG_ROOM),
            )
        };
        // In a stamped log a segment written since the checkpoint goes too, when its stripes'
        // records were all read: what they hold besides the blocks moved out (trims, volume
        // changes) is logged again first, with its stamps.
        let mut relog: Vec<Record> = Vec::new();
        let mut relog_bytes = 0u64;
        let mut by_relog: Vec<u32> = Vec::new();
        if stamped {
            let pending = self.reclaimed_records.lock();
            for s in written_since {
                let Some(Some(kept)) = pending.get(&s) else {
                    continue;
                };
                let needed: Vec<&Record> = kept
                    .iter()
                    .filter(|(seq, _)| *seq > cp_end)
                    .map(|(_, r)| r)
                    .collect();
                let bytes: u64 = needed.iter().map(|r| r.encoded_len() as u64).sum();
                if relog_bytes + bytes > relog_room {
                    continue; // cheaper to leave it to the next checkpoint
                }
                relog_bytes += bytes;
                debug_assert!(
                    needed.iter().all(|r| r.stamp().is_some()),
                    "records after a stamped checkpoint are stamped"
                );
                relog.extend(needed.into_iter().cloned());
                by_relog.push(s);
            }
        }
        let segs: Vec<u32> = covered.iter().chain(&by_relog).copied().collect();
        if segs.is_empty() {
            return Ok(0);
        }
        // In the cleaner's stream, after the moves out of the segments (every earlier stripe
        // of either stream is made durable with them below). Urgent: freeing space may use the
        // cleaner's reserve. A stamped log needs no segment-free record: recovery finds a
        // rewritten segment by its first chunk header.
        let free_records = covered
            .iter()
            .filter(|_| !stamped)
            .map(|&segment| Record::SegmentFree { segment });
        for rec in free_records.chain(relog) {
            self.logged_in(Stream::Gc, true, |open| {
                Ok(open.push_record(rec.clone()).then_some(()))
            })?;
        }
        self.flush_log()?;
        self.discard_segments(&segs);
        let mut w = self.writer.lock();
        let mut pending = self.reclaimed_records.lock();
        for &s in &segs {
            debug_assert_eq!(
                w.segs.states[s as usize],
                SegState::Reclaimed,
                "only the checkpoint frees reclaimed segments, and it waits for us"
            );
            w.segs.states[s as usize] = SegState::Free;
            pending.remove(&s);
        }
        Stats::add(&self.stats.segments_freed_by_log, segs.len() as u64);
        Stats::add(&self.stats.segments_freed_by_relog, by_relog.len() as u64);
        tracing::debug!(
            covered = covered.len(),
            written_since = by_relog.len(),
            "segments freed by log records"
        );
        Ok(segs.len())
    }

    /// Discards segments `segs` (not yet free, so nothing writes them) on every usable drive.
    /// Errors are logged and otherwise ignored: a discard is advice.
    pub(crate) fn discard_segments(&self, segs: &[u32]) {
        for slot in self.drives.iter() {
            let Some(d) = slot.usable() else { continue };
            for &s in segs {
                let base = SegmentTable::segment_base(&self.geo, s);
                if let Err(e) = d.discard(base, self.geo.segment_size) {
                    tracing::debug!(drive = %d.info().identity, segment = s, error = %e, "discard failed");
                    break;
                }
            }
        }
    }
}
