//! Measuring: drives each engine's lanes directly, one request at a time, at each
//! probe size, then with more and more lanes in flight, then each `cpu`-kind engine
//! beside each other engine. No dispatcher, no policy: what is timed is the engines.

use std::sync::mpsc;
use std::sync::Barrier;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{
    fit, Calibration, ClassCalibration, EngineCalibration, Fingerprint, LanePoint, MixCalibration,
    MixPoint, SizePoint, Unmeasured, FORMAT_VERSION,
};
use crate::cipher::{Cipher, Direction, KeySize, Mode};
use crate::dispatch::thread_cpu_time;
use crate::engine::{EngineKind, EngineRef, Lane};
use crate::error::{Error, Result};
use crate::job::{Job, JobOutput};
use crate::key::{Key, KeyId, KeyStore};

/// Job sizes measured: 16 B to 64 KiB in steps of 4x, around the 1-4 KiB crossovers
/// the seeds and our testbed found, and past the 16 KiB chunks of the file format.
pub const PROBE_SIZES: [usize; 7] = [16, 64, 256, 1024, 4096, 16 * 1024, 64 * 1024];

/// Ciphers measured unless told otherwise: AES-128 and AES-256 in each mode (AES-192
/// is rare; padded CBC is answered from raw CBC).
pub const DEFAULT_CIPHERS: [Cipher; 6] = [
    Cipher::AES_128_CBC,
    Cipher::AES_256_CBC,
    Cipher::AES_128_CTR,
    Cipher::AES_256_CTR,
    Cipher::AES_128_GCM,
    Cipher::AES_256_GCM,
];

/// How long each point is timed, at least: 20 ms is ~100 requests of the testbed
/// module's ~180 µs floor, and keeps a whole calibration of three engines (~28 classes
/// of 7 sizes and a lanes sweep) within a few seconds plus the slow points.
const POINT_TIME: Duration = Duration::from_millis(20);

/// Requests timed per point, at least, however long they take (a 64 KiB request on the
/// testbed's CPU without AES instructions takes ~14 ms): the median of five.
const MIN_JOBS: usize = 5;

/// Requests timed per point, at most (16-byte requests on AES-NI take ~100 ns).
const MAX_JOBS: usize = 20_000;

/// Untimed requests before each point, at least: the first request of a key sets up
/// its context (key schedule, socket), and a module's first requests after a pause run
/// slower than the ones that follow.
const WARM_UP_JOBS: usize = 2;

/// Untimed time before each point, at least: in the testbed the module's first class
/// after its lane opened came out ~1.3x slower than the same driver measured later
/// with two warm-up requests only.
const WARM_UP_TIME: Duration = Duration::from_millis(2);

/// Passes over an offload engine's sizes: each size is timed again after every engine
/// has had its first pass, seconds later, and the lower median kept. An offload request
/// is a round trip through the device (in the testbed, a thread of QEMU's on the host),
/// so a busy spell on the host inflates every point measured in it: in the soft guest
/// the module's stored 1 KiB cost read 77-176 µs over six calibrations (the cpu's
/// 94-97), and the quiet sitting of the seventeenth session stored 130-173 µs against
/// its ~110 µs in the same boots' runs, enough to hand the 1 KiB near tie to the cpu
/// (`docs/results.md`). Timing noise only adds time, so the lower of two is the better
/// estimate. The cpu is timed once: its medians moved by 3%.
const OFFLOAD_SIZE_PASSES: usize = 2;

/// Job size of the lanes sweep: the file format's 16 KiB chunk, where offload matters.
const LANES_LEN: usize = 16 * 1024;

/// Most lanes the sweep tries on an offload engine by default: past the two a device
/// engine may run ([`crate::calibration::MAX_CHOSEN_LANES`]), so the store shows whether
/// more would pay.
const OFFLOAD_SWEEP_LANES: usize = 4;

/// What to measure.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Ciphers to measure (each in both directions, on every engine that runs it).
    pub ciphers: Vec<Cipher>,
    /// Job sizes, bytes.
    pub sizes: Vec<usize>,
    /// How long each point is timed, at least.
    pub point_time: Duration,
    /// Job size of the lanes sweep, bytes.
    pub lanes_len: usize,
    /// Most lanes the sweep tries on an engine that does not use the host CPU (an
    /// offload device), whatever its own lane count: the sweep is what chooses its
    /// count ([`crate::calibration::choose_lanes`]). Engines on the host CPU sweep up
    /// to their own count.
    pub offload_lanes: usize,
    /// Whether to run each `cpu`-kind engine beside each other engine too, at every
    /// size of the classes both run ([`Calibration::mixes`]).
    pub mixes: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            ciphers: DEFAULT_CIPHERS.to_vec(),
            sizes: PROBE_SIZES.to_vec(),
            point_time: POINT_TIME,
            lanes_len: LANES_LEN,
            offload_lanes: OFFLOAD_SWEEP_LANES,
            mixes: true,
        }
    }
}

/// What a measured point was.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// One lane at this job size.
    Size(usize),
    /// This many lanes in flight.
    Lanes(usize),
    /// Two engines alone and side by side at this job size.
    Together(usize),
}

