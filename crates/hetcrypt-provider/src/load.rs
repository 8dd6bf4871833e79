//! How busy the machine's CPUs are (from `/proc/stat`): what the router weighs a
//! module call's cost by.
//!
//! Written here rather than taken from a crate: the router needs one number (the share
//! of all CPUs' time not idle since the last sample), read a few times a second from
//! calls that already read the clock; `procfs` and `sysinfo` parse far more.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use hetcrypt::policy::call::FULL_LOAD;

/// How often the load is sampled at most: often enough to follow a benchmark that
/// starts or stops within a second, rarely enough that reading `/proc/stat` (a few
/// microseconds) is lost among the calls.
pub const PERIOD: Duration = Duration::from_millis(100);

/// `/proc/stat`'s all-CPU counters, in clock ticks: busy and total.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticks {
    /// Everything but idle and I/O wait.
    pub busy: u64,
    /// Everything.
    pub total: u64,
}

/// Parses the first (`cpu `) line of `/proc/stat`: user nice system idle iowait irq
/// softirq steal (later fields, guest time, are already counted in user and nice).
pub fn parse_stat(stat: &str) -> Option<Ticks> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    if fields.len() < 4 {
        return None;
    }
    let total: u64 = fields.iter().sum();
    let idle = fields[3] + fields.get(4).copied().unwrap_or(0);
    Some(Ticks {
        busy: total - idle,
        total,
    })
}

/// The share of CPU time busy between two samples, per mille ([`FULL_LOAD`]: all
/// busy); `None` if no tick passed (or the counters went back).
pub fn busy_between(before: Ticks, after: Ticks) -> Option<u32> {
    let total = after.total.checked_sub(before.total)?;
    let busy = after.busy.checked_sub(before.busy)?;
    if total == 0 {
        return None;
    }
    Some((busy.min(total) * u64::from(FULL_LOAD) / total) as u32)
}

/// Samples `/proc/stat` at most once per [`PERIOD`]; callers that find another
/// sampling skip it rather than wait.
#[derive(Default)]
pub struct LoadSampler {
    last: Mutex<Option<(Instant, Ticks)>>,
}

impl LoadSampler {
    /// The load since the last sample if a period has passed by `now`, else `None`
    /// (also where `/proc/stat` cannot be read: the router then sees no load).
    pub fn sample(&self, now: Instant) -> Option<u32> {
        let mut last = self.last.try_lock().ok()?;
        if let Some((at, _)) = *last {
            if now.saturating_duration_since(at) < PERIOD {
                return None;
            }
        }
        let ticks = parse_stat(&std::fs::read_to_string("/proc/stat").ok()?)?;
        let busy = last.and_then(|(_, before)| busy_between(before, ticks));
        *last = Some((now, ticks));
        busy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_all_cpu_line_gives_busy_and_total_ticks() {
        let stat = "cpu  100 5 50 800 40 3 2 0 7 0\ncpu0 50 2 25 400 20 1 1 0 0 0\nintr 1\n";
        assert_eq!(
            parse_stat(stat),
            Some(Ticks {
                busy: 160,
                total: 1000
            })
        );
        assert_eq!(parse_stat("cpu0 1 2 3 4\n"), None);
        assert_eq!(parse_stat("cpu  1 2\n"), None);
        assert_eq!(parse_stat("cpu  1 x 3 4\n"), None);
        assert_eq!(parse_stat(""), None);
    }

    #[test]
    fn the_load_is_the_busy_share_of_the_ticks_between_samples() {
        let a = Ticks {
            busy: 160,
            total: 1000,
        };
        let b = Ticks {
            busy: 310,
            total: 1200,
        };
        assert_eq!(busy_between(a, b), Some(750));
        assert_eq!(busy_between(a, a), None);
        assert_eq!(busy_between(b, a), None);
        let all = Ticks {
            busy: 360,
            total: 1200,
        };
        assert_eq!(busy_between(a, all), Some(FULL_LOAD));
    }

    #[test]
    fn samples_come_at_most_once_a_period() {
        let s = LoadSampler::default();
        let t0 = Instant::now();
        // The first read only sets the baseline; so does a read within the period.
        assert_eq!(s.sample(t0), None);
        assert_eq!(s.sample(t0 + PERIOD / 2), None);
        // A period later it reads /proc/stat again (whose ticks may or may not have
        // moved in real time: only the bound is certain) and keeps the new baseline.
        if let Some(busy) = s.sample(t0 + PERIOD + Duration::from_millis(20)) {
            assert!(busy <= FULL_LOAD);
        }
        let held = s.last.lock().unwrap().map(|(at, _)| at);
        assert_eq!(held, Some(t0 + PERIOD + Duration::from_millis(20)));
    }
}
