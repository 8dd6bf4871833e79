//! Shared by the integration tests: the engines under test, cases with their expected
//! results, and a runner that checks every case on every engine by every path.
// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};

use hetcrypt::engine::cpu::CpuEngine;
use hetcrypt::engine::devcrypto::DevcryptoEngine;
use hetcrypt::engine::kernel::KernelEngine;
use hetcrypt::engine::{EngineRef, Lane};
use hetcrypt::policy::{Only, Policy};
use hetcrypt::{
    BatchResult, Cipher, Direction, Dispatcher, Error, Job, JobOutput, Key, KeyId, KeyStore,
};

/// Set (to anything) when the tests run inside the QEMU testbed guest, which has a
/// virtio-crypto device: there a kernel engine that does not open is a failure.
pub const TESTBED_ENV: &str = "HETCRYPT_TESTBED";

/// The virtio-crypto driver that serves `cbc(aes)` in the guest (DESIGN.md section 3).
pub const VIRTIO_DRIVER: &str = "virtio_crypto_aes_cbc";

/// Lanes of the second `cpu` engine: more than the host's 2 cores and the guest's 1, so
/// its lanes contend for the queue and run concurrently with the 1-lane `cpu` engine.
pub const MANY_LANES: usize = 4;

/// Seed for the random tests; unset, a fresh one is drawn and printed.
pub const SEED_ENV: &str = "HETCRYPT_TEST_SEED";

/// Multiplies the random tests' job counts (a float; default 1, or [`TESTBED_SCALE`] in
/// the testbed).
pub const SCALE_ENV: &str = "HETCRYPT_TEST_SCALE";

/// Names the one device engine to test beside the `cpu` engines (`devcrypto`,
/// `kernel`, `devcrypto:<driver>`, `kernel:<driver>`), instead of all four: the
/// testbed's `soft` guest runs the suites once per device engine so that the engines'
/// sessions (two per key on virtio-crypto) stay within the 256 its device holds, and
/// each forced engine must open and be offered every suite's cases, or the suite fails.
pub const DEVICE_ENGINE_ENV: &str = "HETCRYPT_TEST_DEVICE_ENGINE";

/// The device engine [`DEVICE_ENGINE_ENV`] forces, if any.
pub fn forced_device_engine() -> Option<String> {
    std::env::var(DEVICE_ENGINE_ENV)
        .ok()
        .filter(|s| !s.trim().is_empty())
}

/// Default scale inside the testbed: the guest is emulated (no KVM), some 10-50x slower.
pub const TESTBED_SCALE: f64 = 0.125;

/// Whether we run inside the testbed guest.
pub fn in_testbed() -> bool {
    std::env::var_os(TESTBED_ENV).is_some()
}

/// Whether the testbed guest runs with its `soft` profile (no AES-NI in the guest CPU,
/// so the kernel ranks the virtio-crypto driver first for `cbc(aes)`).
pub fn soft_profile() -> bool {
    std::env::var("HETCRYPT_TESTBED_PROFILE").is_ok_and(|p| p == "soft")
}

/// One-lane `cpu` engines with each implementation of CTR and CBC decryption forced
/// (the `aes` crate, EVP), so that the known-answer and differential suites cover
/// both whichever the engine measures faster on this CPU (issue 23).
pub fn cpu_implementations() -> Vec<EngineRef> {
    use hetcrypt::engine::cpu::BlockParallel;
    [
        ("cpu:aes-crate", BlockParallel::On),
        ("cpu:openssl-evp", BlockParallel::Off),
    ]
    .into_iter()
    .map(|(name, parallel)| {
        CpuEngine::with_lanes(1)
            .block_parallel(parallel)
            .named(name)
            .into_engine()
    })
    .collect()
}

/// Names of the two `cpu` engines of [`engines`]: they open everywhere, so every suite
/// over [`engines`] must have run its cases on both.
pub fn cpu_engine_names() -> [String; 2] {
    ["cpu".to_string(), format!("cpu-{MANY_LANES}lanes")]
}

