//! `flashpool sim experiment pool-vs-raid5`: the seeds' claim, tested end to end. The same host
//! workload (uniform random 4 KiB writes, then a 70/30 read/write mix) runs on five identical
//! simulated SSDs (`sim_drive.rs`) arranged four ways:
//!
//! - **pool**: a flashpool pool, 4+1 (append-only whole stripes, whole segments freed and
//!   discarded; its own cleaner inline, as the `serve` cleaner would run it);
//! - **pool-raw**: the same pool on the same flash with the devices' spare exported as
//!   capacity (their FTL at the least over-provisioning it runs with): a pool that frees and
//!   discards whole segments never needs a device's spare;
//! - **raid5**: an in-place RAID5 with read-modify-write, md's left-symmetric layout with
//!   64 KiB chunks: every 4 KiB host write reads the old data and the old parity and writes
//!   both (2 reads + 2 writes);
//! - **raid0**: the drives with no protection (64 KiB chunks striped over all five), the
//!   baseline.
//!
//! The volume is the same size in all four (a fraction of what RAID5 exposes), so the drives
//! hold the same data. For each: NAND pages programmed per host page written (end-to-end write
//! amplification) with its two factors (what the arrangement wrote to the drives per host page,
//! and the drives' own), drive reads per host write, erases per drive, host latency and IOPS,
//! in three phases after a fill and a warm-up: random writes offered at a low and at a high
//! rate (open loop: arrivals do not wait for completions), then a 70/30 read/write mix at
//! queue depth 32 (closed loop: what the arrangement sustains).
//!
//! Time is virtual ([`VirtualClock`]): each drive charges the NAND work of every operation to
//! its dies and channels ([`flashpool_sim::drive_timing`]), a host request is done when the
//! last drive operation it caused is, and a RAID5 write issues its two writes when its two
//! reads are done. A pool write that only fills the pool's open stripe in memory is done at
//! once; the one that completes a stripe waits for the stripe's chunks to be programmed, as
//! the engine's writer does. The pool's cleaner runs inline between requests, and its drive
//! work delays the host's like any other. Deterministic, and much faster than real time.

use crate::sim_drive::{SimClock, SimDrive, VirtualClock};
use anyhow::Result;
use flashpool_engine::aligned::AlignedBuf;
use flashpool_engine::drive::{Drive, DriveRef, MediaCounters};
use flashpool_engine::{Compression, Pool, PoolConfig};
use flashpool_sim::experiments::{ExperimentResult, Series};
use flashpool_sim::stats::{LatencyRecorder, LatencySummary};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

const DRIVES: usize = 5;
const CHUNK: u64 = 64 << 10;
const PAGE: u64 = 4096;

/// Sizes of one run.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    /// Logical bytes of each drive.
    drive: u64,
    /// Volume sizes of random writes before the window, and in it.
    warmup: f64,
    window: f64,
}

impl Size {
    pub fn new(quick: bool) -> Size {
        if quick {
            Size {
                drive: 128 << 20,
                warmup: 2.0,
                window: 1.0,
            }
        } else {
            Size {
                drive: 512 << 20,
                warmup: 3.0,
                window: 2.0,
            }
        }
    }
    /// The host volume at `fill` of what RAID5 exposes (4 drives' worth).
    fn volume(&self, fill: f64) -> u64 {
        ((self.drive * (DRIVES as u64 - 1)) as f64 * fill) as u64 / PAGE * PAGE
    }
}

/// One arrangement's host interface.
trait Array {
    fn write(&mut self, lba: u64, buf: &[u8]) -> Result<()>;
    fn read(&mut self, lba: u64, buf: &mut [u8]) -> Result<()>;
    /// Called every few hundred writes (the pool cleans here).
    fn tick(&mut self) -> Result<()> {
        Ok(())
    }
    /// Logs what the arrangement itself saw.
    fn report(&self, _log: &mut dyn FnMut(&str)) {}
}

struct PoolArray {
    pool: Pool,
    vol: flashpool_engine::Volume,
}

