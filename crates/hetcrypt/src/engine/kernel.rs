//! The `kernel` engine: the Linux kernel crypto API through AF_ALG sockets.
//!
//! `kernel` binds the generic names (`cbc(aes)`, `ctr(aes)`, `gcm(aes)`), so the kernel
//! picks its highest-priority driver for each; `kernel:<driver>` binds one driver by
//! name (AF_ALG accepts a driver name where an algorithm name goes) and runs only what
//! `/proc/crypto` says that driver implements. What is usable is probed when the engine
//! opens; an engine with nothing usable is unavailable, with the reason.
//!
//! CBC and CTR jobs of any size are streamed as several requests, the IV or counter
//! carried from one to the next. A GCM request cannot be cut and must fit the socket
//! buffers whole, so the engine declares its largest GCM job
//! ([`Engine::max_job_len`], read from a probe socket's `SO_SNDBUF`/`SO_RCVBUF`) and
//! the dispatcher sends larger ones elsewhere.
//!
//! A device can vanish mid-batch (hot-unplug). The first error of that kind poisons the
//! whole engine: every lane returns [`Error::EngineFailed`] from then on without
//! touching the kernel again, because a second request on a socket whose device is
//! gone crashed the Debian 6.1 kernel in our testbed (DESIGN.md section 3).

pub(crate) mod afalg;
pub(crate) mod device;
pub(crate) mod proc_crypto;

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::Arc;

use block_padding::{Padding, Pkcs7};
use nix::errno::Errno;

use self::afalg::{AlgType, Op, OpSocket, SplicePipe, SysError, Tfm, ALG_NAME_MAX};
use self::device::DeviceWatch;
use self::proc_crypto::AlgEntry;
use crate::cipher::{Cipher, Direction, KeySize, Mode, BLOCK_LEN};
use crate::engine::sessions::{OpenError, SessionCache};
use crate::engine::shared;
use crate::engine::{CipherDriver, Engine, EngineInfo, EngineKind, EngineRef, Lane, RawJob};
use crate::error::{Error, Result};
use crate::job::{Job, JobOutput, TAG_LEN};
use crate::key::{KeyId, KeyStore};

/// The kernel algorithms hetcrypt uses, with their AF_ALG socket type and the modes
/// each serves (padding is applied in user space around raw `cbc(aes)`).
const ALGORITHMS: [(&str, AlgType, &[Mode]); 3] = [
    ("cbc(aes)", AlgType::Skcipher, &[Mode::Cbc, Mode::CbcPkcs7]),
    ("ctr(aes)", AlgType::Skcipher, &[Mode::Ctr]),
    ("gcm(aes)", AlgType::Aead, &[Mode::Gcm]),
];

/// Default lanes of a device engine (`kernel` and `devcrypto`), where the caller does
/// not take the calibration store's lanes sweep: one. A lane is one thread driving one operation socket with one request in flight.
/// Two requests in flight do overlap on the testbed's device (the guest's vCPU builds
/// the next while the device, a QEMU host thread, works on one): two lanes measured
/// 1.12-1.21x `openssl speed -engine afalg` where one measured 0.89-0.93x, so `speed`
/// runs the count the store's sweep found best (`calibration::lanes`). But under the
/// policies two module lanes cost `pull` 0.36-0.80x at 8-256 B (docs/results.md, "Two
/// device lanes against one"), so the default, which every policy result was measured
/// with, stays one. [`KernelEngine::with_lanes`] sets any count.
/// A software driver (e.g. `cbc-aes-aesni`) runs on the calling CPU, where a second
/// lane would only compete with the `cpu` engine's lanes: one there too.
pub const DEFAULT_LANES: usize = 1;

/// Most bytes of one skcipher request: 16 pages (the kernel's `ALG_MAX_PAGES`, the most
/// AF_ALG pins for one scatterlist entry of the output) of 4 KiB. Well under the
/// default socket buffers (`net.core.wmem_default`, 208 KiB), so a request never waits
/// for buffer space that only its own `read` could free; larger jobs are cut into such
/// requests, each given the IV/counter the previous one ends with.
const SKCIPHER_REQUEST_MAX: usize = 16 * 4096;

/// Smallest skcipher request whose input is spliced into the socket
/// ([`OpSocket::send_spliced`]) rather than copied by `sendmsg`. Splicing costs two more
/// system calls (`vmsplice`, `splice`) and saves the kernel allocating pages and copying
/// the input into them. In the TCG guest (the `kernel_splice` example) the two cost the
/// same at 8 KiB, splicing gains 3-10% at 16 KiB and loses 3-20% at 4 KiB and below
/// (docs/performance.md, "One request in flight again"). Debian's OpenSSL 3.0 afalg
/// engine copies at every size.
const SPLICE_MIN: usize = 8192;

/// Keyed transforms a lane keeps (one per key and algorithm, two sockets each).
/// Bounded so per-file keys cannot exhaust descriptors or the device's sessions
/// (QEMU's built-in virtio-crypto backend holds at most 256, two per keyed transform:
/// 32 let four lanes share it); the least recently used is closed when full, and where
/// the device is full all the same, closed to retry once ([`sessions`](super::sessions)).
const MAX_CONTEXTS_PER_LANE: usize = 32;

/// The running kernel's release (`uname -r`), e.g. `6.1.0-56-amd64`: every report of
/// a kernel engine's results should carry it.
pub fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_else(|e| format!("unknown ({})", e.desc()))
}

