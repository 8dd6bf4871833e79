//! Per-call routing for callers that hand over one buffer at a time (the OpenSSL
//! provider): run it in-line on the calling thread, or on a crypto module's lane.
//!
//! Pure decision logic over measured costs: each call site (cipher, direction, size
//! class) keeps a moving average of what a call cost in-line and on the module, and
//! the cheaper one takes the call. The in-line path never waits, so the router only
//! ever makes a call wait for a module lane when the module is far cheaper.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// How a router decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterMode {
    /// By measured cost, per call site (and a size threshold before anything is known).
    Balanced,
    /// Everything in-line on the CPU.
    Cpu,
    /// Everything the module takes goes to the module, waiting for a lane if need be.
    Module,
}

impl RouterMode {
    /// The name used in configuration and reports.
    pub fn name(self) -> &'static str {
        match self {
            RouterMode::Balanced => "balanced",
            RouterMode::Cpu => "cpu",
            RouterMode::Module => "module",
        }
    }
}

/// One call to route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallSite {
    /// The caller's index of the cipher (below the router's cipher count).
    pub cipher: usize,
    /// Encryption (else decryption).
    pub encrypt: bool,
    /// Bytes in the call.
    pub len: usize,
}

/// Where a call goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// In-line; `timed`: measure it and report it with [`CallRouter::observe_cpu`].
    Cpu {
        /// Whether to time the call.
        timed: bool,
    },
    /// To a module lane if one is free now, else in-line (timed if `else_timed`).
    ModuleIfFree {
        /// Whether to time the call if it runs in-line.
        else_timed: bool,
    },
    /// To a module lane, waiting for one if all are busy.
    Module,
}

/// Size classes: powers of two, the last one open-ended (1 MiB and up behave alike).
const CLASSES: usize = 21;
/// In-line calls timed when nothing calls for a measurement: one in this many (a
/// clock read costs about as much as a 16-byte AES call).
const SAMPLE_EVERY: u32 = 8;
/// The engine a site does not prefer is tried again once in this many calls, so a
/// change of the machine (a busy CPU, a slower module) is noticed.
const RECHECK_EVERY: u32 = 256;
/// Weight of a new sample in the moving average: 1/8 follows a change within a few
/// dozen calls and smooths one-off stalls.
const EWMA_SHIFT: u32 = 3;
/// A call waits for a busy module lane only when the module is this many times
/// cheaper than the CPU: waiting costs up to one module call per lane ahead.
const WAIT_FACTOR: u64 = 2;

thread_local! {
    /// Per-thread call count for sampling: no shared counter on the hot path.
    static TICK: Cell<u32> = const { Cell::new(0) };
}

fn tick() -> u32 {
    TICK.with(|t| {
        let v = t.get().wrapping_add(1);
        t.set(v);
        v
    })
}

#[derive(Default)]
struct Estimate {
    /// Moving average of one call's cost in ns, in-line; 0 until measured.
    cpu: AtomicU64,
    /// The same on the module.
    module: AtomicU64,
}

/// The per-call router: measured costs per call site and the rule that uses them.
pub struct CallRouter {
    mode: RouterMode,
    ciphers: usize,
    threshold: Option<usize>,
    estimates: Vec<Estimate>,
}

fn class(len: usize) -> usize {
    ((usize::BITS - len.leading_zeros()) as usize).min(CLASSES - 1)
}

fn fold(slot: &AtomicU64, ns: u64) {
    let ns = ns.max(1);
    let old = slot.load(Ordering::Relaxed);
    let new = if old == 0 {
        ns
    } else {
        old - (old >> EWMA_SHIFT) + (ns >> EWMA_SHIFT)
    };
    slot.store(new.max(1), Ordering::Relaxed);
}

impl CallRouter {
    /// A router for `ciphers` cipher indices. `threshold`: before the module's cost
    /// at a size is known, calls of at least this many bytes try it first (and
    /// smaller ones only now and then); `None` tries it once at every size.
    pub fn new(mode: RouterMode, ciphers: usize, _lanes: usize, threshold: Option<usize>) -> Self {
        CallRouter {
            mode,
            ciphers,
            threshold,
            estimates: (0..ciphers * 2 * CLASSES)
                .map(|_| Estimate::default())
                .collect(),
        }
    }

    /// The mode.
    pub fn mode(&self) -> RouterMode {
        self.mode
    }

    fn estimate(&self, site: CallSite) -> &Estimate {
        let i = (site.cipher.min(self.ciphers - 1) * 2 + usize::from(!site.encrypt)) * CLASSES
            + class(site.len);
        &self.estimates[i]
    }

    /// Where this call goes (the caller knows the module can take it).
    pub fn route(&self, site: CallSite) -> Route {
        match self.mode {
            RouterMode::Cpu => return Route::Cpu { timed: false },
            RouterMode::Module => return Route::Module,
            RouterMode::Balanced => {}
        }
        let e = self.estimate(site);
        let (cpu, module) = (
            e.cpu.load(Ordering::Relaxed),
            e.module.load(Ordering::Relaxed),
        );
        let t = tick();
        if cpu == 0 {
            // Measure the in-line cost first: it never waits.
            return Route::Cpu { timed: true };
        }
        if module == 0 {
            let hopeful = self.threshold.is_none_or(|x| site.len >= x);
            return if hopeful || t.is_multiple_of(RECHECK_EVERY) {
                Route::ModuleIfFree { else_timed: true }
            } else {
                Route::Cpu {
                    timed: t.is_multiple_of(SAMPLE_EVERY),
                }
            };
        }
        if module < cpu {
            if t.is_multiple_of(RECHECK_EVERY) {
                return Route::Cpu { timed: true };
            }
            if cpu > module.saturating_mul(WAIT_FACTOR) {
                Route::Module
            } else {
                Route::ModuleIfFree {
                    else_timed: t.is_multiple_of(SAMPLE_EVERY),
                }
            }
        } else if t.is_multiple_of(RECHECK_EVERY) {
            Route::ModuleIfFree { else_timed: true }
        } else {
            Route::Cpu {
                timed: t.is_multiple_of(SAMPLE_EVERY),
            }
        }
    }

