//! The `devcrypto` engine: the kernel crypto API through cryptodev-linux's `/dev/crypto`.
//!
//! The route of the seeds (OpenSSL ENGINE `cryptodev` over OCF), and the one that stays
//! where a kernel no longer offers off-CPU drivers through AF_ALG. A lane opens its own
//! `/dev/crypto` and keeps one cryptodev session per key and cipher; one `CIOCCRYPT`
//! request is in flight per lane, from the job's input straight into its output (the
//! data never passes through this CPU; cryptodev pins both buffers for the driver).
//!
//! `devcrypto` serves AES-CBC (raw and PKCS#7, the padding added in user space) and
//! AES-CTR, with whatever driver the kernel ranks first for `cbc(aes)` and `ctr(aes)`:
//! cryptodev allocates its transforms by algorithm name and cannot bind a driver by
//! name as AF_ALG can. So `devcrypto:<driver>` opens only where that driver is the one
//! cryptodev's sessions get (checked with `CIOCGSESSINFO`), and otherwise says which
//! driver they get instead. (GCM through `CIOCAUTHCRYPT`, and the asynchronous
//! `CIOCASYNCCRYPT`, which the module offers only when built with `ENABLE_ASYNC`, are
//! not used.)
//!
//! Faults are handled as in the `kernel` engine: before every request the lane checks
//! that the device is still bound (sysfs), and the first failure poisons the engine, so
//! no lane sends the device another request. After a hot-unplug a cryptodev request on
//! the vanished device fails, hangs or oopses exactly as an AF_ALG one does (the same
//! virtio-crypto driver code runs under both), and ending a session or closing
//! `/dev/crypto` then blocks forever, so a poisoned lane's descriptor is parked in a
//! child process, never closed (`testbed/README.md`, "devcrypto after hot-unplug").

mod cryptodev;

use std::sync::Arc;

use block_padding::{Padding, Pkcs7};
use nix::errno::Errno;

use self::cryptodev::{DevCrypto, Op, SessionInfo, CRYPTO_AES_CBC, CRYPTO_AES_CTR};
use crate::cipher::{Cipher, Direction, KeySize, Mode, BLOCK_LEN};
use crate::engine::kernel::afalg::SysError;
use crate::engine::kernel::device::{self, DeviceWatch};
use crate::engine::kernel::proc_crypto::{self, AlgEntry};
use crate::engine::kernel::{kernel_release, proc_entries};
use crate::engine::sessions::{OpenError, SessionCache};
use crate::engine::shared;
use crate::engine::{CipherDriver, Engine, EngineInfo, EngineKind, EngineRef, Lane};
use crate::error::{Error, Result};
use crate::job::{Job, JobOutput};
use crate::key::{KeyId, KeyStore};

pub use self::cryptodev::DEV_CRYPTO;

/// Why `devcrypto` is unavailable where `/dev/crypto` does not exist.
pub const NOT_LOADED: &str = "no /dev/crypto: the cryptodev module is not loaded";

/// The cryptodev ciphers hetcrypt uses: id, the kernel algorithm cryptodev binds for
/// it, and the modes each serves.
const ALGORITHMS: [(u32, &str, &[Mode]); 2] = [
    (CRYPTO_AES_CBC, "cbc(aes)", &[Mode::Cbc, Mode::CbcPkcs7]),
    (CRYPTO_AES_CTR, "ctr(aes)", &[Mode::Ctr]),
];

/// Most bytes of one `CIOCCRYPT` request: larger jobs are cut into such requests, each
/// given the IV/counter the previous one ends with. cryptodev pins the user pages of a
/// request and hands the driver one scatterlist entry per page, and the 6.1
/// virtio-crypto driver passes each entry to `virtqueue_add_sgs` as a list of its own
/// that runs to the end, so n pages become n(n+1)/2 descriptors per direction. QEMU
/// refuses a request of more than 1,024 and then stops the device for good (seen in the
/// testbed at 256 KiB: "virtio: too many write descriptors in indirect table", the
/// request never completes). 64 KiB spans at most 17 pages: 2 x 153 descriptors, the
/// size AF_ALG's 16-page requests have been proven at.
const REQUEST_MAX: usize = 64 * 1024;

