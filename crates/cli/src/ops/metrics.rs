//! Prometheus metrics of `flashpool serve --metrics`: the text exposition format (0.0.4, the
//! one `promtool check metrics` reads), built with the `prometheus` crate.
//!
//! Two sources:
//! - the NBD front-end: when metrics are on, every volume the NBD server hands a client is
//!   wrapped by [`CountedExport`], which counts requests, bytes and errors and times each
//!   request into a latency histogram, per volume and operation (a read once per request,
//!   whole, when the NBD layer answers it: `Export::read_answered`); and counts the
//!   connections holding each volume open;
//! - the pool, read at each scrape ([`pool_families`]): the engine's counters, space,
//!   segments by utilisation, write amplification by cause, compression, drives and their
//!   state (with the kernel's I/O counters for members that are block devices), rebuild and
//!   cleaner progress, the last scrub.
//!
//! Names follow Prometheus' conventions: `flashpool_` prefix, base units (bytes, seconds,
//! ratios), `_total` on counters only, `volume=` and `drive=` labels.

use crate::admin::Controls;
use crate::export::PoolExports;
use flashpool_engine::Pool;
use flashpool_nbd::{Export, ExportError, ExportSet, Extent, ReadQueue};
use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Request latency buckets, in seconds: 25 µs to 1 s.
const LATENCY_BUCKETS: &[f64] = &[
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3,
    1.0,
];

/// The operations counted per volume.
const OPS: &[&str] = &["read", "write", "flush", "trim", "write_zeroes"];

/// Per-volume front-end metrics (NBD).
pub struct FrontendMetrics {
    requests: IntCounterVec,
    bytes: IntCounterVec,
    errors: IntCounterVec,
    latency: HistogramVec,
    connections: IntGaugeVec,
    /// Volumes that have label values in the vectors above (pruned when a volume goes).
    seen: Mutex<BTreeSet<String>>,
}

/// Everything `/metrics` shows.
pub struct Metrics {
    registry: Registry,
    pub frontend: Arc<FrontendMetrics>,
    pool: Arc<Pool>,
    controls: Arc<Controls>,
    started: Instant,
    /// The kernel's I/O counters of a member at a path ([`block_stat`]; tests stand in).
    block_stat: BlockStat,
}

