//! Removing keys from a dispatcher: never while a batch may still look them up, the
//! ids never come back, and the lanes' per-key state is dropped (or the lane reopened).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use hetcrypt::engine::cpu::CpuEngine;
use hetcrypt::engine::{Engine, EngineInfo, EngineRef, Lane};
use hetcrypt::policy::Pull;
use hetcrypt::{Cipher, Direction, Dispatcher, Error, Job, JobOutput, Key, KeyId, KeyStore};

/// What the test engine's lanes share with the test.
#[derive(Default)]
struct Probe {
    /// Set when a lane starts its first job.
    started: AtomicBool,
    /// Lanes hold their job until this is true (when `hold` is set).
    released: Mutex<bool>,
    wake: Condvar,
    hold: bool,
    /// Whether lanes can forget keys.
    forgets: bool,
    opened: AtomicUsize,
    forgot: AtomicUsize,
}

/// `cpu` with one lane, instrumented.
struct Test {
    inner: EngineRef,
    probe: Arc<Probe>,
}

impl Engine for Test {
    fn name(&self) -> &str {
        "test"
    }
    fn info(&self) -> EngineInfo {
        self.inner.info()
    }
    fn lanes(&self) -> usize {
        1
    }
    fn supports(&self, c: Cipher, d: Direction) -> bool {
        self.inner.supports(c, d)
    }
    fn open_lane(&self, index: usize) -> hetcrypt::Result<Box<dyn Lane>> {
        self.probe.opened.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(TestLane {
            inner: self.inner.open_lane(index)?,
            probe: Arc::clone(&self.probe),
        }))
    }
}

struct TestLane {
    inner: Box<dyn Lane>,
    probe: Arc<Probe>,
}

impl Lane for TestLane {
    fn run(&mut self, job: &Job, keys: &KeyStore, out: &mut JobOutput) -> hetcrypt::Result<()> {
        self.probe.started.store(true, Ordering::SeqCst);
        if self.probe.hold {
            let mut released = self.probe.released.lock().unwrap();
            while !*released {
                released = self.probe.wake.wait(released).unwrap();
            }
        }
        // The cpu lane looks the key up now, after the hold: a key removed meanwhile
        // would fail this job with UnknownKey.
        self.inner.run(job, keys, out)
    }

    fn forget_keys(&mut self, ids: &[KeyId]) -> bool {
        self.probe.forgot.fetch_add(ids.len(), Ordering::SeqCst);
        self.probe.forgets
    }
}

fn dispatcher(probe: &Arc<Probe>) -> Dispatcher {
    Dispatcher::new(vec![Arc::new(Test {
        inner: CpuEngine::with_lanes(1).into_engine(),
        probe: Arc::clone(probe),
    })])
    .unwrap()
}

fn job(key: KeyId, i: u8) -> Job {
    Job::new(
        Cipher::AES_128_CTR,
        Direction::Encrypt,
        key,
        [i; 16],
        vec![i; 100],
    )
}

#[test]
fn removal_waits_for_the_running_batch() {
    let probe = Arc::new(Probe {
        hold: true,
        ..Probe::default()
    });
    let d = dispatcher(&probe);
    let key = d.add_key(Key::new(vec![9; 16])).unwrap();
    let removed = AtomicBool::new(false);
    std::thread::scope(|s| {
        let batch = s.spawn(|| d.run(&[job(key, 1)], &Pull).unwrap());
        while !probe.started.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        let remover = s.spawn(|| {
            d.remove_key(key).unwrap();
            removed.store(true, Ordering::SeqCst);
        });
        // A removal that did not wait would be done long before this.
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !removed.load(Ordering::SeqCst),
            "key removed during a batch"
        );
        *probe.released.lock().unwrap() = true;
        probe.wake.notify_all();
        let result = batch.join().unwrap();
        let want = openssl::symm::encrypt(
            openssl::symm::Cipher::aes_128_ctr(),
            &[9; 16],
            Some(&[1; 16]),
            &[1; 100],
        )
        .unwrap();
        assert_eq!(result.outputs[0].as_ref().unwrap().data, want);
        remover.join().unwrap();
    });
    assert!(removed.load(Ordering::SeqCst));
    let after = d.run(&[job(key, 1)], &Pull).unwrap();
    assert!(matches!(after.outputs[0], Err(Error::UnknownKey(id)) if id == key.0));
    assert!(d.keys().is_empty());
    assert!(matches!(d.remove_key(key), Err(Error::UnknownKey(_))));
}

/// Registers, uses and removes `n` keys, one batch each; returns the lane's opens.
fn churn(forgets: bool, n: usize) -> (usize, usize) {
    let probe = Arc::new(Probe {
        forgets,
        ..Probe::default()
    });
    let d = dispatcher(&probe);
    let mut seen = Vec::new();
    for i in 0..n {
        let key = d.add_key(Key::new(vec![i as u8; 16])).unwrap();
        assert!(!seen.contains(&key), "key id {key:?} reused");
        seen.push(key);
        let r = d.run(&[job(key, i as u8)], &Pull).unwrap();
        assert!(r.outputs[0].is_ok());
        d.remove_key(key).unwrap();
    }
    assert!(d.keys().is_empty());
    (
        probe.opened.load(Ordering::SeqCst),
        probe.forgot.load(Ordering::SeqCst),
    )
}

#[test]
fn lanes_forget_removed_keys_or_are_reopened() {
    // Every 64 removals the lane is asked to forget them all.
    assert_eq!(churn(true, 200), (1, 192));
    // A lane that cannot forget is closed and opened afresh instead.
    assert_eq!(churn(false, 200), (4, 192));
}
