//! `flashpool sim`: the NAND SSD simulator's command line.

use clap::Args;

/// Arguments of `flashpool sim`.
#[derive(Args)]
pub struct SimArgs {}

/// Runs `flashpool sim`.
pub fn run(_args: SimArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
