//! Which implementation runs CTR, CBC decryption and GCM on this CPU: both measured at first use, the faster kept.
//!
//! Two implementations can run the block-parallel modes: OpenSSL EVP (one keyed
//! context per lane, the IV set per job) and the `aes` crate's block-parallel loops
//! (`parallel.rs`). Which one is faster depends on the CPU and on the job size, not on
//! the CPU it was tuned on: on an Intel host with AES-NI and AVX-512F the crate won at
//! every size; on an AMD EPYC with VAES the issue-23 runs saw EVP win CTR at 16 KiB in
//! some runs. GCM likewise has two: EVP and `ring`'s (`gcm.rs`), for AES-128 and
//! AES-256 with 96-bit IVs. So the first job of each (mode, key size) on an engine times both on
//! jobs of a few sizes, in alternating rounds, and keeps the faster one per size band;
//! `hetcrypt engines` prints the figures. The probe costs well under a millisecond per
//! (mode, key size), once per process: it measures the CPU, which every engine shares.
//!
//! The multi-buffer width of CBC encryption is chosen the same way: the first lane
//! that runs a lockstep batch times lockstep batches of each width in
//! [`CHAIN_WIDTHS`] and keeps the fastest (8 won on the Intel host, 16 on the AMD EPYC
//! ones). Nothing is measured when an engine or a dispatcher opens, so a process that
//! runs only GCM (most of `hetcrypt encrypt`) never pays for a probe.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

// GCM's key sizes with a second implementation: `ring`'s, kept in `gcm.rs`.
use super::gcm::KEY_SIZES as GCM_KEY_SIZES;
use crate::cipher::{Cipher, Direction, KeySize, Mode, BLOCK_LEN};
use crate::job::{Job, JobOutput};
use crate::key::{Key, KeyStore};

/// Job sizes the probe times both implementations at: a small job (where the fixed
/// cost per job decides), 1 KiB (`openssl speed`'s middle), and 16 KiB (its largest
/// block, and the C2SP chunk). Three sizes keep the probe short.
const PROBE_SIZES: [usize; 3] = [64, 1024, 16 * 1024];

/// Input bytes each timed round processes per implementation and size: enough that a
/// round outlasts the clock's resolution many times over (tens of microseconds: 256
/// jobs at 64 B, where the fixed cost per job is what is timed), little enough that a
/// short run does not pay much for it. Every `hetcrypt encrypt` of a small file
/// probes GCM once; with 64 KiB rounds that probe was 55% of the user-space
/// instructions of encrypting a 1 KB file (callgrind), 31% with 16 KiB, and the whole
/// run's CPU time fell from 6.0 to 4.7 ms (medians of 6 alternating `perf stat -r 50`,
/// "Intel(R) Xeon(R) Processor", load 7; the same implementations chosen in 5 of 5
/// `hetcrypt engines`). EVP's per-call cost at 64 B was most of it.
const ROUND_BYTES: usize = 16 * 1024;

/// Fewest jobs per timed round (at 1 KiB and 16 KiB, [`ROUND_BYTES`] alone would
/// give 16 and 1).
const MIN_ROUND_JOBS: usize = 8;

/// Timed rounds per implementation and size, alternating which goes first; the best
/// round counts (a round that was preempted on a shared host only ever looks slower).
const ROUNDS: usize = 3;

/// Multi-buffer widths the probe chooses from. Powers of two up to [`MAX_CHAINS`]:
/// fewer than 4 chains leave the AES unit idle on every x86 measured. A measured lane
/// pulls the widest width's jobs whatever width it runs (`CpuEngine::lockstep_batch`),
/// so a wider width costs no balance between engines; of two widths within
/// [`WIDTH_TOLERANCE`] of each other the wider wins: it covers more of the AES unit's
/// latency, and the probe's rounds differ by a few percent from run to run.
///
/// [`MAX_CHAINS`]: super::MAX_CHAINS
pub const CHAIN_WIDTHS: [usize; 3] = [4, 8, 16];

/// How much faster a narrower multi-buffer width must measure to be chosen over a
/// wider one. On an Intel Xeon (Emerald Rapids, KVM) the probe read 8 chains at 5.5
/// GB/s and 16 at 5.3, and chose 8; `hetcrypt speed` then ran 8 chains at 4.51-5.43
/// GB/s and 16 at 5.45-5.73 (1 KiB jobs, three alternating rounds).
const WIDTH_TOLERANCE: f64 = 1.05;

/// The job size of the width probe: 1 KiB, where the fixed cost per job and the AES
/// both show (widths that won at 1 KiB also won at 16 KiB in every sweep).
const WIDTH_PROBE_SIZE: usize = 1024;

