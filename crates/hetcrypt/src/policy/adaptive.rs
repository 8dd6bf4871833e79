//! `adaptive`: ours — starts from the calibration store's costs, keeps learning what each
//! engine costs per class of job while it runs, and places every job to finish the batch
//! soonest, never behind the best single engine.
//!
//! Jobs are sorted into classes (engines that can run them, cipher, direction, log2 size
//! bucket), each a lock-free list. A free lane asks [`model::decide`] which class to take
//! from, using estimates that the lanes keep by timing their own pulls: the time from
//! one [`Schedule::next`] returning to the lane's following call (only the monotonic
//! clock is read). The estimates live in the [`Adaptive`] value, so a batch starts from
//! what the ones before it learned; seeded ([`Adaptive::seeded`]), the first batch
//! starts from the store, scaled on a class an engine has not run yet by how far its
//! own costs moved from the store on a nearby size (its drift).
//!
//! A lane that should take nothing now waits in [`Schedule::next`] until an event (a
//! class runs out, an estimate becomes usable, an engine fails, another lane starts
//! waiting) or [`WAIT_RECHECK`]. An engine that the rule gives nothing before the batch
//! starts is left out: its lanes are not started ([`Schedule::engines_needed`]).
//!
//! Per-pull cost is kept low where nothing is left to decide: while the other engines'
//! lanes all wait, a lane keeps its class (a streak, one pull in [`STREAK_SAMPLE`]
//! timed); when only one engine is left, its lanes take the classes in turn (a sole
//! batch, no lock, one clock read per [`SOLE_SEGMENT`] pulls).

pub mod model;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use self::model::{decide, Cost, Decision, Estimate, SharedEstimate, View};
use super::queue::{live_engines, JobList, ListBuilder};
use super::{lock, EngineMask, JobMeta, Plan, Policy, Schedule};
use crate::calibration::Calibration;
use crate::cipher::{Cipher, Direction};
use crate::error::Result;

/// How long a waiting lane sleeps before re-deciding unwoken: a safety net (events wake
/// it anyway), long because on one core every wake-up takes the core from the workers.
pub const WAIT_RECHECK: Duration = Duration::from_millis(50);

/// On a streak, one pull in this many is timed and booked: the estimate still follows
/// the load, and the other pulls skip two clock reads and the booking (under the
/// testbed's emulation batches of tiny jobs lost 10-15% to them).
pub const STREAK_SAMPLE: u32 = 8;

/// In a sole batch, a lane's pulls are timed in segments of this many pulls of one
/// class, one sample each ([`SoleRun`]): 200 tiny jobs are ~6 samples for 8 clock
/// reads, and a stall is one sample of several (`tests/it/adaptive_sampling.rs`).
pub const SOLE_SEGMENT: u32 = 32;

/// Samples of its own, beyond the store's [`model::WINDOW`], an engine needs on a class
/// before its drift there carries to others ([`Knowledge::drift`]): half a window, so
/// that one sole round of a short run (200 jobs, about 6 segments of
/// [`SOLE_SEGMENT`] pulls) carries. A whole window needed two rounds, and a policy that
/// ran a size once before moving on started the next size from the bare store
/// (`docs/results.md`, twenty-third session: 1 KiB's first round on the cpu).
const DRIFT_MIN_OWN: u32 = model::WINDOW / 2;

/// How many size buckets (each 2x) a drift carries: the store's error changes with
/// size (`docs/results.md`, sixteenth session), but an error from up to 16x away is
/// nearer the truth than none: in the soft guest a short run's cpu ran 64 B alone and
/// then met 1 KiB (four buckets up) with the bare store, 6-9x below its cost there
/// (twenty-fifth session).
const DRIFT_REACH: usize = 4;

/// The most a drift scales a stored cost up: the store times a warm request repeated,
/// the cheapest an engine ever runs, and in the soft guest a batch of distinct jobs
/// through the dispatcher cost the cpu 12-17x it at 64 B, so a cap of 4 left its 256 B
/// estimate below the module's and a short run's first 256 B round on the cpu
/// (`docs/results.md`, twenty-fifth session). 16x was tried then and taken back: in a
/// long run it made the two engines' 256 B estimates a near tie, and a mixed round's
/// cold pull raised the module's, which no job lowered again. Cold pulls now only
/// lower an estimate ([`Pull::cold`]; twenty-sixth session).
const DRIFT_CAP_UP: f64 = 16.0;

/// The most a drift scales a stored cost down: an engine running far faster than its
/// store is rarer (a store taken under load), and an estimate too cheap draws a whole
/// batch before it is corrected.
const DRIFT_CAP_DOWN: f64 = model::OUTLIER_CAP;

/// What starting an engine's lanes for a batch costs, about, under the testbed's
/// emulation (a thread's start, barrier and join: a third of a 2.7 ms batch of 400 tiny
/// jobs). A re-measurement counts the whole of it ([`model::REMEASURE_RATIO`]).
const LANE_START: Duration = Duration::from_millis(1);

/// What the model is keyed by across batches: the engine (its position in
/// [`Knowledge::engines`]), cipher, direction, size bucket.
type ModelKey = (usize, Cipher, Direction, usize);

/// What an [`Adaptive`] value and its schedules learn, and the calibration they started
/// from.
#[derive(Debug, Default)]
struct Knowledge {
    /// The engines measured so far (name, lanes, batches since it last re-measured a
    /// class), in the order first seen. The model is keyed by position here, so a batch
    /// finds its estimates without building owned keys.
    engines: Vec<(String, usize, u32)>,
    costs: HashMap<ModelKey, Estimate>,
    /// The estimate right after the engine last measured the class alone (a sole batch
    /// or a re-measurement): one never measured so, or grown since by
    /// [`model::FAST_DOWN`] (samples slowed beside other lanes), is re-measured in the
    /// next batch where it is declined, not [`model::REMEASURE_EVERY`] batches later.
    checked: HashMap<ModelKey, f64>,
    /// The calibration of this machine, if the policy was given one.
    seed: Option<Arc<Calibration>>,
}

impl Knowledge {
    /// The estimate for engine `id` on a class, learned or else from the calibration
    /// (the stored cost of the bucket's smallest length, padding included), corrected
    /// by how far this engine's own measurements moved from the store on a nearby
    /// class ([`Knowledge::drift`]).
    fn estimate(&mut self, key: ModelKey) -> Estimate {
        if !self.costs.contains_key(&key) {
            if let Some(cost) = self.stored(key).map(|s| s * self.drift(key)) {
                self.costs.insert(key, Estimate::seeded(cost, cost));
            }
        }
        self.costs.get(&key).copied().unwrap_or_default()
    }

    /// The calibration's cost of one job of bucket `b` on engine `id`, in seconds.
    fn stored(&self, (id, cipher, direction, b): ModelKey) -> Option<f64> {
        let (cal, len) = (self.seed.as_ref()?, model::bucket_floor(b));
        let cost = cal.cost(&self.engines[id].0, cipher, direction, len)?;
        Some(cost.as_secs_f64())
    }

    /// Learned over stored cost of engine `id` on the nearest size bucket of this cipher
    /// and direction that it has run ([`DRIFT_MIN_OWN`] samples of its own at least,
    /// at most [`DRIFT_REACH`] buckets from `b`; the smaller on a tie), capped at
    /// [`DRIFT_CAP_UP`] and [`DRIFT_CAP_DOWN`]; 1 if there is none. The store is measured once, on
    /// the engine alone; what the engine costs in this process now (through the
    /// dispatcher, under this load) is what a batch will pay, and a class the engine
    /// has not run yet starts from the store scaled by it.
    fn drift(&self, (id, cipher, direction, b): ModelKey) -> f64 {
        self.costs
            .iter()
            .filter(|(&(i, c, d, ob), e)| {
                (i, c, d) == (id, cipher, direction)
                    && ob.abs_diff(b) <= DRIFT_REACH
                    && e.samples() >= model::WINDOW + DRIFT_MIN_OWN
            })
            .filter_map(|(&key @ (_, _, _, ob), e)| {
                let (stored, learned) = (self.stored(key)?, e.cost()?.wall);
                (stored > 0.0 && learned > 0.0).then_some((ob.abs_diff(b), ob, learned / stored))
            })
            .min_by_key(|&(distance, ob, _)| (distance, ob))
            .map_or(1.0, |(_, _, ratio)| {
                ratio.clamp(1.0 / DRIFT_CAP_DOWN, DRIFT_CAP_UP)
            })
    }

    /// The calibration's mix of engine `id` on a class beside the one of `partners` it
    /// gains least with: its part and the partner's ([`Calibration::mix_parts`]), and its
    /// stored cost (see [`model::MIX_GAIN`]).
    fn gain(&self, key: ModelKey, partners: &[&str]) -> Option<(f64, f64, f64)> {
        let (id, cipher, direction, b) = key;
        let (cal, len) = (self.seed.as_ref()?, model::bucket_floor(b));
        let [mine, other] = (partners.iter())
            .filter_map(|p| cal.mix_parts(&self.engines[id].0, p, cipher, direction, len))
            .min_by(|x, y| (x[0] + x[1]).total_cmp(&(y[0] + y[1])))?;
        Some((mine, other, self.stored(key)?))
    }

    /// Whether engine `id`'s estimate of a class is to be re-measured alone (see
    /// [`Knowledge::checked`]).
    fn check_due(&self, key: ModelKey, estimate: &Estimate) -> bool {
        let alone = self.checked.get(&key);
        estimate
            .cost()
            .is_some_and(|c| alone.is_none_or(|&a| c.wall > a * model::FAST_DOWN))
    }

    /// The position of engine `name` with `lanes` lanes in `engines`, added if new.
    fn engine(&mut self, name: &str, lanes: usize) -> usize {
        let known = |(n, l, _): &(String, usize, u32)| n == name && *l == lanes;
        self.engines.iter().position(known).unwrap_or_else(|| {
            self.engines.push((name.to_string(), lanes, 0));
            self.engines.len() - 1
        })
    }
}

/// The model shared by an [`Adaptive`] value and its schedules.
type Model = Arc<Mutex<Knowledge>>;

/// The adaptive policy. Clones share one learned model.
#[derive(Clone, Debug, Default)]
pub struct Adaptive {
    learned: Model,
}

/// One learned estimate, for display (`hetcrypt bench` records what the policy learned
/// after each of its runs in its JSON).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
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
    /// Cost of one job on one lane, once enough samples came in (or from the store).
    pub cost: Option<Cost>,
    /// Samples seen (a stored cost counts as [`model::WINDOW`]).
    pub samples: u32,
    /// The calibration's gain from running this class beside the other engine, if it
    /// measured one (see [`model::MIX_GAIN`]).
    pub mix_gain: Option<f64>,
}

impl Adaptive {
    /// A policy with nothing learned yet: it probes each engine on each new class.
    pub fn new() -> Self {
        Self::default()
    }

    /// A policy that starts from the costs and mix gains `calibration` stored for this
    /// machine, so it places jobs right from the first one, and goes on learning from
    /// every batch as [`Adaptive::new`] does (a class or engine the store lacks is
    /// probed as usual). Clones share one learned model.
    pub fn seeded(calibration: Arc<Calibration>) -> Self {
        let policy = Self::default();
        lock(&policy.learned).seed = Some(calibration);
        policy
    }

