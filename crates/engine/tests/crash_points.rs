//! Crash-point test: record every drive write and flush of a workload in one ordered log,
//! then for every cut point (each write boundary, and each write torn after a few 512-byte
//! sectors) rebuild the drive images as a power cut there would leave them, reopen the pool
//! and check the durability guarantee: what was flushed reads back intact, and every other
//! block reads as either its old or one of its newer contents, never a mix or garbage.

mod common;

use common::*;
use flashpool_engine::drive::{Drive, DriveLog, DriveOp, DriveRef, MemDrive, RecordingDrive};
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

fn image_at(
    base: &[Arc<MemDrive>],
    log: &[DriveOp],
    cut: usize,
    torn_sectors: Option<usize>,
) -> Vec<DriveRef> {
    let drives: Vec<Arc<MemDrive>> = base
        .iter()
        .map(|d| Arc::new(d.crash(|_, _| unreachable!())))
        .collect();
    for op in &log[..cut] {
        if let DriveOp::Write {
            drive,
            offset,
            data,
        } = op
        {
            drives[*drive].write_at(*offset, data).unwrap();
        }
    }
    if let (
        Some(n),
        Some(DriveOp::Write {
            drive,
            offset,
            data,
        }),
    ) = (torn_sectors, log.get(cut))
    {
        // Sectors past the tear keep their old contents: write whole 4 KiB blocks made of the
        // new prefix and the old suffix.
        let keep = (n * 512).min(data.len());
        let mut cur = vec![0u8; data.len()];
        drives[*drive].read_at(*offset, &mut cur).unwrap();
        cur[..keep].copy_from_slice(&data[..keep]);
        drives[*drive].write_at(*offset, &cur).unwrap();
    }
    as_refs(&drives)
}

fn run(k: usize, m: usize, default_seed: u64) {
    let seed = test_seed(&format!("crash-point test {k}+{m}"), default_seed);
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    // Set-up, not recorded: a pool with one volume, closed cleanly.
    let base = mem_drives(5, false);
    let pool = Pool::create(as_refs(&base), &small_config(k, m)).unwrap();
    pool.create_volume("v", BLOCKS * 4096).unwrap();
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
    for i in 0..160u64 {
        let start = log.len();
        let r = rng.random_range(0..100);
        let effect: Option<Vec<(u64, Vec<u8>)>> = if r < 8 {
            pool.flush().unwrap();
            None
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
    drop(pool);
    let log = log.ops();

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
