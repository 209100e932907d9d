//! The admin socket of a running server: `DIR/admin.sock`, one text command per connection,
//! one JSON answer. It lets `flashpool drive` and `flashpool status` act on a pool that a
//! `flashpool serve` holds (the data dir lock keeps them from opening it themselves).
//!
//! Every operation is an [`Op`] carried out by [`execute`]; the socket's text commands
//! ([`parse_line`]) and the HTTP API (`ops/http_api.rs`) are two ways of naming one.
//!
//! Commands: `status` (pool, members, counters, rebuild progress), `drives` (members only),
//! `add FORCE [PATH]` (a drive joins the pool: PATH, or a new file in the data dir),
//! `replace N FORCE PATH` (PATH takes member N's place; N's data is rebuilt onto the pool),
//! `fail N [force]` (take member N out of service; the server's cleaner thread rebuilds after
//! its grace delay), `remove N` (fail it and rebuild now), `readmit N` (put a failed member
//! that has not been rebuilt back in service), `rebuild` (rebuild now), `rebuild
//! status|pause|resume` (automatic rebuild), `cleaner status|run [FREE]|pause|resume`,
//! `scrub [check]` (check every stripe, repair unless `check`), `volume list`, `volume show
//! NAME`, `volume create NAME SIZE [off|lz4|zstd]`, `volume resize NAME SIZE [force]`,
//! `volume compression NAME off|lz4|zstd`, `volume delete NAME`. FORCE is 0 or 1. Each
//! connection is served on its own thread (at most `MAX_ADMIN_CONNECTIONS` at once), so
//! `status` answers while a rebuild runs.

use anyhow::{bail, Context, Result};
use flashpool_engine::Pool;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Path of the admin socket of a data dir.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("admin.sock")
}

/// Most admin connections served at once; more are answered with an error.
const MAX_ADMIN_CONNECTIONS: usize = 8;