    /// What the policy has learned so far, sorted by engine, cipher, direction, size.
    pub fn learned(&self) -> Vec<LearnedCost> {
        let known = lock(&self.learned);
        let names: Vec<&str> = known.engines.iter().map(|e| e.0.as_str()).collect();
        let mut out: Vec<LearnedCost> = known
            .costs
            .iter()
            .map(|(&key @ (id, cipher, direction, b), e)| LearnedCost {
                engine: known.engines[id].0.clone(),
                lanes: known.engines[id].1,
                cipher,
                direction,
                min_len: model::bucket_floor(b),
                cost: e.cost(),
                samples: e.samples(),
                mix_gain: (known.gain(key, &names).map(|(mine, other, _)| mine + other)),
            })
            .collect();
        out.sort_by_key(|l| (l.engine.clone(), l.cipher, l.direction, l.min_len));
        out
    }
}

impl Policy for Adaptive {
    fn name(&self) -> String {
        "adaptive".to_string()
    }

    fn plan(&self, plan: &Plan<'_>) -> Result<Box<dyn Schedule>> {
        let mut schedule = AdaptiveSchedule::new(plan, Arc::clone(&self.learned));
        schedule.leave_out_idle_engines();
        Ok(Box::new(schedule))
    }

    fn learned(&self) -> Option<Vec<LearnedCost>> {
        Some(Adaptive::learned(self))
    }
}

/// A lane's timed pull in progress: what it took and when.
#[derive(Clone, Copy, Debug)]
struct Pull {
    /// Model key of the jobs taken.
    key: usize,
    /// How many.
    jobs: usize,
    /// When `next` returned them.
    since: Instant,
    /// Whether the lane took as many jobs as it asked for: a batching engine's partial
    /// pull (the last jobs of a class) costs more per job than its usual one, so it
    /// only teaches an estimate that has nothing better yet.
    full: bool,
    /// A re-measurement, the other engines' lanes waiting ([`SharedEstimate::check`]).
    check: bool,
    /// The lane's first pull since it started or last waited: it runs cold, so it may
    /// lower a usable estimate but not raise it ([`SharedEstimate::check`]). In the
    /// soft guest a module request after a pause took 1 ms and more at 256 B against
    /// 0.2-0.4 ms fed steadily, and a mixed round's one cold pull of 3 jobs raised the
    /// module's estimate by the outlier cap, where no job came to lower it again
    /// (`docs/results.md`, twenty-fifth session). A lane that goes on pulling books its
    /// later pulls as usual, so a slower engine still shows; one that takes a single
    /// pull a batch costs that batch at most one pull's slowdown.
    cold: bool,
    /// A module's pull taken while the host-CPU engines' lanes worked, on a host with
    /// more lanes than cores: its wall time holds their CPU time slices too, so it may
    /// lower a usable estimate but not raise it. On the soft guest's one vCPU a
    /// module's 256 B jobs beside the cpu lane cost it 1.5-3x what they cost alone,
    /// which raised its estimate above the cpu's where it was twice as fast alone, and
    /// a declined module's re-measurements run cold and could not bring it back
    /// (`docs/results.md`, twenty-sixth session). Its pulls with the CPU lanes idle,
    /// and the CPU engines' own pulls (a module lane takes little CPU), count as usual.
    contended: bool,
}

/// What one lane keeps between its calls to `next`. Only the lane's own thread touches
/// it; the lock is never contended.
#[derive(Debug, Default)]
struct LaneState {
    /// The timed pull in progress.
    pull: Option<Pull>,
    /// A class this lane may keep taking from without deciding again, and the epoch
    /// when that was decided: set while every lane of the other engines waits, so only
    /// an event (which bumps the epoch) can change the answer.
    streak: Option<(u64, usize)>,
    /// Pulls taken on streaks so far; only every [`STREAK_SAMPLE`]th is timed.
    streak_pulls: u32,
    /// Whether the lane has pulled since it started or last waited ([`Pull::cold`]).
    warm: bool,
}

/// A lane's run through the classes in a sole batch, in atomics with plain loads and
/// stores (only the lane's thread touches them) so that a pull takes no lock. It is
/// timed in *segments* of consecutive pulls of one class ([`SOLE_SEGMENT`]), each ended
/// by one clock read that starts the next: one sample per segment.
#[derive(Debug, Default)]
struct SoleRun {
    /// The class it is on (the first, before its first pull).
    class: AtomicUsize,
    /// Pulls in the open segment (none open at 0), the jobs they took, and whether one
    /// of them got fewer jobs than it asked for.
    pulls: AtomicU32,
    jobs: AtomicUsize,
    partial: AtomicBool,
    /// When the open segment started, in nanoseconds after the schedule's `origin`.
    since: AtomicU64,
}

/// Jobs that the same engines can run, of one cipher, direction and size bucket.
struct Class {
    engines: EngineMask,
    /// Index into the schedule's model keys.
    key: usize,
    max_len: usize,
    jobs: JobList,
}

/// One batch under `adaptive`.
struct AdaptiveSchedule {
    classes: Vec<Class>,
    /// (cipher, direction, bucket) per model key.
    keys: Vec<(Cipher, Direction, usize)>,
    /// Per engine and key (`engine * keys.len() + key`): the cost estimate, and the
    /// calibration's mix beside the batch's other engines ([`Knowledge::gain`]).
    estimates: Vec<SharedEstimate>,
    gains: Vec<Option<(f64, f64, f64)>>,
    /// Per engine and class: probes started while the engine had no estimate.
    probes: Vec<AtomicUsize>,
    /// Per engine and key: whether the engine may re-measure the class in this batch
    /// (its turn, see [`model::REMEASURE_EVERY`], or due sooner, see
    /// [`Knowledge::checked`]), and its estimate right after it last measured the class
    /// alone in this batch (`f64` bits; 0: it did not); per engine, the pulls it
    /// re-measured.
    remeasure_due: Vec<bool>,
    alone: Vec<AtomicU64>,
    remeasured: Vec<AtomicU32>,
    /// The engine (plus one; 0: none) re-measuring in this batch, chosen as the lanes
    /// start: the other engines' lanes wait until it is done ([`View::held`]).
    checker: AtomicUsize,
    /// Per engine: pulls started (an engine that started none learned nothing).
    starts: Vec<AtomicU64>,
    /// Per engine: its position in the model's [`Knowledge::engines`], whether it uses
    /// the host CPU, lanes still working.
    ids: Vec<usize>,
    host_cpu: Vec<bool>,
    alive: Vec<AtomicUsize>,
    cores: usize,
    engine_of: Vec<usize>,
    /// Per lane: its timed pull and streak, and its run in a sole batch.
    lanes: Vec<Mutex<LaneState>>,
    runs: Vec<SoleRun>,
    /// Per engine: lanes waiting in `next` or finished with the batch.
    idle: Vec<AtomicUsize>,
    /// Bumped by every wake-up event; a streak lasts while it is unchanged.
    epoch: AtomicU64,
    learned: Model,
    /// Lanes waiting on `wake`: a wake-up with nobody waiting skips the system call
    /// (one per batch at least, tens of microseconds under emulation).
    wait: Mutex<usize>,
    wake: Condvar,
    /// The engines whose lanes this batch starts with (see
    /// [`AdaptiveSchedule::leave_out_idle_engines`]).
    needed: EngineMask,
    /// The one engine this batch runs, when the plan left every other out and it can
    /// run every class: nothing is left to place, so its lanes take jobs without
    /// deciding ([`AdaptiveSchedule::sole_next`]).
    sole: Option<usize>,
    /// When the schedule was made: the zero of a sole run's segment times.
    origin: Instant,
    /// True until [`AdaptiveSchedule::leave_out_idle_engines`] has chosen the engines
    /// that start: until then no lane runs, and starting any costs [`LANE_START`].
    planning: bool,
}

impl AdaptiveSchedule {
    fn new(plan: &Plan<'_>, learned: Model) -> Self {
        let live = live_engines(plan);
        // Classes and model keys are looked up by the packed code below.
        let mut class_index: HashMap<(EngineMask, u64), usize> = HashMap::new();
        let mut key_index: HashMap<u64, usize> = HashMap::new();
        let mut keys = Vec::new();
        let mut members: Vec<(EngineMask, usize, usize, ListBuilder)> = Vec::new();
        // Consecutive jobs are mostly of one class: a run of them is looked up (hashed)
        // once and added whole (hashing every job cost a third of a 16-byte job).
        // Cipher, direction and size bucket compared as one word.
        let code = |job: &JobMeta| {
            (model::bucket(job.len) as u64) << 16
                | (job.cipher.key_size as u64) << 8
                | (job.cipher.mode as u64) << 4
                | job.direction as u64
        };
        let mut start = 0;
        for run in plan.jobs.chunk_by(|a, b| {
            a.engines.intersect(live) == b.engines.intersect(live) && code(a) == code(b)
        }) {
            let jobs = start..start + run.len();
            start = jobs.end;
            let Some(job) = run.first() else { continue };
            let (engines, this) = (job.engines.intersect(live), code(job));
            if engines.is_empty() {
                continue;
            }
            let key = *key_index.entry(this).or_insert_with(|| {
                keys.push((job.cipher, job.direction, model::bucket(job.len)));
                keys.len() - 1
            });
            let q = *class_index.entry((engines, this)).or_insert_with(|| {
                members.push((engines, key, 0, ListBuilder::default()));
                members.len() - 1
            });
            members[q].2 = run.iter().fold(members[q].2, |max, job| max.max(job.len));
            members[q].3.extend(jobs);
        }
        // Within a class, jobs are taken in batch order.
        let classes: Vec<Class> = members
            .into_iter()
            .map(|(engines, key, max_len, jobs)| Class {
                engines,
                key,
                max_len,
                jobs: jobs.build(),
            })
            .collect();

        let n_engines = plan.engines.len();
        let mut known = lock(&learned);
        let (mut ids, mut estimates, mut gains, mut remeasure_due) =
            (vec![], vec![], vec![], vec![]);
        for engine in plan.engines {
            let id = known.engine(&engine.name, engine.lanes);
            let partners: Vec<&str> = (plan.engines.iter().map(|o| o.name.as_str()))
                .filter(|&o| o != engine.name)
                .collect();
            ids.push(id);
            let turn = known.engines[id].2 >= model::REMEASURE_EVERY;
            for &(c, d, b) in &keys {
                let estimate = known.estimate((id, c, d, b));
                remeasure_due.push(turn || known.check_due((id, c, d, b), &estimate));
                estimates.push(SharedEstimate::new(estimate));
                gains.push(known.gain((id, c, d, b), &partners));
            }
        }
        drop(known);
        AdaptiveSchedule {
            probes: (0..n_engines * classes.len())
                .map(|_| AtomicUsize::new(0))
                .collect(),
            alone: gains.iter().map(|_| AtomicU64::new(0)).collect(),
            remeasure_due,
            remeasured: (0..n_engines).map(|_| AtomicU32::new(0)).collect(),
            checker: AtomicUsize::new(0),
            starts: (0..n_engines).map(|_| AtomicU64::new(0)).collect(),
            classes,
            keys,
            estimates,
            gains,
            ids,
            host_cpu: plan.engines.iter().map(|e| e.uses_host_cpu).collect(),
            alive: (0..n_engines)
                .map(|e| AtomicUsize::new(plan.lanes.iter().filter(|l| l.engine == e).count()))
                .collect(),
            cores: plan.cores.max(1),
            engine_of: plan.lanes.iter().map(|l| l.engine).collect(),
            lanes: plan.lanes.iter().map(|_| Mutex::default()).collect(),
            runs: plan.lanes.iter().map(|_| SoleRun::default()).collect(),
            idle: (0..n_engines).map(|_| AtomicUsize::new(0)).collect(),
            epoch: AtomicU64::new(0),
            learned,
            wait: Mutex::new(0),
            wake: Condvar::new(),
            needed: EngineMask(u64::MAX),
            sole: None,
            origin: Instant::now(),
            planning: true,
        }
    }

