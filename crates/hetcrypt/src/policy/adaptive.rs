//! `adaptive`: ours — learns what each engine costs per class of job while it runs and
//! places every job to finish the batch soonest, never behind the best single engine.
//!
//! The jobs of a batch are sorted into classes (engines that can run them, cipher,
//! direction, log2 size bucket), each a lock-free list. A free lane asks the placement
//! rule of [`model`] which class to take from, using the estimates its engine and the
//! others have built from timing every pull. The estimates live in the [`Adaptive`]
//! value, shared by all its schedules, so a second batch starts from what the first one
//! learned.
//!
//! **Timing.** The schedule times the pulls itself instead of asking the dispatcher
//! ([`Schedule::wants_timing`] is false): a lane calls [`Schedule::next`] on its own
//! thread when it has finished its previous jobs, so the time from one `next` returning
//! to the lane's following call is what those jobs cost the lane (dispatch overhead
//! included). That lets the cost of the clocks differ per lane: a software lane keeps
//! its core busy for the whole job, so its CPU time is taken to be its wall time and
//! only the cheap monotonic clock is read; a module lane also reads its thread's CPU
//! clock, but only until the CPU lanes have measured how much module jobs slow them
//! (the cost rule's stand-in needs it until then). On our host that clock is a real
//! system call (0.85-2 µs per read, measured), as much as a whole small job on AES-NI:
//! with `wants_timing`, `pull` ran 4,000 16-byte jobs ~1.7x slower in a same-run
//! comparison. (A pull that ran re-dispatched jobs between two `next` calls is booked
//! to the class the lane last took; that happens only after an engine failed.)
//!
//! A lane whose engine should not take any of the remaining work (a slow engine at the
//! end of the batch, an engine whose jobs would cost the others more than they save)
//! waits inside [`Schedule::next`]; it is woken when a class runs out, an estimate
//! becomes usable, an engine fails or another lane starts waiting (so stale decisions
//! are re-taken together), and re-checks every [`WAIT_RECHECK`] regardless. An engine
//! that the rule, asked before the batch starts, gives nothing at all is left out of the
//! batch: its lanes are not even started (see [`Schedule::engines_needed`]).
//!
//! **Solo probes and streaks.** An engine's probes of a class run *alone*, its first
//! ones and its re-measurements of a class it declines: the probing lane holds the
//! schedule's solo, and the other engines start no pull until its probes are booked,
//! so every engine has an undisturbed cost to be compared by (beside a busy CPU lane on
//! one core, a module request took 2-3x its own time, and a module judged by that never
//! got the jobs it was best at), and one whose undisturbed cost came out inflated is
//! corrected by its next re-measurement. A lane's first pulls after a wait are cold (a
//! module's first requests after a pause are slower than the ones that follow): they
//! teach its engine's running cost but not its undisturbed one, and a probe keeps the
//! solo, pulling back to back, until it has warm samples (see
//! [`model::WARM_UP_PULLS`]). While every lane of the
//! other engines waits, a lane keeps taking from the class it last chose without
//! deciding again until some event bumps the schedule's epoch.
//!
//! **Sole batches.** When the plan leaves every engine but one out, nothing is left to
//! place: that engine's lanes take each class in turn with one atomic add per pull, and
//! time their run of pulls from one class in a few spans, booked as samples when the
//! run ends, so a batch the rule gives to the CPU costs about what `only:cpu` does.
//!
//! **Measured mixes.** Every timed pull also adds its jobs and lane time to a tally per
//! engine and class for the batch, overlapped or alone; when the batch ends, the tallies
//! give each engine's measured gain from running a class beside the others
//! ([`model::measured_gain`]), kept with the estimates for the next batches.

pub mod model;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use self::model::{
    decide, measured_gain, Cost, Decision, Estimate, Gain, Interference, SharedEstimate,
    SharedTally, Tally, View,
};
use super::queue::{live_engines, JobList, ListBuilder};
use super::{EngineMask, JobMeta, Plan, Policy, Schedule};
use crate::calibration::Calibration;
use crate::cipher::{Cipher, Direction};
use crate::error::Result;

/// How long a waiting lane sleeps before re-deciding even if nobody woke it: a safety
/// net for estimates that drift while it waits (the events that can change its mind
/// wake it anyway). Long, because on a one-core board every wake-up takes the core from
/// the lanes doing the work.
pub const WAIT_RECHECK: Duration = Duration::from_millis(50);

/// On a streak, one pull in this many is timed and booked: the engine's estimate still
/// follows load changes, and the other pulls skip two clock reads and ~50
/// floating-point operations (a few microseconds per pull under the testbed's
/// emulation, where batches of tiny jobs lost 10-15% to them). Every pull is still
/// counted busy, so a probe meant to run alone never overlaps one unseen.
const STREAK_SAMPLE: u32 = 8;

/// No lane holds the solo.
const NO_SOLO: usize = usize::MAX;

/// A lane of a sole batch has no run in progress.
const NO_RUN: usize = usize::MAX;

/// About how many samples a lane's run of pulls in a sole batch is booked as (spans of
/// at least [`STREAK_SAMPLE`] pulls): enough for an estimate's moving average
/// ([`model::WINDOW`]) to follow the run, few enough that booking them stays a small
/// part of a batch of tiny jobs. Spans of 8 pulls, 50 samples for a run of 400, cost
/// ~0.08 ms of lane CPU time per batch under the testbed's emulation (2 ms batches).
const SOLE_SAMPLES: usize = 8;

/// What the model is keyed by across batches: the engine (its position in
/// [`Knowledge::engines`]), cipher, direction, size bucket.
type ModelKey = (usize, Cipher, Direction, usize);

/// What is kept per engine and class across batches.
#[derive(Clone, Copy, Debug, Default)]
struct Learned {
    /// Every pull.
    all: Estimate,
    /// Pulls that no other engine's job overlapped.
    alone: Estimate,
    /// Overlapped pulls' wall time over the alone one.
    ratio: Estimate,
    /// What the engine's running the class beside the others gained, measured per batch.
    gain: Gain,
}

/// What an [`Adaptive`] value and its schedules learn: per engine and class, and per
/// engine how much its lanes slow down beside other engines' jobs.
#[derive(Debug, Default)]
struct Knowledge {
    /// The engines measured so far, in the order first seen. The model is keyed by
    /// position here, so a batch finds its estimates without building owned keys.
    engines: Vec<KnownEngine>,
    costs: HashMap<ModelKey, Learned>,
    /// The calibration store's costs, for classes not learned yet.
    seed: Option<Arc<Calibration>>,
}

/// An engine the model has seen: name and lane count (a lane's cost depends on how many
/// lanes share the host), how much its lanes slow down beside other engines' jobs, its
/// re-measurement credit (seconds of batches since it last re-measured a class it
/// declines; see [`model::REPROBE_RATIO`]) and its check credit (the same since it last
/// checked a mix it is declined on; see [`model::CHECK_RATIO`]).
#[derive(Debug)]
struct KnownEngine {
    name: String,
    lanes: usize,
    interference: Estimate,
    credit: f64,
    check_credit: f64,
}

