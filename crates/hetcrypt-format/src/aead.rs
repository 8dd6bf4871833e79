//! The AEADs a message can use, and how one chunk becomes one `hetcrypt::Job`.
//!
//! - `AEAD_AES_128_GCM`, `AEAD_AES_256_GCM`: the chunk is one GCM job (12-byte nonce,
//!   empty AAD); the AEAD ciphertext is the job's output followed by its tag.
//! - `AEAD_AES_128_CBC_HMAC_SHA_256` (RFC 7518 5.2.2–5.2.3, draft-mcgrew-aead-aes-cbc-
//!   hmac-sha2): the 32-byte key is MAC_KEY (16) || ENC_KEY (16); the chunk is one
//!   AES-128-CBC job with PKCS#7 padding under ENC_KEY, which any engine with CBC can run
//!   (CBC-only crypto modules included); the tag is the first 16 bytes of
//!   HMAC-SHA-256(MAC_KEY, AAD || IV || C || AL), computed here on the CPU. When
//!   decrypting, the tag is verified *before* the CBC job is submitted.

use std::fmt;
use std::str::FromStr;

use aes::cipher::{BlockCipherEncrypt, KeyInit};
use aes::Aes128;
use hetcrypt::{Cipher, Direction, Job, JobOutput, KeyId};
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;
use zeroize::Zeroizing;

use crate::error::{FormatError, Result};
use crate::CHUNK_SIZE;

/// Length of a GCM tag, and of the truncated HMAC tag of the CBC-HMAC AEAD.
pub const TAG_LEN: usize = 16;
/// AES block length: the CBC IV and the PKCS#7 padding unit.
const BLOCK_LEN: usize = 16;

/// An AEAD that instantiates C2SP chunked encryption.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Aead {
    /// AES-128-GCM (the C2SP recommendation).
    #[serde(rename = "AEAD_AES_128_GCM")]
    Aes128Gcm,
    /// AES-256-GCM.
    #[serde(rename = "AEAD_AES_256_GCM")]
    Aes256Gcm,
    /// AES-128-CBC + HMAC-SHA-256 (RFC 7518 A128CBC-HS256 construction): its CBC half
    /// runs on CBC-only crypto modules.
    #[serde(rename = "AEAD_AES_128_CBC_HMAC_SHA_256")]
    Aes128CbcHmacSha256,
}

impl Aead {
    /// Every AEAD, in wrapper-id order.
    pub const ALL: [Aead; 3] = [Aead::Aes128Gcm, Aead::Aes256Gcm, Aead::Aes128CbcHmacSha256];

    /// The name in the IANA AEAD registry, as it goes into the HKDF info.
    pub const fn iana_name(self) -> &'static str {
        match self {
            Aead::Aes128Gcm => "AEAD_AES_128_GCM",
            Aead::Aes256Gcm => "AEAD_AES_256_GCM",
            Aead::Aes128CbcHmacSha256 => "AEAD_AES_128_CBC_HMAC_SHA_256",
        }
    }

    /// The CLI's name (`aes-128-gcm`, `aes-256-gcm`, `aes-128-cbc-hmac-sha256`).
    pub const fn cli_name(self) -> &'static str {
        match self {
            Aead::Aes128Gcm => "aes-128-gcm",
            Aead::Aes256Gcm => "aes-256-gcm",
            Aead::Aes128CbcHmacSha256 => "aes-128-cbc-hmac-sha256",
        }
    }

    /// The id in the hetcrypt wrapper header.
    pub const fn id(self) -> u8 {
        match self {
            Aead::Aes128Gcm => 1,
            Aead::Aes256Gcm => 2,
            Aead::Aes128CbcHmacSha256 => 3,
        }
    }

    /// The AEAD with this wrapper id.
    pub fn from_id(id: u8) -> Option<Aead> {
        Aead::ALL.into_iter().find(|a| a.id() == id)
    }

    /// AEAD key length in bytes; C2SP's input key has the same length.
    pub const fn key_len(self) -> usize {
        match self {
            Aead::Aes128Gcm => 16,
            // CBC-HMAC: MAC_KEY (16) || ENC_KEY (16), RFC 7518 5.2.3.
            Aead::Aes256Gcm | Aead::Aes128CbcHmacSha256 => 32,
        }
    }

    /// AEAD nonce length in bytes (GCM: 96 bits; CBC-HMAC: one block, from which the
    /// CBC IV is derived).
    pub const fn nonce_len(self) -> usize {
        match self {
            Aead::Aes128Gcm | Aead::Aes256Gcm => hetcrypt::cipher::GCM_NONCE_LEN,
            Aead::Aes128CbcHmacSha256 => BLOCK_LEN,
        }
    }

    /// The hetcrypt cipher of the chunk jobs.
    pub const fn job_cipher(self) -> Cipher {
        match self {
            Aead::Aes128Gcm => Cipher::AES_128_GCM,
            Aead::Aes256Gcm => Cipher::AES_256_GCM,
            Aead::Aes128CbcHmacSha256 => Cipher::AES_128_CBC_PKCS7,
        }
    }

    /// AEAD ciphertext length (tag included) of a chunk of `plaintext_len` bytes.
    pub const fn ciphertext_len(self, plaintext_len: usize) -> usize {
        match self {
            Aead::Aes128Gcm | Aead::Aes256Gcm => plaintext_len + TAG_LEN,
            // PKCS#7 always adds 1..=16 bytes of padding.
            Aead::Aes128CbcHmacSha256 => (plaintext_len / BLOCK_LEN + 1) * BLOCK_LEN + TAG_LEN,
        }
    }

    /// Length of the AEAD ciphertext of a full 16 KiB chunk; every chunk but the last
    /// has exactly this length, the last one is shorter.
    pub const fn full_chunk_len(self) -> usize {
        self.ciphertext_len(CHUNK_SIZE)
    }

    /// The shortest possible AEAD ciphertext (of an empty chunk).
    pub const fn min_chunk_len(self) -> usize {
        self.ciphertext_len(0)
    }

    /// Whether `len` bytes can be the chunks of a message: whole full chunks, then one
    /// final chunk of a length this AEAD can produce. (A file's length is known before
    /// it is read, so a cut or padded file whose length gives it away fails at once.)
    pub const fn possible_chunks_len(self, len: u64) -> bool {
        let last = len % self.full_chunk_len() as u64;
        match self {
            Aead::Aes128Gcm | Aead::Aes256Gcm => last >= TAG_LEN as u64,
            // Whole blocks of padded plaintext, then the tag.
            Aead::Aes128CbcHmacSha256 => {
                last >= self.min_chunk_len() as u64 && last.is_multiple_of(BLOCK_LEN as u64)
            }
        }
    }
}

