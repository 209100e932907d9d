//! Degraded reads: a block whose drive is lost (or whose read or CRC tag failed) is rebuilt
//! from the *same bytes* of its stripe's other chunks, not from whole chunks. The erasure codes
//! work byte by byte across a stripe's chunks, so bytes `a..b` of a chunk follow from bytes
//! `a..b` of any `w` others: a lost 4 KiB block costs `w` reads of 4 KiB instead of `w`
//! whole chunks, and the lost blocks of a request that lie together in one chunk share one
//! rebuild ([`Inner::plan_spans`]). The reads of every span go out as one batch, all drives
//! at once.
//!
//! No chunk CRC covers part of a chunk: the caller checks each rebuilt block against the CRC
//! tag in its map entry, and a block that fails goes the whole-stripe way
//! ([`Inner::read_stripe`]), which checks every chunk and finds the one that lies.

use crate::compress;
use crate::drive::{batch, BatchItem, DriveRef};
use crate::error::{Error, Result};
use crate::format::BLOCK;
use crate::map::Entry;
use crate::pool::{Inner, VolumeState};
use crate::scan::StripeDesc;
use crate::stats::Stats;

/// Bytes `start..end` of chunk `chunk` of one stripe, to rebuild.
pub(crate) struct Span<'a> {
    pub(crate) stripe: &'a StripeDesc,
    pub(crate) chunk: usize,
    /// Offsets in the chunk's data, `start < end <= parity_len`.
    pub(crate) start: usize,
    pub(crate) end: usize,
}

impl Span<'_> {
    /// The span that holds the `len` bytes at `at` in the chunk's data, widened to whole
    /// 4 KiB blocks (aligned drive reads) within the stripe's parity length.
    pub(crate) fn around(stripe: &StripeDesc, chunk: usize, at: usize, len: usize) -> Span<'_> {
        let start = at / BLOCK * BLOCK;
        let end = (at + len).div_ceil(BLOCK) * BLOCK;
        Span {
            stripe,
            chunk,
            start,
            end: end.min(stripe.parity_len).max(at + len),
        }
    }
}

