//! `flashpool volume create|list|delete|resize|compression`: on a data dir directly or, while
//! a server holds it, through the server's admin socket (as `flashpool drive` and `status`).

use crate::datadir;
use crate::size::parse_size;
use anyhow::Result;
use clap::{Args, Subcommand};
use std::path::PathBuf;

/// Arguments of `flashpool volume`.
#[derive(Args, Debug)]
pub struct VolumeArgs {
    /// Data dir holding the pool.
    #[arg(long, default_value = "flashpool-data", global = true)]
    pub data: PathBuf,
    #[command(subcommand)]
    pub cmd: VolumeCmd,
}

#[derive(Subcommand, Debug)]
pub enum VolumeCmd {
    /// Create a thin volume.
    Create {
        name: String,
        #[arg(value_parser = parse_size)]
        size: u64,
        /// Inline compression: off, lz4 or zstd.
        #[arg(long, default_value = "lz4")]
        compression: flashpool_engine::Compression,
    },
    /// Change a volume's compression (off, lz4, zstd) for blocks written from now on.
    Compression {
        name: String,
        setting: flashpool_engine::Compression,
    },
    /// List volumes.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a volume and free its space.
    Delete { name: String },
    /// Grow or shrink a volume (shrinking below written data needs --force: it discards it).
    Resize {
        name: String,
        #[arg(value_parser = parse_size)]
        size: u64,
        /// Shrink even if data past the new end is discarded.
        #[arg(long)]
        force: bool,
    },
}

/// Runs `flashpool volume`.
pub fn run(a: VolumeArgs) -> Result<()> {
    match &a.cmd {
        VolumeCmd::Create { name, .. }
        | VolumeCmd::Compression { name, .. }
        | VolumeCmd::Delete { name }
        | VolumeCmd::Resize { name, .. } => flashpool_engine::validate_volume_name(name)?,
        VolumeCmd::List { .. } => {}
    }
    if crate::admin::server_running(&a.data) {
        return online(&a);
    }
    let dd = if matches!(a.cmd, VolumeCmd::List { .. }) {
        datadir::open_read_only(&a.data)?
    } else {
        datadir::open_existing(&a.data)?
    };
    let pool = &dd.pool;
    match a.cmd {
        VolumeCmd::Compression { name, setting } => {
            pool.set_volume_compression(&name, setting)?;
            println!("volume {name}: compression {setting:?}");
        }
        VolumeCmd::Create {
            name,
            size,
            compression,
        } => {
            let v = pool.create_volume_with(&name, size, compression)?;
            println!("created volume {} ({} bytes)", v.name, v.size);
        }
        VolumeCmd::List { json } => {
            let vols: Vec<_> = pool
                .volumes()
                .iter()
                .map(|v| serde_json::json!({"name": v.name, "size": v.size, "id": v.id, "map_bytes": v.map_bytes}))
                .collect();
            print_list(&vols, json)?;
        }
        VolumeCmd::Delete { name } => {
            pool.delete_volume(&name)?;
            println!("deleted volume {name}");
        }
        VolumeCmd::Resize { name, size, force } => {
            let v = pool.volume(&name)?;
            if !force {
                let written = data_past(&v, size)?;
                if written > 0 {
                    anyhow::bail!(
                        "volume {name} holds {} KiB of data past {size} bytes: shrinking discards it (--force to shrink anyway)",
                        written.div_ceil(1024)
                    );
                }
            }
            pool.resize_volume(&name, size)?;
            println!("resized volume {name} to {size} bytes");
        }
    }
    pool.close()?;
    Ok(())
}

/// Prints volumes (`name`, `size`, `id`, `map_bytes` each) as a table or JSON.
fn print_list(vols: &[serde_json::Value], json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(vols)?);
    } else {
        println!("{:<24} {:>16}", "NAME", "SIZE");
        for v in vols {
            println!("{:<24} {:>16}", v["name"].as_str().unwrap_or(""), v["size"]);
        }
    }
    Ok(())
}

/// The same commands against a running server, through its admin socket (volume names hold
/// no spaces, so they are single words of its commands).
fn online(a: &VolumeArgs) -> Result<()> {
    use crate::admin::request;
    let lower = |c: &flashpool_engine::Compression| format!("{c:?}").to_lowercase();
    let command = match &a.cmd {
        VolumeCmd::List { json } => {
            let v = request(&a.data, "volume list")?;
            let vols: Vec<_> = v["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| serde_json::json!({"name": v["name"], "size": v["size"], "id": v["id"], "map_bytes": v["map_bytes"]}))
                .collect();
            return print_list(&vols, *json);
        }
        VolumeCmd::Create {
            name,
            size,
            compression,
        } => format!("volume create {name} {size} {}", lower(compression)),
        VolumeCmd::Compression { name, setting } => {
            format!("volume compression {name} {}", lower(setting))
        }
        VolumeCmd::Delete { name } => format!("volume delete {name}"),
        VolumeCmd::Resize { name, size, force } => {
            format!(
                "volume resize {name} {size}{}",
                if *force { " force" } else { "" }
            )
        }
    };
    let v = request(&a.data, &command)?;
    println!("{}", v["ok"].as_str().unwrap_or("done"));
    Ok(())
}

/// Bytes of written data a volume holds past `size`: what shrinking it to `size` would
/// discard (0 when `size` is not smaller). Offline `volume resize` and the admin API refuse
/// such a shrink unless forced.
pub(crate) fn data_past(v: &flashpool_engine::Volume, size: u64) -> flashpool_engine::Result<u64> {
    if size >= v.size() {
        return Ok(0);
    }
    Ok(v.block_status(size, v.size() - size)?
        .iter()
        .filter(|e| e.state == flashpool_engine::BlockState::Data)
        .map(|e| e.length)
        .sum())
}
