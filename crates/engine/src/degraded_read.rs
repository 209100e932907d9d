//! Degraded reads: a block whose drive is lost (or whose read or CRC tag failed) is rebuilt
//! from the *same bytes* of its stripe's other chunks, not from whole chunks. The erasure codes
//! work byte by byte across a stripe's chunks, so bytes `a..b` of a chunk follow from bytes
//! `a..b` of any `w` others: a lost 4 KiB block costs `w` reads of 4 KiB instead of `w`
//! whole chunks, and the lost blocks of a request that lie together in one chunk share one
//! span.
//!
//! A request's rebuild is planned with the rest of its reads ([`Inner::plan_rebuild`], called
//! by `Inner::plan_ranges`): its source reads go out with the request's other drive reads, in
//! one batch or on a read queue's ring, and [`Inner::finish_rebuild`] decodes the spans once
//! they are in. So a degraded read waits for one round of drive reads, like a healthy one,
//! and a reactor never blocks on it. A block's stripe is found in the stripe index
//! (`stripe_index.rs`: a scan of its segment's chunk headers, kept), which
//! [`crate::Pool::prepare_degraded_reads`] fills ahead of the reads while a member is out of
//! service, so the first degraded read of a segment does not scan inside the read either.
//!
//! No chunk CRC covers part of a chunk: each rebuilt block is checked against the CRC tag in
//! its map entry, and a block that fails goes the one-block way, whose last resort is the
//! whole stripe ([`Inner::read_stripe`]): every chunk checked, the one that lies found.

use crate::aligned::AlignedBuf;
use crate::compress;
use crate::drive::{batch, BatchItem, DriveRef};
use crate::error::{Error, Result};
use crate::format::BLOCK;
use crate::map::Entry;
use crate::pool::{Inner, VolumeState};
use crate::scan::StripeDesc;
use crate::stats::Stats;

/// A block of a request whose drive is out of service: where the request wants it and where
/// its map entry says it is stored.
pub(crate) struct LostBlock {
    /// (range, block index) in the request.
    pub(crate) at: (usize, usize),
    pub(crate) lba: u64,
    /// The map entry it is rebuilt for; the data counts only if the entry is unchanged after.
    pub(crate) raw: u64,
    pub(crate) entry: Entry,
}

/// The rebuild of a request's lost blocks, planned: its spans, their source reads and the
/// buffers those land in. The reads go out with the request's others; the spans are decoded
/// by [`Inner::finish_rebuild`].
#[derive(Default)]
pub(crate) struct RebuildPlan {
    stripes: Vec<StripeDesc>,
    spans: Vec<SpanPlan>,
    /// Every span's source reads, span by span.
    pub(crate) reads: Vec<SourceRead>,
}

/// Bytes `start..end` of chunk `chunk` of a stripe, to rebuild.
struct SpanPlan {
    stripe: usize,
    chunk: usize,
    /// Offset of the span in the chunk's data (block-aligned; its length is the shards').
    start: usize,
    /// One buffer of `end - start` bytes per chunk of the stripe (a chunk shorter than the
    /// span is zeros past its end, as the codes see it).
    shards: Vec<AlignedBuf>,
    /// The chunks read (or all zeros there): `w` of them unless `short`.
    present: Vec<bool>,
    /// Fewer than `w` chunks readable: it cannot be rebuilt.
    short: bool,
    blocks: Vec<SpanBlock>,
}

/// A block a span holds: (offset in the chunk's data, stored length, the block).
type SpanBlock = (usize, usize, LostBlock);

/// One drive read of a span's source chunk (block-aligned offset and length).
pub(crate) struct SourceRead {
    span: usize,
    chunk: usize,
    pub(crate) drive: DriveRef,
    pub(crate) offset: u64,
    pub(crate) len: usize,
}

impl RebuildPlan {
    pub(crate) fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Each read's drive, offset and the buffer it lands in, in `reads` order.
    pub(crate) fn targets(&mut self) -> Vec<(&DriveRef, u64, &mut [u8])> {
        let RebuildPlan { spans, reads, .. } = self;
        let mut bufs: Vec<Vec<Option<&mut AlignedBuf>>> = spans
            .iter_mut()
            .map(|s| s.shards.iter_mut().map(Some).collect())
            .collect();
        reads
            .iter()
            .map(|r| {
                let b = bufs[r.span][r.chunk].take().expect("one read per chunk");
                (&r.drive, r.offset, &mut b[..r.len])
            })
            .collect()
    }
}

