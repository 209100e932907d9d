//! Degraded reads: every single missing drive (and every pair with m = 2) still serves every
//! block; failing and corrupting drives are treated as erasures and counted.

mod common;

use common::*;
use flashpool_engine::drive::{Drive, DriveRef, FaultDrive, FaultSwitch, MemDrive};
use flashpool_engine::{Compression, Pool};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Writes a workload with full and narrow stripes (its blocks compress); returns the expected
/// contents.
fn fill(pool: &Pool) -> HashMap<u64, u64> {
    fill_with(pool, Compression::Lz4)
}

fn fill_with(pool: &Pool, compression: Compression) -> HashMap<u64, u64> {
    pool.create_volume_with("v", 4 << 20, compression).unwrap();
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

/// The whole volume in one read and in ranges of odd sizes read together: the lost blocks
/// of a request are rebuilt together, a span of each chunk at a time.
fn verify_large(pool: &Pool, expect: &HashMap<u64, u64>, what: &str) {
    let vol = pool.volume("v").unwrap();
    let mut want = vec![0u8; 1024 * 4096];
    for (lba, s) in expect {
        want[*lba as usize * 4096..(*lba as usize + 1) * 4096].copy_from_slice(&block_for(*s));
    }
    let mut all = vec![0u8; want.len()];
    vol.read(0, &mut all)
        .unwrap_or_else(|e| panic!("{what}: the whole volume in one read: {e}"));
    for lba in 0..1024 {
        assert!(
            all[lba * 4096..(lba + 1) * 4096] == want[lba * 4096..(lba + 1) * 4096],
            "{what}: block {lba} wrong in the whole-volume read"
        );
    }
    let mut parts: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut lba = 0u64;
    for n in [1u64, 37, 5, 256, 2, 100].iter().cycle() {
        if lba >= 1024 {
            break;
        }
        let n = (*n).min(1024 - lba);
        parts.push((lba, vec![0u8; n as usize * 4096]));
        lba += n;
    }
    let res = {
        let mut reads: Vec<(u64, &mut [u8])> = parts
            .iter_mut()
            .map(|(lba, b)| (*lba * 4096, &mut b[..]))
            .collect();
        vol.read_many(&mut reads)
    };
    for ((lba, b), r) in parts.iter().zip(res) {
        r.unwrap_or_else(|e| panic!("{what}: range at block {lba}: {e}"));
        let at = *lba as usize * 4096;
        assert!(
            b[..] == want[at..at + b.len()],
            "{what}: range at block {lba} wrong"
        );
    }
}

/// `n` memory drives under fault-injecting wrappers: the drives, the wrappers, their switches.
fn fault_drives(n: usize) -> (Vec<Arc<MemDrive>>, Vec<DriveRef>, Vec<Arc<FaultSwitch>>) {
    let mems = mem_drives(n, false);
    let mut switches = vec![];
    let drives = mems
        .iter()
        .map(|d| {
            let (f, s) = FaultDrive::new(d.clone() as DriveRef);
            switches.push(s);
            f as DriveRef
        })
        .collect();
    (mems, drives, switches)
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
            let what = format!("{k}+{m} without drives {missing:?}");
            verify(&pool, &expect, &what);
            verify_large(&pool, &expect, &what);
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
        let (mems, drives, switches) = fault_drives(5);
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

/// Two parities, one drive failed and another returning rotten data: a lost block's rebuild
/// from the same bytes of the other chunks meets the rot, fails the block's CRC tag, and the
/// block is rebuilt again from the whole stripe, every chunk checked. Blocks stored raw and
/// compressed.
#[test]
fn a_lost_drive_and_a_lying_one_with_two_parities() {
    for (lost, lying, compression) in [
        (0, 1, Compression::Off),
        (2, 4, Compression::Off),
        (3, 0, Compression::Lz4),
    ] {
        let (_, drives, switches) = fault_drives(5);
        let pool = Pool::create(drives, &small_config(3, 2)).unwrap();
        let expect = fill_with(&pool, compression);
        pool.fail_drive(lost).unwrap();
        switches[lying].corrupt_reads.store(true, Ordering::SeqCst);
        let what = format!("drive {lost} failed, drive {lying} lying, {compression:?}");
        verify_large(&pool, &expect, &what);
        verify(&pool, &expect, &what);
        let s = pool.stats();
        assert!(s.crc_errors > 0 && s.degraded_reads > 0, "{what}: {s:?}");
        assert_eq!(s.unrecoverable_blocks, 0, "{what}: {s:?}");
    }
}

/// A pool opened with no more members in service than parity chunks serves reads only; putting
/// a failed member back (`readmit_drive`) makes it take writes again, and that survives a
/// restart. Before, the readmit answered Ok but changed nothing lasting: a read-only pool
/// writes no superblocks, so the member came back failed at the next open and the pool stayed
/// read-only for good (found through the CLI: `drive readmit 0` printed "back in service").
#[test]
fn a_pool_short_of_members_takes_writes_again_once_one_is_readmitted() {
    let mems = mem_drives(4, false);
    let pool = Pool::create(as_refs(&mems), &small_config(2, 2)).unwrap();
    let expect = fill_with(&pool, Compression::Off);
    // Two members out, one after the other: the first one's superblock misses two updates
    // and is set aside at the next open, the second's misses one and is attached, failed.
    pool.fail_drive(0).unwrap();
    pool.fail_drive(1).unwrap();
    drop(pool); // writes need m + 1 = 3 members: nothing more can be checkpointed
    let pool = Pool::open(as_refs(&mems)).unwrap();
    let why = pool
        .read_only_reason()
        .expect("read-only with 2 of 4 members");
    assert!(why.contains("only 2 drives present"), "{why}");
    verify(&pool, &expect, "read-only, 2 members down");
    let vol = pool.volume("v").unwrap();
    assert!(vol.write(0, &block_for(9000)).is_err(), "read-only");

    pool.readmit_drive(1).unwrap();
    assert_eq!(pool.read_only_reason(), None, "3 members in service");
    let mut expect = expect;
    vol.write(0, &block_for(9000)).unwrap();
    expect.insert(0, 9000);
    pool.flush().unwrap();
    verify(&pool, &expect, "member 1 readmitted");
    pool.close().unwrap();
    drop(pool);

    let pool = Pool::open(as_refs(&mems)).unwrap();
    assert_eq!(pool.read_only_reason(), None, "after a restart");
    let states: Vec<String> = pool.drives().iter().map(|d| d.state.to_string()).collect();
    assert_eq!(states[1], "active", "member 1 stays in service: {states:?}");
    verify(&pool, &expect, "member 1 readmitted, restarted");
}

/// The same while running: once failures leave no more members in service than parity
/// chunks, the pool turns read-only (writes fail with the reason, a close does not try to
/// checkpoint), and readmitting a member makes it writable again.
#[test]
fn a_running_pool_left_short_of_members_is_read_only_until_one_is_readmitted() {
    let mems = mem_drives(4, false);
    let pool = Pool::create(as_refs(&mems), &small_config(2, 2)).unwrap();
    let mut expect = fill_with(&pool, Compression::Off);
    pool.fail_drive(0).unwrap();
    assert_eq!(pool.read_only_reason(), None, "3 of 4 members: writable");
    pool.fail_drive(1).unwrap();
    let why = pool
        .read_only_reason()
        .expect("read-only with 2 of 4 members");
    assert!(why.contains("only 2 drives in service"), "{why}");
    let vol = pool.volume("v").unwrap();
    assert!(vol.write(0, &block_for(9000)).is_err(), "read-only");
    verify(&pool, &expect, "read-only, 2 members down");

    pool.readmit_drive(1).unwrap();
    assert_eq!(pool.read_only_reason(), None, "3 members in service");
    vol.write(0, &block_for(9000)).unwrap();
    expect.insert(0, 9000);
    pool.flush().unwrap();
    verify(&pool, &expect, "member 1 readmitted");
    pool.close().unwrap();
    drop(pool);
    let pool = Pool::open(as_refs(&mems)).unwrap();
    assert_eq!(pool.read_only_reason(), None, "after a restart");
    verify(&pool, &expect, "member 1 readmitted, restarted");
}
