//! Reads `/proc/crypto`: which drivers implement which algorithm, at what priority.
//!
//! The file is one block per registered algorithm, blocks separated by blank lines,
//! each line `key : value` (see `crypto/proc.c` in the kernel). No crate parses it, and
//! the format is a few lines of text, so it is read by hand here.

use std::path::Path;

/// Where the kernel lists its algorithms.
pub(crate) const PROC_CRYPTO: &str = "/proc/crypto";

/// One registered algorithm implementation (one block of `/proc/crypto`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct AlgEntry {
    /// The algorithm, e.g. `cbc(aes)`.
    pub name: String,
    /// The implementation, e.g. `virtio_crypto_aes_cbc`.
    pub driver: String,
    /// The module providing it (`kernel` when built in).
    pub module: String,
    /// Its priority: binding by `name` picks the highest.
    pub priority: Option<i32>,
    /// `skcipher`, `aead`, `cipher`, ...
    pub kind: String,
    /// Whether requests complete asynchronously.
    pub is_async: bool,
    /// Internal helpers (`__cbc-aes-aesni`) cannot be bound from user space.
    pub internal: bool,
    /// Whether the kernel's self-test passed (`selftest : passed`).
    pub selftest_passed: bool,
}

impl AlgEntry {
    /// Whether this implementation actually runs on a separate device. The kernel
    /// marks two kinds of drivers `async`: offload hardware (virtio-crypto, CAAM, QAT)
    /// and the SIMD wrappers of CPU code (`cbc-aes-aesni` defers to `cryptd` when the
    /// FPU is busy). A SIMD wrapper always has an internal twin named `__<driver>`;
    /// hardware has none, so that twin is the tell.
    pub fn is_offload(&self, all: &[AlgEntry]) -> bool {
        let twin = format!("__{}", self.driver);
        self.is_async
            && !self.driver.starts_with("cryptd(")
            && !all.iter().any(|e| e.internal && e.driver == twin)
    }
}

/// Reads and parses `/proc/crypto` (or another file in its format).
pub(crate) fn read(path: &Path) -> std::io::Result<Vec<AlgEntry>> {
    Ok(parse(&std::fs::read_to_string(path)?))
}

/// Parses the text of `/proc/crypto`. Unknown keys are ignored; a block without a
/// `name` or `driver` is dropped.
pub(crate) fn parse(text: &str) -> Vec<AlgEntry> {
    let mut entries = Vec::new();
    let mut cur = AlgEntry::default();
    let mut flush = |cur: &mut AlgEntry| {
        let done = std::mem::take(cur);
        if !done.name.is_empty() && !done.driver.is_empty() {
            entries.push(done);
        }
    };
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            if line.trim().is_empty() {
                flush(&mut cur);
            }
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "name" => cur.name = value.to_string(),
            "driver" => cur.driver = value.to_string(),
            "module" => cur.module = value.to_string(),
            "priority" => cur.priority = value.parse().ok(),
            "type" => cur.kind = value.to_string(),
            "async" => cur.is_async = value == "yes",
            "internal" => cur.internal = value == "yes",
            "selftest" => cur.selftest_passed = value == "passed",
            _ => {}
        }
    }
    flush(&mut cur);
    entries
}

/// The entry the kernel binds for the generic `name` of type `kind`: the
/// highest-priority one that is not internal and passed its self-test (as
/// `crypto_alg_lookup` chooses). Among equal priorities the kernel takes the one
/// registered last, which `/proc/crypto` lists first.
pub(crate) fn best<'a>(entries: &'a [AlgEntry], name: &str, kind: &str) -> Option<&'a AlgEntry> {
    entries
        .iter()
        .rev()
        .filter(|e| e.name == name && e.kind == kind && !e.internal && e.selftest_passed)
        .max_by_key(|e| e.priority.unwrap_or(i32::MIN))
}

/// The entry of the driver named `driver` that user space can bind.
pub(crate) fn by_driver<'a>(entries: &'a [AlgEntry], driver: &str) -> Option<&'a AlgEntry> {
    entries.iter().find(|e| e.driver == driver && !e.internal)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/proc/crypto` of the testbed guest (Debian kernel 6.1.0-56-amd64 with
    /// virtio_crypto and aesni_intel loaded), the AES blocks of it, captured with
    /// `testbed/run -- cat /proc/crypto`.
    const GUEST: &str = include_str!("testdata/proc_crypto_debian_6.1_virtio.txt");

    #[test]
    fn parses_every_block() {
        let entries = parse(GUEST);
        let blocks = GUEST.split("\n\n").filter(|b| !b.trim().is_empty()).count();
        assert_eq!(entries.len(), blocks);
        let virtio = by_driver(&entries, "virtio_crypto_aes_cbc").expect("listed");
        assert_eq!(virtio.name, "cbc(aes)");
        assert_eq!(virtio.kind, "skcipher");
        assert_eq!(virtio.module, "virtio_crypto");
        assert_eq!(virtio.priority, Some(150));
        assert!(virtio.is_async && !virtio.internal && virtio.selftest_passed);
    }

    #[test]
    fn generic_names_pick_the_highest_priority_bindable_driver() {
        let entries = parse(GUEST);
        // cryptd(__cbc-aes-aesni) has priority 450 but is internal: never bound by name.
        let cbc = best(&entries, "cbc(aes)", "skcipher").expect("cbc");
        assert_eq!(cbc.driver, "cbc-aes-aesni");
        assert_eq!(
            best(&entries, "ctr(aes)", "skcipher").expect("ctr").driver,
            "ctr-aes-aesni"
        );
        assert_eq!(
            best(&entries, "gcm(aes)", "aead").expect("gcm").driver,
            "generic-gcm-aesni"
        );
        assert!(best(&entries, "gcm(aes)", "skcipher").is_none());
        assert!(best(&entries, "cbc(des)", "skcipher").is_none());
    }

    #[test]
    fn offload_is_told_apart_from_simd_wrappers() {
        let entries = parse(GUEST);
        let virtio = by_driver(&entries, "virtio_crypto_aes_cbc").expect("listed");
        assert!(virtio.is_offload(&entries));
        let aesni = by_driver(&entries, "cbc-aes-aesni").expect("listed");
        assert!(aesni.is_async, "the SIMD wrapper says async");
        assert!(!aesni.is_offload(&entries));
        let generic = by_driver(&entries, "aes-generic").expect("listed");
        assert!(!generic.is_offload(&entries));
    }

    #[test]
    fn tolerates_odd_input() {
        assert!(parse("").is_empty());
        assert!(parse("garbage without colons\n\n\n").is_empty());
        let one = parse("name : x\ndriver : y\npriority : not-a-number\n");
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].priority, None);
        // A block needs both a name and a driver.
        let named = parse("name : x\n\ndriver : lone\n\nname : y\ndriver : z\n");
        assert_eq!(named.len(), 1, "{named:?}");
        assert_eq!(
            (named[0].name.as_str(), named[0].driver.as_str()),
            ("y", "z")
        );
    }

    #[test]
    fn reads_the_file_it_is_given() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/engine/kernel/testdata/proc_crypto_debian_6.1_virtio.txt");
        assert_eq!(read(&path).expect("the test data is there"), parse(GUEST));
        assert!(read(&path.with_extension("missing")).is_err());
    }
}
