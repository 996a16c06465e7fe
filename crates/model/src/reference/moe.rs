//! The reference's DeepSeekMoE layer: sigmoid gate, group-limited top-k selection with the
//! aux-loss-free bias, normalised and scaled routing weights, routed experts plus the shared
//! expert; forward and backward (through the routing weights into the gate and the input).
//!
//! Routing is computed here in f64 from the reference's own gate scores (not `ep::routing`'s
//! f32 arithmetic) with the same rule: groups of `experts / groups` consecutive experts, a
//! group's score is the sum of its two largest biased scores, the best `topk_groups` groups
//! are kept, then the `topk` largest biased scores inside them; ties go to the lower index.
//! The routing is per token, so how tokens are placed on EP ranks changes nothing but the
//! order of a routed expert's segment (which the wgrad's FP8 blocks see).

use super::ffn::{self, FfnW, Prec, RowCache, Segment};
use super::tensor::{Linear, Mat};
use super::RefError;
use crate::config::ModelConfig;
use std::ops::Range;

/// The routing shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouteCfg {
    pub experts: usize,
    pub groups: usize,
    pub topk_groups: usize,
    pub topk: usize,
    /// Routed weights are multiplied by this after normalisation.
    pub scaling: f64,
}

impl RouteCfg {
    pub fn of(m: &ModelConfig) -> RouteCfg {
        RouteCfg {
            experts: m.routed_experts as usize,
            groups: m.groups as usize,
            topk_groups: m.topk_groups as usize,
            topk: m.topk as usize,
            scaling: m.route_scaling as f64,
        }
    }

    /// The constraints the selection rule needs; the error names the field.
    pub fn validate(&self) -> Result<(), RefError> {
        let c = self;
        let bad = |field: &'static str, msg: String| Err(RefError::Config { field, msg });
        if c.groups == 0 || !c.experts.is_multiple_of(c.groups) || c.experts / c.groups < 2 {
            return bad(
                "model.groups",
                format!(
                    "{} experts do not split into {} groups of at least 2",
                    c.experts, c.groups
                ),
            );
        }
        if c.topk_groups == 0 || c.topk_groups > c.groups {
            return bad(
                "model.topk_groups",
                format!("{} not in 1..={}", c.topk_groups, c.groups),
            );
        }
        if c.topk == 0 || c.topk > c.topk_groups * (c.experts / c.groups) {
            return bad(
                "model.topk",
                format!(
                    "top-{} does not fit in {} groups of {}",
                    c.topk,
                    c.topk_groups,
                    c.experts / c.groups
                ),
            );
        }
        Ok(())
    }
}

/// The experts one token selects (in selection order: best biased score first) from its gate
/// scores `scores` (`sigmoid(logits)`) and the selection bias. `c` must be valid
/// ([`RouteCfg::validate`]); lengths must be `c.experts`.
pub fn route(scores: &[f64], bias: &[f64], c: &RouteCfg) -> Vec<usize> {
    let eg = c.experts / c.groups;
    let mut b: Vec<f64> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
    let mut gs: Vec<f64> = (0..c.groups)
        .map(|g| {
            let (mut m1, mut m2) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
            for &v in &b[g * eg..(g + 1) * eg] {
                if v > m1 {
                    m2 = m1;
                    m1 = v;
                } else if v > m2 {
                    m2 = v;
                }
            }
            m1 + m2
        })
        .collect();
    let mut kept = vec![false; c.groups];
    for _ in 0..c.topk_groups {
        let g = argmax(&gs);
        gs[g] = f64::NEG_INFINITY;
        kept[g] = true;
    }
    for (e, v) in b.iter_mut().enumerate() {
        if !kept[e / eg] {
            *v = f64::NEG_INFINITY;
        }
    }
    (0..c.topk)
        .map(|_| {
            let e = argmax(&b);
            b[e] = f64::NEG_INFINITY;
            e
        })
        .collect()
}

