//! Which inputs go to which outputs: single files, stdin/stdout, directory trees.
//!
//! - One INPUT that is a file: OUT is the output file (`-`: stdout; an existing
//!   directory: the file goes inside it); without `-o`, beside the input (`.hc` added
//!   when encrypting, removed when decrypting).
//! - One INPUT `-` (stdin): OUT is the output file, stdout when omitted or `-`.
//! - One INPUT that is a directory: OUT is the root of the output tree, with the same
//!   relative paths.
//! - Several INPUTs: OUT is a directory; each file lands in it under its own name, each
//!   directory as a subdirectory of the same name.
//!
//! Symbolic links and special files inside trees are skipped (listed, not followed);
//! when decrypting a tree, files without the `.hc` suffix are skipped.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use anyhow::bail;

/// The suffix of encrypted files.
pub const SUFFIX: &str = ".hc";

/// Encrypting or decrypting: decides how output names are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// Adds the suffix.
    Encrypt,
    /// Removes the suffix.
    Decrypt,
}

/// Where a message comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// Standard input.
    Stdin,
    /// A regular file.
    File(PathBuf),
}

/// Where a message goes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dest {
    /// Standard output.
    Stdout,
    /// A file (written beside, then renamed into place).
    File(PathBuf),
}

/// One message to process.
#[derive(Debug)]
pub struct Work {
    /// Its input.
    pub source: Source,
    /// Its output.
    pub dest: Dest,
    /// Input size when known (for the progress bar).
    pub size: Option<u64>,
    /// Permission bits to give the output (the input's).
    pub mode: Option<u32>,
}

/// An input left alone, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Note {
    /// The path as the user would recognise it.
    pub path: String,
    /// Why, in words.
    pub reason: String,
}

/// Everything a run will do, and what it already knows it cannot.
#[derive(Debug, Default)]
pub struct Plan {
    /// Messages to process, in order.
    pub work: Vec<Work>,
    /// Inputs skipped on purpose (links, special files, unsuffixed files).
    pub skipped: Vec<Note>,
    /// Inputs that failed before any crypto (missing, unreadable directory, output
    /// exists).
    pub failed: Vec<Note>,
}

impl Plan {
    /// Whether some message goes to stdout.
    pub fn writes_stdout(&self) -> bool {
        self.work.iter().any(|w| w.dest == Dest::Stdout)
    }
}

/// Shows a path for people (lossy only for names that are not UTF-8).
pub fn show(p: &Path) -> String {
    p.display().to_string()
}

/// The output name for an input name, or `None` when decrypting a name without the
/// suffix.
fn out_name(name: &OsStr, way: Way) -> Option<OsString> {
    match way {
        Way::Encrypt => {
            let mut n = name.to_os_string();
            n.push(SUFFIX);
            Some(n)
        }
        Way::Decrypt => {
            let bytes = name.as_encoded_bytes();
            let stem = bytes.strip_suffix(SUFFIX.as_bytes())?;
            if stem.is_empty() {
                return None;
            }
            Some(split_off_suffix(name, stem.len()))
        }
    }
}

/// The first `keep` bytes of `name` (cutting off an ASCII suffix; Unix names are
/// bytes, so any cut is a valid name).
fn split_off_suffix(name: &OsStr, keep: usize) -> OsString {
    use std::os::unix::ffi::OsStrExt;
    OsStr::from_bytes(&name.as_bytes()[..keep]).to_os_string()
}

struct Planner {
    way: Way,
    force: bool,
    plan: Plan,
    dests: HashSet<PathBuf>,
}

impl Planner {
    fn fail(&mut self, path: &Path, reason: impl Into<String>) {
        self.plan.failed.push(Note {
            path: show(path),
            reason: reason.into(),
        });
    }

    fn skip(&mut self, path: &Path, reason: impl Into<String>) {
        self.plan.skipped.push(Note {
            path: show(path),
            reason: reason.into(),
        });
    }

    /// Adds a regular file going to `dest`, unless the destination is taken.
    fn add_file(&mut self, path: &Path, meta: &std::fs::Metadata, dest: Dest) {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        if let Dest::File(d) = &dest {
            if !self.dests.insert(d.clone()) {
                return self.fail(path, format!("another input also goes to {}", show(d)));
            }
            if let Ok(dm) = d.symlink_metadata() {
                if dm.dev() == meta.dev() && dm.ino() == meta.ino() {
                    return self.fail(path, "the output would replace the input itself");
                }
                if !self.force {
                    return self.fail(
                        path,
                        format!("{} already exists (use --force to overwrite)", show(d)),
                    );
                }
                if dm.is_dir() {
                    return self.fail(path, format!("{} is a directory", show(d)));
                }
            }
        }
        self.plan.work.push(Work {
            source: Source::File(path.to_path_buf()),
            dest,
            size: Some(meta.len()),
            mode: Some(meta.permissions().mode() & 0o7777),
        });
    }

