//! Inputs opened without following links and typed by the opened descriptor, and
//! outputs that never lose data nor leave unauthenticated plaintext: written to a
//! temporary in the destination directory (see [`dest`](super::dest)), named only when
//! the whole message went through.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use rustix::fs::{FileType, Mode, OFlags, CWD};
use rustix::io::Errno;

use super::dest::{self, DirFd, Target, Temp};
use super::plan::Dest;

/// Output buffer: eight chunks, so writes reach the kernel in large pieces (half the
/// system calls of 64 KiB); a small file's buffer only grows to its size. At most this
/// much of a stalled stream's authenticated output waits unwritten.
pub const WRITE_BUFFER: usize = 128 * 1024;

/// The most a finished output keeps for the writer thread to write when it names it:
/// two chunks (a small file's whole ciphertext), so the outputs waiting to be named
/// hold little memory each.
const SMALL_BUFFER: usize = 32 * 1024;

/// A new output's buffer: one encrypted chunk and the headers, so a file of up to a
/// chunk never grows its buffer, and the up to two windows of streams in flight hold
/// little memory each.
const FIRST_BUFFER: usize = 17 * 1024;

/// Standard output's buffer: four chunks, so a reader downstream sees each batch's
/// output promptly.
const STDOUT_BUFFER: usize = 64 * 1024;

/// Write buffers kept for reuse: as many as the writer's queue holds, and two being
/// filled.
const POOL_BUFFERS: usize = super::WRITE_QUEUE + 2;

/// A new output's buffer for its headers: a chunk's output that follows is taken
/// whole (see [`Output::write_chunk`]), so a small file's output holds its chunk and
/// these few bytes, not a copy of the chunk as well.
const HEAD_BUFFER: usize = 256;

/// Chunk outputs of at least this many bytes (a quarter chunk) are taken whole rather
/// than copied: what is shorter (a short last chunk, a tag) is a cheap copy, and its
/// buffer, often a whole chunk's, is better left to the engines as a spare.
const TAKE_MIN: usize = 4096;

/// Chunk buffers kept for reuse once written (given back to the engines as spares),
/// as many as small outputs' first buffers (see [`SMALL_POOL_BUFFERS`]).
const CHUNK_POOL_BUFFERS: usize = SMALL_POOL_BUFFERS;

/// Small outputs' first buffers kept for reuse: about as many as the outputs queued
/// for the writer and the settler (17 x 16 and 9 x 16), so a tree of small files
/// reuses them round after round. Buffers are only made when none is kept, so keeping
/// them never holds more than the outputs in flight held at once (docs/format.md).
const SMALL_POOL_BUFFERS: usize = 512;

/// Permission bits an output may carry: never setuid, setgid or sticky (a decrypted
/// file must not gain powers from whoever made the ciphertext).
pub const FILE_MODE_BITS: u32 = 0o777;

/// Debug builds only: before opening a source `.../NAME`, move `DIR/NAME` (if any)
/// onto it, so tests can swap an entry between listing and opening deterministically.
const TEST_SWAP_DIR: &str = "HETCRYPT_TEST_SWAP_DIR";

/// Writes of at least this many zero bytes (a quarter chunk, a page or more) become
/// holes, so sparse files stay sparse when decrypted (a chunk of zeros is written as a
/// whole, one call per chunk).
const SPARSE_MIN: usize = 4096;

/// Debug builds only: settling an output whose file name ends with this variable's
/// value fails (after its temporary is made and written), so tests can fail outputs on
/// whichever thread settles them, deterministically.
const TEST_FAIL_SETTLE: &str = "HETCRYPT_TEST_FAIL_SETTLE";

/// The settle-failure hook (see [`TEST_FAIL_SETTLE`]); nothing in release builds.
fn test_fail_settle(target: &Target) -> io::Result<()> {
    if !cfg!(debug_assertions) {
        return Ok(());
    }
    let Some(suffix) = std::env::var_os(TEST_FAIL_SETTLE) else {
        return Ok(());
    };
    let name = target.rel.file_name().unwrap_or_default();
    if name.as_encoded_bytes().ends_with(suffix.as_encoded_bytes()) {
        return Err(io::Error::other("settling failed (test hook)"));
    }
    Ok(())
}

/// ENOSPC: the one write error people meet often enough to deserve plain words.
const ENOSPC: i32 = 28;

/// Debug builds only: after the first read of a source with this file name, cut the
/// file to half its size, so tests can change a file while it is read,
/// deterministically.
const TEST_TRUNCATE_WHILE_READING: &str = "HETCRYPT_TEST_TRUNCATE_WHILE_READING";