/// Reads the kernel's I/O counters of the member at a path, if it is a block device.
type BlockStat = fn(&str) -> Option<[u64; 7]>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Metrics {
    /// The metrics of one server's pool.
    pub fn new(pool: Arc<Pool>, controls: Arc<Controls>) -> prometheus::Result<Metrics> {
        let registry = Registry::new();
        let frontend = FrontendMetrics {
            requests: IntCounterVec::new(
                Opts::new(
                    "flashpool_volume_requests_total",
                    "NBD requests completed on a volume, by operation (errors included).",
                ),
                &["volume", "op"],
            )?,
            bytes: IntCounterVec::new(
                Opts::new(
                    "flashpool_volume_bytes_total",
                    "Bytes a volume's NBD requests covered, by operation (read, write, trim, write_zeroes).",
                ),
                &["volume", "op"],
            )?,
            errors: IntCounterVec::new(
                Opts::new(
                    "flashpool_volume_errors_total",
                    "NBD requests on a volume that failed, by operation.",
                ),
                &["volume", "op"],
            )?,
            latency: HistogramVec::new(
                HistogramOpts::new(
                    "flashpool_volume_request_duration_seconds",
                    "Time the pool took to serve a volume's NBD request, by operation (from the export call to its return; a read from the server's look for holes to its last byte in; network and queueing excluded).",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["volume", "op"],
            )?,
            connections: IntGaugeVec::new(
                Opts::new(
                    "flashpool_nbd_connections",
                    "NBD connections that have a volume open (past the handshake).",
                ),
                &["volume"],
            )?,
            seen: Mutex::new(BTreeSet::new()),
        };
        registry.register(Box::new(frontend.requests.clone()))?;
        registry.register(Box::new(frontend.bytes.clone()))?;
        registry.register(Box::new(frontend.errors.clone()))?;
        registry.register(Box::new(frontend.latency.clone()))?;
        registry.register(Box::new(frontend.connections.clone()))?;
        Ok(Metrics {
            registry,
            frontend: Arc::new(frontend),
            pool,
            controls,
            started: Instant::now(),
            block_stat,
        })
    }

    /// The NBD export set of the pool, counted.
    pub fn exports(&self) -> CountedExports {
        CountedExports {
            inner: PoolExports(self.pool.clone()),
            metrics: self.frontend.clone(),
        }
    }

    /// The text exposition of every metric, as `/metrics` serves it.
    pub fn render(&self) -> prometheus::Result<String> {
        self.prune();
        let mut families = self.registry.gather();
        families.extend(pool_families(
            &self.pool,
            &self.controls,
            self.started,
            self.block_stat,
        ));
        // A family without series (no member failed) is left out: the format has no empty
        // families. Series in label order, so the page reads the same at every scrape.
        families.retain(|f| !f.get_metric().is_empty());
        families.sort_by(|a, b| a.name().cmp(b.name()));
        for f in &mut families {
            f.mut_metric().sort_by(|a, b| {
                let key = |m: &prometheus::proto::Metric| {
                    m.get_label()
                        .iter()
                        .map(|l| (l.name().to_string(), l.value().to_string()))
                        .collect::<Vec<_>>()
                };
                natural(&key(a)).cmp(&natural(&key(b)))
            });
        }
        let mut out = String::new();
        prometheus::TextEncoder::new().encode_utf8(&families, &mut out)?;
        Ok(out)
    }

    /// Drops the front-end series of volumes deleted since (and no longer open).
    fn prune(&self) {
        let live: BTreeSet<String> = self.pool.volumes().into_iter().map(|v| v.name).collect();
        let f = &self.frontend;
        let mut seen = lock(&f.seen);
        seen.retain(|v| {
            if live.contains(v)
                || f.connections
                    .get_metric_with_label_values(&[v])
                    .is_ok_and(|g| g.get() > 0)
            {
                return true;
            }
            for op in OPS {
                let _ = f.requests.remove_label_values(&[v.as_str(), op]);
                let _ = f.bytes.remove_label_values(&[v.as_str(), op]);
                let _ = f.errors.remove_label_values(&[v.as_str(), op]);
                let _ = f.latency.remove_label_values(&[v.as_str(), op]);
            }
            let _ = f.connections.remove_label_values(&[v]);
            false
        });
    }
}

/// Label values as sort keys where numbers sort as numbers (drive 2 before drive 10).
fn natural(labels: &[(String, String)]) -> Vec<(String, u64, String)> {
    labels
        .iter()
        .map(|(n, v)| {
            let digits: String = v.chars().take_while(char::is_ascii_digit).collect();
            (n.clone(), digits.parse().unwrap_or(u64::MAX), v.clone())
        })
        .collect()
}

/// The series of one operation on one volume.
#[derive(Clone)]
struct OpMetrics {
    requests: IntCounter,
    /// None for operations that move no bytes (flush).
    bytes: Option<IntCounter>,
    errors: IntCounter,
    latency: Histogram,
}

impl OpMetrics {
    fn record<T>(&self, bytes: u64, started: Instant, r: &Result<T, ExportError>) {
        self.record_ok(bytes, started, r.is_ok());
    }
    fn record_ok(&self, bytes: u64, started: Instant, ok: bool) {
        self.latency.observe(started.elapsed().as_secs_f64());
        self.requests.inc();
        if ok {
            if let Some(b) = &self.bytes {
                b.inc_by(bytes);
            }
        } else {
            self.errors.inc();
        }
    }
}

/// A volume as an NBD export, counted; one per connection that opened it.
pub struct CountedExport {
    inner: Arc<dyn Export>,
    read: OpMetrics,
    write: OpMetrics,
    flush: OpMetrics,
    trim: OpMetrics,
    zeroes: OpMetrics,
    connections: IntGauge,
}

impl Drop for CountedExport {
    fn drop(&mut self) {
        self.connections.dec();
    }
}

impl Export for CountedExport {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    /// Reads are counted once per NBD request ([`Export::read_answered`]), not here: the NBD
    /// layer answers holes without reading and reads a structured read's data extents apart.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.inner.read(offset, buf)
    }
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<Result<(), ExportError>> {
        self.inner.read_many(reads)
    }
    fn read_may_block(&self, offset: u64, len: u64) -> bool {
        self.inner.read_may_block(offset, len)
    }
    fn write_may_block(&self, offset: u64, len: u64) -> bool {
        self.inner.write_may_block(offset, len)
    }
    fn write_would_block_now(&self) -> bool {
        self.inner.write_would_block_now()
    }
    /// The volume's own read queue: its reads are counted when the NBD layer answers them,
    /// as every read is.
    fn read_queue(&self) -> Option<Box<dyn ReadQueue>> {
        self.inner.read_queue()
    }
    /// One READ request, however much of it was read from the volume: its full length,
    /// its time from the server's first look (holes) to its last byte in.
    fn read_answered(&self, offset: u64, len: u64, started: Instant, ok: bool) {
        self.inner.read_answered(offset, len, started, ok);
        self.read.record_ok(len, started, ok);
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        let t = Instant::now();
        let r = self.inner.write(offset, data, fua);
        self.write.record(data.len() as u64, t, &r);
        r
    }
    fn flush(&self) -> Result<(), ExportError> {
        let t = Instant::now();
        let r = self.inner.flush();
        self.flush.record(0, t, &r);
        r
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        let t = Instant::now();
        let r = self.inner.trim(offset, len);
        self.trim.record(len, t, &r);
        r
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        let t = Instant::now();
        let r = self.inner.write_zeroes(offset, len);
        self.zeroes.record(len, t, &r);
        r
    }
    fn write_zeroes_no_hole(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        let t = Instant::now();
        let r = self.inner.write_zeroes_no_hole(offset, len);
        self.zeroes.record(len, t, &r);
        r
    }
    fn fast_zero(&self) -> bool {
        self.inner.fast_zero()
    }
    /// Not counted: structured reads ask it too (to find holes), so its count would not be
    /// the clients' NBD_CMD_BLOCK_STATUS requests.
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, ExportError> {
        self.inner.block_status(offset, len)
    }
    fn cache(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.inner.cache(offset, len)
    }
    fn read_only(&self) -> bool {
        self.inner.read_only()
    }
    fn rotational(&self) -> bool {
        self.inner.rotational()
    }
}

