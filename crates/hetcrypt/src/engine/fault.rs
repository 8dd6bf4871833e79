//! A test tool: wraps an engine and makes it fail on purpose, to exercise fail-over.
//!
//! Not an engine anyone should run for real; it exists so tests can prove that an
//! engine failing mid-batch loses no job and runs none twice, and (with a declared
//! job size limit) that the dispatcher never hands an engine a job above its limit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::cipher::{Cipher, Direction};
use crate::engine::{Engine, EngineInfo, EngineKind, EngineRef, Lane};
use crate::error::{Error, Result};
use crate::job::{Job, JobOutput};
use crate::key::{KeyId, KeyStore};

/// When the wrapped engine starts failing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// After this many jobs (over all lanes, and over the wrapper's whole life: build a
    /// fresh one per dispatcher) have run, every further job fails, as a
    /// device that vanishes mid-batch.
    AfterJobs(usize),
    /// Lanes cannot even be opened, as a device that is gone before the batch.
    OnOpen,
    /// Every this-many-th job (counted over all lanes) is refused with
    /// [`Error::EngineBusy`], as a device out of sessions now and then; the engine
    /// stays in service.
    BusyEvery(usize),
}

/// An engine that behaves like `inner` until its [`Fault`] triggers, then fails every
/// job with [`Error::EngineFailed`] (or, with [`Fault::BusyEvery`], refuses some jobs
/// as busy).
pub struct FaultyEngine {
    name: String,
    inner: EngineRef,
    fault: Fault,
    ran: Arc<AtomicUsize>,
    max_job_len: Option<usize>,
}

impl FaultyEngine {
    /// Wraps `inner` under a new `name`.
    pub fn new(name: impl Into<String>, inner: EngineRef, fault: Fault) -> Self {
        FaultyEngine {
            name: name.into(),
            inner,
            fault,
            ran: Arc::new(AtomicUsize::new(0)),
            max_job_len: None,
        }
    }

    /// Declares a largest job of `max` bytes (input plus AAD) for every cipher, the
    /// tighter of it and the inner engine's, and refuses any larger job it is given
    /// with [`Error::TooLarge`], as an AF_ALG AEAD request above the socket buffers is.
    pub fn with_max_job_len(mut self, max: usize) -> Self {
        self.max_job_len = Some(max);
        self
    }

    /// Wraps the engine for a dispatcher.
    pub fn into_engine(self) -> EngineRef {
        Arc::new(self)
    }
}

impl Engine for FaultyEngine {
    fn name(&self) -> &str {
        &self.name
    }

    fn info(&self) -> EngineInfo {
        EngineInfo {
            name: self.name.clone(),
            kind: EngineKind::FaultInjection,
            ..self.inner.info()
        }
    }

    fn kind(&self) -> EngineKind {
        EngineKind::FaultInjection
    }

    fn lanes(&self) -> usize {
        self.inner.lanes()
    }

    fn supports(&self, cipher: Cipher, direction: Direction) -> bool {
        self.inner.supports(cipher, direction)
    }

    fn open_lane(&self, index: usize) -> Result<Box<dyn Lane>> {
        if self.fault == Fault::OnOpen {
            return Err(Error::EngineUnavailable {
                engine: self.name.clone(),
                reason: "injected fault: device gone".to_string(),
            });
        }
        Ok(Box::new(FaultyLane {
            name: self.name.clone(),
            inner: self.inner.open_lane(index)?,
            fault: self.fault,
            ran: Arc::clone(&self.ran),
            max_job_len: self.max_job_len,
        }))
    }

    fn max_batch(&self) -> usize {
        self.inner.max_batch()
    }

    fn batch_width(&self, cipher: Cipher, direction: Direction) -> usize {
        self.inner.batch_width(cipher, direction)
    }

