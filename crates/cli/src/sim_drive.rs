//! A pool drive that is a simulated SSD (issue 18): `flashpool-sim`'s page-mapped FTL decides
//! where every page the pool writes goes, runs its own garbage collection, and counts NAND
//! pages programmed, pages moved and blocks erased; the data itself lives in a memory drive
//! beside it. So the whole stack can be measured, host write to NAND program: the pool's write
//! amplification times the device's.
//!
//! Timing ([`SimClock`]): untimed, the FTL runs its placement and GC inline and every
//! operation completes at once; timed, each operation also charges the NAND work it causes
//! (its page programs or reads, and the device GC a write triggers) to the dies and channels
//! of a [`DriveTiming`] model, in virtual nanoseconds an experiment sets (deterministic, as
//! fast as the FTL runs) or in real time (`serve`: each operation sleeps until the model says
//! it is done, so fio sees the latency of the emulated device). The FTL makes the same
//! decisions timed or not (pages go to the planes in turn), so the counters do not depend on
//! the clock. Each timed drive keeps its read and write latency distributions
//! ([`Drive::latency`]).
//!
//! A write covering part of a device page costs a whole page program (a page-mapped FTL
//! reads, merges and rewrites it); a discard deallocates the pages it covers whole.

use flashpool_engine::drive::{
    Drive, DriveInfo, DriveLatency, LatencySummary, MediaCounters, MemDrive,
};
use flashpool_sim::drive_timing::{DriveTiming, GcWork};
use flashpool_sim::ftl::{Ftl, NONE};
use flashpool_sim::geometry::Geometry;
use flashpool_sim::stats::LatencyRecorder;
use flashpool_sim::SimConfig;
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The clock a simulated drive charges its NAND work to.
#[derive(Clone)]
pub enum SimClock {
    /// None: operations complete at once.
    Untimed,
    /// Virtual nanoseconds the caller advances (an experiment).
    Virtual(Arc<VirtualClock>),
    /// Real time since the instant given: each operation returns when the model says it is
    /// done.
    Real(Instant),
}

/// Virtual time shared by the drives of one experiment: the caller says when the next
/// operations arrive, and reads back when the last of them completes.
#[derive(Debug, Default)]
pub struct VirtualClock {
    now: AtomicU64,
    horizon: AtomicU64,
}

impl VirtualClock {
    pub fn new() -> Arc<VirtualClock> {
        Arc::new(VirtualClock::default())
    }

    /// Operations from now on arrive at `t` (ns); the horizon restarts there.
    pub fn arrive(&self, t: u64) {
        self.now.store(t, Ordering::Relaxed);
        self.horizon.store(t, Ordering::Relaxed);
    }

    /// Operations from now on arrive at `t`, the horizon kept (a request's second step, issued
    /// when its first is done).
    pub fn issue_at(&self, t: u64) {
        self.now.store(t, Ordering::Relaxed);
    }

    /// The arrival time of operations now.
    pub fn now(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }

    /// The latest completion of any operation since the last [`VirtualClock::arrive`] (the
    /// arrival time itself if none).
    pub fn horizon(&self) -> u64 {
        self.horizon.load(Ordering::Relaxed)
    }

    fn completed(&self, t: u64) {
        self.horizon.fetch_max(t, Ordering::Relaxed);
    }
}

/// Largest simulated drive (exported bytes): 4 TiB. Its data lives in memory, in 1 MiB pages
/// allocated on first write behind a table of the whole size.
pub const MAX_SIM_DRIVE_BYTES: u64 = 4 << 40;

/// The device of `--sim-drives`: a preset name or a simulator TOML file. Refused when even
/// the smallest drive [`SimDrive::scaled`] makes of it is larger than a simulated drive may be.
pub fn load_config(what: &str) -> anyhow::Result<SimConfig> {
    let cfg = read_config(what)?;
    let least = SimDrive::scaled(&cfg, 0);
    let g = &least.geometry;
    let why = match least.check_size_limits() {
        Err(e) => e.to_string(),
        Ok(()) if SimDrive::exported_bytes(&least) > MAX_SIM_DRIVE_BYTES => {
            format!("it exports {} bytes", SimDrive::exported_bytes(&least))
        }
        Ok(()) => return Ok(cfg),
    };
    anyhow::bail!(
        "--sim-drives {what}: the smallest simulated drive of this geometry ({} channels x {} \
         dies x {} planes x {} blocks x {} pages of {} bytes, the least blocks per plane that \
         leave its FTL 6 spare blocks) is too large: {why}; a simulated drive exports at most \
         {MAX_SIM_DRIVE_BYTES} bytes (4 TiB): use a smaller geometry.page_size or \
         pages_per_block, or fewer channels, dies or planes",
        g.channels,
        g.dies_per_channel,
        g.planes_per_die,
        g.blocks_per_plane,
        g.pages_per_block,
        g.page_size
    )
}

