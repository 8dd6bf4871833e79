//! The `cpu` engine: OpenSSL EVP in software (AES-NI where the CPU has it).

use std::collections::HashMap;
use std::sync::Arc;

use openssl::cipher::CipherRef;
use openssl::cipher_ctx::CipherCtx;

use crate::cipher::{Cipher, Direction, KeySize, Mode};
use crate::engine::{CipherDriver, Engine, EngineInfo, EngineKind, EngineRef, Lane};
use crate::error::{Error, Result};
use crate::job::{Job, JobOutput, TAG_LEN};
use crate::key::{KeyId, KeyStore};

/// The OpenSSL cipher for one of ours.
fn evp_cipher(cipher: Cipher) -> &'static CipherRef {
    use openssl::cipher::Cipher as C;
    match (cipher.key_size, cipher.mode) {
        (KeySize::Aes128, Mode::Cbc | Mode::CbcPkcs7) => C::aes_128_cbc(),
        (KeySize::Aes192, Mode::Cbc | Mode::CbcPkcs7) => C::aes_192_cbc(),
        (KeySize::Aes256, Mode::Cbc | Mode::CbcPkcs7) => C::aes_256_cbc(),
        (KeySize::Aes128, Mode::Ctr) => C::aes_128_ctr(),
        (KeySize::Aes192, Mode::Ctr) => C::aes_192_ctr(),
        (KeySize::Aes256, Mode::Ctr) => C::aes_256_ctr(),
        (KeySize::Aes128, Mode::Gcm) => C::aes_128_gcm(),
        (KeySize::Aes192, Mode::Gcm) => C::aes_192_gcm(),
        (KeySize::Aes256, Mode::Gcm) => C::aes_256_gcm(),
    }
}

/// Software AES through OpenSSL's EVP interface; one lane per thread.
#[derive(Clone, Debug)]
pub struct CpuEngine {
    name: String,
    lanes: usize,
}

impl Default for CpuEngine {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuEngine {
    /// A `cpu` engine with one lane per core available to this process.
    pub fn new() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_lanes(cores)
    }

    /// A `cpu` engine with `lanes` lanes (at least one).
    pub fn with_lanes(lanes: usize) -> Self {
        CpuEngine {
            name: "cpu".to_string(),
            lanes: lanes.max(1),
        }
    }

    /// Renames the engine (to put two `cpu` engines in one dispatcher, e.g. in tests).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Wraps the engine for a dispatcher.
    pub fn into_engine(self) -> EngineRef {
        Arc::new(self)
    }
}

impl Engine for CpuEngine {
    fn name(&self) -> &str {
        &self.name
    }

    fn info(&self) -> EngineInfo {
        let version = openssl::version::version();
        EngineInfo {
            name: self.name.clone(),
            kind: EngineKind::Cpu,
            lanes: self.lanes,
            ciphers: Cipher::all()
                .map(|cipher| CipherDriver {
                    cipher,
                    driver: format!(
                        "{} EVP {}",
                        version,
                        evp_cipher(cipher).nid().short_name().unwrap_or("?")
                    ),
                    priority: None,
                    module: None,
                    is_async: None,
                })
                .collect(),
        }
    }

    fn lanes(&self) -> usize {
        self.lanes
    }

    fn supports(&self, _cipher: Cipher, _direction: Direction) -> bool {
        true
    }

    fn open_lane(&self, _index: usize) -> Result<Box<dyn Lane>> {
        Ok(Box::new(CpuLane::default()))
    }
}

/// One `cpu` lane: a cache of keyed EVP contexts, re-initialised with only the IV per
/// job so small jobs do not pay for a key schedule.
#[derive(Default)]
pub struct CpuLane {
    contexts: HashMap<(KeyId, Cipher, Direction), CipherCtx>,
}

impl CpuLane {
    /// The keyed context for this job, created on first use.
    fn context(&mut self, job: &Job, keys: &KeyStore) -> Result<&mut CipherCtx> {
        use std::collections::hash_map::Entry;
        match self.contexts.entry((job.key, job.cipher, job.direction)) {
            Entry::Occupied(e) => Ok(e.into_mut()),
            Entry::Vacant(e) => {
                let ctx = keys.with_key(job.key, |key| {
                    keyed_context(job.cipher, job.direction, key.as_bytes())
                })??;
                Ok(e.insert(ctx))
            }
        }
    }
}

/// A context keyed for `cipher` in `direction`, without an IV yet.
fn keyed_context(cipher: Cipher, direction: Direction, key: &[u8]) -> Result<CipherCtx> {
    if key.len() != cipher.key_len() {
        return Err(Error::KeyLength {
            cipher,
            expected: cipher.key_len(),
            got: key.len(),
        });
    }
    let mut ctx = CipherCtx::new()?;
    let evp = evp_cipher(cipher);
    match direction {
        Direction::Encrypt => ctx.encrypt_init(Some(evp), Some(key), None)?,
        Direction::Decrypt => ctx.decrypt_init(Some(evp), Some(key), None)?,
    }
    ctx.set_padding(cipher.mode == Mode::CbcPkcs7);
    Ok(ctx)
}

impl Lane for CpuLane {
    fn run(&mut self, job: &Job, keys: &KeyStore, out: &mut JobOutput) -> Result<()> {
        job.validate()?;
        let ctx = self.context(job, keys)?;
        run_evp(ctx, job, out)
    }
}

/// Runs one job on a keyed context.
fn run_evp(ctx: &mut CipherCtx, job: &Job, out: &mut JobOutput) -> Result<()> {
    let cipher = job.cipher;
    match job.direction {
        Direction::Encrypt => ctx.encrypt_init(None, None, Some(job.iv()))?,
        Direction::Decrypt => ctx.decrypt_init(None, None, Some(job.iv()))?,
    }
    out.data.clear();
    out.tag = None;
    if cipher.is_aead() && !job.aad.is_empty() {
        ctx.cipher_update(&job.aad, None)?;
    }
    ctx.cipher_update_vec(&job.input, &mut out.data)?;
    if cipher.is_aead() && job.direction == Direction::Decrypt {
        let tag = job.tag.as_ref().ok_or(Error::MissingTag { cipher })?;
        ctx.set_tag(tag)?;
    }
    let authenticates =
        cipher.is_aead() || (cipher.mode == Mode::CbcPkcs7 && job.direction == Direction::Decrypt);
    match ctx.cipher_final_vec(&mut out.data) {
        Ok(_) => {}
        Err(_) if authenticates => {
            out.data.clear();
            return Err(Error::AuthenticationFailed);
        }
        Err(e) => return Err(e.into()),
    }
    if cipher.is_aead() && job.direction == Direction::Encrypt {
        let mut tag = [0u8; TAG_LEN];
        ctx.tag(&mut tag)?;
        out.tag = Some(tag);
    }
    Ok(())
}
