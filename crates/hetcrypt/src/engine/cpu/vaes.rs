//! Lockstep CBC encryption four chains to a 512-bit register, through VAES.
//!
//! The `aes` crate's VAES-512 backend encrypts blocks 64 at a time, but the lockstep
//! (`multibuf.rs`) advances at most [`MAX_CHAINS`] chains one block per step, so it
//! reaches the crate one 128-bit block per call: one AES-NI instruction per block and
//! round. A 512-bit VAES instruction runs four blocks' round at the issue cost of one,
//! so here 4, 8 or 16 chains go through 1, 2 or 4 ZMM registers per round.
//!
//! Written by hand because no crate interleaves several CBC chains (the `cbc` crate
//! runs one) and the `aes` crate keeps its round keys private; the key schedule is
//! FIPS-197's, with `SubWord` taken from `AESENCLAST` (constant time, no table).
//!
//! [`MAX_CHAINS`]: super::MAX_CHAINS

use std::arch::x86_64::{
    __m128i, _mm512_aesenc_epi128, _mm512_aesenclast_epi128, _mm512_broadcast_i32x4,
    _mm512_castsi128_si512, _mm512_extracti32x4_epi32, _mm512_inserti32x4, _mm512_loadu_si512,
    _mm512_setzero_si512, _mm512_storeu_si512, _mm512_ternarylogic_epi32, _mm_aesenclast_si128,
    _mm_cvtsi128_si32, _mm_loadu_si128, _mm_set1_epi32, _mm_setzero_si128, _mm_storeu_si128,
};

use zeroize::{Zeroize, ZeroizeOnDrop};

use crate::cipher::{KeySize, BLOCK_LEN};

/// Most rounds of any key size (AES-256), so most round keys less one.
const MAX_ROUNDS: usize = 14;

/// FIPS-197's round constants, one per word-group of the key schedule that needs one
/// (AES-128 uses all ten).
const RCON: [u32; 10] = [0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x1b, 0x36];

/// Whether this CPU runs the VAES-512 path (checked once by the standard library).
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("vaes")
        && std::arch::is_x86_feature_detected!("aes")
}

/// An AES encryption key schedule, zeroized on drop.
#[derive(Zeroize, ZeroizeOnDrop)]
pub(crate) struct RoundKeys {
    /// Round keys 0..=rounds, as bytes.
    keys: [[u8; BLOCK_LEN]; MAX_ROUNDS + 1],
    /// 10, 12 or 14.
    rounds: usize,
}

impl RoundKeys {
    /// The schedule of `key` for `size`, or `None` if the key's length does not match
    /// or the CPU lacks VAES-512 ([`available`]).
    pub(crate) fn new(size: KeySize, key: &[u8]) -> Option<Self> {
        if key.len() != size.key_len() || !available() {
            return None;
        }
        // SAFETY: `available()` confirmed AES-NI (and more) on this CPU.
        Some(unsafe { expand(key) })
    }
}

/// FIPS-197 section 5.2, `KeyExpansion`, with 32-bit words in little-endian order (so
/// `RotWord` is a rotation right by a byte and the round constant goes in the low byte).
#[target_feature(enable = "aes")]
fn expand(key: &[u8]) -> RoundKeys {
    let nk = key.len() / 4;
    let rounds = nk + 6;
    let mut w = [0u32; 4 * (MAX_ROUNDS + 1)];
    for (i, word) in key.chunks_exact(4).enumerate() {
        w[i] = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
    }
    for i in nk..4 * (rounds + 1) {
        let mut t = w[i - 1];
        if i % nk == 0 {
            t = sub_word(t.rotate_right(8)) ^ RCON[i / nk - 1];
        } else if nk > 6 && i % nk == 4 {
            t = sub_word(t);
        }
        w[i] = w[i - nk] ^ t;
    }
    let mut keys = [[0u8; BLOCK_LEN]; MAX_ROUNDS + 1];
    for (k, words) in keys.iter_mut().zip(w.chunks_exact(4)) {
        for (bytes, word) in k.chunks_exact_mut(4).zip(words) {
            bytes.copy_from_slice(&word.to_le_bytes());
        }
    }
    w.zeroize();
    RoundKeys { keys, rounds }
}

/// `SubWord`: the S-box on each byte of `word`. With the word in all four columns,
/// `AESENCLAST`'s `ShiftRows` moves nothing, its round key is zero, and its
/// `SubBytes` is the S-box, in constant time.
#[target_feature(enable = "aes")]
fn sub_word(word: u32) -> u32 {
    let x = _mm_aesenclast_si128(_mm_set1_epi32(word as i32), _mm_setzero_si128());
    _mm_cvtsi128_si32(x) as u32
}

/// Runs `N` chains (`N` = 4 `Z`) `len / 16` CBC steps: chain `k` XORs its next block of
/// `src[k]` into `state[k]`, encrypts it, and writes it to the same place in `dst[k]`.
///
/// # Panics
/// If `len` is not a whole number of blocks, a slice is shorter than `len`, or there
/// are fewer than `4 Z` chains (caller bugs).
pub(crate) fn run_group<const Z: usize>(
    keys: &RoundKeys,
    state: &mut [[u8; BLOCK_LEN]],
    src: &[&[u8]],
    dst: &mut [&mut [u8]],
    len: usize,
) {
    let n = 4 * Z;
    assert!(len.is_multiple_of(BLOCK_LEN) && state.len() >= n && src.len() >= n && dst.len() >= n);
    assert!(src[..n].iter().all(|s| s.len() >= len) && dst[..n].iter().all(|d| d.len() >= len));
    assert!(available(), "RoundKeys::new checked the CPU");
    // SAFETY: the CPU has AVX-512F, VAES and AES-NI (asserted above), and every slice
    // holds `len` bytes (asserted above), which is all `lockstep` reads or writes.
    unsafe { lockstep::<Z>(keys, &mut state[..n], &src[..n], &mut dst[..n], len) }
}

