//! The FFN half of a decoder layer, `x2 = x1 + FFN(RMSNorm(x1; ffn_norm))`, forward and
//! backward:
//!
//! - dense layers on one rank: the FP8 SwiGLU MLP of `model::moe` (the dense FFN is one expert
//!   over all of the rank's tokens: 1x128 activations, 128x128 weights, power-of-two scales,
//!   FP8 dgrad and k-grouped FP8 wgrad);
//! - MoE layers across the stage's EP ranks: [`MoeLayer`]'s device interface (each rank's norm
//!   output in, the layer's output and input gradient out, on the ranks' devices; one device:
//!   the ranks' tokens concatenated and split again by device copies).

use super::attn::{norm_bwd, norm_fwd};
use super::linear::{Ctx, Result, WithGrads};
use super::Dims;
use crate::moe::host::quant_expert;
use crate::moe::mlp::{ExpertF32, Mlp, MlpFwd, MlpW, Rows};
use crate::moe::{Backward, Forward, MoeLayer, Quiet};
use crate::TrainError;
use half::bf16;
use kernels::ScaleMode;
use runtime::Buffer;

/// A dense layer's FFN weights on one rank and the one-group row layout of its MLP.
pub(crate) struct DenseW {
    pub norm: Buffer<f32>,
    pub w: MlpW,
    mi: Buffer<i32>,
    ones: Buffer<f32>,
    ks: Buffer<i32>,
}

impl DenseW {
    pub fn upload(cx: &Ctx, d: &Dims, layer: usize, w: [&[f32]; 3]) -> Result<DenseW> {
        let [norm, w1, w2] = w;
        let (h, i_n, t) = (d.h, d.di, d.t);
        if w1.len() != 2 * i_n * h || w2.len() != h * i_n {
            return Err(TrainError::Shape(format!(
                "ffn.w1 must be [{}, {h}] and ffn.w2 [{h}, {i_n}]",
                2 * i_n
            )));
        }
        let q = quant_expert(w1, w2, h, i_n);
        let w = MlpW::upload(&cx.dev, &[&q]).map_err(|e| moe_err(layer, e))?;
        DenseW::with(cx, t, cx.dev.upload(norm)?, w)
    }

    /// The FFN from FP32 masters already on the rank's device, quantised there
    /// ([`MlpW::quantise`]: bit for bit [`DenseW::upload`]'s weights).
    pub fn from_device(
        cx: &Ctx,
        d: &Dims,
        layer: usize,
        norm: Buffer<f32>,
        w: ExpertF32,
    ) -> Result<DenseW> {
        let q = MlpW::quantise(&cx.st, &[w], d.h, d.di).map_err(|e| moe_err(layer, e))?;
        DenseW::with(cx, d.t, norm, q)
    }

    /// The weights with the one-group row layout of `t` rows.
    fn with(cx: &Ctx, t: usize, norm: Buffer<f32>, w: MlpW) -> Result<DenseW> {
        let dev = &cx.dev;
        Ok(DenseW {
            norm,
            w,
            mi: dev.upload(&vec![0i32; t])?,
            ones: dev.upload(&vec![1f32; t])?,
            ks: dev.upload(&[0i32, t as i32])?,
        })
    }

    fn rows(&self, d: &Dims) -> Rows<'_> {
        Rows {
            mi: &self.mi,
            m: d.t,
            groups: 1,
        }
    }
}

pub(crate) fn moe_err(layer: usize, source: crate::moe::MoeError) -> TrainError {
    TrainError::Moe { layer, source }
}

/// What a dense FFN forward keeps.
pub(crate) struct DenseAct {
    x1: Buffer<bf16>,
    r: Buffer<f32>,
    fq: Buffer<u8>,
    fs: Buffer<f32>,
    mf: MlpFwd,
}

fn mlp(d: &Dims) -> Mlp {
    Mlp {
        h: d.h,
        i_n: d.di,
        wgmma: false,
    }
}

/// Dense forward of `x1`: `x2` and the saved state.
pub(crate) fn dense_forward(
    cx: &Ctx,
    w: &DenseW,
    d: &Dims,
    layer: usize,
    x1: Buffer<bf16>,
) -> Result<(Buffer<bf16>, DenseAct)> {
    let (t, h) = (d.t, d.h);
    let (f, r) = norm_fwd(cx, &x1, &w.norm, (t, h, d.eps))?;
    let mut fq = cx.dev.alloc::<u8>(t * h)?;
    let mut fs = cx.f32(t * h / 128)?;
    kernels::quantize_fp8_1x128(&cx.st, &f, &mut fq, &mut fs, t, h, ScaleMode::Pow2)?;
    let mf = mlp(d)
        .fwd(&cx.st, (&fq, &fs), &w.w, w.rows(d))
        .map_err(|e| moe_err(layer, e))?;
    let x2 = cx.add(&x1, &mf.y, t * h)?;
    cx.sync()?;
    let act = DenseAct { x1, r, fq, fs, mf };
    Ok((x2, act))
}