/// Sessions a lane keeps (one per key and cipher), least recently used ended first:
/// QEMU's built-in virtio-crypto backend holds at most 256 device sessions in all, two
/// per cryptodev session (one per direction), so 32 let four lanes share it
/// ([`sessions`](super::sessions)).
const MAX_SESSIONS_PER_LANE: usize = 32;

/// A key of zeros: the probe only asks which key lengths a driver takes.
const PROBE_KEY: [u8; 32] = [0; 32];

/// One cryptodev cipher as this engine serves it.
#[derive(Clone, Debug)]
struct Served {
    /// cryptodev's cipher id (`CRYPTO_AES_*`).
    alg: u32,
    /// The kernel algorithm, e.g. `cbc(aes)`.
    algorithm: &'static str,
    modes: &'static [Mode],
    /// Key sizes a session could be created with when probed.
    key_sizes: Vec<KeySize>,
    /// The driver cryptodev's sessions got (`CIOCGSESSINFO`).
    driver: String,
    /// That driver in `/proc/crypto` (absent if not listed).
    entry: Option<AlgEntry>,
    /// Whether it runs on a separate device.
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

impl State {
    /// Whether a device under any served cipher is going (its sysfs link vanished).
    fn device_gone(&self) -> bool {
        self.served.iter().any(|s| s.watch.gone_all().is_some())
    }
}

/// cryptodev-linux's `/dev/crypto` as an engine.
#[derive(Debug)]
pub struct DevcryptoEngine {
    state: Arc<State>,
    lanes: usize,
}

/// What the engine's name asks for: `devcrypto` or `devcrypto:<driver>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DevcryptoName<'a> {
    /// `devcrypto`: whatever driver the kernel ranks first per cipher.
    Any,
    /// `devcrypto:<driver>`: only the ciphers this driver serves.
    Driver(&'a str),
}

impl<'a> DevcryptoName<'a> {
    /// Parses an engine name; `None` if it is not a `devcrypto` name (or names an
    /// empty driver).
    pub fn parse(name: &'a str) -> Option<Self> {
        match name.strip_prefix("devcrypto")? {
            "" => Some(DevcryptoName::Any),
            rest => match rest.strip_prefix(':') {
                Some(driver) if !driver.is_empty() => Some(DevcryptoName::Driver(driver)),
                _ => None,
            },
        }
    }
}

impl DevcryptoEngine {
    /// The engine named `devcrypto`: the kernel's first-ranked driver per cipher.
    pub fn open() -> Result<Self> {
        Self::probe("devcrypto".to_string(), None)
    }

    /// The engine named `devcrypto:<driver>`: only the ciphers whose cryptodev sessions
    /// get this driver (unavailable, saying which they get, where none do).
    pub fn with_driver(driver: &str) -> Result<Self> {
        Self::probe(format!("devcrypto:{driver}"), Some(driver))
    }

