//! Differential tests: random jobs (seeded, the seed printed) give byte-identical output
//! on every engine and under every policy with every job done exactly once, and bad jobs
//! fail with the same typed error everywhere.
//!
//! The expected outputs come from OpenSSL's `symm` API (an independent path from the
//! engines' cached EVP contexts); decrypt jobs are built from real encryptions and must
//! give back the original plaintext.

mod common;

use common::{
    bind, check_report, engines, job, run_batch, scaled, seed, Case, CaseKey, Coverage, Fail,
    Failures, Rig,
};
use hetcrypt::cipher::BLOCK_LEN;
use hetcrypt::engine::cpu::CpuEngine;
use hetcrypt::engine::fault::{Fault, FaultyEngine};
use hetcrypt::policy::{self, Policy};
use hetcrypt::{
    Cipher, Direction, Dispatcher, Error, Job, KeyId, KeySize, Mode, Report, Tag, TAG_LEN,
};
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

/// Largest random job: 64 KiB, the range the core issue asks for.
const MAX_LEN: usize = 64 * 1024;

/// Lengths where block and counter handling go wrong: empty, around one block, around
/// the 64-bit counter word, around the 16 KiB chunk and the 64 KiB maximum.
const EDGE_LENS: [usize; 22] = [
    0, 1, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 255, 256, 257, 1024, 4095, 4096, 16383, 16384,
    65535, 65536,
];

/// The policies every dispatcher must offer besides `only:<engine>` (DESIGN.md section 2).
const POLICIES: [&str; 5] = ["round-robin", "polling", "pull", "threshold", "adaptive"];

/// Name of the fault-injecting engine in the fail-over runs.
const FLAKY: &str = "flaky";

/// Keys drawn per key size: several, so lanes switch between cached key contexts.
const KEYS_PER_SIZE: usize = 2;

/// A seeded RNG for one test; `salt` keeps the tests' streams apart.
fn rng(salt: u64) -> Xoshiro256PlusPlus {
    Xoshiro256PlusPlus::seed_from_u64(seed() ^ salt)
}

fn random_bytes(rng: &mut Xoshiro256PlusPlus, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

/// Random keys, [`KEYS_PER_SIZE`] of each AES size.
fn random_keys(rng: &mut Xoshiro256PlusPlus) -> Vec<Vec<u8>> {
    KeySize::ALL
        .into_iter()
        .flat_map(|size| std::iter::repeat_n(size.key_len(), KEYS_PER_SIZE))
        .map(|len| random_bytes(rng, len))
        .collect()
}

/// A random key of the cipher's size.
fn key_for<'k>(rng: &mut Xoshiro256PlusPlus, keys: &'k [Vec<u8>], cipher: Cipher) -> &'k [u8] {
    let fitting: Vec<&Vec<u8>> = keys
        .iter()
        .filter(|k| k.len() == cipher.key_len())
        .collect();
    fitting[rng.random_range(0..fitting.len())]
}

/// A random length in 0..=64 KiB: often an edge, otherwise log-uniform so small and
/// large jobs are both common.
fn random_len(rng: &mut Xoshiro256PlusPlus) -> usize {
    if rng.random_bool(0.4) {
        EDGE_LENS[rng.random_range(0..EDGE_LENS.len())]
    } else {
        let bits = rng.random_range(0..=16u32);
        rng.random_range(0..=(1usize << bits)).min(MAX_LEN)
    }
}

/// A random IV for `cipher`; some CTR counters sit just below a 64-bit or the 128-bit
/// wrap, so a job crosses it (the counter must carry across the whole block).
fn random_iv(rng: &mut Xoshiro256PlusPlus, cipher: Cipher) -> Vec<u8> {
    let mut iv = random_bytes(rng, cipher.iv_len());
    if cipher.mode == Mode::Ctr && rng.random_bool(0.2) {
        let below = rng.random_range(1..=8usize);
        let from = if rng.random_bool(0.5) { 0 } else { 8 };
        iv[from..].fill(0xff);
        iv[BLOCK_LEN - 1] = 0xff - (below as u8 - 1);
    }
    iv
}

