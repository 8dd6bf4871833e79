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
//! when decrypting a tree, files without the `.hc` suffix are skipped (and the tree's
//! manifest is read apart). Every directory of a tree, empty ones included, is
//! recreated under OUT with its permission bits. Each file of a tree carries its path
//! in the tree, which its key binds and its tree's manifest lists.

use std::collections::{HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use anyhow::bail;

use super::dest::Target;
use super::walk;

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
    /// A file, listed as regular (its type is checked again on the opened descriptor).
    File {
        /// Its path.
        path: PathBuf,
        /// Whether a link in its last component is followed: only for a path the user
        /// named, never for an entry of a tree.
        follow: bool,
        /// For an entry of a tree: the tree's root, from which it is opened directory
        /// by directory without following links.
        beneath: Option<PathBuf>,
    },
}

/// Where a message goes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dest {
    /// Standard output.
    Stdout,
    /// A file, confined beneath its root (written to a temporary, named when complete).
    File(Target),
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
    /// For a file of a tree: the tree's index in [`Plan::trees`] and the plaintext
    /// file's path relative to the tree (what the manifest lists and the key binds).
    pub tree: Option<(usize, Vec<u8>)>,
}

/// A directory tree given as input, and where its mirror goes.
#[derive(Debug, Clone)]
pub struct TreeRoot {
    /// The input directory.
    pub dir: PathBuf,
    /// The output tree's root.
    pub out: Target,
    /// Whether the whole tree is processed (false: a member decrypted on its own,
    /// whose tree is only consulted): only then are files the manifest lists but the
    /// walk did not meet reported missing.
    pub whole: bool,
    /// Decrypting: the directory whose manifest vouches for the files (the tree's
    /// root, or the nearest directory above it that has a manifest when a folder of
    /// an encrypted tree is decrypted alone).
    pub manifest_at: PathBuf,
    /// The walked directory's path in that manifest's tree (empty at its root).
    pub prefix: Vec<u8>,
}

impl TreeRoot {
    /// A tree walked from `dir` into `out`; decrypting, its manifest is looked for in
    /// `dir`, then in the directories above it.
    fn new(dir: &Path, out: Target, way: Way) -> Self {
        use std::os::unix::ffi::OsStrExt;
        let here = TreeRoot {
            dir: dir.to_path_buf(),
            out,
            whole: true,
            manifest_at: dir.to_path_buf(),
            prefix: Vec::new(),
        };
        if way == Way::Encrypt || has_manifest(dir) {
            return here;
        }
        let abs = resolved(dir);
        let mut above = abs.parent();
        while let Some(a) = above {
            if has_manifest(a) {
                let rel = abs.strip_prefix(a).unwrap_or(Path::new(""));
                return TreeRoot {
                    manifest_at: a.to_path_buf(),
                    prefix: rel.as_os_str().as_bytes().to_vec(),
                    ..here
                };
            }
            above = a.parent();
        }
        here
    }

    /// The path in the manifest of a file at `rel` under the walked directory.
    pub fn manifest_path(&self, rel: &[u8]) -> Vec<u8> {
        if self.prefix.is_empty() {
            return rel.to_vec();
        }
        let mut p = self.prefix.clone();
        p.push(b'/');
        p.extend_from_slice(rel);
        p
    }

    /// Whether the manifest's `path` lies under the walked directory.
    pub fn covers(&self, path: &[u8]) -> bool {
        self.prefix.is_empty()
            || path
                .strip_prefix(self.prefix.as_slice())
                .is_some_and(|rest| rest.first() == Some(&b'/'))
    }
}

/// Whether `dir` holds a tree manifest.
fn has_manifest(dir: &Path) -> bool {
    dir.join(hetcrypt_format::manifest::MANIFEST_NAME)
        .symlink_metadata()
        .is_ok_and(|m| m.is_file())
}

/// A directory of an input tree and its mirror in the output tree.
#[derive(Debug)]
pub struct Dir {
    /// The input directory.
    pub source: PathBuf,
    /// The directory to create.
    pub dest: Target,
    /// Permission bits to give it (the input's), once its files are written.
    pub mode: u32,
}

/// An input left alone, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Note {
    /// The path as the user would recognise it.
    pub path: String,
    /// Why, in words.
    pub reason: String,
}

/// One step of a plan.
#[derive(Debug)]
pub enum Entry {
    /// A message to process.
    Work(Work),
    /// A directory of a tree to recreate (parents come before their children).
    Dir(Dir),
    /// An input skipped on purpose (link, special file, unsuffixed file).
    Skipped(Note),
    /// An input that failed before any crypto (missing, unreadable directory, output
    /// exists).
    Failed(Note),
}

