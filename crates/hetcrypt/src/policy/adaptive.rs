//! `adaptive`: ours — learns what each engine costs per class of job while it runs and
//! places every job to finish the batch soonest, never behind the best single engine.
//!
//! The jobs of a batch are sorted into classes (engines that can run them, cipher,
//! direction, log2 size bucket), each a lock-free list. A free lane asks the placement
//! rule of [`model`] which class to take from, using the estimates its engine and the
//! others have built from the timings the dispatcher reports after every job (wall time
//! and the lane thread's CPU time). The estimates live in the [`Adaptive`] value, shared
//! by all its schedules, so a second batch starts from what the first one learned.
//!
//! A lane whose engine should not take any of the remaining work (a slow engine at the
//! end of the batch, a module whose driver would cost the CPU lanes more than it saves)
//! waits inside [`Schedule::next`]; it is woken when a class runs out, an estimate
//! becomes usable, an engine fails or another lane starts waiting (so stale decisions
//! are re-taken together), and re-checks every [`WAIT_RECHECK`] regardless.

pub mod model;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use self::model::{decide, Cost, Decision, Estimate, SharedEstimate, View};
use super::queue::{live_engines, JobList};
use super::{EngineMask, Plan, Policy, Schedule};
use crate::cipher::{Cipher, Direction};
use crate::error::Result;

/// How long a waiting lane sleeps before re-deciding even if nobody woke it: a safety
/// net for estimates that drift while it waits. Short against a batch, long against the
/// wake-ups it saves (each one costs the waiting thread a slice of a core).
pub const WAIT_RECHECK: Duration = Duration::from_millis(5);

/// What the model is keyed by across batches: engine name and lane count (a lane's
/// cost depends on how many lanes share the host), cipher, direction, size bucket.
type ModelKey = (String, usize, Cipher, Direction, usize);

/// Locks a mutex, going on with the data if a lane panicked while holding it (estimates
/// and a unit guard stay usable).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The adaptive policy. Clones share one learned model.
#[derive(Clone, Debug, Default)]
pub struct Adaptive {
    learned: Arc<Mutex<HashMap<ModelKey, Estimate>>>,
}

/// One learned estimate, for display (`hetcrypt` prints what the policy learned).
#[derive(Clone, Debug, PartialEq)]
pub struct LearnedCost {
    /// The engine.
    pub engine: String,
    /// Its lane count when measured.
    pub lanes: usize,
    /// The cipher.
    pub cipher: Cipher,
    /// The direction.
    pub direction: Direction,
    /// Smallest job length of the size bucket (the bucket spans up to twice that).
    pub min_len: usize,
    /// Cost of one job on one lane, once enough samples came in.
    pub cost: Option<Cost>,
    /// Samples seen.
    pub samples: u32,
}

impl Adaptive {
    /// A policy with nothing learned yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// What the policy has learned so far, sorted by engine, cipher, direction, size.
    pub fn learned(&self) -> Vec<LearnedCost> {
        let mut out: Vec<LearnedCost> = lock(&self.learned)
            .iter()
            .map(|((engine, lanes, cipher, direction, b), e)| LearnedCost {
                engine: engine.clone(),
                lanes: *lanes,
                cipher: *cipher,
                direction: *direction,
                min_len: model::bucket_floor(*b),
                cost: e.cost(),
                samples: e.samples(),
            })
            .collect();
        out.sort_by(|a, b| {
            (&a.engine, a.cipher, a.direction, a.min_len).cmp(&(
                &b.engine,
                b.cipher,
                b.direction,
                b.min_len,
            ))
        });
        out
    }
}

impl Policy for Adaptive {
    fn name(&self) -> String {
        "adaptive".to_string()
    }

    fn plan(&self, plan: &Plan<'_>) -> Result<Box<dyn Schedule>> {
        Ok(Box::new(AdaptiveSchedule::new(
            plan,
            Arc::clone(&self.learned),
        )))
    }
}

/// Marks a job that is in no class (no live engine can run it).
const NO_CLASS: u32 = u32::MAX;

/// Jobs that the same engines can run, of one cipher, direction and size bucket.
struct Class {
    engines: EngineMask,
    /// Index into the schedule's model keys.
    key: usize,
    bucket: usize,
    max_len: usize,
    jobs: JobList,
}

/// One batch under `adaptive`.
struct AdaptiveSchedule {
    classes: Vec<Class>,
    /// Per job: its class, or [`NO_CLASS`].
    class_of: Vec<u32>,
    /// (cipher, direction, bucket) per model key.
    keys: Vec<(Cipher, Direction, usize)>,
    /// Per model key: the keys of the same cipher and direction with smaller buckets,
    /// largest first.
    smaller: Vec<Vec<usize>>,
    /// Per engine and key (`engine * keys.len() + key`).
    estimates: Vec<SharedEstimate>,
    /// Per engine and class: probes started while the engine had no estimate.
    probes: Vec<AtomicUsize>,
    /// Per engine and class: whether the one re-measurement of this batch is unused.
    reprobe: Vec<AtomicBool>,
    /// Per engine: name and lane count at plan time (the model's key), whether it uses
    /// the host CPU, lanes still working.
    names: Vec<(String, usize)>,
    host_cpu: Vec<bool>,
    alive: Vec<AtomicUsize>,
    cores: usize,
    engine_of: Vec<usize>,
    learned: Arc<Mutex<HashMap<ModelKey, Estimate>>>,
    wait: Mutex<()>,
    wake: Condvar,
}