impl fmt::Display for Aead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.cli_name())
    }
}

impl FromStr for Aead {
    type Err = String;

    /// Parses the CLI name or the IANA name.
    fn from_str(s: &str) -> Result<Self, String> {
        Aead::ALL
            .into_iter()
            .find(|a| s.eq_ignore_ascii_case(a.cli_name()) || s.eq_ignore_ascii_case(a.iana_name()))
            .ok_or_else(|| {
                format!(
                    "unknown AEAD '{s}' (known: {})",
                    Aead::ALL.map(Aead::cli_name).join(", ")
                )
            })
    }
}

/// The CPU half of `AEAD_AES_128_CBC_HMAC_SHA_256`: the tag, and the IV derivation.
///
/// Keyed once per message (HMAC's inner and outer states, the AES key schedule for
/// the IV block) and cloned per chunk, so a chunk costs no key setup; all of it is
/// zeroized on drop.
pub struct CbcHmacKeys {
    mac: Hmac<Sha256>,
    enc: Zeroizing<Vec<u8>>,
    iv_cipher: Aes128,
}

impl fmt::Debug for CbcHmacKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CbcHmacKeys(redacted)")
    }
}

impl CbcHmacKeys {
    /// Length of each half of the 32-byte key.
    pub const HALF_LEN: usize = 16;

    /// Splits a 32-byte AEAD key into MAC_KEY (first half) and ENC_KEY (second half),
    /// RFC 7518 5.2.2.1.
    pub fn new(key: &[u8]) -> Result<Self> {
        if key.len() != 2 * Self::HALF_LEN {
            return Err(FormatError::KeyLength {
                aead: Aead::Aes128CbcHmacSha256,
                expected: 2 * Self::HALF_LEN,
                got: key.len(),
            });
        }
        let (mac, enc) = key.split_at(Self::HALF_LEN);
        Ok(CbcHmacKeys {
            mac: Hmac::<Sha256>::new_from_slice(mac).expect("HMAC takes keys of any length"),
            enc: Zeroizing::new(enc.to_vec()),
            iv_cipher: Aes128::new_from_slice(enc).expect("ENC_KEY is 16 bytes"),
        })
    }

    /// ENC_KEY, the AES-128 key of the CBC jobs.
    pub fn enc_key(&self) -> &[u8] {
        &self.enc
    }