fn read_config(what: &str) -> anyhow::Result<SimConfig> {
    if let Some(text) = flashpool_sim::presets::preset_text(what) {
        return Ok(SimConfig::from_toml(text)?);
    }
    let p = std::path::Path::new(what);
    if !p.exists() {
        anyhow::bail!(
            "--sim-drives {what:?}: neither a preset ({}) nor a file",
            flashpool_sim::presets::names()
        );
    }
    let text = std::fs::read_to_string(p)
        .map_err(|e| anyhow::anyhow!("--sim-drives {}: {e}", p.display()))?;
    SimConfig::from_toml(&text).map_err(|e| anyhow::anyhow!("--sim-drives {}: {e}", p.display()))
}

/// A simulated SSD holding its data in memory.
pub struct SimDrive {
    data: MemDrive,
    state: Mutex<Device>,
    clock: SimClock,
    page: u64,
    size: u64,
    identity: String,
    discarded_pages: AtomicU64,
    read_pages: AtomicU64,
}

/// What one lock guards: the FTL, its timing and the latencies they gave.
struct Device {
    ftl: Ftl,
    timing: DriveTiming,
    read_lat: LatencyRecorder,
    write_lat: LatencyRecorder,
}

impl SimDrive {
    /// A fresh (empty) device of `cfg`'s geometry and FTL charging its NAND work to `clock`.
    /// Its exported size is the FTL's logical capacity. A device past the simulator's limits
    /// or [`MAX_SIM_DRIVE_BYTES`] is refused as a `--drive-size` too large (an argument
    /// error): [`SimDrive::scaled`] sets the blocks per plane from the drive size.
    pub fn with_clock(
        cfg: &SimConfig,
        identity: String,
        clock: SimClock,
    ) -> anyhow::Result<SimDrive> {
        Self::check_size(cfg)?;
        cfg.validate()?;
        let geo = Geometry::new(&cfg.geometry);
        let logical = cfg.logical_pages();
        if logical > u32::MAX as u64 {
            anyhow::bail!("simulated drive of {logical} pages: at most 2^32");
        }
        let page = cfg.geometry.page_size as u64;
        let size = Self::exported_bytes(cfg);
        let ftl = Ftl::new(geo, &cfg.ftl, logical, cfg.workload.seed);
        Ok(SimDrive {
            data: MemDrive::new(size, identity.clone()),
            state: Mutex::new(Device {
                ftl,
                timing: DriveTiming::new(cfg),
                read_lat: LatencyRecorder::default(),
                write_lat: LatencyRecorder::default(),
            }),
            clock,
            page,
            size,
            identity,
            discarded_pages: Default::default(),
            read_pages: Default::default(),
        })
    }

    /// The device page size in bytes.
    pub fn page(&self) -> u64 {
        self.page
    }

    /// Device pages per second the NAND can program with every die busy.
    pub fn peak_program_pages_per_s(&self) -> f64 {
        let dev = self.state.lock();
        dev.timing.dies() as f64 * 1e9 / dev.timing.mean_program_ns()
    }

    /// The arrival time of an operation starting now, in the clock's nanoseconds (None when
    /// untimed). In real time, the operations of one batch arrive together.
    fn arrival(&self) -> Option<u64> {
        match &self.clock {
            SimClock::Untimed => None,
            SimClock::Virtual(c) => Some(c.now()),
            SimClock::Real(start) => {
                let at =
                    flashpool_engine::drive::batch::submitted_at().unwrap_or_else(Instant::now);
                Some(at.saturating_duration_since(*start).as_nanos() as u64)
            }
        }
    }

    /// Reports an operation done at `done` (clock ns): the horizon of a virtual clock moves,
    /// a real-time caller waits until then.
    fn complete(&self, done: u64) {
        match &self.clock {
            SimClock::Untimed => {}
            SimClock::Virtual(c) => c.completed(done),
            SimClock::Real(start) => {
                let due = *start + std::time::Duration::from_nanos(done);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
            }
        }
    }

