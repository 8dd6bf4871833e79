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
//! HKDF-Expand is written here on the `hmac` crate (RFC 5869 2.3: a loop of one to
//! three HMACs) rather than on the `hkdf` crate: C2SP uses the 16- or 32-byte input key
//! directly as the PRK, and the `hkdf` crate refuses a PRK shorter than the hash output
//! (RFC 5869 2.3's "at least HashLen"). Nor on OpenSSL's HKDF: its `EVP_PKEY` context,
//! made per message, cost 9% of a 4,000-file tree's run (issue 24); the tests check
//! this one against it.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use hmac::{Hmac, KeyInit, Mac};
use serde::Serialize;
use sha2::{Sha256, Sha512};
use zeroize::{Zeroize, Zeroizing};

use crate::aead::Aead;
use crate::error::{FormatError, Result};
use crate::{COMMITMENT_LEN, SALT_LEN};

/// The HKDF-Expand info prefix: versioned, and in the `c2sp.org` namespace so no
/// other HKDF use can collide with it.
pub const INFO_PREFIX: &[u8] = b"c2sp.org/chunked-encryption@v1+";

/// Longest context a message may have: what OpenSSL's HKDF took (its info buffer holds
/// 1024 bytes in OpenSSL 3.0; prefix, AEAD name, separator and salt take at most 86 of
/// them), kept so that other implementations built on it read every message.
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

    /// HKDF-Expand (RFC 5869 2.3) of `prk` and `info` into `okm` (at most 255 hash
    /// outputs long).
    #[cfg(test)]
    fn expand(self, prk: &[u8], info: &[u8], okm: &mut [u8]) {
        InputKey::new(prk).expand(self, &[info], okm);
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

/// An input key (the HKDF PRK), with its HMAC states keyed once, on first use, for
/// every message derived from it: keying is two of the four SHA-512 compressions of a
/// small file's derivation, so a run shares one `InputKey` among its messages. The
/// key and the keyed states are zeroed on drop.
pub struct InputKey {
    bytes: Zeroizing<Vec<u8>>,
    sha256: OnceLock<Hmac<Sha256>>,
    sha512: OnceLock<Hmac<Sha512>>,
}

impl fmt::Debug for InputKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("InputKey(redacted)")
    }
}

impl InputKey {
    /// The input key `bytes` (copied), nothing keyed yet.
    pub fn new(bytes: &[u8]) -> Self {
        InputKey {
            bytes: Zeroizing::new(bytes.to_vec()),
            sha256: OnceLock::new(),
            sha512: OnceLock::new(),
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// HKDF-Expand (RFC 5869 2.3) of this key and `info` into `okm` (at most 255 hash
    /// outputs long) with `hash`.
    fn expand(&self, hash: Hash, info: &[&[u8]], okm: &mut [u8]) {
        match hash {
            Hash::Sha256 => expand(keyed(&self.sha256, &self.bytes), info, okm),
            Hash::Sha512 => expand(keyed(&self.sha512, &self.bytes), info, okm),
        }
    }
}

/// The HMAC `M` keyed with `prk`, made once in `cell`.
fn keyed<'c, M: KeyInit>(cell: &'c OnceLock<M>, prk: &[u8]) -> &'c M {
    // HMAC takes a key of any length (RFC 2104: longer keys are hashed, shorter padded).
    cell.get_or_init(|| <M as KeyInit>::new_from_slice(prk).expect("HMAC accepts any key length"))
}

/// HKDF-Expand with the keyed HMAC `keyed`: `T(i) = HMAC(prk, T(i-1) || info || i)`,
/// `okm` the first bytes of `T(1) || T(2) || ...`; `info` is given in pieces (no
/// buffer is made to join them).
fn expand<M: Mac + Clone>(keyed: &M, info: &[&[u8]], okm: &mut [u8]) {
    let size = <M as hmac::digest::OutputSizeUser>::output_size();
    let mut previous = Zeroizing::new([0u8; MAX_HASH_LEN]);
    let mut previous_len = 0;
    for (i, block) in okm.chunks_mut(size).enumerate() {
        let counter = u8::try_from(i + 1).expect("an okm of at most 255 blocks");
        let mut mac = keyed.clone();
        mac.update(&previous[..previous_len]);
        for piece in info {
            mac.update(piece);
        }
        mac.update(&[counter]);
        let mut t = mac.finalize().into_bytes();
        block.copy_from_slice(&t[..block.len()]);
        previous[..t.len()].copy_from_slice(&t);
        previous_len = t.len();
        t.as_mut_slice().zeroize();
    }
}

/// The longest hash output (SHA-512's): `T(i)`'s room.
const MAX_HASH_LEN: usize = 64;

/// The longest `key || base nonce || commitment` of any AEAD (32 + 16 + 32 bytes):
/// the derived bytes' room on the stack.
const MAX_OKM_LEN: usize = 80;

