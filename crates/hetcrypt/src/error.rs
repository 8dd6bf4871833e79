//! The library's one error type.

use crate::cipher::Cipher;

/// Result alias for the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in hetcrypt.
///
/// Two families matter to the dispatcher: *job errors* (bad input, authentication
/// failure) belong to the job and are returned as its result; an
/// [`Error::EngineFailed`] belongs to the engine, which is quarantined while its jobs
/// are handed to the remaining engines.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The engine cannot run this cipher.
    #[error("{engine} does not support {cipher}")]
    Unsupported {
        /// The cipher asked for.
        cipher: Cipher,
        /// The engine asked.
        engine: String,
    },
    /// The engine cannot be used on this machine at all.
    #[error("engine {engine} unavailable: {reason}")]
    EngineUnavailable {
        /// The engine's name.
        engine: String,
        /// Why, in words (e.g. "AF_ALG not supported by this kernel").
        reason: String,
    },
    /// The engine failed while running a job (device error, vanished device); the job
    /// itself may be fine and is re-dispatched elsewhere.
    #[error("engine {engine} failed: {reason}")]
    EngineFailed {
        /// The engine's name.
        engine: String,
        /// What failed, in words.
        reason: String,
    },
    /// The engine's device holds no more sessions (keys) just now, even after the lane
    /// ended one of its own: other lanes or processes hold the rest. The job failed,
    /// the engine did not (it is not quarantined); the job may be run again.
    #[error("engine {engine} busy: {reason}")]
    EngineBusy {
        /// The engine's name.
        engine: String,
        /// What the device refused, in words.
        reason: String,
    },
    /// A key of the wrong length for the cipher.
    #[error("{cipher} needs a {expected}-byte key, got {got} bytes")]
    KeyLength {
        /// The cipher.
        cipher: Cipher,
        /// Required length.
        expected: usize,
        /// Given length.
        got: usize,
    },
    /// A key that is not 16, 24 or 32 bytes long.
    #[error("an AES key is 16, 24 or 32 bytes, got {len} bytes")]
    InvalidKey {
        /// The length given.
        len: usize,
    },
    /// An IV or nonce of the wrong length.
    #[error("{cipher} needs a {expected}-byte IV/nonce, got {got} bytes")]
    IvLength {
        /// The cipher.
        cipher: Cipher,
        /// Required length.
        expected: usize,
        /// Given length.
        got: usize,
    },
    /// Input whose length the cipher cannot take (unpadded CBC needs whole blocks).
    #[error("{cipher}: input of {len} bytes is not a whole number of 16-byte blocks")]
    InputLength {
        /// The cipher.
        cipher: Cipher,
        /// The input length.
        len: usize,
    },
    /// A decrypt job for an AEAD cipher without its tag.
    #[error("{cipher} decryption needs the 16-byte tag")]
    MissingTag {
        /// The cipher.
        cipher: Cipher,
    },
    /// A job larger than one request of the engine can carry, and the engine cannot
    /// split it (an AF_ALG AEAD request must fit the socket buffers whole).
    #[error(
        "{engine}: a job of {len} bytes ({cipher}) exceeds its largest request of {max} bytes"
    )]
    TooLarge {
        /// The cipher.
        cipher: Cipher,
        /// The engine.
        engine: String,
        /// Input bytes (AAD included).
        len: usize,
        /// The most it takes.
        max: usize,
    },
    /// A job names a key id that was never registered, or was removed.
    #[error("unknown key id {0}")]
    UnknownKey(u32),
    /// A key store has handed out every key id (ids are never reused).
    #[error("no key ids left: 2^32 keys were registered in this key store")]
    TooManyKeys,
    /// Authentication failed (GCM tag mismatch, bad padding). Deliberately opaque.
    #[error("authentication failed")]
    AuthenticationFailed,
    /// An error from OpenSSL that is not an authentication failure.
    #[error("openssl: {0}")]
    OpenSsl(#[from] openssl::error::ErrorStack),
    /// No engine that is still working supports this job's cipher.
    #[error("no working engine can run {cipher}")]
    NoEngine {
        /// The cipher.
        cipher: Cipher,
    },
    /// A name that does not parse (cipher, policy, engine).
    #[error("unknown {what} '{name}'")]
    UnknownName {
        /// What kind of name ("cipher", "policy", "engine").
        what: &'static str,
        /// The name given.
        name: String,
    },
    /// A policy was asked to use engines it cannot find among the dispatcher's.
    #[error("policy {policy}: {reason}")]
    Policy {
        /// The policy.
        policy: String,
        /// What is wrong.
        reason: String,
    },
    /// The dispatcher was given engines it cannot hold together.
    #[error("invalid engine set: {reason}")]
    InvalidEngines {
        /// What is wrong (duplicate name, too many engines).
        reason: String,
    },
    /// A job that cannot be cut into independent sub-jobs (CBC encryption chains every
    /// block to the previous one; GCM's tag covers the whole message).
    #[error("{cipher} {direction} cannot be split: {reason}")]
    CannotSplit {
        /// The cipher.
        cipher: Cipher,
        /// The direction.
        direction: crate::cipher::Direction,
        /// Why, in words.
        reason: &'static str,
    },
    /// The calibration store could not be written.
    #[error("cannot write the calibration store {}: {reason}", path.display())]
    Store {
        /// The store's path.
        path: std::path::PathBuf,
        /// What failed, in words.
        reason: String,
    },
    /// An I/O error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl Error {
    /// Whether this error means the engine, not the job, is at fault: the job should
    /// be re-dispatched and the engine quarantined.
    pub fn is_engine_failure(&self) -> bool {
        matches!(self, Error::EngineFailed { .. })
    }
}
