//! `only:<engine>`: every job on one engine (the seeds' CPU-only and module-only baselines).

use super::queue::GroupedQueue;
use super::{EngineMask, Plan, Policy, Schedule};
use crate::error::{Error, Result};

/// Runs every job on the named engine; other engines' lanes start only to take over
/// its jobs if it fails.
#[derive(Clone, Debug)]
pub struct Only {
    engine: String,
}

impl Only {
    /// `only:<engine>` for the engine with this name.
    pub fn new(engine: impl Into<String>) -> Self {
        Only {
            engine: engine.into(),
        }
    }
}

impl Policy for Only {
    fn name(&self) -> String {
        format!("only:{}", self.engine)
    }

    fn plan(&self, plan: &Plan<'_>) -> Result<Box<dyn Schedule>> {
        let engine = plan
            .engines
            .iter()
            .position(|e| e.name == self.engine)
            .ok_or_else(|| Error::Policy {
                policy: self.name(),
                reason: format!("no engine named '{}' in this dispatcher", self.engine),
            })?;
        let mut allowed = EngineMask::default();
        allowed.insert(engine);
        let queue = GroupedQueue::new(plan.jobs, 0..plan.jobs.len(), allowed);
        let engine_of = plan.lanes.iter().map(|l| l.engine).collect();
        Ok(Box::new(OnlySchedule {
            queue,
            engine_of,
            allowed,
        }))
    }
}

struct OnlySchedule {
    queue: GroupedQueue,
    engine_of: Vec<usize>,
    allowed: EngineMask,
}

impl Schedule for OnlySchedule {
    fn next(&self, lane: usize, max: usize, out: &mut Vec<usize>) -> bool {
        self.queue.take(self.engine_of[lane], max, out) > 0
    }

    fn engine_failed(&self, engine: usize) -> Vec<usize> {
        self.queue.engine_failed(engine)
    }

    fn engines_needed(&self) -> EngineMask {
        self.allowed
    }
}
