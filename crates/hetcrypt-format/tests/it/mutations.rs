//! A deterministic mutation smoke test for the three parsers a hostile file reaches:
//! the wrapper header, the chunk stream and the tree manifest. Thousands of seeded
//! mutations (bit flips, byte overwrites, cuts, insertions, splices) of valid inputs
//! must each fail with an error (or, for a mutation that changes nothing, succeed),
//! never panic or hang, and a failing stream must have written only a prefix of the
//! plaintext made of whole chunks. Not a coverage-guided fuzzer: a fixed corpus that
//! runs in a second on every `cargo test`.

use crate::common;

use hetcrypt::policy::Pull;
use hetcrypt_format::manifest::Manifest;
use hetcrypt_format::{
    Aead, DecryptStream, FileEntry, Observer, OpenParams, Pipeline, SealParams, Wrapper, CHUNK_SIZE,
};

/// Mutations per seed input.
const ROUNDS: usize = 600;

/// xorshift64: the same mutations on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One random change to `input`.
fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut m = input.to_vec();
    let at = rng.below(m.len());
    match rng.below(5) {
        0 => m[at] ^= 1 << rng.below(8),
        1 => m[at] = rng.next() as u8,
        2 => m.truncate(at),
        3 => {
            let n = 1 + rng.below(40);
            let junk: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            m.splice(at..at, junk);
        }
        _ => {
            // Copy a run of the input over another place (reordering, duplication).
            let from = rng.below(m.len());
            let n = rng.below(64).min(m.len() - from).min(m.len() - at);
            let run = m[from..from + n].to_vec();
            m[at..at + n].copy_from_slice(&run);
        }
    }
    m
}

struct Keep(Vec<hetcrypt_format::Result<()>>);
impl<S> Observer<S> for Keep {
    fn done(&mut self, _s: S, r: hetcrypt_format::Result<()>) {
        self.0.push(r);
    }
}

/// The seed of the corpus: the wrapper and stream mutations of the plain message, then
/// of the tree member, then the manifest's, one sequence.
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

const KEY: [u8; 16] = [9u8; 16];

/// The plaintext, and its message sealed alone (`tree` false) or as tree member `d/f`.
fn sealed(tree: bool) -> (Vec<u8>, Vec<u8>) {
    let pt = common::pattern(3 * CHUNK_SIZE + 777, 5);
    let mut params = SealParams::new(Aead::Aes128Gcm);
    if tree {
        params = params.tree_path(b"d/f".to_vec());
    }
    let ct = common::seal(&common::cpu(), &Pull, &KEY, params, &pt, 4).unwrap();
    (pt, ct)
}

/// The corpus's generator with the mutations of the parts before `part` drawn (0: the
/// plain message, 1: the tree member, 2: the manifest), so each part, run as a test of
/// its own, meets the same mutations as when one test ran all three in a row.
fn rng_at(part: usize) -> Rng {
    let mut rng = Rng(SEED);
    for tree in [false, true].into_iter().take(part) {
        // Mutations draw on the input's length only, never on its bytes.
        let len = sealed(tree).1.len();
        let input = vec![0u8; len];
        for _ in 0..ROUNDS {
            mutate(&mut rng, &input);
        }
    }
    rng
}

/// [`ROUNDS`] mutations of the message (`tree` false) or the tree member.
fn mutated_messages_fail_cleanly(tree: bool) {
    let what = if tree { "member" } else { "plain" };
    let (pt, ct) = sealed(tree);
    let mut rng = rng_at(usize::from(tree));
    let mut pipeline = Pipeline::new(common::cpu(), &Pull).unwrap().window(3);
    for round in 0..ROUNDS {
        let bad = mutate(&mut rng, &ct);
        // The wrapper parser alone.
        let _ = Wrapper::parse(&bad);
        let mut out = Vec::new();
        let mut stream = DecryptStream::new(&bad[..], &mut out, &KEY, OpenParams::Hetcrypt)
            .with_input_len(bad.len() as u64);
        if tree {
            stream = stream.in_tree(b"d/f".to_vec(), None);
        }
        let mut keep = Keep(Vec::new());
        pipeline.run([stream], &mut keep).unwrap();
        let result = keep.0.pop().unwrap();
        if bad == ct {
            result.unwrap();
            continue;
        }
        assert!(
            result.is_err(),
            "{what} round {round}: a mutation was accepted"
        );
        assert_eq!(
            out.len() % CHUNK_SIZE,
            0,
            "{what} round {round}: partial chunk"
        );
        assert!(
            pt.starts_with(&out),
            "{what} round {round}: wrote non-plaintext"
        );
    }
}

#[test]
fn mutated_messages_fail_cleanly_without_partial_chunks() {
    mutated_messages_fail_cleanly(false);
}

#[test]
fn mutated_tree_members_fail_cleanly_without_partial_chunks() {
    mutated_messages_fail_cleanly(true);
}

/// The manifest parser on mutated plaintexts (as if a key were compromised: the
/// parser must still never panic) and the real encoding of a 50-file manifest.
#[test]
fn mutated_manifests_fail_or_are_canonical() {
    let mut rng = rng_at(2);
    let mut m = Manifest::new();
    for i in 0..50u8 {
        let entry = FileEntry {
            size: u64::from(i) * 1000,
            commitment: [i; 32],
        };
        m.insert(format!("dir{}/file{i}", i % 5).as_bytes(), entry)
            .unwrap();
    }
    let bytes = m.to_bytes();
    for _ in 0..10 * ROUNDS {
        let bad = mutate(&mut rng, &bytes);
        if let Ok(parsed) = Manifest::parse(&bad) {
            // Whatever parses is canonical: it encodes back to the same bytes.
            assert_eq!(parsed.to_bytes(), bad);
        }
    }
}