/// Progress of [`measure`], reported after each point.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Progress<'a> {
    /// Points measured so far (skipped ones included).
    pub done: usize,
    /// Points in all.
    pub total: usize,
    /// The engine being measured (`a+b` for two side by side).
    pub engine: &'a str,
    /// Its cipher.
    pub cipher: Cipher,
    /// Its direction.
    pub direction: Direction,
    /// The point just measured.
    pub step: Step,
}

/// The most lanes the sweep tries on `engine`: its own count, and at least
/// `settings.offload_lanes` on an offload engine.
fn sweep_lanes(engine: &EngineRef, settings: &Settings) -> usize {
    if engine.uses_host_cpu() {
        engine.lanes()
    } else {
        engine.lanes().max(settings.offload_lanes)
    }
}

/// Lane counts of the sweep: 1, 2, 4, ... up to `lanes`.
fn lane_counts(lanes: usize) -> Vec<usize> {
    let mut counts: Vec<usize> = std::iter::successors(Some(1usize), |n| n.checked_mul(2))
        .take_while(|&n| n < lanes)
        .collect();
    counts.push(lanes.max(1));
    counts
}

/// Rounds of the lanes sweep. In each round every lane count runs one window of
/// [`POINT_TIME`], the counts in an order rotated by one place per round (1 2 4, then
/// 2 4 1, then 4 1 2), so that over the rounds each of the three counts runs once in
/// every place; a count's throughput is the median of its windows. One window per
/// count in the order 1, 2, 4 chose two lanes on the Intel host that then ran slower
/// than one at every size (docs/performance.md, twentieth session): a single window
/// carries the host's swing of that moment. Three windows let the median drop one bad
/// one, at 3 x 3 windows of 20 ms (plus each window's warm-up) per class; five made a
/// guest calibration take ~50 s (twenty-second session), near the minute it should
/// stay under.
const SWEEP_ROUNDS: usize = 3;

/// Throughput per lane count of `counts`: `rounds` rounds in which every count runs one
/// `window` (bytes per second with that many lanes in flight), the order rotated by one
/// place each round; each count's median.
fn sweep_windows(
    counts: &[usize],
    rounds: usize,
    mut window: impl FnMut(usize) -> Result<f64>,
) -> Result<Vec<LanePoint>> {
    // One count compares nothing: one window gives its point.
    let rounds = if counts.len() < 2 { 1 } else { rounds };
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); counts.len()];
    for round in 0..rounds {
        for k in 0..counts.len() {
            let i = (k + round) % counts.len();
            samples[i].push(window(counts[i])?);
        }
    }
    Ok(counts
        .iter()
        .zip(&mut samples)
        .map(|(&lanes, s)| LanePoint {
            lanes,
            bytes_per_second: median(s),
        })
        .collect())
}

/// The median of `xs` (the mean of the middle two for an even count; 0 for none).
fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => xs[n / 2],
        _ => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// What one engine's worker thread tells the caller.
enum Msg {
    Point(Cipher, Direction, Step),
    Skipped(usize),
}

/// One class an engine is asked to measure: its sizes (those the engine takes) and the
/// sweep's size.
struct Todo {
    cipher: Cipher,
    direction: Direction,
    sizes: Vec<usize>,
    lanes_len: usize,
}

/// The classes `engine` runs, with the sizes it takes.
fn todo(engine: &EngineRef, settings: &Settings) -> Vec<Todo> {
    let mut out = Vec::new();
    for &cipher in &settings.ciphers {
        for direction in [Direction::Encrypt, Direction::Decrypt] {
            if !engine.supports(cipher, direction) {
                continue;
            }
            let limit = engine.max_job_len(cipher, direction).unwrap_or(usize::MAX);
            let sizes: Vec<usize> = settings
                .sizes
                .iter()
                .copied()
                .filter(|&n| n <= limit && fits(cipher, n))
                .collect();
            let Some(&largest) = sizes.last() else {
                continue;
            };
            out.push(Todo {
                cipher,
                direction,
                lanes_len: if settings.lanes_len <= limit {
                    settings.lanes_len
                } else {
                    largest
                },
                sizes,
            });
        }
    }
    out
}

/// Whether a job of `len` bytes is valid for `cipher` (raw CBC takes whole blocks).
fn fits(cipher: Cipher, len: usize) -> bool {
    cipher.mode != Mode::Cbc || len.is_multiple_of(crate::cipher::BLOCK_LEN)
}

