//! Confined outputs and temporaries that never outlive the run.
//!
//! - Every path under a destination root is opened relative to the root, one component
//!   at a time, with `O_NOFOLLOW`: a symbolic link met on the way is an error naming
//!   it, never followed, so nothing is written outside the destination (the root
//!   itself, the path the user named, is opened as named).
//! - An output is first an anonymous `O_TMPFILE` file in its directory, given a name
//!   (`linkat`) only once complete (decrypted: fully authenticated); a signal, a crash
//!   or `kill -9` before that leaves no trace, since an unnamed file vanishes with its
//!   last descriptor. It is made with its final permission bits where the umask leaves
//!   them whole and no default ACL decides them instead (unnamed, it cannot be opened
//!   by anyone who could not open the run's own descriptors), saving a `fchmod` per
//!   file; otherwise it stays 0600 until ready.
//! - Where the file system has no `O_TMPFILE`, the temporary is a named file
//!   `.hetcrypt-tmp-<pid>-<random>` (mode 0600): removed on failure, on SIGINT, SIGTERM
//!   and SIGHUP, and, after a `kill -9`, by the next run that writes into the same
//!   directory (a name whose process is gone). Its name has a fixed length, so a legal
//!   destination name never fails for the temporary's sake.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, CWD};
use rustix::io::Errno;

/// Prefix of named temporaries, so a later run recognises (and removes) those an
/// earlier one left behind when it was killed.
pub const TEMP_PREFIX: &str = ".hetcrypt-tmp-";

/// Temporaries and new key files are private until complete.
const PRIVATE_MODE: u32 = 0o600;

/// Directories made for outputs get the usual 0777 less the umask (trees' directories
/// get their input's mode at the end of the run).
const NEW_DIR_MODE: u32 = 0o777;

/// Debug builds only: makes every temporary a named one, as on a file system without
/// `O_TMPFILE` (so tests exercise the fallback and its signal handling).
const TEST_NO_TMPFILE: &str = "HETCRYPT_TEST_NO_TMPFILE";

/// An output's place: the root the user named and the path under it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// The destination root (a directory the user named, opened as named).
    pub root: PathBuf,
    /// The path under the root: plain names only, none of them a link.
    pub rel: PathBuf,
}

impl Target {
    /// `rel` under `root`.
    pub fn new(root: impl Into<PathBuf>, rel: impl Into<PathBuf>) -> Self {
        Target {
            root: root.into(),
            rel: rel.into(),
        }
    }

    /// A file path as the user named it: its directory is the root.
    pub fn file(path: &Path) -> Option<Self> {
        let name = path.file_name()?;
        let root = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Some(Target::new(root, name))
    }

    /// The whole path, for people.
    pub fn path(&self) -> PathBuf {
        if self.rel.as_os_str().is_empty() {
            self.root.clone()
        } else {
            self.root.join(&self.rel)
        }
    }
}

/// A directory opened beneath a destination root, and its path for messages.
#[derive(Clone, Debug)]
pub struct DirFd {
    /// The open directory.
    pub fd: Arc<OwnedFd>,
    /// Its path, for messages and to sync it once per run.
    pub path: PathBuf,
    /// Whether files made in it may get permissions from a default ACL rather than
    /// from the mode asked less the umask (see [`may_inherit_acl`]).
    pub inherits_acl: bool,
}

/// The extended attribute that holds a directory's default ACL.
const DEFAULT_ACL: &str = "system.posix_acl_default";

/// Bytes asked for when looking for a default ACL: a header and a few entries (a
/// longer one fails with ERANGE, which says it is there just as well).
const ACL_PROBE: usize = 64;

/// Whether `dir` has a default ACL, which then decides a new file's permissions in
/// place of the umask: yes unless the file system says it has none or has no ACLs
/// (any other answer counts as yes, so the mode is then set by `fchmod`).
fn may_inherit_acl(dir: &OwnedFd) -> bool {
    // Only whether it is there matters: a buffer too small for it fails with ERANGE.
    let mut acl = [0u8; ACL_PROBE];
    !matches!(
        rustix::fs::fgetxattr(dir, DEFAULT_ACL, &mut acl[..]),
        Err(Errno::NODATA | Errno::NOTSUP)
    )
}

