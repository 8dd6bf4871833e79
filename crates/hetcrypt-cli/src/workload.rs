//! What `speed` and `bench` share: size arguments, engine sets, random jobs and the
//! reference outputs every run is checked against.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{bail, Context};
use hetcrypt::calibration::{self, Calibration, LaneChoice};
use hetcrypt::engine::cpu::{BlockParallel, CpuEngine};
use hetcrypt::engine::{self, EngineInfo, EngineKind, EngineRef};
use hetcrypt::{Cipher, Direction, Dispatcher, Error, Job, JobOutput, Key, KeyId};
use serde::Serialize;

/// Parses a byte count: `16`, `4k`/`4K`/`4KiB` (x 1024), `64M`/`64MiB` (x 1024^2).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let scale: usize = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("'{s}' is not a size in bytes (e.g. 16, 4k, 64M)")),
    };
    let n: usize = number
        .parse()
        .map_err(|_| format!("'{s}' is not a size in bytes (e.g. 16, 4k, 64M)"))?;
    n.checked_mul(scale)
        .ok_or_else(|| format!("'{s}' is too large"))
}

/// Parses a count that must be at least one (files, runs).
pub fn parse_count(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(0) => Err("it must be at least 1".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("'{s}' is not a whole number")),
    }
}

/// A byte count as people read it: `8 B`, `16 KiB`, `1.5 KiB`, `64 MiB`.
pub fn human_size(n: usize) -> String {
    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;
    if n >= MIB && n.is_multiple_of(MIB / 4) {
        format!("{} MiB", trim_float(n as f64 / MIB as f64))
    } else if n >= KIB && n.is_multiple_of(KIB / 4) {
        format!("{} KiB", trim_float(n as f64 / KIB as f64))
    } else {
        format!("{n} B")
    }
}

fn trim_float(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// An engine that could not be opened, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Unavailable {
    /// The engine's name.
    pub engine: String,
    /// Why, in words.
    pub reason: String,
}

impl Unavailable {
    fn from_error(name: &str, e: Error) -> Self {
        match e {
            Error::EngineUnavailable { engine, reason } => Unavailable { engine, reason },
            other => Unavailable {
                engine: name.to_string(),
                reason: other.to_string(),
            },
        }
    }
}

/// How to open engines: lane counts and the `cpu` engine's multi-buffer width.
#[derive(Clone, Debug, Default)]
pub struct EngineOpts {
    /// Lanes per engine (else each engine's default, or for a device engine the
    /// store's choice).
    pub lanes: Option<usize>,
    /// Lanes of the `cpu` engine when `lanes` is not given (else one per core).
    pub cpu_lanes: Option<usize>,
    /// CBC messages a `cpu` lane encrypts in lockstep (1: every job through OpenSSL
    /// EVP alone); else the engine's default.
    pub cpu_chains: Option<usize>,
    /// Who runs the `cpu` engine's block-parallel work; else measured (`Auto`).
    pub cpu_impl: Option<BlockParallel>,
    /// Where a device engine's lanes come from without `lanes`: the store's lanes sweep
    /// for the run's cipher and direction (else the engine's default).
    pub stored_lanes: Option<StoredLanes>,
}

/// The calibration store and the class whose lanes sweep picks a device engine's lane
/// count ([`calibration::choose_lanes`]).
#[derive(Clone, Debug)]
pub struct StoredLanes {
    /// The store.
    pub store: Arc<Calibration>,
    /// The run's cipher.
    pub cipher: Cipher,
    /// The run's direction.
    pub direction: Direction,
}

impl EngineOpts {
    fn is_default(&self) -> bool {
        self.lanes.is_none()
            && self.cpu_lanes.is_none()
            && self.cpu_chains.is_none()
            && self.cpu_impl.is_none()
            && self.stored_lanes.is_none()
    }

    /// How many lanes `engine` (opened with these options) runs and why; `None` for a
    /// `cpu`-kind engine, whose lanes are its cores.
    pub fn lane_choice(&self, engine: &EngineRef) -> Option<LaneChoice> {
        if engine.kind() == EngineKind::Cpu {
            return None;
        }
        let stored = self.stored_lanes.as_ref();
        Some(calibration::choose_lanes(
            self.lanes,
            stored.map(|s| s.store.as_ref()),
            engine.name(),
            stored.map_or(Cipher::AES_128_CBC, |s| s.cipher),
            stored.map_or(Direction::Encrypt, |s| s.direction),
            engine.lanes(),
        ))
    }
}

/// Parses `--cpu-impl`: `auto`, `aes-crate` or `openssl-evp` (the names `hetcrypt
/// engines` prints).
pub fn parse_cpu_impl(s: &str) -> Result<BlockParallel, String> {
    match s {
        "auto" => Ok(BlockParallel::Auto),
        "aes-crate" => Ok(BlockParallel::On),
        "openssl-evp" => Ok(BlockParallel::Off),
        _ => Err(format!(
            "unknown implementation '{s}' (known: auto, aes-crate, openssl-evp)"
        )),
    }
}

