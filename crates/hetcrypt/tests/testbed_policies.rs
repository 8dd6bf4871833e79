//! Every policy with `cpu` + `kernel` lanes, in the testbed guest: a mixed batch comes
//! out byte-identical to `cpu` alone, every job runs once, and the report shows the
//! engines working where they should (in the `soft` profile, a weak CPU: the device
//! takes a real share of 16 KiB CBC jobs under every policy that balances load).
//!
//! Outside the guest (no `HETCRYPT_TESTBED`) each test prints a note and returns;
//! inside, a missing engine is a failure.

use std::io::Write;

use hetcrypt::engine::cpu::CpuEngine;
use hetcrypt::engine::kernel::{kernel_release, KernelEngine};
use hetcrypt::engine::EngineRef;
use hetcrypt::{policy, BatchResult, Cipher, Direction, Dispatcher, Job, Mode, Report};

/// The testbed device's driver (cbc(aes) only).
const VIRTIO: &str = "virtio_crypto_aes_cbc";
const VIRTIO_ENGINE: &str = "kernel:virtio_crypto_aes_cbc";

/// Every policy, as the CLI names them.
const POLICIES: [&str; 7] = [
    "only:cpu",
    "only:kernel:virtio_crypto_aes_cbc",
    "round-robin",
    "polling",
    "pull",
    "threshold",
    "adaptive",
];

/// The policies that balance load between engines: in the `soft` profile each must
/// give the device a real share of 16 KiB CBC jobs.
const BALANCING: [&str; 4] = ["polling", "pull", "threshold", "adaptive"];

/// The least share of 16 KiB CBC jobs the device must take in the `soft` profile,
/// where it is ~10x the CPU (45 vs 4.6 MB/s in DESIGN.md): a quarter is far below
/// what any sensible schedule gives it, and far above zero.
const MIN_DEVICE_SHARE: f64 = 0.25;

/// Policies that place jobs by costs they measure: they owe the device a share only
/// when it measured clearly faster than the CPU in the same run (`pull` and `polling`
/// give every free lane work whatever the speeds, so they always owe one).
const MEASURING: [&str; 2] = ["threshold", "adaptive"];

/// How much faster than the CPU alone the device alone must measure, in this run,
/// before a measuring policy is held to MIN_DEVICE_SHARE. Below it the two are close
/// enough (a loaded host once gave 2.13 vs 2.22 MB/s) that keeping the work on the
/// CPU is a sound choice, and run-to-run noise (2-3x here) decides which looks faster.
const CLEARLY_FASTER: f64 = 1.5;

