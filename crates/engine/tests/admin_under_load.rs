//! Member operations while writers run: remove (fail + rebuild), add, replace, readmit and a
//! second remove, on pools whose first remove leaves fewer members in service than the stripe
//! width (stripes narrow) and on wider ones. Never a panic, never a hang, and afterwards every
//! block reads back as the last write to it. (The product bug this guards: `drive remove` under
//! a writer panicked with "advance without an open segment" and deadlocked the server; the
//! rebuild closed the open segments between sealing the open stripes and closing them, while a
//! writer opened a new stripe in the closed segment.)

mod common;

use common::*;
use flashpool_engine::drive::{DriveRef, MemDrive};
use flashpool_engine::{Error, Pool};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus as Rng;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const VOLUME: u64 = 6 << 20;
const WRITERS: u64 = 3;

/// One writer: random blocks of its own share of the volume (lba % WRITERS == id), flushing
/// now and then, until `stop`. Returns the last stamp written to each block.
fn writer(pool: Arc<Pool>, id: u64, seed: u64, stop: Arc<AtomicBool>) -> HashMap<u64, u64> {
    let mut rng = Rng::seed_from_u64(seed ^ ((id + 1) * 0x9E37_79B9));
    let vol = pool.volume("v").unwrap();
    let blocks = VOLUME / 4096 / WRITERS;
    let mut last = HashMap::new();
    let mut stamp = id << 40;
    while !stop.load(Ordering::SeqCst) {
        let lba = rng.random_range(0..blocks) * WRITERS + id;
        stamp += 1;
        match vol.write(lba * 4096, &block_for(stamp)) {
            Ok(()) => {
                last.insert(lba, stamp);
            }
            // A full pool may refuse a write; it must not take the pool down.
            Err(Error::NoSpace) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("writer {id}: write lba {lba}: {e}"),
        }
        if rng.random_range(0..64) == 0 {
            pool.flush()
                .unwrap_or_else(|e| panic!("writer {id}: flush: {e}"));
        }
    }
    last
}

fn pause() {
    std::thread::sleep(Duration::from_millis(30));
}

fn run(k: usize, m: usize, n: usize, seed: u64) {
    run_with(k, m, n, seed, 0)
}

/// `stripe_writers` > 0: sealed stripes are written by that many stripe writer threads (as
/// `flashpool serve` runs), not by the writers that filled them.
fn run_with(k: usize, m: usize, n: usize, seed: u64, stripe_writers: usize) {
    let what = format!("{k}+{m} on {n} drives, seed {seed}, {stripe_writers} stripe writers");
    let spares: Vec<Arc<MemDrive>> = mem_drives(n + 2, false);
    let pool = Arc::new(Pool::create(as_refs(&spares[..n]), &small_config(k, m)).unwrap());
    if stripe_writers > 0 {
        pool.start_stripe_writers(stripe_writers).unwrap();
    }
    pool.create_volume("v", VOLUME).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|id| {
            let (p, s) = (pool.clone(), stop.clone());
            std::thread::spawn(move || writer(p, id, seed, s))
        })
        .collect();
    // A watchdog: a hang fails the test instead of blocking the suite.
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let w = what.clone();
    let watchdog = std::thread::spawn(move || {
        let t0 = Instant::now();
        while !d.load(Ordering::SeqCst) {
            if t0.elapsed() > Duration::from_secs(120) {
                // The other threads are stuck: only ending the process fails the test.
                eprintln!("{w}: admin operations under load hang");
                std::process::abort();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    pause();
    // Remove the last member: with n == k + m the stripes narrow.
    pool.fail_drive(n - 1)
        .unwrap_or_else(|e| panic!("{what}: fail: {e}"));
    pool.rebuild()
        .unwrap_or_else(|e| panic!("{what}: rebuild after remove: {e}"));
    pause();
    pool.add_drive_online(spares[n].clone() as DriveRef)
        .unwrap_or_else(|e| panic!("{what}: add: {e}"));
    pause();
    pool.replace_drive(0, spares[n + 1].clone() as DriveRef)
        .unwrap_or_else(|e| panic!("{what}: replace: {e}"));
    pause();
    pool.fail_drive(1)
        .unwrap_or_else(|e| panic!("{what}: fail 1: {e}"));
    pause();
    pool.readmit_drive(1)
        .unwrap_or_else(|e| panic!("{what}: readmit 1: {e}"));
    pause();
    // Failing beyond parity is refused while the pool is degraded.
    pool.fail_drive(2)
        .unwrap_or_else(|e| panic!("{what}: fail 2: {e}"));
    let beyond = (3..n).find(|&i| pool.drives()[i].state == "active");
    if let Some(i) = beyond.filter(|_| m == 1) {
        let e = pool
            .fail_drive(i)
            .expect_err("a second failure on m = 1 must be refused");
        assert!(e.to_string().contains("parity covers"), "{what}: {e}");
    }
    pool.rebuild()
        .unwrap_or_else(|e| panic!("{what}: rebuild after the second remove: {e}"));
    pause();
    stop.store(true, Ordering::SeqCst);
    let mut last = HashMap::new();
    for w in writers {
        last.extend(
            w.join()
                .unwrap_or_else(|_| panic!("{what}: a writer panicked")),
        );
    }
    done.store(true, Ordering::SeqCst);
    watchdog.join().unwrap();
    pool.flush().unwrap();
    assert!(
        !pool.needs_rebuild(),
        "{what}: lost members left after the rebuilds"
    );
    let vol = pool.volume("v").unwrap();
    let mut b = vec![0u8; 4096];
    for (lba, stamp) in &last {
        vol.read(lba * 4096, &mut b).unwrap();
        assert!(
            b == block_for(*stamp),
            "{what}: block {lba} is not its last write"
        );
    }
    // And after a reopen from the drives still in the pool.
    pool.close().unwrap();
    drop(vol);
    let present: Vec<DriveRef> = spares.iter().map(|d| d.clone() as DriveRef).collect();
    let pool = Pool::open(present).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
    let vol = pool.volume("v").unwrap();
    for (lba, stamp) in &last {
        vol.read(lba * 4096, &mut b).unwrap();
        assert!(b == block_for(*stamp), "{what}: block {lba} after reopen");
    }
    eprintln!("{what}: {} blocks checked", last.len());
}

#[test]
fn member_operations_under_load_narrow_pools() {
    let seed = test_seed("admin under load (narrow)", 15);
    run(4, 1, 5, seed);
    run(3, 2, 5, seed + 1);
}

#[test]
fn member_operations_under_load_with_stripe_writers() {
    let seed = test_seed("admin under load (stripe writers)", 17);
    run_with(4, 1, 5, seed, 2);
    run_with(4, 2, 6, seed + 1, 2);
}

#[test]
fn member_operations_under_load_wide_pools() {
    let seed = test_seed("admin under load (wide)", 16);
    run(4, 1, 6, seed);
    run(2, 1, 5, seed + 1);
}
