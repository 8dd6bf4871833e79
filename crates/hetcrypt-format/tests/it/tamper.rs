//! Tampering: a flipped byte in every region, truncation at every chunk boundary and
//! inside chunks, appended garbage, a wrong key, a modified wrapper. Each fails with
//! the right error, and nothing but authenticated chunks was written.

use crate::common;

use hetcrypt::policy::Pull;
use hetcrypt_format::{Aead, FormatError, OpenParams, SealParams, CHUNK_SIZE};

/// Wrapper (12) + salt (24) + commitment (32).
const HEADER: usize = 12 + 56;

fn setup(aead: Aead) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let key = common::pattern(aead.key_len(), 7);
    let pt = common::pattern(3 * CHUNK_SIZE + 1000, 8);
    let ct = common::seal(&common::cpu(), &Pull, &key, SealParams::new(aead), &pt, 2).unwrap();
    (key, pt, ct)
}

fn open(key: &[u8], ct: &[u8]) -> common::Opened {
    common::open(&common::cpu(), &Pull, key, OpenParams::Hetcrypt, ct, 2)
}

/// What a failed stream wrote must be whole authenticated chunks of the plaintext.
fn check_prefix(o: &common::Opened, pt: &[u8], what: &str) {
    assert_eq!(
        o.written.len() % CHUNK_SIZE,
        0,
        "{what}: partial chunk written"
    );
    assert!(pt.starts_with(&o.written), "{what}: wrote non-plaintext");
}

#[test]
fn flipped_byte_in_every_region() {
    for aead in Aead::ALL {
        let (key, pt, ct) = setup(aead);
        let full = aead.full_chunk_len();
        let mut positions = vec![
            (0, "magic"),
            (8, "version"),
            (9, "aead id"),
            (10, "hash id"),
            (11, "reserved"),
            (12, "salt"),
            (12 + 23, "salt end"),
            (12 + 24, "commitment"),
            (HEADER - 1, "commitment end"),
        ];
        for chunk in 0..4 {
            let start = HEADER + chunk * full;
            let len = if chunk < 3 { full } else { ct.len() - start };
            positions.push((start, "chunk start"));
            positions.push((start + len / 2, "chunk middle"));
            positions.push((start + len - 1, "chunk tag"));
        }
        for (at, region) in positions {
            let mut bad = ct.clone();
            bad[at] ^= 0x01;
            let o = open(&key, &bad);
            let what = format!("{aead} flip at {at} ({region})");
            let err = o.result.as_ref().expect_err(&what);
            let ok = match at {
                0..8 => matches!(err, FormatError::NotHetcrypt),
                8 => matches!(err, FormatError::UnsupportedVersion(_)),
                // A different AEAD id or hash id that exists still changes the context,
                // so the commitment fails; an unknown one is refused outright; the tree
                // flag set makes it a tree member, refused alone.
                9..12 => matches!(
                    err,
                    FormatError::UnknownId { .. }
                        | FormatError::WrongKey
                        | FormatError::KeyLength { .. }
                        | FormatError::TreeMember
                ),
                12..HEADER => matches!(err, FormatError::WrongKey),
                _ => {
                    let chunk = ((at - HEADER) / full) as u64;
                    matches!(err, FormatError::Tampered { chunk: c, .. } if *c == chunk)
                }
            };
            assert!(ok, "{what}: wrong error {err:?}");
            if at < HEADER {
                assert_eq!(
                    o.stats.jobs, 0,
                    "{what}: a chunk was decrypted before the header check"
                );
            }
            check_prefix(&o, &pt, &what);
        }
    }
}

#[test]
fn truncation_at_every_boundary_and_inside_chunks() {
    for aead in Aead::ALL {
        let (key, pt, ct) = setup(aead);
        let full = aead.full_chunk_len();
        let mut cuts = vec![0, 5, 12, 30, HEADER - 1, HEADER];
        for chunk in 1..=3 {
            cuts.push(HEADER + chunk * full); // every chunk boundary
            cuts.push(HEADER + chunk * full - 1);
            cuts.push(HEADER + chunk * full + 1);
        }
        cuts.push(ct.len() - 1);
        cuts.push(ct.len() - 16);
        for cut in cuts {
            let o = open(&key, &ct[..cut]);
            let what = format!("{aead} cut at {cut} of {}", ct.len());
            let err = o.result.as_ref().expect_err(&what);
            let ok = if cut < 12 {
                matches!(err, FormatError::NotHetcrypt)
            } else if cut <= HEADER || (cut - HEADER).is_multiple_of(full) {
                matches!(err, FormatError::Truncated(_))
            } else {
                // Cut inside a chunk: that chunk becomes a short, forged final chunk.
                matches!(
                    err,
                    FormatError::Tampered { .. } | FormatError::Truncated(_)
                )
            };
            assert!(ok, "{what}: wrong error {err:?}");
            check_prefix(&o, &pt, &what);
        }
    }
}

