//! Pool membership as a user meets it, against the real `flashpool` binary: members are found
//! by the UUIDs in their superblocks, whatever their names, order or place; a missing, damaged
//! or replaced member opens degraded and is named; more members missing than parity covers is
//! refused, listing what is present and missing, with nothing written; a data dir holding any
//! drive is never re-created (the data loss of issue 14: with `drive-0.img` gone, `serve` used
//! to create an empty pool over the other four files).
//!
//! The pool is created by `flashpool serve --stdio` (which opens or creates, serves one
//! connection on stdin, here none, and closes cleanly) and filled through the engine; every
//! check of the data afterwards opens the surviving files read-only with the engine.

mod common;

use common::{flashpool, ok, refused, s, TempDir};
use flashpool_engine::drive::{DriveRef, FileDrive};
use flashpool_engine::{OpenOptions, Pool};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

/// `flashpool serve --stdio` with no client: opens (or creates) the pool, then closes it.
fn serve_once(data: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["serve", "--data", s(data), "--stdio"];
    args.extend_from_slice(extra);
    flashpool(&args)
}

fn status_json(data: &Path) -> serde_json::Value {
    let out = flashpool(&["status", "--data", s(data), "--json"]);
    ok("status --json", &out);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "status --json: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn drives_dir(data: &Path) -> PathBuf {
    data.join("drives")
}

fn drive(data: &Path, i: usize) -> PathBuf {
    drives_dir(data).join(format!("drive-{i}.img"))
}

/// Every file in the drives dir, sorted.
fn drive_files(data: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(drives_dir(data))
        .map(|rd| rd.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// CRC32C of every file in the drives dir.
fn checksums(data: &Path) -> Vec<(PathBuf, u32)> {
    drive_files(data)
        .into_iter()
        .map(|p| {
            let c = flashpool_engine::crc::checksum(&std::fs::read(&p).unwrap());
            (p, c)
        })
        .collect()
}

fn block(seed: u64) -> Vec<u8> {
    (0..4096u64)
        .map(|i| (seed.wrapping_mul(0x9E37_79B9).wrapping_add(i * 13) >> 5) as u8)
        .collect()
}

const BLOCKS: u64 = 300;

fn open_files(paths: &[PathBuf], read_only: bool) -> flashpool_engine::Result<Pool> {
    let drives: Vec<DriveRef> = paths
        .iter()
        .map(|p| Arc::new(FileDrive::open(p).unwrap()) as DriveRef)
        .collect();
    Pool::open_with(
        drives,
        &OpenOptions {
            read_only,
            ..OpenOptions::default()
        },
    )
}

/// A 4+1 pool of five 48 MiB files made by `serve`, holding `BLOCKS` blocks of data.
fn make_pool(data: &Path, seed: u64, extra: &[&str]) {
    let mut args = vec!["--drive-size", "48M", "--volume-size", "16M"];
    args.extend_from_slice(extra);
    ok("create", &serve_once(data, &args));
    let pool = open_files(&drive_files(data), false).unwrap();
    let v = pool.volume("default").unwrap();
    for i in 0..BLOCKS {
        v.write(i * 4096 * 3 % (16 << 20), &block(seed + i))
            .unwrap();
    }
    pool.close().unwrap();
}

/// Opens `paths` read-only with the engine and checks every block `make_pool` wrote.
fn data_intact(case: &str, paths: &[PathBuf], seed: u64) {
    let pool =
        open_files(paths, true).unwrap_or_else(|e| panic!("{case}: pool does not open: {e}"));
    let v = pool.volume("default").unwrap();
    let mut b = vec![0u8; 4096];
    for i in 0..BLOCKS {
        v.read(i * 4096 * 3 % (16 << 20), &mut b).unwrap();
        assert!(b == block(seed + i), "{case}: block {i} differs");
    }
}

fn pool_uuid(data: &Path) -> String {
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("members.json")).unwrap()).unwrap();
    r["pool"].as_str().unwrap().to_string()
}

