//! `ReadQueue`: reads a thread starts and completes itself through its own io_uring, many in
//! flight at once, handed out in the order they complete. Checked against a model of every
//! volume on file drives (the real asynchronous path) while the cleaner moves blocks and
//! reuses segments under the reads in flight; out-of-order completion (the `hold_inline`
//! hook); the socket wakeup of `wait`; rot on a drive and a drive failed or replaced while
//! reads are in flight (the data is rebuilt from parity); and dropping a queue with reads in
//! flight. Deterministic per seed (`FLASHPOOL_SEED`); no timing is asserted.

mod common;

use common::*;
use flashpool_engine::drive::{DriveRef, FileDrive};
use flashpool_engine::{Compression, Error, Pool, PoolConfig, ReadDone, ReadQueue, Volume};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus as Rng;
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

const B: u64 = 4096;

/// True when the environment turns io_uring off (the queue then completes every read inside
/// `start`).
fn uring_off_by_env() -> bool {
    std::env::var("FLASHPOOL_IO_URING").is_ok_and(|v| v == "off" || v == "0")
}

/// Bytes that compress to about a third (stored compressed, packed in the chunk).
fn compressible(len: usize, seed: u64) -> Vec<u8> {
    let n = noise(len, seed);
    (0..len)
        .map(|i| {
            if (i / 512) % 3 == 0 {
                n[i]
            } else {
                (seed as u8).wrapping_add((i / 64) as u8)
            }
        })
        .collect()
}

/// Small chunks and segments, so stripes seal after 64 KiB and the cleaner has work soon.
fn config() -> PoolConfig {
    PoolConfig {
        k: 4,
        m: 1,
        chunk_size: 16 << 10,
        segment_size: 256 << 10,
        checkpoint_interval: 4 << 20,
    }
}

/// Where two buffers first differ, for messages that do not print a megabyte.
fn diff(got: &[u8], want: &[u8]) -> String {
    if got.len() != want.len() {
        return format!("length {} instead of {}", got.len(), want.len());
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        Some(i) => format!(
            "first difference at byte {i} (block {}): got {:#04x}, want {:#04x}",
            i / 4096,
            got[i],
            want[i]
        ),
        None => "equal".into(),
    }
}

/// Takes every read out of the queue, waiting as needed, until none is outstanding; fails
/// (instead of spinning for ever) when the queue counts reads that never come out.
fn drain(q: &mut ReadQueue, what: &str) -> Vec<ReadDone> {
    let mut out = Vec::new();
    let mut idle = 0u32;
    while q.outstanding() > 0 {
        if let Some(d) = q.take() {
            out.push(d);
            idle = 0;
            continue;
        }
        let fired = q
            .wait(None)
            .unwrap_or_else(|e| panic!("{what}: wait failed: {e}"));
        assert!(!fired, "{what}: wait(None) reported a readable descriptor");
        idle += 1;
        assert!(
            idle < 1_000_000,
            "{what}: {} reads outstanding, none ever comes out",
            q.outstanding()
        );
    }
    assert!(
        q.take().is_none(),
        "{what}: a read came out with none outstanding"
    );
    out
}

/// Runs `f` on a thread and fails the test if it has not returned after `secs` seconds (a
/// hang detector only: nothing is asserted about how long it takes).
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let r = f();
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: still running after {secs} s"),
    }
}

/// A volume and the bytes it should hold.
struct Modeled {
    v: Volume,
    model: Vec<u8>,
    compressed: bool,
}

impl Modeled {
    fn size(&self) -> u64 {
        self.model.len() as u64
    }

    /// A random range: mostly whole aligned blocks, sometimes any bytes.
    fn range(&self, rng: &mut Rng, max_blocks: u64, max_bytes: u64) -> (u64, u64) {
        let size = self.size();
        if rng.random_bool(0.8) {
            let blocks = rng.random_range(1..=max_blocks).min(size / B);
            let lba = rng.random_range(0..=size / B - blocks);
            (lba * B, blocks * B)
        } else {
            let off = rng.random_range(0..size);
            let len = rng.random_range(1..=max_bytes).min(size - off);
            (off, len)
        }
    }

    fn write(&mut self, rng: &mut Rng, stamp: u64) {
        let (off, len) = self.range(rng, 48, 20_000);
        let data = if self.compressed && rng.random_bool(0.7) {
            compressible(len as usize, stamp)
        } else {
            noise(len as usize, stamp)
        };
        self.v.write(off, &data).unwrap();
        self.model[off as usize..(off + len) as usize].copy_from_slice(&data);
    }

    fn trim(&mut self, rng: &mut Rng) {
        let (off, len) = self.range(rng, 64, 30_000);
        self.v.trim(off, len).unwrap();
        self.model[off as usize..(off + len) as usize].fill(0);
    }
}

/// What a read asked for.
struct Spec {
    vol: usize,
    offset: u64,
    len: usize,
}

/// A random read of `vol`: aligned or not, up to 1 MiB, some past the end, a few empty.
fn random_read(rng: &mut Rng, vol: usize, size: u64) -> Spec {
    let (offset, len) = match rng.random_range(0..100) {
        // Whole blocks, up to 1 MiB; often a size recycled buffers come in.
        0..=54 => {
            let blocks = if rng.random_bool(0.5) {
                [1u64, 2, 16, 32][rng.random_range(0..4)]
            } else {
                rng.random_range(1..=256u64)
            }
            .min(size / B);
            let lba = rng.random_range(0..=size / B - blocks);
            (lba * B, blocks * B)
        }
        // Any bytes.
        55..=79 => {
            let off = rng.random_range(0..size);
            let len = rng.random_range(1..=(1u64 << 20)).min(size - off);
            (off, len)
        }
        // Aligned, but running past the end (or starting there or beyond).
        80..=87 => {
            let blocks = rng.random_range(1..=256u64);
            let lba = rng.random_range((size / B).saturating_sub(blocks) + 1..=size / B + 300);
            (lba * B, blocks * B)
        }
        // Unaligned, past the end.
        88..=94 => {
            let len = rng.random_range(1..=(1u64 << 20));
            let off = rng.random_range(size.saturating_sub(len) + 1..=size + (1 << 20));
            (off, len)
        }
        // Empty reads, and one whose end does not fit in 64 bits.
        95..=97 => (rng.random_range(0..=size), 0),
        _ => (u64::MAX - rng.random_range(0..8192u64), 4096),
    };
    Spec {
        vol,
        offset,
        len: len as usize,
    }
}

