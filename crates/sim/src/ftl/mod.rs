//! The device FTL: page-level mapping, per-plane block pools, user and GC write frontiers,
//! GC victim bookkeeping, wear leveling and bad blocks. Pure state transitions with no notion
//! of time, so the timed engine and the untimed preconditioner share one implementation.
//!
//! All state is in flat `Vec`s indexed by `u32` ids (see [`crate::geometry`]); `NONE` marks
//! an empty slot. The GC reserve is exactly one free block per plane: user writes may open a
//! new block only while two or more are free, GC may take the last one.

mod check;
mod victim;
mod wear;

use crate::config::{FtlConfig, GcPolicy};
use crate::geometry::Geometry;
use crate::placement::Placement;
use crate::rng::SimRng;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Empty id.
pub const NONE: u32 = u32::MAX;

/// Asks the CPU to start loading the cache line that holds `r` (a hint: no effect on
/// results). Used a step ahead of the random mapping-table accesses of host writes and GC
/// moves, which otherwise dominate the simulator's run time at high write amplification.
#[inline(always)]
pub(crate) fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint; it never faults and reads nothing architecturally.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            r as *const T as *const i8,
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}

/// Life-cycle state of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum BlockState {
    /// Erased, in its plane's free pool.
    Free,
    /// A write frontier (user or GC) is filling it.
    Open,
    /// Full; a GC candidate.
    Closed,
    /// Chosen by GC; its valid pages are being moved out.
    Victim,
    /// Retired (factory or grown bad).
    Bad,
}

/// A write point in one plane.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frontier {
    pub block: u32,
    pub next: u32,
}

const EMPTY_FRONTIER: Frontier = Frontier {
    block: NONE,
    next: 0,
};

/// The block a plane's GC is emptying.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Victim {
    pub block: u32,
    /// Next page offset to scan for valid data.
    pub scan: u32,
    /// Chosen by static wear leveling rather than for space.
    pub wl: bool,
}

const NO_VICTIM: Victim = Victim {
    block: NONE,
    scan: 0,
    wl: false,
};

/// FTL event counters (cumulative; the engine subtracts a snapshot for the measured run).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct FtlCounters {
    pub host_pages_written: u64,
    pub gc_pages_moved: u64,
    pub wl_pages_moved: u64,
    pub flash_pages_programmed: u64,
    pub blocks_erased: u64,
    pub gc_victims: u64,
    pub wl_victims: u64,
    pub trimmed_pages: u64,
    pub grown_bad_blocks: u64,
}

impl FtlCounters {
    /// `self - base`, field by field.
    pub fn since(&self, base: &FtlCounters) -> FtlCounters {
        FtlCounters {
            host_pages_written: self.host_pages_written - base.host_pages_written,
            gc_pages_moved: self.gc_pages_moved - base.gc_pages_moved,
            wl_pages_moved: self.wl_pages_moved - base.wl_pages_moved,
            flash_pages_programmed: self.flash_pages_programmed - base.flash_pages_programmed,
            blocks_erased: self.blocks_erased - base.blocks_erased,
            gc_victims: self.gc_victims - base.gc_victims,
            wl_victims: self.wl_victims - base.wl_victims,
            trimmed_pages: self.trimmed_pages - base.trimmed_pages,
            grown_bad_blocks: self.grown_bad_blocks - base.grown_bad_blocks,
        }
    }
}

