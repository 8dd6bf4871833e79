//! Inputs opened only when first read, and outputs that never lose data: written to a
//! temporary file beside the destination, synced, renamed into place only when the
//! whole message went through (and removed otherwise).

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Seek, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

use super::plan::{Dest, Source};

/// Output buffer: four chunks, so writes reach the kernel in large pieces while the
/// outputs waiting in the commit queue stay small.
const WRITE_BUFFER: usize = 64 * 1024;

/// An input, opened at its first read (so only the files in flight hold a
/// descriptor).
pub enum Input {
    /// Not opened yet.
    Pending(PathBuf),
    /// An open file.
    File(File),
    /// Standard input.
    Stdin(io::Stdin),
}

impl Input {
    /// The input for `source`.
    pub fn new(source: &Source) -> Self {
        match source {
            Source::Stdin => Input::Stdin(io::stdin()),
            Source::File(p) => Input::Pending(p.clone()),
        }
    }
}

impl Read for Input {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Input::Pending(path) = self {
            *self = Input::File(File::open(&*path)?);
        }
        match self {
            Input::File(f) => f.read(buf),
            Input::Stdin(s) => s.read(buf),
            Input::Pending(_) => unreachable!("opened above"),
        }
    }
}

/// Where bytes go until the message is complete.
enum Sink {
    /// Nothing written yet.
    Pending,
    /// A temporary file (beside the destination, or in the temp dir for stdout).
    Temp(BufWriter<NamedTempFile>),
    /// Straight to stdout (encryption only: ciphertext is safe to emit early).
    Stdout(BufWriter<io::Stdout>),
}

/// An output that appears at its destination complete or not at all.
pub struct Output {
    dest: Dest,
    sink: Sink,
    /// Whether stdout output must be held back until complete (decryption: plaintext
    /// is unauthenticated until the whole message is).
    hold_stdout: bool,
    mode: Option<u32>,
}

impl Output {
    /// An output to `dest`; for stdout, `hold_stdout` buffers everything in a
    /// temporary file and emits it only on [`Output::commit`].
    pub fn new(dest: Dest, hold_stdout: bool, mode: Option<u32>) -> Self {
        Output {
            dest,
            sink: Sink::Pending,
            hold_stdout,
            mode,
        }
    }

    fn open(&mut self) -> io::Result<()> {
        self.sink = match &self.dest {
            Dest::File(path) => {
                let dir = parent(path);
                fs::create_dir_all(&dir)?;
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                // Hidden and private (mode 0600) while incomplete.
                let tmp = tempfile::Builder::new()
                    .prefix(&format!(".{name}."))
                    .suffix(".tmp")
                    .tempfile_in(&dir)?;
                Sink::Temp(BufWriter::with_capacity(WRITE_BUFFER, tmp))
            }
            Dest::Stdout if self.hold_stdout => Sink::Temp(BufWriter::with_capacity(
                WRITE_BUFFER,
                NamedTempFile::new()?,
            )),
            Dest::Stdout => Sink::Stdout(BufWriter::with_capacity(WRITE_BUFFER, io::stdout())),
        };
        Ok(())
    }

    /// Makes the output final: syncs and renames the temporary file onto the
    /// destination (refusing to replace an existing file unless `force`), or emits
    /// the held-back stdout output. Returns the directory whose entry changed: the
    /// rename is durable once the caller has synced it (once per directory, at the
    /// end of the run, rather than once per file).
    pub fn commit(mut self, force: bool) -> io::Result<Option<PathBuf>> {
        if matches!(self.sink, Sink::Pending) {
            self.open()?;
        }
        match (self.sink, &self.dest) {
            (Sink::Temp(w), Dest::File(path)) => {
                let tmp = w.into_inner().map_err(io::IntoInnerError::into_error)?;
                if let Some(mode) = self.mode {
                    tmp.as_file()
                        .set_permissions(fs::Permissions::from_mode(mode))?;
                }
                tmp.as_file().sync_all()?;
                let persisted = if force {
                    tmp.persist(path)
                } else {
                    tmp.persist_noclobber(path)
                };
                persisted.map_err(|e| {
                    if e.error.kind() == io::ErrorKind::AlreadyExists {
                        io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            format!(
                                "{} already exists (use --force to overwrite)",
                                path.display()
                            ),
                        )
                    } else {
                        e.error
                    }
                })?;
                Ok(Some(parent(path)))
            }
            (Sink::Temp(w), Dest::Stdout) => {
                let mut tmp = w.into_inner().map_err(io::IntoInnerError::into_error)?;
                tmp.rewind()?;
                let mut out = io::stdout().lock();
                io::copy(&mut tmp, &mut out)?;
                out.flush()?;
                Ok(None)
            }
            (Sink::Stdout(mut w), _) => w.flush().map(|()| None),
            (Sink::Pending, _) => unreachable!("opened above"),
        }
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if matches!(self.sink, Sink::Pending) {
            self.open()?;
        }
        match &mut self.sink {
            Sink::Temp(w) => w.write(buf),
            Sink::Stdout(w) => w.write(buf),
            Sink::Pending => unreachable!("opened above"),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.sink {
            Sink::Temp(w) => w.flush(),
            Sink::Stdout(w) => w.flush(),
            Sink::Pending => Ok(()),
        }
    }
}

/// Syncs a directory, making the renames into it durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates the directory `dest` (and missing parents) for a directory of an input
/// tree; returns whether it was created (false: it was already there). A non-directory
/// in its place is an error.
pub fn make_dir(dest: &Path) -> io::Result<bool> {
    match dest.symlink_metadata() {
        Ok(m) if m.is_dir() => Ok(false),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a directory", dest.display()),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir_all(dest).map(|()| true),
        Err(e) => Err(e),
    }
}

/// Gives a directory made by [`make_dir`] its input's permission bits.
pub fn set_dir_mode(dest: &Path, mode: u32) -> io::Result<()> {
    fs::set_permissions(dest, fs::Permissions::from_mode(mode))
}

/// The directory a path lies in (`.` for a bare name).
fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}
