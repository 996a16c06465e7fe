//! One decoder layer of the reference: MLA attention + dense FFN or MoE, forward and backward.

use super::*;

type Grads = Vec<(String, Vec<f64>)>;

pub struct AttnS {
    x: Vec<f64>,
    a: Vec<f64>,
    r1: Vec<f64>,
    cqr: Vec<f64>,
    cq: Vec<f64>,
    r2: Vec<f64>,
    q: Vec<f64>,
    ckv: Vec<f64>,
    kr: Vec<f64>,
    ckvn: Vec<f64>,
    r3: Vec<f64>,
    kv: Vec<f64>,
    /// Per (sequence, head) the causal probabilities `[S, S]`.
    p: Vec<Vec<f64>>,
    o: Vec<f64>,
}

struct FfnC {
    xq: Vec<f64>,
    gu: Vec<f64>,
    act: Vec<f64>,
    n: usize,
}

enum FfnS {
    Dense(FfnC),
    Moe {
        /// Per expert its rows (token indices) and cache; the shared expert's cache.
        rows: Vec<Vec<usize>>,
        caches: Vec<FfnC>,
        ys: Vec<Vec<f64>>,
        shared: Option<FfnC>,
        idx: Vec<i32>,
        s: Vec<f64>,
        w: Vec<f64>,
    },
}

pub struct LayerS {
    attn: AttnS,
    x1: Vec<f64>,
    f: Vec<f64>,
    rf: Vec<f64>,
    ffn: FfnS,
}

fn silu(g: f64) -> f64 {
    g / (1.0 + (-g).exp())
}
fn dsilu(g: f64) -> f64 {
    let s = 1.0 / (1.0 + (-g).exp());
    s * (1.0 + g * (1.0 - s))
}

/// One query row's attention output as the kernel forms it: key tiles of `bn` in order, an
/// online softmax (running max, rescaled sums), the probabilities rounded to BF16 for the
/// `P V` product while the normaliser sums them unrounded. `sc`: the row's scaled scores.
fn flash_row(sc: &[f64], bn: usize, dv: usize, v: impl Fn(usize, usize) -> f64) -> Vec<f64> {
    let (mut m, mut l) = (f64::NEG_INFINITY, 0f64);
    let mut acc = vec![0f64; dv];
    for t0 in (0..sc.len()).step_by(bn) {
        let tile = &sc[t0..(t0 + bn).min(sc.len())];
        let mnew = tile.iter().cloned().fold(m, f64::max);
        let alpha = (m - mnew).exp();
        l *= alpha;
        acc.iter_mut().for_each(|a| *a *= alpha);
        for (jj, &s) in tile.iter().enumerate() {
            let p = (s - mnew).exp();
            l += p;
            let pb = bfr(p);
            for (c, a) in acc.iter_mut().enumerate() {
                *a += pb * v(t0 + jj, c);
            }
        }
        m = mnew;
    }
    acc.iter().map(|a| a / l).collect()
}

