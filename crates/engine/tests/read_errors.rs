//! A member whose reads fail: isolated read errors are erasures (the block is rebuilt from
//! parity, its segment repaired) and the member stays in service; past a limit of read errors
//! in a window it is taken out of service as on a write error, unless parity covers no further
//! loss; the probe for transient faults does not put it back. Warnings about a member's reads
//! are logged at a bounded rate (the product bug: a drive file cut short under a running server
//! gave 96 read errors and 2052 CRC mismatches, stayed active, and logged 1776 warnings for one
//! 64 MiB read-back).

mod common;

use common::*;
use flashpool_engine::drive::{DriveRef, FaultDrive, FaultSwitch, MemDrive};
use flashpool_engine::{Compression, Pool};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const BLOCKS: u64 = 1000;

/// A 4+1 pool of fault-injecting drives holding `BLOCKS` blocks of volume "v".
fn filled() -> (Pool, Vec<Arc<MemDrive>>, Vec<Arc<FaultSwitch>>) {
    let mems = mem_drives(5, false);
    let mut sw = vec![];
    let drives: Vec<DriveRef> = mems
        .iter()
        .map(|m| {
            let (f, s) = FaultDrive::new(m.clone() as DriveRef);
            sw.push(s);
            f as DriveRef
        })
        .collect();
    let pool = Pool::create(drives, &small_config(4, 1)).unwrap();
    pool.create_volume_with("v", 8 << 20, Compression::Off)
        .unwrap();
    let vol = pool.volume("v").unwrap();
    for lba in 0..BLOCKS {
        vol.write(lba * 4096, &block_for(lba)).unwrap();
    }
    pool.flush().unwrap();
    (pool, mems, sw)
}

fn verify(pool: &Pool, what: &str) {
    let vol = pool.volume("v").unwrap();
    let mut b = vec![0u8; 4096];
    for lba in 0..BLOCKS {
        vol.read(lba * 4096, &mut b)
            .unwrap_or_else(|e| panic!("{what}: block {lba}: {e}"));
        assert!(b == block_for(lba), "{what}: block {lba} wrong");
    }
}

#[test]
fn a_member_whose_reads_keep_failing_is_taken_out_of_service() {
    let (pool, _mems, sw) = filled();
    sw[2].fail_reads.store(true, Ordering::SeqCst);
    verify(&pool, "member 2 failing reads");
    assert_eq!(pool.drives()[2].state, "failed", "{:?}", pool.drives());
    let why = pool.drive_failures()[2].clone().expect("a failure").reason;
    assert!(why.contains("read errors"), "{why}");
    // Its reads work again, but the probe for transient faults (a write and read-back of a
    // block it reserves) says nothing about the blocks that failed: it stays out.
    sw[2].fail_reads.store(false, Ordering::SeqCst);
    assert_eq!(pool.readmit_healthy_drives(), Vec::<usize>::new());
    assert_eq!(pool.drives()[2].state, "failed");
    // The operator can put it back.
    pool.readmit_drive(2).unwrap();
    verify(&pool, "member 2 readmitted");
}

#[test]
fn isolated_read_errors_are_repaired_and_the_member_stays() {
    let (pool, _mems, sw) = filled();
    let vol = pool.volume("v").unwrap();
    let mut b = vec![0u8; 4096];
    // A few blocks of member 2 unreadable: rebuilt from parity, the member stays.
    let mut lba = 0;
    while pool.stats().read_errors < 5 && lba < BLOCKS {
        sw[2].fail_reads.store(true, Ordering::SeqCst);
        vol.read(lba * 4096, &mut b).unwrap();
        sw[2].fail_reads.store(false, Ordering::SeqCst);
        assert!(b == block_for(lba), "block {lba}");
        lba += 1;
    }
    assert!(pool.stats().read_errors >= 5);
    assert_eq!(pool.drives()[2].state, "active", "{:?}", pool.drives());
    assert!(pool.repairs_pending() > 0);
    verify(&pool, "after isolated read errors");
}

#[test]
fn a_failing_reader_stays_in_service_when_parity_is_spent() {
    let (pool, _mems, sw) = filled();
    pool.fail_drive(0).unwrap();
    sw[2].fail_reads.store(true, Ordering::SeqCst);
    let vol = pool.volume("v").unwrap();
    let mut b = vec![0u8; 4096];
    for lba in 0..BLOCKS {
        // Blocks on member 2 whose stripes also had a chunk on member 0 cannot be read.
        let _ = vol.read(lba * 4096, &mut b);
    }
    assert!(pool.stats().read_errors > 100);
    assert_eq!(pool.drives()[2].state, "active", "{:?}", pool.drives());
    sw[2].fail_reads.store(false, Ordering::SeqCst);
    pool.readmit_drive(0).unwrap();
    verify(&pool, "member 0 back, member 2 reading again");
}

/// Counts warnings and errors logged on this thread.
struct CountWarnings(Arc<AtomicUsize>);

impl tracing::Subscriber for CountWarnings {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        if *e.metadata().level() <= tracing::Level::WARN {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A member returning rotten data for every block (CRC mismatches are erasures, never a
/// reason to fail it) logs a bounded number of warnings, not one per block.
#[test]
fn warnings_about_a_members_reads_are_rate_limited() {
    let (pool, _mems, sw) = filled();
    sw[2].corrupt_reads.store(true, Ordering::SeqCst);
    let warnings = Arc::new(AtomicUsize::new(0));
    let sub = CountWarnings(warnings.clone());
    tracing::subscriber::with_default(sub, || verify(&pool, "member 2 corrupting"));
    let crc = pool.stats().crc_errors;
    assert!(crc > 100, "{crc} CRC errors");
    let logged = warnings.load(Ordering::SeqCst);
    assert!(logged <= 20, "{logged} warnings for {crc} CRC errors");
    assert_eq!(pool.drives()[2].state, "active");
}
