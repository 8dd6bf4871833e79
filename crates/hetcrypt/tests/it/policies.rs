//! Every dispatch policy, on engines of different speeds and on failing engines: each
//! job runs exactly once, on an engine that supports it, with output byte-identical to
//! one-shot OpenSSL (`openssl::symm`, independent of the engines' EVP context reuse).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use hetcrypt::engine::cpu::CpuEngine;
use hetcrypt::engine::fault::{Fault, FaultyEngine};
use hetcrypt::engine::{Engine, EngineInfo, EngineRef, Lane};
use hetcrypt::policy::{self, Policy};
use hetcrypt::{
    BatchResult, Cipher, Direction, Dispatcher, Error, Job, JobOutput, Key, KeyId, KeySize,
    KeyStore, Mode,
};

/// Every policy name the CLI accepts, in the spellings `policy::by_name` must parse.
/// `threshold` (calibrating) and `adaptive` are run twice per dispatcher below, so their
/// second batch uses what the first one measured.
const POLICIES: &[&str] = &[
    "pull",
    "round-robin",
    "polling",
    "threshold:2048",
    "threshold",
    "adaptive",
];

/// Key material; AES-128/192/256 jobs use its first 16/24/32 bytes, each registered as
/// its own key.
const KEY_BYTES: [u8; 32] = [0x5a; 32];

/// The registered keys, by [`KeySize`] order (128, 192, 256).
type Keys = [KeyId; 3];

fn key_for(keys: &Keys, cipher: Cipher) -> KeyId {
    keys[KeySize::ALL
        .iter()
        .position(|&k| k == cipher.key_size)
        .expect("every key size is in ALL")]
}

