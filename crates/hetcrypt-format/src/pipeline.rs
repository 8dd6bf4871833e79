//! The pipeline: the chunks of many messages become dispatcher batches, so every
//! engine works on every file in flight, with bounded memory.
//!
//! One round: take up to [`WINDOW_CHUNKS`] chunk jobs from the streams in order (the
//! rest of the current message, then the next messages), run them as one dispatcher
//! batch under the policy, hand every output back to its stream in order, finish the
//! streams whose last chunk came back, repeat. A stream that fails (bad header, bad
//! chunk, I/O error) is finished with its error; the others go on.
//!
//! One dispatcher serves the whole run, so its lanes (and a device's sessions) stay
//! open: each finished message's key is removed from it, which also drops the lanes'
//! per-key contexts, and each batch's outputs are written into the buffers of the
//! previous batch's (fresh output memory cost more than encrypting it on our VM).

use std::collections::VecDeque;

use hetcrypt::engine::EngineRef;
use hetcrypt::policy::Policy;
use hetcrypt::{Dispatcher, Job, JobOutput, KeyId, Report};
use serde::Serialize;

use crate::error::{FormatError, Result};

/// Chunks in one dispatcher batch: 256 x 16 KiB = 4 MiB of input (and as much output)
/// in memory whatever the number and size of files. Enough jobs that every lane of a
/// few engines (2 CPU lanes, a module's 4–8 in-flight requests) gets dozens per batch,
/// so the batch's start and join cost is amortised; small enough for the 512 MiB
/// boards the seeds target.
pub const WINDOW_CHUNKS: usize = 256;

/// One message in flight: hands out chunk jobs in order and takes their outputs back
/// in the same order.
pub trait Stream {
    /// The next chunk's job, or `None` when every chunk has been handed out. An error
    /// ends the stream.
    fn next_job(&mut self, dispatcher: &Dispatcher) -> Result<Option<Job>>;

    /// The output of the earliest job handed out and not yet accepted. An error ends
    /// the stream. The default accepts it without keeping its buffer.
    fn accept(&mut self, output: hetcrypt::Result<JobOutput>) -> Result<()> {
        self.accept_reusing(output, &mut Vec::new())
    }

    /// Every job's output was accepted: complete the message (flush, final checks).
    fn finish(&mut self) -> Result<()>;

    /// Like [`Stream::accept`], and the stream may push the output's buffer, emptied,
    /// onto `spare` for the next batch to write into.
    fn accept_reusing(
        &mut self,
        output: hetcrypt::Result<JobOutput>,
        spare: &mut Vec<JobOutput>,
    ) -> Result<()>;

    /// The key this stream registered with the dispatcher, if any: the pipeline
    /// removes it once the stream is done. The default registers none.
    fn key(&self) -> Option<KeyId> {
        None
    }
}

/// What the pipeline tells its caller.
pub trait Observer<S> {
    /// `stream` is done: `result` says whether the whole message went through.
    fn done(&mut self, stream: S, result: Result<()>);

    /// A batch ran (for progress displays).
    fn batch(&mut self, report: &Report) {
        let _ = report;
    }
}

/// One engine's share of a pipeline run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct EngineShare {
    /// The engine's name.
    pub name: String,
    /// Chunk jobs it ran.
    pub jobs: u64,
    /// Input bytes of those jobs.
    pub bytes: u64,
    /// Busy time of its lanes, in seconds.
    pub busy_s: f64,
    /// Why it was quarantined, if it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

/// What a pipeline run did, summed over its batches.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    /// Dispatcher batches run.
    pub batches: u64,
    /// Chunk jobs run.
    pub jobs: u64,
    /// Input bytes of the jobs.
    pub bytes: u64,
    /// Time inside dispatcher batches, in seconds (the rest is I/O and HMAC).
    pub crypto_s: f64,
    /// Jobs moved from a failed engine to another.
    pub redispatched: u64,
    /// Per engine, in dispatcher order.
    pub engines: Vec<EngineShare>,
}

impl Stats {
    fn add(&mut self, report: &Report) {
        self.batches += 1;
        self.jobs += report.jobs as u64;
        self.bytes += report.bytes;
        self.crypto_s += report.wall.as_secs_f64();
        self.redispatched += report.redispatched as u64;
        for e in &report.engines {
            let share = match self.engines.iter_mut().find(|s| s.name == e.name) {
                Some(s) => s,
                None => {
                    self.engines.push(EngineShare {
                        name: e.name.clone(),
                        ..EngineShare::default()
                    });
                    self.engines.last_mut().expect("just pushed")
                }
            };
            share.jobs += e.jobs as u64;
            share.bytes += e.bytes;
            share.busy_s += e.busy.as_secs_f64();
            if e.failed.is_some() {
                share.failed.clone_from(&e.failed);
            }
        }
    }
}

/// A stream in flight.
struct Slot<S> {
    stream: S,
    exhausted: bool,
    failed: Option<FormatError>,
}

