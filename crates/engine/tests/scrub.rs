//! Scrub and repair: bit rot at rest on one member is found by `Pool::scrub`, repaired (the
//! damaged segments' live data moved), and afterwards a second scrub is clean and the pool
//! survives the loss of another member; rot on two members of one stripe (m = 1) is reported
//! with the volume and offset of exactly the blocks lost; a host read that reconstructs a
//! rotten block queues its segment, and `repair_pending` repairs it.

mod common;

use common::*;
use flashpool_engine::drive::{Drive, FaultDrive, MemDrive};
use flashpool_engine::Pool;
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus as Rng;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const BLOCKS: u64 = 2000;

fn setup() -> (Vec<Arc<MemDrive>>, Pool) {
    let mems = mem_drives(5, false);
    let pool = Pool::create(as_refs(&mems), &small_config(4, 1)).unwrap();
    pool.create_volume_with("v", BLOCKS * 4096, flashpool_engine::Compression::Off)
        .unwrap();
    let vol = pool.volume("v").unwrap();
    for lba in 0..BLOCKS {
        vol.write(lba * 4096, &block_for(lba + 7)).unwrap();
    }
    pool.flush().unwrap();
    (mems, pool)
}

/// Flips one byte in each of `n` random 4 KiB blocks of the data area of `drive` (past the
/// superblocks, inside the part the volume's data filled).
fn rot(mems: &[Arc<MemDrive>], drive: usize, offsets: &[u64]) {
    for &off in offsets {
        let mut b = vec![0u8; 4096];
        mems[drive].read_at(off, &mut b).unwrap();
        b[100] ^= 0x5A;
        mems[drive].write_at(off, &b).unwrap();
    }
}

fn data_offsets(seed: u64, n: usize) -> Vec<u64> {
    let mut rng = Rng::seed_from_u64(seed);
    // The volume's 8 MiB of data over 4 data drives: about 2 MiB per drive from 1 MiB on.
    (0..n)
        .map(|_| (1 << 20) + rng.random_range(0..512u64) * 4096)
        .collect()
}

/// Drives over `mems` that ignore discards (as allocated drive files do): a freed segment
/// keeps its chunks until they are written over.
fn keeping_discarded(mems: &[Arc<MemDrive>]) -> Vec<flashpool_engine::drive::DriveRef> {
    mems.iter()
        .map(|m| {
            let (d, switch) = FaultDrive::new(m.clone() as flashpool_engine::drive::DriveRef);
            switch.keep_discarded.store(true, Ordering::SeqCst);
            d as flashpool_engine::drive::DriveRef
        })
        .collect()
}

fn verify(pool: &Pool, what: &str) {
    let vol = pool.volume("v").unwrap();
    let mut b = vec![0u8; 4096];
    for lba in 0..BLOCKS {
        vol.read(lba * 4096, &mut b)
            .unwrap_or_else(|e| panic!("{what}: block {lba}: {e}"));
        assert!(b == block_for(lba + 7), "{what}: block {lba}");
    }
}

#[test]
fn rot_on_one_member_is_found_repaired_and_redundancy_restored() {
    let seed = test_seed("scrub one member", 3);
    let (mems, pool) = setup();
    rot(&mems, 2, &data_offsets(seed, 12));
    let r = pool.scrub(true, None).unwrap();
    eprintln!("{r:?}");
    assert!(r.bad_chunks > 0, "rot not found: {r:?}");
    assert!(r.segments_repaired > 0, "{r:?}");
    assert!(r.unrecoverable.is_empty(), "{r:?}");
    let again = pool.scrub(false, None).unwrap();
    assert_eq!(again.bad_chunks, 0, "rot left after repair: {again:?}");
    verify(&pool, "after repair");
    // Redundancy is whole again: another member may go.
    pool.fail_drive(0).unwrap();
    verify(&pool, "after repair and the loss of drive 0");
    assert_eq!(pool.stats().repaired_segments, r.segments_repaired);
}