/// What a file looked like when opened: a file whose size or modification time differ
/// at its end was changed while it was read (tar's "file changed as we read it").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    size: u64,
    mtime: (i64, i64),
}

impl Stamp {
    fn of(st: &rustix::fs::Stat) -> Self {
        Stamp {
            size: u64::try_from(st.st_size).unwrap_or(0),
            mtime: (st.st_mtime, st.st_mtime_nsec as i64),
        }
    }

    /// The size when opened.
    pub fn size(&self) -> u64 {
        self.size
    }
}

/// An input; a file is closed as soon as it is read to its end, so only the files
/// still being read hold a descriptor.
pub enum Input {
    /// A regular file.
    File {
        /// The open file (`None` once read to its end).
        file: Option<File>,
        /// Its path, for messages.
        path: PathBuf,
        /// How it looked when opened.
        opened: Stamp,
        /// Bytes read so far.
        read: u64,
    },
    /// Standard input.
    Stdin(io::Stdin),
}

impl Input {
    /// An opened regular file, as it looked when opened.
    pub fn file(file: File, path: &Path, opened: Stamp) -> Self {
        Input::File {
            file: Some(file),
            path: path.to_path_buf(),
            opened,
            read: 0,
        }
    }
}

/// The error for a file that changed while it was read, if it did.
fn changed(f: &File, path: &Path, opened: Stamp, read: u64) -> Option<io::Error> {
    let now = rustix::fs::fstat(f).map(|st| Stamp::of(&st)).ok()?;
    if now == opened && read == opened.size {
        return None;
    }
    let how = if now.size != opened.size || read != opened.size {
        format!(
            "{} bytes when opened, {read} read, {} now",
            opened.size, now.size
        )
    } else {
        "modified".to_string()
    };
    Some(io::Error::other(format!(
        "{} changed while it was read ({how}): not processed; try again once it is still",
        super::plan::show(path)
    )))
}

/// Debug builds only: after the first read of a source with this file name, append
/// to it, so tests can grow a file while it is read, deterministically.
const TEST_GROW_WHILE_READING: &str = "HETCRYPT_TEST_GROW_WHILE_READING";

/// Bytes the growth hook appends.
const TEST_GROWTH: &[u8] = b"appended while it was read";

/// The truncation and growth hooks (see [`TEST_TRUNCATE_WHILE_READING`],
/// [`TEST_GROW_WHILE_READING`]); nothing in release builds.
fn test_change_while_reading(f: &File, path: &Path) {
    if !cfg!(debug_assertions) {
        return;
    }
    if let Some(name) = std::env::var_os(TEST_GROW_WHILE_READING) {
        if path.file_name() == Some(name.as_os_str()) {
            if let Ok(mut w) = std::fs::OpenOptions::new().append(true).open(path) {
                let _ = w.write_all(TEST_GROWTH);
            }
        }
    }
    let Some(name) = std::env::var_os(TEST_TRUNCATE_WHILE_READING) else {
        return;
    };
    if path.file_name() == Some(name.as_os_str()) {
        if let Ok(meta) = f.metadata() {
            if let Ok(w) = std::fs::OpenOptions::new().write(true).open(path) {
                let _ = w.set_len(meta.len() / 2);
            }
        }
    }
}

impl Input {
    /// One read of a file by `read` (plain or vectored, asking for `want` bytes), its
    /// errors worded, the file closed and checked for changes at its end.
    fn read_file_with(
        &mut self,
        want: usize,
        read: impl FnOnce(&mut File) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let Input::File {
            file,
            path,
            opened,
            read: so_far,
        } = self
        else {
            unreachable!("called for files only");
        };
        let Some(f) = file else { return Ok(0) };
        if *so_far == opened.size && opened.size > 0 && want > 0 {
            // All the bytes it had when opened are read: its end, once its size and
            // time are found unchanged, without a read to find it (a `readv` a file).
            // A file that grew since it was opened has another size now, and fails
            // below as it would after that read.
            if let Some(e) = changed(f, path, *opened, *so_far) {
                return Err(e);
            }
            *file = None;
            return Ok(0);
        }
        let n = read(f).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot read {}: {e}", super::plan::show(path)),
            )
        })?;
        if *so_far == 0 && n > 0 {
            test_change_while_reading(f, path);
        }
        *so_far += n as u64;
        if n == 0 && want > 0 {
            if let Some(e) = changed(f, path, *opened, *so_far) {
                return Err(e);
            }
            *file = None;
        }
        Ok(n)
    }
}

