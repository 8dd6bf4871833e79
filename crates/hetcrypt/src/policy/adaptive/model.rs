//! The cost model behind `adaptive` (and the calibrating `threshold`): what one job of
//! a class costs on one lane of each engine, and the rule that decides from it which
//! class a free lane should take next.
//!
//! **Estimates.** Per engine and class (cipher, direction, log2 size [`bucket`]) a
//! running estimate of one job's wall time on one lane: per-size history, not a fitted
//! line, since real engines are not linear. It starts from the store
//! ([`Estimate::seeded`]) or from probe jobs (the first thrown away: key set-up, cold
//! caches), then follows the load as a moving average. Timing noise only adds time, so
//! a sample counts at most [`OUTLIER_CAP`] times the estimate and one far below it at
//! least half ([`FAST_DOWN`]).
//!
//! **Placement rule** ([`decide`]). A free lane of engine `me` may take a job of class
//! `q` only if
//! 1. *cost rule* — when every lane has a core, any engine may; on an oversubscribed
//!    host, the class's best single engine may, and another only if the calibration
//!    measured both side by side at least [`MIX_GAIN`] over the other alone; and
//! 2. *end-game rule* — it will finish the job before the other lanes would finish all
//!    the remaining work anyway (fluid estimate), so a slow engine stops as the batch
//!    ends instead of holding the last job.
//!
//! The lane takes the class where its engine is relatively best (the best other
//! engine's cost over its own), largest jobs first on ties. The best single engine
//! always passes the cost rule, and the fastest lane among those that pass always
//! passes the end-game rule, so some lane always makes progress.
//!
//! **Exploration.** An engine with no estimate takes up to [`PROBES`] probe jobs of a
//! class, smallest first, while the batch is large enough to hide them. A declined
//! engine re-measures a class with [`CHECK_PULLS`] pulls ([`Estimate::check`]) while
//! the other engines' lanes wait ([`View::held`]), where the batch has enough other
//! work ([`REMEASURE_RATIO`]): every [`REMEASURE_EVERY`] batches, and sooner where the
//! schedule says its estimate was never measured alone or grew since (a wrong store).

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
    b.checked_sub(1)
        .map_or(0, |s| 1usize.checked_shl(s as u32).unwrap_or(usize::MAX))
}

/// Estimated cost of one job on one lane.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Cost {
    /// Wall time from taking the job to finishing it, in seconds.
    pub wall: f64,
    /// CPU time the lane's thread spent on it, in seconds (`adaptive` books its lanes'
    /// wall time here too; a seeded estimate has the calibration's).
    pub cpu: f64,
}

/// Samples the moving average spans: enough to smooth scheduler jitter, few enough to
/// follow a load change within a few dozen jobs.
pub const WINDOW: u32 = 8;

/// Once an estimate is usable, a sample counts at most this many times it: a lane
/// descheduled for a while (a 280 ms stall in a 25 ms batch in the testbed) is not the
/// engine's cost; a real change of load still comes through, by this factor a sample.
pub const OUTLIER_CAP: f64 = 4.0;

/// A sample below 1/`FAST_DOWN` of the estimate counts at least half: timing noise only
/// adds time, so such a sample says the estimate is inflated (at the plain weight, the
/// testbed module's slow first 16 KiB probes took 11 batches to wash out).
pub const FAST_DOWN: f64 = 1.5;

/// Samples an estimate needs before it is trusted: the first is discarded (warm-up).
pub const MIN_SAMPLES: u32 = 2;

/// Probe jobs an engine may start on a class it has no estimate for (one more than
/// [`MIN_SAMPLES`], so a lane whose first probe is slow still gets its second sample
/// while another lane of the engine holds the third).
pub const PROBES: usize = 3;

/// Probing an unknown engine is allowed only while at least this many jobs per lane
/// remain: a probe then overlaps other lanes' work instead of ending the batch late.
pub const PROBE_MIN_REMAINING_PER_LANE: usize = 4;

/// Once an engine knows a smaller size of the same cipher, it probes a larger one only
/// if this many times its pessimistic estimate (cost in proportion to length) fits in
/// the others' remaining work: the lanes beside a probe slow it (a testbed module probe
/// extrapolated at 2 ms took 7.7 ms beside the CPU lane).
pub const PROBE_SAFETY: f64 = 4.0;

/// A declined engine re-measures a class (one pull) only when the others' remaining
/// work is at least this many times the pull's cost plus its lanes' start
/// ([`View::start_cost`], the whole of it: the batch that re-measures pays it). The
/// start counted a share of one (an eighth) until the twenty-eighth session, when the
/// soft guest's short runs (200 jobs a batch) showed what a re-measurement costs there:
/// the rounds with one read 0.81 of the best engine's at 256 B (+8.6 ms over the same
/// schedule without it, 6 rounds) and 0.69 at 64 B (+11 ms, 2), where the pull and an
/// eighth of the start came to under 0.5 ms (`docs/results.md`).
pub const REMEASURE_RATIO: f64 = 100.0;

/// A declined engine re-measures at most once in this many batches: on a busy host one
/// module request can take tens of milliseconds that the batch waits for.
pub const REMEASURE_EVERY: u32 = 8;

/// Pulls a re-measurement takes: the first request of a lane just started, or after a
/// pause, runs slower than the next ([`MIN_SAMPLES`]), and the lower one is what counts.
pub const CHECK_PULLS: u32 = 2;

/// An engine other than a class's best single engine joins it on an oversubscribed host
/// only if the calibration measured both side by side at least this much faster than
/// the other alone: a few percent is within the guest's noise.
pub const MIX_GAIN: f64 = 1.05;

/// A running estimate of one engine's cost for one class.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    wall: f64,
    cpu: f64,
    samples: u32,
}

impl Estimate {
    /// An estimate that starts from a stored cost as if from [`WINDOW`] samples: usable
    /// at once and settled; the run's own samples move it as any settled estimate.
    pub fn seeded(wall: f64, cpu: f64) -> Self {
        Estimate {
            wall,
            cpu,
            samples: WINDOW,
        }
    }

