//! Plain f64 row-major matrices and the reference's elementary operations: the BF16 rounding
//! switch, BF16-operand linear layers (forward, dgrad, wgrad) and RMSNorm (forward, backward).
//! Everything is a plain loop; nothing here touches a device.

use half::bf16;

/// A `[rows, cols]` row-major f64 matrix.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f64>,
}

impl Mat {
    pub fn zeros(rows: usize, cols: usize) -> Mat {
        Mat {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }
    pub fn row(&self, r: usize) -> &[f64] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
    pub fn row_mut(&mut self, r: usize) -> &mut [f64] {
        &mut self.data[r * self.cols..(r + 1) * self.cols]
    }
    /// Columns `c0..c0 + n` of every row as a new matrix.
    pub fn cols_of(&self, c0: usize, n: usize) -> Mat {
        let mut out = Mat::zeros(self.rows, n);
        for r in 0..self.rows {
            out.row_mut(r).copy_from_slice(&self.row(r)[c0..c0 + n]);
        }
        out
    }
    /// Writes `m` into columns `c0..c0 + m.cols` of every row.
    pub fn set_cols(&mut self, c0: usize, m: &Mat) {
        for r in 0..self.rows {
            self.row_mut(r)[c0..c0 + m.cols].copy_from_slice(m.row(r));
        }
    }
    pub fn add_assign(&mut self, o: &Mat) {
        for (a, b) in self.data.iter_mut().zip(&o.data) {
            *a += b;
        }
    }
}

/// BF16 storage of a value the device holds in f32 (round to f32 first, then to nearest-even
/// BF16, as `cvt.rn.bf16.f32` after an f32 computation).
pub(crate) fn bf(x: f64) -> f64 {
    bf16::from_f32(x as f32).to_f64()
}

/// Whether the device stores a tensor in BF16 (`RefOptions::bf16`): `r` rounds when on and is
/// the identity when off.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Round(pub bool);

impl Round {
    pub fn r(self, x: f64) -> f64 {
        if self.0 {
            bf(x)
        } else {
            x
        }
    }
    pub fn vec(self, v: &[f64]) -> Vec<f64> {
        v.iter().map(|&x| self.r(x)).collect()
    }
    pub fn vec_f32(self, v: &[f32]) -> Vec<f64> {
        v.iter().map(|&x| self.r(x as f64)).collect()
    }
    pub fn mat(self, m: &Mat) -> Mat {
        Mat {
            rows: m.rows,
            cols: m.cols,
            data: self.vec(&m.data),
        }
    }
    pub fn in_place(self, m: &mut Mat) {
        if self.0 {
            m.data.iter_mut().for_each(|x| *x = bf(*x));
        }
    }
}

/// `x W^T` for `w` `[out, in]`.
pub(crate) fn matmul_nt(x: &Mat, w: &[f64], out: usize) -> Mat {
    let k = x.cols;
    let mut y = Mat::zeros(x.rows, out);
    for r in 0..x.rows {
        let xr = x.row(r);
        for (j, yv) in y.row_mut(r).iter_mut().enumerate() {
            *yv = dot(xr, &w[j * k..(j + 1) * k]);
        }
    }
    y
}

/// `dy W` for `w` `[out, in]`: the data gradient of [`matmul_nt`].
pub(crate) fn matmul_nn(dy: &Mat, w: &[f64], inp: usize) -> Mat {
    let mut dx = Mat::zeros(dy.rows, inp);
    for r in 0..dy.rows {
        let dxr = &mut dx.data[r * inp..(r + 1) * inp];
        for (j, &d) in dy.row(r).iter().enumerate() {
            if d != 0.0 {
                axpy(dxr, d, &w[j * inp..(j + 1) * inp]);
            }
        }
    }
    dx
}

/// `dw += dy^T x` (`dw` `[dy.cols, x.cols]`): the weight gradient of [`matmul_nt`].
pub(crate) fn add_tn(dw: &mut [f64], dy: &Mat, x: &Mat) {
    let k = x.cols;
    for r in 0..dy.rows {
        let xr = x.row(r);
        for (j, &d) in dy.row(r).iter().enumerate() {
            if d != 0.0 {
                axpy(&mut dw[j * k..(j + 1) * k], d, xr);
            }
        }
    }
}

pub(crate) fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

pub(crate) fn axpy(y: &mut [f64], a: f64, x: &[f64]) {
    for (yv, xv) in y.iter_mut().zip(x) {
        *yv += a * xv;
    }
}

/// A BF16-operand linear layer `y = x W^T` (attention projections, the MoE gate, the head):
/// with BF16 on, the weight is its BF16 copy and every operand (x; dy for dgrad and wgrad) is
/// rounded to BF16, the products summed exactly (the device: FP32 accumulation).
pub(crate) struct Linear {
    /// `[out, in]`, already rounded.
    pub w: Vec<f64>,
    pub out: usize,
    pub inp: usize,
    pub rd: Round,
}

impl Linear {
    pub fn new(w: &[f32], out: usize, inp: usize, rd: Round) -> Linear {
        Linear {
            w: rd.vec_f32(w),
            out,
            inp,
            rd,
        }
    }
    /// (x as the GEMM reads it, y unrounded).
    pub fn forward(&self, x: &Mat) -> (Mat, Mat) {
        let xr = self.rd.mat(x);
        let y = matmul_nt(&xr, &self.w, self.out);
        (xr, y)
    }
    /// dgrad and wgrad: returns dx (stored BF16 when modelled), adds `dy^T xr` to `dw`.
    pub fn backward(&self, dy: &Mat, xr: &Mat, dw: &mut [f64]) -> Mat {
        let dyr = self.rd.mat(dy);
        add_tn(dw, &dyr, xr);
        let mut dx = matmul_nn(&dyr, &self.w, self.inp);
        self.rd.in_place(&mut dx);
        dx
    }
}

/// RMSNorm forward of every row: (y, rstd per row), `y = x rstd w`.
pub(crate) fn rmsnorm(x: &Mat, w: &[f64], eps: f64) -> (Mat, Vec<f64>) {
    let mut y = Mat::zeros(x.rows, x.cols);
    let mut rstd = Vec::with_capacity(x.rows);
    for r in 0..x.rows {
        let xr = x.row(r);
        let ms = xr.iter().map(|v| v * v).sum::<f64>() / x.cols as f64;
        let rs = 1.0 / (ms + eps).sqrt();
        for ((yv, xv), wv) in y.row_mut(r).iter_mut().zip(xr).zip(w) {
            *yv = xv * rs * wv;
        }
        rstd.push(rs);
    }
    (y, rstd)
}

/// RMSNorm backward: returns dx, adds the weight gradient to `dw`.
/// `dx = rstd w dy - x rstd^3 (sum_c w dy x) / n`, `dw += dy x rstd`.
pub(crate) fn rmsnorm_bwd(dy: &Mat, x: &Mat, w: &[f64], rstd: &[f64], dw: &mut [f64]) -> Mat {
    let n = x.cols as f64;
    let mut dx = Mat::zeros(x.rows, x.cols);
    for (r, &rs) in rstd.iter().enumerate() {
        let (xr, dyr) = (x.row(r), dy.row(r));
        let mut s = 0.0;
        for c in 0..x.cols {
            s += w[c] * dyr[c] * xr[c];
            dw[c] += dyr[c] * xr[c] * rs;
        }
        let k = rs * rs * rs * s / n;
        for (c, d) in dx.row_mut(r).iter_mut().enumerate() {
            *d = rs * w[c] * dyr[c] - xr[c] * k;
        }
    }
    dx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_helpers_agree_with_their_definitions() {
        let x = Mat {
            rows: 2,
            cols: 3,
            data: vec![1.0, -2.0, 0.5, 3.0, 0.25, -1.0],
        };
        let w = vec![0.5, 1.0, -1.0, 2.0, 0.0, 4.0]; // [2, 3]
        let y = matmul_nt(&x, &w, 2);
        assert_eq!(y.data, vec![-2.0, 4.0, 2.75, 2.0]);
        let dx = matmul_nn(&y, &w, 3);
        // dx[0] = -2 * w0 + 4 * w1
        assert_eq!(dx.row(0), &[7.0, -2.0, 18.0]);
        let mut dw = vec![0.0; 6];
        add_tn(&mut dw, &y, &x);
        // dw[0][0] = -2*1 + 2.75*3
        assert_eq!(dw[0], 6.25);
        assert_eq!(bf(1.0 + 1.0 / 256.0), 1.0, "ties to even");
        assert_eq!(bf(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
    }
}
