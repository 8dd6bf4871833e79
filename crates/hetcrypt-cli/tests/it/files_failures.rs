//! Issue 19, items 8 to 13: failing early and bounded, messages for people, keys and
//! streams. Each test is named after the failure it reproduces.

use std::fs;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use crate::files_support;
use files_support::{
    assert_no_temporaries, cannot_run_here, encrypt_json, hetcrypt, key, run, stderr,
};

/// Longest a run may take before the test calls it stuck (a debug build on a busy
/// machine; the failures it guards against took hours).
const PATIENCE: Duration = Duration::from_secs(60);

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
    let t = crate::files_support::scratch();
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

/// `hetcrypt ARGS` under `ulimit -n LIMIT` (soft and hard).
fn under_ulimit(limit: u32, args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_hetcrypt"));
    for a in args {
        cmd.arg(a);
    }
    run_within(cmd)
}

/// Directories and files per directory of the descriptor test: 300 files, almost five
/// times the limit, so holding one descriptor per file (or per file of a pending
/// durability group) runs out, while the test stays quick in a debug build.
const FD_TEST_DIRS: usize = 10;
const FD_TEST_FILES: usize = 30;

#[test]
fn a_tree_of_300_files_under_ulimit_64_does_not_run_out_of_descriptors() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let src = t.path().join("src");
    for d in 0..FD_TEST_DIRS {
        let dir = src.join(format!("d{d}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..FD_TEST_FILES {
            fs::write(dir.join(format!("f{f}")), format!("{d}/{f}")).unwrap();
        }
    }
    let enc = t.path().join("enc");
    let dec = t.path().join("dec");
    let o = under_ulimit(64, &[&"encrypt", &"-q", &"--key", &key, &src, &"-o", &enc]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = under_ulimit(64, &[&"decrypt", &"-q", &"--key", &key, &enc, &"-o", &dec]);
    assert!(o.status.success(), "{}", stderr(&o));
    for d in 0..FD_TEST_DIRS {
        for f in 0..FD_TEST_FILES {
            let got = fs::read_to_string(dec.join(format!("d{d}/f{f}"))).unwrap();
            assert_eq!(got, format!("{d}/{f}"));
        }
    }
}

#[test]
fn a_255_byte_name_works_and_errors_name_the_user_path_and_side() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    // 252 bytes: its .hc name has the maximum 255 (the old temporary name added 12).
    let name = "n".repeat(252);
    let plain = t.path().join(&name);
    fs::write(&plain, b"long name").unwrap();
    let o = run(&[&"encrypt", &"--key", &key, &plain]);
    assert!(o.status.success(), "{}", stderr(&o));
    let sealed = t.path().join(format!("{name}.hc"));
    let out = t.path().join("out");
    fs::create_dir(&out).unwrap();
    let o = run(&[&"decrypt", &"--key", &key, &sealed, &"-o", &out]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(fs::read(out.join(&name)).unwrap(), b"long name");

    // A destination that cannot be written: the message says write, names the
    // destination the user gave, and no temporary.
    // (sysfs refuses new files even to root.)
    let o = run(&[&"encrypt", &"--key", &key, &plain, &"-o", &"/sys/x.hc"]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("cannot write /sys: Permission denied"), "{e}");
    assert!(
        !e.contains(".hetcrypt-tmp-") && !e.contains(&format!(".{name}.")),
        "{e}"
    );
    // An input that cannot be read says read.
    let o = run(&[
        &"encrypt",
        &"--key",
        &key,
        &"/proc/self/mem",
        &"-o",
        &out.join("m.hc"),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("cannot read /proc/self/mem"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn control_characters_in_names_cannot_forge_summary_lines() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let enc = t.path().join("enc");
    fs::create_dir(&enc).unwrap();
    // Not a hetcrypt file (fails), and a link (skipped), with names that would clear
    // the screen and add a line to the summary if printed raw.
    let evil = "x\u{1b}[2J\n  failed:  forged: wrong key\r.hc";
    fs::write(enc.join(evil), b"not a ciphertext").unwrap();
    std::os::unix::fs::symlink("nowhere", enc.join(format!("link{evil}"))).unwrap();
    let o = run(&[
        &"decrypt",
        &"--key",
        &key,
        &enc,
        &"-o",
        &t.path().join("dec"),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        !e.contains('\u{1b}') && !e.contains('\r'),
        "raw control characters: {e:?}"
    );
    assert!(
        !e.lines().any(|l| l.starts_with("  failed:  forged")),
        "forged line: {e}"
    );
    assert!(e.contains("x\\u{1b}[2J\\n  failed:  forged"), "{e}");
}

#[test]
fn keys_and_streams_refuse_what_would_betray_the_user() {
    use std::os::unix::fs::PermissionsExt;
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let plain = t.path().join("plain");
    fs::write(&plain, b"data").unwrap();

    // A key file others may read: used, with a warning.
    fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
    let o = run(&[&"encrypt", &"-q", &"--key", &key, &plain]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("others may read it"), "{}", stderr(&o));
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();

    // An all-zero key: refused, nothing written.
    let zero = t.path().join("zero");
    fs::write(&zero, format!("{}\n", "0".repeat(32))).unwrap();
    fs::set_permissions(&zero, fs::Permissions::from_mode(0o600)).unwrap();
    let o = run(&[
        &"encrypt",
        &"--key",
        &zero,
        &plain,
        &"-o",
        &t.path().join("z.hc"),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("all-zero key"), "{}", stderr(&o));
    assert!(!t.path().join("z.hc").exists());

    // keygen -o - prints the key, makes no file named "-".
    let o = hetcrypt()
        .current_dir(t.path())
        .args(["keygen", "-o", "-"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let hex = String::from_utf8(o.stdout).unwrap();
    assert_eq!(hex.trim().len(), 32, "{hex}");
    assert!(!t.path().join("-").exists());

    // A closed standard input is refused, not encrypted as an empty message.
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg("exec \"$0\" encrypt --key \"$1\" - -o \"$2\" <&-")
        .arg(env!("CARGO_BIN_EXE_hetcrypt"))
        .arg(&key)
        .arg(t.path().join("closed.hc"));
    let o = run_within(cmd);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("standard input is closed"),
        "{}",
        stderr(&o)
    );
    assert!(!t.path().join("closed.hc").exists());

    // Ciphertext to a terminal is refused (`script` gives the command a terminal).
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        cannot_run_here(
            "keys_and_streams_refuse_what_would_betray_the_user (its terminal case)",
            "no `script` (util-linux) to give the command a terminal",
        );
        return;
    }
    let mut cmd = std::process::Command::new("script");
    cmd.arg("-qec")
        .arg(format!(
            "'{}' encrypt --key '{}' '{}' -o -",
            env!("CARGO_BIN_EXE_hetcrypt"),
            key.display(),
            plain.display()
        ))
        .arg("/dev/null");
    let o = run_within(cmd);
    let all = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(
        all.contains("refusing to write ciphertext to a terminal"),
        "{all}"
    );
}

#[test]
fn sparse_regions_stay_sparse_when_decrypted() {
    use std::os::unix::fs::MetadataExt;
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let plain = t.path().join("sparse");
    // 8 MiB: data, a 7 MiB hole, data.
    let f = fs::File::create(&plain).unwrap();
    f.set_len(8 << 20).unwrap();
    drop(f);
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = fs::OpenOptions::new().write(true).open(&plain).unwrap();
        f.write_all(&[1u8; 100_000]).unwrap();
        f.seek(SeekFrom::End(-5)).unwrap();
        f.write_all(b"tail!").unwrap();
    }
    let enc = t.path().join("sparse.hc");
    let dec = t.path().join("back");
    let o = run(&[&"encrypt", &"-q", &"--key", &key, &plain, &"-o", &enc]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&[&"decrypt", &"-q", &"--key", &key, &enc, &"-o", &dec]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(fs::read(&dec).unwrap() == fs::read(&plain).unwrap());
    let allocated = fs::metadata(&dec).unwrap().blocks() * 512;
    assert!(
        allocated < 2 << 20,
        "{allocated} bytes allocated for 8 MiB mostly hole"
    );

    // A file ending in zeros keeps its length.
    let zeros = t.path().join("zeros");
    fs::write(&zeros, vec![0u8; 100_000]).unwrap();
    let o = run(&[&"encrypt", &"-q", &"--key", &key, &zeros]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&[
        &"decrypt",
        &"-q",
        &"--key",
        &key,
        &t.path().join("zeros.hc"),
        &"-o",
        &t.path().join("zeros.out"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        fs::read(t.path().join("zeros.out")).unwrap(),
        vec![0u8; 100_000]
    );
}

/// A tree of `name` and `still`, `size` bytes each, encrypted with the debug-build
/// hook `hook` changing `name` after its first read: `name` fails as changed while it
/// was read and leaves no output, `still` is encrypted, no temporary is left.
fn a_changed_file_fails_alone(hook: &str, name: &str, size: usize) {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join(name), vec![5u8; size]).unwrap();
    fs::write(src.join("still"), vec![6u8; size]).unwrap();
    let out = t.path().join("out");
    let o = encrypt_json(&key, &src, &out)
        .env(hook, name)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{size}: {}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["files_ok"], 1, "{size}: {s:#}");
    let reason = s["failed"][0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("changed while it was read"),
        "{size}: {reason}"
    );
    assert!(!out.join(format!("{name}.hc")).exists(), "{size}");
    assert!(out.join("still.hc").is_file(), "{size}");
    assert_no_temporaries(&out);
}

#[test]
fn a_file_truncated_while_it_is_encrypted_fails_and_leaves_nothing() {
    // Debug builds: cut `shrinks` to half its size after its first read.
    a_changed_file_fails_alone("HETCRYPT_TEST_TRUNCATE_WHILE_READING", "shrinks", 100_000);
}

#[test]
fn a_file_grown_while_it_is_encrypted_fails_and_leaves_nothing() {
    // Debug builds: append to `grows` after its first read. Sizes read whole by the
    // first read (its end then found by `fstat`, not by another read) and one read in
    // several.
    for size in [16_384usize, 5_000, 300_000] {
        a_changed_file_fails_alone("HETCRYPT_TEST_GROW_WHILE_READING", "grows", size);
    }
}

/// `levels` nested directories of 200-byte names under `root`, each holding a file `f`
/// that says its level, made through descriptors (the paths exceed PATH_MAX).
fn deep_tree(root: &Path, levels: usize) {
    use rustix::fs::{mkdirat, openat, Mode, OFlags, CWD};
    fs::create_dir(root).unwrap();
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY;
    let mut dir = openat(CWD, root, dir_flags, Mode::empty()).unwrap();
    for level in 0..levels {
        let name = format!("{level:02}{}", "x".repeat(198));
        mkdirat(&dir, name.as_str(), Mode::from_raw_mode(0o755)).unwrap();
        dir = openat(&dir, name.as_str(), dir_flags, Mode::empty()).unwrap();
        let f = openat(
            &dir,
            "f",
            OFlags::WRONLY | OFlags::CREATE,
            Mode::from_raw_mode(0o644),
        )
        .unwrap();
        rustix::io::write(&f, format!("level {level}").as_bytes()).unwrap();
    }
}

/// The contents of every `f` down a tree made by [`deep_tree`] (`.hc` for encrypted).
fn deep_contents(root: &Path, levels: usize, file: &str) -> Vec<Vec<u8>> {
    use rustix::fs::{openat, Mode, OFlags, CWD};
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY;
    let mut dir = openat(CWD, root, dir_flags, Mode::empty()).unwrap();
    let mut out = Vec::new();
    for level in 0..levels {
        let name = format!("{level:02}{}", "x".repeat(198));
        dir = openat(&dir, name.as_str(), dir_flags, Mode::empty()).unwrap();
        let f = openat(&dir, file, OFlags::RDONLY, Mode::empty()).unwrap();
        let mut buf = vec![0u8; 4096];
        let n = rustix::io::read(&f, &mut buf).unwrap();
        buf.truncate(n);
        out.push(buf);
    }
    out
}

#[test]
fn a_tree_deeper_than_path_max_is_walked_not_skipped() {
    const LEVELS: usize = 25; // 25 x 201 bytes: about 5,000, past PATH_MAX (4,096)
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let src = t.path().join("src");
    deep_tree(&src, LEVELS);
    let enc = t.path().join("enc");
    let dec = t.path().join("dec");
    let o = run(&[&"encrypt", &"--json", &"--key", &key, &src, &"-o", &enc]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["files_ok"], LEVELS, "{s}");
    assert_eq!(s["files_failed"], 0, "{s}");
    assert_eq!(deep_contents(&enc, LEVELS, "f.hc").len(), LEVELS);
    let o = run(&[&"decrypt", &"-q", &"--key", &key, &enc, &"-o", &dec]);
    assert!(o.status.success(), "{}", stderr(&o));
    let want: Vec<Vec<u8>> = (0..LEVELS)
        .map(|l| format!("level {l}").into_bytes())
        .collect();
    assert_eq!(deep_contents(&dec, LEVELS, "f"), want);
}
