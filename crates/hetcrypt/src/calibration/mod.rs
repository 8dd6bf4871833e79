//! Calibration: what each engine costs per cipher, direction and job size on this
//! machine, measured once (`hetcrypt calibrate`) and kept in one store that policies,
//! `bench`, `encrypt`/`decrypt` and the OpenSSL provider all read.
//!
//! The pieces:
//! - [`measure`] drives each engine's lanes directly (no dispatcher, no policy) and
//!   returns a [`Calibration`]: per engine and class (cipher, direction) the time of one
//!   request at each probe size, a fit of it as *fixed + per-byte* cost, and how the
//!   throughput grows with lanes in flight;
//! - the store ([`Calibration::save`], [`load`], [`store_path`]) is one versioned JSON
//!   file, written atomically, keyed by a [`Fingerprint`] of what invalidates it (CPU
//!   model and flags, kernel, drivers and their priorities, OpenSSL, hetcrypt). A file
//!   that is missing, stale, foreign, corrupt or unreadable is reported as a
//!   [`Loaded`] variant with one sentence to warn with, never as an error;
//! - [`choose_lanes`] says how many lanes an offload engine runs: the count its
//!   stored lanes sweep found best, else the engine's default;
//! - two questions answer what callers need: [`Calibration::cost`] (how long one
//!   request of `len` bytes takes on an engine) and [`Calibration::crossover`] (from
//!   which size one engine moves bytes at least as fast as another).
//!
//! **For a program deciding per call** (the OpenSSL provider): read the store once per
//! process ([`load_store`], which never fails), then per call either compare
//! [`Calibration::cost`] of the `cpu` engine with that of the module engine for the
//! call's cipher, direction and length (the latency of one request, one lane each), or
//! compare the length with [`Calibration::crossover`] (throughput with every lane busy,
//! for a program with many calls in flight). Both answer `None` for what the store
//! lacks: fall back to a fixed rule then. The store's types only ever gain fields
//! (they are `#[non_exhaustive]`); a change of meaning bumps [`FORMAT_VERSION`], which
//! makes older stores stale rather than misread.
//!
//! ```no_run
//! use hetcrypt::calibration::{self, Fingerprint};
//! use hetcrypt::{Cipher, Direction};
//!
//! let (path, loaded) = calibration::load_store(None, &Fingerprint::current());
//! if let Some(warning) = loaded.warning(&path) {
//!     eprintln!("hetcrypt: {warning}");
//! }
//! if let Some(cal) = loaded.calibration() {
//!     let cipher = Cipher::AES_128_CBC;
//!     let from = cal.crossover(cipher, Direction::Encrypt, "cpu", "kernel");
//!     let cost = cal.cost("cpu", cipher, Direction::Encrypt, 4096);
//!     println!("module from {from:?} bytes; 4 KiB on the cpu takes {cost:?}");
//! }
//! ```

mod lanes;
mod measure;
mod store;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use lanes::{choose_lanes, LaneChoice, LanesFrom, LANES_MARGIN, MAX_CHOSEN_LANES};
pub use measure::{measure, Progress, Settings, Step, DEFAULT_CIPHERS, PROBE_SIZES};
pub use store::{
    load, load_store, store_path, DriverId, Fingerprint, Loaded, ENV_PATH, FORMAT_VERSION,
    SYSTEM_PATH,
};

use crate::cipher::{Cipher, Direction, Mode, BLOCK_LEN};
use crate::engine::EngineKind;

/// Everything one calibration measured, as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Calibration {
    /// The store's format ([`FORMAT_VERSION`] when written by this hetcrypt).
    pub format: u32,
    /// The machine it was measured on; a store whose fingerprint differs from the
    /// machine reading it is stale.
    pub fingerprint: Fingerprint,
    /// When it was measured, seconds since the Unix epoch.
    pub measured_at: u64,
    /// Per engine measured.
    pub engines: Vec<EngineCalibration>,
    /// Engines that were asked for but could not be measured, with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmeasured: Vec<Unmeasured>,
    /// Pairs of engines (a `cpu`-kind one and another) run side by side on a class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mixes: Vec<MixCalibration>,
}

