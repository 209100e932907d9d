//! `flashpool volume create|list|delete|resize` against a data dir (not while a server holds
//! it: the data dir lock refuses).

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
            let vols = pool.volumes();
            if json {
                let list: Vec<_> = vols
                    .iter()
                    .map(|v| serde_json::json!({"name": v.name, "size": v.size, "id": v.id, "map_bytes": v.map_bytes}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!("{:<24} {:>16}", "NAME", "SIZE");
                for v in vols {
                    println!("{:<24} {:>16}", v.name, v.size);
                }
            }
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