impl Array for PoolArray {
    fn write(&mut self, lba: u64, buf: &[u8]) -> Result<()> {
        Ok(self.vol.write(lba * PAGE, buf)?)
    }
    fn read(&mut self, lba: u64, buf: &mut [u8]) -> Result<()> {
        Ok(self.vol.read(lba * PAGE, buf)?)
    }
    fn report(&self, log: &mut dyn FnMut(&str)) {
        let s = self.pool.stats();
        let i = self.pool.info();
        log(&format!(
            "pool: WA {:.3} (GC {:.3}, parity {:.3}, metadata {:.3}), {} checkpoints, {} segments freed by log and {} by checkpoints, {} free of {}, {} MiB live",
            s.write_amplification(),
            s.gc_relocated_bytes as f64 / s.host_write_bytes as f64,
            s.media_parity_bytes as f64 / s.host_write_bytes as f64,
            s.media_metadata_bytes as f64 / s.host_write_bytes as f64,
            s.checkpoints,
            s.segments_freed_by_log,
            s.segments_freed_at_checkpoint,
            i.free_segments,
            i.segment_count,
            i.live_bytes >> 20
        ));
    }
    fn tick(&mut self) -> Result<()> {
        // Cleaning inline (deterministic), to one segment above the free-segment count at
        // which `serve`'s background cleaner starts, in `bench --waf`'s one-segment rounds.
        crate::bench::bench_waf::clean_until(&self.pool, self.pool.gc_high_water() + 1)
    }
}

/// md's RAID5, left-symmetric: parity of stripe s on drive n-1 - s % n, data chunks after it.
struct Raid5 {
    drives: Vec<DriveRef>,
    scratch: AlignedBuf,
    clock: Arc<VirtualClock>,
}

impl Raid5 {
    fn place(&self, lba: u64) -> (usize, usize, u64) {
        let n = self.drives.len() as u64;
        let per_chunk = CHUNK / PAGE;
        let chunk = lba / per_chunk;
        let stripe = chunk / (n - 1);
        let parity = (n - 1) - stripe % n;
        let data = (parity + 1 + chunk % (n - 1)) % n;
        let off = stripe * CHUNK + (lba % per_chunk) * PAGE;
        (data as usize, parity as usize, off)
    }
}

impl Array for Raid5 {
    fn write(&mut self, lba: u64, buf: &[u8]) -> Result<()> {
        let (d, p, off) = self.place(lba);
        // Read-modify-write: old data and old parity in, new data and new parity out.
        self.drives[d].read_at(off, &mut self.scratch)?;
        let mut parity = AlignedBuf::zeroed(PAGE as usize);
        self.drives[p].read_at(off, &mut parity)?;
        for i in 0..PAGE as usize {
            parity[i] ^= self.scratch[i] ^ buf[i];
        }
        // The writes go out when both reads are in.
        self.clock.issue_at(self.clock.horizon());
        self.drives[d].write_at(off, buf)?;
        self.drives[p].write_at(off, &parity)?;
        Ok(())
    }
    fn read(&mut self, lba: u64, buf: &mut [u8]) -> Result<()> {
        let (d, _, off) = self.place(lba);
        Ok(self.drives[d].read_at(off, buf)?)
    }
}

struct Raid0 {
    drives: Vec<DriveRef>,
}

impl Raid0 {
    fn place(&self, lba: u64) -> (usize, u64) {
        let n = self.drives.len() as u64;
        let per_chunk = CHUNK / PAGE;
        let chunk = lba / per_chunk;
        (
            (chunk % n) as usize,
            (chunk / n) * CHUNK + (lba % per_chunk) * PAGE,
        )
    }
}

impl Array for Raid0 {
    fn write(&mut self, lba: u64, buf: &[u8]) -> Result<()> {
        let (d, off) = self.place(lba);
        Ok(self.drives[d].write_at(off, buf)?)
    }
    fn read(&mut self, lba: u64, buf: &mut [u8]) -> Result<()> {
        let (d, off) = self.place(lba);
        Ok(self.drives[d].read_at(off, buf)?)
    }
}

/// What one arrangement did over the window.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Outcome {
    pub arrangement: String,
    /// Host volume / what RAID5 exposes.
    pub fill: f64,
    pub phase: String,
    pub host_writes: u64,
    pub host_reads: u64,
    /// Pages the arrangement wrote to the drives per host page written.
    pub array_waf: f64,
    /// The drives' own: NAND pages programmed per page they were given.
    pub device_waf: f64,
    /// NAND pages programmed per host page written: array_waf x device_waf.
    pub end_to_end_waf: f64,
    /// Drive page reads per host write, less the host's own reads.
    pub drive_reads_per_host_write: f64,
    pub erases_per_drive: Vec<u64>,
    pub discarded_bytes: u64,
    /// Host requests offered per second (open loop), or None (closed loop, queue depth 32).
    pub offered_iops: Option<f64>,
    /// Host requests completed per second of virtual time.
    pub iops: f64,
    /// Host request latency, microseconds.
    pub write_latency: LatencySummary,
    pub read_latency: LatencySummary,
}

