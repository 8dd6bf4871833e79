//! The `/dev/crypto` interface of cryptodev-linux: sessions and requests by `ioctl`.
//!
//! A process opens `/dev/crypto`; `CIOCGSESSION` creates a keyed session for one
//! algorithm on that descriptor (cryptodev allocates the kernel transform by the
//! algorithm's generic name, e.g. `cbc(aes)`, so the kernel picks the driver);
//! `CIOCGSESSINFO` says which driver it got; `CIOCCRYPT` runs one request, blocking until
//! it completes; `CIOCFSESSION` ends a session. Closing the descriptor ends all of them.
//!
//! The structs and request numbers are declared by hand from cryptodev-linux's
//! `crypto/cryptodev.h` (commit 08644db02d43, `shared/third_party/`): no crate ships
//! them, and user space needs only these four ioctls.

use std::ffi::{c_char, CStr};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;

use crate::cipher::BLOCK_LEN;
use crate::engine::kernel::afalg::SysError;

/// Where cryptodev-linux's character device appears once its module is loaded.
pub const DEV_CRYPTO: &str = "/dev/crypto";

/// `CRYPTO_AES_CBC` of `enum cryptodev_crypto_op_t` (cryptodev binds `cbc(aes)`).
pub(crate) const CRYPTO_AES_CBC: u32 = 11;
/// `CRYPTO_AES_CTR` of `enum cryptodev_crypto_op_t` (cryptodev binds `ctr(aes)`).
pub(crate) const CRYPTO_AES_CTR: u32 = 21;

/// `COP_ENCRYPT` / `COP_DECRYPT` of `struct crypt_op`.
const COP_ENCRYPT: u16 = 0;
const COP_DECRYPT: u16 = 1;

/// `CRYPTODEV_MAX_ALG_NAME`: the length of the name fields of `struct alg_info`.
const MAX_ALG_NAME: usize = 64;

/// `SIOP_FLAG_KERNEL_DRIVER_ONLY`: the driver is reachable only from the kernel
/// (hardware), as opposed to software or CPU instructions user space has too.
pub(crate) const SIOP_FLAG_KERNEL_DRIVER_ONLY: u32 = 1;

/// `struct session_op`, the argument of `CIOCGSESSION`.
#[repr(C)]
struct SessionOp {
    cipher: u32,
    mac: u32,
    keylen: u32,
    key: *const u8,
    mackeylen: u32,
    mackey: *const u8,
    ses: u32,
}

/// `struct alg_info` inside `struct session_info_op`.
#[repr(C)]
#[derive(Clone, Copy)]
struct AlgInfo {
    cra_name: [c_char; MAX_ALG_NAME],
    cra_driver_name: [c_char; MAX_ALG_NAME],
}

/// `struct session_info_op`, the argument of `CIOCGSESSINFO`.
#[repr(C)]
struct SessionInfoOp {
    ses: u32,
    cipher_info: AlgInfo,
    hash_info: AlgInfo,
    alignmask: u16,
    flags: u32,
}

/// `struct crypt_op`, the argument of `CIOCCRYPT`.
#[repr(C)]
struct CryptOp {
    ses: u32,
    op: u16,
    flags: u16,
    len: u32,
    src: *const u8,
    dst: *mut u8,
    mac: *mut u8,
    iv: *mut u8,
}

nix::ioctl_readwrite!(ciocgsession, b'c', 102, SessionOp);
nix::ioctl_write_ptr!(ciocfsession, b'c', 103, u32);
nix::ioctl_readwrite!(cioccrypt, b'c', 104, CryptOp);
nix::ioctl_readwrite!(ciocgsessinfo, b'c', 107, SessionInfoOp);

/// Tags an errno with the call that returned it.
fn at(call: &'static str) -> impl Fn(Errno) -> SysError {
    move |errno| SysError { call, errno }
}

/// Which way a request goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// `COP_ENCRYPT`.
    Encrypt,
    /// `COP_DECRYPT`.
    Decrypt,
}

/// What `CIOCGSESSINFO` says about a session's cipher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SessionInfo {
    /// The generic algorithm, e.g. `cbc(aes)`.
    pub algorithm: String,
    /// The driver the kernel picked, e.g. `virtio_crypto_aes_cbc`.
    pub driver: String,
    /// `SIOP_FLAG_*`.
    pub flags: u32,
}

/// One open `/dev/crypto`: the sessions created on it live as long as it does.
#[derive(Debug)]
pub(crate) struct DevCrypto {
    fd: OwnedFd,
}

