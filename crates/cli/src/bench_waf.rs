//! `flashpool bench --waf`: steady-state write amplification of uniform random 4 KiB overwrites
//! at 10 %, 20 % and 30 % spare space, for both cleaning policies, beside the analytic model of
//! greedy cleaning under uniform random writes.
//!
//! Setup: a 4+1 pool on memory drives with small segments (32 KiB chunks, 1 MiB segments), so
//! the run holds many segments and reaches steady state in seconds; or (`--waf-geometry
//! default`) the pool's default chunks and segments on larger drives. Compression is off, so host
//! bytes and media bytes mean what they say. The pool's real usable capacity `C` is measured
//! once by filling a fresh pool until ENOSPC (it is below `capacity_bytes`: chunk headers and
//! the segments reserved for checkpoints and the cleaner). Each run then fills a volume of
//! `(1 - spare) * C`, overwrites it `WARMUP` times at uniform random 4 KiB offsets, and measures
//! the counters' deltas over the next `WINDOW` volume sizes only. Cleaning is the engine's own:
//! a writer that finds the pool at its free-segment low watermark cleans first (foreground GC).
//!
//! Model: greedy cleaning of large segments under uniform random writes behaves like cleaning the
//! oldest segment (every segment decays the same way, so the emptiest is the oldest). A block
//! survives `H` uniform host writes over `L` logical blocks with probability `exp(-H / L)`; a
//! segment is cleaned after the log has cycled once, `P (1 - u)` host writes later (`P`
//! physical blocks), so the live fraction `u` of cleaned segments solves
//! `u = exp(-(1 - u) / rho)`, `rho = L / P`, and `WA_gc = 1 / (1 - u)`. This is the LRW model of
//! P. Desnoyers, "Analytic modeling of SSD write performance", SYSTOR 2012 (closed form
//! `WA = a / (a + W0(-a e^-a))`, `a = 1 / rho`); L. Xiang and B. Kurkoski, "An improved analytic
//! expression for write amplification in NAND flash" (arXiv:1110.4245) give the same value
//! (2.36 at 30 % over-provisioning) for greedy and match it against simulation.

use anyhow::{bail, Context, Result};
use flashpool_engine::drive::{DriveRef, MemDrive};
use flashpool_engine::{Compression, Error, GcPolicy, Pool, PoolConfig};
use std::sync::Arc;
use std::time::Instant;

const K: usize = 4;
const M: usize = 1;
const BLOCK: u64 = 4096;

/// The pool a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WafGeometry {
    /// 32 KiB chunks, 1 MiB segments, five 384 MiB drives (383 segments): steady state in
    /// seconds.
    Small,
    /// The pool's defaults (128 KiB chunks, 32 MiB segments) on five 2 GiB drives (63
    /// segments): what `flashpool serve` runs, at 10 GiB of memory and minutes per run.
    Default,
}

impl WafGeometry {
    fn drive_size(self) -> u64 {
        match self {
            WafGeometry::Small => 384 << 20,
            WafGeometry::Default => (2 << 30) + (1 << 20),
        }
    }

    fn config(self) -> PoolConfig {
        match self {
            WafGeometry::Small => PoolConfig {
                k: K,
                m: M,
                chunk_size: 32 << 10,
                segment_size: 1 << 20,
                ..PoolConfig::default()
            },
            WafGeometry::Default => PoolConfig {
                k: K,
                m: M,
                ..PoolConfig::default()
            },
        }
    }

    /// Free segments, beyond those left at ENOSPC, below which the bench's cleaner runs (the
    /// `serve` cleaner's role, inline so the run is deterministic). Each round asks the engine
    /// for one more free segment than it found (`Pool::gc(free)`). With 0, only the engine's
    /// foreground cleaning at its low watermark would run. About 3 % of the segments for the
    /// small geometry, 6 % (of fewer, larger ones) for the default.
    fn clean_at(self) -> usize {
        match self {
            WafGeometry::Small => 12,
            WafGeometry::Default => 4,
        }
    }
}