fn errno_message(path: &Path, e: Errno) -> io::Error {
    let show = super::plan::show(path);
    match e {
        Errno::LOOP => io::Error::other(format!(
            "{show} is a symbolic link: hetcrypt never writes through links"
        )),
        Errno::NOTDIR => io::Error::other(format!("{show} exists and is not a directory")),
        other => io::Error::new(
            io::Error::from(other).kind(),
            format!("cannot write {show}: {}", io::Error::from(other)),
        ),
    }
}

/// Opens (making it and missing parents when `create`) the destination root.
fn open_root(root: &Path, create: bool) -> io::Result<(OwnedFd, bool)> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    match rustix::fs::openat(CWD, root, flags, Mode::empty()) {
        Ok(fd) => Ok((fd, false)),
        Err(Errno::NOENT) if create => {
            std::fs::create_dir_all(root).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot create {}: {e}", super::plan::show(root)),
                )
            })?;
            let fd = rustix::fs::openat(CWD, root, flags, Mode::empty())
                .map_err(|e| errno_message(root, e))?;
            Ok((fd, true))
        }
        Err(e) => Err(errno_message(root, e)),
    }
}

/// Opens the directory `rel` under `root` one component at a time without following
/// links (making missing ones when `create`); returns it and whether its last
/// component was made by this call.
pub fn open_dir(root: &Path, rel: &Path, create: bool) -> io::Result<(DirFd, bool)> {
    let (mut fd, mut created) = open_root(root, create)?;
    let mut path = root.to_path_buf();
    for c in rel.components() {
        let name = match c {
            Component::Normal(n) => n,
            Component::CurDir => continue,
            _ => {
                return Err(io::Error::other(format!(
                    "{}: not a plain relative path",
                    super::plan::show(rel)
                )))
            }
        };
        path.push(name);
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        created = false;
        fd = match rustix::fs::openat(&fd, name, flags, Mode::empty()) {
            Ok(next) => next,
            Err(Errno::NOENT) if create => {
                match rustix::fs::mkdirat(&fd, name, Mode::from_raw_mode(NEW_DIR_MODE)) {
                    Ok(()) => created = true,
                    Err(Errno::EXIST) => {} // made meanwhile; opened below
                    Err(e) => return Err(errno_message(&path, e)),
                }
                rustix::fs::openat(&fd, name, flags, Mode::empty())
                    .map_err(|e| errno_message(&path, e))?
            }
            // With O_DIRECTORY, a link is ENOTDIR rather than ELOOP: tell them apart.
            Err(Errno::NOTDIR)
                if rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Symlink) =>
            {
                return Err(errno_message(&path, Errno::LOOP))
            }
            Err(e) => return Err(errno_message(&path, e)),
        };
    }
    let dir = DirFd {
        inherits_acl: may_inherit_acl(&fd),
        fd: Arc::new(fd),
        path,
    };
    touch(&dir);
    Ok((dir, created))
}

thread_local! {
    /// The directory this thread's last output went into: consecutive outputs of a
    /// tree share one descriptor. Per thread, so writers taking a tree's outputs in
    /// turn do not evict each other's. (It stays the directory opened beneath the root
    /// even if a link replaces its name later: writes remain confined.)
    static LAST_DIR: RefCell<Option<(PathBuf, PathBuf, DirFd)>> = const { RefCell::new(None) };
}

/// [`open_dir`] with creation, reusing the last directory's descriptor.
pub fn open_output_dir(root: &Path, rel: &Path) -> io::Result<DirFd> {
    LAST_DIR.with_borrow_mut(|last| {
        if let Some((r, p, dir)) = last.as_ref() {
            if r == root && p == rel {
                return Ok(dir.clone());
            }
        }
        let (dir, _) = open_dir(root, rel, true)?;
        *last = Some((root.to_path_buf(), rel.to_path_buf(), dir.clone()));
        Ok(dir)
    })
}

