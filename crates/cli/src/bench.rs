//! `flashpool bench`: in-process 4 KiB random-write and random-read IOPS of the engine on
//! memory drives, beside a plain memcpy loop over the same data (the ratio's baseline: what
//! moving 4 KiB costs on this machine right now, so noisy neighbours cancel out).

use anyhow::Result;
use clap::Args;
use flashpool_engine::drive::{DriveRef, MemDrive};
use flashpool_engine::{Pool, PoolConfig};
use std::sync::Arc;
use std::time::Instant;

/// Arguments of `flashpool bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Protection schemes to run, as K+M.
    #[arg(long, default_values = ["4+1", "8+2"], value_parser = crate::size::parse_ec)]
    pub ec: Vec<(usize, usize)>,
    /// Thread counts to run.
    #[arg(long, default_values_t = [1usize, 2])]
    pub threads: Vec<usize>,
    /// Working set (volume bytes touched).
    #[arg(long, default_value = "256M", value_parser = crate::size::parse_size)]
    pub working_set: u64,
    /// 4 KiB writes per run.
    #[arg(long, default_value_t = 1 << 18)]
    pub writes: u64,
    /// 4 KiB reads per run.
    #[arg(long, default_value_t = 1 << 20)]
    pub reads: u64,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Runs `ops` operations split over `threads`, returns operations per second.
fn timed(threads: usize, ops: u64, f: impl Fn(usize, u64) + Sync) -> f64 {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let f = &f;
            s.spawn(move || f(t, ops / threads as u64));
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
    let blocks = a.working_set / 4096;
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
            let drive_size = (a.writes * 4096 * 2 / k as u64).max(a.working_set) + (256 << 20);
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
            pool.create_volume("bench", a.working_set)?;
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
