//! Per-call routing for callers that hand over one buffer at a time (the OpenSSL
//! provider): run it in-line on the calling thread, or on a crypto module's lane.
//!
//! Pure decision logic over measured costs: each call site (cipher, direction, size
//! class) keeps a moving average of what a call cost in-line and on the module, and
//! the cheaper one takes the call. The in-line path never waits, so the router only
//! ever makes a call wait for a module lane when the module is far cheaper.
//!
//! A module call costs its caller wall time but only some CPU: while it waits, the CPU
//! runs other work (seed 004's point). So when the machine's CPUs are busy (the caller
//! reports how busy, [`CallRouter::set_busy`]), the module's cost counts as the CPU it
//! takes in proportion: at full load a module call that is a little slower than an
//! in-line one still wins, because the CPU it leaves to others is what limits the
//! machine; on an idle machine wall time decides, as it did before. The CPU a module
//! call takes is its caller's CPU time *and* the kernel's work for it on other
//! threads (a driver's request thread, the device's emulation), which the caller
//! reports as a share of its own ([`CallRouter::set_kernel_share`]): where that work
//! fills the whole wait (the testbed guest's one vCPU at 1 KiB), no CPU is freed.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::trial::{Arm, Trial};

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
/// clock read costs about as much as a 16-byte AES call)...
const SAMPLE_EVERY: u32 = 32;
/// ...until the site's in-line average has this many samples (the first sample then
/// weighs under 2% in it, at the slower weight 1/8)...
const SETTLED_AFTER: u32 = 32;
/// ...and one in this many after: a timed call reads the thread's CPU clock twice, a
/// system call each (`CLOCK_THREAD_CPUTIME_ID` has no vDSO path; ~20 us apiece in the
/// soft guest under emulation, 108 calls in 6 s of nginx's worker at 1 KiB). A site
/// taking 1,000 calls a second still gets four samples a second, and the average
/// follows a change within a few seconds.
const SETTLED_SAMPLE_EVERY: u32 = 256;
/// A site's first in-line samples, of which the smallest is the estimate; while only
/// a keyed module cost is known (see `Estimate::module_cold`), calls stay in-line and
/// timed until there are this many. The first call at a size carries one-off costs
/// (page faults, lazy binding, and under emulation translating the code): 5.4 ms for
/// a 48-byte TLS Finished record in the soft guest against ~60-200 us after. A site
/// that sees one call per TLS connection then sent its calls to the module (~3 ms a
/// keyed call) and timed one in-line call in dozens of connections: most of a 4-s
/// run went by before the first call was forgotten.
const WARM_SAMPLES: u32 = 4;
/// Before the module's cost at a size is known, calls below the threshold try it once
/// in this many calls.
const RECHECK_EVERY: u32 = 256;
/// The engine a site does not prefer is tried again now and then, so a change of the
/// machine (a busy CPU, a slower module) is noticed: rarely enough that what the checks
/// cost *beyond* the preferred engine is at most about 1/EXPLORE_SHARE of the time (a
/// 16-byte call on a module costs ~100 in-line calls: checking it every 256 calls would
/// halve the throughput)...
const EXPLORE_SHARE: u64 = 64;
/// ...and at least this many calls apart. Where the two engines cost about the same a
/// check costs next to nothing, so the gap falls to this floor and a site that one
/// device stall pushed in-line comes back within a few dozen calls: with 16 KiB TLS
/// records in the soft guest, a floor of 256 kept 1 MiB responses on the CPU for half
/// a second after each stall.
const MIN_GAP: u64 = 4 * BURST as u64;
/// The longest gap between checks, in calls.
const RECHECK_MAX: u32 = 1 << 20;
/// Weight of a new sample that is higher than the average: 1/8 follows a slowdown
/// within a few dozen calls and smooths one-off stalls.
const SLOWER_SHIFT: u32 = 3;
/// Weight of a new sample that is lower: 1/2. A module's first calls after an idle
/// spell are slow (seen in the virtio-crypto guest: ~0.9 ms a call after a pause,
/// ~17 us a call at 256 B when fed steadily), so its steady cost shows only after a
/// few calls in a row and the average must reach it within a burst.
const FASTER_SHIFT: u32 = 1;
/// Calls in a row sent to the module when it is (re)checked, so the check measures
/// its steady cost rather than its wake-up.
const BURST: u32 = 8;
/// A call waits for a busy module lane only when the module is this many times
/// cheaper than the CPU (in wall time): waiting costs up to one module call per lane
/// ahead.
const WAIT_FACTOR: u64 = 2;
/// Full load in [`CallRouter::set_busy`]'s unit (per mille of all CPUs' time busy).
pub const FULL_LOAD: u32 = 1000;
/// However busy the CPUs, a module call counts at least 1/MAX_LOAD_CREDIT of its wall
/// time: its caller still waits for it, and a caller whose calls come one after
/// another (a single nginx worker) waits for each in turn, so a module several times
/// slower than in-line must not win just because the CPU it leaves is busy.
const MAX_LOAD_CREDIT: u64 = 2;
/// [`CallRouter::set_kernel_share`]'s unit: the kernel's CPU time for module calls on
/// threads other than the caller's, per this much of the callers' own CPU time in them
/// (per mille: 1300 means 1.3 ns of kernel-thread time per ns of the caller's).
pub const KERNEL_SHARE_UNIT: u32 = 1000;
/// The largest kernel share taken as reported (64x the caller's CPU time): a window
/// with a few module calls and some unrelated kernel work can report an absurd share;
/// beyond this the module is dear at every size anyway.
pub const MAX_KERNEL_SHARE: u32 = 64 * KERNEL_SHARE_UNIT;
/// The kernel share before any is reported: not known, so no load credit (a module
/// call counts its wall time however busy the CPUs). The kernel's work for a module
/// call can fill its whole wait (the soft guest at 1 KiB); until the caller has
/// measured it, freed CPU is not assumed.
const SHARE_UNKNOWN: u32 = u32::MAX;

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
    /// The same on the module, in wall time.
    module: AtomicU64,
    /// The same for a key's first call on the module, which sets the key up on the
    /// device first (a session per key: several times a steady call in the soft
    /// guest). Only used while `module` is 0: a site whose every module call is some
    /// key's first (a TLS connection's Finished record, one per connection) would
    /// otherwise never learn a cost and would check the module on every call.
    module_cold: AtomicU64,
    /// The caller's CPU time in such a call (as `module_cpu` for steady calls): a
    /// busy machine counts a keyed call by the CPU it takes too, or a 16 KiB record
    /// that the module carries better even with its key set up (a handshake per
    /// request in the loaded soft guest) would stay in-line.
    module_cold_cpu: AtomicU64,
    /// The caller's CPU time per module call (system calls, copies), where reported;
    /// 0: not known, and the module's cost is its wall time whatever the load.
    module_cpu: AtomicU64,
    /// Calls still to send to the module in the current check.
    burst: AtomicU32,
    /// In-line samples taken, up to [`SETTLED_AFTER`].
    cpu_samples: AtomicU32,
}

