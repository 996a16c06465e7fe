//! `transpose_f32`: `out [cols, rows] = x [rows, cols]^T`, f32 to f32 (exact). The optimizer
//! step quantises W^T of the FP8 MLP weights on the device from it: a 128x128 block of W^T
//! is a block of W transposed (same amax, same scale, the same elements rounded), so
//! quantising the transposed FP32 master gives W's FP8 bytes and scales transposed, bit for
//! bit. Thread per output element (coalesced writes).

use super::*;
use crate::host::{check_target, function};
use crate::reference as r;
use rand::Rng;
use runtime::{args, LaunchConfig};
use std::time::Instant;

pub const TRANSPOSE_F32_NAME: &str = "transpose_f32";

/// Params (x, out, rows, cols); grid ceil(rows*cols/256) x 256.
pub fn gen_transpose_f32(t: &Target) -> Result<ptx::Module> {
    check_target(TRANSPOSE_F32_NAME, t, TRAIN_TARGETS)?;
    super::ops::transpose_kernel::<f32>(t, TRANSPOSE_F32_NAME, |k, x, out, src, dst| {
        let v = k.ld_nc(x.offset(src));
        k.st(out.offset(dst), v);
    })
}

/// `out [cols, rows] = x [rows, cols]^T` (f32, exact).
pub fn transpose_f32(
    stream: &Stream,
    x: &Buffer<f32>,
    out: &mut Buffer<f32>,
    rows: usize,
    cols: usize,
) -> Result<()> {
    let name = TRANSPOSE_F32_NAME;
    let n = rows.saturating_mul(cols);
    need(name, "x", x, n)?;
    need(name, "out", out, n)?;
    fits_u32(name, n)?;
    if n == 0 {
        return Ok(());
    }
    let f = function(stream.device(), name, "", gen_transpose_f32)?;
    let a = args![x, &*out, rows as u32, cols as u32];
    stream.launch(&f, &LaunchConfig::linear(n.div_ceil(256) as u32, 256), &a)?;
    Ok(())
}

/// Random `[rows, cols]` f32 (NaN-poisoned output) against the host transpose, bit for bit.
pub fn check_transpose_f32(
    stream: &Stream,
    rows: usize,
    cols: usize,
    seed: u64,
) -> Result<OpCheck> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let x: Vec<f32> = (0..rows * cols)
        .map(|_| rg.gen_range(-2.0f32..2.0))
        .collect();
    let xb = dev.upload(&x)?;
    let mut out = poisoned(&dev, rows * cols, f32::NAN)?;
    let t0 = Instant::now();
    transpose_f32(stream, &xb, &mut out, rows, cols)?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let got = out.to_vec()?;
    let mut c = OpCheck::default();
    for rr in 0..rows {
        for cc in 0..cols {
            let (g, w) = (got[cc * rows + rr], x[rr * cols + cc]);
            c.bound(f64::from(g), f64::from(w), 0.0);
        }
    }
    Ok(c.finish(stream, seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposes_exactly_on_the_emulator() {
        let st = Device::emu(0).stream(0);
        for (r, c) in [(37, 24), (128, 256), (1, 5)] {
            let k = check_transpose_f32(&st, r, c, 9).unwrap();
            assert_eq!(k.mismatches, 0, "{r}x{c}: {k:?}");
        }
    }
}
