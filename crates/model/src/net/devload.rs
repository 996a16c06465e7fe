//! Reloading a stage's device weights from the optimizer's FP32 master weights on the devices
//! ([`DeviceParams`]) after a step: per rank, device-to-device copies (peer copies from the
//! stage's first device; runs of consecutive rows as one copy where a weight is held as a row
//! selection) and the conversion kernels: BF16 weights and their transposes by `cvt_f32_bf16` /
//! `transpose_bf16`, FP8 MLP weights by the 128x128 quantiser ([`MlpW::quantise`]), norms and
//! biases copied as they are. Every result is bit for bit what [`super::load`] builds from
//! host copies of the same values (`bf16::from_f32` is `cvt.rn`; the FP8 path is
//! `quant_expert`'s), so a run reloading from the devices is the run reloading from the host.

use super::attn::{kv_b_rows, AttnW};
use super::ffn::{moe_err, DenseW};
use super::head::{EmbedW, HeadW};
use super::linear::{Ctx, Lin, Result};
use super::{Dims, Ffn, Layer};
use crate::moe::MoeDeviceWeights;
use crate::train::optim::DeviceParams;
use crate::TrainError;
use half::bf16;
use kernels::train::ops;
use runtime::Buffer;
use std::cell::RefCell;

/// One rank's view of the device master weights: copies land on the rank's device, on its
/// stream; sources that only feed a conversion are kept until [`RankSrc::finish`] (or drop)
/// synchronises the stream.
pub(crate) struct RankSrc<'a> {
    pub cx: &'a Ctx,
    p: &'a DeviceParams<'a>,
    temps: RefCell<Vec<Buffer<f32>>>,
}

impl<'a> RankSrc<'a> {
    pub fn new(cx: &'a Ctx, p: &'a DeviceParams<'a>) -> RankSrc<'a> {
        RankSrc {
            cx,
            p,
            temps: RefCell::new(Vec::new()),
        }
    }

    /// Rows `rows` (in order) of parameter `name` `[.., cols]`, copied to this rank's device.
    pub fn rows(&self, name: &str, cols: usize, rows: &[usize]) -> Result<Buffer<f32>> {
        let src = self.p.get(name)?;
        let (cx, n) = (self.cx, src.len());
        if cols == 0 || rows.iter().any(|&r| (r + 1) * cols > n) {
            return Err(TrainError::Shape(format!(
                "parameter `{name}`: {n} values do not hold the rows asked of [.., {cols}]"
            )));
        }
        let out = cx.f32(rows.len() * cols)?;
        if !src.device().same(&cx.dev) {
            src.peer_ptr(&cx.dev)?;
        }
        let mut i = 0;
        while i < rows.len() {
            let mut run = 1;
            while i + run < rows.len() && rows[i + run] == rows[i] + run {
                run += 1;
            }
            cx.st
                .copy_range((src, rows[i] * cols), (&out, i * cols), run * cols)?;
            i += run;
        }
        Ok(out)
    }

    /// Parameter `name` copied to this rank's device.
    pub fn f32(&self, name: &str) -> Result<Buffer<f32>> {
        let n = self.p.get(name)?.len();
        self.rows(name, n.max(1), &[0][..(n > 0) as usize])
    }

    /// Keeps `b` (read by queued work) alive until the stream is synchronised.
    fn keep(&self, b: Buffer<f32>) {
        self.temps.borrow_mut().push(b);
    }

    /// BF16 copy of parameter `name` (e.g. the embedding table).
    pub fn bf16(&self, name: &str) -> Result<Buffer<bf16>> {
        let src = self.f32(name)?;
        let n = src.len();
        let mut out = self.cx.bf(n)?;
        ops::cvt_f32_bf16(&self.cx.st, &src, &mut out, n)?;
        self.keep(src);
        Ok(out)
    }

    /// A BF16 linear layer `[n, k]` (W and W^T) from `w` on this rank's device.
    fn lin_from(&self, w: Buffer<f32>, n: usize, k: usize) -> Result<Lin> {
        if w.len() != n * k {
            return Err(TrainError::Shape(format!(
                "linear weight: {} values for [{n}, {k}]",
                w.len()
            )));
        }
        let (mut b, mut bt) = (self.cx.bf(n * k)?, self.cx.bf(n * k)?);
        ops::cvt_f32_bf16(&self.cx.st, &w, &mut b, n * k)?;
        ops::transpose_bf16(&self.cx.st, &w, &mut bt, n, k)?;
        self.keep(w);
        Ok(Lin { w: b, wt: bt, n, k })
    }

    /// Parameter `name` as a BF16 linear layer `[n, k]`.
    pub fn lin(&self, name: &str, n: usize, k: usize) -> Result<Lin> {
        self.lin_from(self.f32(name)?, n, k)
    }

    /// Rows `rows` of parameter `name` `[.., k]` as a BF16 linear layer `[rows.len(), k]`.
    pub fn lin_rows(&self, name: &str, k: usize, rows: &[usize]) -> Result<Lin> {
        self.lin_from(self.rows(name, k, rows)?, rows.len(), k)
    }

    /// A dense FFN (`{prefix}ffn_norm`, `{prefix}ffn.w1`, `{prefix}ffn.w2`), FP8 on the device.
    pub fn dense(&self, d: &Dims, layer: usize, prefix: &str) -> Result<DenseW> {
        let norm = self.f32(&format!("{prefix}ffn_norm"))?;
        let w1 = self.f32(&format!("{prefix}ffn.w1"))?;
        let w2 = self.f32(&format!("{prefix}ffn.w2"))?;
        let w = DenseW::from_device(self.cx, d, layer, norm, (&w1, &w2))?;
        self.keep(w1);
        self.keep(w2);
        Ok(w)
    }

    /// The attention weights named `{prefix}attn_norm`, `{prefix}attn.wq_a`, ...
    pub fn attn(&self, d: &Dims, prefix: &str) -> Result<AttnW> {
        let (h, dqk) = (d.h, d.dn + d.dr);
        let n = |s: &str| format!("{prefix}{s}");
        let (kr, vr) = kv_b_rows(d);
        let a: Vec<usize> = (0..d.kvl).collect();
        let r: Vec<usize> = (d.kvl..d.kvl + d.dr).collect();
        Ok(AttnW {
            attn_norm: self.f32(&n("attn_norm"))?,
            q_norm: self.f32(&n("attn.q_norm"))?,
            kv_norm: self.f32(&n("attn.kv_norm"))?,
            wq_a: self.lin(&n("attn.wq_a"), d.ql, h)?,
            wq_b: self.lin(&n("attn.wq_b"), d.nh * dqk, d.ql)?,
            wc: self.lin_rows(&n("attn.wkv_a"), h, &a)?,
            wr: self.lin_rows(&n("attn.wkv_a"), h, &r)?,
            wk: self.lin_rows(&n("attn.wkv_b"), d.kvl, &kr)?,
            wv: self.lin_rows(&n("attn.wkv_b"), d.kvl, &vr)?,
            wo: self.lin(&n("attn.wo"), h, d.nh * d.dv)?,
        })
    }

    /// The embedding table (BF16).
    pub fn embed(&self, d: &Dims) -> Result<EmbedW> {
        Ok(EmbedW::with_table(d, self.bf16("embed")?))
    }

    /// A final norm `norm` and the head `head` `[vocab, H]`.
    pub fn head(&self, d: &Dims, norm: &str, head: &str) -> Result<HeadW> {
        Ok(HeadW {
            norm: self.f32(norm)?,
            head: self.lin(head, d.vocab, d.h)?,
        })
    }

    /// Synchronises the rank's stream and drops the temporaries.
    pub fn finish(self) -> Result<()> {
        self.cx.sync()?;
        self.temps.borrow_mut().clear();
        Ok(())
    }
}

impl Drop for RankSrc<'_> {
    fn drop(&mut self) {
        if !self.temps.borrow().is_empty() {
            // an error path: the queued work must not outlive its sources (a second error
            // is moot, the first is being returned)
            let _ = self.cx.sync();
        }
    }
}

