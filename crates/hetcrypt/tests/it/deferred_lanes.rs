//! Lanes of engines a policy has no use for are not started, and start after all when
//! an engine fails and its jobs need somewhere to go.
//!
//! The engines under test wrap `cpu` (test engines): one counts the lanes it opens (a
//! lane is opened on its thread when it first starts), one fails after a few jobs or
//! cannot open a lane at all.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::tiny_jobs;
use hetcrypt::engine::cpu::CpuEngine;
use hetcrypt::engine::fault::{Fault, FaultyEngine};
use hetcrypt::engine::{Engine, EngineInfo, EngineRef, Lane};
use hetcrypt::policy::{self, Adaptive, Only};
use hetcrypt::{Cipher, Direction, Dispatcher, Job, JobOutput, Key, KeyStore, Result};

/// `cpu` with two lanes that counts the lanes it opens.
struct Counting {
    inner: CpuEngine,
    opened: Arc<AtomicUsize>,
}

impl Engine for Counting {
    fn name(&self) -> &str {
        "counting"
    }
    fn info(&self) -> EngineInfo {
        EngineInfo {
            name: "counting".to_string(),
            ..self.inner.info()
        }
    }
    fn lanes(&self) -> usize {
        2
    }
    fn supports(&self, cipher: Cipher, direction: Direction) -> bool {
        self.inner.supports(cipher, direction)
    }
    fn open_lane(&self, index: usize) -> Result<Box<dyn Lane>> {
        self.opened.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(self.inner.lane(index)))
    }
}

fn counting() -> (EngineRef, Arc<AtomicUsize>) {
    let opened = Arc::new(AtomicUsize::new(0));
    let engine = Counting {
        inner: CpuEngine::with_lanes(2),
        opened: Arc::clone(&opened),
    };
    (Arc::new(engine), opened)
}

fn jobs(d: &Dispatcher, n: usize) -> Vec<Job> {
    let key = d.add_key(Key::new(vec![7; 16])).unwrap();
    (0..n)
        .map(|i| {
            Job::new(
                Cipher::AES_128_CBC_PKCS7,
                Direction::Encrypt,
                key,
                [i as u8; 16],
                vec![i as u8; 100 + i % 50],
            )
        })
        .collect()
}

/// The reference: every job on a dispatcher with one plain `cpu` engine.
fn reference(jobs: &[Job]) -> Vec<Vec<u8>> {
    let cpu = Dispatcher::new(vec![CpuEngine::with_lanes(1).into_engine()]).unwrap();
    let key = cpu.add_key(Key::new(vec![7; 16])).unwrap();
    let jobs: Vec<Job> = jobs
        .iter()
        .map(|j| {
            Job::new(
                j.cipher,
                j.direction,
                key,
                j.iv().try_into().unwrap(),
                j.input.clone(),
            )
        })
        .collect();
    cpu.run(&jobs, &Only::new("cpu"))
        .unwrap()
        .outputs
        .into_iter()
        .map(|o| o.unwrap().data)
        .collect()
}

#[test]
fn an_engine_the_policy_does_not_use_opens_no_lane() {
    let (engine, opened) = counting();
    let d = Dispatcher::new(vec![CpuEngine::with_lanes(1).into_engine(), engine]).unwrap();
    let jobs = jobs(&d, 50);
    for _ in 0..3 {
        let r = d.run(&jobs, &Only::new("cpu")).unwrap();
        assert_eq!(r.report.engine("cpu").unwrap().jobs, 50);
        let lanes = &r.report.engine("counting").unwrap().lanes;
        assert_eq!(lanes.len(), 2);
        assert!(lanes.iter().all(|l| !l.started && l.jobs == 0));
        assert!(r.report.engine("cpu").unwrap().lanes[0].started);
    }
    assert_eq!(
        opened.load(Ordering::SeqCst),
        0,
        "only:cpu started counting's lanes"
    );
    // Round-robin deals a single job to the first engine only.
    let r = d
        .run(&jobs[..1], &*policy::by_name("round-robin").unwrap())
        .unwrap();
    assert!(r.outputs[0].is_ok());
    assert_eq!(
        opened.load(Ordering::SeqCst),
        0,
        "round-robin started counting's lanes"
    );
    // A policy that uses every engine starts its lanes (opened once, then kept).
    for _ in 0..2 {
        d.run(&jobs, &*policy::by_name("pull").unwrap()).unwrap();
    }
    assert_eq!(opened.load(Ordering::SeqCst), 2);
}

