//! The multi-plane pairing rules (`any`, ONFI `page`, `page-block`), static write placement
//! and the cost of reading never-written pages, on one die of two planes with hand-made
//! traces whose pages land at known planes, blocks and offsets.

mod common;

use common::small;
use flashpool_sim::config::{Allocation, Multiplane, Precondition, SimConfig, UnmappedRead};
use flashpool_sim::timing::transfer_ns;
use flashpool_sim::trace::TraceRecord;
use flashpool_sim::workload::IoOp;
use flashpool_sim::{run_replay, Replay, Report};

/// One channel, one die, two planes of 32 blocks x 16 pages.
fn die(rule: Multiplane) -> SimConfig {
    let mut c = small(1, 1, 2);
    c.ftl.multiplane = rule;
    c
}

fn replay(c: &SimConfig, ios: &[(u64, IoOp, u32)]) -> Report {
    let records = ios
        .iter()
        .map(|&(t_us, op, lpa)| TraceRecord {
            time_ns: t_us * 1000,
            op,
            lpa,
            pages: 1,
        })
        .collect();
    let r = run_replay(
        c,
        Replay {
            records,
            timed: true,
        },
        &mut |_, _| {},
    )
    .unwrap();
    assert!(r.failed.is_none(), "{:?}", r.failed);
    assert_eq!(r.host_ios, ios.len() as u64);
    r
}

const RULES: [Multiplane; 3] = [Multiplane::Any, Multiplane::Page, Multiplane::PageBlock];

#[test]
fn reads_pair_by_the_rule() {
    // After a fill of one die of two planes, LPA 2j sits in plane 0 and 2j + 1 in plane 1,
    // both at page offset j % 16 of block j / 16 (in its plane).
    // (reads issued together, read operations expected under any / page / page-block)
    let cases: [(&[u32], [u64; 3]); 4] = [
        (&[0, 1], [1, 1, 1]),    // same offset, same block: pairs under every rule
        (&[0, 3], [1, 2, 2]),    // offsets 0 and 1
        (&[0, 33], [1, 1, 2]),   // offset 0 in block 0 and in block 1
        (&[0, 2, 1], [2, 2, 2]), // the rule looks past LPA 2 (same plane) to pair 0 with 1
    ];
    for (lpas, expect) in cases {
        for (rule, want) in RULES.into_iter().zip(expect) {
            let mut c = die(rule);
            c.workload.precondition = Precondition::Fill;
            let ios: Vec<_> = lpas.iter().map(|&l| (0, IoOp::Read, l)).collect();
            let r = replay(&c, &ios);
            assert_eq!(r.flash_ops.read_pages, lpas.len() as u64);
            assert_eq!(r.flash_ops.read_ops, want, "{rule:?} {lpas:?}");
        }
    }
    // Under `page` the third case's first operation carries 0 and 1 (not 0 alone).
    let mut c = die(Multiplane::Page);
    c.workload.precondition = Precondition::Fill;
    c.timing.cmd_overhead_us = 0.0;
    let r = replay(
        &c,
        &[(0, IoOp::Read, 0), (0, IoOp::Read, 2), (0, IoOp::Read, 1)],
    );
    let x = transfer_ns(4096, 400, 8) as f64 / 1000.0;
    // Reads 0 and 1: tR + both transfers; read 2 after them: 2 tR + 3 transfers.
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    assert!(
        close(r.read_latency_us.min, 25.0 + 2.0 * x),
        "{:?}",
        r.read_latency_us
    );
    assert!(
        close(r.read_latency_us.max, 2.0 * 25.0 + 3.0 * x),
        "{:?}",
        r.read_latency_us
    );
}

