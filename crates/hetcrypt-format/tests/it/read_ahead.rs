//! Reading several chunks per system call (`read_ahead`, issue 24) changes nothing a
//! message holds: the same ciphertext as reading one chunk at a time at every chunk
//! boundary, whatever the reader returns per call and wherever the pipeline's windows
//! cut the message; decryption reads ahead to the same plaintext and the same
//! failures; a read that fails midway fails that message only.

use crate::common;

use std::io::{self, ErrorKind, IoSliceMut, Read};

use hetcrypt::policy::Pull;
use hetcrypt_format::stream::MAX_READ_AHEAD;
use hetcrypt_format::{
    Aead, DecryptStream, EncryptStream, FormatError, OpenParams, Pipeline, SealParams, CHUNK_SIZE,
};

const KEY: [u8; 16] = [0x24; 16];
const SALT: [u8; 24] = [0x5a; 24];

/// Message lengths at and around the chunk and read-ahead boundaries.
fn lengths() -> Vec<usize> {
    let c = CHUNK_SIZE;
    let r = MAX_READ_AHEAD * c;
    vec![
        0,
        1,
        c - 1,
        c,
        c + 1,
        2 * c,
        r - c,
        r - 1,
        r,
        r + 1,
        r + c,
        2 * r,
        2 * r + 5,
    ]
}

use common::Keep as Results;

/// A reader that hands out at most `most` bytes per call, vectored or not, spread over
/// the buffers it is given; every third call is interrupted (a signal); after `fail_at`
/// bytes it fails.
struct Awkward<'a> {
    data: &'a [u8],
    most: usize,
    calls: usize,
    fail_at: Option<usize>,
    given: usize,
}

impl<'a> Awkward<'a> {
    fn new(data: &'a [u8], most: usize) -> Self {
        Awkward {
            data,
            most,
            calls: 0,
            fail_at: None,
            given: 0,
        }
    }

    fn failing_at(mut self, at: usize) -> Self {
        self.fail_at = Some(at);
        self
    }

    /// How much the next call may give, or its error.
    fn allowance(&mut self) -> io::Result<usize> {
        self.calls += 1;
        if self.calls.is_multiple_of(3) {
            return Err(io::Error::from(ErrorKind::Interrupted));
        }
        match self.fail_at {
            Some(at) if self.given >= at => Err(io::Error::other("the disk went away")),
            Some(at) => Ok(self.most.min(at - self.given)),
            None => Ok(self.most),
        }
    }
}

impl Read for Awkward<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.allowance()?);
        let n = self.data.read(&mut buf[..n])?;
        self.given += n;
        Ok(n)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        let mut left = self.allowance()?;
        let mut total = 0;
        for buf in bufs.iter_mut() {
            let n = buf.len().min(left);
            let n = self.data.read(&mut buf[..n])?;
            total += n;
            left -= n;
            if left == 0 || n < buf.len() {
                break;
            }
        }
        self.given += total;
        Ok(total)
    }
}

fn params() -> SealParams {
    SealParams::new(Aead::Aes128Gcm).with_salt_for_tests(SALT)
}

/// Encrypts each of `messages` with `depth` chunks read ahead, from readers giving
/// `most` bytes per call, in one pipeline run whose batches hold `window` chunks.
fn seal_all(messages: &[Vec<u8>], depth: usize, most: usize, window: usize) -> Vec<Vec<u8>> {
    let streams = messages.iter().map(|m| {
        EncryptStream::new(Awkward::new(m, most), Vec::new(), &KEY, params()).read_ahead(depth)
    });
    let mut results = Results(Vec::new());
    Pipeline::new(common::cpu(), &Pull)
        .unwrap()
        .window(window)
        .run(streams, &mut results)
        .unwrap();
    results
        .0
        .into_iter()
        .map(|(s, r)| {
            r.unwrap();
            s.into_parts().1
        })
        .collect()
}

/// Encrypting with `depth` chunks read ahead gives the ciphertext that reading one
/// chunk at a time gives, for every length, bytes per read and window. One test per
/// depth, so the harness runs them side by side.
fn same_ciphertext_reading_ahead(depth: usize) {
    let messages: Vec<Vec<u8>> = lengths()
        .into_iter()
        .enumerate()
        .map(|(i, len)| common::pattern(len, i as u64 + 1))
        .collect();
    // One chunk per read, whole reads: what reading without read-ahead writes.
    let expected: Vec<Vec<u8>> = messages
        .iter()
        .map(|m| common::seal(&common::cpu(), &Pull, &KEY, params(), m, 4).unwrap())
        .collect();
    for most in [usize::MAX, CHUNK_SIZE + 1, 1000] {
        for window in [1, 5, 256] {
            let got = seal_all(&messages, depth, most, window);
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                assert!(
                    g == e,
                    "message {i} ({} bytes): depth {depth}, {most} bytes per read, window {window}",
                    messages[i].len()
                );
            }
        }
    }
}

#[test]
fn reading_one_chunk_ahead_gives_the_same_ciphertext_at_every_chunk_boundary() {
    same_ciphertext_reading_ahead(1);
}

#[test]
fn reading_two_chunks_ahead_gives_the_same_ciphertext_at_every_chunk_boundary() {
    same_ciphertext_reading_ahead(2);
}

