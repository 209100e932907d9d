//! A full pool: what it still takes, and that its reserves stay what they are for.
//!
//! The pools here have the shape `flashpool serve --drives 5 --drive-size 64M` makes (4+1,
//! 2 MiB segments of 32 KiB chunks: 31 segments, a reserve of two for checkpoints and two for
//! the cleaner), filled with incompressible data until ENOSPC.

mod common;

use common::*;
use flashpool_engine::drive::{DriveRef, MemDrive};
use flashpool_engine::{Compression, Error, Pool, PoolConfig};
use rand::{RngExt, SeedableRng};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn config() -> PoolConfig {
    PoolConfig {
        k: 4,
        m: 1,
        chunk_size: 32 << 10,
        segment_size: 2 << 20,
        ..PoolConfig::default()
    }
}

struct Drives(Vec<Arc<MemDrive>>);

impl Drives {
    fn new() -> Self {
        Drives(
            (0..5)
                .map(|i| Arc::new(MemDrive::new(64 << 20, format!("mem:{i}"))))
                .collect(),
        )
    }
    fn refs(&self) -> Vec<DriveRef> {
        as_refs(&self.0)
    }
}

/// A volume "v" of 240 MiB filled with 1 MiB writes until ENOSPC; returns the bytes taken.
fn filled_pool(d: &Drives, reserve: bool) -> (Pool, u64) {
    let pool = Pool::create(d.refs(), &config()).unwrap();
    pool.set_rebuild_reserve(reserve);
    pool.create_volume_with("v", 240 * MIB, Compression::Off)
        .unwrap();
    let vol = pool.volume("v").unwrap();
    let mut off = 0;
    while off < 240 * MIB {
        match vol.write(off, &noise(MIB as usize, off)) {
            Ok(()) => off += MIB,
            Err(Error::NoSpace) => break,
            Err(e) => panic!("fill at {off}: {e}"),
        }
    }
    assert!(off < 240 * MIB, "the pool filled before the volume");
    match pool.flush() {
        Ok(()) | Err(Error::NoSpace) => {}
        Err(e) => panic!("flush: {e}"),
    }
    (pool, off)
}

fn reopen(pool: Pool, d: &Drives) -> Pool {
    pool.close().unwrap();
    drop(pool);
    Pool::open(d.refs()).unwrap()
}

/// `count` overwrites of 64 KiB, one every 2 MiB from 0: how many succeeded before the first
/// ENOSPC.
fn overwrites(pool: &Pool, count: u64, seed: u64) -> u64 {
    let vol = pool.volume("v").unwrap();
    for i in 0..count {
        match vol.write(i * 2 * MIB, &noise(64 << 10, seed + i)) {
            Ok(()) => {}
            Err(Error::NoSpace) => return i,
            Err(e) => panic!("overwrite {i}: {e}"),
        }
    }
    pool.flush().unwrap();
    count
}

/// The tester's `repro_overwrite_full.sh`: a pool filled to ENOSPC and restarted, then 17 MiB
/// trimmed, takes overwrites again (the cleaner empties the trimmed segments). Before, each
/// restart's checkpoint held one segment more than the pool had when it filled (the previous
/// checkpoint's, kept until the next one), which came out of the cleaner's reserve: host
/// writes then needed a segment more than the reserves and failed at the 48th overwrite with
/// 165 MiB live where 182 MiB had fit. Without the restart it passed.
#[test]
fn a_full_pool_restarted_then_trimmed_takes_overwrites() {
    for restart in [false, true] {
        let d = Drives::new();
        let (pool, filled) = filled_pool(&d, false);
        let free_full = pool.info().free_segments;
        let pool = if restart { reopen(pool, &d) } else { pool };
        let info = pool.info();
        eprintln!(
            "restart {restart}: filled {} MiB, {free_full} segments free, {} after",
            filled >> 20,
            info.free_segments
        );
        let vol = pool.volume("v").unwrap();
        vol.trim(MIB, MIB).unwrap();
        pool.flush().unwrap();
        // 1 MiB of garbage is less than a segment: these may or may not fit.
        let some = overwrites(&pool, 64, 500);
        vol.trim(150 * MIB, 16 * MIB).unwrap();
        pool.flush().unwrap();
        let done = overwrites(&pool, 64, 1000);
        eprintln!(
            "restart {restart}: {some} overwrites after trimming 1 MiB, {done} after 16 more"
        );
        assert_eq!(
            done,
            64,
            "restart {restart}: overwrite {done} got ENOSPC with {} MiB live, {} MiB less than \
             the pool took",
            pool.info().live_bytes >> 20,
            (filled - pool.info().live_bytes) >> 20
        );
        // Restarting again changes nothing.
        let pool = reopen(pool, &d);
        assert_eq!(overwrites(&pool, 64, 2000), 64, "restart {restart}, again");
    }
}

