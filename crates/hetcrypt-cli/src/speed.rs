//! `hetcrypt speed`: throughput per engine or policy in `openssl speed -elapsed -evp`'s
//! table and units, and (`--split`) one large buffer split over 1, 2, ... lanes.

mod split;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use hetcrypt::policy::{self, Policy};
use hetcrypt::{Cipher, Direction, Dispatcher};
use serde::Serialize;

use crate::workload::{
    parse_cipher, parse_count, parse_policy, parse_size, plural, random_bytes, random_key,
    EngineOpts, EngineSet, Machine, StoredLanes, Workload,
};

/// Lanes of the `cpu` engine without --lanes: one, as `openssl speed` without `-multi`
/// runs one thread.
const SPEED_CPU_LANES: usize = 1;

/// `openssl speed`'s default block sizes (OpenSSL 3.0 `speed.c`, `lengths_list`).
const OPENSSL_SIZES: &str = "16,64,256,1024,8192,16384";

/// The most input bytes one batch holds: enough that a batch outlasts the cost of
/// starting its lane threads, small enough to keep memory modest at 16 KiB jobs.
const MAX_BATCH_BYTES: usize = 8 << 20;
/// The most input bytes one batch holds where a single lane runs it (on the calling
/// thread: no thread start to outlast): inputs and outputs together stay inside one
/// core's L2 (1 MiB on the AMD EPYC hosts), as `openssl speed` re-encrypts one warm
/// buffer. With 8 MiB batches a 1 KiB job read and wrote L3, which cost a third of
/// one lane's throughput there (issue 23).
const ONE_LANE_BATCH_BYTES: usize = 256 << 10;
/// The most jobs one batch holds (bounds the per-job bookkeeping at tiny sizes).
const MAX_BATCH_JOBS: usize = 16 * 1024;
/// Jobs in the first batch; batches double until one takes [`BATCH_TIME`].
const FIRST_BATCH_JOBS: usize = 16;
/// A batch this long makes thread start-up (tens of microseconds) negligible.
const BATCH_TIME: Duration = Duration::from_millis(50);

