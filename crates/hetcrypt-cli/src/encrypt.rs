//! `hetcrypt encrypt` and `hetcrypt decrypt`: files, stdin/stdout and directory trees
//! in C2SP chunked encryption, the chunks of every file in flight spread over every
//! engine (see docs/format.md).
//!
//! Never loses data nor leaves plaintext behind: outputs are anonymous files in their
//! destination directory, named only when complete (decrypted: fully authenticated),
//! never through a symbolic link (see `dest`); an existing output is replaced only
//! with `--force`; inputs are opened without following links and only read. One failing file does not stop
//! the others; the exit status is 1 if any failed, and the summary lists them.
//!
//! Reading, the engines and writing overlap: the pipeline runs each batch beside the
//! reading of the next, and a writer thread writes the outputs behind and names them
//! in commit groups, each after one `syncfs` per file system; a last `syncfs` makes
//! the names durable before exit 0 (docs/format.md, "Durability"). A settler thread
//! makes and writes half of the small outputs for the writer to name.

mod dest;
mod io;
mod plan;
mod summary;
mod tree;
mod walk;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use anyhow::{bail, Context};
use hetcrypt_format::manifest::MANIFEST_NAME;
use hetcrypt_format::{
    Aead, DecryptStream, EncryptStream, FileEntry, FormatError, InputKey, Observer, OpenParams,
    Pipeline, SealParams, Stream,
};
use indicatif::ProgressBar;

use self::io::{Input, Opened, Output};
use self::plan::{Note, Way};
pub use self::summary::escape;
use self::summary::Summary;
use crate::keygen::read_key_file;
use crate::workload::{EngineOpts, EngineSet};

/// Options both commands take.
#[derive(clap::Args, Debug)]
struct Common {
    /// Key file made by `hetcrypt keygen`.
    #[arg(long, value_name = "KEY")]
    key: PathBuf,
    /// Files or directories to process; `-` is standard input.
    #[arg(required = true, value_name = "INPUT")]
    inputs: Vec<PathBuf>,
    /// Output: a file (`-`: standard output) for one file, a directory for a tree or
    /// several inputs (every folder recreated, empty ones included; an encrypted tree
    /// gets a `.hetcrypt-manifest` that decrypt checks). Default for one file: beside
    /// it, `.hc` added or removed.
    #[arg(short, long, value_name = "OUT")]
    output: Option<PathBuf>,
    /// Scheduling policy (`pull`, `only:<engine>`, ...).
    #[arg(long, default_value = "pull")]
    policy: String,
    /// Engines to use, comma-separated (`cpu`, `kernel`, `kernel:<driver>`,
    /// `devcrypto`, `devcrypto:<driver>`; `hetcrypt engines` lists them); default:
    /// every engine this machine has.
    #[arg(long, value_delimiter = ',', value_name = "ENGINES")]
    engines: Vec<String>,
    /// Replace existing output files (regular files only: never a link or a directory).
    #[arg(long)]
    force: bool,
    /// No progress bar and no summary (errors are still printed).
    #[arg(short, long)]
    quiet: bool,
    /// Print the summary as JSON (on stdout, or on stderr when stdout carries data).
    #[arg(long)]
    json: bool,
    /// The calibration store `threshold` and `adaptive` start from (default: as for
    /// `hetcrypt calibrate`).
    #[arg(long, value_name = "FILE")]
    calibration: Option<PathBuf>,
}

/// Arguments of `hetcrypt encrypt`.
#[derive(clap::Args, Debug)]
pub struct EncryptArgs {
    #[command(flatten)]
    common: Common,
    /// AEAD: aes-128-gcm, aes-256-gcm or aes-128-cbc-hmac-sha256 (whose CBC half runs
    /// on CBC-only crypto modules). Default: aes-128-gcm for a 128-bit key,
    /// aes-256-gcm for a 256-bit key.
    #[arg(long, value_parser = |s: &str| s.parse::<Aead>())]
    aead: Option<Aead>,
}

/// Arguments of `hetcrypt decrypt`.
#[derive(clap::Args, Debug)]
pub struct DecryptArgs {
    #[command(flatten)]
    common: Common,
}

/// A message in flight, with its input's name for messages and, for a file of a
/// tree, the tree's index and the file's path in it.
struct Item<S> {
    stream: S,
    name: String,
    tree: Option<(usize, Vec<u8>)>,
}

impl<S: Stream> Stream for Item<S> {
    fn next_job(
        &mut self,
        d: &hetcrypt::Dispatcher,
    ) -> hetcrypt_format::Result<Option<hetcrypt::Job>> {
        self.stream.next_job(d)
    }
    fn next_job_into(
        &mut self,
        d: &hetcrypt::Dispatcher,
        buffers: &mut Vec<Vec<u8>>,
    ) -> hetcrypt_format::Result<Option<hetcrypt::Job>> {
        self.stream.next_job_into(d, buffers)
    }
    fn finish(&mut self) -> hetcrypt_format::Result<()> {
        self.stream.finish()
    }
    fn accept_reusing(
        &mut self,
        out: hetcrypt::Result<hetcrypt::JobOutput>,
        spare: &mut Vec<hetcrypt::JobOutput>,
    ) -> hetcrypt_format::Result<()> {
        self.stream.accept_reusing(out, spare)
    }
    fn key(&self) -> Option<hetcrypt::KeyId> {
        self.stream.key()
    }
}