    /// `cfg` with as many blocks per plane as it takes to export at least `bytes` (the rest of
    /// the device as the preset has it), but never so few that its over-provisioning leaves
    /// the FTL fewer than 6 spare blocks per plane. A block count past u32 saturates there
    /// (and [`SimDrive::with_clock`] refuses the device).
    /// Refuses a device (a config [`SimDrive::scaled`] made) past the simulator's limits or
    /// [`MAX_SIM_DRIVE_BYTES`], naming `--drive-size` (a usage error), before anything of it
    /// is allocated.
    pub fn check_size(cfg: &SimConfig) -> anyhow::Result<()> {
        if cfg.check_size_limits().is_err() || Self::exported_bytes(cfg) > MAX_SIM_DRIVE_BYTES {
            let what = match &cfg.name {
                Some(n) => format!("a simulated {n} drive"),
                None => "a simulated drive of this config".into(),
            };
            return Err(crate::UsageError(format!(
                "--drive-size is too large for {what} (at most {} bytes)",
                Self::max_bytes(cfg)
            ))
            .into());
        }
        Ok(())
    }

    pub fn scaled(cfg: &SimConfig, bytes: u64) -> SimConfig {
        let mut c = cfg.clone();
        let g = &c.geometry;
        let per_block_row = (g.channels as u128
            * g.dies_per_channel as u128
            * g.planes_per_die as u128
            * g.pages_per_block as u128
            * g.page_size as u128)
            .max(1);
        let physical = (bytes as f64 / (1.0 - c.ftl.op_ratio)).ceil() as u128;
        let least = (6.0 / c.ftl.op_ratio.max(1e-3)).ceil() as u32;
        let blocks = u32::try_from(physical.div_ceil(per_block_row)).unwrap_or(u32::MAX);
        c.geometry.blocks_per_plane = blocks.max(least);
        c
    }

    /// Bytes a device of `cfg` exports: its logical capacity in whole 4 KiB blocks.
    pub fn exported_bytes(cfg: &SimConfig) -> u64 {
        let bytes = cfg.logical_pages() as u128 * cfg.geometry.page_size as u128;
        (bytes / 4096 * 4096).min(u64::MAX as u128) as u64
    }

    /// The most bytes a device of `cfg`'s geometry (any number of blocks per plane) can
    /// export within the simulator's limits and [`MAX_SIM_DRIVE_BYTES`] (0 if none).
    fn max_bytes(cfg: &SimConfig) -> u64 {
        let with = |blocks: u32| {
            let mut c = cfg.clone();
            c.geometry.blocks_per_plane = blocks;
            c
        };
        let fits = |c: &SimConfig| {
            c.check_size_limits().is_ok() && Self::exported_bytes(c) <= MAX_SIM_DRIVE_BYTES
        };
        // Every limit grows with the blocks: the largest count that fits, by bisection.
        let (mut lo, mut hi) = (0u32, u32::MAX);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(&with(mid)) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        if lo == 0 {
            0
        } else {
            Self::exported_bytes(&with(lo))
        }
    }
}

