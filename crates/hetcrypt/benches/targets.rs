//! The CPU-engine targets of issue 6 as ratios measured side by side in one run.
//!
//! A custom harness (`harness = false`), not criterion: every figure here is a ratio
//! of two things timed in alternating rounds of the same process — ours against
//! `openssl speed` (a subprocess), the dispatcher against a bare EVP loop, two lanes
//! against one — and the median of the per-round ratios is what counts. Criterion
//! times functions one after the other and cannot run `openssl speed`.
//!
//! ```text
//! cargo bench -p hetcrypt --bench targets                  # everything (~2 minutes)
//! cargo bench -p hetcrypt --bench targets -- engine chains # some sections
//! cargo bench -p hetcrypt --bench targets -- --quick       # ~1 s smoke run (CI)
//! cargo bench -p hetcrypt --bench targets -- --rounds 9 --seconds 0.5 --json out.jsonl
//! ```
//! `--count pull|lane|evp BATCHES [SIZE]` runs untimed batches for an instruction
//! counter (callgrind) instead.
//!
//! `HETCRYPT_BENCH_QUICK=1` in the environment means `--quick`, and so does running
//! the binary without cargo bench's `--bench` flag (e.g. `cargo test --benches`)
//! unless `--full` is given.
//!
//! `--block-parallel on|off|auto` sets who runs CTR, CBC decryption and multi-buffer
//! CBC encryption on the lanes under test of the `engine` and `chains` sections (the
//! `aes` crate or EVP; `auto` by default, which is EVP on a CPU without AES-NI).
//!
//! `--cpu-time` times both sides by CPU time instead of wall time (ours: the process's
//! CPU clock; openssl: `openssl speed` without `-elapsed`, its default). On a shared,
//! loaded host a process waiting for a core loses wall time but not CPU time, so the
//! single-lane ratios stay meaningful there; `split` always uses wall time (a speed-up
//! from parallel lanes is a wall-time notion) and warns when the load makes it moot.
//!
//! Sections: `engine` (one lane, 16 KiB, vs `openssl speed -evp`), `multibuf` (many
//! CBC encryption jobs on one lane vs `openssl speed -evp aes-128-cbc`), `chains` (the
//! multi-buffer width sweep), `dispatch` (`pull` on one lane vs a bare EVP loop on the
//! same jobs), `split` (64 MiB of CTR over 2 lanes vs 1).

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use hetcrypt::engine::cpu::{BlockParallel, CpuEngine};
use hetcrypt::engine::Lane;
use hetcrypt::policy::Pull;
use hetcrypt::{Cipher, Direction, Dispatcher, Job, JobOutput, Key, KeyId, KeyStore};
use openssl::cipher_ctx::CipherCtx;

/// The job size of the seeds' largest files and of `openssl speed`'s largest block.
const KIB16: usize = 16 * 1024;

/// Working set of the many-job runs: a few MiB, past L1 but inside this host's L2
/// slice (2 MiB) plus LLC, like `openssl speed` re-encrypting one warm buffer.
const WORKING_SET: usize = 2 << 20;

/// Options from the command line.
struct Opts {
    quick: bool,
    rounds: usize,
    seconds: f64,
    sections: Vec<String>,
    json: Option<std::fs::File>,
    cpu_time: bool,
    /// Who runs CTR and CBC decryption on the lanes under test (`--block-parallel
    /// on|off|auto`, default auto): `on` measures the `aes` crate where it would not
    /// be chosen (its software backend, e.g. built with `--cfg aes_backend="soft"`).
    parallel: BlockParallel,
}

impl Opts {
    fn parse() -> Opts {
        let mut opts = Opts {
            quick: std::env::var_os("HETCRYPT_BENCH_QUICK").is_some_and(|v| v != "0"),
            rounds: 5,
            seconds: 1.0,
            sections: Vec::new(),
            json: None,
            cpu_time: false,
            parallel: BlockParallel::Auto,
        };
        // `cargo bench` passes `--bench`; without it (`cargo test --benches`, or the
        // binary run by hand) this is a smoke run unless `--full` says otherwise.
        let args: Vec<String> = std::env::args().skip(1).collect();
        if !args.iter().any(|a| a == "--bench" || a == "--full") {
            opts.quick = true;
        }
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => opts.quick = true,
                "--cpu-time" => opts.cpu_time = true,
                "--block-parallel" => {
                    opts.parallel = match args.next().as_deref() {
                        Some("on") => BlockParallel::On,
                        Some("off") => BlockParallel::Off,
                        _ => BlockParallel::Auto,
                    }
                }
                "--rounds" => opts.rounds = args.next().and_then(|v| v.parse().ok()).unwrap_or(5),
                "--seconds" => {
                    opts.seconds = args.next().and_then(|v| v.parse().ok()).unwrap_or(1.0)
                }
                "--json" => {
                    let path = args.next().unwrap_or_else(|| "targets.jsonl".to_string());
                    opts.json = Some(std::fs::File::create(&path).unwrap_or_else(|e| {
                        panic!("cannot create {path}: {e}");
                    }));
                }
                // Flags cargo passes to every bench target.
                a if a.starts_with("--") => {}
                section => opts.sections.push(section.to_string()),
            }
        }
        if opts.quick {
            opts.rounds = 1;
            opts.seconds = 0.02;
        }
        opts
    }

    fn wants(&self, section: &str) -> bool {
        self.sections.is_empty() || self.sections.iter().any(|s| s == section)
    }
}

