//! Unit tests of the trace parsers and [`resolve`](super::resolve), and a seeded fuzz test:
//! mutated and random lines give an error naming the line, never a panic.

use super::*;
use crate::rng::SimRng;

#[test]
fn csv_parses() {
    let t = "timestamp_us,op,offset,length\n# c\n0,R,0,4096\n10.5,W,8192,8192\n20,T,0,4096\n";
    let r = parse_csv(t).unwrap();
    assert_eq!(r.len(), 3);
    assert_eq!(r[1].time_ns, 10_500);
    assert_eq!(r[1].op, IoOp::Write);
    assert_eq!(r[1].line, 4);
    let tr = Trace {
        requests: r,
        timed: true,
    };
    let rec = resolve(&tr, 4096, 100, RangeMode::Error).unwrap();
    assert_eq!(rec[1].lpa, 2);
    assert_eq!(rec[1].pages, 2);
    let e = parse_csv("0,X,0,1\n").unwrap_err();
    assert!(e.contains("line 1"), "{e}");
}

#[test]
fn msr_parses_ticks_and_types() {
    let t = "128166372003061629,hm,1,Read,7014609920,24576,41286\n\
             128166372003071629,hm,1,Write,4096,4096,100\n";
    let r = parse_msr(t).unwrap();
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].op, IoOp::Read);
    assert_eq!(
        r[1].time_ns - r[0].time_ns,
        1_000_000,
        "10000 ticks of 100 ns"
    );
    assert_eq!((r[0].offset, r[0].length), (7014609920, 24576));
    assert_eq!(detect(t), TraceFormat::Msr);
    let e = parse_msr("128166372003061629,hm,1,Flush,0,4096,1\n").unwrap_err();
    assert!(e.contains("line 1") && e.contains("Read or Write"), "{e}");
    // Our CSV parser names the problem on an MSR file instead of guessing.
    assert!(parse_csv(t).unwrap_err().contains("line 1"));
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
    assert_eq!(r[1].line, 3);
    assert_eq!(detect(t), TraceFormat::Blkparse);
    let e = parse_blkparse("8,0 3 1 0.1 697 Q W 12x + 8 [a]\n").unwrap_err();
    assert!(e.contains("line 1") && e.contains("sector"), "{e}");
}

#[test]
fn fio_v2_and_v3_parse() {
    let v3 = "fio version 3 iolog\n0 /dev/sda add\n1 /dev/sda open\n\
              100 /dev/sda write 0 4096\n250 /dev/sda read 4096 8192\n\
              300 /dev/sda trim 0 4096\n400 /dev/sda close\n";
    let t = parse_fio(v3).unwrap();
    assert!(t.timed);
    assert_eq!(t.requests.len(), 3);
    assert_eq!(t.requests[1].time_ns, 250_000);
    assert_eq!(t.requests[1].op, IoOp::Read);
    assert_eq!(t.requests[2].op, IoOp::Trim);
    assert_eq!(t.requests[0].line, 4);
    assert_eq!(detect(v3), TraceFormat::Fio);
    let v2 = "fio version 2 iolog\n/dev/sda add\n/dev/sda open\n/dev/sda write 0 4096\n\
              /dev/sda read 4096 4096\n/dev/sda close\n";
    let t = parse_fio(v2).unwrap();
    assert!(!t.timed);
    assert_eq!(t.requests.len(), 2);
    let e = parse_fio("fio version 3 iolog\n5 /dev/sda write zero 4096\n").unwrap_err();
    assert!(e.contains("line 2") && e.contains("offset"), "{e}");
    let e = parse_fio("fio version 9 iolog\n").unwrap_err();
    assert!(e.contains("line 1"), "{e}");
}