impl Drive for SimDrive {
    fn info(&self) -> DriveInfo {
        DriveInfo {
            size: self.size,
            identity: self.identity.clone(),
        }
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.data.read_at(offset, buf)?;
        let first = offset / self.page;
        let last = (offset + buf.len() as u64).div_ceil(self.page);
        self.read_pages.fetch_add(last - first, Ordering::Relaxed);
        if let Some(at) = self.arrival() {
            let mut dev = self.state.lock();
            let mut done = at;
            for lpa in first..last {
                let ppa = dev.ftl.lookup(lpa as u32);
                let t = dev.timing.read(at, (ppa != NONE).then_some(ppa));
                done = done.max(t);
            }
            dev.read_lat.record(done - at);
            drop(dev);
            self.complete(done);
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.data.write_at(offset, buf)?;
        let first = offset / self.page;
        let last = (offset + buf.len() as u64).div_ceil(self.page);
        let full = |ftl: &Ftl| {
            let why = ftl.failed.clone().unwrap_or_default();
            io::Error::other(format!("simulated SSD: {why}"))
        };
        let Some(at) = self.arrival() else {
            let mut dev = self.state.lock();
            for lpa in first..last {
                if !dev.ftl.write_untimed(lpa as u32) {
                    return Err(full(&dev.ftl));
                }
            }
            return Ok(());
        };
        let mut dev = self.state.lock();
        let mut done = at;
        for lpa in first..last {
            let before = dev.ftl.ctr;
            if !dev.ftl.write_untimed(lpa as u32) {
                return Err(full(&dev.ftl));
            }
            let ppa = dev.ftl.lookup(lpa as u32);
            let c = dev.ftl.ctr;
            let gc = GcWork {
                moves: (c.gc_pages_moved + c.wl_pages_moved)
                    - (before.gc_pages_moved + before.wl_pages_moved),
                erases: c.blocks_erased - before.blocks_erased,
            };
            done = done.max(dev.timing.program(at, ppa, gc));
        }
        dev.write_lat.record(done - at);
        drop(dev);
        self.complete(done);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.data.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.data.discard(offset, len)?;
        let first = offset.div_ceil(self.page);
        let last = (offset + len) / self.page;
        let mut dev = self.state.lock();
        for lpa in first..last {
            dev.ftl.trim(lpa as u32);
        }
        self.discarded_pages
            .fetch_add(last.saturating_sub(first), Ordering::Relaxed);
        Ok(())
    }

    fn completes_inline(&self) -> bool {
        !matches!(self.clock, SimClock::Real(_))
    }

    fn media_counters(&self) -> Option<MediaCounters> {
        let dev = self.state.lock();
        let c = dev.ftl.ctr;
        let wear = dev.ftl.erase_counts();
        drop(dev);
        Some(MediaCounters {
            written_bytes: c.host_pages_written * self.page,
            programmed_bytes: c.flash_pages_programmed * self.page,
            moved_bytes: (c.gc_pages_moved + c.wl_pages_moved) * self.page,
            erases: c.blocks_erased,
            discarded_bytes: self.discarded_pages.load(Ordering::Relaxed) * self.page,
            read_bytes: self.read_pages.load(Ordering::Relaxed) * self.page,
            erase_min: wear.iter().copied().min().unwrap_or(0) as u64,
            erase_max: wear.iter().copied().max().unwrap_or(0) as u64,
            blocks: wear.len() as u64,
        })
    }

    fn latency(&self) -> Option<DriveLatency> {
        if matches!(self.clock, SimClock::Untimed) {
            return None;
        }
        let dev = self.state.lock();
        Some(DriveLatency {
            read: summary(&dev.read_lat),
            write: summary(&dev.write_lat),
        })
    }
}

/// The simulator's latency summary in the engine's terms.
pub fn summary(r: &LatencyRecorder) -> LatencySummary {
    let s = r.summary();
    LatencySummary {
        count: s.count,
        mean_us: s.mean,
        p50_us: s.p50,
        p99_us: s.p99,
        p999_us: s.p999,
        max_us: s.max,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashpool_engine::{Compression, Pool, PoolConfig};
    use std::sync::Arc;

    fn small(bytes: u64) -> SimConfig {
        SimDrive::scaled(&flashpool_sim::presets::preset("small").unwrap(), bytes)
    }

    /// The device keeps the data and counts what it programs; rewriting the same pages in
    /// place drives its own GC (device WAF above 1), and discarding them first keeps it at 1.
    #[test]
    fn device_counts_programs_and_discards_help_its_gc() {
        let run = |discard: bool| {
            let d =
                SimDrive::with_clock(&small(8 << 20), "sim:0".into(), SimClock::Untimed).unwrap();
            let size = d.info().size;
            assert!(size >= 8 << 20, "{size}");
            let mut b = flashpool_engine::aligned::AlignedBuf::zeroed(1 << 20);
            let chunks = size / (1 << 20);
            for round in 0..12u64 {
                for c in 0..chunks {
                    // The pool's pattern: a region written whole, freed whole, written again.
                    if discard {
                        d.discard(c << 20, 1 << 20).unwrap();
                    }
                    b.fill((round * 31 + c) as u8);
                    d.write_at(c << 20, &b).unwrap();
                }
            }
            let mut r = flashpool_engine::aligned::AlignedBuf::zeroed(1 << 20);
            d.read_at(0, &mut r).unwrap();
            assert_eq!(r[5], (11 * 31) as u8);
            d.media_counters().unwrap()
        };
        let plain = run(false);
        let trimmed = run(true);
        assert_eq!(plain.written_bytes, trimmed.written_bytes);
        assert!(plain.device_waf() >= 1.0 && trimmed.device_waf() >= 1.0);
        assert!(trimmed.erases > 0 && trimmed.discarded_bytes > 0);
        assert!(
            trimmed.device_waf() <= plain.device_waf(),
            "discards never cost the device: {} vs {}",
            trimmed.device_waf(),
            plain.device_waf()
        );
    }

    /// In real time an operation returns no sooner than the NAND model says it is done, and
    /// the drive reports the model's latency: a page program on an idle device, then a read
    /// of it (which waits for nothing by then); an untimed drive reports no latency.
    #[test]
    fn real_time_drive_waits_for_the_model() {
        let cfg = small(8 << 20);
        let t = flashpool_sim::timing::Timing::new(&cfg.timing, cfg.geometry.page_size);
        let program_us = (t.cmd_ns + t.xfer_page_ns + t.program(0)) as f64 / 1000.0;
        let read_us = (t.cmd_ns + t.read(0) + t.xfer_page_ns) as f64 / 1000.0;
        let d = SimDrive::with_clock(
            &cfg,
            "sim:0".into(),
            SimClock::Real(std::time::Instant::now()),
        )
        .unwrap();
        assert!(!d.completes_inline(), "the pool must not run it inline");
        let b = flashpool_engine::aligned::AlignedBuf::zeroed(4096);
        let started = std::time::Instant::now();
        d.write_at(0, &b).unwrap();
        let waited = started.elapsed().as_secs_f64() * 1e6;
        assert!(
            waited >= program_us * 0.999,
            "{waited} us < {program_us} us"
        );
        let mut r = flashpool_engine::aligned::AlignedBuf::zeroed(4096);
        d.read_at(0, &mut r).unwrap();
        let l = d.latency().expect("a timed drive reports latency");
        assert_eq!((l.write.count, l.read.count), (1, 1));
        assert!((l.write.mean_us - program_us).abs() < 0.01, "{l:?}");
        assert!((l.read.mean_us - read_us).abs() < 0.01, "{l:?}");
        let untimed = SimDrive::with_clock(&cfg, "sim:1".into(), SimClock::Untimed).unwrap();
        assert!(untimed.latency().is_none() && untimed.completes_inline());
    }

    /// A drive size whose block count does not fit u32 saturates (it used to wrap to a tiny
    /// drive) and is refused as an argument error naming the largest size.
    #[test]
    fn too_large_a_drive_is_refused_not_wrapped() {
        let cfg = small(3_865_470_837 << 20);
        assert_eq!(cfg.geometry.blocks_per_plane, u32::MAX);
        let e = SimDrive::with_clock(&cfg, "sim:0".into(), SimClock::Untimed)
            .err()
            .expect("refused");
        assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("--drive-size") && msg.contains("small"),
            "{msg}"
        );
        let max: u64 = msg
            .rsplit("at most ")
            .next()
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .expect("names the largest size");
        // The largest size fits the limits (checked without building an 8 GiB device); one
        // block row more does not.
        let fits = small(max);
        assert!(fits.check_size_limits().is_ok(), "{max}");
        assert!(SimDrive::exported_bytes(&fits) >= max);
        assert!(
            SimDrive::with_clock(&small(max + (1 << 20)), "x".into(), SimClock::Untimed).is_err()
        );
    }

    /// A pool on simulated SSDs: data round-trips, and the members report their media.
    #[test]
    fn pool_on_simulated_ssds_reports_end_to_end_counters() {
        let cfg = small(160 << 20);
        let drives: Vec<_> = (0..5)
            .map(|i| {
                Arc::new(SimDrive::with_clock(&cfg, format!("sim:{i}"), SimClock::Untimed).unwrap())
                    as flashpool_engine::drive::DriveRef
            })
            .collect();
        let pool = Pool::create(
            drives,
            &PoolConfig {
                k: 4,
                m: 1,
                chunk_size: 64 << 10,
                segment_size: 4 << 20,
                ..PoolConfig::default()
            },
        )
        .unwrap();
        pool.create_volume_with("v", 64 << 20, Compression::Off)
            .unwrap();
        let v = pool.volume("v").unwrap();
        let mut b = vec![0u8; 1 << 20];
        for i in 0..64u64 {
            b.fill(i as u8);
            v.write(i << 20, &b).unwrap();
        }
        pool.flush().unwrap();
        v.read(5 << 20, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 5));
        let m = pool.media_counters().expect("every member reports");
        let host = pool.stats().host_write_bytes;
        assert!(
            m.written_bytes >= host * 5 / 4,
            "parity and headers reach the drives"
        );
        assert!(m.programmed_bytes >= m.written_bytes);
    }
}