#[test]
fn static_placement_programs_pair_by_the_rule() {
    // static-cwp on one die: even LPAs go to plane 0, odd to plane 1.
    let run = |rule, ios: &[(u64, IoOp, u32)]| {
        let mut c = die(rule);
        c.ftl.allocation = Allocation::StaticCwp;
        replay(&c, ios).flash_ops
    };
    let w = IoOp::Write;
    for rule in RULES {
        // Two writes to plane 0 never pair; one per plane at offset 0 of block 0 always does.
        let f = run(rule, &[(0, w, 0), (0, w, 2)]);
        assert_eq!((f.program_ops, f.program_pages), (2, 2), "{rule:?}");
        let f = run(rule, &[(0, w, 0), (0, w, 1)]);
        assert_eq!((f.program_ops, f.program_pages), (1, 2), "{rule:?}");
        // After LPA 0, plane 0 writes at offset 1 and plane 1 at offset 0: only `any` pairs
        // the next two.
        let f = run(rule, &[(0, w, 0), (1000, w, 2), (1000, w, 1)]);
        let want = if rule == Multiplane::Any { 2 } else { 3 };
        assert_eq!(f.program_ops, want, "{rule:?}");
    }
}

#[test]
fn dynamic_placement_realigns_the_planes() {
    // Dynamic allocation sends a lone write to the plane whose write point is behind, so the
    // planes realign and later pairs of writes program together under the ONFI rule.
    let w = IoOp::Write;
    for rule in RULES {
        let c = die(rule);
        let r = replay(&c, &[(0, w, 0), (1000, w, 1), (1000, w, 2), (2000, w, 3)]);
        // LPA 0 alone; then 1 goes to the lagging plane alone under the ONFI rule (2 with
        // it under `any`, which does not care); then 3 alone.
        let f = r.flash_ops;
        assert_eq!(f.program_pages, 4);
        let want = if rule == Multiplane::Any { 3 } else { 4 };
        assert_eq!(f.program_ops, want, "{rule:?}");
        let r = replay(&c, &[(0, w, 0), (1000, w, 1), (2000, w, 2), (2000, w, 3)]);
        assert_eq!(r.flash_ops.program_ops, 3, "{rule:?}: realigned pair");
    }
}

#[test]
fn unmapped_reads_cost_a_flash_read_or_zero_fill() {
    let x = transfer_ns(4096, 400, 8) as f64 / 1000.0;
    let mut c = die(Multiplane::Page);
    assert_eq!(c.ftl.unmapped_read, UnmappedRead::Flash, "the default");
    let r = replay(&c, &[(0, IoOp::Read, 5)]);
    assert!((r.read_latency_us.max - (1.0 + 25.0 + x)).abs() < 1e-9);
    assert_eq!(r.host_pages_read, 1);
    c.ftl.unmapped_read = UnmappedRead::ZeroFill;
    let r = replay(&c, &[(0, IoOp::Read, 5)]);
    assert_eq!(r.read_latency_us.max, 1.0);
    assert_eq!(r.host_pages_read, 0);
}

/// Steady-state WAF stays near that of `any` under every rule. `page-block` (GC copies and
/// programs never pair, our FTL does not open blocks in plane pairs) fills the planes of a
/// die unevenly and pays some WAF (7.1 against 5.0 here); GC must visit the planes in turn:
/// always taking the first plane on a tie gave 9.4 here (28.8 on the documented device).
#[test]
fn steady_write_amplification_does_not_depend_much_on_the_rule() {
    let mut waf = Vec::new();
    for rule in RULES {
        let mut c = small(2, 2, 2);
        c.geometry.blocks_per_plane = 64;
        c.ftl.op_ratio = 0.1;
        c.ftl.multiplane = rule;
        c.workload.iodepth = 32;
        c.workload.ios = 30_000;
        c.workload.precondition = Precondition::Steady;
        let r = flashpool_sim::run(&c).unwrap();
        assert!(r.failed.is_none());
        waf.push(r.waf);
    }
    let (lo, hi) = waf
        .iter()
        .fold((f64::MAX, 0f64), |(a, b), &w| (a.min(w), b.max(w)));
    assert!(
        waf[1] < waf[0] * 1.1,
        "WAF by rule (any, page, page-block): {waf:?}"
    );
    assert!(
        hi < lo * 1.5,
        "WAF by rule (any, page, page-block): {waf:?}"
    );
}
