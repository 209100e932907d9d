//! Trace parsers (text in, records out; the caller reads the file).
//!
//! CSV: one request per line, `timestamp_us,op,offset,length`; timestamp in microseconds
//! (decimals allowed) from any origin, op `R`/`W`/`T` (or read/write/trim, `D` = discard),
//! offset and length in bytes. Blank lines, `#` comments and a header line are skipped.
//!
//! blkparse: the default text output of `blkparse`
//! (`8,0  3  1  0.000000000  697  Q  WS 3417048 + 8 [proc]`); queue (`Q`) events are used,
//! or issue (`D`) events if the trace has no `Q`. RWBS `R` = read, `W` = write,
//! `D` = discard; sectors are 512 bytes.

use crate::workload::IoOp;

/// A parsed request in bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RawRequest {
    pub time_ns: u64,
    pub op: IoOp,
    pub offset: u64,
    pub length: u64,
}

/// A request resolved to logical pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRecord {
    pub time_ns: u64,
    pub op: IoOp,
    pub lpa: u32,
    pub pages: u32,
}

fn parse_op(s: &str) -> Option<IoOp> {
    match s.trim().to_ascii_lowercase().as_str() {
        "r" | "read" => Some(IoOp::Read),
        "w" | "write" => Some(IoOp::Write),
        "t" | "trim" | "d" | "discard" => Some(IoOp::Trim),
        _ => None,
    }
}

/// Parses the CSV trace format.
pub fn parse_csv(text: &str) -> Result<Vec<RawRequest>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if out.is_empty() && f.first().is_some_and(|x| x.parse::<f64>().is_err()) {
            continue; // header
        }
        let bad = |what: &str| format!("trace line {}: {what}: {line:?}", i + 1);
        if f.len() < 4 {
            return Err(bad("expected timestamp_us,op,offset,length"));
        }
        let t: f64 = f[0].parse().map_err(|_| bad("bad timestamp"))?;
        if t.is_nan() || t < 0.0 {
            return Err(bad("negative timestamp"));
        }
        let op = parse_op(f[1]).ok_or_else(|| bad("op must be R, W or T"))?;
        let offset: u64 = f[2].parse().map_err(|_| bad("bad offset"))?;
        let length: u64 = f[3].parse().map_err(|_| bad("bad length"))?;
        out.push(RawRequest {
            time_ns: (t * 1000.0).round() as u64,
            op,
            offset,
            length,
        });
    }
    Ok(out)
}

/// Parses blkparse default text output.
pub fn parse_blkparse(text: &str) -> Result<Vec<RawRequest>, String> {
    let mut q = Vec::new();
    let mut d = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // dev cpu seq time pid action rwbs sector + count
        if f.len() < 10 || f[8] != "+" || !f[0].contains(',') {
            continue;
        }
        let Ok(t) = f[3].parse::<f64>() else { continue };
        let (Ok(sector), Ok(count)) = (f[7].parse::<u64>(), f[9].parse::<u64>()) else {
            continue;
        };
        let rwbs = f[6];
        let op = if rwbs.contains('D') {
            IoOp::Trim
        } else if rwbs.contains('W') {
            IoOp::Write
        } else if rwbs.contains('R') {
            IoOp::Read
        } else {
            continue;
        };
        if count == 0 {
            continue;
        }
        let r = RawRequest {
            time_ns: (t * 1e9).round() as u64,
            op,
            offset: sector * 512,
            length: count * 512,
        };
        match f[5] {
            "Q" => q.push(r),
            "D" => d.push(r),
            _ => {}
        }
    }
    let out = if q.is_empty() { d } else { q };
    if out.is_empty() {
        return Err("no blkparse Q or D events with a sector range found".into());
    }
    Ok(out)
}

/// Resolves byte requests to pages; offsets beyond the logical capacity wrap around it.
/// Times are made relative to the first request and sorted (stable).
pub fn resolve(reqs: &[RawRequest], page_size: u32, logical_pages: u64) -> Vec<TraceRecord> {
    let page = page_size as u64;
    let t0 = reqs.iter().map(|r| r.time_ns).min().unwrap_or(0);
    let mut out: Vec<TraceRecord> = reqs
        .iter()
        .map(|r| {
            let first = r.offset / page;
            let last = (r.offset + r.length.max(1)).div_ceil(page);
            let lpa = first % logical_pages;
            let pages = (last - first).clamp(1, logical_pages - lpa) as u32;
            TraceRecord {
                time_ns: r.time_ns - t0,
                op: r.op,
                lpa: lpa as u32,
                pages,
            }
        })
        .collect();
    out.sort_by_key(|r| r.time_ns);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_parses() {
        let t = "timestamp_us,op,offset,length\n# c\n0,R,0,4096\n10.5,W,8192,8192\n20,T,0,4096\n";
        let r = parse_csv(t).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r[1].time_ns, 10_500);
        assert_eq!(r[1].op, IoOp::Write);
        let rec = resolve(&r, 4096, 100);
        assert_eq!(rec[1].lpa, 2);
        assert_eq!(rec[1].pages, 2);
        assert!(parse_csv("0,X,0,1\n").is_err());
    }

    #[test]
    fn blkparse_parses() {
        let t = "  8,0    3        1     0.000000000   697  Q  WS 3417048 + 8 [kworker]\n\
                 8,0    3        2     0.000001000   697  G  WS 3417048 + 8 [kworker]\n\
                 8,0    1        3     0.001000000   697  Q   R 16 + 16 [fio]\n\
                 CPU0 (8,0):\n";
        let r = parse_blkparse(t).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].op, IoOp::Write);
        assert_eq!(r[1].offset, 16 * 512);
        assert_eq!(r[1].length, 8192);
        assert_eq!(r[1].time_ns, 1_000_000);
    }
}