/// Two engines on one class, each alone and both at once, every lane of each busy:
/// what running them side by side gains over either alone. On one core the CPU's lane
/// and the module's driver share it, and a mix that the engines' rates alone promise
/// can lose (DESIGN.md: a module request took 2-3x its time beside a busy CPU lane).
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MixCalibration {
    /// The cipher.
    pub cipher: Cipher,
    /// The direction.
    pub direction: Direction,
    /// The two engines, by name.
    pub engines: [String; 2],
    /// Per probe size.
    pub points: Vec<MixPoint>,
}

/// One size of a [`MixCalibration`]: bytes per second of each engine (in the order of
/// [`MixCalibration::engines`]) alone and while the other runs too.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MixPoint {
    /// Job length, bytes.
    pub len: usize,
    /// Each engine alone.
    pub alone: [f64; 2],
    /// Each engine while both run.
    pub together: [f64; 2],
}

/// An engine the calibration could not measure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Unmeasured {
    /// The engine's name.
    pub engine: String,
    /// Why, in words.
    pub reason: String,
}

/// One engine's measurements.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EngineCalibration {
    /// The engine's name (`cpu`, `kernel`, `kernel:virtio_crypto_aes_cbc`, ...).
    pub name: String,
    /// Its kind.
    pub kind: EngineKind,
    /// Its lane count when measured.
    pub lanes: usize,
    /// Per cipher and direction.
    pub classes: Vec<ClassCalibration>,
}

/// One engine's cost for one cipher and direction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ClassCalibration {
    /// The cipher (raw CBC also answers for CBC with PKCS#7 padding).
    pub cipher: Cipher,
    /// The direction.
    pub direction: Direction,
    /// Who served it (kernel driver, or the OpenSSL / aes crate implementation).
    pub driver: String,
    /// The driver's kernel priority, where there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Fixed cost of one request on one lane, seconds (the fit's intercept).
    pub fixed: f64,
    /// Cost per byte on one lane, seconds (the fit's slope).
    pub per_byte: f64,
    /// One lane, one request at a time, per probe size.
    pub points: Vec<SizePoint>,
    /// Throughput with 1, 2, 4, ... lanes in flight at [`ClassCalibration::lanes_len`].
    pub lanes: Vec<LanePoint>,
    /// Job size of the lanes sweep, bytes.
    pub lanes_len: usize,
}

/// One probe size: what one request cost on one lane.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SizePoint {
    /// Job length, bytes.
    pub len: usize,
    /// Median wall time of one request, seconds.
    pub wall: f64,
    /// Mean CPU time of the lane's thread per request, seconds (about `wall` for
    /// software; a module's lane mostly waits, so far less).
    pub cpu: f64,
    /// Requests timed.
    pub jobs: u32,
}

/// Throughput with some lanes in flight.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LanePoint {
    /// Lanes running at once, each one request at a time.
    pub lanes: usize,
    /// Bytes per second of all of them together.
    pub bytes_per_second: f64,
}

/// The class a cipher is measured as: padded CBC costs what raw CBC does (plus the
/// padding block, which [`padded_len`] adds).
fn measured_as(cipher: Cipher) -> Cipher {
    match cipher.mode {
        Mode::CbcPkcs7 => Cipher::new(cipher.key_size, Mode::Cbc),
        _ => cipher,
    }
}

/// The bytes the engine really processes for a job of `len` bytes.
fn padded_len(cipher: Cipher, direction: Direction, len: usize) -> usize {
    match (cipher.mode, direction) {
        (Mode::CbcPkcs7, Direction::Encrypt) => (len / BLOCK_LEN + 1) * BLOCK_LEN,
        _ => len,
    }
}

impl Calibration {
    /// The measurements of `engine` for `cipher` in `direction`, if there are any
    /// (padded CBC is answered from raw CBC).
    pub fn class(
        &self,
        engine: &str,
        cipher: Cipher,
        direction: Direction,
    ) -> Option<&ClassCalibration> {
        let cipher = measured_as(cipher);
        self.engines
            .iter()
            .find(|e| e.name == engine)?
            .classes
            .iter()
            .find(|c| c.cipher == cipher && c.direction == direction)
    }

