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
    fill_up_to(pool, u64::MAX)
}

/// `fill`, stopping after `most` blocks.
fn fill_up_to(pool: &Pool, most: u64) -> HashMap<u64, u64> {
    let vol = pool.volume("v").unwrap();
    let blocks = (vol.size() / 4096).min(most);
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

/// A rebuild cut short (`kill -9`, a power cut) at each of its steps in a pool filled to the
/// reserve: the pool reopens with the member still lost, and the next rebuild moves only what
/// still depends on it and finishes, after which the pool survives another loss. Which members a segment's stripes are on is kept by
/// checkpoints and the roll-forward, so segments the cut-short rebuild already wrote (on the
/// members left) are not moved again; when they were, a rebuild restarted in a full pool ran
/// out of room (docs/RELIABILITY.md finding 34).
#[test]
fn a_rebuild_cut_short_resumes_with_only_what_is_left() {
    // Filled to the reserve: 4+1 on five members; 2+1 on five, where a stripe does not span
    // every member. 3+2 on six with two members lost at once, 24 MiB live in 46 MiB of
    // two-down capacity (the reserve keeps room for losing one member, not two): before the
    // cleaner took back the space segments closed part-written never received, some cuts left
    // the resumed rebuild without room, and once it did, a segment the rebuild moved could be
    // the one the cleaner's stream had just taken again (docs/RELIABILITY.md findings 43, 44).
    cut_short(4, 1, 5, &[1], u64::MAX, 34);
    cut_short(2, 1, 5, &[3], u64::MAX, 36);
    cut_short(3, 2, 6, &[1, 4], 6 << 10, 35);
}

/// Fills a `k`+`m` pool on `n` members with up to `blocks` blocks (or to ENOSPC), loses the
/// members `lose`, records the rebuild and checks every cut of it.
fn cut_short(k: usize, m: usize, n: usize, lose: &[usize], blocks: u64, default_seed: u64) {
    use flashpool_engine::drive::{DriveLog, DriveOp, DriveRef, RecordingDrive};
    use rand::{RngExt, SeedableRng};
    use std::collections::BTreeSet;
    use std::sync::Arc;

    let seed = test_seed(
        &format!("a rebuild cut short, {k}+{m} on {n}, {lose:?} lost"),
        default_seed,
    );
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    let blank = mem_drives(n, false);
    let log = DriveLog::new();
    let recorded: Vec<DriveRef> = blank
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let copy = Arc::new(d.crash(|_, _| unreachable!()));
            RecordingDrive::new(copy as DriveRef, i, log.clone()) as DriveRef
        })
        .collect();
    let p = Pool::create(recorded, &small_config(k, m)).unwrap();
    p.set_rebuild_reserve(true);
    p.create_volume_with("v", 256 << 20, flashpool_engine::Compression::Off)
        .unwrap();
    let written = fill_up_to(&p, blocks);
    // What may depend on the lost members: every segment holding data (a segment's stripes
    // rotate over every member).
    let depends: BTreeSet<u32> = p
        .segments()
        .iter()
        .filter(|s| s.state == "used" || s.state == "open")
        .map(|s| s.index)
        .collect();
    let failed_at = log.len();
    for &d in lose {
        p.fail_drive(d).unwrap();
    }
    let first = p.rebuild().unwrap();
    assert!(first.total_segments <= depends.len() as u64);
    drop(p);
    let ops = log.ops();
    let segment_size = small_config(k, m).segment_size;
    let segment_of =
        |off: u64| ((off - flashpool_engine::format::superblock::DATA_START) / segment_size) as u32;

    // Cuts: after each flush (each step made durable), and inside writes, torn.
    let mut cuts: Vec<(usize, Option<usize>)> = (failed_at + 1..=ops.len())
        .filter(|&c| {
            matches!(ops[c - 1], DriveOp::Flush { .. })
                && !matches!(ops.get(c), Some(DriveOp::Flush { .. }))
        })
        .map(|c| (c, None))
        .collect();
    let writes: Vec<usize> = (failed_at..ops.len())
        .filter(|&i| matches!(ops[i], DriveOp::Write { .. }))
        .collect();
    for _ in 0..12 {
        let i = writes[rng.random_range(0..writes.len())];
        if let DriveOp::Write { data, .. } = &ops[i] {
            cuts.push((i, Some(rng.random_range(1..data.len() / 512))));
        }
    }
    // The images when the member was lost, which every cut starts from.
    let at_failure = crash_drives(&blank, &ops, failed_at, None);
    let mut resumed = 0;
    for (cut, torn) in cuts {
        let what = format!(
            "{k}+{m} on {n}, {lose:?} lost, seed {seed}: cut {cut} of {} (torn {torn:?})",
            ops.len()
        );
        // Segments the cut-short rebuild emptied and freed before the cut.
        let freed: BTreeSet<u32> = ops[failed_at..cut]
            .iter()
            .filter_map(|op| match op {
                DriveOp::Discard { offset, .. } => Some(segment_of(*offset)),
                _ => None,
            })
            .collect();
        let left = depends.difference(&freed).count() as u64;
        let pool = Pool::open(image_at(
            &at_failure,
            &ops[failed_at..],
            cut - failed_at,
            torn,
        ))
        .unwrap_or_else(|e| panic!("{what}: reopen failed: {e}"));
        pool.set_rebuild_reserve(true);
        verify(&pool, &written, &what);
        if pool.needs_rebuild() {
            let st = pool
                .rebuild()
                .unwrap_or_else(|e| panic!("{what}: the resumed rebuild failed: {e}"));
            assert!(
                st.total_segments <= left,
                "{what}: the resumed rebuild moves {} segments, at most {left} still depend on the lost member",
                st.total_segments
            );
            assert!(!pool.needs_rebuild(), "{what}");
            verify(&pool, &written, &format!("{what}, rebuilt"));
            if !freed.is_empty() {
                resumed += 1;
            }
        }
        if !pool.needs_rebuild() && cut > failed_at + 1 {
            // Rebuilt: nothing depends on the lost member any more (a segment the resumed
            // rebuild skipped that did would now be short of two chunks), so the pool
            // survives another loss.
            let other = loop {
                let o = rng.random_range(0..n);
                if !lose.contains(&o) {
                    break o;
                }
            };
            pool.fail_drive(other).unwrap();
            verify(
                &pool,
                &written,
                &format!("{what}, rebuilt, member {other} lost"),
            );
        }
    }
    assert!(
        resumed >= 3,
        "seed {seed}: only {resumed} cuts fell after the rebuild freed segments and before it finished"
    );
}

/// `Pool::room_with_members` (what `flashpool drive remove` checks a removal against) for one
/// member fewer than the pool has is the rebuild reserve's limit, and more members hold more.
#[test]
fn the_room_with_one_member_fewer_is_the_reserve_limit() {
    for (n, k, m) in [(5, 4, 1), (6, 4, 2), (4, 2, 1), (8, 6, 2), (3, 1, 1)] {
        let mems = mem_drives(n, false);
        let pool = Pool::create(as_refs(&mems), &small_config(k, m)).unwrap();
        pool.set_rebuild_reserve(true);
        assert_eq!(
            Some(pool.room_with_members(n - 1)),
            pool.info().live_limit_bytes,
            "{n} drives {k}+{m}"
        );
        assert!(
            pool.room_with_members(n) > pool.room_with_members(n - 1),
            "{n} drives {k}+{m}"
        );
        assert_eq!(
            pool.room_with_members(m),
            0,
            "no stripe fits on {m} members"
        );
    }
}