    /// Sets the lane count (one `/dev/crypto` descriptor and thread each; at least one).
    pub fn with_lanes(mut self, lanes: usize) -> Self {
        self.lanes = lanes.max(1);
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
        let dev = DevCrypto::open().map_err(|e| unavailable(open_failure(e)))?;
        let entries = proc_entries();
        let mut served = Vec::new();
        let mut missing = Vec::new();
        for (alg, algorithm, modes) in ALGORITHMS {
            match probe_cipher(&dev, alg) {
                Ok((key_sizes, info)) => {
                    let entry = proc_crypto::by_driver(&entries, &info.driver).cloned();
                    let offload = entry.as_ref().map_or(
                        info.flags & cryptodev::SIOP_FLAG_KERNEL_DRIVER_ONLY != 0,
                        |e| e.is_offload(&entries),
                    );
                    let watch = match entry.as_ref().filter(|_| offload) {
                        Some(e) => DeviceWatch::for_module(&e.module),
                        None => DeviceWatch::default(),
                    };
                    served.push(Served {
                        alg,
                        algorithm,
                        modes,
                        key_sizes,
                        driver: info.driver,
                        entry,
                        offload,
                        watch,
                    });
                }
                Err(why) => missing.push(format!("{algorithm}: {why}")),
            }
        }
        if served.is_empty() {
            return Err(unavailable(format!(
                "no AES cipher opens a cryptodev session ({})",
                missing.join("; ")
            )));
        }
        if let Some(driver) = driver {
            let got: Vec<String> = served
                .iter()
                .map(|s| format!("{} -> {}", s.algorithm, s.driver))
                .collect();
            served.retain(|s| s.driver == driver);
            if served.is_empty() {
                let listed = proc_crypto::by_driver(&entries, driver).is_some();
                return Err(unavailable(if listed {
                    format!(
                        "cryptodev binds ciphers by algorithm name, so it reaches driver \
                         '{driver}' only where the kernel ranks it first; its sessions here \
                         get {}",
                        got.join(", ")
                    )
                } else {
                    format!(
                        "no driver named '{driver}' in /proc/crypto (cryptodev's sessions \
                         get {})",
                        got.join(", ")
                    )
                }));
            }
        }
        // The kernel engine's default, for its reasons (two requests in flight through
        // /dev/crypto were 1.3-1.4x one in the soft guest, but cost the policies).
        Ok(DevcryptoEngine {
            state: Arc::new(State::new(name, served, kernel_release())),
            lanes: super::kernel::DEFAULT_LANES,
        })
    }
}

/// Why `/dev/crypto` does not open, in words.
fn open_failure(e: SysError) -> String {
    match e.errno {
        Errno::ENOENT => NOT_LOADED.to_string(),
        Errno::EACCES | Errno::EPERM => {
            format!("cannot open {DEV_CRYPTO}: permission denied (root or the device's group)")
        }
        _ => format!("cannot open {DEV_CRYPTO}: {e}"),
    }
}

/// The key sizes cipher `alg` takes, and the driver its sessions get. A session is
/// created (with a zero key) and ended per key size.
fn probe_cipher(
    dev: &DevCrypto,
    alg: u32,
) -> std::result::Result<(Vec<KeySize>, SessionInfo), String> {
    let mut key_sizes = Vec::new();
    let mut info = None;
    let mut last_error = None;
    for key_size in KeySize::ALL {
        match dev.new_session(alg, &PROBE_KEY[..key_size.key_len()]) {
            Ok(ses) => {
                let got = dev.session_info(ses);
                dev.end_session(ses).map_err(|e| e.to_string())?;
                let got = got.map_err(|e| e.to_string())?;
                if info.is_none() {
                    info = Some(got);
                }
                key_sizes.push(key_size);
            }
            Err(e) => last_error = Some(e),
        }
    }
    match (info, last_error) {
        (Some(info), _) => Ok((key_sizes, info)),
        (None, Some(e)) => Err(e.to_string()),
        (None, None) => Err("no key size accepted".to_string()),
    }
}

impl Engine for DevcryptoEngine {
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
                            "{} ({} via /dev/crypto on Linux {})",
                            s.driver, s.algorithm, self.state.release
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
            kind: EngineKind::Devcrypto,
            lanes: self.lanes,
            ciphers,
        }
    }

    fn kind(&self) -> EngineKind {
        EngineKind::Devcrypto
    }

    fn lanes(&self) -> usize {
        self.lanes
    }

    fn supports(&self, cipher: Cipher, _direction: Direction) -> bool {
        self.state.served(cipher).is_some()
    }

    fn open_lane(&self, _index: usize) -> Result<Box<dyn Lane>> {
        self.state.check_poison()?;
        let dev = DevCrypto::open().map_err(|e| Error::EngineUnavailable {
            engine: self.state.name.clone(),
            reason: open_failure(e),
        })?;
        Ok(Box::new(DevcryptoLane {
            state: Arc::clone(&self.state),
            dev: Some(dev),
            sessions: SessionCache::new(MAX_SESSIONS_PER_LANE),
        }))
    }

    /// False when every cipher is served by an offload device (the lane thread mostly
    /// sleeps in the ioctl); true when any is software on the host CPU.
    fn uses_host_cpu(&self) -> bool {
        !self.state.served.iter().all(|s| s.offload)
    }
}

