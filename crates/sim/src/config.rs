//! Simulator configuration: the TOML schema (`[geometry]`, `[timing]`, `[ftl]`, `[workload]`),
//! its documented defaults, and validation that turns bad input into a clear [`ConfigError`].
//!
//! The key names here are a stable interface used by checks outside the code base; add keys,
//! never rename them. Every struct uses `deny_unknown_fields` so a typo is an error, not a
//! silently ignored setting.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Largest supported planes per die (multi-plane operations keep fixed-size arrays).
pub const MAX_PLANES: u32 = 8;

/// Most simulator memory a config may need ([`SimConfig::memory_estimate`]): 8 GiB, about a
/// billion pages (4 TiB of 4 KiB pages). Larger devices are refused up front instead of
/// failing on an allocation.
pub const MAX_MEMORY_BYTES: u64 = 8 << 30;

/// Most `ftl.d_choices` (candidates sampled per GC victim).
pub const MAX_D_CHOICES: u32 = 1024;

/// Sizes must stay below this (2^63 bytes), so sums of two sizes cannot overflow.
pub const MAX_SIZE_BYTES: u64 = 1 << 63;

/// `workload.runtime_ms` must stay below this (about 11.6 simulated days).
pub const MAX_RUNTIME_MS: f64 = 1e9;

/// Most time-series points a run may ask for (`ios / sample_every`).
pub const MAX_SAMPLES: u64 = 1_000_000;

/// A configuration error: which key and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// A whole simulation: device and workload.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    /// Optional human name (presets set it).
    pub name: Option<String>,
    pub geometry: GeometryConfig,
    pub timing: TimingConfig,
    pub ftl: FtlConfig,
    pub workload: WorkloadConfig,
}

/// Flash array geometry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GeometryConfig {
    pub channels: u32,
    pub dies_per_channel: u32,
    pub planes_per_die: u32,
    pub blocks_per_plane: u32,
    pub pages_per_block: u32,
    /// Bytes per flash page; also the FTL mapping unit.
    pub page_size: u32,
}

impl Default for GeometryConfig {
    fn default() -> Self {
        GeometryConfig {
            channels: 8,
            dies_per_channel: 4,
            planes_per_die: 2,
            blocks_per_plane: 256,
            pages_per_block: 256,
            page_size: 4096,
        }
    }
}

/// NAND and bus timing. Times in microseconds (fractions allowed), converted to ns once.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TimingConfig {
    /// tR: array read (page to register), us.
    pub read_us: f64,
    /// tPROG: page program, us.
    pub program_us: f64,
    /// tBERS: block erase, us.
    pub erase_us: f64,
    /// Channel transfer rate in mega-transfers per second.
    pub channel_mt_s: u32,
    /// Channel data bus width in bits.
    pub bus_width_bits: u32,
    /// Per-operation command overhead (command/address cycles, firmware), us.
    pub cmd_overhead_us: f64,
    /// Optional per-page-type tR, LSB first (length = bits per cell). Overrides `read_us`.
    pub read_us_by_type: Vec<f64>,
    /// Optional per-page-type tPROG, LSB first. Overrides `program_us`.
    pub program_us_by_type: Vec<f64>,
    /// Time to suspend a program, us.
    pub program_suspend_us: f64,
    /// Time to suspend an erase, us.
    pub erase_suspend_us: f64,
    /// Time to resume a suspended program or erase, us.
    pub resume_us: f64,
}

impl Default for TimingConfig {
    fn default() -> Self {
        TimingConfig {
            read_us: 25.0,
            program_us: 200.0,
            erase_us: 1500.0,
            channel_mt_s: 400,
            bus_width_bits: 8,
            cmd_overhead_us: 1.0,
            read_us_by_type: Vec::new(),
            program_us_by_type: Vec::new(),
            program_suspend_us: 20.0,
            erase_suspend_us: 20.0,
            resume_us: 20.0,
        }
    }
}

/// Garbage-collection victim policy.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum GcPolicy {
    Greedy,
    CostBenefit,
    Fifo,
    DChoices,
}

impl GcPolicy {
    pub const ALL: [GcPolicy; 4] = [
        GcPolicy::Greedy,
        GcPolicy::CostBenefit,
        GcPolicy::Fifo,
        GcPolicy::DChoices,
    ];
    pub fn name(self) -> &'static str {
        match self {
            GcPolicy::Greedy => "greedy",
            GcPolicy::CostBenefit => "cost-benefit",
            GcPolicy::Fifo => "fifo",
            GcPolicy::DChoices => "d-choices",
        }
    }
}

