//! `hetcrypt bench`: the seeds' experiment — many files per size, every policy, timed
//! from lane start to join — with tables, a chart and JSON written atomically.

mod chart;
mod stats;
mod table;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use hetcrypt::policy::Policy;
use hetcrypt::{Cipher, Direction, Dispatcher, Error, Mode};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::rngs::Xoshiro256PlusPlus;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::calibrate::Policies;
use crate::output::StagedDir;
use crate::workload::{
    human_size, parse_cipher, parse_count, parse_policy, parse_size, plural, random_bytes,
    random_key, EngineOpts, EngineSet, Machine, Workload,
};
use stats::{BenchReport, PolicyResult, Run, SizeResult, Skipped};

/// The pause between timed runs: in the testbed a policy that used the module leaves
/// interrupts and device work behind for a few milliseconds, which a following batch of
/// tiny jobs (~2 ms in all) paid for (docs/results.md, short runs).
const SETTLE_MS: u64 = 50;

/// Multiplies `--order-seed` into the rounds' shuffle seeds (the 64-bit golden ratio,
/// an odd constant that spreads consecutive salts over the seed space), so that salts
/// 1, 2, 3 ... do not collide with the (size, round) part of the seed.
const ORDER_SALT: u64 = 0x9E37_79B9_7F4A_7C15;

/// The order in which `policies` policies run in round `rep` of size number `index`:
/// a shuffle seeded by both and by `salt` (`--order-seed`; 0 gives the orders of
/// earlier versions).
fn round_order(policies: usize, index: usize, rep: usize, salt: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..policies).collect();
    order.shuffle(&mut Xoshiro256PlusPlus::seed_from_u64(
        (((index as u64) << 32) | rep as u64).wrapping_add(salt.wrapping_mul(ORDER_SALT)),
    ));
    order
}

/// The seeds' file sizes (seed 000, section 5: 8 B to 16 KiB).
const SEED_SIZES: &str = "8,16,64,256,1024,4096,8192,16384";
/// The policies that combine engines, compared after each engine alone: the seeds'
/// methods (round-robin, polling, pull) and the size-aware ones.
const COMBINING_POLICIES: [&str; 5] = ["round-robin", "polling", "pull", "threshold", "adaptive"];
/// Jobs of the untimed warm-up run of each policy: enough to open every lane and key
/// its contexts, few enough to cost nothing.
const WARMUP_JOBS: usize = 64;
/// The file written last into `--out`: its presence marks a complete bench output.
const JSON_FILE: &str = "bench.json";

/// Arguments of `hetcrypt bench`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "The seeds' experiment (Kaneko & Saito 2015): --files random files of each size are
generated in memory (or read with --input), then every policy encrypts the whole set
--reps times. The clock runs from the start of the lane threads to their join, as in the
papers: generating or reading files, and checking every output against the cpu
reference, are outside it.

