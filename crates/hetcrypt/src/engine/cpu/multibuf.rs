//! Multi-buffer CBC encryption: several independent CBC chains in lockstep through AES-NI.
//!
//! CBC encryption is a serial chain — block `i` needs the ciphertext of block `i - 1` —
//! so one message at a time leaves the AES unit waiting out each instruction's latency
//! (about 1.2 GB/s on our host, in OpenSSL as in every library). Blocks of *different*
//! messages are independent: here up to [`MAX_CHAINS`] messages advance one block per
//! step, and each step hands all their blocks to the `aes` crate's backend at once so
//! the CPU overlaps them. Chains of different lengths drop out as they finish and the
//! next waiting message takes their place. The output is plain CBC, byte-identical to
//! OpenSSL's.
//!
//! Hand-written loop, not a crate: no RustCrypto mode crate interleaves *several* CBC
//! messages (the `cbc` crate runs one chain). Groups of chains run either through the
//! `aes` crate's backend one block per call (AES-NI, or its software AES), or, where
//! the CPU has VAES-512 and the width probe measured it faster, four chains to a
//! 512-bit register through `vaes.rs` (about 1.7-1.9x the crate's path on the AMD
//! EPYC host).

use aes::cipher::typenum::Unsigned;
use aes::cipher::{
    Array, BlockCipherEncBackend, BlockCipherEncClosure, BlockCipherEncrypt, BlockSizeUser, KeyInit,
};
use aes::{Aes128, Aes192, Aes256};

use super::vaes::{self, RoundKeys as VaesKeys};
use crate::cipher::{KeySize, BLOCK_LEN};
use crate::job::JobOutput;

/// Most chains one lockstep run can hold. Sixteen is past the point where the AES
/// unit is saturated on current x86 cores (4–8 chains cover its latency), and keeps
/// the per-step state (16 blocks, 16 slices) in a few cache lines.
pub const MAX_CHAINS: usize = 16;

/// One AES block as the `aes` crate types it.
type Block = Array<u8, aes::cipher::consts::U16>;

/// An expanded AES key, zeroized on drop (the `aes` crate's `zeroize` feature).
pub(crate) enum AesKey {
    /// AES-128.
    Aes128(Aes128),
    /// AES-192.
    Aes192(Aes192),
    /// AES-256.
    Aes256(Aes256),
}

impl AesKey {
    /// Expands `key` for `size`; `None` if its length does not match.
    pub(crate) fn new(size: KeySize, key: &[u8]) -> Option<Self> {
        Some(match size {
            KeySize::Aes128 => AesKey::Aes128(Aes128::new_from_slice(key).ok()?),
            KeySize::Aes192 => AesKey::Aes192(Aes192::new_from_slice(key).ok()?),
            KeySize::Aes256 => AesKey::Aes256(Aes256::new_from_slice(key).ok()?),
        })
    }
}

/// One CBC message to encrypt: its whole input blocks, then an optional last block
/// (the PKCS#7-padded tail, built by the caller), written to `outs[out]`.
pub(crate) struct Chain<'a> {
    /// Input bytes, a whole number of blocks.
    pub(crate) blocks: &'a [u8],
    /// Empty, or one block encrypted after `blocks` (the padded tail).
    pub(crate) last: &'a [u8],
    /// The IV.
    pub(crate) iv: [u8; BLOCK_LEN],
    /// Index of the output to fill.
    pub(crate) out: usize,
}

/// Encrypts every chain `chains` yields under `key`, `width` (at most [`MAX_CHAINS`])
/// at a time, each into `outs[chain.out]` (cleared first; its tag set to `None`).
///
/// # Panics
/// If a chain's `blocks` is not a whole number of blocks, its `last` is neither empty
/// nor one block, or its `out` is outside `outs` (caller bugs).
pub(crate) fn encrypt_cbc<'a>(
    key: &AesKey,
    vaes: Option<&VaesKeys>,
    width: usize,
    chains: impl Iterator<Item = Chain<'a>>,
    outs: &mut [JobOutput],
) {
    let run = Lockstep {
        vaes,
        width: width.clamp(1, MAX_CHAINS),
        chains,
        outs,
    };
    match key {
        AesKey::Aes128(k) => k.encrypt_with_backend(run),
        AesKey::Aes192(k) => k.encrypt_with_backend(run),
        AesKey::Aes256(k) => k.encrypt_with_backend(run),
    }
}