/// The protection left right now, in words: what the pool can still lose, and that it cannot
/// write with no more members in service than parity chunks (a stripe needs m + 1). `short`:
/// members in service holding stripes a chunk short (their host filesystem was full), until
/// repaired.
/// `unlinked`: members in service whose drive file was deleted while open (gone at the next
/// restart), counted against what is tolerated as the short ones are.
pub fn protection(
    k: usize,
    m: usize,
    down: usize,
    short: usize,
    unlinked: usize,
    in_service: usize,
) -> String {
    let mut state = match down {
        0 if in_service == 0 => "no members in service".to_string(),
        0 => "all members in service".to_string(),
        1 => "one member down".to_string(),
        n => format!("{n} members down"),
    };
    match short {
        0 => {}
        1 => state.push_str(
            ", one member missing chunks its full host filesystem refused (until repaired)",
        ),
        n => state.push_str(&format!(
            ", {n} members missing chunks their full host filesystems refused (until repaired)"
        )),
    }
    match unlinked {
        0 => {}
        1 => state.push_str(", one member's drive file deleted (missing after a restart)"),
        n => state.push_str(&format!(
            ", {n} members' drive files deleted (missing after a restart)"
        )),
    }
    let left = match flashpool_engine::failures_tolerated(m, down, short + unlinked, in_service) {
        _ if down > m => "data unavailable".to_string(),
        0 if down + short > m => "stripes a chunk short may be unreadable".to_string(),
        0 if down + short + unlinked > m => "a restart would leave data unavailable".to_string(),
        0 => "no further failure tolerated".to_string(),
        1 => "tolerates 1 more failure".to_string(),
        n => format!("tolerates {n} more failures"),
    };
    let writes = if in_service <= m {
        format!(
            "; read-only: {in_service} members in service, a stripe needs {}",
            m + 1
        )
    } else {
        String::new()
    };
    format!("{k}+{m}, {state}: {left}{writes}")
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
    let info = pool.info();
    let (down, in_service) = (info.members_down, info.healthy_drives);
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
            "read_only": pool.read_only_reason(),
        },
        "segment_utilisation": { "tenths": tenths, "unknown_space": unknown_space },
        "protection": {
            "k": info.k, "m": info.m, "members_down": down, "members_in_service": in_service,
            "members_short": info.members_short,
            "members_unlinked": info.members_unlinked,
            "failures_tolerated": info.failures_tolerated,
            "summary": protection(info.k, info.m, down, info.members_short, info.members_unlinked, in_service),
        },
        "drives": pool.drives().iter().zip(pool.drive_failures()).map(|(d, f)| serde_json::json!({
            "index": d.index, "state": d.state, "identity": d.identity, "uuid": d.uuid,
            "failed_at_unix": f.as_ref().map(|f| f.at_unix_secs),
            "failure": f.as_ref().map(|f| f.reason.clone()),
            "last_seen": record.as_ref().and_then(|(dir, r)| r.last_seen(dir, &d.uuid)).map(|p| p.display().to_string()),
            "media": d.media.map(|m| serde_json::json!({
                "written_bytes": m.written_bytes, "programmed_bytes": m.programmed_bytes,
                "moved_bytes": m.moved_bytes, "read_bytes": m.read_bytes,
                "discarded_bytes": m.discarded_bytes, "erases": m.erases,
                "device_waf": m.device_waf(),
                "erase_count": {"min": m.erase_min, "max": m.erase_max,
                    "mean": if m.blocks == 0 { 0.0 } else { m.erases as f64 / m.blocks as f64 }},
            })),
            "latency": d.latency.map(|l| {
                let one = |s: &flashpool_engine::drive::LatencySummary| serde_json::json!({
                    "count": s.count, "mean_us": s.mean_us, "p50_us": s.p50_us,
                    "p99_us": s.p99_us, "p999_us": s.p999_us, "max_us": s.max_us,
                });
                serde_json::json!({"read": one(&l.read), "write": one(&l.write)})
            }),
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
                "media_write_bytes": stats.media_write_bytes(),
                "gc_relocated_bytes": stats.gc_relocated_bytes,
                "total": null, "gc": null, "parity": null, "metadata": null, "padding": null})
        } else {
            serde_json::json!({
                "since": "start", "host_write_bytes": stats.host_write_bytes,
                "media_write_bytes": stats.media_write_bytes(),
                "gc_relocated_bytes": stats.gc_relocated_bytes,
                "total": stats.write_amplification(),
                "gc": stats.gc_relocated_bytes as f64 / host,
                "parity": stats.media_parity_bytes as f64 / host,
                "metadata": stats.media_metadata_bytes as f64 / host,
                "padding": stats.media_padding_bytes as f64 / host,
            })
        },
        "write_amplification_window": window.map_or(serde_json::Value::Null, |w| w.json(&stats)),
        // Where the members can tell what their media did (simulated SSDs): host write to
        // media program, the pool's factor times the devices'.
        "end_to_end": match pool.media_counters() {
            None => serde_json::Value::Null,
            Some(m) => serde_json::json!({
                "host_write_bytes": stats.host_write_bytes,
                "drive_written_bytes": m.written_bytes,
                "media_programmed_bytes": m.programmed_bytes,
                "device_moved_bytes": m.moved_bytes,
                "erases": m.erases,
                "discarded_bytes": m.discarded_bytes,
                "device_waf": if m.written_bytes == 0 { serde_json::Value::Null } else { serde_json::json!(m.device_waf()) },
                "waf": if stats.host_write_bytes == 0 { serde_json::Value::Null } else {
                    serde_json::json!(m.programmed_bytes as f64 / stats.host_write_bytes as f64) },
            }),
        },
        "rebuild": {
            "needed": pool.needs_rebuild(), "running": rb.running,
            "state": if rb.running { "running" } else if !pool.needs_rebuild() { "idle" }
                     else if rb.last_error.is_some() { "failed" } else { "pending" },
            "last_error": rb.last_error, "failed_attempts": rb.failed_attempts,
            "percent": if rb.running || rb.total_segments > 0 { serde_json::json!(rb.percent()) } else { serde_json::Value::Null },
            "segments_done": rb.done_segments, "segments_total": rb.total_segments,
            "moved_bytes": rb.moved_bytes, "moved_before_bytes": rb.moved_before_bytes,
            "bytes_per_sec": rb.rate(),
            "eta_secs": if rb.eta_secs().is_finite() { serde_json::json!(rb.eta_secs()) } else { serde_json::Value::Null },
        },
        "scrub": pool.last_scrub().map(|r| crate::scrub::report_json(&r)),
        "repairs_pending": pool.repairs_pending(),
        "unverified_members": pool.unverified_members(),
        "unlinked_members": pool.unlinked_members(),
        "counters": stats.fields().into_iter().collect::<std::collections::BTreeMap<_, _>>(),
    })
}

/// What a running server shares with its admin doors (the Unix socket here, the HTTP API in
/// `ops/http_api.rs`): both turn a request into an [`Op`] and call [`execute`], so each
/// operation is implemented once.
pub struct AdminCtx {
    pub pool: Arc<Pool>,
    /// The data dir (new drive files go there; the member record is kept there).
    pub dir: PathBuf,
    pub window: Arc<crate::wa_window::WaWindow>,
    pub controls: Arc<Controls>,
    /// The server keeps the rebuild reserve (`--rebuild-reserve on`): `drive remove` must
    /// leave the live data within it.
    pub rebuild_reserve: bool,
    /// With `--nvme-tcp`: keeps its namespaces in step with volume changes.
    pub nvme: std::sync::OnceLock<crate::nvme::NamespaceSync>,
}

