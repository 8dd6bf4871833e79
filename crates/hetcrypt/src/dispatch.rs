//! The dispatcher: runs a batch on the engines' lanes under a policy, moves the jobs of
//! a failed engine to the others, and reports what happened.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::cipher::{Cipher, Direction};
use crate::engine::{EngineKind, EngineRef, Lane};
use crate::error::{Error, Result};
use crate::job::{Job, JobOutput};
use crate::key::{Key, KeyId, KeyStore};
use crate::policy::{
    lock, EngineMask, EngineMeta, JobMeta, LaneMeta, Plan, Policy, Schedule, MAX_ENGINES,
};
use crate::report::{EngineReport, LaneReport, Report};

/// Every output of a batch, in job order, and the report.
#[derive(Debug)]
pub struct BatchResult {
    /// One result per job, in the order the jobs were given.
    pub outputs: Vec<Result<JobOutput>>,
    /// What the batch did.
    pub report: Report,
}

/// Opened lanes, per engine then per lane index; `None` where none is open.
type LaneCache = Vec<Vec<Option<Box<dyn Lane>>>>;

/// Runs batches of jobs on a set of engines.
///
/// Lanes are opened once and kept between batches (with their cached key contexts
/// and sockets); each batch runs one thread per lane, from start to join, as the seeds
/// time it. An engine that fails is quarantined for the dispatcher's lifetime and never
/// used again (retrying a vanished kernel device can crash the kernel).
pub struct Dispatcher {
    engines: Vec<EngineRef>,
    /// Per engine: its kind, asked once (`Engine::info` builds its whole description,
    /// ~45,000 instructions for `cpu`, more than a batch of 100 small jobs).
    kinds: Vec<EngineKind>,
    /// Cores this process may use, asked once (the standard library reads cgroup files
    /// for it: system calls that cost tens of microseconds under emulation).
    cores: usize,
    keys: KeyStore,
    /// Opened lanes, per engine, kept between batches.
    lanes: Mutex<LaneCache>,
    /// Per engine: why it was quarantined.
    failed: Mutex<Vec<Option<String>>>,
    /// Held shared by every running batch and exclusively by key removal, so a key
    /// is never removed while a batch may still look it up.
    batch_gate: RwLock<()>,
    /// Keys removed whose cached lane state has not been dropped yet.
    forgotten: Mutex<Vec<KeyId>>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field(
                "engines",
                &self
                    .engines
                    .iter()
                    .map(|e| e.name().to_string())
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Removed keys that make the dispatcher ask every cached lane to forget them: enough
/// that lanes which cannot forget selectively (they are closed and reopened) are not
/// reopened for every file of a tree, few enough that per-key caches stay small.
const FORGET_AFTER: usize = 64;

/// Spare output buffers a lane takes from the shared pool per job slot at a time:
/// enough to take the lock once per few pulls, few enough to share them out.
const SPARE_TAKE: usize = 4;

/// Extra room in a lane's result list beyond its even share of the batch, for the
/// unevenness of pulling (a lane may take a few pulls more than its share).
const MAX_PULL_SLACK: usize = 64;

/// CPU time used so far by the calling thread (zero if the clock cannot be read):
/// what lanes, the calibration and the OpenSSL provider time their own work by.
pub fn thread_cpu_time() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

impl Dispatcher {
    /// A dispatcher over these engines. Names must be unique; at most 64 engines.
    pub fn new(engines: Vec<EngineRef>) -> Result<Self> {
        if engines.len() > MAX_ENGINES {
            return Err(Error::InvalidEngines {
                reason: format!("{} engines, at most {MAX_ENGINES}", engines.len()),
            });
        }
        for (i, e) in engines.iter().enumerate() {
            if engines[..i].iter().any(|o| o.name() == e.name()) {
                return Err(Error::InvalidEngines {
                    reason: format!("two engines named '{}'", e.name()),
                });
            }
        }
        let lanes = engines
            .iter()
            .map(|e| (0..e.lanes()).map(|_| None).collect())
            .collect();
        let failed = vec![None; engines.len()];
        Ok(Dispatcher {
            kinds: engines.iter().map(|e| e.kind()).collect(),
            cores: crate::engine::cpu::available_cores(),
            engines,
            keys: KeyStore::new(),
            lanes: Mutex::new(lanes),
            failed: Mutex::new(failed),
            batch_gate: RwLock::new(()),
            forgotten: Mutex::new(Vec::new()),
        })
    }

    /// The engines, in order.
    pub fn engines(&self) -> &[EngineRef] {
        &self.engines
    }

    /// The registered keys.
    pub fn keys(&self) -> &KeyStore {
        &self.keys
    }

    /// Registers a key for jobs to refer to.
    pub fn add_key(&self, key: Key) -> Result<KeyId> {
        self.keys.add(key)
    }

    /// Removes a registered key, zeroizing it, once no batch is running (it waits for
    /// running batches to end: their lanes may still look the key up). Jobs naming it
    /// fail with [`Error::UnknownKey`] from then on, and its id is never reused. The
    /// lanes' per-key state (contexts, sockets) is dropped every few dozen removals.
    pub fn remove_key(&self, id: KeyId) -> Result<()> {
        let _no_batch = self.batch_gate.write().unwrap_or_else(|e| e.into_inner());
        self.keys.remove(id)?;
        let mut forgotten = lock(&self.forgotten);
        forgotten.push(id);
        if forgotten.len() >= FORGET_AFTER {
            // No batch runs, so every opened lane is here.
            for lane in lock(&self.lanes).iter_mut().flatten() {
                if lane.as_mut().is_some_and(|l| !l.forget_keys(&forgotten)) {
                    *lane = None;
                }
            }
            forgotten.clear();
        }
        Ok(())
    }

    /// Engines quarantined so far, with the reason.
    pub fn failed_engines(&self) -> Vec<(String, String)> {
        lock(&self.failed)
            .iter()
            .zip(&self.engines)
            .filter_map(|(f, e)| f.as_ref().map(|r| (e.name().to_string(), r.clone())))
            .collect()
    }

    /// Runs every job under `policy` and returns every output (in job order) and the
    /// report. Job errors are per job; the call itself fails only if the policy
    /// cannot plan the batch.
    pub fn run(&self, jobs: &[Job], policy: &dyn Policy) -> Result<BatchResult> {
        self.run_reusing(jobs, policy, Vec::new())
    }

    /// Like [`Dispatcher::run`], but the outputs are written into `spare` buffers (for
    /// instance the outputs of an earlier batch the caller is done with) before any new
    /// one is allocated. Every engine replaces a buffer's contents, so what a spare held
    /// is never part of a result.
    ///
    /// Fresh output memory is not free: on our VM first-touching it cost more than
    /// encrypting it with multi-buffer CBC (docs/performance.md), and the allocator
    /// hands freed outputs back to the kernel between batches. The vector of results
    /// is still new on every call (a 16-byte job's result takes more room than its
    /// output): a caller that runs batch after batch should prefer
    /// [`Dispatcher::run_into`], which keeps that vector too.
    pub fn run_reusing(
        &self,
        jobs: &[Job],
        policy: &dyn Policy,
        spare: Vec<JobOutput>,
    ) -> Result<BatchResult> {
        let mut outputs: Vec<Result<JobOutput>> = spare.into_iter().map(Ok).collect();
        let report = self.run_into(jobs, policy, &mut outputs)?;
        Ok(BatchResult { outputs, report })
    }

    /// Like [`Dispatcher::run_reusing`], on the calling thread where that is possible:
    /// with one engine, working, whose lanes use the host's CPU and may run on any
    /// thread (`cpu`), the batch runs on one of its lanes, in-line, and no lane thread
    /// is started; otherwise exactly as [`Dispatcher::run_reusing`] (see
    /// [`Dispatcher::runs_in_line`]).
    ///
    /// For batches that are a small part of their caller's work, such as the chunks of
    /// a tree of small files, where opening, reading, making and naming each file cost
    /// several times its encryption and keep the other cores busy: starting, waking and
    /// joining lane threads for them cost more than spreading the batch saves.
    pub fn run_reusing_in_line(
        &self,
        jobs: &[Job],
        policy: &dyn Policy,
        spare: Vec<JobOutput>,
    ) -> Result<BatchResult> {
        let mut outputs: Vec<Result<JobOutput>> = spare.into_iter().map(Ok).collect();
        let report = self.run_on(jobs, policy, &mut outputs, self.in_line_engine())?;
        Ok(BatchResult { outputs, report })
    }

    /// Like [`Dispatcher::run_reusing_in_line`], and where the batch runs in-line and
    /// the lane runs every job in the job's own input buffer ([`Lane::runs_in_place`]:
    /// GCM on the `cpu` engine's `ring` path), it does: each job's input buffer
    /// becomes its output, and the job is left a spare buffer (or an empty one)
    /// instead, which the caller may read the next input into. For a caller that owns
    /// the inputs and is done with them once the batch ran (a large file's chunks):
    /// copying each input into its output before sealing it in place cost 0.15 s of
    /// CPU per GiB, an eighth of a 1 GiB run on our 2-core host (docs/performance.md,
    /// "Twenty-first session"). The policy plans the batch as for the in-line lane;
    /// otherwise (lane threads, a job the lane cannot run in place, a job no engine
    /// runs) exactly [`Dispatcher::run_reusing_in_line`], and the jobs keep their
    /// inputs.
    pub fn run_in_place_in_line(
        &self,
        jobs: &mut [Job],
        policy: &dyn Policy,
        mut spare: Vec<JobOutput>,
    ) -> Result<BatchResult> {
        if let Some(engine) = self.in_line_engine() {
            if let Some(result) = self.run_in_place_on(engine, jobs, policy, &mut spare)? {
                return Ok(result);
            }
        }
        self.run_reusing_in_line(jobs, policy, spare)
    }

    /// Whether [`Dispatcher::run_reusing_in_line`] runs a batch on the calling thread
    /// (else it starts lane threads as [`Dispatcher::run_reusing`] does).
    pub fn runs_in_line(&self) -> bool {
        self.in_line_engine().is_some()
    }

    /// The engine a batch may run on in-line, on one lane: the only engine, if it has
    /// not failed, uses the host's CPU and its lanes may run on any thread. With more
    /// engines, or an offload device, the batch keeps its lanes (a device's requests
    /// in flight are what make it fast).
    fn in_line_engine(&self) -> Option<usize> {
        let [engine] = &self.engines[..] else {
            return None;
        };
        let alive = lock(&self.failed).first().is_some_and(Option::is_none);
        (alive && engine.lanes() > 0 && engine.uses_host_cpu() && engine.runs_on_any_thread())
            .then_some(0)
    }

    /// Like [`Dispatcher::run_reusing`], with the whole output vector reused: on entry
    /// `outputs` holds whatever the caller is done with (typically the previous batch's
    /// outputs, errors included), whose buffers are written into as spares; on return
    /// it holds this batch's outputs, one per job, in job order. Nothing per job is
    /// allocated when it holds a buffer per job, and the vector itself is kept: a
    /// fresh vector of results is first-touched memory too (at 16-byte jobs, more
    /// than the jobs' own outputs). If the call fails (the policy cannot plan the
    /// batch), `outputs` is left as it was.
    pub fn run_into(
        &self,
        jobs: &[Job],
        policy: &dyn Policy,
        outputs: &mut Vec<Result<JobOutput>>,
    ) -> Result<Report> {
        self.run_on(jobs, policy, outputs, None)
    }

    /// [`Dispatcher::run_into`] on every lane of every engine, or, with `one_lane`, on
    /// the first lane of that engine only (the policy sees the others with no lanes).
    fn run_on(
        &self,
        jobs: &[Job],
        policy: &dyn Policy,
        outputs: &mut Vec<Result<JobOutput>>,
        one_lane: Option<usize>,
    ) -> Result<Report> {
        let _batch = self.batch_gate.read().unwrap_or_else(|e| e.into_inner());
        let failed_before: Vec<bool> = lock(&self.failed).iter().map(Option::is_some).collect();
        // Which engines support each (cipher, direction), and up to what job size,
        // asked once per pair rather than once per job and engine: a batch may hold
        // hundreds of thousands of jobs.
        let mut support: Vec<Support> = Vec::new();
        let mut alive = EngineMask::default();
        for (e, _) in failed_before.iter().enumerate().filter(|(_, &f)| !f) {
            alive.insert(e);
        }
        // Results are put in job order after the lanes join, from what each lane kept
        // (lanes share no per-job state while they run); `unrunnable` are the jobs
        // that end before any lane starts, as no engine that still works can run them.
        let Planned {
            metas,
            unrunnable,
            bytes,
        } = self.plan_jobs(jobs, alive, &mut support);
        let Scheduled {
            lane_metas,
            schedule,
            ..
        } = self.schedule(policy, &metas, &support, &failed_before, one_lane)?;
        // Lanes of engines the schedule has no use for start only if an engine fails
        // and its jobs need them: an idle lane's thread still costs its start, its
        // barrier and its join (a third of a batch of 400 tiny jobs in the testbed).
        let needed = schedule.engines_needed();
        let mut deferred: Vec<usize> = (0..lane_metas.len())
            .filter(|&l| !needed.contains(lane_metas[l].engine))
            .collect();
        if deferred.len() == lane_metas.len() {
            deferred.clear();
        }
        let initial = lane_metas.len() - deferred.len();
        // One lane and nothing deferred (`only:cpu` on one lane, a provider call): it
        // runs on this thread (a thread's start and join cost tens of microseconds,
        // more than a batch of a few small jobs) and writes its outputs straight into
        // the batch's slots, the caller's spares first.
        let inline = match (&lane_metas[..], deferred.is_empty()) {
            ([only], true) => self.engines[only.engine].runs_on_any_thread(),
            _ => false,
        };
        // Runs of jobs the in-line lane left their result in `outputs` for.
        let mut in_place: Vec<Range<usize>> = Vec::new();
        let spare = if inline {
            outputs.truncate(jobs.len());
            outputs.resize_with(jobs.len(), || Ok(JobOutput::default()));
            Vec::new()
        } else {
            outputs.drain(..).filter_map(Result::ok).collect()
        };

        let widths: Vec<((Cipher, Direction), Vec<usize>)> =
            support.iter().map(|s| (s.pair, s.widths.clone())).collect();
        let shared = Shared {
            jobs,
            widths: &widths,
            alive_at_start: alive,
            metas: &metas,
            schedule: schedule.as_ref(),
            keys: &self.keys,
            lane_count: initial,
            start: Barrier::new(initial),
            deferred: deferred.len(),
            remaining: AtomicUsize::new(0),
            spare: Mutex::new(spare),
            late: Mutex::new(Vec::new()),
            quarantined: failed_before.iter().map(|&f| AtomicBool::new(f)).collect(),
            reasons: Mutex::new(vec![None; self.engines.len()]),
            coord: Mutex::new(Coord {
                retry: VecDeque::new(),
                running: initial,
                done: false,
                exited: 0,
                start_deferred: false,
            }),
            wake: Condvar::new(),
            alone: inline,
            retry_len: AtomicUsize::new(0),
            redispatched: AtomicUsize::new(0),
            refused: Mutex::new(Vec::new()),
            any_refused: AtomicBool::new(false),
        };
        let runnable = jobs.len() - unrunnable.len();
        shared.remaining.store(runnable, Ordering::Relaxed);
        if runnable == 0 {
            lock(&shared.coord).done = true;
        }
        // Jobs the policy placed on engines that failed in an earlier batch go to the
        // others, as they would have had the engine failed during this one.
        for (engine, _) in failed_before.iter().enumerate().filter(|(_, &f)| f) {
            shared.requeue(engine);
        }
        if shared.retry_len.load(Ordering::Acquire) > 0 {
            // Re-dispatched jobs may need the deferred lanes' engines.
            shared.start_deferred();
        }

        // Hand each lane thread its cached lane (or none: it opens one).
        let mut cached: Vec<Option<Box<dyn Lane>>> = {
            let mut lanes = lock(&self.lanes);
            lane_metas
                .iter()
                .map(|l| lanes[l.engine][l.index].take())
                .collect()
        };
        let start = Instant::now();
        let mut ends: Vec<Option<LaneEnd>> = std::thread::scope(|scope| {
            let shared = &shared;
            let spawn = |lane_idx: usize, opened: Option<Box<dyn Lane>>, at_start: bool| {
                let meta = lane_metas[lane_idx];
                let engine = &self.engines[meta.engine];
                scope.spawn(move || {
                    let _exit = LaneExit(shared);
                    (
                        lane_idx,
                        shared.lane_loop(
                            lane_idx,
                            meta,
                            engine,
                            opened,
                            at_start,
                            Sink::list(jobs.len(), initial),
                        ),
                    )
                })
            };
            let mut ends: Vec<Option<LaneEnd>> = (0..lane_metas.len()).map(|_| None).collect();
            if let ([only], true) = (&lane_metas[..], inline) {
                let engine = &self.engines[only.engine];
                let _exit = LaneExit(shared);
                let sink = Sink::Slots {
                    outputs: &mut outputs[..],
                    done: &mut in_place,
                };
                ends[0] = Some(shared.lane_loop(0, *only, engine, cached[0].take(), true, sink));
                return ends;
            }
            let mut handles: Vec<_> = (0..lane_metas.len())
                .filter(|l| !deferred.contains(l))
                .map(|l| spawn(l, cached[l].take(), true))
                .collect();
            // Wait for the lanes to end, starting the deferred ones if a lane asks.
            if !deferred.is_empty() {
                let mut coord = lock(&shared.coord);
                while coord.exited < shared.lane_count && !coord.start_deferred {
                    coord = shared.wake.wait(coord).unwrap_or_else(|e| e.into_inner());
                }
                let start_deferred = coord.start_deferred;
                drop(coord);
                if start_deferred {
                    for &l in &deferred {
                        handles.push(spawn(l, cached[l].take(), false));
                    }
                }
            }
            for h in handles {
                let (l, end) = h.join().expect("lane threads catch their own failures");
                ends[l] = Some(end);
            }
            ends
        });
        // Lanes never started keep their cached lane and report no work.
        let finished: Vec<LaneEnd> = ends
            .iter_mut()
            .zip(cached.iter_mut())
            .zip(&lane_metas)
            .map(|((end, slot), meta)| {
                end.take().unwrap_or_else(|| LaneEnd {
                    report: LaneReport {
                        lane: meta.index,
                        ..LaneReport::default()
                    },
                    lane: slot.take(),
                    done: Vec::new(),
                    ascending: true,
                })
            })
            .collect();
        let wall = start.elapsed();

        let Shared {
            reasons,
            redispatched,
            late,
            ..
        } = shared;
        let mut lane_reports = Vec::with_capacity(finished.len());
        let mut opened = Vec::with_capacity(finished.len());
        let mut late = late.into_inner().unwrap_or_else(|e| e.into_inner());
        late.sort_by_key(|&(j, _)| j);
        let mut lists = vec![(unrunnable, true), (late, true)];
        for end in finished {
            lane_reports.push(end.report);
            opened.push(end.lane);
            lists.push((end.done, end.ascending));
        }
        let missing = |j: usize| {
            // A policy that keeps jobs to some engines (`only:<engine>`) has no lane
            // for a job above those engines' size limit: say so.
            let job = &jobs[j];
            let pair = (job.cipher, job.direction);
            let excluded = support
                .iter()
                .find(|s| s.pair == pair)
                .and_then(|s| s.too_large(job, &self.engines, EngineMask(u64::MAX)));
            Err(excluded.unwrap_or_else(|| Error::Policy {
                policy: policy.name(),
                reason: format!("no lane was given this {} job", metas[j].cipher),
            }))
        };
        let duplicates = if inline {
            let lists = lists.into_iter().map(|(list, _)| list).collect();
            fill_gaps(outputs, in_place, lists, missing)
        } else {
            in_job_order(outputs, jobs.len(), lists, missing)
        };
        debug_assert_eq!(duplicates, 0, "a job was completed twice");

        // Record new failures; keep the lanes of engines that still work.
        let failed = {
            let mut failed = lock(&self.failed);
            for (slot, reason) in failed
                .iter_mut()
                .zip(reasons.into_inner().unwrap_or_else(|e| e.into_inner()))
            {
                if slot.is_none() {
                    *slot = reason;
                }
            }
            let mut lanes = lock(&self.lanes);
            for (meta, lane) in lane_metas.iter().zip(opened) {
                if failed[meta.engine].is_none() {
                    lanes[meta.engine][meta.index] = lane;
                }
            }
            failed.clone()
        };

        Ok(self.report(Tally {
            policy,
            jobs: jobs.len(),
            bytes,
            wall,
            failed,
            lanes: lane_metas.iter().zip(lane_reports),
            redispatched: redispatched.into_inner(),
            outputs,
        }))
    }

    /// The policy's schedule for a batch whose jobs `metas` describes, with what it was
    /// shown: each engine (see [`Dispatcher::engine_metas`]) and each lane.
    fn schedule(
        &self,
        policy: &dyn Policy,
        metas: &[JobMeta],
        support: &[Support],
        failed_before: &[bool],
        one_lane: Option<usize>,
    ) -> Result<Scheduled> {
        let engine_metas = self.engine_metas(support, failed_before, one_lane);
        let lane_metas: Vec<LaneMeta> = engine_metas
            .iter()
            .enumerate()
            .flat_map(|(engine, m)| (0..m.lanes).map(move |index| LaneMeta { engine, index }))
            .collect();
        let schedule = policy.plan(&Plan {
            jobs: metas,
            engines: &engine_metas,
            lanes: &lane_metas,
            cores: self.cores,
        })?;
        Ok(Scheduled {
            engine_metas,
            lane_metas,
            schedule,
        })
    }

    /// A batch's [`Report`]: each engine's work summed from its lanes' reports.
    fn report<'a>(
        &self,
        tally: Tally<'a, impl Iterator<Item = (&'a LaneMeta, LaneReport)>>,
    ) -> Report {
        let mut engines: Vec<EngineReport> = self
            .engines
            .iter()
            .zip(tally.failed)
            .zip(&self.kinds)
            .map(|((e, failed), &kind)| EngineReport {
                name: e.name().to_string(),
                kind,
                jobs: 0,
                bytes: 0,
                busy: Duration::ZERO,
                failed,
                lanes: Vec::new(),
            })
            .collect();
        for (meta, lane) in tally.lanes {
            let e = &mut engines[meta.engine];
            e.jobs += lane.jobs;
            e.bytes += lane.bytes;
            e.busy += lane.busy;
            e.lanes.push(lane);
        }
        Report {
            policy: tally.policy.name(),
            jobs: tally.jobs,
            bytes: tally.bytes,
            wall: tally.wall,
            engines,
            redispatched: tally.redispatched,
            job_errors: tally.outputs.iter().filter(|o| o.is_err()).count(),
        }
    }

