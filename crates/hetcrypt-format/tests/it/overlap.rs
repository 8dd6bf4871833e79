//! Issue 24: the pipeline overlaps reading, the engines and writing. Overlapped runs
//! give byte for byte what runs in turn give, at every chunk and window boundary and
//! on several engines; a stream failing mid-run writes nothing past its failure and
//! leaves the others whole.

use crate::common;

use std::io;

use hetcrypt::policy::Pull;
use hetcrypt_format::{
    Aead, DecryptStream, EncryptStream, FormatError, OpenParams, Pipeline, SealParams, CHUNK_SIZE,
};

/// A small window, so that messages span several overlapped batches.
const WINDOW: usize = 3;

/// Message lengths around every edge: empty, one byte, a chunk's edges, a window's
/// edges, and several windows.
fn lengths() -> Vec<usize> {
    let w = WINDOW * CHUNK_SIZE;
    vec![
        0,
        1,
        CHUNK_SIZE - 1,
        CHUNK_SIZE,
        CHUNK_SIZE + 1,
        w - 1,
        w,
        w + 1,
        2 * w - CHUNK_SIZE,
        3 * w + 7,
    ]
}

use common::Keep as Results;

/// Encrypts every message in one run (fixed salts, so runs can be compared byte for
/// byte) and returns the ciphertexts in the order their streams finished.
fn seal_all(pts: &[Vec<u8>], overlap: bool, two: bool, key: &[u8]) -> Vec<Vec<u8>> {
    let engines = if two {
        common::two_engines()
    } else {
        common::cpu()
    };
    let streams = pts.iter().enumerate().map(|(i, pt)| {
        let params = SealParams::new(Aead::Aes128Gcm).with_salt_for_tests([i as u8; 24]);
        EncryptStream::new(&pt[..], Vec::new(), key, params)
    });
    let mut results = Results(Vec::new());
    let mut p = Pipeline::new(engines, &Pull)
        .unwrap()
        .window(WINDOW)
        .overlap(overlap);
    p.run(streams, &mut results).unwrap();
    assert!(p.dispatcher().keys().is_empty(), "a message key was left");
    results
        .0
        .into_iter()
        .map(|(s, r)| {
            r.unwrap();
            s.into_parts().1
        })
        .collect()
}

#[test]
fn overlapped_batches_give_the_same_bytes_at_every_chunk_and_window_edge() {
    let key = [4u8; 16];
    let pts: Vec<Vec<u8>> = lengths()
        .into_iter()
        .enumerate()
        .map(|(i, n)| common::pattern(n, i as u64 + 1))
        .collect();
    let in_turn = seal_all(&pts, false, false, &key);
    for two in [false, true] {
        let overlapped = seal_all(&pts, true, two, &key);
        assert_eq!(overlapped.len(), pts.len());
        for (i, (a, b)) in overlapped.iter().zip(&in_turn).enumerate() {
            assert!(
                a == b,
                "message {i} ({} bytes) differs overlapped (two engines: {two})",
                pts[i].len()
            );
        }
    }
    // And back, overlapped, on two engines, every message in one run.
    let streams = in_turn
        .iter()
        .map(|ct| DecryptStream::new(&ct[..], Vec::new(), &key, OpenParams::Hetcrypt));
    let mut results = Results(Vec::new());
    Pipeline::new(common::two_engines(), &Pull)
        .unwrap()
        .window(WINDOW)
        .run(streams, &mut results)
        .unwrap();
    for (i, (s, r)) in results.0.into_iter().enumerate() {
        r.unwrap();
        assert!(s.into_parts().1 == pts[i], "message {i} did not come back");
    }
}

#[test]
fn a_chunk_failing_mid_run_stops_its_stream_there_and_spares_the_others() {
    let key = [8u8; 16];
    let pts: Vec<Vec<u8>> = (0..4)
        .map(|i| common::pattern(5 * WINDOW * CHUNK_SIZE + 11, 40 + i))
        .collect();
    let mut cts = seal_all(&pts, false, false, &key);
    // Message 1: a flipped byte in chunk 7, in the middle of its third window.
    const BAD: usize = 7;
    let header = 12 + 24 + 32;
    cts[1][header + BAD * Aead::Aes128Gcm.full_chunk_len() + 100] ^= 1;
    let streams = cts
        .iter()
        .map(|ct| DecryptStream::new(&ct[..], Vec::new(), &key, OpenParams::Hetcrypt));
    let mut results = Results(Vec::new());
    Pipeline::new(common::two_engines(), &Pull)
        .unwrap()
        .window(WINDOW)
        .run(streams, &mut results)
        .unwrap();
    for (i, (s, r)) in results.0.into_iter().enumerate() {
        let written = s.into_parts().1;
        if i == 1 {
            assert!(
                matches!(r, Err(FormatError::Tampered { chunk: 7, .. })),
                "{r:?}"
            );
            // Every chunk before the bad one, nothing from it on.
            assert!(
                written == pts[1][..BAD * CHUNK_SIZE],
                "{} bytes",
                written.len()
            );
        } else {
            r.unwrap();
            assert!(written == pts[i], "message {i} was hurt by message 1");
        }
    }
}

/// A writer that fails on its `n`-th write.
struct FailOn {
    n: usize,
    writes: usize,
}

impl io::Write for FailOn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.writes += 1;
        if self.writes == self.n {
            return Err(io::Error::other("the disk went away"));
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Copies each chunk's output, as any writer does by default.
impl hetcrypt_format::ChunkWrite for FailOn {}

#[test]
fn a_write_failing_mid_run_asks_its_stream_for_no_more_chunks() {
    let key = [2u8; 16];
    let pt = common::pattern(20 * WINDOW * CHUNK_SIZE, 5);
    // Writes: the wrapper, salt, commitment, then one per chunk; the 10th is chunk 6.
    let stream = EncryptStream::new(
        &pt[..],
        FailOn { n: 10, writes: 0 },
        &key,
        SealParams::new(Aead::Aes128Gcm),
    );
    let mut results = Results(Vec::new());
    let mut p = Pipeline::new(common::cpu(), &Pull).unwrap().window(WINDOW);
    p.run([stream], &mut results).unwrap();
    let (s, r) = results.0.pop().unwrap();
    assert!(matches!(&r, Err(FormatError::Io(_))), "{r:?}");
    // Chunk 6 is in the third batch; overlapped, the fourth was read meanwhile, and
    // nothing after it.
    assert!(
        s.plaintext_bytes() <= (4 * WINDOW * CHUNK_SIZE) as u64,
        "read {} bytes",
        s.plaintext_bytes()
    );
    assert!(p.dispatcher().keys().is_empty());
}
