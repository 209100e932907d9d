//! Corrupted metadata: flipped bits and zeroed superblocks give a clear error or are repaired
//! from redundancy, never a panic.

mod common;

use common::*;
use flashpool_engine::drive::{Drive, DriveRef, MemDrive};
use flashpool_engine::{Error, Pool};
use rand::{RngExt, SeedableRng};
use std::sync::Arc;

fn populated(m: usize) -> Vec<Arc<MemDrive>> {
    let drives = mem_drives(5, false);
    let pool = Pool::create(as_refs(&drives), &small_config(5 - m.max(1), m)).unwrap();
    pool.create_volume("v", 2 << 20).unwrap();
    let vol = pool.volume("v").unwrap();
    for i in 0..300u64 {
        vol.write((i % 512) * 4096, &block_for(i)).unwrap();
    }
    pool.close().unwrap();
    drives
}

fn clone(drives: &[Arc<MemDrive>]) -> Vec<Arc<MemDrive>> {
    drives
        .iter()
        .map(|d| Arc::new(d.crash(|_, _| unreachable!())))
        .collect()
}

fn flip(d: &MemDrive, byte: u64, bit: u8) {
    let mut b = vec![0u8; 4096];
    let base = byte / 4096 * 4096;
    d.read_at(base, &mut b).unwrap();
    b[(byte - base) as usize] ^= 1 << bit;
    d.write_at(base, &b).unwrap();
}

#[test]
fn zeroed_superblocks() {
    // All superblocks zeroed: a clear error naming the problem.
    let d = clone(&populated(1));
    for x in &d {
        x.write_at(0, &[0u8; 8192]).unwrap();
    }
    let err = Pool::open(as_refs(&d)).err().unwrap();
    assert!(matches!(err, Error::Corrupt(_)), "{err}");
    assert!(
        err.to_string().contains("no valid flashpool superblock"),
        "{err}"
    );
    // One drive's superblocks zeroed with m = 1: it is treated as missing, data still reads.
    let d = clone(&populated(1));
    d[2].write_at(0, &[0u8; 8192]).unwrap();
    let pool = Pool::open(as_refs(&d)).unwrap();
    let mut b = vec![0u8; 4096];
    pool.volume("v").unwrap().read(299 * 4096, &mut b).unwrap();
    assert!(b == block_for(299));
    // With m = 0 the same damage is an error.
    let d = clone(&populated(0));
    d[2].write_at(0, &[0u8; 8192]).unwrap();
    assert!(Pool::open(as_refs(&d)).is_err());
}

#[test]
fn flipped_bits_in_one_superblock_slot_fall_back_to_the_other() {
    let base = populated(1);
    for bit in [0u64, 100, 8 * 12 + 3, 8 * 200, 8 * 4095] {
        let d = clone(&base);
        for x in &d {
            // Both slots hold a valid superblock; break the newest one everywhere.
            let gen_slot = (0..2u64)
                .max_by_key(|s| {
                    let mut b = vec![0u8; 4096];
                    x.read_at(s * 4096, &mut b).unwrap();
                    flashpool_engine::format::superblock::Superblock::decode(&b)
                        .map(|s| s.generation)
                        .unwrap_or(0)
                })
                .unwrap();
            flip(x, gen_slot * 4096 + bit / 8, (bit % 8) as u8);
        }
        // The older superblock's checkpoint may be gone already; either way no panic, and
        // an open that succeeds serves the data.
        if let Ok(pool) = Pool::open(as_refs(&d)) {
            let mut b = vec![0u8; 4096];
            pool.volume("v").unwrap().read(299 * 4096, &mut b).unwrap();
            assert!(b == block_for(299));
        }
    }
}

/// Random bit flips anywhere in the metadata-heavy areas never panic, and an open that
/// succeeds returns either correct data or an error for every block.
#[test]
fn random_corruption_never_panics() {
    let seed = test_seed("corruption", 0x5eed);
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    let base = populated(1);
    for round in 0..40 {
        let d = clone(&base);
        let flips = rng.random_range(1..20);
        for _ in 0..flips {
            let drive = rng.random_range(0..5);
            // Superblocks, or the first chunk header of a segment.
            let byte = if rng.random_bool(0.3) {
                rng.random_range(0..8192)
            } else {
                let seg = rng.random_range(0..8u64);
                (1 << 20) + seg * (1 << 20) + rng.random_range(0..4096)
            };
            flip(&d[drive], byte, rng.random_range(0..8));
        }
        let drives: Vec<DriveRef> = as_refs(&d);
        match Pool::open(drives) {
            Err(e) => eprintln!("round {round}: open refused: {e}"),
            Ok(pool) => {
                let vol = pool.volume("v").unwrap();
                let mut b = vec![0u8; 4096];
                for lba in 0..512u64 {
                    if vol.read(lba * 4096, &mut b).is_ok() && lba < 300 {
                        assert!(
                            b == block_for(lba),
                            "seed {seed} round {round}: block {lba} silently wrong"
                        );
                    }
                }
            }
        }
    }
}