/// The AES drivers in `/proc/crypto` that run on a separate device (offload hardware
/// such as `virtio_crypto_aes_cbc`), each the name of a `kernel:<driver>` engine.
/// Empty where the file cannot be read (no such kernel support, or not Linux).
pub fn offload_drivers() -> Vec<String> {
    let Ok(entries) = proc_crypto::read(std::path::Path::new(proc_crypto::PROC_CRYPTO)) else {
        return Vec::new();
    };
    let mut drivers: Vec<String> = entries
        .iter()
        .filter(|e| {
            ALGORITHMS.iter().any(|(name, _, _)| *name == e.name)
                && !e.internal
                && e.is_offload(&entries)
        })
        .map(|e| e.driver.clone())
        .collect();
    drivers.sort();
    drivers.dedup();
    drivers
}

/// One kernel algorithm as this engine serves it.
#[derive(Clone, Debug)]
struct Served {
    /// The generic algorithm, e.g. `cbc(aes)`.
    algorithm: &'static str,
    ty: AlgType,
    /// What `bind` is given: the generic name or the driver name.
    bind_name: String,
    modes: &'static [Mode],
    /// Key sizes the driver accepted when probed.
    key_sizes: Vec<KeySize>,
    /// For an AEAD: most input and output bytes of one request, read from an operation
    /// socket when probed (an AEAD request cannot be cut; skcipher jobs are streamed
    /// in requests of any size, so they have no limit).
    request_limits: Option<(usize, usize)>,
    /// The driver that serves it, from `/proc/crypto` (absent if not listed).
    entry: Option<AlgEntry>,
    /// Whether that driver runs on a separate device.
    offload: bool,
    /// For an offload driver: the device links whose vanishing means it is going.
    watch: DeviceWatch,
}

/// Shared by an engine and all its lanes.
type State = shared::State<Served>;

impl shared::Serves for Served {
    fn modes(&self) -> &[Mode] {
        self.modes
    }

    fn key_sizes(&self) -> &[KeySize] {
        &self.key_sizes
    }
}

/// The kernel crypto API as an engine (AF_ALG `skcipher` for CBC/CTR, `aead` for GCM).
#[derive(Debug)]
pub struct KernelEngine {
    state: Arc<State>,
    lanes: usize,
    /// Smallest request whose input is spliced ([`SPLICE_MIN`] unless set).
    splice_min: usize,
}

impl KernelEngine {
    /// The engine named `kernel`, binding the generic algorithm names (`cbc(aes)`, ...)
    /// so the kernel picks its highest-priority driver for each.
    pub fn open() -> Result<Self> {
        Self::probe("kernel".to_string(), None)
    }

    /// The engine named `kernel:<driver>`, binding one named driver (e.g.
    /// `virtio_crypto_aes_cbc`) for the cipher(s) it implements.
    pub fn with_driver(driver: &str) -> Result<Self> {
        Self::probe(format!("kernel:{driver}"), Some(driver))
    }

    /// Sets the lane count (concurrent operation sockets, one thread each; at least one).
    pub fn with_lanes(mut self, lanes: usize) -> Self {
        self.lanes = lanes.max(1);
        self
    }

    /// Sets the smallest skcipher request whose input is spliced into the socket
    /// rather than copied (default [`SPLICE_MIN`] bytes; `usize::MAX`: never), so that
    /// both ways can be measured side by side (the `kernel_splice` example).
    pub fn with_splice_min(mut self, bytes: usize) -> Self {
        self.splice_min = bytes.max(1);
        self
    }

    /// Wraps the engine for a dispatcher.
    pub fn into_engine(self) -> EngineRef {
        Arc::new(self)
    }

    /// The kernel release this engine runs on (`uname -r`).
    pub fn kernel_release(&self) -> &str {
        &self.state.release
    }

    fn probe(name: String, driver: Option<&str>) -> Result<Self> {
        let unavailable = |reason: String| Error::EngineUnavailable {
            engine: name.clone(),
            reason,
        };
        match afalg::alg_socket() {
            Ok(_) => {}
            Err(SysError {
                errno: Errno::EAFNOSUPPORT,
                ..
            }) => return Err(unavailable("AF_ALG not supported by this kernel".into())),
            Err(e) => return Err(unavailable(format!("cannot open an AF_ALG socket: {e}"))),
        }
        let served = match driver {
            None => probe_generic().map_err(unavailable)?,
            Some(driver) => probe_driver(driver).map_err(unavailable)?,
        };
        Ok(KernelEngine {
            state: Arc::new(State::new(name, served, kernel_release())),
            lanes: DEFAULT_LANES,
            splice_min: SPLICE_MIN,
        })
    }
}

/// Reads `/proc/crypto`, or nothing if it cannot be read (the driver columns then
/// stay empty; binding still tells what works).
pub(crate) fn proc_entries() -> Vec<AlgEntry> {
    proc_crypto::read(Path::new(proc_crypto::PROC_CRYPTO)).unwrap_or_default()
}

/// Binds `bind_name` as `ty` and sets a key of every AES size, to learn which the
/// driver takes. `Err` only when it cannot be bound at all.
fn probe_key_sizes(ty: AlgType, bind_name: &str) -> std::result::Result<Vec<KeySize>, SysError> {
    let tfm = Tfm::bind(ty, bind_name)?;
    /// A key of zeros: the probe only asks whether the driver takes the length.
    const PROBE_KEY: [u8; 32] = [0; 32];
    Ok(KeySize::ALL
        .into_iter()
        .filter(|ks| tfm.set_key(&PROBE_KEY[..ks.key_len()]).is_ok())
        .collect())
}

