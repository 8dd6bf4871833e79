//! Calibration of a real crypto module, in the testbed guest: the virtio-crypto driver
//! is measured with its name and priority, its fixed cost per request is far above the
//! CPU's (the seeds' shape), so the stored crossover is a finite size, and the store
//! written there reads back as valid on the same machine.
//!
//! Outside the guest (no `HETCRYPT_TESTBED`) the test prints a note and returns.

use std::time::Duration;

use hetcrypt::calibration::{self, Fingerprint, Loaded, Settings};
use hetcrypt::engine::cpu::CpuEngine;
use hetcrypt::engine::kernel::KernelEngine;
use hetcrypt::{Cipher, Direction};

/// The testbed device's driver (cbc(aes) only).
const VIRTIO: &str = "virtio_crypto_aes_cbc";

#[test]
#[ignore = "needs the testbed guest (HETCRYPT_TESTBED): testbed/ci runs it"]
fn testbed_calibrates_the_module_against_the_cpu() {
    // Ignored on the host (listed with the reason); testbed/ci runs it with
    // --include-ignored, and run that way outside the guest it fails, not passes.
    assert!(
        std::env::var_os("HETCRYPT_TESTBED").is_some(),
        "needs the testbed guest (HETCRYPT_TESTBED unset): run it through testbed/ci"
    );
    let module = format!("kernel:{VIRTIO}");
    let engines = vec![
        CpuEngine::new().into_engine(),
        KernelEngine::with_driver(VIRTIO)
            .expect("the device's driver opens in the guest")
            .into_engine(),
    ];
    let settings = Settings {
        ciphers: vec![Cipher::AES_128_CBC],
        point_time: Duration::from_millis(10),
        ..Settings::default()
    };
    let cal = calibration::measure(&engines, &settings, &mut |_| {}).unwrap();
    assert!(cal.unmeasured.is_empty(), "{:?}", cal.unmeasured);
    let (c, d) = (Cipher::AES_128_CBC, Direction::Encrypt);
    let class = cal.class(&module, c, d).expect("the module was measured");
    assert!(class.driver.starts_with(VIRTIO), "{}", class.driver);
    assert!(class.priority.is_some());
    let cpu = cal.class("cpu", c, d).expect("the cpu was measured");
    // A request to the device costs ~100-500 us whatever its size; the CPU's fixed
    // cost is a few microseconds at most.
    assert!(class.fixed > 20e-6, "module fixed cost {}", class.fixed);
    assert!(
        class.fixed > 5.0 * cpu.fixed,
        "{} vs {}",
        class.fixed,
        cpu.fixed
    );
    let at = cal.crossover(c, d, "cpu", &module).expect("both measured");
    eprintln!(
        "calibration: cpu {:.1} us + {:.1} ns/B, module {:.1} us + {:.1} ns/B, crossover {at} B",
        cpu.fixed * 1e6,
        cpu.per_byte * 1e9,
        class.fixed * 1e6,
        class.per_byte * 1e9
    );
    assert!(at > 16, "the module never wins a 16-byte job: {at}");
    let small = cal.cost(&module, c, d, 16).unwrap();
    assert!(small > cal.cost("cpu", c, d, 16).unwrap());

    let dir = std::env::temp_dir().join(format!("hetcrypt-cal-{}", std::process::id()));
    let path = dir.join("calibration.json");
    cal.save(&path).unwrap();
    match calibration::load(&path, &Fingerprint::current()) {
        Loaded::Ok(read) => assert_eq!(*read, cal),
        other => panic!("the store written here does not hold here: {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}