/// The flash translation layer.
pub struct Ftl {
    pub geo: Geometry,
    /// Static write placement (or dynamic).
    pub placement: Placement,
    pub(crate) policy: GcPolicy,
    pub gc_threshold: u32,
    pub bg_gc_threshold: u32,
    pub(crate) d_choices: u32,
    pub(crate) dynamic_wl: bool,
    pub(crate) static_wl_threshold: u32,
    pub(crate) endurance: u32,
    /// Logical pages exported.
    pub logical_pages: u32,
    pub(crate) l2p: Vec<u32>,
    /// Physical to logical page; meaningful only where the page's `vbits` bit is set.
    pub(crate) p2l: Vec<u32>,
    /// One valid bit per physical page (small enough to stay in cache, so invalidating a
    /// page touches no random line of `p2l`).
    pub(crate) vbits: Vec<u64>,
    pub(crate) state: Vec<BlockState>,
    pub(crate) valid: Vec<u32>,
    pub(crate) erases: Vec<u32>,
    /// Value of `write_clock` when the block was closed (age for cost-benefit and FIFO).
    pub(crate) stamp: Vec<u64>,
    /// Greedy buckets: per plane, `pages_per_block + 1` list heads by valid count.
    pub(crate) bkt_head: Vec<u32>,
    pub(crate) bkt_next: Vec<u32>,
    pub(crate) bkt_prev: Vec<u32>,
    pub(crate) bkt_min: Vec<u32>,
    /// Closed blocks per plane (unordered) and each block's index there.
    pub(crate) closed: Vec<Vec<u32>>,
    pub(crate) closed_pos: Vec<u32>,
    /// Free pools: min-heaps on (erase count or FIFO sequence) << 32 | block.
    pub(crate) free: Vec<BinaryHeap<Reverse<u64>>>,
    pub(crate) free_seq: u64,
    pub(crate) user: Vec<Frontier>,
    pub(crate) gcf: Vec<Frontier>,
    pub(crate) victim: Vec<Victim>,
    pub(crate) good_blocks: Vec<u32>,
    pub(crate) plane_max_erase: Vec<u32>,
    pub(crate) wl_countdown: Vec<u32>,
    pub(crate) wl_target: Vec<u32>,
    pub(crate) rng: SimRng,
    pub(crate) write_clock: u64,
    /// Round-robin cursor of untimed writes.
    pub(crate) rr: u32,
    pub ctr: FtlCounters,
    /// Set when the device can no longer hold its logical capacity or GC cannot progress.
    pub failed: Option<String>,
    /// Run the full invariant check after every GC victim is erased.
    pub check_after_gc: bool,
}

impl Ftl {
    /// Builds an empty (all-erased) device; factory bad blocks are placed by `seed`.
    pub fn new(geo: Geometry, cfg: &FtlConfig, logical_pages: u64, seed: u64) -> Ftl {
        let planes = geo.planes as usize;
        let blocks = geo.blocks as usize;
        let ppb = geo.pages_per_block;
        let mut ftl = Ftl {
            geo,
            placement: Placement::new(cfg.allocation, &geo),
            policy: cfg.gc_policy,
            gc_threshold: cfg.gc_threshold_blocks,
            bg_gc_threshold: cfg.bg_gc_threshold_blocks.max(cfg.gc_threshold_blocks),
            d_choices: cfg.d_choices,
            dynamic_wl: cfg.dynamic_wear_leveling,
            static_wl_threshold: cfg.static_wl_threshold,
            endurance: cfg.endurance,
            logical_pages: logical_pages as u32,
            l2p: vec![NONE; logical_pages as usize],
            p2l: vec![NONE; geo.pages as usize],
            vbits: vec![0; (geo.pages as usize).div_ceil(64)],
            state: vec![BlockState::Free; blocks],
            valid: vec![0; blocks],
            erases: vec![0; blocks],
            stamp: vec![0; blocks],
            bkt_head: vec![NONE; planes * (ppb as usize + 1)],
            bkt_next: vec![NONE; blocks],
            bkt_prev: vec![NONE; blocks],
            bkt_min: vec![ppb + 1; planes],
            closed: (0..planes)
                .map(|_| Vec::with_capacity(geo.blocks_per_plane as usize))
                .collect(),
            closed_pos: vec![NONE; blocks],
            free: (0..planes)
                .map(|_| BinaryHeap::with_capacity(geo.blocks_per_plane as usize))
                .collect(),
            free_seq: 0,
            user: vec![EMPTY_FRONTIER; planes],
            gcf: vec![EMPTY_FRONTIER; planes],
            victim: vec![NO_VICTIM; planes],
            good_blocks: vec![geo.blocks_per_plane; planes],
            plane_max_erase: vec![0; planes],
            wl_countdown: vec![16; planes],
            wl_target: vec![NONE; planes],
            rng: SimRng::new(seed, 0xF71),
            write_clock: 0,
            rr: 0,
            ctr: FtlCounters::default(),
            failed: None,
            check_after_gc: cfg!(debug_assertions) && geo.pages <= 1 << 18,
        };
        ftl.place_factory_bad_blocks(cfg.factory_bad_blocks_per_die);
        for b in 0..geo.blocks {
            if ftl.state[b as usize] == BlockState::Free {
                ftl.push_free(b);
            }
        }
        ftl.check_capacity();
        ftl
    }