fn attn_fwd(d: &Dm, w: &LayerW, x: &[f64], n: usize) -> (Vec<f64>, AttnS) {
    let (h, dqk) = (d.h, d.dqk());
    let (a, r1) = rms(x, &w.an, n, h, d.eps);
    let a = bfv(&a);
    let cqr = bfv(&mm_nt(&a, &w.wqa, n, d.ql, h));
    let (cq, r2) = rms(&cqr, &w.qn, n, d.ql, d.eps);
    let cq = bfv(&cq);
    let mut q = bfv(&mm_nt(&cq, &w.wqb, n, d.nh * dqk, d.ql));
    rope(d, &mut q, d.nh * dqk, d.nh, dqk, d.dn, 1.0);
    let q = bfv(&q);
    let kva = bfv(&mm_nt(&a, &w.wkva, n, d.kvl + d.dr, h));
    let w_kva = d.kvl + d.dr;
    let ckv: Vec<f64> = (0..n)
        .flat_map(|t| kva[t * w_kva..t * w_kva + d.kvl].to_vec())
        .collect();
    let mut kr: Vec<f64> = (0..n)
        .flat_map(|t| kva[t * w_kva + d.kvl..(t + 1) * w_kva].to_vec())
        .collect();
    rope(d, &mut kr, d.dr, 1, d.dr, 0, 1.0);
    let kr = bfv(&kr);
    let (ckvn, r3) = rms(&ckv, &w.kvn, n, d.kvl, d.eps);
    let ckvn = bfv(&ckvn);
    let kvw = d.dn + d.dv;
    let kv = bfv(&mm_nt(&ckvn, &w.wkvb, n, d.nh * kvw, d.kvl));
    let scale = 1.0 / (dqk as f64).sqrt();
    let bn = kernels::attn::fwd::FwdSpec::mma(dqk as u32, d.dv as u32).bn() as usize;
    let mut o = vec![0f64; n * d.nh * d.dv];
    let mut ps = Vec::new();
    for s0 in (0..n).step_by(d.seq) {
        for hh in 0..d.nh {
            let mut pm = vec![0f64; d.seq * d.seq];
            for i in 0..d.seq {
                let qi = &q[(s0 + i) * d.nh * dqk + hh * dqk..][..dqk];
                let sc: Vec<f64> = (0..=i)
                    .map(|j| {
                        let kj = &kv[(s0 + j) * d.nh * kvw + hh * kvw..][..d.dn];
                        let rj = &kr[(s0 + j) * d.dr..][..d.dr];
                        let dot: f64 = (0..d.dn).map(|c| qi[c] * kj[c]).sum::<f64>()
                            + (0..d.dr).map(|c| qi[d.dn + c] * rj[c]).sum::<f64>();
                        dot * scale
                    })
                    .collect();
                let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = sc.iter().map(|v| (v - mx).exp()).sum();
                for j in 0..=i {
                    pm[i * d.seq + j] = (sc[j] - mx).exp() / z;
                }
                let v = |j: usize, c: usize| kv[(s0 + j) * d.nh * kvw + hh * kvw + d.dn + c];
                let oi = flash_row(&sc, bn, d.dv, v);
                o[(s0 + i) * d.nh * d.dv + hh * d.dv..][..d.dv].copy_from_slice(&oi);
            }
            ps.push(pm);
        }
    }
    let o = bfv(&o);
    let x1 = bfv(&add(&mm_nt(&o, &w.wo, n, h, d.nh * d.dv), x));
    let s = AttnS {
        x: x.to_vec(),
        a,
        r1,
        cqr,
        cq,
        r2,
        q,
        ckv,
        kr,
        ckvn,
        r3,
        kv,
        p: ps,
        o,
    };
    (x1, s)
}