/// A cryptodev session of one key is cached by (key, cipher id, key size).
type SessionKey = (KeyId, u32, KeySize);

/// One `devcrypto` lane: its own `/dev/crypto`, cached sessions, one request in flight.
struct DevcryptoLane {
    state: Arc<State>,
    /// Always `Some` until dropped (taken to be parked).
    dev: Option<DevCrypto>,
    /// Session ids, at most [`MAX_SESSIONS_PER_LANE`].
    sessions: SessionCache<SessionKey, u32>,
}

/// How a failed request is classified.
#[derive(Debug)]
enum Failure {
    /// The job's own fault (wrong key length, bad padding).
    Job(Error),
    /// The engine's: poison it.
    Engine(String),
    /// The device holds no more sessions: the job fails, the engine stays.
    Busy(String),
}

impl DevcryptoLane {
    fn dev(&self) -> &DevCrypto {
        self.dev
            .as_ref()
            .expect("the descriptor is only taken on drop")
    }

    /// The session for this job, created (and keyed) on first use.
    fn session(
        &mut self,
        job: &Job,
        served: &Served,
        keys: &KeyStore,
    ) -> std::result::Result<u32, Failure> {
        let cache_key = (job.key, served.alg, job.cipher.key_size);
        let cipher = job.cipher;
        let dev = self
            .dev
            .as_ref()
            .expect("the descriptor is only taken on drop");
        let open = || {
            // Creating a session is a device request too: look before it as well.
            if let Some(why) = served.watch.gone_all() {
                return Err(OpenError::Failed(Failure::Engine(why)));
            }
            keys.with_key(job.key, |key| {
                if key.len() != cipher.key_len() {
                    return Err(OpenError::Failed(Failure::Job(Error::KeyLength {
                        cipher,
                        expected: cipher.key_len(),
                        got: key.len(),
                    })));
                }
                dev.new_session(served.alg, key.as_bytes())
                    .map_err(|e| session_failure(e, served))
            })
            .map_err(|e| OpenError::Failed(Failure::Job(e)))?
        };
        let close = |id: u32| {
            dev.end_session(id)
                .map_err(|e| Failure::Engine(format!("{}: {e}", served.algorithm)))
        };
        self.sessions
            .get_or_open(cache_key, open, close)
            .map(|id| *id)
    }
}

/// How a `CIOCGSESSION` with a key of the right length failed. cryptodev reports
/// every refused `setkey` as `EINVAL`, and the 6.1 virtio-crypto driver refuses one
/// when the device answers a session request with an error status, which QEMU's
/// built-in backend does when it holds its 256 sessions (seen in the testbed: the
/// 129th key fails with `EINVAL`, the kernel logging "virtio_crypto: Create session
/// failed status: 1"). So `EINVAL` on a device still bound means "no more sessions",
/// worth a retry and no quarantine; on a device whose link vanished, or any other
/// errno, the engine has failed.
fn session_failure(e: SysError, served: &Served) -> OpenError<Failure> {
    if let Some(why) = served.watch.gone_all() {
        return OpenError::Failed(Failure::Engine(why));
    }
    let what = format!("{}: {e}", served.algorithm);
    if e.errno == Errno::EINVAL {
        OpenError::Exhausted(Failure::Busy(format!(
            "{what}: the device holds no more sessions"
        )))
    } else {
        OpenError::Failed(Failure::Engine(what))
    }
}