#[test]
fn appended_data_and_wrong_key() {
    for aead in Aead::ALL {
        let (key, pt, ct) = setup(aead);
        for extra in [
            1usize,
            15,
            16,
            17,
            aead.full_chunk_len(),
            3 * aead.full_chunk_len() + 5,
        ] {
            let mut bad = ct.clone();
            bad.extend(common::pattern(extra, extra as u64));
            let o = open(&key, &bad);
            let what = format!("{aead} +{extra} bytes");
            let err = o.result.as_ref().expect_err(&what);
            assert!(
                matches!(
                    err,
                    FormatError::Tampered { .. } | FormatError::Truncated(_)
                ),
                "{what}: {err:?}"
            );
            check_prefix(&o, &pt, &what);
        }
        // Appending a whole valid encrypted file does not help either.
        let mut doubled = ct.clone();
        doubled.extend_from_slice(&ct);
        assert!(open(&key, &doubled).result.is_err(), "{aead}: doubled");

        let mut other = key.clone();
        other[0] ^= 0x80;
        let o = open(&other, &ct);
        assert!(matches!(o.result, Err(FormatError::WrongKey)), "{aead}");
        assert_eq!(o.stats.jobs, 0);
        assert!(o.written.is_empty());
        assert_eq!(
            FormatError::WrongKey.to_string(),
            "wrong key, or not a hetcrypt file (the key commitment does not match)"
        );
    }
}

#[test]
fn chunks_swapped_or_duplicated() {
    for aead in Aead::ALL {
        let (key, _pt, ct) = setup(aead);
        let full = aead.full_chunk_len();
        let chunk = |i: usize| ct[HEADER + i * full..HEADER + (i + 1) * full].to_vec();
        let mut swapped = ct[..HEADER].to_vec();
        swapped.extend(chunk(1));
        swapped.extend(chunk(0));
        swapped.extend_from_slice(&ct[HEADER + 2 * full..]);
        assert!(
            matches!(
                open(&key, &swapped).result,
                Err(FormatError::Tampered { chunk: 0, .. })
            ),
            "{aead}"
        );
        let mut duplicated = ct[..HEADER].to_vec();
        duplicated.extend(chunk(0));
        duplicated.extend(chunk(0));
        duplicated.extend_from_slice(&ct[HEADER + 2 * full..]);
        assert!(
            matches!(
                open(&key, &duplicated).result,
                Err(FormatError::Tampered { chunk: 1, .. })
            ),
            "{aead}"
        );
    }
}

#[test]
fn not_a_hetcrypt_file() {
    let key = [0u8; 16];
    for input in [
        &b""[..],
        b"hello world, this is plain text and not a hetcrypt file at all",
    ] {
        assert!(matches!(
            open(&key, input).result,
            Err(FormatError::NotHetcrypt)
        ));
    }
}

/// Issue 19, items 8 and 11: when the input's length is known (a file), a length no
/// message can have fails before any chunk job runs, and says truncated; a cut inside
/// the last chunk that the length cannot reveal is named as a possible truncation.
#[test]
fn a_length_no_message_can_have_fails_before_any_chunk_and_says_truncated() {
    for aead in [Aead::Aes128Gcm, Aead::Aes128CbcHmacSha256] {
        let (key, _pt, ct) = setup(aead);
        let full = aead.full_chunk_len();
        let short_tail = ct.len() - HEADER - 3 * full;
        // Cut 3 bytes into the final chunk, or 5 bytes appended after a full chunk.
        let mut padded = ct[..HEADER + 3 * full].to_vec();
        padded.extend_from_slice(&[0; 5]);
        for bad in [ct[..HEADER + 3 * full + 3].to_vec(), padded] {
            let stream = hetcrypt_format::DecryptStream::new(
                &bad[..],
                Vec::new(),
                &key,
                OpenParams::Hetcrypt,
            )
            .with_input_len(bad.len() as u64);
            let mut keep = Vec::new();
            struct Keep<'a>(&'a mut Vec<Result<(), FormatError>>);
            impl<S> hetcrypt_format::Observer<S> for Keep<'_> {
                fn done(&mut self, _s: S, r: Result<(), FormatError>) {
                    self.0.push(r);
                }
            }
            let mut p = hetcrypt_format::Pipeline::new(common::cpu(), &Pull).unwrap();
            p.run([stream], &mut Keep(&mut keep)).unwrap();
            let err = keep.pop().unwrap().unwrap_err();
            assert!(
                matches!(err, FormatError::BadLength { len } if len == bad.len() as u64),
                "{aead}: {err}"
            );
            assert!(err.to_string().contains("truncated"), "{err}");
            assert_eq!(p.stats().jobs, 0, "{aead}: a chunk ran");
        }
        // The genuine length passes the check.
        assert!(
            aead.possible_chunks_len((3 * full + short_tail) as u64),
            "{aead}"
        );
        // A cut inside the last chunk that leaves a plausible length.
        let cut = &ct[..ct.len() - 1];
        if aead.possible_chunks_len((cut.len() - HEADER) as u64) {
            let err = open(&key, cut).result.unwrap_err();
            assert!(err.to_string().contains("truncated"), "{aead}: {err}");
        }
    }
}
