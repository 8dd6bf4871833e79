//! Policies: which lane runs which job. Pure scheduling — no crypto here.
//!
//! A [`Policy`] looks at a batch (job sizes, which engines can run each job, the
//! lanes) and returns a [`Schedule`], the per-batch state that free lanes ask for
//! their next jobs. Fail-over is the dispatcher's mechanism; a policy only hands back
//! the jobs it had reserved for an engine that failed.

pub mod adaptive;
pub mod call;
mod only;
mod polling;
mod pull;
pub mod queue;
mod round_robin;
pub mod threshold;
pub mod trial;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub use adaptive::Adaptive;
pub use only::Only;
pub use polling::Polling;
pub use pull::Pull;
pub use round_robin::RoundRobin;
pub use threshold::Threshold;

use crate::calibration::Calibration;
use crate::cipher::{Cipher, Direction};
use crate::engine::EngineKind;
use crate::error::Result;

/// The set of engines (by index in the dispatcher) that can run a job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EngineMask(pub u64);

/// Most engines one dispatcher can hold (one bit each in an [`EngineMask`]).
pub const MAX_ENGINES: usize = 64;

/// Locks a mutex, going on with the data if a lane panicked while holding it: the
/// dispatcher's and the policies' shared state (counters, queues, estimates, a lane's
/// state) stays consistent between statements.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl EngineMask {
    /// Whether engine `engine` is in the set.
    pub const fn contains(self, engine: usize) -> bool {
        engine < MAX_ENGINES && self.0 & (1 << engine) != 0
    }

    /// Adds engine `engine`.
    pub fn insert(&mut self, engine: usize) {
        if engine < MAX_ENGINES {
            self.0 |= 1 << engine;
        }
    }

    /// Number of engines in the set.
    pub const fn count(self) -> u32 {
        self.0.count_ones()
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The engines in both sets.
    pub const fn intersect(self, other: EngineMask) -> EngineMask {
        EngineMask(self.0 & other.0)
    }
}

/// What a policy may know about a job.
#[derive(Clone, Copy, Debug)]
pub struct JobMeta {
    /// Input length in bytes.
    pub len: usize,
    /// The cipher.
    pub cipher: Cipher,
    /// The direction.
    pub direction: Direction,
    /// The engines that can run it. Some may have failed in an earlier batch: they
    /// have no lanes, and the dispatcher takes back what the schedule gives them.
    pub engines: EngineMask,
}

/// What a policy may know about an engine.
#[derive(Clone, Debug)]
pub struct EngineMeta {
    /// The engine's name.
    pub name: String,
    /// Its kind.
    pub kind: EngineKind,
    /// Its lane count.
    pub lanes: usize,
    /// Most jobs a lane takes in one pull.
    pub max_batch: usize,
    /// Whether its lanes keep a host core busy while a job runs.
    pub uses_host_cpu: bool,
}

/// What a policy may know about a lane.
#[derive(Clone, Copy, Debug)]
pub struct LaneMeta {
    /// Index of the lane's engine in [`Plan::engines`].
    pub engine: usize,
    /// The lane's index within its engine.
    pub index: usize,
}

/// Everything a policy sees of a batch.
#[derive(Clone, Copy, Debug)]
pub struct Plan<'a> {
    /// The jobs, in batch order.
    pub jobs: &'a [JobMeta],
    /// The engines, in dispatcher order (engines that failed earlier included, with
    /// no lanes).
    pub engines: &'a [EngineMeta],
    /// The lanes that will ask for work.
    pub lanes: &'a [LaneMeta],
    /// Host cores available to this process.
    pub cores: usize,
}

/// A scheduling policy.
pub trait Policy: Send + Sync {
    /// The policy's name as the CLI spells it (`pull`, `only:cpu`, ...).
    fn name(&self) -> String;