/// Most input and output bytes of one request on a fresh operation socket of
/// `bind_name` (keyed with zeros of `key_size`), as every lane's sockets will have
/// them: the socket buffers come from `net.core.wmem_default` / `rmem_default`.
fn probe_request_limits(
    ty: AlgType,
    bind_name: &str,
    key_size: KeySize,
) -> std::result::Result<(usize, usize), SysError> {
    /// A key of zeros: the probe only opens a socket to read its buffer sizes.
    const PROBE_KEY: [u8; 32] = [0; 32];
    let tfm = Tfm::bind(ty, bind_name)?;
    tfm.set_key(&PROBE_KEY[..key_size.key_len()])?;
    if ty == AlgType::Aead {
        tfm.set_aead_tag_len(TAG_LEN)?;
    }
    tfm.accept()?.limits()
}

/// The request limits of an AEAD algorithm (`None` for skcipher, which has none).
fn aead_limits(
    ty: AlgType,
    bind_name: &str,
    key_sizes: &[KeySize],
) -> std::result::Result<Option<(usize, usize)>, SysError> {
    match (ty, key_sizes.first()) {
        (AlgType::Aead, Some(&key_size)) => probe_request_limits(ty, bind_name, key_size).map(Some),
        _ => Ok(None),
    }
}

/// The largest GCM job (AAD plus input) that fits one request within `limits`
/// (input, output bytes): the tag travels in when decrypting and out when encrypting.
fn aead_max_len(limits: (usize, usize), direction: Direction) -> usize {
    match direction {
        Direction::Encrypt => limits.0.min(limits.1.saturating_sub(TAG_LEN)),
        Direction::Decrypt => limits.0.saturating_sub(TAG_LEN).min(limits.1),
    }
}

/// The `kernel` engine's algorithms: each generic name that binds.
fn probe_generic() -> std::result::Result<Vec<Served>, String> {
    let mut served = Vec::new();
    let mut missing = Vec::new();
    for (algorithm, ty, modes) in ALGORITHMS {
        match probe_key_sizes(ty, algorithm).and_then(|key_sizes| {
            aead_limits(ty, algorithm, &key_sizes).map(|limits| (key_sizes, limits))
        }) {
            Ok((key_sizes, request_limits)) if !key_sizes.is_empty() => served.push(Served {
                algorithm,
                ty,
                bind_name: algorithm.to_string(),
                modes,
                key_sizes,
                request_limits,
                entry: None,
                offload: false,
                watch: DeviceWatch::default(),
            }),
            Ok(_) => missing.push(format!("{algorithm}: no AES key size accepted")),
            Err(e) => missing.push(format!("{algorithm}: {e}")),
        }
    }
    if served.is_empty() {
        return Err(format!(
            "no AES algorithm can be bound ({}); are algif_skcipher/algif_aead loaded?",
            missing.join("; ")
        ));
    }
    // Read after binding: binding can instantiate a template (`gcm(aes)` from
    // `gcm_base(...)`) that is only listed from then on.
    let entries = proc_entries();
    for s in &mut served {
        s.entry = proc_crypto::best(&entries, s.algorithm, s.ty.as_str()).cloned();
        s.offload = s.entry.as_ref().is_some_and(|e| e.is_offload(&entries));
        if let Some(e) = s.entry.as_ref().filter(|_| s.offload) {
            s.watch = DeviceWatch::for_module(&e.module);
        }
    }
    Ok(served)
}

/// The `kernel:<driver>` engine's algorithm: the one `/proc/crypto` lists for that
/// driver, if hetcrypt uses it.
fn probe_driver(driver: &str) -> std::result::Result<Vec<Served>, String> {
    if driver.len() > ALG_NAME_MAX || driver.contains('\0') {
        return Err(format!(
            "'{}' is not a driver name (AF_ALG takes at most {ALG_NAME_MAX} bytes)",
            driver.escape_debug()
        ));
    }
    let mut entries = proc_entries();
    if proc_crypto::by_driver(&entries, driver).is_none() {
        // Not listed yet: binding by driver name may load its module or instantiate a
        // template (`cbc(aes-generic)`); then it is listed.
        let bound = [AlgType::Skcipher, AlgType::Aead]
            .into_iter()
            .any(|ty| Tfm::bind(ty, driver).is_ok());
        if !bound {
            return Err(format!(
                "no driver named '{driver}' (not in /proc/crypto, and binding it fails)"
            ));
        }
        entries = proc_entries();
    }
    let entry = proc_crypto::by_driver(&entries, driver)
        .ok_or_else(|| format!("driver '{driver}' binds but /proc/crypto does not list it"))?
        .clone();
    let (algorithm, ty, modes) = ALGORITHMS
        .into_iter()
        .find(|(name, ty, _)| *name == entry.name && ty.as_str() == entry.kind)
        .ok_or_else(|| {
            format!(
                "driver '{driver}' implements {} ({}), which hetcrypt does not use",
                entry.name, entry.kind
            )
        })?;
    let key_sizes = probe_key_sizes(ty, driver).map_err(|e| format!("driver '{driver}': {e}"))?;
    if key_sizes.is_empty() {
        return Err(format!("driver '{driver}' accepts no AES key size"));
    }
    let request_limits =
        aead_limits(ty, driver, &key_sizes).map_err(|e| format!("driver '{driver}': {e}"))?;
    let offload = entry.is_offload(&entries);
    let watch = if offload {
        DeviceWatch::for_module(&entry.module)
    } else {
        DeviceWatch::default()
    };
    Ok(vec![Served {
        algorithm,
        ty,
        bind_name: driver.to_string(),
        modes,
        key_sizes,
        request_limits,
        entry: Some(entry),
        offload,
        watch,
    }])
}

