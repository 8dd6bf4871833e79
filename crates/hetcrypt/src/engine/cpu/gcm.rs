//! AES-GCM through `ring`, the second implementation the cpu engine measures against EVP.
//!
//! OpenSSL 3.0's GCM has no VAES code; `ring` 0.17 has BoringSSL's VAES/VPCLMULQDQ
//! (AVX2) one, and measured 1.84x EVP's speed per 16 KiB message and 2.2-2.7x at
//! 16 B..1 KiB on the AMD EPYC (AES-128-GCM, a message's set-up, AAD and tag
//! included, input copied first). `ring` serves AES-128 and AES-256 with 96-bit IVs
//! and 16-byte tags; every other GCM job stays on EVP. Which of the two runs a job is
//! measured per key size, as for CTR (`select.rs`).
//!
//! `ring` does not clear its key schedule on drop, so [`GcmKey`] does (see its `Drop`).

use std::mem::MaybeUninit;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};

use crate::cipher::{Cipher, KeySize};
use crate::error::{Error, Result};
use crate::job::{Tag, TAG_LEN};

/// The `ring` release this was measured with, for `hetcrypt engines`.
pub(crate) const RING_VERSION: &str = "0.17";

/// The IV length `ring` takes: GCM's 96-bit nonce (NIST SP 800-38D's recommended size,
/// the only one used without GHASH over the IV).
pub(crate) const IV_LEN: usize = 12;

// `GcmKey` never runs `LessSafeKey`'s drop glue (it overwrites the bytes instead), which
// is only sound while there is none: no heap memory, no handle to release.
const _: () = assert!(!std::mem::needs_drop::<LessSafeKey>());

/// The longest input sent to `ring` (longer jobs stay on EVP): GCM allows 2^36 - 32
/// bytes per message, and `ring` refuses more; 4 GiB is far from that edge and far
/// above any job the dispatcher hands a lane in one piece.
pub(crate) const MAX_INPUT: usize = 1 << 32;
const _: () = assert!(MAX_INPUT <= (1 << 36) - 32 && MAX_INPUT >= 1 << 30);

/// A `ring` AES-GCM key schedule (round keys and GHASH table), zeroed on drop.
pub(crate) struct GcmKey {
    /// Always initialised between `new` and `drop`; `MaybeUninit` so that `drop` may
    /// overwrite it with bytes that are not a valid `LessSafeKey`.
    key: MaybeUninit<LessSafeKey>,
    /// The cipher the schedule is for (for errors).
    cipher: Cipher,
}

impl GcmKey {
    /// The key schedule for `cipher` (AES-128-GCM or AES-256-GCM) from raw key bytes;
    /// `None` for a cipher `ring` does not serve (AES-192-GCM, other modes).
    pub(crate) fn new(cipher: Cipher, key: &[u8]) -> Option<Result<Self>> {
        let algorithm = algorithm(cipher)?;
        Some(
            UnboundKey::new(algorithm, key)
                .map(|k| GcmKey {
                    key: MaybeUninit::new(LessSafeKey::new(k)),
                    cipher,
                })
                .map_err(|_| Error::KeyLength {
                    cipher,
                    expected: cipher.key_len(),
                    got: key.len(),
                }),
        )
    }

    fn get(&self) -> &LessSafeKey {
        // SAFETY: `key` is initialised in `new` and only overwritten in `drop`.
        unsafe { self.key.assume_init_ref() }
    }
}

impl Drop for GcmKey {
    fn drop(&mut self) {
        let bytes = self.key.as_mut_ptr().cast::<u8>();
        for i in 0..std::mem::size_of::<LessSafeKey>() {
            // SAFETY: `i` is within the `LessSafeKey` this `MaybeUninit` owns; a
            // `MaybeUninit` may hold any bytes, and nothing reads it after this. Volatile
            // so that the compiler does not drop the stores to memory about to be freed.
            unsafe { bytes.add(i).write_volatile(0) };
        }
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    }
}

/// The AES key sizes `ring` serves for GCM (it has no AES-192): the GCM classes the
/// implementation probe measures (`select.rs`). [`algorithm`] maps each to `ring`'s.
pub(crate) const KEY_SIZES: [KeySize; 2] = [KeySize::Aes128, KeySize::Aes256];

/// `ring`'s algorithm for `cipher`, where it has one (GCM at one of [`KEY_SIZES`]).
fn algorithm(cipher: Cipher) -> Option<&'static aead::Algorithm> {
    match (cipher.mode, cipher.key_size) {
        (crate::cipher::Mode::Gcm, KeySize::Aes128) => Some(&aead::AES_128_GCM),
        (crate::cipher::Mode::Gcm, KeySize::Aes256) => Some(&aead::AES_256_GCM),
        _ => None,
    }
}

/// Encrypts `input` into `out` (resized to it) and returns the tag.
pub(crate) fn seal(
    key: &GcmKey,
    iv: &[u8; IV_LEN],
    aad: &[u8],
    input: &[u8],
    out: &mut Vec<u8>,
) -> Result<Tag> {
    fill(out, input);
    seal_in_place(key, iv, aad, out)
}

/// Encrypts `data` in place and returns the tag; `data` keeps room for the tag after
/// it (see [`fill`]), growing only if it has none.
pub(crate) fn seal_in_place(
    key: &GcmKey,
    iv: &[u8; IV_LEN],
    aad: &[u8],
    data: &mut Vec<u8>,
) -> Result<Tag> {
    data.reserve(TAG_LEN);
    let tag = key
        .get()
        .seal_in_place_separate_tag(
            Nonce::assume_unique_for_key(*iv),
            Aad::from(aad),
            data.as_mut_slice(),
        )
        // Only a message longer than GCM allows is refused (callers keep to MAX_INPUT).
        .map_err(|_| Error::TooLarge {
            cipher: key.cipher,
            engine: "cpu".into(),
            len: data.len() + aad.len(),
            max: MAX_INPUT,
        })?;
    let mut bytes = [0u8; TAG_LEN];
    bytes.copy_from_slice(tag.as_ref());
    Ok(bytes)
}

