//! A lock-free job queue grouped by which engines can run each job, shared by the
//! policies that let lanes pull.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::{EngineMask, JobMeta};

/// One group: jobs that exactly the same engines can run, taken in order.
#[derive(Debug)]
struct Group {
    engines: EngineMask,
    jobs: Vec<usize>,
    next: AtomicUsize,
}

/// Jobs grouped by engine set; a lane takes from the groups its engine belongs to,
/// the most exclusive group first (jobs only it can run before jobs others can share).
///
/// Taking is one atomic add on the group's cursor: no lock, no allocation.
#[derive(Debug)]
pub struct GroupedQueue {
    groups: Vec<Group>,
    failed: AtomicU64,
}

impl GroupedQueue {
    /// Queues `indices` (indices into `jobs`), restricted to the engines in `allowed`.
    /// Jobs no allowed engine can run are left out.
    pub fn new(
        jobs: &[JobMeta],
        indices: impl IntoIterator<Item = usize>,
        allowed: EngineMask,
    ) -> Self {
        Self::from_masks(
            indices
                .into_iter()
                .map(|i| (i, jobs[i].engines.intersect(allowed))),
        )
    }

    /// Queues each `(job index, engines)` pair with its own engine set (a policy that
    /// narrows where each job may go, e.g. `threshold`). Pairs with no engine are left
    /// out.
    pub fn from_masks(jobs: impl IntoIterator<Item = (usize, EngineMask)>) -> Self {
        let mut groups: Vec<Group> = Vec::new();
        for (i, engines) in jobs {
            if engines.is_empty() {
                continue;
            }
            match groups.iter_mut().find(|g| g.engines == engines) {
                Some(g) => g.jobs.push(i),
                None => groups.push(Group {
                    engines,
                    jobs: vec![i],
                    next: AtomicUsize::new(0),
                }),
            }
        }
        groups.sort_by_key(|g| g.engines.count());
        GroupedQueue {
            groups,
            failed: AtomicU64::new(0),
        }
    }

    /// Takes at most `max` jobs that `engine` can run into `out`; returns how many.
    pub fn take(&self, engine: usize, max: usize, out: &mut Vec<usize>) -> usize {
        let mut taken = 0;
        for g in self.groups.iter().filter(|g| g.engines.contains(engine)) {
            while taken < max {
                let want = max - taken;
                let start = g.next.fetch_add(want, Ordering::Relaxed);
                if start >= g.jobs.len() {
                    break;
                }
                let end = (start + want).min(g.jobs.len());
                out.extend_from_slice(&g.jobs[start..end]);
                taken += end - start;
            }
            if taken == max {
                break;
            }
        }
        taken
    }

    /// The engines that some queued job may go to.
    pub fn engines(&self) -> EngineMask {
        EngineMask(self.groups.iter().fold(0, |m, g| m | g.engines.0))
    }

    /// Peeks at the next job `engine` would take, without taking it.
    pub fn peek(&self, engine: usize) -> Option<usize> {
        self.groups
            .iter()
            .filter(|g| g.engines.contains(engine))
            .find_map(|g| g.jobs.get(g.next.load(Ordering::Relaxed)).copied())
    }

    /// Jobs not yet taken (approximate while lanes are taking).
    pub fn remaining(&self) -> usize {
        self.groups
            .iter()
            .map(|g| g.jobs.len().saturating_sub(g.next.load(Ordering::Relaxed)))
            .sum()
    }

    /// Marks `engine` failed and takes out the jobs that no engine of this queue can
    /// run any more, so the dispatcher can run them elsewhere.
    pub fn engine_failed(&self, engine: usize) -> Vec<usize> {
        let bit = 1u64.checked_shl(engine as u32).unwrap_or(0);
        let failed = self.failed.fetch_or(bit, Ordering::Relaxed) | bit;
        let mut out = Vec::new();
        for g in self.groups.iter().filter(|g| g.engines.0 & !failed == 0) {
            // Park the cursor far past the end so no lane takes from this group again;
            // half of usize::MAX leaves room for concurrent fetch_adds without overflow.
            let start = g.next.swap(usize::MAX / 2, Ordering::Relaxed);
            if start < g.jobs.len() {
                out.extend_from_slice(&g.jobs[start..]);
            }
        }
        out
    }
}

