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

use std::sync::Arc;
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
