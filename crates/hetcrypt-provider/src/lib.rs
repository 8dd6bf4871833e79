//! hetcrypt as an OpenSSL 3/4 provider: AES-CBC/CTR/GCM calls of unmodified programs,
//! each run in-line on the calling thread or on a crypto module's lane.
//!
//! Load it with `openssl ... -provider-path target/release -provider hetcrypt
//! -provider default`, or for every program through `openssl.cnf` (see
//! `docs/provider.md`). It offers the default provider's names with the property
//! `provider=hetcrypt`; what it does not offer falls back to the default provider.
//!
//! Layout: [`inner`] reaches the default provider (the CPU path), [`cipher`] is the
//! cipher operation, [`route`] the module and the counters, [`core`] the upcalls.

/// A dispatch entry from a typed function: the one place a function pointer is cast
/// to OpenSSL's generic `void (*)(void)` (both dispatch tables use it).
macro_rules! entry {
    ($id:expr, $f:expr, $t:ty) => {
        OSSL_DISPATCH {
            function_id: $id as c_int,
            // SAFETY: OpenSSL calls the function with the signature its id implies,
            // which is `$t`.
            function: Some(unsafe { std::mem::transmute::<$t, unsafe extern "C" fn()>($f) }),
        }
    };
}

pub mod cipher;
pub mod core;
pub mod inner;
pub mod load;
pub mod params;
pub mod route;

use std::ffi::{c_int, c_void, CStr};
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::sync::Mutex;

use openssl_provider_forge::bindings::{
    OSSL_ALGORITHM, OSSL_CORE_HANDLE, OSSL_DISPATCH, OSSL_FUNC_PROVIDER_GETTABLE_PARAMS,
    OSSL_FUNC_PROVIDER_GET_PARAMS, OSSL_FUNC_PROVIDER_GET_REASON_STRINGS,
    OSSL_FUNC_PROVIDER_QUERY_OPERATION, OSSL_FUNC_PROVIDER_TEARDOWN, OSSL_ITEM, OSSL_OP_CIPHER,
    OSSL_PARAM, OSSL_PARAM_INTEGER, OSSL_PARAM_UTF8_PTR, OSSL_PARAM_UTF8_STRING,
};

use crate::core::{Core, Reason, REASONS};
use crate::inner::{Inner, InnerCipher, OFFERED};
use crate::params::{defn, ParamList};
use crate::route::{Config, Router, CONFIG_KEYS};

/// The property every algorithm of ours carries.
const PROPERTIES: &CStr = c"provider=hetcrypt";
/// The provider's name in `openssl list -providers`.
const NAME: &CStr = c"hetcrypt";
/// This build's version.
const VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => c"?",
    };

/// Everything one loaded provider instance holds.
pub struct Provider {
    core: Core,
    inner: Inner,
    router: Router,
    config: Config,
    /// The algorithm list `query_operation` returns (names point into libcrypto).
    algorithms: Vec<OSSL_ALGORITHM>,
}

// SAFETY: the algorithm list is read-only after construction and points to static
// strings and tables; the rest is Send + Sync on its own.
unsafe impl Send for Provider {}
// SAFETY: as above.
unsafe impl Sync for Provider {}

impl Provider {
    /// The default provider's implementation of offered cipher `i` (present: we only
    /// offer what it has).
    pub fn inner_cipher(&self, i: usize) -> &InnerCipher {
        self.inner.ciphers[i]
            .as_ref()
            .expect("only ciphers the default provider has are offered")
    }

    /// The counters and routing summary, one line.
    pub fn summary(&self) -> String {
        self.router.summary(self.config.mode)
    }
}

/// Every loaded instance, oldest first, as `Arc::into_raw` addresses that each own
/// one count: the entry points that get no context (algorithm-level parameters) and
/// the report of a caught panic use the newest. A list, not one pointer: a process can
/// load us into several library contexts, and unloading the newest must leave the
/// others answering (with one pointer, a fetch in one context failed with "cache
/// constants failed" while another context was being torn down).
static LIVE: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// The list of live instances (a panic while it was held poisons nothing it guards:
/// every change is one push or one removal).
fn live() -> std::sync::MutexGuard<'static, Vec<usize>> {
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The newest loaded instance, if one is loaded.
pub fn global() -> Option<Arc<Provider>> {
    let list = live();
    let p = *list.last()? as *const Provider;
    // SAFETY: LIVE holds pointers from `Arc::into_raw` that own one count until
    // teardown removes them (under the same lock); we add a count for the caller.
    unsafe {
        Arc::increment_strong_count(p);
        Some(Arc::from_raw(p))
    }
}

/// The instance behind a provider context.
///
/// # Safety
/// `provctx` is what our `OSSL_provider_init` returned (or NULL).
pub unsafe fn provider_from(provctx: *mut c_void) -> Option<Arc<Provider>> {
    let p = provctx as *const Provider;
    if p.is_null() {
        return None;
    }
    // SAFETY: the provider context is an `Arc::into_raw` pointer alive until teardown.
    unsafe {
        Arc::increment_strong_count(p);
        Some(Arc::from_raw(p))
    }
}

