//! The bench's results and the figures derived from them: medians, speed-ups against
//! `only:cpu` and the best single engine (also paired run by run, with a confidence
//! interval), efficiency against the ideal combination.

use std::collections::BTreeMap;
use std::time::Duration;

use hetcrypt::engine::EngineInfo;
use hetcrypt::policy::adaptive::LearnedCost;
use hetcrypt::{Cipher, Direction, Report};
use serde::Serialize;

use crate::workload::{Machine, Unavailable};

/// Everything `hetcrypt bench` measured; written as `bench.json`.
#[derive(Debug, Serialize)]
pub struct BenchReport {
    /// Where it ran.
    pub machine: Machine,
    /// The cipher the jobs used.
    pub cipher: Cipher,
    /// Encrypt or decrypt.
    pub direction: Direction,
    /// Timed runs per policy and size.
    pub reps: u32,
    /// Where the files came from: `random` or the `--input` directory.
    pub input: String,
    /// What the clock measures.
    pub timing: String,
    /// The engines of the run.
    pub engines: Vec<EngineInfo>,
    /// Engines this machine lacks, and why.
    pub unavailable: Vec<Unavailable>,
    /// The policies that ran, in the order given.
    pub policies: Vec<String>,
    /// The policies that did not run, and why.
    pub skipped: Vec<Skipped>,
    /// Remarks a reader needs (cipher mapping, scale).
    pub notes: Vec<String>,
    /// Per file size.
    pub sizes: Vec<SizeResult>,
}

/// A policy that was not run.
#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    /// The policy.
    pub policy: String,
    /// Why, in words.
    pub reason: String,
}

/// The results at one file size.
#[derive(Debug, Serialize)]
pub struct SizeResult {
    /// File size in bytes (the plaintext's).
    pub size: usize,
    /// Files (jobs) per run.
    pub files: usize,
    /// Input bytes per run.
    pub bytes: u64,
    /// The ideal combined time T* (1/T* = sum over engines of 1/T_only:engine), when
    /// every engine's `only:` run exists.
    pub ideal_s: Option<f64>,
    /// The fastest `only:<engine>` policy.
    pub best_single: Option<String>,
    /// Per policy, in the order given.
    pub policies: Vec<PolicyResult>,
}

/// One policy at one size.
#[derive(Debug, Serialize)]
pub struct PolicyResult {
    /// The policy.
    pub policy: String,
    /// Median wall time over the runs, seconds.
    pub median_s: f64,
    /// Fastest run.
    pub min_s: f64,
    /// Slowest run.
    pub max_s: f64,
    /// Jobs per engine in the median run.
    pub jobs_per_engine: BTreeMap<String, usize>,
    /// `only:cpu`'s median over this one's.
    pub speedup_vs_cpu: Option<f64>,
    /// The best single engine's median over this one's.
    pub speedup_vs_best_single: Option<f64>,
    /// T* over this one's median: 1.0 is the ideal combination.
    pub efficiency: Option<f64>,
    /// The best single engine's time over this one's, run by run (each pair from the
    /// same round of the bench, so both saw the same machine state): median and its
    /// confidence interval.
    pub paired_vs_best_single: Option<Paired>,
    /// Index into `runs` of the median run.
    pub median_run: usize,
    /// Every timed run, in order.
    pub runs: Vec<Run>,
}