impl Estimate {
    /// One in how many in-line calls is timed at this site now.
    fn sample_every(&self) -> u32 {
        if self.cpu_samples.load(Ordering::Relaxed) >= SETTLED_AFTER {
            SETTLED_SAMPLE_EVERY
        } else {
            SAMPLE_EVERY
        }
    }
}

/// The per-call router: measured costs per call site and the rule that uses them.
pub struct CallRouter {
    mode: RouterMode,
    ciphers: usize,
    threshold: Option<usize>,
    estimates: Vec<Estimate>,
    /// How busy the machine's CPUs were lately, per mille ([`FULL_LOAD`]: all busy).
    busy: AtomicU32,
    /// The kernel's CPU time for module calls on other threads, per
    /// [`KERNEL_SHARE_UNIT`] of the callers' CPU time in them ([`SHARE_UNKNOWN`]: none
    /// reported yet).
    kernel_share: AtomicU32,
    /// Whether the module, given every call it takes, serves more than the rule.
    trial: Trial,
}

/// Calls between checks of the engine a site does not prefer (a power of two, so the
/// check is a mask): a check costing `extra` ns more than the preferred engine would
/// for the same calls, where a call costs `call` ns in the preferred engine, comes once
/// in about EXPLORE_SHARE * extra / call calls.
fn recheck_gap(extra: u64, call: u64) -> u32 {
    let gap = EXPLORE_SHARE.saturating_mul(extra) / call.max(1);
    gap.clamp(MIN_GAP, u64::from(RECHECK_MAX))
        .next_power_of_two()
        .min(u64::from(RECHECK_MAX)) as u32
}

fn class(len: usize) -> usize {
    ((usize::BITS - len.leading_zeros()) as usize).min(CLASSES - 1)
}

/// A sample counts at most this many times the current average: one call stalled by
/// the host (a descheduled device thread took 20 ms once in the guest, against a
/// steady 0.24 ms) must not swing a site over to the other engine for thousands of
/// calls; a real slowdown still shows within a few dozen samples.
const OUTLIER_CAP: u64 = 2;

fn fold(slot: &AtomicU64, ns: u64) {
    let old = slot.load(Ordering::Relaxed);
    let ns = match old {
        0 => ns.max(1),
        _ => ns.clamp(1, old.saturating_mul(OUTLIER_CAP)),
    };
    let new = if old == 0 {
        ns
    } else if ns < old {
        old - (old >> FASTER_SHIFT) + (ns >> FASTER_SHIFT)
    } else {
        old - (old >> SLOWER_SHIFT) + (ns >> SLOWER_SHIFT)
    };
    slot.store(new.max(1), Ordering::Relaxed);
}

/// A module call's wall time as the router weighs it: the time its caller spent
/// waiting on a run queue during the call (`run_delay_ns`, the growth of
/// `/proc/thread-self/schedstat`'s second field across it) taken off, as the in-line
/// cost leaves preemption out by counting thread CPU time. On the soft guest's one
/// vCPU with `wrk` beside nginx, 68-71% of the 16 KiB module calls' wall time was such
/// waiting (docs/https.md, nineteenth session): a busy machine made the module look
/// dearer than it is, and records went in-line.
///
/// Not all of the waiting is other work's, though: the module's own kernel work
/// (crypto_engine's request thread runs at real-time priority, the device's emulation
/// on the same vCPU) can hold the caller off its CPU too, and that is part of what a
/// module call takes even on an idle machine. At most the kernel's work for the call,
/// the caller's CPU time times the kernel share (`kernel_share`, per
/// [`KERNEL_SHARE_UNIT`]), is left in; where the share is not known yet (`None`),
/// nothing is taken off (wall time decides until then anyway). The result is never
/// below the caller's own CPU time in the call (wall time is that, the waiting and the
/// sleep on the device: less can only be clocks that disagree) nor above the wall time.
pub fn wall_less_waits(
    wall_ns: u64,
    run_delay_ns: u64,
    cpu_ns: u64,
    kernel_share: Option<u32>,
) -> u64 {
    let Some(share) = kernel_share else {
        return wall_ns;
    };
    let kernel = cpu_ns.saturating_mul(u64::from(share)) / u64::from(KERNEL_SHARE_UNIT);
    let others = run_delay_ns.saturating_sub(kernel);
    wall_ns.saturating_sub(others).max(cpu_ns.min(wall_ns))
}

impl CallRouter {
    /// A router for `ciphers` cipher indices. `threshold`: before the module's cost
    /// at a size is known, calls of at least this many bytes try it first (and
    /// smaller ones only now and then); `None` tries it once at every size.
    pub fn new(mode: RouterMode, ciphers: usize, threshold: Option<usize>) -> Self {
        CallRouter {
            mode,
            ciphers,
            threshold,
            estimates: (0..ciphers * 2 * CLASSES)
                .map(|_| Estimate::default())
                .collect(),
            busy: AtomicU32::new(0),
            kernel_share: AtomicU32::new(SHARE_UNKNOWN),
            trial: Trial::default(),
        }
    }

    /// Moves the balanced mode's trial on ([`Trial::tick`]): `now_ns` on a monotonic
    /// clock, `bytes` carried through the router's caller so far (every call's), at
    /// the load last reported ([`Self::set_busy`]). The caller ticks it every few
    /// calls; [`Self::route`] follows its outcome.
    pub fn tick_trial(&self, now_ns: u64, bytes: u64) -> Arm {
        self.trial.tick(now_ns, bytes, self.busy())
    }

    /// The balanced mode's trials: how calls are routed now, and how many trials ran
    /// to their end and the module won ([`Trial::outcomes`]).
    pub fn trials(&self) -> (Arm, u32, u32) {
        let (ran, module) = self.trial.outcomes();
        (self.trial.arm(), ran, module)
    }

