//! How long a kernel-engine request takes by its place after a pause: the evidence
//! behind the calibration's warm-up of each point (`calibration::measure`,
//! `WARM_UP_TIME`), whose costs `adaptive` starts from.
//!
//! For each pause, `ROUNDS` times: sleep the pause, then send `REQUESTS` requests back
//! to back on one lane, timing each; prints the median time of the 1st, 2nd, ...
//! request after the pause. Runs in the testbed guest (it needs AF_ALG):
//!
//! ```text
//! cargo build --release --example latency
//! testbed/run --profile soft --with target/release/examples/latency -- latency
//! ```
//!
//! Arguments (all optional): the driver (default `virtio_crypto_aes_cbc`), the request
//! size in bytes (default 4096).

use std::time::{Duration, Instant};

use hetcrypt::engine::kernel::KernelEngine;
use hetcrypt::{Cipher, Direction, Job, JobOutput, Key, KeyStore};

/// Pauses before each run of requests, in milliseconds: from about one CPU job to a
/// whole batch.
const PAUSES_MS: [u64; 4] = [1, 5, 20, 100];
/// Runs per pause: enough for a median on a noisy host.
const ROUNDS: usize = 25;
/// Requests per run: the ramp lasts two or three.
const REQUESTS: usize = 12;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let driver = args
        .next()
        .unwrap_or_else(|| "virtio_crypto_aes_cbc".to_string());
    let size: usize = args.next().map_or(Ok(4096), |s| s.parse())?;
    let engine = KernelEngine::with_driver(&driver)?.into_engine();
    let keys = KeyStore::new();
    let key = keys.add(Key::new(vec![7; 16]))?;
    let mut lane = engine.open_lane(0)?;
    let job = Job::new(
        Cipher::AES_128_CBC,
        Direction::Encrypt,
        key,
        [1; 16],
        vec![3; size],
    );
    let mut out = JobOutput::default();
    // Keys the socket: the first request ever pays for it.
    lane.run(&job, &keys, &mut out)?;
    println!("{driver}, {size}-byte requests: median ms of the n-th request after a pause");
    for pause in PAUSES_MS {
        let mut by_place: Vec<Vec<f64>> =
            (0..REQUESTS).map(|_| Vec::with_capacity(ROUNDS)).collect();
        for _ in 0..ROUNDS {
            std::thread::sleep(Duration::from_millis(pause));
            for times in by_place.iter_mut() {
                let t = Instant::now();
                lane.run(&job, &keys, &mut out)?;
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        let medians: Vec<String> = by_place
            .iter_mut()
            .map(|times| {
                times.sort_by(f64::total_cmp);
                format!("{:.2}", times[times.len() / 2])
            })
            .collect();
        println!("pause {pause:3} ms: {}", medians.join(" "));
    }
    Ok(())
}
