//! Module loading: PTX through the driver JIT (with error logs mapped to PTX lines), cubins, and
//! an on-disk cubin cache keyed by a hash of PTX + target + options + driver.

use super::green::GreenCtx;
use super::{check, err_text, CUresult, Ctx};
use crate::LaunchConfig;
use crate::{Result, RuntimeError};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Options for compiling PTX on a device (the emulator ignores them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct JitOptions {
    /// `CU_JIT_MAX_REGISTERS`.
    pub max_registers: Option<u32>,
    /// `CU_JIT_OPTIMIZATION_LEVEL` (0-4; the driver's default is 4).
    pub opt_level: Option<u32>,
    /// `CU_JIT_TARGET`, e.g. `"sm_90a"` (default: the device's own target).
    pub target: Option<String>,
    /// `CU_JIT_GENERATE_LINE_INFO`.
    pub line_info: bool,
    /// Use the on-disk cubin cache (`$PTXFORGE_CACHE`, default `~/.cache/ptxforge`); `None`
    /// follows the environment (`PTXFORGE_CACHE=off` disables it).
    pub cache: Option<bool>,
}

const LOG_BYTES: usize = 64 * 1024;

/// `sm_90a` -> the `CUjit_target` value (90 + 0x10000 for arch-specific targets).
fn jit_target(t: &str) -> Result<usize> {
    let s = t
        .trim()
        .trim_start_matches("sm_")
        .trim_start_matches("compute_");
    let (num, accel) = match s.strip_suffix('a') {
        Some(n) => (n, true),
        None => (s.strip_suffix('f').unwrap_or(s), false),
    };
    let n: usize = num
        .parse()
        .map_err(|_| RuntimeError::Cuda(format!("JIT target `{t}`: expected sm_XY or sm_XYa")))?;
    Ok(n + if accel { 0x10000 } else { 0 })
}

/// The `.target` of PTX text (`sm_90a` in `.target sm_90a` or `.target sm_90a, debug`).
pub(crate) fn ptx_target(text: &str) -> Option<&str> {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or("").trim())
        .find_map(|l| l.strip_prefix(".target"))
        .and_then(|rest| rest.split([',', ' ', '\t']).find(|t| !t.is_empty()))
}

/// The JIT options a module is compiled with: `opts`, plus `CU_JIT_TARGET` = the PTX's own
/// architecture-specific target (`sm_90a`) when none is given and it matches the device.
/// Without an explicit target the JIT compiles for the context's target (`sm_90` on a
/// CC 9.0 device), and `sm_90a`-only instructions (`wgmma`, `setmaxnreg`) in PTX that declares
/// `.target sm_90a` are then at the mercy of the driver's inference.
pub(crate) fn effective_jit_options(opts: &JitOptions, ptx: &str, sm_version: u32) -> JitOptions {
    let mut o = opts.clone();
    if o.target.is_none() {
        if let Some(t) = ptx_target(ptx) {
            let arch_specific = t
                .strip_prefix("sm_")
                .and_then(|v| v.strip_suffix('a'))
                .and_then(|v| v.parse::<u32>().ok());
            if arch_specific == Some(sm_version) {
                o.target = Some(t.to_string());
            }
        }
    }
    o
}

/// JIT option arrays; the log buffers must outlive the driver call they are passed to.
struct JitArgs {
    keys: Vec<sys::CUjit_option>,
    vals: Vec<*mut c_void>,
    info: Vec<u8>,
    error: Vec<u8>,
}

