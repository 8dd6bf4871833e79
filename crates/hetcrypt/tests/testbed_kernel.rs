//! The `kernel` engine's own edge cases, in the testbed guest: jobs cut into several
//! AF_ALG requests, counter carry across them, PKCS#7 around raw CBC, empty inputs,
//! GCM with AAD and tampering, key caching, each compared with OpenSSL run directly.
//!
//! Outside the guest (no `HETCRYPT_TESTBED`) every test prints a note and returns;
//! inside, a missing engine is a failure.

use hetcrypt::engine::kernel::KernelEngine;
use hetcrypt::engine::{EngineRef, Lane};
use hetcrypt::{Cipher, Direction, Error, Job, JobOutput, Key, KeyId, KeyStore, Mode, TAG_LEN};
use openssl::symm::{self, Crypter};

mod common;

/// The testbed device's driver (cbc(aes) only).
const VIRTIO: &str = "virtio_crypto_aes_cbc";

/// Bytes of one skcipher request in the engine (16 pages of 4 KiB); sizes around it
/// and multiples of it cross request boundaries.
const REQUEST: usize = 16 * 4096;

/// Fails the test outside the testbed guest. Its tests are `#[ignore]`d, so a host run
/// lists them as ignored with the reason; testbed/ci runs them with `--include-ignored`,
/// and one run that way outside the guest fails rather than passing untested.
fn require_testbed(test: &str) {
    assert!(
        std::env::var_os("HETCRYPT_TESTBED").is_some(),
        "{test} needs the testbed guest (HETCRYPT_TESTBED unset): run it through testbed/ci"
    );
}

/// The engines under test: `kernel` (every cipher, guest's default drivers) and
/// `kernel:virtio_crypto_aes_cbc` (CBC on the device).
fn engines() -> Vec<EngineRef> {
    vec![
        KernelEngine::open()
            .expect("kernel opens in the guest")
            .into_engine(),
        KernelEngine::with_driver(VIRTIO)
            .expect("the guest has the virtio-crypto device")
            .into_engine(),
    ]
}

/// Deterministic filler bytes (a simple LCG; the content only needs to vary).
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 56) as u8
        })
        .collect()
}

fn evp(cipher: Cipher) -> symm::Cipher {
    use hetcrypt::KeySize::*;
    match (cipher.key_size, cipher.mode) {
        (Aes128, Mode::Cbc | Mode::CbcPkcs7) => symm::Cipher::aes_128_cbc(),
        (Aes192, Mode::Cbc | Mode::CbcPkcs7) => symm::Cipher::aes_192_cbc(),
        (Aes256, Mode::Cbc | Mode::CbcPkcs7) => symm::Cipher::aes_256_cbc(),
        (Aes128, Mode::Ctr) => symm::Cipher::aes_128_ctr(),
        (Aes192, Mode::Ctr) => symm::Cipher::aes_192_ctr(),
        (Aes256, Mode::Ctr) => symm::Cipher::aes_256_ctr(),
        (Aes128, Mode::Gcm) => symm::Cipher::aes_128_gcm(),
        (Aes192, Mode::Gcm) => symm::Cipher::aes_192_gcm(),
        (Aes256, Mode::Gcm) => symm::Cipher::aes_256_gcm(),
    }
}

/// What OpenSSL, called directly, makes of the job.
fn reference(job: &Job, key: &[u8]) -> Result<JobOutput, openssl::error::ErrorStack> {
    let c = evp(job.cipher);
    if job.cipher.mode == Mode::Gcm {
        return match job.direction {
            Direction::Encrypt => {
                let mut tag = [0u8; TAG_LEN];
                let data =
                    symm::encrypt_aead(c, key, Some(job.iv()), &job.aad, &job.input, &mut tag)?;
                Ok(JobOutput {
                    data,
                    tag: Some(tag),
                })
            }
            Direction::Decrypt => {
                let tag = job.tag.expect("decrypt jobs carry a tag");
                let data = symm::decrypt_aead(c, key, Some(job.iv()), &job.aad, &job.input, &tag)?;
                Ok(JobOutput { data, tag: None })
            }
        };
    }
    let mode = match job.direction {
        Direction::Encrypt => symm::Mode::Encrypt,
        Direction::Decrypt => symm::Mode::Decrypt,
    };
    let mut crypter = Crypter::new(c, mode, key, Some(job.iv()))?;
    crypter.pad(job.cipher.mode == Mode::CbcPkcs7);
    let mut data = vec![0u8; job.input.len() + 32];
    let mut n = crypter.update(&job.input, &mut data)?;
    n += crypter.finalize(&mut data[n..])?;
    data.truncate(n);
    Ok(JobOutput { data, tag: None })
}