impl Knowledge {
    /// What is known of engine `id` (a position in `engines`) on a class: what was
    /// learned, else the calibration store's cost at the bucket's smallest size
    /// (the usual size of benchmark files), taken as every pull and as the engine
    /// alone, with the gain the store measured running it beside the other engine,
    /// all kept from then on to be learned on like any estimate; else nothing.
    fn learned(&mut self, id: usize, cipher: Cipher, direction: Direction, b: usize) -> Learned {
        if let Some(l) = self.costs.get(&(id, cipher, direction, b)) {
            return *l;
        }
        let Some(class) = self
            .seed
            .as_ref()
            .and_then(|cal| cal.class(&self.engines[id].name, cipher, direction))
        else {
            return Learned::default();
        };
        let len = model::bucket_floor(b);
        let cost = Estimate::seeded(class.seconds(len), class.cpu_seconds(len));
        let gain = self
            .seed
            .as_ref()
            .and_then(|cal| cal.mix_gain(&self.engines[id].name, cipher, direction, len))
            .map_or_else(Gain::default, Gain::seeded);
        let seeded = Learned {
            all: cost,
            alone: cost,
            gain,
            ..Learned::default()
        };
        self.costs.insert((id, cipher, direction, b), seeded);
        seeded
    }

    /// The position of engine `name` with `lanes` lanes in `engines`, added if new.
    fn engine(&mut self, name: &str, lanes: usize) -> usize {
        match self
            .engines
            .iter()
            .position(|e| e.name == name && e.lanes == lanes)
        {
            Some(id) => id,
            None => {
                self.engines.push(KnownEngine {
                    name: name.to_string(),
                    lanes,
                    interference: Estimate::default(),
                    credit: 0.0,
                    check_credit: 0.0,
                });
                self.engines.len() - 1
            }
        }
    }
}

/// The model shared by an [`Adaptive`] value and its schedules.
type Model = Arc<Mutex<Knowledge>>;

/// Locks a mutex, going on with the data if a lane panicked while holding it (estimates
/// and a unit guard stay usable).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

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
    /// Cost of one job on one lane, once enough samples came in.
    pub cost: Option<Cost>,
    /// The cost while no other engine's job ran beside it.
    pub alone: Option<Cost>,
    /// Samples seen.
    pub samples: u32,
    /// The fraction of a lane's time lost while another engine's job runs beside it,
    /// measured on this class, once usable (the cost rule trusts it alone from
    /// [`model::MIX_EVIDENCE`] samples).
    pub slowdown: Option<f64>,
    /// Samples of that slowdown.
    pub slowdown_samples: u32,
    /// The same fraction measured across all classes (the engine's, repeated on each of
    /// its classes): the stand-in for a class with too few samples of its own.
    pub slowdown_across: Option<f64>,
    /// The throughput the engine's running this class beside the others gave over theirs
    /// alone, averaged over the batches that measured it (less one standard error while
    /// it does not mix), once it decides (from [`model::GAIN_SAMPLES`] batches; see
    /// [`model::Gain::value`]).
    pub mix_gain: Option<f64>,
    /// Batches that measured that gain.
    pub mix_gain_samples: u32,
    /// The gain the last batch that measured one measured.
    pub mix_gain_last: Option<f64>,
}

impl Adaptive {
    /// A policy with nothing learned yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A policy that starts from the costs `calibration` stored for this machine, so it
    /// places jobs right from the first one, and goes on learning from every batch as
    /// [`Adaptive::new`] does (a class or engine the store lacks is measured as usual).
    /// Clones share one learned model.
    pub fn seeded(calibration: Arc<Calibration>) -> Self {
        let policy = Self::default();
        lock(&policy.learned).seed = Some(calibration);
        policy
    }

    /// What the policy has learned so far, sorted by engine, cipher, direction, size.
    pub fn learned(&self) -> Vec<LearnedCost> {
        let known = lock(&self.learned);
        let mut out: Vec<LearnedCost> = known
            .costs
            .iter()
            .map(|((engine, cipher, direction, b), e)| LearnedCost {
                engine: known.engines[*engine].name.clone(),
                lanes: known.engines[*engine].lanes,
                cipher: *cipher,
                direction: *direction,
                min_len: model::bucket_floor(*b),
                cost: e.all.cost(),
                alone: e.alone.cost(),
                samples: e.all.samples(),
                slowdown: e.ratio.cost().map(|c| model::lost_fraction(c.wall)),
                slowdown_samples: e.ratio.samples(),
                slowdown_across: known.engines[*engine]
                    .interference
                    .cost()
                    .map(|c| model::lost_fraction(c.wall)),
                mix_gain: e.gain.value(),
                mix_gain_samples: e.gain.samples(),
                mix_gain_last: e.gain.last(),
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
        let mut schedule = AdaptiveSchedule::new(plan, Arc::clone(&self.learned));
        schedule.leave_out_idle_engines();
        Ok(Box::new(schedule))
    }

    fn learned(&self) -> Option<Vec<LearnedCost>> {
        Some(Adaptive::learned(self))
    }
}

/// CPU time used so far by the calling thread (zero if the clock cannot be read; only
/// the cost rule's stand-in, before interference is measured, relies on it).
fn thread_cpu_time() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

/// A lane's pull in progress: what it took and when.
#[derive(Clone, Copy, Debug)]
struct Pull {
    /// Model key of the jobs taken.
    key: usize,
    /// The class they came from.
    class: usize,
    /// How many.
    jobs: usize,
    /// When `next` returned them.
    since: Instant,
    /// The lane thread's CPU clock then (module lanes only).
    cpu_since: Option<Duration>,
    /// Whether another engine was at work then (see [`AdaptiveSchedule::others`]), and
    /// how many other engines' pulls had started: a pull that no other engine's work
    /// overlapped at any moment is an "alone" sample.
    beside_others: bool,
    others_started: u64,
    /// Whether this was a solo probe: the lane holds the schedule's solo until booked.
    solo: bool,
    /// Whether it was one of the lane's first pulls after a wait (or its start): such
    /// a pull is not a sample of the engine undisturbed (see [`model::WARM_UP_PULLS`]).
    cold: bool,
    /// Whether the lane took as many jobs as it asked for: a batching engine's partial
    /// pull (the last jobs of a class) costs more per job than its usual one, so it
    /// only teaches an estimate that has nothing better yet.
    full: bool,
}

/// A lane's run of pulls from one class in a sole batch (one engine left, see
/// [`AdaptiveSchedule::sole`]): the class, and the jobs and pulls taken so far. Only the
/// lane's own thread touches it; atomics with plain loads and stores make it shareable
/// without a lock. (A lock, the busy counts and a streak check per pull cost ~1 us per
/// pull under the testbed's emulation: 0.35-0.4 ms of lane CPU time per batch of 400
/// pulls, a batch of 8-byte jobs running 0.88x `only:cpu`.) The run is timed in about
/// [`SOLE_SAMPLES`] spans, each booked as one sample when the run ends. (One sample per
/// run, counted as many, would let one host stall inside a run replace the estimate:
/// the outlier cap works per sample.)
#[derive(Debug)]
struct SoleRun {
    class: AtomicUsize,
    jobs: AtomicUsize,
    pulls: AtomicU32,
    /// Pulls per span.
    span: AtomicU32,
}

impl Default for SoleRun {
    fn default() -> Self {
        SoleRun {
            class: AtomicUsize::new(NO_RUN),
            jobs: AtomicUsize::new(0),
            pulls: AtomicU32::new(0),
            span: AtomicU32::new(STREAK_SAMPLE),
        }
    }
}

/// What one lane keeps between its calls to `next`.
#[derive(Debug, Default)]
struct LaneState {
    /// The pull in progress.
    pull: Option<Pull>,
    /// A class this lane may keep taking from without deciding again, and the wake-up
    /// epoch when that was decided: set while every lane of the other engines waits,
    /// so nothing but an event (which wakes them and bumps the epoch) can change the
    /// answer. Deciding costs ~100 floating-point operations per pull, a few
    /// microseconds under the testbed's emulation: 15% of a batch of 8-byte jobs.
    streak: Option<(u64, usize)>,
    /// Pulls taken on streaks so far; only every [`STREAK_SAMPLE`]th is timed.
    streak_pulls: u32,
    /// The pull in progress is an untimed streak pull, counted busy until the lane's
    /// next call.
    untimed: bool,
    /// Pulls the lane has taken since it last waited (or started): the first
    /// [`model::WARM_UP_PULLS`] of them are cold.
    warm: usize,
    /// In a sole batch, where the lane's run of pulls (its pull in progress) has been
    /// cut into spans so far: when, how many of the run's jobs were done by then, and
    /// the thread's CPU clock (module lanes).
    marks: Vec<(Instant, usize, Option<Duration>)>,
}

impl LaneState {
    /// Counts the pull the lane is taking; whether it is one of its cold ones.
    fn next_is_cold(&mut self) -> bool {
        let cold = self.warm < model::WARM_UP_PULLS;
        self.warm = self.warm.saturating_add(1);
        cold
    }
}

/// Decrements a per-engine count, saturating (a failed engine's counts were reset to
/// zero under its lanes); returns the value before.
fn count_down(count: &AtomicUsize) -> usize {
    count
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            Some(n.saturating_sub(1))
        })
        .unwrap_or(0)
}