impl Lane for DevcryptoLane {
    fn run(&mut self, job: &Job, keys: &KeyStore, out: &mut JobOutput) -> Result<()> {
        job.validate()?;
        // A poisoned engine never touches the device again.
        self.state.check_poison()?;
        let state = Arc::clone(&self.state);
        let served = state.served(job.cipher).ok_or_else(|| Error::Unsupported {
            cipher: job.cipher,
            engine: state.name.clone(),
        })?;
        out.data.clear();
        out.tag = None;
        let result = self
            .session(job, served, keys)
            .and_then(|ses| run_cipher(self.dev(), ses, job, out, &served.watch));
        match result {
            Ok(()) => Ok(()),
            Err(Failure::Job(e)) => {
                out.data.clear();
                Err(e)
            }
            Err(Failure::Busy(reason)) => {
                out.data.clear();
                Err(Error::EngineBusy {
                    engine: state.name.clone(),
                    reason: format!("{reason} (driver {})", served.driver),
                })
            }
            Err(Failure::Engine(what)) => {
                out.data.clear();
                Err(state.poison(format!(
                    "{what} (driver {}, Linux {}); engine stopped, its jobs go elsewhere",
                    served.driver, state.release
                )))
            }
        }
    }

    fn forget_keys(&mut self, ids: &[KeyId]) -> bool {
        // A poisoned engine's (or vanished device's) sessions are never ended: ending
        // one is a request to the device. They go with the parked descriptor.
        if self.state.is_poisoned() || self.state.device_gone() {
            return true;
        }
        for id in self.sessions.take_unless(|(key, _, _)| !ids.contains(key)) {
            // A failure to end a session leaves it to the descriptor's close.
            let _ = self.dev().end_session(id);
        }
        true
    }
}

impl Drop for DevcryptoLane {
    /// Closing `/dev/crypto` ends its sessions, each a request to the device: once the
    /// engine failed or its device is going, the descriptor is parked, never closed
    /// (see [`device::park`]).
    fn drop(&mut self) {
        if let Some(dev) = self.dev.take() {
            if !self.sessions.is_empty() && (self.state.is_poisoned() || self.state.device_gone()) {
                device::park(vec![dev.into_fd()]);
            }
        }
    }
}