/// Runs `job` on `lane` and checks it against OpenSSL; returns the output.
fn check(lane: &mut dyn Lane, keys: &KeyStore, job: &Job, key: &[u8], what: &str) -> JobOutput {
    let want = reference(job, key).unwrap_or_else(|e| panic!("{what}: OpenSSL failed: {e}"));
    let mut out = JobOutput::default();
    lane.run(job, keys, &mut out)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.data == want.data, "{what}: output differs from OpenSSL");
    assert_eq!(out.tag, want.tag, "{what}: tag differs from OpenSSL");
    out
}

/// Sizes that cross the engine's request boundaries and the block boundaries.
fn sizes(mode: Mode) -> Vec<usize> {
    let all = [
        0,
        1,
        15,
        16,
        17,
        4095,
        4096,
        REQUEST - 16,
        REQUEST,
        REQUEST + 16,
        REQUEST + 17,
        3 * REQUEST + 48,
        200_000,
    ];
    all.into_iter()
        .filter(|&n| mode != Mode::Cbc || n % 16 == 0)
        .collect()
}

#[test]
#[ignore = "needs the testbed guest (HETCRYPT_TESTBED): testbed/ci runs it"]
fn every_cipher_and_size_matches_openssl_in_both_directions() {
    require_testbed("every_cipher_and_size_matches_openssl_in_both_directions");
    for engine in engines() {
        let keys = KeyStore::new();
        let mut lane = engine.open_lane(0).expect("lane opens");
        for cipher in Cipher::all().filter(|&c| engine.supports(c, Direction::Encrypt)) {
            let key_bytes = bytes(cipher.key_len(), cipher.key_len() as u64);
            let key = keys.add(Key::new(key_bytes.clone())).expect("valid key");
            for (i, len) in sizes(cipher.mode).into_iter().enumerate() {
                let what = format!("{} {cipher} {len} bytes", engine.name());
                let iv = bytes(cipher.iv_len(), i as u64);
                let aad = if cipher.mode == Mode::Gcm {
                    bytes(i * 7 % 40, 99)
                } else {
                    Vec::new()
                };
                let plain = bytes(len, 1000 + i as u64);
                let enc = Job::with_iv(cipher, Direction::Encrypt, key, &iv, plain.clone())
                    .expect("iv fits")
                    .aad(aad.clone());
                let ct = check(
                    lane.as_mut(),
                    &keys,
                    &enc,
                    &key_bytes,
                    &format!("{what} encrypt"),
                );
                let mut dec = Job::with_iv(cipher, Direction::Decrypt, key, &iv, ct.data)
                    .expect("iv fits")
                    .aad(aad);
                if let Some(tag) = ct.tag {
                    dec = dec.tag(tag);
                }
                let pt = check(
                    lane.as_mut(),
                    &keys,
                    &dec,
                    &key_bytes,
                    &format!("{what} decrypt"),
                );
                assert!(pt.data == plain, "{what}: round trip");
            }
        }
    }
}

#[test]
#[ignore = "needs the testbed guest (HETCRYPT_TESTBED): testbed/ci runs it"]
fn ctr_counter_carries_across_request_boundaries() {
    require_testbed("ctr_counter_carries_across_request_boundaries");
    let engine = engines().remove(0);
    let keys = KeyStore::new();
    let key_bytes = vec![0x42u8; 16];
    let key = keys.add(Key::new(key_bytes.clone())).expect("valid key");
    let mut lane = engine.open_lane(0).expect("lane opens");
    // Counters that wrap the low 64 bits, and the whole 128 bits, inside the second
    // request of a job.
    let blocks_per_request = (REQUEST / 16) as u128;
    for start in [
        u128::from(u64::MAX) - blocks_per_request - 3,
        u128::MAX - blocks_per_request - 3,
        u128::MAX,
    ] {
        let job = Job::new(
            Cipher::AES_128_CTR,
            Direction::Encrypt,
            key,
            start.to_be_bytes(),
            bytes(3 * REQUEST + 5, 7),
        );
        check(
            lane.as_mut(),
            &keys,
            &job,
            &key_bytes,
            &format!("ctr from {start:#x}"),
        );
    }
}

