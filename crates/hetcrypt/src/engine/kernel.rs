//! The `kernel` engine: the Linux kernel crypto API through AF_ALG sockets.

use crate::error::{Error, Result};

/// Placeholder until the AF_ALG implementation lands: always unavailable.
#[derive(Debug)]
pub struct KernelEngine;

impl KernelEngine {
    /// Opens the kernel engine.
    pub fn open() -> Result<Self> {
        Err(Error::EngineUnavailable {
            engine: "kernel".to_string(),
            reason: "AF_ALG engine not implemented yet".to_string(),
        })
    }
}
