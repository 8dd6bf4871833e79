//! `hetcrypt engines`.

use std::process::ExitCode;

/// Arguments of `hetcrypt engines`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `hetcrypt engines`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("'engines' is not implemented yet")
}
