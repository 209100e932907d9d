//! Measured-run statistics and the [`Report`]: latency HDR histograms per operation, I/O
//! and byte counts, FTL counters, erase-count distribution, and the time series. The JSON
//! field names are a stable interface (host_pages_written, waf, iops, read_latency_us, ...).

use crate::ftl::FtlCounters;
use hdrhistogram::Histogram;
use serde::Serialize;

/// Latency summary in microseconds. `min`, `mean` and `max` are exact; the percentiles come
/// from the histogram (3 significant digits) and are clamped into `[min, max]`, so rounding
/// never puts a percentile outside the observed range.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub min: f64,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

/// Largest latency the histograms resolve (about 73 simulated minutes); larger values are
/// clamped in the percentiles (mean and max stay exact).
pub const MAX_LATENCY_NS: u64 = 1 << 42;

/// Per-operation latency recorder (ns, 3 significant digits; mean and max are exact).
#[derive(Debug, Clone)]
pub struct LatencyRecorder {
    hist: Histogram<u64>,
    sum_ns: u128,
    min_ns: u64,
    max_ns: u64,
}

impl Default for LatencyRecorder {
    fn default() -> Self {
        LatencyRecorder {
            hist: Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("valid histogram bounds"),
            sum_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
        }
    }
}

impl LatencyRecorder {
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.hist.saturating_record(ns.clamp(1, MAX_LATENCY_NS));
        self.sum_ns += ns as u128;
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// The latency distribution as (latency us, fraction of I/Os at or below it) at 101
    /// quantiles, denser in the tail (0, 0.01, ..., 0.9, then toward 1), clamped into the
    /// recorded [min, max]; empty when nothing was recorded.
    pub fn cdf(&self) -> Vec<(f64, f64)> {
        if self.hist.is_empty() {
            return Vec::new();
        }
        let mut qs: Vec<f64> = (0..=90).map(|i| i as f64 / 100.0).collect();
        qs.extend((1..=10).map(|k| 1.0 - 0.1 / 10f64.powf(k as f64 * 0.4)));
        qs.push(1.0);
        qs.iter()
            .map(|&q| {
                let v = self
                    .hist
                    .value_at_quantile(q)
                    .clamp(self.min_ns, self.max_ns);
                (v as f64 / 1000.0, q)
            })
            .collect()
    }

    pub fn summary(&self) -> LatencySummary {
        let n = self.hist.len();
        if n == 0 {
            return LatencySummary::default();
        }
        let us = |v: u64| v as f64 / 1000.0;
        // The histogram reports the highest value equivalent to a bucket, which can lie
        // above the largest (or below the smallest) latency actually recorded.
        let q = |x: f64| {
            us(self
                .hist
                .value_at_quantile(x)
                .clamp(self.min_ns, self.max_ns))
        };
        LatencySummary {
            count: n,
            min: us(self.min_ns),
            mean: self.sum_ns as f64 / n as f64 / 1000.0,
            p50: q(0.50),
            p99: q(0.99),
            p999: q(0.999),
            max: us(self.max_ns),
        }
    }
}

/// One time-series point (interval values since the previous point).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct SamplePoint {
    pub t_s: f64,
    pub host_ios: u64,
    pub iops: f64,
    pub mb_s: f64,
    pub waf: f64,
    /// Free blocks per plane at the sample: mean and minimum over planes.
    pub free_blocks_mean: f64,
    pub free_blocks_min: u32,
    /// GC backlog: blocks missing to the foreground threshold, summed over planes.
    pub gc_backlog_blocks: u64,
    /// GC page moves per host page written over the interval.
    pub gc_moves_per_host_page: f64,
}

/// Which regime garbage collection ran in during the measured run (from the time series).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GcRegime {
    /// `ftl.gc_threshold_blocks`.
    pub threshold_blocks: u32,
    /// Mean over the samples of the mean free blocks per plane.
    pub free_blocks_mean: f64,
    /// Lowest free block count of any plane at any sample.
    pub free_blocks_min: u32,
    /// Mean GC backlog (blocks below the threshold, summed over planes).
    pub gc_backlog_mean: f64,
    /// "idle" (no GC), "threshold" (GC holds the free pool near `gc_threshold_blocks`, mean
    /// at least half of it: the greedy model at that threshold applies) or "floor" (GC falls
    /// behind and the free pool sits below half the threshold, toward the one-block reserve:
    /// the threshold no longer sets the write amplification).
    pub regime: String,
}

