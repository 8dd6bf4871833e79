//! Fail-over: an engine that fails mid-batch loses no job and runs none twice.

use hetcrypt::engine::cpu::CpuEngine;
use hetcrypt::engine::fault::{Fault, FaultyEngine};
use hetcrypt::policy::{self, Policy};
use hetcrypt::{Cipher, Direction, Dispatcher, Job, Key};

fn jobs(n: usize, key: hetcrypt::KeyId) -> Vec<Job> {
    (0..n)
        .map(|i| {
            let len = (i * 37) % 5000;
            Job::new(
                Cipher::AES_128_CTR,
                Direction::Encrypt,
                key,
                [i as u8; 16],
                vec![i as u8; len],
            )
        })
        .collect()
}

fn reference(jobs: &[Job]) -> Vec<Vec<u8>> {
    jobs.iter()
        .map(|j| {
            openssl::symm::encrypt(
                openssl::symm::Cipher::aes_128_ctr(),
                &[7u8; 16],
                Some(j.iv()),
                &j.input,
            )
            .unwrap()
        })
        .collect()
}

/// Batches to try before giving up on the fault triggering: under `pull` on a loaded
/// machine the CPU lane can finish a batch before the faulty engine's lanes have run
/// enough jobs to fail (it happened once in many runs), and such a batch proves nothing.
const ATTEMPTS: usize = 20;

fn check(fault: Fault, policy: &dyn Policy) {
    for _ in 0..ATTEMPTS {
        if check_once(fault, policy) {
            return;
        }
    }
    panic!("the faulty engine never failed in {ATTEMPTS} batches");
}

/// Runs one batch on a fresh dispatcher; checks every output and that every job ran
/// once, and, if the faulty engine failed, the rest. Returns whether it failed.
fn check_once(fault: Fault, policy: &dyn Policy) -> bool {
    let faulty = FaultyEngine::new("flaky", CpuEngine::with_lanes(2).into_engine(), fault);
    let d = Dispatcher::new(vec![
        CpuEngine::with_lanes(1).into_engine(),
        faulty.into_engine(),
    ])
    .unwrap();
    let key = d.add_key(Key::new(vec![7; 16])).unwrap();
    let batch = jobs(500, key);
    let want = reference(&batch);
    let result = d.run(&batch, policy).unwrap();
    for (i, (out, want)) in result.outputs.iter().zip(&want).enumerate() {
        assert_eq!(
            &out.as_ref().unwrap_or_else(|e| panic!("job {i}: {e}")).data,
            want,
            "job {i}"
        );
    }
    let r = &result.report;
    assert_eq!(
        r.engines.iter().map(|e| e.jobs).sum::<usize>(),
        500,
        "every job done exactly once"
    );
    if r.engine("flaky").unwrap().failed.is_none() {
        return false;
    }
    if let Fault::AfterJobs(n) = fault {
        assert!(r.engine("flaky").unwrap().jobs <= n);
    }
    // A second batch never touches the failed engine.
    let again = d.run(&batch, policy).unwrap();
    assert_eq!(again.report.engine("flaky").unwrap().jobs, 0);
    assert_eq!(again.report.engine("cpu").unwrap().jobs, 500);
    true
}

#[test]
fn pull_survives_mid_batch_failure() {
    check(Fault::AfterJobs(40), &policy::Pull);
}

#[test]
fn only_failing_engine_moves_everything() {
    check(Fault::AfterJobs(10), &policy::Only::new("flaky"));
}

#[test]
fn engine_gone_before_batch() {
    check(Fault::OnOpen, &policy::Pull);
}
