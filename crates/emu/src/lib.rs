//! `emu`: a CPU emulator for PTX kernels with SIMT semantics — the default ptxforge backend.
//!
//! Data flow: a [`ptx::Module`] is loaded ([`LoadedModule::load`]): module-scope `.global`/`.const`
//! variables are allocated and initialised, then each kernel is decoded once into a
//! [`program::Program`] (register slots, constant slots, resolved labels, per-instruction
//! semantics). [`launch::launch`] runs a grid of CTAs of warps over host threads; warps execute
//! decoded instructions for all their active lanes at once ([`exec`]), memory goes through
//! [`memory`] (one unified, bounds-checked global address space shared by all emulated devices),
//! and every fault comes back as a typed [`EmuError`] naming kernel, CTA, thread, PTX line and
//! address.

// Lane- and element-indexed loops mirror the SIMT and PTX-spec index arithmetic they implement.
#![allow(clippy::needless_range_loop)]

pub mod alu;
pub mod banks;
pub mod bench;
pub mod clock;
pub mod coverage;
pub mod error;
pub mod exec;
pub mod fp;
mod frag_simd;
pub mod hopper;
pub mod launch;
pub mod limits;
pub mod memory;
pub mod mma;
pub mod mma_any;
pub mod mma_sp;
pub mod mma_volta;
pub mod multicast;
mod park;
pub mod program;
pub mod sanitize;
pub mod tc_numerics;
mod tc_simd;
pub mod tensormap;
pub mod texture;
pub mod wmma;

pub use error::{EmuError, FaultKind, FaultSite};
pub use launch::{launch, LaunchConfig, LaunchOptions, LaunchStats, DEFAULT_STACK_BYTES};
pub use memory::shm::{SegmentId, SegmentSpec};
pub use memory::{Allocation, GlobalMemory, MemMap};
pub use program::Program;
pub use sanitize::{Findings, Report, Tool, Tools};
pub use tc_numerics::Numerics;

/// The values of one register across the 32 lanes of a warp (raw bits, zero-extended).
pub type Lanes = [u64; 32];

use std::collections::HashMap;
use std::sync::Arc;

/// A module loaded into the emulator: its variables live in global memory and its kernels are
/// decoded on first use.
pub struct LoadedModule {
    pub module: ptx::Module,
    pub symbols: HashMap<String, program::SymAddr>,
    /// Allocations that back module-scope variables (kept alive with the module).
    pub allocations: Vec<Arc<Allocation>>,
    kernels: std::sync::Mutex<HashMap<String, Arc<Program>>>,
}

impl LoadedModule {
    /// Loads a module: allocates and initialises its global and const variables.
    pub fn load(
        mem: &GlobalMemory,
        module: ptx::Module,
        device: u32,
    ) -> Result<LoadedModule, EmuError> {
        limits::check_module(&module)?;
        let module = with_source_lines(module);
        let mut symbols = HashMap::new();
        let mut allocations = Vec::new();
        // module-scope variables, then those declared in function bodies (function scope)
        for (key, v) in program::global_variables(&module) {
            let a = alloc_var(mem, &module, &symbols, v, device)?;
            symbols.insert(key, program::SymAddr::Global(a.base));
            allocations.push(a);
        }
        Ok(LoadedModule {
            module,
            symbols,
            allocations,
            kernels: Default::default(),
        })
    }

    /// Binds texture object `desc` to the module-scope `.texref` variable `name` (the
    /// sampler fields of the variable's initialiser, if any, override `desc`'s). Kernels
    /// launched afterwards read it; binding again replaces it.
    pub fn bind_texref(&self, name: &str, desc: &texture::TexDesc) -> Result<(), EmuError> {
        self.bind_ref(name, ptx::Ty::Texref, texture::ObjKind::Texture, desc)
    }

    /// Binds surface object `desc` to the module-scope `.surfref` variable `name`.
    pub fn bind_surfref(&self, name: &str, desc: &texture::TexDesc) -> Result<(), EmuError> {
        self.bind_ref(name, ptx::Ty::Surfref, texture::ObjKind::Surface, desc)
    }

