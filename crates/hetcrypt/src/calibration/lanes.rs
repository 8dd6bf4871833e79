//! How many lanes (requests in flight) an offload engine runs: the count its stored
//! lanes sweep found best, else the engine's measured default.
//!
//! Pure logic over a [`Calibration`]: it opens no engine and runs no job, so a program
//! asks it before opening an engine (`engine::by_name(name, Some(choice.lanes))`).

use std::fmt;

use serde::Serialize;

use super::{Calibration, ClassCalibration};
use crate::cipher::{Cipher, Direction};

/// How much more throughput a larger lane count of the sweep must show than the count
/// already chosen to be chosen instead (0.15: 15% more). Each lane is a thread on the
/// submitting CPU, and on the Intel host the sweep's one-window choice of two lanes
/// then ran slower than one at every size (docs/performance.md, twentieth session), so
/// a tie, or a small lead that the host's swing can make, keeps the fewer lanes. A
/// second lane that pays brings more: 1.30x in the fifteenth session's AMD sweep
/// (`1: 72.6, 2: 94.3` MB/s), 1.4x through `/dev/crypto`.
pub const LANES_MARGIN: f64 = 0.15;

/// Most lanes a stored sweep may choose: two, the most the policies were measured with
/// beside the `cpu` engine (docs/results.md, issue 20). The sweep alone goes further
/// (1, 2, 4), but each lane is a thread on the CPU that also runs the `cpu` engine's
/// lanes, so a count that wins alone may still lose in a mix.
pub const MAX_CHOSEN_LANES: usize = 2;

/// Where an engine's lane count came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum LanesFrom {
    /// Given by the caller (`--lanes N`).
    Given,
    /// The best count of the calibration store's lanes sweep for this engine, cipher
    /// and direction.
    Stored,
    /// The engine's default (no stored sweep for the class).
    Default,
}

impl fmt::Display for LanesFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LanesFrom::Given => "given",
            LanesFrom::Stored => "stored",
            LanesFrom::Default => "default",
        })
    }
}

/// A lane count and where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LaneChoice {
    /// Lanes to open (at least one).
    pub lanes: usize,
    /// Why this many.
    pub from: LanesFrom,
}

impl ClassCalibration {
    /// The lane count of the sweep to run, at most [`MAX_CHOSEN_LANES`]: from the
    /// fewest counts up, a count replaces the one chosen so far only when its
    /// throughput beats it by [`LANES_MARGIN`]; `None` when the sweep compared nothing
    /// (fewer than two counts, as a store written with one lane has) or its fewest
    /// lanes measured no throughput.
    pub fn best_lanes(&self) -> Option<usize> {
        if self.lanes.len() < 2 {
            return None;
        }
        let mut points: Vec<_> = self.lanes.iter().filter(|p| p.lanes >= 1).collect();
        points.sort_by_key(|p| p.lanes);
        let (first, more) = points.split_first()?;
        if !(first.bytes_per_second.is_finite() && first.bytes_per_second > 0.0) {
            return None;
        }
        let mut chosen = *first;
        for p in more.iter().take_while(|p| p.lanes <= MAX_CHOSEN_LANES) {
            if p.bytes_per_second >= chosen.bytes_per_second * (1.0 + LANES_MARGIN) {
                chosen = p;
            }
        }
        Some(chosen.lanes.min(MAX_CHOSEN_LANES))
    }
}

impl Calibration {
    /// The lane count the store's sweep found best for `engine` on this cipher and
    /// direction ([`ClassCalibration::best_lanes`]), or `None` if the store cannot tell.
    pub fn best_lanes(&self, engine: &str, cipher: Cipher, direction: Direction) -> Option<usize> {
        self.class(engine, cipher, direction)?.best_lanes()
    }
}