    /// What the policy sees of each engine: its lanes (none if it failed before the
    /// batch; with `one_lane`, one for that engine and none for the others) and the
    /// widest pull of the batch's (cipher, direction) pairs it runs.
    fn engine_metas(
        &self,
        support: &[Support],
        failed_before: &[bool],
        one_lane: Option<usize>,
    ) -> Vec<EngineMeta> {
        self.engines
            .iter()
            .enumerate()
            .map(|(i, e)| EngineMeta {
                name: e.name().to_string(),
                kind: self.kinds[i],
                lanes: match one_lane {
                    _ if failed_before[i] => 0,
                    None => e.lanes(),
                    Some(only) => usize::from(only == i).min(e.lanes()),
                },
                max_batch: support
                    .iter()
                    .filter(|s| s.engines.contains(i))
                    .map(|s| s.widths[i])
                    .max()
                    .unwrap_or(1),
                uses_host_cpu: e.uses_host_cpu(),
            })
            .collect()
    }

    /// [`Dispatcher::run_in_place_in_line`] on the in-line engine `engine`'s first
    /// lane, if that lane runs every job in place and every job is runnable: `None`
    /// (and `spare` untouched) otherwise, for the usual path to run the batch.
    fn run_in_place_on(
        &self,
        engine: usize,
        jobs: &mut [Job],
        policy: &dyn Policy,
        spare: &mut Vec<JobOutput>,
    ) -> Result<Option<BatchResult>> {
        let _batch = self.batch_gate.read().unwrap_or_else(|e| e.into_inner());
        let cached = lock(&self.lanes)[engine][0].take();
        let mut lane = match cached {
            Some(lane) => lane,
            // A lane that does not open is the usual path's to report.
            None => match self.engines[engine].open_lane(0) {
                Ok(lane) => lane,
                Err(_) => return Ok(None),
            },
        };
        let result = self.run_in_place_with(&mut *lane, engine, jobs, policy, spare);
        // An in-place job fails no engine (`Lane::run_in_place`): the lane stays.
        lock(&self.lanes)[engine][0] = Some(lane);
        result
    }

