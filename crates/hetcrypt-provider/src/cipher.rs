//! The cipher operation: our context around the default provider's, and the calls
//! that may move to the crypto module.
//!
//! Every function forwards to the default provider's implementation, which keeps the
//! whole OpenSSL state (buffered partial blocks, padding, CTR position, GCM, the TLS
//! record parameters). An `update` of whole blocks, with nothing buffered, may instead
//! run on a module lane: we read the chaining value, run the job, and set the inner
//! context's IV to where the module left the chain. Byte-identical by construction.

use std::ffi::{c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use hetcrypt::{KeyId, Mode};
use openssl_provider_forge::bindings::{
    OSSL_DISPATCH, OSSL_FUNC_CIPHER_CIPHER, OSSL_FUNC_CIPHER_DECRYPT_INIT, OSSL_FUNC_CIPHER_DUPCTX,
    OSSL_FUNC_CIPHER_ENCRYPT_INIT, OSSL_FUNC_CIPHER_FINAL, OSSL_FUNC_CIPHER_FREECTX,
    OSSL_FUNC_CIPHER_GETTABLE_CTX_PARAMS, OSSL_FUNC_CIPHER_GETTABLE_PARAMS,
    OSSL_FUNC_CIPHER_GET_CTX_PARAMS, OSSL_FUNC_CIPHER_GET_PARAMS, OSSL_FUNC_CIPHER_NEWCTX,
    OSSL_FUNC_CIPHER_SETTABLE_CTX_PARAMS, OSSL_FUNC_CIPHER_SET_CTX_PARAMS, OSSL_FUNC_CIPHER_UPDATE,
    OSSL_PARAM, OSSL_PARAM_OCTET_STRING,
};
use zeroize::Zeroizing;

use crate::core::Reason;
use crate::inner::{InnerCipher, OFFERED};
use crate::params;
use crate::route::{Dest, LocalCounts, Started};
use crate::Provider;

/// AES block size.
const BLOCK: usize = 16;

/// One cipher context of ours.
pub struct Ctx {
    prov: Arc<Provider>,
    /// The default provider's functions for this cipher, copied here so the in-line
    /// path reads the context, not the provider's tables.
    fns: InnerCipher,
    /// Whether the module may ever take this cipher (one is configured and offers it:
    /// never for GCM). If not, a call goes straight to the inner context, with no
    /// routing, and nothing that only module calls need is tracked.
    module_on: bool,
    alg: usize,
    mode: Mode,
    inner: *mut c_void,
    enc: bool,
    key_set: bool,
    /// CBC padding on (OpenSSL's default).
    pad: bool,
    /// TLS record mode (`tls-version` set): each update is one record.
    tls: bool,
    /// Bytes the inner context holds: CBC's partial (or held-back) block, CTR's
    /// position in its keystream block. Module calls need it to be 0.
    pending: usize,
    /// The key, kept while the module may take this cipher (to register it again
    /// in a duplicate).
    key: Option<Zeroizing<Vec<u8>>>,
    module_key: Option<KeyId>,
    /// Module calls made with `module_key` (the first one sets the key up).
    module_calls: u64,
    /// The IV the application set, as `EVP_CIPHER_CTX_get_original_iv` must report it
    /// after we have moved the inner context's IV along.
    oiv: Option<[u8; BLOCK]>,
    moved_iv: bool,
    counts: LocalCounts,
}

impl Ctx {
    fn inner_fns(&self) -> &InnerCipher {
        &self.fns
    }

    fn fail(&self, reason: Reason, func: &CStr) -> c_int {
        let name = OFFERED[self.alg].0.to_string_lossy();
        let detail = match reason {
            Reason::OperationFailed => format!("{name}: {}", crate::inner::last_error_text()),
            _ => name.into_owned(),
        };
        self.prov.core.raise(reason, &detail, func);
        0
    }

    /// Notes what the parameters set: padding, TLS record mode. Only module calls need
    /// to know, so nothing is read where the module may never take the cipher.
    fn note_params(&mut self, list: *const OSSL_PARAM) {
        if !self.module_on {
            return;
        }
        let list = list as *mut OSSL_PARAM;
        // SAFETY: OpenSSL hands us terminated arrays (or NULL).
        unsafe {
            if let Some(v) = params::locate(list, c"padding").and_then(|p| params::get_u64(p)) {
                self.pad = v != 0;
            }
            if let Some(v) = params::locate(list, c"tls-version").and_then(|p| params::get_u64(p)) {
                self.tls = v > 0;
            }
        }
    }

    fn forget_module_key(&mut self) {
        if let (Some(id), Some(m)) = (self.module_key.take(), self.prov.router.module.as_ref()) {
            m.remove_key(id);
        }
    }

    fn set_key(&mut self, key: &[u8]) {
        self.forget_module_key();
        self.key = None;
        if let Some(m) = self
            .prov
            .router
            .module
            .as_ref()
            .filter(|m| m.may_take(self.alg))
        {
            self.module_key = m.add_key(key);
            self.module_calls = 0;
            self.key = Some(Zeroizing::new(key.to_vec()));
        }
    }

    /// The inner context's current chaining value (CBC) or counter block (CTR).
    fn inner_iv(&self) -> Option<[u8; BLOCK]> {
        let mut iv = [0u8; BLOCK];
        let mut list = [
            OSSL_PARAM {
                key: c"updated-iv".as_ptr(),
                data_type: OSSL_PARAM_OCTET_STRING,
                data: iv.as_mut_ptr().cast(),
                data_size: BLOCK,
                return_size: params::UNMODIFIED,
            },
            params::END,
        ];
        // SAFETY: the inner context with a terminated list whose buffer outlives it.
        let ok = unsafe { (self.inner_fns().get_ctx_params)(self.inner, list.as_mut_ptr()) };
        (ok == 1 && list[0].return_size == BLOCK).then_some(iv)
    }

    /// Moves the inner context's IV to `iv` (keeping its key and parameters).
    fn set_inner_iv(&mut self, iv: &[u8; BLOCK]) -> bool {
        let f = self.inner_fns();
        let init = if self.enc { f.einit } else { f.dinit };
        // SAFETY: the inner context; a NULL key keeps its key schedule.
        let ok = unsafe {
            init(
                self.inner,
                std::ptr::null(),
                0,
                iv.as_ptr(),
                BLOCK,
                std::ptr::null(),
            )
        };
        self.moved_iv = true;
        ok == 1
    }

    /// Tracks what the inner context holds after it took `inl` bytes in `update`.
    fn track(&mut self, inl: usize) {
        let total = self.pending + inl;
        self.pending = match self.mode {
            Mode::Ctr => total % BLOCK,
            _ if self.tls => 0,
            _ if !self.enc && self.pad => match total % BLOCK {
                0 if total == 0 => 0,
                0 => BLOCK,
                r => r,
            },
            _ => total % BLOCK,
        };
    }

    /// Tries to run this update on the module: `Ok(outl)` if it did, else
    /// `Err(timed)`: run it in-line, timing it for the router if `timed`.
    ///
    /// # Safety
    /// `out`/`in_` as OpenSSL passes them to `update` (`outsize` bytes writable at
    /// `out`, `inl` readable at `in_`; they may be the same buffer).
    unsafe fn try_module(
        &mut self,
        out: *mut u8,
        outsize: usize,
        in_: *const u8,
        inl: usize,
    ) -> Result<usize, bool> {
        if self.pending != 0 || inl == 0 || self.mode == Mode::Gcm || !self.key_set {
            return Err(false);
        }
        let key = self.module_key.ok_or(false)?;
        // What the module can run as it stands: whole blocks, CTR at a block edge,
        // CBC without a held-back block. TLS encryption pads the record first.
        let len = match self.mode {
            Mode::Ctr if inl.is_multiple_of(BLOCK) => inl,
            // (The default provider refuses TLS records without padding on: so do we,
            // by leaving the call to it.)
            Mode::Cbc | Mode::CbcPkcs7 if self.tls && self.enc && self.pad => {
                let padded = (inl / BLOCK + 1) * BLOCK;
                if !std::ptr::eq(in_, out) || outsize < padded {
                    return Err(false); // the inner context reports the error
                }
                padded
            }
            Mode::Cbc | Mode::CbcPkcs7
                if !self.tls && inl.is_multiple_of(BLOCK) && (self.enc || !self.pad) =>
            {
                inl
            }
            _ => return Err(false),
        };
        if outsize < len {
            return Err(false);
        }
        // SAFETY: `self` holds an `Arc` of the provider for as long as this borrow
        // lives; a raw borrow avoids two atomic operations per call (costly under
        // emulation) and leaves `self` free to be borrowed mutably below.
        let prov: &Provider = unsafe { &*Arc::as_ptr(&self.prov) };
        let guard = match prov.router.choose(self.alg, self.enc, len) {
            Dest::Module(guard) => guard,
            Dest::Cpu { timed } => return Err(timed),
        };
        let iv = self.inner_iv().ok_or(false)?;
        // In place (libssl's records are): the input is set aside, so the module never
        // reads what it writes and a failed call can still run in-line from the
        // original bytes. Distinct buffers: no copy at all. (OpenSSL refuses partly
        // overlapping buffers before calling us.)
        let in_place = std::ptr::eq(in_, out);
        let saved: Option<Vec<u8>> = if in_place {
            // SAFETY: `inl` readable bytes at `in_` (caller's contract).
            let mut v = unsafe { std::slice::from_raw_parts(in_, inl) }.to_vec();
            // TLS CBC padding: every pad byte holds the pad length minus one.
            v.resize(len, (len - inl).saturating_sub(1) as u8);
            Some(v)
        } else {
            None
        };
        let input: &[u8] = match &saved {
            Some(v) => v,
            // SAFETY: `len == inl` readable bytes at `in_` (only TLS padding makes
            // them differ, and that is in place), not overlapping `out`.
            None => unsafe { std::slice::from_raw_parts(in_, len) },
        };
        // CBC decryption chains on the last input block: read it before the output
        // may overwrite it.
        let next = match self.mode {
            Mode::Ctr => ctr_add(&iv, (len / BLOCK) as u128),
            _ if self.enc => [0u8; BLOCK], // the last output block, once there is one
            _ => last_block(input),
        };
        // SAFETY: `outsize >= len` writable bytes at `out` (checked above), not
        // overlapping `input` (a copy when in place).
        let output = unsafe { std::slice::from_raw_parts_mut(out, len) };
        let first = self.module_calls == 0;
        if !prov
            .router
            .run_module(guard, self.alg, self.enc, key, first, iv, input, output)
        {
            if let Some(v) = &saved {
                // Give the in-line path its input back (the module may have written
                // part of its output over it).
                output[..inl].copy_from_slice(&v[..inl]);
            }
            return Err(false);
        }
        self.module_calls += 1;
        let next = if self.enc && self.mode != Mode::Ctr {
            last_block(output)
        } else {
            next
        };
        if !self.set_inner_iv(&next) {
            // The inner context refused its own IV back; its chain is where it was
            // before, so the call can still run in-line from the original input.
            if let Some(v) = &saved {
                output[..inl].copy_from_slice(&v[..inl]);
            }
            return Err(false);
        }
        Ok(len)
    }
}

fn last_block(data: &[u8]) -> [u8; BLOCK] {
    let mut b = [0u8; BLOCK];
    b.copy_from_slice(&data[data.len() - BLOCK..]);
    b
}

/// A CTR counter block advanced by `blocks` (the whole block as a 128-bit big-endian
/// counter, as OpenSSL's CTR mode carries it).
fn ctr_add(iv: &[u8; BLOCK], blocks: u128) -> [u8; BLOCK] {
    u128::from_be_bytes(*iv).wrapping_add(blocks).to_be_bytes()
}

/// Runs an entry point's body, turning a panic into an OpenSSL error and `fallback`.
fn guarded<T>(fallback: T, func: &CStr, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(_) => {
            crate::raise_global(Reason::Internal, "a panic was caught", func);
            fallback
        }
    }
}