/// Writes `line` where the test runner shows it even for a passing test: libtest
/// captures `eprintln!`, not writes to the stderr handle. For what a reader of a test
/// run must see: engines skipped, and which engines a suite covered.
pub fn say(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Every engine to test: `cpu` with one lane and with [`MANY_LANES`], then the kernel
/// and `/dev/crypto` engines that open here. An engine that does not open is reported
/// as `SKIP` with its reason, past the runner's capture ([`say`]); in the testbed it
/// fails the test instead, except `devcrypto:virtio_crypto_aes_cbc` in the `aesni`
/// profile: cryptodev binds by algorithm name, and there the kernel ranks its AES-NI
/// driver first. With [`DEVICE_ENGINE_ENV`] set, the `cpu` engines and that one
/// device engine, which must open.
pub fn engines() -> Vec<EngineRef> {
    let forced = forced_device_engine();
    let [cpu, cpu_many] = cpu_engine_names();
    let mut list = vec![
        CpuEngine::with_lanes(1).named(cpu).into_engine(),
        CpuEngine::with_lanes(MANY_LANES)
            .named(cpu_many)
            .into_engine(),
    ];
    let driver_name = format!("kernel:{VIRTIO_DRIVER}");
    for (name, opened) in [
        ("kernel", KernelEngine::open()),
        (
            driver_name.as_str(),
            KernelEngine::with_driver(VIRTIO_DRIVER),
        ),
    ] {
        if forced.as_deref().is_some_and(|f| f != name) {
            continue;
        }
        match opened {
            Ok(engine) => list.push(engine.into_engine()),
            Err(e) => unavailable(name, e, false),
        }
    }
    let devcrypto_driver = format!("devcrypto:{VIRTIO_DRIVER}");
    for (name, opened, may_miss) in [
        ("devcrypto", DevcryptoEngine::open(), false),
        (
            devcrypto_driver.as_str(),
            DevcryptoEngine::with_driver(VIRTIO_DRIVER),
            !soft_profile(),
        ),
    ] {
        if forced.as_deref().is_some_and(|f| f != name) {
            continue;
        }
        match opened {
            Ok(engine) => list.push(engine.into_engine()),
            Err(e) => unavailable(name, e, may_miss && forced.is_none()),
        }
    }
    if let Some(name) = &forced {
        assert!(
            list.iter().any(|e| e.name() == name) || !in_testbed(),
            "{DEVICE_ENGINE_ENV}={name} names no device engine (kernel, kernel:{VIRTIO_DRIVER}, \
             devcrypto, devcrypto:{VIRTIO_DRIVER})"
        );
        say(&format!(
            "{DEVICE_ENGINE_ENV}={name}: the cpu engines and {name} only"
        ));
    }
    list
}

/// Checks why engine `name` did not open: [`Error::EngineUnavailable`] with a reason;
/// in the testbed that fails unless `may_miss`.
fn unavailable(name: &str, e: Error, may_miss: bool) {
    match e {
        Error::EngineUnavailable { engine, reason } => {
            assert_eq!(engine, name, "the error names the engine asked for");
            assert!(
                !reason.trim().is_empty(),
                "{name}: unavailable without a reason"
            );
            assert!(
                may_miss || !in_testbed(),
                "{name} must open in the testbed ({TESTBED_ENV} is set): {reason}"
            );
            skipped(name, reason.trim());
        }
        other => panic!("{name}: opening failed with {other:?}, not EngineUnavailable"),
    }
}

/// Engines of [`engines`] that did not open in this test binary, in the order met.
static SKIPPED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Notes that engine `name` is not tested here: a `SKIP` line with the reason the first
/// time ([`say`]), and the name for [`Coverage::report`].
fn skipped(name: &str, reason: &str) {
    let mut list = SKIPPED.lock().unwrap_or_else(|e| e.into_inner());
    if !list.iter().any(|n| n == name) {
        say(&format!(
            "SKIP engine {name}: unavailable here, not tested: {reason}"
        ));
        list.push(name.to_string());
    }
}

/// The seed of this test binary's random tests, printed at every call so that each
/// test's captured output shows it.
pub fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    let seed = *SEED.get_or_init(|| {
        let seed = match std::env::var(SEED_ENV) {
            Ok(s) => s
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{SEED_ENV}={s} is not a u64")),
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        };
        seed
    });
    eprintln!("random tests: seed {seed} (reproduce with {SEED_ENV}={seed})");
    seed
}