#[test]
fn rot_on_two_members_of_a_stripe_names_exactly_the_lost_blocks() {
    let seed = test_seed("scrub two members", 4);
    let (mems, pool) = setup();
    // The same offsets on two drives: chunks of the same stripes (segments are the same byte
    // ranges on every drive, and fill pointers stay level).
    let offs = data_offsets(seed, 4);
    rot(&mems, 1, &offs);
    rot(&mems, 2, &offs);
    let r = pool.scrub(true, None).unwrap();
    eprintln!(
        "{} bad chunks, {} unrecoverable",
        r.bad_chunks,
        r.unrecoverable.len()
    );
    assert!(!r.unrecoverable.is_empty(), "{r:?}");
    let vol = pool.volume("v").unwrap();
    let mut b = vec![0u8; 4096];
    let lost: std::collections::BTreeSet<u64> = r
        .unrecoverable
        .iter()
        .map(|(v, off)| {
            assert_eq!(v, "v");
            off / 4096
        })
        .collect();
    for lba in 0..BLOCKS {
        let res = vol.read(lba * 4096, &mut b);
        if lost.contains(&lba) {
            // A listed block is gone: the rest of a rotten chunk (its blocks' own CRCs
            // still check) is intact and not listed.
            assert!(res.is_err(), "listed block {lba} reads back: not lost");
        } else {
            res.unwrap_or_else(|e| panic!("block {lba} not listed but unreadable: {e}"));
            assert!(b == block_for(lba + 7), "block {lba} not listed but wrong");
        }
    }
    assert!(pool.stats().unrecoverable_blocks > 0);
}

#[test]
fn a_read_that_reconstructs_queues_a_repair() {
    let seed = test_seed("read repair", 5);
    let (mems, pool) = setup();
    rot(&mems, 3, &data_offsets(seed, 8));
    verify(&pool, "reads through rot");
    assert!(pool.stats().degraded_reads > 0, "no read met the rot");
    assert!(pool.repairs_pending() > 0);
    let n = pool.repair_pending().unwrap();
    assert!(n > 0);
    assert_eq!(pool.repairs_pending(), 0);
    let r = pool.scrub(false, None).unwrap();
    // Rot outside live blocks' bytes (headers, parity) may remain for the scrub to find,
    // but none under a block the reads met.
    verify(&pool, "after read repair");
    eprintln!("after read repair, scrub finds {} bad chunks", r.bad_chunks);
}

/// Segments the cleaner emptied and the writer filled again keep, past the new fill's end,
/// chunk headers of the old fill; a segment walk can step onto them. Scrub checked those old
/// stripes too: their chunks overwritten in part, they failed CRCs on undamaged drives
/// ("bad chunks" on a pool nobody touched) and, several bad per stripe, read as lost, which
/// kept their segment from the repair of real rot elsewhere in it.
#[test]
fn scrub_of_reused_segments_checks_only_their_newest_fill() {
    let seed = test_seed("scrub_of_reused_segments", 0x5c2b);
    let mems = mem_drives(5, false);
    let drives = keeping_discarded(&mems);
    let pool = Pool::create(drives, &small_config(4, 1)).unwrap();
    pool.create_volume_with("v", BLOCKS * 4096, flashpool_engine::Compression::Off)
        .unwrap();
    let vol = pool.volume("v").unwrap();
    let mut rng = Rng::seed_from_u64(seed);
    let mut stamp = vec![0u64; BLOCKS as usize];
    // Overwrites in runs of 1-24 blocks with flushes between (stripes of every width, so a
    // new fill's chunks end where an old fill's did not), until segments were reused.
    for round in 0..12_000u64 {
        let lba = rng.random_range(0..BLOCKS);
        let n = rng.random_range(1..=24u64).min(BLOCKS - lba);
        let mut buf = Vec::with_capacity(n as usize * 4096);
        for i in 0..n {
            stamp[(lba + i) as usize] = round * 64 + i + 1;
            buf.extend_from_slice(&block_for(stamp[(lba + i) as usize]));
        }
        vol.write(lba * 4096, &buf).unwrap();
        if rng.random_range(0..4) == 0 {
            pool.flush().unwrap();
        }
    }
    pool.flush().unwrap();
    assert!(
        pool.stats().gc_segments_cleaned > 0,
        "seed {seed}: segments must have been reused"
    );
    let check = pool.scrub(false, None).unwrap();
    assert_eq!(
        check.bad_chunks, 0,
        "seed {seed}: nothing was damaged: {check:?}"
    );
    assert!(check.unrecoverable.is_empty(), "seed {seed}: {check:?}");
    // Rot on one member: all of it repaired, none left for a second scrub.
    let offsets = data_offsets(seed, 200);
    rot(&mems, 2, &offsets);
    let rep = pool.scrub(true, None).unwrap();
    assert!(rep.unrecoverable.is_empty(), "seed {seed}: {rep:?}");
    let again = pool.scrub(false, None).unwrap();
    assert_eq!(
        again.bad_chunks, 0,
        "seed {seed}: left after repair: {again:?}"
    );
    let mut b = vec![0u8; 4096];
    for lba in 0..BLOCKS {
        vol.read(lba * 4096, &mut b).unwrap();
        if stamp[lba as usize] != 0 {
            assert!(
                b == block_for(stamp[lba as usize]),
                "seed {seed}: block {lba}"
            );
        }
    }
}

