//! A manifest's bookkeeping beside its encoding (found untested by `cargo mutants`,
//! issue 25): it is empty until a file is listed, and lists each path once.

use hetcrypt_format::manifest::{FileEntry, Manifest};

#[test]
fn a_manifest_is_empty_until_a_file_is_listed() {
    let mut m = Manifest::new();
    assert!(m.is_empty());
    assert_eq!(m.len(), 0);
    let entry = FileEntry {
        size: 5,
        commitment: [3; 32],
    };
    m.insert(b"a/b.txt", entry.clone()).unwrap();
    assert!(!m.is_empty());
    assert_eq!(m.len(), 1);
    assert_eq!(m.get(b"a/b.txt"), Some(&entry));
    assert!(m.insert(b"a/b.txt", entry).is_err(), "a path listed twice");
    assert_eq!(m.len(), 1);
}