/// The pool's volumes as NBD exports, each counted ([`CountedExport`]).
pub struct CountedExports {
    inner: PoolExports,
    metrics: Arc<FrontendMetrics>,
}

impl ExportSet for CountedExports {
    fn list(&self) -> Vec<(String, String)> {
        self.inner.list()
    }
    fn get(&self, name: &str) -> Option<Arc<dyn Export>> {
        let inner = self.inner.get(name)?;
        let volume = self.inner.canonical_name(name);
        let m = &self.metrics;
        lock(&m.seen).insert(volume.clone());
        let op = |op: &str| OpMetrics {
            requests: m.requests.with_label_values(&[&volume, op]),
            bytes: (op != "flush").then(|| m.bytes.with_label_values(&[&volume, op])),
            errors: m.errors.with_label_values(&[&volume, op]),
            latency: m.latency.with_label_values(&[&volume, op]),
        };
        let connections = m.connections.with_label_values(&[&volume]);
        connections.inc();
        Some(Arc::new(CountedExport {
            inner,
            read: op("read"),
            write: op("write"),
            flush: op("flush"),
            trim: op("trim"),
            zeroes: op("write_zeroes"),
            connections,
        }))
    }
    fn canonical_name(&self, name: &str) -> String {
        self.inner.canonical_name(name)
    }
    fn description(&self, name: &str) -> Option<String> {
        self.inner.description(name)
    }
}

/// Metric families built at scrape time from values read off the pool.
#[derive(Default)]
struct Families(Vec<MetricFamily>);

impl Families {
    fn push(&mut self, c: &dyn Collector) {
        self.0.extend(c.collect());
    }
    fn counter(&mut self, name: &str, help: &str, v: u64) {
        if let Ok(c) = IntCounter::new(name, help) {
            c.inc_by(v);
            self.push(&c);
        }
    }
    fn gauge(&mut self, name: &str, help: &str, v: f64) {
        if let Ok(g) = Gauge::new(name, help) {
            g.set(v);
            self.push(&g);
        }
    }
    fn counter_vec<'a>(
        &mut self,
        name: &str,
        help: &str,
        labels: &[&str],
        rows: impl IntoIterator<Item = (Vec<&'a str>, u64)>,
    ) {
        if let Ok(c) = IntCounterVec::new(Opts::new(name, help), labels) {
            for (vals, v) in rows {
                if let Ok(m) = c.get_metric_with_label_values(&vals) {
                    m.inc_by(v);
                }
            }
            self.push(&c);
        }
    }
    fn gauge_vec<'a>(
        &mut self,
        name: &str,
        help: &str,
        labels: &[&str],
        rows: impl IntoIterator<Item = (Vec<&'a str>, f64)>,
    ) {
        if let Ok(g) = GaugeVec::new(Opts::new(name, help), labels) {
            for (vals, v) in rows {
                if let Ok(m) = g.get_metric_with_label_values(&vals) {
                    m.set(v);
                }
            }
            self.push(&g);
        }
    }
}

