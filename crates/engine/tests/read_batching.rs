//! Reads of many blocks are few device reads (issue 16): a 1 MiB read of data written
//! sequentially is one drive read per chunk, and data read back through the batched path
//! equals what was written, on memory and file drives, also when one block of the range is
//! corrupt (it is rebuilt from parity through the one-block path).

mod common;

use common::*;
use flashpool_engine::drive::{Drive, DriveInfo, DriveRef, MemDrive};
use flashpool_engine::{Compression, Pool, PoolConfig, Volume};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counts the reads that reach a drive.
struct Counting {
    inner: DriveRef,
    reads: AtomicU64,
    bytes: AtomicU64,
}

impl Drive for Counting {
    fn info(&self) -> DriveInfo {
        self.inner.info()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn counting(drives: Vec<DriveRef>) -> Vec<Arc<Counting>> {
    drives
        .into_iter()
        .map(|inner| {
            Arc::new(Counting {
                inner,
                reads: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
            })
        })
        .collect()
}

/// 4+1 stripes of 128 KiB chunks (the default chunk size): a MiB spans eight chunks. Segments
/// of 2 MiB: the small test drives hold enough of them for 4 MiB of data besides the
/// checkpoint's and the cleaner's reserve.
fn chunks_of_128k() -> PoolConfig {
    PoolConfig {
        k: 4,
        m: 1,
        chunk_size: 128 << 10,
        segment_size: 2 << 20,
        checkpoint_interval: 64 << 20,
    }
}

/// A pool of 128 KiB chunks on `drives` with 4 MiB of noise from `seed` written in 1 MiB
/// writes (one after another: contiguous in the log) and flushed.
fn pool_with_4mib(drives: &[Arc<Counting>], seed: u64) -> (Pool, Volume, Vec<u8>) {
    let pool = Pool::create(as_refs(drives), &chunks_of_128k()).unwrap();
    pool.create_volume_with("v", 8 << 20, Compression::Off)
        .unwrap();
    let v = pool.volume("v").unwrap();
    let data = noise(4 << 20, seed);
    for (i, c) in data.chunks(1 << 20).enumerate() {
        v.write((i as u64) << 20, c).unwrap();
    }
    v.flush().unwrap();
    (pool, v, data)
}

/// Reads and bytes read so far, all drives together.
fn count(drives: &[Arc<Counting>]) -> (u64, u64) {
    drives.iter().fold((0, 0), |(r, b), d| {
        (
            r + d.reads.load(Ordering::Relaxed),
            b + d.bytes.load(Ordering::Relaxed),
        )
    })
}

fn check_one_read_per_chunk(drives: Vec<Arc<Counting>>) {
    let (_pool, v, data) = pool_with_4mib(&drives, 7);
    let count = || count(&drives);
    let (r0, b0) = count();
    let mut out = vec![0u8; 1 << 20];
    v.read(1 << 20, &mut out).unwrap();
    let (r1, b1) = count();
    assert_eq!(out, data[1 << 20..2 << 20], "the data read back");
    let (reads, bytes) = (r1 - r0, b1 - b0);
    // 1 MiB over 128 KiB chunks: 8 chunks, 9 when the range straddles a chunk boundary.
    assert!(
        reads <= (1 << 20) / (128 << 10) + 1,
        "a 1 MiB read took {reads} device reads"
    );
    assert_eq!(bytes, 1 << 20, "no block read twice, none left out");
    // Unaligned edges still go the byte-level way.
    let mut odd = vec![0u8; 300_000];
    v.read(4096 * 3 + 17, &mut odd).unwrap();
    assert_eq!(odd, data[4096 * 3 + 17..4096 * 3 + 17 + 300_000]);
    // Several ranges in one call, one of them past the end.
    let (mut a, mut b, mut c) = (vec![0u8; 65536], vec![0u8; 8192], vec![0u8; 4096]);
    let res = {
        let mut reads: Vec<(u64, &mut [u8])> = vec![
            (2 << 20, &mut a[..]),
            (100 << 10, &mut b[..]),
            (8 << 20, &mut c[..]),
        ];
        v.read_many(&mut reads)
    };
    assert!(
        res[0].is_ok() && res[1].is_ok() && res[2].is_err(),
        "{res:?}"
    );
    assert_eq!(a, data[2 << 20..(2 << 20) + 65536]);
    assert_eq!(b, data[100 << 10..(100 << 10) + 8192]);
}

#[test]
fn a_1mib_read_is_one_device_read_per_chunk_on_memory_drives() {
    check_one_read_per_chunk(counting(as_refs(&mem_drives(5, false))));
}

#[test]
fn a_1mib_read_is_one_device_read_per_chunk_on_file_drives() {
    let dir = tempfile::tempdir().unwrap();
    check_one_read_per_chunk(counting(file_drives(dir.path(), 5)));
}

#[test]
fn a_corrupt_block_inside_a_batched_read_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let drives = file_drives(dir.path(), 5);
    let pool = Pool::create(drives.clone(), &small_config(4, 1)).unwrap();
    pool.create_volume_with("v", 8 << 20, Compression::Off)
        .unwrap();
    let v = pool.volume("v").unwrap();
    let data = noise(1 << 20, 3);
    v.write(0, &data).unwrap();
    v.flush().unwrap();
    drop(v);
    pool.close().unwrap();
    // Flip a byte of every 4 KiB block of one drive's data area (superblocks and chunk
    // headers aside, the reads find the rot by the CRC tags).
    let victim = &drives[2];
    let size = victim.info().size;
    let mut blk = vec![0u8; 4096];
    let mut flipped = 0;
    let mut off = 1 << 20;
    while off + 4096 <= size.min(4 << 20) {
        victim.read_at(off, &mut blk).unwrap();
        if blk.iter().any(|&b| b != 0) {
            blk[100] ^= 0x5a;
            victim.write_at(off, &blk).unwrap();
            flipped += 1;
        }
        off += 4096;
    }
    assert!(flipped > 0);
    drop(drives);
    let pool = Pool::open(reopen_files(dir.path(), 5)).unwrap();
    let v = pool.volume("v").unwrap();
    let mut out = vec![0u8; 1 << 20];
    v.read(0, &mut out).unwrap();
    assert_eq!(out, data, "every block, rebuilt where rotten");
    assert!(pool.stats().crc_errors > 0, "the rot was seen");
}

/// Writers appending at once keep each request's blocks together in the log: a 1 MiB read
/// of what one of eight concurrent 1 MiB writers wrote is a few drive reads (its blocks go
/// in groups of 64 under one hold of the writer lock), not one per block as when blocks of
/// concurrent writes interleave one by one.
#[test]
fn concurrent_1mib_writes_stay_contiguous() {
    let drives = counting(
        (0..5)
            .map(|i| Arc::new(MemDrive::new(128 << 20, format!("mem:{i}"))) as DriveRef)
            .collect(),
    );
    let pool = Pool::create(as_refs(&drives), &chunks_of_128k()).unwrap();
    pool.create_volume_with("v", 32 << 20, Compression::Off)
        .unwrap();
    let v = pool.volume("v").unwrap();
    const WRITERS: u64 = 8;
    const ROUNDS: u64 = 3;
    for r in 0..ROUNDS {
        let data: Vec<(u64, Vec<u8>)> = (0..WRITERS)
            .map(|w| (r * WRITERS + w) << 20)
            .map(|at| (at, noise(1 << 20, at)))
            .collect();
        std::thread::scope(|s| {
            for (at, d) in &data {
                let v = &v;
                s.spawn(move || v.write(*at, d).unwrap());
            }
        });
    }
    v.flush().unwrap();
    let reads = || -> u64 { drives.iter().map(|d| d.reads.load(Ordering::Relaxed)).sum() };
    let mut worst = 0;
    for i in 0..WRITERS * ROUNDS {
        let mut out = vec![0u8; 1 << 20];
        let before = reads();
        v.read(i << 20, &mut out).unwrap();
        worst = worst.max(reads() - before);
        assert!(out == noise(1 << 20, i << 20), "MiB {i} read back wrong");
    }
    // Four groups of 256 KiB, each over at most three 128 KiB chunks.
    assert!(worst <= 12, "a 1 MiB read took {worst} drive reads");
}

/// With a drive lost, a read rebuilds its blocks on that drive from the same bytes of the
/// stripe's other chunks, the lost blocks of one chunk together: a 1 MiB read costs its
/// surviving blocks once plus `w` times its lost ones, in a few reads per chunk (before, each
/// lost block read `w` whole chunks: 64 x 4 x 128 KiB for a quarter of a MiB). A 4 KiB read
/// of a lost block costs `w` reads of 4 KiB.
#[test]
fn a_degraded_read_rebuilds_from_the_same_bytes_of_the_other_chunks() {
    let drives = counting(as_refs(&mem_drives(5, false)));
    let (pool, v, data) = pool_with_4mib(&drives, 11);
    pool.fail_drive(2).unwrap();
    // The first rebuild in a segment scans its chunk headers to find the stripes (cached
    // after): read everything once before counting.
    let mut all = vec![0u8; 4 << 20];
    v.read(0, &mut all).unwrap();
    assert!(all == data, "the degraded volume read back wrong");
    let count = || count(&drives);
    let w = 4u64;
    for mib in 0..4u64 {
        let (r0, b0) = count();
        let lost0 = pool.stats().degraded_reads;
        let mut out = vec![0u8; 1 << 20];
        v.read(mib << 20, &mut out).unwrap();
        let (r1, b1) = count();
        let lost = (pool.stats().degraded_reads - lost0) * 4096;
        assert!(
            out == data[(mib << 20) as usize..((mib + 1) << 20) as usize],
            "MiB {mib} read back wrong"
        );
        // A MiB spans 8 or 9 chunks of 128 KiB, at most 3 stripes, so at most 3 on drive 2.
        assert!(
            lost > 0 && lost <= 3 * (128 << 10),
            "MiB {mib}: {lost} bytes lost"
        );
        assert_eq!(
            b1 - b0,
            (1 << 20) - lost + w * lost,
            "MiB {mib}: the survivors once, w times the lost bytes"
        );
        assert!(r1 - r0 <= 9 + 3 * w, "MiB {mib}: {} device reads", r1 - r0);
    }
    // Block by block: a lost block is w reads of 4 KiB.
    let (r0, b0) = count();
    let lost0 = pool.stats().degraded_reads;
    let mut block = vec![0u8; 4096];
    for lba in 0..256u64 {
        v.read(lba * 4096, &mut block).unwrap();
        assert!(block == data[(lba * 4096) as usize..((lba + 1) * 4096) as usize]);
    }
    let (r1, b1) = count();
    let lost = pool.stats().degraded_reads - lost0;
    assert!(lost > 0);
    assert_eq!(r1 - r0, 256 - lost + w * lost);
    assert_eq!(b1 - b0, (256 - lost + w * lost) * 4096);
}

/// With the lost member's segments indexed beforehand (`prepare_degraded_reads`, which a
/// server runs in the background), the very first degraded read of each segment costs only
/// its rebuild's source reads: no chunk header is read inside the read.
#[test]
fn prepared_degraded_reads_scan_nothing_inside_the_read() {
    let drives = counting(as_refs(&mem_drives(5, false)));
    let (pool, v, data) = pool_with_4mib(&drives, 13);
    assert_eq!(
        pool.prepare_degraded_reads(8),
        0,
        "nothing to do while healthy"
    );
    pool.fail_drive(2).unwrap();
    // The 4 MiB lie in three segments of 2 MiB at most (data, then a checkpoint's).
    let mut scanned = 0;
    for _ in 0..8 {
        let n = pool.prepare_degraded_reads(1);
        assert!(n <= 1, "at most the segments asked for");
        scanned += n;
    }
    assert!((1..=4).contains(&scanned), "{scanned} segments scanned");
    assert_eq!(
        pool.prepare_degraded_reads(8),
        0,
        "every segment indexed already"
    );
    let (r0, b0) = count(&drives);
    let lost0 = pool.stats().degraded_reads;
    let mut all = vec![0u8; 4 << 20];
    v.read(0, &mut all).unwrap();
    assert!(all == data, "the degraded volume read back wrong");
    let (r1, b1) = count(&drives);
    let lost = (pool.stats().degraded_reads - lost0) * 4096;
    assert!(lost > 0);
    // The survivors once and w = 4 times the lost bytes: nothing else, no header.
    assert_eq!(b1 - b0, (4 << 20) - lost + 4 * lost, "{} reads", r1 - r0);
}
