//! Large buffers (seed 003): one big CTR job, or one CBC decryption, cut into
//! block-aligned sub-jobs that all lanes run at once, and their outputs joined back —
//! byte-identical to running the job whole.
//!
//! - **CTR**: sub-job *k* starts `offset_k` blocks in, with counter block
//!   `IV + offset_k` (big-endian, carried across all 128 bits and wrapping at 2^128, as
//!   OpenSSL's and the kernel's `ctr(aes)` increment it). Only the last sub-job may end
//!   in a partial block.
//! - **CBC decryption**: plaintext block *i* is `D(C_i) xor C_(i-1)`, so sub-job *k*'s
//!   IV is the ciphertext block just before it. With PKCS#7, only the last sub-job
//!   strips the padding; the others are plain CBC.
//! - **Not splittable** (an [`Error::CannotSplit`]): CBC encryption (each block chains
//!   on the previous ciphertext block, which is the serial dependency that makes CBC
//!   encryption slow) and GCM (the tag authenticates the whole message; a split would
//!   have to recombine GHASH, which no engine exposes). Such jobs are best run whole,
//!   many at a time, on different lanes.
//!
//! Each sub-job owns a copy of its slice of the input, so a split job briefly needs twice
//! its size in memory.

use crate::cipher::{Cipher, Direction, Mode, BLOCK_LEN};
use crate::dispatch::Dispatcher;
use crate::error::{Error, Result};
use crate::job::{Job, JobOutput};
use crate::policy::Policy;
use crate::report::Report;

/// The output of a split job and the report of the batch its parts ran in.
#[derive(Debug)]
pub struct SplitResult {
    /// The joined output, as the job run whole would have produced it.
    pub output: JobOutput,
    /// What the batch of sub-jobs did (per engine and lane: how many parts each ran).
    pub report: Report,
}

/// Whether `job` can be split (see the module documentation); the reason if not.
pub fn check_splittable(job: &Job) -> Result<()> {
    let reason = match (job.cipher.mode, job.direction) {
        (Mode::Ctr, _) | (Mode::Cbc | Mode::CbcPkcs7, Direction::Decrypt) => return Ok(()),
        (Mode::Cbc | Mode::CbcPkcs7, Direction::Encrypt) => {
            "each CBC ciphertext block depends on the previous one"
        }
        (Mode::Gcm, _) => "the GCM tag covers the whole message",
    };
    Err(Error::CannotSplit {
        cipher: job.cipher,
        direction: job.direction,
        reason,
    })
}

/// The CTR counter block `blocks` blocks after `iv`: a 128-bit big-endian add that
/// carries through every byte and wraps at 2^128. (`u128` arithmetic says this exactly;
/// no counter crate needed.)
pub fn ctr_advance(iv: [u8; BLOCK_LEN], blocks: u128) -> [u8; BLOCK_LEN] {
    u128::from_be_bytes(iv).wrapping_add(blocks).to_be_bytes()
}

/// Cuts `job` into at most `parts` block-aligned sub-jobs of nearly equal size, in
/// order (`parts` is raised to 1 and lowered to the number of blocks). An empty job
/// stays whole.
pub fn split(job: &Job, parts: usize) -> Result<Vec<Job>> {
    job.validate()?;
    check_splittable(job)?;
    let len = job.len();
    let blocks = len.div_ceil(BLOCK_LEN);
    let parts = parts.clamp(1, blocks.max(1));
    if parts == 1 {
        return Ok(vec![job.clone()]);
    }
    let iv: [u8; BLOCK_LEN] = job
        .iv()
        .try_into()
        .expect("validated CTR and CBC jobs carry a 16-byte IV");
    // The first `extra` parts get one block more than the others.
    let (base, extra) = (blocks / parts, blocks % parts);
    let mut out = Vec::with_capacity(parts);
    let mut first_block = 0;
    for k in 0..parts {
        let n = base + usize::from(k < extra);
        let start = first_block * BLOCK_LEN;
        let end = ((first_block + n) * BLOCK_LEN).min(len);
        let last = k + 1 == parts;
        let (cipher, sub_iv) = match job.cipher.mode {
            Mode::Ctr => (job.cipher, ctr_advance(iv, first_block as u128)),
            _ => {
                // CBC decryption: chain from the ciphertext block before this part;
                // only the last part removes PKCS#7 padding.
                let sub_iv = match start {
                    0 => iv,
                    _ => job.input[start - BLOCK_LEN..start]
                        .try_into()
                        .expect("a slice of one block"),
                };
                let cipher = if last {
                    job.cipher
                } else {
                    Cipher::new(job.cipher.key_size, Mode::Cbc)
                };
                (cipher, sub_iv)
            }
        };
        out.push(Job::new(
            cipher,
            job.direction,
            job.key,
            sub_iv,
            job.input[start..end].to_vec(),
        ));
        first_block += n;
    }
    Ok(out)
}