/// The attention core's backward: (dq after RoPE^-1, d kv [n, heads*(nope+v)], dkr raw).
fn core_bwd(d: &Dm, s: &AttnS, dout: &[f64], n: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (dqk, kvw) = (d.dqk(), d.dn + d.dv);
    let scale = 1.0 / (dqk as f64).sqrt();
    let mut dq = vec![0f64; n * d.nh * dqk];
    let mut dk = vec![0f64; n * d.nh * dqk];
    let mut dv = vec![0f64; n * d.nh * d.dv];
    for (si, s0) in (0..n).step_by(d.seq).enumerate() {
        for hh in 0..d.nh {
            let pm = &s.p[si * d.nh + hh];
            let kfull = |j: usize, c: usize| {
                if c < d.dn {
                    s.kv[(s0 + j) * d.nh * kvw + hh * kvw + c]
                } else {
                    s.kr[(s0 + j) * d.dr + c - d.dn]
                }
            };
            for i in 0..d.seq {
                let doi = &dout[(s0 + i) * d.nh * d.dv + hh * d.dv..][..d.dv];
                let dp: Vec<f64> = (0..=i)
                    .map(|j| {
                        let vj = &s.kv[(s0 + j) * d.nh * kvw + hh * kvw + d.dn..][..d.dv];
                        doi.iter().zip(vj).map(|(a, b)| a * b).sum()
                    })
                    .collect();
                // as the kernel: delta from the stored (BF16) O, P and dS rounded to BF16 as
                // MMA operands, the softmax scale applied to the dQ/dK accumulators
                let oi = &s.o[(s0 + i) * d.nh * d.dv + hh * d.dv..][..d.dv];
                let delta: f64 = doi.iter().zip(oi).map(|(a, b)| a * b).sum();
                for j in 0..=i {
                    let pij = pm[i * d.seq + j];
                    for c in 0..d.dv {
                        dv[(s0 + j) * d.nh * d.dv + hh * d.dv + c] += bfr(pij) * doi[c];
                    }
                    let ds = bfr(pij * (dp[j] - delta)) * scale;
                    for c in 0..dqk {
                        dq[(s0 + i) * d.nh * dqk + hh * dqk + c] += ds * kfull(j, c);
                        dk[(s0 + j) * d.nh * dqk + hh * dqk + c] +=
                            ds * s.q[(s0 + i) * d.nh * dqk + hh * dqk + c];
                    }
                }
            }
        }
    }
    let mut dq = bfv(&dq);
    rope(d, &mut dq, d.nh * dqk, d.nh, dqk, d.dn, -1.0);
    let dq = bfv(&dq);
    let (dk, dv) = (bfv(&dk), bfv(&dv));
    let mut dkv = vec![0f64; n * d.nh * kvw];
    let mut dkr = vec![0f64; n * d.dr];
    for t in 0..n {
        for hh in 0..d.nh {
            for c in 0..d.dn {
                dkv[t * d.nh * kvw + hh * kvw + c] = dk[t * d.nh * dqk + hh * dqk + c];
            }
            for c in 0..d.dv {
                dkv[t * d.nh * kvw + hh * kvw + d.dn + c] = dv[t * d.nh * d.dv + hh * d.dv + c];
            }
            for c in 0..d.dr {
                dkr[t * d.dr + c] += dk[t * d.nh * dqk + hh * dqk + d.dn + c];
            }
        }
    }
    let mut dkr = bfv(&dkr);
    rope(d, &mut dkr, d.dr, 1, d.dr, 0, -1.0);
    (dq, dkv, bfv(&dkr))
}

