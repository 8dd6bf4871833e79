//! Makes `hetcrypt.so` beside `libhetcrypt_provider.so` in the target directory, so
//! `openssl ... -provider-path target/release -provider hetcrypt` finds the module
//! (OpenSSL turns a provider name `N` into the file `N.so`; cargo names a cdylib
//! `lib<crate>.so` and has no option for another name).

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out: three levels up is the
    // profile directory where cargo puts the cdylib.
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };
    let Some(profile_dir) = out.ancestors().nth(3) else {
        return;
    };
    let link = profile_dir.join("hetcrypt.so");
    if std::fs::symlink_metadata(&link).is_err() {
        // A relative link: valid as soon as the cdylib is written, and after a move.
        let _ = std::os::unix::fs::symlink("libhetcrypt_provider.so", &link);
    }
}