/// One timed run.
#[derive(Debug, Serialize)]
pub struct Run {
    /// Wall time, lane start to join, seconds.
    pub wall_s: f64,
    /// The dispatcher's report.
    pub report: Report,
    /// What the policy had learned once this run was over (`adaptive` only): per
    /// engine and class, its cost estimates and measured slowdowns, so a run that
    /// placed jobs oddly can be traced to the estimate behind it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learned: Option<Vec<LearnedCost>>,
    /// Its place in its round's order (0: first): with [`Run::after`], what pooled
    /// runs need to tell a policy's cost from its neighbours' aftermath.
    pub position: usize,
    /// The policy timed just before it (the previous round's or size's last for a
    /// round's first; none for the bench's first timed run). What a neighbour leaves
    /// behind weighs on the run after it: in the quiet sittings of the sixteenth
    /// session, a module-only run after another took ~9% longer than after a policy
    /// that used the cpu (docs/results.md, seventeenth session).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

impl PolicyResult {
    /// Summarises the runs of one policy (at least one).
    pub fn new(policy: String, runs: Vec<Run>) -> Self {
        let mut order: Vec<usize> = (0..runs.len()).collect();
        order.sort_by(|&a, &b| runs[a].wall_s.total_cmp(&runs[b].wall_s));
        let walls: Vec<f64> = order.iter().map(|&i| runs[i].wall_s).collect();
        let median_run = order
            .get((order.len().max(1) - 1) / 2)
            .copied()
            .unwrap_or(0);
        let jobs_per_engine = runs
            .get(median_run)
            .map(|r| crate::workload::jobs_per_engine(&r.report))
            .unwrap_or_default();
        PolicyResult {
            policy,
            median_s: median(&walls),
            min_s: walls.first().copied().unwrap_or(f64::NAN),
            max_s: walls.last().copied().unwrap_or(f64::NAN),
            jobs_per_engine,
            speedup_vs_cpu: None,
            speedup_vs_best_single: None,
            efficiency: None,
            paired_vs_best_single: None,
            median_run,
            runs,
        }
    }
}

impl Run {
    /// A run from its report, what its policy had learned by its end, its place in its
    /// round and the policy timed before it.
    pub fn new(
        report: Report,
        learned: Option<Vec<LearnedCost>>,
        position: usize,
        after: Option<String>,
    ) -> Self {
        Run {
            wall_s: duration_s(report.wall),
            report,
            learned,
            position,
            after,
        }
    }
}

fn duration_s(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The confidence the paired interval aims for: the usual 95%.
pub const CONFIDENCE: f64 = 0.95;

/// The median of per-round ratios and a distribution-free confidence interval for it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Paired {
    /// Median of the ratios.
    pub median: f64,
    /// Lower end of the interval.
    pub low: f64,
    /// Upper end of the interval.
    pub high: f64,
    /// The interval's actual coverage (at least [`CONFIDENCE`] when enough runs exist;
    /// with few runs, the min-max range and its smaller coverage).
    pub confidence: f64,
}

/// Median and confidence interval of `theirs[i] / ours[i]` over the rounds both ran.
///
/// The interval comes from order statistics (the sign test's interval): with `n`
/// ratios sorted, `[x_k, x_(n+1-k)]` covers the true median with probability
/// `1 - 2 P(Bin(n, 1/2) < k)`, whatever the distribution, so it suits timings with
/// long tails. Written here because it is a dozen lines and no statistics crate we use
/// has it.
pub fn paired(ours: &[f64], theirs: &[f64]) -> Option<Paired> {
    let mut ratios: Vec<f64> = ours
        .iter()
        .zip(theirs)
        .filter(|(o, _)| **o > 0.0)
        .map(|(o, t)| t / o)
        .collect();
    if ratios.is_empty() {
        return None;
    }
    ratios.sort_by(f64::total_cmp);
    let n = ratios.len();
    // P(Bin(n, 1/2) = i) for i = 0..n, built by the recurrence C(n, i+1) = C(n, i)(n-i)/(i+1).
    let mut pmf = Vec::with_capacity(n + 1);
    let mut p = 0.5f64.powi(n as i32);
    for i in 0..=n {
        pmf.push(p);
        p *= (n - i) as f64 / (i + 1) as f64;
    }
    // The largest k (1-based) whose two tails together stay within 1 - CONFIDENCE;
    // at least 1 (the min-max range).
    let mut k = 1;
    let mut tail = pmf[0];
    while k < n / 2 && 2.0 * (tail + pmf[k]) <= 1.0 - CONFIDENCE {
        tail += pmf[k];
        k += 1;
    }
    Some(Paired {
        median: median(&ratios),
        low: ratios[k - 1],
        high: ratios[n - k],
        confidence: 1.0 - 2.0 * tail,
    })
}

/// The median of sorted values (mean of the middle two for an even count).
pub fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

impl SizeResult {
    /// Fills in the comparisons once every policy at this size has run. `engines`
    /// are the names of the run's engines.
    pub fn derive(&mut self, engines: &[String]) {
        let only = |engine: &str| {
            self.policies
                .iter()
                .find(|p| p.policy == format!("only:{engine}"))
                .map(|p| p.median_s)
        };
        let singles: Vec<(String, f64)> = engines
            .iter()
            .filter_map(|e| only(e).map(|t| (e.clone(), t)))
            .collect();
        let best = singles
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(e, t)| (format!("only:{e}"), *t));
        // T* exists only if every engine's solo time is known.
        let ideal = (singles.len() == engines.len() && !singles.is_empty())
            .then(|| 1.0 / singles.iter().map(|(_, t)| 1.0 / t).sum::<f64>());
        let cpu = only("cpu");
        let walls = |p: &PolicyResult| p.runs.iter().map(|r| r.wall_s).collect::<Vec<_>>();
        let best_walls = best
            .as_ref()
            .and_then(|(name, _)| self.policy(name))
            .map(walls);
        for p in &mut self.policies {
            p.speedup_vs_cpu = cpu.map(|t| t / p.median_s);
            p.speedup_vs_best_single = best.as_ref().map(|(_, t)| t / p.median_s);
            p.efficiency = ideal.map(|t| t / p.median_s);
            p.paired_vs_best_single = best_walls.as_ref().and_then(|b| paired(&walls(p), b));
        }
        self.ideal_s = ideal;
        self.best_single = best.map(|(name, _)| name);
    }

