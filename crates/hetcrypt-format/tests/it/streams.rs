//! What the streams and key types promise beyond the bytes they write (found alive by
//! `cargo mutants`, issue 25): a decrypted message's key leaves the dispatcher, both
//! streams flush their writer when they finish, a decryption cut short does not finish,
//! the byte counters count, reads interrupted by a signal are retried, no `Debug` of a
//! key-holding type shows key material, and the KDF's context limit and hash names.

use crate::common;

use std::io::{self, BufWriter, ErrorKind, Read};

use hetcrypt::policy::Pull;
use hetcrypt::Dispatcher;
use hetcrypt_format::aead::{CbcHmacKeys, ChunkKeys};
use hetcrypt_format::kdf::{self, Hash, MAX_CONTEXT_LEN};
use hetcrypt_format::{
    Aead, DecryptStream, EncryptStream, FormatError, Observer, OpenParams, Pipeline, SealParams,
    Stream, CHUNK_SIZE,
};

/// A key byte that stands out in any rendering: `165` in decimal, `a5` in hex.
const KEY_BYTE: u8 = 0xA5;

/// Keeps every finished stream with its result.
struct Results<S>(Vec<(S, hetcrypt_format::Result<()>)>);

impl<S> Observer<S> for Results<S> {
    fn done(&mut self, stream: S, result: hetcrypt_format::Result<()>) {
        self.0.push((stream, result));
    }
}

/// Whether `text` shows `KEY_BYTE` as a number, decimal or hex.
fn shows_key_byte(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower.contains("165") || lower.contains("a5")
}

#[test]
fn many_decryptions_on_one_dispatcher_leave_no_key_behind() {
    let key = [6u8; 32];
    let n = 300;
    let pts: Vec<Vec<u8>> = (0..n).map(|i| common::pattern(i % 50, i as u64)).collect();
    // Sealed in one pipeline run (one dispatcher, not 300): streams finish in order.
    let seals = pts.iter().map(|pt| {
        EncryptStream::new(
            &pt[..],
            Vec::new(),
            &key,
            SealParams::new(Aead::Aes128CbcHmacSha256),
        )
    });
    let mut sealed = Results(Vec::new());
    Pipeline::new(common::cpu(), &Pull)
        .unwrap()
        .run(seals, &mut sealed)
        .unwrap();
    let cts: Vec<Vec<u8>> = sealed
        .0
        .into_iter()
        .map(|(stream, result)| {
            result.unwrap();
            stream.into_parts().1
        })
        .collect();
    assert_eq!(cts.len(), n);
    let streams = cts
        .iter()
        .map(|ct| DecryptStream::new(&ct[..], Vec::new(), &key, OpenParams::Hetcrypt));
    let mut results = Results(Vec::new());
    let mut p = Pipeline::new(common::cpu(), &Pull).unwrap();
    p.run(streams, &mut results).unwrap();
    assert_eq!(results.0.len(), n);
    assert!(
        p.dispatcher().keys().is_empty(),
        "{} message keys left registered after decryption",
        p.dispatcher().keys().len()
    );
    for (i, (stream, result)) in results.0.into_iter().enumerate() {
        result.unwrap();
        assert!(stream.into_parts().1 == pts[i], "message {i}");
    }
}