/// Raises an error through the current instance's core, if any.
pub fn raise_global(reason: Reason, detail: &str, func: &CStr) {
    if let Some(p) = global() {
        p.core.raise(reason, detail, func);
    }
}

unsafe extern "C" fn teardown(provctx: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if provctx.is_null() {
            return;
        }
        let p = provctx as *const Provider;
        let listed = {
            let mut list = live();
            let at = list.iter().position(|&q| q == p as usize);
            at.map(|i| list.remove(i)).is_some()
        };
        if listed {
            // SAFETY: LIVE's own count for this instance, just taken out of it.
            unsafe { Arc::decrement_strong_count(p) };
        }
        // SAFETY: the count `OSSL_provider_init` handed out with the context.
        let prov = unsafe { Arc::from_raw(p) };
        write_stats(&prov);
    }));
}

/// Writes the one-line summary where `stats` (or `HETCRYPT_PROVIDER_STATS`) says.
fn write_stats(prov: &Provider) {
    let Some(dest) = prov.config.stats.as_deref() else {
        return;
    };
    let mut line = prov.summary();
    if std::env::var_os("HETCRYPT_PROVIDER_TRACE").is_some() {
        line.push('\n');
        line.push_str(prov.router.trace().trim_end());
    }
    if dest == "-" {
        eprintln!("{line}");
    } else if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dest)
    {
        let _ = writeln!(f, "{line}");
    }
}

static GETTABLE: ParamList<8> = ParamList([
    defn(c"name", OSSL_PARAM_UTF8_PTR),
    defn(c"version", OSSL_PARAM_UTF8_PTR),
    defn(c"buildinfo", OSSL_PARAM_UTF8_PTR),
    defn(c"status", OSSL_PARAM_INTEGER),
    defn(c"hetcrypt-policy", OSSL_PARAM_UTF8_PTR),
    defn(c"hetcrypt-module", OSSL_PARAM_UTF8_STRING),
    defn(c"hetcrypt-stats", OSSL_PARAM_UTF8_STRING),
    params::END,
]);

unsafe extern "C" fn gettable_params(_provctx: *mut c_void) -> *const OSSL_PARAM {
    GETTABLE.as_ptr()
}

unsafe extern "C" fn get_params(provctx: *mut c_void, list: *mut OSSL_PARAM) -> c_int {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: our provider context.
        let Some(prov) = (unsafe { provider_from(provctx) }) else {
            return 0;
        };
        // SAFETY: OpenSSL's terminated list.
        unsafe {
            let mut ok = true;
            if let Some(p) = params::locate(list, c"name") {
                ok &= params::set_utf8(p, NAME);
            }
            if let Some(p) = params::locate(list, c"version") {
                ok &= params::set_utf8(p, VERSION);
            }
            if let Some(p) = params::locate(list, c"buildinfo") {
                ok &= params::set_utf8(p, c"hetcrypt provider over the default provider's AES");
            }
            if let Some(p) = params::locate(list, c"status") {
                ok &= params::set_u64(p, 1);
            }
            if let Some(p) = params::locate(list, c"hetcrypt-policy") {
                let name: &'static CStr = match prov.config.mode.name() {
                    "cpu" => c"cpu",
                    "module" => c"module",
                    _ => c"balanced",
                };
                ok &= params::set_utf8(p, name);
            }
            if let Some(p) = params::locate(list, c"hetcrypt-module") {
                let text = match (&prov.router.module, &prov.router.no_module) {
                    (Some(m), _) => m.name.clone(),
                    (None, Some(why)) => why.clone(),
                    (None, None) => "none".into(),
                };
                ok &= params::set_text(p, text.as_bytes());
            }
            if let Some(p) = params::locate(list, c"hetcrypt-stats") {
                ok &= params::set_text(p, prov.summary().as_bytes());
            }
            i32::from(ok)
        }
    }))
    .unwrap_or(0)
}

unsafe extern "C" fn query_operation(
    provctx: *mut c_void,
    op: c_int,
    no_cache: *mut c_int,
) -> *const OSSL_ALGORITHM {
    catch_unwind(AssertUnwindSafe(|| {
        if !no_cache.is_null() {
            // SAFETY: OpenSSL's flag slot.
            unsafe { *no_cache = 0 };
        }
        if op != OSSL_OP_CIPHER as c_int || provctx.is_null() {
            return std::ptr::null();
        }
        // SAFETY: our provider context, alive until teardown (as the list is).
        let prov = unsafe { &*(provctx as *const Provider) };
        prov.algorithms.as_ptr()
    }))
    .unwrap_or(std::ptr::null())
}

/// The reason strings, as the OSSL_ITEM array OpenSSL asks for.
struct Items([OSSL_ITEM; REASONS.len() + 1]);
// SAFETY: immutable, pointing to static strings.
unsafe impl Sync for Items {}