/// A segment holding a stripe parity cannot recover is still repaired: the rot in its other
/// stripes and the intact blocks of the lost stripe move (they would be lost with the next
/// member), and only the lost blocks stay. Scrub used to leave such a segment alone, and a
/// read's repair of it failed and was queued again forever.
#[test]
fn a_segment_with_lost_blocks_is_repaired_around_them() {
    let seed = test_seed("scrub lost and rot", 6);
    let (mems, pool) = setup();
    let offs = data_offsets(seed, 3);
    rot(&mems, 1, &offs);
    rot(&mems, 2, &offs);
    // Recoverable rot on a third member, in the same segments (64 KiB on: other stripes).
    let near: Vec<u64> = offs.iter().map(|o| o + (64 << 10)).collect();
    rot(&mems, 3, &near);
    let first = pool.scrub(true, None).unwrap();
    assert!(!first.unrecoverable.is_empty(), "seed {seed}: {first:?}");
    assert!(first.segments_repaired > 0, "seed {seed}: {first:?}");
    let lost: std::collections::BTreeSet<u64> = first
        .unrecoverable
        .iter()
        .map(|(_, off)| off / 4096)
        .collect();
    // Only the lost blocks are left on damaged media: fail a member that held none of the
    // rot, and every other block still reads (none of it depended on a rotten chunk).
    pool.fail_drive(0).unwrap();
    let vol = pool.volume("v").unwrap();
    let mut b = vec![0u8; 4096];
    for lba in 0..BLOCKS {
        let res = vol.read(lba * 4096, &mut b);
        if lost.contains(&lba) {
            assert!(res.is_err(), "seed {seed}: lost block {lba} reads back");
        } else {
            res.unwrap_or_else(|e| panic!("seed {seed}: block {lba} after repair: {e}"));
            assert!(b == block_for(lba + 7), "seed {seed}: block {lba}");
        }
    }
    // Reads of the lost blocks queue their segment; the repair succeeds (nothing more to
    // move) instead of failing and waiting forever.
    pool.repair_pending().unwrap();
    assert_eq!(pool.repairs_pending(), 0, "seed {seed}");
}

/// The pool of `setup()` reopened with member 3 one superblock generation behind: a copy of
/// it taken right after a checkpoint is put back after 300 blocks more were written (block
/// `lba` holding `block_for(lba + tag)`, less than a checkpoint interval) and a clean close.
fn reopened_with_member_3_behind(tag: u64) -> Pool {
    let (mems, pool) = setup();
    pool.checkpoint().unwrap();
    let old_copy = Arc::new(mems[3].crash(|_, _| flashpool_engine::drive::CrashFate::Persisted));
    let vol = pool.volume("v").unwrap();
    for lba in 0..300 {
        vol.write(lba * 4096, &block_for(lba + tag)).unwrap();
    }
    pool.close().unwrap();
    drop(vol);
    drop(pool);
    let mut drives = as_refs(&mems);
    drives[3] = old_copy;
    Pool::open(drives).unwrap()
}

/// A copy of a member taken during the last checkpoint interval and put back is one
/// superblock generation behind, which a crash while superblocks are written also leaves, so
/// the pool takes it: it lacks the chunks written since, and nothing said so (status: full
/// redundancy; a second failure lost blocks). The pool now names such members until a
/// repairing scrub has checked them, and that scrub restores what they lack.
#[test]
fn a_member_one_generation_behind_is_named_until_a_scrub_checks_it() {
    let pool = reopened_with_member_3_behind(1_000_000);
    assert_eq!(pool.unverified_members(), vec![3]);
    let rep = pool.scrub(true, None).unwrap();
    assert!(rep.bad_chunks > 0 && rep.segments_repaired > 0, "{rep:?}");
    assert!(rep.unrecoverable.is_empty(), "{rep:?}");
    assert!(pool.unverified_members().is_empty());
    // Redundancy is back: another member fails and every block reads.
    pool.fail_drive(0).unwrap();
    let vol = pool.volume("v").unwrap();
    let mut b = vec![0u8; 4096];
    for lba in 0..BLOCKS {
        vol.read(lba * 4096, &mut b).unwrap();
        let want = if lba < 300 { lba + 1_000_000 } else { lba + 7 };
        assert!(b == block_for(want), "block {lba}");
    }
}

