//! Calling the library's FP8 GEMM from Rust: `D[m, n] = A[m, k] x B[n, k]^T` with e4m3 inputs
//! and DeepSeek-V3 fine-grained scales (A: one per 1x128, B: one per 128x128 block), BF16 out.
//!
//! `cargo run --example fp8_gemm -p kernels`. Exits nonzero when D differs from the f64 host
//! reference by more than BF16 rounding allows.

use half::bf16;
use kernels::reference::{dequant_blocks_f64, dequant_rows_f64, gemm_nt_f64, rel_fro, rng};
use kernels::{GemmBufs, GemmProblem, InTy, Resolved};
use rand::Rng;
use runtime::Device;
use std::error::Error;

/// A random finite e4m3 byte with magnitude in [2^-3, 2^3) (exponent field 4..=9).
fn e4m3(r: &mut impl Rng) -> u8 {
    let sign = if r.gen::<bool>() { 0x80 } else { 0 };
    sign | (r.gen_range(4u8..=9) << 3) | r.gen_range(0u8..8)
}

pub fn main() -> Result<(), Box<dyn Error>> {
    let (m, n, k) = (128usize, 128usize, 256usize);
    let mut r = rng(7);
    let a: Vec<u8> = (0..m * k).map(|_| e4m3(&mut r)).collect();
    let b: Vec<u8> = (0..n * k).map(|_| e4m3(&mut r)).collect();
    let sa: Vec<f32> = (0..m * k / 128).map(|_| r.gen_range(0.01..0.1)).collect();
    let sb: Vec<f32> = (0..n.div_ceil(128) * k / 128)
        .map(|_| r.gen_range(0.01..0.1))
        .collect();

    let stream = Device::emu(0).default_stream();
    let dev = stream.device();
    let (a_buf, b_buf) = (dev.upload(&a)?, dev.upload(&b)?);
    let (sa_buf, sb_buf) = (dev.upload(&sa)?, dev.upload(&sb)?);
    let d = dev.upload(&vec![bf16::NAN; m * n])?; // poisoned: every element must be written

    // `Auto` picks the kernel: on an sm_90a device (the emulator is one) the Hopper wgmma
    // kernel, which synchronises the stream before returning; elsewhere the mma.sync kernel,
    // which returns after enqueueing. The result says which ran.
    let problem = GemmProblem::new(InTy::Fp8, m, n, k);
    let run = kernels::gemm(
        &stream,
        &problem,
        GemmBufs::new(&a_buf, &b_buf, &d).scales(&sa_buf, &sb_buf),
    )?;
    println!(
        "ran {} ({}), synchronised: {}",
        run.kernel,
        run.config(),
        run.synchronised
    );
    if matches!(run.resolved, Resolved::Wgmma(_)) != run.synchronised {
        return Err("the Hopper kernel (and only it) synchronises the stream".into());
    }
    let got: Vec<f64> = stream.read(&d)?.iter().map(|v| v.to_f64()).collect();

    let want = gemm_nt_f64(
        &dequant_rows_f64(&a, &sa, m, k),
        &dequant_blocks_f64(&b, &sb, n, k),
        m,
        n,
        k,
    );
    let err = rel_fro(&got, &want);
    if err.is_nan() || err >= 1e-2 {
        return Err(format!("D differs from the reference: relative error {err:e}").into());
    }
    println!("fp8_gemm: {m}x{n}x{k} matches the f64 reference (relative error {err:.2e})");
    Ok(())
}
