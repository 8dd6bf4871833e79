//! A job: one independent unit of crypto work, and what it produces.

use crate::cipher::{Cipher, Direction, BLOCK_LEN};
use crate::error::{Error, Result};
use crate::key::KeyId;

/// Length of an AEAD tag (GCM): the full 16 bytes, never truncated.
pub const TAG_LEN: usize = 16;

/// An AEAD tag.
pub type Tag = [u8; TAG_LEN];

/// Longest IV/nonce a job carries (a block); GCM uses the first 12 bytes.
const IV_CAPACITY: usize = BLOCK_LEN;

/// One independent unit of work: cipher, direction, key, IV, AAD, input (and the tag
/// to check when decrypting with an AEAD).
///
/// The IV is stored inline so a job costs no allocation beyond its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    /// The cipher.
    pub cipher: Cipher,
    /// Encrypt or decrypt.
    pub direction: Direction,
    /// A key registered with the dispatcher.
    pub key: KeyId,
    iv: [u8; IV_CAPACITY],
    iv_len: u8,
    /// Additional authenticated data (GCM only; empty otherwise).
    pub aad: Vec<u8>,
    /// The input bytes.
    pub input: Vec<u8>,
    /// The tag to verify (GCM decryption).
    pub tag: Option<Tag>,
}

impl Job {
    /// A job with a 16-byte IV (CBC, CTR). For GCM use [`Job::with_iv`] and a 12-byte
    /// nonce.
    pub fn new(
        cipher: Cipher,
        direction: Direction,
        key: KeyId,
        iv: [u8; BLOCK_LEN],
        input: Vec<u8>,
    ) -> Self {
        Job {
            cipher,
            direction,
            key,
            iv,
            iv_len: BLOCK_LEN as u8,
            aad: Vec::new(),
            input,
            tag: None,
        }
    }

    /// A job with an IV or nonce of any length up to 16 bytes; the length is checked
    /// against the cipher when the job runs ([`Job::validate`]).
    pub fn with_iv(
        cipher: Cipher,
        direction: Direction,
        key: KeyId,
        iv: &[u8],
        input: Vec<u8>,
    ) -> Result<Self> {
        if iv.len() > IV_CAPACITY {
            return Err(Error::IvLength {
                cipher,
                expected: cipher.iv_len(),
                got: iv.len(),
            });
        }
        let mut buf = [0u8; IV_CAPACITY];
        buf[..iv.len()].copy_from_slice(iv);
        Ok(Job {
            cipher,
            direction,
            key,
            iv: buf,
            iv_len: iv.len() as u8,
            aad: Vec::new(),
            input,
            tag: None,
        })
    }

    /// Sets the AAD (GCM).
    pub fn aad(mut self, aad: Vec<u8>) -> Self {
        self.aad = aad;
        self
    }

    /// Sets the tag to verify (GCM decryption).
    pub fn tag(mut self, tag: Tag) -> Self {
        self.tag = Some(tag);
        self
    }

    /// The IV, counter block or nonce.
    pub fn iv(&self) -> &[u8] {
        &self.iv[..usize::from(self.iv_len)]
    }

    /// Input length in bytes.
    pub fn len(&self) -> usize {
        self.input.len()
    }

    /// Whether the input is empty.
    pub fn is_empty(&self) -> bool {
        self.input.is_empty()
    }

    /// Checks what can be checked without the key: IV length, block alignment, the
    /// presence of a tag for AEAD decryption. Every engine calls this first so that
    /// all engines reject the same jobs with the same error.
    pub fn validate(&self) -> Result<()> {
        let cipher = self.cipher;
        if self.iv().len() != cipher.iv_len() {
            return Err(Error::IvLength {
                cipher,
                expected: cipher.iv_len(),
                got: self.iv().len(),
            });
        }
        let rules = InputRules::of(cipher, self.direction);
        if rules.whole_blocks && !self.input.len().is_multiple_of(BLOCK_LEN) {
            return Err(Error::InputLength {
                cipher,
                len: self.input.len(),
            });
        }
        if rules.non_empty && self.input.is_empty() {
            return Err(Error::InputLength { cipher, len: 0 });
        }
        if cipher.is_aead() && self.direction == Direction::Decrypt && self.tag.is_none() {
            return Err(Error::MissingTag { cipher });
        }
        Ok(())
    }
}

/// What [`Job::validate`] asks of an input's length for a cipher and direction; also
/// read once per pull by lanes that check a whole pull of one cipher up front.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InputRules {
    /// A whole number of blocks (CBC; CBC with PKCS#7 when decrypting).
    pub(crate) whole_blocks: bool,
    /// At least one byte (a PKCS#7 ciphertext holds at least its padding block).
    pub(crate) non_empty: bool,
}

impl InputRules {
    pub(crate) fn of(cipher: Cipher, direction: Direction) -> Self {
        let padded_decryption =
            cipher.mode == crate::Mode::CbcPkcs7 && direction == Direction::Decrypt;
        InputRules {
            whole_blocks: cipher.mode == crate::Mode::Cbc || padded_decryption,
            non_empty: padded_decryption,
        }
    }
}

/// What a job produced.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct JobOutput {
    /// Ciphertext or plaintext.
    pub data: Vec<u8>,
    /// The tag (GCM encryption).
    pub tag: Option<Tag>,
}
