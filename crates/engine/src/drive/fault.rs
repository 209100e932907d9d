//! A drive wrapper that injects faults: switches a test flips by hand, and a seeded random
//! [`FaultPlan`] for simulation tests.
//!
//! Faults, each with a counter in [`FaultCounters`]:
//! - I/O errors on read, write and flush (EIO);
//! - torn writes: only the first `n` 512-byte sectors of a write reach the media, then EIO;
//! - latency spikes (a sleep before the I/O);
//! - silent bit flips in stored data: a write stores its data with one bit flipped and
//!   reports success (or [`FaultDrive::flip_stored_bit`] damages data at rest);
//! - corrupt reads: reads succeed but return data with a bit flipped per 4 KiB block;
//! - a drive that disappears (every I/O fails with ENODEV) and comes back, by hand
//!   ([`FaultSwitch::set_offline`]) or at random for a number of I/Os.
//!
//! The random decisions come from a per-drive generator seeded by the plan, so a
//! single-threaded caller sees the same faults for the same seed and I/O sequence.

use super::{Drive, DriveInfo, DriveRef};
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Probabilities (per I/O, 0.0 to 1.0) of each random fault, and the seed that drives them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultPlan {
    /// Seed of the drive's fault generator.
    pub seed: u64,
    /// A read fails with EIO.
    pub read_error: f64,
    /// A write fails with EIO and stores nothing.
    pub write_error: f64,
    /// A flush fails with EIO.
    pub flush_error: f64,
    /// A write stores only its first n 512-byte sectors (0 <= n < sectors), then fails.
    pub torn_write: f64,
    /// A write silently stores its data with one bit flipped.
    pub bit_flip: f64,
    /// A read returns data with one bit flipped (the media stays intact).
    pub read_flip: f64,
    /// An I/O is delayed by `latency`.
    pub latency_spike: f64,
    /// How long a latency spike lasts.
    pub latency: Duration,
    /// The drive disappears before an I/O, for `vanish_ios` I/Os.
    pub vanish: f64,
    /// How many I/Os a vanished drive stays gone (at least 1).
    pub vanish_ios: u64,
}

impl FaultPlan {
    /// A plan that injects nothing, with `seed` for later changes.
    pub fn seeded(seed: u64) -> Self {
        FaultPlan {
            seed,
            ..Default::default()
        }
    }
}

/// How many faults of each kind a [`FaultDrive`] injected.
#[derive(Default, Debug)]
pub struct FaultCounters {
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    pub flush_errors: AtomicU64,
    pub torn_writes: AtomicU64,
    pub bit_flips: AtomicU64,
    pub corrupt_reads: AtomicU64,
    pub latency_spikes: AtomicU64,
    /// Times the drive disappeared.
    pub vanishes: AtomicU64,
    /// I/Os refused while the drive was gone.
    pub offline_ios: AtomicU64,
}

/// A plain copy of [`FaultCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCountersSnapshot {
    pub read_errors: u64,
    pub write_errors: u64,
    pub flush_errors: u64,
    pub torn_writes: u64,
    pub bit_flips: u64,
    pub corrupt_reads: u64,
    pub latency_spikes: u64,
    pub vanishes: u64,
    pub offline_ios: u64,
}

impl FaultCountersSnapshot {
    /// Every injected fault (refused offline I/Os not counted separately from vanishes).
    pub fn total(&self) -> u64 {
        self.read_errors
            + self.write_errors
            + self.flush_errors
            + self.torn_writes
            + self.bit_flips
            + self.corrupt_reads
            + self.latency_spikes
            + self.vanishes
    }

    /// Adds `o` into `self`.
    pub fn add(&mut self, o: &FaultCountersSnapshot) {
        self.read_errors += o.read_errors;
        self.write_errors += o.write_errors;
        self.flush_errors += o.flush_errors;
        self.torn_writes += o.torn_writes;
        self.bit_flips += o.bit_flips;
        self.corrupt_reads += o.corrupt_reads;
        self.latency_spikes += o.latency_spikes;
        self.vanishes += o.vanishes;
        self.offline_ios += o.offline_ios;
    }
}

impl FaultCounters {
    /// A plain copy of the counters.
    pub fn snapshot(&self) -> FaultCountersSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FaultCountersSnapshot {
            read_errors: l(&self.read_errors),
            write_errors: l(&self.write_errors),
            flush_errors: l(&self.flush_errors),
            torn_writes: l(&self.torn_writes),
            bit_flips: l(&self.bit_flips),
            corrupt_reads: l(&self.corrupt_reads),
            latency_spikes: l(&self.latency_spikes),
            vanishes: l(&self.vanishes),
            offline_ios: l(&self.offline_ios),
        }
    }
}