/// One compared pair: the medians of both sides and of the per-round ratios.
struct Row {
    section: &'static str,
    name: String,
    ours: Vec<f64>,
    base: Vec<f64>,
    unit: &'static str,
    target: Option<f64>,
}

impl Row {
    fn ratios(&self) -> Vec<f64> {
        self.ours
            .iter()
            .zip(&self.base)
            .map(|(a, b)| a / b)
            .collect()
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn spread(v: &[f64]) -> f64 {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if lo > 0.0 {
        hi / lo - 1.0
    } else {
        f64::NAN
    }
}

fn report(opts: &mut Opts, row: &Row) {
    let ratios = row.ratios();
    let ratio = median(ratios.clone());
    let verdict = match row.target {
        Some(t) if ratio >= t => format!("meets >= {t}"),
        Some(t) => format!("BELOW {t}"),
        None => String::new(),
    };
    println!(
        "{:9} {:44} {:>9.3} {:>9.3} {:4}  ratio {:>6.3} (spread {:>4.0}%)  {}",
        row.section,
        row.name,
        median(row.ours.clone()),
        median(row.base.clone()),
        row.unit,
        ratio,
        spread(&ratios) * 100.0,
        verdict
    );
    if let Some(file) = opts.json.as_mut() {
        let mut line = String::new();
        let _ = write!(
            line,
            "{{\"section\":\"{}\",\"name\":\"{}\",\"unit\":\"{}\",\"ours\":{:.4},\"baseline\":{:.4},\"ratio\":{:.4},\"rounds\":{},\"target\":{}}}",
            row.section,
            row.name,
            row.unit,
            median(row.ours.clone()),
            median(row.base.clone()),
            ratio,
            ratios.len(),
            row.target.map_or("null".to_string(), |t| t.to_string())
        );
        let _ = writeln!(file, "{line}");
    }
}

/// Deterministic bytes (benchmark data, not secrets).
fn data(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(7) ^ seed.wrapping_mul(13)) as u8)
        .collect()
}

fn key_store() -> (KeyStore, KeyId) {
    let keys = KeyStore::new();
    let id = keys
        .add(Key::new(vec![0x2b; 16]))
        .expect("16 bytes is a valid key");
    (keys, id)
}

/// `openssl speed -elapsed -evp NAME -bytes SIZE -seconds 1 -mr` (without `-elapsed`
/// under `--cpu-time`), in GB/s; `None` where the binary is missing or prints nothing
/// we can read.
fn openssl_speed(opts: &Opts, name: &str, decrypt: bool, size: usize) -> Option<f64> {
    let mut cmd = Command::new("openssl");
    cmd.arg("speed");
    if !opts.cpu_time {
        cmd.arg("-elapsed");
    }
    cmd.args(["-mr", "-seconds", "1", "-bytes"])
        .arg(size.to_string());
    if decrypt {
        cmd.arg("-decrypt");
    }
    let out = cmd.args(["-evp", name]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // Machine-readable result line: +F:<index>:<NAME>:<bytes per second>
    text.lines()
        .find_map(|l| l.strip_prefix("+F:"))
        .and_then(|l| l.rsplit(':').next())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|bps| bps / 1e9)
}

/// CPU time used so far by this process, all threads.
fn process_cpu_time() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

/// Repeats `f` (which processes `bytes` bytes per call) for `seconds` (of wall time,
/// or of process CPU time with `cpu_time`), in GB/s.
fn rate_on(cpu_time: bool, seconds: f64, bytes: usize, mut f: impl FnMut()) -> f64 {
    let now = || {
        if cpu_time {
            process_cpu_time()
        } else {
            // Wall time since a fixed origin, so both clocks read as durations.
            static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
            ORIGIN.get_or_init(Instant::now).elapsed()
        }
    };
    f(); // warm caches, contexts and allocations
    let start = now();
    let limit = Duration::from_secs_f64(seconds);
    let mut done = 0usize;
    while done == 0 || now() - start < limit {
        f();
        done += bytes;
    }
    done as f64 / (now() - start).as_secs_f64() / 1e9
}

