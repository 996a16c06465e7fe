//! The process-wide cache of loaded kernel modules that every kernel-owning crate (`kernels`,
//! `ep`) goes through: a generated kernel is built and loaded once per
//! (kernel name, target architecture, configuration key, device) and its [`Function`] reused.

use crate::{Backend, Device, Function, Module, RuntimeError};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// (kernel name, architecture, configuration key, device index, emulated device).
type Key = (String, String, String, u32, bool);

fn cache() -> &'static Mutex<HashMap<Key, Function>> {
    static C: OnceLock<Mutex<HashMap<Key, Function>>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The architecture kernels are generated for on `dev`: its compute capability, with the
/// arch-specific `a` suffix on sm_90 (`wgmma`, `setmaxnreg`); the emulator reports sm_90.
pub fn arch_for(dev: &Device) -> String {
    match dev.props().sm_version {
        90 => "sm_90a".to_string(),
        v => format!("sm_{v}"),
    }
}

/// The loaded entry of kernel `name` for configuration `config` on `dev`. On a miss, `gen`
/// builds the module for the architecture [`arch_for`] gives; it is loaded and its entry
/// `name` is taken (the module's first entry when none has that name: generators that put
/// the configuration in the entry name).
pub fn function<E: From<RuntimeError>>(
    dev: &Device,
    name: &str,
    config: &str,
    gen: impl FnOnce(&str) -> Result<ptx::Module, E>,
) -> Result<Function, E> {
    let arch = arch_for(dev);
    let key: Key = (
        name.to_string(),
        arch.clone(),
        config.to_string(),
        dev.index(),
        dev.backend() == Backend::Emu,
    );
    if let Some(f) = cache().lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(f.clone());
    }
    let m = gen(&arch)?;
    let module = Module::load(dev, &m)?;
    let entry = if m.entries().any(|f| f.name == name) {
        name.to_string()
    } else {
        m.entries()
            .next()
            .map(|f| f.name.clone())
            .unwrap_or_else(|| name.to_string())
    };
    let f = module.function(&entry)?;
    cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, f.clone());
    Ok(f)
}
