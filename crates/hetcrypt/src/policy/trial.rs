//! Trials for the per-call router: the module for every call against the rule, by rate.
//!
//! On a saturated machine: whether sending every call the module takes to it serves
//! more bytes a second than the per-call rule does, measured by running both in turn.
//!
//! The per-call rule weighs what one call costs (in-line CPU time against a module
//! call's CPU and wall time). That misses what a blocking module call changes around
//! it: in the `soft` testbed guest (one vCPU) with 1 KiB TLS records, the rule kept
//! every record in-line (~0.3 ms each, against ~0.4 ms of the caller's CPU and more
//! of the kernel's on the module), yet nginx with every record on the module served
//! more requests, its own CPU per request ~1 ms lower (docs/https.md,
//! twenty-seventh session): while the worker sleeps on the device, the client's
//! requests gather, and each wake-up of either serves more of them. No per-call
//! cost shows that; the rate of the whole does. So where the rule keeps calls
//! in-line that the module might carry ([`TRIAL_FACTOR`]) and every CPU is busy
//! (the rate then measures capacity, not the offered load), windows of the two ways
//! alternate, and the faster one is held for a while.
//!
//! Pure logic: the caller reports the time, the bytes carried so far and the load;
//! [`Trial::arm`] says how to route now.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::Mutex;

/// How calls are routed now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    /// By the per-call rule.
    Rule,
    /// Every call the module takes to the module (as the `module` mode routes).
    Module,
}

/// Load (per mille of all CPUs busy) from which a trial may start and go on: below
/// it the rate follows the offered load, whichever way calls go, and tells nothing.
/// A 100-ms sample holds ten ticks of `/proc/stat` per CPU, so one idle tick reads
/// 900 or 909 on one CPU: still saturated (at 950, such samples ended trials in the
/// soft guest's first tries).
pub const TRIAL_BUSY: u32 = 850;
/// A site's calls that the rule keeps in-line count as the module's to try where its
/// per-call cost is within this factor of the in-line one. The soft guest's 1 KiB
/// records, where the module served more, read 2.1x by the `module` nginx's steady
/// calls and up to 3.7x by the `balanced` nginx's few checks (their wall time 2.1-2.3
/// ms after a pause, against ~0.6 ms fed steadily; twenty-seventh session). The aesni
/// guest's 1 KiB records fall within it too, and their trials lose (the pair rule);
/// a module dearer still is never tried, and its machine never pays for a trial's
/// module windows.
pub const TRIAL_FACTOR: u64 = 8;
/// One window of a trial, ns: long enough for dozens of 1 KiB responses on the soft
/// guest (~200 a second), short enough that a trial ends within two seconds.
pub const WINDOW_NS: u64 = 250_000_000;
/// Pairs of windows (the rule's, then the module's) the module must win to be held,
/// and pairs it may lose before the rule is: three before two, at most four pairs.
/// One window of 250 ms is noisy: in the soft guest at 1 KiB, where `module` served
/// ~1.3x `default`, the module won all of three pairs in 5 of 6 trials in one sitting
/// and in 1 of 4 in another (twenty-eighth session, `docs/https.md`). By a per-pair
/// win chance of 0.6-0.9 there, three before two holds it 1.7-1.2x as often as three
/// of three (0.53-0.95 against 0.22-0.73); in the aesni guest, where a pair's chance
/// is lower than 0.3, it still holds it in under one trial in ten (three of three:
/// under three in a hundred), before the sums' margin.
const PAIRS_TO_WIN: u8 = 3;
/// See [`PAIRS_TO_WIN`].
const PAIRS_TO_LOSE: u8 = 2;
/// The most windows a trial takes.
pub const WINDOWS: u8 = 2 * (PAIRS_TO_WIN + PAIRS_TO_LOSE - 1);
/// The module must serve this much faster (1/32, ~3%) to be held: a near tie keeps the
/// rule, which frees the module for other callers.
const MARGIN_SHIFT: u32 = 5;
/// How long a trial's outcome is held before the next trial, ns: a trial's module
/// windows cost up to half their rate where the module loses, so trials stay a
/// small part of the time (at most 1 s in 30 s; where the module loses the first two
/// pairs, the trial ends there, after 1 s, half of it on the module).
pub const HOLD_NS: u64 = 30_000_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// No trial: the rule routes.
    Idle,
    /// Window `n` of a trial, started at `start` with `bytes` carried.
    Window { n: u8, start: u64, bytes: u64 },
    /// A trial's outcome, held until `until`.
    Hold { arm: Arm, until: u64 },
}