#[test]
fn both_streams_flush_their_writer_when_they_finish() {
    // A buffer far larger than the message: nothing reaches the Vec unless flushed.
    const ROOM: usize = 1 << 20;
    let key = [3u8; 16];
    let pt = common::pattern(2 * CHUNK_SIZE + 9, 17);
    let sealed = EncryptStream::new(
        &pt[..],
        BufWriter::with_capacity(ROOM, Vec::new()),
        &key,
        SealParams::new(Aead::Aes128Gcm),
    );
    let mut results = Results(Vec::new());
    Pipeline::new(common::cpu(), &Pull)
        .unwrap()
        .run([sealed], &mut results)
        .unwrap();
    let (stream, result) = results.0.pop().expect("one stream");
    result.unwrap();
    let writer = stream.into_parts().1;
    assert!(
        writer.buffer().is_empty(),
        "encryption finished with {} bytes unflushed",
        writer.buffer().len()
    );
    let ct = writer.into_inner().expect("nothing left to flush");

    let opened = DecryptStream::new(
        &ct[..],
        BufWriter::with_capacity(ROOM, Vec::new()),
        &key,
        OpenParams::Hetcrypt,
    );
    let mut results = Results(Vec::new());
    Pipeline::new(common::cpu(), &Pull)
        .unwrap()
        .run([opened], &mut results)
        .unwrap();
    let (stream, result) = results.0.pop().expect("one stream");
    result.unwrap();
    let writer = stream.into_parts().1;
    assert!(
        writer.buffer().is_empty(),
        "decryption finished with {} bytes unflushed",
        writer.buffer().len()
    );
    assert!(writer.into_inner().expect("flushed") == pt);
}

#[test]
fn a_decryption_whose_chunks_did_not_all_come_back_does_not_finish() {
    let key = [4u8; 16];
    let pt = common::pattern(3 * CHUNK_SIZE + 1, 23);
    let ct = common::seal(
        &common::cpu(),
        &Pull,
        &key,
        SealParams::new(Aead::Aes128Gcm),
        &pt,
        4,
    )
    .unwrap();
    let truncated = |s: &mut DecryptStream<&[u8], Vec<u8>>| {
        let r = s.finish();
        assert!(matches!(r, Err(FormatError::Truncated(_))), "{r:?}");
    };
    // Nothing read yet.
    truncated(&mut DecryptStream::new(
        &ct[..],
        Vec::new(),
        &key,
        OpenParams::Hetcrypt,
    ));
    // Every chunk handed out (the last one seen), none of them accepted.
    let d = Dispatcher::new(common::cpu()).unwrap();
    let mut s = DecryptStream::new(&ct[..], Vec::new(), &key, OpenParams::Hetcrypt);
    let mut jobs = 0;
    while s.next_job(&d).unwrap().is_some() {
        jobs += 1;
    }
    assert_eq!(jobs, 4, "three full chunks and a short one");
    truncated(&mut s);
}

#[test]
fn the_streams_count_the_bytes_they_read_and_write() {
    let key = [5u8; 32];
    for size in [0, 1, CHUNK_SIZE, 2 * CHUNK_SIZE + 100] {
        let pt = common::pattern(size, size as u64 + 3);
        let sealed = EncryptStream::new(
            &pt[..],
            Vec::new(),
            &key,
            SealParams::new(Aead::Aes128CbcHmacSha256),
        );
        let mut results = Results(Vec::new());
        Pipeline::new(common::cpu(), &Pull)
            .unwrap()
            .run([sealed], &mut results)
            .unwrap();
        let (stream, result) = results.0.pop().expect("one stream");
        result.unwrap();
        let (read, written) = (stream.plaintext_bytes(), stream.output_bytes());
        let ct = stream.into_parts().1;
        assert_eq!(read, size as u64, "{size}: plaintext read");
        assert_eq!(written, ct.len() as u64, "{size}: ciphertext written");

        let opened = DecryptStream::new(&ct[..], Vec::new(), &key, OpenParams::Hetcrypt);
        let mut results = Results(Vec::new());
        Pipeline::new(common::cpu(), &Pull)
            .unwrap()
            .run([opened], &mut results)
            .unwrap();
        let (stream, result) = results.0.pop().expect("one stream");
        result.unwrap();
        assert_eq!(stream.input_bytes(), ct.len() as u64, "{size}: input read");
        assert_eq!(
            stream.plaintext_bytes(),
            size as u64,
            "{size}: plaintext out"
        );
    }
}

