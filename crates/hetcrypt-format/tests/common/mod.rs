//! Helpers shared by the integration tests: engine sets and a pipeline runner that
//! keeps what a stream wrote even when it fails.
#![allow(dead_code)]

use hetcrypt::engine::cpu::CpuEngine;
use hetcrypt::engine::EngineRef;
use hetcrypt::policy::{Only, Policy, Pull};
use hetcrypt_format::{
    DecryptStream, EncryptStream, FormatError, Observer, OpenParams, Pipeline, SealParams, Stats,
};

/// One CPU engine with two lanes.
pub fn cpu() -> Vec<EngineRef> {
    vec![CpuEngine::with_lanes(2).into_engine()]
}

/// Two independent engines (both software here: the host has no crypto module), so
/// chunks of one message really do land on different engines.
pub fn two_engines() -> Vec<EngineRef> {
    vec![
        CpuEngine::with_lanes(1).named("cpu-a").into_engine(),
        CpuEngine::with_lanes(2).named("cpu-b").into_engine(),
    ]
}

/// Engine sets and policies to re-run a suite under: name, engines, policy.
pub fn configurations() -> Vec<(&'static str, Vec<EngineRef>, Box<dyn Policy>)> {
    vec![
        ("cpu/pull", cpu(), Box::new(Pull)),
        ("two/pull", two_engines(), Box::new(Pull)),
        (
            "two/only:cpu-b",
            two_engines(),
            Box::new(Only::new("cpu-b")),
        ),
    ]
}

/// Keeps every finished stream with its result, in the order they finished.
pub struct Keep<T>(pub Vec<(T, Result<(), FormatError>)>);

impl<T> Observer<T> for Keep<T> {
    fn done(&mut self, stream: T, result: Result<(), FormatError>) {
        self.0.push((stream, result));
    }
}

/// What a decryption produced: the result, what the stream had written (even on
/// failure) and the pipeline's stats.
pub struct Opened {
    pub result: Result<(), FormatError>,
    pub written: Vec<u8>,
    pub stats: Stats,
}

/// Decrypts with a small window (so multi-chunk messages span several batches).
pub fn open(
    engines: &[EngineRef],
    policy: &dyn Policy,
    key: &[u8],
    params: OpenParams,
    ct: &[u8],
    window: usize,
) -> Opened {
    let stream = DecryptStream::new(ct, Vec::new(), key, params);
    let mut keep = Keep(Vec::new());
    let mut pipeline = Pipeline::new(engines.to_vec(), policy)
        .expect("engines are valid")
        .window(window);
    pipeline.run([stream], &mut keep).expect("the batch plans");
    let (stream, result) = keep.0.pop().expect("one stream finished");
    let (_, written) = stream.into_parts();
    Opened {
        result,
        written,
        stats: pipeline.stats().clone(),
    }
}

/// Encrypts with the given window.
pub fn seal(
    engines: &[EngineRef],
    policy: &dyn Policy,
    key: &[u8],
    params: SealParams,
    pt: &[u8],
    window: usize,
) -> Result<Vec<u8>, FormatError> {
    let stream = EncryptStream::new(pt, Vec::new(), key, params);
    let mut keep = Keep(Vec::new());
    Pipeline::new(engines.to_vec(), policy)?
        .window(window)
        .run([stream], &mut keep)?;
    let (stream, result) = keep.0.pop().expect("one stream finished");
    result?;
    Ok(stream.into_parts().1)
}

/// A deterministic pseudo-random buffer (xorshift64), so failures reproduce.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

mod skip;
// Not every test binary that includes this module skips anything.
#[allow(unused_imports)]
pub use skip::cannot_run_here;
