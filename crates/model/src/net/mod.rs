//! `net`: the device implementation of one pipeline stage ([`DeviceStage`], a
//! [`crate::stage::Stage`]): its decoder layers (plus the embedding on the first stage and the
//! final norm, head and loss on the last) on the stage's EP group, forward and backward, every
//! FLOP in a device kernel.
//!
//! Layout: EP rank `r` owns `micro_batch / ep` whole sequences of each micro-batch (`T` tokens).
//! Attention, norms, the dense FFN, the embedding and the head are data-parallel over the
//! ranks; each MoE layer is one [`crate::moe::MoeLayer`] over the stage's devices. The residual
//! stream and its gradient are BF16 on the devices (f32 buffers of BF16 values at the stage
//! boundaries).
//!
//! - [`linear`]: BF16 linear layers (W and W^T on the device; forward, dgrad, wgrad GEMMs) and
//!   the per-rank device context.
//! - [`attn`]: the MLA block (norms, projections, RoPE, the attention kernels).
//! - [`ffn`]: the dense FP8 FFN (the MoE layer's MLP over one group) and the MoE block.
//! - [`head`]: embedding, final norm + head + cross-entropy.
//! - [`load`]: parameter checks and uploads; [`dims`]: the sizes, checked against the stage.
//! - [`devload`]: the reload from the optimizer's device-resident master weights.
//! - [`grads`]: per micro-batch gradients and their fixed-order reductions.
//! - [`mtp`]: the 1-depth MTP module of the last stage (`model.mtp_depth = 1`), with the shared
//!   embedding's copy and the shared head.
//!
//! Host work is limited to moving data: uploads of parameters at construction and resume
//! (rounded to BF16 or quantised to FP8 as the kernels read them; after an optimizer step the
//! stage reloads from the master weights on the devices instead, [`devload`]: device copies
//! and conversion/quantisation kernels, the same bits), the MoE layer's weight gradients,
//! permutations of gradient rows, and moving gradients to the stage's first device, whose `f32_add` kernel
//! sums them over ranks and micro-batches in a fixed order (the data-parallel all-reduce and
//! the gradient accumulation, [`grads`]). The MoE layers run on device buffers (each rank's
//! norm output in, output and input gradient out); the per-expert token histogram is counted
//! on each rank's device (`expert_count`; only the `[E]` counts are read back and added, as
//! integers, over ranks and micro-batches); the ranks' summed losses are added in f64 in rank
//! order on the stage's first device (`f32_sum_f64`), one f64 read back per micro-batch.
//!
//! One device: when every EP rank of the stage names the same device (`ep > 1`; the trainer's
//! single-device run), the ranks' token slices run there one after the other and each MoE
//! layer is one EP-1 layer over all the ranks' tokens (concatenated in rank order) with
//! `wgrad_chunks = ep`, so every reduction keeps the parallel run's order and the result is
//! bit-identical to it (docs/TRAIN.md, *Single-device run*).

mod attn;
mod devload;
mod dims;
mod ffn;
mod grads;
mod head;
mod linear;
mod load;
mod mtp;

use crate::config::ModelConfig;
use crate::moe::MoeLayer;
use crate::params::Params;
use crate::stage::{
    Boundary, ExpertLoad, MicroBatch, NamedGrads, Stage, StageOut, StageResult, StageSpec,
};
use crate::train::optim::DeviceParams;
use crate::TrainError;
use attn::{AttnAct, AttnConst, AttnW};
pub(crate) use dims::Dims;
use ffn::{DenseAct, DenseW, MoeAct};
use grads::GradStore;
use half::bf16;
use head::{EmbedW, HeadAct, HeadW};
use kernels::train::ops;
use kernels::{Positions, RopeConfig, RopeTables, TokenBatch};
use linear::{Ctx, Result};
use runtime::{Buffer, Device};
use std::collections::BTreeMap;

