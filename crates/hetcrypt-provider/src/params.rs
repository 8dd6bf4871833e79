//! OSSL_PARAM arrays: finding a key and reading or writing the few types we use.
//!
//! Written here rather than calling libcrypto's `OSSL_PARAM_*` helpers because the
//! module may be loaded by an OpenSSL (4.0) other than the libcrypto it links: the
//! array layout is the stable ABI, the helper functions belong to one library.

use std::ffi::{c_char, c_void, CStr};

use openssl_provider_forge::bindings::{
    OSSL_PARAM, OSSL_PARAM_INTEGER, OSSL_PARAM_OCTET_STRING, OSSL_PARAM_UNSIGNED_INTEGER,
    OSSL_PARAM_UTF8_PTR, OSSL_PARAM_UTF8_STRING,
};

/// `OSSL_PARAM_UNMODIFIED`: a `return_size` nobody has written.
pub const UNMODIFIED: usize = usize::MAX;

/// Finds `key` in a NULL-key-terminated array.
///
/// # Safety
/// `params` is NULL or a valid OSSL_PARAM array terminated by an entry whose key is NULL.
pub unsafe fn locate(params: *mut OSSL_PARAM, key: &CStr) -> Option<&'static mut OSSL_PARAM> {
    if params.is_null() {
        return None;
    }
    let mut p = params;
    loop {
        // SAFETY: the array is terminated (caller's contract), so `p` stays inside it.
        let entry = unsafe { &mut *p };
        if entry.key.is_null() {
            return None;
        }
        // SAFETY: a non-NULL key is a NUL-terminated string.
        if unsafe { key_is(entry.key, key) } {
            return Some(entry);
        }
        // SAFETY: not at the terminator yet.
        p = unsafe { p.add(1) };
    }
}

/// Whether the NUL-terminated string at `key` is `want`, read only as far as the two
/// agree (no length computed first: most keys differ at their first byte).
///
/// # Safety
/// `key` is a NUL-terminated string.
unsafe fn key_is(key: *const c_char, want: &CStr) -> bool {
    for (i, &b) in want.to_bytes_with_nul().iter().enumerate() {
        // SAFETY: the bytes before `i` matched `want`'s, none of them NUL, so the
        // string at `key` reaches `i`.
        if unsafe { *key.add(i) } as u8 != b {
            return false;
        }
    }
    true
}

/// The key of an entry, as text.
pub fn key_of(p: &OSSL_PARAM) -> &CStr {
    // SAFETY: entries handed to us have a NUL-terminated key.
    unsafe { CStr::from_ptr(p.key) }
}

/// Reads an integer parameter (signed or unsigned, any size OpenSSL uses).
pub fn get_u64(p: &OSSL_PARAM) -> Option<u64> {
    if p.data.is_null() {
        return None;
    }
    // SAFETY: `data` points to `data_size` bytes of the declared integer type.
    unsafe {
        match (p.data_type, p.data_size) {
            (OSSL_PARAM_UNSIGNED_INTEGER, 4) => Some(u64::from(*(p.data as *const u32))),
            (OSSL_PARAM_UNSIGNED_INTEGER, 8) => Some(*(p.data as *const u64)),
            (OSSL_PARAM_INTEGER, 4) => u64::try_from(*(p.data as *const i32)).ok(),
            (OSSL_PARAM_INTEGER, 8) => u64::try_from(*(p.data as *const i64)).ok(),
            _ => None,
        }
    }
}

/// Writes an integer parameter in whatever integer type the caller declared.
pub fn set_u64(p: &mut OSSL_PARAM, v: u64) -> bool {
    p.return_size = p.data_size;
    if p.data.is_null() {
        // A size query.
        return true;
    }
    // SAFETY: `data` points to `data_size` writable bytes of the declared type.
    unsafe {
        match (p.data_type, p.data_size) {
            (OSSL_PARAM_UNSIGNED_INTEGER, 4) => match u32::try_from(v) {
                Ok(x) => *(p.data as *mut u32) = x,
                Err(_) => return false,
            },
            (OSSL_PARAM_UNSIGNED_INTEGER, 8) => *(p.data as *mut u64) = v,
            (OSSL_PARAM_INTEGER, 4) => match i32::try_from(v) {
                Ok(x) => *(p.data as *mut i32) = x,
                Err(_) => return false,
            },
            (OSSL_PARAM_INTEGER, 8) => match i64::try_from(v) {
                Ok(x) => *(p.data as *mut i64) = x,
                Err(_) => return false,
            },
            _ => return false,
        }
    }
    true
}

