//! The `kernel` engine: the Linux kernel crypto API through AF_ALG sockets.

use crate::engine::EngineRef;
use crate::error::{Error, Result};

/// The kernel crypto API as an engine (AF_ALG `skcipher` for CBC/CTR, `aead` for GCM).
#[derive(Debug)]
pub struct KernelEngine {
    _private: (),
}

impl KernelEngine {
    /// The engine named `kernel`, binding the generic algorithm names (`cbc(aes)`, ...)
    /// so the kernel picks its highest-priority driver for each.
    pub fn open() -> Result<Self> {
        Self::unavailable("kernel")
    }

    /// The engine named `kernel:<driver>`, binding one named driver (e.g.
    /// `virtio_crypto_aes_cbc`) for the cipher(s) it implements.
    pub fn with_driver(driver: &str) -> Result<Self> {
        Self::unavailable(&format!("kernel:{driver}"))
    }

    /// Sets the lane count (concurrent operation sockets, one thread each).
    pub fn with_lanes(self, _lanes: usize) -> Self {
        self
    }

    /// Wraps the engine for a dispatcher.
    pub fn into_engine(self) -> EngineRef {
        unreachable!("a KernelEngine cannot be built yet")
    }

    fn unavailable(engine: &str) -> Result<Self> {
        Err(Error::EngineUnavailable {
            engine: engine.to_string(),
            reason: "the AF_ALG engine is not implemented yet".to_string(),
        })
    }
}