/// Derives the message key, base nonce and commitment. The input key must have the
/// AEAD's key length.
pub fn derive(
    hash: Hash,
    aead: Aead,
    input_key: &[u8],
    salt: &[u8; SALT_LEN],
    context: &[u8],
) -> Result<Derived> {
    derive_with(hash, aead, &InputKey::new(input_key), salt, context)
}

/// [`derive`] under an [`InputKey`] (its HMAC keyed once for all the messages that
/// share it).
pub fn derive_with(
    hash: Hash,
    aead: Aead,
    input_key: &InputKey,
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
    let info: [&[u8]; 5] = [
        INFO_PREFIX,
        aead.iana_name().as_bytes(),
        &[0x00],
        salt,
        context,
    ];
    let (key_len, nonce_len) = (aead.key_len(), aead.nonce_len());
    let mut okm_buf = Zeroizing::new([0u8; MAX_OKM_LEN]);
    let okm = &mut okm_buf[..key_len + nonce_len + COMMITMENT_LEN];
    input_key.expand(hash, &info, okm);

    let mut commitment = [0u8; COMMITMENT_LEN];
    commitment.copy_from_slice(&okm[key_len + nonce_len..]);
    Ok(Derived {
        key: Zeroizing::new(okm[..key_len].to_vec()),
        base_nonce: Zeroizing::new(okm[key_len..key_len + nonce_len].to_vec()),
        commitment,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use openssl::md::Md;
    use openssl::pkey::Id;
    use openssl::pkey_ctx::{HkdfMode, PkeyCtx};

    /// OpenSSL's HKDF-Expand, which `derive` was written on before.
    fn openssl_expand(hash: Hash, prk: &[u8], info: &[u8], len: usize) -> Vec<u8> {
        let mut ctx = PkeyCtx::new_id(Id::HKDF).unwrap();
        ctx.derive_init().unwrap();
        ctx.set_hkdf_mode(HkdfMode::EXPAND_ONLY).unwrap();
        ctx.set_hkdf_md(match hash {
            Hash::Sha256 => Md::sha256(),
            Hash::Sha512 => Md::sha512(),
        })
        .unwrap();
        ctx.set_hkdf_key(prk).unwrap();
        ctx.add_hkdf_info(info).unwrap();
        let mut okm = vec![0u8; len];
        ctx.derive(Some(&mut okm)).unwrap();
        okm
    }

    /// The same bytes as OpenSSL for every hash, PRKs shorter and longer than the
    /// hash's block, and outputs of one to several blocks, cut mid-block or not.
    #[test]
    fn expand_matches_openssl() {
        for hash in Hash::ALL {
            for prk_len in [16, 32, 64, 200] {
                let prk: Vec<u8> = (0..prk_len).map(|i| (i * 7 + 1) as u8).collect();
                for info_len in [0, 1, 100, 600] {
                    let info: Vec<u8> = (0..info_len).map(|i| (i * 13) as u8).collect();
                    for len in [1, 32, 60, 64, 76, 100, 128, 300] {
                        let mut okm = vec![0u8; len];
                        hash.expand(&prk, &info, &mut okm);
                        assert_eq!(
                            okm,
                            openssl_expand(hash, &prk, &info, len),
                            "{hash} prk {prk_len} info {info_len} len {len}"
                        );
                    }
                }
            }
        }
    }

    /// One `InputKey` shared by many messages derives for each what a key of its own
    /// would: the keyed state is kept as keyed, never as updated by a message.
    #[test]
    fn a_shared_input_key_derives_as_a_fresh_one() {
        let bytes = [9u8; 16];
        let shared = InputKey::new(&bytes);
        for round in 0..3u8 {
            for hash in Hash::ALL {
                for (i, context) in [&b""[..], b"a/b", &[round; 300]].into_iter().enumerate() {
                    let salt = [round.wrapping_mul(31).wrapping_add(i as u8); SALT_LEN];
                    let got = derive_with(hash, Aead::Aes128Gcm, &shared, &salt, context).unwrap();
                    let want = derive(hash, Aead::Aes128Gcm, &bytes, &salt, context).unwrap();
                    assert_eq!(*got.key, *want.key);
                    assert_eq!(*got.base_nonce, *want.base_nonce);
                    assert_eq!(got.commitment, want.commitment);
                }
            }
        }
    }

    /// RFC 5869 A.3 (SHA-256, empty salt and info): its PRK expanded to its OKM.
    #[test]
    fn expand_rfc5869_a3() {
        let prk = hex("19ef24a32c717b167f33a91d6f648bdf96596776afdb6377ac434c1c293ccb04");
        let want = hex(
            "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8",
        );
        let mut okm = vec![0u8; want.len()];
        Hash::Sha256.expand(&prk, b"", &mut okm);
        assert_eq!(okm, want);
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }
}