static REASON_ITEMS: Items = {
    let mut items = [OSSL_ITEM {
        id: 0,
        ptr: std::ptr::null_mut(),
    }; REASONS.len() + 1];
    let mut i = 0;
    while i < REASONS.len() {
        items[i] = OSSL_ITEM {
            id: REASONS[i].0,
            ptr: REASONS[i].1.as_ptr() as *mut c_void,
        };
        i += 1;
    }
    Items(items)
};

unsafe extern "C" fn get_reason_strings(_provctx: *mut c_void) -> *const OSSL_ITEM {
    REASON_ITEMS.0.as_ptr()
}

/// A static dispatch table.
struct Dispatch([OSSL_DISPATCH; 7]);
// SAFETY: immutable, pointing to functions.
unsafe impl Sync for Dispatch {}

type TeardownFn = unsafe extern "C" fn(*mut c_void);
type GettableFn = unsafe extern "C" fn(*mut c_void) -> *const OSSL_PARAM;
type GetParamsFn = unsafe extern "C" fn(*mut c_void, *mut OSSL_PARAM) -> c_int;
type QueryFn = unsafe extern "C" fn(*mut c_void, c_int, *mut c_int) -> *const OSSL_ALGORITHM;
type ReasonsFn = unsafe extern "C" fn(*mut c_void) -> *const OSSL_ITEM;

static PROVIDER_DISPATCH: Dispatch = Dispatch([
    entry!(OSSL_FUNC_PROVIDER_TEARDOWN, teardown, TeardownFn),
    entry!(
        OSSL_FUNC_PROVIDER_GETTABLE_PARAMS,
        gettable_params,
        GettableFn
    ),
    entry!(OSSL_FUNC_PROVIDER_GET_PARAMS, get_params, GetParamsFn),
    entry!(OSSL_FUNC_PROVIDER_QUERY_OPERATION, query_operation, QueryFn),
    entry!(
        OSSL_FUNC_PROVIDER_GET_REASON_STRINGS,
        get_reason_strings,
        ReasonsFn
    ),
    OSSL_DISPATCH {
        function_id: 0,
        function: None,
    },
    OSSL_DISPATCH {
        function_id: 0,
        function: None,
    },
]);

/// Builds one provider instance.
fn build(core: Core) -> Result<Provider, (Core, String)> {
    let keys: Vec<&'static CStr> = CONFIG_KEYS.iter().map(|(k, _)| *k).collect();
    let cnf = core.config(&keys);
    let config = match Config::from_values(&cnf, |v| std::env::var(v).ok()) {
        Ok(c) => c,
        Err(e) => return Err((core, e)),
    };
    let inner = match Inner::open() {
        Ok(i) => i,
        Err(e) => return Err((core, e)),
    };
    let mut algorithms: Vec<OSSL_ALGORITHM> = OFFERED
        .iter()
        .enumerate()
        .filter_map(|(i, _)| {
            inner.ciphers[i].as_ref().map(|c| OSSL_ALGORITHM {
                algorithm_names: c.names,
                property_definition: PROPERTIES.as_ptr(),
                implementation: cipher::TABLES[i].0.as_ptr(),
                algorithm_description: std::ptr::null(),
            })
        })
        .collect();
    algorithms.push(OSSL_ALGORITHM::END);
    let router = Router::new(&config);
    Ok(Provider {
        core,
        inner,
        router,
        config,
        algorithms,
    })
}

/// The entry point OpenSSL looks up when it loads the module.
///
/// # Safety
/// Called by OpenSSL with its handle, its dispatch table and two out-pointers.
#[no_mangle]
pub unsafe extern "C" fn OSSL_provider_init(
    handle: *const OSSL_CORE_HANDLE,
    input: *const OSSL_DISPATCH,
    out: *mut *const OSSL_DISPATCH,
    provctx: *mut *mut c_void,
) -> c_int {
    catch_unwind(AssertUnwindSafe(|| {
        if out.is_null() || provctx.is_null() {
            return 0;
        }
        // SAFETY: the core's table, as OpenSSL passes it.
        let core = unsafe { Core::new(handle, input) };
        let prov = match build(core) {
            Ok(p) => Arc::new(p),
            Err((core, why)) => {
                core.raise(Reason::InitFailed, &why, c"OSSL_provider_init");
                return 0;
            }
        };
        let raw = Arc::into_raw(prov);
        // One count for the provider context, one for LIVE.
        // SAFETY: `raw` came from `Arc::into_raw` just above.
        unsafe { Arc::increment_strong_count(raw) };
        live().push(raw as usize);
        // SAFETY: OpenSSL's out-pointers.
        unsafe {
            *out = PROVIDER_DISPATCH.0.as_ptr();
            *provctx = raw as *mut c_void;
        }
        1
    }))
    .unwrap_or(0)
}
