//! The pipeline with many streams: failures stay with their stream, outputs stay in
//! order, every finished message's key is removed from the one dispatcher, failed
//! engines are not used again.

use crate::common;

use std::io::{self, Write};

use hetcrypt::engine::cpu::CpuEngine;
use hetcrypt::engine::fault::{Fault, FaultyEngine};
use hetcrypt::policy::Pull;
use hetcrypt_format::{
    Aead, DecryptStream, EncryptStream, FormatError, OpenParams, Pipeline, SealParams, CHUNK_SIZE,
};

/// A writer that fails with "no space left" once `limit` bytes were written.
struct FullDisk {
    data: Vec<u8>,
    limit: usize,
}

impl Write for FullDisk {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.data.len() + buf.len() > self.limit {
            return Err(io::Error::from_raw_os_error(28)); // ENOSPC
        }
        self.data.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Copies each chunk's output, as any writer does by default.
impl hetcrypt_format::ChunkWrite for FullDisk {}

/// A reader that fails after `ok` bytes, as a disk with a bad sector.
struct BadSector<'a> {
    data: &'a [u8],
    ok: usize,
}

impl io::Read for BadSector<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.ok == 0 {
            return Err(io::Error::other("bad sector"));
        }
        let n = buf.len().min(self.ok).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        self.ok -= n;
        Ok(n)
    }
}

use common::Keep as Results;

#[test]
fn a_full_disk_fails_only_its_own_stream() {
    let key = [3u8; 16];
    let inputs: Vec<Vec<u8>> = (0..6)
        .map(|i| common::pattern(i * 20_000 + 10, i as u64))
        .collect();
    let streams = inputs.iter().enumerate().map(|(i, pt)| {
        // Stream 2's disk fills up after 30 KB.
        let limit = if i == 2 { 30_000 } else { usize::MAX };
        EncryptStream::new(
            &pt[..],
            FullDisk {
                data: Vec::new(),
                limit,
            },
            &key,
            SealParams::new(Aead::Aes128Gcm),
        )
    });
    let mut results = Results(Vec::new());
    let mut p = Pipeline::new(common::two_engines(), &Pull)
        .unwrap()
        .window(3);
    p.run(streams, &mut results).unwrap();
    assert_eq!(results.0.len(), 6);
    for (i, (stream, result)) in results.0.into_iter().enumerate() {
        let (_, out) = stream.into_parts();
        if i == 2 {
            let err = result.unwrap_err();
            assert!(
                matches!(&err, FormatError::Io(e) if e.raw_os_error() == Some(28)),
                "{err:?}"
            );
        } else {
            result.unwrap();
            let o = common::open(
                &common::cpu(),
                &Pull,
                &key,
                OpenParams::Hetcrypt,
                &out.data,
                4,
            );
            o.result.unwrap();
            assert!(o.written == inputs[i], "stream {i}");
        }
    }
}

#[test]
fn an_unreadable_input_fails_only_its_own_stream() {
    let key = [4u8; 32];
    let data = common::pattern(100_000, 1);
    let streams = (0..4).map(|i| {
        let ok = if i == 1 { 40_000 } else { usize::MAX };
        EncryptStream::new(
            BadSector { data: &data, ok },
            Vec::new(),
            &key,
            SealParams::new(Aead::Aes256Gcm),
        )
    });
    let mut results = Results(Vec::new());
    Pipeline::new(common::cpu(), &Pull)
        .unwrap()
        .window(4)
        .run(streams, &mut results)
        .unwrap();
    let ok: Vec<bool> = results.0.iter().map(|(_, r)| r.is_ok()).collect();
    assert_eq!(ok, [true, false, true, true]);
}

#[test]
fn bad_files_among_good_ones_when_decrypting() {
    let key = [5u8; 16];
    let pts: Vec<Vec<u8>> = (0..5)
        .map(|i| common::pattern(i * CHUNK_SIZE + 17, 40 + i as u64))
        .collect();
    let mut cts: Vec<Vec<u8>> = pts
        .iter()
        .map(|pt| {
            common::seal(
                &common::cpu(),
                &Pull,
                &key,
                SealParams::new(Aead::Aes128Gcm),
                pt,
                8,
            )
            .unwrap()
        })
        .collect();
    let last = cts[3].len() - 1;
    cts[3][last] ^= 1; // tampered tag of the final chunk
    cts[1].truncate(40); // truncated header
    let streams = cts
        .iter()
        .map(|ct| DecryptStream::new(&ct[..], Vec::new(), &key, OpenParams::Hetcrypt));
    let mut results = Results(Vec::new());
    Pipeline::new(common::two_engines(), &Pull)
        .unwrap()
        .window(2)
        .run(streams, &mut results)
        .unwrap();
    for (i, (stream, result)) in results.0.into_iter().enumerate() {
        match i {
            1 => assert!(
                matches!(result, Err(FormatError::Truncated(_))),
                "{result:?}"
            ),
            3 => assert!(
                matches!(result, Err(FormatError::Tampered { chunk: 3, .. })),
                "{result:?}"
            ),
            _ => {
                result.unwrap();
                assert!(stream.into_parts().1 == pts[i]);
            }
        }
    }
}