/// Switches the operator sets on the server's background work (`serve.rs` reads them).
#[derive(Debug, Default)]
pub struct Controls {
    /// The background cleaner stays idle (host writes still clean at the foreground
    /// watermark, so the pool never fills for want of it).
    pub cleaner_paused: AtomicBool,
    /// No automatic rebuild after `--rebuild-delay` (an explicit `rebuild` still runs).
    pub rebuild_paused: AtomicBool,
}

impl Controls {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "cleaner_paused": self.cleaner_paused.load(Ordering::SeqCst),
            "rebuild_paused": self.rebuild_paused.load(Ordering::SeqCst),
        })
    }
}

/// One admin operation, whichever door it came through.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Status,
    VolumeList,
    VolumeGet {
        name: String,
    },
    VolumeCreate {
        name: String,
        size: u64,
        compression: flashpool_engine::Compression,
    },
    VolumeResize {
        name: String,
        size: u64,
        force: bool,
    },
    VolumeCompression {
        name: String,
        compression: flashpool_engine::Compression,
    },
    VolumeDelete {
        name: String,
    },
    DriveList,
    DriveAdd {
        path: Option<PathBuf>,
        force: bool,
    },
    DriveFail {
        index: usize,
        force: bool,
    },
    DriveRemove {
        index: usize,
    },
    DriveReadmit {
        index: usize,
    },
    DriveReplace {
        old: usize,
        path: PathBuf,
        force: bool,
    },
    /// Rebuild now (waits for it).
    Rebuild,
    RebuildStatus,
    RebuildPause,
    RebuildResume,
    CleanerStatus,
    /// Clean until this many segments are free (default: the cleaner's high watermark).
    CleanerRun {
        free_segments: Option<usize>,
    },
    CleanerPause,
    CleanerResume,
    Scrub {
        repair: bool,
    },
}

impl Op {
    /// True for operations that only read state.
    pub fn read_only(&self) -> bool {
        matches!(
            self,
            Op::Status
                | Op::VolumeList
                | Op::VolumeGet { .. }
                | Op::DriveList
                | Op::RebuildStatus
                | Op::CleanerStatus
        )
    }
}

/// Why an operation failed, so a door can answer with the right code (HTTP status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The request itself is wrong (a bad number, a missing argument): 400.
    BadRequest,
    /// What it names does not exist: 404.
    NotFound,
    /// It conflicts with the pool's state (exists already, would lose data): 409.
    Conflict,
    /// The pool cannot do it now (no space, read-only, too few drives): 503.
    Unavailable,
    /// Anything else: 500.
    Internal,
}

/// An operation's error: what went wrong, in words, and its class.
#[derive(Debug)]
pub struct OpError {
    pub failure: Failure,
    pub error: anyhow::Error,
}

impl OpError {
    pub fn bad_request(msg: impl Into<String>) -> Self {
        OpError {
            failure: Failure::BadRequest,
            error: anyhow::anyhow!(msg.into()),
        }
    }
    pub fn message(&self) -> String {
        format!("{:#}", self.error)
    }
}

impl From<anyhow::Error> for OpError {
    fn from(error: anyhow::Error) -> Self {
        use flashpool_engine::Error as E;
        if error.downcast_ref::<crate::datadir::Refused>().is_some() {
            return OpError {
                failure: Failure::Conflict,
                error,
            };
        }
        if error.downcast_ref::<crate::datadir::Unusable>().is_some() {
            return OpError {
                failure: Failure::BadRequest,
                error,
            };
        }
        let failure = match error.chain().find_map(|e| e.downcast_ref::<E>()) {
            Some(E::NotFound(_)) => Failure::NotFound,
            Some(E::AlreadyExists(_) | E::Conflict(_)) => Failure::Conflict,
            Some(E::InvalidArgument(_) | E::OutOfRange { .. }) => Failure::BadRequest,
            Some(E::NoSpace | E::Unavailable(_) | E::Failed(_)) => Failure::Unavailable,
            _ => Failure::Internal,
        };
        OpError { failure, error }
    }
}

impl From<flashpool_engine::Error> for OpError {
    fn from(e: flashpool_engine::Error) -> Self {
        anyhow::Error::from(e).into()
    }
}

