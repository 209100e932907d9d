//! Garbage-collection soak: a small pool kept nearly full by random overwrites, trims and
//! flushes, forcing thousands of cleaning cycles, checked against a reference model, with a
//! crash (volatile caches dropped at random) and reopen in the middle. Deterministic per seed.

mod common;

use common::*;
use flashpool_engine::drive::{CrashFate, MemDrive};
use flashpool_engine::{Compression, GcPolicy, Pool, PoolConfig};
use rand::{RngExt, SeedableRng};
use std::collections::HashMap;
use std::sync::Arc;

const DRIVE: u64 = 12 << 20;

fn config() -> PoolConfig {
    PoolConfig {
        k: 4,
        m: 1,
        chunk_size: 16 << 10,
        segment_size: 256 << 10,
        checkpoint_interval: 4 << 20,
    }
}

/// Per block: the stamp it holds now (0 = zeros) and every stamp a crash may leave.
struct Model {
    current: HashMap<u64, u64>,
    candidates: HashMap<u64, Vec<u64>>,
}

impl Model {
    fn set(&mut self, lba: u64, stamp: u64) {
        self.current.insert(lba, stamp);
        self.candidates
            .entry(lba)
            .or_insert_with(|| vec![0])
            .push(stamp);
    }
    fn flush(&mut self) {
        self.candidates = self.current.iter().map(|(l, s)| (*l, vec![*s])).collect();
    }
    fn expect(&self, lba: u64) -> u64 {
        self.current.get(&lba).copied().unwrap_or(0)
    }
}

fn content(stamp: u64) -> Vec<u8> {
    if stamp == 0 {
        vec![0u8; 4096]
    } else {
        block_for(stamp)
    }
}

fn soak(seed: u64, policy: GcPolicy, ops: u64) -> (u64, u64) {
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut drives: Vec<Arc<MemDrive>> = (0..5)
        .map(|i| Arc::new(MemDrive::tracked(DRIVE, format!("mem:{i}"))))
        .collect();
    let pool = Pool::create(as_refs(&drives), &config()).unwrap();
    pool.set_gc_policy(policy);
    let cap = pool.info().capacity_bytes;
    let blocks = cap / 4096 * 60 / 100; // 40 % spare
                                        // Uncompressed, so the data really fills the pool (tests/compression.rs covers GC of packed blocks).
    pool.create_volume_with("v", blocks * 4096, Compression::Off)
        .unwrap();
    let mut pool = Some(pool);
    let mut m = Model {
        current: HashMap::new(),
        candidates: HashMap::new(),
    };
    m.flush();
    let mut cleaned = 0;
    for i in 1..=ops {
        let p = pool.as_ref().unwrap();
        let vol = p.volume("v").unwrap();
        let r = rng.random_range(0..1000);
        if r < 880 {
            // Hot/cold skew: most writes hit the first fifth of the volume.
            let lba = if rng.random_bool(0.7) {
                rng.random_range(0..blocks / 5)
            } else {
                rng.random_range(0..blocks)
            };
            vol.write(lba * 4096, &content(i))
                .unwrap_or_else(|e| panic!("seed {seed} op {i}: write: {e}"));
            m.set(lba, i);
        } else if r < 920 {
            let lba = rng.random_range(0..blocks - 8);
            let n = rng.random_range(1..8);
            vol.trim(lba * 4096, n * 4096).unwrap();
            for l in lba..lba + n {
                m.set(l, 0);
            }
        } else if r < 950 {
            p.flush().unwrap();
            m.flush();
        } else if r < 999 {
            let lba = rng.random_range(0..blocks);
            let mut b = vec![0u8; 4096];
            vol.read(lba * 4096, &mut b).unwrap();
            assert!(
                b == content(m.expect(lba)),
                "seed {seed} op {i}: block {lba} wrong"
            );
        } else if i > ops / 3 && i < ops * 2 / 3 {
            // Crash: every unflushed drive write persisted, lost or torn at random.
            cleaned += p.stats().gc_segments_cleaned;
            drop(pool.take());
            drop(vol);
            drives = drives
                .iter()
                .map(|d| {
                    Arc::new(d.crash(|_, sectors| match rng.random_range(0..3) {
                        0 => CrashFate::Lost,
                        1 => CrashFate::Torn(rng.random_range(0..sectors.max(1))),
                        _ => CrashFate::Persisted,
                    }))
                })
                .collect();
            let p = Pool::open(as_refs(&drives))
                .unwrap_or_else(|e| panic!("seed {seed} op {i}: reopen: {e}"));
            p.set_gc_policy(policy);
            let vol = p.volume("v").unwrap();
            let mut b = vec![0u8; 4096];
            for lba in 0..blocks {
                vol.read(lba * 4096, &mut b).unwrap();
                let cands = m.candidates.get(&lba).cloned().unwrap_or_else(|| vec![0]);
                let got = cands.iter().find(|s| b == content(**s)).copied();
                let got = got.unwrap_or_else(|| {
                    panic!("seed {seed} op {i}: after crash block {lba} holds none of {cands:?}")
                });
                if got == 0 {
                    m.current.remove(&lba);
                } else {
                    m.current.insert(lba, got);
                }
            }
            m.flush();
            pool = Some(p);
        }
    }
    let p = pool.unwrap();
    let vol = p.volume("v").unwrap();
    let mut b = vec![0u8; 4096];
    for lba in 0..blocks {
        vol.read(lba * 4096, &mut b).unwrap();
        assert!(
            b == content(m.expect(lba)),
            "seed {seed}: final block {lba} wrong"
        );
    }
    let s = p.stats();
    cleaned += s.gc_segments_cleaned;
    eprintln!(
        "seed {seed}: {cleaned} segments cleaned, WAF {:.2}, {} GC bytes",
        s.write_amplification(),
        s.gc_relocated_bytes
    );
    (cleaned, s.gc_relocated_bytes)
}

