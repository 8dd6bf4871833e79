//! CTR and CBC decryption block-parallel through the `aes` crate, for jobs where
//! OpenSSL 3's per-message re-initialisation costs more than the AES itself.
//!
//! Both modes are parallel over blocks: CTR encrypts independent counter blocks, CBC
//! decryption decrypts every ciphertext block independently and XORs each with the
//! block before it. The `aes` crate's backend (VAES-512 or VAES-256 with AVX-512/AVX2,
//! AES-NI, or constant-time software; chosen at run time) takes a group of
//! `ParBlocksSize` blocks per call (64 for VAES-512, 8 for AES-NI) and interleaves them.
//!
//! Why not EVP: `EVP_EncryptInit_ex` with a new IV costs ~860 instructions in OpenSSL
//! 3.0 (560 of them a provider parameter query for the IV length), and a job is always
//! a new message: one lane ran CTR and CBC decryption at 0.7–0.8 of `openssl speed`
//! through EVP, 1.1–1.2 through these loops (docs/performance.md). Why hand-written and
//! not the `ctr`/`cbc` crates: the `ctr` crate was measured slower than EVP here
//! (3.3–4.4 GB/s vs 7.6), and neither takes several messages per backend call; these
//! loops are the modes' definitions (NIST SP 800-38A 6.2 and 6.5) around the `aes`
//! crate's block API, with a cached, expanded key per lane.

use aes::cipher::inout::{InOut, InOutBuf};
use aes::cipher::typenum::Unsigned;
use aes::cipher::{
    Array, BlockCipherDecBackend, BlockCipherDecClosure, BlockCipherDecrypt, BlockCipherEncBackend,
    BlockCipherEncClosure, BlockCipherEncrypt, BlockSizeUser, ParBlocks,
};

use super::multibuf::AesKey;
use crate::cipher::BLOCK_LEN;

/// One AES block as the `aes` crate types it.
type Block = Array<u8, aes::cipher::consts::U16>;

/// Blocks per step: the VAES-512 backend's parallel width (its `ParBlocksSize`), a
/// multiple of the AES-NI (8) and software backends' widths (VAES-256's 30 is not: it
/// runs two groups of 30 and four single blocks per step), and 1 KiB of keystream or
/// output, which stays in L1 between the AES pass and the XOR pass.
const GROUP: usize = 64;

/// A lane's scratch space for CTR: two groups of counter blocks and one of keystream,
/// kept from job to job (initialising 3 KiB per job cost more than the AES of a
/// 16-byte job) and zeroized on drop (the keystream of the last job is as sensitive as
/// its plaintext).
pub(crate) struct CtrScratch {
    counters: [[Block; GROUP]; 2],
    keystream: [Block; GROUP],
}

impl CtrScratch {
    /// Zeroed scratch space, on the heap (3 KiB).
    pub(crate) fn new() -> Box<Self> {
        Box::new(CtrScratch {
            counters: [[Block::default(); GROUP]; 2],
            keystream: [Block::default(); GROUP],
        })
    }
}

impl Drop for CtrScratch {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        for group in self.counters.iter_mut().chain([&mut self.keystream]) {
            Block::slice_as_flattened_mut(group).zeroize();
        }
    }
}

/// CTR mode (NIST SP 800-38A 6.5) with a full 128-bit big-endian counter, as OpenSSL's
/// EVP CTR ciphers count: writes `input` XOR keystream into `out` (same length; a
/// partial last block uses the start of its keystream block). Encryption and
/// decryption are the same operation.
///
/// # Panics
/// If `out` is not as long as `input` (a caller bug).
pub(crate) fn ctr(
    key: &AesKey,
    iv: [u8; BLOCK_LEN],
    input: &[u8],
    out: &mut [u8],
    scratch: &mut CtrScratch,
) {
    ctr_messages(key, std::iter::once(Message { iv, input, out }), scratch);
}

