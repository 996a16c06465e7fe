//! libnccl loaded at run time: the entry points this crate calls, resolved once.
//!
//! Not through cudarc's NCCL bindings: their loader looks for `libnccl.so` and
//! `libnccl.so.<CUDA major>` and panics when a symbol is missing, while NCCL installs
//! `libnccl.so.2` (the `.so` link only comes with the development package); and turning on
//! cudarc's `nccl` feature would change the cudarc build every other crate of the workspace
//! shares (a second build of the whole CUDA chain in CI). The few C types needed are declared
//! here from `nccl.h`. Functions are resolved from `libnccl.so`, `libnccl.so.2` or
//! `PTXFORGE_NCCL_LIB`; anything missing is [`NcclError::NcclUnavailable`].

use crate::{NcclError, Result};
use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

/// `ncclComm_t`.
pub(crate) type NcclComm = *mut c_void;
/// `ncclDataType_t` / `ncclRedOp_t` values (C enums, passed as int).
pub(crate) type NcclDataType = c_int;
pub(crate) type NcclRedOp = c_int;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
pub(crate) struct NcclUniqueId {
    pub internal: [c_char; 128],
}

type Stream = *mut c_void;

/// `ncclResult_t` of a call still running on a non-blocking communicator.
pub(crate) const IN_PROGRESS: c_int = 7;

/// `ncclConfig_t` as NCCL 2.14 laid it out (the first version with configs). NCCL reads a
/// config's `size` and `version` and copies only that much, so this older layout is accepted by
/// every later version; every attribute left out keeps NCCL's default. Only `blocking` is set.
#[repr(C)]
pub(crate) struct NcclConfig {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub blocking: c_int,
    pub cga_cluster_size: c_int,
    pub min_ctas: c_int,
    pub max_ctas: c_int,
    pub net_name: *const c_char,
}

impl NcclConfig {
    /// `NCCL_CONFIG_INITIALIZER` of NCCL 2.14 with `blocking` set.
    pub fn new(blocking: bool) -> NcclConfig {
        const UNDEF: c_int = c_int::MIN; // NCCL_CONFIG_UNDEF_INT
        NcclConfig {
            size: std::mem::size_of::<NcclConfig>(),
            magic: 0xcafe_beef,
            version: 21400, // NCCL_VERSION(2, 14, 0)
            blocking: c_int::from(blocking),
            cga_cluster_size: UNDEF,
            min_ctas: UNDEF,
            max_ctas: UNDEF,
            net_name: std::ptr::null(),
        }
    }
}

/// The resolved entry points (return values are raw `ncclResult_t` codes).
pub(crate) struct Api {
    pub path: String,
    pub get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    pub get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    pub get_last_error: Option<unsafe extern "C" fn(NcclComm) -> *const c_char>,
    pub get_unique_id: unsafe extern "C" fn(*mut NcclUniqueId) -> c_int,
    pub comm_init_rank: unsafe extern "C" fn(*mut NcclComm, c_int, NcclUniqueId, c_int) -> c_int,
    /// `ncclCommInitRankConfig` (NCCL 2.14+): non-blocking communicators.
    pub comm_init_rank_config: Option<
        unsafe extern "C" fn(*mut NcclComm, c_int, NcclUniqueId, c_int, *mut NcclConfig) -> c_int,
    >,
    pub comm_destroy: unsafe extern "C" fn(NcclComm) -> c_int,
    pub comm_abort: unsafe extern "C" fn(NcclComm) -> c_int,
    pub comm_get_async_error: unsafe extern "C" fn(NcclComm, *mut c_int) -> c_int,
    pub group_start: unsafe extern "C" fn() -> c_int,
    pub group_end: unsafe extern "C" fn() -> c_int,
    pub send:
        unsafe extern "C" fn(*const c_void, usize, NcclDataType, c_int, NcclComm, Stream) -> c_int,
    pub recv:
        unsafe extern "C" fn(*mut c_void, usize, NcclDataType, c_int, NcclComm, Stream) -> c_int,
    pub all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        NcclDataType,
        NcclRedOp,
        NcclComm,
        Stream,
    ) -> c_int,
    pub reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        NcclDataType,
        NcclRedOp,
        NcclComm,
        Stream,
    ) -> c_int,
    pub all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        NcclDataType,
        NcclComm,
        Stream,
    ) -> c_int,
    /// `ncclGetVersion` at load time (e.g. 22703 for 2.27.3).
    pub version: i32,
}