#[test]
fn gc_soak_greedy() {
    let seed = test_seed("gc soak, greedy", 11);
    let (cleaned, moved) = soak(seed, GcPolicy::Greedy, 140_000);
    assert!(cleaned > 1000, "only {cleaned} cleaning cycles");
    assert!(moved > 0);
}

#[test]
fn gc_soak_cost_benefit() {
    let seed = test_seed("gc soak, cost-benefit", 12);
    let (cleaned, _) = soak(seed, GcPolicy::CostBenefit, 50_000);
    assert!(cleaned > 300, "only {cleaned} cleaning cycles");
}

/// A truly full pool says ENOSPC (never corrupts), and recovers once space is freed.
#[test]
fn full_pool_enospc_then_recovers() {
    let drives: Vec<Arc<MemDrive>> = (0..5)
        .map(|i| Arc::new(MemDrive::new(DRIVE, format!("mem:{i}"))))
        .collect();
    let pool = Pool::create(as_refs(&drives), &config()).unwrap();
    let cap = pool.info().capacity_bytes;
    pool.create_volume_with("a", cap, Compression::Off).unwrap(); // thin: larger than what fits after overheads
    let vol = pool.volume("a").unwrap();
    let mut written = 0u64;
    let err = loop {
        match vol.write(written * 4096, &block_for(written + 1)) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
        assert!(written < cap / 4096, "pool never filled");
    };
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    let mut b = vec![0u8; 4096];
    for l in (0..written).step_by(97) {
        vol.read(l * 4096, &mut b).unwrap();
        assert!(b == block_for(l + 1), "block {l} damaged by a full pool");
    }
    // Free a third and write again: the cleaner makes room.
    vol.trim(0, written / 3 * 4096).unwrap();
    eprintln!("full at {written} blocks: {:?}", pool.info());
    for l in 0..written / 4 {
        vol.write((written / 3 + l) * 4096, &block_for(1_000_000 + l))
            .unwrap_or_else(|e| {
                panic!(
                    "rewrite {l} of {}: {e}; {:?} {:?}",
                    written / 4,
                    pool.info(),
                    pool.stats()
                )
            });
    }
    pool.flush().unwrap();
    vol.read((written / 3) * 4096, &mut b).unwrap();
    assert!(b == block_for(1_000_000));
}
