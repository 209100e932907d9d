//! `flashpool bench`: in-process 4 KiB random-write and random-read IOPS of the engine on
//! memory drives, beside a plain memcpy loop over the same data (the ratio's baseline: what
//! moving 4 KiB costs on this machine right now, so noisy neighbours cancel out).

use anyhow::Result;
use clap::Args;
use flashpool_engine::drive::{DriveRef, MemDrive};
use flashpool_engine::{Pool, PoolConfig};
use std::sync::Arc;
use std::time::Instant;

#[path = "bench_waf.rs"]
pub(crate) mod bench_waf;

/// Arguments of `flashpool bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Protection schemes to run, as K+M.
    #[arg(long, default_values = ["4+1", "8+2"], value_parser = crate::size::parse_ec)]
    pub ec: Vec<(usize, usize)>,
    /// Thread counts to run (1 to 1024).
    #[arg(long, default_values_t = [1usize, 2], value_parser = parse_threads)]
    pub threads: Vec<usize>,
    /// Working set (volume bytes touched; at least 4K).
    #[arg(long, default_value = "256M", value_parser = parse_working_set)]
    pub working_set: u64,
    /// 4 KiB writes per run (at least 1).
    #[arg(long, default_value_t = 1 << 18, value_parser = clap::value_parser!(u64).range(1..))]
    pub writes: u64,
    /// 4 KiB reads per run (at least 1).
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub reads: u64,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Compression of the benchmark volume (the written data is compressible).
    #[arg(long, default_value = "off")]
    pub compression: flashpool_engine::Compression,
    /// Instead of IOPS: fill a pool of this data capacity (at least 1M), write a checkpoint
    /// interval's worth of random writes after its last checkpoint, crash it, and time the
    /// reopen.
    #[arg(long, value_parser = parse_recovery)]
    pub recovery: Option<u64>,
    /// With --recovery: file drives in this directory (default: memory drives).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
    /// Instead of IOPS: steady-state write amplification vs spare space (bench_waf.rs).
    #[arg(long)]
    pub waf: bool,
    /// With --waf: the pool measured (small segments, or the defaults `serve` uses).
    #[arg(long, value_enum, default_value = "small", requires = "waf")]
    pub waf_geometry: bench_waf::WafGeometry,
}

/// Most threads a run takes: far more than cores only measures the scheduler, and each is a
/// real thread.
const MAX_THREADS: usize = 1024;

fn parse_threads(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(n),
        _ => Err(format!("expected 1 to {MAX_THREADS} threads")),
    }
}

fn parse_working_set(s: &str) -> Result<u64, String> {
    match crate::size::parse_size(s) {
        Ok(n) if n >= 4096 => Ok(n),
        Ok(_) => Err("the working set must be at least one 4 KiB block (4K)".into()),
        Err(e) => Err(format!("{e:#}")),
    }
}

fn parse_recovery(s: &str) -> Result<u64, String> {
    match crate::size::parse_size(s) {
        Ok(n) if n >= 1 << 20 => Ok(n),
        Ok(_) => Err("the pool's capacity must be at least 1M".into()),
        Err(e) => Err(format!("{e:#}")),
    }
}

/// Times recovery of a full pool whose log holds a whole checkpoint interval past the last
/// checkpoint (the worst case the interval allows).
fn recovery(capacity: u64, dir: Option<&std::path::Path>) -> Result<()> {
    use flashpool_engine::drive::FileDrive;
    let (k, m) = (4usize, 1usize);
    let cfg = PoolConfig {
        k,
        m,
        ..PoolConfig::default()
    };
    // No cleaner yet: the drives hold the fill and the post-checkpoint overwrites.
    let drive_size = (capacity + cfg.checkpoint_interval) / k as u64 * 13 / 10 + (256 << 20);
    if dir.is_none() {
        crate::memory::check_fits(
            k + m,
            drive_size,
            "memory",
            "use a smaller --recovery, or file drives (--dir)",
        )?;
    }
    let make = |i: usize| -> Result<DriveRef> {
        Ok(match dir {
            Some(d) => Arc::new(FileDrive::create(
                &d.join(format!("recovery-{i}.img")),
                drive_size,
            )?) as DriveRef,
            None => Arc::new(MemDrive::new(drive_size, format!("mem:{i}"))) as DriveRef,
        })
    };
    let drives = (0..k + m).map(make).collect::<Result<Vec<_>>>()?;
    let pool = Pool::create(drives.clone(), &cfg)?;
    pool.create_volume("v", capacity)?;
    let vol = pool.volume("v")?;
    let chunk = vec![0x5Au8; 1 << 20];
    let t = Instant::now();
    for off in (0..capacity).step_by(chunk.len()) {
        vol.write(
            off,
            &chunk[..(capacity - off).min(chunk.len() as u64) as usize],
        )?;
    }
    pool.checkpoint()?;
    let blocks = capacity / 4096;
    // Log bytes count parity and headers too (x1.29 at 4+1): stay just under one interval.
    let tail = cfg.checkpoint_interval / 4096 * 3 / 4;
    let mut rng = Rng(42);
    for _ in 0..tail {
        vol.write((rng.next() % blocks) * 4096, &chunk[..4096])?;
    }
    pool.flush()?;
    let filled = t.elapsed();
    drop(vol);
    drop(pool); // a crash: no close, no final checkpoint
    let t = Instant::now();
    let pool = Pool::open(drives)?;
    let open = t.elapsed();
    let s = pool.stats();
    println!(
        "recovery of a {} MiB pool ({k}+{m}, {} MiB of log past the checkpoint): open took {:.2} s (fill took {:.1} s); read {} MiB while opening",
        capacity >> 20,
        (tail * 4096) >> 20,
        open.as_secs_f64(),
        filled.as_secs_f64(),
        s.media_read_bytes >> 20
    );
    Ok(())
}

