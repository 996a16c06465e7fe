//! The reference's MLA attention (DeepSeek-V3): low-rank query (`wq_a`, `q_norm`, `wq_b`),
//! low-rank key/value (`wkv_a`, `kv_norm`, `wkv_b`) with the decoupled RoPE key shared by all
//! heads, causal softmax attention within each sequence, output projection `wo`; forward and
//! backward.
//!
//! BF16 (when modelled, as the device stores them): the projections' operands (weights, inputs,
//! output gradients: [`Linear`]) and outputs; q and k after RoPE (the RoPE kernel works in
//! place on BF16); the attention output; the attention kernel's dQ/dK/dV and the RoPE
//! backward's output; the norms' input gradients. Scores, softmax and the P V / dP products are
//! f64 here (the kernel: f32 on BF16 operands).

use super::tensor::{dot, rmsnorm, rmsnorm_bwd, Linear, Mat, Round};
use std::ops::Range;

/// Attention sizes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnDims {
    pub nh: usize,
    pub dn: usize,
    pub dr: usize,
    pub dv: usize,
    pub kvl: usize,
    pub eps: f64,
    pub theta: f64,
}

impl AttnDims {
    fn qd(&self) -> usize {
        self.dn + self.dr
    }
    fn kvd(&self) -> usize {
        self.dn + self.dv
    }
}

/// Rotates the RoPE part `v` (even length `d`) of the token at position `pos` in place:
/// interleaved pairs `(2i, 2i+1)` by angle `pos * theta^(-2i/d)` (`inverse`: by minus that
/// angle, the transpose used by the backward).
pub fn rope(v: &mut [f64], pos: usize, theta: f64, inverse: bool) {
    let d = v.len() as f64;
    for i in 0..v.len() / 2 {
        let ang = pos as f64 * theta.powf(-((2 * i) as f64) / d);
        let (s, c) = ang.sin_cos();
        let s = if inverse { -s } else { s };
        let (x0, x1) = (v[2 * i], v[2 * i + 1]);
        v[2 * i] = x0 * c - x1 * s;
        v[2 * i + 1] = x0 * s + x1 * c;
    }
}

/// One layer's attention weights.
pub(crate) struct AttnW {
    pub wq_a: Linear,
    pub q_norm: Vec<f64>,
    pub wq_b: Linear,
    pub wkv_a: Linear,
    pub kv_norm: Vec<f64>,
    pub wkv_b: Linear,
    pub wo: Linear,
}

/// The attention's gradients (names of `params`).
pub(crate) struct AttnGrad {
    pub wq_a: Vec<f64>,
    pub q_norm: Vec<f64>,
    pub wq_b: Vec<f64>,
    pub wkv_a: Vec<f64>,
    pub kv_norm: Vec<f64>,
    pub wkv_b: Vec<f64>,
    pub wo: Vec<f64>,
}

/// What the backward needs.
pub(crate) struct AttnCache {
    ar: Mat,
    cq_raw: Mat,
    cq_rstd: Vec<f64>,
    cqr: Mat,
    ckv: Mat,
    kv_rstd: Vec<f64>,
    ckvr: Mat,
    /// `[N, heads * (nope + rope)]` after RoPE.
    q: Mat,
    /// `[N, heads * (nope + v)]`.
    kv: Mat,
    /// `[N, rope]` after RoPE.
    kr: Mat,
    /// Per (sequence, head) the `[L, L]` probabilities (zero above the diagonal).
    p: Vec<Vec<f64>>,
    /// `[N, heads * v]` as `wo` reads it.
    or: Mat,
}