/// splitmix64: a deterministic stream for job sizes and contents (no seed to print:
/// every run draws the same jobs).
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn openssl_cipher(c: Cipher) -> openssl::symm::Cipher {
    use openssl::symm::Cipher as C;
    match (c.key_size, c.mode) {
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

/// One-shot OpenSSL for a job: output and tag.
fn one_shot(job: &Job) -> JobOutput {
    let c = job.cipher;
    let key = &KEY_BYTES[..c.key_len()];
    let mode = match job.direction {
        Direction::Encrypt => openssl::symm::Mode::Encrypt,
        Direction::Decrypt => openssl::symm::Mode::Decrypt,
    };
    if c.is_aead() {
        return match job.direction {
            Direction::Encrypt => {
                let mut tag = [0u8; 16];
                let data = openssl::symm::encrypt_aead(
                    openssl_cipher(c),
                    key,
                    Some(job.iv()),
                    &job.aad,
                    &job.input,
                    &mut tag,
                )
                .unwrap();
                JobOutput {
                    data,
                    tag: Some(tag),
                }
            }
            Direction::Decrypt => JobOutput {
                data: openssl::symm::decrypt_aead(
                    openssl_cipher(c),
                    key,
                    Some(job.iv()),
                    &job.aad,
                    &job.input,
                    &job.tag.unwrap(),
                )
                .unwrap(),
                tag: None,
            },
        };
    }
    let mut crypter =
        openssl::symm::Crypter::new(openssl_cipher(c), mode, key, Some(job.iv())).unwrap();
    crypter.pad(c.mode == Mode::CbcPkcs7);
    let mut data = vec![0u8; job.len() + 16];
    let mut n = crypter.update(&job.input, &mut data).unwrap();
    n += crypter.finalize(&mut data[n..]).unwrap();
    data.truncate(n);
    JobOutput { data, tag: None }
}

/// A mixed batch: every cipher, both directions (decrypt jobs carry real ciphertext and
/// tags), sizes from 0 to ~20 KiB on both sides of the `threshold:2048` split.
fn batch(n: usize, keys: &Keys, mix: &mut Mix) -> Vec<Job> {
    let ciphers: Vec<Cipher> = Cipher::all().collect();
    (0..n)
        .map(|i| {
            let cipher = ciphers[mix.below(ciphers.len())];
            let direction = if mix.below(2) == 0 {
                Direction::Encrypt
            } else {
                Direction::Decrypt
            };
            // Mostly small, some large: the regimes the policies treat differently.
            let mut len = if mix.below(3) == 0 {
                4096 + mix.below(16 * 1024)
            } else {
                mix.below(1500)
            };
            if cipher.mode == Mode::Cbc || (cipher.mode == Mode::CbcPkcs7 && len == 0) {
                len = (len / 16).max(1) * 16;
            }
            let key = key_for(keys, cipher);
            let iv = mix.bytes(cipher.iv_len());
            let plain = mix.bytes(len);
            let job = Job::with_iv(cipher, Direction::Encrypt, key, &iv, plain).unwrap();
            let job = if cipher.is_aead() && i % 2 == 0 {
                let aad_len = mix.below(40);
                job.aad(mix.bytes(aad_len))
            } else {
                job
            };
            if direction == Direction::Encrypt {
                return job;
            }
            let sealed = one_shot(&job);
            let mut dec = Job::with_iv(cipher, Direction::Decrypt, key, &iv, sealed.data).unwrap();
            dec.aad = job.aad;
            dec.tag = sealed.tag;
            dec
        })
        .collect()
}

/// Runs `jobs` under `policy` on `d` and checks outputs and exactly-once accounting.
fn run_and_check(d: &Dispatcher, jobs: &[Job], policy: &dyn Policy) -> BatchResult {
    let result = d
        .run(jobs, policy)
        .unwrap_or_else(|e| panic!("{}: {e}", policy.name()));
    for (i, (out, job)) in result.outputs.iter().zip(jobs).enumerate() {
        let out = out
            .as_ref()
            .unwrap_or_else(|e| panic!("{}: job {i} ({}): {e}", policy.name(), job.cipher));
        assert_eq!(
            out,
            &one_shot(job),
            "{}: job {i} ({} {} {} bytes)",
            policy.name(),
            job.cipher,
            job.direction,
            job.len()
        );
    }
    let r = &result.report;
    assert_eq!(r.job_errors, 0, "{}", policy.name());
    assert_eq!(
        r.engines.iter().map(|e| e.jobs).sum::<usize>(),
        jobs.len(),
        "{}: every job done exactly once",
        policy.name()
    );
    result
}

fn dispatcher(engines: Vec<EngineRef>) -> (Dispatcher, Keys) {
    let d = Dispatcher::new(engines).unwrap();
    let keys = KeySize::ALL.map(|k| {
        d.add_key(Key::new(KEY_BYTES[..k.key_len()].to_vec()))
            .unwrap()
    });
    (d, keys)
}

/// Two `cpu` engines with different lane counts, so they drain at different rates.
fn two_cpus() -> Vec<EngineRef> {
    vec![
        CpuEngine::with_lanes(1).into_engine(),
        CpuEngine::with_lanes(2).named("cpu-b").into_engine(),
    ]
}

#[test]
fn every_policy_name_parses() {
    for name in POLICIES.iter().chain(&[
        "only:cpu",
        "threshold:0",
        "round-robin:3:1",
        "round-robin:0:1:2",
    ]) {
        let p = policy::by_name(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(&p.name(), name);
    }
    for bad in [
        "threshold:",
        "threshold:abc",
        "threshold:-1",
        "round_robin",
        "round-robin:",
        "round-robin:3:",
        "round-robin:+3:1",
        "round-robin:1:x",
        "adapt",
    ] {
        assert!(
            matches!(policy::by_name(bad), Err(Error::UnknownName { .. })),
            "{bad} should not parse"
        );
    }
}

#[test]
fn every_policy_on_two_cpu_engines() {
    let mut mix = Mix(1);
    for name in POLICIES {
        let (d, keys) = dispatcher(two_cpus());
        let jobs = batch(300, &keys, &mut mix);
        let policy = policy::by_name(name).unwrap();
        for _ in 0..2 {
            run_and_check(&d, &jobs, policy.as_ref());
        }
    }
}

#[test]
fn every_policy_on_an_empty_batch_and_a_single_job() {
    let mut mix = Mix(2);
    for name in POLICIES {
        let (d, keys) = dispatcher(two_cpus());
        let policy = policy::by_name(name).unwrap();
        let r = run_and_check(&d, &[], policy.as_ref());
        assert_eq!(r.report.jobs, 0);
        run_and_check(&d, &batch(1, &keys, &mut mix), policy.as_ref());
    }
}

#[test]
fn round_robin_deals_one_to_one() {
    let mut mix = Mix(3);
    let (d, keys) = dispatcher(two_cpus());
    let jobs = batch(301, &keys, &mut mix);
    let r = run_and_check(&d, &jobs, &policy::RoundRobin::new()).report;
    let (a, b) = (r.engine("cpu").unwrap(), r.engine("cpu-b").unwrap());
    // Dealt in turn before the batch: 151 and 150, whatever the engines' speeds.
    assert_eq!((a.jobs, b.jobs), (151, 150));
}

/// Fail-over under every policy: a `cpu` engine beside one that fails mid-batch (or
/// cannot open at all) — nothing lost, nothing twice, a second batch avoids it.
///
/// Policies that reserve jobs before the batch (`round-robin`, `threshold:<bytes>`) are
/// sure to hand the failing engine more than its quota, so it must fail under them;
/// under the others it may finish the batch before reaching its fault (the `cpu` lane
/// can be faster), which is fine as long as it never runs past it.
#[test]
fn every_policy_survives_a_failing_engine() {
    let mut mix = Mix(4);
    for fault in [Fault::AfterJobs(5), Fault::OnOpen] {
        for name in POLICIES {
            let flaky = FaultyEngine::new("flaky", CpuEngine::with_lanes(2).into_engine(), fault);
            let (d, keys) = dispatcher(vec![
                CpuEngine::with_lanes(1).into_engine(),
                flaky.into_engine(),
            ]);
            let jobs = batch(200, &keys, &mut mix);
            let policy = policy::by_name(name).unwrap();
            let r = run_and_check(&d, &jobs, policy.as_ref()).report;
            let flaky = r.engine("flaky").unwrap();
            let reserves = *name == "round-robin" || name.starts_with("threshold:");
            if fault == Fault::OnOpen || reserves {
                assert!(flaky.failed.is_some(), "{name} {fault:?}");
            }
            if let Fault::AfterJobs(n) = fault {
                assert!(
                    flaky.jobs <= n,
                    "{name}: {} jobs after the fault",
                    flaky.jobs
                );
            }
            if flaky.failed.is_some() {
                assert!(
                    r.redispatched > 0 || fault == Fault::OnOpen || !reserves,
                    "{name}"
                );
                let again = run_and_check(&d, &jobs, policy.as_ref()).report;
                assert_eq!(again.engine("flaky").unwrap().jobs, 0, "{name}");
            }
        }
    }
}

/// A test-only engine: the `cpu` engine restricted to CBC (like most embedded crypto
/// modules, and our virtio-crypto device). Its lanes count every job that is not CBC —
/// a policy that hands it one is wrong — and fail it as unsupported.
struct CbcOnly {
    inner: CpuEngine,
    misplaced: Arc<AtomicUsize>,
}

impl Engine for CbcOnly {
    fn name(&self) -> &str {
        "cbc-only"
    }

    fn info(&self) -> EngineInfo {
        EngineInfo {
            name: "cbc-only".to_string(),
            ..self.inner.info()
        }
    }

    fn lanes(&self) -> usize {
        2
    }

    fn supports(&self, cipher: Cipher, _direction: Direction) -> bool {
        matches!(cipher.mode, Mode::Cbc | Mode::CbcPkcs7)
    }

    fn open_lane(&self, index: usize) -> hetcrypt::Result<Box<dyn Lane>> {
        Ok(Box::new(CbcOnlyLane {
            inner: self.inner.open_lane(index)?,
            misplaced: Arc::clone(&self.misplaced),
        }))
    }
}

struct CbcOnlyLane {
    inner: Box<dyn Lane>,
    misplaced: Arc<AtomicUsize>,
}

impl Lane for CbcOnlyLane {
    fn run(&mut self, job: &Job, keys: &KeyStore, out: &mut JobOutput) -> hetcrypt::Result<()> {
        if !matches!(job.cipher.mode, Mode::Cbc | Mode::CbcPkcs7) {
            self.misplaced.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Unsupported {
                cipher: job.cipher,
                engine: "cbc-only".to_string(),
            });
        }
        self.inner.run(job, keys, out)
    }
}

#[test]
fn no_policy_hands_a_job_to_an_engine_that_cannot_run_it() {
    let mut mix = Mix(5);
    for name in POLICIES {
        let misplaced = Arc::new(AtomicUsize::new(0));
        let cbc_only = CbcOnly {
            inner: CpuEngine::with_lanes(2),
            misplaced: Arc::clone(&misplaced),
        };
        // The CBC-only engine first, so policies that favour the first engine (or the
        // first `cpu`-kind one, as `threshold` does for small jobs) are tempted by it.
        let (d, keys) = dispatcher(vec![
            Arc::new(cbc_only),
            CpuEngine::with_lanes(1).into_engine(),
        ]);
        let jobs = batch(300, &keys, &mut mix);
        let policy = policy::by_name(name).unwrap();
        for _ in 0..2 {
            let r = run_and_check(&d, &jobs, policy.as_ref()).report;
            assert_eq!(misplaced.load(Ordering::Relaxed), 0, "{name}");
            let cbc = jobs
                .iter()
                .filter(|j| matches!(j.cipher.mode, Mode::Cbc | Mode::CbcPkcs7))
                .count();
            assert!(r.engine("cbc-only").unwrap().jobs <= cbc, "{name}");
        }
    }
}

/// A calibration measured on the engines themselves (not through the dispatcher) gives
/// `threshold` and `adaptive` a model to start from; both then run a mixed batch, also
/// of classes the calibration lacks and on a failing engine, with every output right.
#[test]
fn calibrated_policies_run_every_job_once() {
    use hetcrypt::calibration::{self, Settings};
    use std::time::Duration;
    let engines = two_cpus();
    let settings = Settings {
        ciphers: vec![Cipher::AES_128_CBC, Cipher::AES_256_GCM],
        sizes: vec![16, 256, 4096],
        point_time: Duration::from_millis(1),
        lanes_len: 4096,
        mixes: true,
        ..Settings::default()
    };
    let cal = Arc::new(calibration::measure(&engines, &settings, &mut |_| {}).unwrap());
    assert!(cal.unmeasured.is_empty(), "{:?}", cal.unmeasured);
    for direction in [Direction::Encrypt, Direction::Decrypt] {
        let at = cal.crossover(Cipher::AES_256_GCM, direction, "cpu", "cpu-b");
        assert!(at.is_some(), "both engines measured {direction}");
    }
    let mut mix = Mix(11);
    for name in ["threshold", "adaptive"] {
        let (d, keys) = dispatcher(two_cpus());
        let jobs = batch(300, &keys, &mut mix);
        let policy = policy::by_name_with(name, Some(&cal)).unwrap();
        assert_eq!(policy.name(), name);
        for _ in 0..2 {
            run_and_check(&d, &jobs, policy.as_ref());
        }
        let (d, keys) = dispatcher(vec![
            CpuEngine::with_lanes(1).into_engine(),
            Arc::new(FaultyEngine::new(
                "cpu-b",
                CpuEngine::with_lanes(2).into_engine(),
                Fault::AfterJobs(20),
            )),
        ]);
        let jobs = batch(300, &keys, &mut mix);
        run_and_check(&d, &jobs, policy.as_ref());
    }
}

/// `adaptive` started from a calibration judges each engine by its cost measured alone
/// (the calibration drives each engine by itself), never only by its time beside
/// another one, which on a shared core can be 2-3x its own: after a batch of one class
/// on two engines, each engine's estimate of the class still rests on the stored cost
/// (counted as `WINDOW` samples), whichever engine ran the jobs. Counted, not timed.
#[test]
fn adaptive_from_a_calibration_knows_each_engine_alone_on_a_new_class() {
    use hetcrypt::calibration::{self, Settings};
    use hetcrypt::policy::adaptive::{model, Adaptive};
    use std::time::Duration;
    let cipher = Cipher::AES_256_GCM;
    let settings = Settings {
        ciphers: vec![cipher],
        sizes: vec![16 * 1024],
        point_time: Duration::from_millis(1),
        lanes_len: 16 * 1024,
        mixes: false,
        ..Settings::default()
    };
    let cal = Arc::new(calibration::measure(&two_cpus(), &settings, &mut |_| {}).unwrap());
    let (d, keys) = dispatcher(two_cpus());
    let mut mix = Mix(7);
    let jobs: Vec<Job> = (0..300)
        .map(|_| {
            let iv = mix.bytes(cipher.iv_len());
            Job::with_iv(
                cipher,
                Direction::Encrypt,
                key_for(&keys, cipher),
                &iv,
                mix.bytes(16 * 1024),
            )
            .unwrap()
        })
        .collect();
    let adaptive = Adaptive::seeded(cal);
    run_and_check(&d, &jobs, &adaptive);
    let learned = adaptive.learned();
    for engine in ["cpu", "cpu-b"] {
        let l = learned
            .iter()
            .find(|l| l.engine == engine && l.min_len == 16 * 1024)
            .unwrap_or_else(|| panic!("no estimate for {engine}: {learned:?}"));
        assert!(l.cost.is_some() && l.samples >= model::WINDOW, "{l:?}");
    }
}
