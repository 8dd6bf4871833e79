//! The cost model behind `adaptive` (and the calibrating `threshold`): what one job of
//! a class costs on one lane of each engine, learned from measurements, and the rule that
//! decides from it which class a free lane should take next.
//!
//! **Estimates.** Jobs are grouped into *classes* (cipher, direction, and a log2 size
//! bucket; see [`bucket`]). For every engine and class the model keeps a running
//! estimate of one job's wall time on one lane and of the CPU time the lane's thread
//! spent on it — per-size history rather than a fitted line, because real engines are
//! not linear (a device has a request floor, caches fall off at some size) and a bucket
//! never extrapolates from other sizes. The first sample of each estimate is thrown away
//! (it pays for the key schedule, the socket's `setkey`, cold caches); later samples
//! enter an exponential moving average, so the estimate follows load changes.
//!
//! **Placement rule** ([`decide`]). A free lane of engine `me` may take a job of class `q`
//! only if
//! 1. *cost rule* — the engine's cost is not worse than it would be elsewhere: when the
//!    host is oversubscribed (more lanes use the CPU than there are cores), the CPU time
//!    a module lane spends driving its device (syscalls, copies) is taken from the CPU
//!    lanes; a module job is then worth taking only if that stolen CPU time is less than
//!    the CPU time a CPU lane would spend doing the job itself; and
//! 2. *end-game rule* — it will finish the job before the other lanes would have finished
//!    all the remaining work anyway (fluid estimate over their measured rates); a slow
//!    engine therefore stops taking work as the batch ends instead of holding the last
//!    job while everyone waits.
//!
//! Among the classes it may take, the lane picks the one where its engine is relatively
//! best (largest ratio of the best other engine's cost to its own), largest jobs first on
//! ties: a module takes the big jobs and leaves the small ones to the CPU, as the
//! optimal fluid split of unrelated machines does. Lanes of the fastest engine for a
//! class never decline it, so some lane always makes progress.
//!
//! **Exploration.** An engine with no estimate for a class takes up to [`PROBES`] probe
//! jobs of it, smallest classes first, only while the batch is large enough for the
//! probes to overlap other work, and — once the engine knows a smaller size of the same
//! cipher — only if even a pessimistic extrapolation from that size (cost proportional to
//! length, an upper bound for any cost of the form fixed + per-byte) finishes before the
//! other lanes would finish the remaining work: a probe can then not delay the batch.
//! An engine that declines a class may re-measure it once per batch, only when the
//! remaining work is at least [`REPROBE_RATIO`] times the probe's estimated cost, which
//! bounds the price of keeping estimates fresh to a few percent.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::policy::EngineMask;

/// Size bucket of a job of `len` bytes: 0 for an empty job, otherwise
/// `floor(log2(len)) + 1`, so bucket `b` holds lengths in `[2^(b-1), 2^b)`. Within a
/// bucket sizes differ by at most 2x; the seeds' sizes (8 B ... 16 KiB, powers of 2)
/// each get a bucket of their own.
pub fn bucket(len: usize) -> usize {
    (usize::BITS - len.leading_zeros()) as usize
}

/// The smallest length in bucket `b` (inverse of [`bucket`] at the bucket's floor).
pub fn bucket_floor(b: usize) -> usize {
    match b {
        0 => 0,
        b => 1usize.checked_shl(b as u32 - 1).unwrap_or(usize::MAX),
    }
}

/// Estimated cost of one job on one lane.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost {
    /// Wall time from taking the job to finishing it, in seconds.
    pub wall: f64,
    /// CPU time the lane's thread spent on it, in seconds.
    pub cpu: f64,
}

/// Weight of a new sample in the moving average: about the last eight samples matter,
/// enough to smooth scheduler jitter, few enough to follow a load change within a few
/// dozen jobs.
pub const ALPHA: f64 = 0.125;

/// Samples an estimate needs before it is trusted: the first is discarded (warm-up).
pub const MIN_SAMPLES: u32 = 2;

/// Probe jobs an engine may start on a class it has no estimate for (one more than
/// [`MIN_SAMPLES`], so a lane whose first probe is slow still gets its second sample
/// while another lane of the engine holds the third).
pub const PROBES: usize = 3;