    /// Free blocks in `plane`.
    #[inline]
    pub fn free_blocks(&self, plane: u32) -> u32 {
        self.free[plane as usize].len() as u32
    }

    /// Starts loading the mapping entry of `lpa` into the cache (a hint, see `prefetch`).
    #[inline]
    pub fn prefetch_lpa(&self, lpa: u32) {
        if let Some(x) = self.l2p.get(lpa as usize) {
            prefetch(x);
        }
    }

    /// Current physical page of `lpa`, or `NONE`.
    #[inline]
    pub fn lookup(&self, lpa: u32) -> u32 {
        self.l2p[lpa as usize]
    }

    /// Erase count of every block that is not bad.
    pub fn erase_counts(&self) -> Vec<u32> {
        (0..self.geo.blocks as usize)
            .filter(|&b| self.state[b] != BlockState::Bad)
            .map(|b| self.erases[b])
            .collect()
    }

    /// Blocks retired so far (factory and grown).
    pub fn bad_blocks(&self) -> u32 {
        self.state.iter().filter(|s| **s == BlockState::Bad).count() as u32
    }

    pub(crate) fn push_free(&mut self, b: u32) {
        let key = if self.dynamic_wl {
            self.erases[b as usize] as u64
        } else {
            self.free_seq += 1;
            self.free_seq
        };
        self.state[b as usize] = BlockState::Free;
        let plane = self.geo.plane_of_block(b);
        self.free[plane as usize].push(Reverse((key << 32) | b as u64));
    }

    fn open_block(&mut self, plane: u32) -> u32 {
        match self.free[plane as usize].pop() {
            Some(Reverse(key)) => {
                let b = (key & 0xFFFF_FFFF) as u32;
                self.state[b as usize] = BlockState::Open;
                b
            }
            None => NONE,
        }
    }

    /// Whether a host write can be placed in `plane` now: into its open user block, or into
    /// a new one when [`Ftl::user_floor`] blocks are free.
    #[inline]
    pub fn can_accept_user(&self, plane: u32) -> bool {
        self.user[plane as usize].block != NONE
            || self.free[plane as usize].len() as u32 >= self.user_floor(plane)
    }

    /// Free blocks a new user block must leave at least one of: 2, so the GC frontier always
    /// has a block to open; 3 once a block of the plane is at its last P/E cycle, so a victim
    /// retired when erased (it goes to the bad blocks, not back to the free pool) still
    /// leaves GC a block for the next victim. With 2, the first grown bad block could find
    /// the frontier holding the last free block and a next victim with more valid pages than
    /// the frontier's room: GC stuck, the device declared dead with most of its spare left.
    #[inline]
    pub fn user_floor(&self, plane: u32) -> u32 {
        let last_cycle =
            self.endurance > 0 && self.plane_max_erase[plane as usize] + 1 >= self.endurance;
        2 + u32::from(last_cycle)
    }

    /// Where the next host write to `plane` lands: (block index within the plane, page
    /// offset in the block); the block is the free pool's next when no user block is open.
    #[inline]
    pub fn user_point(&self, plane: u32) -> (u32, u32) {
        let f = self.user[plane as usize];
        let (b, off) = if f.block != NONE {
            (f.block, f.next)
        } else {
            match self.free[plane as usize].peek() {
                Some(Reverse(k)) => ((k & 0xFFFF_FFFF) as u32, 0),
                None => (NONE, 0),
            }
        };
        (b.wrapping_sub(plane * self.geo.blocks_per_plane), off)
    }