fn conflict(msg: String) -> OpError {
    OpError {
        failure: Failure::Conflict,
        error: anyhow::anyhow!(msg),
    }
}

fn volume_json(v: &flashpool_engine::VolumeInfo) -> serde_json::Value {
    serde_json::json!({
        "name": v.name, "id": v.id, "size": v.size,
        "compression": format!("{:?}", v.compression).to_lowercase(),
        "compression_ratio": v.compression_ratio, "map_bytes": v.map_bytes,
    })
}

fn drives_json(ctx: &AdminCtx) -> serde_json::Value {
    let s = status_json(&ctx.pool, Some(&ctx.dir), None);
    serde_json::json!({
        "drives": s["drives"], "not_members": s["not_members"],
        "protection": s["protection"], "rebuild": s["rebuild"],
    })
}

/// Puts member `index` back in service unless it is in service already; says which, for the
/// CLI offline and the admin doors alike.
/// A retired member (its data rebuilt onto the others) cannot come back: a conflict with its
/// state (409), not a bad request.
pub fn readmit(pool: &Pool, index: usize) -> flashpool_engine::Result<String> {
    let retired = || {
        flashpool_engine::Error::Conflict(format!(
            "drive {index} was rebuilt and retired: its data lives on the other members now, so it cannot be readmitted (adding it again, with force, reuses the drive as a new member)"
        ))
    };
    match pool.drives()[index].state {
        "active" => {
            return Ok(format!(
                "drive {index} is already in service: nothing to do"
            ))
        }
        "retired" => return Err(retired()),
        _ => {}
    }
    match pool.readmit_drive(index) {
        Ok(()) => Ok(format!("drive {index} back in service")),
        // A rebuild that ended meanwhile retired it.
        Err(_) if pool.drives()[index].state == "retired" => Err(retired()),
        Err(e) => Err(e),
    }
}

/// What a completed `drive remove` of member `index` did.
pub fn removed(index: usize, st: &flashpool_engine::RebuildStatus) -> String {
    format!(
        "drive {index} removed: {} segments ({} MiB) rebuilt onto the other drives in {:.1} s",
        st.total_segments,
        st.moved_bytes >> 20,
        st.elapsed_secs
    )
}

fn check_drive_index(pool: &Pool, index: usize) -> Result<(), OpError> {
    let n = pool.info().drive_count;
    if index >= n {
        return Err(OpError {
            failure: Failure::NotFound,
            error: anyhow::anyhow!("no drive {index} (the pool has {n} drives)"),
        });
    }
    Ok(())
}

fn cleaner_json(ctx: &AdminCtx) -> serde_json::Value {
    let info = ctx.pool.info();
    let st = ctx.pool.stats();
    serde_json::json!({
        "paused": ctx.controls.cleaner_paused.load(Ordering::SeqCst),
        "idle": ctx.pool.gc_idle(), "idle_rounds": st.gc_idle_rounds,
        "free_segments": info.free_segments, "segments": info.segment_count,
        "high_water_segments": ctx.pool.gc_high_water(),
        "runs": st.gc_runs, "segments_cleaned": st.gc_segments_cleaned,
        "relocated_bytes": st.gc_relocated_bytes,
    })
}

