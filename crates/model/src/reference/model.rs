//! The whole decoder over one micro-batch: embedding, the layers (attention, then the dense
//! FFN or the MoE layer, each behind its RMSNorm and residual), final norm, head and
//! cross-entropy; forward and backward, the gradients in [`crate::params::specs`] order.
//!
//! BF16 (when modelled): the embedding's and every BF16-GEMM weight's BF16 copy, the residual
//! stream (the device's boundary activations and norm inputs are BF16) and its gradient at every
//! layer boundary, the norms' input gradients; the head's logits stay unrounded (f32 on the
//! device), as do the FFN norm's outputs (the norm kernel quantises its f32 values to FP8).

use super::attn::{self, AttnCache, AttnDims, AttnW};
use super::ffn::{self, FfnW, Prec, RowCache, Segment};
use super::moe::{self, MoeCache, MoeW, RouteCfg};
use super::tensor::{rmsnorm, rmsnorm_bwd, Linear, Mat, Round};
use super::{RefError, RefOptions};
use crate::config::ModelConfig;
use crate::params::Params;
use std::ops::Range;

mod mtp;

/// One micro-batch flattened: token rows rank by rank, each rank's sequences in order.
pub(crate) struct Batch {
    pub ids: Vec<usize>,
    pub labels: Vec<i32>,
    pub ranks: Vec<Range<usize>>,
    pub seqs: Vec<Range<usize>>,
}

enum FfnW2 {
    Dense(FfnW),
    Moe(MoeW),
}

/// A layer's weights and its parameters' indices (`ffn`: dense `[w1, w2]`; MoE `[gate, e0.w1,
/// e0.w2, ..., shared.w1, shared.w2]`).
struct LayerW {
    attn_norm: Vec<f64>,
    attn: AttnW,
    ffn_norm: Vec<f64>,
    ffn: FfnW2,
    idx: [usize; 9],
    ffn_idx: Vec<usize>,
}

