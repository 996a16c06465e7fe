//! Host-side plumbing shared by every wrapper: the target a device compiles for, and the module
//! cache keyed by (kernel, target, config, device) so a shape's kernel is generated and loaded once.

use crate::{KernelError, Result};
use builder::Target;
use runtime::{Device, Function, Module};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// The target kernels are generated for on `dev` (emulator: sm_90a; CUDA: its compute capability,
/// with the arch-specific `a` suffix on sm_90).
pub fn target_for(dev: &Device) -> Target {
    match dev.props().sm_version {
        90 => Target::sm90a(),
        v => Target::new(&format!("sm_{v}")),
    }
}

/// Checks `t` against a kernel's supported architectures.
pub fn check_target(kernel: &str, t: &Target, supported: &[&str]) -> Result<()> {
    if supported.contains(&t.arch.as_str()) {
        Ok(())
    } else {
        Err(KernelError::Target {
            kernel: kernel.into(),
            arch: t.arch.clone(),
            supported: supported.join(", "),
        })
    }
}

type Key = (String, String, String, u32, bool);

fn cache() -> &'static Mutex<HashMap<Key, Function>> {
    static C: OnceLock<Mutex<HashMap<Key, Function>>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The loaded entry `name` for `(kernel name, target, config)` on `dev`, generating the module
/// with `gen` on a miss.
pub fn function(
    dev: &Device,
    name: &str,
    config: &str,
    gen: impl FnOnce(&Target) -> Result<ptx::Module>,
) -> Result<Function> {
    let t = target_for(dev);
    let key: Key = (
        name.to_string(),
        t.arch.clone(),
        config.to_string(),
        dev.index(),
        dev.backend() == runtime::Backend::Emu,
    );
    if let Some(f) = cache().lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(f.clone());
    }
    let m = gen(&t)?;
    let module = Module::load(dev, &m)?;
    let entry = m
        .entries()
        .next()
        .map(|f| f.name.clone())
        .unwrap_or_else(|| name.to_string());
    let f = module.function(&entry)?;
    cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, f.clone());
    Ok(f)
}

/// `t` with the PTX ISA version FP8 conversions need on sm_89 (8.1; the builder's opcode table
/// only knows the sm_90 requirement) when no version is fixed.
pub fn fp8_ptx(t: &Target) -> Target {
    if t.sm() == 89 && t.ptx.is_none() {
        t.clone().with_ptx(81)
    } else {
        t.clone()
    }
}
