//! `hetcrypt encrypt` / `decrypt` end to end: trees with nested folders, empty files
//! and unusual names, chunk-edge sizes, stdin/stdout, --force, tampering, wrong keys,
//! a full disk, missing inputs, exit codes and the JSON summary. Every failure must
//! leave no output (and no temporary file) behind.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::files_support;
use files_support::{assert_no_temporaries, hetcrypt, run, stderr};

/// Deterministic bytes (xorshift), so a failure reproduces.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn keygen(dir: &Path, bits: &str) -> PathBuf {
    keygen_named(dir, &format!("key{bits}"), bits)
}

fn keygen_named(dir: &Path, name: &str, bits: &str) -> PathBuf {
    let key = dir.join(name);
    let o = run(&[&"keygen", &"-o", &key, &"--bits", &bits]);
    assert!(o.status.success(), "{}", stderr(&o));
    key
}

/// Every regular file under `root`, relative path -> contents.
fn files(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in walkdir::WalkDir::new(root).sort_by_file_name() {
        let e = e.unwrap();
        if e.file_type().is_file() {
            out.push((
                e.path().strip_prefix(root).unwrap().to_path_buf(),
                fs::read(e.path()).unwrap(),
            ));
        }
    }
    out
}

/// A tree with nested folders, empty files, unusual names and chunk-edge sizes.
fn make_tree(root: &Path) {
    let sizes = [0usize, 1, 16383, 16384, 16385, 32768, 3 * 1024 * 1024 + 1];
    for (i, size) in sizes.iter().enumerate() {
        let dir = root.join(match i % 3 {
            0 => "",
            1 => "a/b/c",
            _ => "spaces and ünïcödé",
        });
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join(format!("file {size}.bin")),
            pattern(*size, i as u64),
        )
        .unwrap();
    }
    fs::write(root.join("-leading dash"), b"dash").unwrap();
    fs::write(root.join("a/b/c/.hidden"), b"").unwrap();
    fs::write(root.join("a/日本語 名前.txt"), "テキスト").unwrap();
}

