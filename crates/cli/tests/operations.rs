//! Operating a running `flashpool serve` (issue 20), against the real binary: Prometheus
//! metrics that move by what a client wrote (scraped while it writes), the admin HTTP API
//! (refused without its token, volumes created over it served over NBD at once, drives and
//! background work controlled), `--config` files (settings applied, flags win, errors name
//! the line), and the systemd units under deploy/ (`systemd-analyze verify` where it exists).
//!
//! The NBD client here is a few lines of the protocol (fixed newstyle, NBD_OPT_EXPORT_NAME,
//! simple replies), so the tests need no client packages; the e2e checks
//! (tests/e2e/check-metrics.sh, check-http-api.sh) use curl, nbdinfo, nbdcopy and promtool.

mod common;

use common::{flashpool, s, Nbd, Server, TempDir};
use flashpool_nbd::proto;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

impl Server {
    fn metrics(&self) -> Metrics {
        let (code, body) = http(self.metrics.as_ref().unwrap(), "GET", "/metrics", None, "");
        assert_eq!(code, 200, "{body}");
        Metrics::parse(&body)
    }
}

/// One HTTP/1.0 request (so the answer is never chunked); returns status and body.
fn http(addr: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let (code, _, body) = http_with(addr, method, path, &auth, body);
    (code, body)
}

/// One HTTP/1.0 request with the header lines `headers` (each ending in CRLF); returns status,
/// head and body.
fn http_with(
    addr: &str,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String, String) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        c,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad HTTP answer {out:?}"));
    (code, head.to_string(), body.to_string())
}

/// The value of header `name` in an answer's head.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// A scrape: series (name with labels as printed) to value; comments checked for form.
struct Metrics(std::collections::BTreeMap<String, f64>, String);