impl Phase {
    /// How calls are routed in this phase.
    fn arm(self) -> Arm {
        match self {
            Phase::Idle => Arm::Rule,
            Phase::Window { n, .. } => arm_of(n),
            Phase::Hold { arm, .. } => arm,
        }
    }
}

#[derive(Debug)]
struct State {
    phase: Phase,
    /// Bytes and ns of the finished windows, per way (rule, module).
    sums: [(u64, u64); 2],
    /// The last rule window's bytes and ns, which the module window after it must beat.
    last_rule: (u64, u64),
    /// Pairs of windows the module won and lost so far.
    pairs: [u8; 2],
}

/// A router's trials: see the module's documentation.
#[derive(Debug)]
pub struct Trial {
    state: Mutex<State>,
    /// The way calls are routed now (0: the rule, 1: the module), read on every call:
    /// the phase's [`Phase::arm`], kept outside the lock.
    arm: AtomicU8,
    /// Whether the rule kept a call in-line that the module might carry since the
    /// last look ([`TRIAL_FACTOR`]).
    close: AtomicBool,
    /// Trials run to their end, and how many of them the module won.
    outcomes: [AtomicU32; 2],
}

impl Default for Trial {
    fn default() -> Self {
        Trial {
            state: Mutex::new(State {
                phase: Phase::Idle,
                sums: [(0, 0); 2],
                last_rule: (0, 0),
                pairs: [0, 0],
            }),
            arm: AtomicU8::new(0),
            close: AtomicBool::new(false),
            outcomes: [AtomicU32::new(0), AtomicU32::new(0)],
        }
    }
}

fn arm_of(n: u8) -> Arm {
    if n.is_multiple_of(2) {
        Arm::Rule
    } else {
        Arm::Module
    }
}

impl Trial {
    /// How to route a call now.
    pub fn arm(&self) -> Arm {
        match self.arm.load(Ordering::Relaxed) {
            0 => Arm::Rule,
            _ => Arm::Module,
        }
    }

    /// Notes that the rule kept a call in-line at a site where the module's per-call
    /// cost `module` is within [`TRIAL_FACTOR`] of the in-line `cpu`.
    pub fn saw_in_line(&self, cpu: u64, module: u64) {
        if module <= cpu.saturating_mul(TRIAL_FACTOR) && !self.close.load(Ordering::Relaxed) {
            self.close.store(true, Ordering::Relaxed);
        }
    }

    /// Trials run to their end so far, and how many the module won.
    pub fn outcomes(&self) -> (u32, u32) {
        (
            self.outcomes[0].load(Ordering::Relaxed),
            self.outcomes[1].load(Ordering::Relaxed),
        )
    }

    /// Moves the trial on: `now` in ns on any monotonic clock, `bytes` carried so far
    /// (every call's, a running total), `busy` the load as last sampled (per mille).
    /// Returns how to route from now on. Another caller ticking meanwhile: nothing.
    pub fn tick(&self, now: u64, bytes: u64, busy: u32) -> Arm {
        let Ok(mut st) = self.state.try_lock() else {
            return self.arm();
        };
        let saturated = busy >= TRIAL_BUSY;
        match st.phase {
            Phase::Idle => {
                if saturated && self.close.swap(false, Ordering::Relaxed) {
                    st.sums = [(0, 0); 2];
                    st.pairs = [0, 0];
                    st.phase = Phase::Window {
                        n: 0,
                        start: now,
                        bytes,
                    };
                }
            }
            Phase::Window {
                n,
                start,
                bytes: b0,
            } => {
                if !saturated {
                    // The rate now follows the offered load: no evidence either way.
                    // Another trial may start as soon as the machine is saturated
                    // again (while it is not, how calls go costs no throughput).
                    st.phase = Phase::Idle;
                } else if now.saturating_sub(start) >= WINDOW_NS {
                    let way = usize::from(arm_of(n) == Arm::Module);
                    let window = (bytes.saturating_sub(b0), now - start);
                    st.sums[way].0 += window.0;
                    st.sums[way].1 += window.1;
                    if way == 0 {
                        st.last_rule = window;
                    } else {
                        let lost = !faster([st.last_rule, window], 0);
                        st.pairs[usize::from(lost)] += 1;
                    }
                    let [won, lost] = st.pairs;
                    if won < PAIRS_TO_WIN && lost < PAIRS_TO_LOSE {
                        st.phase = Phase::Window {
                            n: n + 1,
                            start: now,
                            bytes,
                        };
                    } else {
                        let arm = if won == PAIRS_TO_WIN && faster(st.sums, MARGIN_SHIFT) {
                            Arm::Module
                        } else {
                            Arm::Rule
                        };
                        self.outcomes[0].fetch_add(1, Ordering::Relaxed);
                        if arm == Arm::Module {
                            self.outcomes[1].fetch_add(1, Ordering::Relaxed);
                        }
                        st.phase = Phase::Hold {
                            arm,
                            until: now.saturating_add(HOLD_NS),
                        };
                    }
                }
            }
            Phase::Hold { until, .. } => {
                if now >= until {
                    st.phase = Phase::Idle;
                    self.close.store(false, Ordering::Relaxed);
                }
            }
        }
        let arm = st.phase.arm();
        self.arm
            .store(u8::from(arm == Arm::Module), Ordering::Relaxed);
        arm
    }
}