/// One message of a batch: its IV (CTR: the initial counter block), input, and output
/// (as long as the input).
pub(crate) struct Message<'a> {
    /// The IV (CTR: the initial counter block).
    pub(crate) iv: [u8; BLOCK_LEN],
    /// Plaintext or ciphertext.
    pub(crate) input: &'a [u8],
    /// Where the result goes, as long as `input`.
    pub(crate) out: &'a mut [u8],
}

/// [`ctr`] on several messages under one key, inside one backend call: the backend
/// is chosen and its round keys loaded once for the lot (for small jobs that set-up
/// is a large part of the work).
///
/// # Panics
/// If a message's `out` is not as long as its `input` (a caller bug).
pub(crate) fn ctr_messages<'a>(
    key: &AesKey,
    messages: impl Iterator<Item = Message<'a>>,
    scratch: &mut CtrScratch,
) {
    let run = Ctr { messages, scratch };
    match key {
        AesKey::Aes128(k) => k.encrypt_with_backend(run),
        AesKey::Aes192(k) => k.encrypt_with_backend(run),
        AesKey::Aes256(k) => k.encrypt_with_backend(run),
    }
}

/// CBC decryption (NIST SP 800-38A 6.2) of `input`, a whole number of blocks, into
/// `out` (same length), without removing any padding.
///
/// # Panics
/// If `input` is not whole blocks or `out` is not as long (caller bugs).
pub(crate) fn cbc_decrypt(key: &AesKey, iv: [u8; BLOCK_LEN], input: &[u8], out: &mut [u8]) {
    cbc_decrypt_messages(key, std::iter::once(Message { iv, input, out }));
}

/// [`cbc_decrypt`] on several messages under one key, inside one backend call (see
/// [`ctr_messages`]).
///
/// # Panics
/// If a message's input is not whole blocks or its output is not as long (caller
/// bugs).
pub(crate) fn cbc_decrypt_messages<'a>(key: &AesKey, messages: impl Iterator<Item = Message<'a>>) {
    let run = CbcDecrypt { messages };
    match key {
        AesKey::Aes128(k) => k.decrypt_with_backend(run),
        AesKey::Aes192(k) => k.decrypt_with_backend(run),
        AesKey::Aes256(k) => k.decrypt_with_backend(run),
    }
}

/// `out = a ^ b`, byte-wise over whole slices so the compiler vectorises it (a
/// 128-bit integer XOR per block went through general registers and cost more than
/// the AES at 16 KiB).
#[inline(always)]
fn xor_into(out: &mut [u8], a: &[u8], b: &[u8]) {
    for (o, (a, b)) in out.iter_mut().zip(a.iter().zip(b)) {
        *o = a ^ b;
    }
}

/// `out ^= a`, byte-wise (see [`xor_into`]).
#[inline(always)]
fn xor_in_place(out: &mut [u8], a: &[u8]) {
    for (o, a) in out.iter_mut().zip(a) {
        *o ^= a;
    }
}

/// Writes the counter blocks `counter`, `counter + 1`, … into `blocks`, big-endian,
/// wrapping at 2^128 (OpenSSL's CTR carries out of the low 32 bits into the rest).
#[inline(always)]
fn counter_blocks(blocks: &mut [Block], counter: u128) {
    let low = counter as u64;
    if low.checked_add(blocks.len() as u64).is_some() {
        // No carry out of the low half in this run: the high half is one constant
        // and each block needs one 64-bit add (a u128 add and byte swap per block
        // cost as much as the AES).
        let high = ((counter >> 64) as u64).to_be_bytes();
        for (k, block) in blocks.iter_mut().enumerate() {
            block[..8].copy_from_slice(&high);
            block[8..].copy_from_slice(&(low + k as u64).to_be_bytes());
        }
    } else {
        for (k, block) in blocks.iter_mut().enumerate() {
            *block = Block::from(counter.wrapping_add(k as u128).to_be_bytes());
        }
    }
}