/// The FFN half of a layer.
pub(crate) enum Ffn {
    /// Per rank.
    Dense(Vec<DenseW>),
    Moe {
        /// Per rank `ffn_norm`.
        norms: Vec<Buffer<f32>>,
        layer: Box<MoeLayer>,
    },
}

/// One decoder layer on the stage's ranks.
pub(crate) struct Layer {
    pub index: usize,
    pub attn: Vec<AttnW>,
    pub ffn: Ffn,
}

enum FfnAct {
    Dense(Vec<DenseAct>),
    Moe(Box<MoeAct>),
}

/// A layer's saved state on every rank.
type LayerAct = (Vec<AttnAct>, FfnAct);

/// A layer forward's output per rank, its saved state, and (MoE) the per-expert token counts.
type LayerOut = (Vec<Buffer<bf16>>, LayerAct, Option<Vec<u64>>);

/// What one micro-batch's forward keeps.
struct MbAct {
    embed: Option<Vec<TokenBatch>>,
    layers: Vec<LayerAct>,
    head: Option<Vec<HeadAct>>,
    mtp: Option<Vec<mtp::MtpAct>>,
}

/// One pipeline stage on its EP group's devices (see the module docs).
pub struct DeviceStage {
    spec: StageSpec,
    d: Dims,
    cx: Vec<Ctx>,
    consts: Vec<AttnConst>,
    embed: Option<Vec<EmbedW>>,
    layers: Vec<Layer>,
    head: Option<Vec<HeadW>>,
    /// The MTP module (last stage, `model.mtp_depth = 1`).
    mtp: Option<mtp::Mtp>,
    loss_scale: f32,
    acts: BTreeMap<usize, MbAct>,
    grads: GradStore,
}

fn rank_consts(cx: &Ctx, m: &ModelConfig, d: &Dims) -> Result<AttnConst> {
    let rc = RopeConfig {
        dim: d.dr,
        theta: f64::from(m.rope_theta),
        yarn: None,
    };
    let rope = RopeTables::new(&cx.dev, &rc, d.seq)?;
    let pos: Vec<i32> = (0..d.t).map(|i| (i % d.seq) as i32).collect();
    let cu: Vec<i32> = (0..=d.t / d.seq).map(|s| (s * d.seq) as i32).collect();
    Ok(AttnConst {
        pos: Positions::new(&cx.dev, &pos, &rope)?,
        rope,
        cu: cx.dev.upload(&cu)?,
    })
}

impl DeviceStage {
    /// Builds the stage: checks `spec` and `params` against the model, uploads (and quantises)
    /// the stage's parameters, builds each MoE layer over `spec.devices`.
    pub fn new(spec: StageSpec, params: &Params) -> std::result::Result<DeviceStage, TrainError> {
        // the stage needs the model's sizes, not a whole job's layout: its own checks (and the
        // kernels' and the MoE layer's) name what does not fit
        let d = Dims::new(&spec)?;
        load::check_params(&spec.config.model, params)?;
        let comm = spec.config.parallel.comm_sms;
        let cx: Vec<Ctx> = spec
            .devices
            .iter()
            .map(|dev| Ctx::new(dev, comm))
            .collect::<Result<_>>()?;
        let consts = cx
            .iter()
            .map(|c| rank_consts(c, &spec.config.model, &d))
            .collect::<Result<_>>()?;
        let layers = load::build_layers(&spec, &cx, &d, params)?;
        let (embed, head) = load::ends(&spec, &cx, &d, params)?;
        let grads = GradStore::new(&spec)?;
        let mtp = build_mtp(&spec, &cx, &d, params)?;
        Ok(DeviceStage {
            spec,
            d,
            cx,
            consts,
            embed,
            layers,
            head,
            mtp,
            loss_scale: 1.0,
            acts: BTreeMap::new(),
            grads,
        })
    }

    /// The stage's description.
    pub fn spec(&self) -> &StageSpec {
        &self.spec
    }

    /// Fill every buffer the stage allocates itself with NaN before a kernel writes it (a test
    /// aid: an output left unwritten shows up as NaN).
    pub fn set_poison(&mut self, on: bool) {
        self.cx.iter_mut().for_each(|c| c.poison = on);
    }

