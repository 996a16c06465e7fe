//! The SwiGLU FFN of the reference (the dense layers' FFN, every routed expert and the shared
//! expert), forward, dgrad and wgrad over one *segment* of token rows, with the device path's
//! FP8 and BF16 roundings when asked for.
//!
//! The segment is what one grouped GEMM of the device sees: the dense FFN and the shared expert
//! run once per EP rank over that rank's tokens (in order); a routed expert runs once over all
//! tokens routed to it, source rank by source rank, in token order (`ep`'s dispatch slots). The
//! segment matters only for the wgrad's FP8 operands, whose scales are shared by 128
//! consecutive rows of a segment.
//!
//! Roundings (the scheme of `model::moe` and its reference `model::moe::reference`):
//! - FP8 (`fp8`): weights 128x128 blocks (power-of-two scales); the input row 1x128 (done by
//!   the caller, once per token); the SwiGLU output 1x128 before the down GEMM; dY (after BF16)
//!   1x128 before the dgrad GEMM; dG|dU 1x128 before the gate/up dgrad GEMM; the wgrad
//!   operands along the tokens (128x1): dY, weighted SwiGLU output and weighted dG|dU with
//!   power-of-two scales, the cached FP8 input re-tiled with exact (`Float`) scales.
//! - BF16 (`rd`): the gate/up GEMM output, dY, dH (the down dgrad output), the wgrad operands
//!   before their FP8 quantisation, and the path output where the top-k weight gradient reads
//!   it.

use super::tensor::{add_tn, axpy, dot, Mat, Round};
use crate::moe::host::{dsilu, fp8_cols, fp8_row, quant_blocks, silu};
use kernels::ScaleMode;

/// The precision model of one run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Prec {
    pub fp8: bool,
    pub rd: Round,
}

/// FP8 1x128 of one row (values as the device computes them in f32), identity without FP8.
pub(crate) fn q_row(v: &[f64], fp8: bool) -> Vec<f64> {
    if !fp8 {
        return v.to_vec();
    }
    let f: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    fp8_row(&f).into_iter().map(f64::from).collect()
}

/// One FFN's weights as its GEMMs read them: `w1` `[2I, H]` (gate rows, then up rows), `w2`
/// `[H, I]`; dequantised 128x128 FP8 with `fp8`, the FP32 masters otherwise.
pub(crate) struct FfnW {
    pub w1: Vec<f64>,
    pub w2: Vec<f64>,
    pub h: usize,
    pub i: usize,
}

impl FfnW {
    pub fn new(w1: &[f32], w2: &[f32], h: usize, i: usize, fp8: bool) -> FfnW {
        let deq = |w: &[f32], rows, cols| -> Vec<f64> {
            if fp8 {
                quant_blocks(w, rows, cols)
                    .2
                    .into_iter()
                    .map(f64::from)
                    .collect()
            } else {
                w.iter().map(|&v| v as f64).collect()
            }
        };
        FfnW {
            w1: deq(w1, 2 * i, h),
            w2: deq(w2, h, i),
            h,
            i,
        }
    }
}

/// The token rows one FFN runs over and each row's output weight (routing weight; 1 for the
/// dense FFN and the shared expert).
#[derive(Clone, Debug, Default)]
pub(crate) struct Segment {
    pub rows: Vec<usize>,
    pub w: Vec<f64>,
}

/// What the backward needs of one row: gate and up pre-activations (as stored), the
/// unweighted path output.
pub(crate) struct RowCache {
    g: Vec<f64>,
    u: Vec<f64>,
    yp: Vec<f64>,
}

/// Forward of `seg` over `xin` (the FFN input rows, already FP8-quantised by the caller when
/// modelled): adds `w_k * path(x_t)` to row `t` of `y`.
pub(crate) fn forward(w: &FfnW, xin: &Mat, seg: &Segment, pr: Prec, y: &mut Mat) -> Vec<RowCache> {
    let (h, i_n) = (w.h, w.i);
    let mut caches = Vec::with_capacity(seg.rows.len());
    for (&t, &wk) in seg.rows.iter().zip(&seg.w) {
        let x = xin.row(t);
        let gu: Vec<f64> = (0..2 * i_n)
            .map(|j| pr.rd.r(dot(x, &w.w1[j * h..(j + 1) * h])))
            .collect();
        let (g, u) = (gu[..i_n].to_vec(), gu[i_n..].to_vec());
        let act: Vec<f64> = (0..i_n).map(|j| silu(g[j]) * u[j]).collect();
        let actq = q_row(&act, pr.fp8);
        let yp: Vec<f64> = (0..h)
            .map(|c| dot(&actq, &w.w2[c * i_n..(c + 1) * i_n]))
            .collect();
        axpy(y.row_mut(t), wk, &yp);
        caches.push(RowCache { g, u, yp });
    }
    caches
}

