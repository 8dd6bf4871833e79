//! `hetcrypt encrypt` / `decrypt` on trees recreate every directory, empty ones
//! included, with the input's permission bits (set once the files are in, so a
//! read-only directory still receives its files).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::files_support;
use files_support::{run, stderr};

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn set_mode(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn empty_directories_come_back_with_their_modes() {
    let t = crate::files_support::scratch();
    let key = t.path().join("key");
    let o = run(&[&"keygen", &"-o", &key]);
    assert!(o.status.success(), "{}", stderr(&o));

    let tree = t.path().join("tree");
    // (relative path, mode): empty leaves, an empty directory inside an otherwise
    // empty one, a read-only directory holding a file, a non-default mode.
    let dirs = [
        ("empty", 0o755),
        ("outer", 0o750),
        ("outer/inner-empty", 0o700),
        ("readonly", 0o555),
        ("sticky", 0o1777),
    ];
    fs::create_dir(&tree).unwrap();
    for (rel, _) in dirs {
        fs::create_dir(tree.join(rel)).unwrap();
    }
    fs::write(tree.join("readonly/file"), b"inside a read-only folder").unwrap();
    fs::write(tree.join("top"), b"top").unwrap();
    for (rel, m) in dirs {
        set_mode(&tree.join(rel), m);
    }
    set_mode(&tree, 0o711);

    let enc = t.path().join("enc");
    let dec = t.path().join("dec");
    let o = run(&[&"encrypt", &"-q", &"--key", &key, &tree, &"-o", &enc]);
    assert!(o.status.success(), "encrypt: {}", stderr(&o));
    let o = run(&[&"decrypt", &"-q", &"--key", &key, &enc, &"-o", &dec]);
    assert!(o.status.success(), "decrypt: {}", stderr(&o));

    for root in [&enc, &dec] {
        assert_eq!(mode(root), 0o711, "{}", root.display());
        for (rel, m) in dirs {
            let d = root.join(rel);
            assert!(d.is_dir(), "{} missing", d.display());
            assert_eq!(mode(&d), m, "{}: mode {:o}", d.display(), mode(&d));
        }
    }
    assert!(fs::read_dir(enc.join("empty")).unwrap().next().is_none());
    assert!(fs::read_dir(dec.join("outer/inner-empty"))
        .unwrap()
        .next()
        .is_none());
    assert_eq!(
        fs::read(dec.join("readonly/file")).unwrap(),
        b"inside a read-only folder"
    );
    assert!(enc.join("readonly/file.hc").is_file());
    assert_eq!(fs::read(dec.join("top")).unwrap(), b"top");
}

#[test]
fn an_existing_output_directory_keeps_its_mode_and_a_file_in_the_way_fails() {
    let t = crate::files_support::scratch();
    let key = t.path().join("key");
    assert!(run(&[&"keygen", &"-o", &key]).status.success());
    let tree = t.path().join("tree");
    fs::create_dir_all(tree.join("a")).unwrap();
    fs::create_dir_all(tree.join("b")).unwrap();
    fs::write(tree.join("f"), b"x").unwrap();
    set_mode(&tree.join("a"), 0o700);

    let enc = t.path().join("enc");
    fs::create_dir_all(enc.join("a")).unwrap();
    set_mode(&enc.join("a"), 0o755);
    fs::write(enc.join("b"), b"a file where a folder goes").unwrap();
    let o = run(&[&"encrypt", &"--key", &key, &tree, &"-o", &enc, &"--json"]);
    // The folder that cannot be made fails alone; the file still goes through.
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["files_ok"], 1);
    let reason = s["failed"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("not a directory"), "{reason}");
    assert_eq!(
        mode(&enc.join("a")),
        0o755,
        "an existing folder's mode changed"
    );
    assert!(enc.join("f.hc").is_file());
}
