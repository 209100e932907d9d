//! SNIA IOTTA MSR Cambridge traces (the block I/O traces of Narayanan et al., "Write
//! off-loading", FAST 2008): CSV lines `Timestamp,Hostname,DiskNumber,Type,Offset,Size,
//! ResponseTime`, timestamp in Windows FILETIME ticks (100 ns), type `Read` or `Write`,
//! offset and size in bytes, response time in ticks (ignored: the simulator measures its
//! own). The files have no header; one is skipped if present, as are blank and `#` lines.

use super::{parse_comma_lines, RawRequest};
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
        |first| first.parse::<u64>().is_err(),
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
