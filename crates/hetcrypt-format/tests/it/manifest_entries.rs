//! A manifest's bookkeeping beside its encoding (found untested by `cargo mutants`,
//! issue 25): it is empty until a file is listed, lists each path once and in order,
//! and takes paths of 1 to 65535 bytes.

use hetcrypt_format::manifest::{FileEntry, Manifest};
use hetcrypt_format::FormatError;

#[test]
fn a_manifest_is_empty_until_a_file_is_listed() {
    let mut m = Manifest::new();
    assert!(m.is_empty());
    assert_eq!(m.len(), 0);
    let entry = FileEntry {
        size: 5,
        commitment: [3; 32],
    };
    m.insert(b"a/b.txt", entry).unwrap();
    assert!(!m.is_empty());
    assert_eq!(m.len(), 1);
    assert_eq!(m.get(b"a/b.txt"), Some(&entry));
    assert!(m.insert(b"a/b.txt", entry).is_err(), "a path listed twice");
    assert_eq!(m.len(), 1);
}

#[test]
fn paths_are_1_to_65535_bytes_and_listed_in_order() {
    use hetcrypt_format::manifest::MAX_PATH_LEN;
    let entry = |size| FileEntry {
        size,
        commitment: [0; 32],
    };
    let mut m = Manifest::new();
    let longest = vec![b'x'; MAX_PATH_LEN];
    m.insert(&longest, entry(1))
        .expect("65535 bytes fit the 16-bit length");
    for bad in [Vec::new(), vec![b'x'; MAX_PATH_LEN + 1]] {
        match m.insert(&bad, entry(2)) {
            Err(FormatError::BadManifest(why)) => {
                assert!(why.contains(&format!("{} bytes", bad.len())), "{why}")
            }
            other => panic!("a path of {} bytes: {other:?}", bad.len()),
        }
    }
    m.insert(b"b", entry(3)).unwrap();
    m.insert(b"a/c", entry(4)).unwrap();
    let listed: Vec<(Vec<u8>, u64)> = m.iter().map(|(p, e)| (p.to_vec(), e.size)).collect();
    assert_eq!(
        listed,
        [(b"a/c".to_vec(), 4), (b"b".to_vec(), 3), (longest, 1)],
        "every file, in path order"
    );
}