impl Engine for KernelEngine {
    fn name(&self) -> &str {
        &self.state.name
    }

    fn info(&self) -> EngineInfo {
        let mut ciphers = Vec::new();
        for s in &self.state.served {
            for &mode in s.modes {
                for &key_size in &s.key_sizes {
                    let e = s.entry.as_ref();
                    ciphers.push(CipherDriver {
                        cipher: Cipher::new(key_size, mode),
                        driver: format!(
                            "{} ({} on Linux {})",
                            e.map_or("unlisted in /proc/crypto", |e| e.driver.as_str()),
                            s.algorithm,
                            self.state.release
                        ),
                        priority: e.and_then(|e| e.priority),
                        module: e.map(|e| e.module.clone()),
                        is_async: e.map(|e| e.is_async),
                    });
                }
            }
        }
        ciphers.sort_by_key(|c| c.cipher);
        EngineInfo {
            name: self.state.name.clone(),
            kind: EngineKind::Kernel,
            lanes: self.lanes,
            ciphers,
        }
    }

    fn kind(&self) -> EngineKind {
        EngineKind::Kernel
    }

    fn lanes(&self) -> usize {
        self.lanes
    }

    fn supports(&self, cipher: Cipher, _direction: Direction) -> bool {
        self.state.served(cipher).is_some()
    }

    /// GCM: what one request of a probed operation socket can carry (an AEAD request
    /// must fit the socket buffers whole); CBC and CTR: no limit (streamed in pieces).
    fn max_job_len(&self, cipher: Cipher, direction: Direction) -> Option<usize> {
        let limits = self.state.served(cipher)?.request_limits?;
        Some(aead_max_len(limits, direction))
    }

    fn open_lane(&self, _index: usize) -> Result<Box<dyn Lane>> {
        self.state.check_poison()?;
        Ok(Box::new(KernelLane {
            state: Arc::clone(&self.state),
            contexts: SessionCache::new(MAX_CONTEXTS_PER_LANE),
            aad_scratch: Vec::new(),
            pipe: None,
            splice_min: self.splice_min,
        }))
    }

    /// False when every cipher is served by an offload device (the lane thread mostly
    /// sleeps in `read`); true when any is software running on the host CPU.
    fn uses_host_cpu(&self) -> bool {
        !self.state.served.iter().all(|s| s.offload)
    }
}

/// A keyed transform and its operation socket, cached per (key, algorithm, key size).
#[derive(Debug)]
struct Context {
    /// Kept open: closing it would free the kernel transform under `op`.
    _tfm: Tfm,
    op: OpSocket,
    /// Most input and output bytes one request may carry on `op`.
    limits: (usize, usize),
}

type ContextKey = (KeyId, &'static str, KeySize);

/// One `kernel` lane: cached keyed sockets, one request in flight at a time.
struct KernelLane {
    state: Arc<State>,
    /// At most [`MAX_CONTEXTS_PER_LANE`].
    contexts: SessionCache<ContextKey, Context>,
    /// Where the kernel writes back the AAD of a GCM request (it copies it to the
    /// output ahead of the ciphertext).
    aad_scratch: Vec<u8>,
    /// For requests of `splice_min` bytes or more, made at the first one; `None`
    /// until then, or where no pipe could be made (those requests are copied).
    pipe: Option<SplicePipe>,
    /// Smallest request whose input goes in through `pipe` ([`SPLICE_MIN`] by default).
    splice_min: usize,
}

/// How a lane's large requests reach the socket: through `pipe`, from `min` bytes up.
#[derive(Clone, Copy)]
struct Splicing<'a> {
    pipe: &'a SplicePipe,
    min: usize,
}

/// How a failed request is classified.
#[derive(Debug)]
enum Failure {
    /// The job's own fault (GCM tag mismatch): the socket stays usable.
    Job(Error),
    /// The engine's: poison it.
    Engine(String),
    /// The device holds no more sessions: the job fails, the engine stays.
    Busy(String),
}

impl KernelLane {
    /// The keyed context for this job, opened (and keyed) on first use.
    fn context(
        &mut self,
        key_id: KeyId,
        cipher: Cipher,
        served: &Served,
        keys: &KeyStore,
    ) -> std::result::Result<&mut Context, Failure> {
        let cache_key = (key_id, served.algorithm, cipher.key_size);
        let open = || {
            // Keying a transform is a device request too: look before it as well.
            served.watch.check_all().map_err(OpenError::Failed)?;
            let failed = |e: SysError| {
                OpenError::Failed(Failure::Engine(format!("{}: {e}", served.bind_name)))
            };
            let tfm = Tfm::bind(served.ty, &served.bind_name).map_err(|e| {
                OpenError::Failed(Failure::Engine(format!(
                    "{} {}: {e}",
                    served.ty.as_str(),
                    served.bind_name
                )))
            })?;
            keys.with_key(key_id, |key| {
                if key.len() != cipher.key_len() {
                    return Err(OpenError::Failed(Failure::Job(Error::KeyLength {
                        cipher,
                        expected: cipher.key_len(),
                        got: key.len(),
                    })));
                }
                tfm.set_key(key.as_bytes())
                    .map_err(|e| set_key_failure(e, served))
            })
            .map_err(|e| OpenError::Failed(Failure::Job(e)))??;
            if served.ty == AlgType::Aead {
                tfm.set_aead_tag_len(TAG_LEN).map_err(failed)?;
            }
            let op = tfm.accept().map_err(failed)?;
            let limits = op.limits().map_err(failed)?;
            Ok(Context {
                _tfm: tfm,
                op,
                limits,
            })
        };
        // Closing a context's sockets ends its device sessions.
        self.contexts.get_or_open(cache_key, open, |ctx| {
            drop(ctx);
            Ok(())
        })
    }
}