/// Probing an unknown engine is allowed only while at least this many jobs per lane
/// remain: a probe then overlaps other lanes' work instead of ending the batch late.
pub const PROBE_MIN_REMAINING_PER_LANE: usize = 4;

/// A declined class is re-measured at most once per batch, and only when the others'
/// remaining work is at least this many times the probe's cost (wall plus CPU): the
/// re-probe then costs at most 1/50 = 2% of the batch.
pub const REPROBE_RATIO: f64 = 50.0;

/// A running estimate of one engine's cost for one class.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    wall: f64,
    cpu: f64,
    samples: u32,
}

impl Estimate {
    /// Adds one job's measured wall and CPU time (seconds).
    pub fn observe(&mut self, wall: f64, cpu: f64) {
        // The first sample is only a placeholder; the second replaces it (warm-up
        // discarded); from then on the moving average.
        if self.samples < MIN_SAMPLES {
            self.wall = wall;
            self.cpu = cpu;
        } else {
            self.wall += ALPHA * (wall - self.wall);
            self.cpu += ALPHA * (cpu - self.cpu);
        }
        self.samples = self.samples.saturating_add(1);
    }

    /// The estimate, once it has [`MIN_SAMPLES`] samples.
    pub fn cost(&self) -> Option<Cost> {
        (self.samples >= MIN_SAMPLES).then_some(Cost {
            wall: self.wall,
            cpu: self.cpu,
        })
    }

    /// Samples seen so far.
    pub fn samples(&self) -> u32 {
        self.samples
    }
}

/// An [`Estimate`] that the lanes of one engine update concurrently without a lock.
///
/// Each field is its own atomic and an update is load-compute-store, so two lanes
/// finishing at the same instant can lose one sample of the average — harmless for an
/// estimate, and it keeps a lock off the per-job path.
#[derive(Debug, Default)]
pub struct SharedEstimate {
    wall: AtomicU64,
    cpu: AtomicU64,
    samples: AtomicU32,
}

impl SharedEstimate {
    /// Starts from a stored estimate.
    pub fn new(e: Estimate) -> Self {
        SharedEstimate {
            wall: AtomicU64::new(e.wall.to_bits()),
            cpu: AtomicU64::new(e.cpu.to_bits()),
            samples: AtomicU32::new(e.samples),
        }
    }

    /// The current value.
    pub fn get(&self) -> Estimate {
        Estimate {
            wall: f64::from_bits(self.wall.load(Ordering::Relaxed)),
            cpu: f64::from_bits(self.cpu.load(Ordering::Relaxed)),
            samples: self.samples.load(Ordering::Acquire),
        }
    }

    /// Adds one job's measured wall and CPU time; returns whether this sample made the
    /// estimate usable (so waiting lanes can reconsider).
    pub fn observe(&self, wall: f64, cpu: f64) -> bool {
        let mut e = self.get();
        e.observe(wall, cpu);
        self.wall.store(e.wall.to_bits(), Ordering::Relaxed);
        self.cpu.store(e.cpu.to_bits(), Ordering::Relaxed);
        let before = self.samples.fetch_add(1, Ordering::Release);
        before + 1 == MIN_SAMPLES
    }

    /// The estimate, once usable.
    pub fn cost(&self) -> Option<Cost> {
        self.get().cost()
    }
}

/// What the placement rule sees of a batch at one moment.
pub trait View {
    /// Number of engines.
    fn engines(&self) -> usize;
    /// Lanes of engine `e` still working in this batch (0 once it failed).
    fn lanes(&self, e: usize) -> usize;
    /// Whether engine `e`'s lanes keep a host core busy (software engines).
    fn uses_host_cpu(&self, e: usize) -> bool;
    /// Fraction of a module lane's CPU time that is taken from CPU lanes: 0 when the
    /// host has a core for every lane, 1 when the CPU lanes alone fill every core.
    fn steal(&self) -> f64;
    /// Number of job classes.
    fn classes(&self) -> usize;
    /// The engines that may run class `q`.
    fn class_engines(&self, q: usize) -> EngineMask;
    /// Jobs of class `q` not yet taken.
    fn remaining(&self, q: usize) -> usize;
    /// Size bucket of class `q`.
    fn bucket(&self, q: usize) -> usize;
    /// Length of the longest job of class `q`.
    fn max_len(&self, q: usize) -> usize;
    /// Engine `e`'s estimated cost for class `q`, once known.
    fn cost(&self, e: usize, q: usize) -> Option<Cost>;
    /// Probe jobs engine `e` has started on class `q` while it had no estimate.
    fn probes(&self, e: usize, q: usize) -> usize;
    /// Whether engine `e` may still re-measure class `q` in this batch.
    fn may_reprobe(&self, e: usize, q: usize) -> bool;
    /// Engine `e`'s estimate for the largest size bucket below class `q`'s with the same
    /// cipher and direction, with that bucket.
    fn smaller_known(&self, e: usize, q: usize) -> Option<(usize, Cost)>;
}

