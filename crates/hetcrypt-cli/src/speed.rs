//! `hetcrypt speed`.

use std::process::ExitCode;

/// Arguments of `hetcrypt speed`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `hetcrypt speed`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("'speed' is not implemented yet")
}
