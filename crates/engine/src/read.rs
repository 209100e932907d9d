//! The read path: map lookup, then the stripe buffer (data not yet on the drives) or one drive
//! read checked against the CRC tag in the map entry; on a drive error or a tag mismatch, the
//! block is rebuilt from the same bytes of its stripe's other chunks (`degraded_read`), and as
//! a last resort from the whole stripe, every chunk checked against its CRC32C.
//!
//! A read of many blocks (`read_blocks`) first groups the blocks that lie one after another on
//! one drive into a single drive read, plans the rebuild of its blocks on drives out of
//! service, and issues all those reads as one batch (`drive::batch`): a 1 MiB read of data
//! written sequentially is one read per chunk, all drives at once, and a degraded one adds a
//! few reads per lost chunk to the same batch. Whatever such a read cannot vouch for (a block
//! moved meanwhile, a tag mismatch, a drive error, a packed or buffered block) goes through the
//! one-block path.

use crate::compress;
use crate::degraded_read::{LostBlock, RebuildPlan};
use crate::drive::{batch, BatchItem, DriveRef};
use crate::error::{Error, Result};
use crate::format::BLOCK;
use crate::map::Entry;
use crate::pool::{Inner, VolumeState};
use crate::scan::StripeDesc;
use crate::stats::Counter;
use crate::stats::Stats;
use std::collections::HashSet;

/// The longest single drive read `read_blocks` issues (a chunk is at most this on the default
/// geometry, so data written sequentially is one read per chunk).
const MAX_RUN_BYTES: usize = 1 << 20;

/// Blocks that lie one after another on one drive: one drive read.
pub(crate) struct Run {
    /// Which range of the request it belongs to.
    pub(crate) range: usize,
    pub(crate) drive: usize,
    pub(crate) dev_offset: u64,
    /// Index of its first block in the range.
    pub(crate) first: usize,
    pub(crate) blocks: usize,
}

/// The drive reads a set of ranges needs, worked out from the block maps
/// ([`Inner::plan_ranges`]), and the map entries their data is checked against once read
/// ([`Inner::finish_ranges`]). Between the two the reads may be in flight for as long as the
/// drives take: whatever changed meanwhile (a block moved by the cleaner, its segment reused)
/// is caught by the check and read again the one-block way.
pub(crate) struct ReadPlan {
    /// Map entry of every block of every range, as the plan saw it.
    seen: Vec<Vec<u64>>,
    /// Drive reads, in range and block order, disjoint.
    pub(crate) runs: Vec<Run>,
    /// Blocks read one at a time at the finish: (range, block index).
    one_by_one: Vec<(usize, usize)>,
    /// Blocks on drives out of service, rebuilt from their stripes: reads that go out with
    /// `runs`.
    pub(crate) rebuild: RebuildPlan,
}

impl ReadPlan {
    /// Drive reads of the plan: its runs, then its rebuild's source reads; `ok` slices given
    /// to [`Inner::finish_ranges`] are in this order.
    pub(crate) fn reads(&self) -> usize {
        self.runs.len() + self.rebuild.reads.len()
    }

    /// Every drive read of the plan, in [`ReadPlan::reads`] order: each run into its part of
    /// its range's buffer (`outs`, one per range), then the rebuild's source reads into the
    /// plan's own buffers. A run whose drive went out of service since the plan has no drive
    /// (its blocks go the one-block way at the finish).
    pub(crate) fn drive_reads<'a>(
        &'a mut self,
        pool: &Inner,
        outs: Vec<&'a mut [u8]>,
    ) -> Vec<(Option<DriveRef>, u64, &'a mut [u8])> {
        debug_assert_eq!(outs.len(), self.seen.len());
        let mut reads = Vec::with_capacity(self.reads());
        let mut runs = self.runs.iter().peekable();
        // Runs are in range and block order, and disjoint.
        for (ri, out) in outs.into_iter().enumerate() {
            let mut rest = out;
            let mut at = 0usize;
            while let Some(r) = runs.next_if(|r| r.range == ri) {
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(r.first * BLOCK - at);
                let (mine, tail) = tail.split_at_mut(r.blocks * BLOCK);
                rest = tail;
                at = (r.first + r.blocks) * BLOCK;
                reads.push((pool.drives[r.drive].usable().cloned(), r.dev_offset, mine));
            }
        }
        debug_assert!(runs.next().is_none(), "every run in a range");
        for (d, off, buf) in self.rebuild.targets() {
            reads.push((Some(d.clone()), off, buf));
        }
        reads
    }

    /// Bytes of drive read `k` (in [`ReadPlan::reads`] order).
    pub(crate) fn read_len(&self, k: usize) -> usize {
        match self.runs.get(k) {
            Some(r) => r.blocks * BLOCK,
            None => self.rebuild.reads[k - self.runs.len()].len,
        }
    }
}