/// Dense backward from `dx2`: `dx1` and (ffn_norm, ffn.w1, ffn.w2) gradients.
pub(crate) fn dense_backward(
    cx: &Ctx,
    w: &DenseW,
    d: &Dims,
    layer: usize,
    s: &DenseAct,
    dx2: &Buffer<bf16>,
) -> Result<WithGrads> {
    let (t, h) = (d.t, d.h);
    let dy = cx.bf(t * h)?;
    cx.st.copy_bytes(dx2, &dy)?;
    let m = mlp(d);
    let rows = w.rows(d);
    let dg = m
        .dgrad(&cx.st, dy, &s.mf, &w.ones, &w.w, rows)
        .map_err(|e| moe_err(layer, e))?;
    let (dw1, dw2) = m
        .wgrad(&cx.st, &dg, (&s.fq, &s.fs), rows, &w.ks)
        .map_err(|e| moe_err(layer, e))?;
    let (dxn, g_norm) = norm_bwd(cx, (&s.x1, &w.norm, &dg.dx, &s.r), (t, h, d.eps))?;
    let dx1 = cx.add(dx2, &dxn, t * h)?;
    cx.sync()?;
    Ok((
        dx1,
        vec![("ffn_norm", g_norm), ("ffn.w1", dw1), ("ffn.w2", dw2)],
    ))
}

/// What an MoE FFN forward keeps (per rank the residual input, the norm output and rstd; the
/// layer's forward state).
pub(crate) struct MoeAct {
    x1: Vec<Buffer<bf16>>,
    r: Vec<Buffer<f32>>,
    fwd: Forward,
}

/// One device (an EP-1 layer over all the stage ranks' tokens): the ranks' `[T, H]` tensors
/// (`n = T * H` elements each) concatenated in rank order by device copies.
fn concat(cx: &Ctx, v: &[Buffer<bf16>], n: usize) -> Result<Buffer<bf16>> {
    let all = cx.bf(n * v.len())?;
    for (r, x) in v.iter().enumerate() {
        cx.st.copy_range((x, 0), (&all, r * n), n)?;
    }
    cx.sync()?;
    Ok(all)
}

/// The MoE layer's per-rank device tensors as the stage's ranks' `[T, H]` slices (the inverse
/// of [`concat`] when the layer has one rank for all).
fn from_layer(cxs: &[Ctx], v: Vec<Buffer<bf16>>, n: usize) -> Result<Vec<Buffer<bf16>>> {
    if v.len() == cxs.len() {
        return Ok(v);
    }
    let all = v
        .first()
        .ok_or_else(|| TrainError::Shape("the MoE layer returned no ranks".into()))?;
    let mut out = Vec::new();
    for (r, cx) in cxs.iter().enumerate() {
        let x = cx.bf(n)?;
        cx.st.copy_range((all, r * n), (&x, 0), n)?;
        cx.sync()?;
        out.push(x);
    }
    Ok(out)
}

/// MoE forward of every rank's `x1`: per rank `x2`, the state, the per-expert token counts.
pub(crate) fn moe_forward(
    cxs: &[Ctx],
    norms: &[&Buffer<f32>],
    layer: (&mut MoeLayer, usize),
    d: &Dims,
    x1: Vec<Buffer<bf16>>,
) -> Result<(Vec<Buffer<bf16>>, MoeAct, Vec<u64>)> {
    let (moe, l) = layer;
    let (t, h) = (d.t, d.h);
    let mut fs = Vec::new();
    let mut rs = Vec::new();
    for (r, cx) in cxs.iter().enumerate() {
        let (f, rstd) = norm_fwd(cx, &x1[r], norms[r], (t, h, d.eps))?;
        cx.sync()?;
        fs.push(f);
        rs.push(rstd);
    }
    let xs = match moe.config().ranks() == fs.len() {
        true => fs,
        false => vec![concat(&cxs[0], &fs, t * h)?],
    };
    let mut fwd = moe.forward_dev(xs, &Quiet).map_err(|e| moe_err(l, e))?;
    let counts = moe.expert_counts(&fwd).map_err(|e| moe_err(l, e))?;
    let ys = from_layer(cxs, std::mem::take(&mut fwd.y_dev), t * h)?;
    let mut x2 = Vec::new();
    for (r, cx) in cxs.iter().enumerate() {
        x2.push(cx.add(&x1[r], &ys[r], t * h)?);
        cx.sync()?;
    }
    Ok((x2, MoeAct { x1, r: rs, fwd }, counts))
}

/// What an MoE backward returns.
pub(crate) struct MoeBwd {
    /// Per rank the input gradient `dx1`.
    pub dx: Vec<Buffer<bf16>>,
    /// Per rank the `ffn_norm` gradient.
    pub norm: Vec<Vec<f32>>,
    /// The layer's gradients.
    pub layer: Backward,
}

/// MoE backward from every rank's `dx2`.
pub(crate) fn moe_backward(
    cxs: &[Ctx],
    norms: &[&Buffer<f32>],
    layer: (&mut MoeLayer, usize),
    d: &Dims,
    s: &MoeAct,
    dx2: &[Buffer<bf16>],
) -> Result<MoeBwd> {
    let (moe, l) = layer;
    let (t, h) = (d.t, d.h);
    let cat;
    let dys = match moe.config().ranks() == dx2.len() {
        true => dx2,
        false => {
            cat = [concat(&cxs[0], dx2, t * h)?];
            &cat[..]
        }
    };
    let mut b = moe
        .backward_dev(&s.fwd, dys, &Quiet)
        .map_err(|e| moe_err(l, e))?;
    let dxs = from_layer(cxs, std::mem::take(&mut b.dx_dev), t * h)?;
    let mut dx1 = Vec::new();
    let mut g_norm = Vec::new();
    for (r, cx) in cxs.iter().enumerate() {
        let (dxn, g) = norm_bwd(cx, (&s.x1[r], norms[r], &dxs[r], &s.r[r]), (t, h, d.eps))?;
        dx1.push(cx.add(&dx2[r], &dxn, t * h)?);
        cx.sync()?;
        g_norm.push(g);
    }
    Ok(MoeBwd {
        dx: dx1,
        norm: g_norm,
        layer: b,
    })
}
