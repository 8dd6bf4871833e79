//! The AEADs' names and the lengths a message of each can have (found alive by `cargo
//! mutants`, issue 25): the CLI and IANA names print and parse back, and the length
//! check that fails a cut or padded file at once accepts exactly the lengths the AEAD
//! can produce, and a decrypted chunk's length is checked against its place.

use crate::common;

use hetcrypt::{Dispatcher, JobOutput};
use hetcrypt_format::aead::ChunkKeys;
use hetcrypt_format::{Aead, FormatError, CHUNK_SIZE};

#[test]
fn aead_names_print_and_parse_back() {
    let names = [
        (Aead::Aes128Gcm, "aes-128-gcm", "AEAD_AES_128_GCM"),
        (Aead::Aes256Gcm, "aes-256-gcm", "AEAD_AES_256_GCM"),
        (
            Aead::Aes128CbcHmacSha256,
            "aes-128-cbc-hmac-sha256",
            "AEAD_AES_128_CBC_HMAC_SHA_256",
        ),
    ];
    assert_eq!(names.map(|n| n.0), Aead::ALL);
    for (aead, cli, iana) in names {
        assert_eq!(aead.cli_name(), cli);
        assert_eq!(aead.iana_name(), iana);
        assert_eq!(aead.to_string(), cli, "Display is the CLI name");
        // Either name, in any case.
        for s in [cli, iana, &cli.to_uppercase(), &iana.to_lowercase()] {
            assert_eq!(s.parse::<Aead>(), Ok(aead), "{s}");
        }
    }
    let err = "aes-128-ccm".parse::<Aead>().unwrap_err();
    assert!(err.contains("'aes-128-ccm'"), "{err}");
    assert!(
        err.contains("aes-128-gcm, aes-256-gcm, aes-128-cbc-hmac-sha256"),
        "the error lists the known names: {err}"
    );
}

#[test]
fn only_lengths_the_aead_can_produce_pass_the_length_check() {
    // GCM: any final chunk of at least the 16-byte tag.
    for aead in [Aead::Aes128Gcm, Aead::Aes256Gcm] {
        let full = aead.full_chunk_len() as u64;
        assert_eq!(full, 16384 + 16);
        for (len, possible) in [
            (16, true),
            (15, false),
            (17, true),
            (0, false),
            (full, false),
            (full + 16, true),
            (3 * full + 15, false),
            (3 * full + 100, true),
        ] {
            assert_eq!(
                aead.possible_chunks_len(len),
                possible,
                "{aead}: {len} bytes"
            );
        }
    }
    // CBC-HMAC: a final chunk of whole padded blocks (at least one) and the 16-byte
    // tag (HMAC-SHA-256 cut to 128 bits, T_LEN in RFC 7518 5.2.3), so at least 32 bytes and a
    // multiple of 16.
    let cbc = Aead::Aes128CbcHmacSha256;
    assert_eq!(cbc.min_chunk_len(), 32);
    let full = cbc.full_chunk_len() as u64;
    assert_eq!(full, 16384 + 16 + 16);
    for (len, possible) in [
        (32, true),
        (48, true),
        (16, false), // whole blocks, but too short to hold a block and the tag
        (33, false), // long enough, but not whole blocks
        (31, false),
        (0, false),
        (full, false),
        (2 * full + 32, true),
        (2 * full + 40, false),
    ] {
        assert_eq!(cbc.possible_chunks_len(len), possible, "{cbc}: {len} bytes");
    }
}

/// Every chunk but the last is full, the last one shorter: a full last chunk means the
/// final short chunk is missing, a short middle chunk that the key opened can only be
/// an encryptor's doing.
#[test]
fn a_chunk_is_accepted_only_at_a_length_its_place_allows() {
    let d = Dispatcher::new(common::cpu()).unwrap();
    let aead = Aead::Aes128Gcm;
    let keys = ChunkKeys::new(&d, aead, &[1; 16], &[2; 12]).unwrap();
    let out = |len: usize| {
        Ok(JobOutput {
            data: vec![0; len],
            tag: None,
        })
    };
    assert_eq!(
        keys.open_finish(0, out(CHUNK_SIZE), false).unwrap().len(),
        CHUNK_SIZE
    );
    assert_eq!(
        keys.open_finish(3, out(CHUNK_SIZE - 1), true)
            .unwrap()
            .len(),
        CHUNK_SIZE - 1
    );
    assert!(keys.open_finish(3, out(0), true).unwrap().is_empty());
    match keys.open_finish(3, out(CHUNK_SIZE), true) {
        Err(FormatError::Truncated(why)) => assert!(why.contains("missing"), "{why}"),
        other => panic!("a full last chunk: {other:?}"),
    }
    match keys.open_finish(2, out(CHUNK_SIZE - 1), false) {
        Err(FormatError::Tampered { chunk: 2, .. }) => {}
        other => panic!("a short middle chunk: {other:?}"),
    }
    match keys.open_finish(5, Err(hetcrypt::Error::AuthenticationFailed), true) {
        Err(FormatError::Tampered { chunk: 5, .. }) => {}
        other => panic!("a chunk that failed authentication: {other:?}"),
    }
}