/// `engine`: the cpu engine, one lane, one 16 KiB job at a time, vs `openssl speed`.
fn engine(opts: &mut Opts) {
    let (keys, id) = key_store();
    let cases = [
        (
            "aes-128-cbc",
            false,
            Cipher::AES_128_CBC,
            Direction::Encrypt,
        ),
        ("aes-128-cbc", true, Cipher::AES_128_CBC, Direction::Decrypt),
        (
            "aes-128-ctr",
            false,
            Cipher::AES_128_CTR,
            Direction::Encrypt,
        ),
        (
            "aes-128-gcm",
            false,
            Cipher::AES_128_GCM,
            Direction::Encrypt,
        ),
    ];
    for (name, decrypt, cipher, direction) in cases {
        let job = Job::with_iv(
            cipher,
            direction,
            id,
            &[7; 16][..cipher.iv_len()],
            data(KIB16, 1),
        )
        .expect("IV length fits");
        let mut lane = CpuEngine::with_lanes(1)
            .block_parallel(opts.parallel)
            .lane(0);
        // The same lane with every job through EVP: what the default lane replaced
        // for CTR and CBC decryption (the `aes` crate, block-parallel).
        let mut evp_lane = CpuEngine::with_lanes(1)
            .block_parallel(BlockParallel::Off)
            .lane(0);
        let mut evp_out = JobOutput::default();
        let mut out = JobOutput::default();
        let mut row = Row {
            section: "engine",
            name: format!("{name} {direction} 16KiB 1 lane vs openssl speed"),
            ours: Vec::new(),
            base: Vec::new(),
            unit: "GB/s",
            target: Some(0.95),
        };
        let mut evp_row = Row {
            name: format!("{name} {direction} 16KiB 1 lane, all EVP, vs openssl speed"),
            ours: Vec::new(),
            base: Vec::new(),
            target: None,
            ..row
        };
        let mut vs_evp = Row {
            name: format!("{name} {direction} 16KiB 1 lane vs same lane all EVP"),
            ours: Vec::new(),
            base: Vec::new(),
            target: None,
            ..row
        };
        // `openssl speed` streams one context and never starts a new message; every
        // job is a new message (new IV, a final, a tag). This second baseline is the
        // best a plain EVP loop does with one IV per message, so the gap to `openssl
        // speed` splits into what OpenSSL's re-initialisation costs and what we add.
        let mut per_message = Row {
            name: format!("{name} {direction} 16KiB 1 lane vs EVP loop, IV per message"),
            ours: Vec::new(),
            base: Vec::new(),
            ..row
        };
        let mut ctx = keyed_evp(cipher, direction);
        let mut buf = vec![0u8; KIB16 + 16];
        for _ in 0..opts.rounds {
            let ours = rate_on(opts.cpu_time, opts.seconds, KIB16, || {
                lane.run(&job, &keys, &mut out).expect("bench job runs");
            });
            let bare = rate_on(opts.cpu_time, opts.seconds, KIB16, || {
                evp_message(&mut ctx, &job, &mut buf);
            });
            let all_evp = rate_on(opts.cpu_time, opts.seconds, KIB16, || {
                evp_lane
                    .run(&job, &keys, &mut evp_out)
                    .expect("bench job runs");
            });
            per_message.ours.push(ours);
            per_message.base.push(bare);
            vs_evp.ours.push(ours);
            vs_evp.base.push(all_evp);
            if opts.quick {
                println!("engine    {name} {direction}: {ours:.3} GB/s, all-EVP lane {all_evp:.3} GB/s, EVP loop {bare:.3} GB/s (openssl speed skipped in --quick)");
                continue;
            }
            let Some(base) = openssl_speed(opts, name, decrypt, KIB16) else {
                println!("engine    openssl speed unavailable: skipped");
                return;
            };
            row.ours.push(ours);
            row.base.push(base);
            evp_row.ours.push(all_evp);
            evp_row.base.push(base);
        }
        if !opts.quick {
            // The outputs of both lanes must agree, or the comparison means nothing.
            assert_eq!(out, evp_out, "{name} {direction}: aes crate and EVP differ");
            report(opts, &row);
            report(opts, &evp_row);
            report(opts, &vs_evp);
            report(opts, &per_message);
        }
    }
}

/// An EVP context keyed with the benchmark key for `cipher` in `direction`.
fn keyed_evp(cipher: Cipher, direction: Direction) -> CipherCtx {
    use openssl::cipher::Cipher as C;
    let evp = match cipher.mode {
        hetcrypt::Mode::Cbc | hetcrypt::Mode::CbcPkcs7 => C::aes_128_cbc(),
        hetcrypt::Mode::Ctr => C::aes_128_ctr(),
        hetcrypt::Mode::Gcm => C::aes_128_gcm(),
    };
    let mut ctx = CipherCtx::new().expect("context");
    match direction {
        Direction::Encrypt => ctx.encrypt_init(Some(evp), Some(&[0x2b; 16]), None),
        Direction::Decrypt => ctx.decrypt_init(Some(evp), Some(&[0x2b; 16]), None),
    }
    .expect("init");
    if cipher.mode == hetcrypt::Mode::Cbc {
        ctx.set_padding(false);
    }
    ctx
}

/// One message through a keyed context the plain way: new IV, update, final (and the
/// tag for GCM encryption), into a reused buffer.
fn evp_message(ctx: &mut CipherCtx, job: &Job, buf: &mut [u8]) {
    match job.direction {
        Direction::Encrypt => ctx.encrypt_init(None, None, Some(job.iv())),
        Direction::Decrypt => ctx.decrypt_init(None, None, Some(job.iv())),
    }
    .expect("IV fits");
    let n = ctx.cipher_update(&job.input, Some(buf)).expect("update");
    if job.cipher.is_aead() {
        let n2 = ctx.cipher_final(&mut buf[n..]).expect("final");
        let mut tag = [0u8; 16];
        ctx.tag(&mut tag).expect("tag");
        std::hint::black_box((n2, tag));
    } else {
        std::hint::black_box(ctx.cipher_final(&mut buf[n..]).expect("final"));
    }
}

