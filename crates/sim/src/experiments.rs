//! The six experiments behind `flashpool sim experiment NAME`: each builds its configs,
//! runs the simulations and returns rows (for the CSV and the table) and line series (for
//! the plot). No I/O here; the CLI writes the files.
//!
//! - `scaling`: 4 KiB random read and (clean-drive) random write IOPS for 1-16 modules.
//! - `die-bandwidth`: MB/s against dies for five read/write mixes, beside the theoretical
//!   maximum of the SNIA tutorial's simplified analysis.
//! - `waf-vs-op`: steady-state WAF of uniform random writes against OP, per GC policy.
//! - `write-cliff`: MB/s over time of continuous random writes at several user fill levels.
//! - `suspension`: read latency (max, p99.9) of database-like mixes on TLC timing under each
//!   suspension and read-priority policy, with the write-side cost.
//! - `trace`: a trace replayed on two devices, latency CDFs (see [`crate::trace_experiment`]).

use crate::config::{
    GcPolicy, GeometryConfig, Precondition, Rw, SimConfig, Size, SuspendBudget, Suspension,
    TimingConfig,
};
use crate::sim::{run as run_sim, SimError};
use crate::stats::Report;
use crate::timing::Timing;
use std::fmt::Write;

/// The experiments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Experiment {
    Scaling,
    DieBandwidth,
    WafVsOp,
    WriteCliff,
    Suspension,
    Trace,
}

impl Experiment {
    pub const ALL: [Experiment; 6] = [
        Experiment::Scaling,
        Experiment::DieBandwidth,
        Experiment::WafVsOp,
        Experiment::WriteCliff,
        Experiment::Suspension,
        Experiment::Trace,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Experiment::Scaling => "scaling",
            Experiment::DieBandwidth => "die-bandwidth",
            Experiment::WafVsOp => "waf-vs-op",
            Experiment::WriteCliff => "write-cliff",
            Experiment::Suspension => "suspension",
            Experiment::Trace => "trace",
        }
    }

    pub fn from_name(name: &str) -> Result<Experiment, SimError> {
        Experiment::ALL
            .into_iter()
            .find(|e| e.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Experiment::ALL.iter().map(|e| e.name()).collect();
                SimError::Config(crate::config::ConfigError(format!(
                    "unknown experiment {name:?}; known: {}",
                    names.join(", ")
                )))
            })
    }
}

/// One plotted line.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Drawn thin (theory, ideal lines).
    pub dashed: bool,
}

/// An experiment's output.
#[derive(Debug, Clone, PartialEq)]
pub struct ExperimentResult {
    pub name: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub series: Vec<Series>,
}

impl ExperimentResult {
    /// CSV text with a header line.
    pub fn csv(&self) -> String {
        let mut s = self.columns.join(",");
        s.push('\n');
        for r in &self.rows {
            s.push_str(&r.join(","));
            s.push('\n');
        }
        s
    }

    /// An aligned text table.
    pub fn table(&self) -> String {
        let n = self.columns.len();
        let mut w: Vec<usize> = self.columns.iter().map(|c| c.len()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(n) {
                w[i] = w[i].max(c.len());
            }
        }
        let mut s = format!("{}\n", self.title);
        let line = |cells: &[String]| {
            let mut l = String::new();
            for (i, c) in cells.iter().enumerate().take(n) {
                let _ = write!(l, "{:>width$}  ", c, width = w[i]);
            }
            l.trim_end().to_string() + "\n"
        };
        s.push_str(&line(&self.columns));
        for r in &self.rows {
            s.push_str(&line(r));
        }
        s
    }
}

fn f(x: f64, digits: usize) -> String {
    format!("{x:.digits$}")
}

/// SLC-like timing used by several experiments (the `slc` preset's values).
fn slc_timing() -> TimingConfig {
    TimingConfig {
        read_us: 25.0,
        program_us: 250.0,
        erase_us: 1500.0,
        channel_mt_s: 333,
        bus_width_bits: 8,
        cmd_overhead_us: 1.0,
        ..TimingConfig::default()
    }
}

