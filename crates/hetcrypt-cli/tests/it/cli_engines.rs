//! `hetcrypt engines`: every engine listed, the missing ones with their reason.

use crate::cli_support;

use cli_support::ok;

#[test]
fn json_lists_cpu_and_accounts_for_kernel() {
    let json: serde_json::Value = serde_json::from_str(&ok(&["engines", "--json"])).unwrap();
    let engines = json["engines"].as_array().unwrap();
    let cpu = engines
        .iter()
        .find(|e| e["name"] == "cpu")
        .expect("cpu is always there");
    assert_eq!(cpu["kind"], "cpu");
    assert!(cpu["lanes"].as_u64().unwrap() >= 1);
    let ciphers: Vec<&str> = cpu["ciphers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["cipher"].as_str().unwrap())
        .collect();
    for c in ["aes-128-cbc", "aes-256-ctr", "aes-128-gcm"] {
        assert!(ciphers.contains(&c), "cpu lacks {c}: {ciphers:?}");
    }
    assert!(json["machine"]["kernel"].as_str().is_some());

    // The kernel engine is either ready (inside the testbed guest) or unavailable with
    // a reason a person can act on; it is never silently missing.
    let ready = engines.iter().any(|e| e["name"] == "kernel");
    let unavailable = json["unavailable"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["engine"] == "kernel");
    match (ready, unavailable) {
        (true, None) => {}
        (false, Some(u)) => {
            let reason = u["reason"].as_str().unwrap();
            assert!(!reason.is_empty());
            // This host's kernel has no AF_ALG (shared/DESIGN.md section 3).
            if !af_alg_in_kernel() {
                assert!(reason.contains("AF_ALG"), "reason: {reason}");
            }
        }
        other => panic!("kernel both ready and unavailable, or neither: {other:?}"),
    }
}

/// Whether this kernel offers AF_ALG sockets (so a missing kernel engine has another
/// reason, e.g. no driver loaded).
fn af_alg_in_kernel() -> bool {
    std::fs::read_to_string("/proc/net/protocols")
        .map(|p| p.lines().any(|l| l.starts_with("ALG")))
        .unwrap_or(false)
}

#[test]
fn table_shows_cpu_rows_and_unavailable_reasons() {
    let text = ok(&["engines"]);
    assert!(text.contains("ENGINE"), "{text}");
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("cpu ")),
        "{text}"
    );
    assert!(text.contains("aes-128-gcm"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&ok(&["engines", "--json"])).unwrap();
    for u in json["unavailable"].as_array().unwrap() {
        let line = format!(
            "{}: {}",
            u["engine"].as_str().unwrap(),
            u["reason"].as_str().unwrap()
        );
        assert!(text.contains(&line), "missing '{line}' in:\n{text}");
    }
}

/// The `cpu` engine says which implementation serves each cipher and why: CTR and
/// CBC decryption name the faster of the aes crate and EVP (or each below and from a
/// size) with the measured figures,
/// GCM ring against EVP, except AES-192-GCM, which ring lacks (issue 23).
#[test]
fn cpu_says_which_implementation_serves_each_cipher_and_why() {
    let text = ok(&["engines"]);
    let why: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("cpu: the implementation of each cipher"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    assert_eq!(why.len(), 12, "{text}");
    for line in &why {
        let (cipher, reason) = line.trim().split_once(' ').unwrap();
        let reason = reason.trim();
        if cipher.contains("ctr") {
            // One implementation for every length, or one below a size and the
            // other from it, as the probe found on this machine and build.
            let one = reason.starts_with("aes-crate (measured ")
                || reason.starts_with("openssl-evp (measured ");
            let split = (reason.starts_with("aes-crate below ")
                && reason.contains(", openssl-evp from "))
                || (reason.starts_with("openssl-evp below ")
                    && reason.contains(", aes-crate from "));
            assert!(one || (split && reason.contains(" (measured ")), "{line}");
            assert!(
                reason.contains("B/s vs ") && reason.contains(" at 16 KiB"),
                "{line}"
            );
        } else if cipher.contains("cbc") {
            assert!(
                reason.contains("decryption: ") && reason.contains("measured"),
                "{line}"
            );
        } else if cipher.contains("192") {
            // ring has no AES-192: EVP alone, and the line says so.
            assert!(reason.starts_with("openssl-evp ("), "{line}");
            assert!(reason.contains("ring has no"), "{line}");
        } else {
            // AES-128/256-GCM: ring measured against EVP.
            assert!(
                reason.contains("measured ") && reason.contains(" vs ") && reason.contains("ring"),
                "{line}"
            );
            assert!(reason.contains(" at 16 KiB"), "{line}");
        }
    }
}
