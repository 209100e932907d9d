//! Flat address arithmetic over the flash array.
//!
//! Every object has a dense `u32` id so state lives in flat `Vec`s indexed by id:
//! die = channel * dies_per_channel + die_in_channel; plane = die * planes_per_die + p;
//! block = plane * blocks_per_plane + b; page (ppa) = block * pages_per_block + offset.

use crate::config::GeometryConfig;

/// Derived geometry with precomputed counts.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    pub channels: u32,
    pub dies_per_channel: u32,
    pub planes_per_die: u32,
    pub blocks_per_plane: u32,
    pub pages_per_block: u32,
    pub page_size: u32,
    pub dies: u32,
    pub planes: u32,
    pub blocks: u32,
    pub pages: u32,
    /// log2 of pages_per_block, blocks_per_plane and pages per plane when they are powers of
    /// two, else `NO_SHIFT` (then the id arithmetic divides).
    ppb_shift: u32,
    bpp_shift: u32,
    ppp_shift: u32,
}

const NO_SHIFT: u32 = u32::MAX;

fn shift_of(n: u32) -> u32 {
    if n.is_power_of_two() {
        n.trailing_zeros()
    } else {
        NO_SHIFT
    }
}

/// `x / d`, by a shift when `shift` says `d` is a power of two (ids are divided on every
/// simulated page operation, and a hardware divide costs tens of cycles).
#[inline(always)]
fn div(x: u32, d: u32, shift: u32) -> u32 {
    if shift != NO_SHIFT {
        x >> shift
    } else {
        x / d
    }
}

impl Geometry {
    /// Builds from a validated config.
    pub fn new(g: &GeometryConfig) -> Geometry {
        let dies = g.channels * g.dies_per_channel;
        let planes = dies * g.planes_per_die;
        let blocks = planes * g.blocks_per_plane;
        let pages = blocks * g.pages_per_block;
        Geometry {
            channels: g.channels,
            dies_per_channel: g.dies_per_channel,
            planes_per_die: g.planes_per_die,
            blocks_per_plane: g.blocks_per_plane,
            pages_per_block: g.pages_per_block,
            page_size: g.page_size,
            dies,
            planes,
            blocks,
            pages,
            ppb_shift: shift_of(g.pages_per_block),
            bpp_shift: shift_of(g.blocks_per_plane),
            ppp_shift: shift_of(g.pages_per_block * g.blocks_per_plane),
        }
    }

    #[inline]
    pub fn block_of(&self, ppa: u32) -> u32 {
        div(ppa, self.pages_per_block, self.ppb_shift)
    }
    #[inline]
    pub fn page_in_block(&self, ppa: u32) -> u32 {
        ppa - self.block_of(ppa) * self.pages_per_block
    }
    #[inline]
    pub fn plane_of_block(&self, block: u32) -> u32 {
        div(block, self.blocks_per_plane, self.bpp_shift)
    }
    #[inline]
    pub fn plane_of(&self, ppa: u32) -> u32 {
        div(
            ppa,
            self.pages_per_block * self.blocks_per_plane,
            self.ppp_shift,
        )
    }
    #[inline]
    pub fn die_of_plane(&self, plane: u32) -> u32 {
        plane / self.planes_per_die
    }
    #[inline]
    pub fn die_of(&self, ppa: u32) -> u32 {
        self.plane_of(ppa) / self.planes_per_die
    }
    #[inline]
    pub fn channel_of_die(&self, die: u32) -> u32 {
        die / self.dies_per_channel
    }
    #[inline]
    pub fn first_page(&self, block: u32) -> u32 {
        block * self.pages_per_block
    }
    /// The die used for the `i`-th slot of channel-first striping (consecutive slots go to
    /// different channels).
    #[inline]
    pub fn stripe_die(&self, i: u32) -> u32 {
        let ch = i % self.channels;
        let d = (i / self.channels) % self.dies_per_channel;
        ch * self.dies_per_channel + d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        let g = Geometry::new(&GeometryConfig {
            channels: 2,
            dies_per_channel: 3,
            planes_per_die: 2,
            blocks_per_plane: 5,
            pages_per_block: 7,
            page_size: 4096,
        });
        assert_eq!(g.pages, 2 * 3 * 2 * 5 * 7);
        let ppa = g.first_page(17) + 3;
        assert_eq!(g.block_of(ppa), 17);
        assert_eq!(g.page_in_block(ppa), 3);
        assert_eq!(g.plane_of(ppa), 3);
        assert_eq!(g.die_of(ppa), 1);
        assert_eq!(g.channel_of_die(4), 1);
        let mut seen: Vec<u32> = (0..g.dies).map(|i| g.stripe_die(i)).collect();
        assert_eq!(g.stripe_die(1), 3);
        seen.sort();
        assert_eq!(seen, (0..g.dies).collect::<Vec<_>>());
    }
}
