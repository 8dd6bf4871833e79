//! `--help` of `hetcrypt` itself, `engines`, `speed` and `bench` against committed
//! snapshots, so any change to the command line shows up in review.

use crate::cli_support;

use cli_support::{assert_snapshot, ok};

#[test]
fn hetcrypt_help() {
    assert_snapshot("hetcrypt-help.txt", &ok(&["--help"]));
}

#[test]
fn engines_help() {
    assert_snapshot("engines-help.txt", &ok(&["engines", "--help"]));
}

#[test]
fn speed_help() {
    assert_snapshot("speed-help.txt", &ok(&["speed", "--help"]));
}

#[test]
fn bench_help() {
    assert_snapshot("bench-help.txt", &ok(&["bench", "--help"]));
}
