//! Trace import: text in, requests out (the caller reads the file). One parser per format
//! ([`csv`], [`msr`], [`blkparse`], [`fio`]), [`detect`] to guess the format, and
//! [`resolve`] to turn byte requests into logical pages, with a clear error (or an explicit
//! wrap or scale) for requests past the end of the logical space.
//!
//! Every parser reports a bad line as `trace line N: what: "text"` and never panics.

pub mod blkparse;
pub mod csv;
pub mod fio;
pub mod msr;

use crate::workload::IoOp;

pub use blkparse::parse_blkparse;
pub use csv::parse_csv;
pub use fio::parse_fio;
pub use msr::parse_msr;

/// A parsed request in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawRequest {
    /// Arrival time in ns from any origin (0 for untimed traces).
    pub time_ns: u64,
    pub op: IoOp,
    pub offset: u64,
    pub length: u64,
    /// 1-based line of the trace file (for errors).
    pub line: u32,
}

/// A parsed trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub requests: Vec<RawRequest>,
    /// Whether requests carry arrival times (open-loop replay). Untimed traces (fio iolog
    /// v2) are replayed closed loop at the workload's `iodepth` x `numjobs`, as fio does.
    pub timed: bool,
}

/// A request resolved to logical pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRecord {
    pub time_ns: u64,
    pub op: IoOp,
    pub lpa: u32,
    pub pages: u32,
}

/// Trace file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    /// Our CSV: `timestamp_us,op,offset,length`.
    Csv,
    /// SNIA IOTTA MSR Cambridge CSV.
    Msr,
    /// blkparse default text output.
    Blkparse,
    /// fio iolog version 2 or 3.
    Fio,
}

impl TraceFormat {
    pub const ALL: [TraceFormat; 4] = [
        TraceFormat::Csv,
        TraceFormat::Msr,
        TraceFormat::Blkparse,
        TraceFormat::Fio,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TraceFormat::Csv => "csv",
            TraceFormat::Msr => "msr",
            TraceFormat::Blkparse => "blkparse",
            TraceFormat::Fio => "fio",
        }
    }

    /// Parses `text` in this format.
    pub fn parse(self, text: &str) -> Result<Trace, String> {
        let timed = |requests| Trace {
            requests,
            timed: true,
        };
        match self {
            TraceFormat::Csv => parse_csv(text).map(timed),
            TraceFormat::Msr => parse_msr(text).map(timed),
            TraceFormat::Blkparse => parse_blkparse(text).map(timed),
            TraceFormat::Fio => parse_fio(text),
        }
    }
}

/// Latest request time a trace may give, in ns from its own origin (about 570 years: MSR
/// Cambridge times count from 1601).
pub const MAX_TIME_NS: u64 = 18_000_000_000_000_000_000;

/// Longest time between a trace's first request and any other, in ns (2^62, about 146
/// years), so the simulated clock has room to finish the requests without overflowing.
pub const MAX_SPAN_NS: u64 = 1 << 62;

/// `text` without a leading UTF-8 byte order mark (some tools write one).
pub(crate) fn strip_bom(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

/// Guesses the format from the first meaningful line: a `fio version` header, a blkparse
/// event (`MAJ,MIN CPU SEQ TIME PID ACTION ...`), an MSR record (7 comma-separated fields,
/// the fourth `Read` or `Write`), else our CSV.
pub fn detect(text: &str) -> TraceFormat {
    for line in strip_bom(text).lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with("fio version") {
            return TraceFormat::Fio;
        }
        let ws: Vec<&str> = line.split_whitespace().collect();
        if ws.len() >= 6 && ws[0].contains(',') && !ws[0].ends_with(',') {
            return TraceFormat::Blkparse;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() == 7 && msr::parse_type(f[3]).is_some() {
            return TraceFormat::Msr;
        }
        return TraceFormat::Csv;
    }
    TraceFormat::Csv
}

/// What to do with a request that reaches past the end of the logical space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeMode {
    /// Reject the trace, naming the first such line (the default).
    Error,
    /// Take offsets modulo the logical capacity (a request that still crosses the end is
    /// cut there).
    Wrap,
    /// When the trace's highest end is past the capacity, scale every offset by capacity /
    /// that end, keeping lengths, so the trace's address pattern fits the device (a trace
    /// that fits is left where it is).
    Scale,
}

impl RangeMode {
    pub fn name(self) -> &'static str {
        match self {
            RangeMode::Error => "error",
            RangeMode::Wrap => "wrap",
            RangeMode::Scale => "scale",
        }
    }
}

