//! Scrub and repair: read every stripe holding live data or log records of every segment
//! holding data (used or open), check every chunk's CRC32C on every member in service, and
//! repair what parity can: the damaged segment's live data is moved into new stripes (read through reconstruction), which rewrites every block of it
//! intact and frees the rotten space. Stripes that parity cannot recover are reported with
//! the volume and offset of every live block they hold, and left in place (their other blocks
//! still read). Host reads that had to reconstruct a block mark its segment for the same
//! repair (`Pool::repair_pending`), so rot found by a read does not stay on the drive.

use crate::error::Result;
use crate::format::header::{ChunkLoc, StripeKind};
use crate::layout::SegState;
use crate::pool::{Inner, Pool};
use crate::scan::StripeDesc;
use crate::stats::Stats;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// What a scrub found and did.
#[derive(Clone, Debug, Default)]
pub struct ScrubReport {
    pub segments_checked: u64,
    pub stripes_checked: u64,
    /// Stripes passed over, holding nothing live and covered by the checkpoint (superseded
    /// data waiting for the cleaner, stripes a crash cut short that the open rewrote).
    pub stripes_dead: u64,
    /// Bytes of chunks read and checked.
    pub bytes_checked: u64,
    /// Chunks on members in service that failed their CRC or could not be read.
    pub bad_chunks: u64,
    /// Segments whose live data was moved to repair them.
    pub segments_repaired: u64,
    /// Live blocks no parity could recover: (volume, byte offset).
    pub unrecoverable: Vec<(String, u64)>,
    /// Stripes that cannot be read now, though every chunk on a member in service checked:
    /// more of their chunks are on members out of service than parity covers. Not lost: they
    /// read again when enough of those members return (`drive readmit`, the drive put back).
    pub stripes_unavailable: u64,
    /// The live blocks those stripes hold.
    pub blocks_unavailable: u64,
    pub elapsed_secs: f64,
}

/// Most unrecoverable blocks a report lists (the count is in the log and the counters).
const MAX_LISTED: usize = 10_000;

impl Inner {
    /// Checks every chunk of one stripe on the members in service: (bytes read, the indexes
    /// of the chunks that failed their CRC, the indexes of those that could not be read).
    /// Counts and logs nothing: the caller first makes sure the stripe was still there to be
    /// checked (`Inner::fill_of`).
    fn check_stripe(&self, s: &StripeDesc) -> (u64, Vec<usize>, Vec<usize>) {
        let n = if s.w == 0 { 0 } else { s.w + s.m };
        let (mut bytes, mut bad, mut unreadable) = (0, Vec::new(), Vec::new());
        for (i, c) in s.chunks[..n].iter().enumerate() {
            let Some(drive) = self.drives.get(c.drive as usize).and_then(|d| d.usable()) else {
                continue;
            };
            let mut buf = crate::aligned::AlignedBuf::zeroed(c.len as usize);
            match drive.read_at(c.data_offset(), &mut buf) {
                Ok(()) if crate::crc::checksum(&buf) == c.crc => {}
                Ok(()) => bad.push(i),
                Err(_) => unreadable.push(i),
            }
            bytes += c.len as u64;
        }
        Stats::add(&self.stats.media_read_bytes, bytes);
        (bytes, bad, unreadable)
    }

    /// The segment's open count now, if it holds a fill (used or open): a stripe scanned
    /// while the count was `opened` is still on the drives as scanned only while this says
    /// the same (the cleaner may have emptied the segment, and the writer filled it again,
    /// while a scrub read it without the writer lock).
    fn fill_of(&self, seg: u32) -> Option<u64> {
        let w = self.writer.lock();
        matches!(w.segs.states[seg as usize], SegState::Used | SegState::Open)
            .then(|| w.segs.opened[seg as usize])
    }

    /// Whether chunk `c` is on a member out of service (failed, missing or retired).
    fn out_of_service(&self, c: &ChunkLoc) -> bool {
        self.drives
            .get(c.drive as usize)
            .and_then(|d| d.usable())
            .is_none()
    }

    /// How many of stripe `s`'s chunks are on members out of service.
    fn chunks_out_of_service(&self, s: &StripeDesc) -> usize {
        let n = if s.w == 0 { 0 } else { s.w + s.m };
        s.chunks[..n]
            .iter()
            .filter(|c| self.out_of_service(c))
            .count()
    }

    /// Whether stripe `s` holds nothing a scrub protects: no block the maps point at, and no
    /// record a recovery would replay (the latest checkpoint covers it). Such a stripe waits
    /// for the cleaner, which reads none of it: damage there loses nothing, and a stripe a
    /// crash cut short, which the open rewrote elsewhere, is one of them (its missing chunk
    /// is no rot). A stripe whose records were not read is checked: what it holds is unknown.
    fn holds_nothing(&self, s: &StripeDesc) -> bool {
        s.records.is_some()
            && s.seq <= self.sb.lock().checkpoint.seq_end
            && self.live_blocks(s).is_empty()
    }