/// Forward over `a` `[N, H]` (the attention norm's output) with `seqs` the row ranges of the
/// sequences (positions restart at each).
pub(crate) fn forward(
    d: &AttnDims,
    w: &AttnW,
    a: &Mat,
    seqs: &[Range<usize>],
    rd: Round,
) -> (Mat, AttnCache) {
    let (ar, mut cq_raw) = w.wq_a.forward(a);
    rd.in_place(&mut cq_raw);
    let (cq, cq_rstd) = rmsnorm(&cq_raw, &w.q_norm, d.eps);
    let (cqr, mut q) = w.wq_b.forward(&cq);
    rd.in_place(&mut q);
    let (_, mut kva) = w.wkv_a.forward(a);
    rd.in_place(&mut kva);
    let ckv = kva.cols_of(0, d.kvl);
    let mut kr = kva.cols_of(d.kvl, d.dr);
    let (ckvn, kv_rstd) = rmsnorm(&ckv, &w.kv_norm, d.eps);
    let (ckvr, mut kv) = w.wkv_b.forward(&ckvn);
    rd.in_place(&mut kv);
    for s in seqs {
        for (pos, t) in s.clone().enumerate() {
            rope(kr.row_mut(t), pos, d.theta, false);
            for h in 0..d.nh {
                let c0 = h * d.qd() + d.dn;
                rope(&mut q.row_mut(t)[c0..c0 + d.dr], pos, d.theta, false);
            }
        }
    }
    rd.in_place(&mut kr);
    rd.in_place(&mut q);
    let mut o = Mat::zeros(a.rows, d.nh * d.dv);
    let mut p = Vec::with_capacity(seqs.len() * d.nh);
    for s in seqs {
        for h in 0..d.nh {
            p.push(head_forward(d, h, s.clone(), (&q, &kv, &kr), &mut o));
        }
    }
    rd.in_place(&mut o);
    let (or, mut out) = w.wo.forward(&o);
    rd.in_place(&mut out);
    let cache = AttnCache {
        ar,
        cq_raw,
        cq_rstd,
        cqr,
        ckv,
        kv_rstd,
        ckvr,
        q,
        kv,
        kr,
        p,
        or,
    };
    (out, cache)
}

/// Key `j`'s [nope | rope] of head `h`.
fn key(d: &AttnDims, kv: &Mat, kr: &Mat, h: usize, j: usize) -> Vec<f64> {
    let mut k = kv.row(j)[h * d.kvd()..h * d.kvd() + d.dn].to_vec();
    k.extend_from_slice(kr.row(j));
    k
}

/// Causal softmax attention of head `h` over the sequence rows `s`: writes the head's output
/// columns of `o`, returns P `[L, L]`.
fn head_forward(
    d: &AttnDims,
    h: usize,
    s: Range<usize>,
    (q, kv, kr): (&Mat, &Mat, &Mat),
    o: &mut Mat,
) -> Vec<f64> {
    let (l, t0) = (s.len(), s.start);
    let scale = 1.0 / (d.qd() as f64).sqrt();
    let keys: Vec<Vec<f64>> = s.clone().map(|j| key(d, kv, kr, h, j)).collect();
    let mut p = vec![0.0; l * l];
    for i in 0..l {
        let qi = &q.row(t0 + i)[h * d.qd()..(h + 1) * d.qd()];
        let sc: Vec<f64> = (0..=i).map(|j| dot(qi, &keys[j]) * scale).collect();
        let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = sc.iter().map(|v| (v - m).exp()).collect();
        let z: f64 = e.iter().sum();
        let orow = &mut o.row_mut(t0 + i)[h * d.dv..(h + 1) * d.dv];
        for j in 0..=i {
            let pij = e[j] / z;
            p[i * l + j] = pij;
            let v = &kv.row(t0 + j)[h * d.kvd() + d.dn..(h + 1) * d.kvd()];
            for (ov, vv) in orow.iter_mut().zip(v) {
                *ov += pij * vv;
            }
        }
    }
    p
}

