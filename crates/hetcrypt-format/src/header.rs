//! The hetcrypt wrapper header: 12 bytes naming the format version, AEAD and hash,
//! in front of an intact C2SP ciphertext (and bound to it as the C2SP context).

use crate::aead::Aead;
use crate::error::{FormatError, Result};
use crate::kdf::Hash;

/// The first 8 bytes of every hetcrypt file.
pub const MAGIC: &[u8; 8] = b"hetcrypt";
/// The format version this build writes and reads.
pub const VERSION: u8 = 1;
/// Wrapper header length: magic (8), version, AEAD id, hash id, flags.
pub const WRAPPER_LEN: usize = 12;

/// Flag bit: the message is a member of an encrypted tree, its C2SP context binds its
/// relative path, and the tree's manifest vouches for it (see [`crate::manifest`]).
pub const FLAG_TREE: u8 = 0x01;

/// A parsed wrapper header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wrapper {
    /// The AEAD of the chunks.
    pub aead: Aead,
    /// The HKDF hash.
    pub hash: Hash,
    /// Whether the message belongs to an encrypted tree ([`FLAG_TREE`]).
    pub tree: bool,
}

impl Wrapper {
    /// The header's bytes (also the C2SP context, so that changing any of them makes
    /// the commitment check fail).
    pub fn to_bytes(self) -> [u8; WRAPPER_LEN] {
        let mut b = [0u8; WRAPPER_LEN];
        b[..8].copy_from_slice(MAGIC);
        b[8] = VERSION;
        b[9] = self.aead.id();
        b[10] = self.hash.id();
        b[11] = if self.tree { FLAG_TREE } else { 0 };
        b
    }

    /// Parses a header.
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < WRAPPER_LEN || &b[..8] != MAGIC {
            return Err(FormatError::NotHetcrypt);
        }
        if b[8] != VERSION {
            return Err(FormatError::UnsupportedVersion(b[8]));
        }
        let aead = Aead::from_id(b[9]).ok_or(FormatError::UnknownId {
            what: "AEAD",
            id: b[9],
        })?;
        let hash = Hash::from_id(b[10]).ok_or(FormatError::UnknownId {
            what: "hash",
            id: b[10],
        })?;
        if b[11] & !FLAG_TREE != 0 {
            return Err(FormatError::UnknownId {
                what: "flags",
                id: b[11],
            });
        }
        Ok(Wrapper {
            aead,
            hash,
            tree: b[11] & FLAG_TREE != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects() {
        for aead in Aead::ALL {
            for hash in Hash::ALL {
                for tree in [false, true] {
                    let w = Wrapper { aead, hash, tree };
                    assert_eq!(Wrapper::parse(&w.to_bytes()).unwrap(), w);
                }
            }
        }
        let good = Wrapper {
            aead: Aead::Aes128Gcm,
            hash: Hash::Sha512,
            tree: false,
        }
        .to_bytes();
        assert!(matches!(
            Wrapper::parse(&good[..11]),
            Err(FormatError::NotHetcrypt)
        ));
        let mut bad = good;
        bad[0] ^= 1;
        assert!(matches!(
            Wrapper::parse(&bad),
            Err(FormatError::NotHetcrypt)
        ));
        let mut bad = good;
        bad[8] = 2;
        assert!(matches!(
            Wrapper::parse(&bad),
            Err(FormatError::UnsupportedVersion(2))
        ));
        for i in 9..12 {
            let mut bad = good;
            bad[i] = 0x7f;
            assert!(matches!(
                Wrapper::parse(&bad),
                Err(FormatError::UnknownId { .. })
            ));
        }
    }
}