/// Help text of the engine's counters (`flashpool_engine::Stats`), exported as
/// `flashpool_<name>_total`; a counter not listed here is exported with a generic help.
const ENGINE_COUNTERS: &[(&str, &str)] = &[
    ("host_write_bytes", "Bytes hosts wrote (write requests, not trims or zeroes)."),
    ("host_read_bytes", "Bytes hosts read."),
    ("media_data_bytes", "Bytes of volume data written to the drives (host data and data the cleaner or a rebuild moved)."),
    ("media_parity_bytes", "Bytes of parity written to the drives."),
    ("media_metadata_bytes", "Bytes of metadata written to the drives: chunk headers, checkpoints, superblocks."),
    ("media_checkpoint_bytes", "Bytes of checkpoints (their stripes whole) and superblocks written to the drives; part of media_metadata_bytes, the rest being chunk headers."),
    ("media_padding_bytes", "Bytes written only to fill alignment."),
    ("media_read_bytes", "Bytes read from the drives, for any reason."),
    ("write_preread_bytes", "Bytes read from the drives to complete a host write of whole blocks (read-modify-write; none by design)."),
    ("unaligned_merge_read_bytes", "Bytes read to merge a sub-4 KiB or unaligned host write into its block."),
    ("stripes_written", "Stripes written."),
    ("chunk_writes", "Chunks of stripes issued to the drives."),
    ("drive_writes", "Drive write operations those chunks took (fewer where a drive's chunks of consecutive stripes went out as one write)."),
    ("full_stripes", "Stripes written at full width."),
    ("partial_stripes", "Stripes written narrower than full width (by a flush) or holding metadata only."),
    ("flushes", "Pool flushes completed."),
    ("checkpoints", "Checkpoints completed."),
    ("degraded_reads", "Host reads served by reconstruction from the rest of a stripe."),
    ("crc_errors", "Chunks or blocks whose CRC32C did not match (treated as erasures)."),
    ("torn_chunks", "Chunks of stripes in the log after the checkpoint that an open found cut short by a crash (not counted as CRC errors; their stripes were rewritten whole, or skipped as never flushed)."),
    ("read_errors", "Drive read errors (treated as erasures)."),
    ("write_errors", "Drive write errors."),
    ("reconstructed_chunks", "Chunks, or the spans of them a read needed, rebuilt by erasure decoding."),
    ("unrecoverable_blocks", "Live blocks that no parity could recover (found by reads and scrubs)."),
    ("repaired_segments", "Segments whose live data was moved to repair chunks that failed their CRC or read."),
    ("gc_relocated_bytes", "Bytes of live data the cleaner (and rebuilds) moved."),
    ("gc_segments_cleaned", "Segments the cleaner emptied."),
    ("gc_segments_unread", "Of those, segments with nothing live the latest checkpoint covered: not read."),
    ("gc_runs", "Cleaner passes."),
    ("gc_idle_rounds", "Background cleaning rounds that gained no free segment; background cleaning then stays idle until a host write, trim, volume delete or shrink, or a change of the members in service."),
    ("segments_freed_by_log", "Emptied segments freed by a log record (no checkpoint needed)."),
    ("segments_freed_by_relog", "Of those, segments written since the latest checkpoint (their trims and volume changes logged again)."),
    ("segments_freed_at_checkpoint", "Emptied segments freed by a checkpoint (they held stripes a recovery would replay)."),
    ("compressed_blocks", "Blocks stored compressed."),
    ("incompressible_blocks", "Blocks tried that did not compress enough (stored raw)."),
    ("compression_skipped_blocks", "Blocks stored raw without trying, while compression backs off."),
    ("compressed_stored_bytes", "Stored bytes of the compressed blocks (4096 logical bytes each)."),
];

