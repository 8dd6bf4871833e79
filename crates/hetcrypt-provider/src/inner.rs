//! The in-line CPU path: OpenSSL's default provider, reached in a private library
//! context of the libcrypto this module links, its cipher functions called directly.
//!
//! Why not `EVP_*` in the application's context: a configuration that prefers
//! `provider=hetcrypt` would hand our own implementation back and recurse. Why not the
//! `EVP_*` layer of a private context: it is a second dispatch per call; calling the
//! default provider's functions costs what the application's own EVP call costs, so the
//! provider adds nothing where the CPU wins.

use std::ffi::{c_char, c_int, c_void, CStr};

use hetcrypt::Cipher;
use openssl_provider_forge::bindings::{
    OSSL_ALGORITHM, OSSL_DISPATCH, OSSL_FUNC_CIPHER_CIPHER, OSSL_FUNC_CIPHER_DECRYPT_INIT,
    OSSL_FUNC_CIPHER_DUPCTX, OSSL_FUNC_CIPHER_ENCRYPT_INIT, OSSL_FUNC_CIPHER_FINAL,
    OSSL_FUNC_CIPHER_FREECTX, OSSL_FUNC_CIPHER_GETTABLE_CTX_PARAMS,
    OSSL_FUNC_CIPHER_GETTABLE_PARAMS, OSSL_FUNC_CIPHER_GET_CTX_PARAMS, OSSL_FUNC_CIPHER_GET_PARAMS,
    OSSL_FUNC_CIPHER_NEWCTX, OSSL_FUNC_CIPHER_SETTABLE_CTX_PARAMS, OSSL_FUNC_CIPHER_SET_CTX_PARAMS,
    OSSL_FUNC_CIPHER_UPDATE, OSSL_OP_CIPHER, OSSL_PARAM,
};

/// `newctx(provctx)`.
pub type NewCtxFn = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
/// `freectx(ctx)`.
pub type FreeCtxFn = unsafe extern "C" fn(*mut c_void);
/// `dupctx(ctx)`.
pub type DupCtxFn = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
/// `einit`/`dinit(ctx, key, keylen, iv, ivlen, params)`.
pub type InitFn = unsafe extern "C" fn(
    *mut c_void,
    *const u8,
    usize,
    *const u8,
    usize,
    *const OSSL_PARAM,
) -> c_int;
/// `update`/`cipher(ctx, out, outl, outsize, in, inl)`.
pub type UpdateFn =
    unsafe extern "C" fn(*mut c_void, *mut u8, *mut usize, usize, *const u8, usize) -> c_int;
/// `final(ctx, out, outl, outsize)`.
pub type FinalFn = unsafe extern "C" fn(*mut c_void, *mut u8, *mut usize, usize) -> c_int;
/// `get_params(params)`.
pub type GetParamsFn = unsafe extern "C" fn(*mut OSSL_PARAM) -> c_int;
/// `get_ctx_params(ctx, params)`.
pub type GetCtxParamsFn = unsafe extern "C" fn(*mut c_void, *mut OSSL_PARAM) -> c_int;
/// `set_ctx_params(ctx, params)`.
pub type SetCtxParamsFn = unsafe extern "C" fn(*mut c_void, *const OSSL_PARAM) -> c_int;
/// `gettable_params(provctx)`.
pub type GettableFn = unsafe extern "C" fn(*mut c_void) -> *const OSSL_PARAM;
/// `gettable_ctx_params`/`settable_ctx_params(cctx, provctx)`.
pub type CtxGettableFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> *const OSSL_PARAM;

/// The default provider's implementation of one cipher. `Copy`: each context keeps its
/// own copy, so a call reaches the inner function without going through the provider.
#[derive(Clone, Copy)]
pub struct InnerCipher {
    /// Its names, as the default provider lists them (we offer the same).
    pub names: *const c_char,
    /// The default provider's context for its functions.
    pub provctx: *mut c_void,
    /// The functions (those a cipher must have, and those it may lack).
    pub newctx: NewCtxFn,
    /// See [`FreeCtxFn`].
    pub freectx: FreeCtxFn,
    /// See [`DupCtxFn`].
    pub dupctx: Option<DupCtxFn>,
    /// Encryption init.
    pub einit: InitFn,
    /// Decryption init.
    pub dinit: InitFn,
    /// See [`UpdateFn`].
    pub update: UpdateFn,
    /// See [`FinalFn`].
    pub final_: FinalFn,
    /// One-shot `EVP_Cipher`.
    pub cipher: Option<UpdateFn>,
    /// Algorithm parameters.
    pub get_params: GetParamsFn,
    /// Context parameters, read.
    pub get_ctx_params: GetCtxParamsFn,
    /// Context parameters, written.
    pub set_ctx_params: SetCtxParamsFn,
    /// Lists of parameters.
    pub gettable_params: Option<GettableFn>,
    /// See [`CtxGettableFn`].
    pub gettable_ctx_params: Option<CtxGettableFn>,
    /// See [`CtxGettableFn`].
    pub settable_ctx_params: Option<CtxGettableFn>,
}

