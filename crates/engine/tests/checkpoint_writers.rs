//! Writers during a checkpoint's flush: they wait for its snapshot, not for the flush (on file
//! drives the first flush after a long write can take most of a second), and a crash while the
//! flush is still in progress, with their writes in the log after the checkpoint's stripes,
//! leaves a pool that opens with everything flushed before it.

mod common;

use common::*;
use flashpool_engine::drive::{CrashFate, DriveRef, MemDrive};
use flashpool_engine::{Compression, Pool, PoolConfig};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// Block `lba`'s contents as write `tag` left it.
fn block(tag: u64, lba: u64) -> Vec<u8> {
    block_for(tag << 32 | lba)
}

/// Blocks of the first write (flushed before the checkpoint) and of the second (during it).
const FIRST: u64 = 48;
const SECOND: u64 = 96;

#[test]
fn writers_go_on_while_a_checkpoint_flushes_and_a_crash_then_loses_nothing_flushed() {
    let seed = test_seed("checkpoint_writers", 5);
    let mems = mem_drives(5, true);
    let gate = Arc::new(Gate::default());
    let drives: Vec<DriveRef> = mems
        .iter()
        .map(|m| GatedDrive::new(m.clone(), None, Some(gate.clone())) as DriveRef)
        .collect();
    let cfg = PoolConfig {
        // No checkpoint but the ones this test takes.
        checkpoint_interval: 64 << 20,
        ..small_config(4, 1)
    };
    let pool = Arc::new(Pool::create(drives, &cfg).unwrap());
    pool.create_volume_with("v", 16 << 20, Compression::Off)
        .unwrap();
    let v = pool.volume("v").unwrap();
    // One checkpoint with the gate open: the log is stamped from then on, as in every pool
    // this build has checkpointed (an unstamped one holds writers to the end).
    pool.checkpoint().unwrap();
    for lba in 0..FIRST {
        v.write(lba * 4096, &block(1, lba)).unwrap();
    }
    pool.flush().unwrap();

    gate.set(true);
    let cp = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.checkpoint())
    };
    while gate.waiting.load(Ordering::SeqCst) == 0 {
        assert!(!cp.is_finished(), "the checkpoint ended without flushing");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The checkpoint's flush is held at the gate: a write of several stripes goes on.
    let (tx, rx) = mpsc::channel();
    let writer = {
        let v = pool.volume("v").unwrap();
        std::thread::spawn(move || {
            for lba in FIRST..FIRST + SECOND {
                v.write(lba * 4096, &block(2, lba)).unwrap();
            }
            tx.send(()).unwrap();
        })
    };
    // Not a timing: without the change the write waits for the gate, which opens only after.
    let done = rx.recv_timeout(Duration::from_secs(60));
    let waiting = gate.waiting.load(Ordering::SeqCst);

    // A crash now, each write since the last flush kept, lost or torn by the seed.
    let mut x = seed | 1;
    let crashed: Vec<Arc<MemDrive>> = mems
        .iter()
        .map(|m| {
            Arc::new(m.crash(|_, sectors| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                match x % 3 {
                    0 => CrashFate::Persisted,
                    1 => CrashFate::Lost,
                    _ => CrashFate::Torn((x >> 8) as usize % sectors.max(1)),
                }
            }))
        })
        .collect();
    gate.set(false);
    writer.join().unwrap();
    cp.join().unwrap().unwrap();
    assert!(
        done.is_ok(),
        "seed {seed}: a write waited for the checkpoint's flush ({waiting} flushes at the gate)"
    );

    let after = Pool::open(as_refs(&crashed)).unwrap();
    let v2 = after.volume("v").unwrap();
    let mut buf = vec![0u8; 4096];
    for lba in 0..FIRST {
        v2.read(lba * 4096, &mut buf).unwrap();
        assert!(
            buf == block(1, lba),
            "seed {seed}: flushed block {lba} lost"
        );
    }
    for lba in FIRST..FIRST + SECOND {
        // Never flushed: there or not, but never anything else.
        v2.read(lba * 4096, &mut buf).unwrap();
        assert!(
            buf == block(2, lba) || buf.iter().all(|&b| b == 0),
            "seed {seed}: block {lba} written during the checkpoint reads neither its data nor zeros"
        );
    }
    drop(after);

    // Without a crash everything is there, after a reopen too.
    pool.flush().unwrap();
    for lba in 0..FIRST + SECOND {
        v.read(lba * 4096, &mut buf).unwrap();
        let tag = if lba < FIRST { 1 } else { 2 };
        assert!(buf == block(tag, lba), "block {lba}");
    }
    let v_drop = v;
    drop(v_drop);
    let pool = Arc::try_unwrap(pool).ok().expect("the only handle");
    drop(pool);
    let reopened = Pool::open(as_refs(&mems)).unwrap();
    let v3 = reopened.volume("v").unwrap();
    for lba in 0..FIRST + SECOND {
        v3.read(lba * 4096, &mut buf).unwrap();
        let tag = if lba < FIRST { 1 } else { 2 };
        assert!(buf == block(tag, lba), "block {lba} after reopen");
    }
}
