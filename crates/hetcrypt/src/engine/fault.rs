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
}

/// An engine that behaves like `inner` until its [`Fault`] triggers, then fails every
/// job with [`Error::EngineFailed`].
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
            _ => self.inner.run(job, keys, out),
        }
    }

    fn forget_keys(&mut self, ids: &[KeyId]) -> bool {
        self.inner.forget_keys(ids)
    }
}
