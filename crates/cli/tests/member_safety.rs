//! Member changes that would cost the pool data or redundancy, refused by the real binary,
//! online (through the running server's admin socket) and offline, with the pool intact
//! afterwards (its data read back over NBD, a scrub finding nothing wrong):
//!
//! - `drive add --force` / `drive replace N --force` naming one of the pool's own members, by
//!   its path, another spelling, a symlink, a hard link, or a copy of its superblock (before,
//!   a live member was added as a new one and overwritten: a scrub then found over a thousand
//!   bad chunks, and on a degraded pool data was lost). A retired member's drive may be
//!   reused.
//! - `drive remove` when the live data would not fit the members left, or would pass the
//!   rebuild reserve's limit on them, or fewer than m + 2 members would stay in service, or
//!   another member is down: refused before the member is touched (before, a remove that did
//!   not fit left the member failed, silently, and the pool without redundancy; one past the
//!   reserve left `status` claiming a lost member "can always be rebuilt").
//!
//! Geometry (see tests/status_fields.rs): 64 MiB drives get 2 MiB segments and 32 KiB chunks;
//! on five 4+1 members the reserve's limit is 103 MiB, on four (3+1 stripes after a remove)
//! 69 MiB; four members hold 103 MiB, three 69 MiB.

mod common;

use common::{flashpool, ok, ok_stdout, random, refused, s, Nbd, Server, TempDir};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

const MIB: u64 = 1 << 20;

fn drive(data: &Path, args: &[&str]) -> Output {
    let mut v = vec!["drive", "--data", s(data)];
    v.extend_from_slice(args);
    flashpool(&v)
}

fn status(data: &Path) -> Value {
    let out = flashpool(&["status", "--data", s(data), "--json"]);
    serde_json::from_str(&ok_stdout("status --json", &out)).unwrap()
}

fn status_text(data: &Path) -> String {
    ok("status", &flashpool(&["status", "--data", s(data)]))
}

fn states(data: &Path) -> Vec<String> {
    status(data)["drives"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["state"].as_str().unwrap().to_string())
        .collect()
}

fn drive_file(data: &Path, i: usize) -> PathBuf {
    data.join("drives").join(format!("drive-{i}.img"))
}

/// A 4+1 pool of five 64 MiB drive files with a `default` volume of `volume` (created by
/// `serve --stdio` with no client).
fn make_pool(data: &Path, volume: &str) {
    ok(
        "create",
        &flashpool(&[
            "serve",
            "--data",
            s(data),
            "--stdio",
            "--drive-size",
            "64M",
            "--volume-size",
            volume,
            "--sparse",
        ]),
    );
}

/// Writes `len` bytes of `random(seed)` at 0 of `default`.
fn write(nbd: &str, seed: u64, len: usize) {
    let mut c = Nbd::connect(nbd, "default").unwrap();
    c.write_all(0, &random(seed, len));
    c.disconnect();
}

/// Reads `default` back and checks it holds what `write` wrote.
fn intact(what: &str, nbd: &str, seed: u64, len: usize) {
    let mut c = Nbd::connect(nbd, "default").unwrap();
    assert!(
        c.read_all(0, len) == random(seed, len),
        "{what}: the data changed"
    );
    c.disconnect();
}

/// A scrub (online or offline) finds every chunk sound.
fn scrub_clean(what: &str, data: &Path) {
    let out = flashpool(&["scrub", "--data", s(data), "--check-only", "--json"]);
    let r: Value = serde_json::from_str(&ok_stdout("scrub", &out)).unwrap();
    assert_eq!(r["bad_chunks"], 0, "{what}: {r}");
    assert!(r["stripes_checked"].as_u64().unwrap() > 0, "{what}: {r}");
}

