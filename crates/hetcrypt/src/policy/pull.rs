//! `pull`: the seeds' self-scheduling — one shared queue, every free lane takes the next job.

use super::queue::GroupedQueue;
use super::{EngineMask, Plan, Policy, Schedule};
use crate::error::Result;

/// The seeds' system: lanes pull the next job whenever they are free.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pull;

impl Policy for Pull {
    fn name(&self) -> String {
        "pull".to_string()
    }

    fn plan(&self, plan: &Plan<'_>) -> Result<Box<dyn Schedule>> {
        let queue = GroupedQueue::new(plan.jobs, 0..plan.jobs.len(), EngineMask(u64::MAX));
        let engine_of = plan.lanes.iter().map(|l| l.engine).collect();
        Ok(Box::new(PullSchedule { queue, engine_of }))
    }
}

struct PullSchedule {
    queue: GroupedQueue,
    engine_of: Vec<usize>,
}

impl Schedule for PullSchedule {
    fn next(&self, lane: usize, max: usize, out: &mut Vec<usize>) -> bool {
        self.queue.take(self.engine_of[lane], max, out) > 0
    }

    fn engine_failed(&self, engine: usize) -> Vec<usize> {
        self.queue.engine_failed(engine)
    }
}
