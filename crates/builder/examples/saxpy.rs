//! `y = a*x + y` on the default device, launched through the typed API.
//!
//! `cargo run --example saxpy -p builder` (emulator; `PTXFORGE_DEVICE=cuda` for a GPU).
//! Exits nonzero when the result differs from the f64 host reference.

use builder::*;
use runtime::{Device, LaunchConfig};
use std::error::Error;

/// The kernel's signature: its parameter types, in order.
type Saxpy = TypedKernel<(GlobalPtr<f32>, GlobalPtr<f32>, f32, u32)>;

/// The kernel: one thread per element, `y[i] = fma(a, x[i], y[i])` for `i < n`.
fn saxpy(t: Target) -> Result<Saxpy, BuildError> {
    let k = KernelBuilder::new("saxpy", t).typed();
    let (k, x) = k.param::<GlobalPtr<f32>>("x");
    let (k, y) = k.param::<GlobalPtr<f32>>("y");
    let (k, a) = k.param::<f32>("a");
    let (mut k, n) = k.param::<u32>("n");
    let i = k.global_index_x();
    let inside = k.lt(i, n);
    k.if_(inside, |k| {
        let xi = k.ld(x.offset(i));
        let yi = k.ld(y.offset(i));
        let r = k.fma(a, xi, yi);
        k.st(y.offset(i), r);
    });
    k.finish()
}

/// `emu` (default) or the device named by `PTXFORGE_DEVICE` (`cuda`, `cuda:1`, `emu:3`).
fn device() -> runtime::Result<Device> {
    Device::from_name(&std::env::var("PTXFORGE_DEVICE").unwrap_or_else(|_| "emu".into()))
}

pub fn main() -> Result<(), Box<dyn Error>> {
    let n = 10_000usize;
    // Host data: a simple deterministic pattern (no RNG dependency in the example).
    let xs: Vec<f32> = (0..n)
        .map(|i| ((i * 37) % 101) as f32 * 0.25 - 12.0)
        .collect();
    let ys: Vec<f32> = (0..n)
        .map(|i| ((i * 53) % 97) as f32 * 0.5 - 24.0)
        .collect();
    let a = 1.75f32;

    let dev = device()?;
    let kernel = saxpy(Target::sm80())?; // sm_80 PTX runs on the emulator and any GPU >= sm_80
    let f = dev.load_kernel(&kernel)?; // load the module, look the kernel up, check its signature
    let (x_buf, y_buf) = (dev.upload(&xs)?, dev.upload(&ys)?);
    let stream = dev.default_stream();
    let cfg = LaunchConfig::linear(n.div_ceil(256) as u32, 256);
    // Arguments are type-checked against (GlobalPtr<f32>, GlobalPtr<f32>, f32, u32).
    stream.launch_typed(&f, &cfg, (&x_buf, &y_buf, a, n as u32))?;
    let got = stream.read(&y_buf)?; // waits for the stream; launch errors surface here

    for i in 0..n {
        let want = a as f64 * xs[i] as f64 + ys[i] as f64;
        if (got[i] as f64 - want).abs() > 1e-5 * want.abs().max(1.0) {
            return Err(format!("y[{i}] = {}, expected {want}", got[i]).into());
        }
    }
    println!("saxpy: {n} elements match the host reference");
    Ok(())
}
