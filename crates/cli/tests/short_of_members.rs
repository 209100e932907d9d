//! A pool left with no more members in service than parity chunks, as a user meets it through
//! `flashpool serve`: it turns read-only (clients that connect get a read-only export, reads
//! go on), `drive readmit` puts a member back and the pool takes writes again at once, and that
//! survives a restart (docs/RELIABILITY.md finding 45: before, the readmit was never recorded
//! and the pool stayed read-only for good).

mod common;

use common::{flashpool, ok, ok_stdout, random, s, Nbd, Server, TempDir};
use flashpool_nbd::proto::FLAG_READ_ONLY;

fn block(seed: u8) -> Vec<u8> {
    (0..4096u32)
        .map(|i| (i as u8).wrapping_mul(seed) ^ seed)
        .collect()
}

#[test]
fn a_pool_short_of_members_is_read_only_until_a_member_is_readmitted() {
    let tmp = TempDir::new("short-of-members", "readmit");
    let data = tmp.0.join("data");
    let d = s(&data);
    let args = ["--ec", "2+2", "--drives", "4", "--rebuild-delay", "100000"];
    let srv = Server::start(&data, &args);
    let mut c = Nbd::connect(&srv.nbd, "").unwrap();
    assert_eq!(c.flags & FLAG_READ_ONLY, 0, "a new pool takes writes");
    for i in 0..64u64 {
        c.write(i * 4096, &block(i as u8 + 1));
    }
    c.flush();
    c.disconnect();

    // Two of four members out: a stripe needs three.
    ok(
        "drive fail 0",
        &flashpool(&["drive", "--data", d, "fail", "0"]),
    );
    ok(
        "drive fail 1",
        &flashpool(&["drive", "--data", d, "fail", "1"]),
    );
    let status = ok("status", &flashpool(&["status", "--data", d]));
    assert!(status.contains("READ-ONLY"), "{status}");
    let mut c = Nbd::connect(&srv.nbd, "").unwrap();
    assert_ne!(c.flags & FLAG_READ_ONLY, 0, "exported read-only");
    for i in 0..64u64 {
        assert!(c.read(i * 4096, 4096) == block(i as u8 + 1), "block {i}");
    }
    c.disconnect();

    let out = ok(
        "drive readmit 1",
        &flashpool(&["drive", "--data", d, "readmit", "1"]),
    );
    assert!(out.contains("back in service"), "{out}");
    let status = ok("status", &flashpool(&["status", "--data", d]));
    assert!(!status.contains("READ-ONLY"), "{status}");
    let mut c = Nbd::connect(&srv.nbd, "").unwrap();
    assert_eq!(c.flags & FLAG_READ_ONLY, 0, "writable again");
    c.write(0, &block(200));
    c.flush();
    c.disconnect();
    srv.stop();

    // The readmit was recorded: the pool opens writable, member 1 in service.
    let srv = Server::start(&data, &args);
    let status = ok("status", &flashpool(&["status", "--data", d]));
    assert!(!status.contains("READ-ONLY"), "after a restart: {status}");
    let mut c = Nbd::connect(&srv.nbd, "").unwrap();
    assert_eq!(c.flags & FLAG_READ_ONLY, 0, "writable after a restart");
    assert!(c.read(0, 4096) == block(200), "block 0 after a restart");
    for i in 1..64u64 {
        assert!(c.read(i * 4096, 4096) == block(i as u8 + 1), "block {i}");
    }
    c.disconnect();
    srv.stop();
}

/// Members down beyond parity (one failed, a second forced out), through the server: a scrub
/// cannot read what it checks, and says so (it used to report the pool clean and exit 0):
/// `flashpool scrub` exits non-zero naming the stripes and blocks out of reach and how to get
/// them back, status's last-scrub line says UNREADABLE; once a member is readmitted the scrub
/// is clean and every block reads.
#[test]
fn a_scrub_with_members_down_beyond_parity_says_what_it_cannot_read() {
    let tmp = TempDir::new("short-of-members", "scrub");
    let data = tmp.0.join("data");
    let d = s(&data);
    let srv = Server::start(&data, &["--rebuild-delay", "100000"]);
    // Incompressible: full 4+1 stripes, each on all five members.
    let len = 4 << 20;
    let data_written = random(5, len);
    let mut c = Nbd::connect(&srv.nbd, "").unwrap();
    c.write_all(0, &data_written);
    c.flush();
    c.disconnect();
    ok("scrub", &flashpool(&["scrub", "--data", d]));

    ok("fail 0", &flashpool(&["drive", "--data", d, "fail", "0"]));
    ok(
        "fail 3 --force",
        &flashpool(&["drive", "--data", d, "fail", "3", "--force"]),
    );
    let out = flashpool(&["scrub", "--data", d, "--check-only"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("could not read") && err.contains("readmit"),
        "{out:?}"
    );
    let json = flashpool(&["scrub", "--data", d, "--check-only", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(v["stripes_unavailable"].as_u64().unwrap() > 0, "{v}");
    assert!(
        v["blocks_unavailable"].as_u64().unwrap() >= (len / 4096) as u64,
        "{v}"
    );
    assert_eq!(
        v["unrecoverable"],
        serde_json::json!([]),
        "nothing is lost: {v}"
    );
    let status = ok("status", &flashpool(&["status", "--data", d]));
    assert!(
        status.contains("UNREADABLE while members are out of service"),
        "{status}"
    );

    ok(
        "readmit 3",
        &flashpool(&["drive", "--data", d, "readmit", "3"]),
    );
    let v: serde_json::Value = serde_json::from_str(&ok_stdout(
        "scrub after readmit",
        &flashpool(&["scrub", "--data", d, "--json"]),
    ))
    .unwrap();
    assert_eq!(v["stripes_unavailable"], 0, "{v}");
    let mut c = Nbd::connect(&srv.nbd, "").unwrap();
    assert!(
        c.read_all(0, len) == data_written,
        "the data after the readmit"
    );
    c.disconnect();
    srv.stop();
}