/// # Safety
/// `vctx` is a context this provider made (or NULL).
unsafe fn ctx<'a>(vctx: *mut c_void) -> Option<&'a mut Ctx> {
    // SAFETY: our contexts are `Box<Ctx>` pointers (caller's contract).
    unsafe { (vctx as *mut Ctx).as_mut() }
}

unsafe extern "C" fn newctx<const I: usize>(provctx: *mut c_void) -> *mut c_void {
    guarded(std::ptr::null_mut(), c"newctx", || {
        // SAFETY: our provider context.
        let Some(prov) = (unsafe { crate::provider_from(provctx) }) else {
            return std::ptr::null_mut();
        };
        let f = prov.inner_cipher(I);
        // SAFETY: the default provider's constructor with its own provider context.
        let inner = unsafe { (f.newctx)(f.provctx) };
        if inner.is_null() {
            return std::ptr::null_mut();
        }
        let module_on = prov.router.module.as_ref().is_some_and(|m| m.offers(I));
        let c = Box::new(Ctx {
            fns: *f,
            module_on,
            prov,
            alg: I,
            mode: OFFERED[I].1.mode,
            inner,
            enc: true,
            key_set: false,
            pad: true,
            tls: false,
            pending: 0,
            key: None,
            module_key: None,
            module_calls: 0,
            oiv: None,
            moved_iv: false,
            counts: LocalCounts::default(),
        });
        Box::into_raw(c).cast()
    })
}

