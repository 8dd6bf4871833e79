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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cipher::{Cipher, Direction};
    use crate::policy::tests::engines_a_and_b;
    use crate::policy::{EngineMeta, JobMeta, LaneMeta};

    /// Engines `a` and `b`, one lane each, and five jobs both can run.
    fn setup() -> (Vec<EngineMeta>, Vec<LaneMeta>, Vec<JobMeta>) {
        let (engines, lanes) = engines_a_and_b(4);
        let job = JobMeta {
            len: 16,
            cipher: Cipher::AES_128_CTR,
            direction: Direction::Encrypt,
            engines: EngineMask(0b11),
        };
        (engines, lanes, vec![job; 5])
    }

    #[test]
    fn every_job_goes_to_the_named_engine_and_only_its_lanes_start() {
        let (engines, lanes, jobs) = setup();
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        // The second engine, so that taking the first (or any other) shows.
        let policy = Only::new("b");
        assert_eq!(policy.name(), "only:b");
        let s = policy.plan(&plan).unwrap();
        assert_eq!(s.engines_needed(), EngineMask(0b10));
        let mut out = Vec::new();
        assert!(!s.next(0, 4, &mut out), "engine a gets nothing");
        assert!(out.is_empty());
        assert!(s.next(1, 2, &mut out));
        assert_eq!(out, [0, 1]);
        assert!(s.next(1, 4, &mut out));
        assert_eq!(out, [0, 1, 2, 3, 4]);
        assert!(!s.next(1, 4, &mut out), "false once the queue is empty");
        assert_eq!(out.len(), 5);
    }

    #[test]
    fn a_failed_engine_gives_back_its_untaken_jobs_and_an_unknown_name_fails_the_plan() {
        let (engines, lanes, jobs) = setup();
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let s = Only::new("b").plan(&plan).unwrap();
        let mut out = Vec::new();
        assert!(s.next(1, 2, &mut out));
        assert!(s.engine_failed(0).is_empty(), "engine a held none");
        assert_eq!(s.engine_failed(1), [2, 3, 4]);
        assert!(!s.next(1, 4, &mut out));

        match Only::new("c").plan(&plan).err() {
            Some(Error::Policy { policy, reason }) => {
                assert_eq!(policy, "only:c");
                assert!(reason.contains("'c'"), "{reason}");
            }
            other => panic!("only:c planned over engines a and b: {:?}", other.is_some()),
        }
    }
}
