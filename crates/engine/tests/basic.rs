//! Basic behaviour of the pool's block API: round trips, holes, ranges, volumes, reopen.

mod common;

use common::*;
use flashpool_engine::{BlockState, Error, Pool};

#[test]
fn write_read_flush_reopen_every_protection_level() {
    for (k, m) in [(4, 0), (4, 1), (3, 2)] {
        let drives = mem_drives(5, false);
        let pool = Pool::create(as_refs(&drives), &small_config(k, m)).unwrap();
        let v = pool.create_volume("v", 8 << 20).unwrap();
        assert_eq!(v.size, 8 << 20);
        let vol = pool.volume("v").unwrap();
        for i in 0..600u64 {
            vol.write((i * 7 % 2048) * 4096, &block_for(i)).unwrap();
        }
        let mut b = vec![0u8; 4096];
        vol.read(599 * 7 % 2048 * 4096, &mut b).unwrap();
        assert_eq!(b, block_for(599));
        vol.read(1 << 20, &mut b).ok();
        pool.flush().unwrap();
        pool.close().unwrap();
        let pool = Pool::open(as_refs(&drives)).unwrap();
        let vol = pool.volume("v").unwrap();
        let mut expect = std::collections::HashMap::new();
        for i in 0..600u64 {
            expect.insert(i * 7 % 2048, i);
        }
        for (lba, stamp) in &expect {
            vol.read(lba * 4096, &mut b).unwrap();
            assert!(b == block_for(*stamp), "k={k} m={m} lba={lba}");
        }
        let s = pool.stats();
        assert_eq!(s.write_preread_bytes, 0);
    }
}

