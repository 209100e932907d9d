//! Stripes that queue up for the stripe writers go out together: a drive's chunks of
//! consecutive stripes as one gathered write (a vectored write on the io_uring of file
//! drives). What must hold: the merge happens when the drives lag, every block reads back
//! (now and after a reopen), and a gathered write that fails loses each of its chunks on that
//! drive only, which parity covers.

mod common;

use common::*;
use flashpool_engine::drive::{DriveRef, MemDrive};
use flashpool_engine::{Compression, Pool, PoolConfig};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A memory drive whose writes wait at `gate` (its own) and fail while `fail` is set.
fn gated(name: &str) -> (Arc<GatedDrive>, Arc<Gate>) {
    let gate = Arc::new(Gate::default());
    let d = GatedDrive::new(
        Arc::new(MemDrive::new(DRIVE_SIZE, name)),
        Some(gate.clone()),
        None,
    );
    (d, gate)
}

/// Blocks of one full stripe of `config()`: 4 data chunks of 16 KiB.
const STRIPE_BLOCKS: u64 = 16;

fn config() -> PoolConfig {
    PoolConfig {
        // No checkpoint during the test's writes (its stripes would sit in the queue too).
        checkpoint_interval: 64 << 20,
        ..small_config(4, 1)
    }
}

/// Writes `blocks` blocks of `seed`'s data from another thread while `gate` holds the stripe
/// writer's first batch, until the writer thread has sealed six stripes (so at least five
/// wait in the queue) and stops getting anywhere (every stripe buffer in use); then opens the
/// gate and waits for the writes. Returns, when the writer got stuck, whether the volume said
/// then that a write would wait (`write_would_wait_now`).
fn write_behind_a_closed_gate(
    pool: &Arc<Pool>,
    gate: &Gate,
    blocks: u64,
    seed: u64,
) -> Option<bool> {
    gate.set(true);
    let done = Arc::new(AtomicU64::new(0));
    let writer = {
        let v = pool.volume("v").unwrap();
        let done = done.clone();
        std::thread::spawn(move || {
            for lba in 0..blocks {
                v.write(lba * 4096, &noise(4096, seed ^ lba)).unwrap();
                done.store(lba + 1, Ordering::SeqCst);
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = (u64::MAX, Instant::now());
    let mut stuck = None;
    loop {
        assert!(Instant::now() < deadline, "the writer never settled");
        let now = done.load(Ordering::SeqCst);
        if now == blocks {
            break; // everything fit in the buffers: the queue is as long as it gets
        }
        if now != last.0 {
            last = (now, Instant::now());
        } else if gate.waiting.load(Ordering::SeqCst) > 0
            && now >= 6 * STRIPE_BLOCKS
            && last.1.elapsed() > Duration::from_millis(200)
        {
            stuck = Some(pool.volume("v").unwrap().write_would_wait_now());
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    gate.set(false);
    writer.join().unwrap();
    stuck
}

fn check_all(pool: &Pool, blocks: u64, seed: u64) {
    let v = pool.volume("v").unwrap();
    let mut b = vec![0u8; 4096];
    for lba in 0..blocks {
        v.read(lba * 4096, &mut b).unwrap();
        assert!(b == noise(4096, seed ^ lba), "block {lba} differs");
    }
}

#[test]
fn queued_stripes_go_out_as_one_write_per_drive_and_read_back() {
    let seed = test_seed("gathered_writes", 11);
    let dir = tempfile::tempdir().unwrap();
    // Four file drives (their writes go through io_uring where it runs) and a memory drive
    // that holds the stripe writer's batches at its gate.
    let files = file_drives(dir.path(), 4);
    let (gated_drive, gate) = gated("mem:gated");
    let mut drives = files.clone();
    drives.push(gated_drive.clone() as DriveRef);
    let pool = Arc::new(Pool::create(drives, &config()).unwrap());
    pool.create_volume_with("v", 16 << 20, Compression::Off)
        .unwrap();
    pool.start_stripe_writers(1).unwrap();
    let before = pool.stats();
    // 40 stripes of 64 KiB: more than the stripe buffers, all in the volume's first segments.
    let blocks = 40 * STRIPE_BLOCKS;
    let stuck = write_behind_a_closed_gate(&pool, &gate, blocks, seed);
    eprintln!("writer stuck behind the gate, writes said they would wait: {stuck:?}");
    // Stuck behind the gate, every stripe buffer was taken: the volume said writes would
    // wait (what a reactor asks before it runs a write itself); written out, they would not.
    assert_ne!(
        stuck,
        Some(false),
        "a writer waited for buffers, unannounced"
    );
    pool.flush().unwrap();
    assert!(!pool.volume("v").unwrap().write_would_wait_now());
    let s = pool.stats();
    let chunks = s.chunk_writes - before.chunk_writes;
    let ops = s.drive_writes - before.drive_writes;
    eprintln!("{chunks} chunk writes in {ops} drive writes");
    assert!(chunks >= 40 * 5, "{chunks} chunks for 40 stripes");
    // Five stripes or more were queued when the gate opened: the writer took them in one or
    // two batches (a segment boundary may split them), which saves five drive writes at least.
    assert!(
        ops + 5 <= chunks,
        "queued stripes were not merged: {chunks} chunks in {ops} drive writes"
    );
    check_all(&pool, blocks, seed);
    drop(pool);
    let mut again = reopen_files(dir.path(), 4);
    again.push(gated_drive.clone() as DriveRef);
    let pool = Pool::open(again).unwrap();
    check_all(&pool, blocks, seed);
}

#[test]
fn a_failed_gathered_write_loses_its_chunks_on_that_drive_only() {
    let seed = test_seed("gathered_write_fails", 12);
    let mems = mem_drives(4, false);
    let (gated_drive, gate) = gated("mem:gated");
    let mut drives = as_refs(&mems);
    drives.push(gated_drive.clone() as DriveRef);
    let pool = Arc::new(Pool::create(drives, &config()).unwrap());
    pool.create_volume_with("v", 16 << 20, Compression::Off)
        .unwrap();
    pool.start_stripe_writers(1).unwrap();
    // Every write of the gated drive fails once the gate opens: its gathered writes too.
    gated_drive.fail.store(true, Ordering::SeqCst);
    let before = pool.stats();
    let blocks = 40 * STRIPE_BLOCKS;
    write_behind_a_closed_gate(&pool, &gate, blocks, seed);
    pool.flush().unwrap();
    let s = pool.stats();
    assert!(
        s.drive_writes - before.drive_writes + 5 <= s.chunk_writes - before.chunk_writes,
        "no write was gathered"
    );
    let states: Vec<&str> = pool.drives().iter().map(|d| d.state).collect();
    assert_eq!(states, ["active", "active", "active", "active", "failed"]);
    check_all(&pool, blocks, seed);
}