/// Layer `l`'s MoE weights as the device master weights.
fn moe_weights<'a>(p: &'a DeviceParams<'a>, d: &Dims, l: usize) -> Result<MoeDeviceWeights<'a>> {
    let get = |s: &str| p.get(&format!("layers.{l}.moe.{s}"));
    let mut names: Vec<String> = (0..d.experts).map(|e| format!("experts.{e}")).collect();
    if d.shared {
        names.push("shared".to_string());
    }
    let (mut w1, mut w2) = (Vec::new(), Vec::new());
    for n in &names {
        w1.push(get(&format!("{n}.w1"))?);
        w2.push(get(&format!("{n}.w2"))?);
    }
    Ok(MoeDeviceWeights {
        gate: get("gate")?,
        bias: get("bias")?,
        w1,
        w2,
    })
}

/// `f` on every rank's [`RankSrc`], each finished (synchronised) after.
pub(crate) fn per_rank<T>(
    cxs: &[Ctx],
    p: &DeviceParams,
    f: impl Fn(&RankSrc) -> Result<T>,
) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(cxs.len());
    for cx in cxs {
        let src = RankSrc::new(cx, p);
        out.push(f(&src)?);
        src.finish()?;
    }
    Ok(out)
}

/// Reloads every layer's weights from the device master weights.
pub(crate) fn reload_layers(
    layers: &mut [Layer],
    cxs: &[Ctx],
    d: &Dims,
    p: &DeviceParams,
) -> Result<()> {
    for layer in layers {
        let l = layer.index;
        let prefix = format!("layers.{l}.");
        layer.attn = per_rank(cxs, p, |s| s.attn(d, &prefix))?;
        match &mut layer.ffn {
            Ffn::Dense(w) => *w = per_rank(cxs, p, |s| s.dense(d, l, &prefix))?,
            Ffn::Moe { norms, layer: m } => {
                *norms = per_rank(cxs, p, |s| s.f32(&format!("{prefix}ffn_norm")))?;
                m.set_device_weights(&moe_weights(p, d, l)?)
                    .map_err(|e| moe_err(l, e))?;
            }
        }
    }
    Ok(())
}

/// The embedding (first stage) and head (last stage) of every rank, where the stage has them.
pub(crate) fn ends(
    cxs: &[Ctx],
    d: &Dims,
    p: &DeviceParams,
    (embed, head): (bool, bool),
) -> Result<super::load::Ends> {
    let e = match embed {
        true => Some(per_rank(cxs, p, |s| s.embed(d))?),
        false => None,
    };
    let h = match head {
        true => Some(per_rank(cxs, p, |s| s.head(d, "final_norm", "head"))?),
        false => None,
    };
    Ok((e, h))
}