/// Moves blocks under the reads in flight: cleans every segment worth cleaning (their live
/// blocks move, the segments are freed), then writes fresh data that reuses the freed
/// segments (the lowest free segment is opened first), so a drive read still queued for a
/// block's old place reads someone else's data.
fn disturb(pool: &Pool, churn: &Volume, rng: &mut Rng, stamp: u64) -> usize {
    let cleaned = pool.gc(usize::MAX / 2).unwrap();
    let size = churn.size();
    for i in 0..8u64 {
        let lba = rng.random_range(0..size / B - 64);
        churn
            .write(lba * B, &noise(256 << 10, stamp ^ (i << 40)))
            .unwrap();
    }
    if rng.random_bool(0.5) {
        pool.flush().unwrap();
    }
    cleaned
}

/// The model test on file drives: random writes and trims on a raw and a compressed volume,
/// then batches of 20-60 reads started at once, the cleaner moving blocks and reused segments
/// overwritten while they are in flight (some submitted to the kernel before, some queued
/// and submitted only after), every read checked against the model.
#[test]
fn reads_in_flight_match_the_model_while_the_cleaner_moves_blocks() {
    let seed = test_seed("read_queue model", 0x0ead_5eed);
    let mut rng = Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(file_drives(dir.path(), 5), &config()).unwrap();
    pool.create_volume_with("raw", 8 << 20, Compression::Off)
        .unwrap();
    pool.create_volume_with("lz", 4 << 20, Compression::Lz4)
        .unwrap();
    pool.create_volume_with("churn", 4 << 20, Compression::Off)
        .unwrap();
    let churn = pool.volume("churn").unwrap();
    let mut vols = vec![
        Modeled {
            v: pool.volume("raw").unwrap(),
            model: vec![0u8; 8 << 20],
            compressed: false,
        },
        Modeled {
            v: pool.volume("lz").unwrap(),
            model: vec![0u8; 4 << 20],
            compressed: true,
        },
    ];
    assert!(
        vols.iter().all(|m| m.v.reads_suit_a_queue()),
        "file drives suit a queue"
    );
    let mut q = ReadQueue::new();
    if uring_off_by_env() {
        assert!(!q.asynchronous(), "FLASHPOOL_IO_URING=off, yet a ring");
    } else {
        assert!(
            q.asynchronous(),
            "io_uring works on this machine: the queue should use it (FLASHPOOL_IO_URING=off to run without)"
        );
    }
    let mut stamp = seed;
    let mut cleaned = 0usize;
    let (mut oks, mut errs, mut zero_reads, mut big) = (0u64, 0u64, 0u64, 0u64);
    for round in 0..12u64 {
        let ctx = format!("seed {seed} round {round}");
        // Mutate.
        for _ in 0..rng.random_range(20..60) {
            stamp = stamp.wrapping_add(0x1234_5678_9abc_def1);
            let which = rng.random_range(0..vols.len());
            if rng.random_bool(0.8) {
                vols[which].write(&mut rng, stamp);
            } else {
                vols[which].trim(&mut rng);
            }
        }
        if rng.random_bool(0.5) {
            pool.flush().unwrap();
        }
        // Every third round, reads that complete inside `start` (unaligned, unmapped,
        // compressed, past the end) come out late and shuffled among the ring's.
        q.hold_inline((round % 3 == 2).then_some(seed ^ round));
        // Start the reads; the cleaner runs once some are submitted and again after the
        // rest are queued but not yet handed to the kernel.
        let n = rng.random_range(20..=60);
        let split = rng.random_range(0..=n);
        let mut specs: HashMap<u64, Spec> = HashMap::new();
        for i in 0..n {
            let vol = rng.random_range(0..vols.len());
            let spec = random_read(&mut rng, vol, vols[vol].size());
            let token = loop {
                let t = rng.random::<u64>();
                if !specs.contains_key(&t) {
                    break t;
                }
            };
            q.start(&vols[vol].v, token, spec.offset, spec.len);
            specs.insert(token, spec);
            assert_eq!(q.outstanding(), i + 1, "{ctx}: outstanding after start");
            if i + 1 == split {
                q.submit();
                stamp = stamp.wrapping_add(1);
                cleaned += disturb(&pool, &churn, &mut rng, stamp);
            }
        }
        stamp = stamp.wrapping_add(1);
        cleaned += disturb(&pool, &churn, &mut rng, stamp);
        if rng.random_bool(0.5) {
            q.poll();
        }
        // Take them all: each token exactly once, Ok data equal to the model.
        let done = drain(&mut q, &ctx);
        assert_eq!(done.len(), n, "{ctx}: reads out");
        for d in done {
            let spec = specs.remove(&d.token).unwrap_or_else(|| {
                panic!(
                    "{ctx}: token {:#x} came out twice, or was never started",
                    d.token
                )
            });
            let m = &vols[spec.vol];
            let past_end = spec
                .offset
                .checked_add(spec.len as u64)
                .is_none_or(|end| end > m.size());
            let what = format!(
                "{ctx}: read of {} bytes at {} of volume {}",
                spec.len,
                spec.offset,
                m.v.name()
            );
            if past_end {
                assert!(
                    matches!(d.result, Err(Error::OutOfRange { .. })),
                    "{what} (past the end of {}): {:?}",
                    m.size(),
                    d.result
                );
                errs += 1;
                q.recycle(d);
                continue;
            }
            if let Err(e) = &d.result {
                panic!("{what}: {e}");
            }
            let want = &m.model[spec.offset as usize..spec.offset as usize + spec.len];
            assert!(d.data() == want, "{what}: {}", diff(d.data(), want));
            oks += 1;
            if spec.len >= 4096 && want.iter().all(|&b| b == 0) {
                zero_reads += 1;
            }
            if spec.len >= 256 << 10 {
                big += 1;
            }
            // Its buffer serves a later read (whose every byte must then be written anew).
            q.recycle(d);
        }
        assert!(
            specs.is_empty(),
            "{ctx}: {} reads never came out",
            specs.len()
        );
        // The synchronous path agrees (the model is right, not only the queue).
        for m in &vols {
            let mut all = vec![0u8; m.model.len()];
            m.v.read(0, &mut all).unwrap();
            assert!(
                all == m.model,
                "{ctx}: volume {} read synchronously: {}",
                m.v.name(),
                diff(&all, &m.model)
            );
        }
    }
    q.hold_inline(None);
    assert_eq!(q.outstanding(), 0);
    assert!(q.take().is_none());
    eprintln!(
        "seed {seed}: {oks} reads right, {errs} past the end refused, {zero_reads} of unmapped blocks, \
         {big} of 256 KiB or more; {cleaned} segments cleaned under them"
    );
    assert!(
        cleaned > 0,
        "seed {seed}: the cleaner never cleaned a segment"
    );
    assert!(
        pool.stats().gc_segments_cleaned > 0,
        "seed {seed}: no segment cleaned"
    );
    assert!(
        errs > 0 && zero_reads > 0 && big > 0,
        "seed {seed}: every kind of read drawn"
    );
}

