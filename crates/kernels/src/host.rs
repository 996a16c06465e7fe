//! Host-side plumbing shared by every host function: the target a device compiles for, and
//! access to the module cache keyed by (kernel, target, config, device) so a shape's kernel is
//! generated and loaded once (the cache itself is [`runtime::module_cache`], shared with `ep`).

use crate::{KernelError, Result};
use builder::Target;
use runtime::{Device, Function};

/// The target kernels are generated for on `dev` ([`runtime::module_cache::arch_for`]: the
/// compute capability, with the arch-specific `a` suffix on sm_90; the emulator: sm_90a).
pub fn target_for(dev: &Device) -> Target {
    Target::new(&runtime::module_cache::arch_for(dev))
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

/// The loaded entry for `(kernel name, target, config)` on `dev` from the shared module cache
/// ([`runtime::module_cache`]), generating the module with `gen` on a miss.
pub fn function(
    dev: &Device,
    name: &str,
    config: &str,
    gen: impl FnOnce(&Target) -> Result<ptx::Module>,
) -> Result<Function> {
    runtime::module_cache::function(dev, name, config, |arch| gen(&Target::new(arch)))
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
