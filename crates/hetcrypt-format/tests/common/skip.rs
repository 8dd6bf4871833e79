//! The skip rule of the host tests that need a tool (shared with `hetcrypt-cli`'s
//! tests, which include this file by path).

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