/// `n` scaled by [`SCALE_ENV`] (or [`TESTBED_SCALE`] in the testbed), at least 1.
pub fn scaled(n: usize) -> usize {
    let scale = match std::env::var(SCALE_ENV) {
        Ok(s) => s
            .trim()
            .parse::<f64>()
            .unwrap_or_else(|_| panic!("{SCALE_ENV}={s} is not a number")),
        Err(_) if in_testbed() => TESTBED_SCALE,
        Err(_) => 1.0,
    };
    ((n as f64 * scale).round() as usize).max(1)
}

/// Decodes hex from a vector file (upper or lower case).
pub fn hex(s: &str) -> Vec<u8> {
    data_encoding::HEXLOWER_PERMISSIVE
        .decode(s.trim().as_bytes())
        .unwrap_or_else(|e| panic!("bad hex in a vector: {e}: {s}"))
}

/// The error a case expects, with the fields every engine must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fail {
    /// [`Error::AuthenticationFailed`].
    Auth,
    /// [`Error::IvLength`] with this IV length.
    IvLength(usize),
    /// [`Error::InputLength`] with this input length.
    InputLength(usize),
    /// [`Error::MissingTag`].
    MissingTag,
    /// [`Error::KeyLength`]: the cipher's key length, and the key's.
    KeyLength { expected: usize, got: usize },
    /// [`Error::UnknownKey`].
    UnknownKey,
}

impl Fail {
    /// Whether `e` is this failure.
    pub fn matches(self, e: &Error, cipher: Cipher) -> bool {
        match (self, e) {
            (Fail::Auth, Error::AuthenticationFailed) => true,
            (
                Fail::IvLength(len),
                Error::IvLength {
                    cipher: c,
                    expected,
                    got,
                },
            ) => *c == cipher && *expected == cipher.iv_len() && *got == len,
            (
                Fail::InputLength(len),
                Error::InputLength {
                    cipher: c,
                    len: got,
                },
            ) => *c == cipher && *got == len,
            (Fail::MissingTag, Error::MissingTag { cipher: c }) => *c == cipher,
            (
                Fail::KeyLength { expected, got },
                Error::KeyLength {
                    cipher: c,
                    expected: e,
                    got: g,
                },
            ) => *c == cipher && *e == expected && *g == got,
            (Fail::UnknownKey, Error::UnknownKey(_)) => true,
            _ => false,
        }
    }
}

/// What a case must produce.
#[derive(Clone, Debug)]
pub enum Expect {
    /// Exactly this output and tag.
    Output(JobOutput),
    /// This error.
    Fail(Fail),
}

/// The key of a case, registered with each engine's key store before the case runs.
#[derive(Clone, Debug)]
pub enum CaseKey {
    /// These bytes.
    Bytes(Vec<u8>),
    /// An id that is never registered.
    Unregistered,
}

/// An id no key store hands out in these tests (stores count up from 0).
pub const UNREGISTERED_KEY: KeyId = KeyId(u32::MAX);

/// One job with its key and its expected result.
#[derive(Clone, Debug)]
pub struct Case {
    /// Where the case comes from (vector id, "tamper tag", seed and index...).
    pub name: String,
    /// Its key.
    pub key: CaseKey,
    /// The job (its key id is replaced by the one each store gives `key`).
    pub job: Job,
    /// What it must produce.
    pub expect: Expect,
}

impl Case {
    /// A case whose job must produce `data` (and `tag`).
    pub fn output(
        name: impl Into<String>,
        key: &[u8],
        job: Job,
        data: Vec<u8>,
        tag: Option<hetcrypt::Tag>,
    ) -> Self {
        Case {
            name: name.into(),
            key: CaseKey::Bytes(key.to_vec()),
            job,
            expect: Expect::Output(JobOutput { data, tag }),
        }
    }

