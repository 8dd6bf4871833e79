//! Where each cipher call runs: in-line on the calling thread (CPU) or on a lane of the
//! crypto module, and the counters that show what went where.
//!
//! The decision is the library's [`CallRouter`] (pure scheduling logic); this file
//! holds the mechanism: the module's lanes, its keys, quarantine on a fault.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use hetcrypt::dispatch::thread_cpu_time;
use hetcrypt::engine::{self, EngineRef, Lane, RawJob};
use hetcrypt::policy::call::{CallRouter, CallSite, Route, RouterMode, KERNEL_SHARE_UNIT};
use hetcrypt::{Direction, Key, KeyId, KeyStore};

use crate::inner::OFFERED;
use crate::load::{KernelSampler, LoadSampler, SharedTotal};

/// What the provider was told to do (openssl.cnf keys, overridden by environment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Engine names; `auto` takes the first crypto-module driver the machine has.
    pub engines: Vec<String>,
    /// `balanced`, `cpu` or `module`.
    pub mode: RouterMode,
    /// A size (bytes) from which calls prefer the module before anything is measured.
    pub threshold: Option<usize>,
    /// Where to write the one-line summary at unload (`-`: standard error).
    pub stats: Option<String>,
    /// The calibration store to read (else the library's default place, or
    /// `HETCRYPT_CALIBRATION`).
    pub calibration: Option<String>,
}

/// The openssl.cnf keys we read, in [`Config::from_values`] order, and the
/// environment variables that override each.
pub const CONFIG_KEYS: [(&std::ffi::CStr, &str); 5] = [
    (c"engines", "HETCRYPT_PROVIDER_ENGINES"),
    (c"policy", "HETCRYPT_PROVIDER_POLICY"),
    (c"threshold", "HETCRYPT_PROVIDER_THRESHOLD"),
    (c"stats", "HETCRYPT_PROVIDER_STATS"),
    (c"calibration", hetcrypt::calibration::ENV_PATH),
];

impl Config {
    /// Builds the configuration from openssl.cnf values (in [`CONFIG_KEYS`] order),
    /// each overridden by its environment variable when that is set.
    pub fn from_values(
        cnf: &[Option<String>],
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, String> {
        let value = |i: usize| env(CONFIG_KEYS[i].1).or_else(|| cnf.get(i).cloned().flatten());
        let engines = value(0)
            .unwrap_or_else(|| "auto".into())
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        let mode = match value(1).as_deref().map(str::trim) {
            None | Some("balanced") => RouterMode::Balanced,
            Some("cpu") => RouterMode::Cpu,
            Some("module") => RouterMode::Module,
            Some(other) => {
                return Err(format!(
                    "policy '{other}' is not one of balanced, cpu, module"
                ))
            }
        };
        let threshold = match value(2) {
            None => None,
            Some(t) => Some(
                t.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("threshold '{t}' is not a size in bytes"))?,
            ),
        };
        Ok(Config {
            engines,
            mode,
            threshold,
            stats: value(3).filter(|s| !s.is_empty()),
            calibration: value(4).filter(|s| !s.is_empty()),
        })
    }
}

/// Calls and bytes of one engine.
#[derive(Default)]
pub struct Counter {
    calls: AtomicU64,
    bytes: AtomicU64,
    busy_ns: AtomicU64,
}

impl Counter {
    fn add(&self, calls: u64, bytes: u64, busy_ns: u64) {
        self.calls.fetch_add(calls, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.busy_ns.fetch_add(busy_ns, Ordering::Relaxed);
    }

    /// `(calls, bytes, busy ns)`.
    pub fn read(&self) -> (u64, u64, u64) {
        (
            self.calls.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
            self.busy_ns.load(Ordering::Relaxed),
        )
    }
}

/// Counts a context keeps to itself and adds to the shared ones now and then, so the
/// in-line path touches no shared cache line per call.
#[derive(Default, Clone, Copy)]
pub struct LocalCounts {
    calls: u64,
    bytes: u64,
}

/// Calls a context counts before adding them to the shared counters.
const FLUSH_EVERY: u64 = 1024;

/// The crypto module: its engine, its lanes, the keys it holds.
pub struct Module {
    /// The engine's name (`kernel:virtio_crypto_aes_cbc`, ...).
    pub name: String,
    engine: EngineRef,
    keys: KeyStore,
    lanes: Vec<Mutex<Option<Box<dyn Lane>>>>,
    quarantined: AtomicBool,
    /// Per offered cipher, per direction (encrypt, decrypt): whether it takes it.
    takes: [[bool; 2]; OFFERED.len()],
}

/// A module lane held for one call.
pub struct LaneGuard<'a> {
    index: usize,
    slot: MutexGuard<'a, Option<Box<dyn Lane>>>,
}

