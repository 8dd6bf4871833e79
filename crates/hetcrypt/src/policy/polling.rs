//! `polling`: the seeds' polling baseline — a dispatcher thread watches the lanes and
//! hands the next job to whichever is idle.
//!
//! Each lane waits in [`Schedule::next`] on its own *slot*; one dispatcher thread,
//! spawned when the batch is planned, loops over the slots and puts the next job into
//! any slot whose lane is waiting. The loop **busy-polls**: it never sleeps while the
//! batch runs, only yields the core between rounds, so it burns a host core (or shares
//! one with the lanes) for the whole batch — exactly the cost the seeds measured for this
//! design, and the reason `pull` (lanes take from a shared queue themselves) beats it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::queue::{live_engines, GroupedQueue};
use super::{Plan, Policy, Schedule};
use crate::error::Result;

/// The seeds' polling dispatcher: one extra thread hands each job to an idle lane.
#[derive(Clone, Copy, Debug, Default)]
pub struct Polling;

impl Policy for Polling {
    fn name(&self) -> String {
        "polling".to_string()
    }

    fn plan(&self, plan: &Plan<'_>) -> Result<Box<dyn Schedule>> {
        Ok(Box::new(PollingSchedule::start(plan)?))
    }
}

impl PollingSchedule {
    /// The slots of `plan`'s lanes, and the dispatcher thread that serves them.
    fn start(plan: &Plan<'_>) -> Result<Self> {
        let shared = Arc::new(Shared {
            queue: GroupedQueue::new(plan.jobs, 0..plan.jobs.len(), live_engines(plan)),
            slots: plan
                .lanes
                .iter()
                .map(|l| LaneSlot {
                    engine: l.engine,
                    wants: AtomicUsize::new(0),
                    closed: AtomicBool::new(false),
                    slot: Mutex::new(Slot::default()),
                    ready: Condvar::new(),
                })
                .collect(),
            stop: AtomicBool::new(false),
        });
        let poller = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("hetcrypt-poller".to_string())
                .spawn(move || shared.poll())?
        };
        Ok(PollingSchedule {
            shared,
            poller: Some(poller),
        })
    }
}

/// What the dispatcher thread and one lane exchange.
#[derive(Debug, Default)]
struct Slot {
    /// Jobs handed to the lane and not yet picked up.
    jobs: Vec<usize>,
    /// How many jobs the waiting lane asked for (0: not waiting).
    wants: usize,
    /// Nothing more will come: the lane's `next` returns false from now on.
    closed: bool,
}

/// One lane's slot, plus lock-free copies of its state for the polling loop.
#[derive(Debug)]
struct LaneSlot {
    engine: usize,
    /// Mirror of `slot.wants`, read by the loop without taking the lock.
    wants: AtomicUsize,
    /// Mirror of `slot.closed`.
    closed: AtomicBool,
    slot: Mutex<Slot>,
    ready: Condvar,
}

impl LaneSlot {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        // A panicking lane leaves the slot's plain data consistent: go on with it.
        super::lock(&self.slot)
    }

    /// Closes the slot; returns the jobs it held (handed out but not picked up).
    fn close(&self) -> Vec<usize> {
        let mut slot = self.lock();
        slot.closed = true;
        slot.wants = 0;
        self.closed.store(true, Ordering::Release);
        self.wants.store(0, Ordering::Release);
        let jobs = std::mem::take(&mut slot.jobs);
        drop(slot);
        self.ready.notify_all();
        jobs
    }
}

/// State shared by the lanes and the dispatcher thread.
#[derive(Debug)]
struct Shared {
    queue: GroupedQueue,
    slots: Vec<LaneSlot>,
    /// Set when the schedule is dropped: the loop ends at once.
    stop: AtomicBool,
}

/// Rounds of spinning between yields of the core: a few keep the hand-off latency of a
/// busy batch low; yielding afterwards lets the lanes run when cores are scarce (the
/// loop still takes every cycle nobody else wants).
const SPINS_BEFORE_YIELD: u32 = 64;