/// Encrypts `input` into `out`, one whole [`GROUP`] of blocks, in calls of the
/// backend's parallel width. Not in place: encrypting the counter blocks in place ran
/// at half the speed with the VAES-512 backend. (Separate from [`encrypt_blocks`]:
/// with the tail's code in the same loop, the loop ran at half the speed, measured,
/// not explained.)
#[inline(always)]
fn encrypt_group<B: BlockCipherEncBackend<BlockSize = aes::cipher::consts::U16>>(
    backend: &B,
    input: &[Block; GROUP],
    out: &mut [Block; GROUP],
) {
    let par = B::ParBlocksSize::USIZE;
    if !GROUP.is_multiple_of(par) {
        // A width that does not divide the group (VAES-256: 30).
        return encrypt_blocks(backend, input, out);
    }
    for (i, o) in input.chunks_exact(par).zip(out.chunks_exact_mut(par)) {
        let i: &ParBlocks<B> = i.try_into().expect("chunks_exact gives whole groups");
        let o: &mut ParBlocks<B> = o.try_into().expect("chunks_exact gives whole groups");
        backend.encrypt_par_blocks(InOut::from((i, o)));
    }
}

/// Encrypts `input` into `out` (as many blocks, fewer than a group's worth or not),
/// whole groups of the backend's parallel width at a time and the rest one by one
/// (independent blocks, so the core still overlaps them).
#[inline(always)]
fn encrypt_blocks<B: BlockCipherEncBackend<BlockSize = aes::cipher::consts::U16>>(
    backend: &B,
    input: &[Block],
    out: &mut [Block],
) {
    let par = B::ParBlocksSize::USIZE;
    let mut ins = input.chunks_exact(par);
    let mut outs = out.chunks_exact_mut(par);
    for (i, o) in (&mut ins).zip(&mut outs) {
        let i: &ParBlocks<B> = i.try_into().expect("chunks_exact gives whole groups");
        let o: &mut ParBlocks<B> = o.try_into().expect("chunks_exact gives whole groups");
        backend.encrypt_par_blocks(InOut::from((i, o)));
    }
    backend.encrypt_tail_blocks(
        InOutBuf::new(ins.remainder(), outs.into_remainder())
            .expect("input and output groups are as long"),
    );
}

/// Decrypts `input` into `out`, one whole [`GROUP`] of blocks (see [`encrypt_group`]).
#[inline(always)]
fn decrypt_group<B: BlockCipherDecBackend<BlockSize = aes::cipher::consts::U16>>(
    backend: &B,
    input: &[Block; GROUP],
    out: &mut [Block; GROUP],
) {
    let par = B::ParBlocksSize::USIZE;
    if !GROUP.is_multiple_of(par) {
        return decrypt_blocks(backend, input, out);
    }
    for (i, o) in input.chunks_exact(par).zip(out.chunks_exact_mut(par)) {
        let i: &ParBlocks<B> = i.try_into().expect("chunks_exact gives whole groups");
        let o: &mut ParBlocks<B> = o.try_into().expect("chunks_exact gives whole groups");
        backend.decrypt_par_blocks(InOut::from((i, o)));
    }
}

/// Decrypts `input` into `out` (as many blocks), as [`encrypt_blocks`] does.
#[inline(always)]
fn decrypt_blocks<B: BlockCipherDecBackend<BlockSize = aes::cipher::consts::U16>>(
    backend: &B,
    input: &[Block],
    out: &mut [Block],
) {
    let par = B::ParBlocksSize::USIZE;
    let mut ins = input.chunks_exact(par);
    let mut outs = out.chunks_exact_mut(par);
    for (i, o) in (&mut ins).zip(&mut outs) {
        let i: &ParBlocks<B> = i.try_into().expect("chunks_exact gives whole groups");
        let o: &mut ParBlocks<B> = o.try_into().expect("chunks_exact gives whole groups");
        backend.decrypt_par_blocks(InOut::from((i, o)));
    }
    backend.decrypt_tail_blocks(
        InOutBuf::new(ins.remainder(), outs.into_remainder())
            .expect("input and output groups are as long"),
    );
}

