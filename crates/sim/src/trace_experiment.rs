//! The `trace` experiment: replay one trace on two (or more) device configs and compare
//! their read and write latency CDFs side by side. By default the MSR Cambridge-format sample
//! shipped as a test fixture is replayed, scaled onto an SLC-timed and a TLC-timed device of
//! the same geometry; the CLI can pass any trace and configs.

use crate::config::{GeometryConfig, Precondition, SimConfig, TimingConfig};
use crate::experiments::{ExperimentResult, Series};
use crate::sim::{run_replay, Replay, SimError};
use crate::trace::{self, RangeMode, Trace, TraceFormat};

/// The MSR Cambridge-format sample (made for this project, see tests/fixtures/README.md).
pub const SAMPLE_MSR: &str = include_str!("../tests/fixtures/msr_hm_0_sample.csv");

/// The sample, parsed.
pub fn sample() -> Trace {
    TraceFormat::Msr
        .parse(SAMPLE_MSR)
        .expect("the embedded MSR sample parses")
}

/// Two devices of one geometry (4 channels x 2 dies x 2 planes x 64 blocks x 64 pages of
/// 4 KiB, 10 % OP, filled): SLC timing (the `slc` preset's) and TLC timing (the `tlc`
/// preset's tR / tPROG / tBERS with program/erase suspension).
pub fn default_devices() -> Vec<(String, SimConfig)> {
    let geometry = GeometryConfig {
        channels: 4,
        dies_per_channel: 2,
        planes_per_die: 2,
        blocks_per_plane: 64,
        pages_per_block: 64,
        page_size: 4096,
    };
    let mk = |timing: TimingConfig| {
        let mut c = SimConfig {
            geometry: geometry.clone(),
            timing,
            ..SimConfig::default()
        };
        c.ftl.op_ratio = 0.1;
        c.workload.precondition = Precondition::Fill;
        c
    };
    let slc = mk(TimingConfig {
        read_us: 25.0,
        program_us: 250.0,
        erase_us: 1500.0,
        channel_mt_s: 333,
        ..TimingConfig::default()
    });
    let mut tlc = mk(TimingConfig {
        read_us: 67.0,
        program_us: 2300.0,
        erase_us: 10000.0,
        ..TimingConfig::default()
    });
    tlc.ftl.suspension = crate::config::Suspension::ProgramErase;
    vec![("slc".into(), slc), ("tlc".into(), tlc)]
}

fn f(x: f64, d: usize) -> String {
    format!("{x:.d$}")
}

/// Replays `t` on every device (`range` decides about requests past a device's end) and
/// returns a row per device and a CDF series per device and operation.
pub fn run(
    t: &Trace,
    devices: &[(String, SimConfig)],
    range: RangeMode,
    log: &mut dyn FnMut(&str),
) -> Result<ExperimentResult, SimError> {
    let mut rows = Vec::new();
    let mut series = Vec::new();
    for (name, cfg) in devices {
        log(&format!(
            "trace: replaying {} requests on {name}",
            t.requests.len()
        ));
        let records = trace::resolve(t, cfg.geometry.page_size, cfg.logical_pages(), range)
            .map_err(|e| SimError::Trace(format!("{name}: {e}")))?;
        let replay = Replay {
            records,
            timed: t.timed,
        };
        let r = run_replay(cfg, replay, &mut |_, _| {})?;
        if let Some(e) = &r.failed {
            log(&format!("trace: {name}: device failed: {e}"));
        }
        let (rl, wl) = (r.read_latency_us, r.write_latency_us);
        rows.push(vec![
            name.clone(),
            r.host_ios.to_string(),
            f(r.iops, 0),
            f(rl.mean, 1),
            f(rl.p99, 1),
            f(rl.max, 1),
            f(wl.mean, 1),
            f(wl.p99, 1),
            f(wl.max, 1),
            f(r.waf, 3),
        ]);
        for (k, op) in ["read", "write"].iter().enumerate() {
            if !r.latency_cdf[k].is_empty() {
                series.push(Series {
                    name: format!("{name} {op}"),
                    points: r.latency_cdf[k].clone(),
                    dashed: k == 1,
                });
            }
        }
    }
    Ok(ExperimentResult {
        name: "trace".into(),
        title: "Trace replay: latency CDF per device (solid: reads, thin: writes)".into(),
        x_label: "latency, us".into(),
        y_label: "fraction of I/Os".into(),
        columns: [
            "device",
            "ios",
            "iops",
            "read_mean_us",
            "read_p99_us",
            "read_max_us",
            "write_mean_us",
            "write_p99_us",
            "write_max_us",
            "waf",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        series,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_on_default_devices() {
        let mut log = |_: &str| {};
        let r = run(&sample(), &default_devices(), RangeMode::Scale, &mut log).unwrap();
        assert_eq!(r.rows.len(), 2);
        assert_eq!(r.series.len(), 4);
        for s in &r.series {
            // A CDF: fractions and latencies both non-decreasing, ending at 1.
            assert!(s
                .points
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
            assert_eq!(s.points.last().unwrap().1, 1.0);
        }
        // TLC timing is slower than SLC timing on the same requests: mean write latency.
        let wmean = |row: &Vec<String>| row[6].parse::<f64>().unwrap();
        assert!(wmean(&r.rows[1]) > wmean(&r.rows[0]), "{:?}", r.rows);
        // The default range rule rejects the sample on these small devices.
        assert!(run(&sample(), &default_devices(), RangeMode::Error, &mut log).is_err());
    }
}