use crate::bench::Rng as Xorshift;

fn counters(drives: &[Arc<SimDrive>]) -> Vec<MediaCounters> {
    drives
        .iter()
        .map(|d| d.media_counters().expect("simulated drives count"))
        .collect()
}

fn delta(a: &[MediaCounters], b: &[MediaCounters]) -> (MediaCounters, Vec<u64>) {
    let mut sum = MediaCounters::default();
    let mut erases = Vec::new();
    for (x, y) in a.iter().zip(b) {
        let d = MediaCounters {
            written_bytes: y.written_bytes - x.written_bytes,
            programmed_bytes: y.programmed_bytes - x.programmed_bytes,
            moved_bytes: y.moved_bytes - x.moved_bytes,
            erases: y.erases - x.erases,
            discarded_bytes: y.discarded_bytes - x.discarded_bytes,
            read_bytes: y.read_bytes - x.read_bytes,
            ..*y
        };
        erases.push(d.erases);
        sum.add(&d);
    }
    (sum, erases)
}

/// Runs one arrangement through both phases at `fill`; returns the two window outcomes.
fn run_one(
    name: &str,
    size: Size,
    fill: f64,
    seed: u64,
    log: &mut dyn FnMut(&str),
) -> Result<Vec<Outcome>> {
    let preset = flashpool_sim::presets::preset("small")?;
    let cfg = if name == "pool-raw" {
        // The same flash with the device's spare exported (the least over-provisioning its
        // FTL runs with): a pool that frees whole segments and discards them has no use for
        // a device's spare, so it takes it as capacity.
        let mut c = SimDrive::scaled(&preset, size.drive);
        let blocks = c.geometry.blocks_per_plane as f64;
        c.ftl.op_ratio = (7.0 / blocks).max(0.005);
        c
    } else {
        SimDrive::scaled(&preset, size.drive)
    };
    let clock = VirtualClock::new();
    let sims: Vec<Arc<SimDrive>> = (0..DRIVES)
        .map(|i| {
            SimDrive::with_clock(&cfg, format!("sim:{i}"), SimClock::Virtual(clock.clone()))
                .map(Arc::new)
        })
        .collect::<Result<_>>()?;
    let refs: Vec<DriveRef> = sims.iter().map(|d| d.clone() as DriveRef).collect();
    let blocks = size.volume(fill) / PAGE;
    let mut array: Box<dyn Array> = match name {
        "pool" | "pool-raw" => {
            let pool = Pool::create(
                refs,
                &PoolConfig {
                    k: DRIVES - 1,
                    m: 1,
                    chunk_size: 64 << 10,
                    segment_size: 1 << 20,
                    checkpoint_interval: 1 << 30,
                },
            )?;
            pool.create_volume_with("v", blocks * PAGE, Compression::Off)?;
            let vol = pool.volume("v")?;
            let i = pool.info();
            log(&format!(
                "pool: {} segments, volume {} MiB of {} MiB capacity",
                i.segment_count,
                (blocks * PAGE) >> 20,
                i.capacity_bytes >> 20
            ));
            Box::new(PoolArray { pool, vol })
        }
        "raid5" => Box::new(Raid5 {
            drives: refs,
            scratch: AlignedBuf::zeroed(PAGE as usize),
            clock: clock.clone(),
        }),
        _ => Box::new(Raid0 { drives: refs }),
    };
    let mut rng = Xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut host = Host {
        array: array.as_mut(),
        clock: &clock,
        buf: AlignedBuf::zeroed(PAGE as usize),
        rbuf: AlignedBuf::zeroed(PAGE as usize),
        t: 0,
        ops: 0,
    };
    // Fill sequentially, then warm up with random writes, as fast as the drives take them.
    let mut lba = 0;
    host.phase(blocks, Load::Closed(QD), &mut rng, &mut |_| {
        lba += 1;
        Req::Write(lba - 1)
    })?;
    let warm = (size.warmup * blocks as f64) as u64;
    host.phase(warm, Load::Closed(QD), &mut rng, &mut |r| {
        Req::Write(r.next() % blocks)
    })?;
    // The device's raw program rate, in 4 KiB pages per second over all drives.
    let raw =
        sims[0].peak_program_pages_per_s() * DRIVES as f64 * sims[0].page() as f64 / PAGE as f64;
    let window = (size.window * blocks as f64) as u64;
    let mut outs = Vec::new();
    for (phase, load, n) in [
        ("randwrite-low", Load::Open(LOW_RATE * raw), window / 2),
        ("randwrite-high", Load::Open(HIGH_RATE * raw), window / 2),
        ("mix70/30", Load::Closed(QD), blocks),
    ] {
        let before = counters(&sims);
        let mix = phase == "mix70/30";
        let r = host.phase(n, load, &mut rng, &mut |r| {
            let lba = r.next() % blocks;
            if mix && r.next() % 10 < 7 {
                Req::Read(lba)
            } else {
                Req::Write(lba)
            }
        })?;
        let (d, erases) = delta(&before, &counters(&sims));
        let host_bytes = (r.writes * PAGE) as f64;
        let o = Outcome {
            arrangement: name.into(),
            fill,
            phase: phase.into(),
            host_writes: r.writes,
            host_reads: r.reads,
            array_waf: d.written_bytes as f64 / host_bytes,
            device_waf: d.device_waf(),
            end_to_end_waf: d.programmed_bytes as f64 / host_bytes,
            drive_reads_per_host_write: (d.read_bytes as f64 - (r.reads * PAGE) as f64).max(0.0)
                / host_bytes,
            erases_per_drive: erases,
            discarded_bytes: d.discarded_bytes,
            offered_iops: match load {
                Load::Open(rate) => Some(rate),
                Load::Closed(_) => None,
            },
            iops: r.iops,
            write_latency: r.write.summary(),
            read_latency: r.read.summary(),
        };
        log(&format!(
            "{name} at {:.0} %, {phase}: end to end {:.3} = {:.3} x {:.3}; {:.0} IOPS; writes p99 {:.0} us, reads p99 {:.0} us",
            fill * 100.0,
            o.end_to_end_waf,
            o.array_waf,
            o.device_waf,
            o.iops,
            o.write_latency.p99,
            o.read_latency.p99
        ));
        outs.push(o);
    }
    host.array.report(log);
    Ok(outs)
}

