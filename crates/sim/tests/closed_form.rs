//! Closed-form checks: exact single-die latencies, read IOPS saturation and sequential
//! overwrite write amplification, against values computed from the timing parameters.

mod common;

use common::small;
use flashpool_sim::config::{Precondition, Rw};
use flashpool_sim::timing::transfer_ns;

#[test]
fn single_die_qd1_read_latency_is_tr_plus_transfer_plus_overhead() {
    let mut c = small(1, 1, 1);
    c.workload.rw = Rw::Randread;
    c.workload.precondition = Precondition::Fill;
    let r = flashpool_sim::run(&c).unwrap();
    let t = &c.timing;
    let expect_ns = (t.read_us * 1000.0) as u64
        + transfer_ns(4096, t.channel_mt_s, t.bus_width_bits)
        + (t.cmd_overhead_us * 1000.0) as u64;
    let l = r.read_latency_us;
    assert_eq!(l.count, 1000);
    assert_eq!(l.max, expect_ns as f64 / 1000.0);
    assert!((l.mean - expect_ns as f64 / 1000.0).abs() < 1e-9, "{l:?}");
    assert!((l.p50 - expect_ns as f64 / 1000.0).abs() / l.mean < 0.001);
    assert!((r.sim_seconds - 1000.0 * expect_ns as f64 / 1e9).abs() < 1e-12);
}

#[test]
fn single_die_qd1_write_latency_is_tprog_plus_transfer_plus_overhead() {
    let mut c = small(1, 1, 1);
    c.workload.ios = 200; // below the GC threshold: no GC interferes
    let r = flashpool_sim::run(&c).unwrap();
    let t = &c.timing;
    let expect_ns = (t.program_us * 1000.0) as u64
        + transfer_ns(4096, t.channel_mt_s, t.bus_width_bits)
        + (t.cmd_overhead_us * 1000.0) as u64;
    let l = r.write_latency_us;
    assert_eq!(l.count, 200);
    assert_eq!(r.blocks_erased, 0);
    assert_eq!(l.max, expect_ns as f64 / 1000.0);
    assert!((l.mean - expect_ns as f64 / 1000.0).abs() < 1e-9, "{l:?}");
}

#[test]
fn page_type_latencies_apply() {
    let mut c = small(1, 1, 1);
    c.timing.read_us_by_type = vec![40.0, 65.0];
    c.timing.cmd_overhead_us = 0.0;
    c.ftl.op_ratio = 0.25; // 384 logical pages: an even count, so LSB and MSB alternate
    c.workload.ios = 768;
    c.workload.rw = Rw::Read; // sequential: LSB and MSB pages alternate
    c.workload.precondition = Precondition::Fill;
    let r = flashpool_sim::run(&c).unwrap();
    let x = transfer_ns(4096, 400, 8) as f64 / 1000.0;
    let l = r.read_latency_us;
    assert!((l.mean - (52.5 + x)).abs() < 1e-6, "{l:?}");
    assert_eq!(l.max, 65.0 + x);
}

#[test]
fn random_read_iops_saturate_at_dies_over_die_time() {
    // One die per channel: the bus is not the bottleneck.
    // A closed loop of N requests over K dies keeps each die busy about N / (N + K - 1) of
    // the time, so use a deep queue: 4096 over 8 dies is 99.8 %.
    let mut c = small(8, 1, 1);
    c.workload.rw = Rw::Randread;
    c.workload.precondition = Precondition::Fill;
    c.workload.iodepth = 4096;
    c.workload.ios = 400_000;
    let r = flashpool_sim::run(&c).unwrap();
    let t = &c.timing;
    let die_ns = t.read_us * 1000.0 + t.cmd_overhead_us * 1000.0 + transfer_ns(4096, 400, 8) as f64;
    let expect = 8.0 * 1e9 / die_ns;
    let err = (r.iops - expect).abs() / expect;
    assert!(err < 0.01, "iops {} expected {expect} ({err})", r.iops);
}

#[test]
fn random_read_iops_saturate_at_bus_rate_when_bus_bound() {
    // Eight dies on one channel: the bus is the bottleneck (8 x 10.24 us > 36.24 us).
    let mut c = small(1, 8, 1);
    c.workload.rw = Rw::Randread;
    c.workload.precondition = Precondition::Fill;
    c.workload.iodepth = 128;
    c.workload.ios = 40_000;
    let r = flashpool_sim::run(&c).unwrap();
    let expect = 1e9 / transfer_ns(4096, 400, 8) as f64;
    let err = (r.iops - expect).abs() / expect;
    assert!(err < 0.01, "iops {} expected {expect}", r.iops);
}

#[test]
fn sequential_overwrite_has_waf_one() {
    for (ch, dies, planes, qd) in [(1, 1, 1, 1), (2, 2, 2, 8), (4, 2, 1, 32)] {
        let mut c = small(ch, dies, planes);
        c.workload.rw = Rw::Write;
        c.workload.precondition = Precondition::Fill;
        c.workload.iodepth = qd;
        c.workload.ios = c.logical_pages() * 3;
        let r = flashpool_sim::run(&c).unwrap();
        assert!(r.failed.is_none());
        assert!(r.blocks_erased > 0);
        assert_eq!(r.gc_pages_moved, 0, "{ch}x{dies}x{planes} qd {qd}");
        assert_eq!(r.waf, 1.0);
    }
}

#[test]
fn multi_plane_program_halves_write_time() {
    // Two planes, queue depth 2: both pages program in one tPROG.
    let mut c = small(1, 1, 2);
    c.timing.cmd_overhead_us = 0.0;
    c.workload.iodepth = 2;
    c.workload.ios = 200;
    let r = flashpool_sim::run(&c).unwrap();
    let x = transfer_ns(4096, 400, 8) as f64;
    // Each pair: 2 transfers + one tPROG.
    let pair_ns = 2.0 * x + 200_000.0;
    let expect_iops = 2.0 * 1e9 / pair_ns;
    assert!(
        (r.iops - expect_iops).abs() / expect_iops < 0.02,
        "{} vs {expect_iops}",
        r.iops
    );
}