/// How `ALG_SET_KEY` with a key of the right length failed. The 6.1 virtio-crypto
/// driver answers `EINVAL` when the device refuses to open a session, which QEMU's
/// built-in backend does when it holds its 256 (seen in the testbed: the 129th key
/// fails with `EINVAL`, the kernel logging "virtio_crypto: Create session failed
/// status: 1"). So `EINVAL` on a device still bound means "no more sessions", worth a
/// retry and no quarantine; on a device whose link vanished, or any other errno, the
/// engine has failed.
fn set_key_failure(e: SysError, served: &Served) -> OpenError<Failure> {
    if let Some(why) = served.watch.gone_all() {
        return OpenError::Failed(Failure::Engine(why));
    }
    let what = format!("{}: {e}", served.bind_name);
    if e.errno == Errno::EINVAL {
        OpenError::Exhausted(Failure::Busy(format!(
            "{what}: the device holds no more sessions"
        )))
    } else {
        OpenError::Failed(Failure::Engine(what))
    }
}

impl Lane for KernelLane {
    fn run(&mut self, job: &Job, keys: &KeyStore, out: &mut JobOutput) -> Result<()> {
        job.validate()?;
        // A poisoned engine never touches the kernel again.
        self.state.check_poison()?;
        let state = Arc::clone(&self.state);
        let served = state.served(job.cipher).ok_or_else(|| Error::Unsupported {
            cipher: job.cipher,
            engine: state.name.clone(),
        })?;
        out.data.clear();
        out.tag = None;
        let mut scratch = std::mem::take(&mut self.aad_scratch);
        let result = self.with_splicing(job.input.len(), |lane, splicing| {
            let ctx = lane.context(job.key, job.cipher, served, keys)?;
            match served.ty {
                AlgType::Skcipher => run_skcipher(ctx, job, out, &served.watch, splicing),
                AlgType::Aead => run_aead(ctx, job, out, &mut scratch, &state.name, &served.watch),
            }
        });
        self.aad_scratch = scratch;
        if result.is_err() {
            out.data.clear();
            out.tag = None;
        }
        settle(&state, served, result)
    }

    fn run_raw(&mut self, job: &RawJob<'_>, keys: &KeyStore, out: &mut [u8]) -> Result<()> {
        let cipher = job.cipher;
        let blocks_only = cipher.mode == Mode::Cbc && !job.input.len().is_multiple_of(BLOCK_LEN);
        if !matches!(cipher.mode, Mode::Cbc | Mode::Ctr)
            || blocks_only
            || out.len() != job.input.len()
        {
            return Err(Error::InputLength {
                cipher,
                len: job.input.len(),
            });
        }
        self.state.check_poison()?;
        let state = Arc::clone(&self.state);
        let served = state.served(cipher).ok_or_else(|| Error::Unsupported {
            cipher,
            engine: state.name.clone(),
        })?;
        let input = SkInput {
            body: job.input,
            tail: None,
        };
        // The device is checked before keying (in `context`) and before each request.
        // SAFETY: `MaybeUninit<u8>` has `u8`'s layout, and the requests only ever write
        // initialised bytes into it.
        let out = unsafe { &mut *(out as *mut [u8] as *mut [MaybeUninit<u8>]) };
        let result = self.with_splicing(job.input.len(), |lane, splicing| {
            let ctx = lane.context(job.key, cipher, served, keys)?;
            skcipher_requests(
                ctx,
                cipher.mode,
                job.direction,
                job.iv,
                &input,
                out,
                &served.watch,
                splicing,
            )
        });
        settle(&state, served, result)
    }

    fn forget_keys(&mut self, ids: &[KeyId]) -> bool {
        self.forget(ids);
        true
    }
}

