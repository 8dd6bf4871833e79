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
//! enter an exponential moving average, so the estimate follows load changes. Timing
//! noise only adds time, so a sample far below an estimate counts at least half
//! ([`FAST_DOWN`]): an estimate inflated by a stall comes down at its next sample.
//!
//! **Placement rule** ([`decide`]). A free lane of engine `me` may take a job of class `q`
//! only if
//! 1. *cost rule* — the engine's cost is not worse than it would be elsewhere. When the
//!    host is oversubscribed (more lanes than cores), engines slow each other down:
//!    driving a module (syscalls, copies, the kernel's crypto worker threads,
//!    interrupts) takes CPU time from the CPU lanes, and CPU lanes busy with software
//!    AES delay the module's submissions and completions. So for each class the engine
//!    that is fastest *alone* (the best single engine) always may take it, and another
//!    engine only if the lane time its job costs the others is less than the time the
//!    job would cost them undisturbed. That cost is *measured* ([`Interference`]): every
//!    engine's lanes time their jobs when no other engine's job ran at any moment of
//!    them ("alone", per class) and when one did (as a ratio to the class's alone time,
//!    over all classes: interference comes in bursts, at a request's submission and
//!    completion, and lands on whichever jobs run then, so every overlapping job
//!    counts); a job of wall time `W` then costs each lane of an engine whose ratio is
//!    `r` a time `W x (1 - 1/r)`, and the job is worth it only if that is at most
//!    [`MIX_MARGIN`] of the time it saves (estimates are noisy; a small predicted gain
//!    is as often a loss). Until the ratio is measured, another engine runs at most
//!    [`MIX_TRIALS`] pulls a lane per batch beside the best single engine (a module whose
//!    own thread CPU time per job, a lower bound of what it takes — in our testbed guest
//!    most of the driver's work runs in a kernel thread and in interrupts, which no user
//!    thread's clock sees — already exceeds that, none). Until the best single engine
//!    has an "alone" estimate for a class, the others leave the class to it (a couple
//!    of its jobs). All that is a *prediction* from per-engine estimates; once a mix has
//!    run (trial jobs included), what it gained is *measured* instead, batch by batch
//!    ([`measured_gain`]: the class's jobs per second over every lane while they ran
//!    side by side, over the others' rate alone in the same batch), and the average of
//!    the last few batches decides ([`MIX_GAIN`], [`Gain`]): an engine joins once the
//!    batches agree that it gains and leaves once their average says it loses. An
//!    engine declined on a class checks the mix now and then, a few jobs beside the
//!    others, on a credit of time like a re-measurement's ([`CHECK_RATIO`]), or every
//!    batch while the average says it would gain, so a gain the estimates miss, or one
//!    the machine comes to allow, is found; and
//! 2. *end-game rule* — it will finish the job before the other lanes would have finished
//!    all the remaining work anyway (fluid estimate over their measured rates); a slow
//!    engine therefore stops taking work as the batch ends instead of holding the last
//!    job while everyone waits.
//!
//! Among the classes it may take, the lane picks the one where its engine is relatively
//! best (largest ratio of the best other engine's cost to its own), largest jobs first on
//! ties: a module takes the big jobs and leaves the small ones to the CPU, as the
//! optimal fluid split of unrelated machines does. Some engine always passes the cost
//! rule (the best single engine does), and among those that pass it the lane with the
//! shortest time per job always passes the end-game rule, so some lane always makes
//! progress.
//!
//! **Exploration.** An engine with no estimate for a class takes up to [`PROBES`] probe
//! jobs of it, smallest classes first, only while the batch is large enough for the
//! probes to overlap other work, and — once the engine knows a smaller size of the same
//! cipher — only if even a pessimistic extrapolation from that size (cost proportional to
//! length, an upper bound for any cost of the form fixed + per-byte), taken
//! [`PROBE_SAFETY`] times over because the lanes beside it slow it down, finishes
//! before the other lanes would finish the remaining work: a probe can then not delay
//! the batch. An engine that declines a class may re-measure it once per batch, only when the
//! remaining work plus the time its batches have run since its last re-measurement is at
//! least [`REPROBE_RATIO`] times the probe's estimated cost (a quarter of that for an
//! estimate of only a couple of samples, see [`reprobe_ratio`]), which bounds the price
//! of keeping estimates fresh to about half a percent of the time, however long or short
//! the batches (the other engines wait while it runs, so that it measures the engine
//! undisturbed).

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
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Cost {
    /// Wall time from taking the job to finishing it, in seconds.
    pub wall: f64,
    /// CPU time the lane's thread spent on it, in seconds.
    pub cpu: f64,
}

/// Samples the moving average of a job's cost spans: about the last eight matter,
/// enough to smooth scheduler jitter, few enough to follow a load change within a few
/// dozen jobs.
pub const WINDOW: u32 = 8;

/// Samples the CPU lanes' "alone" and "shared" averages span: the driver's CPU bursts
/// land on one CPU job in every few dozen small ones, so the average must cover several
/// bursts to see them at their true weight.
pub const INTERFERENCE_WINDOW: u32 = 128;

/// The most jobs one undisturbed sample (a pull, or a span of a sole run) counts as in
/// the [`INTERFERENCE_WINDOW`] average: a span's mean already smooths single jobs, but
/// a host stall inside one still lifts it (capped at [`OUTLIER_CAP`]), and at 16 of
/// 128 it moves the average by at most an eighth of the way.
pub const MAX_JOBS_PER_SAMPLE: u32 = INTERFERENCE_WINDOW / 8;

/// Once an estimate is usable, a sample counts at most this many times the current
/// value: a lane descheduled for a while (a 280 ms stall in a batch that takes 25 ms in
/// the testbed) is not the engine's cost, and one such sample in an eight-sample
/// average made the CPU look slower than the module at 1 KiB for the rest of the run.
/// A real change of load still comes through, by up to this factor per sample.
pub const OUTLIER_CAP: f64 = 4.0;

/// A cost sample below 1/`FAST_DOWN` of the estimate counts at least half. Timing
/// noise only adds time (a stall, a lane descheduled, a neighbour's burst), so such a
/// sample says the estimate is inflated: in the soft testbed the module's first 16 KiB
/// probes came out slow during a host stall, and averaged with the dozens of samples an
/// undisturbed estimate spans, the re-measurements that showed its true cost took 11
/// batches to bring the module back (the batch ran 0.53x the module alone). 1.5 rather
/// than 2: an estimate 1.5-2x too high still misleads (it inflates what another
/// engine's help would save, and deflates the slowdowns measured against it), while in
/// a steady state a sample a third below the average is rare ([`OUTLIER_CAP`] keeps one
/// stall from lifting an average of [`WINDOW`] samples by more than 3/8). A load that
/// really eases comes through at once too.
pub const FAST_DOWN: f64 = 1.5;

/// Samples an estimate needs before it is trusted: the first is discarded (warm-up).
pub const MIN_SAMPLES: u32 = 2;

/// Probe jobs an engine may start on a class it has no estimate for (one more than
/// [`MIN_SAMPLES`], so a lane whose first probe is slow still gets its second sample
/// while another lane of the engine holds the third). A lane's probe goes on under its
/// solo past its cold pulls ([`WARM_UP_PULLS`]) until the undisturbed estimate has its
/// [`MIN_SAMPLES`] too.
pub const PROBES: usize = 3;

/// A lane's first pulls after a wait (or its start) are *cold*: booked to the engine's
/// running cost (and, overlapped, to its slowdown beside others), but not to its
/// undisturbed cost. A request after a pause is slower than one after another: on the soft
/// testbed's module, after pauses of 5-100 ms, the median first 4 KiB request took
/// 1.7-2x the ~0.6-0.7 ms of the steady ones that followed back to back, the second
/// 1.15-1.35x, the third 1.0-1.15x (two runs of 25 rounds each, `examples/latency.rs`).
/// Measured by single pulls after the others drained, the module's undisturbed 4 KiB
/// cost came out at 0.80-1.07 ms against 0.51-0.70 ms a job in its own `only:` runs
/// in the same guest, so the CPU (0.74-0.83 ms) was judged the best single engine
/// and the batch ran 0.80x the module alone.
pub const WARM_UP_PULLS: usize = 2;

/// Pulls a re-measurement takes back to back while the other engines wait: its cold
/// ones, then one warm sample.
pub const REMEASURE_PULLS: usize = WARM_UP_PULLS + 1;

/// Probing an unknown engine is allowed only while at least this many jobs per lane
/// remain: a probe then overlaps other lanes' work instead of ending the batch late.
pub const PROBE_MIN_REMAINING_PER_LANE: usize = 4;

/// A declined class is re-measured at most once per batch, and only when the others'
/// remaining work plus the engine's re-measurement credit (the time its batches ran
/// since it last re-measured) is at least this many times the probe's cost (wall plus
/// CPU): re-probes, during which the other engines' lanes wait, then take about 1/200
/// of the time. It was 1/50 of each batch long enough, with no credit: in the soft
/// testbed at 8 KiB the CPU re-measured once in every batch the module ran, starting
/// its lane for one job and holding the module for it, ~7 ms of a 330 ms batch (2%,
/// in a contract that allows 3% for noise and all).
pub const REPROBE_RATIO: f64 = 200.0;

/// The share of [`REPROBE_RATIO`] a re-measurement must be covered by, for an estimate
/// of `samples` samples: a quarter (1/50 of the time, as before the credit) for one as
/// young as can be used ([`MIN_SAMPLES`]), all of it from [`WINDOW`] samples on. An
/// estimate from two probes is the least certain: one host stall during them and the
/// engine is declined on a cost several times its true one (in the two-vCPU testbed the
/// module's first 16 KiB probes came out at 4.7 ms a job against 1.3 ms alone; waiting
/// for the 1/200 credit, it was re-measured three batches later, and the CPU ran those
/// batches alone at about 0.55x what `pull` did), so it is re-measured sooner, and the
/// bound tightens as the estimate settles.
pub fn reprobe_ratio(samples: u32) -> f64 {
    REPROBE_RATIO * f64::from(samples.clamp(MIN_SAMPLES, WINDOW)) / f64::from(WINDOW)
}

/// Another engine may take a class from its best single engine only if the lane time
/// its job costs the others (measured) is at most this fraction of the time the job
/// saves them: mixing engines that share a core pays only when clearly ahead. In the
/// testbed guest, estimates of that slowdown moved by 20-40% between runs; a job that
/// the estimates put at a small net gain was as often a loss (mixing 4 KiB jobs onto
/// the module, predicted ~6% worse or better depending on the run, made batches 40%
/// slower than the CPU alone), so a predicted gain smaller than this is not taken.
pub const MIX_MARGIN: f64 = 0.75;

/// Pulls per lane another engine may run of a class beside its best single engine in a
/// batch, before the mix is measured (a trial) or to measure it again (a check): its
/// cold pulls, then enough warm ones for a measured gain ([`GAIN_MIN_JOBS`]). Four jobs
/// were too few: in the two-vCPU testbed at 4 KiB, a module request beside the CPU
/// lanes took 0.8 ms in such short trials and 1.6 ms in a whole batch mixed (the CPU's
/// jobs 1.2 and 2.0 ms, against 1.05 alone), so the trials measured a 1.2-1.5x gain
/// and the batches that followed them ran ~0.9x the CPU alone.
pub const MIX_TRIALS: usize = WARM_UP_PULLS + GAIN_MIN_JOBS as usize;

/// Trial or check pulls engine `e` may run of a class in a batch: per lane its cold
/// ones, then enough warm ones for [`GAIN_MIN_JOBS`] jobs over all its lanes
/// ([`MIX_TRIALS`] for an engine of one lane that takes one job a pull).
fn trial_pulls<V: View + ?Sized>(v: &V, e: usize) -> usize {
    let lanes = v.lanes(e).max(1);
    let warm = (GAIN_MIN_JOBS as usize).div_ceil(lanes * v.width(e));
    lanes * (WARM_UP_PULLS + warm)
}

