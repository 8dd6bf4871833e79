//! The testbed guest's virtio-crypto device in sysfs, for the guest tests and examples.

use std::path::{Path, PathBuf};

/// The virtio device (`virtio0`) under the testbed's PCI device directory `pci`
/// (`$HETCRYPT_TESTBED_CRYPTO_DEV`): the crypto driver's own device, whose `uevent`
/// the engines poll before every request.
pub fn virtio_device(pci: &Path) -> std::io::Result<PathBuf> {
    std::fs::read_dir(pci)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("virtio"))
        })
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no virtio device under {}", pci.display()),
            )
        })
}