    /// A case whose job must fail with `fail`.
    pub fn failure(name: impl Into<String>, key: &[u8], job: Job, fail: Fail) -> Self {
        Case {
            name: name.into(),
            key: CaseKey::Bytes(key.to_vec()),
            job,
            expect: Expect::Fail(fail),
        }
    }
}

/// Builds a job with any IV length, for cases (the IV is at most 16 bytes here).
pub fn job(
    cipher: Cipher,
    direction: Direction,
    iv: &[u8],
    aad: &[u8],
    input: &[u8],
    tag: Option<hetcrypt::Tag>,
) -> Job {
    let job = Job::with_iv(cipher, direction, KeyId(0), iv, input.to_vec())
        .expect("test IVs are at most 16 bytes")
        .aad(aad.to_vec());
    match tag {
        Some(tag) => job.tag(tag),
        None => job,
    }
}

/// Describes how `got` differs from `want`, or `None` if it does not.
pub fn mismatch(case: &Case, got: &Result<JobOutput, Error>) -> Option<String> {
    match (&case.expect, got) {
        (Expect::Output(want), Ok(out)) => {
            if out.data == want.data && out.tag == want.tag {
                return None;
            }
            let mut why = String::new();
            if out.data.len() != want.data.len() {
                let _ = write!(
                    why,
                    "output is {} bytes, want {}",
                    out.data.len(),
                    want.data.len()
                );
            } else if let Some(at) = out.data.iter().zip(&want.data).position(|(a, b)| a != b) {
                let _ = write!(why, "output differs from byte {at} of {}", want.data.len());
            }
            if out.tag != want.tag {
                let _ = write!(
                    why,
                    "{}tag {:02x?}, want {:02x?}",
                    if why.is_empty() { "" } else { "; " },
                    out.tag,
                    want.tag
                );
            }
            Some(why)
        }
        (Expect::Output(_), Err(e)) => Some(format!("failed with {e:?}, want an output")),
        (Expect::Fail(fail), Ok(out)) => Some(format!(
            "succeeded ({} bytes), want {fail:?}",
            out.data.len()
        )),
        (Expect::Fail(fail), Err(e)) => {
            (!fail.matches(e, case.job.cipher)).then(|| format!("failed with {e:?}, want {fail:?}"))
        }
    }
}

/// Mismatches collected over a run; reported together so one failure does not hide
/// the others.
#[derive(Default)]
pub struct Failures(Vec<String>);

impl Failures {
    /// Records a mismatch of `case` on `path` (e.g. "cpu lane").
    pub fn check(&mut self, path: &str, case: &Case, got: &Result<JobOutput, Error>) {
        if let Some(why) = mismatch(case, got) {
            self.0.push(format!(
                "{path}: {} ({} {}, {} bytes): {why}",
                case.name,
                case.job.cipher,
                case.job.direction,
                case.job.len()
            ));
        }
    }

    /// Records a failure that is not about one case.
    pub fn push(&mut self, what: String) {
        self.0.push(what);
    }

    /// Panics with every failure recorded, if any.
    pub fn assert_none(self, suite: &str) {
        /// Most failures printed: enough to see a pattern, not a wall of text.
        const SHOWN: usize = 40;
        if self.0.is_empty() {
            return;
        }
        let mut msg = format!("{suite}: {} failure(s):\n", self.0.len());
        for f in self.0.iter().take(SHOWN) {
            msg.push_str("  ");
            msg.push_str(f);
            msg.push('\n');
        }
        if self.0.len() > SHOWN {
            let _ = writeln!(msg, "  ... and {} more", self.0.len() - SHOWN);
        }
        panic!("{msg}");
    }
}

