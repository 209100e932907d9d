//! `flashpool status`: the pool's geometry, drives, volumes, how full the segments holding data
//! are, write amplification (split into GC, parity, metadata and padding), compression,
//! rebuild progress and counters; from a running server through its admin socket, or from the
//! data dir directly.

use crate::{admin, datadir};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

/// Arguments of `flashpool status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Data dir holding the pool.
    #[arg(long, default_value = "flashpool-data")]
    pub data: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `flashpool status`.
pub fn run(a: StatusArgs) -> Result<()> {
    let v = if admin::server_running(&a.data) {
        admin::request(&a.data, "status")?
    } else {
        let dd = datadir::open_read_only(&a.data)?;
        admin::status_json(&dd.pool, Some(&dd.dir), None)
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let p = &v["pool"];
    let mib = |x: &serde_json::Value| x.as_u64().unwrap_or(0) >> 20;
    println!(
        "pool {}: {} members ({} in service{}), stripes {}+{} now ({}+{} when whole), {} of {} segments free, {} MiB live of {} MiB now ({} MiB when whole)",
        p["uuid"].as_str().unwrap_or(""),
        p["members"],
        p["healthy_drives"],
        match p["drives"].as_u64().unwrap_or(0).saturating_sub(p["members"].as_u64().unwrap_or(0)) {
            0 => String::new(),
            n => format!(", {n} retired"),
        },
        p["width_now"],
        p["m"],
        p["k"],
        p["m"],
        p["free_segments"],
        p["segments"],
        mib(&p["live_bytes"]),
        mib(&p["capacity_now_bytes"]),
        mib(&p["capacity_bytes"])
    );
    if let Some(why) = p["read_only"].as_str() {
        println!("READ-ONLY: {why}");
    }
    println!(
        "protection: {}",
        v["protection"]["summary"].as_str().unwrap_or("")
    );
    let unverified = member_list(&v["unverified_members"]);
    if !unverified.is_empty() {
        println!(
            "UNVERIFIED: member(s) {} opened one superblock generation behind (a crash while \
             superblocks were written, or an old copy of the drive put back): until a scrub has \
             checked them they may lack recent writes (a server scrubs at once; offline: \
             `flashpool scrub`)",
            unverified.join(", ")
        );
    }
    let unlinked = member_list(&v["unlinked_members"]);
    if !unlinked.is_empty() {
        println!(
            "DELETED: the drive file of member(s) {} was deleted while the server holds it open: \
             it still serves, but a restart will find the member missing. While the server \
             runs, put a drive in its place (`flashpool drive replace N PATH`) or remove it \
             (`flashpool drive remove N`)",
            unlinked.join(", ")
        );
    }
    if let Some(limit) = p["live_limit_bytes"].as_u64() {
        let live = p["live_bytes"].as_u64().unwrap_or(0);
        if live <= limit {
            println!(
                "rebuild reserve: hosts get ENOSPC for new data past {} MiB live, so a lost member can always be rebuilt ({} MiB live now)",
                limit >> 20,
                live >> 20
            );
        } else {
            // Live data can pass the limit without a host writing (a member removed, or a
            // rebuild onto fewer members): the guarantee does not hold until it is back under.
            println!(
                "rebuild reserve: OVER ITS LIMIT: {} MiB live, past the {} MiB the members left after a loss could hold: hosts get ENOSPC for new data, and a lost member may not be rebuilt until live data is back under it (delete or trim data, or add a drive)",
                live.div_ceil(1 << 20),
                limit >> 20
            );
        }
    }
    let su = &v["segment_utilisation"];
    let tenths: Vec<String> = su["tenths"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .filter(|(_, n)| n.as_u64().unwrap_or(0) > 0)
        .map(|(i, n)| format!("{}-{}%: {n}", i * 10, i * 10 + 10))
        .collect();
    println!(
        "segments holding data by live share (the cleaner's measure): {}{}",
        if tenths.is_empty() {
            "none".to_string()
        } else {
            tenths.join(", ")
        },
        match su["unknown_space"].as_u64().unwrap_or(0) {
            0 => String::new(),
            n => format!(" ({n} written before a restart from an old checkpoint, estimated)"),
        }
    );
    let w = &v["write_amplification"];
    if w["total"].is_null() {
        println!(
            "write amplification: no host writes since the server started; {}",
            traffic_without_host_writes(w)
        );
    } else {
        println!(
            "write amplification since the server started {:.3} (GC {:.3}, parity {:.3}, metadata {:.3}, padding {:.3})",
            w["total"].as_f64().unwrap_or(0.0),
            w["gc"].as_f64().unwrap_or(0.0),
            w["parity"].as_f64().unwrap_or(0.0),
            w["metadata"].as_f64().unwrap_or(0.0),
            w["padding"].as_f64().unwrap_or(0.0)
        );
    }
    let e = &v["end_to_end"];
    if !e.is_null() {
        match (e["waf"].as_f64(), e["device_waf"].as_f64()) {
            (Some(t), Some(d)) => println!(
                "end-to-end write amplification (host write to media program) {t:.3}: the drives' own {d:.3} on top of the pool's; {} erases, {} MiB discarded",
                e["erases"],
                e["discarded_bytes"].as_u64().unwrap_or(0) >> 20
            ),
            _ => println!("end-to-end write amplification: no host writes yet"),
        }
    }
    let ww = &v["write_amplification_window"];
    if let Some(t) = ww["total"].as_f64() {
        println!(
            "write amplification over the last {} s: {t:.3} (GC {:.3}, parity {:.3}, metadata {:.3}, padding {:.3})",
            ww["seconds"],
            ww["gc"].as_f64().unwrap_or(0.0),
            ww["parity"].as_f64().unwrap_or(0.0),
            ww["metadata"].as_f64().unwrap_or(0.0),
            ww["padding"].as_f64().unwrap_or(0.0)
        );
    } else if !ww.is_null() {
        println!(
            "write amplification over the last {} s: no host writes; {}",
            ww["seconds"],
            traffic_without_host_writes(ww)
        );
    }
    for vol in v["volumes"].as_array().into_iter().flatten() {
        println!(
            "volume {}: {} bytes, compression {} (ratio {:.2})",
            vol["name"].as_str().unwrap_or(""),
            vol["size"],
            vol["compression"].as_str().unwrap_or(""),
            vol["compression_ratio"].as_f64().unwrap_or(1.0)
        );
    }
    let not_members: Vec<&serde_json::Value> =
        v["not_members"].as_array().into_iter().flatten().collect();
    // A drive set aside where a member was last seen is said on that member's line, and not
    // again on a line of its own.
    let mut said: Vec<&str> = Vec::new();
    for d in v["drives"].as_array().into_iter().flatten() {
        let at = match (d["identity"].as_str(), d["last_seen"].as_str()) {
            (Some(p), _) if p != "-" => p.to_string(),
            (_, Some(seen)) => match not_members
                .iter()
                .find(|i| i["identity"].as_str() == Some(seen))
            {
                Some(i) => {
                    said.push(seen);
                    let why = i["reason"].as_str().unwrap_or("");
                    format!("- (last seen at {seen}, set aside there: {why})")
                }
                None => format!("- (last seen at {seen})"),
            },
            _ => "-".to_string(),
        };
        let why = match (d["failed_at_unix"].as_u64(), d["failure"].as_str()) {
            (Some(t), Some(r)) => format!(
                " (out of service since {} s ago: {r})",
                now_unix().saturating_sub(t)
            ),
            _ => String::new(),
        };
        println!(
            "drive {:>2}: {:<8} {} {at}{why}",
            // As a number: a JSON value prints without the padding.
            d["index"].as_u64().unwrap_or(0),
            d["state"].as_str().unwrap_or(""),
            d["uuid"].as_str().unwrap_or("")
        );
        let m = &d["media"];
        if !m.is_null() {
            let mib = |k: &str| m[k].as_u64().unwrap_or(0) >> 20;
            println!(
                "          media: {} MiB written, {} MiB programmed (device WA {:.3}), {} MiB moved by its GC, {} erases (per block {}-{}, mean {:.1}), {} MiB discarded",
                mib("written_bytes"),
                mib("programmed_bytes"),
                m["device_waf"].as_f64().unwrap_or(0.0),
                mib("moved_bytes"),
                m["erases"],
                m["erase_count"]["min"],
                m["erase_count"]["max"],
                m["erase_count"]["mean"].as_f64().unwrap_or(0.0),
                mib("discarded_bytes")
            );
        }
        let l = &d["latency"];
        if !l.is_null() {
            let one = |s: &serde_json::Value| {
                let f = |k: &str| s[k].as_f64().unwrap_or(0.0);
                format!(
                    "{} ops, mean {:.0} us, p99 {:.0} us, p99.9 {:.0} us, max {:.0} us",
                    s["count"],
                    f("mean_us"),
                    f("p99_us"),
                    f("p999_us"),
                    f("max_us")
                )
            };
            println!("          latency: reads {}", one(&l["read"]));
            println!("                   writes {}", one(&l["write"]));
        }
    }
    for i in not_members
        .iter()
        .filter(|i| !i["identity"].as_str().is_some_and(|p| said.contains(&p)))
    {
        println!(
            "not a member: {}: {}",
            i["identity"].as_str().unwrap_or(""),
            i["reason"].as_str().unwrap_or("")
        );
    }
    let rb = &v["rebuild"];
    match rb["state"].as_str().unwrap_or("") {
        "running" => println!(
            "rebuild: running, {} of {} segments ({:.1} %)",
            rb["segments_done"], rb["segments_total"],
            rb["percent"].as_f64().unwrap_or(0.0)
        ),
        "pending" => println!(
            "rebuild: needed, not started yet (a server starts it after its --rebuild-delay; `flashpool drive rebuild` starts it now)"
        ),
        "failed" => println!(
            "rebuild: FAILED {} time(s), the pool runs without full redundancy: {}",
            rb["failed_attempts"],
            rb["last_error"].as_str().unwrap_or("")
        ),
        _ => {}
    }
    let c = &v["counters"];
    let n = |k: &str| c[k].as_u64().unwrap_or(0);
    println!(
        "errors: {} CRC errors, {} read errors, {} write errors; {} degraded reads, {} chunks reconstructed; {} segments repaired ({} waiting), {} blocks lost",
        n("crc_errors"),
        n("read_errors"),
        n("write_errors"),
        n("degraded_reads"),
        n("reconstructed_chunks"),
        n("repaired_segments"),
        v["repairs_pending"].as_u64().unwrap_or(0),
        n("unrecoverable_blocks")
    );
    if n("torn_chunks") > 0 {
        println!(
            "crash: the open found {} chunks cut short by a crash (stripes on their way to the drives, no media damage): rewritten whole, or skipped as never flushed",
            n("torn_chunks")
        );
    }
    let sc = &v["scrub"];
    if !sc.is_null() {
        println!(
            "last scrub: {} stripes checked, {} bad chunks, {} segments repaired, {} blocks lost{}",
            sc["stripes_checked"],
            sc["bad_chunks"],
            sc["segments_repaired"],
            sc["unrecoverable"].as_array().map_or(0, Vec::len),
            match sc["stripes_unavailable"].as_u64().unwrap_or(0) {
                0 => String::new(),
                n => format!(
                    "; {n} stripes ({} blocks) UNREADABLE while members are out of service",
                    sc["blocks_unavailable"]
                ),
            }
        );
    }
    println!(
        "I/O since the server started: {} MiB written by hosts, {} MiB read; {} flushes, {} checkpoints; cleaner: {} runs, {} segments, {} MiB moved",
        n("host_write_bytes") >> 20,
        n("host_read_bytes") >> 20,
        n("flushes"),
        n("checkpoints"),
        n("gc_runs"),
        n("gc_segments_cleaned"),
        n("gc_relocated_bytes") >> 20
    );
    Ok(())
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A JSON list of member indexes, as text.
fn member_list(list: &serde_json::Value) -> Vec<String> {
    list.as_array()
        .map(|a| a.iter().map(|m| m.to_string()).collect())
        .unwrap_or_default()
}

/// What the drives were written while no host wrote (the cleaner's moves, checkpoints), from
/// a write-amplification object of `status --json`: there is no ratio to show, but that
/// traffic wears flash all the same.
pub(crate) fn traffic_without_host_writes(w: &serde_json::Value) -> String {
    let mib = |k: &str| w[k].as_u64().unwrap_or(0) as f64 / (1u64 << 20) as f64;
    match (
        w["media_write_bytes"].as_u64(),
        w["gc_relocated_bytes"].as_u64(),
    ) {
        (Some(0), _) | (None, _) => "the drives were written nothing".to_string(),
        (Some(_), Some(0) | None) => format!(
            "the drives were written {:.1} MiB",
            mib("media_write_bytes")
        ),
        (Some(_), Some(_)) => format!(
            "the drives were written {:.1} MiB, {:.1} MiB of it data the cleaner moved",
            mib("media_write_bytes"),
            mib("gc_relocated_bytes")
        ),
    }
}