#[test]
fn tree_round_trip_with_both_aeads() {
    let t = crate::files_support::scratch();
    let src = t.path().join("src");
    make_tree(&src);
    std::os::unix::fs::symlink("a", src.join("link")).unwrap();
    for (bits, aead) in [
        ("128", "aes-128-gcm"),
        ("256", "aes-256-gcm"),
        ("256", "aes-128-cbc-hmac-sha256"),
    ] {
        let key = keygen_named(t.path(), aead, bits);
        let enc = t.path().join(format!("enc-{aead}"));
        let dec = t.path().join(format!("dec-{aead}"));
        let o = run(&[
            &"encrypt", &"--key", &key, &"--aead", &aead, &src, &"-o", &enc, &"--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(summary["files_ok"], 10);
        assert_eq!(summary["files_failed"], 0);
        assert_eq!(
            summary["skipped"][0]["reason"],
            "symbolic link, not followed"
        );
        assert_eq!(summary["aead"], aead);
        // Every output carries the suffix, at the same relative path, and the tree's
        // manifest is at its root.
        let mut want: Vec<PathBuf> = files(&src)
            .into_iter()
            .map(|(p, _)| PathBuf::from(format!("{}.hc", p.display())))
            .collect();
        want.push(PathBuf::from(".hetcrypt-manifest"));
        want.sort();
        let got: Vec<PathBuf> = files(&enc).into_iter().map(|(p, _)| p).collect();
        assert_eq!(got, want);

        let o = run(&[&"decrypt", &"--key", &key, &enc, &"-o", &dec, &"-q"]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(o.stderr.is_empty() && o.stdout.is_empty(), "--quiet");
        assert!(files(&dec) == files(&src), "{aead}: decrypted tree differs");
    }
}

#[test]
fn single_files_stdin_stdout_and_force() {
    let t = crate::files_support::scratch();
    let key = keygen(t.path(), "128");
    let plain = t.path().join("note.txt");
    fs::write(&plain, pattern(40_000, 3)).unwrap();

    // Default names: beside the input, .hc added, then removed.
    let o = run(&[&"encrypt", &"--key", &key, &plain]);
    assert!(o.status.success(), "{}", stderr(&o));
    let sealed = t.path().join("note.txt.hc");
    assert!(sealed.exists());
    // The input is left alone, the output exists: decrypting onto it needs --force.
    let o = run(&[&"decrypt", &"--key", &key, &sealed]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("already exists (use --force"),
        "{}",
        stderr(&o)
    );
    let o = run(&[&"decrypt", &"--key", &key, &sealed, &"--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(fs::read(&plain).unwrap(), pattern(40_000, 3));

    // stdin -> stdout -> stdin -> stdout.
    let enc = pipe(
        &["encrypt", "--key", key.to_str().unwrap(), "-"],
        &pattern(70_000, 4),
    );
    assert!(enc.status.success());
    assert_eq!(&enc.stdout[..8], b"hetcrypt");
    let dec = pipe(
        &["decrypt", "--key", key.to_str().unwrap(), "-", "-o", "-"],
        &enc.stdout,
    );
    assert!(dec.status.success(), "{}", stderr(&dec));
    assert!(dec.stdout == pattern(70_000, 4));

    // A file into an existing directory keeps its name.
    let outdir = t.path().join("out");
    fs::create_dir(&outdir).unwrap();
    let o = run(&[&"encrypt", &"--key", &key, &plain, &"-o", &outdir]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(outdir.join("note.txt.hc").exists());
}

fn pipe(args: &[&str], input: &[u8]) -> Output {
    let mut child = hetcrypt()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let data = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

#[test]
fn tampered_truncated_and_foreign_files_fail_alone_and_leave_nothing() {
    let t = crate::files_support::scratch();
    let key = keygen(t.path(), "128");
    let src = t.path().join("src");
    make_tree(&src);
    let enc = t.path().join("enc");
    assert!(run(&[&"encrypt", &"--key", &key, &src, &"-o", &enc])
        .status
        .success());

    let big = enc.join("spaces and ünïcödé/file 32768.bin.hc");
    let mut bytes = fs::read(&big).unwrap();
    bytes[12 + 56 + 100] ^= 0x20; // first chunk
    fs::write(&big, &bytes).unwrap();
    let huge = enc.join("file 3145729.bin.hc");
    let bytes = fs::read(&huge).unwrap();
    fs::write(&huge, &bytes[..12 + 56 + 5 * (16384 + 16)]).unwrap(); // at a chunk boundary
    let odd = enc.join("a/b/c/file 1.bin.hc");
    let mut bytes = fs::read(&odd).unwrap();
    bytes.extend_from_slice(b"garbage");
    fs::write(&odd, &bytes).unwrap();
    fs::write(enc.join("not-ours.hc"), b"just some text, not encrypted").unwrap();

    let dec = t.path().join("dec");
    let o = run(&[&"decrypt", &"--key", &key, &enc, &"-o", &dec, &"--json"]);
    assert_eq!(o.status.code(), Some(1), "some files failed");
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["files_failed"], 4, "{s:#}");
    assert_eq!(s["files_ok"], 7);
    let reason = |name: &str| -> String {
        s["failed"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"].as_str().unwrap().ends_with(name))
            .map(|f| f["reason"].as_str().unwrap().to_string())
            .unwrap_or_else(|| panic!("{name} not listed"))
    };
    assert!(reason("file 32768.bin.hc").contains("chunk 0 failed authentication"));
    assert!(reason("file 3145729.bin.hc").starts_with("truncated"));
    assert!(reason("file 1.bin.hc").contains("failed authentication"));
    // A file added to the tree is refused before it is read.
    assert!(reason("not-ours.hc").contains("not in the tree's manifest"));
    // No plaintext of a failed file at its destination, no temporaries.
    assert!(!dec.join("spaces and ünïcödé/file 32768.bin").exists());
    assert!(!dec.join("file 3145729.bin").exists());
    assert!(!dec.join("a/b/c/file 1.bin").exists());
    assert_no_temporaries(&dec);
    // The good ones are intact.
    assert_eq!(fs::read(dec.join("file 0.bin")).unwrap(), b"");
    assert_eq!(fs::read(dec.join("-leading dash")).unwrap(), b"dash");

    // Tampered input to stdout: nothing is emitted.
    let o = run(&[&"decrypt", &"--key", &key, &big, &"-o", &"-"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        o.stdout.is_empty(),
        "unauthenticated plaintext reached stdout"
    );

    // The wrong key: said plainly, nothing written.
    let other = keygen_named(t.path(), "other-key", "128");
    let dec2 = t.path().join("dec2");
    let o = run(&[
        &"decrypt",
        &"--key",
        &other,
        &enc.join("-leading dash.hc"),
        &"-o",
        &dec2,
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("wrong key, or not a hetcrypt file"),
        "{}",
        stderr(&o)
    );
    assert!(!dec2.exists());
}

#[test]
fn full_disk_missing_inputs_and_usage_errors() {
    let t = crate::files_support::scratch();
    let key = keygen(t.path(), "128");
    let plain = t.path().join("p");
    fs::write(&plain, pattern(100_000, 9)).unwrap();

    // A full disk (/dev/full answers ENOSPC to every write).
    let full = fs::File::create("/dev/full").unwrap();
    let o = hetcrypt()
        .args(["encrypt", "--key"])
        .arg(&key)
        .arg(&plain)
        .args(["-o", "-"])
        .stdout(full)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no space left"), "{}", stderr(&o));

    // A missing input among good ones: the others are done, the run fails.
    let out = t.path().join("out");
    let missing = t.path().join("missing");
    let o = run(&[&"encrypt", &"--key", &key, &plain, &missing, &"-o", &out]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("missing"), "{}", stderr(&o));
    assert!(out.join("p.hc").exists());

    // Wrong key size for the AEAD: one sentence, before anything is written.
    let o = run(&[
        &"encrypt",
        &"--key",
        &key,
        &"--aead",
        &"aes-256-gcm",
        &plain,
        &"-o",
        &t.path().join("x"),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("needs a 256-bit key"), "{}", stderr(&o));
    assert!(!t.path().join("x").exists());

    // Usage errors exit with 2; a key file that is not one is refused.
    assert_eq!(run(&[&"encrypt", &"--key", &key]).status.code(), Some(2));
    assert_eq!(
        run(&[&"encrypt", &"--key", &key, &"--aead", &"rot13", &plain])
            .status
            .code(),
        Some(2)
    );
    let o = run(&[
        &"encrypt",
        &"--key",
        &plain,
        &plain,
        &"-o",
        &t.path().join("y"),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("not a hetcrypt key file"),
        "{}",
        stderr(&o)
    );
    // An unknown engine is named.
    let o = run(&[
        &"encrypt",
        &"--key",
        &key,
        &"--engines",
        &"gpu",
        &plain,
        &"-o",
        &t.path().join("z"),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("unknown engine 'gpu'"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn an_unreadable_input_fails_alone_and_leaves_nothing() {
    let t = crate::files_support::scratch();
    let key = keygen(t.path(), "128");
    let good = t.path().join("good");
    fs::write(&good, pattern(50_000, 11)).unwrap();
    // /proc/self/mem looks like a regular file but every read at offset 0 fails
    // (EIO): an input that cannot be read, even by root.
    let out = t.path().join("out");
    let o = run(&[
        &"encrypt",
        &"--key",
        &key,
        &good,
        &"/proc/self/mem",
        &"-o",
        &out,
        &"--json",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["files_ok"], 1);
    assert_eq!(s["failed"][0]["path"], "/proc/self/mem");
    assert!(out.join("good.hc").exists());
    assert!(!out.join("mem.hc").exists());
    assert_no_temporaries(&out);
}

/// The child's peak resident memory (VmHWM), sampled from /proc until it exits.
fn peak_rss_kib(mut cmd: Command) -> (std::process::ExitStatus, u64) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status_path = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    loop {
        if let Ok(text) = fs::read_to_string(&status_path) {
            for line in text.lines() {
                if let Some(v) = line.strip_prefix("VmHWM:") {
                    let kib: u64 = v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
                    peak = peak.max(kib);
                }
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            return (status, peak);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn memory_stays_bounded_for_a_large_file() {
    let t = crate::files_support::scratch();
    let key = keygen(t.path(), "128");
    // 80 MiB (sparse: cheap to make, read as zeros): whole-file buffering would need
    // at least that much memory; the pipeline holds a 4 MiB window.
    const SIZE: u64 = 80 << 20;
    const BOUND_KIB: u64 = 48 << 10;
    let big = t.path().join("big");
    fs::File::create(&big).unwrap().set_len(SIZE).unwrap();
    let mut cmd = hetcrypt();
    cmd.args(["encrypt", "-q", "--key"]).arg(&key).arg(&big);
    let (status, peak) = peak_rss_kib(cmd);
    assert!(status.success());
    assert!(peak > 0 && peak < BOUND_KIB, "peak RSS {peak} KiB");
    let sealed = t.path().join("big.hc");
    assert_eq!(
        fs::metadata(&sealed).unwrap().len(),
        12 + 56 + SIZE + 16 * (SIZE / 16384 + 1)
    );
    let mut cmd = hetcrypt();
    cmd.args(["decrypt", "-q", "--key"])
        .arg(&key)
        .arg(&sealed)
        .args(["-o"])
        .arg(t.path().join("back"));
    let (status, peak) = peak_rss_kib(cmd);
    assert!(status.success());
    assert!(peak > 0 && peak < BOUND_KIB, "peak RSS {peak} KiB");
    assert_eq!(fs::metadata(t.path().join("back")).unwrap().len(), SIZE);
}