impl Module {
    fn open(name: &str) -> Result<Module, String> {
        let engine = engine::by_name(name, None).map_err(|e| e.to_string())?;
        let mut takes = [[false; 2]; OFFERED.len()];
        for (i, (_, cipher)) in OFFERED.iter().enumerate() {
            for (d, dir) in [Direction::Encrypt, Direction::Decrypt]
                .into_iter()
                .enumerate()
            {
                takes[i][d] = engine.supports(*cipher, dir) && cipher.mode != hetcrypt::Mode::Gcm;
            }
        }
        let lanes = (0..engine.lanes().max(1))
            .map(|_| Mutex::new(None))
            .collect();
        Ok(Module {
            name: engine.name().to_string(),
            engine,
            keys: KeyStore::new(),
            lanes,
            quarantined: AtomicBool::new(false),
            takes,
        })
    }

    /// Whether calls of this cipher and direction may go to the module now.
    pub fn takes(&self, alg: usize, enc: bool) -> bool {
        self.takes[alg][usize::from(!enc)] && !self.quarantined.load(Ordering::Relaxed)
    }

    /// Whether the module offers this cipher in either direction at all, quarantined
    /// or not: a context of a cipher it never takes skips routing altogether.
    pub fn offers(&self, alg: usize) -> bool {
        self.takes[alg][0] || self.takes[alg][1]
    }

    /// Whether the module takes this cipher in either direction (so a context keeps
    /// its key registered with it).
    pub fn may_take(&self, alg: usize) -> bool {
        (self.takes[alg][0] || self.takes[alg][1]) && !self.quarantined.load(Ordering::Relaxed)
    }

    /// Registers a context's key.
    pub fn add_key(&self, key: &[u8]) -> Option<KeyId> {
        self.keys.add(Key::new(key.to_vec())).ok()
    }

    /// Drops a context's key, and every lane's state for it.
    pub fn remove_key(&self, id: KeyId) {
        let _ = self.keys.remove(id);
        for lane in &self.lanes {
            let mut slot = lane.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(l) = slot.as_mut() {
                if !l.forget_keys(&[id]) {
                    // The lane cannot forget one key: reopen it empty.
                    *slot = None;
                }
            }
        }
    }

    fn try_lane(&self) -> Option<LaneGuard<'_>> {
        self.lanes
            .iter()
            .enumerate()
            .find_map(|(index, l)| l.try_lock().ok().map(|slot| LaneGuard { index, slot }))
    }

    fn wait_lane(&self, hint: usize) -> LaneGuard<'_> {
        let index = hint % self.lanes.len();
        let slot = self.lanes[index].lock().unwrap_or_else(|e| e.into_inner());
        LaneGuard { index, slot }
    }

    /// Runs one job on a held lane into `out`: whether the lane was opened for it (a
    /// cold call, slower than the module's steady cost). `Err` means the module failed
    /// (it is now quarantined) or refused the job, and the call must run on the CPU.
    fn run(
        &self,
        guard: &mut LaneGuard<'_>,
        job: &RawJob<'_>,
        out: &mut [u8],
    ) -> Result<bool, String> {
        if self.quarantined.load(Ordering::Relaxed) {
            return Err("quarantined".into());
        }
        let cold = guard.slot.is_none();
        if cold {
            match self.engine.open_lane(guard.index) {
                Ok(l) => *guard.slot = Some(l),
                Err(e) => return Err(self.quarantine(e.to_string())),
            }
        }
        let lane = guard.slot.as_mut().ok_or("no lane")?;
        match lane.run_raw(job, &self.keys, out) {
            Ok(()) => Ok(cold),
            Err(e) if e.is_engine_failure() => {
                // The device went away (or broke): never send it another request
                // (on AF_ALG one more request after an unplug can crash the kernel).
                *guard.slot = None;
                Err(self.quarantine(e.to_string()))
            }
            Err(e) => Err(e.to_string()),
        }
    }

    fn quarantine(&self, why: String) -> String {
        self.quarantined.store(true, Ordering::SeqCst);
        why
    }
}

