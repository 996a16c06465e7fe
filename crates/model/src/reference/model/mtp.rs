//! The reference's 1-depth MTP module (`model.mtp_depth = 1`): for token `i` of a sequence,
//! `h'_i = M [RMSNorm(h_i; hnorm) ; RMSNorm(Emb(t_{i+1}); enorm)]` (`h` the main model's last
//! residual stream, `t_{i+1}` its label at `i`), one decoder block with a dense FFN, then
//! `RMSNorm(.; mtp.norm)` and the main model's head predicting `t_{i+2}` (the label at `i+1`
//! inside the same sequence). Embedding and head are the main model's: their gradients
//! accumulate into the same tensors.
//!
//! BF16 (when modelled) where the device stores: the two norm outputs (GEMM operands), the
//! first half of the projection `bf16(hn M_h^T)` (the device runs `M` as two GEMMs over its
//! column halves, the second adding the first's BF16 output), `h'`, the projection's input
//! gradients and the norms' input gradients.

use super::super::tensor::{rmsnorm, rmsnorm_bwd, Mat, Round};
use super::super::{moe, RefError, RefOptions};
use super::{block, cross_entropy, Batch, LayerCache, LayerW, Model};
use crate::config::ModelConfig;
use crate::data::IGNORE_INDEX;
use crate::params::Params;

/// The MTP module's weights and its parameters' indices.
pub(crate) struct MtpW {
    hnorm: Vec<f64>,
    enorm: Vec<f64>,
    /// `[H, 2H]`, BF16-rounded when modelled.
    proj: Vec<f64>,
    block: LayerW,
    norm: Vec<f64>,
    /// Indices of `mtp.hnorm`, `mtp.enorm`, `mtp.proj`, `mtp.norm`.
    idx: [usize; 4],
}

/// What the MTP forward keeps.
pub(crate) struct MtpCache {
    pub loss: f64,
    ids: Vec<usize>,
    hn: Mat,
    h_rstd: Vec<f64>,
    e: Mat,
    en: Mat,
    e_rstd: Vec<f64>,
    block: LayerCache,
    y: Mat,
    y_rstd: Vec<f64>,
    yn: Mat,
    dlogits: Mat,
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// The embedded ids (`t_{i+1}`, 0 where unlabelled) and the targets (`t_{i+2}`) of `b`.
fn shifted(b: &Batch) -> (Vec<usize>, Vec<i32>) {
    let n = b.labels.len();
    let ids = b.labels.iter().map(|&l| l.max(0) as usize).collect();
    let mut tgt = vec![IGNORE_INDEX; n];
    for s in b.seqs.iter().filter(|s| s.end > s.start) {
        // inside a sequence the target at i is the label at i + 1; its last token has none
        tgt[s.start..s.end - 1].copy_from_slice(&b.labels[s.start + 1..s.end]);
    }
    (ids, tgt)
}

impl MtpW {
    pub fn new(m: &ModelConfig, p: &Params, o: &RefOptions) -> Result<MtpW, RefError> {
        let g = |n: &str| p.get(&format!("mtp.{n}"));
        let i = |n: &str| p.index(&format!("mtp.{n}"));
        Ok(MtpW {
            hnorm: f64s(g("hnorm")?),
            enorm: f64s(g("enorm")?),
            proj: Round(o.bf16).vec_f32(g("proj")?),
            block: block(m, p, "mtp.", true, o)?,
            norm: f64s(g("norm")?),
            idx: [i("hnorm")?, i("enorm")?, i("proj")?, i("norm")?],
        })
    }

