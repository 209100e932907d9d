//! The space each segment's stripes took, which the cleaner measures live data against, survives
//! a restart: after a crash (from the checkpoint plus the replayed log) and after a clean close
//! (from the checkpoint alone), for segments written at two stripe widths.

mod common;

use common::*;
use flashpool_engine::drive::{CrashFate, DriveRef, MemDrive};
use flashpool_engine::{Compression, Pool, SegmentInfo};
use rand::{RngExt, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;

const BLOCKS: u64 = 2048;

/// Segments holding data, by index: (live bytes, space written). An open segment counts as used:
/// a reopen closes it as it is.
fn holding_data(pool: &Pool) -> BTreeMap<u32, (u64, Option<u64>)> {
    pool.segments()
        .into_iter()
        .filter(|s| s.state == "used" || s.state == "open")
        .map(|s: SegmentInfo| (s.index, (s.live_bytes, s.written_bytes)))
        .collect()
}

fn write_random(pool: &Pool, rng: &mut impl rand::Rng, n: u64, stamp0: u64) {
    let vol = pool.volume("v").unwrap();
    for i in 0..n {
        let lba = rng.random_range(0..BLOCKS);
        vol.write(lba * 4096, &block_for(stamp0 + i)).unwrap();
    }
}

#[test]
fn segment_space_survives_crash_and_clean_restart() {
    let seed = test_seed("segment space", 7);
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);

    // 3+1 stripes first, then 4+1 after a drive add: segments of both widths.
    let mems = mem_drives(4, true);
    let pool = Pool::create(as_refs(&mems), &small_config(3, 1)).unwrap();
    pool.create_volume_with("v", BLOCKS * 4096, Compression::Off)
        .unwrap();
    write_random(&pool, &mut rng, 3000, 0);
    pool.close().unwrap();
    drop(pool);
    let new = Arc::new(MemDrive::tracked(DRIVE_SIZE, "mem:4"));
    let mut mems = mems;
    mems.push(new.clone());
    let pool = Pool::add_drive(as_refs(&mems[..4]), new as DriveRef).unwrap();
    assert_eq!(pool.info().k, 4);
    // Past the checkpoint interval (4 MiB), so some stripes are in a checkpoint and the rest
    // only in the log.
    write_random(&pool, &mut rng, 1500, 10_000);
    pool.flush().unwrap();
    let before = holding_data(&pool);
    assert!(before.len() > 4, "{before:?}");
    for (seg, (live, written)) in &before {
        let w = written.unwrap_or_else(|| panic!("segment {seg}: space unknown before a restart"));
        assert!(
            *live <= w,
            "segment {seg}: {live} live bytes in {w} written"
        );
    }

    // A crash: every write was flushed, so the images keep all of them.
    let crashed: Vec<Arc<MemDrive>> = mems
        .iter()
        .map(|d| Arc::new(d.crash(|_, _| CrashFate::Lost)))
        .collect();
    drop(pool);
    let pool = Pool::open(as_refs(&crashed)).unwrap();
    assert_eq!(holding_data(&pool), before, "after a crash");

    pool.close().unwrap();
    drop(pool);
    let pool = Pool::open(as_refs(&crashed)).unwrap();
    assert_eq!(holding_data(&pool), before, "after a clean close");
}