/// With `hold_inline`, reads that complete inside `start` (memory drives) come out late and
/// shuffled: never before a `wait`, each exactly once, with the right data; `hold_inline(None)`
/// releases the ones kept.
#[test]
fn held_reads_come_out_late_and_out_of_order() {
    let seed = test_seed("read_queue out of order", 0x0bad_cafe);
    let mut rng = Rng::seed_from_u64(seed);
    let drives = mem_drives(5, false);
    let pool = Pool::create(as_refs(&drives), &small_config(4, 1)).unwrap();
    pool.create_volume_with("v", 4 << 20, Compression::Off)
        .unwrap();
    let v = pool.volume("v").unwrap();
    assert!(!v.reads_suit_a_queue(), "memory drives complete at once");
    let data = noise(3 << 20, seed);
    v.write(0, &data).unwrap();
    let mut model = data;
    model.resize(4 << 20, 0);
    let mut q = ReadQueue::new();
    q.hold_inline(Some(seed));
    let n = 64u64;
    let mut specs = HashMap::new();
    for token in 0..n {
        let (off, len) = if rng.random_bool(0.6) {
            let blocks = rng.random_range(1..=64u64);
            let lba = rng.random_range(0..=(4 << 20) / B - blocks);
            (lba * B, blocks * B)
        } else {
            let off = rng.random_range(0..4u64 << 20);
            (off, rng.random_range(1..=100_000u64).min((4 << 20) - off))
        };
        q.start(&v, token, off, len as usize);
        specs.insert(token, (off, len as usize));
        assert!(
            q.take().is_none(),
            "seed {seed}: read {token} came out before any wait, yet held"
        );
    }
    assert_eq!(q.outstanding(), n as usize);
    let done = drain(&mut q, &format!("seed {seed}"));
    let order: Vec<u64> = done.iter().map(|d| d.token).collect();
    assert_ne!(
        order,
        (0..n).collect::<Vec<_>>(),
        "seed {seed}: held reads came out in the order they started"
    );
    let mut seen = HashSet::new();
    for d in &done {
        assert!(seen.insert(d.token), "seed {seed}: token {} twice", d.token);
        let (off, len) = specs[&d.token];
        if let Err(e) = &d.result {
            panic!("seed {seed}: read {}: {e}", d.token);
        }
        let want = &model[off as usize..off as usize + len];
        assert!(
            d.data() == want,
            "seed {seed}: read {} ({len} bytes at {off}): {}",
            d.token,
            diff(d.data(), want)
        );
    }
    assert_eq!(seen.len(), n as usize, "seed {seed}: every read out once");

    // Kept reads are released by hold_inline(None), at once, without a wait.
    for token in 100..110u64 {
        q.start(&v, token, token * B, 4096);
    }
    assert!(q.take().is_none(), "seed {seed}: held, yet out at once");
    q.hold_inline(None);
    let mut back: Vec<u64> = std::iter::from_fn(|| q.take())
        .map(|d| {
            assert!(d.result.is_ok() && d.data() == &model[(d.token * B) as usize..][..4096]);
            d.token
        })
        .collect();
    back.sort_unstable();
    assert_eq!(
        back,
        (100..110).collect::<Vec<_>>(),
        "seed {seed}: released"
    );
    assert_eq!(q.outstanding(), 0);
    // Not held any more: a read on memory drives is out right after its start, in order.
    for token in 200..205u64 {
        q.start(&v, token, 0, 8192);
        let d = q.take().expect("an inline read out at once");
        assert_eq!(d.token, token);
        assert!(d.result.is_ok() && d.data() == &model[..8192]);
    }
    assert_eq!(q.outstanding(), 0);
    assert!(!q.wait(None).unwrap(), "nothing to wait for");
}