/// The CTR loop, run inside the `aes` crate's backend (chosen and keyed once per
/// batch of messages).
struct Ctr<'s, I> {
    messages: I,
    scratch: &'s mut CtrScratch,
}

impl<I> BlockSizeUser for Ctr<'_, I> {
    type BlockSize = aes::cipher::consts::U16;
}

/// Messages of at most this many blocks (64 bytes) run straight from their IV: their
/// counter and keystream blocks in a small local array the compiler keeps in
/// registers, each block through the backend's one-block call; consecutive messages
/// are independent, so the core overlaps their rounds by itself. Measured on the AMD
/// EPYC (VAES-512; issue 23, one lane, pulls of 64 jobs) against packing the counter
/// blocks of up to 64 short messages into the scratch buffer for one shared pass (the
/// path before): 16-byte jobs ~25% faster, 64-byte ones ~15%. The blocks must stay
/// out of memory: through the scratch buffer (and in one arrangement of this loop
/// whose array the compiler spilled) 64-byte jobs ran 30% slower, the counter halves
/// written as 8-byte stores and read back as 16-byte blocks, which the core cannot
/// forward (the stall that had made packing pay). Longer messages go through
/// [`ctr_message`]; packing 256-byte messages four to a VAES-512 pass ran at 2/3 and
/// 0.9 of the speed in two attempts.
const SHORT_MAX_BLOCKS: usize = 4;

/// A short message's counter and keystream blocks, on a cache line of their own. The
/// main thread's stack starts at a random 16-byte offset in each process, and where
/// the array crossed a line (the keystream is read back as one 64-byte vector) CTR at
/// 64 B ran at 2.2-2.5 GB/s instead of 3.7-4.2 on the AMD EPYC, per process.
#[repr(C, align(64))]
struct ShortKeystream([Block; SHORT_MAX_BLOCKS]);

impl<'a, I: Iterator<Item = Message<'a>>> BlockCipherEncClosure for Ctr<'_, I> {
    #[inline(always)]
    fn call<B: BlockCipherEncBackend<BlockSize = Self::BlockSize>>(self, backend: &B) {
        for message in self.messages {
            assert_eq!(
                message.input.len(),
                message.out.len(),
                "CTR output must match its input"
            );
            let len = message.input.len().div_ceil(BLOCK_LEN);
            if len == 1 {
                // The common short message (one block): its IV is its one counter.
                let mut block = Block::from(message.iv);
                backend.encrypt_block((&mut block).into());
                xor_into(message.out, message.input, &block[..message.input.len()]);
                continue;
            }
            if len <= SHORT_MAX_BLOCKS {
                let mut ks = ShortKeystream([Block::default(); SHORT_MAX_BLOCKS]);
                let ks = &mut ks.0[..len];
                counter_blocks(ks, u128::from_be_bytes(message.iv));
                for b in ks.iter_mut() {
                    backend.encrypt_block(b.into());
                }
                xor_keystream(message.out, message.input, ks);
                continue;
            }
            ctr_message(backend, message, self.scratch);
        }
    }
}

/// Bytes XORed as one piece by [`xor_keystream`]: four blocks, one AVX-512 vector
/// (64-byte messages XORed block by block ran slower than as one piece).
const XOR_WIDE: usize = 4 * BLOCK_LEN;

/// `out = input ^ keystream` for a short message: four blocks, then single blocks,
/// as fixed-size XORs (one vector instruction each; one loop over a run-time length
/// paid its set-up per message), then the partial last block byte-wise.
#[inline(always)]
fn xor_keystream(out: &mut [u8], input: &[u8], keystream: &[Block]) {
    let keystream = &Block::slice_as_flattened(keystream)[..input.len()];
    let (out, input, keystream) = xor_whole::<XOR_WIDE>(out, input, keystream);
    let (out, input, keystream) = xor_whole::<BLOCK_LEN>(out, input, keystream);
    xor_into(out, input, keystream);
}