    /// Where the next GC copy in `plane` lands, as [`Ftl::user_point`] for the GC frontier.
    #[inline]
    pub fn gc_point(&self, plane: u32) -> (u32, u32) {
        let f = self.gcf[plane as usize];
        let (b, off) = if f.block != NONE {
            (f.block, f.next)
        } else {
            match self.free[plane as usize].peek() {
                Some(Reverse(k)) => ((k & 0xFFFF_FFFF) as u32, 0),
                None => (NONE, 0),
            }
        };
        (b.wrapping_sub(plane * self.geo.blocks_per_plane), off)
    }

    /// Block index within its plane of `plane`'s GC victim (`NONE` when there is none).
    #[inline]
    pub fn victim_block_in_plane(&self, plane: u32) -> u32 {
        let b = self.victim[plane as usize].block;
        if b == NONE {
            NONE
        } else {
            b - plane * self.geo.blocks_per_plane
        }
    }

    /// Whether `plane` is below the foreground GC threshold (never below the free blocks a
    /// new user block needs, or host writes would wait for GC that never starts).
    #[inline]
    pub fn needs_fg_gc(&self, plane: u32) -> bool {
        (self.free[plane as usize].len() as u32) < self.gc_threshold.max(self.user_floor(plane))
    }

    /// Whether `plane` is below the background GC threshold.
    #[inline]
    pub fn needs_bg_gc(&self, plane: u32) -> bool {
        (self.free[plane as usize].len() as u32) < self.bg_gc_threshold
    }

    #[inline(always)]
    fn invalidate(&mut self, ppa: u32) {
        self.vbits[(ppa >> 6) as usize] &= !(1u64 << (ppa & 63));
        let b = self.geo.block_of(ppa);
        let v = self.valid[b as usize];
        self.valid[b as usize] = v - 1;
        if self.state[b as usize] == BlockState::Closed {
            self.bucket_move(b, v, v - 1);
        }
    }

    fn close_block(&mut self, b: u32) {
        self.state[b as usize] = BlockState::Closed;
        self.stamp[b as usize] = self.write_clock;
        self.bucket_insert(b);
        let plane = self.geo.plane_of_block(b) as usize;
        self.closed_pos[b as usize] = self.closed[plane].len() as u32;
        self.closed[plane].push(b);
    }

    /// Whether physical page `ppa` holds valid data.
    #[inline]
    pub fn is_valid(&self, ppa: u32) -> bool {
        self.vbits[(ppa >> 6) as usize] & (1u64 << (ppa & 63)) != 0
    }

    /// Maps `lpa` to `ppa`, a page of block `block` (the caller's frontier, so no division).
    #[inline(always)]
    fn place(&mut self, lpa: u32, ppa: u32, block: u32) {
        debug_assert_eq!(self.geo.block_of(ppa), block);
        self.l2p[lpa as usize] = ppa;
        self.p2l[ppa as usize] = lpa;
        self.vbits[(ppa >> 6) as usize] |= 1u64 << (ppa & 63);
        self.valid[block as usize] += 1;
        self.write_clock += 1;
        self.ctr.flash_pages_programmed += 1;
    }

    /// Writes `lpa` to the user frontier of `plane` (which must accept it, see
    /// [`Ftl::can_accept_user`]); returns the new physical page.
    pub fn write_host(&mut self, lpa: u32, plane: u32) -> u32 {
        let p = plane as usize;
        if self.user[p].block == NONE {
            let b = self.open_block(plane);
            debug_assert!(b != NONE, "write_host on a plane that cannot accept");
            self.user[p] = Frontier { block: b, next: 0 };
        }
        let f = self.user[p];
        let ppa = self.geo.first_page(f.block) + f.next;
        let old = self.l2p[lpa as usize];
        if old != NONE {
            self.invalidate(old);
        }
        self.place(lpa, ppa, f.block);
        self.ctr.host_pages_written += 1;
        if f.next + 1 == self.geo.pages_per_block {
            self.user[p] = EMPTY_FRONTIER;
            self.close_block(f.block);
        } else {
            self.user[p].next += 1;
        }
        ppa
    }

    /// Deallocates `lpa` (TRIM).
    pub fn trim(&mut self, lpa: u32) {
        let old = self.l2p[lpa as usize];
        if old != NONE {
            self.invalidate(old);
            self.l2p[lpa as usize] = NONE;
            self.ctr.trimmed_pages += 1;
        }
    }

