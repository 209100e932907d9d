//! Rebuild after a drive loss: relocate the live data of every segment that may hold a chunk
//! on a lost drive, through the cleaner (only live data moves), into new stripes that avoid the
//! lost drives. When it completes, the lost drives are retired: nothing depends on them, and the
//! pool tolerates m new failures again.

use crate::error::Result;
use crate::layout::{SegState, SegmentTable, Stream};
use crate::map::Entry;
use crate::pool::{Inner, Pool};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Where a rebuild stands.
#[derive(Clone, Debug, Default)]
pub struct RebuildStatus {
    /// Segments to relocate in this rebuild.
    pub total_segments: u64,
    /// Segments relocated so far.
    pub done_segments: u64,
    /// Live bytes moved off the lost members so far: by this rebuild (or the cleaner while it
    /// ran), and before it since they went out (`moved_before_bytes`).
    pub moved_bytes: u64,
    /// The part of `moved_bytes` moved before this rebuild started: by the open, which
    /// rewrites the stripes of the log after the last checkpoint that miss a chunk (after a
    /// crash with a member missing, most of what it held), by a rebuild cut short, or by the
    /// cleaner meanwhile.
    pub moved_before_bytes: u64,
    /// Seconds since the rebuild started.
    pub elapsed_secs: f64,
    /// True while a rebuild runs.
    pub running: bool,
    /// Why the last rebuild stopped short, if it did (cleared by one that completes).
    pub last_error: Option<String>,
    /// Rebuilds that stopped short since the last one that completed.
    pub failed_attempts: u64,
}

impl RebuildStatus {
    /// Percent done.
    pub fn percent(&self) -> f64 {
        if self.total_segments == 0 {
            100.0
        } else {
            self.done_segments as f64 * 100.0 / self.total_segments as f64
        }
    }
    /// Bytes moved per second (by this rebuild).
    pub fn rate(&self) -> f64 {
        if self.elapsed_secs > 0.0 {
            self.moved_bytes.saturating_sub(self.moved_before_bytes) as f64 / self.elapsed_secs
        } else {
            0.0
        }
    }
    /// Estimated seconds left.
    pub fn eta_secs(&self) -> f64 {
        if self.done_segments == 0 {
            return f64::INFINITY;
        }
        self.elapsed_secs * (self.total_segments - self.done_segments) as f64
            / self.done_segments as f64
    }
}

impl Inner {
    /// Drives out of service whose data is not rebuilt yet.
    pub(crate) fn lost_mask(&self) -> u64 {
        self.drives
            .iter()
            .enumerate()
            .filter(|(_, s)| s.usable().is_none() && !s.retired.load(Ordering::Relaxed))
            .fold(0, |m, (i, _)| m | (1 << i))
    }