#[test]
fn out_of_range_is_an_error_or_wraps_or_scales() {
    let mk = |offset, length| Trace {
        requests: vec![
            RawRequest {
                time_ns: 0,
                op: IoOp::Write,
                offset: 0,
                length: 4096,
                line: 1,
            },
            RawRequest {
                time_ns: 5,
                op: IoOp::Read,
                offset,
                length,
                line: 7,
            },
        ],
        timed: true,
    };
    // 10 pages of 4 KiB = 40960 bytes; the last page is fine, one byte past is not.
    assert!(resolve(&mk(36864, 4096), 4096, 10, RangeMode::Error).is_ok());
    let e = resolve(&mk(36864, 4097), 4096, 10, RangeMode::Error).unwrap_err();
    assert!(e.contains("line 7") && e.contains("capacity"), "{e}");
    let w = resolve(&mk(40960 + 8192, 4096), 4096, 10, RangeMode::Wrap).unwrap();
    assert_eq!((w[1].lpa, w[1].pages), (2, 1));
    // Scale: the highest end (81920) maps onto the capacity (40960): offsets halve.
    let s = resolve(&mk(77824, 4096), 4096, 10, RangeMode::Scale).unwrap();
    assert_eq!((s[1].lpa, s[1].pages), (9, 1));
    assert_eq!(s[0].lpa, 0);
    // Every record lies inside the device whatever the mode.
    for mode in [RangeMode::Wrap, RangeMode::Scale] {
        for off in [0u64, 4095, 40959, 40960, 1 << 40, u64::MAX - 10] {
            for r in resolve(&mk(off, 1 << 20), 4096, 10, mode).unwrap() {
                assert!(r.lpa as u64 + r.pages as u64 <= 10, "{mode:?} {off}: {r:?}");
            }
        }
    }
}

/// A line made of random pieces that look like trace fields, or random bytes.
fn random_line(rng: &mut SimRng) -> String {
    const PIECES: &[&str] = &[
        "0",
        "1",
        "12.5",
        "-3",
        "1e400",
        "NaN",
        "inf",
        "18446744073709551615",
        "184467440737095516150",
        "R",
        "W",
        "T",
        "Read",
        "Write",
        "read",
        "write",
        "trim",
        "add",
        "open",
        "close",
        "wait",
        "hm",
        "/dev/sda",
        "Q",
        "D",
        "C",
        "WS",
        "RA",
        "+",
        "8,0",
        ",",
        " ",
        "  ",
        "\t",
        "#",
        "fio",
        "version",
        "iolog",
        "",
        "\u{e9}",
        "0x10",
    ];
    let n = rng.below(12) as usize;
    let mut s = String::new();
    for _ in 0..n {
        if rng.below(10) == 0 {
            s.push(char::from_u32(rng.below(0x800) as u32).unwrap_or('?'));
        } else {
            s.push_str(PIECES[rng.below(PIECES.len() as u64) as usize]);
            if rng.below(2) == 0 {
                s.push(if rng.below(2) == 0 { ',' } else { ' ' });
            }
        }
    }
    s
}

/// Mutates one character or field of a valid line.
fn mutate(line: &str, rng: &mut SimRng) -> String {
    let mut c: Vec<char> = line.chars().collect();
    if c.is_empty() {
        return "x".into();
    }
    let i = rng.below(c.len() as u64) as usize;
    match rng.below(3) {
        0 => c[i] = ['x', '-', ',', ' ', '9', '.'][rng.below(6) as usize],
        1 => {
            c.remove(i);
        }
        _ => c.insert(i, ['9', ',', 'e', ' '][rng.below(4) as usize]),
    }
    c.into_iter().collect()
}