/// Queue depth of the closed-loop phases.
const QD: usize = 32;
/// The open-loop write rates, as shares of the drives' raw program rate in 4 KiB pages.
const LOW_RATE: f64 = 0.05;
const HIGH_RATE: f64 = 0.25;

/// How requests arrive.
#[derive(Clone, Copy, Debug)]
enum Load {
    /// Queue depth n: a request arrives when one of the n in flight completes.
    Closed(usize),
    /// At this many per second, evenly spaced, whatever is still in flight.
    Open(f64),
}

enum Req {
    Write(u64),
    Read(u64),
}

/// One phase's requests, latencies and rate.
struct PhaseResult {
    writes: u64,
    reads: u64,
    iops: f64,
    write: LatencyRecorder,
    read: LatencyRecorder,
}

/// The host side of a run: issues requests to an arrangement in virtual time.
struct Host<'a> {
    array: &'a mut dyn Array,
    clock: &'a VirtualClock,
    buf: AlignedBuf,
    rbuf: AlignedBuf,
    /// Virtual time at which the next phase starts (the last completion so far).
    t: u64,
    ops: u64,
}

impl Host<'_> {
    fn phase(
        &mut self,
        n: u64,
        load: Load,
        rng: &mut Xorshift,
        next: &mut dyn FnMut(&mut Xorshift) -> Req,
    ) -> Result<PhaseResult> {
        let start = self.t;
        let mut r = PhaseResult {
            writes: 0,
            reads: 0,
            iops: 0.0,
            write: LatencyRecorder::default(),
            read: LatencyRecorder::default(),
        };
        let mut in_flight: BinaryHeap<Reverse<u64>> = match load {
            Load::Closed(qd) => (0..qd).map(|_| Reverse(start)).collect(),
            Load::Open(_) => BinaryHeap::new(),
        };
        let mut end = start;
        for i in 0..n {
            let at = match load {
                Load::Closed(_) => in_flight.pop().expect("queue depth above 0").0,
                Load::Open(rate) => start + (i as f64 * 1e9 / rate) as u64,
            };
            self.ops += 1;
            if self.ops.is_multiple_of(256) {
                // The pool's cleaner, between requests; its drive work occupies the dies.
                self.clock.arrive(at);
                self.array.tick()?;
            }
            self.clock.arrive(at);
            let write = match next(rng) {
                Req::Write(lba) => {
                    for c in self.buf.chunks_mut(8) {
                        c.copy_from_slice(&rng.next().to_le_bytes());
                    }
                    self.array.write(lba, &self.buf)?;
                    true
                }
                Req::Read(lba) => {
                    self.array.read(lba, &mut self.rbuf)?;
                    false
                }
            };
            let done = self.clock.horizon().max(at);
            if write {
                r.writes += 1;
                r.write.record(done - at);
            } else {
                r.reads += 1;
                r.read.record(done - at);
            }
            end = end.max(done);
            if let Load::Closed(_) = load {
                in_flight.push(Reverse(done));
            }
        }
        r.iops = n as f64 / ((end - start).max(1) as f64 / 1e9);
        self.t = end;
        Ok(r)
    }
}