/// Decrypts `input` into `out` if `tag` authenticates it; on failure `out` is zeroed
/// and emptied (no unauthenticated plaintext is left) and the error is
/// [`Error::AuthenticationFailed`].
pub(crate) fn open(
    key: &GcmKey,
    iv: &[u8; IV_LEN],
    aad: &[u8],
    input: &[u8],
    tag: &Tag,
    out: &mut Vec<u8>,
) -> Result<()> {
    fill(out, input);
    open_in_place(key, iv, aad, tag, out)
}

/// Decrypts `data` in place if `tag` authenticates it; on failure, as [`open`].
pub(crate) fn open_in_place(
    key: &GcmKey,
    iv: &[u8; IV_LEN],
    aad: &[u8],
    tag: &Tag,
    data: &mut Vec<u8>,
) -> Result<()> {
    let opened = key.get().open_in_place_separate_tag(
        Nonce::assume_unique_for_key(*iv),
        Aad::from(aad),
        aead::Tag::from(*tag),
        data.as_mut_slice(),
        0..,
    );
    if opened.is_err() {
        zeroize::Zeroize::zeroize(data.as_mut_slice());
        data.clear();
        return Err(Error::AuthenticationFailed);
    }
    Ok(())
}

/// `out` becomes a copy of `input` (`ring` works in place), reusing its allocation,
/// with room for a tag after it as EVP's path leaves (a sealed chunk gets its tag
/// appended: without the room, a fresh 16 KiB buffer was reallocated to 32 KiB for
/// every chunk of a tree of small files, and its buffer then pooled as the wrong size).
fn fill(out: &mut Vec<u8>, input: &[u8]) {
    out.clear();
    out.reserve(input.len() + TAG_LEN);
    out.extend_from_slice(input);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against OpenSSL's one-shot AEAD API; a wrong tag, AAD or ciphertext leaves no
    /// output; AES-192-GCM and the block modes are not served.
    #[test]
    fn seals_as_openssl_and_opens_only_what_authenticates() {
        for (cipher, reference) in [
            (Cipher::AES_128_GCM, openssl::symm::Cipher::aes_128_gcm()),
            (Cipher::AES_256_GCM, openssl::symm::Cipher::aes_256_gcm()),
        ] {
            let key_bytes: Vec<u8> = (0..cipher.key_len() as u8).collect();
            let key = GcmKey::new(cipher, &key_bytes).unwrap().unwrap();
            let iv = [7u8; IV_LEN];
            for len in [0usize, 1, 15, 16, 17, 255, 4096 + 3] {
                let input: Vec<u8> = (0..len).map(|i| (i * 31) as u8).collect();
                let aad = b"header";
                let mut sealed = vec![0xee; 3];
                let tag = seal(&key, &iv, aad, &input, &mut sealed).unwrap();
                let mut want_tag = [0u8; TAG_LEN];
                let want = openssl::symm::encrypt_aead(
                    reference,
                    &key_bytes,
                    Some(&iv),
                    aad,
                    &input,
                    &mut want_tag,
                )
                .unwrap();
                assert_eq!((&sealed, tag), (&want, want_tag), "{cipher} {len}");
                let mut opened = vec![0xee; 9];
                open(&key, &iv, aad, &sealed, &tag, &mut opened).unwrap();
                assert_eq!(opened, input);
                let mut bad_tag = tag;
                bad_tag[15] ^= 1;
                for (aad, tag) in [(&b"header"[..], &bad_tag), (&b"Header"[..], &tag)] {
                    let mut out = vec![0xee; 9];
                    let err = open(&key, &iv, aad, &sealed, tag, &mut out).unwrap_err();
                    assert!(matches!(err, Error::AuthenticationFailed), "{err}");
                    assert!(out.is_empty());
                }
            }
        }
        assert!(GcmKey::new(Cipher::AES_192_GCM, &[0; 24]).is_none());
        // KEY_SIZES (what the probe measures) and algorithm (what runs) agree.
        for size in KeySize::ALL {
            let gcm = Cipher::new(size, crate::cipher::Mode::Gcm);
            assert_eq!(algorithm(gcm).is_some(), KEY_SIZES.contains(&size), "{gcm}");
        }
        assert!(GcmKey::new(Cipher::AES_128_CTR, &[0; 16]).is_none());
        assert!(matches!(
            GcmKey::new(Cipher::AES_128_GCM, &[0; 15]),
            Some(Err(Error::KeyLength { .. }))
        ));
    }

    /// A sealed output into a fresh buffer has room for its tag: the file format
    /// appends it, and without the room every small file's chunk was reallocated.
    #[test]
    fn a_sealed_output_has_room_for_its_tag() {
        let key = GcmKey::new(Cipher::AES_128_GCM, &[9; 16]).unwrap().unwrap();
        for len in [0usize, 16, 16 * 1024] {
            let mut out = Vec::new();
            seal(&key, &[1; IV_LEN], b"", &vec![5; len], &mut out).unwrap();
            assert_eq!(out.len(), len);
            assert!(out.capacity() >= len + TAG_LEN, "{len}: {}", out.capacity());
        }
    }
}
