//! A slow read never holds up the others (issue 16): over a real pool whose one drive is
//! slow, a connection keeps several requests in progress and answers a fast read sent after
//! a slow one first; every reply carries the right data.

mod common;

use common::*;
use flashpool_engine::drive::{Drive, DriveInfo, DriveRef, MemDrive};
use flashpool_engine::{Compression, Pool, PoolConfig, Volume};
use flashpool_nbd::proto::*;
use flashpool_nbd::wire;
use flashpool_nbd::{Config, Export, ExportError, Extent, MemExport, StaticExports};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A memory drive whose reads take `DELAY` while `slow` is set (a device that stalls).
struct Stalling {
    inner: MemDrive,
    slow: AtomicBool,
}

const DELAY: Duration = Duration::from_millis(600);

impl Drive for Stalling {
    fn info(&self) -> DriveInfo {
        self.inner.info()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.slow.load(Ordering::SeqCst) {
            std::thread::sleep(DELAY);
        }
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A volume as an export, the way `flashpool serve` adapts it (crates/cli/src/export.rs).
struct VolumeExport(Volume);

fn err(e: flashpool_engine::Error) -> ExportError {
    ExportError::from_errno(e.errno(), e.to_string())
}

impl Export for VolumeExport {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.0.read(offset, buf).map_err(err)
    }
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<Result<(), ExportError>> {
        self.0
            .read_many(reads)
            .into_iter()
            .map(|r| r.map_err(err))
            .collect()
    }
    fn read_may_block(&self, offset: u64, len: u64) -> bool {
        self.0.read_may_wait(offset, len)
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), ExportError> {
        self.0.write(offset, data).map_err(err)
    }
    fn flush(&self) -> Result<(), ExportError> {
        self.0.flush().map_err(err)
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.0.trim(offset, len).map_err(err)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.0.write_zeroes(offset, len).map_err(err)
    }
    fn block_status(&self, _offset: u64, len: u64) -> Result<Vec<Extent>, ExportError> {
        Ok(vec![Extent::data(len)])
    }
}

fn noise(len: usize) -> Vec<u8> {
    let mut x = 0x9e3779b97f4a7c15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn a_fast_read_is_answered_before_a_slow_one_sent_earlier() {
    let drives: Vec<Arc<Stalling>> = (0..5)
        .map(|i| {
            Arc::new(Stalling {
                inner: MemDrive::new(64 << 20, format!("mem:{i}")),
                slow: AtomicBool::new(false),
            })
        })
        .collect();
    let refs: Vec<DriveRef> = drives.iter().map(|d| d.clone() as DriveRef).collect();
    let cfg = PoolConfig {
        k: 4,
        m: 1,
        chunk_size: 64 << 10,
        segment_size: 4 << 20,
        checkpoint_interval: 64 << 20,
    };
    let pool = Pool::create(refs, &cfg).unwrap();
    pool.create_volume_with("v", 16 << 20, Compression::Off)
        .unwrap();
    let v = pool.volume("v").unwrap();
    let data = noise(2 << 20);
    v.write(0, &data).unwrap();
    v.flush().unwrap();
    // Which drive holds block 0, and a block on another drive.
    let slow_read = |off: u64| {
        let t = Instant::now();
        let mut b = vec![0u8; 4096];
        v.read(off, &mut b).unwrap();
        t.elapsed() >= DELAY / 2
    };
    let victim = (0..5)
        .find(|&d| {
            drives[d].slow.store(true, Ordering::SeqCst);
            let hit = slow_read(0);
            drives[d].slow.store(false, Ordering::SeqCst);
            hit
        })
        .expect("block 0 is on some drive");
    drives[victim].slow.store(true, Ordering::SeqCst);
    let fast = (1..32u64)
        .map(|c| c * (64 << 10))
        .find(|&off| !slow_read(off))
        .expect("a block on another drive");
    assert!(v.read_may_wait(0, 4096), "a drive read may wait");

    let mut set = StaticExports::new();
    set.add("v", "pool volume", Arc::new(VolumeExport(v.clone())));
    let srv = TestServer::start_exports(set, Arc::new(MemExport::new(4096)), Config::default());
    let mut c = srv.raw();
    c.hello();
    c.go("v");
    // Both requests in one write: the slow one first.
    let mut both = read_req(1, 0, 4096);
    both.extend_from_slice(&read_req(2, fast, 4096));
    c.send(&both);
    let (e, h) = c.simple();
    assert_eq!((e, h), (0, 2), "the fast read is answered first");
    assert_eq!(c.recv(4096), data[fast as usize..fast as usize + 4096]);
    let (e, h) = c.simple();
    assert_eq!((e, h), (0, 1));
    assert_eq!(c.recv(4096), data[..4096]);
    drives[victim].slow.store(false, Ordering::SeqCst);
    // Many reads in flight at once over the whole range, each answered with its data.
    let mut reqs = Vec::new();
    for i in 0..48u64 {
        reqs.extend_from_slice(&wire::encode_request(&wire::Request {
            flags: 0,
            kind: CMD_READ,
            handle: 100 + i,
            offset: i * 40960,
            len: 8192,
        }));
    }
    c.send(&reqs);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..48 {
        let (e, h) = c.simple();
        assert_eq!(e, 0);
        assert!(seen.insert(h), "one reply per request");
        let off = ((h - 100) * 40960) as usize;
        assert_eq!(c.recv(8192), data[off..off + 8192], "reply {h}");
    }
    c.disc();
    srv.stop();
}