    /// Prepares the schedule for one batch.
    fn plan(&self, plan: &Plan<'_>) -> Result<Box<dyn Schedule>>;

    /// What the policy has learned from the batches so far, for display and benchmark
    /// records; `None` for a policy that learns nothing (all but `adaptive`).
    fn learned(&self) -> Option<Vec<adaptive::LearnedCost>> {
        None
    }
}

/// A policy's state during one batch. Lanes call it concurrently.
pub trait Schedule: Send + Sync {
    /// Lane `lane` (index into [`Plan::lanes`]) is free: push at most `max` job indices
    /// into `out`. Return `false` when the policy has nothing more for this lane in
    /// this batch (it may still receive re-dispatched jobs from the dispatcher).
    /// May block (e.g. waiting on a dispatcher thread). The dispatcher calls it on the
    /// lane's own thread, so a schedule may time a lane's work between two of its
    /// calls (`adaptive` does).
    fn next(&self, lane: usize, max: usize, out: &mut Vec<usize>) -> bool;

    /// Whether [`Schedule::completed`] wants per-job timings (costs a clock read and
    /// a thread CPU-time read per pull).
    fn wants_timing(&self) -> bool {
        false
    }

    /// Lane `lane` finished `jobs` in `elapsed` wall time, using `cpu` of its own
    /// thread's CPU time (measured only when [`Schedule::wants_timing`]).
    fn completed(&self, lane: usize, jobs: &[usize], elapsed: Duration, cpu: Duration) {
        let _ = (lane, jobs, elapsed, cpu);
    }

    /// Engine `engine` failed and runs nothing more: return the jobs the schedule had
    /// reserved for it and not yet handed out, so the dispatcher can run them elsewhere.
    fn engine_failed(&self, engine: usize) -> Vec<usize> {
        let _ = engine;
        Vec::new()
    }