/// Measures every engine in `engines` for every cipher of `settings` it runs, in both
/// directions: one lane at each size, then 1, 2, 4, ... lanes in flight at the sweep's
/// size; once every engine is done, each offload engine's sizes again (see
/// [`OFFLOAD_SIZE_PASSES`]). Each engine is measured alone, on threads of its own (a lane is opened on the
/// thread that drives it); `progress` is called on the caller's thread after each
/// point.
///
/// An engine that fails, or cannot open a lane, is left out and named in
/// [`Calibration::unmeasured`] with the reason; it is not retried (retrying a vanished
/// kernel device can crash the kernel). A class whose job fails (a driver that
/// refuses a key size) is left out the same way. Fails only if no random key can be
/// made.
pub fn measure(
    engines: &[EngineRef],
    settings: &Settings,
    progress: &mut dyn FnMut(&Progress<'_>),
) -> Result<Calibration> {
    let keys = KeyStore::new();
    let mut key_ids: Vec<(KeySize, KeyId)> = Vec::new();
    for size in KeySize::ALL {
        let mut key = vec![0u8; size.key_len()];
        openssl::rand::rand_bytes(&mut key)?;
        key_ids.push((size, keys.add(Key::new(key))?));
    }
    let plans: Vec<Vec<Todo>> = engines.iter().map(|e| todo(e, settings)).collect();
    let pairs = if settings.mixes {
        mix_plan(engines, &plans)
    } else {
        Vec::new()
    };
    let total: usize = plans
        .iter()
        .zip(engines)
        .map(|(p, e)| {
            p.len() * lane_counts(sweep_lanes(e, settings)).len()
                + p.iter().map(|t| t.sizes.len()).sum::<usize>()
        })
        .sum::<usize>()
        + pairs.iter().map(|m| m.sizes.len()).sum::<usize>()
        + engines
            .iter()
            .zip(&plans)
            .map(|(e, p)| again_points(e, p))
            .sum::<usize>();
    let mut done = 0;
    let mut measured = Vec::new();
    let mut unmeasured = Vec::new();
    // Per engine: whether it failed (never to be touched again).
    let mut broken = vec![false; engines.len()];
    for (i, (engine, plan)) in engines.iter().zip(&plans).enumerate() {
        let (tx, rx) = mpsc::channel();
        let (classes, failures, failed) = std::thread::scope(|s| {
            let worker = s.spawn(|| {
                let ctx = Ctx {
                    engine,
                    keys: &keys,
                    key_ids: &key_ids,
                    settings,
                    tx,
                };
                ctx.run(plan)
            });
            for msg in rx {
                match msg {
                    Msg::Point(cipher, direction, step) => {
                        done += 1;
                        progress(&Progress {
                            done,
                            total,
                            engine: engine.name(),
                            cipher,
                            direction,
                            step,
                        });
                    }
                    Msg::Skipped(n) => done += n,
                }
            }
            worker.join().unwrap_or_else(|_| {
                (
                    Vec::new(),
                    vec!["its measuring thread panicked".to_string()],
                    true,
                )
            })
        });
        broken[i] = failed;
        for reason in failures {
            unmeasured.push(Unmeasured {
                engine: engine.name().to_string(),
                reason,
            });
        }
        if !classes.is_empty() {
            measured.push(EngineCalibration {
                name: engine.name().to_string(),
                kind: engine.kind(),
                lanes: engine.lanes(),
                classes,
            });
        }
    }
    for ((engine, plan), failed) in engines.iter().zip(&plans).zip(&mut broken) {
        let planned = again_points(engine, plan);
        let measured = measured.iter_mut().find(|m| m.name == engine.name());
        let mut reported = 0;
        if let Some(m) = measured.filter(|_| planned > 0 && !*failed) {
            *failed = again(
                engine,
                &mut m.classes,
                &keys,
                &key_ids,
                settings,
                &mut |p| {
                    reported += 1;
                    done += 1;
                    progress(&Progress {
                        done,
                        total,
                        engine: engine.name(),
                        cipher: p.0,
                        direction: p.1,
                        step: Step::Size(p.2),
                    });
                },
            );
        }
        done += planned.saturating_sub(reported);
    }
    let mut mixes = Vec::new();
    for pair in pairs {
        let (a, b) = (pair.engines[0], pair.engines[1]);
        let name = format!("{}+{}", engines[a].name(), engines[b].name());
        let measured_class = |e: usize| {
            measured.iter().any(|m: &EngineCalibration| {
                m.name == engines[e].name()
                    && m.classes
                        .iter()
                        .any(|c| c.cipher == pair.cipher && c.direction == pair.direction)
            })
        };
        if broken[a] || broken[b] || !measured_class(a) || !measured_class(b) {
            done += pair.sizes.len();
            continue;
        }
        let key = key_of(&key_ids, pair.cipher.key_size);
        let mut points = Vec::new();
        for (k, &len) in pair.sizes.iter().enumerate() {
            let point = probe_job(pair.cipher, pair.direction, key, &keys, len).and_then(|job| {
                mix_point([&engines[a], &engines[b]], &job, &keys, settings.point_time)
            });
            match point {
                Ok(p) => points.push(p),
                Err(e) => {
                    done += pair.sizes.len() - k;
                    unmeasured.push(Unmeasured {
                        engine: name.clone(),
                        reason: format!("{} {} side by side: {e}", pair.cipher, pair.direction),
                    });
                    if e.is_engine_failure() {
                        // Either may have failed: touch neither again.
                        broken[a] = true;
                        broken[b] = true;
                    }
                    break;
                }
            }
            done += 1;
            progress(&Progress {
                done,
                total,
                engine: &name,
                cipher: pair.cipher,
                direction: pair.direction,
                step: Step::Together(len),
            });
        }
        if !points.is_empty() {
            mixes.push(MixCalibration {
                cipher: pair.cipher,
                direction: pair.direction,
                engines: [engines[a].name().to_string(), engines[b].name().to_string()],
                points,
            });
        }
    }
    Ok(Calibration {
        format: FORMAT_VERSION,
        fingerprint: Fingerprint::current(),
        measured_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        engines: measured,
        unmeasured,
        mixes,
    })
}

/// Size points that [`again`] times on `engine` beyond the first pass.
fn again_points(engine: &EngineRef, plan: &[Todo]) -> usize {
    if engine.uses_host_cpu() {
        return 0;
    }
    (OFFLOAD_SIZE_PASSES - 1) * plan.iter().map(|t| t.sizes.len()).sum::<usize>()
}

/// Times every size point of `classes` again, [`OFFLOAD_SIZE_PASSES`] - 1 times, on a
/// lane opened by a thread of its own, keeping each point's lower median and fitting the
/// class again; `point` is called on the caller's thread after each. Whether the engine
/// failed (what was measured before the failure is kept).
fn again(
    engine: &EngineRef,
    classes: &mut [ClassCalibration],
    keys: &KeyStore,
    key_ids: &[(KeySize, KeyId)],
    settings: &Settings,
    point: &mut dyn FnMut((Cipher, Direction, usize)),
) -> bool {
    let (tx, rx) = mpsc::channel();
    let todo: Vec<(usize, usize, Cipher, Direction, usize)> = (1..OFFLOAD_SIZE_PASSES)
        .flat_map(|_| classes.iter().enumerate())
        .flat_map(|(c, class)| {
            (0..class.points.len())
                .map(move |k| (c, k, class.cipher, class.direction, class.points[k].len))
        })
        .collect();
    let failed = std::thread::scope(|s| {
        let worker = s.spawn(move || {
            let mut lane = engine.open_lane(0)?;
            for &(c, k, cipher, direction, len) in &todo {
                let key = key_of(key_ids, cipher.key_size);
                let job = probe_job(cipher, direction, key, keys, len)?;
                let p = time_point(lane.as_mut(), &job, keys, settings.point_time)?;
                let _ = tx.send((c, k, p));
            }
            Ok::<(), Error>(())
        });
        for (c, k, p) in rx {
            let class = &mut classes[c];
            if p.wall < class.points[k].wall {
                class.points[k] = p;
            }
            point((class.cipher, class.direction, p.len));
        }
        worker
            .join()
            .map_or(true, |r| r.is_err_and(|e| e.is_engine_failure()))
    });
    for class in classes.iter_mut() {
        (class.fixed, class.per_byte) = fit_points(&class.points);
    }
    failed
}

/// The probe key made for `size` (`measure` makes one of every size first).
fn key_of(key_ids: &[(KeySize, KeyId)], size: KeySize) -> KeyId {
    key_ids
        .iter()
        .find(|(k, _)| *k == size)
        .map(|(_, id)| *id)
        .expect("a key of every size was made")
}

/// A class's fixed and per-byte cost, fitted to its size points' wall times.
fn fit_points(points: &[SizePoint]) -> (f64, f64) {
    fit(&points.iter().map(|p| (p.len, p.wall)).collect::<Vec<_>>())
}

/// One engine's measuring thread.
struct Ctx<'a> {
    engine: &'a EngineRef,
    keys: &'a KeyStore,
    key_ids: &'a [(KeySize, KeyId)],
    settings: &'a Settings,
    tx: mpsc::Sender<Msg>,
}

