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

/// What `hetcrypt --help` ends with: the common tasks, one command each.
const EXAMPLES: &str = "\
Examples:
  hetcrypt engines                            what this machine has, and why an engine is missing
  hetcrypt keygen -o my.key                   a new key file (mode 0600)
  hetcrypt encrypt --key my.key photos/ -o photos.hc
  hetcrypt decrypt --key my.key photos.hc -o photos-restored
  hetcrypt calibrate                          measure each engine once; every policy starts from it
  hetcrypt speed                              throughput per engine, as `openssl speed` prints it
  hetcrypt bench --out results                the seeds' experiment, with tables and charts

`hetcrypt <command> --help` says more about each.";

/// Bulk AES on every crypto engine of this machine at once (CPU cores and kernel
/// crypto modules), scheduled job by job.
#[derive(Parser, Debug)]
#[command(name = "hetcrypt", version, after_help = EXAMPLES)]
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