/// A reader whose every other read fails with `Interrupted` (a signal), and whose
/// reads return at most 1000 bytes.
struct Interrupting<'a> {
    data: &'a [u8],
    interrupt: bool,
}

impl Read for Interrupting<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.interrupt = !self.interrupt;
        if self.interrupt {
            return Err(io::Error::from(ErrorKind::Interrupted));
        }
        let n = buf.len().min(1000);
        self.data.read(&mut buf[..n])
    }
}

#[test]
fn reads_interrupted_by_a_signal_are_retried() {
    let key = [8u8; 16];
    let salt = [0x11; 24];
    let pt = common::pattern(2 * CHUNK_SIZE + 77, 31);
    let params = || SealParams::new(Aead::Aes128Gcm).with_salt_for_tests(salt);
    let expected = common::seal(&common::cpu(), &Pull, &key, params(), &pt, 4).unwrap();

    let reader = Interrupting {
        data: &pt,
        interrupt: false,
    };
    let sealed = EncryptStream::new(reader, Vec::new(), &key, params());
    let mut results = Results(Vec::new());
    Pipeline::new(common::cpu(), &Pull)
        .unwrap()
        .run([sealed], &mut results)
        .unwrap();
    let (stream, result) = results.0.pop().expect("one stream");
    result.unwrap();
    assert!(
        stream.into_parts().1 == expected,
        "encrypted from an interrupted reader"
    );

    let reader = Interrupting {
        data: &expected,
        interrupt: false,
    };
    let opened = DecryptStream::new(reader, Vec::new(), &key, OpenParams::Hetcrypt);
    let mut results = Results(Vec::new());
    Pipeline::new(common::cpu(), &Pull)
        .unwrap()
        .run([opened], &mut results)
        .unwrap();
    let (stream, result) = results.0.pop().expect("one stream");
    result.unwrap();
    assert!(
        stream.into_parts().1 == pt,
        "decrypted from an interrupted reader"
    );
}

#[test]
fn no_debug_of_a_key_holding_type_shows_key_material() {
    let key = [KEY_BYTE; 32];

    let cbc_hmac = format!("{:?}", CbcHmacKeys::new(&key).unwrap());
    assert!(cbc_hmac.contains("CbcHmacKeys") && cbc_hmac.contains("redacted"));
    assert!(!shows_key_byte(&cbc_hmac), "{cbc_hmac}");

    let salt = [0x11; 24];
    let derived = kdf::derive(Hash::Sha256, Aead::Aes256Gcm, &key, &salt, b"ctx").unwrap();
    let shown = format!("{derived:?}");
    assert!(
        shown.contains("Derived") && shown.contains("redacted"),
        "{shown}"
    );
    assert!(
        !shown.contains(&format!("{:?}", &derived.key[..4])),
        "{shown}"
    );
    assert!(!shows_key_byte(&shown), "{shown}");

    let d = Dispatcher::new(common::cpu()).unwrap();
    for aead in Aead::ALL {
        let keys = ChunkKeys::new(
            &d,
            aead,
            &key[..aead.key_len()],
            &vec![KEY_BYTE; aead.nonce_len()],
        )
        .unwrap();
        let shown = format!("{keys:?}");
        assert!(shown.contains("ChunkKeys"), "{shown}");
        assert!(shown.contains(&format!("{aead:?}")), "{shown}");
        assert!(!shows_key_byte(&shown), "{aead}: {shown}");
    }

    let aead = Aead::Aes256Gcm;
    let encrypt = EncryptStream::new(&b"pt"[..], Vec::new(), &key, SealParams::new(aead));
    let shown = format!("{encrypt:?}");
    assert!(shown.contains("EncryptStream"), "{shown}");
    assert!(!shows_key_byte(&shown), "{shown}");
    let decrypt = DecryptStream::new(&b"ct"[..], Vec::new(), &key, OpenParams::Hetcrypt);
    let shown = format!("{decrypt:?}");
    assert!(shown.contains("DecryptStream"), "{shown}");
    assert!(!shows_key_byte(&shown), "{shown}");
}