impl KernelLane {
    /// Runs one job of `len` bytes, `f`, with the lane's splicing: its pipe, made at the
    /// first job of `splice_min` bytes or more (`None` for smaller jobs while there is
    /// none yet, and where the kernel gives no pipe), lent to `f` out of the lane and
    /// kept only if the job succeeded: a request that failed may have left input in the
    /// pipe, so it is never reused.
    fn with_splicing(
        &mut self,
        len: usize,
        f: impl FnOnce(&mut Self, Option<Splicing<'_>>) -> std::result::Result<(), Failure>,
    ) -> std::result::Result<(), Failure> {
        if self.pipe.is_none() && len >= self.splice_min {
            self.pipe = SplicePipe::new(SKCIPHER_REQUEST_MAX).ok();
        }
        let pipe = self.pipe.take();
        let splicing = pipe.as_ref().map(|pipe| Splicing {
            pipe,
            min: self.splice_min,
        });
        let result = f(self, splicing);
        self.pipe = pipe.filter(|_| result.is_ok());
        result
    }

    /// Closes the contexts of removed keys (their sockets, and any device session the
    /// driver holds for them). A poisoned engine's sockets stay, to be parked on drop.
    fn forget(&mut self, ids: &[KeyId]) {
        if !self.state.is_poisoned() {
            drop(self.contexts.take_unless(|(key, _, _)| !ids.contains(key)));
        }
    }
}

impl Drop for KernelLane {
    /// A poisoned engine's sockets are parked, never closed: see [`device::park`].
    fn drop(&mut self) {
        if self.state.is_poisoned() && !self.contexts.is_empty() {
            let fds = self
                .contexts
                .drain()
                .flat_map(|c| [c._tfm.into_fd(), c.op.into_fd()])
                .collect();
            device::park(fds);
        }
    }
}

/// An unexpected kernel error: the engine's failure.
fn engine_failure(e: SysError) -> Failure {
    Failure::Engine(e.to_string())
}

/// The input of a skcipher job as the kernel sees it: the job's bytes, plus (PKCS#7
/// encryption) a last block holding the partial tail and the padding.
struct SkInput<'a> {
    body: &'a [u8],
    tail: Option<[u8; BLOCK_LEN]>,
}

impl SkInput<'_> {
    fn len(&self) -> usize {
        self.body.len() + self.tail.map_or(0, |_| BLOCK_LEN)
    }

    /// The bytes `[pos, pos + n)`, as at most two slices (on the stack: this runs per
    /// request).
    fn slices(&self, pos: usize, n: usize) -> TwoSlices<'_> {
        let mut v = TwoSlices {
            slices: [IoSlice::new(&[]), IoSlice::new(&[])],
            len: 0,
        };
        let end = pos + n;
        if pos < self.body.len() {
            v.slices[v.len] = IoSlice::new(&self.body[pos..end.min(self.body.len())]);
            v.len += 1;
        }
        if let Some(tail) = &self.tail {
            if end > self.body.len() {
                let from = pos.saturating_sub(self.body.len());
                v.slices[v.len] = IoSlice::new(&tail[from..end - self.body.len()]);
                v.len += 1;
            }
        }
        v
    }

    /// The 16 bytes ending at `end` (CBC decryption chains on input blocks).
    fn block_before(&self, end: usize) -> [u8; BLOCK_LEN] {
        let mut b = [0u8; BLOCK_LEN];
        for (i, byte) in b.iter_mut().enumerate() {
            let p = end - BLOCK_LEN + i;
            *byte = if p < self.body.len() {
                self.body[p]
            } else {
                self.tail.map_or(0, |t| t[p - self.body.len()])
            };
        }
        b
    }
}

/// At most two slices of a request's input ([`SkInput::slices`]), the first `len` used.
struct TwoSlices<'a> {
    slices: [IoSlice<'a>; 2],
    len: usize,
}