/// Every way of naming one of the pool's members as a new drive is refused, `--force` or not.
fn own_members_refused(what: &str, t: &Path, data: &Path) {
    let member = |i| drive_file(data, i);
    let link = t.join("link-to-2");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(member(2), &link).unwrap();
    let hard = t.join("hard-link-to-3");
    let _ = std::fs::remove_file(&hard);
    std::fs::hard_link(member(3), &hard).unwrap();
    let respelled = data.join("drives/../drives/./drive-1.img");
    // A copy of member 0's first 8 KiB: its superblocks name this pool and slot 0.
    let copy = t.join("copy-of-0");
    let head = std::fs::read(member(0)).unwrap()[..8192].to_vec();
    let mut img = head;
    img.resize(64 << 20, 0);
    std::fs::write(&copy, &img).unwrap();
    let never = ["added", "replaced"];
    for (case, path, index) in [
        ("the path", member(2), "member 2"),
        ("a symlink", link.clone(), "member 2"),
        ("a hard link", hard.clone(), "member 3"),
        ("another spelling", respelled.clone(), "member 1"),
        ("a copy of its superblock", copy.clone(), "member 0"),
    ] {
        refused(
            &format!("{what}: add --force, {case}"),
            &drive(data, &["add", "--force", s(&path)]),
            &[index, "of this pool", "--force"],
            &never,
        );
        refused(
            &format!("{what}: replace 4 --force, {case}"),
            &drive(data, &["replace", "4", "--force", s(&path)]),
            &[index, "of this pool", "--force"],
            &never,
        );
    }
    // Without --force too (the signature check alone would have said "--force").
    refused(
        &format!("{what}: add without --force"),
        &drive(data, &["add", s(&link)]),
        &["member 2 of this pool"],
        &never,
    );
    // The member replaced by itself.
    refused(
        &format!("{what}: replace 2 by itself"),
        &drive(data, &["replace", "2", "--force", s(&link)]),
        &["member 2 of this pool"],
        &never,
    );
    assert_eq!(states(data), vec!["active"; 5], "{what}");
}

const TOKEN: &str = "0123456789abcdef-test-token";