/// CBC or CTR in requests of at most [`REQUEST_MAX`] bytes, each given the IV that
/// continues the previous one, so the result equals one-shot processing whatever the
/// driver does with the IV. The requests go from the job's input straight into the
/// output buffer, so this CPU never touches the data (in an emulated guest, copying or
/// zeroing 16 KiB costs as much as a device request); only PKCS#7 encryption, whose
/// last block is the padded tail, copies the input into the output and runs in place.
fn run_cipher(
    dev: &DevCrypto,
    ses: u32,
    job: &Job,
    out: &mut JobOutput,
    watch: &DeviceWatch,
) -> std::result::Result<(), Failure> {
    let mode = job.cipher.mode;
    let op = match job.direction {
        Direction::Encrypt => Op::Encrypt,
        Direction::Decrypt => Op::Decrypt,
    };
    let padded = mode == Mode::CbcPkcs7 && job.direction == Direction::Encrypt;
    if padded {
        let full = job.input.len() - job.input.len() % BLOCK_LEN;
        let mut last = [0u8; BLOCK_LEN];
        let rest = &job.input[full..];
        last[..rest.len()].copy_from_slice(rest);
        Pkcs7::raw_pad(&mut last, rest.len());
        out.data.extend_from_slice(&job.input[..full]);
        out.data.extend_from_slice(&last);
    } else {
        out.data.reserve(job.input.len());
    }
    let total = if padded {
        out.data.len()
    } else {
        job.input.len()
    };
    let mut iv: [u8; BLOCK_LEN] = job
        .iv()
        .try_into()
        .expect("validate() checked a 16-byte IV");
    let mut pos = 0;
    while pos < total {
        let n = REQUEST_MAX.min(total - pos);
        if let Some(why) = watch.gone() {
            return Err(Failure::Engine(why));
        }
        if padded {
            dev.crypt_in_place(ses, op, &iv, &mut out.data[pos..pos + n])
                .map_err(|e| Failure::Engine(e.to_string()))?;
        } else {
            debug_assert_eq!(out.data.len(), pos);
            let dst = &mut out.data.spare_capacity_mut()[..n];
            dev.crypt(ses, op, &iv, &job.input[pos..pos + n], dst)
                .map_err(|e| Failure::Engine(e.to_string()))?;
            // SAFETY: the capacity was reserved for `total` bytes above, and the
            // request just succeeded, so the driver wrote all `n` bytes after the `pos`
            // initialised ones.
            unsafe { out.data.set_len(pos + n) };
        }
        pos += n;
        if pos < total {
            iv = match (mode, job.direction) {
                (Mode::Ctr, _) => {
                    let blocks = (n / BLOCK_LEN) as u128;
                    u128::from_be_bytes(iv).wrapping_add(blocks).to_be_bytes()
                }
                (_, Direction::Encrypt) => out.data[pos - BLOCK_LEN..pos]
                    .try_into()
                    .expect("a 16-byte range"),
                // CBC decryption chains on the last input block (never in place).
                (_, Direction::Decrypt) => job.input[pos - BLOCK_LEN..pos]
                    .try_into()
                    .expect("a 16-byte range"),
            };
        }
    }
    if mode == Mode::CbcPkcs7 && job.direction == Direction::Decrypt {
        let last = total - BLOCK_LEN; // validate(): at least one block
        let kept = Pkcs7::raw_unpad(&out.data[last..])
            .map_err(|_| Failure::Job(Error::AuthenticationFailed))?
            .len();
        out.data.truncate(last + kept);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_like_kernel_names() {
        assert_eq!(DevcryptoName::parse("devcrypto"), Some(DevcryptoName::Any));
        assert_eq!(
            DevcryptoName::parse("devcrypto:virtio_crypto_aes_cbc"),
            Some(DevcryptoName::Driver("virtio_crypto_aes_cbc"))
        );
        for bad in [
            "devcrypto:",
            "devcryptox",
            "dev",
            "kernel",
            "devcrypto;x",
            "",
        ] {
            assert_eq!(DevcryptoName::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_missing_device_node_reads_as_the_module_not_loaded() {
        let e = SysError {
            call: "open(/dev/crypto)",
            errno: Errno::ENOENT,
        };
        assert_eq!(open_failure(e), NOT_LOADED);
        let e = SysError {
            call: "open(/dev/crypto)",
            errno: Errno::EACCES,
        };
        assert!(open_failure(e).contains("permission denied"));
    }

    #[test]
    fn einval_at_session_creation_is_a_full_device_and_other_errors_fail_the_engine() {
        let served = Served {
            alg: CRYPTO_AES_CBC,
            algorithm: "cbc(aes)",
            modes: &[Mode::Cbc],
            key_sizes: vec![KeySize::Aes128],
            driver: "virtio_crypto_aes_cbc".to_string(),
            entry: None,
            offload: true,
            watch: DeviceWatch::default(),
        };
        let err = |errno| SysError {
            call: "CIOCGSESSION",
            errno,
        };
        match session_failure(err(Errno::EINVAL), &served) {
            OpenError::Exhausted(Failure::Busy(why)) => {
                assert!(why.contains("no more sessions"), "{why}")
            }
            other => panic!("EINVAL: {other:?}"),
        }
        for errno in [Errno::EIO, Errno::ESHUTDOWN, Errno::ENODEV] {
            assert!(
                matches!(
                    session_failure(err(errno), &served),
                    OpenError::Failed(Failure::Engine(_))
                ),
                "{errno}"
            );
        }
    }

    #[test]
    fn request_size_is_whole_blocks() {
        assert_eq!(REQUEST_MAX % BLOCK_LEN, 0);
    }
}
