//! The `flashpool` command-line tool: one binary, one module per subcommand.
//!
//! - `serve`  (serve.rs): export pool volumes over NBD.
//! - `volume` (volume.rs): manage the volumes of a data dir.
//! - `sim`    (sim.rs): the NAND SSD simulator.
//! - `drive`, `status`, `scrub` (drive.rs, status.rs, scrub.rs): members, state, integrity.
//! - `bench`  (bench.rs): in-process engine benchmarks.

mod admin;
mod bench;
mod datadir;
mod drive;
mod export;
mod memory;
mod nvme;
mod ops;
mod pool_vs_raid5;
mod scrub;
mod serve;
mod sim;
mod sim_drive;
mod size;
mod status;
mod volume;
mod wa_window;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "flashpool",
    version,
    about = "Pooled, erasure-coded flash storage"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Export the pool's volumes over NBD (creates a default pool on first run).
    Serve(Box<serve::ServeArgs>),
    /// Manage the volumes of a data dir.
    Volume(volume::VolumeArgs),
    /// List drives, add one, fail one, rebuild.
    Drive(drive::DriveArgs),
    /// Show the pool: drives, volumes, write amplification, compression, rebuild, counters.
    Status(status::StatusArgs),
    /// Check every stripe's CRCs, repair what parity can, list what it cannot.
    Scrub(scrub::ScrubArgs),
    /// In-process engine benchmarks (4 KiB random reads and writes on memory drives).
    Bench(bench::BenchArgs),
    /// Run the NAND SSD simulator.
    Sim(sim::SimArgs),
}

/// An argument error found after parsing (an unknown name, flags that together make an
/// invalid config or device): `main` exits 2 for it, as clap does for its own.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        // A command whose output goes to a closed pipe (`flashpool status | head -1`) ends
        // quietly, as Unix tools do. The server keeps Rust's default (SIGPIPE ignored): a
        // client that goes away is an error on its connection, not the end of the server.
        // SAFETY: setting a signal's disposition to the default; no handler runs our code.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let result = match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Volume(args) => volume::run(args),
        Command::Drive(args) => drive::run(args),
        Command::Status(args) => status::run(args),
        Command::Scrub(args) => scrub::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Sim(args) => sim::run(args),
    };
    if let Err(err) = result {
        eprintln!("flashpool: error: {err:#}");
        // Argument errors found after parsing exit 2, as clap's own do.
        let usage = err.downcast_ref::<UsageError>().is_some();
        std::process::exit(if usage { 2 } else { 1 });
    }
}