/// Most of the usable space the initial sequential fill covers.
const FILL_MAX: f64 = 0.8;
/// Host writes between checks of the free-segment count.
const CHECK_EVERY: u64 = 64;
/// Volume sizes of random overwrites before the measured window (reaches steady state).
const WARMUP: u64 = 3;
/// Volume sizes of random overwrites in the measured window.
const WINDOW: u64 = 2;
/// Host writes between samples of the free-segment count.
const SAMPLE_EVERY: u64 = 1024;

/// One host write, then the bench's cleaner when free segments run low.
fn write_and_clean(
    pool: &Pool,
    vol: &flashpool_engine::Volume,
    off: u64,
    data: &[u8],
    i: u64,
    free_at_full: usize,
    clean_at: usize,
) -> Result<()> {
    vol.write(off, data)?;
    if i.is_multiple_of(CHECK_EVERY) {
        clean_until(pool, free_at_full + clean_at)?;
    }
    Ok(())
}

/// The benchmarks' inline cleaner: rounds of `Pool::gc(free)` (each nets one free segment)
/// until `at_least` segments are free or a round frees nothing (nothing worth cleaning: host
/// writes then meet the foreground watermark).
pub(crate) fn clean_until(pool: &Pool, at_least: usize) -> Result<()> {
    loop {
        let free = pool.info().free_segments;
        if free >= at_least {
            return Ok(());
        }
        pool.gc(free)?;
        if pool.info().free_segments <= free {
            return Ok(());
        }
    }
}

fn new_pool(g: WafGeometry) -> Result<Pool> {
    let drives: Vec<DriveRef> = (0..K + M)
        .map(|i| {
            let d = MemDrive::new(g.drive_size(), format!("mem:{i}"));
            d.prefault();
            Arc::new(d) as DriveRef
        })
        .collect();
    Ok(Pool::create(drives, &g.config())?)
}

use super::Rng;

/// Live fraction of the segments greedy cleaning picks at logical/physical ratio `rho`.
pub fn model_u(rho: f64) -> f64 {
    if rho <= 0.0 {
        return 0.0;
    }
    if rho >= 1.0 {
        return 1.0;
    }
    // f(u) = u - exp(-(1 - u) / rho): negative at 0, positive just below the trivial root 1.
    let (mut lo, mut hi) = (0.0f64, 1.0 - 1e-12);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid - (-(1.0 - mid) / rho).exp() < 0.0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The model's GC write amplification (host + relocated) / host at ratio `rho`.
pub fn model_wa_gc(rho: f64) -> f64 {
    1.0 / (1.0 - model_u(rho))
}

/// Usable data capacity: 4 KiB blocks written sequentially into a fresh pool until ENOSPC.
/// Returns (bytes, free segments at ENOSPC).
fn usable_capacity(g: WafGeometry) -> Result<(u64, usize)> {
    let pool = new_pool(g)?;
    let cap = pool.info().capacity_bytes;
    pool.create_volume_with("probe", cap, Compression::Off)?;
    let vol = pool.volume("probe")?;
    let data = block_data(1);
    let mut n = 0u64;
    loop {
        match vol.write(n * BLOCK, &data) {
            Ok(()) => n += 1,
            Err(Error::NoSpace) => break,
            Err(e) => return Err(e.into()),
        }
        if n * BLOCK >= cap {
            bail!("filled all {cap} bytes without ENOSPC");
        }
    }
    Ok((n * BLOCK, pool.info().free_segments))
}

fn block_data(seed: u64) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    (0..BLOCK / 8)
        .flat_map(|_| r.next().to_le_bytes())
        .collect()
}

struct Counts {
    host: u64,
    data: u64,
    parity: u64,
    /// Checkpoints and superblocks.
    meta: u64,
    /// Chunk headers of data stripes.
    hdr: u64,
    pad: u64,
    reloc: u64,
    checkpoints: u64,
    cleaned: u64,
    freed_by_log: u64,
}

