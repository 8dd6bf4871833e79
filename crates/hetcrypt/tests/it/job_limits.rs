//! Job size limits: an engine that declares a largest job is never handed a larger
//! one by any policy; such jobs go to the engines that take them, and where none
//! does, they fail before any lane starts with `TooLarge`, naming the limit.
//!
//! The limited engine is the fault-injection wrapper around `cpu` with a declared
//! limit (a test tool); it refuses any job above its limit with `TooLarge`, so a job
//! handed to it wrongly shows up as an error here. The real case, the `kernel` engine's
//! GCM limit from its socket buffers, is tested in the guest (testbed_kernel.rs).

use hetcrypt::engine::cpu::CpuEngine;
use hetcrypt::engine::fault::{Fault, FaultyEngine};
use hetcrypt::engine::EngineRef;
use hetcrypt::policy;
use hetcrypt::{Cipher, Direction, Dispatcher, Error, Job, Key, KeyId, TAG_LEN};
use openssl::symm;

/// The limited engine's largest job, in bytes (input plus AAD).
const LIMIT: usize = 4096;

/// The limited engine: `cpu` with two lanes and a declared limit, never failing.
fn limited() -> EngineRef {
    FaultyEngine::new(
        "small",
        CpuEngine::with_lanes(2).into_engine(),
        Fault::AfterJobs(usize::MAX),
    )
    .with_max_job_len(LIMIT)
    .into_engine()
}

const KEY: [u8; 16] = [0x11; 16];

/// GCM jobs both ways, of sizes on both sides of the limit (AAD included), each
/// with the output OpenSSL gives for it.
fn gcm_jobs(key: KeyId) -> Vec<(Job, Vec<u8>, [u8; TAG_LEN])> {
    let mut out = Vec::new();
    for i in 0..120usize {
        // 0 .. 3 * LIMIT, with some right at the edge.
        let len = match i % 6 {
            0 => LIMIT,
            1 => LIMIT + 1,
            _ => i * 97 % (3 * LIMIT),
        };
        let aad = vec![i as u8; if i % 5 == 0 { 64 } else { 0 }];
        let input: Vec<u8> = (0..len).map(|b| (b * 7 + i) as u8).collect();
        let nonce = [i as u8; 12];
        let mut tag = [0u8; TAG_LEN];
        let sealed = symm::encrypt_aead(
            symm::Cipher::aes_128_gcm(),
            &KEY,
            Some(&nonce),
            &aad,
            &input,
            &mut tag,
        )
        .expect("openssl seals");
        let mut job = if i % 2 == 0 {
            Job::with_iv(
                Cipher::AES_128_GCM,
                Direction::Encrypt,
                key,
                &nonce,
                input.clone(),
            )
        } else {
            Job::with_iv(
                Cipher::AES_128_GCM,
                Direction::Decrypt,
                key,
                &nonce,
                sealed.clone(),
            )
        }
        .expect("12-byte nonce");
        job.aad = aad;
        if job.direction == Direction::Decrypt {
            job.tag = Some(tag);
            out.push((job, input, tag));
        } else {
            out.push((job, sealed, tag));
        }
    }
    out
}

/// Batches `pull` may run before the limited engine must have taken a job.
const PULL_ROUNDS: usize = 20;

fn len_of(job: &Job) -> usize {
    job.input.len() + job.aad.len()
}

#[test]
fn no_policy_hands_the_limited_engine_a_job_above_its_limit() {
    let engines = vec![CpuEngine::with_lanes(1).into_engine(), limited()];
    let d = Dispatcher::new(engines).unwrap();
    let key = d.add_key(Key::new(KEY.to_vec())).unwrap();
    let cases = gcm_jobs(key);
    let jobs: Vec<Job> = cases.iter().map(|(j, _, _)| j.clone()).collect();
    assert!(jobs.iter().any(|j| len_of(j) > LIMIT));
    assert!(jobs.iter().any(|j| len_of(j) <= LIMIT));
    for name in [
        "pull",
        "round-robin",
        "polling",
        "threshold:1024",
        "threshold",
        "adaptive",
        "only:cpu",
    ] {
        let policy = policy::by_name(name).unwrap();
        // Two batches: `threshold` and `adaptive` measure in the first one. Under
        // `pull`, whether the limited engine takes any job is a race (on a loaded host
        // the cpu lane can drain the batch before its lanes start), so `pull` runs more
        // batches, each checked in full, until it has (at most `PULL_ROUNDS`).
        let mut small_total = 0;
        for round in 0.. {
            let enough = small_total > 0 || name != "pull";
            if (round >= 2 && enough) || round >= PULL_ROUNDS {
                break;
            }
            let batch = d.run(&jobs, policy.as_ref()).unwrap();
            for (i, (out, (job, want, tag))) in batch.outputs.iter().zip(&cases).enumerate() {
                let out = out.as_ref().unwrap_or_else(|e| {
                    panic!("{name} round {round}: job {i} ({} bytes): {e}", len_of(job))
                });
                assert_eq!(&out.data, want, "{name}: job {i}");
                if job.direction == Direction::Encrypt {
                    assert_eq!(out.tag.as_ref(), Some(tag), "{name}: job {i} tag");
                }
            }
            let r = &batch.report;
            assert_eq!(r.job_errors, 0, "{name}");
            assert_eq!(r.redispatched, 0, "{name}");
            assert_eq!(r.engines.iter().map(|e| e.jobs).sum::<usize>(), jobs.len());
            let small = r.engines.iter().find(|e| e.name == "small").unwrap();
            let small_max = jobs.iter().filter(|j| len_of(j) <= LIMIT).count();
            assert!(
                small.jobs <= small_max,
                "{name}: small ran {} jobs",
                small.jobs
            );
            small_total += small.jobs;
        }
        // Round-robin deals jobs in turn, so this is deterministic for it.
        if name == "pull" || name == "round-robin" {
            assert!(
                small_total > 0,
                "{name}: the limited engine took no job at all"
            );
        }
    }
}

