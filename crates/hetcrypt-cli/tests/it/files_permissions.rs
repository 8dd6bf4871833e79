//! Permission errors, which tests running as root cannot make with file modes (root
//! bypasses them): sysfs refuses even root, deterministically. Reading a write-only
//! attribute (`/sys/bus/pci/rescan`, mode 0200, no read method) fails with EACCES;
//! creating a file in `/sys` fails with EACCES and a directory with EPERM. Each such
//! input or output fails alone, is named in the summary, and leaves nothing behind.

use std::fs;
use std::path::Path;

use crate::files_support;
use files_support::{assert_no_temporaries, cannot_run_here, encrypt_json, key, run, stderr};

/// A regular file that even root cannot open for reading (see the module doc).
const UNREADABLE: &str = "/sys/bus/pci/rescan";

#[test]
fn an_input_root_cannot_read_fails_alone_with_permission_denied() {
    if !Path::new(UNREADABLE).is_file() {
        cannot_run_here(
            "an_input_root_cannot_read_fails_alone_with_permission_denied",
            &format!("{UNREADABLE} does not exist (no PCI bus in sysfs)"),
        );
        return;
    }
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let good = t.path().join("good");
    fs::write(&good, b"readable").unwrap();
    let out = t.path().join("out");
    let o = run(&[
        &"encrypt",
        &"--key",
        &key,
        &good,
        &UNREADABLE,
        &"-o",
        &out,
        &"--json",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["files_ok"], 1);
    assert_eq!(s["files_failed"], 1);
    assert_eq!(s["failed"][0]["path"], UNREADABLE);
    let reason = s["failed"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("Permission denied"), "{reason}");
    assert!(out.join("good.hc").is_file());
    assert!(!out.join("rescan.hc").exists());
    assert_no_temporaries(&out);
}

#[test]
fn an_output_root_cannot_write_fails_with_permission_denied() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let good = t.path().join("good");
    fs::write(&good, b"readable").unwrap();
    let dest = Path::new("/sys/hetcrypt-test-output.hc");
    let o = run(&[&"encrypt", &"--key", &key, &good, &"-o", &dest, &"--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["files_ok"], 0);
    let reason = s["failed"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("Permission denied"), "{reason}");
    assert!(!dest.exists());

    // A whole tree whose output root cannot be made: every folder and file is named.
    let tree = t.path().join("tree");
    fs::create_dir_all(tree.join("sub")).unwrap();
    fs::write(tree.join("sub/f"), b"x").unwrap();
    fs::write(tree.join("g"), b"y").unwrap();
    let root = Path::new("/sys/hetcrypt-test-tree");
    let o = run(&[&"encrypt", &"--key", &key, &tree, &"-o", &root, &"--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["files_ok"], 0);
    // The two folders, the two files and the tree's manifest.
    assert_eq!(
        s["files_failed"],
        5,
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let first = s["failed"][0]["reason"].as_str().unwrap();
    assert!(
        first.contains("cannot create the directory /sys/hetcrypt-test-tree:"),
        "{first}"
    );
    assert!(!root.exists());
}

#[test]
fn a_summary_reader_that_went_away_is_not_a_crash() {
    // `hetcrypt encrypt ... --json | head -1`: the reader may be gone before the
    // summary is written; the run itself succeeded.
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let good = t.path().join("good");
    fs::write(&good, b"readable").unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = encrypt_json(&key, &good, &t.path().join("good.hc"))
        .stdout(writer)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    assert!(t.path().join("good.hc").is_file());
}
