//! Issue 19, item 4: an encrypted tree is authenticated as a whole. A file swapped
//! with another, renamed, deleted, added, or rolled back to an older version of
//! itself, and a deleted manifest, are each found and named, and nothing is written
//! for the files involved; the rest of the tree still decrypts.

use std::fs;
use std::path::{Path, PathBuf};

use crate::files_support;
use files_support::{assert_no_temporaries, cannot_run_here, key, run, stderr};

fn copy_tree(from: &Path, to: &Path) {
    for e in walkdir::WalkDir::new(from) {
        let e = e.unwrap();
        let dest = to.join(e.path().strip_prefix(from).unwrap());
        if e.file_type().is_dir() {
            fs::create_dir_all(&dest).unwrap();
        } else {
            fs::copy(e.path(), &dest).unwrap();
        }
    }
}

/// Decrypts `enc` into a fresh folder: (summary, output folder).
fn decrypt(key: &Path, enc: &Path, out: &Path) -> serde_json::Value {
    let o = run(&[&"decrypt", &"--json", &"--key", &key, &enc, &"-o", &out]);
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(&o)))
}

/// The reason given for the failed path ending in `name`.
fn reason(s: &serde_json::Value, name: &str) -> String {
    s["failed"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str().unwrap().ends_with(name))
        .map(|f| f["reason"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("{name} not listed as failed: {s:#}"))
}

#[test]
fn a_swapped_renamed_deleted_added_or_rolled_back_file_is_named_and_not_written() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let src = t.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("a"), b"version 1 of a").unwrap();
    fs::write(src.join("b"), b"b").unwrap();
    fs::write(src.join("sub/c"), b"c").unwrap();
    let old = t.path().join("old");
    let o = run(&[&"encrypt", &"-q", &"--key", &key, &src, &"-o", &old]);
    assert!(o.status.success(), "{}", stderr(&o));
    fs::write(src.join("a"), b"version 2 of a").unwrap();
    let enc = t.path().join("enc");
    let o = run(&[&"encrypt", &"-q", &"--key", &key, &src, &"-o", &enc]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Another tree under the same key, to take a file from.
    let other_src = t.path().join("other-src");
    fs::create_dir(&other_src).unwrap();
    fs::write(other_src.join("x"), b"x").unwrap();
    let other = t.path().join("other");
    let o = run(&[&"encrypt", &"-q", &"--key", &key, &other_src, &"-o", &other]);
    assert!(o.status.success(), "{}", stderr(&o));

    // The untouched tree decrypts.
    let s = decrypt(&key, &enc, &t.path().join("dec-ok"));
    assert_eq!(s["files_failed"], 0, "{s:#}");
    assert_eq!(s["files_ok"], 3);

    // (case, change to a copy of the tree, failed names and their reason, unwritten)
    type Change = fn(&Path, &Path, &Path);
    type Case<'a> = (&'a str, Change, &'a [(&'a str, &'a str)], &'a [&'a str]);
    let cases: [Case; 7] = [
        (
            "swap",
            |e, _, _| {
                let (a, b) = (
                    fs::read(e.join("a.hc")).unwrap(),
                    fs::read(e.join("b.hc")).unwrap(),
                );
                fs::write(e.join("a.hc"), b).unwrap();
                fs::write(e.join("b.hc"), a).unwrap();
            },
            &[
                ("a.hc", "does not match the tree's manifest"),
                ("b.hc", "does not match"),
            ],
            &["a", "b"],
        ),
        (
            "rename",
            |e, _, _| fs::rename(e.join("b.hc"), e.join("renamed.hc")).unwrap(),
            &[
                ("renamed.hc", "not in the tree's manifest"),
                ("b.hc", "missing from the tree"),
            ],
            &["b", "renamed"],
        ),
        (
            "delete",
            |e, _, _| fs::remove_file(e.join("sub/c.hc")).unwrap(),
            &[("sub/c.hc", "missing from the tree")],
            &["sub/c"],
        ),
        (
            "add",
            |e, _, other| {
                fs::copy(other.join("x.hc"), e.join("x.hc"))
                    .map(drop)
                    .unwrap()
            },
            &[("x.hc", "not in the tree's manifest")],
            &["x"],
        ),
        (
            "rollback",
            |e, old, _| {
                fs::copy(old.join("a.hc"), e.join("a.hc"))
                    .map(drop)
                    .unwrap()
            },
            &[("a.hc", "rolled back")],
            &["a"],
        ),
        (
            "manifest rolled back",
            |e, old, _| {
                fs::copy(old.join(".hetcrypt-manifest"), e.join(".hetcrypt-manifest"))
                    .map(drop)
                    .unwrap()
            },
            // Every file was encrypted again since (new salts): none matches.
            &[
                ("a.hc", "rolled back"),
                ("b.hc", "rolled back"),
                ("sub/c.hc", "rolled back"),
            ],
            &["a", "b", "sub/c"],
        ),
        (
            "manifest deleted",
            |e, _, _| fs::remove_file(e.join(".hetcrypt-manifest")).unwrap(),
            &[
                ("a.hc", "manifest (.hetcrypt-manifest) is missing"),
                ("b.hc", "is missing"),
                ("sub/c.hc", "is missing"),
            ],
            &["a", "b", "sub/c"],
        ),
    ];
    for (case, change, failures, unwritten) in cases {
        let copy = t.path().join(format!("enc-{case}"));
        copy_tree(&enc, &copy);
        change(&copy, &old, &other);
        let out = t.path().join(format!("dec-{case}"));
        let s = decrypt(&key, &copy, &out);
        assert_eq!(s["files_failed"], failures.len(), "{case}: {s:#}");
        for (name, why) in failures {
            let r = reason(&s, name);
            assert!(r.contains(why), "{case}: {name}: {r}");
        }
        for name in unwritten {
            assert!(!out.join(name).exists(), "{case}: {name} was written");
        }
        assert_no_temporaries(&out);
    }
    // The untouched rest still came back in the partial cases.
    assert_eq!(fs::read(t.path().join("dec-swap/sub/c")).unwrap(), b"c");
    assert_eq!(fs::read(t.path().join("dec-rollback/b")).unwrap(), b"b");

    // One member on its own is checked against its tree's manifest too; a member
    // taken out of its tree is refused.
    let o = run(&[
        &"decrypt",
        &"--key",
        &key,
        &enc.join("sub/c.hc"),
        &"-o",
        &"-",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(o.stdout, b"c");
    let o = run(&[
        &"decrypt",
        &"--key",
        &key,
        &t.path().join("enc-rollback/a.hc"),
        &"-o",
        &"-",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("rolled back"), "{}", stderr(&o));
    let alone = t.path().join("alone.hc");
    fs::copy(enc.join("b.hc"), &alone).unwrap();
    let o = run(&[&"decrypt", &"--key", &key, &alone, &"-o", &"-"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("member of an encrypted tree"),
        "{}",
        stderr(&o)
    );
    assert!(o.stdout.is_empty());
}

#[test]
fn a_folder_of_an_encrypted_tree_is_checked_against_the_manifest_above_it() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let src = t.path().join("src");
    fs::create_dir_all(src.join("sub/deep")).unwrap();
    fs::write(src.join("top"), b"top").unwrap();
    fs::write(src.join("sub/s"), b"s").unwrap();
    fs::write(src.join("sub/deep/d"), b"d").unwrap();
    let enc = t.path().join("enc");
    let o = run(&[&"encrypt", &"-q", &"--key", &key, &src, &"-o", &enc]);
    assert!(o.status.success(), "{}", stderr(&o));

    // The folder alone decrypts, checked against the root's manifest; files outside
    // it are not reported missing.
    let s = decrypt(&key, &enc.join("sub"), &t.path().join("dec-sub"));
    assert_eq!(s["files_failed"], 0, "{s:#}");
    assert_eq!(s["files_ok"], 2);
    assert_eq!(fs::read(t.path().join("dec-sub/deep/d")).unwrap(), b"d");

    // A file deleted inside the folder is missing; one moved into it from elsewhere
    // in the tree does not match.
    fs::remove_file(enc.join("sub/deep/d.hc")).unwrap();
    fs::copy(enc.join("top.hc"), enc.join("sub/s.hc")).unwrap();
    let out = t.path().join("dec-sub2");
    let s = decrypt(&key, &enc.join("sub"), &out);
    assert_eq!(s["files_failed"], 2, "{s:#}");
    assert!(reason(&s, "sub/deep/d.hc").contains("missing from the tree"));
    assert!(reason(&s, "sub/s.hc").contains("does not match"));
    assert!(!out.join("s").exists());
}

/// A tree as `hetcrypt encrypt` writes it, read back by an independent implementation
/// written from docs/format.md alone (Python's `cryptography`); where Python or that
/// package is missing it fails, or with `HETCRYPT_ALLOW_SKIP` set skips.
#[test]
fn an_independent_python_reader_decrypts_a_tree_and_checks_its_manifest() {
    let has = std::process::Command::new("python3")
        .args(["-c", "import cryptography"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        cannot_run_here(
            "an_independent_python_reader_decrypts_a_tree_and_checks_its_manifest",
            "no python3 with the cryptography package",
        );
        return;
    }
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let src = t.path().join("src");
    fs::create_dir_all(src.join("a/b")).unwrap();
    fs::write(src.join("empty"), b"").unwrap();
    fs::write(src.join("edge"), vec![7u8; 16384]).unwrap();
    let big: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(src.join("a/b/big"), &big).unwrap();
    fs::write(src.join("a/ünï côdé"), b"names as bytes").unwrap();
    let enc = t.path().join("enc");
    let o = run(&[&"encrypt", &"-q", &"--key", &key, &src, &"-o", &enc]);
    assert!(o.status.success(), "{}", stderr(&o));
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../hetcrypt-format/scripts/check-tree-vector.py"
    );
    let key_hex = fs::read_to_string(&key).unwrap();
    let o = std::process::Command::new("python3")
        .arg(script)
        .arg("--tree")
        .arg(key_hex.trim())
        .arg(&enc)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// xorshift64, so a failing tree reproduces from its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Every regular file under `root`: relative path, contents and permission bits.
fn snapshot(root: &Path) -> Vec<(PathBuf, Vec<u8>, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out: Vec<_> = walkdir::WalkDir::new(root)
        .sort_by_file_name()
        .into_iter()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let mode = e.metadata().unwrap().permissions().mode() & 0o777;
            (
                e.path().strip_prefix(root).unwrap().to_path_buf(),
                fs::read(e.path()).unwrap(),
                mode,
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn random_trees_round_trip_byte_for_byte() {
    // Name pieces: spaces, unicode, leading dashes and dots, a suffix lookalike.
    const PIECES: [&str; 8] = ["a", " b", "ü", "-x", ".h", "日本", "c.hc", "_"];
    // Chunk edges and small odd sizes.
    const SIZES: [usize; 7] = [0, 1, 16383, 16384, 16385, 32768, 777];
    let t = crate::files_support::scratch();
    let key = key(t.path());
    for seed in 1..=6u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let src = t.path().join(format!("src{seed}"));
        fs::create_dir(&src).unwrap();
        let mut dirs = vec![src.clone()];
        for i in 0..(5 + rng.below(25)) {
            let mut name: String = (0..1 + rng.below(3))
                .map(|_| PIECES[rng.below(PIECES.len() as u64) as usize])
                .collect();
            name.push_str(&i.to_string());
            let parent = dirs[rng.below(dirs.len() as u64) as usize].clone();
            if rng.below(4) == 0 {
                let d = parent.join(&name);
                fs::create_dir(&d).unwrap();
                dirs.push(d);
            } else {
                let size = SIZES[rng.below(SIZES.len() as u64) as usize];
                let bytes: Vec<u8> = (0..size).map(|_| rng.below(256) as u8).collect();
                let file = parent.join(&name);
                fs::write(&file, bytes).unwrap();
                let mode = [0o600, 0o644, 0o755][rng.below(3) as usize];
                use std::os::unix::fs::PermissionsExt;
                fs::set_permissions(&file, fs::Permissions::from_mode(mode)).unwrap();
            }
        }
        let enc = t.path().join(format!("enc{seed}"));
        let dec = t.path().join(format!("dec{seed}"));
        let o = run(&[&"encrypt", &"-q", &"--key", &key, &src, &"-o", &enc]);
        assert!(o.status.success(), "seed {seed}: {}", stderr(&o));
        let o = run(&[&"decrypt", &"-q", &"--key", &key, &enc, &"-o", &dec]);
        assert!(o.status.success(), "seed {seed}: {}", stderr(&o));
        assert!(
            snapshot(&src) == snapshot(&dec),
            "seed {seed}: trees differ"
        );
        for d in &dirs {
            let rel = d.strip_prefix(&src).unwrap();
            assert!(
                dec.join(rel).is_dir(),
                "seed {seed}: {} missing",
                rel.display()
            );
        }
    }
}

#[test]
fn trees_nested_in_the_input_are_each_checked_against_their_own_manifest() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    for name in ["a", "b"] {
        let d = t.path().join(name);
        fs::create_dir_all(d.join("sub")).unwrap();
        fs::write(d.join("sub/f"), name).unwrap();
        fs::write(d.join("g"), name).unwrap();
    }
    // Two trees side by side in one output: out/a and out/b, each with its manifest.
    let out = t.path().join("out");
    let o = run(&[
        &"encrypt",
        &"-q",
        &"--key",
        &key,
        &t.path().join("a"),
        &t.path().join("b"),
        &"-o",
        &out,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.join("a/.hetcrypt-manifest").is_file());
    assert!(out.join("b/.hetcrypt-manifest").is_file());

    // Decrypting their parent decrypts both, each checked against its own manifest.
    let s = decrypt(&key, &out, &t.path().join("dec"));
    assert_eq!(s["files_failed"], 0, "{s:#}");
    assert_eq!(s["files_ok"], 4);
    assert_eq!(fs::read(t.path().join("dec/b/sub/f")).unwrap(), b"b");

    // A file moved from one tree into the other is caught by the second's manifest,
    // and missing from the first's.
    fs::rename(out.join("a/g.hc"), out.join("b/ga.hc")).unwrap();
    let s = decrypt(&key, &out, &t.path().join("dec2"));
    assert_eq!(s["files_failed"], 2, "{s:#}");
    assert!(reason(&s, "b/ga.hc").contains("not in the tree's manifest"));
    assert!(reason(&s, "a/g.hc").contains("missing from the tree"));
}
