//! hetcrypt: run batches of independent AES jobs on every crypto engine at once.
//!
//! The pieces, top-down:
//! - a [`Job`] is one independent unit of work (cipher, direction, key id, IV, input);
//! - an [`Engine`](engine::Engine) is a way to run jobs (`cpu`: OpenSSL EVP; `kernel`:
//!   the Linux crypto API through AF_ALG) and has *lanes*, each able to hold one job;
//! - a [`Policy`](policy::Policy) decides which lane runs which job — pure scheduling,
//!   no crypto;
//! - a [`Calibration`](calibration::Calibration) is what each engine costs per cipher,
//!   direction and size on this machine, measured once by driving the engines' lanes
//!   directly and stored where policies and other programs read it;
//! - the [`Dispatcher`] is the mechanism: it owns the lane threads, runs a batch under a
//!   policy, re-dispatches the jobs of an engine that fails, and returns every output
//!   plus a [`Report`].
//!
//! ```
//! use hetcrypt::{Cipher, Direction, Dispatcher, Job, Key};
//! use hetcrypt::engine::cpu::CpuEngine;
//! use hetcrypt::policy::Pull;
//!
//! let dispatcher = Dispatcher::new(vec![CpuEngine::with_lanes(2).into_engine()])?;
//! let key = dispatcher.add_key(Key::new(vec![0x2b; 16]))?;
//! let jobs: Vec<Job> = (0..8u8)
//!     .map(|i| Job::new(Cipher::AES_128_CTR, Direction::Encrypt, key, [i; 16], vec![i; 1000]))
//!     .collect();
//! let batch = dispatcher.run(&jobs, &Pull)?;
//! assert_eq!(batch.outputs.len(), 8);
//! for out in &batch.outputs {
//!     assert_eq!(out.as_ref().expect("job succeeds").data.len(), 1000);
//! }
//! println!("{}", batch.report.to_json());
//! # Ok::<(), hetcrypt::Error>(())
//! ```
#![warn(missing_docs)]

pub mod calibration;
pub mod cipher;
pub mod dispatch;
pub mod engine;
pub mod error;
pub mod job;
pub mod key;
pub mod policy;
pub mod report;
pub mod split;

pub use cipher::{Cipher, Direction, KeySize, Mode};
pub use dispatch::{BatchResult, Dispatcher};
pub use error::{Error, Result};
pub use job::{Job, JobOutput, Tag, TAG_LEN};
pub use key::{Key, KeyId, KeyStore};
pub use report::Report;

/// The README's Rust examples, compiled and run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