/// Carries out one admin operation on the running server's pool.
pub fn execute(ctx: &AdminCtx, op: Op) -> Result<serde_json::Value, OpError> {
    let pool = &*ctx.pool;
    let ok = |msg: String| serde_json::json!({ "ok": msg });
    if let Op::VolumeGet { name }
    | Op::VolumeCreate { name, .. }
    | Op::VolumeResize { name, .. }
    | Op::VolumeCompression { name, .. }
    | Op::VolumeDelete { name } = &op
    {
        flashpool_engine::validate_volume_name(name)?;
    }
    Ok(match op {
        Op::Status => {
            let mut v = status_json(pool, Some(&ctx.dir), Some(&ctx.window));
            v["controls"] = ctx.controls.json();
            v
        }
        Op::VolumeList => serde_json::json!({
            "volumes": pool.volumes().iter().map(volume_json).collect::<Vec<_>>()
        }),
        Op::VolumeGet { name } => {
            let v = pool.volume(&name)?;
            let info = pool
                .volumes()
                .into_iter()
                .find(|i| i.name == name)
                .with_context(|| format!("volume {name:?} went away"))?;
            let written: u64 = v
                .block_status(0, v.size())?
                .iter()
                .filter(|e| e.state == flashpool_engine::BlockState::Data)
                .map(|e| e.length)
                .sum();
            let mut j = volume_json(&info);
            j["allocated_bytes"] = serde_json::json!(written);
            j
        }
        Op::VolumeCreate {
            name,
            size,
            compression,
        } => {
            let v = pool.create_volume_with(&name, size, compression)?;
            if let Some(n) = ctx.nvme.get() {
                n.volume_changed(&v.name);
            }
            let mut j = ok(format!("created volume {} ({} bytes)", v.name, v.size));
            j["volume"] = volume_json(&v);
            j
        }
        Op::VolumeResize { name, size, force } => {
            let v = pool.volume(&name)?;
            if !force {
                let written = crate::volume::data_past(&v, size)?;
                if written > 0 {
                    return Err(conflict(format!(
                        "volume {name} holds {} KiB of data past {size} bytes: shrinking discards it (force to shrink anyway)",
                        written.div_ceil(1024)
                    )));
                }
            }
            pool.resize_volume(&name, size)?;
            if let Some(n) = ctx.nvme.get() {
                n.volume_changed(&name);
            }
            ok(format!("resized volume {name} to {size} bytes"))
        }
        Op::VolumeCompression { name, compression } => {
            pool.set_volume_compression(&name, compression)?;
            ok(format!(
                "volume {name}: compression {} for blocks written from now on",
                format!("{compression:?}").to_lowercase()
            ))
        }
        Op::VolumeDelete { name } => {
            let id = pool.volume(&name).ok().map(|v| v.id());
            pool.delete_volume(&name)?;
            if let (Some(n), Some(id)) = (ctx.nvme.get(), id) {
                n.volume_deleted(id);
            }
            ok(format!("deleted volume {name}"))
        }
        Op::DriveList => drives_json(ctx),
        Op::DriveFail { index, force } => {
            check_drive_index(pool, index)?;
            if force {
                pool.force_fail_drive(index)?;
            } else {
                pool.fail_drive(index)?;
            }
            ok(format!(
                "drive {index} taken out of service; its data is rebuilt onto the others after the server's --rebuild-delay unless it is readmitted first"
            ))
        }
        Op::DriveAdd { path, force } => {
            let path = crate::datadir::add_drive(&ctx.dir, pool, path.as_deref(), force)?;
            let info = pool.info();
            ok(format!(
                "drive {} added: {} members, stripes {}+{}, capacity {} MiB",
                path.display(),
                info.drive_count,
                info.k,
                info.m,
                info.capacity_bytes >> 20
            ))
        }
        Op::DriveReplace { old, path, force } => {
            check_drive_index(pool, old)?;
            let st = crate::datadir::replace_drive(&ctx.dir, pool, old, &path, force)?;
            ok(format!(
                "member {old} replaced by {}: {} segments ({} MiB) rebuilt in {:.1} s",
                path.display(),
                st.total_segments,
                st.moved_bytes >> 20,
                st.elapsed_secs
            ))
        }
        Op::DriveRemove { index } => {
            check_drive_index(pool, index)?;
            let st = crate::datadir::remove_drive(pool, index, ctx.rebuild_reserve)?;
            ok(removed(index, &st))
        }
        Op::DriveReadmit { index } => {
            check_drive_index(pool, index)?;
            ok(readmit(pool, index)?)
        }
        Op::Scrub { repair } => crate::scrub::report_json(&pool.scrub(repair, None)?),
        Op::Rebuild => {
            if pool.needs_rebuild() {
                let st = pool.rebuild()?;
                ok(format!(
                    "rebuild done: {} segments, {} MiB moved in {:.1} s",
                    st.total_segments,
                    st.moved_bytes >> 20,
                    st.elapsed_secs
                ))
            } else {
                ok("nothing to rebuild".into())
            }
        }
        Op::RebuildStatus => {
            let mut j = status_json(pool, None, None)["rebuild"].clone();
            j["paused"] = ctx.controls.rebuild_paused.load(Ordering::SeqCst).into();
            j
        }
        Op::RebuildPause => {
            ctx.controls.rebuild_paused.store(true, Ordering::SeqCst);
            ok("automatic rebuild paused: a lost member's data is not rebuilt until `rebuild resume` or an explicit rebuild".into())
        }
        Op::RebuildResume => {
            ctx.controls.rebuild_paused.store(false, Ordering::SeqCst);
            ok("automatic rebuild resumed".into())
        }
        Op::CleanerStatus => cleaner_json(ctx),
        Op::CleanerRun { free_segments } => {
            let target = free_segments.unwrap_or_else(|| pool.gc_high_water());
            let n = pool.gc(target)?;
            let mut j = ok(format!(
                "cleaner: {n} segments cleaned, {} free",
                pool.info().free_segments
            ));
            j["cleaned_segments"] = n.into();
            j
        }
        Op::CleanerPause => {
            ctx.controls.cleaner_paused.store(true, Ordering::SeqCst);
            ok(
                "background cleaner paused (host writes still clean at the foreground watermark)"
                    .into(),
            )
        }
        Op::CleanerResume => {
            ctx.controls.cleaner_paused.store(false, Ordering::SeqCst);
            ok("background cleaner resumed".into())
        }
    })
}