/// `wait(Some(fd))` wakes up for the socket (a byte written before the call, or later by
/// another thread, or the peer hanging up) with no read in flight, and says false when a read
/// completed and the socket stayed quiet.
#[test]
fn wait_wakes_for_the_socket_or_a_read() {
    let mut q = ReadQueue::new();
    if !q.asynchronous() {
        assert!(uring_off_by_env(), "io_uring works on this machine");
        eprintln!("io_uring off: wait cannot sleep on a socket; skipped");
        return;
    }
    // No read in flight: the byte is there before the call.
    let (a, mut b) = UnixStream::pair().unwrap();
    let fd = a.as_raw_fd();
    b.write_all(&[1]).unwrap();
    assert!(q.wait(Some(fd)).unwrap(), "a readable socket");
    let mut byte = [0u8; 1];
    (&a).read_exact(&mut byte).unwrap();
    assert_eq!(byte, [1]);
    // The byte comes later, from another thread.
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        b.write_all(&[2]).unwrap();
        b
    });
    let (woke, mut q) = within(120, "wait for a byte", move || {
        let woke = q.wait(Some(fd)).unwrap();
        (woke, q)
    });
    assert!(woke, "woken by the byte");
    let b = writer.join().unwrap();
    (&a).read_exact(&mut byte).unwrap();
    assert_eq!(byte, [2]);
    // The peer hangs up.
    drop(b);
    assert!(q.wait(Some(fd)).unwrap(), "woken by the hang-up");
    drop(a);

    // A read in flight on file drives and a quiet socket: false, until the read is out.
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(file_drives(dir.path(), 5), &config()).unwrap();
    pool.create_volume_with("v", 4 << 20, Compression::Off)
        .unwrap();
    let v = pool.volume("v").unwrap();
    let data = noise(2 << 20, 99);
    v.write(0, &data).unwrap();
    v.flush().unwrap();
    let (c, mut d) = UnixStream::pair().unwrap();
    let fd = c.as_raw_fd();
    let mut q = ReadQueue::new();
    for round in 0..4u64 {
        q.start(&v, round, round * (256 << 10), 1 << 20);
        q.submit();
        let mut waits = 0;
        let done = loop {
            if let Some(done) = q.take() {
                break done;
            }
            assert!(
                !q.wait(Some(fd)).unwrap(),
                "round {round}: nothing was written to the socket"
            );
            waits += 1;
            assert!(waits < 1_000_000, "round {round}: the read never came out");
        };
        assert_eq!(done.token, round);
        let want = &data[(round * (256 << 10)) as usize..][..1 << 20];
        assert!(done.result.is_ok(), "{:?}", done.result);
        assert!(done.data() == want, "{}", diff(done.data(), want));
    }
    // The socket poll armed by those waits still wakes the next one.
    d.write_all(&[3]).unwrap();
    assert!(q.wait(Some(fd)).unwrap(), "a readable socket");
    (&c).read_exact(&mut byte).unwrap();
    // And nothing is left to wait for without a socket.
    assert_eq!(q.outstanding(), 0);
    assert!(!q.wait(None).unwrap());
}

/// Writes `len` bytes of noise on a new file-drive pool, closes it, flips a byte in every
/// written 4 KiB block of drive `victim`'s data area, and reopens it.
fn rotten_pool(dir: &std::path::Path, data: &[u8], victim: usize) -> Pool {
    let drives = file_drives(dir, 5);
    let pool = Pool::create(drives.clone(), &small_config(4, 1)).unwrap();
    pool.create_volume_with("v", 4 << 20, Compression::Off)
        .unwrap();
    let v = pool.volume("v").unwrap();
    v.write(0, data).unwrap();
    v.flush().unwrap();
    drop(v);
    pool.close().unwrap();
    drop(pool);
    let d = &drives[victim];
    let mut blk = vec![0u8; 4096];
    let mut flipped = 0;
    let mut off = 1u64 << 20; // the data area starts after the superblocks' megabyte
    while off + 4096 <= d.info().size {
        d.read_at(off, &mut blk).unwrap();
        if blk.iter().any(|&b| b != 0) {
            blk[777] ^= 0x5a;
            d.write_at(off, &blk).unwrap();
            flipped += 1;
        }
        off += 4096;
    }
    assert!(flipped > 0, "drive {victim} holds data");
    drop(drives);
    Pool::open(reopen_files(dir, 5)).unwrap()
}

/// Rot on one drive under the asynchronous path: the ring reads come back with blocks whose
/// CRC tags do not match, and those are rebuilt from parity.
#[test]
fn rotten_blocks_read_through_the_queue_are_rebuilt() {
    let seed = test_seed("read_queue rot", 0x4077);
    let dir = tempfile::tempdir().unwrap();
    let data = noise(2 << 20, seed);
    let pool = rotten_pool(dir.path(), &data, 2);
    let v = pool.volume("v").unwrap();
    let before = pool.stats();
    let mut q = ReadQueue::new();
    // The whole range: in 1 MiB, 64 KiB and unaligned reads, all in flight at once.
    let mut specs = HashMap::new();
    let mut token = 0u64;
    for (size, skew) in [(1usize << 20, 0usize), (64 << 10, 0), (100_000, 1234)] {
        let mut off = skew;
        while off < data.len() {
            let len = size.min(data.len() - off);
            q.start(&v, token, off as u64, len);
            specs.insert(token, (off, len));
            token += 1;
            off += len;
        }
    }
    q.submit();
    for d in drain(&mut q, &format!("seed {seed}")) {
        let (off, len) = specs.remove(&d.token).expect("each token once");
        if let Err(e) = &d.result {
            panic!("seed {seed}: {len} bytes at {off}: {e}");
        }
        assert!(
            d.data() == &data[off..off + len],
            "seed {seed}: {len} bytes at {off}: {}",
            diff(d.data(), &data[off..off + len])
        );
    }
    assert!(specs.is_empty());
    let after = pool.stats();
    assert!(
        after.crc_errors > before.crc_errors,
        "seed {seed}: the rot was seen: {after:?}"
    );
    assert!(
        after.degraded_reads > before.degraded_reads,
        "seed {seed}: blocks were served by reconstruction: {after:?}"
    );
    assert!(
        after.reconstructed_chunks > before.reconstructed_chunks,
        "seed {seed}: chunks were rebuilt: {after:?}"
    );
    assert_eq!(after.unrecoverable_blocks, 0, "seed {seed}: nothing lost");
}

