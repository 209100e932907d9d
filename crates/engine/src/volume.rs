//! A thin volume and its block API: byte-granular read, write, trim and write-zeroes on top of
//! the pool's whole-block operations.
//!
//! Unaligned and sub-4 KiB writes are merged into their block under a per-block lock (read the
//! block, patch the bytes, append the whole block), so concurrent small writes to different
//! bytes of one block never lose each other. Unaligned trims zero the partial blocks at their
//! edges and unmap the whole blocks between.

use crate::compress::{Compression, Compressor};
use crate::error::{Error, Result};
use crate::format::BLOCK;
use crate::map::{BlockMap, Entry};
use crate::pool::{Inner, VolumeState};
use crate::stats::Stats;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const B: u64 = BLOCK as u64;

impl VolumeState {
    pub(crate) fn new(id: u32, name: &str, size: u64, compression: Compression) -> Self {
        VolumeState {
            id,
            name: name.to_owned(),
            size: AtomicU64::new(size),
            map: BlockMap::new(),
            deleted: AtomicBool::new(false),
            compressor: Compressor::new(compression),
            logical_held: Default::default(),
            stored_held: Default::default(),
        }
    }

    /// The map now points at a block stored in `len` bytes.
    pub(crate) fn hold(&self, len: u32) {
        self.logical_held.add(B);
        self.stored_held.add(len as u64);
    }

    /// The map no longer points at a block stored in `len` bytes.
    pub(crate) fn unhold(&self, len: u32) {
        self.logical_held.sub(B);
        self.stored_held.sub(len as u64);
    }

    /// Sets the size and unmaps every block past the smaller of the old and new ends (the
    /// caller holds the writer lock, or replays the log). The size is lowered first; writes
    /// and trims check it again under the writer lock when they change the map
    /// ([`VolumeState::holds_blocks`]), so one checked against the old size either changed
    /// the map before this (and is discarded here) or is refused: none lands past the end
    /// after the clear, to reappear when the volume grows again. A grow clears too: blocks
    /// past the old end are never meant to be mapped.
    pub(crate) fn resize(&self, size: u64, released: impl FnMut(u64)) {
        let old = self.size.swap(size, Ordering::SeqCst);
        let blocks = old.min(size).div_ceil(B);
        self.map.clear_range(blocks, u64::MAX - blocks, released);
    }

    /// Refuses blocks `[lba, lba + count)` unless they lie within the volume: whole, for a
    /// host's write of whole blocks or a trim (`whole`), or up to its last (partial) block,
    /// for a merge into part of a block (checked to the byte under that block's lock,
    /// `Volume::merge_block`). Asked under the writer lock, where resizes change the size:
    /// the range check before it (`Volume::check`) may have seen a size a shrink has lowered
    /// since.
    pub(crate) fn holds_blocks(&self, lba: u64, count: u64, whole: bool) -> Result<()> {
        let size = self.size.load(Ordering::SeqCst);
        let end = lba.saturating_add(count).saturating_mul(B);
        let limit = if whole { size } else { size.div_ceil(B) * B };
        if end > limit {
            return Err(Error::OutOfRange {
                offset: lba.saturating_mul(B),
                len: count.saturating_mul(B),
                size,
            });
        }
        Ok(())
    }
}

impl Inner {
    /// The lock a read-merge-write of part of block `lba` of volume `vol` holds.
    pub(crate) fn block_lock(&self, vol: u32, lba: u64) -> &parking_lot::Mutex<()> {
        &self.block_locks[(lba as usize ^ vol as usize) % self.block_locks.len()]
    }