fn attn_bwd(d: &Dm, w: &LayerW, s: &AttnS, dx1: &[f64], n: usize) -> (Vec<f64>, Grads) {
    let (h, dqk, kvw) = (d.h, d.dqk(), d.dn + d.dv);
    let dout = bfv(&mm_nn(dx1, &w.wo, n, h, d.nh * d.dv));
    let g_wo = mm_tn(dx1, &s.o, n, h, d.nh * d.dv);
    let (dq, dkv, dkr) = core_bwd(d, s, &dout, n);
    // the device's two GEMMs, the second adding the first's BF16 result as C
    let part = |keep: &dyn Fn(usize) -> bool, v: &[f64], width: usize| -> Vec<f64> {
        v.iter()
            .enumerate()
            .map(|(i, &x)| if keep(i % width) { x } else { 0.0 })
            .collect()
    };
    let dk_only = part(&|c| c % kvw < d.dn, &dkv, d.nh * kvw);
    let dv_only = part(&|c| c % kvw >= d.dn, &dkv, d.nh * kvw);
    let dckvn = bfv(&mm_nn(&dk_only, &w.wkvb, n, d.nh * kvw, d.kvl));
    let dckvn = bfv(&add(
        &mm_nn(&dv_only, &w.wkvb, n, d.nh * kvw, d.kvl),
        &dckvn,
    ));
    let g_wkvb = mm_tn(&dkv, &s.ckvn, n, d.nh * kvw, d.kvl);
    let (dckv, g_kvn) = rms_bwd(&s.ckv, &w.kvn, &dckvn, &s.r3, n, d.kvl);
    let dckv = bfv(&dckv);
    let dcq = bfv(&mm_nn(&dq, &w.wqb, n, d.nh * dqk, d.ql));
    let g_wqb = mm_tn(&dq, &s.cq, n, d.nh * dqk, d.ql);
    let (dcqr, g_qn) = rms_bwd(&s.cqr, &w.qn, &dcq, &s.r2, n, d.ql);
    let dcqr = bfv(&dcqr);
    let w_kva = d.kvl + d.dr;
    let dkva: Vec<f64> = (0..n)
        .flat_map(|t| {
            let mut r = dckv[t * d.kvl..(t + 1) * d.kvl].to_vec();
            r.extend_from_slice(&dkr[t * d.dr..(t + 1) * d.dr]);
            r
        })
        .collect();
    let dc_only = part(&|c| c < d.kvl, &dkva, w_kva);
    let dr_only = part(&|c| c >= d.kvl, &dkva, w_kva);
    let da = bfv(&mm_nn(&dc_only, &w.wkva, n, w_kva, h));
    let da = bfv(&add(&mm_nn(&dr_only, &w.wkva, n, w_kva, h), &da));
    let da = bfv(&add(&mm_nn(&dcqr, &w.wqa, n, d.ql, h), &da));
    let g_wkva = mm_tn(&dkva, &s.a, n, w_kva, h);
    let g_wqa = mm_tn(&dcqr, &s.a, n, d.ql, h);
    let (dxn, g_an) = rms_bwd(&s.x, &w.an, &da, &s.r1, n, h);
    let dx = bfv(&add(dx1, &bfv(&dxn)));
    let g = vec![
        ("attn_norm".into(), g_an),
        ("attn.wq_a".into(), g_wqa),
        ("attn.q_norm".into(), g_qn),
        ("attn.wq_b".into(), g_wqb),
        ("attn.wkv_a".into(), g_wkva),
        ("attn.kv_norm".into(), g_kvn),
        ("attn.wkv_b".into(), g_wkvb),
        ("attn.wo".into(), g_wo),
    ];
    (dx, g)
}

fn ffn_fwd(d: &Dm, w: &FfnW, x: &[f64], n: usize) -> (Vec<f64>, FfnC) {
    let (h, i) = (d.h, w.i);
    let xq = fp8_rows(x, n, h);
    let gu = bfv(&mm_nt(&xq, &w.w1, n, 2 * i, h));
    let act: Vec<f64> = (0..n * i)
        .map(|k| {
            let (t, j) = (k / i, k % i);
            silu(gu[t * 2 * i + j]) * gu[t * 2 * i + i + j]
        })
        .collect();
    let aq = fp8_rows(&act, n, i);
    let y = bfv(&mm_nt(&aq, &w.w2, n, h, i));
    (y, FfnC { xq, gu, act, n })
}

/// (dx unweighted, dw1, dw2) of rows weighted by `rw` in the weight gradients.
fn ffn_bwd(d: &Dm, w: &FfnW, c: &FfnC, dy: &[f64], rw: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (h, i, n) = (d.h, w.i, c.n);
    let dh = bfv(&mm_nn(&fp8_rows(dy, n, h), &w.w2, n, h, i));
    let mut dgu = vec![0f64; n * 2 * i];
    for t in 0..n {
        for j in 0..i {
            let (g, u) = (c.gu[t * 2 * i + j], c.gu[t * 2 * i + i + j]);
            dgu[t * 2 * i + j] = dh[t * i + j] * u * dsilu(g);
            dgu[t * 2 * i + i + j] = dh[t * i + j] * silu(g);
        }
    }
    let dx = bfv(&mm_nn(&fp8_rows(&dgu, n, 2 * i), &w.w1, n, 2 * i, h));
    let dgu_w = bfv(&(0..n * 2 * i)
        .map(|k| dgu[k] * rw[k / (2 * i)])
        .collect::<Vec<_>>());
    let act_w = bfv(&(0..n * i).map(|k| c.act[k] * rw[k / i]).collect::<Vec<_>>());
    let p2 = ScaleMode::Pow2;
    let dw2 = mm_tn(
        &fp8_cols(dy, n, h, p2),
        &fp8_cols(&act_w, n, i, p2),
        n,
        h,
        i,
    );
    let xt = fp8_cols(&c.xq, n, h, ScaleMode::Float);
    let dw1 = mm_tn(&fp8_cols(&dgu_w, n, 2 * i, p2), &xt, n, 2 * i, h);
    (dx, dw1, dw2)
}

