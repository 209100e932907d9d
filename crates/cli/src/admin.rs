//! The admin socket of a running server: `DIR/admin.sock`, one text command per connection,
//! one JSON answer. It lets `flashpool drive` and `flashpool status` act on a pool that a
//! `flashpool serve` holds (the data dir lock keeps them from opening it themselves).
//!
//! Commands: `status` (pool, members, counters, rebuild progress), `add FORCE [PATH]` (a
//! drive joins the pool: PATH, or a new file in the data dir), `replace N FORCE PATH` (PATH
//! takes member N's place; N's data is rebuilt onto the pool), `fail N` (take member N out of
//! service; the server's cleaner thread rebuilds after its grace delay), `remove N` (fail it
//! and rebuild now), `readmit N` (put a failed member that has not been rebuilt back in
//! service), `rebuild` (rebuild now), `scrub [check]` (check every stripe, repair unless `check`). FORCE is 0 or 1. Each connection is served on its own
//! thread (at most `MAX_ADMIN_CONNECTIONS` at once), so `status` answers while a rebuild runs.

use anyhow::{bail, Context, Result};
use flashpool_engine::Pool;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Path of the admin socket of a data dir.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("admin.sock")
}

/// Most admin connections served at once; more are answered with an error.
const MAX_ADMIN_CONNECTIONS: usize = 8;

/// The protection left right now, in words: what the pool can still lose.
pub fn protection(k: usize, m: usize, down: usize) -> String {
    let state = match down {
        0 => "all members in service".to_string(),
        1 => "one member down".to_string(),
        n => format!("{n} members down"),
    };
    let left = match m.saturating_sub(down) {
        0 if down > m => "data unavailable".to_string(),
        0 => "no further failure tolerated".to_string(),
        1 => "tolerates 1 more failure".to_string(),
        n => format!("tolerates {n} more failures"),
    };
    format!("{k}+{m}, {state}: {left}")
}

/// The pool's state as JSON; `dir`, when given, names where missing members were last seen.
pub fn status_json(
    pool: &Pool,
    dir: Option<&Path>,
    window: Option<&crate::wa_window::WaWindow>,
) -> serde_json::Value {
    let record = dir.and_then(|d| {
        crate::datadir::record::MemberRecord::load(d)
            .ok()
            .flatten()
            .map(|r| (d.to_owned(), r))
    });
    let down = pool
        .drives()
        .iter()
        .filter(|d| d.state == "failed" || d.state == "missing")
        .count();
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
            "members": info.member_drives, "healthy_drives": info.healthy_drives,
            "width_now": info.width_now, "segments": info.segment_count,
            "free_segments": info.free_segments, "capacity_bytes": info.capacity_bytes,
            "capacity_now_bytes": info.capacity_now_bytes, "live_bytes": info.live_bytes,
            "live_limit_bytes": info.live_limit_bytes,
        },
        "segment_utilisation": { "tenths": tenths, "unknown_space": unknown_space },
        "protection": {
            "k": info.k, "m": info.m, "members_down": down,
            "failures_tolerated": info.m.saturating_sub(down),
            "summary": protection(info.k, info.m, down),
        },
        "drives": pool.drives().iter().zip(pool.drive_failures()).map(|(d, f)| serde_json::json!({
            "index": d.index, "state": d.state, "identity": d.identity, "uuid": d.uuid,
            "failed_at_unix": f.as_ref().map(|f| f.at_unix_secs),
            "failure": f.as_ref().map(|f| f.reason.clone()),
            "last_seen": record.as_ref().and_then(|(dir, r)| r.last_seen(dir, &d.uuid)).map(|p| p.display().to_string()),
        })).collect::<Vec<_>>(),
        "not_members": pool.ignored_drives().iter().map(|i| serde_json::json!({
            "identity": i.identity, "kind": i.kind, "reason": i.reason, "claims_member": i.claims_member,
        })).collect::<Vec<_>>(),
        "volumes": pool.volumes().iter().map(|v| serde_json::json!({
            "name": v.name, "size": v.size, "compression": format!("{:?}", v.compression).to_lowercase(),
            "compression_ratio": v.compression_ratio, "map_bytes": v.map_bytes,
        })).collect::<Vec<_>>(),
        // Ratios over this server's run; none before the host wrote anything (a ratio over
        // zero host bytes means nothing).
        "write_amplification": if stats.host_write_bytes == 0 {
            serde_json::json!({"since": "start", "host_write_bytes": 0,
                "total": null, "gc": null, "parity": null, "metadata": null, "padding": null})
        } else {
            serde_json::json!({
                "since": "start", "host_write_bytes": stats.host_write_bytes,
                "total": stats.write_amplification(),
                "gc": stats.gc_relocated_bytes as f64 / host,
                "parity": stats.media_parity_bytes as f64 / host,
                "metadata": stats.media_metadata_bytes as f64 / host,
                "padding": stats.media_padding_bytes as f64 / host,
            })
        },
        "write_amplification_window": window.map_or(serde_json::Value::Null, |w| w.json(&stats)),
        "rebuild": {
            "needed": pool.needs_rebuild(), "running": rb.running,
            "state": if rb.running { "running" } else if !pool.needs_rebuild() { "idle" }
                     else if rb.last_error.is_some() { "failed" } else { "pending" },
            "last_error": rb.last_error, "failed_attempts": rb.failed_attempts,
            "percent": if rb.running || rb.total_segments > 0 { serde_json::json!(rb.percent()) } else { serde_json::Value::Null },
            "segments_done": rb.done_segments, "segments_total": rb.total_segments,
            "moved_bytes": rb.moved_bytes, "bytes_per_sec": rb.rate(),
            "eta_secs": if rb.eta_secs().is_finite() { serde_json::json!(rb.eta_secs()) } else { serde_json::Value::Null },
        },
        "scrub": pool.last_scrub().map(|r| crate::scrub::report_json(&r)),
        "repairs_pending": pool.repairs_pending(),
        "counters": stats.fields().into_iter().collect::<std::collections::BTreeMap<_, _>>(),
    })
}