    /// The kernel share as last reported (per [`KERNEL_SHARE_UNIT`]); `None` before
    /// any report.
    pub fn kernel_share(&self) -> Option<u32> {
        let share = self.kernel_share.load(Ordering::Relaxed);
        (share != SHARE_UNKNOWN).then_some(share)
    }

    /// [`wall_less_waits`] with the kernel share as last reported: what a module call
    /// of `wall_ns` counts for, its caller having waited `run_delay_ns` on a run queue
    /// and spent `cpu_ns` of its own CPU in it.
    pub fn wall_less_waits(&self, wall_ns: u64, run_delay_ns: u64, cpu_ns: u64) -> u64 {
        wall_less_waits(wall_ns, run_delay_ns, cpu_ns, self.kernel_share())
    }

    /// Reports how much CPU time the kernel spent on other threads for module calls
    /// lately, per [`KERNEL_SHARE_UNIT`] of the CPU time their callers spent in them
    /// (clamped to 64 units): a module call's whole CPU cost is its caller's CPU
    /// time times `1 + share / KERNEL_SHARE_UNIT`.
    pub fn set_kernel_share(&self, per_unit: u32) {
        self.kernel_share
            .store(per_unit.min(MAX_KERNEL_SHARE), Ordering::Relaxed);
    }

    /// How busy the machine's CPUs were, as last reported (per mille).
    pub fn busy(&self) -> u32 {
        self.busy.load(Ordering::Relaxed)
    }

    /// Reports how busy the machine's CPUs were lately, per mille of their time
    /// (clamped to [`FULL_LOAD`]): the share of a module call's wall time that counts
    /// as CPU time given to other work.
    pub fn set_busy(&self, per_mille: u32) {
        self.busy.store(per_mille.min(FULL_LOAD), Ordering::Relaxed);
    }