impl<'a> std::ops::Deref for TwoSlices<'a> {
    type Target = [IoSlice<'a>];

    fn deref(&self) -> &Self::Target {
        &self.slices[..self.len]
    }
}

/// CBC or CTR: the input in requests of at most [`SKCIPHER_REQUEST_MAX`] bytes, each
/// given the IV that continues the previous one, so the result equals one-shot
/// processing whatever the driver does with the IV it is handed back.
fn run_skcipher(
    ctx: &mut Context,
    job: &Job,
    out: &mut JobOutput,
    watch: &DeviceWatch,
    splicing: Option<Splicing<'_>>,
) -> std::result::Result<(), Failure> {
    let mode = job.cipher.mode;
    let (body, tail) = if mode == Mode::CbcPkcs7 && job.direction == Direction::Encrypt {
        let full = job.input.len() - job.input.len() % BLOCK_LEN;
        let mut last = [0u8; BLOCK_LEN];
        let rest = &job.input[full..];
        last[..rest.len()].copy_from_slice(rest);
        Pkcs7::raw_pad(&mut last, rest.len());
        (&job.input[..full], Some(last))
    } else {
        (&job.input[..], None)
    };
    let input = SkInput { body, tail };
    let total = input.len();
    // Reserved, not zeroed: each read fills its range (see `OpSocket::recv_into`).
    out.data.clear();
    out.data.reserve(total);
    let iv: [u8; BLOCK_LEN] = job
        .iv()
        .try_into()
        .expect("validate() checked a 16-byte IV");
    skcipher_requests(
        ctx,
        mode,
        job.direction,
        iv,
        &input,
        &mut out.data.spare_capacity_mut()[..total],
        watch,
        splicing,
    )?;
    // SAFETY: `total` bytes were reserved above, and the requests wrote all of them.
    unsafe { out.data.set_len(total) };
    if mode == Mode::CbcPkcs7 && job.direction == Direction::Decrypt {
        let last = total - BLOCK_LEN; // validate(): at least one block
        let kept = Pkcs7::raw_unpad(&out.data[last..])
            .map_err(|_| Failure::Job(Error::AuthenticationFailed))?
            .len();
        out.data.truncate(last + kept);
    }
    Ok(())
}

/// What a lane returns for a request's outcome: a job error as it is, an engine
/// failure as the poison that stops every lane of the engine.
fn settle(state: &State, served: &Served, result: std::result::Result<(), Failure>) -> Result<()> {
    match result {
        Ok(()) => Ok(()),
        Err(Failure::Job(e)) => Err(e),
        Err(Failure::Busy(reason)) => Err(Error::EngineBusy {
            engine: state.name.clone(),
            reason,
        }),
        // The socket that failed stays in the cache, never used again: the poison
        // flag stops every lane before it reaches the kernel.
        Err(Failure::Engine(what)) => Err(state.poison(format!(
            "{what} (driver {}, Linux {}); engine stopped, its jobs go elsewhere",
            served
                .entry
                .as_ref()
                .map_or(served.bind_name.as_str(), |e| e.driver.as_str()),
            state.release
        ))),
    }
}

/// The requests of one CBC or CTR job: `input` (as many bytes as `out`) in requests
/// of at most [`SKCIPHER_REQUEST_MAX`] bytes, each given the IV that continues the
/// previous one, the output read straight into `out`, which may be uninitialised: on
/// success every byte of it has been written. Requests of `splicing.min` bytes or more
/// go in through its pipe where they fit in it.
#[allow(clippy::too_many_arguments)]
fn skcipher_requests(
    ctx: &mut Context,
    mode: Mode,
    direction: Direction,
    mut iv: [u8; BLOCK_LEN],
    input: &SkInput<'_>,
    out: &mut [MaybeUninit<u8>],
    watch: &DeviceWatch,
    splicing: Option<Splicing<'_>>,
) -> std::result::Result<(), Failure> {
    let total = input.len();
    let op = match direction {
        Direction::Encrypt => Op::Encrypt,
        Direction::Decrypt => Op::Decrypt,
    };
    // A request never exceeds what the socket buffers hold, and stays whole blocks.
    let step = SKCIPHER_REQUEST_MAX.min(ctx.limits.0).min(ctx.limits.1) / BLOCK_LEN * BLOCK_LEN;
    if step == 0 && total > 0 {
        return Err(Failure::Engine(format!(
            "socket buffers too small for one block ({:?})",
            ctx.limits
        )));
    }
    let mut pos = 0;
    while pos < total {
        let n = step.min(total - pos);
        let slices = input.slices(pos, n);
        match splicing.filter(|s| n >= s.min && s.pipe.fits(&slices)) {
            Some(s) => ctx.op.send_spliced(op, &iv, &slices, s.pipe),
            None => ctx.op.send(op, &iv, None, &slices),
        }
        .map_err(engine_failure)?;
        // The look comes last before the `read`, the call that hands the request to
        // the driver (sending only queues the input in the socket), so that no other
        // call lies between the look and the request.
        watch.check()?;
        ctx.op
            .recv_into(&mut out[pos..pos + n])
            .map_err(engine_failure)?;
        pos += n;
        if pos < total {
            iv = match (mode, direction) {
                (Mode::Ctr, _) => {
                    let blocks = (n / BLOCK_LEN) as u128;
                    u128::from_be_bytes(iv).wrapping_add(blocks).to_be_bytes()
                }
                // SAFETY: the read just above wrote these bytes.
                (_, Direction::Encrypt) => {
                    std::array::from_fn(|i| unsafe { out[pos - BLOCK_LEN + i].assume_init() })
                }
                (_, Direction::Decrypt) => input.block_before(pos),
            };
        }
    }
    Ok(())
}

/// GCM: one request. The kernel takes AAD || input (|| tag when decrypting) and
/// returns AAD || output (|| tag when encrypting).
fn run_aead(
    ctx: &mut Context,
    job: &Job,
    out: &mut JobOutput,
    aad_scratch: &mut Vec<u8>,
    engine: &str,
    watch: &DeviceWatch,
) -> std::result::Result<(), Failure> {
    let too_large = |max: usize| {
        Failure::Job(Error::TooLarge {
            cipher: job.cipher,
            engine: engine.to_string(),
            len: job.aad.len() + job.input.len(),
            max,
        })
    };
    let aad_len = u32::try_from(job.aad.len()).map_err(|_| too_large(u32::MAX as usize))?;
    let encrypt = job.direction == Direction::Encrypt;
    let tag_in = if encrypt { 0 } else { TAG_LEN };
    let tag_out = if encrypt { TAG_LEN } else { 0 };
    let tx = job.aad.len() + job.input.len() + tag_in;
    let rx = job.aad.len() + job.input.len() + tag_out;
    if tx > ctx.limits.0 || rx > ctx.limits.1 {
        // An AEAD request cannot be split, and must fit the socket buffers whole.
        // Growing them (SO_SNDBUFFORCE) only moves the wall: the kernel then fails the
        // read with ENOMEM once its per-request scatterlists pass `net.core.optmem_max`.
        // The dispatcher keeps jobs above the limit declared at probe time away from
        // this engine; this guards a socket whose buffers shrank since.
        return Err(too_large(aead_max_len(ctx.limits, job.direction)));
    }
    aad_scratch.clear();
    aad_scratch.resize(job.aad.len(), 0);
    out.data.resize(job.input.len(), 0);
    let mut tag = [0u8; TAG_LEN];
    let given_tag = job.tag.unwrap_or_default();
    let (op, input) = if encrypt {
        (
            Op::Encrypt,
            [
                IoSlice::new(&job.aad),
                IoSlice::new(&job.input),
                IoSlice::new(&[]),
            ],
        )
    } else {
        (
            Op::Decrypt,
            [
                IoSlice::new(&job.aad),
                IoSlice::new(&job.input),
                IoSlice::new(&given_tag),
            ],
        )
    };
    ctx.op
        .send(op, job.iv(), Some(aad_len), &input)
        .map_err(engine_failure)?;
    // Last before the `read` that hands the request to the driver, as for skcipher.
    watch.check()?;
    let read = if rx == 0 {
        ctx.op.recv_nothing()
    } else {
        let tag_slot: &mut [u8] = if encrypt { &mut tag } else { &mut [] };
        ctx.op.recv_exact(&mut [
            IoSliceMut::new(aad_scratch),
            IoSliceMut::new(&mut out.data),
            IoSliceMut::new(tag_slot),
        ])
    };
    match read {
        Ok(()) => {}
        Err(SysError {
            errno: Errno::EBADMSG,
            ..
        }) => return Err(Failure::Job(Error::AuthenticationFailed)),
        Err(e) => return Err(engine_failure(e)),
    }
    if encrypt {
        out.tag = Some(tag);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AES-128-CBC served by driver `bind_name`, with no device to watch.
    fn cbc_served(bind_name: &str) -> Served {
        Served {
            algorithm: "cbc(aes)",
            ty: AlgType::Skcipher,
            bind_name: bind_name.to_string(),
            modes: &[Mode::Cbc],
            key_sizes: vec![KeySize::Aes128],
            request_limits: None,
            entry: None,
            offload: true,
            watch: DeviceWatch::default(),
        }
    }

    #[test]
    fn einval_at_set_key_is_a_full_device_and_other_errors_fail_the_engine() {
        let served = cbc_served("virtio_crypto_aes_cbc");
        let err = |errno| SysError {
            call: "setsockopt(ALG_SET_KEY)",
            errno,
        };
        match set_key_failure(err(Errno::EINVAL), &served) {
            OpenError::Exhausted(Failure::Busy(why)) => {
                assert!(why.contains("no more sessions"), "{why}")
            }
            other => panic!("EINVAL: {other:?}"),
        }
        for errno in [Errno::EIO, Errno::ESHUTDOWN, Errno::ENODEV] {
            assert!(
                matches!(
                    set_key_failure(err(errno), &served),
                    OpenError::Failed(Failure::Engine(_))
                ),
                "{errno}"
            );
        }
    }

    #[test]
    fn padded_input_is_split_across_body_and_tail() {
        let body = [1u8; 32];
        let mut tail = [0u8; BLOCK_LEN];
        tail[..3].copy_from_slice(&[9, 9, 9]);
        Pkcs7::raw_pad(&mut tail, 3);
        let input = SkInput {
            body: &body,
            tail: Some(tail),
        };
        assert_eq!(input.len(), 48);
        let parts = input.slices(16, 32);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].len(), 16);
        assert_eq!(&parts[1][..], &tail[..]);
        assert_eq!(input.slices(32, 16).len(), 1);
        assert_eq!(input.block_before(48), tail);
        assert_eq!(input.block_before(32), [1u8; 16]);
        assert_eq!(tail[3..], [13u8; 13]);
    }