/// Every pool-side metric family, read now (`block_stat`: the kernel's counters of a member).
fn pool_families(
    pool: &Pool,
    controls: &Controls,
    started: Instant,
    block_stat: BlockStat,
) -> Vec<MetricFamily> {
    let mut f = Families::default();
    let stats = pool.stats();
    let info = pool.info();

    f.gauge_vec(
        "flashpool_build_info",
        "The flashpool version serving (always 1).",
        &["version"],
        [(vec![env!("CARGO_PKG_VERSION")], 1.0)],
    );
    f.gauge(
        "flashpool_uptime_seconds",
        "Seconds since this server started.",
        started.elapsed().as_secs_f64(),
    );

    // The engine's counters, since this server started.
    for (name, v) in stats.fields() {
        let help = ENGINE_COUNTERS
            .iter()
            .find(|(n, _)| *n == name)
            .map_or_else(|| format!("Engine counter {name}."), |(_, h)| h.to_string());
        f.counter(&format!("flashpool_{name}_total"), &help, v);
    }

    // Write amplification by cause, over this server's run (rate() of the counters above
    // gives it over any window).
    let host = stats.host_write_bytes;
    let ratio = |x: u64| {
        if host == 0 {
            0.0
        } else {
            x as f64 / host as f64
        }
    };
    f.gauge_vec(
        "flashpool_write_amplification_ratio",
        "Bytes written to the drives per byte hosts wrote since the server started, by cause: all (every media byte), gc (data the cleaner moved), parity, metadata, padding; 0 before hosts wrote anything.",
        &["cause"],
        [
            (vec!["all"], ratio(stats.media_write_bytes())),
            (vec!["gc"], ratio(stats.gc_relocated_bytes)),
            (vec!["parity"], ratio(stats.media_parity_bytes)),
            (vec!["metadata"], ratio(stats.media_metadata_bytes)),
            (vec!["padding"], ratio(stats.media_padding_bytes)),
        ],
    );

    // Compression.
    let tried =
        stats.compressed_blocks + stats.incompressible_blocks + stats.compression_skipped_blocks;
    let stored = stats.compressed_stored_bytes
        + (stats.incompressible_blocks + stats.compression_skipped_blocks) * 4096;
    f.gauge(
        "flashpool_compression_ratio",
        "Logical over stored bytes of the blocks written with compression on since the server started (1 when none).",
        if stored == 0 { 1.0 } else { (tried * 4096) as f64 / stored as f64 },
    );

    // Space.
    f.gauge(
        "flashpool_capacity_bytes",
        "Bytes of data the pool holds when every segment is used at the width of the whole pool (every member not retired in service).",
        info.capacity_bytes as f64,
    );
    f.gauge(
        "flashpool_capacity_now_bytes",
        "Bytes of data the pool holds at today's stripe width (narrower while members are down).",
        info.capacity_now_bytes as f64,
    );
    f.gauge(
        "flashpool_used_bytes",
        "Bytes of live (mapped) volume data, after compression.",
        info.live_bytes as f64,
    );
    f.gauge(
        "flashpool_free_bytes",
        "Bytes of data the pool can still take at today's width (capacity now less live data).",
        info.capacity_now_bytes.saturating_sub(info.live_bytes) as f64,
    );
    if let Some(limit) = info.live_limit_bytes {
        f.gauge("flashpool_live_limit_bytes", "With the rebuild reserve on: live bytes past which hosts get ENOSPC, so a lost member can always be rebuilt.", limit as f64);
    }
    f.gauge(
        "flashpool_segment_size_bytes",
        "Bytes of each drive a segment takes.",
        info.segment_size as f64,
    );

    // Segments: by state, and those holding data by utilisation (the cleaner's measure).
    let segments = pool.segments();
    let mut states: std::collections::BTreeMap<&str, u64> =
        ["free", "used", "open", "checkpoint", "reclaimed"]
            .into_iter()
            .map(|s| (s, 0))
            .collect();
    let mut tenths = [0u64; 10];
    for s in &segments {
        *states.entry(s.state).or_default() += 1;
        if let Some(u) = s.utilisation {
            tenths[((u * 10.0) as usize).min(9)] += 1;
        }
    }
    f.gauge_vec(
        "flashpool_segments",
        "Segments by state: free, used, open (being filled), checkpoint, reclaimed (emptied by the cleaner, free once the moves out of it are flushed).",
        &["state"],
        states.iter().map(|(s, n)| (vec![*s], *n as f64)),
    );
    let bands: Vec<String> = (0..10)
        .map(|i| format!("{}-{}%", i * 10, i * 10 + 10))
        .collect();
    f.gauge_vec(
        "flashpool_data_segments",
        "Segments holding data by utilisation band: the share of their space live data would take at today's width (the cleaner empties the least used first).",
        &["utilisation"],
        bands.iter().zip(tenths).map(|(b, n)| (vec![b.as_str()], n as f64)),
    );

    // Volumes (engine side).
    let volumes = pool.volumes();
    f.gauge_vec(
        "flashpool_volume_size_bytes",
        "A volume's size (thin: not space taken).",
        &["volume"],
        volumes
            .iter()
            .map(|v| (vec![v.name.as_str()], v.size as f64)),
    );
    f.gauge_vec(
        "flashpool_volume_compression_ratio",
        "A volume's logical over stored bytes (1 when nothing compressed).",
        &["volume"],
        volumes
            .iter()
            .map(|v| (vec![v.name.as_str()], v.compression_ratio)),
    );
    f.gauge_vec(
        "flashpool_volume_map_memory_bytes",
        "Bytes of RAM a volume's block map takes.",
        &["volume"],
        volumes
            .iter()
            .map(|v| (vec![v.name.as_str()], v.map_bytes as f64)),
    );

    // Drives.
    let drives = pool.drives();
    let index: Vec<String> = drives.iter().map(|d| d.index.to_string()).collect();
    f.gauge_vec(
        "flashpool_drive_info",
        "A member drive's identity (always 1): its path and UUID.",
        &["drive", "path", "uuid"],
        drives
            .iter()
            .zip(&index)
            .map(|(d, i)| (vec![i.as_str(), d.identity.as_str(), d.uuid.as_str()], 1.0)),
    );
    const DRIVE_STATES: [&str; 4] = ["active", "failed", "missing", "retired"];
    f.gauge_vec(
        "flashpool_drive_state",
        "A member drive's state: 1 for the state it is in (active, failed, missing, retired), 0 for the others.",
        &["drive", "state"],
        drives.iter().zip(&index).flat_map(|(d, i)| {
            DRIVE_STATES
                .iter()
                .map(move |s| (vec![i.as_str(), *s], f64::from(u8::from(d.state == *s))))
        }),
    );
    let failures = pool.drive_failures();
    f.gauge_vec(
        "flashpool_drive_failed_timestamp_seconds",
        "When a member still out of service was taken out (Unix time).",
        &["drive"],
        failures.iter().zip(&index).filter_map(|(fl, i)| {
            fl.as_ref()
                .map(|fl| (vec![i.as_str()], fl.at_unix_secs as f64))
        }),
    );
    f.gauge(
        "flashpool_drives_down",
        "Members failed or missing.",
        info.members_down as f64,
    );
    f.gauge(
        "flashpool_drives_unlinked",
        "Members in service whose drive file was deleted while the server holds it open: they serve now and will be missing after a restart (replace or remove them).",
        info.members_unlinked as f64,
    );
    f.gauge(
        "flashpool_failures_tolerated",
        "Further member failures the pool survives now (parity members less members down, members in service missing chunks their full host filesystem refused, and members whose drive file was deleted; fewer than the members in service).",
        info.failures_tolerated as f64,
    );
    f.gauge(
        "flashpool_stripe_data_width",
        "Data chunks per stripe written now (0 when the pool cannot write).",
        info.width_now as f64,
    );
    f.gauge(
        "flashpool_stripe_parity_chunks",
        "Parity chunks per stripe.",
        info.m as f64,
    );
    drive_io(&mut f, &drives, &index, block_stat);

    // Rebuild.
    let rb = pool.rebuild_status();
    f.gauge(
        "flashpool_rebuild_needed",
        "1 while a member's data waits to be rebuilt.",
        f64::from(u8::from(pool.needs_rebuild())),
    );
    f.gauge(
        "flashpool_rebuild_running",
        "1 while a rebuild runs.",
        f64::from(u8::from(rb.running)),
    );
    f.gauge(
        "flashpool_rebuild_paused",
        "1 while automatic rebuilds are paused by an operator.",
        f64::from(u8::from(
            controls
                .rebuild_paused
                .load(std::sync::atomic::Ordering::Relaxed),
        )),
    );
    f.gauge(
        "flashpool_rebuild_progress_ratio",
        "Share of the running (or last) rebuild's segments done (0 to 1).",
        rb.percent() / 100.0,
    );
    f.gauge(
        "flashpool_rebuild_segments_done",
        "Segments the running (or last) rebuild relocated.",
        rb.done_segments as f64,
    );
    f.gauge(
        "flashpool_rebuild_segments_planned",
        "Segments the running (or last) rebuild has to relocate.",
        rb.total_segments as f64,
    );
    f.gauge(
        "flashpool_rebuild_moved_bytes",
        "Bytes the running (or last) rebuild moved.",
        rb.moved_bytes as f64,
    );
    f.gauge(
        "flashpool_rebuild_failed_attempts",
        "Rebuild attempts that failed since the last success.",
        rb.failed_attempts as f64,
    );
    let eta = rb.eta_secs();
    if rb.running && eta.is_finite() {
        f.gauge(
            "flashpool_rebuild_eta_seconds",
            "Estimated seconds left of the running rebuild.",
            eta,
        );
    }

    // Cleaner.
    f.gauge(
        "flashpool_cleaner_paused",
        "1 while the background cleaner is paused by an operator.",
        f64::from(u8::from(
            controls
                .cleaner_paused
                .load(std::sync::atomic::Ordering::Relaxed),
        )),
    );
    f.gauge(
        "flashpool_cleaner_idle",
        "1 while background cleaning is idle: its last round gained no free segment and nothing changed since.",
        f64::from(u8::from(pool.gc_idle())),
    );
    f.gauge(
        "flashpool_cleaner_high_water_segments",
        "The background cleaner works while fewer segments than this are free.",
        pool.gc_high_water() as f64,
    );
    f.gauge(
        "flashpool_repairs_pending_segments",
        "Segments waiting to be repaired after reads met bad blocks.",
        pool.repairs_pending() as f64,
    );

    // Last scrub.
    if let Some(s) = pool.last_scrub() {
        f.gauge(
            "flashpool_scrub_last_stripes_checked",
            "Stripes the last scrub checked.",
            s.stripes_checked as f64,
        );
        f.gauge(
            "flashpool_scrub_last_bad_chunks",
            "Bad chunks the last scrub found.",
            s.bad_chunks as f64,
        );
        f.gauge(
            "flashpool_scrub_last_unrecoverable_blocks",
            "Blocks the last scrub found lost.",
            s.unrecoverable.len() as f64,
        );
        f.gauge(
            "flashpool_scrub_last_unavailable_blocks",
            "Live blocks the last scrub could not read because more of their stripe's chunks are on members out of service than parity covers (not lost: they read again when those members return).",
            s.blocks_unavailable as f64,
        );
        f.gauge(
            "flashpool_scrub_last_duration_seconds",
            "How long the last scrub took.",
            s.elapsed_secs,
        );
    }
    f.0
}

