//! The 1-depth multi-token-prediction module (V3's MTP, `model.mtp_depth = 1`) on the last
//! stage's ranks, forward and backward. For token `i` of a sequence, with `h_i` the main
//! model's last hidden state (the residual stream before the final norm) and `t_{i+1}` the next
//! input token (= the main model's label at `i`):
//!
//! ```text
//! h'_i  = M [RMSNorm(h_i; mtp.hnorm) ; RMSNorm(Emb(t_{i+1}); mtp.enorm)]      M = mtp.proj [H, 2H]
//! y_i   = Block(h')_i                          attention + dense FFN (mtp.attn*, mtp.ffn*)
//! p_i   = softmax(RMSNorm(y_i; mtp.norm) head^T)   predicts t_{i+2}
//! ```
//!
//! `Emb` and `head` are the main model's (shared). The MTP cross-entropy is summed over the
//! tokens whose `t_{i+2}` lies in the same sequence and is labelled; its backward uses
//! `mtp_loss_weight x loss_scale` as the upstream gradient (V3: both losses are divided by the
//! same token count, the MTP one weighted by lambda). Under DualPipeV the last stage sits on
//! the first stage's pipeline rank (the V), so the embedding table is on its devices too: this
//! stage keeps a BF16 copy, and returns an `embed` gradient that the trainer adds to the first
//! stage's (`train::collect_grads`). The `head` gradient of the two heads is summed here (main
//! first, then MTP, on the device). `M x` runs as two BF16 GEMMs over the column halves of
//! `M` (`u = hn M_h^T` stored BF16, then `h' = en M_e^T + u`), so no concatenation is needed;
//! the halves are split and their gradients interleaved back on the host (permutations).
//! The MTP block reports its errors as layer `model.layers`.

use super::attn::{self, norm_bwd, norm_fwd, AttnAct, AttnConst, AttnW};
use super::devload::RankSrc;
use super::ffn::{self, DenseAct, DenseW};
use super::head::{self, EmbedW, HeadAct, HeadW};
use super::linear::{Ctx, Lin, Result};
use super::Dims;
use crate::data::IGNORE_INDEX;
use crate::params::Params;
use half::bf16;
use runtime::Buffer;
use std::collections::BTreeMap;

/// Names of the MTP gradients as they leave a rank: (parameter name, f32 values).
pub(crate) type NamedRankGrads = Vec<(String, Vec<f32>)>;

/// The MTP module's weights on one rank (with the shared embedding and head).
pub(crate) struct MtpW {
    embed: EmbedW,
    hnorm: Buffer<f32>,
    enorm: Buffer<f32>,
    /// Columns `0..H` and `H..2H` of `mtp.proj`.
    ph: Lin,
    pe: Lin,
    attn: AttnW,
    ffn: DenseW,
    head: HeadW,
    /// The block's index in error messages (`model.layers`).
    layer: usize,
}

/// Columns `cols` of a row-major `[rows, 2 half]` matrix.
fn half_cols(w: &[f32], rows: usize, half: usize, second: bool) -> Vec<f32> {
    let off = if second { half } else { 0 };
    (0..rows)
        .flat_map(|r| {
            w[r * 2 * half + off..r * 2 * half + off + half]
                .iter()
                .copied()
        })
        .collect()
}

/// `[rows, half] | [rows, half]` -> `[rows, 2 half]` (the projection's gradient).
fn join_cols(a: &[f32], b: &[f32], rows: usize, half: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(2 * rows * half);
    for r in 0..rows {
        out.extend_from_slice(&a[r * half..(r + 1) * half]);
        out.extend_from_slice(&b[r * half..(r + 1) * half]);
    }
    out
}

impl MtpW {
    /// Uploads the module (and the shared embedding and head) from `p` on one rank.
    pub fn upload(cx: &Ctx, d: &Dims, layer: usize, p: &Params) -> Result<MtpW> {
        let h = d.h;
        let named = |s: &str| -> Result<&[f32]> { Ok(p.get(&format!("mtp.{s}"))?) };
        let proj = named("proj")?;
        let ffn_w = [named("ffn_norm")?, named("ffn.w1")?, named("ffn.w2")?];
        Ok(MtpW {
            embed: EmbedW::upload(cx, d, p.get("embed")?)?,
            hnorm: cx.dev.upload(named("hnorm")?)?,
            enorm: cx.dev.upload(named("enorm")?)?,
            ph: Lin::upload(&cx.dev, &half_cols(proj, h, h, false), h, h)?,
            pe: Lin::upload(&cx.dev, &half_cols(proj, h, h, true), h, h)?,
            attn: AttnW::upload(cx, d, &named)?,
            ffn: DenseW::upload(cx, d, layer, ffn_w)?,
            head: HeadW::upload(cx, d, named("norm")?, p.get("head")?)?,
            layer,
        })
    }
}