    /// Zeroes the bytes of the volume's last block past `size` (its size, not a multiple of
    /// the block), where a write before a shrink may have left data that a grow would bring
    /// back; the caller holds the block's lock. True when it wrote the block.
    pub(crate) fn zero_past_end(&self, vol: &VolumeState, size: u64) -> Result<bool> {
        let (lba, at) = (size / B, (size % B) as usize);
        if at == 0 {
            return Ok(false);
        }
        let mut block = [0u8; BLOCK];
        if !self.read_block(vol, lba, &mut block)? || block[at..].iter().all(|&b| b == 0) {
            return Ok(false);
        }
        block[at..].fill(0);
        self.write_blocks(vol, lba, &block, 0)?;
        Ok(true)
    }
}

/// A volume's name, id and size.
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeInfo {
    pub id: u32,
    pub name: String,
    pub size: u64,
    /// Bytes of RAM its block map uses.
    pub map_bytes: u64,
    /// Compression setting.
    pub compression: Compression,
    /// Logical bytes over stored bytes of the blocks the volume holds now (1.0 when it holds
    /// none): overwritten, trimmed and cut-off blocks leave it at once, and a restart, which
    /// recounts it from the maps, finds the same.
    pub compression_ratio: f64,
}

impl VolumeInfo {
    pub(crate) fn of(v: &VolumeState) -> Self {
        let (logical, stored) = (v.logical_held.load(), v.stored_held.load());
        VolumeInfo {
            id: v.id,
            name: v.name.clone(),
            size: v.size.load(Ordering::Relaxed),
            map_bytes: v.map.memory_bytes() as u64,
            compression: v.compressor.setting(),
            compression_ratio: if stored == 0 {
                1.0
            } else {
                logical as f64 / stored as f64
            },
        }
    }
}

/// What a range of a volume holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Written data.
    Data,
    /// Never written or trimmed: reads as zeros and takes no space.
    Hole,
}

/// A run of bytes in one state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub length: u64,
    pub state: BlockState,
}

/// A handle to one volume; cheap to clone and safe to use from many threads.
#[derive(Clone)]
pub struct Volume {
    pub(crate) pool: Arc<Inner>,
    pub(crate) vol: Arc<VolumeState>,
}

impl Volume {
    pub(crate) fn new(pool: Arc<Inner>, vol: Arc<VolumeState>) -> Self {
        Volume { pool, vol }
    }

    /// The volume's id (never reused within a pool: NVMe/TCP serves it as the NSID).
    pub fn id(&self) -> u32 {
        self.vol.id
    }

    /// The volume's name.
    pub fn name(&self) -> &str {
        &self.vol.name
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.vol.size.load(Ordering::Relaxed)
    }