/// A restart takes no room from a full pool: what fits after trimming 16 MiB is the same with
/// a restart in between as without. Before, the restart's checkpoints held one segment more
/// than the pool had when it filled (only the checkpoint made when it was created), and 8 MiB
/// less fit.
#[test]
fn a_restart_takes_no_room_from_a_full_pool() {
    let mut fit = Vec::new();
    for restart in [false, true] {
        let d = Drives::new();
        let (pool, filled) = filled_pool(&d, false);
        let vol = pool.volume("v").unwrap();
        vol.trim(150 * MIB, 16 * MIB).unwrap();
        pool.flush().unwrap();
        let pool = if restart { reopen(pool, &d) } else { pool };
        let vol = pool.volume("v").unwrap();
        let mut n = 0u64;
        while n < 16
            && vol
                .write((150 + n) * MIB, &noise(MIB as usize, 77 + n))
                .is_ok()
        {
            n += 1;
        }
        eprintln!(
            "restart {restart}: filled {} MiB, then {n} MiB in the 16 trimmed",
            filled >> 20
        );
        fit.push(n);
    }
    assert!(fit[0] >= 8, "{} MiB fit in 16 MiB trimmed", fit[0]);
    assert_eq!(fit[1], fit[0], "MiB fit after a restart, and without one");
}

/// Trims (and other records) on a full pool never hand the cleaner's reserve to host data.
/// Before, a trim on a pool with no segment left for hosts opened a data segment out of the
/// cleaner's reserve, and host writes then filled it: rounds of "trim a block, overwrite until
/// ENOSPC" left nothing but the checkpoint's reserve, the cleaner could not open a segment to
/// relocate into, and the pool refused writes with many segments' worth of garbage in it
/// (and then trims too). Now every round's overwrites are cleaned for, and after trimming
/// 24 MiB the pool takes 16 MiB of new writes.
#[test]
fn trims_on_a_full_pool_leave_the_cleaners_reserve_to_the_cleaner() {
    let seed = test_seed("trims_on_a_full_pool", 84);
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    let d = Drives::new();
    let (pool, filled) = filled_pool(&d, false);
    let pool = reopen(pool, &d);
    let vol = pool.volume("v").unwrap();
    for round in 0..24u64 {
        let lba = rng.random_range(0..filled / 4096);
        vol.trim(lba * 4096, 4096)
            .unwrap_or_else(|e| panic!("seed {seed} round {round}: trim: {e}"));
        pool.flush().unwrap();
        let mut written = 0u64;
        while written < 4 * MIB {
            let at = rng.random_range(0..filled / (64 << 10)) * (64 << 10);
            match vol.write(at, &noise(64 << 10, round * 1000 + written)) {
                Ok(()) => written += 64 << 10,
                Err(Error::NoSpace) => break,
                Err(e) => panic!("seed {seed} round {round}: {e}"),
            }
        }
        pool.flush().unwrap();
    }
    vol.trim(100 * MIB, 24 * MIB)
        .unwrap_or_else(|e| panic!("seed {seed}: trim of 24 MiB: {e}"));
    pool.flush().unwrap();
    for i in 0..256u64 {
        let at = rng.random_range(0..filled / (64 << 10)) * (64 << 10);
        vol.write(at, &noise(64 << 10, 90_000 + i))
            .unwrap_or_else(|e| {
                panic!(
                    "seed {seed}: write {i} of 64 KiB after trimming 24 MiB: {e} ({} MiB live \
                     of the {} MiB the pool took)",
                    pool.info().live_bytes >> 20,
                    filled >> 20
                )
            });
    }
    pool.flush().unwrap();
}