/// Dropping a queue with reads in the ring (submitted, queued and never submitted, held back,
/// a socket poll armed) returns, and the pool goes on reading right; a pool closed under reads
/// in flight gives errors or right data, never wrong data.
#[test]
fn dropping_a_queue_with_reads_in_flight() {
    let seed = test_seed("read_queue drop", 0xd20b);
    within(600, "dropping queues", move || {
        let mut rng = Rng::seed_from_u64(seed);
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::create(file_drives(dir.path(), 5), &config()).unwrap();
        pool.create_volume_with("v", 8 << 20, Compression::Off)
            .unwrap();
        let v = pool.volume("v").unwrap();
        let data = noise(6 << 20, seed);
        v.write(0, &data).unwrap();
        v.flush().unwrap();
        let (sock, _peer) = UnixStream::pair().unwrap();
        for trial in 0..12u64 {
            let mut q = ReadQueue::new();
            if trial % 4 == 3 {
                q.hold_inline(Some(seed ^ trial));
            }
            for t in 0..rng.random_range(20..80u64) {
                let lba = rng.random_range(0..(8 << 20) / B - 256);
                let len = if rng.random_bool(0.8) {
                    1 << 20
                } else {
                    rng.random_range(1..300_000)
                };
                q.start(&v, t, lba * B + (trial % 2) * rng.random_range(0..B), len);
            }
            match trial % 4 {
                0 => q.submit(),
                1 => {} // queued, never submitted: the drop submits and waits
                2 => {
                    // Some taken, a socket poll armed.
                    q.submit();
                    let _ = q.wait(Some(sock.as_raw_fd())).unwrap();
                    let _ = q.take();
                }
                _ => q.poll(),
            }
            drop(q);
        }
        let mut all = vec![0u8; 6 << 20];
        v.read(0, &mut all).unwrap();
        assert!(
            all == data,
            "seed {seed}: after the drops: {}",
            diff(&all, &data)
        );

        // The pool closed while reads are in flight.
        let mut q = ReadQueue::new();
        for t in 0..32u64 {
            q.start(&v, t, t * (128 << 10), 1 << 20);
        }
        q.submit();
        pool.close().unwrap();
        for d in drain(&mut q, &format!("seed {seed}: closed under the reads")) {
            if d.result.is_ok() {
                let off = (d.token * (128 << 10)) as usize;
                let want = &data[off..off + (1 << 20)];
                assert!(
                    d.data() == want,
                    "seed {seed}: read {} on a closing pool: {}",
                    d.token,
                    diff(d.data(), want)
                );
            }
        }
        // And a queue dropped with reads in flight on a closed pool.
        let mut q = ReadQueue::new();
        for t in 0..8u64 {
            q.start(&v, t, t * (256 << 10), 1 << 20);
        }
        drop(q);
    });
}

/// A drive failed, then replaced (its data rebuilt onto the others and the new drive, the
/// old one retired), while reads of it are in flight: the reads still return the data, the
/// failed drive's blocks reconstructed from parity.
#[test]
fn a_drive_failed_or_replaced_under_reads_in_flight() {
    let seed = test_seed("read_queue failed drive", 0xfa11);
    let mut rng = Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let drives = file_drives(dir.path(), 5);
    let pool = Pool::create(drives.clone(), &config()).unwrap();
    pool.create_volume_with("v", 8 << 20, Compression::Off)
        .unwrap();
    let v = pool.volume("v").unwrap();
    let data = noise(6 << 20, seed);
    v.write(0, &data).unwrap();
    v.flush().unwrap();
    let victim = 2usize;
    let mut q = ReadQueue::new();

    let start_reads = |q: &mut ReadQueue, rng: &mut Rng, base: u64| {
        let mut specs = HashMap::new();
        for t in 0..24u64 {
            let (off, len) = if t < 6 {
                (t << 20, 1usize << 20)
            } else if rng.random_bool(0.7) {
                let blocks = rng.random_range(1..=256u64);
                let lba = rng.random_range(0..=(6 << 20) / B - blocks);
                (lba * B, (blocks * B) as usize)
            } else {
                let off = rng.random_range(0..6u64 << 20);
                (
                    off,
                    rng.random_range(1..=200_000usize)
                        .min((6 << 20) - off as usize),
                )
            };
            q.start(&v, base + t, off, len);
            specs.insert(base + t, (off as usize, len));
        }
        specs
    };
    let check = |q: &mut ReadQueue, mut specs: HashMap<u64, (usize, usize)>, what: &str| {
        for d in drain(q, what) {
            let (off, len) = specs.remove(&d.token).expect("each token once");
            if let Err(e) = &d.result {
                panic!("{what}: {len} bytes at {off}: {e}");
            }
            let want = &data[off..off + len];
            assert!(
                d.data() == want,
                "{what}: {len} bytes at {off}: {}",
                diff(d.data(), want)
            );
        }
        assert!(specs.is_empty(), "{what}: reads never out");
    };

    // Reads queued for the drive; before the kernel sees them the drive's data area is
    // overwritten (what a failing drive returns) and the drive is failed.
    let specs = start_reads(&mut q, &mut rng, 0);
    let before = pool.stats();
    let junk = noise(1 << 20, seed ^ 0x7777);
    let d = &drives[victim];
    let mut off = 1u64 << 20;
    while off + (1 << 20) <= d.info().size {
        d.write_at(off, &junk).unwrap();
        off += 1 << 20;
    }
    pool.fail_drive(victim).unwrap();
    q.submit();
    check(
        &mut q,
        specs,
        &format!("seed {seed}: drive {victim} failed"),
    );
    // (Without io_uring the reads completed inside `start`, before the drive went bad.)
    let after = pool.stats();
    assert!(
        !q.asynchronous() || after.degraded_reads > before.degraded_reads,
        "seed {seed}: the failed drive's blocks were reconstructed: {after:?}"
    );
    // New reads plan around the failed drive.
    let specs = start_reads(&mut q, &mut rng, 100);
    q.submit();
    check(&mut q, specs, &format!("seed {seed}: drive {victim} out"));

    // Reads in flight while the drive is replaced: the rebuild moves every block that
    // depended on it (and the freed segments are reused by what it writes).
    let specs = start_reads(&mut q, &mut rng, 200);
    let new: DriveRef =
        Arc::new(FileDrive::create(&dir.path().join("d5.img"), DRIVE_SIZE).unwrap());
    pool.replace_drive(victim, new).unwrap();
    q.submit();
    check(
        &mut q,
        specs,
        &format!("seed {seed}: drive {victim} replaced"),
    );
    // And after it, through the queue and synchronously.
    let specs = start_reads(&mut q, &mut rng, 300);
    q.submit();
    check(
        &mut q,
        specs,
        &format!("seed {seed}: after the replacement"),
    );
    let mut all = vec![0u8; 6 << 20];
    v.read(0, &mut all).unwrap();
    assert!(all == data, "seed {seed}: {}", diff(&all, &data));
    assert_eq!(
        pool.stats().unrecoverable_blocks,
        0,
        "seed {seed}: nothing lost"
    );
}