/// Jobs of `size` bytes filling the working set (at least `min` of them).
fn cbc_jobs(id: KeyId, size: usize, min: usize) -> Vec<Job> {
    (0..(WORKING_SET / size).max(min))
        .map(|i| {
            Job::new(
                Cipher::AES_128_CBC,
                Direction::Encrypt,
                id,
                [i as u8; 16],
                data(size, i),
            )
        })
        .collect()
}

/// Runs `jobs` on `lane` the way a dispatcher lane does, `batch` jobs per pull, with
/// output buffers reused from round to round.
fn lane_pass(
    lane: &mut dyn Lane,
    keys: &KeyStore,
    jobs: &[Job],
    batch: usize,
    outs: &mut [JobOutput],
) {
    let mut results: Vec<hetcrypt::Result<()>> = (0..batch).map(|_| Ok(())).collect();
    let mut refs: Vec<&Job> = Vec::with_capacity(batch);
    for (chunk, outs) in jobs.chunks(batch).zip(outs.chunks_mut(batch)) {
        refs.clear();
        refs.extend(chunk);
        lane.run_batch(&refs, keys, outs, &mut results[..chunk.len()]);
        debug_assert!(results.iter().all(|r| r.is_ok()), "bench jobs run");
    }
}

/// `multibuf`: many CBC encryption jobs on one lane vs `openssl speed -evp
/// aes-128-cbc` (one buffer, one chain) at the same size; on the lane alone and
/// through the dispatcher (`pull`, one lane, outputs allocated per batch).
fn multibuf(opts: &mut Opts) {
    let (keys, id) = key_store();
    let sizes: &[usize] = if opts.quick {
        &[1024]
    } else {
        &[1024, 4096, KIB16]
    };
    for &size in sizes {
        let jobs = cbc_jobs(id, size, 64);
        let bytes = jobs.len() * size;
        let engine = CpuEngine::with_lanes(1);
        let mut lane = engine.lane(0);
        let mut outs = vec![JobOutput::default(); jobs.len()];
        let dispatcher = Dispatcher::new(vec![engine.clone().into_engine()]).expect("one engine");
        let did = dispatcher
            .add_key(Key::new(vec![0x2b; 16]))
            .expect("valid key");
        let djobs: Vec<Job> = cbc_jobs(did, size, 64);
        let mut lane_row = Row {
            section: "multibuf",
            name: format!("cbc encrypt {size}B jobs, lane vs openssl speed"),
            ours: Vec::new(),
            base: Vec::new(),
            unit: "GB/s",
            target: Some(2.5),
        };
        let mut pull_row = Row {
            name: format!("cbc encrypt {size}B jobs, pull 1 lane vs openssl speed"),
            ours: Vec::new(),
            base: Vec::new(),
            ..lane_row
        };
        // The same product without any scheduling or multi-buffer: EVP one job at a
        // time into fresh output vectors. `pull` pays for allocating and first
        // touching every output (the API returns owned buffers), which `openssl
        // speed`, re-encrypting one warm buffer, never does; this row compares like
        // with like.
        let mut owned_row = Row {
            name: format!("cbc encrypt {size}B jobs, pull 1 lane vs bare EVP loop"),
            ours: Vec::new(),
            base: Vec::new(),
            target: None,
            ..lane_row
        };
        // The dispatcher writing into the previous batch's outputs
        // (`Dispatcher::run_reusing`), as a caller that recycles its buffers would.
        let mut reuse_row = Row {
            name: format!("cbc encrypt {size}B jobs, pull reusing outputs vs openssl speed"),
            ours: Vec::new(),
            base: Vec::new(),
            ..lane_row
        };
        let mut recycled: Vec<JobOutput> = Vec::new();
        let mut ctx = keyed_evp(Cipher::AES_128_CBC, Direction::Encrypt);
        for _ in 0..opts.rounds {
            let ours = rate_on(opts.cpu_time, opts.seconds, bytes, || {
                lane_pass(&mut lane, &keys, &jobs, engine_batch(&engine), &mut outs)
            });
            let pulled = rate_on(opts.cpu_time, opts.seconds, bytes, || {
                let batch = dispatcher.run(&djobs, &Pull).expect("pull plans");
                assert_eq!(batch.report.job_errors, 0);
            });
            let reusing = rate_on(opts.cpu_time, opts.seconds, bytes, || {
                recycled =
                    recycle(dispatcher.run_reusing(&djobs, &Pull, std::mem::take(&mut recycled)));
            });
            let bare = rate_on(opts.cpu_time, opts.seconds, bytes, || {
                drop(bare_evp(&mut ctx, &djobs))
            });
            owned_row.ours.push(pulled);
            owned_row.base.push(bare);
            if opts.quick {
                println!("multibuf  cbc {size}B: lane {ours:.3} GB/s, pull {pulled:.3} GB/s, reusing {reusing:.3} GB/s");
                continue;
            }
            let Some(base) = openssl_speed(opts, "aes-128-cbc", false, size) else {
                println!("multibuf  openssl speed unavailable: skipped");
                return;
            };
            lane_row.ours.push(ours);
            lane_row.base.push(base);
            pull_row.ours.push(pulled);
            pull_row.base.push(base);
            reuse_row.ours.push(reusing);
            reuse_row.base.push(base);
        }
        if !opts.quick {
            report(opts, &lane_row);
            report(opts, &pull_row);
            report(opts, &reuse_row);
            report(opts, &owned_row);
        }
    }
}