/// The kernel's I/O counters (`/sys/class/block/NAME/stat`) of members that are block
/// devices: the device's own counts, whatever else uses it. File drives have none. Named
/// `flashpool_drive_io_*` where the engine's pool-wide counters would share a name
/// (`flashpool_drive_writes_total` is the engine's: one name is one family).
fn drive_io(
    f: &mut Families,
    drives: &[flashpool_engine::DriveStatus],
    index: &[String],
    block_stat: BlockStat,
) {
    // (drive index, [reads, sectors read, ms reading, writes, sectors written, ms writing, ms busy])
    let mut rows: Vec<(&str, [u64; 7])> = Vec::new();
    for (d, i) in drives.iter().zip(index) {
        if let Some(s) = block_stat(&d.identity) {
            rows.push((i.as_str(), s));
        }
    }
    if rows.is_empty() {
        return;
    }
    let col = |c: usize| rows.iter().map(move |(i, s)| (vec![*i], s[c]));
    let secs = |c: usize| {
        rows.iter()
            .map(move |(i, s)| (vec![*i], s[c] as f64 / 1000.0))
    };
    f.counter_vec(
        "flashpool_drive_io_reads_total",
        "Reads the block device completed (kernel counter).",
        &["drive"],
        col(0),
    );
    f.counter_vec(
        "flashpool_drive_read_bytes_total",
        "Bytes the block device read (kernel counter).",
        &["drive"],
        rows.iter().map(|(i, s)| (vec![*i], s[1] * 512)),
    );
    f.counter_vec(
        "flashpool_drive_io_writes_total",
        "Writes the block device completed (kernel counter).",
        &["drive"],
        col(3),
    );
    f.counter_vec(
        "flashpool_drive_written_bytes_total",
        "Bytes written to the block device (kernel counter).",
        &["drive"],
        rows.iter().map(|(i, s)| (vec![*i], s[4] * 512)),
    );
    // Counters in seconds are floats; build them as gauges' values in a counter family.
    for (name, help, c) in [
        (
            "flashpool_drive_read_time_seconds_total",
            "Seconds reads spent on the block device, summed over reads (kernel counter).",
            2,
        ),
        (
            "flashpool_drive_write_time_seconds_total",
            "Seconds writes spent on the block device, summed over writes (kernel counter).",
            5,
        ),
        (
            "flashpool_drive_busy_time_seconds_total",
            "Seconds the block device had I/O in flight (kernel counter).",
            6,
        ),
    ] {
        if let Ok(cv) = prometheus::CounterVec::new(Opts::new(name, help), &["drive"]) {
            for (vals, v) in secs(c) {
                if let Ok(m) = cv.get_metric_with_label_values(&vals) {
                    m.inc_by(v);
                }
            }
            f.push(&cv);
        }
    }
}

