//! Pools written by older builds still open: drive images a previous format wrote (zstd
//! compressed under tests/fixtures), opened, checked block by block against what the writer
//! left, then written to and reopened by this build.
//!
//! `pool-cp2`: checkpoint version 2, no segment-free or relocation records (before issue 18),
//! written by `fixtures/pool-cp2/generate.rs.txt` at commit 2afe017: a 3+1 pool on five 12 MiB
//! file drives, volumes "plain" (512 blocks, uncompressed) and "packed" (64 blocks, lz4),
//! twelve rounds of overwrites with the cleaner run after each (checkpoints, cleaned and
//! reused segments), then a trim and a write flushed after the last checkpoint (replayed at
//! open).
//!
//! `pool-cp3`: checkpoint version 3, its log unstamped, with segment-free and relocation
//! records after the last checkpoint (before stamps), written by
//! `fixtures/pool-cp3/generate.rs.txt` at commit 6446388: the same pool and workload, 21
//! rounds (the generator stops after the first cleaning round that moved blocks and freed
//! segments by log records without a checkpoint), then the trim and the write. Opened by the
//! old rules, it runs on with a stamped log from its first checkpoint.
//!
//! `pool-cp4`: checkpoint version 4 (no segment members), a stamped log after it with
//! relocations and segments reused without a checkpoint, written by
//! `fixtures/pool-cp4/generate.rs.txt` at commit 7db095b: the cp3 workload with a 6 MiB
//! checkpoint interval (three checkpoints), 12 rounds. Its segments open as on every member
//! until rewritten.

mod common;

use common::*;
use flashpool_engine::drive::{DriveRef, FileDrive};
use flashpool_engine::Pool;
use std::path::Path;
use std::sync::Arc;

fn unpack(name: &str, dir: &Path) -> Vec<DriveRef> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    (0..5)
        .map(|i| {
            let z = std::fs::read(src.join(format!("d{i}.img.zst"))).unwrap();
            let img = zstd::decode_all(&z[..]).unwrap();
            let path = dir.join(format!("d{i}.img"));
            std::fs::write(&path, img).unwrap();
            Arc::new(FileDrive::open(&path).unwrap()) as DriveRef
        })
        .collect()
}

/// What the generator left in "plain" block `lba` after `rounds` rounds.
fn plain_expected(rounds: u64, lba: u64) -> Vec<u8> {
    if lba == 0 {
        return block_for(99 << 32);
    }
    if (100..110).contains(&lba) {
        return vec![0; 4096];
    }
    let round = (0..rounds)
        .rev()
        .find(|&r| r == 0 || (lba * 7 + r).is_multiple_of(3))
        .unwrap();
    block_for(round << 32 | lba)
}

fn packed_expected(rounds: u64, lba: u64) -> Vec<u8> {
    let round = rounds - 1;
    let mut b = vec![(round * 64 + lba) as u8; 4096];
    b[..8].copy_from_slice(&(round << 32 | lba).to_le_bytes());
    b
}

fn check(pool: &Pool, rounds: u64, plain_override: &dyn Fn(u64) -> Option<Vec<u8>>) {
    let plain = pool.volume("plain").unwrap();
    let packed = pool.volume("packed").unwrap();
    let mut b = vec![0u8; 4096];
    for lba in 0..512u64 {
        plain.read(lba * 4096, &mut b).unwrap();
        let want = plain_override(lba).unwrap_or_else(|| plain_expected(rounds, lba));
        assert!(b == want, "plain block {lba}");
    }
    for lba in 0..64u64 {
        packed.read(lba * 4096, &mut b).unwrap();
        assert!(b == packed_expected(rounds, lba), "packed block {lba}");
    }
}

/// Opens the fixture `name` (`rounds` rounds), checks it, runs it on (overwrites, the
/// cleaner, a clean close) and checks it again after a reopen.
fn open_check_and_run_on(name: &str, rounds: u64) {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::open(unpack(name, dir.path())).unwrap();
    check(&pool, rounds, &|_| None);
    // The old pool runs on: overwrites, the cleaner, a reopen.
    let plain = pool.volume("plain").unwrap();
    for round in 0..6u64 {
        for lba in (round..512).step_by(3) {
            plain
                .write(lba * 4096, &block_for((1000 + round) << 32 | lba))
                .unwrap();
        }
        pool.gc(usize::MAX).unwrap();
    }
    pool.close().unwrap();
    drop(pool);
    let last = |lba: u64| {
        (0..6u64)
            .rev()
            .find(|&r| lba >= r && (lba - r).is_multiple_of(3))
            .map(|r| block_for((1000 + r) << 32 | lba))
    };
    let drives = (0..5)
        .map(|i| {
            Arc::new(FileDrive::open(&dir.path().join(format!("d{i}.img"))).unwrap()) as DriveRef
        })
        .collect();
    let pool = Pool::open(drives).unwrap();
    check(&pool, rounds, &last);
}

#[test]
fn checkpoint_version_2_pool_opens_and_takes_writes() {
    open_check_and_run_on("pool-cp2", 12);
}

#[test]
fn checkpoint_version_3_pool_with_an_unstamped_log_opens_and_takes_writes() {
    open_check_and_run_on("pool-cp3", 21);
}

#[test]
fn checkpoint_version_4_pool_opens_and_takes_writes() {
    open_check_and_run_on("pool-cp4", 12);
}

/// A version-4 pool (segments' members unknown: every member) loses a member after it opens,
/// and rebuilds: everything holding data is moved, nothing is lost.
#[test]
fn checkpoint_version_4_pool_rebuilds_a_lost_member() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::open(unpack("pool-cp4", dir.path())).unwrap();
    let holding = pool
        .segments()
        .iter()
        .filter(|s| s.state == "used" || s.state == "open")
        .count() as u64;
    pool.fail_drive(2).unwrap();
    let st = pool.rebuild().unwrap();
    assert_eq!(st.total_segments, holding);
    assert!(!pool.needs_rebuild());
    check(&pool, 12, &|_| None);
}