/// Backward given `dout` `[N, H]`: returns `da` and the gradients.
pub(crate) fn backward(
    d: &AttnDims,
    w: &AttnW,
    c: &AttnCache,
    dout: &Mat,
    seqs: &[Range<usize>],
    rd: Round,
) -> (Mat, AttnGrad) {
    let mut g = AttnGrad {
        wq_a: vec![0.0; w.wq_a.w.len()],
        q_norm: vec![0.0; w.q_norm.len()],
        wq_b: vec![0.0; w.wq_b.w.len()],
        wkv_a: vec![0.0; w.wkv_a.w.len()],
        kv_norm: vec![0.0; w.kv_norm.len()],
        wkv_b: vec![0.0; w.wkv_b.w.len()],
        wo: vec![0.0; w.wo.w.len()],
    };
    let dout_o = w.wo.backward(dout, &c.or, &mut g.wo);
    let n = dout.rows;
    let mut dq = Mat::zeros(n, d.nh * d.qd());
    let mut dkv = Mat::zeros(n, d.nh * d.kvd());
    let mut dkr = Mat::zeros(n, d.dr);
    let o = &c.or;
    for (si, s) in seqs.iter().enumerate() {
        for h in 0..d.nh {
            let p = &c.p[si * d.nh + h];
            let grads = (&mut dq, &mut dkv, &mut dkr);
            head_backward(d, h, s.clone(), c, (p, o, &dout_o), grads);
        }
    }
    rd.in_place(&mut dq);
    rd.in_place(&mut dkv);
    rd.in_place(&mut dkr);
    for s in seqs {
        for (pos, t) in s.clone().enumerate() {
            rope(dkr.row_mut(t), pos, d.theta, true);
            for h in 0..d.nh {
                let c0 = h * d.qd() + d.dn;
                rope(&mut dq.row_mut(t)[c0..c0 + d.dr], pos, d.theta, true);
            }
        }
    }
    rd.in_place(&mut dq);
    rd.in_place(&mut dkr);
    let dckvn = w.wkv_b.backward(&dkv, &c.ckvr, &mut g.wkv_b);
    let mut dckv = rmsnorm_bwd(&dckvn, &c.ckv, &w.kv_norm, &c.kv_rstd, &mut g.kv_norm);
    rd.in_place(&mut dckv);
    let mut dkva = Mat::zeros(n, d.kvl + d.dr);
    dkva.set_cols(0, &dckv);
    dkva.set_cols(d.kvl, &dkr);
    let mut da = w.wkv_a.backward(&dkva, &c.ar, &mut g.wkv_a);
    let dcq = w.wq_b.backward(&dq, &c.cqr, &mut g.wq_b);
    let mut dcq_raw = rmsnorm_bwd(&dcq, &c.cq_raw, &w.q_norm, &c.cq_rstd, &mut g.q_norm);
    rd.in_place(&mut dcq_raw);
    da.add_assign(&w.wq_a.backward(&dcq_raw, &c.ar, &mut g.wq_a));
    (da, g)
}