#[test]
fn removing_any_one_drive_opens_degraded_and_never_recreates() {
    let t = TempDir::new("members", "one");
    for gone in 0..5 {
        let data = t.0.join(format!("d{gone}"));
        make_pool(&data, gone as u64 * 1000, &["--sparse"]);
        let uuid = pool_uuid(&data);
        let moved = t.0.join(format!("gone-{gone}.img"));
        std::fs::rename(drive(&data, gone), &moved).unwrap();
        let before = checksums(&data);
        // Read-only commands answer, degraded, and write nothing.
        let st = status_json(&data);
        assert_eq!(st["protection"]["members_down"], 1, "{st}");
        let summary = st["protection"]["summary"].as_str().unwrap();
        assert!(
            summary.contains("no further failure tolerated"),
            "{summary}"
        );
        assert_eq!(st["drives"][gone]["state"], "missing", "{st}");
        let seen = st["drives"][gone]["last_seen"].as_str().unwrap();
        assert!(seen.ends_with(&format!("drive-{gone}.img")), "{seen}");
        ok(
            "volume list",
            &flashpool(&["volume", "list", "--data", s(&data)]),
        );
        ok(
            "drive list",
            &flashpool(&["drive", "list", "--data", s(&data)]),
        );
        assert_eq!(
            checksums(&data),
            before,
            "drive {gone} gone: a read-only command wrote"
        );
        // serve opens degraded (it writes a checkpoint) and never makes a new pool.
        let out = ok("serve degraded", &serve_once(&data, &[]));
        assert!(
            out.contains(&format!("member {gone}")),
            "no warning names member {gone}: {out}"
        );
        assert_eq!(
            pool_uuid(&data),
            uuid,
            "drive {gone} gone: the pool was re-created"
        );
        assert_eq!(
            drive_files(&data).len(),
            4,
            "drive {gone} gone: drive files were created"
        );
        data_intact(
            &format!("drive {gone} gone"),
            &drive_files(&data),
            gone as u64 * 1000,
        );
        // The member comes back before anything rebuilt it: it is stale (it missed the
        // degraded open's updates) and is left alone; the pool stays degraded, data intact.
        std::fs::rename(&moved, drive(&data, gone)).unwrap();
        let st = status_json(&data);
        let not = st["not_members"].as_array().unwrap();
        assert!(
            not.iter().any(|n| n["identity"]
                .as_str()
                .unwrap()
                .ends_with(&format!("drive-{gone}.img"))
                && n["kind"] == "stale"),
            "{st}"
        );
        assert_eq!(st["drives"][gone]["state"], "missing", "{st}");
        std::fs::remove_dir_all(&data).unwrap();
    }
}

#[test]
fn all_but_one_gone_is_refused_and_touches_nothing() {
    let t = TempDir::new("members", "all");
    let data = t.0.join("d");
    make_pool(&data, 7, &["--sparse"]);
    let uuid = pool_uuid(&data);
    for i in 1..5 {
        std::fs::rename(drive(&data, i), t.0.join(format!("x{i}"))).unwrap();
    }
    let before = checksums(&data);
    let record = std::fs::read(data.join("members.json")).unwrap();
    for args in [
        vec!["serve", "--data", s(&data), "--stdio"],
        vec!["status", "--data", s(&data)],
        vec!["volume", "create", "x", "1M", "--data", s(&data)],
    ] {
        let err = refused(
            &format!("{args:?}"),
            &flashpool(&args),
            &["refusing", "4 of 5 members missing"],
            &[],
        );
        for i in 1..5 {
            assert!(err.contains(&format!("drive-{i}.img")), "{err}");
        }
    }
    assert_eq!(
        checksums(&data),
        before,
        "a refused open wrote to the surviving drive"
    );
    assert_eq!(std::fs::read(data.join("members.json")).unwrap(), record);
    assert_eq!(pool_uuid(&data), uuid);
    // Put back: opens cleanly with every byte.
    for i in 1..5 {
        std::fs::rename(t.0.join(format!("x{i}")), drive(&data, i)).unwrap();
    }
    ok("serve after put back", &serve_once(&data, &[]));
    data_intact("all back", &drive_files(&data), 7);
    // Every drive removed: refused too, never re-created.
    for p in drive_files(&data) {
        std::fs::remove_file(p).unwrap();
    }
    refused(
        "no drives",
        &serve_once(&data, &[]),
        &["no drive of pool", "refusing"],
        &[],
    );
    assert!(
        drive_files(&data).is_empty(),
        "a pool was created over the empty drives dir"
    );
}

#[test]
fn two_missing_on_4_plus_1_refused_then_one_put_back_opens() {
    let t = TempDir::new("members", "two");
    let data = t.0.join("d");
    make_pool(&data, 9, &["--sparse"]);
    std::fs::rename(drive(&data, 1), t.0.join("x1")).unwrap();
    std::fs::rename(drive(&data, 3), t.0.join("x3")).unwrap();
    let err = refused(
        "two missing",
        &serve_once(&data, &[]),
        &[
            "2 of 5 members missing",
            "parity covers 1",
            "nothing was written",
            "present: member 0",
        ],
        &[],
    );
    assert!(
        err.contains("missing: member 1") && err.contains("missing: member 3"),
        "{err}"
    );
    std::fs::rename(t.0.join("x3"), drive(&data, 3)).unwrap();
    ok("one put back", &serve_once(&data, &[]));
    data_intact("one put back", &drive_files(&data), 9);
}