/// The lockstep loop, run inside the `aes` crate's backend (so the backend is chosen
/// and its round keys loaded once per batch, not per block).
struct Lockstep<'o, 'k, I> {
    /// VAES-512 round keys where groups of four or more chains run through `vaes.rs`.
    vaes: Option<&'k VaesKeys>,
    width: usize,
    chains: I,
    outs: &'o mut [JobOutput],
}

impl<I> BlockSizeUser for Lockstep<'_, '_, I> {
    type BlockSize = aes::cipher::consts::U16;
}

impl<'a, I: Iterator<Item = Chain<'a>>> BlockCipherEncClosure for Lockstep<'_, '_, I> {
    #[inline(always)]
    fn call<B: BlockCipherEncBackend<BlockSize = Self::BlockSize>>(mut self, backend: &B) {
        // Active chains live in slots 0..n: running CBC state (IV, then the last
        // ciphertext block), the input still to encrypt, the padded tail, the output
        // buffer (taken out of `outs` while the chain runs, sized in advance so each
        // step is a plain copy), how much of it is written, and where it goes back.
        let mut state = [Block::default(); MAX_CHAINS];
        let mut src: [&[u8]; MAX_CHAINS] = [&[]; MAX_CHAINS];
        let mut last: [&[u8]; MAX_CHAINS] = [&[]; MAX_CHAINS];
        let mut dst: [Vec<u8>; MAX_CHAINS] = Default::default();
        let mut written = [0usize; MAX_CHAINS];
        let mut out = [0usize; MAX_CHAINS];
        let mut n = 0;
        loop {
            // Fill free slots with waiting chains.
            while n < self.width {
                let Some(chain) = self.chains.next() else {
                    break;
                };
                assert!(chain.blocks.len() % BLOCK_LEN == 0 && chain.last.len() % BLOCK_LEN == 0);
                let total = chain.blocks.len() + chain.last.len();
                let slot = &mut self.outs[chain.out];
                slot.tag = None;
                let mut buf = std::mem::take(&mut slot.data);
                if buf.capacity() < total {
                    buf = vec![0; total]; // one zeroed allocation
                } else {
                    // Every byte is overwritten: zero only what the buffer grows by
                    // (a pass over 16 KiB costs a quarter of encrypting it).
                    buf.truncate(total);
                    buf.resize(total, 0);
                }
                if total == 0 {
                    slot.data = buf; // An empty message: empty output, nothing to run.
                    continue;
                }
                (src[n], last[n]) = if chain.blocks.is_empty() {
                    (chain.last, &[][..])
                } else {
                    (chain.blocks, chain.last)
                };
                state[n] = Block::from(chain.iv);
                dst[n] = buf;
                written[n] = 0;
                out[n] = chain.out;
                n += 1;
            }
            if n == 0 {
                return;
            }
            // Run every active chain for as many steps as the shortest has blocks, so
            // the inner loop checks no chain's end.
            let steps = src[..n].iter().map(|s| s.len()).min().unwrap_or(0) / BLOCK_LEN;
            // The active chains in groups of fixed sizes (16, 8, 4, 2, 1), each run
            // with its width known at compile time: the loops unroll and the chains'
            // states stay in registers (with a run-time width they went through
            // memory on every step, which cost a third of the speed).
            let mut first = 0;
            while first < n {
                let rest = n - first;
                let (state, src, dst, written) = (
                    &mut state[first..n],
                    &src[first..n],
                    &mut dst[first..n],
                    &written[first..n],
                );
                first += match (rest, self.vaes) {
                    (16.., Some(k)) => run_vaes::<4>(k, state, src, dst, written, steps),
                    (8.., Some(k)) => run_vaes::<2>(k, state, src, dst, written, steps),
                    (4.., Some(k)) => run_vaes::<1>(k, state, src, dst, written, steps),
                    (16.., None) => run_group::<B, 16>(backend, state, src, dst, written, steps),
                    (8.., None) => run_group::<B, 8>(backend, state, src, dst, written, steps),
                    (4.., None) => run_group::<B, 4>(backend, state, src, dst, written, steps),
                    (2.., _) => run_group::<B, 2>(backend, state, src, dst, written, steps),
                    _ => run_group::<B, 1>(backend, state, src, dst, written, steps),
                };
            }
            // Advance; a chain out of input goes on with its tail or leaves.
            let mut i = 0;
            while i < n {
                src[i] = &src[i][steps * BLOCK_LEN..];
                written[i] += steps * BLOCK_LEN;
                if !src[i].is_empty() {
                    i += 1;
                } else if !last[i].is_empty() {
                    src[i] = std::mem::take(&mut last[i]);
                    i += 1;
                } else {
                    self.outs[out[i]].data = std::mem::take(&mut dst[i]);
                    n -= 1;
                    state.swap(i, n);
                    src.swap(i, n);
                    last.swap(i, n);
                    dst.swap(i, n);
                    written.swap(i, n);
                    out.swap(i, n);
                }
            }
        }
    }
}

