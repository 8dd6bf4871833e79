//! `adaptive` measures an engine undisturbed by its warm requests: a module's first
//! requests after a pause differ from the ones that follow back to back (the testbed's
//! virtio-crypto device: the first ~2x slower, the second ~1.3x), and an engine judged
//! by those is misjudged and can lose the sizes it is best at.
//!
//! No wall-clock threshold decides this test. The test "module" is cold on its first
//! [`RAMP`] jobs ever, which are its first probe's cold pulls in the policy's count
//! (a probe runs its first pulls back to back under the solo), and its cold jobs are
//! *faster* than its warm ones: they skip the [`STEADY`] sleep. A sleep can overshoot
//! on a loaded host but never undershoot, so every warm pull takes at least [`STEADY`]
//! and an undisturbed estimate below it can only come from a booked cold pull. (The
//! real device's cold requests are slower; that direction cannot be told from a loaded
//! host's overshoot, and what the exclusion gains in throughput is a benchmark's
//! question: `crates/hetcrypt/benches/`, `examples/latency.rs`.) The CPU-like engine
//! sleeps [`CPU_JOB`] on each job.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::tiny_jobs;
use hetcrypt::engine::cpu::CpuEngine;
use hetcrypt::engine::{Engine, EngineInfo, Lane};
use hetcrypt::policy::adaptive::model;
use hetcrypt::policy::Adaptive;
use hetcrypt::{Cipher, Direction, Dispatcher, Job, JobOutput, KeyStore, Result};

/// The module's job once it runs back to back.
const STEADY: Duration = Duration::from_millis(1);
/// How many of the module lane's first jobs are cold (no sleep): the policy's cold
/// pulls, one job a pull.
const RAMP: usize = model::WARM_UP_PULLS;
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
    /// Jobs this lane has run.
    done: usize,
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
            done: 0,
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
        let nap = if !self.module {
            CPU_JOB
        } else if self.done < RAMP {
            Duration::ZERO
        } else {
            STEADY
        };
        self.done += 1;
        std::thread::sleep(nap);
        self.inner.run(job, keys, out)
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
    // Every warm pull of one job took at least STEADY (a sleep never undershoots);
    // booked, the cold ones (microseconds) would start the estimate far below it, and
    // the outlier cap keeps later samples from lifting it back.
    let steady = STEADY.as_secs_f64();
    assert!(
        alone >= steady * (1.0 - 1e-9),
        "the module's undisturbed estimate is {alone:e} s a job, below its warm cost \
         {steady:e} s: a cold pull was booked"
    );
}
