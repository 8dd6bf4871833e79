//! The `cpu` engine: OpenSSL EVP in software (AES-NI where the CPU has it), the `aes`
//! crate block-parallel for CTR and CBC decryption where it measures faster, and
//! multi-buffer CBC encryption when a lane is given several messages at once.

mod chain;
mod gcm;
mod multibuf;
mod parallel;
mod select;
#[cfg(target_arch = "x86_64")]
mod vaes;
#[cfg(not(target_arch = "x86_64"))]
#[path = "cpu/vaes_none.rs"]
mod vaes;

use std::cell::Cell;
use std::sync::Arc;

use block_padding::{Padding, Pkcs7};

use openssl::cipher::CipherRef;
use openssl::cipher_ctx::CipherCtx;

use crate::cipher::{Cipher, Direction, KeySize, Mode, BLOCK_LEN};
use crate::engine::{CipherDriver, Engine, EngineInfo, EngineKind, EngineRef, Lane, RawJob};
use crate::error::{Error, Result};
use crate::job::{InputRules, Job, JobOutput, TAG_LEN};
use crate::key::{KeyId, KeyStore};

pub use multibuf::MAX_CHAINS;
pub use select::{ChainsChoice, Choice, Implementation, Probe, CHAIN_WIDTHS};

/// A multi-buffer width that works well everywhere measured so far, the fallback if
/// the probe cannot run. On the first (Intel) host 4 chains reached ~3.5x one chain, 8
/// reached 4.7-4.9x, 12 and 16 no more (docs/performance.md, `chains` sweep); on the
/// AMD EPYC hosts 16 ran ~30% faster than 8, so engines now measure the width at first
/// use among [`CHAIN_WIDTHS`] (see `select.rs`).
pub const DEFAULT_CHAINS: usize = 8;

/// The widest of [`CHAIN_WIDTHS`]: the batch an engine whose width is left to
/// measurement asks for (a multiple of every candidate, so lockstep groups stay full).
const WIDEST_CHAINS: usize = CHAIN_WIDTHS[CHAIN_WIDTHS.len() - 1];

/// Jobs a lane takes per pull for CTR and CBC decryption (where the `aes` crate may
/// run them): the dispatcher's and the backend's set-up per pull (the pull's
/// bookkeeping, the implementation lookup, choosing the backend and loading its round
/// keys) is shared by 64 jobs instead of 16 (the lockstep width). Measured on the AMD
/// EPYC (issue 23, one lane, `hetcrypt speed --cpu-time`, three alternating rounds):
/// CTR at 16/64/256 B ran ~15%/8%/7% faster than with pulls of 16; pulls of 256 were
/// no faster at 16-64 B and 8% slower at 256 B (a pull's inputs and outputs outgrow
/// L1). A wider pull also means coarser sharing between engines: 64 jobs of 16 KiB
/// are 1 MiB.
const BLOCK_PARALLEL_BATCH: usize = 64;

/// The OpenSSL cipher for one of ours.
fn evp_cipher(cipher: Cipher) -> &'static CipherRef {
    use openssl::cipher::Cipher as C;
    match (cipher.key_size, cipher.mode) {
        (KeySize::Aes128, Mode::Cbc | Mode::CbcPkcs7) => C::aes_128_cbc(),
        (KeySize::Aes192, Mode::Cbc | Mode::CbcPkcs7) => C::aes_192_cbc(),
        (KeySize::Aes256, Mode::Cbc | Mode::CbcPkcs7) => C::aes_256_cbc(),
        (KeySize::Aes128, Mode::Ctr) => C::aes_128_ctr(),
        (KeySize::Aes192, Mode::Ctr) => C::aes_192_ctr(),
        (KeySize::Aes256, Mode::Ctr) => C::aes_256_ctr(),
        (KeySize::Aes128, Mode::Gcm) => C::aes_128_gcm(),
        (KeySize::Aes192, Mode::Gcm) => C::aes_192_gcm(),
        (KeySize::Aes256, Mode::Gcm) => C::aes_256_gcm(),
    }
}

/// Whether a job is CBC encryption, the one serial mode multi-buffer speeds up.
fn is_cbc_encrypt(job: &Job) -> bool {
    job.direction == Direction::Encrypt && matches!(job.cipher.mode, Mode::Cbc | Mode::CbcPkcs7)
}

/// Which implementation a [`select::Choice`] runs at each job size, as a copy.
#[derive(Clone, Copy)]
struct SizeRule {
    small: Implementation,
    large: Implementation,
    crossover: usize,
}

impl SizeRule {
    fn of(choice: &select::Choice) -> Self {
        SizeRule {
            small: choice.small,
            large: choice.large,
            crossover: choice.crossover,
        }
    }

    /// [`select::Choice::uses_crate`].
    #[inline]
    fn uses_crate(self, len: usize) -> bool {
        let implementation = if len < self.crossover {
            self.small
        } else {
            self.large
        };
        implementation == Implementation::AesCrate
    }
}

/// The group of a job for the `aes` crate's block-parallel path: jobs of one group
/// (key, key size, and CTR or CBC decryption) share one backend call.
#[inline]
fn group_of(job: &Job) -> (KeyId, KeySize, bool) {
    (job.key, job.cipher.key_size, job.cipher.mode == Mode::Ctr)
}

/// Who runs the work that is parallel over blocks or messages — CTR, CBC decryption
/// and multi-buffer CBC encryption: the `aes` crate, or OpenSSL EVP one job at a time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BlockParallel {
    /// CTR and CBC decryption: whichever of the `aes` crate and EVP measures faster on
    /// this CPU, per key size and size band, timed at the first job of each (see
    /// `select.rs`). Multi-buffer CBC encryption: on where the CPU has AES instructions;
    /// without them OpenSSL's vector-permute AES ran one CBC chain 2x as fast as the
    /// crate's constant-time software backend ran eight (docs/performance.md).
    #[default]
    Auto,
    /// Always the `aes` crate, even with its software backend (tests use this to
    /// cover that backend wherever they run).
    On,
    /// Always EVP (multi-buffer off too).
    Off,
}

impl BlockParallel {
    /// Whether lanes may encrypt CBC messages in lockstep on the `aes` crate.
    fn multibuffer(self) -> bool {
        match self {
            BlockParallel::Auto => aes::hardware_accelerated(),
            BlockParallel::On => true,
            BlockParallel::Off => false,
        }
    }

    /// The implementation this setting forces on CTR and CBC decryption, if any.
    fn forced(self) -> Option<Implementation> {
        match self {
            BlockParallel::Auto => None,
            BlockParallel::On => Some(Implementation::AesCrate),
            BlockParallel::Off => Some(Implementation::Evp),
        }
    }
}

/// Host cores this process may run on.
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Software AES through OpenSSL's EVP interface; one lane per thread.
#[derive(Clone, Debug)]
pub struct CpuEngine {
    name: String,
    lanes: usize,
    pinned: bool,
    /// The multi-buffer width set by [`CpuEngine::multibuffer`], or `None` to measure.
    chains: Option<usize>,
    /// Whether lockstep groups run through VAES-512 (`vaes.rs`), if set; unset, a
    /// measured width comes with its measured choice and a fixed one uses VAES-512
    /// wherever the CPU has it.
    vaes: Option<bool>,
    parallel: BlockParallel,
    /// Which implementation runs CTR and CBC decryption, measured once per process and
    /// shared by every engine left to measure.
    select: Arc<select::Selection>,
}

impl Default for CpuEngine {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuEngine {
    /// A `cpu` engine with one lane per core available to this process (its affinity
    /// mask and cgroup quota included), so it never runs more busy threads than cores.
    pub fn new() -> Self {
        Self::with_lanes(available_cores())
    }

    /// A `cpu` engine with `lanes` lanes (at least one), even more than there are
    /// cores if asked.
    pub fn with_lanes(lanes: usize) -> Self {
        CpuEngine {
            name: "cpu".to_string(),
            lanes: lanes.max(1),
            pinned: false,
            chains: None,
            vaes: None,
            parallel: BlockParallel::Auto,
            select: select::Selection::new(None),
        }
    }

    /// Renames the engine (to put two `cpu` engines in one dispatcher, e.g. in tests).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Pins lane `i`'s thread to the `i`-th core this process may use (round-robin
    /// when there are more lanes than cores). Off by default: the OS places threads.
    pub fn pinned(mut self, pinned: bool) -> Self {
        self.pinned = pinned;
        self
    }

    /// Sets how many CBC messages a lane encrypts in lockstep (1 to [`MAX_CHAINS`];
    /// 1 turns multi-buffer off and every job goes through EVP alone). Unset, the
    /// engine measures the fastest of [`CHAIN_WIDTHS`] at first use.
    pub fn multibuffer(mut self, chains: usize) -> Self {
        self.chains = Some(chains.clamp(1, MAX_CHAINS));
        self
    }

    /// Sets whether lockstep CBC runs through VAES-512 where the CPU has it (`true`)
    /// or through the `aes` crate's backend one block per call (`false`). Unset, the
    /// engine uses the measured choice (see [`CpuEngine::multibuffer`]).
    pub fn lockstep_vaes(mut self, on: bool) -> Self {
        self.vaes = Some(on);
        self
    }

    /// The measured multi-buffer width and its figures, where the width was left to
    /// measurement and the CPU runs multi-buffer (measuring now if not yet done).
    pub fn multibuffer_choice(&self) -> Option<ChainsChoice> {
        (self.chains.is_none() && self.parallel.multibuffer()).then(|| self.select.chains().clone())
    }

    /// Sets who runs CTR, CBC decryption and multi-buffer CBC encryption (default
    /// [`BlockParallel::Auto`]).
    pub fn block_parallel(mut self, parallel: BlockParallel) -> Self {
        self.parallel = parallel;
        self.select = select::Selection::new(parallel.forced());
        self
    }

    /// Which implementation runs `cipher` in `direction` on this engine's lanes and
    /// why, for the block-parallel ones (CTR, CBC decryption); `None` for the others,
    /// which have one implementation. The first call for a (mode, key size) measures
    /// both implementations (well under a millisecond) unless configuration forced one.
    pub fn choice(&self, cipher: Cipher, direction: Direction) -> Option<Choice> {
        self.select.choice(cipher, direction).cloned()
    }

    /// The lockstep width lanes use and whether it runs through VAES-512 (see
    /// [`Width::unit`]), measuring now if no lane has yet.
    fn lockstep_unit(&self) -> (usize, bool) {
        self.width().unit(self.vaes, &self.select)
    }

    /// The lockstep width as lanes hold it: a measured width stays unmeasured until
    /// the first batch that runs in lockstep, so a process that never encrypts CBC
    /// in batches never pays for the probe.
    fn width(&self) -> Width {
        match (self.parallel.multibuffer(), self.chains) {
            (false, _) => Width::Fixed(1),
            (true, Some(chains)) => Width::Fixed(chains),
            (true, None) => Width::Measured,
        }
    }

    /// The lockstep width, or where it is left to measurement, the widest the
    /// measurement can pick.
    fn lockstep_batch(&self) -> usize {
        match self.width() {
            Width::Fixed(chains) => chains,
            Width::Measured => WIDEST_CHAINS,
        }
    }

    /// Wraps the engine for a dispatcher.
    pub fn into_engine(self) -> EngineRef {
        Arc::new(self)
    }

    /// Opens a lane directly, without a dispatcher (benchmarks, tests).
    pub fn lane(&self, index: usize) -> CpuLane {
        CpuLane {
            contexts: Vec::new(),
            cbc_chains: Vec::new(),
            aes_keys: Vec::new(),
            vaes_keys: Vec::new(),
            gcm_keys: Vec::new(),
            width: self.width(),
            vaes: self.vaes,
            select: Arc::clone(&self.select),
            ctr_scratch: None,
            core: self.pinned.then(|| core_for_lane(index)).flatten(),
            picked: Vec::with_capacity(self.max_batch()),
            ctr_picked: Vec::with_capacity(self.max_batch()),
            pads: Vec::with_capacity(self.max_batch()),
        }
    }
}

/// Which backend the `aes` crate picks on this CPU, for reports. The crate chooses at
/// run time (VAES with AVX-512, else AES-NI, else constant-time software); this
/// mirrors its test so `hetcrypt engines` can say what runs.
fn aes_backend() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("vaes")
            && std::arch::is_x86_feature_detected!("avx512f")
        {
            return "VAES-512";
        }
        if std::arch::is_x86_feature_detected!("vaes") {
            return "VAES-256";
        }
    }
    if aes::hardware_accelerated() {
        "AES-NI"
    } else {
        "software"
    }
}

impl Engine for CpuEngine {
    fn name(&self) -> &str {
        &self.name
    }

    /// Per cipher, which implementation runs it and why: CTR and CBC decryption say
    /// which of the `aes` crate and EVP measured faster (measuring them now if no job
    /// has yet), with the figures; GCM and CBC encryption have one implementation
    /// (and multi-buffer CBC encryption for batches).
    fn info(&self) -> EngineInfo {
        let version = openssl::version::version();
        let (chains, uses_vaes) = self.lockstep_unit();
        EngineInfo {
            name: self.name.clone(),
            kind: EngineKind::Cpu,
            lanes: self.lanes,
            ciphers: Cipher::all()
                .map(|cipher| {
                    let evp = evp_cipher(cipher).nid().short_name().unwrap_or("?");
                    let evp = format!("{version} EVP {evp}");
                    let both = |direction| {
                        let choice = self
                            .choice(cipher, direction)
                            .map_or_else(|| Implementation::Evp.to_string(), |c| c.to_string());
                        format!(
                            "{choice} [aes-crate: aes crate ({}) block-parallel; \
                             openssl-evp: {evp}]",
                            aes_backend()
                        )
                    };
                    let driver = match cipher.mode {
                        Mode::Ctr => both(Direction::Encrypt),
                        Mode::Cbc | Mode::CbcPkcs7 => {
                            let multibuf = if chains > 1 {
                                let why = self
                                    .multibuffer_choice()
                                    .map_or_else(String::new, |c| format!(" ({c})"));
                                let unit = if uses_vaes {
                                    "VAES-512 lockstep".to_string()
                                } else {
                                    format!("aes crate ({})", aes_backend())
                                };
                                format!("; batches: {chains}-way multi-buffer, {unit}{why}")
                            } else {
                                String::new()
                            };
                            format!(
                                "encryption: openssl-evp ({evp}){multibuf}; decryption: {}",
                                both(Direction::Decrypt)
                            )
                        }
                        Mode::Gcm => match self.select.gcm_choice(cipher) {
                            Some(choice) => format!(
                                "{choice} [ring: ring {} AES-GCM; openssl-evp: {evp}]",
                                gcm::RING_VERSION
                            ),
                            None => format!(
                                "openssl-evp ({evp}; ring has no {cipher}, so the one implementation)"
                            ),
                        },
                    };
                    CipherDriver {
                        cipher,
                        driver,
                        priority: None,
                        module: None,
                        is_async: None,
                    }
                })
                .collect(),
        }
    }

    /// Without measuring anything (a dispatcher asks when it opens).
    fn kind(&self) -> EngineKind {
        EngineKind::Cpu
    }

    fn lanes(&self) -> usize {
        self.lanes
    }

    fn supports(&self, _cipher: Cipher, _direction: Direction) -> bool {
        true
    }

    fn open_lane(&self, index: usize) -> Result<Box<dyn Lane>> {
        let mut lane = self.lane(index);
        lane.pin()?;
        Ok(Box::new(lane))
    }

    /// The lockstep width, or where it is left to measurement, the widest the
    /// measurement can pick: opening a dispatcher then does not run the probe, and a
    /// batch wider than the measured width runs as a rolling lockstep at that width.
    fn max_batch(&self) -> usize {
        if self.parallel == BlockParallel::Off {
            self.lockstep_batch()
        } else {
            self.lockstep_batch().max(BLOCK_PARALLEL_BATCH)
        }
    }

