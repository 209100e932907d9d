//! Scrub and repair: bit rot at rest on one member is found by `Pool::scrub`, repaired (the
//! damaged segments' live data moved), and afterwards a second scrub is clean and the pool
//! survives the loss of another member; rot on two members of one stripe (m = 1) is reported
//! with the volume and offset of exactly the blocks lost; a host read that reconstructs a
//! rotten block queues its segment, and `repair_pending` repairs it.

mod common;

use common::*;
use flashpool_engine::drive::{Drive, MemDrive};
use flashpool_engine::Pool;
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus as Rng;
use std::sync::Arc;

const BLOCKS: u64 = 2000;

fn setup() -> (Vec<Arc<MemDrive>>, Pool) {
    let mems = mem_drives(5, false);
    let pool = Pool::create(as_refs(&mems), &small_config(4, 1)).unwrap();
    pool.create_volume_with("v", BLOCKS * 4096, flashpool_engine::Compression::Off)
        .unwrap();
    let vol = pool.volume("v").unwrap();
    for lba in 0..BLOCKS {
        vol.write(lba * 4096, &block_for(lba + 7)).unwrap();
    }
    pool.flush().unwrap();
    (mems, pool)
}

/// Flips one byte in each of `n` random 4 KiB blocks of the data area of `drive` (past the
/// superblocks, inside the part the volume's data filled).
fn rot(mems: &[Arc<MemDrive>], drive: usize, offsets: &[u64]) {
    for &off in offsets {
        let mut b = vec![0u8; 4096];
        mems[drive].read_at(off, &mut b).unwrap();
        b[100] ^= 0x5A;
        mems[drive].write_at(off, &b).unwrap();
    }
}

fn data_offsets(seed: u64, n: usize) -> Vec<u64> {
    let mut rng = Rng::seed_from_u64(seed);
    // The volume's 8 MiB of data over 4 data drives: about 2 MiB per drive from 1 MiB on.
    (0..n)
        .map(|_| (1 << 20) + rng.random_range(0..512u64) * 4096)
        .collect()
}

fn verify(pool: &Pool, what: &str) {
    let vol = pool.volume("v").unwrap();
    let mut b = vec![0u8; 4096];
    for lba in 0..BLOCKS {
        vol.read(lba * 4096, &mut b)
            .unwrap_or_else(|e| panic!("{what}: block {lba}: {e}"));
        assert!(b == block_for(lba + 7), "{what}: block {lba}");
    }
}

#[test]
fn rot_on_one_member_is_found_repaired_and_redundancy_restored() {
    let seed = test_seed("scrub one member", 3);
    let (mems, pool) = setup();
    rot(&mems, 2, &data_offsets(seed, 12));
    let r = pool.scrub(true, None).unwrap();
    eprintln!("{r:?}");
    assert!(r.bad_chunks > 0, "rot not found: {r:?}");
    assert!(r.segments_repaired > 0, "{r:?}");
    assert!(r.unrecoverable.is_empty(), "{r:?}");
    let again = pool.scrub(false, None).unwrap();
    assert_eq!(again.bad_chunks, 0, "rot left after repair: {again:?}");
    verify(&pool, "after repair");
    // Redundancy is whole again: another member may go.
    pool.fail_drive(0).unwrap();
    verify(&pool, "after repair and the loss of drive 0");
    assert_eq!(pool.stats().repaired_segments, r.segments_repaired);
}

#[test]
fn rot_on_two_members_of_a_stripe_names_exactly_the_lost_blocks() {
    let seed = test_seed("scrub two members", 4);
    let (mems, pool) = setup();
    // The same offsets on two drives: chunks of the same stripes (segments are the same byte
    // ranges on every drive, and fill pointers stay level).
    let offs = data_offsets(seed, 4);
    rot(&mems, 1, &offs);
    rot(&mems, 2, &offs);
    let r = pool.scrub(true, None).unwrap();
    eprintln!(
        "{} bad chunks, {} unrecoverable",
        r.bad_chunks,
        r.unrecoverable.len()
    );
    assert!(!r.unrecoverable.is_empty(), "{r:?}");
    let vol = pool.volume("v").unwrap();
    let mut b = vec![0u8; 4096];
    let lost: std::collections::BTreeSet<u64> = r
        .unrecoverable
        .iter()
        .map(|(v, off)| {
            assert_eq!(v, "v");
            off / 4096
        })
        .collect();
    for lba in 0..BLOCKS {
        let res = vol.read(lba * 4096, &mut b);
        if lost.contains(&lba) {
            // A listed block is gone: the rest of a rotten chunk (its blocks' own CRCs
            // still check) is intact and not listed.
            assert!(res.is_err(), "listed block {lba} reads back: not lost");
        } else {
            res.unwrap_or_else(|e| panic!("block {lba} not listed but unreadable: {e}"));
            assert!(b == block_for(lba + 7), "block {lba} not listed but wrong");
        }
    }
    assert!(pool.stats().unrecoverable_blocks > 0);
}

#[test]
fn a_read_that_reconstructs_queues_a_repair() {
    let seed = test_seed("read repair", 5);
    let (mems, pool) = setup();
    rot(&mems, 3, &data_offsets(seed, 8));
    verify(&pool, "reads through rot");
    assert!(pool.stats().degraded_reads > 0, "no read met the rot");
    assert!(pool.repairs_pending() > 0);
    let n = pool.repair_pending().unwrap();
    assert!(n > 0);
    assert_eq!(pool.repairs_pending(), 0);
    let r = pool.scrub(false, None).unwrap();
    // Rot outside live blocks' bytes (headers, parity) may remain for the scrub to find,
    // but none under a block the reads met.
    verify(&pool, "after read repair");
    eprintln!("after read repair, scrub finds {} bad chunks", r.bad_chunks);
}