/// Runs the first `N` chains for `steps` CBC steps: each step XORs every chain's next
/// input block into its state, encrypts the `N` states together and copies them out.
/// Returns `N`.
#[inline(always)]
fn run_group<B: BlockCipherEncBackend<BlockSize = aes::cipher::consts::U16>, const N: usize>(
    backend: &B,
    state: &mut [Block],
    src: &[&[u8]],
    dst: &mut [Vec<u8>],
    written: &[usize],
    steps: usize,
) -> usize {
    let len = steps * BLOCK_LEN;
    let mut st: [Block; N] = std::array::from_fn(|k| state[k]);
    let input: [&[u8]; N] = std::array::from_fn(|k| &src[k][..len]);
    let mut outs = dst.iter_mut().zip(written);
    let mut output: [&mut [u8]; N] = std::array::from_fn(|_| {
        let (d, &w) = outs.next().expect("a group never outnumbers the chains");
        &mut d[w..w + len]
    });
    for at in (0..len).step_by(BLOCK_LEN) {
        for (s, i) in st.iter_mut().zip(&input) {
            let p: [u8; BLOCK_LEN] = i[at..at + BLOCK_LEN]
                .try_into()
                .expect("a slice of BLOCK_LEN bytes");
            *s = Block::from((u128::from_ne_bytes(s.0) ^ u128::from_ne_bytes(p)).to_ne_bytes());
        }
        encrypt_all(backend, &mut st);
        for (s, o) in st.iter().zip(output.iter_mut()) {
            o[at..at + BLOCK_LEN].copy_from_slice(s);
        }
    }
    state[..N].copy_from_slice(&st);
    N
}

/// [`run_group`] for `4 Z` chains through VAES-512 (`vaes.rs`). Returns `4 Z`.
#[inline(always)]
fn run_vaes<const Z: usize>(
    keys: &VaesKeys,
    state: &mut [Block],
    src: &[&[u8]],
    dst: &mut [Vec<u8>],
    written: &[usize],
    steps: usize,
) -> usize {
    let n = 4 * Z;
    let len = steps * BLOCK_LEN;
    let mut st = [[0u8; BLOCK_LEN]; MAX_CHAINS];
    for (s, b) in st.iter_mut().zip(&state[..n]) {
        *s = b.0;
    }
    let mut outs = dst.iter_mut().zip(written);
    let mut output: [&mut [u8]; MAX_CHAINS] = std::array::from_fn(|_| match outs.next() {
        Some((d, &w)) => &mut d[w..w + len],
        None => &mut [][..],
    });
    vaes::run_group::<Z>(keys, &mut st[..n], &src[..n], &mut output[..n], len);
    for (b, s) in state[..n].iter_mut().zip(&st) {
        *b = Block::from(*s);
    }
    n
}