/// The bytes of an octet-string parameter.
pub fn get_octets(p: &OSSL_PARAM) -> Option<&[u8]> {
    if p.data_type != OSSL_PARAM_OCTET_STRING || p.data.is_null() {
        return None;
    }
    // SAFETY: an octet string's `data` holds `data_size` bytes.
    Some(unsafe { std::slice::from_raw_parts(p.data as *const u8, p.data_size) })
}

/// Writes an octet-string parameter (fails if the caller's buffer is too small).
pub fn set_octets(p: &mut OSSL_PARAM, v: &[u8]) -> bool {
    p.return_size = v.len();
    if p.data.is_null() {
        return true;
    }
    if p.data_type != OSSL_PARAM_OCTET_STRING || p.data_size < v.len() {
        return false;
    }
    // SAFETY: checked above that `data` holds at least `v.len()` bytes.
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p.data as *mut u8, v.len()) };
    true
}

/// Writes a text parameter: a UTF-8 string copied into the caller's buffer, or a
/// pointer to `v` (which must then outlive the caller's use: static text only).
pub fn set_utf8(p: &mut OSSL_PARAM, v: &'static CStr) -> bool {
    let bytes = v.to_bytes();
    match p.data_type {
        OSSL_PARAM_UTF8_PTR => {
            p.return_size = bytes.len();
            if !p.data.is_null() {
                // SAFETY: a UTF8_PTR parameter's data is a `const char *` slot.
                unsafe { *(p.data as *mut *const c_char) = v.as_ptr() };
            }
            true
        }
        OSSL_PARAM_UTF8_STRING => set_text(p, bytes),
        _ => false,
    }
}

/// Writes text that does not live forever: copied into the caller's buffer.
pub fn set_text(p: &mut OSSL_PARAM, bytes: &[u8]) -> bool {
    p.return_size = bytes.len();
    if p.data.is_null() {
        return true;
    }
    if p.data_type != OSSL_PARAM_UTF8_STRING || p.data_size < bytes.len() + 1 {
        return false;
    }
    // SAFETY: checked above that `data` holds the text and its NUL.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.data as *mut u8, bytes.len());
        *(p.data as *mut u8).add(bytes.len()) = 0;
    }
    true
}

