//! Large-buffer splitting (seed 003): a CTR job or a CBC decryption cut into sub-jobs
//! and run on all lanes gives exactly what the job gives run whole — checked against
//! one-shot OpenSSL (`openssl::symm`) and against the `cpu` engine running the one job,
//! including counters that carry across the 2^32, 2^64 and 2^128 boundaries.

use hetcrypt::engine::cpu::CpuEngine;
use hetcrypt::policy::{self, Policy};
use hetcrypt::split::{self, run_split};
use hetcrypt::{Cipher, Direction, Dispatcher, Error, Job, Key, KeyId, KeySize, Mode};

const KEY: [u8; 32] = [0x3c; 32];

fn openssl_cipher(c: Cipher) -> openssl::symm::Cipher {
    use openssl::symm::Cipher as C;
    match (c.key_size, c.mode) {
        (KeySize::Aes128, Mode::Ctr) => C::aes_128_ctr(),
        (KeySize::Aes192, Mode::Ctr) => C::aes_192_ctr(),
        (KeySize::Aes256, Mode::Ctr) => C::aes_256_ctr(),
        (KeySize::Aes128, _) => C::aes_128_cbc(),
        (KeySize::Aes192, _) => C::aes_192_cbc(),
        (KeySize::Aes256, _) => C::aes_256_cbc(),
    }
}

/// One-shot OpenSSL over the whole buffer.
fn one_shot(cipher: Cipher, mode: openssl::symm::Mode, iv: &[u8], input: &[u8]) -> Vec<u8> {
    let key = &KEY[..cipher.key_len()];
    let mut c = openssl::symm::Crypter::new(openssl_cipher(cipher), mode, key, Some(iv)).unwrap();
    c.pad(cipher.mode == Mode::CbcPkcs7);
    let mut out = vec![0u8; input.len() + 16];
    let mut n = c.update(input, &mut out).unwrap();
    n += c.finalize(&mut out[n..]).unwrap();
    out.truncate(n);
    out
}

/// A `cpu` engine with 2 lanes beside one with 1, and a key per AES size.
fn setup() -> (Dispatcher, [KeyId; 3]) {
    let d = Dispatcher::new(vec![
        CpuEngine::with_lanes(2).into_engine(),
        CpuEngine::with_lanes(1).named("cpu-b").into_engine(),
    ])
    .unwrap();
    let keys = KeySize::ALL.map(|k| d.add_key(Key::new(KEY[..k.key_len()].to_vec())).unwrap());
    (d, keys)
}

fn key(keys: &[KeyId; 3], c: Cipher) -> KeyId {
    keys[KeySize::ALL.iter().position(|&k| k == c.key_size).unwrap()]
}

/// Counter blocks whose increments carry: into bit 32 (OpenSSL's 32-bit counter fast
/// path), into bit 64 (a 64-bit counter would stop there), and around 2^128.
fn counters() -> Vec<[u8; 16]> {
    let mut c32 = [0x11u8; 16];
    c32[12..].copy_from_slice(&[0xff, 0xff, 0xff, 0xfd]);
    let mut c64 = [0x22u8; 16];
    c64[8..].copy_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe]);
    let mut c128 = [0xffu8; 16];
    c128[15] = 0xfc;
    vec![c32, c64, c128, *b"0123456789abcdef"]
}

/// Checks one split run against one-shot OpenSSL and against the cpu engine on the
/// job whole.
fn check(d: &Dispatcher, job: &Job, parts: usize, policy: &dyn Policy) {
    let mode = match job.direction {
        Direction::Encrypt => openssl::symm::Mode::Encrypt,
        Direction::Decrypt => openssl::symm::Mode::Decrypt,
    };
    let want = one_shot(job.cipher, mode, job.iv(), &job.input);
    let whole = d
        .run(std::slice::from_ref(job), &policy::Only::new("cpu"))
        .unwrap();
    assert_eq!(whole.outputs[0].as_ref().unwrap().data, want);
    let got = run_split(d, job, parts, policy)
        .unwrap_or_else(|e| panic!("{} {} bytes in {parts} parts: {e}", job.cipher, job.len()));
    assert_eq!(
        got.output.data,
        want,
        "{} {} {} bytes, iv {:02x?}, {parts} parts, {}",
        job.cipher,
        job.direction,
        job.len(),
        job.iv(),
        policy.name()
    );
    let expected_parts = parts.clamp(1, job.len().div_ceil(16).max(1));
    assert_eq!(got.report.jobs, expected_parts);
    assert_eq!(
        got.report.engines.iter().map(|e| e.jobs).sum::<usize>(),
        expected_parts
    );
}