impl Read for Input {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Input::File { .. } => self.read_file_with(buf.len(), |f| f.read(buf)),
            Input::Stdin(s) => s
                .read(buf)
                .map_err(|e| io::Error::new(e.kind(), format!("cannot read standard input: {e}"))),
        }
    }

    /// A file is read into all of `bufs` by one `readv` (several chunks per call).
    fn read_vectored(&mut self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
        match self {
            Input::File { .. } => {
                let want = bufs.iter().map(|b| b.len()).sum();
                self.read_file_with(want, |f| f.read_vectored(bufs))
            }
            Input::Stdin(s) => s
                .read_vectored(bufs)
                .map_err(|e| io::Error::new(e.kind(), format!("cannot read standard input: {e}"))),
        }
    }
}

/// A source as found when opened.
pub enum Opened {
    /// A regular file, with its permission bits and size from the descriptor.
    File {
        /// The open file.
        file: File,
        /// Its permission bits (setuid, setgid and sticky dropped).
        mode: u32,
        /// How it looked when opened (its size among it).
        stamp: Stamp,
    },
    /// Not a regular file at open time (a link, a FIFO, a device...): skipped, never
    /// read; the reason in words.
    NotRegular(String),
}

/// The directory the last source of a tree was opened from: the files of one
/// directory come one after another in a walk, so each is opened with one `openat`
/// from it rather than walking down from the root again (two `openat` and two `close`
/// more per file at depth one: 9% of a 4,000-file run). Like the walk's own
/// descriptors, it stays the directory found beneath the root without following a
/// link, even if its name is later moved or replaced by a link: what is read is what
/// was walked into.
static LAST_SOURCE_DIR: Mutex<Option<(PathBuf, PathBuf, OwnedFd)>> = Mutex::new(None);

/// Opens the directory holding `path` (which lies under `root`) one component at a
/// time from `root`, never following a link, and runs `open` in it; a link on the way
/// is reported as a reason to skip the file. The directory is kept for the next file
/// (see [`LAST_SOURCE_DIR`]).
fn in_parent_beneath<T>(
    root: &Path,
    path: &Path,
    open: impl FnOnce(&OwnedFd) -> T,
) -> io::Result<Result<T, Opened>> {
    let rel = path.strip_prefix(root).map_err(io::Error::other)?;
    let parent = rel.parent().unwrap_or(Path::new(""));
    let mut last = LAST_SOURCE_DIR
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((r, p, dir)) = last.as_ref() {
        if r == root && p == parent {
            return Ok(Ok(open(dir)));
        }
    }
    // A different directory: the one kept goes (one descriptor at most).
    *last = None;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut dir = rustix::fs::openat(CWD, root, flags, Mode::empty())?;
    let mut walked = root.to_path_buf();
    for name in parent.components() {
        walked.push(name);
        dir = match rustix::fs::openat(&dir, name.as_os_str(), flags | OFlags::NOFOLLOW, Mode::empty()) {
            Ok(next) => next,
            Err(Errno::LOOP | Errno::NOTDIR) => {
                return Ok(Err(Opened::NotRegular(format!(
                    "{} is no longer a directory but a link or a file (found when opening), not followed",
                    super::plan::show(&walked)
                ))))
            }
            Err(e) => return Err(e.into()),
        };
    }
    let opened = open(&dir);
    *last = Some((root.to_path_buf(), parent.to_path_buf(), dir));
    Ok(Ok(opened))
}

/// Opens a source without following a link (unless `follow`: a path the user named)
/// and without blocking (a FIFO swapped in must not hang the run), then types it by
/// the opened descriptor. A file of a tree is opened from the tree's root `beneath`,
/// directory by directory, so a directory swapped for a link is not followed either.
pub fn open_source(path: &Path, follow: bool, beneath: Option<&Path>) -> io::Result<Opened> {
    test_swap_before_open(path);
    let mut flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    if !follow {
        flags |= OFlags::NOFOLLOW;
    }
    let opened = match beneath {
        Some(root) => {
            let name = path.file_name().unwrap_or_default();
            match in_parent_beneath(root, path, |dir| {
                rustix::fs::openat(dir, name, flags, Mode::empty())
            })? {
                Ok(opened) => opened,
                Err(skip) => return Ok(skip),
            }
        }
        None => rustix::fs::openat(CWD, path, flags, Mode::empty()),
    };
    let fd = match opened {
        Ok(fd) => fd,
        Err(Errno::LOOP) if !follow => {
            return Ok(Opened::NotRegular(
                "symbolic link (found when opening), not followed".into(),
            ))
        }
        Err(e) => return Err(e.into()),
    };
    let st = rustix::fs::fstat(&fd)?;
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => None,
        FileType::Directory => Some("a directory"),
        FileType::Fifo => Some("a FIFO"),
        FileType::Socket => Some("a socket"),
        FileType::CharacterDevice => Some("a character device"),
        FileType::BlockDevice => Some("a block device"),
        _ => Some("not a regular file"),
    };
    if let Some(kind) = kind {
        return Ok(Opened::NotRegular(format!(
            "{kind} (found when opening), not read"
        )));
    }
    // O_NONBLOCK stays set: Linux ignores it when reading a regular file (it means
    // something only for pipes, sockets and devices, refused above), and clearing it
    // cost two `fcntl` per file. A file system that honoured it could only fail the
    // read (EAGAIN, reported), never shorten the message: a short read ends the file
    // only after `changed` has found its size as opened.
    Ok(Opened::File {
        file: File::from(fd),
        mode: st.st_mode & FILE_MODE_BITS,
        stamp: Stamp::of(&st),
    })
}

