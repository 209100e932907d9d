//! blkparse's default text output
//! (`8,0  3  1  0.000000000  697  Q  WS 3417048 + 8 [proc]`): queue (`Q`) events are used,
//! or issue (`D`) events if the trace has no `Q`. RWBS `R` = read, `W` = write,
//! `D` = discard; sectors are 512 bytes. Lines that are not events (per-CPU summaries,
//! headers) and zero-length requests are skipped; an event line with a sector range whose
//! numbers do not parse is an error.

use super::{line_error, parse_time, skipped_note, strip_bom, RawRequest};
use crate::workload::IoOp;

/// Parses blkparse default text output.
pub fn parse_blkparse(text: &str) -> Result<Vec<RawRequest>, String> {
    let mut q = Vec::new();
    let mut d = Vec::new();
    let mut empty = 0u64;
    for (i, line) in strip_bom(text).lines().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // dev cpu seq time pid action rwbs sector + count
        if f.len() < 10 || f[8] != "+" || !f[0].contains(',') {
            continue;
        }
        if f[5] != "Q" && f[5] != "D" {
            continue;
        }
        let bad = |what: &str| line_error(i + 1, what, line.trim());
        let time_ns = parse_time(f[3], 1_000_000_000).map_err(bad)?;
        let sector: u64 = f[7].parse().map_err(|_| bad("bad sector"))?;
        let count: u64 = f[9].parse().map_err(|_| bad("bad sector count"))?;
        let rwbs = f[6];
        let op = if rwbs.contains('D') {
            IoOp::Trim
        } else if rwbs.contains('W') {
            IoOp::Write
        } else if rwbs.contains('R') {
            IoOp::Read
        } else {
            continue; // flushes and other non-data requests
        };
        if count == 0 {
            empty += 1;
            continue;
        }
        let offset = sector
            .checked_mul(512)
            .ok_or_else(|| bad("sector too large"))?;
        let r = RawRequest {
            time_ns,
            op,
            offset,
            length: count.saturating_mul(512),
            line: (i + 1) as u32,
        };
        if f[5] == "Q" {
            q.push(r)
        } else {
            d.push(r)
        }
    }
    let out = if q.is_empty() { d } else { q };
    if out.is_empty() {
        return Err(format!(
            "no blkparse Q or D events with a sector range found{}",
            skipped_note(empty)
        ));
    }
    Ok(out)
}