Prints (and with --out DIR writes) Table A, the median time per policy and size with
min-max (the seeds' Table 2); Table B, jobs done per engine (their Table 3); Table C,
the speed-up against only:cpu and against the best single engine and the efficiency
against the ideal combination (1/T* = sum over engines of 1/T(only:engine)); Table D,
the speed-up against the best single engine paired run by run (each run against that
engine's run of the same round) with a 95% confidence interval, flagged 'loss' where
the whole interval is below 0.97x; and a chart of time against file size (their
Figure 9) as SVG and PNG. Timings on a shared machine are noisy: use --reps 25 or more
when the intervals matter.

CBC runs with PKCS#7 padding: --cipher aes-128-cbc means aes-128-cbc-pkcs7 here, as the
seeds' OpenSSL EVP calls padded, so file sizes need not be multiples of 16 (a decrypted
file's input is its padded ciphertext).

Policies whose engines this machine lacks (only:kernel without AF_ALG; any combining
policy when only one engine is available) are skipped with the reason, never faked.

The seeds' setup in the QEMU testbed (one CPU lane and the virtio-crypto device; the
generic `kernel` engine would pick the kernel's own AES-NI driver instead):
  testbed/run --profile soft --out results -- hetcrypt bench -q \\
    --engines cpu,kernel:virtio_crypto_aes_cbc --files 400 --reps 3 --out /out/soft
The soft profile takes the AES instructions out of the guest CPU; the cpu engine then
runs everything through OpenSSL EVP, one message at a time, as the seeds' CPU did."
)]
pub struct Args {
    /// Files (jobs) per size.
    #[arg(long, default_value_t = 4000, value_parser = parse_count)]
    files: u32,
    /// File sizes in bytes (k = 1024).
    #[arg(long, value_name = "SIZES", value_delimiter = ',', value_parser = parse_size, default_value = SEED_SIZES)]
    sizes: Vec<usize>,
    /// Cipher: aes-{128,192,256}-{cbc,ctr,gcm}; CBC runs with PKCS#7 padding.
    #[arg(long, value_parser = parse_cipher, default_value = "aes-128-cbc")]
    cipher: Cipher,
    /// Decrypt (real ciphertexts of the files) instead of encrypting.
    #[arg(long)]
    decrypt: bool,
    /// Policies to compare (comma-separated) [default: only:<engine> for each engine,
    /// then round-robin, polling, pull, threshold, adaptive]. round-robin:<w0>:<w1>
    /// deals the jobs in those proportions (one weight per engine, in --engines order):
    /// a sweep of weights finds the best fixed split.
    #[arg(long, visible_alias = "policy", value_name = "POLICIES", value_delimiter = ',', value_parser = parse_policy)]
    policies: Vec<String>,
    /// Timed runs per policy and size (the tables show the median).
    #[arg(long, default_value_t = 5, value_parser = parse_count)]
    reps: u32,
    /// Milliseconds to pause between timed runs, so that what one policy leaves
    /// behind (a module's late interrupts, its device thread still busy) is not
    /// timed as the next one's work; 0: none.
    #[arg(long, value_name = "MS", default_value_t = SETTLE_MS)]
    settle: u64,
    /// Salt of the rounds' policy orders: 0 (the default) takes the same orders on
    /// every run; runs pooled afterwards (several boots) should each take another, so
    /// that a neighbour's aftermath is not the same policy's in every run.
    #[arg(long, value_name = "N", default_value_t = 0)]
    order_seed: u64,
    /// Engines to use (comma-separated) [default: every engine this machine has].
    #[arg(
        long = "engines",
        visible_alias = "engine",
        value_name = "ENGINES",
        value_delimiter = ','
    )]
    engines: Vec<String>,
    /// Lanes per engine [default: each engine's own, e.g. one per core for cpu].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    lanes: Option<u16>,
    /// CBC messages a cpu lane encrypts in lockstep (multi-buffer); 1 sends every job
    /// through OpenSSL EVP alone, as `openssl speed` does [default: the engine's].
    #[arg(long, value_name = "CHAINS", value_parser = clap::value_parser!(u16).range(1..=hetcrypt::engine::cpu::MAX_CHAINS as i64))]
    cpu_chains: Option<u16>,
    /// Who runs CTR, CBC decryption and multi-buffer CBC encryption on the cpu engine:
    /// `auto` (the faster of the aes crate and OpenSSL EVP, measured at first use: see
    /// `hetcrypt engines`), `aes-crate` (always the crate) or `openssl-evp` (always EVP,
    /// multi-buffer off); run `bench` with each in turn to check the measured choice.
    #[arg(long, value_name = "IMPL", value_parser = crate::workload::parse_cpu_impl)]
    cpu_impl: Option<hetcrypt::engine::cpu::BlockParallel>,
    /// Read the files from this directory instead of generating them; files of equal
    /// length form one size.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["sizes", "files"])]
    input: Option<PathBuf>,
    /// Write bench.md, bench.json, bench.svg and bench.png into this directory
    /// (replaced as a whole at the end; nothing is left half-written on error).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
    /// Print the JSON report instead of the Markdown tables.
    #[arg(long)]
    json: bool,
    /// The calibration store threshold and adaptive start from [default: as for
    /// `hetcrypt calibrate`; none if there is no store, or it is stale].
    #[arg(long, value_name = "FILE")]
    calibration: Option<PathBuf>,
}