#[test]
#[ignore = "needs the testbed guest (HETCRYPT_TESTBED): testbed/ci runs it"]
fn bad_padding_and_bad_tags_are_job_errors_and_the_engine_goes_on() {
    require_testbed("bad_padding_and_bad_tags_are_job_errors_and_the_engine_goes_on");
    for engine in engines() {
        let keys = KeyStore::new();
        let key_bytes = vec![7u8; 32];
        let key = keys.add(Key::new(key_bytes.clone())).expect("valid key");
        let mut lane = engine.open_lane(0).expect("lane opens");
        let name = engine.name().to_string();

        // CBC-PKCS#7: a ciphertext whose last block decrypts to padding byte 0.
        let cipher = Cipher::AES_256_CBC_PKCS7;
        if engine.supports(cipher, Direction::Decrypt) {
            let raw = Job::new(
                Cipher::AES_256_CBC,
                Direction::Encrypt,
                key,
                [1; 16],
                vec![0u8; 32],
            );
            let ct = check(
                lane.as_mut(),
                &keys,
                &raw,
                &key_bytes,
                &format!("{name} raw cbc"),
            );
            let bad = Job::new(cipher, Direction::Decrypt, key, [1; 16], ct.data);
            let mut out = JobOutput::default();
            match lane.run(&bad, &keys, &mut out) {
                Err(Error::AuthenticationFailed) => assert!(out.data.is_empty()),
                other => panic!("{name}: bad padding gave {other:?}"),
            }
        }

        // GCM: flip a tag bit, and a ciphertext bit.
        let cipher = Cipher::AES_256_GCM;
        if engine.supports(cipher, Direction::Decrypt) {
            let enc = Job::with_iv(cipher, Direction::Encrypt, key, &[3; 12], bytes(1000, 3))
                .expect("nonce fits")
                .aad(b"header".to_vec());
            let ct = check(
                lane.as_mut(),
                &keys,
                &enc,
                &key_bytes,
                &format!("{name} gcm"),
            );
            let tag = ct.tag.expect("gcm encryption gives a tag");
            let mut bad_tag = tag;
            bad_tag[0] ^= 1;
            let mut bad_ct = ct.data.clone();
            bad_ct[500] ^= 0x80;
            for (data, t) in [(ct.data.clone(), bad_tag), (bad_ct, tag)] {
                let job = Job::with_iv(cipher, Direction::Decrypt, key, &[3; 12], data)
                    .expect("nonce fits")
                    .aad(b"header".to_vec())
                    .tag(t);
                let mut out = JobOutput::default();
                match lane.run(&job, &keys, &mut out) {
                    Err(Error::AuthenticationFailed) => assert!(out.data.is_empty()),
                    other => panic!("{name}: tampered gcm gave {other:?}"),
                }
            }
            // Empty AAD and empty ciphertext: only the tag is checked.
            let empty = Job::with_iv(cipher, Direction::Encrypt, key, &[4; 12], Vec::new())
                .expect("nonce fits");
            let sealed = check(
                lane.as_mut(),
                &keys,
                &empty,
                &key_bytes,
                &format!("{name} gcm empty"),
            );
            let open = Job::with_iv(cipher, Direction::Decrypt, key, &[4; 12], Vec::new())
                .expect("nonce fits")
                .tag(sealed.tag.expect("tag"));
            check(
                lane.as_mut(),
                &keys,
                &open,
                &key_bytes,
                &format!("{name} gcm empty open"),
            );
            let mut wrong = sealed.tag.expect("tag");
            wrong[15] ^= 1;
            let forged = Job::with_iv(cipher, Direction::Decrypt, key, &[4; 12], Vec::new())
                .expect("nonce fits")
                .tag(wrong);
            let mut out = JobOutput::default();
            assert!(
                matches!(
                    lane.run(&forged, &keys, &mut out),
                    Err(Error::AuthenticationFailed)
                ),
                "{name}: forged empty gcm accepted"
            );
        }

        // The engine still works after those job errors.
        let cipher = Cipher::AES_256_CBC;
        let ok = Job::new(cipher, Direction::Encrypt, key, [9; 16], bytes(4096, 9));
        check(
            lane.as_mut(),
            &keys,
            &ok,
            &key_bytes,
            &format!("{name} after job errors"),
        );
    }
}