#[test]
fn reading_three_chunks_ahead_gives_the_same_ciphertext_at_every_chunk_boundary() {
    same_ciphertext_reading_ahead(3);
}

#[test]
fn reading_the_most_chunks_ahead_gives_the_same_ciphertext_at_every_chunk_boundary() {
    same_ciphertext_reading_ahead(MAX_READ_AHEAD);
}

#[test]
fn asking_beyond_the_most_gives_the_same_ciphertext_at_every_chunk_boundary() {
    same_ciphertext_reading_ahead(1000);
}

/// Decrypts `ct` reading `depth` chunks ahead through an awkward reader.
fn open(ct: &[u8], depth: usize, most: usize, window: usize) -> (Vec<u8>, Result<(), String>) {
    let stream = DecryptStream::new(
        Awkward::new(ct, most),
        Vec::new(),
        &KEY,
        OpenParams::Hetcrypt,
    )
    .read_ahead(depth);
    let mut results = Results(Vec::new());
    Pipeline::new(common::cpu(), &Pull)
        .unwrap()
        .window(window)
        .run([stream], &mut results)
        .unwrap();
    let (stream, result) = results.0.pop().expect("one stream");
    (stream.into_parts().1, result.map_err(|e| e.to_string()))
}

/// Decrypting with `depth` chunks read ahead gives the same plaintext, and on a
/// ciphertext one byte short or long the same failure, as reading one chunk at a time.
/// One test per depth, so the harness runs them side by side.
fn same_plaintext_and_failures_reading_ahead(depth: usize) {
    for (i, len) in lengths().into_iter().enumerate() {
        let pt = common::pattern(len, i as u64 + 100);
        let ct = common::seal(&common::cpu(), &Pull, &KEY, params(), &pt, 4).unwrap();
        for (most, window) in [(usize::MAX, 256), (1000, 3)] {
            let (got, result) = open(&ct, depth, most, window);
            assert_eq!(result, Ok(()), "{len} bytes, depth {depth}");
            assert!(got == pt, "{len} bytes, depth {depth}: plaintext differs");
            // One byte short, or one byte more.
            let cuts = [ct.len() - 1, ct.len() + 1];
            for cut in cuts {
                let mut bad = ct.clone();
                bad.resize(cut, 0);
                let one = open(&bad, 1, usize::MAX, 256).1;
                let ahead = open(&bad, depth, most, window).1;
                assert!(one.is_err(), "{len} bytes cut to {cut}: accepted");
                assert_eq!(ahead, one, "{len} bytes cut to {cut}, depth {depth}");
            }
        }
    }
}

#[test]
fn decrypting_one_chunk_ahead_gives_the_same_plaintext_and_the_same_failures() {
    same_plaintext_and_failures_reading_ahead(1);
}

#[test]
fn decrypting_two_chunks_ahead_gives_the_same_plaintext_and_the_same_failures() {
    same_plaintext_and_failures_reading_ahead(2);
}

#[test]
fn decrypting_the_most_chunks_ahead_gives_the_same_plaintext_and_the_same_failures() {
    same_plaintext_and_failures_reading_ahead(MAX_READ_AHEAD);
}

#[test]
fn a_message_whose_last_full_chunk_ends_the_input_fails_reading_ahead_too() {
    let pt = common::pattern(3 * CHUNK_SIZE, 7);
    let ct = common::seal(&common::cpu(), &Pull, &KEY, params(), &pt, 4).unwrap();
    // Three full chunks and the final empty one (its 16-byte tag only): without that
    // final chunk the input ends right after a full chunk.
    let truncated = &ct[..ct.len() - 16];
    for depth in [1, 2, MAX_READ_AHEAD] {
        let (_, result) = open(truncated, depth, usize::MAX, 256);
        let e = result.expect_err("a truncated message");
        assert!(e.contains("missing"), "depth {depth}: {e}");
    }
}

#[test]
fn a_read_failing_midway_fails_its_message_only() {
    let big = common::pattern(5 * MAX_READ_AHEAD * CHUNK_SIZE + 3, 9);
    let small = common::pattern(CHUNK_SIZE + 1, 10);
    for fail_at in [0, 1, CHUNK_SIZE, 3 * MAX_READ_AHEAD * CHUNK_SIZE + 17] {
        let readers = [
            Awkward::new(&small, usize::MAX),
            Awkward::new(&big, usize::MAX).failing_at(fail_at),
            Awkward::new(&small, 1000),
        ];
        let streams = readers
            .into_iter()
            .map(|r| EncryptStream::new(r, Vec::new(), &KEY, params()).read_ahead(MAX_READ_AHEAD));
        let mut results = Results(Vec::new());
        Pipeline::new(common::cpu(), &Pull)
            .unwrap()
            .window(7)
            .run(streams, &mut results)
            .unwrap();
        let outcomes: Vec<_> = results.0.iter().map(|(_, r)| r.is_ok()).collect();
        assert_eq!(outcomes, [true, false, true], "failing at {fail_at}");
        match &results.0[1].1 {
            Err(FormatError::Io(e)) => assert!(e.to_string().contains("went away"), "{e}"),
            other => panic!("failing at {fail_at}: {other:?}"),
        }
        let expected = common::seal(&common::cpu(), &Pull, &KEY, params(), &small, 4).unwrap();
        assert!(results.0[0].0.output_bytes() == expected.len() as u64);
    }
}
