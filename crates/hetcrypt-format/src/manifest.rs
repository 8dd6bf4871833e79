//! Tree integrity: an encrypted tree carries a manifest, itself a hetcrypt message,
//! listing every file's relative path, plaintext size and key commitment; and each
//! file's key derivation binds its relative path. So a file swapped with another,
//! renamed, deleted, added, or rolled back to an older version of itself is found
//! before any of its plaintext is written. (See docs/format.md, "Trees".)
//!
//! A member message has the wrapper flag [`FLAG_TREE`](crate::header::FLAG_TREE) set,
//! and its C2SP context is `wrapper (12) || SHA-256(PATH_DOMAIN || path)`, where `path`
//! is the plaintext file's path relative to the tree root, components joined by `/`.
//! The manifest is the member with the empty path, stored as [`MANIFEST_NAME`] at the
//! root of the encrypted tree. Its plaintext:
//!
//! ```text
//! "hetcrypt manifest v1\n"                      21 bytes
//! count                                         u64, big-endian
//! count entries, paths strictly increasing (bytewise):
//!     path length                               u16, big-endian, 1..=65535
//!     path                                      bytes
//!     plaintext size                            u64, big-endian
//!     key commitment of the file's message      32 bytes
//! ```

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::error::{FormatError, Result};
use crate::header::WRAPPER_LEN;
use crate::COMMITMENT_LEN;

/// The manifest's file name at the root of an encrypted tree (no `.hc` suffix, so a
/// reader that does not know manifests skips it as "not encrypted").
pub const MANIFEST_NAME: &str = ".hetcrypt-manifest";

/// The first bytes of a manifest's plaintext.
pub const MAGIC: &[u8; 21] = b"hetcrypt manifest v1\n";

/// Domain separation for the path digest in a member's context, so the digest cannot
/// be mistaken for any other SHA-256 use.
pub const PATH_DOMAIN: &[u8] = b"hetcrypt tree path v1\0";

/// Longest relative path a manifest holds: what its 16-bit length field can say. (A
/// tree walked by descriptors can be deeper than PATH_MAX, 4,096 bytes.)
pub const MAX_PATH_LEN: usize = u16::MAX as usize;

/// The C2SP context of a tree member: its wrapper header and a digest of its relative
/// path (the empty path is the manifest's). A digest keeps the context 44 bytes long
/// whatever the path's length.
pub fn member_context(wrapper: &[u8; WRAPPER_LEN], path: &[u8]) -> Vec<u8> {
    let mut digest = Sha256::new();
    digest.update(PATH_DOMAIN);
    digest.update(path);
    let mut context = Vec::with_capacity(WRAPPER_LEN + 32);
    context.extend_from_slice(wrapper);
    context.extend_from_slice(&digest.finalize());
    context
}

/// What the manifest says of one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileEntry {
    /// Its plaintext size.
    pub size: u64,
    /// The key commitment in its message's header (it pins the salt, hence the
    /// version: an older version of the file has another one).
    pub commitment: [u8; COMMITMENT_LEN],
}

/// The files of an encrypted tree, by relative path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    entries: BTreeMap<Vec<u8>, FileEntry>,
}

fn bad(why: impl Into<String>) -> FormatError {
    FormatError::BadManifest(why.into())
}

/// Checks a relative path: 1..=65535 bytes, no NUL, no leading or trailing `/`, no
/// empty, `.` or `..` component.
fn check_path(path: &[u8]) -> Result<()> {
    if path.is_empty() || path.len() > MAX_PATH_LEN {
        return Err(bad(format!("a path of {} bytes", path.len())));
    }
    if path.contains(&0) {
        return Err(bad("a path with a NUL byte"));
    }
    if path
        .split(|&b| b == b'/')
        .any(|c| c.is_empty() || c == b"." || c == b"..")
    {
        return Err(bad(format!(
            "the path {:?} is not a plain relative path",
            String::from_utf8_lossy(path)
        )));
    }
    Ok(())
}

