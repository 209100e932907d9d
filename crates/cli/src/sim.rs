//! `flashpool sim`: the NAND SSD simulator's command line: `run` a config or preset, `replay`
//! a trace, run an `experiment` (CSV + SVG plot + table), `bench` the simulator's own speed,
//! list `presets`. All modelling lives in the `flashpool-sim` crate; this file only reads
//! files, prints and plots.

use anyhow::{Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use flashpool_sim::config::{Rw, SimConfig};
use flashpool_sim::experiments::{self, Experiment};
use flashpool_sim::{presets, report, trace, Prepared, Report};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// An argument error (exit 2).
fn usage(msg: impl Into<String>) -> anyhow::Error {
    crate::UsageError(msg.into()).into()
}

/// `--preset`: a built-in preset's name.
fn parse_preset(s: &str) -> Result<String, String> {
    presets::preset(s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

/// `sim bench --rw`: a workload pattern.
fn parse_rw(s: &str) -> Result<Rw, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| "expected read, write, randread, randwrite, randrw or rw".to_string())
}

/// `sim bench --op-ratio`: over-provisioning in (0, 0.95).
fn parse_op_ratio(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| "expected a number".to_string())?;
    if v > 0.0 && v < 0.95 {
        Ok(v)
    } else {
        Err("must be in (0, 0.95): (physical - logical) / physical".into())
    }
}

/// `sim experiment NAME`: a known experiment.
fn parse_experiment(s: &str) -> Result<String, String> {
    experiment_of(s).map(|_| s.to_string())
}

/// The simulator's experiment `name`, or None for `pool-vs-raid5` (pool and simulator
/// together, run here where both are known).
fn experiment_of(name: &str) -> Result<Option<Experiment>, String> {
    if name == "pool-vs-raid5" {
        return Ok(None);
    }
    Experiment::from_name(name)
        .map(Some)
        .map_err(|e| format!("{e}, pool-vs-raid5"))
}

/// Arguments of `flashpool sim`.
#[derive(Args)]
pub struct SimArgs {
    #[command(subcommand)]
    command: SimCommand,
}

#[derive(Subcommand)]
enum SimCommand {
    /// Simulate a config file or a preset and print the report.
    Run(RunArgs),
    /// Replay a trace (CSV, MSR Cambridge, blkparse text, fio iolog) on a config's device.
    Replay(ReplayArgs),
    /// Run a named experiment; writes NAME.csv and NAME.svg into --out.
    Experiment(ExperimentArgs),
    /// Measure the simulator's speed (simulated host I/Os per CPU-second, GC steady state).
    Bench(BenchArgs),
    /// List presets, or print one preset's TOML.
    Presets {
        /// Preset to print.
        name: Option<String>,
    },
}

#[derive(Args)]
struct DeviceArgs {
    /// Config TOML file.
    config: Option<PathBuf>,
    /// Use a built-in preset (see `flashpool sim presets`).
    #[arg(long, conflicts_with = "config", value_parser = parse_preset)]
    preset: Option<String>,
    /// Override workload.seed.
    #[arg(long)]
    seed: Option<u64>,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    device: DeviceArgs,
    /// Override workload.ios.
    #[arg(long)]
    ios: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum TraceFormat {
    /// Guess from the content (fio header, blkparse event, MSR record, else CSV).
    Auto,
    /// `timestamp_us,op,offset,length`.
    Csv,
    /// SNIA IOTTA MSR Cambridge CSV.
    Msr,
    /// blkparse default text output.
    Blkparse,
    /// fio iolog v2 or v3.
    Fio,
}

#[derive(Clone, Copy, ValueEnum)]
enum RangeArg {
    /// A request past the end of the logical space is an error.
    Error,
    /// Offsets wrap around the logical capacity.
    Wrap,
    /// A trace whose highest address is past the capacity has its offsets scaled down to
    /// fit (one that fits is replayed as it is).
    Scale,
}

impl RangeArg {
    fn mode(self) -> trace::RangeMode {
        match self {
            RangeArg::Error => trace::RangeMode::Error,
            RangeArg::Wrap => trace::RangeMode::Wrap,
            RangeArg::Scale => trace::RangeMode::Scale,
        }
    }
}

/// Reads and parses a trace file.
fn read_trace(path: &Path, format: TraceFormat) -> Result<trace::Trace> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let fmt = match format {
        TraceFormat::Auto => trace::detect(&text),
        TraceFormat::Csv => trace::TraceFormat::Csv,
        TraceFormat::Msr => trace::TraceFormat::Msr,
        TraceFormat::Blkparse => trace::TraceFormat::Blkparse,
        TraceFormat::Fio => trace::TraceFormat::Fio,
    };
    fmt.parse(&text)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("in {} (read as {})", path.display(), fmt.name()))
}