/// The swap hook (see [`TEST_SWAP_DIR`]); nothing in release builds.
fn test_swap_before_open(path: &Path) {
    if !cfg!(debug_assertions) {
        return;
    }
    let (Some(dir), Some(name)) = (std::env::var_os(TEST_SWAP_DIR), path.file_name()) else {
        return;
    };
    let swap = Path::new(&dir).join(name);
    if swap.symlink_metadata().is_ok() {
        let _ = std::fs::rename(&swap, path);
    }
    // `DIR/<parent's name>`: the file's directory is moved aside and replaced.
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some((parent, pname)) = parent.and_then(|p| Some((p, p.file_name()?))) {
        let swap = Path::new(&dir).join(pname);
        if swap.symlink_metadata().is_ok() {
            let mut aside = pname.to_os_string();
            aside.push(".orig");
            let _ = std::fs::rename(parent, Path::new(&dir).join(aside));
            let _ = std::fs::rename(&swap, parent);
        }
    }
}

/// An OS error on the output side, worded to say so and to name the destination
/// (errors already worded, which name their path, pass as they are).
fn output_error(dest: &Dest, e: io::Error) -> io::Error {
    let Some(code) = e.raw_os_error() else {
        return e;
    };
    let (place, what) = match (dest, code == ENOSPC) {
        (Dest::File(t), true) => (
            super::plan::show(&t.path()),
            "no space left on the device (the partial output was removed)".to_string(),
        ),
        (Dest::Stdout, true) => (
            "standard output".to_string(),
            "no space left on the device".to_string(),
        ),
        (Dest::File(t), false) => (super::plan::show(&t.path()), e.to_string()),
        (Dest::Stdout, false) => ("standard output".to_string(), e.to_string()),
    };
    io::Error::new(e.kind(), format!("cannot write {place}: {what}"))
}

/// An output's buffers written by another thread, and what it met there.
#[derive(Debug, Default)]
pub struct WriteState {
    /// The first write error, until the output's owner takes it.
    error: Mutex<Option<io::Error>>,
    /// Whether a write failed (stays set once the error is taken).
    failed: AtomicBool,
}

impl WriteState {
    /// The write error met so far, if any (the first time: the error itself; after:
    /// a reminder).
    fn check(&self) -> io::Result<()> {
        if !self.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        let taken = self
            .error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        Err(taken.unwrap_or_else(|| io::Error::other("an earlier write failed")))
    }

    fn fail(&self, e: io::Error) {
        let mut error = self
            .error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !self.failed.swap(true, Ordering::AcqRel) {
            *error = Some(e);
        }
    }
}

/// One buffer of an output, for the writer thread to write at its offset.
pub struct QueuedWrite {
    file: Arc<File>,
    offset: u64,
    data: Vec<u8>,
    state: Arc<WriteState>,
}

impl QueuedWrite {
    /// Writes the buffer (unless an earlier one of its file failed), records a
    /// failure for the output's owner, and hands the buffer back to `pool`.
    pub fn run(self, pool: &BufferPool) {
        if !self.state.failed.load(Ordering::Acquire) {
            if let Err(e) = self.file.write_all_at(&self.data, self.offset) {
                self.state.fail(e);
            }
        }
        pool.put(self.data);
    }
}

/// Buffers going round between the outputs and the threads that write them: large
/// ones ([`WRITE_BUFFER`]) of files written behind, so a large file's buffers are
/// allocated once; small outputs' first buffers ([`FIRST_BUFFER`]) and the chunk
/// buffers small outputs took whole, given back once the writer or a settler wrote
/// them, so a tree of small files does not allocate a fresh buffer per file (chunk
/// buffers go on to the engines as spares). A buffer is emptied before it is kept:
/// what an output wrote is only ever what it was given.
#[derive(Clone, Debug, Default)]
pub struct BufferPool(Arc<Pools>);

