//! The cleaner and stripes still on their way to the drives. A sealed stripe's blocks are
//! mapped as buffered until its chunks are written, and only then count as live data of its
//! segment; its chunk headers are not on the drives before that either. So a segment whose
//! last stripes are still queued for the stripe writers can look empty to the cleaner (no
//! live bytes, nothing found by a scan) while the maps are about to point into it: the
//! cleaner must not empty and free it then, or the newest copies of those blocks land in a
//! free segment and the next writes there destroy them.

mod common;

use common::*;
use flashpool_engine::drive::{DriveRef, MemDrive};
use flashpool_engine::{Compression, Pool, PoolConfig, Volume};
use std::sync::Arc;
use std::time::Duration;

/// Block `lba`'s contents in round `round`.
fn version(round: u64, lba: u64) -> Vec<u8> {
    block_for(round << 32 | lba)
}

/// Checks that every block `lba` of `v` holds `version(newest[lba], lba)`.
fn check_newest(v: &Volume, newest: &[u64], what: &str) {
    for (lba, &round) in newest.iter().enumerate() {
        let mut got = vec![0u8; 4096];
        v.read(lba as u64 * 4096, &mut got)
            .unwrap_or_else(|e| panic!("{what}: block {lba}: {e}"));
        assert!(
            got == version(round, lba as u64),
            "{what}: block {lba} is not its newest copy (written in round {round})"
        );
    }
}

/// Sixteen hot blocks (one stripe of 4 x 16 KiB) rewritten round after round while the
/// drives hold every write: the segment the rounds filled closes with the newest copies of
/// blocks 1..16 in its last stripe, still queued, and no live bytes. A cleaning run then
/// (the drives let go while it flushes) must leave that segment alone, or at least not free
/// it with data in it; every block must read back its newest copy, also after later writes
/// reuse every free segment.
#[test]
fn the_cleaner_leaves_segments_whose_stripes_are_still_being_written() {
    let mems: Vec<Arc<MemDrive>> = mem_drives(5, true);
    let gate = Arc::new(Gate::default());
    let drives: Vec<DriveRef> = mems
        .iter()
        .map(|m| GatedDrive::new(m.clone(), Some(gate.clone()), None) as DriveRef)
        .collect();
    let cfg = PoolConfig {
        k: 4,
        m: 1,
        chunk_size: 16 << 10,
        segment_size: 192 << 10,
        checkpoint_interval: 64 << 30,
    };
    let pool = Arc::new(Pool::create(drives, &cfg).unwrap());
    pool.create_volume_with("v", 4 << 20, Compression::Off)
        .unwrap();
    let v = pool.volume("v").unwrap();
    // Eight writers: 24 stripe buffers, room for a segment's stripes to queue behind the gate.
    pool.start_stripe_writers(8).unwrap();
    let open_before: Vec<u32> = pool
        .segments()
        .iter()
        .filter(|s| s.state == "open")
        .map(|s| s.index)
        .collect();
    gate.set(true);
    let mut newest = [0u64; 16];
    // Rounds of the sixteen blocks until the segment the data stream had open when the gate
    // closed is closed: the block that closed it went to the next segment, and the newest
    // copy of every other block is in the closed segment's stripes, all of them queued.
    let mut writes = 0u64;
    let closed = 'rounds: loop {
        let round = writes / 16 + 1;
        let lba = writes % 16;
        v.write(lba * 4096, &version(round, lba)).unwrap();
        newest[lba as usize] = round;
        writes += 1;
        for s in pool.segments() {
            if s.state == "used" && open_before.contains(&s.index) {
                break 'rounds s.index;
            }
        }
        assert!(writes < 16 * 20, "no segment closed after {writes} writes");
    };
    let info = pool.segments()[closed as usize].clone();
    assert_eq!(
        info.live_bytes, 0,
        "its stripes are all still queued: {info:?}"
    );
    // Clean while the drives hold the writes; let them go once the cleaner waits.
    let cleaner = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.gc(usize::MAX / 2))
    };
    std::thread::sleep(Duration::from_millis(200));
    gate.set(false);
    cleaner.join().unwrap().unwrap();
    pool.flush().unwrap();
    for s in pool.segments() {
        assert!(
            !(s.state == "free" && s.live_bytes > 0),
            "segment {} is free with {} live bytes (closed behind the gate: {closed})",
            s.index,
            s.live_bytes
        );
    }
    check_newest(&v, &newest, "after cleaning");
    // Cold data into free segments, the lowest first (so into the closed one, had it been
    // freed), then the hot blocks again.
    for i in 0..48u64 {
        v.write((64 + i * 16) * 4096, &version(100 + i, 0).repeat(16))
            .unwrap();
    }
    pool.flush().unwrap();
    check_newest(&v, &newest, "after the free segments were written again");
}

/// Segments with nothing live that the latest checkpoint covers are reclaimed without a read
/// (no scan of their chunk headers), freed, written again, and everything reads back, also
/// after the pool is opened again from the drives as they are (a crash: no close).
#[test]
fn dead_segments_the_checkpoint_covers_are_reclaimed_unread() {
    let mems = mem_drives(5, true);
    let pool = Pool::create(as_refs(&mems), &small_config(4, 1)).unwrap();
    pool.create_volume_with("v", 4 << 20, Compression::Off)
        .unwrap();
    let v = pool.volume("v").unwrap();
    let mut newest = vec![0u64; 1024];
    // Four passes over the volume: each leaves the one before dead.
    for pass in 1..=4u64 {
        for chunk in 0..64u64 {
            let data: Vec<u8> = (0..16)
                .flat_map(|i| version(pass, chunk * 16 + i))
                .collect();
            v.write(chunk * 16 * 4096, &data).unwrap();
            newest[chunk as usize * 16..chunk as usize * 16 + 16].fill(pass);
        }
    }
    pool.checkpoint().unwrap();
    // Every segment closed so far is covered by that checkpoint: those with nothing live go
    // unread.
    let dead = pool
        .segments()
        .iter()
        .filter(|s| s.state == "used" && s.live_bytes == 0)
        .count() as u64;
    assert!(dead > 0, "four passes left no dead segment");
    let before = pool.stats();
    let cleaned = pool.gc(usize::MAX / 2).unwrap();
    let after = pool.stats();
    assert!(cleaned as u64 >= dead, "{cleaned} cleaned, {dead} dead");
    assert_eq!(
        after.gc_segments_unread - before.gc_segments_unread,
        dead,
        "{after:?}"
    );
    if cleaned as u64 == dead {
        assert_eq!(
            after.media_read_bytes, before.media_read_bytes,
            "cleaning dead, covered segments read the drives"
        );
    }
    check_newest(&v, &newest, "after cleaning");
    // The freed segments written again (half the volume once more), then a crash.
    for chunk in 0..32u64 {
        let data: Vec<u8> = (0..16).flat_map(|i| version(5, chunk * 16 + i)).collect();
        v.write(chunk * 16 * 4096, &data).unwrap();
        newest[chunk as usize * 16..chunk as usize * 16 + 16].fill(5);
    }
    pool.flush().unwrap();
    check_newest(&v, &newest, "after the freed segments were written again");
    drop(v);
    drop(pool);
    let pool = Pool::open(as_refs(&mems)).unwrap();
    check_newest(
        &pool.volume("v").unwrap(),
        &newest,
        "after opening the pool again",
    );
}