#[derive(Args)]
struct ReplayArgs {
    #[command(flatten)]
    device: DeviceArgs,
    /// Trace file.
    #[arg(long)]
    trace: PathBuf,
    /// Trace format.
    #[arg(long, value_enum, default_value = "auto")]
    format: TraceFormat,
    /// Requests past the end of the logical space: error, wrap or scale.
    #[arg(long, value_enum, default_value = "error")]
    range: RangeArg,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Not for replay (the trace sets the I/Os); taken only to say so.
    #[arg(long, hide = true)]
    ios: Option<String>,
}

#[derive(Args)]
struct ExperimentArgs {
    /// scaling, die-bandwidth, waf-vs-op, write-cliff, suspension, trace, or pool-vs-raid5
    /// (a pool, an in-place RAID5 and plain drives on the same simulated SSDs).
    #[arg(value_parser = parse_experiment)]
    name: String,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
    /// Smaller devices and fewer I/Os (for smoke tests).
    #[arg(long)]
    quick: bool,
    /// `trace` only: the trace to replay (default: the built-in MSR Cambridge-format sample).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// `trace` only: the trace's format.
    #[arg(long, value_enum, default_value = "auto")]
    format: TraceFormat,
    /// `trace` only: requests past a device's end (default: scale).
    #[arg(long, value_enum, default_value = "scale")]
    range: RangeArg,
    /// `trace` only: a device to compare, a preset name or a CONFIG.toml (give two or more;
    /// default: SLC and TLC timing on one small geometry).
    #[arg(long = "device")]
    devices: Vec<String>,
}

/// The trace experiment's input trace and devices from the command line.
fn trace_experiment(
    a: &ExperimentArgs,
    log: &mut dyn FnMut(&str),
) -> Result<experiments::ExperimentResult> {
    use flashpool_sim::trace_experiment as te;
    let t = match &a.trace {
        Some(p) => read_trace(p, a.format)?,
        None => te::sample(),
    };
    let devices = if a.devices.is_empty() {
        te::default_devices()
    } else {
        let mut v = Vec::new();
        for d in &a.devices {
            let cfg = if Path::new(d).is_file() {
                read_config_file(Path::new(d), true)?
            } else if presets::preset_text(d).is_some() {
                presets::preset(d)?
            } else {
                return Err(usage(format!(
                    "--device {d:?}: neither a preset ({}) nor a file",
                    presets::names()
                )));
            };
            v.push((d.clone(), cfg));
        }
        v
    };
    Ok(te::run(&t, &devices, a.range.mode(), log)?)
}

#[derive(Args)]
struct BenchArgs {
    /// Preset to benchmark.
    #[arg(long, default_value = "slc", value_parser = parse_preset)]
    preset: String,
    /// Measured host I/Os.
    #[arg(long, default_value_t = 2_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    ios: u64,
    /// Override ftl.op_ratio (sets the steady-state write amplification).
    #[arg(long, value_parser = parse_op_ratio)]
    op_ratio: Option<f64>,
    /// Override workload.rw (default: the preset's, randwrite for all presets): read, write,
    /// randread, randwrite, randrw or rw.
    #[arg(long, value_parser = parse_rw)]
    rw: Option<Rw>,
}

/// Runs `flashpool sim`.
pub fn run(args: SimArgs) -> Result<()> {
    match args.command {
        SimCommand::Run(a) => cmd_run(a),
        SimCommand::Replay(a) => cmd_replay(a),
        SimCommand::Experiment(a) => cmd_experiment(a),
        SimCommand::Bench(a) => cmd_bench(a),
        SimCommand::Presets { name } => cmd_presets(name),
    }
}

/// Loads the device of `d` for a generated job (`ios` overrides workload.ios) or, with
/// `replay`, for a trace replay (only the workload keys a replay uses are checked). A config
/// file's problems are errors (exit 1); a flag that makes a valid config invalid is an
/// argument error (exit 2).
fn load(d: &DeviceArgs, ios: Option<u64>, replay: bool) -> Result<SimConfig> {
    let mut cfg = match (&d.config, &d.preset) {
        (Some(path), None) => read_config_file(path, replay)?,
        (None, Some(name)) => presets::preset(name).map_err(|e| usage(e.to_string()))?,
        (None, None) => return Err(usage("give a CONFIG.toml or --preset NAME")),
        (Some(_), Some(_)) => return Err(usage("give either a CONFIG.toml or --preset, not both")),
    };
    if let Some(s) = d.seed {
        cfg.workload.seed = s;
    }
    if let Some(n) = ios {
        cfg.workload.ios = n;
        validate(&cfg, replay).map_err(|e| usage(format!("--ios {n}: {e}")))?;
    }
    Ok(cfg)
}

