//! `hetcrypt engines`: every engine of this machine, its drivers and lanes, and why
//! the missing ones are missing.

use std::process::ExitCode;

use hetcrypt::calibration::{self, Calibration, Fingerprint, LanesFrom};
use hetcrypt::engine::{CipherDriver, EngineInfo, EngineKind};
use hetcrypt::{Cipher, Direction};
use serde::Serialize;

use crate::output::Grid;
use crate::workload::{EngineOpts, EngineSet, Machine, Unavailable};

/// Arguments of `hetcrypt engines`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// The JSON of `hetcrypt engines --json`.
#[derive(Serialize)]
struct Listing {
    machine: Machine,
    /// Engines ready to run jobs.
    engines: Vec<EngineInfo>,
    /// Engines this machine lacks, with the reason.
    unavailable: Vec<Unavailable>,
    /// Per device engine and cipher (encryption), the lanes it runs and why.
    device_lanes: Vec<DeviceLanes>,
}

/// The lanes a device engine runs for one cipher: from the calibration store's lanes
/// sweep where it has one, else the engine's default.
#[derive(Serialize)]
struct DeviceLanes {
    engine: String,
    cipher: Cipher,
    lanes: usize,
    from: LanesFrom,
}

/// The lanes of every device engine for each of its ciphers (encryption), from `store`
/// or the engine's default.
fn device_lanes(engines: &[EngineInfo], store: Option<&Calibration>) -> Vec<DeviceLanes> {
    let mut out = Vec::new();
    for info in engines.iter().filter(|i| i.kind != EngineKind::Cpu) {
        for c in &info.ciphers {
            let choice = calibration::choose_lanes(
                None,
                store,
                &info.name,
                c.cipher,
                Direction::Encrypt,
                info.lanes,
            );
            out.push(DeviceLanes {
                engine: info.name.clone(),
                cipher: c.cipher,
                lanes: choice.lanes,
                from: choice.from,
            });
        }
    }
    out
}

/// Runs `hetcrypt engines`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let set = EngineSet::discover(EngineOpts::default())?;
    // A store that is missing or does not hold here only means default lanes.
    let (_, loaded) = calibration::load_store(None, &Fingerprint::current());
    let engines = set.infos();
    let listing = Listing {
        machine: Machine::now(),
        device_lanes: device_lanes(&engines, loaded.calibration().as_ref()),
        engines,
        unavailable: set.unavailable,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&listing)?);
    } else {
        print!("{}", render(&listing));
    }
    Ok(ExitCode::SUCCESS)
}

/// The table: one row per engine and cipher, then, per `cpu` engine, which
/// implementation serves each cipher and why (too long for a table cell: the figures
/// that chose between the `aes` crate and EVP), then the unavailable engines.
fn render(listing: &Listing) -> String {
    let mut grid = Grid::new([
        "ENGINE", "KIND", "LANES", "CIPHER", "DRIVER", "PRIORITY", "MODULE", "ASYNC",
    ]);
    for info in &listing.engines {
        let kind = serde_json::to_value(info.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| format!("{:?}", info.kind));
        for (i, c) in info.ciphers.iter().enumerate() {
            let first = i == 0;
            grid.row([
                if first {
                    info.name.clone()
                } else {
                    String::new()
                },
                if first { kind.clone() } else { String::new() },
                match listing
                    .device_lanes
                    .iter()
                    .find(|d| d.engine == info.name && d.cipher == c.cipher)
                {
                    Some(d) => format!("{} ({})", d.lanes, d.from),
                    None if first => info.lanes.to_string(),
                    None => String::new(),
                },
                c.cipher.to_string(),
                if info.kind == EngineKind::Cpu {
                    // The implementation's name; the reason follows the table.
                    let name = c.driver.split(" (").next().unwrap_or_default();
                    format!("{name} (why: below)")
                } else {
                    c.driver.clone()
                },
                c.priority
                    .map_or_else(|| "-".to_string(), |p| p.to_string()),
                c.module.clone().unwrap_or_else(|| "-".to_string()),
                is_async(c),
            ]);
        }
        if info.ciphers.is_empty() {
            grid.row([
                info.name.clone(),
                kind,
                info.lanes.to_string(),
                "(none)".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]);
        }
    }
    let m = &listing.machine;
    let mut out = format!(
        "Engines on this machine (Linux {}, {} core{}, {}):\n\n",
        m.kernel,
        m.cores,
        crate::workload::plural(m.cores),
        m.openssl
    );
    out.push_str(&grid.plain());
    if !listing.device_lanes.is_empty() {
        out.push_str(&format!(
            "\nLANES of a device engine: requests in flight for that cipher (encryption); \
             stored: from `hetcrypt calibrate`'s sweep (medians of alternating windows), \
             more lanes only where they beat fewer by {:.0}% or more, at most {}; default: \
             the engine's own, without a stored sweep.\n",
            calibration::LANES_MARGIN * 100.0,
            calibration::MAX_CHOSEN_LANES
        ));
    }
    for info in listing.engines.iter().filter(|i| i.kind == EngineKind::Cpu) {
        out.push_str(&format!(
            "\n{}: the implementation of each cipher, and why (CTR and CBC decryption: \
             the faster of the aes crate and OpenSSL EVP, measured at first use):\n",
            info.name
        ));
        for c in &info.ciphers {
            out.push_str(&format!("  {:<18} {}\n", c.cipher.to_string(), c.driver));
        }
    }
    if !listing.unavailable.is_empty() {
        out.push_str("\nUnavailable:\n");
        for u in &listing.unavailable {
            out.push_str(&format!("  {}: {}\n", u.engine, u.reason));
        }
    }
    out
}

fn is_async(c: &CipherDriver) -> String {
    match c.is_async {
        Some(true) => "yes".into(),
        Some(false) => "no".into(),
        None => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, kind: EngineKind, lanes: usize) -> EngineInfo {
        EngineInfo {
            name: name.into(),
            kind,
            lanes,
            ciphers: [Cipher::AES_128_CBC, Cipher::AES_256_CBC]
                .into_iter()
                .map(|cipher| CipherDriver {
                    cipher,
                    driver: "virtio_crypto_aes_cbc".into(),
                    priority: Some(150),
                    module: None,
                    is_async: Some(true),
                })
                .collect(),
        }
    }

    /// Without a store every device engine's cipher runs the engine's own count, said
    /// to be the default; the cpu has no row (its lanes are its cores).
    #[test]
    fn without_a_store_device_engines_run_their_default_and_say_so() {
        let engines = [
            info("cpu", EngineKind::Cpu, 2),
            info("kernel:virtio_crypto_aes_cbc", EngineKind::Kernel, 2),
            info("devcrypto", EngineKind::Devcrypto, 1),
        ];
        let rows = device_lanes(&engines, None);
        let got: Vec<(&str, Cipher, usize, LanesFrom)> = rows
            .iter()
            .map(|d| (d.engine.as_str(), d.cipher, d.lanes, d.from))
            .collect();
        let k = "kernel:virtio_crypto_aes_cbc";
        assert_eq!(
            got,
            [
                (k, Cipher::AES_128_CBC, 2, LanesFrom::Default),
                (k, Cipher::AES_256_CBC, 2, LanesFrom::Default),
                ("devcrypto", Cipher::AES_128_CBC, 1, LanesFrom::Default),
                ("devcrypto", Cipher::AES_256_CBC, 1, LanesFrom::Default),
            ]
        );
    }
}