/// A pessimistic estimate of engine `me`'s cost for a job of class `q` from the largest
/// smaller size it knows: cost proportional to length, from the smallest length of the
/// known bucket to the longest job of `q`. An upper bound whenever cost is fixed +
/// per-byte with both parts non-negative.
fn upper_bound<V: View + ?Sized>(v: &V, me: usize, q: usize) -> Option<f64> {
    let (known, c) = v.smaller_known(me, q)?;
    let from = bucket_floor(known).max(1) as f64;
    Some(c.wall * v.max_len(q) as f64 / from)
}

/// What a free lane should do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Take jobs of this class.
    Take(usize),
    /// Take one job of this class to measure it (count it as a probe).
    Probe(usize),
    /// Jobs this lane could run remain, but others will finish them sooner: wait for
    /// the situation to change.
    Wait,
    /// Nothing left that this lane's engine can run.
    Done,
}

/// Whether engine `e` passes the cost rule for class `q`: a module (an engine that does
/// not use the host CPU) whose CPU time per job, as far as it is taken from the CPU lanes,
/// is not less than what the best CPU engine spends doing the job itself, is not worth it.
fn cost_rule<V: View + ?Sized>(v: &V, e: usize, q: usize, steal: f64) -> bool {
    if v.uses_host_cpu(e) || steal <= 0.0 {
        return true;
    }
    let Some(mine) = v.cost(e, q) else {
        return true;
    };
    let mask = v.class_engines(q);
    let host = (0..v.engines())
        .filter(|&h| h != e && mask.contains(h) && v.lanes(h) > 0 && v.uses_host_cpu(h))
        .filter_map(|h| v.cost(h, q))
        .map(|c| c.cpu)
        .fold(f64::INFINITY, f64::min);
    // No CPU engine with an estimate: nothing to compare with.
    !host.is_finite() || steal * mine.cpu < host
}

/// Jobs per second that every lane but one lane of `me` completes on class `q`, counting
/// only engines with an estimate that pass the cost rule.
fn others_rate<V: View + ?Sized>(v: &V, me: usize, q: usize, steal: f64) -> f64 {
    let mask = v.class_engines(q);
    let mut rate = 0.0;
    for e in (0..v.engines()).filter(|&e| mask.contains(e)) {
        let lanes = v.lanes(e) - usize::from(e == me).min(v.lanes(e));
        if lanes == 0 || !cost_rule(v, e, q, steal) {
            continue;
        }
        if let Some(c) = v.cost(e, q) {
            if c.wall > 0.0 {
                rate += lanes as f64 / c.wall;
            }
        }
    }
    rate
}

