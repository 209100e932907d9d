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
//! and the drives' own), drive reads per host write, and erases per drive, over a window after
//! a warm-up. Untimed: the drives' FTLs run their placement and GC inline, so latency and IOPS
//! are not measured yet (see docs/SIMULATOR.md).

use crate::sim_drive::SimDrive;
use anyhow::Result;
use flashpool_engine::aligned::AlignedBuf;
use flashpool_engine::drive::{Drive, DriveRef, MediaCounters};
use flashpool_engine::{Compression, Pool, PoolConfig};
use flashpool_sim::experiments::{ExperimentResult, Series};
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
    let sims: Vec<Arc<SimDrive>> = (0..DRIVES)
        .map(|i| SimDrive::new(&cfg, format!("sim:{i}")).map(Arc::new))
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
        }),
        _ => Box::new(Raid0 { drives: refs }),
    };
    let mut rng = Xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut buf = AlignedBuf::zeroed(PAGE as usize);
    let mut rbuf = AlignedBuf::zeroed(PAGE as usize);
    let random_data = |b: &mut AlignedBuf, r: &mut Xorshift| {
        for c in b.chunks_mut(8) {
            c.copy_from_slice(&r.next().to_le_bytes());
        }
    };
    // Fill sequentially, then random writes: warm-up, then the window.
    for lba in 0..blocks {
        random_data(&mut buf, &mut rng);
        array.write(lba, &buf)?;
        if lba % 256 == 0 {
            array.tick()?;
        }
    }
    let warm = (size.warmup * blocks as f64) as u64;
    let window = (size.window * blocks as f64) as u64;
    let mut start = None;
    for i in 0..warm + window {
        if i == warm {
            start = Some(counters(&sims));
        }
        random_data(&mut buf, &mut rng);
        array.write(rng.next() % blocks, &buf)?;
        if i % 256 == 0 {
            array.tick()?;
        }
    }
    let start = start.unwrap_or_else(|| counters(&sims));
    let end = counters(&sims);
    let outcome = |phase: &str, writes: u64, reads: u64, (d, erases): (MediaCounters, Vec<u64>)| {
        let host = (writes * PAGE) as f64;
        Outcome {
            arrangement: name.into(),
            fill,
            phase: phase.into(),
            host_writes: writes,
            host_reads: reads,
            array_waf: d.written_bytes as f64 / host,
            device_waf: d.device_waf(),
            end_to_end_waf: d.programmed_bytes as f64 / host,
            drive_reads_per_host_write: (d.read_bytes as f64 - (reads * PAGE) as f64).max(0.0)
                / host,
            erases_per_drive: erases,
            discarded_bytes: d.discarded_bytes,
        }
    };
    let random = outcome("randwrite", window, 0, delta(&start, &end));
    array.report(log);
    log(&format!(
        "{name} at {:.0} %: random writes: end to end {:.3} = {:.3} x {:.3}",
        fill * 100.0,
        random.end_to_end_waf,
        random.array_waf,
        random.device_waf
    ));
    // 70/30 read/write mix, one volume size of I/Os.
    let before = counters(&sims);
    let (mut writes, mut reads) = (0u64, 0u64);
    for i in 0..blocks {
        let lba = rng.next() % blocks;
        if rng.next() % 10 < 7 {
            array.read(lba, &mut rbuf)?;
            reads += 1;
        } else {
            random_data(&mut buf, &mut rng);
            array.write(lba, &buf)?;
            writes += 1;
        }
        if i % 256 == 0 {
            array.tick()?;
        }
    }
    let mixed = outcome("mix70/30", writes, reads, delta(&before, &counters(&sims)));
    Ok(vec![random, mixed])
}

/// Host volume sizes tried, as fractions of what RAID5 exposes.
const FILLS: [f64; 3] = [0.5, 0.65, 0.8];

/// Runs the experiment; returns the table and plot data, and the outcomes for JSON.
pub fn run(quick: bool, log: &mut dyn FnMut(&str)) -> Result<(ExperimentResult, Vec<Outcome>)> {
    let size = Size::new(quick);
    let mut rows = Vec::new();
    let mut series = Vec::new();
    let mut all = Vec::new();
    for name in ["pool", "pool-raw", "raid5", "raid0"] {
        let mut points = Vec::new();
        let mut array_points = Vec::new();
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
                ]);
            }
            points.push((fill * 100.0, outs[0].end_to_end_waf));
            array_points.push((fill * 100.0, outs[0].array_waf));
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
    }
    Ok((
        ExperimentResult {
            name: "pool-vs-raid5".into(),
            title: "NAND pages programmed per host page, 4 KiB random writes".into(),
            x_label: "host volume, % of what RAID5 exposes".into(),
            y_label: "pages per host page".into(),
            columns: [
                "arrangement",
                "fill",
                "phase",
                "end_to_end_waf",
                "array_waf",
                "device_waf",
                "drive_reads_per_host_write",
                "erases_per_drive",
                "discarded_mib",
            ]
            .map(String::from)
            .to_vec(),
            rows,
            series,
        },
        all,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The experiment at a small size, checked for sanity: RAID5 reads exactly two pages and
    /// writes two per host write; the unprotected baseline's device write amplification is the
    /// greedy model's (Desnoyers' LRW, the simulator's own figure for uniform random writes,
    /// docs/SIMULATOR.md) at the share of its flash the live data takes; and the pool's drives
    /// never copy a page (every block they erase holds only what the pool freed and discarded).
    #[test]
    fn arrangements_behave_as_their_layouts_say() {
        let size = Size {
            drive: 64 << 20,
            warmup: 1.5,
            window: 0.5,
        };
        let fill = 0.5;
        let cfg = SimDrive::scaled(
            &flashpool_sim::presets::preset("small").unwrap(),
            size.drive,
        );
        let mut log = |_: &str| {};
        let raid5 = run_one("raid5", size, fill, 7, &mut log).unwrap();
        assert!(
            (raid5[0].drive_reads_per_host_write - 2.0).abs() < 1e-9,
            "{raid5:?}"
        );
        assert!((raid5[0].array_waf - 2.0).abs() < 1e-9, "{raid5:?}");
        let raid0 = run_one("raid0", size, fill, 7, &mut log).unwrap();
        assert_eq!(raid0[0].array_waf, 1.0);
        // Each drive holds 4/5 of fill of its logical space; the flash has 1/(1 - op) more.
        let logical = cfg.logical_pages() as f64;
        let physical = cfg.physical_pages() as f64;
        let rho = fill * (DRIVES as f64 - 1.0) / DRIVES as f64 * logical / physical;
        let model = crate::bench::bench_waf::model_wa_gc(rho);
        let dev = raid0[0].device_waf;
        assert!(
            (dev / model - 1.0).abs() < 0.05,
            "baseline device WAF {dev} vs the greedy model's {model} at rho {rho}"
        );
        let pool = run_one("pool", size, fill, 7, &mut log).unwrap();
        assert!(pool[0].array_waf >= 1.25, "{pool:?}");
        assert_eq!(pool[0].device_waf, 1.0, "{pool:?}");
        assert!(pool[0].discarded_bytes > 0, "{pool:?}");
    }
}
