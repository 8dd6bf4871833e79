//! `hetcrypt speed`: the `openssl speed` table shape, JSON, and `--split`.

use crate::cli_support;

use cli_support::{fails, ok};

/// Short enough for CI, long enough for several batches.
const SECONDS: &str = "0.05";

#[test]
fn table_has_openssl_speed_shape() {
    let text = ok(&[
        "speed",
        "--engine",
        "cpu",
        "--sizes",
        "16,64",
        "--seconds",
        SECONDS,
        "-q",
    ]);
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| *l == "The 'numbers' are in 1000s of bytes per second processed.")
        .expect("openssl's units line");
    // `openssl speed` pads "type" to 12 columns and each size to "%7d bytes".
    assert_eq!(lines[at + 1], "type             16 bytes     64 bytes");
    let row = lines[at + 2];
    assert!(row.starts_with("cpu          "), "{row}");
    let values: Vec<&str> = row[13..].split_whitespace().collect();
    assert_eq!(values.len(), 2, "{row}");
    // As openssl prints them: "%11.2fk" (1000s of bytes/s) above 10000 bytes/s,
    // "%11.2f " (bytes/s) up to it, which a loaded machine reaches at 16 B.
    for v in values {
        let bytes_per_second: f64 = match v.strip_suffix('k') {
            Some(k) => {
                let b = k.parse::<f64>().unwrap() * 1e3;
                assert!(b > 10000.0, "'{v}': a k suffix only above 10000 bytes/s");
                b
            }
            None => {
                let b = v.parse::<f64>().unwrap();
                assert!(b <= 10000.0, "'{v}': above 10000 bytes/s takes a k suffix");
                b
            }
        };
        assert!(bytes_per_second > 0.0, "{row}");
    }
    assert_eq!(lines.len(), at + 3, "one row per engine:\n{text}");
}

#[test]
fn json_reports_every_size() {
    let out = ok(&[
        "speed",
        "--engine",
        "cpu",
        "--cipher",
        "aes-256-gcm",
        "--decrypt",
        "--sizes",
        "32,1k",
        "--seconds",
        SECONDS,
        "--json",
        "-q",
    ]);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["cipher"], "aes-256-gcm");
    assert_eq!(json["direction"], "decrypt");
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["name"], "cpu");
    let cells = rows[0]["cells"].as_array().unwrap();
    assert_eq!(
        cells
            .iter()
            .map(|c| c["size"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [32, 1024]
    );
    for c in cells {
        assert!(c["bytes"].as_u64().unwrap() >= c["size"].as_u64().unwrap());
        assert!(c["bytes_per_second"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn policies_are_rows() {
    let out = ok(&[
        "speed",
        "--policy",
        "only:cpu,pull",
        "--sizes",
        "64",
        "--seconds",
        SECONDS,
        "--json",
        "-q",
    ]);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = json["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["only:cpu", "pull"]);
}

#[test]
fn split_reports_each_lane_count() {
    let out = ok(&[
        "speed", "--split", "--size", "1M", "--lanes", "3", "--reps", "1", "--json", "-q",
    ]);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["cipher"], "aes-128-ctr");
    assert_eq!(json["size"], 1 << 20);
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(
        rows.iter()
            .map(|r| r["lanes"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert_eq!(rows[0]["speedup"].as_f64(), Some(1.0));
    for r in rows {
        assert_eq!(r["pieces"], r["lanes"]);
        assert!(r["median_s"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn split_refuses_cbc_encryption() {
    let err = fails(&[
        "speed",
        "--split",
        "--cipher",
        "aes-128-cbc",
        "--size",
        "1M",
    ]);
    assert!(err.starts_with("hetcrypt: --split needs"), "{err}");
}

#[test]
fn bad_input_is_one_clear_error() {
    for (args, says) in [
        (&["speed", "--engine", "gpu"][..], "unknown engine 'gpu'"),
        (
            &["speed", "--policy", "fastest"][..],
            "unknown policy 'fastest'",
        ),
        (
            &["speed", "--cipher", "aes-512-cbc"][..],
            "unknown cipher 'aes-512-cbc'",
        ),
        (&["speed", "--sizes", "16,lots"][..], "'lots' is not a size"),
        (
            &["speed", "--seconds", "0"][..],
            "not a positive number of seconds",
        ),
    ] {
        let err = fails(args);
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(
            err.lines().next().unwrap().contains(says),
            "first line says it: {err}"
        );
    }
}

/// `--cpu-impl` forces either implementation of the block-parallel modes (to check the
/// measured choice against both) and names the known ones when given another.
#[test]
fn cpu_impl_forces_either_side_and_rejects_unknown_names() {
    for implementation in ["auto", "aes-crate", "openssl-evp"] {
        let out = ok(&[
            "speed",
            "--engine",
            "cpu",
            "--cipher",
            "aes-128-ctr",
            "--cpu-impl",
            implementation,
            "--sizes",
            "1024",
            "--seconds",
            SECONDS,
            "--json",
            "-q",
        ]);
        let report: serde_json::Value = serde_json::from_str(&out).unwrap();
        let rate = report["rows"][0]["cells"][0]["bytes_per_second"]
            .as_f64()
            .unwrap();
        assert!(rate > 0.0, "{implementation}: {out}");
    }
    let err = fails(&["speed", "--engine", "cpu", "--cpu-impl", "fastest"]);
    assert!(
        err.contains("unknown implementation 'fastest' (known: auto, aes-crate, openssl-evp)"),
        "{err}"
    );
}