impl Inner {
    /// Reads whole blocks `lba..lba + out.len() / 4096` into `out` with as few drive reads as
    /// their placement allows, all drives at once.
    pub(crate) fn read_blocks(&self, vol: &VolumeState, lba: u64, out: &mut [u8]) -> Result<()> {
        self.read_ranges(vol, &mut [(lba, out)])
            .pop()
            .expect("one result per range")
    }

    /// Reads several ranges of whole blocks, each `(first block, buffer)`, with one batch of
    /// drive reads for all of them; one result per range.
    pub(crate) fn read_ranges(
        &self,
        vol: &VolumeState,
        ranges: &mut [(u64, &mut [u8])],
    ) -> Vec<Result<()>> {
        let shape: Vec<(u64, usize)> = ranges
            .iter()
            .map(|(lba, out)| (*lba, out.len() / BLOCK))
            .collect();
        let mut plan = self.plan_ranges(vol, &shape);
        let mut ok = vec![false; plan.reads()];
        if plan.reads() > 0 {
            let outs: Vec<&mut [u8]> = ranges.iter_mut().map(|(_, out)| &mut **out).collect();
            let mut reads = plan.drive_reads(self, outs);
            let mut items = Vec::with_capacity(reads.len());
            let mut which = Vec::with_capacity(reads.len());
            for (k, (d, off, buf)) in reads.iter_mut().enumerate() {
                if let Some(d) = d {
                    items.push(BatchItem::read(&**d, *off, buf));
                    which.push(k);
                }
            }
            for (k, res) in which.into_iter().zip(batch::run(&mut items)) {
                ok[k] = res.is_ok();
            }
        }
        self.finish_ranges(vol, plan, ranges, &ok)
    }

    /// The drive reads of ranges `(first block, blocks)`: blocks that lie one after another
    /// on a drive in service, stored whole, make one run (up to [`MAX_RUN_BYTES`]); the rest
    /// (unmapped, buffered, compressed, on a drive out of service) are left to the finish.
    pub(crate) fn plan_ranges(&self, vol: &VolumeState, ranges: &[(u64, usize)]) -> ReadPlan {
        let mut seen: Vec<Vec<u64>> = Vec::with_capacity(ranges.len());
        let mut runs: Vec<Run> = Vec::new();
        let mut one_by_one: Vec<(usize, usize)> = Vec::new();
        let mut lost: Vec<LostBlock> = Vec::new();
        for (ri, &(lba, n)) in ranges.iter().enumerate() {
            let mut raws = Vec::with_capacity(n);
            for i in 0..n {
                let raw = vol.map.get(lba + i as u64);
                raws.push(raw);
                match Entry::decode(raw) {
                    Some(Entry::Media {
                        drive, offset, len, ..
                    }) if len as usize == BLOCK
                        && offset.is_multiple_of(BLOCK as u64)
                        && self
                            .drives
                            .get(drive as usize)
                            .and_then(|s| s.usable())
                            .is_some() =>
                    {
                        let d = drive as usize;
                        match runs.last_mut() {
                            Some(r)
                                if r.range == ri
                                    && r.drive == d
                                    && r.first + r.blocks == i
                                    && r.dev_offset + (r.blocks * BLOCK) as u64 == offset
                                    && (r.blocks + 1) * BLOCK <= MAX_RUN_BYTES =>
                            {
                                r.blocks += 1
                            }
                            _ => runs.push(Run {
                                range: ri,
                                drive: d,
                                dev_offset: offset,
                                first: i,
                                blocks: 1,
                            }),
                        }
                    }
                    _ => match self.lost_block((ri, i), lba + i as u64, raw) {
                        Some(l) => lost.push(l),
                        None => one_by_one.push((ri, i)),
                    },
                }
            }
            seen.push(raws);
        }
        let rebuild = if lost.is_empty() {
            RebuildPlan::default()
        } else {
            let (plan, unplaced) = self.plan_rebuild(lost);
            one_by_one.extend(unplaced);
            plan
        };
        ReadPlan {
            seen,
            runs,
            one_by_one,
            rebuild,
        }
    }