    /// Tokens each EP rank holds per micro-batch.
    pub fn tokens_per_rank(&self) -> usize {
        self.d.t
    }

    fn check_mb(&self, mb: &MicroBatch) -> Result<()> {
        let (ep, t) = (self.cx.len(), self.d.t);
        let lens_ok = |v: &[Vec<i32>]| v.len() == ep && v.iter().all(|r| r.len() == t);
        if self.spec.is_first() && !lens_ok(&mb.inputs) {
            return Err(TrainError::Shape(format!(
                "micro-batch {}: inputs must be {ep} ranks of {t} token ids",
                mb.index
            )));
        }
        if self.spec.is_last() && !lens_ok(&mb.labels) {
            return Err(TrainError::Shape(format!(
                "micro-batch {}: labels must be {ep} ranks of {t} labels",
                mb.index
            )));
        }
        Ok(())
    }

    /// Per rank the BF16 residual stream from a boundary (`what`: for messages).
    fn boundary_in(&self, b: Option<Boundary>, what: &str) -> Result<Vec<Buffer<bf16>>> {
        let n = self.d.t * self.d.h;
        let b = b.ok_or_else(|| TrainError::Shape(format!("{what}: no boundary given")))?;
        if b.ranks.len() != self.cx.len() || b.ranks.iter().any(|r| r.len() < n) {
            return Err(TrainError::Shape(format!(
                "{what}: need {} ranks of [{}, {}] f32",
                self.cx.len(),
                self.d.t,
                self.d.h
            )));
        }
        if let Some(r) = (0..b.ranks.len()).find(|&r| !b.ranks[r].device().same(&self.cx[r].dev)) {
            return Err(TrainError::Shape(format!(
                "{what}: rank {r}'s buffer is not on the stage's device {r}"
            )));
        }
        let mut out = Vec::new();
        for (cx, r) in self.cx.iter().zip(&b.ranks) {
            let mut x = cx.bf(n)?;
            ops::cvt_f32_bf16(&cx.st, r, &mut x, n)?;
            cx.sync()?;
            out.push(x);
        }
        Ok(out)
    }

    fn boundary_out(&self, xs: &[Buffer<bf16>]) -> Result<Boundary> {
        let n = self.d.t * self.d.h;
        let mut ranks = Vec::new();
        for (cx, x) in self.cx.iter().zip(xs) {
            let mut o = cx.f32(n)?;
            ops::cvt_bf16_f32(&cx.st, x, &mut o, n)?;
            cx.sync()?;
            ranks.push(o);
        }
        Ok(Boundary { ranks })
    }

    fn layer_forward(&mut self, li: usize, xs: Vec<Buffer<bf16>>) -> Result<LayerOut> {
        let d = &self.d;
        let layer = &mut self.layers[li];
        let mut x1 = Vec::new();
        let mut aa = Vec::new();
        for (r, x) in xs.into_iter().enumerate() {
            let (y, a) = attn::forward(&self.cx[r], &layer.attn[r], &self.consts[r], d, x)?;
            x1.push(y);
            aa.push(a);
        }
        let l = layer.index;
        match &mut layer.ffn {
            Ffn::Dense(w) => {
                let mut x2 = Vec::new();
                let mut fa = Vec::new();
                for (r, x) in x1.into_iter().enumerate() {
                    let (y, a) = ffn::dense_forward(&self.cx[r], &w[r], d, l, x)?;
                    x2.push(y);
                    fa.push(a);
                }
                Ok((x2, (aa, FfnAct::Dense(fa)), None))
            }
            Ffn::Moe { norms, layer } => {
                let nr: Vec<&Buffer<f32>> = norms.iter().collect();
                let (x2, ma, counts) = ffn::moe_forward(&self.cx, &nr, (layer.as_mut(), l), d, x1)?;
                Ok((x2, (aa, FfnAct::Moe(Box::new(ma))), Some(counts)))
            }
        }
    }