    /// How long one request of `len` bytes takes on one lane of `engine` (from the
    /// measured points, the fitted line outside them: [`ClassCalibration::seconds`]),
    /// or `None` if the engine was not measured for this cipher and direction.
    pub fn cost(
        &self,
        engine: &str,
        cipher: Cipher,
        direction: Direction,
        len: usize,
    ) -> Option<Duration> {
        let class = self.class(engine, cipher, direction)?;
        let secs = class.seconds(padded_len(cipher, direction, len));
        Some(Duration::from_secs_f64(secs.clamp(0.0, 1e9)))
    }

    /// The job size from which `engine_b` moves bytes at least as fast as `engine_a`,
    /// each with every lane it had when measured in flight, and stays so for every
    /// larger size: the threshold of a size split (smaller jobs to `engine_a`).
    ///
    /// `Some(0)`: `engine_b` is never slower; `Some(usize::MAX)`: it never catches up
    /// for good (it may win only at small sizes, or nowhere); `None`: the store cannot
    /// tell (either engine was not measured for this cipher and direction).
    pub fn crossover(
        &self,
        cipher: Cipher,
        direction: Direction,
        engine_a: &str,
        engine_b: &str,
    ) -> Option<usize> {
        let a = self.class(engine_a, cipher, direction)?;
        let b = self.class(engine_b, cipher, direction)?;
        Some(crossover_of(
            (a, self.measured_lanes(engine_a)),
            (b, self.measured_lanes(engine_b)),
        ))
    }
}

impl Calibration {
    /// The lanes `engine` had when measured (the sweep may go past them on an offload
    /// engine), or no limit if it was not measured.
    fn measured_lanes(&self, engine: &str) -> usize {
        self.engines
            .iter()
            .find(|e| e.name == engine)
            .map_or(usize::MAX, |e| e.lanes.max(1))
    }
}

impl Calibration {
    /// What `engine` joining `partner` on this class gains, from the pair measured side
    /// by side: each engine's bytes per second together over `partner`'s alone, `engine`'s
    /// part first, at the measured size nearest `len` (in ratio) or a neighbour on either
    /// side, whichever gains least. The gain is their sum: above 1 the mix pays; below,
    /// `partner` does better alone. `None` if the pair did not measure the class. The
    /// parts apart let a policy scale `engine`'s by how far its cost moved from the store
    /// (`calibrate` times the cpu on one request repeated; in the soft guest 200 distinct
    /// files cost it 6-9x more at 1 KiB, and a 1.05x gain was a loss).
    ///
    /// One point is a few 20 ms windows, and on a busy host its gain is noise: two
    /// calibrations of the soft guest one after the other gave 2.44x and 0.62x at 4 KiB,
    /// 1.61x and 4.51x at 64 KiB. A gain that holds over neighbouring sizes is rarely
    /// noise; and an engine never runs faster beside another than alone, so a rate side
    /// by side counts at most its rate alone (a higher one means the alone window was
    /// the disturbed one).
    pub fn mix_parts(
        &self,
        engine: &str,
        partner: &str,
        cipher: Cipher,
        direction: Direction,
        len: usize,
    ) -> Option<[f64; 2]> {
        let cipher = measured_as(cipher);
        let (mix, me) = self.mixes.iter().find_map(|m| {
            let me = m.engines.iter().position(|e| e == engine)?;
            (m.cipher == cipher && m.direction == direction && m.engines[1 - me] == partner)
                .then_some((m, me))
        })?;
        let other = 1 - me;
        let mut points: Vec<&MixPoint> = mix.points.iter().collect();
        points.sort_by_key(|p| p.len);
        let log = |n: usize| (n.max(1) as f64).ln();
        let nearest = (0..points.len()).min_by(|&a, &b| {
            (log(points[a].len) - log(len))
                .abs()
                .total_cmp(&(log(points[b].len) - log(len)).abs())
        })?;
        let parts = |p: &&MixPoint| {
            let part = |e: usize| p.together[e].min(p.alone[e]) / p.alone[other];
            (p.alone[other] > 0.0).then(|| [part(me), part(other)])
        };
        points[nearest.saturating_sub(1)..points.len().min(nearest + 2)]
            .iter()
            .map(parts)
            .collect::<Option<Vec<_>>>()?
            .into_iter()
            .min_by(|a, b| (a[0] + a[1]).total_cmp(&(b[0] + b[1])))
    }
}