#[test]
fn above_every_limit_a_job_fails_up_front_naming_the_limit() {
    let d = Dispatcher::new(vec![limited()]).unwrap();
    let key = d.add_key(Key::new(KEY.to_vec())).unwrap();
    let cases = gcm_jobs(key);
    let jobs: Vec<Job> = cases.iter().map(|(j, _, _)| j.clone()).collect();
    for name in ["pull", "only:small", "round-robin", "adaptive"] {
        let batch = d
            .run(&jobs, policy::by_name(name).unwrap().as_ref())
            .unwrap();
        let mut too_large = 0;
        for (i, (out, (job, want, _))) in batch.outputs.iter().zip(&cases).enumerate() {
            let len = len_of(job);
            match out {
                Ok(out) if len <= LIMIT => assert_eq!(&out.data, want, "{name}: job {i}"),
                Err(Error::TooLarge {
                    cipher,
                    engine,
                    len: got,
                    max,
                }) if len > LIMIT => {
                    assert_eq!(
                        (*cipher, engine.as_str(), *got, *max),
                        (Cipher::AES_128_GCM, "small", len, LIMIT)
                    );
                    too_large += 1;
                }
                other => panic!("{name}: job {i} of {len} bytes: {other:?}"),
            }
        }
        let r = &batch.report;
        // The refused jobs never reached a lane: the lanes ran exactly the others.
        assert_eq!(r.engines[0].jobs, jobs.len() - too_large, "{name}");
        assert_eq!(r.job_errors, too_large, "{name}");
        assert!(too_large > 0);
    }
}

#[test]
fn a_policy_kept_to_the_limited_engine_says_the_job_is_too_large() {
    // `only:small` with a cpu engine beside it: the cpu could run the large jobs, but
    // the policy keeps every job to `small`; the large ones must say why they failed.
    let d = Dispatcher::new(vec![CpuEngine::with_lanes(1).into_engine(), limited()]).unwrap();
    let key = d.add_key(Key::new(KEY.to_vec())).unwrap();
    let cases = gcm_jobs(key);
    let jobs: Vec<Job> = cases.iter().map(|(j, _, _)| j.clone()).collect();
    let batch = d.run(&jobs, &policy::Only::new("small")).unwrap();
    for (i, (out, (job, want, _))) in batch.outputs.iter().zip(&cases).enumerate() {
        let len = len_of(job);
        match out {
            Ok(out) if len <= LIMIT => assert_eq!(&out.data, want, "job {i}"),
            Err(Error::TooLarge { engine, max, .. }) if len > LIMIT => {
                assert_eq!((engine.as_str(), *max), ("small", LIMIT), "job {i}");
                let text = out.as_ref().unwrap_err().to_string();
                assert!(text.contains(&LIMIT.to_string()), "{text}");
            }
            other => panic!("job {i} of {len} bytes: {other:?}"),
        }
    }
    assert_eq!(
        batch.report.engines[0].jobs, 0,
        "cpu ran jobs under only:small"
    );
}

#[test]
fn other_ciphers_and_the_cpu_engine_have_no_limit() {
    let cpu = CpuEngine::with_lanes(1);
    for cipher in Cipher::all() {
        for direction in [Direction::Encrypt, Direction::Decrypt] {
            assert_eq!(
                hetcrypt::engine::Engine::max_job_len(&cpu, cipher, direction),
                None
            );
        }
    }
    // A CTR job far above the limited engine's GCM-sized limit is refused too: the
    // wrapper declares its limit for every cipher, and the dispatcher honours it.
    let d = Dispatcher::new(vec![limited()]).unwrap();
    let key = d.add_key(Key::new(KEY.to_vec())).unwrap();
    let job = Job::new(
        Cipher::AES_128_CTR,
        Direction::Encrypt,
        key,
        [0; 16],
        vec![0; LIMIT + 16],
    );
    let batch = d.run(&[job], &policy::Pull).unwrap();
    assert!(matches!(batch.outputs[0], Err(Error::TooLarge { .. })));
}