impl crate::Pool {
    /// While a member is out of service: finds the stripes of up to `max_segments` segments
    /// that may hold its chunks and that the stripe index lacks, so the first degraded read
    /// in each needs no scan of chunk headers (which would otherwise run inside that read, on
    /// the thread serving it: a reactor's other connections would wait for it). Stops early
    /// when the index is full. Returns the segments scanned: 0 once there is nothing left to
    /// do (or no member is out of service). A server calls it in the background, a few
    /// segments at a time, until it returns 0.
    pub fn prepare_degraded_reads(&self, max_segments: usize) -> usize {
        self.inner.index_lost_stripes(max_segments)
    }
}

impl Inner {
    /// See [`crate::Pool::prepare_degraded_reads`].
    pub(crate) fn index_lost_stripes(&self, max_segments: usize) -> usize {
        let lost = self.lost_mask();
        if lost == 0 {
            return 0;
        }
        let candidates: Vec<u32> = {
            let w = self.writer.lock();
            (0..w.segs.states.len())
                .filter(|&s| w.segs.states[s].holds_data() && w.segs.drives_used[s] & lost != 0)
                .map(|s| s as u32)
                .collect()
        };
        let mut scanned = 0;
        for seg in candidates {
            if scanned == max_segments {
                break;
            }
            {
                let index = self.seg_index.lock();
                if !index.has_room() {
                    break;
                }
                if index.contains(seg) {
                    continue;
                }
            }
            self.index_segment(seg);
            scanned += 1;
        }
        scanned
    }
}

impl Inner {
    /// The block at `at` of a request (block `lba`, map entry `raw`) if it is stored on a
    /// drive out of service.
    pub(crate) fn lost_block(&self, at: (usize, usize), lba: u64, raw: u64) -> Option<LostBlock> {
        match Entry::decode(raw)? {
            entry @ Entry::Media { drive, .. }
                if self
                    .drives
                    .get(drive as usize)
                    .and_then(|s| s.usable())
                    .is_none() =>
            {
                Some(LostBlock {
                    at,
                    lba,
                    raw,
                    entry,
                })
            }
            _ => None,
        }
    }

    /// Plans the rebuild of `lost`: finds each block's stripe (a cached scan of its segment),
    /// merges the blocks of one chunk that touch into a span, and picks each span's sources:
    /// `w` other chunks, data first, on drives in service. Returns the plan and the blocks it
    /// could not place (no stripe found), for the one-block way.
    pub(crate) fn plan_rebuild(&self, lost: Vec<LostBlock>) -> (RebuildPlan, Vec<(usize, usize)>) {
        let mut plan = RebuildPlan::default();
        let mut unplaced = Vec::new();
        // Where each block is stored: (stripe, chunk, offset in the chunk's data, length).
        let mut placed: Vec<(usize, usize, usize, usize, LostBlock)> = Vec::new();
        for lb in lost {
            let Entry::Media {
                drive, offset, len, ..
            } = lb.entry
            else {
                unplaced.push(lb.at);
                continue;
            };
            let d = drive as usize;
            let found = plan
                .stripes
                .iter()
                .enumerate()
                .find_map(|(k, s)| s.data_chunk_covering(d, offset).map(|j| (k, j)));
            let (k, j) = match found {
                Some(kj) => kj,
                None => match self.find_stripe(d, offset) {
                    Ok((desc, j)) => {
                        plan.stripes.push(desc);
                        (plan.stripes.len() - 1, j)
                    }
                    Err(_) => {
                        unplaced.push(lb.at);
                        continue;
                    }
                },
            };
            let c = &plan.stripes[k].chunks[j];
            let at = (offset - c.data_offset()) as usize;
            if at + len as usize > c.len as usize {
                unplaced.push(lb.at);
                continue;
            }
            placed.push((k, j, at, len as usize, lb));
        }
        // The blocks of one chunk in offset order, merged into spans where they touch.
        placed.sort_unstable_by_key(|p| (p.0, p.1, p.2));
        // (stripe, chunk, start, end, blocks)
        let mut spans: Vec<(usize, usize, usize, usize, Vec<SpanBlock>)> = Vec::new();
        for (k, j, at, len, lb) in placed {
            let (start, end) = (at / BLOCK * BLOCK, (at + len).div_ceil(BLOCK) * BLOCK);
            match spans.last_mut() {
                Some(sp) if sp.0 == k && sp.1 == j && start <= sp.3 => {
                    sp.3 = sp.3.max(end);
                    sp.4.push((at, len, lb));
                }
                _ => spans.push((k, j, start, end, vec![(at, len, lb)])),
            }
        }
        for (k, j, start, end, blocks) in spans {
            let end = end.min(plan.stripes[k].parity_len);
            self.plan_span(&mut plan, k, j, start, end, blocks);
        }
        (plan, unplaced)
    }

