//! Inputs opened without following links and typed by the opened descriptor, and
//! outputs that never lose data nor leave unauthenticated plaintext: written to a
//! temporary in the destination directory (see [`dest`](super::dest)), named only when
//! the whole message went through.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, CWD};
use rustix::io::Errno;

use super::dest::{self, DirFd, Target, Temp};
use super::plan::Dest;

/// Output buffer: four chunks, so writes reach the kernel in large pieces while the
/// outputs waiting in the commit queue stay small.
const WRITE_BUFFER: usize = 64 * 1024;

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

/// The truncation hook (see [`TEST_TRUNCATE_WHILE_READING`]); nothing in release
/// builds.
fn test_truncate_while_reading(f: &File, path: &Path) {
    if !cfg!(debug_assertions) {
        return;
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

impl Read for Input {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Input::File {
                file,
                path,
                opened,
                read,
            } => {
                let Some(f) = file else { return Ok(0) };
                let n = f.read(buf).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("cannot read {}: {e}", super::plan::show(path)),
                    )
                })?;
                if *read == 0 && n > 0 {
                    test_truncate_while_reading(f, path);
                }
                *read += n as u64;
                if n == 0 && !buf.is_empty() {
                    if let Some(e) = changed(f, path, *opened, *read) {
                        return Err(e);
                    }
                    *file = None;
                }
                Ok(n)
            }
            Input::Stdin(s) => s
                .read(buf)
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

/// Opens the directory holding `path` (which lies under `root`) one component at a
/// time from `root`, never following a link; a link on the way is reported as a
/// reason to skip the file.
fn open_parent_beneath(root: &Path, path: &Path) -> io::Result<Result<OwnedFd, Opened>> {
    let rel = path.strip_prefix(root).map_err(io::Error::other)?;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut dir = rustix::fs::openat(CWD, root, flags, Mode::empty())?;
    let mut walked = root.to_path_buf();
    for name in rel.parent().into_iter().flat_map(Path::components) {
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
    Ok(Ok(dir))
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
        Some(root) => match open_parent_beneath(root, path)? {
            Ok(dir) => {
                let name = path.file_name().unwrap_or_default();
                rustix::fs::openat(&dir, name, flags, Mode::empty())
            }
            Err(skip) => return Ok(skip),
        },
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
    let blocking = rustix::fs::fcntl_getfl(&fd)? - OFlags::NONBLOCK;
    rustix::fs::fcntl_setfl(&fd, blocking)?;
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

impl Write for Temp {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file().write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
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

/// Where bytes go until the message is complete.
enum Sink {
    /// Nothing written yet.
    Pending,
    /// A temporary in the destination directory.
    Temp(BufWriter<Temp>),
    /// Straight to stdout. Safe for decryption too: a decrypt stream writes a chunk
    /// only once it authenticated; a reader must still check the exit status, which
    /// is the only sign that the message was complete.
    Stdout(BufWriter<io::Stdout>),
}

/// An output that appears at its destination complete or not at all.
pub struct Output {
    dest: Dest,
    sink: Sink,
    mode: Option<u32>,
}

impl Output {
    /// An output to `dest`, given the permission bits `mode` when complete.
    pub fn new(dest: Dest, mode: Option<u32>) -> Self {
        Output {
            dest,
            sink: Sink::Pending,
            mode: mode.map(|m| m & FILE_MODE_BITS),
        }
    }

    fn output_error(&self, e: io::Error) -> io::Error {
        output_error(&self.dest, e)
    }

    fn open(&mut self) -> io::Result<()> {
        self.sink = match &self.dest {
            Dest::File(target) => {
                let parent = target.rel.parent().unwrap_or(Path::new(""));
                let dir = dest::open_output_dir(&target.root, parent)?;
                Sink::Temp(BufWriter::with_capacity(WRITE_BUFFER, Temp::new(dir)?))
            }
            Dest::Stdout => Sink::Stdout(BufWriter::with_capacity(WRITE_BUFFER, io::stdout())),
        };
        Ok(())
    }

    /// Makes the output final: names the synced temporary as the destination
    /// (refusing to replace an existing file unless `force`, and never a link), or
    /// flushes stdout. Returns the directory whose entry changed: the new name is
    /// durable once the caller has synced it (once per directory, at the end of the
    /// run, rather than once per file).
    pub fn commit(mut self, force: bool) -> io::Result<Option<DirFd>> {
        if matches!(self.sink, Sink::Pending) {
            self.open().map_err(|e| self.output_error(e))?;
        }
        Self::commit_sink(self.sink, &self.dest, self.mode, force)
            .map_err(|e| output_error(&self.dest, e))
    }

    fn commit_sink(
        sink: Sink,
        dest: &Dest,
        mode: Option<u32>,
        force: bool,
    ) -> io::Result<Option<DirFd>> {
        match (sink, dest) {
            (Sink::Temp(w), Dest::File(target)) => {
                let tmp = w.into_inner().map_err(io::IntoInnerError::into_error)?;
                let name = target.rel.file_name().unwrap_or_default();
                tmp.commit(name, mode, force).map(Some)
            }
            (Sink::Stdout(mut w), _) => w.flush().map(|()| None),
            (Sink::Temp(_), Dest::Stdout) | (Sink::Pending, _) => {
                unreachable!("opened above, by its destination")
            }
        }
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if matches!(self.sink, Sink::Pending) {
            self.open().map_err(|e| self.output_error(e))?;
        }
        let written = match &mut self.sink {
            Sink::Temp(w) if buf.len() >= SPARSE_MIN && buf.iter().all(|&b| b == 0) => w
                .flush()
                .and_then(|()| w.get_mut().skip(buf.len() as u64))
                .map(|()| buf.len()),
            Sink::Temp(w) => w.write(buf),
            Sink::Stdout(w) => w.write(buf),
            Sink::Pending => unreachable!("opened above"),
        };
        written.map_err(|e| self.output_error(e))
    }

    fn flush(&mut self) -> io::Result<()> {
        let flushed = match &mut self.sink {
            Sink::Temp(w) => w.flush(),
            Sink::Stdout(w) => w.flush(),
            Sink::Pending => Ok(()),
        };
        flushed.map_err(|e| self.output_error(e))
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
