//! Cipher names: AES key size x mode, and the direction of a job.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// AES block size in bytes.
pub const BLOCK_LEN: usize = 16;
/// GCM nonce length we accept: 96 bits, the only size NIST recommends (SP 800-38D 8.2).
pub const GCM_NONCE_LEN: usize = 12;

/// AES key size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeySize {
    /// 128-bit key.
    Aes128,
    /// 192-bit key.
    Aes192,
    /// 256-bit key.
    Aes256,
}

impl KeySize {
    /// Every key size.
    pub const ALL: [KeySize; 3] = [KeySize::Aes128, KeySize::Aes192, KeySize::Aes256];

    /// Key length in bytes.
    pub const fn key_len(self) -> usize {
        match self {
            KeySize::Aes128 => 16,
            KeySize::Aes192 => 24,
            KeySize::Aes256 => 32,
        }
    }

    /// Key length in bits.
    pub const fn bits(self) -> usize {
        self.key_len() * 8
    }
}

/// Block cipher mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// CBC without padding: input must be whole blocks (what `openssl speed` measures).
    Cbc,
    /// CBC with PKCS#7 padding (what `openssl enc` does).
    CbcPkcs7,
    /// CTR with a 128-bit big-endian counter block (the IV) incremented per block.
    Ctr,
    /// GCM with a 12-byte nonce, optional AAD and a 16-byte tag.
    Gcm,
}

impl Mode {
    /// Every mode.
    pub const ALL: [Mode; 4] = [Mode::Cbc, Mode::CbcPkcs7, Mode::Ctr, Mode::Gcm];
}

/// A cipher: AES with a key size and a mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cipher {
    /// Key size.
    pub key_size: KeySize,
    /// Mode.
    pub mode: Mode,
}

macro_rules! cipher_consts {
    ($($name:ident = $ks:ident, $mode:ident;)*) => {
        impl Cipher {
            $(
                #[doc = concat!("`", stringify!($name), "`.")]
                pub const $name: Cipher = Cipher { key_size: KeySize::$ks, mode: Mode::$mode };
            )*
        }
    };
}

cipher_consts! {
    AES_128_CBC = Aes128, Cbc;
    AES_192_CBC = Aes192, Cbc;
    AES_256_CBC = Aes256, Cbc;
    AES_128_CBC_PKCS7 = Aes128, CbcPkcs7;
    AES_192_CBC_PKCS7 = Aes192, CbcPkcs7;
    AES_256_CBC_PKCS7 = Aes256, CbcPkcs7;
    AES_128_CTR = Aes128, Ctr;
    AES_192_CTR = Aes192, Ctr;
    AES_256_CTR = Aes256, Ctr;
    AES_128_GCM = Aes128, Gcm;
    AES_192_GCM = Aes192, Gcm;
    AES_256_GCM = Aes256, Gcm;
}

impl Cipher {
    /// Builds a cipher from its parts.
    pub const fn new(key_size: KeySize, mode: Mode) -> Self {
        Cipher { key_size, mode }
    }

    /// Every cipher hetcrypt knows.
    pub fn all() -> impl Iterator<Item = Cipher> {
        Mode::ALL.into_iter().flat_map(|mode| {
            KeySize::ALL
                .into_iter()
                .map(move |ks| Cipher::new(ks, mode))
        })
    }

    /// Key length in bytes.
    pub const fn key_len(self) -> usize {
        self.key_size.key_len()
    }

    /// IV (CBC), initial counter block (CTR) or nonce (GCM) length in bytes.
    pub const fn iv_len(self) -> usize {
        match self.mode {
            Mode::Gcm => GCM_NONCE_LEN,
            _ => BLOCK_LEN,
        }
    }

    /// Whether the cipher authenticates (has a tag).
    pub const fn is_aead(self) -> bool {
        matches!(self.mode, Mode::Gcm)
    }

    /// Output length for an input of `len` bytes in `direction`, or the most it can
    /// be (padded CBC decryption strips an unknown amount of padding).
    pub const fn max_output_len(self, direction: Direction, len: usize) -> usize {
        match (self.mode, direction) {
            (Mode::CbcPkcs7, Direction::Encrypt) => (len / BLOCK_LEN + 1) * BLOCK_LEN,
            _ => len,
        }
    }

    /// The Linux crypto API name of the mode's template, e.g. `cbc(aes)` (padding is
    /// not a kernel concept: PKCS#7 is applied around it).
    pub const fn kernel_name(self) -> &'static str {
        match self.mode {
            Mode::Cbc | Mode::CbcPkcs7 => "cbc(aes)",
            Mode::Ctr => "ctr(aes)",
            Mode::Gcm => "gcm(aes)",
        }
    }
}

impl fmt::Display for Cipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.mode {
            Mode::Cbc => "cbc",
            Mode::CbcPkcs7 => "cbc-pkcs7",
            Mode::Ctr => "ctr",
            Mode::Gcm => "gcm",
        };
        write!(f, "aes-{}-{}", self.key_size.bits(), mode)
    }
}

impl FromStr for Cipher {
    type Err = Error;

    /// Parses `aes-128-cbc`, `aes-256-cbc-pkcs7`, `aes-192-ctr`, `aes-128-gcm`, ...
    fn from_str(s: &str) -> Result<Self, Error> {
        let unknown = || Error::UnknownName {
            what: "cipher",
            name: s.to_string(),
        };
        let lower = s.to_ascii_lowercase();
        let rest = lower.strip_prefix("aes-").ok_or_else(unknown)?;
        let (bits, mode) = rest.split_once('-').ok_or_else(unknown)?;
        let key_size = match bits {
            "128" => KeySize::Aes128,
            "192" => KeySize::Aes192,
            "256" => KeySize::Aes256,
            _ => return Err(unknown()),
        };
        let mode = match mode {
            "cbc" => Mode::Cbc,
            "cbc-pkcs7" | "cbc-pad" => Mode::CbcPkcs7,
            "ctr" => Mode::Ctr,
            "gcm" => Mode::Gcm,
            _ => return Err(unknown()),
        };
        Ok(Cipher::new(key_size, mode))
    }
}

impl Serialize for Cipher {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cipher {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Which way a job goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Plaintext in, ciphertext out.
    Encrypt,
    /// Ciphertext in, plaintext out.
    Decrypt,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Encrypt => "encrypt",
            Direction::Decrypt => "decrypt",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for c in Cipher::all() {
            assert_eq!(c.to_string().parse::<Cipher>().unwrap(), c);
        }
        assert_eq!(Cipher::all().count(), 12);
        assert!("aes-64-cbc".parse::<Cipher>().is_err());
        assert!("des-128-cbc".parse::<Cipher>().is_err());
    }
}