    /// Adds one job's measured wall and CPU time (seconds) to an average over about
    /// the last [`WINDOW`] samples.
    pub fn observe(&mut self, mut wall: f64, mut cpu: f64) {
        // Of the first two samples (the first a warm-up) the lower starts the estimate;
        // then a plain mean until `WINDOW` samples are in, then a moving average.
        if self.samples < MIN_SAMPLES {
            if self.samples == 0 || self.wall <= 0.0 || wall < self.wall {
                (self.wall, self.cpu) = (wall, cpu);
            }
        } else {
            if self.wall > 0.0 {
                wall = wall.min(self.wall * OUTLIER_CAP);
                cpu = cpu.min(self.cpu.max(self.wall) * OUTLIER_CAP);
            }
            let mut alpha = 1.0 / f64::from((self.samples + 2 - MIN_SAMPLES).min(WINDOW));
            if wall * FAST_DOWN < self.wall {
                alpha = alpha.max(0.5);
            }
            self.wall += alpha * (wall - self.wall);
            self.cpu += alpha * (cpu - self.cpu);
        }
        self.samples = self.samples.saturating_add(1);
    }

    /// Adds a sample of the engine measured alone (a re-measurement, the others'
    /// lanes waiting): one far below a usable estimate ([`FAST_DOWN`]) replaces it, since
    /// timing noise only adds time and the estimate came from a wrong store or from
    /// samples slowed beside other lanes; one above it is left out, since a
    /// re-measurement's few requests come after a pause and run cold (the soft guest's
    /// module took 1 ms and more a 256-byte request so, 0.2-0.4 ms fed steadily, and
    /// three such samples put its estimate above the cpu's for good: `docs/results.md`,
    /// twenty-third session); any other counts as [`Estimate::observe`].
    pub fn check(&mut self, wall: f64, cpu: f64) {
        if !self.takes_check(wall) {
            return;
        }
        if self.cost().is_some_and(|c| wall * FAST_DOWN < c.wall) {
            (self.wall, self.cpu, self.samples) = (wall, cpu, self.samples.saturating_add(1));
        } else {
            self.observe(wall, cpu);
        }
    }

    /// Whether [`Estimate::check`] counts a re-measurement of `wall`: not one at or
    /// above a usable estimate.
    fn takes_check(&self, wall: f64) -> bool {
        self.cost().is_none_or(|c| wall < c.wall)
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
        self.update(|e| e.observe(wall, cpu)) + 1 == MIN_SAMPLES
    }

    /// The estimate, once usable.
    pub fn cost(&self) -> Option<Cost> {
        self.get().cost()
    }

    /// Adds a sample of the engine measured alone ([`Estimate::check`]; one it leaves
    /// out is not counted either).
    pub fn check(&self, wall: f64, cpu: f64) {
        if self.get().takes_check(wall) {
            self.update(|e| e.check(wall, cpu));
        }
    }

    /// Applies `add` (one sample) to the current value and stores the result; returns
    /// the samples before it.
    fn update(&self, add: impl FnOnce(&mut Estimate)) -> u32 {
        let mut e = self.get();
        add(&mut e);
        self.wall.store(e.wall.to_bits(), Ordering::Relaxed);
        self.cpu.store(e.cpu.to_bits(), Ordering::Relaxed);
        self.samples.fetch_add(1, Ordering::Release)
    }
}

/// What the placement rule sees of a batch at one moment.
pub trait View {
    /// Number of engines.
    fn engines(&self) -> usize;
    /// Lanes of engine `e` still working in this batch (0 once it failed).
    fn lanes(&self, e: usize) -> usize;
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
    /// Engine `e`'s estimate for the largest size bucket below class `q`'s with the same
    /// cipher and direction, with that bucket.
    fn smaller_known(&self, e: usize, q: usize) -> Option<(usize, Cost)>;
    /// Engine `e`'s estimated cost for class `q`, once known.
    fn cost(&self, e: usize, q: usize) -> Option<Cost>;
    /// Probe jobs engine `e` has started on class `q` while it had no estimate.
    fn probes(&self, e: usize, q: usize) -> usize;
    /// The gain the calibration measured of engine `e` running class `q` beside the
    /// other engine, over that engine alone (see [`MIX_GAIN`]).
    fn gain(&self, e: usize, q: usize) -> Option<f64>;
    /// Whether engine `e` may still re-measure class `q` in this batch (see
    /// [`REMEASURE_EVERY`]).
    fn may_remeasure(&self, e: usize, q: usize) -> bool;
    /// Whether a lane of engine `me` must wait while another engine re-measures a class
    /// alone.
    fn held(&self, _me: usize) -> bool {
        false
    }
    /// Seconds that starting engine `e`'s lanes would add to the batch (their threads'
    /// start and join), or 0 once they run: what a re-measurement costs beyond its pull
    /// when the engine is otherwise left out of the batch.
    fn start_cost(&self, e: usize) -> f64;
}

/// What a free lane should do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Take jobs of this class.
    Take(usize),
    /// Take jobs of this class to measure it (count them as a probe).
    Probe(usize),
    /// Take one pull of this class, which the engine is declined on, to re-measure it.
    Remeasure(usize),
    /// Jobs this lane could run remain, but others will finish them sooner: wait for
    /// the situation to change.
    Wait,
    /// Nothing left that this lane's engine can run.
    Done,
}

/// A pessimistic estimate of engine `me`'s cost for a job of class `q` from the largest
/// smaller size it knows (see [`PROBE_SAFETY`]).
fn upper_bound<V: View + ?Sized>(v: &V, me: usize, q: usize) -> Option<f64> {
    let (known, c) = v.smaller_known(me, q)?;
    Some(c.wall * v.max_len(q) as f64 / bucket_floor(known).max(1) as f64)
}

/// The engine that would finish class `q` soonest on its own: most lanes per second of
/// job time, among the working engines that have an estimate.
fn best_single<V: View + ?Sized>(v: &V, q: usize) -> Option<usize> {
    let mask = v.class_engines(q);
    (0..v.engines())
        .filter(|&o| mask.contains(o) && v.lanes(o) > 0)
        .filter_map(|o| Some((o, v.cost(o, q).filter(|c| c.wall > 0.0)?.wall)))
        .map(|(o, wall)| (o, v.lanes(o) as f64 / wall))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(o, _)| o)
}

/// Whether engine `e` passes the cost rule for class `q` (see the module documentation).
fn worth<V: View + ?Sized>(v: &V, e: usize, q: usize, steal: f64) -> bool {
    steal <= 0.0
        || best_single(v, q).is_none_or(|best| best == e)
        || v.gain(e, q).is_some_and(|g| g >= MIX_GAIN)
}

