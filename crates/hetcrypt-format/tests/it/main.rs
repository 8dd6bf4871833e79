//! The file format's integration tests, in one test binary (libtest runs them in parallel,
//! and there is one link instead of one per file).

#[path = "../common/mod.rs"]
mod common;

mod aead_params;
mod errors;
mod manifest;
mod manifest_entries;
mod mutations;
mod overlap;
mod pipeline;
mod read_ahead;
mod roundtrip;
mod streams;
mod tamper;
mod wycheproof_c2sp;
mod wycheproof_cbc_hmac;