/// A stream whose output can be taken back to commit.
trait FileStream: Stream {
    /// Its output, the plaintext bytes it carried, and the key commitment it wrote
    /// (encryption: what the tree's manifest records).
    fn into_output(self) -> (Output, u64, Option<[u8; 32]>);
}

impl FileStream for EncryptStream<Input, Output> {
    fn into_output(self) -> (Output, u64, Option<[u8; 32]>) {
        let bytes = self.plaintext_bytes();
        let commitment = self.commitment();
        (self.into_parts().1, bytes, commitment)
    }
}

impl FileStream for DecryptStream<Input, Output> {
    fn into_output(self) -> (Output, u64, Option<[u8; 32]>) {
        let bytes = self.plaintext_bytes();
        (self.into_parts().1, bytes, None)
    }
}

/// A finished output on its way to the writer thread.
pub struct Finished {
    name: String,
    output: Output,
    bytes: u64,
    /// For a file of a tree being encrypted: the tree, the path and the commitment.
    member: Option<(usize, Vec<u8>, [u8; 32])>,
}

/// What the writer thread is given, in order: buffers to write, and outputs to
/// name once everything before them is written.
pub enum ToWriter {
    /// A buffer of an output, written at its offset.
    Write(io::QueuedWrite),
    /// Complete outputs, to settle and name.
    Commit(Vec<Finished>),
    /// Complete outputs a settler made, wrote and prepared: to name.
    Settled(Vec<Finished>),
}

/// Hands finished outputs to the writer thread, records failed ones (whose temporary
/// files are removed as they drop), and moves the bar.
struct Tally<'a> {
    /// The main writer's queue: buffers written behind, and the outputs that had any.
    commits: mpsc::SyncSender<ToWriter>,
    /// The settlers' queues: only outputs with nothing written behind (see
    /// [`SETTLERS`]).
    small: Vec<mpsc::SyncSender<ToWriter>>,
    /// Which of the writer and the settlers takes the next message of small outputs.
    next_small: usize,
    /// Finished outputs not yet handed over: sent `batch` at a time (one message, one
    /// wake-up of the writer, for many small files).
    finished: Vec<Finished>,
    batch: usize,
    failed: Vec<Note>,
    bar: &'a ProgressBar,
}

impl Tally<'_> {
    /// Hands the finished outputs to the writer.
    fn send_finished(&mut self) {
        if self.finished.is_empty() {
            return;
        }
        let finished = std::mem::replace(&mut self.finished, Vec::with_capacity(self.batch));
        // An output written behind must be settled by the writer, which wrote its
        // buffers (its queue has them first); one with nothing written behind may be
        // settled by the writer or a settler, in turn.
        let queue = if !self.small.is_empty() && finished.iter().all(|f| !f.output.written_behind())
        {
            self.next_small = (self.next_small + 1) % SMALL_TURNS;
            match self.next_small.checked_sub(1) {
                Some(turn) => &self.small[turn % self.small.len()],
                None => &self.commits,
            }
        } else {
            &self.commits
        };
        if let Err(mpsc::SendError(ToWriter::Commit(lost))) = queue.send(ToWriter::Commit(finished))
        {
            // The writer is gone only if it panicked; joining reports it.
            for f in lost {
                self.failed.push(Note {
                    path: f.name,
                    reason: "internal error: the writer stopped".into(),
                });
            }
        }
    }
}

impl<S: FileStream> Observer<Item<S>> for Tally<'_> {
    fn done(&mut self, item: Item<S>, result: hetcrypt_format::Result<()>) {
        let (output, bytes, commitment) = item.stream.into_output();
        match result {
            Ok(()) => {
                let member = match (item.tree, commitment) {
                    (Some((tree, path)), Some(c)) => Some((tree, path, c)),
                    _ => None,
                };
                let finished = Finished {
                    name: item.name,
                    output,
                    bytes,
                    member,
                };
                self.finished.push(finished);
                if self.finished.len() >= self.batch {
                    self.send_finished();
                }
            }
            Err(e) => {
                let reason = match e {
                    FormatError::TreeMember if item.tree.is_some() => format!(
                        "the tree's manifest ({MANIFEST_NAME}) is missing: without it, deleted, added or rolled-back files cannot be found, so its files are not decrypted"
                    ),
                    e => human_error(&e),
                };
                report_failure(self.bar, &item.name, &reason);
                self.failed.push(Note {
                    path: item.name,
                    reason,
                });
            }
        }
    }

    fn batch(&mut self, report: &hetcrypt::Report) {
        // The outputs finished in the round before go now.
        self.send_finished();
        self.bar.inc(report.bytes);
    }
}

