//! `threshold`: small jobs to the CPU, large jobs to the other engine(s) — the size split
//! of Intel's QAT_Engine (`SET_*_THRESHOLD`) and DPDK's packet-size scheduler.
//!
//! Three ways to get the threshold, all from measurement:
//! - [`Threshold::calibrated`] (`threshold` when a calibration store holds for this
//!   machine) splits each cipher and direction at the crossover `hetcrypt calibrate`
//!   stored ([`Calibration::crossover`]), from the first job on; a class the store
//!   does not know is learned as below. It never checks the stored crossover: where
//!   the store is wrong (in the soft guest on an Intel host, `calibrate` timed the cpu
//!   at 34-47 µs a 256-byte request where the work's jobs took 360-810 µs, and stored
//!   crossovers of 0.6-1.75 KiB where the module won from 256 B), every batch of the
//!   run is split wrong, as with QAT_Engine's fixed threshold; `adaptive` is the policy
//!   that corrects a wrong store (`docs/results.md`, twentieth session);
//! - [`Threshold::fixed`] (`threshold:<bytes>` on the command line) takes it from the
//!   caller;
//! - [`Threshold::calibrating`] (`threshold` without a store) measures during the
//!   work itself: jobs of a class (cipher, direction, log2 size bucket) that it has not
//!   measured on both sides yet are shared by all engines as under `pull`, with per-job
//!   timings; once both sides have estimates (kept in the policy value, across batches),
//!   the class is split at the crossover, and timing is switched off for batches that
//!   need no more measuring. The estimates are never refreshed after that: like
//!   QAT_Engine's, this threshold is set once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::adaptive::model::{self, Estimate, SharedEstimate};
use super::queue::{live_engines, GroupedQueue};
use super::{lock, EngineMask, Plan, Policy, Schedule};
use crate::calibration::Calibration;
use crate::cipher::{Cipher, Direction};
use crate::engine::EngineKind;
use crate::error::Result;

/// Estimates across batches: engine name and lane count, cipher, direction, size bucket.
type ModelKey = (String, usize, Cipher, Direction, usize);

/// Where the threshold comes from.
#[derive(Clone, Debug)]
enum Source {
    /// Set by the caller.
    Fixed(usize),
    /// From the calibration store where it knows the class, else learned from the
    /// batches' own timings.
    Calibrating(
        Arc<Mutex<HashMap<ModelKey, Estimate>>>,
        Option<Arc<Calibration>>,
    ),
}

/// Jobs shorter than the threshold go to the `cpu`-kind engine, the others to the other
/// engine(s). With one engine, everything goes to it. A job the preferred side cannot
/// run goes to any engine that can.
#[derive(Clone, Debug)]
pub struct Threshold {
    source: Source,
}

impl Threshold {
    /// A set threshold in bytes (`threshold:<bytes>`): jobs of fewer bytes go to the CPU.
    pub fn fixed(bytes: usize) -> Self {
        Threshold {
            source: Source::Fixed(bytes),
        }
    }

    /// A threshold learned from the work's own timings (`threshold`); see the module
    /// documentation. Clones share what was learned.
    pub fn calibrating() -> Self {
        Threshold {
            source: Source::Calibrating(Arc::default(), None),
        }
    }

    /// A threshold per cipher and direction at the crossover `calibration` stored
    /// between the `cpu`-kind engine and the others (the smallest, with several), used
    /// from the first job; classes it does not know are learned as by
    /// [`Threshold::calibrating`]. Clones share what was learned.
    pub fn calibrated(calibration: Arc<Calibration>) -> Self {
        Threshold {
            source: Source::Calibrating(Arc::default(), Some(calibration)),
        }
    }

    /// The set threshold, if this is [`Threshold::fixed`].
    pub fn bytes(&self) -> Option<usize> {
        match self.source {
            Source::Fixed(n) => Some(n),
            Source::Calibrating(..) => None,
        }
    }
}

