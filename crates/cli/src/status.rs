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
        admin::status_json(&dd.pool, Some(&dd.dir))
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let p = &v["pool"];
    println!(
        "pool {}: {} drives ({} healthy), {}+{}, {} of {} segments free, {} MiB live of {} MiB",
        p["uuid"].as_str().unwrap_or(""),
        p["drives"],
        p["healthy_drives"],
        p["k"],
        p["m"],
        p["free_segments"],
        p["segments"],
        p["live_bytes"].as_u64().unwrap_or(0) >> 20,
        p["capacity_bytes"].as_u64().unwrap_or(0) >> 20
    );
    println!(
        "protection: {}",
        v["protection"]["summary"].as_str().unwrap_or("")
    );
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
    println!(
        "write amplification {:.3} (GC {:.3}, parity {:.3}, metadata {:.3}, padding {:.3})",
        w["total"].as_f64().unwrap_or(0.0),
        w["gc"].as_f64().unwrap_or(0.0),
        w["parity"].as_f64().unwrap_or(0.0),
        w["metadata"].as_f64().unwrap_or(0.0),
        w["padding"].as_f64().unwrap_or(0.0)
    );
    for vol in v["volumes"].as_array().into_iter().flatten() {
        println!(
            "volume {}: {} bytes, compression {} (ratio {:.2})",
            vol["name"].as_str().unwrap_or(""),
            vol["size"],
            vol["compression"].as_str().unwrap_or(""),
            vol["compression_ratio"].as_f64().unwrap_or(1.0)
        );
    }
    for d in v["drives"].as_array().into_iter().flatten() {
        let at = match (d["identity"].as_str(), d["last_seen"].as_str()) {
            (Some(p), _) if p != "-" => p.to_string(),
            (_, Some(seen)) => format!("- (last seen at {seen})"),
            _ => "-".to_string(),
        };
        println!(
            "drive {:>2}: {:<8} {} {at}",
            d["index"],
            d["state"].as_str().unwrap_or(""),
            d["uuid"].as_str().unwrap_or("")
        );
    }
    for i in v["not_members"].as_array().into_iter().flatten() {
        println!(
            "not a member: {}: {}",
            i["identity"].as_str().unwrap_or(""),
            i["reason"].as_str().unwrap_or("")
        );
    }
    let rb = &v["rebuild"];
    if rb["needed"].as_bool() == Some(true) || rb["running"].as_bool() == Some(true) {
        println!(
            "rebuild: {:.1} % done",
            rb["percent"].as_f64().unwrap_or(0.0)
        );
    }
    Ok(())
}
