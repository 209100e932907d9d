//! Our own CSV trace format: one request per line, `timestamp_us,op,offset,length`;
//! timestamp in microseconds (decimals allowed) from any origin, op `R`/`W`/`T` (or
//! read/write/trim, `D` = discard), offset and length in bytes. Blank lines, `#` comments,
//! a header line (a first line with no number and no op, such as
//! `timestamp_us,op,offset,length`) and zero-length requests are skipped.

use super::{looks_like_header, parse_comma_lines, parse_time, RawRequest};
use crate::workload::IoOp;

/// The op of a CSV line.
pub(crate) fn parse_op(s: &str) -> Option<IoOp> {
    match s.trim().to_ascii_lowercase().as_str() {
        "r" | "read" => Some(IoOp::Read),
        "w" | "write" => Some(IoOp::Write),
        "t" | "trim" | "d" | "discard" => Some(IoOp::Trim),
        _ => None,
    }
}

/// Parses the CSV trace format.
pub fn parse_csv(text: &str) -> Result<Vec<RawRequest>, String> {
    parse_comma_lines(
        text,
        |f| looks_like_header(f, 1, |s| parse_op(s).is_some()),
        |f, bad| {
            if f.len() < 4 {
                return Err(bad("expected timestamp_us,op,offset,length"));
            }
            let time_ns = parse_time(f[0], 1_000).map_err(bad)?;
            let op = parse_op(f[1]).ok_or_else(|| bad("op must be R, W or T"))?;
            let offset: u64 = f[2].parse().map_err(|_| bad("bad offset"))?;
            let length: u64 = f[3].parse().map_err(|_| bad("bad length"))?;
            Ok((time_ns, op, offset, length))
        },
    )
}