/// Writes and trims of the very blocks a read is reading, while it is in flight (before its
/// drive reads are submitted, or after): every block it returns is the block's content
/// before or after them, never a torn or foreign block.
#[test]
fn blocks_overwritten_under_reads_in_flight_are_old_or_new() {
    let seed = test_seed("read_queue overwrites", 0x0a1d);
    let mut rng = Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(file_drives(dir.path(), 5), &config()).unwrap();
    pool.create_volume_with("v", 4 << 20, Compression::Off)
        .unwrap();
    let v = pool.volume("v").unwrap();
    let blocks = (4 << 20) / B;
    let mut model = vec![0u8; 4 << 20];
    for lba in 0..blocks {
        let b = block_for(lba << 16);
        v.write(lba * B, &b).unwrap();
        model[(lba * B) as usize..][..4096].copy_from_slice(&b);
    }
    v.flush().unwrap();
    let mut q = ReadQueue::new();
    let mut stamp = 1u64;
    for round in 0..10u64 {
        let ctx = format!("seed {seed} round {round}");
        let before = model.clone();
        let n = rng.random_range(10..40u64);
        let mut specs = HashMap::new();
        for t in 0..n {
            let (off, len) = if rng.random_bool(0.75) {
                let nb = rng.random_range(1..=256u64);
                let lba = rng.random_range(0..=blocks - nb);
                (lba * B, nb * B)
            } else {
                let off = rng.random_range(0..4u64 << 20);
                (off, rng.random_range(1..=300_000u64).min((4 << 20) - off))
            };
            q.start(&v, t, off, len as usize);
            specs.insert(t, (off as usize, len as usize));
            if t == n / 2 && round % 2 == 0 {
                q.submit();
            }
        }
        // Overwrite and trim blocks under them, and let the cleaner move the rest.
        for _ in 0..rng.random_range(50..200) {
            let lba = rng.random_range(0..blocks);
            if rng.random_bool(0.85) {
                stamp += 1;
                let b = block_for((lba << 16) | stamp);
                v.write(lba * B, &b).unwrap();
                model[(lba * B) as usize..][..4096].copy_from_slice(&b);
            } else {
                let nb = rng.random_range(1..=16u64).min(blocks - lba);
                v.trim(lba * B, nb * B).unwrap();
                model[(lba * B) as usize..((lba + nb) * B) as usize].fill(0);
            }
        }
        if rng.random_bool(0.5) {
            pool.flush().unwrap();
        }
        pool.gc(usize::MAX / 2).unwrap();
        for d in drain(&mut q, &ctx) {
            let (off, len) = specs.remove(&d.token).expect("each token once");
            if let Err(e) = &d.result {
                panic!("{ctx}: {len} bytes at {off}: {e}");
            }
            // Block by block (the parts of the edge blocks the read covers).
            let mut at = off;
            while at < off + len {
                let end = ((at / 4096 + 1) * 4096).min(off + len);
                let got = &d.data()[at - off..end - off];
                assert!(
                    got == &before[at..end] || got == &model[at..end],
                    "{ctx}: {len} bytes at {off}: block {} is neither its old nor its new content",
                    at / 4096
                );
                at = end;
            }
        }
        assert!(specs.is_empty(), "{ctx}: reads never out");
    }
    let mut all = vec![0u8; 4 << 20];
    v.read(0, &mut all).unwrap();
    assert!(all == model, "seed {seed}: {}", diff(&all, &model));
}

/// Buffers given back with `recycle` serve later reads of their size with whatever an earlier
/// read left in them: a read of unmapped, trimmed, buffered (not yet on the drives) or
/// compressed blocks, or of blocks on a failed drive, in such a buffer returns the volume's
/// bytes, none of the earlier read's.
/// Gives a taken read's buffer back the ways a front-end does: `recycle`, or out of the queue
/// as `ReadData` dropped here or on another thread (a reply written by another thread).
fn give_back(q: &mut ReadQueue, d: ReadDone, how: u64) {
    match how % 3 {
        0 => q.recycle(d),
        1 => drop(q.into_data(d)),
        _ => {
            let data = q.into_data(d);
            std::thread::spawn(move || drop(data)).join().unwrap();
        }
    }
}