fn answer(
    pool: &Pool,
    dir: &Path,
    window: &crate::wa_window::WaWindow,
    line: &str,
) -> serde_json::Value {
    let words: Vec<&str> = line.split_whitespace().collect();
    let number = |w: Option<&&str>, what: &str| -> Result<usize> {
        w.with_context(|| format!("missing {what}"))?
            .parse::<usize>()
            .with_context(|| format!("{what} must be a number"))
    };
    // The path is the rest of the line after the leading words (it may hold spaces).
    let rest_after = |n: usize| -> Option<PathBuf> {
        let mut it = line.trim_start();
        for _ in 0..n {
            it = it.trim_start();
            it = it.find(char::is_whitespace).map_or("", |i| &it[i..]);
        }
        let p = it.trim();
        (!p.is_empty()).then(|| PathBuf::from(p))
    };
    let result: Result<serde_json::Value> = match words.first().copied() {
        Some("status") => Ok(status_json(pool, Some(dir), Some(window))),
        Some("fail") => number(words.get(1), "drive index").and_then(|i| {
            if words.get(2) == Some(&"force") {
                pool.force_fail_drive(i)?;
            } else {
                pool.fail_drive(i)?;
            }
            Ok(serde_json::json!({"ok": format!(
                "drive {i} taken out of service; its data is rebuilt onto the others after the server's --rebuild-delay unless it is readmitted first"
            )}))
        }),
        Some("add") => number(words.get(1), "force flag").and_then(|force| {
            let path = crate::datadir::add_drive(dir, pool, rest_after(2).as_deref(), force == 1)?;
            let info = pool.info();
            Ok(serde_json::json!({"ok": format!(
                "drive {} added: {} members, stripes {}+{}, capacity {} MiB",
                path.display(), info.drive_count, info.k, info.m, info.capacity_bytes >> 20
            )}))
        }),
        Some("replace") => number(words.get(1), "member index").and_then(|old| {
            let force = number(words.get(2), "force flag")?;
            let path = rest_after(3).context("missing the new drive's path")?;
            let st = crate::datadir::replace_drive(dir, pool, old, &path, force == 1)?;
            Ok(serde_json::json!({"ok": format!(
                "member {old} replaced by {}: {} segments ({} MiB) rebuilt in {:.1} s",
                path.display(), st.total_segments, st.moved_bytes >> 20, st.elapsed_secs
            )}))
        }),
        Some("remove") => number(words.get(1), "drive index").and_then(|i| {
            pool.fail_drive(i)?;
            let st = pool.rebuild()?;
            Ok(serde_json::json!({"ok": format!(
                "drive {i} removed: {} segments ({} MiB) rebuilt onto the other drives in {:.1} s",
                st.total_segments, st.moved_bytes >> 20, st.elapsed_secs
            )}))
        }),
        Some("readmit") => number(words.get(1), "drive index").and_then(|i| {
            pool.readmit_drive(i)?;
            Ok(serde_json::json!({"ok": format!("drive {i} back in service")}))
        }),
        Some("scrub") => {
            let repair = words.get(1) != Some(&"check");
            pool.scrub(repair, None)
                .map(|r| crate::scrub::report_json(&r))
                .map_err(Into::into)
        }
        Some("rebuild") => {
            if pool.needs_rebuild() {
                pool.rebuild()
                    .map(|st| {
                        serde_json::json!({"ok": format!(
                            "rebuild done: {} segments, {} MiB moved in {:.1} s",
                            st.total_segments, st.moved_bytes >> 20, st.elapsed_secs
                        )})
                    })
                    .map_err(Into::into)
            } else {
                Ok(serde_json::json!({"ok": "nothing to rebuild"}))
            }
        }
        _ => Err(anyhow::anyhow!(
            "unknown command {line:?}: status, add, replace, fail N, remove N, readmit N or rebuild"
        )),
    };
    result.unwrap_or_else(|e| serde_json::json!({"error": format!("{e:#}")}))
}