/// The provider's routing state: the module (if any), the decision logic, counters.
pub struct Router {
    /// The crypto module, if one is configured and opened.
    pub module: Option<Module>,
    /// Why there is no module (for the status parameters), if there is none.
    pub no_module: Option<String>,
    /// What the calibration store gave: the path it was read from, or why not.
    pub calibration: String,
    calls: CallRouter,
    /// In-line (CPU) calls.
    pub cpu: Counter,
    /// Module calls.
    pub module_counter: Counter,
    /// Calls that failed on the module and completed on the CPU.
    pub failovers: AtomicU64,
    /// How busy the CPUs are, for the router (sampled from timed calls).
    load: LoadSampler,
    /// The kernel threads' CPU time against the callers' in module calls.
    kernel: KernelSampler,
    /// The callers' CPU time in module calls so far, ns (what the kernel threads'
    /// time is weighed against), shared with the processes forked from this one.
    module_cpu_ns: SharedTotal,
    /// The router's inputs over time, where `HETCRYPT_PROVIDER_TRACE` is set.
    timeline: Option<Timeline>,
    /// Bytes of every call routed so far: the rate the balanced mode's trials compare.
    carried: AtomicU64,
    /// The trials' clock origin.
    origin: Instant,
}

/// A thread ticks the balanced mode's trial (a clock read, and the load sampled if
/// its period is over) once in this many calls: at ~200 calls a second (the soft
/// guest's 1 KiB responses) still every 40 ms, well inside a 250-ms window.
const TRIAL_TICK_EVERY: u32 = 8;

/// The smallest call the timeline follows: TLS records of 4 KiB and up, where the
/// module can win.
const TIMELINE_FROM: usize = 4096;
/// Lines the timeline keeps at most (one per load sample, 10 a second).
const TIMELINE_LINES: usize = 4096;

/// What the router saw and chose, one line per load sample: how busy the CPUs were,
/// the kernel share, calls of [`TIMELINE_FROM`] bytes and up routed each way, the
/// module calls' wall time, how much of it their callers waited for a CPU (run-queue
/// delay) and what the router counted them for, and each large site's costs as the
/// router weighs them.
struct Timeline {
    start: Instant,
    lines: Mutex<Vec<String>>,
    to_cpu: AtomicU64,
    to_module: AtomicU64,
    module_wall_ns: AtomicU64,
    module_delay_ns: AtomicU64,
    /// What the router was told those calls cost (the waiting beyond the kernel's
    /// work taken off).
    module_counted_ns: AtomicU64,
}