fn report_failure(bar: &ProgressBar, path: &str, reason: &str) {
    let (path, reason) = (summary::escape(path), summary::escape(reason));
    bar.suspend(|| eprintln!("hetcrypt: {path}: {reason}"));
}

/// What the writer thread named.
#[derive(Default)]
struct Committed {
    ok: usize,
    bytes: u64,
    failed: Vec<Note>,
    /// Files of trees now in place: tree, path, manifest entry.
    members: Vec<(usize, Vec<u8>, FileEntry)>,
}

/// Messages (buffers of at most [`io::WRITE_BUFFER`], or finished outputs) waiting
/// for the writer thread: 16 x 128 KiB = 2 MiB of buffers at most.
pub const WRITE_QUEUE: usize = 16;

/// Settler threads beside the writer: a settler makes a small output's temporary (one
/// with nothing written behind), writes and prepares it, then hands it to the writer,
/// which names it in its commit groups; the writer takes one message of small outputs
/// in [`SMALL_TURNS`], the settlers the others. On tmpfs a small output's temporary,
/// write and link cost about what reading and encrypting its input does (15-18 us), so
/// the writer alone bounded a tree's run while the second core sat partly idle. Naming
/// (and so syncing) stays with the one writer: two threads each syncing their own
/// groups made 2-6 times the syncs and a slower run on disk.
const SETTLERS: usize = 1;

/// Messages of small outputs per round: the writer settles one of them and the
/// settlers the others, in turn. The writer also names every output (a `linkat` each,
/// and the commit groups' syncs), about half of what settling one costs on tmpfs: with
/// half of the messages each, it ran 45 ms of CPU on the 4,000 x 16 KiB tree against
/// the settler's 28 ms, and the reading thread waited on the busier one.
const SMALL_TURNS: usize = 3;

/// Finished outputs the writer names after one sync of their file system (a commit
/// group): enough that 4,000 small files on a disk need a handful of syncs rather than
/// one each. Each is written before it joins a group, so it holds only a descriptor
/// until named (the open-files limit may make groups smaller).
const COMMIT_GROUP: usize = 1024;

/// Finished outputs handed to the writer (or a settler) in one message: one wake-up
/// for many small files (waking the writer per file cost more than writing them); each
/// holds at most 32 KiB until it is written, so a full writer's queue holds at most
/// 17 x 16 x 32 KiB = 8.5 MiB of them, a settler's 9 x 16 x 32 KiB = 4.5 MiB.
const COMMIT_BATCH: usize = 16;

/// Chunks per pipeline batch: half the format crate's [`WINDOW_CHUNKS`]
/// (`hetcrypt_format::pipeline`), still 64 per CPU lane and far more than a module's
/// 4-8 requests in flight. Smaller batches hand finished outputs to the writers sooner
/// and keep half the memory in flight: on the 4,000 x 16 KiB tmpfs tree the same CPU
/// time and 10-37% less wall time than 256 (alternating runs at load 5-6), and no
/// change for a 1 GiB file.
///
/// [`WINDOW_CHUNKS`]: hetcrypt_format::pipeline::WINDOW_CHUNKS
const WINDOW: usize = hetcrypt_format::pipeline::WINDOW_CHUNKS / 2;

/// Threads a large file's run keeps busy besides the engines' lanes: the one that
/// reads and fills the batches, and the writer behind it (each about a core on 1 GiB
/// on tmpfs: docs/performance.md, "Twentieth session").
const IO_THREADS: usize = 2;

/// Whether a large file's batches are spread over the engines' lane threads (see
/// `Pipeline::spread`) on a host with `cores` cores: only where at least two cores are
/// left beside [`IO_THREADS`]. With fewer, more lanes than one only compete with the
/// reading and writing for the same cores, and starting and joining them per batch
/// cost about 15% of the CPU time of 1 GiB on 2 cores (the batch then runs on one
/// lane on the engines' thread instead). The same on any CPU: it counts threads and
/// cores, not speeds.
fn spreads_batches(cores: usize) -> bool {
    cores >= IO_THREADS + 2
}

/// Descriptors an output may hold until it is committed: its temporary and its
/// directory (shared by consecutive outputs of one directory, but not always).
const FDS_PER_OUTPUT: u64 = 2;
/// Descriptors kept free beside those open at the start and the outputs': the input
/// being read, a directory being opened or made, the directory being synced, a
/// directory listing for leftovers, and room for error.
const FD_MARGIN: u64 = 12;

/// How much the run keeps in flight, within the open-files limit.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    /// Chunks per pipeline batch.
    window: usize,
    /// Messages waiting for the main writer.
    queue: usize,
    /// Messages (of small outputs only) waiting for each settler.
    small_queue: usize,
    /// Finished outputs per message to the writer.
    commit_batch: usize,
    /// Finished outputs per commit group (one sync).
    group: usize,
}

