//! Issue 19, items 1, 6 and 7: nothing is written outside the destination, sources are
//! typed when opened (not when listed), modes carry no special bits, and an output
//! inside its input is refused before anything is written.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::files_support;
use files_support::{assert_no_temporaries, encrypt_json, key, run, stderr};

/// Longest a run may take before the test calls it hung.
const PATIENCE: Duration = Duration::from_secs(120);

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn json(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

fn empty(dir: &Path) -> bool {
    fs::read_dir(dir).unwrap().next().is_none()
}

#[test]
fn a_symlink_inside_the_destination_is_never_written_through() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let src = t.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("sub/file"), b"secret plaintext").unwrap();
    fs::write(src.join("top"), b"top").unwrap();
    let enc = t.path().join("enc");
    let o = run(&[&"encrypt", &"-q", &"--key", &key, &src, &"-o", &enc]);
    assert!(o.status.success(), "{}", stderr(&o));

    // A directory link inside each destination, pointing outside it.
    for (way, input, out) in [("encrypt", &src, "out-enc"), ("decrypt", &enc, "out-dec")] {
        let outside = t.path().join(format!("outside-{way}"));
        fs::create_dir(&outside).unwrap();
        let out = t.path().join(out);
        fs::create_dir(&out).unwrap();
        symlink(&outside, out.join("sub")).unwrap();
        let o = run(&[
            &way, &"--key", &key, input, &"-o", &out, &"--json", &"--force",
        ]);
        assert_eq!(o.status.code(), Some(1), "{way}: {}", stderr(&o));
        assert!(empty(&outside), "{way} wrote through out/sub");
        let s = json(&o);
        let reason = s["failed"][0]["reason"].as_str().unwrap();
        let link = out.join("sub").display().to_string();
        assert!(
            reason.contains(&link) && reason.contains("symbolic link"),
            "{way}: {reason}"
        );
        // The rest of the tree still went through.
        assert!(out
            .join(if way == "encrypt" { "top.hc" } else { "top" })
            .is_file());
    }

    // --force never replaces (or writes through) a link at the output's own name.
    let victim = t.path().join("victim");
    fs::write(&victim, b"precious").unwrap();
    let out = t.path().join("out-force");
    fs::create_dir(&out).unwrap();
    symlink(&victim, out.join("top.hc")).unwrap();
    let o = run(&[
        &"encrypt",
        &"--key",
        &key,
        &src.join("top"),
        &"-o",
        &out.join("top.hc"),
        &"--force",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("symbolic link"), "{}", stderr(&o));
    assert_eq!(fs::read(&victim).unwrap(), b"precious");
    assert!(out.join("top.hc").symlink_metadata().unwrap().is_symlink());
    assert_no_temporaries(&out);
}

#[test]
fn a_source_swapped_for_a_link_fifo_or_device_after_listing_is_skipped_not_read() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let secret = t.path().join("root-only");
    fs::write(&secret, b"root's secret").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    for name in ["a-link", "b-fifo", "c-zero", "d-plain"] {
        fs::write(src.join(name), b"listed as a regular file").unwrap();
    }
    // What the test hook moves onto each entry between listing and opening.
    let swap = t.path().join("swap");
    fs::create_dir(&swap).unwrap();
    symlink(&secret, swap.join("a-link")).unwrap();
    let fifo = std::process::Command::new("mkfifo")
        .arg(swap.join("b-fifo"))
        .status()
        .unwrap();
    assert!(fifo.success());
    symlink("/dev/zero", swap.join("c-zero")).unwrap();

    let vault = t.path().join("vault");
    let mut child = encrypt_json(&key, &src, &vault)
        .env("HETCRYPT_TEST_SWAP_DIR", &swap)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!("encrypt hung on a swapped-in FIFO or device");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let s = json(&o);
    assert_eq!(s["files_ok"], 1, "{s}");
    let skipped: Vec<&str> = s["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    for name in ["a-link", "b-fifo", "c-zero"] {
        let p = src.join(name).display().to_string();
        assert!(skipped.contains(&p.as_str()), "{name} not skipped: {s}");
        assert!(!vault.join(format!("{name}.hc")).exists(), "{name} read");
    }
    assert!(vault.join("d-plain.hc").is_file());
}