/// Jobs per timed round of the width probe: a multiple of every width in
/// [`CHAIN_WIDTHS`], 128 KiB of input. Rounds of 512 KiB did not steady the choice on
/// an Intel Xeon (Emerald Rapids, KVM), whose lockstep speed differed by 1.5x from one
/// process to the next whatever the round's length, and they cost four times as much
/// where AES instructions are slow (an emulated guest's).
const WIDTH_PROBE_JOBS: usize = 128;

/// Widths the probe also times through VAES-512 (`vaes.rs`), where the CPU has it:
/// two and four 512-bit registers of chains. One register (4 chains) leaves the AES
/// unit waiting on each instruction's latency.
const VAES_WIDTHS: [usize; 2] = [8, 16];

/// Timed rounds per width, in rotating order; the best counts. More than [`ROUNDS`]:
/// the widths differ by a few percent, the implementations by tens.
const WIDTH_ROUNDS: usize = 5;

/// One implementation of the block-parallel modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Implementation {
    /// The `aes` crate's block-parallel loops (`parallel.rs`).
    AesCrate,
    /// OpenSSL EVP, one keyed context per lane, the IV set per job.
    Evp,
    /// `ring`'s AES-GCM (`gcm.rs`): GCM's other implementation.
    Ring,
}

impl fmt::Display for Implementation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Implementation::AesCrate => "aes-crate",
            Implementation::Evp => "openssl-evp",
            Implementation::Ring => "ring",
        })
    }
}

/// Both implementations' throughput at one job size, in bytes per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Probe {
    /// Job size in bytes.
    pub size: usize,
    /// The throughput of the implementation EVP is measured against (the `aes` crate,
    /// or `ring` for GCM: the choice's `native`).
    pub native: f64,
    /// EVP's throughput.
    pub evp: f64,
}

impl Probe {
    /// The faster implementation at this size, `native` being what [`Probe::native`]
    /// timed (EVP on a tie: it is the reference).
    pub fn winner(&self, native: Implementation) -> Implementation {
        if self.native > self.evp {
            native
        } else {
            Implementation::Evp
        }
    }
}

/// What runs one (mode, key size): one implementation below `crossover` bytes and
/// possibly another from it on, with the figures that decided it.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// The implementation for jobs shorter than `crossover`.
    pub small: Implementation,
    /// The implementation for jobs of `crossover` bytes and more.
    pub large: Implementation,
    /// Where `large` takes over (0 when one implementation runs every size).
    pub crossover: usize,
    /// The measurements, smallest size first; empty when configuration forced it.
    pub probes: Vec<Probe>,
    /// What EVP was measured against: the `aes` crate, or `ring` (GCM).
    pub native: Implementation,
}

impl Choice {
    /// One implementation for every size, by configuration.
    pub fn forced(implementation: Implementation) -> Self {
        Choice {
            small: implementation,
            large: implementation,
            crossover: 0,
            probes: Vec::new(),
            native: implementation,
        }
    }

    /// The choice these measurements give: the winner at the largest size from the
    /// smallest size on which it also won at every larger probe; the winner at the
    /// smallest size below that (so one implementation everywhere if the two agree).
    pub fn from_probes(native: Implementation, probes: Vec<Probe>) -> Self {
        let Some(last) = probes.last() else {
            return Choice::forced(Implementation::Evp);
        };
        let large = last.winner(native);
        let from = probes
            .iter()
            .rposition(|p| p.winner(native) != large)
            .map_or(0, |i| i + 1);
        let small = probes[0].winner(native);
        let crossover = match probes.get(from) {
            Some(p) if small != large => p.size,
            _ => 0,
        };
        Choice {
            small,
            large,
            crossover,
            probes,
            native,
        }
    }

    /// The implementation for a job of `len` bytes.
    #[inline]
    pub fn for_len(&self, len: usize) -> Implementation {
        if len < self.crossover {
            self.small
        } else {
            self.large
        }
    }

    /// Whether a job of `len` bytes runs on the `aes` crate.
    #[inline]
    pub(crate) fn uses_crate(&self, len: usize) -> bool {
        self.for_len(len) == Implementation::AesCrate
    }
}

impl fmt::Display for Choice {
    /// E.g. "aes-crate (measured 26.1 GB/s vs openssl-evp 12.0 GB/s at 16 KiB; ...)",
    /// or "openssl-evp below 1 KiB, aes-crate from 1 KiB (measured ...)".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.crossover == 0 {
            write!(f, "{}", self.large)?;
        } else {
            let at = size_name(self.crossover);
            write!(f, "{} below {at}, {} from {at}", self.small, self.large)?;
        }
        if self.probes.is_empty() {
            return f.write_str(" (set by configuration, not measured)");
        }
        f.write_str(" (measured")?;
        for (i, p) in self.probes.iter().rev().enumerate() {
            let winner = p.winner(self.native);
            let (win, lose, other) = if winner == Implementation::Evp {
                (p.evp, p.native, self.native)
            } else {
                (p.native, p.evp, Implementation::Evp)
            };
            write!(
                f,
                "{}{winner} {} vs {other} {} at {}",
                if i == 0 { " " } else { "; " },
                rate_name(win),
                rate_name(lose),
                size_name(p.size)
            )?;
        }
        f.write_str(")")
    }
}

