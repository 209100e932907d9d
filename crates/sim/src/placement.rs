//! Static page allocation: the plane a logical page is written to, picked from the LPA by
//! an order of channel (C), way = die within its channel (W) and plane (P), the first letter
//! varying fastest, as MQSim's CWDP-style plane allocation schemes do (our geometry has no
//! separate die-in-chip level). Also places reads of never-written pages.

use crate::config::Allocation;
use crate::geometry::Geometry;

/// A static placement order, or none (dynamic allocation).
#[derive(Debug, Clone, Copy)]
pub struct Placement {
    /// Dimension indices (0 = channel, 1 = way, 2 = plane), fastest first; `None` when
    /// allocation is dynamic.
    order: Option<[u8; 3]>,
    dims: [u32; 3],
    dies_per_channel: u32,
    planes_per_die: u32,
}

impl Placement {
    pub fn new(a: Allocation, g: &Geometry) -> Placement {
        let order = match a {
            Allocation::Dynamic => None,
            Allocation::StaticCwp => Some([0, 1, 2]),
            Allocation::StaticCpw => Some([0, 2, 1]),
            Allocation::StaticWcp => Some([1, 0, 2]),
            Allocation::StaticWpc => Some([1, 2, 0]),
            Allocation::StaticPcw => Some([2, 0, 1]),
            Allocation::StaticPwc => Some([2, 1, 0]),
        };
        Placement {
            order,
            dims: [g.channels, g.dies_per_channel, g.planes_per_die],
            dies_per_channel: g.dies_per_channel,
            planes_per_die: g.planes_per_die,
        }
    }

    /// Whether writes are placed statically.
    #[inline]
    pub fn is_static(&self) -> bool {
        self.order.is_some()
    }

    /// The plane of `lpa` under this order (`static-cwp` when dynamic: the place a read of
    /// a never-written page is charged to).
    #[inline]
    pub fn plane_of_lpa(&self, lpa: u32) -> u32 {
        let order = self.order.unwrap_or([0, 1, 2]);
        let mut x = lpa;
        let mut idx = [0u32; 3];
        for &d in &order {
            let n = self.dims[d as usize];
            idx[d as usize] = x % n;
            x /= n;
        }
        (idx[0] * self.dies_per_channel + idx[1]) * self.planes_per_die + idx[2]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GeometryConfig;

    fn geo() -> Geometry {
        // 2 channels x 3 ways x 2 planes = 12 planes.
        Geometry::new(&GeometryConfig {
            channels: 2,
            dies_per_channel: 3,
            planes_per_die: 2,
            blocks_per_plane: 4,
            pages_per_block: 4,
            page_size: 4096,
        })
    }

    /// (channel, way, plane in die) of a plane id.
    fn cwp(g: &Geometry, plane: u32) -> (u32, u32, u32) {
        let die = plane / g.planes_per_die;
        (
            die / g.dies_per_channel,
            die % g.dies_per_channel,
            plane % g.planes_per_die,
        )
    }

    #[test]
    fn orders_place_consecutive_pages_as_named() {
        let g = geo();
        let p = |a| Placement::new(a, &g);
        // CWP: channel fastest, then way, then plane.
        let s: Vec<_> = (0..6)
            .map(|l| cwp(&g, p(Allocation::StaticCwp).plane_of_lpa(l)))
            .collect();
        assert_eq!(
            s,
            [
                (0, 0, 0),
                (1, 0, 0),
                (0, 1, 0),
                (1, 1, 0),
                (0, 2, 0),
                (1, 2, 0)
            ]
        );
        assert_eq!(cwp(&g, p(Allocation::StaticCwp).plane_of_lpa(6)), (0, 0, 1));
        // PWC: plane fastest, then way, then channel.
        let s: Vec<_> = (0..4)
            .map(|l| cwp(&g, p(Allocation::StaticPwc).plane_of_lpa(l)))
            .collect();
        assert_eq!(s, [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]);
        assert_eq!(cwp(&g, p(Allocation::StaticPwc).plane_of_lpa(6)), (1, 0, 0));
        // WCP: way fastest, then channel.
        assert_eq!(cwp(&g, p(Allocation::StaticWcp).plane_of_lpa(1)), (0, 1, 0));
        assert_eq!(cwp(&g, p(Allocation::StaticWcp).plane_of_lpa(3)), (1, 0, 0));
        // CPW: channel, then plane, then way.
        assert_eq!(cwp(&g, p(Allocation::StaticCpw).plane_of_lpa(2)), (0, 0, 1));
        assert_eq!(cwp(&g, p(Allocation::StaticCpw).plane_of_lpa(4)), (0, 1, 0));
        // WPC and PCW.
        assert_eq!(cwp(&g, p(Allocation::StaticWpc).plane_of_lpa(3)), (0, 0, 1));
        assert_eq!(cwp(&g, p(Allocation::StaticWpc).plane_of_lpa(6)), (1, 0, 0));
        assert_eq!(cwp(&g, p(Allocation::StaticPcw).plane_of_lpa(2)), (1, 0, 0));
        assert_eq!(cwp(&g, p(Allocation::StaticPcw).plane_of_lpa(4)), (0, 1, 0));
    }

    #[test]
    fn every_order_spreads_pages_evenly() {
        let g = geo();
        for a in Allocation::ALL {
            let p = Placement::new(a, &g);
            assert_eq!(p.is_static(), a != Allocation::Dynamic);
            let mut count = vec![0u32; g.planes as usize];
            for lpa in 0..g.planes * 5 {
                count[p.plane_of_lpa(lpa) as usize] += 1;
            }
            assert!(count.iter().all(|&c| c == 5), "{a:?}: {count:?}");
        }
    }
}