impl ClassCalibration {
    /// The seconds of one request of `len` bytes on one lane: between two measured
    /// sizes, on the straight line between their points (at a measured size, its
    /// point); outside them, the fitted line. One line over 16 B-64 KiB misses the
    /// points by up to 3x in the soft guest (`docs/results.md`, twenty-second session),
    /// and near the crossover that picks the wrong engine.
    pub fn seconds(&self, len: usize) -> f64 {
        let measured = || self.points.iter().filter(|p| p.wall > 0.0);
        let below = measured().filter(|p| p.len <= len).max_by_key(|p| p.len);
        let above = measured().filter(|p| p.len >= len).min_by_key(|p| p.len);
        match (below, above) {
            (Some(lo), Some(hi)) if lo.len == hi.len => lo.wall,
            (Some(lo), Some(hi)) => {
                let at = (len - lo.len) as f64 / (hi.len - lo.len) as f64;
                lo.wall + (hi.wall - lo.wall) * at
            }
            _ => self.fixed + self.per_byte * len as f64,
        }
    }

    /// The fitted CPU seconds of the lane's thread for one request of `len` bytes: the
    /// wall time scaled by the CPU share measured at the nearest probe size.
    pub fn cpu_seconds(&self, len: usize) -> f64 {
        let share = self
            .points
            .iter()
            .min_by_key(|p| p.len.abs_diff(len))
            .filter(|p| p.wall > 0.0)
            .map_or(1.0, |p| (p.cpu / p.wall).clamp(0.0, 1.0));
        self.seconds(len) * share
    }

    /// How many one-lane throughputs the best lane count of the sweep gave (at least
    /// 1: more lanes never count as a loss, since a caller can use fewer).
    pub fn parallelism(&self) -> f64 {
        self.parallelism_up_to(usize::MAX)
    }

    /// [`ClassCalibration::parallelism`] over the sweep's counts up to `lanes` (an
    /// offload engine is swept past the lanes it runs).
    pub fn parallelism_up_to(&self, lanes: usize) -> f64 {
        let one = self
            .lanes
            .iter()
            .find(|p| p.lanes == 1)
            .map(|p| p.bytes_per_second);
        let best = self
            .lanes
            .iter()
            .filter(|p| p.lanes <= lanes)
            .map(|p| p.bytes_per_second)
            .fold(0.0, f64::max);
        match one {
            Some(one) if one > 0.0 && best.is_finite() => (best / one).max(1.0),
            _ => 1.0,
        }
    }
}

/// Where `b`'s bulk rate, `S_b n / t_b(n)`, reaches `a`'s for good (see
/// [`Calibration::crossover`]): `b >= a` iff `g(n) = S_b t_a(n) - S_a t_b(n) >= 0`.
/// Above the largest measured size both costs are fitted lines, so `g` is linear there
/// and [`line_crossover`] answers. Below it, between any two sizes either engine
/// measured, both costs are straight lines too ([`ClassCalibration::seconds`]): from
/// the top down, `g` is checked at each measured size and solved inside the span below
/// it, down to the first size where `b` falls behind.
fn crossover_of(
    (a, lanes_a): (&ClassCalibration, usize),
    (b, lanes_b): (&ClassCalibration, usize),
) -> usize {
    let (sa, sb) = (a.parallelism_up_to(lanes_a), b.parallelism_up_to(lanes_b));
    let g = |n: usize| sb * a.seconds(n) - sa * b.seconds(n);
    let mut sizes: Vec<usize> = [0]
        .into_iter()
        .chain(a.points.iter().chain(&b.points).map(|p| p.len))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let top = sizes.last().copied().unwrap_or(0);
    let line = line_crossover((a, sa), (b, sb));
    if line > top {
        return line;
    }
    // `b` keeps up at every size from `from` up.
    let mut from = top.saturating_add(1);
    for span in sizes.windows(2).rev() {
        let (lo, hi) = (span[0], span[1]);
        if g(hi) < 0.0 {
            return from;
        }
        from = hi;
        // Inside (lo, hi) `g` is linear: through its values at lo + 1 and hi - 1.
        let (x0, x1) = (lo + 1, hi - 1);
        if x0 > x1 {
            continue;
        }
        let (g0, g1) = (g(x0), g(x1));
        if g1 < 0.0 {
            return from;
        }
        if g0 < 0.0 {
            // The first size in (x0, x1] where `g` is not negative.
            let step = (x1 - x0) as f64 * -g0 / (g1 - g0);
            let mut n = (x0 + (step.ceil() as usize)).clamp(x0 + 1, x1);
            while n > x0 + 1 && g(n - 1) >= 0.0 {
                n -= 1;
            }
            while n < x1 && g(n) < 0.0 {
                n += 1;
            }
            return n;
        }
        from = x0;
    }
    if g(0) >= 0.0 {
        0
    } else {
        from
    }
}