/// Jobs per second that every lane but one lane of `me` completes on class `q`, counting
/// only engines that take it (an estimate, and the cost rule passed).
fn others_rate<V: View + ?Sized>(v: &V, me: usize, q: usize, steal: f64) -> f64 {
    let mask = v.class_engines(q);
    let mut rate = 0.0;
    for e in (0..v.engines()).filter(|&e| mask.contains(e) && worth(v, e, q, steal)) {
        let lanes = v.lanes(e).saturating_sub(usize::from(e == me));
        if let Some(c) = v.cost(e, q).filter(|c| c.wall > 0.0 && lanes > 0) {
            rate += lanes as f64 / c.wall;
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
    if v.held(me) {
        return Decision::Wait;
    }
    let steal = v.steal();
    // Time the other lanes would need for all remaining work (fluid estimate), and how
    // much remains.
    let (mut others_time, mut remaining, mut mine) = (0.0, 0, false);
    for q in 0..v.classes() {
        let n = v.remaining(q);
        if n == 0 {
            continue;
        }
        remaining += n;
        mine |= v.class_engines(q).contains(me);
        let rate = others_rate(v, me, q, steal);
        others_time += if rate > 0.0 { n as f64 / rate } else { 0.0 };
    }
    if !mine {
        return Decision::Done;
    }
    let lanes: usize = (0..v.engines()).map(|e| v.lanes(e)).sum();
    let may_probe = remaining >= PROBE_MIN_REMAINING_PER_LANE * lanes;

    // (advantage, bucket, class) of the best class to take; (bucket, class) of the
    // smallest class to probe; a class to re-measure.
    let mut best: Option<(f64, usize, usize)> = None;
    let mut probe: Option<(usize, usize)> = None;
    let mut remeasure = None;
    for q in 0..v.classes() {
        let mask = v.class_engines(q);
        if v.remaining(q) == 0 || !mask.contains(me) {
            continue;
        }
        // The fastest other engine that takes the class (for the advantage and the
        // end-game), and whether any other engine can run it or knows its cost.
        let (mut others_exist, mut others_known, mut best_other) = (false, false, f64::INFINITY);
        for e in (0..v.engines()).filter(|&e| e != me && mask.contains(e) && v.lanes(e) > 0) {
            others_exist = true;
            let cost = v.cost(e, q);
            others_known |= cost.is_some();
            if let Some(c) = cost.filter(|_| worth(v, e, q, steal)) {
                best_other = best_other.min(c.wall);
            }
        }
        if !others_exist {
            // Only this engine can run these: they are ours whatever they cost.
            return Decision::Take(q);
        }
        let Some(c) = v.cost(me, q) else {
            // Nobody knows this class: someone must explore it. Otherwise probe only if
            // even the pessimistic extrapolation cannot delay the batch.
            let may_probe_q = may_probe && v.probes(me, q) < PROBES;
            let safe = !others_known
                || upper_bound(v, me, q).is_none_or(|t| PROBE_SAFETY * t <= others_time);
            if may_probe_q && safe && probe.is_none_or(|p: (usize, usize)| v.bucket(q) < p.0) {
                probe = Some((v.bucket(q), q));
            } else if !others_known && !may_probe_q {
                // Nobody knows better and probing is over: share it as `pull` would.
                return Decision::Take(q);
            }
            continue;
        };
        // No lane can finish a job sooner than the fastest other lane (another lane of
        // this engine's included).
        let alone = v.lanes(me) <= 1;
        let fastest_other_lane = best_other.min(if alone { f64::INFINITY } else { c.wall });
        let horizon = others_time.max(fastest_other_lane);
        if !worth(v, me, q, steal) || c.wall > horizon {
            let pull = c.wall + v.start_cost(me);
            let due = v.may_remeasure(me, q) && others_time >= REMEASURE_RATIO * pull;
            if remeasure.is_none() && due {
                remeasure = Some(q);
            }
            continue;
        }
        let advantage = if c.wall > 0.0 {
            best_other / c.wall
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
        (None, None) => remeasure.map_or(Decision::Wait, Decision::Remeasure),
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
    fn one_stall_barely_moves_an_estimate_but_a_load_change_comes_through() {
        let mut e = Estimate::default();
        for _ in 0..20 {
            e.observe(0.01, 0.01);
        }
        // A lane descheduled for 10 s in one job: capped at OUTLIER_CAP x 10 ms.
        e.observe(10.0, 10.0);
        let after = e.cost().unwrap().wall;
        assert!(
            after <= 0.01 + (OUTLIER_CAP - 1.0) * 0.01 / f64::from(WINDOW) + 1e-12,
            "{after}"
        );
        // Five times slower for good: followed within a few dozen samples.
        for _ in 0..60 {
            e.observe(0.05, 0.05);
        }
        assert!((e.cost().unwrap().wall - 0.05).abs() < 0.0005, "{e:?}");
        // A sample far below counts at least half; one a little below, its plain weight.
        let before = e.cost().unwrap().wall;
        e.observe(0.045, 0.045);
        let plain = before + (0.045 - before) / f64::from(WINDOW);
        assert!((e.cost().unwrap().wall - plain).abs() < 1e-12);
        let before = e.cost().unwrap().wall;
        e.observe(0.01, 0.01);
        assert!((e.cost().unwrap().wall - (before + 0.01) / 2.0).abs() < 1e-12);
    }

    /// A sample measured alone more than [`FAST_DOWN`] times below the estimate
    /// replaces it; one at exactly that ratio, or below the estimate, is averaged in as
    /// any sample; one at or above the estimate is left out.
    #[test]
    fn a_check_far_below_replaces_the_estimate_and_any_other_is_averaged() {
        let checked = |wall: f64| {
            let mut e = Estimate::seeded(3.0, 3.0);
            e.check(wall, wall);
            e.cost().expect("seeded").wall
        };
        // Settled (WINDOW samples): a sample counts 1/WINDOW.
        let averaged = |wall: f64| 3.0 + (wall - 3.0) / f64::from(WINDOW);
        assert_eq!(checked(1.0), 1.0);
        assert_eq!(checked(3.0 / FAST_DOWN), averaged(3.0 / FAST_DOWN));
        assert_eq!(checked(2.5), averaged(2.5));
        assert_eq!(checked(3.0), 3.0);
        assert_eq!(checked(40.0), 3.0);
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
        // Of the two first samples, the lower starts the estimate.
        assert_eq!(shared.cost().unwrap().wall, 1.0);
    }

    /// A stored cost is usable at once and settled (a run's sample moves it by
    /// 1/WINDOW); a sample measured alone far below it replaces it, one near or above it
    /// counts as any sample.
    #[test]
    fn a_seeded_estimate_is_settled_and_a_check_far_below_replaces_it() {
        let seeded = SharedEstimate::new(Estimate::seeded(1.0, 0.5));
        assert_eq!(seeded.cost().map(|c| c.wall), Some(1.0));
        seeded.observe(1.8, 1.8);
        assert!((seeded.cost().unwrap().wall - 1.1).abs() < 1e-12);
        seeded.check(1.9, 1.9);
        assert!(
            (seeded.cost().unwrap().wall - 1.1).abs() < 1e-12,
            "left out"
        );
        seeded.check(0.1, 0.05);
        assert_eq!(
            seeded.cost(),
            Some(Cost {
                wall: 0.1,
                cpu: 0.05
            })
        );
        assert_eq!(seeded.get().samples(), WINDOW + 2);
        // Within FAST_DOWN of the estimate: a plain sample.
        seeded.check(0.1 * FAST_DOWN, 0.1);
        assert!(seeded.cost().unwrap().wall < 0.1 * FAST_DOWN);
        let unknown = SharedEstimate::default();
        unknown.check(0.1, 0.1);
        assert_eq!(
            unknown.get().samples(),
            1,
            "an unknown estimate starts as usual"
        );
    }

    /// A synthetic engine: per-job wall time as fixed + per-byte cost. A module also has
    /// `driver`: host CPU time per request that, on an oversubscribed host, comes out of
    /// a busy CPU lane; and `slowed`: how much longer its job takes when it starts while
    /// a CPU lane is busy (its driver waits for the core).
    #[derive(Clone, Copy, Debug)]
    struct SynthEngine {
        lanes: usize,
        host: bool,
        fixed: f64,
        per_byte: f64,
        driver: f64,
        slowed: f64,
    }

    impl SynthEngine {
        fn wall(&self, len: usize) -> f64 {
            self.fixed + self.per_byte * len as f64
        }
        /// Its time alone for `n` jobs of `len` bytes, every lane busy.
        fn alone(&self, n: usize, len: usize) -> f64 {
            (n as f64 / self.lanes as f64).ceil() * self.wall(len)
        }
    }

    /// A software engine: `lanes` lanes, each at `bytes_per_second`.
    fn software(lanes: usize, fixed: f64, bytes_per_second: f64) -> SynthEngine {
        SynthEngine {
            lanes,
            host: true,
            fixed,
            per_byte: 1.0 / bytes_per_second,
            driver: 0.0,
            slowed: 0.0,
        }
    }

    /// A crypto module with a request floor whose driver takes `driver` seconds of host
    /// CPU per request.
    fn module(lanes: usize, floor: f64, bytes_per_second: f64, driver: f64) -> SynthEngine {
        SynthEngine {
            lanes,
            host: false,
            fixed: floor,
            per_byte: 1.0 / bytes_per_second,
            driver,
            slowed: 0.0,
        }
    }

    /// One simulated lane: its engine, when it is next free, its job in progress (start,
    /// class, whether it only bounds the cost), and whether it is done.
    struct SimLane {
        engine: usize,
        free_at: f64,
        job: Option<(f64, usize, bool)>,
        done: bool,
    }

    /// The model's view of a simulated batch; estimates persist across batches.
    struct Sim {
        engines: Vec<SynthEngine>,
        cores: usize,
        /// (length, remaining) per class; every class runs on every engine.
        classes: Vec<(usize, usize)>,
        est: Vec<Vec<Estimate>>,
        probes: Vec<Vec<usize>>,
        remeasured: Vec<bool>,
        /// Per engine: batches since it last re-measured.
        since: Vec<u32>,
        /// Per engine and class: the calibration's mix gain.
        gains: Vec<Vec<Option<f64>>>,
    }

    impl View for Sim {
        fn engines(&self) -> usize {
            self.engines.len()
        }
        fn lanes(&self, e: usize) -> usize {
            self.engines[e].lanes
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
        fn smaller_known(&self, e: usize, q: usize) -> Option<(usize, Cost)> {
            (0..self.classes.len())
                .filter(|&k| self.bucket(k) < self.bucket(q))
                .filter_map(|k| Some((self.bucket(k), self.est[e][k].cost()?)))
                .max_by_key(|k| k.0)
        }
        fn cost(&self, e: usize, q: usize) -> Option<Cost> {
            self.est[e][q].cost()
        }
        fn probes(&self, e: usize, q: usize) -> usize {
            self.probes[e][q]
        }
        fn gain(&self, e: usize, q: usize) -> Option<f64> {
            self.gains[e][q]
        }
        fn may_remeasure(&self, e: usize, _: usize) -> bool {
            !self.remeasured[e] && self.since[e] >= REMEASURE_EVERY
        }
        /// The simulation starts no threads.
        fn start_cost(&self, _e: usize) -> f64 {
            0.0
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
                remeasured: vec![false; ne],
                since: vec![0; ne],
                gains: vec![vec![None; nq]; ne],
            }
        }

        /// As [`Sim::new`], every estimate seeded with the engines' true costs and the
        /// mix gains given per engine (as a calibration store would give them).
        fn seeded(engines: Vec<SynthEngine>, cores: usize, lens: &[usize], gains: &[f64]) -> Self {
            let mut sim = Sim::new(engines, cores, lens);
            for (e, eng) in sim.engines.iter().enumerate() {
                for (q, &len) in lens.iter().enumerate() {
                    sim.est[e][q] = Estimate::seeded(eng.wall(len), eng.wall(len));
                    sim.gains[e][q] = gains.get(e).copied();
                }
            }
            sim
        }

        /// The best single engine's time for `counts` jobs per class.
        fn best_single(&self, counts: &[usize]) -> f64 {
            self.engines
                .iter()
                .map(|e| {
                    (self.classes.iter().zip(counts))
                        .map(|(&(len, _), &n)| e.alone(n, len))
                        .sum::<f64>()
                })
                .fold(f64::INFINITY, f64::min)
        }

        /// Runs a batch of `counts[q]` jobs per class, event by event, with the rule
        /// deciding for each lane that becomes free and the lanes booking their jobs as
        /// the schedule does. While a module job runs, its driver's CPU time (times the
        /// steal fraction) delays a busy CPU lane. Panics if every lane waits forever.
        fn run(&mut self, counts: &[usize]) -> Outcome {
            for (c, &n) in self.classes.iter_mut().zip(counts) {
                c.1 = n;
            }
            let nq = self.classes.len();
            for e in 0..self.engines.len() {
                self.probes[e] = vec![0; nq];
                self.remeasured[e] = false;
            }
            let mut lanes: Vec<SimLane> = Vec::new();
            for (e, eng) in self.engines.iter().enumerate() {
                lanes.extend((0..eng.lanes).map(|_| SimLane {
                    engine: e,
                    free_at: 0.0,
                    job: None,
                    done: false,
                }));
            }
            let mut jobs = vec![vec![0; nq]; self.engines.len()];
            let mut makespan: f64 = 0.0;
            let mut stalls = 0;
            let steal = self.steal();
            while let Some(l) = (0..lanes.len())
                .filter(|&l| !lanes[l].done)
                .min_by(|&a, &b| lanes[a].free_at.total_cmp(&lanes[b].free_at))
            {
                let now = lanes[l].free_at;
                let e = lanes[l].engine;
                if let Some((start, q, check)) = lanes[l].job.take() {
                    makespan = makespan.max(now);
                    let wall = now - start;
                    let est = &mut self.est[e][q];
                    if check {
                        est.check(wall, wall);
                    } else {
                        est.observe(wall, wall);
                    }
                }
                let decision = decide(self, e);
                let q = match decision {
                    Decision::Take(q) | Decision::Probe(q) | Decision::Remeasure(q) => q,
                    Decision::Wait => {
                        let next = lanes
                            .iter()
                            .filter(|x| x.job.is_some())
                            .map(|x| x.free_at)
                            .fold(f64::INFINITY, f64::min);
                        stalls += 1;
                        assert!(
                            next.is_finite() || stalls <= 2 * lanes.len(),
                            "every lane waits: deadlock"
                        );
                        // Strictly later, so a lane finishing at this instant goes first.
                        lanes[l].free_at = if next.is_finite() { next } else { now } + 1e-12;
                        continue;
                    }
                    Decision::Done => {
                        lanes[l].done = true;
                        continue;
                    }
                };
                stalls = 0;
                match decision {
                    Decision::Probe(_) => self.probes[e][q] += 1,
                    Decision::Remeasure(_) => self.remeasured[e] = true,
                    _ => {}
                }
                self.classes[q].1 -= 1;
                jobs[e][q] += 1;
                let eng = self.engines[e];
                let host_busy = lanes
                    .iter()
                    .any(|x| x.job.is_some() && self.engines[x.engine].host);
                let slowed = if host_busy && steal > 0.0 {
                    eng.slowed
                } else {
                    0.0
                };
                lanes[l].free_at = now + eng.wall(self.classes[q].0) * (1.0 + slowed);
                lanes[l].job = Some((now, q, matches!(decision, Decision::Remeasure(_))));
                if !eng.host && steal > 0.0 {
                    // The driver's CPU time comes out of a busy CPU lane.
                    if let Some(victim) = (0..lanes.len())
                        .filter(|&v| lanes[v].job.is_some() && self.engines[lanes[v].engine].host)
                        .min_by(|&a, &b| lanes[a].free_at.total_cmp(&lanes[b].free_at))
                    {
                        lanes[victim].free_at += steal * eng.driver;
                    }
                }
            }
            assert!(self.classes.iter().all(|c| c.1 == 0), "jobs left over");
            for (since, &remeasured) in self.since.iter_mut().zip(&self.remeasured) {
                *since = if remeasured { 0 } else { *since + 1 };
            }
            Outcome { makespan, jobs }
        }
    }

    const SMALL: usize = 64;
    const PAGE: usize = 4096;
    const LARGE: usize = 16 * 1024;

    /// The seeds' single-core board: a slow software CPU and a module with a ~200 µs
    /// request floor whose driver costs 30 µs of the only core per request.
    fn board() -> (SynthEngine, SynthEngine) {
        (software(1, 1e-6, 20e6), module(1, 200e-6, 100e6, 30e-6))
    }

    /// With nothing stored, the first batches probe; then the module gets no small job
    /// (but a re-measurement a batch long enough affords) and takes the large ones. The
    /// CPU joins the module's class only on a measured mix gain, and then the batch
    /// beats the best single engine.
    #[test]
    fn a_slow_fixed_cost_module_gets_no_small_jobs_and_the_cpu_joins_on_a_measured_gain() {
        let (cpu, module) = board();
        let mut sim = Sim::new(vec![cpu, module], 1, &[SMALL, LARGE]);
        sim.run(&[500, 100]);
        sim.run(&[500, 100]);
        sim.since = vec![REMEASURE_EVERY; 2];
        let small = sim.run(&[2000, 0]);
        assert!(small.jobs[1][0] <= 1, "{small:?}");
        let cpu_alone = cpu.alone(2000, SMALL);
        assert!(
            small.makespan <= cpu_alone * 1.01,
            "{small:?} vs {cpu_alone}"
        );

        let module_alone = module.alone(400, LARGE);
        let large = sim.run(&[0, 400]);
        assert!(
            large.jobs[0][1] <= 1,
            "no gain known, the CPU joined: {large:?}"
        );
        assert!(large.makespan <= module_alone * 1.01, "{large:?}");

        sim.gains[0] = vec![Some(1.3); 2];
        let large = sim.run(&[0, 400]);
        assert!(large.jobs[0][1] > 40, "{large:?}");
        assert!(
            large.makespan < module_alone * 0.9,
            "{large:?} vs {module_alone}"
        );
        // Mixed sizes: the module keeps to the large jobs.
        let mixed = sim.run(&[2000, 200]);
        assert!(mixed.jobs[1][0] <= 1 && mixed.jobs[1][1] > 100, "{mixed:?}");
    }

    /// The testbed's configurations started from a store, each run for many batches of
    /// each size: every batch within 3% of the best single engine (the contract: never
    /// behind it beyond noise), and where the calibration measured a mix that gains,
    /// ahead of it. (Without a store, on a shared core, an engine's probes run beside
    /// the other engine's jobs and can come out slowed enough to lose it a class it is
    /// best at: in the one-core soft case at 4 KiB the module's probes, slowed 1.8x by
    /// the CPU lane, made the CPU look best. The store, measured with each engine alone,
    /// is the remedy.)
    #[test]
    fn long_runs_never_fall_behind_the_best_single_engine() {
        let mut slow_module = module(1, 500e-6, 33e6, 20e-6);
        slow_module.slowed = 0.8;
        let mut two_vcpu_module = module(1, 0.4e-3, LARGE as f64 / 1.3e-3, 0.1e-3);
        two_vcpu_module.slowed = 0.25;
        // (engines, cores, mix gain of each engine, whether mixing pays at 16 KiB)
        let cases = [
            (vec![board().0, board().1], 1, [1.3, 1.01], true),
            // Soft, one vCPU: a CPU beside the module costs it more than it adds.
            (
                vec![software(1, 1e-6, 4.5e6), slow_module],
                1,
                [0.8, 0.9],
                false,
            ),
            // AES-NI: the CPU wins every size; the module's help never pays.
            (
                vec![software(1, 1e-6, 50e6), slow_module],
                1,
                [0.9, 0.95],
                false,
            ),
            // Two vCPUs at 16 KiB: both help.
            (
                vec![software(2, 1e-6, LARGE as f64 / 4.4e-3), two_vcpu_module],
                2,
                [1.3, 1.02],
                true,
            ),
        ];
        let lens = [SMALL, 1024, PAGE, LARGE];
        for (engines, cores, gains, mixes) in cases {
            let mut sim = Sim::seeded(engines.clone(), cores, &lens, &gains);
            for q in 0..lens.len() {
                let mut counts = [0; 4];
                counts[q] = 400;
                let best = sim.best_single(&counts);
                for round in 0..10 {
                    let out = sim.run(&counts);
                    let ratio = out.makespan / best;
                    assert!(
                        ratio <= 1.03,
                        "{engines:?}, {} B round {round}: {ratio:.3}x the best single \
                         engine: {out:?}",
                        lens[q]
                    );
                    if mixes && lens[q] == LARGE {
                        assert!(ratio < 0.95, "{engines:?}: did not mix: {out:?}");
                    }
                }
            }
        }
    }

    /// Started from a store, the first batch of each size is as good as later ones: no
    /// probe, every job where the stored costs say (but the one pull a batch this long
    /// affords the CPU to re-measure the module's class).
    #[test]
    fn a_seeded_model_places_the_first_batch_without_probing() {
        let (cpu, module) = board();
        let mut sim = Sim::seeded(vec![cpu, module], 1, &[SMALL, LARGE], &[0.9, 0.9]);
        let small = sim.run(&[400, 0]);
        assert_eq!(small.jobs[1][0], 0, "{small:?}");
        let large = sim.run(&[0, 400]);
        assert!(large.jobs[0][1] <= 1, "{large:?}");
        assert!(sim.probes.iter().flatten().all(|&p| p == 0));
        assert!(large.makespan <= module.alone(400, LARGE) * 1.01);
    }

    /// The AES-NI guest at 4 KiB: the CPU is the best single engine (0.3 ms a job, the
    /// module 0.6 ms). Another program takes the core (the CPU's jobs 3x slower): within
    /// a few batches the module has the class. The load goes away: the CPU's
    /// re-measurements (one in [`REMEASURE_EVERY`] batches) bring it back.
    #[test]
    fn a_cpu_that_gets_busy_hands_the_class_over_and_takes_it_back_when_free() {
        let cpu = software(1, 1e-6, PAGE as f64 / 0.3e-3);
        let module = module(1, 0.2e-3, PAGE as f64 / 0.4e-3, 20e-6);
        let mut sim = Sim::seeded(vec![cpu, module], 1, &[PAGE], &[0.9, 0.9]);
        let within = |sim: &mut Sim, what: &str| {
            let best = sim.best_single(&[400]);
            let batches = 3 * REMEASURE_EVERY as usize;
            let ratios: Vec<f64> = (0..batches)
                .map(|_| sim.run(&[400]).makespan / best)
                .collect();
            assert!(
                ratios[batches - 4..].iter().all(|&r| r <= 1.03),
                "{what}: not noticed: {ratios:?}"
            );
        };
        within(&mut sim, "calm");
        sim.engines[0].per_byte *= 3.0;
        within(&mut sim, "busy cpu");
        let last = sim.run(&[400]);
        assert!(last.jobs[1][0] > 390, "{last:?}");
        sim.engines[0].per_byte /= 3.0;
        within(&mut sim, "cpu free again");
        let last = sim.run(&[400]);
        assert!(last.jobs[0][0] > 390, "{last:?}");
    }

    /// The soft guest at 16 KiB: the module is the best single engine. The device slows
    /// to a quarter of its speed (a busy host thread): the CPU takes the class.
    #[test]
    fn a_device_that_slows_down_loses_the_class_to_the_cpu() {
        let cpu = software(1, 1e-6, 4.5e6);
        let module = module(1, 500e-6, 33e6, 20e-6);
        let mut sim = Sim::seeded(vec![cpu, module], 1, &[LARGE], &[0.8, 0.9]);
        let out = sim.run(&[200]);
        assert_eq!(out.jobs[0][0], 0, "{out:?}");
        sim.engines[1].fixed *= 4.0;
        sim.engines[1].per_byte *= 4.0;
        let best = sim.best_single(&[200]);
        let ratios: Vec<f64> = (0..6).map(|_| sim.run(&[200]).makespan / best).collect();
        assert!(ratios[3..].iter().all(|&r| r <= 1.03), "{ratios:?}");
        assert!(sim.run(&[200]).jobs[0][0] > 190);
    }

    /// Where the module is faster than the CPU at every size, the CPU still helps with
    /// small jobs and leaves the module the large ones; the rule never deadlocks.
    #[test]
    fn a_slow_cpu_helps_without_holding_the_last_job() {
        let cpu = software(1, 1e-6, 5e6);
        let module = module(4, 5e-6, 400e6, 2e-6);
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

    /// Of the first two samples the lower starts the estimate (a tie keeps the first,
    /// a first sample of zero holds nothing), then each sample counts as in a plain
    /// mean until [`WINDOW`] samples are in.
    #[test]
    fn an_estimate_starts_from_the_lower_first_sample_then_takes_the_plain_mean() {
        let mut e = Estimate::default();
        e.observe(0.0, 0.0);
        e.observe(0.5, 0.25);
        assert_eq!(
            e.cost(),
            Some(Cost {
                wall: 0.5,
                cpu: 0.25
            })
        );
        let mut e = Estimate::default();
        e.observe(1.0, 0.5);
        e.observe(1.0, 0.25);
        assert_eq!(
            e.cost(),
            Some(Cost {
                wall: 1.0,
                cpu: 0.5
            }),
            "a tie keeps the first sample"
        );
        // The third and fourth samples: the mean of the samples since the warm-up.
        e.observe(3.0, 1.5);
        assert_eq!(e.cost().map(|c| (c.wall, c.cpu)), Some((2.0, 1.0)));
        e.observe(6.0, 3.0);
        let wall = e.cost().map_or(0.0, |c| c.wall);
        assert!((wall - 10.0 / 3.0).abs() < 1e-12, "{e:?}");
    }

    /// A usable estimate of zero takes a sample uncapped (the cap is a multiple of the
    /// estimate); a CPU time far above it is capped at [`OUTLIER_CAP`] times the
    /// estimate; a sample exactly 1/[`FAST_DOWN`] of it counts at its plain weight.
    #[test]
    fn an_estimate_caps_outliers_relative_to_itself() {
        let mut zero = Estimate::default();
        zero.observe(0.0, 0.0);
        zero.observe(0.0, 0.0);
        zero.observe(1.0, 1.0);
        assert_eq!(zero.cost().map(|c| c.wall), Some(0.5));

        let mut settled = Estimate::seeded(1.0, 1.0);
        settled.observe(1.0, 10.0);
        let cap = 1.0 + (OUTLIER_CAP - 1.0) / f64::from(WINDOW);
        assert_eq!(settled.cost().map(|c| c.cpu), Some(cap));

        let mut settled = Estimate::seeded(3.0, 3.0);
        settled.observe(3.0 / FAST_DOWN, 3.0 / FAST_DOWN);
        let plain = 3.0 + (3.0 / FAST_DOWN - 3.0) / f64::from(WINDOW);
        assert_eq!(settled.cost().map(|c| c.wall), Some(plain));
    }

    /// A batch set out field by field, for the rule's edge cases: engines and their
    /// lanes, classes (who may run them, jobs left, bucket, longest job) and what is
    /// known per engine and class.
    struct Fake {
        lanes: Vec<usize>,
        steal: f64,
        /// Per class: engines that may run it, jobs remaining, size bucket, longest job.
        classes: Vec<(EngineMask, usize, usize, usize)>,
        /// Per engine and class: wall time of a job, once known.
        costs: Vec<Vec<Option<f64>>>,
        smaller: Vec<Vec<Option<(usize, Cost)>>>,
        probes: Vec<Vec<usize>>,
        remeasure: Vec<bool>,
        /// What starting a left-out engine's lanes costs, seconds.
        start: f64,
    }

    impl Fake {
        /// Engines with `lanes[e]` lanes each, one class per entry of `remaining` that
        /// every engine may run (64-byte jobs), nothing known, a core per lane.
        fn new(lanes: &[usize], remaining: &[usize]) -> Self {
            let (ne, nq) = (lanes.len(), remaining.len());
            Fake {
                lanes: lanes.to_vec(),
                steal: 0.0,
                classes: remaining
                    .iter()
                    .map(|&n| (EngineMask(u64::MAX), n, bucket(SMALL), SMALL))
                    .collect(),
                costs: vec![vec![None; nq]; ne],
                smaller: vec![vec![None; nq]; ne],
                probes: vec![vec![0; nq]; ne],
                remeasure: vec![false; ne],
                start: 0.0,
            }
        }

        /// Engine `e`'s cost for class `q`.
        fn cost(mut self, e: usize, q: usize, wall: f64) -> Self {
            self.costs[e][q] = Some(wall);
            self
        }

        /// The engines that may run class `q`.
        fn engines(mut self, q: usize, mask: u64) -> Self {
            self.classes[q].0 = EngineMask(mask);
            self
        }
    }

    impl View for Fake {
        fn engines(&self) -> usize {
            self.lanes.len()
        }
        fn lanes(&self, e: usize) -> usize {
            self.lanes[e]
        }
        fn steal(&self) -> f64 {
            self.steal
        }
        fn classes(&self) -> usize {
            self.classes.len()
        }
        fn class_engines(&self, q: usize) -> EngineMask {
            self.classes[q].0
        }
        fn remaining(&self, q: usize) -> usize {
            self.classes[q].1
        }
        fn bucket(&self, q: usize) -> usize {
            self.classes[q].2
        }
        fn max_len(&self, q: usize) -> usize {
            self.classes[q].3
        }
        fn smaller_known(&self, e: usize, q: usize) -> Option<(usize, Cost)> {
            self.smaller[e][q]
        }
        fn cost(&self, e: usize, q: usize) -> Option<Cost> {
            self.costs[e][q].map(|wall| Cost { wall, cpu: wall })
        }
        fn probes(&self, e: usize, q: usize) -> usize {
            self.probes[e][q]
        }
        fn gain(&self, _: usize, _: usize) -> Option<f64> {
            None
        }
        fn may_remeasure(&self, e: usize, _: usize) -> bool {
            self.remeasure[e]
        }
        fn start_cost(&self, _: usize) -> f64 {
            self.start
        }
    }

    /// A declined engine re-measures only where the others' remaining work is
    /// [`REMEASURE_RATIO`] times the pull and the lanes' start together: 200 jobs of
    /// 110 µs on the module (22 ms) leave room for a 150 µs cpu pull alone (15 ms), not
    /// once a 1 ms lane start counts too (115 ms); 1,100 jobs (121 ms) do.
    #[test]
    fn a_remeasurement_counts_the_start_of_the_engines_lanes() {
        let fake = |jobs: usize, start: f64| {
            let mut v = Fake::new(&[1, 1], &[jobs])
                .cost(0, 0, 150e-6)
                .cost(1, 0, 110e-6);
            v.steal = 1.0;
            v.remeasure[0] = true;
            v.start = start;
            decide(&v, 0)
        };
        assert_eq!(fake(200, 0.0), Decision::Remeasure(0));
        assert_eq!(fake(200, 1e-3), Decision::Wait);
        assert_eq!(fake(1_000, 1e-3), Decision::Wait, "110 ms < 115 ms");
        assert_eq!(fake(1_100, 1e-3), Decision::Remeasure(0));
    }

    /// The pessimistic extrapolation scales the smaller size's cost by the length
    /// ratio: 0.5 s at 16 bytes (bucket 5) is 1.5 s at 48.
    #[test]
    fn upper_bound_scales_the_smaller_cost_by_length() {
        let mut v = Fake::new(&[1, 1], &[10]);
        v.classes[0].3 = 48;
        v.smaller[0][0] = Some((
            5,
            Cost {
                wall: 0.5,
                cpu: 0.5,
            },
        ));
        assert_eq!(upper_bound(&v, 0, 0), Some(1.5));
        assert_eq!(upper_bound(&v, 1, 0), None);
    }

    /// A probe of a larger size goes ahead only if [`PROBE_SAFETY`] times its
    /// pessimistic cost fits in the time the others need for the rest: here 4 x 2 s
    /// against 7 s (no) and 8 s (yes) of the other engine's work.
    #[test]
    fn a_larger_probe_waits_until_its_extrapolated_cost_fits_the_others_work() {
        let fake = |jobs: usize| {
            let mut v = Fake::new(&[1, 1], &[jobs]).cost(1, 0, 0.5);
            v.classes[0].3 = 64;
            // 0.5 s at 16 bytes: at most 2 s at 64.
            v.smaller[0][0] = Some((
                5,
                Cost {
                    wall: 0.5,
                    cpu: 0.5,
                },
            ));
            v
        };
        assert_eq!(decide(&fake(14), 0), Decision::Wait);
        assert_eq!(decide(&fake(16), 0), Decision::Probe(0));
    }

    /// The best single engine is among the working engines that may run the class and
    /// have a usable, non-zero cost.
    #[test]
    fn best_single_counts_only_working_engines_of_the_class_with_a_cost() {
        let v = Fake::new(&[1, 1, 1], &[10])
            .engines(0, 0b011)
            .cost(0, 0, 2.0)
            .cost(1, 0, 1.0)
            .cost(2, 0, 0.1);
        assert_eq!(
            best_single(&v, 0),
            Some(1),
            "engine 2 may not run the class"
        );
        let mut v = Fake::new(&[1, 1], &[10]).cost(1, 0, 0.1);
        v.lanes[1] = 0;
        assert_eq!(best_single(&v, 0), None, "engine 1 failed");
        let v = Fake::new(&[1, 1], &[10]).cost(0, 0, 0.0).cost(1, 0, 1.0);
        assert_eq!(best_single(&v, 0), Some(1), "a zero cost is no estimate");
    }

    /// The others' rate leaves out one lane of the asking engine and engines whose
    /// cost is zero.
    #[test]
    fn others_rate_leaves_out_the_asking_lane() {
        let v = Fake::new(&[1, 1], &[10]).cost(0, 0, 1.0).cost(1, 0, 0.5);
        assert_eq!(others_rate(&v, 0, 0, 0.0), 2.0);
        let mut two = Fake::new(&[2, 1], &[10]).cost(0, 0, 1.0).cost(1, 0, 0.5);
        assert_eq!(others_rate(&two, 0, 0, 0.0), 3.0);
        two.costs[1][0] = Some(0.0);
        assert_eq!(others_rate(&two, 0, 0, 0.0), 1.0);
    }

    /// With nothing known anywhere, a lane probes while [`PROBE_MIN_REMAINING_PER_LANE`]
    /// jobs per lane remain and it has started fewer than [`PROBES`] probes; after that
    /// it takes the jobs as `pull` would.
    #[test]
    fn with_nothing_known_a_lane_probes_while_enough_jobs_remain() {
        let lanes = [1, 1];
        let enough = PROBE_MIN_REMAINING_PER_LANE * lanes.len();
        assert_eq!(decide(&Fake::new(&lanes, &[enough]), 0), Decision::Probe(0));
        assert_eq!(
            decide(&Fake::new(&lanes, &[enough - 1]), 0),
            Decision::Take(0)
        );
        let mut v = Fake::new(&lanes, &[enough]);
        v.probes[0][0] = PROBES - 1;
        assert_eq!(decide(&v, 0), Decision::Probe(0));
        v.probes[0][0] = PROBES;
        assert_eq!(decide(&v, 0), Decision::Take(0));
    }

    /// An engine with no estimate where another engine has one, and too few jobs left
    /// to probe, leaves the class to it.
    #[test]
    fn an_unknown_engine_leaves_a_short_class_to_the_one_that_knows_it() {
        let v = Fake::new(&[1, 1], &[2]).cost(1, 0, 1.0);
        assert_eq!(decide(&v, 0), Decision::Wait);
    }

    /// Probes go to the smallest bucket first, the first such class on a tie.
    #[test]
    fn probes_go_to_the_first_smallest_class() {
        let mut v = Fake::new(&[1, 1], &[10, 10, 10]);
        for (q, b) in [8, 5, 5].into_iter().enumerate() {
            v.classes[q].2 = b;
        }
        assert_eq!(decide(&v, 0), Decision::Probe(1));
    }

    /// Work that no other engine has an estimate for adds nothing to the others'
    /// time: a slow engine still leaves the class a faster one runs.
    #[test]
    fn a_class_no_other_engine_knows_adds_no_time_to_the_end_game() {
        let v = Fake::new(&[1, 1], &[5, 1])
            .engines(0, 0b10)
            .cost(0, 1, 10.0)
            .cost(1, 1, 1.0);
        assert_eq!(decide(&v, 0), Decision::Wait);
    }

    /// Jobs that only this engine can run (no other may, or the others failed) are
    /// its own whatever they cost.
    #[test]
    fn jobs_no_other_working_engine_may_run_are_taken_whatever_they_cost() {
        let v = Fake::new(&[1, 1], &[10])
            .engines(0, 0b01)
            .cost(0, 0, 10.0)
            .cost(1, 0, 0.1);
        assert_eq!(decide(&v, 0), Decision::Take(0));
        let mut v = Fake::new(&[1, 1], &[10]).cost(0, 0, 10.0).cost(1, 0, 0.1);
        v.lanes[1] = 0;
        assert_eq!(decide(&v, 0), Decision::Take(0));
    }

    /// A declined engine re-measures only when the others' remaining work is at least
    /// [`REMEASURE_RATIO`] times its cost.
    #[test]
    fn a_declined_engine_remeasures_only_beside_enough_work() {
        let fake = |jobs: usize| {
            let mut v = Fake::new(&[1, 1], &[jobs]).cost(0, 0, 10.0).cost(1, 0, 1.0);
            // Oversubscribed: engine 1 is the best single engine, engine 0 declined.
            v.steal = 1.0;
            v.remeasure[0] = true;
            v
        };
        let enough = (REMEASURE_RATIO * 10.0) as usize;
        assert_eq!(decide(&fake(enough), 0), Decision::Remeasure(0));
        assert_eq!(decide(&fake(enough - 1), 0), Decision::Wait);
    }

    /// Among the classes it may take, a lane takes the one where it is relatively
    /// best: a zero cost beside the others' zero is the best there is (not 0/0), and a
    /// tie goes to the first class.
    #[test]
    fn a_lane_takes_its_most_advantaged_class_the_first_on_a_tie() {
        let v = Fake::new(&[1, 1], &[10, 10])
            .cost(0, 0, 1.0)
            .cost(1, 0, 2.0)
            .cost(0, 1, 0.0)
            .cost(1, 1, 0.0);
        assert_eq!(decide(&v, 0), Decision::Take(1));
        let v = Fake::new(&[1, 1], &[10, 10])
            .cost(0, 0, 1.0)
            .cost(1, 0, 2.0)
            .cost(0, 1, 1.0)
            .cost(1, 1, 2.0);
        assert_eq!(decide(&v, 0), Decision::Take(0));
    }
}