/// A forced shrink is a discard of the volume's tail: it frees space, so it works on a full
/// pool, as trims and deletes do. Before, its record needed a segment hosts may take, and it
/// failed with "no space left in the pool".
#[test]
fn a_shrink_works_on_a_full_pool() {
    let d = Drives::new();
    let (pool, filled) = filled_pool(&d, false);
    for pool in [pool, {
        let d2 = Drives::new();
        let (p, _) = filled_pool(&d2, false);
        reopen(p, &d2)
    }] {
        let live = pool.info().live_bytes;
        pool.resize_volume("v", filled / 2)
            .expect("a shrink on a full pool");
        assert_eq!(pool.volumes()[0].size, filled / 2);
        assert!(pool.info().live_bytes <= live - filled / 2 + MIB);
        // And the room it freed takes writes.
        assert_eq!(
            overwrites(&pool, filled / 4 / (2 * MIB), 7),
            filled / 4 / (2 * MIB)
        );
        pool.resize_volume("v", filled).expect("a grow back");
    }
    let _ = d;
}

/// Creating a thin volume takes a record, no data room: on a full pool it succeeds whether or
/// not the data stream has a stripe open (before: refused after a restart or a flush that
/// left none, allowed when one was open), and so do compression changes.
#[test]
fn volumes_are_created_on_a_full_pool() {
    let d = Drives::new();
    let (pool, _) = filled_pool(&d, false);
    pool.create_volume_with("a", 1, Compression::Lz4)
        .expect("create on a full pool");
    let pool = reopen(pool, &d);
    assert!(matches!(
        pool.volume("v").unwrap().write(0, &noise(64 << 10, 1)),
        Err(Error::NoSpace)
    ));
    pool.create_volume_with("b", 1, Compression::Off)
        .expect("create on a full pool after a restart");
    pool.set_volume_compression("b", Compression::Lz4).unwrap();
    pool.flush().unwrap();
    let pool = reopen(pool, &d);
    let names: Vec<String> = pool.volumes().into_iter().map(|v| v.name).collect();
    assert_eq!(names, ["a", "b", "v"]);
}

/// With the rebuild reserve on, ENOSPC comes at `live_limit_bytes`: a write is refused only
/// when what it would store takes live data past it. Before, the check left room for every
/// stripe buffer the pool may hold (1.5 MiB here, 6 MiB with 128 KiB chunks) and counted every
/// block as 4 KiB, so a 4 KiB block of zeros on an lz4 volume (32 bytes stored) got ENOSPC
/// with 1.5 MiB to go.
#[test]
fn the_live_limit_is_where_enospc_comes() {
    let d = Drives::new();
    let pool = Pool::create(d.refs(), &config()).unwrap();
    pool.set_rebuild_reserve(true);
    pool.create_volume_with("v", 200 * MIB, Compression::Off)
        .unwrap();
    pool.create_volume_with("z", 64 * MIB, Compression::Lz4)
        .unwrap();
    let limit = pool.info().live_limit_bytes.expect("a limit");
    let vol = pool.volume("v").unwrap();
    let mut lba = 0;
    loop {
        match vol.write(lba * 4096, &noise(4096, lba)) {
            Ok(()) => lba += 1,
            Err(Error::NoSpace) => break,
            Err(e) => panic!("{e}"),
        }
    }
    pool.flush().unwrap();
    let live = pool.info().live_bytes;
    assert!(live <= limit, "{live} live past the limit {limit}");
    assert!(
        live + 4096 > limit,
        "a 4 KiB block got ENOSPC with {} bytes to the limit",
        limit - live
    );
    // Blocks of zeros store 32 bytes each: in the room of one block trimmed, many fit, until
    // the limit does.
    vol.trim(4096, 4096).unwrap();
    pool.flush().unwrap();
    let before = pool.info().live_bytes;
    let z = pool.volume("z").unwrap();
    let mut zeros = 0u64;
    while z.write(zeros * 4096, &[0u8; 4096]).is_ok() {
        zeros += 1;
    }
    pool.flush().unwrap();
    let live = pool.info().live_bytes;
    assert!(
        zeros > 0,
        "no block of zeros fit in {} bytes",
        limit - before
    );
    let each = (live - before) / zeros;
    assert!(each < 4096 / 8, "a block of zeros stores {each} bytes");
    assert!(
        live <= limit && live + each > limit,
        "{live} of {limit} after {zeros} blocks of zeros"
    );
    // An overwrite that stores no more than the block it replaces is never refused.
    vol.write(0, &noise(4096, 5))
        .expect("an overwrite at the limit");
    z.write(0, &[0u8; 4096]).expect("an overwrite of zeros");
    assert!(
        matches!(z.write(0, &noise(4096, 6)), Err(Error::NoSpace)),
        "an overwrite storing more than the block it replaces, past the limit"
    );
}