#[test]
fn parsers_never_panic_and_name_the_line() {
    let seed = std::env::var("FLASHPOOL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x7ace_u64);
    let valid: [(TraceFormat, &str, &str); 5] = [
        (
            TraceFormat::Csv,
            "timestamp_us,op,offset,length",
            "10.5,W,8192,8192",
        ),
        (
            TraceFormat::Msr,
            "",
            "128166372003061629,hm,1,Read,7014609920,24576,41286",
        ),
        (
            TraceFormat::Blkparse,
            "",
            "8,0 3 1 0.000001000 697 Q WS 3417048 + 8 [kw]",
        ),
        (
            TraceFormat::Fio,
            "fio version 3 iolog",
            "100 /dev/sda write 0 4096",
        ),
        (
            TraceFormat::Fio,
            "fio version 2 iolog",
            "/dev/sda read 4096 4096",
        ),
    ];
    let mut rng = SimRng::new(seed, 0x7ace);
    for round in 0..3000 {
        let (fmt, header, good) = valid[round % valid.len()];
        let n = 1 + rng.below(6) as usize;
        let mut lines: Vec<String> = Vec::new();
        if !header.is_empty() {
            lines.push(header.to_string());
        }
        let bad_at = rng.below(n as u64) as usize;
        for k in 0..n {
            lines.push(if k != bad_at {
                good.to_string()
            } else if rng.below(2) == 0 {
                mutate(good, &mut rng)
            } else {
                random_line(&mut rng)
            });
        }
        let text = lines.join("\n");
        let res = std::panic::catch_unwind(|| fmt.parse(&text));
        let Ok(res) = res else {
            panic!(
                "seed {seed} round {round}: {} parser panicked on {text:?}",
                fmt.name()
            );
        };
        match res {
            Ok(t) => {
                // Whatever parsed must resolve (wrapped) without panicking.
                let r = std::panic::catch_unwind(|| resolve(&t, 4096, 1000, RangeMode::Wrap));
                assert!(
                    r.is_ok(),
                    "seed {seed} round {round}: resolve panicked on {text:?}"
                );
            }
            Err(e) => {
                let names_line = e.starts_with("trace line ")
                    || e.contains("no requests")
                    || e.contains("no read, write or trim")
                    || e.contains("no blkparse")
                    || e.contains("empty fio iolog");
                assert!(names_line, "seed {seed} round {round}: {e:?} for {text:?}");
                if let Some(rest) = e.strip_prefix("trace line ") {
                    let n: usize = rest
                        .split(':')
                        .next()
                        .and_then(|x| x.parse().ok())
                        .unwrap_or(0);
                    assert!(
                        n >= 1 && n <= lines.len(),
                        "seed {seed} round {round}: line {n} of {}: {e}",
                        lines.len()
                    );
                }
            }
        }
    }
}

/// MSR timestamps get the cap of the other formats' times: a tick count near u64::MAX / 100
/// would otherwise wrap the simulated clock.
#[test]
fn msr_timestamps_share_the_time_cap() {
    let t = "0,h,0,Write,0,4096,0\n184467440737095516,h,0,Write,4096,4096,0\n";
    let e = parse_msr(t).unwrap_err();
    assert!(
        e.contains("line 2") && e.contains("timestamp too large"),
        "{e}"
    );
    // Real MSR times (FILETIME ticks since 1601) still parse.
    assert!(parse_msr("128166372003061629,hm,1,Read,0,4096,1\n").is_ok());
    // The backstop: times whose spread the engine's clock cannot hold are refused by resolve.
    let raw = |time_ns| RawRequest {
        time_ns,
        op: IoOp::Write,
        offset: 0,
        length: 4096,
        line: 1,
    };
    let tr = Trace {
        requests: vec![raw(0), raw(17_000_000_000_000_000_000)],
        timed: true,
    };
    let e = resolve(&tr, 4096, 100, RangeMode::Error).unwrap_err();
    assert!(e.contains("trace line 1") && e.contains("timestamp"), "{e}");
}

/// A first line is skipped as a header only when it looks like one: a corrupted first
/// record is an error naming line 1, and a UTF-8 byte order mark is not part of the data.
#[test]
fn only_a_real_header_is_skipped() {
    let e = parse_csv("12us,W,0,4096\n20,W,4096,4096\n").unwrap_err();
    assert!(
        e.starts_with("trace line 1") && e.contains("timestamp"),
        "{e}"
    );
    let e = parse_msr("1.5,h,0,Write,0,4096,0\n2,h,0,Write,0,4096,0\n").unwrap_err();
    assert!(
        e.starts_with("trace line 1") && e.contains("timestamp"),
        "{e}"
    );
    let bom = "\u{feff}0,W,0,4096\n5,R,0,4096\n";
    assert_eq!(parse_csv(bom).unwrap().len(), 2);
    assert_eq!(detect(bom), TraceFormat::Csv);
    let bom_hdr = "\u{feff}timestamp_us,op,offset,length\n0,W,0,4096\n";
    assert_eq!(parse_csv(bom_hdr).unwrap().len(), 1);
    let msr = "\u{feff}128166372003061629,hm,1,Read,0,4096,1\n";
    assert_eq!(detect(msr), TraceFormat::Msr);
    assert_eq!(parse_msr(msr).unwrap().len(), 1);
    assert_eq!(
        parse_fio("\u{feff}fio version 2 iolog\n/dev/sda write 0 4096\n")
            .unwrap()
            .requests
            .len(),
        1
    );
    // Real headers are still skipped.
    let msr_hdr = "Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime\n\
                   128166372003061629,hm,1,Read,0,4096,1\n";
    assert_eq!(parse_msr(msr_hdr).unwrap().len(), 1);
    assert_eq!(
        parse_csv("time,type,offset,size\n0,W,0,4096\n")
            .unwrap()
            .len(),
        1
    );
}

/// Zero-length requests are skipped by every parser (blkparse always did), so the same
/// requests replay the same way whatever the format.
#[test]
fn zero_length_requests_are_skipped_by_every_parser() {
    let csv = parse_csv("0,W,0,0\n1,W,0,4096\n").unwrap();
    assert_eq!(csv.len(), 1);
    assert_eq!(csv[0].line, 2);
    let msr =
        parse_msr("128166372003061629,hm,1,Write,0,0,1\n128166372003061630,hm,1,Write,0,4096,1\n")
            .unwrap();
    assert_eq!(msr.len(), 1);
    let fio =
        parse_fio("fio version 3 iolog\n0 /dev/sda write 0 0\n5 /dev/sda write 0 4096\n").unwrap();
    assert_eq!(fio.requests.len(), 1);
    let blk = parse_blkparse("8,0 0 1 0.0 1 Q W 0 + 0 [a]\n8,0 0 2 0.1 1 Q W 0 + 8 [a]\n").unwrap();
    assert_eq!(blk.len(), 1);
    // A trace of nothing but zero-length requests has no requests.
    let e = parse_csv("0,W,0,0\n").unwrap_err();
    assert!(
        e.contains("no requests") && e.contains("zero-length"),
        "{e}"
    );
}

/// Timestamps are read exactly: at an epoch-microsecond origin an f64 keeps only ~0.25 us,
/// and two requests 1.1 us apart were replayed 1.024 us apart.
#[test]
fn timestamps_keep_their_digits_at_a_large_origin() {
    let a = parse_time("1700000000000000.0", 1_000).unwrap();
    let b = parse_time("1700000000000001.1", 1_000).unwrap();
    assert_eq!(b - a, 1_100);
    assert_eq!(
        parse_time("0.0004", 1_000),
        Ok(0),
        "rounds to the nearest ns"
    );
    assert_eq!(parse_time("0.0005", 1_000), Ok(1));
    assert_eq!(
        parse_time(" 12.345678901 ", 1_000_000_000),
        Ok(12_345_678_901)
    );
    assert_eq!(parse_time("7.", 1_000), Ok(7_000));
    assert_eq!(
        parse_time("1e3", 1_000),
        Ok(1_000_000),
        "other f64 forms still parse"
    );
    assert_eq!(parse_time("-1", 1_000), Err("bad timestamp"));
    assert_eq!(parse_time("1.2.3", 1_000), Err("bad timestamp"));
    assert_eq!(parse_time("inf", 1_000), Err("timestamp too large"));
    assert_eq!(
        parse_time("18000000000000000.001", 1_000),
        Err("timestamp too large")
    );
    assert_eq!(
        parse_time(&"9".repeat(60), 1_000),
        Err("timestamp too large")
    );
}