/// "12.3 GB/s", or "45 MB/s" below 1 GB/s (an emulated or slow CPU), or "0.12 MB/s".
fn rate_name(bytes_per_second: f64) -> String {
    /// Rates are printed in GB/s from here up, in MB/s below.
    const GIGA: f64 = 1e9;
    /// MB/s with two decimals below this, none from it.
    const MEGA: f64 = 1e6;
    if bytes_per_second >= GIGA {
        format!("{:.1} GB/s", bytes_per_second / GIGA)
    } else if bytes_per_second >= MEGA {
        format!("{:.0} MB/s", bytes_per_second / MEGA)
    } else {
        format!("{:.2} MB/s", bytes_per_second / MEGA)
    }
}

/// "64 B", "1 KiB", "16 KiB".
fn size_name(size: usize) -> String {
    if size >= 1024 && size.is_multiple_of(1024) {
        format!("{} KiB", size / 1024)
    } else {
        format!("{size} B")
    }
}

/// The multi-buffer width an engine measured, with each width's throughput.
#[derive(Clone, Debug, PartialEq)]
pub struct ChainsChoice {
    /// The width lanes use.
    pub chains: usize,
    /// Whether lockstep groups run through VAES-512 (`vaes.rs`) rather than the `aes`
    /// crate's backend one block per call.
    pub vaes: bool,
    /// (width, bytes per second) for each width tried on the `aes` crate's backend,
    /// narrowest first; empty if the probe could not run and the width is
    /// [`super::DEFAULT_CHAINS`].
    pub probes: Vec<(usize, f64)>,
    /// The same through VAES-512, empty where the CPU has none.
    pub vaes_probes: Vec<(usize, f64)>,
}

impl ChainsChoice {
    /// The widest width within [`WIDTH_TOLERANCE`] of the fastest (`probes` run from
    /// narrow to wide).
    pub fn from_probes(probes: Vec<(usize, f64)>) -> Self {
        let chains = widest_near_best(&probes).map_or(super::DEFAULT_CHAINS, |(w, _)| w);
        ChainsChoice {
            chains,
            vaes: false,
            probes,
            vaes_probes: Vec::new(),
        }
    }

    /// Adds the VAES-512 widths' figures, and takes VAES-512's width (by the same rule)
    /// where it ran faster than the crate's chosen width.
    pub fn with_vaes(mut self, vaes_probes: Vec<(usize, f64)>) -> Self {
        let crate_rate = self
            .probes
            .iter()
            .find(|&&(w, _)| w == self.chains)
            .map_or(0.0, |&(_, r)| r);
        if let Some((w, r)) = widest_near_best(&vaes_probes) {
            if r > crate_rate {
                self.chains = w;
                self.vaes = true;
            }
        }
        self.vaes_probes = vaes_probes;
        self
    }
}

/// The widest (width, rate) within [`WIDTH_TOLERANCE`] of the fastest (`probes` run
/// from narrow to wide), if any.
fn widest_near_best(probes: &[(usize, f64)]) -> Option<(usize, f64)> {
    let best = probes.iter().map(|&(_, r)| r).fold(0.0, f64::max);
    probes
        .iter()
        .rev()
        .find(|&&(_, r)| r * WIDTH_TOLERANCE >= best)
        .copied()
}

impl fmt::Display for ChainsChoice {
    /// E.g. "measured 16-way 10.4 GB/s, 8-way 7.9 GB/s, 4-way 5.1 GB/s on 1 KiB jobs".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.probes.is_empty() {
            return f.write_str("the default width, not measured");
        }
        f.write_str("measured")?;
        let mut sep = " ";
        if !self.vaes_probes.is_empty() {
            f.write_str(" VAES-512")?;
            for (w, r) in self.vaes_probes.iter().rev() {
                write!(f, "{sep}{w}-way {}", rate_name(*r))?;
                sep = ", ";
            }
            f.write_str("; aes crate")?;
            sep = " ";
        }
        for (w, r) in self.probes.iter().rev() {
            write!(f, "{sep}{w}-way {}", rate_name(*r))?;
            sep = ", ";
        }
        write!(f, " on {} jobs", size_name(WIDTH_PROBE_SIZE))
    }
}

