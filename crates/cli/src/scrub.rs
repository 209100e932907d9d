//! `flashpool scrub`: read every stripe holding data, check every chunk's CRC32C, repair what
//! parity can (the damaged segments' live data is moved) and list what it cannot, with the
//! volume and offset of each lost block; on a data dir directly or through a running server.

use crate::{admin, datadir};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

/// Arguments of `flashpool scrub`.
#[derive(Args, Debug)]
pub struct ScrubArgs {
    /// Data dir holding the pool.
    #[arg(long, default_value = "flashpool-data")]
    pub data: PathBuf,
    /// Only check and report; repair nothing.
    #[arg(long)]
    pub check_only: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// A scrub report as JSON.
pub fn report_json(r: &flashpool_engine::ScrubReport) -> serde_json::Value {
    serde_json::json!({
        "segments_checked": r.segments_checked, "stripes_checked": r.stripes_checked,
        "stripes_dead": r.stripes_dead,
        "bytes_checked": r.bytes_checked, "bad_chunks": r.bad_chunks,
        "segments_repaired": r.segments_repaired, "elapsed_secs": r.elapsed_secs,
        "stripes_unavailable": r.stripes_unavailable, "blocks_unavailable": r.blocks_unavailable,
        "unrecoverable": r.unrecoverable.iter()
            .map(|(v, off)| serde_json::json!({"volume": v, "offset": off}))
            .collect::<Vec<_>>(),
    })
}

/// Runs `flashpool scrub`.
pub fn run(a: ScrubArgs) -> Result<()> {
    let repair = !a.check_only;
    let v = if admin::server_running(&a.data) {
        admin::request(&a.data, if repair { "scrub" } else { "scrub check" })?
    } else {
        let dd = if repair {
            datadir::open_existing(&a.data)?
        } else {
            datadir::open_read_only(&a.data)?
        };
        let r = dd.pool.scrub(repair, None)?;
        dd.pool.close()?;
        report_json(&r)
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "scrub: {} segments, {} stripes, {} MiB checked in {:.1} s: {} bad chunks, {} segments repaired, {} blocks lost",
            v["segments_checked"],
            v["stripes_checked"],
            v["bytes_checked"].as_u64().unwrap_or(0) >> 20,
            v["elapsed_secs"].as_f64().unwrap_or(0.0),
            v["bad_chunks"],
            v["segments_repaired"],
            v["unrecoverable"].as_array().map_or(0, Vec::len)
        );
        for b in v["unrecoverable"].as_array().into_iter().flatten() {
            println!(
                "lost: volume {} offset {}",
                b["volume"].as_str().unwrap_or(""),
                b["offset"]
            );
        }
    }
    if v["unrecoverable"].as_array().is_some_and(|l| !l.is_empty()) {
        anyhow::bail!("the scrub found blocks parity cannot recover (listed above)");
    }
    let unavailable = v["stripes_unavailable"].as_u64().unwrap_or(0);
    if unavailable > 0 {
        anyhow::bail!(
            "the scrub could not read {unavailable} stripes ({} live blocks): more of their chunks \
             are on members out of service than parity covers; they are not lost and read again \
             when those members return (`flashpool drive readmit N`, or the drive put back)",
            v["blocks_unavailable"]
        );
    }
    Ok(())
}
