//! f64 CPU references for the GEMMs, dequantisation of FP8 operands, random inputs, and error
//! metrics. (Quantisation references, which must be bit-exact, live next to their kernels in
//! [`crate::quant`].)

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// `D[m][n] = sum_k A[m][k] * B[n][k] (+ C)`, in f64.
pub fn gemm_nt_f64(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut d = vec![0f64; m * n];
    for i in 0..m {
        let ar = &a[i * k..(i + 1) * k];
        for j in 0..n {
            let br = &b[j * k..(j + 1) * k];
            d[i * n + j] = ar.iter().zip(br).map(|(x, y)| x * y).sum();
        }
    }
    d
}

/// Dequantises e4m3 A [m, k] with 1x128 scales [m, k/128] to f64.
pub fn dequant_rows_f64(q: &[u8], s: &[f32], m: usize, k: usize) -> Vec<f64> {
    let kb = k / 128;
    (0..m * k)
        .map(|i| emu::fp::e4m3_to_f32(q[i]) as f64 * s[(i / k) * kb + (i % k) / 128] as f64)
        .collect()
}

/// Dequantises e4m3 B [n, k] with 128x128 scales [ceil(n/128), k/128] to f64.
pub fn dequant_blocks_f64(q: &[u8], s: &[f32], n: usize, k: usize) -> Vec<f64> {
    let kb = k / 128;
    (0..n * k)
        .map(|i| emu::fp::e4m3_to_f32(q[i]) as f64 * s[(i / k / 128) * kb + (i % k) / 128] as f64)
        .collect()
}

/// Deterministic random generator for test inputs.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `len` values uniform in [-1, 1), each row (of `row` values) with its own magnitude in
/// [2^-4, 2^4], and one outlier per 128 values: exercises fine-grained scaling.
pub fn random_activations(r: &mut StdRng, len: usize, row: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(len);
    let mut mag = 1.0f32;
    for i in 0..len {
        if i % row.max(1) == 0 {
            mag = 2f32.powf(r.gen_range(-4.0..4.0));
        }
        let mut x = r.gen_range(-1.0f32..1.0) * mag;
        if r.gen_range(0..128) == 0 {
            x *= 8.0;
        }
        v.push(x);
    }
    v
}

/// Relative Frobenius error ||got - want|| / ||want||.
pub fn rel_fro(got: &[f64], want: &[f64]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        num += (g - w) * (g - w);
        den += w * w;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// Largest absolute difference (NaN in `got` counts as infinite).
pub fn max_abs(got: &[f64], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            if g.is_nan() {
                f64::INFINITY
            } else {
                (g - w).abs()
            }
        })
        .fold(0.0, f64::max)
}
