//! Replacing an [`MoeLayer`]'s weights from FP32 masters already on the devices (the trainer's
//! optimizer keeps them there): per rank, the gate, bias and that rank's experts are copied
//! device to device (peer copies) and converted there: the gate to BF16 (and its transpose),
//! the experts quantised to 128x128 FP8 with W^T ([`MlpW::quantise`]), bit for bit what
//! [`MoeLayer::set_weights`] builds from host copies of the same values.

use super::{MoeLayer, RankDev};
use crate::moe::mlp::{ExpertF32, MlpW};
use crate::moe::{MoeConfig, MoeError, MoeWeights, Result};
use half::bf16;
use kernels::train::ops;
use runtime::{Buffer, Stream};

/// An MoE layer's FP32 master weights on the devices (each tensor on any device of the
/// layer's backend).
pub struct MoeDeviceWeights<'a> {
    /// `[E, H]` router weight.
    pub gate: &'a Buffer<f32>,
    /// `[E]` selection bias.
    pub bias: &'a Buffer<f32>,
    /// Per expert (routed `0..E`, then the shared one) W_gate|up `[2I, H]`.
    pub w1: Vec<&'a Buffer<f32>>,
    /// Per expert W_down `[H, I]`.
    pub w2: Vec<&'a Buffer<f32>>,
}

/// `src` copied onto `st`'s device (a peer copy when it sits elsewhere).
fn local(st: &Stream, src: &Buffer<f32>) -> Result<Buffer<f32>> {
    let dst = st.device().alloc::<f32>(src.len())?;
    if !src.device().same(st.device()) {
        src.peer_ptr(st.device())?;
    }
    st.copy_bytes(src, &dst)?;
    Ok(dst)
}

fn check(cfg: &MoeConfig, w: &MoeDeviceWeights) -> Result<()> {
    let (h, e_n, i_n) = (
        cfg.hidden as usize,
        cfg.experts as usize,
        cfg.intermediate as usize,
    );
    let n_w = e_n + cfg.shared as usize;
    let bad = if w.gate.len() != e_n * h || w.bias.len() != e_n {
        Some(format!("gate must be [{e_n}, {h}] and bias [{e_n}]"))
    } else if w.w1.len() != n_w || w.w2.len() != n_w {
        Some(format!("{n_w} experts' weights needed (routed + shared)"))
    } else if w
        .w1
        .iter()
        .zip(&w.w2)
        .any(|(a, b)| a.len() != 2 * i_n * h || b.len() != h * i_n)
    {
        Some(format!(
            "expert weights must be [{}, {h}] and [{h}, {i_n}]",
            2 * i_n
        ))
    } else {
        None
    };
    bad.map_or(Ok(()), |m| Err(MoeError::Shape(m)))
}

/// Rank `r`'s new weights, built on its compute stream.
fn rank_weights(cfg: &MoeConfig, rd: &RankDev, r: usize, w: &MoeDeviceWeights) -> Result<RankW> {
    let (h, e_n, i_n, el) = (
        cfg.hidden as usize,
        cfg.experts as usize,
        cfg.intermediate as usize,
        cfg.local_experts(),
    );
    let st = &rd.compute;
    let d = st.device();
    let gate32 = local(st, w.gate)?;
    let mut gate = d.alloc::<bf16>(e_n * h)?;
    let mut gate_t = d.alloc::<bf16>(e_n * h)?;
    ops::cvt_f32_bf16(st, &gate32, &mut gate, e_n * h)?;
    ops::transpose_bf16(st, &gate32, &mut gate_t, e_n, h)?;
    let bias = local(st, w.bias)?;
    let copies = |ids: &mut dyn Iterator<Item = usize>| -> Result<Vec<(Buffer<f32>, Buffer<f32>)>> {
        ids.map(|e| Ok((local(st, w.w1[e])?, local(st, w.w2[e])?)))
            .collect()
    };
    let mine = copies(&mut (r * el..(r + 1) * el))?;
    let refs: Vec<ExpertF32> = mine.iter().map(|(a, b)| (a, b)).collect();
    let routed = MlpW::quantise(st, &refs, h, i_n)?;
    let shared = match rd.shared.is_some() {
        true => {
            let sh = copies(&mut std::iter::once(e_n))?;
            Some(MlpW::quantise(st, &[(&sh[0].0, &sh[0].1)], h, i_n)?)
        }
        false => None,
    };
    st.synchronize()?; // the f32 copies die here
    Ok(RankW {
        routed,
        shared,
        gate,
        gate_t,
        bias,
    })
}

struct RankW {
    routed: MlpW,
    shared: Option<MlpW>,
    gate: Buffer<bf16>,
    gate_t: Buffer<bf16>,
    bias: Buffer<f32>,
}

impl MoeLayer {
    /// Replaces the weights from FP32 masters on the devices (see the module docs). The host
    /// copies of [`MoeLayer::weights`] and [`MoeLayer::dequantised`] are not made: afterwards
    /// they are empty (the reference checks of `ptxforge moe` load from the host).
    pub fn set_device_weights(&mut self, w: &MoeDeviceWeights) -> Result<()> {
        let cfg = &self.dev.cfg;
        check(cfg, w)?;
        let new = self
            .dev
            .ranks
            .iter()
            .enumerate()
            .map(|(r, rd)| rank_weights(cfg, rd, r, w))
            .collect::<Result<Vec<_>>>()?;
        for (rd, n) in self.dev.ranks.iter_mut().zip(new) {
            rd.routed = n.routed;
            rd.shared = n.shared;
            rd.gate = n.gate;
            rd.gate_t = n.gate_t;
            rd.bias = n.bias;
        }
        self.experts = Vec::new();
        self.weights = MoeWeights {
            gate: Vec::new(),
            bias: Vec::new(),
            w1: Vec::new(),
            w2: Vec::new(),
        };
        Ok(())
    }
}