/// Samples a class's own slowdown ratio must rest on before it may overrule a more
/// pessimistic ratio measured across classes (the stand-in until then, see
/// [`Interference::slowdown_in`]): about four batches' worth of the trials' overlapped
/// jobs ([`MIX_TRIALS`] trial jobs each overlap a few of the other engine's). With the
/// two samples an estimate needs, a couple of lucky overlaps on one vCPU made a bad mix
/// look good (soft testbed, 8 KiB: the CPU joined the module and batches ran 0.87x the
/// module alone by medians; at 4 KiB 0.78x), so the optimistic side waits for evidence;
/// a pessimistic one counts at once.
pub const MIX_EVIDENCE: u32 = 16;

/// An estimate of a class that rests on fewer than [`WINDOW`] samples and is more than
/// this many times the cost extrapolated from a smaller size in proportion to length
/// (an upper bound for any cost of the form fixed + per-byte, see [`upper_bound`]) is
/// taken for a stall, and a declined engine re-measures the class in the next batch. In
/// the two-vCPU testbed the module's first 16 KiB probes took 16.4 ms a job against
/// ~1-2 ms (its 4 KiB jobs took under 1.2 ms); declined on that, it waited six batches
/// for the re-measurement credit, while the mix it was left out of gained 1.5x. Twice,
/// and only while the estimate is young, for an engine that really is slower per byte
/// at large sizes (a cache falling off): it pays a few re-measurements, no more.
pub const IMPLAUSIBLE: f64 = 2.0;

/// A probe of a class an engine has no estimate for is allowed only if this many
/// times its pessimistic estimate still fits in the time the other lanes need for the
/// remaining work: the extrapolation does not know how much the probe will be slowed
/// by the lanes beside it (a 16-byte probe on the testbed's module, extrapolated at 2
/// ms, took 7.7 ms beside the CPU lane and tripled a 4.7 ms batch).
pub const PROBE_SAFETY: f64 = 4.0;

/// A mix is taken only once the gain it measured over the best single engine alone,
/// less one standard error of that average ([`Gain::value`]), is at least this, and
/// dropped once the average is below it: one
/// batch's gain varies by a third on a noisy host (in the aesni testbed at 8 KiB, two
/// checks measured 0.96 and 1.42, the module joined, and the batch ran 0.51x the CPU
/// alone), so a mix is taken only on samples that agree.
pub const MIX_GAIN: f64 = 1.0;

/// Batches whose measured mix gains are averaged (about the last four): few, so a mix
/// that starts to lose is dropped within a couple of batches.
pub const GAIN_WINDOW: u32 = 4;

/// One batch's measured gain counts as at most this. The reference it rests on can be
/// a few jobs of the best single engine alone, and one host stall among them (in the
/// two-vCPU testbed at 16 KiB, eight module requests at 9.5 ms a job against ~1.2 ms)
/// measured a gain of 7, which alone would have held the mix through four batches
/// whatever they measured. Twice is beyond what a second engine's help gave in any
/// batch `pull` ran in the testbed (up to 1.8x paired). A stall can only add time, so
/// the mixed side needs no floor: a stall there is one of hundreds of jobs.
pub const GAIN_CAP: f64 = 2.0;

/// Measured gains needed before they decide the cost rule instead of the prediction
/// from per-engine estimates.
pub const GAIN_SAMPLES: u32 = 2;

/// Undisturbed jobs a batch needs of an engine for its own rate to stand for the
/// engine alone in that batch's gain; with fewer, its undisturbed estimate does. A
/// mixing engine leaves a class's last jobs to its best single engine so that it has
/// them (see [`decide`]): on this host consecutive batches differ by 20% in speed, and
/// measured against the estimate from earlier batches, a mix that was worth 0.92x
/// measured 0.72x. Eight, not four: four jobs' mean still ranged 0.7-2.5 ms for a
/// module whose batches alone ran 0.8-1.9 ms a job.
pub const GAIN_LOCAL_ALONE: u64 = 8;

/// Warm jobs overlapped by the others an engine must have run of a class in a batch for
/// the batch to measure its gain there.
pub const GAIN_MIN_JOBS: u64 = 8;

/// A class an engine is declined on is mixed again for a check ([`MIX_TRIALS`] pulls a
/// lane beside its best single engine, which measure the mix's gain anew) only when the
/// remaining work plus the engine's check credit (the time its batches ran since its
/// last check) is at least this many times the check's jobs' time: checks then take
/// about 1% of the time, and a mix that loses costs no more than part of that. A mix
/// whose average gain is above [`MIX_GAIN`] but not yet agreed on is checked every
/// batch instead ([`Gain::promising`]): a check costs only what the mix loses, which
/// the average says is nothing, while at 1% of the time, in the two-vCPU testbed at
/// 16 KiB, the two agreeing gains a join needs took 13 batches (7 apart).
pub const CHECK_RATIO: f64 = 100.0;

/// What one engine's lanes did on one class in one batch: jobs and lane seconds,
/// overlapped by another engine's job or not. Summed over a batch, these rates are
/// the measured throughput of the mix and of the engines alone, side by side in time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tally {
    /// Jobs overlapped by another engine's job.
    pub beside_jobs: u64,
    /// The lane seconds those took.
    pub beside_secs: f64,
    /// Jobs no other engine's job overlapped.
    pub alone_jobs: u64,
    /// The lane seconds those took.
    pub alone_secs: f64,
}

impl Tally {
    /// Adds `jobs` jobs that took `secs` seconds of one lane.
    pub fn add(&mut self, jobs: u64, secs: f64, overlapped: bool) {
        if overlapped {
            self.beside_jobs += jobs;
            self.beside_secs += secs;
        } else {
            self.alone_jobs += jobs;
            self.alone_secs += secs;
        }
    }

    fn beside_rate(&self) -> Option<f64> {
        (self.beside_jobs > 0 && self.beside_secs > 0.0)
            .then(|| self.beside_jobs as f64 / self.beside_secs)
    }

    fn alone_rate(&self) -> Option<f64> {
        (self.alone_jobs >= GAIN_LOCAL_ALONE && self.alone_secs > 0.0)
            .then(|| self.alone_jobs as f64 / self.alone_secs)
    }
}

/// A [`Tally`] that the lanes of one engine add to concurrently.
#[derive(Debug, Default)]
pub struct SharedTally {
    beside_jobs: AtomicU64,
    beside_ns: AtomicU64,
    alone_jobs: AtomicU64,
    alone_ns: AtomicU64,
}

impl SharedTally {
    /// Adds `jobs` jobs that took `secs` seconds of one lane.
    pub fn add(&self, jobs: u64, secs: f64, overlapped: bool) {
        let (count, time) = if overlapped {
            (&self.beside_jobs, &self.beside_ns)
        } else {
            (&self.alone_jobs, &self.alone_ns)
        };
        count.fetch_add(jobs, Ordering::Relaxed);
        // Whole nanoseconds: far finer than any job a lane times.
        time.fetch_add((secs * 1e9) as u64, Ordering::Relaxed);
    }

    /// Jobs no other engine's job overlapped, so far.
    pub fn alone_jobs(&self) -> u64 {
        self.alone_jobs.load(Ordering::Relaxed)
    }

    /// The sums so far.
    pub fn get(&self) -> Tally {
        let secs = |t: &AtomicU64| t.load(Ordering::Relaxed) as f64 * 1e-9;
        Tally {
            beside_jobs: self.beside_jobs.load(Ordering::Relaxed),
            beside_secs: secs(&self.beside_ns),
            alone_jobs: self.alone_jobs.load(Ordering::Relaxed),
            alone_secs: secs(&self.alone_ns),
        }
    }
}

/// What engine `e` running a class beside the others gained in one batch, measured:
/// the class's jobs per second over every lane while they ran side by side (each
/// engine's rate from its overlapped jobs), over the rate of the others alone (from
/// their undisturbed jobs of the same batch, or, with fewer than [`GAIN_LOCAL_ALONE`]
/// of those, their undisturbed estimates `alone`). `tallies`, `lanes` and `alone` are
/// per engine, for this class. `None` unless `e` and another engine ran the class
/// overlapped.
///
/// This is what the cost rule predicts from estimates, measured directly and within
/// one batch: estimates averaged over many batches follow a drifting host late, and in
/// the two-vCPU testbed at 16 KiB they put the CPU's time beside the module 15% above
/// what it took and the module's slowdown a quarter above, a gain of ~20% (what
/// `pull` got) predicted as none.
pub fn measured_gain(
    e: usize,
    tallies: &[Tally],
    lanes: &[usize],
    alone: &[Option<Cost>],
) -> Option<f64> {
    let mine = tallies.get(e)?;
    if mine.beside_jobs < GAIN_MIN_JOBS {
        return None;
    }
    let mut with = lanes[e] as f64 * mine.beside_rate()?;
    let mut without = 0.0;
    for (o, t) in tallies.iter().enumerate().filter(|&(o, _)| o != e) {
        let Some(beside) = t.beside_rate() else {
            continue;
        };
        let Some(undisturbed) = t.alone_rate().or_else(|| {
            alone
                .get(o)
                .copied()
                .flatten()
                .filter(|c| c.wall > 0.0)
                .map(|c| 1.0 / c.wall)
        }) else {
            continue;
        };
        with += lanes[o] as f64 * beside;
        without += lanes[o] as f64 * undisturbed;
    }
    (without > 0.0).then(|| with / without)
}

/// The average of the gains measured for one engine mixing into one class, how much
/// they vary, and whether the engine mixes there now.
///
/// Joining asks for more than staying (hysteresis): an engine declined on a class joins
/// once the average less one standard error is at least [`MIX_GAIN`] (the samples
/// agree that it gains), and a mixing engine leaves once the average itself is below
/// it. One threshold for both made a mix worth ~1.15x flicker: in the two-vCPU testbed
/// at 16 KiB one batch's measured gain ranged 0.67-2.2x, the average of four less its
/// error fell below 1 in about every other window, and each time the CPU stayed out for
/// the many batches its checks took to bring it back (it mixed in 7 of 15 rounds). Not
/// the average plus its error: one batch that loses widens the spread as much as it
/// lowers the average, and a mix at 0.5x would run three batches before it left.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Gain {
    mean: f64,
    /// The same average of the squared gains.
    square: f64,
    samples: u32,
    /// Whether the last verdict was to mix.
    mixing: bool,
    /// The last batch's gain.
    last: f64,
}

impl Gain {
    /// A gain measured beforehand (the calibration store runs the engines side by
    /// side), counted as [`GAIN_SAMPLES`] agreeing batches: it decides the cost rule at
    /// once, with no trial jobs, and the batches' own gains move it from then on.
    pub fn seeded(gain: f64) -> Self {
        let gain = gain.min(GAIN_CAP);
        Gain {
            mean: gain,
            square: gain * gain,
            samples: GAIN_SAMPLES,
            mixing: gain >= MIX_GAIN,
            last: gain,
        }
    }

    /// Adds one batch's measured gain (at most [`GAIN_CAP`]): a plain mean of the
    /// first few, then a moving average over about [`GAIN_WINDOW`] batches; then decides
    /// again whether to mix.
    pub fn observe(&mut self, gain: f64) {
        let gain = gain.min(GAIN_CAP);
        self.samples = self.samples.saturating_add(1);
        let weight = 1.0 / f64::from(self.samples.min(GAIN_WINDOW));
        self.mean += weight * (gain - self.mean);
        self.square += weight * (gain * gain - self.square);
        self.last = gain;
        if let Some(value) = self.value() {
            self.mixing = value >= MIX_GAIN;
        }
    }

    /// Once it rests on [`GAIN_SAMPLES`] batches, the gain the cost rule compares with
    /// [`MIX_GAIN`]: while the engine mixes, the average; while it does not, the average
    /// less one standard error (from the samples' spread, over the batches it spans),
    /// so that gains that disagree count for less than the same average from gains
    /// that agree.
    pub fn value(&self) -> Option<f64> {
        if self.samples < GAIN_SAMPLES {
            return None;
        }
        if self.mixing {
            return Some(self.mean);
        }
        let n = f64::from(self.samples.min(GAIN_WINDOW));
        let spread = (self.square - self.mean * self.mean).max(0.0) * n / (n - 1.0);
        Some(self.mean - (spread / n).sqrt())
    }

