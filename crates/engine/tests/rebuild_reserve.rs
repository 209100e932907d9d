//! The rebuild reserve: with it on, hosts get ENOSPC for new blocks before live data exceeds
//! what the pool could hold after losing a member, so filling the pool to the brim and then
//! losing a member still rebuilds to full protection. (The product bug: a pool 60 % full of a
//! 4+1 default pool retried a rebuild forever on ENOSPC and ran without redundancy.)

mod common;

use common::*;
use flashpool_engine::{Error, Pool};
use std::collections::HashMap;

/// Writes distinct blocks until the pool answers ENOSPC; returns what was written.
fn fill(pool: &Pool) -> HashMap<u64, u64> {
    let vol = pool.volume("v").unwrap();
    let blocks = vol.size() / 4096;
    let mut written = HashMap::new();
    for lba in 0..blocks {
        match vol.write(lba * 4096, &block_for(lba + 1)) {
            Ok(()) => {
                written.insert(lba, lba + 1);
            }
            Err(Error::NoSpace) => break,
            Err(e) => panic!("write {lba}: {e}"),
        }
    }
    pool.flush().unwrap();
    written
}

fn verify(pool: &Pool, written: &HashMap<u64, u64>, what: &str) {
    let vol = pool.volume("v").unwrap();
    let mut b = vec![0u8; 4096];
    for (lba, stamp) in written {
        vol.read(lba * 4096, &mut b).unwrap();
        assert!(b == block_for(*stamp), "{what}: block {lba}");
    }
}

fn pool(k: usize, m: usize, n: usize, reserve: bool) -> Pool {
    let p = Pool::create(as_refs(&mem_drives(n, false)), &small_config(k, m)).unwrap();
    p.set_rebuild_reserve(reserve);
    // Thin: far larger than the pool, so the pool fills first.
    p.create_volume_with("v", 256 << 20, flashpool_engine::Compression::Off)
        .unwrap();
    p
}

#[test]
fn a_full_pool_with_the_reserve_rebuilds_a_lost_member() {
    for (k, m, n) in [(4, 1, 5), (3, 1, 5), (2, 2, 5), (4, 1, 6)] {
        let what = format!("{k}+{m} on {n}");
        let p = pool(k, m, n, true);
        let limit = p
            .info()
            .live_limit_bytes
            .expect("a limit with the reserve on");
        let written = fill(&p);
        let live = p.info().live_bytes;
        assert!(
            live <= limit,
            "{what}: {live} live bytes past the limit {limit}"
        );
        assert!(
            live + (2 << 20) > limit / 2,
            "{what}: ENOSPC long before the limit ({live} of {limit})"
        );
        // Overwrites of written blocks still succeed at the limit.
        let vol = p.volume("v").unwrap();
        vol.write(0, &block_for(1))
            .expect("an overwrite at the limit");
        p.fail_drive(1).unwrap();
        let st = p
            .rebuild()
            .unwrap_or_else(|e| panic!("{what}: rebuild of a full pool: {e}"));
        assert!(!p.needs_rebuild(), "{what}");
        verify(&p, &written, &what);
        eprintln!(
            "{what}: {} MiB live at ENOSPC (limit {} MiB), rebuilt {} segments",
            live >> 20,
            limit >> 20,
            st.total_segments
        );
    }
}

#[test]
fn without_the_reserve_a_full_pool_cannot_rebuild() {
    let on = fill(&pool(4, 1, 5, true)).len();
    let p = pool(4, 1, 5, false);
    assert_eq!(p.info().live_limit_bytes, None);
    let written = fill(&p);
    assert!(
        written.len() > on,
        "reserve off stored {}, on {on}",
        written.len()
    );
    // What the reserve prevents: the lost member's data has nowhere to go.
    p.fail_drive(1).unwrap();
    assert!(matches!(p.rebuild(), Err(Error::NoSpace)));
    let st = p.rebuild_status();
    assert_eq!(st.failed_attempts, 1);
    assert!(st.last_error.unwrap().contains("no space"));
    verify(&p, &written, "degraded, rebuild refused");
}