/// How many outputs may be open at once: raises the soft open-files limit to the
/// hard one where allowed, then shares what is left after the descriptors already
/// open, so that any `ulimit -n` of 64 or more works on any tree (smaller sizes are
/// only slower). Open outputs: those of the streams in the pipeline (the batches being
/// read, run and written: up to two windows and one), those finished and not yet
/// sent, those in the writer's queue, and its group.
fn bound_open_files() -> Sizes {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let soft = match (limit.current, limit.maximum) {
        (Some(cur), max) if max.is_none_or(|m| m > cur) => {
            let raised = Rlimit {
                current: max,
                maximum: max,
            };
            match setrlimit(Resource::Nofile, raised) {
                Ok(()) => max,
                Err(_) => Some(cur),
            }
        }
        (cur, _) => cur,
    };
    let open_now = std::fs::read_dir("/proc/self/fd").map_or(16, |d| d.count() as u64);
    let outputs = soft.map_or(usize::MAX, |soft| {
        let outputs = soft.saturating_sub(open_now + FD_MARGIN) / FDS_PER_OUTPUT;
        usize::try_from(outputs).unwrap_or(usize::MAX)
    });
    let outputs = outputs.max(4);
    let group = (outputs / 4).clamp(1, COMMIT_GROUP);
    let commit_batch = (outputs / 64).clamp(1, COMMIT_BATCH);
    let queue = (outputs / (8 * commit_batch)).clamp(1, WRITE_QUEUE);
    let small_queue = (queue / 2).max(1);
    // The writer's queue, the settlers' queues and the message each settler holds.
    let queued = queue + SETTLERS * (small_queue + 1);
    let left = outputs.saturating_sub(group + (queued + 1) * commit_batch + 1);
    let window = (left / 2).clamp(1, WINDOW);
    // The pipeline's streams (a window being read, one being written), the finished
    // outputs queued and the writer's group.
    let held = u64::try_from((group + (queued + 1) * commit_batch + 1 + 2 * window).min(outputs))
        .unwrap_or(u64::MAX);
    reserve_descriptors(open_now + FD_MARGIN + FDS_PER_OUTPUT * held);
    Sizes {
        window,
        queue,
        small_queue,
        commit_batch,
        group,
    }
}

/// Grows this process's descriptor table to `count` entries now, before the run starts
/// its threads. The kernel grows the table as descriptors are opened, and in a process
/// with several threads each growth waits for an RCU grace period (`expand_files`,
/// `synchronize_rcu`): 1-3 such waits, of milliseconds each on a busy host, in a
/// 4,000-file tree's run. A table never shrinks, so one descriptor opened at the top
/// and closed again is enough. Best effort: a failure leaves the growth for later.
fn reserve_descriptors(count: u64) {
    if let Some(top) = count.checked_sub(1).and_then(|t| i32::try_from(t).ok()) {
        drop(rustix::io::fcntl_dupfd_cloexec(std::io::stderr(), top));
    }
}

/// The writer thread: writes the outputs' buffers as they come, and names finished
/// outputs in groups: each finished output is settled (its last buffer written, mode
/// and length set) and joins the group; once the queue is empty (or the group has
/// `group_max` outputs), one `syncfs` per file system makes all their contents
/// durable, then each is named. A group is thus every output finished while the
/// writer was busy, the last sync included: the slower the disk, the fewer the syncs.
/// Names and directories become durable with the run's final sync.
fn writer(
    queue: mpsc::Receiver<ToWriter>,
    pool: &io::BufferPool,
    force: bool,
    group_max: usize,
    bar: &ProgressBar,
) -> Committed {
    let mut done = Committed::default();
    let mut group: Vec<Finished> = Vec::new();
    loop {
        let message = if group.is_empty() {
            queue.recv().ok()
        } else {
            match queue.try_recv() {
                Ok(m) => Some(m),
                Err(mpsc::TryRecvError::Empty) => {
                    commit_group(&mut group, force, bar, &mut done);
                    continue;
                }
                Err(mpsc::TryRecvError::Disconnected) => None,
            }
        };
        let settled = match message {
            None => break,
            Some(ToWriter::Write(w)) => {
                w.run(pool);
                continue;
            }
            Some(ToWriter::Commit(finished)) => settle(finished, bar, &mut done.failed),
            Some(ToWriter::Settled(settled)) => settled,
        };
        for f in settled {
            group.push(f);
            if group.len() >= group_max {
                commit_group(&mut group, force, bar, &mut done);
            }
        }
    }
    commit_group(&mut group, force, bar, &mut done);
    done
}