/// Registers every case's key with `dispatcher` (once per distinct key) and returns the
/// jobs with their key ids bound.
pub fn bind(dispatcher: &Dispatcher, cases: &[&Case]) -> Vec<Job> {
    let mut ids: HashMap<&[u8], KeyId> = HashMap::new();
    cases
        .iter()
        .map(|case| {
            let id = match &case.key {
                CaseKey::Bytes(bytes) => *ids.entry(bytes.as_slice()).or_insert_with(|| {
                    dispatcher
                        .add_key(Key::new(bytes.clone()))
                        .expect("case keys are 16, 24 or 32 bytes")
                }),
                CaseKey::Unregistered => UNREGISTERED_KEY,
            };
            let mut job = case.job.clone();
            job.key = id;
            job
        })
        .collect()
}

/// Checks a batch's bookkeeping: every job done exactly once, by engines that exist,
/// except those naming an unregistered key (the dispatcher fails them up front).
pub fn check_report(failures: &mut Failures, path: &str, batch: &BatchResult, jobs: usize) {
    let r = &batch.report;
    let up_front = batch
        .outputs
        .iter()
        .filter(|o| matches!(o, Err(Error::UnknownKey(_))))
        .count();
    let done: usize = r.engines.iter().map(|e| e.jobs).sum::<usize>() + up_front;
    if done != jobs || r.jobs != jobs || batch.outputs.len() != jobs {
        failures.push(format!(
            "{path}: {jobs} jobs given, report says {} in the batch, {done} done by engines, {} outputs",
            r.jobs,
            batch.outputs.len()
        ));
    }
    if r.redispatched != 0 {
        failures.push(format!(
            "{path}: {} jobs re-dispatched with no engine failing",
            r.redispatched
        ));
    }
    for e in &r.engines {
        if let Some(why) = &e.failed {
            failures.push(format!("{path}: engine {} quarantined: {why}", e.name));
        }
    }
}

/// Runs a batch, turning a panic inside the dispatcher (e.g. one of its debug
/// assertions) into an error, so the other checks still run and report.
pub fn run_batch(
    dispatcher: &Dispatcher,
    jobs: &[Job],
    policy: &dyn Policy,
) -> Result<BatchResult, String> {
    let run = std::panic::AssertUnwindSafe(|| dispatcher.run(jobs, policy));
    match std::panic::catch_unwind(run) {
        Ok(Ok(batch)) => Ok(batch),
        Ok(Err(e)) => Err(e.to_string()),
        Err(panic) => Err(format!(
            "the dispatcher panicked: {}",
            panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)")
        )),
    }
}

/// One engine under test with an opened lane and a single-engine dispatcher.
pub struct Rig {
    engine: EngineRef,
    lane: Box<dyn Lane>,
    dispatcher: Dispatcher,
}

impl Rig {
    /// Opens lane 0 of `engine` and a dispatcher over it alone.
    pub fn new(engine: EngineRef) -> Self {
        let lane = engine
            .open_lane(0)
            .unwrap_or_else(|e| panic!("{}: lane 0 does not open: {e}", engine.name()));
        let dispatcher = Dispatcher::new(vec![engine.clone()]).expect("one engine is a valid set");
        Rig {
            engine,
            lane,
            dispatcher,
        }
    }

    /// The engine's name.
    pub fn name(&self) -> &str {
        self.engine.name()
    }

