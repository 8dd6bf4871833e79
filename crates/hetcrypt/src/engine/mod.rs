//! Engines: the ways hetcrypt can run a job. Mechanism only — no scheduling here.
//!
//! An [`Engine`] describes itself and opens [`Lane`]s; a lane is one worker that can
//! hold one job (or one multi-buffer batch) in flight, driven by one dispatcher thread.

pub mod cpu;
pub mod devcrypto;
pub mod fault;
pub mod kernel;
mod sessions;
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

    /// A description: kind, lanes, drivers. It may do work to find out (the `cpu`
    /// engine measures its implementations); [`Engine::kind`] does not.
    fn info(&self) -> EngineInfo;

    /// Its kind, as [`Engine::info`] gives it, without the rest of the description.
    fn kind(&self) -> EngineKind {
        self.info().kind
    }

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

    /// Runs the jobs `jobs` (at most [`Engine::max_batch`]) with each result written
    /// straight into its slot: `slots[k]` holds on entry whatever the caller is done
    /// with (a spare output to overwrite, or an old error), and on return job `k`'s
    /// output or its job error. What the dispatcher's in-line lane calls for a pull of
    /// consecutive jobs, so that no output is moved out of its slot and back.
    ///
    /// Returns false, having touched nothing, where the lane has no such path for these
    /// jobs (the default, always): the caller then runs them through
    /// [`Lane::run_batch`]. A lane must return false rather than leave a failure of the
    /// engine itself ([`crate::Error::EngineFailed`]) in a slot.
    fn run_slots(
        &mut self,
        jobs: &[Job],
        keys: &KeyStore,
        slots: &mut [Result<JobOutput>],
    ) -> bool {
        let _ = (jobs, keys, slots);
        false
    }

    /// Whether [`Lane::run_in_place`] runs `job` in its own input buffer, with no
    /// copy. The default, and a lane that cannot work in place (or cannot be made
    /// ready, such as a pinned lane off its core), says no.
    fn runs_in_place(&mut self, job: &Job) -> bool {
        let _ = job;
        false
    }

    /// Runs `job` in its own input buffer: that buffer becomes `out.data`, holding the
    /// result (or, after a job error, nothing), and what `out.data` held becomes the
    /// job's input, for the caller to reuse. For large jobs whose inputs the caller
    /// owns and no longer needs (a file's chunks): the input is not copied into the
    /// output first (0.15 s of CPU per GiB of AES-GCM on our 2-core host). The
    /// dispatcher calls it only for jobs [`Lane::runs_in_place`] accepted; the default
    /// runs the job through [`Lane::run`], copying. Errors as for [`Lane::run`], and
    /// never a failure of the engine itself for an accepted job.
    fn run_in_place(&mut self, job: &mut Job, keys: &KeyStore, out: &mut JobOutput) -> Result<()> {
        self.run(job, keys, out)
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
        run_raw_copied(job, out, |owned, result| self.run(owned, keys, result))
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

/// A [`RawJob`] run as an owned [`Job`] by `run` (one copy each way), for lanes whose
/// requests cannot read and write the caller's buffers directly.
pub(crate) fn run_raw_copied(
    job: &RawJob<'_>,
    out: &mut [u8],
    run: impl FnOnce(&Job, &mut JobOutput) -> Result<()>,
) -> Result<()> {
    let owned = Job::new(
        job.cipher,
        job.direction,
        job.key,
        job.iv,
        job.input.to_vec(),
    );
    let mut result = JobOutput::default();
    run(&owned, &mut result)?;
    out.copy_from_slice(&result.data);
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::Error;

    /// A stand-in engine for unit tests: it "encrypts" AES-128-CTR (only) by flipping
    /// every input bit. Plain, it keeps every default of [`Engine`] and [`Lane`];
    /// tuned, it overrides each with a value no default or constant gives.
    pub(crate) struct Stub {
        pub(crate) tuned: bool,
    }

    /// The one cipher the stub runs, and the job size limit a tuned stub declares.
    pub(crate) const STUB_CIPHER: Cipher = Cipher::AES_128_CTR;
    pub(crate) const STUB_MAX_LEN: usize = 1000;

    impl Engine for Stub {
        fn name(&self) -> &str {
            "stub"
        }

        fn info(&self) -> EngineInfo {
            EngineInfo {
                name: "stub".to_string(),
                kind: EngineKind::Cpu,
                lanes: 3,
                ciphers: vec![CipherDriver {
                    cipher: STUB_CIPHER,
                    driver: "bit-flip".to_string(),
                    priority: None,
                    module: None,
                    is_async: None,
                }],
            }
        }

        fn lanes(&self) -> usize {
            3
        }

        fn supports(&self, cipher: Cipher, direction: Direction) -> bool {
            cipher == STUB_CIPHER && direction == Direction::Encrypt
        }

        fn open_lane(&self, _: usize) -> Result<Box<dyn Lane>> {
            Ok(Box::new(StubLane { tuned: self.tuned }))
        }

        fn max_batch(&self) -> usize {
            if self.tuned {
                8
            } else {
                1
            }
        }

        fn batch_width(&self, cipher: Cipher, direction: Direction) -> usize {
            match (self.tuned, self.supports(cipher, direction)) {
                (true, true) => 4,
                (true, false) => 2,
                (false, _) => 1,
            }
        }

        fn max_job_len(&self, cipher: Cipher, direction: Direction) -> Option<usize> {
            (self.tuned && self.supports(cipher, direction)).then_some(STUB_MAX_LEN)
        }

        fn uses_host_cpu(&self) -> bool {
            !self.tuned
        }
    }

    /// Plain defaults, or tuned: forgets keys when given some.
    struct StubLane {
        tuned: bool,
    }

    impl Lane for StubLane {
        fn run(&mut self, job: &Job, _: &KeyStore, out: &mut JobOutput) -> Result<()> {
            out.data = job.input.iter().map(|b| !b).collect();
            out.tag = None;
            Ok(())
        }

        fn forget_keys(&mut self, ids: &[KeyId]) -> bool {
            self.tuned && !ids.is_empty()
        }
    }

    /// A plain stub with the defaults of [`Engine`], the trait object a dispatcher holds.
    fn plain() -> EngineRef {
        Arc::new(Stub { tuned: false })
    }

    /// An engine that overrides nothing it may leave to the trait.
    struct Bare;

    impl Engine for Bare {
        fn name(&self) -> &str {
            "bare"
        }
        fn info(&self) -> EngineInfo {
            Stub { tuned: false }.info()
        }
        fn lanes(&self) -> usize {
            1
        }
        fn supports(&self, _: Cipher, _: Direction) -> bool {
            true
        }
        fn open_lane(&self, _: usize) -> Result<Box<dyn Lane>> {
            Ok(Box::new(BareLane))
        }
    }

    struct BareLane;

    impl Lane for BareLane {
        fn run(&mut self, job: &Job, _: &KeyStore, out: &mut JobOutput) -> Result<()> {
            out.data = job.input.iter().map(|b| b ^ 0x5a).collect();
            Ok(())
        }
    }

    #[test]
    fn engine_defaults_take_one_job_at_a_time_of_any_size_on_a_host_core() {
        let bare = Bare;
        assert_eq!(bare.max_batch(), 1);
        for cipher in [Cipher::AES_128_CTR, Cipher::AES_256_GCM] {
            assert_eq!(bare.batch_width(cipher, Direction::Encrypt), 1);
            assert_eq!(bare.max_job_len(cipher, Direction::Decrypt), None);
        }
        assert!(bare.uses_host_cpu());
        // batch_width follows max_batch by default.
        struct Wide;
        impl Engine for Wide {
            fn name(&self) -> &str {
                "wide"
            }
            fn info(&self) -> EngineInfo {
                Bare.info()
            }
            fn lanes(&self) -> usize {
                1
            }
            fn supports(&self, _: Cipher, _: Direction) -> bool {
                true
            }
            fn open_lane(&self, _: usize) -> Result<Box<dyn Lane>> {
                Ok(Box::new(BareLane))
            }
            fn max_batch(&self) -> usize {
                6
            }
        }
        assert_eq!(Wide.batch_width(Cipher::AES_128_CBC, Direction::Encrypt), 6);
    }

    fn ctr_job(keys: &KeyStore, input: Vec<u8>) -> Job {
        let key = keys
            .add(crate::Key::new(vec![1; 16]))
            .expect("a 16-byte key");
        Job::new(STUB_CIPHER, Direction::Encrypt, key, [2; 16], input)
    }

    #[test]
    fn lane_defaults_run_a_batch_one_by_one_and_forget_no_key() {
        let keys = KeyStore::new();
        let mut lane = BareLane;
        let jobs = [ctr_job(&keys, vec![0; 3]), ctr_job(&keys, vec![0xff; 2])];
        let refs: Vec<&Job> = jobs.iter().collect();
        let mut outs = vec![JobOutput::default(); 2];
        let mut results: Vec<Result<()>> = (0..2)
            .map(|_| {
                Err(Error::EngineFailed {
                    engine: "unset".into(),
                    reason: "not run".into(),
                })
            })
            .collect();
        lane.run_batch(&refs, &keys, &mut outs, &mut results);
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        assert_eq!(outs[0].data, [0x5a; 3]);
        assert_eq!(outs[1].data, [0xa5; 2]);
        assert!(!lane.forget_keys(&[KeyId(0)]));
    }

    #[test]
    fn lane_run_raw_by_default_runs_cbc_and_ctr_through_run_into_an_output_as_long() {
        let keys = KeyStore::new();
        let key = keys
            .add(crate::Key::new(vec![1; 16]))
            .expect("a 16-byte key");
        let raw = |cipher, input| RawJob {
            cipher,
            direction: Direction::Encrypt,
            key,
            iv: [0; 16],
            input,
        };
        let mut lane = BareLane;
        let input = [1u8, 2, 3, 4];
        let mut out = [0u8; 4];
        lane.run_raw(&raw(Cipher::AES_128_CTR, &input), &keys, &mut out)
            .expect("ctr runs");
        assert_eq!(out, [0x5b, 0x58, 0x59, 0x5e]);
        let block = [7u8; 16];
        let mut out = [0u8; 16];
        lane.run_raw(&raw(Cipher::AES_256_CBC, &block), &keys, &mut out)
            .expect("cbc runs");
        assert_eq!(out, [7 ^ 0x5a; 16]);
        // GCM (a tag) and an output of another length are refused, whatever the lane.
        let mut out = [0u8; 16];
        let gcm = lane.run_raw(&raw(Cipher::AES_128_GCM, &block), &keys, &mut out);
        assert!(
            matches!(gcm, Err(Error::InputLength { len: 16, .. })),
            "{gcm:?}"
        );
        let mut short = [0u8; 3];
        let r = lane.run_raw(&raw(Cipher::AES_128_CTR, &input), &keys, &mut short);
        assert!(matches!(r, Err(Error::InputLength { len: 4, .. })), "{r:?}");
        assert_eq!(short, [0; 3], "nothing written");
    }

    #[test]
    fn engines_by_name_parse_as_the_cli_spells_them() {
        let cpu = by_name("cpu", Some(3)).expect("cpu opens everywhere");
        assert_eq!((cpu.name(), cpu.lanes()), ("cpu", 3));
        assert_eq!(
            by_name("cpu", None).map(|e| e.kind()).ok(),
            Some(EngineKind::Cpu)
        );
        for bad in [
            "",
            "gpu",
            "cpu:1",
            "kernel:",
            "kernelx",
            "kernel-foo",
            "devcryptox",
            "devcrypto:",
        ] {
            match by_name(bad, None) {
                Err(Error::UnknownName { what, name }) => {
                    assert_eq!((what, name.as_str()), ("engine", bad));
                }
                Err(e) => panic!("{bad:?}: {e}, not UnknownName"),
                Ok(e) => panic!("{bad:?} opened as {}", e.name()),
            }
        }
        // Well-formed names open here or say why not; they are never unknown.
        for good in [
            "kernel",
            "kernel:virtio_crypto_aes_cbc",
            "devcrypto",
            "devcrypto:x",
        ] {
            match by_name(good, Some(1)) {
                Ok(e) => assert_eq!((e.name(), e.lanes()), (good, 1)),
                Err(Error::EngineUnavailable { engine, .. }) => assert_eq!(engine, good),
                Err(e) => panic!("{good:?}: {e}"),
            }
        }
        let _ = plain();
    }

    #[test]
    fn discover_lists_cpu_kernel_and_devcrypto_whether_they_open_or_not() {
        let found = discover();
        let names: Vec<String> = found
            .iter()
            .map(|r| match r {
                Ok(e) => e.name().to_string(),
                Err(Error::EngineUnavailable { engine, .. }) => engine.clone(),
                Err(e) => panic!("discover: {e}"),
            })
            .collect();
        assert_eq!(names.first().map(String::as_str), Some("cpu"));
        assert!(found[0].is_ok(), "cpu opens everywhere");
        assert_eq!(names.get(1).map(String::as_str), Some("kernel"));
        assert!(names.iter().any(|n| n == "devcrypto"), "{names:?}");
    }
}