/// Named temporaries alive now, by id: what a signal removes.
static LIVE: Mutex<BTreeMap<u64, (Arc<OwnedFd>, OsString)>> = Mutex::new(BTreeMap::new());
/// Ids for [`LIVE`].
static NEXT_ID: AtomicU64 = AtomicU64::new(0);
/// Directories already swept for leftovers in this run, by (device, inode).
static SWEPT: Mutex<BTreeSet<(u64, u64)>> = Mutex::new(BTreeSet::new());
/// File-system syncs made so far (`fsync` and `syncfs` calls), for the summary: the
/// durability path is counted, so tests can see it taken.
static SYNCS: AtomicU64 = AtomicU64::new(0);
/// Every file system this run wrote into, by device: a directory on it, opened
/// before the run's writes there, to sync it through (`syncfs` reports write-back
/// errors that happened after the descriptor was opened).
static TOUCHED: Mutex<BTreeMap<u64, DirFd>> = Mutex::new(BTreeMap::new());

/// File-system syncs made so far in this run.
pub fn syncs() -> u64 {
    SYNCS.load(Ordering::Relaxed)
}

/// The device of the file system holding `dir`.
fn device(dir: &DirFd) -> io::Result<u64> {
    Ok(rustix::fs::fstat(&*dir.fd)?.st_dev)
}

/// Notes a file system the run writes into (through a directory opened on it).
fn touch(dir: &DirFd) {
    if let Ok(dev) = device(dir) {
        let mut touched = TOUCHED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        touched.entry(dev).or_insert_with(|| dir.clone());
    }
}

/// Syncs, once each, the file systems holding `dirs` (`syncfs`: every file's data
/// and metadata there, names included). Returns the failures: the directory through
/// which a file system failed to sync, and why.
pub fn sync_file_systems<'a>(
    dirs: impl IntoIterator<Item = &'a DirFd>,
) -> Vec<(&'a DirFd, io::Error)> {
    let mut seen = BTreeSet::new();
    let mut failed = Vec::new();
    let mut last: Option<&Arc<OwnedFd>> = None;
    for dir in dirs {
        // Outputs of one directory share its descriptor: one `fstat` for them all.
        if last.is_some_and(|l| Arc::ptr_eq(l, &dir.fd)) {
            continue;
        }
        last = Some(&dir.fd);
        match device(dir) {
            Ok(dev) if !seen.insert(dev) => continue,
            Ok(_) => {}
            Err(e) => {
                failed.push((dir, e));
                continue;
            }
        }
        SYNCS.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = rustix::fs::syncfs(&*dir.fd) {
            failed.push((dir, e.into()));
        }
    }
    failed
}

/// Syncs every file system the run wrote into, once each: after it, every name the
/// run gave and every directory it made or changed is durable. Returns the failures
/// (path of a directory on the file system, and why).
pub fn sync_touched() -> Vec<(PathBuf, io::Error)> {
    let touched: Vec<DirFd> = TOUCHED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .values()
        .cloned()
        .collect();
    sync_file_systems(&touched)
        .into_iter()
        .map(|(dir, e)| (dir.path.clone(), e))
        .collect()
}

/// The registry, even if a thread panicked holding it (it stays consistent: each
/// operation is one insert or remove).
fn live() -> MutexGuard<'static, BTreeMap<u64, (Arc<OwnedFd>, OsString)>> {
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Starts a thread that, on SIGINT, SIGTERM or SIGHUP, removes every named temporary
/// and then ends the process as the signal would have. Anonymous temporaries need no
/// such care. Call once, before any output is opened.
pub fn remove_temporaries_on_signals() -> io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::Builder::new()
        .name("hetcrypt-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                // Held until the process ends: no temporary can be made after these
                // are removed.
                let live = live();
                for (dir, name) in live.values() {
                    let _ = rustix::fs::unlinkat(&**dir, name.as_os_str(), AtFlags::empty());
                }
                let _ = signal_hook::low_level::emulate_default_handler(signal);
                // Not reached for these signals, whose default ends the process.
                std::process::exit(128 + signal);
            }
        })?;
    Ok(())
}

thread_local! {
    /// The directory this thread swept last: consecutive outputs share their
    /// directory's descriptor (see `open_output_dir`), so most need no `fstat` to know
    /// theirs was swept.
    static LAST_SWEPT: RefCell<Option<Arc<OwnedFd>>> = const { RefCell::new(None) };
}