/// An engine's credit of time for one kind of re-measurement in a batch (see
/// [`model::REPROBE_RATIO`] and [`model::CHECK_RATIO`]): the seconds its earlier
/// batches ran since it last spent it, and whether a lane spent it in this batch.
#[derive(Debug)]
struct Credit {
    carried: f64,
    spent: AtomicBool,
}

impl Credit {
    fn new(carried: f64) -> Self {
        Credit {
            carried,
            spent: AtomicBool::new(false),
        }
    }

    /// The credit a lane may spend now: none once spent in this batch.
    fn available(&self) -> f64 {
        if self.spent.load(Ordering::Relaxed) {
            0.0
        } else {
            self.carried
        }
    }

    fn spend(&self) {
        self.spent.store(true, Ordering::Relaxed);
    }

    /// What the next batch starts from, after this one ran `ran` seconds.
    fn carry(&mut self, ran: f64) -> f64 {
        if *self.spent.get_mut() {
            0.0
        } else {
            self.carried + ran
        }
    }
}

/// How the jobs of one pull were chosen.
#[derive(Clone, Copy, Debug, Default)]
struct Taken {
    /// The lane waited before taking them.
    waited: bool,
    /// They are a solo probe.
    solo: bool,
    /// They came from the lane's streak, without deciding.
    streak: bool,
}

/// Jobs that the same engines can run, of one cipher, direction and size bucket.
struct Class {
    engines: EngineMask,
    /// Index into the schedule's model keys.
    key: usize,
    bucket: usize,
    max_len: usize,
    jobs: JobList,
}

/// A class while the plan sorts jobs into it.
struct Gathered {
    engines: EngineMask,
    key: usize,
    bucket: usize,
    max_len: usize,
    jobs: ListBuilder,
}

/// One batch under `adaptive`.
struct AdaptiveSchedule {
    classes: Vec<Class>,
    /// (cipher, direction, bucket) per model key.
    keys: Vec<(Cipher, Direction, usize)>,
    /// Per model key: the keys of the same cipher and direction with smaller buckets,
    /// largest first.
    smaller: Vec<Vec<usize>>,
    /// Per engine and key (`engine * keys.len() + key`): every pull.
    estimates: Vec<SharedEstimate>,
    /// Per engine and key: the mix gains measured in earlier batches, and what this
    /// batch's pulls add up to (see [`model::measured_gain`]).
    gains: Vec<Gain>,
    tallies: Vec<SharedTally>,
    /// Per engine: what its lanes measure of other engines' jobs beside theirs.
    interference: Vec<Interference>,
    /// Per engine: lanes with a pull in progress, and pulls started so far.
    busy: Vec<AtomicUsize>,
    /// Per engine: the jobs its lanes last asked for in one pull (1 until asked).
    widths: Vec<AtomicUsize>,
    starts: Vec<AtomicU64>,
    /// Per engine and class: probes started while the engine had no estimate.
    probes: Vec<AtomicUsize>,
    /// Per engine and class: trial jobs started beside the class's best single engine
    /// before their slowdown was measured.
    trials: Vec<AtomicUsize>,
    /// Per engine and class: whether the one re-measurement of this batch is unused.
    reprobe: Vec<AtomicBool>,
    /// Per engine: its re-measurement credit (spent by re-measuring a class in this
    /// batch), and its credit for checks of a mix it is declined on.
    credit: Vec<Credit>,
    check_credit: Vec<Credit>,
    /// When the batch was planned: the batch's time adds to the credit of every
    /// engine that did not re-measure.
    planned: Instant,
    /// Per engine: its position in the model's [`Knowledge::engines`], whether it uses
    /// the host CPU, lanes still working.
    ids: Vec<usize>,
    host_cpu: Vec<bool>,
    alive: Vec<AtomicUsize>,
    cores: usize,
    engine_of: Vec<usize>,
    /// Per lane: its pull in progress and streak (only that lane's thread touches it).
    pulls: Vec<Mutex<LaneState>>,
    /// Per engine: lanes waiting in `next` or finished with the batch.
    idle: Vec<AtomicUsize>,
    /// Bumped by every wake-up event; a streak lasts while it is unchanged.
    epoch: AtomicU64,
    /// The engine whose lane is measuring a class alone ([`NO_SOLO`] if none): the
    /// other engines start no pull until it has booked its probe.
    solo: AtomicUsize,
    /// Per engine: its solo probes in progress; the solo ends with the holder's last.
    /// Per engine, not one count: a probe that started just as its engine's solo was
    /// released must not keep the next holder's count from reaching zero.
    solo_pulls: Vec<AtomicUsize>,
    learned: Model,
    /// Lanes waiting on `wake`: a wake-up with nobody waiting skips the system call
    /// (one per batch at least, tens of microseconds under emulation).
    wait: Mutex<usize>,
    wake: Condvar,
    /// The engines whose lanes this batch starts with (see
    /// [`AdaptiveSchedule::leave_out_idle_engines`]).
    needed: EngineMask,
    /// The one engine this batch runs, when the plan left every other out and it can
    /// run every class: nothing is left to place (no other engine to wait for, probe
    /// beside or end the batch sooner), so its lanes take jobs without deciding and
    /// time each run of pulls from one class in a few spans ([`SoleRun`]).
    sole: Option<usize>,
    /// Per lane, in a sole batch: its run in progress.
    runs: Vec<SoleRun>,
}