/// `only:<engine>` with that engine failing mid-batch, or unable to open a lane: the
/// other engine's lanes, not started with the batch, take its jobs; nothing is lost
/// or done twice, and the next batch runs on the other engine from the start.
#[test]
fn a_failing_engine_starts_the_lanes_that_were_not_needed() {
    for fault in [Fault::AfterJobs(5), Fault::OnOpen] {
        let (engine, opened) = counting();
        let flaky = FaultyEngine::new("flaky", CpuEngine::with_lanes(1).into_engine(), fault);
        let d = Dispatcher::new(vec![engine, flaky.into_engine()]).unwrap();
        let jobs = jobs(&d, 200);
        let want = reference(&jobs);
        let only = Only::new("flaky");
        for round in 0..2 {
            let r = d.run(&jobs, &only).unwrap();
            let got: Vec<Vec<u8>> = r
                .outputs
                .into_iter()
                .map(|o| {
                    o.unwrap_or_else(|e| panic!("{fault:?} round {round}: {e}"))
                        .data
                })
                .collect();
            assert!(got == want, "{fault:?} round {round}: outputs differ");
            let report = &r.report;
            let (counting, flaky) = (
                report.engine("counting").unwrap(),
                report.engine("flaky").unwrap(),
            );
            assert!(flaky.failed.is_some(), "{fault:?}");
            assert_eq!(counting.jobs + flaky.jobs, 200, "{fault:?} round {round}");
            assert!(counting.jobs >= 195, "{fault:?} round {round}");
            assert!(counting.lanes.iter().all(|l| l.started));
        }
        assert_eq!(opened.load(Ordering::SeqCst), 2, "{fault:?}");
    }
}

/// A stand-in for a crypto module far too slow for tiny jobs (a test engine): `cpu`
/// behind a 20 ms sleep per job, and, like a module, not using the host CPU meanwhile.
struct Sluggish(CpuEngine);

struct SluggishLane(Box<dyn Lane>);

/// What one job costs [`Sluggish`]: ~10,000x a 16-byte job on the CPU.
const SLUGGISH: Duration = Duration::from_millis(20);

impl Engine for Sluggish {
    fn name(&self) -> &str {
        "sluggish"
    }
    fn info(&self) -> EngineInfo {
        EngineInfo {
            name: "sluggish".to_string(),
            ..self.0.info()
        }
    }
    fn lanes(&self) -> usize {
        1
    }
    fn supports(&self, cipher: Cipher, direction: Direction) -> bool {
        self.0.supports(cipher, direction)
    }
    fn open_lane(&self, index: usize) -> Result<Box<dyn Lane>> {
        Ok(Box::new(SluggishLane(self.0.open_lane(index)?)))
    }
    fn uses_host_cpu(&self) -> bool {
        false
    }
}

impl Lane for SluggishLane {
    fn run(&mut self, job: &Job, keys: &KeyStore, out: &mut JobOutput) -> Result<()> {
        std::thread::sleep(SLUGGISH);
        self.0.run(job, keys, out)
    }
}

/// Batches `adaptive` may take to measure the slow engine (a handful on a quiet host).
const ROUNDS: usize = 40;

/// `adaptive` measures the slow engine, then leaves it out of batches of tiny jobs:
/// its lane is not started, and the CPU runs every job.
#[test]
fn adaptive_leaves_out_an_engine_it_gives_nothing() {
    let d = Dispatcher::new(vec![
        CpuEngine::with_lanes(1).into_engine(),
        Arc::new(Sluggish(CpuEngine::with_lanes(1))),
    ])
    .unwrap();
    let jobs = tiny_jobs(&d, 200);
    // Probes of the slow engine can slip (the CPU may finish a batch before they
    // start), so give it rounds until three batches in a row leave it out.
    until_left_out(&d, &jobs, &Adaptive::new(), "cpu", 3);
}