    /// Checks what the plan's runs read into `ranges` (`ok[k]`: run k's drive read
    /// succeeded) and reads everything it cannot vouch for, and the blocks the plan left, the
    /// one-block way (which retries, reconstructs and counts errors); one result per range.
    pub(crate) fn finish_ranges(
        &self,
        vol: &VolumeState,
        plan: ReadPlan,
        ranges: &mut [(u64, &mut [u8])],
        ok: &[bool],
    ) -> Vec<Result<()>> {
        debug_assert_eq!(ok.len(), plan.reads());
        debug_assert_eq!(ranges.len(), plan.seen.len());
        let ReadPlan {
            seen,
            runs,
            mut one_by_one,
            rebuild,
        } = plan;
        let (ok, rebuild_ok) = ok.split_at(runs.len());
        // Blocks the planned rebuild did not give back: the one-block way, not again below.
        let mut not_rebuilt: HashSet<(usize, usize)> = HashSet::new();
        if !rebuild.is_empty() {
            not_rebuilt.extend(self.finish_rebuild(vol, rebuild, rebuild_ok, ranges));
            one_by_one.extend(not_rebuilt.iter().copied());
        }
        for (r, &good) in runs.iter().zip(ok) {
            let (lba, out) = &ranges[r.range];
            debug_assert!((r.first + r.blocks) * BLOCK <= out.len());
            for i in r.first..r.first + r.blocks {
                let block = &out[i * BLOCK..(i + 1) * BLOCK];
                let raw = seen[r.range][i];
                // The data counts only if the entry did not change while it was read (the
                // cleaner may have moved the block and its segment been reused) and its CRC
                // tag matches; anything else goes the one-block way.
                let vouched = good
                    && vol.map.get(lba + i as u64) == raw
                    && Entry::decode(raw)
                        .is_some_and(|e| e.tag_matches(crate::crc::checksum(block)));
                if vouched {
                    Stats::add(&self.stats.media_read_bytes, BLOCK as u64);
                } else {
                    one_by_one.push((r.range, i));
                }
            }
        }
        // Blocks on drives that left service after the plan: rebuilt together now, a span of
        // each chunk at a time.
        let lost: Vec<LostBlock> = one_by_one
            .iter()
            .filter(|at| !not_rebuilt.contains(at))
            .filter_map(|&(ri, i)| {
                let lba = ranges[ri].0 + i as u64;
                self.lost_block((ri, i), lba, vol.map.get(lba))
            })
            .collect();
        if !lost.is_empty() {
            let tried: HashSet<(usize, usize)> = lost.iter().map(|l| l.at).collect();
            let undone: HashSet<(usize, usize)> = self
                .read_lost_blocks(vol, lost, ranges)
                .into_iter()
                .collect();
            one_by_one.retain(|at| !tried.contains(at) || undone.contains(at));
        }
        let mut results: Vec<Result<()>> = (0..ranges.len()).map(|_| Ok(())).collect();
        for (ri, i) in one_by_one {
            if results[ri].is_err() {
                continue;
            }
            let (lba, out) = &mut ranges[ri];
            if let Err(e) =
                self.read_block(vol, *lba + i as u64, &mut out[i * BLOCK..(i + 1) * BLOCK])
            {
                results[ri] = Err(e);
            }
        }
        results
    }