impl Policy for Threshold {
    fn name(&self) -> String {
        match self.source {
            Source::Fixed(n) => format!("threshold:{n}"),
            Source::Calibrating(..) => "threshold".to_string(),
        }
    }

    fn plan(&self, plan: &Plan<'_>) -> Result<Box<dyn Schedule>> {
        let live = live_engines(plan);
        let Some((small, large)) = sides(plan, live) else {
            // No engine has lanes: the dispatcher has already failed every job.
            return Ok(Box::new(Split::fixed(GroupedQueue::from_masks([]), plan)));
        };
        let mut small_mask = EngineMask::default();
        small_mask.insert(small);
        let place = |i: usize, threshold: usize| {
            let job = &plan.jobs[i];
            let can = job.engines.intersect(live);
            let side = if job.len < threshold {
                small_mask
            } else {
                large
            };
            let preferred = can.intersect(side);
            (i, if preferred.is_empty() { can } else { preferred })
        };
        match &self.source {
            Source::Fixed(threshold) => {
                let queue =
                    GroupedQueue::from_masks((0..plan.jobs.len()).map(|i| place(i, *threshold)));
                Ok(Box::new(Split::fixed(queue, plan)))
            }
            Source::Calibrating(learned, stored) => {
                let learning =
                    Learning::new(plan, small, large, Arc::clone(learned), stored.as_deref());
                let queue = GroupedQueue::from_masks((0..plan.jobs.len()).map(|i| {
                    match learning.threshold_for(i) {
                        Some(threshold) => place(i, threshold),
                        // Not measured on both sides yet: everyone may take it.
                        None => (i, plan.jobs[i].engines.intersect(live)),
                    }
                }));
                Ok(Box::new(Split {
                    queue,
                    engine_of: plan.lanes.iter().map(|l| l.engine).collect(),
                    learning: Some(learning),
                }))
            }
        }
    }
}

/// The small side (the first live `cpu`-kind engine, else the first live engine) and
/// the large side (every other live engine, or the small one if it is alone).
fn sides(plan: &Plan<'_>, live: EngineMask) -> Option<(usize, EngineMask)> {
    let is_live = |i: &usize| live.contains(*i);
    let small = (0..plan.engines.len())
        .filter(is_live)
        .find(|&i| plan.engines[i].kind == EngineKind::Cpu)
        .or_else(|| (0..plan.engines.len()).find(is_live))?;
    let mut large = EngineMask(live.0 & !(1u64 << small));
    if large.is_empty() {
        large.insert(small);
    }
    Some((small, large))
}

/// The smallest job length from which the large side should take the work, given, per
/// measured size (ascending, smallest length of each size bucket), the jobs per second
/// each side completes with all its lanes: the start of the run of sizes at the top
/// where the large side is at least as fast. 0 if it wins everywhere, `usize::MAX` if
/// it loses at the largest measured size (or nothing is measured).
pub fn crossover(points: &[(usize, f64, f64)]) -> usize {
    let mut threshold = usize::MAX;
    for &(len, small, large) in points.iter().rev() {
        if large >= small {
            threshold = len;
        } else {
            break;
        }
    }
    if points.first().map(|p| p.0) == Some(threshold) {
        0
    } else {
        threshold
    }
}

/// One size for [`crossover`]: smallest job length of the size bucket, jobs per second
/// of the small side, jobs per second of the large side.
type RatePoint = (usize, f64, f64);

/// What the calibrating threshold measures during a batch.
struct Learning {
    /// Per engine: name and lane count (the model's key).
    names: Vec<(String, usize)>,
    /// (cipher, direction, bucket) per model key.
    keys: Vec<(Cipher, Direction, usize)>,
    /// Per job: its model key.
    key_of: Vec<usize>,
    /// Per engine and key.
    estimates: Vec<SharedEstimate>,
    /// Per key: the threshold from what was known at plan time, or `None` while the
    /// key is not measured on both sides.
    key_threshold: Vec<Option<usize>>,
    /// Whether some job of this batch is in a class still being measured.
    measuring: bool,
    learned: Arc<Mutex<HashMap<ModelKey, Estimate>>>,
}

