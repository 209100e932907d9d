//! CLI-level tests of `flashpool sim`: `run` with a config file and with a preset, the JSON
//! keys of the stable interface, determinism across processes, clear errors for bad configs,
//! trace replay and a quick experiment.

use std::path::PathBuf;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flashpool"))
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flashpool-sim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

const CONFIG: &str = r#"
[geometry]
channels = 2
dies_per_channel = 2
planes_per_die = 1
blocks_per_plane = 32
pages_per_block = 16
page_size = 4096

[timing]
read_us = 25.0
program_us = 200.0
erase_us = 1500.0
channel_mt_s = 400
bus_width_bits = 8

[ftl]
op_ratio = 0.2
gc_policy = "greedy"
gc_threshold_blocks = 3
suspension = "program-erase"

[workload]
rw = "randrw"
rwmixread = 70
bs = 4096
iodepth = 8
ios = 5000
seed = 7
precondition = "steady"
"#;

fn run_json(args: &[&str]) -> serde_json::Value {
    let out = bin().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn run_config_json_has_stable_keys_and_is_deterministic() {
    let path = tmp("cfg.toml");
    std::fs::write(&path, CONFIG).unwrap();
    let p = path.to_str().unwrap();
    let a = run_json(&["sim", "run", p, "--json"]);
    for key in [
        "host_pages_written",
        "flash_pages_programmed",
        "gc_pages_moved",
        "blocks_erased",
        "waf",
        "iops",
        "sim_seconds",
    ] {
        assert!(a[key].is_number(), "missing {key}");
    }
    for lat in ["read_latency_us", "write_latency_us"] {
        for k in ["mean", "p50", "p99", "p999", "max"] {
            assert!(a[lat][k].is_number(), "missing {lat}.{k}");
        }
    }
    assert_eq!(a["host_ios"], 5000);
    assert!(a["waf"].as_f64().unwrap() >= 1.0);
    let b = run_json(&["sim", "run", p, "--json"]);
    assert_eq!(a, b, "same seed must give identical JSON");
    let human = bin().args(["sim", "run", p]).output().unwrap();
    assert!(human.status.success());
    assert!(String::from_utf8_lossy(&human.stdout).contains("WAF"));
}

#[test]
fn run_preset() {
    let v = run_json(&["sim", "run", "--preset", "small", "--ios", "2000", "--json"]);
    assert_eq!(v["host_ios"], 2000);
    assert_eq!(v["name"], "small");
}

#[test]
fn bad_config_is_a_clear_error() {
    let path = tmp("bad.toml");
    std::fs::write(&path, "[ftl]\ngc_policy = \"lru\"\n").unwrap();
    let out = bin()
        .args(["sim", "run", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gc_policy") || err.contains("lru"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let out = bin()
        .args(["sim", "run", "--preset", "nope"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown preset"));
}

#[test]
fn replay_csv_trace() {
    let cfg = tmp("replay.toml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let tr = tmp("trace.csv");
    std::fs::write(
        &tr,
        "timestamp_us,op,offset,length\n0,W,0,4096\n5,R,0,4096\n9,T,0,4096\n",
    )
    .unwrap();
    let v = run_json(&[
        "sim",
        "replay",
        cfg.to_str().unwrap(),
        "--trace",
        tr.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(v["host_ios"], 3);
}

#[test]
fn quick_experiment_writes_csv_and_svg() {
    let out = tmp("exp");
    let o = bin()
        .args([
            "sim",
            "experiment",
            "scaling",
            "--quick",
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let csv = std::fs::read_to_string(out.join("scaling.csv")).unwrap();
    assert!(csv.starts_with("modules,"));
    let svg = std::fs::read_to_string(out.join("scaling.svg")).unwrap();
    assert!(svg.contains("<svg"));
}

fn fixture(name: &str) -> String {
    format!(
        "{}/../sim/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn replay_msr_trace_out_of_range_is_an_error_unless_scaled() {
    let msr = fixture("msr_hm_0_sample.csv");
    let out = bin()
        .args(["sim", "replay", "--preset", "small", "--trace", &msr])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("trace line 1") && err.contains("--range"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let v = run_json(&[
        "sim", "replay", "--preset", "small", "--trace", &msr, "--range", "scale", "--json",
    ]);
    assert_eq!(v["host_ios"], 3000);
    // A bad line names its number.
    let bad = tmp("bad_msr.csv");
    std::fs::write(
        &bad,
        "128166372003061629,hm,1,Read,0,4096,41286\n128166372003061630,hm,1,Flush,0,4096,1\n",
    )
    .unwrap();
    let out = bin()
        .args([
            "sim", "replay", "--preset", "small", "--format", "msr", "--trace",
        ])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("trace line 2"), "{err}");
}

#[test]
fn replay_fio_iolog() {
    for name in ["fio_v3_sample.log", "fio_v2_sample.log"] {
        let v = run_json(&[
            "sim",
            "replay",
            "--preset",
            "small",
            "--trace",
            &fixture(name),
            "--json",
        ]);
        assert_eq!(v["host_ios"], 200, "{name}");
    }
}

#[test]
fn trace_experiment_compares_two_devices() {
    let out = tmp("exp-trace");
    let o = bin()
        .args(["sim", "experiment", "trace", "--quick", "--out"])
        .arg(&out)
        .args(["--trace", &fixture("fio_v3_sample.log")])
        .args(["--device", "small", "--device", "small", "--range", "error"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let csv = std::fs::read_to_string(out.join("trace.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3, "{csv}");
    // The same device twice gives the same row (deterministic).
    assert_eq!(lines[1], lines[2]);
    assert!(std::fs::read_to_string(out.join("trace.svg"))
        .unwrap()
        .contains("<svg"));
}

/// Runs `flashpool ARGS` to its end; returns (exit code, stderr). A panic or a signal is a
/// test failure.
fn refused(args: &[&str]) -> (i32, String) {
    let out = bin().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    let code = out
        .status
        .code()
        .unwrap_or_else(|| panic!("{args:?} died by a signal: {:?}: {err}", out.status));
    assert_ne!(code, 0, "{args:?} succeeded");
    (code, err)
}

/// Argument errors exit 2 (as clap's own), with a message naming the flag or argument.
#[test]
fn argument_errors_exit_2() {
    let d = tmp("argdir");
    let d = d.to_str().unwrap();
    for (args, words) in [
        (&["sim", "run"][..], &["--preset"][..]),
        (
            &["sim", "run", "--preset", "nope"],
            &["--preset", "unknown preset"],
        ),
        (&["sim", "bench", "--rw", "bogus"], &["--rw", "bogus"]),
        (&["sim", "bench", "--op-ratio", "nan"], &["--op-ratio"]),
        (&["sim", "bench", "--ios", "0"], &["--ios"]),
        (&["sim", "bench", "--preset", "nope"], &["--preset"]),
        (&["sim", "experiment", "bogus", "--out", d], &["bogus"]),
        (
            &["sim", "run", "--preset", "small", "--ios", "0"],
            &["--ios"],
        ),
        (&["sim", "presets", "nope"], &["unknown preset"]),
        (
            &[
                "sim",
                "experiment",
                "trace",
                "--quick",
                "--out",
                d,
                "--device",
                "nope",
                "--device",
                "small",
            ],
            &["--device", "nope"],
        ),
    ] {
        let (code, err) = refused(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        for w in words {
            assert!(err.contains(w), "{args:?}: want {w:?} in {err}");
        }
    }
    // A bad config file is not an argument error.
    let path = tmp("bad-exit.toml");
    std::fs::write(&path, "[ftl]\nd_choices = 0\n").unwrap();
    let (code, err) = refused(&["sim", "run", path.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("ftl.d_choices"), "{err}");
}

/// `--ios` does not apply to a replay (the trace sets the I/Os), and a replay does not check
/// workload keys it does not use.
#[test]
fn replay_refuses_ios_and_ignores_unused_workload_keys() {
    let tr = tmp("ios-trace.csv");
    std::fs::write(&tr, "0,W,0,4096\n5,R,0,4096\n").unwrap();
    let tr = tr.to_str().unwrap();
    for n in ["0", "1"] {
        let (code, err) = refused(&[
            "sim", "replay", "--preset", "small", "--trace", tr, "--ios", n,
        ]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("--ios") && err.contains("replay"), "{err}");
    }
    let cfg = tmp("replay-ios0.toml");
    std::fs::write(
        &cfg,
        CONFIG.replace("ios = 5000", "ios = 0\nruntime_ms = 0.0"),
    )
    .unwrap();
    let v = run_json(&[
        "sim",
        "replay",
        cfg.to_str().unwrap(),
        "--trace",
        tr,
        "--json",
    ]);
    assert_eq!(v["host_ios"], 2);
}

/// An MSR timestamp near u64::MAX / 100 ticks is an error naming the line, not a wrapped
/// clock.
#[test]
fn replay_msr_timestamp_too_large() {
    let tr = tmp("msr-big.csv");
    std::fs::write(
        &tr,
        "0,h,0,Write,0,4096,0\n184467440737095516,h,0,Write,4096,4096,0\n",
    )
    .unwrap();
    let (code, err) = refused(&[
        "sim",
        "replay",
        "--preset",
        "small",
        "--trace",
        tr.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("trace line 2") && err.contains("timestamp too large"),
        "{err}"
    );
}

/// Starts `flashpool serve` with simulated drives, which must refuse to start: returns (exit
/// code, stderr). A server that comes up is killed and fails the test (a watchdog bounds the
/// wait so a wrong build cannot hang the suite).
fn serve_refused(data: &str, args: &[&str]) -> (i32, String) {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut child = bin()
        .args(["serve", "--data", data, "--listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for r in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(r).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
    }
    drop(tx);
    let mut lines = Vec::new();
    let mut came_up = false;
    loop {
        match rx.recv_timeout(std::time::Duration::from_secs(300)) {
            Ok(line) => {
                if line.starts_with("nbd://") && !came_up {
                    came_up = true;
                    let _ = child.kill();
                }
                lines.push(line);
            }
            // Both pipes closed: the process is exiting.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                came_up = true;
                let _ = child.kill();
            }
        }
    }
    let status = child.wait().unwrap();
    let log = lines.join("\n");
    assert!(!came_up, "serve {args:?} started: {log}");
    assert!(!log.contains("panicked"), "{log}");
    let code = status
        .code()
        .unwrap_or_else(|| panic!("serve {args:?} died by a signal: {status:?}: {log}"));
    (code, log)
}

/// `--sim-drives` with a drive size no simulated device of that geometry can hold says so
/// (it used to wrap the block count and make tiny drives).
#[test]
fn sim_drives_too_large_a_drive_size_is_refused() {
    let data = tmp("serve-big");
    let (code, err) = serve_refused(
        data.to_str().unwrap(),
        &[
            "--sim-drives",
            "small",
            "--sim-timing",
            "off",
            "--drive-size",
            "3865470837M",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--drive-size") && err.contains("too large") && err.contains("small"),
        "{err}"
    );
}

/// A `--sim-drives` config whose smallest device is absurdly large (4 GiB pages) is refused
/// with a clear message, not an abort on a huge allocation.
#[test]
fn sim_drives_absurd_page_size_is_refused() {
    let cfg = tmp("huge-page.toml");
    std::fs::write(
        &cfg,
        "[geometry]\nchannels = 1\ndies_per_channel = 1\nplanes_per_die = 1\n\
         blocks_per_plane = 64\npages_per_block = 65535\npage_size = 4294967295\n",
    )
    .unwrap();
    let data = tmp("serve-huge-page");
    let (code, err) = serve_refused(
        data.to_str().unwrap(),
        &[
            "--sim-drives",
            cfg.to_str().unwrap(),
            "--sim-timing",
            "off",
            "--drive-size",
            "64M",
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--sim-drives") && err.contains("page"),
        "{err}"
    );
}
