//! Segment reuse: a segment the cleaner emptied (Reclaimed) becomes free either by a small
//! log record or at the next checkpoint.
//!
//! By record (`free_reclaimed`): when the latest checkpoint covers every stripe the segment
//! holds (it was closed before the checkpoint began), recovery never needs those stripes: it
//! starts from the checkpoint, whose maps point into the segment only for blocks whose moves
//! out of it are in the log after the checkpoint. A `SegmentFree` record appended after those
//! moves, made durable with everything before it (a flush), lets recovery follow the moves,
//! see the record, and only then look in the segment for newer stripes. So the segment is
//! free once that flush returns, without rewriting the whole block map.
//!
//! Otherwise (the segment holds stripes after the checkpoint, which a recovery would replay)
//! it stays Reclaimed until the next checkpoint, which frees it (see `checkpoint`).
//!
//! Either way the freed range is discarded on every drive (`Drive::discard`) before anything
//! can be written there again, so a drive with its own FTL stops copying what we no longer
//! need.

use crate::error::Result;
use crate::format::header::Record;
use crate::layout::{SegState, SegmentTable, Stream};
use crate::pool::Inner;
use crate::stats::Stats;

impl Inner {
    /// Frees, by log records, every reclaimed segment the latest checkpoint covers; returns
    /// how many. Takes the checkpoint lock, so no checkpoint frees them meanwhile (a record
    /// for a segment a checkpoint already freed would name a free segment).
    pub(crate) fn free_reclaimed(&self) -> Result<usize> {
        let _no_checkpoint = self.cp_lock.lock();
        let covered_before = {
            let sb = self.sb.lock();
            if sb.checkpoint.len == 0 {
                return Ok(0); // no checkpoint: recovery replays every segment's stripes
            }
            sb.checkpoint.seq_start
        };
        let segs: Vec<u32> = {
            let w = self.writer.lock();
            (0..w.segs.states.len())
                .filter(|&s| {
                    w.segs.states[s] == SegState::Reclaimed && w.segs.closed_seq[s] < covered_before
                })
                .map(|s| s as u32)
                .collect()
        };
        if segs.is_empty() {
            return Ok(0);
        }
        for &segment in &segs {
            // In the cleaner's stream, after the moves out of the segment (every earlier stripe
            // of either stream is made durable with it below). Urgent: freeing space may use the
            // cleaner's reserve.
            self.logged_in(Stream::Gc, true, |open| {
                Ok(open
                    .push_record(Record::SegmentFree { segment })
                    .then_some(()))
            })?;
        }
        self.flush_log()?;
        self.discard_segments(&segs);
        let mut w = self.writer.lock();
        for &s in &segs {
            debug_assert_eq!(
                w.segs.states[s as usize],
                SegState::Reclaimed,
                "only the checkpoint frees reclaimed segments, and it waits for us"
            );
        }
        for &s in &segs {
            w.segs.states[s as usize] = SegState::Free;
        }
        Stats::add(&self.stats.segments_freed_by_log, segs.len() as u64);
        tracing::debug!(freed = segs.len(), "segments freed by log records");
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