impl Learning {
    fn new(
        plan: &Plan<'_>,
        small: usize,
        large: EngineMask,
        learned: Arc<Mutex<HashMap<ModelKey, Estimate>>>,
        calibration: Option<&Calibration>,
    ) -> Self {
        let names: Vec<(String, usize)> = plan
            .engines
            .iter()
            .map(|e| (e.name.clone(), e.lanes))
            .collect();
        let mut keys = Vec::new();
        let mut key_index = HashMap::new();
        // Consecutive jobs mostly share a key: hash only when it changes.
        let mut last = None;
        let key_of = plan
            .jobs
            .iter()
            .map(|job| {
                let k = (job.cipher, job.direction, model::bucket(job.len));
                match last {
                    Some((l, i)) if l == k => i,
                    _ => {
                        let i = *key_index.entry(k).or_insert_with(|| {
                            keys.push(k);
                            keys.len() - 1
                        });
                        last = Some((k, i));
                        i
                    }
                }
            })
            .collect();
        let stored = lock(&learned);
        let estimates: Vec<SharedEstimate> = names
            .iter()
            .flat_map(|(name, n)| {
                keys.iter().map(|&(c, d, b)| {
                    SharedEstimate::new(
                        stored
                            .get(&(name.clone(), *n, c, d, b))
                            .copied()
                            .unwrap_or_default(),
                    )
                })
            })
            .collect();
        // Per (cipher, direction): rates per bucket known on both sides, from every
        // estimate stored so far (not only this batch's sizes).
        let mut points: HashMap<(Cipher, Direction), Vec<RatePoint>> = HashMap::new();
        let rate = |e: usize, c: Cipher, d: Direction, b: usize| -> Option<f64> {
            let (name, lanes) = &names[e];
            let cost = stored.get(&(name.clone(), *lanes, c, d, b))?.cost()?;
            (cost.wall > 0.0).then(|| *lanes as f64 / cost.wall)
        };
        for (name, lanes, c, d, b) in stored.keys() {
            if names[small] != (name.clone(), *lanes) {
                continue;
            }
            let Some(small_rate) = rate(small, *c, *d, *b) else {
                continue;
            };
            let large_rates: Vec<f64> = (0..names.len())
                .filter(|&e| large.contains(e) && e != small)
                .filter_map(|e| rate(e, *c, *d, *b))
                .collect();
            if large_rates.is_empty() {
                continue;
            }
            points.entry((*c, *d)).or_default().push((
                model::bucket_floor(*b),
                small_rate,
                large_rates.iter().sum(),
            ));
        }
        drop(stored);
        let thresholds: HashMap<(Cipher, Direction), (usize, Vec<usize>)> = points
            .into_iter()
            .map(|(k, mut p)| {
                p.sort_by_key(|p| p.0);
                let known = p.iter().map(|p| model::bucket(p.0)).collect();
                (k, (crossover(&p), known))
            })
            .collect();
        // Per (cipher, direction) the store knows: the smallest crossover from the small
        // side to a large engine.
        let from_store = |c: Cipher, d: Direction| -> Option<usize> {
            let calibration = calibration?;
            let small = &plan.engines[small].name;
            (0..plan.engines.len())
                .filter(|&e| large.contains(e))
                .filter_map(|e| calibration.crossover(c, d, small, &plan.engines[e].name))
                .min()
        };
        // Per key: the threshold, or `None` while the key is still being measured. With
        // a single engine there is nothing to measure: every job goes to it.
        let key_threshold: Vec<Option<usize>> = keys
            .iter()
            .map(|&(c, d, b)| {
                if large.contains(small) {
                    return Some(0);
                }
                if let Some(threshold) = from_store(c, d) {
                    return Some(threshold);
                }
                let (threshold, known) = thresholds.get(&(c, d))?;
                known.contains(&b).then_some(*threshold)
            })
            .collect();
        let measuring = key_threshold.iter().any(Option::is_none);
        Learning {
            names,
            keys,
            key_of,
            estimates,
            key_threshold,
            measuring,
            learned,
        }
    }

