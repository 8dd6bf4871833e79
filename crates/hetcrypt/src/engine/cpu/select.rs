//! Which implementation runs CTR and CBC decryption on this CPU: both measured at first use, the faster kept.
//!
//! Two implementations can run the block-parallel modes: OpenSSL EVP (one keyed
//! context per lane, the IV set per job) and the `aes` crate's block-parallel loops
//! (`parallel.rs`). Which one is faster depends on the CPU and on the job size, not on
//! the CPU it was tuned on: on an Intel host with AES-NI and AVX-512F the crate won at
//! every size; on an AMD EPYC with VAES the issue-23 runs saw EVP win CTR at 16 KiB in
//! some runs. So the first job of each (mode, key size) on an engine times both on
//! jobs of a few sizes, in alternating rounds, and keeps the faster one per size band;
//! `hetcrypt engines` prints the figures. The probe costs about a millisecond per
//! (mode, key size), once per engine (clones share it).

use std::fmt;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::cipher::{Cipher, Direction, KeySize, Mode, BLOCK_LEN};
use crate::job::{Job, JobOutput};
use crate::key::{Key, KeyStore};

/// Job sizes the probe times both implementations at: a small job (where the fixed
/// cost per job decides), 1 KiB (`openssl speed`'s middle), and 16 KiB (its largest
/// block, and the C2SP chunk). Three sizes keep the probe near a millisecond.
const PROBE_SIZES: [usize; 3] = [64, 1024, 16 * 1024];

/// Input bytes each timed round processes per implementation and size: enough that a
/// round outlasts the clock's resolution many times over (tens of microseconds),
/// little enough that the whole probe stays near a millisecond.
const ROUND_BYTES: usize = 64 * 1024;

/// Fewest jobs per timed round (at 16 KiB, [`ROUND_BYTES`] alone would give 4).
const MIN_ROUND_JOBS: usize = 8;

/// Timed rounds per implementation and size, alternating which goes first; the best
/// round counts (a round that was preempted on a shared host only ever looks slower).
const ROUNDS: usize = 3;

/// One implementation of the block-parallel modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Implementation {
    /// The `aes` crate's block-parallel loops (`parallel.rs`).
    AesCrate,
    /// OpenSSL EVP, one keyed context per lane, the IV set per job.
    Evp,
}

impl fmt::Display for Implementation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Implementation::AesCrate => "aes-crate",
            Implementation::Evp => "openssl-evp",
        })
    }
}

/// Both implementations' throughput at one job size, in bytes per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Probe {
    /// Job size in bytes.
    pub size: usize,
    /// The `aes` crate's throughput.
    pub aes_crate: f64,
    /// EVP's throughput.
    pub evp: f64,
}