/// The loop of [`run_group`], compiled for VAES-512.
///
/// # Safety
/// The CPU must have AVX-512F, VAES and AES-NI; `state`, `src` and `dst` must hold
/// `4 Z` entries and each `src`/`dst` slice at least `len` bytes.
#[target_feature(enable = "avx512f,vaes,aes")]
unsafe fn lockstep<const Z: usize>(
    keys: &RoundKeys,
    state: &mut [[u8; BLOCK_LEN]],
    src: &[&[u8]],
    dst: &mut [&mut [u8]],
    len: usize,
) {
    let rounds = keys.rounds;
    // SAFETY (every load and store below): the pointers are into slices of at least
    // `len` bytes (the caller's contract), at offsets `at < len` of whole blocks.
    let mut rk = [_mm512_setzero_si512(); MAX_ROUNDS + 1];
    for (r, k) in rk.iter_mut().enumerate().take(rounds + 1) {
        *k = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(keys.keys[r].as_ptr().cast()) });
    }
    // Four chains' states to a register, in chain order.
    let mut s = [_mm512_setzero_si512(); Z];
    for (z, sz) in s.iter_mut().enumerate() {
        *sz = unsafe { _mm512_loadu_si512(state[4 * z..4 * z + 4].as_ptr().cast()) };
    }
    let load = |k: usize, at: usize| -> __m128i {
        unsafe { _mm_loadu_si128(src[k].as_ptr().add(at).cast()) }
    };
    for at in (0..len).step_by(BLOCK_LEN) {
        for (z, sz) in s.iter_mut().enumerate() {
            let k = 4 * z;
            let mut x = _mm512_castsi128_si512(load(k, at));
            x = _mm512_inserti32x4::<1>(x, load(k + 1, at));
            x = _mm512_inserti32x4::<2>(x, load(k + 2, at));
            x = _mm512_inserti32x4::<3>(x, load(k + 3, at));
            // state ^ block ^ round key 0 in one instruction (0x96: three-way XOR).
            *sz = _mm512_ternarylogic_epi32::<0x96>(*sz, x, rk[0]);
        }
        for key in &rk[1..rounds] {
            for sz in s.iter_mut() {
                *sz = _mm512_aesenc_epi128(*sz, *key);
            }
        }
        for (z, sz) in s.iter_mut().enumerate() {
            *sz = _mm512_aesenclast_epi128(*sz, rk[rounds]);
            let k = 4 * z;
            unsafe {
                _mm_storeu_si128(
                    dst[k].as_mut_ptr().add(at).cast(),
                    _mm512_extracti32x4_epi32::<0>(*sz),
                );
                _mm_storeu_si128(
                    dst[k + 1].as_mut_ptr().add(at).cast(),
                    _mm512_extracti32x4_epi32::<1>(*sz),
                );
                _mm_storeu_si128(
                    dst[k + 2].as_mut_ptr().add(at).cast(),
                    _mm512_extracti32x4_epi32::<2>(*sz),
                );
                _mm_storeu_si128(
                    dst[k + 3].as_mut_ptr().add(at).cast(),
                    _mm512_extracti32x4_epi32::<3>(*sz),
                );
            }
        }
    }
    for (z, sz) in s.iter().enumerate() {
        unsafe { _mm512_storeu_si512(state[4 * z..4 * z + 4].as_mut_ptr().cast(), *sz) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// FIPS-197 Appendix A's key expansions: the last round key of each key size.
    #[test]
    fn key_schedule_matches_fips_197_appendix_a() {
        if !available() {
            eprintln!("skipped: this CPU has no VAES-512");
            return;
        }
        let cases = [
            (
                KeySize::Aes128,
                "2b7e151628aed2a6abf7158809cf4f3c",
                "d014f9a8c9ee2589e13f0cc8b6630ca6",
            ),
            (
                KeySize::Aes192,
                "8e73b0f7da0e6452c810f32b809079e562f8ead2522c6b7b",
                "e98ba06f448c773c8ecc720401002202",
            ),
            (
                KeySize::Aes256,
                "603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4",
                "fe4890d1e6188d0b046df344706c631e",
            ),
        ];
        for (size, key, last) in cases {
            let rk = RoundKeys::new(size, &hex(key)).unwrap();
            assert_eq!(rk.rounds, size.key_len() / 4 + 6);
            assert_eq!(rk.keys[rk.rounds].to_vec(), hex(last), "{size:?}");
            assert_eq!(rk.keys[0].to_vec(), hex(key)[..16].to_vec());
        }
    }

    /// The path is offered exactly where the CPU has AVX-512F, VAES and AES-NI (as the
    /// standard library reports them): there a key of the right length gets a schedule,
    /// elsewhere every key is refused and lockstep CBC runs through the `aes` crate.
    /// On a CPU with all three (the hosts so far) a `false` here would silently route
    /// every lockstep group to the slower path, with the same bytes.
    #[test]
    fn the_path_is_offered_exactly_where_the_cpu_has_vaes_512() {
        let has = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("vaes")
            && std::arch::is_x86_feature_detected!("aes");
        assert_eq!(available(), has);
        for size in [KeySize::Aes128, KeySize::Aes192, KeySize::Aes256] {
            let key = vec![7u8; size.key_len()];
            assert_eq!(RoundKeys::new(size, &key).is_some(), has, "{size:?}");
            assert!(RoundKeys::new(size, &key[1..]).is_none(), "{size:?}");
        }
    }
}