impl Metrics {
    fn parse(text: &str) -> Metrics {
        let mut m = std::collections::BTreeMap::new();
        for line in text.lines() {
            if line.starts_with('#') || line.is_empty() {
                assert!(
                    line.is_empty() || line.starts_with("# HELP ") || line.starts_with("# TYPE "),
                    "{line}"
                );
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            let v: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
            assert!(
                m.insert(series.to_string(), v).is_none(),
                "duplicate {series}"
            );
        }
        Metrics(m, text.to_string())
    }
    fn get(&self, series: &str) -> f64 {
        *self
            .0
            .get(series)
            .unwrap_or_else(|| panic!("no series {series} in\n{}", self.1))
    }
    fn vol(&self, name: &str, volume: &str, op: &str) -> f64 {
        self.get(&format!("{name}{{op=\"{op}\",volume=\"{volume}\"}}"))
    }
}

/// The protocol's smallest client: fixed newstyle, NBD_OPT_EXPORT_NAME, simple replies.
/// `len` bytes that do not compress (xorshift), so media bytes follow host bytes.
fn block(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// `promtool check metrics` on a scrape, where promtool is installed (Debian: prometheus).
fn promtool_check(text: &str) {
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        eprintln!("SKIPPED: promtool is not installed (apt-get install prometheus); the exposition was not linted");
        return;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn metrics_move_by_what_a_client_wrote() {
    let tmp = TempDir::new("ops", "metrics");
    let srv = Server::start(&tmp.0.join("data"), &["--metrics", "127.0.0.1:0"]);
    let before = srv.metrics();
    promtool_check(&before.1);
    let host0 = before.get("flashpool_host_write_bytes_total");
    assert_eq!(
        before.get("flashpool_volume_size_bytes{volume=\"default\"}"),
        (32 << 20) as f64
    );
    for st in ["active", "failed", "missing", "retired"] {
        let want = if st == "active" { 1.0 } else { 0.0 };
        assert_eq!(
            before.get(&format!(
                "flashpool_drive_state{{drive=\"4\",state=\"{st}\"}}"
            )),
            want
        );
    }

    // A writer: 96 writes of 128 KiB (12 MiB), then a flush, a trim and reads back; the
    // scraper reads /metrics all the while, and every counter only ever grows.
    let addr = srv.nbd.clone();
    const WRITES: u64 = 96;
    const LEN: usize = 128 << 10;
    let writer = std::thread::spawn(move || {
        let mut c = Nbd::connect(&addr, "default").unwrap();
        assert_eq!(c.size, 32 << 20);
        for i in 0..WRITES {
            c.write(i * LEN as u64, &block(i, LEN));
        }
        c.flush();
        c.trim(0, LEN as u32);
        for i in 1..4 {
            assert_eq!(
                c.read(i * LEN as u64, LEN as u32),
                block(i, LEN),
                "read back {i}"
            );
        }
        c
    });
    // No series for a volume before a client opened it.
    assert!(!before.1.contains("flashpool_volume_requests_total"));
    let mut last = 0.0;
    let mut scrapes = 0;
    let mut saw_connection = false;
    while !writer.is_finished() {
        let m = srv.metrics();
        if let Some(w) =
            m.0.get("flashpool_volume_requests_total{op=\"write\",volume=\"default\"}")
        {
            assert!(*w >= last, "the write counter went back: {w} < {last}");
            last = *w;
            saw_connection |=
                m.0.get("flashpool_nbd_connections{volume=\"default\"}") == Some(&1.0);
        }
        scrapes += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let client = writer.join().unwrap();
    let during = srv.metrics();
    assert_eq!(
        during.get("flashpool_nbd_connections{volume=\"default\"}"),
        1.0
    );
    assert!(scrapes > 0);
    eprintln!("{scrapes} scrapes while writing; the connection seen open: {saw_connection}");

    let m = &during;
    let v = |name: &str, op: &str| m.vol(name, "default", op);
    assert_eq!(v("flashpool_volume_requests_total", "write"), WRITES as f64);
    assert_eq!(
        v("flashpool_volume_bytes_total", "write"),
        (WRITES * LEN as u64) as f64
    );
    assert_eq!(v("flashpool_volume_requests_total", "flush"), 1.0);
    assert_eq!(v("flashpool_volume_requests_total", "trim"), 1.0);
    assert_eq!(v("flashpool_volume_bytes_total", "trim"), LEN as f64);
    assert_eq!(v("flashpool_volume_requests_total", "read"), 3.0);
    assert_eq!(v("flashpool_volume_bytes_total", "read"), (3 * LEN) as f64);
    assert_eq!(v("flashpool_volume_errors_total", "write"), 0.0);
    // The latency histogram counted every request, in cumulative buckets.
    assert_eq!(
        v("flashpool_volume_request_duration_seconds_count", "write"),
        WRITES as f64
    );
    assert_eq!(
        m.get("flashpool_volume_request_duration_seconds_bucket{op=\"write\",volume=\"default\",le=\"+Inf\"}"),
        WRITES as f64
    );
    assert!(v("flashpool_volume_request_duration_seconds_sum", "write") > 0.0);
    // The engine saw the same bytes, and wrote parity for them.
    assert_eq!(
        m.get("flashpool_host_write_bytes_total") - host0,
        (WRITES * LEN as u64) as f64
    );
    assert!(m.get("flashpool_media_parity_bytes_total") > 0.0);
    let wa = m.get("flashpool_write_amplification_ratio{cause=\"all\"}");
    assert!((1.0..3.0).contains(&wa), "write amplification {wa}");
    assert!(m.get("flashpool_write_amplification_ratio{cause=\"parity\"}") > 0.2);
    assert!(m.get("flashpool_used_bytes") > 0.0);
    assert!(m.get("flashpool_free_bytes") < m.get("flashpool_capacity_now_bytes"));
    promtool_check(&m.1);

    dashboard_names_exported(&m.1);

    // Once the client goes, its connection does too.
    client.disconnect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while srv
        .metrics()
        .get("flashpool_nbd_connections{volume=\"default\"}")
        != 0.0
    {
        assert!(Instant::now() < deadline, "the connection gauge stayed up");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Other paths: 404 and 405, no panics.
    let a = srv.metrics.clone().unwrap();
    assert_eq!(http(&a, "GET", "/nothing", None, "").0, 404);
    let (code, head, _) = http_with(&a, "POST", "/metrics", "", "");
    assert_eq!(
        (code, header(&head, "Allow")),
        (405, Some("GET, HEAD")),
        "{head}"
    );
    assert_eq!(
        http(&a, "GET", "/api/v1/status", None, "").0,
        404,
        "no API without a token file"
    );
    srv.stop();
}

/// A read is one request with the bytes it covered, however the NBD layer answers it: a
/// structured read wholly in a hole reads nothing from the volume (one hole chunk), and one
/// over data, hole, data reads the two data extents apart; each still counts once with its
/// full length (the counters once sat below the NBD layer: the first read was not counted,
/// the second counted twice with only its data bytes).
#[test]
fn reads_over_holes_count_once_with_their_length() {
    let tmp = TempDir::new("ops", "holes");
    let srv = Server::start(&tmp.0.join("data"), &["--metrics", "127.0.0.1:0"]);
    const K64: u64 = 64 << 10;
    let mut c = Nbd::connect_structured(&srv.nbd, "default").unwrap();
    c.write(0, &block(1, K64 as usize));
    c.write(2 * K64, &block(2, K64 as usize));
    c.flush();
    let reads = |m: &Metrics| {
        (
            m.vol("flashpool_volume_requests_total", "default", "read"),
            m.vol("flashpool_volume_bytes_total", "default", "read"),
            m.vol(
                "flashpool_volume_request_duration_seconds_count",
                "default",
                "read",
            ),
        )
    };
    assert_eq!(reads(&srv.metrics()), (0.0, 0.0, 0.0));

    let (data, kinds) = c.read_structured(16 * K64, K64 as u32);
    assert_eq!(data, vec![0; K64 as usize]);
    assert_eq!(kinds, [proto::REPLY_TYPE_OFFSET_HOLE], "answered as a hole");
    assert_eq!(
        reads(&srv.metrics()),
        (1.0, K64 as f64, 1.0),
        "a read of a hole"
    );

    let (data, kinds) = c.read_structured(0, 3 * K64 as u32);
    let mut want = block(1, K64 as usize);
    want.extend(vec![0; K64 as usize]);
    want.extend(block(2, K64 as usize));
    assert!(data == want, "data, hole, data read back");
    assert!(
        kinds.contains(&proto::REPLY_TYPE_OFFSET_HOLE)
            && kinds
                .iter()
                .filter(|k| **k == proto::REPLY_TYPE_OFFSET_DATA)
                .count()
                == 2,
        "answered in data and hole chunks: {kinds:?}"
    );
    assert_eq!(
        reads(&srv.metrics()),
        (2.0, (4 * K64) as f64, 2.0),
        "and a read of data, hole, data"
    );

    // A simple-reply read (one export read) counts the same.
    let mut plain = Nbd::connect(&srv.nbd, "default").unwrap();
    assert_eq!(plain.read(K64, K64 as u32), vec![0; K64 as usize]);
    assert_eq!(reads(&srv.metrics()), (3.0, (5 * K64) as f64, 3.0));
    plain.disconnect();
    c.disconnect();
    srv.stop();
}

/// Every flashpool metric the Grafana dashboard (deploy/grafana/flashpool.json) queries is
/// in the scrape, or (block-device drive counters, shown only with such members) named in the
/// metrics source.
fn dashboard_names_exported(scrape: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dash = std::fs::read_to_string(root.join("../../deploy/grafana/flashpool.json")).unwrap();
    let source = std::fs::read_to_string(root.join("src/ops/metrics.rs")).unwrap();
    let v = json(&dash);
    let mut n = 0;
    for p in v["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let q = t["expr"].as_str().unwrap();
            for (i, _) in q.match_indices("flashpool_") {
                let name: String = q[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .unwrap_or(&name);
                assert!(
                    scrape.contains(&name) || source.contains(&format!("\"{base}\"")),
                    "the dashboard queries {name}, which the server does not export"
                );
                n += 1;
            }
        }
    }
    assert!(n > 30, "{n} names in the dashboard");
}

/// The dashboard shows every series per server: sums keep `instance` and legends name it
/// (per-volume panels once summed by volume and op alone, adding up the `default` volumes
/// of every server); panel 10's media writes are the same counters as panel 9's `all`; an
/// import input is one the panels use.
#[test]
fn dashboard_keeps_servers_apart() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dash = std::fs::read_to_string(root.join("../../deploy/grafana/flashpool.json")).unwrap();
    let v = json(&dash);
    let mut sums = 0;
    let target = |id: u64, legend: &str| -> String {
        let p = v["panels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == id)
            .unwrap();
        p["targets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["legendFormat"].as_str().unwrap_or("").starts_with(legend))
            .unwrap_or_else(|| panic!("panel {id} has no {legend} series"))["expr"]
            .as_str()
            .unwrap()
            .to_string()
    };
    for p in v["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let q = t["expr"].as_str().unwrap();
            let what = format!("panel {} ({}): {q}", p["id"], p["title"]);
            for (i, _) in q.match_indices(" by (") {
                let labels = &q[i + 5..i + 5 + q[i + 5..].find(')').unwrap()];
                assert!(
                    labels.split(',').any(|l| l.trim() == "instance"),
                    "{what}: sums servers together"
                );
                sums += 1;
            }
            if let Some(legend) = t["legendFormat"].as_str() {
                assert!(legend.contains("{{instance}}"), "{what}: legend {legend:?}");
            }
        }
    }
    assert!(sums >= 7, "{sums} sums");
    let media = |q: &str| -> std::collections::BTreeSet<String> {
        q.match_indices("flashpool_media_")
            .map(|(i, _)| {
                q[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect()
            })
            .collect()
    };
    let all = target(9, "all");
    let write = target(10, "media write");
    assert_eq!(media(&write), media(&all), "{write} against {all}");
    assert_eq!(media(&all).len(), 4, "{all}");
    for input in v["__inputs"].as_array().into_iter().flatten() {
        let name = input["name"].as_str().unwrap();
        assert!(
            dash.contains(&format!("${{{name}}}")),
            "import input {name} is used by no panel"
        );
    }
}

const TOKEN: &str = "0123456789abcdef-test-token";

fn token_file(dir: &Path) -> PathBuf {
    let p = dir.join("api-token");
    std::fs::write(&p, format!("{TOKEN}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

#[test]
fn admin_api_needs_its_token_and_drives_the_pool() {
    let tmp = TempDir::new("ops", "api");
    let tok = token_file(&tmp.0);
    let data = tmp.0.join("data");
    let srv = Server::start(
        &data,
        &["--api", "127.0.0.1:0", "--api-token-file", s(&tok)],
    );
    let a = srv.api.clone().unwrap();
    let call = |method: &str, path: &str, body: &str| http(&a, method, path, Some(TOKEN), body);

    // Refused without the token, or with a wrong one; nothing done.
    for t in [None, Some("wrong"), Some(&TOKEN[..TOKEN.len() - 1])] {
        let (code, body) = http(&a, "GET", "/api/v1/status", t, "");
        assert_eq!(code, 401, "{t:?}: {body}");
        let (code, _) = http(
            &a,
            "POST",
            "/api/v1/volumes",
            t,
            r#"{"name":"sneaky","size":"1M"}"#,
        );
        assert_eq!(code, 401);
    }
    assert_eq!(
        http(&a, "GET", "/metrics", None, "").0,
        404,
        "metrics live on --metrics"
    );

    let (code, body) = call("GET", "/api/v1/status", "");
    assert_eq!(code, 200, "{body}");
    let st = json(&body);
    assert_eq!(st["pool"]["drives"], 5);
    assert_eq!(st["controls"]["cleaner_paused"], false);

    // A volume created over HTTP is served over NBD at once.
    let (code, body) = call(
        "POST",
        "/api/v1/volumes",
        r#"{"name":"web","size":"8M","compression":"zstd"}"#,
    );
    assert_eq!(code, 201, "{body}");
    assert_eq!(json(&body)["volume"]["size"], 8 << 20);
    assert_eq!(
        call("POST", "/api/v1/volumes", r#"{"name":"web","size":"8M"}"#).0,
        409
    );
    assert_eq!(
        call("POST", "/api/v1/volumes", r#"{"name":"x","size":"8Q"}"#).0,
        400
    );
    assert_eq!(call("POST", "/api/v1/volumes", r#"{"name":"x"}"#).0, 400);
    assert_eq!(
        call("POST", "/api/v1/volumes", r#"{"name":"x","size":0}"#).0,
        400,
        "a volume of 0 bytes (the spec's minimum is 1)"
    );
    assert_eq!(call("POST", "/api/v1/volumes", "not json").0, 400);
    let mut c = Nbd::connect(&srv.nbd, "web").unwrap();
    assert_eq!(c.size, 8 << 20);
    c.write(4096, &block(7, 8192));
    c.flush();
    assert_eq!(c.read(4096, 8192), block(7, 8192));
    c.disconnect();
    let (code, body) = call("GET", "/api/v1/volumes/web", "");
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["allocated_bytes"], 8192);
    // Path segments are percent-decoded: %77 is `w`.
    let (code, body) = call("GET", "/api/v1/volumes/%77eb", "");
    assert_eq!(
        (code, json(&body)["name"].as_str()),
        (200, Some("web")),
        "{body}"
    );
    assert_eq!(call("GET", "/api/v1/volumes/w%zzb", "").0, 400);
    // The auth scheme's name is case-insensitive (RFC 9110 11.1).
    for scheme in ["bearer", "BEARER"] {
        let auth = format!("Authorization: {scheme} {TOKEN}\r\n");
        let (code, _, body) = http_with(&a, "GET", "/api/v1/volumes/web", &auth, "");
        assert_eq!(code, 200, "{scheme}: {body}");
    }

    // Resize: growing is fine, shrinking below data needs force.
    assert_eq!(
        call("PATCH", "/api/v1/volumes/web", r#"{"size":"16M"}"#).0,
        200
    );
    assert_eq!(
        call("PATCH", "/api/v1/volumes/web", r#"{"size":4096}"#).0,
        409
    );
    assert_eq!(
        call(
            "PATCH",
            "/api/v1/volumes/web",
            r#"{"size":4096,"force":true}"#
        )
        .0,
        200
    );
    assert_eq!(
        call(
            "PATCH",
            "/api/v1/volumes/web",
            r#"{"compression":"off","force":true}"#
        )
        .0,
        400,
        "force without a size is not silently ignored"
    );
    assert_eq!(
        call("PATCH", "/api/v1/volumes/web", r#"{"size":0,"force":true}"#).0,
        400
    );
    assert_eq!(
        call("PATCH", "/api/v1/volumes/web", r#"{"compression":"off"}"#).0,
        200
    );
    let (_, body) = call("GET", "/api/v1/volumes", "");
    let vols = json(&body);
    let web = vols["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "web")
        .unwrap();
    assert_eq!(
        (web["size"].as_u64(), web["compression"].as_str()),
        (Some(4096), Some("off"))
    );

    // Delete: gone from the API and from NBD.
    assert_eq!(
        call("DELETE", "/api/v1/volumes/web", r#"{"force":true}"#).0,
        400
    );
    assert_eq!(call("DELETE", "/api/v1/volumes/web", "").0, 200);
    assert_eq!(call("DELETE", "/api/v1/volumes/web", "").0, 404);
    assert_eq!(call("GET", "/api/v1/volumes/web", "").0, 404);
    assert!(
        Nbd::connect(&srv.nbd, "web").is_err(),
        "a deleted volume is not served"
    );

    // Drives: fail one (the automatic rebuild paused first), readmit it.
    assert_eq!(call("POST", "/api/v1/rebuild/pause", "").0, 200);
    let (code, body) = call("POST", "/api/v1/drives/2/fail", "");
    assert_eq!(code, 200, "{body}");
    let (_, body) = call("GET", "/api/v1/drives", "");
    let d = json(&body);
    assert_eq!(d["drives"][2]["state"], "failed", "{d}");
    assert_eq!(d["rebuild"]["needed"], true);
    // A second member down is more than parity covers: a conflict with the pool's state (409,
    // the member left in service), not a bad request; `force` would do it.
    let (code, body) = call("POST", "/api/v1/drives/3/fail", "");
    assert_eq!(code, 409, "{body}");
    // Forced, it is done and answered so (it answered 503 "superblock written to only 3
    // drives" after doing it); the protection says the data is unavailable, and a readmit
    // puts the member back.
    let (code, body) = call("POST", "/api/v1/drives/3/fail", r#"{"force":true}"#);
    assert_eq!(code, 200, "{body}");
    let (_, body) = call("GET", "/api/v1/drives", "");
    let d = json(&body);
    assert_eq!(d["drives"][3]["state"], "failed", "{d}");
    let summary = d["protection"]["summary"].as_str().unwrap();
    assert!(summary.ends_with("2 members down: data unavailable"), "{d}");
    assert_eq!(d["protection"]["members_in_service"], 3, "{d}");
    let (code, body) = call("POST", "/api/v1/drives/3/readmit", "");
    assert_eq!(code, 200, "{body}");
    // A replacement that cannot be made where it is asked for is the request's fault (400),
    // and changes nothing.
    let (code, body) = call(
        "POST",
        "/api/v1/drives/2/replace",
        r#"{"path":"/nonexistent-dir/new.img"}"#,
    );
    assert_eq!(code, 400, "{body}");
    let (_, body) = call("GET", "/api/v1/drives", "");
    let d = json(&body);
    assert_eq!(
        (
            d["drives"][2]["state"].as_str(),
            d["drives"][3]["state"].as_str()
        ),
        (Some("failed"), Some("active")),
        "{d}"
    );
    let (_, body) = call("GET", "/api/v1/rebuild", "");
    assert_eq!(json(&body)["paused"], true);
    assert_eq!(call("POST", "/api/v1/drives/9/fail", "").0, 404);
    assert_eq!(call("POST", "/api/v1/drives/2/readmit", "").0, 200);
    let (_, body) = call("GET", "/api/v1/drives", "");
    assert_eq!(json(&body)["drives"][2]["state"], "active");
    for path in [
        "/api/v1/rebuild/start",
        "/api/v1/rebuild/resume",
        "/api/v1/cleaner/pause",
        "/api/v1/cleaner/resume",
    ] {
        assert_eq!(call("POST", path, r#"{"now":true}"#).0, 400, "{path}");
    }
    assert_eq!(call("POST", "/api/v1/rebuild/resume", "").0, 200);
    let (_, body) = call("POST", "/api/v1/rebuild/start", "");
    assert_eq!(json(&body)["ok"], "nothing to rebuild");

    // The cleaner: pause, run by hand, resume.
    assert_eq!(call("POST", "/api/v1/cleaner/pause", "").0, 200);
    let (_, body) = call("GET", "/api/v1/cleaner", "");
    assert_eq!(json(&body)["paused"], true);
    let (code, body) = call("POST", "/api/v1/cleaner/run", r#"{"free_segments": 1}"#);
    assert_eq!(code, 200, "{body}");
    assert_eq!(call("POST", "/api/v1/cleaner/resume", "").0, 200);
    let (code, body) = call("POST", "/api/v1/scrub", r#"{"check_only": true}"#);
    assert_eq!(code, 200, "{body}");
    assert!(json(&body)["stripes_checked"].as_u64().is_some());

    // Wrong methods and paths: 405 and 404, never a panic. A 405 says what the path takes
    // (`Allow`, RFC 9110 15.5.6); a sub-path the API does not have is 404, whatever the method.
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    for (method, path, allow) in [
        ("GET", "/api/v1/drives/1/fail", "POST"),
        ("PUT", "/api/v1/status", "GET"),
        ("PUT", "/api/v1/volumes", "GET, POST"),
        ("POST", "/api/v1/volumes/web", "GET, PATCH, DELETE"),
        ("GET", "/api/v1/scrub", "POST"),
    ] {
        let (code, head, body) = http_with(&a, method, path, &auth, "");
        assert_eq!(code, 405, "{method} {path}: {body}");
        assert_eq!(
            header(&head, "Allow"),
            Some(allow),
            "{method} {path}: {head}"
        );
    }
    for (method, path) in [
        ("GET", "/api/v1/nothing"),
        ("POST", "/api/v1/rebuild/foo"),
        ("POST", "/api/v1/cleaner/foo"),
        ("POST", "/api/v1/drives/0/foo"),
        ("GET", "/api/v1statusx"),
    ] {
        assert_eq!(call(method, path, "").0, 404, "{method} {path}");
    }
    // GETs take no body either: fields in one are refused, not ignored.
    assert_eq!(call("GET", "/api/v1/status", r#"{"x":1}"#).0, 400);
    // No field is nullable: null is of the wrong type, not the field left out (a POST /drives
    // with {"path":null} used to add a drive).
    let members = json(&call("GET", "/api/v1/drives", "").1)["drives"]
        .as_array()
        .unwrap()
        .len();
    for (method, path, body) in [
        ("POST", "/api/v1/drives", r#"{"path":null}"#),
        ("POST", "/api/v1/drives", r#"{"force":null}"#),
        ("POST", "/api/v1/scrub", r#"{"check_only":null}"#),
        ("POST", "/api/v1/cleaner/run", r#"{"free_segments":null}"#),
        (
            "POST",
            "/api/v1/volumes",
            r#"{"name":"n","size":"1M","compression":null}"#,
        ),
        ("POST", "/api/v1/volumes", r#"{"name":null,"size":"1M"}"#),
    ] {
        let (code, answer) = call(method, path, body);
        assert_eq!(code, 400, "{method} {path} {body}: {answer}");
    }
    let (_, body) = call("GET", "/api/v1/drives", "");
    assert_eq!(
        json(&body)["drives"].as_array().unwrap().len(),
        members,
        "{body}"
    );
    assert_eq!(
        call("POST", "/api/v1/drives/1/fail", r#"{"forse": true}"#).0,
        400
    );

    // A retired member cannot come back: a conflict with its state (409), as the spec says.
    let (code, body) = call("POST", "/api/v1/drives/4/remove", "");
    assert_eq!(code, 200, "{body}");
    let (code, body) = call("POST", "/api/v1/drives/4/readmit", "");
    assert_eq!(code, 409, "{body}");
    assert!(
        json(&body)["error"].as_str().unwrap().contains("retired"),
        "{body}"
    );

    // The CLI keeps working through the socket, and sees the same state.
    let out = flashpool(&["status", "--data", s(&data), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = json(&String::from_utf8_lossy(&out.stdout));
    assert!(st["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|v| v["name"] != "web"));
    srv.stop();
}

#[test]
fn api_flags_are_checked_before_the_data_dir_is_touched() {
    let tmp = TempDir::new("ops", "apiflags");
    let tok = token_file(&tmp.0);
    let data = tmp.0.join("data");
    let short = tmp.0.join("short");
    std::fs::write(&short, "abc\n").unwrap();
    for (args, words) in [
        (vec!["--api", "127.0.0.1:0"], &["--api-token-file"][..]),
        (
            vec!["--api-token-file", s(&tok)],
            &["--api", "--metrics"][..],
        ),
        (
            vec!["--api", "0.0.0.0:0", "--api-token-file", s(&tok)],
            &["loopback", "--api-allow-remote"][..],
        ),
        (vec!["--metrics", "nowhere"], &["--metrics", "PORT"][..]),
        (
            vec!["--metrics", "9100", "--api-token-file", s(&short)],
            &["16 characters"][..],
        ),
        (
            vec!["--metrics", "9100", "--api-token-file", "/no/such/file"],
            &["cannot read"][..],
        ),
    ] {
        let mut full = vec!["serve", "--data", s(&data), "--listen", "127.0.0.1:0"];
        full.extend_from_slice(&args);
        let out = flashpool(&full);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        for w in words {
            assert!(err.contains(w), "{args:?}: {err} lacks {w:?}");
        }
        assert!(!data.exists(), "{args:?} created the data dir");
    }
}

#[test]
fn config_file_settings_flags_and_errors() {
    let tmp = TempDir::new("ops", "config");
    let cfg = tmp.0.join("flashpool.toml");
    // Relative paths are taken from the file's directory; --stdio with no client opens
    // (creates) the pool and closes it.
    std::fs::write(
        &cfg,
        "# a pool for the test\ndata = \"pool\"\ndrive-size = \"64M\"\nvolume-size = \"24M\"\nsparse = true\nec = \"2+1\"\ndrives = 3\nrebuild-reserve = false\n",
    )
    .unwrap();
    let out = flashpool(&["serve", "--config", s(&cfg), "--stdio"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let data = tmp.0.join("pool");
    let st = flashpool(&["status", "--data", s(&data), "--json"]);
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let st = json(&String::from_utf8_lossy(&st.stdout));
    assert_eq!(
        (st["pool"]["k"].as_u64(), st["pool"]["m"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(st["pool"]["drives"], 3);
    assert_eq!(st["volumes"][0]["size"], 24 << 20);

    // A flag wins over the file: another data dir, another volume size.
    let other = tmp.0.join("other");
    let out = flashpool(&[
        "serve",
        "--config",
        s(&cfg),
        "--stdio",
        "--data",
        s(&other),
        "--volume-size",
        "8M",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = json(&String::from_utf8_lossy(
        &flashpool(&["status", "--data", s(&other), "--json"]).stdout,
    ));
    assert_eq!(st["volumes"][0]["size"], 8 << 20);
    assert_eq!(st["pool"]["drives"], 3, "the rest still from the file");

    // Errors name the file, the line and what is wrong; nothing is created.
    let bad_data = tmp.0.join("never");
    for (n, (text, line, words)) in [
        (
            "data = \"never\"\nlisten = \"127.0.0.1:0\"\nlisten-addr = \"x\"\n",
            3,
            &["unknown field `listen-addr`", "expected one of"][..],
        ),
        (
            "data = \"never\"\n\n\nbusy-poll-us = -1\n",
            4,
            &["busy-poll-us"][..],
        ),
        (
            "data = \"never\"\nscrub-rate-mib = 0\n",
            2,
            &["1..=100000"][..],
        ),
        (
            "data = \"never\"\nscrub-interval-hours = 5124095576030432\n",
            2,
            &["0..=87600"][..],
        ),
        (
            "data = \"never\"\ndrives = 65\n",
            2,
            &["1 to 64 drives"][..],
        ),
        (
            "data = \"never\"\nsearch = [\"/dev/[\"]\n",
            2,
            &["not a valid glob"][..],
        ),
        (
            "data = \"never\"\nvolume-size = \"lots\"\n",
            2,
            &["size \"lots\""][..],
        ),
        (
            "data = \"never\"\nvolume-size = 0\n",
            2,
            &["--volume-size", "volume size 0"][..],
        ),
        (
            "data = \"never\"\ntls = \"yes\"\n",
            2,
            &["off, on, require"][..],
        ),
        ("data = \"never\"\nec = \"4-1\"\n", 2, &["4-1"][..]),
        ("data = \"never\"\nsparse = \"yes\"\n", 2, &["bool"][..]),
        (
            "data = \"never\"\nmetrics = \"host:port\"\n",
            2,
            &["PORT"][..],
        ),
        (
            "data = \"never\"\ndrive = \"/dev/sdb\"\n",
            2,
            &["sequence"][..],
        ),
        ("data = \"never\"\n[serve]\n", 2, &["serve"][..]),
        ("data = \"never\nlisten = 1\n", 1, &[][..]),
    ]
    .into_iter()
    .enumerate()
    {
        let f = tmp.0.join(format!("bad-{n}.toml"));
        std::fs::write(&f, text).unwrap();
        let out = flashpool(&["serve", "--config", s(&f), "--stdio"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text:?} was accepted");
        assert!(
            err.contains(&format!("{}: line {line}, column ", f.display())),
            "{text:?}: {err}"
        );
        for w in words {
            assert!(err.contains(w), "{text:?}: {err} lacks {w:?}");
        }
        assert!(!bad_data.exists(), "{text:?} created the data dir");
    }
    let out = flashpool(&["serve", "--config", "/no/such/flashpool.toml", "--stdio"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
    // Settings that only conflict once the file is read.
    let f = tmp.0.join("conflict.toml");
    std::fs::write(&f, "data = \"never\"\ndrives = 3\n").unwrap();
    let out = flashpool(&[
        "serve",
        "--config",
        s(&f),
        "--stdio",
        "--drive",
        "/tmp/x.img",
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("exclude each other"));
    assert!(!bad_data.exists());
    // A DH group without the secrets it is for (the flag needs --nvme-dhchap-secret): refused,
    // not ignored.
    std::fs::write(
        &f,
        "data = \"never\"\nnvme-dhchap-dhgroup = \"ffdhe2048\"\n",
    )
    .unwrap();
    let out = flashpool(&["serve", "--config", s(&f), "--stdio"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a lone nvme-dhchap-dhgroup was accepted: {err}"
    );
    assert!(
        err.contains("nvme-dhchap-dhgroup") && err.contains("needs nvme-dhchap-secret"),
        "{err}"
    );
    assert!(!bad_data.exists());
}

#[test]
fn systemd_units_verify() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = root.join("deploy/systemd");
    let unit = std::fs::read_to_string(dir.join("flashpool.service")).unwrap();
    let socket = std::fs::read_to_string(dir.join("flashpool.socket")).unwrap();
    for want in [
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
        "PrivateTmp=yes",
        "ReadWritePaths=",
        "--config /etc/flashpool/flashpool.toml",
    ] {
        assert!(unit.contains(want), "flashpool.service lacks {want}");
    }
    assert!(socket.contains("ListenStream="));
    // Under DynamicUser= the service cannot read root's mode-600 secrets in /etc/flashpool:
    // every secret the example config names is a credential's copy, and the unit loads it.
    const CREDS: &str = "/run/credentials/flashpool.service";
    let example_text = std::fs::read_to_string(root.join("deploy/flashpool.toml")).unwrap();
    let mut secrets = 0;
    for key in [
        "api-token-file",
        "tls-psk",
        "tls-certificates",
        "nvme-dhchap-secret",
        "nvme-tls-psk",
    ] {
        let at = format!("{key} = \"");
        let line = example_text
            .lines()
            .find(|l| l.trim_start_matches('#').starts_with(&at))
            .unwrap_or_else(|| panic!("deploy/flashpool.toml shows no {key}"));
        let value = line.split('"').nth(1).unwrap();
        let id = value
            .strip_prefix(CREDS)
            .unwrap_or_else(|| panic!("{key} = {value:?} is not under {CREDS}"));
        // `tls-certificates` is the credentials directory, holding nbdkit's three names.
        let ids = match id.strip_prefix('/') {
            Some(id) => vec![id],
            None => vec!["ca-cert.pem", "server-cert.pem", "server-key.pem"],
        };
        for id in ids {
            assert!(
                unit.contains(&format!("LoadCredential={id}:/etc/flashpool/")),
                "flashpool.service loads no credential {id} ({key})"
            );
            secrets += 1;
        }
    }
    assert_eq!(secrets, 7);
    // The example config is a valid config.
    let example = root.join("deploy/flashpool.toml");
    let tmp = TempDir::new("ops", "systemd");
    let out = flashpool(&[
        "serve",
        "--config",
        s(&example),
        "--data",
        s(&tmp.0.join("d")),
        "--memory",
        "--stdio",
        "--drive-size",
        "64M",
        "--volume-size",
        "32M",
        "--metrics",
        "127.0.0.1:0",
    ]);
    assert!(
        out.status.success(),
        "deploy/flashpool.toml: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: systemd-analyze is not installed; the units were not verified");
        return;
    }
    // verify wants the ExecStart binary to exist: point it at the one just built.
    let bin = env!("CARGO_BIN_EXE_flashpool");
    std::fs::write(
        tmp.0.join("flashpool.service"),
        unit.replace("/usr/bin/flashpool", bin),
    )
    .unwrap();
    std::fs::write(tmp.0.join("flashpool.socket"), &socket).unwrap();
    // As shipped, and with every commented credential loaded.
    let loaded = tmp.0.join("loaded");
    std::fs::create_dir_all(&loaded).unwrap();
    std::fs::write(
        loaded.join("flashpool.service"),
        unit.replace("/usr/bin/flashpool", bin)
            .replace("#LoadCredential=", "LoadCredential="),
    )
    .unwrap();
    std::fs::write(loaded.join("flashpool.socket"), &socket).unwrap();
    for dir in [&tmp.0, &loaded] {
        let out = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(dir.join("flashpool.socket"))
            .arg(dir.join("flashpool.service"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        // Only lines about our units count (the host's own units may have complaints).
        let ours: Vec<&str> = err.lines().filter(|l| l.contains("flashpool")).collect();
        assert!(
            out.status.success() && ours.is_empty(),
            "systemd-analyze verify {}: {err}",
            dir.display()
        );
    }

    // The hardening set, as systemd scores it (0 best, 10 worst; 1.6 when written).
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(tmp.0.join("flashpool.service"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    match text
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for flashpool.service: ")
                .nth(1)
        })
        .and_then(|r| r.split_whitespace().next()?.parse::<f64>().ok())
    {
        Some(level) => assert!(level <= 2.5, "exposure {level}: {text}"),
        None => eprintln!("SKIPPED: this systemd-analyze has no offline security report: {text}"),
    }
}

/// `--nvme-dhchap-secret FILE` is read and checked at startup, before the data dir is touched:
/// a bad line stops the server naming the line (never quoting the secret), an unknown DH group
/// (`--nvme-dhchap-dhgroup`) is refused naming the choices; the flags need `--nvme-tcp`.
#[test]
fn nvme_secrets_file_is_checked_at_startup() {
    let tmp = TempDir::new("ops", "nvme-secrets");
    let data = tmp.0.join("never");
    let secrets = tmp.0.join("secrets");
    std::fs::write(
        &secrets,
        "# hosts\nnqn.2014-08.org.nvmexpress:uuid:a DHHC-1:01:QUJDRA==:\n",
    )
    .unwrap();
    let out = flashpool(&[
        "serve",
        "--data",
        s(&data),
        "--stdio",
        "--nvme-tcp",
        "127.0.0.1:0",
        "--nvme-dhchap-secret",
        s(&secrets),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a bad secrets file was accepted");
    assert!(
        err.contains(&format!("{}: line 2: host secret of", secrets.display())),
        "{err}"
    );
    assert!(
        !err.contains("QUJDRA"),
        "the secret is never printed: {err}"
    );
    assert!(!data.exists(), "created the data dir");
    std::fs::write(
        &secrets,
        format!(
            "nqn.2014-08.org.nvmexpress:uuid:a {}\n",
            flashpool_nvmet::Secret::encode(&[7u8; 32], None)
        ),
    )
    .unwrap();
    let out = flashpool(&[
        "serve",
        "--data",
        s(&data),
        "--stdio",
        "--nvme-tcp",
        "127.0.0.1:0",
        "--nvme-dhchap-secret",
        s(&secrets),
        "--nvme-dhchap-dhgroup",
        "ffdhe1024",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an unknown DH group was accepted");
    assert!(
        err.contains("--nvme-dhchap-dhgroup \"ffdhe1024\": null, ffdhe2048"),
        "{err}"
    );
    assert!(!data.exists(), "created the data dir");
    let out = flashpool(&[
        "serve",
        "--data",
        s(&data),
        "--stdio",
        "--nvme-allow-host",
        "nqn.2014-08.org.nvmexpress:uuid:a",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--nvme-tcp"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!data.exists(), "created the data dir");
}

/// `serve --nvme-tls require --nvme-tls-psk FILE` as a user runs it: a plain NVMe/TCP
/// connection gets no ICResp, a TLS 1.3 connection with the host's key (the identity and TLS
/// PSK derived from the configured key as the Linux initiator's keyring holds them) gets one,
/// and a wrong key gets no session.
#[test]
fn nvme_tls_required_by_serve() {
    use flashpool_nvmet::pdu::IcReq;
    use flashpool_nvmet::ConfiguredPsk;
    use std::os::unix::fs::PermissionsExt;
    let tmp = TempDir::new("ops", "nvme-tls");
    let host = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-555555555555";
    let key = |fill: u8| ConfiguredPsk {
        transform: 1,
        key: (0..32u8).map(|i| i.wrapping_mul(7) ^ fill).collect(),
    };
    let psks = tmp.0.join("psk");
    std::fs::write(&psks, format!("{host} {}\n", key(0x5a).encode())).unwrap();
    std::fs::set_permissions(&psks, std::fs::Permissions::from_mode(0o600)).unwrap();
    let server = Server::start(
        &tmp.0.join("data"),
        &[
            "--nvme-tcp",
            "127.0.0.1:0",
            "--nvme-tls",
            "require",
            "--nvme-tls-psk",
            s(&psks),
        ],
    );
    let uri = server
        .nvme
        .clone()
        .expect("serve printed its NVMe/TCP address");
    let (addr, nqn) = uri
        .strip_prefix("nvme-tcp://")
        .and_then(|r| r.split_once('/'))
        .expect("nvme-tcp://ADDR/NQN");
    let icreq = IcReq {
        pfv: 0,
        hpda: 0,
        hdgst: false,
        ddgst: false,
        maxr2t: 0,
    }
    .encode();
    // The reply to an ICReq over `s`: its first 8 bytes, or None if the target closed.
    fn reply<S: Read + Write>(s: &mut S, icreq: &[u8]) -> Option<[u8; 8]> {
        s.write_all(icreq).ok()?;
        let mut b = [0u8; 8];
        s.read_exact(&mut b).ok().map(|_| b)
    }
    let mut plain = TcpStream::connect(addr).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    assert_eq!(
        reply(&mut plain, &icreq),
        None,
        "a plain connection was served"
    );
    let tls = |k: ConfiguredPsk| {
        let (identity, tls_key) = k.tls_psk(host, nqn, 1);
        let ctx = flashpool_nvmet::tls::client_context(&identity, &tls_key, k.hash()).unwrap();
        let tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        openssl::ssl::Ssl::new(&ctx).unwrap().connect(tcp)
    };
    let mut good = tls(key(0x5a)).expect("TLS handshake with the host's key");
    let r = reply(&mut good, &icreq).expect("an ICResp over TLS");
    assert_eq!(r[0], 0x01, "ICResp PDU type: {r:?}");
    // OpenSSL's client may finish its side of the handshake before the server's refusal
    // arrives: then the first read finds the connection closed.
    let refused = match tls(key(0x33)) {
        Err(_) => true,
        Ok(mut s) => reply(&mut s, &icreq).is_none(),
    };
    assert!(refused, "a wrong key was served");
    server.stop();
}

/// `--read-poll-us` with reactors is served, with a warning at start that the polling has no
/// effect there (reactors may come from FLASHPOOL_NBD_REACTORS, the polling from a config file:
/// not refused); with a thread per connection, no such warning.
#[test]
fn read_polling_with_reactors_is_warned_about() {
    for (args, warned) in [
        (&["--nbd-reactors", "1", "--read-poll-us", "100"][..], true),
        (&["--nbd-reactors", "0", "--read-poll-us", "100"][..], false),
    ] {
        let tmp = TempDir::new("ops", "read-poll-reactors");
        let srv = Server::start(&tmp.0.join("data"), args);
        let said = srv
            .startup
            .iter()
            .any(|l| l.contains("read-poll-us has no effect with nbd-reactors"));
        assert_eq!(said, warned, "{args:?}: {:#?}", srv.startup);
        let mut c = Nbd::connect(&srv.nbd, "default").unwrap();
        c.write(0, &[7u8; 4096]);
        assert_eq!(c.read(0, 4096), vec![7u8; 4096]);
        c.disconnect();
        srv.stop();
    }
}