    fn max_job_len(&self, cipher: Cipher, direction: Direction) -> Option<usize> {
        match (self.max_job_len, self.inner.max_job_len(cipher, direction)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn uses_host_cpu(&self) -> bool {
        self.inner.uses_host_cpu()
    }
}

struct FaultyLane {
    name: String,
    inner: Box<dyn Lane>,
    fault: Fault,
    ran: Arc<AtomicUsize>,
    max_job_len: Option<usize>,
}

impl Lane for FaultyLane {
    fn run(&mut self, job: &Job, keys: &KeyStore, out: &mut JobOutput) -> Result<()> {
        let len = job.input.len() + job.aad.len();
        if let Some(max) = self.max_job_len.filter(|&max| len > max) {
            return Err(Error::TooLarge {
                cipher: job.cipher,
                engine: self.name.clone(),
                len,
                max,
            });
        }
        let n = self.ran.fetch_add(1, Ordering::Relaxed);
        match self.fault {
            Fault::AfterJobs(limit) if n >= limit => Err(Error::EngineFailed {
                engine: self.name.clone(),
                reason: format!("injected fault after {limit} jobs"),
            }),
            Fault::BusyEvery(every) if (n + 1).is_multiple_of(every.max(1)) => {
                Err(Error::EngineBusy {
                    engine: self.name.clone(),
                    reason: format!("injected: every {every}th job refused"),
                })
            }
            _ => self.inner.run(job, keys, out),
        }
    }

    fn forget_keys(&mut self, ids: &[KeyId]) -> bool {
        self.inner.forget_keys(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tests::{Stub, STUB_CIPHER, STUB_MAX_LEN};
    use crate::Key;

    fn wrapped(tuned: bool, fault: Fault) -> FaultyEngine {
        FaultyEngine::new("flaky", Arc::new(Stub { tuned }), fault)
    }

    #[test]
    fn a_faulty_engine_describes_itself_as_its_inner_engine_under_its_own_name() {
        let e = wrapped(true, Fault::AfterJobs(1)).into_engine();
        assert_eq!(e.name(), "flaky");
        let info = e.info();
        assert_eq!(
            (info.name.as_str(), info.kind),
            ("flaky", EngineKind::FaultInjection)
        );
        assert_eq!(info.lanes, 3);
        assert_eq!(info.ciphers, Stub { tuned: true }.info().ciphers);
        assert_eq!(e.lanes(), 3);
        assert!(e.supports(STUB_CIPHER, Direction::Encrypt));
        assert!(!e.supports(STUB_CIPHER, Direction::Decrypt));
        assert_eq!(e.max_batch(), 8);
        assert_eq!(e.batch_width(STUB_CIPHER, Direction::Encrypt), 4);
        assert_eq!(e.batch_width(Cipher::AES_128_GCM, Direction::Encrypt), 2);
        assert!(!e.uses_host_cpu());
        assert!(wrapped(false, Fault::OnOpen).uses_host_cpu());
    }

    #[test]
    fn the_job_size_limit_is_the_tighter_of_the_wrappers_and_the_inner_engines() {
        let enc = Direction::Encrypt;
        let gcm = Cipher::AES_128_GCM;
        // Neither declares one / only the inner / only the wrapper / both.
        assert_eq!(
            wrapped(false, Fault::OnOpen).max_job_len(STUB_CIPHER, enc),
            None
        );
        assert_eq!(
            wrapped(true, Fault::OnOpen).max_job_len(STUB_CIPHER, enc),
            Some(STUB_MAX_LEN)
        );
        let limited = wrapped(true, Fault::OnOpen).with_max_job_len(300);
        assert_eq!(
            limited.max_job_len(gcm, enc),
            Some(300),
            "the inner has none"
        );
        assert_eq!(limited.max_job_len(STUB_CIPHER, enc), Some(300));
        let loose = wrapped(true, Fault::OnOpen).with_max_job_len(5000);
        assert_eq!(loose.max_job_len(STUB_CIPHER, enc), Some(STUB_MAX_LEN));
    }

    fn job(keys: &KeyStore, input: usize, aad: usize) -> Job {
        let key = keys.add(Key::new(vec![1; 16])).expect("a 16-byte key");
        Job::new(
            STUB_CIPHER,
            Direction::Encrypt,
            key,
            [0; 16],
            vec![0x0f; input],
        )
        .aad(vec![0; aad])
    }

    #[test]
    fn jobs_run_until_the_fault_then_every_job_fails_as_the_engine() {
        let keys = KeyStore::new();
        let e = wrapped(false, Fault::AfterJobs(2));
        // The count is shared by the lanes.
        let mut lanes = [e.open_lane(0).unwrap(), e.open_lane(1).unwrap()];
        let mut out = JobOutput::default();
        lanes[0].run(&job(&keys, 4, 0), &keys, &mut out).unwrap();
        assert_eq!(out.data, [0xf0; 4], "the inner engine ran it");
        lanes[1].run(&job(&keys, 2, 0), &keys, &mut out).unwrap();
        for lane in &mut lanes {
            match lane.run(&job(&keys, 1, 0), &keys, &mut out) {
                Err(Error::EngineFailed { engine, reason }) => {
                    assert_eq!(engine, "flaky");
                    assert!(reason.contains("after 2 jobs"), "{reason}");
                }
                other => panic!("the third job: {other:?}"),
            }
        }
        let none = wrapped(false, Fault::AfterJobs(0));
        let r = none
            .open_lane(0)
            .unwrap()
            .run(&job(&keys, 1, 0), &keys, &mut out);
        assert!(matches!(r, Err(Error::EngineFailed { .. })), "{r:?}");
    }

    #[test]
    fn a_fault_on_open_refuses_lanes_and_no_fault_yet_opens_them() {
        match wrapped(false, Fault::OnOpen).open_lane(0) {
            Err(Error::EngineUnavailable { engine, .. }) => assert_eq!(engine, "flaky"),
            other => panic!("opened: {:?}", other.err()),
        }
        assert!(wrapped(false, Fault::AfterJobs(1)).open_lane(0).is_ok());
    }

    #[test]
    fn a_job_above_the_limit_counting_its_aad_is_refused_and_not_counted() {
        let keys = KeyStore::new();
        let e = wrapped(false, Fault::AfterJobs(1)).with_max_job_len(10);
        let mut lane = e.open_lane(0).unwrap();
        let mut out = JobOutput::default();
        // 6 + 5 = 11 bytes: too large; 6 - 5 or 6 * 5 would misjudge it.
        match lane.run(&job(&keys, 6, 5), &keys, &mut out) {
            Err(Error::TooLarge {
                engine, len, max, ..
            }) => {
                assert_eq!((engine.as_str(), len, max), ("flaky", 11, 10));
            }
            other => panic!("11 bytes over a limit of 10: {other:?}"),
        }
        // 4 + 6 = 10 bytes, exactly the limit: runs (the only good job, as the
        // refusal did not count).
        lane.run(&job(&keys, 4, 6), &keys, &mut out)
            .expect("a job of exactly the limit runs");
        // 2 + 3 = 5 bytes: well under (2 * 3 = 6 would still pass; the count fails it).
        let r = lane.run(&job(&keys, 2, 3), &keys, &mut out);
        assert!(matches!(r, Err(Error::EngineFailed { .. })), "{r:?}");
    }

    #[test]
    fn forgetting_keys_is_left_to_the_inner_lane() {
        let e = wrapped(true, Fault::AfterJobs(0));
        let mut lane = e.open_lane(0).unwrap();
        assert!(lane.forget_keys(&[KeyId(3)]));
        assert!(!lane.forget_keys(&[]));
    }
}
