//! Degraded reads: every single missing drive (and every pair with m = 2) still serves every
//! block; failing and corrupting drives are treated as erasures and counted.

mod common;

use common::*;
use flashpool_engine::drive::{Drive, DriveRef, FaultDrive, MemDrive};
use flashpool_engine::Pool;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Writes a workload with full and narrow stripes; returns the expected contents.
fn fill(pool: &Pool) -> HashMap<u64, u64> {
    pool.create_volume("v", 4 << 20).unwrap();
    let vol = pool.volume("v").unwrap();
    let mut expect = HashMap::new();
    for i in 0..700u64 {
        let lba = (i * 13) % 1024;
        vol.write(lba * 4096, &block_for(i)).unwrap();
        expect.insert(lba, i);
        if i % 97 == 0 {
            pool.flush().unwrap(); // narrow stripes
        }
    }
    vol.trim(100 * 4096, 50 * 4096).unwrap();
    for l in 100..150 {
        expect.remove(&l);
    }
    pool.flush().unwrap();
    expect
}

fn verify(pool: &Pool, expect: &HashMap<u64, u64>, what: &str) {
    let vol = pool.volume("v").unwrap();
    let mut b = vec![0u8; 4096];
    for lba in 0..1024u64 {
        vol.read(lba * 4096, &mut b)
            .unwrap_or_else(|e| panic!("{what}: read of block {lba} failed: {e}"));
        match expect.get(&lba) {
            Some(s) => assert!(b == block_for(*s), "{what}: block {lba} wrong"),
            None => assert!(
                b.iter().all(|&x| x == 0),
                "{what}: block {lba} should be zero"
            ),
        }
    }
}

fn copies(drives: &[Arc<MemDrive>]) -> Vec<Arc<MemDrive>> {
    drives
        .iter()
        .map(|d| Arc::new(d.crash(|_, _| unreachable!())))
        .collect()
}

#[test]
fn every_missing_drive_and_every_pair() {
    for (k, m) in [(4, 1), (3, 2)] {
        let drives = mem_drives(5, false);
        let pool = Pool::create(as_refs(&drives), &small_config(k, m)).unwrap();
        let expect = fill(&pool);
        // A clean close: the data is in the checkpoint, so a degraded open reads it by
        // reconstruction (a crash instead would have recovery rewrite the replayed stripes).
        pool.close().unwrap();
        drop(pool);
        let mut sets: Vec<Vec<usize>> = (0..5).map(|d| vec![d]).collect();
        if m == 2 {
            for a in 0..5 {
                for b in a + 1..5 {
                    sets.push(vec![a, b]);
                }
            }
        }
        for missing in sets {
            let c = copies(&drives);
            let present: Vec<DriveRef> = (0..5)
                .filter(|i| !missing.contains(i))
                .map(|i| c[i].clone() as DriveRef)
                .collect();
            let pool =
                Pool::open(present).unwrap_or_else(|e| panic!("{k}+{m} without {missing:?}: {e}"));
            verify(
                &pool,
                &expect,
                &format!("{k}+{m} without drives {missing:?}"),
            );
            assert!(
                pool.stats().degraded_reads > 0,
                "{k}+{m} without {missing:?}: {:?}",
                pool.stats()
            );
            // Still writable while degraded, and the writes survive a reopen.
            let vol = pool.volume("v").unwrap();
            vol.write(0, &block_for(999_999)).unwrap();
            pool.close().unwrap();
        }
        // One more missing drive than parity covers is a clear error.
        let c = copies(&drives);
        let present: Vec<DriveRef> = c
            .iter()
            .skip(m + 1)
            .map(|d| d.clone() as DriveRef)
            .collect();
        let err = Pool::open(present)
            .err()
            .expect("too many missing drives must fail");
        assert!(err.to_string().contains("missing"), "{err}");
    }
}

#[test]
fn failing_and_corrupting_drives_are_erasures() {
    for bad in 0..5 {
        let mems = mem_drives(5, false);
        let mut switches = vec![];
        let drives: Vec<DriveRef> = mems
            .iter()
            .map(|d| {
                let (f, s) = FaultDrive::new(d.clone() as DriveRef);
                switches.push(s);
                f as DriveRef
            })
            .collect();
        let pool = Pool::create(drives, &small_config(4, 1)).unwrap();
        let expect = fill(&pool);
        switches[bad].corrupt_reads.store(true, Ordering::SeqCst);
        verify(&pool, &expect, &format!("drive {bad} corrupting"));
        let s = pool.stats();
        assert!(s.crc_errors > 0 && s.degraded_reads > 0, "{s:?}");
        switches[bad].corrupt_reads.store(false, Ordering::SeqCst);
        switches[bad].fail_reads.store(true, Ordering::SeqCst);
        verify(&pool, &expect, &format!("drive {bad} failing reads"));
        assert!(pool.stats().read_errors > 0);
        // A drive that also fails writes is dropped; the pool keeps writing narrower stripes.
        switches[bad].set_dead(true);
        let vol = pool.volume("v").unwrap();
        for i in 0..200u64 {
            vol.write((i % 64) * 4096, &block_for(5000 + i)).unwrap();
        }
        pool.flush().unwrap();
        assert_eq!(pool.info().healthy_drives, 4);
        let mut b = vec![0u8; 4096];
        vol.read(63 * 4096, &mut b).unwrap();
        assert!(b == block_for(5000 + 191));
        let _ = mems[bad].info();
    }
}