fn rows_of(v: &[f64], rows: &[usize], c: usize) -> Vec<f64> {
    rows.iter()
        .flat_map(|&t| v[t * c..(t + 1) * c].to_vec())
        .collect()
}

fn moe_fwd(d: &Dm, w: &LayerW, f: &[f64], n: usize) -> (Vec<f64>, FfnS) {
    let (h, e_n, kk) = (d.h, d.experts, d.m.topk as usize);
    let logits: Vec<f32> = mm_nt(f, &w.gate, n, e_n, h)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let rc = ep::RoutingCfg {
        experts: e_n as u32,
        groups: d.m.groups,
        topk_groups: d.m.topk_groups,
        topk: d.m.topk,
        scaling: d.m.route_scaling,
    };
    let rt = ep::routing::route_ref(&logits, &w.bias, &rc).unwrap();
    let s: Vec<f64> = logits
        .iter()
        .map(|&l| 1.0 / (1.0 + (-(l as f64)).exp()))
        .collect();
    let mut wts = vec![0f64; n * kk];
    for t in 0..n {
        let sel = &rt.idx[t * kk..(t + 1) * kk];
        let sum: f64 = sel.iter().map(|&e| s[t * e_n + e as usize]).sum();
        for k in 0..kk {
            wts[t * kk + k] = s[t * e_n + sel[k] as usize] / sum * d.m.route_scaling as f64;
        }
    }
    let mut rows = vec![Vec::new(); e_n];
    for t in 0..n {
        for k in 0..kk {
            rows[rt.idx[t * kk + k] as usize].push(t);
        }
    }
    let mut comb = vec![0f64; n * h];
    let mut caches = Vec::new();
    let mut ys = Vec::new();
    for (e, re) in rows.iter().enumerate() {
        let (y, c) = ffn_fwd(d, &w.experts[e], &rows_of(f, re, h), re.len());
        for (ri, &t) in re.iter().enumerate() {
            let k = (0..kk).find(|&k| rt.idx[t * kk + k] as usize == e).unwrap();
            for c in 0..h {
                comb[t * h + c] += wts[t * kk + k] * y[ri * h + c];
            }
        }
        caches.push(c);
        ys.push(y);
    }
    // the device sums the weighted top-k outputs and the shared expert's in f32, one rounding
    let (y, shared) = match &w.shared {
        Some(sw) => {
            let (ysh, c) = ffn_fwd(d, sw, f, n);
            (bfv(&add(&comb, &ysh)), Some(c))
        }
        None => (bfv(&comb), None),
    };
    let st = FfnS::Moe {
        rows,
        caches,
        ys,
        shared,
        idx: rt.idx,
        s,
        w: wts,
    };
    (y, st)
}