    fn forward_mb(&mut self, mb: &MicroBatch, x: Option<Boundary>) -> Result<StageOut> {
        self.check_mb(mb)?;
        if self.acts.contains_key(&mb.index) {
            return Err(TrainError::Shape(format!(
                "micro-batch {}: forward already ran (backward or discard it first)",
                mb.index
            )));
        }
        let (mut xs, embed) = match &self.embed {
            Some(ew) => {
                let mut xs = Vec::new();
                let mut bs = Vec::new();
                for (r, cx) in self.cx.iter().enumerate() {
                    let (x, b) = head::embed_forward(cx, &ew[r], &mb.inputs[r])?;
                    cx.sync()?;
                    xs.push(x);
                    bs.push(b);
                }
                (xs, Some(bs))
            }
            None => (self.boundary_in(x, "forward input")?, None),
        };
        let mut layers = Vec::new();
        let mut loads = Vec::new();
        for li in 0..self.layers.len() {
            let (y, act, counts) = self.layer_forward(li, xs)?;
            xs = y;
            layers.push(act);
            if let Some(c) = counts {
                loads.push((self.layers[li].index, c));
            }
        }
        let mtp_act = self.mtp_forward(mb, &xs)?;
        let (out, head) = match &self.head {
            Some(hw) => {
                let mut parts = Vec::new();
                let mut ha = Vec::new();
                for (r, x) in xs.into_iter().enumerate() {
                    let (l, a) =
                        head::head_forward(&self.cx[r], &hw[r], &self.d, x, &mb.labels[r])?;
                    parts.push(l);
                    ha.push(a);
                }
                (StageOut::Loss(sum_ranks(&self.cx, &parts)?), Some(ha))
            }
            None => (StageOut::Hidden(self.boundary_out(&xs)?), None),
        };
        self.grads.add_loads(mb.index, loads);
        self.acts.insert(
            mb.index,
            MbAct {
                embed,
                layers,
                head,
                mtp: mtp_act,
            },
        );
        Ok(out)
    }

    fn layer_backward(
        &mut self,
        li: usize,
        act: &LayerAct,
        dx2: Vec<Buffer<bf16>>,
        g: &mut grads::MbGrads,
    ) -> Result<Vec<Buffer<bf16>>> {
        let d = &self.d;
        let layer = &mut self.layers[li];
        let l = layer.index;
        let dx1 = match (&mut layer.ffn, &act.1) {
            (Ffn::Dense(w), FfnAct::Dense(fa)) => {
                let mut out = Vec::new();
                for (r, dy) in dx2.iter().enumerate() {
                    let (dx, gs) = ffn::dense_backward(&self.cx[r], &w[r], d, l, &fa[r], dy)?;
                    g.add_rank(l, r, gs);
                    out.push(dx);
                }
                out
            }
            (Ffn::Moe { norms, layer }, FfnAct::Moe(ma)) => {
                let nr: Vec<&Buffer<f32>> = norms.iter().collect();
                let b = ffn::moe_backward(&self.cx, &nr, (layer.as_mut(), l), d, ma, &dx2)?;
                for (r, gv) in b.norm.into_iter().enumerate() {
                    g.add_rank(l, r, vec![("ffn_norm", gv)]);
                }
                g.add_moe(&self.cx[0], l, d, &b.layer)?;
                b.dx
            }
            _ => {
                return Err(TrainError::Shape(format!(
                    "layer {l}: saved state does not match the layer kind"
                )))
            }
        };
        let mut out = Vec::new();
        for (r, dy) in dx1.iter().enumerate() {
            let (dx, gs) = attn::backward(
                &self.cx[r],
                &layer.attn[r],
                &self.consts[r],
                d,
                &act.0[r],
                dy,
            )?;
            g.add_rank(l, r, gs);
            out.push(dx);
        }
        Ok(out)
    }