#[test]
fn recycled_buffers_never_show_an_earlier_reads_bytes() {
    let seed = test_seed("read_queue recycle", 0x2ec7);
    let mut rng = Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(file_drives(dir.path(), 5), &config()).unwrap();
    pool.create_volume_with("raw", 4 << 20, Compression::Off)
        .unwrap();
    pool.create_volume_with("lz", 2 << 20, Compression::Lz4)
        .unwrap();
    let raw = pool.volume("raw").unwrap();
    let lz = pool.volume("lz").unwrap();
    let mut m_raw = noise(2 << 20, seed);
    raw.write(0, &m_raw).unwrap();
    m_raw.resize(4 << 20, 0);
    let mut m_lz = compressible(1 << 20, seed);
    lz.write(0, &m_lz).unwrap();
    m_lz.resize(2 << 20, 0);
    pool.flush().unwrap();
    let mut q = ReadQueue::new();
    let sizes = [4096usize, 8192, 64 << 10, 128 << 10, 1 << 20];
    let (mut reused, mut checked) = (0u64, 0u64);
    let mut token = 0u64;
    for round in 0..8u64 {
        let ctx = format!("seed {seed} round {round}");
        // Fill the queue's spare buffers with noise: reads of the written half of `raw`.
        let mut recycled: HashSet<usize> = HashSet::new();
        for _ in 0..48 {
            let len = sizes[rng.random_range(0..sizes.len())];
            let lba = rng.random_range(0..((2 << 20) - len as u64) / B + 1);
            q.start(&raw, token, lba * B, len);
            token += 1;
        }
        q.submit();
        for d in drain(&mut q, &ctx) {
            assert!(d.result.is_ok(), "{ctx}: {:?}", d.result);
            recycled.insert(d.data().as_ptr() as usize);
            give_back(&mut q, d, token ^ round);
            token += 1;
        }
        // Holes punched into the noise, blocks left in the open stripe, a drive out.
        for _ in 0..4 {
            let lba = rng.random_range(0..(2 << 20) / B - 32);
            let nb = rng.random_range(1..=32u64);
            raw.trim(lba * B, nb * B).unwrap();
            m_raw[(lba * B) as usize..((lba + nb) * B) as usize].fill(0);
        }
        pool.flush().unwrap();
        for v in 0..2 {
            let (vol, m) = if v == 0 {
                (&raw, &mut m_raw)
            } else {
                (&lz, &mut m_lz)
            };
            let lba = rng.random_range(0..m.len() as u64 / B - 3);
            let data = if v == 0 {
                noise(3 * 4096, seed ^ round)
            } else {
                compressible(3 * 4096, seed ^ round)
            };
            vol.write(lba * B, &data).unwrap();
            m[(lba * B) as usize..][..3 * 4096].copy_from_slice(&data);
        }
        if round == 5 {
            pool.fail_drive(3).unwrap();
        }
        // Reads of the same sizes, anywhere in both volumes.
        let mut specs = HashMap::new();
        for _ in 0..48 {
            let len = sizes[rng.random_range(0..sizes.len())];
            let v = rng.random_range(0..2usize);
            let size = if v == 0 { 4u64 << 20 } else { 2 << 20 };
            let lba = rng.random_range(0..(size - len as u64) / B + 1);
            q.start(if v == 0 { &raw } else { &lz }, token, lba * B, len);
            specs.insert(token, (v, (lba * B) as usize, len));
            token += 1;
        }
        q.submit();
        for d in drain(&mut q, &ctx) {
            let (v, off, len) = specs.remove(&d.token).expect("each token once");
            if let Err(e) = &d.result {
                panic!("{ctx}: {len} bytes at {off} of volume {v}: {e}");
            }
            let want = if v == 0 { &m_raw } else { &m_lz };
            let want = &want[off..off + len];
            assert!(
                d.data() == want,
                "{ctx}: {len} bytes at {off} of volume {v} in a recycled buffer: {}",
                diff(d.data(), want)
            );
            checked += 1;
            if recycled.contains(&(d.data().as_ptr() as usize)) {
                reused += 1;
            }
            give_back(&mut q, d, checked);
        }
    }
    // A 1 MiB read's data dropped on another thread serves the next read of its size (the
    // spares are shared with the data out of the queue).
    let mut q = ReadQueue::new();
    q.start(&raw, token, 0, 1 << 20);
    q.submit();
    let d = drain(&mut q, &format!("seed {seed}: out")).pop().unwrap();
    assert!(d.result.is_ok(), "seed {seed}: {:?}", d.result);
    let at = d.data().as_ptr();
    let data = q.into_data(d);
    let before = q.spare_bytes();
    std::thread::spawn(move || drop(data)).join().unwrap();
    assert_eq!(
        q.spare_bytes(),
        before + (1 << 20),
        "seed {seed}: not given back"
    );
    q.start(&raw, token + 1, 1 << 20, 1 << 20);
    q.submit();
    let d = drain(&mut q, &format!("seed {seed}: back")).pop().unwrap();
    assert!(d.result.is_ok(), "seed {seed}: {:?}", d.result);
    assert_eq!(
        q.spare_bytes(),
        before,
        "seed {seed}: the spare buffer not taken"
    );
    assert_eq!(d.data().as_ptr(), at, "seed {seed}: not the same buffer");
    assert!(
        d.data() == &m_raw[1 << 20..2 << 20],
        "seed {seed}: {}",
        diff(d.data(), &m_raw[1 << 20..2 << 20])
    );
    // A read's data outlives its queue (dropped after it: freed, not given back).
    let kept = q.into_data(d);
    q.start(&raw, token + 2, 0, 1 << 20);
    q.submit();
    drop(drain(&mut q, &format!("seed {seed}: last")));
    drop(q);
    assert!(
        kept[..] == m_raw[1 << 20..2 << 20],
        "seed {seed}: data kept beyond its queue"
    );
    drop(kept);
    eprintln!("seed {seed}: {checked} reads checked, {reused} in a recycled buffer");
    assert!(reused > 0, "seed {seed}: no read got a recycled buffer");
}