/// The (mode, key size) classes with two implementations: CTR and CBC decryption
/// (with or without padding: the padding is removed after the same block work) at
/// each key size, then GCM at the key sizes `ring` serves (`gcm::KEY_SIZES`).
const CLASSES: usize = 2 * KeySize::ALL.len() + GCM_KEY_SIZES.len();

/// The class of a GCM cipher `ring` serves, if it is one (either direction: `ring`
/// opens at the speed it seals, so encryption's measurement decides both).
fn gcm_class_of(cipher: Cipher) -> Option<usize> {
    if cipher.mode != Mode::Gcm {
        return None;
    }
    let size = GCM_KEY_SIZES.iter().position(|&k| k == cipher.key_size)?;
    Some(2 * KeySize::ALL.len() + size)
}

/// What EVP is measured against in a class: `ring` for GCM, the `aes` crate else.
fn native_of(class: usize) -> Implementation {
    if class >= 2 * KeySize::ALL.len() {
        Implementation::Ring
    } else {
        Implementation::AesCrate
    }
}

/// The class of a block-parallel cipher and direction, if it is one.
fn class_of(cipher: Cipher, direction: Direction) -> Option<usize> {
    let mode = match (cipher.mode, direction) {
        (Mode::Ctr, _) => 0,
        (Mode::Cbc | Mode::CbcPkcs7, Direction::Decrypt) => 1,
        _ => return None,
    };
    let size = KeySize::ALL.iter().position(|&k| k == cipher.key_size)?;
    Some(mode * KeySize::ALL.len() + size)
}

/// The cipher and direction the probe of a class times.
fn probe_job_kind(class: usize) -> (Cipher, Direction) {
    if let Some(&size) = class
        .checked_sub(2 * KeySize::ALL.len())
        .and_then(|k| GCM_KEY_SIZES.get(k))
    {
        return (Cipher::new(size, Mode::Gcm), Direction::Encrypt);
    }
    let size = KeySize::ALL[class % KeySize::ALL.len()];
    if class < KeySize::ALL.len() {
        (Cipher::new(size, Mode::Ctr), Direction::Encrypt)
    } else {
        (Cipher::new(size, Mode::Cbc), Direction::Decrypt)
    }
}

/// Per engine: a fixed implementation, or each class's measured choice.
#[derive(Debug, Default)]
pub(crate) struct Selection {
    forced: Option<Implementation>,
    measured: [OnceLock<Choice>; CLASSES],
}

/// The multi-buffer width, measured once per process.
static CHAINS: OnceLock<ChainsChoice> = OnceLock::new();

/// The measuring selection every engine left to measure shares.
static MEASURED: OnceLock<Arc<Selection>> = OnceLock::new();

impl Selection {
    /// A selection that always uses one implementation, or (`None`) the process's
    /// measuring one.
    pub(crate) fn new(forced: Option<Implementation>) -> Arc<Self> {
        match forced {
            None => Arc::clone(MEASURED.get_or_init(|| Arc::new(Selection::default()))),
            Some(_) => Arc::new(Selection {
                forced,
                measured: Default::default(),
            }),
        }
    }

    /// The multi-buffer width, measured on the first call in this process.
    pub(crate) fn chains(&self) -> &'static ChainsChoice {
        CHAINS.get_or_init(measure_chains)
    }

    /// The choice for a block-parallel cipher and direction (measured on the first
    /// call for its class), or `None` for the others (GCM, CBC encryption).
    #[inline]
    pub(crate) fn choice(&self, cipher: Cipher, direction: Direction) -> Option<&Choice> {
        let class = class_of(cipher, direction)?;
        Some(self.measured_for(class))
    }

    /// The choice for a GCM cipher `ring` serves (measured on the first call for its
    /// key size), or `None` for the others (AES-192-GCM, every other mode).
    #[inline]
    pub(crate) fn gcm_choice(&self, cipher: Cipher) -> Option<&Choice> {
        Some(self.measured_for(gcm_class_of(cipher)?))
    }

    /// A class's choice: forced (the crate's side is `ring` for GCM) or measured now.
    fn measured_for(&self, class: usize) -> &Choice {
        self.measured[class].get_or_init(|| match self.forced {
            Some(Implementation::Evp) => Choice::forced(Implementation::Evp),
            Some(_) => Choice::forced(native_of(class)),
            None => measure(class),
        })
    }
}