thread_local! {
    /// This thread's `schedstat`, kept open: its run-queue delay, read around each
    /// module call the router weighs (one `pread` each side).
    static SCHEDSTAT: Option<crate::load::ProcFile> = crate::load::ProcFile::open("/proc/thread-self/schedstat");
    /// Calls this thread routed since its last trial tick ([`TRIAL_TICK_EVERY`]), and
    /// their bytes: added to the router's total at the tick, so that no shared counter
    /// is touched on every call. (A thread calling two routers, one per library
    /// context, may add a few calls' bytes to the other's total: a trial compares
    /// rates across windows of the same router, and such a thread adds to both.)
    static ROUTED: std::cell::Cell<(u32, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// The calling thread's time spent waiting on a run queue so far, ns; `None` where
/// the kernel keeps no such count (no `CONFIG_SCHED_INFO`) or `/proc` cannot be read.
/// For the running thread the count is exact: the kernel adds each wait when the
/// thread gets its CPU back (unlike the run time beside it, which lags by up to a
/// tick).
fn run_delay_ns() -> Option<u64> {
    SCHEDSTAT.with(|f| {
        let mut buf = [0u8; crate::load::SCHEDSTAT_LEN];
        f.as_ref()
            .and_then(|f| f.read(&mut buf))
            .and_then(crate::load::run_delay)
    })
}

/// Starts the router from the calibration store, where one exists for this machine:
/// per offered cipher, direction and size class, the stored cost of one request on the
/// module (the in-line path, OpenSSL's default provider, is measured on its first
/// call: the store's `cpu` engine may run another implementation). Returns what
/// happened, in words.
fn seed(calls: &CallRouter, module: &Module, path: Option<&str>) -> String {
    use hetcrypt::calibration::{load_store, Fingerprint};
    let (path, loaded) = load_store(path.map(std::path::Path::new), &Fingerprint::current());
    let warning = loaded.warning(&path);
    let Some(cal) = loaded.calibration() else {
        return match warning {
            Some(w) => format!("ignored: {w}"),
            None => format!("none at {} (measuring online)", path.display()),
        };
    };
    let mut seeded = 0;
    for (alg, (_, cipher)) in OFFERED.iter().enumerate() {
        for (encrypt, direction) in [(true, Direction::Encrypt), (false, Direction::Decrypt)] {
            if !module.takes(alg, encrypt) {
                continue;
            }
            for len in CallRouter::class_lengths() {
                if let Some(m) = cal.cost(&module.name, *cipher, direction, len) {
                    let site = CallSite {
                        cipher: alg,
                        encrypt,
                        len,
                    };
                    calls.seed_module(site, m.as_nanos() as u64);
                    seeded += 1;
                }
            }
        }
    }
    if seeded == 0 {
        format!(
            "{} has no costs for {} (measuring online)",
            path.display(),
            module.name
        )
    } else {
        format!("{} ({seeded} call sites seeded)", path.display())
    }
}

/// When a timed in-line call started: wall clock and the thread's CPU clock.
#[derive(Clone, Copy, Debug)]
pub struct Started {
    wall: Instant,
    cpu: std::time::Duration,
}

impl Started {
    /// Now.
    pub fn now() -> Started {
        Started {
            wall: Instant::now(),
            cpu: thread_cpu_time(),
        }
    }
}

/// What an in-line call cost: the CPU time its thread spent in it, not its wall time,
/// which also holds whatever ran while the thread was preempted (on the soft guest's
/// one vCPU, `wrk` for a few ms now and then: a 1 KiB record's in-line estimate once
/// rose from 0.15 to 1.9 ms and sent the records to the module). The wall time where
/// the thread's CPU clock cannot be read (`no_cpu_clock`), or where it did not move
/// (a call shorter than the clock's step).
pub fn in_line_cost(wall_ns: u64, cpu_ns: u64, no_cpu_clock: bool) -> u64 {
    if no_cpu_clock || cpu_ns == 0 {
        wall_ns
    } else {
        cpu_ns.min(wall_ns.max(1))
    }
}

/// One call's destination.
pub enum Dest<'a> {
    /// In-line on the calling thread; `timed`: measure it for the router.
    Cpu {
        /// Whether to time this call.
        timed: bool,
    },
    /// On this module lane.
    Module(LaneGuard<'a>),
}

impl Router {
    /// Opens the configured module, if any.
    pub fn new(config: &Config) -> Router {
        let wanted: Vec<String> = if config.engines.iter().any(|e| e == "auto") {
            engine::kernel::offload_drivers()
                .into_iter()
                .map(|d| format!("kernel:{d}"))
                .take(1)
                .collect()
        } else {
            config
                .engines
                .iter()
                .filter(|e| *e != "cpu")
                .take(1)
                .cloned()
                .collect()
        };
        let (module, no_module) = match wanted.first() {
            None => (
                None,
                Some("none configured or found (in-line CPU only)".to_string()),
            ),
            Some(name) => match Module::open(name) {
                Ok(m) => (Some(m), None),
                Err(e) => (None, Some(format!("{name} unavailable: {e}"))),
            },
        };
        let calls = CallRouter::new(config.mode, OFFERED.len(), config.threshold);
        let calibration = match module.as_ref() {
            Some(m) => seed(&calls, m, config.calibration.as_deref()),
            None => "not needed (no module)".to_string(),
        };
        Router {
            calls,
            module,
            no_module,
            calibration,
            cpu: Counter::default(),
            module_counter: Counter::default(),
            failovers: AtomicU64::new(0),
            load: LoadSampler::default(),
            kernel: KernelSampler::default(),
            module_cpu_ns: SharedTotal::new(),
            timeline: std::env::var_os("HETCRYPT_PROVIDER_TRACE").map(|_| Timeline {
                start: Instant::now(),
                lines: Mutex::new(Vec::new()),
                to_cpu: AtomicU64::new(0),
                to_module: AtomicU64::new(0),
                module_wall_ns: AtomicU64::new(0),
                module_delay_ns: AtomicU64::new(0),
                module_counted_ns: AtomicU64::new(0),
            }),
            carried: AtomicU64::new(0),
            origin: Instant::now(),
        }
    }

    /// Tells the router how busy the CPUs are, when a sampling period has passed, and
    /// (less often) how much CPU the kernel's threads spend for module calls.
    fn sample_load(&self, now: Instant) {
        if let Some(busy) = self.load.sample(now) {
            self.calls.set_busy(busy);
            let caller_ns = self.module_cpu_ns.get();
            if let Some(share) = self.kernel.sample(now, caller_ns) {
                self.calls.set_kernel_share(share);
            }
            if let Some(t) = &self.timeline {
                self.timeline_line(t, now);
            }
        }
    }

    fn timeline_line(&self, t: &Timeline, now: Instant) {
        let mut line = format!(
            "  t {:.1} s busy {} trial {:?} share {} to-cpu {} to-module {} module wall {:.1} ms delay {:.1} ms counted {:.1} ms",
            now.saturating_duration_since(t.start).as_secs_f64(),
            self.calls.busy(),
            self.calls.trials().0,
            self.calls
                .kernel_share()
                .map_or_else(|| "?".to_string(), |s| s.to_string()),
            t.to_cpu.swap(0, Ordering::Relaxed),
            t.to_module.swap(0, Ordering::Relaxed),
            t.module_wall_ns.swap(0, Ordering::Relaxed) as f64 / 1e6,
            t.module_delay_ns.swap(0, Ordering::Relaxed) as f64 / 1e6,
            t.module_counted_ns.swap(0, Ordering::Relaxed) as f64 / 1e6,
        );
        for (alg, enc, len, _, module, _) in self.calls.estimates() {
            if len < TIMELINE_FROM || module == 0 {
                continue;
            }
            let site = CallSite {
                cipher: alg,
                encrypt: enc,
                len,
            };
            let (cpu, cost) = self.calls.costs(site);
            line.push_str(&format!(
                "; {alg}{} {len}: cpu {:.0} us module {:.0} us (wall {:.0})",
                if enc { "e" } else { "d" },
                cpu as f64 / 1e3,
                cost as f64 / 1e3,
                module as f64 / 1e3
            ));
        }
        if let Ok(mut lines) = t.lines.lock() {
            if lines.len() < TIMELINE_LINES {
                lines.push(line);
            }
        }
    }

    /// Where a call of `len` bytes of cipher `alg` goes.
    pub fn choose(&self, alg: usize, enc: bool, len: usize) -> Dest<'_> {
        if self.calls.mode() == RouterMode::Balanced && self.module.is_some() {
            self.tick_trial(len);
        }
        let dest = self.choose_inner(alg, enc, len);
        if let Some(t) = self.timeline.as_ref().filter(|_| len >= TIMELINE_FROM) {
            let n = match dest {
                Dest::Cpu { .. } => &t.to_cpu,
                Dest::Module(_) => &t.to_module,
            };
            n.fetch_add(1, Ordering::Relaxed);
        }
        dest
    }

    /// Counts a call's bytes and, every [`TRIAL_TICK_EVERY`] calls of this thread,
    /// moves the balanced mode's trial on (sampling the load first, so that the trial
    /// sees how busy the CPUs are even while no call is timed).
    fn tick_trial(&self, len: usize) {
        let (n, pending) = ROUTED.with(|c| {
            let (n, bytes) = c.get();
            let now = (n + 1, bytes + len as u64);
            c.set(if now.0 >= TRIAL_TICK_EVERY {
                (0, 0)
            } else {
                now
            });
            now
        });
        if n >= TRIAL_TICK_EVERY {
            let bytes = self.carried.fetch_add(pending, Ordering::Relaxed) + pending;
            let now = Instant::now();
            self.sample_load(now);
            let ns = now.saturating_duration_since(self.origin).as_nanos();
            self.calls
                .tick_trial(u64::try_from(ns).unwrap_or(u64::MAX), bytes);
        }
    }

    fn choose_inner(&self, alg: usize, enc: bool, len: usize) -> Dest<'_> {
        let Some(module) = self.module.as_ref().filter(|m| m.takes(alg, enc)) else {
            return Dest::Cpu { timed: false };
        };
        let site = CallSite {
            cipher: alg,
            encrypt: enc,
            len,
        };
        match self.calls.route(site) {
            Route::Cpu { timed } => Dest::Cpu { timed },
            Route::ModuleIfFree { else_timed } => match module.try_lane() {
                Some(g) => Dest::Module(g),
                None => Dest::Cpu { timed: else_timed },
            },
            Route::Module => match module.try_lane() {
                Some(g) => Dest::Module(g),
                None => Dest::Module(module.wait_lane(len)),
            },
        }
    }

    /// Records a timed in-line call.
    pub fn cpu_took(&self, alg: usize, enc: bool, len: usize, started: Started) {
        let now = Instant::now();
        let wall = now.saturating_duration_since(started.wall).as_nanos() as u64;
        let cpu = thread_cpu_time().saturating_sub(started.cpu).as_nanos() as u64;
        self.sample_load(now);
        self.calls.observe_cpu(
            CallSite {
                cipher: alg,
                encrypt: enc,
                len,
            },
            in_line_cost(wall, cpu, started.cpu.is_zero()),
        );
    }

    /// Runs `input` into `out` on the module lane `guard` as offered cipher `alg` with
    /// `iv` and key `key`. `first_with_key`: the lane may have to set the key up first,
    /// so the call's time is not the module's steady cost: it is reported to the router
    /// as a keyed call's cost, which stands in only where no steady call was seen.
    /// `false`: the module failed (and is quarantined, if the fault was its
    /// own): run the call in-line.
    #[allow(clippy::too_many_arguments)]
    pub fn run_module(
        &self,
        mut guard: LaneGuard<'_>,
        alg: usize,
        enc: bool,
        key: KeyId,
        first_with_key: bool,
        iv: [u8; 16],
        input: &[u8],
        out: &mut [u8],
    ) -> bool {
        let Some(module) = self.module.as_ref() else {
            return false;
        };
        let job = RawJob {
            cipher: OFFERED[alg].1,
            direction: if enc {
                Direction::Encrypt
            } else {
                Direction::Decrypt
            },
            key,
            iv,
            input,
        };
        // Only the balanced router weighs what a call cost; the run-queue delay (two
        // `pread`s of a kept file, ~1 us each on the host) is read for it, and for the
        // timeline. Nested so that the delay read falls inside the CPU time read
        // and both inside the wall time: the waiting taken off happened in the call.
        let weigh = self.calls.mode() == RouterMode::Balanced || self.timeline.is_some();
        let started = Instant::now();
        let cpu_started = thread_cpu_time();
        let delay_started = if weigh { run_delay_ns() } else { None };
        let result = module.run(&mut guard, &job, out);
        drop(guard);
        let delay = delay_started.and_then(|d| Some(run_delay_ns()?.saturating_sub(d)));
        let cpu_ns = thread_cpu_time().saturating_sub(cpu_started).as_nanos() as u64;
        let now = Instant::now();
        let ns = now.saturating_duration_since(started).as_nanos() as u64;
        // Every module call, cold ones too, makes kernel threads work.
        self.module_cpu_ns.add(cpu_ns);
        self.sample_load(now);
        match result {
            Ok(cold) => {
                self.module_counter.add(1, input.len() as u64, ns);
                let site = CallSite {
                    cipher: alg,
                    encrypt: enc,
                    len: input.len(),
                };
                self.observe_module_call(site, cold, first_with_key, ns, cpu_ns, delay);
                true
            }
            Err(_) => {
                self.failovers.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Tells the router what a module call at `site` cost: `wall_ns` of wall time,
    /// `cpu_ns` of the caller's CPU (0: not known), and `run_delay_ns` of it waiting on
    /// a run queue (`None`: not read), which comes off the wall time
    /// ([`CallRouter::wall_less_waits`]). `cold`: the lane was opened for it (nothing
    /// learnt); `first_with_key`: the lane set the key up first.
    fn observe_module_call(
        &self,
        site: CallSite,
        cold: bool,
        first_with_key: bool,
        wall_ns: u64,
        cpu_ns: u64,
        run_delay_ns: Option<u64>,
    ) {
        let counted = match run_delay_ns {
            Some(d) => self.calls.wall_less_waits(wall_ns, d, cpu_ns),
            None => wall_ns,
        };
        if let Some(t) = self.timeline.as_ref().filter(|_| site.len >= TIMELINE_FROM) {
            t.module_wall_ns.fetch_add(wall_ns, Ordering::Relaxed);
            t.module_delay_ns
                .fetch_add(run_delay_ns.unwrap_or(0), Ordering::Relaxed);
            t.module_counted_ns.fetch_add(counted, Ordering::Relaxed);
        }
        if cold {
            return;
        }
        if first_with_key {
            // What a short-lived context (one TLS connection) pays here.
            self.calls.observe_module_cold(site, counted, cpu_ns);
        } else {
            self.calls.observe_module(site, counted);
            // 0: the thread's clock could not be read (or did not move).
            if cpu_ns > 0 {
                self.calls.observe_module_cpu(site, cpu_ns);
            }
        }
    }

    /// Adds a context's in-line counts to the shared counters.
    pub fn flush(&self, local: &mut LocalCounts) {
        if local.calls > 0 {
            self.cpu.add(local.calls, local.bytes, 0);
        }
        *local = LocalCounts::default();
    }

    /// Counts one in-line call in a context's own counters.
    pub fn count_cpu(&self, local: &mut LocalCounts, bytes: usize) {
        local.calls += 1;
        local.bytes += bytes as u64;
        if local.calls >= FLUSH_EVERY {
            self.flush(local);
        }
    }

    /// What the router measured, one line per call site: the evidence behind its
    /// choices (written after the summary when `HETCRYPT_PROVIDER_TRACE` is set).
    pub fn trace(&self) -> String {
        let timeline = self
            .timeline
            .as_ref()
            .and_then(|t| t.lines.lock().ok().map(|l| l.join("\n") + "\n"))
            .unwrap_or_default();
        let kernel = match self.calls.kernel_share() {
            Some(share) => format!(
                "{:.2} ns per ns of the callers' CPU in module calls",
                f64::from(share) / f64::from(KERNEL_SHARE_UNIT)
            ),
            None => "not measured (wall time decides)".into(),
        };
        let busy = format!(
            "  CPUs busy {:.1}% (last sample); kernel threads {kernel}\n",
            f64::from(self.calls.busy()) / 10.0
        );
        let sites =
            self.calls
                .estimates()
                .into_iter()
                .map(|(alg, enc, len, cpu, module, module_cpu)| {
                    format!(
                        "  {} {} from {len} B: in-line {:.1} us, module {:.1} us \
                     ({:.1} us of it the caller's CPU)\n",
                        OFFERED[alg].0.to_string_lossy(),
                        if enc { "encrypt" } else { "decrypt" },
                        cpu as f64 / 1e3,
                        module as f64 / 1e3,
                        module_cpu as f64 / 1e3
                    )
                });
        std::iter::once(busy)
            .chain(sites)
            .chain(std::iter::once(timeline))
            .collect()
    }

    /// The one-line summary: what each engine carried.
    pub fn summary(&self, mode: RouterMode) -> String {
        let (cc, cb, _) = self.cpu.read();
        let (mc, mb, mns) = self.module_counter.read();
        let module = match (&self.module, &self.no_module) {
            (Some(m), _) => {
                let state = if m.quarantined.load(Ordering::Relaxed) {
                    " (quarantined)"
                } else {
                    ""
                };
                format!(
                    "{}{state}: {mc} calls, {mb} bytes, busy {:.3} s",
                    m.name,
                    mns as f64 / 1e9
                )
            }
            (None, Some(why)) => format!("module {why}"),
            (None, None) => "no module".into(),
        };
        let trials = match (mode, &self.module) {
            (RouterMode::Balanced, Some(_)) => {
                let (_, ran, won) = self.calls.trials();
                format!("; trials {ran} (the module won {won})")
            }
            _ => String::new(),
        };
        format!(
            "hetcrypt provider: policy {}; cpu (in-line): {cc} calls, {cb} bytes; {module}; fail-overs {}{trials}; calibration {}",
            mode.name(),
            self.failovers.load(Ordering::Relaxed),
            self.calibration
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The run delay is `schedstat`'s second field for the calling thread, read as the
    /// file says it between two reads of it.
    #[test]
    fn the_run_delay_is_this_thread_s_schedstat() {
        let read = || {
            std::fs::read_to_string("/proc/thread-self/schedstat")
                .ok()
                .and_then(|s| crate::load::run_delay(&s))
        };
        let Some(before) = read() else {
            // A kernel without CONFIG_SCHED_INFO: the router reads nothing either.
            assert_eq!(run_delay_ns(), None);
            return;
        };
        let got = run_delay_ns().expect("the file was just read");
        let after = read().expect("the file was just read");
        assert!((before..=after).contains(&got), "{before} {got} {after}");
    }

    /// A 1 KiB record in the soft guest: 0.15 ms on the thread's CPU clock, 3.2 ms of
    /// wall time because `wrk` ran meanwhile: the CPU time is the cost.
    #[test]
    fn an_in_line_call_costs_its_thread_cpu_time_not_its_wall_time() {
        assert_eq!(in_line_cost(3_200_000, 150_000, false), 150_000);
        // No CPU clock, or one that did not move: the wall time.
        assert_eq!(in_line_cost(3_200_000, 150_000, true), 3_200_000);
        assert_eq!(in_line_cost(40, 0, false), 40);
        // Never above the wall time (clocks of different steps).
        assert_eq!(in_line_cost(100, 120, false), 100);
        assert_eq!(in_line_cost(0, 5, false), 1);
    }

    /// A balanced router with the in-line CPU only (no module is configured).
    fn balanced_without_module() -> Router {
        Router::new(&Config {
            engines: vec!["cpu".into()],
            mode: RouterMode::Balanced,
            threshold: None,
            stats: None,
            calibration: None,
        })
    }

    /// A thread's calls reach the router's byte total at its trial ticks, every
    /// TRIAL_TICK_EVERY calls; without a module nothing is counted or ticked.
    #[test]
    fn a_thread_s_bytes_reach_the_trial_at_its_ticks() {
        let r = balanced_without_module();
        assert!(r.module.is_none());
        for _ in 0..3 * TRIAL_TICK_EVERY {
            let _ = r.choose(0, true, 100);
        }
        assert_eq!(r.carried.load(Ordering::Relaxed), 0, "no module: no trials");
        // A fresh thread: the calls before its first tick stay its own.
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 1..TRIAL_TICK_EVERY {
                    r.tick_trial(100);
                }
                assert_eq!(r.carried.load(Ordering::Relaxed), 0);
                r.tick_trial(100);
                let tick = u64::from(TRIAL_TICK_EVERY) * 100;
                assert_eq!(r.carried.load(Ordering::Relaxed), tick);
                for _ in 0..TRIAL_TICK_EVERY {
                    r.tick_trial(50);
                }
                assert_eq!(r.carried.load(Ordering::Relaxed), tick + tick / 2);
            });
        });
    }

    /// The nineteenth session's loaded soft guest (docs/https.md): a 16 KiB record took
    /// 2.7 ms in-line and 5.8 ms of wall time on the module, 4.0 ms of that nginx
    /// waiting on the run queue of the guest's one vCPU while `wrk` ran, 0.3 ms nginx's
    /// own CPU, the kernel 1.5 ns per ns of that on its threads; every CPU busy. Counted
    /// by its wall time the module looked dearer than in-line and the records went
    /// in-line; with the waiting beyond the kernel's work taken off (2.25 ms) they stay
    /// on the module. The readings are `schedstat` as the kernel writes it.
    #[test]
    fn a_module_call_s_run_queue_wait_does_not_send_records_in_line() {
        use crate::load::run_delay;
        use hetcrypt::policy::call::FULL_LOAD;
        let site = CallSite {
            cipher: 0,
            encrypt: true,
            len: 16_432,
        };
        let router = || {
            let r = balanced_without_module();
            for _ in 0..8 {
                r.calls.observe_cpu(site, 2_700_000);
            }
            r.calls.set_busy(FULL_LOAD);
            r.calls.set_kernel_share(1500);
            r
        };
        let on_module = |r: &Router| {
            (0..1024)
                .filter(|_| !matches!(r.calls.route(site), Route::Cpu { .. }))
                .count()
        };
        let before = run_delay("812345678 1000000000 5000\n");
        let after = run_delay("812645678 1004000000 5004\n");
        let delay = after.zip(before).map(|(a, b)| a - b);
        assert_eq!(delay, Some(4_000_000));
        let r = router();
        for _ in 0..8 {
            r.observe_module_call(site, false, false, 5_800_000, 300_000, delay);
        }
        assert_eq!(r.calls.costs(site), (2_700_000, 1_125_000));
        let n = on_module(&r);
        assert!(n >= 900, "{n} of 1024 to the module");
        // Without the readings, the wall time as it was: in-line.
        let r = router();
        for _ in 0..8 {
            r.observe_module_call(site, false, false, 5_800_000, 300_000, None);
        }
        assert_eq!(r.calls.costs(site), (2_700_000, 2_900_000));
        let n = on_module(&r);
        assert!(n <= 128, "{n} of 1024 to the module");
        // A key's first call counts the same way.
        let r = router();
        for _ in 0..8 {
            r.observe_module_call(site, false, true, 5_800_000, 300_000, delay);
        }
        assert_eq!(r.calls.costs(site).1, 1_125_000);
        // A lane opened for the call teaches nothing.
        let r = router();
        r.observe_module_call(site, true, false, 5_800_000, 300_000, delay);
        assert_eq!(r.calls.costs(site).1, 0);
    }

    #[test]
    fn a_start_reads_both_clocks() {
        let s = Started::now();
        let busy: u64 = (0..200_000u64).fold(0, |a, x| a ^ x.wrapping_mul(2_654_435_761));
        assert_ne!(busy, 1);
        assert!(s.wall.elapsed().as_nanos() > 0);
        if !s.cpu.is_zero() {
            assert!(thread_cpu_time() > s.cpu);
        }
    }
}