    /// Leaves out of the batch the engines that the placement rule, asked before any
    /// lane starts, gives nothing to do at all: no job, probe or re-measurement (a module
    /// far too slow for a batch of tiny jobs). Their lanes would only wait, and under
    /// emulation starting and joining a waiting lane cost a third of such a batch. The
    /// schedule counts them as gone, so nobody waits for them; if an engine fails, the
    /// dispatcher starts them for its jobs anyway, which they take from the re-dispatch
    /// queue. The next batch asks again.
    fn leave_out_idle_engines(&mut self) {
        let mut needed = EngineMask::default();
        for e in 0..self.alive.len() {
            let decision = decide(self, e);
            if self.lanes(e) > 0 && !matches!(decision, Decision::Wait | Decision::Done) {
                needed.insert(e);
            }
            if matches!(decision, Decision::Remeasure(_)) && *self.checker.get_mut() == 0 {
                *self.checker.get_mut() = e + 1;
            }
        }
        self.planning = false;
        if needed.is_empty() {
            return;
        }
        for (e, alive) in self.alive.iter().enumerate() {
            if !needed.contains(e) {
                alive.store(0, Ordering::Release);
            }
        }
        self.needed = needed;
        // One engine left that can run every class: the batch is its alone.
        let e = needed.0.trailing_zeros() as usize;
        if needed.count() == 1 && self.classes.iter().all(|c| c.engines.contains(e)) {
            self.sole = Some(e);
        }
    }

    /// Index of engine `engine` and model key `key` in the per engine and key vectors.
    fn slot(&self, engine: usize, key: usize) -> usize {
        engine * self.keys.len() + key
    }