/// Which operations a read may suspend.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Suspension {
    None,
    Erase,
    ProgramErase,
}

/// Priority of garbage-collection traffic against host writes when foreground GC runs.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum GcPriority {
    /// GC operations go before queued host writes.
    Gc,
    /// Host writes go first while a plane can still take them.
    Host,
    /// Alternate one GC operation and one host program.
    Fair,
}

/// How often one program or erase may be suspended.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum SuspendBudget {
    /// At most `max_suspends_per_op` times; later reads wait for the operation to end.
    Count,
    /// Any number of times, but a resumed operation runs at least `suspend_min_run_us`
    /// before it can be suspended again (bounds both the read wait and the operation's
    /// slowdown by elapsed time, not by a count).
    Time,
}

/// Which operations on different planes of a die may form one multi-plane operation.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Multiplane {
    /// Any pages on different planes (permissive; the simulator's rule before issue 19).
    Any,
    /// The ONFI rule: the same page offset in each plane's block.
    Page,
    /// Same page offset and the same block index within each plane (stricter datasheets).
    PageBlock,
}

/// Where host writes go.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Allocation {
    /// Each write goes to the least-loaded of the next dies in stripe order that can take it,
    /// and to the plane of that die whose write point is furthest behind.
    Dynamic,
    /// Static: the logical page picks channel (C), way = die in its channel (W) and plane (P),
    /// the first letter varying fastest (MQSim's CWDP with one die per chip is `static-cwp`).
    StaticCwp,
    StaticCpw,
    StaticWcp,
    StaticWpc,
    StaticPcw,
    StaticPwc,
}

impl Allocation {
    pub const ALL: [Allocation; 7] = [
        Allocation::Dynamic,
        Allocation::StaticCwp,
        Allocation::StaticCpw,
        Allocation::StaticWcp,
        Allocation::StaticWpc,
        Allocation::StaticPcw,
        Allocation::StaticPwc,
    ];
}

/// What a read of a never-written (or trimmed) page costs.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum UnmappedRead {
    /// A full flash read on the die and plane static allocation (`static-cwp`) gives the
    /// page, as if mapped (MQSim allocates a page for such reads).
    Flash,
    /// Zeros from the controller after `cmd_overhead_us`, no flash access.
    ZeroFill,
}

/// Flash translation layer settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FtlConfig {
    /// Over-provisioning: (physical - logical) / physical.
    pub op_ratio: f64,
    pub gc_policy: GcPolicy,
    /// Foreground GC runs in a plane while its free blocks are below this.
    pub gc_threshold_blocks: u32,
    /// Background GC runs on an idle die while a plane's free blocks are below this.
    pub bg_gc_threshold_blocks: u32,
    /// Candidates sampled by the d-choices policy.
    pub d_choices: u32,
    pub gc_priority: GcPriority,
    pub suspension: Suspension,
    /// Most suspensions of one program or erase (`suspend_budget = "count"`).
    pub max_suspends_per_op: u32,
    /// Suspension budget per operation: by count or by elapsed time.
    pub suspend_budget: SuspendBudget,
    /// Least array time a resumed operation runs before the next suspension
    /// (`suspend_budget = "time"`), us.
    pub suspend_min_run_us: f64,
    /// Read-priority scheduling: a read that arrives while its die's program or erase cannot
    /// be suspended yet (command and data-in phase, resume, the minimum run) suspends it as
    /// soon as it can, instead of waiting for the whole operation.
    pub read_priority: bool,
    /// Dynamic wear leveling: open the free block with the lowest erase count.
    pub dynamic_wear_leveling: bool,
    /// Static wear leveling: move cold data when a plane's erase-count spread exceeds this
    /// (0 disables).
    pub static_wl_threshold: u32,
    /// Program/erase endurance: a block is retired (grown bad) when its erase count reaches
    /// this (0 = unlimited).
    pub endurance: u32,
    /// Factory bad blocks per die, placed by the seed.
    pub factory_bad_blocks_per_die: u32,
    /// Multi-plane pairing rule.
    pub multiplane: Multiplane,
    /// Host write placement.
    pub allocation: Allocation,
    /// Cost of reading a page that holds no data.
    pub unmapped_read: UnmappedRead,
}

