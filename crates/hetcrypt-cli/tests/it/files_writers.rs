//! Issue 24: a tree's small outputs are made and written by the writer thread and a
//! settler thread in turn, and all named by the writer. Whichever thread takes a file,
//! the tree round-trips with contents and modes, the manifest lists every file, and a
//! file that cannot be named fails alone, leaving what was there and no temporary.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::files_support;
use files_support::{assert_no_temporaries, encrypt_json, hetcrypt, key, run, stderr};

/// Files in the test tree: many commit messages (16 files each), so the writer and
/// the settler take several, in every directory.
const FILES: usize = 150;
/// Files per directory: a directory's files are split between the threads.
const PER_DIR: usize = 40;
/// Every this-many files is larger than a write buffer (128 KiB), so its buffers are
/// written behind before it is named: those stay with the writer.
const LARGE_EVERY: usize = 37;
/// Modes given in turn to the files: each must come back as it was, whatever the
/// umask.
const MODES: [u32; 5] = [0o644, 0o600, 0o755, 0o640, 0o444];
/// Umasks the round trip runs under: none, the usual, and one that strips more than
/// any mode above allows.
const UMASKS: [&str; 3] = ["000", "022", "077"];

fn rel(i: usize) -> PathBuf {
    PathBuf::from(format!("d{}/f{i:03}", i / PER_DIR))
}

/// File `i`'s encrypted output under `enc`.
fn encrypted(enc: &Path, i: usize) -> PathBuf {
    let mut p = enc.join(rel(i)).into_os_string();
    p.push(".hc");
    PathBuf::from(p)
}

fn content(i: usize) -> Vec<u8> {
    let len = if i.is_multiple_of(LARGE_EVERY) {
        200_000 + i
    } else {
        (i * 331) % 20_000
    };
    (0..len).map(|b| (b * 7 + i) as u8).collect()
}

fn make_tree(root: &Path) {
    for i in 0..FILES {
        let p = root.join(rel(i));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, content(i)).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(MODES[i % MODES.len()])).unwrap();
    }
}

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// `hetcrypt ARGS --json` under `umask`; returns the exit success and the summary.
fn run_json(umask: &str, args: &[&dyn AsRef<std::ffi::OsStr>]) -> (bool, serde_json::Value) {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
        .arg(hetcrypt().get_program());
    for a in args {
        cmd.arg(a);
    }
    cmd.arg("--json");
    let o = cmd.env_remove("HETCRYPT_ENGINES").output().unwrap();
    let s = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)));
    (o.status.success(), s)
}

#[test]
fn a_tree_shared_by_writer_and_settler_round_trips_with_contents_and_modes() {
    for umask in UMASKS {
        let t = crate::files_support::scratch();
        let key = key(t.path());
        let (src, enc, dec) = (
            t.path().join("src"),
            t.path().join("enc"),
            t.path().join("dec"),
        );
        make_tree(&src);
        let (ok, s) = run_json(umask, &[&"encrypt", &"--key", &key, &src, &"-o", &enc]);
        assert!(ok, "umask {umask}: {s:#}");
        assert_eq!(s["files_ok"], FILES, "umask {umask}: {s:#}");
        for i in 0..FILES {
            assert_eq!(
                mode(&encrypted(&enc, i)),
                MODES[i % MODES.len()],
                "umask {umask}: {i}"
            );
        }
        let (ok, s) = run_json(umask, &[&"decrypt", &"--key", &key, &enc, &"-o", &dec]);
        assert!(ok, "umask {umask}: {s:#}");
        assert_eq!(s["files_ok"], FILES, "umask {umask}: {s:#}");
        for i in 0..FILES {
            let p = dec.join(rel(i));
            assert_eq!(fs::read(&p).unwrap(), content(i), "umask {umask}: {i}");
            assert_eq!(mode(&p), MODES[i % MODES.len()], "umask {umask}: {i}");
        }
        assert_no_temporaries(&enc);
        assert_no_temporaries(&dec);
    }
}