fn base(geometry: GeometryConfig, timing: TimingConfig) -> SimConfig {
    let mut c = SimConfig {
        geometry,
        timing,
        ..SimConfig::default()
    };
    c.workload.bs = Size::Bytes(4096);
    c.ftl.op_ratio = 0.1;
    c
}

fn go(cfg: &SimConfig, log: &mut dyn FnMut(&str), what: &str) -> Result<Report, SimError> {
    log(what);
    let r = run_sim(cfg)?;
    if let Some(e) = &r.failed {
        log(&format!("{what}: device failed: {e}"));
    }
    Ok(r)
}

/// Runs experiment `e` (`quick` = small devices and few I/Os); `log` receives progress lines.
pub fn run(
    e: Experiment,
    quick: bool,
    log: &mut dyn FnMut(&str),
) -> Result<ExperimentResult, SimError> {
    match e {
        Experiment::Scaling => scaling(quick, log),
        Experiment::DieBandwidth => die_bandwidth(quick, log),
        Experiment::WafVsOp => waf_vs_op(quick, log),
        Experiment::WriteCliff => write_cliff(quick, log),
        Experiment::Suspension => suspension(quick, log),
        Experiment::Trace => crate::trace_experiment::run(
            &crate::trace_experiment::sample(),
            &crate::trace_experiment::default_devices(),
            crate::trace::RangeMode::Scale,
            log,
        ),
    }
}