/// What an input argument stands for.
enum Root {
    /// Already decided (a single file, stdin, or a failure).
    Ready(Entry),
    /// A directory to walk: its index in [`Plan::trees`].
    Tree(usize),
}

/// What the plan knows of a file before opening it: which file it is (to refuse an
/// output onto its own input) and its size (for the progress bar).
#[derive(Clone, Copy, Debug)]
struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
}

impl From<&std::fs::Metadata> for FileId {
    fn from(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        FileId {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
        }
    }
}

/// Everything a run will do, produced lazily: trees are walked as the pipeline asks for
/// the next file, so memory does not grow with the number of files.
pub struct Plan {
    way: Way,
    force: bool,
    roots: VecDeque<Root>,
    walk: Option<(walk::Walk, usize)>,
    /// Decrypting: the encrypted trees met inside the current walk (a folder with a
    /// manifest of its own), innermost last: their path in the walk and their index.
    nested: Vec<(PathBuf, usize)>,
    trees: Vec<TreeRoot>,
    stdout: bool,
    /// Output directories this run made (see [`Plan::made`]): nothing of an earlier
    /// run is in them, so their files' destinations need no check.
    made: HashSet<Target>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("way", &self.way)
            .finish_non_exhaustive()
    }
}

impl Plan {
    /// The run made the directory `dir` (it did not exist): the destinations of the
    /// files going into it are not checked one by one for an existing file (a path
    /// lookup each, 5% of a 4,000-file run). One that appears there meanwhile is still
    /// never replaced without `--force` (naming the output fails), and cannot be the
    /// input itself, which existed before the directory.
    pub fn made(&mut self, dir: &Target) {
        self.made.insert(dir.clone());
    }

    /// Whether some message goes to stdout.
    pub fn writes_stdout(&self) -> bool {
        self.stdout
    }

    /// Whether the message comes from standard input.
    pub fn reads_stdin(&self) -> bool {
        matches!(
            self.roots.front(),
            Some(Root::Ready(Entry::Work(Work {
                source: Source::Stdin,
                ..
            })))
        )
    }

    /// The total input size, walking the trees once more (for the progress bar);
    /// `None` when standard input is read.
    pub fn total_size(&self) -> Option<u64> {
        let mut total = 0u64;
        for root in &self.roots {
            match root {
                Root::Ready(Entry::Work(w)) => total += w.size?,
                Root::Ready(_) => {}
                Root::Tree(index) => {
                    let dir = &self.trees[*index].dir;
                    for item in walk::Walk::new(dir) {
                        if let walk::Item::Entry {
                            kind: walk::Kind::File,
                            meta,
                            rel,
                        } = item
                        {
                            total += match meta {
                                Some(m) => m.size,
                                None => dir.join(rel).symlink_metadata().map_or(0, |m| m.len()),
                            };
                        }
                    }
                }
            }
        }
        Some(total)
    }

    fn note(path: &Path, reason: impl Into<String>) -> Note {
        Note {
            path: show(path),
            reason: reason.into(),
        }
    }

    /// The entry for a regular file going to `dest`, unless the destination is taken.
    /// `meta` is the file's identity when known (a walk that read the type from the
    /// listing did not `lstat` it: it is looked up here if the destination exists).
    fn file(&self, path: &Path, meta: Option<FileId>, dest: Dest, follow: bool) -> Entry {
        use std::os::unix::fs::MetadataExt;
        let in_made_dir = |t: &Target| {
            let parent = t.rel.parent().unwrap_or(Path::new(""));
            !self.made.is_empty() && self.made.contains(&Target::new(&t.root, parent))
        };
        let check = match &dest {
            Dest::File(t) if !in_made_dir(t) => Some(t),
            _ => None,
        };
        if let Some(t) = check {
            let d = &t.path();
            if let Ok(dm) = d.symlink_metadata() {
                let source =
                    meta.or_else(|| path.symlink_metadata().ok().map(|m| FileId::from(&m)));
                if source.is_some_and(|m| dm.dev() == m.dev && dm.ino() == m.ino) {
                    return Entry::Failed(Self::note(
                        path,
                        "the output would replace the input itself",
                    ));
                }
                if !self.force {
                    return Entry::Failed(Self::note(
                        path,
                        format!("{} already exists (use --force to overwrite)", show(d)),
                    ));
                }
                if dm.is_dir() {
                    return Entry::Failed(Self::note(path, format!("{} is a directory", show(d))));
                }
            }
        }
        Entry::Work(Work {
            source: Source::File {
                path: path.to_path_buf(),
                follow,
                beneath: None,
            },
            dest,
            size: meta.map(|m| m.len),
            tree: None,
        })
    }