impl AdaptiveSchedule {
    fn new(plan: &Plan<'_>, learned: Model) -> Self {
        let live = live_engines(plan);
        // Classes and model keys are looked up by the packed code below.
        let mut class_index: HashMap<(EngineMask, u64), usize> = HashMap::new();
        let mut key_index: HashMap<u64, usize> = HashMap::new();
        let mut keys = Vec::new();
        let mut members: Vec<Gathered> = Vec::new();
        // Consecutive jobs are mostly of one class: the loop scans a run of jobs of one
        // class, then looks the class up (hashing) and adds the run whole. Hashing every
        // job cost ~900 instructions per job under callgrind, a third of a 16-byte job;
        // appending every job to its class's list still cost ~45.
        let jobs = plan.jobs;
        // Cipher, direction and size bucket compare as one word, equal exactly when all
        // three are: the derived comparison of the tuple, field by field, was most of
        // this loop's cost.
        let code = |job: &JobMeta| {
            (model::bucket(job.len) as u64) << 16
                | (job.cipher.key_size as u64) << 8
                | (job.cipher.mode as u64) << 4
                | job.direction as u64
        };
        let mut start = 0;
        while let Some(job) = jobs.get(start) {
            let engines = job.engines.intersect(live);
            if engines.is_empty() {
                start += 1;
                continue;
            }
            let this = code(job);
            let mut end = start + 1;
            let mut max_len = job.len;
            while let Some(next) = jobs.get(end) {
                if next.engines.intersect(live) != engines || code(next) != this {
                    break;
                }
                max_len = max_len.max(next.len);
                end += 1;
            }
            let b = model::bucket(job.len);
            let key = *key_index.entry(this).or_insert_with(|| {
                keys.push((job.cipher, job.direction, b));
                keys.len() - 1
            });
            let q = *class_index.entry((engines, this)).or_insert_with(|| {
                members.push(Gathered {
                    engines,
                    key,
                    bucket: b,
                    max_len: 0,
                    jobs: ListBuilder::default(),
                });
                members.len() - 1
            });
            let class = &mut members[q];
            class.max_len = class.max_len.max(max_len);
            class.jobs.extend(start..end);
            start = end;
        }
        // Within a class, jobs are taken in batch order.
        let classes: Vec<Class> = members
            .into_iter()
            .map(|g| Class {
                engines: g.engines,
                key: g.key,
                bucket: g.bucket,
                max_len: g.max_len,
                jobs: g.jobs.build(),
            })
            .collect();

        let n_engines = plan.engines.len();
        let mut lanes = vec![0usize; n_engines];
        for l in plan.lanes {
            lanes[l.engine] += 1;
        }
        let (ids, estimates, gains, interference, credits) = {
            let mut known = lock(&learned);
            let ids: Vec<usize> = plan
                .engines
                .iter()
                .map(|e| known.engine(&e.name, e.lanes))
                .collect();
            let mut estimates = Vec::with_capacity(ids.len() * keys.len());
            let mut gains = Vec::with_capacity(ids.len() * keys.len());
            let mut interference = Vec::with_capacity(ids.len());
            for &id in &ids {
                let stored: Vec<Learned> = keys
                    .iter()
                    .map(|&(c, d, b)| known.learned(id, c, d, b))
                    .collect();
                estimates.extend(stored.iter().map(|l| SharedEstimate::new(l.all)));
                gains.extend(stored.iter().map(|l| l.gain));
                interference.push(Interference::new(
                    stored.iter().map(|l| l.alone).collect(),
                    stored.iter().map(|l| l.ratio).collect(),
                    known.engines[id].interference,
                ));
            }
            let credits: Vec<(f64, f64)> = ids
                .iter()
                .map(|&id| (known.engines[id].credit, known.engines[id].check_credit))
                .collect();
            (ids, estimates, gains, interference, credits)
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
            trials: (0..per_engine_class).map(|_| AtomicUsize::new(0)).collect(),
            reprobe: (0..per_engine_class)
                .map(|_| AtomicBool::new(true))
                .collect(),
            credit: credits.iter().map(|c| Credit::new(c.0)).collect(),
            check_credit: credits.iter().map(|c| Credit::new(c.1)).collect(),
            tallies: (0..estimates.len())
                .map(|_| SharedTally::default())
                .collect(),
            gains,
            planned: Instant::now(),
            classes,
            keys,
            smaller,
            estimates,
            interference,
            busy: (0..n_engines).map(|_| AtomicUsize::new(0)).collect(),
            widths: (0..n_engines).map(|_| AtomicUsize::new(1)).collect(),
            starts: (0..n_engines).map(|_| AtomicU64::new(0)).collect(),
            ids,
            host_cpu: plan.engines.iter().map(|e| e.uses_host_cpu).collect(),
            alive: lanes.into_iter().map(AtomicUsize::new).collect(),
            cores: plan.cores.max(1),
            engine_of: plan.lanes.iter().map(|l| l.engine).collect(),
            pulls: plan
                .lanes
                .iter()
                .map(|_| Mutex::new(LaneState::default()))
                .collect(),
            idle: (0..n_engines).map(|_| AtomicUsize::new(0)).collect(),
            epoch: AtomicU64::new(0),
            solo: AtomicUsize::new(NO_SOLO),
            solo_pulls: (0..n_engines).map(|_| AtomicUsize::new(0)).collect(),
            learned,
            wait: Mutex::new(0),
            wake: Condvar::new(),
            needed: EngineMask(u64::MAX),
            sole: None,
            runs: plan.lanes.iter().map(|_| SoleRun::default()).collect(),
        }
    }

    /// Leaves out of the batch the engines that the placement rule, asked before any
    /// lane starts, gives nothing to do at all: no job, probe, trial or re-measurement
    /// (a module far too slow for a batch of tiny jobs). Their lanes would only wait,
    /// and under emulation starting and joining a waiting lane cost a third of such a
    /// batch. The schedule counts them as gone, so nobody waits for them; if an engine
    /// fails, the dispatcher starts them for its jobs anyway, which they take from the
    /// re-dispatch queue. The next batch asks again, so a change of load that makes an
    /// engine worth it (or its periodic re-measurement) brings it back.
    fn leave_out_idle_engines(&mut self) {
        let mut needed = EngineMask::default();
        for e in 0..self.alive.len() {
            if self.lanes(e) > 0 && !matches!(decide(self, e), Decision::Wait | Decision::Done) {
                needed.insert(e);
            }
        }
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
        if needed.count() == 1 {
            let e = needed.0.trailing_zeros() as usize;
            if self.classes.iter().all(|c| c.engines.contains(e)) {
                self.sole = Some(e);
            }
        }
    }

    /// Index of engine `engine` and model key `key` in the per engine and key vectors.
    fn slot(&self, engine: usize, key: usize) -> usize {
        engine * self.keys.len() + key
    }