    /// Whether the engine does not mix but the average of its gains says it would gain:
    /// one batch has measured a gain, or more have and they disagree too much to join
    /// on ([`Gain::value`]). Such a mix is checked every batch rather than on the check
    /// credit ([`CHECK_RATIO`]).
    pub fn promising(&self) -> bool {
        !self.mixing && self.samples > 0 && self.mean >= MIX_GAIN
    }

    /// The gain the last batch measured, once one has.
    pub fn last(&self) -> Option<f64> {
        (self.samples > 0).then_some(self.last)
    }

    /// Batches measured so far.
    pub fn samples(&self) -> u32 {
        self.samples
    }
}

/// A running estimate of one engine's cost for one class.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    wall: f64,
    cpu: f64,
    samples: u32,
}

impl Estimate {
    /// An estimate that starts from a cost measured beforehand (the calibration store,
    /// the median of dozens to thousands of undisturbed requests) as if from [`WINDOW`]
    /// samples: usable at once and settled, so it is not re-measured as soon as a young
    /// estimate of two probes is (see [`reprobe_ratio`]; seeded at two samples, the
    /// module re-measured 256-byte jobs alone in the soft testbed's first batches, the
    /// CPU waiting, and short runs lost up to a quarter to it), while the run's own
    /// samples move it as any settled estimate (1/[`WINDOW`] each, at least half for
    /// one far below it), so a machine that changed since is noticed within a few
    /// dozen jobs.
    pub fn seeded(wall: f64, cpu: f64) -> Self {
        Estimate {
            wall,
            cpu,
            samples: WINDOW,
        }
    }

    /// Adds one job's measured wall and CPU time (seconds) to an average over about
    /// the last [`WINDOW`] samples.
    pub fn observe(&mut self, wall: f64, cpu: f64) {
        self.observe_over(wall, cpu, WINDOW);
    }

    /// Adds one job's measured wall and CPU time (seconds) to an average over about
    /// the last `window` samples; a sample far below the estimate counts at least
    /// half (see [`FAST_DOWN`]).
    pub fn observe_over(&mut self, wall: f64, cpu: f64, window: u32) {
        self.update(wall, cpu, window, 1, true);
    }

    /// As [`Estimate::observe_over`] for the mean of `jobs` jobs, which counts as that
    /// many samples of it in the moving average (still one towards [`MIN_SAMPLES`]).
    /// A run of an engine alone books its jobs a span at a time, dozens each; at one
    /// sample per span, an undisturbed average over [`INTERFERENCE_WINDOW`] samples
    /// took dozens of batches to follow the machine (two-vCPU testbed, 16 KiB: the
    /// module alone slowed from 1.3 to 2-3.5 ms a job for six batches while its
    /// estimate crept to 1.65, and the CPU, whose help `pull` showed worth 1.5x
    /// there, stayed out).
    pub fn observe_jobs(&mut self, wall: f64, cpu: f64, window: u32, jobs: u32) {
        self.update(wall, cpu, window, jobs, true);
    }

    /// Adds one sample of a slowdown ratio to an average over about the last `window`
    /// samples, every sample at its plain weight: ratios come in bursts (most overlapped
    /// jobs see none, a few a lot), so one at 1 is no sign that the average is off.
    pub fn observe_ratio(&mut self, ratio: f64, window: u32) {
        self.update(ratio, ratio, window, 1, false);
    }

