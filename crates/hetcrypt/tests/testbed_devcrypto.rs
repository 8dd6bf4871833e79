//! The `devcrypto` engine's own edge cases, in the testbed guest (which loads
//! cryptodev.ko): jobs cut into several `CIOCCRYPT` requests, counter carry across them,
//! PKCS#7 around raw CBC, empty inputs, wrong keys, the bounded session cache, each
//! compared with OpenSSL run directly. In the `soft` profile this reaches the
//! virtio-crypto device (`devcrypto:virtio_crypto_aes_cbc`); in `aesni` the kernel's
//! AES-NI drivers, through the same ioctls.
//!
//! Outside the guest (no `HETCRYPT_TESTBED`) every test prints a note and returns;
//! inside, a missing engine is a failure.

use hetcrypt::engine::devcrypto::DevcryptoEngine;
use hetcrypt::engine::{EngineRef, Lane};
use hetcrypt::{Cipher, Direction, Error, Job, JobOutput, Key, KeyId, KeyStore, Mode};
use openssl::symm::{self, Crypter};

mod common;

/// The testbed device's driver (cbc(aes) only).
const VIRTIO: &str = "virtio_crypto_aes_cbc";

/// Bytes of one request in the engine (64 KiB); sizes around it and multiples of it
/// cross request boundaries.
const REQUEST: usize = 64 * 1024;

/// Fails the test outside the testbed guest. Its tests are `#[ignore]`d, so a host run
/// lists them as ignored with the reason; testbed/ci runs them with `--include-ignored`,
/// and one run that way outside the guest fails rather than passing untested.
fn require_testbed(test: &str) {
    assert!(
        std::env::var_os("HETCRYPT_TESTBED").is_some(),
        "{test} needs the testbed guest (HETCRYPT_TESTBED unset): run it through testbed/ci"
    );
}

/// The engines under test: `devcrypto`, and in the soft profile (where the kernel
/// ranks the device first for cbc(aes)) `devcrypto:virtio_crypto_aes_cbc`.
fn engines() -> Vec<EngineRef> {
    let mut list = vec![DevcryptoEngine::open()
        .expect("devcrypto opens in the guest (testbed/run loads cryptodev.ko)")
        .into_engine()];
    match DevcryptoEngine::with_driver(VIRTIO) {
        Ok(e) => list.push(e.into_engine()),
        Err(e) => {
            let soft = std::env::var("HETCRYPT_TESTBED_PROFILE").is_ok_and(|p| p == "soft");
            assert!(
                !soft,
                "devcrypto:{VIRTIO} must open in the soft profile: {e}"
            );
            eprintln!("note: devcrypto:{VIRTIO} not tested in this profile: {e}");
        }
    }
    list
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
        (_, Mode::Gcm) => panic!("devcrypto does not serve GCM"),
    }
}

/// What OpenSSL, called directly, makes of the job.
fn reference(job: &Job, key: &[u8]) -> JobOutput {
    let mode = match job.direction {
        Direction::Encrypt => symm::Mode::Encrypt,
        Direction::Decrypt => symm::Mode::Decrypt,
    };
    let mut crypter = Crypter::new(evp(job.cipher), mode, key, Some(job.iv())).expect("openssl");
    crypter.pad(job.cipher.mode == Mode::CbcPkcs7);
    let mut data = vec![0u8; job.input.len() + 32];
    let mut n = crypter.update(&job.input, &mut data).expect("openssl");
    n += crypter.finalize(&mut data[n..]).expect("openssl");
    data.truncate(n);
    JobOutput { data, tag: None }
}