/// A batch's outputs, to hand to the next batch as spare buffers.
fn recycle(batch: hetcrypt::Result<hetcrypt::BatchResult>) -> Vec<JobOutput> {
    batch
        .expect("pull plans")
        .outputs
        .into_iter()
        .map(|o| o.expect("bench job runs"))
        .collect()
}

fn engine_batch(engine: &CpuEngine) -> usize {
    use hetcrypt::engine::Engine;
    engine.max_batch()
}

/// `chains`: the multi-buffer width sweep — N chains in lockstep vs EVP one job at a
/// time (N = 1), same jobs, same lane code path.
fn chains(opts: &mut Opts) {
    let (keys, id) = key_store();
    let sizes: &[usize] = if opts.quick { &[1024] } else { &[1024, KIB16] };
    for &size in sizes {
        let jobs = cbc_jobs(id, size, 64);
        let bytes = jobs.len() * size;
        let widths: &[usize] = if opts.quick {
            &[8]
        } else {
            &[2, 4, 6, 8, 12, 16]
        };
        let mut single = CpuEngine::with_lanes(1).multibuffer(1).lane(0);
        let mut outs = vec![JobOutput::default(); jobs.len()];
        for &n in widths {
            let mut lane = CpuEngine::with_lanes(1)
                .block_parallel(opts.parallel)
                .multibuffer(n)
                .lane(0);
            let mut row = Row {
                section: "chains",
                name: format!("cbc encrypt {size}B, {n} chains vs 1 (EVP)"),
                ours: Vec::new(),
                base: Vec::new(),
                unit: "GB/s",
                target: None,
            };
            for _ in 0..opts.rounds {
                row.ours
                    .push(rate_on(opts.cpu_time, opts.seconds, bytes, || {
                        lane_pass(&mut lane, &keys, &jobs, n, &mut outs)
                    }));
                row.base
                    .push(rate_on(opts.cpu_time, opts.seconds, bytes, || {
                        lane_pass(&mut single, &keys, &jobs, 1, &mut outs)
                    }));
            }
            report(opts, &row);
        }
    }
}

/// The bare loop `dispatch` compares with: one keyed EVP context, per job a new IV,
/// one update and a final into a fresh output vector — the same product the
/// dispatcher returns, without any scheduling.
fn bare_evp(ctx: &mut CipherCtx, jobs: &[Job]) -> Vec<Vec<u8>> {
    jobs.iter()
        .map(|job| {
            ctx.encrypt_init(None, None, Some(job.iv()))
                .expect("IV fits");
            let mut out = vec![0; job.input.len() + 16];
            let n = ctx
                .cipher_update(&job.input, Some(&mut out))
                .expect("update");
            let m = ctx.cipher_final(&mut out[n..]).expect("final");
            out.truncate(n + m);
            out
        })
        .collect()
}

/// [`bare_evp`] writing into `outs` (one vector per job, reused from call to call).
fn bare_evp_into(ctx: &mut CipherCtx, jobs: &[Job], outs: &mut [Vec<u8>]) {
    for (job, out) in jobs.iter().zip(outs.iter_mut()) {
        ctx.encrypt_init(None, None, Some(job.iv()))
            .expect("IV fits");
        out.resize(job.input.len() + 16, 0);
        let n = ctx.cipher_update(&job.input, Some(out)).expect("update");
        let m = ctx.cipher_final(&mut out[n..]).expect("final");
        out.truncate(n + m);
    }
}

/// A bare loop over the same lane the dispatcher runs, called the way a `pull` lane
/// thread calls it (`Lane::run_batch` on the engine's `max_batch` jobs at a time) into
/// a fresh output per job: the `pull` rows against this one are the dispatch tax
/// alone, with the same primitive on both sides.
fn bare_lane(lane: &mut dyn Lane, keys: &KeyStore, jobs: &[Job]) -> Vec<JobOutput> {
    let mut outs = vec![JobOutput::default(); jobs.len()];
    bare_lane_into(lane, keys, jobs, &mut outs);
    outs
}

/// [`bare_lane`] writing into `outs` (one output per job, reused from call to call).
fn bare_lane_into(lane: &mut dyn Lane, keys: &KeyStore, jobs: &[Job], outs: &mut [JobOutput]) {
    lane_pass(
        lane,
        keys,
        jobs,
        engine_batch(&CpuEngine::with_lanes(1)),
        outs,
    );
}

