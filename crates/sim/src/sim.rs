//! Top-level entry points: build the FTL, precondition it, run the timed engine on a job or
//! a trace, and assemble the [`Report`]. This is the crate's main API.

use crate::config::{ConfigError, SimConfig};
use crate::engine::{Engine, Progress, Source};
use crate::ftl::Ftl;
use crate::geometry::Geometry;
use crate::precondition::precondition;
use crate::stats::{waf, DeviceInfo, EraseDistribution, GcRegime, Report};
use crate::trace::TraceRecord;

/// Resolved trace records and how to pace them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    pub records: Vec<TraceRecord>,
    /// Open loop at the records' times (true), or closed loop at the workload's
    /// `numjobs` x `iodepth` (traces without times).
    pub timed: bool,
}
use crate::workload::JobGen;

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("trace: {0}")]
    Trace(String),
}

/// Runs the configured job and returns its report.
pub fn run(cfg: &SimConfig) -> Result<Report, SimError> {
    run_with_progress(cfg, &mut |_, _| {})
}

/// As [`run`], calling `progress(done, total)` every 65536 host I/Os.
pub fn run_with_progress(cfg: &SimConfig, progress: Progress<'_>) -> Result<Report, SimError> {
    cfg.validate()?;
    let (ftl, pre) = prepare(cfg);
    let source = Source::Jobs(JobGen::new(cfg));
    Ok(finish(cfg, ftl, pre, source, progress))
}

/// Replays resolved trace records (see [`crate::trace`]) on the configured device; the
/// workload section only supplies what [`SimConfig::validate_replay`] checks.
pub fn run_trace(
    cfg: &SimConfig,
    records: Vec<TraceRecord>,
    progress: Progress<'_>,
) -> Result<Report, SimError> {
    run_replay(
        cfg,
        Replay {
            records,
            timed: true,
        },
        progress,
    )
}

/// Replays a trace open loop (timed) or closed loop (untimed), see [`Replay`].
pub fn run_replay(
    cfg: &SimConfig,
    replay: Replay,
    progress: Progress<'_>,
) -> Result<Report, SimError> {
    cfg.validate_replay()?;
    if replay.records.is_empty() {
        return Err(SimError::Trace("the trace has no requests".into()));
    }
    let (ftl, pre) = prepare(cfg);
    let source = if replay.timed {
        Source::Trace(replay.records)
    } else {
        Source::TraceClosed(replay.records)
    };
    Ok(finish(cfg, ftl, pre, source, progress))
}

/// A built and preconditioned device, ready for its measured run (lets callers time the
/// two phases separately, as `flashpool sim bench` does).
pub struct Prepared {
    cfg: SimConfig,
    ftl: Ftl,
    pre: crate::stats::PreconditionInfo,
}

impl Prepared {
    /// Builds and preconditions the device of `cfg`.
    pub fn new(cfg: &SimConfig) -> Result<Prepared, SimError> {
        cfg.validate()?;
        let (ftl, pre) = prepare(cfg);
        Ok(Prepared {
            cfg: cfg.clone(),
            ftl,
            pre,
        })
    }

    /// The preconditioned FTL, for callers that time it themselves
    /// ([`crate::drive_timing`]).
    pub fn into_ftl(self) -> Ftl {
        self.ftl
    }

    /// Runs the configured job.
    pub fn run(self, progress: Progress<'_>) -> Report {
        let source = Source::Jobs(JobGen::new(&self.cfg));
        finish(&self.cfg, self.ftl, self.pre, source, progress)
    }
}

fn prepare(cfg: &SimConfig) -> (Ftl, crate::stats::PreconditionInfo) {
    let geo = Geometry::new(&cfg.geometry);
    let mut ftl = Ftl::new(geo, &cfg.ftl, cfg.logical_pages(), cfg.workload.seed);
    let pre = precondition(cfg, &mut ftl);
    (ftl, pre)
}

fn finish(
    cfg: &SimConfig,
    ftl: Ftl,
    pre: crate::stats::PreconditionInfo,
    source: Source,
    progress: Progress<'_>,
) -> Report {
    let mut e = Engine::new(cfg, ftl, source);
    if e.ftl.failed.is_none() {
        e.run(progress);
    } else {
        e.failed = e.ftl.failed.clone();
    }
    report(cfg, &e, pre)
}

fn report(cfg: &SimConfig, e: &Engine, pre: crate::stats::PreconditionInfo) -> Report {
    let c = e.ftl.ctr.since(&e.base);
    let secs = e.last_completion as f64 / 1e9;
    let per_s = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
    let geo = e.ftl.geo;
    let total_bytes: u64 = e.bytes_by_op.iter().sum();
    let memory = e.ftl.memory_bytes();
    Report {
        name: cfg.name.clone().unwrap_or_default(),
        seed: cfg.workload.seed,
        sim_seconds: secs,
        host_ios: e.completed,
        read_ios: e.ios_by_op[0],
        write_ios: e.ios_by_op[1],
        trim_ios: e.ios_by_op[2],
        iops: per_s(e.completed as f64),
        read_iops: per_s(e.ios_by_op[0] as f64),
        write_iops: per_s(e.ios_by_op[1] as f64),
        mb_s: per_s(total_bytes as f64) / 1e6,
        read_mb_s: per_s(e.bytes_by_op[0] as f64) / 1e6,
        write_mb_s: per_s(e.bytes_by_op[1] as f64) / 1e6,
        host_pages_read: e.host_pages_read,
        host_pages_written: c.host_pages_written,
        flash_pages_programmed: c.flash_pages_programmed,
        gc_pages_moved: c.gc_pages_moved,
        wl_pages_moved: c.wl_pages_moved,
        blocks_erased: c.blocks_erased,
        gc_victims: c.gc_victims,
        waf: waf(&c),
        read_latency_us: e.lat[0].summary(),
        write_latency_us: e.lat[1].summary(),
        trim_latency_us: e.lat[2].summary(),
        suspensions: e.suspends,
        flash_ops: e.flash_ops,
        grown_bad_blocks: c.grown_bad_blocks,
        erase_count: EraseDistribution::from_counts(&e.ftl.erase_counts()),
        device: DeviceInfo {
            channels: geo.channels,
            dies: geo.dies,
            planes: geo.planes,
            physical_pages: geo.pages as u64,
            logical_pages: e.ftl.logical_pages as u64,
            page_size: geo.page_size,
            op_ratio: cfg.ftl.op_ratio,
            factory_bad_blocks: geo.dies * cfg.ftl.factory_bad_blocks_per_die,
            bad_blocks: e.ftl.bad_blocks(),
            memory_bytes: memory,
            memory_bytes_per_page: memory as f64 / geo.pages as f64,
        },
        precondition: pre,
        time_series: e.series.clone(),
        gc: GcRegime::from_series(&e.series, cfg.ftl.gc_threshold_blocks, c.gc_pages_moved),
        latency_cdf: [e.lat[0].cdf(), e.lat[1].cdf()],
        failed: e.failed.clone(),
    }
}