/// The segment's weight gradients.
pub(crate) struct FfnGrad {
    pub w1: Vec<f64>,
    pub w2: Vec<f64>,
}

/// Backward of `seg` given the layer output's gradient `dy`: adds each row's input gradient
/// (times its weight) to `dx`, returns the weight gradients and, per row, the gradient of its
/// output weight (`<dY_t, path(x_t)>`).
pub(crate) fn backward(
    w: &FfnW,
    xin: &Mat,
    seg: &Segment,
    caches: &[RowCache],
    dy: &Mat,
    pr: Prec,
    dx: &mut Mat,
) -> (FfnGrad, Vec<f64>) {
    let (h, i_n, n) = (w.h, w.i, seg.rows.len());
    // wgrad operands, one row per segment row: dY, w act (dW_down); w dG|dU, x (dW_gate|up)
    let (mut a2, mut b2) = (Mat::zeros(n, h), Mat::zeros(n, i_n));
    let (mut a1, mut b1) = (Mat::zeros(n, 2 * i_n), Mat::zeros(n, h));
    let mut dwk = Vec::with_capacity(n);
    for (k, ((&t, &wk), c)) in seg.rows.iter().zip(&seg.w).zip(caches).enumerate() {
        let dyb = pr.rd.vec(dy.row(t));
        let dyq = q_row(&dyb, pr.fp8);
        let mut dh = vec![0f64; i_n];
        for (cc, &d) in dyq.iter().enumerate() {
            axpy(&mut dh, d, &w.w2[cc * i_n..(cc + 1) * i_n]);
        }
        let dh = pr.rd.vec(&dh);
        let mut dgu = vec![0f64; 2 * i_n];
        for j in 0..i_n {
            dgu[j] = dh[j] * c.u[j] * dsilu(c.g[j]);
            dgu[i_n + j] = dh[j] * silu(c.g[j]);
        }
        let dguq = q_row(&dgu, pr.fp8);
        let dxr = dx.row_mut(t);
        for (j, &d) in dguq.iter().enumerate() {
            if d != 0.0 {
                axpy(dxr, wk * d, &w.w1[j * h..(j + 1) * h]);
            }
        }
        dwk.push(dot(&dyb, &pr.rd.vec(&c.yp)));
        a2.row_mut(k).copy_from_slice(&dyb);
        for j in 0..i_n {
            b2.row_mut(k)[j] = pr.rd.r(wk * silu(c.g[j]) * c.u[j]);
        }
        for (o, &d) in a1.row_mut(k).iter_mut().zip(&dgu) {
            *o = pr.rd.r(wk * d);
        }
        b1.row_mut(k).copy_from_slice(xin.row(t));
    }
    if pr.fp8 {
        for (m, mode) in [
            (&mut a2, ScaleMode::Pow2),
            (&mut b2, ScaleMode::Pow2),
            (&mut a1, ScaleMode::Pow2),
            (&mut b1, ScaleMode::Float),
        ] {
            fp8_along_rows(m, mode);
        }
    }
    let mut g = FfnGrad {
        w1: vec![0.0; 2 * i_n * h],
        w2: vec![0.0; h * i_n],
    };
    add_tn(&mut g.w2, &a2, &b2);
    add_tn(&mut g.w1, &a1, &b1);
    (g, dwk)
}

/// The wgrad operands' FP8: every column's 128-row blocks share a scale.
fn fp8_along_rows(m: &mut Mat, mode: ScaleMode) {
    let mut f: Vec<f32> = m.data.iter().map(|&v| v as f32).collect();
    fp8_cols(&mut f, m.rows, m.cols, mode);
    m.data = f.into_iter().map(f64::from).collect();
}