    /// The result of `policy`, if it ran.
    pub fn policy(&self, policy: &str) -> Option<&PolicyResult> {
        self.policies.iter().find(|p| p.policy == policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(policy: &str, median_s: f64) -> PolicyResult {
        PolicyResult {
            policy: policy.into(),
            median_s,
            min_s: median_s,
            max_s: median_s,
            jobs_per_engine: BTreeMap::new(),
            speedup_vs_cpu: None,
            speedup_vs_best_single: None,
            efficiency: None,
            paired_vs_best_single: None,
            median_run: 0,
            runs: Vec::new(),
        }
    }

    /// The interval's ranks and coverage match the binomial tables: for 7 runs the
    /// min-max range (98.4%); for 25 runs the 8th and 18th (95.7%).
    #[test]
    fn paired_interval_from_order_statistics() {
        let ones = vec![1.0; 25];
        let theirs: Vec<f64> = (1..=25).map(f64::from).collect();
        let p = paired(&ones, &theirs).unwrap();
        assert_eq!((p.median, p.low, p.high), (13.0, 8.0, 18.0));
        assert!((p.confidence - 0.9567).abs() < 1e-3, "{p:?}");
        let p = paired(&ones[..7], &theirs[..7]).unwrap();
        assert_eq!((p.low, p.high), (1.0, 7.0));
        assert!((p.confidence - 0.984375).abs() < 1e-9, "{p:?}");
        // Ratios are theirs over ours, round by round.
        let p = paired(&[2.0, 4.0, 1.0], &[1.0, 1.0, 1.0]).unwrap();
        assert_eq!(p.median, 0.5);
        assert_eq!(paired(&[], &[]), None);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[1.0, 2.0, 9.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0, 4.0, 9.0]), 3.0);
        assert!(median(&[]).is_nan());
    }

    /// Two engines taking 3 s and 6 s alone: together ideally 2 s (1/2 = 1/3 + 1/6).
    #[test]
    fn ideal_combination_and_speedups() {
        let mut s = SizeResult {
            size: 16,
            files: 1,
            bytes: 16,
            ideal_s: None,
            best_single: None,
            policies: vec![
                result("only:cpu", 6.0),
                result("only:kernel", 3.0),
                result("pull", 2.5),
            ],
        };
        s.derive(&["cpu".into(), "kernel".into()]);
        assert_eq!(s.ideal_s, Some(2.0));
        assert_eq!(s.best_single.as_deref(), Some("only:kernel"));
        let pull = s.policy("pull").unwrap();
        assert_eq!(pull.speedup_vs_cpu, Some(6.0 / 2.5));
        assert_eq!(pull.speedup_vs_best_single, Some(3.0 / 2.5));
        assert_eq!(pull.efficiency, Some(2.0 / 2.5));
    }

    #[test]
    fn no_ideal_without_every_solo_time() {
        let mut s = SizeResult {
            size: 16,
            files: 1,
            bytes: 16,
            ideal_s: None,
            best_single: None,
            policies: vec![result("only:cpu", 6.0), result("pull", 5.0)],
        };
        s.derive(&["cpu".into(), "kernel".into()]);
        assert_eq!(s.ideal_s, None);
        assert_eq!(s.policy("pull").unwrap().efficiency, None);
        assert_eq!(s.policy("pull").unwrap().speedup_vs_cpu, Some(6.0 / 5.0));
    }
}