/// The model's weights as the reference reads them, and the precision model.
pub(crate) struct Model {
    d: AttnDims,
    h: usize,
    eps: f64,
    embed: Vec<f64>,
    layers: Vec<LayerW>,
    final_norm: Vec<f64>,
    head: Linear,
    /// Indices of `head` and `final_norm` (the MTP module's parameters follow them).
    i_head: usize,
    i_final_norm: usize,
    lens: Vec<usize>,
    pr: Prec,
    /// The MTP module (`model.mtp_depth = 1`).
    mtp: Option<mtp::MtpW>,
    /// Its loss weight (`train.mtp_loss_weight`).
    mtp_weight: f64,
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

impl Model {
    /// The model of `p`; `mtp_weight` weighs the MTP loss in the gradients (MTP models only).
    pub fn new(
        m: &ModelConfig,
        p: &Params,
        o: &RefOptions,
        mtp_weight: f64,
    ) -> Result<Model, RefError> {
        let rd = Round(o.bf16);
        let (h, vocab) = (m.hidden as usize, m.vocab as usize);
        let d = AttnDims {
            nh: m.heads as usize,
            dn: m.qk_nope_head_dim as usize,
            dr: m.qk_rope_head_dim as usize,
            dv: m.v_head_dim as usize,
            kvl: m.kv_lora_rank as usize,
            eps: m.norm_eps as f64,
            theta: m.rope_theta as f64,
        };
        let layers = (0..m.layers as usize)
            .map(|l| layer(m, p, l, o))
            .collect::<Result<_, _>>()?;
        Ok(Model {
            d,
            h,
            eps: m.norm_eps as f64,
            embed: rd.vec_f32(p.get("embed")?),
            layers,
            final_norm: f64s(p.get("final_norm")?),
            head: Linear::new(p.get("head")?, vocab, h, rd),
            i_head: p.index("head")?,
            i_final_norm: p.index("final_norm")?,
            lens: p.specs.iter().map(|s| s.len()).collect(),
            pr: Prec { fp8: o.fp8, rd },
            mtp: match m.mtp_depth {
                0 => None,
                _ => Some(mtp::MtpW::new(m, p, o)?),
            },
            mtp_weight,
        })
    }
}

fn layer(m: &ModelConfig, p: &Params, l: usize, o: &RefOptions) -> Result<LayerW, RefError> {
    let dense = l < m.dense_layers as usize;
    block(m, p, &format!("layers.{l}."), dense, o)
}

/// A decoder block's weights from the parameters named `{prefix}{suffix}` (dense: `ffn.*`,
/// else `moe.*`).
fn block(
    m: &ModelConfig,
    p: &Params,
    prefix: &str,
    dense: bool,
    o: &RefOptions,
) -> Result<LayerW, RefError> {
    let rd = Round(o.bf16);
    let name = |n: &str| format!("{prefix}{n}");
    let get = |n: &str| p.get(&name(n));
    let idx = |n: &str| p.index(&name(n));
    let lin = |n: &str, out: usize, inp: usize| -> Result<Linear, RefError> {
        Ok(Linear::new(get(n)?, out, inp, rd))
    };
    let h = m.hidden as usize;
    let (nh, dn, dr, dv) = (
        m.heads as usize,
        m.qk_nope_head_dim as usize,
        m.qk_rope_head_dim as usize,
        m.v_head_dim as usize,
    );
    let (ql, kvl) = (m.q_lora_rank as usize, m.kv_lora_rank as usize);
    let attn = AttnW {
        wq_a: lin("attn.wq_a", ql, h)?,
        q_norm: f64s(get("attn.q_norm")?),
        wq_b: lin("attn.wq_b", nh * (dn + dr), ql)?,
        wkv_a: lin("attn.wkv_a", kvl + dr, h)?,
        kv_norm: f64s(get("attn.kv_norm")?),
        wkv_b: lin("attn.wkv_b", nh * (dn + dv), kvl)?,
        wo: lin("attn.wo", h, nh * dv)?,
    };
    let names = [
        "attn_norm",
        "attn.wq_a",
        "attn.q_norm",
        "attn.wq_b",
        "attn.wkv_a",
        "attn.kv_norm",
        "attn.wkv_b",
        "attn.wo",
        "ffn_norm",
    ];
    let mut ix = [0usize; 9];
    for (slot, n) in ix.iter_mut().zip(names) {
        *slot = idx(n)?;
    }
    let ffn_w = |a: &str, b: &str, i: usize| -> Result<FfnW, RefError> {
        Ok(FfnW::new(get(a)?, get(b)?, h, i, o.fp8))
    };
    let (ffn, ffn_idx) = if dense {
        let i = m.dense_intermediate as usize;
        let w = ffn_w("ffn.w1", "ffn.w2", i)?;
        (FfnW2::Dense(w), vec![idx("ffn.w1")?, idx("ffn.w2")?])
    } else {
        let (e_n, i) = (m.routed_experts as usize, m.expert_intermediate as usize);
        let mut fi = vec![idx("moe.gate")?];
        let mut experts = Vec::with_capacity(e_n);
        for e in 0..e_n {
            let (a, b) = (format!("moe.experts.{e}.w1"), format!("moe.experts.{e}.w2"));
            experts.push(ffn_w(&a, &b, i)?);
            fi.extend([idx(&a)?, idx(&b)?]);
        }
        let shared = if m.shared_experts > 0 {
            fi.extend([idx("moe.shared.w1")?, idx("moe.shared.w2")?]);
            Some(ffn_w("moe.shared.w1", "moe.shared.w2", i)?)
        } else {
            None
        };
        let w = MoeW {
            gate: lin("moe.gate", e_n, h)?,
            bias: f64s(get("moe.bias")?),
            experts,
            shared,
            rc: RouteCfg::of(m),
        };
        (FfnW2::Moe(w), fi)
    };
    Ok(LayerW {
        attn_norm: f64s(get("attn_norm")?),
        attn,
        ffn_norm: f64s(get("ffn_norm")?),
        ffn,
        idx: ix,
        ffn_idx,
    })
}

enum FfnCache {
    Dense {
        xin: Mat,
        segs: Vec<Segment>,
        caches: Vec<Vec<RowCache>>,
    },
    Moe(MoeCache),
}

struct LayerCache {
    x: Mat,
    a_rstd: Vec<f64>,
    attn: AttnCache,
    x1: Mat,
    f_rstd: Vec<f64>,
    ffn: FfnCache,
}

/// One micro-batch's results.
pub(crate) struct MbResult {
    /// Summed cross-entropy (nats) over the labelled tokens.
    pub loss: f64,
    /// Per token row (0 where unlabelled).
    pub token_losses: Vec<f64>,
    /// Per MoE layer, per token, the selected experts (concatenated).
    pub routes: Vec<usize>,
    /// Per MoE layer (global index) tokens per expert.
    pub loads: Vec<(usize, Vec<u64>)>,
    /// Gradients of `scale x (loss + mtp_weight x mtp_loss)` in parameter order (with
    /// `backward`).
    pub grads: Option<Vec<Vec<f64>>>,
    /// The summed MTP cross-entropy (nats; 0 without an MTP module).
    pub mtp_loss: f64,
}

impl Model {
    /// Forward (and with `backward` the backward of `scale` times the summed loss) of `b`.
    pub fn run(&self, b: &Batch, scale: f64, backward: bool) -> MbResult {
        let (rd, n) = (self.pr.rd, b.ids.len());
        let mut x = Mat::zeros(n, self.h);
        for (t, &id) in b.ids.iter().enumerate() {
            x.row_mut(t)
                .copy_from_slice(&self.embed[id * self.h..(id + 1) * self.h]);
        }
        let mut caches = Vec::with_capacity(self.layers.len());
        let (mut routes, mut loads) = (Vec::new(), Vec::new());
        for (l, lw) in self.layers.iter().enumerate() {
            let (x2, c) = self.layer_forward(lw, x, b);
            if let FfnCache::Moe(mc) = &c.ffn {
                routes.extend(mc.sel.iter().flatten().copied());
                loads.push((l, mc.load()));
            }
            caches.push(c);
            x = x2;
        }
        let mtp = self.mtp.as_ref().map(|w| {
            let c = w.forward(self, &x, b, scale * self.mtp_weight);
            (w, c)
        });
        let mtp_loss = mtp.as_ref().map_or(0.0, |(_, c)| c.loss);
        let (xf, rstd) = rmsnorm(&x, &self.final_norm, self.eps);
        let (xfr, logits) = self.head.forward(&xf);
        let (loss, token_losses, dlogits) = cross_entropy(&logits, &b.labels, scale);
        let grads = backward.then(|| {
            let mut g: Vec<Vec<f64>> = self.lens.iter().map(|&n| vec![0.0; n]).collect();
            let (ih, inorm) = (self.i_head, self.i_final_norm);
            let dxf = self.head.backward(&dlogits, &xfr, &mut g[ih]);
            let mut dx = rmsnorm_bwd(&dxf, &x, &self.final_norm, &rstd, &mut g[inorm]);
            rd.in_place(&mut dx);
            if let Some((w, c)) = mtp {
                dx.add_assign(&w.backward(self, c, &x, b, &mut g));
                rd.in_place(&mut dx);
            }
            for (lw, c) in self.layers.iter().zip(caches).rev() {
                dx = self.layer_backward(lw, c, dx, b, &mut g);
            }
            for (t, &id) in b.ids.iter().enumerate() {
                moe::add(&mut g[0][id * self.h..(id + 1) * self.h], dx.row(t));
            }
            g
        });
        MbResult {
            loss,
            token_losses,
            routes,
            loads,
            grads,
            mtp_loss,
        }
    }

