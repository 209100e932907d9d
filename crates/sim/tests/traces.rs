//! Trace import end to end with the fixtures in `tests/fixtures` (MSR Cambridge CSV, fio
//! iolog v2 and v3, blkparse text): format detection, parsing, the out-of-range rule and
//! replay on a small device.

mod common;

use common::small;
use flashpool_sim::trace::{self, RangeMode, TraceFormat};
use flashpool_sim::{run_replay, Replay};

fn fixture(name: &str) -> String {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/");
    std::fs::read_to_string(format!("{p}{name}")).unwrap()
}

#[test]
fn msr_fixture_parses_and_replays() {
    let text = fixture("msr_hm_0_sample.csv");
    assert_eq!(trace::detect(&text), TraceFormat::Msr);
    let t = TraceFormat::Msr.parse(&text).unwrap();
    assert_eq!(t.requests.len(), 3000);
    assert!(t.timed);
    let writes = t
        .requests
        .iter()
        .filter(|r| r.op == flashpool_sim::workload::IoOp::Write)
        .count();
    assert!(writes > 1500 && writes < 2500, "{writes}");
    // 256 MiB of addresses on a device of a few MiB: an error naming a line, unless
    // scaled or wrapped.
    let mut c = small(2, 2, 2);
    c.geometry.blocks_per_plane = 64;
    let logical = c.logical_pages();
    let e = trace::resolve(&t, 4096, logical, RangeMode::Error).unwrap_err();
    assert!(e.starts_with("trace line "), "{e}");
    for mode in [RangeMode::Scale, RangeMode::Wrap] {
        let recs = trace::resolve(&t, 4096, logical, mode).unwrap();
        assert_eq!(recs.len(), 3000);
        assert!(recs.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
        let r = run_replay(
            &c,
            Replay {
                records: recs,
                timed: true,
            },
            &mut |_, _| {},
        )
        .unwrap();
        assert_eq!(r.host_ios, 3000, "{mode:?}");
        assert_eq!(r.write_ios as usize, writes);
        assert!(r.failed.is_none(), "{:?}", r.failed);
        // The trace lasts about as long as its timestamps say (open loop).
        let span_s = (t.requests[2999].time_ns - t.requests[0].time_ns) as f64 / 1e9;
        assert!(r.sim_seconds >= span_s, "{} < {span_s}", r.sim_seconds);
    }
}

/// 2 x 2 dies of 64 blocks: 12.8 MiB logical, room for the 8 MiB fixtures.
fn device() -> flashpool_sim::SimConfig {
    let mut c = small(2, 2, 1);
    c.geometry.blocks_per_plane = 64;
    c
}

#[test]
fn fio_fixtures_replay_open_and_closed_loop() {
    let c = device();
    let v3 = TraceFormat::Fio
        .parse(&fixture("fio_v3_sample.log"))
        .unwrap();
    let v2 = TraceFormat::Fio
        .parse(&fixture("fio_v2_sample.log"))
        .unwrap();
    assert!(v3.timed && !v2.timed);
    assert_eq!(v3.requests.len(), 200);
    let same: Vec<_> = v3.requests.iter().map(|r| (r.op, r.offset)).collect();
    let same2: Vec<_> = v2.requests.iter().map(|r| (r.op, r.offset)).collect();
    assert_eq!(same, same2);
    let logical = c.logical_pages();
    let mut reports = Vec::new();
    for t in [&v3, &v2] {
        let recs = trace::resolve(t, 4096, logical, RangeMode::Error).unwrap();
        let r = run_replay(
            &c,
            Replay {
                records: recs,
                timed: t.timed,
            },
            &mut |_, _| {},
        )
        .unwrap();
        assert_eq!(r.host_ios, 200);
        reports.push(r);
    }
    // v3 spreads the I/Os over its timestamps; v2 runs them back to back at queue depth 1.
    let last_us = v3.requests.last().unwrap().time_ns as f64 / 1e3;
    assert!(reports[0].sim_seconds * 1e6 >= last_us - 20.0);
    assert_eq!(reports[0].host_pages_written, reports[1].host_pages_written);
}

#[test]
fn blkparse_fixture_uses_queue_events() {
    let text = fixture("blkparse_sample.txt");
    assert_eq!(trace::detect(&text), TraceFormat::Blkparse);
    let t = TraceFormat::Blkparse.parse(&text).unwrap();
    assert_eq!(t.requests.len(), 150, "one Q event per request");
    let c = device();
    let recs = trace::resolve(&t, 4096, c.logical_pages(), RangeMode::Error).unwrap();
    let r = run_replay(
        &c,
        Replay {
            records: recs,
            timed: true,
        },
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(r.host_ios, 150);
    assert!(r.trim_ios > 0);
}

/// A replay uses the device and only the workload keys that shape a replay: a config whose
/// `ios` is 0 with no time limit (meaningless for a generated job) replays a trace.
#[test]
fn replay_ignores_workload_keys_it_does_not_use() {
    let mut c = device();
    c.workload.ios = 0;
    c.workload.runtime_ms = 0.0;
    c.workload.precondition = flashpool_sim::config::Precondition::Fill;
    assert!(
        c.validate().is_err(),
        "a generated job needs ios or runtime_ms"
    );
    let t = TraceFormat::Csv.parse("0,W,0,4096\n5,R,0,4096\n").unwrap();
    let recs = trace::resolve(&t, 4096, c.logical_pages(), RangeMode::Error).unwrap();
    let r = run_replay(
        &c,
        Replay {
            records: recs,
            timed: true,
        },
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(r.host_ios, 2);
    // The device itself is still checked.
    c.ftl.op_ratio = 2.0;
    let recs = trace::resolve(&t, 4096, 100, RangeMode::Error).unwrap();
    let e = run_replay(
        &c,
        Replay {
            records: recs,
            timed: true,
        },
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("ftl.op_ratio"), "{e}");
}
