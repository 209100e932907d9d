//! Writes, partial writes and trims racing a volume shrink: each either lands before the
//! shrink (and is discarded with everything past the new end) or is refused (`OutOfRange`);
//! none lands past the new end after it. After the volume is grown again, everything past the
//! shrink point reads as zeros, the pool's live bytes are the volume's mapped blocks, and a
//! reopened pool (closed cleanly, or cut off without a close) agrees.

mod common;

use common::*;
use flashpool_engine::{BlockState, Compression, Error, Pool};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus as Rng;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const BIG: u64 = 6 << 20;
const SMALL: u64 = (1 << 20) + 4096 * 3 + 100; // not block-aligned: the partial last block too
const WRITERS: u64 = 4;

/// Writes of 1 to 64 blocks, unaligned writes and trims anywhere in `BIG` until `stop`; only
/// `OutOfRange` (the shrink came first) or `NoSpace` may refuse one.
fn writer(pool: Arc<Pool>, id: u64, seed: u64, stop: Arc<AtomicBool>) {
    let mut rng = Rng::seed_from_u64(seed ^ ((id + 1) * 0x9E37_79B9));
    let vol = pool.volume("v").unwrap();
    let data = noise(64 * 4096, seed + id);
    while !stop.load(Ordering::SeqCst) {
        let blocks = rng.random_range(1..=64u64);
        let lba = rng.random_range(0..BIG / 4096 - blocks + 1);
        let r = match rng.random_range(0..8) {
            0 => vol.trim(lba * 4096 + 17, blocks * 4096 - 17),
            1 => vol.write(lba * 4096 + 100, &data[..1000]),
            _ => vol.write(lba * 4096, &data[..(blocks * 4096) as usize]),
        };
        match r {
            Ok(()) | Err(Error::OutOfRange { .. }) => {}
            Err(Error::NoSpace) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("writer {id}: {e}"),
        }
    }
}

/// The volume's mapped bytes, and that the pool's live bytes are exactly those (nothing past
/// the end still counted).
fn check_accounting(pool: &Pool, what: &str) -> u64 {
    pool.flush().unwrap();
    let vol = pool.volume("v").unwrap();
    let mapped: u64 = vol
        .block_status(0, vol.size())
        .unwrap()
        .iter()
        .filter(|e| e.state == BlockState::Data)
        .map(|e| e.length)
        .sum();
    assert_eq!(
        pool.info().live_bytes,
        mapped.div_ceil(4096) * 4096,
        "{what}: live bytes against the volume's mapped blocks"
    );
    mapped
}

/// Everything from `SMALL` to `BIG` reads as zeros and is a hole.
fn check_zero_past(pool: &Pool, what: &str) {
    let vol = pool.volume("v").unwrap();
    assert_eq!(vol.size(), BIG);
    let mut buf = vec![0u8; (BIG - SMALL) as usize];
    vol.read(SMALL, &mut buf).unwrap();
    if let Some(at) = buf.iter().position(|&b| b != 0) {
        panic!(
            "{what}: byte {} past the shrink point reads {} after the regrow",
            SMALL + at as u64,
            buf[at]
        );
    }
    let from = SMALL.div_ceil(4096) * 4096;
    let st = vol.block_status(from, BIG - from).unwrap();
    assert!(
        st.iter().all(|e| e.state == BlockState::Hole),
        "{what}: data past the shrink point: {st:?}"
    );
}

fn contents(pool: &Pool) -> Vec<u8> {
    let vol = pool.volume("v").unwrap();
    let mut buf = vec![0u8; vol.size() as usize];
    vol.read(0, &mut buf).unwrap();
    buf
}

fn run(seed: u64, rounds: usize, stripe_writers: usize) {
    let drives = mem_drives(5, false);
    let pool = Arc::new(Pool::create(as_refs(&drives), &small_config(4, 1)).unwrap());
    if stripe_writers > 0 {
        pool.start_stripe_writers(stripe_writers).unwrap();
    }
    // Stored raw, so live bytes are whole blocks.
    pool.create_volume_with("v", BIG, Compression::Off).unwrap();
    for round in 0..rounds {
        let what = format!("seed {seed}, {stripe_writers} stripe writers, round {round}");
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..WRITERS)
            .map(|id| {
                let (p, s) = (pool.clone(), stop.clone());
                let seed = seed + round as u64 * 1000;
                std::thread::spawn(move || writer(p, id, seed, s))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(5));
        pool.resize_volume("v", SMALL).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        stop.store(true, Ordering::SeqCst);
        for t in threads {
            t.join().unwrap();
        }
        check_accounting(&pool, &what);
        pool.resize_volume("v", BIG).unwrap();
        check_zero_past(&pool, &what);
        check_accounting(&pool, &what);
    }
    // A crash (no close) and a clean reopen: neither brings back what the shrink discarded.
    let before = contents(&pool);
    pool.flush().unwrap();
    drop(pool);
    let pool = Pool::open(as_refs(&drives)).unwrap();
    check_zero_past(&pool, "reopened after a crash");
    check_accounting(&pool, "reopened after a crash");
    assert!(
        contents(&pool) == before,
        "reopened after a crash: contents"
    );
    pool.close().unwrap();
    let pool = Pool::open(as_refs(&drives)).unwrap();
    check_zero_past(&pool, "reopened after a close");
    check_accounting(&pool, "reopened after a close");
    assert!(
        contents(&pool) == before,
        "reopened after a close: contents"
    );
}

#[test]
fn writes_racing_a_shrink_never_reappear() {
    let seed = test_seed("resize_race", 1);
    run(seed, 40, 0);
}

#[test]
fn writes_racing_a_shrink_never_reappear_with_stripe_writers() {
    let seed = test_seed("resize_race", 2);
    run(seed, 40, 2);
}

/// Bytes written past an end that is not a multiple of the block, then cut off by a shrink,
/// stay zeros when the volume grows again, and after a crash once it grew.
#[test]
fn a_grow_does_not_bring_back_bytes_past_an_unaligned_end() {
    let drives = mem_drives(5, false);
    let pool = Pool::create(as_refs(&drives), &small_config(4, 1)).unwrap();
    pool.create_volume("v", BIG).unwrap();
    let vol = pool.volume("v").unwrap();
    vol.write(SMALL - 50, &[7u8; 4096]).unwrap();
    pool.resize_volume("v", SMALL).unwrap();
    pool.resize_volume("v", BIG).unwrap();
    let mut b = vec![0u8; 4096];
    vol.read(SMALL - 50, &mut b).unwrap();
    assert!(b[..50].iter().all(|&x| x == 7), "bytes within the end kept");
    assert!(
        b[50..].iter().all(|&x| x == 0),
        "bytes past the end came back"
    );
    drop(pool);
    let pool = Pool::open(as_refs(&drives)).unwrap();
    let mut b = vec![0u8; 4096];
    pool.volume("v").unwrap().read(SMALL - 50, &mut b).unwrap();
    assert!(b[..50].iter().all(|&x| x == 7), "after a crash: bytes kept");
    assert!(
        b[50..].iter().all(|&x| x == 0),
        "after a crash: bytes came back"
    );
}
