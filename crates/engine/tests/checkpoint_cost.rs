//! What checkpoints cost per host byte (issue 18): a checkpoint is due after the interval (or
//! 64 times the last checkpoint's size) of host data stripes, not of the cleaner's
//! relocations, so a pool cleaning hard at a high fill rewrites its maps no more often per
//! host byte than one that does not clean at all.

mod common;

use common::*;
use flashpool_engine::drive::MemDrive;
use flashpool_engine::{Compression, Pool, PoolConfig};

#[test]
fn checkpoints_follow_host_writes_not_relocations() {
    let seed = test_seed("checkpoint_cost", 11);
    let drives: Vec<_> = (0..5)
        .map(|i| std::sync::Arc::new(MemDrive::new(64 << 20, format!("mem:{i}"))))
        .collect();
    let cfg = PoolConfig {
        checkpoint_interval: 1 << 20,
        ..small_config(4, 1)
    };
    let pool = Pool::create(as_refs(&drives), &cfg).unwrap();
    let cap = pool.info().capacity_bytes;
    // A high fill (chunk headers take a fifth of this small geometry): the cleaner
    // relocates more than the host writes.
    let vol_size = cap * 50 / 100 / 4096 * 4096;
    pool.create_volume_with("v", vol_size, Compression::Off)
        .unwrap();
    let v = pool.volume("v").unwrap();
    let blocks = vol_size / 4096;
    let mut buf = vec![0u8; 4096];
    for b in 0..blocks {
        buf[..8].copy_from_slice(&b.to_le_bytes());
        v.write(b * 4096, &buf).unwrap();
    }
    let before = pool.stats();
    let mut x = seed | 1;
    for i in 0..blocks * 3 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x % blocks;
        buf[..8].copy_from_slice(&i.to_le_bytes());
        v.write(b * 4096, &buf).unwrap();
        if i % 16 == 0 {
            // The serve cleaner, inline: rounds of one segment each above the high water.
            loop {
                let free = pool.info().free_segments;
                if free > pool.gc_high_water() {
                    break;
                }
                pool.gc(free).unwrap();
                if pool.info().free_segments <= free {
                    break;
                }
            }
        }
    }
    let s = pool.stats();
    let host = s.host_write_bytes - before.host_write_bytes;
    let moved = s.gc_relocated_bytes - before.gc_relocated_bytes;
    let cps = s.checkpoints - before.checkpoints;
    let cp_bytes = s.media_checkpoint_bytes - before.media_checkpoint_bytes;
    let interval = cfg.checkpoint_interval as f64;
    // Host data stripes carry the host's bytes with parity and chunk headers: under 1.6 x
    // (5/4 for parity, 5/4 for a 4 KiB header per 16 KiB chunk).
    let host_stripes = host as f64 * 1.6;
    println!(
        "seed {seed}: host {} MiB, relocated {} MiB, {cps} checkpoints of {} KiB media in all",
        host >> 20,
        moved >> 20,
        cp_bytes >> 10
    );
    assert!(
        moved > host,
        "seed {seed}: the cleaner must relocate more than the host writes ({moved} vs {host})"
    );
    assert!(
        cps >= 2,
        "seed {seed}: {cps} checkpoints in {host} host bytes"
    );
    // A checkpoint is due after `every` host stripe bytes: the interval or 64 times the
    // checkpoint (whose encoded size is at least its media bytes / 1.6), whichever is larger.
    let every = interval.max(64.0 * (cp_bytes as f64 / cps as f64) / 1.6);
    assert!(
        (cps as f64) <= host_stripes / every + 1.0,
        "seed {seed}: {cps} checkpoints for {host} host bytes (one per {every} host stripe \
         bytes): the cleaner's relocations ({moved} bytes) brought checkpoints"
    );
    // So checkpoints cost at most about 1/64 of what the hosts write, whatever the cleaner
    // does.
    assert!(
        (cp_bytes as f64) <= host_stripes / 64.0 * 1.6 + cp_bytes as f64 / cps as f64,
        "seed {seed}: checkpoints wrote {cp_bytes} media bytes for {host} host bytes"
    );
}
