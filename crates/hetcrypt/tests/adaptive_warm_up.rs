//! `adaptive` measures an engine undisturbed by its warm requests: a module's first
//! requests after a pause are slower than the ones that follow back to back (the
//! testbed's virtio-crypto device: the first ~2x, the second ~1.3x), and an engine
//! judged by those looks slower than it is and can lose the sizes it is best at.
//!
//! The engines are test engines that run every job as `cpu` does and then sleep: a
//! "module" that sleeps [`COLD`] on its first [`RAMP`] jobs after a pause and [`STEADY`]
//! on the others, and a CPU-like engine that sleeps [`CPU_JOB`] on each.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::tiny_jobs;
use hetcrypt::engine::cpu::CpuEngine;
use hetcrypt::engine::{Engine, EngineInfo, Lane};
use hetcrypt::policy::Adaptive;
use hetcrypt::{Cipher, Direction, Dispatcher, Job, JobOutput, KeyStore, Result};

/// The module's job once it runs back to back.
const STEADY: Duration = Duration::from_millis(1);
/// Its job after a pause: far above [`STEADY`], so an estimate that booked one shows.
const COLD: Duration = Duration::from_millis(6);
/// How many jobs after a pause are cold.
const RAMP: usize = 2;
/// A gap between two jobs longer than this is a pause (and the lane's first job
/// ever is cold). Back-to-back pulls leave microseconds between jobs, but a debug
/// build on a loaded CI machine once left more than 250 us and made a warm pull cold.
const PAUSE: Duration = Duration::from_millis(2);
/// The CPU-like engine's job.
const CPU_JOB: Duration = Duration::from_micros(300);
/// Jobs in the batch: the CPU-like lanes need ~100 ms for them, far more than the
/// module's probes.
const JOBS: usize = 600;

/// `cpu` (one lane per test lane) that sleeps after each job, as set up.
struct Paced {
    name: &'static str,
    lanes: usize,
    module: bool,
    inner: CpuEngine,
}

struct PacedLane {
    module: bool,
    inner: Box<dyn Lane>,
    last_end: Option<Instant>,
    cold_left: usize,
}

impl Engine for Paced {
    fn name(&self) -> &str {
        self.name
    }
    fn info(&self) -> EngineInfo {
        EngineInfo {
            name: self.name.to_string(),
            ..self.inner.info()
        }
    }
    fn lanes(&self) -> usize {
        self.lanes
    }
    fn supports(&self, cipher: Cipher, direction: Direction) -> bool {
        self.inner.supports(cipher, direction)
    }
    fn open_lane(&self, index: usize) -> Result<Box<dyn Lane>> {
        Ok(Box::new(PacedLane {
            module: self.module,
            inner: self.inner.open_lane(index)?,
            last_end: None,
            cold_left: 0,
        }))
    }
    // One job a pull, as the kernel engine takes them.
    fn max_batch(&self) -> usize {
        1
    }
    fn uses_host_cpu(&self) -> bool {
        !self.module
    }
}

impl Lane for PacedLane {
    fn run(&mut self, job: &Job, keys: &KeyStore, out: &mut JobOutput) -> Result<()> {
        let pause = self.last_end.is_none_or(|t| t.elapsed() > PAUSE);
        let nap = if !self.module {
            CPU_JOB
        } else {
            if pause {
                self.cold_left = RAMP;
            }
            if self.cold_left > 0 {
                self.cold_left -= 1;
                COLD
            } else {
                STEADY
            }
        };
        std::thread::sleep(nap);
        let result = self.inner.run(job, keys, out);
        self.last_end = Some(Instant::now());
        result
    }
}

#[test]
fn a_module_is_measured_undisturbed_past_its_cold_requests() {
    // One CPU-like lane per core and the module's: more lanes than cores, so the cost
    // rule weighs which engine is best alone, as on a board.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let engines: Vec<hetcrypt::engine::EngineRef> = vec![
        Arc::new(Paced {
            name: "paced-cpu",
            lanes: cores,
            module: false,
            inner: CpuEngine::with_lanes(cores),
        }),
        Arc::new(Paced {
            name: "ramp",
            lanes: 1,
            module: true,
            inner: CpuEngine::with_lanes(1),
        }),
    ];
    let d = Dispatcher::new(engines).unwrap();
    let jobs = tiny_jobs(&d, JOBS);
    let adaptive = Adaptive::new();
    let r = d.run(&jobs, &adaptive).unwrap();
    assert!(r.outputs.iter().all(|o| o.is_ok()));
    let learned = adaptive.learned();
    let module = learned
        .iter()
        .find(|l| l.engine == "ramp" && l.min_len == 16)
        .unwrap_or_else(|| panic!("the module never probed: {learned:?}"));
    let alone = module
        .alone
        .unwrap_or_else(|| panic!("no undisturbed estimate: {module:?}"))
        .wall;
    // Booked, a cold request would put the estimate at COLD (6 ms) or, averaged with a
    // warm one, 3.5 ms; warm ones alone give STEADY (1 ms) plus the lane's overhead and
    // a sleep's overshoot on a busy host.
    assert!(
        alone < 2.5e-3,
        "the module's undisturbed estimate is {alone:e} s a job, its steady cost 1e-3 s"
    );
}