/// `out = input ^ keystream` over the whole `N`-byte pieces of equally long slices;
/// returns what is left of each.
#[inline(always)]
fn xor_whole<'o, 'i, const N: usize>(
    out: &'o mut [u8],
    input: &'i [u8],
    keystream: &'i [u8],
) -> (&'o mut [u8], &'i [u8], &'i [u8]) {
    let (outs, out_rest) = out.as_chunks_mut::<N>();
    let (ins, in_rest) = input.as_chunks::<N>();
    let (keys, key_rest) = keystream.as_chunks::<N>();
    for ((o, i), k) in outs.iter_mut().zip(ins).zip(keys) {
        for ((o, i), k) in o.iter_mut().zip(i).zip(k) {
            *o = i ^ k;
        }
    }
    (out_rest, in_rest, key_rest)
}

/// CTR over one message with `backend`.
#[inline(always)]
fn ctr_message<B: BlockCipherEncBackend<BlockSize = aes::cipher::consts::U16>>(
    backend: &B,
    message: Message<'_>,
    scratch: &mut CtrScratch,
) {
    const STEP: usize = GROUP * BLOCK_LEN;
    // Two buffers: the next group's counter blocks are written while this group's
    // are encrypted, so the AES never loads blocks still on their way to the cache
    // (done in one buffer, that stall halved the speed).
    let CtrScratch {
        counters: buffers,
        keystream,
    } = scratch;
    let mut counter = u128::from_be_bytes(message.iv);
    let mut ins = message.input.chunks_exact(STEP);
    let mut outs = message.out.chunks_exact_mut(STEP);
    let mut current = 0;
    if ins.len() > 0 {
        counter_blocks(&mut buffers[0], counter);
        counter = counter.wrapping_add(GROUP as u128);
    }
    let remaining_groups = ins.len();
    for (n, (i, o)) in (&mut ins).zip(&mut outs).enumerate() {
        encrypt_group(backend, &buffers[current], keystream);
        if n + 1 < remaining_groups {
            counter_blocks(&mut buffers[current ^ 1], counter);
            counter = counter.wrapping_add(GROUP as u128);
        }
        xor_into(o, i, Block::slice_as_flattened(&keystream[..]));
        current ^= 1;
    }
    // Fewer than GROUP blocks left, the last maybe partial.
    let (i, o) = (ins.remainder(), outs.into_remainder());
    let blocks = i.len().div_ceil(BLOCK_LEN);
    let counters = &mut buffers[current][..blocks];
    counter_blocks(counters, counter);
    encrypt_blocks(backend, counters, &mut keystream[..blocks]);
    xor_into(o, i, Block::slice_as_flattened(&keystream[..blocks]));
}

/// The CBC decryption loop, run inside the `aes` crate's backend.
struct CbcDecrypt<I> {
    messages: I,
}

impl<I> BlockSizeUser for CbcDecrypt<I> {
    type BlockSize = aes::cipher::consts::U16;
}

impl<'a, I: Iterator<Item = Message<'a>>> BlockCipherDecClosure for CbcDecrypt<I> {
    #[inline(always)]
    fn call<B: BlockCipherDecBackend<BlockSize = Self::BlockSize>>(self, backend: &B) {
        for message in self.messages {
            assert!(
                message.input.len().is_multiple_of(BLOCK_LEN)
                    && message.input.len() == message.out.len(),
                "CBC decryption takes whole blocks into an output as long"
            );
            cbc_decrypt_message(backend, message);
        }
    }
}

