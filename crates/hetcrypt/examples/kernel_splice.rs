//! Whether the `kernel` engine's lane should splice a request's input into the AF_ALG
//! socket (`vmsplice` + `splice`, no copy, two more system calls) or copy it in with
//! `sendmsg`, size by size, in one process: two lanes of `kernel:<driver>`, one that
//! never splices and one that always does, take turns in short slices, round after
//! round, so that a busy host's swings fall on both alike. Prints each round's rates
//! and the median (and range) of the per-round ratios spliced / copied.
//!
//! ```text
//! cargo build --release --example kernel_splice
//! testbed/run --profile soft --with target/release/examples/kernel_splice -- kernel_splice
//! ```
//!
//! Arguments (all optional): rounds (default 8), seconds per slice (default 0.25), the
//! driver (default `virtio_crypto_aes_cbc`). AES-128-CBC encryption of one buffer
//! again and again, as `openssl speed` does.

use std::time::{Duration, Instant};

use hetcrypt::engine::kernel::KernelEngine;
use hetcrypt::engine::Lane;
use hetcrypt::{Cipher, Direction, Job, JobOutput, Key, KeyStore};

/// Request sizes measured: `openssl speed`'s, and 4 KiB.
const SIZES: [usize; 7] = [16, 64, 256, 1024, 4096, 8192, 16384];
/// The two ways: the smallest request spliced (never; always).
const WAYS: [(&str, usize); 2] = [("copied", usize::MAX), ("spliced", 1)];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map_or(Ok(8), |s| s.parse())?;
    let slice = Duration::from_secs_f64(args.next().map_or(Ok(0.25), |s| s.parse())?);
    let driver = args
        .next()
        .unwrap_or_else(|| "virtio_crypto_aes_cbc".to_string());
    let keys = KeyStore::new();
    let key = keys.add(Key::new(vec![7; 16]))?;
    let mut lanes: Vec<Box<dyn Lane>> = Vec::new();
    for (_, min) in WAYS {
        let engine = KernelEngine::with_driver(&driver)?
            .with_splice_min(min)
            .into_engine();
        lanes.push(engine.open_lane(0)?);
    }
    println!(
        "=== {rounds} rounds of {:.2} s slices, AES-128-CBC encryption, kernel:{driver}",
        slice.as_secs_f64()
    );
    // rates[size][way][round], 1000s of bytes per second.
    let mut rates = vec![vec![Vec::new(); WAYS.len()]; SIZES.len()];
    for round in 0..rounds {
        for (s, &size) in SIZES.iter().enumerate() {
            let job = Job::new(
                Cipher::AES_128_CBC,
                Direction::Encrypt,
                key,
                [1; 16],
                vec![3; size],
            );
            let mut outs = vec![JobOutput::default(); WAYS.len()];
            // Both ways give the same output (checked once per size and round).
            for (lane, out) in lanes.iter_mut().zip(outs.iter_mut()) {
                lane.run(&job, &keys, out)?;
            }
            if outs.iter().any(|o| o.data != outs[0].data) {
                return Err(format!("outputs differ at {size} bytes").into());
            }
            for k in 0..WAYS.len() {
                // Alternate which way goes first.
                let w = (k + round) % WAYS.len();
                let t0 = Instant::now();
                let mut n = 0u64;
                while t0.elapsed() < slice {
                    lanes[w].run(&job, &keys, &mut outs[w])?;
                    n += 1;
                }
                rates[s][w].push((n * size as u64) as f64 / t0.elapsed().as_secs_f64() / 1e3);
            }
        }
        print!("round {round}:");
        for (s, size) in SIZES.iter().enumerate() {
            print!(
                " {size}: {:.0}/{:.0}",
                rates[s][0][round], rates[s][1][round]
            );
        }
        println!();
    }
    println!("--- spliced / copied, median of per-round ratios (range); copied rate median (1000s of bytes/s)");
    for (s, size) in SIZES.iter().enumerate() {
        let mut ratios: Vec<f64> = rates[s][1]
            .iter()
            .zip(&rates[s][0])
            .map(|(a, b)| a / b)
            .collect();
        ratios.sort_by(f64::total_cmp);
        let mut copied = rates[s][0].clone();
        copied.sort_by(f64::total_cmp);
        println!(
            "{size:>6} B: {:.3} ({:.3}-{:.3}); copied {:.0}",
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1],
            copied[copied.len() / 2]
        );
    }
    Ok(())
}
