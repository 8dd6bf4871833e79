//! The `hetcrypt` command: one module per subcommand.
#![forbid(unsafe_code)]

mod bench;
mod calibrate;
mod encrypt;
mod engines;
mod keygen;
mod output;
mod speed;
mod workload;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Bulk AES on every crypto engine of this machine at once (CPU cores and kernel
/// crypto modules), scheduled job by job.
#[derive(Parser, Debug)]
#[command(name = "hetcrypt", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List this machine's crypto engines, their drivers and lanes.
    Engines(engines::Args),
    /// Throughput per engine or policy, in `openssl speed` units.
    Speed(speed::Args),
    /// The seeds' experiment: many small files, every policy, tables and charts.
    Bench(bench::Args),
    /// Measure each engine's cost per cipher and size; store it for every policy.
    Calibrate(calibrate::Args),
    /// Create a random key file (mode 0600), or print a key (`-o -`).
    Keygen(keygen::Args),
    /// Encrypt files or directory trees (C2SP chunked encryption).
    Encrypt(encrypt::EncryptArgs),
    /// Decrypt files or directory trees made by `hetcrypt encrypt`.
    Decrypt(encrypt::DecryptArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Engines(args) => engines::run(args),
        Command::Speed(args) => speed::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Calibrate(args) => calibrate::run(args),
        Command::Keygen(args) => keygen::run(args),
        Command::Encrypt(args) => encrypt::run_encrypt(args),
        Command::Decrypt(args) => encrypt::run_decrypt(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // Messages may carry file names: no raw control characters reach the
            // terminal.
            eprintln!("hetcrypt: {}", encrypt::escape(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}