#[test]
fn setuid_setgid_and_sticky_bits_never_reach_an_output() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let src = t.path().join("tool");
    fs::write(&src, b"#!/bin/sh\n").unwrap();
    fs::set_permissions(&src, fs::Permissions::from_mode(0o7755)).unwrap();
    let enc = t.path().join("tool.hc");
    let o = run(&[&"encrypt", &"--key", &key, &src, &"-o", &enc]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(mode(&enc), 0o755);
    // A ciphertext whose mode an attacker chose.
    fs::set_permissions(&enc, fs::Permissions::from_mode(0o6777)).unwrap();
    let dec = t.path().join("tool.out");
    let o = run(&[&"decrypt", &"--key", &key, &enc, &"-o", &dec]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(mode(&dec), 0o777);
}

#[test]
fn an_output_inside_its_input_is_refused_before_anything_is_written() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let nest = t.path().join("nest");
    fs::create_dir_all(nest.join("d")).unwrap();
    fs::write(nest.join("d/x"), b"x").unwrap();
    let enc = t.path().join("enc");
    let o = run(&[&"encrypt", &"-q", &"--key", &key, &nest, &"-o", &enc]);
    assert!(o.status.success(), "{}", stderr(&o));
    fs::create_dir(nest.join("existing")).unwrap();

    let cases: [(&str, &Path, PathBuf); 5] = [
        ("encrypt", &nest, nest.join("d/out")),
        ("encrypt", &nest, nest.join("existing")),
        ("encrypt", &nest, nest.clone()),
        ("encrypt", &nest, nest.join("d/../new")),
        ("decrypt", &enc, enc.join("sub/out")),
    ];
    for (way, input, out) in cases {
        let before: Vec<_> = walkdir::WalkDir::new(t.path())
            .into_iter()
            .map(|e| e.unwrap().into_path())
            .collect();
        let o = run(&[&way, &"--key", &key, &input, &"-o", &out]);
        assert_eq!(o.status.code(), Some(1), "{way} -o {}", out.display());
        assert!(stderr(&o).contains("inside the input"), "{}", stderr(&o));
        let after: Vec<_> = walkdir::WalkDir::new(t.path())
            .into_iter()
            .map(|e| e.unwrap().into_path())
            .collect();
        assert_eq!(before, after, "{way} -o {} wrote", out.display());
    }
    // Several inputs whose output directory lies inside one of them.
    let other = t.path().join("other");
    fs::write(&other, b"o").unwrap();
    let o = run(&[
        &"encrypt",
        &"--key",
        &key,
        &other,
        &nest,
        &"-o",
        &nest.join("d"),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("inside the input"), "{}", stderr(&o));
    assert!(!nest.join("d/other.hc").exists());
}

#[test]
fn a_source_directory_swapped_for_a_link_after_listing_is_not_followed() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let outside = t.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("f"), b"root's secret").unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("sub/f"), b"listed").unwrap();
    // The hook replaces `sub` by a link to `outside` just before `sub/f` is opened.
    let swap = t.path().join("swap");
    fs::create_dir(&swap).unwrap();
    symlink(&outside, swap.join("sub")).unwrap();
    let vault = t.path().join("vault");
    let o = encrypt_json(&key, &src, &vault)
        .env("HETCRYPT_TEST_SWAP_DIR", &swap)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        src.join("sub").symlink_metadata().unwrap().is_symlink(),
        "hook did not run"
    );
    let s = json(&o);
    assert_eq!(s["files_ok"], 0, "{s}");
    let reason = s["skipped"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("not followed"), "{reason}");
    assert!(
        !vault.join("sub/f.hc").exists(),
        "read through the swapped-in link"
    );
}