    fn estimate(&self, engine: usize, key: usize) -> &SharedEstimate {
        &self.estimates[self.slot(engine, key)]
    }

    fn engine_class(&self, engine: usize, class: usize) -> usize {
        engine * self.classes.len() + class
    }

    /// Wakes every waiting lane without taking the wait lock (for callers that may
    /// hold it; a waiter that misses this wake-up re-checks within [`WAIT_RECHECK`]).
    fn notify_unlocked(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.wake.notify_all();
    }

    /// Wakes every waiting lane to decide again.
    fn notify(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        // Taking the lock orders this wake-up after any waiter's last check; a lane
        // that starts waiting later decides again under the lock first.
        let waiting = *lock(&self.wait);
        if waiting > 0 {
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

    fn samples(&self, e: usize, q: usize) -> u32 {
        self.estimate(e, self.classes[q].key).get().samples()
    }

    fn probes(&self, e: usize, q: usize) -> usize {
        self.probes[self.engine_class(e, q)].load(Ordering::Relaxed)
    }

    fn trials(&self, e: usize, q: usize) -> usize {
        self.trials[self.engine_class(e, q)].load(Ordering::Relaxed)
    }

    fn may_reprobe(&self, e: usize, q: usize) -> bool {
        self.reprobe[self.engine_class(e, q)].load(Ordering::Relaxed)
    }

    fn reprobe_credit(&self, e: usize) -> f64 {
        self.credit[e].available()
    }

    fn alone(&self, e: usize, q: usize) -> Option<Cost> {
        self.interference[e].alone(self.classes[q].key)
    }

    fn slowdown(&self, e: usize, q: usize) -> Option<f64> {
        self.interference[e].slowdown_in(self.classes[q].key)
    }

    fn slowdown_measured(&self, e: usize, q: usize) -> bool {
        self.interference[e].measured_in(self.classes[q].key)
    }

    fn gain(&self, e: usize, q: usize) -> Gain {
        self.gains[self.slot(e, self.classes[q].key)]
    }

    fn check_credit(&self, e: usize) -> f64 {
        self.check_credit[e].available()
    }

    fn alone_jobs(&self, e: usize, q: usize) -> u64 {
        self.tallies[self.slot(e, self.classes[q].key)].alone_jobs()
    }

    fn width(&self, e: usize) -> usize {
        self.widths[e].load(Ordering::Relaxed)
    }

    fn smaller_known(&self, e: usize, q: usize) -> Option<(usize, Cost)> {
        self.smaller[self.classes[q].key]
            .iter()
            .find_map(|&k| Some((self.keys[k].2, self.estimate(e, k).cost()?)))
    }
}

impl AdaptiveSchedule {
    /// Whether lanes of `engine` read their thread's CPU clock: only a module's, and
    /// only while the cost rule still relies on it (until some working CPU engine has
    /// measured how much other engines' jobs slow it).
    fn reads_cpu_clock(&self, engine: usize) -> bool {
        !self.host_cpu[engine]
            && (0..self.alive.len()).any(|e| {
                self.host_cpu[e] && self.lanes(e) > 0 && self.interference[e].slowdown().is_none()
            })
    }

    /// Whether another engine is at work beside a pull of `engine` now, and how many
    /// pulls the other engines have started. At work: a pull in progress, or, unless
    /// the pull is a solo probe's (the others are held then), a lane that is neither
    /// waiting nor done, i.e. between two pulls. A pull that merely fits between the
    /// others' pulls is not one alone: those gaps favour the shortest pulls, and booked
    /// as undisturbed samples they set the undisturbed cost low while the longest ones
    /// went to the overlapped side; every slowdown measured against the two came out
    /// high. (Two-vCPU testbed, 16 KiB: the module's undisturbed cost came out at
    /// 0.89-0.95 ms against 1.0-1.5 ms a job in its `only:` runs, its slowdown beside
    /// the CPU at 0.39-0.54 against ~0.31 under `pull`, and the CPU, worth 1.18x there,
    /// was judged not worth mixing in. Counted this way, the next run measured
    /// 0.99-1.09 ms and 0.33-0.37.)
    fn others(&self, engine: usize, solo: bool) -> (bool, u64) {
        let mut beside = false;
        let mut started = 0u64;
        for e in (0..self.busy.len()).filter(|&e| e != engine) {
            beside |= self.busy[e].load(Ordering::Acquire) > 0
                || (!solo && self.idle[e].load(Ordering::Acquire) < self.lanes(e));
            started = started.wrapping_add(self.starts[e].load(Ordering::Acquire));
        }
        (beside, started)
    }

    /// Whether a probe of class `q` by `engine` must run alone: another working engine
    /// could run the class. An engine measured only beside others can look slower than
    /// it is (on one core, a module job beside a busy CPU lane took 2-3x its time alone)
    /// and then never get the class. That holds for first probes and re-measurements
    /// alike: a re-measurement is what corrects an undisturbed estimate that came out
    /// inflated (see [`model::FAST_DOWN`]), and beside the others it never would.
    fn needs_solo(&self, engine: usize, q: usize) -> bool {
        let mask = self.classes[q].engines;
        (0..self.alive.len()).any(|e| e != engine && mask.contains(e) && self.lanes(e) > 0)
    }

    /// The engine holding the solo, or [`NO_SOLO`]. A failed engine's solo is void (a
    /// lane of it may have taken the solo as the engine failed; its probe will never
    /// be booked) and is cleared here.
    /// So is the solo of an engine none of whose lanes is probing or about to: all
    /// of them wait or are done, and none of its solo probes is in progress (a safety
    /// net: the holder normally releases it itself).
    fn solo_holder(&self) -> usize {
        let holder = self.solo.load(Ordering::Acquire);
        if holder == NO_SOLO {
            return holder;
        }
        let failed = self.lanes(holder) == 0;
        let dormant = self.idle[holder].load(Ordering::Acquire) >= self.lanes(holder)
            && self.solo_pulls[holder].load(Ordering::Acquire) == 0;
        if !failed && !dormant {
            return holder;
        }
        if self
            .solo
            .compare_exchange(holder, NO_SOLO, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            if failed {
                self.solo_pulls[holder].store(0, Ordering::Release);
            }
            self.notify_unlocked();
        }
        NO_SOLO
    }

    /// Whether a lane of an engine other than `engine` has a pull in progress.
    fn others_busy(&self, engine: usize) -> bool {
        (0..self.busy.len())
            .any(|e| e != engine && self.lanes(e) > 0 && self.busy[e].load(Ordering::Acquire) > 0)
    }

    /// Whether every lane but the caller's (a lane of `engine`) is waiting or done and no
    /// pull runs anywhere.
    fn all_waiting(&self, engine: usize) -> bool {
        self.others_idle(engine)
            && self.idle[engine].load(Ordering::Acquire) + 1 >= self.lanes(engine)
            && self.busy.iter().all(|b| b.load(Ordering::Acquire) == 0)
    }

    /// Whether every lane of the engines other than `engine` is waiting or done.
    fn others_idle(&self, engine: usize) -> bool {
        (0..self.alive.len())
            .filter(|&e| e != engine)
            .all(|e| self.idle[e].load(Ordering::Acquire) >= self.lanes(e))
    }

    /// Books the lane's previous pull, which ended now: wall time per job, and CPU time
    /// per job for module lanes (software lanes: the wall time, see the module docs).
    fn book(&self, engine: usize, pull: Pull, now: Instant, cpu_now: Option<Duration>) {
        self.record(engine, pull, now, cpu_now);
        self.unbusy(engine);
        if pull.solo {
            self.release_solo(engine);
        }
    }

    /// Ends one solo pull of `engine`; with its last, the solo: the others may go on.
    fn release_solo(&self, engine: usize) {
        let before = count_down(&self.solo_pulls[engine]);
        if before == 1
            && self
                .solo
                .compare_exchange(engine, NO_SOLO, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.notify();
        }
    }

    /// Whether a lane's solo probe of class `q`, `warm` pulls after the lane's last
    /// wait, takes another pull before the others may go on: until it has had its cold
    /// pulls ([`model::WARM_UP_PULLS`]) and then a warm one, or, while the engine has no
    /// undisturbed estimate of the class yet, the [`model::MIN_SAMPLES`] warm ones an
    /// estimate needs.
    fn solo_run_goes_on(&self, engine: usize, q: usize, warm: usize) -> bool {
        let samples = if self.alone(engine, q).is_some() {
            1
        } else {
            model::MIN_SAMPLES as usize
        };
        warm < model::WARM_UP_PULLS + samples
            && self.lanes(engine) > 0
            && self.solo.load(Ordering::Acquire) == engine
            && self.remaining(q) >= model::PROBE_MIN_REMAINING_PER_LANE * self.total_lanes()
    }

    /// Takes the next pull of a solo probe run of class `q`, counted as a probe while
    /// the engine has no estimate of the class.
    fn take_probe(&self, engine: usize, q: usize, max: usize, out: &mut Vec<usize>) -> bool {
        if self.cost(engine, q).is_none() {
            self.probes[self.engine_class(engine, q)].fetch_add(1, Ordering::Relaxed);
        }
        self.take(q, max, out)
    }

    /// Counts a pull of `engine` as started: busy until booked.
    fn start_pull(&self, engine: usize) {
        self.busy[engine].fetch_add(1, Ordering::AcqRel);
        self.starts[engine].fetch_add(1, Ordering::AcqRel);
    }

    /// Lanes still working in this batch, over all engines.
    fn total_lanes(&self) -> usize {
        (0..self.alive.len()).map(|e| self.lanes(e)).sum()
    }

    /// Counts a pull of `engine` as ended; if it was the engine's last in progress while
    /// another engine's lane waits to measure alone, wakes it. (The solo holder's own
    /// pulls ending help no waiter: on one core, waking the others after each pull of
    /// a probe took the core from the probe for nothing.)
    fn unbusy(&self, engine: usize) {
        let before = count_down(&self.busy[engine]);
        let holder = self.solo.load(Ordering::Acquire);
        if before == 1 && holder != NO_SOLO && holder != engine {
            self.notify();
        }
    }

    /// Adds the lane's previous pull to the estimates (see [`AdaptiveSchedule::book`]);
    /// while its engine still counts it busy, so "alone" means alone.
    fn record(&self, engine: usize, pull: Pull, now: Instant, cpu_now: Option<Duration>) {
        let k = self.slot(engine, pull.key);
        if !pull.full && self.estimates[k].cost().is_some() {
            return;
        }
        let n = pull.jobs.max(1) as f64;
        let wall = now.saturating_duration_since(pull.since).as_secs_f64() / n;
        let cpu = match (pull.cpu_since, cpu_now) {
            (Some(then), Some(now)) => now.saturating_sub(then).as_secs_f64() / n,
            _ => wall,
        };
        let mut usable = self.estimates[k].observe(wall, cpu);
        let (beside_now, others_started) = self.others(engine, pull.solo);
        let overlapped = pull.beside_others || beside_now || others_started != pull.others_started;
        // A cold pull undisturbed says what a pause costs, not what a job does (see
        // [`model::WARM_UP_PULLS`]). Overlapped, it still counts: the CPU lanes' first
        // pulls of a batch are the ones that overlap the other engine's trial jobs, and
        // without them the slowdown a class's trials are for was never measured (soft
        // testbed, 16 KiB: trials every batch, the module never back).
        if !pull.cold || overlapped {
            let jobs = u32::try_from(pull.jobs).unwrap_or(u32::MAX);
            usable |= self.interference[engine].record(pull.key, wall, cpu, jobs, overlapped);
        }
        // A measured gain compares the engines side by side with them alone, so only
        // warm pulls wholly one or the other count: a pull that overlapped the others
        // only at its start or end, booked as beside them, made a short mix look nearly
        // free.
        let wholly_beside = pull.beside_others && beside_now;
        if !pull.cold && (wholly_beside || !overlapped) {
            self.tallies[k].add(pull.jobs as u64, wall * n, overlapped);
        }
        if usable {
            self.notify();
        }
    }

    /// Chooses and takes jobs for a lane of `engine`; the class taken from, or `None`
    /// when nothing more is for this lane. Sets `waited` if it had to wait.
    fn choose(
        &self,
        engine: usize,
        max: usize,
        out: &mut Vec<usize>,
        streak: &mut Option<(u64, usize)>,
        taken: &mut Taken,
    ) -> Option<usize> {
        let waited = &mut taken.waited;
        let solo = &mut taken.solo;
        if let Some((epoch, q)) = streak.take() {
            if epoch == self.epoch.load(Ordering::Acquire)
                && self.solo_holder() == NO_SOLO
                && self.others_idle(engine)
                && self.take(q, max, out)
            {
                *streak = Some((epoch, q));
                taken.streak = true;
                return Some(q);
            }
        }
        let mut announced = false;
        loop {
            let epoch = self.epoch.load(Ordering::Acquire);
            let holder = self.solo_holder();
            let decision = if holder != NO_SOLO && holder != engine {
                // Another engine is measuring a class alone.
                Decision::Wait
            } else {
                decide(self, engine)
            };
            let wants_solo = matches!(decision, Decision::Probe(q) if self.needs_solo(engine, q));
            if holder == engine
                && !wants_solo
                && self.solo_pulls[engine].load(Ordering::Acquire) == 0
            {
                // The probe this engine held the solo for is no longer wanted.
                self.solo.store(NO_SOLO, Ordering::Release);
                self.notify();
            }
            *solo = false;
            let decision = if !wants_solo {
                decision
            } else if holder != engine
                && self
                    .solo
                    .compare_exchange(NO_SOLO, engine, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
            {
                Decision::Wait
            } else if self.others_busy(engine) {
                // Holding the solo: wait for the other engines' pulls to end.
                Decision::Wait
            } else {
                *solo = true;
                decision
            };
            match decision {
                Decision::Take(q) => {
                    if self.take(q, max, out) {
                        if self.others_idle(engine) {
                            *streak = Some((epoch, q));
                        }
                        return Some(q);
                    }
                }
                Decision::Probe(q) => {
                    let slot = self.engine_class(engine, q);
                    if self.cost(engine, q).is_none() {
                        self.probes[slot].fetch_add(1, Ordering::Relaxed);
                    } else if !self.reprobe[slot].swap(false, Ordering::Relaxed) {
                        // Another lane of this engine used the re-measurement first.
                        continue;
                    } else {
                        self.credit[engine].spend();
                    }
                    // A whole pull: a batching engine's cost per job depends on it.
                    if self.take(q, max, out) {
                        return Some(q);
                    }
                }
                Decision::Trial(q) | Decision::Check(q) => {
                    let slot = self.engine_class(engine, q);
                    self.trials[slot].fetch_add(1, Ordering::Relaxed);
                    if decision == Decision::Check(q) {
                        self.check_credit[engine].spend();
                    }
                    if self.take(q, max, out) {
                        return Some(q);
                    }
                }
                Decision::Done => {
                    self.idle[engine].fetch_add(1, Ordering::AcqRel);
                    return None;
                }
                Decision::Wait => {
                    *waited = true;
                    let mut guard = lock(&self.wait);
                    if !announced {
                        // A lane starting to wait may change what the others should
                        // do (it no longer counts on them): let them decide again.
                        announced = true;
                        if *guard > 0 {
                            self.wake.notify_all();
                        }
                    }
                    // Decide again under the lock, so a wake-up sent after this check
                    // cannot be missed.
                    let holder = self.solo_holder();
                    let still = if holder == NO_SOLO {
                        decide(self, engine) == Decision::Wait
                    } else if holder == engine {
                        self.others_busy(engine)
                    } else {
                        true
                    };
                    if still && holder == NO_SOLO && self.all_waiting(engine) {
                        // Every other lane waits too and no job runs: no event will
                        // change the rule's answer, so waiting would hang the batch.
                        // The rule guarantees some lane goes on, and its tests check
                        // that it does; should it ever fail, the work goes on as under
                        // `pull`, not never.
                        drop(guard);
                        if let Some(q) = (0..self.classes.len()).find(|&q| {
                            self.classes[q].engines.contains(engine) && self.take(q, max, out)
                        }) {
                            return Some(q);
                        }
                        continue;
                    }
                    if still {
                        // A lane holding the solo while the others drain is not idle.
                        let idle = holder != engine;
                        if idle {
                            self.idle[engine].fetch_add(1, Ordering::AcqRel);
                        }
                        *guard += 1;
                        let (mut guard, _) = self
                            .wake
                            .wait_timeout(guard, WAIT_RECHECK)
                            .unwrap_or_else(|e| e.into_inner());
                        *guard -= 1;
                        if idle {
                            self.idle[engine].fetch_sub(1, Ordering::AcqRel);
                        }
                    }
                }
            }
        }
    }
}

impl AdaptiveSchedule {
    /// `next` for a lane of the sole engine: another pull of its run's class, with one
    /// atomic add (and at the end of each span a mark), or, once the class runs out, the
    /// run booked and another begun.
    fn sole_next(&self, lane: usize, engine: usize, max: usize, out: &mut Vec<usize>) -> bool {
        let run = &self.runs[lane];
        let q = run.class.load(Ordering::Relaxed);
        if q != NO_RUN {
            // The lane asks when it has finished every job it took.
            let done = run.jobs.load(Ordering::Relaxed);
            let n = self.classes[q].jobs.take(max, out);
            if n > 0 {
                run.jobs.store(done + n, Ordering::Relaxed);
                let pulls = run.pulls.load(Ordering::Relaxed) + 1;
                run.pulls.store(pulls, Ordering::Relaxed);
                if pulls.is_multiple_of(run.span.load(Ordering::Relaxed)) {
                    let cpu = self.reads_cpu_clock(engine).then(thread_cpu_time);
                    lock(&self.pulls[lane])
                        .marks
                        .push((Instant::now(), done, cpu));
                }
                return true;
            }
        }
        self.sole_switch(lane, engine, max, out)
    }

    /// Books lane `lane`'s finished run, span by span, and starts one on the next class
    /// with jobs left; false when none is left.
    fn sole_switch(&self, lane: usize, engine: usize, max: usize, out: &mut Vec<usize>) -> bool {
        let run = &self.runs[lane];
        let module = self.reads_cpu_clock(engine);
        let mut state = lock(&self.pulls[lane]);
        if let Some(first) = state.pull.take() {
            let (now, cpu_now) = (Instant::now(), module.then(thread_cpu_time));
            let total = run.jobs.load(Ordering::Relaxed);
            let mut from = (first.since, 0, first.cpu_since);
            for (at, done, cpu) in state.marks.drain(..) {
                let span = Pull {
                    since: from.0,
                    jobs: done - from.1,
                    cpu_since: from.2,
                    full: true,
                    ..first
                };
                self.record(engine, span, at, cpu);
                from = (at, done, cpu);
            }
            let last = Pull {
                since: from.0,
                jobs: total - from.1,
                cpu_since: from.2,
                // Only a run of one pull that took fewer jobs than asked is partial.
                full: first.full || run.pulls.load(Ordering::Relaxed) > 1,
                ..first
            };
            self.book(engine, last, now, cpu_now);
        }
        for (q, class) in self.classes.iter().enumerate() {
            if !class.engines.contains(engine) {
                continue;
            }
            let n = class.jobs.take(max, out);
            if n == 0 {
                continue;
            }
            // The pulls this lane may expect of the class, cut into spans.
            let ahead = (class.jobs.remaining() + n) / (self.lanes(engine).max(1) * max.max(1));
            let span = u32::try_from(ahead / SOLE_SAMPLES).unwrap_or(u32::MAX);
            run.span.store(span.max(STREAK_SAMPLE), Ordering::Relaxed);
            run.class.store(q, Ordering::Relaxed);
            run.jobs.store(n, Ordering::Relaxed);
            run.pulls.store(1, Ordering::Relaxed);
            self.start_pull(engine);
            let (beside_others, others_started) = self.others(engine, false);
            state.pull = Some(Pull {
                key: class.key,
                class: q,
                jobs: n,
                since: Instant::now(),
                cpu_since: module.then(thread_cpu_time),
                beside_others,
                others_started,
                solo: false,
                // A run's first pull may be cold, but it is one of a span's dozens.
                cold: false,
                full: n >= max,
            });
            return true;
        }
        run.class.store(NO_RUN, Ordering::Relaxed);
        self.idle[engine].fetch_add(1, Ordering::AcqRel);
        false
    }
}

impl Schedule for AdaptiveSchedule {
    fn next(&self, lane: usize, max: usize, out: &mut Vec<usize>) -> bool {
        let engine = self.engine_of[lane];
        if self.sole == Some(engine) {
            return self.sole_next(lane, engine, max, out);
        }
        let module = self.reads_cpu_clock(engine);
        let width = max.max(1);
        if self.widths[engine].load(Ordering::Relaxed) != width {
            self.widths[engine].store(width, Ordering::Relaxed);
        }
        let mut state = lock(&self.pulls[lane]);
        let mut now = None;
        if std::mem::take(&mut state.untimed) {
            self.unbusy(engine);
        }
        if let Some(previous) = state.pull.take() {
            let at = Instant::now();
            let cpu_at = module.then(thread_cpu_time);
            now = Some((at, cpu_at));
            // A solo probe's run goes on under the same solo: counted before booking,
            // so the solo is not released in between and the others keep waiting.
            let go_on = previous.solo && self.solo_run_goes_on(engine, previous.class, state.warm);
            if go_on {
                self.solo_pulls[engine].fetch_add(1, Ordering::AcqRel);
            }
            self.book(engine, previous, at, cpu_at);
            if go_on {
                let before = out.len();
                if self.take_probe(engine, previous.class, max, out) {
                    let cold = state.next_is_cold();
                    self.start_pull(engine);
                    let jobs = out.len() - before;
                    let (beside_others, others_started) = self.others(engine, true);
                    state.pull = Some(Pull {
                        jobs,
                        since: at,
                        cpu_since: cpu_at,
                        beside_others,
                        others_started,
                        cold,
                        full: jobs >= max,
                        ..previous
                    });
                    return true;
                }
                self.release_solo(engine);
            }
        }
        let before = out.len();
        let mut taken = Taken::default();
        let Some(q) = self.choose(engine, max, out, &mut state.streak, &mut taken) else {
            return false;
        };
        if taken.waited {
            state.warm = 0;
        }
        let cold = state.next_is_cold();
        if taken.streak {
            state.streak_pulls = state.streak_pulls.wrapping_add(1);
            // Every pull is timed until the batch has measured the engine alone on the
            // class (see `model::GAIN_LOCAL_ALONE`): a mixing engine leaves it the
            // class's last jobs for that, and those run on a streak.
            if !state.streak_pulls.is_multiple_of(STREAK_SAMPLE)
                && self.alone_jobs(engine, q) >= model::GAIN_LOCAL_ALONE
            {
                // Untimed, but still counted busy and started: a lane that wakes to
                // measure alone waits for it to end, and one measuring already sees it
                // overlap. (Uncounted, it overlapped solo probes unseen: on one core a
                // 1 KiB module probe beside a CPU job looked 2x slower, and the module
                // lost the size it was best at for several batches.)
                self.start_pull(engine);
                state.untimed = true;
                return true;
            }
        }
        self.start_pull(engine);
        // After a wait (or an untimed pull), the jobs start now, not when the lane asked.
        let (since, cpu_since) = match now {
            Some(n) if !taken.waited => n,
            _ => (Instant::now(), module.then(thread_cpu_time)),
        };
        let solo = taken.solo;
        if solo {
            self.solo_pulls[engine].fetch_add(1, Ordering::AcqRel);
        }
        let (beside_others, others_started) = self.others(engine, solo);
        let jobs = out.len() - before;
        state.pull = Some(Pull {
            key: self.classes[q].key,
            class: q,
            jobs,
            since,
            cpu_since,
            beside_others,
            others_started,
            solo,
            cold,
            full: jobs >= max,
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
        // A failed engine's pulls, its solo probes included, will never be booked.
        if let Some(busy) = self.busy.get(engine) {
            busy.store(0, Ordering::Release);
        }
        if let Some(pulls) = self.solo_pulls.get(engine) {
            pulls.store(0, Ordering::Release);
        }
        let _ = self
            .solo
            .compare_exchange(engine, NO_SOLO, Ordering::AcqRel, Ordering::Acquire);
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

impl AdaptiveSchedule {
    /// Per engine and key, the mix gain this batch measured (see
    /// [`model::measured_gain`]), for every engine that ran the key beside another.
    fn measured_gains(&self, known: &Knowledge) -> Vec<Option<f64>> {
        let lanes: Vec<usize> = self.ids.iter().map(|&id| known.engines[id].lanes).collect();
        let mut out = vec![None; self.estimates.len()];
        for k in 0..self.keys.len() {
            let tallies: Vec<Tally> = (0..self.ids.len())
                .map(|e| self.tallies[self.slot(e, k)].get())
                .collect();
            let alone: Vec<Option<Cost>> = self.interference.iter().map(|i| i.alone(k)).collect();
            for e in 0..self.ids.len() {
                out[self.slot(e, k)] = measured_gain(e, &tallies, &lanes, &alone);
            }
        }
        out
    }
}

impl Drop for AdaptiveSchedule {
    /// Keeps what this batch learned for the next one.
    fn drop(&mut self) {
        let ran = self.planned.elapsed().as_secs_f64();
        let mut known = lock(&self.learned);
        let gains = self.measured_gains(&known);
        for (e, &id) in self.ids.iter().enumerate() {
            let engine = &mut known.engines[id];
            engine.credit = self.credit[e].carry(ran);
            engine.check_credit = self.check_credit[e].carry(ran);
            // Only an engine's own lanes book its estimates: one that started no pull
            // (left out of the batch) learned nothing new.
            if self.starts[e].load(Ordering::Acquire) == 0 {
                continue;
            }
            let (alone, ratios, ratio) = self.interference[e].snapshot();
            for (k, &(cipher, direction, b)) in self.keys.iter().enumerate() {
                let slot = self.slot(e, k);
                let mut gain = self.gains[slot];
                if let Some(g) = gains[slot] {
                    gain.observe(g);
                }
                let entry = Learned {
                    all: self.estimates[slot].get(),
                    alone: alone[k],
                    ratio: ratios[k],
                    gain,
                };
                if entry.all.samples() > 0 {
                    known.costs.insert((id, cipher, direction, b), entry);
                }
            }
            if ratio.samples() > 0 {
                known.engines[id].interference = ratio;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineKind;
    use crate::policy::{EngineMeta, LaneMeta};

    /// A `cpu` lane and a `kernel` module lane, one each.
    fn engines() -> Vec<EngineMeta> {
        [("cpu", EngineKind::Cpu), ("kernel", EngineKind::Kernel)]
            .iter()
            .map(|(name, kind)| EngineMeta {
                name: name.to_string(),
                kind: *kind,
                lanes: 1,
                max_batch: 1,
                uses_host_cpu: *kind == EngineKind::Cpu,
            })
            .collect()
    }

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
        let engines = engines();
        let lanes: Vec<LaneMeta> = (0..2).map(|engine| LaneMeta { engine, index: 0 }).collect();
        let jobs: Vec<JobMeta> = (0..100)
            .map(|i| JobMeta {
                len: if i < 50 { 64 } else { 65536 },
                cipher: Cipher::AES_128_CBC,
                direction: Direction::Encrypt,
                engines: EngineMask(3),
            })
            .collect();
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

    /// With the mix gain the store measured, the cpu neither runs trial jobs of the
    /// module's class to learn it (a gain below 1: it stays out) nor waits to learn it
    /// (above 1: it joins at once); without one, it runs trials.
    #[test]
    fn seeded_mix_gain_decides_whether_the_cpu_joins_without_trials() {
        use crate::calibration::{MixCalibration, MixPoint};
        let engines = engines();
        let lanes: Vec<LaneMeta> = (0..2).map(|engine| LaneMeta { engine, index: 0 }).collect();
        let jobs: Vec<JobMeta> = (0..200)
            .map(|_| JobMeta {
                len: 65536,
                cipher: Cipher::AES_128_CBC,
                direction: Direction::Encrypt,
                engines: EngineMask(3),
            })
            .collect();
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
        assert!(
            with_gain(None).is_some(),
            "no gain known: the cpu runs trials"
        );
    }
}
