//! The ends of the model on one rank: the embedding gather (first stage) and the final norm,
//! the output head and the summed cross-entropy (last stage), forward and backward.

use super::attn::{norm_bwd, norm_fwd};
use super::linear::{Ctx, Lin, Result, WithGrads};
use super::Dims;
use half::bf16;
use kernels::train::ops;
use kernels::{EmbedSpec, Labels, TokenBatch, XentGrad, XentSpec};
use runtime::Buffer;

/// The embedding table in BF16 on one rank.
pub(crate) struct EmbedW {
    table: Buffer<bf16>,
    spec: EmbedSpec,
}

impl EmbedW {
    pub fn upload(cx: &Ctx, d: &Dims, table: &[f32]) -> Result<EmbedW> {
        let b: Vec<bf16> = table.iter().map(|&v| bf16::from_f32(v)).collect();
        Ok(EmbedW::with_table(d, cx.dev.upload(&b)?))
    }

    /// The embedding over a BF16 `table` `[vocab, H]` already on the device.
    pub fn with_table(d: &Dims, table: Buffer<bf16>) -> EmbedW {
        EmbedW {
            table,
            spec: EmbedSpec {
                vocab: d.vocab,
                hidden: d.h,
            },
        }
    }
}

/// `x [T, H]` = the table's rows of `ids` (validated against the vocabulary), and the batch
/// the backward scatters through.
pub(crate) fn embed_forward(
    cx: &Ctx,
    w: &EmbedW,
    ids: &[i32],
) -> Result<(Buffer<bf16>, TokenBatch)> {
    let batch = TokenBatch::new(&cx.dev, ids, &w.spec)?;
    let mut x = cx.bf(ids.len() * w.spec.hidden)?;
    kernels::embed_fwd(&cx.st, &batch, &w.table, &mut x)?;
    Ok((x, batch))
}

/// The table's gradient `[vocab, H]` f32 from `dx [T, H]` (deterministic scatter-add).
pub(crate) fn embed_backward(
    cx: &Ctx,
    w: &EmbedW,
    batch: &TokenBatch,
    dx: &Buffer<bf16>,
) -> Result<Vec<f32>> {
    let mut dt = cx.f32(w.spec.vocab * w.spec.hidden)?;
    cx.st.fill(&dt, 0.0)?;
    kernels::embed_bwd(&cx.st, batch, dx, &mut dt)?;
    cx.sync()?;
    Ok(dt.to_vec()?)
}

/// The final norm and the head on one rank.
pub(crate) struct HeadW {
    pub norm: Buffer<f32>,
    pub head: Lin,
}

impl HeadW {
    pub fn upload(cx: &Ctx, d: &Dims, norm: &[f32], head: &[f32]) -> Result<HeadW> {
        Ok(HeadW {
            norm: cx.dev.upload(norm)?,
            head: Lin::upload(&cx.dev, head, d.vocab, d.h)?,
        })
    }
}

/// What the head's forward keeps.
pub(crate) struct HeadAct {
    x: Buffer<bf16>,
    hn: Buffer<bf16>,
    r: Buffer<f32>,
    logits: Buffer<f32>,
    lse: Buffer<f32>,
    labels: Labels,
}

/// `logits = RMSNorm(x; final_norm) head^T` (f32), the cross-entropy summed over the labelled
/// tokens (device reduction, fixed order; a 1-element f32 buffer, left on the device for the
/// stage's sum over ranks), and the saved state.
pub(crate) fn head_forward(
    cx: &Ctx,
    w: &HeadW,
    d: &Dims,
    x: Buffer<bf16>,
    labels: &[i32],
) -> Result<(Buffer<f32>, HeadAct)> {
    let t = d.t;
    let (hn, r) = norm_fwd(cx, &x, &w.norm, (t, d.h, d.eps))?;
    let logits = cx.gemm_f32(&hn, &w.head.w, (t, d.vocab, d.h))?;
    let spec = XentSpec {
        vocab: d.vocab,
        ignore_index: crate::data::IGNORE_INDEX,
        label_smoothing: 0.0,
    };
    let mut labels = Labels::new(&cx.dev, labels, &spec)?;
    // the stage reports the *sum* of the losses and scales the gradient itself: a count of 1
    // turns the kernels' mean into the sum and their `dmean / count` into `loss_scale`
    labels.valid = 1;
    let (mut loss, mut lse, mut sum) = (cx.f32(t)?, cx.f32(t)?, cx.f32(1)?);
    kernels::xent_fwd(&cx.st, &labels, &logits, &mut loss, &mut lse)?;
    kernels::xent_mean(&cx.st, &labels, &loss, &mut sum)?;
    cx.sync()?;
    let act = HeadAct {
        x,
        hn,
        r,
        logits,
        lse,
        labels,
    };
    Ok((sum, act))
}

/// Backward with d(step loss)/d(summed loss) = `scale`: `dx` and (final_norm, head) gradients.
pub(crate) fn head_backward(
    cx: &Ctx,
    w: &HeadW,
    d: &Dims,
    s: &HeadAct,
    scale: f32,
) -> Result<WithGrads> {
    let (t, v) = (d.t, d.vocab);
    let mut dl = cx.f32(t * v)?;
    let g = XentGrad::Mean { dmean: scale };
    kernels::xent_bwd(&cx.st, &s.labels, &s.logits, &s.lse, g, &mut dl)?;
    let mut dlb = cx.bf(t * v)?;
    ops::cvt_f32_bf16(&cx.st, &dl, &mut dlb, t * v)?;
    let dh = w.head.dgrad(cx, &dlb, t, None)?;
    let g_head = w.head.wgrad(cx, &dlb, &s.hn, t)?;
    let (dx, g_norm) = norm_bwd(cx, (&s.x, &w.norm, &dh, &s.r), (t, d.h, d.eps))?;
    cx.sync()?;
    Ok((dx, vec![("final_norm", g_norm), ("head", g_head)]))
}
