//! The format crate's one error type: what can be wrong with a message or its key.

use crate::aead::Aead;

/// Result alias for the format crate.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;

/// Everything that can go wrong while encrypting or decrypting a message.
///
/// Authentication failures stay opaque about *why* a chunk did not verify (the AEAD
/// cannot tell a flipped bit from a reordered chunk), but say *where*.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// The input does not start with the hetcrypt wrapper header.
    #[error("not a hetcrypt file (no hetcrypt header)")]
    NotHetcrypt,
    /// A wrapper header from a format version this build does not know.
    #[error("hetcrypt format version {0} is not supported by this build")]
    UnsupportedVersion(u8),
    /// A wrapper header naming an AEAD or hash this build does not know.
    #[error("unknown {what} id {id} in the hetcrypt header")]
    UnknownId {
        /// "AEAD" or "hash".
        what: &'static str,
        /// The id found.
        id: u8,
    },
    /// The input key does not have the AEAD's key length (C2SP: the input key is as
    /// long as the AEAD key).
    #[error("{aead} needs a {expected}-byte key, the key has {got} bytes")]
    KeyLength {
        /// The AEAD.
        aead: Aead,
        /// Required length.
        expected: usize,
        /// Given length.
        got: usize,
    },
    /// The commitment does not match the key, salt and context: wrong key, or the
    /// header was modified. Checked before any chunk is decrypted.
    #[error("wrong key, or not a hetcrypt file (the key commitment does not match)")]
    WrongKey,
    /// The message ends early: the header is incomplete, a chunk is cut short, or the
    /// final (short) chunk is missing.
    #[error("truncated: {0}")]
    Truncated(String),
    /// The input's length (known before reading it) cannot be that of a message: it
    /// was cut inside a chunk, or data was appended. Found before any chunk runs.
    #[error("truncated or extended: {len} bytes cannot be a whole message (cut inside a chunk, or data appended after the end)")]
    BadLength {
        /// The whole input's length, in bytes.
        len: u64,
    },
    /// A chunk failed authentication: it was modified, reordered or duplicated, or
    /// data was appended after the end of the message.
    #[error("chunk {chunk} failed authentication ({hint})")]
    Tampered {
        /// The chunk's index.
        chunk: u64,
        /// What the position suggests ("modified or reordered", or, for the last
        /// chunk, "modified, or data appended after the end").
        hint: &'static str,
    },
    /// A tree member decrypted alone: only its tree's manifest can vouch that it is
    /// the file that belongs at its path, in its latest version.
    #[error("a member of an encrypted tree: decrypt the whole tree, whose manifest vouches for its files")]
    TreeMember,
    /// A tree member that is not what the tree's manifest lists at its path: swapped
    /// with another file, moved, or rolled back to another version of itself.
    #[error("does not match the tree's manifest (replaced, swapped with another file, moved, or rolled back to an older version)")]
    ManifestMismatch,
    /// A manifest whose authenticated plaintext is not a valid manifest.
    #[error("invalid tree manifest: {0}")]
    BadManifest(String),
    /// The message would need 2^38 chunks or more (C2SP's limit, 4 PiB).
    #[error("message too long: C2SP allows fewer than 2^38 chunks")]
    TooLong,
    /// A context too long for the key derivation.
    #[error("context of {0} bytes is too long")]
    ContextTooLong(usize),
    /// An engine or job error from the hetcrypt library (no engine, engine failure).
    #[error(transparent)]
    Engine(#[from] hetcrypt::Error),
    /// An OpenSSL error (key derivation, HMAC).
    #[error("openssl: {0}")]
    OpenSsl(#[from] openssl::error::ErrorStack),
    /// Reading the input or writing the output failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl FormatError {
    /// Whether the error says the message itself is bad (as opposed to I/O or engine
    /// trouble): wrong key, truncated, tampered, not a hetcrypt file.
    pub fn is_invalid_message(&self) -> bool {
        matches!(
            self,
            FormatError::NotHetcrypt
                | FormatError::UnsupportedVersion(_)
                | FormatError::UnknownId { .. }
                | FormatError::WrongKey
                | FormatError::Truncated(_)
                | FormatError::BadLength { .. }
                | FormatError::TreeMember
                | FormatError::ManifestMismatch
                | FormatError::BadManifest(_)
                | FormatError::Tampered { .. }
        )
    }
}