    /// A lane whose one context (key `key`, AES-128-CBC) is an echo socket: each
    /// request's output is its input. No device is watched (no `fstatat`).
    fn echo_lane(keys: &KeyStore) -> (KernelLane, KeyId) {
        let key = keys.add(crate::Key::new(vec![7; 16])).expect("key");
        let served = cbc_served("echo");
        let state = Arc::new(State::new(
            "kernel:echo".into(),
            vec![served],
            "test".into(),
        ));
        let mut lane = KernelLane {
            state,
            contexts: SessionCache::new(MAX_CONTEXTS_PER_LANE),
            aad_scratch: Vec::new(),
            pipe: None,
            splice_min: SPLICE_MIN,
        };
        let ctx = || {
            Ok::<_, OpenError<Failure>>(Context {
                _tfm: afalg::no_tfm(),
                op: afalg::echo_socket(),
                limits: (SKCIPHER_REQUEST_MAX, SKCIPHER_REQUEST_MAX),
            })
        };
        let opened = lane
            .contexts
            .get_or_open((key, "cbc(aes)", KeySize::Aes128), ctx, |_| Ok(()));
        assert!(opened.is_ok());
        (lane, key)
    }

    #[test]
    fn a_lane_sends_each_job_once_and_reads_its_output() {
        let keys = KeyStore::new();
        let (mut lane, key) = echo_lane(&keys);
        let input: Vec<u8> = (0..64).collect();
        let job = Job::new(
            Cipher::AES_128_CBC,
            Direction::Encrypt,
            key,
            [1; 16],
            input.clone(),
        );
        let mut out = JobOutput::default();
        for _ in 0..3 {
            lane.run(&job, &keys, &mut out).expect("run");
            assert_eq!(out.data, input);
        }
    }

    /// User-space cost of one 16-byte AES-128-CBC job through `Lane::run` (the device
    /// check aside), for counting under valgrind (`--ignored`; HETCRYPT_LANE_LOOPS jobs).
    #[test]
    #[ignore = "a cost probe, not a check: run under valgrind by hand"]
    fn lane_cost_probe() {
        let loops: usize = std::env::var("HETCRYPT_LANE_LOOPS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1000);
        let keys = KeyStore::new();
        let (mut lane, key) = echo_lane(&keys);
        let job = Job::new(
            Cipher::AES_128_CBC,
            Direction::Encrypt,
            key,
            [1; 16],
            vec![3; 16],
        );
        let mut out = JobOutput::default();
        for _ in 0..loops {
            lane.run(&job, &keys, &mut out).expect("run");
        }
    }
}
