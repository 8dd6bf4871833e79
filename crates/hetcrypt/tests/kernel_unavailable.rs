//! The `kernel` engine where AF_ALG is missing (our host: unavailable, saying why) and
//! where it exists (the testbed guest: it opens and names its drivers).
//!
//! Which case applies is decided by asking the kernel directly for an AF_ALG socket,
//! not by trusting the engine, so each branch checks something that can fail.

use std::io::Write;

use hetcrypt::engine;
use hetcrypt::engine::kernel::{kernel_release, KernelEngine};
use hetcrypt::{Cipher, Error, Mode};
use nix::errno::Errno;
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};

/// The driver of the testbed's virtio-crypto device (cbc(aes) only).
const VIRTIO_DRIVER: &str = "virtio_crypto_aes_cbc";

/// Whether this kernel offers AF_ALG, asked directly.
fn af_alg_exists() -> bool {
    match socket(
        AddressFamily::Alg,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    ) {
        Ok(_) => true,
        Err(Errno::EAFNOSUPPORT) => false,
        Err(e) => panic!("socket(AF_ALG) failed in an unexpected way: {e}"),
    }
}

fn in_testbed() -> bool {
    std::env::var_os("HETCRYPT_TESTBED").is_some()
}

/// Prints past the test harness's capture, so notes show in CI logs.
fn note(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

fn expect_unavailable_for_af_alg(result: hetcrypt::Result<KernelEngine>, name: &str) {
    match result {
        Err(Error::EngineUnavailable { engine, reason }) => {
            assert_eq!(engine, name);
            assert!(
                reason.contains("AF_ALG"),
                "the reason should name AF_ALG: {reason}"
            );
        }
        Err(e) => panic!("{name}: expected EngineUnavailable, got {e}"),
        Ok(_) => panic!("{name}: opened on a kernel without AF_ALG"),
    }
}

#[test]
fn generic_engine_opens_where_af_alg_exists_and_says_why_where_not() {
    let result = KernelEngine::open();
    if !af_alg_exists() {
        expect_unavailable_for_af_alg(result, "kernel");
        note("kernel engine: AF_ALG absent on this kernel; unavailability checked");
        return;
    }
    let engine = result.expect("AF_ALG exists, so `kernel` opens");
    assert_eq!(engine.kernel_release(), kernel_release());
    let engine = engine.into_engine();
    let info = engine.info();
    assert_eq!(info.name, "kernel");
    note(&format!("Linux {}", kernel_release()));
    for c in &info.ciphers {
        assert!(!c.driver.is_empty());
        assert!(engine.supports(c.cipher, hetcrypt::Direction::Encrypt));
        note(&format!(
            "kernel: {} -> {} priority {:?} module {:?} async {:?}",
            c.cipher, c.driver, c.priority, c.module, c.is_async
        ));
    }
    if in_testbed() {
        // The guest loads cbc/ctr/gcm drivers: every cipher is served.
        assert_eq!(info.ciphers.len(), Cipher::all().count());
        assert!(info.ciphers.iter().all(|c| c.priority.is_some()));
    }
}

#[test]
fn named_driver_engine_serves_what_its_driver_implements() {
    let result = KernelEngine::with_driver(VIRTIO_DRIVER);
    if !af_alg_exists() {
        expect_unavailable_for_af_alg(result, "kernel:virtio_crypto_aes_cbc");
        return;
    }
    if !in_testbed() {
        note("kernel:virtio_crypto_aes_cbc: not in the testbed guest, driver not required");
        return;
    }
    let engine = result
        .expect("the testbed has a virtio-crypto device")
        .into_engine();
    let info = engine.info();
    assert_eq!(info.name, "kernel:virtio_crypto_aes_cbc");
    for cipher in Cipher::all() {
        let cbc = matches!(cipher.mode, Mode::Cbc | Mode::CbcPkcs7);
        assert_eq!(
            engine.supports(cipher, hetcrypt::Direction::Decrypt),
            cbc,
            "{cipher}"
        );
    }
    let served = &info.ciphers[0];
    assert!(
        served.driver.starts_with(VIRTIO_DRIVER),
        "{}",
        served.driver
    );
    assert_eq!(served.module.as_deref(), Some("virtio_crypto"));
    assert_eq!(served.is_async, Some(true));
    assert!(
        !engine.uses_host_cpu(),
        "virtio-crypto runs on the device, not the guest CPU"
    );
    note(&format!(
        "kernel:{VIRTIO_DRIVER}: {} ciphers, driver {}",
        info.ciphers.len(),
        served.driver
    ));
}

#[test]
fn engines_by_name_report_the_same() {
    for name in ["kernel", "kernel:virtio_crypto_aes_cbc"] {
        match engine::by_name(name, Some(2)) {
            Ok(engine) => {
                assert!(af_alg_exists(), "{name} opened without AF_ALG");
                assert_eq!(engine.name(), name);
                assert_eq!(engine.lanes(), 2);
            }
            Err(Error::EngineUnavailable { engine, reason }) => {
                assert_eq!(engine, name);
                if !af_alg_exists() {
                    assert!(reason.contains("AF_ALG"), "{reason}");
                } else {
                    assert!(!in_testbed(), "{name} unavailable in the testbed: {reason}");
                }
            }
            Err(e) => panic!("{name}: {e}"),
        }
    }
    let discovered = engine::discover();
    assert!(discovered.iter().any(|e| match e {
        Ok(e) => e.name() == "kernel",
        Err(Error::EngineUnavailable { engine, .. }) => engine == "kernel",
        Err(_) => false,
    }));
}

#[test]
fn bad_driver_names_are_refused_without_panic() {
    let long = "x".repeat(200);
    for driver in [
        "no_such_driver_hetcrypt",
        long.as_str(),
        "nul\0inside",
        "sha256-generic",
    ] {
        match KernelEngine::with_driver(driver) {
            Err(Error::EngineUnavailable { engine, reason }) => {
                assert_eq!(engine, format!("kernel:{driver}"));
                assert!(!reason.is_empty());
                if af_alg_exists() {
                    note(&format!("kernel:{}: {reason}", driver.escape_debug()));
                }
            }
            Err(e) => panic!("{driver}: expected EngineUnavailable, got {e}"),
            Ok(_) => panic!("{driver}: opened"),
        }
    }
}