/// Arguments of `hetcrypt speed`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Throughput per engine or policy, printed in the table shape and units of `openssl speed
-elapsed -evp CIPHER` (1000s of bytes per second per block size) so the two can be read
side by side. One row per engine (default: every engine this machine has), or one row
per --policy. The same job is repeated for --seconds per size, in batches timed from
lane start to join; every output is checked against the cpu reference. With --split, one
--size buffer (CTR, or CBC decryption) is split by block ranges over 1, 2, ... lanes
instead (seed 003) and the speed-up per lane count is shown."
)]
pub struct Args {
    /// Engines, one row each: cpu, kernel, kernel:<driver>, devcrypto,
    /// devcrypto:<driver> (comma-separated or repeated). With --policy: the engines the policies combine. Default: every
    /// engine this machine has.
    #[arg(
        long = "engine",
        visible_alias = "engines",
        value_name = "ENGINE",
        value_delimiter = ','
    )]
    engines: Vec<String>,
    /// Policies, one row each: only:<engine>, round-robin, round-robin:<w0>:<w1>...
    /// (one weight per engine), polling, pull, threshold, threshold:<bytes>, adaptive
    /// (comma-separated or repeated).
    #[arg(long = "policy", visible_alias = "policies", value_name = "POLICY", value_delimiter = ',', value_parser = parse_policy)]
    policies: Vec<String>,
    /// Cipher: aes-{128,192,256}-{cbc,ctr,gcm} (default aes-128-cbc; aes-128-ctr
    /// with --split).
    #[arg(long, value_parser = parse_cipher)]
    cipher: Option<Cipher>,
    /// Time decryption instead of encryption (of real ciphertext).
    #[arg(long)]
    decrypt: bool,
    /// Block sizes in bytes (k = 1024).
    #[arg(long, value_name = "SIZES", value_delimiter = ',', value_parser = parse_size, default_value = OPENSSL_SIZES)]
    sizes: Vec<usize>,
    /// Seconds to run each size (openssl's default is 3).
    #[arg(long, default_value_t = 3.0, value_parser = parse_seconds)]
    seconds: f64,
    /// Lanes per engine (default: 1 on cpu, like `openssl speed` without -multi; a
    /// device engine's own, from the calibration store's lanes sweep or its default, as
    /// `hetcrypt engines` shows; with --split, the most lanes to try, default every core).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    lanes: Option<u16>,
    /// CBC messages a cpu lane encrypts in lockstep (multi-buffer); 1 sends every job
    /// through OpenSSL EVP alone, as `openssl speed` does [default: the engine's].
    #[arg(long, value_name = "CHAINS", value_parser = clap::value_parser!(u16).range(1..=hetcrypt::engine::cpu::MAX_CHAINS as i64))]
    cpu_chains: Option<u16>,
    /// Who runs CTR, CBC decryption and multi-buffer CBC encryption on the cpu engine:
    /// `auto` (the faster of the aes crate and OpenSSL EVP, measured at first use: see
    /// `hetcrypt engines`), `aes-crate` (always the crate) or `openssl-evp` (always EVP,
    /// multi-buffer off); run `speed` with each in turn to check the measured choice.
    #[arg(long, value_name = "IMPL", value_parser = crate::workload::parse_cpu_impl)]
    cpu_impl: Option<hetcrypt::engine::cpu::BlockParallel>,
    /// Split one large buffer over 1, 2, ... lanes (seed 003) instead of the table.
    #[arg(long)]
    split: bool,
    /// With --split: the buffer's size (k = 1024, M = 1024^2).
    #[arg(long, value_parser = parse_size, default_value = "64M")]
    size: usize,
    /// With --split: runs per lane count (the median is shown).
    #[arg(long, default_value_t = 3, value_parser = parse_count)]
    reps: u32,
    /// Time by CPU time instead of wall time (as `openssl speed` without -elapsed
    /// does): the process's over each batch's call, the lanes' work and the caller's
    /// share of the batch alike. On a loaded host a lane waiting for a core loses wall
    /// time but not CPU time.
    #[arg(long)]
    cpu_time: bool,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Do not print the per-size progress lines on stderr.
    #[arg(long, short)]
    quiet: bool,
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x.is_finite() => Ok(x),
        _ => Err(format!("'{s}' is not a positive number of seconds")),
    }
}

/// One measured cell: a row at one size.
#[derive(Clone, Debug, Serialize)]
struct Cell {
    /// Block (job) size in bytes.
    size: usize,
    /// Jobs run.
    jobs: u64,
    /// Input bytes processed.
    bytes: u64,
    /// Sum of the batches' wall times (lane start to join).
    seconds: f64,
    /// The process's CPU time over the batches' calls (the lanes' and the caller's).
    cpu_seconds: f64,
    /// The lanes' own CPU time over the batches (what `--cpu-time` timed before issue
    /// 23: it leaves out the batch's planning and ordering on the caller's thread).
    lane_cpu_seconds: f64,
    /// `bytes / seconds`, or `bytes / cpu_seconds` with `--cpu-time`.
    bytes_per_second: f64,
}

/// One row of the table: an engine or a policy.
#[derive(Clone, Debug, Serialize)]
struct Row {
    /// What the row measured (`cpu`, `pull`, ...).
    name: String,
    /// The engines under it, with lanes.
    engines: String,
    cells: Vec<Cell>,
}

/// The JSON of `hetcrypt speed --json`.
#[derive(Serialize)]
struct SpeedReport {
    machine: Machine,
    cipher: Cipher,
    direction: Direction,
    seconds_per_size: f64,
    /// Whether rates are per CPU second of the lanes rather than per wall second.
    cpu_time: bool,
    lanes_per_engine: Option<u16>,
    unavailable: Vec<crate::workload::Unavailable>,
    rows: Vec<Row>,
}

/// What one row runs on: a dispatcher and the policy that feeds it.
struct Target {
    name: String,
    dispatcher: Dispatcher,
    policy: Box<dyn Policy>,
}

/// Runs `hetcrypt speed`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.split {
        return split::run(&args);
    }
    let cipher = args.cipher.unwrap_or(Cipher::AES_128_CBC);
    let direction = if args.decrypt {
        Direction::Decrypt
    } else {
        Direction::Encrypt
    };
    let mut makers = crate::calibrate::Policies::new(None);
    let opts = EngineOpts {
        lanes: args.lanes.map(usize::from),
        cpu_lanes: Some(SPEED_CPU_LANES),
        cpu_chains: args.cpu_chains.map(usize::from),
        cpu_impl: args.cpu_impl,
        stored_lanes: makers.calibration().map(|store| StoredLanes {
            store,
            cipher,
            direction,
        }),
    };
    let key = random_key(cipher)?;

    let set = EngineSet::named_or_all(&args.engines, opts)?;
    let mut targets = Vec::new();
    if args.policies.is_empty() {
        for engine in &set.ready {
            let name = engine.name().to_string();
            targets.push(Target {
                policy: policy::by_name(&format!("only:{name}"))?,
                dispatcher: Dispatcher::new(vec![engine.clone()])?,
                name,
            });
        }
    } else {
        for p in &args.policies {
            targets.push(Target {
                name: p.clone(),
                dispatcher: Dispatcher::new(set.ready.clone())?,
                policy: makers.by_name(p)?,
            });
        }
    }
    if targets.is_empty() {
        bail!("no engine is available to measure");
    }

    let mut rows = Vec::new();
    for t in &targets {
        let key_id = t.dispatcher.add_key(key.clone())?;
        let engines = match t.dispatcher.engines() {
            // An engine's own row: its name is already the row's.
            [one] if one.name() == t.name => format!("{} lane{}", one.lanes(), plural(one.lanes())),
            all => all
                .iter()
                .map(|e| format!("{} ({} lane{})", e.name(), e.lanes(), plural(e.lanes())))
                .collect::<Vec<_>>()
                .join(", "),
        };
        let mut cells = Vec::new();
        for &size in &args.sizes {
            let cell = measure(t, key_id, &key, cipher, direction, size, &args)?;
            if !args.quiet {
                eprintln!(
                    "Doing {} {cipher} {direction} for {}s on {size} size blocks: {} jobs in {:.2}s",
                    t.name, args.seconds, cell.jobs, cell.seconds
                );
            }
            cells.push(cell);
        }
        if let Some((engine, reason)) = t.dispatcher.failed_engines().into_iter().next() {
            bail!(
                "engine {engine} failed while measuring {}: {reason}",
                t.name
            );
        }
        rows.push(Row {
            name: t.name.clone(),
            engines,
            cells,
        });
    }

    let report = SpeedReport {
        machine: Machine::now(),
        cipher,
        direction,
        seconds_per_size: args.seconds,
        cpu_time: args.cpu_time,
        lanes_per_engine: args.lanes,
        unavailable: set.unavailable,
        rows,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report, &args.sizes));
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs one target at one size for `--seconds`, in batches of growing size.
fn measure(
    target: &Target,
    key_id: hetcrypt::KeyId,
    key: &hetcrypt::Key,
    cipher: Cipher,
    direction: Direction,
    size: usize,
    args: &Args,
) -> anyhow::Result<Cell> {
    if size == 0 {
        bail!("a block size of 0 bytes measures nothing; give sizes of 1 byte or more");
    }
    let lanes: usize = target.dispatcher.engines().iter().map(|e| e.lanes()).sum();
    let batch_bytes = if lanes == 1 {
        ONE_LANE_BATCH_BYTES
    } else {
        MAX_BATCH_BYTES
    };
    let max_jobs = (batch_bytes / size).clamp(1, MAX_BATCH_JOBS);
    let plaintexts = (0..max_jobs)
        .map(|_| random_bytes(size))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let work = Workload::new(cipher, direction, key, key_id, plaintexts)?;
    let what = format!("{} at {size} bytes", target.name);

    // One untimed batch opens the lanes (threads, sockets, key schedules).
    let mut n = FIRST_BATCH_JOBS.min(max_jobs);
    let warm = target
        .dispatcher
        .run(&work.jobs[..n], target.policy.as_ref())?;
    work.check(&warm.outputs, &what)?;

    let goal = Duration::from_secs_f64(args.seconds);
    let batch_goal = BATCH_TIME.min(goal / 10);
    let (mut wall, mut bytes, mut jobs) = (Duration::ZERO, 0u64, 0u64);
    let (mut cpu, mut lane_cpu) = (Duration::ZERO, Duration::ZERO);
    // Each batch writes into the previous batch's outputs (`run_into`, as any caller
    // that runs batch after batch can), as `openssl speed` re-encrypts into one warm
    // buffer: first-touching fresh pages would otherwise be timed as crypto
    // (docs/performance.md).
    let mut outputs: Vec<hetcrypt::Result<hetcrypt::JobOutput>> = Vec::new();
    // The clock the size is timed by.
    let timed = |wall: Duration, cpu: Duration| if args.cpu_time { cpu } else { wall };
    while timed(wall, cpu) < goal {
        // The whole call's CPU time, as a library user pays it: planning the batch and
        // putting its outputs in job order on this thread as well as the lanes' work
        // (the lanes' own CPU time left the caller's part out).
        let cpu_before = process_cpu_time()?;
        let report =
            target
                .dispatcher
                .run_into(&work.jobs[..n], target.policy.as_ref(), &mut outputs)?;
        let batch_cpu = process_cpu_time()?.saturating_sub(cpu_before);
        work.check(&outputs, &what)?;
        wall += report.wall;
        cpu += batch_cpu;
        lane_cpu += report
            .engines
            .iter()
            .flat_map(|e| &e.lanes)
            .map(|l| l.cpu)
            .sum::<Duration>();
        bytes += report.bytes;
        jobs += report.jobs as u64;
        if timed(report.wall, batch_cpu) < batch_goal && n < max_jobs {
            n = (n * 2).min(max_jobs);
        }
    }
    Ok(Cell {
        size,
        jobs,
        bytes,
        seconds: wall.as_secs_f64(),
        cpu_seconds: cpu.as_secs_f64(),
        lane_cpu_seconds: lane_cpu.as_secs_f64(),
        bytes_per_second: bytes as f64 / timed(wall, cpu).as_secs_f64(),
    })
}

/// CPU time this process has used so far, all threads.
fn process_cpu_time() -> anyhow::Result<Duration> {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .map_err(|e| anyhow::anyhow!("cannot read this process's CPU time: {e}"))?;
    Ok(Duration::from(now))
}

/// The table exactly as `openssl speed -elapsed -evp` prints it (OpenSSL 3.0
/// `speed.c`: header `"type        "` then `"%7d bytes"` per size; rows `"%-13s"` then
/// `" %11.2fk"` for values over 10000, else `" %11.2f "`), with the engine or policy
/// in place of the cipher name and a line above saying what ran.
fn render(report: &SpeedReport, sizes: &[usize]) -> String {
    /// `speed.c` prints values above this in thousands with a `k` suffix.
    const KILO_THRESHOLD: f64 = 10000.0;
    let mut out = format!(
        "hetcrypt speed: {} {}, {} s per size, timed {}; every output checked against the \
         cpu reference\n",
        report.cipher,
        report.direction,
        report.seconds_per_size,
        if report.cpu_time {
            "by the CPU time of each batch's call (lanes and caller)"
        } else {
            "from lane start to join"
        }
    );
    for row in &report.rows {
        out.push_str(&format!("  {}: {}\n", row.name, row.engines));
    }
    for u in &report.unavailable {
        out.push_str(&format!("  (not measured) {}: {}\n", u.engine, u.reason));
    }
    out.push_str("The 'numbers' are in 1000s of bytes per second processed.\n");
    out.push_str("type        ");
    for s in sizes {
        out.push_str(&format!("{s:7} bytes"));
    }
    out.push('\n');
    for row in &report.rows {
        out.push_str(&format!("{:<13}", row.name));
        for c in &row.cells {
            // openssl's 'numbers' are bytes per second / 1000.
            let k = c.bytes_per_second / 1e3;
            if c.bytes_per_second > KILO_THRESHOLD {
                out.push_str(&format!(" {k:11.2}k"));
            } else {
                out.push_str(&format!(" {:11.2} ", c.bytes_per_second));
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_openssl_layout() {
        let report = SpeedReport {
            machine: Machine::now(),
            cipher: Cipher::AES_128_CBC,
            direction: Direction::Encrypt,
            seconds_per_size: 1.0,
            cpu_time: false,
            lanes_per_engine: None,
            unavailable: Vec::new(),
            rows: vec![Row {
                name: "cpu".into(),
                engines: "cpu (1 lane)".into(),
                cells: vec![
                    Cell {
                        size: 16,
                        jobs: 1,
                        bytes: 746_848_910,
                        seconds: 1.0,
                        cpu_seconds: 1.0,
                        lane_cpu_seconds: 1.0,
                        bytes_per_second: 746_848_910.0,
                    },
                    Cell {
                        size: 64,
                        jobs: 1,
                        bytes: 5000,
                        seconds: 1.0,
                        cpu_seconds: 1.0,
                        lane_cpu_seconds: 1.0,
                        bytes_per_second: 5000.0,
                    },
                ],
            }],
        };
        let text = render(&report, &[16, 64]);
        let lines: Vec<&str> = text.lines().collect();
        let n = lines.len();
        // Lines copied from `openssl speed -elapsed -evp aes-128-cbc` (OpenSSL 3.0.19),
        // with the row name and the second value changed.
        assert_eq!(
            lines[n - 3],
            "The 'numbers' are in 1000s of bytes per second processed."
        );
        assert_eq!(lines[n - 2], "type             16 bytes     64 bytes");
        assert_eq!(lines[n - 1], "cpu             746848.91k     5000.00 ");
    }
}