/// The engines of a plan that have lanes in this batch (engines that failed in an
/// earlier batch have none). Policies place jobs only on these, so a job no live engine
/// can run is never reserved (the dispatcher has already failed it with `NoEngine`).
pub fn live_engines(plan: &super::Plan<'_>) -> EngineMask {
    let mut mask = EngineMask::default();
    for (i, e) in plan.engines.iter().enumerate() {
        if e.lanes > 0 {
            mask.insert(i);
        }
    }
    mask
}

/// A fixed list of job indices taken front to back by concurrent lanes: one atomic add
/// per take, no lock. The building block of the policies that reserve jobs per engine
/// (`round-robin`) or per class of jobs (`adaptive`).
#[derive(Debug, Default)]
pub struct JobList {
    members: Members,
    next: AtomicUsize,
}

/// What a [`JobList`] holds: a run of consecutive job indices needs no list (a batch
/// of equal jobs, the usual case, is one such run per class; building its index list
/// was a few percent of a batch of tiny jobs), any other set is listed.
#[derive(Debug)]
enum Members {
    Run { first: usize, len: usize },
    Listed(Vec<usize>),
}

impl Default for Members {
    fn default() -> Self {
        Members::Listed(Vec::new())
    }
}

impl JobList {
    /// A list holding `jobs`, to be taken in this order.
    pub fn new(jobs: Vec<usize>) -> Self {
        JobList {
            members: Members::Listed(jobs),
            next: AtomicUsize::new(0),
        }
    }

    /// A list holding the `len` jobs `first, first + 1, ...`, in this order.
    pub fn run(first: usize, len: usize) -> Self {
        JobList {
            members: Members::Run { first, len },
            next: AtomicUsize::new(0),
        }
    }

    /// Appends the members at positions `start..end` (within bounds) to `out`.
    fn copy(&self, start: usize, end: usize, out: &mut Vec<usize>) {
        match &self.members {
            Members::Run { first, .. } => out.extend(first + start..first + end),
            Members::Listed(jobs) => out.extend_from_slice(&jobs[start..end]),
        }
    }

    /// Takes at most `max` jobs into `out`; returns how many.
    pub fn take(&self, max: usize, out: &mut Vec<usize>) -> usize {
        let len = self.len();
        if max == 0 || self.next.load(Ordering::Relaxed) >= len {
            return 0;
        }
        let start = self.next.fetch_add(max, Ordering::Relaxed);
        if start >= len {
            return 0;
        }
        let end = start.saturating_add(max).min(len);
        self.copy(start, end, out);
        end - start
    }

    /// Jobs not yet taken.
    pub fn remaining(&self) -> usize {
        self.len().saturating_sub(self.next.load(Ordering::Relaxed))
    }

    /// Takes every job not yet taken and closes the list for good.
    pub fn drain(&self) -> Vec<usize> {
        // Park the cursor far past the end (as `GroupedQueue::engine_failed` does): no
        // lane takes from this list again, and concurrent adds cannot overflow.
        let start = self.next.swap(usize::MAX / 2, Ordering::Relaxed);
        let mut out = Vec::new();
        if start < self.len() {
            self.copy(start, self.len(), &mut out);
        }
        out
    }

    /// Number of jobs the list was made with.
    pub fn len(&self) -> usize {
        match &self.members {
            Members::Run { len, .. } => *len,
            Members::Listed(jobs) => jobs.len(),
        }
    }

    /// Whether the list was made empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::JobList;

    /// Takes everything from `list` in pulls of `max`, then drains it.
    fn taken(list: &JobList, max: usize) -> (Vec<usize>, Vec<usize>) {
        let mut out = Vec::new();
        while list.take(max, &mut out) > 0 && out.len() < 5 {}
        (out, list.drain())
    }

    #[test]
    fn a_run_and_the_same_jobs_listed_are_taken_alike() {
        for max in [1, 2, 3, 7] {
            let run = JobList::run(10, 6);
            let listed = JobList::new((10..16).collect());
            assert_eq!(run.len(), 6);
            assert_eq!(run.remaining(), listed.remaining());
            let (a, rest_a) = taken(&run, max);
            let (b, rest_b) = taken(&listed, max);
            assert_eq!((&a, &rest_a), (&b, &rest_b), "max {max}");
            let mut all = a;
            all.extend(rest_a);
            assert_eq!(all, (10..16).collect::<Vec<_>>());
            assert_eq!(run.remaining(), 0);
            assert_eq!(run.take(max, &mut Vec::new()), 0);
            assert!(run.drain().is_empty());
        }
        assert!(JobList::run(3, 0).is_empty());
        assert_eq!(JobList::run(3, 0).take(4, &mut Vec::new()), 0);
    }
}
