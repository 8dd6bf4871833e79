//! Trees' manifests (docs/format.md, "Trees"): written after an encrypted tree's files
//! are in place, read and authenticated before any file of a tree is decrypted.

use std::collections::HashSet;
use std::io::{self, Read};

use hetcrypt_format::manifest::MANIFEST_NAME;
use hetcrypt_format::{
    Aead, DecryptStream, EncryptStream, Manifest, Observer, OpenParams, Pipeline, SealParams,
};

use hetcrypt_format::FileEntry;

use super::dest::{DirFd, Target};
use super::io::{open_source, Opened, Output};
use super::plan::{show, Dest, Note, TreeRoot, SUFFIX};

/// Largest manifest read: about two million entries of 100-byte paths. A bigger file
/// at the manifest's name is refused rather than read into memory.
const MAX_MANIFEST: u64 = 256 << 20;

/// What a run knows of one input tree.
pub struct TreeState {
    /// The tree.
    pub root: TreeRoot,
    /// Its manifest (decrypting), once authenticated; `None` when the tree has none.
    pub manifest: Option<Manifest>,
    /// Why its manifest cannot be used (then none of its files is decrypted).
    pub unusable: Option<String>,
    /// Paths of the manifest met in the walk (decrypting).
    pub seen: HashSet<Vec<u8>>,
}

impl TreeState {
    /// A tree with no manifest known (yet).
    pub fn new(root: &TreeRoot) -> Self {
        TreeState {
            root: root.clone(),
            manifest: None,
            unusable: None,
            seen: HashSet::new(),
        }
    }
}

/// Keeps the one stream of a run.
struct One<S>(Option<(S, hetcrypt_format::Result<()>)>);

impl<S> Observer<S> for One<S> {
    fn done(&mut self, stream: S, result: hetcrypt_format::Result<()>) {
        self.0 = Some((stream, result));
    }
}

/// Reads and authenticates the manifest of the tree `root`, if it has one.
pub fn load(root: &TreeRoot, pipeline: &mut Pipeline<'_>, key: &[u8]) -> TreeState {
    let mut state = TreeState::new(root);
    let path = root.manifest_at.join(MANIFEST_NAME);
    let mut file = match open_source(&path, false, None) {
        Ok(Opened::File { file, .. }) => file,
        Ok(Opened::NotRegular(what)) => {
            state.unusable = Some(format!("{} is {what}", show(&path)));
            return state;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return state,
        Err(e) => {
            state.unusable = Some(format!("cannot read {}: {e}", show(&path)));
            return state;
        }
    };
    let mut bytes = Vec::new();
    if let Err(e) = (&mut file).take(MAX_MANIFEST + 1).read_to_end(&mut bytes) {
        state.unusable = Some(format!("cannot read {}: {e}", show(&path)));
        return state;
    }
    if bytes.len() as u64 > MAX_MANIFEST {
        state.unusable = Some(format!("{} is too large for a manifest", show(&path)));
        return state;
    }
    let mut plaintext = Vec::new();
    let stream = DecryptStream::new(&bytes[..], &mut plaintext, key, OpenParams::Hetcrypt)
        .in_tree(Vec::new(), None)
        .with_input_len(bytes.len() as u64);
    let mut one = One(None);
    let result = pipeline
        .run([stream], &mut one)
        .map_err(|e| e.to_string())
        .and_then(|()| match one.0 {
            Some((_, r)) => r.map_err(|e| e.to_string()),
            None => Err("internal error: the manifest's stream was lost".into()),
        })
        .and_then(|()| Manifest::parse(&plaintext).map_err(|e| e.to_string()));
    match result {
        Ok(m) => state.manifest = Some(m),
        Err(e) => state.unusable = Some(format!("its manifest {}: {e}", show(&path))),
    }
    state
}

/// Encrypts `manifest` as the tree's manifest at the root of `out` and names it
/// (replacing an older one only with `force`). Returns its directory.
fn write(
    out: &Target,
    manifest: &Manifest,
    pipeline: &mut Pipeline<'_>,
    key: &[u8],
    aead: Aead,
    force: bool,
) -> Result<Option<DirFd>, String> {
    let target = Target::new(&out.root, out.rel.join(MANIFEST_NAME));
    let bytes = manifest.to_bytes();
    let output = Output::new(Dest::File(target), None);
    let stream = EncryptStream::new(
        &bytes[..],
        output,
        key,
        SealParams::new(aead).tree_path(Vec::new()),
    );
    let mut one = One(None);
    pipeline
        .run([stream], &mut one)
        .map_err(|e| e.to_string())?;
    let (stream, result) = one
        .0
        .ok_or("internal error: the manifest's stream was lost")?;
    result.map_err(|e| e.to_string())?;
    stream
        .into_parts()
        .1
        .commit(force)
        .map_err(|e| e.to_string())
}

/// Decrypting: the files that the manifests of whole trees list under the walked
/// folders and that the walks did not meet (deleted, or renamed).
pub fn missing(trees: &[TreeState]) -> Vec<Note> {
    use std::os::unix::ffi::OsStrExt;
    let mut notes = Vec::new();
    for state in trees.iter().filter(|t| t.root.whole) {
        let Some(m) = &state.manifest else { continue };
        let gone = m
            .iter()
            .filter(|(p, _)| state.root.covers(p) && !state.seen.contains(*p));
        for (path, _) in gone {
            let mut name = std::ffi::OsStr::from_bytes(path).to_os_string();
            name.push(SUFFIX);
            notes.push(Note {
                path: show(&state.root.manifest_at.join(name)),
                reason: "missing from the tree: its manifest lists it (deleted, or renamed)".into(),
            });
        }
    }
    notes
}

/// Encrypting: writes each tree's manifest from the files of it now in place
/// (`members`: tree index, path, entry); the notes of those that could not be
/// written.
pub fn write_manifests(
    trees: &[TreeState],
    members: Vec<(usize, Vec<u8>, FileEntry)>,
    pipeline: &mut Pipeline<'_>,
    key: &[u8],
    aead: Aead,
    force: bool,
) -> Vec<Note> {
    let mut manifests: Vec<Result<Manifest, String>> = vec![Ok(Manifest::new()); trees.len()];
    for (index, path, entry) in members {
        if let Some(Ok(m)) = manifests.get_mut(index) {
            if let Err(e) = m.insert(&path, entry) {
                manifests[index] = Err(e.to_string());
            }
        }
    }
    let mut notes = Vec::new();
    for (state, manifest) in trees.iter().zip(manifests) {
        // Its content is synced before it is named; the name, with the run's others,
        // by the final sync.
        let written = manifest
            .and_then(|m| write(&state.root.out, &m, pipeline, key, aead, force))
            .map(drop);
        if let Err(reason) = written {
            notes.push(Note {
                path: show(&state.root.out.path().join(MANIFEST_NAME)),
                reason: format!("cannot write the tree's manifest: {reason}"),
            });
        }
    }
    notes
}
