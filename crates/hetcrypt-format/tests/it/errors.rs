//! Which errors say the message itself is bad (the CLI reports those as an invalid
//! file, the others as trouble reading it or running it): found untested by `cargo
//! mutants` (issue 25).

use hetcrypt_format::{Aead, FormatError};

#[test]
fn errors_about_the_message_are_told_from_io_engine_and_key_trouble() {
    let bad_message = [
        FormatError::NotHetcrypt,
        FormatError::UnsupportedVersion(9),
        FormatError::UnknownId {
            what: "AEAD",
            id: 7,
        },
        FormatError::WrongKey,
        FormatError::Truncated("the final chunk is missing".into()),
        FormatError::BadLength { len: 3 },
        FormatError::TreeMember,
        FormatError::ManifestMismatch,
        FormatError::BadManifest("no entries".into()),
        FormatError::Tampered {
            chunk: 1,
            hint: "modified or reordered",
        },
    ];
    for e in &bad_message {
        assert!(e.is_invalid_message(), "{e:?}");
    }
    let other_trouble = [
        FormatError::KeyLength {
            aead: Aead::Aes128Gcm,
            expected: 16,
            got: 32,
        },
        FormatError::TooLong,
        FormatError::ContextTooLong(513),
        FormatError::Engine(hetcrypt::Error::UnknownKey(0)),
        FormatError::Io(std::io::Error::other("disk on fire")),
    ];
    for e in &other_trouble {
        assert!(!e.is_invalid_message(), "{e:?}");
    }
}