    /// What a module call at `e` costs the machine: its wall time on an idle machine,
    /// moving towards the CPU it takes as the CPUs get busy. The CPU it takes is the
    /// caller's CPU time plus the kernel's on other threads ([`Self::set_kernel_share`]);
    /// where that is below the wall time the call frees CPU for others, but counts at
    /// least 1/[`MAX_LOAD_CREDIT`] of its wall time; where it is above (the kernel's
    /// work fills the wait and more), a busy machine pays it all. Before the kernel's
    /// share is reported, or where the caller's CPU time is not, wall time decides.
    fn module_cost(&self, cpu: u64, wall: u64) -> u64 {
        let share = self.kernel_share.load(Ordering::Relaxed);
        if wall == 0 || cpu == 0 || share == SHARE_UNKNOWN {
            return wall;
        }
        let share = u64::from(share);
        let whole = cpu.saturating_add(cpu.saturating_mul(share) / u64::from(KERNEL_SHARE_UNIT));
        let busy = u64::from(self.busy.load(Ordering::Relaxed));
        let full = u64::from(FULL_LOAD);
        if whole >= wall {
            wall.saturating_add((whole - wall).saturating_mul(busy) / full)
        } else {
            (wall - (wall - whole) * busy / full)
                .max(wall / MAX_LOAD_CREDIT)
                .max(1)
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
        if self.trial.arm() == Arm::Module {
            return Route::Module;
        }
        let e = self.estimate(site);
        let cpu = e.cpu.load(Ordering::Relaxed);
        // A key's first call stands in for the module's cost until a steady one is
        // known (the wall time then includes setting the key up).
        let steady = e.module.load(Ordering::Relaxed);
        let keyed_only = steady == 0;
        let wall = if keyed_only {
            e.module_cold.load(Ordering::Relaxed)
        } else {
            steady
        };
        let module_cpu = if keyed_only {
            &e.module_cold_cpu
        } else {
            &e.module_cpu
        };
        let module = self.module_cost(module_cpu.load(Ordering::Relaxed), wall);
        let t = tick();
        if cpu == 0 {
            // Measure the in-line cost first: it never waits.
            return Route::Cpu { timed: true };
        }
        let burst = e.burst.load(Ordering::Relaxed);
        if burst > 0 {
            e.burst.store(burst - 1, Ordering::Relaxed);
            return Route::ModuleIfFree { else_timed: false };
        }
        let check_module = || {
            e.burst.store(BURST - 1, Ordering::Relaxed);
            Route::ModuleIfFree { else_timed: true }
        };
        if module == 0 {
            let hopeful = self.threshold.is_none_or(|x| site.len >= x);
            return if hopeful || t.is_multiple_of(RECHECK_EVERY) {
                check_module()
            } else {
                Route::Cpu {
                    timed: t.is_multiple_of(e.sample_every()),
                }
            };
        }
        if module < cpu {
            if keyed_only && e.cpu_samples.load(Ordering::Relaxed) < WARM_SAMPLES {
                // A young in-line estimate may be one call's one-off costs: measure
                // again before a keyed call (a device session) is preferred to it.
                return Route::Cpu { timed: true };
            }
            if t & (recheck_gap(cpu - module, module) - 1) == 0 {
                return Route::Cpu { timed: true };
            }
            if cpu > wall.saturating_mul(WAIT_FACTOR) {
                Route::Module
            } else {
                Route::ModuleIfFree {
                    else_timed: t.is_multiple_of(e.sample_every()),
                }
            }
        } else if t & (recheck_gap(u64::from(BURST) * (module - cpu), cpu) - 1) == 0 {
            check_module()
        } else {
            self.trial.saw_in_line(cpu, module);
            Route::Cpu {
                timed: t.is_multiple_of(e.sample_every()),
            }
        }
    }

    /// What a call at `site` costs now in-line and on the module, in ns, as [`Self::route`]
    /// weighs them (the module's by the load and the kernel share; 0: not measured).
    pub fn costs(&self, site: CallSite) -> (u64, u64) {
        let e = self.estimate(site);
        let steady = e.module.load(Ordering::Relaxed);
        let (wall, module_cpu) = if steady == 0 {
            (e.module_cold.load(Ordering::Relaxed), &e.module_cold_cpu)
        } else {
            (steady, &e.module_cpu)
        };
        (
            e.cpu.load(Ordering::Relaxed),
            self.module_cost(module_cpu.load(Ordering::Relaxed), wall),
        )
    }

    /// What the router has measured: `(cipher, encrypt, smallest length of the size
    /// class, in-line ns, module ns, module CPU ns)` for every site with a
    /// measurement (0: none).
    pub fn estimates(&self) -> Vec<(usize, bool, usize, u64, u64, u64)> {
        self.estimates
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let (cpu, module, module_cpu) = (
                    e.cpu.load(Ordering::Relaxed),
                    e.module.load(Ordering::Relaxed),
                    e.module_cpu.load(Ordering::Relaxed),
                );
                if cpu == 0 && module == 0 {
                    return None;
                }
                let class = i % CLASSES;
                let site = i / CLASSES;
                let len = if class == 0 { 0 } else { 1usize << (class - 1) };
                Some((
                    site / 2,
                    site.is_multiple_of(2),
                    len,
                    cpu,
                    module,
                    module_cpu,
                ))
            })
            .collect()
    }

    /// Starts a call site from the module's stored cost (the calibration store), so
    /// that no call pays for trying the module where it is hopeless. The in-line cost
    /// is still measured on the first call: it is free to measure, and the store's
    /// `cpu` engine may not be what the caller runs in-line.
    pub fn seed_module(&self, site: CallSite, module_ns: u64) {
        self.estimate(site)
            .module
            .store(module_ns.max(1), Ordering::Relaxed);
    }

    /// The smallest call length of each size class: what a caller seeding the router
    /// asks its store about.
    pub fn class_lengths() -> impl Iterator<Item = usize> {
        (1..CLASSES).map(|c| 1usize << (c - 1))
    }

    /// Reports a timed in-line call.
    pub fn observe_cpu(&self, site: CallSite, ns: u64) {
        let e = self.estimate(site);
        let old = e.cpu.load(Ordering::Relaxed);
        if e.cpu_samples.load(Ordering::Relaxed) < WARM_SAMPLES && old != 0 {
            // One-off costs only ever add: the smallest warm-up sample is the cost.
            e.cpu.store(old.min(ns.max(1)), Ordering::Relaxed);
        } else {
            fold(&e.cpu, ns);
        }
        if e.cpu_samples.load(Ordering::Relaxed) < SETTLED_AFTER {
            e.cpu_samples.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reports a module call's wall time.
    pub fn observe_module(&self, site: CallSite, ns: u64) {
        fold(&self.estimate(site).module, ns);
    }

    /// Reports the wall time of a key's first module call (which set the key up on
    /// the device first) and its caller's CPU time in it (0: not known): what the
    /// module costs at a site where no steady call has been seen, such as one that
    /// only ever sees each key once.
    pub fn observe_module_cold(&self, site: CallSite, ns: u64, cpu_ns: u64) {
        let e = self.estimate(site);
        fold(&e.module_cold, ns);
        if cpu_ns > 0 {
            fold(&e.module_cold_cpu, cpu_ns);
        }
    }

    /// Reports the CPU time the caller's thread spent in a module call (what
    /// [`CallRouter::set_busy`] weighs the module's cost towards).
    pub fn observe_module_cpu(&self, site: CallSite, ns: u64) {
        fold(&self.estimate(site).module_cpu, ns);
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
        let cpu = CallRouter::new(RouterMode::Cpu, 1, None);
        cpu.observe_module(site(16384), 1);
        assert_eq!(cpu.route(site(16384)), Route::Cpu { timed: false });
        let module = CallRouter::new(RouterMode::Module, 1, None);
        module.observe_cpu(site(16), 1);
        assert_eq!(module.route(site(16)), Route::Module);
    }

    /// The soft guest's 16 KiB TLS records (docs/https.md): the module a little slower
    /// in wall time than in-line, but its caller's CPU mostly idle meanwhile. Idle, the
    /// site stays in-line; as the CPUs get busy the module takes it.
    #[test]
    fn a_busy_machine_counts_a_module_call_by_the_cpu_it_takes() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        // The kernel does no work for it on other threads.
        r.set_kernel_share(0);
        r.observe_cpu(site(16384), 1_900_000);
        r.observe_module(site(16384), 2_000_000);
        r.observe_module_cpu(site(16384), 200_000);
        // (Only the checks, a burst of BURST every MIN_GAP calls where the two are
        // this close, go to the module.)
        let idle = module_share(&r, 16384, 1024);
        let checks = 1024 / MIN_GAP as u32 * BURST;
        assert!(idle <= checks, "idle: {idle} of 1024 to the module");
        // Half busy: 2.0 ms - 1.8 ms * 0.5 = 1.1 ms < 1.9 ms.
        r.set_busy(FULL_LOAD / 2);
        assert_eq!(r.busy(), FULL_LOAD / 2);
        let half = module_share(&r, 16384, 1024);
        assert!(
            half >= 1024 - 1024 / MIN_GAP as u32,
            "half busy: {half} of 1024"
        );
        // Busy CPUs keep the module preferred, but never make a call wait for a lane
        // unless it is far cheaper in wall time too.
        r.set_busy(FULL_LOAD);
        assert!((0..1024).all(|_| r.route(site(16384)) != Route::Module));
        // Back to idle: in-line again.
        r.set_busy(0);
        assert_eq!(module_share(&r, 16384, 1024), idle);
    }

    /// The nineteenth session's loaded soft guest (docs/https.md): a 16 KiB record's
    /// module call took 5.8 ms of wall time, 4.0 ms of it nginx waiting on the run
    /// queue while `wrk` ran, 0.3 ms of it nginx's CPU, the kernel doing 1.5 ns per ns
    /// of that on its own threads.
    #[test]
    fn run_queue_waits_beyond_the_kernel_s_own_work_come_off_a_module_call() {
        // 0.45 ms of the wait may be the kernel's work for the call: 3.55 ms come off.
        assert_eq!(
            wall_less_waits(5_800_000, 4_000_000, 300_000, Some(1500)),
            2_250_000
        );
        // The share not known yet: nothing comes off.
        assert_eq!(
            wall_less_waits(5_800_000, 4_000_000, 300_000, None),
            5_800_000
        );
        // A wait the kernel's own work can explain (an idle machine): nothing either.
        assert_eq!(
            wall_less_waits(2_000_000, 400_000, 300_000, Some(1500)),
            2_000_000
        );
        // Never below the caller's CPU time (clocks that disagree), never above the
        // wall time.
        assert_eq!(
            wall_less_waits(1_000_000, 5_000_000, 300_000, Some(0)),
            300_000
        );
        assert_eq!(wall_less_waits(100, 0, 300, Some(0)), 100);
        assert_eq!(
            wall_less_waits(u64::MAX, u64::MAX, u64::MAX, Some(MAX_KERNEL_SHARE)),
            u64::MAX
        );
        // The router's method takes the share as last reported.
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        assert_eq!(r.wall_less_waits(5_800_000, 4_000_000, 300_000), 5_800_000);
        r.set_kernel_share(1500);
        assert_eq!(r.wall_less_waits(5_800_000, 4_000_000, 300_000), 2_250_000);
    }

    /// Load cannot make the module win where even its CPU cost is above the in-line
    /// cost (small calls: system calls cost more than the AES), nor where the caller
    /// never reported the module's CPU time.
    #[test]
    fn load_helps_the_module_only_by_the_cpu_it_frees() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        r.set_kernel_share(0);
        r.set_busy(FULL_LOAD);
        r.observe_cpu(site(256), 1_000);
        r.observe_module(site(256), 17_000);
        r.observe_module_cpu(site(256), 4_000);
        assert!(module_share(&r, 256, 1024) <= 1024 / 8);
        let checks = 1024 / MIN_GAP as u32 * BURST;
        r.observe_cpu(site(16384), 1_900_000);
        r.observe_module(site(16384), 2_000_000);
        assert!(module_share(&r, 16384, 1024) <= checks);
        // Clamped: more than full load counts as full load (the CPU time cannot
        // go below what was reported).
        r.set_busy(10 * FULL_LOAD);
        assert_eq!(r.busy(), FULL_LOAD);
        // A module several times slower in wall time stays out however busy the CPUs
        // (a lone caller would wait for every call): 1.5 ms on the module, 0.1 ms of
        // it CPU, against 0.6 ms in-line.
        r.observe_cpu(site(4096), 600_000);
        r.observe_module(site(4096), 1_500_000);
        r.observe_module_cpu(site(4096), 100_000);
        assert!(module_share(&r, 4096, 1024) <= 1024 / 8);
        r.observe_module_cpu(site(16384), 1_950_000);
        assert!(module_share(&r, 16384, 1024) <= checks);
    }

    /// The soft guest's 1 KiB TLS records: 0.3 ms in-line; on the module 0.465 ms of
    /// wall time, 0.2 ms of it the caller's CPU. Counted by the caller's CPU alone a
    /// busy machine sends them to the module (0.23 ms, half the wall time); but the
    /// kernel spends 1.3 ns on its own threads (crypto_engine's, the device's
    /// emulation) per ns of the caller's, so a call takes 0.46 ms of CPU, nearly its
    /// whole wall time, and frees nothing: the calls stay in-line.
    #[test]
    fn a_module_call_whose_whole_cpu_cost_exceeds_in_line_stays_in_line() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        r.set_busy(FULL_LOAD);
        r.observe_cpu(site(1024), 300_000);
        r.observe_module(site(1024), 465_000);
        r.observe_module_cpu(site(1024), 200_000);
        let checks = 1024 / MIN_GAP as u32 * BURST;
        // Before the kernel's share is known, wall time decides: in-line.
        assert_eq!(r.kernel_share(), None);
        assert!(module_share(&r, 1024, 1024) <= checks);
        r.set_kernel_share(0);
        assert!(
            module_share(&r, 1024, 1024) >= 1024 - 1024 / MIN_GAP as u32,
            "the caller's CPU alone makes the module cheaper"
        );
        r.set_kernel_share(1300);
        assert_eq!(r.kernel_share(), Some(1300));
        let share = module_share(&r, 1024, 1024);
        assert!(share <= checks, "{share} of 1024 went to the module");
        // Kernel work beyond the wait costs more than the wall time on a busy
        // machine: 3 ms of CPU against 1 ms of wall time loses to 2 ms in-line.
        r.observe_cpu(site(4096), 2_000_000);
        r.observe_module(site(4096), 1_000_000);
        r.observe_module_cpu(site(4096), 1_000_000);
        r.set_kernel_share(2000);
        assert!(module_share(&r, 4096, 1024) <= checks);
    }

    /// The soft guest's 1 KiB records (twenty-seventh session's trace): 300 us in-line;
    /// 700 us on the module, 400 us of it the caller's CPU, and the kernel's 0.6 ns per
    /// ns: the rule keeps them in-line, and being within TRIAL_FACTOR it starts a
    /// trial on a busy machine; while the trial's module windows run, and while a
    /// module win is held, every call goes to the module as in the module mode.
    #[test]
    fn a_trial_the_module_wins_routes_every_call_to_it() {
        use super::super::trial::{HOLD_NS, WINDOWS, WINDOW_NS};
        // A busy machine's router whose 1 KiB calls cost `cpu_ns` in-line.
        let router = |cpu_ns| {
            let r = CallRouter::new(RouterMode::Balanced, 1, None);
            r.set_busy(FULL_LOAD);
            r.set_kernel_share(600);
            r.observe_cpu(site(1024), cpu_ns);
            r.observe_module(site(1024), 700_000);
            r.observe_module_cpu(site(1024), 400_000);
            r
        };
        let r = router(300_000);
        assert!(module_share(&r, 1024, 1024) <= 1024 / MIN_GAP as u32 * BURST);
        // The module's windows carry 1.2x the bytes a ms.
        let (mut now, mut bytes) = (0, 0);
        let mut arm = r.tick_trial(now, bytes);
        for _ in 0..u64::from(WINDOWS) * WINDOW_NS / 1_000_000 + 1 {
            if arm == Arm::Module {
                assert_eq!(r.route(site(1024)), Route::Module);
            }
            now += 1_000_000;
            bytes += if arm == Arm::Module { 1_200 } else { 1_000 };
            arm = r.tick_trial(now, bytes);
        }
        assert_eq!(r.trials(), (Arm::Module, 1, 1));
        assert_eq!(module_share(&r, 1024, 1024), 1024, "held on the module");
        assert_eq!(r.tick_trial(now + HOLD_NS, bytes), Arm::Rule);
        // A module far dearer (a CPU with AES instructions: 30 us in-line) is never
        // tried.
        let r = router(30_000);
        module_share(&r, 1024, 1024);
        assert_eq!(r.tick_trial(0, 0), Arm::Rule);
        assert_eq!(r.tick_trial(WINDOW_NS, 1), Arm::Rule);
        assert_eq!(r.trials(), (Arm::Rule, 0, 0));
    }

    /// 16 KiB records: 1.85 ms in-line, 1.0 ms on the module of which 0.6 ms the
    /// caller's CPU; with the kernel's 1.3 ns per ns a call takes 1.38 ms of CPU, more
    /// than its wall time, and still well below in-line: the module keeps them, busy
    /// machine or idle.
    #[test]
    fn large_records_stay_on_the_module_when_the_kernel_work_is_counted() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        r.set_kernel_share(1300);
        r.observe_cpu(site(16384), 1_850_000);
        r.observe_module(site(16384), 1_000_000);
        r.observe_module_cpu(site(16384), 600_000);
        for busy in [0, FULL_LOAD / 2, FULL_LOAD] {
            r.set_busy(busy);
            let share = module_share(&r, 16384, 1024);
            assert!(
                share >= 1024 - 1024 / MIN_GAP as u32,
                "busy {busy}: {share} of 1024"
            );
        }
    }

    /// On an idle machine wall time decides, whatever the kernel's share: the CPU the
    /// kernel takes is spare there. As the CPUs fill up the cost moves to the whole
    /// CPU time, in proportion.
    #[test]
    fn the_kernel_share_counts_in_proportion_to_the_load() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        // 0.5 ms in-line; 0.465 ms on the module, 0.2 ms the caller's, 5 ns of the
        // kernel's per ns: 1.2 ms of CPU a call.
        r.set_kernel_share(5000);
        r.observe_cpu(site(2048), 500_000);
        r.observe_module(site(2048), 465_000);
        r.observe_module_cpu(site(2048), 200_000);
        let checks = 1024 / MIN_GAP as u32 * BURST;
        r.set_busy(0);
        assert!(module_share(&r, 2048, 1024) >= 1024 - 1024 / MIN_GAP as u32);
        // 5% busy: 465 + 0.05 * 735 = 502 us > 500 us.
        r.set_busy(FULL_LOAD / 20);
        assert!(module_share(&r, 2048, 1024) <= checks);
        // Without the kernel's share the same load leaves the module cheaper.
        r.set_kernel_share(0);
        assert!(module_share(&r, 2048, 1024) >= 1024 - 1024 / MIN_GAP as u32);
    }

    /// A report of the kernel share is clamped (a window with few module calls and
    /// unrelated kernel work can report any share).
    #[test]
    fn the_kernel_share_is_clamped() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        r.set_kernel_share(u32::MAX);
        assert_eq!(r.kernel_share(), Some(MAX_KERNEL_SHARE));
        r.set_busy(FULL_LOAD);
        r.observe_cpu(site(1024), 1_000_000);
        r.observe_module(site(1024), 1_000);
        r.observe_module_cpu(site(1024), u64::MAX / 2);
        // No overflow: the cost saturates and the calls stay in-line.
        assert!(module_share(&r, 1024, 1024) <= 1024 / MIN_GAP as u32 * BURST);
    }

    /// Where the module is only a little cheaper, a check of the in-line cost costs
    /// little beyond it, so checks come at the floor's pace: exactly one call in
    /// MIN_GAP (a mask of the call count).
    #[test]
    fn checks_of_a_slightly_dearer_engine_come_every_min_gap_calls() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        r.observe_cpu(site(8192), 1_100_000);
        r.observe_module(site(8192), 1_000_000);
        let in_line = 1024 - module_share(&r, 8192, 1024);
        assert_eq!(in_line, 1024 / MIN_GAP as u32);
    }

    /// A tie goes in-line: the in-line path never waits for a lane. The module then
    /// gets only its checks, a burst of BURST every MIN_GAP calls.
    #[test]
    fn a_tie_stays_in_line() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        r.observe_cpu(site(8192), 1_000_000);
        r.observe_module(site(8192), 1_000_000);
        // (The last burst may be cut short by the end of the count.)
        let share = module_share(&r, 8192, 1024);
        let bursts = 1024 / MIN_GAP as u32 * BURST;
        assert!((bursts - BURST..=bursts).contains(&share), "{share}");
    }

    #[test]
    fn the_cpu_is_measured_first_then_the_module_is_tried() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        assert_eq!(r.route(site(4096)), Route::Cpu { timed: true });
        r.observe_cpu(site(4096), 10_000);
        assert_eq!(
            r.route(site(4096)),
            Route::ModuleIfFree { else_timed: true }
        );
    }

    #[test]
    fn each_size_goes_where_it_was_measured_cheaper() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        // The seeds' shape: the CPU wins small calls, the module large ones.
        r.observe_cpu(site(16), 2_000);
        r.observe_module(site(16), 180_000);
        r.observe_cpu(site(16384), 3_500_000);
        r.observe_module(site(16384), 360_000);
        let small = module_share(&r, 16, 1024);
        let large = module_share(&r, 16384, 1024);
        let checks = BURST;
        assert!(small <= checks, "16 B went to the module {small} times");
        assert!(
            large >= 1024 - 1024 / RECHECK_EVERY - 1,
            "16 KiB went to the module only {large} times"
        );
        // Far cheaper on the module: a call waits for a lane rather than run in-line.
        assert!((0..16).any(|_| r.route(site(16384)) == Route::Module));
    }

    #[test]
    fn checks_of_a_far_slower_engine_cost_a_bounded_share_of_the_time() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        r.observe_cpu(site(16), 1_600);
        r.observe_module(site(16), 200_000);
        let n = 1 << 18;
        let tried = module_share(&r, 16, n);
        let spent = u64::from(tried) * 200_000;
        let total = u64::from(n - tried) * 1_600 + spent;
        assert!(tried >= BURST, "the module is still checked now and then");
        assert!(spent * 20 <= total, "checks took {spent} of {total} ns");
    }

    #[test]
    fn a_module_only_somewhat_cheaper_is_used_only_when_a_lane_is_free() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        r.observe_cpu(site(2048), 150_000);
        r.observe_module(site(2048), 100_000);
        assert!((0..1024).all(|_| r.route(site(2048)) != Route::Module));
    }

    #[test]
    fn a_change_of_the_machine_is_noticed() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        r.observe_cpu(site(8192), 1_000_000);
        r.observe_module(site(8192), 200_000);
        assert!(module_share(&r, 8192, 256) > 200);
        // The module slows down tenfold: the moving average follows within a few
        // dozen observations and the calls come back in-line.
        for _ in 0..64 {
            r.observe_module(site(8192), 2_000_000);
        }
        assert!(module_share(&r, 8192, 256) <= 2 * BURST);
    }

    #[test]
    fn a_site_pushed_in_line_by_a_stall_comes_back_within_a_few_dozen_calls() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        // 16 KiB records in the soft guest: ~1.9 ms in-line; a run of stalls left the
        // module's average just above the CPU's.
        r.observe_cpu(site(16384), 1_900_000);
        r.observe_module(site(16384), 2_000_000);
        // A check costs little more than the calls it replaces: it comes soon (the
        // old gap, 64 checks' worth of the module's whole cost, was 1024 calls).
        let tried = module_share(&r, 16384, 2 * MIN_GAP as u32);
        assert!(tried >= BURST, "the module was tried {tried} times");
        // The steady cost it shows then brings the site back.
        for _ in 0..BURST {
            r.observe_module(site(16384), 250_000);
        }
        assert!(module_share(&r, 16384, 64) >= 60);
    }

    #[test]
    fn a_threshold_steers_the_first_calls_before_anything_is_measured_on_the_module() {
        let r = CallRouter::new(RouterMode::Balanced, 1, Some(1024));
        r.observe_cpu(site(64), 1_000);
        r.observe_cpu(site(4096), 60_000);
        assert!(module_share(&r, 64, 512) <= (512 / RECHECK_EVERY + 1) * BURST);
        assert_eq!(
            r.route(site(4096)),
            Route::ModuleIfFree { else_timed: true }
        );
    }

    #[test]
    fn a_check_of_the_module_is_a_burst_so_its_wake_up_does_not_decide() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        r.observe_cpu(site(256), 32_000);
        assert_eq!(r.route(site(256)), Route::ModuleIfFree { else_timed: true });
        // The first call after an idle spell is slow, the next ones are steady.
        r.observe_module(site(256), 900_000);
        for _ in 1..BURST {
            assert_eq!(
                r.route(site(256)),
                Route::ModuleIfFree { else_timed: false }
            );
            r.observe_module(site(256), 17_000);
        }
        // The steady cost decides: the module is cheaper here.
        assert!(module_share(&r, 256, 64) >= 60);
    }

    /// `Connection: close` in the soft guest: each TLS connection's Finished record
    /// is its write key's first (and only) call at that size, so every module call
    /// there sets a key up (a device session, ~3 ms against ~30 us in-line). Those
    /// calls' cost is learnt, and the site stays in-line after one check; a steady
    /// cost, once seen, still takes over.
    #[test]
    fn a_site_that_only_sees_each_key_once_learns_the_keyed_cost() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        r.observe_cpu(site(64), 30_000);
        let mut tried = 0;
        for _ in 0..4096 {
            if !matches!(r.route(site(64)), Route::Cpu { .. }) {
                tried += 1;
                r.observe_module_cold(site(64), 3_000_000, 0);
            }
        }
        assert!(
            tried <= 2 * BURST,
            "a key set up {tried} times in 4096 calls"
        );
        // Steady calls cheaper than in-line: they decide, not the keyed ones.
        for _ in 0..BURST {
            r.observe_module(site(64), 10_000);
        }
        assert!(module_share(&r, 64, 64) >= 60);
    }

    /// A 16 KiB record per connection: each module call sets a key up (3 ms of wall
    /// time, 0.3 ms of it the caller's CPU) against 1.9 ms in-line. Idle, in-line
    /// wins; with every CPU busy the keyed call counts by the CPU it takes (at least
    /// half its wall time) and the module wins, as steady calls do.
    #[test]
    fn a_busy_machine_counts_a_keyed_call_by_the_cpu_it_takes() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        r.set_kernel_share(0);
        for _ in 0..WARM_SAMPLES {
            r.observe_cpu(site(16384), 1_900_000);
        }
        r.observe_module_cold(site(16384), 3_000_000, 300_000);
        assert!(module_share(&r, 16384, 1024) <= 2 * BURST, "idle");
        r.set_busy(FULL_LOAD);
        let busy = module_share(&r, 16384, 1024);
        assert!(busy >= 1024 - 1024 / MIN_GAP as u32, "busy: {busy} of 1024");
    }

    /// The first in-line call at a size in the soft guest: 5.4 ms, against ~60 us
    /// for the next ones. The next calls are timed, and the first one is forgotten.
    #[test]
    fn a_first_in_line_call_slowed_by_one_off_costs_is_forgotten_within_a_few_calls() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        assert_eq!(r.route(site(48)), Route::Cpu { timed: true });
        r.observe_cpu(site(48), 5_400_000);
        // The module was tried once and cost a keyed call's 3 ms.
        r.observe_module_cold(site(48), 3_000_000, 0);
        // The keyed call is not preferred on one in-line sample: the next call is
        // timed in-line, and the smallest sample is the estimate.
        assert_eq!(r.route(site(48)), Route::Cpu { timed: true });
        r.observe_cpu(site(48), 60_000);
        assert_eq!(r.estimates()[0].3, 60_000, "the steady in-line cost");
        assert_eq!(module_share(&r, 48, 1024), 0, "no keyed module calls");
    }

    #[test]
    fn a_seeded_module_cost_decides_right_after_the_first_in_line_call() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        r.seed_module(site(16384), 250_000);
        r.seed_module(site(64), 160_000);
        // One in-line call measures the CPU; no burst of trial calls on the module.
        assert_eq!(r.route(site(16384)), Route::Cpu { timed: true });
        r.observe_cpu(site(16384), 1_900_000);
        assert_eq!(r.route(site(16384)), Route::Module);
        assert_eq!(r.route(site(64)), Route::Cpu { timed: true });
        r.observe_cpu(site(64), 7_000);
        assert_eq!(
            module_share(&r, 64, 200),
            0,
            "the stored cost rules the module out"
        );
    }

    #[test]
    fn one_stalled_call_does_not_move_a_site_but_a_lasting_slowdown_does() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        r.observe_cpu(site(16384), 1_900_000);
        r.observe_module(site(16384), 240_000);
        r.observe_module(site(16384), 20_000_000);
        assert!(
            module_share(&r, 16384, 64) >= 60,
            "one stall moved the site"
        );
        for _ in 0..40 {
            r.observe_module(site(16384), 20_000_000);
        }
        assert!(
            module_share(&r, 16384, 256) <= 2 * BURST,
            "a lasting slowdown was not followed"
        );
    }

    /// The moving average: the first sample as is, then half-way towards a lower one
    /// (FASTER_SHIFT) and an eighth of the way towards a higher one (SLOWER_SHIFT),
    /// a higher one capped at OUTLIER_CAP times the average, and never 0.
    #[test]
    fn the_average_moves_half_way_down_an_eighth_up_and_caps_outliers() {
        let slot = AtomicU64::new(0);
        let after = |ns: u64| {
            fold(&slot, ns);
            slot.load(Ordering::Relaxed)
        };
        assert_eq!(after(100), 100, "the first sample");
        assert_eq!(after(40), 100 - 50 + 20, "half-way down");
        assert_eq!(after(70), 70, "equal: unchanged");
        assert_eq!(after(120), 70 - 8 + 15, "an eighth up");
        assert_eq!(after(1_000_000), 77 - 9 + 19, "capped at twice the average");
        let zero = AtomicU64::new(0);
        fold(&zero, 0);
        assert_eq!(
            zero.load(Ordering::Relaxed),
            1,
            "never 0: 0 means unmeasured"
        );
        fold(&zero, 0);
        assert_eq!(zero.load(Ordering::Relaxed), 1);
    }

    /// What the router reports having measured: each site with a cost, by cipher,
    /// direction and the smallest length of its size class, in site order; a cipher
    /// index past the router's count shares the last cipher's sites.
    #[test]
    fn estimates_list_every_measured_site_with_its_class() {
        let r = CallRouter::new(RouterMode::Balanced, 3, None);
        let at = |cipher, encrypt, len| CallSite {
            cipher,
            encrypt,
            len,
        };
        assert!(r.estimates().is_empty(), "nothing measured");
        r.observe_cpu(at(2, false, 3000), 500);
        r.seed_module(at(1, true, 0), 700);
        r.observe_module(at(0, true, 1), 30);
        r.observe_module_cpu(at(0, true, 1), 4);
        r.observe_cpu(at(7, true, 1 << 30), 9);
        assert_eq!(
            r.estimates(),
            [
                (0, true, 1, 0, 30, 4),
                (1, true, 0, 0, 700, 0),
                (2, true, 1 << 19, 9, 0, 0),
                (2, false, 2048, 500, 0, 0),
            ]
        );
        let lengths: Vec<usize> = CallRouter::class_lengths().collect();
        assert_eq!(lengths.len(), CLASSES - 1);
        assert_eq!(lengths[..4], [1, 2, 4, 8]);
        assert_eq!(lengths.last(), Some(&(1 << 19)));
        assert!(lengths.windows(2).all(|w| w[1] == 2 * w[0]));
    }

    /// A check of an unmeasured module is one timed call and BURST - 1 untimed ones
    /// sent its way, then a new check: the burst counts down and ends.
    #[test]
    fn a_burst_of_module_calls_counts_down_and_ends() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        r.observe_cpu(site(4096), 1000);
        for round in 0..2 {
            assert_eq!(
                r.route(site(4096)),
                Route::ModuleIfFree { else_timed: true },
                "round {round}: a check starts"
            );
            for call in 1..BURST {
                assert_eq!(
                    r.route(site(4096)),
                    Route::ModuleIfFree { else_timed: false },
                    "round {round}: call {call} of the burst"
                );
            }
        }
    }

    /// A module exactly WAIT_FACTOR times cheaper is not yet worth waiting for: its
    /// calls go to a free lane or stay in-line, never wait.
    #[test]
    fn a_module_exactly_twice_as_cheap_is_not_waited_for() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        r.observe_cpu(site(4096), 2000);
        r.seed_module(site(4096), 2000 / WAIT_FACTOR);
        assert!((0..1000).all(|_| r.route(site(4096)) != Route::Module));
        r.seed_module(site(4096), 2000 / WAIT_FACTOR - 1);
        assert!((0..1000).any(|_| r.route(site(4096)) == Route::Module));
    }

    #[test]
    fn modes_are_named_as_the_configuration_spells_them() {
        assert_eq!(RouterMode::Balanced.name(), "balanced");
        assert_eq!(RouterMode::Cpu.name(), "cpu");
        assert_eq!(RouterMode::Module.name(), "module");
    }

    #[test]
    fn huge_calls_share_the_last_size_class_and_touch_no_other_site() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        r.observe_cpu(site(1 << 30), 5_000_000);
        // The last class: 1 MiB and 1 GiB calls are one site...
        assert_ne!(r.route(site(1 << 20)), Route::Cpu { timed: true });
        // ...and the next site (decryption of tiny calls) is still unmeasured.
        for len in [0, 1] {
            let tiny_decrypt = CallSite {
                cipher: 0,
                encrypt: false,
                len,
            };
            assert_eq!(r.route(tiny_decrypt), Route::Cpu { timed: true });
        }
    }

    #[test]
    fn directions_and_ciphers_keep_separate_estimates() {
        let r = CallRouter::new(RouterMode::Balanced, 2, None);
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

    /// In-line calls are timed one in SAMPLE_EVERY while a site's in-line average is
    /// young, one in SETTLED_SAMPLE_EVERY once it has SETTLED_AFTER samples; calls that
    /// check an engine are timed whatever the rate.
    #[test]
    fn in_line_timing_thins_out_once_the_estimate_has_settled() {
        let r = CallRouter::new(RouterMode::Balanced, 1, None);
        // The module far dearer: its checks come once in 2^16 calls at most.
        r.observe_cpu(site(1024), 100_000);
        r.observe_module(site(1024), 10_000_000);
        let timed = |n: u32| {
            (0..n)
                .filter(|_| r.route(site(1024)) == Route::Cpu { timed: true })
                .count() as u32
        };
        let n = 64 * SETTLED_SAMPLE_EVERY;
        // (One module check may fall in the run and take one timed slot.)
        let young = timed(n);
        assert!(
            (n / SAMPLE_EVERY - 1..=n / SAMPLE_EVERY).contains(&young),
            "{young} of {n} timed"
        );
        for _ in 1..SETTLED_AFTER {
            r.observe_cpu(site(1024), 100_000);
        }
        let settled = timed(n);
        assert!(
            (n / SETTLED_SAMPLE_EVERY - 1..=n / SETTLED_SAMPLE_EVERY).contains(&settled),
            "{settled} of {n} timed"
        );
        // Another size class is young still.
        r.observe_cpu(site(64), 1_000);
        r.observe_module(site(64), 10_000_000);
        let other = (0..n)
            .filter(|_| r.route(site(64)) == Route::Cpu { timed: true })
            .count() as u32;
        assert!(other >= n / SAMPLE_EVERY - 1, "{other} of {n} timed");
    }
}