/// Reads a text parameter of either string type.
pub fn get_utf8(p: &OSSL_PARAM) -> Option<String> {
    if p.data.is_null() {
        return None;
    }
    let ptr = match p.data_type {
        // SAFETY: a UTF8_PTR parameter's data is a `const char *` slot.
        OSSL_PARAM_UTF8_PTR => unsafe { *(p.data as *const *const c_char) },
        OSSL_PARAM_UTF8_STRING => p.data as *const c_char,
        _ => return None,
    };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: both string types hold a NUL-terminated string.
    Some(
        unsafe { CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// A descriptor entry of a gettable/settable list (`data` NULL, as OpenSSL's
/// `OSSL_PARAM_DEFN` makes them).
pub const fn defn(key: &'static CStr, data_type: u32) -> OSSL_PARAM {
    OSSL_PARAM {
        key: key.as_ptr(),
        data_type,
        data: std::ptr::null_mut::<c_void>(),
        data_size: 0,
        return_size: UNMODIFIED,
    }
}

/// The terminator of an OSSL_PARAM array.
pub const END: OSSL_PARAM = OSSL_PARAM {
    key: std::ptr::null(),
    data_type: 0,
    data: std::ptr::null_mut::<c_void>(),
    data_size: 0,
    return_size: 0,
};

/// A static, immutable OSSL_PARAM list: OpenSSL only reads the lists we return.
pub struct ParamList<const N: usize>(pub [OSSL_PARAM; N]);

// SAFETY: the list is never written; its pointers are to static strings.
unsafe impl<const N: usize> Sync for ParamList<N> {}

impl<const N: usize> ParamList<N> {
    /// The pointer OpenSSL expects.
    pub fn as_ptr(&'static self) -> *const OSSL_PARAM {
        self.0.as_ptr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_round_trip_in_every_width_and_refuse_what_does_not_fit() {
        let mut small: u32 = 0;
        let mut p = OSSL_PARAM {
            key: c"x".as_ptr(),
            data_type: OSSL_PARAM_UNSIGNED_INTEGER,
            data: (&mut small as *mut u32).cast(),
            data_size: 4,
            return_size: UNMODIFIED,
        };
        assert!(set_u64(&mut p, 77));
        assert_eq!(get_u64(&p), Some(77));
        assert_eq!(p.return_size, 4);
        assert!(!set_u64(&mut p, u64::from(u32::MAX) + 1));
        let mut signed: i32 = -5;
        let q = OSSL_PARAM {
            key: c"y".as_ptr(),
            data_type: OSSL_PARAM_INTEGER,
            data: (&mut signed as *mut i32).cast(),
            data_size: 4,
            return_size: UNMODIFIED,
        };
        assert_eq!(get_u64(&q), None, "a negative value is no count");
    }

    #[test]
    fn locate_finds_keys_and_stops_at_the_terminator() {
        let mut v: u64 = 1;
        let mut list = [
            OSSL_PARAM {
                key: c"a".as_ptr(),
                data_type: OSSL_PARAM_UNSIGNED_INTEGER,
                data: (&mut v as *mut u64).cast(),
                data_size: 8,
                return_size: UNMODIFIED,
            },
            END,
        ];
        // SAFETY: a terminated array.
        unsafe {
            assert!(locate(list.as_mut_ptr(), c"a").is_some());
            assert!(locate(list.as_mut_ptr(), c"b").is_none());
            assert!(locate(std::ptr::null_mut(), c"a").is_none());
        }
    }

    /// A key that is a prefix of another, or has one as its prefix, is not it (the
    /// comparison stops at the first difference, the terminating NUL included).
    #[test]
    fn a_key_matches_whole_not_by_prefix() {
        // SAFETY: NUL-terminated literals.
        unsafe {
            assert!(key_is(c"tls-version".as_ptr(), c"tls-version"));
            assert!(!key_is(c"tls-version".as_ptr(), c"tls"));
            assert!(!key_is(c"tls".as_ptr(), c"tls-version"));
            assert!(!key_is(c"padding".as_ptr(), c"paddinG"));
            assert!(!key_is(c"".as_ptr(), c"iv"));
            assert!(key_is(c"".as_ptr(), c""));
        }
        let mut list = [
            OSSL_PARAM {
                key: c"tlsaad".as_ptr(),
                data_type: OSSL_PARAM_OCTET_STRING,
                data: std::ptr::null_mut(),
                data_size: 0,
                return_size: UNMODIFIED,
            },
            OSSL_PARAM {
                key: c"tls".as_ptr(),
                data_type: OSSL_PARAM_OCTET_STRING,
                data: std::ptr::null_mut(),
                data_size: 0,
                return_size: UNMODIFIED,
            },
            END,
        ];
        // SAFETY: a terminated array.
        let found = unsafe { locate(list.as_mut_ptr(), c"tls") }.map(|p| key_of(p).to_owned());
        assert_eq!(found.as_deref(), Some(c"tls"));
    }

    #[test]
    fn octets_refuse_a_short_buffer() {
        let mut buf = [0u8; 4];
        let mut p = OSSL_PARAM {
            key: c"iv".as_ptr(),
            data_type: OSSL_PARAM_OCTET_STRING,
            data: buf.as_mut_ptr().cast(),
            data_size: 4,
            return_size: UNMODIFIED,
        };
        assert!(!set_octets(&mut p, &[1; 16]));
        assert!(set_octets(&mut p, &[1, 2, 3]));
        assert_eq!(&buf[..3], &[1, 2, 3]);
    }
}