impl AdaptiveSchedule {
    fn new(plan: &Plan<'_>, learned: Arc<Mutex<HashMap<ModelKey, Estimate>>>) -> Self {
        let live = live_engines(plan);
        let mut class_index: HashMap<(EngineMask, Cipher, Direction, usize), usize> =
            HashMap::new();
        let mut key_index: HashMap<(Cipher, Direction, usize), usize> = HashMap::new();
        let mut keys = Vec::new();
        // (engines, key, bucket, longest job, jobs) per class.
        let mut members: Vec<(EngineMask, usize, usize, usize, Vec<usize>)> = Vec::new();
        let mut class_of = vec![NO_CLASS; plan.jobs.len()];
        for (i, job) in plan.jobs.iter().enumerate() {
            let engines = job.engines.intersect(live);
            if engines.is_empty() {
                continue;
            }
            let b = model::bucket(job.len);
            let key = *key_index
                .entry((job.cipher, job.direction, b))
                .or_insert_with(|| {
                    keys.push((job.cipher, job.direction, b));
                    keys.len() - 1
                });
            let q = *class_index
                .entry((engines, job.cipher, job.direction, b))
                .or_insert_with(|| {
                    members.push((engines, key, b, 0, Vec::new()));
                    members.len() - 1
                });
            members[q].3 = members[q].3.max(job.len);
            members[q].4.push(i);
            class_of[i] = u32::try_from(q).expect("fewer classes than jobs, and jobs fit a u32");
        }
        // Within a class, jobs are taken in batch order.
        let classes: Vec<Class> = members
            .into_iter()
            .map(|(engines, key, bucket, max_len, jobs)| Class {
                engines,
                key,
                bucket,
                max_len,
                jobs: JobList::new(jobs),
            })
            .collect();

        let n_engines = plan.engines.len();
        let mut lanes = vec![0usize; n_engines];
        for l in plan.lanes {
            lanes[l.engine] += 1;
        }
        let names: Vec<(String, usize)> = plan
            .engines
            .iter()
            .map(|e| (e.name.clone(), e.lanes))
            .collect();
        let estimates = {
            let learned = lock(&learned);
            names
                .iter()
                .flat_map(|(name, n)| {
                    keys.iter().map(|&(c, d, b)| {
                        let stored = learned.get(&(name.clone(), *n, c, d, b)).copied();
                        SharedEstimate::new(stored.unwrap_or_default())
                    })
                })
                .collect()
        };
        let smaller = keys
            .iter()
            .map(|&(c, d, b)| {
                let mut below: Vec<usize> = (0..keys.len())
                    .filter(|&k| keys[k].0 == c && keys[k].1 == d && keys[k].2 < b)
                    .collect();
                below.sort_by_key(|&k| std::cmp::Reverse(keys[k].2));
                below
            })
            .collect();
        let per_engine_class = n_engines * classes.len();
        AdaptiveSchedule {
            probes: (0..per_engine_class).map(|_| AtomicUsize::new(0)).collect(),
            reprobe: (0..per_engine_class)
                .map(|_| AtomicBool::new(true))
                .collect(),
            classes,
            class_of,
            keys,
            smaller,
            estimates,
            names,
            host_cpu: plan.engines.iter().map(|e| e.uses_host_cpu).collect(),
            alive: lanes.into_iter().map(AtomicUsize::new).collect(),
            cores: plan.cores.max(1),
            engine_of: plan.lanes.iter().map(|l| l.engine).collect(),
            learned,
            wait: Mutex::new(()),
            wake: Condvar::new(),
        }
    }

    fn estimate(&self, engine: usize, key: usize) -> &SharedEstimate {
        &self.estimates[engine * self.keys.len() + key]
    }

    fn engine_class(&self, engine: usize, class: usize) -> usize {
        engine * self.classes.len() + class
    }

    /// Wakes every waiting lane to decide again.
    fn notify(&self) {
        // Taking the lock orders this wake-up after any waiter's last check.
        drop(lock(&self.wait));
        self.wake.notify_all();
    }

    /// Takes up to `max` jobs of class `q`; wakes the waiters when the class runs out.
    fn take(&self, q: usize, max: usize, out: &mut Vec<usize>) -> bool {
        let list = &self.classes[q].jobs;
        let taken = list.take(max, out);
        if list.remaining() == 0 {
            self.notify();
        }
        taken > 0
    }
}

impl View for AdaptiveSchedule {
    fn engines(&self) -> usize {
        self.alive.len()
    }

    fn lanes(&self, e: usize) -> usize {
        self.alive[e].load(Ordering::Acquire)
    }

    fn uses_host_cpu(&self, e: usize) -> bool {
        self.host_cpu[e]
    }