#[cfg(test)]
mod tests {
    use super::super::tensor::bf;
    use super::*;
    use crate::moe::reference::{ref_path, ref_wgrad, WRow};
    use rand::{Rng, SeedableRng};

    /// Where the two overlap (one expert: forward, dgrad, the top-k weight gradient, wgrad with
    /// FP8 and BF16 modelled), this FFN agrees with `model::moe::reference`, which the device
    /// MoE layer is checked against; written separately, they differ only in the order of a
    /// few f64 products (which can move a BF16 rounding of a wgrad operand by one ulp).
    #[test]
    fn ffn_agrees_with_the_moe_layer_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let (h, i_n, n) = (128, 128, 150);
        let mut u =
            |len: usize, a: f32| -> Vec<f32> { (0..len).map(|_| rng.gen_range(-a..a)).collect() };
        let (w1, w2) = (u(2 * i_n * h, 0.05), u(h * i_n, 0.05));
        let (x, dy) = (u(n * h, 1.0), u(n * h, 1.0));
        let wk: Vec<f64> = u(n, 1.0).iter().map(|&v| 0.6 + v as f64 * 0.5).collect();
        let pr = Prec {
            fp8: true,
            rd: Round(true),
        };
        let fw = FfnW::new(&w1, &w2, h, i_n, true);
        let xq: Vec<f32> = (0..n)
            .flat_map(|t| fp8_row(&x[t * h..(t + 1) * h]))
            .collect();
        let xin = Mat {
            rows: n,
            cols: h,
            data: xq.iter().map(|&v| v as f64).collect(),
        };
        let dym = Mat {
            rows: n,
            cols: h,
            data: dy.iter().map(|&v| v as f64).collect(),
        };
        let seg = Segment {
            rows: (0..n).collect(),
            w: wk.clone(),
        };
        let mut y = Mat::zeros(n, h);
        let caches = forward(&fw, &xin, &seg, pr, &mut y);
        let mut dx = Mat::zeros(n, h);
        let (g, dwk) = backward(&fw, &xin, &seg, &caches, &dym, pr, &mut dx);
        let (w1d, w2d): (Vec<f32>, Vec<f32>) = (
            fw.w1.iter().map(|&v| v as f32).collect(),
            fw.w2.iter().map(|&v| v as f32).collect(),
        );
        let mut rows: Vec<WRow> = Vec::new();
        for t in 0..n {
            let dyb: Vec<f32> = dy[t * h..(t + 1) * h]
                .iter()
                .map(|&v| bf(v as f64) as f32)
                .collect();
            let dyq: Vec<f64> = fp8_row(&dyb).iter().map(|&v| v as f64).collect();
            let (mut yr, mut dxr) = (vec![0.0; h], vec![0.0; h]);
            let xr = &xq[t * h..(t + 1) * h];
            let yp = ref_path(xr, &dyq, wk[t], (&w1d, &w2d), &mut yr, &mut dxr);
            let dw_ref: f64 = (0..h).map(|c| dyb[c] as f64 * bf(yp[c])).sum();
            for c in 0..h {
                assert!((y.row(t)[c] - yr[c]).abs() <= 1e-12, "y[{t},{c}]");
                assert!((dx.row(t)[c] - dxr[c]).abs() <= 1e-12, "dx[{t},{c}]");
            }
            assert!(
                (dwk[t] - dw_ref).abs() <= 1e-12 * (1.0 + dw_ref.abs()),
                "dw[{t}]"
            );
            rows.push((xr, dyb, wk[t]));
        }
        let (dw1, dw2) = ref_wgrad(&rows, (&w1d, &w2d), h, i_n);
        let rel = |a: &[f64], b: &[f64]| {
            let e: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
            (e / b.iter().map(|v| v * v).sum::<f64>()).sqrt()
        };
        let (r1, r2) = (rel(&g.w1, &dw1), rel(&g.w2, &dw2));
        println!("wgrad vs moe::reference: rel Frobenius {r1:.1e} (w1), {r2:.1e} (w2)");
        assert!(r1 < 1e-3 && r2 < 1e-3, "wgrad rel errors {r1:e} {r2:e}");
    }
}