/// Removes the named temporaries of earlier runs whose process is gone, once per
/// directory per run; says so on stderr.
fn sweep_leftovers(dir: &DirFd) {
    let seen = LAST_SWEPT.with_borrow_mut(|last| {
        let seen = last.as_ref().is_some_and(|l| Arc::ptr_eq(l, &dir.fd));
        *last = Some(dir.fd.clone());
        seen
    });
    if seen {
        return;
    }
    let Ok(st) = rustix::fs::fstat(&*dir.fd) else {
        return;
    };
    {
        let mut swept = SWEPT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !swept.insert((st.st_dev, st.st_ino)) {
            return;
        }
    }
    let Ok(entries) = rustix::fs::Dir::read_from(&*dir.fd) else {
        return;
    };
    let me = std::process::id();
    let mut removed = 0usize;
    for entry in entries.flatten() {
        let name = entry.file_name().to_bytes();
        let Some(rest) = name.strip_prefix(TEMP_PREFIX.as_bytes()) else {
            continue;
        };
        let Some(pid) = rest
            .split(|&b| b == b'-')
            .next()
            .and_then(|p| std::str::from_utf8(p).ok())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let gone = pid != me
            && i32::try_from(pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
                .is_some_and(|p| rustix::process::test_kill_process(p) == Err(Errno::SRCH));
        let regular = rustix::fs::statat(&*dir.fd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::RegularFile);
        if gone
            && regular
            && rustix::fs::unlinkat(&*dir.fd, entry.file_name(), AtFlags::empty()).is_ok()
        {
            removed += 1;
        }
    }
    if removed > 0 {
        eprintln!(
            "hetcrypt: removed {removed} temporary file{} left in {} by an interrupted run",
            if removed == 1 { "" } else { "s" },
            super::summary::escape(&super::plan::show(&dir.path))
        );
    }
}

/// Whether anonymous temporaries can be used: an `O_TMPFILE` file is named through
/// `/proc/self/fd` (linking it by descriptor alone, `AT_EMPTY_PATH`, needs a
/// capability), so without /proc every temporary is a named one. Tests can ask for
/// named ones too (debug builds only).
fn anonymous_temporaries() -> bool {
    static PROC: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let forced_off = cfg!(debug_assertions) && std::env::var_os(TEST_NO_TMPFILE).is_some();
    !forced_off && *PROC.get_or_init(|| Path::new("/proc/self/fd").is_dir())
}

/// The process's umask, read once from `/proc/self/status` (Linux 4.7 and later);
/// `None` where it cannot be read. Read, not set: `umask(2)` can only be asked by
/// changing it, which other threads making files at that moment would see.
fn umask() -> Option<u32> {
    static UMASK: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        parse_umask(&status)
    })
}

/// The `Umask:` field of a `/proc/<pid>/status` text (octal).
fn parse_umask(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
    u32::from_str_radix(line.trim(), 8).ok()
}

/// The mode to create an anonymous temporary with, if it can be its final one:
/// `mode` is what the output gets, and creating applies the umask, so only a mode the
/// umask leaves whole comes out as asked (else `fchmod` sets it once complete).
fn final_mode_at_creation(mode: Option<u32>, umask: Option<u32>) -> Option<u32> {
    let (mode, umask) = (mode?, umask?);
    (mode & umask == 0).then_some(mode)
}

/// A temporary output file in a destination directory.
#[derive(Debug)]
pub struct Temp {
    /// Shared with the writer thread, which writes queued buffers into it.
    file: Arc<File>,
    dir: DirFd,
    /// `Some((id, name))` for a named temporary, `None` for an anonymous one.
    named: Option<(u64, OsString)>,
    /// The permission bits it was made with when they are already its final ones.
    created_mode: Option<u32>,
}

/// Makes a fresh named temporary in `dir` and registers it for removal on a signal.
fn named_temp(dir: &DirFd) -> io::Result<(File, u64, OsString)> {
    let mut live = live();
    loop {
        let name = temp_name()?;
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(
            &*dir.fd,
            name.as_os_str(),
            flags,
            Mode::from_raw_mode(PRIVATE_MODE),
        ) {
            Ok(fd) => {
                let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
                live.insert(id, (dir.fd.clone(), name.clone()));
                return Ok((File::from(fd), id, name));
            }
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(errno_message(&dir.path, e)),
        }
    }
}

