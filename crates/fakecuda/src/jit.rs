//! "JIT": PTX is parsed and validated by the `ptx` crate and decoded by the emulator; the
//! driver's log buffers receive ptxas-format messages. `cuLink*` produces a *fake cubin* (a magic
//! header followed by the PTX text) that `cuModuleLoadDataEx` recognises; real cubins (ELF SASS)
//! and fatbins cannot run on the emulator and are refused with `CUDA_ERROR_NO_BINARY_FOR_GPU`.

use crate::state::{fail, lock, Ctx, Driver, Res, SM_VERSION};
use cudarc::driver::sys::{CUjit_option as J, CUresult};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Arc, Mutex};

/// The first bytes of a fake cubin.
pub(crate) const FAKE_CUBIN_MAGIC: &[u8; 16] = b"\x7fPTXFORGE-FAKE\0\0";

/// A loaded module: the emulator's module (its variables live in the fake's global memory).
pub(crate) struct Module {
    pub ctx: Arc<Ctx>,
    pub loaded: emu::LoadedModule,
    /// Function handles handed out, by name (the driver returns the same handle each time).
    pub funcs: Mutex<HashMap<String, usize>>,
}

/// A kernel handle.
pub(crate) struct Func {
    pub module: Arc<Module>,
    pub prog: Arc<emu::Program>,
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
    pub max_dynamic_shared: AtomicU32,
    pub non_portable_clusters: AtomicBool,
}

/// The JIT options of one call, decoded from the `(option, value)` arrays.
#[derive(Default)]
pub(crate) struct JitOpts {
    info: Option<(usize, usize, usize)>, // (buffer, size, option index)
    error: Option<(usize, usize, usize)>, // (buffer, size, option index)
    /// (number, arch-specific).
    pub target: Option<(u32, bool)>,
    values: usize,
}

impl JitOpts {
    /// # Safety
    /// `keys`/`vals` must be null or hold `n` entries each (as the driver API requires).
    pub unsafe fn parse(n: u32, keys: *const u32, vals: *mut *mut c_void) -> Res<JitOpts> {
        let mut o = JitOpts::default();
        if n == 0 {
            return Ok(o);
        }
        if keys.is_null() || vals.is_null() {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                "JIT option arrays are null".into()
            }));
        }
        o.values = vals as usize;
        let (mut ib, mut is, mut eb, mut es) = (None, None, None, None);
        for i in 0..n as usize {
            // SAFETY: `i < n` entries, per the contract.
            let (k, v) = unsafe { (*keys.add(i), *vals.add(i) as usize) };
            match k {
                k if k == J::CU_JIT_INFO_LOG_BUFFER as u32 => ib = Some(v),
                k if k == J::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES as u32 => is = Some((v, i)),
                k if k == J::CU_JIT_ERROR_LOG_BUFFER as u32 => eb = Some(v),
                k if k == J::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES as u32 => es = Some((v, i)),
                k if k == J::CU_JIT_OPTIMIZATION_LEVEL as u32 && v > 4 => {
                    return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                        format!("CU_JIT_OPTIMIZATION_LEVEL {v} (0..=4)")
                    }));
                }
                k if k == J::CU_JIT_TARGET as u32 => {
                    let (num, arch) = ((v & 0xffff) as u32, v & 0x10000 != 0);
                    if !(30..=120).contains(&num) || v & !0x3ffff != 0 {
                        return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                            format!("CU_JIT_TARGET {v:#x} is not a CUjit_target")
                        }));
                    }
                    o.target = Some((num, arch));
                }
                k if k == J::CU_JIT_MAX_REGISTERS as u32 && (v == 0 || v > 255) => {
                    return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                        format!("CU_JIT_MAX_REGISTERS {v}")
                    }));
                }
                k if k > J::CU_JIT_NUM_OPTIONS as u32 => {
                    return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                        format!("JIT option {k} is not a CUjit_option")
                    }))
                }
                _ => {}
            }
        }
        if let (Some(b), Some((s, i))) = (ib, is) {
            o.info = Some((b, s, i));
        }
        if let (Some(b), Some((s, i))) = (eb, es) {
            o.error = Some((b, s, i));
        }
        Ok(o)
    }

    /// Writes the info log (capped, NUL-terminated) and the filled size back into the option's
    /// value slot, as the driver does.
    pub fn write_info(&self, text: &str) {
        write_log(self.info, self.values, text);
    }
    pub fn write_error(&self, text: &str) {
        write_log(self.error, self.values, text);
    }
}