#[test]
#[ignore = "needs the testbed guest (HETCRYPT_TESTBED): testbed/ci runs it"]
fn wrong_key_length_is_refused_like_the_cpu_engine_does() {
    require_testbed("wrong_key_length_is_refused_like_the_cpu_engine_does");
    for engine in engines() {
        let keys = KeyStore::new();
        let key = keys.add(Key::new(vec![1u8; 16])).expect("valid key");
        let mut lane = engine.open_lane(0).expect("lane opens");
        let job = Job::new(
            Cipher::AES_256_CBC,
            Direction::Encrypt,
            key,
            [0; 16],
            vec![0; 16],
        );
        let mut out = JobOutput::default();
        match lane.run(&job, &keys, &mut out) {
            Err(Error::KeyLength {
                expected: 32,
                got: 16,
                ..
            }) => {}
            other => panic!("{}: {other:?}", engine.name()),
        }
        let unknown = Job::new(
            Cipher::AES_128_CBC,
            Direction::Encrypt,
            KeyId(999),
            [0; 16],
            vec![0; 16],
        );
        assert!(matches!(
            lane.run(&unknown, &keys, &mut out),
            Err(Error::UnknownKey(999))
        ));
    }
}

#[test]
#[ignore = "needs the testbed guest (HETCRYPT_TESTBED): testbed/ci runs it"]
fn many_keys_cycle_through_the_bounded_context_cache() {
    require_testbed("many_keys_cycle_through_the_bounded_context_cache");
    for engine in engines() {
        let keys = KeyStore::new();
        let mut lane = engine.open_lane(0).expect("lane opens");
        // More keys than a lane caches (32), used twice in turn: evicted contexts are
        // rebuilt and keyed again.
        let all: Vec<(KeyId, Vec<u8>)> = (0..80u8)
            .map(|i| {
                let k = vec![i; 16];
                (keys.add(Key::new(k.clone())).expect("valid key"), k)
            })
            .collect();
        for round in 0..2u8 {
            for (id, k) in &all {
                let job = Job::new(
                    Cipher::AES_128_CBC,
                    Direction::Encrypt,
                    *id,
                    [round; 16],
                    vec![round; 64],
                );
                check(
                    lane.as_mut(),
                    &keys,
                    &job,
                    k,
                    &format!("{} key {}", engine.name(), k[0]),
                );
            }
        }
    }
}

/// A GCM job past the kernel engine's GCM limit (about 200 KiB with the default
/// socket buffers): 1 MiB.
const BIG: usize = 1 << 20;