impl Ctx<'_> {
    /// Measures every class of `plan`; the classes measured, the failures in words, and
    /// whether the engine itself failed.
    fn run(&self, plan: &[Todo]) -> (Vec<ClassCalibration>, Vec<String>, bool) {
        let most = sweep_lanes(self.engine, self.settings);
        let sweep = lane_counts(most);
        let points_of = |t: &Todo| t.sizes.len() + sweep.len();
        let mut lane = match self.engine.open_lane(0) {
            Ok(lane) => lane,
            Err(e) => {
                let _ = self.tx.send(Msg::Skipped(plan.iter().map(points_of).sum()));
                return (Vec::new(), vec![format!("cannot open a lane: {e}")], true);
            }
        };
        // Lanes 1.. of the sweep, opened on first use by the thread that drives them.
        let mut extra: Vec<Option<Box<dyn Lane>>> = (1..most).map(|_| None).collect();
        let mut classes = Vec::new();
        let mut failures = Vec::new();
        for (i, t) in plan.iter().enumerate() {
            match self.class(t, &mut lane, &mut extra, &sweep) {
                Ok(c) => classes.push(c),
                Err((e, points)) => {
                    let _ = self.tx.send(Msg::Skipped(points_of(t) - points));
                    let what = format!("{} {}: {e}", t.cipher, t.direction);
                    if e.is_engine_failure() {
                        // Never touch a failed engine again.
                        let left: usize = plan[i + 1..].iter().map(points_of).sum();
                        let _ = self.tx.send(Msg::Skipped(left));
                        failures.push(format!("{what}; the engine was not measured further"));
                        return (classes, failures, true);
                    }
                    failures.push(what);
                }
            }
        }
        (classes, failures, false)
    }

    /// Measures one class; on error, the error and how many of its points were done.
    fn class(
        &self,
        t: &Todo,
        lane: &mut Box<dyn Lane>,
        extra: &mut [Option<Box<dyn Lane>>],
        sweep: &[usize],
    ) -> std::result::Result<ClassCalibration, (Error, usize)> {
        let key = key_of(self.key_ids, t.cipher.key_size);
        let mut points = Vec::new();
        for &len in &t.sizes {
            let job = probe_job(t.cipher, t.direction, key, self.keys, len)
                .map_err(|e| (e, points.len()))?;
            let point = time_point(lane.as_mut(), &job, self.keys, self.settings.point_time)
                .map_err(|e| (e, points.len()))?;
            points.push(point);
            let _ = self
                .tx
                .send(Msg::Point(t.cipher, t.direction, Step::Size(len)));
        }
        let (fixed, per_byte) = fit_points(&points);
        let done = points.len();
        let job =
            probe_job(t.cipher, t.direction, key, self.keys, t.lanes_len).map_err(|e| (e, done))?;
        let lanes = sweep_windows(sweep, SWEEP_ROUNDS, |n| {
            self.in_flight(n, lane, extra, &job)
        })
        .map_err(|e| (e, done))?;
        for p in &lanes {
            let _ = self
                .tx
                .send(Msg::Point(t.cipher, t.direction, Step::Lanes(p.lanes)));
        }
        let info = self.engine.info();
        let driver = info.ciphers.iter().find(|c| c.cipher == t.cipher);
        Ok(ClassCalibration {
            cipher: t.cipher,
            direction: t.direction,
            driver: driver.map_or_else(|| "?".to_string(), |d| d.driver.clone()),
            priority: driver.and_then(|d| d.priority),
            fixed,
            per_byte,
            points,
            lanes,
            lanes_len: t.lanes_len,
        })
    }

    /// Bytes per second of `n` lanes each running `job` back to back for the point
    /// time: lane 0 on this thread, the others on threads of their own, started
    /// together.
    fn in_flight(
        &self,
        n: usize,
        lane: &mut Box<dyn Lane>,
        extra: &mut [Option<Box<dyn Lane>>],
        job: &Job,
    ) -> Result<f64> {
        let time = self.settings.point_time;
        warm_up(lane.as_mut(), job, self.keys)?;
        let start = Barrier::new(n);
        let results: Vec<Result<(usize, Duration)>> = std::thread::scope(|s| {
            let start = &start;
            let handles: Vec<_> = extra
                .iter_mut()
                .take(n - 1)
                .enumerate()
                .map(|(i, slot)| {
                    s.spawn(move || {
                        let opened = match slot {
                            Some(lane) => Ok(lane),
                            None => self.engine.open_lane(i + 1).map(|l| slot.insert(l)),
                        };
                        let ready = opened
                            .and_then(|lane| warm_up(lane.as_mut(), job, self.keys).map(|()| lane));
                        // Every thread reaches the barrier, ready or not.
                        start.wait();
                        run_for(ready?.as_mut(), job, self.keys, time)
                    })
                })
                .collect();
            start.wait();
            let mut results = vec![run_for(lane.as_mut(), job, self.keys, time)];
            results.extend(handles.into_iter().map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::EngineFailed {
                        engine: self.engine.name().to_string(),
                        reason: "a measuring thread panicked".into(),
                    })
                })
            }));
            results
        });
        let mut jobs = 0;
        let mut longest = Duration::ZERO;
        for r in results {
            let (done, took) = r?;
            jobs += done;
            longest = longest.max(took);
        }
        let secs = longest.as_secs_f64();
        Ok(if secs > 0.0 {
            (jobs * job.len()) as f64 / secs
        } else {
            0.0
        })
    }
}

