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