    /// The body of [`Dispatcher::run_in_place_on`], with the lane in hand.
    fn run_in_place_with(
        &self,
        lane: &mut dyn Lane,
        engine: usize,
        jobs: &mut [Job],
        policy: &dyn Policy,
        spare: &mut Vec<JobOutput>,
    ) -> Result<Option<BatchResult>> {
        if jobs.is_empty() || !jobs.iter().all(|j| lane.runs_in_place(j)) {
            return Ok(None);
        }
        let mut support: Vec<Support> = Vec::new();
        let mut alive = EngineMask::default();
        alive.insert(engine);
        let Planned {
            metas,
            unrunnable,
            bytes,
        } = self.plan_jobs(jobs, alive, &mut support);
        if !unrunnable.is_empty() {
            return Ok(None);
        }
        let failed_before = vec![false; self.engines.len()];
        let Scheduled {
            engine_metas,
            lane_metas,
            schedule,
        } = self.schedule(policy, &metas, &support, &failed_before, Some(engine))?;
        let mut outputs: Vec<Result<JobOutput>> = spare.drain(..).map(Ok).collect();
        outputs.truncate(jobs.len());
        outputs.resize_with(jobs.len(), || Ok(JobOutput::default()));
        let mut ran = vec![false; jobs.len()];
        let timing = schedule.wants_timing();
        let max = engine_metas[engine].max_batch.max(1);
        let mut picked: Vec<usize> = Vec::with_capacity(max);
        let mut report = LaneReport {
            lane: 0,
            started: true,
            ..LaneReport::default()
        };
        let (start, cpu_start) = (Instant::now(), thread_cpu_time());
        loop {
            picked.clear();
            let more = schedule.next(0, max, &mut picked);
            let pull = timing.then(|| (Instant::now(), thread_cpu_time()));
            for &j in &picked {
                if std::mem::replace(&mut ran[j], true) {
                    continue;
                }
                let len = jobs[j].len() as u64;
                let slot = &mut outputs[j];
                // The slot's spare buffer, if it holds one, becomes the job's input.
                let mut out: JobOutput =
                    std::mem::replace(slot, Ok(JobOutput::default())).unwrap_or_default();
                *slot = lane
                    .run_in_place(&mut jobs[j], &self.keys, &mut out)
                    .map(|()| out);
                report.jobs += 1;
                report.bytes += len;
            }
            if let Some((at, cpu)) = pull {
                let cpu_used = thread_cpu_time().saturating_sub(cpu);
                schedule.completed(0, &picked, at.elapsed(), cpu_used);
            }
            if !more {
                break;
            }
        }
        let wall = start.elapsed();
        report.busy = wall;
        report.cpu = thread_cpu_time().saturating_sub(cpu_start);
        for (j, _) in ran.iter().enumerate().filter(|(_, &r)| !r) {
            outputs[j] = Err(Error::Policy {
                policy: policy.name(),
                reason: format!("no lane was given this {} job", metas[j].cipher),
            });
        }
        let report = self.report(Tally {
            policy,
            jobs: jobs.len(),
            bytes,
            wall,
            failed: vec![None; self.engines.len()],
            lanes: lane_metas.iter().zip([report]),
            redispatched: 0,
            outputs: &outputs,
        });
        Ok(Some(BatchResult { outputs, report }))
    }

    /// Every job's [`JobMeta`] for the policy, the jobs no working engine can run (with
    /// their error), and the batch's bytes; `support` gains the batch's new (cipher,
    /// direction) pairs. A function of its own, not inlined into `run_into`: in its
    /// loop the compiler kept the per-job state in memory, not in registers (its
    /// stores were a fifth of the caller's share of a 16-byte CTR job).
    #[inline(never)]
    fn plan_jobs(&self, jobs: &[Job], alive: EngineMask, support: &mut Vec<Support>) -> Planned {
        let mut unrunnable: Vec<(usize, Result<JobOutput>)> = Vec::new();
        let mut bytes = 0u64;
        // The last key found registered: runs of jobs share a key, so the store is
        // asked once per run. A removed key's contexts may still sit in a lane's cache;
        // its jobs must fail all the same.
        let mut known_key: Option<KeyId> = None;
        // The last pair seen, its index in `support` and, where no engine limits its
        // job size, the engines that run it at any size: runs of jobs share a pair
        // too, so the list is searched once per run (the search per job was a tenth
        // of a 16-byte CTR job's planning) and most jobs need no size check.
        let mut last_pair: Option<((Cipher, Direction), usize, Option<EngineMask>)> = None;
        let mut metas: Vec<JobMeta> = Vec::with_capacity(jobs.len());
        let mut i = 0;
        while i < jobs.len() {
            let job = &jobs[i];
            let pair = (job.cipher, job.direction);
            let (k, any_size) = match last_pair {
                Some((seen, k, any_size)) if seen == pair => (k, any_size),
                _ => {
                    let k = match support.iter().position(|s| s.pair == pair) {
                        Some(k) => k,
                        None => {
                            support.push(Support::of(&self.engines, pair));
                            support.len() - 1
                        }
                    };
                    let known = &support[k];
                    let any_size = known.limits.is_empty().then_some(known.engines);
                    last_pair = Some((pair, k, any_size));
                    (k, any_size)
                }
            };
            let len = job.len();
            bytes += len as u64;
            let engines = match any_size {
                Some(engines) => engines,
                None => support[k].for_len(len + job.aad.len()),
            };
            if known_key != Some(job.key) {
                if self.keys.contains(job.key) {
                    known_key = Some(job.key);
                } else {
                    unrunnable.push((i, Err(Error::UnknownKey(job.key.0))));
                    metas.push(JobMeta {
                        len,
                        cipher: job.cipher,
                        direction: job.direction,
                        engines: EngineMask::default(),
                    });
                    i += 1;
                    continue;
                }
            }
            let runnable = !engines.intersect(alive).is_empty();
            if !runnable {
                let error = support[k]
                    .too_large(job, &self.engines, alive)
                    .unwrap_or(Error::NoEngine { cipher: job.cipher });
                unrunnable.push((i, Err(error)));
            }
            metas.push(JobMeta {
                len,
                cipher: job.cipher,
                direction: job.direction,
                engines,
            });
            i += 1;
            // The jobs after it of the same pair and key, whatever their size (the
            // common batch): the same engines, nothing to look up, a tight loop.
            if any_size.is_some() && runnable {
                let (cipher, direction, key) = (job.cipher, job.direction, job.key);
                for next in &jobs[i..] {
                    if next.cipher != cipher || next.direction != direction || next.key != key {
                        break;
                    }
                    let len = next.len();
                    bytes += len as u64;
                    metas.push(JobMeta {
                        len,
                        cipher,
                        direction,
                        engines,
                    });
                    i += 1;
                }
            }
        }
        Planned {
            metas,
            unrunnable,
            bytes,
        }
    }
}