    fn layer_forward(&self, lw: &LayerW, x: Mat, b: &Batch) -> (Mat, LayerCache) {
        let rd = self.pr.rd;
        let (a, a_rstd) = rmsnorm(&x, &lw.attn_norm, self.eps);
        let (ao, attn) = attn::forward(&self.d, &lw.attn, &a, &b.seqs, rd);
        let mut x1 = x.clone();
        x1.add_assign(&ao);
        rd.in_place(&mut x1);
        let (f, f_rstd) = rmsnorm(&x1, &lw.ffn_norm, self.eps);
        let (mut y, ffn) = match &lw.ffn {
            FfnW2::Dense(w) => {
                let mut xin = Mat::zeros(f.rows, f.cols);
                for t in 0..f.rows {
                    xin.row_mut(t)
                        .copy_from_slice(&ffn::q_row(f.row(t), self.pr.fp8));
                }
                let segs: Vec<Segment> = b.ranks.iter().map(|r| moe::whole(r.clone())).collect();
                let mut y = Mat::zeros(f.rows, f.cols);
                let caches = segs
                    .iter()
                    .map(|s| ffn::forward(w, &xin, s, self.pr, &mut y))
                    .collect();
                (y, FfnCache::Dense { xin, segs, caches })
            }
            FfnW2::Moe(w) => {
                let (y, c) = moe::forward(w, &f, &b.ranks, self.pr);
                (y, FfnCache::Moe(c))
            }
        };
        rd.in_place(&mut y);
        let mut x2 = x1.clone();
        x2.add_assign(&y);
        rd.in_place(&mut x2);
        let c = LayerCache {
            x,
            a_rstd,
            attn,
            x1,
            f_rstd,
            ffn,
        };
        (x2, c)
    }