impl MtpW {
    /// The module (and the shared embedding and head) from the device master weights
    /// ([`super::devload`]): bit for bit [`MtpW::upload`]'s weights.
    pub fn from_device(src: &RankSrc, d: &Dims, layer: usize) -> Result<MtpW> {
        let h = d.h;
        // `mtp.proj` [H, 2H] viewed as [2H, H]: row 2r is row r's first half, 2r + 1 its second
        let first: Vec<usize> = (0..h).map(|r| 2 * r).collect();
        let second: Vec<usize> = (0..h).map(|r| 2 * r + 1).collect();
        Ok(MtpW {
            embed: src.embed(d)?,
            hnorm: src.f32("mtp.hnorm")?,
            enorm: src.f32("mtp.enorm")?,
            ph: src.lin_rows("mtp.proj", h, &first)?,
            pe: src.lin_rows("mtp.proj", h, &second)?,
            attn: src.attn(d, "mtp.")?,
            ffn: src.dense(d, layer, "mtp.")?,
            head: src.head(d, "mtp.norm", "head")?,
            layer,
        })
    }
}

/// The MTP inputs and targets of one rank's tokens (whole sequences of `seq`): the id embedded
/// at `i` is `t_{i+1}` = `labels[i]` (0 where unlabelled: such a position's target and every
/// later one in its sequence are unlabelled too, so it feeds no loss); the target at `i` is
/// `labels[i + 1]` inside the sequence, `IGNORE_INDEX` at its last token.
pub(crate) fn targets(labels: &[i32], seq: usize) -> (Vec<i32>, Vec<i32>) {
    let ids = labels.iter().map(|&l| l.max(0)).collect();
    let tgt = (0..labels.len())
        .map(|i| match (i + 1) % seq.max(1) {
            0 => IGNORE_INDEX,
            _ => labels.get(i + 1).copied().unwrap_or(IGNORE_INDEX),
        })
        .collect();
    (ids, tgt)
}

/// What the MTP forward keeps on one rank.
pub(crate) struct MtpAct {
    x: Buffer<bf16>,
    rh: Buffer<f32>,
    hn: Buffer<bf16>,
    e: Buffer<bf16>,
    batch: kernels::TokenBatch,
    re: Buffer<f32>,
    en: Buffer<bf16>,
    attn: AttnAct,
    ffn: DenseAct,
    head: HeadAct,
}

/// MTP forward on one rank from the main model's last hidden state `x` (read, copied for the
/// backward) and the rank's main labels: the summed MTP cross-entropy (a 1-element f32 buffer on
/// the rank's device) and the saved state.
pub(crate) fn forward(
    cx: &Ctx,
    w: &MtpW,
    c: &AttnConst,
    d: &Dims,
    x: &Buffer<bf16>,
    labels: &[i32],
) -> Result<(Buffer<f32>, MtpAct)> {
    let (t, h) = (d.t, d.h);
    let (ids, tgt) = targets(labels, d.seq);
    let xc = cx.bf(t * h)?;
    cx.st.copy_bytes(x, &xc)?;
    let (e, batch) = head::embed_forward(cx, &w.embed, &ids)?;
    let (hn, rh) = norm_fwd(cx, &xc, &w.hnorm, (t, h, d.eps))?;
    let (en, re) = norm_fwd(cx, &e, &w.enorm, (t, h, d.eps))?;
    let u = w.ph.fwd(cx, &hn, t, None)?;
    let hp = w.pe.fwd(cx, &en, t, Some(&u))?;
    let (x1, attn) = attn::forward(cx, &w.attn, c, d, hp)?;
    let (y, ffn) = ffn::dense_forward(cx, &w.ffn, d, w.layer, x1)?;
    let (loss, head) = head::head_forward(cx, &w.head, d, y, &tgt)?;
    cx.sync()?;
    let act = MtpAct {
        x: xc,
        rh,
        hn,
        e,
        batch,
        re,
        en,
        attn,
        ffn,
        head,
    };
    Ok((loss, act))
}