/// The switches of a [`FaultDrive`], shared with the test that flips them.
#[derive(Default, Debug)]
pub struct FaultSwitch {
    /// Every read fails with EIO.
    pub fail_reads: AtomicBool,
    /// Every write and flush fails with EIO.
    pub fail_writes: AtomicBool,
    /// Reads succeed but return data with one bit flipped per 4 KiB block.
    pub corrupt_reads: AtomicBool,
    /// The drive is gone: every I/O fails with ENODEV until it comes back.
    pub offline: AtomicBool,
    /// The drive ignores discards (no TRIM, a file system without hole punching): what a
    /// freed range held stays readable until overwritten. A property of the drive, not a
    /// fault: `heal` leaves it.
    pub keep_discarded: AtomicBool,
    /// What was injected so far.
    pub counters: FaultCounters,
    random: Mutex<RandomState>,
}

#[derive(Default, Debug)]
struct RandomState {
    plan: FaultPlan,
    rng: u64,
    /// I/Os left before a randomly vanished drive comes back.
    gone_for: u64,
}

impl FaultSwitch {
    /// Turns every kind of I/O failure on or off at once (a vanished drive).
    pub fn set_dead(&self, dead: bool) {
        self.fail_reads.store(dead, Ordering::SeqCst);
        self.fail_writes.store(dead, Ordering::SeqCst);
    }

    /// Makes the drive disappear (every I/O fails with ENODEV) or come back.
    pub fn set_offline(&self, gone: bool) {
        if gone && !self.offline.swap(true, Ordering::SeqCst) {
            self.counters.vanishes.fetch_add(1, Ordering::Relaxed);
        } else if !gone {
            self.offline.store(false, Ordering::SeqCst);
        }
    }

    /// Replaces the random fault plan (and reseeds its generator from `plan.seed`).
    pub fn set_plan(&self, plan: FaultPlan) {
        let mut r = self.random.lock();
        r.rng = plan.seed ^ 0x9E37_79B9_7F4A_7C15;
        r.plan = plan;
        r.gone_for = 0;
    }

    /// The current random fault plan.
    pub fn plan(&self) -> FaultPlan {
        self.random.lock().plan.clone()
    }

    /// Clears every switch and the random plan (counters are kept).
    pub fn heal(&self) {
        self.set_dead(false);
        self.corrupt_reads.store(false, Ordering::SeqCst);
        self.offline.store(false, Ordering::SeqCst);
        let seed = self.random.lock().plan.seed;
        self.set_plan(FaultPlan::seeded(seed));
    }
}

/// splitmix64: small, fast and good enough for fault decisions.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn chance(state: &mut u64, p: f64) -> bool {
    p > 0.0 && ((next(state) >> 11) as f64 / (1u64 << 53) as f64) < p
}

/// What the random plan decided for one I/O.
#[derive(Default)]
struct Decision {
    gone: bool,
    spike: Option<Duration>,
    error: bool,
    torn: Option<usize>,
    flip: Option<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Flush,
}

/// Wraps a drive and injects the faults its [`FaultSwitch`] asks for.
pub struct FaultDrive {
    inner: DriveRef,
    switch: Arc<FaultSwitch>,
}

impl FaultDrive {
    /// Wraps `inner`; returns the drive and its switches.
    pub fn new(inner: DriveRef) -> (Arc<Self>, Arc<FaultSwitch>) {
        Self::with_plan(inner, FaultPlan::default())
    }

    /// A plan that injects nothing, seeded with `seed` (the same as `FaultPlan::seeded`; this
    /// path names no type that `drive` does not re-export).
    pub fn plan(seed: u64) -> FaultPlan {
        FaultPlan::seeded(seed)
    }

    /// Wraps `inner` with a seeded random fault plan.
    pub fn with_plan(inner: DriveRef, plan: FaultPlan) -> (Arc<Self>, Arc<FaultSwitch>) {
        let switch = Arc::new(FaultSwitch::default());
        switch.set_plan(plan);
        (
            Arc::new(FaultDrive {
                inner,
                switch: switch.clone(),
            }),
            switch,
        )
    }

    /// The drive's switches and counters.
    pub fn switch(&self) -> &Arc<FaultSwitch> {
        &self.switch
    }

    /// The wrapped drive.
    pub fn inner(&self) -> &DriveRef {
        &self.inner
    }