#[test]
fn renamed_shuffled_and_moved_members_are_the_same_members() {
    let t = TempDir::new("members", "rename");
    let data = t.0.join("d");
    make_pool(&data, 11, &["--sparse"]);
    let before = status_json(&data);
    // Reverse the names, and rename one to something else entirely.
    let tmp: Vec<PathBuf> = (0..5)
        .map(|i| drives_dir(&data).join(format!("t{i}")))
        .collect();
    for (i, t) in tmp.iter().enumerate() {
        std::fs::rename(drive(&data, i), t).unwrap();
    }
    for (i, t) in tmp.iter().enumerate() {
        std::fs::rename(t, drive(&data, 4 - i)).unwrap();
    }
    std::fs::rename(drive(&data, 2), drives_dir(&data).join("spare.bin")).unwrap();
    // One member moves out of the data dir, found through a search glob.
    let elsewhere = t.0.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::rename(drive(&data, 0), elsewhere.join("nvme-foo")).unwrap();
    let st = status_json(&data);
    assert_eq!(
        st["protection"]["members_down"], 1,
        "moved member not found yet: {st}"
    );
    let glob = format!("{}/*", elsewhere.display());
    ok(
        "serve with search",
        &serve_once(&data, &["--search", &glob]),
    );
    let after = status_json(&data);
    assert_eq!(after["protection"]["members_down"], 0, "{after}");
    for i in 0..5 {
        assert_eq!(before["drives"][i]["uuid"], after["drives"][i]["uuid"]);
        assert_eq!(after["drives"][i]["state"], "active");
    }
    assert_eq!(
        after["drives"][4]["identity"].as_str().unwrap(),
        s(&elsewhere.join("nvme-foo"))
    );
    assert!(after["drives"][2]["identity"]
        .as_str()
        .unwrap()
        .ends_with("spare.bin"));
    // The record keeps the search path and the new places: a plain open finds everything.
    let st = status_json(&data);
    assert_eq!(st["protection"]["members_down"], 0, "{st}");
    let mut paths = drive_files(&data);
    paths.push(elsewhere.join("nvme-foo"));
    data_intact("renamed", &paths, 11);
}

#[test]
fn foreign_stale_truncated_and_blank_drives_are_named_not_taken() {
    let t = TempDir::new("members", "strangers");
    let data = t.0.join("d");
    let other = t.0.join("other");
    make_pool(&data, 13, &["--sparse"]);
    make_pool(&other, 14, &["--sparse"]);
    // A stale copy of member 1: taken now, left behind by two opens.
    std::fs::copy(drive(&data, 1), t.0.join("old-1.img")).unwrap();
    ok("open", &serve_once(&data, &[]));
    ok("open", &serve_once(&data, &[]));
    std::fs::copy(t.0.join("old-1.img"), drives_dir(&data).join("old-1.img")).unwrap();
    // Another pool's drive copied over member 2.
    std::fs::copy(drive(&other, 0), drive(&data, 2)).unwrap();
    let st = status_json(&data);
    let not = st["not_members"].as_array().unwrap().clone();
    let kind_of = |name: &str| {
        not.iter()
            .find(|n| n["identity"].as_str().unwrap().ends_with(name))
            .map(|n| n["kind"].as_str().unwrap().to_string())
    };
    assert_eq!(kind_of("drive-2.img").as_deref(), Some("foreign"), "{st}");
    assert_eq!(kind_of("old-1.img").as_deref(), Some("stale"), "{st}");
    assert_eq!(
        kind_of("drive-0.img"),
        None,
        "a healthy member was blamed: {st}"
    );
    assert_eq!(st["drives"][2]["state"], "missing");
    assert_eq!(st["drives"][1]["state"], "active");
    assert!(st["drives"][1]["identity"]
        .as_str()
        .unwrap()
        .ends_with("drive-1.img"));
    // Two down (foreign over 2, and 4 truncated): refused, naming both the right way.
    std::fs::OpenOptions::new()
        .write(true)
        .open(drive(&data, 4))
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let err = refused(
        "foreign + truncated",
        &serve_once(&data, &[]),
        &["2 of 5 members missing"],
        &[],
    );
    assert!(err.contains("belongs to another pool"), "{err}");
    assert!(err.contains("damaged"), "{err}");
    // A blank file in the drives dir is named as holding no superblock (the pool still cannot
    // open: member 2 is gone and member 4 truncated).
    std::fs::remove_file(drive(&data, 2)).unwrap();
    let blank = drives_dir(&data).join("blank.img");
    std::fs::write(&blank, vec![0u8; 1 << 20]).unwrap();
    let out = flashpool(&["status", "--data", s(&data)]);
    let st = refused("2 and 4 down", &out, &["2 of 5 members missing"], &[]);
    assert!(
        st.contains("blank.img: no valid flashpool superblock"),
        "{st}"
    );
}

