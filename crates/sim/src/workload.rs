//! The fio-like job generator: rw patterns (read, write, randread, randwrite, randrw, rw),
//! block size in pages, span and offset, and uniform, zipf or hot/cold address choice.
//! Random offsets are aligned to the block size, as fio does; zipf ranks are scattered over
//! the span by an affine permutation so hot pages are not all adjacent.

use crate::config::{Distribution, Rw, SimConfig};
use crate::rng::{SimRng, Zipf};

/// Host operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    Read = 0,
    Write = 1,
    Trim = 2,
}

/// One host I/O in pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostIo {
    pub op: IoOp,
    pub lpa: u32,
    pub pages: u32,
}

/// Address chooser over aligned slots of `pages_per_io` pages.
#[derive(Debug, Clone)]
pub struct AddressGen {
    start: u64,
    slots: u64,
    pages_per_io: u32,
    dist: Distribution,
    zipf: Option<Zipf>,
    mul: u64,
    add: u64,
    hot_slots: u64,
    hot_access: f64,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl AddressGen {
    pub fn new(cfg: &SimConfig) -> AddressGen {
        let page = cfg.geometry.page_size as u64;
        let logical_bytes = cfg.logical_pages() * page;
        let start = cfg.workload.offset.bytes(logical_bytes) / page;
        // Validation keeps bs within the logical capacity (fewer than 2^32 pages).
        let pages_per_io = u32::try_from(cfg.workload.bs.bytes(0).div_ceil(page))
            .unwrap_or(u32::MAX)
            .max(1);
        let span_pages = cfg.span_bytes() / page;
        let slots = (span_pages / pages_per_io as u64).max(1);
        let w = &cfg.workload;
        let mut mul = 0x9E37_79B9_7F4A_7C15 % slots;
        if slots > 1 {
            mul = mul.max(1);
            while gcd(mul, slots) != 1 {
                mul += 1;
            }
        }
        AddressGen {
            start,
            slots,
            pages_per_io,
            dist: w.distribution,
            zipf: (w.distribution == Distribution::Zipf).then(|| Zipf::new(slots, w.zipf_theta)),
            mul,
            add: slots / 3,
            hot_slots: ((slots as f64 * w.hot_fraction) as u64).clamp(1, slots),
            hot_access: w.hot_access,
        }
    }

    /// Pages per I/O.
    pub fn pages_per_io(&self) -> u32 {
        self.pages_per_io
    }

    /// Number of aligned slots in the span.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// First page of slot `s`.
    #[inline]
    pub fn slot_lpa(&self, s: u64) -> u32 {
        (self.start + s * self.pages_per_io as u64) as u32
    }

    /// A random slot by the configured distribution.
    #[inline]
    pub fn random_slot(&self, rng: &mut SimRng) -> u64 {
        match self.dist {
            Distribution::Uniform => rng.below(self.slots),
            Distribution::Zipf => {
                let r = self.zipf.as_ref().map_or(1, |z| z.sample(rng)) - 1;
                ((r as u128 * self.mul as u128 + self.add as u128) % self.slots as u128) as u64
            }
            Distribution::Hotcold => {
                if rng.unit() < self.hot_access || self.hot_slots == self.slots {
                    rng.below(self.hot_slots)
                } else {
                    self.hot_slots + rng.below(self.slots - self.hot_slots)
                }
            }
        }
    }
}

/// The job generator: sequential cursors per job and direction (as fio keeps one position
/// per data direction), a shared random stream.
#[derive(Debug, Clone)]
pub struct JobGen {
    addr: AddressGen,
    rw: Rw,
    mixread: u32,
    rng: SimRng,
    cursors: Vec<u64>,
}

impl JobGen {
    pub fn new(cfg: &SimConfig) -> JobGen {
        JobGen {
            addr: AddressGen::new(cfg),
            rw: cfg.workload.rw,
            mixread: cfg.workload.rwmixread,
            rng: SimRng::new(cfg.workload.seed, 0x10B),
            cursors: vec![0; 2 * cfg.workload.numjobs as usize],
        }
    }

    /// The next I/O of `job`.
    #[inline]
    pub fn next(&mut self, job: u32) -> HostIo {
        let op = match self.rw {
            Rw::Read | Rw::Randread => IoOp::Read,
            Rw::Write | Rw::Randwrite => IoOp::Write,
            Rw::Randrw | Rw::Rw => {
                if self.rng.percent(self.mixread) {
                    IoOp::Read
                } else {
                    IoOp::Write
                }
            }
        };
        let slot = if self.rw.is_random() {
            self.addr.random_slot(&mut self.rng)
        } else {
            let c = &mut self.cursors[2 * job as usize + (op == IoOp::Write) as usize];
            let s = *c;
            *c = if s + 1 >= self.addr.slots { 0 } else { s + 1 };
            s
        };
        HostIo {
            op,
            lpa: self.addr.slot_lpa(slot),
            pages: self.addr.pages_per_io,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_wraps_and_random_stays_in_span() {
        let mut cfg = SimConfig::default();
        cfg.workload.rw = Rw::Write;
        cfg.workload.span = Some(crate::config::Size::Bytes(4096 * 10));
        cfg.workload.offset = crate::config::Size::Bytes(4096 * 5);
        let mut g = JobGen::new(&cfg);
        let v: Vec<u32> = (0..12).map(|_| g.next(0).lpa).collect();
        assert_eq!(v[0], 5);
        assert_eq!(v[9], 14);
        assert_eq!(v[10], 5);
        for dist in [
            Distribution::Uniform,
            Distribution::Zipf,
            Distribution::Hotcold,
        ] {
            cfg.workload.rw = Rw::Randrw;
            cfg.workload.distribution = dist;
            let mut g = JobGen::new(&cfg);
            for _ in 0..1000 {
                let io = g.next(0);
                assert!((5..15).contains(&io.lpa), "{dist:?} {}", io.lpa);
            }
        }
    }
}