impl JitArgs {
    fn new(o: &JitOptions) -> Result<Box<JitArgs>> {
        use sys::CUjit_option as J;
        let mut a = Box::new(JitArgs {
            keys: Vec::new(),
            vals: Vec::new(),
            info: vec![0; LOG_BYTES],
            error: vec![0; LOG_BYTES],
        });
        let info = a.info.as_mut_ptr() as *mut c_void;
        let error = a.error.as_mut_ptr() as *mut c_void;
        let mut push = |k: J, v: usize| {
            a.keys.push(k);
            a.vals.push(v as *mut c_void);
        };
        push(J::CU_JIT_INFO_LOG_BUFFER, info as usize);
        push(J::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, LOG_BYTES - 1);
        push(J::CU_JIT_ERROR_LOG_BUFFER, error as usize);
        push(J::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, LOG_BYTES - 1);
        push(J::CU_JIT_LOG_VERBOSE, 1);
        if let Some(r) = o.max_registers {
            push(J::CU_JIT_MAX_REGISTERS, r as usize);
        }
        if let Some(l) = o.opt_level {
            push(J::CU_JIT_OPTIMIZATION_LEVEL, l.min(4) as usize);
        }
        if let Some(t) = &o.target {
            push(J::CU_JIT_TARGET, jit_target(t)?);
        }
        if o.line_info {
            push(J::CU_JIT_GENERATE_LINE_INFO, 1);
        }
        Ok(a)
    }
    fn log(buf: &[u8]) -> String {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).trim().to_string()
    }
    fn info_log(&self) -> String {
        JitArgs::log(&self.info)
    }
    fn error_log(&self) -> String {
        JitArgs::log(&self.error)
    }
}

/// Formats a JIT failure: each ptxas error with its PTX line and source text, else the raw log.
pub(crate) fn format_jit_error(what: &str, code: &str, log: &str, ptx_text: &str) -> String {
    use ptx::ptxas::Severity;
    let diags = ptx::ptxas::parse_diagnostics(log, ptx_text);
    let errs: Vec<_> = diags
        .iter()
        .filter(|d| matches!(d.severity, Severity::Error | Severity::Fatal))
        .collect();
    let mut msg = format!("{what} failed with {code}");
    for d in &errs {
        match d.line {
            Some(l) => {
                msg += &format!("\n  PTX line {l}: {}", d.message);
                if let Some(src) = &d.source_line {
                    msg += &format!("\n    {l:>5} | {src}");
                }
            }
            None => msg += &format!("\n  {}", d.message),
        }
    }
    if errs.is_empty() {
        if log.trim().is_empty() {
            msg += " (the JIT wrote no log)";
        } else {
            msg += &format!("\n  JIT log:\n{}", log.trim());
        }
    }
    msg
}

fn jit_error(what: &str, r: CUresult, log: &str, ptx_text: &str) -> RuntimeError {
    RuntimeError::Cuda(format_jit_error(what, &err_text(r), log, ptx_text))
}