    /// Reports a timed in-line call.
    pub fn observe_cpu(&self, site: CallSite, ns: u64) {
        fold(&self.estimate(site).cpu, ns);
    }

    /// Reports a module call.
    pub fn observe_module(&self, site: CallSite, ns: u64) {
        fold(&self.estimate(site).module, ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(len: usize) -> CallSite {
        CallSite {
            cipher: 0,
            encrypt: true,
            len,
        }
    }

    /// Routes `n` calls and counts how many went (or would try to go) to the module.
    fn module_share(r: &CallRouter, len: usize, n: u32) -> u32 {
        (0..n)
            .filter(|_| !matches!(r.route(site(len)), Route::Cpu { .. }))
            .count() as u32
    }

    #[test]
    fn fixed_modes_never_look_at_costs() {
        let cpu = CallRouter::new(RouterMode::Cpu, 1, 1, None);
        cpu.observe_module(site(16384), 1);
        assert_eq!(cpu.route(site(16384)), Route::Cpu { timed: false });
        let module = CallRouter::new(RouterMode::Module, 1, 1, None);
        module.observe_cpu(site(16), 1);
        assert_eq!(module.route(site(16)), Route::Module);
    }

    #[test]
    fn the_cpu_is_measured_first_then_the_module_is_tried() {
        let r = CallRouter::new(RouterMode::Balanced, 1, 1, None);
        assert_eq!(r.route(site(4096)), Route::Cpu { timed: true });
        r.observe_cpu(site(4096), 10_000);
        assert_eq!(
            r.route(site(4096)),
            Route::ModuleIfFree { else_timed: true }
        );
    }

    #[test]
    fn each_size_goes_where_it_was_measured_cheaper() {
        let r = CallRouter::new(RouterMode::Balanced, 1, 1, None);
        // The seeds' shape: the CPU wins small calls, the module large ones.
        r.observe_cpu(site(16), 2_000);
        r.observe_module(site(16), 180_000);
        r.observe_cpu(site(16384), 3_500_000);
        r.observe_module(site(16384), 360_000);
        let small = module_share(&r, 16, 1024);
        let large = module_share(&r, 16384, 1024);
        assert!(
            small <= 1024 / RECHECK_EVERY + 1,
            "16 B went to the module {small} times"
        );
        assert!(
            large >= 1024 - 1024 / RECHECK_EVERY - 1,
            "16 KiB went to the module only {large} times"
        );
        // Far cheaper on the module: a call waits for a lane rather than run in-line.
        assert!((0..16).any(|_| r.route(site(16384)) == Route::Module));
    }

    #[test]
    fn a_module_only_somewhat_cheaper_is_used_only_when_a_lane_is_free() {
        let r = CallRouter::new(RouterMode::Balanced, 1, 1, None);
        r.observe_cpu(site(2048), 150_000);
        r.observe_module(site(2048), 100_000);
        assert!((0..1024).all(|_| r.route(site(2048)) != Route::Module));
    }

    #[test]
    fn a_change_of_the_machine_is_noticed() {
        let r = CallRouter::new(RouterMode::Balanced, 1, 1, None);
        r.observe_cpu(site(8192), 1_000_000);
        r.observe_module(site(8192), 200_000);
        assert!(module_share(&r, 8192, 256) > 200);
        // The module slows down tenfold: the moving average follows within a few
        // dozen observations and the calls come back in-line.
        for _ in 0..64 {
            r.observe_module(site(8192), 2_000_000);
        }
        assert!(module_share(&r, 8192, 256) < 8);
    }

    #[test]
    fn a_threshold_steers_the_first_calls_before_anything_is_measured_on_the_module() {
        let r = CallRouter::new(RouterMode::Balanced, 1, 1, Some(1024));
        r.observe_cpu(site(64), 1_000);
        r.observe_cpu(site(4096), 60_000);
        assert!(module_share(&r, 64, 512) <= 512 / RECHECK_EVERY + 1);
        assert_eq!(
            r.route(site(4096)),
            Route::ModuleIfFree { else_timed: true }
        );
    }

    #[test]
    fn directions_and_ciphers_keep_separate_estimates() {
        let r = CallRouter::new(RouterMode::Balanced, 2, 1, None);
        let enc = CallSite {
            cipher: 1,
            encrypt: true,
            len: 4096,
        };
        let dec = CallSite {
            cipher: 1,
            encrypt: false,
            len: 4096,
        };
        r.observe_cpu(enc, 5);
        assert_eq!(
            r.route(dec),
            Route::Cpu { timed: true },
            "decryption is not measured yet"
        );
        assert_eq!(
            r.route(CallSite { cipher: 0, ..enc }),
            Route::Cpu { timed: true }
        );
    }
}