/// Settles finished outputs: each one's buffers are all written (they came first in
/// the writer's queue; a settler gets only outputs with none written behind), the rest
/// is written now, mode and length set, so a commit group holds descriptors, not data.
/// Returns those settled; failures go to `failed`, their temporaries dropped.
fn settle(finished: Vec<Finished>, bar: &ProgressBar, failed: &mut Vec<Note>) -> Vec<Finished> {
    let mut settled = Vec::with_capacity(finished.len());
    for mut f in finished {
        f.output.detach();
        match f.output.settle() {
            Ok(()) => settled.push(f),
            Err(e) => {
                let reason = human_error(&FormatError::Io(e));
                report_failure(bar, &f.name, &reason);
                failed.push(Note {
                    path: f.name,
                    reason,
                });
            }
        }
    }
    settled
}

/// A settler thread: settles the small outputs of each message it is given (their
/// temporaries made, written and prepared) and hands them to the writer to name.
/// Returns the outputs that failed.
fn settler(
    queue: mpsc::Receiver<ToWriter>,
    writer: &mpsc::SyncSender<ToWriter>,
    bar: &ProgressBar,
) -> Vec<Note> {
    let mut failed = Vec::new();
    for message in queue {
        let ToWriter::Commit(finished) = message else {
            // Only the writer is sent buffers; nothing else comes here.
            continue;
        };
        let settled = settle(finished, bar, &mut failed);
        if let Err(mpsc::SendError(ToWriter::Settled(lost))) =
            writer.send(ToWriter::Settled(settled))
        {
            // The writer is gone only if it panicked; joining reports it.
            for f in lost {
                failed.push(Note {
                    path: f.name,
                    reason: "internal error: the writer stopped".into(),
                });
            }
        }
    }
    failed
}

/// Syncs (one `syncfs` per file system) and names a group of settled outputs.
fn commit_group(group: &mut Vec<Finished>, force: bool, bar: &ProgressBar, done: &mut Committed) {
    if group.is_empty() {
        return;
    }
    let fail = |name: String, reason: String, done: &mut Committed| {
        report_failure(bar, &name, &reason);
        done.failed.push(Note { path: name, reason });
    };
    let settled: Vec<Finished> = std::mem::take(group);
    // A failed sync cannot say which file's data it lost: the whole group fails,
    // dropped unnamed, so nothing of it stays.
    let unsynced = dest::sync_file_systems(settled.iter().filter_map(|f| f.output.dir()))
        .first()
        .map(|(dir, e)| {
            format!(
                "cannot make it durable: syncing the file system of {} failed: {e}",
                plan::show(&dir.path)
            )
        });
    if let Some(reason) = unsynced {
        for f in settled {
            fail(f.name, reason.clone(), done);
        }
        return;
    }
    for f in settled {
        let Finished {
            name,
            output,
            bytes,
            member,
        } = f;
        match output.name(force) {
            Ok(_) => {
                done.ok += 1;
                done.bytes += bytes;
                if let Some((tree, path, commitment)) = member {
                    let entry = FileEntry {
                        size: bytes,
                        commitment,
                    };
                    done.members.push((tree, path, entry));
                }
            }
            Err(e) => fail(name, human_error(&FormatError::Io(e)), done),
        }
    }
}

/// One sentence for a failed file.
fn human_error(e: &FormatError) -> String {
    match e {
        FormatError::Io(io) if io.raw_os_error() == Some(28) => {
            "no space left on the device (the partial output was removed)".to_string()
        }
        other => other.to_string(),
    }
}

/// The path of a source, for messages.
fn source_path(source: &plan::Source) -> PathBuf {
    match source {
        plan::Source::Stdin => PathBuf::from("(standard input)"),
        plan::Source::File { path, .. } => path.clone(),
    }
}

/// The null device's numbers (Linux's `/dev/null` is character device 1:3).
const DEV_NULL: (u32, u32) = (1, 3);

/// Whether standard input is closed. The Rust runtime reopens a closed descriptor 0
/// on `/dev/null` before `main`, so a closed input and `< /dev/null` look the same;
/// both would otherwise read as an empty message and "succeed".
fn stdin_is_closed() -> bool {
    match rustix::fs::fstat(std::io::stdin()) {
        Ok(st) => {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::CharacterDevice
                && (rustix::fs::major(st.st_rdev), rustix::fs::minor(st.st_rdev)) == DEV_NULL
        }
        Err(_) => true,
    }
}

/// Runs `hetcrypt encrypt`.
pub fn run_encrypt(args: EncryptArgs) -> anyhow::Result<ExitCode> {
    let key = read_key_file(&args.common.key)?;
    let aead = match args.aead {
        Some(a) => a,
        None if key.len() == 16 => Aead::Aes128Gcm,
        None => Aead::Aes256Gcm,
    };
    if key.len() != aead.key_len() {
        bail!(
            "{aead} needs a {}-bit key, but {} holds a {}-bit key (make one with `hetcrypt keygen --bits {}`)",
            aead.key_len() * 8,
            args.common.key.display(),
            key.len() * 8,
            aead.key_len() * 8
        );
    }
    // One input key for every file: its HMAC is keyed once (see `InputKey`).
    let shared = Arc::new(InputKey::new(&key));
    run(
        &args.common,
        Way::Encrypt,
        &key,
        Some(aead),
        |input, output, size, tree| {
            let params = match tree {
                Some((path, _)) => SealParams::new(aead).tree_path(path),
                None => SealParams::new(aead),
            };
            EncryptStream::with_key(input, output, shared.clone(), params)
                .read_ahead(read_ahead(size))
        },
    )
}