/// Serves the admin socket until `stop` is set (checked between connections).
pub fn spawn(
    dir: &Path,
    pool: Arc<Pool>,
    window: Arc<crate::wa_window::WaWindow>,
) -> Result<PathBuf> {
    let path = socket_path(dir);
    let _ = std::fs::remove_file(&path); // the data dir lock says no other server owns it
    let listener =
        UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
    let dir = dir.to_owned();
    std::thread::Builder::new()
        .name("admin".into())
        .spawn(move || {
            let busy = Arc::new(AtomicUsize::new(0));
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                if busy.fetch_add(1, Ordering::SeqCst) >= MAX_ADMIN_CONNECTIONS {
                    busy.fetch_sub(1, Ordering::SeqCst);
                    let reply = serde_json::json!({"error": "the server is busy with other admin commands; try again"});
                    let _ = (&conn).write_all(format!("{reply}\n").as_bytes());
                    continue;
                }
                let (pool, dir, busy) = (pool.clone(), dir.clone(), busy.clone());
                let window = window.clone();
                let spawned = std::thread::Builder::new()
                    .name("admin-conn".into())
                    .spawn(move || {
                        serve_one(&pool, &dir, &window, conn);
                        busy.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    tracing::warn!("cannot start an admin thread; command dropped");
                }
            }
        })?;
    Ok(path)
}

/// Reads one command from `conn` and answers it.
fn serve_one(pool: &Pool, dir: &Path, window: &crate::wa_window::WaWindow, conn: UnixStream) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut line = String::new();
    // At most 4 KiB of command (a path included): anything longer is not one of ours.
    if BufReader::new((&conn).take(4096))
        .read_line(&mut line)
        .is_err()
    {
        return;
    }
    let reply = answer(pool, dir, window, line.trim());
    let _ = (&conn).write_all(format!("{reply}\n").as_bytes());
}

/// How long the CLI waits for the server's answer: status answers at once; commands that
/// rebuild (remove, replace, rebuild) run as long as the rebuild.
fn answer_timeout(command: &str) -> Duration {
    match command.split_whitespace().next() {
        Some("remove" | "replace" | "rebuild" | "scrub") => Duration::from_secs(24 * 3600),
        Some("add") => Duration::from_secs(600),
        _ => Duration::from_secs(30),
    }
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
    let wait = answer_timeout(command);
    s.set_read_timeout(Some(wait))?;
    writeln!(s, "{command}")?;
    let mut reply = String::new();
    if let Err(e) = BufReader::new(s).read_line(&mut reply) {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            bail!(
                "the server holding {} did not answer `{}` within {} s (is it hung? its log says more)",
                dir.display(),
                command.split_whitespace().next().unwrap_or(""),
                wait.as_secs()
            );
        }
        return Err(e).context("reading the server's answer");
    }
    if reply.is_empty() {
        bail!(
            "the server holding {} closed the admin connection without an answer",
            dir.display()
        );
    }
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