/// The pools of [`BufferPool`], by the buffers' size.
#[derive(Debug, Default)]
struct Pools {
    large: Mutex<Vec<Vec<u8>>>,
    small: Mutex<Vec<Vec<u8>>>,
    /// Chunk outputs taken whole by outputs and written: spares for the engines.
    chunks: Mutex<Vec<Vec<u8>>>,
}

/// Locks a pool, whatever a panicking holder left in it (only empty buffers).
fn lock_pool(pool: &Mutex<Vec<Vec<u8>>>) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
    pool.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl BufferPool {
    /// A large buffer (at least [`WRITE_BUFFER`] bytes of capacity), empty.
    fn take(&self) -> Vec<u8> {
        lock_pool(&self.0.large)
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(WRITE_BUFFER))
    }

    /// A new output's first buffer (at least [`FIRST_BUFFER`] bytes), empty.
    fn take_first(&self) -> Vec<u8> {
        lock_pool(&self.0.small)
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(FIRST_BUFFER))
    }

    /// A buffer for the engines to write a chunk's output into, if one is kept
    /// (else an empty one: the engine makes its own).
    fn take_chunk(&self) -> Vec<u8> {
        lock_pool(&self.0.chunks).pop().unwrap_or_default()
    }

    /// Keeps `data`, emptied, for reuse if its pool has room (else frees it).
    fn put(&self, mut data: Vec<u8>) {
        let (pool, most) = if data.capacity() >= WRITE_BUFFER {
            (&self.0.large, POOL_BUFFERS)
        } else if data.capacity() >= FIRST_BUFFER {
            (&self.0.small, SMALL_POOL_BUFFERS)
        } else if data.capacity() >= hetcrypt_format::CHUNK_SIZE {
            (&self.0.chunks, CHUNK_POOL_BUFFERS)
        } else {
            return;
        };
        data.clear();
        let mut pool = lock_pool(pool);
        if pool.len() < most {
            pool.push(data);
        }
    }

    /// Buffers kept now: chunks, small and large (for tests).
    #[cfg(test)]
    fn kept(&self) -> (usize, usize, usize) {
        (
            lock_pool(&self.0.chunks).len(),
            lock_pool(&self.0.small).len(),
            lock_pool(&self.0.large).len(),
        )
    }
}

/// Where an output's full buffers go: the writer thread's queue (write-behind), so
/// the thread that reads the inputs does not also wait on the writes.
#[derive(Clone)]
pub struct WriteBehind {
    /// The writer's queue.
    pub queue: mpsc::SyncSender<super::ToWriter>,
    /// Buffers to fill next.
    pub pool: BufferPool,
}

/// A chunk's output an output took whole, and the bytes written before it (its
/// headers); those written after it are in the sink's `buf`.
struct Taken {
    before: Vec<u8>,
    chunk: Vec<u8>,
}

/// An output file being written: its pending bytes (`taken`'s, then `buf`'s) start at
/// offset `at`; its temporary is made when the first buffer is written (a small
/// file's, by the writer thread or a settler when it settles it).
struct TempSink {
    target: Target,
    temp: Option<Temp>,
    /// A chunk's output taken whole, before `buf` (a small output's only chunk).
    taken: Option<Taken>,
    buf: Vec<u8>,
    at: u64,
    /// Where the last buffer written ends: short of the end when the file ends in a
    /// hole (zeros not written), whose length `settle` then sets.
    written_end: u64,
    state: Arc<WriteState>,
    /// The permission bits the output gets (its temporary may be made with them).
    mode: Option<u32>,
}

impl TempSink {
    /// The temporary, made now if it is not yet.
    fn temp(&mut self) -> io::Result<&Temp> {
        if self.temp.is_none() {
            let parent = self.target.rel.parent().unwrap_or(Path::new(""));
            let dir = dest::open_output_dir(&self.target.root, parent)?;
            self.temp = Some(Temp::new(dir, self.mode)?);
        }
        Ok(self.temp.as_ref().expect("made just above"))
    }

    /// Bytes pending: not yet sent nor written.
    fn pending(&self) -> usize {
        let taken = self
            .taken
            .as_ref()
            .map_or(0, |t| t.before.len() + t.chunk.len());
        taken + self.buf.len()
    }

    /// Whether a chunk's output `data` may be taken whole: only an output's first
    /// chunk, with nothing sent or made yet (a small file's only one; a larger file's
    /// first, copied with the second, see [`TempSink::untake`]), and never zeros that
    /// a hole may stand for (see [`SPARSE_MIN`]).
    fn may_take(&self, data: &[u8]) -> bool {
        self.taken.is_none()
            && self.temp.is_none()
            && self.at == 0
            && self.buf.len() <= HEAD_BUFFER
            && data.len() >= TAKE_MIN
            && !(data.len() >= SPARSE_MIN && data.iter().all(|&b| b == 0))
    }