/// Runs `hetcrypt decrypt`.
pub fn run_decrypt(args: DecryptArgs) -> anyhow::Result<ExitCode> {
    let key = read_key_file(&args.common.key)?;
    let shared = Arc::new(InputKey::new(&key));
    run(
        &args.common,
        Way::Decrypt,
        &key,
        None,
        |input, output, size, tree| {
            let mut stream =
                DecryptStream::with_key(input, output, shared.clone(), OpenParams::Hetcrypt)
                    .read_ahead(read_ahead(size));
            if let Some(len) = size {
                stream = stream.with_input_len(len);
            }
            if let Some((path, commitment)) = tree {
                stream = stream.in_tree(path, commitment);
            }
            stream
        },
    )
}

/// Chunks read per system call from an input of `size` bytes (a file): enough for
/// the whole file and the read that finds its end, up to the format's most, so a small
/// file borrows no more chunk buffers than it fills. Standard input (no size) is read
/// a chunk at a time: a pipe whose writer pauses must not hold back the chunks it sent.
fn read_ahead(size: Option<u64>) -> usize {
    let Some(size) = size else { return 1 };
    let chunks = size / hetcrypt_format::CHUNK_SIZE as u64 + 1;
    usize::try_from(chunks)
        .unwrap_or(usize::MAX)
        .min(hetcrypt_format::stream::MAX_READ_AHEAD)
}

/// A file's place in its tree: its path, and (decrypting) the commitment the tree's
/// manifest lists for it.
type TreeBinding = Option<(Vec<u8>, Option<[u8; 32]>)>;

