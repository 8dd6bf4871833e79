//! Engines: the ways hetcrypt can run a job. Mechanism only — no scheduling here.
//!
//! An [`Engine`] describes itself and opens [`Lane`]s; a lane is one worker that can
//! hold one job (or one multi-buffer batch) in flight, driven by one dispatcher thread.

pub mod cpu;
pub mod devcrypto;
pub mod fault;
pub mod kernel;
mod shared;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::cipher::{Cipher, Direction};
use crate::error::Result;
use crate::job::{Job, JobOutput};
use crate::key::{KeyId, KeyStore};

/// What kind of engine this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EngineKind {
    /// Software on the host CPU (OpenSSL EVP).
    Cpu,
    /// The Linux kernel crypto API (AF_ALG), reaching whatever driver serves the cipher.
    Kernel,
    /// The Linux kernel crypto API through cryptodev-linux's `/dev/crypto` (the seeds'
    /// OCF interface).
    Devcrypto,
    /// A test wrapper that injects faults into another engine.
    FaultInjection,
}

/// Which implementation serves one cipher on an engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CipherDriver {
    /// The cipher.
    pub cipher: Cipher,
    /// Implementation name (kernel driver such as `virtio_crypto_aes_cbc`, or the
    /// OpenSSL implementation).
    pub driver: String,
    /// Kernel priority of the driver, where there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Kernel module providing the driver, where there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// Whether the driver completes asynchronously (hardware offload usually does).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_async: Option<bool>,
}

/// An engine's self-description, for `hetcrypt engines` and reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EngineInfo {
    /// The engine's name (`cpu`, `kernel`, `kernel:virtio_crypto_aes_cbc`, ...).
    pub name: String,
    /// Its kind.
    pub kind: EngineKind,
    /// Number of lanes it opens.
    pub lanes: usize,
    /// The ciphers it runs and who serves each.
    pub ciphers: Vec<CipherDriver>,
}

/// A way to run jobs. Implementations know how to encrypt; they know nothing of
/// which job should go where.
pub trait Engine: Send + Sync {
    /// The engine's name, unique within a dispatcher.
    fn name(&self) -> &str;

    /// A description: kind, lanes, drivers.
    fn info(&self) -> EngineInfo;

    /// How many lanes the dispatcher should open.
    fn lanes(&self) -> usize;

    /// Whether the engine can run this cipher in this direction.
    fn supports(&self, cipher: Cipher, direction: Direction) -> bool;

    /// Opens lane `index` (0-based). Called on the lane's own thread.
    fn open_lane(&self, index: usize) -> Result<Box<dyn Lane>>;

    /// How many jobs a lane would like to take in one pull (multi-buffer engines
    /// interleave several independent jobs); 1 means one at a time. The most any
    /// cipher asks for: [`Engine::batch_width`] answers per cipher and direction.
    fn max_batch(&self) -> usize {
        1
    }

    /// How many jobs of this cipher and direction a lane would like to take in one
    /// pull (at most [`Engine::max_batch`]). An engine that gains from batches only
    /// for some ciphers (multi-buffer CBC encryption) answers 1 for the others, so
    /// work is shared between engines job by job rather than in handfuls. The default
    /// is [`Engine::max_batch`] for every cipher.
    fn batch_width(&self, cipher: Cipher, direction: Direction) -> usize {
        let _ = (cipher, direction);
        self.max_batch()
    }

    /// The largest job (input plus AAD, in bytes) this engine can take for this cipher
    /// and direction, or `None` if it takes any size. The dispatcher never hands an
    /// engine a job above its limit (as for a cipher it lacks), so a declared limit
    /// sends large jobs to the other engines instead of failing them: an AF_ALG AEAD
    /// request must fit the socket buffers whole, so the `kernel` engine declares
    /// one for GCM.
    fn max_job_len(&self, cipher: Cipher, direction: Direction) -> Option<usize> {
        let _ = (cipher, direction);
        None
    }

    /// Whether a lane may run on the thread that submitted the batch: the dispatcher
    /// then runs a batch that needs one lane in-line, without starting a thread (a
    /// thread's start and join cost more than a batch of a few small jobs). False for
    /// lanes that change their thread (a `cpu` lane pinned to a core).
    fn runs_on_any_thread(&self) -> bool {
        true
    }

    /// Whether running a job keeps a host CPU core busy for its whole duration
    /// (true for software; false for an offload device, whose lane mostly waits).
    fn uses_host_cpu(&self) -> bool {
        true
    }
}

/// A shared engine handle, as the dispatcher holds it.
pub type EngineRef = Arc<dyn Engine>;