    /// Flips bit `bit` (0 to 32767) of the 4 KiB block at `offset` on the wrapped drive: data
    /// rot at rest, invisible until read.
    pub fn flip_stored_bit(&self, offset: u64, bit: usize) -> io::Result<()> {
        let offset = offset / 4096 * 4096;
        let mut b = crate::aligned::AlignedBuf::zeroed(4096);
        self.inner.read_at(offset, &mut b)?;
        b[(bit / 8) % 4096] ^= 1 << (bit % 8);
        self.inner.write_at(offset, &b)?;
        self.switch
            .counters
            .bit_flips
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn decide(&self, kind: Kind, len: usize) -> Decision {
        let mut r = self.switch.random.lock();
        let RandomState {
            plan,
            rng,
            gone_for,
        } = &mut *r;
        let mut d = Decision::default();
        if *gone_for > 0 {
            *gone_for -= 1;
            if *gone_for == 0 {
                self.switch.offline.store(false, Ordering::SeqCst);
            }
            d.gone = true;
            return d;
        }
        if chance(rng, plan.vanish) {
            *gone_for = plan.vanish_ios.max(1);
            self.switch.set_offline(true);
            d.gone = true;
            return d;
        }
        if chance(rng, plan.latency_spike) {
            d.spike = Some(plan.latency);
        }
        let sectors = len / 512;
        match kind {
            Kind::Read => {
                d.error = chance(rng, plan.read_error);
                if !d.error && len > 0 && chance(rng, plan.read_flip) {
                    d.flip = Some((next(rng) % (len as u64 * 8)) as usize);
                }
            }
            Kind::Write => {
                d.error = chance(rng, plan.write_error);
                if !d.error && sectors > 0 && chance(rng, plan.torn_write) {
                    d.torn = Some((next(rng) % sectors as u64) as usize);
                }
                if !d.error && d.torn.is_none() && len > 0 && chance(rng, plan.bit_flip) {
                    d.flip = Some((next(rng) % (len as u64 * 8)) as usize);
                }
            }
            Kind::Flush => d.error = chance(rng, plan.flush_error),
        }
        d
    }

    /// Runs the decisions common to every I/O; returns the rest.
    fn begin(&self, kind: Kind, len: usize) -> io::Result<Decision> {
        let c = &self.switch.counters;
        let d = self.decide(kind, len);
        if d.gone || self.switch.offline.load(Ordering::Relaxed) {
            c.offline_ios.fetch_add(1, Ordering::Relaxed);
            return Err(io::Error::from_raw_os_error(libc::ENODEV));
        }
        if let Some(t) = d.spike {
            c.latency_spikes.fetch_add(1, Ordering::Relaxed);
            if !t.is_zero() {
                std::thread::sleep(t);
            }
        }
        Ok(d)
    }

    /// Stores the first `sectors` 512-byte sectors of `buf` at `offset`, keeping the rest of
    /// the covering 4 KiB blocks as they were.
    fn write_torn(&self, offset: u64, buf: &[u8], sectors: usize) -> io::Result<()> {
        let n = sectors * 512;
        if n == 0 {
            return Ok(());
        }
        let span = n.div_ceil(4096) * 4096;
        let mut b = crate::aligned::AlignedBuf::zeroed(span);
        self.inner.read_at(offset, &mut b)?;
        b[..n].copy_from_slice(&buf[..n]);
        self.inner.write_at(offset, &b)
    }
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

impl Drive for FaultDrive {
    fn info(&self) -> DriveInfo {
        self.inner.info()
    }

    fn space_from_host_filesystem(&self) -> bool {
        self.inner.space_from_host_filesystem()
    }

    fn unlinked(&self) -> bool {
        self.inner.unlinked()
    }

    fn release(&self) {
        self.inner.release()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let d = self.begin(Kind::Read, buf.len())?;
        let c = &self.switch.counters;
        if d.error || self.switch.fail_reads.load(Ordering::Relaxed) {
            c.read_errors.fetch_add(1, Ordering::Relaxed);
            return Err(eio());
        }
        self.inner.read_at(offset, buf)?;
        if self.switch.corrupt_reads.load(Ordering::Relaxed) {
            for block in buf.chunks_mut(4096) {
                block[block.len() / 2] ^= 0x10;
            }
            c.corrupt_reads.fetch_add(1, Ordering::Relaxed);
        } else if let Some(bit) = d.flip {
            buf[bit / 8] ^= 1 << (bit % 8);
            c.corrupt_reads.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let d = self.begin(Kind::Write, buf.len())?;
        let c = &self.switch.counters;
        if d.error || self.switch.fail_writes.load(Ordering::Relaxed) {
            c.write_errors.fetch_add(1, Ordering::Relaxed);
            return Err(eio());
        }
        if let Some(sectors) = d.torn {
            c.torn_writes.fetch_add(1, Ordering::Relaxed);
            self.write_torn(offset, buf, sectors)?;
            return Err(eio());
        }
        if let Some(bit) = d.flip {
            let mut b = crate::aligned::AlignedBuf::zeroed(buf.len());
            b.copy_from_slice(buf);
            b[bit / 8] ^= 1 << (bit % 8);
            c.bit_flips.fetch_add(1, Ordering::Relaxed);
            return self.inner.write_at(offset, &b);
        }
        self.inner.write_at(offset, buf)
    }

    /// Passed on unless the drive is gone or failing writes, or ignores discards; draws no
    /// random fault (a discard is advice the engine does not depend on).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.switch.keep_discarded.load(Ordering::Relaxed) {
            return Ok(());
        }
        if self.switch.offline.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc::ENODEV));
        }
        if self.switch.fail_writes.load(Ordering::Relaxed) {
            return Err(eio());
        }
        self.inner.discard(offset, len)
    }

    fn flush(&self) -> io::Result<()> {
        let d = self.begin(Kind::Flush, 0)?;
        if d.error || self.switch.fail_writes.load(Ordering::Relaxed) {
            self.switch
                .counters
                .flush_errors
                .fetch_add(1, Ordering::Relaxed);
            return Err(eio());
        }
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aligned::AlignedBuf;
    use crate::drive::MemDrive;

    fn mem() -> DriveRef {
        Arc::new(MemDrive::new(1 << 20, "mem:0"))
    }

    fn pattern(len: usize, v: u8) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(len);
        b.fill(v);
        b
    }

    #[test]
    fn switches_and_counters() {
        let (d, s) = FaultDrive::new(mem());
        d.write_at(0, &pattern(4096, 7)).unwrap();
        s.fail_reads.store(true, Ordering::SeqCst);
        let mut b = AlignedBuf::zeroed(4096);
        assert!(d.read_at(0, &mut b).is_err());
        s.fail_reads.store(false, Ordering::SeqCst);
        s.set_offline(true);
        assert_eq!(
            d.read_at(0, &mut b).unwrap_err().raw_os_error(),
            Some(libc::ENODEV)
        );
        assert!(d.write_at(0, &b).is_err() && d.flush().is_err());
        s.set_offline(false);
        d.read_at(0, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 7));
        s.corrupt_reads.store(true, Ordering::SeqCst);
        d.read_at(0, &mut b).unwrap();
        assert_eq!(b[2048], 7 ^ 0x10);
        let c = s.counters.snapshot();
        assert_eq!(
            (c.read_errors, c.vanishes, c.offline_ios, c.corrupt_reads),
            (1, 1, 3, 1)
        );
        d.flip_stored_bit(0, 9).unwrap();
        s.heal();
        d.read_at(0, &mut b).unwrap();
        assert_eq!(b[1], 7 ^ 2);
        assert_eq!(s.counters.snapshot().bit_flips, 1);
    }

    #[test]
    fn torn_write_keeps_a_sector_prefix() {
        let plan = FaultPlan {
            torn_write: 1.0,
            ..FaultPlan::seeded(3)
        };
        let (d, s) = FaultDrive::with_plan(mem(), plan);
        assert!(d.write_at(4096, &pattern(16384, 9)).is_err());
        let n = s.counters.snapshot().torn_writes;
        assert_eq!(n, 1);
        s.heal();
        let mut b = AlignedBuf::zeroed(16384);
        d.read_at(4096, &mut b).unwrap();
        let kept = b.iter().take_while(|&&x| x == 9).count();
        assert!(kept % 512 == 0 && kept < 16384, "{kept}");
        assert!(b[kept..].iter().all(|&x| x == 0));
    }

    #[test]
    fn random_plan_is_deterministic() {
        let run = |seed| {
            let plan = FaultPlan {
                read_error: 0.1,
                write_error: 0.05,
                torn_write: 0.05,
                bit_flip: 0.05,
                read_flip: 0.05,
                latency_spike: 0.1,
                latency: Duration::ZERO,
                vanish: 0.02,
                vanish_ios: 3,
                ..FaultPlan::seeded(seed)
            };
            let (d, s) = FaultDrive::with_plan(mem(), plan);
            let mut trace = Vec::new();
            let mut b = AlignedBuf::zeroed(8192);
            for i in 0..400u64 {
                let off = (i * 8192) % (1 << 20);
                trace.push(if i % 3 == 0 {
                    d.read_at(off, &mut b).is_ok()
                } else {
                    d.write_at(off, &pattern(8192, i as u8)).is_ok()
                });
            }
            (trace, s.counters.snapshot())
        };
        let (a, ca) = run(42);
        assert_eq!((a.clone(), ca), run(42));
        assert_ne!(a, run(43).0);
        assert!(ca.read_errors > 0 && ca.write_errors > 0 && ca.torn_writes > 0);
        assert!(ca.bit_flips > 0 && ca.latency_spikes > 0 && ca.vanishes > 0);
    }
}