/// MTP backward on one rank with upstream gradient `scale` (= weight x loss scale): the
/// gradient it sends into the main model's last hidden state, and the module's gradients
/// (`mtp.*`, plus its parts of the shared `head` and `embed`).
pub(crate) fn backward(
    cx: &Ctx,
    w: &MtpW,
    c: &AttnConst,
    d: &Dims,
    s: &MtpAct,
    scale: f32,
) -> Result<(Buffer<bf16>, NamedRankGrads)> {
    let (t, h) = (d.t, d.h);
    let (dy, hg) = head::head_backward(cx, &w.head, d, &s.head, scale)?;
    let (dx1, fg) = ffn::dense_backward(cx, &w.ffn, d, w.layer, &s.ffn, &dy)?;
    let (dhp, ag) = attn::backward(cx, &w.attn, c, d, &s.attn, &dx1)?;
    let dhn = w.ph.dgrad(cx, &dhp, t, None)?;
    let den = w.pe.dgrad(cx, &dhp, t, None)?;
    let g_ph = w.ph.wgrad(cx, &dhp, &s.hn, t)?;
    let g_pe = w.pe.wgrad(cx, &dhp, &s.en, t)?;
    let (de, g_en) = norm_bwd(cx, (&s.e, &w.enorm, &den, &s.re), (t, h, d.eps))?;
    let g_embed = head::embed_backward(cx, &w.embed, &s.batch, &de)?;
    let (dx, g_hn) = norm_bwd(cx, (&s.x, &w.hnorm, &dhn, &s.rh), (t, h, d.eps))?;
    cx.sync()?;
    let mut g: NamedRankGrads = vec![
        ("embed".into(), g_embed),
        ("mtp.hnorm".into(), g_hn),
        ("mtp.enorm".into(), g_en),
        ("mtp.proj".into(), join_cols(&g_ph, &g_pe, h, h)),
    ];
    g.extend(
        ag.into_iter()
            .chain(fg)
            .map(|(n, v)| (format!("mtp.{n}"), v)),
    );
    for (n, v) in hg {
        let name = if n == "head" { "head" } else { "mtp.norm" };
        g.push((name.to_string(), v));
    }
    Ok((dx, g))
}

/// The MTP module of a last stage: per rank its weights, per micro-batch the summed MTP
/// losses of the forwards not yet taken.
pub(crate) struct Mtp {
    pub w: Vec<MtpW>,
    /// `train.mtp_loss_weight`.
    pub weight: f32,
    pub losses: BTreeMap<usize, f64>,
}

impl Mtp {
    pub fn build(cxs: &[Ctx], d: &Dims, layer: usize, weight: f32, p: &Params) -> Result<Mtp> {
        Ok(Mtp {
            w: load_all(cxs, d, layer, p)?,
            weight,
            losses: BTreeMap::new(),
        })
    }
}

/// Every rank's [`MtpW`].
pub(crate) fn load_all(cxs: &[Ctx], d: &Dims, layer: usize, p: &Params) -> Result<Vec<MtpW>> {
    cxs.iter().map(|cx| MtpW::upload(cx, d, layer, p)).collect()
}

/// `a + b` (f32, in that order) on `cx`'s device: the main and MTP parts of a shared
/// parameter's gradient.
pub(crate) fn add_grads(cx: &Ctx, a: &[f32], b: &[f32]) -> Result<Vec<f32>> {
    let mut acc = a.to_vec();
    super::grads::add_into(cx, &mut acc, b)?;
    Ok(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_shift_by_one_inside_each_sequence() {
        let labels = [5, 6, 7, 8, 9, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX];
        let (ids, tgt) = targets(&labels, 4);
        assert_eq!(ids, vec![5, 6, 7, 8, 9, 0, 0, 0]);
        let ig = IGNORE_INDEX;
        assert_eq!(tgt, vec![6, 7, 8, ig, ig, ig, ig, ig]);
    }

    #[test]
    fn projection_halves_split_and_join_back() {
        let w: Vec<f32> = (0..12).map(|v| v as f32).collect(); // [2, 6]: halves of 3
        let (a, b) = (half_cols(&w, 2, 3, false), half_cols(&w, 2, 3, true));
        assert_eq!(a, vec![0., 1., 2., 6., 7., 8.]);
        assert_eq!(b, vec![3., 4., 5., 9., 10., 11.]);
        assert_eq!(join_cols(&a, &b, 2, 3), w);
    }
}
