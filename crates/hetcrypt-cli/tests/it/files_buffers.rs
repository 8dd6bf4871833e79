//! Issue 24: outputs reuse buffers (small outputs' first buffers and chunk buffers go
//! round a pool; a small output takes its chunk's buffer whole instead of copying it).
//! Reuse must never carry one file's bytes into another's output: a tree of files of
//! many sizes, in an order that mixes large and small, round-trips exactly, zeros
//! (written as holes when decrypted) included.

use std::fs;
use std::path::{Path, PathBuf};

use crate::files_support;
use files_support::{assert_no_temporaries, key, run, stderr};

/// Sizes around every boundary the buffers have: empty, headers only, the smallest
/// chunk taken whole (4 KiB), a chunk (16 KiB), a small output's most (32 KiB), a
/// write buffer (128 KiB) and beyond.
const SIZES: [usize; 19] = [
    0, 1, 17, 4095, 4096, 4097, 16383, 16384, 16385, 20_000, 32_767, 32_768, 32_769, 65_537,
    131_071, 131_072, 131_073, 200_000, 300_001,
];
/// Rounds over the sizes: enough files that buffers come back and are reused many
/// times, in several directories.
const ROUNDS: usize = 4;
/// Every this-many files is all zeros: never taken whole, decrypted as a hole.
const ZEROS_EVERY: usize = 7;

fn rel(i: usize) -> PathBuf {
    PathBuf::from(format!("d{}/f{i:03}", i % 3))
}

/// File `i`'s size: the sizes in a different order each round, so a large file's
/// buffers are followed by a small file's and the other way round.
fn size(i: usize) -> usize {
    let (round, k) = (i / SIZES.len(), i % SIZES.len());
    SIZES[(k * (2 * round + 5)) % SIZES.len()]
}

/// File `i`'s content: bytes no other file has at the same place (xorshift seeded by
/// `i`), or zeros, or (every [`ZEROS_EVERY`] files, another offset) those bytes with
/// its second chunk zeroed: a taken first chunk, then a hole.
fn content(i: usize) -> Vec<u8> {
    if i % ZEROS_EVERY == ZEROS_EVERY - 1 {
        return vec![0; size(i)];
    }
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (i as u64 + 1);
    let mut bytes: Vec<u8> = (0..size(i))
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    if i % ZEROS_EVERY == 2 {
        let len = bytes.len();
        bytes[len.min(CHUNK)..len.min(2 * CHUNK)].fill(0);
    }
    bytes
}

/// The format's chunk (plaintext bytes).
const CHUNK: usize = 16 * 1024;

fn files() -> usize {
    ROUNDS * SIZES.len()
}

fn make_tree(root: &Path) {
    for i in 0..files() {
        let p = root.join(rel(i));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, content(i)).unwrap();
    }
}

#[test]
fn a_tree_of_many_sizes_round_trips_exactly_through_reused_buffers() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let (src, enc, dec) = (
        t.path().join("src"),
        t.path().join("enc"),
        t.path().join("dec"),
    );
    make_tree(&src);
    let o = run(&[&"encrypt", &"-q", &"--key", &key, &src, &"-o", &enc]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&[&"decrypt", &"-q", &"--key", &key, &enc, &"-o", &dec]);
    assert!(o.status.success(), "{}", stderr(&o));
    for i in 0..files() {
        let got = fs::read(dec.join(rel(i))).unwrap();
        assert_eq!(got.len(), size(i), "file {i}: length");
        assert!(got == content(i), "file {i} ({} bytes): content", size(i));
    }
    assert_no_temporaries(&enc);
    assert_no_temporaries(&dec);
}

/// The same files encrypted one by one (no tree, so no reuse between them) decrypt
/// to what the tree's do: a file's ciphertext length does not depend on the files
/// before it.
#[test]
fn a_file_encrypted_alone_and_in_the_tree_has_the_same_length() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let (src, enc) = (t.path().join("src"), t.path().join("enc"));
    make_tree(&src);
    let o = run(&[&"encrypt", &"-q", &"--key", &key, &src, &"-o", &enc]);
    assert!(o.status.success(), "{}", stderr(&o));
    for i in [0, 5, 8, 17, 20, 40] {
        let alone = t.path().join(format!("alone{i}.hc"));
        let o = run(&[
            &"encrypt",
            &"-q",
            &"--key",
            &key,
            &src.join(rel(i)),
            &"-o",
            &alone,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let mut in_tree = enc.join(rel(i)).into_os_string();
        in_tree.push(".hc");
        assert_eq!(
            fs::metadata(&alone).unwrap().len(),
            fs::metadata(&in_tree).unwrap().len(),
            "file {i} ({} bytes)",
            size(i)
        );
    }
}