#[test]
fn unreadable_superblocks_make_a_missing_member_named_by_its_path() {
    let t = TempDir::new("members", "sb");
    let data = t.0.join("d");
    make_pool(&data, 15, &["--sparse"]);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(drive(&data, 3))
            .unwrap();
        f.write_all_at(&vec![0xA5u8; 8192], 0).unwrap();
    }
    let st = status_json(&data);
    assert_eq!(st["drives"][3]["state"], "missing", "{st}");
    let not = st["not_members"].as_array().unwrap();
    assert!(
        not.iter()
            .any(|n| n["identity"].as_str().unwrap().ends_with("drive-3.img")
                && n["reason"].as_str().unwrap().contains("superblock")),
        "{st}"
    );
    ok("serve", &serve_once(&data, &[]));
    let paths: Vec<PathBuf> = drive_files(&data)
        .into_iter()
        .filter(|p| !p.ends_with("drive-3.img"))
        .collect();
    data_intact("member 3 unreadable", &paths, 15);
}

/// `drive replace 2 NEW`, NEW a new file `new-2.img` beside the data dir: checks it said so,
/// member 2 retired, NEW member 5 and active, no member down; returns NEW and the status.
fn replace_member_2(t: &TempDir, data: &Path) -> (PathBuf, serde_json::Value) {
    let new = t.0.join("new-2.img");
    let out = ok(
        "replace",
        &flashpool(&["drive", "replace", "2", s(&new), "--data", s(data)]),
    );
    assert!(out.contains("member 2 replaced"), "{out}");
    let st = status_json(data);
    assert_eq!(st["drives"][2]["state"], "retired", "{st}");
    assert_eq!(st["drives"][5]["state"], "active", "{st}");
    assert_eq!(st["protection"]["members_down"], 0, "{st}");
    (new, st)
}

/// The members' files after `replace_member_2`: those left in the drives dir, less the
/// replaced `drive-2.img` (which a test may have put back), and NEW.
fn files_after_replacing_2(data: &Path, new: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = drive_files(data)
        .into_iter()
        .filter(|p| !p.ends_with("drive-2.img"))
        .collect();
    paths.push(new.to_path_buf());
    paths
}

#[test]
fn replace_rebuilds_and_the_pool_survives_another_loss() {
    let t = TempDir::new("members", "replace");
    let data = t.0.join("d");
    make_pool(&data, 17, &[]);
    std::fs::rename(drive(&data, 2), t.0.join("old-2.img")).unwrap();
    let (new, st) = replace_member_2(&t, &data);
    assert_eq!(st["drives"][5]["identity"].as_str().unwrap(), s(&new));
    assert_eq!(st["protection"]["failures_tolerated"], 1, "{st}");
    // The replaced member comes back: recognised as retired and left alone.
    std::fs::rename(t.0.join("old-2.img"), drive(&data, 2)).unwrap();
    let st = status_json(&data);
    assert!(
        st["not_members"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["kind"] == "retired"),
        "{st}"
    );
    // Another member lost: the pool opens and every byte is there.
    std::fs::remove_file(drive(&data, 4)).unwrap();
    ok("serve after a second loss", &serve_once(&data, &[]));
    data_intact(
        "replaced, then another loss",
        &files_after_replacing_2(&data, &new),
        17,
    );
}