/// Checks `cfg` for a generated job, or with `replay` only what a trace replay uses.
fn validate(cfg: &SimConfig, replay: bool) -> Result<(), flashpool_sim::config::ConfigError> {
    if replay {
        cfg.validate_replay()
    } else {
        cfg.validate()
    }
}

/// Reads, parses and checks a config file (see [`validate`]); its problems are errors naming
/// the file (exit 1).
fn read_config_file(path: &Path, replay: bool) -> Result<SimConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let cfg = SimConfig::parse_toml(&text).with_context(|| format!("in {}", path.display()))?;
    validate(&cfg, replay).with_context(|| format!("in {}", path.display()))?;
    Ok(cfg)
}

/// A progress printer for terminals (no output when stderr is not a terminal).
fn progress_printer() -> impl FnMut(u64, u64) {
    let tty = std::io::stderr().is_terminal();
    let start = Instant::now();
    move |done, total| {
        if !tty || start.elapsed().as_millis() < 500 {
            return;
        }
        let pct = if total > 0 && total != u64::MAX {
            format!(" ({:.0} %)", done as f64 * 100.0 / total as f64)
        } else {
            String::new()
        };
        let mut e = std::io::stderr();
        let _ = write!(e, "\r  simulated {done} host I/Os{pct}   ");
        if done >= total {
            let _ = writeln!(e);
        }
    }
}

fn print_report(r: &Report, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(r)?);
    } else {
        print!("{}", report::human(r));
    }
    if let Some(f) = &r.failed {
        eprintln!("flashpool: warning: {f}");
    }
    Ok(())
}

fn cmd_run(a: RunArgs) -> Result<()> {
    let cfg = load(&a.device, a.ios, false)?;
    let mut p = progress_printer();
    let r = flashpool_sim::run_with_progress(&cfg, &mut p)?;
    print_report(&r, a.json)
}

fn cmd_replay(a: ReplayArgs) -> Result<()> {
    if let Some(n) = &a.ios {
        return Err(usage(format!(
            "--ios {n}: not for sim replay, which replays every request of the trace once"
        )));
    }
    let cfg = load(&a.device, None, true)?;
    let t = read_trace(&a.trace, a.format)?;
    let records = trace::resolve(
        &t,
        cfg.geometry.page_size,
        cfg.logical_pages(),
        a.range.mode(),
    )
    .map_err(anyhow::Error::msg)
    .with_context(|| format!("in {}", a.trace.display()))?;
    let mut p = progress_printer();
    let replay = flashpool_sim::Replay {
        records,
        timed: t.timed,
    };
    let r = flashpool_sim::run_replay(&cfg, replay, &mut p)?;
    print_report(&r, a.json)
}

fn cmd_presets(name: Option<String>) -> Result<()> {
    match name {
        Some(n) => {
            let text = presets::preset_text(&n)
                .ok_or_else(|| usage(parse_preset(&n).err().unwrap_or_default()))?;
            print!("{text}");
        }
        None => {
            for (n, _) in presets::PRESETS {
                let c = presets::preset(n)?;
                let g = &c.geometry;
                println!(
                    "{n:<6} {} ch x {} dies x {} planes, {} blocks/plane x {} pages x {} B, tR {} us, tPROG {} us, tBERS {} us",
                    g.channels,
                    g.dies_per_channel,
                    g.planes_per_die,
                    g.blocks_per_plane,
                    g.pages_per_block,
                    g.page_size,
                    c.timing.read_us,
                    c.timing.program_us,
                    c.timing.erase_us
                );
            }
        }
    }
    Ok(())
}