// SAFETY: the pointers are to the default provider's static names and its provider
// context, which OpenSSL lets any thread use.
unsafe impl Send for InnerCipher {}
// SAFETY: as above, and nothing here is written after construction.
unsafe impl Sync for InnerCipher {}

/// The ciphers we offer, by the default provider's first name. Order matters: it is
/// the index used everywhere else ([`crate::route`]'s tables).
pub const OFFERED: [(&CStr, Cipher); 9] = [
    (c"AES-128-CBC", Cipher::AES_128_CBC),
    (c"AES-192-CBC", Cipher::AES_192_CBC),
    (c"AES-256-CBC", Cipher::AES_256_CBC),
    (c"AES-128-CTR", Cipher::AES_128_CTR),
    (c"AES-192-CTR", Cipher::AES_192_CTR),
    (c"AES-256-CTR", Cipher::AES_256_CTR),
    (c"AES-128-GCM", Cipher::AES_128_GCM),
    (c"AES-192-GCM", Cipher::AES_192_GCM),
    (c"AES-256-GCM", Cipher::AES_256_GCM),
];

unsafe extern "C" {
    fn OSSL_PROVIDER_query_operation(
        prov: *const openssl_sys::OSSL_PROVIDER,
        operation_id: c_int,
        no_cache: *mut c_int,
    ) -> *const OSSL_ALGORITHM;
    fn OSSL_PROVIDER_get0_provider_ctx(prov: *const openssl_sys::OSSL_PROVIDER) -> *mut c_void;
}

/// The private library context with the default provider loaded in it.
pub struct Inner {
    libctx: *mut openssl_sys::OSSL_LIB_CTX,
    prov: *mut openssl_sys::OSSL_PROVIDER,
    /// One entry per [`OFFERED`] cipher, in that order (`None`: the default provider
    /// lacks it, so we do not offer it either).
    pub ciphers: Vec<Option<InnerCipher>>,
}

// SAFETY: libcrypto's library contexts and providers are thread-safe objects.
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

impl Inner {
    /// Opens the private context and looks up the default provider's ciphers.
    pub fn open() -> Result<Inner, String> {
        // SAFETY: plain constructors; results checked for NULL.
        let libctx = unsafe { openssl_sys::OSSL_LIB_CTX_new() };
        if libctx.is_null() {
            return Err("cannot create a private OpenSSL library context".into());
        }
        // SAFETY: a live library context and a static name.
        let prov = unsafe { openssl_sys::OSSL_PROVIDER_load(libctx, c"default".as_ptr()) };
        if prov.is_null() {
            // SAFETY: the context we just made, used by nothing else.
            unsafe { openssl_sys::OSSL_LIB_CTX_free(libctx) };
            return Err("cannot load OpenSSL's default provider in a private context".into());
        }
        let mut inner = Inner {
            libctx,
            prov,
            ciphers: Vec::new(),
        };
        let mut no_cache: c_int = 0;
        // SAFETY: a loaded provider; the returned array is static in libcrypto.
        let (algs, provctx) = unsafe {
            (
                OSSL_PROVIDER_query_operation(prov, OSSL_OP_CIPHER as c_int, &mut no_cache),
                OSSL_PROVIDER_get0_provider_ctx(prov),
            )
        };
        if algs.is_null() {
            return Err("OpenSSL's default provider offers no ciphers".into());
        }
        inner.ciphers = OFFERED
            .iter()
            // SAFETY: `algs` is the provider's terminated algorithm array.
            .map(|(name, _)| unsafe { find(algs, name) }.and_then(|a| unsafe { load(a, provctx) }))
            .collect();
        Ok(inner)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: ours, and no context of ours outlives the provider (teardown
        // comes after OpenSSL freed every cipher context).
        unsafe {
            openssl_sys::OSSL_PROVIDER_unload(self.prov);
            openssl_sys::OSSL_LIB_CTX_free(self.libctx);
        }
    }
}

/// The algorithm whose first name is `name`.
///
/// # Safety
/// `algs` is a terminated OSSL_ALGORITHM array.
unsafe fn find(algs: *const OSSL_ALGORITHM, name: &CStr) -> Option<&'static OSSL_ALGORITHM> {
    let mut p = algs;
    loop {
        // SAFETY: inside the terminated array.
        let a = unsafe { &*p };
        if a.algorithm_names.is_null() {
            return None;
        }
        // SAFETY: names are NUL-terminated static strings.
        let names = unsafe { CStr::from_ptr(a.algorithm_names) }.to_bytes();
        let first = names.split(|&b| b == b':').next().unwrap_or(names);
        if first.eq_ignore_ascii_case(name.to_bytes()) {
            return Some(a);
        }
        // SAFETY: not at the terminator.
        p = unsafe { p.add(1) };
    }
}

