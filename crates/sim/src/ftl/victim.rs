//! GC victim selection: greedy (O(1) through per-plane buckets keyed by valid count),
//! cost-benefit (maximise (1 - u) * age / 2u: Kawaguchi et al.'s flash form of LFS's rule), FIFO (oldest
//! closed block) and random d-choices (least valid of d sampled blocks). Blocks whose pages
//! are all valid are never chosen for space: moving them frees nothing.

use super::{BlockState, Ftl, Victim, NONE};
use crate::config::GcPolicy;

impl Ftl {
    #[inline]
    fn bkt_index(&self, plane: u32, valid: u32) -> usize {
        (plane * (self.geo.pages_per_block + 1) + valid) as usize
    }

    pub(crate) fn bucket_insert(&mut self, b: u32) {
        let plane = self.geo.plane_of_block(b);
        let v = self.valid[b as usize];
        let h = self.bkt_index(plane, v);
        let head = self.bkt_head[h];
        self.bkt_next[b as usize] = head;
        self.bkt_prev[b as usize] = NONE;
        if head != NONE {
            self.bkt_prev[head as usize] = b;
        }
        self.bkt_head[h] = b;
        if v < self.bkt_min[plane as usize] {
            self.bkt_min[plane as usize] = v;
        }
    }

    pub(crate) fn bucket_remove(&mut self, b: u32, valid: u32) {
        let plane = self.geo.plane_of_block(b);
        let (n, p) = (self.bkt_next[b as usize], self.bkt_prev[b as usize]);
        if p != NONE {
            self.bkt_next[p as usize] = n;
        } else {
            let h = self.bkt_index(plane, valid);
            self.bkt_head[h] = n;
        }
        if n != NONE {
            self.bkt_prev[n as usize] = p;
        }
    }

    #[inline]
    pub(crate) fn bucket_move(&mut self, b: u32, from: u32, _to: u32) {
        self.bucket_remove(b, from);
        self.bucket_insert(b);
    }

    fn closed_remove(&mut self, b: u32) {
        let plane = self.geo.plane_of_block(b) as usize;
        let pos = self.closed_pos[b as usize] as usize;
        let list = &mut self.closed[plane];
        list.swap_remove(pos);
        if pos < list.len() {
            let moved = list[pos];
            self.closed_pos[moved as usize] = pos as u32;
        }
        self.closed_pos[b as usize] = NONE;
    }

    fn pick_greedy(&mut self, plane: u32) -> u32 {
        let ppb = self.geo.pages_per_block;
        let mut v = self.bkt_min[plane as usize];
        while v < ppb {
            let h = self.bkt_head[self.bkt_index(plane, v)];
            if h != NONE {
                self.bkt_min[plane as usize] = v;
                return h;
            }
            v += 1;
        }
        self.bkt_min[plane as usize] = v;
        NONE
    }

    /// While `plane`'s victim is nearly drained (two valid pages left), starts loading the
    /// reverse map and valid bits of the block greedy GC would choose next. A hint only:
    /// the choice is made, maybe differently, when the victim is erased; but the new
    /// victim's first moves would otherwise wait on these cold lines, since its own
    /// prefetch in [`Ftl::start_victim`] comes just before them.
    pub(crate) fn prefetch_next_victim(&self, plane: u32) {
        if self.policy != GcPolicy::Greedy {
            return;
        }
        let ppb = self.geo.pages_per_block;
        let mut v = self.bkt_min[plane as usize];
        while v < ppb {
            let b = self.bkt_head[self.bkt_index(plane, v)];
            if b != NONE {
                let first = self.geo.first_page(b);
                for i in (first..first + ppb).step_by(16) {
                    super::prefetch(&self.p2l[i as usize]);
                }
                super::prefetch(&self.vbits[(first >> 6) as usize]);
                return;
            }
            v += 1;
        }
    }

    fn pick_cost_benefit(&self, plane: u32) -> u32 {
        let ppb = self.geo.pages_per_block as f64;
        let mut best = NONE;
        let mut best_score = -1.0;
        for &b in &self.closed[plane as usize] {
            let v = self.valid[b as usize];
            if v as f64 >= ppb {
                continue;
            }
            if v == 0 {
                return b;
            }
            let u = v as f64 / ppb;
            let age = (self.write_clock - self.stamp[b as usize] + 1) as f64;
            let score = (1.0 - u) * age / (2.0 * u);
            if score > best_score {
                best_score = score;
                best = b;
            }
        }
        best
    }

    fn pick_fifo(&self, plane: u32) -> u32 {
        let ppb = self.geo.pages_per_block;
        let mut best = NONE;
        let mut best_stamp = u64::MAX;
        for &b in &self.closed[plane as usize] {
            if self.valid[b as usize] < ppb && self.stamp[b as usize] < best_stamp {
                best_stamp = self.stamp[b as usize];
                best = b;
            }
        }
        best
    }

    fn pick_d_choices(&mut self, plane: u32) -> u32 {
        let n = self.closed[plane as usize].len() as u64;
        if n == 0 {
            return NONE;
        }
        let ppb = self.geo.pages_per_block;
        let mut best = NONE;
        let mut best_v = ppb;
        for _ in 0..self.d_choices {
            let b = self.closed[plane as usize][self.rng.below(n) as usize];
            let v = self.valid[b as usize];
            if v < best_v {
                best_v = v;
                best = b;
            }
        }
        if best == NONE {
            // Every sample was full: fall back to the least valid block, if any helps.
            best = self.pick_greedy(plane);
        }
        best
    }

    /// Chooses and claims a victim for `plane` (static wear leveling first, then the GC
    /// policy). Returns false when no block would help.
    pub fn start_victim(&mut self, plane: u32) -> bool {
        let p = plane as usize;
        if self.victim[p].block != NONE {
            return true;
        }
        let mut wl = false;
        let mut b = NONE;
        let t = self.wl_target[p];
        if t != NONE {
            self.wl_target[p] = NONE;
            if self.state[t as usize] == BlockState::Closed && self.free[p].len() >= 2 {
                b = t;
                wl = true;
            }
        }
        if b == NONE {
            b = match self.policy {
                GcPolicy::Greedy => self.pick_greedy(plane),
                GcPolicy::CostBenefit => self.pick_cost_benefit(plane),
                GcPolicy::Fifo => self.pick_fifo(plane),
                GcPolicy::DChoices => self.pick_d_choices(plane),
            };
        }
        if b == NONE {
            return false;
        }
        let v = self.valid[b as usize];
        self.bucket_remove(b, v);
        self.closed_remove(b);
        self.state[b as usize] = BlockState::Victim;
        // The victim's reverse map was written long ago and is cold: start loading it now,
        // GC reads it entry by entry over the next steps.
        let first = self.geo.first_page(b) as usize;
        let n = self.geo.pages_per_block as usize;
        for i in (first..first + n).step_by(16) {
            super::prefetch(&self.p2l[i]);
        }
        self.victim[p] = Victim {
            block: b,
            scan: 0,
            wl,
        };
        if wl {
            self.ctr.wl_victims += 1;
        } else {
            self.ctr.gc_victims += 1;
        }
        true
    }
}
