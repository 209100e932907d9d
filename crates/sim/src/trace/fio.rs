//! fio iolog traces (`write_iolog` / `read_iolog`), versions 2 and 3.
//!
//! Version 2 (`fio version 2 iolog`): `filename action [offset length]`; it carries no
//! times, so the trace is replayed closed loop (as fio replays it, at the job's queue
//! depth). Version 3 (`fio version 3 iolog`): `timestamp filename action [offset length]`,
//! the timestamp in microseconds from the start of the run, replayed open loop. Actions
//! `read`, `write`, `trim` are replayed; `add`, `open`, `close`, `sync`, `datasync` and
//! `wait` are accepted and skipped, as are zero-length requests. Several files in one log
//! share the device's space.

use super::{line_error, parse_time, skipped_note, strip_bom, RawRequest, Trace};
use crate::workload::IoOp;

/// Parses a fio iolog (v2 or v3).
pub fn parse_fio(text: &str) -> Result<Trace, String> {
    let mut lines = strip_bom(text).lines().enumerate();
    let version = loop {
        match lines.next() {
            None => return Err("empty fio iolog".into()),
            Some((_, l)) if l.trim().is_empty() => continue,
            Some((i, l)) => match l.trim() {
                "fio version 2 iolog" => break 2,
                "fio version 3 iolog" => break 3,
                other => {
                    return Err(line_error(
                        i + 1,
                        "expected \"fio version 2 iolog\" or \"fio version 3 iolog\"",
                        other,
                    ))
                }
            },
        }
    };
    let mut out = Vec::new();
    let mut empty = 0u64;
    for (i, line) in lines {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let bad = |what: &str| line_error(i + 1, what, line);
        let f: Vec<&str> = line.split_whitespace().collect();
        let (time_ns, rest) = if version == 3 {
            let t = parse_time(f[0], 1_000).map_err(|e| bad(&format!("{e} (us)")))?;
            (t, &f[1..])
        } else {
            (0, &f[..])
        };
        if rest.len() < 2 {
            return Err(bad("expected filename and action"));
        }
        let op = match rest[1] {
            "read" => IoOp::Read,
            "write" => IoOp::Write,
            "trim" => IoOp::Trim,
            "add" | "open" | "close" | "sync" | "datasync" | "wait" => continue,
            _ => return Err(bad("unknown action")),
        };
        if rest.len() != 4 {
            return Err(bad("expected offset and length after the action"));
        }
        let offset: u64 = rest[2].parse().map_err(|_| bad("bad offset"))?;
        let length: u64 = rest[3].parse().map_err(|_| bad("bad length"))?;
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
        return Err(format!(
            "the fio iolog has no read, write or trim{}",
            skipped_note(empty)
        ));
    }
    Ok(Trace {
        requests: out,
        timed: version == 3,
    })
}