/// The engines a run uses, and those this machine lacks.
pub struct EngineSet {
    /// Engines ready to run jobs.
    pub ready: Vec<EngineRef>,
    /// Engines that could not be opened, with the reason.
    pub unavailable: Vec<Unavailable>,
}

impl EngineSet {
    /// Every engine this machine has (`engine::discover`), opened with `opts`.
    pub fn discover(opts: EngineOpts) -> anyhow::Result<Self> {
        let mut set = EngineSet {
            ready: Vec::new(),
            unavailable: Vec::new(),
        };
        for found in engine::discover() {
            match found {
                Ok(e) if opts.is_default() => set.ready.push(e),
                Ok(e) => set.ready.push(open_engine(e.name(), &opts)?),
                Err(e) => set.unavailable.push(Unavailable::from_error("?", e)),
            }
        }
        Ok(set)
    }

    /// Exactly the engines named; one that is unknown or unavailable is an error.
    pub fn named(names: &[String], opts: EngineOpts) -> anyhow::Result<Self> {
        let mut ready = Vec::new();
        for name in names {
            ready.push(open_engine(name, &opts)?);
        }
        Ok(EngineSet {
            ready,
            unavailable: Vec::new(),
        })
    }

    /// The named engines, or every engine this machine has when `names` is empty.
    pub fn named_or_all(names: &[String], opts: EngineOpts) -> anyhow::Result<Self> {
        if names.is_empty() {
            Self::discover(opts)
        } else {
            Self::named(names, opts)
        }
    }

    /// Descriptions of the ready engines.
    pub fn infos(&self) -> Vec<EngineInfo> {
        self.ready.iter().map(|e| e.info()).collect()
    }

    /// The reason engine `name` is unavailable, if it is.
    pub fn why_unavailable(&self, name: &str) -> Option<&str> {
        self.unavailable
            .iter()
            .find(|u| u.engine == name)
            .map(|u| u.reason.as_str())
    }
}

/// `"s"` unless `n` is one.
pub fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Opens one engine by its CLI name, turning library errors into one sentence. A
/// device engine without `opts.lanes` runs the lanes its stored sweep chose, if any.
pub fn open_engine(name: &str, opts: &EngineOpts) -> anyhow::Result<EngineRef> {
    if name == "cpu" {
        let lanes = opts.lanes.or(opts.cpu_lanes);
        if opts.cpu_chains.is_some() || opts.cpu_impl.is_some() {
            let lanes = lanes.unwrap_or_else(hetcrypt::engine::cpu::available_cores);
            let mut engine =
                CpuEngine::with_lanes(lanes).block_parallel(opts.cpu_impl.unwrap_or_default());
            if let Some(chains) = opts.cpu_chains {
                engine = engine.multibuffer(chains);
            }
            return Ok(engine.into_engine());
        }
        return open_by_name(name, lanes);
    }
    let engine = open_by_name(name, opts.lanes)?;
    match opts.lane_choice(&engine) {
        Some(choice) if choice.lanes != engine.lanes() => open_by_name(name, Some(choice.lanes)),
        _ => Ok(engine),
    }
}

fn open_by_name(name: &str, lanes: Option<usize>) -> anyhow::Result<EngineRef> {
    match engine::by_name(name, lanes) {
        Ok(e) => Ok(e),
        Err(Error::UnknownName { .. }) => {
            bail!("unknown engine '{name}' (known: cpu, kernel, kernel:<driver>, devcrypto, devcrypto:<driver>)")
        }
        Err(Error::EngineUnavailable { engine, reason }) => {
            bail!("engine {engine} is unavailable on this machine: {reason}")
        }
        Err(e) => Err(e).with_context(|| format!("cannot open engine {name}")),
    }
}

/// Parses a cipher name for clap, listing the known ones on error.
pub fn parse_cipher(s: &str) -> Result<Cipher, String> {
    s.parse::<Cipher>().map_err(|_| {
        let known: Vec<String> = Cipher::all().map(|c| c.to_string()).collect();
        format!("unknown cipher '{s}' (known: {})", known.join(", "))
    })
}

