//! Shared helpers for the `files_*` tests (a directory module, so Cargo does not build
//! it as a test of its own).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The built `hetcrypt` binary, with only the cpu engine: the same on every machine
/// (the kernel engine is covered by the testbed script).
pub fn hetcrypt() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hetcrypt"));
    c.env_remove("HETCRYPT_ENGINES");
    c
}

/// Where the tests write: tmpfs where the machine has one. Each `encrypt`/`decrypt`
/// ends with a sync of its outputs' file systems (docs/format.md, durability); on a
/// shared disk that sync waits for every other process's dirty data: two 300-file
/// tests took 3.6 s each on /tmp against 0.1 s on /dev/shm beside other builds. What
/// the tests check is which syncs are made and what the outputs hold, not the disk.
const SCRATCH: &str = "/dev/shm";

/// A fresh temporary directory, on tmpfs where there is one (see `SCRATCH`).
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(SCRATCH).unwrap_or_else(|_| tempfile::tempdir().unwrap())
}

/// Runs `hetcrypt ARGS` (paths or strings).
pub fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = hetcrypt();
    for a in args {
        c.arg(a);
    }
    c.output().unwrap()
}

/// A fresh key file `key` in `dir` (by `hetcrypt keygen`).
pub fn key(dir: &Path) -> PathBuf {
    let key = dir.join("key");
    let o = run(&[&"keygen", &"-o", &key]);
    assert!(o.status.success(), "{}", stderr(&o));
    key
}

/// `hetcrypt encrypt --json --key KEY SRC -o OUT`, to be given its environment and run.
pub fn encrypt_json(key: &Path, src: &Path, out: &Path) -> Command {
    let mut c = hetcrypt();
    c.args(["encrypt", "--json", "--key"])
        .arg(key)
        .arg(src)
        .arg("-o")
        .arg(out);
    c
}

/// A run's stderr, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// No file whose name marks it temporary, anywhere under `root`.
pub fn assert_no_temporaries(root: &Path) {
    for e in walkdir::WalkDir::new(root) {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy();
        assert!(
            !name.ends_with(".tmp") && !name.starts_with(".hetcrypt-tmp-"),
            "temporary left behind: {}",
            e.path().display()
        );
    }
}

#[path = "../../../../hetcrypt-format/tests/common/skip.rs"]
mod skip;
// Not every test binary that includes this module skips anything.
#[allow(unused_imports)]
pub use skip::cannot_run_here;