/// Joins the sub-jobs' outputs, in order, into the whole job's output; the first
/// sub-job error is the job's error.
pub fn join(outputs: impl IntoIterator<Item = Result<JobOutput>>) -> Result<JobOutput> {
    let mut joined = JobOutput::default();
    for out in outputs {
        joined.data.extend_from_slice(&out?.data);
    }
    Ok(joined)
}

/// Splits `job` into `parts` sub-jobs, runs them on `dispatcher` under `policy` and
/// joins the result.
pub fn run_split(
    dispatcher: &Dispatcher,
    job: &Job,
    parts: usize,
    policy: &dyn Policy,
) -> Result<SplitResult> {
    let sub = split(job, parts)?;
    let batch = dispatcher.run(&sub, policy)?;
    Ok(SplitResult {
        output: join(batch.outputs)?,
        report: batch.report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::KeyId;

    #[test]
    fn counter_carries_through_all_128_bits_and_wraps() {
        let max = [0xff; 16];
        assert_eq!(ctr_advance(max, 1), [0; 16]);
        assert_eq!(ctr_advance(max, 3)[15], 2);
        let mut low_full = [0u8; 16];
        low_full[8..].fill(0xff);
        let mut want = [0u8; 16];
        want[7] = 1;
        assert_eq!(ctr_advance(low_full, 1), want, "carry from the low 64 bits");
        let mut ctr32_full = [0u8; 16];
        ctr32_full[12..].fill(0xff);
        let mut want = [0u8; 16];
        want[11] = 1;
        assert_eq!(
            ctr_advance(ctr32_full, 1),
            want,
            "carry from the low 32 bits"
        );
    }

    fn job(cipher: Cipher, direction: Direction, len: usize) -> Job {
        let input = (0..len).map(|i| i as u8).collect();
        Job::new(cipher, direction, KeyId(0), [0xfe; 16], input)
    }

    #[test]
    fn parts_are_block_aligned_cover_the_input_and_chain_their_ivs() {
        for len in [16, 17, 160, 1000, 4096] {
            for parts in [1, 2, 3, 7, 1000] {
                let j = job(Cipher::AES_128_CTR, Direction::Encrypt, len);
                let sub = split(&j, parts).unwrap();
                assert!(sub.len() <= parts && sub.len() <= len.div_ceil(16));
                let mut offset = 0;
                for (k, s) in sub.iter().enumerate() {
                    if k + 1 < sub.len() {
                        assert_eq!(s.len() % 16, 0, "len {len} parts {parts}");
                    }
                    assert_eq!(s.input, j.input[offset..offset + s.len()]);
                    let iv = ctr_advance([0xfe; 16], (offset / 16) as u128);
                    assert_eq!(s.iv(), iv);
                    offset += s.len();
                }
                assert_eq!(offset, len);
            }
        }
        let j = job(Cipher::AES_256_CBC_PKCS7, Direction::Decrypt, 160);
        let sub = split(&j, 3).unwrap();
        assert_eq!(sub.iter().map(Job::len).collect::<Vec<_>>(), [64, 48, 48]);
        assert_eq!(sub[1].iv(), &j.input[48..64]);
        assert_eq!(sub[2].iv(), &j.input[96..112]);
        assert_eq!(sub[0].cipher, Cipher::AES_256_CBC);
        assert_eq!(sub[2].cipher, Cipher::AES_256_CBC_PKCS7);
    }

    #[test]
    fn empty_and_unsplittable_jobs() {
        let empty = job(Cipher::AES_128_CTR, Direction::Encrypt, 0);
        assert_eq!(split(&empty, 4).unwrap(), vec![empty]);
        for (cipher, direction) in [
            (Cipher::AES_128_CBC, Direction::Encrypt),
            (Cipher::AES_128_CBC_PKCS7, Direction::Encrypt),
        ] {
            assert!(matches!(
                split(&job(cipher, direction, 64), 2),
                Err(Error::CannotSplit { .. })
            ));
        }
        let gcm = Job::with_iv(
            Cipher::AES_128_GCM,
            Direction::Encrypt,
            KeyId(0),
            &[0; 12],
            vec![0; 64],
        )
        .unwrap();
        assert!(matches!(split(&gcm, 2), Err(Error::CannotSplit { .. })));
        let ragged = job(Cipher::AES_128_CBC, Direction::Decrypt, 20);
        assert!(matches!(split(&ragged, 2), Err(Error::InputLength { .. })));
    }
}