/// Times both implementations on one class's jobs at every probe size.
fn measure(class: usize) -> Choice {
    let (cipher, direction) = probe_job_kind(class);
    let keys = KeyStore::new();
    // Probe data, not a secret: a fixed key and input.
    let Ok(id) = keys.add(Key::new(vec![0x5a; cipher.key_len()])) else {
        return Choice::forced(Implementation::Evp);
    };
    let native = native_of(class);
    let mut lanes = [
        (native, forced_lane(native)),
        (Implementation::Evp, forced_lane(Implementation::Evp)),
    ];
    // GCM's probe takes the 96-bit IV `ring` serves; the block modes a whole block.
    let iv_len = if native == Implementation::Ring {
        super::gcm::IV_LEN
    } else {
        BLOCK_LEN
    };
    let mut out = JobOutput::default();
    let mut probes = Vec::with_capacity(PROBE_SIZES.len());
    for size in PROBE_SIZES {
        let Ok(job) = Job::with_iv(
            cipher,
            direction,
            id,
            &[0x3c; BLOCK_LEN][..iv_len],
            vec![0xa5; size],
        ) else {
            return Choice::forced(Implementation::Evp);
        };
        let jobs = round_jobs(size);
        let mut best = [Duration::MAX; 2];
        for round in 0..ROUNDS {
            // Alternate which implementation goes first.
            for k in round_order(round) {
                let lane = &mut lanes[k].1;
                // One untimed job: keyed context, expanded key, scratch, output.
                if lane.run_one(&job, &keys, &mut out).is_err() {
                    return Choice::forced(Implementation::Evp);
                }
                let start = Instant::now();
                for _ in 0..jobs {
                    if lane.run_one(&job, &keys, &mut out).is_err() {
                        return Choice::forced(Implementation::Evp);
                    }
                }
                best[k] = best[k].min(start.elapsed());
            }
        }
        debug_assert_eq!(lanes[1].0, Implementation::Evp);
        probes.push(Probe::timed(size, jobs, best));
    }
    Choice::from_probes(native, probes)
}

/// Jobs per timed round of the implementation probe at `size` bytes.
fn round_jobs(size: usize) -> usize {
    (ROUND_BYTES / size).max(MIN_ROUND_JOBS)
}

/// The order of round `round` of the implementation probe (0 the native side, 1 EVP):
/// which goes first alternates.
fn round_order(round: usize) -> [usize; 2] {
    [round % 2, 1 - round % 2]
}

/// The order of round `round` of the width probe over `n` lanes: it rotates.
fn rotation(round: usize, n: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (k + round) % n)
}

/// Bytes per second for `bytes` done in `took` (a zero time reads as very fast, not as
/// infinite).
fn rate(bytes: usize, took: Duration) -> f64 {
    bytes as f64 / took.as_secs_f64().max(f64::MIN_POSITIVE)
}

impl Probe {
    /// The probe of `jobs` jobs of `size` bytes per round, from each side's best round
    /// (the native side's, then EVP's).
    fn timed(size: usize, jobs: usize, best: [Duration; 2]) -> Probe {
        Probe {
            size,
            native: rate(jobs * size, best[0]),
            evp: rate(jobs * size, best[1]),
        }
    }
}

impl ChainsChoice {
    /// The choice from each width's best round of [`WIDTH_PROBE_JOBS`] jobs of
    /// [`WIDTH_PROBE_SIZE`] bytes: (width, through VAES-512, time).
    fn timed(best: &[(usize, bool, Duration)]) -> Self {
        let rates = |vaes: bool| -> Vec<(usize, f64)> {
            best.iter()
                .filter(|&&(_, v, _)| v == vaes)
                .map(|&(w, _, took)| (w, rate(WIDTH_PROBE_JOBS * WIDTH_PROBE_SIZE, took)))
                .collect()
        };
        ChainsChoice::from_probes(rates(false)).with_vaes(rates(true))
    }
}

