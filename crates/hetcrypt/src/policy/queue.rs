//! A lock-free job queue grouped by which engines can run each job, shared by the
//! policies that let lanes pull.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::{EngineMask, JobMeta};

/// One group: jobs that exactly the same engines can run, taken in order.
#[derive(Debug)]
struct Group {
    engines: EngineMask,
    jobs: JobList,
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
    /// Queues `indices` (increasing indices into `jobs`), restricted to the engines in
    /// `allowed`. Jobs no allowed engine can run are left out.
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

    /// Queues each `(job index, engines)` pair, indices increasing, with its own engine
    /// set (a policy that narrows where each job may go, e.g. `threshold`). Pairs with
    /// no engine are left out.
    pub fn from_masks(jobs: impl IntoIterator<Item = (usize, EngineMask)>) -> Self {
        let mut building: Vec<(EngineMask, ListBuilder)> = Vec::new();
        let mut add = |engines: EngineMask, run: Range<usize>| match building
            .iter_mut()
            .find(|(e, _)| *e == engines)
        {
            Some((_, list)) => list.extend(run),
            None => {
                let mut list = ListBuilder::default();
                list.extend(run);
                building.push((engines, list));
            }
        };
        // Consecutive jobs mostly share an engine set: gather them as a run and add the
        // run whole (per job, finding the group and appending to its list cost ~40
        // instructions under callgrind).
        let mut run: Option<(EngineMask, Range<usize>)> = None;
        for (i, engines) in jobs {
            if engines.is_empty() {
                continue;
            }
            if let Some((e, r)) = &mut run {
                if *e == engines && r.end == i {
                    r.end += 1;
                    continue;
                }
            }
            if let Some((e, r)) = run.replace((engines, i..i + 1)) {
                add(e, r);
            }
        }
        if let Some((e, r)) = run {
            add(e, r);
        }
        let mut groups: Vec<Group> = building
            .into_iter()
            .map(|(engines, jobs)| Group {
                engines,
                jobs: jobs.build(),
            })
            .collect();
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
            // A list gives fewer than asked only when it has run out.
            taken += g.jobs.take(max - taken, out);
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
            .find_map(|g| g.jobs.peek())
    }

    /// Jobs not yet taken (approximate while lanes are taking).
    pub fn remaining(&self) -> usize {
        self.groups.iter().map(|g| g.jobs.remaining()).sum()
    }