    /// Whether `plane` has a victim being emptied.
    #[inline]
    pub fn has_victim(&self, plane: u32) -> bool {
        self.victim[plane as usize].block != NONE
    }

    /// Whether `plane`'s victim has no valid pages left (ready to erase).
    #[inline]
    pub fn victim_drained(&self, plane: u32) -> bool {
        let v = self.victim[plane as usize];
        v.block != NONE && self.valid[v.block as usize] == 0
    }

    /// Moves the next valid page of `plane`'s victim to the plane's GC frontier. Returns the
    /// page offsets (in their blocks) of the old and the new copy, or `None` when the victim
    /// is drained or there is no space (then `failed` is set).
    pub fn gc_move_next(&mut self, plane: u32) -> Option<(u32, u32)> {
        let p = plane as usize;
        let v = self.victim[p];
        if v.block == NONE || self.valid[v.block as usize] == 0 {
            return None;
        }
        let base = self.geo.first_page(v.block);
        let mut off = v.scan;
        // The victim has a valid page at or after `scan`: find it, one bitmap word at a time.
        let rest = loop {
            let ppa = base + off;
            let word = self.vbits[(ppa >> 6) as usize] >> (ppa & 63);
            if word != 0 {
                let tz = word.trailing_zeros();
                off += tz;
                // Valid pages after this one in the same word (a shift by 64 would overflow).
                break (word >> tz) >> 1;
            }
            off += 64 - (ppa & 63);
        };
        self.victim[p].scan = off + 1;
        let old = base + off;
        // Prefetch the mapping entry of the next valid page: this plane's next GC step comes
        // after many other events, by then the random line of `l2p` is in the cache. As
        // before, only the rest of the current bitmap word is looked at, or the next word
        // when this page ends its word; the rest of the word is already in a register.
        let n = if rest != 0 {
            old + 1 + rest.trailing_zeros()
        } else if old & 63 == 63 && off + 1 < self.geo.pages_per_block {
            let w = self.vbits[((old + 1) >> 6) as usize];
            if w != 0 {
                old + 1 + w.trailing_zeros()
            } else {
                NONE
            }
        } else {
            NONE
        };
        if n < base + self.geo.pages_per_block {
            self.prefetch_lpa(self.p2l[n as usize]);
        }
        if self.gcf[p].block == NONE && !self.open_gc_frontier(plane) {
            return None;
        }
        let f = self.gcf[p];
        let ppa = self.geo.first_page(f.block) + f.next;
        let lpa = self.p2l[old as usize];
        self.vbits[(old >> 6) as usize] &= !(1u64 << (old & 63));
        self.valid[v.block as usize] -= 1;
        if self.valid[v.block as usize] == 2 {
            self.prefetch_next_victim(plane);
        }
        self.place(lpa, ppa, f.block);
        if v.wl {
            self.ctr.wl_pages_moved += 1;
        } else {
            self.ctr.gc_pages_moved += 1;
        }
        if f.next + 1 == self.geo.pages_per_block {
            self.gcf[p] = EMPTY_FRONTIER;
            self.close_block(f.block);
        } else {
            self.gcf[p].next += 1;
        }
        Some((off, f.next))
    }

    /// Opens a GC frontier in `plane`; false (and `failed` set) when no block is free. Out
    /// of line: once per block, and the failure message is cold.
    #[inline(never)]
    fn open_gc_frontier(&mut self, plane: u32) -> bool {
        let b = self.open_block(plane);
        if b == NONE {
            self.failed = Some(format!(
                "device can no longer hold its logical capacity: plane {plane} has no \
                 free block left for GC ({} bad blocks)",
                self.bad_blocks()
            ));
            return false;
        }
        self.gcf[plane as usize] = Frontier { block: b, next: 0 };
        true
    }

    /// The plane for the `k`-th untimed write: channel-first over dies, then planes.
    fn rr_plane(&self, k: u32) -> u32 {
        let g = &self.geo;
        let die = g.stripe_die(k % g.dies);
        die * g.planes_per_die + (k / g.dies) % g.planes_per_die
    }