    /// The input trees, in order.
    pub fn trees(&self) -> &[TreeRoot] {
        &self.trees
    }

    /// For a file decrypted on its own that is a tree member (its wrapper has the tree
    /// flag): the tree it belongs to, the nearest directory above it that holds a
    /// manifest, and the file's plaintext path there. The manifest then vouches for it
    /// as in a whole-tree run.
    fn tree_of_member(&mut self, input: &Path) -> Option<(usize, Vec<u8>)> {
        use std::io::Read as _;
        use std::os::unix::ffi::OsStrExt;
        if self.way != Way::Decrypt {
            return None;
        }
        let mut wrapper = [0u8; hetcrypt_format::header::WRAPPER_LEN];
        std::fs::File::open(input)
            .and_then(|mut f| f.read_exact(&mut wrapper))
            .ok()?;
        if !hetcrypt_format::Wrapper::parse(&wrapper).is_ok_and(|w| w.tree) {
            return None;
        }
        let abs = resolved(input);
        let name = out_name(abs.file_name()?, Way::Decrypt)?;
        let mut dir = abs.parent()?;
        loop {
            if has_manifest(dir) {
                let rel = abs.strip_prefix(dir).ok()?.with_file_name(name);
                let index = match self.trees.iter().position(|t| !t.whole && t.dir == dir) {
                    Some(i) => i,
                    None => {
                        self.trees.push(TreeRoot {
                            dir: dir.to_path_buf(),
                            out: Target::new(".", ""),
                            whole: false,
                            manifest_at: dir.to_path_buf(),
                            prefix: Vec::new(),
                        });
                        self.trees.len() - 1
                    }
                };
                return Some((index, rel.as_os_str().as_bytes().to_vec()));
            }
            dir = dir.parent()?;
        }
    }

    /// Decrypting, keeps [`Plan::nested`] in step with the walk at `rel`: leaves the
    /// trees the walk has left, and enters the folder `rel` as a tree of its own when
    /// it holds a manifest (as each input of `encrypt A B -o OUT` does in OUT).
    fn track_nested(&mut self, index: usize, rel: &Path, is_dir: bool) {
        if self.way != Way::Decrypt {
            return;
        }
        while self
            .nested
            .last()
            .is_some_and(|(n, _)| !rel.starts_with(n) || rel == n)
        {
            self.nested.pop();
        }
        if !is_dir || rel.as_os_str().is_empty() {
            return;
        }
        let (dir, out) = (self.trees[index].dir.join(rel), &self.trees[index].out);
        if has_manifest(&dir) {
            let out = Target::new(&out.root, out.rel.join(rel));
            self.trees.push(TreeRoot {
                manifest_at: dir.clone(),
                dir,
                out,
                whole: true,
                prefix: Vec::new(),
            });
            self.nested.push((rel.to_path_buf(), self.trees.len() - 1));
        }
    }

