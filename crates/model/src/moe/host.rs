//! Host-side numerics shared by the layer (weight quantisation) and the f64 reference (the
//! device path's roundings modelled on the CPU).

use half::bf16;
use kernels::ScaleMode;

/// 128x128 block FP8 quantisation of `w` `[rows, cols]` with power-of-two scales (the library's
/// CPU quantiser): (bytes, scales, dequantised values).
pub(crate) fn quant_blocks(w: &[f32], rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let (q, s) = kernels::quant::ref_quant_128x128(w, rows, cols, ScaleMode::Pow2);
    let bc = cols / 128;
    let deq = (0..rows * cols)
        .map(|i| emu::fp::e4m3_to_f32(q[i]) * s[(i / cols / 128) * bc + (i % cols) / 128])
        .collect();
    (q, s, deq)
}

pub(crate) fn transpose<T: Copy + Default>(w: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut t = vec![T::default(); rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = w[r * cols + c];
        }
    }
    t
}

/// Dequantised 1x128 FP8 of one row (the rounding the device kernels apply).
pub(crate) fn fp8_row(v: &[f32]) -> Vec<f32> {
    let (q, s) = kernels::quant::ref_quant_1x128(v, 1, v.len(), ScaleMode::Pow2);
    (0..v.len())
        .map(|i| emu::fp::e4m3_to_f32(q[i]) * s[i / 128])
        .collect()
}

/// In place: FP8 1x128 quantisation along the rows of `v` `[rows, cols]` (every column's
/// 128-row blocks share a scale, `mode` as in the device quantisers: scale = amax/448, rounded
/// up to a power of two for `Pow2`; values multiplied by 1/scale) and back: the "128x1"
/// operands of the wgrad GEMMs.
pub(crate) fn fp8_cols(v: &mut [f32], rows: usize, cols: usize, mode: ScaleMode) {
    for b in 0..rows.div_ceil(128) {
        let rs = b * 128..((b + 1) * 128).min(rows);
        for c in 0..cols {
            let amax = rs.clone().fold(0f32, |a, r| a.max(v[r * cols + c].abs()));
            let (sc, inv) = kernels::tile::fp8_scale_host(amax, mode);
            for r in rs.clone() {
                let q = kernels::quant::e4m3_satfinite(v[r * cols + c] * inv);
                v[r * cols + c] = emu::fp::e4m3_to_f32(q) * sc;
            }
        }
    }
}

pub(crate) fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

pub(crate) fn dsilu(x: f64) -> f64 {
    let sg = 1.0 / (1.0 + (-x).exp());
    sg * (1.0 + x * (1.0 - sg))
}

/// BF16 storage of a value the device holds in f32 (`cvt.rn.bf16.f32`: round to f32 first;
/// `half`'s direct f64 -> bf16 conversion does not round f32 ties to even the same way).
pub(crate) fn bf(x: f64) -> f32 {
    bf16::from_f32(x as f32).to_f32()
}

/// Host-side FP8 weights of one expert: (W1, W2) quantised (bytes, scales, dequantised), and
/// the transposes' (bytes, scales).
pub(crate) struct ExpertQ {
    pub w1: (Vec<u8>, Vec<f32>, Vec<f32>),
    pub w2: (Vec<u8>, Vec<f32>, Vec<f32>),
    pub w1t: (Vec<u8>, Vec<f32>),
    pub w2t: (Vec<u8>, Vec<f32>),
}

pub(crate) fn quant_expert(w1: &[f32], w2: &[f32], h: usize, i_n: usize) -> ExpertQ {
    let w1 = quant_blocks(w1, 2 * i_n, h);
    let w2 = quant_blocks(w2, h, i_n);
    // W^T's 128x128 blocks are W's blocks transposed: transpose bytes and scales
    let w1t = (
        transpose(&w1.0, 2 * i_n, h),
        transpose(&w1.1, 2 * i_n / 128, h / 128),
    );
    let w2t = (
        transpose(&w2.0, h, i_n),
        transpose(&w2.1, h / 128, i_n / 128),
    );
    ExpertQ { w1, w2, w1t, w2t }
}