/// Reads one socket command line as an [`Op`].
pub fn parse_line(line: &str) -> Result<Op, OpError> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let number = |i: usize, what: &str| -> Result<usize, OpError> {
        words
            .get(i)
            .ok_or_else(|| OpError::bad_request(format!("missing {what}")))?
            .parse::<usize>()
            .map_err(|_| OpError::bad_request(format!("{what} must be a number")))
    };
    let word = |i: usize, what: &str| -> Result<String, OpError> {
        words
            .get(i)
            .map(|w| w.to_string())
            .ok_or_else(|| OpError::bad_request(format!("missing {what}")))
    };
    let size = |i: usize| -> Result<u64, OpError> {
        crate::size::parse_size(&word(i, "size")?)
            .map_err(|e| OpError::bad_request(format!("{e:#}")))
    };
    let compression = |w: &str| -> Result<flashpool_engine::Compression, OpError> {
        w.parse()
            .map_err(|e: flashpool_engine::Error| OpError::bad_request(e.to_string()))
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
    let flag = |i: usize, name: &str| words.get(i) == Some(&name);
    Ok(match (words.first().copied(), words.get(1).copied()) {
        (Some("status"), _) => Op::Status,
        (Some("fail"), _) => Op::DriveFail {
            index: number(1, "drive index")?,
            force: flag(2, "force"),
        },
        (Some("add"), _) => Op::DriveAdd {
            force: number(1, "force flag")? == 1,
            path: rest_after(2),
        },
        (Some("replace"), _) => Op::DriveReplace {
            old: number(1, "member index")?,
            force: number(2, "force flag")? == 1,
            path: rest_after(3)
                .ok_or_else(|| OpError::bad_request("missing the new drive's path"))?,
        },
        (Some("remove"), _) => Op::DriveRemove {
            index: number(1, "drive index")?,
        },
        (Some("readmit"), _) => Op::DriveReadmit {
            index: number(1, "drive index")?,
        },
        (Some("drives"), _) => Op::DriveList,
        (Some("scrub"), _) => Op::Scrub {
            repair: !flag(1, "check"),
        },
        (Some("rebuild"), None) => Op::Rebuild,
        (Some("rebuild"), Some("status")) => Op::RebuildStatus,
        (Some("rebuild"), Some("pause")) => Op::RebuildPause,
        (Some("rebuild"), Some("resume")) => Op::RebuildResume,
        (Some("cleaner"), Some("status")) => Op::CleanerStatus,
        (Some("cleaner"), Some("run")) => Op::CleanerRun {
            free_segments: match words.get(2) {
                Some(_) => Some(number(2, "free segment target")?),
                None => None,
            },
        },
        (Some("cleaner"), Some("pause")) => Op::CleanerPause,
        (Some("cleaner"), Some("resume")) => Op::CleanerResume,
        (Some("volume"), Some("list")) => Op::VolumeList,
        (Some("volume"), Some("show")) => Op::VolumeGet {
            name: word(2, "volume name")?,
        },
        (Some("volume"), Some("create")) => Op::VolumeCreate {
            name: word(2, "volume name")?,
            size: size(3)?,
            compression: match words.get(4) {
                Some(w) => compression(w)?,
                None => Default::default(),
            },
        },
        (Some("volume"), Some("resize")) => Op::VolumeResize {
            name: word(2, "volume name")?,
            size: size(3)?,
            force: flag(4, "force"),
        },
        (Some("volume"), Some("compression")) => Op::VolumeCompression {
            name: word(2, "volume name")?,
            compression: compression(&word(3, "compression")?)?,
        },
        (Some("volume"), Some("delete")) => Op::VolumeDelete {
            name: word(2, "volume name")?,
        },
        _ => {
            return Err(OpError::bad_request(format!(
                "unknown command {line:?}: status, drives, add, replace, fail N, remove N, readmit N, rebuild [status|pause|resume], cleaner status|run [N]|pause|resume, scrub [check], volume list|show|create|resize|compression|delete"
            )))
        }
    })
}

