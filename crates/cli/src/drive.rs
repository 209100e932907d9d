//! `flashpool drive list|add|replace|fail|remove|readmit|rebuild`: member management, on a data
//! dir directly or, while a server holds it, through the server's admin socket.

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
    /// List the pool's members, their state and UUID.
    List,
    /// Mark a member failed (as an I/O error would): the pool runs degraded, and a server
    /// rebuilds its data after `--rebuild-delay` unless the member is re-admitted first (while
    /// that server runs: once the pool is closed a failed member is set aside). With no
    /// server, nothing is rebuilt yet: `drive rebuild` does it, or `drive replace N PATH`
    /// onto a new drive. Refused when it would leave more members down than parity covers.
    Fail {
        index: usize,
        /// Fail it even if the data becomes unavailable.
        #[arg(long)]
        force: bool,
    },
    /// Take a member out of the pool now: rebuild its data onto the others and retire it.
    /// Refused when the data would not fit the members left (with the rebuild reserve's room,
    /// which a server keeps unless run with --rebuild-reserve off), or when fewer than M + 2
    /// members would be left in service.
    Remove { index: usize },
    /// Put a failed member that was not rebuilt yet back in service.
    Readmit { index: usize },
    /// Rebuild the data of failed or missing members onto the others.
    Rebuild,
    /// Add a drive (a block device or file given, or a new file in the data dir the size of
    /// the others), also while serving: capacity grows at once, new stripes are wider.
    Add {
        /// Block device (used whole) or file (created at the pool's drive size if missing).
        path: Option<PathBuf>,
        /// Use it even if it holds a filesystem, a partition table or another pool.
        #[arg(long)]
        force: bool,
    },
    /// Replace member OLD by the drive at NEW (created at the pool's drive size if missing):
    /// NEW joins the pool, OLD is taken out and its data rebuilt onto the pool.
    Replace {
        old: usize,
        new: PathBuf,
        /// Use NEW even if it holds a filesystem, a partition table or another pool.
        #[arg(long)]
        force: bool,
    },
}

/// Runs `flashpool drive`.
pub fn run(a: DriveArgs) -> Result<()> {
    if crate::admin::server_running(&a.data) {
        return online(&a);
    }
    if let DriveCmd::List = a.cmd {
        let dd = datadir::open_read_only(&a.data)?;
        let pool = &dd.pool;
        let info = pool.info();
        println!(
            "pool {}: {} members, {} healthy, {}+{} protection, rebuild needed: {}",
            info.uuid,
            info.drive_count,
            info.healthy_drives,
            info.k,
            info.m,
            pool.needs_rebuild()
        );
        for d in pool.drives() {
            println!("{:>3}  {:<8}  {}  {}", d.index, d.state, d.uuid, d.identity);
        }
        for i in pool.ignored_drives() {
            println!("  -  {:<8}  {}: {}", i.kind, i.identity, i.reason);
        }
        return Ok(());
    }
    let dd = datadir::open_existing(&a.data)?;
    let pool = &dd.pool;
    match &a.cmd {
        DriveCmd::List => unreachable!("handled above"),
        DriveCmd::Add { path, force } => {
            let p = datadir::add_drive(&a.data, pool, path.as_deref(), *force)?;
            let info = pool.info();
            println!(
                "drive {} added: {} members, stripes {}+{}, capacity {} MiB",
                p.display(),
                info.drive_count,
                info.k,
                info.m,
                info.capacity_bytes >> 20
            );
        }
        DriveCmd::Replace { old, new, force } => {
            let st = datadir::replace_drive(&a.data, pool, *old, new, *force)?;
            println!(
                "member {old} replaced by {}: {} segments ({} MiB) rebuilt in {:.1} s",
                new.display(),
                st.total_segments,
                st.moved_bytes >> 20,
                st.elapsed_secs
            );
        }
        DriveCmd::Fail { index, force } => {
            check_index(pool, *index)?;
            if *force {
                pool.force_fail_drive(*index)?;
            } else {
                pool.fail_drive(*index)?;
            }
            // No rebuild here: as on a server, the member stays failed until a rebuild or a
            // replace, so `drive fail N` then `drive replace N PATH` keeps the pool's width
            // (a rebuild onto the others would narrow it first).
            println!(
                "drive {index} taken out of service; its data is rebuilt onto the others by `flashpool drive rebuild` or a server after its --rebuild-delay, or onto a new drive by `flashpool drive replace {index} PATH`"
            );
        }
        DriveCmd::Remove { index } => {
            check_index(pool, *index)?;
            // The reserve a server keeps by default (`serve --rebuild-reserve on`).
            let st = datadir::remove_drive(pool, *index, true)?;
            println!("{}", crate::admin::removed(*index, &st));
        }
        DriveCmd::Readmit { index } => {
            check_index(pool, *index)?;
            println!("{}", crate::admin::readmit(pool, *index)?);
        }
        DriveCmd::Rebuild => rebuild(pool)?,
    }
    pool.close()?;
    Ok(())
}

fn check_index(pool: &flashpool_engine::Pool, index: usize) -> Result<()> {
    let n = pool.info().drive_count;
    if index >= n {
        bail!("no drive {index} (the pool has {n} drives)");
    }
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
    let command = match &a.cmd {
        DriveCmd::List => {
            let v = request(&a.data, "status")?;
            for d in v["drives"].as_array().into_iter().flatten() {
                println!(
                    "{:>3}  {:<8}  {}  {}",
                    d["index"],
                    d["state"].as_str().unwrap_or(""),
                    d["uuid"].as_str().unwrap_or(""),
                    d["identity"].as_str().unwrap_or("")
                );
            }
            for i in v["not_members"].as_array().into_iter().flatten() {
                println!(
                    "  -  {:<8}  {}: {}",
                    i["kind"].as_str().unwrap_or(""),
                    i["identity"].as_str().unwrap_or(""),
                    i["reason"].as_str().unwrap_or("")
                );
            }
            let rb = &v["rebuild"];
            if rb["running"].as_bool() == Some(true) {
                println!(
                    "rebuild: {:.1} % done, {:.1} MiB/s, ETA {} s",
                    rb["percent"].as_f64().unwrap_or(0.0),
                    rb["bytes_per_sec"].as_f64().unwrap_or(0.0) / (1 << 20) as f64,
                    rb["eta_secs"]
                        .as_f64()
                        .map_or("?".into(), |s| format!("{s:.0}"))
                );
            }
            return Ok(());
        }
        DriveCmd::Fail { index, force } => {
            format!("fail {index}{}", if *force { " force" } else { "" })
        }
        DriveCmd::Remove { index } => format!("remove {index}"),
        DriveCmd::Readmit { index } => format!("readmit {index}"),
        DriveCmd::Rebuild => "rebuild".into(),
        DriveCmd::Add { path, force } => format!(
            "add {} {}",
            u8::from(*force),
            path.as_ref()
                .map(|p| absolute(p).display().to_string())
                .unwrap_or_default()
        ),
        DriveCmd::Replace { old, new, force } => format!(
            "replace {old} {} {}",
            u8::from(*force),
            absolute(new).display()
        ),
    };
    let v = request(&a.data, &command)?;
    println!("{}", v["ok"].as_str().unwrap_or("done"));
    Ok(())
}

/// A path as the server (whose working directory may differ) must see it.
fn absolute(p: &std::path::Path) -> PathBuf {
    if p.is_absolute() {
        p.to_owned()
    } else {
        std::env::current_dir().map_or_else(|_| p.to_owned(), |c| c.join(p))
    }
}