/// 128-bit FNV-1a (stable across builds and platforms, unlike `DefaultHasher`).
pub(crate) fn fnv128(parts: &[&[u8]]) -> u128 {
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    let mut h: u128 = 0x6c62272e07bb014262b821756295c58d;
    for p in parts {
        for &b in (p.len() as u64).to_le_bytes().iter().chain(p.iter()) {
            h ^= b as u128;
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

/// The cubin cache directory, or None when disabled.
pub(crate) fn cache_dir() -> Option<PathBuf> {
    match std::env::var("PTXFORGE_CACHE") {
        Ok(v) if matches!(v.as_str(), "off" | "0" | "none" | "") => None,
        Ok(v) => Some(PathBuf::from(v)),
        Err(_) => {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(base.join("ptxforge"))
        }
    }
}

/// The cache file for `ptx` compiled with `opts` for a device of `sm_version` under `driver`.
pub(crate) fn cache_key(ptx: &str, sm_version: u32, driver: i32, opts: &JitOptions) -> String {
    let o = format!("{opts:?}");
    let h = fnv128(&[
        b"ptxforge-cubin-v1",
        &sm_version.to_le_bytes(),
        &driver.to_le_bytes(),
        o.as_bytes(),
        ptx.as_bytes(),
    ]);
    format!("{h:032x}.cubin")
}

/// A module: its image (cubin, or PTX text when not cached), loaded lazily into each context
/// (the primary one, and green contexts of partitions) that launches from it.
pub(crate) struct CuModule {
    dev: Arc<Ctx>,
    image: Vec<u8>,
    is_ptx: bool,
    ptx_text: String,
    opts: JitOptions,
    /// (context, module) pairs; green contexts are kept alive until their module is unloaded.
    loaded: Mutex<Vec<Loaded>>,
    funcs: Mutex<HashMap<(usize, String), usize>>,
    /// Per function handle: (static shared bytes, dynamic shared limit set so far, whether
    /// non-portable cluster sizes were allowed).
    launch_attrs: Mutex<HashMap<usize, FuncAttrs>>,
    /// JIT info log (register/shared usage) of the compilation, when there was one.
    pub info_log: String,
    pub from_cache: bool,
}

struct Loaded {
    ctx: usize,
    module: usize,
    _green: Option<Arc<GreenCtx>>,
}

#[derive(Clone, Copy, Default)]
struct FuncAttrs {
    static_shared: u32,
    dynamic_limit: u32,
    non_portable_clusters: bool,
}

/// Without opting in, a CTA may use at most this much shared memory (static + dynamic).
const DEFAULT_SHARED_LIMIT: u32 = 48 * 1024;
/// Cluster sizes above this need `CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`.
const PORTABLE_CLUSTER_SIZE: u32 = 8;

/// Whether a launch with `dynamic` bytes of dynamic shared memory on a kernel with
/// `static_shared` bytes of static shared memory needs `MAX_DYNAMIC_SHARED_SIZE_BYTES` raised
/// (to `dynamic`) above the current `limit`: the default limit is 48 KiB minus the static size,
/// so the opt-in is needed whenever the total exceeds 48 KiB.
pub(crate) fn needs_dynamic_shared_optin(static_shared: u32, dynamic: u32, limit: u32) -> bool {
    static_shared as u64 + dynamic as u64 > DEFAULT_SHARED_LIMIT as u64 && dynamic > limit
}

impl CuModule {
    /// Compiles PTX text (through the cubin cache when enabled) and loads it in the device's
    /// primary context.
    pub fn load_ptx(
        dev: &Arc<Ctx>,
        sm_version: u32,
        text: &str,
        opts: &JitOptions,
    ) -> Result<CuModule> {
        let use_cache = opts.cache.unwrap_or(true);
        let dir = if use_cache { cache_dir() } else { None };
        let jit = effective_jit_options(opts, text, sm_version);
        let mut m = CuModule {
            dev: dev.clone(),
            image: Vec::new(),
            is_ptx: false,
            ptx_text: text.to_string(),
            opts: jit.clone(),
            loaded: Mutex::new(Vec::new()),
            funcs: Mutex::new(HashMap::new()),
            launch_attrs: Mutex::new(HashMap::new()),
            info_log: String::new(),
            from_cache: false,
        };
        match &dir {
            Some(dir) => {
                let path = dir.join(cache_key(text, sm_version, dev.driver_version, opts));
                if let Ok(bytes) = std::fs::read(&path) {
                    m.image = bytes;
                    m.from_cache = true;
                } else {
                    let (cubin, info) = link_ptx(dev, text, &jit)?;
                    m.image = cubin;
                    m.info_log = info;
                    // Best effort: a read-only cache only costs a recompile next time.
                    if std::fs::create_dir_all(dir).is_ok() {
                        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
                        if std::fs::write(&tmp, &m.image).is_ok() {
                            let _ = std::fs::rename(&tmp, &path);
                        }
                    }
                }
            }
            None => {
                let mut img = text.as_bytes().to_vec();
                img.push(0);
                m.image = img;
                m.is_ptx = true;
            }
        }
        let info = match m.load_in(dev.ctx, None) {
            // A cached cubin the driver cannot load (written by another driver build, a
            // different GPU of the same compute capability, or truncated): recompile from the PTX
            // and replace it, instead of failing on every run until someone clears the cache.
            Err(e) if m.from_cache => {
                let (cubin, info) = link_ptx(dev, text, &jit).map_err(|e2| {
                    RuntimeError::Cuda(format!("{e2} (after the cached cubin failed: {e})"))
                })?;
                m.image = cubin;
                m.info_log = info;
                m.from_cache = false;
                if let Some(dir) = &dir {
                    let path = dir.join(cache_key(text, sm_version, dev.driver_version, opts));
                    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
                    if std::fs::write(&tmp, &m.image).is_ok() {
                        let _ = std::fs::rename(&tmp, &path);
                    }
                }
                m.load_in(dev.ctx, None)?
            }
            r => r?,
        };
        if m.info_log.is_empty() {
            m.info_log = info;
        }
        Ok(m)
    }

    /// Loads a cubin (e.g. assembled offline with `ptx::ptxas::assemble`).
    pub fn load_cubin(dev: &Arc<Ctx>, cubin: &[u8]) -> Result<CuModule> {
        let m = CuModule {
            dev: dev.clone(),
            image: cubin.to_vec(),
            is_ptx: false,
            ptx_text: String::new(),
            opts: JitOptions::default(),
            loaded: Mutex::new(Vec::new()),
            funcs: Mutex::new(HashMap::new()),
            launch_attrs: Mutex::new(HashMap::new()),
            info_log: String::new(),
            from_cache: false,
        };
        m.load_in(dev.ctx, None)?;
        Ok(m)
    }

    /// `cuModuleLoadDataEx` of the image in `ctx` (`green` is the green context `ctx` views, if
    /// any: held until the module is unloaded); returns the JIT info log.
    fn load_in(&self, ctx: sys::CUcontext, green: Option<&Arc<GreenCtx>>) -> Result<String> {
        // SAFETY: `ctx` is the device's primary context or a live green context (`green`).
        check(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")?;
        let mut a = JitArgs::new(&self.opts)?;
        let mut module = std::ptr::null_mut();
        let (n, keys, vals) = if self.is_ptx {
            (
                a.keys.len() as u32,
                a.keys.as_mut_ptr(),
                a.vals.as_mut_ptr(),
            )
        } else {
            (0, std::ptr::null_mut(), std::ptr::null_mut())
        };
        // SAFETY: the image is a NUL-terminated PTX string or a complete cubin owned by self; the
        // option arrays have `n` entries and the log buffers they point to live in `a`.
        let r = unsafe {
            sys::cuModuleLoadDataEx(
                &mut module,
                self.image.as_ptr() as *const c_void,
                n,
                keys,
                vals,
            )
        };
        if r != CUresult::CUDA_SUCCESS {
            let what = if self.is_ptx {
                "PTX JIT (cuModuleLoadDataEx)"
            } else {
                "cubin load (cuModuleLoadDataEx)"
            };
            return Err(jit_error(what, r, &a.error_log(), &self.ptx_text));
        }
        self.loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Loaded {
                ctx: ctx as usize,
                module: module as usize,
                _green: green.cloned(),
            });
        Ok(a.info_log())
    }

    /// The kernel `name` as loaded in `ctx` (loading the module there on first use; `green` is
    /// the green context `ctx` belongs to, if any).
    pub fn function(
        &self,
        ctx: sys::CUcontext,
        green: Option<&Arc<GreenCtx>>,
        name: &str,
    ) -> Result<sys::CUfunction> {
        let key = (ctx as usize, name.to_string());
        // Held throughout, so two threads do not load the module twice into one context.
        let mut funcs = self.funcs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&f) = funcs.get(&key) {
            return Ok(f as sys::CUfunction);
        }
        let find = |l: &Vec<Loaded>| l.iter().find(|x| x.ctx == ctx as usize).map(|x| x.module);
        let loaded = find(&self.loaded.lock().unwrap_or_else(|p| p.into_inner()));
        let m = match loaded {
            Some(m) => m,
            None => {
                self.load_in(ctx, green)?;
                find(&self.loaded.lock().unwrap_or_else(|p| p.into_inner()))
                    .ok_or_else(|| RuntimeError::Cuda("module load did not register".into()))?
            }
        };
        let cname = CString::new(name)
            .map_err(|_| RuntimeError::Launch("kernel name contains NUL".into()))?;
        let mut f = std::ptr::null_mut();
        // SAFETY: `ctx` is live; `m` is a module loaded in it; out-pointer to a local;
        // NUL-terminated name.
        check(
            unsafe {
                check(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent")?;
                sys::cuModuleGetFunction(&mut f, m as sys::CUmodule, cname.as_ptr())
            },
            &format!("cuModuleGetFunction(`{name}`)"),
        )?;
        funcs.insert(key, f as usize);
        Ok(f)
    }

    /// Function attributes a launch of `f` with `cfg` needs, set once per function (the context
    /// of `f` must be current): `MAX_DYNAMIC_SHARED_SIZE_BYTES` when static + dynamic shared
    /// memory exceeds 48 KiB (raised only, so concurrent launches with different sizes never
    /// lower it under each other), and `NON_PORTABLE_CLUSTER_SIZE_ALLOWED` for clusters of more
    /// than 8 CTAs.
    pub fn prepare_launch(&self, f: sys::CUfunction, cfg: &LaunchConfig) -> Result<()> {
        let cluster: u64 = cfg.cluster.iter().map(|&c| c as u64).product();
        let non_portable = cluster > PORTABLE_CLUSTER_SIZE as u64;
        if cfg.shared_bytes == 0 && !non_portable {
            return Ok(());
        }
        let mut attrs = self.launch_attrs.lock().unwrap_or_else(|p| p.into_inner());
        let a = match attrs.get(&(f as usize)) {
            Some(a) => *a,
            None => {
                let mut v = 0;
                // SAFETY: live function handle; out-pointer to a local.
                check(
                    unsafe {
                        sys::cuFuncGetAttribute(
                            &mut v,
                            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                            f,
                        )
                    },
                    "cuFuncGetAttribute(SHARED_SIZE_BYTES)",
                )?;
                FuncAttrs {
                    static_shared: v.max(0) as u32,
                    dynamic_limit: DEFAULT_SHARED_LIMIT.saturating_sub(v.max(0) as u32),
                    non_portable_clusters: false,
                }
            }
        };
        let mut a2 = a;
        if needs_dynamic_shared_optin(a.static_shared, cfg.shared_bytes, a.dynamic_limit) {
            // SAFETY: live function handle of the current context.
            check(
                unsafe {
                    sys::cuFuncSetAttribute(
                        f,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        cfg.shared_bytes as i32,
                    )
                },
                &format!(
                    "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES = {} + {} static)",
                    cfg.shared_bytes, a.static_shared
                ),
            )?;
            a2.dynamic_limit = cfg.shared_bytes;
        }
        if non_portable && !a.non_portable_clusters {
            // SAFETY: as above.
            check(
                unsafe {
                    sys::cuFuncSetAttribute(
                        f,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                        1,
                    )
                },
                "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)",
            )?;
            a2.non_portable_clusters = true;
        }
        attrs.insert(f as usize, a2);
        Ok(())
    }
}

impl Drop for CuModule {
    fn drop(&mut self) {
        for l in self
            .loaded
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            // SAFETY: unloads modules this object loaded, each once, with their context current;
            // a green context is still alive (its Arc in `l` is dropped after this loop).
            unsafe {
                if sys::cuCtxSetCurrent(l.ctx as sys::CUcontext) == CUresult::CUDA_SUCCESS {
                    sys::cuModuleUnload(l.module as sys::CUmodule);
                }
            }
        }
        let _ = self.dev.bind();
    }
}

/// Compiles PTX to a cubin with the driver's linker (`cuLinkCreate`/`AddData`/`Complete`).
fn link_ptx(dev: &Ctx, text: &str, opts: &JitOptions) -> Result<(Vec<u8>, String)> {
    dev.bind()?;
    let mut a = JitArgs::new(opts)?;
    let src = CString::new(text)
        .map_err(|_| RuntimeError::Cuda("PTX text contains a NUL byte".into()))?;
    let name = CString::new("module.ptx").unwrap_or_default();
    let mut state = std::ptr::null_mut();
    // SAFETY: the option arrays have matching lengths; log buffers live in `a` until destroy.
    check(
        unsafe {
            sys::cuLinkCreate_v2(
                a.keys.len() as u32,
                a.keys.as_mut_ptr(),
                a.vals.as_mut_ptr(),
                &mut state,
            )
        },
        "cuLinkCreate",
    )?;
    let bytes = src.as_bytes_with_nul();
    // SAFETY: `state` is live; the PTX buffer is NUL-terminated and `bytes.len()` long.
    let r = unsafe {
        sys::cuLinkAddData_v2(
            state,
            sys::CUjitInputType::CU_JIT_INPUT_PTX,
            bytes.as_ptr() as *mut c_void,
            bytes.len(),
            name.as_ptr(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    let result = if r != CUresult::CUDA_SUCCESS {
        Err(jit_error(
            "PTX JIT (cuLinkAddData)",
            r,
            &a.error_log(),
            text,
        ))
    } else {
        let mut cubin = std::ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: `state` is live; out-pointers to locals.
        let r = unsafe { sys::cuLinkComplete(state, &mut cubin, &mut size) };
        if r != CUresult::CUDA_SUCCESS || cubin.is_null() {
            Err(jit_error(
                "PTX link (cuLinkComplete)",
                r,
                &a.error_log(),
                text,
            ))
        } else {
            // SAFETY: the driver owns `size` bytes at `cubin` until cuLinkDestroy; we copy them.
            Ok((
                unsafe { std::slice::from_raw_parts(cubin as *const u8, size) }.to_vec(),
                a.info_log(),
            ))
        }
    };
    // SAFETY: destroys the link state created above, exactly once.
    unsafe {
        sys::cuLinkDestroy(state);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jit_log_maps_to_ptx_lines() {
        let ptx = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n    bogus.u32 %r1, 1;\n    ret;\n}\n";
        let log = "ptxas application ptx input, line 6; error   : Unknown instruction 'bogus'\nptxas fatal   : Ptx assembly aborted due to errors";
        let m = format_jit_error("PTX JIT", "CUDA_ERROR_INVALID_PTX", log, ptx);
        assert!(m.contains("PTX line 6: Unknown instruction 'bogus'"), "{m}");
        assert!(m.contains("| bogus.u32 %r1, 1;"), "{m}");
        assert!(m.contains("CUDA_ERROR_INVALID_PTX"), "{m}");
        let raw = format_jit_error("PTX JIT", "CUDA_ERROR_INVALID_PTX", "something odd", ptx);
        assert!(raw.contains("something odd"), "{raw}");
    }

    #[test]
    fn cache_keys_depend_on_everything() {
        let o = JitOptions::default();
        let k = cache_key("ptx", 90, 12080, &o);
        assert_eq!(k, cache_key("ptx", 90, 12080, &o));
        assert_ne!(k, cache_key("ptx2", 90, 12080, &o));
        assert_ne!(k, cache_key("ptx", 80, 12080, &o));
        assert_ne!(k, cache_key("ptx", 90, 12090, &o));
        assert_ne!(
            k,
            cache_key(
                "ptx",
                90,
                12080,
                &JitOptions {
                    max_registers: Some(64),
                    ..o.clone()
                }
            )
        );
        assert!(k.ends_with(".cubin") && k.len() == 32 + 6);
    }

    #[test]
    fn jit_targets() {
        assert_eq!(jit_target("sm_90a").unwrap(), 0x10000 + 90);
        assert_eq!(
            jit_target("sm_90a").unwrap(),
            sys::CUjit_target::CU_TARGET_COMPUTE_90A as usize
        );
        assert_eq!(
            jit_target("sm_90").unwrap(),
            sys::CUjit_target::CU_TARGET_COMPUTE_90 as usize
        );
        assert_eq!(jit_target("sm_80").unwrap(), 80);
        assert!(jit_target("hopper").is_err());
    }

    #[test]
    fn jit_option_arrays_pass_values_by_value_and_logs_by_pointer() {
        use sys::CUjit_option as J;
        let a = JitArgs::new(&JitOptions {
            max_registers: Some(128),
            opt_level: Some(9),
            target: Some("sm_90a".into()),
            line_info: true,
            cache: None,
        })
        .unwrap();
        assert_eq!(a.keys.len(), a.vals.len());
        let val = |k: J| {
            let i = a.keys.iter().position(|&x| x == k).expect("option present");
            a.vals[i] as usize
        };
        // Log buffers: pointers into the owned buffers, sizes leave room for the NUL.
        assert_eq!(val(J::CU_JIT_INFO_LOG_BUFFER), a.info.as_ptr() as usize);
        assert_eq!(val(J::CU_JIT_ERROR_LOG_BUFFER), a.error.as_ptr() as usize);
        assert_eq!(val(J::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES), LOG_BYTES - 1);
        assert_eq!(val(J::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES), LOG_BYTES - 1);
        assert!(a.info.len() >= LOG_BYTES && a.error.len() >= LOG_BYTES);
        // Scalars travel in the pointer slot itself.
        assert_eq!(val(J::CU_JIT_MAX_REGISTERS), 128);
        assert_eq!(val(J::CU_JIT_OPTIMIZATION_LEVEL), 4);
        assert_eq!(
            val(J::CU_JIT_TARGET),
            sys::CUjit_target::CU_TARGET_COMPUTE_90A as usize
        );
        assert_eq!(val(J::CU_JIT_GENERATE_LINE_INFO), 1);
        // Without options only the log plumbing is passed.
        let d = JitArgs::new(&JitOptions::default()).unwrap();
        assert_eq!(d.keys.len(), 5);
        assert!(!d.keys.contains(&J::CU_JIT_TARGET));
        assert!(JitArgs::new(&JitOptions {
            target: Some("volta".into()),
            ..Default::default()
        })
        .is_err());
    }

    #[test]
    fn arch_specific_ptx_gets_an_explicit_jit_target() {
        let ptx = "// generated\n.version 8.0\n.target sm_90a // wgmma\n.address_size 64\n";
        assert_eq!(ptx_target(ptx), Some("sm_90a"));
        assert_eq!(
            ptx_target(".version 8.0\n.target sm_80, debug\n"),
            Some("sm_80")
        );
        assert_eq!(ptx_target(".version 8.0\n"), None);
        let o = JitOptions::default();
        assert_eq!(
            effective_jit_options(&o, ptx, 90).target.as_deref(),
            Some("sm_90a")
        );
        // Another device, a portable target, or an explicit choice: left alone.
        assert_eq!(effective_jit_options(&o, ptx, 100).target, None);
        assert_eq!(
            effective_jit_options(&o, ".target sm_90\n", 90).target,
            None
        );
        let explicit = JitOptions {
            target: Some("sm_90".into()),
            ..Default::default()
        };
        assert_eq!(
            effective_jit_options(&explicit, ptx, 90).target.as_deref(),
            Some("sm_90")
        );
    }

    #[test]
    fn dynamic_shared_optin_rule() {
        // Under 48 KiB in total: no opt-in.
        assert!(!needs_dynamic_shared_optin(0, 48 * 1024, 48 * 1024));
        assert!(!needs_dynamic_shared_optin(16 * 1024, 32 * 1024, 32 * 1024));
        // Over 48 KiB in total, even with dynamic below 48 KiB (static shared counts).
        assert!(needs_dynamic_shared_optin(0, 48 * 1024 + 1, 48 * 1024));
        assert!(needs_dynamic_shared_optin(40 * 1024, 16 * 1024, 8 * 1024));
        // Already raised at least that far: nothing to do (the limit only grows).
        assert!(!needs_dynamic_shared_optin(0, 100 * 1024, 200 * 1024));
    }
}