impl Shared {
    /// The dispatcher loop: until every slot is closed, give each waiting lane the next
    /// job its engine can run, or close its slot when there is none.
    fn poll(&self) {
        let mut idle_rounds = 0u32;
        while !self.stop.load(Ordering::Acquire) {
            let mut open = false;
            let mut handed = false;
            for lane in &self.slots {
                if lane.closed.load(Ordering::Acquire) {
                    continue;
                }
                open = true;
                if lane.wants.load(Ordering::Acquire) == 0 {
                    continue;
                }
                // Take and place under the slot's lock, so `engine_failed` (which closes
                // the slot under the same lock) either sees the jobs in the slot or
                // prevents the take: a job is never lost between the two.
                let mut slot = lane.lock();
                if slot.closed || slot.wants == 0 || !slot.jobs.is_empty() {
                    continue;
                }
                let want = slot.wants;
                if self.queue.take(lane.engine, want, &mut slot.jobs) == 0 {
                    slot.closed = true;
                    lane.closed.store(true, Ordering::Release);
                }
                slot.wants = 0;
                lane.wants.store(0, Ordering::Release);
                drop(slot);
                lane.ready.notify_all();
                handed = true;
            }
            if !open {
                return;
            }
            if handed {
                idle_rounds = 0;
            } else {
                idle_rounds += 1;
                if idle_rounds < SPINS_BEFORE_YIELD {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        // Stopped early: release any lane still waiting.
        for lane in &self.slots {
            lane.close();
        }
    }
}

/// The per-batch state: the slots and the dispatcher thread.
struct PollingSchedule {
    shared: Arc<Shared>,
    poller: Option<JoinHandle<()>>,
}

impl Schedule for PollingSchedule {
    fn next(&self, lane: usize, max: usize, out: &mut Vec<usize>) -> bool {
        let Some(lane) = self.shared.slots.get(lane) else {
            return false;
        };
        let mut slot = lane.lock();
        if slot.closed {
            return false;
        }
        slot.wants = max.max(1);
        lane.wants.store(slot.wants, Ordering::Release);
        loop {
            if !slot.jobs.is_empty() {
                out.append(&mut slot.jobs);
                return true;
            }
            if slot.closed {
                return false;
            }
            slot = lane.ready.wait(slot).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn engine_failed(&self, engine: usize) -> Vec<usize> {
        let mut jobs: Vec<usize> = self
            .shared
            .slots
            .iter()
            .filter(|l| l.engine == engine)
            .flat_map(LaneSlot::close)
            .collect();
        jobs.extend(self.shared.queue.engine_failed(engine));
        jobs
    }
}

impl Drop for PollingSchedule {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(poller) = self.poller.take() {
            // The loop checks `stop` every round, so this returns promptly; a panic in
            // the loop has already released the lanes it could (nothing to add here).
            let _ = poller.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cipher::{Cipher, Direction};
    use crate::policy::tests::engines_a_and_b;
    use crate::policy::{EngineMask, JobMeta};

    fn jobs(n: usize, engines: u64) -> Vec<JobMeta> {
        (0..n)
            .map(|_| JobMeta {
                len: 16,
                cipher: Cipher::AES_128_CTR,
                direction: Direction::Encrypt,
                engines: EngineMask(engines),
            })
            .collect()
    }

    #[test]
    fn hands_every_job_once_then_closes() {
        let ((engines, lanes), jobs) = (engines_a_and_b(1), jobs(10, 0b11));
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let s = Polling.plan(&plan).unwrap();
        let mut got = Vec::new();
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..2)
                .map(|lane| {
                    let s = s.as_ref();
                    scope.spawn(move || {
                        let mut mine = Vec::new();
                        while s.next(lane, 3, &mut mine) {}
                        mine
                    })
                })
                .collect();
            for h in handles {
                got.extend(h.join().unwrap());
            }
        });
        got.sort_unstable();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn a_failed_engine_gives_back_its_jobs_and_its_lanes_are_released() {
        // Every job can run only on engine 1: when it fails, all come back.
        let ((engines, lanes), jobs) = (engines_a_and_b(1), jobs(5, 0b10));
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let s = Polling.plan(&plan).unwrap();
        let mut first = Vec::new();
        assert!(s.next(1, 2, &mut first));
        assert_eq!(first, vec![0, 1]);
        let mut back = s.engine_failed(1);
        back.sort_unstable();
        assert_eq!(back, vec![2, 3, 4]);
        assert!(
            !s.next(1, 1, &mut first),
            "a failed engine's lane gets nothing"
        );
        assert!(!s.next(0, 1, &mut first), "engine 0 can run none of these");
    }

    /// A failed engine's lanes get nothing more; the other engines' lanes go on
    /// with the jobs they can run (none is given back: another engine takes them).
    #[test]
    fn only_the_failed_engines_lanes_are_stopped() {
        let ((engines, lanes), jobs) = (engines_a_and_b(1), jobs(4, 0b11));
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let s = Polling.plan(&plan).unwrap();
        assert!(s.engine_failed(1).is_empty(), "engine 0 can run every job");
        let mut got = Vec::new();
        assert!(!s.next(1, 1, &mut got));
        while s.next(0, 1, &mut got) {}
        assert_eq!(got, [0, 1, 2, 3]);
    }

    /// Dropping the schedule ends the dispatcher thread even while lanes could still
    /// ask (the thread would otherwise poll for ever, holding the shared state).
    #[test]
    fn dropping_the_schedule_ends_the_dispatcher_thread() {
        let ((engines, lanes), jobs) = (engines_a_and_b(1), jobs(3, 0b11));
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        let s = PollingSchedule::start(&plan).unwrap();
        let shared = Arc::downgrade(&s.shared);
        drop(s);
        assert!(
            shared.upgrade().is_none(),
            "the dispatcher thread still holds the slots"
        );
    }

    /// Closing a slot hands back the jobs placed in it and not yet picked up (the
    /// lane was about to wake for them when its engine failed): they must not be lost.
    #[test]
    fn closing_a_slot_returns_the_jobs_it_held_and_stops_its_lane() {
        let lane = LaneSlot {
            engine: 1,
            wants: AtomicUsize::new(2),
            closed: AtomicBool::new(false),
            slot: Mutex::new(Slot {
                jobs: vec![4, 7],
                wants: 2,
                closed: false,
            }),
            ready: Condvar::new(),
        };
        assert_eq!(lane.close(), vec![4, 7]);
        assert!(lane.closed.load(Ordering::Acquire));
        assert_eq!(lane.wants.load(Ordering::Acquire), 0);
        let slot = lane.lock();
        assert!(slot.closed && slot.wants == 0 && slot.jobs.is_empty());
        drop(slot);
        assert!(lane.close().is_empty(), "handed back once");
    }

    #[test]
    fn the_dispatcher_thread_ends_when_dropped_or_when_all_slots_close() {
        let ((engines, lanes), jobs) = (engines_a_and_b(1), jobs(0, 0b11));
        let plan = Plan {
            jobs: &jobs,
            engines: &engines,
            lanes: &lanes,
            cores: 2,
        };
        // Dropped without any lane asking: the loop must still end (the test would
        // hang in `drop` otherwise).
        drop(Polling.plan(&plan).unwrap());
        let s = Polling.plan(&plan).unwrap();
        assert!(!s.next(0, 1, &mut Vec::new()));
        assert!(!s.next(1, 1, &mut Vec::new()));
        drop(s);
    }
}