/// Index of the largest value; the lowest index among equals (strict `>` scanning upwards).
fn argmax(v: &[f64]) -> usize {
    let (mut best, mut bi) = (f64::NEG_INFINITY, 0);
    for (i, &x) in v.iter().enumerate() {
        if x > best {
            best = x;
            bi = i;
        }
    }
    bi
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// One MoE layer's weights as the reference reads them.
pub(crate) struct MoeW {
    /// `[E, H]` BF16-operand GEMM (logits kept unrounded: the device's are f32).
    pub gate: Linear,
    pub bias: Vec<f64>,
    pub experts: Vec<FfnW>,
    pub shared: Option<FfnW>,
    pub rc: RouteCfg,
}

/// What the backward needs of one MoE forward.
pub(crate) struct MoeCache {
    /// The gate GEMM's input as read (BF16 when modelled).
    fr: Mat,
    /// The experts' input (FP8 1x128 when modelled).
    xin: Mat,
    /// `[N, E]` sigmoid scores.
    sig: Mat,
    /// Per token the selected experts and their routing weights.
    pub sel: Vec<Vec<usize>>,
    wts: Vec<Vec<f64>>,
    segs: Vec<Segment>,
    caches: Vec<Vec<RowCache>>,
    shared_segs: Vec<Segment>,
    shared_caches: Vec<Vec<RowCache>>,
}

impl MoeCache {
    /// Tokens routed to each expert.
    pub fn load(&self) -> Vec<u64> {
        self.segs.iter().map(|s| s.rows.len() as u64).collect()
    }
}

/// The layer's gradients.
pub(crate) struct MoeGrad {
    pub gate: Vec<f64>,
    pub experts: Vec<ffn::FfnGrad>,
    pub shared: Option<ffn::FfnGrad>,
}

/// Forward over `f` `[N, H]` (the FFN norm's output; rows grouped by EP rank, `ranks` their
/// row ranges): `y = shared(f) + sum_k w_k expert_k(f)`.
pub(crate) fn forward(w: &MoeW, f: &Mat, ranks: &[Range<usize>], pr: Prec) -> (Mat, MoeCache) {
    let (n, e_n) = (f.rows, w.rc.experts);
    let (fr, logits) = w.gate.forward(f);
    let mut sig = logits;
    sig.data.iter_mut().for_each(|v| *v = sigmoid(*v));
    let mut xin = Mat::zeros(n, f.cols);
    for t in 0..n {
        xin.row_mut(t)
            .copy_from_slice(&ffn::q_row(f.row(t), pr.fp8));
    }
    let mut segs = vec![Segment::default(); e_n];
    let (mut sel, mut wts) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for t in 0..n {
        let s = sig.row(t);
        let chosen = route(s, &w.bias, &w.rc);
        let sum: f64 = chosen.iter().map(|&e| s[e]).sum();
        let wt: Vec<f64> = chosen.iter().map(|&e| s[e] / sum * w.rc.scaling).collect();
        for (&e, &wk) in chosen.iter().zip(&wt) {
            segs[e].rows.push(t);
            segs[e].w.push(wk);
        }
        sel.push(chosen);
        wts.push(wt);
    }
    let mut y = Mat::zeros(n, f.cols);
    let caches = segs
        .iter()
        .zip(&w.experts)
        .map(|(sg, ew)| ffn::forward(ew, &xin, sg, pr, &mut y))
        .collect();
    let shared_segs: Vec<Segment> = match w.shared {
        Some(_) => ranks.iter().map(|r| whole(r.clone())).collect(),
        None => Vec::new(),
    };
    let shared_caches = match &w.shared {
        Some(sw) => shared_segs
            .iter()
            .map(|sg| ffn::forward(sw, &xin, sg, pr, &mut y))
            .collect(),
        None => Vec::new(),
    };
    let cache = MoeCache {
        fr,
        xin,
        sig,
        sel,
        wts,
        segs,
        caches,
        shared_segs,
        shared_caches,
    };
    (y, cache)
}

/// Every row of `r`, weight 1.
pub(crate) fn whole(r: Range<usize>) -> Segment {
    let n = r.len();
    Segment {
        rows: r.collect(),
        w: vec![1.0; n],
    }
}

/// Backward given `dy` `[N, H]`: returns `df` and the layer's gradients.
pub(crate) fn backward(w: &MoeW, c: &MoeCache, dy: &Mat, pr: Prec) -> (Mat, MoeGrad) {
    let (n, h, e_n) = (dy.rows, dy.cols, w.rc.experts);
    let mut dx = Mat::zeros(n, h);
    // d(loss)/d(routing weight) of every (token, selected slot)
    let mut dw: Vec<Vec<f64>> = c.sel.iter().map(|s| vec![0.0; s.len()]).collect();
    let mut experts = Vec::with_capacity(e_n);
    for (e, ((sg, ew), rc)) in c.segs.iter().zip(&w.experts).zip(&c.caches).enumerate() {
        let (g, dwr) = ffn::backward(ew, &c.xin, sg, rc, dy, pr, &mut dx);
        for (&t, d) in sg.rows.iter().zip(dwr) {
            if let Some(k) = c.sel[t].iter().position(|&x| x == e) {
                dw[t][k] = d;
            }
        }
        experts.push(g);
    }
    let shared = w.shared.as_ref().map(|sw| {
        let mut acc: Option<ffn::FfnGrad> = None;
        for (sg, rc) in c.shared_segs.iter().zip(&c.shared_caches) {
            let (g, _) = ffn::backward(sw, &c.xin, sg, rc, dy, pr, &mut dx);
            acc = Some(match acc {
                None => g,
                Some(mut a) => {
                    add(&mut a.w1, &g.w1);
                    add(&mut a.w2, &g.w2);
                    a
                }
            });
        }
        acc.unwrap_or(ffn::FfnGrad {
            w1: vec![0.0; sw.w1.len()],
            w2: vec![0.0; sw.w2.len()],
        })
    });
    // routing weights w_k = scaling s_k / S: ds_j = (scaling dw_j - sum_k dw_k w_k) / S, then
    // through the sigmoid
    let mut dlogits = Mat::zeros(n, e_n);
    for (t, dwt) in dw.iter().enumerate() {
        let r = RouteRow {
            sig: c.sig.row(t),
            sel: &c.sel[t],
            wts: &c.wts[t],
        };
        r.dlogits(dwt, w.rc.scaling, dlogits.row_mut(t));
    }
    let mut gate = vec![0.0; e_n * h];
    let dxg = w.gate.backward(&dlogits, &c.fr, &mut gate);
    dx.add_assign(&dxg);
    let g = MoeGrad {
        gate,
        experts,
        shared,
    };
    (dx, g)
}

/// One token's routing: its sigmoid scores, selected experts and their routing weights.
pub(crate) struct RouteRow<'a> {
    pub sig: &'a [f64],
    pub sel: &'a [usize],
    pub wts: &'a [f64],
}

