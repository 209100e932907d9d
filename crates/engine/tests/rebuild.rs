//! Drive loss and rebuild: the pool stays online and writable after a drive dies, the rebuild
//! relocates only live data away from it and retires it, after which the pool survives m more
//! failures; with m = 2 a second failure during the rebuild still serves every block.

mod common;

use common::*;
use flashpool_engine::drive::{DriveRef, FaultDrive, FaultSwitch, MemDrive};
use flashpool_engine::Pool;
use std::collections::HashMap;
use std::sync::Arc;

fn faulty(n: usize) -> (Vec<Arc<MemDrive>>, Vec<DriveRef>, Vec<Arc<FaultSwitch>>) {
    let mems = mem_drives(n, false);
    let mut sw = vec![];
    let drives = mems
        .iter()
        .map(|m| {
            let (f, s) = FaultDrive::new(m.clone() as DriveRef);
            sw.push(s);
            f as DriveRef
        })
        .collect();
    (mems, drives, sw)
}

fn verify(pool: &Pool, expect: &HashMap<u64, u64>, what: &str) {
    let vol = pool.volume("v").unwrap();
    let mut b = vec![0u8; 4096];
    for lba in 0..1024u64 {
        vol.read(lba * 4096, &mut b)
            .unwrap_or_else(|e| panic!("{what}: block {lba}: {e}"));
        match expect.get(&lba) {
            Some(s) => assert!(b == block_for(*s), "{what}: block {lba} wrong"),
            None => assert!(b.iter().all(|&x| x == 0), "{what}: block {lba} not zero"),
        }
    }
}

fn write(pool: &Pool, expect: &mut HashMap<u64, u64>, from: u64, n: u64) {
    let vol = pool.volume("v").unwrap();
    for i in from..from + n {
        let lba = (i * 7919) % 1024;
        vol.write(lba * 4096, &block_for(i)).unwrap();
        expect.insert(lba, i);
    }
    pool.flush().unwrap();
}

#[test]
fn rebuild_retires_a_dead_drive_then_survives_another_loss() {
    let (mems, drives, sw) = faulty(5);
    let pool = Pool::create(drives.clone(), &small_config(4, 1)).unwrap();
    pool.create_volume("v", 4 << 20).unwrap();
    let mut expect = HashMap::new();
    write(&pool, &mut expect, 1, 1500);
    sw[1].set_dead(true);
    pool.fail_drive(1).unwrap();
    assert!(pool.needs_rebuild());
    // Online and writable while degraded.
    write(&pool, &mut expect, 5000, 300);
    verify(&pool, &expect, "degraded");
    let st = pool.rebuild().unwrap();
    assert!(
        st.total_segments > 0 && st.done_segments == st.total_segments,
        "{st:?}"
    );
    assert!((st.percent() - 100.0).abs() < 1e-9);
    assert!(!pool.needs_rebuild());
    verify(&pool, &expect, "after rebuild");
    // A second failure after the rebuild is within m = 1 again.
    sw[3].set_dead(true);
    pool.fail_drive(3).unwrap();
    verify(&pool, &expect, "rebuilt drive 1 and dead drive 3");
    pool.close().unwrap();
    drop(pool);
    // Reopen without both: drive 1 is retired, drive 3 counts as the one missing drive.
    let present: Vec<DriveRef> = [0, 2, 4]
        .iter()
        .map(|&i| mems[i].clone() as DriveRef)
        .collect();
    let pool = Pool::open(present).unwrap();
    verify(&pool, &expect, "reopened without drives 1 and 3");
}

#[test]
fn second_failure_during_rebuild_with_two_parity() {
    let (_mems, drives, sw) = faulty(5);
    let pool = Arc::new(Pool::create(drives, &small_config(3, 2)).unwrap());
    pool.create_volume("v", 4 << 20).unwrap();
    let mut expect = HashMap::new();
    write(&pool, &mut expect, 1, 1500);
    sw[0].set_dead(true);
    pool.fail_drive(0).unwrap();
    let p = pool.clone();
    let rebuild = std::thread::spawn(move || p.rebuild());
    // A second drive dies while the rebuild runs: every block is still served.
    sw[4].set_dead(true);
    pool.fail_drive(4).unwrap();
    verify(&pool, &expect, "two drives down during rebuild");
    rebuild.join().unwrap().unwrap();
    // Drive 4 went down after the rebuild chose its victims; a second rebuild handles it.
    pool.rebuild().unwrap();
    assert!(!pool.needs_rebuild());
    verify(&pool, &expect, "after both rebuilds");
    write(&pool, &mut expect, 9000, 200);
    verify(&pool, &expect, "written after the rebuilds");
}

