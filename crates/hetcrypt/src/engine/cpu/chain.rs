//! CBC encryption of one message at a time on an EVP context that is keyed once and never re-initialised.
//!
//! OpenSSL 3.0 spends ~870 instructions in `EVP_CipherInit_ex` to set a new IV, which
//! `openssl speed` never pays and which is ~3% of a 16 KiB CBC encryption (a serial
//! chain at ~1.4 GB/s). No crate or OpenSSL call sets a CBC IV more cheaply, so this is
//! done by hand from the mode's definition (NIST SP 800-38A, 6.2): a CBC context that
//! has just encrypted a message holds its last ciphertext block `S` as the chaining
//! value, and encrypts the next block `P` as `E(P ^ S)`. Feeding it `P1 ^ IV ^ S`
//! therefore gives `E(P1 ^ IV)`, the first block of the new message under its own IV;
//! the rest of the message then chains as usual. The output is byte-identical to a
//! fresh EVP context per message (tested against OpenSSL in `cpu.rs`).

use openssl::cipher_ctx::CipherCtx;

use crate::cipher::{Mode, BLOCK_LEN};
use crate::error::Result;
use crate::job::{Job, JobOutput};

/// One keyed CBC-encryption context (padding off) and its chaining value.
pub(super) struct CbcChain {
    ctx: CipherCtx,
    /// The context's chaining value (the last ciphertext block it produced), or
    /// `None` when unknown (new, or after an error) and the next message must set its
    /// IV with a re-initialisation.
    last: Option<[u8; BLOCK_LEN]>,
}

impl CbcChain {
    /// Wraps a context keyed for CBC encryption without padding.
    pub(super) fn new(ctx: CipherCtx) -> Self {
        CbcChain { ctx, last: None }
    }

    /// Encrypts a validated CBC or CBC-PKCS#7 encryption job into `out`.
    pub(super) fn encrypt(&mut self, job: &Job, out: &mut JobOutput) -> Result<()> {
        let result = self.encrypt_chained(job, out);
        if result.is_err() {
            self.last = None;
        }
        result
    }

    fn encrypt_chained(&mut self, job: &Job, out: &mut JobOutput) -> Result<()> {
        let input = &job.input;
        let whole = input.len() / BLOCK_LEN * BLOCK_LEN;
        let pad = (job.cipher.mode == Mode::CbcPkcs7).then(|| super::pkcs7_last_block(input));
        let total = whole + pad.map_or(0, |_| BLOCK_LEN);
        out.tag = None;
        if total == 0 {
            // An empty message without padding: nothing to encrypt, the chain is kept.
            out.data.clear();
            return Ok(());
        }
        // The openssl crate wants room for one block more than each update's input.
        let room = total + BLOCK_LEN;
        if out.data.capacity() == 0 {
            out.data = vec![0; room];
        } else if out.data.len() < room {
            out.data.resize(room, 0);
        }
        let mut first = [0u8; BLOCK_LEN];
        match pad {
            Some(block) if whole == 0 => first = block,
            _ => first.copy_from_slice(&input[..BLOCK_LEN]),
        }
        match self.last {
            Some(last) => {
                for ((f, iv), s) in first.iter_mut().zip(job.iv()).zip(last) {
                    *f ^= iv ^ s;
                }
            }
            None => self.ctx.encrypt_init(None, None, Some(job.iv()))?,
        }
        let mut block_out = [0u8; 2 * BLOCK_LEN];
        self.ctx.cipher_update(&first, Some(&mut block_out))?;
        out.data[..BLOCK_LEN].copy_from_slice(&block_out[..BLOCK_LEN]);
        if whole > BLOCK_LEN {
            self.ctx
                .cipher_update(&input[BLOCK_LEN..whole], Some(&mut out.data[BLOCK_LEN..]))?;
        }
        if let Some(block) = pad.filter(|_| whole > 0) {
            self.ctx.cipher_update(&block, Some(&mut block_out))?;
            out.data[whole..total].copy_from_slice(&block_out[..BLOCK_LEN]);
        }
        out.data.truncate(total);
        let mut last = [0u8; BLOCK_LEN];
        last.copy_from_slice(&out.data[total - BLOCK_LEN..]);
        self.last = Some(last);
        Ok(())
    }
}