/// Checks a policy name for clap (the policy itself is built where it is used).
pub fn parse_policy(s: &str) -> Result<String, String> {
    match hetcrypt::policy::by_name(s) {
        Ok(_) => Ok(s.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// Random bytes from OpenSSL's CSPRNG (the content does not change AES timing; random
/// data only keeps any compression or caching of equal buffers out of the picture).
pub fn random_bytes(len: usize) -> anyhow::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    openssl::rand::rand_bytes(&mut buf).context("OpenSSL could not produce random bytes")?;
    Ok(buf)
}

/// A fresh random key for `cipher`.
pub fn random_key(cipher: Cipher) -> anyhow::Result<Key> {
    Ok(Key::new(random_bytes(cipher.key_len())?))
}

/// The jobs of one run and the output each must produce.
pub struct Workload {
    /// The jobs, in order.
    pub jobs: Vec<Job>,
    /// For each job, the output the `cpu` reference computed.
    pub expected: Vec<JobOutput>,
}

impl Workload {
    /// Builds one job per entry of `plaintexts` for `cipher` in `direction` with `key`
    /// (registered as `key_id` in the dispatcher that will run them).
    ///
    /// Encryption jobs take the plaintexts; decryption jobs take ciphertexts (and
    /// tags) that a separate `cpu` reference dispatcher made from them, so every
    /// decryption is of real ciphertext. The expected outputs also come from that
    /// reference, so each run can be checked byte for byte.
    pub fn new(
        cipher: Cipher,
        direction: Direction,
        key: &Key,
        key_id: KeyId,
        plaintexts: Vec<Vec<u8>>,
    ) -> anyhow::Result<Self> {
        let reference = Dispatcher::new(vec![CpuEngine::new().into_engine()])?;
        let ref_key = reference.add_key(key.clone())?;
        let mut encrypt = Vec::with_capacity(plaintexts.len());
        for pt in plaintexts {
            let iv = random_bytes(cipher.iv_len())?;
            encrypt.push(Job::with_iv(cipher, Direction::Encrypt, ref_key, &iv, pt)?);
        }
        let policy = hetcrypt::policy::Pull;
        let ciphertexts = collect_outputs(reference.run(&encrypt, &policy)?.outputs)
            .context("the cpu reference could not encrypt the generated inputs")?;
        let with_key = |mut job: Job| {
            job.key = key_id;
            job
        };
        match direction {
            Direction::Encrypt => Ok(Workload {
                jobs: encrypt.into_iter().map(with_key).collect(),
                expected: ciphertexts,
            }),
            Direction::Decrypt => {
                let mut jobs = Vec::with_capacity(encrypt.len());
                let mut expected = Vec::with_capacity(encrypt.len());
                for (enc, ct) in encrypt.into_iter().zip(ciphertexts) {
                    let mut job =
                        Job::with_iv(cipher, Direction::Decrypt, key_id, enc.iv(), ct.data)?;
                    if let Some(tag) = ct.tag {
                        job = job.tag(tag);
                    }
                    jobs.push(job);
                    expected.push(JobOutput {
                        data: enc.input,
                        tag: None,
                    });
                }
                Ok(Workload { jobs, expected })
            }
        }
    }

    /// Total input bytes.
    pub fn bytes(&self) -> u64 {
        self.jobs.iter().map(|j| j.len() as u64).sum()
    }

    /// Checks the outputs of a run of the first `outputs.len()` jobs against the
    /// reference: the first wrong or failed job is an error naming it.
    pub fn check(&self, outputs: &[hetcrypt::Result<JobOutput>], what: &str) -> anyhow::Result<()> {
        if outputs.len() > self.expected.len() {
            bail!(
                "{what} returned {} outputs for {} jobs",
                outputs.len(),
                self.expected.len()
            );
        }
        for (i, (got, want)) in outputs.iter().zip(&self.expected).enumerate() {
            match got {
                Ok(out) if out == want => {}
                Ok(_) => bail!(
                    "{what} produced a wrong output for job {i}: it differs from the cpu reference"
                ),
                Err(e) => bail!("{what} failed job {i}: {e}"),
            }
        }
        Ok(())
    }
}

/// The outputs of a batch, or its first job error.
fn collect_outputs(outputs: Vec<hetcrypt::Result<JobOutput>>) -> hetcrypt::Result<Vec<JobOutput>> {
    outputs.into_iter().collect()
}

/// Facts about the machine a result was measured on.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// `uname -r`.
    pub kernel: String,
    /// Cores available to this process.
    pub cores: usize,
    /// OpenSSL's version string.
    pub openssl: String,
    /// hetcrypt's version.
    pub hetcrypt: String,
}

impl Machine {
    /// Reads them now.
    pub fn now() -> Self {
        Machine {
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".to_string()),
            cores: hetcrypt::engine::cpu::available_cores(),
            openssl: openssl::version::version().to_string(),
            hetcrypt: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// Jobs per engine in a report, by engine name.
pub fn jobs_per_engine(report: &hetcrypt::Report) -> BTreeMap<String, usize> {
    report
        .engines
        .iter()
        .map(|e| (e.name.clone(), e.jobs))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("16"), Ok(16));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert!(parse_size("abc").is_err());
        assert!(parse_size("12q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("-1").is_err());
    }

    #[test]
    fn sizes_print_for_people() {
        assert_eq!(human_size(8), "8 B");
        assert_eq!(human_size(1000), "1000 B");
        assert_eq!(human_size(1024), "1 KiB");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(16384), "16 KiB");
        assert_eq!(human_size(64 << 20), "64 MiB");
    }

    #[test]
    fn decrypt_workload_round_trips_through_the_reference() {
        let key = Key::new(vec![7; 16]);
        let pts = vec![vec![1u8; 5], vec![2u8; 40]];
        let w = Workload::new(
            Cipher::AES_128_CBC_PKCS7,
            Direction::Decrypt,
            &key,
            KeyId(0),
            pts.clone(),
        )
        .unwrap();
        assert_eq!(w.jobs[0].len(), 16);
        assert_eq!(w.jobs[1].len(), 48);
        assert_eq!(w.expected[1].data, pts[1]);
    }
}
