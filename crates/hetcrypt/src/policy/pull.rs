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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cipher::{Cipher, Direction};
    use crate::policy::tests::engines_a_and_b;
    use crate::policy::JobMeta;

    #[test]
    fn lanes_take_in_order_what_their_engine_can_run_and_a_failure_returns_the_rest() {
        let (engines, lanes) = engines_a_and_b(4);
        // Jobs 1 and 3 run only on engine b.
        let jobs: Vec<JobMeta> = [0b11, 0b10, 0b11, 0b10, 0b11]
            .iter()
            .map(|&m| JobMeta {
                len: 16,
                cipher: Cipher::AES_128_CTR,
                direction: Direction::Encrypt,
                engines: EngineMask(m),
            })
            .collect();
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        assert_eq!(Pull.name(), "pull");
        let s = Pull.plan(&plan).unwrap();
        assert_eq!(s.engines_needed(), EngineMask(u64::MAX));
        let mut a = Vec::new();
        assert!(s.next(0, 2, &mut a));
        assert_eq!(a, [0, 2]);
        let mut b = Vec::new();
        assert!(s.next(1, 1, &mut b));
        assert_eq!(b, [1], "b takes the jobs only it can run first");
        assert_eq!(s.engine_failed(1), [3], "no other engine can run job 3");
        assert!(s.next(0, 4, &mut a));
        assert_eq!(a, [0, 2, 4]);
        assert!(!s.next(0, 4, &mut a));
        assert!(!s.next(1, 4, &mut b));
    }
}