    /// The entry for one item of the walk of tree `index`; `None` for a tree's
    /// manifest, which decrypting reads first and apart.
    fn walked(&mut self, item: walk::Item, index: usize) -> Option<Entry> {
        use std::os::unix::ffi::OsStrExt;
        match &item {
            walk::Item::Dir { rel, .. } => self.track_nested(index, rel, true),
            walk::Item::Entry { rel, .. } => self.track_nested(index, rel, false),
            walk::Item::Error { .. } => {}
        }
        let TreeRoot { dir, out, .. } = &self.trees[index];
        let (rel, kind, meta) = match item {
            walk::Item::Error { rel, error } => {
                return Some(Entry::Failed(Self::note(&dir.join(rel), error.to_string())))
            }
            walk::Item::Dir { rel, mode } => {
                return Some(Entry::Dir(Dir {
                    source: dir.join(&rel),
                    dest: Target::new(&out.root, out.rel.join(&rel)),
                    mode,
                }))
            }
            walk::Item::Entry { rel, kind, meta } => (rel, kind, meta),
        };
        let path = dir.join(&rel);
        let file_name = rel.file_name().unwrap_or_default();
        if self.way == Way::Decrypt && file_name == hetcrypt_format::manifest::MANIFEST_NAME {
            return None;
        }
        match kind {
            walk::Kind::File => {}
            walk::Kind::Link => {
                return Some(Entry::Skipped(Self::note(
                    &path,
                    "symbolic link, not followed",
                )))
            }
            walk::Kind::Dir | walk::Kind::Other => {
                return Some(Entry::Skipped(Self::note(&path, "not a regular file")))
            }
        }
        let Some(name) = out_name(file_name, self.way) else {
            return Some(Entry::Skipped(Self::note(
                &path,
                format!("no {SUFFIX} suffix"),
            )));
        };
        // The plaintext file's path in the tree: the input's when encrypting, the
        // output's when decrypting.
        let plain_rel = match self.way {
            Way::Encrypt => rel.clone(),
            Way::Decrypt => rel.with_file_name(&name),
        };
        let dest = Target::new(&out.root, out.rel.join(rel.with_file_name(&name)));
        let id = meta.map(|meta| FileId {
            dev: meta.dev,
            ino: meta.ino,
            len: meta.size,
        });
        // The innermost encrypted tree holding the file, and its path there.
        let (tree, in_tree) = match self.nested.last() {
            Some((n, i)) => (*i, plain_rel.strip_prefix(n).unwrap_or(&plain_rel)),
            None => (index, plain_rel.as_path()),
        };
        let in_manifest = self.trees[tree].manifest_path(in_tree.as_os_str().as_bytes());
        Some(match self.file(&path, id, Dest::File(dest), false) {
            Entry::Work(mut w) => {
                w.tree = Some((tree, in_manifest));
                if let Source::File { beneath, .. } = &mut w.source {
                    *beneath = Some(dir.clone());
                }
                Entry::Work(w)
            }
            other => other,
        })
    }
}

impl Iterator for Plan {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        loop {
            if let Some((walk, index)) = &mut self.walk {
                match walk.next() {
                    Some(item) => {
                        let index = *index;
                        match self.walked(item, index) {
                            Some(entry) => return Some(entry),
                            None => continue,
                        }
                    }
                    None => {
                        self.walk = None;
                        self.nested.clear();
                    }
                }
            }
            match self.roots.pop_front()? {
                Root::Ready(entry) => return Some(entry),
                Root::Tree(index) => {
                    self.walk = Some((walk::Walk::new(&self.trees[index].dir), index));
                }
            }
        }
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

/// The target of an output file the user named.
fn file_target(path: &Path) -> anyhow::Result<Target> {
    match Target::file(path) {
        Some(t) => Ok(t),
        None => bail!("{} does not name a file", show(path)),
    }
}

/// A path made absolute and free of `.`, `..` and links as far as it exists (the
/// rest, not yet made, appended as written).
fn resolved(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = abs.as_path();
    let mut rest: Vec<&OsStr> = Vec::new();
    loop {
        if let Ok(canon) = std::fs::canonicalize(existing) {
            let mut out = canon;
            for part in rest.iter().rev() {
                match *part {
                    p if p == ".." => {
                        out.pop();
                    }
                    p if p == "." => {}
                    p => out.push(p),
                }
            }
            return out;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                existing = parent;
            }
            _ => return abs,
        }
    }
}

/// Refuses an output tree inside (or equal to) the input tree, before anything is
/// written: walking the input would meet the outputs, encrypting them in turn.
fn refuse_output_inside(input: &Path, output: &Path) -> anyhow::Result<()> {
    let (i, o) = (resolved(input), resolved(output));
    if o.starts_with(&i) {
        bail!(
            "the output {} lies inside the input {}: choose an output outside it",
            show(output),
            show(input)
        );
    }
    Ok(())
}

