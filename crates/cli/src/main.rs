//! The `flashpool` command-line tool: one binary, one module per subcommand.
//!
//! - `serve`  (serve.rs): export pool volumes over NBD.
//! - `volume` (volume.rs): manage the volumes of a data dir.
//! - `sim`    (sim.rs): the NAND SSD simulator.
//! - `bench`  (bench.rs): in-process engine benchmarks.

mod sim;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "flashpool", version, about = "Pooled, erasure-coded flash storage")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the NAND SSD simulator.
    Sim(sim::SimArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Sim(args) => sim::run(args),
    };
    if let Err(err) = result {
        eprintln!("flashpool: error: {err:#}");
        std::process::exit(1);
    }
}