impl Counts {
    fn of(s: &flashpool_engine::StatsSnapshot) -> Counts {
        Counts {
            host: s.host_write_bytes,
            data: s.media_data_bytes,
            parity: s.media_parity_bytes,
            meta: s.media_checkpoint_bytes,
            hdr: s.media_metadata_bytes - s.media_checkpoint_bytes,
            pad: s.media_padding_bytes,
            reloc: s.gc_relocated_bytes,
            checkpoints: s.checkpoints,
            cleaned: s.gc_segments_cleaned,
            freed_by_log: s.segments_freed_by_log,
        }
    }
    fn minus(&self, o: &Counts) -> Counts {
        Counts {
            host: self.host - o.host,
            data: self.data - o.data,
            parity: self.parity - o.parity,
            meta: self.meta - o.meta,
            hdr: self.hdr - o.hdr,
            pad: self.pad - o.pad,
            reloc: self.reloc - o.reloc,
            checkpoints: self.checkpoints - o.checkpoints,
            cleaned: self.cleaned - o.cleaned,
            freed_by_log: self.freed_by_log - o.freed_by_log,
        }
    }
    fn wa(&self) -> f64 {
        (self.data + self.parity + self.meta + self.hdr + self.pad) as f64 / self.host as f64
    }
    /// What relocation and parity alone cost, with the chunk headers those stripes need:
    /// data × (1 + m/k) + headers, per host byte.
    fn ideal(&self) -> f64 {
        (self.data as f64 * (K + M) as f64 / K as f64 + self.hdr as f64) / self.host as f64
    }
}

struct Outcome {
    d: Counts,
    first_half_wa: f64,
    second_half_wa: f64,
    rho_eff: f64,
    secs: f64,
}

fn one_run(
    g: WafGeometry,
    spare: f64,
    policy: GcPolicy,
    usable: u64,
    free_at_full: usize,
    seed: u64,
) -> Result<Outcome> {
    let pool = new_pool(g)?;
    pool.set_gc_policy(policy);
    let clean_at = g.clean_at();
    let info = pool.info();
    let seg_cap = info.capacity_bytes / info.segment_count as u64;
    let blocks = ((1.0 - spare) * usable as f64) as u64 / BLOCK;
    pool.create_volume_with("waf", blocks * BLOCK, Compression::Off)?;
    let vol = pool.volume("waf")?;
    let data = block_data(seed);
    let t = Instant::now();
    // Fill sequentially, but at most `FILL_MAX` of the usable space: at lower spare the first
    // cleaning would find every segment nearly full (garbage spread evenly over all of them) and
    // the engine skips segments it deems over 97 % live; the random writes below fill the rest
    // while the cleaner settles into its steady-state victim distribution.
    let fill = blocks.min((FILL_MAX * usable as f64) as u64 / BLOCK);
    for b in 0..fill {
        vol.write(b * BLOCK, &data)
            .with_context(|| format!("fill, block {b} of {fill}"))?;
    }
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut written = vec![false; blocks as usize];
    written[..fill as usize].iter_mut().for_each(|w| *w = true);
    for i in 0..WARMUP * blocks {
        if i == (WARMUP - 1) * blocks {
            // Blocks the random writes have not reached yet get written now, so the live data
            // is the whole volume (constant) from here on.
            for b in (0..blocks).filter(|&b| !written[b as usize]) {
                write_and_clean(&pool, &vol, b * BLOCK, &data, 0, free_at_full, clean_at)
                    .with_context(|| format!("completing the fill, block {b}"))?;
            }
        }
        let b = rng.next() % blocks;
        written[b as usize] = true;
        let off = b * BLOCK;
        write_and_clean(&pool, &vol, off, &data, i, free_at_full, clean_at).with_context(|| {
            let f = pool.info();
            format!(
                "warm-up write {i} of {}: {} free segments, {} MiB live",
                WARMUP * blocks,
                f.free_segments,
                f.live_bytes >> 20
            )
        })?;
    }
    let start = Counts::of(&pool.stats());
    let mut mid = None;
    let (mut free_sum, mut live_sum, mut samples) = (0u64, 0u64, 0u64);
    let n = WINDOW * blocks;
    for i in 0..n {
        let off = (rng.next() % blocks) * BLOCK;
        write_and_clean(&pool, &vol, off, &data, i, free_at_full, clean_at)
            .with_context(|| format!("measured write {i} of {n}"))?;
        if i.is_multiple_of(SAMPLE_EVERY) {
            let f = pool.info();
            free_sum += f.free_segments as u64;
            live_sum += f.live_bytes;
            samples += 1;
        }
        if i == n / 2 {
            mid = Some(Counts::of(&pool.stats()));
        }
    }
    let end = Counts::of(&pool.stats());
    let secs = t.elapsed().as_secs_f64();
    let mid = mid.expect("window has a middle");
    // Free segments the cleaner keeps on average beyond those left at ENOSPC hold no data: the
    // space the cleaner actually works with is the usable capacity less them.
    let free_avg = free_sum as f64 / samples.max(1) as f64;
    let holding = usable as f64 - (free_avg - free_at_full as f64).max(0.0) * seg_cap as f64;
    Ok(Outcome {
        first_half_wa: mid.minus(&start).wa(),
        second_half_wa: end.minus(&mid).wa(),
        d: end.minus(&start),
        rho_eff: live_sum as f64 / samples.max(1) as f64 / holding,
        secs,
    })
}