fn moe_bwd(d: &Dm, w: &LayerW, st: &FfnS, f: &[f64], dy: &[f64], n: usize) -> (Vec<f64>, Grads) {
    let FfnS::Moe {
        rows,
        caches,
        ys,
        shared,
        idx,
        s,
        w: wts,
    } = st
    else {
        unreachable!("moe state")
    };
    let (h, e_n, kk) = (d.h, d.experts, d.m.topk as usize);
    let mut g: Grads = Vec::new();
    let mut dxr = vec![0f64; n * h];
    let mut dldw = vec![0f64; n * kk];
    for e in 0..e_n {
        let slot = |t: usize| (0..kk).find(|&k| idx[t * kk + k] as usize == e).unwrap();
        let rw: Vec<f64> = rows[e].iter().map(|&t| wts[t * kk + slot(t)]).collect();
        let dye = rows_of(dy, &rows[e], h);
        let (dx, dw1, dw2) = ffn_bwd(d, &w.experts[e], &caches[e], &dye, &rw);
        for (ri, &t) in rows[e].iter().enumerate() {
            let k = slot(t);
            for c in 0..h {
                dxr[t * h + c] += rw[ri] * dx[ri * h + c];
                dldw[t * kk + k] += dy[t * h + c] * ys[e][ri * h + c];
            }
        }
        g.push((format!("moe.experts.{e}.w1"), dw1));
        g.push((format!("moe.experts.{e}.w2"), dw2));
    }
    // combine + shared expert + gate path summed in f32 on the device, one rounding (below)
    let mut dxf = dxr;
    if let (Some(sw), Some(c)) = (&w.shared, shared) {
        let (dx, dw1, dw2) = ffn_bwd(d, sw, c, dy, &vec![1.0; n]);
        dxf = add(&dxf, &dx);
        g.push(("moe.shared.w1".into(), dw1));
        g.push(("moe.shared.w2".into(), dw2));
    }
    let sc = d.m.route_scaling as f64;
    let mut dlog = vec![0f64; n * e_n];
    for t in 0..n {
        let sel: Vec<usize> = (0..kk).map(|k| idx[t * kk + k] as usize).collect();
        let sum: f64 = sel.iter().map(|&e| s[t * e_n + e]).sum();
        let dot: f64 = (0..kk)
            .map(|k| dldw[t * kk + k] * s[t * e_n + sel[k]])
            .sum();
        for (k, &e) in sel.iter().enumerate() {
            let se = s[t * e_n + e];
            let ds = sc / sum * (dldw[t * kk + k] - dot / sum);
            dlog[t * e_n + e] = ds * se * (1.0 - se);
        }
    }
    let dlb = bfv(&dlog);
    let dxg = mm_nn(&dlb, &w.gate, n, e_n, h);
    g.push(("moe.gate".into(), mm_tn(&dlb, f, n, e_n, h)));
    (bfv(&add(&dxf, &dxg)), g)
}

pub fn layer_fwd(d: &Dm, w: &LayerW, x: &[f64], n: usize) -> (Vec<f64>, LayerS) {
    let (x1, attn) = attn_fwd(d, w, x, n);
    let (f, rf) = rms(&x1, &w.fnw, n, d.h, d.eps);
    let f = bfv(&f);
    let (y, ffn) = match &w.dense {
        Some(fw) => {
            let (y, c) = ffn_fwd(d, fw, &f, n);
            (y, FfnS::Dense(c))
        }
        None => moe_fwd(d, w, &f, n),
    };
    let x2 = bfv(&add(&x1, &y));
    let s = LayerS {
        attn,
        x1,
        f,
        rf,
        ffn,
    };
    (x2, s)
}

pub fn layer_bwd(d: &Dm, w: &LayerW, s: &LayerS, dx2: &[f64], n: usize) -> (Vec<f64>, Grads) {
    let (dxf, mut g) = match (&w.dense, &s.ffn) {
        (Some(fw), FfnS::Dense(c)) => {
            let (dx, dw1, dw2) = ffn_bwd(d, fw, c, dx2, &vec![1.0; n]);
            (dx, vec![("ffn.w1".into(), dw1), ("ffn.w2".into(), dw2)])
        }
        _ => moe_bwd(d, w, &s.ffn, &s.f, dx2, n),
    };
    let (dxn, g_fn) = rms_bwd(&s.x1, &w.fnw, &dxf, &s.rf, n, d.h);
    g.push(("ffn_norm".into(), g_fn));
    let dx1 = bfv(&add(dx2, &bfv(&dxn)));
    let (dx, ga) = attn_bwd(d, w, &s.attn, &dx1, n);
    g.extend(ga);
    (dx, g)
}
