//! C2SP key derivation: HKDF-Expand of the input key into key || base nonce || commitment.
//!
//! `key || base nonce || commitment = HKDF-Expand(prk = input key,
//!     info = "c2sp.org/chunked-encryption@v1+" || aead || 0x00 || salt || context)`.
//!
//! The spec leaves the hash a parameter (any secure hash of at least 256 bits;
//! SHA-256 recommended). Cobblestone, the instantiation that the Wycheproof vectors
//! test (filippo.io/cobblestone), uses SHA-512; hetcrypt writes SHA-512 by default and
//! reads both (the wrapper header names the hash).
//!
//! Written on OpenSSL's HKDF in expand-only mode rather than the `hkdf` crate: C2SP
//! uses the 16- or 32-byte input key directly as the PRK, and the `hkdf` crate refuses
//! a PRK shorter than the hash output (RFC 5869 2.3's "at least HashLen").

use std::fmt;
use std::str::FromStr;

use openssl::md::{Md, MdRef};
use openssl::pkey::Id;
use openssl::pkey_ctx::{HkdfMode, PkeyCtx};
use serde::Serialize;
use zeroize::Zeroizing;

use crate::aead::Aead;
use crate::error::{FormatError, Result};
use crate::{COMMITMENT_LEN, SALT_LEN};

/// The HKDF-Expand info prefix: versioned, and in the `c2sp.org` namespace so no
/// other HKDF use can collide with it.
pub const INFO_PREFIX: &[u8] = b"c2sp.org/chunked-encryption@v1+";

/// Longest context we pass to OpenSSL's HKDF (its info buffer holds 1024 bytes in
/// OpenSSL 3.0; prefix, AEAD name, separator and salt take at most 86 of them).
pub const MAX_CONTEXT_LEN: usize = 512;

/// The HKDF hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Hash {
    /// SHA-256, the C2SP spec's recommendation.
    #[serde(rename = "SHA-256")]
    Sha256,
    /// SHA-512, as Cobblestone (and its Wycheproof vectors) use.
    #[serde(rename = "SHA-512")]
    Sha512,
}

impl Hash {
    /// Every hash, in wrapper-id order.
    pub const ALL: [Hash; 2] = [Hash::Sha256, Hash::Sha512];

    /// The id in the hetcrypt wrapper header.
    pub const fn id(self) -> u8 {
        match self {
            Hash::Sha256 => 1,
            Hash::Sha512 => 2,
        }
    }

    /// The hash with this wrapper id.
    pub fn from_id(id: u8) -> Option<Hash> {
        Hash::ALL.into_iter().find(|h| h.id() == id)
    }

    /// The name (`SHA-256`, `SHA-512`).
    pub const fn name(self) -> &'static str {
        match self {
            Hash::Sha256 => "SHA-256",
            Hash::Sha512 => "SHA-512",
        }
    }

    fn md(self) -> &'static MdRef {
        match self {
            Hash::Sha256 => Md::sha256(),
            Hash::Sha512 => Md::sha512(),
        }
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Hash {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "sha-256" | "sha256" => Ok(Hash::Sha256),
            "sha-512" | "sha512" => Ok(Hash::Sha512),
            _ => Err(format!("unknown hash '{s}' (known: sha256, sha512)")),
        }
    }
}

/// What HKDF-Expand derives for one message.
pub struct Derived {
    /// The AEAD key (`len(key)` bytes).
    pub key: Zeroizing<Vec<u8>>,
    /// The base nonce (`len(nonce)` bytes).
    pub base_nonce: Zeroizing<Vec<u8>>,
    /// The 32-byte key commitment.
    pub commitment: [u8; COMMITMENT_LEN],
}

impl fmt::Debug for Derived {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Derived(redacted)")
    }
}

/// Derives the message key, base nonce and commitment. The input key must have the
/// AEAD's key length.
pub fn derive(
    hash: Hash,
    aead: Aead,
    input_key: &[u8],
    salt: &[u8; SALT_LEN],
    context: &[u8],
) -> Result<Derived> {
    if input_key.len() != aead.key_len() {
        return Err(FormatError::KeyLength {
            aead,
            expected: aead.key_len(),
            got: input_key.len(),
        });
    }
    if context.len() > MAX_CONTEXT_LEN {
        return Err(FormatError::ContextTooLong(context.len()));
    }
    let mut info = Vec::with_capacity(INFO_PREFIX.len() + 32 + 1 + SALT_LEN + context.len());
    info.extend_from_slice(INFO_PREFIX);
    info.extend_from_slice(aead.iana_name().as_bytes());
    info.push(0x00);
    info.extend_from_slice(salt);
    info.extend_from_slice(context);

    let (key_len, nonce_len) = (aead.key_len(), aead.nonce_len());
    let mut okm = Zeroizing::new(vec![0u8; key_len + nonce_len + COMMITMENT_LEN]);
    let mut ctx = PkeyCtx::new_id(Id::HKDF)?;
    ctx.derive_init()?;
    ctx.set_hkdf_mode(HkdfMode::EXPAND_ONLY)?;
    ctx.set_hkdf_md(hash.md())?;
    ctx.set_hkdf_key(input_key)?;
    ctx.add_hkdf_info(&info)?;
    ctx.derive(Some(&mut okm))?;

    let mut commitment = [0u8; COMMITMENT_LEN];
    commitment.copy_from_slice(&okm[key_len + nonce_len..]);
    Ok(Derived {
        key: Zeroizing::new(okm[..key_len].to_vec()),
        base_nonce: Zeroizing::new(okm[key_len..key_len + nonce_len].to_vec()),
        commitment,
    })
}