impl GcRegime {
    /// Summarises `series`; `moved` = GC pages moved in the run.
    pub fn from_series(series: &[SamplePoint], threshold: u32, moved: u64) -> GcRegime {
        let n = series.len().max(1) as f64;
        let free_blocks_mean = series.iter().map(|p| p.free_blocks_mean).sum::<f64>() / n;
        let gc_backlog_mean = series
            .iter()
            .map(|p| p.gc_backlog_blocks as f64)
            .sum::<f64>()
            / n;
        let regime = if moved == 0 || series.is_empty() {
            "idle"
        } else if free_blocks_mean < threshold as f64 / 2.0 {
            "floor"
        } else {
            "threshold"
        };
        GcRegime {
            threshold_blocks: threshold,
            free_blocks_mean,
            free_blocks_min: series.iter().map(|p| p.free_blocks_min).min().unwrap_or(0),
            gc_backlog_mean,
            regime: regime.into(),
        }
    }
}

/// Erase-count distribution over good blocks.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EraseDistribution {
    pub min: u32,
    pub max: u32,
    pub mean: f64,
    /// [lower bound of the bucket, blocks], up to 16 equal-width buckets.
    pub histogram: Vec<[u64; 2]>,
}

impl EraseDistribution {
    pub fn from_counts(counts: &[u32]) -> EraseDistribution {
        if counts.is_empty() {
            return EraseDistribution {
                min: 0,
                max: 0,
                mean: 0.0,
                histogram: vec![],
            };
        }
        let min = *counts.iter().min().unwrap_or(&0);
        let max = *counts.iter().max().unwrap_or(&0);
        let mean = counts.iter().map(|&c| c as f64).sum::<f64>() / counts.len() as f64;
        let width = ((max - min) as u64 / 16 + 1).max(1);
        let buckets = ((max - min) as u64 / width + 1) as usize;
        let mut h = vec![0u64; buckets];
        for &c in counts {
            h[((c - min) as u64 / width) as usize] += 1;
        }
        EraseDistribution {
            min,
            max,
            mean,
            histogram: h
                .iter()
                .enumerate()
                .map(|(i, &n)| [min as u64 + i as u64 * width, n])
                .collect(),
        }
    }
}

/// Suspension counters.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct SuspendCounters {
    pub program: u64,
    pub erase: u64,
}

/// Flash operations and the pages they carried (pages / ops = planes per operation).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct PlaneOps {
    pub read_ops: u64,
    pub read_pages: u64,
    pub program_ops: u64,
    pub program_pages: u64,
    pub gc_copy_ops: u64,
    pub gc_copy_pages: u64,
}

/// Device facts.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeviceInfo {
    pub channels: u32,
    pub dies: u32,
    pub planes: u32,
    pub physical_pages: u64,
    pub logical_pages: u64,
    pub page_size: u32,
    pub op_ratio: f64,
    pub factory_bad_blocks: u32,
    pub bad_blocks: u32,
    /// Simulator state size (mapping, block tables, queues), bytes.
    pub memory_bytes: u64,
    pub memory_bytes_per_page: f64,
}

/// Preconditioning summary.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PreconditionInfo {
    pub mode: String,
    pub host_pages_written: u64,
    pub rounds: u32,
    pub steady: bool,
    /// Write amplification of the last round (steady mode).
    pub waf_last_round: f64,
}