/// One authorised HTTP/1.0 POST to the admin API; returns status and body.
fn post(addr: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(
        c,
        "POST {path} HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, body.to_string())
}

#[test]
fn own_members_are_never_taken_as_new_drives() {
    let t = TempDir::new("member-safety", "own");
    let data = t.0.join("data");
    make_pool(&data, "32M");
    let len = 24 << 20;
    let tok = t.0.join("api-token");
    std::fs::write(&tok, format!("{TOKEN}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(0o600)).unwrap();
    let srv = Server::start(
        &data,
        &[
            "--rebuild-delay",
            "100000",
            "--api",
            "127.0.0.1:0",
            "--api-token-file",
            s(&tok),
        ],
    );
    write(&srv.nbd, 7, len);
    own_members_refused("online", &t.0, &data);
    // The HTTP API: a conflict (409), not a server error.
    let api = srv.api.clone().unwrap();
    let body = format!(r#"{{"path":"{}","force":true}}"#, s(&drive_file(&data, 2)));
    let (code, answer) = post(&api, "/api/v1/drives", &body);
    assert_eq!(code, 409, "{answer}");
    assert!(answer.contains("member 2 of this pool"), "{answer}");
    let (code, answer) = post(&api, "/api/v1/drives/4/replace", &body);
    assert_eq!(code, 409, "{answer}");
    assert_eq!(states(&data), vec!["active"; 5]);
    // Degraded, where overwriting a member loses data: still refused, the failed member too.
    ok("fail 1", &drive(&data, &["fail", "1"]));
    refused(
        "online, degraded: the failed member added again",
        &drive(&data, &["add", "--force", s(&drive_file(&data, 1))]),
        &["member 1 of this pool", "failed"],
        &[],
    );
    refused(
        "online, degraded: the failed member replacing another",
        &drive(
            &data,
            &["replace", "3", "--force", s(&drive_file(&data, 1))],
        ),
        &["member 1 of this pool"],
        &[],
    );
    ok("readmit 1", &drive(&data, &["readmit", "1"]));
    let again = ok("readmit 1 again", &drive(&data, &["readmit", "1"]));
    assert!(again.contains("already in service"), "{again}");
    intact("online", &srv.nbd, 7, len);
    scrub_clean("online", &data);
    srv.stop();

    own_members_refused("offline", &t.0, &data);
    scrub_clean("offline", &data);
    // A retired member holds nothing the pool needs: its drive may be reused (--force, as it
    // holds a flashpool superblock).
    ok("remove 4", &drive(&data, &["remove", "4"]));
    refused(
        "the retired member without --force",
        &drive(&data, &["add", s(&drive_file(&data, 4))]),
        &["flashpool superblock", "--force"],
        &[],
    );
    let out = ok(
        "the retired member reused",
        &drive(&data, &["add", "--force", s(&drive_file(&data, 4))]),
    );
    assert!(out.contains("added"), "{out}");
    let st = states(&data);
    assert_eq!(st[4], "retired", "{st:?}");
    assert_eq!(st[5], "active", "{st:?}");
    let srv = Server::start(&data, &["--rebuild-delay", "100000"]);
    intact("after the reuse", &srv.nbd, 7, len);
    scrub_clean("after the reuse", &data);
    srv.stop();
}

#[test]
fn removes_the_pool_cannot_afford_are_refused_before_anything_changes() {
    let t = TempDir::new("member-safety", "remove");
    let data = t.0.join("data");
    make_pool(&data, "200M");
    // Past what four members hold under the reserve (69 MiB), within what they hold (103).
    let len = 80 << 20;
    let srv = Server::start(&data, &["--rebuild-delay", "100000"]);
    write(&srv.nbd, 11, len);
    let live = status(&data)["pool"]["live_bytes"].as_u64().unwrap();
    assert!(live > 69 * MIB && live < 103 * MIB, "live {live}");
    refused(
        "online, past the reserve",
        &drive(&data, &["remove", "4"]),
        &["member 4 cannot be removed", "rebuild reserve", "69 MiB"],
        &["drive 4 removed"],
    );
    assert_eq!(states(&data), vec!["active"; 5]);
    // Another member down: said without the engine's "force" hint (remove has no --force).
    ok("fail 0", &drive(&data, &["fail", "0"]));
    refused(
        "online, another member down",
        &drive(&data, &["remove", "4"]),
        &["2 members down", "parity covers 1"],
        &["force"],
    );
    ok("readmit 0", &drive(&data, &["readmit", "0"]));
    assert_eq!(states(&data), vec!["active"; 5]);
    srv.stop();
    refused(
        "offline, past the reserve a server keeps",
        &drive(&data, &["remove", "4"]),
        &["rebuild reserve", "--rebuild-reserve off"],
        &[],
    );
    assert_eq!(states(&data), vec!["active"; 5]);

    // Reserve off: the data fits four members, so the remove goes through; on three it
    // would not, and that remove is refused with the member left in service.
    let srv = Server::start(
        &data,
        &["--rebuild-delay", "100000", "--rebuild-reserve", "off"],
    );
    let out = ok(
        "online remove, reserve off",
        &drive(&data, &["remove", "4"]),
    );
    assert!(out.contains("drive 4 removed"), "{out}");
    refused(
        "online, does not fit three",
        &drive(&data, &["remove", "3"]),
        &["member 3 cannot be removed", "room for 69 MiB"],
        &[],
    );
    let v = status(&data);
    assert_eq!(
        states(&data),
        ["active", "active", "active", "active", "retired"]
    );
    assert_eq!(v["protection"]["members_down"], 0, "{v}");
    assert_eq!(v["protection"]["failures_tolerated"], 1, "{v}");
    intact("after the refused remove", &srv.nbd, 11, len);
    srv.stop();

    // With the reserve back on, status says the pool is past it instead of promising that a
    // lost member can always be rebuilt.
    let srv = Server::start(&data, &["--rebuild-delay", "100000"]);
    let text = status_text(&data);
    let line = text
        .lines()
        .find(|l| l.starts_with("rebuild reserve:"))
        .unwrap_or_else(|| panic!("no reserve line: {text}"));
    assert!(line.contains("OVER ITS LIMIT"), "{line}");
    assert!(!line.contains("can always be rebuilt"), "{line}");
    srv.stop();
    scrub_clean("offline, at the end", &data);
}

/// A remove that would leave fewer than m + 2 members in service is refused: the pool could
/// not take writes with one more member down.
#[test]
fn removes_leave_enough_members_to_stay_writable() {
    let t = TempDir::new("member-safety", "few");
    let data = t.0.join("data");
    ok(
        "create 2+1 on 4",
        &flashpool(&[
            "serve",
            "--data",
            s(&data),
            "--stdio",
            "--drives",
            "4",
            "--ec",
            "2+1",
            "--drive-size",
            "64M",
            "--volume-size",
            "16M",
            "--sparse",
        ]),
    );
    let srv = Server::start(&data, &["--rebuild-delay", "100000"]);
    write(&srv.nbd, 3, 4 << 20);
    let out = ok("remove 3 of 4", &drive(&data, &["remove", "3"]));
    assert!(out.contains("drive 3 removed"), "{out}");
    refused(
        "remove 2 of 3",
        &drive(&data, &["remove", "2"]),
        &["leave 2 members in service", "needs 3", "drive add"],
        &[],
    );
    refused(
        "remove the retired member",
        &drive(&data, &["remove", "3"]),
        &["retired already"],
        &[],
    );
    assert_eq!(states(&data), ["active", "active", "active", "retired"]);
    intact("after the refusals", &srv.nbd, 3, 4 << 20);
    srv.stop();
}