/// xorshift64: the benchmarks' and experiments' deterministic source of offsets and data.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Runs `ops` operations split over `threads` (all of them: the first `ops % threads` threads
/// take one more), returns operations per second.
fn timed(threads: usize, ops: u64, f: impl Fn(usize, u64) + Sync) -> f64 {
    let start = Instant::now();
    let (each, extra) = (ops / threads as u64, ops % threads as u64);
    std::thread::scope(|s| {
        for t in 0..threads {
            let f = &f;
            s.spawn(move || f(t, each + u64::from((t as u64) < extra)));
        }
    });
    ops as f64 / start.elapsed().as_secs_f64()
}

fn memcpy_iops(threads: usize, ops: u64, blocks: u64) -> f64 {
    let src = vec![7u8; (blocks * 4096) as usize];
    timed(threads, ops, |t, n| {
        let mut rng = Rng(0x9E37_79B9 + t as u64);
        let mut dst = vec![0u8; 4096];
        for _ in 0..n {
            let b = (rng.next() % blocks) as usize * 4096;
            dst.copy_from_slice(&src[b..b + 4096]);
            std::hint::black_box(&dst);
        }
    })
}

/// Runs `flashpool bench`.
pub fn run(a: BenchArgs) -> Result<()> {
    if a.waf {
        return bench_waf::run(a.json, a.waf_geometry);
    }
    if let Some(cap) = a.recovery {
        return recovery(cap, a.dir.as_deref());
    }
    let blocks = a.working_set / 4096;
    // One run's drives at a time (each pool is closed before the next): the largest decides.
    let drive_size =
        |k: usize| (a.writes.saturating_mul(4096 * 2) / k as u64).max(a.working_set) + (256 << 20);
    let largest =
        a.ec.iter()
            .map(|&(k, m)| (k + m, drive_size(k)))
            .max_by_key(|&(n, size)| size.saturating_mul(n as u64));
    if let Some((n, size)) = largest {
        crate::memory::check_fits(
            n,
            size,
            "memory",
            "use a smaller --working-set or fewer --writes",
        )?;
    }
    if !a.json {
        println!(
            "{:<6} {:>7} {:>12} {:>12} {:>12} {:>9} {:>9} {:>6}",
            "ec",
            "threads",
            "write IOPS",
            "read IOPS",
            "memcpy IOPS",
            "w/memcpy",
            "r/memcpy",
            "WAF"
        );
    }
    for &(k, m) in &a.ec {
        for &threads in &a.threads {
            let n = k + m;
            let drive_size = drive_size(k);
            let drives: Vec<DriveRef> = (0..n)
                .map(|i| {
                    let d = MemDrive::new(drive_size, format!("mem:{i}"));
                    d.prefault();
                    Arc::new(d) as DriveRef
                })
                .collect();
            let pool = Pool::create(
                drives,
                &PoolConfig {
                    k,
                    m,
                    ..PoolConfig::default()
                },
            )?;
            // Compression off: the targets are about the parity path; `--compression` measures
            // the cost of packing and unpacking on top.
            pool.create_volume_with("bench", a.working_set, a.compression)?;
            let vol = pool.volume("bench")?;
            let base = memcpy_iops(threads, a.reads, blocks);
            let data: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 251) as u8).collect();
            // Fill the working set sequentially so reads hit mapped blocks.
            for b in 0..blocks {
                vol.write(b * 4096, &data)?;
            }
            pool.flush()?;
            let before = pool.stats();
            let w = timed(threads, a.writes, |t, ops| {
                let mut rng = Rng(0x1234_5678 + t as u64);
                for _ in 0..ops {
                    vol.write((rng.next() % blocks) * 4096, &data)
                        .expect("write");
                }
            });
            pool.flush()?;
            let after = pool.stats();
            let r = timed(threads, a.reads, |t, ops| {
                let mut rng = Rng(0xDEAD_BEEF + t as u64);
                let mut buf = vec![0u8; 4096];
                for _ in 0..ops {
                    vol.read((rng.next() % blocks) * 4096, &mut buf)
                        .expect("read");
                }
            });
            let host = after.host_write_bytes - before.host_write_bytes;
            let media = after.media_write_bytes() - before.media_write_bytes();
            let waf = media as f64 / host as f64;
            let pre = after.write_preread_bytes;
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({"k": k, "m": m, "threads": threads, "write_iops": w, "read_iops": r,
                        "memcpy_iops": base, "write_vs_memcpy": w / base, "read_vs_memcpy": r / base,
                        "write_amplification": waf, "write_preread_bytes": pre})
                );
            } else {
                println!(
                    "{:<6} {:>7} {:>12.0} {:>12.0} {:>12.0} {:>9.3} {:>9.3} {:>6.3}",
                    format!("{k}+{m}"),
                    threads,
                    w,
                    r,
                    base,
                    w / base,
                    r / base,
                    waf
                );
            }
            pool.close()?;
        }
    }
    Ok(())
}