    /// CTR and CBC decryption, where the `aes` crate may run them:
    /// [`BLOCK_PARALLEL_BATCH`] jobs a pull, so short messages share a keystream or
    /// decryption pass (`parallel.rs`); everything else as wide as lockstep CBC
    /// encryption takes (GCM runs job by job inside a batch as before).
    fn batch_width(&self, cipher: Cipher, direction: Direction) -> usize {
        let block_parallel = cipher.mode == Mode::Ctr
            || (direction == Direction::Decrypt
                && matches!(cipher.mode, Mode::Cbc | Mode::CbcPkcs7));
        if block_parallel && self.parallel != BlockParallel::Off {
            BLOCK_PARALLEL_BATCH
        } else {
            self.lockstep_batch()
        }
    }

    /// A pinned lane would pin the caller's thread too.
    fn runs_on_any_thread(&self) -> bool {
        !self.pinned
    }
}

/// The core lane `index` runs on when pinned, or `None` if the affinity mask cannot be
/// read (then the lane is left where the OS puts it).
fn core_for_lane(index: usize) -> Option<usize> {
    use nix::sched::{sched_getaffinity, CpuSet};
    use nix::unistd::Pid;
    let allowed = sched_getaffinity(Pid::from_raw(0)).ok()?;
    let cores: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| allowed.is_set(c).unwrap_or(false))
        .collect();
    cores.get(index % cores.len().max(1)).copied()
}

thread_local! {
    /// The core this thread was pinned to, so a lane re-pins only a new thread (the
    /// dispatcher runs each batch on fresh threads).
    static PINNED_TO: Cell<Option<usize>> = const { Cell::new(None) };
}

/// How many CBC messages a lane encrypts in lockstep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Width {
    /// Set by configuration (1: no lockstep, every job through EVP alone).
    Fixed(usize),
    /// The process's measured width, measured at the first lockstep batch.
    Measured,
}

impl Width {
    /// The lockstep width and whether its groups run through VAES-512: a fixed width
    /// as set (1: EVP one job at a time) or the process's measured one (measuring now
    /// if no lane has yet); VAES-512 as configured (`vaes`), else as measured with a
    /// measured width, else wherever the CPU has it, and never where it has not.
    fn unit(self, vaes: Option<bool>, select: &select::Selection) -> (usize, bool) {
        let (chains, wanted) = match self {
            Width::Fixed(chains) => (chains, vaes.unwrap_or(true)),
            Width::Measured => {
                let choice = select.chains();
                (choice.chains, vaes.unwrap_or(choice.vaes))
            }
        };
        (chains, wanted && vaes::available())
    }

    /// Whether batches of CBC encryption run in lockstep (every measured width does).
    fn lockstep(self) -> bool {
        match self {
            Width::Fixed(chains) => chains > 1,
            Width::Measured => true,
        }
    }
}

/// One `cpu` lane: keyed EVP contexts re-initialised with only the IV per job (small
/// jobs pay no key schedule), expanded AES keys for multi-buffer CBC, and scratch
/// space reused from batch to batch.
pub struct CpuLane {
    /// Keyed contexts, most recently used last. A list, not a hash map: a lane sees
    /// a handful of (key, cipher, direction) triples, and comparing a few 12-byte
    /// tuples costs less than hashing one (which showed in profiles of 16-byte jobs).
    contexts: Vec<((KeyId, Cipher, Direction), CipherCtx)>,
    /// CBC encryption contexts per (key, size) that are never re-initialised (see
    /// `chain.rs`), most recently used last.
    cbc_chains: Vec<((KeyId, KeySize), chain::CbcChain)>,
    /// Expanded keys per (key, size), most recently used last (a list for the same
    /// reason as `contexts`); zeroized on drop by the `aes` crate.
    aes_keys: Vec<((KeyId, KeySize), multibuf::AesKey)>,
    /// VAES-512 key schedules per (key, size) for lockstep CBC, most recently used
    /// last; zeroized on drop (`vaes.rs`).
    vaes_keys: Vec<((KeyId, KeySize), vaes::RoundKeys)>,
    /// Whether lockstep CBC runs through VAES-512, if configured.
    vaes: Option<bool>,
    /// `ring` GCM key schedules per (key, size), most recently used last; zeroed on
    /// drop (`gcm.rs`).
    gcm_keys: Vec<((KeyId, KeySize), gcm::GcmKey)>,
    width: Width,
    /// Which implementation runs CTR and CBC decryption, per key size and job size.
    select: Arc<select::Selection>,
    /// CTR's counter and keystream blocks, made on the first CTR job.
    ctr_scratch: Option<Box<parallel::CtrScratch>>,
    /// The core to pin this lane's thread to, if pinning was asked for.
    core: Option<usize>,
    /// Batch positions of the CBC encryption jobs of the current batch.
    picked: Vec<usize>,
    /// Batch positions of the CTR and CBC decryption jobs of the current batch
    /// (block-parallel lanes).
    ctr_picked: Vec<usize>,
    /// The PKCS#7-padded last block of each job of the current batch.
    pads: Vec<[u8; BLOCK_LEN]>,
}

impl CpuLane {
    /// Pins the calling thread to this lane's core, unless it already is.
    #[inline]
    fn pin(&mut self) -> Result<()> {
        match self.core {
            Some(core) if PINNED_TO.get() != Some(core) => self.pin_to(core),
            _ => Ok(()),
        }
    }

    /// Pins the calling thread to `core`.
    #[cold]
    fn pin_to(&mut self, core: usize) -> Result<()> {
        use nix::sched::{sched_setaffinity, CpuSet};
        let mut set = CpuSet::new();
        set.set(core)
            .and_then(|()| sched_setaffinity(nix::unistd::Pid::from_raw(0), &set))
            .map_err(|e| Error::EngineFailed {
                engine: "cpu".to_string(),
                reason: format!("cannot pin a lane to core {core}: {e}"),
            })?;
        PINNED_TO.set(Some(core));
        Ok(())
    }

    /// The keyed context for this job, created on first use.
    fn context(&mut self, job: &Job, keys: &KeyStore) -> Result<&mut CipherCtx> {
        self.context_for(job.key, job.cipher, job.direction, keys)
    }

    /// The keyed context for (key, cipher, direction), created on first use.
    fn context_for(
        &mut self,
        id: KeyId,
        cipher: Cipher,
        direction: Direction,
        keys: &KeyStore,
    ) -> Result<&mut CipherCtx> {
        most_recent(&mut self.contexts, (id, cipher, direction), || {
            keys.with_key(id, |key| keyed_context(cipher, direction, key.as_bytes()))?
        })
    }

    /// Runs a raw CTR job, or CBC decryption, straight from the caller's input into
    /// its output: through the `aes` crate where it is chosen, else (CTR) through EVP;
    /// `None` where neither applies (CBC on EVP wants a block of room past the
    /// output, so it goes through a [`Job`]).
    fn run_raw_direct(
        &mut self,
        job: &RawJob<'_>,
        keys: &KeyStore,
        out: &mut [u8],
    ) -> Option<Result<()>> {
        let len = job.input.len();
        let uses_crate = self
            .select
            .choice(job.cipher, job.direction)
            .is_some_and(|c| c.uses_crate(len));
        if uses_crate {
            let key = match aes_key(&mut self.aes_keys, job.key, job.cipher, keys) {
                Ok(key) => key,
                Err(e) => return Some(Err(e)),
            };
            if job.cipher.mode == Mode::Ctr {
                let scratch = self
                    .ctr_scratch
                    .get_or_insert_with(parallel::CtrScratch::new);
                parallel::ctr(key, job.iv, job.input, out, scratch);
            } else {
                parallel::cbc_decrypt(key, job.iv, job.input, out);
            }
            return Some(Ok(()));
        }
        if job.cipher.mode != Mode::Ctr {
            return None;
        }
        Some((|| {
            let ctx = self.context_for(job.key, job.cipher, job.direction, keys)?;
            match job.direction {
                Direction::Encrypt => ctx.encrypt_init(None, None, Some(&job.iv))?,
                Direction::Decrypt => ctx.decrypt_init(None, None, Some(&job.iv))?,
            }
            // CTR is a stream: EVP writes exactly the input's length, and the openssl
            // crate asks for no room beyond it (its block size is 1).
            let written = ctx.cipher_update(job.input, Some(out))?;
            debug_assert_eq!(written, len);
            Ok(())
        })())
    }

    /// The chained CBC encryption context for this job's key, created on first use.
    fn cbc_chain(&mut self, job: &Job, keys: &KeyStore) -> Result<&mut chain::CbcChain> {
        most_recent(&mut self.cbc_chains, (job.key, job.cipher.key_size), || {
            let cbc = Cipher {
                key_size: job.cipher.key_size,
                mode: Mode::Cbc,
            };
            let ctx = keys.with_key(job.key, |key| {
                // A wrong key length is reported for the job's own cipher.
                keyed_context(cbc, Direction::Encrypt, key.as_bytes()).map_err(|e| match e {
                    Error::KeyLength { expected, got, .. } => Error::KeyLength {
                        cipher: job.cipher,
                        expected,
                        got,
                    },
                    e => e,
                })
            })??;
            Ok(chain::CbcChain::new(ctx))
        })
    }

    /// Whether this job goes to the `aes` crate: it is block-parallel (CTR, CBC
    /// decryption) and the crate is the faster implementation at its size.
    #[inline]
    fn uses_crate(&self, job: &Job) -> bool {
        self.select
            .choice(job.cipher, job.direction)
            .is_some_and(|c| c.uses_crate(job.input.len()))
    }

    /// Whether `job` is GCM that `ring` serves (AES-128/256, a 96-bit IV, within
    /// [`gcm::MAX_INPUT`]) and `ring` is the faster implementation at its size.
    #[inline]
    fn uses_ring(&self, job: &Job) -> bool {
        job.cipher.mode == Mode::Gcm
            && job.iv().len() == gcm::IV_LEN
            && job.input.len() <= gcm::MAX_INPUT
            && self
                .select
                .gcm_choice(job.cipher)
                .is_some_and(|c| c.for_len(job.input.len()) == Implementation::Ring)
    }

    /// Runs a validated GCM job through `ring` (see [`CpuLane::uses_ring`]).
    fn run_ring(&mut self, job: &Job, keys: &KeyStore, out: &mut JobOutput) -> Result<()> {
        let (key, iv) = self.ring_key(job, keys)?;
        out.tag = None;
        match job.direction {
            Direction::Encrypt => {
                out.tag = Some(gcm::seal(key, &iv, &job.aad, &job.input, &mut out.data)?);
                Ok(())
            }
            Direction::Decrypt => {
                let tag = job
                    .tag
                    .as_ref()
                    .ok_or(Error::MissingTag { cipher: job.cipher })?;
                gcm::open(key, &iv, &job.aad, &job.input, tag, &mut out.data)
            }
        }
    }

    /// [`CpuLane::run_ring`] in the job's own input buffer, which becomes `out.data`
    /// (see [`Lane::run_in_place`]).
    fn run_ring_in_place(
        &mut self,
        job: &mut Job,
        keys: &KeyStore,
        out: &mut JobOutput,
    ) -> Result<()> {
        std::mem::swap(&mut job.input, &mut out.data);
        out.tag = None;
        let result = self
            .ring_key(job, keys)
            .and_then(|(key, iv)| match job.direction {
                Direction::Encrypt => {
                    out.tag = Some(gcm::seal_in_place(key, &iv, &job.aad, &mut out.data)?);
                    Ok(())
                }
                Direction::Decrypt => {
                    let tag = job
                        .tag
                        .as_ref()
                        .ok_or(Error::MissingTag { cipher: job.cipher })?;
                    gcm::open_in_place(key, &iv, &job.aad, tag, &mut out.data)
                }
            });
        if result.is_err() {
            // No input (or, opening, unauthenticated plaintext) is left as a result.
            zeroize::Zeroize::zeroize(out.data.as_mut_slice());
            out.data.clear();
        }
        result
    }

    /// The job's `ring` key schedule (made on first use) and its 96-bit IV.
    fn ring_key(
        &mut self,
        job: &Job,
        keys: &KeyStore,
    ) -> Result<(&gcm::GcmKey, [u8; gcm::IV_LEN])> {
        let cipher = job.cipher;
        let iv: [u8; gcm::IV_LEN] = job.iv().try_into().map_err(|_| Error::IvLength {
            cipher,
            expected: gcm::IV_LEN,
            got: job.iv().len(),
        })?;
        let key = most_recent(&mut self.gcm_keys, (job.key, cipher.key_size), || {
            keys.with_key(job.key, |key| {
                gcm::GcmKey::new(cipher, key.as_bytes()).unwrap_or(Err(Error::NoEngine { cipher }))
            })?
        })?;
        Ok((key, iv))
    }

    /// Runs one job, through the `aes` crate if it is block-parallel and the crate is
    /// chosen for it, else through EVP (CBC encryption on a chained context; the
    /// thread is pinned already).
    #[inline]
    fn run_one(&mut self, job: &Job, keys: &KeyStore, out: &mut JobOutput) -> Result<()> {
        let result = job.validate().and_then(|()| {
            if self.uses_crate(job) {
                self.run_parallel(job, keys, out)
            } else if self.uses_ring(job) {
                self.run_ring(job, keys, out)
            } else if is_cbc_encrypt(job) {
                self.cbc_chain(job, keys)?.encrypt(job, out)
            } else {
                run_evp(self.context(job, keys)?, job, out)
            }
        });
        if result.is_err() {
            out.data.clear();
            out.tag = None;
        }
        result
    }

    /// Runs a validated CTR or CBC decryption job through the `aes` crate; PKCS#7
    /// padding is checked and removed as EVP does (a bad pad is
    /// [`Error::AuthenticationFailed`], as from EVP).
    fn run_parallel(&mut self, job: &Job, keys: &KeyStore, out: &mut JobOutput) -> Result<()> {
        let key = aes_key(&mut self.aes_keys, job.key, job.cipher, keys)?;
        let iv: [u8; BLOCK_LEN] = job.iv().try_into().map_err(|_| Error::IvLength {
            cipher: job.cipher,
            expected: BLOCK_LEN,
            got: job.iv().len(),
        })?;
        let len = job.input.len();
        size_output(out, len);
        if job.cipher.mode == Mode::Ctr {
            let scratch = self
                .ctr_scratch
                .get_or_insert_with(parallel::CtrScratch::new);
            parallel::ctr(key, iv, &job.input, &mut out.data, scratch);
            return Ok(());
        }
        parallel::cbc_decrypt(key, iv, &job.input, &mut out.data);
        if job.cipher.mode == Mode::CbcPkcs7 {
            return unpad(out);
        }
        Ok(())
    }

    /// Runs the validated jobs `group` (batch positions in ascending order, all CTR or
    /// all CBC decryption, under one key and key size) in one call of the `aes`
    /// crate's backend; PKCS#7 padding is checked and removed per job afterwards.
    fn run_parallel_group(
        &mut self,
        jobs: &[&Job],
        group: &[usize],
        keys: &KeyStore,
        outs: &mut [JobOutput],
        results: &mut [Result<()>],
    ) {
        let first = jobs[group[0]];
        let key = match aes_key(&mut self.aes_keys, first.key, first.cipher, keys) {
            Ok(key) => key,
            Err(e) => {
                for &k in group {
                    outs[k].data.clear();
                    outs[k].tag = None;
                    results[k] = Err(copy_error_for(&e, jobs[k].cipher));
                }
                return;
            }
        };
        let ctr = first.cipher.mode == Mode::Ctr;
        if group.len() == jobs.len() {
            // Every job of the batch (the common case): positions need no matching.
            let messages = jobs
                .iter()
                .zip(outs.iter_mut())
                .map(|(&job, out)| message(job, out));
            run_messages(key, ctr, messages, &mut self.ctr_scratch);
        } else {
            // `group` is in ascending order: walk it beside the outputs (a `contains`
            // per output was quadratic in the batch width).
            let mut wanted = group.iter().copied().peekable();
            let messages = outs
                .iter_mut()
                .enumerate()
                .filter(move |&(k, _)| wanted.next_if_eq(&k).is_some())
                .map(|(k, out)| message(jobs[k], out));
            run_messages(key, ctr, messages, &mut self.ctr_scratch);
        }
        if ctr {
            for &k in group {
                results[k] = Ok(());
            }
            return;
        }
        for &k in group {
            results[k] = match jobs[k].cipher.mode {
                Mode::CbcPkcs7 => unpad(&mut outs[k]),
                _ => Ok(()),
            };
        }
    }