/// The result of a run. Counters and latencies cover the measured run only.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    pub name: String,
    pub seed: u64,
    pub sim_seconds: f64,
    pub host_ios: u64,
    pub read_ios: u64,
    pub write_ios: u64,
    pub trim_ios: u64,
    pub iops: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub mb_s: f64,
    pub read_mb_s: f64,
    pub write_mb_s: f64,
    pub host_pages_read: u64,
    pub host_pages_written: u64,
    pub flash_pages_programmed: u64,
    pub gc_pages_moved: u64,
    pub wl_pages_moved: u64,
    pub blocks_erased: u64,
    pub gc_victims: u64,
    pub waf: f64,
    pub read_latency_us: LatencySummary,
    pub write_latency_us: LatencySummary,
    pub trim_latency_us: LatencySummary,
    pub suspensions: SuspendCounters,
    /// Host reads, host programs and GC copies on the flash, by operations and pages.
    pub flash_ops: PlaneOps,
    pub grown_bad_blocks: u64,
    pub erase_count: EraseDistribution,
    pub device: DeviceInfo,
    pub precondition: PreconditionInfo,
    pub time_series: Vec<SamplePoint>,
    /// The GC regime of the measured run.
    pub gc: GcRegime,
    /// Read and write latency CDFs (see [`LatencyRecorder::cdf`]); for plots, not in the
    /// JSON.
    #[serde(skip)]
    pub latency_cdf: [Vec<(f64, f64)>; 2],
    /// Why the run stopped early (device worn out, stalled), or null.
    pub failed: Option<String>,
}

/// Write amplification = flash pages programmed / host pages written (0 when nothing written).
pub fn waf(c: &FtlCounters) -> f64 {
    if c.host_pages_written == 0 {
        0.0
    } else {
        c.flash_pages_programmed as f64 / c.host_pages_written as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_summary() {
        let mut r = LatencyRecorder::default();
        for v in [1000, 2000, 3000] {
            r.record(v);
        }
        let s = r.summary();
        assert_eq!(s.count, 3);
        assert!((s.mean - 2.0).abs() < 1e-9);
        assert!((s.max - 3.0).abs() < 0.01);
        assert!((s.p50 - 2.0).abs() < 0.01, "{s:?}");
        r.record(5_000_000);
        assert!((r.summary().p999 - 5000.0).abs() < 5.0);
    }

    #[test]
    fn percentiles_stay_within_min_and_max() {
        // Constant latencies that the histogram rounds up (3 significant digits).
        for v in [1_234_567u64, 67_001, 2_300_123, 999_999_999] {
            let mut r = LatencyRecorder::default();
            for _ in 0..100 {
                r.record(v);
            }
            let s = r.summary();
            assert_eq!(s.min, s.max, "{v}");
            for p in [s.p50, s.p99, s.p999] {
                assert_eq!(p, s.max, "{v}: {s:?}");
            }
        }
        // Random sets, seeded: every percentile inside [min, max], in order.
        let seed = 0x5eed;
        let mut rng = crate::rng::SimRng::new(seed, 1);
        for round in 0..200 {
            let mut r = LatencyRecorder::default();
            for _ in 0..1 + rng.below(50) {
                r.record(1 + rng.below(1 << 40));
            }
            let s = r.summary();
            let ok = s.min <= s.p50 && s.p50 <= s.p99 && s.p99 <= s.p999 && s.p999 <= s.max;
            assert!(ok, "seed {seed} round {round}: {s:?}");
        }
    }

    fn point(free_mean: f64, free_min: u32) -> SamplePoint {
        SamplePoint {
            t_s: 0.0,
            host_ios: 0,
            iops: 0.0,
            mb_s: 0.0,
            waf: 0.0,
            free_blocks_mean: free_mean,
            free_blocks_min: free_min,
            gc_backlog_blocks: 0,
            gc_moves_per_host_page: 0.0,
        }
    }

    #[test]
    fn gc_regime_from_free_blocks() {
        let held = [point(7.2, 6), point(6.8, 6)];
        let r = GcRegime::from_series(&held, 8, 100);
        assert_eq!((r.regime.as_str(), r.free_blocks_min), ("threshold", 6));
        assert!((r.free_blocks_mean - 7.0).abs() < 1e-9);
        let drained = [point(1.2, 0), point(0.8, 0)];
        assert_eq!(GcRegime::from_series(&drained, 8, 100).regime, "floor");
        assert_eq!(GcRegime::from_series(&drained, 8, 0).regime, "idle");
    }

    #[test]
    fn erase_distribution() {
        let d = EraseDistribution::from_counts(&[0, 1, 1, 5]);
        assert_eq!((d.min, d.max), (0, 5));
        assert_eq!(d.histogram.iter().map(|h| h[1]).sum::<u64>(), 4);
    }
}