/// The stat line of the block device at `path`, if it is one.
fn block_stat(path: &str) -> Option<[u64; 7]> {
    use std::os::unix::fs::FileTypeExt;
    let real = std::fs::canonicalize(path).ok()?;
    if !std::fs::metadata(&real).ok()?.file_type().is_block_device() {
        return None;
    }
    let name = real.file_name()?.to_str()?;
    let text = std::fs::read_to_string(format!("/sys/class/block/{name}/stat")).ok()?;
    let v: Vec<u64> = text
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    // reads, merged, sectors, ms, writes, merged, sectors, ms, in flight, io ms, ...
    (v.len() >= 10).then(|| [v[0], v[2], v[3], v[4], v[6], v[7], v[9]])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 4+1 pool of five 64 MiB file drives under a new directory `tag` of the temp dir,
    /// with a 16 MiB volume `default`; the directory, to remove.
    fn file_pool(tag: &str) -> (Arc<Pool>, std::path::PathBuf) {
        use flashpool_engine::drive::{DriveRef, FileDrive};
        use flashpool_engine::{Compression, PoolConfig};
        let dir = std::env::temp_dir().join(format!("fp-metrics-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let drives: Vec<DriveRef> = (0..5)
            .map(|i| {
                let d = FileDrive::create(&dir.join(format!("d{i}.img")), 64 << 20).unwrap();
                Arc::new(d) as DriveRef
            })
            .collect();
        let cfg = PoolConfig {
            k: 4,
            m: 1,
            chunk_size: 64 << 10,
            segment_size: 4 << 20,
            checkpoint_interval: 64 << 20,
        };
        let pool = Arc::new(Pool::create(drives, &cfg).unwrap());
        pool.create_volume_with("default", 16 << 20, Compression::Off)
            .unwrap();
        (pool, dir)
    }

    /// With members that are block devices (the kernel's counters present), every family
    /// has one name of its own: two families under one name (the engine's pool-wide
    /// `drive_writes` and the kernel's per drive once did) is a page `promtool check
    /// metrics` refuses ("second HELP line") and queries that get the other's series.
    #[test]
    fn block_device_members_add_no_second_family_of_a_name() {
        let (pool, dir) = file_pool("names");
        let mut m = Metrics::new(pool, Arc::new(Controls::default())).unwrap();
        m.block_stat = |_| Some([1, 2, 3, 4, 5, 6, 7]);
        let _counted = m.exports().get("").unwrap();
        let page = m.render().unwrap();
        for kind in ["# HELP ", "# TYPE "] {
            let mut seen = BTreeSet::new();
            for line in page.lines().filter_map(|l| l.strip_prefix(kind)) {
                let name = line.split(' ').next().unwrap();
                assert!(seen.insert(name), "a second {kind}line for {name}");
            }
        }
        for series in [
            r#"flashpool_drive_io_reads_total{drive="4"} 1"#,
            r#"flashpool_drive_io_writes_total{drive="4"} 4"#,
            r#"flashpool_drive_busy_time_seconds_total{drive="4"} 0.007"#,
            "flashpool_drive_writes_total ",
        ] {
            assert!(page.contains(series), "{series} missing: {page}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A counted volume of a file-drive pool keeps its read queue (the fast read path, as
    /// without metrics). Reads are counted once per NBD request when the NBD layer says it
    /// answered one (`read_answered`), whole, never by the export's read calls, which see
    /// only a request's data parts (the NBD tests check the layer's side; operations.rs the
    /// two together).
    #[test]
    fn counted_exports_keep_the_read_queue_and_count_answered_reads() {
        let (pool, dir) = file_pool("rq");
        let vol = pool.volume("default").unwrap();
        let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        vol.write(0, &data).unwrap();
        vol.flush().unwrap();
        let m = Metrics::new(pool.clone(), Arc::new(Controls::default())).unwrap();
        let ex = m.exports().get("").unwrap();
        let reads = |m: &Metrics| {
            let page = m.render().unwrap();
            let get = |name: &str| {
                let at = format!(r#"{name}{{op="read",volume="default"}} "#);
                page.lines()
                    .find_map(|l| l.strip_prefix(&at))
                    .map(|v| v.parse::<u64>().unwrap())
            };
            (
                get("flashpool_volume_requests_total"),
                get("flashpool_volume_bytes_total"),
                get("flashpool_volume_errors_total"),
            )
        };
        let mut buf = vec![0u8; 8192];
        ex.read(4096, &mut buf).unwrap();
        let mut two = [0u8; 4096];
        let (a, b) = two.split_at_mut(2048);
        assert!(ex
            .read_many(&mut [(0, a), (65536, b)])
            .iter()
            .all(Result::is_ok));
        if let Some(mut q) = ex.read_queue() {
            for i in 0..8u64 {
                q.start(i, i * 65536, 4096);
            }
            q.submit();
            let mut got = 0;
            while got < 8 {
                q.wait(None).unwrap();
                while q.take(&mut |t, r| {
                    let d = r.unwrap();
                    let at = (t * 65536) as usize;
                    assert_eq!((*d).as_ref(), &data[at..at + 4096]);
                    got += 1;
                }) {}
            }
        } else {
            // No io_uring here (or FLASHPOOL_IO_URING=off): no queue with or without metrics.
            assert!(PoolExports(pool.clone())
                .get("")
                .unwrap()
                .read_queue()
                .is_none());
        }
        assert_eq!(
            reads(&m),
            (Some(0), Some(0), Some(0)),
            "export reads uncounted"
        );
        let t = Instant::now();
        ex.read_answered(0, 3 << 16, t, true);
        ex.read_answered(1 << 20, 1 << 16, t, true);
        ex.read_answered(0, 4096, t, false);
        assert_eq!(reads(&m), (Some(3), Some(4 << 16), Some(1)));
        drop(ex);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_engine_counter_has_help() {
        let names: Vec<&str> = flashpool_engine::StatsSnapshot::default()
            .fields()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        for n in &names {
            assert!(
                ENGINE_COUNTERS.iter().any(|(c, _)| c == n),
                "engine counter {n} has no help text in ENGINE_COUNTERS"
            );
        }
    }
}