fn answer(ctx: &AdminCtx, line: &str) -> serde_json::Value {
    parse_line(line)
        .and_then(|op| execute(ctx, op))
        .unwrap_or_else(|e| serde_json::json!({"error": e.message()}))
}

/// Serves the admin socket until `stop` is set (checked between connections).
pub fn spawn(ctx: Arc<AdminCtx>) -> Result<PathBuf> {
    let path = socket_path(&ctx.dir);
    let _ = std::fs::remove_file(&path); // the data dir lock says no other server owns it
    let listener =
        UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
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
                let (ctx, busy) = (ctx.clone(), busy.clone());
                let spawned = std::thread::Builder::new()
                    .name("admin-conn".into())
                    .spawn(move || {
                        serve_one(&ctx, conn);
                        busy.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    tracing::warn!("cannot start an admin thread; command dropped");
                }
            }
        })?;
    Ok(path)
}

/// How long a client has to send its whole command: a deadline for the command, not for
/// each read, so a client trickling a byte at a time cannot hold one of the
/// `MAX_ADMIN_CONNECTIONS` slots for longer (eight such clients used to lock every admin
/// command, `status` included, out for hours).
const COMMAND_DEADLINE: Duration = Duration::from_secs(5);

/// Longest command read (a path included): anything longer is not one of ours.
const MAX_COMMAND: usize = 4096;

/// Reads one command from `conn` and answers it.
fn serve_one(ctx: &AdminCtx, conn: UnixStream) {
    let Some(line) = read_command(&conn) else {
        return;
    };
    let reply = answer(ctx, line.trim());
    let _ = (&conn).write_all(format!("{reply}\n").as_bytes());
}

/// The command line a client sends (up to its newline, or all it sent before closing), or
/// None when it is too long, not UTF-8, or not complete by `COMMAND_DEADLINE`.
fn read_command(conn: &UnixStream) -> Option<String> {
    let deadline = std::time::Instant::now() + COMMAND_DEADLINE;
    let mut line = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        let left = deadline
            .checked_duration_since(std::time::Instant::now())
            .filter(|d| !d.is_zero())?;
        conn.set_read_timeout(Some(left)).ok()?;
        let n = (&*conn).read(&mut chunk).ok()?;
        if n == 0 {
            break;
        }
        line.extend_from_slice(&chunk[..n]);
        if let Some(end) = line.iter().position(|&b| b == b'\n') {
            line.truncate(end);
            break;
        }
        if line.len() > MAX_COMMAND {
            return None;
        }
    }
    String::from_utf8(line).ok()
}

