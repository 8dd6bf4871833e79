//! `hetcrypt keygen`: key file contents, mode 0600, refusing to overwrite, exit codes.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

fn hetcrypt() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hetcrypt"))
}

#[test]
fn writes_private_hex_keys_of_both_sizes() {
    let dir = crate::files_support::scratch();
    for (bits, digits) in [(None, 32), (Some("128"), 32), (Some("256"), 64)] {
        let path = dir.path().join(format!("key-{bits:?}"));
        let mut cmd = hetcrypt();
        cmd.arg("keygen").arg("-o").arg(&path);
        if let Some(b) = bits {
            cmd.args(["--bits", b]);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        let hex = text.trim();
        assert_eq!(hex.len(), digits);
        assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()));
        // The key is never printed.
        assert!(!String::from_utf8_lossy(&out.stdout).contains(hex));
        assert!(!String::from_utf8_lossy(&out.stderr).contains(hex));
    }
    // Two keys differ.
    let a = std::fs::read(dir.path().join("key-None")).unwrap();
    let b = std::fs::read(dir.path().join("key-Some(\"128\")")).unwrap();
    assert_ne!(a, b);
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
}

#[test]
fn refuses_to_overwrite_and_rejects_bad_sizes() {
    let dir = crate::files_support::scratch();
    let path = dir.path().join("key");
    std::fs::write(&path, "precious").unwrap();
    let out = hetcrypt()
        .arg("keygen")
        .arg("-o")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious");

    let other = dir.path().join("other");
    let out = hetcrypt()
        .arg("keygen")
        .arg("-o")
        .arg(&other)
        .args(["--bits", "192"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "usage error");
    assert!(!other.exists());
}