    /// Copies a taken chunk (and what came before and after it) into one buffer, as
    /// if it had been written; returns the chunk's buffer, free now.
    fn untake(&mut self, pool: Option<&BufferPool>) -> Option<Vec<u8>> {
        let Taken { before, chunk } = self.taken.take()?;
        let mut all = pool.map_or_else(|| Vec::with_capacity(FIRST_BUFFER), BufferPool::take_first);
        all.reserve(before.len() + chunk.len() + self.buf.len());
        all.extend_from_slice(&before);
        all.extend_from_slice(&chunk);
        all.extend_from_slice(&self.buf);
        self.buf = all;
        Some(chunk)
    }

    /// Sends (or, without a writer thread, writes) the pending bytes.
    fn flush_buf(&mut self, behind: Option<&WriteBehind>) -> io::Result<()> {
        self.state.check()?;
        if let Some(b) = behind {
            // A queued write is one buffer.
            if let Some(chunk) = self.untake(Some(&b.pool)) {
                b.pool.put(chunk);
            }
        }
        let len = self.pending() as u64;
        if len == 0 {
            return Ok(());
        }
        let file = self.temp()?.file().clone();
        match behind {
            Some(b) => {
                let data = std::mem::replace(&mut self.buf, b.pool.take());
                let write = QueuedWrite {
                    file,
                    offset: self.at,
                    data,
                    state: self.state.clone(),
                };
                if b.queue.send(super::ToWriter::Write(write)).is_err() {
                    return Err(io::Error::other("internal error: the writer stopped"));
                }
            }
            None => {
                match &self.taken {
                    Some(t) => {
                        write_all_at_vectored(&file, [&t.before, &t.chunk, &self.buf], self.at)?
                    }
                    None => file.write_all_at(&self.buf, self.at)?,
                }
                self.buf.clear();
            }
        }
        self.at += len;
        self.written_end = self.at;
        Ok(())
    }
}