#[test]
#[ignore = "needs the testbed guest (HETCRYPT_TESTBED): testbed/ci runs it"]
fn gcm_limit_is_declared_and_exact_and_skcipher_has_none() {
    require_testbed("gcm_limit_is_declared_and_exact_and_skcipher_has_none");
    let engine = engines().remove(0);
    let keys = KeyStore::new();
    let key_bytes = vec![5u8; 16];
    let key = keys.add(Key::new(key_bytes.clone())).expect("valid key");
    let mut lane = engine.open_lane(0).expect("lane opens");
    for direction in [Direction::Encrypt, Direction::Decrypt] {
        let max = engine
            .max_job_len(Cipher::AES_128_GCM, direction)
            .expect("the kernel engine declares a GCM limit");
        eprintln!("kernel: largest GCM {direction} job {max} bytes");
        assert!(
            max >= 64 * 1024,
            "limit {max} too small to be the socket buffers"
        );
        // A job of exactly the declared limit runs (the limit is not too generous)...
        let aad = bytes(100, 9);
        let plain = bytes(max - aad.len(), 2);
        let mut tag = [0u8; TAG_LEN];
        let sealed = symm::encrypt_aead(
            symm::Cipher::aes_128_gcm(),
            &key_bytes,
            Some(&[3; 12]),
            &aad,
            &plain,
            &mut tag,
        )
        .expect("openssl");
        let input = match direction {
            Direction::Encrypt => plain.clone(),
            Direction::Decrypt => sealed.clone(),
        };
        let mut job =
            Job::with_iv(Cipher::AES_128_GCM, direction, key, &[3; 12], input).expect("nonce fits");
        job.aad = aad;
        if direction == Direction::Decrypt {
            job.tag = Some(tag);
        }
        check(
            &mut *lane,
            &keys,
            &job,
            &key_bytes,
            &format!("GCM {direction} at the limit"),
        );
        // ... and one byte more is refused with that limit, without touching the kernel.
        job.input.push(0);
        let mut out = JobOutput::default();
        match lane.run(&job, &keys, &mut out) {
            Err(Error::TooLarge { len, max: m, .. }) => assert_eq!((len, m), (max + 1, max)),
            other => panic!("GCM {direction} one byte past the limit: {other:?}"),
        }
    }
    // CBC and CTR are streamed in requests with the IV/counter carried over: no limit,
    // and 1 MiB runs on the lane.
    for cipher in [Cipher::AES_128_CBC, Cipher::AES_128_CTR] {
        assert_eq!(
            engine.max_job_len(cipher, Direction::Encrypt),
            None,
            "{cipher}"
        );
        let job = Job::with_iv(cipher, Direction::Encrypt, key, &[4; 16], bytes(BIG, 3))
            .expect("iv fits");
        check(
            &mut *lane,
            &keys,
            &job,
            &key_bytes,
            &format!("{cipher} 1 MiB"),
        );
    }
}

#[test]
#[ignore = "needs the testbed guest (HETCRYPT_TESTBED): testbed/ci runs it"]
fn big_gcm_jobs_go_to_the_cpu_under_pull_and_fail_clearly_on_the_kernel_alone() {
    use hetcrypt::engine::cpu::CpuEngine;
    use hetcrypt::policy::{Only, Pull};
    use hetcrypt::Dispatcher;
    require_testbed("big_gcm_jobs_go_to_the_cpu_under_pull_and_fail_clearly_on_the_kernel_alone");
    let kernel = engines().remove(0);
    let limit = kernel
        .max_job_len(Cipher::AES_128_GCM, Direction::Encrypt)
        .expect("the kernel engine declares a GCM limit");
    let d =
        Dispatcher::new(vec![CpuEngine::with_lanes(1).into_engine(), kernel]).expect("two engines");
    let key_bytes = vec![6u8; 16];
    let key = d.add_key(Key::new(key_bytes.clone())).expect("valid key");
    // One 1 MiB job among small ones the kernel may take.
    let jobs: Vec<Job> = (0..40)
        .map(|i| {
            let len = if i == 7 { BIG } else { 16 * 1024 };
            Job::with_iv(
                Cipher::AES_128_GCM,
                Direction::Encrypt,
                key,
                &[i as u8; 12],
                bytes(len, i),
            )
            .expect("nonce fits")
        })
        .collect();
    let small_bytes = 39 * 16 * 1024;

    let batch = d.run(&jobs, &Pull).expect("pull plans");
    for (i, (out, job)) in batch.outputs.iter().zip(&jobs).enumerate() {
        let out = out
            .as_ref()
            .unwrap_or_else(|e| panic!("pull: job {i}: {e}"));
        let want = reference(job, &key_bytes).expect("openssl");
        assert!(
            out.data == want.data && out.tag == want.tag,
            "pull: job {i} differs"
        );
    }
    let r = &batch.report;
    let (cpu, kern) = (&r.engines[0], &r.engines[1]);
    eprintln!(
        "pull, 1 MiB + 39 x 16 KiB GCM: cpu {} jobs {} B, kernel {} jobs {} B",
        cpu.jobs, cpu.bytes, kern.jobs, kern.bytes
    );
    assert_eq!((r.job_errors, r.redispatched), (0, 0));
    assert!(kern.bytes <= small_bytes, "the kernel ran the 1 MiB job");
    assert!(cpu.bytes >= BIG as u64, "the cpu did not run the 1 MiB job");

    let batch = d
        .run(&jobs, &Only::new("kernel"))
        .expect("only:kernel plans");
    for (i, out) in batch.outputs.iter().enumerate() {
        match (i, out) {
            (
                7,
                Err(
                    e @ Error::TooLarge {
                        engine, len, max, ..
                    },
                ),
            ) => {
                assert_eq!((engine.as_str(), *len, *max), ("kernel", BIG, limit));
                eprintln!("only:kernel, 1 MiB GCM job: {e}");
            }
            (7, other) => panic!("only:kernel: the 1 MiB job: {other:?}"),
            (_, Ok(_)) => {}
            (_, Err(e)) => panic!("only:kernel: job {i}: {e}"),
        }
    }
    assert_eq!(
        batch.report.engines[0].jobs, 0,
        "cpu ran jobs under only:kernel"
    );
    assert_eq!(batch.report.engines[1].jobs, 39);
}

