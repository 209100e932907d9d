//! Segment reuse without a checkpoint (issue 18): in a stamped log the cleaner frees segments
//! written since the latest checkpoint by flushing the moves out of them and logging again
//! what else they held (trims, volume changes), so the next host writes overwrite stripes a
//! recovery from that checkpoint would once have needed. These tests check that a crash
//! after such reuse loses nothing flushed: every block, trim, volume creation, resize,
//! compression change and deletion logged since the checkpoint survives, with drives that
//! zero discarded ranges and with drives that ignore discards (stale stripes stay readable).

mod common;

use common::*;
use flashpool_engine::drive::{CrashFate, Drive, DriveInfo, DriveRef, MemDrive};
use flashpool_engine::{Compression, Pool, PoolConfig};
use rand::{RngExt, SeedableRng};
use std::collections::HashMap;
use std::io;
use std::sync::Arc;

/// A memory drive that ignores discards, as a drive without TRIM or a file system without
/// hole punching does: what the freed segment held stays readable until overwritten.
struct KeepsDiscarded(Arc<MemDrive>);

impl Drive for KeepsDiscarded {
    fn info(&self) -> DriveInfo {
        self.0.info()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.0.write_at(offset, buf)
    }
    fn flush(&self) -> io::Result<()> {
        self.0.flush()
    }
    fn completes_inline(&self) -> bool {
        true
    }
}

fn refs(drives: &[Arc<MemDrive>], keep_discarded: bool) -> Vec<DriveRef> {
    drives
        .iter()
        .map(|d| {
            if keep_discarded {
                Arc::new(KeepsDiscarded(d.clone())) as DriveRef
            } else {
                d.clone() as DriveRef
            }
        })
        .collect()
}

/// What the volumes should hold: name -> (size in blocks, block contents where written).
type Model = HashMap<String, (u64, HashMap<u64, Vec<u8>>)>;

fn check(pool: &Pool, model: &Model, what: &str) {
    let mut names: Vec<String> = pool.volumes().into_iter().map(|v| v.name).collect();
    names.sort();
    let mut want: Vec<String> = model.keys().cloned().collect();
    want.sort();
    assert_eq!(names, want, "{what}: volumes");
    let mut b = vec![0u8; 4096];
    for (name, (blocks, data)) in model {
        let v = pool.volume(name).unwrap();
        assert_eq!(v.size(), blocks * 4096, "{what}: size of {name}");
        for lba in 0..*blocks {
            v.read(lba * 4096, &mut b).unwrap();
            let zero = vec![0u8; 4096];
            let expect = data.get(&lba).unwrap_or(&zero);
            assert!(&b == expect, "{what}: {name} block {lba}");
        }
    }
}

/// Overwrites and cleans a pool until every segment written since the checkpoint has been
/// emptied and reused at least once, with trims and volume changes in between; then a
/// crash (unflushed writes lost) and a reopen.
fn reuse_then_crash(seed: u64, keep_discarded: bool) {
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    let drives = mem_drives(5, true);
    let cfg = PoolConfig {
        checkpoint_interval: 64 << 30, // no checkpoint but the one taken by hand
        ..small_config(4, 1)
    };
    let pool = Pool::create(refs(&drives, keep_discarded), &cfg).unwrap();
    let blocks = 2048u64;
    pool.create_volume_with("v", blocks * 4096, Compression::Off)
        .unwrap();
    let mut model: Model = HashMap::new();
    model.insert("v".into(), (blocks, HashMap::new()));
    let v = pool.volume("v").unwrap();
    for lba in 0..blocks {
        let b = block_for(lba);
        v.write(lba * 4096, &b).unwrap();
        model.get_mut("v").unwrap().1.insert(lba, b);
    }
    pool.checkpoint().unwrap();
    let checkpoints = pool.stats().checkpoints;

    // Since the checkpoint: volume changes and trims, then churn that empties and reuses the
    // segments they were logged in.
    pool.create_volume_with("w", 64 * 4096, Compression::Lz4)
        .unwrap();
    pool.create_volume_with("gone", 16 * 4096, Compression::Off)
        .unwrap();
    model.insert("w".into(), (64, HashMap::new()));
    let w = pool.volume("w").unwrap();
    for lba in 0..64 {
        let b = block_for(1 << 40 | lba);
        w.write(lba * 4096, &b).unwrap();
        model.get_mut("w").unwrap().1.insert(lba, b);
    }
    pool.volume("gone")
        .unwrap()
        .write(0, &block_for(7))
        .unwrap();
    pool.delete_volume("gone").unwrap();
    pool.resize_volume("w", 48 * 4096).unwrap();
    {
        let m = model.get_mut("w").unwrap();
        m.0 = 48;
        m.1.retain(|&l, _| l < 48);
    }
    pool.set_volume_compression("w", Compression::Off).unwrap();
    v.trim(100 * 4096, 50 * 4096).unwrap();
    for lba in 100..150 {
        model.get_mut("v").unwrap().1.remove(&lba);
    }
    pool.flush().unwrap();

    let segments = pool.info().segment_count as u64;
    let mut round = 0u64;
    while pool.stats().segments_freed_by_relog < 3 * segments {
        round += 1;
        assert!(round < 200, "seed {seed}: segments are not being reused");
        for _ in 0..blocks / 2 {
            // Overwrites, mostly outside the trimmed range (a few rewrite it).
            let lba = rng.random_range(0..blocks);
            let b = block_for(round << 32 | lba);
            v.write(lba * 4096, &b).unwrap();
            model.get_mut("v").unwrap().1.insert(lba, b);
        }
        if round.is_multiple_of(3) {
            let lba = rng.random_range(0..blocks - 8);
            v.trim(lba * 4096, 8 * 4096).unwrap();
            for l in lba..lba + 8 {
                model.get_mut("v").unwrap().1.remove(&l);
            }
        }
        pool.gc(usize::MAX).unwrap();
    }
    let s = pool.stats();
    assert_eq!(
        s.checkpoints, checkpoints,
        "seed {seed}: segments written since the checkpoint were freed without one"
    );
    assert_eq!(s.segments_freed_at_checkpoint, 0);
    pool.flush().unwrap();
    check(&pool, &model, "before the crash");
    // Writes after the last flush may be lost: leave none in the model's way.
    let crashed: Vec<Arc<MemDrive>> = drives
        .iter()
        .map(|d| Arc::new(d.crash(|_, _| CrashFate::Lost)))
        .collect();
    drop(pool);
    let pool = Pool::open(refs(&crashed, keep_discarded)).unwrap();
    check(
        &pool,
        &model,
        &format!("seed {seed}, keep discarded {keep_discarded}: after the crash"),
    );
    // And it goes on: more churn, a clean close, a reopen.
    let v = pool.volume("v").unwrap();
    for lba in (0..blocks).step_by(3) {
        let b = block_for(999 << 32 | lba);
        v.write(lba * 4096, &b).unwrap();
        model.get_mut("v").unwrap().1.insert(lba, b);
    }
    pool.gc(usize::MAX).unwrap();
    pool.close().unwrap();
    drop(pool);
    let pool = Pool::open(refs(&crashed, keep_discarded)).unwrap();
    check(&pool, &model, "after a clean reopen");
}

#[test]
fn segments_written_since_the_checkpoint_are_reused_and_a_crash_loses_nothing_flushed() {
    let seed = test_seed("stamped reuse", 18);
    reuse_then_crash(seed, false);
}

#[test]
fn stale_stripes_of_reused_segments_never_win() {
    let seed = test_seed("stamped reuse, discards ignored", 19);
    reuse_then_crash(seed, true);
}