#[test]
fn drive_flag_creates_over_given_files_and_refuses_to_overwrite() {
    let t = TempDir::new("members", "flag");
    let data = t.0.join("d");
    let devs: Vec<PathBuf> = (0..5).map(|i| t.0.join(format!("dev{i}.img"))).collect();
    // dev3 holds an ext4 superblock's magic; dev4 another pool's drive.
    std::fs::create_dir_all(&t.0).unwrap();
    let mut ext = vec![0u8; 64 << 10];
    ext[1080] = 0x53;
    ext[1081] = 0xEF;
    std::fs::write(&devs[3], &ext).unwrap();
    let other = t.0.join("other");
    make_pool(&other, 1, &["--sparse"]);
    std::fs::copy(drive(&other, 1), &devs[4]).unwrap();
    let mut args: Vec<&str> = vec!["--drive-size", "48M", "--volume-size", "16M"];
    for d in &devs {
        args.push("--drive");
        args.push(s(d));
    }
    let err = refused(
        "ext over dev3",
        &serve_once(&data, &args),
        &["dev3.img holds an ext2 filesystem", "--force"],
        &[],
    );
    let _ = err;
    assert!(
        !devs[0].exists(),
        "a refused creation left a drive file behind"
    );
    std::fs::remove_file(&devs[3]).unwrap();
    refused(
        "pool over dev4",
        &serve_once(&data, &args),
        &["dev4.img holds a flashpool superblock"],
        &[],
    );
    args.push("--force");
    ok("forced", &serve_once(&data, &args));
    // A plain open finds the members through the record.
    let st = status_json(&data);
    assert_eq!(st["protection"]["members_down"], 0, "{st}");
    for (i, d) in devs.iter().enumerate() {
        assert_eq!(st["drives"][i]["identity"].as_str().unwrap(), s(d));
    }
    // Flags that cannot go together, and --drive against an existing pool's data dir with a
    // drive that is not a member: named, not taken.
    refused(
        "drives and drive",
        &flashpool(&["serve", "--data", s(&data), "--drives", "5", "--drive", "x"]),
        &["--drive"],
        &[],
    );
    refused(
        "bad listen",
        &flashpool(&[
            "serve",
            "--data",
            s(&t.0.join("fresh")),
            "--listen",
            "nowhere",
        ]),
        &["--listen"],
        &[],
    );
    assert!(
        !t.0.join("fresh").exists(),
        "a bad --listen created a data dir"
    );
}

/// `drive fail N` on a data dir with no server marks member N failed and rebuilds nothing,
/// as on a server: the pool stays 4+1 when whole (it once rebuilt onto the other four at
/// once, retiring N and narrowing the pool to 3+1, though the help said a rebuild comes
/// later). `drive replace N PATH` then puts a new drive in its place at full width, every
/// byte there; and `drive rebuild` after another `drive fail` is what retires a member.
#[test]
fn offline_drive_fail_rebuilds_nothing_until_asked() {
    let t = TempDir::new("members", "offline-fail");
    let data = t.0.join("d");
    make_pool(&data, 23, &[]);
    let out = ok(
        "fail",
        &flashpool(&["drive", "fail", "2", "--data", s(&data)]),
    );
    assert!(
        out.contains("drive 2 taken out of service") && out.contains("drive replace 2 PATH"),
        "{out}"
    );
    // The next open says so once: the member failed, where its drive is, and why it is set
    // aside (it used to be said four times, as "missing" and as "not a member" in the data
    // dir's report and again by the engine).
    let opened = ok("status", &flashpool(&["status", "--data", s(&data)]));
    let warned: Vec<&str> = opened
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("member 2"))
        .collect();
    assert!(
        warned.len() == 1
            && warned[0].contains("failed: member 2")
            && warned[0].contains("drive-2.img"),
        "{opened}"
    );
    // Status says it on the member's line, not again as a drive that is not a member.
    assert!(
        opened
            .lines()
            .any(|l| l.starts_with("drive  2: failed") && l.contains("set aside there"))
            && !opened.contains("not a member:"),
        "{opened}"
    );
    let st = status_json(&data);
    assert_eq!(st["drives"][2]["state"], "failed", "{st}");
    assert_eq!(st["pool"]["k"], 4, "{st}");
    assert_eq!(st["pool"]["width_now"], 3, "{st}");
    assert_eq!(st["rebuild"]["needed"], true, "{st}");
    assert_eq!(st["protection"]["members_down"], 1, "{st}");
    let (new, st) = replace_member_2(&t, &data);
    assert_eq!(st["pool"]["k"], 4, "{st}");
    assert_eq!(st["pool"]["width_now"], 4, "{st}");
    let paths = files_after_replacing_2(&data, &new);
    data_intact("failed offline, then replaced", &paths, 23);
    // Failed again offline, then rebuilt on request: retired, the pool 3+1 on four members.
    ok(
        "fail 4",
        &flashpool(&["drive", "fail", "4", "--data", s(&data)]),
    );
    assert_eq!(status_json(&data)["drives"][4]["state"], "failed");
    ok(
        "rebuild",
        &flashpool(&["drive", "rebuild", "--data", s(&data)]),
    );
    let st = status_json(&data);
    assert_eq!(st["drives"][4]["state"], "retired", "{st}");
    assert_eq!(st["pool"]["k"], 3, "{st}");
    let paths: Vec<PathBuf> = paths
        .into_iter()
        .filter(|p| !p.ends_with("drive-4.img"))
        .collect();
    data_intact("failed offline, then rebuilt", &paths, 23);
}