fn run<S: FileStream>(
    args: &Common,
    way: Way,
    key: &[u8],
    aead: Option<Aead>,
    make: impl Fn(Input, Output, Option<u64>, TreeBinding) -> S,
) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let policy = crate::calibrate::Policies::new(args.calibration.as_deref())
        .by_name(&args.policy)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let EngineSet {
        ready: engines,
        unavailable,
    } = EngineSet::named_or_all(&args.engines, EngineOpts::default())?;
    if engines.is_empty() {
        bail!("no engine is available");
    }
    let engine_names: Vec<String> = engines.iter().map(|e| e.name().to_string()).collect();
    let plan = plan::plan(&args.inputs, args.output.as_deref(), way, args.force)?;
    if way == Way::Encrypt && plan.writes_stdout() && std::io::stdout().is_terminal() {
        bail!("refusing to write ciphertext to a terminal: redirect standard output, or name a file with -o");
    }
    if plan.reads_stdin() && stdin_is_closed() {
        bail!("standard input is closed (or /dev/null): there is nothing to read; pipe the data in, or name a file");
    }
    let stdout_busy = plan.writes_stdout();
    let hide_bar = args.quiet || args.json || !std::io::stderr().is_terminal();
    let bar = summary::progress(if hide_bar { None } else { plan.total_size() }, hide_bar);

    // The plan is walked as the pipeline asks for files; failures found while
    // walking (and skipped inputs) are kept here.
    let mut plan_failed: Vec<Note> = Vec::new();
    let mut skipped: Vec<Note> = Vec::new();
    // Directories made for the trees, with the modes they get once their files are in
    // (a read-only directory could not take them before); parents come first.
    let mut made_dirs: Vec<plan::Dir> = Vec::new();
    let sizes = bound_open_files();
    // After the descriptor table is grown (see `reserve_descriptors`): this starts a
    // thread.
    dest::remove_temporaries_on_signals().context("cannot watch for signals")?;
    // A pipe may stall for as long as its writer pleases: reading it in turn with the
    // batches lets each batch's output out before more is read.
    let mut pipeline = Pipeline::new(engines, policy.as_ref())?
        .window(sizes.window)
        .overlap(!plan.reads_stdin())
        .spread(spreads_batches(hetcrypt::engine::cpu::available_cores()));
    // Decrypting, each tree's manifest is read and authenticated before its files: the
    // inputs' trees now, those met inside a walk (a folder with its own manifest) as
    // the walk enters them. Manifests are small: one CPU lane reads them, beside the
    // run's own pipeline.
    let manifest_policy = hetcrypt::policy::Pull;
    let mut manifests = Pipeline::new(
        vec![hetcrypt::engine::cpu::CpuEngine::with_lanes(1).into_engine()],
        &manifest_policy,
    )?;
    let mut trees: Vec<tree::TreeState> = Vec::new();
    let mut load_new_trees =
        |plan: &plan::Plan, trees: &mut Vec<tree::TreeState>, failed: &mut Vec<Note>| {
            for root in &plan.trees()[trees.len()..] {
                let state = match way {
                    Way::Decrypt => tree::load(root, &mut manifests, key),
                    Way::Encrypt => tree::TreeState::new(root),
                };
                if let Some(reason) = &state.unusable {
                    let note = Note {
                        path: plan::show(&root.dir),
                        reason: format!("not decrypted: {reason}"),
                    };
                    report_failure(&bar, &note.path, &note.reason);
                    failed.push(note);
                }
                trees.push(state);
            }
        };
    load_new_trees(&plan, &mut trees, &mut plan_failed);
    let (commits, queue) = mpsc::sync_channel(sizes.queue);
    let pool = io::BufferPool::default();
    let (run_result, failed, committed) = std::thread::scope(|scope| {
        let (writer_pool, bar_ref, force) = (pool.clone(), &bar, args.force);
        let writer = scope.spawn(move || writer(queue, &writer_pool, force, sizes.group, bar_ref));
        // Standard output is written by the writer alone, in order.
        let settlers = if stdout_busy { 0 } else { SETTLERS };
        let mut settler_threads = Vec::with_capacity(settlers);
        let small: Vec<_> = (0..settlers)
            .map(|_| {
                let (small, small_queue) = mpsc::sync_channel(sizes.small_queue);
                let to_writer = commits.clone();
                settler_threads
                    .push(scope.spawn(move || settler(small_queue, &to_writer, bar_ref)));
                small
            })
            .collect();
        let behind = io::WriteBehind {
            queue: commits.clone(),
            pool: pool.clone(),
        };
        let mut tally = Tally {
            commits,
            small,
            next_small: 0,
            finished: Vec::with_capacity(sizes.commit_batch),
            batch: sizes.commit_batch,
            failed: Vec::new(),
            bar: &bar,
        };
        let mut plan = plan;
        let items = std::iter::from_fn(|| loop {
            let entry = plan.next()?;
            load_new_trees(&plan, &mut trees, &mut plan_failed);
            match entry {
                plan::Entry::Work(w) => {
                    let binding = match &w.tree {
                        None => None,
                        Some((_, path)) if way == Way::Encrypt => Some((path.clone(), None)),
                        Some((index, path)) => {
                            let state = &mut trees[*index];
                            let fail = |reason: String| Note {
                                path: plan::show(&source_path(&w.source)),
                                reason,
                            };
                            if state.unusable.is_some() {
                                // Said once for the whole tree.
                                continue;
                            }
                            match &state.manifest {
                                None => None,
                                Some(m) => match m.get(path) {
                                    Some(e) => Some((path.clone(), Some(e.commitment))),
                                    None => {
                                        let note = fail(
                                                "not in the tree's manifest: added, or renamed from another name; not decrypted".into(),
                                            );
                                        report_failure(&bar, &note.path, &note.reason);
                                        plan_failed.push(note);
                                        continue;
                                    }
                                },
                            }
                        }
                    };
                    let (input, name, mode, size) = match &w.source {
                        plan::Source::Stdin => (
                            Input::Stdin(std::io::stdin()),
                            "(standard input)".into(),
                            None,
                            None,
                        ),
                        plan::Source::File {
                            path,
                            follow,
                            beneath,
                        } => match io::open_source(path, *follow, beneath.as_deref()) {
                            Ok(Opened::File { file, mode, stamp }) => (
                                Input::file(file, path, stamp),
                                plan::show(path),
                                Some(mode),
                                Some(stamp.size()),
                            ),
                            Ok(Opened::NotRegular(reason)) => {
                                skipped.push(Note {
                                    path: plan::show(path),
                                    reason,
                                });
                                continue;
                            }
                            Err(e) => {
                                let note = Note {
                                    path: plan::show(path),
                                    reason: format!("cannot open: {e}"),
                                };
                                report_failure(&bar, &note.path, &note.reason);
                                plan_failed.push(note);
                                continue;
                            }
                        },
                    };
                    if let (Way::Decrypt, Some((index, path))) = (way, &w.tree) {
                        // Met and opened: not "missing" (a file skipped or failing to
                        // open is reported as such, and is missing too).
                        trees[*index].seen.insert(path.clone());
                    }
                    let output = Output::new(w.dest, mode).behind(behind.clone());
                    return Some(Item {
                        stream: make(input, output, size, binding),
                        name,
                        tree: w.tree,
                    });
                }
                plan::Entry::Dir(dir) => match io::make_dir(&dir.dest) {
                    Ok(true) => {
                        plan.made(&dir.dest);
                        made_dirs.push(dir);
                    }
                    Ok(false) => {}
                    Err(e) => {
                        let note = Note {
                            path: plan::show(&dir.source),
                            reason: format!(
                                "cannot create the directory {}: {e}",
                                plan::show(&dir.dest.path())
                            ),
                        };
                        report_failure(&bar, &note.path, &note.reason);
                        plan_failed.push(note);
                    }
                },
                plan::Entry::Skipped(note) => skipped.push(note),
                plan::Entry::Failed(note) => {
                    report_failure(&bar, &note.path, &note.reason);
                    plan_failed.push(note);
                }
            }
        });
        let run_result = pipeline.run(items, &mut tally);
        tally.send_finished();
        let Tally {
            failed,
            commits,
            small,
            ..
        } = tally;
        // Ends the settlers' queues; once they are done, and with the outputs' handles
        // gone with the pipeline's streams, the writer's.
        drop(small);
        let mut settle_failed = Vec::new();
        for s in settler_threads {
            settle_failed.extend(s.join().expect("a settler does not panic"));
        }
        drop(commits);
        drop(behind);
        let mut committed = writer.join().expect("the writer does not panic");
        committed.failed.extend(settle_failed);
        (run_result, failed, committed)
    });
    bar.finish_and_clear();
    // Children before parents, so a parent's mode cannot lock a child out.
    for dir in made_dirs.iter().rev() {
        if let Err(e) = io::set_dir_mode(&dir.dest, dir.mode) {
            let reason = format!(
                "cannot set the mode of {}: {e}",
                plan::show(&dir.dest.path())
            );
            report_failure(&bar, &plan::show(&dir.source), &reason);
            plan_failed.push(Note {
                path: plan::show(&dir.source),
                reason,
            });
        }
    }
    run_result.map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut all_failed = plan_failed;
    all_failed.extend(failed);
    all_failed.extend(committed.failed);
    let tree_notes = match (way, aead) {
        (Way::Decrypt, _) => tree::missing(&trees),
        (Way::Encrypt, Some(aead)) => tree::write_manifests(
            &trees,
            committed.members,
            &mut pipeline,
            key,
            aead,
            args.force,
        ),
        (Way::Encrypt, None) => Vec::new(),
    };
    for note in tree_notes {
        report_failure(&bar, &note.path, &note.reason);
        all_failed.push(note);
    }
    // Durable before exit 0: one sync per file system written into makes every name
    // given and every directory made or changed durable (the contents already were,
    // group by group, before their names).
    for (path, e) in dest::sync_touched() {
        let note = Note {
            path: plan::show(&path),
            reason: format!(
                "cannot make the outputs durable: syncing this file system failed: {e}"
            ),
        };
        report_failure(&bar, &note.path, &note.reason);
        all_failed.push(note);
    }

    let seconds = start.elapsed().as_secs_f64();
    let summary = Summary {
        command: if way == Way::Encrypt {
            "encrypt"
        } else {
            "decrypt"
        },
        aead: aead.map(|a| a.to_string()),
        policy: policy.name(),
        engines: engine_names,
        engines_unavailable: unavailable,
        files_ok: committed.ok,
        files_failed: all_failed.len(),
        files_skipped: skipped.len(),
        bytes: committed.bytes,
        seconds,
        bytes_per_second: if seconds > 0.0 {
            committed.bytes as f64 / seconds
        } else {
            0.0
        },
        dispatch: pipeline.stats().clone(),
        syncs: dest::syncs(),
        peak_rss_bytes: summary::peak_rss_bytes(),
        failed: all_failed,
        skipped,
    };
    if args.json {
        let json = serde_json::to_string_pretty(&summary).context("cannot render the summary")?;
        if stdout_busy {
            eprintln!("{json}");
        } else {
            use std::io::Write as _;
            // A reader that stops early (`| head`) is not a failure of the run.
            match writeln!(std::io::stdout().lock(), "{json}") {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    return Err(e).context("cannot write the summary to standard output");
                }
                _ => {}
            }
        }
    } else if !args.quiet {
        eprint!("{}", summary.render());
    }
    Ok(if summary.files_failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The descriptor table's size, from `/proc/self/status` (`FDSize`).
    fn table_size() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("FDSize:")).unwrap();
        line["FDSize:".len()..].trim().parse().unwrap()
    }

    #[test]
    fn the_descriptor_table_is_grown_ahead_and_its_descriptor_closed() {
        use rustix::process::{getrlimit, Resource};
        /// Entries asked for: more than any test process opens by itself (64-256), at
        /// most the usual soft limit.
        const WANTED: u64 = 1024;
        let soft = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
        let wanted = WANTED.min(soft);
        reserve_descriptors(wanted);
        assert!(table_size() >= wanted, "{} < {wanted}", table_size());
        // The descriptor that grew it is closed again (the other tests of this process
        // open theirs at the bottom of the table, far below it).
        let top = format!("/proc/self/fd/{}", wanted - 1);
        assert!(std::fs::symlink_metadata(&top).is_err(), "{top} is open");
    }

    #[test]
    fn batches_spread_over_lanes_only_with_two_cores_beside_reading_and_writing() {
        assert!(!spreads_batches(1));
        assert!(!spreads_batches(2));
        assert!(!spreads_batches(3));
        assert!(spreads_batches(4));
        assert!(spreads_batches(64));
    }
}
