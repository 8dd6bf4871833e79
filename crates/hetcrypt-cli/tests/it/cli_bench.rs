//! `hetcrypt bench`: a tiny run's JSON structure, the files written to `--out`, skipped
//! policies, and bad input leaving nothing behind.

use crate::cli_support;

use std::path::Path;

use cli_support::{fails, kernel_available, ok};

/// A run small enough for CI: few files, two sizes, one rep (tests of the summary
/// raise the reps).
const TINY: [&str; 10] = [
    "bench", "--files", "12", "--sizes", "8,1k", "--reps", "1", "-q", "--settle", "0",
];

fn tiny(extra: &[&str]) -> Vec<String> {
    TINY.iter().chain(extra).map(|s| s.to_string()).collect()
}

fn run_ok(args: &[String]) -> String {
    ok(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn json_has_tables_for_every_size_and_policy() {
    // Three reps, so the summary (min, median, max of the runs) has something to get
    // wrong: with one rep all three are that rep's time.
    const REPS: usize = 3;
    let mut args = tiny(&["--json", "--policies", "only:cpu,only:kernel,pull"]);
    let reps = args
        .iter()
        .position(|a| a == "--reps")
        .expect("TINY sets --reps")
        + 1;
    args[reps] = REPS.to_string();
    let out = run_ok(&args);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        json["cipher"], "aes-128-cbc-pkcs7",
        "CBC runs padded in bench"
    );
    assert_eq!(json["direction"], "encrypt");
    assert_eq!(json["reps"], REPS);
    let policies: Vec<&str> = json["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    let skipped: Vec<&str> = json["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["policy"].as_str().unwrap())
        .collect();
    assert!(policies.contains(&"only:cpu"));
    if kernel_available() {
        assert_eq!(policies, ["only:cpu", "only:kernel", "pull"]);
    } else {
        // No module here: the policies needing one are skipped with the reason,
        // never run on the CPU and shown as if they had.
        assert_eq!(policies, ["only:cpu"]);
        assert_eq!(skipped, ["only:kernel", "pull"]);
        for s in json["skipped"].as_array().unwrap() {
            assert!(!s["reason"].as_str().unwrap().is_empty());
        }
    }

    let sizes = json["sizes"].as_array().unwrap();
    assert_eq!(
        sizes
            .iter()
            .map(|s| s["size"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [8, 1024]
    );
    for s in sizes {
        assert_eq!(s["files"], 12);
        // Encryption's input is the files themselves.
        assert_eq!(s["bytes"], 12 * s["size"].as_u64().unwrap());
        let results = s["policies"].as_array().unwrap();
        assert_eq!(results.len(), policies.len());
        for r in results {
            let runs = r["runs"].as_array().unwrap();
            assert_eq!(runs.len(), REPS);
            for run in runs {
                assert_eq!(run["report"]["jobs"], 12);
            }
            // The summary is of these runs: their fastest, middle and slowest wall time,
            // and the median run is the one with the median time.
            let mut walls: Vec<f64> = runs.iter().map(|r| r["wall_s"].as_f64().unwrap()).collect();
            walls.sort_by(f64::total_cmp);
            assert!(walls[0] > 0.0, "{}: a run took no time", r["policy"]);
            let median = r["median_s"].as_f64().unwrap();
            assert_eq!(r["min_s"].as_f64(), Some(walls[0]), "{}", r["policy"]);
            assert_eq!(median, walls[REPS / 2], "{}", r["policy"]);
            assert_eq!(
                r["max_s"].as_f64(),
                Some(walls[REPS - 1]),
                "{}",
                r["policy"]
            );
            let median_run = r["median_run"].as_u64().unwrap() as usize;
            assert_eq!(runs[median_run]["wall_s"].as_f64(), Some(median));
            let done: u64 = r["jobs_per_engine"]
                .as_object()
                .unwrap()
                .values()
                .map(|n| n.as_u64().unwrap())
                .sum();
            assert_eq!(done, 12, "every file is done exactly once");
        }
        // Each round's runs take the places 0..n once, and each run names the policy
        // timed at the place before it in that round.
        for round in 0..REPS {
            let mut by_place: Vec<(u64, &serde_json::Value, &serde_json::Value)> = results
                .iter()
                .map(|r| {
                    let run = &r["runs"][round];
                    (run["position"].as_u64().unwrap(), run, &r["policy"])
                })
                .collect();
            by_place.sort_by_key(|&(place, _, _)| place);
            let places: Vec<u64> = by_place.iter().map(|&(place, _, _)| place).collect();
            assert_eq!(places, (0..results.len() as u64).collect::<Vec<_>>());
            for pair in by_place.windows(2) {
                assert_eq!(&pair[1].1["after"], pair[0].2, "round {round}");
            }
            if round > 0 {
                assert!(by_place[0].1["after"].is_string(), "round {round}");
            }
        }
        let cpu = &results[0];
        assert_eq!(cpu["policy"], "only:cpu");
        assert_eq!(cpu["jobs_per_engine"]["cpu"], 12);
        assert_eq!(cpu["speedup_vs_cpu"].as_f64(), Some(1.0));
    }
}

#[test]
fn adaptive_runs_record_what_the_policy_learned() {
    let out = run_ok(&tiny(&["--json", "--policies", "only:cpu,adaptive"]));
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    for s in json["sizes"].as_array().unwrap() {
        // The seeds' sizes are powers of two: each is the floor of its own class.
        let size = s["size"].as_u64().unwrap();
        for r in s["policies"].as_array().unwrap() {
            let run = &r["runs"][0];
            if r["policy"] == "only:cpu" {
                assert!(run.get("learned").is_none(), "{run}");
                continue;
            }
            let learned = run["learned"].as_array().expect("adaptive's record");
            let class = learned
                .iter()
                .find(|e| e["engine"] == "cpu" && e["min_len"].as_u64() == Some(size))
                .unwrap_or_else(|| panic!("no estimate for {size} B: {learned:?}"));
            assert_eq!(class["cipher"], "aes-128-cbc-pkcs7");
            assert_eq!(class["direction"], "encrypt");
            assert!(class["samples"].as_u64().unwrap() >= 1, "{class}");
        }
    }
}

#[test]
fn out_dir_gets_markdown_json_and_charts() {
    let dir = crate::files_support::scratch();
    let out = dir.path().join("results");
    let out_s = out.to_str().unwrap();
    let md = run_ok(&tiny(&["--out", out_s]));
    assert!(md.contains("## Table A"), "{md}");
    assert!(md.contains("## Table B"), "{md}");
    assert!(md.contains("## Table C"), "{md}");
    assert!(md.contains("## Table D"), "{md}");

    let written = std::fs::read_to_string(out.join("bench.md")).unwrap();
    assert!(written.contains("![time per policy against file size](bench.svg)"));
    assert!(written.contains("| size"), "Markdown tables");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("bench.json")).unwrap()).unwrap();
    assert_eq!(json["sizes"].as_array().unwrap().len(), 2);
    let svg = std::fs::read_to_string(out.join("bench.svg")).unwrap();
    assert!(svg.starts_with("<svg"), "SVG");
    assert!(svg.contains("only:cpu"), "the legend names the policy");
    assert!(svg.contains("file size"), "the axis is labelled");
    let png = std::fs::read(out.join("bench.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");

    // A second run replaces the first as a whole; nothing else is left beside it.
    ok(&[
        "bench", "--files", "3", "--sizes", "16", "--reps", "1", "-q", "--settle", "0", "--out",
        out_s,
    ]);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("bench.json")).unwrap()).unwrap();
    assert_eq!(json["sizes"].as_array().unwrap().len(), 1);
    assert_eq!(entries(dir.path()), ["results"]);
}