/// Writes `parts` one after another at `offset`: one `pwritev` unless the kernel
/// writes less than asked. The I/O vectors live on the stack (no allocation per file).
fn write_all_at_vectored<const N: usize>(
    file: &File,
    mut parts: [&[u8]; N],
    mut offset: u64,
) -> io::Result<()> {
    let mut first = 0;
    while first < N {
        if parts[first].is_empty() {
            first += 1;
            continue;
        }
        let slices: [io::IoSlice<'_>; N] =
            std::array::from_fn(|i| io::IoSlice::new(parts.get(first + i).copied().unwrap_or(&[])));
        let mut n = match rustix::io::pwritev(file, &slices[..N - first], offset) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        offset += n as u64;
        while n > 0 {
            let part = &mut parts[first];
            if n >= part.len() {
                n -= part.len();
                first += 1;
            } else {
                *part = &part[n..];
                n = 0;
            }
        }
    }
    Ok(())
}

/// Where bytes go until the message is complete.
enum Sink {
    /// A file, through a temporary in its destination directory.
    Temp(TempSink),
    /// Standard output (opened on first use). Safe for decryption too: a decrypt
    /// stream writes a chunk only once it authenticated; a reader must still check the
    /// exit status, which is the only sign that the message was complete.
    Stdout(Option<BufWriter<io::Stdout>>),
}

/// An output that appears at its destination complete or not at all.
pub struct Output {
    dest: Dest,
    sink: Sink,
    mode: Option<u32>,
    behind: Option<WriteBehind>,
    /// Where its buffers come from and go back to once written (kept when detached).
    pool: Option<BufferPool>,
}

impl Output {
    /// An output to `dest`, given the permission bits `mode` when complete, written by
    /// the calling thread.
    pub fn new(dest: Dest, mode: Option<u32>) -> Self {
        let sink = match &dest {
            Dest::File(target) => Sink::Temp(TempSink {
                target: target.clone(),
                temp: None,
                taken: None,
                buf: Vec::new(),
                at: 0,
                written_end: 0,
                state: Arc::default(),
                mode: mode.map(|m| m & FILE_MODE_BITS),
            }),
            Dest::Stdout => Sink::Stdout(None),
        };
        Output {
            dest,
            sink,
            mode: mode.map(|m| m & FILE_MODE_BITS),
            behind: None,
            pool: None,
        }
    }

    /// The same, its full buffers written by the writer thread behind `behind`.
    pub fn behind(mut self, behind: WriteBehind) -> Self {
        self.pool = Some(behind.pool.clone());
        self.behind = Some(behind);
        self
    }

    fn output_error(&self, e: io::Error) -> io::Error {
        output_error(&self.dest, e)
    }

    /// Stops writing behind: what is left is written by the caller (the writer thread
    /// itself, once the output reaches it).
    pub fn detach(&mut self) {
        self.behind = None;
    }

    /// Whether any of it went to the writer thread already (a temporary exists, its
    /// buffers queued there), or it is standard output: then only that writer may
    /// settle and name it, after those buffers.
    pub fn written_behind(&self) -> bool {
        match &self.sink {
            Sink::Temp(t) => t.temp.is_some(),
            Sink::Stdout(_) => true,
        }
    }

    /// The directory the output is named in (`None`: standard output, or not settled).
    pub fn dir(&self) -> Option<&DirFd> {
        match &self.sink {
            Sink::Temp(t) => t.temp.as_ref().map(Temp::dir),
            Sink::Stdout(_) => None,
        }
    }

    /// Gets a complete output ready to be named: everything written (and every
    /// write-behind error reported), mode and length set; flushes stdout. Its content
    /// is durable once its file system is synced.
    pub fn settle(&mut self) -> io::Result<()> {
        let behind = self.behind.clone();
        let pool = self.pool.as_ref();
        let mode = self.mode;
        let settled = match &mut self.sink {
            Sink::Temp(t) => t.flush_buf(behind.as_ref()).and_then(|()| {
                // Written behind: settled once the writer thread wrote it all, which
                // it has when it settles the output itself.
                t.state.check()?;
                // Nothing more is written: the output keeps no buffer while it waits
                // (they go back to the pool, for the next outputs and chunks).
                let buf = std::mem::take(&mut t.buf);
                let chunk = t.taken.take().map(|t| t.chunk);
                if let Some(pool) = pool {
                    pool.put(buf);
                    if let Some(chunk) = chunk {
                        pool.put(chunk);
                    }
                }
                let (end, written_end) = (t.at, t.written_end);
                t.temp()?.prepare(mode, end, written_end)?;
                test_fail_settle(&t.target)
            }),
            Sink::Stdout(w) => w.as_mut().map_or(Ok(()), BufWriter::flush),
        };
        settled.map_err(|e| self.output_error(e))
    }

    /// Names a settled, synced output at its destination (refusing to replace an
    /// existing file unless `force`, and never a link). Returns the directory whose
    /// entry changed: the name is durable once its file system is synced.
    pub fn name(self, force: bool) -> io::Result<Option<DirFd>> {
        let Output { dest, sink, .. } = self;
        let named = match sink {
            Sink::Temp(TempSink {
                temp: Some(temp),
                target,
                ..
            }) => {
                let name = target.rel.file_name().unwrap_or_default();
                temp.name(name, force).map(Some)
            }
            Sink::Temp(_) => unreachable!("settled, so its temporary exists"),
            Sink::Stdout(_) => Ok(None),
        };
        named.map_err(|e| output_error(&dest, e))
    }

    /// Makes the output final on its own: settles it, syncs its content (one fsync)
    /// and names it. For outputs outside the writer thread's groups (a tree's
    /// manifest).
    pub fn commit(mut self, force: bool) -> io::Result<Option<DirFd>> {
        self.detach();
        self.settle()?;
        if let Sink::Temp(TempSink {
            temp: Some(temp), ..
        }) = &self.sink
        {
            temp.sync().map_err(|e| self.output_error(e))?;
        }
        self.name(force)
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let behind = self.behind.as_ref();
        let pool = self.pool.as_ref();
        let written = match &mut self.sink {
            Sink::Temp(t) if buf.len() >= SPARSE_MIN && buf.iter().all(|&b| b == 0) => {
                // A hole: the pending buffer goes first, then the offset moves on.
                t.flush_buf(behind).map(|()| {
                    t.at += buf.len() as u64;
                    buf.len()
                })
            }
            Sink::Temp(t) => {
                let room = t.buf.capacity() - t.buf.len();
                if room < buf.len() && t.buf.capacity() < FIRST_BUFFER {
                    // Headers (or what follows a taken chunk) fit a small buffer; more
                    // moves to a first buffer of the pool.
                    let small = t.buf.is_empty() && buf.len() <= HEAD_BUFFER;
                    let mut grown = match pool {
                        _ if small => Vec::with_capacity(HEAD_BUFFER),
                        Some(pool) => pool.take_first(),
                        None => Vec::with_capacity(FIRST_BUFFER),
                    };
                    grown.extend_from_slice(&t.buf);
                    t.buf = grown;
                }
                t.buf.extend_from_slice(buf);
                if t.buf.len() >= WRITE_BUFFER {
                    t.flush_buf(behind).map(|()| buf.len())
                } else {
                    Ok(buf.len())
                }
            }
            Sink::Stdout(w) => w
                .get_or_insert_with(|| BufWriter::with_capacity(STDOUT_BUFFER, io::stdout()))
                .write(buf),
        };
        written.map_err(|e| output_error(&self.dest, e))
    }

    /// Written behind, a small file's last buffer stays for the writer thread to write
    /// when it names the file (one message for the whole file).
    fn flush(&mut self) -> io::Result<()> {
        let behind = self.behind.as_ref();
        let flushed = match &mut self.sink {
            Sink::Temp(t) if behind.is_some() && t.pending() < SMALL_BUFFER => t.state.check(),
            Sink::Temp(t) => t.flush_buf(behind),
            Sink::Stdout(w) => w.as_mut().map_or(Ok(()), BufWriter::flush),
        };
        flushed.map_err(|e| output_error(&self.dest, e))
    }
}

impl hetcrypt_format::ChunkWrite for Output {
    /// Written behind, an output's first chunk is taken whole (the pool gives the
    /// engines another buffer): a small file's output is then its headers, its
    /// chunk's own buffer and its last (short) chunk, written by one `pwritev` where it
    /// is settled. Any other chunk is copied (at the second full one, the taken one
    /// with it: one copy per chunk, as before).
    fn write_chunk(&mut self, data: Vec<u8>) -> io::Result<Vec<u8>> {
        let pool = self.behind.as_ref().map(|b| b.pool.clone());
        if let (Sink::Temp(t), Some(pool)) = (&mut self.sink, &pool) {
            if t.may_take(&data) {
                let before = std::mem::take(&mut t.buf);
                t.taken = Some(Taken {
                    before,
                    chunk: data,
                });
                return Ok(pool.take_chunk());
            }
            if data.len() >= TAKE_MIN {
                // A second chunk: the file is not small, its bytes go in one buffer.
                if let Some(chunk) = t.untake(Some(pool)) {
                    pool.put(chunk);
                }
            }
        }
        self.write_all(&data)?;
        Ok(data)
    }
}

/// Creates the directory `target` (and missing parents, never through a link) for a
/// directory of an input tree; returns whether it was created (false: it was already
/// there). A non-directory in its place is an error.
pub fn make_dir(target: &Target) -> io::Result<bool> {
    dest::open_dir(&target.root, &target.rel, true).map(|(_, created)| created)
}

/// Gives a directory made by [`make_dir`] its input's permission bits (through the
/// descriptor, never through a link).
pub fn set_dir_mode(target: &Target, mode: u32) -> io::Result<()> {
    let (dir, _) = dest::open_dir(&target.root, &target.rel, false)?;
    rustix::fs::fchmod(&*dir.fd, Mode::from_raw_mode(mode))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_keeps_buffers_emptied_each_in_its_size_and_up_to_its_bound() {
        let pool = BufferPool::default();
        assert_eq!(pool.take_chunk().capacity(), 0, "no chunk kept: none made");
        let mut chunk = Vec::with_capacity(hetcrypt_format::CHUNK_SIZE + 16);
        chunk.extend_from_slice(b"one file's bytes");
        pool.put(chunk);
        let mut first = pool.take_first();
        first.extend_from_slice(b"another file's");
        pool.put(first);
        pool.put(Vec::with_capacity(WRITE_BUFFER));
        // Too small to be worth keeping.
        pool.put(Vec::with_capacity(HEAD_BUFFER));
        assert_eq!(pool.kept(), (1, 1, 1));
        let (chunk, first) = (pool.take_chunk(), pool.take_first());
        assert!(chunk.is_empty() && chunk.capacity() >= hetcrypt_format::CHUNK_SIZE);
        assert!(first.is_empty() && first.capacity() >= FIRST_BUFFER);
        assert!(pool.take().is_empty());
        for _ in 0..SMALL_POOL_BUFFERS + 3 {
            pool.put(Vec::with_capacity(FIRST_BUFFER));
        }
        assert_eq!(pool.kept().1, SMALL_POOL_BUFFERS);
    }

    #[test]
    fn vectored_writes_put_every_part_in_order_at_the_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = File::create(&path).unwrap();
        let big = vec![7u8; 3 * 65_536 + 5];
        write_all_at_vectored(&file, [b"head", b"", &big, b"tail"], 3).unwrap();
        let got = std::fs::read(&path).unwrap();
        assert_eq!(&got[..3], &[0, 0, 0]);
        assert_eq!(&got[3..7], b"head");
        assert_eq!(&got[7..7 + big.len()], &big[..]);
        assert_eq!(&got[7 + big.len()..], b"tail");
    }
}