/// Head `h`'s backward over the sequence rows `s`: adds to dq (its columns), dkv (its k_nope
/// and v columns) and dkr (the shared RoPE key, summed over heads).
fn head_backward(
    d: &AttnDims,
    h: usize,
    s: Range<usize>,
    c: &AttnCache,
    (p, o, dout): (&[f64], &Mat, &Mat),
    (dq, dkv, dkr): (&mut Mat, &mut Mat, &mut Mat),
) {
    let (l, t0) = (s.len(), s.start);
    let scale = 1.0 / (d.qd() as f64).sqrt();
    let (qc, kc, vc) = (h * d.qd(), h * d.kvd(), h * d.kvd() + d.dn);
    let oc = h * d.dv;
    let keys: Vec<Vec<f64>> = s.clone().map(|j| key(d, &c.kv, &c.kr, h, j)).collect();
    for i in 0..l {
        let ti = t0 + i;
        let doi = &dout.row(ti)[oc..oc + d.dv];
        let di = dot(doi, &o.row(ti)[oc..oc + d.dv]);
        let qi = c.q.row(ti)[qc..qc + d.qd()].to_vec();
        for j in 0..=i {
            let tj = t0 + j;
            let pij = p[i * l + j];
            let dp = dot(doi, &c.kv.row(tj)[vc..vc + d.dv]);
            let ds = pij * (dp - di) * scale;
            for (x, kv) in dq.row_mut(ti)[qc..qc + d.qd()].iter_mut().zip(&keys[j]) {
                *x += ds * kv;
            }
            let dkrow = dkv.row_mut(tj);
            for (x, qv) in dkrow[kc..kc + d.dn].iter_mut().zip(&qi) {
                *x += ds * qv;
            }
            for (x, dv) in dkrow[vc..vc + d.dv].iter_mut().zip(doi) {
                *x += pij * dv;
            }
            for (x, qv) in dkr.row_mut(tj).iter_mut().zip(&qi[d.dn..]) {
                *x += ds * qv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::attn::reference::RefProblem;
    use kernels::RopeConfig;
    use rand::{Rng, SeedableRng};

    /// The rotation is the RoPE kernel's convention: interleaved pairs, `inv_freq` and the
    /// (cos, sin) tables of `kernels::train::rope` (f32 tables: f32 agreement).
    #[test]
    fn rope_is_the_kernel_librarys_convention() {
        let rc = RopeConfig {
            dim: 16,
            theta: 10000.0,
            yarn: None,
        };
        let (cos, sin) = rc.tables(64).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        for pos in [0usize, 1, 7, 63] {
            let x: Vec<f64> = (0..16).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let mut got = x.clone();
            rope(&mut got, pos, 10000.0, false);
            for i in 0..8 {
                let (c, s) = (cos[pos * 8 + i] as f64, sin[pos * 8 + i] as f64);
                let want = [
                    x[2 * i] * c - x[2 * i + 1] * s,
                    x[2 * i] * s + x[2 * i + 1] * c,
                ];
                assert!((got[2 * i] - want[0]).abs() < 1e-6, "pos {pos} pair {i}");
                assert!(
                    (got[2 * i + 1] - want[1]).abs() < 1e-6,
                    "pos {pos} pair {i}"
                );
            }
        }
    }

    /// The attention core (per-head causal softmax, P V, and its backward with the RoPE key
    /// shared by the heads) agrees with the attention kernels' f64 reference run on per-head
    /// keys `[k_nope_h | k_rope]`.
    #[test]
    fn attention_core_agrees_with_the_kernel_librarys_reference() {
        let d = AttnDims {
            nh: 2,
            dn: 32,
            dr: 16,
            dv: 32,
            kvl: 0,
            eps: 1e-6,
            theta: 10000.0,
        };
        let (n, lens) = (20, [12usize, 8]);
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut mat = |r, c| Mat {
            rows: r,
            cols: c,
            data: (0..r * c).map(|_| rng.gen_range(-1.0..1.0)).collect(),
        };
        let (q, kv, kr, dout) = (
            mat(n, d.nh * d.qd()),
            mat(n, d.nh * d.kvd()),
            mat(n, d.dr),
            mat(n, d.nh * d.dv),
        );
        let seqs = [0..12, 12..20];
        let mut o = Mat::zeros(n, d.nh * d.dv);
        let mut p = Vec::new();
        for s in &seqs {
            for h in 0..d.nh {
                p.push(head_forward(&d, h, s.clone(), (&q, &kv, &kr), &mut o));
            }
        }
        // the kernel reference's layouts: q, k [row, head, 48], v [row, head, 32]
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for t in 0..n {
            for h in 0..d.nh {
                k.extend(key(&d, &kv, &kr, h, t));
                v.extend_from_slice(&kv.row(t)[h * d.kvd() + d.dn..(h + 1) * d.kvd()]);
            }
        }
        let rp = RefProblem {
            cu: vec![0, lens[0], lens[0] + lens[1]],
            heads: d.nh,
            d_qk: d.qd(),
            d_v: d.dv,
            scale: 1.0 / (d.qd() as f64).sqrt(),
        };
        let want = rp.forward(&q.data, &k, &v);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12 * (1.0 + b.abs());
        assert!(o.data.iter().zip(&want.o).all(|(a, b)| close(*a, *b)));
        let empty = Mat::zeros(0, 0);
        let c = AttnCache {
            ar: empty.clone(),
            cq_raw: empty.clone(),
            cq_rstd: Vec::new(),
            cqr: empty.clone(),
            ckv: empty.clone(),
            kv_rstd: Vec::new(),
            ckvr: empty,
            q,
            kv,
            kr,
            p,
            or: o.clone(),
        };
        let (mut dq, mut dkv, mut dkr) = (
            Mat::zeros(n, d.nh * d.qd()),
            Mat::zeros(n, d.nh * d.kvd()),
            Mat::zeros(n, d.dr),
        );
        for (si, s) in seqs.iter().enumerate() {
            for h in 0..d.nh {
                let pr = &c.p[si * d.nh + h];
                head_backward(
                    &d,
                    h,
                    s.clone(),
                    &c,
                    (pr, &o, &dout),
                    (&mut dq, &mut dkv, &mut dkr),
                );
            }
        }
        let wb = rp.backward(&c.q.data, &k, &v, &dout.data);
        assert!(dq.data.iter().zip(&wb.dq).all(|(a, b)| close(*a, *b)), "dq");
        for t in 0..n {
            let mut kr_sum = vec![0.0; d.dr];
            for h in 0..d.nh {
                let base = (t * d.nh + h) * d.qd();
                let row = &dkv.row(t)[h * d.kvd()..(h + 1) * d.kvd()];
                let (dkn, dvv) = row.split_at(d.dn);
                let vbase = (t * d.nh + h) * d.dv;
                assert!(
                    dkn.iter().zip(&wb.dk[base..]).all(|(a, b)| close(*a, *b)),
                    "dk"
                );
                assert!(
                    dvv.iter().zip(&wb.dv[vbase..]).all(|(a, b)| close(*a, *b)),
                    "dv"
                );
                for (j, s) in kr_sum.iter_mut().enumerate() {
                    *s += wb.dk[base + d.dn + j];
                }
            }
            assert!(
                dkr.row(t).iter().zip(&kr_sum).all(|(a, b)| close(*a, *b)),
                "dk_rope"
            );
        }
    }
}
