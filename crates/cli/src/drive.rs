//! `flashpool drive list|add|fail|remove|rebuild` against a data dir (not while a server holds it; a
//! running server rebuilds by itself when a drive fails).

use crate::datadir;
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;

/// Arguments of `flashpool drive`.
#[derive(Args, Debug)]
pub struct DriveArgs {
    /// Data dir holding the pool.
    #[arg(long, default_value = "flashpool-data", global = true)]
    pub data: PathBuf,
    #[command(subcommand)]
    pub cmd: DriveCmd,
}

#[derive(Subcommand, Debug)]
pub enum DriveCmd {
    /// List the pool's drives and their state.
    List,
    /// Mark a drive failed (as an I/O error would): the pool runs degraded, and a server
    /// rebuilds its data after `--rebuild-delay` unless the drive is re-admitted first.
    Fail { index: usize },
    /// Take a drive out of the pool now: rebuild its data onto the others and retire it.
    Remove { index: usize },
    /// Rebuild the data of failed or missing drives onto the others.
    Rebuild,
    /// Add a drive (a new file in the data dir, the size of the others), also while serving:
    /// capacity grows at once, new stripes are wider.
    Add,
}

/// Runs `flashpool drive`.
pub fn run(a: DriveArgs) -> Result<()> {
    if crate::admin::server_running(&a.data) {
        return online(&a);
    }
    if let DriveCmd::Add = a.cmd {
        let dd = datadir::add_drive(&a.data)?;
        let info = dd.pool.info();
        println!(
            "drive added: {} drives, stripes {}+{}, capacity {} MiB",
            info.drive_count,
            info.k,
            info.m,
            info.capacity_bytes >> 20
        );
        dd.pool.close()?;
        return Ok(());
    }
    let dd = datadir::open_existing(&a.data)?;
    let pool = &dd.pool;
    match a.cmd {
        DriveCmd::List => {
            let info = pool.info();
            println!(
                "pool {}: {} drives, {} healthy, {}+{} protection, rebuild needed: {}",
                info.uuid,
                info.drive_count,
                info.healthy_drives,
                info.k,
                info.m,
                pool.needs_rebuild()
            );
            for d in pool.drives() {
                println!("{:>3}  {:<8}  {}", d.index, d.state, d.identity);
            }
        }
        DriveCmd::Fail { index } | DriveCmd::Remove { index } => {
            if index >= pool.info().drive_count {
                bail!(
                    "no drive {index} (the pool has {} drives)",
                    pool.info().drive_count
                );
            }
            pool.fail_drive(index)?;
            rebuild(pool)?;
        }
        DriveCmd::Rebuild => rebuild(pool)?,
        DriveCmd::Add => unreachable!("handled above"),
    }
    pool.close()?;
    Ok(())
}

fn rebuild(pool: &flashpool_engine::Pool) -> Result<()> {
    if !pool.needs_rebuild() {
        println!("nothing to rebuild");
        return Ok(());
    }
    let st = pool.rebuild()?;
    println!(
        "rebuild done: {} segments, {} MiB moved in {:.1} s ({:.1} MiB/s)",
        st.total_segments,
        st.moved_bytes >> 20,
        st.elapsed_secs,
        st.rate() / (1 << 20) as f64
    );
    Ok(())
}

/// The same commands against a running server, through its admin socket.
fn online(a: &DriveArgs) -> Result<()> {
    use crate::admin::request;
    match &a.cmd {
        DriveCmd::List => {
            let v = request(&a.data, "status")?;
            for d in v["drives"].as_array().into_iter().flatten() {
                println!("{:>3}  {:<8}  {}", d["index"], d["state"].as_str().unwrap_or(""), d["identity"].as_str().unwrap_or(""));
            }
            let rb = &v["rebuild"];
            if rb["running"].as_bool() == Some(true) {
                println!(
                    "rebuild: {:.1} % done, {:.1} MiB/s, ETA {} s",
                    rb["percent"].as_f64().unwrap_or(0.0),
                    rb["bytes_per_sec"].as_f64().unwrap_or(0.0) / (1 << 20) as f64,
                    rb["eta_secs"].as_f64().map_or("?".into(), |s| format!("{s:.0}"))
                );
            }
        }
        DriveCmd::Fail { index } => {
            let v = request(&a.data, &format!("fail {index}"))?;
            println!("{}", v["ok"].as_str().unwrap_or("done"));
        }
        DriveCmd::Remove { index } => {
            let v = request(&a.data, &format!("remove {index}"))?;
            println!("{}", v["ok"].as_str().unwrap_or("done"));
        }
        DriveCmd::Rebuild => println!("the server rebuilds by itself (see --rebuild-delay); `flashpool drive list` shows progress"),
        DriveCmd::Add => {
            let v = request(&a.data, "add")?;
            println!("{}", v["ok"].as_str().unwrap_or("done"));
        }
    }
    Ok(())
}
