//! `round-robin`: the seeds' static baseline — jobs dealt to the engines in turn, 1:1,
//! or in set proportions (`round-robin:<w0>:<w1>:...`).

use super::queue::{live_engines, JobList};
use super::{EngineMask, Plan, Policy, Schedule, MAX_ENGINES};
use crate::error::{Error, Result};

/// Deals the jobs to the engines in turn before the batch starts (job 0 to the first
/// engine that can run it, job 1 to the next, ...); each lane then takes from its own
/// engine's list. Nothing moves between engines afterwards, so a slow engine holds
/// half the batch however slow it is — that is the point of this baseline.
///
/// With weights, one per engine in the dispatcher's order, each job goes to the engine
/// that can run it with the fewest jobs dealt for its weight (ties in turn): `3:1`
/// deals three jobs to the first engine for each one to the second. A sweep of
/// weights finds the best fixed split of a batch, the yardstick a dynamic policy's
/// split can be held against where the engines slow each other and the ideal that
/// assumes they do not is out of reach. An engine of weight 0 gets only the jobs no
/// other engine can run.
#[derive(Clone, Debug, Default)]
pub struct RoundRobin {
    /// Per engine; empty for 1:1.
    weights: Vec<u32>,
}

impl RoundRobin {
    /// Deals one job to each engine in turn (the seeds' baseline).
    pub fn new() -> Self {
        Self::default()
    }

    /// Deals `weights[e]` jobs to engine `e` for every `weights[0]` to engine 0; the
    /// plan fails unless there is one weight per engine and one is not 0.
    pub fn weighted(weights: Vec<u32>) -> Self {
        RoundRobin { weights }
    }
}

impl Policy for RoundRobin {
    fn name(&self) -> String {
        let mut name = "round-robin".to_string();
        for w in &self.weights {
            name.push_str(&format!(":{w}"));
        }
        name
    }

    fn plan(&self, plan: &Plan<'_>) -> Result<Box<dyn Schedule>> {
        let live = live_engines(plan);
        let n_engines = plan.engines.len().min(MAX_ENGINES);
        let weights: Vec<u64> = if self.weights.is_empty() {
            vec![1; n_engines]
        } else if self.weights.len() != plan.engines.len() || self.weights.iter().all(|&w| w == 0) {
            return Err(Error::Policy {
                policy: self.name(),
                reason: format!(
                    "needs one weight per engine, not all 0 ({} weights for {} engines)",
                    self.weights.len(),
                    plan.engines.len()
                ),
            });
        } else {
            self.weights.iter().map(|&w| u64::from(w)).collect()
        };
        let mut lists: Vec<Vec<usize>> = vec![Vec::new(); n_engines];
        // The engine whose turn it is: a job skips the engines that cannot run it, and
        // the turn passes to the engine after the one that got it.
        let mut turn = 0;
        for (i, job) in plan.jobs.iter().enumerate() {
            let can = job.engines.intersect(live);
            if can.is_empty() {
                continue;
            }
            let order = (0..n_engines)
                .map(|k| (turn + k) % n_engines)
                .filter(|&e| can.contains(e));
            // Fewest jobs for its weight: (dealt + 1) / weight, compared crosswise; an
            // engine of weight 0 only when no other can run the job.
            let engine = order
                .clone()
                .filter(|&e| weights[e] > 0)
                .min_by(|&a, &b| {
                    let next = |e: usize| lists[e].len() as u64 + 1;
                    (next(a) * weights[b]).cmp(&(next(b) * weights[a]))
                })
                .or_else(|| order.clone().next())
                .expect("a non-empty engine set has a member below MAX_ENGINES");
            lists[engine].push(i);
            turn = engine + 1;
        }
        Ok(Box::new(RoundRobinSchedule {
            lists: lists.into_iter().map(JobList::new).collect(),
            engine_of: plan.lanes.iter().map(|l| l.engine).collect(),
        }))
    }
}

/// One list of reserved jobs per engine.
struct RoundRobinSchedule {
    lists: Vec<JobList>,
    engine_of: Vec<usize>,
}

impl Schedule for RoundRobinSchedule {
    fn next(&self, lane: usize, max: usize, out: &mut Vec<usize>) -> bool {
        self.lists[self.engine_of[lane]].take(max, out) > 0
    }

    fn engine_failed(&self, engine: usize) -> Vec<usize> {
        self.lists
            .get(engine)
            .map(JobList::drain)
            .unwrap_or_default()
    }