#[test]
fn unaligned_io_holes_and_ranges() {
    let drives = mem_drives(5, false);
    let pool = Pool::create(as_refs(&drives), &small_config(4, 1)).unwrap();
    pool.create_volume("v", 1 << 20).unwrap();
    let vol = pool.volume("v").unwrap();
    let data: Vec<u8> = (0..10000u32).map(|i| (i % 251) as u8).collect();
    vol.write(1234, &data).unwrap();
    let mut r = vec![0u8; 12000];
    vol.read(1000, &mut r).unwrap();
    assert!(r[..234].iter().all(|&x| x == 0));
    assert!(r[234..10234] == data[..]);
    assert!(r[10234..].iter().all(|&x| x == 0));
    vol.trim(2000, 5000).unwrap();
    vol.read(1000, &mut r).unwrap();
    assert!(r[234..1000] == data[..766]);
    assert!(r[1000..6000].iter().all(|&x| x == 0));
    assert!(r[6000..10234] == data[5766..]);
    let ext = vol.block_status(0, 1 << 20).unwrap();
    assert_eq!(ext.iter().map(|e| e.length).sum::<u64>(), 1 << 20);
    assert_eq!(ext[0].state, BlockState::Data);
    assert!(matches!(
        vol.read((1 << 20) - 10, &mut r[..11]),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        vol.write(u64::MAX - 3, &r[..11]),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        pool.create_volume("v", 10),
        Err(Error::AlreadyExists(_))
    ));
    assert!(matches!(
        pool.create_volume("bad name", 10),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn volumes_create_resize_delete_survive_reopen() {
    let drives = mem_drives(4, false);
    let pool = Pool::create(as_refs(&drives), &small_config(2, 1)).unwrap();
    pool.create_volume("a", 1 << 20).unwrap();
    pool.create_volume("b", 1 << 20).unwrap();
    pool.volume("a").unwrap().write(0, &block_for(1)).unwrap();
    pool.volume("b")
        .unwrap()
        .write(4096, &block_for(2))
        .unwrap();
    pool.resize_volume("a", 2 << 20).unwrap();
    pool.delete_volume("b").unwrap();
    pool.create_volume("c", 4096).unwrap();
    // No close: a crash after the last flush.
    drop(pool);
    let pool = Pool::open(as_refs(&drives)).unwrap();
    let names: Vec<_> = pool
        .volumes()
        .into_iter()
        .map(|v| (v.name, v.size))
        .collect();
    assert_eq!(names, vec![("a".into(), 2 << 20), ("c".into(), 4096)]);
    let mut b = vec![0u8; 4096];
    pool.volume("a").unwrap().read(0, &mut b).unwrap();
    assert_eq!(b, block_for(1));
    assert!(pool.volume("b").is_err());
}

/// A pool must have room for host data besides its reserves: drives too small for that are
/// refused at creation with a clear error and left as they were, not accepted and then full at
/// the first write. The smallest accepted pool takes a write and a flush.
#[test]
fn drives_too_small_for_data_besides_the_reserves_are_refused() {
    use flashpool_engine::drive::{Drive, MemDrive};
    use flashpool_engine::format::superblock::DATA_START;
    use flashpool_engine::PoolConfig;
    use std::sync::Arc;
    let cfg = PoolConfig {
        k: 2,
        m: 1,
        chunk_size: 8 << 10,
        segment_size: 1 << 20,
        checkpoint_interval: 1 << 20,
    };
    let drives = |segments: u64| -> Vec<Arc<MemDrive>> {
        (0..3)
            .map(|i| {
                Arc::new(MemDrive::new(
                    DATA_START + segments * cfg.segment_size,
                    format!("mem:{i}"),
                ))
            })
            .collect()
    };
    let mut accepted = None;
    for segments in 4..16 {
        let mems = drives(segments);
        match Pool::create(as_refs(&mems), &cfg) {
            Ok(pool) => {
                accepted = Some((segments, pool));
                break;
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("too small"), "{segments} segments: {msg}");
                let mut head = vec![0u8; 8192];
                for m in &mems {
                    m.read_at(0, &mut head).unwrap();
                    assert!(
                        head.iter().all(|&b| b == 0),
                        "{segments} segments: a refused creation wrote to {}",
                        m.info().identity
                    );
                }
            }
        }
    }
    let (segments, pool) = accepted.expect("a pool of 15 segments is accepted");
    // The geometry's own minimum (4 segments) leaves no segment for data besides these
    // reserves: it must have been refused.
    assert!(segments > 4, "a pool of {segments} segments was accepted");
    eprintln!("smallest pool accepted: {segments} segments");
    pool.create_volume("v", 1 << 20).unwrap();
    let v = pool.volume("v").unwrap();
    v.write(0, &[7u8; 4096]).unwrap();
    pool.flush().unwrap();
    let mut buf = [0u8; 4096];
    v.read(0, &mut buf).unwrap();
    assert_eq!(buf, [7u8; 4096]);
}

/// Block status of a 32 TiB thin volume: what no leaf of the map holds is skipped as one hole
/// (the admin API's `allocated_bytes` asks for the whole volume), and the extents agree with
/// asking block by block wherever blocks were written, for ranges that start and end
/// anywhere.
#[test]
fn block_status_of_a_large_thin_volume() {
    let drives = mem_drives(5, false);
    let pool = Pool::create(as_refs(&drives), &small_config(4, 1)).unwrap();
    let size = 32u64 << 40;
    pool.create_volume("v", size).unwrap();
    let vol = pool.volume("v").unwrap();
    let written = [
        0u64,
        1,
        511,
        512,
        5000,
        1 << 21,
        (1 << 21) + 3,
        (size >> 12) - 1,
    ];
    for &b in &written {
        vol.write(b * 4096, &[7u8; 4096]).unwrap();
    }
    vol.trim(5000 * 4096, 4096).unwrap(); // unmapped again, its leaf stays
    let live: Vec<u64> = written.iter().copied().filter(|&b| b != 5000).collect();
    let ext = vol.block_status(0, size).unwrap();
    assert_eq!(ext.iter().map(|e| e.length).sum::<u64>(), size);
    let data: u64 = ext
        .iter()
        .filter(|e| e.state == BlockState::Data)
        .map(|e| e.length)
        .sum();
    assert_eq!(data, live.len() as u64 * 4096);
    // Against the block-by-block answer, over ranges around the written blocks.
    let reference = |off: u64, len: u64| -> Vec<(u64, BlockState)> {
        let mut out: Vec<(u64, BlockState)> = Vec::new();
        let mut pos = off;
        while pos < off + len {
            let n = (4096 - pos % 4096).min(off + len - pos);
            let st = if live.contains(&(pos / 4096)) {
                BlockState::Data
            } else {
                BlockState::Hole
            };
            match out.last_mut() {
                Some(e) if e.1 == st => e.0 += n,
                _ => out.push((n, st)),
            }
            pos += n;
        }
        out
    };
    for (off, len) in [
        (0, 3 << 20),
        (100, 5 << 20),
        ((1 << 21) * 4096 - 12345, 40000),
        (size - (3 << 20) - 7, (3 << 20) + 7),
        (2 << 30, 1 << 30),
    ] {
        let got: Vec<(u64, BlockState)> = vol
            .block_status(off, len)
            .unwrap()
            .iter()
            .map(|e| (e.length, e.state))
            .collect();
        assert_eq!(got, reference(off, len), "range {off} + {len}");
    }
}