/// A member opened one generation behind and then failed serves nothing, so it is not named
/// as unverified (status listed it as UNVERIFIED beside its failure); readmitted, it is again.
#[test]
fn a_failed_member_behind_is_not_named_unverified() {
    let pool = reopened_with_member_3_behind(2_000_000);
    assert_eq!(pool.unverified_members(), vec![3]);
    pool.fail_drive(3).unwrap();
    assert!(pool.unverified_members().is_empty());
    pool.readmit_drive(3).unwrap();
    assert_eq!(pool.unverified_members(), vec![3]);
}

/// A scrub while hosts overwrite the volume finds nothing on sound drives: segments the
/// cleaner empties and the writer fills again while the scrub reads them hold other chunks
/// than the scrub scanned, and those are not damage. A tester's scrub under fio load reported
/// 57-517 bad chunks (and CRC errors, and moved segments) that an idle scrub right after did
/// not find.
#[test]
fn a_scrub_under_overwrites_finds_nothing_on_sound_drives() {
    let seed = test_seed("a_scrub_under_overwrites", 0x5c2c);
    let mems = mem_drives(5, false);
    let drives = keeping_discarded(&mems);
    let pool = Arc::new(Pool::create(drives, &small_config(4, 1)).unwrap());
    pool.create_volume_with("v", BLOCKS * 4096, flashpool_engine::Compression::Off)
        .unwrap();
    let vol = pool.volume("v").unwrap();
    for lba in 0..BLOCKS {
        vol.write(lba * 4096, &block_for(lba + 7)).unwrap();
    }
    pool.flush().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || {
            let vol = pool.volume("v").unwrap();
            let mut rng = Rng::seed_from_u64(seed);
            let mut round = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let lba = rng.random_range(0..BLOCKS);
                let n = rng.random_range(1..=24u64).min(BLOCKS - lba);
                let buf: Vec<u8> = (0..n).flat_map(|i| block_for(round * 64 + i)).collect();
                vol.write(lba * 4096, &buf).unwrap();
                if rng.random_range(0..4) == 0 {
                    pool.flush().unwrap();
                }
                round += 1;
            }
            round
        })
    };
    let cleaned_before = pool.stats().gc_segments_cleaned;
    let mut reports = Vec::new();
    let t0 = std::time::Instant::now();
    while t0.elapsed() < std::time::Duration::from_secs(4) || reports.len() < 5 {
        reports.push(pool.scrub(false, None).unwrap());
    }
    stop.store(true, Ordering::SeqCst);
    let rounds = writer.join().unwrap();
    let cleaned = pool.stats().gc_segments_cleaned - cleaned_before;
    assert!(
        cleaned > 0,
        "seed {seed}: segments must have been reused under the scrubs ({rounds} writes)"
    );
    let bad: u64 = reports.iter().map(|r| r.bad_chunks).sum();
    assert_eq!(
        bad,
        0,
        "seed {seed}: {} scrubs over {rounds} writes and {cleaned} segments cleaned: {:?}",
        reports.len(),
        reports
            .iter()
            .filter(|r| r.bad_chunks > 0)
            .collect::<Vec<_>>()
    );
    assert_eq!(pool.stats().crc_errors, 0, "seed {seed}");
    assert_eq!(
        pool.scrub(false, None).unwrap().bad_chunks,
        0,
        "seed {seed}"
    );
}