/// Whether the module's `(bytes, ns)` (second) carried more bytes a second than the
/// rule's (first), by more than 1/2^`shift` of the rule's rate (`shift` 0: at all).
/// The module is held only where it wins every pair of windows and the sums by
/// [`MARGIN_SHIFT`]: in the aesni guest, where `module` served 0.85 of `default` at
/// 1 KiB, 250-ms windows alone (summed, at 1/32) held the module in 2 of 4 trials
/// (twenty-seventh session).
fn faster([(rule_bytes, rule_ns), (module_bytes, module_ns)]: [(u64, u64); 2], shift: u32) -> bool {
    let rule = u128::from(rule_bytes) * u128::from(module_ns);
    let margin = if shift == 0 { 0 } else { rule >> shift };
    // module/module_ns > rule/rule_ns * (1 + margin), cross-multiplied.
    u128::from(module_bytes) * u128::from(rule_ns) > rule + margin
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A trial whose router has kept a call in-line at a site where the module costs
    /// about twice as much (the soft guest's 1 KiB records): the next saturated tick
    /// starts a trial.
    fn close_site() -> Trial {
        let t = Trial::default();
        t.saw_in_line(300, 640);
        t
    }

    /// Runs a trial to its end at `busy`, the rule's windows carrying `rule` bytes a
    /// ms and the module's `module`; returns the outcome and the ways the windows
    /// used.
    fn run(t: &Trial, start: u64, rule: u64, module: u64, busy: u32) -> (Arm, Vec<Arm>) {
        let mut now = start;
        let mut bytes = 0;
        let mut ways = Vec::new();
        let mut arm = t.tick(now, bytes, busy);
        let mut last = None;
        for _ in 0..(u64::from(WINDOWS) * WINDOW_NS / MS + 10) {
            if let Phase::Window { n, .. } = t.state.lock().unwrap().phase {
                if last != Some(n) {
                    ways.push(arm);
                    last = Some(n);
                }
            }
            now += MS;
            bytes += if arm == Arm::Module { module } else { rule };
            arm = t.tick(now, bytes, busy);
        }
        (arm, ways)
    }

    #[test]
    fn a_faster_module_is_held_after_alternating_windows() {
        let t = close_site();
        let (arm, ways) = run(&t, 0, 100, 115, 1000);
        assert_eq!(arm, Arm::Module);
        assert_eq!(t.outcomes(), (1, 1));
        assert_eq!(
            ways,
            [
                Arm::Rule,
                Arm::Module,
                Arm::Rule,
                Arm::Module,
                Arm::Rule,
                Arm::Module
            ]
        );
        // Held: every tick routes to the module until the hold ends.
        assert_eq!(t.tick(10_000 * MS, 0, 1000), Arm::Module);
        assert_eq!(t.tick(HOLD_NS + 2_000 * MS, 0, 1000), Arm::Rule);
    }

    #[test]
    fn a_slower_or_barely_faster_module_leaves_the_rule() {
        for module in [60, 100, 102] {
            let t = close_site();
            assert_eq!(
                run(&t, 0, 100, module, 1000).0,
                Arm::Rule,
                "module {module}"
            );
            assert_eq!(t.outcomes(), (1, 0));
            assert!(matches!(t.state.lock().unwrap().phase, Phase::Hold { .. }));
        }
    }

    #[test]
    fn no_trial_without_a_close_site_or_below_full_load() {
        let t = Trial::default();
        t.saw_in_line(30, 640);
        t.saw_in_line(300, 300 * TRIAL_FACTOR + 1);
        assert_eq!(t.tick(0, 0, 1000), Arm::Rule);
        assert_eq!(t.state.lock().unwrap().phase, Phase::Idle);
        t.saw_in_line(300, 640);
        assert_eq!(t.tick(0, 0, TRIAL_BUSY - 1), Arm::Rule);
        assert_eq!(t.state.lock().unwrap().phase, Phase::Idle);
        assert!(matches!(t.tick(MS, 0, TRIAL_BUSY), Arm::Rule));
        assert!(matches!(
            t.state.lock().unwrap().phase,
            Phase::Window { n: 0, .. }
        ));
    }

    #[test]
    fn a_drop_in_load_ends_a_trial_and_the_next_starts_when_saturated_again() {
        let t = close_site();
        t.tick(0, 0, 1000);
        assert_eq!(t.tick(WINDOW_NS, 1000, 1000), Arm::Module, "second window");
        // One idle tick in a 100-ms sample is still saturated.
        assert_eq!(t.tick(WINDOW_NS + MS, 1000, 900), Arm::Module);
        assert_eq!(t.tick(WINDOW_NS + 2 * MS, 1000, 500), Arm::Rule);
        assert_eq!(t.state.lock().unwrap().phase, Phase::Idle);
        // Not before the rule again keeps a close site in-line.
        assert_eq!(t.tick(WINDOW_NS + 3 * MS, 1000, 1000), Arm::Rule);
        assert_eq!(t.state.lock().unwrap().phase, Phase::Idle);
        t.saw_in_line(300, 640);
        t.tick(WINDOW_NS + 4 * MS, 1000, 1000);
        assert!(matches!(
            t.state.lock().unwrap().phase,
            Phase::Window { n: 0, .. }
        ));
    }

    #[test]
    fn the_margin_is_a_thirty_second() {
        let ns = WINDOW_NS * 3;
        assert!(!faster([(3200, ns), (3300, ns)], MARGIN_SHIFT));
        assert!(faster([(3200, ns), (3301, ns)], MARGIN_SHIFT));
        assert!(faster([(3200, ns), (3201, ns)], 0));
        assert!(!faster([(3200, ns), (3200, ns)], 0));
        // Rates, not totals: the module's windows ran longer.
        assert!(!faster([(3200, ns), (3400, 2 * ns)], MARGIN_SHIFT));
    }

    /// Runs windows of the given rates (bytes a ms, in window order) at full load;
    /// returns the way calls go after them.
    fn windows(t: &Trial, rates: &[u64]) -> Arm {
        let (mut now, mut bytes) = (0, 0);
        let mut arm = t.tick(now, bytes, 1000);
        for rate in rates {
            for _ in 0..WINDOW_NS / MS {
                now += MS;
                bytes += rate;
                arm = t.tick(now, bytes, 1000);
            }
        }
        arm
    }

    /// The module is held where it wins three pairs before it loses two, and its
    /// windows together beat the rule's by the margin.
    #[test]
    fn the_module_must_win_three_pairs_before_it_loses_two() {
        // Won, lost, won, won; the sums 400 against 440.
        let t = close_site();
        let rates = [100, 120, 100, 90, 100, 115, 100, 115];
        assert_eq!(rates.len(), usize::from(WINDOWS));
        assert_eq!(windows(&t, &rates), Arm::Module);
        assert_eq!(t.outcomes(), (1, 1));
        // Three pairs won, but one lost by so much that the sums (400 against 405)
        // are within the margin: the rule.
        let t = close_site();
        assert_eq!(
            windows(&t, &[100, 110, 100, 75, 100, 110, 100, 110]),
            Arm::Rule,
            "three pairs won, the sums within 1/32"
        );
        assert_eq!(t.outcomes(), (1, 0));
    }

    /// Two pairs the module loses end the trial there: the outcome is decided, and the
    /// windows left would only cost where the module is the slower.
    #[test]
    fn two_lost_pairs_end_the_trial_at_once() {
        let t = close_site();
        let (arm, ways) = run(&t, 0, 100, 90, 1000);
        assert_eq!(arm, Arm::Rule);
        assert_eq!(ways, [Arm::Rule, Arm::Module, Arm::Rule, Arm::Module]);
        assert_eq!(t.outcomes(), (1, 0));
        // Won by far, then lost twice: the sums (300 against 340) favour the module,
        // the pairs do not.
        let t = close_site();
        assert_eq!(windows(&t, &[100, 150, 100, 95, 100, 95]), Arm::Rule);
        assert_eq!(t.outcomes(), (1, 0));
        assert!(matches!(
            t.state.lock().unwrap().phase,
            Phase::Hold { arm: Arm::Rule, .. }
        ));
    }
}
