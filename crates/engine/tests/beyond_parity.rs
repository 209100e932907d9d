//! Members taken out beyond what parity covers: a forced fail succeeds (the member states are
//! in the superblocks of the members still in service) and can be undone by a readmit; a
//! rebuild never retires members whose data it could not move, nor retires its way below the
//! m + 1 members in service a stripe needs, so the lost members stay readmittable.

mod common;

use common::*;
use flashpool_engine::drive::DriveRef;
use flashpool_engine::{Error, Pool};
use std::collections::HashMap;

fn write(pool: &Pool, expect: &mut HashMap<u64, u64>, from: u64, n: u64) {
    let vol = pool.volume("v").unwrap();
    for i in from..from + n {
        let lba = (i * 7919) % 1024;
        vol.write(lba * 4096, &block_for(i)).unwrap();
        expect.insert(lba, i);
    }
    pool.flush().unwrap();
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

fn states(pool: &Pool) -> Vec<&'static str> {
    pool.drives().iter().map(|d| d.state).collect()
}

/// `POST /drives/1/fail {"force":true}` after drive 0 failed on a 4+1 pool: the fail is done
/// and recorded, and says so (it answered "superblock written to only N drives" after doing
/// it); a readmit brings the data back.
#[test]
fn a_forced_fail_beyond_parity_succeeds_and_is_recorded() {
    let mems = mem_drives(5, false);
    let pool = Pool::create(as_refs(&mems), &small_config(4, 1)).unwrap();
    pool.create_volume("v", 4 << 20).unwrap();
    let mut expect = HashMap::new();
    write(&pool, &mut expect, 1, 600);
    pool.fail_drive(0).unwrap();
    assert!(matches!(pool.fail_drive(1), Err(Error::Conflict(_))));
    pool.force_fail_drive(1)
        .expect("a forced fail beyond parity succeeds");
    assert_eq!(
        states(&pool),
        ["failed", "failed", "active", "active", "active"]
    );
    // Recorded in the superblocks of the members in service.
    use flashpool_engine::format::superblock::{MEMBER_ACTIVE, MEMBER_FAILED};
    for d in &mems[2..] {
        let sb = flashpool_engine::read_superblock(&(d.clone() as DriveRef)).unwrap();
        assert_eq!(
            sb.member_state,
            [
                MEMBER_FAILED,
                MEMBER_FAILED,
                MEMBER_ACTIVE,
                MEMBER_ACTIVE,
                MEMBER_ACTIVE
            ]
        );
    }
    pool.readmit_drive(1).unwrap();
    verify(&pool, &expect, "member 1 readmitted after a forced fail");
}

/// An empty pool with members failed until fewer than m + 1 are in service: the rebuild has
/// nothing to move, but retiring the lost members would leave a pool that can never write
/// again (and `readmit` refuses retired members). They stay failed, readmittable.
#[test]
fn a_rebuild_never_retires_below_the_members_a_stripe_needs() {
    for in_service in [0usize, 1] {
        let what = format!("{in_service} members in service");
        let mems = mem_drives(5, false);
        let pool = Pool::create(as_refs(&mems), &small_config(4, 1)).unwrap();
        pool.create_volume("v", 4 << 20).unwrap();
        pool.fail_drive(0).unwrap();
        for i in 1..5 - in_service {
            pool.force_fail_drive(i).unwrap();
        }
        assert!(pool.rebuild().is_err(), "{what}: rebuild refused");
        assert!(pool.needs_rebuild(), "{what}");
        let st = states(&pool);
        assert!(!st.contains(&"retired"), "{what}: {st:?}");
        for i in 0..5 - in_service {
            pool.readmit_drive(i)
                .unwrap_or_else(|e| panic!("{what}: readmit {i}: {e}"));
        }
        let mut expect = HashMap::new();
        write(&pool, &mut expect, 1, 300);
        verify(&pool, &expect, &what);
    }
}

/// Down to exactly m + 1 members in service, an empty pool's lost members are retired: the
/// pool writes 1+1 stripes and is protected again (a minimal pool's rebuild after one loss
/// ends the same way).
#[test]
fn an_empty_pool_retires_down_to_m_plus_1_members() {
    let mems = mem_drives(5, false);
    let pool = Pool::create(as_refs(&mems), &small_config(4, 1)).unwrap();
    pool.create_volume("v", 4 << 20).unwrap();
    pool.fail_drive(0).unwrap();
    for i in 1..3 {
        pool.force_fail_drive(i).unwrap();
    }
    pool.rebuild().unwrap();
    assert!(!pool.needs_rebuild());
    assert_eq!(
        states(&pool),
        ["retired", "retired", "retired", "active", "active"]
    );
    assert_eq!(pool.info().member_drives, 2);
    let mut expect = HashMap::new();
    write(&pool, &mut expect, 1, 300);
    pool.fail_drive(4).unwrap();
    verify(&pool, &expect, "2 members, one lost");
}

/// A rebuild with more members lost than parity covers cannot move the data that was on
/// them: it fails and retires none of them; a readmit brings the data back and a rebuild
/// then retires the one still lost.
#[test]
fn a_rebuild_beyond_parity_retires_nothing_it_could_not_move() {
    let mems = mem_drives(5, false);
    let pool = Pool::create(as_refs(&mems), &small_config(4, 1)).unwrap();
    pool.create_volume("v", 4 << 20).unwrap();
    let mut expect = HashMap::new();
    write(&pool, &mut expect, 1, 1500);
    pool.fail_drive(0).unwrap();
    pool.force_fail_drive(1).unwrap();
    assert!(pool.rebuild().is_err());
    let st = states(&pool);
    assert!(!st.contains(&"retired"), "{st:?}");
    pool.readmit_drive(1).unwrap();
    verify(&pool, &expect, "member 1 readmitted");
    pool.rebuild().unwrap();
    assert_eq!(
        states(&pool),
        ["retired", "active", "active", "active", "active"]
    );
    verify(&pool, &expect, "member 0 rebuilt");
}
