//! Crashes (SIGKILL, as `kill -9`) of the real binary during pool creation and member changes,
//! at chosen moments (`FLASHPOOL_CRASH_AT`): every one must leave a data dir the next start
//! opens (or, for a creation that never finished, creates again), never one refused forever.

mod common;

use common::{flashpool, ok, refused, s, TempDir};
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// `flashpool ARGS` killed at `point`: it must have died of SIGKILL there.
fn killed_at(point: &str, args: &[&str]) {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_flashpool"))
        .args(args)
        .env("RUST_LOG", "warn")
        .env("FLASHPOOL_CRASH_AT", point)
        .stdin(Stdio::null())
        .output()
        .expect("run flashpool");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "{args:?} was to be killed at {point}: {out:?}"
    );
}

fn create_args(data: &Path) -> Vec<&str> {
    vec![
        "serve",
        "--data",
        s(data),
        "--stdio",
        "--drive-size",
        "64M",
        "--volume-size",
        "16M",
        "--sparse",
    ]
}

fn status_json(data: &Path) -> serde_json::Value {
    let out = flashpool(&["status", "--data", s(data), "--json"]);
    serde_json::from_str(&common::ok_stdout("status --json", &out)).unwrap()
}

fn states(data: &Path) -> Vec<String> {
    status_json(data)["drives"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["state"].as_str().unwrap().to_string())
        .collect()
}

/// A creation killed before any superblock, or before the pool was recorded, is created again
/// by the next start; until then other commands say what happened and what to do.
#[test]
fn an_interrupted_creation_is_created_again() {
    for point in ["create-drives", "create-record"] {
        let t = TempDir::new("crash-admin", point);
        let data = t.0.join("data");
        killed_at(point, &create_args(&data));
        assert!(
            data.join("creating.json").exists(),
            "{point}: the marker stays"
        );
        refused(
            "status after the interrupted creation",
            &flashpool(&["status", "--data", s(&data)]),
            &["never completely created", "flashpool serve --data"],
            &[],
        );
        ok(
            "serve after the interrupted creation",
            &flashpool(&create_args(&data)),
        );
        assert!(
            !data.join("creating.json").exists(),
            "{point}: marker removed"
        );
        assert_eq!(states(&data), vec!["active"; 5], "{point}");
        // A complete pool is never created over: the next start opens it.
        ok("reopen", &flashpool(&create_args(&data)));
        assert_eq!(states(&data), vec!["active"; 5], "{point}");
    }
}

/// A `drive add` or `drive replace` of a drive outside the data dir, killed after the pool
/// took the new member but before the member record named it: the next start finds it.
#[test]
fn a_new_member_outside_the_data_dir_is_found_after_a_crash() {
    let t = TempDir::new("crash-admin", "member");
    let data = t.0.join("data");
    ok("create", &flashpool(&create_args(&data)));
    let spare = t.0.join("spare-add.img");
    killed_at(
        "member-record",
        &["drive", "--data", s(&data), "add", s(&spare)],
    );
    ok(
        "serve after the killed add",
        &flashpool(&create_args(&data)),
    );
    assert_eq!(states(&data), vec!["active"; 6]);
    let rec = std::fs::read_to_string(data.join("members.json")).unwrap();
    assert!(rec.contains(s(&spare)), "{rec}");
    assert!(!rec.contains("pending"), "{rec}");

    let spare2 = t.0.join("spare-replace.img");
    killed_at(
        "member-record",
        &["drive", "--data", s(&data), "replace", "1", s(&spare2)],
    );
    ok(
        "serve after the killed replace",
        &flashpool(&create_args(&data)),
    );
    let st = states(&data);
    assert_eq!(st.len(), 7);
    assert!(st[6] == "active" && st[1] != "active", "{st:?}");
    let rec = std::fs::read_to_string(data.join("members.json")).unwrap();
    assert!(rec.contains(s(&spare2)), "{rec}");

    // The replace retried: refused, saying where the first one got to and what finishes it.
    let out = flashpool(&["drive", "--data", s(&data), "replace", "1", s(&spare2)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the retried replace: {out:?}");
    assert!(err.contains("is member 6 of this pool already"), "{err}");
    // The killed replace had rebuilt and retired member 1 before the kill; the start after it
    // found the new member.
    assert_eq!(st[1], "retired");
    assert!(err.contains("the replace is complete"), "{err}");
}

/// A `drive replace` naming a drive that joined the pool already, its old member still
/// holding data that was never moved: refused, pointing at `drive rebuild`, which finishes.
#[test]
fn a_replace_by_a_drive_that_joined_already_points_to_rebuild() {
    let t = TempDir::new("crash-admin", "joined");
    let data = t.0.join("data");
    ok("create", &flashpool(&create_args(&data)));
    std::fs::remove_file(data.join("drives").join("drive-1.img")).unwrap();
    let spare = t.0.join("spare.img");
    ok(
        "drive add",
        &flashpool(&["drive", "--data", s(&data), "add", s(&spare)]),
    );
    assert_eq!(states(&data)[1], "missing");
    let out = flashpool(&["drive", "--data", s(&data), "replace", "1", s(&spare)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the replace: {out:?}");
    assert!(
        err.contains("is member 5 of this pool already and member 1 is missing")
            && err.contains("flashpool drive rebuild"),
        "{err}"
    );
    ok(
        "drive rebuild",
        &flashpool(&["drive", "--data", s(&data), "rebuild"]),
    );
    let st = states(&data);
    assert_eq!(st[1], "retired", "{st:?}");
    assert_eq!(st[5], "active", "{st:?}");
}

/// Members missing beyond parity: the refusal says how to search for members elsewhere.
#[test]
fn a_refusal_with_members_missing_points_to_search() {
    let t = TempDir::new("crash-admin", "search");
    let data = t.0.join("data");
    ok("create", &flashpool(&create_args(&data)));
    let away = t.0.join("away");
    std::fs::create_dir_all(&away).unwrap();
    for i in [1, 3] {
        let name = format!("drive-{i}.img");
        std::fs::rename(data.join("drives").join(&name), away.join(&name)).unwrap();
    }
    refused(
        "serve with two members moved",
        &flashpool(&create_args(&data)),
        &["2 of 5 members missing", "--search"],
        &[],
    );
    let glob = format!("{}/*.img", s(&away));
    let mut args = create_args(&data);
    args.extend(["--search", &glob]);
    ok("serve --search", &flashpool(&args));
    assert_eq!(states(&data), vec!["active"; 5]);
}
