//! Batch width per cipher: a lane pulls as many jobs at once as the engine wants for
//! the class (cipher, direction) of the work, not its widest batch for every cipher.
//!
//! The engine under test wraps `cpu` (a test engine): it wants batches of 8 for CBC
//! encryption, the one case multi-buffer speeds up, and single jobs for everything else,
//! and its lanes record how many jobs each pull brought.

use std::sync::{Arc, Mutex};

use hetcrypt::engine::cpu::CpuEngine;
use hetcrypt::engine::{Engine, EngineInfo, EngineRef, Lane};
use hetcrypt::policy;
use hetcrypt::{Cipher, Direction, Dispatcher, Job, JobOutput, Key, KeyStore, Mode, Result};

/// The widest batch of the test engine (CBC encryption).
const WIDE: usize = 8;

/// One pull: the class of its first job and how many jobs it brought.
type Pulls = Arc<Mutex<Vec<(Cipher, Direction, usize)>>>;

struct Recording {
    inner: EngineRef,
    pulls: Pulls,
}

impl Engine for Recording {
    fn name(&self) -> &str {
        "recording"
    }
    fn info(&self) -> EngineInfo {
        self.inner.info()
    }
    fn lanes(&self) -> usize {
        2
    }
    fn supports(&self, cipher: Cipher, direction: Direction) -> bool {
        self.inner.supports(cipher, direction)
    }
    fn open_lane(&self, index: usize) -> Result<Box<dyn Lane>> {
        Ok(Box::new(RecordingLane {
            inner: self.inner.open_lane(index)?,
            pulls: Arc::clone(&self.pulls),
        }))
    }
    fn max_batch(&self) -> usize {
        WIDE
    }
    fn batch_width(&self, cipher: Cipher, direction: Direction) -> usize {
        if cipher.mode == Mode::Cbc && direction == Direction::Encrypt {
            WIDE
        } else {
            1
        }
    }
}

struct RecordingLane {
    inner: Box<dyn Lane>,
    pulls: Pulls,
}

impl Lane for RecordingLane {
    fn run(&mut self, job: &Job, keys: &KeyStore, out: &mut JobOutput) -> Result<()> {
        self.pulls
            .lock()
            .unwrap()
            .push((job.cipher, job.direction, 1));
        self.inner.run(job, keys, out)
    }

    fn run_batch(
        &mut self,
        jobs: &[&Job],
        keys: &KeyStore,
        outs: &mut [JobOutput],
        results: &mut [Result<()>],
    ) {
        self.pulls
            .lock()
            .unwrap()
            .push((jobs[0].cipher, jobs[0].direction, jobs.len()));
        self.inner.run_batch(jobs, keys, outs, results);
    }
}

fn setup() -> (Dispatcher, Pulls, hetcrypt::KeyId) {
    let pulls = Pulls::default();
    let engine = Recording {
        inner: CpuEngine::with_lanes(2).into_engine(),
        pulls: Arc::clone(&pulls),
    };
    let d = Dispatcher::new(vec![Arc::new(engine)]).unwrap();
    let key = d.add_key(Key::new(vec![3; 16])).unwrap();
    (d, pulls, key)
}

fn jobs(key: hetcrypt::KeyId, cipher: Cipher, direction: Direction, n: usize) -> Vec<Job> {
    (0..n)
        .map(|i| {
            Job::with_iv(
                cipher,
                direction,
                key,
                &[i as u8; 16][..cipher.iv_len()],
                vec![i as u8; 256],
            )
            .unwrap()
        })
        .collect()
}

#[test]
fn ctr_and_gcm_jobs_are_pulled_one_at_a_time() {
    let (d, pulls, key) = setup();
    for (cipher, direction) in [
        (Cipher::AES_128_CTR, Direction::Encrypt),
        (Cipher::AES_128_GCM, Direction::Encrypt),
        (Cipher::AES_128_CBC, Direction::Decrypt),
    ] {
        let batch = jobs(key, cipher, direction, 200);
        for name in ["pull", "polling", "round-robin", "adaptive"] {
            pulls.lock().unwrap().clear();
            let r = d
                .run(&batch, policy::by_name(name).unwrap().as_ref())
                .unwrap();
            assert_eq!(r.report.job_errors, 0);
            let p = pulls.lock().unwrap();
            assert_eq!(p.iter().map(|x| x.2).sum::<usize>(), 200, "{name}");
            assert!(
                p.iter().all(|x| x.2 == 1),
                "{name}: {cipher} {direction} pulled in batches: {:?}",
                p.iter().map(|x| x.2).filter(|&n| n > 1).collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn cbc_encryption_is_pulled_in_wide_batches_and_mixed_batches_stay_correct() {
    let (d, pulls, key) = setup();
    let batch = jobs(key, Cipher::AES_128_CBC, Direction::Encrypt, 200);
    let r = d.run(&batch, &policy::Pull).unwrap();
    assert_eq!(r.report.job_errors, 0);
    let widest = pulls.lock().unwrap().iter().map(|x| x.2).max().unwrap();
    assert_eq!(widest, WIDE, "CBC encryption never pulled {WIDE} at once");

    // Blocks of each class: after a class boundary a lane asks for that class's width.
    let mut mixed = jobs(key, Cipher::AES_128_CBC, Direction::Encrypt, 100);
    mixed.extend(jobs(key, Cipher::AES_128_CTR, Direction::Encrypt, 100));
    mixed.extend(jobs(key, Cipher::AES_128_CBC, Direction::Encrypt, 100));
    let want: Vec<JobOutput> = mixed
        .iter()
        .map(|j| {
            let c = match j.cipher.mode {
                Mode::Ctr => openssl::symm::Cipher::aes_128_ctr(),
                _ => openssl::symm::Cipher::aes_128_cbc(),
            };
            let mut cr = openssl::symm::Crypter::new(
                c,
                openssl::symm::Mode::Encrypt,
                &[3; 16],
                Some(j.iv()),
            )
            .unwrap();
            cr.pad(false);
            let mut data = vec![0; j.input.len() + 16];
            let n = cr.update(&j.input, &mut data).unwrap();
            data.truncate(n);
            JobOutput { data, tag: None }
        })
        .collect();
    pulls.lock().unwrap().clear();
    let r = d.run(&mixed, &policy::Pull).unwrap();
    for (i, (got, want)) in r.outputs.iter().zip(&want).enumerate() {
        assert_eq!(got.as_ref().unwrap(), want, "job {i}");
    }
    let p = pulls.lock().unwrap();
    let ctr_in_wide = p
        .iter()
        .filter(|x| x.0.mode == Mode::Ctr && x.2 > 1)
        .count();
    // Only a pull that straddles a class boundary may start with CTR and be wide:
    // at most one per lane per boundary.
    assert!(ctr_in_wide <= 2, "{ctr_in_wide} wide pulls of CTR jobs");
    assert!(p.iter().any(|x| x.0.mode == Mode::Cbc && x.2 > 1));
}