    /// The live blocks stored in chunks `lost` of a stripe that do not read back (volume
    /// name, byte offset), from its records. A chunk fails its CRC when any of its bytes
    /// rotted, but each block has its own CRC: a block whose bytes still check is intact, not
    /// lost, however bad the rest of its chunk.
    fn lost_blocks(&self, s: &StripeDesc, lost: &[usize]) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let mut buf = crate::aligned::AlignedBuf::zeroed(crate::format::BLOCK);
        for b in self.live_blocks(s) {
            if lost.contains(&b.chunk) && self.read_block(&b.vol, b.lba, &mut buf).is_err() {
                out.push((b.vol.name.clone(), b.lba * crate::format::BLOCK as u64));
            }
        }
        out
    }

    /// Scrubs every segment holding data; repairs damaged ones when `repair`. `rate` bounds
    /// the bytes read per second (None: as fast as the drives go).
    pub(crate) fn scrub(&self, repair: bool, rate: Option<u64>) -> Result<ScrubReport> {
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(crate::error::Error::Failed("the pool is closed".into()));
        }
        let started = Instant::now();
        let mut rep = ScrubReport::default();
        let segments: Vec<u32> = {
            let w = self.writer.lock();
            (0..w.segs.states.len())
                .filter(|&s| matches!(w.segs.states[s], SegState::Used | SegState::Open))
                .map(|s| s as u32)
                .collect()
        };
        let mut damaged = BTreeSet::new();
        for seg in segments {
            let Some(opened) = self.fill_of(seg) else {
                continue; // emptied since the list was made
            };
            rep.segments_checked += 1;
            let mut bad_here = false;
            let stripes = self.scan_segment(seg, true);
            // Stripes of an earlier fill of the segment (left where a drive ignores discards,
            // as allocated drive files do, and found where a walk steps past the newest fill's
            // end onto them) hold nothing live, and the newest fill wrote over parts of their
            // chunks: checking them found "bad chunks" on undamaged drives. Every stripe names
            // its fill's first; the newest fill's is the highest (as the cleaner filters).
            let fill_start = stripes.values().map(|d| d.fill_start).max().unwrap_or(0);
            for desc in stripes.values().filter(|d| d.seq >= fill_start) {
                // Stripes still on their way to the drives (in an open segment) are not
                // checked yet: their chunks may not all be written.
                if desc.kind != StripeKind::Data || self.done.lock().inflight.contains(&desc.seq) {
                    continue;
                }
                if self.holds_nothing(desc) {
                    rep.stripes_dead += 1;
                    continue;
                }
                rep.stripes_checked += 1;
                let (bytes, crc_bad, unreadable) = self.check_stripe(desc);
                rep.bytes_checked += bytes;
                if crc_bad.is_empty() && unreadable.is_empty() {
                    // Sound where it could be checked; readable only if enough of it is in
                    // service (with members down beyond parity, a scrub that said nothing
                    // here reported a pool whose data could not be read as clean).
                    if self.chunks_out_of_service(desc) > desc.m
                        && self.fill_of(seg) == Some(opened)
                    {
                        rep.stripes_unavailable += 1;
                        rep.blocks_unavailable += self.live_blocks(desc).len() as u64;
                    }
                    continue;
                }
                // Chunks that did not check out are damage only if the stripe was still
                // there: a segment the cleaner emptied and the writer filled again under the
                // scan has other chunks now (hosts writing while a scrub ran made it report
                // hundreds of bad chunks on sound drives, and move segments for nothing).
                if self.fill_of(seg) != Some(opened) {
                    break;
                }
                Stats::add(&self.stats.crc_errors, crc_bad.len() as u64);
                Stats::add(&self.stats.read_errors, unreadable.len() as u64);
                let mut bad = crc_bad;
                bad.extend(unreadable);
                bad.sort_unstable();
                for &i in &bad {
                    let c = &desc.chunks[i];
                    tracing::warn!(
                        drive = c.drive,
                        offset = c.data_offset(),
                        seq = desc.seq,
                        "scrub: chunk fails its CRC or read"
                    );
                }
                rep.bad_chunks += bad.len() as u64;
                bad_here = true;
                if self.read_stripe(desc, None).is_err() {
                    // Every chunk not readable now: the bad ones and those on members out of
                    // service.
                    let n = desc.w + desc.m;
                    let lost: Vec<usize> = (0..n)
                        .filter(|&i| bad.contains(&i) || self.out_of_service(&desc.chunks[i]))
                        .collect();
                    let blocks = self.lost_blocks(desc, &lost);
                    for (vol, off) in &blocks {
                        tracing::error!(volume = %vol, offset = off, "scrub: block lost: parity cannot recover it");
                    }
                    Stats::add(&self.stats.unrecoverable_blocks, blocks.len() as u64);
                    let room = MAX_LISTED.saturating_sub(rep.unrecoverable.len());
                    rep.unrecoverable.extend(blocks.into_iter().take(room));
                }
            }
            // A segment holding a stripe parity cannot recover is repaired too: everything
            // else in it moves (rot in its other stripes included), the lost stripe stays.
            if bad_here {
                damaged.insert(seg);
            }
            if let Some(r) = rate.filter(|r| *r > 0) {
                let due = Duration::from_secs_f64(rep.bytes_checked as f64 / r as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        }
        if repair && !damaged.is_empty() {
            self.relocate_segments(&damaged, true)?;
            rep.segments_repaired = damaged.len() as u64;
            Stats::add(&self.stats.repaired_segments, damaged.len() as u64);
        }
        rep.elapsed_secs = started.elapsed().as_secs_f64();
        if rep.stripes_unavailable > 0 {
            tracing::warn!(
                stripes = rep.stripes_unavailable,
                blocks = rep.blocks_unavailable,
                "scrub: stripes cannot be read while members are out of service (more of \
                 their chunks are on them than parity covers); put those members back"
            );
        }
        tracing::info!(
            segments = rep.segments_checked,
            bad_chunks = rep.bad_chunks,
            repaired = rep.segments_repaired,
            unrecoverable = rep.unrecoverable.len(),
            unavailable = rep.stripes_unavailable,
            "scrub done"
        );
        Ok(rep)
    }
}