    /// Reads one 4 KiB block into `out`; returns true when it came from a drive.
    pub(crate) fn read_block(&self, vol: &VolumeState, lba: u64, out: &mut [u8]) -> Result<bool> {
        debug_assert_eq!(out.len(), BLOCK);
        // A buffered entry whose stripe just completed is retried; bounded so a bug cannot spin.
        for _ in 0..100_000 {
            let raw = vol.map.get(lba);
            match Entry::decode(raw) {
                None => return Err(Error::corrupt(format!("map entry {raw:#x} of block {lba}"))),
                Some(Entry::Unmapped) => {
                    out.fill(0);
                    return Ok(false);
                }
                Some(Entry::Buffered { seq, offset, len }) => {
                    let buf = self.inflight.read().get(&seq).cloned();
                    if let Some(b) = buf {
                        let g = b.data.read();
                        if let Some(data) = g.as_ref() {
                            let at = offset as usize;
                            compress::decode(&data[at..at + len as usize], out)?;
                            return Ok(false);
                        }
                    }
                    std::thread::yield_now();
                }
                Some(Entry::Media {
                    drive,
                    offset,
                    len,
                    tag,
                }) => {
                    let res = self.read_media(drive as usize, offset, len as usize, tag, out);
                    // The cleaner may have moved the block (and its segment been reused)
                    // while we read: the data counts only if the entry did not change.
                    if vol.map.get(lba) != raw {
                        continue;
                    }
                    if let Err(e) = &res {
                        Stats::add(&self.stats.unrecoverable_blocks, 1);
                        if let Some(a) = self.lost_log.admit() {
                            tracing::error!(volume = %vol.name, offset = lba * BLOCK as u64, error = %e, "block lost: parity cannot recover it{}", a.note());
                        }
                    }
                    res?;
                    return Ok(true);
                }
            }
        }
        Err(Error::Failed(format!(
            "block {lba} stayed in a stripe buffer that no longer exists"
        )))
    }

    /// Reads the stored block at `offset` (`len` bytes: 4096 raw, less compressed) and
    /// expands it into `out`; rebuilds it from its stripe when the drive fails or the CRC tag
    /// does not match.
    fn read_media(
        &self,
        d: usize,
        offset: u64,
        len: usize,
        tag: u32,
        out: &mut [u8],
    ) -> Result<()> {
        let entry = Entry::Media {
            drive: d as u8,
            offset,
            len: len as u32,
            tag,
        };
        if let Some(drive) = self.drives.get(d).and_then(|s| s.usable()) {
            let res = if len == BLOCK && offset.is_multiple_of(BLOCK as u64) {
                drive
                    .read_at(offset, out)
                    .map(|_| entry.tag_matches(crate::crc::checksum(out)))
            } else {
                // A packed block (compressed, or raw after a compressed one): read the 4 KiB
                // blocks around it.
                let start = offset / BLOCK as u64 * BLOCK as u64;
                let end = (offset + len as u64).div_ceil(BLOCK as u64) * BLOCK as u64;
                // At most two 4 KiB blocks: a stack buffer, no allocation per read (a backend
                // that needs alignment bounces it).
                let mut stack = [0u8; 2 * BLOCK];
                let tmp = &mut stack[..(end - start) as usize];
                let at = (offset - start) as usize;
                drive.read_at(start, tmp).map(|_| {
                    let stored = &tmp[at..at + len];
                    entry.tag_matches(crate::crc::checksum(stored))
                        && compress::decode(stored, out).is_ok()
                })
            };
            match res {
                Ok(good) => {
                    Stats::add(&self.stats.media_read_bytes, len.max(BLOCK) as u64);
                    if good {
                        return Ok(());
                    }
                    Stats::add(&self.stats.crc_errors, 1);
                    if let Some(a) = self.drives[d].read_log.admit() {
                        tracing::warn!(
                            drive = d,
                            offset,
                            "block CRC mismatch; reconstructing{}",
                            a.note()
                        );
                    }
                }
                Err(e) => self.note_read_error(d, offset, &e),
            }
        }
        let in_service = self.drives.get(d).and_then(|s| s.usable()).is_some();
        // A cached scan of the segment may predate the stripe that holds the block now (the
        // segment was reused, and a stale chunk of its previous use covers the same place):
        // rescan once when the stripe cannot be read or does not hold the block.
        let mut last_err = None;
        for rescan in [false, true] {
            if rescan {
                let seg = crate::layout::SegmentTable::segment_of(&self.geo, offset);
                self.seg_index.lock().remove(seg);
            }
            let (desc, j) = self.find_stripe(d, offset)?;
            if in_service {
                // Rot or a read error on a member in service: repair the segment later
                // (`Pool::repair_pending`), not just this read.
                self.needs_repair.lock().insert(desc.segment);
            }
            let at = (offset - desc.chunks[j].data_offset()) as usize;
            // The same bytes of the other chunks first (w small reads); the whole stripe,
            // every chunk checked, only when that does not give the block back.
            if let Ok(stored) = self.rebuild_bytes(&desc, j, at, len) {
                let stored = &stored[..];
                if entry.tag_matches(crate::crc::checksum(stored))
                    && compress::decode(stored, out).is_ok()
                {
                    Stats::add(&self.stats.degraded_reads, 1);
                    return Ok(());
                }
            }
            let shards = match self.read_stripe(&desc, Some(d)) {
                Ok(s) => s,
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            };
            let stored = &shards[j][at..at + len];
            if !entry.tag_matches(crate::crc::checksum(stored)) {
                last_err = Some(Error::Unavailable(format!(
                    "block at drive {d} offset {offset} fails its CRC after reconstruction"
                )));
                continue;
            }
            compress::decode(stored, out)?;
            Stats::add(&self.stats.degraded_reads, 1);
            return Ok(());
        }
        Err(last_err.expect("an attempt failed"))
    }