    /// Adds the span `start..end` of chunk `j` of stripe `k` to `plan`, with its sources.
    fn plan_span(
        &self,
        plan: &mut RebuildPlan,
        k: usize,
        j: usize,
        start: usize,
        end: usize,
        blocks: Vec<SpanBlock>,
    ) {
        let s = &plan.stripes[k];
        debug_assert!(j < s.w && start < end && end <= s.parity_len);
        debug_assert!(start.is_multiple_of(BLOCK) && end.is_multiple_of(BLOCK));
        let n = s.w + s.m;
        let len = end - start;
        let span = plan.spans.len();
        let mut present = vec![false; n];
        let mut have = 0;
        for i in (0..n).filter(|&i| i != j) {
            if have == s.w {
                break;
            }
            let c = &s.chunks[i];
            // Zeros past a chunk's end (chunk lengths are whole blocks): nothing to read.
            let stored = (c.len as usize).saturating_sub(start).min(len);
            if stored > 0 {
                let Some(d) = self.drives.get(c.drive as usize).and_then(|x| x.usable()) else {
                    continue;
                };
                plan.reads.push(SourceRead {
                    span,
                    chunk: i,
                    drive: d.clone(),
                    offset: c.data_offset() + start as u64,
                    len: stored,
                });
            }
            present[i] = true;
            have += 1;
        }
        plan.spans.push(SpanPlan {
            stripe: k,
            chunk: j,
            start,
            shards: (0..n).map(|_| AlignedBuf::zeroed(len)).collect(),
            present,
            short: have < s.w,
            blocks,
        });
    }

    /// Decodes the spans whose source reads all succeeded (`ok[r]`: read `r` of
    /// `plan.reads` did) and puts their blocks into `ranges` (each `(first block, buffer)`)
    /// where the block's CRC tag matches and its map entry is unchanged. Returns the blocks it
    /// did not read, for the one-block way.
    pub(crate) fn finish_rebuild(
        &self,
        vol: &VolumeState,
        plan: RebuildPlan,
        ok: &[bool],
        ranges: &mut [(u64, &mut [u8])],
    ) -> Vec<(usize, usize)> {
        let failed = self.tally_reads(&plan, ok);
        let mut undone = Vec::new();
        for (mut sp, failed) in plan.spans.into_iter().zip(failed) {
            let s = &plan.stripes[sp.stripe];
            if sp.short || failed {
                if let Some(a) = self.lost_log.admit() {
                    tracing::warn!(
                        stripe = s.seq,
                        chunk = sp.chunk,
                        "cannot rebuild lost blocks from the same bytes of the other chunks: too few readable{}",
                        a.note()
                    );
                }
                undone.extend(sp.blocks.iter().map(|b| b.2.at));
                continue;
            }
            if let Err(e) = self.decode_span(&mut sp) {
                if let Some(a) = self.lost_log.admit() {
                    tracing::warn!(stripe = s.seq, error = %e, "rebuilding lost blocks failed{}", a.note());
                }
                undone.extend(sp.blocks.iter().map(|b| b.2.at));
                continue;
            }
            let bytes = &sp.shards[sp.chunk];
            for (at, len, lb) in &sp.blocks {
                let stored = &bytes[at - sp.start..at - sp.start + len];
                let (ri, i) = lb.at;
                let out = &mut ranges[ri].1[i * BLOCK..(i + 1) * BLOCK];
                if lb.entry.tag_matches(crate::crc::checksum(stored))
                    && compress::decode(stored, out).is_ok()
                    && vol.map.get(lb.lba) == lb.raw
                {
                    Stats::add(&self.stats.degraded_reads, 1);
                } else {
                    undone.push(lb.at);
                }
            }
        }
        undone
    }

