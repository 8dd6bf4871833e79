//! Trees: the known-answer vector of docs/format.md ("Trees"), checked byte for byte
//! (and by `scripts/check-tree-vector.py`, an independent decryptor on Python's
//! `cryptography`, from the spec alone); path binding and manifest checks fail as the
//! spec says.

use crate::common;

use hetcrypt::policy::Pull;
use hetcrypt_format::{
    Aead, DecryptStream, FileEntry, FormatError, Manifest, Observer, OpenParams, Pipeline,
    SealParams,
};

/// The vector's input key: bytes 0x00..=0x0f.
const KEY: [u8; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
/// The member's salt and the manifest's (fixed for the vector only).
const FILE_SALT: [u8; 24] = [0x11; 24];
const MANIFEST_SALT: [u8; 24] = [0x22; 24];
const PATH: &[u8] = b"docs/a.txt";
const PLAINTEXT: &[u8] = b"hetcrypt tree vector\n";

/// The member `docs/a.txt` (docs/format.md, "Trees").
const FILE_HEX: &str = concat!(
    "6865746372797074010102011111111111111111111111111111111111111111111111119adcf0b6",
    "f76e7b3864d2beff7aed6bbd0580037a3a0bba2d1be7551d3b83c190bece3d941f299d4085e175c6",
    "0befd5a40c399823307190a8bedb1c7fb8a63f4a22d4176032",
);
/// The manifest listing it.
const MANIFEST_HEX: &str = concat!(
    "686574637279707401010201222222222222222222222222222222222222222222222222fdd51c4f",
    "d7cbddaaf91bb8644319acccdec37be3bb0a8e14121057d8d0434c1d3cea1f1700eb7680b35c2301",
    "ae2e102c9157a23c9666b483175057bf48b5808a6a1fca0b9596436123188340b6b9b2ca477dd023",
    "7ce22b2bd42a38739cfcaceebcbf702fee02e16ceb64b052963cb26cf7e09a2c945b8ca973320b6c",
    "722a3f0d0e",
);

fn seal(params: SealParams, pt: &[u8]) -> Vec<u8> {
    common::seal(&common::cpu(), &Pull, &KEY, params, pt, 4).unwrap()
}

struct Keep(Vec<hetcrypt_format::Result<()>>);
impl<S> Observer<S> for Keep {
    fn done(&mut self, _s: S, r: hetcrypt_format::Result<()>) {
        self.0.push(r);
    }
}

fn open(ct: &[u8], tree: Option<(&[u8], Option<[u8; 32]>)>) -> hetcrypt_format::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut stream = DecryptStream::new(ct, &mut out, &KEY, OpenParams::Hetcrypt);
    if let Some((path, commitment)) = tree {
        stream = stream.in_tree(path, commitment);
    }
    let mut keep = Keep(Vec::new());
    Pipeline::new(common::cpu(), &Pull)
        .unwrap()
        .run([stream], &mut keep)
        .unwrap();
    keep.0.pop().unwrap()?;
    Ok(out)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn the_tree_vector_and_what_a_tree_refuses() {
    let file = seal(
        SealParams::new(Aead::Aes128Gcm)
            .with_salt_for_tests(FILE_SALT)
            .tree_path(PATH),
        PLAINTEXT,
    );
    assert_eq!(file[11], 0x01, "tree flag");
    let commitment: [u8; 32] = file[36..68].try_into().unwrap();
    let mut m = Manifest::new();
    m.insert(
        PATH,
        FileEntry {
            size: PLAINTEXT.len() as u64,
            commitment,
        },
    )
    .unwrap();
    let manifest = seal(
        SealParams::new(Aead::Aes128Gcm)
            .with_salt_for_tests(MANIFEST_SALT)
            .tree_path(Vec::new()),
        &m.to_bytes(),
    );
    assert_eq!(hex(&file), FILE_HEX);
    assert_eq!(hex(&manifest), MANIFEST_HEX);

    // The manifest opens as the member with the empty path, and lists the file.
    let listed = Manifest::parse(&open(&manifest, Some((b"", None))).unwrap()).unwrap();
    assert_eq!(listed, m);
    // The file opens at its path with its listed commitment.
    assert_eq!(
        open(&file, Some((PATH, Some(commitment)))).unwrap(),
        PLAINTEXT
    );
    // Alone, it is refused; at another path (moved), it fails like a wrong key; with
    // another listed commitment (swapped, rolled back), it fails the manifest.
    assert!(matches!(open(&file, None), Err(FormatError::TreeMember)));
    assert!(matches!(
        open(&file, Some((b"docs/b.txt", None))),
        Err(FormatError::WrongKey)
    ));
    let mut other = commitment;
    other[0] ^= 1;
    assert!(matches!(
        open(&file, Some((PATH, Some(other)))),
        Err(FormatError::ManifestMismatch)
    ));
    // A plain (non-tree) file at a listed path fails the manifest too.
    let plain = seal(SealParams::new(Aead::Aes128Gcm), PLAINTEXT);
    assert!(matches!(
        open(&plain, Some((PATH, Some(commitment)))),
        Err(FormatError::ManifestMismatch)
    ));
}

/// The same vector through an independent implementation written from the spec
/// (Python's `cryptography`); where Python or that package is missing it fails, or with
/// `HETCRYPT_ALLOW_SKIP` set skips.
#[test]
fn an_independent_python_reader_opens_the_tree_vector() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/check-tree-vector.py");
    let has = std::process::Command::new("python3")
        .args(["-c", "import cryptography"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        common::cannot_run_here(
            "an_independent_python_reader_opens_the_tree_vector",
            "no python3 with the cryptography package",
        );
        return;
    }
    let o = std::process::Command::new("python3")
        .args([script, FILE_HEX, MANIFEST_HEX])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}