#[test]
fn many_messages_on_one_dispatcher_leave_no_key_behind() {
    let key = [6u8; 32];
    // More messages than the old per-dispatcher cap (1024) twice over.
    let n = 2 * 1024 + 10;
    let pts: Vec<Vec<u8>> = (0..n).map(|i| common::pattern(i % 50, i as u64)).collect();
    let streams = pts.iter().map(|pt| {
        EncryptStream::new(
            &pt[..],
            Vec::new(),
            &key,
            SealParams::new(Aead::Aes128CbcHmacSha256),
        )
    });
    let mut results = Results(Vec::new());
    let mut p = Pipeline::new(common::cpu(), &Pull).unwrap();
    p.run(streams, &mut results).unwrap();
    assert_eq!(results.0.len(), n);
    assert_eq!(p.stats().jobs, n as u64);
    assert!(
        p.dispatcher().keys().is_empty(),
        "{} message keys left registered",
        p.dispatcher().keys().len()
    );
    // All of them decrypted through one more pipeline: right plaintexts, and no
    // decryption key left behind either.
    let cts: Vec<Vec<u8>> = results
        .0
        .into_iter()
        .map(|(stream, result)| {
            result.unwrap();
            stream.into_parts().1
        })
        .collect();
    let opens = cts
        .iter()
        .map(|ct| DecryptStream::new(&ct[..], Vec::new(), &key, OpenParams::Hetcrypt));
    let mut opened = Results(Vec::new());
    let mut p = Pipeline::new(common::cpu(), &Pull).unwrap();
    p.run(opens, &mut opened).unwrap();
    assert_eq!(opened.0.len(), n);
    assert!(
        p.dispatcher().keys().is_empty(),
        "{} decryption keys left registered",
        p.dispatcher().keys().len()
    );
    for (i, (stream, result)) in opened.0.into_iter().enumerate() {
        result.unwrap();
        assert_eq!(stream.into_parts().1, pts[i], "message {i}");
    }
}

#[test]
fn a_failing_engine_loses_no_chunk() {
    let key = [9u8; 16];
    let pt = common::pattern(40 * CHUNK_SIZE + 3, 77);
    let engines = vec![
        FaultyEngine::new(
            "flaky",
            CpuEngine::with_lanes(1).into_engine(),
            Fault::AfterJobs(5),
        )
        .into_engine(),
        CpuEngine::with_lanes(1).into_engine(),
    ];
    let salt = [1u8; 24];
    let params = SealParams::new(Aead::Aes128Gcm).with_salt_for_tests(salt);
    let ct = common::seal(&engines, &Pull, &key, params.clone(), &pt, 8).unwrap();
    let reference = common::seal(&common::cpu(), &Pull, &key, params, &pt, 8).unwrap();
    assert!(ct == reference, "fail-over changed the ciphertext");
}

/// A reader that counts what was taken from it.
struct Counted<R> {
    inner: R,
    taken: std::rc::Rc<std::cell::Cell<u64>>,
}

impl<R: io::Read> io::Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.taken.set(self.taken.get() + n as u64);
        Ok(n)
    }
}

/// Issue 19, item 8: a genuine message followed by a gigabyte of zeros (a padded
/// file) fails at its first bad chunk, after at most two windows of input, instead of
/// being read to its end; a full disk likewise stops the encryption at once.
#[test]
fn a_padded_ciphertext_or_a_full_disk_stops_the_stream_at_once() {
    use io::Read as _;
    const PADDING: u64 = 1 << 30;
    const WINDOW: usize = 8;
    let key = [6u8; 16];
    let pt = common::pattern(40_000, 9);
    let ct = common::seal(
        &common::cpu(),
        &Pull,
        &key,
        SealParams::new(Aead::Aes128Gcm),
        &pt,
        4,
    )
    .unwrap();
    let taken = std::rc::Rc::new(std::cell::Cell::new(0));
    let reader = Counted {
        inner: (&ct[..]).chain(io::repeat(0).take(PADDING)),
        taken: taken.clone(),
    };
    let stream = DecryptStream::new(reader, Vec::new(), &key, OpenParams::Hetcrypt);
    let mut results = Results(Vec::new());
    Pipeline::new(common::cpu(), &Pull)
        .unwrap()
        .window(WINDOW)
        .run([stream], &mut results)
        .unwrap();
    let err = results.0.pop().unwrap().1.unwrap_err();
    assert!(
        matches!(err, FormatError::Tampered { chunk: 2, .. }),
        "{err}"
    );
    let limit = (2 * WINDOW + 2) as u64 * Aead::Aes128Gcm.full_chunk_len() as u64;
    assert!(taken.get() < limit, "read {} bytes", taken.get());

    // Encrypting a gigabyte onto a disk that is full after 30 KB.
    let taken = std::rc::Rc::new(std::cell::Cell::new(0));
    let reader = Counted {
        inner: io::repeat(1).take(PADDING),
        taken: taken.clone(),
    };
    let full = FullDisk {
        data: Vec::new(),
        limit: 30_000,
    };
    let stream = EncryptStream::new(reader, full, &key, SealParams::new(Aead::Aes128Gcm));
    let mut results = Results(Vec::new());
    Pipeline::new(common::cpu(), &Pull)
        .unwrap()
        .window(WINDOW)
        .run([stream], &mut results)
        .unwrap();
    let err = results.0.pop().unwrap().1.unwrap_err();
    assert!(
        matches!(&err, FormatError::Io(e) if e.raw_os_error() == Some(28)),
        "{err}"
    );
    assert!(
        taken.get() < 2 * WINDOW as u64 * CHUNK_SIZE as u64 + 1,
        "read {}",
        taken.get()
    );
}