/// How long the CLI waits for the server's answer: status answers at once; commands that
/// rebuild (remove, replace, rebuild) run as long as the rebuild.
fn answer_timeout(command: &str) -> Duration {
    match command.split_whitespace().next() {
        Some("remove" | "replace" | "rebuild" | "scrub") => Duration::from_secs(24 * 3600),
        Some("add" | "cleaner" | "volume") => Duration::from_secs(600),
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
    // A server with every admin slot taken answers `busy` and closes without reading: the
    // write may then fail (a broken pipe) with that answer waiting to be read.
    let sent = writeln!(s, "{command}");
    let mut reply = String::new();
    let read = BufReader::new(s).read_line(&mut reply);
    if let Err(e) = sent {
        if reply.is_empty() {
            return Err(e).context("sending the command to the server");
        }
    }
    if let Err(e) = read {
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
            "the server holding {} closed the admin connection without an answer to `{}` (did \
             it stop?): the operation may or may not have been done; `flashpool status --data {}` \
             shows the pool as it is now",
            dir.display(),
            command.split_whitespace().next().unwrap_or(""),
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

#[cfg(test)]
mod tests {
    use super::*;
    use flashpool_engine::drive::{DriveRef, MemDrive};
    use flashpool_engine::{DriveStatus, PoolConfig};

    fn members(states: &[&'static str]) -> Vec<DriveStatus> {
        states
            .iter()
            .enumerate()
            .map(|(index, &state)| DriveStatus {
                index,
                state,
                identity: format!("mem:{index}"),
                uuid: String::new(),
                media: None,
                latency: None,
            })
            .collect()
    }

    /// Members down (failed or missing) and in service, counted from their states.
    fn members_down_and_in_service(drives: &[DriveStatus]) -> (usize, usize) {
        let count = |f: fn(&str) -> bool| drives.iter().filter(|d| f(d.state)).count();
        (
            count(|s| s == "failed" || s == "missing"),
            count(|s| s == "active"),
        )
    }

    fn summary(k: usize, m: usize, states: &[&'static str]) -> (String, usize) {
        let (down, up) = members_down_and_in_service(&members(states));
        (
            protection(k, m, down, 0, 0, up),
            flashpool_engine::failures_tolerated(m, down, 0, up),
        )
    }

    /// Retired members are neither down nor in service: a pool whose members were all
    /// retired said "4+1, all members in service: tolerates 1 more failure".
    #[test]
    fn protection_counts_the_members_in_service() {
        let r = "retired";
        assert_eq!(
            summary(4, 1, &[r, r, r, r, r]),
            (
                "4+1, no members in service: no further failure tolerated; read-only: 0 members \
                 in service, a stripe needs 2"
                    .into(),
                0
            )
        );
        assert_eq!(
            summary(4, 1, &[r, r, "active", "active", "active"]),
            (
                "4+1, all members in service: tolerates 1 more failure".into(),
                1
            )
        );
        assert_eq!(
            summary(2, 2, &["failed", "missing", "active", "active"]),
            (
                "2+2, 2 members down: no further failure tolerated; read-only: 2 members in \
                 service, a stripe needs 3"
                    .into(),
                0
            )
        );
        assert_eq!(
            summary(4, 1, &["failed", "failed", "active", "active", "active"]).0,
            "4+1, 2 members down: data unavailable"
        );
        assert_eq!(
            summary(3, 2, &["failed", "active", "active", "active", "active"]),
            ("3+2, one member down: tolerates 1 more failure".into(), 1)
        );
    }

    /// A pool rebuilt down to m + 1 members that then loses one: the status says it is
    /// read-only for want of members (it said only "no further failure tolerated").
    #[test]
    fn status_protection_of_a_pool_short_of_members() {
        let drives: Vec<DriveRef> = (0..5)
            .map(|i| Arc::new(MemDrive::new(16 << 20, format!("mem:{i}"))) as DriveRef)
            .collect();
        let cfg = PoolConfig {
            k: 4,
            m: 1,
            chunk_size: 16 << 10,
            segment_size: 1 << 20,
            checkpoint_interval: 4 << 20,
        };
        let pool = Pool::create(drives, &cfg).unwrap();
        pool.fail_drive(0).unwrap();
        pool.force_fail_drive(1).unwrap();
        pool.force_fail_drive(2).unwrap();
        pool.rebuild().unwrap();
        pool.fail_drive(3).unwrap();
        let p = &status_json(&pool, None, None)["protection"];
        assert_eq!(p["members_down"], 1, "{p}");
        assert_eq!(p["members_in_service"], 1, "{p}");
        assert_eq!(p["failures_tolerated"], 0, "{p}");
        // Three members retired: the two left make 1+1 stripes (RELIABILITY.md finding 87).
        assert_eq!(
            p["summary"],
            "1+1, one member down: no further failure tolerated; read-only: 1 members in \
             service, a stripe needs 2"
        );
    }

    #[test]
    fn protection_counts_members_missing_chunks() {
        assert_eq!(
            protection(4, 1, 0, 0, 0, 5),
            "4+1, all members in service: tolerates 1 more failure"
        );
        assert_eq!(
            protection(4, 1, 0, 1, 0, 5),
            "4+1, all members in service, one member missing chunks its full host filesystem \
             refused (until repaired): no further failure tolerated"
        );
        assert_eq!(
            protection(4, 2, 0, 1, 0, 6),
            "4+2, all members in service, one member missing chunks its full host filesystem \
             refused (until repaired): tolerates 1 more failure"
        );
        assert_eq!(
            protection(4, 1, 1, 1, 0, 4),
            "4+1, one member down, one member missing chunks its full host filesystem refused \
             (until repaired): stripes a chunk short may be unreadable"
        );
        assert_eq!(
            protection(4, 1, 2, 0, 0, 3),
            "4+1, 2 members down: data unavailable"
        );
    }

    #[test]
    fn protection_counts_members_whose_file_was_deleted() {
        assert_eq!(
            protection(4, 1, 0, 0, 1, 5),
            "4+1, all members in service, one member's drive file deleted (missing after a \
             restart): no further failure tolerated"
        );
        assert_eq!(
            protection(4, 1, 0, 0, 2, 5),
            "4+1, all members in service, 2 members' drive files deleted (missing after a \
             restart): a restart would leave data unavailable"
        );
        assert_eq!(
            protection(4, 2, 0, 0, 1, 6),
            "4+2, all members in service, one member's drive file deleted (missing after a \
             restart): tolerates 1 more failure"
        );
        assert_eq!(
            protection(4, 2, 1, 0, 2, 5),
            "4+2, one member down, 2 members' drive files deleted (missing after a restart): \
             a restart would leave data unavailable"
        );
    }
}
