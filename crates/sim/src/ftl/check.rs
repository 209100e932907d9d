//! Full FTL invariant check: every mapped logical page has exactly one valid physical page
//! and back, per-block valid counts match the mapping, no free or bad block holds data, and
//! the free pools, buckets and closed lists agree with block states. O(pages); run after
//! every GC in debug builds of small devices and from tests.

use super::{BlockState, Ftl, NONE};

impl Ftl {
    /// Checks all invariants; returns the first violation.
    #[allow(clippy::needless_range_loop)]
    pub fn check(&self) -> Result<(), String> {
        let g = self.geo;
        for (lpa, &ppa) in self.l2p.iter().enumerate() {
            if ppa != NONE && (!self.is_valid(ppa) || self.p2l[ppa as usize] != lpa as u32) {
                return Err(format!(
                    "lpa {lpa} -> ppa {ppa} but ppa maps back to {}",
                    self.p2l[ppa as usize]
                ));
            }
        }
        let mut counts = vec![0u32; g.blocks as usize];
        for (ppa, &lpa) in self.p2l.iter().enumerate() {
            if self.is_valid(ppa as u32) {
                if self.l2p[lpa as usize] != ppa as u32 {
                    return Err(format!("ppa {ppa} holds lpa {lpa} which maps elsewhere"));
                }
                counts[g.block_of(ppa as u32) as usize] += 1;
            }
        }
        let mut free_per_plane = vec![0usize; g.planes as usize];
        for b in 0..g.blocks as usize {
            if counts[b] != self.valid[b] {
                return Err(format!(
                    "block {b}: valid count {} but {} valid pages",
                    self.valid[b], counts[b]
                ));
            }
            let plane = g.plane_of_block(b as u32) as usize;
            match self.state[b] {
                BlockState::Free | BlockState::Bad => {
                    if counts[b] != 0 {
                        return Err(format!(
                            "block {b} is {:?} but holds {} valid pages",
                            self.state[b], counts[b]
                        ));
                    }
                    if self.state[b] == BlockState::Free {
                        free_per_plane[plane] += 1;
                    }
                }
                BlockState::Closed => {
                    let pos = self.closed_pos[b] as usize;
                    if self.closed[plane].get(pos) != Some(&(b as u32)) {
                        return Err(format!("closed block {b} missing from its plane's list"));
                    }
                }
                BlockState::Open => {
                    if self.user[plane].block != b as u32 && self.gcf[plane].block != b as u32 {
                        return Err(format!("open block {b} is no frontier"));
                    }
                }
                BlockState::Victim => {
                    if self.victim[plane].block != b as u32 {
                        return Err(format!("victim block {b} is not its plane's victim"));
                    }
                }
            }
        }
        for p in 0..g.planes as usize {
            if self.free[p].len() != free_per_plane[p] {
                return Err(format!(
                    "plane {p}: free pool {} but {} free blocks",
                    self.free[p].len(),
                    free_per_plane[p]
                ));
            }
            for r in self.free[p].iter() {
                let b = (r.0 & 0xFFFF_FFFF) as usize;
                if self.state[b] != BlockState::Free {
                    return Err(format!("block {b} in free pool is {:?}", self.state[b]));
                }
            }
            let mut in_buckets = 0;
            for v in 0..=g.pages_per_block {
                let mut b = self.bkt_head[(p as u32 * (g.pages_per_block + 1) + v) as usize];
                while b != NONE {
                    if self.valid[b as usize] != v || self.state[b as usize] != BlockState::Closed {
                        return Err(format!(
                            "block {b} in bucket {v} has {} valid, {:?}",
                            self.valid[b as usize], self.state[b as usize]
                        ));
                    }
                    in_buckets += 1;
                    b = self.bkt_next[b as usize];
                }
            }
            if in_buckets != self.closed[p].len() {
                return Err(format!(
                    "plane {p}: {in_buckets} blocks in buckets, {} closed",
                    self.closed[p].len()
                ));
            }
        }
        Ok(())
    }
}