    /// Counts the plan's source reads (`ok[r]`: read `r` succeeded) as bytes read or read
    /// errors; returns, per span, whether one of its reads failed.
    fn tally_reads(&self, plan: &RebuildPlan, ok: &[bool]) -> Vec<bool> {
        debug_assert_eq!(ok.len(), plan.reads.len());
        let mut failed = vec![false; plan.spans.len()];
        for (r, &good) in plan.reads.iter().zip(ok) {
            if good {
                Stats::add(&self.stats.media_read_bytes, r.len as u64);
            } else {
                let sp = &plan.spans[r.span];
                let d = plan.stripes[sp.stripe].chunks[r.chunk].drive as usize;
                self.note_read_error(d, r.offset, &"read error while rebuilding lost blocks");
                failed[r.span] = true;
            }
        }
        failed
    }

    /// Erasure-decodes a span whose sources are in: its chunk's bytes land in
    /// `shards[chunk]`.
    fn decode_span(&self, sp: &mut SpanPlan) -> Result<()> {
        let mut refs: Vec<&mut [u8]> = sp.shards.iter_mut().map(|b| &mut b[..]).collect();
        self.codec.reconstruct(&mut refs, &sp.present)?;
        Stats::add(&self.stats.reconstructed_chunks, 1);
        Ok(())
    }

    /// Rebuilds `lost` into `ranges` now: plans, reads every span's sources in one batch,
    /// decodes. Returns the blocks it did not read, for the one-block way.
    pub(crate) fn read_lost_blocks(
        &self,
        vol: &VolumeState,
        lost: Vec<LostBlock>,
        ranges: &mut [(u64, &mut [u8])],
    ) -> Vec<(usize, usize)> {
        let (mut plan, mut undone) = self.plan_rebuild(lost);
        let ok = run_reads(&mut plan);
        undone.extend(self.finish_rebuild(vol, plan, &ok, ranges));
        undone
    }

    /// The `len` bytes at `at` in chunk `j` of stripe `s`, rebuilt from the same bytes of
    /// the other chunks (unchecked: see the module doc).
    pub(crate) fn rebuild_bytes(
        &self,
        s: &StripeDesc,
        j: usize,
        at: usize,
        len: usize,
    ) -> Result<Vec<u8>> {
        let start = at / BLOCK * BLOCK;
        let end = ((at + len).div_ceil(BLOCK) * BLOCK).min(s.parity_len);
        if at + len > end {
            return Err(Error::corrupt(format!(
                "bytes {at}..{} past stripe {}'s parity length",
                at + len,
                s.seq
            )));
        }
        let mut plan = RebuildPlan {
            stripes: vec![s.clone()],
            ..RebuildPlan::default()
        };
        self.plan_span(&mut plan, 0, j, start, end, Vec::new());
        let ok = run_reads(&mut plan);
        let failed = self.tally_reads(&plan, &ok);
        if plan.spans[0].short || failed[0] {
            return Err(Error::Unavailable(format!(
                "stripe {}: too few chunks readable to rebuild chunk {j}",
                s.seq
            )));
        }
        let sp = &mut plan.spans[0];
        self.decode_span(sp)?;
        Ok(sp.shards[j][at - start..at - start + len].to_vec())
    }
}

/// Runs a plan's source reads as one batch; whether each succeeded, in `reads` order.
fn run_reads(plan: &mut RebuildPlan) -> Vec<bool> {
    let mut items: Vec<BatchItem<'_>> = plan
        .targets()
        .into_iter()
        .map(|(d, off, buf)| BatchItem::read(&**d, off, buf))
        .collect();
    batch::run(&mut items).iter().map(|r| r.is_ok()).collect()
}