    fn update(&mut self, wall: f64, cpu: f64, window: u32, jobs: u32, fast_down: bool) {
        // The first sample is only a placeholder (warm-up); of a cost, the lower of the
        // first two starts the estimate (timing noise only adds time: one host stall in
        // the two probes an estimate starts from set the soft testbed module's
        // undisturbed 16 KiB cost at 4.4 ms against its 0.7 ms, and the module lost the
        // size for the whole run), of a ratio the second; then a plain mean until
        // `window` samples are in, so early samples are not over-weighted, and from then
        // on an exponential moving average of that span.
        if self.samples < MIN_SAMPLES {
            let keep = fast_down && self.samples > 0 && self.wall > 0.0 && wall >= self.wall;
            if !keep {
                self.wall = wall;
                self.cpu = cpu;
            }
        } else {
            let (wall, cpu) = if self.wall > 0.0 {
                (
                    wall.min(self.wall * OUTLIER_CAP),
                    cpu.min(self.cpu.max(self.wall) * OUTLIER_CAP),
                )
            } else {
                (wall, cpu)
            };
            let one = 1.0 / f64::from((self.samples + 2 - MIN_SAMPLES).min(window.max(1)));
            // `jobs` samples of the same value at weight `one` each.
            let mut alpha = 1.0 - (1.0 - one).powi(i32::try_from(jobs.max(1)).unwrap_or(i32::MAX));
            if fast_down && wall * FAST_DOWN < self.wall {
                alpha = alpha.max(0.5);
            }
            self.wall += alpha * (wall - self.wall);
            self.cpu += alpha * (cpu - self.cpu);
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
        self.observe_over(wall, cpu, WINDOW)
    }

    /// As [`SharedEstimate::observe`], averaging over about `window` samples.
    pub fn observe_over(&self, wall: f64, cpu: f64, window: u32) -> bool {
        self.update(|e| e.observe_over(wall, cpu, window))
    }

    /// As [`Estimate::observe_jobs`]; returns whether the estimate became usable.
    pub fn observe_jobs(&self, wall: f64, cpu: f64, window: u32, jobs: u32) -> bool {
        self.update(|e| e.observe_jobs(wall, cpu, window, jobs))
    }

    /// As [`Estimate::observe_ratio`]; returns whether the estimate became usable.
    pub fn observe_ratio(&self, ratio: f64, window: u32) -> bool {
        self.update(|e| e.observe_ratio(ratio, window))
    }

    fn update(&self, add: impl FnOnce(&mut Estimate)) -> bool {
        let mut e = self.get();
        add(&mut e);
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
    /// Samples behind engine `e`'s estimate for class `q`.
    fn samples(&self, e: usize, q: usize) -> u32;
    /// Probe jobs engine `e` has started on class `q` while it had no estimate.
    fn probes(&self, e: usize, q: usize) -> usize;
    /// Whether engine `e` may still re-measure class `q` in this batch.
    fn may_reprobe(&self, e: usize, q: usize) -> bool;
    /// Seconds engine `e`'s earlier batches ran since it last re-measured a class it
    /// declines (see [`REPROBE_RATIO`]).
    fn reprobe_credit(&self, e: usize) -> f64;
    /// Trial jobs engine `e` has started on class `q` in this batch beside the class's
    /// best single engine, before their slowdown was measured.
    fn trials(&self, e: usize, q: usize) -> usize;
    /// Engine `e`'s estimate for the largest size bucket below class `q`'s with the same
    /// cipher and direction, with that bucket.
    fn smaller_known(&self, e: usize, q: usize) -> Option<(usize, Cost)>;
    /// Engine `e`'s cost for class `q` when no other engine's job ran beside it.
    fn alone(&self, e: usize, q: usize) -> Option<Cost>;
    /// The fraction of a lane's time engine `e` loses on class `q` while another
    /// engine's job runs beside it, once measured (on that class if it has been, else
    /// across classes).
    fn slowdown(&self, e: usize, q: usize) -> Option<f64>;
    /// Whether [`View::slowdown`] of engine `e` on class `q` rests on the class's own
    /// measurement ([`MIX_EVIDENCE`] samples), not on the stand-in across classes.
    fn slowdown_measured(&self, e: usize, q: usize) -> bool;
    /// The gains engine `e` brought running class `q` beside the others, measured over
    /// recent batches (see [`measured_gain`]).
    fn gain(&self, e: usize, q: usize) -> Gain;
    /// Seconds engine `e`'s earlier batches ran since it last checked a mix it is
    /// declined on (see [`CHECK_RATIO`]).
    fn check_credit(&self, e: usize) -> f64;
    /// Warm jobs of class `q` engine `e` has run in this batch with no other engine's
    /// job beside them (see [`GAIN_LOCAL_ALONE`]).
    fn alone_jobs(&self, e: usize, q: usize) -> u64;
    /// Jobs a lane of engine `e` takes in one pull, at least 1 (a multi-buffer CPU lane
    /// several, all finishing together).
    fn width(&self, e: usize) -> usize;
}

/// What an engine's lanes measure about the other engines' jobs running beside theirs.
#[derive(Debug, Default)]
pub struct Interference {
    /// Per model key: the cost of a job that no other engine's job overlapped.
    alone: Vec<SharedEstimate>,
    /// Per model key: wall time of an overlapped job over the key's alone wall time
    /// (in the estimate's wall field). How much a job is slowed depends on its length
    /// against the others' bursts (on one core, a 16 KiB module request waits out CPU
    /// time slices that an 8-byte one mostly misses), so a class's own ratio is used
    /// once measured.
    ratios: Vec<SharedEstimate>,
    /// The same ratio across classes: the stand-in for a class not yet measured.
    ratio: SharedEstimate,
}

impl Interference {
    /// Starts from stored estimates: per key alone and ratio, and the ratio across keys.
    pub fn new(alone: Vec<Estimate>, ratios: Vec<Estimate>, ratio: Estimate) -> Self {
        Interference {
            alone: alone.into_iter().map(SharedEstimate::new).collect(),
            ratios: ratios.into_iter().map(SharedEstimate::new).collect(),
            ratio: SharedEstimate::new(ratio),
        }
    }

    /// Books `jobs` jobs of model key `key` (wall and CPU seconds per job), overlapped
    /// by another engine's job or not; returns whether an estimate became usable.
    pub fn record(&self, key: usize, wall: f64, cpu: f64, jobs: u32, overlapped: bool) -> bool {
        let Some(alone) = self.alone.get(key) else {
            return false;
        };
        if !overlapped {
            return alone.observe_jobs(
                wall,
                cpu,
                INTERFERENCE_WINDOW,
                jobs.min(MAX_JOBS_PER_SAMPLE),
            );
        }
        // An overlapped job's time is an upper bound of the undisturbed one (noise
        // and neighbours only add time), so one far below the undisturbed estimate
        // corrects it as an undisturbed sample would (see [`FAST_DOWN`]). An engine
        // that always runs beside another books no undisturbed samples, and without
        // this an estimate that one host stall had inflated stayed so: in the aesni
        // testbed at 16 KiB the CPU's went from 0.3 to 0.82 ms a job in a batch it ran
        // alone; from then on the module ran beside it, the CPU's jobs, at 0.35-0.6 ms,
        // looked undisturbed against 0.82, and the module's help that slowed them
        // looked free (the batches ran 0.62x the CPU alone).
        // (The estimate is usable already, so this never makes it so.)
        if alone.cost().is_some_and(|a| wall * FAST_DOWN < a.wall) {
            alone.observe_over(wall, cpu, INTERFERENCE_WINDOW);
        }
        match alone.cost() {
            Some(a) if a.wall > 0.0 => {
                let r = wall / a.wall;
                let own = self
                    .ratios
                    .get(key)
                    .is_some_and(|e| e.observe_ratio(r, INTERFERENCE_WINDOW));
                self.ratio.observe_ratio(r, INTERFERENCE_WINDOW) | own
            }
            _ => false,
        }
    }

    /// The cost of a job of model key `key` with no other engine's job beside it.
    pub fn alone(&self, key: usize) -> Option<Cost> {
        self.alone.get(key)?.cost()
    }

    /// The fraction of a lane's time lost while another engine's job runs beside it,
    /// across classes.
    pub fn slowdown(&self) -> Option<f64> {
        Some(lost_fraction(self.ratio.cost()?.wall))
    }

    /// The same for model key `key`. Its own ratio once it rests on [`MIX_EVIDENCE`]
    /// samples; before that the ratio across keys stands in, unless the key's own,
    /// already usable, is worse. Slowdowns differ by class (in the two-vCPU testbed
    /// the CPU lanes slowed the module's 1-4 KiB requests far more than its 16 KiB
    /// ones), so the stand-in can be pessimistic; a few samples of the class itself
    /// overrule it only in the safe direction.
    pub fn slowdown_in(&self, key: usize) -> Option<f64> {
        let own = self.ratios.get(key).map(SharedEstimate::get);
        let across = self.ratio.cost().map(|c| c.wall);
        let ratio = match (own, across) {
            (Some(own), _) if own.samples() >= MIX_EVIDENCE => own.cost().map(|c| c.wall),
            (Some(own), Some(across)) => Some(own.cost().map_or(across, |c| c.wall.max(across))),
            (Some(own), None) => own.cost().map(|c| c.wall),
            (None, across) => across,
        };
        ratio.map(lost_fraction)
    }

    /// Whether model key `key`'s own ratio rests on enough samples ([`MIX_EVIDENCE`])
    /// to decide alone; until then [`Self::slowdown_in`] leans on the ratio across keys.
    pub fn measured_in(&self, key: usize) -> bool {
        self.ratios
            .get(key)
            .is_some_and(|e| e.get().samples() >= MIX_EVIDENCE)
    }

    /// The estimates, to keep: per key alone and ratio, and the ratio across keys.
    pub fn snapshot(&self) -> (Vec<Estimate>, Vec<Estimate>, Estimate) {
        (
            self.alone.iter().map(SharedEstimate::get).collect(),
            self.ratios.iter().map(SharedEstimate::get).collect(),
            self.ratio.get(),
        )
    }
}

/// The fraction of time lost when a job takes `ratio` times its undisturbed time.
pub fn lost_fraction(ratio: f64) -> f64 {
    if ratio > 1.0 {
        1.0 - 1.0 / ratio
    } else {
        0.0
    }
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

/// Whether engine `me`'s estimate for class `q` (running cost `c`), young, is more than
/// [`IMPLAUSIBLE`] times the pessimistic extrapolation from a smaller size it knows
/// ([`upper_bound`]): then a stall inflated it, and a declined class is re-measured
/// at once rather than on the re-measurement credit.
fn implausible<V: View + ?Sized>(v: &V, me: usize, q: usize, c: Cost) -> bool {
    let estimate = v.alone(me, q).unwrap_or(c).wall;
    v.samples(me, q) < WINDOW
        && upper_bound(v, me, q).is_some_and(|bound| estimate > IMPLAUSIBLE * bound)
}

/// What a free lane should do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Take jobs of this class.
    Take(usize),
    /// Take one job of this class to measure it (count it as a probe).
    Probe(usize),
    /// Take one job of this class beside its best single engine, to measure how much
    /// the two slow each other (count it as a trial).
    Trial(usize),
    /// Start a check of a mix this engine is declined on: as [`Decision::Trial`], and
    /// it spends the engine's check credit (see [`CHECK_RATIO`]).
    Check(usize),
    /// Jobs this lane could run remain, but others will finish them sooner: wait for
    /// the situation to change.
    Wait,
    /// Nothing left that this lane's engine can run.
    Done,
}

/// Whether engine `e` passes the cost rule for class `q` (see the module documentation):
/// always when every lane has a core of its own, and for the best single engine of the
/// class; for another engine, whether the lane time one of its jobs costs the others is
/// less than what the job would cost them undisturbed.
fn cost_rule<V: View + ?Sized>(v: &V, e: usize, q: usize, steal: f64) -> bool {
    cost_verdict(v, e, q, steal) == Verdict::Worth
}

/// The cost rule's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// The engine may take the class.
    Worth,
    /// Measured: the engine's jobs cost the others more than they save them.
    NotWorth,
    /// Not known yet: the best single engine first measures the class undisturbed.
    HoldOff,
    /// Not known yet: how much this engine's jobs slow the others (or the others slow
    /// it) is not measured on this class; a few trial jobs ([`MIX_TRIALS`]) a batch
    /// measure it.
    Unmeasured,
}

/// The engine in `mask` that would finish class `q` soonest on its own: most lanes per
/// second of undisturbed time per job (until measured undisturbed, of any time less the
/// engine's measured slowdown beside others: an engine that has only run beside
/// another, e.g. its trials, must not look slower than it is and stay out for good).
fn best_single<V: View + ?Sized>(v: &V, q: usize) -> Option<usize> {
    let mask = v.class_engines(q);
    (0..v.engines())
        .filter(|&o| mask.contains(o) && v.lanes(o) > 0)
        .filter_map(|o| {
            let wall = match v.alone(o, q) {
                Some(a) => a.wall,
                None => v.cost(o, q)?.wall * (1.0 - v.slowdown(o, q).unwrap_or(0.0)),
            };
            (wall > 0.0).then(|| (o, v.lanes(o) as f64 / wall))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(o, _)| o)
}

/// The cost rule with its reason (see [`cost_rule`]).
fn cost_verdict<V: View + ?Sized>(v: &V, e: usize, q: usize, steal: f64) -> Verdict {
    if steal <= 0.0 {
        return Verdict::Worth;
    }
    let Some(mine) = v.cost(e, q) else {
        return Verdict::Worth;
    };
    let Some(best) = best_single(v, q) else {
        return Verdict::Worth;
    };
    if best == e {
        return Verdict::Worth;
    }
    let Some(best_alone) = v.alone(best, q) else {
        return Verdict::HoldOff;
    };
    // What the mix gained when it ran, measured, decides over what the estimates
    // predict; the prediction (below) only decides until then.
    if let Some(gain) = v.gain(e, q).value() {
        return if gain >= MIX_GAIN {
            Verdict::Worth
        } else {
            Verdict::NotWorth
        };
    }
    let mask = v.class_engines(q);
    // Lane-seconds the others lose per second of this engine's work, and whether all
    // of them have measured it.
    let mut slowdown = 0.0;
    let mut measured = true;
    // The lane time the job would take elsewhere, undisturbed.
    let mut gain = best_alone.wall;
    for o in (0..v.engines()).filter(|&o| o != e && mask.contains(o) && v.lanes(o) > 0) {
        if let Some(a) = v.alone(o, q) {
            gain = gain.min(a.wall);
        }
        match v.slowdown(o, q) {
            Some(s) => slowdown += v.lanes(o) as f64 * s,
            None => measured = false,
        }
    }
    let lost = if measured {
        // This engine's lanes together cause the measured slowdown; one job's share.
        // A job of this engine lasts as long as it does *beside* the others, which on
        // a shared core can be several times its estimate from mostly undisturbed
        // pulls (soft testbed, one vCPU, 8 KiB: 6.8 ms beside the module's driver
        // against 2.3 ms alone); judged by the shorter time, the CPU lane kept
        // joining the module's class and the batch ran 0.73x the module alone.
        //
        // Once this engine's own slowdown on the class is measured, its undisturbed cost
        // over that slowdown is the longer-run measure of the same time, and the one to
        // go by: a declined engine runs no jobs, so its running cost stays whatever its
        // last jobs met (two-vCPU testbed, 16 KiB: a host stall left the CPU's at 14 ms
        // against 5.3 ms alone and a measured 1.5x slowdown; the module alone then took
        // 2-2.7 ms a job for three batches where the CPU's help was worth 1.5x, and the
        // CPU stayed out).
        let beside = match (v.alone(e, q), v.slowdown(e, q)) {
            (Some(alone), Some(own)) if own < 1.0 => {
                let from_alone = alone.wall / (1.0 - own);
                if v.slowdown_measured(e, q) {
                    from_alone
                } else {
                    mine.wall.max(from_alone)
                }
            }
            _ => mine.wall,
        };
        slowdown * beside / v.lanes(e).max(1) as f64
    } else {
        return unmeasured(v, e, mine, gain, steal);
    };
    if lost < gain * MIX_MARGIN {
        Verdict::Worth
    } else if (0..v.engines())
        .filter(|&o| o == e || (mask.contains(o) && v.lanes(o) > 0))
        .all(|o| v.slowdown_measured(o, q))
    {
        // Measured on this class itself (not on the stand-in across classes), asked
        // only here: the rule runs on every pull.
        Verdict::NotWorth
    } else {
        // A "no" that rests on other classes' slowdowns, which can be far from this
        // one's, is not final: a "no" that stopped every mix would never measure the
        // class (in the two-vCPU testbed the CPU never joined 16 KiB, where `pull`
        // gained 1.59x, on a stand-in from the module's 1-4 KiB requests). Trial jobs
        // measure it, and the class's own ratio decides once it rests on
        // [`MIX_EVIDENCE`] samples.
        unmeasured(v, e, mine, gain, steal)
    }
}

/// The cost rule's answer for engine `e` (cost `mine` per job) while its slowdowns on
/// the class are not measured: a few trial jobs, unless it is a module whose thread's
/// own CPU time, a lower bound of what it takes from the CPU lanes, already exceeds
/// what it may cost them.
fn unmeasured<V: View + ?Sized>(v: &V, e: usize, mine: Cost, gain: f64, steal: f64) -> Verdict {
    if !v.uses_host_cpu(e) && steal * mine.cpu >= gain * MIX_MARGIN {
        Verdict::NotWorth
    } else {
        Verdict::Unmeasured
    }
}

/// Whether engine `me` (cost `c` per job), let into class `q` by the gain its mix
/// measured, leaves the class's remaining jobs to the class's best single engine: once
/// they are few enough that this engine's job would still be running when the best
/// single engine, on its own, had [`GAIN_LOCAL_ALONE`] jobs left (plus one a lane for
/// the jobs that overlap its last), unless the batch already measured it alone.
fn leaves_the_tail<V: View + ?Sized>(v: &V, me: usize, q: usize, c: Cost) -> bool {
    if v.gain(me, q).value().is_none() {
        return false;
    }
    let Some(best) = best_single(v, q).filter(|&b| b != me) else {
        return false;
    };
    if v.alone_jobs(best, q) >= GAIN_LOCAL_ALONE {
        return false;
    }
    let Some(alone) = v.alone(best, q).filter(|a| a.wall > 0.0) else {
        return false;
    };
    // This engine's pull lasts `width` of its jobs; the best single engine's lanes take
    // theirs `width` at a time too.
    let lanes = v.lanes(best) as f64;
    let pull = v.width(me) as f64 * c.wall;
    let tail = lanes * (pull / alone.wall + v.width(best) as f64) + GAIN_LOCAL_ALONE as f64;
    (v.remaining(q) as f64) <= tail
}

/// Engine `e`'s cost for class `q` if it takes jobs of the class now: it has an
/// estimate, passes the cost rule, and does not leave the class's last jobs to the
/// best single engine ([`leaves_the_tail`]). What the end-game rule counts on from the
/// other engines: counting an engine that leaves the tail made every lane wait with
/// two jobs left and none running (the CPU lanes waited for the module, which left
/// them the tail), a batch that never ended.
fn taking<V: View + ?Sized>(v: &V, e: usize, q: usize, steal: f64) -> Option<Cost> {
    let c = v.cost(e, q)?;
    (cost_rule(v, e, q, steal) && !(steal > 0.0 && leaves_the_tail(v, e, q, c))).then_some(c)
}

/// Jobs per second that every lane but one lane of `me` completes on class `q`, counting
/// only engines that take it now ([`taking`]).
fn others_rate<V: View + ?Sized>(v: &V, me: usize, q: usize, steal: f64) -> f64 {
    let mask = v.class_engines(q);
    let mut rate = 0.0;
    for e in (0..v.engines()).filter(|&e| mask.contains(e)) {
        let lanes = v.lanes(e) - usize::from(e == me).min(v.lanes(e));
        if lanes == 0 {
            continue;
        }
        if let Some(c) = taking(v, e, q, steal) {
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
    // smallest class to probe; a trial or check job to run.
    let mut best: Option<(f64, usize, usize)> = None;
    let mut probe: Option<(usize, usize)> = None;
    let mut trial: Option<Decision> = None;
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
            if v.cost(e, q).is_some() {
                others_known = true;
                if let Some(c) = taking(v, e, q, steal) {
                    best_other_engine = best_other_engine.min(c.wall);
                }
            }
        }
        if !others_exist {
            // Only this engine can run these: they are ours whatever they cost.
            return Decision::Take(q);
        }
        let Some(c) = v.cost(me, q) else {
            let may_probe_q = may_probe && v.probes(me, q) < PROBES;
            // Nobody knows this class: someone must explore it. Otherwise probe only
            // if even the pessimistic extrapolation cannot delay the batch.
            let safe = !others_known
                || upper_bound(v, me, q).is_none_or(|t| PROBE_SAFETY * t <= others_time);
            if may_probe_q && safe {
                if probe.is_none_or(|p| v.bucket(q) < p.0) {
                    probe = Some((v.bucket(q), q));
                }
            } else if !others_known && !may_probe_q {
                // Nobody knows better and probing is over: share it as `pull` would.
                return Decision::Take(q);
            }
            continue;
        };
        let mut fastest_other_lane = best_other_engine;
        if v.lanes(me) > 1 {
            fastest_other_lane = fastest_other_lane.min(c.wall);
        }
        let horizon = others_time.max(fastest_other_lane);
        let verdict = cost_verdict(v, me, q, steal);
        if verdict == Verdict::Unmeasured {
            // Mix only for a few jobs until the slowdown is measured.
            if trial.is_none() && v.trials(me, q) < trial_pulls(v, me) && c.wall <= horizon {
                trial = Some(Decision::Trial(q));
            }
            continue;
        }
        if verdict != Verdict::Worth || c.wall > horizon {
            if verdict == Verdict::NotWorth {
                // Re-measure a declined class now and then, but not while the CPU lanes
                // are measuring it undisturbed.
                if v.may_reprobe(me, q)
                    && (implausible(v, me, q, c)
                        || others_time + v.reprobe_credit(me)
                            >= reprobe_ratio(v.samples(me, q))
                                * REMEASURE_PULLS as f64
                                * (c.wall + c.cpu))
                {
                    return Decision::Probe(q);
                }
                // And check the mix itself now and then: a gain the estimates miss (or
                // one the machine has come to allow) shows only in a mix that runs.
                let tried = v.trials(me, q);
                if trial.is_none() && may_probe && c.wall <= horizon && tried < trial_pulls(v, me) {
                    if tried > 0 {
                        trial = Some(Decision::Trial(q));
                    } else if v.gain(me, q).promising()
                        || others_time + v.check_credit(me)
                            >= CHECK_RATIO * trial_pulls(v, me) as f64 * v.width(me) as f64
                                / v.lanes(me).max(1) as f64
                                * c.wall
                    {
                        trial = Some(Decision::Check(q));
                    }
                }
            }
            continue;
        }
        if steal > 0.0 && leaves_the_tail(v, me, q, c) {
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
    match (probe, best, trial) {
        (Some((_, q)), _, _) => Decision::Probe(q),
        (None, Some((_, _, q)), _) => Decision::Take(q),
        (None, None, Some(d)) => d,
        (None, None, None) => Decision::Wait,
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
    }

    #[test]
    fn a_sample_far_below_a_cost_estimate_counts_half_but_not_in_a_ratio() {
        let mut cost = Estimate::default();
        let mut ratio = Estimate::default();
        for _ in 0..40 {
            cost.observe_over(4.0, 4.0, INTERFERENCE_WINDOW);
            ratio.observe_ratio(4.0, INTERFERENCE_WINDOW);
        }
        // Not far below: the plain weight of a mean over 40 samples.
        cost.observe_over(3.0, 3.0, INTERFERENCE_WINDOW);
        assert!((cost.cost().unwrap().wall - (4.0 - 1.0 / 40.0)).abs() < 1e-9);
        // Far below: at least half.
        let before = cost.cost().unwrap().wall;
        cost.observe_over(1.0, 1.0, INTERFERENCE_WINDOW);
        assert!((cost.cost().unwrap().wall - (before + 1.0) / 2.0).abs() < 1e-9);
        // A ratio sample of 1 is the common case beside a bursty neighbour.
        ratio.observe_ratio(1.0, INTERFERENCE_WINDOW);
        assert!((ratio.cost().unwrap().wall - (4.0 - 3.0 / 40.0)).abs() < 1e-9);
    }

    #[test]
    fn a_span_of_jobs_counts_as_that_many_samples_up_to_a_cap() {
        let settled = || {
            let mut e = Estimate::default();
            for _ in 0..200 {
                e.observe_over(1.0, 1.0, INTERFERENCE_WINDOW);
            }
            e
        };
        let one = 1.0 / f64::from(INTERFERENCE_WINDOW);
        let mut e = settled();
        e.observe_jobs(2.0, 2.0, INTERFERENCE_WINDOW, 1);
        assert!((e.cost().unwrap().wall - (1.0 + one)).abs() < 1e-9);
        let mut e = settled();
        e.observe_jobs(2.0, 2.0, INTERFERENCE_WINDOW, 10);
        let ten = 1.0 - (1.0 - one).powi(10);
        assert!((e.cost().unwrap().wall - (1.0 + ten)).abs() < 1e-9);
        assert_eq!(e.samples(), 201, "still one sample towards MIN_SAMPLES");

        // Through `Interference`, a sole run's span of 400 jobs counts as the cap.
        let i = Interference::new(
            vec![settled()],
            vec![Estimate::default()],
            Estimate::default(),
        );
        i.record(0, 2.0, 2.0, 400, false);
        let capped = 1.0 - (1.0 - one).powi(MAX_JOBS_PER_SAMPLE as i32);
        assert!((i.alone(0).unwrap().wall - (1.0 + capped)).abs() < 1e-9);
    }

    #[test]
    fn an_overlapped_job_far_below_the_undisturbed_estimate_lowers_it() {
        let mut alone = Estimate::default();
        for _ in 0..200 {
            alone.observe_over(3.0, 3.0, INTERFERENCE_WINDOW);
        }
        let i = Interference::new(vec![alone], vec![Estimate::default()], Estimate::default());
        // Overlapped and slower: a slowdown sample; the undisturbed estimate stays.
        i.record(0, 4.5, 4.5, 1, true);
        assert_eq!(i.alone(0).unwrap().wall, 3.0);
        // Overlapped yet faster, but not far: noise either way; it stays.
        i.record(0, 2.5, 2.5, 1, true);
        assert_eq!(i.alone(0).unwrap().wall, 3.0);
        // Far faster: the undisturbed estimate was inflated; half way down at once.
        i.record(0, 1.0, 1.0, 1, true);
        assert!((i.alone(0).unwrap().wall - 2.0).abs() < 1e-9);
    }

    /// `pull`'s jobs in one two-vCPU testbed run at 16 KiB: the CPU's two lanes took 5.8
    /// ms a job beside the module, the module 1.87 ms beside them and 1.35 ms alone.
    #[test]
    fn a_mix_gain_is_the_mixed_throughput_over_the_others_alone() {
        let ms = 1e-3;
        let mut cpu = Tally::default();
        cpu.add(8, 8.0 * 5.8 * ms, true);
        let mut module = Tally::default();
        module.add(10, 10.0 * 1.87 * ms, true);
        module.add(20, 20.0 * 1.35 * ms, false);
        let lanes = [2, 1];
        let estimate = Cost {
            wall: 2.7 * ms,
            cpu: 0.1 * ms,
        };
        let alone = [None, Some(estimate)];
        let expected = (2.0 / 5.8 + 1.0 / 1.87) / (1.0 / 1.35);
        let g = measured_gain(0, &[cpu, module], &lanes, &alone).unwrap();
        assert!((g - expected).abs() < 1e-6, "{g} vs {expected}");
        // Too few undisturbed jobs in the batch: the undisturbed estimate stands in.
        let mut few = Tally::default();
        few.add(10, 10.0 * 1.87 * ms, true);
        few.add(GAIN_LOCAL_ALONE - 1, 1.0 * ms, false);
        let g = measured_gain(0, &[cpu, few], &lanes, &alone).unwrap();
        assert!((g - (2.0 / 5.8 + 1.0 / 1.87) / (1.0 / 2.7)).abs() < 1e-6);
        // Too little beside each other, or nothing: nothing measured.
        let mut short = Tally::default();
        short.add(GAIN_MIN_JOBS - 1, 7.0 * 5.8 * ms, true);
        assert_eq!(measured_gain(0, &[short, module], &lanes, &alone), None);
        assert_eq!(
            measured_gain(0, &[Tally::default(), module], &lanes, &alone),
            None
        );
        let mut apart = Tally::default();
        apart.add(20, 20.0 * 1.35 * ms, false);
        assert_eq!(measured_gain(0, &[cpu, apart], &lanes, &alone), None);
        // Shared between lanes, the same sums.
        let shared = SharedTally::default();
        shared.add(8, 8.0 * 5.8 * ms, true);
        let got = shared.get();
        assert_eq!(got.beside_jobs, 8);
        assert!((got.beside_secs - cpu.beside_secs).abs() < 1e-9);

        // Averaged over batches, usable from the second, less a standard error.
        let mut gain = Gain::default();
        gain.observe(1.2);
        assert_eq!(gain.value(), None);
        gain.observe(1.2);
        assert!((gain.value().unwrap() - 1.2).abs() < 1e-9);
        let mut apart = Gain::default();
        apart.observe(0.96);
        apart.observe(1.42);
        // Mean 1.19; the two samples' standard deviation 0.325, over two: 0.23.
        assert!((apart.value().unwrap() - 0.96).abs() < 1e-9, "{apart:?}");
        assert_eq!(apart.last(), Some(1.42));
        for _ in 0..20 {
            gain.observe(0.8);
        }
        assert!((gain.value().unwrap() - 0.8).abs() < 0.02);
    }

    /// A mix worth ~1.15x whose batches measure it anywhere from 0.8x to 1.5x, as in
    /// the two-vCPU testbed at 16 KiB, joins once two batches agree and then stays
    /// through the low ones; with the join rule's discount also for staying, it left
    /// within a few batches. A mix that falls to 0.5x is left at the next batch, and a
    /// mix that gains nothing is never joined.
    #[test]
    fn a_mix_is_joined_on_agreeing_gains_and_left_when_its_average_loses() {
        let noisy = [
            1.2, 1.3, 0.85, 1.5, 0.8, 1.1, 1.35, 0.9, 1.25, 0.85, 1.4, 1.0,
        ];
        let mean = noisy.iter().sum::<f64>() / noisy.len() as f64;
        assert!((mean - 1.13).abs() < 0.01, "{mean}");
        let mut gain = Gain::default();
        let mut verdicts = Vec::new();
        for &g in &noisy {
            gain.observe(g);
            verdicts.push(gain.value().map(|v| v >= MIX_GAIN));
        }
        assert_eq!(verdicts[0], None);
        assert!(
            verdicts[1..].iter().all(|&v| v == Some(true)),
            "{verdicts:?}"
        );
        // The join rule alone (average less its error) would have dropped it.
        let mut strict = Gain::default();
        let dropped = noisy.iter().any(|&g| {
            strict.observe(g);
            strict.mixing = false;
            strict.value().is_some_and(|v| v < MIX_GAIN)
        });
        assert!(dropped, "the noise is too weak to tell the rules apart");

        gain.observe(0.5);
        assert!(gain.value().is_some_and(|v| v < MIX_GAIN), "{gain:?}");
        // Left: joining again takes gains that agree.
        gain.observe(1.15);
        assert!(gain.value().is_some_and(|v| v < MIX_GAIN), "{gain:?}");

        // One stalled reference counts as a gain of GAIN_CAP, not 7.
        let mut stalled = Gain::default();
        stalled.observe(7.05);
        stalled.observe(GAIN_CAP);
        assert_eq!(stalled.value(), Some(GAIN_CAP));

        let mut flat = Gain::default();
        for g in [1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98] {
            flat.observe(g);
            assert!(flat.value().is_none_or(|v| v < MIX_GAIN), "{flat:?}");
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
        // Of the two first samples, the lower starts the estimate.
        assert_eq!(shared.cost().unwrap().wall, 1.0);
        let mut ratio = Estimate::default();
        ratio.observe_ratio(1.0, INTERFERENCE_WINDOW);
        ratio.observe_ratio(2.0, INTERFERENCE_WINDOW);
        assert_eq!(
            ratio.cost().unwrap().wall,
            2.0,
            "a ratio's first is discarded"
        );
    }

    /// A synthetic engine: per-job wall and CPU time as fixed + per-byte cost. A module
    /// also has `hidden` CPU time per job: host CPU its driver uses outside the lane's
    /// thread (a kernel worker thread, interrupts), which slows the CPU lanes but which
    /// the lane's CPU clock does not show; and `slowed`: how much longer its job takes
    /// when it starts while a CPU lane is busy (its driver waits for the core).
    #[derive(Clone, Copy)]
    struct SynthEngine {
        lanes: usize,
        host: bool,
        fixed: f64,
        per_byte: f64,
        cpu_fixed: f64,
        cpu_per_byte: f64,
        hidden: f64,
        slowed: f64,
    }

    impl SynthEngine {
        fn wall(&self, len: usize) -> f64 {
            self.fixed + self.per_byte * len as f64
        }
        fn cpu(&self, len: usize) -> f64 {
            self.cpu_fixed + self.cpu_per_byte * len as f64
        }
    }

    /// A software engine: its CPU time is its wall time.
    fn software(lanes: usize, fixed: f64, bytes_per_second: f64) -> SynthEngine {
        SynthEngine {
            lanes,
            host: true,
            fixed,
            per_byte: 1.0 / bytes_per_second,
            cpu_fixed: fixed,
            cpu_per_byte: 1.0 / bytes_per_second,
            hidden: 0.0,
            slowed: 0.0,
        }
    }

    /// A crypto module with a request floor, whose lane thread spends `driver` CPU
    /// seconds per request (plus 1 ns/byte of copying) and `hidden` more elsewhere.
    fn module(
        lanes: usize,
        floor: f64,
        bytes_per_second: f64,
        driver: f64,
        hidden: f64,
    ) -> SynthEngine {
        SynthEngine {
            lanes,
            host: false,
            fixed: floor,
            per_byte: 1.0 / bytes_per_second,
            cpu_fixed: driver,
            cpu_per_byte: 1e-9,
            hidden,
            slowed: 0.0,
        }
    }

    /// One simulated lane.
    struct SimLane {
        engine: usize,
        free_at: f64,
        /// The job in progress: start, class, CPU time, whether another engine's job
        /// was running when it started, jobs of other engines started before it.
        job: Option<(f64, usize, f64, bool, usize)>,
        done: bool,
    }

    /// The model's view of a simulated batch; estimates persist across batches.
    struct Sim {
        engines: Vec<SynthEngine>,
        cores: usize,
        /// (length, remaining) per class; every class runs on every engine.
        classes: Vec<(usize, usize)>,
        est: Vec<Vec<Estimate>>,
        /// Per engine (used for the CPU ones).
        interference: Vec<Interference>,
        probes: Vec<Vec<usize>>,
        reprobe: Vec<Vec<bool>>,
        /// Per engine: simulated time since its last re-measurement.
        credit: Vec<f64>,
        trials: Vec<Vec<usize>>,
        /// Per engine: how many of its next jobs the host disturbs, and by what factor
        /// they are slowed (a stall of the host during the first probes).
        disturbed: Vec<(usize, f64)>,
        /// Per engine and class: measured mix gains, and this batch's tally.
        gains: Vec<Vec<Gain>>,
        tallies: Vec<Vec<Tally>>,
        /// Per engine: simulated time since its last mix check, and whether it checked
        /// in this batch.
        check_credit: Vec<f64>,
        checked: Vec<bool>,
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
        fn samples(&self, e: usize, q: usize) -> u32 {
            self.est[e][q].samples()
        }
        fn probes(&self, e: usize, q: usize) -> usize {
            self.probes[e][q]
        }
        fn may_reprobe(&self, e: usize, q: usize) -> bool {
            self.reprobe[e][q]
        }
        fn reprobe_credit(&self, e: usize) -> f64 {
            self.credit[e]
        }
        fn trials(&self, e: usize, q: usize) -> usize {
            self.trials[e][q]
        }
        fn smaller_known(&self, e: usize, q: usize) -> Option<(usize, Cost)> {
            (0..self.classes.len())
                .filter(|&k| self.bucket(k) < self.bucket(q))
                .filter_map(|k| Some((self.bucket(k), self.est[e][k].cost()?)))
                .max_by_key(|k| k.0)
        }
        fn alone(&self, e: usize, q: usize) -> Option<Cost> {
            self.interference[e].alone(q)
        }
        fn slowdown(&self, e: usize, q: usize) -> Option<f64> {
            self.interference[e].slowdown_in(q)
        }
        fn slowdown_measured(&self, e: usize, q: usize) -> bool {
            self.interference[e].measured_in(q)
        }
        fn gain(&self, e: usize, q: usize) -> Gain {
            self.gains[e][q]
        }
        fn check_credit(&self, e: usize) -> f64 {
            if self.checked[e] {
                0.0
            } else {
                self.check_credit[e]
            }
        }
        fn alone_jobs(&self, e: usize, q: usize) -> u64 {
            self.tallies[e][q].alone_jobs
        }
        fn width(&self, _e: usize) -> usize {
            1
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
            let fresh = vec![vec![Estimate::default(); nq]; ne];
            Sim {
                engines,
                cores,
                classes: lens.iter().map(|&l| (l, 0)).collect(),
                est: fresh,
                interference: (0..ne)
                    .map(|_| {
                        let fresh = vec![Estimate::default(); nq];
                        Interference::new(fresh.clone(), fresh, Estimate::default())
                    })
                    .collect(),
                probes: vec![vec![0; nq]; ne],
                reprobe: vec![vec![true; nq]; ne],
                credit: vec![0.0; ne],
                trials: vec![vec![0; nq]; ne],
                disturbed: vec![(0, 1.0); ne],
                gains: vec![vec![Gain::default(); nq]; ne],
                tallies: vec![vec![Tally::default(); nq]; ne],
                check_credit: vec![0.0; ne],
                checked: vec![false; ne],
            }
        }

        /// Runs a batch of `counts[q]` jobs per class, event by event, with the rule
        /// deciding for each lane that becomes free, and the lanes measuring as the
        /// schedule does. While a module job runs, its driver's CPU time (thread and
        /// hidden, times the steal fraction) delays a busy CPU lane. Panics if every lane
        /// waits forever.
        fn run(&mut self, counts: &[usize]) -> Outcome {
            for (c, &n) in self.classes.iter_mut().zip(counts) {
                c.1 = n;
            }
            let nq = self.classes.len();
            for e in 0..self.engines.len() {
                self.probes[e] = vec![0; nq];
                self.reprobe[e] = vec![true; nq];
                self.trials[e] = vec![0; nq];
                self.tallies[e] = vec![Tally::default(); nq];
                self.checked[e] = false;
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
            // Jobs started per engine.
            let mut starts = vec![0usize; self.engines.len()];
            let mut makespan: f64 = 0.0;
            let mut stalls = 0;
            let steal = self.steal();
            let others_busy = |lanes: &[SimLane], e: usize| {
                lanes.iter().any(|l| l.job.is_some() && l.engine != e)
            };
            let others_started =
                |starts: &[usize], e: usize| starts.iter().sum::<usize>() - starts[e];
            let mut events = 0u64;
            // A probe running alone, as the schedule runs them: its engine, and when it
            // ends (the other engines' lanes start nothing before).
            let mut solo: Option<(usize, f64)> = None;
            while let Some(l) = (0..lanes.len())
                .filter(|&l| !lanes[l].done)
                .min_by(|&a, &b| lanes[a].free_at.total_cmp(&lanes[b].free_at))
            {
                events += 1;
                assert!(events < 10_000_000, "the simulation does not end");
                let now = lanes[l].free_at;
                let e = lanes[l].engine;
                if let Some((start, q, cpu, busy_then, starts_then)) = lanes[l].job.take() {
                    let wall = now - start;
                    makespan = makespan.max(now);
                    self.est[e][q].observe(wall, cpu);
                    let overlapped = busy_then
                        || starts_then != others_started(&starts, e)
                        || others_busy(&lanes, e);
                    self.interference[e].record(q, wall, cpu, 1, overlapped);
                    self.tallies[e][q].add(1, wall, overlapped);
                }
                match solo {
                    Some((holder, until)) if holder != e && now < until => {
                        lanes[l].free_at = until + 1e-12;
                        continue;
                    }
                    Some((_, until)) if now >= until => solo = None,
                    _ => {}
                }
                match decide(self, e) {
                    decision @ (Decision::Take(q)
                    | Decision::Probe(q)
                    | Decision::Trial(q)
                    | Decision::Check(q)) => {
                        if matches!(decision, Decision::Trial(_) | Decision::Check(_)) {
                            self.trials[e][q] += 1;
                        }
                        if decision == Decision::Check(q) {
                            self.checked[e] = true;
                        }
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
                        // A probe starts once the other engines' jobs in flight end.
                        let alone = decision == Decision::Probe(q) && self.engines.len() > 1;
                        let now = if alone {
                            lanes
                                .iter()
                                .filter(|x| x.job.is_some() && x.engine != e)
                                .map(|x| x.free_at)
                                .fold(now, f64::max)
                        } else {
                            now
                        };
                        let busy = others_busy(&lanes, e) && !alone;
                        let host_busy = lanes.iter().any(|x| {
                            x.job.is_some()
                                && self.engines[x.engine].host
                                && (!alone || x.engine == e)
                        });
                        let slowed = if host_busy && steal > 0.0 {
                            eng.slowed
                        } else {
                            0.0
                        };
                        let disturbed = match &mut self.disturbed[e] {
                            (0, _) => 1.0,
                            (n, factor) => {
                                *n -= 1;
                                *factor
                            }
                        };
                        lanes[l].free_at = now + eng.wall(len) * (1.0 + slowed) * disturbed;
                        if alone {
                            solo = Some((e, lanes[l].free_at));
                        }
                        let started = others_started(&starts, e);
                        lanes[l].job = Some((now, q, eng.cpu(len), busy, started));
                        starts[e] += 1;
                        if !eng.host && steal > 0.0 {
                            // The driver's CPU time comes out of a busy CPU lane.
                            if let Some(victim) = (0..lanes.len())
                                .filter(|&v| {
                                    lanes[v].job.is_some() && self.engines[lanes[v].engine].host
                                })
                                .min_by(|&a, &b| lanes[a].free_at.total_cmp(&lanes[b].free_at))
                            {
                                lanes[victim].free_at += steal * (eng.cpu(len) + eng.hidden);
                            }
                        }
                        stalls = 0;
                    }
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
                        // Strictly later, so a lane finishing at this instant goes
                        // first.
                        lanes[l].free_at = if next.is_finite() { next } else { now } + 1e-12;
                    }
                    Decision::Done => lanes[l].done = true,
                }
            }
            assert!(self.classes.iter().all(|c| c.1 == 0), "jobs left over");
            for (credit, reprobed) in self.credit.iter_mut().zip(&self.reprobe) {
                *credit = if reprobed.iter().all(|&unused| unused) {
                    *credit + makespan
                } else {
                    0.0
                };
            }
            for (credit, &checked) in self.check_credit.iter_mut().zip(&self.checked) {
                *credit = if checked { 0.0 } else { *credit + makespan };
            }
            let lanes: Vec<usize> = self.engines.iter().map(|e| e.lanes).collect();
            for q in 0..nq {
                let tallies: Vec<Tally> = self.tallies.iter().map(|t| t[q]).collect();
                let alone: Vec<Option<Cost>> =
                    self.interference.iter().map(|i| i.alone(q)).collect();
                for e in 0..self.engines.len() {
                    if let Some(g) = measured_gain(e, &tallies, &lanes, &alone) {
                        self.gains[e][q].observe(g);
                    }
                }
            }
            Outcome { makespan, jobs }
        }
    }

    const SMALL: usize = 64;
    const LARGE: usize = 16 * 1024;

    /// The seeds' single-core board: a slow software CPU and a module with a ~200 µs
    /// request floor whose driver costs 30 µs of the only core per request.
    fn board() -> Sim {
        let cpu = software(1, 1e-6, 20e6);
        let module = module(1, 200e-6, 100e6, 30e-6, 0.0);
        Sim::new(vec![cpu, module], 1, &[SMALL, LARGE])
    }

    #[test]
    fn slow_fixed_cost_module_gets_no_small_jobs_and_a_share_of_large_ones() {
        let mut sim = board();
        // First batches: both engines probe both classes, the CPU lane measures itself
        // with and without a module job beside it.
        sim.run(&[500, 100]);
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

    /// Our testbed guest: one core, AES-NI in software, a module whose driver does most
    /// of its work in a kernel thread and interrupts. Its lane's CPU clock shows little,
    /// but each request takes ~600 µs from the only core, more than the CPU needs for
    /// the job: measured on the CPU lane, that keeps the module out (once the trial
    /// jobs of the first batches have measured it on this class, [`MIX_EVIDENCE`]).
    #[test]
    fn a_module_whose_driver_work_hides_from_its_thread_clock_is_still_held_back() {
        let cpu = software(1, 1e-6, 44e6);
        let module = module(1, 500e-6, 40e6, 20e-6, 600e-6);
        let mut sim = Sim::new(vec![cpu, module], 1, &[LARGE]);
        for _ in 0..5 {
            let out = sim.run(&[200]);
            assert!(out.jobs[1][0] <= PROBES + MIX_TRIALS, "{out:?}");
        }
        assert!(
            sim.gains[1][0].value().is_some_and(|g| g < MIX_GAIN),
            "the mix was never measured a loss: {:?}",
            sim.gains[1][0]
        );
        sim.check_credit[1] = 0.0;
        let out = sim.run(&[400]);
        let cpu_alone = 400.0 * cpu.wall(LARGE);
        // At most the one re-measurement a batch this long affords (no check: its
        // credit was just spent).
        assert!(out.jobs[1][0] <= 1, "{out:?}");
        assert!(out.makespan <= cpu_alone * 1.01, "{out:?} vs {cpu_alone}");
    }

    /// The testbed guest without AES-NI: the module is the best single engine at 16
    /// KiB, and the CPU lane, busy with slow software AES on the only core, delays every
    /// module request it overlaps (+80%). Helping would cost the module more than the
    /// CPU adds: after learning that (trial jobs until both lanes' slowdowns on this
    /// class rest on [`MIX_EVIDENCE`] samples), the CPU stays out and the batch runs at
    /// the module's speed.
    #[test]
    fn a_cpu_lane_that_slows_a_faster_module_is_held_back() {
        let cpu = software(1, 1e-6, 4.5e6);
        let mut module = module(1, 500e-6, 33e6, 20e-6, 50e-6);
        module.slowed = 0.8;
        let mut sim = Sim::new(vec![cpu, module], 1, &[LARGE]);
        for _ in 0..5 {
            let out = sim.run(&[200]);
            assert!(out.jobs[0][0] <= PROBES + MIX_TRIALS, "{out:?}");
        }
        assert!(sim.interference[1].measured_in(0), "never measured");
        let out = sim.run(&[400]);
        let module_alone = 400.0 * module.wall(LARGE);
        assert!(out.jobs[0][0] <= 1, "{out:?}");
        assert!(
            out.makespan <= module_alone * 1.03,
            "{out:?} vs {module_alone}"
        );
    }

    /// The soft testbed at 16 KiB (as above, without the CPU's slowdown of the module
    /// modelled) after a host stall during the module's first probes: its estimates,
    /// alone and overall, came out 4x its true cost, and the slowdown ratios measured
    /// against that inflated "alone" time say its jobs are never slowed. Until the
    /// estimate comes down, the CPU lane mixes in and the batch runs ~1.22x the module
    /// alone. Samples far below an estimate count at least half ([`FAST_DOWN`]), so it
    /// is back within a few batches; averaged at the plain weight (a mean over up to
    /// [`INTERFERENCE_WINDOW`] samples), it was not after 8.
    #[test]
    fn an_inflated_first_measurement_is_corrected_within_a_few_batches() {
        let cpu = software(1, 1e-6, 4.5e6);
        let mut module = module(1, 500e-6, 33e6, 20e-6, 50e-6);
        module.slowed = 0.8;
        let mut sim = Sim::new(vec![cpu, module], 1, &[LARGE]);
        for _ in 0..3 {
            sim.run(&[200]);
        }
        let mut inflated = Estimate::default();
        for _ in 0..3 {
            inflated.observe(4.0 * module.wall(LARGE), module.cpu(LARGE));
        }
        sim.est[1][0] = inflated;
        let (_, ratios, ratio) = sim.interference[1].snapshot();
        sim.interference[1] = Interference::new(vec![inflated], ratios, ratio);
        // As after the first probes: no mix has run long enough to be measured.
        forget_gains(&mut sim);
        let module_alone = 400.0 * module.wall(LARGE);
        let mut batches = Vec::new();
        for _ in 0..6 {
            batches.push(sim.run(&[400]).makespan / module_alone);
        }
        assert!(
            batches[0] > 1.1,
            "the inflated estimate cost nothing: {batches:?}"
        );
        assert!(
            batches[4..].iter().all(|&b| b <= 1.03),
            "not corrected: {batches:?}"
        );
    }

    /// The testbed guest since AES instructions were taken out of its CPU: software
    /// multi-buffer CBC makes the CPU the best single engine at 4 KiB (0.31 ms a job),
    /// and every request to the module (1 ms alone) takes ~0.6 ms of the only core from
    /// the CPU lane (its thread and the kernel's work for it), more than the job it
    /// does is worth. From nothing learned, the first batch may lose only the few trial
    /// jobs that measure that; after it, the module takes at most a re-measurement and
    /// now and then a check of the mix.
    #[test]
    fn a_module_that_costs_the_only_core_more_than_it_adds_gets_only_trials() {
        const PAGE: usize = 4096;
        let cpu = software(1, 1e-6, PAGE as f64 / 0.31e-3);
        let mut module = module(1, 0.8e-3, 20e6, 0.3e-3, 0.3e-3);
        module.slowed = 0.8;
        let mut sim = Sim::new(vec![cpu, module], 1, &[PAGE]);
        let cpu_alone = 400.0 * cpu.wall(PAGE);
        let first = sim.run(&[400]);
        assert!(
            first.jobs[1][0] <= PROBES + MIX_TRIALS,
            "{first:?} vs cpu alone {cpu_alone}"
        );
        assert!(
            first.makespan <= cpu_alone * 1.1,
            "{first:?} vs {cpu_alone}"
        );
        let mut checks = 0;
        for _ in 0..3 {
            let out = sim.run(&[400]);
            assert!(out.jobs[1][0] <= 1 + MIX_TRIALS, "{out:?}");
            checks += usize::from(out.jobs[1][0] > 1);
            assert!(out.makespan <= cpu_alone * 1.03, "{out:?} vs {cpu_alone}");
        }
        assert!(checks <= 1, "checked the mix {checks} times in 3 batches");
    }

    /// A fast AES-NI host with a spare core (no CPU stolen) beside the same module: the
    /// module may help, never delays the end, and prefers the large jobs.
    #[test]
    fn never_slower_than_the_best_single_engine_and_large_jobs_go_to_the_module() {
        let cpu = software(2, 0.5e-6, 1e9);
        let module = module(1, 200e-6, 100e6, 30e-6, 0.0);
        let mut sim = Sim::new(vec![cpu, module], 4, &[SMALL, LARGE]);
        sim.run(&[500, 100]);
        // Only a batch long enough to absorb a worst-case probe, PROBE_SAFETY times
        // over, teaches the module the large size (its small-size cost extrapolates to
        // ~51 ms per 16 KiB job; 32,000 jobs keep the CPU lanes busy ~260 ms).
        sim.run(&[0, 32000]);
        assert!(sim.est[1][1].cost().is_some());
        for counts in [[4000, 0], [0, 400], [4000, 100], [10, 1]] {
            let out = sim.run(&counts);
            let cpu_alone =
                (counts[0] as f64 * cpu.wall(SMALL) + counts[1] as f64 * cpu.wall(LARGE)) / 2.0;
            // One CPU job of slack: the simulation's lanes are discrete.
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

    /// Batches far too short to afford a re-measurement on their own (100 small jobs,
    /// 0.4 ms, against a module probe of ~0.23 ms) still re-measure the declined module
    /// now and then, on the credit of the batches before; and no more often than
    /// [`REPROBE_RATIO`] allows, so keeping its estimate fresh costs about 1/200 of the
    /// time. The same holds for checks of the mix, on their own credit
    /// ([`CHECK_RATIO`]).
    #[test]
    fn short_batches_re_measure_a_declined_engine_now_and_then_at_a_bounded_price() {
        let mut sim = board();
        sim.run(&[500, 100]);
        sim.run(&[500, 100]);
        let module = sim.engines[1];
        let (mut total, mut measured, mut checks) = (0.0, 0, 0);
        for _ in 0..400 {
            let out = sim.run(&[100, 0]);
            assert!(out.jobs[1][0] <= 1 + MIX_TRIALS, "{out:?}");
            total += out.makespan;
            measured += usize::from(!sim.reprobe[1][0]);
            checks += usize::from(sim.checked[1]);
        }
        let probe = module.wall(SMALL) + module.cpu(SMALL);
        let allowed = total / (REPROBE_RATIO * probe);
        assert!(measured >= 1, "never re-measured in {total} s");
        assert!(
            measured as f64 <= allowed + 1.0,
            "{measured} re-measurements in {total} s, {allowed:.1} allowed"
        );
        // A check's credit is counted on the module's cost estimate, at least its cost
        // undisturbed.
        let allowed = total / (CHECK_RATIO * MIX_TRIALS as f64 * module.wall(SMALL));
        assert!(checks >= 1, "never checked in {total} s");
        assert!(
            checks as f64 <= allowed + 1.0,
            "{checks} checks in {total} s, {allowed:.1} allowed"
        );
    }

    /// A declined engine whose estimate rests on its two first probes is re-measured in
    /// a batch that would not yet pay for re-measuring a settled one: the young estimate
    /// may be a host stall's, not the engine's.
    #[test]
    fn a_young_estimate_is_re_measured_sooner_than_a_settled_one() {
        let mut sim = board();
        sim.run(&[500, 100]);
        sim.run(&[500, 100]);
        let module = sim.engines[1];
        let probe = module.wall(SMALL) + module.cpu(SMALL);
        let cpu_time = sim.engines[0].wall(SMALL);
        // Small jobs enough for the CPU to need 100 re-measurements' time: over the
        // young bound (50), under the settled one (200).
        let jobs = (100.0 * REMEASURE_PULLS as f64 * probe / cpu_time) as usize;
        sim.classes[0].1 = jobs;
        sim.classes[1].1 = 0;
        sim.credit = vec![0.0; 2];
        sim.reprobe[1] = vec![true; 2];
        // This batch's check of the mix is spent: the question is re-measurement.
        sim.trials[1] = vec![MIX_TRIALS; 2];
        let measured = sim.est[1][0].cost().expect("the module probed small jobs");
        let estimate = |samples| {
            let mut e = Estimate::default();
            for _ in 0..samples {
                e.observe(measured.wall, measured.cpu);
            }
            e
        };
        sim.est[1][0] = estimate(WINDOW);
        assert_eq!(
            decide(&sim, 1),
            Decision::Wait,
            "a settled estimate re-measured"
        );
        sim.est[1][0] = estimate(MIN_SAMPLES);
        assert_eq!(decide(&sim, 1), Decision::Probe(0), "a young estimate kept");
    }

    /// A ratio estimate of `samples` samples of `ratio`.
    fn ratios(ratio: f64, samples: u32) -> Estimate {
        let mut e = Estimate::default();
        for _ in 0..samples {
            e.observe_ratio(ratio, INTERFERENCE_WINDOW);
        }
        e
    }

    #[test]
    fn a_class_own_slowdown_overrules_a_worse_stand_in_only_on_evidence() {
        let across = ratios(4.0, 200);
        let fresh = Estimate::default();
        let with_own = |own: Estimate| Interference::new(vec![fresh], vec![own], across);
        // Nothing measured on the class: the stand-in across classes.
        let i = with_own(fresh);
        assert_eq!(i.slowdown_in(0), Some(0.75));
        assert!(!i.measured_in(0));
        // A few samples that say the class is barely slowed do not overrule it...
        let i = with_own(ratios(1.0, MIX_EVIDENCE - 1));
        assert_eq!(i.slowdown_in(0), Some(0.75));
        assert!(!i.measured_in(0));
        // ...enough of them do.
        let i = with_own(ratios(1.0, MIX_EVIDENCE));
        assert_eq!(i.slowdown_in(0), Some(0.0));
        assert!(i.measured_in(0));
        // A class worse than the stand-in counts as soon as it is usable.
        let i = with_own(ratios(8.0, MIN_SAMPLES));
        assert_eq!(i.slowdown_in(0), Some(0.875));
        // With no stand-in, the class's own ratio once usable.
        let i = Interference::new(vec![fresh], vec![ratios(2.0, MIN_SAMPLES)], fresh);
        assert_eq!(i.slowdown_in(0), Some(0.5));
        assert_eq!(
            Interference::new(vec![fresh], vec![fresh], fresh).slowdown_in(0),
            None
        );
    }

    /// Replaces engine `e`'s slowdown ratio across classes (the stand-in) and its own
    /// on class 0 in `sim`, keeping what it measured alone, and forgets every mix's
    /// measured gain: the cost rule goes by its prediction from these slowdowns.
    fn seed_slowdowns(sim: &mut Sim, e: usize, own: Estimate, across: Estimate) {
        let (alone, _, _) = sim.interference[e].snapshot();
        sim.interference[e] = Interference::new(alone, vec![own], across);
        forget_gains(sim);
    }

    /// Forgets every mix's measured gain in `sim`.
    fn forget_gains(sim: &mut Sim) {
        for gains in &mut sim.gains {
            gains.fill(Gain::default());
        }
    }

    /// The two-vCPU testbed at 16 KiB: two CPU lanes and a module, about as fast alone,
    /// on two cores, and mixing them pays (the module's requests are slowed by a
    /// quarter beside the CPU lanes). If the only slowdown the model has for the module
    /// is a pessimistic one from other classes (in the testbed, its 1-4 KiB requests
    /// beside the CPU lanes), the CPU runs a few trial jobs of this class a batch, which
    /// measure the class's own slowdown, and joins once that rests on evidence.
    #[test]
    fn a_class_judged_on_other_classes_slowdowns_is_tried_and_then_mixed() {
        let cpu = software(2, 1e-6, LARGE as f64 / 4.4e-3);
        let mut module = module(1, 0.4e-3, LARGE as f64 / 1.3e-3, 0.1e-3, 0.1e-3);
        module.slowed = 0.25;
        let mut sim = Sim::new(vec![cpu, module], 2, &[LARGE]);
        for _ in 0..3 {
            sim.run(&[400]);
        }
        // What smaller requests taught: beside the CPU lanes, a module job takes 4x its
        // time alone. This class's own slowdown is not measured yet.
        seed_slowdowns(&mut sim, 1, Estimate::default(), ratios(4.0, 64));
        assert!(!sim.interference[1].measured_in(0));
        let module_alone = 400.0 * module.wall(LARGE);
        let batches: Vec<Outcome> = (0..8).map(|_| sim.run(&[400])).collect();
        for (i, b) in batches.iter().enumerate() {
            assert!(
                b.makespan <= module_alone * 1.05,
                "batch {i}: the trials cost more than they may: {b:?} vs {module_alone}"
            );
        }
        assert!(
            batches[0].jobs[0][0] > 0,
            "the CPU did not try the class: {:?}",
            batches[0]
        );
        assert!(
            sim.interference[1].measured_in(0),
            "the trials measured nothing"
        );
        let last = &batches[7];
        assert!(
            last.jobs[0][0] > 40 && last.makespan < module_alone * 0.9,
            "the CPU did not join: {last:?} vs module alone {module_alone}"
        );
    }

    /// The one-vCPU testbed at 8 KiB, where a CPU lane beside the module delays every
    /// request it overlaps (+80%) and mixing is a loss. A pessimistic stand-in keeps the
    /// CPU to trial jobs; two early samples of the class that happened to show no
    /// slowdown (overlaps that missed the bursts) must not let it join: it waits for
    /// the evidence, which shows the loss, and then stays out.
    #[test]
    fn a_few_lucky_samples_do_not_make_a_bad_mix_look_good() {
        const PAGE: usize = 8 * 1024;
        let cpu = software(1, 1e-6, 2.2e6);
        let mut module = module(1, 0.5e-3, 33e6, 20e-6, 50e-6);
        module.slowed = 0.8;
        let mut sim = Sim::new(vec![cpu, module], 1, &[PAGE]);
        for _ in 0..3 {
            sim.run(&[400]);
        }
        seed_slowdowns(&mut sim, 1, ratios(1.0, MIN_SAMPLES), ratios(2.0, 64));
        // A free CPU lane at the start of a batch: a trial job, not a share of the class.
        sim.classes[0].1 = 400;
        sim.trials[0][0] = 0;
        assert_eq!(decide(&sim, 0), Decision::Trial(0), "joined on two samples");
        sim.classes[0].1 = 0;
        let module_alone = 400.0 * module.wall(PAGE);
        // The trials' price: their jobs on the CPU, and the module's requests they slow.
        let trials = MIX_TRIALS as f64 * cpu.wall(PAGE);
        for i in 0..6 {
            let out = sim.run(&[400]);
            assert!(
                out.jobs[0][0] <= MIX_TRIALS,
                "batch {i}: the CPU joined: {out:?}"
            );
            assert!(
                out.makespan <= module_alone + trials,
                "batch {i}: {out:?} vs module alone {module_alone}"
            );
        }
        assert!(sim.interference[1].measured_in(0), "never measured");
        let out = sim.run(&[400]);
        assert!(out.jobs[0][0] <= 1, "still trying: {out:?}");
        assert!(
            out.makespan <= module_alone * 1.03,
            "{out:?} vs {module_alone}"
        );
    }

    /// The two-vCPU testbed when the CPU's two lanes are the best single engine at 16
    /// KiB (4.5 ms a job each) and the module (3 ms a job) helps: classes 4 KiB and 16
    /// KiB.
    fn two_vcpus_cpu_best() -> (SynthEngine, SynthEngine, Sim) {
        const PAGE: usize = 4096;
        let cpu = software(2, 1e-6, LARGE as f64 / 4.5e-3);
        let module = module(1, 0.4e-3, LARGE as f64 / 2.6e-3, 0.05e-3, 0.05e-3);
        (cpu, module, Sim::new(vec![cpu, module], 2, &[PAGE, LARGE]))
    }

    /// The two-vCPU testbed at 16 KiB when the CPU's two lanes are the best single
    /// engine and the module, faster per job, mixes in on a measured gain: as a batch
    /// ends, the module leaves the last jobs to the CPU ([`leaves_the_tail`]), and the
    /// CPU lanes must not wait for it. Counting the module's rate in the end-game rule,
    /// every lane waited with two jobs left and none running (the simulation's deadlock
    /// check fired in the third batch; in the testbed a bench hung).
    #[test]
    fn a_mixing_engine_that_leaves_the_tail_never_leaves_every_lane_waiting() {
        let (cpu, _, mut sim) = two_vcpus_cpu_best();
        let cpu_alone = 400.0 * cpu.wall(LARGE) / 2.0;
        for counts in [
            [400, 0],
            [400, 0],
            [0, 400],
            [0, 400],
            [0, 400],
            [0, 400],
            [200, 200],
        ] {
            let out = sim.run(&counts);
            if counts == [0, 400] {
                assert!(out.makespan <= cpu_alone * 1.05, "{out:?} vs {cpu_alone}");
            }
        }
        assert!(sim.gains[1][1].value().is_some_and(|g| g >= MIX_GAIN));
        let last = sim.run(&[0, 400]);
        assert!(last.jobs[1][1] > 100, "{last:?}");
        assert!(last.makespan < cpu_alone * 0.8, "{last:?} vs {cpu_alone}");
    }

    /// The two-vCPU testbed: the module's first probes of 16 KiB took 16.4 ms a job, a
    /// host stall (its 4 KiB jobs took ~1 ms, so 16 KiB ones at most ~4 ms), and it was
    /// declined. An estimate that far above what a smaller size allows
    /// ([`IMPLAUSIBLE`]) is re-measured in the next batch, whatever the credit; once it
    /// rests on [`WINDOW`] samples, only on the credit.
    #[test]
    fn an_estimate_a_smaller_size_rules_out_is_re_measured_at_once() {
        let (_, module, mut sim) = two_vcpus_cpu_best();
        sim.run(&[400, 0]);
        sim.run(&[400, 0]);
        sim.run(&[0, 400]);
        // As after a stall during the probes: 10x the module's cost, a declined mix.
        let stalled = |samples: u32| {
            let mut e = Estimate::default();
            for _ in 0..=samples {
                e.observe(10.0 * module.wall(LARGE), module.cpu(LARGE));
            }
            e
        };
        let mut declined = Gain::default();
        declined.observe(0.8);
        declined.observe(0.8);
        sim.gains[1][1] = declined;
        sim.credit[1] = 0.0;
        sim.classes[1].1 = 400;
        for (samples, remeasured) in [(MIN_SAMPLES, true), (WINDOW, false)] {
            sim.est[1][1] = stalled(samples);
            let (_, ratios, ratio) = sim.interference[1].snapshot();
            let alone = vec![sim.est[1][0], stalled(samples)];
            sim.interference[1] = Interference::new(alone, ratios, ratio);
            assert_eq!(
                decide(&sim, 1) == Decision::Probe(1),
                remeasured,
                "{samples} samples"
            );
        }
    }

    /// Where the module is faster than the CPU at every size, the CPU still helps with
    /// small jobs and leaves the module the large ones; the rule never deadlocks.
    #[test]
    fn a_slow_cpu_helps_without_holding_the_last_job() {
        let cpu = software(1, 1e-6, 5e6);
        let module = module(4, 5e-6, 400e6, 2e-6, 0.0);
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

    /// Two CPU lanes and a module on two cores, where a module request that starts
    /// beside a busy CPU lane takes 2.6x its time: the module alone is the best single
    /// engine, and mixing still gains ~14%, but the cost rule's prediction from the
    /// estimates puts that inside [`MIX_MARGIN`] and declines it (as in the two-vCPU
    /// testbed at 16 KiB, where the estimates were also ~20% off). The trial jobs of the
    /// first batches measure the mix's gain directly, and from then on that decides: the
    /// CPU joins. Going by the prediction alone (every measured gain forgotten before
    /// each batch), it never does.
    #[test]
    fn a_mix_the_prediction_declines_within_its_margin_is_measured_and_taken() {
        let run = |measured: bool| {
            let cpu = software(2, 1e-6, LARGE as f64 / 4.4e-3);
            let mut module = module(1, 0.4e-3, LARGE as f64 / 1.3e-3, 0.1e-3, 0.1e-3);
            module.slowed = 1.6;
            let module_alone = 400.0 * module.wall(LARGE);
            let mut sim = Sim::new(vec![cpu, module], 2, &[LARGE]);
            let batches: Vec<(f64, usize)> = (0..8)
                .map(|_| {
                    if !measured {
                        forget_gains(&mut sim);
                    }
                    let out = sim.run(&[400]);
                    (out.makespan / module_alone, out.jobs[0][0])
                })
                .collect();
            (batches, sim)
        };
        let (predicted, _) = run(false);
        assert!(
            predicted.iter().all(|&(t, _)| t >= 0.98),
            "the prediction alone mixed: {predicted:?}"
        );
        let (batches, sim) = run(true);
        assert!(
            batches.iter().all(|&(t, _)| t <= 1.03),
            "the trials cost more than they may: {batches:?}"
        );
        assert!(
            sim.gains[0][0].value().is_some_and(|g| g >= MIX_GAIN),
            "{:?}",
            sim.gains[0][0]
        );
        assert!(
            batches[4..].iter().all(|&(t, cpu)| t <= 0.9 && cpu > 100),
            "the CPU did not join: {batches:?}"
        );
    }
}