/// Builds an engine from its CLI name: `cpu`, `kernel` (generic algorithm names, the
/// kernel picks the driver), `kernel:<driver>` (one named driver), `devcrypto` (the
/// same through `/dev/crypto`) or `devcrypto:<driver>`. `lanes` overrides the engine's
/// default lane count.
pub fn by_name(name: &str, lanes: Option<usize>) -> Result<EngineRef> {
    if name == "cpu" {
        let engine = match lanes {
            Some(n) => cpu::CpuEngine::with_lanes(n),
            None => cpu::CpuEngine::new(),
        };
        return Ok(engine.into_engine());
    }
    if name.starts_with("devcrypto") {
        let engine = match devcrypto::DevcryptoName::parse(name) {
            Some(devcrypto::DevcryptoName::Any) => devcrypto::DevcryptoEngine::open(),
            Some(devcrypto::DevcryptoName::Driver(d)) => devcrypto::DevcryptoEngine::with_driver(d),
            None => return Err(unknown_engine(name)),
        }?;
        return Ok(match lanes {
            Some(n) => engine.with_lanes(n),
            None => engine,
        }
        .into_engine());
    }
    let kernel = match name.strip_prefix("kernel") {
        Some("") => kernel::KernelEngine::open(),
        Some(rest) => match rest.strip_prefix(':') {
            Some(driver) if !driver.is_empty() => kernel::KernelEngine::with_driver(driver),
            _ => return Err(unknown_engine(name)),
        },
        None => return Err(unknown_engine(name)),
    }?;
    Ok(match lanes {
        Some(n) => kernel.with_lanes(n),
        None => kernel,
    }
    .into_engine())
}

fn unknown_engine(name: &str) -> crate::Error {
    crate::Error::UnknownName {
        what: "engine",
        name: name.to_string(),
    }
}

/// Every engine this machine could have, each either ready or with the reason it is
/// unavailable (e.g. "kernel: AF_ALG not supported by this kernel", "devcrypto: no
/// /dev/crypto: the cryptodev module is not loaded"): `cpu`, `kernel` (the kernel's
/// preferred driver per cipher), one `kernel:<driver>` per offload device driver listed
/// in `/proc/crypto`, `devcrypto`, and where `/dev/crypto` exists one
/// `devcrypto:<driver>` per such driver too.
pub fn discover() -> Vec<Result<EngineRef>> {
    let offload = kernel::offload_drivers();
    let mut names = vec!["cpu".to_string(), "kernel".to_string()];
    names.extend(offload.iter().map(|d| format!("kernel:{d}")));
    names.push("devcrypto".to_string());
    if std::path::Path::new(devcrypto::DEV_CRYPTO).exists() {
        names.extend(offload.iter().map(|d| format!("devcrypto:{d}")));
    }
    names.iter().map(|name| by_name(name, None)).collect()
}

/// An unauthenticated job over borrowed buffers (CBC without padding, CTR): what a
/// caller that already holds the bytes (the OpenSSL provider) hands a lane, so that
/// neither side copies them into a [`Job`] and back.
#[derive(Clone, Copy, Debug)]
pub struct RawJob<'a> {
    /// The cipher: [`crate::Mode::Cbc`] or [`crate::Mode::Ctr`].
    pub cipher: Cipher,
    /// Encrypt or decrypt.
    pub direction: Direction,
    /// A key registered in the store the lane is given.
    pub key: KeyId,
    /// The IV (CBC) or counter block (CTR).
    pub iv: [u8; crate::cipher::BLOCK_LEN],
    /// The input: whole blocks for CBC.
    pub input: &'a [u8],
}

/// One worker of an engine. A lane may cache per-key state (expanded keys, cipher
/// contexts, bound sockets) across jobs.
pub trait Lane: Send {
    /// Runs one job, replacing `out`'s contents with the result.
    ///
    /// Errors about the job (bad IV, authentication failure) are returned as they
    /// are; a failure of the engine itself must be [`crate::Error::EngineFailed`], so
    /// the dispatcher knows to run the job elsewhere and stop using this engine.
    fn run(&mut self, job: &Job, keys: &KeyStore, out: &mut JobOutput) -> Result<()>;

    /// Runs several independent jobs at once (at most [`Engine::max_batch`]). The
    /// default runs them one by one; multi-buffer engines override it.
    fn run_batch(
        &mut self,
        jobs: &[&Job],
        keys: &KeyStore,
        outs: &mut [JobOutput],
        results: &mut [Result<()>],
    ) {
        for ((job, out), result) in jobs.iter().zip(outs.iter_mut()).zip(results.iter_mut()) {
            *result = self.run(job, keys, out);
        }
    }

    /// Runs a [`RawJob`] into `out` (as long as the input). The default goes through
    /// [`Lane::run`] (one copy each way); engines whose requests can read and write the
    /// caller's buffers directly override it. Errors as for [`Lane::run`].
    fn run_raw(&mut self, job: &RawJob<'_>, keys: &KeyStore, out: &mut [u8]) -> Result<()> {
        if !matches!(job.cipher.mode, crate::Mode::Cbc | crate::Mode::Ctr)
            || out.len() != job.input.len()
        {
            return Err(crate::Error::InputLength {
                cipher: job.cipher,
                len: job.input.len(),
            });
        }
        let owned = Job::new(
            job.cipher,
            job.direction,
            job.key,
            job.iv,
            job.input.to_vec(),
        );
        let mut result = JobOutput::default();
        self.run(&owned, keys, &mut result)?;
        out.copy_from_slice(&result.data);
        Ok(())
    }

    /// Drops whatever the lane cached for these keys (contexts, expanded keys,
    /// sockets): they were removed from the key store and no job will name them again.
    /// Returns whether it did; the default cannot, and the dispatcher then closes the
    /// lane and opens a fresh one, so caches stay bounded either way.
    fn forget_keys(&mut self, ids: &[KeyId]) -> bool {
        let _ = ids;
        false
    }
}