#[test]
fn input_dir_groups_files_by_length() {
    let dir = crate::files_support::scratch();
    for (i, len) in [5usize, 5, 5, 100, 100].iter().enumerate() {
        std::fs::write(dir.path().join(format!("f{i}")), vec![i as u8; *len]).unwrap();
    }
    let out = ok(&[
        "bench",
        "--input",
        dir.path().to_str().unwrap(),
        "--reps",
        "1",
        "--settle",
        "0",
        "--json",
        "-q",
        "--decrypt",
    ]);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    let sizes: Vec<(u64, u64)> = json["sizes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["size"].as_u64().unwrap(), s["files"].as_u64().unwrap()))
        .collect();
    assert_eq!(sizes, [(5, 3), (100, 2)]);
    assert_eq!(json["direction"], "decrypt");
}

#[test]
fn bad_input_fails_with_one_sentence_and_writes_nothing() {
    let dir = crate::files_support::scratch();
    let out = dir.path().join("out");
    let out_s = out.to_str().unwrap();
    let a_file = dir.path().join("a-file");
    std::fs::write(&a_file, "x").unwrap();
    let under_file = a_file.join("out");
    for (args, says) in [
        (vec!["--files", "0"], "at least 1"),
        (vec!["--sizes", "8,big"], "'big' is not a size"),
        (
            vec!["--policies", "pull,fastest"],
            "unknown policy 'fastest'",
        ),
        (
            vec!["--cipher", "des-64-cbc"],
            "unknown cipher 'des-64-cbc'",
        ),
        (vec!["--engines", "gpu"], "unknown engine 'gpu'"),
        (
            vec!["--out", under_file.to_str().unwrap()],
            "cannot write to",
        ),
        (vec!["--out", a_file.to_str().unwrap()], "not a directory"),
    ] {
        let mut full = vec!["bench", "--reps", "1", "-q", "--settle", "0"];
        full.extend(args.iter().copied());
        for (flag, value) in [("--files", "4"), ("--sizes", "16"), ("--out", out_s)] {
            if !args.contains(&flag) {
                full.extend([flag, value]);
            }
        }
        let err = fails(&full);
        assert!(
            err.lines().next().unwrap().contains(says),
            "{args:?}: {err}"
        );
    }
    assert_eq!(entries(dir.path()), ["a-file"], "nothing half-written");

    // An unrelated non-empty directory is never replaced.
    let precious = dir.path().join("precious");
    std::fs::create_dir(&precious).unwrap();
    std::fs::write(precious.join("notes.txt"), "keep me").unwrap();
    let err = fails(&[
        "bench",
        "--files",
        "4",
        "--sizes",
        "16",
        "--reps",
        "1",
        "-q",
        "--out",
        precious.to_str().unwrap(),
    ]);
    assert!(err.contains("non-empty directory"), "{err}");
    assert_eq!(entries(&precious), ["notes.txt"]);
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