    fn bind_ref(
        &self,
        name: &str,
        ty: ptx::Ty,
        kind: texture::ObjKind,
        desc: &texture::TexDesc,
    ) -> Result<(), EmuError> {
        let bad = |why: String| EmuError::Memory(format!("binding `{name}`: {why}"));
        let v = self
            .module
            .globals()
            .find(|v| v.name == name)
            .filter(|v| v.ty == ty)
            .ok_or_else(|| bad(format!("the module has no .{ty} variable `{name}`")))?;
        if desc.kind != kind {
            return Err(bad(format!("a {:?} descriptor for a .{ty}", desc.kind)));
        }
        let d = texture::apply_ref_fields(desc.clone(), v).map_err(|e| bad(e.to_string()))?;
        let bytes = d.encode().map_err(|e| bad(e.to_string()))?;
        let Some(program::SymAddr::Global(addr)) = self.symbols.get(name) else {
            return Err(bad("not allocated".into()));
        };
        let a = self
            .allocations
            .iter()
            .find(|a| a.base == *addr)
            .ok_or_else(|| bad("not allocated".into()))?;
        a.write_bytes(0, &bytes);
        Ok(())
    }

    /// The decoded kernel (decoded once, then cached).
    pub fn kernel(&self, name: &str) -> Result<Arc<Program>, EmuError> {
        let mut g = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = g.get(name) {
            return Ok(p.clone());
        }
        let p = Arc::new(program::decode(&self.module, name, &self.symbols)?);
        g.insert(name.to_string(), p.clone());
        Ok(p)
    }
}

/// Allocates and initialises one `.global`/`.const` variable (zeros where no initialiser is
/// given). Initialisers may name variables allocated before it (`generic(v)` is the same
/// address: global memory is the generic window's base) and device functions (their
/// addresses, for tables of function pointers).
fn alloc_var(
    mem: &GlobalMemory,
    module: &ptx::Module,
    symbols: &HashMap<String, program::SymAddr>,
    v: &ptx::VarDecl,
    device: u32,
) -> Result<Arc<Allocation>, EmuError> {
    if let Some(slot) = texture::ref_slot(v).map_err(|e| EmuError::Decode {
        kernel: v.name.clone(),
        msg: e.to_string(),
    })? {
        // a .texref/.surfref/.samplerref: one descriptor slot (texture.rs)
        let a = mem.alloc(slot.len() as u64, device)?;
        a.write_bytes(0, &slot);
        a.mark_written(0, slot.len() as u64);
        return Ok(a);
    }
    let size = v.size_bytes().max(1);
    let a = mem.alloc(size, device)?;
    if let Some(init) = &v.init {
        let esz = v.ty.size() as usize;
        let mut bytes = Vec::with_capacity(init.len() * esz);
        for x in init {
            let bits: u64 = match x {
                ptx::Init::Int(i) => *i as u64,
                ptx::Init::F32(b) => *b as u64,
                ptx::Init::F64(b) => *b,
                ptx::Init::Sym { name, offset, .. } => {
                    let base = match symbols.get(name) {
                        Some(program::SymAddr::Global(addr)) => Some(*addr),
                        _ => program::function_address(module, name),
                    };
                    base.ok_or_else(|| EmuError::Decode {
                        kernel: v.name.clone(),
                        msg: format!("initialiser refers to unknown symbol `{name}`"),
                    })?
                    .wrapping_add(*offset as u64)
                }
                ptx::Init::Field { name, .. } => {
                    return Err(EmuError::Decode {
                        kernel: v.name.clone(),
                        msg: format!("field initialiser `{name}` on a .{} variable", v.ty),
                    })
                }
            };
            bytes.extend_from_slice(&bits.to_le_bytes()[..esz.min(8)]);
        }
        bytes.truncate(size as usize);
        a.write_bytes(0, &bytes);
    }
    // module variables are initialised (zeros when no initialiser is given)
    a.mark_written(0, size);
    Ok(a)
}

/// Sanitizer reports name PTX lines, which a module built in-process (the kernel library) does
/// not have: when the process sanitizes by default, such a module is printed and parsed back,
/// so its lines are those of `ptx::print` (what `ptxforge emit` shows). Otherwise, or if the
/// text does not parse back, the module is used as it is.
fn with_source_lines(module: ptx::Module) -> ptx::Module {
    if !sanitize::process_default().any() || module.functions().any(|f| f.loc.line != 0) {
        return module;
    }
    ptx::parse(&ptx::print(&module)).unwrap_or(module)
}