/// A power cut while stripes were on their way leaves them torn: one member's chunks of them
/// never reached the media. That is no media damage: the open rewrites such a stripe whole
/// (or skips it, when too few chunks made it, as never flushed), and neither the open nor a
/// later scrub (in this process or the next) counts CRC errors, names bad chunks or repairs
/// anything. What the open found is counted as torn chunks.
#[test]
fn stripes_torn_by_a_crash_are_no_crc_errors() {
    let mems = mem_drives(5, true);
    let gate = Arc::new(Gate::default());
    let drives: Vec<flashpool_engine::drive::DriveRef> = mems
        .iter()
        .map(|m| GatedDrive::new(m.clone(), None, Some(gate.clone())) as _)
        .collect();
    let cfg = flashpool_engine::PoolConfig {
        checkpoint_interval: 64 << 20, // no checkpoint (and its flushes) but the pool's own
        ..small_config(4, 1)
    };
    let pool = Arc::new(Pool::create(drives, &cfg).unwrap());
    pool.create_volume_with("v", BLOCKS * 4096, flashpool_engine::Compression::Off)
        .unwrap();
    let vol = pool.volume("v").unwrap();
    for lba in 0..BLOCKS / 2 {
        vol.write(lba * 4096, &block_for(lba + 7)).unwrap();
    }
    pool.flush().unwrap();
    for lba in BLOCKS / 2..BLOCKS {
        vol.write(lba * 4096, &block_for(lba + 7)).unwrap();
    }
    // A flush that writes its stripes and is held at the drives' flushes: every chunk is on
    // the drives, none flushed.
    gate.set(true);
    let flush = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.flush())
    };
    while gate.waiting.load(Ordering::SeqCst) == 0 {
        assert!(
            !flush.is_finished(),
            "the flush ended without flushing the drives"
        );
        std::thread::yield_now();
    }
    // The power cut: member 0's writes since its last flush are lost, the others' kept.
    let crashed: Vec<Arc<MemDrive>> = mems
        .iter()
        .enumerate()
        .map(|(i, m)| {
            Arc::new(m.crash(|_, _| match i {
                0 => flashpool_engine::drive::CrashFate::Lost,
                _ => flashpool_engine::drive::CrashFate::Persisted,
            }))
        })
        .collect();
    gate.set(false);
    flush.join().unwrap().unwrap();
    drop(pool);

    let pool = Pool::open(as_refs(&crashed)).unwrap();
    let s = pool.stats();
    assert!(s.torn_chunks > 0, "the open found the torn stripes: {s:?}");
    assert_eq!(s.crc_errors, 0, "torn is not rot: {s:?}");
    // Every stripe had four of its five chunks: all of it is there, rewritten whole.
    verify(&pool, "after the crash");
    let rep = pool.scrub(true, None).unwrap();
    assert_eq!((rep.bad_chunks, rep.segments_repaired), (0, 0), "{rep:?}");
    assert_eq!(pool.stats().crc_errors, 0);
    drop(pool);
    let pool = Pool::open(as_refs(&crashed)).unwrap();
    let rep = pool.scrub(true, None).unwrap();
    assert_eq!((rep.bad_chunks, rep.segments_repaired), (0, 0), "{rep:?}");
    let s = pool.stats();
    assert_eq!((s.crc_errors, s.torn_chunks), (0, 0), "{s:?}");
    verify(&pool, "reopened");
    // The rewritten stripes hold every block with full redundancy: member 0 may go.
    pool.fail_drive(0).unwrap();
    verify(&pool, "reopened without member 0");
}

/// With more members out of service than parity covers, a scrub cannot read the stripes it
/// checks: it says how many and how many live blocks they hold (it used to report such a
/// pool clean), names none of them lost, and once the members are back finds all readable.
#[test]
fn a_scrub_with_members_down_beyond_parity_names_what_it_cannot_read() {
    let (_mems, pool) = setup();
    pool.force_fail_drive(0).unwrap();
    pool.force_fail_drive(3).unwrap();
    let rep = pool.scrub(false, None).unwrap();
    assert!(rep.stripes_unavailable > 0, "{rep:?}");
    // Every stripe of this pool spans all five members: every block is out of reach.
    assert_eq!(rep.blocks_unavailable, BLOCKS, "{rep:?}");
    assert_eq!((rep.bad_chunks, rep.unrecoverable.len()), (0, 0), "{rep:?}");
    pool.readmit_drive(0).unwrap();
    let rep = pool.scrub(false, None).unwrap();
    assert_eq!(
        (rep.stripes_unavailable, rep.blocks_unavailable),
        (0, 0),
        "{rep:?}"
    );
    verify(&pool, "member 0 back");
}