    fn backward_mb(&mut self, index: usize, dy: Option<Boundary>) -> Result<Option<Boundary>> {
        let act = self.acts.remove(&index).ok_or_else(|| {
            TrainError::Shape(format!("micro-batch {index}: backward without its forward"))
        })?;
        let mut g = self.grads.begin();
        let mut dxs = match (&self.head, &act.head) {
            (Some(hw), Some(ha)) => {
                let mut out = Vec::new();
                for (r, cx) in self.cx.iter().enumerate() {
                    let (dx, gs) =
                        head::head_backward(cx, &hw[r], &self.d, &ha[r], self.loss_scale)?;
                    let (dx, gs) = self.mtp_backward(r, &act, (dx, gs))?;
                    g.add_named(r, gs);
                    out.push(dx);
                }
                out
            }
            _ => self.boundary_in(dy, "backward gradient")?,
        };
        for li in (0..self.layers.len()).rev() {
            dxs = self.layer_backward(li, &act.layers[li], dxs, &mut g)?;
        }
        let out = match (&self.embed, &act.embed) {
            (Some(ew), Some(bs)) => {
                for (r, cx) in self.cx.iter().enumerate() {
                    let gt = head::embed_backward(cx, &ew[r], &bs[r], &dxs[r])?;
                    g.add_global(r, vec![("embed", gt)]);
                }
                None
            }
            _ => Some(self.boundary_out(&dxs)?),
        };
        self.grads.finish(index, g)?;
        Ok(out)
    }
}

impl Stage for DeviceStage {
    fn devices(&self) -> &[Device] {
        &self.spec.devices
    }

    fn forward(&mut self, mb: &MicroBatch, x: Option<Boundary>) -> StageResult<StageOut> {
        self.forward_mb(mb, x)
    }

    fn backward(&mut self, mb: usize, dy: Option<Boundary>) -> StageResult<Option<Boundary>> {
        self.backward_mb(mb, dy)
    }

    fn discard(&mut self, mb: usize) {
        self.acts.remove(&mb);
        if let Some(m) = &mut self.mtp {
            m.losses.remove(&mb);
        }
        self.grads.drop_loads(mb);
    }

    fn set_loss_scale(&mut self, scale: f32) {
        self.loss_scale = scale;
    }

    fn take_grads(&mut self) -> StageResult<(NamedGrads, ExpertLoad)> {
        self.grads.take()
    }

    fn load_params(&mut self, p: &Params) -> StageResult<()> {
        load::check_params(&self.spec.config.model, p)?;
        load::reload_layers(&mut self.layers, &self.cx, &self.d, p)?;
        let (embed, head) = load::ends(&self.spec, &self.cx, &self.d, p)?;
        self.embed = embed;
        self.head = head;
        if let Some(m) = &mut self.mtp {
            m.w = mtp::load_all(&self.cx, &self.d, self.spec.config.model.layers as usize, p)?;
        }
        Ok(())
    }

    fn load_device_params(&mut self, p: &DeviceParams<'_>) -> StageResult<()> {
        let d = &self.d;
        devload::reload_layers(&mut self.layers, &self.cx, d, p)?;
        let has = (self.embed.is_some(), self.head.is_some());
        (self.embed, self.head) = devload::ends(&self.cx, d, p, has)?;
        if let Some(m) = &mut self.mtp {
            let layer = self.spec.config.model.layers as usize;
            m.w = devload::per_rank(&self.cx, p, |s| mtp::MtpW::from_device(s, d, layer))?;
        }
        Ok(())
    }

    fn take_mtp_losses(&mut self) -> Vec<(usize, f64)> {
        match &mut self.mtp {
            Some(m) => std::mem::take(&mut m.losses).into_iter().collect(),
            None => Vec::new(),
        }
    }
}

/// The MTP module of the last stage when the model has one.
fn build_mtp(spec: &StageSpec, cx: &[Ctx], d: &Dims, p: &Params) -> Result<Option<mtp::Mtp>> {
    let m = &spec.config.model;
    if !spec.is_last() || m.mtp_depth == 0 {
        return Ok(None);
    }
    let weight = spec.config.train.mtp_loss_weight;
    Ok(Some(mtp::Mtp::build(cx, d, m.layers as usize, weight, p)?))
}