    /// Adds every regular file under `dir`, mirrored under `root`.
    fn add_tree(&mut self, dir: &Path, root: &Path) {
        let root_abs = std::fs::canonicalize(root).ok();
        let walk = walkdir::WalkDir::new(dir)
            .follow_links(false)
            .sort_by_file_name()
            .into_iter()
            // Never descend into the output tree when it lies inside the input.
            .filter_entry(|e| {
                root_abs.is_none()
                    || !e.file_type().is_dir()
                    || std::fs::canonicalize(e.path()).ok() != root_abs
            });
        for entry in walk {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    let path = e.path().unwrap_or(dir).to_path_buf();
                    let reason = match e.io_error() {
                        Some(io) => io.to_string(),
                        None => e.to_string(),
                    };
                    self.fail(&path, reason);
                    continue;
                }
            };
            let path = entry.path();
            let ft = entry.file_type();
            if ft.is_dir() {
                continue;
            }
            if ft.is_symlink() {
                self.skip(path, "symbolic link, not followed");
                continue;
            }
            if !ft.is_file() {
                self.skip(path, "not a regular file");
                continue;
            }
            let rel = path
                .strip_prefix(dir)
                .expect("walkdir yields paths under its root");
            let Some(name) = out_name(entry.file_name(), self.way) else {
                self.skip(path, format!("no {SUFFIX} suffix"));
                continue;
            };
            let dest = match rel.parent() {
                Some(p) => root.join(p).join(name),
                None => root.join(name),
            };
            match entry.metadata() {
                Ok(meta) => self.add_file(path, &meta, Dest::File(dest)),
                Err(e) => self.fail(path, e.to_string()),
            }
        }
    }
}

/// Works out what goes where.
pub fn plan(
    inputs: &[PathBuf],
    output: Option<&Path>,
    way: Way,
    force: bool,
) -> anyhow::Result<Plan> {
    let mut p = Planner {
        way,
        force,
        plan: Plan::default(),
        dests: HashSet::new(),
    };
    let is_dash = |x: &Path| x.as_os_str() == "-";
    let out_is_dir = output.is_some_and(|o| o.is_dir());

    if let [input] = inputs {
        if is_dash(input) {
            let dest = match output {
                None => Dest::Stdout,
                Some(o) if is_dash(o) => Dest::Stdout,
                Some(o) if out_is_dir => bail!(
                    "{} is a directory: name the output file for standard input",
                    show(o)
                ),
                Some(o) => {
                    if o.exists() && !force {
                        bail!("{} already exists (use --force to overwrite)", show(o));
                    }
                    Dest::File(o.to_path_buf())
                }
            };
            p.plan.work.push(Work {
                source: Source::Stdin,
                dest,
                size: None,
                mode: None,
            });
            return Ok(p.plan);
        }
        let meta = match input.metadata() {
            Ok(m) => m,
            Err(e) => {
                p.fail(input, e.to_string());
                return Ok(p.plan);
            }
        };
        if meta.is_dir() {
            let Some(root) = output else {
                bail!(
                    "name an output directory with -o for the tree {}",
                    show(input)
                );
            };
            if is_dash(root) {
                bail!("a directory tree cannot go to standard output");
            }
            if root.exists() && !root.is_dir() {
                bail!("{} exists and is not a directory", show(root));
            }
            p.add_tree(input, root);
            return Ok(p.plan);
        }
        if !meta.is_file() {
            p.fail(input, "not a regular file");
            return Ok(p.plan);
        }
        let name = input.file_name().unwrap_or(input.as_os_str());
        let dest = match output {
            Some(o) if is_dash(o) => Dest::Stdout,
            Some(o) if out_is_dir => match out_name(name, way) {
                Some(n) => Dest::File(o.join(n)),
                None => bail!(
                    "{} has no {SUFFIX} suffix: name the output file with -o",
                    show(input)
                ),
            },
            Some(o) => Dest::File(o.to_path_buf()),
            None => match out_name(name, way) {
                Some(n) => Dest::File(input.with_file_name(n)),
                None => bail!(
                    "{} has no {SUFFIX} suffix: name the output with -o",
                    show(input)
                ),
            },
        };
        if dest == Dest::Stdout {
            p.plan.work.push(Work {
                source: Source::File(input.clone()),
                dest,
                size: Some(meta.len()),
                mode: None,
            });
        } else {
            p.add_file(input, &meta, dest);
        }
        return Ok(p.plan);
    }

    // Several inputs: OUT is a directory.
    let Some(root) = output else {
        bail!("name an output directory with -o for several inputs");
    };
    if is_dash(root) {
        bail!("several inputs cannot go to standard output");
    }
    if root.exists() && !root.is_dir() {
        bail!("{} exists and is not a directory", show(root));
    }
    for input in inputs {
        if is_dash(input) {
            bail!("standard input (-) can only be the only input");
        }
        let meta = match input.metadata() {
            Ok(m) => m,
            Err(e) => {
                p.fail(input, e.to_string());
                continue;
            }
        };
        let name = input.file_name().unwrap_or(input.as_os_str());
        if meta.is_dir() {
            p.add_tree(input, &root.join(name));
        } else if meta.is_file() {
            match out_name(name, way) {
                Some(n) => p.add_file(input, &meta, Dest::File(root.join(n))),
                None => p.skip(input, format!("no {SUFFIX} suffix")),
            }
        } else {
            p.skip(input, "not a regular file");
        }
    }
    Ok(p.plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_names() {
        let enc = |s: &str| out_name(OsStr::new(s), Way::Encrypt);
        let dec = |s: &str| out_name(OsStr::new(s), Way::Decrypt);
        assert_eq!(enc("a.txt"), Some("a.txt.hc".into()));
        assert_eq!(dec("a.txt.hc"), Some("a.txt".into()));
        assert_eq!(dec("-dash é.hc"), Some("-dash é".into()));
        assert_eq!(dec("a.txt"), None);
        assert_eq!(dec(".hc"), None);
    }
}