/// Runs `adaptive` on `jobs` until `in_a_row` batches in a row leave the slow engine
/// out (the CPU engine named `cpu` then runs each alone, a *sole* batch); panics after
/// [`ROUNDS`] batches.
fn until_left_out(d: &Dispatcher, jobs: &[Job], adaptive: &Adaptive, cpu: &str, in_a_row: usize) {
    let mut left_out = 0;
    for _ in 0..ROUNDS {
        let r = d.run(jobs, adaptive).unwrap();
        assert!(r.outputs.iter().all(|o| o.is_ok()));
        if r.report.engine("sluggish").unwrap().lanes[0].started {
            left_out = 0;
        } else {
            assert_eq!(r.report.engine(cpu).unwrap().jobs, jobs.len());
            left_out += 1;
            if left_out == in_a_row {
                return;
            }
        }
    }
    panic!("the slow engine was still started after {ROUNDS} batches");
}

/// A batch `adaptive` leaves to one engine (its lanes take jobs without deciding and
/// time whole runs of pulls) still teaches the model: every such batch adds samples
/// to the CPU's estimate of the class.
#[test]
fn adaptive_keeps_learning_in_batches_left_to_one_engine() {
    let d = Dispatcher::new(vec![
        CpuEngine::with_lanes(2).into_engine(),
        Arc::new(Sluggish(CpuEngine::with_lanes(1))),
    ])
    .unwrap();
    let jobs = tiny_jobs(&d, 300);
    let adaptive = Adaptive::new();
    until_left_out(&d, &jobs, &adaptive, "cpu", 1);
    let samples = |a: &Adaptive| {
        a.learned()
            .iter()
            .find(|l| l.engine == "cpu" && l.min_len == 16)
            .map(|l| l.samples)
            .expect("the cpu's estimate for 16-byte jobs")
    };
    for _ in 0..3 {
        let before = samples(&adaptive);
        let r = d.run(&jobs, &adaptive).unwrap();
        assert!(!r.report.engine("sluggish").unwrap().lanes[0].started);
        assert!(r.outputs.iter().all(|o| o.is_ok()));
        assert!(
            samples(&adaptive) > before,
            "a batch left to the cpu added no sample ({before} before)"
        );
    }
}

/// The one engine of a batch `adaptive` left to it fails mid-batch: the slow engine's
/// lane, left out, starts and takes the rest; every job is done once and right.
#[test]
fn adaptive_hands_a_failed_sole_engines_jobs_to_the_left_out_one() {
    /// Jobs per batch, and the batch (after the left-out one) in which the CPU fails,
    /// a few jobs before its end (the slow engine then runs only those).
    const JOBS: usize = 200;
    const LEFT: usize = 6;
    let flaky = FaultyEngine::new(
        "flaky",
        CpuEngine::with_lanes(2).into_engine(),
        // Far past the batches `adaptive` needs to leave the slow engine out; the loop
        // below runs whole batches up to the failing one.
        Fault::AfterJobs(JOBS * ROUNDS * 2 - LEFT),
    );
    let d = Dispatcher::new(vec![
        flaky.into_engine(),
        Arc::new(Sluggish(CpuEngine::with_lanes(1))),
    ])
    .unwrap();
    let jobs = tiny_jobs(&d, JOBS);
    let want = reference(&jobs);
    let adaptive = Adaptive::new();
    until_left_out(&d, &jobs, &adaptive, "flaky", 1);
    loop {
        let r = d.run(&jobs, &adaptive).unwrap();
        let got: Vec<Vec<u8>> = r
            .outputs
            .into_iter()
            .map(|o| o.expect("every job succeeds").data)
            .collect();
        assert!(got == want, "outputs differ");
        let (flaky, slow) = (
            r.report.engine("flaky").unwrap(),
            r.report.engine("sluggish").unwrap(),
        );
        assert_eq!(flaky.jobs + slow.jobs, JOBS, "a job lost or done twice");
        if flaky.failed.is_none() {
            assert_eq!(slow.jobs, 0, "the left-out engine ran jobs");
            continue;
        }
        assert!(slow.lanes[0].started);
        assert!(
            slow.jobs >= 1 && slow.jobs <= LEFT + 16,
            "{} jobs",
            slow.jobs
        );
        assert!(r.report.redispatched >= 1);
        return;
    }
}
