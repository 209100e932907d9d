//! The read path: map lookup, then the stripe buffer (data not yet on the drives) or one drive
//! read checked against the CRC tag in the map entry; on a drive error or a tag mismatch, the
//! block is rebuilt from the rest of its stripe, every chunk checked against its CRC32C.

use crate::compress;
use crate::error::{Error, Result};
use crate::format::BLOCK;
use crate::map::Entry;
use crate::pool::{Inner, VolumeState};
use crate::scan::StripeDesc;
use crate::stats::Stats;

impl Inner {
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
                        tracing::error!(volume = %vol.name, offset = lba * BLOCK as u64, error = %e, "block lost: parity cannot recover it");
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
                    tracing::warn!(drive = d, offset, "block CRC mismatch; reconstructing");
                }
                Err(e) => {
                    Stats::add(&self.stats.read_errors, 1);
                    tracing::warn!(drive = d, offset, error = %e, "read error; reconstructing");
                }
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
                self.seg_index.lock().remove(&seg);
            }
            let (desc, j) = self.find_stripe(d, offset)?;
            if in_service {
                // Rot or a read error on a member in service: repair the segment later
                // (`Pool::repair_pending`), not just this read.
                self.needs_repair.lock().insert(desc.segment);
            }
            let shards = match self.read_stripe(&desc, Some(d)) {
                Ok(s) => s,
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            };
            let at = (offset - desc.chunks[j].data_offset()) as usize;
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
        self.read_stripe_lost(s, avoid).map(|(shards, _)| shards)
    }

    /// `read_stripe`, also saying how many chunks had to be rebuilt or were unreadable parity.
    pub(crate) fn read_stripe_lost(
        &self,
        s: &StripeDesc,
        avoid: Option<usize>,
    ) -> Result<(Vec<Vec<u8>>, usize)> {
        let l = s.parity_len;
        let n = if s.w == 0 { 0 } else { s.w + s.m };
        let mut shards: Vec<Vec<u8>> = Vec::with_capacity(n);
        let mut present = Vec::with_capacity(n);
        for c in &s.chunks[..n] {
            let mut buf = vec![0u8; l];
            let d = c.drive as usize;
            let ok = match self.drives.get(d).and_then(|x| x.usable()) {
                Some(drive) if Some(d) != avoid => {
                    match drive.read_at(c.data_offset(), &mut buf[..c.len as usize]) {
                        Ok(()) => {
                            Stats::add(&self.stats.media_read_bytes, c.len as u64);
                            let good = crate::crc::checksum(&buf[..c.len as usize]) == c.crc;
                            if !good {
                                Stats::add(&self.stats.crc_errors, 1);
                            }
                            good
                        }
                        Err(_) => {
                            Stats::add(&self.stats.read_errors, 1);
                            false
                        }
                    }
                }
                _ => false,
            };
            shards.push(buf);
            present.push(ok);
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