/// Open file descriptors of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd is readable")
        .count()
}

/// Set in the child process that runs [`forgotten_keys_close_their_sockets`] alone.
const FDS_ALONE: &str = "HETCRYPT_TEST_FDS_ALONE";

#[test]
#[ignore = "needs the testbed guest (HETCRYPT_TESTBED): testbed/ci runs it"]
fn forgotten_keys_close_their_sockets() {
    const NAME: &str = "forgotten_keys_close_their_sockets";
    require_testbed(NAME);
    if std::env::var_os(FDS_ALONE).is_none() {
        // The count is of the whole process's descriptors, and this binary's other tests
        // open and close AF_ALG sockets (and files) in parallel threads, the same kind
        // the lane opens: no filter tells theirs from its. So the count runs in a child
        // process of this binary where this test is the only one.
        let exe = std::env::current_exe().expect("the test binary has a path");
        let out = std::process::Command::new(exe)
            .args([
                NAME,
                "--exact",
                "--include-ignored",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(FDS_ALONE, "1")
            .output()
            .expect("the test binary runs again");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success() && stdout.contains("test result: ok. 1 passed"),
            "{NAME} alone in a child process: {}\n{stdout}\n{stderr}",
            out.status
        );
        return;
    }
    // 20 keys, under the lane's context cache bound (32), so nothing is evicted.
    const KEYS: usize = 20;
    let engine = engines().remove(0);
    let keys = KeyStore::new();
    let mut lane = engine.open_lane(0).expect("lane opens");
    let before = open_fds();
    let ids: Vec<KeyId> = (0..KEYS)
        .map(|i| {
            let key = vec![i as u8; 16];
            let id = keys.add(Key::new(key.clone())).expect("valid key");
            let job = Job::with_iv(
                Cipher::AES_128_CBC,
                Direction::Encrypt,
                id,
                &[1; 16],
                bytes(64, 5),
            )
            .expect("iv fits");
            check(&mut *lane, &keys, &job, &key, &format!("key {i}"));
            id
        })
        .collect();
    let used = open_fds();
    // One transform and one operation socket per key.
    assert_eq!(used - before, 2 * KEYS, "sockets per key");
    assert!(
        lane.forget_keys(&ids[..KEYS / 2]),
        "the kernel lane forgets keys"
    );
    assert_eq!(used - open_fds(), KEYS, "half the keys' sockets closed");
    // The other keys' contexts still work.
    let job = Job::with_iv(
        Cipher::AES_128_CBC,
        Direction::Encrypt,
        ids[KEYS - 1],
        &[1; 16],
        bytes(64, 5),
    )
    .expect("iv fits");
    check(
        &mut *lane,
        &keys,
        &job,
        &[(KEYS - 1) as u8; 16],
        "a key not forgotten",
    );
    assert_eq!(
        used - open_fds(),
        KEYS,
        "no socket reopened for a cached key"
    );
}

#[test]
#[ignore = "needs the testbed guest (HETCRYPT_TESTBED): testbed/ci runs it"]
fn a_full_device_makes_a_job_busy_and_leaves_the_engine_working() {
    require_testbed("a_full_device_makes_a_job_busy_and_leaves_the_engine_working");
    let engine = KernelEngine::with_driver(VIRTIO)
        .expect("the guest has the virtio-crypto device")
        .into_engine();
    common::full_device_makes_a_job_busy(&engine, check);
}