/// [`crossover_of`] for two fitted lines `f + p n` at parallelism `S`: the rates
/// compare as a linear function of `n`, `b >= a` iff
/// `n (S_b p_a - S_a p_b) >= S_a f_b - S_b f_a`.
fn line_crossover((a, sa): (&ClassCalibration, f64), (b, sb): (&ClassCalibration, f64)) -> usize {
    let slope = sb * a.per_byte - sa * b.per_byte;
    let offset = sa * b.fixed - sb * a.fixed;
    if slope > 0.0 {
        let n = (offset / slope).ceil();
        if n <= 0.0 {
            0
        } else if n >= usize::MAX as f64 {
            usize::MAX
        } else {
            n as usize
        }
    } else if slope == 0.0 && offset <= 0.0 {
        0
    } else {
        // b's per-byte rate is worse: whatever it wins at small sizes, it loses for
        // good at some larger one.
        usize::MAX
    }
}

/// Fits `fixed + per_byte * len` to measured (len, seconds) points, minimising the
/// *relative* error (weights 1/t^2), so the microsecond points of small sizes count as
/// much as the millisecond ones of large sizes. Neither part comes out negative.
pub(crate) fn fit(points: &[(usize, f64)]) -> (f64, f64) {
    let (mut sw, mut swn, mut swnn, mut swt, mut swnt) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(len, t) in points.iter().filter(|(_, t)| *t > 0.0) {
        let (n, w) = (len as f64, 1.0 / (t * t));
        sw += w;
        swn += w * n;
        swnn += w * n * n;
        swt += w * t;
        swnt += w * n * t;
    }
    if sw == 0.0 {
        return (0.0, 0.0);
    }
    let det = sw * swnn - swn * swn;
    let (fixed, per_byte) = if det.abs() > f64::EPSILON * sw * swnn {
        (
            (swt * swnn - swn * swnt) / det,
            (sw * swnt - swn * swt) / det,
        )
    } else {
        (swt / sw, 0.0)
    };
    if fixed < 0.0 {
        (0.0, if swnn > 0.0 { swnt / swnn } else { 0.0 })
    } else if per_byte < 0.0 {
        (swt / sw, 0.0)
    } else {
        (fixed, per_byte)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A class costing `fixed + per_byte * len` exactly, with `parallel` times the
    /// one-lane throughput on two lanes.
    pub(crate) fn class(
        cipher: Cipher,
        direction: Direction,
        fixed: f64,
        per_byte: f64,
        parallel: f64,
    ) -> ClassCalibration {
        let points = PROBE_SIZES
            .iter()
            .map(|&len| SizePoint {
                len,
                wall: fixed + per_byte * len as f64,
                cpu: fixed + per_byte * len as f64,
                jobs: 10,
            })
            .collect();
        let one = 16384.0 / (fixed + per_byte * 16384.0);
        ClassCalibration {
            cipher,
            direction,
            driver: "test".into(),
            priority: None,
            fixed,
            per_byte,
            points,
            lanes: vec![
                LanePoint {
                    lanes: 1,
                    bytes_per_second: one,
                },
                LanePoint {
                    lanes: 2,
                    bytes_per_second: one * parallel,
                },
            ],
            lanes_len: 16384,
        }
    }

    /// A calibration of a slow `cpu` (10 ns/B) and a `kernel` module with a 200 µs
    /// fixed cost at 1 ns/B, for AES-128-CBC encryption.
    pub(crate) fn cpu_and_module() -> Calibration {
        let c = Cipher::AES_128_CBC;
        let d = Direction::Encrypt;
        Calibration {
            format: FORMAT_VERSION,
            fingerprint: Fingerprint::current(),
            measured_at: 0,
            engines: vec![
                EngineCalibration {
                    name: "cpu".into(),
                    kind: EngineKind::Cpu,
                    lanes: 1,
                    classes: vec![class(c, d, 1e-6, 10e-9, 1.0)],
                },
                EngineCalibration {
                    name: "kernel".into(),
                    kind: EngineKind::Kernel,
                    lanes: 1,
                    classes: vec![class(c, d, 200e-6, 1e-9, 1.0)],
                },
            ],
            unmeasured: Vec::new(),
            mixes: Vec::new(),
        }
    }

    #[test]
    fn fit_recovers_fixed_and_per_byte_cost() {
        let points: Vec<(usize, f64)> = PROBE_SIZES
            .iter()
            .map(|&n| (n, 5e-6 + 2e-9 * n as f64))
            .collect();
        let (fixed, per_byte) = fit(&points);
        assert!((fixed - 5e-6).abs() < 1e-9, "{fixed}");
        assert!((per_byte - 2e-9).abs() < 1e-13, "{per_byte}");
        // Noise that would make the intercept negative gives a pure per-byte cost.
        let (fixed, per_byte) = fit(&[(16, 1e-9), (65536, 1e-3)]);
        assert!(fixed >= 0.0 && per_byte > 0.0);
        assert_eq!(fit(&[]), (0.0, 0.0));
    }

    #[test]
    fn cost_is_fixed_plus_per_byte_and_padded_cbc_uses_raw_cbc() {
        let cal = cpu_and_module();
        let d = Direction::Encrypt;
        let cost = |e, c, n| cal.cost(e, c, d, n).map(|t| t.as_secs_f64());
        let kernel = cost("kernel", Cipher::AES_128_CBC, 4096).unwrap();
        assert!((kernel - (200e-6 + 4096e-9)).abs() < 1e-9);
        // PKCS#7 pads 4096 bytes to 4112.
        let padded = cost("kernel", Cipher::AES_128_CBC_PKCS7, 4096).unwrap();
        assert!((padded - (200e-6 + 4112e-9)).abs() < 1e-9);
        assert_eq!(cost("kernel", Cipher::AES_256_CBC, 4096), None);
        assert_eq!(cost("gpu", Cipher::AES_128_CBC, 4096), None);
        assert_eq!(
            cal.cost("cpu", Cipher::AES_128_CBC, Direction::Decrypt, 16),
            None
        );
    }

    #[test]
    fn mix_gain_is_both_together_over_the_other_alone_at_the_nearest_size() {
        let mut cal = cpu_and_module();
        let (c, d) = (Cipher::AES_128_CBC, Direction::Encrypt);
        let gain = |cal: &Calibration, me, partner, c, d, len| {
            cal.mix_parts(me, partner, c, d, len).map(|[a, b]| a + b)
        };
        assert_eq!(gain(&cal, "cpu", "kernel", c, d, 4096), None);
        cal.mixes.push(MixCalibration {
            cipher: c,
            direction: d,
            engines: ["cpu".into(), "kernel".into()],
            points: vec![
                MixPoint {
                    len: 64,
                    alone: [10e6, 0.3e6],
                    together: [8e6, 0.2e6],
                },
                MixPoint {
                    len: 16384,
                    alone: [10e6, 60e6],
                    together: [6e6, 50e6],
                },
            ],
        });
        // The module joining the cpu's 64-byte jobs: 8.2 MB/s against 10 alone, the
        // module's part 0.02 of it.
        let g = gain(&cal, "kernel", "cpu", c, d, 64).unwrap();
        assert!((g - 0.82).abs() < 1e-9, "{g}");
        let parts = cal.mix_parts("kernel", "cpu", c, d, 64).unwrap();
        assert!((parts[0] - 0.02).abs() < 1e-12 && (parts[1] - 0.8).abs() < 1e-12);
        // The cpu joining the module's 16 KiB jobs: 56 MB/s against 60; 12 KiB is
        // nearer 16 KiB than 64 B; padded CBC answers from raw CBC.
        let g = gain(&cal, "cpu", "kernel", Cipher::AES_128_CBC_PKCS7, d, 12000).unwrap();
        assert!((g - 56.0 / 60.0).abs() < 1e-9, "{g}");
        assert_eq!(gain(&cal, "gpu", "kernel", c, d, 64), None);
        assert_eq!(gain(&cal, "cpu", "kernel", c, Direction::Decrypt, 64), None);
        // Only the pair with that partner counts (a store measures the cpu beside every
        // engine; the first pair found was once taken whoever the partner).
        assert_eq!(gain(&cal, "cpu", "devcrypto", c, d, 64), None);
        // A partner that moved nothing alone (a failed window) gives no gain, not one
        // divided by zero.
        cal.mixes[0].points[0].alone[0] = 0.0;
        assert_eq!(gain(&cal, "kernel", "cpu", c, d, 64), None);
    }

    /// A gain must hold at the neighbouring sizes too, and a window alone that came out
    /// slow (a side-by-side rate above it) does not inflate it.
    #[test]
    fn mix_gain_holds_over_neighbouring_sizes_and_is_never_above_the_rates_alone() {
        let mut cal = cpu_and_module();
        let (c, d) = (Cipher::AES_128_CBC, Direction::Encrypt);
        // The cpu joining the module, which alone moves 50 MB/s: a 1.2x gain at every
        // size (the module's 55 MB/s side by side counts as its 50 alone) but 4 KiB,
        // where the module's window alone was disturbed.
        let point = |len: usize, module_alone: f64| MixPoint {
            len,
            alone: [10e6, module_alone],
            together: [10e6, 55e6],
        };
        cal.mixes.push(MixCalibration {
            cipher: c,
            direction: d,
            engines: ["cpu".into(), "kernel".into()],
            points: vec![
                point(16384, 50e6),
                point(1024, 50e6),
                point(4096, 20e6),
                point(65536, 50e6),
            ],
        });
        let gain = |cal: &Calibration, len| {
            let [cpu, module] = cal.mix_parts("cpu", "kernel", c, d, len).unwrap();
            cpu + module
        };
        assert!((gain(&cal, 65536) - 1.2).abs() < 1e-9);
        // At 4 KiB alone, 30 MB/s (10 + 20, the module capped at its rate alone) over
        // 20 would be 1.5, but 1 KiB and 16 KiB say 1.2.
        assert!((gain(&cal, 4096) - 1.2).abs() < 1e-9);
        // 16 B: 1 KiB and its neighbour 4 KiB.
        assert!((gain(&cal, 16) - 1.2).abs() < 1e-9);
        // A loss at one size is a loss beside it too.
        cal.mixes[0].points[0].together = [2e6, 40e6];
        assert!(gain(&cal, 65536) < 1.0 && gain(&cal, 4096) < 1.0);
        assert!((gain(&cal, 1024) - 1.2).abs() < 1e-9);
    }

    /// Between measured sizes a cost follows the points (a store's points are off the
    /// fitted line by up to 3x in the soft guest), the line only outside them.
    #[test]
    fn cost_follows_the_measured_points_and_the_line_outside_them() {
        let mut cal = cpu_and_module();
        let (c, d) = (Cipher::AES_128_CBC, Direction::Encrypt);
        let line = |n: usize| 1e-6 + 10e-9 * n as f64;
        let at = |n| PROBE_SIZES.iter().position(|&p| p == n).unwrap();
        let points = &mut cal.engines[0].classes[0].points;
        points[at(1024)].wall = 3.0 * line(1024);
        points[at(4096)].wall = 0.5 * line(4096);
        let cost = |cal: &Calibration, n| cal.cost("cpu", c, d, n).unwrap().as_secs_f64();
        // Within a nanosecond, a Duration's resolution.
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9;
        assert!(close(cost(&cal, 1024), 3.0 * line(1024)));
        assert!(close(cost(&cal, 4096), 0.5 * line(4096)));
        // A third of the way from 1 KiB to 4 KiB.
        let between = 3.0 * line(1024) + (0.5 * line(4096) - 3.0 * line(1024)) / 3.0;
        assert!(close(cost(&cal, 2048), between), "{}", cost(&cal, 2048));
        // Untouched points and sizes outside them: the line.
        assert!(close(cost(&cal, 256), line(256)));
        assert!(close(cost(&cal, 8), line(8)));
        assert!(close(cost(&cal, 1 << 20), line(1 << 20)));
        // A point not measured (no time) is passed over.
        cal.engines[0].classes[0].points[at(1024)].wall = 0.0;
        let over = line(256) + (0.5 * line(4096) - line(256)) * (1024.0 - 256.0) / 3840.0;
        assert!(close(cost(&cal, 1024), over), "{}", cost(&cal, 1024));
    }

    /// The crossover follows the points too: a cpu measured 3x slower than its line at
    /// 16 KiB loses to the module from ~8.6 KB, where the lines meet only at 22 KB;
    /// and one measured slower at 1 KiB alone does not hand the module the sizes above.
    #[test]
    fn crossover_follows_the_measured_points() {
        let mut cal = cpu_and_module();
        let (c, d) = (Cipher::AES_128_CBC, Direction::Encrypt);
        let at = |n| PROBE_SIZES.iter().position(|&p| p == n).unwrap();
        let (cpu, kernel) = (|n: f64| 1e-6 + 10e-9 * n, |n: f64| 200e-6 + 1e-9 * n);
        cal.engines[0].classes[0].points[at(16384)].wall = 3.0 * cpu(16384.0);
        // Between 4 KiB and 16 KiB both costs are straight lines; they meet at
        // 4096 + k with k (slope_cpu - slope_kernel) = kernel(4096) - cpu(4096).
        let slope = |lo: f64, hi: f64| (hi - lo) / 12288.0;
        let slope_cpu = slope(cpu(4096.0), 3.0 * cpu(16384.0));
        let slope_kernel = slope(kernel(4096.0), kernel(16384.0));
        let k = (kernel(4096.0) - cpu(4096.0)) / (slope_cpu - slope_kernel);
        let n = cal.crossover(c, d, "cpu", "kernel").unwrap();
        assert!(n.abs_diff(4096 + k.ceil() as usize) <= 1, "{n} against {k}");
        // A module ahead at one size below where it stays ahead moves nothing.
        let mut one = cpu_and_module();
        one.engines[0].classes[0].points[at(1024)].wall = 1e-3;
        let n = one.crossover(c, d, "cpu", "kernel").unwrap();
        assert!((22_111..=22_112).contains(&n), "{n}");
        // Behind at the largest measured size, ahead by the lines above it: from just
        // above that size.
        let mut top = cpu_and_module();
        top.engines[1].classes[0].points[at(65536)].wall = 1.0;
        assert_eq!(top.crossover(c, d, "cpu", "kernel"), Some(65537));
    }

    #[test]
    fn crossover_is_where_the_cost_lines_meet() {
        let cal = cpu_and_module();
        let (c, d) = (Cipher::AES_128_CBC, Direction::Encrypt);
        // 1e-6 + 10e-9 n = 200e-6 + 1e-9 n  =>  n = 199e-6 / 9e-9 = 22,112 (rounded up).
        let n = cal.crossover(c, d, "cpu", "kernel").unwrap();
        assert!((22_111..=22_112).contains(&n), "{n}");
        // The other way round the cpu never catches up for good.
        assert_eq!(cal.crossover(c, d, "kernel", "cpu"), Some(usize::MAX));
        assert_eq!(cal.crossover(c, d, "cpu", "cpu"), Some(0));
        assert_eq!(cal.crossover(Cipher::AES_128_GCM, d, "cpu", "kernel"), None);
        // A module with two lanes' worth of throughput crosses at half the size:
        // 1e-6 + 10e-9 n = (200e-6 + 1e-9 n) / 2  =>  n = 99e-6 / 9.5e-9 = 10,421.
        let mut two = cal.clone();
        two.engines[1].classes[0] = class(c, d, 200e-6, 1e-9, 2.0);
        two.engines[1].lanes = 2;
        let n = two.crossover(c, d, "cpu", "kernel").unwrap();
        assert!((10_420..=10_422).contains(&n), "{n}");
        // A sweep past the lanes the engine had (offload engines are swept to 4) does
        // not count: with 1 lane measured, the 2-lane point is ignored.
        two.engines[1].lanes = 1;
        let n = two.crossover(c, d, "cpu", "kernel").unwrap();
        assert!((22_111..=22_112).contains(&n), "{n}");
    }
}
