//! Shared helpers for the `cli_*` tests (a directory module, so Cargo does not build it
//! as a test of its own).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The built `hetcrypt` binary.
pub fn hetcrypt() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hetcrypt"));
    // Keep the output independent of the caller's terminal.
    cmd.env_remove("COLUMNS").env("NO_COLOR", "1");
    cmd
}

/// Runs `hetcrypt ARGS`.
pub fn run(args: &[&str]) -> Output {
    hetcrypt()
        .args(args)
        .output()
        .expect("the hetcrypt binary runs")
}

/// Runs `hetcrypt ARGS`, which must succeed, and returns its stdout.
pub fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "hetcrypt {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

/// Runs `hetcrypt ARGS`, which must fail, and returns its stderr.
pub fn fails(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        !out.status.success(),
        "hetcrypt {args:?} should have failed; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(out.stdout.is_empty(), "a failed run prints no results");
    String::from_utf8(out.stderr).expect("stderr is UTF-8")
}

/// Whether the `kernel` engine is usable here (only inside the testbed guest).
pub fn kernel_available() -> bool {
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["engines", "--json"])).expect("engines --json is JSON");
    json["engines"]
        .as_array()
        .expect("engines is a list")
        .iter()
        .any(|e| e["name"] == "kernel")
}

/// Asserts `actual` is the committed snapshot `tests/snapshots/NAME`. With
/// `UPDATE_SNAPSHOTS=1` in the environment, a snapshot that differs (or is missing) is
/// rewritten from `actual`, and the test still fails, saying so: a run that rewrites
/// snapshots can never pass (in CI, or by an unnoticed variable), and the rewrite shows
/// up in `git diff` for review. Run again without it to see them pass.
pub fn assert_snapshot(name: &str, actual: &str) {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(name);
    let expected = std::fs::read_to_string(&path);
    if expected.as_deref().ok() == Some(actual) {
        return;
    }
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, actual).expect("snapshot written");
        panic!(
            "updated snapshot {} (UPDATE_SNAPSHOTS is set); review it with git diff and \
             run again without UPDATE_SNAPSHOTS",
            path.display()
        );
    }
    let expected = expected.unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with UPDATE_SNAPSHOTS=1 to create it",
            path.display()
        )
    });
    assert_eq!(
        actual,
        expected,
        "output differs from {} (UPDATE_SNAPSHOTS=1 rewrites it)",
        path.display()
    );
}