impl Temp {
    /// A new temporary in `dir`, for an output that gets the permission bits `mode`:
    /// anonymous where the file system allows, and then made with `mode` if the umask
    /// leaves it whole and `dir` has no default ACL (see [`final_mode_at_creation`]).
    pub fn new(dir: DirFd, mode: Option<u32>) -> io::Result<Self> {
        sweep_leftovers(&dir);
        if anonymous_temporaries() {
            let flags = OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC;
            let umask = if dir.inherits_acl { None } else { umask() };
            let created_mode = final_mode_at_creation(mode, umask);
            let made_with = Mode::from_raw_mode(created_mode.unwrap_or(PRIVATE_MODE));
            match rustix::fs::openat(&*dir.fd, ".", flags, made_with) {
                Ok(fd) => {
                    return Ok(Temp {
                        file: Arc::new(File::from(fd)),
                        dir,
                        named: None,
                        created_mode,
                    })
                }
                // No O_TMPFILE on this file system or kernel: a named one.
                Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL | Errno::NOSYS) => {}
                Err(e) => return Err(errno_message(&dir.path, e)),
            }
        }
        let (file, id, name) = named_temp(&dir)?;
        Ok(Temp {
            file: Arc::new(file),
            dir,
            named: Some((id, name)),
            created_mode: None,
        })
    }

    /// The file, to write into (at explicit offsets: holes are offsets not written).
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// The directory it will be named in.
    pub fn dir(&self) -> &DirFd {
        &self.dir
    }

    /// Gets the content ready to be named: permission bits `mode`, and a length of
    /// `end` bytes, of which the first `written_end` were written (a hole at the end,
    /// zeros skipped, is part of the file too).
    pub fn prepare(&self, mode: Option<u32>, end: u64, written_end: u64) -> io::Result<()> {
        if let Some(mode) = mode.filter(|&m| self.created_mode != Some(m)) {
            rustix::fs::fchmod(&*self.file, Mode::from_raw_mode(mode))?;
        }
        if written_end < end {
            self.file.set_len(end)?;
        }
        Ok(())
    }

    /// Makes the content durable on its own (one fsync): for outputs named alone,
    /// outside a group whose file system is synced at once (see [`sync_file_systems`]).
    pub fn sync(&self) -> io::Result<()> {
        SYNCS.fetch_add(1, Ordering::Relaxed);
        self.file.sync_all()
    }

    /// Gives the temporary's content, prepared and durable, the name `name` in its
    /// directory. Without `force` an existing name is never replaced; with it, only a
    /// regular file is (never a link or a directory). Returns the directory, whose
    /// entry is durable once its file system is synced (at the end of the run).
    pub fn name(mut self, name: &OsStr, force: bool) -> io::Result<DirFd> {
        let dest = self.dir.path.join(name);
        // Without `force` the name is given by `linkat`, which never replaces one
        // (EEXIST): only `force` needs to look first (a `statat` per file less).
        let found = if force {
            rustix::fs::statat(&*self.dir.fd, name, AtFlags::SYMLINK_NOFOLLOW)
        } else {
            Err(Errno::NOENT)
        };
        match found {
            Ok(st) => match FileType::from_raw_mode(st.st_mode) {
                FileType::RegularFile => {}
                FileType::Symlink => {
                    return Err(io::Error::other(format!(
                        "{} is a symbolic link: --force replaces only regular files",
                        super::plan::show(&dest)
                    )))
                }
                _ => {
                    return Err(io::Error::other(format!(
                        "{} is not a regular file: --force replaces only regular files",
                        super::plan::show(&dest)
                    )))
                }
            },
            Err(Errno::NOENT) => {}
            Err(e) => return Err(errno_message(&dest, e)),
        }
        let dir = self.dir.fd.clone();
        if self.named.is_none() {
            if !force {
                return self.link_anonymous(name, &dest).map(|()| self.dir.clone());
            }
            // An anonymous file cannot be renamed: name it, then rename the name.
            let (id, tmp) = register_name(&self.dir)?;
            self.named = Some((id, tmp.clone()));
            self.link_anonymous(&tmp, &dest)?;
        }
        let (_, tmp) = self.named.as_ref().expect("named above or at creation");
        if force {
            rustix::fs::renameat(&*dir, tmp.as_os_str(), &*dir, name)
                .map_err(|e| errno_message(&dest, e))?;
        } else {
            match rustix::fs::linkat(&*dir, tmp.as_os_str(), &*dir, name, AtFlags::empty()) {
                Ok(()) => {}
                Err(Errno::EXIST) => return Err(exists(&dest)),
                Err(e) => return Err(errno_message(&dest, e)),
            }
            let _ = rustix::fs::unlinkat(&*dir, tmp.as_os_str(), AtFlags::empty());
        }
        if let Some((id, _)) = self.named.take() {
            live().remove(&id);
        }
        Ok(self.dir.clone())
    }

    /// Links the anonymous file in as `name` (never replacing one): by its descriptor
    /// (`AT_EMPTY_PATH`, which Linux allows from 6.10 for a file the caller opened, and
    /// with a capability before), else through /proc, whose path lookup costs more.
    fn link_anonymous(&self, name: &OsStr, dest: &Path) -> io::Result<()> {
        match rustix::fs::linkat(&*self.file, "", &*self.dir.fd, name, AtFlags::EMPTY_PATH) {
            Ok(()) => return Ok(()),
            Err(Errno::EXIST) => return Err(exists(dest)),
            // Not allowed here (an older kernel, no capability): through /proc.
            Err(Errno::NOENT | Errno::PERM | Errno::INVAL) => {}
            Err(e) => return Err(errno_message(dest, e)),
        }
        let proc = format!("/proc/self/fd/{}", self.file.as_raw_fd());
        let linked = rustix::fs::linkat(
            CWD,
            proc.as_str(),
            &*self.dir.fd,
            name,
            AtFlags::SYMLINK_FOLLOW,
        );
        match linked {
            Ok(()) => Ok(()),
            Err(Errno::EXIST) => Err(exists(dest)),
            Err(e) => Err(errno_message(dest, e)),
        }
    }
}

