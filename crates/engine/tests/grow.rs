//! Drive add: capacity grows at once, new stripes use the new drive (wider), old data stays
//! readable and the cleaner moves it into wide stripes over time.

mod common;

use common::*;
use flashpool_engine::drive::{Drive, DriveRef, MemDrive};
use flashpool_engine::{Compression, Pool};
use std::collections::HashMap;
use std::sync::Arc;

fn nonzero_blocks(d: &MemDrive) -> usize {
    let mut b = vec![0u8; 1 << 20];
    let mut n = 0;
    for off in ((1u64 << 20)..d.info().size).step_by(1 << 20) {
        d.read_at(off, &mut b).unwrap();
        n += b.chunks(4096).filter(|c| c.iter().any(|&x| x != 0)).count();
    }
    n
}

#[test]
fn add_a_drive_then_stripes_widen_and_data_survives() {
    let mems = mem_drives(4, false);
    let pool = Pool::create(as_refs(&mems), &small_config(3, 1)).unwrap();
    pool.create_volume_with("v", 4 << 20, Compression::Off)
        .unwrap();
    let vol = pool.volume("v").unwrap();
    let mut expect = HashMap::new();
    for i in 0..800u64 {
        vol.write((i % 1000) * 4096, &block_for(i)).unwrap();
        expect.insert(i % 1000, i);
    }
    let before = pool.info();
    pool.close().unwrap();
    drop(vol);
    drop(pool);

    let new = Arc::new(MemDrive::new(DRIVE_SIZE, "mem:new"));
    let pool = Pool::add_drive(as_refs(&mems), new.clone() as DriveRef).unwrap();
    let after = pool.info();
    assert_eq!((after.drive_count, after.k), (5, 4), "{after:?}");
    assert!(
        after.capacity_bytes > before.capacity_bytes,
        "{before:?} -> {after:?}"
    );
    let check = |pool: &Pool, expect: &HashMap<u64, u64>, what: &str| {
        let vol = pool.volume("v").unwrap();
        let mut b = vec![0u8; 4096];
        for (l, s) in expect {
            vol.read(l * 4096, &mut b).unwrap();
            assert!(b == block_for(*s), "{what}: block {l}");
        }
    };
    check(&pool, &expect, "after add");
    let vol = pool.volume("v").unwrap();
    let full_before = pool.stats().full_stripes;
    for i in 1000..1600u64 {
        vol.write((i % 1000) * 4096, &block_for(i)).unwrap();
        expect.insert(i % 1000, i);
    }
    pool.flush().unwrap();
    assert!(pool.stats().full_stripes > full_before);
    assert!(
        nonzero_blocks(&new) > 100,
        "new stripes must use the new drive"
    );
    pool.gc(usize::MAX).unwrap();
    check(&pool, &expect, "after cleaning");
    pool.close().unwrap();
    drop(vol);
    drop(pool);
    let mut all = as_refs(&mems);
    all.push(new as DriveRef);
    let pool = Pool::open(all).unwrap();
    assert_eq!(pool.info().k, 4);
    check(&pool, &expect, "after reopen");
}

/// Online: a drive joins while another thread keeps writing; nothing written is lost, and the
/// pool reopens with the new member.
#[test]
fn add_a_drive_online_under_writes() {
    let mems = mem_drives(4, false);
    let pool = Arc::new(Pool::create(as_refs(&mems), &small_config(3, 1)).unwrap());
    pool.create_volume_with("v", 4 << 20, Compression::Lz4)
        .unwrap();
    let writer = {
        let pool = pool.clone();
        std::thread::spawn(move || {
            let vol = pool.volume("v").unwrap();
            for i in 0..3000u64 {
                vol.write((i % 1000) * 4096, &block_for(i)).unwrap();
            }
            pool.flush().unwrap();
        })
    };
    let new = Arc::new(MemDrive::new(DRIVE_SIZE, "mem:new"));
    pool.add_drive_online(new.clone() as DriveRef).unwrap();
    writer.join().unwrap();
    assert_eq!((pool.info().drive_count, pool.info().k), (5, 4));
    let vol = pool.volume("v").unwrap();
    let mut b = vec![0u8; 4096];
    for l in 0..1000u64 {
        vol.read(l * 4096, &mut b).unwrap();
        assert!(b == block_for(2000 + l), "block {l}");
    }
    pool.close().unwrap();
    drop(vol);
    let mut all = as_refs(&mems);
    all.push(new as DriveRef);
    drop(pool);
    let pool = Pool::open(all).unwrap();
    assert_eq!(pool.info().drive_count, 5);
    let vol = pool.volume("v").unwrap();
    for l in 0..1000u64 {
        vol.read(l * 4096, &mut b).unwrap();
        assert!(b == block_for(2000 + l), "block {l} after reopen");
    }
}

/// A drive that refuses writes is not added: the pool keeps its members (a checkpoint and a
/// reopen without the drive work), and a healthy drive can be added afterwards.
#[test]
fn a_drive_that_fails_its_superblock_write_is_not_added() {
    use flashpool_engine::drive::FaultDrive;
    use std::sync::atomic::Ordering;
    let mems = mem_drives(3, false);
    let pool = Pool::create(as_refs(&mems), &small_config(2, 1)).unwrap();
    pool.create_volume_with("v", 1 << 20, Compression::Off)
        .unwrap();
    let vol = pool.volume("v").unwrap();
    vol.write(0, &block_for(1)).unwrap();
    let (bad, switch) = FaultDrive::new(Arc::new(MemDrive::new(DRIVE_SIZE, "mem:bad")) as DriveRef);
    switch.fail_writes.store(true, Ordering::SeqCst);
    assert!(pool.add_drive_online(bad as DriveRef).is_err());
    assert_eq!(pool.drives().len(), 3);
    assert_eq!(pool.info().drive_count, 3);
    pool.checkpoint().unwrap();
    pool.close().unwrap();
    drop(vol);
    drop(pool);

    let pool = Pool::open(as_refs(&mems)).unwrap();
    assert_eq!(pool.info().drive_count, 3);
    let good = Arc::new(MemDrive::new(DRIVE_SIZE, "mem:good"));
    pool.add_drive_online(good.clone() as DriveRef).unwrap();
    assert_eq!(pool.info().drive_count, 4);
    let mut b = vec![0u8; 4096];
    pool.volume("v").unwrap().read(0, &mut b).unwrap();
    assert!(b == block_for(1));
    pool.close().unwrap();
    drop(pool);
    let mut all = as_refs(&mems);
    all.push(good as DriveRef);
    let pool = Pool::open(all).unwrap();
    assert_eq!(pool.info().drive_count, 4);
}
