//! The pipeline: the chunks of many messages become dispatcher batches, so every
//! engine works on every file in flight, with bounded memory.
//!
//! One round: take up to [`WINDOW_CHUNKS`] chunk jobs from the streams in order (the
//! rest of the current message, then the next messages), run them as one dispatcher
//! batch under the policy, hand every output back to its stream in order, finish the
//! streams whose last chunk came back, repeat. Rounds overlap: while the engines run
//! one batch, the streams write the previous batch's outputs and read the next
//! batch's inputs, so reading, encrypting and writing go on at once (a batch of small
//! messages runs in-line on the reading thread: see [`IN_LINE_MESSAGE_BYTES`]). A
//! stream that fails (bad header, bad chunk, I/O error) is finished with its error; the
//! others go on.
//!
//! One dispatcher serves the whole run, so its lanes (and a device's sessions) stay
//! open: each finished message's key is removed from it, which also drops the lanes'
//! per-key contexts, and each batch's outputs are written into the buffers of the
//! previous batch's (fresh output memory cost more than encrypting it on our VM), or,
//! where a large file's batches run in-line on one lane and the engine can, into the
//! inputs' own buffers (see [`Pipeline::spread`]).

use std::collections::VecDeque;
use std::sync::mpsc;

use hetcrypt::engine::EngineRef;
use hetcrypt::policy::Policy;
use hetcrypt::{BatchResult, Dispatcher, Job, JobOutput, KeyId, Report};
use serde::Serialize;

use crate::error::{FormatError, Result};

/// Chunks in one dispatcher batch: 256 x 16 KiB = 4 MiB of input (and as much output)
/// in memory whatever the number and size of files. Enough jobs that every lane of a
/// few engines (2 CPU lanes, a module's 4–8 in-flight requests) gets dozens per batch,
/// so the batch's start and join cost is amortised; small enough for the 512 MiB
/// boards the seeds target.
pub const WINDOW_CHUNKS: usize = 256;

/// A batch whose jobs hold at most this many input bytes per message on average (two
/// chunks) runs on the pipeline's own thread, on one lane, in-line, after the batch
/// before (see [`Dispatcher::run_reusing_in_line`]): its messages are small files, each
/// costing more to open, read, make and name than to encrypt, and that work keeps the
/// other cores busy. Handed to the engines' thread, such a batch cost two lane threads'
/// starts and joins, and the reading thread then waited for it behind the writers
/// (16-35 ms of a 4,000 x 16 KiB tree's run). A large file's batches (one message each)
/// still run beside the reading, on every lane; with several engines or a device, every
/// batch does.
pub const IN_LINE_MESSAGE_BYTES: usize = 2 * crate::CHUNK_SIZE;

/// Windows in memory at once: one being read, one on the engines, one being written
/// (the one being read and the one being written are the streams' buffers, the one on
/// the engines has its inputs and outputs). See [`Pipeline::run`].
pub const IN_FLIGHT_WINDOWS: usize = 3;

/// One message in flight: hands out chunk jobs in order and takes their outputs back
/// in the same order.
pub trait Stream {
    /// The next chunk's job, or `None` when every chunk has been handed out. An error
    /// ends the stream.
    fn next_job(&mut self, dispatcher: &Dispatcher) -> Result<Option<Job>>;

    /// Like [`Stream::next_job`], and the stream may take the job's input buffer from
    /// `buffers` (inputs of earlier batches, emptied). The default takes none.
    fn next_job_into(
        &mut self,
        dispatcher: &Dispatcher,
        buffers: &mut Vec<Vec<u8>>,
    ) -> Result<Option<Job>> {
        let _ = buffers;
        self.next_job(dispatcher)
    }

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
    /// Jobs handed out, and outputs come back (accepted, or dropped after a failure):
    /// the stream is finished once it is exhausted and every output came back.
    handed: u64,
    returned: u64,
}