/// Runs `job` on `lane` and checks it against OpenSSL; returns the output.
fn check(lane: &mut dyn Lane, keys: &KeyStore, job: &Job, key: &[u8], what: &str) -> JobOutput {
    let want = reference(job, key);
    let mut out = JobOutput::default();
    lane.run(job, keys, &mut out)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(out.data.len(), want.data.len(), "{what}: output length");
    assert!(out.data == want.data, "{what}: output differs from OpenSSL");
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
        300_000,
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
        let ciphers: Vec<Cipher> = Cipher::all()
            .filter(|&c| engine.supports(c, Direction::Encrypt))
            .collect();
        assert!(ciphers.contains(&Cipher::AES_128_CBC), "{}", engine.name());
        for cipher in ciphers {
            let key_bytes = bytes(cipher.key_len(), cipher.key_len() as u64);
            let key = keys.add(Key::new(key_bytes.clone())).expect("valid key");
            for (i, len) in sizes(cipher.mode).into_iter().enumerate() {
                let what = format!("{} {cipher} {len} bytes", engine.name());
                let iv = bytes(16, i as u64);
                let plain = bytes(len, 1000 + i as u64);
                let enc = Job::with_iv(cipher, Direction::Encrypt, key, &iv, plain.clone())
                    .expect("iv fits");
                let ct = check(
                    &mut *lane,
                    &keys,
                    &enc,
                    &key_bytes,
                    &format!("{what} encrypt"),
                );
                let dec =
                    Job::with_iv(cipher, Direction::Decrypt, key, &iv, ct.data).expect("iv fits");
                let pt = check(
                    &mut *lane,
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
            &mut *lane,
            &keys,
            &job,
            &key_bytes,
            &format!("ctr from {start:#x}"),
        );
    }
}

#[test]
#[ignore = "needs the testbed guest (HETCRYPT_TESTBED): testbed/ci runs it"]
fn bad_padding_and_wrong_keys_are_job_errors_and_the_engine_goes_on() {
    require_testbed("bad_padding_and_wrong_keys_are_job_errors_and_the_engine_goes_on");
    for engine in engines() {
        let keys = KeyStore::new();
        let key_bytes = vec![7u8; 32];
        let key = keys.add(Key::new(key_bytes.clone())).expect("valid key");
        let mut lane = engine.open_lane(0).expect("lane opens");
        let name = engine.name().to_string();
        // A ciphertext whose last block decrypts to padding byte 0.
        let raw = Job::new(
            Cipher::AES_256_CBC,
            Direction::Encrypt,
            key,
            [1; 16],
            vec![0u8; 32],
        );
        let ct = check(
            &mut *lane,
            &keys,
            &raw,
            &key_bytes,
            &format!("{name} raw cbc"),
        );
        let bad = Job::new(
            Cipher::AES_256_CBC_PKCS7,
            Direction::Decrypt,
            key,
            [1; 16],
            ct.data,
        );
        let mut out = JobOutput::default();
        match lane.run(&bad, &keys, &mut out) {
            Err(Error::AuthenticationFailed) => assert!(out.data.is_empty()),
            other => panic!("{name}: bad padding gave {other:?}"),
        }
        // A 32-byte key for AES-128, and a key id never registered.
        let job = Job::new(
            Cipher::AES_128_CBC,
            Direction::Encrypt,
            key,
            [0; 16],
            vec![0; 16],
        );
        match lane.run(&job, &keys, &mut out) {
            Err(Error::KeyLength {
                expected: 16,
                got: 32,
                ..
            }) => {}
            other => panic!("{name}: {other:?}"),
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
        // The engine still works after those job errors.
        let ok = Job::new(
            Cipher::AES_256_CBC,
            Direction::Encrypt,
            key,
            [9; 16],
            bytes(4096, 9),
        );
        check(
            &mut *lane,
            &keys,
            &ok,
            &key_bytes,
            &format!("{name} after job errors"),
        );
    }
}

#[test]
#[ignore = "needs the testbed guest (HETCRYPT_TESTBED): testbed/ci runs it"]
fn many_keys_cycle_through_the_bounded_session_cache() {
    require_testbed("many_keys_cycle_through_the_bounded_session_cache");
    for engine in engines() {
        let keys = KeyStore::new();
        let mut lane = engine.open_lane(0).expect("lane opens");
        // More keys than a lane keeps sessions for (32), used twice in turn: evicted
        // sessions are ended and created again; forgotten keys end theirs.
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
                    &mut *lane,
                    &keys,
                    &job,
                    k,
                    &format!("{} key {}", engine.name(), k[0]),
                );
            }
        }
        let ids: Vec<KeyId> = all.iter().map(|(id, _)| *id).collect();
        assert!(
            lane.forget_keys(&ids[40..]),
            "the devcrypto lane forgets keys"
        );
        let (id, k) = &all[0];
        let job = Job::new(
            Cipher::AES_128_CBC,
            Direction::Encrypt,
            *id,
            [5; 16],
            vec![5; 64],
        );
        check(&mut *lane, &keys, &job, k, "after forgetting keys");
    }
}

#[test]
#[ignore = "needs the testbed guest (HETCRYPT_TESTBED): testbed/ci runs it"]
fn a_full_device_makes_a_job_busy_and_leaves_the_engine_working() {
    require_testbed("a_full_device_makes_a_job_busy_and_leaves_the_engine_working");
    // cryptodev reaches the device only where the kernel ranks it first (soft).
    let engine = match DevcryptoEngine::with_driver(VIRTIO) {
        Ok(e) => e.into_engine(),
        Err(e) => {
            let soft = std::env::var("HETCRYPT_TESTBED_PROFILE").is_ok_and(|p| p == "soft");
            assert!(
                !soft,
                "devcrypto:{VIRTIO} must open in the soft profile: {e}"
            );
            eprintln!("note: devcrypto:{VIRTIO} not here, the device not tested: {e}");
            return;
        }
    };
    common::full_device_makes_a_job_busy(&engine, check);
}
