//! The `devcrypto` engine where `/dev/crypto` is missing (our host: unavailable, saying
//! the cryptodev module is not loaded) and where it exists (the testbed guest, which
//! loads cryptodev.ko: it opens and names the driver its sessions get).
//!
//! Which case applies is decided by looking for `/dev/crypto` directly, not by
//! trusting the engine, so each branch checks something that can fail.

use std::io::Write;
use std::path::Path;

use hetcrypt::engine::devcrypto::{DevcryptoEngine, DEV_CRYPTO, NOT_LOADED};
use hetcrypt::engine::{self, EngineKind};
use hetcrypt::{Cipher, Direction, Error, Mode};

/// Prints past the test harness's capture, so notes show in CI logs.
fn note(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

fn expect_not_loaded(result: hetcrypt::Result<engine::EngineRef>, name: &str) {
    match result {
        Err(Error::EngineUnavailable { engine, reason }) => {
            assert_eq!(engine, name);
            assert_eq!(reason, NOT_LOADED);
        }
        Err(e) => panic!("{name}: expected EngineUnavailable, got {e}"),
        Ok(_) => panic!("{name}: opened without {DEV_CRYPTO}"),
    }
}

#[test]
fn devcrypto_opens_where_dev_crypto_exists_and_says_why_where_not() {
    if !Path::new(DEV_CRYPTO).exists() {
        expect_not_loaded(engine::by_name("devcrypto", None), "devcrypto");
        expect_not_loaded(
            engine::by_name("devcrypto:virtio_crypto_aes_cbc", Some(2)),
            "devcrypto:virtio_crypto_aes_cbc",
        );
        // `hetcrypt engines` lists it among the unavailable, with that reason.
        let listed = engine::discover().into_iter().any(|e| {
            matches!(e, Err(Error::EngineUnavailable { engine, reason })
                if engine == "devcrypto" && reason == NOT_LOADED)
        });
        assert!(listed, "discover() does not account for devcrypto");
        assert_eq!(
            format!("devcrypto: {NOT_LOADED}"),
            "devcrypto: no /dev/crypto: the cryptodev module is not loaded"
        );
        note("devcrypto: /dev/crypto absent here; unavailability checked");
        return;
    }
    let engine = DevcryptoEngine::open()
        .expect("/dev/crypto exists, so devcrypto opens")
        .into_engine();
    let info = engine.info();
    assert_eq!(
        (info.name.as_str(), info.kind),
        ("devcrypto", EngineKind::Devcrypto)
    );
    for c in &info.ciphers {
        assert!(engine.supports(c.cipher, Direction::Encrypt));
        assert!(c.driver.contains("/dev/crypto"), "{}", c.driver);
        note(&format!("devcrypto: {} -> {}", c.cipher, c.driver));
    }
    // AES-CBC is the one cipher cryptodev is sure to reach.
    assert!(engine.supports(Cipher::AES_128_CBC, Direction::Decrypt));
    assert!(!engine.supports(Cipher::AES_128_GCM, Direction::Encrypt));
    assert!(info.ciphers.iter().all(|c| c.cipher.mode != Mode::Gcm));
}

#[test]
fn devcrypto_names_that_are_not_engines_are_refused() {
    for bad in ["devcrypto:", "devcryptox", "devcrypto;virtio"] {
        match engine::by_name(bad, None) {
            Err(Error::UnknownName { what, name }) => {
                assert_eq!((what, name.as_str()), ("engine", bad));
            }
            Err(e) => panic!("{bad}: expected UnknownName, got {e}"),
            Ok(_) => panic!("{bad}: opened"),
        }
    }
}