impl Probe {
    /// The faster implementation at this size (EVP on a tie: it is the reference).
    pub fn winner(&self) -> Implementation {
        if self.aes_crate > self.evp {
            Implementation::AesCrate
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
}

impl Choice {
    /// One implementation for every size, by configuration.
    pub fn forced(implementation: Implementation) -> Self {
        Choice {
            small: implementation,
            large: implementation,
            crossover: 0,
            probes: Vec::new(),
        }
    }

    /// The choice these measurements give: the winner at the largest size from the
    /// smallest size on which it also won at every larger probe; the winner at the
    /// smallest size below that (so one implementation everywhere if the two agree).
    pub fn from_probes(probes: Vec<Probe>) -> Self {
        let Some(last) = probes.last() else {
            return Choice::forced(Implementation::Evp);
        };
        let large = last.winner();
        let from = probes
            .iter()
            .rposition(|p| p.winner() != large)
            .map_or(0, |i| i + 1);
        let small = probes[0].winner();
        let crossover = match probes.get(from) {
            Some(p) if small != large => p.size,
            _ => 0,
        };
        Choice {
            small,
            large,
            crossover,
            probes,
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
            let (win, lose) = match p.winner() {
                Implementation::AesCrate => (p.aes_crate, p.evp),
                Implementation::Evp => (p.evp, p.aes_crate),
            };
            let other = match p.winner() {
                Implementation::AesCrate => Implementation::Evp,
                Implementation::Evp => Implementation::AesCrate,
            };
            write!(
                f,
                "{}{} {:.1} GB/s vs {other} {:.1} GB/s at {}",
                if i == 0 { " " } else { "; " },
                p.winner(),
                win / 1e9,
                lose / 1e9,
                size_name(p.size)
            )?;
        }
        f.write_str(")")
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

/// The (mode, key size) classes with two implementations: CTR and CBC decryption
/// (with or without padding: the padding is removed after the same block work).
const CLASSES: usize = 2 * KeySize::ALL.len();

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

impl Selection {
    /// A selection that measures (`None`) or always uses one implementation.
    pub(crate) fn new(forced: Option<Implementation>) -> Self {
        Selection {
            forced,
            measured: Default::default(),
        }
    }

    /// The choice for a block-parallel cipher and direction (measured on the first
    /// call for its class), or `None` for the others (GCM, CBC encryption).
    #[inline]
    pub(crate) fn choice(&self, cipher: Cipher, direction: Direction) -> Option<&Choice> {
        let class = class_of(cipher, direction)?;
        Some(self.measured[class].get_or_init(|| match self.forced {
            Some(implementation) => Choice::forced(implementation),
            None => measure(class),
        }))
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
    let mut lanes = [
        (
            Implementation::AesCrate,
            forced_lane(Implementation::AesCrate),
        ),
        (Implementation::Evp, forced_lane(Implementation::Evp)),
    ];
    let mut out = JobOutput::default();
    let mut probes = Vec::with_capacity(PROBE_SIZES.len());
    for size in PROBE_SIZES {
        let job = Job::new(cipher, direction, id, [0x3c; BLOCK_LEN], vec![0xa5; size]);
        let jobs = (ROUND_BYTES / size).max(MIN_ROUND_JOBS);
        let mut best = [Duration::MAX; 2];
        for round in 0..ROUNDS {
            // Alternate which implementation goes first.
            for k in [round % 2, 1 - round % 2] {
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
        let rate = |d: Duration| (jobs * size) as f64 / d.as_secs_f64().max(f64::MIN_POSITIVE);
        debug_assert_eq!(lanes[0].0, Implementation::AesCrate);
        probes.push(Probe {
            size,
            aes_crate: rate(best[0]),
            evp: rate(best[1]),
        });
    }
    Choice::from_probes(probes)
}

/// A one-lane `cpu` lane that always uses `implementation` for the block-parallel
/// modes.
fn forced_lane(implementation: Implementation) -> super::CpuLane {
    use super::{BlockParallel, CpuEngine};
    let parallel = match implementation {
        Implementation::AesCrate => BlockParallel::On,
        Implementation::Evp => BlockParallel::Off,
    };
    CpuEngine::with_lanes(1).block_parallel(parallel).lane(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Implementation::{AesCrate, Evp};

    fn probe(size: usize, aes_crate: f64, evp: f64) -> Probe {
        Probe {
            size,
            aes_crate,
            evp,
        }
    }

    #[test]
    fn one_winner_everywhere_has_no_crossover() {
        let c = Choice::from_probes(vec![probe(64, 2.0, 1.0), probe(16384, 9.0, 5.0)]);
        assert_eq!((c.small, c.large, c.crossover), (AesCrate, AesCrate, 0));
        assert_eq!(c.for_len(0), AesCrate);
        assert_eq!(c.for_len(1 << 20), AesCrate);
    }

    #[test]
    fn large_winner_takes_over_where_it_keeps_winning() {
        let c = Choice::from_probes(vec![
            probe(64, 2.0, 1.0),
            probe(1024, 4.0, 5.0),
            probe(16384, 6.0, 8.0),
        ]);
        assert_eq!((c.small, c.large, c.crossover), (AesCrate, Evp, 1024));
        assert_eq!(c.for_len(1023), AesCrate);
        assert_eq!(c.for_len(1024), Evp);
        // A middle size that flips back is not a crossover: only the tail counts.
        let c = Choice::from_probes(vec![
            probe(64, 1.0, 2.0),
            probe(1024, 5.0, 4.0),
            probe(16384, 6.0, 8.0),
        ]);
        assert_eq!((c.small, c.large, c.crossover), (Evp, Evp, 0));
    }

    #[test]
    fn ties_and_no_probes_go_to_evp() {
        assert_eq!(probe(64, 1.0, 1.0).winner(), Evp);
        assert_eq!(Choice::from_probes(Vec::new()), Choice::forced(Evp));
    }

    #[test]
    fn description_names_both_and_the_sizes() {
        let c = Choice::from_probes(vec![probe(64, 2e9, 1e9), probe(16384, 6e9, 8e9)]);
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
    fn classes_cover_ctr_and_cbc_decryption_only() {
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
                        seen[c] = true;
                    }
                    None => assert!(
                        cipher.mode == Mode::Gcm || direction == Direction::Encrypt,
                        "{cipher} {direction}"
                    ),
                }
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    /// The measured choice is one of the two, with a probe per size, and stays put.
    #[test]
    fn measurement_probes_every_size_once() {
        let selection = Selection::new(None);
        let first = selection
            .choice(Cipher::AES_128_CTR, Direction::Encrypt)
            .expect("CTR is block-parallel")
            .clone();
        assert_eq!(
            first.probes.iter().map(|p| p.size).collect::<Vec<_>>(),
            PROBE_SIZES
        );
        assert!(first
            .probes
            .iter()
            .all(|p| p.evp > 0.0 && p.aes_crate > 0.0));
        let again = selection.choice(Cipher::AES_128_CTR, Direction::Decrypt);
        assert_eq!(again, Some(&first));
        assert!(selection
            .choice(Cipher::AES_128_GCM, Direction::Encrypt)
            .is_none());
    }
}