    /// Reads a stripe's chunks (each zero-extended to the parity length), treating read
    /// errors, CRC mismatches and the drive `avoid` as erasures, and rebuilds the data chunks.
    /// Returns all w + m shards.
    pub(crate) fn read_stripe(&self, s: &StripeDesc, avoid: Option<usize>) -> Result<Vec<Vec<u8>>> {
        self.read_stripe_lost(s, avoid, &self.stats.crc_errors)
            .map(|(shards, _)| shards)
    }

    /// `read_stripe`, counting the chunks that fail their CRC in `mismatches` (`crc_errors`,
    /// but an open counts the chunks a crash cut short as `torn_chunks`), and also saying how
    /// many chunks had to be rebuilt or were unreadable parity.
    pub(crate) fn read_stripe_lost(
        &self,
        s: &StripeDesc,
        avoid: Option<usize>,
        mismatches: &Counter,
    ) -> Result<(Vec<Vec<u8>>, usize)> {
        let l = s.parity_len;
        let n = if s.w == 0 { 0 } else { s.w + s.m };
        let mut shards: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; l]).collect();
        let mut present = vec![false; n];
        // Every chunk is read at once: one batch over the stripe's drives.
        let sources: Vec<_> = s.chunks[..n]
            .iter()
            .map(|c| {
                let d = c.drive as usize;
                match self.drives.get(d).and_then(|x| x.usable()) {
                    Some(drive) if Some(d) != avoid => Some(drive.clone()),
                    _ => None,
                }
            })
            .collect();
        let mut items = Vec::with_capacity(n);
        let mut which = Vec::with_capacity(n);
        for (i, (buf, (c, src))) in shards
            .iter_mut()
            .zip(s.chunks[..n].iter().zip(&sources))
            .enumerate()
        {
            if let Some(d) = src {
                items.push(BatchItem::read(
                    &**d,
                    c.data_offset(),
                    &mut buf[..c.len as usize],
                ));
                which.push(i);
            }
        }
        let results = batch::run(&mut items);
        drop(items);
        for (i, r) in which.into_iter().zip(results) {
            let c = &s.chunks[i];
            present[i] = match r {
                Ok(()) => {
                    Stats::add(&self.stats.media_read_bytes, c.len as u64);
                    let good = crate::crc::checksum(&shards[i][..c.len as usize]) == c.crc;
                    if !good {
                        Stats::add(mismatches, 1);
                    }
                    good
                }
                Err(e) => {
                    self.note_read_error(c.drive as usize, c.data_offset(), &e);
                    false
                }
            };
        }
        let lost: Vec<usize> = (0..n).filter(|&i| !present[i]).collect();
        if lost.iter().any(|&i| i < s.w) {
            let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(|v| v.as_mut_slice()).collect();
            self.codec.reconstruct(&mut refs, &present)?;
            for &i in &lost {
                let c = &s.chunks[i];
                if i < s.w && crate::crc::checksum(&shards[i][..c.len as usize]) != c.crc {
                    return Err(Error::Unavailable(format!(
                        "stripe {} chunk {i} fails its CRC after reconstruction",
                        s.seq
                    )));
                }
            }
            Stats::add(&self.stats.reconstructed_chunks, lost.len() as u64);
        }
        Ok((shards, lost.len()))
    }
}