/// A batch's schedule and what the policy was shown: see [`Dispatcher::schedule`].
struct Scheduled {
    engine_metas: Vec<EngineMeta>,
    lane_metas: Vec<LaneMeta>,
    schedule: Box<dyn Schedule>,
}

/// What a batch's [`Report`] is made from (see [`Dispatcher::report`]): `lanes` pairs
/// each lane that took part with its report; `failed` is each engine's failure.
struct Tally<'a, L> {
    policy: &'a dyn Policy,
    jobs: usize,
    bytes: u64,
    wall: Duration,
    failed: Vec<Option<String>>,
    lanes: L,
    redispatched: usize,
    outputs: &'a [Result<JobOutput>],
}

/// What planning a batch gives: see [`Dispatcher::plan_jobs`].
struct Planned {
    metas: Vec<JobMeta>,
    unrunnable: Vec<(usize, Result<JobOutput>)>,
    bytes: u64,
}

/// Which engines run one (cipher, direction), and the size limits some declare.
struct Support {
    pair: (Cipher, Direction),
    /// Engines that support the pair, whatever the job size.
    engines: EngineMask,
    /// Engines among them with a largest job (input plus AAD, bytes), by index.
    limits: Vec<(usize, usize)>,
    /// Per engine: how many jobs of the pair a lane takes in one pull (1 to its
    /// `max_batch`; 1 where it does not support the pair).
    widths: Vec<usize>,
}

impl Support {
    /// Asks every engine once.
    fn of(engines: &[EngineRef], pair: (Cipher, Direction)) -> Self {
        let mut mask = EngineMask::default();
        let mut limits = Vec::new();
        let mut widths = vec![1; engines.len()];
        for (i, e) in engines.iter().enumerate() {
            if e.supports(pair.0, pair.1) {
                mask.insert(i);
                if let Some(max) = e.max_job_len(pair.0, pair.1) {
                    limits.push((i, max));
                }
                widths[i] = e.batch_width(pair.0, pair.1).clamp(1, e.max_batch().max(1));
            }
        }
        Support {
            pair,
            engines: mask,
            limits,
            widths,
        }
    }

    /// The engines that can run a job of `len` bytes (input plus AAD).
    fn for_len(&self, len: usize) -> EngineMask {
        let mut mask = self.engines;
        for &(e, max) in &self.limits {
            if len > max {
                mask.0 &= !(1u64 << e);
            }
        }
        mask
    }

    /// The error for `job` being above the size limit of engines of `among` that
    /// support its cipher: it names the one that takes the largest jobs. `None` if the
    /// job is within every such limit.
    fn too_large(&self, job: &Job, engines: &[EngineRef], among: EngineMask) -> Option<Error> {
        let len = job.input.len() + job.aad.len();
        let (engine, max) = self
            .limits
            .iter()
            .filter(|&&(e, max)| among.contains(e) && len > max)
            .max_by_key(|&&(_, max)| max)?;
        Some(Error::TooLarge {
            cipher: job.cipher,
            engine: engines[*engine].name().to_string(),
            len,
            max: *max,
        })
    }
}

/// Coordination state behind one lock: the re-dispatch queue and who is still working.
struct Coord {
    /// Jobs taken back from a failed engine, waiting for a lane that can run them.
    retry: VecDeque<usize>,
    /// Lanes that are neither idle-waiting nor gone.
    running: usize,
    /// The batch is over: every lane leaves.
    done: bool,
    /// Lane threads that have ended (counted only while some lanes are deferred: the
    /// batch's thread waits on it to know whether it may still have to start them).
    exited: usize,
    /// A lane asked for the deferred lanes (an engine failed; its jobs may need them).
    start_deferred: bool,
}

/// Counts a lane thread's end, however it ends (a panic included), and wakes the
/// batch's thread, which may be waiting to start deferred lanes (only then: the
/// wake-up is a system call per lane and batch).
struct LaneExit<'s, 'a>(&'s Shared<'a>);

impl Drop for LaneExit<'_, '_> {
    fn drop(&mut self) {
        if self.0.deferred > 0 {
            lock(&self.0.coord).exited += 1;
            self.0.wake.notify_all();
        }
    }
}

/// What the lane threads of one batch share.
struct Shared<'a> {
    jobs: &'a [Job],
    /// Per (cipher, direction) of the batch, per engine: jobs a lane takes in one pull.
    widths: &'a [((Cipher, Direction), Vec<usize>)],
    metas: &'a [JobMeta],
    schedule: &'a dyn Schedule,
    keys: &'a KeyStore,
    /// Lanes started with the batch.
    lane_count: usize,
    /// Lanes of engines the schedule did not need, not started unless an engine fails.
    deferred: usize,
    /// Where every lane thread waits for the others before taking work, so the
    /// threads spawned first do not empty a short batch's queue before the last
    /// ones exist (that would skew who-did-what, the seeds' Table 3).
    start: Barrier,
    /// Jobs without a result yet.
    remaining: AtomicUsize,
    /// Results made outside a lane's loop (jobs no working engine can run any more).
    late: Mutex<Vec<(usize, Result<JobOutput>)>>,
    /// Output buffers to write into before allocating new ones; lanes take them a
    /// handful at a time.
    spare: Mutex<Vec<JobOutput>>,
    /// Engines that had not failed when the batch began; a job none of them can run
    /// gets its error before the lanes start and is never re-dispatched.
    alive_at_start: EngineMask,
    /// Per engine: quarantined (failed now or in an earlier batch).
    quarantined: Vec<AtomicBool>,
    /// Per engine: why it failed in this batch.
    reasons: Mutex<Vec<Option<String>>>,
    coord: Mutex<Coord>,
    /// Where lanes (and the batch's thread, while lanes are deferred) wait; woken
    /// through [`Shared::wake_all`].
    wake: Condvar,
    /// The batch runs on one thread, the in-line lane's: nobody ever waits on
    /// `wake`, so nothing is woken (a wake-up is a system call, several per batch).
    alone: bool,
    /// Length of `coord.retry`, readable without the lock on the hot path.
    retry_len: AtomicUsize,
    redispatched: AtomicUsize,
    /// Jobs an engine refused as busy (a device out of sessions: `Error::EngineBusy`),
    /// with the engines that refused each: they go to the others, and the refusing
    /// engine, which stays in service, is not offered them again.
    refused: Mutex<Vec<(usize, EngineMask)>>,
    /// Whether `refused` holds anything (the hot path reads no lock).
    any_refused: AtomicBool,
}

/// Results by job index, as a lane collects them.
type ResultList = Vec<(usize, Result<JobOutput>)>;

/// What a lane thread hands back when the batch ends.
struct LaneEnd {
    report: LaneReport,
    /// The lane, to keep for the next batch (none if it could not be opened).
    lane: Option<Box<dyn Lane>>,
    /// The results of the jobs it ran, by job index.
    done: ResultList,
    /// Whether `done` is in job order (true unless it ran re-dispatched jobs or a
    /// policy handed jobs out of order).
    ascending: bool,
}

/// Where a lane leaves its results.
enum Sink<'s> {
    /// The batch's own output slots, one per job in job order: the lane runs in-line,
    /// alone. Each slot holds a spare buffer (the caller's previous outputs) that the
    /// lane writes in place ([`Lane::run_slots`]) or, where it refuses a pull, that is
    /// swapped in before the pull and back, with its result, after; what the lane
    /// records per pull is the run of jobs it did, not a result per job.
    Slots {
        outputs: &'s mut [Result<JobOutput>],
        /// The runs of jobs whose slot holds their result, in the order they ran.
        done: &'s mut Vec<Range<usize>>,
    },
    /// A lane thread's own list of (job, result), merged in job order after the join.
    List {
        done: ResultList,
        /// Whether `done` is in job order so far.
        ascending: bool,
    },
}