impl RouteRow<'_> {
    /// The gate logits' gradient given the routing weights' `dw`: with `w_k = scaling s_k / S`,
    /// `ds_j = (scaling dw_j - sum_k dw_k w_k) / S`, then through the sigmoid; zero for the
    /// experts not selected.
    pub fn dlogits(&self, dw: &[f64], scaling: f64, out: &mut [f64]) {
        let s = self.sig;
        let sum: f64 = self.sel.iter().map(|&e| s[e]).sum();
        let a: f64 = dw.iter().zip(self.wts).map(|(d, w)| d * w).sum();
        for (k, &e) in self.sel.iter().enumerate() {
            let ds = (scaling * dw[k] - a) / sum;
            out[e] = ds * s[e] * (1.0 - s[e]);
        }
    }
}

pub(crate) fn add(a: &mut [f64], b: &[f64]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The top-k weights' backward agrees with `ep`'s f64 reference of the device kernel, and
    /// the selection with `ep`'s f32 CPU routing wherever the biased scores are not near-ties.
    #[test]
    fn routing_and_its_backward_agree_with_ep() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let rc = RouteCfg {
            experts: 16,
            groups: 4,
            topk_groups: 2,
            topk: 4,
            scaling: 2.5,
        };
        let ec = ep::RoutingCfg {
            experts: 16,
            groups: 4,
            topk_groups: 2,
            topk: 4,
            scaling: 2.5,
        };
        let (t_n, e_n, kk) = (200, 16, 4);
        let logits: Vec<f32> = (0..t_n * e_n).map(|_| rng.gen_range(-3.0..3.0)).collect();
        let bias: Vec<f32> = (0..e_n).map(|_| rng.gen_range(-0.1..0.1)).collect();
        let b64: Vec<f64> = bias.iter().map(|&b| b as f64).collect();
        let ep_out = ep::routing::route_ref(&logits, &bias, &ec).unwrap();
        let (mut same, mut idx, mut w, mut dwv) = (0, Vec::new(), Vec::new(), Vec::new());
        let mut mine = Vec::new();
        for t in 0..t_n {
            let sig: Vec<f64> = logits[t * e_n..(t + 1) * e_n]
                .iter()
                .map(|&x| sigmoid(x as f64))
                .collect();
            let sel = route(&sig, &b64, &rc);
            same += (sel.iter().map(|&e| e as i32).collect::<Vec<_>>()
                == ep_out.idx[t * kk..(t + 1) * kk]) as usize;
            let sum: f64 = sel.iter().map(|&e| sig[e]).sum();
            let wts: Vec<f64> = sel.iter().map(|&e| sig[e] / sum * 2.5).collect();
            let dw: Vec<f32> = (0..kk).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let dw64: Vec<f64> = dw.iter().map(|&d| d as f64).collect();
            let mut out = vec![0.0; e_n];
            let row = RouteRow {
                sig: &sig,
                sel: &sel,
                wts: &wts,
            };
            row.dlogits(&dw64, 2.5, &mut out);
            mine.extend(out);
            idx.extend(sel.iter().map(|&e| e as i32));
            w.extend(wts.iter().map(|&x| x as f32));
            dwv.extend(dw);
        }
        assert!(same >= t_n - 2, "{same} of {t_n} tokens route as ep does");
        let want = ep::grad::route_backward_ref(&logits, &idx, &w, &dwv, &ec).unwrap();
        for (a, b) in mine.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }
}
