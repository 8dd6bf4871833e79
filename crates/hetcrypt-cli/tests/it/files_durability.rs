//! Issue 24: outputs are made durable by a few batched syncs, not one fsync per file
//! (counted in the `--json` summary, not timed); a file failing mid-pipeline leaves no
//! output and no temporary; the summary reports the peak memory.

use std::fs;

use crate::files_support;
use files_support::{assert_no_temporaries, key, run, stderr};

/// Files in the tree: enough that one fsync each would show.
const FILES: usize = 300;
/// The most syncs such a tree may take: its commit groups (outputs finished while the
/// writer was busy; at most one per 16 outputs handed over, plus one per batch) and
/// the final one per file system. One per file would be 300 or more.
const MAX_SYNCS: u64 = 40;
/// The memory bound docs/format.md states.
const MEMORY_BOUND: u64 = 64 << 20;

fn summary(o: &std::process::Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn a_tree_is_made_durable_by_a_few_syncs_not_one_per_file() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let src = t.path().join("src");
    for i in 0..FILES {
        let d = src.join(format!("d{}", i % 7));
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join(format!("f{i}")), vec![i as u8; 100 + i * 37]).unwrap();
    }
    let enc = t.path().join("enc");
    let s = summary(&run(&[
        &"encrypt", &"--json", &"--key", &key, &src, &"-o", &enc,
    ]));
    assert_eq!(s["files_ok"], FILES as u64);
    let syncs = s["syncs"].as_u64().unwrap();
    assert!((2..=MAX_SYNCS).contains(&syncs), "{syncs} syncs");

    let back = t.path().join("back");
    let s = summary(&run(&[
        &"decrypt", &"--json", &"--key", &key, &enc, &"-o", &back,
    ]));
    assert_eq!(s["files_ok"], FILES as u64);
    let syncs = s["syncs"].as_u64().unwrap();
    assert!((2..=MAX_SYNCS).contains(&syncs), "{syncs} syncs");
    for i in 0..FILES {
        let p = back.join(format!("d{}", i % 7)).join(format!("f{i}"));
        assert_eq!(fs::read(&p).unwrap(), vec![i as u8; 100 + i * 37]);
    }
    assert_no_temporaries(t.path());
}

#[test]
fn a_file_failing_mid_pipeline_leaves_no_output_and_no_temporary() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    // 300 chunks: more than a window, so the failure comes after batches were written
    // behind into the output's temporary.
    let plain: Vec<u8> = (0..300 * 16384 + 9).map(|i| (i * 7 % 253) as u8).collect();
    let src = t.path().join("big");
    fs::write(&src, &plain).unwrap();
    let enc = t.path().join("big.hc");
    let o = run(&[&"encrypt", &"-q", &"--key", &key, &src, &"-o", &enc]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut ct = fs::read(&enc).unwrap();
    let chunk_270 = 12 + 24 + 32 + 270 * (16384 + 16) + 5;
    ct[chunk_270] ^= 0x40;
    fs::write(&enc, &ct).unwrap();
    for named in [false, true] {
        let out = t.path().join("out");
        let mut cmd = files_support::hetcrypt();
        cmd.args(["decrypt", "-q", "--key"])
            .arg(&key)
            .arg(&enc)
            .arg("-o")
            .arg(&out);
        if named {
            cmd.env("HETCRYPT_TEST_NO_TMPFILE", "1");
        }
        let o = cmd.output().unwrap();
        assert!(!o.status.success());
        assert!(stderr(&o).contains("chunk 270"), "{}", stderr(&o));
        assert!(
            !out.exists(),
            "unauthenticated plaintext left at the output"
        );
        assert_no_temporaries(t.path());
    }
}

#[test]
fn the_summary_reports_peak_memory_under_the_bound() {
    let t = crate::files_support::scratch();
    let key = key(t.path());
    let big = t.path().join("big");
    // Sparse: cheap to make; a whole-file buffer would need all of it.
    fs::File::create(&big).unwrap().set_len(96 << 20).unwrap();
    let s = summary(&run(&[&"encrypt", &"--json", &"--key", &key, &big]));
    let peak = s["peak_rss_bytes"].as_u64().unwrap();
    assert!(peak > 0 && peak < MEMORY_BOUND, "peak RSS {peak} bytes");
    assert!(s["syncs"].as_u64().unwrap() >= 2);
}