/// Times lockstep CBC encryption of [`WIDTH_PROBE_JOBS`] 1 KiB jobs at each width.
fn measure_chains() -> ChainsChoice {
    use super::{BlockParallel, CpuEngine};
    use crate::engine::Lane;
    let keys = KeyStore::new();
    // Probe data, not a secret.
    let Ok(id) = keys.add(Key::new(vec![0x5a; KeySize::Aes128.key_len()])) else {
        return ChainsChoice::from_probes(Vec::new());
    };
    let jobs: Vec<Job> = (0..WIDTH_PROBE_JOBS)
        .map(|i| {
            Job::new(
                Cipher::AES_128_CBC,
                Direction::Encrypt,
                id,
                [i as u8; BLOCK_LEN],
                vec![0xa5; WIDTH_PROBE_SIZE],
            )
        })
        .collect();
    // (width, VAES-512, lane): the crate's backend at every width, then VAES-512's
    // widths where the CPU has it.
    let vaes_widths: &[usize] = if super::vaes::available() {
        &VAES_WIDTHS
    } else {
        &[]
    };
    let candidates = CHAIN_WIDTHS
        .iter()
        .map(|&w| (w, false))
        .chain(vaes_widths.iter().map(|&w| (w, true)));
    let mut lanes: Vec<(usize, bool, super::CpuLane)> = candidates
        .map(|(w, vaes)| {
            let engine = CpuEngine::with_lanes(1)
                .block_parallel(BlockParallel::On)
                .multibuffer(w)
                .lockstep_vaes(vaes);
            (w, vaes, engine.lane(0))
        })
        .collect();
    let mut outs = vec![JobOutput::default(); WIDTH_PROBE_JOBS];
    let mut results: Vec<crate::Result<()>> = (0..WIDTH_PROBE_JOBS).map(|_| Ok(())).collect();
    let mut best = vec![Duration::MAX; lanes.len()];
    // Every width gets the pulls a dispatcher hands a measured lane (the widest
    // width's jobs each: a narrower width rolls through them), so the widths differ
    // in the lockstep alone, not in the calls per job.
    let pull = CHAIN_WIDTHS[CHAIN_WIDTHS.len() - 1];
    let pulls: Vec<Vec<&Job>> = jobs.chunks(pull).map(|c| c.iter().collect()).collect();
    // One pass of every pull on a lane; whether a job failed.
    let mut pass = |lane: &mut super::CpuLane| {
        for ((refs, outs), results) in pulls
            .iter()
            .zip(outs.chunks_mut(pull))
            .zip(results.chunks_mut(pull))
        {
            lane.run_batch(refs, &keys, outs, results);
        }
        results.iter().any(Result::is_err)
    };
    // One untimed pass each (expanded keys, output buffers), then timed rounds in an
    // order that rotates.
    for (_, _, lane) in &mut lanes {
        if pass(lane) {
            return ChainsChoice::from_probes(Vec::new());
        }
    }
    for round in 0..WIDTH_ROUNDS {
        for k in rotation(round, lanes.len()) {
            let start = Instant::now();
            if pass(&mut lanes[k].2) {
                return ChainsChoice::from_probes(Vec::new());
            }
            best[k] = best[k].min(start.elapsed());
        }
    }
    let timed: Vec<(usize, bool, Duration)> = lanes
        .iter()
        .zip(best)
        .map(|(&(w, vaes, _), took)| (w, vaes, took))
        .collect();
    ChainsChoice::timed(&timed)
}