impl Sink<'_> {
    /// A list with room for an even share of the batch among `lanes`, so a lane
    /// rarely grows it.
    fn list(jobs: usize, lanes: usize) -> Self {
        let share = jobs / lanes.max(1) + MAX_PULL_SLACK;
        Sink::List {
            done: Vec::with_capacity(share.min(jobs)),
            ascending: true,
        }
    }

    /// Before a pull: gives `outs[k]` the spare buffer in job `picked[k]`'s slot.
    fn lend(&mut self, picked: &[usize], outs: &mut [JobOutput]) {
        if let Sink::Slots { outputs, .. } = self {
            for (out, &j) in outs.iter_mut().zip(picked) {
                match &mut outputs[j] {
                    Ok(spare) => std::mem::swap(out, spare),
                    // A previous batch's error: no buffer to lend.
                    slot => *slot = Ok(JobOutput::default()),
                }
            }
        }
    }

    /// Keeps the results of one pull: job `picked[k]` ended with `results[k]` and its
    /// output in `outs[k]`; the jobs of `in_hand` have no result (their engine failed:
    /// they run elsewhere). Leaves `results` all `Ok`.
    fn keep(
        &mut self,
        picked: &[usize],
        outs: &mut [JobOutput],
        results: &mut [Result<()>],
        in_hand: &[usize],
    ) {
        let handed_back = |j: usize| !in_hand.is_empty() && in_hand.contains(&j);
        match self {
            Sink::Slots { outputs, done } => {
                for (k, &j) in picked.iter().enumerate() {
                    match std::mem::replace(&mut results[k], Ok(())) {
                        // The buffer goes back to the slot, with the output in it.
                        Ok(()) => {
                            if let Ok(slot) = &mut outputs[j] {
                                std::mem::swap(slot, &mut outs[k]);
                            }
                        }
                        // The lane keeps the buffer for its next pull.
                        Err(e) => outputs[j] = Err(e),
                    }
                }
                if in_hand.is_empty() && is_run(picked) {
                    add_run(done, picked[0]..picked[0] + picked.len());
                } else {
                    for &j in picked.iter().filter(|&&j| !handed_back(j)) {
                        add_run(done, j..j + 1);
                    }
                }
            }
            Sink::List { done, ascending } => {
                for (k, &j) in picked.iter().enumerate() {
                    let result = std::mem::replace(&mut results[k], Ok(()));
                    if handed_back(j) {
                        continue;
                    }
                    let out = std::mem::take(&mut outs[k]);
                    *ascending &= done.last().is_none_or(|&(last, _)| last < j);
                    done.push((j, result.map(|()| out)));
                }
            }
        }
    }

    /// What the lane hands back at the end of the batch.
    fn end(self, report: LaneReport, lane: Option<Box<dyn Lane>>) -> LaneEnd {
        let (done, ascending) = match self {
            Sink::Slots { .. } => (Vec::new(), true),
            Sink::List { done, ascending } => (done, ascending),
        };
        LaneEnd {
            report,
            lane,
            done,
            ascending,
        }
    }
}

/// Records that the slots of `run` hold their jobs' results, merged with the last run
/// recorded where they meet.
fn add_run(done: &mut Vec<Range<usize>>, run: Range<usize>) {
    match done.last_mut() {
        Some(last) if last.end == run.start => last.end = run.end,
        _ => done.push(run),
    }
}

/// Completes the outputs of a batch whose lane ran in-line: the slots of the jobs in
/// `done` hold their result already; every other slot takes its result from `lists`
/// (jobs that ended outside the lane) or `missing`. Returns how many results were
/// surplus (a job completed twice: a bug, counted, not kept). Costs per run of jobs
/// and per job outside them, not per job the lane ran.
fn fill_gaps(
    outputs: &mut [Result<JobOutput>],
    mut done: Vec<Range<usize>>,
    lists: Vec<ResultList>,
    mut missing: impl FnMut(usize) -> Result<JobOutput>,
) -> usize {
    done.sort_unstable_by_key(|r| r.start);
    let mut others: ResultList = lists.into_iter().flatten().collect();
    others.sort_by_key(|&(j, _)| j);
    let mut others = others.into_iter().peekable();
    let mut duplicates = 0;
    let n = outputs.len();
    let mut j = 0usize;
    let mut fill_to = |end: usize, j: &mut usize, duplicates: &mut usize| {
        while *j < end {
            // Entries below `j` fell inside a run of the lane's: surplus.
            while others.next_if(|&(i, _)| i < *j).is_some() {
                *duplicates += 1;
            }
            outputs[*j] = match others.next_if(|&(i, _)| i == *j) {
                Some((_, result)) => result,
                None => missing(*j),
            };
            *j += 1;
        }
    };
    for run in done {
        duplicates += j.saturating_sub(run.start).min(run.len());
        fill_to(run.start, &mut j, &mut duplicates);
        j = j.max(run.end);
    }
    fill_to(n, &mut j, &mut duplicates);
    duplicates + others.count()
}

/// Whether `jobs` are consecutive job indices, ascending.
fn is_run(jobs: &[usize]) -> bool {
    jobs.windows(2).all(|w| w[1] == w[0] + 1)
}

/// Per-job results from several lists of (job index, result) into `outputs` (cleared
/// first), in job order; `missing` makes the result of a job no list has. Returns how
/// many results were surplus (a job completed twice: a bug, counted, not kept).
///
/// Lists in job order are merged in one pass — results move once, straight to their
/// place — which is what every list is in the common case (each lane takes jobs in
/// queue order); otherwise the results are scattered into slots first.
fn in_job_order(
    outputs: &mut Vec<Result<JobOutput>>,
    n: usize,
    lists: Vec<(ResultList, bool)>,
    mut missing: impl FnMut(usize) -> Result<JobOutput>,
) -> usize {
    outputs.clear();
    let mut duplicates = 0;
    if !lists.iter().all(|(_, ascending)| *ascending) {
        let mut slots: Vec<Option<Result<JobOutput>>> = (0..n).map(|_| None).collect();
        for (j, result) in lists.into_iter().flat_map(|(list, _)| list) {
            if slots[j].replace(result).is_some() {
                duplicates += 1;
            }
        }
        outputs.extend(
            slots
                .into_iter()
                .enumerate()
                .map(|(j, slot)| slot.unwrap_or_else(|| missing(j))),
        );
        return duplicates;
    }
    let mut heads: Vec<_> = lists
        .into_iter()
        .map(|(list, _)| list.into_iter().peekable())
        .collect();
    outputs.reserve(n);
    // The list that gave the last result: lanes take runs of consecutive jobs, so it
    // usually has the next one too.
    let mut current = 0;
    for j in 0..n {
        let is_j = |&(i, _): &(usize, _)| i == j;
        if let Some((_, result)) = heads.get_mut(current).and_then(|h| h.next_if(is_j)) {
            outputs.push(result);
            continue;
        }
        let mut found = None;
        for (l, h) in heads.iter_mut().enumerate() {
            // Entries below `j` were already served by another list: surplus.
            while h.next_if(|&(i, _)| i < j).is_some() {
                duplicates += 1;
            }
            if let Some((_, result)) = h.next_if(is_j) {
                current = l;
                found = Some(result);
                break;
            }
        }
        outputs.push(found.unwrap_or_else(|| missing(j)));
    }
    duplicates + heads.iter_mut().map(|h| h.count()).sum::<usize>()
}