    /// The tag: HMAC-SHA-256(MAC_KEY, AAD || IV || C || AL) truncated to 16 bytes, AL
    /// being the AAD's length in bits as a 64-bit big-endian integer (RFC 7518 5.2.2.1).
    pub fn tag(&self, aad: &[u8], iv: &[u8], ciphertext: &[u8]) -> Result<[u8; TAG_LEN]> {
        let mut mac = self.mac.clone();
        mac.update(aad);
        mac.update(iv);
        mac.update(ciphertext);
        mac.update(&(aad.len() as u64).wrapping_mul(8).to_be_bytes());
        let full = mac.finalize().into_bytes();
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&full[..TAG_LEN]);
        Ok(tag)
    }

    /// Whether `tag` is the tag of (AAD, IV, C), compared in constant time.
    pub fn verify(&self, aad: &[u8], iv: &[u8], ciphertext: &[u8], tag: &[u8]) -> Result<bool> {
        let expected = self.tag(aad, iv, ciphertext)?;
        Ok(tag.len() == TAG_LEN && openssl::memcmp::eq(&expected, tag))
    }

    /// The CBC IV of the chunk with C2SP nonce `nonce` (16 bytes): AES-ENC(ENC_KEY,
    /// nonce), the first method of NIST SP 800-38A Appendix C for unpredictable IVs.
    /// (Using the nonce itself would give IVs whose differences are public, letting a
    /// chosen-plaintext attacker test guesses of a chunk's first block.)
    pub fn iv(&self, nonce: &[u8]) -> Result<[u8; BLOCK_LEN]> {
        let mut block = aes::Block::default();
        if nonce.len() != BLOCK_LEN {
            return Err(FormatError::Engine(hetcrypt::Error::IvLength {
                cipher: Cipher::AES_128_CBC_PKCS7,
                expected: BLOCK_LEN,
                got: nonce.len(),
            }));
        }
        block.copy_from_slice(nonce);
        self.iv_cipher.encrypt_block(&mut block);
        Ok(block.into())
    }
}

/// One message's chunk keys: the AEAD key registered with the dispatcher (for
/// CBC-HMAC: ENC_KEY), the base nonce, and for CBC-HMAC the MAC key.
pub struct ChunkKeys {
    aead: Aead,
    key: KeyId,
    base_nonce: Zeroizing<Vec<u8>>,
    cbc_hmac: Option<CbcHmacKeys>,
}

impl fmt::Debug for ChunkKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChunkKeys")
            .field("aead", &self.aead)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// Why a chunk's authentication failure is suspicious, by position.
const HINT_MIDDLE: &str = "modified, reordered or duplicated";
const HINT_LAST: &str =
    "modified, cut short inside the chunk (truncated), or data appended after the end";

impl ChunkKeys {
    /// Registers the derived AEAD `key` with `dispatcher` and keeps the base nonce.
    pub fn new(
        dispatcher: &hetcrypt::Dispatcher,
        aead: Aead,
        key: &[u8],
        base_nonce: &[u8],
    ) -> Result<Self> {
        debug_assert_eq!(base_nonce.len(), aead.nonce_len());
        let (job_key, cbc_hmac) = match aead {
            Aead::Aes128Gcm | Aead::Aes256Gcm => (key.to_vec(), None),
            Aead::Aes128CbcHmacSha256 => {
                let keys = CbcHmacKeys::new(key)?;
                (keys.enc_key().to_vec(), Some(keys))
            }
        };
        let key = dispatcher.add_key(hetcrypt::Key::new(job_key))?;
        Ok(ChunkKeys {
            aead,
            key,
            base_nonce: Zeroizing::new(base_nonce.to_vec()),
            cbc_hmac,
        })
    }

    /// The id of the AEAD key registered with the dispatcher.
    pub fn key_id(&self) -> KeyId {
        self.key
    }

    /// The AEAD.
    pub fn aead(&self) -> Aead {
        self.aead
    }

    /// Chunk `index`'s nonce: the base nonce XOR the index as a big-endian integer as
    /// wide as the nonce (the index is below 2^38, so only the last 5 bytes change).
    pub fn nonce(&self, index: u64) -> Result<Zeroizing<Vec<u8>>> {
        if index >= crate::MAX_CHUNKS {
            return Err(FormatError::TooLong);
        }
        let mut nonce = self.base_nonce.clone();
        let n = nonce.len();
        for (byte, counter) in nonce[n - 8..].iter_mut().zip(index.to_be_bytes()) {
            *byte ^= counter;
        }
        Ok(nonce)
    }

    /// The job that encrypts chunk `index`.
    pub fn seal_job(&self, index: u64, plaintext: Vec<u8>) -> Result<Job> {
        let nonce = self.nonce(index)?;
        let cipher = self.aead.job_cipher();
        Ok(match &self.cbc_hmac {
            None => Job::with_iv(cipher, Direction::Encrypt, self.key, &nonce, plaintext)?,
            Some(keys) => Job::new(
                cipher,
                Direction::Encrypt,
                self.key,
                keys.iv(&nonce)?,
                plaintext,
            ),
        })
    }