/// Runs `flashpool bench --waf`.
pub fn run(json: bool, g: WafGeometry) -> Result<()> {
    let t = Instant::now();
    let (usable, free_at_full) = usable_capacity(g)?;
    let info = new_pool(g)?.info();
    let cfg = g.config();
    let clean_at = g.clean_at();
    if !json {
        println!(
            "pool: {K}+{M} on {} memory drives of {} MiB, chunk {} KiB, segment {} KiB ({} segments), \
             compression off; capacity_bytes {} MiB, usable (filled to ENOSPC) {:.1} MiB, {} free segments at ENOSPC ({:.1} s)",
            K + M,
            g.drive_size() >> 20,
            cfg.chunk_size >> 10,
            cfg.segment_size >> 10,
            info.segment_count,
            info.capacity_bytes >> 20,
            usable as f64 / (1 << 20) as f64,
            free_at_full,
            t.elapsed().as_secs_f64()
        );
        println!(
            "cleaner: while fewer than {} segments are free ({clean_at} beyond ENOSPC's), Pool::gc(free) rounds of one segment net each (checked every {CHECK_EVERY} writes)",
            free_at_full + clean_at,
        );
        println!(
            "window: {WINDOW} volume sizes of uniform random 4 KiB overwrites after {WARMUP} of warm-up; WA = media bytes / host bytes"
        );
        println!(
            "{:>5} {:<12} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7} {:>6} {:>7} {:>7} {:>7} {:>6} {:>5} {:>5} {:>6}",
            "spare",
            "policy",
            "rho",
            "WA",
            "1st/2",
            "2nd/2",
            "data",
            "GC",
            "parity",
            "hdr",
            "meta",
            "pad",
            "WA/id",
            "model",
            "meas/m",
            "mod(1-s)",
            "cp",
            "segs",
            "bylog",
            "secs"
        );
    }
    // FLASHPOOL_WAF_SPARES="0.1,0.2": only these spare levels (for experiments).
    let spares: Vec<f64> = match std::env::var("FLASHPOOL_WAF_SPARES") {
        Ok(v) => v
            .split(',')
            .map(|x| x.trim().parse::<f64>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("FLASHPOOL_WAF_SPARES={v:?}: {e}"))?,
        Err(_) => vec![0.10, 0.20, 0.30],
    };
    for spare in spares {
        // Under uniform random writes the policies agree (every block is equally hot); the
        // default geometry's long runs measure greedy only.
        let policies: &[(&str, GcPolicy)] = match g {
            WafGeometry::Small => &[
                ("greedy", GcPolicy::Greedy),
                ("cost-benefit", GcPolicy::CostBenefit),
            ],
            WafGeometry::Default => &[("greedy", GcPolicy::Greedy)],
        };
        for &(name, policy) in policies {
            let o = match one_run(g, spare, policy, usable, free_at_full, 42) {
                Ok(o) => o,
                Err(e) => {
                    if json {
                        println!(
                            "{}",
                            serde_json::json!({"spare": spare, "policy": name, "error": format!("{e:#}")})
                        );
                    } else {
                        println!("{:>4.0}% {:<12} failed: {e:#}", spare * 100.0, name);
                    }
                    continue;
                }
            };
            let h = o.d.host as f64;
            let wa_data = o.d.data as f64 / h;
            let gc = o.d.reloc as f64 / h;
            let parity = o.d.parity as f64 / h;
            let meta = o.d.meta as f64 / h;
            let hdr = o.d.hdr as f64 / h;
            let pad = o.d.pad as f64 / h;
            let vs_ideal = o.d.wa() / o.d.ideal();
            let model = model_wa_gc(o.rho_eff);
            let nominal = model_wa_gc(1.0 - spare);
            if json {
                println!(
                    "{}",
                    serde_json::json!({"spare": spare, "policy": name, "rho_effective": o.rho_eff,
                        "usable_bytes": usable, "host_bytes": o.d.host, "wa": o.d.wa(),
                        "wa_first_half": o.first_half_wa, "wa_second_half": o.second_half_wa,
                        "wa_data": wa_data, "gc_relocated_per_host": gc, "parity_per_host": parity,
                        "metadata_per_host": meta, "chunk_headers_per_host": hdr,
                        "padding_per_host": pad, "wa_over_ideal": vs_ideal,
                        "segments_freed_by_log": o.d.freed_by_log,
                        "model_wa_gc": model, "measured_over_model": wa_data / model,
                        "model_wa_gc_nominal": nominal, "checkpoints": o.d.checkpoints,
                        "segments_cleaned": o.d.cleaned, "seconds": o.secs})
                );
            } else {
                println!(
                    "{:>4.0}% {:<12} {:>7.4} {:>6.3} {:>6.3} {:>6.3} {:>6.3} {:>6.3} {:>6.3} {:>6.3} {:>6.4} {:>7.4} {:>6.3} {:>7.3} {:>7.3} {:>7.3} {:>6} {:>5} {:>5} {:>6.1}",
                    spare * 100.0,
                    name,
                    o.rho_eff,
                    o.d.wa(),
                    o.first_half_wa,
                    o.second_half_wa,
                    wa_data,
                    gc,
                    parity,
                    hdr,
                    meta,
                    pad,
                    vs_ideal,
                    model,
                    wa_data / model,
                    nominal,
                    o.d.checkpoints,
                    o.d.cleaned,
                    o.d.freed_by_log,
                    o.secs
                );
            }
        }
    }
    if !json {
        println!(
            "columns: rho = live / space the cleaner works with (usable less the free segments it keeps on average \
             beyond those at ENOSPC); WA = all media bytes / host bytes (1st/2, 2nd/2: halves of the window); \
             data = data bytes / host (= 1 + GC); GC = relocated / host; parity, hdr (chunk headers of data stripes), \
             meta (checkpoints and superblocks), pad = their bytes / host; WA/id = WA / (data x (k+m)/k + hdr), \
             what relocation and parity alone cost with their headers; \
             model = 1/(1-u), u = exp(-(1-u)/rho) (Desnoyers SYSTOR 2012, greedy/LRW under uniform random writes); \
             meas/m = data / model; mod(1-s) = the model at rho = 1 - spare; cp = checkpoints, segs = segments \
             cleaned and bylog = segments freed by log records in the window; total {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_matches_published_values() {
        // Xiang and Kurkoski: 2.36 at over-provisioning 0.3 (rho = 1 / 1.3).
        assert!((model_wa_gc(1.0 / 1.3) - 2.364).abs() < 0.01);
        // u solves u = exp(-(1 - u) / rho).
        let u = model_u(0.9);
        assert!((u - (-(1.0 - u) / 0.9).exp()).abs() < 1e-9);
        assert!(model_wa_gc(0.7) < model_wa_gc(0.8) && model_wa_gc(0.8) < model_wa_gc(0.9));
    }
}