/// CBC decryption of one message with `backend`.
#[inline(always)]
fn cbc_decrypt_message<B: BlockCipherDecBackend<BlockSize = aes::cipher::consts::U16>>(
    backend: &B,
    message: Message<'_>,
) {
    let (input, _) = Block::slice_as_chunks(message.input);
    let (out, _) = Block::slice_as_chunks_mut(message.out);
    // The block before the current group: the IV, then the previous ciphertext.
    let mut before = Block::from(message.iv);
    let mut ins = input.chunks_exact(GROUP);
    let mut outs = out.chunks_exact_mut(GROUP);
    for (i, o) in (&mut ins).zip(&mut outs) {
        let i: &[Block; GROUP] = i.try_into().expect("chunks_exact gives whole groups");
        let o: &mut [Block; GROUP] = o.try_into().expect("chunks_exact gives whole groups");
        decrypt_group(backend, i, o);
        unchain(&before, i, o);
        before = i[GROUP - 1];
    }
    let (i, o) = (ins.remainder(), outs.into_remainder());
    if !i.is_empty() {
        decrypt_blocks(backend, i, o);
        unchain(&before, i, o);
    }
}

/// CBC's chaining, undone on a run of decrypted blocks `out`: the first XOR `before`
/// (the block before the run), each later one XOR the ciphertext block before it.
#[inline(always)]
fn unchain(before: &Block, input: &[Block], out: &mut [Block]) {
    let out = Block::slice_as_flattened_mut(out);
    xor_in_place(&mut out[..BLOCK_LEN], before);
    xor_in_place(
        &mut out[BLOCK_LEN..],
        Block::slice_as_flattened(&input[..input.len() - 1]),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cipher::KeySize;

    fn reference(
        cipher: openssl::symm::Cipher,
        decrypt: bool,
        key: &[u8],
        iv: &[u8],
        data: &[u8],
    ) -> Vec<u8> {
        let mode = if decrypt {
            openssl::symm::Mode::Decrypt
        } else {
            openssl::symm::Mode::Encrypt
        };
        let mut c = openssl::symm::Crypter::new(cipher, mode, key, Some(iv)).unwrap();
        c.pad(false);
        let mut out = vec![0; data.len() + 16];
        let n = c.update(data, &mut out).unwrap();
        let m = c.finalize(&mut out[n..]).unwrap();
        out.truncate(n + m);
        out
    }

    fn bytes(seed: usize, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i.wrapping_mul(37) ^ seed.wrapping_mul(101)) as u8)
            .collect()
    }

    /// Lengths around the backends' group sizes (8 and 64 blocks), partial blocks and 0.
    const LENS: [usize; 16] = [
        0,
        1,
        15,
        16,
        17,
        127,
        128,
        129,
        1008,
        1024,
        1040,
        1041,
        2048,
        4095,
        4096,
        16 * 1024 + 5,
    ];

    fn keys() -> [(
        KeySize,
        Vec<u8>,
        openssl::symm::Cipher,
        openssl::symm::Cipher,
    ); 3] {
        use openssl::symm::Cipher as C;
        [
            (
                KeySize::Aes128,
                bytes(1, 16),
                C::aes_128_ctr(),
                C::aes_128_cbc(),
            ),
            (
                KeySize::Aes192,
                bytes(2, 24),
                C::aes_192_ctr(),
                C::aes_192_cbc(),
            ),
            (
                KeySize::Aes256,
                bytes(3, 32),
                C::aes_256_ctr(),
                C::aes_256_cbc(),
            ),
        ]
    }

    #[test]
    fn ctr_matches_openssl_on_every_length_and_key_size() {
        for (size, key, ctr_cipher, _) in keys() {
            let aes = AesKey::new(size, &key).unwrap();
            for len in LENS {
                let iv: [u8; 16] = bytes(len, 16).try_into().unwrap();
                let input = bytes(len + 7, len);
                let mut out = vec![0xaa; len];
                ctr(&aes, iv, &input, &mut out, &mut CtrScratch::new());
                assert_eq!(
                    out,
                    reference(ctr_cipher, false, &key, &iv, &input),
                    "{size:?} len {len}"
                );
            }
        }
    }

    /// The counter is the whole 128-bit block: it carries across the 2^32 and 2^64
    /// boundaries and wraps at 2^128, as OpenSSL's does (which the reference checks).
    #[test]
    fn ctr_counter_carries_across_32_64_and_128_bits() {
        let (size, key, ctr_cipher, _) = keys().into_iter().next().unwrap();
        let aes = AesKey::new(size, &key).unwrap();
        for boundary in [1u128 << 32, 1u128 << 64, 0] {
            // Start a few blocks before the boundary so groups and the tail cross it.
            for before in [1u128, 3, 40, 70] {
                let iv = boundary.wrapping_sub(before).to_be_bytes();
                let input = bytes(before as usize, 100 * 16 + 9);
                let mut out = vec![0; input.len()];
                ctr(&aes, iv, &input, &mut out, &mut CtrScratch::new());
                assert_eq!(
                    out,
                    reference(ctr_cipher, false, &key, &iv, &input),
                    "boundary {boundary:#x} - {before}"
                );
            }
        }
        // And explicitly: the block after all-ones is all-zeros (first keystream block
        // of a job starting at 0 equals the second of one starting at 2^128 - 1).
        let mut wrapped = vec![0; 32];
        ctr(
            &aes,
            [0xff; 16],
            &[0; 32],
            &mut wrapped,
            &mut CtrScratch::new(),
        );
        let mut zero = vec![0; 16];
        ctr(&aes, [0; 16], &[0; 16], &mut zero, &mut CtrScratch::new());
        assert_eq!(wrapped[16..], zero[..]);
    }

    #[test]
    fn cbc_decrypt_matches_openssl_on_every_whole_length() {
        for (size, key, _, cbc_cipher) in keys() {
            let aes = AesKey::new(size, &key).unwrap();
            for len in LENS.iter().map(|l| l / 16 * 16) {
                let iv: [u8; 16] = bytes(len + 1, 16).try_into().unwrap();
                let input = bytes(len + 3, len);
                let mut out = vec![0x55; len];
                cbc_decrypt(&aes, iv, &input, &mut out);
                assert_eq!(
                    out,
                    reference(cbc_cipher, true, &key, &iv, &input),
                    "{size:?} len {len}"
                );
            }
        }
    }

    /// NIST SP 800-38A F.5.1 (CTR-AES128.Encrypt) and F.2.2 (CBC-AES128.Decrypt).
    #[test]
    fn sp800_38a_vectors() {
        let hex = |s: &str| data_encoding::HEXLOWER.decode(s.as_bytes()).unwrap();
        let key = AesKey::new(KeySize::Aes128, &hex("2b7e151628aed2a6abf7158809cf4f3c")).unwrap();
        let plain = hex(concat!(
            "6bc1bee22e409f96e93d7e117393172a",
            "ae2d8a571e03ac9c9eb76fac45af8e51",
            "30c81c46a35ce411e5fbc1191a0a52ef",
            "f69f2445df4f9b17ad2b417be66c3710"
        ));
        let ctr_ct = hex(concat!(
            "874d6191b620e3261bef6864990db6ce",
            "9806f66b7970fdff8617187bb9fffdff",
            "5ae4df3edbd5d35e5b4f09020db03eab",
            "1e031dda2fbe03d1792170a0f3009cee"
        ));
        let cbc_ct = hex(concat!(
            "7649abac8119b246cee98e9b12e9197d",
            "5086cb9b507219ee95db113a917678b2",
            "73bed6b8e3c1743b7116e69e22229516",
            "3ff1caa1681fac09120eca307586e1a7"
        ));
        let mut out = vec![0; 64];
        ctr(
            &key,
            hex("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff").try_into().unwrap(),
            &plain,
            &mut out,
            &mut CtrScratch::new(),
        );
        assert_eq!(out, ctr_ct);
        cbc_decrypt(
            &key,
            hex("000102030405060708090a0b0c0d0e0f").try_into().unwrap(),
            &cbc_ct,
            &mut out,
        );
        assert_eq!(out, plain);
    }
}