    /// Relocates everything that may depend on a lost drive; then retires the lost drives.
    pub(crate) fn rebuild(&self) -> Result<RebuildStatus> {
        let lost = self.lost_mask();
        if lost == 0 {
            return Ok(self.rebuild_status.lock().clone());
        }
        let _one_rebuild = self.rebuild_lock.lock();
        // Close the open segments so their data can be relocated too.
        self.close_open_segments()?;
        let victims: Vec<u32> = {
            let w = self.writer.lock();
            (0..w.segs.states.len())
                .filter(|&s| {
                    w.segs.states[s] == SegState::Used && w.segs.drives_used[s] & lost != 0
                })
                .map(|s| s as u32)
                .collect()
        };
        let started = Instant::now();
        let moved_before = self.rebuild_moved.load(Ordering::Relaxed);
        {
            let mut st = self.rebuild_status.lock();
            *st = RebuildStatus {
                total_segments: victims.len() as u64,
                moved_bytes: moved_before,
                moved_before_bytes: moved_before,
                running: true,
                last_error: st.last_error.take(),
                failed_attempts: st.failed_attempts,
                ..Default::default()
            };
        }
        tracing::info!(segments = victims.len(), "rebuild started");
        for (n, seg) in victims.iter().enumerate() {
            let s = *seg as usize;
            let needed =
                |t: &SegmentTable| t.states[s] == SegState::Used && t.drives_used[s] & lost != 0;
            if !self.move_out(*seg, needed, false)? {
                return Err(crate::error::Error::Unavailable(format!(
                    "rebuild: segment {seg} still holds live data that could not be moved; lost drives stay in the pool"
                )));
            }
            if self.room_low() || (n + 1) % 8 == 0 {
                self.checkpoint()?; // frees what was cleaned
            }
            let mut st = self.rebuild_status.lock();
            st.done_segments = n as u64 + 1;
            st.moved_bytes = self.rebuild_moved.load(Ordering::Relaxed);
            st.elapsed_secs = started.elapsed().as_secs_f64();
        }
        // A member put back in service meanwhile (`readmit`) is not retired: new stripes may
        // be on it already.
        let members = self.member_change.lock();
        let lost = lost & self.lost_mask();
        // What the victim list rests on (each segment's members, kept across restarts by
        // checkpoints and the roll-forward): no live block is left on a lost member. A member
        // retired with one would leave its stripe a chunk short for good.
        let stranded = self.blocks_on(lost);
        if stranded > 0 {
            tracing::error!(
                blocks = stranded,
                "rebuild: live blocks still on lost members after every segment on them moved"
            );
            return Err(crate::error::Error::Unavailable(format!(
                "rebuild: {stranded} live blocks still on lost members; lost drives stay in the pool"
            )));
        }
        // Retiring is for good (a retired member is never readmitted): never down to fewer
        // members in service than a stripe needs (1 data + m parity chunks), where the pool
        // could not write again; the lost ones stay failed, and a readmit brings one back.
        let (up, need) = (self.members_up(), self.geo.m as usize + 1);
        if lost != 0 && up < need {
            return Err(crate::error::Error::Unavailable(format!(
                "rebuild: only {up} members in service, a stripe needs {need}: the lost members \
                 stay in the pool, not retired (`flashpool drive readmit N` puts one back)"
            )));
        }
        for (i, slot) in self.drives.iter().enumerate() {
            if lost & (1 << i) != 0 {
                slot.retired.store(true, Ordering::SeqCst);
            }
        }
        drop(members);
        self.checkpoint()?; // persists the retired drives in the superblocks

        // Nothing reads or writes a retired member again: its file or device is let go (a
        // deleted drive file's space is freed now, not at the next restart).
        for (i, slot) in self.drives.iter().enumerate() {
            if let (true, Some(d)) = (lost & (1 << i) != 0, &slot.drive) {
                d.release();
            }
        }
        let mut st = self.rebuild_status.lock();
        st.moved_bytes = self.rebuild_moved.swap(0, Ordering::Relaxed);
        st.running = false;
        st.elapsed_secs = started.elapsed().as_secs_f64();
        tracing::info!(
            segments = st.total_segments,
            bytes = st.moved_bytes,
            secs = st.elapsed_secs,
            "rebuild done"
        );
        Ok(st.clone())
    }
}

impl Inner {
    /// How many mapped blocks have their data on a member in `members` (a mask).
    fn blocks_on(&self, members: u64) -> u64 {
        if members == 0 {
            return 0;
        }
        let volumes: Vec<_> = self.volumes.read().by_id.values().cloned().collect();
        let mut n = 0;
        for v in volumes {
            v.map.for_each_run(|_, entries| {
                n += entries
                    .iter()
                    .filter(|e| match Entry::decode(**e) {
                        Some(Entry::Media { drive, .. }) => {
                            members & crate::layout::member_bit(drive as usize) != 0
                        }
                        _ => false,
                    })
                    .count() as u64;
            });
        }
        n
    }

    /// Seals the open stripes of the data and GC streams, closes their segments (so their
    /// data can be moved like any other) and writes the sealed stripes. Sealing and closing
    /// are one step under the writer lock: a writer that opened a stripe in between would
    /// later seal it into a segment no longer open (the panic "advance without an open
    /// segment" of `drive remove` under load).
    fn close_open_segments(&self) -> Result<()> {
        let (sealed, target) = {
            let mut w = self.writer.lock();
            let sealed = self.seal_all(&mut w);
            w.segs.close(Stream::Data);
            w.segs.close(Stream::Gc);
            (sealed, w.next_seq - 1)
        };
        for s in sealed {
            self.write_stripe(s)?;
        }
        // Stripes sealed earlier may still be on their way (other appenders, the stripe
        // writers): their blocks count as live in their segments only once written, so the
        // relocation would miss them and find those segments not empty afterwards.
        self.wait_written(target)
    }