    /// Wakes every waiting lane to decide again.
    fn notify(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        // Taking the lock orders this wake-up after any waiter's last check; a lane
        // that starts waiting later decides again under the lock first.
        if *lock(&self.wait) > 0 {
            self.wake.notify_all();
        }
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

    /// Whether every lane of the engines other than `engine` is waiting or done.
    fn others_idle(&self, engine: usize) -> bool {
        (0..self.alive.len())
            .filter(|&e| e != engine)
            .all(|e| self.idle[e].load(Ordering::Acquire) >= self.lanes(e))
    }

    /// Whether every working lane but the caller's (a lane of `engine`) waits or is done:
    /// no job runs anywhere, so no event will change the rule's answer.
    fn all_waiting(&self, engine: usize) -> bool {
        self.others_idle(engine)
            && self.idle[engine].load(Ordering::Acquire) + 1 >= self.lanes(engine)
    }

    /// Books lane's timed pull, which ended `now`: wall time per job. The last pull of a
    /// re-measurement lets the other engines' lanes go on.
    fn book(&self, engine: usize, pull: Pull, now: Instant) {
        let slot = self.slot(engine, pull.key);
        let estimate = &self.estimates[slot];
        let wall =
            now.saturating_duration_since(pull.since).as_secs_f64() / pull.jobs.max(1) as f64;
        if pull.check {
            estimate.check(wall, wall);
            self.measured_alone(slot);
            if self.remeasured[engine].load(Ordering::Acquire) >= model::CHECK_PULLS {
                self.release(engine);
            }
        } else if (pull.cold || pull.contended) && estimate.cost().is_some() {
            estimate.check(wall, wall);
        } else if (pull.full || estimate.cost().is_none()) && estimate.observe(wall, wall) {
            self.notify();
        }
    }

    /// Notes the estimate in `slot` as it stands right after a measurement alone: what
    /// the next batches compare it with ([`Knowledge::checked`]). Pulls later in the
    /// batch, beside other engines' lanes, may raise it (on one vCPU a module's 256 B
    /// requests beside the cpu lane cost it 2-3x what they cost alone, twenty-sixth
    /// session), and the value at the batch's end would hide that growth.
    fn measured_alone(&self, slot: usize) {
        if let Some(c) = self.estimates[slot].cost() {
            self.alone[slot].store(c.wall.to_bits().max(1), Ordering::Relaxed);
        }
    }

    /// Ends `engine`'s re-measurement, if it is the one holding the others.
    fn release(&self, engine: usize) {
        if self.checker.load(Ordering::Acquire) == engine + 1 {
            self.checker.store(0, Ordering::Release);
            self.notify();
        }
    }

    /// Chooses and takes jobs for a lane of `engine`: the class taken from and the
    /// decision that took it (`None` for a streak), or `None` when nothing more is for
    /// this lane.
    fn choose(
        &self,
        engine: usize,
        max: usize,
        out: &mut Vec<usize>,
        state: &mut LaneState,
    ) -> Option<(usize, Option<Decision>)> {
        if let Some((epoch, q)) = state.streak.take() {
            if epoch == self.epoch.load(Ordering::Acquire)
                && self.others_idle(engine)
                && self.take(q, max, out)
            {
                state.streak = Some((epoch, q));
                state.streak_pulls = state.streak_pulls.wrapping_add(1);
                return Some((q, None));
            }
        }
        let mut announced = false;
        loop {
            let epoch = self.epoch.load(Ordering::Acquire);
            let decision = decide(self, engine);
            if !matches!(decision, Decision::Remeasure(_)) {
                self.release(engine);
            }
            let q = match decision {
                Decision::Take(q) | Decision::Remeasure(q) => q,
                Decision::Probe(q) => {
                    self.probes[engine * self.classes.len() + q].fetch_add(1, Ordering::Relaxed);
                    q
                }
                Decision::Done => {
                    self.idle[engine].fetch_add(1, Ordering::AcqRel);
                    return None;
                }
                Decision::Wait => {
                    if !announced {
                        // A lane starting to wait may change what the others should
                        // do (it no longer counts on them): let them decide again.
                        announced = true;
                        self.notify();
                    }
                    let mut guard = lock(&self.wait);
                    // Decide again under the lock, so a wake-up sent after this check
                    // cannot be missed.
                    if decide(self, engine) != Decision::Wait {
                        continue;
                    }
                    if self.all_waiting(engine) {
                        // Every other lane waits too and no job runs: waiting would hang
                        // the batch. The rule guarantees some lane goes on, and its
                        // tests check that it does; should it ever fail, the work goes
                        // on as under `pull`, not never.
                        drop(guard);
                        if let Some(q) = (0..self.classes.len()).find(|&q| {
                            self.classes[q].engines.contains(engine) && self.take(q, max, out)
                        }) {
                            return Some((q, Some(Decision::Take(q))));
                        }
                        continue;
                    }
                    self.idle[engine].fetch_add(1, Ordering::AcqRel);
                    *guard += 1;
                    let (mut guard, _) = self
                        .wake
                        .wait_timeout(guard, WAIT_RECHECK)
                        .unwrap_or_else(|e| e.into_inner());
                    *guard -= 1;
                    self.idle[engine].fetch_sub(1, Ordering::AcqRel);
                    state.warm = false;
                    continue;
                }
            };
            // A re-measurement: CHECK_PULLS a batch per engine, whichever lanes get them.
            if (decision != Decision::Remeasure(q)
                || self.remeasured[engine].fetch_add(1, Ordering::AcqRel) < model::CHECK_PULLS)
                && self.take(q, max, out)
            {
                if decision == Decision::Take(q) && self.others_idle(engine) {
                    state.streak = Some((epoch, q));
                }
                return Some((q, Some(decision)));
            }
        }
    }

    /// `next` for a lane of the sole engine: the next pull of its run's class (one
    /// atomic add and a few counters; a clock read and a booking once a segment of
    /// [`SOLE_SEGMENT`] pulls or a class is over), or the next class.
    fn sole_next(&self, lane: usize, engine: usize, max: usize, out: &mut Vec<usize>) -> bool {
        let run = &self.runs[lane];
        // The clock, read at most once a call.
        let mut now = None;
        let mut clock = || *now.get_or_insert_with(|| self.clock());
        let current = run.class.load(Ordering::Relaxed);
        if run.pulls.load(Ordering::Relaxed) >= SOLE_SEGMENT {
            self.close_segment(lane, engine, clock());
        }
        for (q, class) in self.classes.iter().enumerate().skip(current) {
            let before = out.len();
            if class.engines.contains(engine) && class.jobs.take(max, out) > 0 {
                let jobs = out.len() - before;
                // The previous class's segment ends where this class starts; a pull
                // that got fewer jobs than asked (a class's last) is a segment of its
                // own, so that it does not make the full pulls before it partial.
                if q != current || jobs < max {
                    self.close_segment(lane, engine, clock());
                    run.class.store(q, Ordering::Relaxed);
                }
                let pulls = run.pulls.load(Ordering::Relaxed);
                if pulls == 0 {
                    run.since.store(clock(), Ordering::Relaxed);
                }
                run.pulls.store(pulls + 1, Ordering::Relaxed);
                // A plain load and store: an atomic add is a locked instruction, and
                // only this lane's thread touches its run.
                run.jobs
                    .store(run.jobs.load(Ordering::Relaxed) + jobs, Ordering::Relaxed);
                if jobs < max {
                    run.partial.store(true, Ordering::Relaxed);
                }
                return true;
            }
        }
        self.close_segment(lane, engine, clock());
        run.class.store(self.classes.len(), Ordering::Relaxed);
        self.idle[engine].fetch_add(1, Ordering::AcqRel);
        false
    }

    /// Nanoseconds since the schedule was made: a sole run's segments keep their start
    /// in an atomic this way.
    fn clock(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Books lane `lane`'s open segment of a sole run (if any), which ended at `now`
    /// (nanoseconds after `origin`), as one sample of its class, and closes it.
    fn close_segment(&self, lane: usize, engine: usize, now: u64) {
        let run = &self.runs[lane];
        if run.pulls.swap(0, Ordering::Relaxed) == 0 {
            return;
        }
        let Some(class) = self.classes.get(run.class.load(Ordering::Relaxed)) else {
            return;
        };
        let since = run.since.load(Ordering::Relaxed);
        let pull = Pull {
            key: class.key,
            jobs: run.jobs.swap(0, Ordering::Relaxed),
            since: self.origin + Duration::from_nanos(since),
            full: !run.partial.swap(false, Ordering::Relaxed),
            check: false,
            // A segment is many pulls in a row: its lane's start weighs little in it;
            // and the batch is its engine's alone.
            cold: false,
            contended: false,
        };
        self.starts[engine].fetch_add(1, Ordering::Relaxed);
        let end = self.origin + Duration::from_nanos(now.max(since));
        self.book(engine, pull, end);
        self.measured_alone(self.slot(engine, class.key));
    }
}

impl View for AdaptiveSchedule {
    fn engines(&self) -> usize {
        self.alive.len()
    }

    fn lanes(&self, e: usize) -> usize {
        self.alive[e].load(Ordering::Acquire)
    }

    fn steal(&self) -> f64 {
        // Working lanes of the modules, and of the engines on the host CPU.
        let mut lanes = [0, 0];
        for (e, &host) in self.host_cpu.iter().enumerate() {
            lanes[usize::from(host)] += self.lanes(e);
        }
        let [module, cpu] = lanes;
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
        self.keys[self.classes[q].key].2
    }

    fn max_len(&self, q: usize) -> usize {
        self.classes[q].max_len
    }

    fn smaller_known(&self, e: usize, q: usize) -> Option<(usize, Cost)> {
        let (c, d, b) = self.keys[self.classes[q].key];
        (0..self.keys.len())
            .filter(|&k| self.keys[k].0 == c && self.keys[k].1 == d && self.keys[k].2 < b)
            .filter_map(|k| Some((self.keys[k].2, self.estimates[self.slot(e, k)].cost()?)))
            .max_by_key(|known| known.0)
    }

    fn cost(&self, e: usize, q: usize) -> Option<Cost> {
        self.estimates[self.slot(e, self.classes[q].key)]
            .get()
            .cost()
    }

    fn probes(&self, e: usize, q: usize) -> usize {
        self.probes[e * self.classes.len() + q].load(Ordering::Relaxed)
    }

    fn gain(&self, e: usize, q: usize) -> Option<f64> {
        let slot = self.slot(e, self.classes[q].key);
        let (mine, other, stored) = self.gains[slot]?;
        // Its part as it runs now: where it costs more than the store said, less.
        let now = self.estimates[slot].cost().map_or(stored, |c| c.wall);
        Some(mine * (stored / now).min(1.0) + other)
    }

    fn may_remeasure(&self, e: usize, q: usize) -> bool {
        self.remeasure_due[self.slot(e, self.classes[q].key)]
            && self.remeasured[e].load(Ordering::Relaxed) < model::CHECK_PULLS
            && (self.planning || self.checker.load(Ordering::Acquire) == e + 1)
    }

    fn held(&self, me: usize) -> bool {
        let checker = self.checker.load(Ordering::Acquire);
        !self.planning && checker != 0 && checker != me + 1 && self.lanes(checker - 1) > 0
    }

    fn start_cost(&self, e: usize) -> f64 {
        if !self.planning && self.needed.contains(e) {
            return 0.0;
        }
        LANE_START.as_secs_f64()
    }
}

impl Schedule for AdaptiveSchedule {
    fn next(&self, lane: usize, max: usize, out: &mut Vec<usize>) -> bool {
        let engine = self.engine_of[lane];
        if self.sole == Some(engine) {
            return self.sole_next(lane, engine, max, out);
        }
        let mut state = lock(&self.lanes[lane]);
        if let Some(pull) = state.pull.take() {
            self.book(engine, pull, Instant::now());
        }
        let before = out.len();
        let Some((q, decision)) = self.choose(engine, max, out, &mut state) else {
            return false;
        };
        let cold = !std::mem::replace(&mut state.warm, true);
        if decision.is_none() && !state.streak_pulls.is_multiple_of(STREAK_SAMPLE) {
            return true;
        }
        self.starts[engine].fetch_add(1, Ordering::Relaxed);
        let jobs = out.len() - before;
        let contended = !self.host_cpu[engine] && self.steal() > 0.0 && !self.others_idle(engine);
        state.pull = Some(Pull {
            key: self.classes[q].key,
            jobs,
            since: Instant::now(),
            full: jobs >= max,
            check: matches!(decision, Some(Decision::Remeasure(_))),
            cold,
            contended,
        });
        true
    }

    fn engines_needed(&self) -> EngineMask {
        self.needed
    }

    fn engine_failed(&self, engine: usize) -> Vec<usize> {
        if let Some(alive) = self.alive.get(engine) {
            alive.store(0, Ordering::Release);
        }
        self.release(engine);
        let jobs = self
            .classes
            .iter()
            .filter(|c| (0..self.alive.len()).all(|e| !c.engines.contains(e) || self.lanes(e) == 0))
            .flat_map(|c| c.jobs.drain())
            .collect();
        self.notify();
        jobs
    }
}

impl Drop for AdaptiveSchedule {
    /// Keeps what this batch learned for the next one.
    fn drop(&mut self) {
        let mut known = lock(&self.learned);
        for (e, &id) in self.ids.iter().enumerate() {
            // Batches since the engine last re-measured a class.
            let (remeasured, n) = (*self.remeasured[e].get_mut() > 0, &mut known.engines[id].2);
            *n = if remeasured { 0 } else { n.saturating_add(1) };
            // Only an engine's own lanes book its estimates: one that timed no pull
            // (left out of the batch) learned nothing new.
            if *self.starts[e].get_mut() > 0 {
                for (k, &(cipher, direction, b)) in self.keys.iter().enumerate() {
                    let slot = self.slot(e, k);
                    let estimate = self.estimates[slot].get();
                    if estimate.samples() > 0 {
                        known.costs.insert((id, cipher, direction, b), estimate);
                    }
                    let alone = *self.alone[slot].get_mut();
                    if alone != 0 {
                        known
                            .checked
                            .insert((id, cipher, direction, b), f64::from_bits(alone));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration::{MixCalibration, MixPoint};
    use crate::policy::tests::{cbc_jobs, cpu_and_kernel};
    use crate::policy::{EngineMeta, LaneMeta};

    /// The first job each lane takes, asked from a thread so that a lane the policy
    /// makes wait fails the test instead of hanging it.
    fn first_pick(s: &Arc<dyn Schedule>, lane: usize) -> Option<usize> {
        let (tx, rx) = std::sync::mpsc::channel();
        let s = Arc::clone(s);
        std::thread::spawn(move || {
            let mut out = Vec::new();
            s.next(lane, 1, &mut out);
            let _ = tx.send(out.first().copied());
        });
        rx.recv_timeout(Duration::from_millis(500)).ok().flatten()
    }

    /// Given a stored calibration (a cpu fast on small jobs, a module that wins from
    /// ~22 KB), `adaptive` sends the first small job to the cpu and the first large job
    /// to the module, with nothing measured yet and no probe; without the store the
    /// module's first job is a probe of the smallest class.
    #[test]
    fn seeded_adaptive_routes_the_first_jobs_by_the_stored_model() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs((0..100).map(|i| if i < 50 { 64 } else { 65536 }));
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let cal = Arc::new(crate::calibration::tests::cpu_and_module());
        let seeded = Adaptive::seeded(cal);
        let s: Arc<dyn Schedule> = Arc::from(seeded.plan(&plan).unwrap());
        let kernel = first_pick(&s, 1).expect("the module takes a job at once");
        let cpu = first_pick(&s, 0).expect("the cpu takes a job at once");
        assert!(
            kernel >= 50,
            "the module's first job is a large one: {kernel}"
        );
        assert!(cpu < 50, "the cpu's first job is a small one: {cpu}");
        // What the store said is what the policy starts from.
        let learned = seeded.learned();
        let module_large = learned
            .iter()
            .find(|l| l.engine == "kernel" && l.min_len == 65536)
            .and_then(|l| l.cost)
            .expect("seeded");
        assert!((module_large.wall - (200e-6 + 65536e-9)).abs() < 1e-9);

        let fresh: Arc<dyn Schedule> = Arc::from(Adaptive::new().plan(&plan).unwrap());
        let probe = first_pick(&fresh, 1).expect("the module probes at once");
        assert!(
            probe < 50,
            "without a store the module probes small jobs first: {probe}"
        );
    }

    /// On one core, the mix gain the store measured decides whether the cpu joins the
    /// module's class from the first job: below [`model::MIX_GAIN`] or unmeasured it
    /// stays out, above it joins at once.
    #[test]
    fn seeded_mix_gain_decides_whether_the_cpu_joins() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([65536; 200]);
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            // One core: the cpu lane's work takes it from the module's driver.
            cores: 1,
        };
        let with_gain = |gain: Option<f64>| {
            let mut cal = crate::calibration::tests::cpu_and_module();
            if let Some(gain) = gain {
                // The module alone moves 100 MB/s; both together `gain` times that.
                cal.mixes.push(MixCalibration {
                    cipher: Cipher::AES_128_CBC,
                    direction: Direction::Encrypt,
                    engines: ["cpu".into(), "kernel".into()],
                    points: vec![MixPoint {
                        len: 65536,
                        alone: [10e6, 100e6],
                        together: [10e6, gain * 100e6 - 10e6],
                    }],
                });
            }
            let s: Arc<dyn Schedule> =
                Arc::from(Adaptive::seeded(Arc::new(cal)).plan(&plan).unwrap());
            assert!(first_pick(&s, 1).is_some(), "the module takes the class");
            first_pick(&s, 0)
        };
        assert_eq!(
            with_gain(Some(0.8)),
            None,
            "a losing mix: the cpu stays out"
        );
        assert!(
            with_gain(Some(1.3)).is_some(),
            "a gaining mix: the cpu joins"
        );
        assert_eq!(with_gain(None), None, "no gain known: the cpu stays out");
    }

    /// The cpu's pair with `partner` as `calibrate` stores it, AES-128-CBC encryption at
    /// 64 KiB: alone 40 MB/s (cpu) and 100 MB/s (partner), side by side as given.
    fn cpu_mix(partner: &str, cpu_beside: f64, other_beside: f64) -> MixCalibration {
        MixCalibration {
            cipher: Cipher::AES_128_CBC,
            direction: Direction::Encrypt,
            engines: ["cpu".into(), partner.into()],
            points: vec![MixPoint {
                len: 65536,
                alone: [40e6, 100e6],
                together: [cpu_beside, other_beside],
            }],
        }
    }

    /// The store's mix gain is the batch's pair's, and the joining engine's part of it
    /// shrinks as its cost rises above the store. The twenty-second session's boot 3
    /// stored the cpu beside the generic `kernel` engine at 1.05x, the gain the cpu was
    /// given beside `kernel:virtio_crypto_aes_cbc` (whose own pair read 0.73x), and the
    /// cpu then cost 7x its store: 33-48 of 200 jobs a round went to it.
    #[test]
    fn the_mix_gain_is_the_batch_s_pair_s_and_shrinks_with_the_joiner_s_cost() {
        let mut cal = crate::calibration::tests::cpu_and_module();
        // Another engine's pair first: a gain of 0.5 that is not this batch's.
        cal.mixes.push(cpu_mix("devcrypto", 10e6, 40e6));
        // The cpu's part 0.3, the module's 1.0 (its 100 MB/s kept beside the cpu).
        cal.mixes.push(cpu_mix("kernel", 30e6, 100e6));
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([65536; 200]);
        let policy = Adaptive::seeded(Arc::new(cal));
        let mut s = schedule(&policy, &jobs, &engines, &lanes, 1);
        assert_eq!(s.slot(0, 0), 0);
        let gain = |s: &AdaptiveSchedule| s.gain(0, 0).expect("measured");
        assert!((gain(&s) - 1.3).abs() < 1e-9, "{}", gain(&s));
        // The cpu's estimate at 7x its stored cost: its part is 0.3 / 7.
        let stored = 1e-6 + 10e-9 * 65536.0;
        s.estimates[0] = SharedEstimate::new(Estimate::seeded(7.0 * stored, 7.0 * stored));
        assert!((gain(&s) - (1.0 + 0.3 / 7.0)).abs() < 1e-9, "{}", gain(&s));
        assert!(gain(&s) < model::MIX_GAIN, "the cpu no longer joins");
        // What `bench` records is the stored gain, the two parts' sum.
        let learned = policy.learned();
        let cpu = learned.iter().find(|l| l.engine == "cpu").expect("seeded");
        assert!(
            cpu.mix_gain.is_some_and(|g| (g - 1.3).abs() < 1e-9),
            "{cpu:?}"
        );
    }

    /// Among the batch's other engines, the gain is that of the stored pair that gains
    /// least (0.95x beside `devcrypto` over 1.1x beside `kernel`, whose parts, 0.1 and
    /// 1.0, differ and multiply to less), with the joiner's stored cost.
    #[test]
    fn the_mix_gain_is_the_least_of_the_batch_s_pairs() {
        let (c, d) = (Cipher::AES_128_CBC, Direction::Encrypt);
        let mut cal = crate::calibration::tests::cpu_and_module();
        cal.mixes.push(cpu_mix("kernel", 10e6, 100e6));
        cal.mixes.push(cpu_mix("devcrypto", 50e6, 55e6));
        let mut known = Knowledge {
            seed: Some(Arc::new(cal)),
            ..Knowledge::default()
        };
        let cpu = known.engine("cpu", 1);
        let key = (cpu, c, d, model::bucket(65536));
        let (mine, other, stored) = known.gain(key, &["kernel", "devcrypto"]).expect("pairs");
        // The cpu's part 40/100 (its 50 MB/s beside counts as its 40 alone), 0.55 other.
        assert!((mine - 0.4).abs() < 1e-12 && (other - 0.55).abs() < 1e-12);
        assert!((stored - (1e-6 + 10e-9 * 65536.0)).abs() < 1e-12);
        assert!(known
            .gain(key, &["kernel"])
            .is_some_and(|g| (g.0 - 0.1).abs() < 1e-12));
        assert_eq!(known.gain(key, &["gpu"]), None);
    }

    /// On one core, from a store that says the module's request floor (200 µs) is
    /// hundreds of the cpu's tiny jobs, the first batch leaves the module out: its lane
    /// is not started and nothing is probed. (Without the store, the module
    /// probes such jobs in its first batches: `tests/it/deferred_lanes.rs`.)
    #[test]
    fn seeded_adaptive_leaves_a_slow_module_out_of_the_first_batch_of_tiny_jobs() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([16; 400]);
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 1,
        };
        let cal = Arc::new(crate::calibration::tests::cpu_and_module());
        let seeded = Adaptive::seeded(cal).plan(&plan).unwrap();
        assert_eq!(seeded.engines_needed(), EngineMask(1));
        let fresh = Adaptive::new().plan(&plan).unwrap();
        assert_eq!(fresh.engines_needed(), EngineMask(3));
    }

    /// A cpu that ran a class at twice its stored cost makes the first batch of a size
    /// two buckets up, where the store puts the cpu ahead of the module (165 against
    /// 216 µs at 16 KiB), go to the module instead: the drift carries, from up to four
    /// buckets away. It does not carry from five, nor from a class with too few samples
    /// of its own.
    #[test]
    fn the_stores_drift_on_a_nearby_class_carries_to_the_first_batch_of_another() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([16384; 200]);
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 1,
        };
        // The cpu has run `len` jobs at twice the stored cost, `own` samples of its own.
        let drifted = |len: usize, own: u32| {
            let policy = seeded();
            {
                let mut known = lock(&policy.learned);
                let id = known.engine("cpu", 1);
                let (c, d) = (Cipher::AES_128_CBC, Direction::Encrypt);
                let b = model::bucket(len);
                let twice = 2.0 * known.stored((id, c, d, b)).expect("stored");
                let mut e = Estimate::seeded(twice, twice);
                for _ in 0..own {
                    e.observe(twice, twice);
                }
                known.costs.insert((id, c, d, b), e);
            }
            policy.plan(&plan).expect("plans").engines_needed()
        };
        assert_eq!(
            seeded().plan(&plan).expect("plans").engines_needed(),
            EngineMask(1),
            "by the store alone the cpu runs the batch"
        );
        assert_eq!(
            drifted(4096, DRIFT_MIN_OWN),
            EngineMask(2),
            "the drift carries"
        );
        assert_eq!(
            drifted(1024, DRIFT_MIN_OWN),
            EngineMask(2),
            "four buckets carry"
        );
        assert_eq!(
            drifted(512, DRIFT_MIN_OWN),
            EngineMask(1),
            "too far to carry"
        );
        assert_eq!(
            drifted(4096, DRIFT_MIN_OWN - 1),
            EngineMask(1),
            "too few samples"
        );
        // One sole round of a short run (200 jobs) is about 200 / SOLE_SEGMENT
        // samples: enough to carry (a whole window of own samples was not).
        let one_round = 200 / SOLE_SEGMENT;
        assert_eq!(drifted(4096, one_round), EngineMask(2), "one round carries");
    }