    /// The threshold for job `i`, or `None` while its class is still being measured.
    fn threshold_for(&self, i: usize) -> Option<usize> {
        self.key_threshold[self.key_of[i]]
    }
}

impl Drop for Learning {
    /// Keeps what this batch measured for the next one.
    fn drop(&mut self) {
        if !self.measuring {
            return;
        }
        let mut learned = lock(&self.learned);
        for (e, (name, lanes)) in self.names.iter().enumerate() {
            for (k, &(cipher, direction, b)) in self.keys.iter().enumerate() {
                let estimate = self.estimates[e * self.keys.len() + k].get();
                if estimate.samples() > 0 {
                    learned.insert((name.clone(), *lanes, cipher, direction, b), estimate);
                }
            }
        }
    }
}

/// A threshold batch: one queue of jobs, each restricted to its side.
struct Split {
    queue: GroupedQueue,
    engine_of: Vec<usize>,
    learning: Option<Learning>,
}

impl Split {
    fn fixed(queue: GroupedQueue, plan: &Plan<'_>) -> Self {
        Split {
            queue,
            engine_of: plan.lanes.iter().map(|l| l.engine).collect(),
            learning: None,
        }
    }
}

impl Schedule for Split {
    fn next(&self, lane: usize, max: usize, out: &mut Vec<usize>) -> bool {
        self.queue.take(self.engine_of[lane], max, out) > 0
    }

    /// An engine no job is placed on (every job below the threshold) is not started.
    fn engines_needed(&self) -> EngineMask {
        self.queue.engines()
    }

    fn wants_timing(&self) -> bool {
        self.learning.as_ref().is_some_and(|l| l.measuring)
    }

    fn completed(&self, lane: usize, jobs: &[usize], elapsed: Duration, cpu: Duration) {
        let (Some(learning), Some(&engine)) = (&self.learning, self.engine_of.get(lane)) else {
            return;
        };
        if !learning.measuring || jobs.is_empty() {
            return;
        }
        let n = jobs.len() as f64;
        let (wall, cpu) = (elapsed.as_secs_f64() / n, cpu.as_secs_f64() / n);
        let mut last = None;
        for &j in jobs {
            let Some(&key) = learning.key_of.get(j) else {
                continue;
            };
            if last != Some(key) {
                last = Some(key);
                learning.estimates[engine * learning.keys.len() + key].observe(wall, cpu);
            }
        }
    }