impl Shared<'_> {
    /// Wakes every thread waiting on `wake`, unless the batch has no other thread.
    fn wake_all(&self) {
        if !self.alone {
            self.wake.notify_all();
        }
    }

    /// The engines still able to run job `job`.
    fn alive_engines(&self, job: usize) -> EngineMask {
        let mut mask = self.metas[job].engines;
        for (e, q) in self.quarantined.iter().enumerate() {
            if q.load(Ordering::Acquire) {
                mask.0 &= !(1u64 << e);
            }
        }
        mask.0 &= !self.refused_by(job).0;
        mask
    }

    /// The engines that refused `job` as busy in this batch.
    fn refused_by(&self, job: usize) -> EngineMask {
        if !self.any_refused.load(Ordering::Acquire) {
            return EngineMask(0);
        }
        let refused = lock(&self.refused);
        EngineMask(
            refused
                .iter()
                .filter(|&&(j, _)| j == job)
                .fold(0, |m, (_, e)| m | e.0),
        )
    }

    /// `engine` refused `jobs` as busy: each goes to another working engine that can
    /// run it, and never back to `engine` in this batch. Returns the jobs no other
    /// engine can take: they keep the busy error as their result.
    fn refuse(&self, engine: usize, jobs: &[usize]) -> Vec<usize> {
        let (elsewhere, stuck): (Vec<usize>, Vec<usize>) = jobs.iter().partition(|&&j| {
            let mut others = self.alive_engines(j);
            others.0 &= !(1u64 << engine);
            !others.is_empty()
        });
        if !elsewhere.is_empty() {
            lock(&self.refused).extend(elsewhere.iter().map(|&j| (j, EngineMask(1 << engine))));
            self.any_refused.store(true, Ordering::Release);
            self.start_deferred();
            self.redispatch(elsewhere);
        }
        stuck
    }

    /// Stores the result of a job that ends outside a lane's loop.
    fn finish(&self, job: usize, result: Result<JobOutput>) {
        lock(&self.late).push((job, result));
        self.completed(1);
    }

    /// Counts `n` more jobs done; the last ones end the batch. Lanes call this once
    /// per pull, not per job, so a batch of small jobs does not bounce the counter's
    /// cache line between cores for every job.
    fn completed(&self, n: usize) {
        if n > 0 && self.remaining.fetch_sub(n, Ordering::AcqRel) == n {
            lock(&self.coord).done = true;
            self.wake_all();
        }
    }

    /// Quarantines `engine` and re-dispatches `in_hand` (the jobs its lane held) and
    /// every job the schedule had reserved for it.
    fn quarantine(&self, engine: usize, reason: String, in_hand: &[usize]) {
        let mut jobs = in_hand.to_vec();
        if !self.quarantined[engine].swap(true, Ordering::AcqRel) {
            lock(&self.reasons)[engine] = Some(reason);
            jobs.extend(self.schedule.engine_failed(engine));
        }
        self.start_deferred();
        self.redispatch(jobs);
    }

    /// Has the batch's thread start the deferred lanes (once): an engine failed, and
    /// its jobs may have nowhere else to go. They count as running from now, so no
    /// idle lane ends the batch before they take the re-dispatched jobs.
    fn start_deferred(&self) {
        let mut coord = lock(&self.coord);
        if self.deferred > 0 && !coord.start_deferred {
            coord.start_deferred = true;
            coord.running += self.deferred;
            drop(coord);
            self.wake_all();
        }
    }

    /// Takes back the jobs the schedule reserved for `engine`, quarantined before the
    /// batch began, and re-dispatches them.
    fn requeue(&self, engine: usize) {
        let mut jobs = self.schedule.engine_failed(engine);
        // Jobs no working engine can run already ended with NoEngine before the
        // lanes started; they must not be ended twice.
        jobs.retain(|&j| !self.alive_engines(j).is_empty());
        self.redispatch(jobs);
    }

    /// Puts `jobs` on the re-dispatch queue for any working engine that can run them;
    /// those no working engine can run end with an error.
    fn redispatch(&self, mut jobs: Vec<usize>) {
        // A job that had no working engine from the start already has its result
        // (a policy may still have reserved it for a quarantined engine).
        jobs.retain(|&j| {
            !self.metas[j]
                .engines
                .intersect(self.alive_at_start)
                .is_empty()
        });
        if jobs.is_empty() {
            return;
        }
        self.redispatched.fetch_add(jobs.len(), Ordering::Relaxed);
        let mut orphans = Vec::new();
        {
            let mut coord = lock(&self.coord);
            coord.retry.extend(jobs);
            // Jobs that no working engine can run any more end here, with an error.
            coord.retry.retain(|&j| {
                let keep = !self.alive_engines(j).is_empty();
                if !keep {
                    orphans.push(j);
                }
                keep
            });
            self.retry_len.store(coord.retry.len(), Ordering::Release);
        }
        self.wake_all();
        for j in orphans {
            self.finish(
                j,
                Err(Error::NoEngine {
                    cipher: self.metas[j].cipher,
                }),
            );
        }
    }

    /// The pull width of `engine` for the (cipher, direction) of job `job` (a search
    /// of the batch's few pairs per pull, not a class stored per job).
    fn width_after(&self, job: usize, engine: usize) -> Option<usize> {
        let meta = &self.metas[job];
        let pair = (meta.cipher, meta.direction);
        self.widths
            .iter()
            .find(|(p, _)| *p == pair)
            .map(|(_, w)| w[engine])
    }

    /// Moves up to `n` spare output buffers into `out` (none once the pool is empty).
    fn take_spare(&self, n: usize, out: &mut Vec<JobOutput>) {
        let mut pool = lock(&self.spare);
        let keep = pool.len().saturating_sub(n);
        out.extend(pool.drain(keep..));
    }

    /// Moves up to `max` re-dispatched jobs that `engine` can run into `out`.
    fn take_retry(&self, coord: &mut Coord, engine: usize, max: usize, out: &mut Vec<usize>) {
        let mut i = 0;
        while i < coord.retry.len() && out.len() < max {
            let job = coord.retry[i];
            if self.metas[job].engines.contains(engine) && !self.refused_by(job).contains(engine) {
                out.extend(coord.retry.remove(i));
            } else {
                i += 1;
            }
        }
        self.retry_len.store(coord.retry.len(), Ordering::Release);
    }

    /// The policy has nothing more for this lane: wait for re-dispatched work or the
    /// end of the batch. Returns false when the lane should leave.
    fn idle(&self, engine: usize, max: usize, out: &mut Vec<usize>) -> bool {
        let mut coord = lock(&self.coord);
        coord.running -= 1;
        loop {
            if coord.done || self.quarantined[engine].load(Ordering::Acquire) {
                self.wake_all();
                return false;
            }
            self.take_retry(&mut coord, engine, max, out);
            if !out.is_empty() {
                coord.running += 1;
                return true;
            }
            if coord.running == 0 && coord.retry.is_empty() {
                // Nobody is working and nothing is waiting: whatever has no result now
                // was given to no lane; the batch is over.
                coord.done = true;
                self.wake_all();
                return false;
            }
            coord = self.wake.wait(coord).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// One lane's life during a batch. Its results go to `sink`: the batch's output
    /// slots for the lane that runs in-line, a list of its own for a lane thread.
    fn lane_loop(
        &self,
        lane_idx: usize,
        meta: LaneMeta,
        engine: &EngineRef,
        opened: Option<Box<dyn Lane>>,
        at_start: bool,
        mut sink: Sink<'_>,
    ) -> LaneEnd {
        // First thing, before anything that could panic and leave the others waiting
        // (alone, there are no others: the barrier's wake-up is a system call).
        if at_start && !self.alone {
            self.start.wait();
        }
        let cpu_start = thread_cpu_time();
        let mut report = LaneReport {
            lane: meta.index,
            started: true,
            ..LaneReport::default()
        };
        let mut lane = match opened {
            Some(lane) => lane,
            None => match engine.open_lane(meta.index) {
                Ok(lane) => lane,
                Err(e) => {
                    self.quarantine(meta.engine, e.to_string(), &[]);
                    self.idle_exit();
                    report.cpu = thread_cpu_time().saturating_sub(cpu_start);
                    return sink.end(report, None);
                }
            },
        };
        // Room for the widest pull any class may ask; each pull then asks for as many
        // jobs as the class of the job this lane took last wants (the queue hands out
        // jobs in order, so the next is most likely of the same class), starting from
        // the widest class of the batch this engine runs.
        let cap = engine.max_batch().max(1);
        let mut max = self
            .widths
            .iter()
            .map(|(_, w)| w[meta.engine])
            .max()
            .unwrap_or(1)
            .min(cap);
        let timing = self.schedule.wants_timing();
        // A lane thread times each pull (it may wait between pulls: for work, for its
        // share of a core); the in-line lane, alone on the batch's thread, is busy
        // from start to end, so it reads no clock per pull (two reads per pull were a
        // tenth of a pull of sixteen 16-byte jobs) unless the policy wants timings.
        let per_pull = timing || matches!(sink, Sink::List { .. });
        let lane_start = Instant::now();
        let mut picked: Vec<usize> = Vec::with_capacity(cap);
        let mut outs: Vec<JobOutput> = vec![JobOutput::default(); cap];
        // Spare output buffers this lane took from the shared pool.
        let mut spare: Vec<JobOutput> = Vec::new();
        let mut spare_left = matches!(sink, Sink::List { .. });
        let mut results: Vec<Result<()>> = (0..cap).map(|_| Ok(())).collect();
        let mut refs: Vec<&Job> = Vec::with_capacity(cap);
        let mut in_hand: Vec<usize> = Vec::new();
        // Jobs of the pull the engine refused as busy: (position in the pull, job).
        let mut busy: Vec<(usize, usize)> = Vec::new();
        let mut policy_done = false;
        loop {
            if self.quarantined[meta.engine].load(Ordering::Acquire) {
                self.idle_exit();
                break;
            }
            picked.clear();
            if self.retry_len.load(Ordering::Acquire) > 0 {
                self.take_retry(&mut lock(&self.coord), meta.engine, max, &mut picked);
            }
            if picked.is_empty() && !policy_done {
                policy_done = !self.schedule.next(lane_idx, max, &mut picked);
            }
            if picked.is_empty() {
                if policy_done && !self.idle(meta.engine, max, &mut picked) {
                    break;
                }
                if picked.is_empty() {
                    continue;
                }
            }
            let n = picked.len();
            if let Some(&last) = picked.last() {
                max = self.width_after(last, meta.engine).unwrap_or(max).min(cap);
            }
            let started = per_pull.then(Instant::now);
            let cpu_before = if timing {
                thread_cpu_time()
            } else {
                Duration::ZERO
            };
            // The in-line lane given consecutive jobs (what a queue hands out) may write
            // their results straight into their slots: no output moves out of its slot
            // and back (a quarter of a 16-byte CTR job's time was that move).
            let direct = match &mut sink {
                Sink::Slots { outputs, .. } if is_run(&picked) => {
                    let run = picked[0]..picked[0] + n;
                    lane.run_slots(&self.jobs[run.clone()], self.keys, &mut outputs[run])
                }
                _ => false,
            };
            if !direct {
                refs.clear();
                refs.extend(picked.iter().map(|&j| &self.jobs[j]));
                match &mut sink {
                    Sink::Slots { .. } => sink.lend(&picked, &mut outs[..n]),
                    Sink::List { .. } => {
                        if spare_left {
                            spare_left = self.fill_spares(&mut outs[..n], &mut spare);
                        }
                    }
                }
                if n == 1 {
                    results[0] = lane.run(refs[0], self.keys, &mut outs[0]);
                } else {
                    lane.run_batch(&refs, self.keys, &mut outs[..n], &mut results[..n]);
                }
            }
            let elapsed = started.map_or(Duration::ZERO, |t| t.elapsed());
            report.busy += elapsed;

            if direct {
                // Every job ended (job errors are in their slots; a lane hands none
                // back this way).
                let run = picked[0]..picked[0] + n;
                report.jobs += n;
                report.bytes += self.jobs[run.clone()]
                    .iter()
                    .map(|j| j.len() as u64)
                    .sum::<u64>();
                if let Sink::Slots { done, .. } = &mut sink {
                    add_run(done, run);
                }
                self.completed(n);
                if timing {
                    let cpu = thread_cpu_time().saturating_sub(cpu_before);
                    self.schedule.completed(lane_idx, &picked, elapsed, cpu);
                }
                continue;
            }

            // The common case, every job done (successfully or with a job error), is
            // handled per pull; an engine failure job by job.
            let mut failure: Option<String> = None;
            in_hand.clear();
            busy.clear();
            for (k, &j) in picked.iter().enumerate() {
                if matches!(&results[k], Err(e) if e.is_engine_failure()) {
                    if let Err(e) = std::mem::replace(&mut results[k], Ok(())) {
                        failure.get_or_insert_with(|| e.to_string());
                    }
                    in_hand.push(j);
                } else if matches!(&results[k], Err(Error::EngineBusy { .. })) {
                    busy.push((k, j));
                } else {
                    report.bytes += self.jobs[j].len() as u64;
                }
            }
            if !busy.is_empty() && failure.is_none() {
                // Busy jobs that another engine can run leave this lane's hands; the
                // rest end with the busy error like any job error.
                let jobs: Vec<usize> = busy.iter().map(|&(_, j)| j).collect();
                let stuck = self.refuse(meta.engine, &jobs);
                for &(k, j) in &busy {
                    if stuck.contains(&j) {
                        report.bytes += self.jobs[j].len() as u64;
                    } else {
                        results[k] = Ok(());
                        in_hand.push(j);
                    }
                }
            } else {
                // With the engine failing too, busy jobs go with its others.
                for &(k, j) in &busy {
                    results[k] = Ok(());
                    in_hand.push(j);
                }
            }
            let finished = n - in_hand.len();
            report.jobs += finished;
            sink.keep(&picked, &mut outs[..n], &mut results[..n], &in_hand);
            self.completed(finished);
            if let Some(reason) = failure {
                self.quarantine(meta.engine, reason, &in_hand);
                self.idle_exit();
                break;
            }
            if timing {
                let cpu = thread_cpu_time().saturating_sub(cpu_before);
                self.schedule.completed(lane_idx, &picked, elapsed, cpu);
            }
        }
        if !per_pull {
            report.busy = lane_start.elapsed();
        }
        report.cpu = thread_cpu_time().saturating_sub(cpu_start);
        sink.end(report, Some(lane))
    }

    /// Gives every empty output buffer in `outs` a spare one while the shared pool
    /// lasts, taking a few at a time into `spare`; returns false once it is empty.
    fn fill_spares(&self, outs: &mut [JobOutput], spare: &mut Vec<JobOutput>) -> bool {
        let take = outs.len() * SPARE_TAKE;
        for out in outs.iter_mut() {
            if out.data.capacity() > 0 {
                continue;
            }
            if spare.is_empty() {
                self.take_spare(take, spare);
            }
            let Some(buf) = spare.pop() else {
                return false;
            };
            *out = buf;
        }
        true
    }

    /// A lane leaves for good (its engine failed): it no longer counts as working.
    fn idle_exit(&self) {
        let mut coord = lock(&self.coord);
        coord.running -= 1;
        if coord.running == 0 && coord.retry.is_empty() {
            coord.done = true;
        }
        drop(coord);
        self.wake_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_s_cpu_time_grows_with_its_work() {
        let before = thread_cpu_time();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        assert!(thread_cpu_time() > before, "{x}");
    }

    /// Jobs of every mode for `key`, of mixed lengths.
    fn mixed_jobs(key: KeyId, n: usize) -> Vec<Job> {
        use crate::{Cipher, Direction};
        let ciphers = [
            Cipher::AES_128_CBC,
            Cipher::AES_128_CTR,
            Cipher::AES_128_GCM,
        ];
        (0..n)
            .map(|i| {
                let cipher = ciphers[i % ciphers.len()];
                let len = (i * 37 % 700) / 16 * 16;
                let iv = [i as u8; 16];
                Job::with_iv(
                    cipher,
                    Direction::Encrypt,
                    key,
                    &iv[..cipher.iv_len()],
                    vec![i as u8; len],
                )
                .unwrap()
            })
            .collect()
    }

    #[test]
    fn in_line_runs_one_lane_of_a_lone_cpu_engine_with_the_same_outputs() {
        use crate::engine::cpu::CpuEngine;
        let d = Dispatcher::new(vec![CpuEngine::with_lanes(2).into_engine()]).unwrap();
        assert!(d.runs_in_line());
        let key = d.add_key(crate::Key::new(vec![0x24; 16])).unwrap();
        let jobs = mixed_jobs(key, 300);
        let spread = d.run(&jobs, &crate::policy::Pull).unwrap();
        assert_eq!(spread.report.engines[0].lanes.len(), 2);
        let spare = vec![
            JobOutput {
                data: vec![0xa5; 999],
                tag: Some([1; 16])
            };
            40
        ];
        let here = d
            .run_reusing_in_line(&jobs, &crate::policy::Pull, spare)
            .unwrap();
        let lanes = &here.report.engines[0].lanes;
        assert_eq!(lanes.len(), 1, "in-line: one lane, on this thread");
        assert_eq!((lanes[0].jobs, here.report.engines[0].jobs), (300, 300));
        for (j, (a, b)) in spread.outputs.iter().zip(&here.outputs).enumerate() {
            assert_eq!(a.as_ref().unwrap(), b.as_ref().unwrap(), "job {j}");
        }
    }

    /// GCM jobs of 16 KiB and odd lengths, encrypting, for `key`, each input with
    /// room for its tag.
    fn gcm_jobs(key: KeyId, n: usize) -> Vec<Job> {
        use crate::{Cipher, Direction};
        (0..n)
            .map(|i| {
                let len = if i % 3 == 2 { i * 37 % 700 } else { 16 * 1024 };
                // With room for the tag, as the file pipeline reads chunks.
                let mut input = Vec::with_capacity(len + crate::TAG_LEN);
                input.extend((0..len).map(|b| (b * 7 + i) as u8));
                Job::with_iv(
                    Cipher::AES_128_GCM,
                    Direction::Encrypt,
                    key,
                    &[i as u8; 12],
                    input,
                )
                .unwrap()
                .aad(vec![i as u8; i % 5])
            })
            .collect()
    }

    #[test]
    fn in_place_seals_and_opens_in_the_inputs_own_buffers_with_the_same_outputs() {
        use crate::engine::cpu::{BlockParallel, CpuEngine};
        // `ring`'s GCM, whatever this CPU measures (EVP works on copies).
        let engine = CpuEngine::with_lanes(2).block_parallel(BlockParallel::On);
        let d = Dispatcher::new(vec![engine.into_engine()]).unwrap();
        let key = d.add_key(crate::Key::new(vec![0x26; 16])).unwrap();
        let mut jobs = gcm_jobs(key, 40);
        let copied = d.run(&jobs, &crate::policy::Pull).unwrap();
        let inputs: Vec<*const u8> = jobs.iter().map(|j| j.input.as_ptr()).collect();
        let spare = vec![JobOutput::default(); 10];
        let sealed = d
            .run_in_place_in_line(&mut jobs, &crate::policy::Pull, spare)
            .unwrap();
        assert_eq!(sealed.report.engines[0].lanes.len(), 1);
        assert_eq!(sealed.report.engines[0].jobs, 40);
        assert_eq!(sealed.report.bytes, copied.report.bytes);
        // The lane's own report: started, and the bytes it ran.
        let lane = &sealed.report.engines[0].lanes[0];
        assert!(lane.started);
        assert_eq!(lane.bytes, copied.report.bytes);
        for (j, (a, b)) in copied.outputs.iter().zip(&sealed.outputs).enumerate() {
            let b = b.as_ref().unwrap();
            assert_eq!(a.as_ref().unwrap(), b, "job {j}");
            // The output is the input's own buffer; the job holds a spare instead.
            if !b.data.is_empty() {
                assert_eq!(b.data.as_ptr(), inputs[j], "job {j} was copied");
            }
            assert!(jobs[j].input.is_empty() || jobs[j].input.as_ptr() != inputs[j]);
        }
        // Opening in place gives the plaintexts back; a bad tag gives no output.
        let mut opens: Vec<Job> = gcm_jobs(key, 40)
            .into_iter()
            .zip(&sealed.outputs)
            .map(|(job, out)| {
                let out = out.as_ref().unwrap();
                let tag = out.tag.unwrap();
                Job::with_iv(
                    job.cipher,
                    crate::Direction::Decrypt,
                    key,
                    job.iv(),
                    out.data.clone(),
                )
                .unwrap()
                .aad(job.aad.clone())
                .tag(tag)
            })
            .collect();
        opens[5].tag = Some([0; 16]);
        let opened = d
            .run_in_place_in_line(&mut opens, &crate::policy::Pull, Vec::new())
            .unwrap();
        for (j, (out, job)) in opened.outputs.iter().zip(gcm_jobs(key, 40)).enumerate() {
            match out {
                Ok(out) => assert_eq!(out.data, job.input, "job {j}"),
                Err(e) => assert!(j == 5 && matches!(e, Error::AuthenticationFailed), "{e}"),
            }
        }
        assert_eq!(opened.report.job_errors, 1);
    }

    #[test]
    fn in_place_falls_back_to_copies_where_the_lane_cannot_work_in_place() {
        use crate::engine::cpu::{BlockParallel, CpuEngine};
        for (engine, gcm) in [
            // EVP runs GCM here: no in-place path.
            (
                CpuEngine::with_lanes(2).block_parallel(BlockParallel::Off),
                true,
            ),
            // CTR and CBC jobs among GCM ones.
            (CpuEngine::with_lanes(2), false),
        ] {
            let d = Dispatcher::new(vec![engine.into_engine()]).unwrap();
            let key = d.add_key(crate::Key::new(vec![0x27; 16])).unwrap();
            let mut jobs = if gcm {
                gcm_jobs(key, 30)
            } else {
                mixed_jobs(key, 30)
            };
            let before = jobs.clone();
            let copied = d.run(&jobs, &crate::policy::Pull).unwrap();
            let ran = d
                .run_in_place_in_line(&mut jobs, &crate::policy::Pull, Vec::new())
                .unwrap();
            assert_eq!(jobs, before, "the jobs keep their inputs");
            assert_eq!(ran.report.engines[0].lanes.len(), 1);
            for (j, (a, b)) in copied.outputs.iter().zip(&ran.outputs).enumerate() {
                assert_eq!(a.as_ref().unwrap(), b.as_ref().unwrap(), "job {j}");
            }
        }
    }

    /// A dispatcher over two cpu engines, "a" and "b", of `lanes` lanes each, and the id
    /// of an AES-128 key of `byte`s in it.
    fn two_cpu_engines(lanes: [usize; 2], byte: u8) -> (Dispatcher, KeyId) {
        use crate::engine::cpu::CpuEngine;
        let d = Dispatcher::new(vec![
            CpuEngine::with_lanes(lanes[0]).named("a").into_engine(),
            CpuEngine::with_lanes(lanes[1]).named("b").into_engine(),
        ])
        .unwrap();
        let key = d.add_key(crate::Key::new(vec![byte; 16])).unwrap();
        (d, key)
    }

    #[test]
    fn in_line_keeps_every_lane_of_several_engines() {
        let (d, key) = two_cpu_engines([1, 2], 0x25);
        assert!(!d.runs_in_line());
        let jobs = mixed_jobs(key, 300);
        let ran = d
            .run_reusing_in_line(&jobs, &crate::policy::Pull, Vec::new())
            .unwrap();
        let lanes: Vec<usize> = ran.report.engines.iter().map(|e| e.lanes.len()).collect();
        assert_eq!(lanes, [1, 2]);
        assert!(ran.outputs.iter().all(Result::is_ok));
    }

    /// A batch's report adds each engine's work up from its lanes', and an engine the
    /// policy has no use for keeps its lanes unstarted, each reported under its own
    /// index with no work.
    #[test]
    fn a_report_sums_each_engine_from_its_lanes_and_names_unstarted_lanes() {
        let (d, key) = two_cpu_engines([2, 2], 0x26);
        let jobs = mixed_jobs(key, 200);
        let total: u64 = jobs.iter().map(|j| j.len() as u64).sum();
        for policy in [
            &crate::policy::Pull as &dyn Policy,
            &crate::policy::Only::new("a"),
        ] {
            let report = d.run(&jobs, policy).unwrap().report;
            assert_eq!(report.bytes, total, "{}", policy.name());
            let engines_bytes: u64 = report.engines.iter().map(|e| e.bytes).sum();
            assert_eq!(engines_bytes, total, "{}", policy.name());
            for e in &report.engines {
                let lanes = &e.lanes;
                assert_eq!(e.jobs, lanes.iter().map(|l| l.jobs).sum::<usize>());
                assert_eq!(e.bytes, lanes.iter().map(|l| l.bytes).sum::<u64>());
                assert_eq!(e.busy, lanes.iter().map(|l| l.busy).sum::<Duration>());
                let indices: Vec<usize> = lanes.iter().map(|l| l.lane).collect();
                assert_eq!(indices, [0, 1], "{} on {}", policy.name(), e.name);
                if policy.name() == "pull" {
                    assert!(lanes.iter().all(|l| l.started), "{}", e.name);
                }
            }
        }
        let only_a = d.run(&jobs, &crate::policy::Only::new("a")).unwrap().report;
        assert_eq!(only_a.engines[1].jobs, 0);
        assert!(only_a.engines[1].lanes.iter().all(|l| !l.started));
    }

    /// An engine that failed in an earlier batch is shown to the policy with no lanes
    /// (and so is given nothing), the others with all of theirs.
    #[test]
    fn the_policy_sees_an_engine_that_failed_before_with_no_lanes() {
        use crate::engine::cpu::CpuEngine;
        use crate::engine::fault::{Fault, FaultyEngine};
        /// `pull`, noting the lanes each engine was shown with.
        struct Shown(Mutex<Vec<usize>>);
        impl Policy for Shown {
            fn name(&self) -> String {
                "shown".into()
            }
            fn plan(&self, plan: &Plan<'_>) -> Result<Box<dyn Schedule>> {
                *lock(&self.0) = plan.engines.iter().map(|e| e.lanes).collect();
                crate::policy::Pull.plan(plan)
            }
        }
        let d = Dispatcher::new(vec![
            CpuEngine::with_lanes(1).named("a").into_engine(),
            FaultyEngine::new(
                "flaky",
                CpuEngine::with_lanes(2).into_engine(),
                Fault::AfterJobs(0),
            )
            .into_engine(),
        ])
        .unwrap();
        let key = d.add_key(crate::Key::new(vec![0x27; 16])).unwrap();
        let jobs = mixed_jobs(key, 50);
        let shown = Shown(Mutex::new(Vec::new()));
        // Before any failure: every lane shown. (Under `pull` the failing engine may
        // get no job before "a" has run them all, so this batch may or may not fail it.)
        d.run(&jobs, &shown).unwrap();
        assert_eq!(*lock(&shown.0), [1, 2]);
        // Every job offered to "flaky" first: its first job fails it, for certain.
        let first = d.run(&jobs, &crate::policy::Only::new("flaky")).unwrap();
        assert!(first.report.engines[1].failed.is_some());
        let second = d.run(&jobs, &shown).unwrap();
        assert_eq!(*lock(&shown.0), [1, 0]);
        assert!(second.outputs.iter().all(Result::is_ok));
    }

    /// A result that names its job, so the order can be checked.
    fn out(j: usize) -> Result<JobOutput> {
        Ok(JobOutput {
            data: j.to_le_bytes().to_vec(),
            tag: None,
        })
    }

    fn list(jobs: &[usize]) -> Vec<(usize, Result<JobOutput>)> {
        jobs.iter().map(|&j| (j, out(j))).collect()
    }

    fn order(outputs: &[Result<JobOutput>]) -> Vec<Option<usize>> {
        outputs
            .iter()
            .map(|o| {
                o.as_ref()
                    .ok()
                    .map(|o| usize::from_le_bytes(o.data[..8].try_into().unwrap()))
            })
            .collect()
    }

    #[test]
    fn reused_buffers_give_the_same_outputs() {
        use crate::engine::cpu::CpuEngine;
        use crate::{Cipher, Direction, Key};
        let d = Dispatcher::new(vec![CpuEngine::with_lanes(2).into_engine()]).unwrap();
        let key = d.add_key(Key::new(vec![0x42; 16])).unwrap();
        let ciphers = [
            Cipher::AES_128_CBC,
            Cipher::AES_128_CBC_PKCS7,
            Cipher::AES_128_CTR,
            Cipher::AES_128_GCM,
        ];
        let jobs: Vec<Job> = (0..200)
            .map(|i| {
                let cipher = ciphers[i % ciphers.len()];
                let len = (i * 37 % 700) / 16 * 16
                    + usize::from(cipher.mode != crate::Mode::Cbc) * (i % 16);
                Job::with_iv(
                    cipher,
                    Direction::Encrypt,
                    key,
                    &[i as u8; 16][..cipher.iv_len()],
                    vec![i as u8; len],
                )
                .unwrap()
            })
            .collect();
        let fresh = d.run(&jobs, &crate::policy::Pull).unwrap().outputs;
        for spares in [0, 50, 200, 400] {
            // Spares full of junk, some longer and some shorter than the outputs.
            let spare = (0..spares)
                .map(|i| JobOutput {
                    data: vec![0xa5; i * 13 % 2000],
                    tag: Some([0x5a; 16]),
                })
                .collect();
            let reused = d.run_reusing(&jobs, &crate::policy::Pull, spare).unwrap();
            for (j, (a, b)) in fresh.iter().zip(&reused.outputs).enumerate() {
                assert_eq!(
                    a.as_ref().unwrap(),
                    b.as_ref().unwrap(),
                    "job {j}, {spares} spares"
                );
            }
        }
    }

    #[test]
    fn merges_interleaved_runs_in_job_order() {
        let lists = vec![
            (list(&[]), true),
            (list(&[5]), true),
            (list(&[0, 1, 2, 6, 7]), true),
            (list(&[3, 4, 8, 9]), true),
        ];
        let mut outputs = vec![out(99)];
        let duplicates = in_job_order(&mut outputs, 10, lists, |_| unreachable!());
        assert_eq!(duplicates, 0);
        assert_eq!(order(&outputs), (0..10).map(Some).collect::<Vec<_>>());
    }

    #[test]
    fn unordered_lists_are_scattered() {
        let lists = vec![(list(&[4, 0, 2]), false), (list(&[1, 3]), true)];
        let mut outputs = Vec::new();
        let duplicates = in_job_order(&mut outputs, 5, lists, |_| unreachable!());
        assert_eq!(duplicates, 0);
        assert_eq!(order(&outputs), (0..5).map(Some).collect::<Vec<_>>());
    }

    #[test]
    fn missing_and_surplus_results() {
        for ascending in [true, false] {
            let lists = vec![(list(&[0, 1, 3]), ascending), (list(&[1, 3, 4]), true)];
            let mut outputs = Vec::new();
            let duplicates = in_job_order(&mut outputs, 6, lists, |j| {
                Err(Error::Policy {
                    policy: "test".into(),
                    reason: format!("job {j} missing"),
                })
            });
            assert_eq!(duplicates, 2, "ascending {ascending}");
            assert_eq!(
                order(&outputs),
                vec![Some(0), Some(1), None, Some(3), Some(4), None]
            );
            assert!(
                matches!(&outputs[2], Err(Error::Policy { reason, .. }) if reason == "job 2 missing")
            );
        }
    }

    /// Slots as an in-line lane leaves them: `ran` jobs hold their result, the others
    /// a stale output of an earlier batch (job 99).
    fn slots(n: usize, ran: &[usize]) -> Vec<Result<JobOutput>> {
        (0..n)
            .map(|j| if ran.contains(&j) { out(j) } else { out(99) })
            .collect()
    }

    #[test]
    fn gaps_between_the_lanes_runs_are_filled_from_the_lists_in_job_order() {
        let mut outputs = slots(8, &[0, 1, 4, 5, 6]);
        // Runs in the order the lane did them, not job order.
        let runs = vec![4..7, 0..2];
        let lists = vec![list(&[3]), list(&[2, 7])];
        let duplicates = fill_gaps(&mut outputs, runs, lists, |_| unreachable!());
        assert_eq!(duplicates, 0);
        assert_eq!(order(&outputs), (0..8).map(Some).collect::<Vec<_>>());
    }

    #[test]
    fn gaps_no_list_fills_are_missing_and_surplus_results_are_counted() {
        let mut outputs = slots(6, &[1, 2, 3]);
        // Job 2 completed twice (a list and a run); job 3 in two runs.
        let runs = vec![1..4, 3..4];
        let lists = vec![list(&[2, 5])];
        let duplicates = fill_gaps(&mut outputs, runs, lists, |j| {
            Err(Error::Policy {
                policy: "test".into(),
                reason: format!("job {j} missing"),
            })
        });
        assert_eq!(duplicates, 2);
        assert_eq!(
            order(&outputs),
            vec![None, Some(1), Some(2), Some(3), None, Some(5)]
        );
        assert!(
            matches!(&outputs[0], Err(Error::Policy { reason, .. }) if reason == "job 0 missing")
        );
        assert!(
            matches!(&outputs[4], Err(Error::Policy { reason, .. }) if reason == "job 4 missing")
        );
    }
}
