//! A test tool: wraps an engine and makes it fail on purpose, to exercise fail-over.
//!
//! Not an engine anyone should run for real; it exists so tests can prove that an
//! engine failing mid-batch loses no job and runs none twice.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::cipher::{Cipher, Direction};
use crate::engine::{Engine, EngineInfo, EngineKind, EngineRef, Lane};
use crate::error::{Error, Result};
use crate::job::{Job, JobOutput};
use crate::key::KeyStore;

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
}

impl FaultyEngine {
    /// Wraps `inner` under a new `name`.
    pub fn new(name: impl Into<String>, inner: EngineRef, fault: Fault) -> Self {
        FaultyEngine {
            name: name.into(),
            inner,
            fault,
            ran: Arc::new(AtomicUsize::new(0)),
        }
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
        }))
    }

    fn max_batch(&self) -> usize {
        self.inner.max_batch()
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
}

impl Lane for FaultyLane {
    fn run(&mut self, job: &Job, keys: &KeyStore, out: &mut JobOutput) -> Result<()> {
        let n = self.ran.fetch_add(1, Ordering::Relaxed);
        match self.fault {
            Fault::AfterJobs(limit) if n >= limit => Err(Error::EngineFailed {
                engine: self.name.clone(),
                reason: format!("injected fault after {limit} jobs"),
            }),
            _ => self.inner.run(job, keys, out),
        }
    }
}