/// A `wait(Some(b))` after an earlier `wait(Some(a))` whose poll has not fired (a read
/// completed first) polls `b`, not `a` (found by this test: the queue once remembered only
/// that a poll was armed, not on which descriptor, and slept while `b` was readable).
#[test]
fn wait_polls_the_descriptor_it_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(file_drives(dir.path(), 5), &config()).unwrap();
    pool.create_volume_with("v", 2 << 20, Compression::Off)
        .unwrap();
    let v = pool.volume("v").unwrap();
    v.write(0, &noise(1 << 20, 5)).unwrap();
    v.flush().unwrap();
    let mut q = ReadQueue::new();
    if !q.asynchronous() {
        return;
    }
    // A read in flight and a quiet socket `a`: the wait returns for the read, and leaves
    // its poll of `a` armed.
    let (a, pa) = UnixStream::pair().unwrap();
    q.start(&v, 1, 0, 1 << 20);
    q.submit();
    let mut waits = 0;
    while q.take().is_none() {
        assert!(!q.wait(Some(a.as_raw_fd())).unwrap(), "a quiet socket");
        waits += 1;
        assert!(waits < 1_000_000, "the read never came out");
    }
    // Now `b` is readable, and the wait is on `b`.
    let (b, mut pb) = UnixStream::pair().unwrap();
    pb.write_all(&[1]).unwrap();
    let fb = b.as_raw_fd();
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let r = q.wait(Some(fb)).unwrap();
        let _ = tx.send(r);
    });
    // A hang detector: a wait that polls `b` returns at once.
    let woke = rx.recv_timeout(Duration::from_secs(10));
    drop(pa); // unsticks a wait that polls `a` instead
    waiter.join().unwrap();
    drop((a, b, pb));
    assert_eq!(
        woke,
        Ok(true),
        "wait(Some(b)) with b readable did not return: it polls the earlier descriptor"
    );
}

/// `hold_inline(Some(_))` while reads are kept keeps them (found by this test: a new seed
/// once replaced the kept list, and the reads in it never came out).
#[test]
fn hold_inline_with_a_new_seed_keeps_the_held_reads() {
    let drives = mem_drives(5, false);
    let pool = Pool::create(as_refs(&drives), &small_config(4, 1)).unwrap();
    pool.create_volume_with("v", 1 << 20, Compression::Off)
        .unwrap();
    let v = pool.volume("v").unwrap();
    let mut q = ReadQueue::new();
    q.hold_inline(Some(1));
    for t in 0..4 {
        q.start(&v, t, 0, 4096);
    }
    q.hold_inline(Some(2));
    let mut out = 0;
    for _ in 0..100 {
        let _ = q.wait(None).unwrap();
        while q.take().is_some() {
            out += 1;
        }
    }
    q.hold_inline(None);
    while q.take().is_some() {
        out += 1;
    }
    assert_eq!(
        (out, q.outstanding()),
        (4, 0),
        "reads kept back before the new seed were lost"
    );
}

/// More reads finish than the ring's completion queue holds (512) before the caller looks,
/// and the caller only ever polls, as a reactor does (it waits in its epoll, never in the
/// queue): every read still comes out, with its data (found by the real-disk benchmark: a
/// reactor serving 1 MiB reads of data scattered by random writes, hundreds of drive reads
/// each, spun on a ring that polled readable while its completions sat in the kernel's
/// overflow list, which only an enter asking for events moves into the queue).
#[test]
fn reads_beyond_the_completion_queue_come_out_by_polling_alone() {
    let seed = test_seed("read_queue overflow", 0x0f10_0d5e);
    let mut rng = Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(file_drives(dir.path(), 5), &config()).unwrap();
    let size = 8u64 << 20;
    pool.create_volume_with("v", size, Compression::Off)
        .unwrap();
    let v = pool.volume("v").unwrap();
    let data = noise(size as usize, seed);
    v.write(0, &data).unwrap();
    v.flush().unwrap();
    let mut q = ReadQueue::new();
    if !q.asynchronous() {
        return;
    }
    // Single blocks far apart: one drive read each, 3000 of them.
    let reads: Vec<u64> = (0..3000).map(|_| rng.random_range(0..size / B)).collect();
    let got = within(60, "reads polled past a full completion queue", move || {
        for (i, &lba) in reads.iter().enumerate() {
            q.start(&v, i as u64, lba * B, B as usize);
        }
        q.submit();
        // Let the drives finish them all before the first look.
        std::thread::sleep(Duration::from_millis(300));
        let mut got = Vec::new();
        while q.outstanding() > 0 {
            q.poll();
            match q.take() {
                Some(d) => got.push((d.token, reads[d.token as usize], d)),
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        got
    });
    assert_eq!(got.len(), 3000, "seed {seed}");
    let mut seen = HashSet::new();
    for (token, lba, d) in &got {
        assert!(
            seen.insert(*token),
            "seed {seed}: read {token} came out twice"
        );
        d.result
            .as_ref()
            .unwrap_or_else(|e| panic!("seed {seed}: read {token} failed: {e}"));
        let want = &data[(lba * B) as usize..((lba + 1) * B) as usize];
        assert!(
            d.data() == want,
            "seed {seed}: read {token} of block {lba}: {}",
            diff(d.data(), want)
        );
    }
}
