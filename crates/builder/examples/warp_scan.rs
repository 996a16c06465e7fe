//! Warp scan: the inclusive prefix sum of each warp's 32 values with `shfl.sync.up`
//! (Kogge-Stone: 5 steps, lane `l` adds the value of lane `l - d` when `l >= d`).
//!
//! `cargo run --example warp_scan -p builder`. Exits nonzero on a mismatch.

use builder::*;
use runtime::{Device, LaunchConfig};
use std::error::Error;

/// The kernel's signature: its parameter types, in order.
type WarpScan = TypedKernel<(GlobalPtr<u32>, GlobalPtr<u32>)>;

/// `out[i] = sum(x[w*32 ..= i])` for warp `w = i / 32`; launch exactly `n` threads
/// (`n` a multiple of 32).
fn warp_scan(t: Target) -> Result<WarpScan, BuildError> {
    let k = KernelBuilder::new("warp_scan", t).typed();
    let (k, x) = k.param::<GlobalPtr<u32>>("x");
    let (mut k, out) = k.param::<GlobalPtr<u32>>("out");
    let i = k.global_index_x();
    let lane = k.lane_id();
    let v = k.ld(x.offset(i));
    k.unroll(5, |k, s| {
        let d = 1u32 << s;
        let up = k.shfl_up(v, d); // every lane shuffles: the mask is full
        let take = k.ge(lane, d);
        k.when(take, |k| k.add_to(v, v, up));
    });
    k.st(out.offset(i), v);
    k.finish()
}

pub fn main() -> Result<(), Box<dyn Error>> {
    let n = 32 * 24usize;
    let xs: Vec<u32> = (0..n as u32)
        .map(|i| i.wrapping_mul(2654435761) >> 22)
        .collect();

    let dev = Device::emu(0);
    let f = dev.load_kernel(&warp_scan(Target::sm80())?)?;
    let x_buf = dev.upload(&xs)?;
    let out = dev.upload(&vec![u32::MAX; n])?; // poisoned
    let stream = dev.stream(0);
    stream.launch_typed(
        &f,
        &LaunchConfig::linear((n / 128) as u32, 128),
        (&x_buf, &out),
    )?;
    let got = stream.read(&out)?;

    let mut acc = 0u64;
    for i in 0..n {
        acc = if i % 32 == 0 { 0 } else { acc } + xs[i] as u64;
        if got[i] as u64 != acc {
            return Err(format!("out[{i}] = {}, expected {acc}", got[i]).into());
        }
    }
    println!("warp_scan: {} warps scanned correctly", n / 32);
    Ok(())
}