fn write_log(slot: Option<(usize, usize, usize)>, values: usize, text: &str) {
    let Some((buf, size, idx)) = slot else { return };
    if buf == 0 || size == 0 {
        return;
    }
    let n = text.len().min(size - 1);
    // SAFETY: the caller handed us a log buffer of `size` bytes (the driver API contract) and
    // `values` is its option value array with at least `idx + 1` entries.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf as *mut u8, n);
        *(buf as *mut u8).add(n) = 0;
        *(values as *mut *mut c_void).add(idx) = (n + 1) as *mut c_void;
    }
}

fn ptxas_error(line: u32, msg: &str) -> String {
    format!(
        "ptxas application ptx input, line {line}; error   : {msg}\nptxas fatal   : Ptx assembly aborted due to errors\n"
    )
}

/// Parses, validates and target-checks PTX text as the JIT would; errors are
/// `(code, ptxas-format log)`.
pub(crate) fn check_ptx(text: &str, o: &JitOpts) -> Result<ptx::Module, (CUresult, String)> {
    let m = ptx::parse(text).map_err(|e| {
        (
            CUresult::CUDA_ERROR_INVALID_PTX,
            ptxas_error(e.line, &e.message),
        )
    })?;
    let errs = ptx::validate::validate_errors(&m);
    if !errs.is_empty() {
        let mut log = String::new();
        for e in &errs {
            log += &format!(
                "ptxas application ptx input, line {}; error   : {}\n",
                e.line, e.message
            );
        }
        log += "ptxas fatal   : Ptx assembly aborted due to errors\n";
        return Err((CUresult::CUDA_ERROR_INVALID_PTX, log));
    }
    let arch = m.target.arch.clone();
    let ptx_sm = m.target.sm();
    let ptx_arch_specific = arch.ends_with('a');
    let (tnum, tarch) = o.target.unwrap_or((SM_VERSION, ptx_arch_specific));
    if tnum > SM_VERSION {
        return Err((
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("ptxas fatal   : JIT target sm_{tnum} is newer than this device (sm_{SM_VERSION})\n"),
        ));
    }
    if ptx_sm > tnum {
        return Err((
            CUresult::CUDA_ERROR_INVALID_PTX,
            format!(
                "ptxas fatal   : SM version specified by .target ({arch}) is higher than the JIT target (sm_{tnum})\n"
            ),
        ));
    }
    if ptx_arch_specific && (!tarch || tnum != ptx_sm) {
        return Err((
            CUresult::CUDA_ERROR_INVALID_PTX,
            format!(
                "ptxas fatal   : PTX .target {arch} is architecture-specific; it cannot be compiled for sm_{tnum}{}\n",
                if tarch { "a" } else { "" }
            ),
        ));
    }
    Ok(m)
}

