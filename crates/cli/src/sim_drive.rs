//! A pool drive that is a simulated SSD (issue 18): `flashpool-sim`'s page-mapped FTL decides
//! where every page the pool writes goes, runs its own garbage collection, and counts NAND
//! pages programmed, pages moved and blocks erased; the data itself lives in a memory drive
//! beside it. So the whole stack can be measured, host write to NAND program: the pool's write
//! amplification times the device's.
//!
//! Untimed: the FTL runs its placement and GC inline (the simulator's preconditioning path),
//! so the counters are exact and the drive is as fast as memory. NAND timing (virtual time
//! for experiments, real time for `serve`) is not modelled here yet.
//!
//! A write covering part of a device page costs a whole page program (a page-mapped FTL
//! reads, merges and rewrites it); a discard deallocates the pages it covers whole.

use flashpool_engine::drive::{Drive, DriveInfo, MediaCounters, MemDrive};
use flashpool_sim::ftl::Ftl;
use flashpool_sim::geometry::Geometry;
use flashpool_sim::SimConfig;
use parking_lot::Mutex;
use std::io;

/// The device of `--sim-drives`: a preset name or a simulator TOML file.
pub fn load_config(what: &str) -> anyhow::Result<SimConfig> {
    if let Some(text) = flashpool_sim::presets::preset_text(what) {
        return Ok(SimConfig::from_toml(text)?);
    }
    let p = std::path::Path::new(what);
    if !p.exists() {
        let names: Vec<&str> = flashpool_sim::presets::PRESETS
            .iter()
            .map(|(n, _)| *n)
            .collect();
        anyhow::bail!(
            "--sim-drives {what:?}: neither a preset ({}) nor a file",
            names.join(", ")
        );
    }
    let text = std::fs::read_to_string(p)
        .map_err(|e| anyhow::anyhow!("--sim-drives {}: {e}", p.display()))?;
    SimConfig::from_toml(&text).map_err(|e| anyhow::anyhow!("--sim-drives {}: {e}", p.display()))
}

/// A simulated SSD holding its data in memory.
pub struct SimDrive {
    data: MemDrive,
    ftl: Mutex<Ftl>,
    page: u64,
    size: u64,
    identity: String,
    discarded_pages: std::sync::atomic::AtomicU64,
    read_pages: std::sync::atomic::AtomicU64,
}

impl SimDrive {
    /// A fresh (empty) device of `cfg`'s geometry and FTL. Its exported size is the FTL's
    /// logical capacity.
    pub fn new(cfg: &SimConfig, identity: String) -> anyhow::Result<SimDrive> {
        cfg.validate()?;
        let geo = Geometry::new(&cfg.geometry);
        let logical = cfg.logical_pages();
        if logical > u32::MAX as u64 {
            anyhow::bail!("simulated drive of {logical} pages: at most 2^32");
        }
        let page = cfg.geometry.page_size as u64;
        let size = logical * page / 4096 * 4096;
        let ftl = Ftl::new(geo, &cfg.ftl, logical, cfg.workload.seed);
        Ok(SimDrive {
            data: MemDrive::new(size, identity.clone()),
            ftl: Mutex::new(ftl),
            page,
            size,
            identity,
            discarded_pages: Default::default(),
            read_pages: Default::default(),
        })
    }

    /// `cfg` with as many blocks per plane as it takes to export at least `bytes` (the rest of
    /// the device as the preset has it), but never so few that its over-provisioning leaves
    /// the FTL fewer than 6 spare blocks per plane.
    pub fn scaled(cfg: &SimConfig, bytes: u64) -> SimConfig {
        let mut c = cfg.clone();
        let g = &c.geometry;
        let per_block_row = g.channels as u64
            * g.dies_per_channel as u64
            * g.planes_per_die as u64
            * g.pages_per_block as u64
            * g.page_size as u64;
        let physical = (bytes as f64 / (1.0 - c.ftl.op_ratio)).ceil() as u64;
        let least = (6.0 / c.ftl.op_ratio.max(1e-3)).ceil() as u32;
        c.geometry.blocks_per_plane = (physical.div_ceil(per_block_row) as u32).max(least);
        c
    }
}

