//! Issue 19, items 8 to 13: failing early and bounded, messages for people, keys and
//! streams. Each test is named after the failure it reproduces.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

mod files_support;
use files_support::{assert_no_temporaries, hetcrypt, run, stderr};

/// Longest a run may take before the test calls it stuck (a debug build on a busy
/// machine; the failures it guards against took hours).
const PATIENCE: Duration = Duration::from_secs(60);

fn key(dir: &Path) -> PathBuf {
    let key = dir.join("key");
    let o = run(&[&"keygen", &"-o", &key]);
    assert!(o.status.success(), "{}", stderr(&o));
    key
}

/// Runs a prepared command, killing it after [`PATIENCE`].
fn run_within(mut cmd: std::process::Command) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!("still running after {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_ciphertext_padded_to_one_tebibyte_fails_at_once() {
    let t = tempfile::tempdir().unwrap();
    let key = key(t.path());
    let plain = t.path().join("plain");
    fs::write(&plain, vec![7u8; 40_000]).unwrap();
    let enc = t.path().join("plain.hc");
    let o = run(&[&"encrypt", &"--key", &key, &plain, &"-o", &enc]);
    assert!(o.status.success(), "{}", stderr(&o));
    let genuine = fs::metadata(&enc).unwrap().len();
    let out = t.path().join("out");
    fs::create_dir(&out).unwrap();
    // Sparse padding: 4 GiB (a length no message has) and 1 TiB (one it may have).
    for len in [(4u64 << 30) + 3, 1u64 << 40] {
        fs::OpenOptions::new()
            .write(true)
            .open(&enc)
            .unwrap()
            .set_len(len)
            .unwrap();
        let mut cmd = hetcrypt();
        cmd.args(["decrypt", "--key"])
            .arg(&key)
            .arg(&enc)
            .arg("-o")
            .arg(out.join("plain"));
        let o = run_within(cmd);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains("failed authentication") || e.contains("cannot be a whole message"),
            "{len}: {e}"
        );
        assert!(fs::read_dir(&out).unwrap().next().is_none());
        fs::OpenOptions::new()
            .write(true)
            .open(&enc)
            .unwrap()
            .set_len(genuine)
            .unwrap();
    }
    assert_no_temporaries(&out);
}