/// Runs `hetcrypt bench`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    // Fail on an unwritable --out before spending minutes measuring.
    let staged = args
        .out
        .as_deref()
        .map(|out| StagedDir::new(out, JSON_FILE))
        .transpose()?;

    let (cipher, notes) = bench_cipher(args.cipher);
    let direction = if args.decrypt {
        Direction::Decrypt
    } else {
        Direction::Encrypt
    };
    let mut makers = Policies::new(args.calibration.as_deref());
    let opts = EngineOpts {
        lanes: args.lanes.map(usize::from),
        cpu_chains: args.cpu_chains.map(usize::from),
        cpu_impl: args.cpu_impl,
        // The policies run each device engine at its default lanes (one), not at the
        // store's choice: with two module lanes `pull` fell to 0.36-0.80x at 8-256 B
        // and `adaptive` at 1 KiB from 0.93-0.97 to 0.80-0.81 of the best single engine
        // (docs/results.md, "Two device lanes against one"); `--lanes` sets any count.
        ..EngineOpts::default()
    };
    let set = EngineSet::named_or_all(&args.engines, opts.clone())?;
    if set.ready.is_empty() {
        bail!("no engine is available on this machine");
    }
    let engine_names: Vec<String> = set.ready.iter().map(|e| e.name().to_string()).collect();
    let dispatcher = Dispatcher::new(set.ready.clone())?;
    let key = random_key(cipher)?;
    let key_id = dispatcher.add_key(key.clone())?;

    let (mut policies, mut skipped) =
        choose_policies(&args.policies, &set, &engine_names, &mut makers)?;
    let mut notes = notes;
    if let Some(store) = makers.store() {
        notes.push(format!(
            "threshold and adaptive from the calibration in {}",
            store.display()
        ));
    }
    for engine in &set.ready {
        if let Some(choice) = opts.lane_choice(engine) {
            notes.push(format!(
                "{}: {} lane{} ({})",
                engine.name(),
                choice.lanes,
                plural(choice.lanes),
                choice.from
            ));
        }
    }
    let inputs = match &args.input {
        Some(dir) => read_inputs(dir)?,
        None => generated_sizes(&args.sizes, args.files as usize),
    };

    let total_sizes = inputs.len();
    let bar = progress(
        &args,
        (total_sizes * policies.len()) as u64 * u64::from(args.reps),
    );
    let mut sizes: Vec<SizeResult> = Vec::new();
    // The policy of the last timed run, recorded with the next one.
    let mut previous: Option<String> = None;
    for (index, input) in inputs.into_iter().enumerate() {
        let size = input.size;
        let plaintexts = input.files()?;
        let files = plaintexts.len();
        let work = Workload::new(cipher, direction, &key, key_id, plaintexts)?;
        if index == 0 {
            warm_up(&dispatcher, &work, &mut policies, &mut skipped)?;
            bar.set_length((total_sizes * policies.len()) as u64 * u64::from(args.reps));
        }
        let mut runs: BTreeMap<usize, Vec<Run>> = BTreeMap::new();
        for rep in 0..args.reps as usize {
            // A fresh order each round, so no policy always runs first (cold caches) or
            // right after the same neighbour. Rotating the order did the first but not
            // the second: each policy always followed the same one, so whatever a
            // neighbour leaves behind (a module's late completions and kernel work, the
            // caches it filled) weighed on one policy only, which matters for batches of
            // tiny jobs that take 2 ms in the testbed. Seeded by round, so a rerun takes
            // the same orders. The seed takes the size too: with few rounds, orders seeded
            // by round alone put a policy after the same neighbour at every size.
            for (position, i) in round_order(policies.len(), index, rep, args.order_seed)
                .into_iter()
                .enumerate()
            {
                std::thread::sleep(std::time::Duration::from_millis(args.settle));
                let (name, policy) = &policies[i];
                bar.set_message(format!(
                    "{} {name} (run {}/{})",
                    human_size(size),
                    rep + 1,
                    args.reps
                ));
                let batch = dispatcher.run(&work.jobs, policy.as_ref())?;
                work.check(&batch.outputs, &format!("{name} at {}", human_size(size)))?;
                if let Some((engine, reason)) = dispatcher.failed_engines().into_iter().next() {
                    bail!(
                        "engine {engine} failed during the bench ({reason}); results after it \
                         would mix two machines, so the bench stops"
                    );
                }
                let after = previous.replace(name.clone());
                runs.entry(i).or_default().push(Run::new(
                    batch.report,
                    policy.learned(),
                    position,
                    after,
                ));
                bar.inc(1);
            }
        }
        let mut result = SizeResult {
            size,
            files,
            bytes: work.bytes(),
            ideal_s: None,
            best_single: None,
            policies: runs
                .into_iter()
                .map(|(i, r)| PolicyResult::new(policies[i].0.clone(), r))
                .collect(),
        };
        result.derive(&engine_names);
        sizes.push(result);
    }
    bar.finish_and_clear();

    let report = BenchReport {
        machine: Machine::now(),
        cipher,
        direction,
        reps: args.reps,
        input: match &args.input {
            Some(dir) => format!("read from {}", dir.display()),
            None => format!(
                "{} random files of each size, generated in memory",
                args.files
            ),
        },
        timing: "one run = one batch of every file of a size under one policy, timed \
                 from the start of the lane threads to their join (the seeds' measure); \
                 making the files and checking each output against the cpu reference are \
                 outside it"
            .to_string(),
        engines: set.infos(),
        unavailable: set.unavailable,
        policies: policies.iter().map(|(n, _)| n.clone()).collect(),
        skipped,
        notes,
        sizes,
    };
    let json = serde_json::to_string_pretty(&report)?;
    let md = table::markdown(&report, staged.as_ref().map(|_| "bench.svg"));
    if let Some(staged) = staged {
        staged.write("bench.md", &md)?;
        chart::write(
            &report,
            &staged.staging_path("bench.svg"),
            &staged.staging_path("bench.png"),
        )?;
        // Written last: its presence marks the directory as a complete output.
        staged.write(JSON_FILE, &json)?;
        let out = staged.commit()?;
        if !args.quiet {
            eprintln!(
                "hetcrypt: wrote bench.md, bench.json, bench.svg and bench.png to {}",
                out.display()
            );
        }
    }
    if args.json {
        println!("{json}");
    } else {
        print!("{md}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The cipher the bench runs: CBC with PKCS#7 padding, as the seeds' EVP calls did,
/// so any file size works. Returns a note for the report when it maps.
fn bench_cipher(asked: Cipher) -> (Cipher, Vec<String>) {
    if asked.mode == Mode::Cbc {
        let padded = Cipher::new(asked.key_size, Mode::CbcPkcs7);
        let note = format!(
            "{asked} runs as {padded} (PKCS#7 padding, as the seeds' OpenSSL EVP calls), \
             so any file size works"
        );
        (padded, vec![note])
    } else {
        (asked, Vec::new())
    }
}

/// A named policy ready to run.
type Named = (String, Box<dyn Policy>);

/// The policies to run, and those skipped with the reason.
fn choose_policies(
    asked: &[String],
    set: &EngineSet,
    engines: &[String],
    makers: &mut Policies,
) -> anyhow::Result<(Vec<Named>, Vec<Skipped>)> {
    let defaulted = asked.is_empty();
    let names: Vec<String> = if defaulted {
        // Each engine alone (those this machine lacks too, to say why they are
        // missing), then every combining policy.
        let lacking = set.unavailable.iter().map(|u| &u.engine);
        engines
            .iter()
            .chain(lacking)
            .map(|e| format!("only:{e}"))
            .chain(COMBINING_POLICIES.iter().map(|p| p.to_string()))
            .collect()
    } else {
        asked.to_vec()
    };
    let mut run = Vec::new();
    let mut skipped = Vec::new();
    for name in names {
        let policy = match makers.by_name(&name) {
            Ok(p) => p,
            // Only the default list can name a policy this build lacks; a name the
            // user typed was already checked by the argument parser.
            Err(e) if defaulted => {
                skipped.push(Skipped {
                    policy: name,
                    reason: format!("this build of hetcrypt has no such policy ({e})"),
                });
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if let Some(engine) = name.strip_prefix("only:") {
            if !engines.iter().any(|e| e == engine) {
                let reason = match set.why_unavailable(engine) {
                    Some(why) => format!("engine {engine} is unavailable: {why}"),
                    None => format!("engine {engine} is not among this run's engines"),
                };
                skipped.push(Skipped {
                    policy: name,
                    reason,
                });
                continue;
            }
        } else if engines.len() < 2 {
            let mut reason = format!(
                "it combines engines, and this run has only {}",
                engines.join(", ")
            );
            for u in &set.unavailable {
                reason.push_str(&format!(" ({} unavailable: {})", u.engine, u.reason));
            }
            skipped.push(Skipped {
                policy: name,
                reason,
            });
            continue;
        }
        if run.iter().any(|(n, _): &Named| *n == name) {
            continue;
        }
        run.push((name, policy));
    }
    if run.is_empty() {
        let why: Vec<String> = skipped
            .iter()
            .map(|s| format!("{}: {}", s.policy, s.reason))
            .collect();
        bail!(
            "none of the policies can run on this machine's engines ({}): {}",
            engines.join(", "),
            why.join("; ")
        );
    }
    Ok((run, skipped))
}

/// One untimed run of each policy on a few jobs: opens every lane (threads, sockets,
/// key schedules) before the clock matters. A policy that cannot plan on these engines
/// moves to the skipped list.
fn warm_up(
    dispatcher: &Dispatcher,
    work: &Workload,
    policies: &mut Vec<Named>,
    skipped: &mut Vec<Skipped>,
) -> anyhow::Result<()> {
    let n = work.jobs.len().min(WARMUP_JOBS);
    let mut kept = Vec::new();
    for (name, policy) in policies.drain(..) {
        match dispatcher.run(&work.jobs[..n], policy.as_ref()) {
            Ok(batch) => {
                work.check(&batch.outputs, &format!("{name} (warm-up)"))?;
                kept.push((name, policy));
            }
            Err(Error::Policy { reason, .. }) => skipped.push(Skipped {
                policy: name,
                reason,
            }),
            Err(e) => return Err(e).with_context(|| format!("policy {name} failed")),
        }
    }
    if kept.is_empty() {
        bail!("none of the policies can run on this machine's engines");
    }
    *policies = kept;
    Ok(())
}

/// The files of one size: generated on demand, or read from `--input`.
struct SizeInput {
    size: usize,
    source: Source,
}

enum Source {
    Random { count: usize },
    Files(Vec<Vec<u8>>),
}

impl SizeInput {
    fn files(self) -> anyhow::Result<Vec<Vec<u8>>> {
        match self.source {
            Source::Random { count } => (0..count).map(|_| random_bytes(self.size)).collect(),
            Source::Files(files) => Ok(files),
        }
    }
}

fn generated_sizes(sizes: &[usize], files: usize) -> Vec<SizeInput> {
    let mut sorted = sizes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    sorted
        .into_iter()
        .map(|size| SizeInput {
            size,
            source: Source::Random { count: files },
        })
        .collect()
}

/// Reads every regular file of `dir` (not recursing), grouped by length.
fn read_inputs(dir: &Path) -> anyhow::Result<Vec<SizeInput>> {
    let shown = dir.display();
    let entries = std::fs::read_dir(dir).with_context(|| format!("cannot read {shown}"))?;
    let mut by_size: BTreeMap<usize, Vec<Vec<u8>>> = BTreeMap::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot read {shown}"))?;
        let path = entry.path();
        if !entry
            .file_type()
            .with_context(|| format!("cannot read {}", path.display()))?
            .is_file()
        {
            continue;
        }
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        by_size.entry(bytes.len()).or_default().push(bytes);
    }
    if by_size.is_empty() {
        bail!("{shown} holds no files to benchmark");
    }
    Ok(by_size
        .into_iter()
        .map(|(size, files)| SizeInput {
            size,
            source: Source::Files(files),
        })
        .collect())
}

/// A progress bar on stderr, hidden with --quiet or when stderr is not a terminal.
fn progress(args: &Args, total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if args.quiet || !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    } else {
        bar.set_draw_target(ProgressDrawTarget::stderr());
        if let Ok(style) =
            ProgressStyle::with_template("{bar:30} {pos}/{len} runs, {elapsed} {msg}")
        {
            bar.set_style(style);
        }
    }
    bar
}

#[cfg(test)]
mod tests {
    use super::round_order;

    /// Salt 0 keeps the orders of earlier versions (a rerun of an old measurement takes
    /// the same ones); another salt gives other orders, and each is a permutation.
    #[test]
    fn the_order_seed_changes_the_rounds_orders_and_zero_keeps_them() {
        // bench-short's seven policies at its fifth size (16 KiB), third round: the
        // order every one of its earlier boots took (only:cpu, round-robin, threshold,
        // adaptive, polling, pull, only:kernel).
        assert_eq!(round_order(7, 4, 2, 0), [0, 2, 5, 6, 3, 4, 1]);
        let salted: Vec<Vec<usize>> = (1..=5).map(|salt| round_order(7, 4, 2, salt)).collect();
        assert!(salted.iter().all(|o| *o != round_order(7, 4, 2, 0)));
        for order in &salted {
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..7).collect::<Vec<_>>());
        }
    }
}