impl Drive for SimDrive {
    fn info(&self) -> DriveInfo {
        DriveInfo {
            size: self.size,
            identity: self.identity.clone(),
        }
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.data.read_at(offset, buf)?;
        let pages = (offset + buf.len() as u64).div_ceil(self.page) - offset / self.page;
        self.read_pages
            .fetch_add(pages, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.data.write_at(offset, buf)?;
        let first = offset / self.page;
        let last = (offset + buf.len() as u64).div_ceil(self.page);
        let mut ftl = self.ftl.lock();
        for lpa in first..last {
            if !ftl.write_untimed(lpa as u32) {
                let why = ftl.failed.clone().unwrap_or_default();
                return Err(io::Error::other(format!("simulated SSD: {why}")));
            }
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.data.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.data.discard(offset, len)?;
        let first = offset.div_ceil(self.page);
        let last = (offset + len) / self.page;
        let mut ftl = self.ftl.lock();
        for lpa in first..last {
            ftl.trim(lpa as u32);
        }
        self.discarded_pages.fetch_add(
            last.saturating_sub(first),
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(())
    }

    fn completes_inline(&self) -> bool {
        true
    }

    fn media_counters(&self) -> Option<MediaCounters> {
        let ftl = self.ftl.lock();
        let c = ftl.ctr;
        let wear = ftl.erase_counts();
        drop(ftl);
        Some(MediaCounters {
            written_bytes: c.host_pages_written * self.page,
            programmed_bytes: c.flash_pages_programmed * self.page,
            moved_bytes: (c.gc_pages_moved + c.wl_pages_moved) * self.page,
            erases: c.blocks_erased,
            discarded_bytes: self
                .discarded_pages
                .load(std::sync::atomic::Ordering::Relaxed)
                * self.page,
            read_bytes: self.read_pages.load(std::sync::atomic::Ordering::Relaxed) * self.page,
            erase_min: wear.iter().copied().min().unwrap_or(0) as u64,
            erase_max: wear.iter().copied().max().unwrap_or(0) as u64,
            blocks: wear.len() as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashpool_engine::{Compression, Pool, PoolConfig};
    use std::sync::Arc;

    fn small(bytes: u64) -> SimConfig {
        SimDrive::scaled(&flashpool_sim::presets::preset("small").unwrap(), bytes)
    }

    /// The device keeps the data and counts what it programs; rewriting the same pages in
    /// place drives its own GC (device WAF above 1), and discarding them first keeps it at 1.
    #[test]
    fn device_counts_programs_and_discards_help_its_gc() {
        let run = |discard: bool| {
            let d = SimDrive::new(&small(8 << 20), "sim:0".into()).unwrap();
            let size = d.info().size;
            assert!(size >= 8 << 20, "{size}");
            let mut b = flashpool_engine::aligned::AlignedBuf::zeroed(1 << 20);
            let chunks = size / (1 << 20);
            for round in 0..12u64 {
                for c in 0..chunks {
                    // The pool's pattern: a region written whole, freed whole, written again.
                    if discard {
                        d.discard(c << 20, 1 << 20).unwrap();
                    }
                    b.fill((round * 31 + c) as u8);
                    d.write_at(c << 20, &b).unwrap();
                }
            }
            let mut r = flashpool_engine::aligned::AlignedBuf::zeroed(1 << 20);
            d.read_at(0, &mut r).unwrap();
            assert_eq!(r[5], (11 * 31) as u8);
            d.media_counters().unwrap()
        };
        let plain = run(false);
        let trimmed = run(true);
        assert_eq!(plain.written_bytes, trimmed.written_bytes);
        assert!(plain.device_waf() >= 1.0 && trimmed.device_waf() >= 1.0);
        assert!(trimmed.erases > 0 && trimmed.discarded_bytes > 0);
        assert!(
            trimmed.device_waf() <= plain.device_waf(),
            "discards never cost the device: {} vs {}",
            trimmed.device_waf(),
            plain.device_waf()
        );
    }

    /// A pool on simulated SSDs: data round-trips, and the members report their media.
    #[test]
    fn pool_on_simulated_ssds_reports_end_to_end_counters() {
        let cfg = small(160 << 20);
        let drives: Vec<_> = (0..5)
            .map(|i| {
                Arc::new(SimDrive::new(&cfg, format!("sim:{i}")).unwrap())
                    as flashpool_engine::drive::DriveRef
            })
            .collect();
        let pool = Pool::create(
            drives,
            &PoolConfig {
                k: 4,
                m: 1,
                chunk_size: 64 << 10,
                segment_size: 4 << 20,
                ..PoolConfig::default()
            },
        )
        .unwrap();
        pool.create_volume_with("v", 64 << 20, Compression::Off)
            .unwrap();
        let v = pool.volume("v").unwrap();
        let mut b = vec![0u8; 1 << 20];
        for i in 0..64u64 {
            b.fill(i as u8);
            v.write(i << 20, &b).unwrap();
        }
        pool.flush().unwrap();
        v.read(5 << 20, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 5));
        let m = pool.media_counters().expect("every member reports");
        let host = pool.stats().host_write_bytes;
        assert!(
            m.written_bytes >= host * 5 / 4,
            "parity and headers reach the drives"
        );
        assert!(m.programmed_bytes >= m.written_bytes);
    }
}