#[cfg(test)]
mod tests {
    use crate::drive::{DriveRef, FileDrive};
    use crate::format::BLOCK;
    use crate::{Compression, Pool, PoolConfig};
    use std::sync::Arc;

    /// With a drive out of service, a read's plan holds the rebuild of its blocks on that
    /// drive: whole-block source reads of the other drives, which go out with the runs (in
    /// one batch, or on a read queue's ring), none left to the one-block way.
    #[test]
    fn a_degraded_plan_reads_the_rebuild_sources_with_the_runs() {
        let dir = tempfile::tempdir().unwrap();
        let drives: Vec<DriveRef> = (0..5)
            .map(|i| {
                let d = FileDrive::create(&dir.path().join(format!("d{i}.img")), 32 << 20);
                Arc::new(d.unwrap()) as DriveRef
            })
            .collect();
        let cfg = PoolConfig {
            k: 4,
            m: 1,
            chunk_size: 64 << 10,
            segment_size: 1 << 20,
            checkpoint_interval: 1 << 30,
        };
        let pool = Pool::create(drives, &cfg).unwrap();
        pool.create_volume_with("v", 8 << 20, Compression::Off)
            .unwrap();
        let v = pool.volume("v").unwrap();
        let data: Vec<u8> = (0..2 << 20)
            .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        v.write(0, &data).unwrap();
        v.flush().unwrap();
        let healthy = pool.inner.plan_ranges(&v.vol, &[(0, 512)]);
        assert!(healthy.rebuild.is_empty() && healthy.one_by_one.is_empty());
        pool.fail_drive(2).unwrap();
        let plan = pool.inner.plan_ranges(&v.vol, &[(0, 512)]);
        assert!(
            plan.one_by_one.is_empty(),
            "lost blocks left to the one-block way"
        );
        assert!(!plan.rebuild.is_empty());
        assert!(plan.runs.iter().all(|r| r.drive != 2));
        let lost = 512 - plan.runs.iter().map(|r| r.blocks).sum::<usize>();
        assert!(lost > 0);
        // w = 4 sources per span, each read whole blocks, aligned, never of the lost drive.
        let bytes: usize = plan.rebuild.reads.iter().map(|r| r.len).sum();
        assert_eq!(bytes, 4 * lost * BLOCK);
        for r in &plan.rebuild.reads {
            assert!(r.len % BLOCK == 0 && r.offset % BLOCK as u64 == 0);
            assert!(!Arc::ptr_eq(
                &r.drive,
                pool.inner.drives[2].drive.as_ref().unwrap()
            ));
        }
        // Read through the plan: the data, every lost block rebuilt.
        let before = pool.stats().degraded_reads;
        let mut out = vec![0u8; 2 << 20];
        pool.inner.read_blocks(&v.vol, 0, &mut out).unwrap();
        assert!(out == data);
        assert_eq!(pool.stats().degraded_reads - before, lost as u64);
    }
}