    /// Runs the CBC encryption jobs `group` (batch positions, all under one key and
    /// key size, at least two) in lockstep.
    fn run_multibuf(
        &mut self,
        jobs: &[&Job],
        group: &[usize],
        keys: &KeyStore,
        outs: &mut [JobOutput],
        results: &mut [Result<()>],
    ) {
        let first = jobs[group[0]];
        let key = match aes_key(&mut self.aes_keys, first.key, first.cipher, keys) {
            Ok(key) => key,
            Err(e) => {
                // Every job of the group shares the key and so the error (but not
                // always the mode: CBC with and without padding share a group).
                for &k in group {
                    results[k] = Err(copy_error_for(&e, jobs[k].cipher));
                }
                return;
            }
        };
        self.pads.clear();
        self.pads.resize(jobs.len(), [0; BLOCK_LEN]);
        for &k in group {
            if jobs[k].cipher.mode == Mode::CbcPkcs7 {
                self.pads[k] = pkcs7_last_block(&jobs[k].input);
            }
        }
        let pads = &self.pads;
        let chains = group.iter().map(|&k| {
            let job = jobs[k];
            let whole = job.input.len() / BLOCK_LEN * BLOCK_LEN;
            let padded = job.cipher.mode == Mode::CbcPkcs7;
            let mut iv = [0u8; BLOCK_LEN];
            iv.copy_from_slice(job.iv());
            multibuf::Chain {
                blocks: &job.input[..whole],
                last: if padded { &pads[k][..] } else { &[] },
                iv,
                out: k,
            }
        });
        let (width, use_vaes) = self.width.unit(self.vaes, &self.select);
        let vaes_key = if use_vaes {
            vaes_key(&mut self.vaes_keys, first.key, first.cipher, keys)
        } else {
            None
        };
        multibuf::encrypt_cbc(key, vaes_key, width, chains, outs);
        for &k in group {
            results[k] = Ok(());
        }
    }
}

/// Runs one group's messages, all CTR (`ctr`) or all CBC decryption, in one backend
/// call: one body for the whole-batch and the matched-positions iterators.
#[inline(always)]
fn run_messages<'a>(
    key: &multibuf::AesKey,
    ctr: bool,
    messages: impl Iterator<Item = parallel::Message<'a>>,
    scratch: &mut Option<Box<parallel::CtrScratch>>,
) {
    if ctr {
        let scratch = scratch.get_or_insert_with(parallel::CtrScratch::new);
        parallel::ctr_messages(key, messages, scratch);
    } else {
        parallel::cbc_decrypt_messages(key, messages);
    }
}

/// A validated job's message for the block-parallel loops, its output sized to it.
#[inline(always)]
fn message<'a>(job: &'a Job, out: &'a mut JobOutput) -> parallel::Message<'a> {
    size_output(out, job.input.len());
    parallel::Message {
        iv: job
            .iv()
            .try_into()
            .expect("validate() checked the IV length"),
        input: &job.input,
        out: &mut out.data,
    }
}

/// Checks and removes the PKCS#7 padding of a decrypted message of at least one block
/// (validate() refuses empty ones), as EVP does: a bad pad is
/// [`Error::AuthenticationFailed`] and leaves the output empty.
fn unpad(out: &mut JobOutput) -> Result<()> {
    let last = out.data.len() - BLOCK_LEN;
    match Pkcs7::raw_unpad(&out.data[last..]) {
        Ok(kept) => {
            let kept = kept.len();
            out.data.truncate(last + kept);
            Ok(())
        }
        Err(_) => {
            out.data.clear();
            Err(Error::AuthenticationFailed)
        }
    }
}

/// Makes `out` a `len`-byte output with no tag, for a path that overwrites every byte:
/// a fresh buffer is one zeroed allocation, a reused one is zeroed only where it grows.
#[inline]
fn size_output(out: &mut JobOutput, len: usize) {
    out.tag = None;
    if out.data.len() == len {
        // A buffer reused at the same size (the common case of a batch of equal
        // jobs): nothing to do.
    } else if out.data.capacity() < len {
        out.data = vec![0; len];
    } else {
        out.data.truncate(len);
        out.data.resize(len, 0);
    }
}

/// The expanded `aes` crate key for `id` at `cipher`'s key size from a lane's cache
/// (most recently used last), created on first use.
fn aes_key<'c>(
    cache: &'c mut Vec<((KeyId, KeySize), multibuf::AesKey)>,
    id: KeyId,
    cipher: Cipher,
    keys: &KeyStore,
) -> Result<&'c multibuf::AesKey> {
    Ok(expanded(cache, id, cipher, keys, multibuf::AesKey::new)?)
}

/// The VAES-512 key schedule for `id` at `cipher`'s key size from a lane's cache
/// (most recently used last), made on first use; `None` where the CPU has no
/// VAES-512 or the key is gone. Only the `Some`/`None` is kept: the `aes` crate's key,
/// looked up first, reported a missing key or one of the wrong length, and a CPU
/// without VAES-512 runs the crate's path instead.
fn vaes_key<'c>(
    cache: &'c mut Vec<((KeyId, KeySize), vaes::RoundKeys)>,
    id: KeyId,
    cipher: Cipher,
    keys: &KeyStore,
) -> Option<&'c vaes::RoundKeys> {
    expanded(cache, id, cipher, keys, vaes::RoundKeys::new)
        .ok()
        .map(|k| &*k)
}

/// A key schedule `make` builds from key `id`'s bytes for `cipher`'s key size, from a
/// lane's cache (most recently used last), made on first use; `make`'s `None` is a
/// key of the wrong length.
fn expanded<'c, V>(
    cache: &'c mut Vec<((KeyId, KeySize), V)>,
    id: KeyId,
    cipher: Cipher,
    keys: &KeyStore,
    make: impl FnOnce(KeySize, &[u8]) -> Option<V>,
) -> Result<&'c mut V> {
    most_recent(cache, (id, cipher.key_size), || {
        keys.with_key(id, |key| {
            make(cipher.key_size, key.as_bytes()).ok_or(Error::KeyLength {
                cipher,
                expected: cipher.key_len(),
                got: key.len(),
            })
        })?
    })
}

/// The value for `id` in a most-recently-used-last list, moved to the end, or made by
/// `make` and pushed there. The lane's caches are such lists rather than hash maps: a
/// lane sees a handful of keys, and comparing a few small tuples costs less than
/// hashing one (which showed in profiles of 16-byte jobs). The most recent is last,
/// not first: a tree of small files brings a new key per file (up to a batch's worth
/// before they are forgotten), and putting each first moved every schedule kept
/// (`memmove`, 2.5% of a 4,000 x 16 KiB run's CPU).
fn most_recent<K: PartialEq, V>(
    list: &mut Vec<(K, V)>,
    id: K,
    make: impl FnOnce() -> Result<V>,
) -> Result<&mut V> {
    match list.iter().rposition(|(k, _)| *k == id) {
        Some(i) if i + 1 == list.len() => {}
        Some(i) => list[i..].rotate_left(1),
        None => {
            let value = make()?;
            list.push((id, value));
        }
    }
    let last = list.len() - 1;
    Ok(&mut list[last].1)
}

/// [`copy_error`] for one job of a group that shares a key: a key length error names
/// that job's cipher (a group may mix CBC with and without padding under one key).
fn copy_error_for(e: &Error, cipher: Cipher) -> Error {
    match copy_error(e) {
        Error::KeyLength { expected, got, .. } => Error::KeyLength {
            cipher,
            expected,
            got,
        },
        other => other,
    }
}

/// An error copied for each job it concerns (errors are not `Clone`): a key lookup's
/// errors as they are, anything else (a failed pinning) as an engine failure.
fn copy_error(e: &Error) -> Error {
    match e {
        Error::UnknownKey(id) => Error::UnknownKey(*id),
        Error::KeyLength {
            cipher,
            expected,
            got,
        } => Error::KeyLength {
            cipher: *cipher,
            expected: *expected,
            got: *got,
        },
        other => Error::EngineFailed {
            engine: "cpu".to_string(),
            reason: other.to_string(),
        },
    }
}

/// The last block of a PKCS#7-padded message: the input's trailing partial block
/// followed by `n` bytes of value `n` (a whole block of 16s if the input is aligned).
fn pkcs7_last_block(input: &[u8]) -> [u8; BLOCK_LEN] {
    let tail = &input[input.len() / BLOCK_LEN * BLOCK_LEN..];
    let pad = (BLOCK_LEN - tail.len()) as u8;
    let mut block = [pad; BLOCK_LEN];
    block[..tail.len()].copy_from_slice(tail);
    block
}

/// A context keyed for `cipher` in `direction`, without an IV yet.
fn keyed_context(cipher: Cipher, direction: Direction, key: &[u8]) -> Result<CipherCtx> {
    if key.len() != cipher.key_len() {
        return Err(Error::KeyLength {
            cipher,
            expected: cipher.key_len(),
            got: key.len(),
        });
    }
    let mut ctx = CipherCtx::new()?;
    let evp = evp_cipher(cipher);
    match direction {
        Direction::Encrypt => ctx.encrypt_init(Some(evp), Some(key), None)?,
        Direction::Decrypt => ctx.decrypt_init(Some(evp), Some(key), None)?,
    }
    // Padding is on by default and only CBC without it needs the call: OpenSSL 3
    // re-applies an explicit padding setting through its parameter lookup at every
    // IV-only re-init, which showed as ~1/6 of the time of a 16-byte CTR job.
    if cipher.mode == Mode::Cbc {
        ctx.set_padding(false);
    }
    Ok(ctx)
}

impl Lane for CpuLane {
    fn run(&mut self, job: &Job, keys: &KeyStore, out: &mut JobOutput) -> Result<()> {
        self.pin()?;
        self.run_one(job, keys, out)
    }

    /// CTR either way, and CBC decryption where the `aes` crate runs it, read the
    /// caller's input and write its output with no copy and no allocation (what the
    /// OpenSSL provider hands a lane per call); CBC on EVP goes through a [`Job`].
    fn run_raw(&mut self, job: &RawJob<'_>, keys: &KeyStore, out: &mut [u8]) -> Result<()> {
        self.pin()?;
        let len = job.input.len();
        let whole_blocks = job.cipher.mode == Mode::Ctr || len.is_multiple_of(BLOCK_LEN);
        if !matches!(job.cipher.mode, Mode::Cbc | Mode::Ctr) || out.len() != len || !whole_blocks {
            return Err(Error::InputLength {
                cipher: job.cipher,
                len,
            });
        }
        if let Some(result) = self.run_raw_direct(job, keys, out) {
            return result;
        }
        super::run_raw_copied(job, out, |owned, result| self.run_one(owned, keys, result))
    }

    /// GCM that `ring` runs (`CpuLane::uses_ring`), valid, on a lane that pins.
    fn runs_in_place(&mut self, job: &Job) -> bool {
        self.uses_ring(job) && job.validate().is_ok() && self.pin().is_ok()
    }

    fn run_in_place(&mut self, job: &mut Job, keys: &KeyStore, out: &mut JobOutput) -> Result<()> {
        self.pin()?;
        if job.validate().is_ok() && self.uses_ring(job) {
            self.run_ring_in_place(job, keys, out)
        } else {
            self.run_one(job, keys, out)
        }
    }

    /// Drops the keyed contexts and expanded keys of removed keys (the `aes` crate's
    /// keys and the VAES-512 schedules are zeroized on drop, EVP frees its own key
    /// schedule).
    fn forget_keys(&mut self, ids: &[KeyId]) -> bool {
        self.contexts.retain(|((id, _, _), _)| !ids.contains(id));
        self.cbc_chains.retain(|((id, _), _)| !ids.contains(id));
        self.aes_keys.retain(|((id, _), _)| !ids.contains(id));
        self.vaes_keys.retain(|((id, _), _)| !ids.contains(id));
        self.gcm_keys.retain(|((id, _), _)| !ids.contains(id));
        true
    }

    /// Sends the batch's CBC encryption jobs, grouped by key, through multi-buffer
    /// lockstep and its CTR and CBC decryption jobs, grouped by key and mode, through
    /// one `aes` crate backend call per group (block-parallel lanes); every other job
    /// (and a lone CBC encryption job) one at a time.
    fn run_batch(
        &mut self,
        jobs: &[&Job],
        keys: &KeyStore,
        outs: &mut [JobOutput],
        results: &mut [Result<()>],
    ) {
        if let Err(e) = self.pin() {
            for result in results.iter_mut() {
                *result = Err(copy_error(&e));
            }
            return;
        }
        let mut picked = std::mem::take(&mut self.picked);
        picked.clear();
        let mut ctr_picked = std::mem::take(&mut self.ctr_picked);
        ctr_picked.clear();
        let lockstep = self.width.lockstep();
        // The choice of the last (cipher, direction) seen: a batch is mostly of one
        // kind, so it is looked up once per run of such jobs, not once per job.
        // Copied out of the choice (no handle on the selection held across the loop's
        // calls that borrow the lane: an `Arc` clone per batch cost more than this).
        let mut last: Option<((Cipher, Direction), Option<SizeRule>)> = None;
        // The group (see `group_of`) of the first job for the `aes` crate, and whether
        // every later one is of the same group: then they need no sorting.
        let mut first_group = None;
        let mut one_group = true;
        for (k, job) in jobs.iter().enumerate() {
            if lockstep && is_cbc_encrypt(job) {
                match job.validate() {
                    Ok(()) => picked.push(k),
                    Err(e) => results[k] = Err(e),
                }
                continue;
            }
            let pair = (job.cipher, job.direction);
            let choice = match last {
                Some((seen, choice)) if seen == pair => choice,
                _ => {
                    let choice = self
                        .select
                        .choice(job.cipher, job.direction)
                        .map(SizeRule::of);
                    last = Some((pair, choice));
                    choice
                }
            };
            if choice.is_some_and(|c| c.uses_crate(job.input.len())) {
                match job.validate() {
                    Ok(()) => {
                        let group = group_of(job);
                        match first_group {
                            None => first_group = Some(group),
                            Some(first) => one_group &= first == group,
                        }
                        ctr_picked.push(k);
                    }
                    Err(e) => {
                        outs[k].data.clear();
                        outs[k].tag = None;
                        results[k] = Err(e);
                    }
                }
            } else {
                results[k] = self.run_one(job, keys, &mut outs[k]);
            }
        }
        if one_group {
            // The common batch (one key, one cipher): one group as it stands.
            if !ctr_picked.is_empty() {
                self.run_parallel_group(jobs, &ctr_picked, keys, outs, results);
            }
        } else {
            // CTR jobs, and CBC decryption jobs, under the same key (and key size)
            // share one backend call.
            ctr_picked.sort_by_key(|&k| group_of(jobs[k]));
            for group in ctr_picked.chunk_by(|&a, &b| group_of(jobs[a]) == group_of(jobs[b])) {
                self.run_parallel_group(jobs, group, keys, outs, results);
            }
        }
        self.ctr_picked = ctr_picked;
        if picked.is_empty() {
            self.picked = picked;
            return;
        }
        // Jobs under the same key (and key size) share one lockstep run.
        picked.sort_unstable_by_key(|&k| (jobs[k].key, jobs[k].cipher.key_size));
        for group in picked.chunk_by(|&a, &b| {
            (jobs[a].key, jobs[a].cipher.key_size) == (jobs[b].key, jobs[b].cipher.key_size)
        }) {
            if let [k] = group {
                // One chain gains nothing from lockstep: EVP's CBC is as fast alone.
                results[*k] = self.run_one(jobs[*k], keys, &mut outs[*k]);
            } else {
                self.run_multibuf(jobs, group, keys, outs, results);
            }
        }
        self.picked = picked;
    }

