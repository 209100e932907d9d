//! Erase, wear leveling and bad blocks: erasing a drained victim, retiring blocks at their
//! endurance (grown bad blocks), factory bad blocks, the capacity check that reports when the
//! device can no longer hold its logical capacity, and static wear leveling (pick the closed
//! block with the lowest erase count when a plane's spread passes the threshold).

use super::{BlockState, Ftl, NONE, NO_VICTIM};

/// Blocks per plane that are never available for data: the user and GC frontiers and the GC
/// reserve block.
pub const PLANE_OVERHEAD_BLOCKS: u32 = 3;

impl Ftl {
    pub(crate) fn place_factory_bad_blocks(&mut self, per_die: u32) {
        if per_die == 0 {
            return;
        }
        let g = self.geo;
        let per_die_blocks = g.planes_per_die * g.blocks_per_plane;
        for die in 0..g.dies {
            let mut placed = 0;
            while placed < per_die {
                let i = self.rng.below(per_die_blocks as u64) as u32;
                let plane = die * g.planes_per_die + i / g.blocks_per_plane;
                // Keep enough good blocks in every plane to operate.
                if self.good_blocks[plane as usize] <= PLANE_OVERHEAD_BLOCKS + 1 {
                    continue;
                }
                let b = plane * g.blocks_per_plane + i % g.blocks_per_plane;
                if self.state[b as usize] != BlockState::Bad {
                    self.state[b as usize] = BlockState::Bad;
                    self.good_blocks[plane as usize] -= 1;
                    placed += 1;
                }
            }
        }
    }

    /// Pages available to hold logical data after per-plane overheads.
    pub fn usable_pages(&self) -> u64 {
        self.good_blocks
            .iter()
            .map(|&g| g.saturating_sub(PLANE_OVERHEAD_BLOCKS) as u64)
            .sum::<u64>()
            * self.geo.pages_per_block as u64
    }

    pub(crate) fn check_capacity(&mut self) {
        if self.failed.is_some() {
            return;
        }
        let usable = self.usable_pages();
        if usable <= self.logical_pages as u64 {
            self.failed = Some(format!(
                "device can no longer hold its logical capacity: {} bad blocks, {} usable pages \
                 for {} logical pages",
                self.bad_blocks(),
                usable,
                self.logical_pages
            ));
        }
    }

    /// Erases `plane`'s drained victim: back to the free pool, or retired at its endurance.
    pub fn erase_victim(&mut self, plane: u32) {
        let p = plane as usize;
        let b = self.victim[p].block;
        debug_assert!(b != NONE && self.valid[b as usize] == 0);
        self.victim[p] = NO_VICTIM;
        self.erases[b as usize] += 1;
        self.ctr.blocks_erased += 1;
        let e = self.erases[b as usize];
        if self.endurance > 0 && e >= self.endurance {
            self.state[b as usize] = BlockState::Bad;
            self.good_blocks[p] -= 1;
            self.ctr.grown_bad_blocks += 1;
            self.check_capacity();
        } else {
            self.push_free(b);
        }
        if e > self.plane_max_erase[p] {
            self.plane_max_erase[p] = e;
        }
        if self.static_wl_threshold > 0 {
            self.wl_countdown[p] -= 1;
            if self.wl_countdown[p] == 0 {
                self.wl_countdown[p] = 16;
                self.static_wl_check(plane);
            }
        }
        if self.check_after_gc {
            if let Err(e) = self.check() {
                panic!("FTL invariant broken after GC in plane {plane}: {e}");
            }
        }
    }

    fn static_wl_check(&mut self, plane: u32) {
        let p = plane as usize;
        let mut coldest = NONE;
        let mut min_e = u32::MAX;
        for &b in &self.closed[p] {
            if self.erases[b as usize] < min_e {
                min_e = self.erases[b as usize];
                coldest = b;
            }
        }
        if coldest != NONE && self.plane_max_erase[p] - min_e > self.static_wl_threshold {
            self.wl_target[p] = coldest;
        }
    }
}