#[test]
fn the_kdf_takes_a_context_of_512_bytes_and_refuses_one_more() {
    assert_eq!(MAX_CONTEXT_LEN, 512, "the C2SP limit on the context");
    let key = [1u8; 16];
    let salt = [2u8; 24];
    let at_limit = vec![7u8; 512];
    kdf::derive(Hash::Sha256, Aead::Aes128Gcm, &key, &salt, &at_limit).unwrap();
    let over = vec![7u8; 513];
    match kdf::derive(Hash::Sha256, Aead::Aes128Gcm, &key, &salt, &over) {
        Err(FormatError::ContextTooLong(513)) => {}
        other => panic!("a 513-byte context: {other:?}"),
    }
}

#[test]
fn hash_names_print_and_parse_back() {
    assert_eq!(Hash::Sha256.name(), "SHA-256");
    assert_eq!(Hash::Sha512.name(), "SHA-512");
    for h in Hash::ALL {
        assert_eq!(h.to_string(), h.name());
        assert_eq!(h.name().parse::<Hash>(), Ok(h));
        assert_eq!(h.name().to_ascii_lowercase().parse::<Hash>(), Ok(h));
        assert_eq!(h.name().replace('-', "").parse::<Hash>(), Ok(h));
        assert_eq!(Hash::from_id(h.id()), Some(h));
    }
    assert_ne!(Hash::Sha256.id(), Hash::Sha512.id());
    for bad in ["", "sha-1", "sha384", "sha-2566", "SHA 256"] {
        let e = bad.parse::<Hash>().expect_err(bad);
        assert!(e.contains(bad) && e.contains("sha256"), "{bad}: {e}");
    }
    assert_eq!(Hash::from_id(0), None);
    assert_eq!(Hash::from_id(3), None);
}

/// The commitment an encryption reports (what a tree's manifest records of the
/// message) is the one in the header it wrote, after the wrapper and the salt.
#[test]
fn an_encryption_reports_the_key_commitment_it_wrote() {
    use hetcrypt_format::header::WRAPPER_LEN;
    use hetcrypt_format::{COMMITMENT_LEN, SALT_LEN};
    let key = [9u8; 16];
    let pt = common::pattern(100, 4);
    let sealed = EncryptStream::new(&pt[..], Vec::new(), &key, SealParams::new(Aead::Aes128Gcm));
    assert_eq!(sealed.commitment(), None, "nothing written yet");
    let mut results = Results(Vec::new());
    Pipeline::new(common::cpu(), &Pull)
        .unwrap()
        .run([sealed], &mut results)
        .unwrap();
    let (stream, result) = results.0.pop().expect("one stream");
    result.unwrap();
    let reported = stream.commitment().expect("the header was written");
    let ct = stream.into_parts().1;
    let at = WRAPPER_LEN + SALT_LEN;
    assert_eq!(reported[..], ct[at..at + COMMITMENT_LEN]);
}

/// A decryption knows the AEAD once it has read the header: the one the file names.
#[test]
fn a_decryption_reports_the_aead_the_header_names() {
    let key = [6u8; 32];
    for aead in Aead::ALL {
        let key = &key[..aead.key_len()];
        let ct = common::seal(
            &common::cpu(),
            &Pull,
            key,
            SealParams::new(aead),
            b"some plaintext",
            4,
        )
        .unwrap();
        let opened = DecryptStream::new(&ct[..], Vec::new(), key, OpenParams::Hetcrypt);
        assert_eq!(opened.aead(), None, "{aead}: no header read yet");
        let mut results = Results(Vec::new());
        Pipeline::new(common::cpu(), &Pull)
            .unwrap()
            .run([opened], &mut results)
            .unwrap();
        let (stream, result) = results.0.pop().expect("one stream");
        result.unwrap();
        assert_eq!(stream.aead(), Some(aead));
    }
}