impl Pool {
    /// Reads and checks every stripe holding live data; with `repair`, moves the live data of
    /// every damaged segment that parity can recover. `rate`: bytes per second at most.
    pub fn scrub(&self, repair: bool, rate: Option<u64>) -> Result<ScrubReport> {
        let checking: Vec<usize> = self.inner.unverified.lock().iter().copied().collect();
        let r = self.inner.scrub(repair, rate)?;
        if repair {
            // Every chunk on them checked and what was missing repaired.
            self.inner
                .unverified
                .lock()
                .retain(|m| !checking.contains(m));
        }
        *self.inner.last_scrub.lock() = Some(r.clone());
        Ok(r)
    }

    /// Members opened one superblock generation behind the pool's, not yet checked by a
    /// repairing scrub: a crash while superblocks were written leaves such a member whole, an
    /// old copy of the drive put back does not (it lacks the chunks written since), and only
    /// reading its chunks tells. A server scrubs at once when there are any. Only members in
    /// service are named: a failed or retired one serves nothing (its data is rebuilt from
    /// the others), and one readmitted later is named again until a scrub checks it.
    pub fn unverified_members(&self) -> Vec<usize> {
        // A retired slot is failed too, so `usable` alone tells a member in service.
        let in_service = |m: usize| self.inner.drives.get(m).and_then(|s| s.usable()).is_some();
        let behind = self.inner.unverified.lock();
        behind.iter().copied().filter(|&m| in_service(m)).collect()
    }

    /// The report of the last scrub this process ran.
    pub fn last_scrub(&self) -> Option<ScrubReport> {
        self.inner.last_scrub.lock().clone()
    }

    /// Repairs the segments where host reads had to reconstruct a block (bit rot or a read
    /// error on a member in service): their live data is moved. Returns how many.
    pub fn repair_pending(&self) -> Result<usize> {
        let inner = &self.inner;
        let pending = std::mem::take(&mut *inner.needs_repair.lock());
        if pending.is_empty() || inner.read_only.lock().is_some() {
            return Ok(0);
        }
        let segs: BTreeSet<u32> = {
            let w = inner.writer.lock();
            pending
                .iter()
                .copied()
                .filter(|&s| matches!(w.segs.states[s as usize], SegState::Used | SegState::Open))
                .collect()
        };
        if let Err(e) = inner.relocate_segments(&segs, true) {
            inner.needs_repair.lock().extend(pending);
            return Err(e);
        }
        // Everything readable in them moved; what is left is lost, and the repair's own reads
        // of it queued them again: done with them.
        inner.needs_repair.lock().retain(|s| !segs.contains(s));
        Stats::add(&inner.stats.repaired_segments, segs.len() as u64);
        tracing::info!(
            segments = segs.len(),
            "repaired segments where reads found bad blocks"
        );
        Ok(segs.len())
    }

    /// Segments waiting for `repair_pending`.
    pub fn repairs_pending(&self) -> usize {
        self.inner.needs_repair.lock().len()
    }
}