/// `dispatch`: AES-128-CTR jobs through `pull` on one lane vs the bare EVP loop on the
/// same jobs (the issue's dispatch tax) and vs a bare loop over the lane itself (the
/// tax alone: since the lane runs CTR through the `aes` crate, its jobs are cheaper
/// than EVP's).
fn dispatch(opts: &mut Opts) {
    let cases: &[(usize, usize, f64)] = if opts.quick {
        &[(16, 2_000, 0.70)]
    } else {
        // (job size, jobs per batch, target): batches of ~10-40 ms.
        &[
            (16, 200_000, 0.70),
            (1024, 20_000, 0.95),
            (KIB16, 2_000, 0.95),
        ]
    };
    for &(size, count, target) in cases {
        let dispatcher =
            Dispatcher::new(vec![CpuEngine::with_lanes(1).into_engine()]).expect("one engine");
        let id = dispatcher
            .add_key(Key::new(vec![0x2b; 16]))
            .expect("valid key");
        let jobs: Vec<Job> = (0..count)
            .map(|i| {
                let mut iv = [0u8; 16];
                iv[..8].copy_from_slice(&(i as u64).to_be_bytes());
                Job::new(
                    Cipher::AES_128_CTR,
                    Direction::Encrypt,
                    id,
                    iv,
                    data(size, i),
                )
            })
            .collect();
        let mut ctx = CipherCtx::new().expect("context");
        ctx.encrypt_init(
            Some(openssl::cipher::Cipher::aes_128_ctr()),
            Some(&[0x2b; 16]),
            None,
        )
        .expect("init");
        // The two must agree, or the comparison means nothing.
        let bare = bare_evp(&mut ctx, &jobs);
        let pulled = dispatcher.run(&jobs, &Pull).expect("pull plans");
        for (a, b) in bare.iter().zip(&pulled.outputs) {
            assert_eq!(a, &b.as_ref().expect("job runs").data);
        }
        drop((bare, pulled));
        let mut row = Row {
            section: "dispatch",
            name: format!("ctr {size}B x{count}: pull 1 lane vs bare EVP loop"),
            ours: Vec::new(),
            base: Vec::new(),
            unit: "GB/s",
            target: Some(target),
        };
        // The same pair with output buffers reused on both sides (`run_reusing`; the
        // loop writes into last round's vectors): the tax without the allocator.
        let mut reuse_row = Row {
            name: format!("ctr {size}B x{count}: same, both reusing outputs"),
            ours: Vec::new(),
            base: Vec::new(),
            ..row
        };
        let mut lane_row = Row {
            name: format!("ctr {size}B x{count}: pull 1 lane vs bare lane loop"),
            ours: Vec::new(),
            base: Vec::new(),
            target: None,
            ..row
        };
        let mut lane_reuse_row = Row {
            name: format!("ctr {size}B x{count}: same, vs lane loop, both reusing"),
            ours: Vec::new(),
            base: Vec::new(),
            target: None,
            ..row
        };
        let engine = CpuEngine::with_lanes(1);
        let mut lane = engine.lane(0);
        let mut lane_outs = vec![JobOutput::default(); jobs.len()];
        let mut recycled: Vec<JobOutput> = Vec::new();
        let mut bare_outs: Vec<Vec<u8>> = vec![Vec::new(); jobs.len()];
        let bytes = count * size;
        let seconds = opts.seconds.min(0.5);
        for round in 0..opts.rounds.max(1) * 2 {
            // Alternate which side goes first: neither always gets the warmer caches.
            let p = || {
                rate_on(opts.cpu_time, seconds, bytes, || {
                    drop(dispatcher.run(&jobs, &Pull).expect("pull plans"))
                })
            };
            let mut b = || {
                rate_on(opts.cpu_time, seconds, bytes, || {
                    drop(bare_evp(&mut ctx, &jobs))
                })
            };
            let (pr, br) = if round % 2 == 0 {
                let pr = p();
                (pr, b())
            } else {
                let br = b();
                (p(), br)
            };
            let lr = rate_on(opts.cpu_time, seconds, bytes, || {
                drop(bare_lane(&mut lane, dispatcher.keys(), &jobs))
            });
            row.ours.push(pr);
            row.base.push(br);
            lane_row.ours.push(pr);
            lane_row.base.push(lr);
            let mut p = || {
                rate_on(opts.cpu_time, seconds, bytes, || {
                    recycled = recycle(dispatcher.run_reusing(
                        &jobs,
                        &Pull,
                        std::mem::take(&mut recycled),
                    ));
                })
            };
            let mut b = || {
                rate_on(opts.cpu_time, seconds, bytes, || {
                    bare_evp_into(&mut ctx, &jobs, &mut bare_outs)
                })
            };
            let (pr, br) = if round % 2 == 0 {
                let pr = p();
                (pr, b())
            } else {
                let br = b();
                (p(), br)
            };
            reuse_row.ours.push(pr);
            reuse_row.base.push(br);
            lane_reuse_row.ours.push(pr);
            lane_reuse_row
                .base
                .push(rate_on(opts.cpu_time, seconds, bytes, || {
                    bare_lane_into(&mut lane, dispatcher.keys(), &jobs, &mut lane_outs)
                }));
        }
        let per_job_ns = |gbs: f64| size as f64 / gbs;
        report(opts, &row);
        report(opts, &lane_row);
        report(opts, &reuse_row);
        report(opts, &lane_reuse_row);
        println!(
            "{:9} per job: pull {:.0} ns, bare EVP loop {:.0} ns, bare lane loop {:.0} ns, \
             tax {:.0} ns",
            "",
            per_job_ns(median(row.ours.clone())),
            per_job_ns(median(row.base.clone())),
            per_job_ns(median(lane_row.base.clone())),
            per_job_ns(median(row.ours.clone())) - per_job_ns(median(lane_row.base.clone()))
        );
    }
}

