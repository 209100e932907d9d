//! Crash-point tests of membership changes: record every drive write of a drive add and of a
//! drive replace (add, fail the old member, rebuild), then for every cut point (each write
//! boundary, and each superblock write torn part-way) rebuild the drive images as a power cut
//! there would leave them and reopen the pool from all the drives: it must open, with no
//! member set aside as stale, and every block flushed before the change reads back intact.
//!
//! Also the state an older build's interrupted drive add left (new drive at `g + 1`, then
//! straight to a checkpoint at `g + 2`, so members not yet rewritten were two generations
//! behind): such pools must open when the new drive's first superblock proves it, and stay
//! refused without that proof.

mod common;

use common::*;
use flashpool_engine::drive::{DriveLog, DriveOp, DriveRef, MemDrive, RecordingDrive};
use flashpool_engine::format::superblock::Superblock;
use flashpool_engine::Pool;
use std::sync::Arc;

const BLOCKS: u64 = 64;
/// Members at creation; two spares follow them.
const MEMBERS: usize = 5;

/// What a test does to the recorded pool.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Change {
    Add,
    Replace,
}

/// The generation a recorded write sets, when it is a superblock write.
fn superblock_write(op: &DriveOp) -> Option<(usize, u64)> {
    match op {
        DriveOp::Write {
            drive,
            offset,
            data,
        } if *offset < 8192 && data.len() == 4096 => Superblock::decode(data)
            .ok()
            .map(|sb| (*drive, sb.generation)),
        _ => None,
    }
}

/// A pool of `MEMBERS` drives holding `BLOCKS` flushed blocks, plus two blank spares; then the
/// recorded change. Returns the drives as they were before it, and the log of the change.
fn record(change: Change) -> (Vec<Arc<MemDrive>>, Vec<DriveOp>) {
    let base = mem_drives(MEMBERS + 2, false);
    let pool = Pool::create(as_refs(&base[..MEMBERS]), &small_config(3, 1)).unwrap();
    pool.create_volume_with("v", BLOCKS * 4096, flashpool_engine::Compression::Off)
        .unwrap();
    let vol = pool.volume("v").unwrap();
    for lba in 0..BLOCKS {
        vol.write(lba * 4096, &block_for(lba)).unwrap();
    }
    pool.flush().unwrap();
    pool.close().unwrap();

    let log = DriveLog::new();
    let copies: Vec<Arc<MemDrive>> = base
        .iter()
        .map(|d| Arc::new(d.crash(|_, _| unreachable!())))
        .collect();
    let recorded: Vec<DriveRef> = copies
        .iter()
        .enumerate()
        .map(|(i, d)| RecordingDrive::new(d.clone() as DriveRef, i, log.clone()) as DriveRef)
        .collect();
    let pool = Pool::open(recorded[..MEMBERS].to_vec()).unwrap();
    let start = log.len();
    match change {
        Change::Add => pool.add_drive_online(recorded[MEMBERS].clone()).unwrap(),
        Change::Replace => {
            pool.replace_drive(1, recorded[MEMBERS].clone()).unwrap();
        }
    }
    drop(pool);
    let ops = log.ops()[start..].to_vec();
    // The images start where the recorded open left them.
    let before = crash_drives(&base, &log.ops()[..start], start, None);
    (before, ops)
}

/// Reopens the pool from every drive as the cut left it and checks it.
fn check_cut(
    what: &str,
    before: &[Arc<MemDrive>],
    ops: &[DriveOp],
    cut: usize,
    torn: Option<usize>,
) {
    let drives = image_at(before, ops, cut, torn);
    let a = Pool::assemble(drives.clone(), None)
        .unwrap_or_else(|e| panic!("{what}: cut {cut} torn {torn:?}: assembly failed: {e}"));
    let stale: Vec<_> = a
        .ignored
        .iter()
        .filter(|i| i.kind == "stale")
        .map(|i| i.reason.clone())
        .collect();
    assert!(
        stale.is_empty(),
        "{what}: cut {cut} torn {torn:?}: members set aside: {stale:?}"
    );
    let pool = Pool::open(drives)
        .unwrap_or_else(|e| panic!("{what}: cut {cut} torn {torn:?}: reopen failed: {e}"));
    let vol = pool.volume("v").unwrap();
    let mut b = vec![0u8; 4096];
    for lba in 0..BLOCKS {
        vol.read(lba * 4096, &mut b)
            .unwrap_or_else(|e| panic!("{what}: cut {cut} torn {torn:?}: block {lba}: {e}"));
        assert!(
            b == block_for(lba),
            "{what}: cut {cut} torn {torn:?}: block {lba} lost its flushed contents"
        );
    }
}

fn run(change: Change, what: &str) {
    let (before, ops) = record(change);
    let mut cuts: Vec<(usize, Option<usize>)> = (0..=ops.len()).map(|c| (c, None)).collect();
    for (i, op) in ops.iter().enumerate() {
        if superblock_write(op).is_some() {
            cuts.push((i, Some(3)));
        }
    }
    for &(cut, torn) in &cuts {
        check_cut(what, &before, &ops, cut, torn);
    }
    eprintln!(
        "{what}: {} crash points checked over {} drive operations",
        cuts.len(),
        ops.len()
    );
}

#[test]
fn crash_points_drive_add() {
    run(Change::Add, "drive add");
}

#[test]
fn crash_points_drive_replace() {
    run(Change::Replace, "drive replace");
}

/// The log of an add as an older build wrote it: without the round that rewrites the other
/// members at the new drive's generation (the new drive went from `g + 1` straight to the
/// checkpoint's `g + 2`).
fn legacy_add_log(ops: &[DriveOp]) -> (Vec<DriveOp>, u64) {
    let first = ops
        .iter()
        .find_map(|op| superblock_write(op).filter(|(d, _)| *d == MEMBERS))
        .expect("the new drive's superblock is written")
        .1;
    let legacy = ops
        .iter()
        .filter(|op| !matches!(superblock_write(op), Some((d, g)) if g == first && d != MEMBERS))
        .cloned()
        .collect();
    (legacy, first)
}

#[test]
fn interrupted_add_of_an_older_build_opens_with_its_proof() {
    let (before, ops) = record(Change::Add);
    let (legacy, first) = legacy_add_log(&ops);
    // Cut after the checkpoint's superblock reached the first two members only: members 2..5
    // are two generations behind (the state the old code left at a crash).
    let checkpoint_writes: Vec<usize> = legacy
        .iter()
        .enumerate()
        .filter(|(_, op)| matches!(superblock_write(op), Some((_, g)) if g == first + 1))
        .map(|(i, _)| i)
        .collect();
    assert!(checkpoint_writes.len() > 2);
    let cut = checkpoint_writes[2];
    check_cut("older build's add", &before, &legacy, cut, None);

    // Without the new drive (its proof), the members two behind stay set aside: nothing
    // else shows they missed only the add.
    let drives = image_at(&before, &legacy, cut, None);
    let without_new: Vec<DriveRef> = drives
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != MEMBERS)
        .map(|(_, d)| d.clone())
        .collect();
    let a = Pool::assemble(without_new.clone(), None).unwrap();
    assert!(
        a.ignored.iter().filter(|i| i.kind == "stale").count() >= 3,
        "{:?}",
        a.ignored
    );
    assert!(Pool::open(without_new).is_err());
}