/// Which members a segment's stripes are on survives a restart, whether a checkpoint recorded
/// it (a clean close) or the roll-forward found it in the log (a crash after a flush, no
/// checkpoint since the writes): a member lost while the pool was down, or after it opened
/// again, is rebuilt from every segment with chunks on it, after which the pool survives
/// another loss. (A segment marked as not on the member would be left on it, and the second
/// loss would take two chunks of its stripes.)
#[test]
fn a_member_lost_around_a_restart_is_rebuilt_from_the_checkpoint_and_the_log() {
    for closed in [true, false] {
        for lost_while_down in [true, false] {
            let what = format!(
                "{}, member 1 lost {}",
                if closed { "closed" } else { "crashed" },
                if lost_while_down {
                    "while down"
                } else {
                    "after the restart"
                }
            );
            let mems = mem_drives(5, false);
            let cfg = flashpool_engine::PoolConfig {
                checkpoint_interval: 1 << 30,
                ..small_config(4, 1)
            };
            let pool = Pool::create(as_refs(&mems), &cfg).unwrap();
            pool.create_volume("v", 4 << 20).unwrap();
            let mut expect = HashMap::new();
            write(&pool, &mut expect, 1, 1500);
            if closed {
                pool.close().unwrap();
            }
            drop(pool);
            let pool = if lost_while_down {
                let present: Vec<DriveRef> = [0, 2, 3, 4]
                    .iter()
                    .map(|&i| mems[i].clone() as DriveRef)
                    .collect();
                Pool::open(present).unwrap()
            } else {
                let pool = Pool::open(as_refs(&mems)).unwrap();
                pool.fail_drive(1).unwrap();
                pool
            };
            assert!(pool.needs_rebuild(), "{what}");
            let st = pool.rebuild().unwrap();
            assert!(st.total_segments > 0, "{what}");
            verify(&pool, &expect, &format!("{what}: rebuilt"));
            pool.fail_drive(3).unwrap();
            verify(&pool, &expect, &format!("{what}: rebuilt, member 3 lost"));
        }
    }
}

/// A member put back in service while a rebuild of it runs is not retired when the rebuild
/// ends: stripes written since may be on it, and retiring it would drop their chunks there.
#[test]
fn a_member_readmitted_during_its_rebuild_stays_in_service() {
    let mems = mem_drives(5, false);
    let gate = Arc::new(Gate::default());
    let drives: Vec<DriveRef> = mems
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let writes = (i == 0).then(|| gate.clone());
            GatedDrive::new(m.clone(), writes, None) as DriveRef
        })
        .collect();
    let pool = Arc::new(Pool::create(drives, &small_config(4, 1)).unwrap());
    pool.create_volume("v", 4 << 20).unwrap();
    let mut expect = HashMap::new();
    write(&pool, &mut expect, 1, 1500);
    pool.fail_drive(1).unwrap();
    // The rebuild stops at its first write (moving the first segment); the member comes back
    // meanwhile.
    gate.set(true);
    let p = pool.clone();
    let rebuild = std::thread::spawn(move || p.rebuild());
    while gate.waiting.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let p = pool.clone();
    let readmit = std::thread::spawn(move || p.readmit_drive(1));
    while pool.needs_rebuild() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    gate.set(false);
    readmit.join().unwrap().unwrap();
    rebuild.join().unwrap().unwrap();
    assert_eq!(pool.drives()[1].state, "active");
    // Stripes written now are on member 1 again, and it holds its share: losing another
    // member still reads every block.
    write(&pool, &mut expect, 7000, 600);
    pool.fail_drive(3).unwrap();
    verify(
        &pool,
        &expect,
        "member 1 readmitted during its rebuild, 3 lost",
    );
}

/// What a rebuild reports as moved is the live data moved off the lost member: after a crash
/// with a member missing, the open already rewrote the stripes of the log that lack its chunk
/// (most of what it held), and the rebuild reports those bytes too, not only the few it moved
/// itself (the product bug: `drive replace` printed "(0 MiB) rebuilt" where the data on the
/// lost member had been rebuilt, by the open of the offline command).
#[test]
fn a_rebuild_reports_the_bytes_moved_off_the_lost_member_since_it_went_out() {
    let mems = mem_drives(5, false);
    let cfg = flashpool_engine::PoolConfig {
        checkpoint_interval: 1 << 30,
        ..small_config(4, 1)
    };
    let pool = Pool::create(as_refs(&mems), &cfg).unwrap();
    pool.create_volume("v", 4 << 20).unwrap();
    let mut expect = HashMap::new();
    write(&pool, &mut expect, 1, 1000);
    let live = pool.info().live_bytes;
    drop(pool); // a crash: no checkpoint covers the writes
    let present: Vec<DriveRef> = [0, 2, 3, 4]
        .iter()
        .map(|&i| mems[i].clone() as DriveRef)
        .collect();
    let pool = Pool::open(present).unwrap();
    let new = mem_drives(1, false).pop().unwrap();
    let st = pool.replace_drive(1, new as DriveRef).unwrap();
    // Every stripe had a chunk on member 1 (k + m = 5): all live data moved off it.
    assert!(
        st.moved_bytes >= live * 9 / 10 && st.moved_bytes <= live,
        "{st:?}, {live} bytes live"
    );
    assert!(
        st.moved_before_bytes > 0 && st.moved_before_bytes <= st.moved_bytes,
        "{st:?}"
    );
    verify(&pool, &expect, "replaced");
    // The next rebuild starts from zero.
    pool.fail_drive(3).unwrap();
    let st = pool.rebuild().unwrap();
    assert_eq!(st.moved_before_bytes, 0, "{st:?}");
    assert!(
        st.moved_bytes > 0 && st.moved_bytes <= pool.info().live_bytes,
        "{st:?}"
    );
    verify(&pool, &expect, "member 3 rebuilt");
}
