//! `hetcrypt keygen`: a random key file, and reading key files back.
//!
//! Key file format: the key in lowercase hex (32 or 64 digits for 128 or 256 bits)
//! and a newline; whitespace around it is ignored when reading. Created with mode
//! 0600, never overwriting: the key is written to a private temporary file beside the
//! destination, synced, then hard-linked to the destination name (which fails if the
//! name exists), so the key file appears complete or not at all.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use data_encoding::HEXLOWER_PERMISSIVE;
use zeroize::Zeroizing;

/// Key files are private to their owner.
const KEY_FILE_MODE: u32 = 0o600;
/// Longest key file we read: a 256-bit key in hex with generous whitespace.
const MAX_KEY_FILE_LEN: u64 = 1024;

/// Arguments of `hetcrypt keygen`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where to write the key (refuses to overwrite an existing file); `-` prints it
    /// on standard output.
    #[arg(short, long, value_name = "KEY")]
    output: PathBuf,
    /// Key size: 128 (for aes-128-gcm) or 256 (for aes-256-gcm and
    /// aes-128-cbc-hmac-sha256, whose key is a 16-byte MAC key and a 16-byte AES key).
    #[arg(long, default_value_t = 128, value_parser = parse_bits)]
    bits: usize,
}

/// Accepts the two key sizes hetcrypt's AEADs take.
fn parse_bits(s: &str) -> Result<usize, String> {
    match s {
        "128" => Ok(128),
        "256" => Ok(256),
        _ => Err(format!("'{s}' is not a key size: use 128 or 256")),
    }
}

/// Runs `hetcrypt keygen`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut key = Zeroizing::new(vec![0u8; args.bits / 8]);
    openssl::rand::rand_bytes(&mut key).context("the system random generator failed")?;
    if args.output.as_os_str() == "-" {
        let mut text = Zeroizing::new(vec![0u8; HEXLOWER_PERMISSIVE.encode_len(key.len())]);
        HEXLOWER_PERMISSIVE.encode_mut(&key, &mut text);
        text.push(b'\n');
        let mut out = std::io::stdout().lock();
        out.write_all(&text)
            .and_then(|()| out.flush())
            .context("cannot write the key to standard output")?;
        return Ok(ExitCode::SUCCESS);
    }
    write_key_file(&args.output, &key)?;
    eprintln!(
        "hetcrypt: wrote a {}-bit key to {} (mode 0600); keep it safe: without it the files cannot be decrypted",
        args.bits,
        crate::encrypt::escape(&args.output.display().to_string())
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes `key` as hex to a new file `path` with mode 0600, atomically, refusing to
/// overwrite.
pub fn write_key_file(path: &Path, key: &[u8]) -> anyhow::Result<()> {
    if path.symlink_metadata().is_ok() {
        bail!(
            "{} already exists; not overwriting a key file",
            path.display()
        );
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut text = Zeroizing::new(vec![0u8; HEXLOWER_PERMISSIVE.encode_len(key.len())]);
    HEXLOWER_PERMISSIVE.encode_mut(key, &mut text);
    text.push(b'\n');

    let tmp = tempfile::Builder::new()
        .prefix(".hetcrypt-key-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(KEY_FILE_MODE))
        .tempfile_in(&dir)
        .with_context(|| format!("cannot create a file in {}", dir.display()))?;
    let mut file = tmp.as_file();
    file.write_all(&text)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write the key in {}", dir.display()))?;
    fs::hard_link(tmp.path(), path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            anyhow::anyhow!(
                "{} already exists; not overwriting a key file",
                path.display()
            )
        } else {
            anyhow::anyhow!("cannot create {}: {e}", path.display())
        }
    })?;
    drop(tmp); // removes the temporary name; the key stays under `path`
    if let Ok(d) = File::open(&dir) {
        let _ = d.sync_all(); // make the new name durable; best effort
    }
    Ok(())
}

/// Permission bits that let others than the owner read or change a key file.
const KEY_FILE_SHARED_BITS: u32 = 0o077;

/// Reads a key file written by `hetcrypt keygen` (hex, 128 or 256 bits); warns when
/// others may read it, refuses an all-zero key.
pub fn read_key_file(path: &Path) -> anyhow::Result<Zeroizing<Vec<u8>>> {
    use std::os::unix::fs::PermissionsExt;
    let file = OpenOptions::new()
        .read(true)
        .open(path)
        .with_context(|| format!("cannot open key file {}", path.display()))?;
    if let Ok(meta) = file.metadata() {
        let mode = meta.permissions().mode() & 0o777;
        if meta.is_file() && mode & KEY_FILE_SHARED_BITS != 0 {
            eprintln!(
                "hetcrypt: warning: key file {} has mode {mode:04o}: others may read it (chmod 600 it; keygen makes keys 0600)",
                crate::encrypt::escape(&path.display().to_string())
            );
        }
    }
    let mut text = Zeroizing::new(Vec::new());
    file.take(MAX_KEY_FILE_LEN + 1)
        .read_to_end(&mut text)
        .with_context(|| format!("cannot read key file {}", path.display()))?;
    let invalid = || {
        anyhow::anyhow!(
            "{} is not a hetcrypt key file (expected 32 or 64 hex digits, as `hetcrypt keygen` writes)",
            path.display()
        )
    };
    if text.len() as u64 > MAX_KEY_FILE_LEN {
        return Err(invalid());
    }
    let trimmed = text.trim_ascii();
    let len = HEXLOWER_PERMISSIVE
        .decode_len(trimmed.len())
        .map_err(|_| invalid())?;
    if len != 16 && len != 32 {
        return Err(invalid());
    }
    let mut key = Zeroizing::new(vec![0u8; len]);
    HEXLOWER_PERMISSIVE
        .decode_mut(trimmed, &mut key)
        .map_err(|_| invalid())?;
    if key.iter().all(|&b| b == 0) {
        bail!(
            "{} holds an all-zero key, which is no secret: make a key with `hetcrypt keygen`",
            path.display()
        );
    }
    Ok(key)
}
