//! Per-size throughput of the `cpu` engine's job path, against a streaming EVP loop.
//!
//! For each cipher and size, in alternating rounds of the same process: a bare EVP
//! context fed `EVP_CipherUpdate` over and over without a new IV (exactly what
//! `openssl speed -evp` times, in-process so no subprocess noise), one `cpu` lane
//! running one job at a time (`Lane::run`), the same lane given batches
//! (`Lane::run_batch`, the engine's batch width), and a dispatcher with one `cpu`
//! lane under `only:cpu` writing into the previous batch's outputs (`run_into`, what
//! `hetcrypt speed` times: the whole call, the batch's planning and ordering on the
//! caller's thread included). Throughput is in bytes of input per
//! second of process CPU time (this host is shared: a waiting process loses wall time,
//! not CPU time); the ratio columns are each path over the EVP loop, median of the
//! per-round ratios. The EVP loop pays rust-openssl's checks per call, so at 16 B it
//! runs at about a third of `openssl speed`'s figure; `scripts/speed-compare` compares
//! with `openssl speed` itself. Custom harness (`harness = false`) for the same
//! reason as `targets.rs`: the figures that count are same-run ratios.
//!
//! ```text
//! cargo bench -p hetcrypt --bench jobpath                       # every cipher, size
//! cargo bench -p hetcrypt --bench jobpath -- ctr 16 64          # some ciphers, sizes
//! cargo bench -p hetcrypt --bench jobpath -- --rounds 7 --seconds 0.3
//! ```
//! Without cargo bench's `--bench` flag (`cargo test --benches`) it is a smoke run.

use std::time::Duration;

use hetcrypt::engine::cpu::CpuEngine;
use hetcrypt::engine::Lane;
use hetcrypt::policy::Only;
use hetcrypt::{Cipher, Direction, Dispatcher, Job, JobOutput, Key, KeyId, KeyStore};
use openssl::cipher_ctx::CipherCtx;

/// `openssl speed`'s block sizes (OpenSSL 3.0 `speed.c`, `lengths_list`).
const SIZES: [usize; 6] = [16, 64, 256, 1024, 8192, 16384];

/// Input bytes per dispatcher batch: enough that the batch's thread start is noise,
/// as `hetcrypt speed` sizes its batches (it grows them up to 8 MiB).
const BATCH_BYTES: usize = 1 << 20;

/// Most jobs per dispatcher batch (`hetcrypt speed`'s bound at tiny sizes).
const BATCH_JOBS: usize = 16 * 1024;

/// The ciphers of issue 23's targets, by `openssl speed` name, plus CBC decryption.
const CASES: [(&str, Cipher, Direction); 4] = [
    ("aes-128-ctr", Cipher::AES_128_CTR, Direction::Encrypt),
    ("aes-128-gcm", Cipher::AES_128_GCM, Direction::Encrypt),
    ("aes-256-gcm", Cipher::AES_256_GCM, Direction::Encrypt),
    ("aes-128-cbc-dec", Cipher::AES_128_CBC, Direction::Decrypt),
];

struct Opts {
    rounds: usize,
    seconds: f64,
    filters: Vec<String>,
    sizes: Vec<usize>,
}

impl Opts {
    fn parse() -> Opts {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let quick = !args.iter().any(|a| a == "--bench" || a == "--full");
        let mut opts = Opts {
            rounds: 5,
            seconds: 0.2,
            filters: Vec::new(),
            sizes: Vec::new(),
        };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--rounds" => opts.rounds = args.next().and_then(|v| v.parse().ok()).unwrap_or(5),
                "--seconds" => {
                    opts.seconds = args.next().and_then(|v| v.parse().ok()).unwrap_or(0.2)
                }
                a if a.starts_with("--") => {}
                a => match a.parse::<usize>() {
                    Ok(size) => opts.sizes.push(size),
                    Err(_) => opts.filters.push(a.to_string()),
                },
            }
        }
        if opts.sizes.is_empty() {
            opts.sizes = SIZES.to_vec();
        }
        if quick {
            opts.rounds = 1;
            opts.seconds = 0.01;
        }
        opts
    }
}

/// Deterministic bytes (benchmark data, not secrets).
fn data(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(7) ^ seed.wrapping_mul(13)) as u8)
        .collect()
}

/// CPU time this process has used, all threads: on a shared, loaded host a waiting
/// process loses wall time but not CPU time, so same-run ratios stay meaningful.
fn cpu_now() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

/// Calls `f` (which processes `bytes` bytes) for `seconds` of process CPU time;
/// bytes per CPU second.
fn rate(seconds: f64, bytes: usize, mut f: impl FnMut()) -> f64 {
    f();
    let limit = Duration::from_secs_f64(seconds);
    let start = cpu_now();
    let mut done = 0usize;
    // Several calls per clock read: the clock costs as much as a 16-byte job.
    const CALLS_PER_READ: usize = 16;
    while done == 0 || cpu_now() - start < limit {
        for _ in 0..CALLS_PER_READ {
            f();
        }
        done += bytes * CALLS_PER_READ;
    }
    done as f64 / (cpu_now() - start).as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The EVP cipher `openssl speed -evp` would use for `cipher`.
fn evp(cipher: Cipher) -> &'static openssl::cipher::CipherRef {
    use hetcrypt::{KeySize, Mode};
    use openssl::cipher::Cipher as C;
    match (cipher.key_size, cipher.mode) {
        (KeySize::Aes128, Mode::Ctr) => C::aes_128_ctr(),
        (KeySize::Aes256, Mode::Ctr) => C::aes_256_ctr(),
        (KeySize::Aes128, Mode::Gcm) => C::aes_128_gcm(),
        (KeySize::Aes256, Mode::Gcm) => C::aes_256_gcm(),
        (KeySize::Aes256, _) => C::aes_256_cbc(),
        _ => C::aes_128_cbc(),
    }
}