/// Plans as `Pull` does, except its `fail_at`-th batch (counting from 1), which it
/// fails: by panicking, or with an error.
struct FailingPolicy {
    plans: std::sync::atomic::AtomicUsize,
    fail_at: usize,
    panics: bool,
}

impl FailingPolicy {
    fn new(fail_at: usize, panics: bool) -> Self {
        FailingPolicy {
            plans: std::sync::atomic::AtomicUsize::new(0),
            fail_at,
            panics,
        }
    }
}

impl hetcrypt::policy::Policy for FailingPolicy {
    fn name(&self) -> String {
        "failing".into()
    }

    fn plan(
        &self,
        plan: &hetcrypt::policy::Plan<'_>,
    ) -> hetcrypt::Result<Box<dyn hetcrypt::policy::Schedule>> {
        let n = self.plans.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if n == self.fail_at {
            if self.panics {
                panic!("the policy panicked on purpose");
            }
            return Err(hetcrypt::Error::Policy {
                policy: self.name(),
                reason: "failed on purpose".into(),
            });
        }
        hetcrypt::policy::Policy::plan(&Pull, plan)
    }
}

/// One-chunk messages, `n` of them.
fn small_messages(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| common::pattern(100 + i, i as u64)).collect()
}

/// Batches run on one thread for the whole run: a panic there (here the policy's, in
/// the fourth batch, after that thread ran three) reaches the caller with its own
/// message, rather than hanging the run or being lost.
#[test]
fn a_panic_on_the_engines_thread_reaches_the_caller() {
    let key = [7u8; 16];
    // Small messages' batches run in-line on the caller's thread; large ones (here 8
    // chunks each, 4 a batch) on the engines' thread.
    for pts in [small_messages(20), vec![vec![5u8; 8 * CHUNK_SIZE]; 3]] {
        let policy = FailingPolicy::new(4, true);
        let streams = pts.iter().map(|pt| {
            EncryptStream::new(&pt[..], Vec::new(), &key, SealParams::new(Aead::Aes128Gcm))
        });
        let mut results = Results(Vec::new());
        let mut p = Pipeline::new(common::cpu(), &policy).unwrap().window(4);
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            p.run(streams, &mut results)
        }));
        let payload = run.expect_err("the panic reaches the caller");
        assert_eq!(
            payload.downcast_ref::<&str>(),
            Some(&"the policy panicked on purpose")
        );
        assert_eq!(policy.plans.load(std::sync::atomic::Ordering::SeqCst), 4);
    }
}

/// A batch that cannot be planned ends the run with the error and the streams in
/// flight with it, those finished before keep their results, and the same pipeline
/// runs again afterwards (on a new engines thread).
#[test]
fn a_batch_that_cannot_be_planned_ends_the_run_and_the_pipeline_runs_again() {
    let key = [8u8; 16];
    let pts = small_messages(20);
    let policy = FailingPolicy::new(3, false);
    fn seal<'a>(pt: &'a [u8], key: &[u8]) -> EncryptStream<&'a [u8], Vec<u8>> {
        EncryptStream::new(pt, Vec::new(), key, SealParams::new(Aead::Aes128Gcm))
    }
    let mut p = Pipeline::new(common::cpu(), &policy).unwrap().window(2);
    let mut results = Results(Vec::new());
    let err = p
        .run(pts.iter().map(|pt| seal(pt, &key)), &mut results)
        .unwrap_err();
    assert!(err.to_string().contains("failed on purpose"), "{err}");
    // Each message is one short (last) chunk, so the two batches planned before, of
    // two chunks each, held the first four messages.
    let ok = results.0.iter().filter(|(_, r)| r.is_ok()).count();
    assert_eq!(ok, 4, "messages finished before the failure");
    assert!(
        results.0.len() < pts.len(),
        "messages never started are not reported"
    );
    assert!(p.dispatcher().keys().is_empty());

    let mut again = Results(Vec::new());
    p.run(pts.iter().map(|pt| seal(pt, &key)), &mut again)
        .unwrap();
    assert_eq!(again.0.len(), pts.len());
    for (i, (stream, result)) in again.0.into_iter().enumerate() {
        result.unwrap();
        let ct = stream.into_parts().1;
        let opened = common::open(&common::cpu(), &Pull, &key, OpenParams::Hetcrypt, &ct, 4);
        opened.result.unwrap();
        assert_eq!(opened.written, pts[i], "message {i}");
    }
}