/// Two engines to run side by side on one class, at these sizes.
struct Pair {
    /// Indices into the engines: a `cpu`-kind one, then another.
    engines: [usize; 2],
    cipher: Cipher,
    direction: Direction,
    sizes: Vec<usize>,
}

/// Every `cpu`-kind engine with every other engine (each pair once), on the classes
/// both run, at the sizes both take.
fn mix_plan(engines: &[EngineRef], plans: &[Vec<Todo>]) -> Vec<Pair> {
    let cpu: Vec<bool> = engines
        .iter()
        .map(|e| e.kind() == EngineKind::Cpu)
        .collect();
    let mut pairs = Vec::new();
    for a in (0..engines.len()).filter(|&a| cpu[a]) {
        for b in (0..engines.len()).filter(|&b| b != a && !(cpu[b] && b < a)) {
            for ta in &plans[a] {
                let Some(tb) = plans[b]
                    .iter()
                    .find(|t| t.cipher == ta.cipher && t.direction == ta.direction)
                else {
                    continue;
                };
                let sizes: Vec<usize> = ta
                    .sizes
                    .iter()
                    .copied()
                    .filter(|n| tb.sizes.contains(n))
                    .collect();
                if !sizes.is_empty() {
                    pairs.push(Pair {
                        engines: [a, b],
                        cipher: ta.cipher,
                        direction: ta.direction,
                        sizes,
                    });
                }
            }
        }
    }
    pairs
}

/// Each of two engines alone, then both at once, every lane of each running `job`.
fn mix_point(
    pair: [&EngineRef; 2],
    job: &Job,
    keys: &KeyStore,
    time: Duration,
) -> Result<MixPoint> {
    let a = run_lanes(&pair[..1], job, keys, time)?[0];
    let b = run_lanes(&pair[1..], job, keys, time)?[0];
    let both = run_lanes(&pair, job, keys, time)?;
    Ok(MixPoint {
        len: job.len(),
        alone: [a, b],
        together: [both[0], both[1]],
    })
}