    /// An engine dealt no job (a batch smaller than the engine count) is not started.
    fn engines_needed(&self) -> EngineMask {
        let mut needed = EngineMask::default();
        for (e, list) in self.lists.iter().enumerate() {
            if !list.is_empty() {
                needed.insert(e);
            }
        }
        needed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cipher::{Cipher, Direction};
    use crate::engine::EngineKind;
    use crate::policy::{EngineMask, EngineMeta, JobMeta, LaneMeta};

    fn engine(name: &str, lanes: usize) -> EngineMeta {
        EngineMeta {
            name: name.to_string(),
            kind: EngineKind::Cpu,
            lanes,
            max_batch: 1,
            uses_host_cpu: true,
        }
    }

    fn job(engines: u64) -> JobMeta {
        JobMeta {
            len: 64,
            cipher: Cipher::AES_128_CBC,
            direction: Direction::Encrypt,
            engines: EngineMask(engines),
        }
    }

    fn drain_lane(s: &dyn Schedule, lane: usize) -> Vec<usize> {
        let mut out = Vec::new();
        while s.next(lane, 1, &mut out) {}
        out
    }

    #[test]
    fn deals_in_turn_and_skips_engines_that_cannot_run_a_job() {
        let engines = [engine("a", 1), engine("b", 1), engine("c", 1)];
        let lanes: Vec<LaneMeta> = (0..3)
            .map(|e| LaneMeta {
                engine: e,
                index: 0,
            })
            .collect();
        // Job 3 only runs on engine 0; engine 2 failed earlier (no lanes) below.
        let jobs = [job(0b111), job(0b111), job(0b111), job(0b001), job(0b111)];
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let s = RoundRobin::new().plan(&plan).unwrap();
        assert_eq!(drain_lane(s.as_ref(), 0), vec![0, 3]);
        assert_eq!(drain_lane(s.as_ref(), 1), vec![1, 4]);
        assert_eq!(drain_lane(s.as_ref(), 2), vec![2]);

        let engines = [engine("a", 1), engine("b", 1), engine("c", 0)];
        let plan = Plan {
            engines: &engines,
            lanes: &lanes[..2],
            ..plan
        };
        let s = RoundRobin::new().plan(&plan).unwrap();
        assert_eq!(drain_lane(s.as_ref(), 0), vec![0, 2, 3]);
        assert_eq!(drain_lane(s.as_ref(), 1), vec![1, 4]);
    }

    #[test]
    fn weights_deal_in_proportion_and_a_zero_weight_gets_only_what_no_other_can_run() {
        let engines = [engine("a", 1), engine("b", 1)];
        let lanes: Vec<LaneMeta> = (0..2)
            .map(|e| LaneMeta {
                engine: e,
                index: 0,
            })
            .collect();
        let mut jobs = vec![job(0b11); 8];
        jobs[5] = job(0b10);
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let s = RoundRobin::weighted(vec![3, 1]).plan(&plan).unwrap();
        // Three to a for each one to b, interleaved; job 5 can only go to b.
        assert_eq!(drain_lane(s.as_ref(), 0), vec![0, 1, 3, 4, 6, 7]);
        assert_eq!(drain_lane(s.as_ref(), 1), vec![2, 5]);

        let s = RoundRobin::weighted(vec![1, 0]).plan(&plan).unwrap();
        assert_eq!(drain_lane(s.as_ref(), 1), vec![5]);
        assert_eq!(drain_lane(s.as_ref(), 0).len(), 7);

        for bad in [vec![1], vec![1, 2, 3], vec![0, 0]] {
            let err = RoundRobin::weighted(bad).plan(&plan).err().unwrap();
            assert!(err.to_string().contains("one weight per engine"), "{err}");
        }
        assert_eq!(RoundRobin::weighted(vec![3, 1]).name(), "round-robin:3:1");
        assert_eq!(RoundRobin::new().name(), "round-robin");
    }

    /// A batch smaller than the engine count starts only the engines dealt a job.
    #[test]
    fn only_engines_dealt_a_job_are_needed() {
        let engines = [engine("a", 1), engine("b", 1), engine("c", 1)];
        let lanes: Vec<LaneMeta> = (0..3)
            .map(|e| LaneMeta {
                engine: e,
                index: 0,
            })
            .collect();
        // The second job only engine c can run.
        let jobs = [job(0b111), job(0b100)];
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let s = RoundRobin::new().plan(&plan).unwrap();
        assert_eq!(s.engines_needed(), EngineMask(0b101));
        let none = RoundRobin::new().plan(&Plan { jobs: &[], ..plan }).unwrap();
        assert!(none.engines_needed().is_empty());
    }

    #[test]
    fn a_failed_engine_gives_back_exactly_its_untaken_jobs() {
        let engines = [engine("a", 1), engine("b", 1)];
        let lanes = [
            LaneMeta {
                engine: 0,
                index: 0,
            },
            LaneMeta {
                engine: 1,
                index: 0,
            },
        ];
        let jobs = vec![job(0b11); 6];
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let s = RoundRobin::new().plan(&plan).unwrap();
        let mut taken = Vec::new();
        assert!(s.next(1, 1, &mut taken));
        assert_eq!(taken, vec![1]);
        assert_eq!(s.engine_failed(1), vec![3, 5]);
        assert!(!s.next(1, 1, &mut taken), "nothing more after the failure");
        assert!(s.engine_failed(1).is_empty(), "given back only once");
        assert_eq!(drain_lane(s.as_ref(), 0), vec![0, 2, 4]);
    }
}
