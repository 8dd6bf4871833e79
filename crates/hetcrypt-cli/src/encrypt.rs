//! `hetcrypt encrypt` and `hetcrypt decrypt`.

use std::process::ExitCode;

/// Arguments of `hetcrypt encrypt`.
#[derive(clap::Args, Debug)]
pub struct EncryptArgs {}

/// Arguments of `hetcrypt decrypt`.
#[derive(clap::Args, Debug)]
pub struct DecryptArgs {}

/// Runs `hetcrypt encrypt`.
pub fn run_encrypt(_args: EncryptArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("'encrypt' is not implemented yet")
}

/// Runs `hetcrypt decrypt`.
pub fn run_decrypt(_args: DecryptArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("'decrypt' is not implemented yet")
}