    /// Marks `engine` failed and takes out the jobs that no engine of this queue can
    /// run any more, so the dispatcher can run them elsewhere.
    pub fn engine_failed(&self, engine: usize) -> Vec<usize> {
        let bit = 1u64.checked_shl(engine as u32).unwrap_or(0);
        let failed = self.failed.fetch_or(bit, Ordering::Relaxed) | bit;
        let mut out = Vec::new();
        for g in self.groups.iter().filter(|g| g.engines.0 & !failed == 0) {
            out.extend(g.jobs.drain());
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

    /// The next job a take would return, without taking it.
    pub fn peek(&self) -> Option<usize> {
        let at = self.next.load(Ordering::Relaxed);
        match &self.members {
            Members::Run { first, len } => (at < *len).then(|| first + at),
            Members::Listed(jobs) => jobs.get(at).copied(),
        }
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

/// Gathers increasing job indices into a [`JobList`]: a run of consecutive indices
/// stays a run, and becomes a list only when an index breaks it.
#[derive(Debug, Default)]
pub struct ListBuilder {
    first: usize,
    len: usize,
    listed: Option<Vec<usize>>,
}

impl ListBuilder {
    /// Adds the jobs `run` (after every job added so far).
    pub fn extend(&mut self, run: Range<usize>) {
        match &mut self.listed {
            None if self.len == 0 => {
                self.first = run.start;
                self.len = run.len();
            }
            None if self.first + self.len == run.start => self.len += run.len(),
            None => {
                let mut jobs: Vec<usize> = (self.first..self.first + self.len).collect();
                jobs.extend(run);
                self.listed = Some(jobs);
            }
            Some(jobs) => jobs.extend(run),
        }
    }

    /// The list of every job added, in order.
    pub fn build(self) -> JobList {
        match self.listed {
            Some(jobs) => JobList::new(jobs),
            None => JobList::run(self.first, self.len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{EngineMask, GroupedQueue, JobList, ListBuilder};

    fn built(runs: &[std::ops::Range<usize>]) -> Vec<usize> {
        let mut b = ListBuilder::default();
        for r in runs {
            b.extend(r.clone());
        }
        let list = b.build();
        let mut out = Vec::new();
        list.take(usize::MAX, &mut out);
        out
    }

    #[test]
    fn a_builder_keeps_every_job_in_order() {
        assert_eq!(built(&[2..5, 5..7]), vec![2, 3, 4, 5, 6]);
        assert_eq!(built(&[0..3, 5..6, 6..8]), vec![0, 1, 2, 5, 6, 7]);
        assert_eq!(built(&[4..5, 9..10, 11..13]), vec![4, 9, 11, 12]);
        assert_eq!(built(&[]), Vec::<usize>::new());
        // 3 * 3 is 9: a run is continued only by the index right after its end.
        assert_eq!(built(&[3..6, 9..10]), vec![3, 4, 5, 9]);
    }

    #[test]
    fn a_grouped_queue_gives_each_job_once_exclusive_groups_first() {
        let (a, b) = (EngineMask(0b01), EngineMask(0b11));
        // Interleaved engine sets: runs of one, of two, and a gap (no engine).
        let masks = [b, a, a, b, b, EngineMask(0), a, b];
        let q = GroupedQueue::from_masks(masks.iter().copied().enumerate());
        assert_eq!(q.remaining(), 7);
        assert_eq!(q.peek(1), Some(0));
        let mut out = Vec::new();
        assert_eq!(q.take(0, 2, &mut out), 2);
        assert_eq!(q.take(0, 3, &mut out), 3);
        assert_eq!(out, vec![1, 2, 6, 0, 3]);
        let mut other = Vec::new();
        assert_eq!(q.take(1, 10, &mut other), 2);
        assert_eq!(other, vec![4, 7]);
        assert_eq!(q.take(0, 1, &mut out), 0);
        assert_eq!(q.remaining(), 0);
    }

    #[test]
    fn a_gap_in_the_indices_breaks_a_run_of_one_engine_set() {
        // Jobs 1 and 4 are not queued (a caller's own selection): jobs 0, 2, 3 and 5
        // share one engine set but are not one run.
        let m = EngineMask(0b1);
        let q = GroupedQueue::from_masks([(0, m), (2, m), (3, m), (5, m)]);
        assert_eq!(q.remaining(), 4);
        let mut out = Vec::new();
        assert_eq!(q.take(0, 10, &mut out), 4);
        assert_eq!(out, vec![0, 2, 3, 5]);
    }

    #[test]
    fn a_queue_knows_its_engines_and_peeks_without_taking() {
        let (ab, bc) = (EngineMask(0b011), EngineMask(0b110));
        let q = GroupedQueue::from_masks([(2, ab), (3, bc), (4, ab)]);
        assert_eq!(
            q.engines(),
            EngineMask(0b111),
            "every engine some job may go to"
        );
        assert_eq!(q.peek(0), Some(2));
        assert_eq!(q.peek(2), Some(3));
        assert_eq!(q.peek(3), None, "engine 3 runs none");
        let mut out = Vec::new();
        assert_eq!(q.take(0, 1, &mut out), 1);
        assert_eq!(q.peek(0), Some(4), "peeking took nothing");
        assert_eq!(q.take(0, 5, &mut out), 1);
        assert_eq!(out, vec![2, 4]);
        assert_eq!(q.peek(0), None);
        assert_eq!(q.peek(1), Some(3));
        assert!(GroupedQueue::from_masks([]).engines().is_empty());
    }

    #[test]
    fn a_list_peeks_at_its_next_job_until_it_runs_out() {
        let run = JobList::run(10, 3);
        let listed = JobList::new(vec![7, 3, 9]);
        for (list, order) in [(&run, [10, 11, 12]), (&listed, [7, 3, 9])] {
            let mut out = Vec::new();
            for want in order {
                assert_eq!(list.peek(), Some(want));
                assert_eq!(list.peek(), Some(want), "peeking takes nothing");
                assert_eq!(list.take(1, &mut out), 1);
            }
            assert_eq!(out, order);
            assert_eq!(list.peek(), None, "{order:?}: taken out");
        }
        let drained = JobList::run(4, 2);
        assert_eq!(drained.drain(), vec![4, 5]);
        assert_eq!(drained.peek(), None);
    }

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
        assert!(!JobList::run(3, 1).is_empty());
        assert!(!JobList::new(vec![0]).is_empty());
        assert!(JobList::new(Vec::new()).is_empty());
        assert_eq!(JobList::run(3, 0).take(4, &mut Vec::new()), 0);
    }
}