    /// Knowledge seeded with `cal` that has met `cpu` (id 0) and `kernel` (id 1).
    fn knowledge(cal: Calibration) -> Knowledge {
        let mut known = Knowledge {
            seed: Some(Arc::new(cal)),
            ..Knowledge::default()
        };
        assert_eq!((known.engine("cpu", 1), known.engine("kernel", 1)), (0, 1));
        known
    }

    /// Gives engine `id` a settled estimate of `wall` seconds a job (enough samples of
    /// its own to drift by) on the class `key`.
    fn learn(known: &mut Knowledge, key: ModelKey, wall: f64) {
        let mut e = Estimate::seeded(wall, wall);
        for _ in 0..DRIFT_MIN_OWN {
            e.observe(wall, wall);
        }
        known.costs.insert(key, e);
    }

    /// The drift is the engine's own learned over stored cost on a nearby class of the
    /// same cipher and direction, and 1 where a side of that ratio is zero: another
    /// engine's, cipher's or direction's samples never move it.
    #[test]
    fn drift_is_learned_over_stored_of_the_engines_own_class() {
        let (c, d) = (Cipher::AES_128_CBC, Direction::Encrypt);
        let (near, b) = (model::bucket(4096), model::bucket(16384));
        let cal = crate::calibration::tests::cpu_and_module;
        let mut known = knowledge(cal());
        assert_eq!(known.drift((0, c, d, b)), 1.0, "nothing learned");
        let stored = |k: &Knowledge, id| k.stored((id, c, d, near)).expect("stored");
        for (cipher, direction) in [(Cipher::AES_256_CBC, d), (c, Direction::Decrypt)] {
            let mut k = knowledge(cal());
            let three = 3.0 * stored(&k, 0);
            learn(&mut k, (0, cipher, direction, near), three);
            assert_eq!(k.drift((0, c, d, b)), 1.0, "{cipher} {direction}");
        }
        // The module's samples are the module's.
        let three = 3.0 * stored(&known, 1);
        learn(&mut known, (1, c, d, near), three);
        assert_eq!(known.drift((0, c, d, b)), 1.0);
        assert!((known.drift((1, c, d, b)) - 3.0).abs() < 1e-9);
        // The cpu's own, twice the store.
        let twice = 2.0 * stored(&known, 0);
        learn(&mut known, (0, c, d, near), twice);
        assert!((known.drift((0, c, d, b)) - 2.0).abs() < 1e-9);
        // Below the store too, down to 1 / DRIFT_CAP_DOWN.
        let half = stored(&known, 0) / 2.0;
        learn(&mut known, (0, c, d, near), half);
        assert!((known.drift((0, c, d, b)) - 0.5).abs() < 1e-9);
        let tenth = stored(&known, 0) / 10.0;
        learn(&mut known, (0, c, d, near), tenth);
        assert_eq!(known.drift((0, c, d, b)), 1.0 / DRIFT_CAP_DOWN);
        // Above it up to DRIFT_CAP_UP: 12x (the soft guest's cpu at 64 B) carries whole.
        let far = stored(&known, 0) * 2.0 * DRIFT_CAP_UP;
        learn(&mut known, (0, c, d, near), far);
        assert_eq!(known.drift((0, c, d, b)), DRIFT_CAP_UP);
        let twelve = stored(&known, 0) * 12.0;
        learn(&mut known, (0, c, d, near), twelve);
        let whole = known.drift((0, c, d, b)) / 12.0;
        assert!((whole - 1.0).abs() < 1e-9, "under the cap it carries whole");
        // A learned cost of zero says nothing.
        learn(&mut known, (0, c, d, near), 0.0);
        assert_eq!(known.drift((0, c, d, b)), 1.0, "learned zero");
        // Nor does a stored cost of zero (a class the store measured as free).
        let mut free = cal();
        free.engines[0].classes[0] = crate::calibration::tests::class(c, d, 0.0, 0.0, 1.0);
        let mut known = knowledge(free);
        learn(&mut known, (0, c, d, near), 1e-4);
        assert_eq!(known.drift((0, c, d, b)), 1.0, "stored zero");
    }

    /// A class is checked alone again where it never was, or where its estimate has grown
    /// more than [`model::FAST_DOWN`] times what it was when it last was.
    #[test]
    fn a_check_is_due_when_never_made_or_the_estimate_grew_past_fast_down() {
        let mut known = knowledge(crate::calibration::tests::cpu_and_module());
        let key = (
            0,
            Cipher::AES_128_CBC,
            Direction::Encrypt,
            model::bucket(1024),
        );
        let alone = 1e-4;
        let at = |wall: f64| Estimate::seeded(wall, wall);
        assert!(!known.check_due(key, &Estimate::default()), "no estimate");
        assert!(known.check_due(key, &at(alone)), "never checked");
        known.checked.insert(key, alone);
        assert!(!known.check_due(key, &at(alone)));
        assert!(
            !known.check_due(key, &at(alone * model::FAST_DOWN)),
            "grown by exactly"
        );
        assert!(known.check_due(key, &at(alone * 1.6)), "grown past");
    }

    /// The policy seeded with [`crate::calibration::tests::cpu_and_module`]: a cpu fast
    /// on small jobs, a module with a 200 µs request floor that wins from ~22 KB.
    fn seeded() -> Adaptive {
        Adaptive::seeded(Arc::new(crate::calibration::tests::cpu_and_module()))
    }

    /// A schedule of `jobs` as [`Adaptive::plan`] builds it, before it leaves any
    /// engine out, so that a test can drive its lanes and read its state. A test that
    /// asks on its own thread marks the other engine's lanes waiting (`idle`): a lane
    /// the rule made wait then takes a job anyway (`all_waiting`) and the test fails
    /// on what it got instead of hanging.
    fn schedule(
        policy: &Adaptive,
        jobs: &[JobMeta],
        engines: &[EngineMeta],
        lanes: &[LaneMeta],
        cores: usize,
    ) -> AdaptiveSchedule {
        let plan = Plan {
            jobs,
            engines,
            lanes,
            cores,
        };
        AdaptiveSchedule::new(&plan, Arc::clone(&policy.learned))
    }

    /// `cpu_and_kernel`, with `cpu` lanes and `kernel` lanes.
    fn cpu_and_kernel_lanes(cpu: usize, kernel: usize) -> (Vec<EngineMeta>, Vec<LaneMeta>) {
        let (mut engines, _) = cpu_and_kernel();
        engines[0].lanes = cpu;
        engines[1].lanes = kernel;
        let lanes = (0..cpu)
            .map(|index| LaneMeta { engine: 0, index })
            .chain((0..kernel).map(|index| LaneMeta { engine: 1, index }))
            .collect();
        (engines, lanes)
    }

