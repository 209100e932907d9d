//! Seeded random numbers: Xoshiro256++ with fast bounded integers (Lemire's multiply-shift)
//! so that every stream is reproducible for a seed and cheap on the hot path.

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// A deterministic random stream.
#[derive(Debug, Clone)]
pub struct SimRng(Xoshiro256PlusPlus);

impl SimRng {
    /// A stream for `seed`; `stream` separates independent users of one seed.
    pub fn new(seed: u64, stream: u64) -> SimRng {
        SimRng(Xoshiro256PlusPlus::seed_from_u64(
            seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        ))
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (n > 0); the tiny multiply-shift bias is irrelevant here.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in [0, 1).
    #[inline]
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `pct`/100.
    #[inline]
    pub fn percent(&mut self, pct: u32) -> bool {
        self.below(100) < pct as u64
    }
}

/// Zipf(theta) over ranks 1..=n by rejection-inversion (Hörmann and Derflinger 1996), O(1)
/// per sample with no tables, so it works for billions of items.
#[derive(Debug, Clone)]
pub struct Zipf {
    n: f64,
    s: f64,
    h_x1: f64,
    h_n: f64,
    cut: f64,
}

impl Zipf {
    pub fn new(n: u64, s: f64) -> Zipf {
        let nf = n as f64;
        let mut z = Zipf {
            n: nf,
            s,
            h_x1: 0.0,
            h_n: 0.0,
            cut: 0.0,
        };
        z.h_x1 = z.h(1.5) - 1.0;
        z.h_n = z.h(nf + 0.5);
        z.cut = 2.0 - z.h_inv(z.h(2.5) - 2f64.powf(-s));
        z
    }

    fn h(&self, x: f64) -> f64 {
        let lx = x.ln();
        helper2((1.0 - self.s) * lx) * lx
    }

    fn h_inv(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.s)).max(-1.0);
        (helper1(t) * x).exp()
    }

    /// A rank in 1..=n; rank 1 is the most popular.
    pub fn sample(&self, rng: &mut SimRng) -> u64 {
        loop {
            let u = self.h_n + rng.unit() * (self.h_x1 - self.h_n);
            let x = self.h_inv(u);
            let mut k = (x + 0.5).floor();
            if k < 1.0 {
                k = 1.0;
            } else if k > self.n {
                k = self.n;
            }
            if k - x <= self.cut || u >= self.h(k + 0.5) - (-self.s * k.ln()).exp() {
                return k as u64;
            }
        }
    }
}

/// log(1 + x) / x, stable near 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// (exp(x) - 1) / x, stable near 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_bounded() {
        let mut a = SimRng::new(7, 0);
        let mut b = SimRng::new(7, 0);
        for _ in 0..1000 {
            let x = a.below(10);
            assert_eq!(x, b.below(10));
            assert!(x < 10);
        }
    }

    #[test]
    fn zipf_is_skewed() {
        let z = Zipf::new(1000, 1.2);
        let mut r = SimRng::new(1, 1);
        let mut ones = 0;
        for _ in 0..10_000 {
            let k = z.sample(&mut r);
            assert!((1..=1000).contains(&k));
            if k == 1 {
                ones += 1;
            }
        }
        // P(1) is about 0.2 for n = 1000, s = 1.2.
        assert!(ones > 1000 && ones < 3500, "{ones}");
    }
}