impl DevCrypto {
    /// Opens `/dev/crypto` (`ENOENT`: the cryptodev module is not loaded).
    pub fn open() -> Result<DevCrypto, SysError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(DEV_CRYPTO)
            .map_err(|e| SysError {
                call: "open(/dev/crypto)",
                errno: e.raw_os_error().map_or(Errno::EIO, Errno::from_raw),
            })?;
        Ok(DevCrypto { fd: file.into() })
    }

    /// Creates a session of cipher `alg` (`CRYPTO_AES_*`) keyed with `key`; returns its
    /// id. `EINVAL`: the kernel has no driver for it, or the driver refuses the key.
    pub fn new_session(&self, alg: u32, key: &[u8]) -> Result<u32, SysError> {
        let mut sop = SessionOp {
            cipher: alg,
            mac: 0,
            keylen: u32::try_from(key.len()).map_err(|_| at("CIOCGSESSION")(Errno::EINVAL))?,
            key: key.as_ptr(),
            mackeylen: 0,
            mackey: std::ptr::null(),
            ses: 0,
        };
        // SAFETY: `sop` is a valid `struct session_op`; the kernel reads `keylen` bytes
        // from `key`, which points into the live slice `key`, and writes only `sop.ses`.
        unsafe { ciocgsession(self.fd.as_raw_fd(), &mut sop) }.map_err(at("CIOCGSESSION"))?;
        Ok(sop.ses)
    }

    /// The algorithm and driver behind session `ses`.
    pub fn session_info(&self, ses: u32) -> Result<SessionInfo, SysError> {
        let empty = AlgInfo {
            cra_name: [0; MAX_ALG_NAME],
            cra_driver_name: [0; MAX_ALG_NAME],
        };
        let mut siop = SessionInfoOp {
            ses,
            cipher_info: empty,
            hash_info: empty,
            alignmask: 0,
            flags: 0,
        };
        // SAFETY: `siop` is a valid, writable `struct session_info_op`; the kernel
        // fills its fields and touches no other memory.
        unsafe { ciocgsessinfo(self.fd.as_raw_fd(), &mut siop) }.map_err(at("CIOCGSESSINFO"))?;
        Ok(SessionInfo {
            algorithm: c_name(&siop.cipher_info.cra_name),
            driver: c_name(&siop.cipher_info.cra_driver_name),
            flags: siop.flags,
        })
    }

    /// Ends session `ses` (frees its kernel transform: on a device, a request too).
    pub fn end_session(&self, ses: u32) -> Result<(), SysError> {
        // SAFETY: the kernel reads one `u32` from the pointer, which is to `ses`.
        unsafe { ciocfsession(self.fd.as_raw_fd(), &ses) }.map_err(at("CIOCFSESSION"))?;
        Ok(())
    }

    /// Runs one request of session `ses` on `data` in place, starting from `iv`
    /// (which the kernel reads and, without `COP_FLAG_WRITE_IV`, does not write).
    /// `data` must be whole blocks for CBC; the call blocks until the driver is done.
    pub fn crypt_in_place(
        &self,
        ses: u32,
        op: Op,
        iv: &[u8; BLOCK_LEN],
        data: &mut [u8],
    ) -> Result<(), SysError> {
        let len = data.len();
        let ptr = data.as_mut_ptr();
        self.crypt_raw(ses, op, iv, ptr, ptr, len)
    }

    /// Runs one request of session `ses` from `src` into `dst` (of the same length),
    /// starting from `iv`. `dst` may be uninitialised: on success the driver has
    /// written all of it (a cipher request writes its whole output). The data never
    /// passes through this CPU: cryptodev pins both buffers for the driver.
    pub fn crypt(
        &self,
        ses: u32,
        op: Op,
        iv: &[u8; BLOCK_LEN],
        src: &[u8],
        dst: &mut [MaybeUninit<u8>],
    ) -> Result<(), SysError> {
        assert_eq!(src.len(), dst.len(), "a request's input and output lengths");
        self.crypt_raw(
            ses,
            op,
            iv,
            src.as_ptr(),
            dst.as_mut_ptr().cast(),
            src.len(),
        )
    }

    /// `CIOCCRYPT` of `len` bytes from `src` to `dst` (the same address for in place).
    /// Callers pass pointers to `len` live bytes, `dst` exclusively theirs.
    fn crypt_raw(
        &self,
        ses: u32,
        op: Op,
        iv: &[u8; BLOCK_LEN],
        src: *const u8,
        dst: *mut u8,
        len: usize,
    ) -> Result<(), SysError> {
        let mut iv = *iv;
        let mut cop = CryptOp {
            ses,
            op: match op {
                Op::Encrypt => COP_ENCRYPT,
                Op::Decrypt => COP_DECRYPT,
            },
            flags: 0,
            len: u32::try_from(len).map_err(|_| at("CIOCCRYPT")(Errno::EINVAL))?,
            src,
            dst,
            mac: std::ptr::null_mut(),
            iv: iv.as_mut_ptr(),
        };
        // SAFETY: `cop` is a valid `struct crypt_op`: `src` and `dst` point to `len`
        // live bytes each (the callers above take them from slices of that length, `dst`
        // exclusively borrowed; the same buffer for in place, which cryptodev supports),
        // `iv` to 16 bytes the session's ivsize (16 for AES) never exceeds, `mac` is null
        // (no hash in these sessions). The ioctl returns only when the request is
        // complete, so no pointer outlives the call.
        unsafe { cioccrypt(self.fd.as_raw_fd(), &mut cop) }.map_err(at("CIOCCRYPT"))?;
        Ok(())
    }

    /// Gives up the descriptor (to keep it open elsewhere).
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

/// A NUL-terminated name field, as text (the whole field if no NUL).
fn c_name(field: &[c_char; MAX_ALG_NAME]) -> String {
    let bytes: Vec<u8> = field.iter().map(|&c| c as u8).collect();
    match CStr::from_bytes_until_nul(&bytes) {
        Ok(s) => s.to_string_lossy().into_owned(),
        Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layouts `crypto/cryptodev.h` gives on LP64 (x86-64, arm64): the ioctl
    /// request numbers encode these sizes, so a wrong one means every call fails.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn structs_have_the_header_layouts() {
        assert_eq!(std::mem::size_of::<SessionOp>(), 48);
        assert_eq!(std::mem::size_of::<SessionInfoOp>(), 268);
        assert_eq!(std::mem::size_of::<CryptOp>(), 48);
    }

    #[test]
    fn names_stop_at_the_first_nul() {
        let mut field = [0 as c_char; MAX_ALG_NAME];
        for (i, b) in b"cbc(aes)".iter().enumerate() {
            field[i] = *b as c_char;
        }
        assert_eq!(c_name(&field), "cbc(aes)");
        assert_eq!(c_name(&[b'x' as c_char; MAX_ALG_NAME]).len(), MAX_ALG_NAME);
    }
}