/// Chunk jobs filled for one batch, and the stream (by its number in the run) that
/// each belongs to.
struct Batch {
    jobs: Vec<Job>,
    owners: Vec<u64>,
}

impl Batch {
    /// Whether its messages are small: at most [`IN_LINE_MESSAGE_BYTES`] of input per
    /// message on average.
    fn of_small_messages(&self) -> bool {
        let messages = 1 + self.owners.windows(2).filter(|w| w[0] != w[1]).count();
        let bytes: usize = self.jobs.iter().map(|j| j.input.len()).sum();
        bytes <= messages.saturating_mul(IN_LINE_MESSAGE_BYTES)
    }
}

/// Runs streams through a dispatcher in bounded windows.
pub struct Pipeline<'p> {
    dispatcher: Dispatcher,
    policy: &'p dyn Policy,
    window: usize,
    overlap: bool,
    spread: bool,
    stats: Stats,
}

/// A batch that ran, joined: its jobs and result.
type Ran = Option<(Batch, BatchResult)>;

/// A batch sent to the engines' thread, with the output buffers it may write into.
type ToRun = (Batch, Vec<JobOutput>);

/// A batch the engines' thread ran, with its result.
type RanBatch = (Batch, hetcrypt::Result<BatchResult>);

/// Waits for the batch the engines' thread is running, if any; its error if it could
/// not be planned. A panic on that thread goes on here.
fn finish_batch(
    running: &mut bool,
    ran: &mpsc::Receiver<RanBatch>,
    engines: &mut Option<std::thread::ScopedJoinHandle<'_, ()>>,
) -> hetcrypt::Result<Ran> {
    if !std::mem::take(running) {
        return Ok(None);
    }
    match ran.recv() {
        Ok((batch, result)) => result.map(|r| Some((batch, r))),
        // The thread ended without an answer: it panicked.
        Err(mpsc::RecvError) => match engines.take().map(std::thread::ScopedJoinHandle::join) {
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            _ => unreachable!("the engines' thread answers every batch unless it panics"),
        },
    }
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

/// The streams of one run: those in flight, in order, and those not started.
struct Flight<S, I> {
    pending: I,
    more: bool,
    active: VecDeque<Slot<S>>,
    /// The run's number of `active[0]`.
    base: u64,
    /// Keys of finished streams, removed from the dispatcher between two batches
    /// (removing a key waits for the running batch).
    retired: Vec<KeyId>,
    /// Input buffers of batches that ran, for the streams to read into again (at most
    /// a window's worth).
    inputs: Vec<Vec<u8>>,
}

impl<S: Stream, I: Iterator<Item = S>> Flight<S, I> {
    /// Reads up to `window` chunk jobs from the streams in order (the rest of the
    /// current message, then the next messages).
    fn fill(&mut self, dispatcher: &Dispatcher, window: usize) -> Batch {
        let mut batch = Batch {
            jobs: Vec::with_capacity(window),
            owners: Vec::with_capacity(window),
        };
        while batch.jobs.len() < window {
            let open = self.active.back().is_some_and(|s| !s.exhausted);
            if !open {
                if !self.more {
                    break;
                }
                match self.pending.next() {
                    Some(stream) => self.active.push_back(Slot {
                        stream,
                        exhausted: false,
                        failed: None,
                        handed: 0,
                        returned: 0,
                    }),
                    None => {
                        self.more = false;
                        break;
                    }
                }
            }
            let owner = self.base + self.active.len() as u64 - 1;
            let slot = self.active.back_mut().expect("pushed or open");
            match slot.stream.next_job_into(dispatcher, &mut self.inputs) {
                Ok(Some(job)) => {
                    batch.jobs.push(job);
                    batch.owners.push(owner);
                    slot.handed += 1;
                }
                Ok(None) => slot.exhausted = true,
                Err(e) => {
                    slot.exhausted = true;
                    slot.failed = Some(e);
                }
            }
        }
        batch
    }

    /// A batch that ran: its report counted and told, its outputs handed back to their
    /// streams (their buffers kept in `spare`), its input buffers kept for reading into.
    fn land(
        &mut self,
        batch: Batch,
        result: BatchResult,
        window: usize,
        spare: &mut Vec<JobOutput>,
        stats: &mut Stats,
        observer: &mut impl Observer<S>,
    ) {
        stats.add(&result.report);
        observer.batch(&result.report);
        self.accept(&batch.owners, result.outputs, spare);
        for job in batch.jobs {
            // An empty last chunk may own no memory: nothing to reuse.
            if self.inputs.len() < window && job.input.capacity() > 0 {
                self.inputs.push(job.input);
            }
        }
    }

    /// Hands a batch's outputs back to their streams, in order.
    fn accept(
        &mut self,
        owners: &[u64],
        outputs: Vec<hetcrypt::Result<JobOutput>>,
        spare: &mut Vec<JobOutput>,
    ) {
        for (output, &owner) in outputs.into_iter().zip(owners) {
            let slot = &mut self.active[(owner - self.base) as usize];
            slot.returned += 1;
            if slot.failed.is_none() {
                if let Err(e) = slot.stream.accept_reusing(output, spare) {
                    // A failed stream is asked for no more chunks: a bad chunk or a
                    // full disk ends the file at once, not after reading the rest of
                    // it (maybe a terabyte of padding).
                    slot.failed = Some(e);
                    slot.exhausted = true;
                }
            }
        }
    }

    /// Finishes, in order, every stream whose chunks have all come back.
    fn finish_ready(&mut self, observer: &mut impl Observer<S>) {
        while self
            .active
            .front()
            .is_some_and(|s| s.exhausted && s.returned == s.handed)
        {
            let Slot {
                mut stream, failed, ..
            } = self.active.pop_front().expect("front exists");
            self.base += 1;
            let result = match failed {
                Some(e) => Err(e),
                None => stream.finish(),
            };
            self.retire(stream, result, observer);
        }
    }

    /// Ends a stream: its key is kept to be removed between batches; the observer is
    /// told.
    fn retire(&mut self, stream: S, result: Result<()>, observer: &mut impl Observer<S>) {
        if let Some(key) = stream.key() {
            self.retired.push(key);
        }
        observer.done(stream, result);
    }

    /// Removes the finished streams' keys; no batch may be running.
    fn remove_keys(&mut self, dispatcher: &Dispatcher) {
        for key in self.retired.drain(..) {
            let removed = dispatcher.remove_key(key);
            debug_assert!(removed.is_ok(), "a stream's key was removed twice");
        }
    }
}

impl<'p> Pipeline<'p> {
    /// A pipeline over these engines under `policy`.
    pub fn new(engines: Vec<EngineRef>, policy: &'p dyn Policy) -> Result<Self> {
        Ok(Pipeline {
            dispatcher: Dispatcher::new(engines)?,
            policy,
            window: WINDOW_CHUNKS,
            overlap: true,
            spread: true,
            stats: Stats::default(),
        })
    }

    /// Sets the number of chunks per batch (at least 1).
    pub fn window(mut self, chunks: usize) -> Self {
        self.window = chunks.max(1);
        self
    }

    /// Whether batches overlap the streams' reading and writing (the default). Turn
    /// it off for inputs that may stall, such as a pipe whose writer pauses: with
    /// overlap, the outputs of the batch before wait until the next batch is read, so
    /// a consumer downstream would wait for input that may never come.
    pub fn overlap(mut self, overlap: bool) -> Self {
        self.overlap = overlap;
        self
    }

    /// Whether a batch of large messages runs on every lane (the default), or, where
    /// the dispatcher can run batches in-line (see [`Dispatcher::runs_in_line`]), on
    /// one lane on the engines' thread, beside this thread's reading and writing. For
    /// hosts with no core to spare for more lanes: on a large file the reading thread
    /// and a writer behind it keep two cores busy, and two lane threads started and
    /// joined per batch then only compete with them for the same cores (on 2 cores,
    /// 1 GiB on tmpfs: 1,026 thread starts, about 15% of the run's CPU time; see
    /// docs/performance.md, "Twentieth session"). There each chunk is sealed or opened
    /// in its own read buffer where the engine can
    /// ([`Dispatcher::run_in_place_in_line`]: no copy into the output first).
    pub fn spread(mut self, spread: bool) -> Self {
        self.spread = spread;
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

    /// Runs every stream to completion (or failure), telling `observer` about each.
    /// Fails as a whole only when a batch cannot be planned (e.g. a policy naming an
    /// engine that is not there); the streams in flight then end with that error too.
    ///
    /// Batches overlap the streams' I/O: while the engines run batch *n* (on the run's
    /// one engines thread, its lanes on theirs), this thread writes the outputs of batch
    /// *n - 1* and reads the inputs of batch *n + 1*. So at most [`IN_FLIGHT_WINDOWS`]
    /// windows of inputs and as many of outputs are in memory. A batch of small messages
    /// runs on this thread instead, in-line, in turn with the reading (see
    /// [`IN_LINE_MESSAGE_BYTES`]).
    pub fn run<S: Stream>(
        &mut self,
        streams: impl IntoIterator<Item = S>,
        observer: &mut impl Observer<S>,
    ) -> Result<()> {
        let mut flight = Flight {
            pending: streams.into_iter(),
            more: true,
            active: VecDeque::new(),
            base: 0,
            retired: Vec::new(),
            inputs: Vec::new(),
        };
        let (dispatcher, policy, window, overlap) =
            (&self.dispatcher, self.policy, self.window, self.overlap);
        let in_line = dispatcher.runs_in_line();
        // Large batches on one lane, in-line on the engines' thread: no lane threads.
        let one_lane = in_line && !self.spread;
        let stats = &mut self.stats;
        // Output buffers the streams are done with, for the next batch to write into.
        let mut spare: Vec<JobOutput> = Vec::with_capacity(window);
        let outcome: hetcrypt::Result<()> = std::thread::scope(|scope| {
            // One thread runs the batches, one after another, for the whole run: a
            // thread started and joined per batch cost about 3% of a tree of small
            // files (about a batch per 128 files).
            let (to_engines, batches) = mpsc::sync_channel::<ToRun>(1);
            let (ran_tx, ran) = mpsc::sync_channel::<RanBatch>(1);
            let mut engines = Some(scope.spawn(move || {
                for (mut batch, reuse) in batches {
                    let result = if one_lane {
                        // The chunks' input buffers become their outputs (no copy);
                        // the jobs take the spare buffers back for reading into.
                        dispatcher.run_in_place_in_line(&mut batch.jobs, policy, reuse)
                    } else {
                        dispatcher.run_reusing(&batch.jobs, policy, reuse)
                    };
                    if ran_tx.send((batch, result)).is_err() {
                        return;
                    }
                }
            }));
            let mut running = false;
            loop {
                // Read the next batch while the engines run the current one.
                let next = flight.fill(dispatcher, window);
                let mut done = finish_batch(&mut running, &ran, &mut engines)?;
                // No batch runs now: the finished streams' keys can go.
                flight.remove_keys(dispatcher);
                let mut ran_here = None;
                if !next.jobs.is_empty() {
                    if in_line && next.of_small_messages() {
                        // Small files: here, in-line, once the batch before is written
                        // and the streams it completed are finished (should this batch
                        // fail, they keep their results).
                        if let Some((batch, result)) = done.take() {
                            flight.land(batch, result, window, &mut spare, stats, observer);
                        }
                        flight.finish_ready(observer);
                        let reuse = std::mem::take(&mut spare);
                        let result = dispatcher.run_reusing_in_line(&next.jobs, policy, reuse)?;
                        ran_here = Some((next, result));
                    } else {
                        // The thread takes batches until this sender goes: the send
                        // fails only if it panicked, which waiting for the batch then
                        // raises.
                        let reuse = std::mem::take(&mut spare);
                        let _ = to_engines.send((next, reuse));
                        running = true;
                    }
                }
                if !overlap && running {
                    // In turn: this batch's outputs are written before more is read.
                    done = finish_batch(&mut running, &ran, &mut engines)?;
                }
                // Write the outputs of the batch that ran while the next one runs (or
                // of the batch that ran here).
                for (batch, result) in done.into_iter().chain(ran_here) {
                    flight.land(batch, result, window, &mut spare, stats, observer);
                }
                flight.finish_ready(observer);
                if !running && flight.active.is_empty() && !flight.more {
                    return Ok(());
                }
            }
        });
        if let Err(e) = outcome {
            let reason = e.to_string();
            for slot in std::mem::take(&mut flight.active) {
                flight.retire(
                    slot.stream,
                    Err(FormatError::Engine(hetcrypt::Error::Policy {
                        policy: self.policy.name(),
                        reason: reason.clone(),
                    })),
                    observer,
                );
            }
            flight.remove_keys(&self.dispatcher);
            return Err(e.into());
        }
        flight.remove_keys(&self.dispatcher);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Aead, EncryptStream, SealParams, CHUNK_SIZE};
    use hetcrypt::engine::cpu::CpuEngine;

    /// Lanes each batch ran on, and the messages that went through.
    #[derive(Default)]
    struct Lanes {
        per_batch: Vec<usize>,
        ok: usize,
    }

    impl<S> Observer<S> for Lanes {
        fn done(&mut self, _stream: S, result: Result<()>) {
            result.unwrap();
            self.ok += 1;
        }
        fn batch(&mut self, report: &Report) {
            self.per_batch.push(report.engines[0].lanes.len());
        }
    }

    /// Lanes per batch of a run of `messages` messages of `len` bytes each, on a
    /// two-lane `cpu` engine.
    fn lanes_per_batch(messages: usize, len: usize) -> Vec<usize> {
        lanes_per_batch_spread(messages, len, true)
    }

    /// The same, large batches spread over every lane or not (see [`Pipeline::spread`]).
    fn lanes_per_batch_spread(messages: usize, len: usize, spread: bool) -> Vec<usize> {
        let pts: Vec<Vec<u8>> = (0..messages).map(|i| vec![i as u8; len]).collect();
        let key = [7u8; 16];
        let streams = pts.iter().map(|pt| {
            EncryptStream::new(&pt[..], Vec::new(), &key, SealParams::new(Aead::Aes128Gcm))
        });
        let engines = vec![CpuEngine::with_lanes(2).into_engine()];
        let policy = hetcrypt::policy::Pull;
        let mut lanes = Lanes::default();
        Pipeline::new(engines, &policy)
            .unwrap()
            .window(16)
            .spread(spread)
            .run(streams, &mut lanes)
            .unwrap();
        assert_eq!(lanes.ok, messages);
        lanes.per_batch
    }

    #[test]
    fn batches_of_small_messages_run_on_one_lane_and_a_large_message_on_every_lane() {
        let small = lanes_per_batch(40, CHUNK_SIZE);
        assert!(
            small.len() >= 4 && small.iter().all(|&l| l == 1),
            "{small:?}"
        );
        let large = lanes_per_batch(1, 40 * CHUNK_SIZE);
        assert!(
            large.len() >= 2 && large.iter().all(|&l| l == 2),
            "{large:?}"
        );
    }

    #[test]
    fn unspread_a_large_message_runs_on_one_lane_and_comes_out_the_same() {
        let large = lanes_per_batch_spread(1, 40 * CHUNK_SIZE, false);
        assert!(
            large.len() >= 2 && large.iter().all(|&l| l == 1),
            "{large:?}"
        );
        // Encrypted one way, decrypted the other: the same plaintext comes back.
        let pt: Vec<u8> = (0..40 * CHUNK_SIZE + 123).map(|i| (i * 7) as u8).collect();
        let key = [9u8; 16];
        let run =
            |spread: bool, stream: &mut dyn FnMut(&mut Vec<u8>, &mut Lanes, &mut Pipeline<'_>)| {
                let engines = vec![CpuEngine::with_lanes(2).into_engine()];
                let policy = hetcrypt::policy::Pull;
                let mut pipeline = Pipeline::new(engines, &policy)
                    .unwrap()
                    .window(16)
                    .spread(spread);
                let (mut out, mut lanes) = (Vec::new(), Lanes::default());
                stream(&mut out, &mut lanes, &mut pipeline);
                assert_eq!(lanes.ok, 1);
                out
            };
        for spread in [true, false] {
            let ct = run(spread, &mut |out, lanes, pipeline| {
                let s = EncryptStream::new(&pt[..], out, &key, SealParams::new(Aead::Aes128Gcm));
                pipeline.run([s], lanes).unwrap();
            });
            let back = run(!spread, &mut |out, lanes, pipeline| {
                let s = crate::DecryptStream::new(&ct[..], out, &key, crate::OpenParams::Hetcrypt);
                pipeline.run([s], lanes).unwrap();
            });
            assert!(
                back == pt,
                "encrypted spread {spread}, decrypted not: not the plaintext"
            );
        }
    }

    /// A stream with only the methods [`Stream`] requires: `left` AES-128-CTR jobs of
    /// `len` bytes under a key of its own, the lengths of the outputs it accepted.
    #[derive(Default)]
    struct Plain {
        key: Option<KeyId>,
        left: usize,
        len: usize,
        accepted: Vec<usize>,
        finished: bool,
    }

    impl Stream for Plain {
        fn next_job(&mut self, dispatcher: &Dispatcher) -> Result<Option<Job>> {
            if self.left == 0 {
                return Ok(None);
            }
            let key = match self.key {
                Some(key) => key,
                None => *self
                    .key
                    .insert(dispatcher.add_key(hetcrypt::Key::new(vec![3; 16]))?),
            };
            self.left -= 1;
            let (cipher, direction) = (hetcrypt::Cipher::AES_128_CTR, hetcrypt::Direction::Encrypt);
            Ok(Some(Job::with_iv(
                cipher,
                direction,
                key,
                &[0; 16],
                vec![1; self.len],
            )?))
        }

        fn accept_reusing(
            &mut self,
            output: hetcrypt::Result<JobOutput>,
            _spare: &mut Vec<JobOutput>,
        ) -> Result<()> {
            self.accepted.push(output?.data.len());
            Ok(())
        }

        fn finish(&mut self) -> Result<()> {
            self.finished = true;
            Ok(())
        }
    }

    /// The streams that came through, and the batches told.
    #[derive(Default)]
    struct Done {
        streams: Vec<Plain>,
        batches: u64,
    }

    impl Observer<Plain> for Done {
        fn done(&mut self, stream: Plain, result: Result<()>) {
            result.unwrap();
            self.streams.push(stream);
        }
        fn batch(&mut self, _report: &Report) {
            self.batches += 1;
        }
    }

    /// A stream that keeps `Stream`'s default methods goes through a pipeline whole:
    /// `next_job_into` hands out its `next_job`s, and `accept` reaches `accept_reusing`.
    /// The run's stats count every batch and job.
    #[test]
    fn a_stream_with_the_default_methods_goes_through_and_the_stats_count_it() {
        let engines = vec![CpuEngine::with_lanes(2).into_engine()];
        let policy = hetcrypt::policy::Pull;
        let mut pipeline = Pipeline::new(engines, &policy).unwrap().window(4);
        let streams = (0..3).map(|_| Plain {
            left: 5,
            len: 100,
            ..Plain::default()
        });
        let mut done = Done::default();
        pipeline.run(streams, &mut done).unwrap();
        assert_eq!(done.streams.len(), 3);
        for s in &done.streams {
            assert_eq!((s.accepted.as_slice(), s.finished), (&[100; 5][..], true));
        }
        let stats = pipeline.stats();
        assert_eq!(
            (stats.batches, stats.jobs, stats.bytes),
            (done.batches, 15, 1500)
        );
        assert!(
            stats.batches >= 4,
            "{} batches of at most 4 jobs",
            stats.batches
        );
        assert!(stats.crypto_s > 0.0 && stats.redispatched == 0);
        assert_eq!(stats.engines.len(), 1, "{:?}", stats.engines);
        let cpu = &stats.engines[0];
        assert_eq!((cpu.name.as_str(), cpu.jobs, cpu.bytes), ("cpu", 15, 1500));
        assert!(cpu.busy_s > 0.0 && cpu.failed.is_none());
        let debug = format!("{pipeline:?}");
        assert!(
            debug.starts_with("Pipeline") && debug.contains("pull"),
            "{debug}"
        );
        let mut plain = Plain::default();
        let output = JobOutput {
            data: vec![0; 7],
            ..JobOutput::default()
        };
        plain.accept(Ok(output)).unwrap();
        assert_eq!(plain.accepted, [7]);
    }

    /// [`Plain`], and the most emptied input buffers the pipeline offered it.
    struct Watching {
        inner: Plain,
        most: std::rc::Rc<std::cell::Cell<usize>>,
    }

    impl Stream for Watching {
        fn next_job(&mut self, dispatcher: &Dispatcher) -> Result<Option<Job>> {
            self.inner.next_job(dispatcher)
        }

        fn next_job_into(
            &mut self,
            dispatcher: &Dispatcher,
            buffers: &mut Vec<Vec<u8>>,
        ) -> Result<Option<Job>> {
            self.most.set(self.most.get().max(buffers.len()));
            self.inner.next_job(dispatcher)
        }

        fn accept_reusing(
            &mut self,
            output: hetcrypt::Result<JobOutput>,
            spare: &mut Vec<JobOutput>,
        ) -> Result<()> {
            self.inner.accept_reusing(output, spare)
        }

        fn finish(&mut self) -> Result<()> {
            self.inner.finish()
        }
    }

    /// The pipeline keeps the input buffers of batches that ran for the streams to read
    /// into, at most a window of them, however many batches run and whether or not the
    /// streams take them (these never do).
    #[test]
    fn the_pipeline_keeps_at_most_a_window_of_input_buffers() {
        let engines = vec![CpuEngine::with_lanes(2).into_engine()];
        let policy = hetcrypt::policy::Pull;
        let mut pipeline = Pipeline::new(engines, &policy).unwrap().window(4);
        let most = std::rc::Rc::new(std::cell::Cell::new(0));
        let streams = (0..3).map(|_| Watching {
            inner: Plain {
                left: 20,
                len: 100,
                ..Plain::default()
            },
            most: std::rc::Rc::clone(&most),
        });
        let mut lanes = Lanes::default();
        pipeline.run(streams, &mut lanes).unwrap();
        assert_eq!(lanes.ok, 3);
        assert_eq!(most.get(), 4, "a window of buffers, no more");
    }

    /// [`Plain`], logging `n` for each job handed out and `a` for each output accepted.
    struct Logged {
        inner: Plain,
        log: std::rc::Rc<std::cell::RefCell<Vec<char>>>,
    }

    impl Stream for Logged {
        fn next_job(&mut self, dispatcher: &Dispatcher) -> Result<Option<Job>> {
            let job = self.inner.next_job(dispatcher)?;
            if job.is_some() {
                self.log.borrow_mut().push('n');
            }
            Ok(job)
        }

        fn accept_reusing(
            &mut self,
            output: hetcrypt::Result<JobOutput>,
            spare: &mut Vec<JobOutput>,
        ) -> Result<()> {
            self.log.borrow_mut().push('a');
            self.inner.accept_reusing(output, spare)
        }

        fn finish(&mut self) -> Result<()> {
            self.inner.finish()
        }
    }

    /// With overlap (the default) the next batch is read while the engines run one,
    /// so the first outputs are accepted after two windows of jobs were handed out;
    /// without, after one: a batch's outputs are written before more is read.
    #[test]
    fn with_overlap_the_next_batch_is_read_before_the_outputs_are_written() {
        for (overlap, read_first) in [(true, 8), (false, 4)] {
            let engines = vec![CpuEngine::with_lanes(2).into_engine()];
            let policy = hetcrypt::policy::Pull;
            let mut pipeline = Pipeline::new(engines, &policy)
                .unwrap()
                .window(4)
                .overlap(overlap);
            let log = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
            // One message of 16 chunks: large batches, on the engines' thread.
            let stream = Logged {
                inner: Plain {
                    left: 16,
                    len: CHUNK_SIZE,
                    ..Plain::default()
                },
                log: std::rc::Rc::clone(&log),
            };
            let mut lanes = Lanes::default();
            pipeline.run([stream], &mut lanes).unwrap();
            assert_eq!(lanes.ok, 1);
            let log = log.borrow();
            assert_eq!(log.len(), 32);
            let first = log.iter().position(|&c| c == 'a');
            assert_eq!(first, Some(read_first), "overlap {overlap}: {log:?}");
        }
    }

    /// Jobs that an engine failed on run again on another, and the stats say so: the
    /// moved jobs, and which engine failed.
    #[test]
    fn the_stats_count_redispatched_jobs_and_the_failed_engine() {
        use hetcrypt::engine::fault::{Fault, FaultyEngine};
        let flaky = CpuEngine::with_lanes(1).into_engine();
        let engines = vec![
            FaultyEngine::new("flaky", flaky, Fault::AfterJobs(3)).into_engine(),
            CpuEngine::with_lanes(1).into_engine(),
        ];
        // Every job to the flaky engine until it fails, then to the other.
        let policy = hetcrypt::policy::Only::new("flaky");
        let mut pipeline = Pipeline::new(engines, &policy).unwrap().window(8);
        let streams = (0..4).map(|_| Plain {
            left: 10,
            len: CHUNK_SIZE,
            ..Plain::default()
        });
        let mut done = Done::default();
        pipeline.run(streams, &mut done).unwrap();
        assert!(done.streams.iter().all(|s| s.accepted == [CHUNK_SIZE; 10]));
        let stats = pipeline.stats();
        assert_eq!(stats.jobs, 40);
        assert!(stats.redispatched > 0, "{stats:?}");
        let flaky = stats
            .engines
            .iter()
            .find(|e| e.name == "flaky")
            .expect("flaky");
        assert!(flaky.jobs == 3 && flaky.failed.is_some(), "{stats:?}");
        let jobs: u64 = stats.engines.iter().map(|e| e.jobs).sum();
        assert_eq!(jobs, 40, "{stats:?}");
    }

    /// Messages of two chunks each are small ones: their batches run in-line, on one
    /// lane ([`IN_LINE_MESSAGE_BYTES`]); of three chunks, on every lane.
    #[test]
    fn two_chunk_messages_are_small_and_three_chunk_ones_large() {
        let two = lanes_per_batch(24, 2 * CHUNK_SIZE);
        assert!(two.len() >= 2 && two.iter().all(|&l| l == 1), "{two:?}");
        let three = lanes_per_batch(24, 3 * CHUNK_SIZE);
        assert!(three.contains(&2), "{three:?}");
    }
}
