//! C2SP chunked encryption (<https://c2sp.org/chunked-encryption>) whose chunks run as
//! `hetcrypt` jobs, so the chunks of every file in flight spread over every engine.
//!
//! A message is `salt (24) || commitment (32) || chunks`: HKDF-Expand of the input key
//! gives the message's AEAD key, base nonce and key commitment ([`kdf`]); the
//! plaintext is cut into 16 KiB chunks, the last one always shorter (possibly empty);
//! chunk *i* is sealed with nonce = base nonce XOR *i* and empty AAD ([`aead`]).
//! hetcrypt files put a 12-byte wrapper naming the AEAD and hash in front
//! ([`header`]). A [`stream`] turns one reader into chunk jobs; the [`Pipeline`]
//! runs the chunks of many streams as bounded dispatcher batches.
//!
//! ```
//! use hetcrypt::engine::cpu::CpuEngine;
//! use hetcrypt::policy::Pull;
//! use hetcrypt_format::{open_to_vec, seal_to_vec, Aead, OpenParams, SealParams};
//!
//! let engines = vec![CpuEngine::with_lanes(2).into_engine()];
//! let key = [7u8; 16];
//! let sealed = seal_to_vec(&engines, &Pull, &key, SealParams::new(Aead::Aes128Gcm), b"hello")?;
//! let opened = open_to_vec(&engines, &Pull, &key, OpenParams::Hetcrypt, &sealed)?;
//! assert_eq!(opened, b"hello");
//! # Ok::<(), hetcrypt_format::FormatError>(())
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod aead;
pub mod error;
pub mod header;
pub mod kdf;
pub mod manifest;
pub mod pipeline;
mod salt;
pub mod stream;

use hetcrypt::engine::EngineRef;
use hetcrypt::policy::Policy;

pub use aead::Aead;
pub use error::{FormatError, Result};
pub use header::Wrapper;
pub use kdf::{Hash, InputKey};
pub use manifest::{FileEntry, Manifest};
pub use pipeline::{Observer, Pipeline, Stats, Stream};
pub use stream::{ChunkWrite, DecryptStream, EncryptStream, Framing, OpenParams, SealParams};

/// The C2SP chunk: 16 KiB, as TLS 1.3's record limit (the spec chose it to match).
pub const CHUNK_SIZE: usize = 16 * 1024;
/// Salt length: 192 bits, so random salts do not collide before 2^80 messages.
pub const SALT_LEN: usize = 24;
/// Key commitment length: 32 bytes, 128 bits of commitment security.
pub const COMMITMENT_LEN: usize = 32;
/// Chunks per message are numbered below 2^38 (4 PiB), C2SP's limit.
pub const MAX_CHUNKS: u64 = 1 << 38;

/// Keeps the one stream's result.
struct One(Option<Result<()>>);

impl<S> Observer<S> for One {
    fn done(&mut self, _stream: S, result: Result<()>) {
        self.0 = Some(result);
    }
}

/// Encrypts `plaintext` in memory through a pipeline over `engines` (for tests and
/// small messages; files go through [`EncryptStream`]s).
pub fn seal_to_vec(
    engines: &[EngineRef],
    policy: &dyn Policy,
    input_key: &[u8],
    params: SealParams,
    plaintext: &[u8],
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let stream = EncryptStream::new(plaintext, &mut out, input_key, params);
    let mut one = One(None);
    Pipeline::new(engines.to_vec(), policy)?.run([stream], &mut one)?;
    one.0.expect("the pipeline finishes every stream")?;
    Ok(out)
}

/// Decrypts `ciphertext` in memory through a pipeline over `engines`; nothing is
/// returned unless the whole message authenticates.
pub fn open_to_vec(
    engines: &[EngineRef],
    policy: &dyn Policy,
    input_key: &[u8],
    params: OpenParams,
    ciphertext: &[u8],
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let stream = DecryptStream::new(ciphertext, &mut out, input_key, params);
    let mut one = One(None);
    Pipeline::new(engines.to_vec(), policy)?.run([stream], &mut one)?;
    one.0.expect("the pipeline finishes every stream")?;
    Ok(out)
}