/// The PTX text inside a module image, or why it cannot be loaded.
///
/// # Safety
/// `image` must point to a NUL-terminated string, or to a complete binary image.
pub(crate) unsafe fn image_text(
    image: *const c_void,
) -> Result<(String, bool), (CUresult, String)> {
    let p = image as *const u8;
    // SAFETY: every binary format starts with at least 16 bytes, and a shorter PTX string has its
    // NUL inside them; we stop reading at the first NUL when treating it as text.
    let head = unsafe { std::slice::from_raw_parts(p, 4) };
    if head == b"\x7fELF"
        || head == 0xBA55_ED50u32.to_le_bytes()
        || head == 0x466243B1u32.to_le_bytes()
    {
        return Err((
            CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU,
            "fakecuda: this is a real cubin/fatbin (SASS); the fake driver runs PTX only (load PTX, or a fake cubin from cuLinkComplete)\n".into(),
        ));
    }
    // SAFETY: a NUL-terminated string per the contract (binary images were handled above).
    let is_fake = unsafe { std::slice::from_raw_parts(p, 1) } == &FAKE_CUBIN_MAGIC[..1]
        && unsafe { std::slice::from_raw_parts(p, FAKE_CUBIN_MAGIC.len()) } == FAKE_CUBIN_MAGIC;
    if is_fake {
        // SAFETY: a fake cubin is the magic, a u64 length and that many bytes of PTX.
        unsafe {
            let len = (p.add(16) as *const u64).read_unaligned() as usize;
            let bytes = std::slice::from_raw_parts(p.add(24), len);
            let text = String::from_utf8(bytes.to_vec()).map_err(|_| {
                (
                    CUresult::CUDA_ERROR_INVALID_IMAGE,
                    "corrupt fake cubin\n".into(),
                )
            })?;
            return Ok((text, true));
        }
    }
    // SAFETY: NUL-terminated per the contract.
    let c = unsafe { std::ffi::CStr::from_ptr(image as *const std::ffi::c_char) };
    let text = c.to_str().map_err(|_| {
        (
            CUresult::CUDA_ERROR_INVALID_IMAGE,
            "fakecuda: the image is neither PTX text nor a fake cubin\n".to_string(),
        )
    })?;
    if !text.contains(".version") {
        return Err((
            CUresult::CUDA_ERROR_INVALID_IMAGE,
            "fakecuda: the image is neither PTX text nor a fake cubin\n".into(),
        ));
    }
    Ok((text.to_string(), false))
}

pub(crate) fn fake_cubin(text: &str) -> Vec<u8> {
    let mut v = FAKE_CUBIN_MAGIC.to_vec();
    v.extend_from_slice(&(text.len() as u64).to_le_bytes());
    v.extend_from_slice(text.as_bytes());
    v.push(0);
    v
}

/// Loads a module's PTX into `ctx`: emulator module plus every kernel decoded (decoding errors
/// are reported like JIT errors). Returns the module and the info log.
pub(crate) fn load(
    d: &Driver,
    ctx: Arc<Ctx>,
    m: ptx::Module,
) -> Result<(Module, String), (CUresult, String)> {
    let loaded = emu::LoadedModule::load(&d.mem, m, ctx.dev).map_err(|e| {
        (
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            format!("fakecuda: {e}\n"),
        )
    })?;
    let target = loaded.module.target.arch.clone();
    let mut info = String::new();
    let names: Vec<String> = loaded.module.entries().map(|f| f.name.clone()).collect();
    for name in names {
        let p = loaded.kernel(&name).map_err(|e| {
            let line = match &e {
                emu::EmuError::Unsupported { line, .. } => *line,
                _ => 0,
            };
            (
                CUresult::CUDA_ERROR_NOT_SUPPORTED,
                ptxas_error(
                    line,
                    &format!("fakecuda: the emulator cannot run this kernel: {e}"),
                ),
            )
        })?;
        info += &format!(
            "ptxas info    : Compiling entry function '{name}' for '{target}'\nptxas info    : Function properties for {name}\nptxas info    : Used {} registers, {} bytes smem, {} bytes cmem[0]\n",
            p.nregs.min(255),
            p.static_shared,
            p.param_bytes
        );
    }
    Ok((
        Module {
            ctx,
            loaded,
            funcs: Mutex::new(HashMap::new()),
        },
        info,
    ))
}

/// Frees a module's variables.
pub(crate) fn unload(d: &Driver, m: &Module) {
    for a in &m.loaded.allocations {
        d.mem.free(a.base);
    }
    let ids: Vec<usize> = lock(&m.funcs).values().copied().collect();
    let mut f = lock(&d.funcs);
    for id in ids {
        f.remove(&id);
    }
}

/// A `cuLink*` session.
pub(crate) struct Link {
    pub opts: JitOpts,
    pub ptx: Option<String>,
    pub cubin: Vec<u8>,
}