    /// The in-line lane's common pull: every job CTR under one key (or every job CBC
    /// decryption under one key), each valid and for the `aes` crate at its size, runs
    /// in one backend call writing into the caller's slots. Anything else (mixed
    /// ciphers or keys, an invalid job, a size EVP runs, a key the store lacks, a
    /// failed pinning) returns false, so that `run_batch` runs it and reports its
    /// errors as before.
    fn run_slots(
        &mut self,
        jobs: &[Job],
        keys: &KeyStore,
        slots: &mut [Result<JobOutput>],
    ) -> bool {
        let Some(first) = jobs.first() else {
            return false;
        };
        if jobs.len() != slots.len() || self.pin().is_err() {
            return false;
        }
        let (cipher, direction, id) = (first.cipher, first.direction, first.key);
        // The path takes CTR and CBC decryption only; what `Job::validate` asks of
        // their lengths is looked up once for the pull.
        if !matches!(
            (cipher.mode, direction),
            (Mode::Ctr, _) | (Mode::Cbc | Mode::CbcPkcs7, Direction::Decrypt)
        ) {
            return false;
        }
        let InputRules {
            whole_blocks,
            non_empty,
        } = InputRules::of(cipher, direction);
        let Some(rule) = self.select.choice(cipher, direction).map(SizeRule::of) else {
            return false;
        };
        for job in jobs {
            let len = job.input.len();
            let fits = job.cipher == cipher
                && job.direction == direction
                && job.key == id
                && job.iv().len() == BLOCK_LEN
                && (!whole_blocks || len.is_multiple_of(BLOCK_LEN))
                && (!non_empty || len > 0)
                && rule.uses_crate(len);
            if !fits {
                return false;
            }
        }
        let Ok(key) = aes_key(&mut self.aes_keys, id, cipher, keys) else {
            return false;
        };
        let messages = jobs
            .iter()
            .zip(slots.iter_mut())
            .map(|(job, slot)| message(job, slot_output(slot)));
        run_messages(
            key,
            cipher.mode == Mode::Ctr,
            messages,
            &mut self.ctr_scratch,
        );
        if cipher.mode == Mode::CbcPkcs7 {
            for slot in slots.iter_mut() {
                if let Err(e) = unpad(slot_output(slot)) {
                    *slot = Err(e);
                }
            }
        }
        true
    }
}

/// The output in a result slot, made an empty one first if the slot holds an error.
#[inline(always)]
fn slot_output(slot: &mut Result<JobOutput>) -> &mut JobOutput {
    if slot.is_err() {
        *slot = Ok(JobOutput::default());
    }
    match slot {
        Ok(out) => out,
        Err(_) => unreachable!("the slot was just given an output"),
    }
}