/// Host volume sizes tried, as fractions of what RAID5 exposes.
const FILLS: [f64; 3] = [0.5, 0.65, 0.8];

/// What the experiment produced: the table with the write-amplification plot, the latency
/// plot, and every outcome for JSON.
pub struct Results {
    pub waf: ExperimentResult,
    pub latency: ExperimentResult,
    pub outcomes: Vec<Outcome>,
}

/// Runs the experiment.
pub fn run(quick: bool, log: &mut dyn FnMut(&str)) -> Result<Results> {
    let size = Size::new(quick);
    let mut rows = Vec::new();
    let mut series = Vec::new();
    let mut lat_series = Vec::new();
    let mut all = Vec::new();
    for name in ["pool", "pool-raw", "raid5", "raid0"] {
        let mut points = Vec::new();
        let mut array_points = Vec::new();
        let mut p99 = Vec::new();
        for fill in FILLS {
            let outs = match run_one(name, size, fill, 42, log) {
                Ok(o) => o,
                Err(e) => {
                    log(&format!("{name} at {:.0} %: {e:#}", fill * 100.0));
                    rows.push(vec![
                        name.to_string(),
                        format!("{fill}"),
                        "failed".into(),
                        format!("{e:#}").replace(',', ";"),
                    ]);
                    continue;
                }
            };
            for o in &outs {
                let erases: u64 = o.erases_per_drive.iter().sum();
                let lat = |l: &LatencySummary| {
                    if l.count == 0 {
                        "-".to_string()
                    } else {
                        format!("{:.0}/{:.0}/{:.0}", l.mean, l.p99, l.p999)
                    }
                };
                rows.push(vec![
                    o.arrangement.clone(),
                    format!("{}", o.fill),
                    o.phase.clone(),
                    format!("{:.3}", o.end_to_end_waf),
                    format!("{:.3}", o.array_waf),
                    format!("{:.3}", o.device_waf),
                    format!("{:.3}", o.drive_reads_per_host_write),
                    format!("{:.1}", erases as f64 / DRIVES as f64),
                    format!("{}", o.discarded_bytes >> 20),
                    o.offered_iops.map_or("qd32".into(), |r| format!("{r:.0}")),
                    format!("{:.0}", o.iops),
                    lat(&o.write_latency),
                    lat(&o.read_latency),
                ]);
            }
            let phase = |p: &str| {
                outs.iter()
                    .find(|o| o.phase == p)
                    .expect("every run has both write rates")
            };
            let high = phase("randwrite-high");
            points.push((fill * 100.0, high.end_to_end_waf));
            array_points.push((fill * 100.0, high.array_waf));
            // At the low rate every arrangement keeps up (at the high one an overloaded
            // arrangement's tail grows with the run, and would flatten the others' lines).
            p99.push((
                fill * 100.0,
                phase("randwrite-low").write_latency.p99 / 1000.0,
            ));
            all.extend(outs);
        }
        series.push(Series {
            name: format!("{name}: end to end"),
            points,
            dashed: false,
        });
        if name == "pool" || name == "raid5" {
            series.push(Series {
                name: format!("{name}: written to the drives"),
                points: array_points,
                dashed: true,
            });
        }
        lat_series.push(Series {
            name: name.into(),
            points: p99,
            dashed: false,
        });
    }
    let columns = [
        "arrangement",
        "fill",
        "phase",
        "end_to_end_waf",
        "array_waf",
        "device_waf",
        "drive_reads_per_host_write",
        "erases_per_drive",
        "discarded_mib",
        "offered_iops",
        "iops",
        "write_us_mean/p99/p99.9",
        "read_us_mean/p99/p99.9",
    ]
    .map(String::from)
    .to_vec();
    Ok(Results {
        waf: ExperimentResult {
            name: "pool-vs-raid5".into(),
            title: "NAND pages programmed per host page, 4 KiB random writes (high rate)".into(),
            x_label: "host volume, % of what RAID5 exposes".into(),
            y_label: "pages per host page".into(),
            columns: columns.clone(),
            rows: rows.clone(),
            series,
        },
        latency: ExperimentResult {
            name: "pool-vs-raid5-latency".into(),
            title: format!(
                "p99 host write latency, 4 KiB random writes at {:.0} % of the drives' raw program rate",
                LOW_RATE * 100.0
            ),
            x_label: "host volume, % of what RAID5 exposes".into(),
            y_label: "p99 write latency, ms".into(),
            columns,
            rows,
            series: lat_series,
        },
        outcomes: all,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The experiment at a small size, checked for sanity: RAID5 reads exactly two pages and
    /// writes two per host write, and each of its writes takes at least a read and then a
    /// program; the unprotected baseline's device write amplification is the greedy model's
    /// (Desnoyers' LRW, the simulator's own figure for uniform random writes,
    /// docs/SIMULATOR.md) at the share of its flash the live data takes, and it keeps up with
    /// the low rate; the pool's drives never copy a page (every block they erase holds only
    /// what the pool freed and discarded), most of its writes complete in its memory and the
    /// ones that seal a stripe wait for a program.
    #[test]
    fn arrangements_behave_as_their_layouts_say() {
        let size = Size {
            drive: 64 << 20,
            warmup: 1.5,
            window: 1.0,
        };
        let fill = 0.5;
        let cfg = SimDrive::scaled(
            &flashpool_sim::presets::preset("small").unwrap(),
            size.drive,
        );
        let t = flashpool_sim::timing::Timing::new(&cfg.timing, cfg.geometry.page_size);
        let us = |ns: u64| ns as f64 / 1000.0;
        let read_us = us(t.cmd_ns + t.read(0) + t.xfer_page_ns);
        let program_us = us(t.cmd_ns + t.xfer_page_ns + t.program(0));
        let mut log = |_: &str| {};
        let raid5 = run_one("raid5", size, fill, 7, &mut log).unwrap();
        let phases: Vec<&str> = raid5.iter().map(|o| o.phase.as_str()).collect();
        assert_eq!(phases, ["randwrite-low", "randwrite-high", "mix70/30"]);
        for o in &raid5[..2] {
            assert!((o.drive_reads_per_host_write - 2.0).abs() < 1e-9, "{o:?}");
            assert!((o.array_waf - 2.0).abs() < 1e-9, "{o:?}");
            assert!(
                o.write_latency.min >= read_us + program_us - 0.01,
                "a RAID5 write is a read, then a program: {o:?}"
            );
        }
        let raid0 = run_one("raid0", size, fill, 7, &mut log).unwrap();
        let low = &raid0[0];
        assert_eq!(low.array_waf, 1.0);
        assert!(low.write_latency.min >= program_us - 0.01, "{low:?}");
        let offered = low.offered_iops.unwrap();
        assert!(
            (low.iops / offered - 1.0).abs() < 0.05,
            "the baseline keeps up with the low rate: {low:?}"
        );
        let mix = &raid0[2];
        assert!(
            mix.host_reads > mix.host_writes && mix.offered_iops.is_none(),
            "{mix:?}"
        );
        assert!(mix.read_latency.min >= read_us - 0.01, "{mix:?}");
        // Each drive holds 4/5 of fill of its logical space; the flash has 1/(1 - op) more.
        let logical = cfg.logical_pages() as f64;
        let physical = cfg.physical_pages() as f64;
        let rho = fill * (DRIVES as f64 - 1.0) / DRIVES as f64 * logical / physical;
        let model = crate::bench::bench_waf::model_wa_gc(rho);
        let dev = raid0[1].device_waf;
        assert!(
            (dev / model - 1.0).abs() < 0.05,
            "baseline device WAF {dev} vs the greedy model's {model} at rho {rho}"
        );
        let pool = run_one("pool", size, fill, 7, &mut log).unwrap();
        for o in &pool[..2] {
            assert!(o.array_waf >= 1.25, "{o:?}");
            assert_eq!(o.device_waf, 1.0, "{o:?}");
            assert!(o.discarded_bytes > 0, "{o:?}");
        }
        let low = &pool[0].write_latency;
        assert!(
            low.p50 < 0.01,
            "most pool writes complete in memory: {low:?}"
        );
        assert!(
            low.max >= program_us,
            "a sealing write waits for a program: {low:?}"
        );
    }
}