impl Manifest {
    /// An empty manifest.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a file; a path given twice or not a plain relative path is an error.
    pub fn insert(&mut self, path: &[u8], entry: FileEntry) -> Result<()> {
        check_path(path)?;
        if self.entries.insert(path.to_vec(), entry).is_some() {
            return Err(bad(format!(
                "the path {:?} is listed twice",
                String::from_utf8_lossy(path)
            )));
        }
        Ok(())
    }

    /// What the manifest says of `path`.
    pub fn get(&self, path: &[u8]) -> Option<&FileEntry> {
        self.entries.get(path)
    }

    /// The files, in path order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &FileEntry)> {
        self.entries.iter().map(|(p, e)| (p.as_slice(), e))
    }

    /// How many files it lists.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it lists no file.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The canonical plaintext.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&(self.entries.len() as u64).to_be_bytes());
        for (path, e) in &self.entries {
            let len = u16::try_from(path.len()).expect("checked at insert: fits in 16 bits");
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(path);
            out.extend_from_slice(&e.size.to_be_bytes());
            out.extend_from_slice(&e.commitment);
        }
        out
    }

    /// Parses a manifest's plaintext (only ever an authenticated one): exactly the
    /// canonical encoding, paths strictly increasing, nothing after the last entry.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let rest = bytes
            .strip_prefix(MAGIC.as_slice())
            .ok_or_else(|| bad("no manifest header"))?;
        let take = |rest: &mut &[u8], n: usize| -> Result<Vec<u8>> {
            if rest.len() < n {
                return Err(bad("the manifest ends inside an entry"));
            }
            let (head, tail) = rest.split_at(n);
            *rest = tail;
            Ok(head.to_vec())
        };
        let mut rest = rest;
        let count = u64::from_be_bytes(take(&mut rest, 8)?.try_into().expect("8 bytes"));
        let mut m = Manifest::new();
        let mut previous: Option<Vec<u8>> = None;
        for _ in 0..count {
            let len = u16::from_be_bytes(take(&mut rest, 2)?.try_into().expect("2 bytes"));
            let path = take(&mut rest, usize::from(len))?;
            let size = u64::from_be_bytes(take(&mut rest, 8)?.try_into().expect("8 bytes"));
            let commitment: [u8; COMMITMENT_LEN] = take(&mut rest, COMMITMENT_LEN)?
                .try_into()
                .expect("COMMITMENT_LEN bytes");
            if previous
                .as_ref()
                .is_some_and(|p| p.as_slice() >= path.as_slice())
            {
                return Err(bad("paths out of order"));
            }
            m.insert(&path, FileEntry { size, commitment })?;
            previous = Some(path);
        }
        if !rest.is_empty() {
            return Err(bad("data after the last entry"));
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_non_canonical_input() {
        let mut m = Manifest::new();
        let e = |b: u8| FileEntry {
            size: u64::from(b),
            commitment: [b; COMMITMENT_LEN],
        };
        m.insert(b"b/c", e(2)).unwrap();
        m.insert(b"a", e(1)).unwrap();
        let bytes = m.to_bytes();
        assert_eq!(Manifest::parse(&bytes).unwrap(), m);
        assert!(m.insert(b"a", e(3)).is_err());
        for bad in [&b""[..], b"/a", b"a/", b"a//b", b"./a", b"a/../b", b"a\0b"] {
            assert!(Manifest::new().insert(bad, e(0)).is_err(), "{bad:?}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(Manifest::parse(&extra).is_err());
        assert!(Manifest::parse(&bytes[..bytes.len() - 1]).is_err());
        // Entries out of order: swap the two.
        let one = 2 + 1 + 8 + 32;
        let mut swapped = bytes[..29].to_vec();
        swapped.extend_from_slice(&bytes[29 + one..]);
        swapped.extend_from_slice(&bytes[29..29 + one]);
        assert!(Manifest::parse(&swapped).is_err());
    }
}