    /// Runs GC in `plane` to completion until it has `target` free blocks or no victim helps.
    pub fn gc_untimed(&mut self, plane: u32, target: u32) {
        while self.free_blocks(plane) < target && self.failed.is_none() {
            if !self.has_victim(plane) && !self.start_victim(plane) {
                return;
            }
            while self.gc_move_next(plane).is_some() {}
            if self.failed.is_some() {
                return;
            }
            self.erase_victim(plane);
        }
    }

    /// An untimed host write (preconditioning): round-robin placement, GC inline.
    /// Returns false if no plane can take the write.
    pub fn write_untimed(&mut self, lpa: u32) -> bool {
        if self.placement.is_static() {
            let plane = self.placement.plane_of_lpa(lpa);
            if self.needs_fg_gc(plane) {
                self.gc_untimed(plane, self.gc_threshold.max(self.user_floor(plane)));
            }
            if self.can_accept_user(plane) {
                self.write_host(lpa, plane);
                return true;
            }
            if self.failed.is_none() {
                self.failed = Some(format!(
                    "plane {plane} cannot accept a write (static allocation): it is full"
                ));
            }
            return false;
        }
        let planes = self.geo.planes;
        for _ in 0..planes {
            let plane = self.rr_plane(self.rr);
            self.rr = (self.rr + 1) % planes;
            if self.needs_fg_gc(plane) {
                self.gc_untimed(plane, self.gc_threshold.max(self.user_floor(plane)));
            }
            if self.can_accept_user(plane) {
                self.write_host(lpa, plane);
                return true;
            }
        }
        if self.failed.is_none() {
            self.failed = Some("no plane can accept a write: the device is full".into());
        }
        false
    }
}

impl Ftl {
    /// Bytes of simulator state held for this device (mapping tables, block tables, pools).
    pub fn memory_bytes(&self) -> u64 {
        let g = self.geo;
        let per_page = 4 * self.l2p.capacity() as u64
            + 4 * self.p2l.capacity() as u64
            + 8 * self.vbits.capacity() as u64;
        // state 1 + valid 4 + erases 4 + stamp 8 + bucket links 8 + closed pos 4
        // + closed list 4 + free pool 8
        let per_block = 41 * g.blocks as u64;
        let per_plane = g.planes as u64 * (4 * (g.pages_per_block as u64 + 1) + 64);
        per_page + per_block + per_plane
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GeometryConfig;

    pub(crate) fn small(policy: GcPolicy) -> Ftl {
        let geo = Geometry::new(&GeometryConfig {
            channels: 2,
            dies_per_channel: 1,
            planes_per_die: 2,
            blocks_per_plane: 32,
            pages_per_block: 16,
            page_size: 4096,
        });
        let cfg = FtlConfig {
            op_ratio: 0.2,
            gc_policy: policy,
            ..FtlConfig::default()
        };
        let logical = (geo.pages as f64 * 0.8) as u64;
        let mut f = Ftl::new(geo, &cfg, logical, 1);
        f.check_after_gc = true;
        f
    }

    #[test]
    fn fill_and_overwrite_all_policies() {
        for policy in GcPolicy::ALL {
            let mut f = small(policy);
            let n = f.logical_pages;
            for lpa in 0..n {
                assert!(f.write_untimed(lpa));
            }
            f.check().unwrap();
            let mut r = SimRng::new(3, 3);
            for _ in 0..n * 5 {
                let lpa = r.below(n as u64) as u32;
                assert!(f.write_untimed(lpa), "{policy:?}");
            }
            f.check().unwrap();
            assert!(f.ctr.gc_pages_moved > 0);
            assert!(f.ctr.blocks_erased > 0);
            assert_eq!(
                f.ctr.flash_pages_programmed,
                f.ctr.host_pages_written + f.ctr.gc_pages_moved + f.ctr.wl_pages_moved
            );
        }
    }

    #[test]
    fn trim_invalidates() {
        let mut f = small(GcPolicy::Greedy);
        f.write_untimed(5);
        assert_ne!(f.lookup(5), NONE);
        f.trim(5);
        assert_eq!(f.lookup(5), NONE);
        f.check().unwrap();
    }
}