/// OpenSSL's cipher for one of ours.
fn openssl_cipher(cipher: Cipher) -> openssl::symm::Cipher {
    use openssl::symm::Cipher as C;
    match (cipher.key_size, cipher.mode) {
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

/// The reference encryption: OpenSSL's `symm` one-shot API.
fn reference_encrypt(
    cipher: Cipher,
    key: &[u8],
    iv: &[u8],
    aad: &[u8],
    pt: &[u8],
) -> (Vec<u8>, Option<Tag>) {
    let evp = openssl_cipher(cipher);
    if cipher.is_aead() {
        let mut tag = [0u8; TAG_LEN];
        let ct = openssl::symm::encrypt_aead(evp, key, Some(iv), aad, pt, &mut tag)
            .expect("reference GCM encryption");
        return (ct, Some(tag));
    }
    let mut c = openssl::symm::Crypter::new(evp, openssl::symm::Mode::Encrypt, key, Some(iv))
        .expect("reference crypter");
    c.pad(cipher.mode == Mode::CbcPkcs7);
    let mut ct = vec![0u8; pt.len() + BLOCK_LEN * 2];
    let mut n = c.update(pt, &mut ct).expect("reference update");
    n += c.finalize(&mut ct[n..]).expect("reference finalize");
    ct.truncate(n);
    (ct, None)
}

/// One random job with its expected result. Decrypt jobs decrypt a real encryption; a
/// few are corrupted (wrong GCM tag, bad PKCS#7 padding) and must fail authentication.
fn random_case(
    rng: &mut Xoshiro256PlusPlus,
    keys: &[Vec<u8>],
    cipher: Cipher,
    direction: Direction,
    len: usize,
    name: String,
) -> Case {
    let key = key_for(rng, keys, cipher);
    let iv = random_iv(rng, cipher);
    let aad = if cipher.is_aead() {
        let len = if rng.random_bool(0.2) {
            rng.random_range(0..=2048)
        } else {
            rng.random_range(0..=64)
        };
        random_bytes(rng, len)
    } else {
        Vec::new()
    };
    let len = if cipher.mode == Mode::Cbc {
        len / BLOCK_LEN * BLOCK_LEN
    } else {
        len
    };
    let mut pt = random_bytes(rng, len);
    match direction {
        Direction::Encrypt => {
            let (ct, tag) = reference_encrypt(cipher, key, &iv, &aad, &pt);
            Case::output(
                name,
                key,
                job(cipher, direction, &iv, &aad, &pt, None),
                ct,
                tag,
            )
        }
        Direction::Decrypt if cipher.is_aead() && rng.random_bool(0.05) => {
            let (ct, tag) = reference_encrypt(cipher, key, &iv, &aad, &pt);
            let mut tag = tag.expect("GCM gives a tag");
            tag[rng.random_range(0..TAG_LEN)] ^= 1 << rng.random_range(0..8u32);
            Case::failure(
                name + " (wrong tag)",
                key,
                job(cipher, direction, &iv, &aad, &ct, Some(tag)),
                Fail::Auth,
            )
        }
        Direction::Decrypt if cipher.mode == Mode::CbcPkcs7 && rng.random_bool(0.05) => {
            // Encrypt whole blocks without padding, the last byte 0: as PKCS#7 padding
            // a 0 is never valid.
            pt.resize(len / BLOCK_LEN * BLOCK_LEN + BLOCK_LEN, 0);
            if let Some(last) = pt.last_mut() {
                *last = 0;
            }
            let raw = Cipher::new(cipher.key_size, Mode::Cbc);
            let (ct, _) = reference_encrypt(raw, key, &iv, &aad, &pt);
            Case::failure(
                name + " (bad padding)",
                key,
                job(cipher, direction, &iv, &aad, &ct, None),
                Fail::Auth,
            )
        }
        Direction::Decrypt => {
            let (ct, tag) = reference_encrypt(cipher, key, &iv, &aad, &pt);
            Case::output(
                name,
                key,
                job(cipher, direction, &iv, &aad, &ct, tag),
                pt,
                None,
            )
        }
    }
}

/// `n` random jobs over all 12 ciphers and both directions.
fn random_cases(salt: u64, n: usize) -> Vec<Case> {
    let mut rng = rng(salt);
    let keys = random_keys(&mut rng);
    let ciphers: Vec<Cipher> = Cipher::all().collect();
    (0..n)
        .map(|i| {
            let cipher = ciphers[rng.random_range(0..ciphers.len())];
            let direction = if rng.random_bool(0.5) {
                Direction::Encrypt
            } else {
                Direction::Decrypt
            };
            let len = random_len(&mut rng);
            random_case(
                &mut rng,
                &keys,
                cipher,
                direction,
                len,
                format!("random job {i}"),
            )
        })
        .collect()
}

/// Runs `cases` on a dispatcher over every engine under each policy: `only:<engine>`
/// for each engine (with the cases it supports), then [`POLICIES`]. Every output must be
/// the expected one and every job done exactly once. A policy `by_name` does not know
/// fails the test, after the others have run.
///
/// With `fault`, each policy gets a fresh dispatcher that also holds a `cpu` engine
/// wrapped to fail after that many jobs (`flaky`): its jobs must move to the others with
/// the same outputs, none lost and none done twice.
fn check_under_every_policy(suite: &str, cases: &[Case], fault: Option<usize>) {
    let engines = engines();
    // A flaky engine counts the jobs it ran over its life: a fresh one per batch.
    let with_flaky = |after: usize| {
        // First in the list, so its lanes start first and take work before they fail.
        let inner = CpuEngine::with_lanes(2).into_engine();
        let flaky = FaultyEngine::new(FLAKY, inner, Fault::AfterJobs(after));
        let mut list = vec![flaky.into_engine()];
        list.extend(engines.iter().cloned());
        list
    };
    let engines = match fault {
        Some(after) => with_flaky(after),
        None => engines.clone(),
    };
    let names: Vec<String> = engines.iter().map(|e| e.name().to_string()).collect();
    let shared = Dispatcher::new(engines.clone()).expect("distinct engine names");
    let mut failures = Failures::default();
    let mut coverage = Coverage::default();
    let mut unknown = Vec::new();
    let policies: Vec<String> = names
        .iter()
        .map(|n| format!("only:{n}"))
        .chain(POLICIES.iter().map(|p| p.to_string()))
        .collect();
    for name in &policies {
        let policy: Box<dyn Policy> = match policy::by_name(name) {
            Ok(p) => p,
            Err(Error::UnknownName { .. }) => {
                unknown.push(name.clone());
                continue;
            }
            Err(e) => {
                failures.push(format!("policy {name}: by_name failed: {e}"));
                continue;
            }
        };
        // A failed engine stays quarantined in its dispatcher: one per policy then.
        let fresh;
        let dispatcher = if let Some(after) = fault {
            fresh = Dispatcher::new(with_flaky(after)).expect("distinct engine names");
            &fresh
        } else {
            &shared
        };
        let only = name.strip_prefix("only:");
        let mine: Vec<&Case> = match only {
            Some(engine) => {
                let e = &engines[names
                    .iter()
                    .position(|n| n == engine)
                    .expect("listed above")];
                cases
                    .iter()
                    .filter(|c| e.supports(c.job.cipher, c.job.direction))
                    .collect()
            }
            None => cases.iter().collect(),
        };
        let jobs = bind(dispatcher, &mine);
        let path = format!("{suite} under {name}");
        let batch = match run_batch(dispatcher, &jobs, policy.as_ref()) {
            Ok(b) => b,
            Err(e) => {
                failures.push(format!("{path}: the batch did not run: {e}"));
                continue;
            }
        };
        for (case, got) in mine.iter().zip(&batch.outputs) {
            failures.check(&path, case, got);
        }
        let r = &batch.report;
        // Jobs naming an unregistered key fail before reaching any engine.
        let up_front = batch
            .outputs
            .iter()
            .filter(|o| matches!(o, Err(Error::UnknownKey(_))))
            .count();
        let done: usize = r.engines.iter().map(|e| e.jobs).sum::<usize>() + up_front;
        if let Some(engine) = only {
            let ran = r
                .engines
                .iter()
                .find(|e| e.name == engine)
                .map_or(0, |e| e.jobs);
            coverage.ran(engine, ran);
        }
        if fault.is_none() {
            check_report(&mut failures, &path, &batch, jobs.len());
            if let Some(engine) = only {
                for e in &r.engines {
                    let want = if e.name == engine {
                        jobs.len() - up_front
                    } else {
                        0
                    };
                    if e.jobs != want {
                        failures.push(format!(
                            "{path}: engine {} did {} jobs, want {want}",
                            e.name, e.jobs
                        ));
                    }
                }
            }
        } else {
            if done != jobs.len() || r.jobs != jobs.len() {
                failures.push(format!(
                    "{path}: {} jobs given, {done} done by engines (report: {} jobs)",
                    jobs.len(),
                    r.jobs
                ));
            }
            check_fail_over(&mut failures, &path, name, r, fault.unwrap_or(0));
        }
        let per_engine: Vec<String> = r
            .engines
            .iter()
            .map(|e| {
                let failed = if e.failed.is_some() { " (failed)" } else { "" };
                format!("{} {}{failed}", e.name, e.jobs)
            })
            .collect();
        eprintln!(
            "{path}: {} jobs ({}; {} re-dispatched)",
            jobs.len(),
            per_engine.join(", "),
            r.redispatched
        );
    }
    if !unknown.is_empty() {
        failures.push(format!(
            "policy::by_name does not know {unknown:?}: every policy of DESIGN.md section 2 must be registered"
        ));
    }
    coverage.report(&format!("{suite} under only:<engine>"), &mut failures);
    failures.assert_none(suite);
}

/// Policies that deal every job before the batch starts: under them the flaky engine
/// is certainly given more than its fault allows (the fail-over runs let it do a
/// sixteenth of the batch), so it must fail and jobs must move. The others place jobs
/// as the engines go and may never give it enough (`pull`, `threshold` and `adaptive`
/// often give it none), so of them only consistency is asked.
const DEALT_UP_FRONT: [&str; 2] = ["only:flaky", "round-robin"];

/// In a fail-over run, checks what the report says of the flaky engine, which fails
/// every job after its first `after`: it failed and its jobs moved where it was dealt
/// more than that, and under any policy it failed exactly when jobs moved.
fn check_fail_over(failures: &mut Failures, path: &str, policy: &str, r: &Report, after: usize) {
    let Some(flaky) = r.engines.iter().find(|e| e.name == FLAKY) else {
        failures.push(format!("{path}: no {FLAKY} engine in the report"));
        return;
    };
    let failed = flaky.failed.is_some();
    if DEALT_UP_FRONT.contains(&policy) && !(failed && r.redispatched > 0) {
        failures.push(format!(
            "{path}: {FLAKY} was dealt more than its {after} good jobs, yet failed: {failed}, \
             jobs re-dispatched: {}",
            r.redispatched
        ));
    }
    if failed && (flaky.jobs != after || r.redispatched == 0) {
        failures.push(format!(
            "{path}: {FLAKY} failed after {} jobs (its fault: after {after}), {} re-dispatched",
            flaky.jobs, r.redispatched
        ));
    }
    if !failed && (flaky.jobs > after || r.redispatched != 0) {
        failures.push(format!(
            "{path}: {FLAKY} did {} jobs (its fault: after {after}) and is not failed, \
             {} re-dispatched",
            flaky.jobs, r.redispatched
        ));
    }
}

/// Runs `cases` on every engine alone, by lane, lane batch and dispatcher (and on
/// the `cpu` engine with each of its implementations forced).
fn check_on_every_engine(suite: &str, cases: &[Case]) {
    let mut failures = Failures::default();
    let mut coverage = Coverage::default();
    for engine in engines().into_iter().chain(common::cpu_implementations()) {
        let mut rig = Rig::new(engine);
        let ran = rig.check(cases, &mut failures);
        eprintln!("{suite}: {}: {ran} of {} jobs", rig.name(), cases.len());
        coverage.ran(rig.name(), ran);
    }
    coverage.report(suite, &mut failures);
    failures.assert_none(suite);
}

#[test]
fn random_jobs_on_every_engine() {
    let cases = random_cases(0x01, scaled(160));
    check_on_every_engine("random jobs", &cases);
}

#[test]
fn random_jobs_under_every_policy() {
    let cases = random_cases(0x02, scaled(160));
    check_under_every_policy("random jobs", &cases, None);
}

/// As above with an engine that fails mid-batch: every policy hands its jobs on.
#[test]
fn random_jobs_under_every_policy_with_a_failing_engine() {
    let cases = random_cases(0x05, scaled(160));
    let after = cases.len() / 16;
    check_under_every_policy("random jobs, one engine failing", &cases, Some(after));
}

/// Many CBC encryptions of mixed lengths — empty, one block, odd numbers of blocks, long —
/// so a multi-buffer lane sees its interleaved chains end at different times, including
/// a lone long chain left running after the short ones.
fn cbc_encrypt_batch(salt: u64, n: usize) -> Vec<Case> {
    let mut rng = rng(salt);
    let keys = random_keys(&mut rng);
    let ciphers = [
        Cipher::AES_128_CBC,
        Cipher::AES_128_CBC,
        Cipher::AES_256_CBC,
        Cipher::AES_192_CBC,
        Cipher::AES_128_CBC_PKCS7,
    ];
    (0..n)
        .map(|i| {
            let blocks = match i % 8 {
                0 => 0,
                1 | 2 => 1,
                3 | 4 => 2 * rng.random_range(0..32usize) + 1,
                5 => rng.random_range(0..=MAX_LEN / BLOCK_LEN),
                6 => 1024, // 16 KiB
                _ => rng.random_range(2..=8),
            };
            // Mostly one cipher in a row, as many files with one key would be.
            let cipher = if rng.random_bool(0.7) {
                Cipher::AES_128_CBC
            } else {
                ciphers[rng.random_range(0..ciphers.len())]
            };
            let extra = if cipher.mode == Mode::CbcPkcs7 {
                rng.random_range(0..BLOCK_LEN)
            } else {
                0
            };
            let len = blocks * BLOCK_LEN + extra;
            random_case(
                &mut rng,
                &keys,
                cipher,
                Direction::Encrypt,
                len,
                format!("cbc job {i} ({blocks} blocks)"),
            )
        })
        .collect()
}

/// The CBC encryptions of mixed lengths with a drop-out among them.
fn mixed_cbc_encryptions() -> Vec<Case> {
    let mut cases = cbc_encrypt_batch(0x03, scaled(400));
    // One long chain among empty and one-block ones, in both orders.
    let mut rng = rng(0x33);
    let keys = random_keys(&mut rng);
    for (i, blocks) in [0, 1, 1, 1, 1, 1, 1, 4096, 1, 0, 1, 1, 1, 1, 1, 1]
        .into_iter()
        .enumerate()
    {
        cases.push(random_case(
            &mut rng,
            &keys,
            Cipher::AES_128_CBC,
            Direction::Encrypt,
            blocks * BLOCK_LEN,
            format!("drop-out job {i} ({blocks} blocks)"),
        ));
    }
    cases
}

// The engines and the policies are two tests, so the harness runs them side by side.
#[test]
fn many_cbc_encryptions_of_mixed_lengths_on_every_engine() {
    check_on_every_engine("cbc encryptions", &mixed_cbc_encryptions());
}

#[test]
fn many_cbc_encryptions_of_mixed_lengths_under_every_policy() {
    check_under_every_policy("cbc encryptions", &mixed_cbc_encryptions(), None);
}

/// Jobs every engine must refuse, each with the typed error it must give.
fn bad_cases() -> Vec<Case> {
    let k128 = [0x11u8; 16];
    let k256 = [0x22u8; 32];
    let iv16 = [0x33u8; 16];
    let iv12 = [0x44u8; 12];
    let block = [0x55u8; BLOCK_LEN];
    let mut cases = Vec::new();
    for cipher in Cipher::all() {
        let other_iv: &[u8] = if cipher.mode == Mode::Gcm {
            &iv16
        } else {
            &iv12
        };
        let good_iv: &[u8] = if cipher.mode == Mode::Gcm {
            &iv12
        } else {
            &iv16
        };
        let key = vec![0x66u8; cipher.key_len()];
        let tag = cipher.is_aead().then_some([0u8; TAG_LEN]);
        for dir in [Direction::Encrypt, Direction::Decrypt] {
            let tag = if dir == Direction::Decrypt { tag } else { None };
            cases.push(Case::failure(
                format!("{cipher} {dir} with a {}-byte IV", other_iv.len()),
                &key,
                job(cipher, dir, other_iv, &[], &block, tag),
                Fail::IvLength(other_iv.len()),
            ));
            cases.push(Case::failure(
                format!("{cipher} {dir} with an empty IV"),
                &key,
                job(cipher, dir, &[], &[], &block, tag),
                Fail::IvLength(0),
            ));
            // A key registered but of another AES size than the cipher's.
            let wrong_key: &[u8] = if cipher.key_len() == 16 { &k256 } else { &k128 };
            cases.push(Case::failure(
                format!("{cipher} {dir} with a {}-byte key", wrong_key.len()),
                wrong_key,
                job(cipher, dir, good_iv, &[], &block, tag),
                Fail::KeyLength {
                    expected: cipher.key_len(),
                    got: wrong_key.len(),
                },
            ));
            let mut unknown = Case::failure(
                format!("{cipher} {dir} with an unregistered key"),
                &key,
                job(cipher, dir, good_iv, &[], &block, tag),
                Fail::UnknownKey,
            );
            unknown.key = CaseKey::Unregistered;
            cases.push(unknown);
        }
        let unaligned = matches!(cipher.mode, Mode::Cbc | Mode::CbcPkcs7);
        for dir in [Direction::Encrypt, Direction::Decrypt] {
            if cipher.mode == Mode::Cbc || (unaligned && dir == Direction::Decrypt) {
                for len in [1, 15, 17, 33] {
                    cases.push(Case::failure(
                        format!("{cipher} {dir} of {len} bytes"),
                        &key,
                        job(cipher, dir, good_iv, &[], &vec![0x77; len], None),
                        Fail::InputLength(len),
                    ));
                }
            }
        }
        if cipher.mode == Mode::CbcPkcs7 {
            cases.push(Case::failure(
                format!("{cipher} decrypt of nothing"),
                &key,
                job(cipher, Direction::Decrypt, good_iv, &[], &[], None),
                Fail::InputLength(0),
            ));
        }
        if cipher.is_aead() {
            cases.push(Case::failure(
                format!("{cipher} decrypt without a tag"),
                &key,
                job(cipher, Direction::Decrypt, good_iv, &[], &block, None),
                Fail::MissingTag,
            ));
        }
    }
    cases
}

/// Bad jobs alone, then mixed in among good CBC encryptions (so a multi-buffer lane
/// meets them inside a batch): the same typed error on every engine (here) and under
/// every policy (the next test), and the good jobs around them unharmed.
#[test]
fn bad_jobs_fail_alike_on_every_engine() {
    check_on_every_engine("bad jobs", &bad_cases());
    check_on_every_engine("bad jobs among good ones", &bad_among_good());
}

// A test of its own, so the harness runs it beside the engines' one.
#[test]
fn bad_jobs_fail_alike_under_every_policy() {
    check_under_every_policy("bad jobs among good ones", &bad_among_good(), None);
}

/// The bad jobs, each after three good CBC encryptions.
fn bad_among_good() -> Vec<Case> {
    let bad = bad_cases();
    let good = cbc_encrypt_batch(0x04, bad.len() * 3);
    let mut mixed = Vec::new();
    for (i, good) in good.into_iter().enumerate() {
        mixed.push(good);
        if i % 3 == 2 {
            mixed.push(bad[i / 3].clone());
        }
    }
    mixed
}

/// `Job::validate`, the checks every engine runs first, as a table.
#[test]
fn job_validate_table() {
    let key = KeyId(0);
    let with = |c: Cipher, d: Direction, iv: &[u8], len: usize| {
        Job::with_iv(c, d, key, iv, vec![0; len]).expect("IV of at most 16 bytes")
    };
    let (enc, dec) = (Direction::Encrypt, Direction::Decrypt);
    let tag = [0u8; TAG_LEN];
    let table: Vec<(Job, Option<Fail>)> = vec![
        (with(Cipher::AES_128_CBC, enc, &[0; 16], 0), None),
        (with(Cipher::AES_128_CBC, enc, &[0; 16], 32), None),
        (with(Cipher::AES_128_CBC, dec, &[0; 16], 32), None),
        (
            with(Cipher::AES_128_CBC, enc, &[0; 16], 31),
            Some(Fail::InputLength(31)),
        ),
        (
            with(Cipher::AES_192_CBC, dec, &[0; 16], 1),
            Some(Fail::InputLength(1)),
        ),
        (
            with(Cipher::AES_256_CBC, enc, &[0; 12], 16),
            Some(Fail::IvLength(12)),
        ),
        (with(Cipher::AES_128_CBC_PKCS7, enc, &[0; 16], 0), None),
        (with(Cipher::AES_128_CBC_PKCS7, enc, &[0; 16], 17), None),
        (with(Cipher::AES_128_CBC_PKCS7, dec, &[0; 16], 16), None),
        (
            with(Cipher::AES_128_CBC_PKCS7, dec, &[0; 16], 17),
            Some(Fail::InputLength(17)),
        ),
        (
            with(Cipher::AES_256_CBC_PKCS7, dec, &[0; 16], 0),
            Some(Fail::InputLength(0)),
        ),
        (with(Cipher::AES_128_CTR, enc, &[0; 16], 17), None),
        (with(Cipher::AES_192_CTR, dec, &[0; 16], 0), None),
        (
            with(Cipher::AES_128_CTR, enc, &[0; 8], 16),
            Some(Fail::IvLength(8)),
        ),
        (with(Cipher::AES_128_GCM, enc, &[0; 12], 0), None),
        (with(Cipher::AES_128_GCM, enc, &[0; 12], 17), None),
        (with(Cipher::AES_128_GCM, dec, &[0; 12], 17).tag(tag), None),
        (
            with(Cipher::AES_256_GCM, dec, &[0; 12], 0),
            Some(Fail::MissingTag),
        ),
        (
            with(Cipher::AES_192_GCM, enc, &[0; 16], 16),
            Some(Fail::IvLength(16)),
        ),
        (
            with(Cipher::AES_128_GCM, enc, &[], 16),
            Some(Fail::IvLength(0)),
        ),
        (
            Job::new(Cipher::AES_128_GCM, enc, key, [0; 16], vec![]),
            Some(Fail::IvLength(16)),
        ),
        (
            Job::new(Cipher::AES_128_CTR, enc, key, [0; 16], vec![1; 5]),
            None,
        ),
    ];
    for (job, want) in table {
        let got = job.validate();
        let ok = match (&got, want) {
            (Ok(()), None) => true,
            (Err(e), Some(fail)) => fail.matches(e, job.cipher),
            _ => false,
        };
        assert!(
            ok,
            "{} {} iv {} len {} tag {}: got {got:?}, want {want:?}",
            job.cipher,
            job.direction,
            job.iv().len(),
            job.len(),
            job.tag.is_some()
        );
    }
    // An IV longer than a block is refused when the job is built.
    match Job::with_iv(Cipher::AES_128_GCM, enc, key, &[0; 17], vec![]) {
        Err(Error::IvLength {
            got: 17,
            expected: 12,
            ..
        }) => {}
        other => panic!("a 17-byte nonce gave {other:?}"),
    }
}

/// A dispatcher whose only engine failed refuses later batches job by job with
/// `NoEngine`: no panic, nothing run, nothing counted twice.
#[test]
fn batches_after_the_only_engine_failed() {
    let inner = CpuEngine::with_lanes(1).into_engine();
    let flaky = FaultyEngine::new(FLAKY, inner, Fault::AfterJobs(0)).into_engine();
    let dispatcher = Dispatcher::new(vec![flaky]).expect("one engine");
    let key = dispatcher
        .add_key(hetcrypt::Key::new(vec![7; 16]))
        .expect("a 16-byte key");
    let jobs: Vec<Job> = (0..5u8)
        .map(|i| {
            Job::new(
                Cipher::AES_128_CTR,
                Direction::Encrypt,
                key,
                [i; 16],
                vec![i; 100],
            )
        })
        .collect();
    let mut failures = Failures::default();
    for round in [
        "first batch (the engine fails)",
        "second batch (quarantined)",
    ] {
        let batch = match run_batch(&dispatcher, &jobs, &policy::Pull) {
            Ok(b) => b,
            Err(e) => {
                failures.push(format!("{round}: {e}"));
                continue;
            }
        };
        for (i, out) in batch.outputs.iter().enumerate() {
            if !matches!(out, Err(Error::NoEngine { .. })) {
                failures.push(format!("{round}: job {i} gave {out:?}, want NoEngine"));
            }
        }
        let flaky = batch
            .report
            .engine(FLAKY)
            .expect("the report lists every engine");
        if flaky.jobs != 0 || flaky.failed.is_none() {
            failures.push(format!(
                "{round}: flaky did {} jobs, failed {:?}; want 0 jobs and a reason",
                flaky.jobs, flaky.failed
            ));
        }
    }
    failures.assert_none("batches after the only engine failed");
}

/// Output slots as a caller may hand them to [`Dispatcher::run_into`] before any batch
/// of its own: buffers of other lengths full of junk, with and without tags, and
/// errors of an earlier batch. None of it may show in a result.
fn junk_outputs(n: usize) -> Vec<Result<hetcrypt::JobOutput, Error>> {
    (0..n)
        .map(|i| match i % 3 {
            0 => Err(Error::AuthenticationFailed),
            _ => Ok(hetcrypt::JobOutput {
                data: vec![0xa5; i * 13 % 700],
                tag: (i % 2 == 0).then_some([0x5a; TAG_LEN]),
            }),
        })
        .collect()
}

/// Issue 23's bulk path: one lane and nothing deferred, so the batch runs in-line on
/// the caller's thread and the lane writes straight into the output vector it is
/// given. Random jobs of every cipher with bad ones among them, three rounds into the
/// same vector (junk at first, then the previous round's outputs, then half of them):
/// every output byte-identical to OpenSSL's and in job order, each bad job its own
/// error, every job done once. On both `cpu` implementations, under `only` and `pull`.
#[test]
fn in_line_batches_into_reused_outputs() {
    let bad = bad_cases();
    let good = random_cases(0x23, scaled(400));
    let mut cases = Vec::new();
    for (i, good) in good.into_iter().enumerate() {
        cases.push(good);
        if i % 4 == 3 {
            cases.push(bad[(i / 4) % bad.len()].clone());
        }
    }
    let refs: Vec<&Case> = cases.iter().collect();
    let mut failures = Failures::default();
    for engine in common::cpu_implementations() {
        let name = engine.name().to_string();
        let dispatcher = Dispatcher::new(vec![engine]).expect("one engine");
        let jobs = bind(&dispatcher, &refs);
        for policy in [format!("only:{name}"), "pull".to_string()] {
            let policy = policy::by_name(&policy).expect("a known policy");
            let mut outputs = junk_outputs(jobs.len() + 5);
            for round in 0..3 {
                let path = format!("{name} in-line under {}, round {round}", policy.name());
                if round == 2 {
                    outputs.truncate(jobs.len() / 2);
                }
                match dispatcher.run_into(&jobs, policy.as_ref(), &mut outputs) {
                    Ok(report) => {
                        let batch = hetcrypt::BatchResult {
                            outputs: std::mem::take(&mut outputs),
                            report,
                        };
                        check_report(&mut failures, &path, &batch, jobs.len());
                        for (case, got) in cases.iter().zip(&batch.outputs) {
                            failures.check(&path, case, got);
                        }
                        outputs = batch.outputs;
                    }
                    Err(e) => failures.push(format!("{path}: {e}")),
                }
            }
        }
    }
    failures.assert_none("in-line batches into reused outputs");
}

/// The in-line lane's engine fails in the middle of a pull (after 37 jobs; pulls are
/// 16 wide): the jobs it finished keep their outputs, the ones it held and those still
/// queued end with `NoEngine` (no other engine), none is lost or done twice, and the
/// next batch, with the engine quarantined, fails every job the same way.
#[test]
fn in_line_lane_whose_engine_fails_mid_pull() {
    /// Jobs the engine runs before failing: not a multiple of the pull width.
    const RUNS_BEFORE_FAULT: usize = 37;
    let inner = CpuEngine::with_lanes(1).into_engine();
    let flaky = FaultyEngine::new(FLAKY, inner, Fault::AfterJobs(RUNS_BEFORE_FAULT));
    let dispatcher = Dispatcher::new(vec![flaky.into_engine()]).expect("one engine");
    let key = [7u8; 16];
    let id = dispatcher
        .add_key(hetcrypt::Key::new(key.to_vec()))
        .expect("a 16-byte key");
    let jobs: Vec<Job> = (0..100u8)
        .map(|i| {
            Job::new(
                Cipher::AES_128_CTR,
                Direction::Encrypt,
                id,
                [i; 16],
                vec![i; 16],
            )
        })
        .collect();
    let mut failures = Failures::default();
    let mut outputs = junk_outputs(jobs.len());
    for round in ["the engine fails", "quarantined"] {
        let report = match dispatcher.run_into(&jobs, &policy::Only::new(FLAKY), &mut outputs) {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{round}: {e}"));
                continue;
            }
        };
        let ran = if round == "the engine fails" {
            RUNS_BEFORE_FAULT
        } else {
            0
        };
        if outputs.len() != jobs.len() {
            failures.push(format!("{round}: {} outputs", outputs.len()));
        }
        for (i, (job, out)) in jobs.iter().zip(&outputs).enumerate() {
            if i < ran {
                let (want, _) = reference_encrypt(job.cipher, &key, job.iv(), &[], &job.input);
                if !matches!(out, Ok(o) if o.data == want && o.tag.is_none()) {
                    failures.push(format!("{round}: job {i} gave {out:?}, want {want:02x?}"));
                }
            } else if !matches!(out, Err(Error::NoEngine { .. })) {
                failures.push(format!("{round}: job {i} gave {out:?}, want NoEngine"));
            }
        }
        let done = report.engine(FLAKY).expect("the report lists every engine");
        if done.jobs != ran || done.failed.is_none() || report.jobs != jobs.len() {
            failures.push(format!(
                "{round}: flaky did {} jobs of {}, failed {:?}; want {ran} and a reason",
                done.jobs, report.jobs, done.failed
            ));
        }
    }
    failures.assert_none("in-line lane whose engine fails mid-pull");
}

/// An engine quarantined in an earlier batch, under `only:` it: its jobs move to the
/// other engine, whose one lane then runs in-line (the only lane left) and takes them
/// from the re-dispatch queue: byte-identical outputs, in job order, all counted as
/// re-dispatched.
#[test]
fn in_line_lane_takes_a_quarantined_engines_jobs() {
    let flaky = FaultyEngine::new(FLAKY, CpuEngine::with_lanes(1).into_engine(), Fault::OnOpen);
    let dispatcher = Dispatcher::new(vec![
        flaky.into_engine(),
        CpuEngine::with_lanes(1).into_engine(),
    ])
    .expect("two engines");
    let key = [9u8; 16];
    let id = dispatcher
        .add_key(hetcrypt::Key::new(key.to_vec()))
        .expect("a 16-byte key");
    let jobs: Vec<Job> = (0..200usize)
        .map(|i| {
            Job::new(
                Cipher::AES_128_CTR,
                Direction::Encrypt,
                id,
                [i as u8; 16],
                vec![i as u8; i % 70],
            )
        })
        .collect();
    let mut failures = Failures::default();
    let mut outputs = junk_outputs(jobs.len());
    for round in ["flaky fails to open", "flaky quarantined"] {
        let report = match dispatcher.run_into(&jobs, &policy::Only::new(FLAKY), &mut outputs) {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{round}: {e}"));
                continue;
            }
        };
        for (i, (job, out)) in jobs.iter().zip(&outputs).enumerate() {
            let (want, _) = reference_encrypt(job.cipher, &key, job.iv(), &[], &job.input);
            if !matches!(out, Ok(o) if o.data == want) {
                failures.push(format!("{round}: job {i} gave {out:?}, want {want:02x?}"));
            }
        }
        let cpu = report.engine("cpu").expect("the report lists every engine");
        if cpu.jobs != jobs.len() || report.redispatched != jobs.len() {
            failures.push(format!(
                "{round}: cpu did {} jobs, {} re-dispatched; want {} of each",
                cpu.jobs,
                report.redispatched,
                jobs.len()
            ));
        }
    }
    failures.assert_none("in-line lane takes a quarantined engine's jobs");
}