/// Runs one job on a keyed context.
///
/// The output buffer is only grown, never cleared first, so a buffer reused from job to
/// job is not zero-filled again each time.
fn run_evp(ctx: &mut CipherCtx, job: &Job, out: &mut JobOutput) -> Result<()> {
    let cipher = job.cipher;
    match job.direction {
        Direction::Encrypt => ctx.encrypt_init(None, None, Some(job.iv()))?,
        Direction::Decrypt => ctx.decrypt_init(None, None, Some(job.iv()))?,
    }
    out.tag = None;
    if cipher.is_aead() && !job.aad.is_empty() {
        ctx.cipher_update(&job.aad, None)?;
    }
    // EVP wants room for the input plus one block it may hold back or add (padding).
    let room = job.input.len() + BLOCK_LEN;
    if out.data.capacity() == 0 {
        // A fresh buffer (the dispatcher hands each job one): zeroed allocation in
        // one call, cheaper than growing an empty vector.
        out.data = vec![0; room];
    } else if out.data.len() < room {
        out.data.resize(room, 0);
    }
    let written = ctx.cipher_update(&job.input, Some(&mut out.data))?;
    if cipher.is_aead() && job.direction == Direction::Decrypt {
        let tag = job.tag.as_ref().ok_or(Error::MissingTag { cipher })?;
        ctx.set_tag(tag)?;
    }
    let authenticates =
        cipher.is_aead() || (cipher.mode == Mode::CbcPkcs7 && job.direction == Direction::Decrypt);
    match ctx.cipher_final(&mut out.data[written..]) {
        Ok(last) => out.data.truncate(written + last),
        Err(_) if authenticates => return Err(Error::AuthenticationFailed),
        Err(e) => return Err(e.into()),
    }
    if cipher.is_aead() && job.direction == Direction::Encrypt {
        let mut tag = [0u8; TAG_LEN];
        ctx.tag(&mut tag)?;
        out.tag = Some(tag);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;

    /// OpenSSL's one-shot API, independent of our cached contexts: the reference.
    fn reference(job: &Job, key: &[u8]) -> Vec<u8> {
        let c = match job.cipher.key_size {
            KeySize::Aes128 => openssl::symm::Cipher::aes_128_cbc(),
            KeySize::Aes192 => openssl::symm::Cipher::aes_192_cbc(),
            KeySize::Aes256 => openssl::symm::Cipher::aes_256_cbc(),
        };
        let mut crypter =
            openssl::symm::Crypter::new(c, openssl::symm::Mode::Encrypt, key, Some(job.iv()))
                .unwrap();
        crypter.pad(job.cipher.mode == Mode::CbcPkcs7);
        let mut out = vec![0; job.input.len() + 16];
        let n = crypter.update(&job.input, &mut out).unwrap();
        let m = crypter.finalize(&mut out[n..]).unwrap();
        out.truncate(n + m);
        out
    }

    /// Adds each key to `keys`; their ids, in order.
    fn add_keys(keys: &KeyStore, key_bytes: &[Vec<u8>]) -> Vec<KeyId> {
        key_bytes
            .iter()
            .map(|k| keys.add(Key::new(k.clone())).unwrap())
            .collect()
    }

    /// Deterministic filler so every job's bytes differ.
    fn bytes(seed: usize, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(131)) as u8)
            .collect()
    }

    fn run_batch_of(lane: &mut CpuLane, keys: &KeyStore, jobs: &[Job]) -> Vec<Result<JobOutput>> {
        let refs: Vec<&Job> = jobs.iter().collect();
        // Stale contents prove the lane replaces, not appends to, an output.
        let mut outs = vec![
            JobOutput {
                data: vec![0xee; 40],
                tag: Some([1; 16])
            };
            jobs.len()
        ];
        let mut results: Vec<Result<()>> = (0..jobs.len()).map(|_| Ok(())).collect();
        lane.run_batch(&refs, keys, &mut outs, &mut results);
        results
            .into_iter()
            .zip(outs)
            .map(|(r, o)| r.map(|()| o))
            .collect()
    }

    #[test]
    fn multibuffer_matches_openssl_on_mixed_lengths_and_keys() {
        let keys = KeyStore::new();
        let key_bytes = [
            vec![0x11; 16],
            vec![0x22; 24],
            vec![0x33; 32],
            vec![0x44; 16],
        ];
        let ids = add_keys(&keys, &key_bytes);
        let sizes = [
            KeySize::Aes128,
            KeySize::Aes192,
            KeySize::Aes256,
            KeySize::Aes128,
        ];
        // Lengths in blocks, mixed so chains finish at different steps; 0 and 1 block
        // included.
        let lens = [0, 1, 2, 3, 64, 5, 1, 0, 17, 8, 100, 1, 33, 2, 7, 9];
        for chains in [2, 4, 8, MAX_CHAINS] {
            let engine = CpuEngine::with_lanes(1)
                .block_parallel(BlockParallel::On)
                .multibuffer(chains);
            let mut lane = engine.lane(0);
            for padded in [false, true] {
                let jobs: Vec<Job> = lens
                    .iter()
                    .enumerate()
                    .take(chains)
                    .map(|(i, &blocks)| {
                        // Pairs of jobs share a key: several lockstep groups per batch.
                        let k = (i / 2) % key_bytes.len();
                        let mode = if padded { Mode::CbcPkcs7 } else { Mode::Cbc };
                        // PKCS#7 jobs get odd lengths so the tail is a real partial block.
                        let len = blocks * BLOCK_LEN + if padded { i % BLOCK_LEN } else { 0 };
                        Job::new(
                            Cipher::new(sizes[k], mode),
                            Direction::Encrypt,
                            ids[k],
                            [i as u8; 16],
                            bytes(i, len),
                        )
                    })
                    .collect();
                let outs = run_batch_of(&mut lane, &keys, &jobs);
                for (i, (job, out)) in jobs.iter().zip(outs).enumerate() {
                    let out = out.unwrap_or_else(|e| panic!("job {i}: {e}"));
                    let k = ids.iter().position(|&id| id == job.key).unwrap();
                    assert_eq!(
                        out.data,
                        reference(job, &key_bytes[k]),
                        "chains {chains}, padded {padded}, job {i}"
                    );
                    assert_eq!(out.tag, None);
                }
            }
        }
    }

    /// A removed key's contexts and expanded keys leave the lane; the others stay and
    /// still work.
    #[test]
    fn forgotten_keys_leave_the_lane() {
        let keys = KeyStore::new();
        let a = keys.add(Key::new(vec![1; 16])).unwrap();
        let b = keys.add(Key::new(vec![2; 16])).unwrap();
        // Lockstep through VAES-512 where the CPU has it, so that the lane holds
        // those schedules too.
        let engine = CpuEngine::with_lanes(1)
            .block_parallel(BlockParallel::On)
            .multibuffer(8)
            .lockstep_vaes(true);
        let mut lane = engine.lane(0);
        let jobs: Vec<Job> = [a, b, a, b]
            .iter()
            .enumerate()
            .flat_map(|(i, &id)| {
                [Cipher::AES_128_CBC, Cipher::AES_128_GCM].map(|c| {
                    let iv = vec![i as u8; c.iv_len()];
                    Job::with_iv(c, Direction::Encrypt, id, &iv, bytes(i, 64)).unwrap()
                })
            })
            .collect();
        for out in run_batch_of(&mut lane, &keys, &jobs) {
            out.unwrap();
        }
        let holds = |lane: &CpuLane, id: KeyId| {
            lane.contexts.iter().any(|((k, _, _), _)| *k == id)
                || lane.cbc_chains.iter().any(|((k, _), _)| *k == id)
                || lane.aes_keys.iter().any(|((k, _), _)| *k == id)
                || lane.vaes_keys.iter().any(|((k, _), _)| *k == id)
                || lane.gcm_keys.iter().any(|((k, _), _)| *k == id)
        };
        assert!(holds(&lane, a) && holds(&lane, b));
        assert_eq!(lane.vaes_keys.len(), if vaes::available() { 2 } else { 0 });
        assert!(lane.forget_keys(&[a]));
        assert!(!holds(&lane, a) && holds(&lane, b));
        assert_eq!(lane.vaes_keys.len(), if vaes::available() { 1 } else { 0 });
        still_encrypts_with_key_b(&mut lane, &keys, b);
    }

    /// After `forget_keys`, the kept key `b` (bytes `[2; 16]`) still encrypts CBC
    /// correctly on the lane.
    fn still_encrypts_with_key_b(lane: &mut CpuLane, keys: &KeyStore, b: KeyId) {
        let job = Job::new(
            Cipher::AES_128_CBC,
            Direction::Encrypt,
            b,
            [9; 16],
            bytes(9, 96),
        );
        let mut out = JobOutput::default();
        lane.run(&job, keys, &mut out).unwrap();
        assert_eq!(out.data, reference(&job, &[2; 16]));
    }

    /// The same on a lane that holds EVP contexts and chained CBC contexts, which
    /// the lockstep lane above never makes: each cache drops the removed key's
    /// entries and keeps the other key's.
    #[test]
    fn forgotten_keys_leave_the_evp_contexts_and_cbc_chains() {
        let keys = KeyStore::new();
        let a = keys.add(Key::new(vec![1; 16])).unwrap();
        let b = keys.add(Key::new(vec![2; 16])).unwrap();
        // EVP for everything: CTR and GCM on keyed contexts, a lone CBC encryption
        // on a chain.
        let engine = CpuEngine::with_lanes(1).block_parallel(BlockParallel::Off);
        let mut lane = engine.lane(0);
        for (i, id) in [a, b].into_iter().enumerate() {
            for c in [
                Cipher::AES_128_CBC,
                Cipher::AES_128_CTR,
                Cipher::AES_128_GCM,
            ] {
                let iv = vec![i as u8; c.iv_len()];
                let job = Job::with_iv(c, Direction::Encrypt, id, &iv, bytes(i, 64)).unwrap();
                lane.run(&job, &keys, &mut JobOutput::default()).unwrap();
            }
        }
        let in_contexts = |lane: &CpuLane, id: KeyId| {
            lane.contexts
                .iter()
                .filter(|((k, _, _), _)| *k == id)
                .count()
        };
        let in_chains = |lane: &CpuLane, id: KeyId| {
            lane.cbc_chains
                .iter()
                .filter(|((k, _), _)| *k == id)
                .count()
        };
        assert_eq!((in_contexts(&lane, a), in_contexts(&lane, b)), (2, 2));
        assert_eq!((in_chains(&lane, a), in_chains(&lane, b)), (1, 1));
        assert!(lane.forget_keys(&[a]));
        assert_eq!((in_contexts(&lane, a), in_contexts(&lane, b)), (0, 2));
        assert_eq!((in_chains(&lane, a), in_chains(&lane, b)), (0, 1));
        still_encrypts_with_key_b(&mut lane, &keys, b);
        assert_eq!(in_chains(&lane, b), 1, "the kept chain ran the job");
    }

    /// The lane's copy of a choice (`SizeRule`, looked up once per run of a batch's
    /// jobs of one kind) sends each size where the choice does, on both sides of a
    /// crossover (forced choices, which every other test here uses, have none).
    #[test]
    fn a_size_rule_sends_each_size_where_its_choice_does() {
        use Implementation::{AesCrate, Evp};
        for (small, large) in [(Evp, AesCrate), (AesCrate, Evp)] {
            let choice = Choice {
                small,
                large,
                crossover: 256,
                probes: Vec::new(),
                native: AesCrate,
            };
            let rule = SizeRule::of(&choice);
            for len in [0, 16, 255, 256, 257, 4096] {
                assert_eq!(
                    rule.uses_crate(len),
                    choice.uses_crate(len),
                    "{small} below 256 B, {large} from there: {len} B"
                );
            }
            assert_eq!(rule.uses_crate(255), small == AesCrate);
            assert_eq!(rule.uses_crate(256), large == AesCrate);
        }
    }

    /// A lane whose lockstep width is 1 (EVP forced, or multi-buffer set to 1)
    /// encrypts a batch's CBC jobs one by one on EVP's chained context, never through
    /// the `aes` crate (the same bytes either way: only the caches tell).
    #[test]
    fn a_width_of_one_encrypts_cbc_batches_on_evp() {
        let keys = KeyStore::new();
        let id = keys.add(Key::new(vec![3; 16])).unwrap();
        for engine in [
            CpuEngine::with_lanes(1).block_parallel(BlockParallel::Off),
            CpuEngine::with_lanes(1)
                .block_parallel(BlockParallel::On)
                .multibuffer(1),
        ] {
            let mut lane = engine.lane(0);
            let jobs: Vec<Job> = (0..4)
                .map(|i| {
                    let iv = [i as u8; 16];
                    Job::new(
                        Cipher::AES_128_CBC,
                        Direction::Encrypt,
                        id,
                        iv,
                        bytes(i, 64),
                    )
                })
                .collect();
            for (job, out) in jobs.iter().zip(run_batch_of(&mut lane, &keys, &jobs)) {
                assert_eq!(out.unwrap().data, reference(job, &[3; 16]));
            }
            assert!(lane.aes_keys.is_empty() && lane.vaes_keys.is_empty());
            assert_eq!(lane.cbc_chains.len(), 1);
        }
    }

    /// Jobs run one at a time (`Lane::run`) go to the implementation the lane's
    /// choice names: with the `aes` crate and `ring` forced, CTR and CBC decryption
    /// to the crate's expanded key and GCM to a `ring` key, with EVP forced all three
    /// to keyed EVP contexts (the same bytes either way: only the caches tell).
    #[test]
    fn single_jobs_run_where_the_choice_says() {
        let keys = KeyStore::new();
        let id = keys.add(Key::new(vec![4; 16])).unwrap();
        for parallel in [BlockParallel::On, BlockParallel::Off] {
            let mut lane = CpuEngine::with_lanes(1).block_parallel(parallel).lane(0);
            for (cipher, direction) in [
                (Cipher::AES_128_CTR, Direction::Encrypt),
                (Cipher::AES_128_CBC, Direction::Decrypt),
                (Cipher::AES_128_GCM, Direction::Encrypt),
            ] {
                let iv = vec![5; cipher.iv_len()];
                let job = Job::with_iv(cipher, direction, id, &iv, bytes(1, 64)).unwrap();
                lane.run(&job, &keys, &mut JobOutput::default()).unwrap();
            }
            let native = parallel == BlockParallel::On;
            assert_eq!(lane.aes_keys.len(), usize::from(native), "{parallel:?}");
            assert_eq!(lane.gcm_keys.len(), usize::from(native), "{parallel:?}");
            assert_eq!(
                lane.contexts.len(),
                if native { 0 } else { 3 },
                "{parallel:?}"
            );
        }
    }

    /// A block-parallel job's output that has room for it keeps its allocation, at
    /// exactly its length and above it.
    #[test]
    fn a_block_parallel_output_with_room_keeps_its_allocation() {
        let keys = KeyStore::new();
        let id = keys.add(Key::new(vec![6; 16])).unwrap();
        let mut lane = CpuEngine::with_lanes(1)
            .block_parallel(BlockParallel::On)
            .lane(0);
        let job = Job::new(
            Cipher::AES_128_CTR,
            Direction::Encrypt,
            id,
            [7; 16],
            bytes(2, 64),
        );
        for room in [64, 128] {
            let mut out = JobOutput {
                data: Vec::with_capacity(room),
                tag: None,
            };
            let at = out.data.as_ptr();
            lane.run(&job, &keys, &mut out).unwrap();
            assert_eq!(out.data.len(), 64);
            assert_eq!(out.data.as_ptr(), at, "room for {room} bytes");
        }
    }

    #[test]
    fn many_equal_jobs_one_key() {
        let keys = KeyStore::new();
        let id = keys.add(Key::new((0..16).collect())).unwrap();
        let engine = CpuEngine::with_lanes(1).block_parallel(BlockParallel::On);
        let mut lane = engine.lane(0);
        let jobs: Vec<Job> = (0..DEFAULT_CHAINS)
            .map(|i| {
                Job::new(
                    Cipher::AES_128_CBC,
                    Direction::Encrypt,
                    id,
                    [i as u8; 16],
                    bytes(i, 1024),
                )
            })
            .collect();
        for (job, out) in jobs.iter().zip(run_batch_of(&mut lane, &keys, &jobs)) {
            assert_eq!(
                out.unwrap().data,
                reference(job, &(0..16).collect::<Vec<u8>>())
            );
        }
    }

    /// NIST SP 800-38A F.2.1 (CBC-AES128.Encrypt): four chains each encrypting the
    /// same vector in lockstep must each give the published ciphertext.
    #[test]
    fn sp800_38a_cbc_vector_in_lockstep() {
        let hex = |s: &str| {
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                .collect::<Vec<u8>>()
        };
        let key = hex("2b7e151628aed2a6abf7158809cf4f3c");
        let iv: [u8; 16] = hex("000102030405060708090a0b0c0d0e0f").try_into().unwrap();
        let pt = hex(concat!(
            "6bc1bee22e409f96e93d7e117393172a",
            "ae2d8a571e03ac9c9eb76fac45af8e51",
            "30c81c46a35ce411e5fbc1191a0a52ef",
            "f69f2445df4f9b17ad2b417be66c3710"
        ));
        let ct = hex(concat!(
            "7649abac8119b246cee98e9b12e9197d",
            "5086cb9b507219ee95db113a917678b2",
            "73bed6b8e3c1743b7116e69e22229516",
            "3ff1caa1681fac09120eca307586e1a7"
        ));
        let keys = KeyStore::new();
        let id = keys.add(Key::new(key)).unwrap();
        let mut lane = CpuEngine::with_lanes(1)
            .block_parallel(BlockParallel::On)
            .multibuffer(4)
            .lane(0);
        let jobs: Vec<Job> = (0..4)
            .map(|_| Job::new(Cipher::AES_128_CBC, Direction::Encrypt, id, iv, pt.clone()))
            .collect();
        for out in run_batch_of(&mut lane, &keys, &jobs) {
            assert_eq!(out.unwrap().data, ct);
        }
    }

    #[test]
    fn batch_with_other_jobs_and_errors() {
        let keys = KeyStore::new();
        let id = keys.add(Key::new(vec![9; 16])).unwrap();
        let wrong_len = keys.add(Key::new(vec![9; 32])).unwrap();
        let mut lane = CpuEngine::with_lanes(1).lane(0);
        let cbc = |i: u8, len: usize, key| {
            Job::new(
                Cipher::AES_128_CBC,
                Direction::Encrypt,
                key,
                [i; 16],
                vec![i; len],
            )
        };
        let jobs = vec![
            cbc(1, 48, id),
            Job::new(
                Cipher::AES_128_CTR,
                Direction::Encrypt,
                id,
                [2; 16],
                vec![2; 33],
            ),
            cbc(3, 15, id), // not whole blocks: a job error
            cbc(4, 32, id),
            cbc(5, 16, KeyId(99)), // unknown key
            cbc(6, 16, wrong_len), // 32-byte key for AES-128
            cbc(7, 16, wrong_len),
            Job::new(
                Cipher::AES_128_CBC,
                Direction::Decrypt,
                id,
                [8; 16],
                vec![8; 64],
            ),
        ];
        let outs = run_batch_of(&mut lane, &keys, &jobs);
        assert_eq!(
            outs[0].as_ref().unwrap().data,
            reference(&jobs[0], &[9; 16])
        );
        assert_eq!(
            outs[3].as_ref().unwrap().data,
            reference(&jobs[3], &[9; 16])
        );
        let ctr = openssl::symm::encrypt(
            openssl::symm::Cipher::aes_128_ctr(),
            &[9; 16],
            Some(&[2; 16]),
            &[2; 33],
        )
        .unwrap();
        assert_eq!(outs[1].as_ref().unwrap().data, ctr);
        assert!(matches!(outs[2], Err(Error::InputLength { len: 15, .. })));
        assert!(matches!(outs[4], Err(Error::UnknownKey(99))));
        assert!(matches!(outs[5], Err(Error::KeyLength { got: 32, .. })));
        assert!(matches!(outs[6], Err(Error::KeyLength { got: 32, .. })));
        // Unpadded CBC decryption, by a Crypter with padding off.
        let mut c = openssl::symm::Crypter::new(
            openssl::symm::Cipher::aes_128_cbc(),
            openssl::symm::Mode::Decrypt,
            &[9; 16],
            Some(&[8; 16]),
        )
        .unwrap();
        c.pad(false);
        let mut plain = vec![0; 80];
        let n = c.update(&[8; 64], &mut plain).unwrap();
        plain.truncate(n);
        assert_eq!(outs[7].as_ref().unwrap().data, plain);
    }

    /// CBC encryption one message at a time on a chained context (`chain.rs`): every
    /// length around the block edges, both paddings, two keys and key sizes taking
    /// turns, repeated IVs, an empty message and a failing job in between, each
    /// message equal to OpenSSL's one-shot encryption under its own IV.
    #[test]
    fn chained_cbc_matches_a_fresh_context_per_message() {
        let keys = KeyStore::new();
        let key_bytes = [vec![0x41; 16], vec![0x42; 32]];
        let ids = add_keys(&keys, &key_bytes);
        let sizes = [KeySize::Aes128, KeySize::Aes256];
        let mut lane = CpuEngine::with_lanes(1).multibuffer(1).lane(0);
        let lengths = [16, 0, 1, 15, 16, 17, 31, 32, 33, 48, 1000, 0, 4096];
        for (i, &len) in lengths.iter().enumerate() {
            for padded in [false, true] {
                let which = i % 2;
                let mode = if padded { Mode::CbcPkcs7 } else { Mode::Cbc };
                let cipher = Cipher {
                    key_size: sizes[which],
                    mode,
                };
                // Without padding only whole blocks are valid input.
                let len = if padded { len } else { len / 16 * 16 };
                let job = Job::new(
                    cipher,
                    Direction::Encrypt,
                    ids[which],
                    [(i % 3) as u8; 16],
                    bytes(i, len),
                );
                let mut out = JobOutput {
                    data: vec![0xee; 7],
                    tag: Some([1; 16]),
                };
                lane.run(&job, &keys, &mut out).unwrap();
                assert_eq!(out.data, reference(&job, &key_bytes[which]), "{i} {len}");
                assert_eq!(out.tag, None);
            }
            // A job that fails validation leaves the chain as it was.
            let bad = Job::new(
                Cipher::AES_128_CBC,
                Direction::Encrypt,
                ids[0],
                [0; 16],
                vec![0; 5],
            );
            assert!(lane.run(&bad, &keys, &mut JobOutput::default()).is_err());
        }
        assert_eq!(lane.cbc_chains.len(), 2);
    }

    /// Chained CBC encryption (`chain.rs`) writes into the output's own allocation
    /// where it has one, and gives a fresh output the message and a block of room.
    #[test]
    fn chained_cbc_reuses_the_output_and_sizes_a_fresh_one() {
        let keys = KeyStore::new();
        let key_bytes = [vec![0x41; 16]];
        let ids = add_keys(&keys, &key_bytes);
        let mut lane = CpuEngine::with_lanes(1).multibuffer(1).lane(0);
        let len = 4096;
        let job = Job::new(
            Cipher::AES_128_CBC,
            Direction::Encrypt,
            ids[0],
            [1; 16],
            bytes(0, len),
        );
        let mut out = JobOutput::default();
        lane.run(&job, &keys, &mut out).unwrap();
        assert!(out.data.capacity() < 2 * len, "{}", out.data.capacity());
        let mut out = JobOutput {
            data: Vec::with_capacity(2 * len),
            tag: None,
        };
        let at = out.data.as_ptr();
        lane.run(&job, &keys, &mut out).unwrap();
        assert_eq!(out.data.as_ptr(), at);
        assert_eq!(out.data, reference(&job, &key_bytes[0]));
    }

    #[test]
    fn multibuffer_off_gives_the_same_bytes() {
        let keys = KeyStore::new();
        let id = keys.add(Key::new(vec![5; 16])).unwrap();
        let jobs: Vec<Job> = (0..8)
            .map(|i| {
                Job::new(
                    Cipher::AES_128_CBC_PKCS7,
                    Direction::Encrypt,
                    id,
                    [i as u8; 16],
                    bytes(i, i * 21),
                )
            })
            .collect();
        let on = run_batch_of(
            &mut CpuEngine::with_lanes(1)
                .block_parallel(BlockParallel::On)
                .lane(0),
            &keys,
            &jobs,
        );
        let off = run_batch_of(
            &mut CpuEngine::with_lanes(1).multibuffer(1).lane(0),
            &keys,
            &jobs,
        );
        for (a, b) in on.into_iter().zip(off) {
            assert_eq!(a.unwrap(), b.unwrap());
        }
    }

    #[test]
    fn reused_output_is_replaced() {
        let keys = KeyStore::new();
        let id = keys.add(Key::new(vec![3; 16])).unwrap();
        let mut lane = CpuEngine::with_lanes(1).lane(0);
        let mut out = JobOutput::default();
        for len in [4096, 17, 0, 1000] {
            let job = Job::new(
                Cipher::AES_128_CTR,
                Direction::Encrypt,
                id,
                [1; 16],
                bytes(len, len),
            );
            lane.run(&job, &keys, &mut out).unwrap();
            let want = openssl::symm::encrypt(
                openssl::symm::Cipher::aes_128_ctr(),
                &[3; 16],
                Some(&[1; 16]),
                &job.input,
            )
            .unwrap();
            assert_eq!(out.data, want, "len {len}");
        }
    }

    /// OpenSSL's one-shot API for any cipher without a tag, either direction, padding
    /// as the mode says: the reference for the block-parallel path.
    fn reference_any(
        job: &Job,
        key: &[u8],
    ) -> std::result::Result<Vec<u8>, openssl::error::ErrorStack> {
        use openssl::symm::Cipher as C;
        let c = match (job.cipher.key_size, job.cipher.mode) {
            (KeySize::Aes128, Mode::Ctr) => C::aes_128_ctr(),
            (KeySize::Aes192, Mode::Ctr) => C::aes_192_ctr(),
            (KeySize::Aes256, Mode::Ctr) => C::aes_256_ctr(),
            (KeySize::Aes128, _) => C::aes_128_cbc(),
            (KeySize::Aes192, _) => C::aes_192_cbc(),
            (KeySize::Aes256, _) => C::aes_256_cbc(),
        };
        let mode = match job.direction {
            Direction::Encrypt => openssl::symm::Mode::Encrypt,
            Direction::Decrypt => openssl::symm::Mode::Decrypt,
        };
        let mut crypter = openssl::symm::Crypter::new(c, mode, key, Some(job.iv()))?;
        crypter.pad(job.cipher.mode == Mode::CbcPkcs7);
        let mut out = vec![0; job.input.len() + 16];
        let n = crypter.update(&job.input, &mut out)?;
        let m = crypter.finalize(&mut out[n..])?;
        out.truncate(n + m);
        Ok(out)
    }

    /// CTR and CBC decryption jobs of mixed lengths (0, one block, partial blocks,
    /// around the 8- and 64-block groups), every key size, IVs just below the 2^32,
    /// 2^64 and 2^128 counter boundaries: the `aes` crate path, the EVP path and
    /// OpenSSL's one-shot API agree, one job at a time and in batches.
    #[test]
    fn block_parallel_matches_evp_and_openssl() {
        let keys = KeyStore::new();
        let key_bytes = [bytes(1, 16), bytes(2, 24), bytes(3, 32)];
        let sizes = [KeySize::Aes128, KeySize::Aes192, KeySize::Aes256];
        let ids = add_keys(&keys, &key_bytes);
        let lens = [
            0, 1, 15, 16, 17, 31, 127, 128, 129, 1023, 1024, 1025, 1040, 2048, 4099,
        ];
        let ivs = [
            [7u8; 16],
            ((1u128 << 32) - 2).to_be_bytes(),
            ((1u128 << 64) - 5).to_be_bytes(),
            u128::MAX.to_be_bytes(),
            (u128::MAX - 70).to_be_bytes(),
        ];
        let mut jobs = Vec::new();
        for (i, &len) in lens.iter().enumerate() {
            for (k, &size) in sizes.iter().enumerate() {
                let iv = ivs[(i + k) % ivs.len()];
                for direction in [Direction::Encrypt, Direction::Decrypt] {
                    let input = bytes(i * 7 + k, len);
                    jobs.push(Job::new(
                        Cipher::new(size, Mode::Ctr),
                        direction,
                        ids[k],
                        iv,
                        input,
                    ));
                }
                // CBC decryption of whole blocks, unpadded ...
                let whole = len / BLOCK_LEN * BLOCK_LEN;
                let input = bytes(i * 5 + k, whole);
                jobs.push(Job::new(
                    Cipher::new(size, Mode::Cbc),
                    Direction::Decrypt,
                    ids[k],
                    iv,
                    input,
                ));
                // ... and PKCS#7 ciphertexts of messages of every length (valid padding).
                let plain = Job::new(
                    Cipher::new(size, Mode::CbcPkcs7),
                    Direction::Encrypt,
                    ids[k],
                    iv,
                    bytes(i, len),
                );
                let ct = reference_any(&plain, &key_bytes[k]).unwrap();
                jobs.push(Job::new(
                    Cipher::new(size, Mode::CbcPkcs7),
                    Direction::Decrypt,
                    ids[k],
                    iv,
                    ct,
                ));
            }
        }
        let want: Vec<Vec<u8>> = jobs
            .iter()
            .map(|job| {
                let k = ids.iter().position(|&id| id == job.key).unwrap();
                reference_any(job, &key_bytes[k]).unwrap()
            })
            .collect();
        for parallel in [BlockParallel::On, BlockParallel::Off] {
            let engine = CpuEngine::with_lanes(1).block_parallel(parallel);
            let mut lane = engine.lane(0);
            let mut out = JobOutput {
                data: vec![0xee; 5000],
                tag: Some([1; 16]),
            };
            for (i, (job, want)) in jobs.iter().zip(&want).enumerate() {
                lane.run(job, &keys, &mut out)
                    .unwrap_or_else(|e| panic!("{parallel:?} job {i}: {e}"));
                assert_eq!(
                    &out.data,
                    want,
                    "{parallel:?} job {i}: {:?} {:?} {} bytes",
                    job.cipher,
                    job.direction,
                    job.input.len()
                );
                assert_eq!(out.tag, None);
            }
            for (k, chunk) in jobs.chunks(DEFAULT_CHAINS).enumerate() {
                for (i, out) in run_batch_of(&mut lane, &keys, chunk)
                    .into_iter()
                    .enumerate()
                {
                    assert_eq!(
                        out.unwrap().data,
                        want[k * DEFAULT_CHAINS + i],
                        "{parallel:?} batch {k} job {i}"
                    );
                }
            }
        }
    }

    /// Bad input to CBC decryption gives the same typed errors through the `aes` crate
    /// as through EVP: bad PKCS#7 padding is `AuthenticationFailed`, lengths that are
    /// not whole blocks (or empty, with PKCS#7) are `InputLength`, an unknown key is
    /// `UnknownKey`, a key of the wrong size `KeyLength`; the output is left empty.
    #[test]
    fn block_parallel_errors_match_evp() {
        let keys = KeyStore::new();
        let id = keys.add(Key::new(vec![4; 16])).unwrap();
        let long = keys.add(Key::new(vec![4; 32])).unwrap();
        let padded = |pad: &[u8]| {
            // A last block whose plaintext ends in `pad`, encrypted so it decrypts back.
            let mut plain = vec![0x61; 32];
            let n = plain.len();
            plain[n - pad.len()..].copy_from_slice(pad);
            let job = Job::new(Cipher::AES_128_CBC, Direction::Encrypt, id, [9; 16], plain);
            reference_any(&job, &[4; 16]).unwrap()
        };
        let pkcs7 = |input: Vec<u8>, key| {
            Job::new(
                Cipher::AES_128_CBC_PKCS7,
                Direction::Decrypt,
                key,
                [9; 16],
                input,
            )
        };
        // Each job with a test of the error it must give.
        type Case = (Job, fn(&Error) -> bool);
        let cases: Vec<Case> = vec![
            (pkcs7(padded(&[0]), id), |e| {
                matches!(e, Error::AuthenticationFailed)
            }),
            (pkcs7(padded(&[17]), id), |e| {
                matches!(e, Error::AuthenticationFailed)
            }),
            (pkcs7(padded(&[3, 3, 2]), id), |e| {
                matches!(e, Error::AuthenticationFailed)
            }),
            (pkcs7(padded(&[5, 4, 4, 4]), id), |e| {
                matches!(e, Error::AuthenticationFailed)
            }),
            (pkcs7(Vec::new(), id), |e| {
                matches!(e, Error::InputLength { len: 0, .. })
            }),
            (pkcs7(vec![1; 33], id), |e| {
                matches!(e, Error::InputLength { len: 33, .. })
            }),
            (
                Job::new(
                    Cipher::AES_128_CBC,
                    Direction::Decrypt,
                    id,
                    [9; 16],
                    vec![1; 15],
                ),
                |e| matches!(e, Error::InputLength { len: 15, .. }),
            ),
            (pkcs7(padded(&[1]), KeyId(77)), |e| {
                matches!(e, Error::UnknownKey(77))
            }),
            (pkcs7(padded(&[1]), long), |e| {
                matches!(e, Error::KeyLength { got: 32, .. })
            }),
            (
                Job::new(
                    Cipher::AES_128_CTR,
                    Direction::Encrypt,
                    long,
                    [9; 16],
                    vec![1; 15],
                ),
                |e| matches!(e, Error::KeyLength { got: 32, .. }),
            ),
        ];
        for parallel in [BlockParallel::On, BlockParallel::Off] {
            let mut lane = CpuEngine::with_lanes(1).block_parallel(parallel).lane(0);
            for (i, (job, expected)) in cases.iter().enumerate() {
                let mut out = JobOutput {
                    data: vec![0xee; 64],
                    tag: None,
                };
                match lane.run(job, &keys, &mut out) {
                    Err(e) => assert!(expected(&e), "{parallel:?} case {i}: {e:?}"),
                    Ok(()) => panic!("{parallel:?} case {i}: no error"),
                }
                assert!(out.data.is_empty(), "{parallel:?} case {i}: output left");
            }
            // The same jobs as one batch, with good CTR jobs under two keys among
            // them: each bad one fails alone, the good ones match OpenSSL.
            let good = |key, len| {
                Job::new(
                    Cipher::AES_128_CTR,
                    Direction::Encrypt,
                    key,
                    [3; 16],
                    vec![5; len],
                )
            };
            let other = keys.add(Key::new(vec![6; 16])).unwrap();
            let mut batch: Vec<Job> = cases.iter().map(|(job, _)| job.clone()).collect();
            batch.insert(3, good(id, 100));
            batch.insert(7, good(other, 1500));
            batch.push(good(id, 0));
            for (i, out) in run_batch_of(&mut lane, &keys, &batch)
                .into_iter()
                .enumerate()
            {
                let key = if batch[i].key == other {
                    [6; 16]
                } else {
                    [4; 16]
                };
                match (i, out) {
                    (3 | 7, Ok(out)) => {
                        assert_eq!(out.data, reference_any(&batch[i], &key).unwrap(), "{i}")
                    }
                    (i, Ok(out)) if i == batch.len() - 1 => assert!(out.data.is_empty()),
                    (i, Err(e)) => {
                        let case = i - usize::from(i > 3) - usize::from(i > 7);
                        assert!(cases[case].1(&e), "{parallel:?} batch job {i}: {e:?}");
                    }
                    (i, Ok(_)) => panic!("{parallel:?} batch job {i}: no error"),
                }
            }
            // The lane goes on after errors: a good padded message still decrypts.
            let mut out = JobOutput::default();
            lane.run(&pkcs7(padded(&[2, 2]), id), &keys, &mut out)
                .unwrap();
            assert_eq!(out.data, [&[0x61; 30][..]].concat());
        }
    }

    /// `Auto` turns multi-buffer on exactly where the CPU has AES instructions and
    /// measures CTR and CBC decryption; `On` and `Off` force one implementation; the
    /// engine's info says which serves each cipher and why.
    #[test]
    fn block_parallel_choice_is_measured_or_forced_and_reported() {
        let auto = CpuEngine::with_lanes(1);
        let width = auto.batch_width(Cipher::AES_128_CBC, Direction::Encrypt);
        // CTR and CBC decryption pulls are as wide as a packed pass, whatever the
        // lockstep width.
        assert_eq!(auto.max_batch(), BLOCK_PARALLEL_BATCH);
        for (cipher, direction) in [
            (Cipher::AES_128_CTR, Direction::Encrypt),
            (Cipher::AES_256_CTR, Direction::Decrypt),
            (Cipher::AES_128_CBC, Direction::Decrypt),
            (Cipher::AES_128_CBC_PKCS7, Direction::Decrypt),
        ] {
            assert_eq!(auto.batch_width(cipher, direction), BLOCK_PARALLEL_BATCH);
        }
        if aes::hardware_accelerated() {
            // Batches as wide as any width can be; lanes measure at the first
            // lockstep batch.
            assert_eq!(width, WIDEST_CHAINS);
            assert_eq!(
                auto.batch_width(Cipher::AES_128_GCM, Direction::Encrypt),
                WIDEST_CHAINS
            );
            assert_eq!(auto.lane(0).width, Width::Measured);
            let measured = auto.multibuffer_choice().expect("multi-buffer is on");
            assert!(CHAIN_WIDTHS.contains(&measured.chains), "{measured:?}");
            assert_eq!(measured.probes.len(), CHAIN_WIDTHS.len());
            assert_eq!(auto.lockstep_unit(), (measured.chains, measured.vaes));
        } else {
            assert_eq!(width, 1);
            assert_eq!(auto.lane(0).width, Width::Fixed(1));
        }
        // A width set by hand is not measured.
        let set = CpuEngine::with_lanes(1).multibuffer(4);
        assert_eq!(set.multibuffer_choice(), None);
        // EVP alone: one job at a time, whatever the cipher.
        let evp = CpuEngine::with_lanes(1).block_parallel(BlockParallel::Off);
        assert_eq!(evp.max_batch(), 1);
        assert_eq!(evp.batch_width(Cipher::AES_128_CTR, Direction::Encrypt), 1);
        let measured = auto
            .choice(Cipher::AES_256_CTR, Direction::Encrypt)
            .expect("CTR has two implementations");
        assert!(!measured.probes.is_empty());
        // Clones share the measurement.
        assert_eq!(
            auto.clone().choice(Cipher::AES_256_CTR, Direction::Decrypt),
            Some(measured)
        );
        assert_eq!(auto.choice(Cipher::AES_128_GCM, Direction::Encrypt), None);
        assert_eq!(auto.choice(Cipher::AES_128_CBC, Direction::Encrypt), None);
        for (parallel, name, gcm_name) in [
            (BlockParallel::On, "aes-crate", "ring"),
            (BlockParallel::Off, "openssl-evp", "openssl-evp"),
        ] {
            let engine = CpuEngine::with_lanes(1).block_parallel(parallel);
            let choice = engine
                .choice(Cipher::AES_192_CBC, Direction::Decrypt)
                .expect("CBC decryption has two implementations");
            assert!(choice.probes.is_empty(), "{parallel:?} is not measured");
            for driver in &engine.info().ciphers {
                let text = &driver.driver;
                match driver.cipher.mode {
                    // ring has no AES-192: EVP serves it alone.
                    Mode::Gcm if driver.cipher.key_size == KeySize::Aes192 => {
                        assert!(text.starts_with("openssl-evp (OpenSSL"), "{text}")
                    }
                    Mode::Gcm => assert!(text.starts_with(gcm_name), "{text}"),
                    Mode::Ctr => assert!(text.starts_with(name), "{text}"),
                    Mode::Cbc | Mode::CbcPkcs7 => {
                        assert!(text.starts_with("encryption: openssl-evp"), "{text}");
                        assert!(text.contains(&format!("decryption: {name}")), "{text}");
                    }
                }
            }
        }
        // Measured choices name both implementations and a figure for each.
        for driver in &auto.info().ciphers {
            if driver.cipher.mode == Mode::Ctr {
                let text = &driver.driver;
                assert!(text.contains("measured") && text.contains("GB/s"), "{text}");
            }
        }
    }

    /// The engine's info names the multi-buffer width of CBC batches where lanes run
    /// them in lockstep, and no width where they run one job at a time.
    #[test]
    fn info_names_the_lockstep_width_where_there_is_one() {
        let on = || CpuEngine::with_lanes(1).block_parallel(BlockParallel::On);
        for (engine, width) in [
            (on().multibuffer(4), Some(4)),
            (on().multibuffer(1), None),
            (
                CpuEngine::with_lanes(1).block_parallel(BlockParallel::Off),
                None,
            ),
        ] {
            let info = engine.info();
            let cbc = info
                .ciphers
                .iter()
                .filter(|d| matches!(d.cipher.mode, Mode::Cbc | Mode::CbcPkcs7));
            for driver in cbc {
                let text = &driver.driver;
                match width {
                    Some(w) => assert!(
                        text.contains(&format!("; batches: {w}-way multi-buffer")),
                        "{text}"
                    ),
                    None => assert!(!text.contains("multi-buffer"), "{text}"),
                }
            }
        }
    }

    /// Raw CTR and CBC jobs (the provider's path) at every input and output alignment
    /// within a block, lengths from empty to past a 64-block group, every key size and
    /// both directions, give OpenSSL's one-shot output on every implementation (the
    /// `aes` crate, EVP, and the measured choice).
    /// Runs `jobs` as one batch twice into the same outputs (the second time each
    /// output is already the right length and holds a stale tag) and checks every
    /// result against OpenSSL: the same bytes, or an error where OpenSSL refuses.
    fn check_batch_twice(lane: &mut CpuLane, keys: &KeyStore, jobs: &[Job], key_of: &[&[u8]]) {
        let refs: Vec<&Job> = jobs.iter().collect();
        let mut outs = vec![JobOutput::default(); jobs.len()];
        for round in 0..2 {
            for out in &mut outs {
                out.tag = Some([1; 16]);
            }
            let mut results: Vec<Result<()>> = (0..jobs.len()).map(|_| Ok(())).collect();
            lane.run_batch(&refs, keys, &mut outs, &mut results);
            for (k, job) in jobs.iter().enumerate() {
                let what = format!(
                    "round {round}, job {k}: {} {} {} bytes",
                    job.cipher,
                    job.direction,
                    job.input.len()
                );
                match reference_any(job, key_of[k]) {
                    Ok(expected) => {
                        assert!(results[k].is_ok(), "{what}: {:?}", results[k]);
                        assert_eq!(outs[k].data, expected, "{what}");
                        assert_eq!(outs[k].tag, None, "{what}");
                    }
                    Err(_) => assert!(results[k].is_err(), "{what}"),
                }
            }
        }
    }

    /// The batch path's short cuts (one group covering the whole batch with no
    /// sorting, outputs reused at their length, one-block counters written directly,
    /// block-wise XOR of short messages) and its sorted path (keys, key sizes, CTR,
    /// CBC decryption and CBC encryption interleaved) give OpenSSL's bytes at every
    /// short length, partial blocks and empty jobs included, and counters that wrap.
    #[test]
    fn batches_match_openssl_in_one_group_and_mixed() {
        let keys = KeyStore::new();
        let key_bytes = [bytes(21, 16), bytes(22, 32), bytes(23, 16)];
        let ids = add_keys(&keys, &key_bytes);
        let lens = [
            0usize, 1, 15, 16, 17, 31, 32, 48, 63, 64, 65, 255, 256, 257, 1024,
        ];
        let iv = |k: usize| u128::MAX.wrapping_sub(k as u128 * 5).to_be_bytes();
        let cbc_pkcs7 = Cipher::new(KeySize::Aes128, Mode::CbcPkcs7);
        // (cipher, direction, key index)
        let kinds = [
            (Cipher::AES_128_CTR, Direction::Encrypt, 0),
            (Cipher::AES_256_CTR, Direction::Decrypt, 1),
            (Cipher::AES_128_CTR, Direction::Encrypt, 2),
            (Cipher::AES_128_CBC, Direction::Decrypt, 0),
            (cbc_pkcs7, Direction::Decrypt, 2),
            (Cipher::AES_128_CBC, Direction::Encrypt, 0),
            (Cipher::AES_128_CTR, Direction::Decrypt, 0),
        ];
        for parallel in [BlockParallel::On, BlockParallel::Auto] {
            let mut lane = CpuEngine::with_lanes(1).block_parallel(parallel).lane(0);
            // One group: one key and cipher, a batch at each length, then a batch of
            // every length.
            let one_kind = |k: usize, len: usize| {
                Job::new(
                    Cipher::AES_128_CTR,
                    Direction::Encrypt,
                    ids[0],
                    iv(k),
                    bytes(k, len),
                )
            };
            for &len in &lens {
                let jobs: Vec<Job> = (0..16).map(|k| one_kind(k, len)).collect();
                check_batch_twice(&mut lane, &keys, &jobs, &[&key_bytes[0][..]; 16]);
            }
            let jobs: Vec<Job> = lens
                .iter()
                .enumerate()
                .map(|(k, &len)| one_kind(k, len))
                .collect();
            check_batch_twice(
                &mut lane,
                &keys,
                &jobs,
                &vec![&key_bytes[0][..]; jobs.len()],
            );
            // Mixed: every kind at every length, interleaved.
            let mut jobs = Vec::new();
            let mut key_of: Vec<&[u8]> = Vec::new();
            for (k, &len) in lens.iter().enumerate() {
                for (n, &(cipher, direction, key)) in kinds.iter().enumerate() {
                    let seed = k * kinds.len() + n;
                    let mut input = bytes(seed, len);
                    if cipher.mode == Mode::CbcPkcs7 {
                        // A valid padded ciphertext, so decryption succeeds.
                        let plain = Job::new(cipher, Direction::Encrypt, ids[key], iv(seed), input);
                        input = reference_any(&plain, &key_bytes[key]).unwrap();
                    }
                    jobs.push(Job::new(cipher, direction, ids[key], iv(seed), input));
                    key_of.push(&key_bytes[key]);
                }
            }
            check_batch_twice(&mut lane, &keys, &jobs, &key_of);
        }
    }

    /// A key store holding one AES-128 key made from `seed`, the key, its id, and a lane
    /// that runs every job on EVP (block-parallel off).
    fn evp_lane_with_key(seed: usize) -> (KeyStore, Vec<u8>, KeyId, CpuLane) {
        let keys = KeyStore::new();
        let key = bytes(seed, 16);
        let id = add_keys(&keys, std::slice::from_ref(&key))[0];
        let lane = CpuEngine::with_lanes(1)
            .block_parallel(BlockParallel::Off)
            .lane(0);
        (keys, key, id, lane)
    }

    /// GCM with additional data on EVP (block-parallel off) seals and opens as
    /// OpenSSL's one-shot AEAD does: the data is authenticated, a changed byte of it fails.
    #[test]
    fn evp_gcm_authenticates_the_additional_data() {
        let (keys, key, id, mut lane) = evp_lane_with_key(41);
        let (iv, aad, pt) = ([9u8; 12], bytes(42, 20), bytes(43, 100));
        let job = |direction, input: Vec<u8>, aad: Vec<u8>| {
            Job::with_iv(Cipher::AES_128_GCM, direction, id, &iv, input)
                .unwrap()
                .aad(aad)
        };
        let sealed = run_batch_of(
            &mut lane,
            &keys,
            &[job(Direction::Encrypt, pt.clone(), aad.clone())],
        );
        let sealed = sealed[0].as_ref().unwrap();
        let mut tag = [0u8; TAG_LEN];
        let ct = openssl::symm::encrypt_aead(
            openssl::symm::Cipher::aes_128_gcm(),
            &key,
            Some(&iv),
            &aad,
            &pt,
            &mut tag,
        )
        .unwrap();
        assert_eq!((&sealed.data, sealed.tag), (&ct, Some(tag)));
        let opens = [aad.clone(), bytes(44, 20)]
            .map(|aad| job(Direction::Decrypt, ct.clone(), aad).tag(tag));
        let opened = run_batch_of(&mut lane, &keys, &opens);
        assert_eq!(opened[0].as_ref().unwrap().data, pt);
        assert!(
            matches!(opened[1], Err(Error::AuthenticationFailed)),
            "{:?}",
            opened[1]
        );
    }

    /// Additional data on a job of a cipher without authentication (CBC, CTR) is not
    /// fed to EVP: the bytes are OpenSSL's for the input alone. And `run_in_place`
    /// runs a job that `ring` does not (here on EVP) as `run` does, copying.
    #[test]
    fn evp_ignores_additional_data_where_nothing_authenticates_it() {
        let (keys, key, id, mut lane) = evp_lane_with_key(45);
        for cipher in [Cipher::AES_128_CBC, Cipher::AES_128_CTR] {
            let job = Job::new(
                cipher,
                Direction::Encrypt,
                id,
                [3; BLOCK_LEN],
                bytes(46, 64),
            )
            .aad(bytes(47, 20));
            let expected = reference_any(&job, &key).unwrap();
            let got = run_batch_of(&mut lane, &keys, std::slice::from_ref(&job));
            assert_eq!(got[0].as_ref().unwrap().data, expected, "{cipher}");
            let (mut job, mut out) = (job, JobOutput::default());
            assert!(!lane.runs_in_place(&job));
            lane.run_in_place(&mut job, &keys, &mut out).unwrap();
            assert_eq!(out.data, expected, "{cipher} in place");
        }
    }

    /// A batch whose second job differs from the first in what runs it gives each job
    /// the bytes it gets alone: a GCM job after a CTR job (the implementation looked up
    /// for each kind of job, not carried over from the one before), and two CTR jobs
    /// under different keys (two groups, not one under the first job's key).
    #[test]
    fn a_batch_of_two_kinds_or_two_keys_gives_each_job_its_own_bytes() {
        let keys = KeyStore::new();
        let ids = add_keys(&keys, &[bytes(31, 16), bytes(32, 16)]);
        let ctr = |key: usize, seed: usize| {
            let iv = [seed as u8; BLOCK_LEN];
            Job::new(
                Cipher::AES_128_CTR,
                Direction::Encrypt,
                ids[key],
                iv,
                bytes(seed, 100),
            )
        };
        let gcm = Job::with_iv(
            Cipher::AES_128_GCM,
            Direction::Encrypt,
            ids[0],
            &[7; 12],
            bytes(3, 100),
        )
        .unwrap();
        for parallel in [BlockParallel::On, BlockParallel::Auto] {
            let mut lane = CpuEngine::with_lanes(1).block_parallel(parallel).lane(0);
            for batch in [vec![ctr(0, 1), gcm.clone()], vec![ctr(0, 1), ctr(1, 2)]] {
                let together = run_batch_of(&mut lane, &keys, &batch);
                for (k, job) in batch.iter().enumerate() {
                    let alone = run_batch_of(&mut lane, &keys, std::slice::from_ref(job));
                    let (a, b) = (together[k].as_ref().unwrap(), alone[0].as_ref().unwrap());
                    assert_eq!(a, b, "{parallel:?}, job {k} of {}", batch.len());
                }
            }
        }
    }

    /// Every length from 0 to 80 bytes (each side of one to five blocks, the short CTR
    /// path's 64-byte bound) and each side of 256 and 1024 bytes.
    fn short_path_lens() -> Vec<usize> {
        (0..=80).chain([255, 256, 257, 1023, 1024, 1025]).collect()
    }

    /// Counter block `k`: 1 to 4 blocks below the 2^32, 2^64 or 2^128 boundary in turn,
    /// so a message of 2 to 5 blocks from it carries or wraps inside it.
    fn iv_below_counter_boundary(k: usize) -> [u8; BLOCK_LEN] {
        let boundary = [1u128 << 32, 1u128 << 64, 0][k % 3];
        boundary.wrapping_sub(1 + (k % 4) as u128).to_be_bytes()
    }

    /// The short-message CTR path (messages of up to four blocks straight from the IV
    /// in registers) and the longer one, in lane batches as wide as a pull
    /// ([`BLOCK_PARALLEL_BATCH`]) and one wider: every length from 0 to 80 bytes
    /// (each side of one to five blocks, the short path's 64-byte bound) and around
    /// 256 and 1024 bytes, IVs a few blocks below the 2^32, 2^64 and 2^128 counter
    /// boundaries (so a short message's counters carry or wrap inside it), in one
    /// group and mixed with other keys, key sizes and CBC decryption, give OpenSSL's
    /// bytes.
    #[test]
    fn pull_wide_batches_match_openssl_at_every_short_length() {
        let keys = KeyStore::new();
        let key_bytes = [bytes(41, 16), bytes(42, 24), bytes(43, 32)];
        let ids = add_keys(&keys, &key_bytes);
        let lens = short_path_lens();
        let iv = iv_below_counter_boundary;
        for parallel in [BlockParallel::On, BlockParallel::Auto] {
            let mut lane = CpuEngine::with_lanes(1).block_parallel(parallel).lane(0);
            for &len in &lens {
                for width in [BLOCK_PARALLEL_BATCH, BLOCK_PARALLEL_BATCH + 1] {
                    let jobs: Vec<Job> = (0..width)
                        .map(|k| {
                            Job::new(
                                Cipher::AES_128_CTR,
                                Direction::Encrypt,
                                ids[0],
                                iv(k),
                                bytes(k + len, len),
                            )
                        })
                        .collect();
                    check_batch_twice(&mut lane, &keys, &jobs, &vec![&key_bytes[0][..]; width]);
                }
            }
            // Mixed: key sizes, directions and CBC decryption interleaved, every
            // length, in pull-wide batches.
            let kinds = [
                (KeySize::Aes128, Mode::Ctr, Direction::Encrypt, 0),
                (KeySize::Aes192, Mode::Ctr, Direction::Decrypt, 1),
                (KeySize::Aes256, Mode::Ctr, Direction::Encrypt, 2),
                (KeySize::Aes128, Mode::Cbc, Direction::Decrypt, 0),
                (KeySize::Aes256, Mode::Cbc, Direction::Decrypt, 2),
            ];
            let mut jobs = Vec::new();
            let mut key_of: Vec<&[u8]> = Vec::new();
            for (k, &len) in lens.iter().enumerate() {
                let (size, mode, direction, key) = kinds[k % kinds.len()];
                let len = if mode == Mode::Cbc {
                    len.div_ceil(BLOCK_LEN) * BLOCK_LEN
                } else {
                    len
                };
                jobs.push(Job::new(
                    Cipher::new(size, mode),
                    direction,
                    ids[key],
                    iv(k),
                    bytes(k, len),
                ));
                key_of.push(&key_bytes[key]);
            }
            for (jobs, key_of) in jobs
                .chunks(BLOCK_PARALLEL_BATCH)
                .zip(key_of.chunks(BLOCK_PARALLEL_BATCH))
            {
                check_batch_twice(&mut lane, &keys, jobs, key_of);
            }
        }
    }

    /// The same shapes through a dispatcher with one in-line `cpu` lane
    /// (`run_into`, pulls of [`BLOCK_PARALLEL_BATCH`]), its outputs reused from the
    /// batch before: every job's output is OpenSSL's, in job order.
    #[test]
    fn dispatcher_pulls_match_openssl_at_every_short_length() {
        use crate::policy::Only;
        use crate::Dispatcher;
        let key_bytes = [bytes(51, 16), bytes(52, 32)];
        let dispatcher =
            Dispatcher::new(vec![CpuEngine::with_lanes(1).into_engine()]).expect("one engine");
        let ids: Vec<KeyId> = key_bytes
            .iter()
            .map(|k| dispatcher.add_key(Key::new(k.clone())).unwrap())
            .collect();
        let lens: Vec<usize> = (0..=80).chain(1000..=1030).collect();
        let jobs: Vec<Job> = (0..3 * BLOCK_PARALLEL_BATCH + 5)
            .map(|k| {
                let len = lens[k % lens.len()];
                let (cipher, key) = match k % 3 {
                    0 | 1 => (Cipher::AES_128_CTR, 0),
                    _ => (Cipher::AES_256_CTR, 1),
                };
                let iv = u128::MAX.wrapping_sub((k % 6) as u128).to_be_bytes();
                Job::new(cipher, Direction::Encrypt, ids[key], iv, bytes(k, len))
            })
            .collect();
        let mut outputs = Vec::new();
        for round in 0..2 {
            dispatcher
                .run_into(&jobs, &Only::new("cpu"), &mut outputs)
                .expect("the batch plans");
            assert_eq!(outputs.len(), jobs.len());
            for (k, (job, out)) in jobs.iter().zip(&outputs).enumerate() {
                let key = &key_bytes[usize::from(job.cipher.key_size == KeySize::Aes256)];
                let out = out.as_ref().expect("CTR jobs succeed");
                assert_eq!(
                    out.data,
                    reference_any(job, key).unwrap(),
                    "round {round}, job {k}, {} bytes",
                    job.input.len()
                );
            }
        }
    }

    /// Slots as the in-line lane finds them: an earlier batch's outputs of every kind
    /// (longer, shorter, empty, with a tag) and errors.
    fn used_slots(n: usize) -> Vec<Result<JobOutput>> {
        (0..n)
            .map(|k| match k % 5 {
                0 => Err(Error::AuthenticationFailed),
                1 => Ok(JobOutput::default()),
                2 => Ok(JobOutput {
                    data: vec![0xa5; 3 * k + 1],
                    tag: Some([7; TAG_LEN]),
                }),
                3 => Ok(JobOutput {
                    data: vec![0x5a; 2000],
                    tag: None,
                }),
                _ => Ok(JobOutput {
                    data: bytes(k, k % 17),
                    tag: None,
                }),
            })
            .collect()
    }

    /// `Lane::run_slots`, the in-line lane's path into the caller's result slots:
    /// pull-wide runs of one cipher under one key (CTR at every length 0-80 B and
    /// around 256 and 1024 B with IVs below the counter boundaries, every key size,
    /// both directions; CBC decryption with and without padding, a bad pad included)
    /// give OpenSSL's bytes and errors whatever the slots held, twice over (the second
    /// time into the first's outputs); a run the path does not take (mixed keys or
    /// ciphers, an invalid job, CBC encryption, GCM, every job through EVP) is
    /// refused with every slot untouched.
    #[test]
    fn slot_runs_match_openssl_or_are_refused_untouched() {
        let keys = KeyStore::new();
        let key_bytes = [bytes(61, 16), bytes(62, 24), bytes(63, 32)];
        let ids = add_keys(&keys, &key_bytes);
        let lens = short_path_lens();
        let iv = iv_below_counter_boundary;
        let check = |lane: &mut CpuLane, jobs: &[Job], key: &[u8], what: &str| {
            let mut slots = used_slots(jobs.len());
            for round in 0..2 {
                assert!(lane.run_slots(jobs, &keys, &mut slots), "{what}: refused");
                for (k, (job, slot)) in jobs.iter().zip(&slots).enumerate() {
                    let what = format!("{what}, round {round}, job {k}, {} B", job.len());
                    match reference_any(job, key) {
                        Ok(expected) => {
                            let out = slot.as_ref().unwrap_or_else(|e| panic!("{what}: {e}"));
                            assert_eq!(out.data, expected, "{what}");
                            assert_eq!(out.tag, None, "{what}");
                        }
                        Err(_) => assert!(
                            matches!(slot, Err(Error::AuthenticationFailed)),
                            "{what}: {slot:?}"
                        ),
                    }
                }
            }
        };
        for parallel in [BlockParallel::On, BlockParallel::Auto] {
            let mut lane = CpuEngine::with_lanes(1).block_parallel(parallel).lane(0);
            let sizes = [KeySize::Aes128, KeySize::Aes192, KeySize::Aes256];
            for (key, &size) in sizes.iter().enumerate() {
                for direction in [Direction::Encrypt, Direction::Decrypt] {
                    let cipher = Cipher::new(size, Mode::Ctr);
                    // Runs of one length, and runs of every length.
                    for &len in &lens {
                        let jobs: Vec<Job> = (0..BLOCK_PARALLEL_BATCH)
                            .map(|k| {
                                Job::new(cipher, direction, ids[key], iv(k), bytes(k + len, len))
                            })
                            .collect();
                        let what = format!("{parallel:?} {cipher} {direction} {len} B");
                        if parallel == BlockParallel::Auto && !lane.uses_crate(&jobs[0]) {
                            continue;
                        }
                        check(&mut lane, &jobs, &key_bytes[key], &what);
                    }
                    let jobs: Vec<Job> = lens
                        .iter()
                        .enumerate()
                        .map(|(k, &len)| {
                            Job::new(cipher, direction, ids[key], iv(k), bytes(k, len))
                        })
                        .collect();
                    if jobs.iter().all(|j| lane.uses_crate(j)) {
                        check(
                            &mut lane,
                            &jobs,
                            &key_bytes[key],
                            &format!("{cipher} mixed lengths"),
                        );
                    }
                }
                // CBC decryption, with padding too (every third ciphertext's pad is
                // broken: an authentication error in its slot, as from EVP).
                for mode in [Mode::Cbc, Mode::CbcPkcs7] {
                    let cipher = Cipher::new(size, mode);
                    let jobs: Vec<Job> = (1..=20)
                        .map(|blocks| {
                            let mut input = bytes(blocks, blocks * BLOCK_LEN);
                            if mode == Mode::CbcPkcs7 {
                                let plain = Job::new(
                                    cipher,
                                    Direction::Encrypt,
                                    ids[key],
                                    iv(blocks),
                                    bytes(blocks, blocks * 7),
                                );
                                input = reference_any(&plain, &key_bytes[key]).unwrap();
                                if blocks % 3 == 0 {
                                    let last = input.len() - 1;
                                    input[last] ^= 0x40;
                                }
                            }
                            Job::new(cipher, Direction::Decrypt, ids[key], iv(blocks), input)
                        })
                        .collect();
                    if jobs.iter().all(|j| lane.uses_crate(j)) {
                        check(
                            &mut lane,
                            &jobs,
                            &key_bytes[key],
                            &format!("{parallel:?} {cipher}"),
                        );
                    }
                }
            }
            // Runs the path leaves to `run_batch`: the slots stay as they were.
            let ctr = |k: usize, key: usize, len: usize| {
                Job::new(
                    Cipher::AES_128_CTR,
                    Direction::Encrypt,
                    ids[key],
                    iv(k),
                    bytes(k, len),
                )
            };
            let mut refused: Vec<(&str, Vec<Job>)> = Vec::new();
            refused.push(("two keys", (0..8).map(|k| ctr(k, k % 2 * 2, 16)).collect()));
            let mut ciphers: Vec<Job> = (0..8).map(|k| ctr(k, 0, 16)).collect();
            ciphers[5] = Job::new(
                Cipher::AES_128_CTR,
                Direction::Decrypt,
                ids[0],
                iv(5),
                bytes(5, 16),
            );
            refused.push(("two directions", ciphers));
            let mut bad_iv: Vec<Job> = (0..8).map(|k| ctr(k, 0, 16)).collect();
            bad_iv[3] = Job::with_iv(
                Cipher::AES_128_CTR,
                Direction::Encrypt,
                ids[0],
                &[1; 12],
                bytes(3, 16),
            )
            .unwrap();
            refused.push(("a short IV", bad_iv));
            refused.push((
                "CBC decryption of a partial block",
                (0..8)
                    .map(|k| {
                        Job::new(
                            Cipher::AES_128_CBC,
                            Direction::Decrypt,
                            ids[0],
                            iv(k),
                            bytes(k, 16 + 16 * (k % 2) + usize::from(k == 6)),
                        )
                    })
                    .collect(),
            ));
            refused.push((
                "empty padded CBC decryption",
                vec![Job::new(
                    Cipher::new(KeySize::Aes128, Mode::CbcPkcs7),
                    Direction::Decrypt,
                    ids[0],
                    iv(0),
                    Vec::new(),
                )],
            ));
            refused.push((
                "CBC encryption",
                (0..8)
                    .map(|k| {
                        Job::new(
                            Cipher::AES_128_CBC,
                            Direction::Encrypt,
                            ids[0],
                            iv(k),
                            bytes(k, 32),
                        )
                    })
                    .collect(),
            ));
            refused.push((
                "GCM",
                (0..8)
                    .map(|k| {
                        Job::with_iv(
                            Cipher::AES_128_GCM,
                            Direction::Encrypt,
                            ids[0],
                            &[k as u8; 12],
                            bytes(k, 32),
                        )
                        .unwrap()
                    })
                    .collect(),
            ));
            let unknown = KeyId(u32::MAX - 1);
            refused.push((
                "an unknown key",
                (0..4)
                    .map(|k| {
                        Job::new(
                            Cipher::AES_128_CTR,
                            Direction::Encrypt,
                            unknown,
                            iv(k),
                            bytes(k, 16),
                        )
                    })
                    .collect(),
            ));
            refused.push(("no jobs", Vec::new()));
            for (what, jobs) in &refused {
                let mut slots = used_slots(jobs.len());
                assert!(
                    !lane.run_slots(jobs, &keys, &mut slots),
                    "{parallel:?}: {what} taken"
                );
                let before = used_slots(jobs.len());
                for (slot, was) in slots.iter().zip(&before) {
                    match (slot, was) {
                        (Ok(a), Ok(b)) => assert_eq!(a, b, "{what}: a slot was touched"),
                        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{what}"),
                        _ => panic!("{parallel:?}: {what}: a slot was touched"),
                    }
                }
            }
        }
        // With every job through EVP, no run is taken.
        let mut lane = CpuEngine::with_lanes(1)
            .block_parallel(BlockParallel::Off)
            .lane(0);
        let jobs: Vec<Job> = (0..8)
            .map(|k| {
                Job::new(
                    Cipher::AES_128_CTR,
                    Direction::Encrypt,
                    ids[0],
                    iv(k),
                    bytes(k, 16),
                )
            })
            .collect();
        assert!(!lane.run_slots(&jobs, &keys, &mut used_slots(8)));
    }

    /// A dispatcher with one in-line `cpu` lane whose pulls are runs of one cipher and
    /// key (the path into the slots), runs of mixed ones and runs holding an invalid
    /// job (the lend-and-keep path), one after the other in one batch, outputs
    /// reused from a batch before and from one of other sizes: every job's output or
    /// error is OpenSSL's, in job order, and the report counts every job and byte.
    #[test]
    fn dispatcher_slot_runs_and_lent_runs_match_openssl() {
        use crate::policy::Only;
        use crate::Dispatcher;
        let key_bytes = [bytes(71, 16), bytes(72, 32)];
        for parallel in [BlockParallel::On, BlockParallel::Auto] {
            let engine = CpuEngine::with_lanes(1)
                .block_parallel(parallel)
                .into_engine();
            let dispatcher = Dispatcher::new(vec![engine]).expect("one engine");
            let ids: Vec<KeyId> = key_bytes
                .iter()
                .map(|k| dispatcher.add_key(Key::new(k.clone())).unwrap())
                .collect();
            let iv = |k: usize| u128::MAX.wrapping_sub((k % 7) as u128).to_be_bytes();
            let mut jobs = Vec::new();
            // Three pulls' worth of one kind at every length 0-80, then an AES-256 run,
            // then mixed keys, then a run with an invalid (partial-block) CBC job,
            // then padded CBC decryption with some bad pads.
            for k in 0..3 * BLOCK_PARALLEL_BATCH {
                jobs.push(Job::new(
                    Cipher::AES_128_CTR,
                    Direction::Encrypt,
                    ids[0],
                    iv(k),
                    bytes(k, k % 81),
                ));
            }
            for k in 0..BLOCK_PARALLEL_BATCH + 3 {
                jobs.push(Job::new(
                    Cipher::AES_256_CTR,
                    Direction::Decrypt,
                    ids[1],
                    iv(k),
                    bytes(k, 1 + k % 70),
                ));
            }
            for k in 0..BLOCK_PARALLEL_BATCH {
                let (cipher, key) = [(Cipher::AES_128_CTR, 0), (Cipher::AES_256_CTR, 1)][k % 2];
                jobs.push(Job::new(
                    cipher,
                    Direction::Encrypt,
                    ids[key],
                    iv(k),
                    bytes(k, 16 + k % 50),
                ));
            }
            for k in 0..BLOCK_PARALLEL_BATCH {
                let len = if k == 9 { 33 } else { 16 * (1 + k % 4) };
                jobs.push(Job::new(
                    Cipher::AES_128_CBC,
                    Direction::Decrypt,
                    ids[0],
                    iv(k),
                    bytes(k, len),
                ));
            }
            let padded = Cipher::new(KeySize::Aes128, Mode::CbcPkcs7);
            for k in 0..BLOCK_PARALLEL_BATCH {
                let plain = Job::new(padded, Direction::Encrypt, ids[0], iv(k), bytes(k, k % 40));
                let mut input = reference_any(&plain, &key_bytes[0]).unwrap();
                if k % 5 == 0 {
                    let last = input.len() - 1;
                    input[last] = 0;
                }
                jobs.push(Job::new(padded, Direction::Decrypt, ids[0], iv(k), input));
            }
            let total: u64 = jobs.iter().map(|j| j.len() as u64).sum();
            let mut outputs = used_slots(jobs.len() + 11);
            for round in 0..3 {
                if round == 2 {
                    // Outputs of another batch's sizes, fewer slots than jobs.
                    outputs = used_slots(jobs.len() / 2);
                }
                let report = dispatcher
                    .run_into(&jobs, &Only::new("cpu"), &mut outputs)
                    .expect("the batch plans");
                assert_eq!(outputs.len(), jobs.len());
                assert_eq!((report.jobs, report.bytes), (jobs.len(), total));
                let lane = &report.engines[0].lanes[0];
                assert_eq!((lane.jobs, lane.bytes), (jobs.len(), total));
                let mut errors = 0;
                for (k, (job, out)) in jobs.iter().zip(&outputs).enumerate() {
                    let key = &key_bytes[usize::from(job.cipher.key_size == KeySize::Aes256)];
                    let what = format!(
                        "{parallel:?} round {round}, job {k}, {} {} B",
                        job.cipher,
                        job.len()
                    );
                    match (reference_any(job, key), out) {
                        (Ok(expected), Ok(out)) => {
                            assert_eq!(out.data, expected, "{what}");
                            assert_eq!(out.tag, None, "{what}");
                        }
                        (Err(_), Err(e)) => {
                            errors += 1;
                            let partial = job.len() % BLOCK_LEN != 0;
                            assert!(
                                matches!(e, Error::InputLength { .. }) == partial
                                    && (partial || matches!(e, Error::AuthenticationFailed)),
                                "{what}: {e}"
                            );
                        }
                        (expected, out) => panic!("{what}: {expected:?} vs {out:?}"),
                    }
                }
                assert_eq!(report.job_errors, errors);
                assert!(errors > 1, "the batch holds failing jobs");
            }
        }
    }

    #[test]
    fn raw_jobs_match_openssl_at_every_alignment() {
        let keys = KeyStore::new();
        let key_bytes = [bytes(11, 16), bytes(12, 24), bytes(13, 32)];
        let ids = add_keys(&keys, &key_bytes);
        let lens = [0usize, 1, 15, 16, 17, 100, 1024, 1041, 4096 + 16];
        for parallel in [BlockParallel::On, BlockParallel::Off, BlockParallel::Auto] {
            let mut lane = CpuEngine::with_lanes(1).block_parallel(parallel).lane(0);
            for (k, &size) in [KeySize::Aes128, KeySize::Aes192, KeySize::Aes256]
                .iter()
                .enumerate()
            {
                for mode in [Mode::Ctr, Mode::Cbc] {
                    for direction in [Direction::Encrypt, Direction::Decrypt] {
                        for (i, &len) in lens.iter().enumerate() {
                            let len = if mode == Mode::Cbc {
                                len / BLOCK_LEN * BLOCK_LEN
                            } else {
                                len
                            };
                            for at in 0..BLOCK_LEN {
                                let out_at = (at * 7 + i) % BLOCK_LEN;
                                let data = bytes(at + 31 * i, len + at);
                                let iv = u128::MAX.wrapping_sub((at * 3) as u128).to_be_bytes();
                                let job = RawJob {
                                    cipher: Cipher::new(size, mode),
                                    direction,
                                    key: ids[k],
                                    iv,
                                    input: &data[at..],
                                };
                                let mut buf = vec![0xee; len + out_at];
                                lane.run_raw(&job, &keys, &mut buf[out_at..])
                                    .unwrap_or_else(|e| panic!("{parallel:?} {e}"));
                                let owned = Job::new(
                                    job.cipher,
                                    direction,
                                    job.key,
                                    iv,
                                    data[at..].to_vec(),
                                );
                                assert_eq!(
                                    buf[out_at..],
                                    reference_any(&owned, &key_bytes[k]).unwrap()[..],
                                    "{parallel:?} {} {direction} {len} bytes, input at +{at}, \
                                     output at +{out_at}",
                                    job.cipher
                                );
                            }
                        }
                    }
                }
            }
            // Lengths that are not whole blocks for CBC, or an output of another
            // length, are refused before any work.
            let input = [0u8; 17];
            let mut out = [0u8; 17];
            let cbc = RawJob {
                cipher: Cipher::AES_128_CBC,
                direction: Direction::Decrypt,
                key: ids[0],
                iv: [0; 16],
                input: &input,
            };
            assert!(matches!(
                lane.run_raw(&cbc, &keys, &mut out),
                Err(Error::InputLength { len: 17, .. })
            ));
            let ctr = RawJob {
                cipher: Cipher::AES_128_CTR,
                ..cbc
            };
            assert!(matches!(
                lane.run_raw(&ctr, &keys, &mut out[..16]),
                Err(Error::InputLength { .. })
            ));
            let unknown = RawJob {
                key: KeyId(999),
                ..ctr
            };
            assert!(matches!(
                lane.run_raw(&unknown, &keys, &mut out),
                Err(Error::UnknownKey(999))
            ));
        }
    }

    #[test]
    fn pinned_lane_runs() {
        let keys = KeyStore::new();
        let id = keys.add(Key::new(vec![3; 16])).unwrap();
        let engine = CpuEngine::with_lanes(3).pinned(true);
        let mut lane = engine.open_lane(2).unwrap();
        let job = Job::new(
            Cipher::AES_128_CTR,
            Direction::Encrypt,
            id,
            [1; 16],
            vec![0; 64],
        );
        let mut out = JobOutput::default();
        lane.run(&job, &keys, &mut out).unwrap();
        assert_eq!(out.data.len(), 64);
        assert_eq!(PINNED_TO.get(), core_for_lane(2));
    }

    /// An engine left to size itself has one lane per core this process may use, and
    /// a pinned engine asks the dispatcher for threads of its own (a pinned lane run
    /// on the caller's thread would pin that thread too); an unpinned one may run on
    /// any thread.
    #[test]
    fn lanes_follow_the_cores_and_pinning_keeps_lanes_on_their_threads() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(available_cores(), cores);
        assert_eq!(CpuEngine::new().lanes(), cores);
        assert_eq!(CpuEngine::with_lanes(3).lanes(), 3);
        assert_eq!(CpuEngine::with_lanes(0).lanes(), 1);
        assert!(CpuEngine::with_lanes(1).runs_on_any_thread());
        assert!(!CpuEngine::with_lanes(1).pinned(true).runs_on_any_thread());
    }

    /// Pinned lanes take the cores this process may run on in turn: the first `n`
    /// lanes get `n` different allowed cores, and lane `i + n` shares lane `i`'s.
    #[test]
    fn pinned_lanes_take_the_allowed_cores_in_turn() {
        use nix::sched::{sched_getaffinity, CpuSet};
        let allowed = sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
        let n = (0..CpuSet::count())
            .filter(|&c| allowed.is_set(c).unwrap())
            .count();
        let first: Vec<usize> = (0..n).map(|i| core_for_lane(i).unwrap()).collect();
        for (i, &core) in first.iter().enumerate() {
            assert!(allowed.is_set(core).unwrap(), "lane {i}: core {core}");
            assert!(
                !first[..i].contains(&core),
                "lanes share core {core}: {first:?}"
            );
            assert_eq!(core_for_lane(i + n), Some(core), "lane {}", i + n);
        }
    }

    /// `hetcrypt engines` names the `aes` crate's backend as the crate picks it at run
    /// time: VAES-512 with AVX-512F, VAES-256 with VAES alone, else AES-NI or its
    /// software AES; the engine's report carries that name.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_reported_aes_backend_follows_the_cpu() {
        let vaes = std::arch::is_x86_feature_detected!("vaes");
        let avx512 = std::arch::is_x86_feature_detected!("avx512f");
        let expected = match (vaes, avx512) {
            (true, true) => "VAES-512",
            (true, false) => "VAES-256",
            _ if aes::hardware_accelerated() => "AES-NI",
            _ => "software",
        };
        assert_eq!(aes_backend(), expected);
        let info = CpuEngine::with_lanes(1)
            .block_parallel(BlockParallel::On)
            .info();
        let named = format!("aes crate ({expected}) block-parallel");
        assert!(
            info.ciphers.iter().any(|d| d.driver.contains(&named)),
            "{:?}",
            info.ciphers
        );
    }
}
