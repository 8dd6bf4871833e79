//! `hetcrypt keygen`.

use std::process::ExitCode;

/// Arguments of `hetcrypt keygen`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `hetcrypt keygen`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("'keygen' is not implemented yet")
}
