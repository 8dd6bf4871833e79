//! The calls back into the loading OpenSSL: configuration values and the error queue.
//!
//! Everything the application must see goes through these upcalls, never through the
//! libcrypto this module links, which is another library when OpenSSL 4.0 loads us.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use openssl_provider_forge::bindings::{
    OSSL_CORE_HANDLE, OSSL_DISPATCH, OSSL_FUNC_CORE_GET_PARAMS, OSSL_FUNC_CORE_NEW_ERROR,
    OSSL_FUNC_CORE_SET_ERROR_DEBUG, OSSL_FUNC_CORE_VSET_ERROR, OSSL_PARAM, OSSL_PARAM_UTF8_PTR,
};

use crate::params;

type GetParamsFn = unsafe extern "C" fn(*const OSSL_CORE_HANDLE, *mut OSSL_PARAM) -> c_int;
type NewErrorFn = unsafe extern "C" fn(*const OSSL_CORE_HANDLE);
type SetErrorDebugFn =
    unsafe extern "C" fn(*const OSSL_CORE_HANDLE, *const c_char, c_int, *const c_char);
// The last argument is a `va_list`. On x86-64 (System V) a `va_list` parameter is
// passed as a pointer to its one-element array; we only ever pass a format without
// conversions, so the list is never read.
type VsetErrorFn = unsafe extern "C" fn(*const OSSL_CORE_HANDLE, u32, *const c_char, *mut c_void);

/// Reasons for errors we raise; the texts come from [`REASONS`] through the
/// provider's `get_reason_strings`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Reason {
    /// The wrapped implementation refused (bad length, bad padding, bad tag...).
    OperationFailed = 1,
    /// A key of the wrong length.
    InvalidKeyLength = 2,
    /// An IV of the wrong length.
    InvalidIvLength = 3,
    /// A panic was caught at the FFI boundary (a bug in hetcrypt).
    Internal = 6,
    /// Setting up the provider failed.
    InitFailed = 7,
}

/// `(reason, text)` pairs, terminated as OSSL_ITEM arrays are.
pub const REASONS: [(u32, &CStr); 5] = [
    (Reason::OperationFailed as u32, c"cipher operation failed"),
    (Reason::InvalidKeyLength as u32, c"invalid key length"),
    (Reason::InvalidIvLength as u32, c"invalid iv length"),
    (
        Reason::Internal as u32,
        c"internal error in the hetcrypt provider",
    ),
    (
        Reason::InitFailed as u32,
        c"hetcrypt provider initialisation failed",
    ),
];

/// The core's functions we call, and the handle they take.
pub struct Core {
    handle: *const OSSL_CORE_HANDLE,
    get_params: Option<GetParamsFn>,
    new_error: Option<NewErrorFn>,
    set_error_debug: Option<SetErrorDebugFn>,
    vset_error: Option<VsetErrorFn>,
}

// SAFETY: the handle is an opaque token the core lets any thread use; the functions
// are the core's thread-safe entry points.
unsafe impl Send for Core {}
// SAFETY: as above; nothing here is mutated after construction.
unsafe impl Sync for Core {}

impl Core {
    /// Picks our upcalls out of the core's dispatch table.
    ///
    /// # Safety
    /// `input` is the terminated table `OSSL_provider_init` received.
    pub unsafe fn new(handle: *const OSSL_CORE_HANDLE, input: *const OSSL_DISPATCH) -> Self {
        let mut core = Core {
            handle,
            get_params: None,
            new_error: None,
            set_error_debug: None,
            vset_error: None,
        };
        let mut p = input;
        while !p.is_null() {
            // SAFETY: the table is terminated by function_id 0 (caller's contract).
            let entry = unsafe { &*p };
            if entry.function_id == 0 {
                break;
            }
            let f = entry.function;
            // SAFETY: each id's function has the signature core_dispatch.h gives it.
            unsafe {
                match entry.function_id as u32 {
                    OSSL_FUNC_CORE_GET_PARAMS => {
                        core.get_params =
                            f.map(|f| std::mem::transmute::<unsafe extern "C" fn(), _>(f))
                    }
                    OSSL_FUNC_CORE_NEW_ERROR => {
                        core.new_error =
                            f.map(|f| std::mem::transmute::<unsafe extern "C" fn(), _>(f))
                    }
                    OSSL_FUNC_CORE_SET_ERROR_DEBUG => {
                        core.set_error_debug =
                            f.map(|f| std::mem::transmute::<unsafe extern "C" fn(), _>(f))
                    }
                    OSSL_FUNC_CORE_VSET_ERROR => {
                        core.vset_error =
                            f.map(|f| std::mem::transmute::<unsafe extern "C" fn(), _>(f))
                    }
                    _ => {}
                }
            }
            // SAFETY: not at the terminator yet.
            p = unsafe { p.add(1) };
        }
        core
    }

    /// The values of our keys in the provider's `openssl.cnf` section (unset keys
    /// are absent).
    pub fn config(&self, keys: &[&'static CStr]) -> Vec<Option<String>> {
        let Some(get_params) = self.get_params else {
            return vec![None; keys.len()];
        };
        let mut slots: Vec<*const c_char> = vec![std::ptr::null(); keys.len()];
        let mut list: Vec<OSSL_PARAM> = keys
            .iter()
            .zip(slots.iter_mut())
            .map(|(k, slot)| OSSL_PARAM {
                key: k.as_ptr(),
                data_type: OSSL_PARAM_UTF8_PTR,
                data: (slot as *mut *const c_char).cast(),
                data_size: 0,
                return_size: params::UNMODIFIED,
            })
            .collect();
        list.push(params::END);
        // SAFETY: a terminated list whose UTF8_PTR slots live until we read them.
        if unsafe { get_params(self.handle, list.as_mut_ptr()) } == 0 {
            return vec![None; keys.len()];
        }
        slots
            .iter()
            .map(|&s| {
                // SAFETY: the core set the slot to a NUL-terminated string it owns, or
                // left it NULL.
                (!s.is_null()).then(|| unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
            })
            .collect()
    }

    /// Puts an error on the application's error queue: `reason`, plus `detail` as
    /// its data (e.g. "aes-128-cbc: wrong final block length").
    pub fn raise(&self, reason: Reason, detail: &str, func: &CStr) {
        let (Some(new_error), Some(vset_error)) = (self.new_error, self.vset_error) else {
            return;
        };
        // '%' would be a conversion in the format: double it, so no argument is read.
        let text = CString::new(detail.replace('\0', "").replace('%', "%%"))
            .unwrap_or_else(|_| CString::from(c"?"));
        // Room for a System V x86-64 `va_list` (24 bytes), never read.
        let mut no_args = [0u64; 4];
        // SAFETY: the core's error functions with our handle; the format has no
        // conversions, so the va_list placeholder is not read.
        unsafe {
            new_error(self.handle);
            if let Some(debug) = self.set_error_debug {
                debug(self.handle, c"hetcrypt-provider".as_ptr(), 0, func.as_ptr());
            }
            if cfg!(target_arch = "x86_64") {
                vset_error(
                    self.handle,
                    reason as u32,
                    text.as_ptr(),
                    no_args.as_mut_ptr().cast(),
                );
            } else {
                vset_error(
                    self.handle,
                    reason as u32,
                    std::ptr::null(),
                    no_args.as_mut_ptr().cast(),
                );
            }
        }
    }
}