unsafe extern "C" fn freectx(vctx: *mut c_void) {
    guarded((), c"freectx", || {
        if vctx.is_null() {
            return;
        }
        // SAFETY: a context of ours, handed back once.
        let mut c = unsafe { Box::from_raw(vctx as *mut Ctx) };
        c.forget_module_key();
        let prov = Arc::clone(&c.prov);
        prov.router.flush(&mut c.counts);
        // SAFETY: the inner context we made, freed once.
        unsafe { (c.inner_fns().freectx)(c.inner) };
    })
}

unsafe extern "C" fn dupctx(vctx: *mut c_void) -> *mut c_void {
    guarded(std::ptr::null_mut(), c"dupctx", || {
        // SAFETY: a context of ours.
        let Some(c) = (unsafe { ctx(vctx) }) else {
            return std::ptr::null_mut();
        };
        let Some(dup) = c.inner_fns().dupctx else {
            return std::ptr::null_mut();
        };
        // SAFETY: the inner context.
        let inner = unsafe { dup(c.inner) };
        if inner.is_null() {
            return std::ptr::null_mut();
        }
        let mut d = Box::new(Ctx {
            prov: Arc::clone(&c.prov),
            fns: c.fns,
            module_on: c.module_on,
            alg: c.alg,
            mode: c.mode,
            inner,
            enc: c.enc,
            key_set: c.key_set,
            pad: c.pad,
            tls: c.tls,
            pending: c.pending,
            key: None,
            module_key: None,
            module_calls: 0,
            oiv: c.oiv,
            moved_iv: c.moved_iv,
            counts: LocalCounts::default(),
        });
        if let Some(k) = c.key.as_ref() {
            d.set_key(k);
        }
        Box::into_raw(d).cast()
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn init(
    vctx: *mut c_void,
    key: *const u8,
    keylen: usize,
    iv: *const u8,
    ivlen: usize,
    list: *const OSSL_PARAM,
    enc: bool,
) -> c_int {
    // SAFETY: a context of ours.
    let Some(c) = (unsafe { ctx(vctx) }) else {
        return 0;
    };
    let f = c.inner_fns();
    let init = if enc { f.einit } else { f.dinit };
    // A reset without an IV restores the original one for CBC (OpenSSL 1.1.1's
    // behaviour): the inner context's "original" is where we last moved it.
    let mut iv_ptr = iv;
    let mut iv_len = ivlen;
    let restored;
    if iv.is_null() && c.moved_iv && c.mode != Mode::Ctr {
        if let Some(o) = c.oiv {
            restored = o;
            iv_ptr = restored.as_ptr();
            iv_len = BLOCK;
        }
    }
    // SAFETY: OpenSSL's arguments, passed on to the inner context.
    let ok = unsafe { init(c.inner, key, keylen, iv_ptr, iv_len, list) };
    if ok != 1 {
        let reason = if !key.is_null() && keylen != OFFERED[c.alg].1.key_size.key_len() {
            Reason::InvalidKeyLength
        } else if !iv.is_null() && ivlen != OFFERED[c.alg].1.iv_len() && c.mode != Mode::Gcm {
            Reason::InvalidIvLength
        } else {
            Reason::OperationFailed
        };
        return c.fail(
            reason,
            if enc {
                c"encrypt_init"
            } else {
                c"decrypt_init"
            },
        );
    }
    c.enc = enc;
    c.pending = 0;
    if !key.is_null() {
        c.key_set = true;
        // SAFETY: `keylen` bytes at `key`, accepted by the inner init.
        c.set_key(unsafe { std::slice::from_raw_parts(key, keylen) });
    }
    if !iv.is_null() && ivlen == BLOCK {
        let mut o = [0u8; BLOCK];
        // SAFETY: 16 readable bytes at `iv`.
        o.copy_from_slice(unsafe { std::slice::from_raw_parts(iv, BLOCK) });
        c.oiv = Some(o);
        c.moved_iv = false;
    }
    c.note_params(list);
    1
}

/// `encrypt_init` (`ENC`) and `decrypt_init`.
unsafe extern "C" fn init_entry<const ENC: bool>(
    vctx: *mut c_void,
    key: *const u8,
    keylen: usize,
    iv: *const u8,
    ivlen: usize,
    list: *const OSSL_PARAM,
) -> c_int {
    let name = if ENC {
        c"encrypt_init"
    } else {
        c"decrypt_init"
    };
    // SAFETY: OpenSSL's arguments.
    guarded(0, name, || unsafe {
        init(vctx, key, keylen, iv, ivlen, list, ENC)
    })
}

unsafe extern "C" fn update(
    vctx: *mut c_void,
    out: *mut u8,
    outl: *mut usize,
    outsize: usize,
    in_: *const u8,
    inl: usize,
) -> c_int {
    guarded(0, c"update", || {
        // SAFETY: a context of ours.
        let Some(c) = (unsafe { ctx(vctx) }) else {
            return 0;
        };
        if outl.is_null() {
            return 0;
        }
        let mut timed = false;
        if c.module_on && !out.is_null() && !in_.is_null() {
            // SAFETY: OpenSSL's buffers, as `update` receives them.
            match unsafe { c.try_module(out, outsize, in_, inl) } {
                Ok(n) => {
                    // SAFETY: OpenSSL's output length slot.
                    unsafe { *outl = n };
                    return 1;
                }
                Err(t) => timed = t,
            }
        }
        let started = timed.then(Started::now);
        // SAFETY: OpenSSL's arguments, passed on to the inner context.
        let ok = unsafe { (c.fns.update)(c.inner, out, outl, outsize, in_, inl) };
        if ok != 1 {
            return c.fail(Reason::OperationFailed, c"update");
        }
        if c.module_on {
            if let Some(t) = started {
                c.prov.router.cpu_took(c.alg, c.enc, inl, t);
            }
            // What the inner context holds matters only to module calls.
            if !out.is_null() {
                c.track(inl);
            }
        }
        // Disjoint fields: no reference count touched on the hot path.
        let Ctx { prov, counts, .. } = c;
        prov.router.count_cpu(counts, inl);
        1
    })
}

unsafe extern "C" fn final_(
    vctx: *mut c_void,
    out: *mut u8,
    outl: *mut usize,
    outsize: usize,
) -> c_int {
    guarded(0, c"final", || {
        // SAFETY: a context of ours.
        let Some(c) = (unsafe { ctx(vctx) }) else {
            return 0;
        };
        // SAFETY: OpenSSL's arguments, passed on.
        let ok = unsafe { (c.inner_fns().final_)(c.inner, out, outl, outsize) };
        if ok != 1 {
            return c.fail(Reason::OperationFailed, c"final");
        }
        c.pending = 0;
        1
    })
}

unsafe extern "C" fn cipher(
    vctx: *mut c_void,
    out: *mut u8,
    outl: *mut usize,
    outsize: usize,
    in_: *const u8,
    inl: usize,
) -> c_int {
    guarded(0, c"cipher", || {
        // SAFETY: a context of ours.
        let Some(c) = (unsafe { ctx(vctx) }) else {
            return 0;
        };
        let Some(f) = c.inner_fns().cipher else {
            return 0;
        };
        // SAFETY: OpenSSL's arguments, passed on.
        let ok = unsafe { f(c.inner, out, outl, outsize, in_, inl) };
        if ok != 1 {
            return c.fail(Reason::OperationFailed, c"cipher");
        }
        if c.mode == Mode::Ctr {
            c.pending = (c.pending + inl) % BLOCK;
        }
        // Disjoint fields: no reference count touched on the hot path.
        let Ctx { prov, counts, .. } = c;
        prov.router.count_cpu(counts, inl);
        1
    })
}

unsafe extern "C" fn get_params<const I: usize>(list: *mut OSSL_PARAM) -> c_int {
    guarded(0, c"get_params", || match crate::global() {
        // SAFETY: OpenSSL's list, passed on.
        Some(prov) => unsafe { (prov.inner_cipher(I).get_params)(list) },
        None => 0,
    })
}

unsafe extern "C" fn gettable_params<const I: usize>(_provctx: *mut c_void) -> *const OSSL_PARAM {
    guarded(std::ptr::null(), c"gettable_params", || {
        let Some(prov) = crate::global() else {
            return std::ptr::null();
        };
        let f = prov.inner_cipher(I);
        // SAFETY: the default provider's list function with its provider context.
        f.gettable_params
            .map_or(std::ptr::null(), |g| unsafe { g(f.provctx) })
    })
}

unsafe extern "C" fn get_ctx_params(vctx: *mut c_void, list: *mut OSSL_PARAM) -> c_int {
    guarded(0, c"get_ctx_params", || {
        // SAFETY: a context of ours.
        let Some(c) = (unsafe { ctx(vctx) }) else {
            return 0;
        };
        // SAFETY: OpenSSL's list, passed on.
        if unsafe { (c.inner_fns().get_ctx_params)(c.inner, list) } != 1 {
            return 0;
        }
        if c.moved_iv {
            // SAFETY: OpenSSL's terminated list.
            if let (Some(p), Some(o)) = (unsafe { params::locate(list, c"iv") }, c.oiv) {
                return i32::from(params::set_octets(p, &o));
            }
        }
        1
    })
}

unsafe extern "C" fn set_ctx_params(vctx: *mut c_void, list: *const OSSL_PARAM) -> c_int {
    guarded(0, c"set_ctx_params", || {
        // SAFETY: a context of ours.
        let Some(c) = (unsafe { ctx(vctx) }) else {
            return 0;
        };
        // SAFETY: OpenSSL's list, passed on.
        if unsafe { (c.inner_fns().set_ctx_params)(c.inner, list) } != 1 {
            return c.fail(Reason::OperationFailed, c"set_ctx_params");
        }
        c.note_params(list);
        1
    })
}

/// A context-parameter list of the default provider's cipher `I` (`pick` chooses
/// gettable or settable), asked of its inner context when OpenSSL names ours.
fn ctx_param_list<const I: usize>(
    vctx: *mut c_void,
    func: &CStr,
    pick: fn(&InnerCipher) -> Option<crate::inner::CtxGettableFn>,
) -> *const OSSL_PARAM {
    guarded(std::ptr::null(), func, || {
        let Some(prov) = crate::global() else {
            return std::ptr::null();
        };
        let f = prov.inner_cipher(I);
        // SAFETY: our context or NULL.
        let inner = unsafe { ctx(vctx) }.map_or(std::ptr::null_mut(), |c| c.inner);
        // SAFETY: the default provider's list function.
        pick(f).map_or(std::ptr::null(), |g| unsafe { g(inner, f.provctx) })
    })
}

unsafe extern "C" fn gettable_ctx_params<const I: usize>(
    vctx: *mut c_void,
    _provctx: *mut c_void,
) -> *const OSSL_PARAM {
    ctx_param_list::<I>(vctx, c"gettable_ctx_params", |f| f.gettable_ctx_params)
}

unsafe extern "C" fn settable_ctx_params<const I: usize>(
    vctx: *mut c_void,
    _provctx: *mut c_void,
) -> *const OSSL_PARAM {
    ctx_param_list::<I>(vctx, c"settable_ctx_params", |f| f.settable_ctx_params)
}

/// Our dispatch table for offered cipher `I`.
const fn table<const I: usize>() -> [OSSL_DISPATCH; 15] {
    use crate::inner::{
        CtxGettableFn, DupCtxFn, FinalFn, FreeCtxFn, GetCtxParamsFn, GetParamsFn, GettableFn,
        InitFn, NewCtxFn, SetCtxParamsFn, UpdateFn,
    };
    [
        entry!(OSSL_FUNC_CIPHER_NEWCTX, newctx::<I>, NewCtxFn),
        entry!(OSSL_FUNC_CIPHER_FREECTX, freectx, FreeCtxFn),
        entry!(OSSL_FUNC_CIPHER_DUPCTX, dupctx, DupCtxFn),
        entry!(OSSL_FUNC_CIPHER_ENCRYPT_INIT, init_entry::<true>, InitFn),
        entry!(OSSL_FUNC_CIPHER_DECRYPT_INIT, init_entry::<false>, InitFn),
        entry!(OSSL_FUNC_CIPHER_UPDATE, update, UpdateFn),
        entry!(OSSL_FUNC_CIPHER_FINAL, final_, FinalFn),
        entry!(OSSL_FUNC_CIPHER_CIPHER, cipher, UpdateFn),
        entry!(OSSL_FUNC_CIPHER_GET_PARAMS, get_params::<I>, GetParamsFn),
        entry!(
            OSSL_FUNC_CIPHER_GETTABLE_PARAMS,
            gettable_params::<I>,
            GettableFn
        ),
        entry!(
            OSSL_FUNC_CIPHER_GET_CTX_PARAMS,
            get_ctx_params,
            GetCtxParamsFn
        ),
        entry!(
            OSSL_FUNC_CIPHER_SET_CTX_PARAMS,
            set_ctx_params,
            SetCtxParamsFn
        ),
        entry!(
            OSSL_FUNC_CIPHER_GETTABLE_CTX_PARAMS,
            gettable_ctx_params::<I>,
            CtxGettableFn
        ),
        entry!(
            OSSL_FUNC_CIPHER_SETTABLE_CTX_PARAMS,
            settable_ctx_params::<I>,
            CtxGettableFn
        ),
        OSSL_DISPATCH {
            function_id: 0,
            function: None,
        },
    ]
}

/// A static dispatch table (OpenSSL only reads it).
pub struct Table(pub [OSSL_DISPATCH; 15]);
// SAFETY: immutable, and its pointers are to functions.
unsafe impl Sync for Table {}

/// Our dispatch tables, one per [`OFFERED`] cipher, in that order.
pub static TABLES: [Table; OFFERED.len()] = [
    Table(table::<0>()),
    Table(table::<1>()),
    Table(table::<2>()),
    Table(table::<3>()),
    Table(table::<4>()),
    Table(table::<5>()),
    Table(table::<6>()),
    Table(table::<7>()),
    Table(table::<8>()),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ctr_counter_carries_across_all_128_bits() {
        let mut iv = [0xffu8; 16];
        iv[0] = 0;
        let next = ctr_add(&iv, 1);
        assert_eq!(next[0], 1);
        assert!(next[1..].iter().all(|&b| b == 0));
        assert_eq!(
            ctr_add(&[0xff; 16], 1),
            [0; 16],
            "wraps as OpenSSL's counter does"
        );
    }
}