impl Inner {
    /// Rebuilds every span from the same bytes of `w` other chunks of its stripe (data
    /// chunks first, then parity; drives out of service skipped), all spans' reads in one
    /// batch. Returns each span's bytes, or why it could not be rebuilt (too few chunks
    /// readable, a read error); the result is not checked: see the module doc.
    pub(crate) fn rebuild_spans(&self, spans: &[Span<'_>]) -> Vec<Result<Vec<u8>>> {
        struct Plan {
            shards: Vec<Vec<u8>>,
            present: Vec<bool>,
            /// (chunk, drive, drive offset, bytes to read) of each read.
            reads: Vec<(usize, DriveRef, u64, usize)>,
            short: bool,
        }
        let mut plans: Vec<Plan> = spans
            .iter()
            .map(|sp| {
                let s = sp.stripe;
                debug_assert!(sp.chunk < s.w && sp.start < sp.end && sp.end <= s.parity_len);
                let n = s.w + s.m;
                let len = sp.end - sp.start;
                let mut present = vec![false; n];
                let mut reads = Vec::new();
                let mut have = 0;
                for i in (0..n).filter(|&i| i != sp.chunk) {
                    if have == s.w {
                        break;
                    }
                    let c = &s.chunks[i];
                    // A chunk shorter than the span is zeros past its end (the codes see
                    // every chunk zero-extended to the parity length).
                    let stored = (c.len as usize).saturating_sub(sp.start).min(len);
                    if stored > 0 {
                        match self.drives.get(c.drive as usize).and_then(|x| x.usable()) {
                            Some(d) => reads.push((
                                i,
                                d.clone(),
                                c.data_offset() + sp.start as u64,
                                stored,
                            )),
                            None => continue,
                        }
                    }
                    present[i] = true;
                    have += 1;
                }
                Plan {
                    shards: (0..n).map(|_| vec![0u8; len]).collect(),
                    present,
                    reads,
                    short: have < s.w,
                }
            })
            .collect();
        let mut items = Vec::new();
        let mut owner = Vec::new();
        for (p, plan) in plans.iter_mut().enumerate() {
            if plan.short {
                continue;
            }
            let mut bufs: Vec<Option<&mut Vec<u8>>> = plan.shards.iter_mut().map(Some).collect();
            for (i, d, offset, stored) in &plan.reads {
                let buf = bufs[*i].take().expect("one read per chunk");
                items.push(BatchItem::read(&**d, *offset, &mut buf[..*stored]));
                owner.push(p);
            }
        }
        let results = batch::run(&mut items);
        drop(items);
        let mut failed = vec![false; plans.len()];
        for (p, r) in owner.into_iter().zip(results) {
            match r {
                Ok(()) => {}
                Err(e) => {
                    Stats::add(&self.stats.read_errors, 1);
                    tracing::warn!(error = %e, "read error while rebuilding a lost block");
                    failed[p] = true;
                }
            }
        }
        plans
            .into_iter()
            .zip(spans)
            .zip(failed)
            .map(|((mut plan, sp), failed)| {
                let s = sp.stripe;
                if plan.short {
                    return Err(Error::Unavailable(format!(
                        "stripe {}: fewer than {} chunks readable",
                        s.seq, s.w
                    )));
                }
                if failed {
                    return Err(Error::Unavailable(format!(
                        "stripe {}: a read failed while rebuilding chunk {}",
                        s.seq, sp.chunk
                    )));
                }
                let read: usize = plan.reads.iter().map(|r| r.3).sum();
                Stats::add(&self.stats.media_read_bytes, read as u64);
                let mut refs: Vec<&mut [u8]> =
                    plan.shards.iter_mut().map(|v| v.as_mut_slice()).collect();
                self.codec.reconstruct(&mut refs, &plan.present)?;
                Stats::add(&self.stats.reconstructed_chunks, 1);
                Ok(std::mem::take(&mut plan.shards[sp.chunk]))
            })
            .collect()
    }

    /// One span's bytes (see [`Inner::rebuild_spans`]).
    pub(crate) fn rebuild_span(&self, span: &Span<'_>) -> Result<Vec<u8>> {
        self.rebuild_spans(std::slice::from_ref(span))
            .pop()
            .expect("one result per span")
    }
}

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

impl Inner {
    /// Rebuilds `lost` into `ranges` (each `(first block, buffer)`), the blocks that lie
    /// together in one chunk sharing one span, every span's reads in one batch. Returns, per
    /// lost block, whether it was read: rebuilt, its CRC tag matching and its map entry
    /// unchanged. The rest are for the one-block path, which retries, rescans and reports.
    pub(crate) fn read_lost_blocks(
        &self,
        vol: &VolumeState,
        lost: &[LostBlock],
        ranges: &mut [(u64, &mut [u8])],
    ) -> Vec<bool> {
        // Where each block is stored: (stripe, chunk, offset in the chunk's data, length).
        let mut stripes: Vec<StripeDesc> = Vec::new();
        let mut placed: Vec<(usize, usize, usize, usize, usize)> = Vec::new();
        for (b, lb) in lost.iter().enumerate() {
            let Entry::Media {
                drive, offset, len, ..
            } = lb.entry
            else {
                continue;
            };
            let d = drive as usize;
            let covers = |s: &StripeDesc| {
                s.chunks[..s.w].iter().position(|c| {
                    c.drive as usize == d && c.data_offset() <= offset && offset < c.end()
                })
            };
            let found = stripes
                .iter()
                .enumerate()
                .find_map(|(k, s)| covers(s).map(|j| (k, j)));
            let (k, j) = match found {
                Some(kj) => kj,
                None => match self.find_stripe(d, offset) {
                    Ok((desc, j)) => {
                        stripes.push(desc);
                        (stripes.len() - 1, j)
                    }
                    Err(_) => continue,
                },
            };
            let at = (offset - stripes[k].chunks[j].data_offset()) as usize;
            if at + len as usize > stripes[k].chunks[j].len as usize {
                continue;
            }
            placed.push((k, j, at, len as usize, b));
        }
        // Spans: the blocks of one chunk in offset order, merged where they touch.
        placed.sort_unstable();
        let mut spans: Vec<Span<'_>> = Vec::new();
        let mut members: Vec<Vec<(usize, usize, usize)>> = Vec::new();
        for &(k, j, at, len, b) in &placed {
            let want = Span::around(&stripes[k], j, at, len);
            match spans.last_mut() {
                Some(sp)
                    if std::ptr::eq(sp.stripe, &stripes[k])
                        && sp.chunk == j
                        && want.start <= sp.end =>
                {
                    sp.end = sp.end.max(want.end);
                }
                _ => {
                    spans.push(want);
                    members.push(Vec::new());
                }
            }
            members
                .last_mut()
                .expect("a span per block")
                .push((at, len, b));
        }
        let mut done = vec![false; lost.len()];
        for ((sp, bytes), blocks) in spans.iter().zip(self.rebuild_spans(&spans)).zip(members) {
            let Ok(bytes) = bytes else { continue };
            for (at, len, b) in blocks {
                let lb = &lost[b];
                let stored = &bytes[at - sp.start..at - sp.start + len];
                let (ri, i) = lb.at;
                let out = &mut ranges[ri].1[i * BLOCK..(i + 1) * BLOCK];
                if lb.entry.tag_matches(crate::crc::checksum(stored))
                    && compress::decode(stored, out).is_ok()
                    && vol.map.get(lb.lba) == lb.raw
                {
                    Stats::add(&self.stats.degraded_reads, 1);
                    done[b] = true;
                }
            }
        }
        done
    }
}
