//! Small helpers shared by the kernels of this crate: access to the shared module cache,
//! the sigmoid both the kernel and the CPU reference compute bit-identically, and launch helpers.

use crate::Result;
use builder::{ApproxFn, FMods, KernelBuilder, Reg, Target};
use runtime::{Device, Function};

/// `log2(e)` as f32 (the constant the sigmoid kernel multiplies by).
pub const LOG2E: f32 = std::f32::consts::LOG2_E;

/// The loaded kernel `name` for `config` on `dev` from the module cache shared with `kernels`
/// ([`runtime::module_cache`]), generated with `gen` on a miss.
pub fn function(
    dev: &Device,
    name: &str,
    config: &str,
    gen: impl FnOnce(&Target) -> Result<ptx::Module>,
) -> Result<Function> {
    runtime::module_cache::function(dev, name, config, |arch| gen(&Target::new(arch)))
}

/// `s = 1 / (1 + 2^(x * -log2 e))` with `mul.rn`, `ex2.approx` (no ftz), `add.rn`, `div.rn`.
pub fn sigmoid(k: &mut KernelBuilder, x: Reg<f32>) -> Reg<f32> {
    let t = k.mul_m(FMods::rn(), x, -LOG2E);
    let e = k.approx(ApproxFn::Ex2, false, t);
    let d = k.add_m(FMods::rn(), e, 1.0f32);
    k.div(1.0f32, d)
}

/// CPU twin of [`sigmoid`] (the emulator computes `ex2.approx` as `exp2` in f64 rounded once).
pub fn sigmoid_ref(x: f32) -> f32 {
    let t = x * -LOG2E;
    let e = (t as f64).exp2() as f32;
    1.0 / (e + 1.0)
}

/// A u64 register holding `base + off` (byte address arithmetic).
pub fn badd(k: &mut KernelBuilder, base: Reg<u64>, off: Reg<u64>) -> Reg<u64> {
    k.add(base, off)
}

/// `a * b` widened to u64 (`mul.wide.u32`).
pub fn wide(k: &mut KernelBuilder, a: Reg<u32>, b: u32) -> Reg<u64> {
    k.mul_wide(a, b)
}