impl Default for FtlConfig {
    fn default() -> Self {
        FtlConfig {
            op_ratio: 0.07,
            gc_policy: GcPolicy::Greedy,
            gc_threshold_blocks: 3,
            bg_gc_threshold_blocks: 6,
            d_choices: 8,
            gc_priority: GcPriority::Fair,
            suspension: Suspension::None,
            max_suspends_per_op: 4,
            suspend_budget: SuspendBudget::Count,
            suspend_min_run_us: 100.0,
            read_priority: false,
            dynamic_wear_leveling: true,
            static_wl_threshold: 0,
            endurance: 0,
            factory_bad_blocks_per_die: 0,
            multiplane: Multiplane::Page,
            allocation: Allocation::Dynamic,
            unmapped_read: UnmappedRead::Flash,
        }
    }
}

/// I/O pattern, as fio's `rw`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Rw {
    Read,
    Write,
    Randread,
    Randwrite,
    Randrw,
    /// Sequential mixed read/write (fio `rw=rw`).
    Rw,
}

impl Rw {
    pub fn is_random(self) -> bool {
        matches!(self, Rw::Randread | Rw::Randwrite | Rw::Randrw)
    }
}

/// Address distribution of random I/O.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Distribution {
    Uniform,
    Zipf,
    Hotcold,
}

/// Preconditioning before the measured run.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Precondition {
    None,
    Fill,
    Steady,
}

/// A byte size: an integer, or a string such as "4k", "128KiB", "1g", "50%".
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(SizeText),
}

/// Reads an integer or a string, passing [`parse_size`]'s reason through on a bad string (an
/// untagged enum would only say that no variant matched).
impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a size: an integer number of bytes or a string such as \"4k\", \"1.5m\" \
                     or \"50%\"",
                )
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Size, E> {
                if v >= MAX_SIZE_BYTES {
                    return Err(E::custom(format!(
                        "size {v} is too large (at most 2^63 - 1)"
                    )));
                }
                Ok(Size::Bytes(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Size, E> {
                if v < 0 {
                    return Err(E::custom(format!("size {v} must not be negative")));
                }
                self.visit_u64(v as u64)
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Size, E> {
                Err(E::custom(format!(
                    "size {v:?} is a float: give an integer number of bytes or a string such as \
                     \"4k\" or \"1.5m\""
                )))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Size, E> {
                parse_size(v).map(Size::Text).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// Parsed text form of [`Size`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SizeText {
    Bytes(u64),
    /// A fraction of the logical capacity.
    Fraction(f64),
}

impl Serialize for SizeText {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            SizeText::Bytes(b) => s.serialize_str(&b.to_string()),
            SizeText::Fraction(f) => s.serialize_str(&format!("{}%", f * 100.0)),
        }
    }
}

impl<'de> Deserialize<'de> for SizeText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_size(&s).map_err(serde::de::Error::custom)
    }
}

/// Parses "4096", "4k", "4KiB", "1.5m", "2g", "50%".
pub fn parse_size(s: &str) -> Result<SizeText, String> {
    let t = s.trim();
    if let Some(p) = t.strip_suffix('%') {
        let v: f64 = p
            .trim()
            .parse()
            .map_err(|_| format!("bad percentage {s:?}"))?;
        if !(v > 0.0 && v <= 100.0) {
            return Err(format!("percentage {s:?} must be in (0, 100]"));
        }
        return Ok(SizeText::Fraction(v / 100.0));
    }
    let lower = t.to_ascii_lowercase();
    let lower = lower
        .trim_end_matches("ib")
        .trim_end_matches('b')
        .to_string();
    let (num, mult) = match lower.chars().last() {
        Some('k') => (&lower[..lower.len() - 1], 1u64 << 10),
        Some('m') => (&lower[..lower.len() - 1], 1u64 << 20),
        Some('g') => (&lower[..lower.len() - 1], 1u64 << 30),
        Some('t') => (&lower[..lower.len() - 1], 1u64 << 40),
        _ => (&lower[..], 1u64),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad size {s:?} (use bytes or a suffix k, m, g, t, or a %)"))?;
    if v.is_nan() {
        return Err(format!("bad size {s:?}"));
    }
    if v < 0.0 {
        return Err(format!("size {s:?} must not be negative"));
    }
    let bytes = (v * mult as f64).round();
    // Also catches infinities; `as u64` would saturate them to u64::MAX.
    if bytes >= MAX_SIZE_BYTES as f64 {
        return Err(format!("size {s:?} is too large (at most 2^63 - 1 bytes)"));
    }
    Ok(SizeText::Bytes(bytes as u64))
}

impl Size {
    /// Resolves to bytes; fractions are of `capacity`.
    pub fn bytes(self, capacity: u64) -> u64 {
        match self {
            Size::Bytes(b) | Size::Text(SizeText::Bytes(b)) => b,
            Size::Text(SizeText::Fraction(f)) => (capacity as f64 * f) as u64,
        }
    }
}

/// The fio-like job.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WorkloadConfig {
    pub rw: Rw,
    /// Percentage of reads in mixed workloads.
    pub rwmixread: u32,
    /// Block size in bytes (rounded up to whole pages).
    pub bs: Size,
    /// Outstanding I/Os per job.
    pub iodepth: u32,
    /// Independent jobs, each with `iodepth` outstanding I/Os.
    pub numjobs: u32,
    /// Bytes of logical space the job touches (default: all of it from `offset`).
    pub span: Option<Size>,
    /// Start of the touched region, bytes.
    pub offset: Size,
    /// Host I/Os in the measured run.
    pub ios: u64,
    /// Alternatively, stop issuing after this much simulated time (ms); 0 = use `ios` only.
    pub runtime_ms: f64,
    pub seed: u64,
    pub precondition: Precondition,
    pub distribution: Distribution,
    /// Zipf exponent (distribution = "zipf").
    pub zipf_theta: f64,
    /// Fraction of the span that is hot (distribution = "hotcold").
    pub hot_fraction: f64,
    /// Fraction of I/Os that go to the hot part (distribution = "hotcold").
    pub hot_access: f64,
    /// Sample a time-series point every this many completed host I/Os (0 = about 100 points).
    pub sample_every: u64,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            rw: Rw::Randwrite,
            rwmixread: 50,
            bs: Size::Bytes(4096),
            iodepth: 32,
            numjobs: 1,
            span: None,
            offset: Size::Bytes(0),
            ios: 200_000,
            runtime_ms: 0.0,
            seed: 1,
            precondition: Precondition::Fill,
            distribution: Distribution::Uniform,
            zipf_theta: 1.1,
            hot_fraction: 0.2,
            hot_access: 0.8,
            sample_every: 0,
        }
    }
}