/// Reads one algorithm's dispatch table; `None` if a function we need is missing.
///
/// # Safety
/// `alg.implementation` is a terminated dispatch table of the cipher operation.
unsafe fn load(alg: &OSSL_ALGORITHM, provctx: *mut c_void) -> Option<InnerCipher> {
    let mut f: [Option<unsafe extern "C" fn()>; 15] = [None; 15];
    let mut p: *const OSSL_DISPATCH = alg.implementation;
    loop {
        // SAFETY: inside the terminated table.
        let d = unsafe { &*p };
        if d.function_id == 0 {
            break;
        }
        if let Some(slot) = f.get_mut(d.function_id as usize) {
            *slot = d.function;
        }
        // SAFETY: not at the terminator.
        p = unsafe { p.add(1) };
    }
    // SAFETY (every transmute below): the function with this id has the signature
    // provider-cipher(7) gives it, which the alias declares.
    unsafe {
        let get = |id: u32| f[id as usize];
        Some(InnerCipher {
            names: alg.algorithm_names,
            provctx,
            newctx: std::mem::transmute::<unsafe extern "C" fn(), NewCtxFn>(get(
                OSSL_FUNC_CIPHER_NEWCTX,
            )?),
            freectx: std::mem::transmute::<unsafe extern "C" fn(), FreeCtxFn>(get(
                OSSL_FUNC_CIPHER_FREECTX,
            )?),
            dupctx: get(OSSL_FUNC_CIPHER_DUPCTX)
                .map(|g| std::mem::transmute::<unsafe extern "C" fn(), DupCtxFn>(g)),
            einit: std::mem::transmute::<unsafe extern "C" fn(), InitFn>(get(
                OSSL_FUNC_CIPHER_ENCRYPT_INIT,
            )?),
            dinit: std::mem::transmute::<unsafe extern "C" fn(), InitFn>(get(
                OSSL_FUNC_CIPHER_DECRYPT_INIT,
            )?),
            update: std::mem::transmute::<unsafe extern "C" fn(), UpdateFn>(get(
                OSSL_FUNC_CIPHER_UPDATE,
            )?),
            final_: std::mem::transmute::<unsafe extern "C" fn(), FinalFn>(get(
                OSSL_FUNC_CIPHER_FINAL,
            )?),
            cipher: get(OSSL_FUNC_CIPHER_CIPHER)
                .map(|g| std::mem::transmute::<unsafe extern "C" fn(), UpdateFn>(g)),
            get_params: std::mem::transmute::<unsafe extern "C" fn(), GetParamsFn>(get(
                OSSL_FUNC_CIPHER_GET_PARAMS,
            )?),
            get_ctx_params: std::mem::transmute::<unsafe extern "C" fn(), GetCtxParamsFn>(get(
                OSSL_FUNC_CIPHER_GET_CTX_PARAMS,
            )?),
            set_ctx_params: std::mem::transmute::<unsafe extern "C" fn(), SetCtxParamsFn>(get(
                OSSL_FUNC_CIPHER_SET_CTX_PARAMS,
            )?),
            gettable_params: get(OSSL_FUNC_CIPHER_GETTABLE_PARAMS)
                .map(|g| std::mem::transmute::<unsafe extern "C" fn(), GettableFn>(g)),
            gettable_ctx_params: get(OSSL_FUNC_CIPHER_GETTABLE_CTX_PARAMS)
                .map(|g| std::mem::transmute::<unsafe extern "C" fn(), CtxGettableFn>(g)),
            settable_ctx_params: get(OSSL_FUNC_CIPHER_SETTABLE_CTX_PARAMS)
                .map(|g| std::mem::transmute::<unsafe extern "C" fn(), CtxGettableFn>(g)),
        })
    }
}

/// The reason text of the last error the default provider raised in our libcrypto
/// (it is on the application's queue only when the application uses that same
/// libcrypto), or a generic text.
pub fn last_error_text() -> String {
    // SAFETY: read-only peeks at this thread's error queue.
    unsafe {
        let code = openssl_sys::ERR_peek_last_error();
        let text = openssl_sys::ERR_reason_error_string(code);
        if code == 0 || text.is_null() {
            "operation refused".to_string()
        } else {
            CStr::from_ptr(text).to_string_lossy().into_owned()
        }
    }
}