/// CPU seconds used by this process so far (user + system), from /proc when available.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn cmd_bench(a: BenchArgs) -> Result<()> {
    let mut cfg = presets::preset(&a.preset)?;
    cfg.workload.ios = a.ios;
    cfg.workload.precondition = flashpool_sim::config::Precondition::Steady;
    if let Some(op) = a.op_ratio {
        cfg.ftl.op_ratio = op;
    }
    if let Some(rw) = a.rw {
        cfg.workload.rw = rw;
    }
    // The preset is valid: what fails now comes from the flags.
    cfg.validate().map_err(|e| {
        usage(format!(
            "--preset {} with --ios {}{}: {e}",
            a.preset,
            a.ios,
            a.op_ratio
                .map_or_else(String::new, |op| format!(" --op-ratio {op}"))
        ))
    })?;
    let t0 = Instant::now();
    let prepared = Prepared::new(&cfg)?;
    let pre_s = t0.elapsed().as_secs_f64();
    let cpu0 = cpu_seconds();
    let t1 = Instant::now();
    let r = prepared.run(&mut |_, _| {});
    let wall = t1.elapsed().as_secs_f64();
    let cpu = match (cpu0, cpu_seconds()) {
        (Some(a), Some(b)) if b > a => b - a,
        _ => wall,
    };
    println!(
        "preset {}: {} pages, precondition {:.2} s wall ({} pages written, steady {})",
        a.preset,
        r.device.physical_pages,
        pre_s,
        r.precondition.host_pages_written,
        r.precondition.steady
    );
    println!(
        "measured run: {} host I/Os, WAF {:.2}, {} GC page moves, {} erases",
        r.host_ios, r.waf, r.gc_pages_moved, r.blocks_erased
    );
    println!(
        "speed: {:.2} M simulated host I/Os per CPU-second ({:.2} s CPU, {:.2} s wall; {:.2} M flash pages programmed per CPU-second)",
        r.host_ios as f64 / cpu / 1e6,
        cpu,
        wall,
        r.flash_pages_programmed as f64 / cpu / 1e6
    );
    println!(
        "memory: {} bytes of simulator state, {:.2} bytes per physical page",
        r.device.memory_bytes, r.device.memory_bytes_per_page
    );
    Ok(())
}

fn cmd_experiment(a: ExperimentArgs) -> Result<()> {
    let mut log = |msg: &str| {
        if std::io::stderr().is_terminal() {
            eprintln!("  {msg}");
        }
    };
    // Pool and simulator together (pool-vs-raid5) live here, where both are known.
    let exp = experiment_of(&a.name).map_err(usage)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut wrote = Vec::new();
    let res = match exp {
        None => {
            // Its every figure also goes to JSON.
            let r = crate::pool_vs_raid5::run(a.quick, &mut log)?;
            let json = a.out.join("pool-vs-raid5.json");
            std::fs::write(&json, serde_json::to_string_pretty(&r.outcomes)?)
                .with_context(|| format!("writing {}", json.display()))?;
            let svg = a.out.join(format!("{}.svg", r.latency.name));
            plot(&r.latency, &svg)?;
            wrote.extend([json, svg]);
            r.waf
        }
        Some(Experiment::Trace) => trace_experiment(&a, &mut log)?,
        Some(exp) => experiments::run(exp, a.quick, &mut log)?,
    };
    let csv = a.out.join(format!("{}.csv", a.name));
    std::fs::write(&csv, res.csv()).with_context(|| format!("writing {}", csv.display()))?;
    let svg = a.out.join(format!("{}.svg", a.name));
    plot(&res, &svg)?;
    wrote.extend([csv, svg]);
    print!("{}", res.table());
    let wrote: Vec<String> = wrote.iter().map(|p| p.display().to_string()).collect();
    println!("wrote {}", wrote.join(", "));
    Ok(())
}

fn plot(res: &experiments::ExperimentResult, path: &Path) -> Result<()> {
    use plotters::prelude::*;
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0f64);
    for s in &res.series {
        for &(x, y) in &s.points {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y1 = y1.max(y);
        }
    }
    if x0 > x1 {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let y1 = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    let e = |e: DrawingAreaErrorKind<_>| anyhow::anyhow!("plotting {}: {e:?}", path.display());
    root.fill(&WHITE).map_err(e)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&res.title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, 0f64..y1)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(res.x_label.as_str())
        .y_desc(res.y_label.as_str())
        .draw()
        .map_err(e)?;
    for (i, s) in res.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let style = if s.dashed {
            ShapeStyle::from(&color).stroke_width(1)
        } else {
            ShapeStyle::from(&color).stroke_width(2)
        };
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), style))
            .map_err(e)?
            .label(s.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        if s.points.len() <= 40 {
            chart
                .draw_series(
                    s.points
                        .iter()
                        .map(|&p| Circle::new(p, 3, ShapeStyle::from(&color).filled())),
                )
                .map_err(e)?;
        }
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}
