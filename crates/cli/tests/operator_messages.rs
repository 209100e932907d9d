//! Mistakes an operator makes with `flashpool serve`, `status` and `volume`, against the real
//! binary: each is refused (or warned about) with a message naming the mistake, before a data
//! dir or a pool is made, never with a panic; and the `--stdio` help names the clients that
//! use it (nbdinfo's `[ ... ]` uses socket activation instead, which is checked with nbdinfo
//! where it is installed).

mod common;

use common::{flashpool, ok, refused, s, Server, TempDir};
use std::path::Path;

/// A small pool made by `serve --stdio` with no client.
fn make_pool(data: &Path) {
    ok(
        "create",
        &flashpool(&[
            "serve",
            "--data",
            s(data),
            "--stdio",
            "--drive-size",
            "16M",
            "--volume-size",
            "16M",
            "--sparse",
        ]),
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn serve_settings_are_checked_before_a_pool_is_made() {
    let t = TempDir::new("messages", "serve");
    let data = t.0.join("data");
    let d = s(&data);
    let err = refused(
        "a 1K drive",
        &flashpool(&["serve", "--data", d, "--drive-size", "1K"]),
        &["1K (1024 bytes) is too small", "8 MiB"],
        &["0 bytes", "preallocate"],
    );
    let _ = err;
    assert!(!data.exists(), "a refused --drive-size made the data dir");

    let cfg = t.0.join("flashpool.toml");
    for (value, words) in [
        (
            "-1",
            &["drive-size = -1", "a number of bytes", "\"64M\""][..],
        ),
        ("1.5", &["drive-size = 1.5", "a number of bytes"][..]),
        ("\"1K\"", &["\"1K\" (1024 bytes) is too small"][..]),
    ] {
        std::fs::write(&cfg, format!("data = \"data\"\ndrive-size = {value}\n")).unwrap();
        refused(
            &format!("config drive-size = {value}"),
            &flashpool(&["serve", "--config", s(&cfg)]),
            &[&["line 2"][..], words].concat(),
            &["did not match any variant"],
        );
    }
    assert!(!data.exists(), "a refused config made the data dir");

    let port = free_port().to_string();
    refused(
        "--metrics on the --listen port",
        &flashpool(&[
            "serve",
            "--data",
            d,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--metrics",
            &port,
        ]),
        &["--listen", "--metrics", "same port"],
        &[],
    );
    assert!(!data.exists(), "a port clash made the data dir");

    let file = t.0.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    refused(
        "--socket on a file",
        &flashpool(&[
            "serve",
            "--data",
            d,
            "--listen",
            "127.0.0.1:0",
            "--socket",
            s(&file),
        ]),
        &["--socket", "not a socket"],
        &[],
    );
    assert!(!data.exists(), "a bad --socket made the data dir");
    let other = t.0.join("other");
    let sock = t.0.join("nbd.sock");
    let srv = Server::start(&other, &["--socket", s(&sock)]);
    refused(
        "--socket another server listens on",
        &flashpool(&[
            "serve",
            "--data",
            d,
            "--listen",
            "127.0.0.1:0",
            "--socket",
            s(&sock),
        ]),
        &["--socket", "another server is listening there"],
        &[],
    );
    assert!(!data.exists(), "a busy --socket made the data dir");
    srv.stop();

    // --data naming a file: said, without suggesting `serve --data FILE`.
    for args in [
        &["status", "--data", s(&file)][..],
        &["serve", "--data", s(&file), "--stdio"][..],
        &["volume", "--data", s(&file), "list"][..],
    ] {
        refused(
            &format!("{args:?}"),
            &flashpool(args),
            &["is not a directory"],
            &["flashpool serve --data", "os error"],
        );
    }
}

#[test]
fn existing_pools_keep_their_shape_and_names_are_quoted_short() {
    let t = TempDir::new("messages", "pool");
    let data = t.0.join("data");
    make_pool(&data);
    // Shape flags on an existing pool: warned about, and the pool keeps its shape.
    let out = ok(
        "serve --ec on an existing pool",
        &flashpool(&[
            "serve",
            "--data",
            s(&data),
            "--stdio",
            "--ec",
            "2+1",
            "--drives",
            "3",
        ]),
    );
    assert!(
        out.contains("holds a pool already") && out.contains("--drives, --ec"),
        "{out}"
    );
    assert!(out.contains("keeps its shape (4+1, 5 members"), "{out}");
    let out = ok(
        "serve without shape flags",
        &flashpool(&["serve", "--data", s(&data), "--stdio"]),
    );
    assert!(!out.contains("holds a pool already"), "{out}");

    let long = "a".repeat(5000);
    let err = refused(
        "a 5000-character volume name",
        &flashpool(&["volume", "--data", s(&data), "create", &long, "1M"]),
        &["volume name", "(5000 bytes)", "255"],
        &[],
    );
    assert!(
        err.len() < 400,
        "the whole name echoed: {} bytes",
        err.len()
    );
    let err = refused(
        "a bad name, deleted",
        &flashpool(&["volume", "--data", s(&data), "delete", &long]),
        &["(5000 bytes)"],
        &[],
    );
    assert!(
        err.len() < 400,
        "the whole name echoed: {} bytes",
        err.len()
    );
}

/// `--stdio` is for clients that run the server on their stdin/stdout; nbdinfo's `[ CMD ]`
/// passes a socket (systemd socket activation), so there the server runs without it.
#[test]
fn stdio_help_names_the_right_clients() {
    let help = ok("serve --help", &flashpool(&["serve", "--help"]));
    assert!(help.contains("connect_command"), "{help}");
    assert!(help.contains("socket activation"), "{help}");
    assert!(!help.contains("[ flashpool serve --stdio ]"), "{help}");
    let t = TempDir::new("messages", "nbdinfo");
    let data = t.0.join("data");
    make_pool(&data);
    let Ok(out) = std::process::Command::new("nbdinfo")
        .args(["--size", "--", "["])
        .arg(env!("CARGO_BIN_EXE_flashpool"))
        .args(["serve", "--data", s(&data), "]"])
        .env("RUST_LOG", "warn")
        .output()
    else {
        eprintln!("SKIP: nbdinfo not installed; `nbdinfo -- [ flashpool serve ]` not run");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.trim() == (16u64 << 20).to_string(),
        "nbdinfo -- [ flashpool serve ]: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
