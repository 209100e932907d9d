//! The human-readable report: a compact table of throughput, latency percentiles, FTL
//! counters and wear, built as a `String` (the CLI prints it).

use crate::stats::{LatencySummary, Report};
use std::fmt::Write;

fn lat_row(out: &mut String, name: &str, l: &LatencySummary) {
    if l.count == 0 {
        return;
    }
    let _ = writeln!(
        out,
        "  {name:<6} {:>10} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
        l.count, l.mean, l.p50, l.p99, l.p999, l.max
    );
}

/// Formats `r` as a table.
pub fn human(r: &Report) -> String {
    let mut s = String::new();
    let d = &r.device;
    let _ = writeln!(
        s,
        "device: {} ch, {} dies, {} planes, {} pages x {} B ({:.2} GiB logical, OP {:.1} %), \
         {:.1} B/page of simulator memory",
        d.channels,
        d.dies,
        d.planes,
        d.physical_pages,
        d.page_size,
        d.logical_pages as f64 * d.page_size as f64 / (1u64 << 30) as f64,
        d.op_ratio * 100.0,
        d.memory_bytes_per_page
    );
    let p = &r.precondition;
    if p.mode != "none" {
        let _ = writeln!(
            s,
            "precondition: {} ({} pages written, {} rounds, steady {}, last-round WAF {:.2})",
            p.mode, p.host_pages_written, p.rounds, p.steady, p.waf_last_round
        );
    }
    let _ = writeln!(
        s,
        "measured: {} host I/Os in {:.6} s simulated: {:.0} IOPS ({:.0} read, {:.0} write), {:.1} MB/s",
        r.host_ios, r.sim_seconds, r.iops, r.read_iops, r.write_iops, r.mb_s
    );
    let _ = writeln!(
        s,
        "latency us   {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "count", "mean", "p50", "p99", "p99.9", "max"
    );
    lat_row(&mut s, "read", &r.read_latency_us);
    lat_row(&mut s, "write", &r.write_latency_us);
    lat_row(&mut s, "trim", &r.trim_latency_us);
    let _ = writeln!(
        s,
        "flash: host pages written {}, flash pages programmed {}, GC moved {}, WL moved {}, \
         erases {}, WAF {:.3}",
        r.host_pages_written,
        r.flash_pages_programmed,
        r.gc_pages_moved,
        r.wl_pages_moved,
        r.blocks_erased,
        r.waf
    );
    let e = &r.erase_count;
    let _ = writeln!(
        s,
        "wear: erase count min {} mean {:.1} max {}; bad blocks {} ({} grown in run); \
         suspensions program {} erase {}",
        e.min,
        e.mean,
        e.max,
        d.bad_blocks,
        r.grown_bad_blocks,
        r.suspensions.program,
        r.suspensions.erase
    );
    let o = &r.flash_ops;
    let per = |pages: u64, ops: u64| {
        if ops > 0 {
            pages as f64 / ops as f64
        } else {
            0.0
        }
    };
    let _ = writeln!(
        s,
        "planes per operation: reads {:.2} ({} ops), programs {:.2} ({} ops), GC copies {:.2} \
         ({} ops)",
        per(o.read_pages, o.read_ops),
        o.read_ops,
        per(o.program_pages, o.program_ops),
        o.program_ops,
        per(o.gc_copy_pages, o.gc_copy_ops),
        o.gc_copy_ops
    );
    let g = &r.gc;
    let _ = writeln!(
        s,
        "GC regime: {} (free blocks per plane: mean {:.1}, min {}, threshold {}; backlog {:.1} \
         blocks)",
        g.regime, g.free_blocks_mean, g.free_blocks_min, g.threshold_blocks, g.gc_backlog_mean
    );
    if let Some(f) = &r.failed {
        let _ = writeln!(s, "DEVICE FAILED: {f}");
    }
    s
}