/// A one-lane `cpu` lane that always uses `implementation` for the block-parallel
/// modes.
fn forced_lane(implementation: Implementation) -> super::CpuLane {
    use super::{BlockParallel, CpuEngine};
    let parallel = match implementation {
        Implementation::AesCrate | Implementation::Ring => BlockParallel::On,
        Implementation::Evp => BlockParallel::Off,
    };
    CpuEngine::with_lanes(1).block_parallel(parallel).lane(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Implementation::{AesCrate, Evp};

    fn probe(size: usize, native: f64, evp: f64) -> Probe {
        Probe { size, native, evp }
    }

    #[test]
    fn one_winner_everywhere_has_no_crossover() {
        let c = Choice::from_probes(AesCrate, vec![probe(64, 2.0, 1.0), probe(16384, 9.0, 5.0)]);
        assert_eq!((c.small, c.large, c.crossover), (AesCrate, AesCrate, 0));
        assert_eq!(c.for_len(0), AesCrate);
        assert_eq!(c.for_len(1 << 20), AesCrate);
    }

    #[test]
    fn large_winner_takes_over_where_it_keeps_winning() {
        let c = Choice::from_probes(
            AesCrate,
            vec![
                probe(64, 2.0, 1.0),
                probe(1024, 4.0, 5.0),
                probe(16384, 6.0, 8.0),
            ],
        );
        assert_eq!((c.small, c.large, c.crossover), (AesCrate, Evp, 1024));
        assert_eq!(c.for_len(1023), AesCrate);
        assert_eq!(c.for_len(1024), Evp);
        // A middle size that flips back is not a crossover: only the tail counts.
        let c = Choice::from_probes(
            AesCrate,
            vec![
                probe(64, 1.0, 2.0),
                probe(1024, 5.0, 4.0),
                probe(16384, 6.0, 8.0),
            ],
        );
        assert_eq!((c.small, c.large, c.crossover), (Evp, Evp, 0));
    }

    #[test]
    fn widest_width_near_the_fastest_wins() {
        let c = ChainsChoice::from_probes(vec![(4, 5e9), (8, 7.9e9), (16, 10.4e9)]);
        assert_eq!(c.chains, 16);
        assert_eq!(
            c.to_string(),
            "measured 16-way 10.4 GB/s, 8-way 7.9 GB/s, 4-way 5.0 GB/s on 1 KiB jobs"
        );
        // Within 5% of the fastest: the wider width (Intel's probe, where 16 chains
        // then ran faster than 8).
        let c = ChainsChoice::from_probes(vec![(4, 4.0e9), (8, 5.5e9), (16, 5.3e9)]);
        assert_eq!(c.chains, 16);
        // More than 5% slower: the faster, narrower width.
        let c = ChainsChoice::from_probes(vec![(4, 5e9), (8, 9.9e9), (16, 9.2e9)]);
        assert_eq!(c.chains, 8);
        // Slow CPUs (an emulated guest) get MB/s, not "0.0 GB/s".
        let c = ChainsChoice::from_probes(vec![(4, 45e6), (8, 2.5e9), (16, 0.12e6)]);
        assert_eq!(
            c.to_string(),
            "measured 16-way 0.12 MB/s, 8-way 2.5 GB/s, 4-way 45 MB/s on 1 KiB jobs"
        );
        let c = ChainsChoice::from_probes(Vec::new());
        assert_eq!(c.chains, crate::engine::cpu::DEFAULT_CHAINS);
    }

    #[test]
    fn vaes_takes_over_only_where_it_ran_faster_than_the_crates_chosen_width() {
        let crate_probes = vec![(4, 5.9e9), (8, 8.0e9), (16, 10.6e9)];
        // The AMD EPYC's probe: VAES-512 16-way wins, by the same widest-near-best rule.
        let c = ChainsChoice::from_probes(crate_probes.clone())
            .with_vaes(vec![(8, 10.8e9), (16, 18.1e9)]);
        assert_eq!((c.chains, c.vaes), (16, true));
        assert_eq!(
            c.to_string(),
            "measured VAES-512 16-way 18.1 GB/s, 8-way 10.8 GB/s; \
             aes crate 16-way 10.6 GB/s, 8-way 8.0 GB/s, 4-way 5.9 GB/s on 1 KiB jobs"
        );
        // VAES-512 within 5% of its best at 16 and 8: the wider; slower than the crate's
        // chosen width: the crate keeps it.
        let c = ChainsChoice::from_probes(crate_probes.clone())
            .with_vaes(vec![(8, 10.5e9), (16, 10.2e9)]);
        assert_eq!((c.chains, c.vaes), (16, false));
        // No VAES-512 on the CPU: the crate's choice, figures as before.
        let c = ChainsChoice::from_probes(crate_probes).with_vaes(Vec::new());
        assert_eq!((c.chains, c.vaes), (16, false));
        assert!(!c.to_string().contains("VAES"));
    }

    #[test]
    fn ties_and_no_probes_go_to_evp() {
        assert_eq!(probe(64, 1.0, 1.0).winner(AesCrate), Evp);
        assert_eq!(
            Choice::from_probes(AesCrate, Vec::new()),
            Choice::forced(Evp)
        );
    }

    #[test]
    fn description_names_both_and_the_sizes() {
        let c = Choice::from_probes(AesCrate, vec![probe(64, 2e9, 1e9), probe(16384, 6e9, 8e9)]);
        assert_eq!(
            c.to_string(),
            "aes-crate below 16 KiB, openssl-evp from 16 KiB (measured openssl-evp 8.0 GB/s \
             vs aes-crate 6.0 GB/s at 16 KiB; aes-crate 2.0 GB/s vs openssl-evp 1.0 GB/s at 64 B)"
        );
        assert_eq!(
            Choice::forced(AesCrate).to_string(),
            "aes-crate (set by configuration, not measured)"
        );
    }

    #[test]
    fn classes_cover_ctr_cbc_decryption_and_ring_gcm_only() {
        let mut seen = [false; CLASSES];
        for cipher in Cipher::all() {
            for direction in [Direction::Encrypt, Direction::Decrypt] {
                match class_of(cipher, direction) {
                    Some(c) => {
                        let (probe_cipher, probe_direction) = probe_job_kind(c);
                        assert_eq!(probe_cipher.key_size, cipher.key_size);
                        assert_eq!(probe_cipher.mode == Mode::Ctr, cipher.mode == Mode::Ctr);
                        if cipher.mode != Mode::Ctr {
                            assert_eq!(probe_direction, direction);
                        }
                        assert_eq!(native_of(c), AesCrate);
                        seen[c] = true;
                    }
                    None => assert!(
                        cipher.mode == Mode::Gcm || direction == Direction::Encrypt,
                        "{cipher} {direction}"
                    ),
                }
            }
            match gcm_class_of(cipher) {
                Some(c) => {
                    assert_eq!(probe_job_kind(c), (cipher, Direction::Encrypt));
                    assert_eq!(native_of(c), Implementation::Ring);
                    assert!(class_of(cipher, Direction::Encrypt).is_none());
                    seen[c] = true;
                }
                None => assert!(
                    cipher.mode != Mode::Gcm || cipher.key_size == KeySize::Aes192,
                    "{cipher}"
                ),
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    /// The probes' arithmetic on fabricated times (the probe itself times the CPU).
    #[test]
    fn rounds_and_rates_from_fabricated_times() {
        // 16 KiB per round, at least 8 jobs.
        assert_eq!(
            PROBE_SIZES.map(round_jobs),
            [16 * 1024 / 64, 16 * 1024 / 1024, MIN_ROUND_JOBS]
        );
        assert_eq!(
            (0..3).map(round_order).collect::<Vec<_>>(),
            [[0, 1], [1, 0], [0, 1]]
        );
        assert_eq!(rotation(0, 3).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(rotation(1, 3).collect::<Vec<_>>(), [1, 2, 0]);
        assert_eq!(rotation(7, 5).collect::<Vec<_>>(), [2, 3, 4, 0, 1]);
        let ms = Duration::from_millis;
        // 64 jobs of 1 KiB: 65,536 bytes in 1 ms and in 4 ms.
        let p = Probe::timed(1024, 64, [ms(1), ms(4)]);
        assert_eq!(p.size, 1024);
        assert!((p.native - 65.536e6).abs() < 1.0, "{p:?}");
        assert!((p.evp - 16.384e6).abs() < 1.0, "{p:?}");
        assert!(rate(1, Duration::ZERO).is_finite());
        // 128 jobs of 1 KiB per width: 131,072 bytes.
        let c = ChainsChoice::timed(&[
            (4, false, ms(4)),
            (8, false, ms(2)),
            (16, false, ms(1)),
            (8, true, ms(2)),
            (16, true, ms(8)),
        ]);
        let widths = |v: &[(usize, f64)]| v.iter().map(|&(w, _)| w).collect::<Vec<_>>();
        assert_eq!(widths(&c.probes), [4, 8, 16]);
        assert_eq!(widths(&c.vaes_probes), [8, 16]);
        assert!((c.probes[0].1 - 32.768e6).abs() < 1.0, "{c:?}");
        assert!((c.vaes_probes[1].1 - 16.384e6).abs() < 1.0, "{c:?}");
        assert_eq!((c.chains, c.vaes), (16, false));
    }

    #[test]
    fn a_vaes_width_as_fast_as_the_crates_does_not_take_over() {
        let c = ChainsChoice::from_probes(vec![(4, 5e9), (8, 8e9), (16, 10e9)])
            .with_vaes(vec![(8, 9e9), (16, 10e9)]);
        assert_eq!((c.chains, c.vaes), (16, false));
    }

    #[test]
    fn uses_crate_only_where_the_crate_runs() {
        assert!(Choice::forced(AesCrate).uses_crate(1));
        assert!(!Choice::forced(Evp).uses_crate(1));
        assert!(!Choice::forced(Implementation::Ring).uses_crate(1));
    }

    #[test]
    fn sizes_not_whole_kib_are_named_in_bytes() {
        assert_eq!(size_name(0), "0 B");
        assert_eq!(size_name(1040), "1040 B");
        assert_eq!(size_name(2048), "2 KiB");
    }

    /// The measured choice is one of the two, with a probe per size, and stays put.
    #[test]
    fn measurement_probes_every_size_once() {
        let selection = Selection::new(None);
        assert!(Arc::ptr_eq(&selection, &Selection::new(None)), "shared");
        let first = selection
            .choice(Cipher::AES_128_CTR, Direction::Encrypt)
            .expect("CTR is block-parallel")
            .clone();
        // The sizes `hetcrypt engines` reports and the docs quote.
        assert_eq!(
            first.probes.iter().map(|p| p.size).collect::<Vec<_>>(),
            [64, 1024, 16 * 1024]
        );
        assert!(first.probes.iter().all(|p| p.evp > 0.0 && p.native > 0.0));
        let again = selection.choice(Cipher::AES_128_CTR, Direction::Decrypt);
        assert_eq!(again, Some(&first));
        assert!(selection
            .choice(Cipher::AES_128_GCM, Direction::Encrypt)
            .is_none());
        // GCM: ring against EVP, at every probe size.
        let gcm = selection
            .gcm_choice(Cipher::AES_256_GCM)
            .expect("ring serves AES-256-GCM");
        assert_eq!(gcm.native, Implementation::Ring);
        assert_eq!(gcm.probes.len(), PROBE_SIZES.len());
        assert!(gcm.probes.iter().all(|p| p.evp > 0.0 && p.native > 0.0));
        assert!([Implementation::Ring, Evp].contains(&gcm.large));
        assert!(selection.gcm_choice(Cipher::AES_192_GCM).is_none());
    }
}