/// The lanes an offload engine named `engine` runs for `cipher` in `direction`: `given`
/// if there is one, else the store's best count, else `default` (the engine's own).
pub fn choose_lanes(
    given: Option<usize>,
    store: Option<&Calibration>,
    engine: &str,
    cipher: Cipher,
    direction: Direction,
    default: usize,
) -> LaneChoice {
    if let Some(n) = given {
        return LaneChoice {
            lanes: n.max(1),
            from: LanesFrom::Given,
        };
    }
    match store.and_then(|c| c.best_lanes(engine, cipher, direction)) {
        Some(n) => LaneChoice {
            lanes: n,
            from: LanesFrom::Stored,
        },
        None => LaneChoice {
            lanes: default.max(1),
            from: LanesFrom::Default,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{class, cpu_and_module};
    use super::super::{Fingerprint, LanePoint};
    use super::*;

    const C: Cipher = Cipher::AES_128_CBC;
    const E: Direction = Direction::Encrypt;

    /// `cpu_and_module` with the `kernel` engine's AES-128-CBC sweep replaced by
    /// `(lanes, MB/s)` points.
    fn store_with_sweep(sweep: &[(usize, f64)]) -> Calibration {
        let mut cal = cpu_and_module();
        cal.engines[1].classes[0].lanes = sweep
            .iter()
            .map(|&(lanes, mb)| LanePoint {
                lanes,
                bytes_per_second: mb * 1e6,
            })
            .collect();
        cal
    }

    fn choice(cal: Option<&Calibration>, given: Option<usize>) -> LaneChoice {
        choose_lanes(given, cal, "kernel", C, E, 3)
    }

    #[test]
    fn a_sweep_where_two_lanes_win_gives_two() {
        // The soft guest's virtio-crypto through /dev/crypto: 1.4x with two in flight,
        // nothing more with four.
        let cal = store_with_sweep(&[(1, 120.0), (2, 170.0), (4, 172.0)]);
        let got = choice(Some(&cal), None);
        assert_eq!((got.lanes, got.from), (2, LanesFrom::Stored));
        // Padded CBC answers from raw CBC.
        assert_eq!(
            cal.best_lanes("kernel", Cipher::AES_128_CBC_PKCS7, E),
            Some(2)
        );
    }

    #[test]
    fn a_sweep_where_one_lane_wins_gives_one() {
        // A second lane that only queues behind the first (within the tolerance), and one
        // that loses outright.
        for sweep in [[(1, 100.0), (2, 103.0)], [(1, 100.0), (2, 80.0)]] {
            let cal = store_with_sweep(&sweep);
            assert_eq!(
                choice(Some(&cal), None),
                LaneChoice {
                    lanes: 1,
                    from: LanesFrom::Stored
                }
            );
        }
    }

    #[test]
    fn more_lanes_need_a_clear_lead() {
        // The twentieth session's Intel host: two lanes 7% ahead in the sweep, slower
        // than one in the run. The old rule (the fewest within 5% of the best) took 2.
        let cal = store_with_sweep(&[(1, 100.0), (2, 107.0), (4, 108.0)]);
        assert_eq!(choice(Some(&cal), None).lanes, 1);
        // Just short of the margin, and just past it.
        let cal = store_with_sweep(&[(1, 100.0), (2, 114.0)]);
        assert_eq!(choice(Some(&cal), None).lanes, 1);
        let cal = store_with_sweep(&[(1, 100.0), (2, 116.0)]);
        assert_eq!(choice(Some(&cal), None).lanes, 2);
        // Four lanes far ahead do not carry two that are not: the cap is two.
        let cal = store_with_sweep(&[(1, 100.0), (2, 105.0), (4, 200.0)]);
        assert_eq!(choice(Some(&cal), None).lanes, 1);
    }

    #[test]
    fn the_choice_is_capped_and_the_sweep_order_does_not_matter() {
        let cal = store_with_sweep(&[(16, 400.0), (1, 100.0), (8, 300.0), (2, 150.0)]);
        assert_eq!(choice(Some(&cal), None).lanes, MAX_CHOSEN_LANES);
        let cal = store_with_sweep(&[(4, 200.0), (1, 100.0), (2, 196.0)]);
        assert_eq!(choice(Some(&cal), None).lanes, 2);
        let cal = store_with_sweep(&[(2, 100.0), (1, 99.0), (4, 101.0)]);
        assert_eq!(choice(Some(&cal), None).lanes, 1);
    }

    #[test]
    fn no_store_no_class_or_no_real_sweep_gives_the_default() {
        let default = LaneChoice {
            lanes: 3,
            from: LanesFrom::Default,
        };
        assert_eq!(choice(None, None), default);
        // A store written with one lane: its sweep compared nothing.
        let cal = store_with_sweep(&[(1, 100.0)]);
        assert_eq!(choice(Some(&cal), None), default);
        // A sweep that measured nothing.
        let cal = store_with_sweep(&[(1, 0.0), (2, 0.0)]);
        assert_eq!(choice(Some(&cal), None), default);
        // Another engine, cipher or direction than the store measured.
        let cal = store_with_sweep(&[(1, 100.0), (2, 200.0)]);
        assert_eq!(
            choose_lanes(None, Some(&cal), "devcrypto", C, E, 3),
            default
        );
        assert_eq!(
            choose_lanes(None, Some(&cal), "kernel", Cipher::AES_256_CBC, E, 3),
            default
        );
        assert_eq!(
            choose_lanes(None, Some(&cal), "kernel", C, Direction::Decrypt, 3),
            default
        );
    }

    #[test]
    fn a_foreign_store_is_not_read_so_gives_the_default() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("calibration.json");
        let mut cal = store_with_sweep(&[(1, 100.0), (2, 200.0)]);
        cal.fingerprint.cpu_model = "another CPU".into();
        cal.save(&path).expect("the store is written");
        let loaded = super::super::load(&path, &Fingerprint::current()).calibration();
        assert!(loaded.is_none());
        assert_eq!(choice(loaded.as_ref(), None).from, LanesFrom::Default);
    }

    #[test]
    fn given_lanes_override_the_store() {
        let cal = store_with_sweep(&[(1, 100.0), (2, 200.0)]);
        assert_eq!(
            choice(Some(&cal), Some(1)),
            LaneChoice {
                lanes: 1,
                from: LanesFrom::Given
            }
        );
        assert_eq!(choice(None, Some(0)).lanes, 1);
    }

    #[test]
    fn the_test_class_helper_ties_so_picks_one() {
        let cal = cpu_and_module();
        assert_eq!(cal.best_lanes("kernel", C, E), Some(1));
        let two = class(C, E, 200e-6, 1e-9, 2.0);
        assert_eq!(two.best_lanes(), Some(2));
    }
}