/// Resolves byte requests to pages and makes times relative to the first request, sorted
/// (stable). Requests past the end of `logical_pages` follow `mode`; a request more than
/// [`MAX_SPAN_NS`] after the first is an error.
pub fn resolve(
    trace: &Trace,
    page_size: u32,
    logical_pages: u64,
    mode: RangeMode,
) -> Result<Vec<TraceRecord>, String> {
    let page = page_size.max(1) as u64;
    let capacity = logical_pages.saturating_mul(page);
    if logical_pages == 0 {
        return Err("the device has no logical pages".into());
    }
    let reqs = &trace.requests;
    let t0 = reqs.iter().map(|r| r.time_ns).min().unwrap_or(0);
    let max_end = reqs
        .iter()
        .map(|r| r.offset.saturating_add(r.length.max(1)))
        .max()
        .unwrap_or(0);
    let mut out = Vec::with_capacity(reqs.len());
    for r in reqs {
        let time_ns = r.time_ns - t0;
        if time_ns > MAX_SPAN_NS {
            return Err(format!(
                "trace line {}: timestamp is {:.0} s after the first request; at most {:.0} s \
                 (about 146 years) fit the simulated clock",
                r.line,
                time_ns as f64 / 1e9,
                MAX_SPAN_NS as f64 / 1e9
            ));
        }
        let len = r.length.max(1);
        let end = r.offset.saturating_add(len);
        let offset = match mode {
            RangeMode::Error => {
                if end > capacity {
                    return Err(format!(
                        "trace line {}: request at byte {} of {} bytes ends past the logical \
                         capacity of {capacity} bytes (use --range wrap or --range scale)",
                        r.line, r.offset, r.length
                    ));
                }
                r.offset
            }
            RangeMode::Wrap => r.offset % capacity,
            RangeMode::Scale if max_end > capacity => {
                // u128: offset * capacity can exceed u64.
                let s = r.offset as u128 * capacity as u128 / max_end as u128;
                (s as u64).min(capacity - 1)
            }
            RangeMode::Scale => r.offset,
        };
        let first = offset / page;
        let last = offset.saturating_add(len).div_ceil(page);
        let pages = (last - first).clamp(1, logical_pages - first);
        out.push(TraceRecord {
            time_ns,
            op: r.op,
            lpa: first as u32,
            pages: pages.min(u32::MAX as u64) as u32,
        });
    }
    out.sort_by_key(|r| r.time_ns);
    Ok(out)
}

/// The line loop the comma-separated formats share: a byte order mark, blank and `#` lines
/// skipped, a first line that `is_header` says is a header (given its trimmed fields)
/// skipped, every other line's trimmed fields handed to `row` with a maker of line-numbered
/// errors; zero-length requests are skipped (as every format does). Fails when no request
/// remains.
pub(crate) fn parse_comma_lines(
    text: &str,
    is_header: impl Fn(&[&str]) -> bool,
    mut row: impl FnMut(&[&str], &dyn Fn(&str) -> String) -> Result<(u64, IoOp, u64, u64), String>,
) -> Result<Vec<RawRequest>, String> {
    let mut out = Vec::new();
    let mut first = true;
    let mut empty = 0u64;
    for (i, line) in strip_bom(text).lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if std::mem::take(&mut first) && is_header(&f) {
            continue;
        }
        let bad = |what: &str| line_error(i + 1, what, line);
        let (time_ns, op, offset, length) = row(&f, &bad)?;
        if length == 0 {
            empty += 1;
            continue;
        }
        out.push(RawRequest {
            time_ns,
            op,
            offset,
            length,
            line: (i + 1) as u32,
        });
    }
    if out.is_empty() {
        return Err(format!("the trace has no requests{}", skipped_note(empty)));
    }
    Ok(out)
}

/// Whether the first line's `fields` look like a header: none is a number and the op field
/// at `op_at` is not an op `is_op` knows (so a corrupted first record is an error, not a
/// silently skipped "header").
pub(crate) fn looks_like_header(
    fields: &[&str],
    op_at: usize,
    is_op: impl Fn(&str) -> bool,
) -> bool {
    fields.iter().all(|f| f.parse::<f64>().is_err()) && !fields.get(op_at).is_some_and(|f| is_op(f))
}

/// " (N zero-length requests skipped)" when N > 0.
pub(crate) fn skipped_note(empty: u64) -> String {
    if empty == 0 {
        String::new()
    } else {
        format!(" ({empty} zero-length requests skipped)")
    }
}

/// The error for line `line` (1-based) of a trace.
pub(crate) fn line_error(line: usize, what: &str, text: &str) -> String {
    let shown: String = text.chars().take(120).collect();
    format!("trace line {line}: {what}: {shown:?}")
}

/// Parses a non-negative decimal number of `unit`s into ns (`ns_per_unit` = ns per unit, a
/// power of ten): "bad timestamp" for what is not a number (NaN, negative), "timestamp too
/// large" past [`MAX_TIME_NS`] (infinities too). Plain decimals (`1700000000123456.7`) are
/// read exactly, digit by digit, rounded to the nearest ns: through an f64 a large origin
/// (epoch microseconds) would lose the gaps between requests (1.1 us apart replayed as 1.024).
/// Other forms f64 takes (`1e3`) go through an f64.
pub(crate) fn parse_time(s: &str, ns_per_unit: u64) -> Result<u64, &'static str> {
    let s = s.trim();
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if !int.is_empty() && digits(int) && digits(frac) {
        let too_large = "timestamp too large";
        // Past MAX_TIME_NS long before u128 overflows: 40 digits is > 10^39 ns.
        if int.trim_start_matches('0').len() > 30 {
            return Err(too_large);
        }
        let mut ns: u128 = int.parse::<u128>().map_err(|_| too_large)? * ns_per_unit as u128;
        // The fraction's digits worth a whole ns and more, then the next one to round.
        let mut place = ns_per_unit as u128;
        let mut fb = frac.bytes();
        while place > 1 {
            place /= 10;
            ns += place * u128::from(fb.next().map_or(0, |b| b - b'0'));
        }
        if fb.next().is_some_and(|b| b >= b'5') {
            ns += 1;
        }
        return u64::try_from(ns)
            .ok()
            .filter(|&n| n <= MAX_TIME_NS)
            .ok_or(too_large);
    }
    let t: f64 = s.parse().map_err(|_| "bad timestamp")?;
    let ns = t * ns_per_unit as f64;
    if ns.is_nan() || ns < 0.0 {
        Err("bad timestamp")
    } else if ns > MAX_TIME_NS as f64 {
        Err("timestamp too large")
    } else {
        Ok(ns.round() as u64)
    }
}

#[cfg(test)]
mod tests;
