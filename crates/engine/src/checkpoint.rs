//! Taking a checkpoint: with writers held off, seal and write the open stripe, encode the
//! pool's metadata (volumes, maps, segment states, the space their stripes took and the members
//! they have chunks on) and write it as erasure-coded stripes of kind Checkpoint; then, with
//! writers going on, flush and point every drive's superblock at it.
//!
//! Writers wait only for the snapshot, not for the flush: on file drives the first flush after
//! a long write can take most of a second (the host filesystem commits everything written
//! since), and a writer held for it is a host write that long. What they write meanwhile comes
//! after the checkpoint in the log (higher sequence numbers), so it is replayed from this
//! checkpoint or, after a crash before the superblocks point here, from the previous one,
//! whose segments stay reserved. Every superblock change takes `cp_lock`, held throughout.
//! Segments the checkpoint records as free that writers must not reuse before it is durable
//! (those the cleaner emptied) are freed only after the superblocks. A pool still writing an
//! unstamped log (an older build's, until its first checkpoint here) holds writers to the end,
//! so the first stamped record comes after the first version-4 checkpoint.
//!
//! The previous checkpoint's segments stay reserved until the next one, so a crash at any
//! point, even while superblocks are half rewritten, leaves a complete checkpoint to start from.
//!
//! A checkpoint also frees every segment the cleaner emptied that a log record could not
//! (see `reuse`). It is otherwise only the bound on how much log a recovery replays.

use crate::error::{Error, Result};
use crate::format::checkpoint::CheckpointWriter;
use crate::format::header::StripeKind;
use crate::format::superblock::{CheckpointRef, MAX_CHECKPOINT_SEGMENTS};
use crate::layout::{SegState, Stream};
use crate::map::Entry;
use crate::pool::Inner;
use crate::stats::Stats;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

impl Inner {
    /// Writes a checkpoint of the whole pool state.
    pub(crate) fn checkpoint(&self) -> Result<()> {
        self.checkpoint_when(false)
    }

    /// Writes a checkpoint if one is still due (`WriterState::checkpoint_due`): what a writer
    /// that saw one due calls, since others may have seen it too and one of them taken it.
    pub(crate) fn checkpoint_if_due(&self) -> Result<()> {
        self.checkpoint_when(true)
    }