    /// Backward of one layer given the gradient of its output: returns its input's gradient.
    fn layer_backward(
        &self,
        lw: &LayerW,
        c: LayerCache,
        dx2: Mat,
        b: &Batch,
        g: &mut [Vec<f64>],
    ) -> Mat {
        let (rd, pr) = (self.pr.rd, self.pr);
        let df = match (&lw.ffn, &c.ffn) {
            (FfnW2::Dense(w), FfnCache::Dense { xin, segs, caches }) => {
                let mut df = Mat::zeros(dx2.rows, dx2.cols);
                for (s, rc) in segs.iter().zip(caches) {
                    let (fg, _) = ffn::backward(w, xin, s, rc, &dx2, pr, &mut df);
                    moe::add(&mut g[lw.ffn_idx[0]], &fg.w1);
                    moe::add(&mut g[lw.ffn_idx[1]], &fg.w2);
                }
                df
            }
            (FfnW2::Moe(w), FfnCache::Moe(mc)) => {
                let (df, mg) = moe::backward(w, mc, &dx2, pr);
                moe::add(&mut g[lw.ffn_idx[0]], &mg.gate);
                let per = mg.experts.iter().chain(mg.shared.iter());
                for (k, eg) in per.enumerate() {
                    moe::add(&mut g[lw.ffn_idx[1 + 2 * k]], &eg.w1);
                    moe::add(&mut g[lw.ffn_idx[2 + 2 * k]], &eg.w2);
                }
                df
            }
            // `layer_forward` builds the cache from the same variant of `lw.ffn`
            _ => unreachable!("a layer's cache has the kind of its weights"),
        };
        let mut dfn = rmsnorm_bwd(&df, &c.x1, &lw.ffn_norm, &c.f_rstd, &mut g[lw.idx[8]]);
        rd.in_place(&mut dfn);
        let mut dx1 = dx2;
        dx1.add_assign(&dfn);
        rd.in_place(&mut dx1);
        let (da, ag) = attn::backward(&self.d, &lw.attn, &c.attn, &dx1, &b.seqs, rd);
        let i = &lw.idx;
        for (k, v) in [
            (i[1], ag.wq_a),
            (i[2], ag.q_norm),
            (i[3], ag.wq_b),
            (i[4], ag.wkv_a),
            (i[5], ag.kv_norm),
            (i[6], ag.wkv_b),
            (i[7], ag.wo),
        ] {
            moe::add(&mut g[k], &v);
        }
        let mut dan = rmsnorm_bwd(&da, &c.x, &lw.attn_norm, &c.a_rstd, &mut g[i[0]]);
        rd.in_place(&mut dan);
        let mut dx = dx1;
        dx.add_assign(&dan);
        rd.in_place(&mut dx);
        dx
    }
}

/// Summed cross-entropy over the labelled rows, per-row losses, and `scale` x its gradient
/// with respect to the logits.
fn cross_entropy(logits: &Mat, labels: &[i32], scale: f64) -> (f64, Vec<f64>, Mat) {
    let mut dl = Mat::zeros(logits.rows, logits.cols);
    let mut per = vec![0.0; logits.rows];
    for (t, &lab) in labels.iter().enumerate() {
        let Ok(lab) = usize::try_from(lab) else {
            continue;
        };
        let z = logits.row(t);
        let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let se: f64 = z.iter().map(|v| (v - m).exp()).sum();
        let lse = m + se.ln();
        per[t] = lse - z[lab];
        for (j, d) in dl.row_mut(t).iter_mut().enumerate() {
            *d = ((z[j] - lse).exp() - (j == lab) as u8 as f64) * scale;
        }
    }
    (per.iter().sum(), per, dl)
}