#[test]
fn ctr_split_matches_one_shot_across_counter_boundaries() {
    let (d, keys) = setup();
    for cipher in [Cipher::AES_128_CTR, Cipher::AES_256_CTR] {
        for iv in counters() {
            // Lengths with partial last blocks; enough blocks to cross each boundary.
            for len in [1, 17, 64, 1000, 64 * 1024 + 7] {
                let input: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
                for direction in [Direction::Encrypt, Direction::Decrypt] {
                    let job = Job::new(cipher, direction, key(&keys, cipher), iv, input.clone());
                    for parts in [1, 2, 3, 8, 100] {
                        check(&d, &job, parts, &policy::Pull);
                    }
                }
            }
        }
    }
}

#[test]
fn cbc_decrypt_split_matches_one_shot() {
    let (d, keys) = setup();
    for cipher in [
        Cipher::AES_128_CBC,
        Cipher::AES_192_CBC,
        Cipher::AES_256_CBC_PKCS7,
    ] {
        for plain_len in [16, 100, 4096, 50_000] {
            let plain: Vec<u8> = (0..plain_len).map(|i| (i * 13) as u8).collect();
            let plain = if cipher.mode == Mode::Cbc {
                plain[..plain_len / 16 * 16].to_vec()
            } else {
                plain
            };
            let iv = [0x5e; 16];
            let sealed = one_shot(cipher, openssl::symm::Mode::Encrypt, &iv, &plain);
            let job = Job::new(cipher, Direction::Decrypt, key(&keys, cipher), iv, sealed);
            for parts in [1, 2, 5, 64] {
                check(&d, &job, parts, &policy::Pull);
            }
        }
    }
}

#[test]
fn split_runs_under_every_policy() {
    let (d, keys) = setup();
    let iv = counters()[2];
    let input: Vec<u8> = (0..200_000).map(|i| (i % 251) as u8).collect();
    let job = Job::new(
        Cipher::AES_128_CTR,
        Direction::Encrypt,
        key(&keys, Cipher::AES_128_CTR),
        iv,
        input,
    );
    for name in [
        "pull",
        "round-robin",
        "polling",
        "threshold:4096",
        "threshold",
        "adaptive",
    ] {
        let p = policy::by_name(name).unwrap();
        for parts in [3, 48] {
            check(&d, &job, parts, p.as_ref());
        }
    }
}

#[test]
fn bad_padding_in_the_last_part_is_an_authentication_failure() {
    let (d, keys) = setup();
    let cipher = Cipher::AES_128_CBC_PKCS7;
    let iv = [1; 16];
    let mut sealed = one_shot(cipher, openssl::symm::Mode::Encrypt, &iv, &[9; 100]);
    // Flip the last byte of the second-to-last block: it garbles the padding byte of the
    // last plaintext block.
    let n = sealed.len();
    sealed[n - 17] ^= 0xff;
    let job = Job::new(cipher, Direction::Decrypt, key(&keys, cipher), iv, sealed);
    assert!(matches!(
        run_split(&d, &job, 3, &policy::Pull),
        Err(Error::AuthenticationFailed)
    ));
}

#[test]
fn cbc_encryption_and_gcm_are_refused() {
    let (d, keys) = setup();
    let cbc = Job::new(
        Cipher::AES_128_CBC,
        Direction::Encrypt,
        key(&keys, Cipher::AES_128_CBC),
        [0; 16],
        vec![0; 64],
    );
    let gcm = Job::with_iv(
        Cipher::AES_128_GCM,
        Direction::Encrypt,
        key(&keys, Cipher::AES_128_GCM),
        &[0; 12],
        vec![0; 64],
    )
    .unwrap();
    for job in [cbc, gcm] {
        assert!(matches!(
            run_split(&d, &job, 4, &policy::Pull),
            Err(Error::CannotSplit { .. })
        ));
        assert!(split::check_splittable(&job).is_err());
    }
}