    /// Runs every case this engine supports by three paths — one `Lane::run` per job,
    /// `Lane::run_batch` in chunks of the engine's `max_batch`, and a `Dispatcher` batch
    /// under `only:<engine>` (in the given order and grouped by cipher and direction, so
    /// multi-buffer lanes get runs of like jobs) — and records every mismatch. Returns
    /// how many cases ran.
    pub fn check(&mut self, cases: &[Case], failures: &mut Failures) -> usize {
        let supported: Vec<&Case> = cases
            .iter()
            .filter(|c| self.engine.supports(c.job.cipher, c.job.direction))
            .collect();
        if supported.is_empty() {
            return 0;
        }
        let name = self.name().to_string();
        let jobs = bind(&self.dispatcher, &supported);
        let keys = self.dispatcher.keys();

        for (case, job) in supported.iter().zip(&jobs) {
            let mut out = JobOutput::default();
            let got = self.lane.run(job, keys, &mut out).map(|()| out);
            failures.check(&format!("{name} Lane::run"), case, &got);
        }

        let mut grouped: Vec<usize> = (0..supported.len()).collect();
        grouped.sort_by_key(|&i| {
            (
                jobs[i].direction,
                jobs[i].cipher.mode,
                jobs[i].cipher.key_size,
            )
        });
        let max = self.engine.max_batch().max(1);
        for chunk in grouped.chunks(max) {
            let refs: Vec<&Job> = chunk.iter().map(|&i| &jobs[i]).collect();
            let mut outs = vec![JobOutput::default(); chunk.len()];
            let mut results: Vec<hetcrypt::Result<()>> = chunk.iter().map(|_| Ok(())).collect();
            self.lane.run_batch(&refs, keys, &mut outs, &mut results);
            for ((&i, out), result) in chunk.iter().zip(outs).zip(results) {
                failures.check(
                    &format!("{name} Lane::run_batch(max {max})"),
                    supported[i],
                    &result.map(|()| out),
                );
            }
        }

        let policy = Only::new(name.clone());
        for (order, indices) in [
            ("given order", (0..supported.len()).collect::<Vec<_>>()),
            ("grouped", grouped),
        ] {
            let batch_jobs: Vec<Job> = indices.iter().map(|&i| jobs[i].clone()).collect();
            let path = format!("{name} Dispatcher {} ({order})", policy.name());
            match run_batch(&self.dispatcher, &batch_jobs, &policy) {
                Ok(batch) => {
                    check_report(failures, &path, &batch, batch_jobs.len());
                    for (&i, got) in indices.iter().zip(&batch.outputs) {
                        failures.check(&path, supported[i], got);
                    }
                }
                Err(e) => failures.push(format!("{path}: the batch did not run: {e}")),
            }
        }
        supported.len()
    }
}

/// Which engines a suite ran its cases on, and how many each: reported past the
/// runner's capture, so a passing run says what it covered (outside the testbed, often
/// the `cpu` engines alone).
#[derive(Default)]
pub struct Coverage(Vec<(String, usize)>);

impl Coverage {
    /// Records that `engine` ran `cases` cases.
    pub fn ran(&mut self, engine: &str, cases: usize) {
        match self.0.iter_mut().find(|(name, _)| name == engine) {
            Some((_, n)) => *n += cases,
            None => self.0.push((engine.to_string(), cases)),
        }
    }

    /// Says which engines `suite` covered and which did not open here, and records a
    /// failure for each `cpu` engine ([`cpu_engine_names`]) that ran no case: those
    /// open everywhere, so a suite that did not reach them checked nothing.
    pub fn report(&self, suite: &str, failures: &mut Failures) {
        let covered: Vec<String> = self
            .0
            .iter()
            .map(|(name, n)| format!("{name} ({n})"))
            .collect();
        let skipped = SKIPPED.lock().unwrap_or_else(|e| e.into_inner()).join(", ");
        say(&format!(
            "{suite}: engines covered (jobs run): {}; not here: {}",
            covered.join(", "),
            if skipped.is_empty() { "none" } else { &skipped }
        ));
        for cpu in cpu_engine_names() {
            if !self.0.iter().any(|(name, n)| *name == cpu && *n > 0) {
                failures.push(format!("{suite}: engine {cpu} ran no case"));
            }
        }
        // A forced device engine must have been offered the cases (it may serve none
        // of a suite's ciphers: `devcrypto` has no GCM).
        if let Some(engine) = forced_device_engine().filter(|_| in_testbed()) {
            if !self.0.iter().any(|(name, _)| *name == engine) {
                failures.push(format!("{suite}: forced engine {engine} was not tested"));
            }
        }
    }
}