/// Bytes per second of each engine of `engines` with every lane of each running `job`
/// back to back until one deadline, all started together (each lane opened, and warmed
/// up, on its own thread first).
fn run_lanes(
    engines: &[&EngineRef],
    job: &Job,
    keys: &KeyStore,
    time: Duration,
) -> Result<Vec<f64>> {
    let lanes: Vec<(usize, usize)> = engines
        .iter()
        .enumerate()
        .flat_map(|(g, e)| (0..e.lanes().max(1)).map(move |i| (g, i)))
        .collect();
    let start = Barrier::new(lanes.len());
    let ran: Vec<(usize, Result<(usize, Duration)>)> = std::thread::scope(|s| {
        let handles: Vec<_> = lanes
            .iter()
            .map(|&(g, i)| {
                let start = &start;
                let engine = engines[g];
                s.spawn(move || {
                    let ready = engine
                        .open_lane(i)
                        .and_then(|mut lane| warm_up(lane.as_mut(), job, keys).map(|()| lane));
                    // Every thread reaches the barrier, ready or not.
                    start.wait();
                    let deadline = Instant::now() + time;
                    ready.and_then(|mut lane| run_until(lane.as_mut(), job, keys, deadline))
                })
            })
            .collect();
        lanes
            .iter()
            .zip(handles)
            .map(|(&(g, _), h)| {
                let r = h.join().unwrap_or_else(|_| {
                    Err(Error::EngineFailed {
                        engine: engines[g].name().to_string(),
                        reason: "a measuring thread panicked".into(),
                    })
                });
                (g, r)
            })
            .collect()
    });
    let mut jobs = vec![0usize; engines.len()];
    let mut took = vec![Duration::ZERO; engines.len()];
    for (g, r) in ran {
        let (n, t) = r?;
        jobs[g] += n;
        took[g] = took[g].max(t);
    }
    Ok(jobs
        .iter()
        .zip(&took)
        .map(|(&n, t)| {
            let secs = t.as_secs_f64();
            if secs > 0.0 {
                (n * job.len()) as f64 / secs
            } else {
                0.0
            }
        })
        .collect())
}

/// Runs `job` back to back until `deadline` (once at least): requests done and the
/// time they took. Side by side, every lane runs to the same deadline, so no engine's
/// rate is measured partly alone.
fn run_until(
    lane: &mut dyn Lane,
    job: &Job,
    keys: &KeyStore,
    deadline: Instant,
) -> Result<(usize, Duration)> {
    let mut out = JobOutput::default();
    let start = Instant::now();
    let mut jobs = 0;
    loop {
        lane.run(job, keys, &mut out)?;
        jobs += 1;
        let now = Instant::now();
        if now >= deadline {
            return Ok((jobs, now - start));
        }
    }
}

/// A job of `len` bytes for the probe: random input; for decryption, real ciphertext
/// with its tag (GCM checks it), sealed by OpenSSL.
fn probe_job(
    cipher: Cipher,
    direction: Direction,
    key: KeyId,
    keys: &KeyStore,
    len: usize,
) -> Result<Job> {
    let mut input = vec![0u8; len];
    openssl::rand::rand_bytes(&mut input)?;
    let mut iv = vec![0u8; cipher.iv_len()];
    openssl::rand::rand_bytes(&mut iv)?;
    let mut job = Job::with_iv(cipher, direction, key, &iv, input)?;
    if cipher.mode == Mode::Gcm && direction == Direction::Decrypt {
        let evp = match cipher.key_size {
            KeySize::Aes128 => openssl::symm::Cipher::aes_128_gcm(),
            KeySize::Aes192 => openssl::symm::Cipher::aes_192_gcm(),
            KeySize::Aes256 => openssl::symm::Cipher::aes_256_gcm(),
        };
        let mut tag = [0u8; crate::job::TAG_LEN];
        let sealed = keys.with_key(key, |k| {
            openssl::symm::encrypt_aead(evp, k.as_bytes(), Some(&iv), &[], &job.input, &mut tag)
        })??;
        job.input = sealed;
        job.tag = Some(tag);
    }
    Ok(job)
}

/// Runs `job` untimed, [`WARM_UP_JOBS`] times and for [`WARM_UP_TIME`] at least.
fn warm_up(lane: &mut dyn Lane, job: &Job, keys: &KeyStore) -> Result<()> {
    let mut out = JobOutput::default();
    let start = Instant::now();
    let mut jobs = 0;
    while jobs < WARM_UP_JOBS || start.elapsed() < WARM_UP_TIME {
        lane.run(job, keys, &mut out)?;
        jobs += 1;
    }
    Ok(())
}

/// Runs `job` back to back for `time`: requests done and the time they took.
fn run_for(
    lane: &mut dyn Lane,
    job: &Job,
    keys: &KeyStore,
    time: Duration,
) -> Result<(usize, Duration)> {
    let mut out = JobOutput::default();
    let start = Instant::now();
    let mut jobs = 0;
    loop {
        lane.run(job, keys, &mut out)?;
        jobs += 1;
        let took = start.elapsed();
        if (took >= time && jobs >= MIN_JOBS) || jobs >= MAX_JOBS {
            return Ok((jobs, took));
        }
    }
}