    /// The engines whose lanes this batch needs, asked once before the lanes start.
    /// The dispatcher starts the other engines' lanes only if an engine fails during
    /// the batch (its jobs may need them); a lane that would only wait costs its
    /// thread's start and join. The default is every engine.
    fn engines_needed(&self) -> EngineMask {
        EngineMask(u64::MAX)
    }
}

/// Parses a policy name as the CLI spells it.
///
/// Policies added elsewhere in this module register here.
pub fn by_name(name: &str) -> Result<Box<dyn Policy>> {
    by_name_with(name, None)
}

/// Whether the policy named `name` starts from a calibration when given one
/// ([`by_name_with`]): callers read the store only for those.
pub fn uses_calibration(name: &str) -> bool {
    matches!(name, "threshold" | "adaptive")
}

/// Parses a policy name as [`by_name`] does, giving the policies that use one the
/// calibration of this machine: `threshold` splits at its crossovers and `adaptive`
/// starts from its costs (both still learn what it lacks).
pub fn by_name_with(name: &str, calibration: Option<&Arc<Calibration>>) -> Result<Box<dyn Policy>> {
    match (name, calibration) {
        ("threshold", Some(cal)) => return Ok(Box::new(Threshold::calibrated(Arc::clone(cal)))),
        ("adaptive", Some(cal)) => return Ok(Box::new(Adaptive::seeded(Arc::clone(cal)))),
        _ => {}
    }
    if let Some(engine) = name.strip_prefix("only:") {
        return Ok(Box::new(Only::new(engine)));
    }
    if let Some(bytes) = name.strip_prefix("threshold:") {
        // Digits only: `usize::from_str` would also take a leading '+'.
        if !bytes.is_empty() && bytes.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(bytes) = bytes.parse() {
                return Ok(Box::new(Threshold::fixed(bytes)));
            }
        }
    }
    if let Some(weights) = name.strip_prefix("round-robin:") {
        let weights: Option<Vec<u32>> = weights
            .split(':')
            .map(|w| {
                // Digits only, as for `threshold:`.
                (!w.is_empty() && w.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| w.parse().ok())
                    .flatten()
            })
            .collect();
        if let Some(weights) = weights {
            return Ok(Box::new(RoundRobin::weighted(weights)));
        }
    }
    match name {
        "pull" => Ok(Box::new(Pull)),
        "round-robin" => Ok(Box::new(RoundRobin::new())),
        "polling" => Ok(Box::new(Polling)),
        "threshold" => Ok(Box::new(Threshold::calibrating())),
        "adaptive" => Ok(Box::new(Adaptive::new())),
        _ => Err(crate::Error::UnknownName {
            what: "policy",
            name: name.to_string(),
        }),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A `cpu` and a `kernel` engine with one lane each (engine indices 0 and 1): the
    /// policies' tests plan over these.
    pub(crate) fn cpu_and_kernel() -> (Vec<EngineMeta>, Vec<LaneMeta>) {
        let engines = [("cpu", EngineKind::Cpu), ("kernel", EngineKind::Kernel)]
            .iter()
            .map(|(name, kind)| EngineMeta {
                name: name.to_string(),
                kind: *kind,
                lanes: 1,
                max_batch: 1,
                uses_host_cpu: *kind == EngineKind::Cpu,
            })
            .collect();
        (engines, one_lane_each(2))
    }

    /// Two engines named `a` and `b` of the same kind, one lane each, batches of at
    /// most `max_batch` jobs.
    pub(crate) fn engines_a_and_b(max_batch: usize) -> (Vec<EngineMeta>, Vec<LaneMeta>) {
        let engines = ["a", "b"]
            .iter()
            .map(|name| EngineMeta {
                name: name.to_string(),
                kind: EngineKind::Cpu,
                lanes: 1,
                max_batch,
                uses_host_cpu: true,
            })
            .collect();
        (engines, one_lane_each(2))
    }

    fn one_lane_each(engines: usize) -> Vec<LaneMeta> {
        (0..engines)
            .map(|engine| LaneMeta { engine, index: 0 })
            .collect()
    }

    /// AES-128-CBC encryption jobs of these lengths that both engines can run.
    pub(crate) fn cbc_jobs(lens: impl IntoIterator<Item = usize>) -> Vec<JobMeta> {
        lens.into_iter()
            .map(|len| JobMeta {
                len,
                cipher: Cipher::AES_128_CBC,
                direction: Direction::Encrypt,
                engines: EngineMask(0b11),
            })
            .collect()
    }

    #[test]
    fn an_engine_mask_holds_engines_0_to_63_and_ignores_the_rest() {
        let mut m = EngineMask::default();
        assert!(m.is_empty());
        assert_eq!(m.count(), 0);
        m.insert(0);
        m.insert(5);
        m.insert(63);
        // Out of range: no bit, no panic (a shift by 64 would overflow).
        m.insert(64);
        m.insert(200);
        assert_eq!(m, EngineMask(1 | 1 << 5 | 1 << 63));
        assert!(!m.is_empty());
        assert_eq!(m.count(), 3);
        for (engine, member) in [(0, true), (1, false), (4, false), (5, true), (6, false)] {
            assert_eq!(m.contains(engine), member, "engine {engine}");
        }
        assert!(m.contains(63));
        assert!(
            !m.contains(64),
            "bit 0 is set: a wrapped shift would claim 64"
        );
        assert!(!m.contains(usize::MAX));
        assert!(!EngineMask(u64::MAX).contains(64));
        // Engine 1 in a mask of engines 0 and 2 (0b101): a shift the wrong way or an
        // | for the & would find it.
        assert!(!EngineMask(0b101).contains(1));
        assert!(EngineMask(0b100).contains(2));
        assert_eq!(
            EngineMask(0b0110).intersect(EngineMask(0b1100)),
            EngineMask(0b0100)
        );
        assert_eq!(
            EngineMask(0b11).intersect(EngineMask(0b11)),
            EngineMask(0b11)
        );
        assert!(EngineMask(0b01).intersect(EngineMask(0b10)).is_empty());
    }

    /// A policy and a schedule that override nothing: what the defaults promise.
    struct Bare;

    impl Policy for Bare {
        fn name(&self) -> String {
            "bare".to_string()
        }

        fn plan(&self, _: &Plan<'_>) -> Result<Box<dyn Schedule>> {
            Ok(Box::new(Bare))
        }
    }

    impl Schedule for Bare {
        fn next(&self, _: usize, _: usize, _: &mut Vec<usize>) -> bool {
            false
        }
    }

    #[test]
    fn the_trait_defaults_learn_nothing_time_nothing_reserve_nothing_and_need_every_engine() {
        assert!(Bare.learned().is_none());
        assert!(!Bare.wants_timing());
        assert!(Bare.engine_failed(0).is_empty());
        assert!(Bare.engine_failed(1).is_empty());
        assert_eq!(Bare.engines_needed(), EngineMask(u64::MAX));
    }

    #[test]
    fn by_name_knows_every_policy_as_the_cli_spells_it() {
        for name in [
            "pull",
            "round-robin",
            "polling",
            "threshold",
            "adaptive",
            "only:cpu",
            "only:kernel:virtio_crypto_aes_cbc",
            "threshold:0",
            "threshold:4096",
            "round-robin:3:1",
            "round-robin:0:1:2",
        ] {
            let policy = by_name(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(policy.name(), name);
        }
        for bad in [
            "",
            "Pull",
            "only",
            "threshold:",
            "threshold:+5",
            "threshold:-1",
            "threshold:4k",
            "threshold:99999999999999999999999",
            "round-robin:",
            "round-robin:1:",
            "round-robin::1",
            "round-robin:+1:2",
            "round-robin:1:x",
            "round-robin:99999999999",
            "fastest",
        ] {
            match by_name(bad) {
                Err(crate::Error::UnknownName { what, name }) => {
                    assert_eq!((what, name.as_str()), ("policy", bad));
                }
                Err(e) => panic!("{bad:?}: {e}, not UnknownName"),
                Ok(p) => panic!("{bad:?} parsed as {}", p.name()),
            }
        }
    }

    #[test]
    fn only_threshold_and_adaptive_start_from_a_calibration() {
        assert!(uses_calibration("threshold"));
        assert!(uses_calibration("adaptive"));
        for name in ["pull", "round-robin", "polling", "only:cpu", "threshold:64"] {
            assert!(!uses_calibration(name), "{name}");
        }
    }

    /// Given a store, `threshold` and `adaptive` start from it: `threshold` splits the
    /// first batch at the stored crossover without timing anything, `adaptive` knows
    /// the module's cost before any job ran. Without one, both measure first.
    #[test]
    fn by_name_with_a_calibration_seeds_threshold_and_adaptive() {
        let cal = Arc::new(crate::calibration::tests::cpu_and_module());
        let (engines, lanes) = cpu_and_kernel();
        let jobs = cbc_jobs([64, 65536]);
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let timing = |name: &str, cal: Option<&Arc<Calibration>>| {
            let policy = by_name_with(name, cal).expect("a known policy");
            assert_eq!(policy.name(), name);
            let schedule = policy.plan(&plan).expect("plans");
            (schedule.wants_timing(), policy.learned())
        };
        assert!(
            !timing("threshold", Some(&cal)).0,
            "the store knows the class"
        );
        assert!(timing("threshold", None).0, "nothing stored: it measures");
        let seeded = timing("adaptive", Some(&cal)).1.expect("adaptive learns");
        assert!(
            seeded
                .iter()
                .any(|l| l.engine == "kernel" && l.cost.is_some()),
            "seeded from the store: {seeded:?}"
        );
        let fresh = timing("adaptive", None).1.expect("adaptive learns");
        assert!(fresh.iter().all(|l| l.cost.is_none()), "{fresh:?}");
        // Other policies take no calibration.
        assert_eq!(
            by_name_with("pull", Some(&cal))
                .map(|p| p.name())
                .ok()
                .as_deref(),
            Some("pull")
        );
    }
}
