//! Shared helpers for the `files_*` tests (a directory module, so Cargo does not build
//! it as a test of its own).
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// The built `hetcrypt` binary, with only the cpu engine: the same on every machine
/// (the kernel engine is covered by the testbed script).
pub fn hetcrypt() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hetcrypt"));
    c.env_remove("HETCRYPT_ENGINES");
    c
}

/// Runs `hetcrypt ARGS` (paths or strings).
pub fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = hetcrypt();
    for a in args {
        c.arg(a);
    }
    c.output().unwrap()
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

/// What a test that cannot run here does: it fails, naming what is missing, unless
/// `HETCRYPT_ALLOW_SKIP` is set, for a machine known to lack it; then it says SKIPPED
/// (in the captured output: the variable is the visible, deliberate part) and the test
/// returns. A skip that returned silently passed on every machine that lacked the tool.
pub fn cannot_run_here(test: &str, missing: &str) {
    assert!(
        std::env::var_os("HETCRYPT_ALLOW_SKIP").is_some(),
        "{test} cannot run here: {missing}; install it, or set HETCRYPT_ALLOW_SKIP=1 to \
         skip it on this machine"
    );
    // Past the test runner's capture (`eprintln!` is captured): a skip must show in
    // the output of a passing run.
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test} (HETCRYPT_ALLOW_SKIP): {missing}"
    );
}