    fn checkpoint_when(&self, only_if_due: bool) -> Result<()> {
        let _one_at_a_time = self.cp_lock.lock();
        self.check_failed()?;
        let started = std::time::Instant::now();
        let mut w = self.writer.lock();
        let locked = started.elapsed();
        if only_if_due && !w.checkpoint_due(self.checkpoint_interval) {
            return Ok(());
        }
        for s in self.seal_all(&mut w) {
            self.write_stripe(s)?;
        }
        self.wait_written(w.next_seq - 1)?;
        let drained = started.elapsed();

        // Only the latest checkpoint's segments stay reserved; older ones are free again.
        let current: Vec<u32> = self.sb.lock().checkpoint.segments.clone();
        for (i, st) in w.segs.states.iter_mut().enumerate() {
            if *st == SegState::Checkpoint && !current.contains(&(i as u32)) {
                *st = SegState::Free;
            }
        }
        w.segs.set_checkpoint_kept(current.clone());
        // Segments the cleaner emptied are free from this checkpoint on: it no longer refers
        // to them, and nothing older than it will be replayed.
        let states: Vec<u8> = w
            .segs
            .states
            .iter()
            .map(|s| if *s == SegState::Reclaimed { SegState::Free } else { *s } as u8)
            .collect();
        // For each segment holding data, the cleaner's measure of it and which members it has
        // chunks on (what a rebuild after a restart tests; "every member" where unknown stays
        // that); the rest start from 0 when reused.
        let every_member = crate::layout::member_mask(self.drives.len());
        let (space, members): (Vec<u64>, Vec<u64>) = w
            .segs
            .states
            .iter()
            .zip(self.written_slots.iter().zip(&w.segs.drives_used))
            .map(|(st, (slots, used))| {
                if st.holds_data() {
                    (slots.load(Ordering::Relaxed), used & every_member)
                } else {
                    (0, 0)
                }
            })
            .unzip();
        let bytes = {
            let t = self.volumes.read();
            let mut cw =
                CheckpointWriter::new(t.next_id, &states, &space, &members, t.by_id.len() as u32);
            let mut ids: Vec<&u32> = t.by_id.keys().collect();
            ids.sort();
            for id in ids {
                let v = &t.by_id[id];
                cw.volume(
                    v.id,
                    &v.name,
                    v.size.load(Ordering::Relaxed),
                    v.compressor.setting() as u8,
                );
                v.map.for_each_run(|lba, entries| {
                    debug_assert!(
                        entries
                            .iter()
                            .all(|e| matches!(Entry::decode(*e), Some(Entry::Media { .. }))),
                        "every stripe is written, so every mapped entry is on media"
                    );
                    cw.run(lba, entries)
                });
                cw.end_volume();
            }
            cw.finish()
        };
        let crc = crate::crc::checksum(&bytes);

        let seq_start = w.next_seq;
        let mut segments = BTreeSet::new();
        let mut done = 0;
        while done < bytes.len() {
            let mut o =
                self.new_stripe(&mut w, Stream::Checkpoint, StripeKind::Checkpoint, true)?;
            segments.insert(o.plan.segment);
            done += o.append_bytes(&bytes[done..]);
            let s = self.seal(&mut w, o, Stream::Checkpoint);
            self.write_stripe(s)?;
            if segments.len() > MAX_CHECKPOINT_SEGMENTS {
                return Err(Error::invalid(
                    "checkpoint spans too many segments: use larger segments",
                ));
            }
        }
        let seq_end = w.next_seq - 1;
        // Kept by the next checkpoint too until the superblocks point here (then in place of
        // the previous one's, below): never counted as room for it.
        let new_segments: Vec<u32> = segments.iter().copied().collect();
        w.segs
            .keep_checkpoint_segments(new_segments.iter().copied());
        w.segs.close(Stream::Checkpoint);
        self.wait_written(seq_end)?;
        let written = started.elapsed();
        // What the checkpoint records as free and only a durable checkpoint may free.
        let reclaimed: Vec<u32> = (0..w.segs.states.len() as u32)
            .filter(|&s| w.segs.states[s as usize] == SegState::Reclaimed)
            .collect();
        // The log it covers: counted from zero again now, so writers do not start another
        // checkpoint (and wait for this one) while it flushes; put back if it fails.
        let covered = (w.bytes_since_cp, w.data_bytes_since_cp);
        w.bytes_since_cp = 0;
        w.data_bytes_since_cp = 0;
        // Writers go on during the flush unless the log is not stamped yet (module doc).
        let released = started.elapsed();
        let held = if self.stamps.on() {
            drop(w);
            None
        } else {
            Some(w)
        };
        let held_to_end = held.is_some();
        let made_durable = self.make_durable(seq_start, seq_end, &bytes, crc, segments);
        let mut w = held.unwrap_or_else(|| self.writer.lock());
        if let Err(e) = made_durable {
            w.bytes_since_cp += covered.0;
            w.data_bytes_since_cp += covered.1;
            return Err(e);
        }
        let durable = started.elapsed();
        // The previous checkpoint's segments are now the next checkpoint's to free.
        w.segs.set_checkpoint_kept(new_segments);
        let writers_held = if held_to_end { durable } else { released };

        // The log after a version-4 checkpoint is stamped (a pool an older build wrote starts
        // here); still under the writer lock, so no record after it goes unstamped.
        self.stamps.start_above(0);
        debug_assert!(
            reclaimed
                .iter()
                .all(|&s| w.segs.states[s as usize] == SegState::Reclaimed),
            "only a checkpoint or a free by the log (both under cp_lock) frees reclaimed segments"
        );
        if !reclaimed.is_empty() {
            let mut pending = self.reclaimed_records.lock();
            for s in &reclaimed {
                pending.remove(s);
            }
            drop(pending);
            self.discard_segments(&reclaimed);
            for &s in &reclaimed {
                w.segs.states[s as usize] = SegState::Free;
            }
            Stats::add(
                &self.stats.segments_freed_at_checkpoint,
                reclaimed.len() as u64,
            );
            tracing::debug!(freed = reclaimed.len(), "segments freed by the checkpoint");
        }
        w.last_cp_bytes = bytes.len() as u64;
        Stats::add(&self.stats.checkpoints, 1);
        tracing::debug!(
            seq_start,
            seq_end,
            bytes = bytes.len(),
            lock_wait_ms = locked.as_millis() as u64,
            drain_ms = drained.as_millis() as u64,
            written_ms = written.as_millis() as u64,
            writers_held_ms = writers_held.as_millis() as u64,
            durable_ms = durable.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "checkpoint written"
        );
        Ok(())
    }

    /// Flushes every drive (the checkpoint's stripes and everything before them), then points
    /// the superblocks at the checkpoint.
    fn make_durable(
        &self,
        seq_start: u64,
        seq_end: u64,
        bytes: &[u8],
        crc: u32,
        segments: BTreeSet<u32>,
    ) -> Result<()> {
        self.flush_drives()?;
        let generation = {
            let mut sb = self.sb.lock();
            sb.generation += 1;
            sb.checkpoint = CheckpointRef {
                seq_start,
                seq_end,
                len: bytes.len() as u64,
                crc,
                segments: segments.into_iter().collect(),
            };
            sb.generation
        };
        self.write_superblocks_gen(generation)
    }
}
