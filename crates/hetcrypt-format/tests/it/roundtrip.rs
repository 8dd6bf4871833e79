//! Round trips at the chunk edges for every AEAD, and the same ciphertext whatever the
//! engines, policy and window (same key, salt and input).

use crate::common;

use hetcrypt_format::kdf::{self, Hash};
use hetcrypt_format::{Aead, OpenParams, SealParams, CHUNK_SIZE};

/// Sizes at the chunk edges, and one that spans many batches (3 MiB + 5).
const SIZES: [usize; 8] = [
    0,
    1,
    16383,
    16384,
    16385,
    32768,
    3 * 16384 + 7,
    3 * 1024 * 1024 + 5,
];

fn key_for(aead: Aead) -> Vec<u8> {
    common::pattern(aead.key_len(), 0xC2)
}

#[test]
fn round_trips_at_chunk_edges() {
    for aead in Aead::ALL {
        let key = key_for(aead);
        for size in SIZES {
            let pt = common::pattern(size, size as u64 + 1);
            let ct = common::seal(
                &common::cpu(),
                &hetcrypt::policy::Pull,
                &key,
                SealParams::new(aead),
                &pt,
                16,
            )
            .unwrap();
            // wrapper 12 + salt 24 + commitment 32, then full chunks and a short one.
            let chunks = size / CHUNK_SIZE;
            let expected =
                12 + 56 + chunks * aead.full_chunk_len() + aead.ciphertext_len(size % CHUNK_SIZE);
            assert_eq!(ct.len(), expected, "{aead} {size}");
            let opened = common::open(
                &common::cpu(),
                &hetcrypt::policy::Pull,
                &key,
                OpenParams::Hetcrypt,
                &ct,
                16,
            );
            opened
                .result
                .unwrap_or_else(|e| panic!("{aead} {size}: {e}"));
            assert!(opened.written == pt, "{aead} {size}");
            // Two encryptions never share a salt.
            let again = common::seal(
                &common::cpu(),
                &hetcrypt::policy::Pull,
                &key,
                SealParams::new(aead),
                &pt,
                16,
            )
            .unwrap();
            assert_ne!(again[12..36], ct[12..36], "{aead} {size}: salt repeated");
        }
    }
}

#[test]
fn same_ciphertext_whatever_engines_policy_and_window() {
    let salt = [0x5a; 24];
    for aead in Aead::ALL {
        let key = key_for(aead);
        let pt = common::pattern(5 * CHUNK_SIZE + 123, 99);
        let mut reference: Option<Vec<u8>> = None;
        for (config, engines, policy) in common::configurations() {
            for window in [1, 3, 256] {
                let params = SealParams::new(aead).with_salt_for_tests(salt);
                let ct =
                    common::seal(&engines, policy.as_ref(), &key, params, &pt, window).unwrap();
                match &reference {
                    None => reference = Some(ct),
                    Some(r) => assert!(*r == ct, "{aead} {config} window {window}: differs"),
                }
            }
        }
    }
}

#[test]
fn chunks_of_one_message_spread_over_engines() {
    use hetcrypt_format::{EncryptStream, Observer};
    /// Keeps the one stream's ciphertext.
    struct Written(Option<Vec<u8>>);
    impl<'a> Observer<EncryptStream<&'a [u8], Vec<u8>>> for Written {
        fn done(
            &mut self,
            stream: EncryptStream<&'a [u8], Vec<u8>>,
            r: hetcrypt_format::Result<()>,
        ) {
            r.unwrap();
            self.0 = Some(stream.into_parts().1);
        }
    }
    let pt = common::pattern(64 * CHUNK_SIZE, 5);
    let salt = [0x3c; 24];
    for aead in Aead::ALL {
        let key = key_for(aead);
        let params = SealParams::new(aead).with_salt_for_tests(salt);
        let stream = EncryptStream::new(&pt[..], Vec::new(), &key, params);
        // Round-robin deals the chunks to the engines in turn, so both certainly get
        // some (under `pull` one lane may drain a batch before the other starts).
        let policy = hetcrypt::policy::RoundRobin::new();
        let mut p = hetcrypt_format::Pipeline::new(common::two_engines(), &policy).unwrap();
        let mut written = Written(None);
        p.run([stream], &mut written).unwrap();
        let stats = p.stats();
        assert_eq!(stats.jobs, 65, "{aead}: 64 full chunks and an empty one");
        assert_eq!(stats.engines.iter().map(|e| e.jobs).sum::<u64>(), 65);
        for e in &stats.engines {
            assert!(e.jobs > 0, "{aead}: {} ran none of the chunks", e.name);
        }
        // Spread over two engines, the message is the one a single engine writes.
        let alone = common::seal(
            &common::cpu(),
            &hetcrypt::policy::Pull,
            &key,
            SealParams::new(aead).with_salt_for_tests(salt),
            &pt,
            16,
        )
        .unwrap();
        assert!(
            written.0.expect("the stream finished") == alone,
            "{aead}: spread over engines, the ciphertext differs"
        );
    }
}

#[test]
fn sha256_instantiation_known_answer() {
    // HKDF-Expand-SHA-256 of key 00..1f, info "c2sp.org/chunked-encryption@v1+"
    // "AEAD_AES_128_CBC_HMAC_SHA_256" 0x00, salt 10..27, context "ctx": computed with
    // Python's hmac/hashlib (RFC 5869 2.3 written out), independently of OpenSSL.
    let expected = "3381a85bdae4c1754ffbc2e2f0d89b56059a14a15cb16b273d5f06fa8b980d23\
                    e11952c6429f1b3eb94773606cd999f1\
                    df2444e6315073bbfabc8e930f512fc9466788d7b5b7b226f42f8ec279c9844b";
    let key: Vec<u8> = (0u8..32).collect();
    let salt: [u8; 24] = core::array::from_fn(|i| 0x10 + i as u8);
    let d = kdf::derive(Hash::Sha256, Aead::Aes128CbcHmacSha256, &key, &salt, b"ctx").unwrap();
    let got = [&d.key[..], &d.base_nonce[..], &d.commitment[..]].concat();
    let hex: String = got.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, expected);

    // And a SHA-256 message round-trips (the wrapper names the hash).
    let params = SealParams::new(Aead::Aes128CbcHmacSha256).hash(Hash::Sha256);
    let ct = common::seal(
        &common::cpu(),
        &hetcrypt::policy::Pull,
        &key,
        params,
        b"sha-256",
        4,
    )
    .unwrap();
    assert_eq!(ct[10], Hash::Sha256.id());
    let opened = common::open(
        &common::cpu(),
        &hetcrypt::policy::Pull,
        &key,
        OpenParams::Hetcrypt,
        &ct,
        4,
    );
    opened.result.unwrap();
    assert_eq!(opened.written, b"sha-256");
}

#[test]
fn key_length_must_match_the_aead() {
    for aead in Aead::ALL {
        let wrong = vec![1u8; if aead.key_len() == 16 { 32 } else { 16 }];
        let err = common::seal(
            &common::cpu(),
            &hetcrypt::policy::Pull,
            &wrong,
            SealParams::new(aead),
            b"x",
            4,
        )
        .unwrap_err();
        assert!(
            matches!(err, hetcrypt_format::FormatError::KeyLength { .. }),
            "{aead}: {err:?}"
        );
    }
}