    /// The AEAD ciphertext of chunk `index` from its job's output.
    pub fn seal_finish(&self, index: u64, output: hetcrypt::Result<JobOutput>) -> Result<Vec<u8>> {
        let JobOutput { mut data, tag } = output?;
        match &self.cbc_hmac {
            None => {
                let tag = tag.ok_or(hetcrypt::Error::MissingTag {
                    cipher: self.aead.job_cipher(),
                })?;
                data.extend_from_slice(&tag);
            }
            Some(keys) => {
                let iv = keys.iv(&self.nonce(index)?)?;
                let tag = keys.tag(&[], &iv, &data)?;
                data.extend_from_slice(&tag);
            }
        }
        Ok(data)
    }

    /// The job that decrypts chunk `index` from its AEAD ciphertext. For CBC-HMAC the
    /// tag is verified here, before any decryption is submitted.
    pub fn open_job(&self, index: u64, mut ciphertext: Vec<u8>, last: bool) -> Result<Job> {
        if ciphertext.len() < self.aead.min_chunk_len() {
            return Err(FormatError::Truncated(format!(
                "chunk {index} has {} bytes, fewer than the {} of an empty chunk",
                ciphertext.len(),
                self.aead.min_chunk_len()
            )));
        }
        let nonce = self.nonce(index)?;
        let tag_at = ciphertext.len() - TAG_LEN;
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&ciphertext[tag_at..]);
        ciphertext.truncate(tag_at);
        let cipher = self.aead.job_cipher();
        Ok(match &self.cbc_hmac {
            None => {
                Job::with_iv(cipher, Direction::Decrypt, self.key, &nonce, ciphertext)?.tag(tag)
            }
            Some(keys) => {
                let iv = keys.iv(&nonce)?;
                if !keys.verify(&[], &iv, &ciphertext, &tag)? {
                    return Err(tampered(index, last));
                }
                Job::new(cipher, Direction::Decrypt, self.key, iv, ciphertext)
            }
        })
    }

    /// The plaintext of chunk `index` from its job's output; checks the chunk length
    /// rule (every chunk but the last is full, the last one is shorter).
    pub fn open_finish(
        &self,
        index: u64,
        output: hetcrypt::Result<JobOutput>,
        last: bool,
    ) -> Result<Vec<u8>> {
        let data = match output {
            Ok(out) => out.data,
            Err(hetcrypt::Error::AuthenticationFailed) => return Err(tampered(index, last)),
            Err(e) => return Err(e.into()),
        };
        match (last, data.len()) {
            (false, CHUNK_SIZE) => Ok(data),
            (true, n) if n < CHUNK_SIZE => Ok(data),
            (true, _) => Err(FormatError::Truncated(
                "the last chunk is a full one: the final short chunk is missing".into(),
            )),
            // Only an encryptor holding the key can produce this.
            (false, _) => Err(tampered(index, last)),
        }
    }
}

fn tampered(chunk: u64, last: bool) -> FormatError {
    FormatError::Tampered {
        chunk,
        hint: if last { HINT_LAST } else { HINT_MIDDLE },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iv_is_the_forward_cipher_of_the_nonce() {
        // FIPS-197 Appendix C.1: AES-128(000102..0f, 00112233..ff) = 69c4e0d8..c55a.
        let mut key = vec![0u8; 16];
        key.extend(0u8..16);
        let keys = CbcHmacKeys::new(&key).unwrap();
        let nonce: Vec<u8> = (0..16).map(|i| i * 0x11).collect();
        let iv = keys.iv(&nonce).unwrap();
        assert_eq!(
            iv,
            [
                0x69, 0xc4, 0xe0, 0xd8, 0x6a, 0x7b, 0x04, 0x30, 0xd8, 0xcd, 0xb7, 0x80, 0x70, 0xb4,
                0xc5, 0x5a
            ]
        );
        assert!(keys.iv(&nonce[..12]).is_err());
    }

    #[test]
    fn chunk_nonces_xor_the_counter_big_endian() {
        let d = hetcrypt::Dispatcher::new(vec![]).unwrap();
        let base = [0xffu8; 12];
        let keys = ChunkKeys::new(&d, Aead::Aes128Gcm, &[0u8; 16], &base).unwrap();
        assert_eq!(&keys.nonce(0).unwrap()[..], &base);
        let n = keys.nonce(0x01_0203_0405).unwrap();
        assert_eq!(
            &n[..],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0xfa]
        );
        assert!(keys.nonce(crate::MAX_CHUNKS - 1).is_ok());
        assert!(matches!(
            keys.nonce(crate::MAX_CHUNKS),
            Err(FormatError::TooLong)
        ));
    }
}