/// Runs streams through a dispatcher in bounded windows.
pub struct Pipeline<'p> {
    dispatcher: Dispatcher,
    policy: &'p dyn Policy,
    window: usize,
    stats: Stats,
}

impl std::fmt::Debug for Pipeline<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("dispatcher", &self.dispatcher)
            .field("policy", &self.policy.name())
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

impl<'p> Pipeline<'p> {
    /// A pipeline over these engines under `policy`.
    pub fn new(engines: Vec<EngineRef>, policy: &'p dyn Policy) -> Result<Self> {
        Ok(Pipeline {
            dispatcher: Dispatcher::new(engines)?,
            policy,
            window: WINDOW_CHUNKS,
            stats: Stats::default(),
        })
    }

    /// Sets the number of chunks per batch (at least 1).
    pub fn window(mut self, chunks: usize) -> Self {
        self.window = chunks.max(1);
        self
    }

    /// What the runs so far did.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The dispatcher the streams run on (its keys: those of the messages in flight).
    /// An engine that fails is quarantined in it for the pipeline's lifetime (retrying
    /// a vanished device can crash the kernel).
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    /// Ends a stream: removes its key from the dispatcher (no batch is running) and
    /// tells the observer.
    fn done<S: Stream>(&self, stream: S, result: Result<()>, observer: &mut impl Observer<S>) {
        if let Some(key) = stream.key() {
            let removed = self.dispatcher.remove_key(key);
            debug_assert!(removed.is_ok(), "a stream's key was removed twice");
        }
        observer.done(stream, result);
    }

    /// Runs every stream to completion (or failure), telling `observer` about each.
    /// Fails as a whole only when a batch cannot be planned (e.g. a policy naming an
    /// engine that is not there); the streams in flight then end with that error too.
    pub fn run<S: Stream>(
        &mut self,
        streams: impl IntoIterator<Item = S>,
        observer: &mut impl Observer<S>,
    ) -> Result<()> {
        let mut pending = streams.into_iter();
        let mut active: VecDeque<Slot<S>> = VecDeque::new();
        let mut jobs: Vec<Job> = Vec::with_capacity(self.window);
        let mut owners: Vec<usize> = Vec::with_capacity(self.window);
        // Output buffers the streams are done with, for the next batch to write into.
        let mut spare: Vec<JobOutput> = Vec::with_capacity(self.window);
        let mut more = true;
        loop {
            // Fill the window.
            jobs.clear();
            owners.clear();
            while jobs.len() < self.window {
                let open = active.back().is_some_and(|s| !s.exhausted);
                if !open {
                    if !more {
                        break;
                    }
                    match pending.next() {
                        Some(stream) => {
                            active.push_back(Slot {
                                stream,
                                exhausted: false,
                                failed: None,
                            });
                        }
                        None => {
                            more = false;
                            break;
                        }
                    }
                }
                let index = active.len() - 1;
                let slot = active.back_mut().expect("pushed or open");
                match slot.stream.next_job(&self.dispatcher) {
                    Ok(Some(job)) => {
                        jobs.push(job);
                        owners.push(index);
                    }
                    Ok(None) => slot.exhausted = true,
                    Err(e) => {
                        slot.exhausted = true;
                        slot.failed = Some(e);
                    }
                }
            }
            if jobs.is_empty() && active.is_empty() && !more {
                return Ok(());
            }

            // Run the batch and hand the outputs back in order.
            if !jobs.is_empty() {
                let batch = match self.dispatcher.run_reusing(
                    &jobs,
                    self.policy,
                    std::mem::take(&mut spare),
                ) {
                    Ok(batch) => batch,
                    Err(e) => {
                        let reason = e.to_string();
                        for slot in active.drain(..) {
                            self.done(
                                slot.stream,
                                Err(FormatError::Engine(hetcrypt::Error::Policy {
                                    policy: self.policy.name(),
                                    reason: reason.clone(),
                                })),
                                observer,
                            );
                        }
                        return Err(e.into());
                    }
                };
                self.stats.add(&batch.report);
                observer.batch(&batch.report);
                for (output, &owner) in batch.outputs.into_iter().zip(&owners) {
                    let slot = &mut active[owner];
                    if slot.failed.is_none() {
                        if let Err(e) = slot.stream.accept_reusing(output, &mut spare) {
                            // A failed stream is asked for no more chunks: a bad
                            // chunk or a full disk ends the file at once, not after
                            // reading the rest of it (maybe a terabyte of padding).
                            slot.failed = Some(e);
                            slot.exhausted = true;
                        }
                    }
                }
            }

            // Finish every stream whose chunks have all come back: all but the last
            // slot are exhausted, and the last one too when the window did not cut it.
            while active.front().is_some_and(|s| s.exhausted) {
                let Slot {
                    mut stream, failed, ..
                } = active.pop_front().expect("front exists");
                let result = match failed {
                    Some(e) => Err(e),
                    None => stream.finish(),
                };
                self.done(stream, result, observer);
            }
        }
    }
}