    /// Whether free segments run low for moves that leave the cleaner's reserve alone.
    fn room_low(&self) -> bool {
        let w = self.writer.lock();
        w.segs.available() <= w.segs.low_water() + 1
    }

    /// Moves the live data of segment `seg` into new stripes on the members in service, if
    /// `needed` (asked of the segment table) says it still must: a rebuild's or a repair's
    /// move. Such moves into narrower stripes may take more room than they free, so they
    /// leave the cleaner's reserve alone; garbage elsewhere is cleaned first when room runs
    /// low. `needed` is asked under the cleaner's lock and after that run: it may have
    /// emptied the segment, and the cleaner's stream may have taken it again once freed
    /// (relocating out of the segment a stream appends to would move its blocks into itself).
    /// False when the segment was needed and still holds live data after the move.
    /// `lost_ok` as for [`Inner::clean_segment`].
    fn move_out(
        &self,
        seg: u32,
        needed: impl Fn(&SegmentTable) -> bool,
        lost_ok: bool,
    ) -> Result<bool> {
        if self.room_low() {
            self.gc_foreground()?;
        }
        let _cleaner = self.gc_lock.lock();
        let needed = needed(&self.writer.lock().segs);
        Ok(!needed
            || self.clean_segment(seg, false, lost_ok)?
            || self.live[seg as usize].load(Ordering::Relaxed) == 0)
    }

    /// Moves the live data of `segments` (those still holding data) into new stripes on the
    /// members in service, then checkpoints so the emptied segments are free and no
    /// checkpoint refers to their stripes. `lost_ok` (a repair): stripes parity cannot
    /// recover stay where they are and the rest moves, instead of failing the call.
    pub(crate) fn relocate_segments(
        &self,
        segments: &std::collections::BTreeSet<u32>,
        lost_ok: bool,
    ) -> Result<()> {
        let _one_rebuild = self.rebuild_lock.lock();
        self.close_open_segments()?;
        for &seg in segments {
            self.move_out(seg, |t| t.states[seg as usize] == SegState::Used, lost_ok)?;
        }
        self.checkpoint()
    }
}

impl Pool {
    /// Relocates the live data that depended on failed or missing drives, then retires them.
    /// The pool stays online (reads reconstruct, writes avoid the lost drives) throughout.
    pub fn rebuild(&self) -> Result<RebuildStatus> {
        let r = self.inner.rebuild();
        let mut st = self.inner.rebuild_status.lock();
        match &r {
            Ok(_) => {
                st.last_error = None;
                st.failed_attempts = 0;
            }
            Err(e) => {
                st.running = false;
                st.last_error = Some(e.to_string());
                st.failed_attempts += 1;
            }
        }
        drop(st);
        r.map(|mut s| {
            s.last_error = None;
            s.failed_attempts = 0;
            s
        })
    }

    /// Why the pool refuses writes (opened read-only, or a write failure beyond parity), or
    /// None while it takes them.
    pub fn read_only_reason(&self) -> Option<String> {
        self.inner.read_only.lock().clone()
    }

    /// Makes the pool refuse writes from now on, for the reason given (shown by
    /// [`Pool::read_only_reason`]).
    pub fn mark_read_only(&self, why: &str) {
        *self.inner.read_only.lock() = Some(why.to_string());
    }

    /// Progress of the current or last rebuild.
    pub fn rebuild_status(&self) -> RebuildStatus {
        let mut st = self.inner.rebuild_status.lock().clone();
        if st.running {
            st.elapsed_secs = st.elapsed_secs.max(0.0);
        }
        st
    }

    /// True when a failed or missing drive still holds data the pool depends on.
    /// (See also `Pool::readmit_healthy_drives` for drives whose fault was transient.)
    pub fn needs_rebuild(&self) -> bool {
        self.inner.lost_mask() != 0
    }
}
