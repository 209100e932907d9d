//! SNIA IOTTA MSR Cambridge traces (the block I/O traces of Narayanan et al., "Write
//! off-loading", FAST 2008): CSV lines `Timestamp,Hostname,DiskNumber,Type,Offset,Size,
//! ResponseTime`, timestamp in Windows FILETIME ticks (100 ns), type `Read` or `Write`,
//! offset and size in bytes, response time in ticks (ignored: the simulator measures its
//! own). The files have no header; one is skipped if present (a first line with no number
//! and no Read or Write type), as are blank and `#` lines and zero-length requests. Times
//! share the other formats' cap ([`super::MAX_TIME_NS`]).

use super::{looks_like_header, parse_comma_lines, RawRequest, MAX_TIME_NS};
use crate::workload::IoOp;

/// The `Type` field.
pub(crate) fn parse_type(s: &str) -> Option<IoOp> {
    match s.trim().to_ascii_lowercase().as_str() {
        "read" => Some(IoOp::Read),
        "write" => Some(IoOp::Write),
        _ => None,
    }
}

/// Parses an MSR Cambridge CSV trace.
pub fn parse_msr(text: &str) -> Result<Vec<RawRequest>, String> {
    parse_comma_lines(
        text,
        |f| looks_like_header(f, 3, |s| parse_type(s).is_some()),
        |f, bad| {
            if f.len() != 7 {
                return Err(bad(
                    "expected 7 fields Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime",
                ));
            }
            let ticks: u64 = f[0]
                .parse()
                .map_err(|_| bad("bad timestamp (Windows 100 ns ticks)"))?;
            let time_ns = ticks
                .checked_mul(100)
                .filter(|&t| t <= MAX_TIME_NS)
                .ok_or_else(|| bad("timestamp too large"))?;
            f[2].parse::<u32>().map_err(|_| bad("bad disk number"))?;
            let op = parse_type(f[3]).ok_or_else(|| bad("type must be Read or Write"))?;
            let offset: u64 = f[4].parse().map_err(|_| bad("bad offset"))?;
            let length: u64 = f[5].parse().map_err(|_| bad("bad size"))?;
            f[6].parse::<u64>().map_err(|_| bad("bad response time"))?;
            Ok((time_ns, op, offset, length))
        },
    )
}