/// Encrypts `N` independent blocks in place: through the backend's interleaved path
/// when `N` is a multiple of its parallel width (AES-NI: 8), else one call per block —
/// each independent of the others, so with `N` known at compile time the calls unroll
/// and the core overlaps them all the same (the VAES backend's width, 64, is more
/// chains than a lane runs).
#[inline(always)]
fn encrypt_all<B: BlockCipherEncBackend<BlockSize = aes::cipher::consts::U16>, const N: usize>(
    backend: &B,
    blocks: &mut [Block; N],
) {
    let par = B::ParBlocksSize::USIZE;
    if par > 1 && N.is_multiple_of(par) {
        for group in blocks.chunks_exact_mut(par) {
            backend.encrypt_par_blocks_inplace(
                group.try_into().expect("chunks_exact gives whole groups"),
            );
        }
    } else {
        for b in blocks.iter_mut() {
            backend.encrypt_block_inplace(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic test bytes (a xorshift stream), so a failure reproduces.
    fn bytes(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Runs `inputs` through the lockstep at `width`, on the crate's backend or VAES.
    fn run(
        size: KeySize,
        key: &[u8],
        inputs: &[Vec<u8>],
        width: usize,
        vaes: bool,
    ) -> Vec<Vec<u8>> {
        let aes = AesKey::new(size, key).unwrap();
        let rk = vaes.then(|| VaesKeys::new(size, key).unwrap());
        let mut outs = vec![JobOutput::default(); inputs.len()];
        let chains = inputs.iter().enumerate().map(|(k, input)| Chain {
            blocks: input,
            last: &[],
            iv: [k as u8; BLOCK_LEN],
            out: k,
        });
        encrypt_cbc(&aes, rk.as_ref(), width, chains, &mut outs);
        outs.into_iter().map(|o| o.data).collect()
    }

    #[test]
    fn vaes_lockstep_matches_the_crates_at_every_width_and_key_size() {
        if !vaes::available() {
            eprintln!("skipped: this CPU has no VAES-512");
            return;
        }
        for size in KeySize::ALL {
            let key = bytes(size.key_len() as u64, size.key_len());
            // 37 chains of 0..=40 blocks: groups of 16, 8, 4, 2 and 1 all run, and
            // chains leave and join mid-run.
            let inputs: Vec<Vec<u8>> = (0..37)
                .map(|k| bytes(k + 100, (k as usize * 7 % 41) * BLOCK_LEN))
                .collect();
            for width in [4, 8, 16] {
                let want = run(size, &key, &inputs, width, false);
                assert_eq!(
                    run(size, &key, &inputs, width, true),
                    want,
                    "{size:?} width {width}"
                );
            }
        }
    }

    /// An output with room for the message is written in place (its capacity exactly
    /// the message, or more), one without gets a buffer of its own; the bytes agree.
    #[test]
    fn an_output_with_room_keeps_its_allocation() {
        let key = [7u8; 16];
        let aes = AesKey::new(KeySize::Aes128, &key).unwrap();
        let input = bytes(1, 4 * BLOCK_LEN);
        let want = run(
            KeySize::Aes128,
            &key,
            std::slice::from_ref(&input),
            4,
            false,
        );
        for capacity in [input.len(), 2 * input.len(), 1] {
            let mut outs = vec![JobOutput {
                data: Vec::with_capacity(capacity),
                tag: Some([1; 16]),
            }];
            let at = outs[0].data.as_ptr();
            let chain = Chain {
                blocks: &input,
                last: &[],
                iv: [0; BLOCK_LEN],
                out: 0,
            };
            encrypt_cbc(&aes, None, 4, std::iter::once(chain), &mut outs);
            assert_eq!(outs[0].data, want[0], "{capacity}");
            assert_eq!(outs[0].tag, None);
            assert_eq!(
                outs[0].data.as_ptr() == at,
                capacity >= input.len(),
                "{capacity}"
            );
        }
    }
}
