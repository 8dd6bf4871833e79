//! `hetcrypt calibrate`: it measures, stores where it is told, shows what is stored,
//! refuses a broken store with one sentence, and two at once leave a whole store.

use crate::cli_support;

use std::process::Command;

use cli_support::{assert_snapshot, fails, hetcrypt, ok};

/// The quickest real calibration: the cpu engine, one cipher.
const QUICK: [&str; 5] = ["calibrate", "-q", "--engines", "cpu", "--cipher"];

/// Microseconds each point is timed (debug builds' `HETCRYPT_TEST_POINT_TIME_US`): 1 ms,
/// as in the library's own calibration test. These tests check what is stored, shown
/// and read, not the figures, and a store of 1 ms points is as whole as one of 20 ms.
const POINT_TIME_US: &str = "1000";

/// `hetcrypt calibrate` of the cpu engine and one cipher into `store`, points timed
/// for [`POINT_TIME_US`].
fn quick(store: &str) -> Command {
    let mut cmd = hetcrypt();
    cmd.args(QUICK)
        .args(["aes-128-gcm", "--calibration", store])
        .env("HETCRYPT_TEST_POINT_TIME_US", POINT_TIME_US);
    cmd
}

/// Runs `cmd`, which must succeed, and returns its stdout.
fn ok_stdout(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn calibrate_help() {
    assert_snapshot("calibrate-help.txt", &ok(&["calibrate", "--help"]));
}

#[test]
fn calibrates_stores_and_shows() {
    let dir = crate::files_support::scratch();
    let store = dir.path().join("state/calibration.json");
    let store = store.to_str().unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&ok_stdout(quick(store).arg("--json"))).unwrap();
    assert_eq!(json["format"], hetcrypt::calibration::FORMAT_VERSION);
    let engines = json["engines"].as_array().unwrap();
    assert_eq!(engines.len(), 1);
    assert_eq!(engines[0]["name"], "cpu");
    let classes = engines[0]["classes"].as_array().unwrap();
    let dirs: Vec<&str> = classes
        .iter()
        .map(|c| c["direction"].as_str().unwrap())
        .collect();
    assert_eq!(dirs, ["encrypt", "decrypt"]);
    for c in classes {
        assert_eq!(c["cipher"], "aes-128-gcm");
        assert_eq!(c["points"].as_array().unwrap().len(), 7);
        assert!(c["per_byte"].as_f64().unwrap() > 0.0);
    }
    // What was printed is what was stored.
    let stored: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(store).unwrap()).unwrap();
    assert_eq!(stored, json);

    let table = ok(&["calibrate", "--show", "--calibration", store]);
    assert!(table.contains("holds on this machine"), "{table}");
    assert!(table.contains("aes-128-gcm"), "{table}");
    assert!(table.contains("64 KiB"), "{table}");
    let shown: serde_json::Value = serde_json::from_str(&ok(&[
        "calibrate",
        "--show",
        "--json",
        "--calibration",
        store,
    ]))
    .unwrap();
    assert_eq!(shown, json);

    // The environment variable names the store too.
    let out = hetcrypt()
        .args(["calibrate", "--show"])
        .env("HETCRYPT_CALIBRATION", store)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(store));
}

#[test]
fn show_refuses_a_missing_or_corrupt_store_in_one_sentence() {
    let dir = crate::files_support::scratch();
    let missing = dir.path().join("none.json");
    let err = fails(&[
        "calibrate",
        "--show",
        "--calibration",
        missing.to_str().unwrap(),
    ]);
    assert!(err.contains("no calibration stored in"), "{err}");
    assert!(err.contains("hetcrypt calibrate"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    let corrupt = dir.path().join("corrupt.json");
    std::fs::write(&corrupt, "{\"format\": 1, \"engines\": [").unwrap();
    let err = fails(&[
        "calibrate",
        "--show",
        "--calibration",
        corrupt.to_str().unwrap(),
    ]);
    assert!(err.contains("not a valid calibration"), "{err}");
    assert!(err.contains(corrupt.to_str().unwrap()), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// A store that cannot be written fails (before any measuring) in one sentence that
/// names it.
#[test]
fn an_unwritable_store_fails_before_measuring() {
    let dir = crate::files_support::scratch();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let store = file.join("cal.json");
    let err = fails(&["calibrate", "-q", "--calibration", store.to_str().unwrap()]);
    assert!(err.contains("cannot write the calibration store"), "{err}");
    assert!(err.contains(store.to_str().unwrap()), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// A store measured elsewhere is shown, marked stale, with one warning.
#[test]
fn show_marks_a_foreign_store_stale() {
    let dir = crate::files_support::scratch();
    let store = dir.path().join("cal.json");
    let store = store.to_str().unwrap();
    ok_stdout(&mut quick(store));
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(store).unwrap()).unwrap();
    json["fingerprint"]["cpu_model"] = "ARMv7 Processor rev 2 (v7l)".into();
    std::fs::write(store, json.to_string()).unwrap();
    let out = hetcrypt()
        .args(["calibrate", "--show", "--calibration", store])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("another CPU ('ARMv7"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("STALE"));
}

/// Two calibrations writing the same store at once leave one whole, valid store.
#[test]
fn two_calibrations_at_once_leave_a_valid_store() {
    let dir = crate::files_support::scratch();
    let store = dir.path().join("cal.json");
    let store = store.to_str().unwrap();
    let children: Vec<_> = (0..2)
        .map(|_| {
            quick(store)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let table = ok(&["calibrate", "--show", "--calibration", store]);
    assert!(table.contains("holds on this machine"), "{table}");
    let left = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(left, 1, "no temporary file is left");
}

/// The policies that use the store get it wherever the CLI builds them (`speed` here:
/// on a host with one engine `bench` refuses combining policies): a valid store costs
/// no word, a corrupt one exactly one warning, and the run goes on without it.
#[test]
fn policies_read_the_store_and_warn_once_about_a_bad_one() {
    let dir = crate::files_support::scratch();
    let store = dir.path().join("cal.json");
    let store = store.to_str().unwrap();
    ok_stdout(&mut quick(store));
    let speed = |store: &str| {
        hetcrypt()
            .args([
                "speed",
                "-q",
                "--engine",
                "cpu",
                "--cipher",
                "aes-128-gcm",
                "--policy",
                "threshold,adaptive",
                "--sizes",
                "64,4096",
                "--seconds",
                "0.02",
            ])
            .env("HETCRYPT_CALIBRATION", store)
            .output()
            .unwrap()
    };
    let out = speed(store);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    std::fs::write(store, "not json").unwrap();
    let out = speed(store);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "one warning: {stderr}");
    assert!(stderr.contains("ignoring the calibration in"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("adaptive"));
}