/// The placement rule (see the module documentation): what a free lane of engine `me`
/// should do now.
pub fn decide<V: View + ?Sized>(v: &V, me: usize) -> Decision {
    if v.lanes(me) == 0 {
        return Decision::Done;
    }
    let steal = v.steal();
    // Time the other lanes would need for all remaining work (fluid estimate), and how
    // much remains.
    let mut others_time = 0.0;
    let mut remaining = 0;
    let mut mine = false;
    for q in 0..v.classes() {
        let n = v.remaining(q);
        if n == 0 {
            continue;
        }
        remaining += n;
        mine |= v.class_engines(q).contains(me);
        let rate = others_rate(v, me, q, steal);
        if rate > 0.0 {
            others_time += n as f64 / rate;
        }
    }
    if !mine {
        return Decision::Done;
    }
    let lanes: usize = (0..v.engines()).map(|e| v.lanes(e)).sum();
    let may_probe = remaining >= PROBE_MIN_REMAINING_PER_LANE * lanes;

    // (advantage, bucket, class) of the best class to take; (bucket, class) of the
    // smallest class to probe.
    let mut best: Option<(f64, usize, usize)> = None;
    let mut probe: Option<(usize, usize)> = None;
    for q in 0..v.classes() {
        let mask = v.class_engines(q);
        if v.remaining(q) == 0 || !mask.contains(me) {
            continue;
        }
        // The fastest eligible other engine (for the advantage) and the fastest other
        // lane, own engine included (no lane can finish a job sooner than that).
        let mut others_exist = false;
        let mut others_known = false;
        let mut best_other_engine = f64::INFINITY;
        for e in (0..v.engines()).filter(|&e| e != me && mask.contains(e) && v.lanes(e) > 0) {
            others_exist = true;
            if let Some(c) = v.cost(e, q) {
                others_known = true;
                if cost_rule(v, e, q, steal) {
                    best_other_engine = best_other_engine.min(c.wall);
                }
            }
        }
        if !others_exist {
            // Only this engine can run these: they are ours whatever they cost.
            return Decision::Take(q);
        }
        let Some(c) = v.cost(me, q) else {
            if may_probe
                && v.probes(me, q) < PROBES
                && probe.is_none_or(|p| v.bucket(q) < p.0)
                && upper_bound(v, me, q).is_none_or(|t| t <= others_time)
            {
                probe = Some((v.bucket(q), q));
                continue;
            }
            if !others_known {
                // Nobody knows better: share the class as `pull` would.
                return Decision::Take(q);
            }
            continue;
        };
        let mut fastest_other_lane = best_other_engine;
        if v.lanes(me) > 1 {
            fastest_other_lane = fastest_other_lane.min(c.wall);
        }
        let horizon = others_time.max(fastest_other_lane);
        if !cost_rule(v, me, q, steal) || c.wall > horizon {
            if v.may_reprobe(me, q) && others_time >= REPROBE_RATIO * (c.wall + c.cpu) {
                return Decision::Probe(q);
            }
            continue;
        }
        let advantage = if c.wall > 0.0 {
            best_other_engine / c.wall
        } else {
            f64::INFINITY
        };
        let candidate = (advantage, v.bucket(q), q);
        if best.is_none_or(|b| (candidate.0, candidate.1) > (b.0, b.1)) {
            best = Some(candidate);
        }
    }
    match (probe, best) {
        (Some((_, q)), _) => Decision::Probe(q),
        (None, Some((_, _, q))) => Decision::Take(q),
        (None, None) => Decision::Wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_powers_of_two() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 1);
        assert_eq!(bucket(8), 4);
        assert_eq!(bucket(15), 4);
        assert_eq!(bucket(16), 5);
        assert_eq!(bucket(16 * 1024), 15);
        for b in 0..40 {
            assert_eq!(bucket(bucket_floor(b)), b);
            if b > 0 {
                assert_eq!(bucket(bucket_floor(b) - 1), b - 1);
            }
        }
    }

    #[test]
    fn estimate_discards_warm_up_then_averages() {
        let mut e = Estimate::default();
        e.observe(1.0, 0.5); // cold: key schedule, first socket use
        assert_eq!(e.cost(), None);
        e.observe(0.01, 0.005);
        assert_eq!(
            e.cost(),
            Some(Cost {
                wall: 0.01,
                cpu: 0.005
            })
        );
        for _ in 0..200 {
            e.observe(0.02, 0.001);
        }
        let c = e.cost().unwrap();
        assert!((c.wall - 0.02).abs() < 1e-9 && (c.cpu - 0.001).abs() < 1e-9);
        let shared = SharedEstimate::new(Estimate::default());
        assert!(!shared.observe(1.0, 1.0));
        assert!(
            shared.observe(2.0, 1.0),
            "the second sample makes it usable"
        );
        assert_eq!(shared.cost().unwrap().wall, 2.0);
    }

    /// A synthetic engine: per-job wall and CPU time as fixed + per-byte cost.
    #[derive(Clone, Copy)]
    struct SynthEngine {
        lanes: usize,
        host: bool,
        fixed: f64,
        per_byte: f64,
        cpu_fixed: f64,
        cpu_per_byte: f64,
    }

    impl SynthEngine {
        fn wall(&self, len: usize) -> f64 {
            self.fixed + self.per_byte * len as f64
        }
        fn cpu(&self, len: usize) -> f64 {
            self.cpu_fixed + self.cpu_per_byte * len as f64
        }
    }

    /// The model's view of a simulated batch; estimates persist across batches.
    struct Sim {
        engines: Vec<SynthEngine>,
        cores: usize,
        /// (length, remaining) per class; every class runs on every engine.
        classes: Vec<(usize, usize)>,
        est: Vec<Vec<Estimate>>,
        probes: Vec<Vec<usize>>,
        reprobe: Vec<Vec<bool>>,
    }

    impl View for Sim {
        fn engines(&self) -> usize {
            self.engines.len()
        }
        fn lanes(&self, e: usize) -> usize {
            self.engines[e].lanes
        }
        fn uses_host_cpu(&self, e: usize) -> bool {
            self.engines[e].host
        }
        fn steal(&self) -> f64 {
            let count = |host: bool| -> usize {
                self.engines
                    .iter()
                    .filter(|e| e.host == host)
                    .map(|e| e.lanes)
                    .sum()
            };
            let (cpu, module) = (count(true), count(false));
            if module == 0 {
                return 0.0;
            }
            ((cpu + module).saturating_sub(self.cores) as f64 / module as f64).min(1.0)
        }
        fn classes(&self) -> usize {
            self.classes.len()
        }
        fn class_engines(&self, _q: usize) -> EngineMask {
            EngineMask(u64::MAX)
        }
        fn remaining(&self, q: usize) -> usize {
            self.classes[q].1
        }
        fn bucket(&self, q: usize) -> usize {
            bucket(self.classes[q].0)
        }
        fn max_len(&self, q: usize) -> usize {
            self.classes[q].0
        }
        fn cost(&self, e: usize, q: usize) -> Option<Cost> {
            self.est[e][q].cost()
        }
        fn probes(&self, e: usize, q: usize) -> usize {
            self.probes[e][q]
        }
        fn may_reprobe(&self, e: usize, q: usize) -> bool {
            self.reprobe[e][q]
        }
        fn smaller_known(&self, e: usize, q: usize) -> Option<(usize, Cost)> {
            (0..self.classes.len())
                .filter(|&k| self.bucket(k) < self.bucket(q))
                .filter_map(|k| Some((self.bucket(k), self.est[e][k].cost()?)))
                .max_by_key(|k| k.0)
        }
    }

    /// What a simulated batch did.
    #[derive(Debug)]
    struct Outcome {
        makespan: f64,
        /// Jobs per engine and class.
        jobs: Vec<Vec<usize>>,
    }

    impl Sim {
        fn new(engines: Vec<SynthEngine>, cores: usize, lens: &[usize]) -> Self {
            let (ne, nq) = (engines.len(), lens.len());
            Sim {
                engines,
                cores,
                classes: lens.iter().map(|&l| (l, 0)).collect(),
                est: vec![vec![Estimate::default(); nq]; ne],
                probes: vec![vec![0; nq]; ne],
                reprobe: vec![vec![true; nq]; ne],
            }
        }

        /// Runs a batch of `counts[q]` jobs per class, event by event, with the rule
        /// deciding for each lane that becomes free. A module job's CPU time (times the
        /// steal fraction) delays a busy CPU lane. Panics if every lane waits forever.
        fn run(&mut self, counts: &[usize]) -> Outcome {
            for (c, &n) in self.classes.iter_mut().zip(counts) {
                c.1 = n;
            }
            let nq = self.classes.len();
            for e in 0..self.engines.len() {
                self.probes[e] = vec![0; nq];
                self.reprobe[e] = vec![true; nq];
            }
            // (engine, free at, busy, done)
            let mut lanes: Vec<(usize, f64, bool, bool)> = Vec::new();
            for (e, eng) in self.engines.iter().enumerate() {
                lanes.extend((0..eng.lanes).map(|_| (e, 0.0, false, false)));
            }
            // Measurements land when a job completes: (time, engine, class, wall, cpu).
            let mut pending: Vec<(f64, usize, usize, f64, f64)> = Vec::new();
            let mut jobs = vec![vec![0; nq]; self.engines.len()];
            let mut makespan: f64 = 0.0;
            let mut stalls = 0;
            let steal = self.steal();
            while let Some(l) = (0..lanes.len())
                .filter(|&l| !lanes[l].3)
                .min_by(|&a, &b| lanes[a].1.total_cmp(&lanes[b].1))
            {
                let now = lanes[l].1;
                lanes[l].2 = false;
                pending.retain(|&(t, e, q, w, c)| {
                    if t <= now {
                        self.est[e][q].observe(w, c);
                    }
                    t > now
                });
                let e = lanes[l].0;
                match decide(self, e) {
                    decision @ (Decision::Take(q) | Decision::Probe(q)) => {
                        if decision == Decision::Probe(q) {
                            if self.est[e][q].cost().is_none() {
                                self.probes[e][q] += 1;
                            } else {
                                self.reprobe[e][q] = false;
                            }
                        }
                        self.classes[q].1 -= 1;
                        jobs[e][q] += 1;
                        let eng = self.engines[e];
                        let len = self.classes[q].0;
                        let (wall, cpu) = (eng.wall(len), eng.cpu(len));
                        lanes[l].1 = now + wall;
                        lanes[l].2 = true;
                        makespan = makespan.max(now + wall);
                        pending.push((now + wall, e, q, wall, cpu));
                        if !eng.host && steal > 0.0 {
                            // The module's driver CPU time comes out of a busy CPU lane.
                            if let Some(victim) = (0..lanes.len())
                                .filter(|&v| lanes[v].2 && self.engines[lanes[v].0].host)
                                .min_by(|&a, &b| lanes[a].1.total_cmp(&lanes[b].1))
                            {
                                lanes[victim].1 += steal * cpu;
                                makespan = makespan.max(lanes[victim].1);
                            }
                        }
                        stalls = 0;
                    }
                    Decision::Wait => {
                        let next = lanes
                            .iter()
                            .filter(|x| x.2 && x.1 > now)
                            .map(|x| x.1)
                            .fold(f64::INFINITY, f64::min);
                        stalls += 1;
                        assert!(
                            next.is_finite() || stalls <= 2 * lanes.len(),
                            "every lane waits: deadlock"
                        );
                        lanes[l].1 = if next.is_finite() { next } else { now + 1e-9 };
                    }
                    Decision::Done => lanes[l].3 = true,
                }
            }
            assert!(self.classes.iter().all(|c| c.1 == 0), "jobs left over");
            for (_, e, q, w, c) in pending.drain(..) {
                self.est[e][q].observe(w, c);
            }
            Outcome { makespan, jobs }
        }
    }

    const SMALL: usize = 64;
    const LARGE: usize = 16 * 1024;

    /// The seeds' single-core board: a slow software CPU and a module with a ~200 µs
    /// request floor whose driver costs 30 µs of the only core per request.
    fn board() -> Sim {
        let cpu = SynthEngine {
            lanes: 1,
            host: true,
            fixed: 1e-6,
            per_byte: 1.0 / 20e6,
            cpu_fixed: 1e-6,
            cpu_per_byte: 1.0 / 20e6,
        };
        let module = SynthEngine {
            lanes: 1,
            host: false,
            fixed: 200e-6,
            per_byte: 1.0 / 100e6,
            cpu_fixed: 30e-6,
            cpu_per_byte: 1.0 / 1e9,
        };
        Sim::new(vec![cpu, module], 1, &[SMALL, LARGE])
    }

    #[test]
    fn slow_fixed_cost_module_gets_no_small_jobs_and_a_share_of_large_ones() {
        let mut sim = board();
        // First batch: both engines probe both classes.
        sim.run(&[500, 100]);
        let (cpu, module) = (sim.engines[0], sim.engines[1]);

        // Small jobs only: the module's driver time exceeds the CPU's cost per job.
        let small = sim.run(&[2000, 0]);
        assert_eq!(small.jobs[1][0], 0, "{small:?}");
        let cpu_alone = 2000.0 * cpu.wall(SMALL);
        assert!(small.makespan <= cpu_alone * 1.001, "{small:?}");

        // Large jobs only: both engines help. The ideal (fluid) finish time counts the
        // module's driver time as lost to the CPU lane.
        let large = sim.run(&[0, 400]);
        let share = large.jobs[1][1] as f64 / 400.0;
        let module_rate = 1.0 / module.wall(LARGE);
        let cpu_rate = (1.0 - module_rate * module.cpu(LARGE)) / cpu.wall(LARGE);
        let ideal = 400.0 / (module_rate + cpu_rate);
        let ideal_share = module_rate / (module_rate + cpu_rate);
        assert!(
            (share - ideal_share).abs() < 0.1,
            "share {share}, ideal {ideal_share}"
        );
        assert!(large.makespan <= ideal * 1.1, "{large:?}, ideal {ideal}");
        let best_single = 400.0 * module.wall(LARGE).min(cpu.wall(LARGE));
        assert!(large.makespan < best_single, "{large:?}");

        // Mixed: the module takes only large jobs, but for the one re-measurement of
        // the small class a batch this long affords (REPROBE_RATIO).
        let mixed = sim.run(&[2000, 200]);
        assert!(mixed.jobs[1][0] <= 1, "{mixed:?}");
        assert!(mixed.jobs[1][1] > 0, "{mixed:?}");
    }

    /// A fast AES-NI host with a spare core (no CPU stolen) beside the same module: the
    /// module may help, never delays the end, and prefers the large jobs.
    #[test]
    fn never_slower_than_the_best_single_engine_and_large_jobs_go_to_the_module() {
        let cpu = SynthEngine {
            lanes: 2,
            host: true,
            fixed: 0.5e-6,
            per_byte: 1.0 / 1e9,
            cpu_fixed: 0.5e-6,
            cpu_per_byte: 1.0 / 1e9,
        };
        let module = SynthEngine {
            lanes: 1,
            host: false,
            fixed: 200e-6,
            per_byte: 1.0 / 100e6,
            cpu_fixed: 30e-6,
            cpu_per_byte: 1.0 / 1e9,
        };
        let mut sim = Sim::new(vec![cpu, module], 4, &[SMALL, LARGE]);
        sim.run(&[500, 100]);
        // Only a batch long enough to absorb a worst-case probe teaches the module the
        // large size (its small-size cost extrapolates to ~51 ms per 16 KiB job).
        sim.run(&[0, 8000]);
        assert!(sim.est[1][1].cost().is_some());
        for counts in [[4000, 0], [0, 400], [4000, 100], [10, 1]] {
            let out = sim.run(&counts);
            let cpu_alone =
                (counts[0] as f64 * cpu.wall(SMALL) + counts[1] as f64 * cpu.wall(LARGE)) / 2.0;
            // Half a CPU job of slack: the simulation's lanes are discrete.
            assert!(
                out.makespan <= cpu_alone + cpu.wall(LARGE),
                "{counts:?}: {out:?} vs cpu alone {cpu_alone}"
            );
            if counts == [4000, 100] {
                // Large jobs are where the module is relatively best.
                assert!(
                    out.jobs[1][1] > 0 && out.jobs[1][0] <= 1,
                    "{counts:?}: {out:?}"
                );
            }
        }
    }

    /// Where the module is faster than the CPU at every size, the CPU still helps with
    /// small jobs and leaves the module the large ones; the rule never deadlocks.
    #[test]
    fn a_slow_cpu_helps_without_holding_the_last_job() {
        let cpu = SynthEngine {
            lanes: 1,
            host: true,
            fixed: 1e-6,
            per_byte: 1.0 / 5e6,
            cpu_fixed: 1e-6,
            cpu_per_byte: 1.0 / 5e6,
        };
        let module = SynthEngine {
            lanes: 4,
            host: false,
            fixed: 5e-6,
            per_byte: 1.0 / 400e6,
            cpu_fixed: 2e-6,
            cpu_per_byte: 0.0,
        };
        let mut sim = Sim::new(vec![cpu, module], 8, &[SMALL, LARGE]);
        sim.run(&[200, 50]);
        let out = sim.run(&[100, 100]);
        let module_alone =
            (100.0 * module.wall(SMALL) + 100.0 * module.wall(LARGE)) / module.lanes as f64;
        assert!(
            out.makespan <= module_alone * 1.001,
            "{out:?} vs {module_alone}"
        );
        assert!(
            out.jobs[0][1] <= 1,
            "{out:?}: the CPU should leave large jobs"
        );
    }
}
