//! What a policy's own work costs per pull, with no engine at all: a batch of tiny jobs
//! that only the `cpu` engine may run (a module beside it, left out), its one lane
//! asking for one job a pull until the batch is done, as the soft guest's CPU lane
//! does (EVP, one message a pull). `adaptive` runs such a batch *sole* (no decision,
//! its pulls timed in segments); `threshold:<max>` and `only:cpu` take from a grouped
//! queue. Timed: the pulls only, not the planning (the dispatcher's clock starts after
//! it). Rounds alternate the policies in the same process; the figure per policy is the
//! median over rounds of nanoseconds per pull, and `adaptive`'s extra cost is the
//! median of its per-round difference to `threshold`.
//!
//! ```text
//! cargo bench -p hetcrypt --bench pullcost                       # 15 rounds
//! cargo bench -p hetcrypt --bench pullcost -- --rounds 31 --jobs 200
//! ```
//! Without cargo bench's `--bench` flag (`cargo test --benches`) it is a smoke run.

use std::hint::black_box;
use std::time::Instant;

use hetcrypt::engine::EngineKind;
use hetcrypt::policy::{
    Adaptive, EngineMask, EngineMeta, JobMeta, LaneMeta, Only, Plan, Policy, Threshold,
};
use hetcrypt::{Cipher, Direction};

/// The job size: the short runs' smallest (docs/results.md).
const JOB_LEN: usize = 64;

/// Batches per policy and round: enough that one round of one policy takes a few
/// milliseconds on the host, so the clock's resolution is noise.
const BATCHES: usize = 200;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = !args.iter().any(|a| a == "--bench" || a == "--full");
    let value = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let rounds = if quick { 1 } else { value("--rounds", 15) };
    let jobs_per_batch = value("--jobs", 200);

    let engines: Vec<EngineMeta> = [("cpu", EngineKind::Cpu), ("kernel", EngineKind::Kernel)]
        .iter()
        .map(|&(name, kind)| EngineMeta {
            name: name.to_string(),
            kind,
            lanes: 1,
            max_batch: 1,
            uses_host_cpu: kind == EngineKind::Cpu,
        })
        .collect();
    let lanes = [
        LaneMeta {
            engine: 0,
            index: 0,
        },
        LaneMeta {
            engine: 1,
            index: 0,
        },
    ];
    let jobs: Vec<JobMeta> = (0..jobs_per_batch)
        .map(|_| JobMeta {
            len: JOB_LEN,
            cipher: Cipher::AES_128_CBC,
            direction: Direction::Encrypt,
            engines: EngineMask(0b01),
        })
        .collect();
    let plan = Plan {
        jobs: &jobs,
        engines: &engines,
        lanes: &lanes,
        cores: 1,
    };
    let policies: Vec<(&str, Box<dyn Policy>)> = vec![
        ("adaptive", Box::new(Adaptive::new())),
        ("threshold", Box::new(Threshold::fixed(usize::MAX))),
        ("only:cpu", Box::new(Only::new("cpu"))),
    ];
    // Nanoseconds per pull, per policy and round.
    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); policies.len()];
    let mut out = Vec::with_capacity(jobs_per_batch);
    for round in 0..rounds {
        for k in 0..policies.len() {
            // Alternate who goes first.
            let p = (k + round) % policies.len();
            let mut total = 0.0;
            let mut pulls = 0usize;
            for _ in 0..BATCHES {
                let schedule = policies[p].1.plan(&plan).expect("plans");
                out.clear();
                let start = Instant::now();
                while schedule.next(0, 1, &mut out) {
                    pulls += 1;
                }
                total += start.elapsed().as_secs_f64();
                black_box(&out);
                assert_eq!(out.len(), jobs_per_batch, "{} ran every job", policies[p].0);
            }
            ns[p].push(total * 1e9 / pulls as f64);
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("ns per pull, median of {rounds} rounds ({jobs_per_batch} jobs a batch, one a pull):");
    for (p, (name, _)) in policies.iter().enumerate() {
        println!("  {name:<10} {:8.1}", median(&ns[p]));
    }
    let extra: Vec<f64> = ns[0].iter().zip(&ns[1]).map(|(a, t)| a - t).collect();
    println!(
        "  adaptive - threshold, median of per-round differences: {:+.1} ns per pull",
        median(&extra)
    );
}
