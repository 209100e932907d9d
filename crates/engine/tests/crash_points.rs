//! Crash-point test: record every drive write and flush of a workload in one ordered log,
//! then for every cut point (each write boundary, and each write torn after a few 512-byte
//! sectors) rebuild the drive images as a power cut there would leave them, reopen the pool
//! and check the durability guarantee: what was flushed reads back intact, and every other
//! block reads as either its old or one of its newer contents, never a mix or garbage.

mod common;

use common::*;
use flashpool_engine::drive::{DriveLog, DriveOp, DriveRef, MemDrive, RecordingDrive};
use flashpool_engine::Pool;
use rand::{RngExt, SeedableRng};
use std::sync::Arc;

const BLOCKS: u64 = 96;

/// One host operation and the log positions it spans.
struct HostOp {
    start: usize,
    end: usize,
    /// Block contents it left (lba, contents), or None for a flush.
    effect: Option<Vec<(u64, Vec<u8>)>>,
}

/// The workload's mix.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mix {
    /// Writes, trims and flushes on a roomy pool.
    Host,
    /// The same on a pool of a few small segments, with explicit cleaner runs and checkpoints
    /// between: segments are cleaned, freed by log records and by checkpoints, discarded and
    /// written again, and every cut falls somewhere in that.
    Cleaning,
}

fn run(k: usize, m: usize, default_seed: u64) {
    run_mix(k, m, default_seed, Mix::Host)
}

fn run_mix(k: usize, m: usize, default_seed: u64, mix: Mix) {
    let what = if mix == Mix::Cleaning {
        " with cleaning"
    } else {
        ""
    };
    let seed = test_seed(&format!("crash-point test {k}+{m}{what}"), default_seed);
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    // Set-up, not recorded: a pool with one volume, closed cleanly.
    let (base, cfg) = match mix {
        Mix::Host => (mem_drives(5, false), small_config(k, m)),
        Mix::Cleaning => {
            let drives = (0..5)
                .map(|i| Arc::new(MemDrive::new(4 << 20, format!("mem:{i}"))))
                .collect();
            let cfg = flashpool_engine::PoolConfig {
                k,
                m,
                chunk_size: 16 << 10,
                segment_size: 192 << 10,
                checkpoint_interval: 1 << 20,
            };
            (drives, cfg)
        }
    };
    let pool = Pool::create(as_refs(&base), &cfg).unwrap();
    pool.create_volume_with("v", BLOCKS * 4096, flashpool_engine::Compression::Off)
        .unwrap();
    pool.close().unwrap();

    let log = DriveLog::new();
    let copies: Vec<Arc<MemDrive>> = base
        .iter()
        .map(|d| Arc::new(d.crash(|_, _| unreachable!())))
        .collect();
    let recorded: Vec<DriveRef> = copies
        .iter()
        .enumerate()
        .map(|(i, d)| RecordingDrive::new(d.clone() as DriveRef, i, log.clone()) as DriveRef)
        .collect();
    let pool = Pool::open(recorded).unwrap();
    let vol = pool.volume("v").unwrap();
    let mut ops: Vec<HostOp> = Vec::new();
    let ops_count = if mix == Mix::Cleaning { 600 } else { 160 };
    for i in 0..ops_count {
        let start = log.len();
        let r = rng.random_range(0..100);
        let effect: Option<Vec<(u64, Vec<u8>)>> = if r < 8 {
            pool.flush().unwrap();
            None
        } else if mix == Mix::Cleaning && r < 11 {
            pool.gc(usize::MAX).unwrap();
            Some(Vec::new())
        } else if mix == Mix::Cleaning && r < 12 {
            pool.checkpoint().unwrap();
            Some(Vec::new())
        } else if r < 14 {
            let lba = rng.random_range(0..BLOCKS - 4);
            let n = rng.random_range(1..4);
            vol.trim(lba * 4096, n * 4096).unwrap();
            Some((lba..lba + n).map(|l| (l, vec![0u8; 4096])).collect())
        } else {
            let lba = rng.random_range(0..BLOCKS - 3);
            let n = rng.random_range(1..=3u64);
            let data: Vec<u8> = (0..n).flat_map(|j| block_for(i << 8 | j)).collect();
            vol.write(lba * 4096, &data).unwrap();
            Some((0..n).map(|j| (lba + j, block_for(i << 8 | j))).collect())
        };
        ops.push(HostOp {
            start,
            end: log.len(),
            effect,
        });
    }
    pool.flush().unwrap();
    ops.push(HostOp {
        start: log.len(),
        end: log.len(),
        effect: None,
    });
    let stats = pool.stats();
    drop(pool);
    let log = log.ops();
    if mix == Mix::Cleaning {
        eprintln!(
            "{} segments cleaned, {} freed by log records ({} written since the checkpoint), {} by checkpoints",
            stats.gc_segments_cleaned,
            stats.segments_freed_by_log,
            stats.segments_freed_by_relog,
            stats.segments_freed_at_checkpoint
        );
        assert!(
            stats.segments_freed_by_log > stats.segments_freed_by_relog
                && stats.segments_freed_by_relog > 0,
            "seed {seed}: the workload frees segments the checkpoint covers and segments written since"
        );
    }

    let mut cuts: Vec<(usize, Option<usize>)> = (0..=log.len()).map(|c| (c, None)).collect();
    for (i, op) in log.iter().enumerate() {
        if let DriveOp::Write { data, .. } = op {
            cuts.push((i, Some(rng.random_range(1..data.len() / 512))));
        }
    }
    let mut checked = 0;
    for (cut, torn) in cuts {
        // The newest flush that completed before the cut defines what must be intact.
        let last_flush = ops.iter().rposition(|o| o.effect.is_none() && o.end <= cut);
        let mut durable = vec![vec![0u8; 4096]; BLOCKS as usize];
        let mut candidates: Vec<Vec<Vec<u8>>> = vec![Vec::new(); BLOCKS as usize];
        for (j, o) in ops.iter().enumerate() {
            let Some(e) = &o.effect else { continue };
            let before_flush = last_flush.is_some_and(|f| j < f);
            for (l, d) in e {
                if before_flush {
                    durable[*l as usize] = d.clone();
                } else if o.start <= cut {
                    candidates[*l as usize].push(d.clone());
                }
            }
        }
        let pool = Pool::open(image_at(&base, &log, cut, torn))
            .unwrap_or_else(|e| panic!("seed {seed}: cut {cut} torn {torn:?}: reopen failed: {e}"));
        let vol = pool.volume("v").unwrap();
        let mut b = vec![0u8; 4096];
        for lba in 0..BLOCKS as usize {
            vol.read(lba as u64 * 4096, &mut b).unwrap_or_else(|e| {
                panic!("seed {seed}: cut {cut} torn {torn:?}: block {lba}: {e}")
            });
            assert!(
                b == durable[lba] || candidates[lba].contains(&b),
                "seed {seed}: cut {cut} torn {torn:?}: block {lba} is neither its flushed nor a later contents"
            );
        }
        checked += 1;
    }
    eprintln!(
        "{k}+{m}: {checked} crash points checked over {} drive operations",
        log.len()
    );
}

#[test]
fn crash_points_m0() {
    run(4, 0, 1);
}

#[test]
fn crash_points_m1() {
    run(4, 1, 2);
}

#[test]
fn crash_points_m2() {
    run(3, 2, 3);
}

#[test]
fn crash_points_cleaning_m1() {
    run_mix(4, 1, 4, Mix::Cleaning);
}

#[test]
fn crash_points_cleaning_m2() {
    run_mix(3, 2, 5, Mix::Cleaning);
}
