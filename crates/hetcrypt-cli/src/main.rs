//! The `hetcrypt` command.
#![forbid(unsafe_code)]

fn main() {
    println!("hetcrypt {}", env!("CARGO_PKG_VERSION"));
}
