//! Requests per second of the two kernel paths, lane by lane (no dispatcher): the
//! `kernel` engine (AF_ALG) and the `devcrypto` engine (`/dev/crypto`) on one driver,
//! AES-128-CBC encryption of one buffer again and again, as `openssl speed` does; plus
//! what one look at a sysfs `driver` link costs (the engines' unplug check). Prints
//! `openssl speed` units (1000s of bytes per second) so the rows read beside
//! `openssl speed -elapsed -engine afalg -evp aes-128-cbc` in the same guest run.
//!
//! ```text
//! cargo build --release --example kernel_paths
//! testbed/run --profile soft --with target/release/examples/kernel_paths -- kernel_paths
//! ```
//!
//! Arguments (all optional): the driver (default `virtio_crypto_aes_cbc`), seconds per
//! size (default 1), the sizes (comma-separated; default `openssl speed`'s six), so that
//! one size at a time can take turns with `openssl speed -bytes N`.

use std::time::{Duration, Instant};

use hetcrypt::engine::devcrypto::DevcryptoEngine;
use hetcrypt::engine::kernel::KernelEngine;
use hetcrypt::engine::EngineRef;
use hetcrypt::{Cipher, Direction, Job, JobOutput, Key, KeyStore};
use nix::fcntl::{open, AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode};

/// `openssl speed`'s block sizes.
const SIZES: [usize; 6] = [16, 64, 256, 1024, 8192, 16384];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let driver = args
        .next()
        .unwrap_or_else(|| "virtio_crypto_aes_cbc".to_string());
    let seconds: f64 = args.next().map_or(Ok(1.0), |s| s.parse())?;
    let sizes: Vec<usize> = match args.next() {
        Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => SIZES.to_vec(),
    };
    let engines: Vec<EngineRef> = vec![
        KernelEngine::with_driver(&driver)?.into_engine(),
        DevcryptoEngine::with_driver(&driver)?.into_engine(),
    ];
    print!("{:<40}", "type");
    for s in &sizes {
        print!(" {:>11}", format!("{s} bytes"));
    }
    println!();
    for engine in &engines {
        let keys = KeyStore::new();
        let key = keys.add(Key::new(vec![7; 16]))?;
        let mut lane = engine.open_lane(0)?;
        print!("{:<40}", format!("lane of {}", engine.name()));
        for &size in &sizes {
            let job = Job::new(
                Cipher::AES_128_CBC,
                Direction::Encrypt,
                key,
                [1; 16],
                vec![3; size],
            );
            let mut out = JobOutput::default();
            lane.run(&job, &keys, &mut out)?;
            let t0 = Instant::now();
            let mut n = 0u64;
            while t0.elapsed() < Duration::from_secs_f64(seconds) {
                lane.run(&job, &keys, &mut out)?;
                n += 1;
            }
            let rate = (n * size as u64) as f64 / t0.elapsed().as_secs_f64();
            print!(" {:>10.2}k", rate / 1000.0);
        }
        println!();
    }
    // One look at a sysfs driver link, as the engines' unplug check makes per request.
    if let Ok(dev) = std::env::var("HETCRYPT_TESTBED_CRYPTO_DEV") {
        let link = std::path::Path::new(&dev).join("driver");
        let t0 = Instant::now();
        let n = 2000;
        for _ in 0..n {
            let _ = std::fs::symlink_metadata(&link);
        }
        println!(
            "one lstat of {}: {:.1} us",
            link.display(),
            t0.elapsed().as_secs_f64() * 1e6 / f64::from(n)
        );
        // What the engines do instead: `driver` relative to the directory held open.
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let dir = open(std::path::Path::new(&dev), flags, Mode::empty())?;
        let t0 = Instant::now();
        for _ in 0..n {
            let _ = fstatat(&dir, "driver", AtFlags::AT_SYMLINK_NOFOLLOW);
        }
        println!(
            "one fstatat(dir, \"driver\"): {:.1} us",
            t0.elapsed().as_secs_f64() * 1e6 / f64::from(n)
        );
    }
    Ok(())
}