    fn engine_failed(&self, engine: usize) -> Vec<usize> {
        self.queue.engine_failed(engine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tests::cpu_and_kernel;
    use crate::policy::JobMeta;

    #[test]
    fn crossover_is_where_the_large_side_starts_winning_for_good() {
        let rising = [
            (16, 10.0, 1.0),
            (1024, 10.0, 5.0),
            (4096, 10.0, 12.0),
            (16384, 10.0, 30.0),
        ];
        assert_eq!(crossover(&rising), 4096);
        assert_eq!(crossover(&[(16, 1.0, 2.0), (1024, 1.0, 2.0)]), 0);
        assert_eq!(crossover(&[(16, 2.0, 1.0), (1024, 2.0, 1.0)]), usize::MAX);
        // A win below a loss does not count: only the run at the top does.
        let bumpy = [(16, 1.0, 2.0), (1024, 2.0, 1.0), (16384, 1.0, 3.0)];
        assert_eq!(crossover(&bumpy), 16384);
        assert_eq!(crossover(&[]), usize::MAX);
    }

    fn job(len: usize, engines: u64) -> JobMeta {
        JobMeta {
            len,
            cipher: Cipher::AES_128_CBC,
            direction: Direction::Encrypt,
            engines: EngineMask(engines),
        }
    }

    fn taken(s: &dyn Schedule, lane: usize) -> Vec<usize> {
        let mut out = Vec::new();
        while s.next(lane, 1, &mut out) {}
        out
    }

    #[test]
    fn set_threshold_sends_small_jobs_to_the_cpu_and_the_rest_elsewhere() {
        let (engines, lanes) = cpu_and_kernel();
        // Job 2 is large but only the cpu can run it; job 3 is small but only the
        // kernel can.
        let jobs = [job(100, 3), job(5000, 3), job(9000, 1), job(10, 2)];
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let s = Threshold::fixed(1024).plan(&plan).unwrap();
        assert!(!s.wants_timing());
        assert_eq!(taken(s.as_ref(), 0), [0, 2]);
        assert_eq!(taken(s.as_ref(), 1), [1, 3]);
        // With one engine, everything goes to it.
        let plan = Plan {
            engines: &engines[..1],
            lanes: &lanes[..1],
            jobs: &jobs[..3],
            ..plan
        };
        let s = Threshold::fixed(1024).plan(&plan).unwrap();
        assert_eq!(taken(s.as_ref(), 0), [0, 1, 2]);
    }

    /// The small side is the `cpu`-kind engine wherever it stands in the dispatcher:
    /// here second, so the large side is every other engine (the first), not the cpu.
    #[test]
    fn the_cpu_takes_the_small_jobs_when_it_is_not_the_first_engine() {
        let (mut engines, lanes) = cpu_and_kernel();
        engines.reverse();
        let jobs = [job(100, 3), job(5000, 3), job(50, 3), job(9000, 3)];
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let policy = Threshold::fixed(1024);
        assert_eq!(policy.name(), "threshold:1024");
        assert_eq!(policy.bytes(), Some(1024));
        assert_eq!(Threshold::calibrating().bytes(), None);
        let s = policy.plan(&plan).unwrap();
        assert_eq!(taken(s.as_ref(), 1), [0, 2], "the cpu: small jobs only");
        assert_eq!(taken(s.as_ref(), 0), [1, 3], "the module: large jobs");
    }

    /// Only the engines some job is placed on start, and a failed engine gives back the
    /// jobs no other engine may take.
    #[test]
    fn engines_needed_and_engine_failed_follow_the_split() {
        let (engines, lanes) = cpu_and_kernel();
        let small = [job(100, 3), job(200, 3)];
        let plan = Plan {
            jobs: &small,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let s = Threshold::fixed(1024).plan(&plan).unwrap();
        assert_eq!(
            s.engines_needed(),
            EngineMask(0b01),
            "small jobs: the cpu alone"
        );
        // Jobs 1 and 3 are large (the module's), job 2 small but only the module can
        // run it: all three queue for the module alone, in order.
        let jobs = [job(100, 3), job(5000, 3), job(10, 2), job(9000, 3)];
        let plan = Plan {
            jobs: &jobs,
            ..plan
        };
        let s = Threshold::fixed(1024).plan(&plan).unwrap();
        assert_eq!(s.engines_needed(), EngineMask(0b11));
        let mut out = Vec::new();
        assert!(s.next(1, 1, &mut out));
        assert_eq!(out, [1]);
        assert_eq!(s.engine_failed(1), [2, 3], "no other engine may take these");
        assert_eq!(taken(s.as_ref(), 0), [0]);
    }

    /// A lane that reports several jobs at once is timed per job: its wall and CPU
    /// time divided by the count. Here the module reports pairs (12 ms a pair of large
    /// jobs: 6 ms each, faster than the cpu's 10 ms; 20 ms a pair of small ones), the
    /// cpu single jobs; timed per pull instead of per job, the module would lose the
    /// large jobs too.
    #[test]
    fn timings_of_several_jobs_count_per_job() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs: Vec<JobMeta> = [64, 16384]
            .iter()
            .cycle()
            .take(8)
            .map(|&l| job(l, 3))
            .collect();
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let policy = Threshold::calibrating();
        let ms = Duration::from_millis;
        {
            let s = policy.plan(&plan).unwrap();
            assert!(s.wants_timing());
            for (j, meta) in jobs.iter().enumerate() {
                let t = if meta.len == 64 { ms(1) } else { ms(10) };
                s.completed(0, &[j], t, t);
            }
            for pair in [[0, 2], [4, 6]] {
                s.completed(1, &pair, ms(20), ms(1));
            }
            for pair in [[1, 3], [5, 7]] {
                s.completed(1, &pair, ms(12), ms(1));
            }
            // An empty report is no sample.
            s.completed(1, &[], ms(1), ms(1));
        }
        let s = policy.plan(&plan).unwrap();
        assert!(!s.wants_timing(), "both sizes measured on both engines");
        assert_eq!(taken(s.as_ref(), 0), [0, 2, 4, 6]);
        assert_eq!(taken(s.as_ref(), 1), [1, 3, 5, 7]);
    }

    /// A threshold given a stored calibration splits the very first batch at the stored
    /// crossover, measuring nothing; a class the store does not know is still measured.
    #[test]
    fn calibrated_threshold_routes_the_first_jobs_by_the_stored_crossover() {
        let (engines, lanes) = cpu_and_kernel();
        // AES-128-CBC encryption: the cpu at 1 us + 10 ns/B, the module at 200 us +
        // 1 ns/B, crossing at ~22,100 bytes.
        let cal = Arc::new(crate::calibration::tests::cpu_and_module());
        let jobs = [
            job(64, 3),
            job(65536, 3),
            job(16384, 3),
            job(32768, 3),
            job(22000, 3),
        ];
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let policy = Threshold::calibrated(Arc::clone(&cal));
        assert_eq!(policy.name(), "threshold");
        let s = policy.plan(&plan).unwrap();
        assert!(!s.wants_timing(), "the store knows the class");
        assert_eq!(taken(s.as_ref(), 0), [0, 2, 4]);
        assert_eq!(taken(s.as_ref(), 1), [1, 3]);
        // Padded CBC is answered from raw CBC.
        let padded: Vec<JobMeta> = jobs
            .iter()
            .map(|j| JobMeta {
                cipher: Cipher::AES_128_CBC_PKCS7,
                ..*j
            })
            .collect();
        let s = policy
            .plan(&Plan {
                jobs: &padded,
                ..plan
            })
            .unwrap();
        assert!(!s.wants_timing());
        assert_eq!(taken(s.as_ref(), 1), [1, 3]);
        // GCM is not in the store: measured as without one, every engine may take it.
        let gcm = [JobMeta {
            cipher: Cipher::AES_128_GCM,
            ..job(65536, 3)
        }];
        let s = policy.plan(&Plan { jobs: &gcm, ..plan }).unwrap();
        assert!(s.wants_timing());
    }

    #[test]
    fn calibrating_threshold_measures_first_then_splits_at_the_crossover() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs: Vec<JobMeta> = [64, 16384]
            .iter()
            .cycle()
            .take(8)
            .map(|&l| job(l, 3))
            .collect();
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let policy = Threshold::calibrating();
        {
            let s = policy.plan(&plan).unwrap();
            assert!(s.wants_timing(), "nothing measured yet");
            // Synthetic timings: the cpu is fast on 64 B and slow on 16 KiB, the
            // kernel the other way round.
            let ms = Duration::from_millis;
            for lane in 0..2 {
                for (j, meta) in jobs.iter().enumerate() {
                    let fast = (meta.len == 64) == (lane == 0);
                    let t = if fast { ms(1) } else { ms(10) };
                    s.completed(lane, &[j], t, t);
                }
            }
        }
        let s = policy.plan(&plan).unwrap();
        assert!(!s.wants_timing(), "both sizes measured on both engines");
        let small: Vec<usize> = (0..8).filter(|j| j % 2 == 0).collect();
        let large: Vec<usize> = (0..8).filter(|j| j % 2 == 1).collect();
        assert_eq!(taken(s.as_ref(), 0), small);
        assert_eq!(taken(s.as_ref(), 1), large);
    }
}