/// A fresh temporary name: fixed length whatever the destination's name.
fn temp_name() -> io::Result<OsString> {
    let mut random = [0u8; 8];
    openssl::rand::rand_bytes(&mut random).map_err(io::Error::other)?;
    Ok(OsString::from(format!(
        "{TEMP_PREFIX}{}-{:016x}",
        std::process::id(),
        u64::from_le_bytes(random)
    )))
}

/// A registered name for a temporary that does not exist yet (the anonymous file is
/// linked to it next): registered first, so a signal in between removes the link.
fn register_name(dir: &DirFd) -> io::Result<(u64, OsString)> {
    let name = temp_name()?;
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    live().insert(id, (dir.fd.clone(), name.clone()));
    Ok((id, name))
}

fn exists(dest: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!(
            "{} already exists (use --force to overwrite)",
            super::plan::show(dest)
        ),
    )
}

impl Drop for Temp {
    fn drop(&mut self) {
        if let Some((id, name)) = self.named.take() {
            let _ = rustix::fs::unlinkat(&*self.dir.fd, name.as_os_str(), AtFlags::empty());
            live().remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_umask_is_read_from_the_status_text() {
        let status = "Name:\thetcrypt\nUmask:\t0027\nState:\tR (running)\n";
        assert_eq!(parse_umask(status), Some(0o027));
        assert_eq!(parse_umask("Name:\thetcrypt\n"), None);
        assert_eq!(parse_umask("Umask:\tnot octal\n"), None);
    }

    #[test]
    fn a_temporary_is_made_with_its_mode_only_when_the_umask_leaves_it_whole() {
        assert_eq!(
            final_mode_at_creation(Some(0o644), Some(0o022)),
            Some(0o644)
        );
        assert_eq!(final_mode_at_creation(Some(0o755), Some(0)), Some(0o755));
        // The umask would take bits away: made private, set by fchmod when ready.
        assert_eq!(final_mode_at_creation(Some(0o664), Some(0o022)), None);
        assert_eq!(final_mode_at_creation(Some(0o644), Some(0o077)), None);
        // No mode to give (standard input), or the umask unknown.
        assert_eq!(final_mode_at_creation(None, Some(0o022)), None);
        assert_eq!(final_mode_at_creation(Some(0o644), None), None);
    }

    #[test]
    fn this_process_umask_is_known() {
        // Linux has reported it in /proc/self/status since 4.7.
        assert!(umask().is_some());
    }
}