/// One lane, one request at a time: the median wall time of a request and its mean
/// CPU time on the lane's thread.
fn time_point(
    lane: &mut dyn Lane,
    job: &Job,
    keys: &KeyStore,
    time: Duration,
) -> Result<SizePoint> {
    warm_up(lane, job, keys)?;
    let mut out = JobOutput::default();
    let mut walls: Vec<f64> = Vec::new();
    let cpu_start = thread_cpu_time();
    let start = Instant::now();
    loop {
        let t = Instant::now();
        lane.run(job, keys, &mut out)?;
        walls.push(t.elapsed().as_secs_f64());
        if (walls.len() >= MIN_JOBS && start.elapsed() >= time) || walls.len() >= MAX_JOBS {
            break;
        }
    }
    let cpu = thread_cpu_time().saturating_sub(cpu_start).as_secs_f64() / walls.len() as f64;
    walls.sort_by(f64::total_cmp);
    Ok(SizePoint {
        len: job.len(),
        wall: walls[walls.len() / 2],
        cpu,
        jobs: u32::try_from(walls.len()).unwrap_or(u32::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu::CpuEngine;

    /// The sweep with fake windows: a host whose busy spells hit two of the nine
    /// windows (the very first of the sweep, 2x slow; the eighth, 3x fast), over true
    /// rates where two lanes lead one by 7% and four by 8%, as on the twentieth
    /// session's Intel host where two then ran slower. The counts take turns, each
    /// median is the true rate, and the choice is one lane. The old sweep (one window
    /// per count, 1 2 4) would have read one lane at half its rate and the old rule
    /// (the fewest within 5% of the best) chosen two even from the true rates.
    #[test]
    fn the_sweep_alternates_counts_takes_medians_and_keeps_fewer_lanes_on_a_small_lead() {
        let truth = |n: usize| match n {
            1 => 100e6,
            2 => 107e6,
            _ => 108e6,
        };
        let mut order = Vec::new();
        let lanes = sweep_windows(&[1, 2, 4], SWEEP_ROUNDS, |n| {
            let spell = match order.len() {
                0 => 0.5,
                7 => 3.0,
                _ => 1.0,
            };
            order.push(n);
            Ok(truth(n) * spell)
        })
        .expect("fake windows do not fail");
        assert_eq!(order, [1, 2, 4, 2, 4, 1, 4, 1, 2]);
        for p in &lanes {
            assert_eq!(p.bytes_per_second, truth(p.lanes), "{} lanes", p.lanes);
        }
        // A sweep of one count takes one window.
        let mut windows = 0;
        let one = sweep_windows(&[1], SWEEP_ROUNDS, |_| {
            windows += 1;
            Ok(5.0)
        })
        .expect("fake windows do not fail");
        assert_eq!((windows, one[0].bytes_per_second), (1, 5.0));
        let mut class = crate::calibration::tests::class(
            Cipher::AES_128_CBC,
            Direction::Encrypt,
            200e-6,
            1e-9,
            1.0,
        );
        class.lanes = lanes;
        assert_eq!(class.best_lanes(), Some(1));
        // A failing window ends the sweep with its error.
        let failed = sweep_windows(&[1, 2], 3, |n| {
            if n == 2 {
                Err(Error::EngineFailed {
                    engine: "fake".into(),
                    reason: "gone".into(),
                })
            } else {
                Ok(1.0)
            }
        });
        assert!(failed.is_err());
        assert_eq!(median(&mut []), 0.0);
        assert_eq!(median(&mut [3.0, 1.0, 2.0, 10.0]), 2.5);
    }

    #[test]
    fn sweep_doubles_up_to_the_engine_lanes() {
        assert_eq!(lane_counts(1), [1]);
        assert_eq!(lane_counts(2), [1, 2]);
        assert_eq!(lane_counts(6), [1, 2, 4, 6]);
        assert_eq!(lane_counts(8), [1, 2, 4, 8]);
    }

    /// An offload engine is swept past its own lane count (the sweep chooses it); one
    /// on the host CPU only up to its own.
    #[test]
    fn an_offload_engine_is_swept_to_the_offload_ceiling() {
        use crate::engine::tests::Stub;
        let offload: EngineRef = std::sync::Arc::new(Stub { tuned: true });
        let host: EngineRef = std::sync::Arc::new(Stub { tuned: false });
        assert!(!offload.uses_host_cpu() && host.uses_host_cpu());
        assert_eq!(offload.lanes(), 3);
        let mut settings = Settings::default();
        assert_eq!(sweep_lanes(&offload, &settings), OFFLOAD_SWEEP_LANES.max(3));
        assert_eq!(sweep_lanes(&host, &settings), 3);
        settings.offload_lanes = 1;
        assert_eq!(sweep_lanes(&offload, &settings), 3);
        settings.offload_lanes = 8;
        assert_eq!(lane_counts(sweep_lanes(&offload, &settings)), [1, 2, 4, 8]);
    }

    /// A short calibration of two cpu engines measures every size and lane count of
    /// every class, reports each point once, and stores positive costs.
    #[test]
    fn measures_every_point_and_reports_progress() {
        let engines = vec![
            CpuEngine::with_lanes(2).into_engine(),
            CpuEngine::with_lanes(1).named("cpu-b").into_engine(),
        ];
        let settings = Settings {
            ciphers: vec![Cipher::AES_128_GCM, Cipher::AES_128_CBC],
            sizes: vec![16, 1024, 4096],
            point_time: Duration::from_millis(1),
            lanes_len: 1024,
            mixes: true,
            ..Settings::default()
        };
        let mut seen = Vec::new();
        let cal = measure(&engines, &settings, &mut |p| {
            seen.push((p.done, p.total, p.engine.to_string(), p.step))
        })
        .unwrap();
        // cpu: 4 classes x (3 sizes + lanes 1, 2); cpu-b: 4 x (3 + lanes 1); the two
        // side by side: 4 x 3.
        let total = 4 * 5 + 4 * 4 + 4 * 3;
        assert_eq!(seen.len(), total);
        assert!(seen
            .iter()
            .enumerate()
            .all(|(i, s)| s.0 == i + 1 && s.1 == total));
        assert!(cal.unmeasured.is_empty(), "{:?}", cal.unmeasured);
        assert_eq!(cal.engines.len(), 2);
        for e in &cal.engines {
            assert_eq!(e.classes.len(), 4);
            for c in &e.classes {
                assert_eq!(
                    c.points.iter().map(|p| p.len).collect::<Vec<_>>(),
                    [16, 1024, 4096]
                );
                assert!(c
                    .points
                    .iter()
                    .all(|p| p.wall > 0.0 && p.jobs >= MIN_JOBS as u32));
                assert_eq!(c.lanes.len(), e.lanes);
                assert!(c.lanes.iter().all(|l| l.bytes_per_second > 0.0));
                assert!(c.fixed >= 0.0 && c.per_byte >= 0.0 && c.seconds(4096) > 0.0);
            }
        }
        assert_eq!(cal.mixes.len(), 4);
        for m in &cal.mixes {
            assert_eq!(m.engines, ["cpu".to_string(), "cpu-b".to_string()]);
            assert_eq!(
                m.points.iter().map(|p| p.len).collect::<Vec<_>>(),
                [16, 1024, 4096]
            );
            assert!(m
                .points
                .iter()
                .all(|p| p.alone.iter().chain(&p.together).all(|&r| r > 0.0)));
        }
        let d = Direction::Decrypt;
        assert!(cal
            .mix_parts("cpu-b", "cpu", Cipher::AES_128_GCM, d, 4096)
            .is_some());
        assert!(cal.cost("cpu-b", Cipher::AES_128_GCM, d, 4096).is_some());
        assert!(cal
            .crossover(Cipher::AES_128_GCM, d, "cpu", "cpu-b")
            .is_some());
    }

    /// An offload engine that answers its first `slow` requests after `SLOW` (a busy
    /// spell on the host) and the rest at once.
    struct Stalled {
        requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
        slow: usize,
    }

    const SLOW: Duration = Duration::from_millis(10);

    impl crate::engine::Engine for Stalled {
        fn name(&self) -> &str {
            "stalled"
        }

        fn info(&self) -> crate::engine::EngineInfo {
            crate::engine::EngineInfo {
                name: "stalled".into(),
                kind: EngineKind::Kernel,
                lanes: 1,
                ciphers: Vec::new(),
            }
        }

        fn lanes(&self) -> usize {
            1
        }

        fn supports(&self, cipher: Cipher, direction: Direction) -> bool {
            cipher == Cipher::AES_128_CTR && direction == Direction::Encrypt
        }

        fn open_lane(&self, _: usize) -> Result<Box<dyn Lane>> {
            Ok(Box::new(StalledLane {
                requests: std::sync::Arc::clone(&self.requests),
                slow: self.slow,
            }))
        }

        fn uses_host_cpu(&self) -> bool {
            false
        }
    }

    struct StalledLane {
        requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
        slow: usize,
    }

    impl Lane for StalledLane {
        fn run(&mut self, job: &Job, _: &KeyStore, out: &mut JobOutput) -> Result<()> {
            let n = self
                .requests
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n < self.slow {
                std::thread::sleep(SLOW);
            }
            out.data = job.input.to_vec();
            Ok(())
        }
    }

    /// A busy spell over an offload engine's first pass does not reach the store: its
    /// sizes are timed again after it and the lower median is kept (the cpu's are not).
    #[test]
    fn an_offload_engines_sizes_keep_the_lower_of_two_passes() {
        // With requests of 10 ms and points of 1 ms, the first pass of each size is
        // exactly 2 warm-up and MIN_JOBS timed requests: all of them slow.
        let sizes = vec![256, 1024];
        let slow = sizes.len() * (WARM_UP_JOBS + MIN_JOBS);
        let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let engine: EngineRef = std::sync::Arc::new(Stalled {
            requests: std::sync::Arc::clone(&requests),
            slow,
        });
        let settings = Settings {
            ciphers: vec![Cipher::AES_128_CTR],
            sizes,
            point_time: Duration::from_millis(1),
            lanes_len: 1024,
            offload_lanes: 1,
            mixes: false,
        };
        let mut seen = Vec::new();
        let cal = measure(&[engine], &settings, &mut |p| {
            seen.push((p.done, p.total, p.step))
        })
        .unwrap();
        // 2 sizes and one lane count, then the 2 sizes again.
        assert_eq!(seen.len(), 5);
        assert!(seen
            .iter()
            .enumerate()
            .all(|(i, s)| s.0 == i + 1 && s.1 == 5));
        assert_eq!(seen[4].2, Step::Size(1024));
        assert!(requests.load(std::sync::atomic::Ordering::Relaxed) > slow);
        let class = &cal.engines[0].classes[0];
        for p in &class.points {
            assert!(p.wall < SLOW.as_secs_f64() / 2.0, "{p:?}");
        }
        assert!(class.seconds(1024) < SLOW.as_secs_f64() / 2.0, "{class:?}");
    }
}