    pub(crate) fn check(&self, offset: u64, len: u64) -> Result<()> {
        if self.vol.deleted.load(Ordering::Relaxed) {
            return Err(Error::NotFound(format!(
                "volume {:?} was deleted",
                self.vol.name
            )));
        }
        if self.pool.closed.load(Ordering::Relaxed) {
            return Err(Error::Failed("pool is closed".into()));
        }
        let size = self.size();
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::OutOfRange { offset, len, size });
        }
        Ok(())
    }

    /// Reads several ranges, each `(offset, buffer)`, with the drive reads of all of them in
    /// flight at once (block-aligned ranges; others are read one after another); one result
    /// per range, in order.
    pub fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<Result<()>> {
        let mut results: Vec<Option<Result<()>>> = (0..reads.len()).map(|_| None).collect();
        let mut aligned: Vec<(u64, &mut [u8])> = Vec::new();
        let mut which = Vec::new();
        for (i, (off, buf)) in reads.iter_mut().enumerate() {
            if let Err(e) = self.check(*off, buf.len() as u64) {
                results[i] = Some(Err(e));
            } else if off.is_multiple_of(B) && buf.len().is_multiple_of(BLOCK) && !buf.is_empty() {
                Stats::add(&self.pool.stats.host_read_bytes, buf.len() as u64);
                aligned.push((*off / B, &mut **buf));
                which.push(i);
            } else {
                results[i] = Some(self.read(*off, buf));
            }
        }
        if !aligned.is_empty() {
            let done = self.pool.read_ranges(&self.vol, &mut aligned);
            for (i, r) in which.into_iter().zip(done) {
                results[i] = Some(r);
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every range read"))
            .collect()
    }

    /// Whether writing `len` bytes may wait for a drive: the pool has drives that do not
    /// complete at once, and the write is large enough (a quarter of a stripe's data or more)
    /// to seal and write out stripes itself. Front-ends run such writes where they may wait.
    pub fn write_may_wait(&self, len: u64) -> bool {
        let stripe_data = self.pool.geo.chunk_size as u64 * self.pool.geo.k as u64;
        len >= (stripe_data / 4).max(B) && !self.pool.drives_complete_inline()
    }

    /// Whether the pool takes writes now (not read-only: too few members in service, an
    /// earlier write failure beyond parity, or opened read-only). Front-ends ask it to
    /// advertise a read-only export rather than fail every write. A pool whose host
    /// filesystem filled under sparse drive files is not read-only: its writes are answered
    /// `NoSpace` (ENOSPC), which tells the client what happened.
    pub fn writable(&self) -> bool {
        matches!(self.pool.check_failed(), Ok(()) | Err(Error::NoSpace))
    }

    /// Whether a write may wait for a drive now, whatever its size: every stripe buffer is
    /// taken (the drives lag the writers), so a write that fills the open stripe waits for one
    /// to be written. A hint for a thread that serves many clients (a reactor): it runs
    /// writes elsewhere while this holds.
    pub fn write_would_wait_now(&self) -> bool {
        !self.pool.drives_complete_inline() && self.pool.buffers_short()
    }

    /// Whether the volume's reads suit a [`crate::ReadQueue`]: every member drive is a file
    /// or block device the queue drives through io_uring. Not for memory drives (they
    /// complete at once anyway) nor for drives that would wait inside `start` (a simulated
    /// SSD keeping real time, a fault-injecting wrapper): front-ends run those elsewhere.
    pub fn reads_suit_a_queue(&self) -> bool {
        self.pool
            .drives
            .iter()
            .all(|s| s.drive.as_ref().is_none_or(|d| d.fd_target().is_some()))
    }

    /// Whether reading `len` bytes at `offset` may wait for a drive: some block of the range
    /// is on a drive that does not complete at once (not a memory drive). Unmapped blocks and
    /// blocks still in a stripe buffer read from memory. Looks at no more than 256 blocks (a
    /// longer range is assumed to wait); for front-ends deciding where to run a read.
    pub fn read_may_wait(&self, offset: u64, len: u64) -> bool {
        if len == 0 || self.pool.drives_complete_inline() {
            return false;
        }
        let (first, last) = (offset / B, (offset + len - 1) / B);
        if last - first >= 256 {
            return true;
        }
        (first..=last).any(|lba| {
            matches!(
                Entry::decode(self.vol.map.get(lba)),
                Some(Entry::Media { .. })
            )
        })
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        let mut done = 0usize;
        let mut tmp = [0u8; BLOCK];
        while done < buf.len() {
            let pos = offset + done as u64;
            let (lba, at) = (pos / B, (pos % B) as usize);
            let n = (BLOCK - at).min(buf.len() - done);
            let whole = (buf.len() - done) / BLOCK * BLOCK;
            if at == 0 && whole > BLOCK {
                // Every whole block from here on, in as few drive reads as they allow.
                self.pool
                    .read_blocks(&self.vol, lba, &mut buf[done..done + whole])?;
                done += whole;
                continue;
            }
            if at == 0 && n == BLOCK {
                self.pool
                    .read_block(&self.vol, lba, &mut buf[done..done + BLOCK])?;
            } else {
                self.pool.read_block(&self.vol, lba, &mut tmp)?;
                buf[done..done + n].copy_from_slice(&tmp[at..at + n]);
            }
            done += n;
        }
        Stats::add(&self.pool.stats.host_read_bytes, buf.len() as u64);
        Ok(())
    }

    /// Writes `data` at `offset`. Completes before it is durable: see [`Volume::flush`].
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check(offset, data.len() as u64)?;
        let mut done = 0usize;
        while done < data.len() {
            let pos = offset + done as u64;
            let (lba, at) = (pos / B, (pos % B) as usize);
            let n = (BLOCK - at).min(data.len() - done);
            if at == 0 && n == BLOCK {
                // Every whole block from here on, in one go (kept together in the log).
                let whole = (data.len() - done) / BLOCK * BLOCK;
                self.pool
                    .write_blocks(&self.vol, lba, &data[done..done + whole], B)?;
                done += whole;
            } else {
                self.merge_block(lba, at, &data[done..done + n])?;
                done += n;
            }
        }
        Ok(())
    }

    /// Read-merge-write of part of one block, under that block's lock.
    fn merge_block(&self, lba: u64, at: usize, bytes: &[u8]) -> Result<()> {
        let _g = self.pool.block_lock(self.vol.id, lba).lock();
        // Again under the lock: a shrink since the range check must not let bytes past the
        // new end in (a grow zeroes them under this lock, `Pool::resize_volume`).
        self.check(lba * B + at as u64, bytes.len() as u64)?;
        let mut block = [0u8; BLOCK];
        if self.pool.read_block(&self.vol, lba, &mut block)? {
            Stats::add(&self.pool.stats.unaligned_merge_read_bytes, B);
        }
        block[at..at + bytes.len()].copy_from_slice(bytes);
        self.pool
            .write_blocks(&self.vol, lba, &block, bytes.len() as u64)
    }

    /// Writes `data` and returns once it, and every write completed before, is durable.
    pub fn write_fua(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write(offset, data)?;
        self.flush()
    }

    /// Makes every write completed before this call durable (on every volume of the pool).
    pub fn flush(&self) -> Result<()> {
        self.pool.flush()
    }

    /// Unmaps `[offset, offset + len)`: reads return zeros and the space is freed. Partial
    /// blocks at the edges are zeroed in place.
    pub fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        let end = offset + len;
        let first_full = offset.div_ceil(B);
        let last_full = end / B;
        if first_full >= last_full {
            // Within one block, or spanning two partial blocks.
            return self.zero_bytes(offset, end);
        }
        self.zero_bytes(offset, first_full * B)?;
        self.pool
            .trim_blocks(&self.vol, first_full, last_full - first_full)?;
        self.zero_bytes(last_full * B, end)
    }

    fn zero_bytes(&self, from: u64, to: u64) -> Result<()> {
        let zeros = [0u8; BLOCK];
        let mut pos = from;
        while pos < to {
            let n = (B - pos % B).min(to - pos);
            self.write(pos, &zeros[..n as usize])?;
            pos += n;
        }
        Ok(())
    }

    /// Makes `[offset, offset + len)` read as zeros. A thin log-structured pool stores no
    /// zero blocks, so this is a trim: it frees the space as well.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.trim(offset, len)
    }

    /// Which parts of `[offset, offset + len)` hold data and which are holes, at 4 KiB
    /// granularity, as runs that cover the range exactly.
    pub fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.check(offset, len)?;
        let mut out: Vec<Extent> = Vec::new();
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let lba = pos / B;
            // Blocks no leaf holds are a hole together, whatever their number.
            let absent = if pos.is_multiple_of(B) {
                self.vol.map.absent_from(lba)
            } else {
                0
            };
            let (n, state) = if absent > 0 {
                (absent.saturating_mul(B).min(end - pos), BlockState::Hole)
            } else {
                let state = match Entry::decode(self.vol.map.get(lba)) {
                    Some(Entry::Unmapped) | None => BlockState::Hole,
                    _ => BlockState::Data,
                };
                ((B - pos % B).min(end - pos), state)
            };
            match out.last_mut() {
                Some(e) if e.state == state => e.length += n,
                _ => out.push(Extent { length: n, state }),
            }
            pos += n;
        }
        Ok(out)
    }
}
