//! `adaptive` times a batch left to one engine in spans of pulls, each span a sample:
//! one stall inside the batch (a lane descheduled, a host hiccup) moves the engine's
//! estimate no more than one stalled pull would, instead of setting it.
//!
//! The engine under test wraps `cpu` (a test engine): its lane sleeps once, on a job
//! chosen by the test, and runs every job as `cpu` does otherwise.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::tiny_jobs;
use hetcrypt::engine::cpu::CpuEngine;
use hetcrypt::engine::{Engine, EngineInfo, Lane};
use hetcrypt::policy::Adaptive;
use hetcrypt::{Cipher, Direction, Dispatcher, Job, JobOutput, KeyStore, Result};

/// The stall: ~100,000 times a 16-byte job on the CPU, more than the whole batch.
const STALL: Duration = Duration::from_millis(200);

/// Jobs per batch, one a pull: the run is booked in a handful of spans.
const JOBS: usize = 400;

/// `cpu` with one lane that sleeps [`STALL`] on its next job once `armed` is set.
struct Stalling {
    inner: CpuEngine,
    armed: Arc<AtomicBool>,
}

struct StallingLane {
    inner: Box<dyn Lane>,
    armed: Arc<AtomicBool>,
}

impl Engine for Stalling {
    fn name(&self) -> &str {
        "stalling"
    }
    fn info(&self) -> EngineInfo {
        EngineInfo {
            name: "stalling".to_string(),
            ..self.inner.info()
        }
    }
    fn lanes(&self) -> usize {
        1
    }
    fn supports(&self, cipher: Cipher, direction: Direction) -> bool {
        self.inner.supports(cipher, direction)
    }
    fn open_lane(&self, index: usize) -> Result<Box<dyn Lane>> {
        Ok(Box::new(StallingLane {
            inner: self.inner.open_lane(index)?,
            armed: Arc::clone(&self.armed),
        }))
    }
    // One job a pull, so the batch is 400 pulls (multi-buffer would take 8 a pull).
    fn max_batch(&self) -> usize {
        1
    }
}

impl Lane for StallingLane {
    fn run(&mut self, job: &Job, keys: &KeyStore, out: &mut JobOutput) -> Result<()> {
        if self.armed.swap(false, Ordering::SeqCst) {
            std::thread::sleep(STALL);
        }
        self.inner.run(job, keys, out)
    }
}

/// The engine's learned wall time per 16-byte job.
fn learned(adaptive: &Adaptive) -> f64 {
    adaptive
        .learned()
        .iter()
        .find(|l| l.engine == "stalling" && l.min_len == 16)
        .and_then(|l| l.cost)
        .expect("an estimate for 16-byte jobs")
        .wall
}

#[test]
fn one_stall_in_a_batch_left_to_one_engine_barely_moves_its_estimate() {
    let armed = Arc::new(AtomicBool::new(false));
    let engine = Stalling {
        inner: CpuEngine::with_lanes(1),
        armed: Arc::clone(&armed),
    };
    // The only engine: every batch is left to it.
    let d = Dispatcher::new(vec![Arc::new(engine)]).unwrap();
    let jobs = tiny_jobs(&d, JOBS);
    let adaptive = Adaptive::new();
    for _ in 0..3 {
        let r = d.run(&jobs, &adaptive).unwrap();
        assert!(r.outputs.iter().all(|o| o.is_ok()));
    }
    let before = learned(&adaptive);
    armed.store(true, Ordering::SeqCst);
    let r = d.run(&jobs, &adaptive).unwrap();
    assert!(r.outputs.iter().all(|o| o.is_ok()));
    assert!(!armed.load(Ordering::SeqCst), "the stall did not happen");
    let after = learned(&adaptive);
    // The stall spread over the batch is ~500 us a job, hundreds of times the job
    // itself; timed as one sample of the whole run it set the estimate near that. One
    // span of it counts at most OUTLIER_CAP (4x) the estimate, and the other spans pull
    // it back: a factor of 10 leaves room for a noisy host.
    assert!(
        after < 10.0 * before,
        "estimate went from {before:e} s to {after:e} s a job after one stall"
    );
}