/// Adds `blocks` to a 128-bit big-endian counter block.
fn ctr_add(iv: [u8; 16], blocks: u128) -> [u8; 16] {
    u128::from_be_bytes(iv).wrapping_add(blocks).to_be_bytes()
}

/// `split`: one 64 MiB CTR message cut into pieces (each its own job, its counter
/// advanced to the piece's offset) run by `pull` on 2 lanes vs 1.
fn split(opts: &mut Opts) {
    // The seeds' Xeon Phi experiment used 64 MB; pieces of 1 MiB let pull balance.
    let (total, piece) = if opts.quick {
        (4 << 20, 1 << 20)
    } else {
        (64 << 20, 1 << 20)
    };
    let message = data(total, 3);
    let iv = [0xf0; 16];
    let run = |lanes: usize| {
        let d =
            Dispatcher::new(vec![CpuEngine::with_lanes(lanes).into_engine()]).expect("one engine");
        let id = d.add_key(Key::new(vec![0x2b; 16])).expect("valid key");
        let jobs: Vec<Job> = message
            .chunks(piece)
            .enumerate()
            .map(|(i, p)| {
                let iv = ctr_add(iv, (i * piece / 16) as u128);
                Job::new(Cipher::AES_128_CTR, Direction::Encrypt, id, iv, p.to_vec())
            })
            .collect();
        (d, jobs)
    };
    let (one, jobs1) = run(1);
    let (two, jobs2) = run(2);
    // The pieces must put back together the one-message ciphertext.
    let whole = openssl::symm::encrypt(
        openssl::symm::Cipher::aes_128_ctr(),
        &[0x2b; 16],
        Some(&iv),
        &message,
    )
    .expect("one-shot CTR");
    let joined: Vec<u8> = two
        .run(&jobs2, &Pull)
        .expect("pull plans")
        .outputs
        .into_iter()
        .flat_map(|o| o.expect("piece runs").data)
        .collect();
    assert!(joined == whole, "split CTR differs from one-shot CTR");
    drop((whole, joined));
    let mut row = Row {
        section: "split",
        name: format!("ctr {} MiB in 1 MiB pieces: 2 lanes vs 1", total >> 20),
        ours: Vec::new(),
        base: Vec::new(),
        unit: "GB/s",
        target: Some(1.8),
    };
    let mut reuse_row = Row {
        name: format!(
            "ctr {} MiB, 1 MiB pieces, outputs reused: 2 lanes vs 1",
            total >> 20
        ),
        ours: Vec::new(),
        base: Vec::new(),
        ..row
    };
    let (mut spare1, mut spare2) = (Vec::new(), Vec::new());
    let reps = if opts.quick {
        1
    } else {
        opts.rounds.max(1) * 2
    };
    // One 64 MiB batch takes 10-40 ms, too short to sample on a shared host: each
    // sample is as many whole batches as fit in `seconds`, timed together.
    let seconds = if opts.quick { 0.0 } else { opts.seconds };
    let timed = |mut one_batch: Box<dyn FnMut() + '_>| {
        let start = Instant::now();
        let mut batches = 0u32;
        while batches == 0 || start.elapsed().as_secs_f64() < seconds {
            one_batch();
            batches += 1;
        }
        f64::from(batches) * total as f64 / start.elapsed().as_secs_f64() / 1e9
    };
    let plain = |d: &Dispatcher, jobs: &[Job]| {
        timed(Box::new(|| {
            d.run(jobs, &Pull).expect("pull plans");
        }))
    };
    let reusing = |d: &Dispatcher, jobs: &[Job], spare: &mut Vec<JobOutput>| {
        timed(Box::new(|| {
            let batch = d
                .run_reusing(jobs, &Pull, std::mem::take(spare))
                .expect("pull plans");
            *spare = recycle(Ok(batch));
        }))
    };
    let (busy_before, ours_before, wall) = (busy_cpu_seconds(), process_cpu_time(), Instant::now());
    for round in 0..reps {
        // Alternate which lane count goes first.
        if round % 2 == 0 {
            row.ours.push(plain(&two, &jobs2));
            row.base.push(plain(&one, &jobs1));
            reuse_row.ours.push(reusing(&two, &jobs2, &mut spare2));
            reuse_row.base.push(reusing(&one, &jobs1, &mut spare1));
        } else {
            row.base.push(plain(&one, &jobs1));
            row.ours.push(plain(&two, &jobs2));
            reuse_row.base.push(reusing(&one, &jobs1, &mut spare1));
            reuse_row.ours.push(reusing(&two, &jobs2, &mut spare2));
        }
    }
    report(opts, &reuse_row);
    report(opts, &row);
    // A load average counts this bench's own lanes; what matters is the CPU time other
    // processes took while it ran, from /proc/stat less our own process's CPU time.
    // (A smoke run is too short for /proc/stat's 10 ms ticks to say anything.)
    if let Some(busy_before) = busy_before.filter(|_| !opts.quick) {
        let wall = wall.elapsed().as_secs_f64();
        let ours = (process_cpu_time() - ours_before).as_secs_f64();
        let others = busy_cpu_seconds().map_or(0.0, |b| b - busy_before - ours) / wall;
        println!(
            "{:9} while it ran, other processes used {:.2} of the {} cores{}",
            "",
            others.max(0.0),
            hetcrypt::engine::cpu::available_cores(),
            if others > OTHERS_QUIET {
                ": they shared the cores, so this speed-up is not the engine's alone"
            } else {
                " (quiet)"
            }
        );
    }
}

