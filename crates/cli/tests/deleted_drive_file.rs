//! A drive file deleted while the server runs, as an operator meets it: the open file goes on
//! serving, so nothing failed and nothing said so, and the next start found the member
//! missing. Now the server names it (status text and JSON, the protection summary, the
//! `flashpool_drives_unlinked` gauge, the log) while a writer runs, the advice it gives
//! (`drive replace N PATH`) works on the live server and lets go of the deleted file, and the
//! pool restarts whole with its data.

mod common;

use common::{flashpool, ok, ok_stdout, random, s, Nbd, Server, TempDir};
use serde_json::Value;
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

fn status(data: &Path) -> Value {
    let out = flashpool(&["status", "--data", s(data), "--json"]);
    serde_json::from_str(&ok_stdout("status --json", &out)).unwrap()
}

/// The value of an unlabelled metric in a scrape of `addr`.
fn metric(addr: &str, name: &str) -> f64 {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(c, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// Drive files this process holds open though they were deleted.
fn deleted_files_held(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.display().to_string())
        .filter(|p| p.contains("drive-") && p.ends_with("(deleted)"))
        .collect()
}

#[test]
fn a_deleted_drive_file_is_named_and_replaced_before_a_restart_loses_it() {
    let t = TempDir::new("deleted-drive", "replace");
    let data = t.0.join("data");
    let srv = Server::start(
        &data,
        &["--rebuild-delay", "100000", "--metrics", "127.0.0.1:0"],
    );
    let metrics = srv.metrics.clone().unwrap();
    let len = 8 << 20;
    let mut c = Nbd::connect(&srv.nbd, "default").unwrap();
    c.write_all(0, &random(1, len));
    c.flush();
    assert_eq!(status(&data)["protection"]["failures_tolerated"], 1);
    assert_eq!(metric(&metrics, "flashpool_drives_unlinked"), 0.0);

    let victim = data.join("drives").join("drive-2.img");
    std::fs::remove_file(&victim).unwrap();
    // A writer keeps going: the deleted file takes its chunks as before.
    c.write_all(len as u64, &random(2, len));
    c.flush();
    let st = status(&data);
    assert_eq!(st["unlinked_members"], serde_json::json!([2]), "{st:#}");
    let p = &st["protection"];
    assert_eq!(p["members_unlinked"], 1, "{p}");
    assert_eq!(p["failures_tolerated"], 0, "{p}");
    let summary = p["summary"].as_str().unwrap();
    assert!(
        summary.contains("one member's drive file deleted (missing after a restart)")
            && summary.contains("no further failure tolerated"),
        "{summary}"
    );
    assert_eq!(st["drives"][2]["state"], "active", "it still serves");
    let text = ok("status", &flashpool(&["status", "--data", s(&data)]));
    assert!(
        text.contains("DELETED: the drive file of member(s) 2") && text.contains("drive replace"),
        "{text}"
    );
    assert_eq!(metric(&metrics, "flashpool_drives_unlinked"), 1.0);
    assert_eq!(metric(&metrics, "flashpool_failures_tolerated"), 0.0);
    // The log names it at error level (the cleaner looks every 200 ms).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut named = 0;
    while Instant::now() < deadline && named == 0 {
        named += srv
            .log
            .recv_timeout(Duration::from_millis(200))
            .into_iter()
            .filter(|l| l.contains("ERROR") && l.contains("drive file was deleted"))
            .count();
    }
    assert!(named > 0, "the log names the deleted drive file");
    let pid = srv.child.id();
    assert_eq!(deleted_files_held(pid).len(), 1);

    // The advice works on the live server, with the client connected.
    let new = t.0.join("new-drive.img");
    let out = flashpool(&["drive", "--data", s(&data), "replace", "2", s(&new)]);
    let said = ok("drive replace", &out);
    assert!(said.contains("member 2 replaced"), "{said}");
    let st = status(&data);
    assert_eq!(st["unlinked_members"], serde_json::json!([]), "{st:#}");
    assert_eq!(st["protection"]["failures_tolerated"], 1, "{st:#}");
    assert_eq!(metric(&metrics, "flashpool_drives_unlinked"), 0.0);
    assert!(
        deleted_files_held(pid).is_empty(),
        "the deleted file is let go once its member is replaced: {:?}",
        deleted_files_held(pid)
    );
    assert!(
        c.read_all(0, len) == random(1, len),
        "data before the delete"
    );
    assert!(
        c.read_all(len as u64, len) == random(2, len),
        "data written after the delete"
    );
    c.disconnect();
    srv.stop();

    // The restart finds every member (the new one by its superblock) and all the data.
    let srv = Server::start(&data, &["--rebuild-delay", "100000"]);
    let st = status(&data);
    let states: Vec<&str> = st["drives"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["state"].as_str().unwrap())
        .collect();
    assert!(
        !states.contains(&"missing") && !states.contains(&"failed"),
        "{st:#}"
    );
    assert_eq!(st["protection"]["failures_tolerated"], 1, "{st:#}");
    let mut c = Nbd::connect(&srv.nbd, "default").unwrap();
    assert!(c.read_all(0, len) == random(1, len), "after the restart");
    assert!(
        c.read_all(len as u64, len) == random(2, len),
        "after the restart"
    );
    c.disconnect();
    srv.stop();
}