fn note(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

/// Fails the test outside the testbed guest. Its tests are `#[ignore]`d, so a host run
/// lists them as ignored with the reason; testbed/ci runs them with `--include-ignored`,
/// and one run that way outside the guest fails rather than passing untested.
fn require_testbed(test: &str) {
    assert!(
        std::env::var_os("HETCRYPT_TESTBED").is_some(),
        "{test} needs the testbed guest (HETCRYPT_TESTBED unset): run it through testbed/ci"
    );
}

fn soft_profile() -> bool {
    std::env::var("HETCRYPT_TESTBED_PROFILE").is_ok_and(|p| p == "soft")
}

/// `cpu` (one lane, EVP only: multi-buffer CBC runs on the `aes` crate's AES-NI, which
/// the soft profile's `OPENSSL_ia32cap` does not mask) and the device (one lane).
fn engines() -> Vec<EngineRef> {
    vec![
        CpuEngine::with_lanes(1).multibuffer(1).into_engine(),
        KernelEngine::with_driver(VIRTIO)
            .expect("the guest has the virtio-crypto device")
            .into_engine(),
    ]
}

/// Deterministic filler bytes.
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed ^ 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A mixed batch: every cipher, both directions, sizes from 0 to 20 KiB. Decryptions
/// of made-up ciphertext are included on purpose: padded CBC and GCM then fail
/// authentication, and must fail alike on every engine.
fn mixed_batch(d: &Dispatcher) -> Vec<Job> {
    let sizes = [0usize, 16, 100, 1024, 4096, 16 * 1024, 20_000];
    let mut jobs = Vec::new();
    for (c, cipher) in Cipher::all().enumerate() {
        let key = d
            .add_key(hetcrypt::Key::new(bytes(cipher.key_len(), c as u64)))
            .expect("valid key");
        for (s, &size) in sizes.iter().enumerate() {
            let size = if cipher.mode == Mode::Cbc {
                size / 16 * 16
            } else {
                size
            };
            for direction in [Direction::Encrypt, Direction::Decrypt] {
                let seed = (c * 100 + s * 2) as u64 + (direction == Direction::Decrypt) as u64;
                let input = if direction == Direction::Decrypt && cipher.mode == Mode::CbcPkcs7 {
                    bytes(size.max(16) / 16 * 16, seed)
                } else {
                    bytes(size, seed)
                };
                let iv = bytes(cipher.iv_len(), seed + 7);
                let mut job = Job::with_iv(cipher, direction, key, &iv, input).expect("iv fits");
                if cipher.mode == Mode::Gcm {
                    job = job.aad(bytes(s * 5, seed + 9));
                    if direction == Direction::Decrypt {
                        let tag: [u8; 16] = bytes(16, seed + 11).try_into().expect("16 bytes");
                        job = job.tag(tag);
                    }
                }
                jobs.push(job);
            }
        }
    }
    jobs
}

fn run(d: &Dispatcher, jobs: &[Job], name: &str) -> BatchResult {
    let p = policy::by_name(name).unwrap_or_else(|e| panic!("policy {name}: {e}"));
    d.run(jobs, p.as_ref())
        .unwrap_or_else(|e| panic!("policy {name}: {e}"))
}

fn jobs_of(report: &Report, engine: &str) -> usize {
    report.engine(engine).map_or(0, |e| e.jobs)
}

/// The batch under every policy equals `cpu` alone, job for job, errors included.
#[test]
#[ignore = "needs the testbed guest (HETCRYPT_TESTBED): testbed/ci runs it"]
fn every_policy_matches_cpu_alone_on_a_mixed_batch() {
    require_testbed("every_policy_matches_cpu_alone_on_a_mixed_batch");
    let d = Dispatcher::new(engines()).expect("two engines");
    let jobs = mixed_batch(&d);
    let cbc_jobs = jobs
        .iter()
        .filter(|j| matches!(j.cipher.mode, Mode::Cbc | Mode::CbcPkcs7))
        .count();
    let reference = run(&d, &jobs, "only:cpu");
    assert_eq!(jobs_of(&reference.report, VIRTIO_ENGINE), 0);
    assert_eq!(jobs_of(&reference.report, "cpu"), jobs.len());
    for name in POLICIES {
        let got = run(&d, &jobs, name);
        let r = &got.report;
        note(&format!(
            "mixed batch (Linux {}, {} profile), {name}: cpu {} jobs, {VIRTIO_ENGINE} {} jobs, \
             {:.3} s",
            kernel_release(),
            std::env::var("HETCRYPT_TESTBED_PROFILE").unwrap_or_default(),
            jobs_of(r, "cpu"),
            jobs_of(r, VIRTIO_ENGINE),
            r.wall.as_secs_f64()
        ));
        assert!(
            r.engines.iter().all(|e| e.failed.is_none()),
            "{name}: an engine failed"
        );
        let only_device = name == "only:kernel:virtio_crypto_aes_cbc";
        for (i, (job, (out, want))) in jobs
            .iter()
            .zip(got.outputs.iter().zip(&reference.outputs))
            .enumerate()
        {
            let device_cannot = !matches!(job.cipher.mode, Mode::Cbc | Mode::CbcPkcs7);
            match (out, want) {
                _ if only_device && device_cannot => {
                    assert!(
                        out.is_err(),
                        "{name}: job {i} ({}) ran nowhere yet succeeded",
                        job.cipher
                    )
                }
                (Ok(a), Ok(b)) => assert!(
                    a.data == b.data && a.tag == b.tag,
                    "{name}: job {i} ({} {} {} B) differs from cpu alone",
                    job.cipher,
                    job.direction,
                    job.len()
                ),
                (Err(a), Err(b)) => assert_eq!(
                    a.to_string(),
                    b.to_string(),
                    "{name}: job {i} ({}) fails differently",
                    job.cipher
                ),
                (a, b) => panic!("{name}: job {i} ({}): {a:?} vs cpu alone {b:?}", job.cipher),
            }
        }
        // Every job a lane could run ran exactly once.
        let ran = jobs_of(r, "cpu") + jobs_of(r, VIRTIO_ENGINE);
        if only_device {
            assert_eq!(ran, cbc_jobs, "{name}");
            assert_eq!(jobs_of(r, "cpu"), 0, "{name}: the cpu worked");
        } else {
            assert_eq!(ran, jobs.len(), "{name}");
        }
        if name == "only:cpu" {
            assert_eq!(jobs_of(r, VIRTIO_ENGINE), 0, "{name}: the device worked");
        }
        if name == "round-robin" {
            // Dealt in turn: each engine gets about half of what it can run.
            assert!(
                jobs_of(r, VIRTIO_ENGINE) >= cbc_jobs / 4,
                "{name}: device idle"
            );
            assert!(jobs_of(r, "cpu") >= jobs.len() / 4, "{name}: cpu idle");
        }
    }
}

/// 16 KiB CBC jobs, the seeds' largest size: on a weak CPU (`soft` profile) every
/// balancing policy gives the device a real share, and the output is right.
#[test]
#[ignore = "needs the testbed guest (HETCRYPT_TESTBED): testbed/ci runs it"]
fn balancing_policies_give_the_device_a_share_of_16k_cbc_jobs() {
    require_testbed("balancing_policies_give_the_device_a_share_of_16k_cbc_jobs");
    /// Jobs per batch: enough for shares to mean something, few enough for the soft
    /// profile's slow CPU under emulation.
    const JOBS: usize = 160;
    let d = Dispatcher::new(engines()).expect("two engines");
    let key = d
        .add_key(hetcrypt::Key::new(bytes(16, 1)))
        .expect("valid key");
    let jobs: Vec<Job> = (0..JOBS)
        .map(|i| {
            let iv: [u8; 16] = bytes(16, i as u64).try_into().expect("16 bytes");
            Job::new(
                Cipher::AES_128_CBC,
                Direction::Encrypt,
                key,
                iv,
                bytes(16 * 1024, 1000 + i as u64),
            )
        })
        .collect();
    let reference = run(&d, &jobs, "only:cpu");
    let device_alone = run(&d, &jobs, "only:kernel:virtio_crypto_aes_cbc");
    note(&format!(
        "16 KiB CBC x {JOBS} ({} profile): cpu alone {:.2} MB/s, device alone {:.2} MB/s",
        std::env::var("HETCRYPT_TESTBED_PROFILE").unwrap_or_default(),
        reference.report.bytes_per_second() / 1e6,
        device_alone.report.bytes_per_second() / 1e6
    ));
    let device_speedup =
        device_alone.report.bytes_per_second() / reference.report.bytes_per_second().max(1.0);
    for name in POLICIES {
        if name == "only:cpu" {
            continue;
        }
        let got = run(&d, &jobs, name);
        let r = &got.report;
        for (i, (out, want)) in got.outputs.iter().zip(&reference.outputs).enumerate() {
            let (out, want) = (
                out.as_ref()
                    .unwrap_or_else(|e| panic!("{name}: job {i}: {e}")),
                want.as_ref().expect("cpu alone succeeds"),
            );
            assert!(
                out.data == want.data,
                "{name}: job {i} differs from cpu alone"
            );
        }
        let device = jobs_of(r, VIRTIO_ENGINE);
        assert_eq!(
            device + jobs_of(r, "cpu"),
            JOBS,
            "{name}: a job lost or doubled"
        );
        let share = device as f64 / JOBS as f64;
        note(&format!(
            "16 KiB CBC, {name}: device {device}/{JOBS} jobs ({:.0}%), {:.2} MB/s",
            share * 100.0,
            r.bytes_per_second() / 1e6
        ));
        if soft_profile() && BALANCING.contains(&name) {
            if MEASURING.contains(&name) && device_speedup < CLEARLY_FASTER {
                note(&format!(
                    "{name}: device share not checked: the device alone measured \
                     {device_speedup:.2}x the CPU alone in this run (below {CLEARLY_FASTER}x)"
                ));
            } else {
                assert!(
                    share >= MIN_DEVICE_SHARE,
                    "{name}: in the soft profile the device took only {device}/{JOBS} jobs \
                     (device alone {device_speedup:.2}x the CPU alone in this run)"
                );
            }
        }
        if name == "round-robin" {
            assert_eq!(device, JOBS / 2, "{name}: dealt 1:1");
        }
    }
}