/// Checks `cases` on every engine by every path; prints what ran where and panics with
/// every mismatch found, or if a `cpu` engine did not run every case.
pub fn check_everywhere(suite: &str, cases: &[Case]) {
    let mut failures = Failures::default();
    let mut coverage = Coverage::default();
    for engine in engines().into_iter().chain(cpu_implementations()) {
        let mut rig = Rig::new(engine);
        let ran = rig.check(cases, &mut failures);
        eprintln!(
            "{suite}: {}: {ran} of {} cases ({} with a cipher it does not support)",
            rig.name(),
            cases.len(),
            cases.len() - ran
        );
        if cpu_engine_names().iter().any(|cpu| cpu == rig.name()) && ran != cases.len() {
            failures.push(format!(
                "{suite}: {} skipped {} cases; it supports every cipher",
                rig.name(),
                cases.len() - ran
            ));
        }
        coverage.ran(rig.name(), ran);
    }
    coverage.report(suite, &mut failures);
    failures.assert_none(suite);
}

/// `n` jobs of 16 bytes (AES-128-CBC encryption) under a fresh key.
pub fn tiny_jobs(d: &Dispatcher, n: usize) -> Vec<Job> {
    let key = d.add_key(Key::new(vec![7; 16])).unwrap();
    (0..n)
        .map(|i| {
            Job::new(
                Cipher::AES_128_CBC,
                Direction::Encrypt,
                key,
                [i as u8; 16],
                vec![i as u8; 16],
            )
        })
        .collect()
}

/// Lanes of [`KEYS_PER_LANE`] keys that fill the testbed's device: QEMU's built-in
/// virtio-crypto backend holds 256 sessions, two per keyed session (an AF_ALG transform
/// or a `/dev/crypto` session).
pub const LANES_TO_FILL: usize = 4;

/// Keys each filling lane opens: as many as a lane keeps (the engines' bound).
pub const KEYS_PER_LANE: u8 = 32;

/// Fills the testbed's device through [`LANES_TO_FILL`] lanes of `engine` (a device
/// engine bound to it) and checks what a full device does: every filling lane's jobs
/// succeed (where the device fills before a lane's bound, the lane ends one of its own
/// sessions and retries); a further lane, with no session of its own to end, gets
/// [`Error::EngineBusy`] and the engine is not failed; a filling lane still works; once
/// one filling lane closes, the same lane and key work. `check` runs a job on a lane
/// and compares its output with OpenSSL's (`what` names the case).
pub fn full_device_makes_a_job_busy(
    engine: &EngineRef,
    check: impl Fn(&mut dyn Lane, &KeyStore, &Job, &[u8], &str) -> JobOutput,
) {
    let keys = KeyStore::new();
    let key = |lane: usize, i: u8| {
        let k = vec![
            i, lane as u8, 0xa5, 0x5a, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
        ];
        (keys.add(Key::new(k.clone())).expect("valid key"), k)
    };
    let job = |id: KeyId| {
        Job::new(
            Cipher::AES_128_CBC,
            Direction::Encrypt,
            id,
            [7; 16],
            vec![9; 64],
        )
    };
    let mut full = Vec::new();
    let mut first = None;
    for l in 0..LANES_TO_FILL {
        let mut lane = engine.open_lane(l).expect("lane opens");
        for i in 0..KEYS_PER_LANE {
            let (id, k) = key(l, i);
            check(
                &mut *lane,
                &keys,
                &job(id),
                &k,
                &format!("lane {l} key {i}"),
            );
            first.get_or_insert((id, k));
        }
        full.push(lane);
    }
    let mut last = engine.open_lane(LANES_TO_FILL).expect("lane opens");
    let (id, k) = key(LANES_TO_FILL, 0);
    let mut out = JobOutput::default();
    match last.run(&job(id), &keys, &mut out) {
        Err(Error::EngineBusy { reason, .. }) => {
            eprintln!("full device: {reason}");
            assert!(reason.contains("no more sessions"), "{reason}");
        }
        other => panic!("a job on a full device: {other:?}, not EngineBusy"),
    }
    let (first_id, first_key) = first.expect("a key was used");
    check(
        &mut *full[0],
        &keys,
        &job(first_id),
        &first_key,
        "a filling lane after the busy job",
    );
    drop(full.pop());
    check(&mut *last, &keys, &job(id), &k, "after a lane closed");
}