#[test]
fn outputs_in_the_way_fail_alone_whichever_thread_settles_them() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let (src, enc) = (t.path().join("src"), t.path().join("enc"));
    make_tree(&src);
    // Existing outputs spread over the tree (small and large, every message's share).
    let in_the_way: Vec<usize> = (0..FILES)
        .filter(|i| i % 11 == 3 || i.is_multiple_of(LARGE_EVERY))
        .collect();
    let out = |i: usize| encrypted(&enc, i);
    for &i in &in_the_way {
        fs::create_dir_all(out(i).parent().unwrap()).unwrap();
        fs::write(out(i), format!("keep {i}")).unwrap();
    }
    let (ok, s) = run_json("022", &[&"encrypt", &"--key", &key, &src, &"-o", &enc]);
    assert!(!ok, "{s:#}");
    assert_eq!(s["files_failed"], in_the_way.len(), "{s:#}");
    assert_eq!(s["files_ok"], FILES - in_the_way.len(), "{s:#}");
    for &i in &in_the_way {
        assert_eq!(fs::read_to_string(out(i)).unwrap(), format!("keep {i}"));
    }
    // Complete: each decrypts on its own to the input (one `decrypt` of every complete
    // output as a file of its own, not of the tree: one spawn, not one per file).
    let complete: Vec<usize> = (0..FILES).filter(|i| !in_the_way.contains(i)).collect();
    let paths: Vec<PathBuf> = complete.iter().map(|&i| out(i)).collect();
    let dec = t.path().join("dec");
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"decrypt", &"-q", &"--key", &key];
    args.extend(paths.iter().map(|p| p as &dyn AsRef<std::ffi::OsStr>));
    args.extend([&"-o" as &dyn AsRef<std::ffi::OsStr>, &dec]);
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    for &i in &complete {
        let name = rel(i);
        let name = name.file_name().unwrap();
        assert_eq!(fs::read(dec.join(name)).unwrap(), content(i), "{i}");
    }
    assert_no_temporaries(&enc);
}

#[test]
fn outputs_that_fail_to_settle_fail_alone_whichever_thread_settles_them() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let (src, enc) = (t.path().join("src"), t.path().join("enc"));
    make_tree(&src);
    let out = |i: usize| encrypted(&enc, i);
    // Debug builds: settling an output named `...7.hc` fails (one file in ten, in
    // every message, so on the writer and the settler both).
    let o = encrypt_json(&key, &src, &enc)
        .env("HETCRYPT_TEST_FAIL_SETTLE", "7.hc")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let failing: Vec<usize> = (0..FILES).filter(|i| i % 10 == 7).collect();
    assert_eq!(s["files_failed"], failing.len(), "{s:#}");
    assert_eq!(s["files_ok"], FILES - failing.len(), "{s:#}");
    for i in 0..FILES {
        assert_eq!(out(i).exists(), !failing.contains(&i), "{i}");
    }
    for note in s["failed"].as_array().unwrap() {
        let reason = note["reason"].as_str().unwrap();
        assert!(reason.contains("settling failed (test hook)"), "{reason}");
    }
    assert_no_temporaries(&enc);
}

/// A default ACL in POSIX's extended-attribute form (`linux/posix_acl_xattr.h`:
/// version 2, then tag, permissions, id per entry, little-endian): `u::rwx`,
/// `g::r-x`, `o::---`, which would give a file made there group read and others
/// nothing whatever mode it is made with.
fn default_acl() -> Vec<u8> {
    const VERSION: u32 = 2;
    const USER_OBJ: u16 = 0x01;
    const GROUP_OBJ: u16 = 0x04;
    const OTHER: u16 = 0x20;
    let mut acl = VERSION.to_le_bytes().to_vec();
    for (tag, perm) in [(USER_OBJ, 7u16), (GROUP_OBJ, 5), (OTHER, 0)] {
        acl.extend_from_slice(&tag.to_le_bytes());
        acl.extend_from_slice(&perm.to_le_bytes());
        acl.extend_from_slice(&u32::MAX.to_le_bytes());
    }
    acl
}

/// Where a default ACL decides a new file's permissions (not the umask), outputs are
/// not made with their final mode: they still get their input's mode, as `fchmod`
/// gives it.
#[test]
fn under_a_default_acl_outputs_still_get_their_inputs_modes() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let (src, enc, dec) = (
        t.path().join("src"),
        t.path().join("enc"),
        t.path().join("dec"),
    );
    make_tree(&src);
    for dir in [&enc, &dec] {
        fs::create_dir(dir).unwrap();
        let set = rustix::fs::setxattr(
            dir.as_path(),
            "system.posix_acl_default",
            &default_acl(),
            rustix::fs::XattrFlags::empty(),
        );
        if let Err(e) = set {
            files_support::cannot_run_here(
                "under_a_default_acl_outputs_still_get_their_inputs_modes",
                &format!("cannot set a default ACL on {}: {e}", dir.display()),
            );
            return;
        }
    }
    let (ok, s) = run_json("022", &[&"encrypt", &"--key", &key, &src, &"-o", &enc]);
    assert!(ok, "{s:#}");
    for i in 0..FILES {
        assert_eq!(mode(&encrypted(&enc, i)), MODES[i % MODES.len()], "{i}");
    }
    let (ok, s) = run_json("022", &[&"decrypt", &"--key", &key, &enc, &"-o", &dec]);
    assert!(ok, "{s:#}");
    for i in 0..FILES {
        let p = dec.join(rel(i));
        assert_eq!(fs::read(&p).unwrap(), content(i), "{i}");
        assert_eq!(mode(&p), MODES[i % MODES.len()], "{i}");
    }
}