/// The library, loaded on first use; the error is kept and returned to every later caller.
pub(crate) fn api() -> Result<&'static Api> {
    static A: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    A.get_or_init(load)
        .as_ref()
        .map_err(|e| NcclError::NcclUnavailable(e.clone()))
}

fn candidates() -> Vec<String> {
    match std::env::var("PTXFORGE_NCCL_LIB") {
        Ok(p) if !p.is_empty() => vec![p],
        _ => vec!["libnccl.so".into(), "libnccl.so.2".into()],
    }
}

fn load() -> std::result::Result<Api, String> {
    if std::env::var_os("PTXFORGE_NO_NCCL").is_some_and(|v| !v.is_empty() && v != "0") {
        return Err("disabled by PTXFORGE_NO_NCCL".into());
    }
    let names = candidates();
    let (path, lib) = names
        .iter()
        .find_map(|n| {
            // SAFETY: dlopen of a library by name; its initialisers are NCCL's own.
            unsafe { libloading::Library::new(n) }
                .ok()
                .map(|l| (n.clone(), l))
        })
        .ok_or_else(|| {
            format!(
                "libnccl not found (tried {}; install NCCL, or set LD_LIBRARY_PATH or \
                 PTXFORGE_NCCL_LIB)",
                names.join(", ")
            )
        })?;
    // The library stays loaded for the process's lifetime: the function pointers point into it.
    let lib: &'static libloading::Library = Box::leak(Box::new(lib));
    resolve(lib, path)
}

/// Resolves every entry point of [`Api`] in `lib`.
fn resolve(lib: &'static libloading::Library, path: String) -> std::result::Result<Api, String> {
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol's type is NCCL's C prototype for $name (nccl.h).
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{path} lacks {}: {e}", $name))?
        };
    }
    let mut api = Api {
        get_version: sym!("ncclGetVersion"),
        get_error_string: sym!("ncclGetErrorString"),
        // SAFETY: as in sym!; optional (NCCL 2.13+).
        get_last_error: unsafe { lib.get(b"ncclGetLastError\0") }.ok().map(|s| *s),
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank: sym!("ncclCommInitRank"),
        // SAFETY: as in sym!; optional (NCCL 2.14+).
        comm_init_rank_config: unsafe { lib.get(b"ncclCommInitRankConfig\0") }
            .ok()
            .map(|s| *s),
        comm_destroy: sym!("ncclCommDestroy"),
        comm_abort: sym!("ncclCommAbort"),
        comm_get_async_error: sym!("ncclCommGetAsyncError"),
        group_start: sym!("ncclGroupStart"),
        group_end: sym!("ncclGroupEnd"),
        send: sym!("ncclSend"),
        recv: sym!("ncclRecv"),
        all_reduce: sym!("ncclAllReduce"),
        reduce_scatter: sym!("ncclReduceScatter"),
        all_gather: sym!("ncclAllGather"),
        version: 0,
        path,
    };
    let mut v = 0;
    // SAFETY: out-pointer to a local.
    let r = unsafe { (api.get_version)(&mut v) };
    if r != 0 {
        return Err(format!("ncclGetVersion failed with code {r}"));
    }
    api.version = v;
    Ok(api)
}

impl Api {
    /// Turns a result code of `call` into `Ok` or [`NcclError::Call`] with NCCL's own texts.
    pub fn check(&self, call: &'static str, code: c_int, comm: NcclComm) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        Err(self.call_error(call, code, comm))
    }

    /// [`NcclError::Call`] for `code` of `call`: NCCL's text for the code and its last error.
    pub fn call_error(&self, call: &'static str, code: c_int, comm: NcclComm) -> NcclError {
        let text = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: NCCL returns NUL-terminated strings that live at least until the next
                // call on this thread.
                unsafe { std::ffi::CStr::from_ptr(p) }
                    .to_string_lossy()
                    .into_owned()
            }
        };
        // SAFETY: takes a plain code.
        let name = text(unsafe { (self.get_error_string)(code) });
        // SAFETY: the communicator is ours or null (allowed).
        let detail = self
            .get_last_error
            .map(|f| text(unsafe { f(comm) }))
            .unwrap_or_default();
        NcclError::Call {
            call,
            code,
            name,
            detail,
        }
    }
}
