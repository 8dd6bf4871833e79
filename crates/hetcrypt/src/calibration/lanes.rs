//! How many lanes (requests in flight) an offload engine runs: the count its stored
//! lanes sweep found best, else the engine's measured default.
//!
//! Pure logic over a [`Calibration`]: it opens no engine and runs no job, so a program
//! asks it before opening an engine (`engine::by_name(name, Some(choice.lanes))`).

use std::fmt;

use serde::Serialize;

use super::{Calibration, ClassCalibration};
use crate::cipher::{Cipher, Direction};

/// How close to the sweep's best throughput a lane count must come to be chosen: the
/// smallest such count wins, since each lane is a thread on the submitting CPU. Two
/// sweeps of one guest differ by a few percent, so a count that only ties within that
/// is not worth its thread.
pub const LANES_TOLERANCE: f64 = 0.05;

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
    /// The smallest lane count of the sweep within [`LANES_TOLERANCE`] of its best
    /// throughput, at most [`MAX_CHOSEN_LANES`]; `None` when the sweep compared nothing
    /// (fewer than two counts, as a store written with one lane has) or measured no
    /// throughput.
    pub fn best_lanes(&self) -> Option<usize> {
        if self.lanes.len() < 2 {
            return None;
        }
        let best = self
            .lanes
            .iter()
            .map(|p| p.bytes_per_second)
            .fold(0.0, f64::max);
        if !(best.is_finite() && best > 0.0) {
            return None;
        }
        self.lanes
            .iter()
            .filter(|p| p.lanes >= 1 && p.bytes_per_second >= best * (1.0 - LANES_TOLERANCE))
            .map(|p| p.lanes)
            .min()
            .map(|n| n.min(MAX_CHOSEN_LANES))
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