impl DeviceStage {
    /// The MTP forward of every rank from the main model's last hidden states (last stage
    /// with MTP; else nothing): records the micro-batch's summed MTP loss.
    fn mtp_forward(
        &mut self,
        mb: &MicroBatch,
        xs: &[Buffer<bf16>],
    ) -> Result<Option<Vec<mtp::MtpAct>>> {
        let Some(m) = &mut self.mtp else {
            return Ok(None);
        };
        let (mut parts, mut acts) = (Vec::new(), Vec::new());
        for (r, cx) in self.cx.iter().enumerate() {
            let (l, a) =
                mtp::forward(cx, &m.w[r], &self.consts[r], &self.d, &xs[r], &mb.labels[r])?;
            parts.push(l);
            acts.push(a);
        }
        m.losses.insert(mb.index, sum_ranks(&self.cx, &parts)?);
        Ok(Some(acts))
    }

    /// Rank `r`'s head backward output `(dx, grads)` with the MTP module's backward added:
    /// `dx + dx_mtp` (BF16), the two heads' gradients summed (main first), the `mtp.*` and
    /// `embed` gradients appended. Without MTP the input, renamed.
    fn mtp_backward(
        &self,
        r: usize,
        act: &MbAct,
        (dx, gs): linear::WithGrads,
    ) -> Result<(Buffer<bf16>, mtp::NamedRankGrads)> {
        let mut out: mtp::NamedRankGrads =
            gs.into_iter().map(|(n, v)| (n.to_string(), v)).collect();
        let (Some(m), Some(ma)) = (&self.mtp, &act.mtp) else {
            return Ok((dx, out));
        };
        let cx = &self.cx[r];
        let scale = m.weight * self.loss_scale;
        let (dxm, gm) = mtp::backward(cx, &m.w[r], &self.consts[r], &self.d, &ma[r], scale)?;
        let sum = cx.add(&dx, &dxm, self.d.t * self.d.h)?;
        cx.sync()?;
        for (n, v) in gm {
            match out.iter_mut().find(|(o, _)| *o == n) {
                Some((_, acc)) => *acc = mtp::add_grads(cx, acc, &v)?,
                None => out.push((n, v)),
            }
        }
        Ok((sum, out))
    }
}

/// The ranks' summed losses (`parts[r]`: a 1-element f32 buffer on rank `r`'s device, its
/// kernels finished) added in f64 in rank order by the `f32_sum_f64` kernel on the stage's
/// first device (reading the other ranks' values through peer pointers); the f64 result is read
/// back.
fn sum_ranks(cx: &[Ctx], parts: &[Buffer<f32>]) -> Result<f64> {
    let c0 = cx
        .first()
        .ok_or_else(|| TrainError::Shape("a stage with no ranks".into()))?;
    let mut acc = c0.dev.alloc::<f64>(1)?;
    for (r, p) in parts.iter().enumerate() {
        if !p.device().same(&c0.dev) {
            // enables the first device's access to rank r's memory (CUDA); the address is
            // the buffer's own (unified addressing)
            p.peer_ptr(&c0.dev)?;
        }
        kernels::train::count::f32_sum_f64(&c0.st, p, &mut acc, 1, r > 0)?;
    }
    let v = c0.st.read(&acc)?;
    v.first()
        .copied()
        .ok_or_else(|| TrainError::Shape("empty loss sum".into()))
}

/// `a + b` (f32, in that order) by the `f32_add` kernel on `dev`'s compute partition (`comm_sms`
/// left to communication): the trainer's sum of a shared parameter's gradient parts (the MTP
/// module's embedding gradient).
pub fn add_on_device(
    dev: &Device,
    comm_sms: u32,
    a: &[f32],
    b: &[f32],
) -> std::result::Result<Vec<f32>, TrainError> {
    let cx = Ctx::new(dev, comm_sms)?;
    mtp::add_grads(&cx, a, b)
}