fn main() {
    let opts = Opts::parse();
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string());
    println!(
        "jobpath: {model}, {}, median of {} round(s) of {} s; MB/s, and ratio to the EVP loop",
        openssl::version::version(),
        opts.rounds,
        opts.seconds
    );
    println!(
        "{:16} {:>6} {:>9} {:>9} {:>6} {:>9} {:>6} {:>9} {:>6}",
        "cipher", "size", "evp-loop", "run", "ratio", "batch", "ratio", "dispatch", "ratio"
    );
    for (name, cipher, direction) in CASES {
        if !opts.filters.is_empty() && !opts.filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let key_bytes = data(cipher.key_len(), 99);
        let keys = KeyStore::new();
        let id: KeyId = keys
            .add(Key::new(key_bytes.clone()))
            .expect("a key of the cipher's length");
        let engine = CpuEngine::with_lanes(1);
        let width = {
            use hetcrypt::engine::Engine;
            engine.batch_width(cipher, direction).max(1)
        };
        let dispatcher = Dispatcher::new(vec![engine.clone().into_engine()]).expect("one engine");
        let did = dispatcher
            .add_key(Key::new(key_bytes.clone()))
            .expect("a key of the cipher's length");
        let policy = Only::new("cpu");
        for &size in &opts.sizes {
            let iv = vec![7u8; cipher.iv_len()];
            let jobs: Vec<Job> = (0..(BATCH_BYTES / size).clamp(width, BATCH_JOBS))
                .map(|i| Job::with_iv(cipher, direction, id, &iv, data(size, i)).expect("IV fits"))
                .collect();
            let djobs: Vec<Job> = jobs
                .iter()
                .map(|j| {
                    let mut j = j.clone();
                    j.key = did;
                    j
                })
                .collect();
            let mut ctx = CipherCtx::new().expect("context");
            match direction {
                Direction::Encrypt => {
                    ctx.encrypt_init(Some(evp(cipher)), Some(&key_bytes), Some(&iv))
                }
                Direction::Decrypt => {
                    ctx.decrypt_init(Some(evp(cipher)), Some(&key_bytes), Some(&iv))
                }
            }
            .expect("init");
            ctx.set_padding(false);
            let mut buf = vec![0u8; size + 16];
            let mut lane = engine.lane(0);
            let mut out = JobOutput::default();
            let mut outs = vec![JobOutput::default(); width];
            let mut results: Vec<hetcrypt::Result<()>> = (0..width).map(|_| Ok(())).collect();
            let mut outputs: Vec<hetcrypt::Result<JobOutput>> = Vec::new();
            let (mut e, mut r, mut b, mut d) = (vec![], vec![], vec![], vec![]);
            let mut next = 0usize;
            for round in 0..opts.rounds {
                let mut run = || {
                    rate(opts.seconds, size, || {
                        lane.run(&jobs[0], &keys, &mut out).expect("bench job runs");
                    })
                };
                let ours_run = if round % 2 == 1 { run() } else { f64::NAN };
                let base = rate(opts.seconds, size, || {
                    let n = ctx
                        .cipher_update(&jobs[0].input, Some(&mut buf))
                        .expect("update");
                    std::hint::black_box(n);
                });
                let ours_run = if round % 2 == 1 { ours_run } else { run() };
                let batch = rate(opts.seconds, size * width, || {
                    let refs: Vec<&Job> =
                        (0..width).map(|k| &jobs[(next + k) % jobs.len()]).collect();
                    next = (next + width) % jobs.len();
                    lane.run_batch(&refs, &keys, &mut outs, &mut results);
                });
                let mut dbytes = 0u64;
                let mut dcpu = Duration::ZERO;
                let goal = Duration::from_secs_f64(opts.seconds);
                while dcpu < goal {
                    // The batch's CPU time: the lane thread's, and the caller's
                    // planning and putting outputs in job order.
                    let before = cpu_now();
                    let report = dispatcher
                        .run_into(&djobs, &policy, &mut outputs)
                        .expect("batch runs");
                    let cpu = cpu_now() - before;
                    dbytes += report.bytes;
                    dcpu += cpu;
                }
                e.push(base);
                r.push(ours_run);
                b.push(batch);
                d.push(dbytes as f64 / dcpu.as_secs_f64());
            }
            let ratio = |v: &[f64]| median(v.iter().zip(&e).map(|(a, b)| a / b).collect());
            println!(
                "{:16} {:>6} {:>9.0} {:>9.0} {:>6.3} {:>9.0} {:>6.3} {:>9.0} {:>6.3}",
                name,
                size,
                median(e.clone()) / 1e6,
                median(r.clone()) / 1e6,
                ratio(&r),
                median(b.clone()) / 1e6,
                ratio(&b),
                median(d.clone()) / 1e6,
                ratio(&d),
            );
        }
    }
}