fn scaling(quick: bool, log: &mut dyn FnMut(&str)) -> Result<ExperimentResult, SimError> {
    let mut rows = Vec::new();
    let (mut rd, mut wr) = (Vec::new(), Vec::new());
    let per_module_ios = if quick { 4_000 } else { 40_000 };
    let mods: &[u32] = if quick { &[1, 2, 4] } else { &[1, 2, 4, 8, 16] };
    for &m in mods {
        // A module: 2 channels x 4 dies x 2 planes of SLC.
        let g = GeometryConfig {
            channels: 2 * m,
            dies_per_channel: 4,
            planes_per_die: 2,
            blocks_per_plane: 64,
            pages_per_block: 64,
            page_size: 4096,
        };
        let mut c = base(g, slc_timing());
        c.workload.iodepth = 32 * m;
        c.workload.ios = per_module_ios * m as u64;
        c.workload.rw = Rw::Randread;
        c.workload.precondition = Precondition::Fill;
        let r = go(&c, log, &format!("scaling: {m} modules, randread"))?;
        c.workload.rw = Rw::Randwrite;
        c.workload.precondition = Precondition::None;
        c.workload.ios = per_module_ios / 2 * m as u64;
        let w = go(&c, log, &format!("scaling: {m} modules, randwrite"))?;
        rd.push((m as f64, r.iops / 1000.0));
        wr.push((m as f64, w.iops / 1000.0));
        rows.push(vec![
            m.to_string(),
            f(r.iops, 0),
            f(w.iops, 0),
            f(rd[0].1 * 1000.0 * m as f64, 0),
            f(wr[0].1 * 1000.0 * m as f64, 0),
        ]);
    }
    let ideal = |s: &Vec<(f64, f64)>| s.iter().map(|&(x, _)| (x, s[0].1 * x)).collect();
    Ok(ExperimentResult {
        name: "scaling".into(),
        title: "4 KiB random IOPS against flash modules (module = 2 channels x 4 SLC dies)".into(),
        x_label: "modules".into(),
        y_label: "kIOPS".into(),
        columns: [
            "modules",
            "randread_iops",
            "randwrite_iops",
            "read_linear",
            "write_linear",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        series: vec![
            Series {
                name: "random read (linear: thin)".into(),
                points: rd.clone(),
                dashed: false,
            },
            Series {
                name: "random write, clean drive".into(),
                points: wr.clone(),
                dashed: false,
            },
            Series {
                name: "read linear".into(),
                points: ideal(&rd),
                dashed: true,
            },
            Series {
                name: "write linear".into(),
                points: ideal(&wr),
                dashed: true,
            },
        ],
    })
}

/// Theoretical maximum MB/s for `dies` dies on `channels` channels, read fraction `r`:
/// per-page die time read = cmd + tR + xfer, write = cmd + xfer + tPROG + tBERS / pages per
/// block (GC 100 % efficient), capped by the channels' transfer rate.
pub fn theoretical_mb_s(cfg: &SimConfig, r: f64) -> f64 {
    let t = Timing::new(&cfg.timing, cfg.geometry.page_size);
    let g = &cfg.geometry;
    let dies = (g.channels * g.dies_per_channel) as f64;
    let read = (t.cmd_ns + t.xfer_page_ns) as f64 + t.mean_read();
    let write = (t.cmd_ns + t.xfer_page_ns) as f64
        + t.mean_program()
        + t.erase_ns as f64 / g.pages_per_block as f64;
    let per_page_ns = r * read + (1.0 - r) * write;
    let pages_per_s =
        (dies * 1e9 / per_page_ns).min(g.channels as f64 * 1e9 / t.xfer_page_ns as f64);
    pages_per_s * g.page_size as f64 / 1e6
}

fn die_bandwidth(quick: bool, log: &mut dyn FnMut(&str)) -> Result<ExperimentResult, SimError> {
    let dies: &[u32] = if quick {
        &[1, 2, 4]
    } else {
        &[1, 2, 4, 8, 16, 32]
    };
    let mixes = [100u32, 75, 50, 25, 0];
    let mut rows = Vec::new();
    let mut series = Vec::new();
    let mut theory_series = Vec::new();
    for &mix in &mixes {
        let mut pts = Vec::new();
        let mut th = Vec::new();
        for &n in dies {
            let channels = n.min(4);
            let g = GeometryConfig {
                channels,
                dies_per_channel: n / channels,
                planes_per_die: 1,
                blocks_per_plane: 64,
                pages_per_block: 64,
                page_size: 4096,
            };
            let mut c = base(g, slc_timing());
            c.workload.rw = Rw::Rw;
            c.workload.rwmixread = mix;
            c.workload.bs = Size::Bytes(128 * 1024);
            c.workload.iodepth = 8;
            c.workload.ios = if quick { 300 } else { 2_000 } * n.min(8) as u64;
            c.workload.precondition = Precondition::Fill;
            let r = go(
                &c,
                log,
                &format!("die-bandwidth: {n} dies, {mix}/{}", 100 - mix),
            )?;
            let t = theoretical_mb_s(&c, mix as f64 / 100.0);
            pts.push((n as f64, r.mb_s));
            th.push((n as f64, t));
            rows.push(vec![
                n.to_string(),
                format!("{mix}/{}", 100 - mix),
                f(r.mb_s, 1),
                f(t, 1),
                f(r.waf, 3),
            ]);
        }
        series.push(Series {
            name: format!("{mix}/{} measured", 100 - mix),
            points: pts,
            dashed: false,
        });
        theory_series.push(Series {
            name: format!("{mix}/{} theory", 100 - mix),
            points: th,
            dashed: true,
        });
    }
    series.extend(theory_series);
    Ok(ExperimentResult {
        name: "die-bandwidth".into(),
        title: "Bandwidth against dies (128 KiB sequential mixes, SLC, 4 channels max)".into(),
        x_label: "dies".into(),
        y_label: "MB/s".into(),
        columns: [
            "dies",
            "read_write_mix",
            "measured_mb_s",
            "theoretical_mb_s",
            "waf",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        series,
    })
}

fn waf_vs_op(quick: bool, log: &mut dyn FnMut(&str)) -> Result<ExperimentResult, SimError> {
    let ops: Vec<f64> = (1..=10).map(|i| i as f64 * 0.05).collect();
    let mut rows = Vec::new();
    let mut series = Vec::new();
    for policy in GcPolicy::ALL {
        let mut pts = Vec::new();
        for &op in &ops {
            let g = GeometryConfig {
                channels: 4,
                dies_per_channel: 2,
                planes_per_die: 1,
                blocks_per_plane: if quick { 96 } else { 128 },
                pages_per_block: if quick { 32 } else { 64 },
                page_size: 4096,
            };
            let mut c = base(g, slc_timing());
            c.ftl.op_ratio = op;
            c.ftl.gc_policy = policy;
            c.workload.rw = Rw::Randwrite;
            c.workload.precondition = Precondition::Steady;
            c.workload.ios = c.logical_pages() * if quick { 1 } else { 2 };
            let r = go(&c, log, &format!("waf-vs-op: {} op {op:.2}", policy.name()))?;
            pts.push((op * 100.0, r.waf));
            rows.push(vec![
                policy.name().to_string(),
                f(op, 2),
                f(r.waf, 3),
                r.precondition.steady.to_string(),
                f(r.iops, 0),
            ]);
        }
        series.push(Series {
            name: policy.name().to_string(),
            points: pts,
            dashed: false,
        });
    }
    Ok(ExperimentResult {
        name: "waf-vs-op".into(),
        title: "Steady-state write amplification of uniform random 4 KiB writes".into(),
        x_label: "over-provisioning (physical - logical) / physical, %".into(),
        y_label: "write amplification".into(),
        columns: ["policy", "op_ratio", "waf", "precondition_steady", "iops"]
            .map(String::from)
            .to_vec(),
        rows,
        series,
    })
}

fn write_cliff(quick: bool, log: &mut dyn FnMut(&str)) -> Result<ExperimentResult, SimError> {
    let fills = [0.5, 0.75, 0.9, 1.0];
    let mut rows = Vec::new();
    let mut series = Vec::new();
    for &fill in &fills {
        let g = GeometryConfig {
            channels: 4,
            dies_per_channel: 4,
            planes_per_die: 1,
            blocks_per_plane: if quick { 48 } else { 128 },
            pages_per_block: 64,
            page_size: 4096,
        };
        let mut c = base(g, slc_timing());
        c.ftl.op_ratio = 0.1;
        c.workload.rw = Rw::Randwrite;
        c.workload.iodepth = 64;
        c.workload.precondition = Precondition::None;
        let span_pages = (c.logical_pages() as f64 * fill) as u64;
        c.workload.span = Some(Size::Bytes(span_pages * 4096));
        c.workload.ios = span_pages * 3;
        c.workload.sample_every = (c.workload.ios / 150).max(1);
        let r = go(&c, log, &format!("write-cliff: fill {:.0} %", fill * 100.0))?;
        let mut pts = Vec::new();
        for s in &r.time_series {
            pts.push((s.t_s, s.mb_s));
            rows.push(vec![
                f(fill * 100.0, 0),
                f(s.t_s, 4),
                s.host_ios.to_string(),
                f(s.mb_s, 1),
                f(s.waf, 3),
            ]);
        }
        series.push(Series {
            name: format!("{:.0} % of logical space in use", fill * 100.0),
            points: pts,
            dashed: false,
        });
    }
    Ok(ExperimentResult {
        name: "write-cliff".into(),
        title: "Continuous 4 KiB random writes on a fresh drive (OP 10 %)".into(),
        x_label: "simulated seconds".into(),
        y_label: "MB/s".into(),
        columns: ["fill_pct", "t_s", "host_ios", "mb_s", "interval_waf"]
            .map(String::from)
            .to_vec(),
        rows,
        series,
    })
}

/// The suspension experiment's policies: (label, suspension, budget, read priority).
pub const SUSPENSION_POLICIES: [(&str, Suspension, SuspendBudget, bool); 5] = [
    ("none", Suspension::None, SuspendBudget::Count, false),
    (
        "count",
        Suspension::ProgramErase,
        SuspendBudget::Count,
        false,
    ),
    (
        "count+rp",
        Suspension::ProgramErase,
        SuspendBudget::Count,
        true,
    ),
    ("time", Suspension::ProgramErase, SuspendBudget::Time, false),
    (
        "time+rp",
        Suspension::ProgramErase,
        SuspendBudget::Time,
        true,
    ),
];

/// The device of the suspension experiment: the `tlc` preset's timing (tR 67 us, tPROG
/// 2.3 ms, tBERS 10 ms, 16 KiB pages, 192-page blocks) on 2 channels x 2 dies x 2 planes x
/// 64 blocks, 10 % OP, steady state; a database-like random mix of 16 KiB (one page) I/Os at
/// queue depth 1 per thread.
pub fn suspension_config(mix: u32, threads: u32, ios: u64) -> SimConfig {
    let tlc = crate::presets::preset("tlc").expect("the tlc preset parses");
    let g = GeometryConfig {
        channels: 2,
        dies_per_channel: 2,
        blocks_per_plane: 64,
        ..tlc.geometry
    };
    let mut c = base(g, tlc.timing);
    c.ftl.op_ratio = 0.1;
    c.workload.rw = Rw::Randrw;
    c.workload.rwmixread = mix;
    c.workload.bs = Size::Bytes(16384);
    c.workload.iodepth = 1;
    c.workload.numjobs = threads;
    c.workload.precondition = Precondition::Steady;
    c.workload.ios = ios;
    c
}

fn suspension(quick: bool, log: &mut dyn FnMut(&str)) -> Result<ExperimentResult, SimError> {
    // Database-like mixes as in the Starblaze talk: 2 readers : 1 writer and 5 : 4,
    // 1 and 2 threads, queue depth 1.
    let cases = [
        ("2rr1rw_1thread", 67u32, 1u32),
        ("5rr4rw_1thread", 56, 1),
        ("2rr1rw_2thread", 67, 2),
        ("5rr4rw_2thread", 56, 2),
    ];
    let mut rows = Vec::new();
    let mut s_max: Vec<Vec<(f64, f64)>> = vec![Vec::new(); SUSPENSION_POLICIES.len()];
    for (i, &(name, mix, threads)) in cases.iter().enumerate() {
        for (k, &(label, mode, budget, rp)) in SUSPENSION_POLICIES.iter().enumerate() {
            let mut c = suspension_config(mix, threads, if quick { 5_000 } else { 60_000 });
            c.ftl.suspension = mode;
            c.ftl.suspend_budget = budget;
            c.ftl.read_priority = rp;
            let r = go(&c, log, &format!("suspension: {name} {label}"))?;
            let (l, w) = (r.read_latency_us, r.write_latency_us);
            s_max[k].push(((i + 1) as f64, l.max / 1000.0));
            rows.push(vec![
                name.to_string(),
                label.to_string(),
                f(r.read_iops, 0),
                f(l.mean, 1),
                f(l.p99, 1),
                f(l.p999, 1),
                f(l.max, 1),
                f(r.write_iops, 0),
                f(w.mean, 1),
                f(w.p99, 1),
                f(w.max, 1),
                (r.suspensions.program + r.suspensions.erase).to_string(),
            ]);
        }
    }
    Ok(ExperimentResult {
        name: "suspension".into(),
        title: "Max read latency of database-like mixes (1-4 = 2rr1rw/5rr4rw x 1/2 threads, TLC)"
            .into(),
        x_label: "test case".into(),
        y_label: "max read latency, ms".into(),
        columns: [
            "test",
            "policy",
            "read_iops",
            "read_mean_us",
            "read_p99_us",
            "read_p999_us",
            "read_max_us",
            "write_iops",
            "write_mean_us",
            "write_p99_us",
            "write_max_us",
            "suspends",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        series: SUSPENSION_POLICIES
            .iter()
            .zip(s_max)
            .map(|(p, points)| Series {
                name: format!("max read, {}", p.0),
                points,
                dashed: false,
            })
            .collect(),
    })
}