    /// `h' = bf16(en M_e^T + bf16(hn M_h^T))` row by row.
    fn project(&self, hn: &Mat, en: &Mat, rd: Round) -> Mat {
        let h = hn.cols;
        let mut out = Mat::zeros(hn.rows, h);
        for t in 0..hn.rows {
            let (a, b) = (hn.row(t), en.row(t));
            for (o, v) in out.row_mut(t).iter_mut().enumerate() {
                let w = &self.proj[o * 2 * h..(o + 1) * 2 * h];
                let u: f64 = (0..h).map(|j| w[j] * a[j]).sum();
                let s: f64 = (0..h).map(|j| w[h + j] * b[j]).sum();
                *v = rd.r(s + rd.r(u));
            }
        }
        out
    }

    /// Forward from the main model's last residual stream `x`; the MTP cross-entropy's
    /// gradient w.r.t. the logits is scaled by `scale`.
    pub fn forward(&self, md: &Model, x: &Mat, b: &Batch, scale: f64) -> MtpCache {
        let (rd, h, eps) = (md.pr.rd, md.h, md.eps);
        let (ids, tgt) = shifted(b);
        let mut e = Mat::zeros(x.rows, h);
        for (t, &id) in ids.iter().enumerate() {
            e.row_mut(t)
                .copy_from_slice(&md.embed[id * h..(id + 1) * h]);
        }
        let (hn, h_rstd) = rmsnorm(x, &self.hnorm, eps);
        let (en, e_rstd) = rmsnorm(&e, &self.enorm, eps);
        let (hn, en) = (rd.mat(&hn), rd.mat(&en));
        let hp = self.project(&hn, &en, rd);
        let (y, block) = md.layer_forward(&self.block, hp, b);
        let (yn0, y_rstd) = rmsnorm(&y, &self.norm, eps);
        let (yn, logits) = md.head.forward(&yn0);
        let (loss, _, dlogits) = cross_entropy(&logits, &tgt, scale);
        MtpCache {
            loss,
            ids,
            hn,
            h_rstd,
            e,
            en,
            e_rstd,
            block,
            y,
            y_rstd,
            yn,
            dlogits,
        }
    }

    /// Backward: adds the module's gradients (and its parts of `head` and `embed`) to `g`;
    /// returns the gradient of the main model's last residual stream `x` (BF16 when modelled).
    pub fn backward(&self, md: &Model, c: MtpCache, x: &Mat, b: &Batch, g: &mut [Vec<f64>]) -> Mat {
        let (rd, h) = (md.pr.rd, md.h);
        let [ih, ie, ip, inorm] = self.idx;
        let dyn_ = md.head.backward(&c.dlogits, &c.yn, &mut g[md.i_head]);
        let mut dy = rmsnorm_bwd(&dyn_, &c.y, &self.norm, &c.y_rstd, &mut g[inorm]);
        rd.in_place(&mut dy);
        let dhp = rd.mat(&md.layer_backward(&self.block, c.block, dy, b, g));
        let (mut dhn, mut den) = (Mat::zeros(x.rows, h), Mat::zeros(x.rows, h));
        for t in 0..x.rows {
            let d = dhp.row(t);
            for (o, &dv) in d.iter().enumerate() {
                let w = &self.proj[o * 2 * h..(o + 1) * 2 * h];
                let gw = &mut g[ip][o * 2 * h..(o + 1) * 2 * h];
                for j in 0..h {
                    gw[j] += dv * c.hn.row(t)[j];
                    gw[h + j] += dv * c.en.row(t)[j];
                    dhn.row_mut(t)[j] += dv * w[j];
                    den.row_mut(t)[j] += dv * w[h + j];
                }
            }
        }
        rd.in_place(&mut dhn);
        rd.in_place(&mut den);
        let mut de = rmsnorm_bwd(&den, &c.e, &self.enorm, &c.e_rstd, &mut g[ie]);
        rd.in_place(&mut de);
        for (t, &id) in c.ids.iter().enumerate() {
            moe::add(&mut g[0][id * h..(id + 1) * h], de.row(t));
        }
        let mut dx = rmsnorm_bwd(&dhn, x, &self.hnorm, &c.h_rstd, &mut g[ih]);
        rd.in_place(&mut dx);
        dx
    }
}