    fn steal(&self) -> f64 {
        let (mut cpu, mut module) = (0, 0);
        for (e, &host) in self.host_cpu.iter().enumerate() {
            if host {
                cpu += self.lanes(e);
            } else {
                module += self.lanes(e);
            }
        }
        if module == 0 {
            return 0.0;
        }
        // Lanes beyond the cores compete; the module lanes' share of the excess is the
        // fraction of their CPU time that comes out of the CPU lanes.
        ((cpu + module).saturating_sub(self.cores) as f64 / module as f64).min(1.0)
    }

    fn classes(&self) -> usize {
        self.classes.len()
    }

    fn class_engines(&self, q: usize) -> EngineMask {
        self.classes[q].engines
    }

    fn remaining(&self, q: usize) -> usize {
        self.classes[q].jobs.remaining()
    }

    fn bucket(&self, q: usize) -> usize {
        self.classes[q].bucket
    }

    fn max_len(&self, q: usize) -> usize {
        self.classes[q].max_len
    }

    fn cost(&self, e: usize, q: usize) -> Option<Cost> {
        self.estimate(e, self.classes[q].key).cost()
    }

    fn probes(&self, e: usize, q: usize) -> usize {
        self.probes[self.engine_class(e, q)].load(Ordering::Relaxed)
    }

    fn may_reprobe(&self, e: usize, q: usize) -> bool {
        self.reprobe[self.engine_class(e, q)].load(Ordering::Relaxed)
    }

    fn smaller_known(&self, e: usize, q: usize) -> Option<(usize, Cost)> {
        self.smaller[self.classes[q].key]
            .iter()
            .find_map(|&k| Some((self.keys[k].2, self.estimate(e, k).cost()?)))
    }
}

impl Schedule for AdaptiveSchedule {
    fn next(&self, lane: usize, max: usize, out: &mut Vec<usize>) -> bool {
        let engine = self.engine_of[lane];
        let mut announced = false;
        loop {
            match decide(self, engine) {
                Decision::Take(q) => {
                    if self.take(q, max, out) {
                        return true;
                    }
                }
                Decision::Probe(q) => {
                    let slot = self.engine_class(engine, q);
                    if self.cost(engine, q).is_none() {
                        self.probes[slot].fetch_add(1, Ordering::Relaxed);
                    } else if !self.reprobe[slot].swap(false, Ordering::Relaxed) {
                        // Another lane of this engine used the re-measurement first.
                        continue;
                    }
                    if self.take(q, 1, out) {
                        return true;
                    }
                }
                Decision::Done => return false,
                Decision::Wait => {
                    let guard = lock(&self.wait);
                    if !announced {
                        // A lane starting to wait may change what the others should
                        // do (it no longer counts on them): let them decide again.
                        announced = true;
                        self.wake.notify_all();
                    }
                    // Decide again under the lock, so a wake-up sent after this check
                    // cannot be missed.
                    if decide(self, engine) == Decision::Wait {
                        drop(
                            self.wake
                                .wait_timeout(guard, WAIT_RECHECK)
                                .unwrap_or_else(|e| e.into_inner()),
                        );
                    }
                }
            }
        }
    }

    fn wants_timing(&self) -> bool {
        true
    }

    fn completed(&self, lane: usize, jobs: &[usize], elapsed: Duration, cpu: Duration) {
        let Some(&engine) = self.engine_of.get(lane) else {
            return;
        };
        if jobs.is_empty() {
            return;
        }
        // A pull's time is shared evenly by its jobs (they are of one class unless they
        // were re-dispatched); one sample per class in the pull.
        let n = jobs.len() as f64;
        let (wall, cpu) = (elapsed.as_secs_f64() / n, cpu.as_secs_f64() / n);
        let mut last_key = None;
        for &j in jobs {
            let Some(class) = self.class_of.get(j).copied().filter(|&c| c != NO_CLASS) else {
                continue;
            };
            let key = self.classes[class as usize].key;
            if last_key == Some(key) {
                continue;
            }
            last_key = Some(key);
            if self.estimate(engine, key).observe(wall, cpu) {
                self.notify();
            }
        }
    }

    fn engine_failed(&self, engine: usize) -> Vec<usize> {
        if let Some(alive) = self.alive.get(engine) {
            alive.store(0, Ordering::Release);
        }
        let mut working = EngineMask::default();
        for e in 0..self.alive.len() {
            if self.lanes(e) > 0 {
                working.insert(e);
            }
        }
        let jobs = self
            .classes
            .iter()
            .filter(|c| c.engines.intersect(working).is_empty())
            .flat_map(|c| c.jobs.drain())
            .collect();
        self.notify();
        jobs
    }
}

impl Drop for AdaptiveSchedule {
    /// Keeps what this batch learned for the next one.
    fn drop(&mut self) {
        let mut learned = lock(&self.learned);
        for (e, (name, lanes)) in self.names.iter().enumerate() {
            for (k, &(cipher, direction, b)) in self.keys.iter().enumerate() {
                let estimate = self.estimate(e, k).get();
                if estimate.samples() > 0 {
                    learned.insert((name.clone(), *lanes, cipher, direction, b), estimate);
                }
            }
        }
    }
}