/// Cores' worth of CPU other processes may take during `split` and it still counts as
/// a quiet run: a tenth of a core is what an idle shell and the kernel take here.
const OTHERS_QUIET: f64 = 0.1;

/// CPU seconds all processes have spent busy since boot (the `cpu` line of
/// /proc/stat, in USER_HZ = 100 ticks per second on Linux), if readable.
fn busy_cpu_seconds() -> Option<f64> {
    const USER_HZ: f64 = 100.0;
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .map(|t| t.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal: all but idle and iowait.
    let busy: u64 = ticks
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, t)| t)
        .sum();
    Some(busy as f64 / USER_HZ)
}

/// A section of the harness: runs and reports its pairs.
type Section = fn(&mut Opts);

/// Jobs per batch of `--count` runs: the `dispatch` section's 1 KiB batch.
const COUNT_JOBS: usize = 20_000;

/// `--count pull|lane|evp|pull-reuse|lane-reuse BATCHES [SIZE]`: runs `BATCHES` batches
/// of 20,000 CTR jobs of `SIZE` bytes (default 1024) through `pull` on one lane, a bare
/// loop over the lane, or a bare EVP loop (`-reuse`: writing into the previous batch's
/// outputs), untimed, for an instruction counter or a profiler: run it under
/// `valgrind --tool=callgrind` with 1 and 3 batches and divide the difference by
/// 40,000 (docs/performance.md, "What dispatch costs").
fn count(args: &[String]) {
    let mode = args.first().map(String::as_str).unwrap_or("pull");
    let batches: usize = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(1);
    let size: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(1024);
    let dispatcher =
        Dispatcher::new(vec![CpuEngine::with_lanes(1).into_engine()]).expect("one engine");
    let id = dispatcher
        .add_key(Key::new(vec![0x2b; 16]))
        .expect("valid key");
    let jobs: Vec<Job> = (0..COUNT_JOBS)
        .map(|i| {
            let mut iv = [0u8; 16];
            iv[..8].copy_from_slice(&(i as u64).to_be_bytes());
            Job::new(
                Cipher::AES_128_CTR,
                Direction::Encrypt,
                id,
                iv,
                data(size, i),
            )
        })
        .collect();
    let mut lane = CpuEngine::with_lanes(1).lane(0);
    let mut ctx = keyed_evp(Cipher::AES_128_CTR, Direction::Encrypt);
    let mut outs = vec![JobOutput::default(); jobs.len()];
    let mut spare = Vec::new();
    for _ in 0..batches {
        match mode {
            "lane" => drop(bare_lane(&mut lane, dispatcher.keys(), &jobs)),
            "lane-reuse" => bare_lane_into(&mut lane, dispatcher.keys(), &jobs, &mut outs),
            "evp" => drop(bare_evp(&mut ctx, &jobs)),
            "pull-reuse" => {
                spare = recycle(dispatcher.run_reusing(&jobs, &Pull, std::mem::take(&mut spare)))
            }
            _ => drop(dispatcher.run(&jobs, &Pull).expect("pull plans")),
        }
    }
    println!("{mode}: {batches} batches of {COUNT_JOBS} {size}-byte CTR jobs");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--count") {
        return count(&args[at + 1..]);
    }
    let mut opts = Opts::parse();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "hetcrypt targets: {} rounds, {} s {} per side{}; cores {}; load {}",
        opts.rounds,
        opts.seconds,
        if opts.cpu_time {
            "CPU time"
        } else {
            "wall time"
        },
        if opts.quick { " (quick)" } else { "" },
        hetcrypt::engine::cpu::available_cores(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "{:9} {:44} {:>9} {:>9} {:4}  (medians; ratio = median of per-round ratios)",
        "section", "pair", "ours", "baseline", ""
    );
    let sections: [(&str, Section); 5] = [
        ("engine", engine),
        ("multibuf", multibuf),
        ("chains", chains),
        ("dispatch", dispatch),
        ("split", split),
    ];
    for (name, f) in sections {
        if opts.wants(name) {
            f(&mut opts);
        }
    }
}
