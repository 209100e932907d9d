//! The admin socket of a running server: `DIR/admin.sock`, one text command per connection,
//! one JSON answer. It lets `flashpool drive` and `flashpool status` act on a pool that a
//! `flashpool serve` holds (the data dir lock keeps them from opening it themselves).
//!
//! Commands: `status` (pool, drives, counters, rebuild progress), `add` (a new file drive in
//! the data dir joins the pool), `fail N` (take drive N out of service; the server's cleaner
//! thread rebuilds after its grace delay), `remove N` (fail it and rebuild now), `readmit N`
//! (put a failed drive that has not been rebuilt back in service).

use anyhow::{bail, Context, Result};
use flashpool_engine::Pool;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Path of the admin socket of a data dir.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("admin.sock")
}

/// The pool's state as JSON.
pub fn status_json(pool: &Pool) -> serde_json::Value {
    let info = pool.info();
    let stats = pool.stats();
    let rb = pool.rebuild_status();
    let host = stats.host_write_bytes.max(1) as f64;
    // Segments holding data by the cleaner's measure, in tenths: where its next victims are.
    let mut tenths = [0u64; 10];
    let mut unknown_space = 0;
    for s in pool.segments() {
        if let Some(u) = s.utilisation {
            tenths[((u * 10.0) as usize).min(9)] += 1;
            unknown_space += u64::from(s.written_bytes.is_none());
        }
    }
    serde_json::json!({
        "pool": {
            "uuid": info.uuid, "k": info.k, "m": info.m, "drives": info.drive_count,
            "healthy_drives": info.healthy_drives, "segments": info.segment_count,
            "free_segments": info.free_segments, "capacity_bytes": info.capacity_bytes,
            "live_bytes": info.live_bytes,
        },
        "segment_utilisation": { "tenths": tenths, "unknown_space": unknown_space },
        "drives": pool.drives().iter().map(|d| serde_json::json!({
            "index": d.index, "state": d.state, "identity": d.identity,
        })).collect::<Vec<_>>(),
        "volumes": pool.volumes().iter().map(|v| serde_json::json!({
            "name": v.name, "size": v.size, "compression": format!("{:?}", v.compression).to_lowercase(),
            "compression_ratio": v.compression_ratio, "map_bytes": v.map_bytes,
        })).collect::<Vec<_>>(),
        "write_amplification": {
            "total": stats.write_amplification(),
            "gc": stats.gc_relocated_bytes as f64 / host,
            "parity": stats.media_parity_bytes as f64 / host,
            "metadata": stats.media_metadata_bytes as f64 / host,
            "padding": stats.media_padding_bytes as f64 / host,
        },
        "rebuild": {
            "needed": pool.needs_rebuild(), "running": rb.running, "percent": rb.percent(),
            "moved_bytes": rb.moved_bytes, "bytes_per_sec": rb.rate(),
            "eta_secs": if rb.eta_secs().is_finite() { serde_json::json!(rb.eta_secs()) } else { serde_json::Value::Null },
        },
        "counters": stats.fields().into_iter().collect::<std::collections::BTreeMap<_, _>>(),
    })
}

fn answer(pool: &Pool, dir: &Path, line: &str) -> serde_json::Value {
    let words: Vec<&str> = line.split_whitespace().collect();
    let drive = |w: Option<&&str>| -> Result<usize> {
        w.context("missing drive index")?
            .parse::<usize>()
            .context("drive index must be a number")
    };
    let result: Result<serde_json::Value> = match words.first().copied() {
        Some("status") => Ok(status_json(pool)),
        Some("fail") => drive(words.get(1)).and_then(|i| {
            pool.fail_drive(i)?;
            Ok(serde_json::json!({"ok": format!("drive {i} taken out of service; rebuild starts")}))
        }),
        Some("add") => crate::datadir::add_drive_online(dir, pool).map(|path| {
            let info = pool.info();
            serde_json::json!({"ok": format!(
                "drive {} added: {} drives, stripes {}+{}, capacity {} MiB",
                path.display(), info.drive_count, info.k, info.m, info.capacity_bytes >> 20
            )})
        }),
        Some("remove") => drive(words.get(1)).and_then(|i| {
            pool.fail_drive(i)?;
            let st = pool.rebuild()?;
            Ok(serde_json::json!({"ok": format!(
                "drive {i} removed: {} segments ({} MiB) rebuilt onto the other drives in {:.1} s",
                st.total_segments, st.moved_bytes >> 20, st.elapsed_secs
            )}))
        }),
        Some("readmit") => drive(words.get(1)).and_then(|i| {
            pool.readmit_drive(i)?;
            Ok(serde_json::json!({"ok": format!("drive {i} back in service")}))
        }),
        _ => Err(anyhow::anyhow!(
            "unknown command {line:?}: status, add, fail N, remove N or readmit N"
        )),
    };
    result.unwrap_or_else(|e| serde_json::json!({"error": format!("{e:#}")}))
}

/// Serves the admin socket until `stop` is set (checked between connections).
pub fn spawn(dir: &Path, pool: Arc<Pool>) -> Result<PathBuf> {
    let path = socket_path(dir);
    let _ = std::fs::remove_file(&path); // the data dir lock says no other server owns it
    let listener =
        UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
    let dir = dir.to_owned();
    std::thread::Builder::new()
        .name("admin".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                let mut line = String::new();
                // At most 256 bytes of command: anything longer is not one of ours.
                if BufReader::new((&conn).take(256))
                    .read_line(&mut line)
                    .is_err()
                {
                    continue;
                }
                let reply = answer(&pool, &dir, line.trim());
                let _ = (&conn).write_all(format!("{reply}\n").as_bytes());
            }
        })?;
    Ok(path)
}

/// Sends one command to the server holding `dir`; returns its JSON answer.
pub fn request(dir: &Path, command: &str) -> Result<serde_json::Value> {
    let path = socket_path(dir);
    let mut s = UnixStream::connect(&path).with_context(|| {
        format!(
            "{} is in use but its server's admin socket does not answer",
            dir.display()
        )
    })?;
    s.set_read_timeout(Some(Duration::from_secs(600)))?;
    writeln!(s, "{command}")?;
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply)?;
    let v: serde_json::Value =
        serde_json::from_str(&reply).context("bad answer from the server")?;
    if let Some(e) = v.get("error") {
        bail!("{}", e.as_str().unwrap_or("error"));
    }
    Ok(v)
}

/// True when a server holding `dir` answers on its admin socket.
pub fn server_running(dir: &Path) -> bool {
    UnixStream::connect(socket_path(dir)).is_ok()
}