/// Works out what goes where: checks the arguments now, walks trees later.
pub fn plan(
    inputs: &[PathBuf],
    output: Option<&Path>,
    way: Way,
    force: bool,
) -> anyhow::Result<Plan> {
    let mut p = Plan {
        way,
        force,
        roots: VecDeque::new(),
        walk: None,
        nested: Vec::new(),
        trees: Vec::new(),
        stdout: false,
        made: HashSet::new(),
    };
    let is_dash = |x: &Path| x.as_os_str() == "-";
    let out_is_dir = output.is_some_and(|o| o.is_dir());

    if let [input] = inputs {
        if is_dash(input) {
            let dest = match output {
                None => Dest::Stdout,
                Some(o) if is_dash(o) => Dest::Stdout,
                Some(o) if out_is_dir => {
                    bail!(
                        "{} is a directory: name the output file for standard input",
                        show(o)
                    )
                }
                Some(o) => {
                    if o.exists() && !force {
                        bail!("{} already exists (use --force to overwrite)", show(o));
                    }
                    Dest::File(file_target(o)?)
                }
            };
            p.stdout = dest == Dest::Stdout;
            p.roots.push_back(Root::Ready(Entry::Work(Work {
                source: Source::Stdin,
                dest,
                size: None,
                tree: None,
            })));
            return Ok(p);
        }
        let meta = match input.metadata() {
            Ok(m) => m,
            Err(e) => {
                p.roots
                    .push_back(Root::Ready(Entry::Failed(Plan::note(input, e.to_string()))));
                return Ok(p);
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
            refuse_output_inside(input, root)?;
            p.trees
                .push(TreeRoot::new(input, Target::new(root, ""), way));
            p.roots.push_back(Root::Tree(p.trees.len() - 1));
            return Ok(p);
        }
        if !meta.is_file() {
            p.roots.push_back(Root::Ready(Entry::Failed(Plan::note(
                input,
                "not a regular file",
            ))));
            return Ok(p);
        }
        let name = input.file_name().unwrap_or(input.as_os_str());
        let dest = match output {
            Some(o) if is_dash(o) => Dest::Stdout,
            Some(o) if out_is_dir => match out_name(name, way) {
                Some(n) => Dest::File(Target::new(o, n)),
                None => bail!(
                    "{} has no {SUFFIX} suffix: name the output file with -o",
                    show(input)
                ),
            },
            Some(o) => Dest::File(file_target(o)?),
            None => match out_name(name, way) {
                Some(n) => Dest::File(file_target(&input.with_file_name(n))?),
                None => bail!(
                    "{} has no {SUFFIX} suffix: name the output with -o",
                    show(input)
                ),
            },
        };
        let mut entry = if dest == Dest::Stdout {
            p.stdout = true;
            Entry::Work(Work {
                source: Source::File {
                    path: input.clone(),
                    follow: true,
                    beneath: None,
                },
                dest,
                size: Some(meta.len()),
                tree: None,
            })
        } else {
            p.file(input, Some(FileId::from(&meta)), dest, true)
        };
        if let Entry::Work(w) = &mut entry {
            w.tree = p.tree_of_member(input);
        }
        p.roots.push_back(Root::Ready(entry));
        return Ok(p);
    }

    // Several inputs: OUT is a directory; two inputs may not share an output name.
    let Some(root) = output else {
        bail!("name an output directory with -o for several inputs");
    };
    if is_dash(root) {
        bail!("several inputs cannot go to standard output");
    }
    if root.exists() && !root.is_dir() {
        bail!("{} exists and is not a directory", show(root));
    }
    let mut taken: HashSet<PathBuf> = HashSet::new();
    for input in inputs {
        if is_dash(input) {
            bail!("standard input (-) can only be the only input");
        }
        let meta = match input.metadata() {
            Ok(m) => m,
            Err(e) => {
                p.roots
                    .push_back(Root::Ready(Entry::Failed(Plan::note(input, e.to_string()))));
                continue;
            }
        };
        let name = input.file_name().unwrap_or(input.as_os_str());
        let rel = if meta.is_dir() {
            refuse_output_inside(input, root)?;
            PathBuf::from(name)
        } else if meta.is_file() {
            match out_name(name, way) {
                Some(n) => PathBuf::from(n),
                None => {
                    let note = Plan::note(input, format!("no {SUFFIX} suffix"));
                    p.roots.push_back(Root::Ready(Entry::Skipped(note)));
                    continue;
                }
            }
        } else {
            p.roots.push_back(Root::Ready(Entry::Skipped(Plan::note(
                input,
                "not a regular file",
            ))));
            continue;
        };
        let dest = Target::new(root, rel);
        if !taken.insert(dest.path()) {
            let note = Plan::note(
                input,
                format!("another input also goes to {}", show(&dest.path())),
            );
            p.roots.push_back(Root::Ready(Entry::Failed(note)));
            continue;
        }
        let entry = if meta.is_dir() {
            p.trees.push(TreeRoot::new(input, dest, way));
            Root::Tree(p.trees.len() - 1)
        } else {
            let mut entry = p.file(input, Some(FileId::from(&meta)), Dest::File(dest), true);
            if let Entry::Work(w) = &mut entry {
                w.tree = p.tree_of_member(input);
            }
            Root::Ready(entry)
        };
        p.roots.push_back(entry);
    }
    Ok(p)
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