impl SimConfig {
    /// Parses TOML text; unknown keys and bad values are errors.
    pub fn from_toml(text: &str) -> Result<SimConfig, ConfigError> {
        let cfg = SimConfig::parse_toml(text)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses TOML text without [`SimConfig::validate`] (for a caller that validates for its
    /// own use, such as [`SimConfig::validate_replay`]); unknown keys and values of the wrong
    /// type are errors.
    pub fn parse_toml(text: &str) -> Result<SimConfig, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError(format!("invalid config: {e}")))
    }

    /// Serializes back to TOML (for `--print-config` and experiments).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// Checks ranges and combinations for a generated job ([`crate::run`]); returns the first
    /// problem found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_device()?;
        self.validate_workload(true)
    }

    /// Checks the device and the workload keys a trace replay uses (`iodepth`, `numjobs`,
    /// `runtime_ms`, `sample_every`, and the address pattern when `precondition = "steady"`
    /// overwrites with it); `ios`, `rwmixread` and the rest of the job are not used.
    pub fn validate_replay(&self) -> Result<(), ConfigError> {
        self.validate_device()?;
        self.validate_workload(false)
    }

    /// Checks that the geometry fits the simulator: page ids in u32 and at most
    /// [`MAX_MEMORY_BYTES`] of simulator state. Assumes every count is at least 1.
    pub fn check_size_limits(&self) -> Result<(), ConfigError> {
        let g = &self.geometry;
        let pages = g.channels as u128
            * g.dies_per_channel as u128
            * g.planes_per_die as u128
            * g.blocks_per_plane as u128
            * g.pages_per_block as u128;
        if pages >= u32::MAX as u128 {
            return err(format!(
                "geometry has {pages} pages; at most {} are supported (u32 page ids)",
                u32::MAX - 1
            ));
        }
        let mem = self.memory_estimate();
        if mem > MAX_MEMORY_BYTES {
            return err(format!(
                "geometry of {pages} pages ({} channels x {} dies x {} planes x {} blocks x {} \
                 pages) needs about {:.1} GiB of simulator memory; at most {} GiB is supported: \
                 use fewer channels, dies, planes, blocks or pages",
                g.channels,
                g.dies_per_channel,
                g.planes_per_die,
                g.blocks_per_plane,
                g.pages_per_block,
                mem as f64 / (1u64 << 30) as f64,
                MAX_MEMORY_BYTES >> 30
            ));
        }
        Ok(())
    }

    /// Bytes of simulator state this geometry needs, estimated up front (see
    /// docs/SIMULATOR.md, Memory): per physical page the reverse map and a valid bit, per
    /// logical page the mapping entry, per block its tables, per plane its GC buckets and
    /// pools, per die and channel the engine's and timing model's state. Saturates instead
    /// of overflowing.
    pub fn memory_estimate(&self) -> u64 {
        let g = &self.geometry;
        let channels = g.channels as u128;
        let dies = channels * g.dies_per_channel as u128;
        let planes = dies * g.planes_per_die as u128;
        let blocks = planes * g.blocks_per_plane as u128;
        let pages = blocks * g.pages_per_block as u128;
        let op = if self.ftl.op_ratio.is_finite() {
            self.ftl.op_ratio.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let logical = (pages as f64 * (1.0 - op)) as u128;
        let per_die = std::mem::size_of::<crate::die::Die>() as u128 + 96;
        let total = pages * 4
            + pages.div_ceil(64) * 8
            + logical * 4
            + blocks * 41
            + planes * (4 * (g.pages_per_block as u128 + 1) + 160)
            + dies * per_die
            + channels * 32;
        total.min(u64::MAX as u128) as u64
    }

    /// Checks geometry, timing and FTL settings.
    pub fn validate_device(&self) -> Result<(), ConfigError> {
        let g = &self.geometry;
        for (name, v) in [
            ("geometry.channels", g.channels),
            ("geometry.dies_per_channel", g.dies_per_channel),
            ("geometry.planes_per_die", g.planes_per_die),
            ("geometry.blocks_per_plane", g.blocks_per_plane),
            ("geometry.pages_per_block", g.pages_per_block),
            ("geometry.page_size", g.page_size),
        ] {
            if v == 0 {
                return err(format!("{name} must be at least 1"));
            }
        }
        if g.planes_per_die > MAX_PLANES {
            return err(format!(
                "geometry.planes_per_die must be at most {MAX_PLANES}"
            ));
        }
        if g.pages_per_block > 65_535 {
            return err("geometry.pages_per_block must be at most 65535");
        }
        self.check_size_limits()?;
        let t = &self.timing;
        for (name, v) in [
            ("timing.read_us", t.read_us),
            ("timing.program_us", t.program_us),
            ("timing.erase_us", t.erase_us),
            ("timing.cmd_overhead_us", t.cmd_overhead_us),
            ("timing.program_suspend_us", t.program_suspend_us),
            ("timing.erase_suspend_us", t.erase_suspend_us),
            ("timing.resume_us", t.resume_us),
        ] {
            if !(0.0..1e9).contains(&v) {
                return err(format!(
                    "{name} = {v}: must be a number of us at least 0 and below 1e9 (1000 s)"
                ));
            }
        }
        if t.channel_mt_s == 0 || t.bus_width_bits == 0 {
            return err("timing.channel_mt_s and timing.bus_width_bits must be at least 1");
        }
        for (name, v) in [
            ("timing.read_us_by_type", &t.read_us_by_type),
            ("timing.program_us_by_type", &t.program_us_by_type),
        ] {
            if v.len() > 4 {
                return err(format!("{name} has {} entries; at most 4 (QLC)", v.len()));
            }
            if v.iter().any(|x| !(0.0..1e9).contains(x)) {
                return err(format!("{name} must hold non-negative us"));
            }
        }
        let f = &self.ftl;
        if !(f.op_ratio > 0.0 && f.op_ratio < 0.95) {
            return err(format!(
                "ftl.op_ratio = {} must be in (0, 0.95): it is (physical - logical) / physical",
                f.op_ratio
            ));
        }
        if f.gc_threshold_blocks < 2 {
            return err("ftl.gc_threshold_blocks must be at least 2 (one block is kept for GC)");
        }
        if f.gc_threshold_blocks >= g.blocks_per_plane {
            return err(format!(
                "ftl.gc_threshold_blocks = {} must be below geometry.blocks_per_plane = {}",
                f.gc_threshold_blocks, g.blocks_per_plane
            ));
        }
        if f.d_choices == 0 {
            return err("ftl.d_choices must be at least 1");
        }
        if f.d_choices > MAX_D_CHOICES {
            return err(format!(
                "ftl.d_choices = {} must be at most {MAX_D_CHOICES} (blocks sampled per GC victim)",
                f.d_choices
            ));
        }
        if f.max_suspends_per_op > 255 {
            return err("ftl.max_suspends_per_op must be at most 255");
        }
        if !(f.suspend_min_run_us >= 1.0 && f.suspend_min_run_us < 1e9) {
            return err(
                "ftl.suspend_min_run_us must be at least 1 us (a resumed operation must progress)",
            );
        }
        let blocks_per_die = g.planes_per_die * g.blocks_per_plane;
        if f.factory_bad_blocks_per_die >= blocks_per_die {
            return err("ftl.factory_bad_blocks_per_die must be below the blocks per die");
        }
        // Spare space per plane must cover the two open frontiers (user, GC), the GC reserve
        // block and at least one block of invalid pages, or GC cannot make progress.
        let spare_blocks = f.op_ratio * g.blocks_per_plane as f64
            - f.factory_bad_blocks_per_die as f64 / g.planes_per_die as f64;
        if spare_blocks < 4.0 {
            return err(format!(
                "ftl.op_ratio = {} leaves {:.1} spare blocks per plane; at least 4 are needed \
                 (user and GC frontiers, the GC reserve block and room for invalid pages): \
                 raise op_ratio to at least {:.3} or add blocks",
                f.op_ratio,
                spare_blocks,
                (4.0 + f.factory_bad_blocks_per_die as f64 / g.planes_per_die as f64)
                    / g.blocks_per_plane as f64
            ));
        }
        Ok(())
    }

    /// Checks the workload of a generated job (`job`) or of a replay (see
    /// [`SimConfig::validate_replay`]). Assumes a valid device.
    fn validate_workload(&self, job: bool) -> Result<(), ConfigError> {
        let g = &self.geometry;
        let w = &self.workload;
        if job && w.rwmixread > 100 {
            return err("workload.rwmixread must be 0..=100");
        }
        if w.iodepth == 0 || w.numjobs == 0 {
            return err("workload.iodepth and workload.numjobs must be at least 1");
        }
        if w.iodepth as u64 * w.numjobs as u64 > 1 << 20 {
            return err("workload.iodepth * numjobs must be at most 1048576");
        }
        if !(w.runtime_ms.is_finite() && (0.0..MAX_RUNTIME_MS).contains(&w.runtime_ms)) {
            return err(format!(
                "workload.runtime_ms = {} must be a finite number of ms in [0, {MAX_RUNTIME_MS:e}) \
                 (0 = no time limit)",
                w.runtime_ms
            ));
        }
        if w.runtime_ms > 0.0 && w.runtime_ms * 1e6 < 1.0 {
            return err(format!(
                "workload.runtime_ms = {} is below 1 ns, the simulator's time step: use 0 for no \
                 time limit, or at least 0.000001",
                w.runtime_ms
            ));
        }
        if job && w.ios == 0 && w.runtime_ms <= 0.0 {
            return err("workload.ios or workload.runtime_ms must be positive");
        }
        if job && w.ios > 0 && w.sample_every > 0 && w.ios / w.sample_every > MAX_SAMPLES {
            return err(format!(
                "workload.sample_every = {} with ios = {} asks for more than {MAX_SAMPLES} \
                 time-series points: raise sample_every",
                w.sample_every, w.ios
            ));
        }
        // A replay uses the address pattern only to overwrite in a steady preconditioning.
        if !job && w.precondition != Precondition::Steady {
            return Ok(());
        }
        let bs = match w.bs {
            Size::Text(SizeText::Fraction(_)) => {
                return err(
                    "workload.bs cannot be a percentage: give bytes, such as 4096 or \"4k\"",
                )
            }
            s => s.bytes(0),
        };
        if bs == 0 {
            return err("workload.bs must be at least 1 byte");
        }
        if w.distribution == Distribution::Zipf && !(w.zipf_theta > 0.0 && w.zipf_theta < 100.0) {
            return err("workload.zipf_theta must be in (0, 100)");
        }
        if w.distribution == Distribution::Hotcold
            && !(w.hot_fraction > 0.0
                && w.hot_fraction < 1.0
                && w.hot_access >= 0.0
                && w.hot_access <= 1.0)
        {
            return err("workload.hot_fraction must be in (0, 1) and hot_access in [0, 1]");
        }
        let page = g.page_size as u64;
        // Below 2^64: fewer than 2^32 pages of fewer than 2^32 bytes.
        let logical_bytes = self.logical_pages().saturating_mul(page);
        if bs > logical_bytes {
            return err(format!(
                "workload.bs = {bs} is larger than the logical capacity {logical_bytes} bytes"
            ));
        }
        let offset = w.offset.bytes(logical_bytes);
        let span = self.span_bytes();
        if offset >= logical_bytes {
            return err(format!(
                "workload.offset = {offset} is beyond the logical capacity {logical_bytes} bytes"
            ));
        }
        if span == 0 {
            return err("workload.span must be positive");
        }
        match offset.checked_add(span) {
            Some(end) if end <= logical_bytes => {}
            end => {
                let end = end.map_or_else(|| format!("{offset} + {span}"), |e| e.to_string());
                return err(format!(
                    "workload.offset + span = {end} exceeds the logical capacity \
                     {logical_bytes} bytes"
                ));
            }
        }
        // bs <= logical_bytes, a whole number of pages: no overflow.
        if span < bs.div_ceil(page) * page {
            return err("workload.span is smaller than one block of size bs");
        }
        Ok(())
    }

    /// Physical pages of the whole device (saturating at u64::MAX for a geometry that
    /// validation refuses).
    pub fn physical_pages(&self) -> u64 {
        let g = &self.geometry;
        let pages = g.channels as u128
            * g.dies_per_channel as u128
            * g.planes_per_die as u128
            * g.blocks_per_plane as u128
            * g.pages_per_block as u128;
        pages.min(u64::MAX as u128) as u64
    }

    /// Logical pages exported to the host: physical * (1 - op_ratio), rounded down.
    pub fn logical_pages(&self) -> u64 {
        (self.physical_pages() as f64 * (1.0 - self.ftl.op_ratio)).floor() as u64
    }

    /// Bytes touched by the workload (`span`, default: from `offset` to the end).
    pub fn span_bytes(&self) -> u64 {
        let logical_bytes = self
            .logical_pages()
            .saturating_mul(self.geometry.page_size as u64);
        let offset = self.workload.offset.bytes(logical_bytes);
        match self.workload.span {
            Some(s) => s.bytes(logical_bytes),
            None => logical_bytes.saturating_sub(offset),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4k"), Ok(SizeText::Bytes(4096)));
        assert_eq!(parse_size("128KiB"), Ok(SizeText::Bytes(131072)));
        assert_eq!(parse_size("1g"), Ok(SizeText::Bytes(1 << 30)));
        assert_eq!(parse_size("50%"), Ok(SizeText::Fraction(0.5)));
        assert!(parse_size("abc").is_err());
    }

    #[test]
    fn defaults_validate() {
        SimConfig::default().validate().unwrap();
        let c = SimConfig::from_toml("[workload]\nbs = \"8k\"\nspan = \"50%\"\n").unwrap();
        assert_eq!(c.workload.bs.bytes(0), 8192);
        assert_eq!(c.span_bytes(), c.logical_pages() * 4096 / 2);
    }

    #[test]
    fn bad_configs_are_errors() {
        for bad in [
            "[geometry]\nchannels = 0",
            "[ftl]\nop_ratio = 0.0",
            "[ftl]\ngc_policy = \"lru\"",
            "[workload]\nrw = \"trim\"",
            "[geometry]\nblocks_per_plane = 8",
            "[bogus]\nx = 1",
            "[workload]\nbs = \"4q\"",
        ] {
            assert!(SimConfig::from_toml(bad).is_err(), "{bad}");
        }
    }

    /// The error of `text`, which must not parse or validate.
    fn config_error(text: &str) -> String {
        match SimConfig::from_toml(text) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => e.to_string(),
        }
    }

    /// Sizes that do not fit (a float string saturating to u64::MAX, a block size larger
    /// than the device) are errors naming the key, never a panic or a wrapped sum.
    #[test]
    fn absurd_sizes_are_errors_not_panics() {
        let e = parse_size("1e30").unwrap_err();
        assert!(e.contains("too large"), "{e}");
        assert!(parse_size("16777216t").is_err());
        let e = config_error("[workload]\nbs = \"1e30\"\n");
        assert!(e.contains("too large"), "{e}");
        // Larger than the whole logical capacity (default geometry: 16 GiB raw).
        let e = config_error("[workload]\nbs = \"1t\"\n");
        assert!(
            e.contains("workload.bs") && e.contains("logical capacity"),
            "{e}"
        );
        let e = config_error("[workload]\nbs = 9223372036854775807\n");
        assert!(e.contains("workload.bs"), "{e}");
    }

    /// `offset + span` past the end is an error, whatever the sizes (no wrapping sum).
    #[test]
    fn span_past_the_end_is_an_error() {
        let e = config_error("[workload]\noffset = 4096\nspan = \"1e30\"\n");
        assert!(e.contains("span"), "{e}");
        let e = config_error("[workload]\noffset = 4096\nspan = 9223372036854775807\n");
        assert!(e.contains("workload.offset + span"), "{e}");
    }

    /// A run limited by time only must end: `runtime_ms` is finite, bounded and at least
    /// 1 ns.
    #[test]
    fn runtime_must_be_finite_bounded_and_at_least_a_nanosecond() {
        for v in ["inf", "1e300", "nan", "-1.0", "0.0000001"] {
            let e = config_error(&format!("[workload]\nios = 0\nruntime_ms = {v}\n"));
            assert!(e.contains("workload.runtime_ms"), "{v}: {e}");
        }
        // Also with an I/O count (the time limit still feeds the engine's clock).
        let e = config_error("[workload]\nruntime_ms = inf\n");
        assert!(e.contains("workload.runtime_ms"), "{e}");
        SimConfig::from_toml("[workload]\nios = 0\nruntime_ms = 0.000001\n").unwrap();
    }

    /// d-choices samples `d_choices` blocks per victim: a huge value would never finish.
    #[test]
    fn d_choices_is_capped() {
        let e = config_error("[ftl]\ngc_policy = \"d-choices\"\nd_choices = 4294967295\n");
        assert!(e.contains("ftl.d_choices") && e.contains("1024"), "{e}");
        SimConfig::from_toml("[ftl]\ngc_policy = \"d-choices\"\nd_choices = 1024\n").unwrap();
    }

    /// `ios / sample_every` time-series points are kept in memory: bounded.
    #[test]
    fn time_series_points_are_capped() {
        let e = config_error("[workload]\nios = 100000000\nsample_every = 1\n");
        assert!(e.contains("workload.sample_every"), "{e}");
        SimConfig::from_toml("[workload]\nios = 1000000\nsample_every = 1\n").unwrap();
    }

    /// A geometry whose simulator state would take tens of GiB is refused up front.
    #[test]
    fn huge_geometry_memory_is_an_error() {
        let e = config_error(
            "[geometry]\nchannels = 16\ndies_per_channel = 16\nplanes_per_die = 4\n\
             blocks_per_plane = 4096\npages_per_block = 512\n",
        );
        assert!(e.contains("memory") && e.contains("GiB"), "{e}");
        // Many channels of tiny dies: the per-die and per-channel state counts too.
        let e = config_error(
            "[geometry]\nchannels = 200000000\ndies_per_channel = 1\nplanes_per_die = 1\n\
             blocks_per_plane = 20\npages_per_block = 1\n[ftl]\nop_ratio = 0.5\n",
        );
        assert!(e.contains("memory"), "{e}");
    }

    /// A bad size keeps its reason (not serde's "did not match any variant").
    #[test]
    fn size_errors_keep_their_reason() {
        for (text, want) in [
            ("bs = \"4q\"", "bad size"),
            ("span = \"0%\"", "(0, 100]"),
            ("offset = \"200%\"", "(0, 100]"),
            ("bs = -1", "negative"),
            ("bs = 4096.0", "integer"),
            ("bs = \"50%\"", "percentage"),
            ("bs = true", "integer"),
        ] {
            let e = config_error(&format!("[workload]\n{text}\n"));
            assert!(!e.contains("untagged"), "{text}: {e}");
            assert!(e.contains(want), "{text}: {e}");
            assert!(
                e.contains("bs") || e.contains("span") || e.contains("offset"),
                "{e}"
            );
        }
    }
}