    /// Jobs of `lens` that only the engines in `mask` may run.
    fn jobs_for(mask: u64, lens: impl IntoIterator<Item = usize>) -> Vec<JobMeta> {
        let mut jobs = cbc_jobs(lens);
        for job in &mut jobs {
            job.engines = EngineMask(mask);
        }
        jobs
    }

    /// A full, warm, uncontended pull of `jobs` jobs of the first class, taken at
    /// `since`: the tests vary the flags they are about with `..`.
    fn pull_at(since: Instant, jobs: usize) -> Pull {
        Pull {
            key: 0,
            jobs,
            since,
            full: true,
            check: false,
            cold: false,
            contended: false,
        }
    }

    /// With every lane of the other engine waiting, the cpu's lane keeps taking from
    /// its class without deciding, one job a pull, until an event (the module failing)
    /// makes it decide again.
    #[test]
    fn a_streak_lasts_until_an_event() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([64; 10]);
        let s = schedule(&seeded(), &jobs, &engines, &lanes, 2);
        // The module's lane waits.
        s.idle[1].store(1, Ordering::Release);
        let mut state = LaneState::default();
        let mut out = Vec::new();
        let decided = Some((0, Some(Decision::Take(0))));
        assert_eq!(s.choose(0, 1, &mut out, &mut state), decided);
        assert_eq!(s.choose(0, 1, &mut out, &mut state), Some((0, None)));
        assert_eq!(out, [0, 1]);
        assert_eq!(s.engine_failed(1), Vec::<usize>::new());
        assert_eq!(s.choose(0, 1, &mut out, &mut state), decided);
        assert_eq!(out, [0, 1, 2]);
    }

    /// A take says whether it got a job; the take that empties a class is an event
    /// (streaks end, waiting lanes decide again), the takes before it are not.
    #[test]
    fn the_take_that_empties_a_class_is_an_event() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([64; 2]);
        let s = schedule(&Adaptive::new(), &jobs, &engines, &lanes, 2);
        let epoch = || s.epoch.load(Ordering::Acquire);
        let mut out = Vec::new();
        assert!(s.take(0, 1, &mut out));
        assert_eq!(epoch(), 0);
        assert!(s.take(0, 1, &mut out));
        assert_eq!(epoch(), 1);
        assert!(!s.take(0, 1, &mut out), "nothing left");
        assert_eq!(out, [0, 1]);
    }

    /// The others are idle when every lane of every other engine waits; everyone is
    /// waiting when, besides, every lane of the caller's engine but the caller does.
    #[test]
    fn others_are_idle_only_when_all_their_lanes_wait() {
        let (engines, lanes) = cpu_and_kernel_lanes(2, 1);
        let jobs = cbc_jobs([64; 10]);
        let s = schedule(&Adaptive::new(), &jobs, &engines, &lanes, 4);
        let idle = |e: usize, n: usize| s.idle[e].store(n, Ordering::Release);
        // Both cpu lanes wait, the module's lane works.
        idle(0, 2);
        assert!(!s.others_idle(0));
        assert!(!s.all_waiting(0));
        assert!(s.others_idle(1));
        // The module's lane and one cpu lane wait: the other cpu lane asks.
        idle(1, 1);
        idle(0, 1);
        assert!(s.others_idle(0));
        assert!(s.all_waiting(0));
        // Neither cpu lane waits.
        idle(0, 0);
        assert!(!s.all_waiting(0));
        assert!(!s.others_idle(1));
    }

    /// A booked pull teaches its engine's estimate the wall time per job it took.
    #[test]
    fn a_booked_pull_counts_its_wall_time_per_job() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([64; 10]);
        let s = schedule(&Adaptive::new(), &jobs, &engines, &lanes, 2);
        let since = Instant::now();
        let pull = pull_at(since, 4);
        // Two pulls of four jobs in 40 ms each (the first is the warm-up).
        s.book(0, pull, since + Duration::from_millis(40));
        s.book(0, pull, since + Duration::from_millis(40));
        let wall = s.estimates[s.slot(0, 0)].cost().map(|c| c.wall);
        assert!(wall.is_some_and(|w| (w - 0.01).abs() < 1e-12), "{wall:?}");
    }

    /// A lane's cold pull (its first since it started or waited) lowers a usable
    /// estimate but does not raise it; the same pull warm raises it; with no usable
    /// estimate yet a cold pull counts as any other (a probe).
    #[test]
    fn a_cold_pull_only_lowers_a_usable_estimate() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([64; 10]);
        let s = schedule(&Adaptive::new(), &jobs, &engines, &lanes, 2);
        let since = Instant::now();
        let wall = || s.estimates[s.slot(1, 0)].cost().map(|c| c.wall);
        let book = |ms: u64, cold: bool| {
            let pull = Pull {
                cold,
                ..pull_at(since, 1)
            };
            s.book(1, pull, since + Duration::from_millis(ms));
        };
        // Two cold probes make the estimate: 10 ms.
        book(10, true);
        book(10, true);
        assert_eq!(wall(), Some(0.01));
        book(40, true);
        assert_eq!(wall(), Some(0.01), "a slow cold pull is left out");
        book(5, true);
        assert!(wall().is_some_and(|w| w < 0.01), "a fast one lowers it");
        let before = wall().unwrap_or_default();
        book(40, false);
        assert!(
            wall().is_some_and(|w| w > before),
            "a slow warm pull raises it"
        );
    }

    /// On one core a module's pull taken while the cpu's lane works is contended: it
    /// lowers a usable estimate but does not raise it. Taken while the cpu's lane waits,
    /// or on a host with a core per lane, it is not. (And a lane's first pull is cold,
    /// its next one not: the flag [`Pull::cold`] is set where the pull is taken.)
    #[test]
    fn a_module_pull_beside_a_working_cpu_lane_on_one_core_only_lowers() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([64; 40]);
        let contended = |cores: usize, cpu_waits: bool| {
            let s = schedule(&Adaptive::new(), &jobs, &engines, &lanes, cores);
            s.idle[0].store(usize::from(cpu_waits), Ordering::Release);
            let mut out = Vec::new();
            assert!(s.next(1, 1, &mut out), "a job for the module's lane");
            let pull = lock(&s.lanes[1]).pull;
            pull.map(|p| p.contended)
        };
        assert_eq!(contended(1, false), Some(true));
        assert_eq!(contended(1, true), Some(false), "the cpu's lane waits");
        assert_eq!(contended(2, false), Some(false), "a core each");
        // A lane's first pull is cold, its next one is not.
        let s = schedule(&Adaptive::new(), &jobs, &engines, &lanes, 2);
        let mut out = Vec::new();
        let cold = |s: &AdaptiveSchedule| lock(&s.lanes[1]).pull.map(|p| p.cold);
        assert!(s.next(1, 1, &mut out));
        assert_eq!(cold(&s), Some(true), "the lane's first pull");
        assert!(s.next(1, 1, &mut out));
        assert_eq!(cold(&s), Some(false), "its second");

        let s = schedule(&Adaptive::new(), &jobs, &engines, &lanes, 1);
        let since = Instant::now();
        let wall = || s.estimates[s.slot(1, 0)].cost().map(|c| c.wall);
        let book = |ms: u64, contended: bool| {
            let pull = Pull {
                contended,
                ..pull_at(since, 1)
            };
            s.book(1, pull, since + Duration::from_millis(ms));
        };
        book(10, false);
        book(10, false);
        book(30, true);
        assert_eq!(wall(), Some(0.01), "a slow contended pull is left out");
        book(5, true);
        assert!(wall().is_some_and(|w| w < 0.01), "a fast one lowers it");
    }

    /// Probes count per engine and class: after [`model::PROBES`] probes of the small
    /// class (probed first), the module takes its jobs as `pull` would, nobody knowing
    /// them.
    #[test]
    fn an_engine_stops_probing_a_class_after_its_probes() {
        let (engines, lanes) = cpu_and_kernel();
        // Class 0 large, class 1 small.
        let jobs = cbc_jobs((0..40).map(|i| if i < 20 { 65536 } else { 64 }));
        let s = schedule(&Adaptive::new(), &jobs, &engines, &lanes, 2);
        s.idle[0].store(1, Ordering::Release);
        let mut state = LaneState::default();
        let mut out = Vec::new();
        let decisions: Vec<_> = (0..=model::PROBES)
            .map(|_| s.choose(1, 1, &mut out, &mut state))
            .collect();
        let mut expected = vec![Some((1, Some(Decision::Probe(1)))); model::PROBES];
        expected.push(Some((1, Some(Decision::Take(1)))));
        assert_eq!(decisions, expected);
        assert_eq!(
            (s.probes(1, 1), s.probes(0, 1), s.probes(1, 0)),
            (model::PROBES, 0, 0)
        );
    }

    /// A declined engine re-measures a class it never measured alone in its first batch,
    /// then once in [`model::REMEASURE_EVERY`] batches, [`model::CHECK_PULLS`] pulls a
    /// batch: on one core the cpu, declined on the module's large jobs, takes them.
    #[test]
    fn a_declined_engine_remeasures_once_every_few_batches() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([65536; 2000]);
        let policy = seeded();
        let remeasures = |s: &AdaptiveSchedule| {
            // The module's lane waits (a lane that must not re-measure would not wait).
            s.idle[1].store(1, Ordering::Release);
            let mut out = Vec::new();
            let mut state = LaneState::default();
            for _ in 0..model::CHECK_PULLS {
                let since = Instant::now();
                assert_eq!(
                    s.choose(0, 1, &mut out, &mut state),
                    Some((0, Some(Decision::Remeasure(0))))
                );
                // At the stored cost: nothing to correct.
                let stored = 1e-6 + 10e-9 * 65536.0;
                let pull = Pull {
                    check: true,
                    ..pull_at(since, 1)
                };
                s.book(0, pull, since + Duration::from_secs_f64(stored));
                s.starts[0].fetch_add(1, Ordering::Relaxed);
            }
            assert_eq!(out, [0, 1]);
            assert!(!s.may_remeasure(0, 0), "CHECK_PULLS a batch");
        };
        let first = schedule(&policy, &jobs, &engines, &lanes, 1);
        assert!(first.may_remeasure(0, 0), "never measured alone");
        remeasures(&first);
        drop(first);
        for _ in 0..model::REMEASURE_EVERY {
            let s = schedule(&policy, &jobs, &engines, &lanes, 1);
            assert!(
                !s.may_remeasure(0, 0),
                "measured alone, and at its estimate"
            );
        }
        let s = schedule(&policy, &jobs, &engines, &lanes, 1);
        assert!(s.may_remeasure(0, 0));
        remeasures(&s);
    }

    /// What the next batches compare an estimate with is its value right after the
    /// measurement alone, not at the batch's end: pulls beside the other engine's lanes
    /// that raised it past [`model::FAST_DOWN`] times that make the check due again in
    /// the next batch.
    #[test]
    fn an_estimate_raised_after_its_check_is_checked_again_next_batch() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([65536; 2000]);
        let policy = seeded();
        let stored = 1e-6 + 10e-9 * 65536.0;
        let first = schedule(&policy, &jobs, &engines, &lanes, 1);
        first.idle[1].store(1, Ordering::Release);
        let (mut out, mut state) = (Vec::new(), LaneState::default());
        let book = |s: &AdaptiveSchedule, wall: f64, check: bool| {
            let since = Instant::now();
            let pull = Pull {
                check,
                ..pull_at(since, 1)
            };
            s.book(0, pull, since + Duration::from_secs_f64(wall));
            s.starts[0].fetch_add(1, Ordering::Relaxed);
        };
        for _ in 0..model::CHECK_PULLS {
            assert_eq!(
                first.choose(0, 1, &mut out, &mut state),
                Some((0, Some(Decision::Remeasure(0))))
            );
            book(&first, stored, true);
        }
        // Then three pulls beside the module at four times that.
        for _ in 0..3 {
            book(&first, 4.0 * stored, false);
        }
        let raised = first.estimates[first.slot(0, 0)].cost().map(|c| c.wall);
        assert!(
            raised.is_some_and(|w| w > model::FAST_DOWN * stored),
            "{raised:?}"
        );
        drop(first);
        let next = schedule(&policy, &jobs, &engines, &lanes, 1);
        assert!(next.may_remeasure(0, 0), "grown since its check");
    }

    /// A policy seeded with a store of a cpu at `cpu` seconds a job and a module at
    /// `module`, whatever the size (AES-128-CBC encryption).
    fn flat_store(cpu: f64, module: f64) -> Adaptive {
        use crate::calibration::tests::{class, cpu_and_module};
        let (c, d) = (Cipher::AES_128_CBC, Direction::Encrypt);
        let mut cal = cpu_and_module();
        cal.engines[0].classes[0] = class(c, d, cpu, 0.0, 1.0);
        cal.engines[1].classes[0] = class(c, d, module, 0.0, 1.0);
        Adaptive::seeded(Arc::new(cal))
    }

    /// One batch of `jobs` on one core and a fake clock, a lane per engine, as the
    /// dispatcher runs it: the engines the schedule needs start, each job of engine `e`
    /// takes `truth[e]` seconds, the lane free soonest asks next and books its last pull
    /// then, and a lane the rule makes wait asks again when the other's job ends. The
    /// jobs each engine ran.
    fn fake_batch(policy: &Adaptive, jobs: &[JobMeta], truth: [f64; 2]) -> [usize; 2] {
        let (engines, lanes) = cpu_and_kernel();
        let mut s = schedule(policy, jobs, &engines, &lanes, 1);
        s.leave_out_idle_engines();
        let origin = Instant::now();
        let at = |t: f64| origin + Duration::from_secs_f64(t);
        let mut free = [0.0f64, 0.0];
        let mut pulls: [Option<Pull>; 2] = [None, None];
        let (mut done, mut ran, mut stalls) = ([false, false], [0, 0], 0);
        let (mut state, mut waiting) = ([LaneState::default(), LaneState::default()], [false; 2]);
        while let Some(e) = (0..2)
            .filter(|&e| !done[e])
            .min_by(|&a, &b| free[a].total_cmp(&free[b]))
        {
            if let Some(pull) = pulls[e].take() {
                s.book(e, pull, at(free[e]));
            }
            match decide(&s, e) {
                Decision::Done => done[e] = true,
                Decision::Wait => {
                    waiting[e] = true;
                    // Until the other lane's job ends, or it has asked.
                    stalls += 1;
                    assert!(stalls < 4, "both lanes wait: {ran:?}");
                    free[e] = free[1 - e].max(free[e]) + 1e-9;
                    state[e].warm = false;
                }
                _ => {
                    let mut out = Vec::new();
                    let (q, decision) = s.choose(e, 1, &mut out, &mut state[e]).expect("a job");
                    s.starts[e].fetch_add(1, Ordering::Relaxed);
                    pulls[e] = Some(Pull {
                        key: s.classes[q].key,
                        jobs: 1,
                        since: at(free[e]),
                        full: true,
                        check: matches!(decision, Some(Decision::Remeasure(_))),
                        cold: !std::mem::replace(&mut state[e].warm, true),
                        contended: !s.host_cpu[e]
                            && s.steal() > 0.0
                            && !(done[1 - e] || waiting[1 - e]),
                    });
                    waiting[e] = false;
                    free[e] += truth[e];
                    ran[e] += 1;
                    stalls = 0;
                }
            }
        }
        ran
    }

    /// A store wrong on one class (it puts the module at 2 ms a 256-byte job, where it
    /// takes 0.3 ms and the cpu 1 ms, as `calibrate` did in a loaded boot): the module,
    /// which the store declines, measures the class alone as the first batch starts, the
    /// cpu's lane waiting, and takes the rest of that batch and of every later one.
    #[test]
    fn a_wrong_store_is_corrected_within_the_first_batch() {
        let policy = flat_store(1e-3, 2e-3);
        let jobs = cbc_jobs([256; 2_000]);
        let truth = [1e-3, 0.3e-3];
        let first = fake_batch(&policy, &jobs, truth);
        assert!(first[1] >= 1_995, "the module took over: {first:?}");
        // The cpu, declined now, checks its stored cost once too; then the module alone.
        let checks = model::CHECK_PULLS as usize;
        assert_eq!(fake_batch(&policy, &jobs, truth), [checks, 2_000 - checks]);
        assert_eq!(fake_batch(&policy, &jobs, truth), [0, 2_000]);
        // In a batch of 400 the module is still checked (the cpu's 400 ms of work leave
        // room for 100 times its 2-ms pull and the 1-ms lane start), but the cpu is not:
        // the module's 120 ms are under 100 times its 1-ms pull and lane start.
        let policy = flat_store(1e-3, 2e-3);
        let jobs = cbc_jobs([256; 400]);
        let first = fake_batch(&policy, &jobs, truth);
        assert!(first[1] >= 395, "the module took over: {first:?}");
        assert_eq!(fake_batch(&policy, &jobs, truth), [0, 400]);
        // The old rule (no check before REMEASURE_EVERY batches) ran the cpu alone.
        let (engines, lanes) = cpu_and_kernel();
        let mut s = schedule(&flat_store(1e-3, 2e-3), &jobs, &engines, &lanes, 1);
        s.remeasure_due.fill(false);
        s.leave_out_idle_engines();
        assert_eq!(s.engines_needed(), EngineMask(1));
    }

    /// While an engine re-measures a class alone, the other engines' lanes are held
    /// (they wait) and the checker's are not; not while the batch is being planned, and
    /// no longer once the checker has no lanes (it failed).
    #[test]
    fn a_check_holds_the_other_engines_lanes_while_the_checker_has_lanes() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([256; 400]);
        let mut s = schedule(&flat_store(1e-3, 2e-3), &jobs, &engines, &lanes, 1);
        assert!(!s.held(0) && !s.held(1), "planning");
        s.leave_out_idle_engines();
        assert_eq!(s.checker.load(Ordering::Relaxed), 2, "the module checks");
        assert!(s.held(0) && !s.held(1));
        assert_eq!(decide(&s, 0), Decision::Wait);
        s.engine_failed(1);
        assert!(!s.held(0), "the checker failed");
    }

    /// Starting an engine's lanes costs [`LANE_START`] while the batch is planned, and
    /// during it for an engine left out (its lanes not started), nothing for one whose
    /// lanes run.
    #[test]
    fn only_lanes_not_started_cost_a_start() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([256; 400]);
        let mut s = schedule(&flat_store(0.5e-3, 1e-3), &jobs, &engines, &lanes, 1);
        s.remeasure_due.fill(false);
        let start = LANE_START.as_secs_f64();
        assert_eq!(
            (s.start_cost(0), s.start_cost(1)),
            (start, start),
            "planning"
        );
        s.leave_out_idle_engines();
        assert_eq!(s.engines_needed(), EngineMask(1));
        assert_eq!((s.start_cost(0), s.start_cost(1)), (0.0, start));
    }

    /// A right store (the cpu 0.5 ms a job, the module 1 ms) is not spoiled by the
    /// check: the module measures the class alone once, [`model::CHECK_PULLS`] jobs,
    /// then the cpu runs every other job, and the next batches run the cpu alone (the
    /// module's lane not started) until the periodic re-measurement.
    #[test]
    fn a_right_store_is_checked_once_and_kept() {
        let policy = flat_store(0.5e-3, 1e-3);
        let jobs = cbc_jobs([256; 400]);
        let truth = [0.5e-3, 1e-3];
        let checks = model::CHECK_PULLS as usize;
        assert_eq!(fake_batch(&policy, &jobs, truth), [400 - checks, checks]);
        for _ in 0..model::REMEASURE_EVERY {
            assert_eq!(fake_batch(&policy, &jobs, truth), [400, 0]);
        }
        assert_eq!(fake_batch(&policy, &jobs, truth), [400 - checks, checks]);
    }

    /// A lane the rule makes wait while every other lane waits too takes a job anyway,
    /// of a class its engine may run, having announced once that it started waiting.
    #[test]
    fn a_lane_that_would_wait_with_everyone_else_waiting_takes_a_job_of_its_own() {
        let (engines, lanes) = cpu_and_kernel();
        // On one core the cpu is declined on large jobs; jobs 0-9 only the module may run.
        let mut jobs = jobs_for(0b10, [65536; 10]);
        jobs.extend(cbc_jobs([65536; 10]));
        let s = Arc::new(schedule(&seeded(), &jobs, &engines, &lanes, 1));
        s.idle[1].store(1, Ordering::Release);
        let dynamic: Arc<dyn Schedule> = s.clone();
        assert_eq!(first_pick(&dynamic, 0), Some(10));
        assert_eq!(s.epoch.load(Ordering::Acquire), 1, "announced once");
    }

    /// A lane that waits counts itself in and out of the waiters, and an engine failing
    /// wakes it to take the jobs that engine left.
    #[test]
    fn a_waiting_lane_is_woken_by_a_failure_and_leaves_the_waiter_count() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([65536; 10]);
        let s = Arc::new(schedule(&seeded(), &jobs, &engines, &lanes, 1));
        let lane = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                let mut out = Vec::new();
                s.next(0, 1, &mut out);
                out
            })
        };
        // Until the cpu's lane waits (or returns without waiting, which it must not).
        let waited = loop {
            if *lock(&s.wait) > 0 {
                break true;
            }
            if lane.is_finished() {
                break false;
            }
            std::thread::yield_now();
        };
        assert!(waited, "the cpu's lane waits for the module");
        assert_eq!(s.engine_failed(1), Vec::<usize>::new());
        assert_eq!(lane.join().expect("the lane returns"), [0]);
        assert_eq!(*lock(&s.wait), 0);
    }

    /// In a sole batch the lane takes each class in turn without deciding, and its
    /// open segment counts the jobs it took, not what the caller's vector held.
    #[test]
    fn a_sole_engine_takes_every_class_in_turn() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([64, 64, 65536, 65536, 65536]);
        let mut s = schedule(&Adaptive::new(), &jobs, &engines[..1], &lanes[..1], 1);
        s.leave_out_idle_engines();
        assert_eq!(s.sole, Some(0));
        let mut out = vec![usize::MAX];
        assert!(s.next(0, 2, &mut out));
        let run = &s.runs[0];
        let segment = || {
            (
                run.pulls.load(Ordering::Relaxed),
                run.jobs.load(Ordering::Relaxed),
                run.partial.load(Ordering::Relaxed),
            )
        };
        assert_eq!(segment(), (1, 2, false));
        // The large class: a full pull, then the last job alone, a partial segment.
        assert!(s.next(0, 2, &mut out));
        assert_eq!(segment(), (1, 2, false));
        assert!(s.next(0, 2, &mut out));
        assert_eq!(segment(), (1, 1, true));
        let mut pulls = 3;
        while s.next(0, 2, &mut out) {
            pulls += 1;
            assert!(pulls <= jobs.len(), "a pull that took nothing: {out:?}");
        }
        assert_eq!(out, [usize::MAX, 0, 1, 2, 3, 4]);
        assert_eq!(segment(), (0, 0, false), "the last call closed the segment");
        // Segments: the small class's pull; the large class's full pull; its last,
        // partial pull alone (booked too, as the estimate had no cost yet).
        let samples: Vec<u32> = (0..2)
            .map(|k| s.estimates[s.slot(0, k)].get().samples())
            .collect();
        assert_eq!(samples, [1, 2]);
        assert_eq!(s.starts[0].load(Ordering::Relaxed), 3);
    }

    /// A sole lane's pulls are booked in segments: one sample per [`SOLE_SEGMENT`]
    /// pulls of a class, one for what is left of a class when the lane moves on, and
    /// one for the last pulls when the batch is over; every segment counts as a start.
    #[test]
    fn a_sole_lane_books_one_sample_per_segment() {
        let (engines, lanes) = cpu_and_kernel();
        let segment = SOLE_SEGMENT as usize;
        // Two classes: 2.5 segments of small jobs, then 3 large ones.
        let small = 2 * segment + segment / 2;
        let jobs = cbc_jobs((0..small + 3).map(|i| if i < small { 64 } else { 65536 }));
        let mut s = schedule(&Adaptive::new(), &jobs, &engines[..1], &lanes[..1], 1);
        s.leave_out_idle_engines();
        let mut out = Vec::new();
        let mut samples = Vec::new();
        while s.next(0, 1, &mut out) {
            samples.push(
                (0..2)
                    .map(|k| s.estimates[s.slot(0, k)].get().samples())
                    .collect::<Vec<_>>(),
            );
        }
        assert_eq!(out.len(), jobs.len());
        // Booked when the next segment's first pull is asked for: after pulls 32, 64.
        assert_eq!(samples[segment - 1], [0, 0]);
        assert_eq!(samples[segment], [1, 0]);
        assert_eq!(samples[2 * segment], [2, 0]);
        // The small class's last half segment, when the lane moves to the large class.
        assert_eq!(samples[small], [3, 0]);
        let last = (0..2)
            .map(|k| s.estimates[s.slot(0, k)].get().samples())
            .collect::<Vec<_>>();
        assert_eq!(
            last,
            [3, 1],
            "the batch's last segment is booked at its end"
        );
        assert_eq!(s.starts[0].load(Ordering::Relaxed), 4);
    }

    /// A segment runs from its first pull's start to the call after its last pull:
    /// the lane's time between its calls is booked, at least what it slept.
    #[test]
    fn a_segment_is_timed_from_its_first_pull() {
        let (engines, lanes) = cpu_and_kernel();
        let segment = SOLE_SEGMENT as usize;
        let jobs = cbc_jobs(vec![64; segment + segment / 2]);
        let mut s = schedule(&Adaptive::new(), &jobs, &engines[..1], &lanes[..1], 1);
        s.leave_out_idle_engines();
        let pause = Duration::from_micros(200);
        let mut out = Vec::new();
        assert!(s.next(0, 1, &mut out));
        let since = s.runs[0].since.load(Ordering::Relaxed);
        std::thread::sleep(pause);
        assert!(s.next(0, 1, &mut out));
        assert_eq!(s.runs[0].since.load(Ordering::Relaxed), since);
        loop {
            std::thread::sleep(pause);
            if !s.next(0, 1, &mut out) {
                break;
            }
        }
        assert_eq!(out.len(), jobs.len());
        let wall = s.estimates[s.slot(0, 0)].cost().map(|c| c.wall);
        assert!(
            wall.is_some_and(|w| w >= pause.as_secs_f64()),
            "{wall:?} a job, sleeping {pause:?} a pull"
        );
    }

    /// A segment is one sample of its wall time over its jobs; one with a pull that got
    /// fewer jobs than it asked for (a class's last) teaches only an estimate with no
    /// cost yet.
    #[test]
    fn a_segment_counts_its_wall_time_per_job_and_a_partial_one_only_starts_an_estimate() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([64; 100]);
        let mut s = schedule(&Adaptive::new(), &jobs, &engines[..1], &lanes[..1], 1);
        s.leave_out_idle_engines();
        let run = &s.runs[0];
        let ms = 1_000_000;
        let segment = |start: u64, pulls: u32, jobs: usize, partial: bool, end: u64| {
            run.class.store(0, Ordering::Relaxed);
            run.since.store(start, Ordering::Relaxed);
            run.pulls.store(pulls, Ordering::Relaxed);
            run.jobs.store(jobs, Ordering::Relaxed);
            run.partial.store(partial, Ordering::Relaxed);
            s.close_segment(0, 0, end);
        };
        let wall = || s.estimates[s.slot(0, 0)].cost().map(|c| c.wall);
        // Two segments of 4 jobs in 40 ms (the first is the warm-up): 10 ms a job.
        segment(10 * ms, 2, 4, false, 50 * ms);
        segment(50 * ms, 2, 4, false, 90 * ms);
        assert!(
            wall().is_some_and(|w| (w - 0.01).abs() < 1e-12),
            "{:?}",
            wall()
        );
        // A partial segment does not move a usable estimate; a full one does.
        segment(90 * ms, 2, 4, true, 190 * ms);
        assert!(
            wall().is_some_and(|w| (w - 0.01).abs() < 1e-12),
            "{:?}",
            wall()
        );
        segment(190 * ms, 2, 4, false, 290 * ms);
        assert!(wall().is_some_and(|w| w > 0.01), "{:?}", wall());
        // No segment open: nothing booked.
        let samples = s.estimates[s.slot(0, 0)].get().samples();
        segment(0, 0, 4, false, 290 * ms);
        assert_eq!(s.estimates[s.slot(0, 0)].get().samples(), samples);
    }

    /// A lane's timed pull records how many jobs it took and whether it got all it
    /// asked for, whatever the caller's vector held; a full pull teaches even a
    /// settled estimate.
    #[test]
    fn a_timed_pull_records_its_own_jobs() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([64; 10]);
        let s = schedule(&seeded(), &jobs, &engines, &lanes, 2);
        s.idle[1].store(1, Ordering::Release);
        let mut out = vec![usize::MAX];
        assert!(s.next(0, 2, &mut out));
        assert_eq!(out, [usize::MAX, 0, 1]);
        let pull = lock(&s.lanes[0]).pull.map(|p| (p.jobs, p.full));
        assert_eq!(pull, Some((2, true)));
        let samples = || s.estimates[s.slot(0, 0)].get().samples();
        assert_eq!(samples(), model::WINDOW);
        assert!(s.next(0, 2, &mut out));
        assert_eq!(samples(), model::WINDOW + 1, "the full pull was booked");
    }

    /// On a streak one pull in [`STREAK_SAMPLE`] is timed (besides the one that
    /// decided).
    #[test]
    fn a_streak_times_one_pull_in_streak_sample() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([64; 100]);
        let s = schedule(&seeded(), &jobs, &engines, &lanes, 2);
        s.idle[1].store(1, Ordering::Release);
        let mut out = Vec::new();
        let streak = 2 * STREAK_SAMPLE as usize;
        for _ in 0..=streak {
            assert!(s.next(0, 1, &mut out));
        }
        assert_eq!(out.len(), streak + 1);
        assert_eq!(s.starts[0].load(Ordering::Acquire), 3);
    }

    /// The share of a module lane's CPU time taken from the CPU lanes: none with a
    /// core per lane, all of it with one core for both, half of the one lane too many
    /// for each of two module lanes.
    #[test]
    fn steal_is_the_module_lanes_share_of_the_lanes_beyond_the_cores() {
        let jobs = cbc_jobs([64; 10]);
        let steal = |(engines, lanes): (Vec<EngineMeta>, Vec<LaneMeta>), cores| {
            schedule(&Adaptive::new(), &jobs, &engines, &lanes, cores).steal()
        };
        assert_eq!(steal(cpu_and_kernel(), 2), 0.0);
        assert_eq!(steal(cpu_and_kernel(), 1), 1.0);
        assert_eq!(steal(cpu_and_kernel_lanes(1, 2), 2), 0.5);
    }

    /// Classes as the rule sees them: bucket, longest job, and an engine's estimate
    /// for the next smaller bucket of the same cipher and direction.
    #[test]
    fn classes_report_their_bucket_longest_job_and_smaller_estimate() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([100, 120, 64, 65536]);
        let s = schedule(&seeded(), &jobs, &engines, &lanes, 2);
        assert_eq!(s.classes(), 2);
        assert_eq!((s.bucket(0), s.max_len(0)), (model::bucket(64), 120));
        assert_eq!((s.bucket(1), s.max_len(1)), (model::bucket(65536), 65536));
        let small = s.cost(1, 0).expect("seeded");
        assert_eq!(s.smaller_known(1, 1), Some((model::bucket(64), small)));
        assert_eq!(s.smaller_known(1, 0), None);
    }

    /// When an engine fails, the jobs only it could run come back for re-dispatch;
    /// those another working engine can run stay.
    #[test]
    fn a_failed_engine_hands_back_the_jobs_only_it_could_run() {
        let (engines, lanes) = cpu_and_kernel();
        let mut jobs = jobs_for(0b10, [64; 3]);
        jobs.extend(cbc_jobs([64; 3]));
        let s = schedule(&Adaptive::new(), &jobs, &engines, &lanes, 2);
        let mut back = s.engine_failed(1);
        back.sort_unstable();
        assert_eq!(back, [0, 1, 2]);
        assert_eq!(s.remaining(1), 3);
    }

    /// A batch keeps for the next what its lanes measured: the classes an engine
    /// sampled, for the engines that ran.
    #[test]
    fn a_batch_keeps_only_what_its_lanes_measured() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs((0..40).map(|i| if i < 20 { 64 } else { 65536 }));
        let policy = Adaptive::new();
        let s = schedule(&policy, &jobs, &engines, &lanes, 2);
        s.idle[1].store(1, Ordering::Release);
        // The cpu probes the small class twice; the second call books the first probe.
        let mut out = Vec::new();
        assert!(s.next(0, 1, &mut out) && s.next(0, 1, &mut out));
        drop(s);
        let learned: Vec<_> = policy
            .learned()
            .into_iter()
            .map(|l| (l.engine, l.min_len, l.samples))
            .collect();
        assert_eq!(learned, [("cpu".to_string(), 64, 1)]);
    }

    /// With both engines needed neither runs the batch alone: the cpu decides its first
    /// job (a small one) instead of taking the classes in order (the large first here).
    #[test]
    fn with_both_engines_needed_no_lane_takes_the_classes_in_order() {
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs((0..100).map(|i| if i < 50 { 65536 } else { 64 }));
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let s: Arc<dyn Schedule> = Arc::from(seeded().plan(&plan).expect("plans"));
        assert_eq!(s.engines_needed(), EngineMask(0b11));
        let cpu = first_pick(&s, 0).expect("the cpu takes a job at once");
        assert!(cpu >= 50, "the cpu's first job is a small one: {cpu}");
    }
}
