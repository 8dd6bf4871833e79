//! `hetcrypt bench`.

use std::process::ExitCode;

/// Arguments of `hetcrypt bench`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `hetcrypt bench`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("'bench' is not implemented yet")
}
