//! Building a stage's device weights from [`Params`]: shape checks naming the parameter, the
//! per-rank BF16 and FP8 uploads, and each MoE layer's [`MoeWeights`].

use super::attn::AttnW;
use super::ffn::{moe_err, DenseW};
use super::head::{EmbedW, HeadW};
use super::linear::{Ctx, Result};
use super::{Dims, Ffn, Layer};
use crate::config::ModelConfig;
use crate::moe::{MoeConfig, MoeLayer, MoeWeights, Quiet};
use crate::params::{specs, Params};
use crate::stage::StageSpec;
use crate::TrainError;
use half::bf16;
use runtime::Device;

/// `p` holds exactly the model's parameters, each with its shape.
pub(crate) fn check_params(m: &ModelConfig, p: &Params) -> Result<()> {
    let want = specs(m);
    if p.specs.len() != want.len() || p.data.len() != want.len() {
        return Err(TrainError::Shape(format!(
            "params: {} tensors for a model of {}",
            p.data.len(),
            want.len()
        )));
    }
    for ((s, w), d) in p.specs.iter().zip(&want).zip(&p.data) {
        if s.name != w.name || s.shape != w.shape || d.len() != w.len() {
            return Err(TrainError::Shape(format!(
                "parameter `{}`: shape {:?} with {} values, the model needs `{}` {:?}",
                s.name,
                s.shape,
                d.len(),
                w.name,
                w.shape
            )));
        }
    }
    Ok(())
}

/// Layer `l`'s parameter `suffix`.
pub(crate) fn layer_param<'a>(p: &'a Params, l: usize, suffix: &str) -> Result<&'a [f32]> {
    Ok(p.get(&format!("layers.{l}.{suffix}"))?)
}

/// The MoE layer `l`'s weights: gate (BF16), bias, routed experts then the shared one.
pub(crate) fn moe_weights(d: &Dims, p: &Params, l: usize) -> Result<MoeWeights> {
    let gate = layer_param(p, l, "moe.gate")?
        .iter()
        .map(|&v| bf16::from_f32(v))
        .collect();
    let bias = layer_param(p, l, "moe.bias")?.to_vec();
    let mut names: Vec<String> = (0..d.experts).map(|e| format!("moe.experts.{e}")).collect();
    if d.shared {
        names.push("moe.shared".to_string());
    }
    let mut w1 = Vec::new();
    let mut w2 = Vec::new();
    for n in &names {
        w1.push(layer_param(p, l, &format!("{n}.w1"))?.to_vec());
        w2.push(layer_param(p, l, &format!("{n}.w2"))?.to_vec());
    }
    Ok(MoeWeights { gate, bias, w1, w2 })
}

fn attn_all(cxs: &[Ctx], d: &Dims, p: &Params, l: usize) -> Result<Vec<AttnW>> {
    let named = |s: &str| layer_param(p, l, s);
    cxs.iter().map(|cx| AttnW::upload(cx, d, &named)).collect()
}

fn dense_all(cxs: &[Ctx], d: &Dims, p: &Params, l: usize) -> Result<Vec<DenseW>> {
    let w = [
        layer_param(p, l, "ffn_norm")?,
        layer_param(p, l, "ffn.w1")?,
        layer_param(p, l, "ffn.w2")?,
    ];
    cxs.iter().map(|cx| DenseW::upload(cx, d, l, w)).collect()
}

fn norms(cxs: &[Ctx], p: &Params, l: usize) -> Result<Vec<runtime::Buffer<f32>>> {
    let n = layer_param(p, l, "ffn_norm")?;
    cxs.iter().map(|cx| Ok(cx.dev.upload(n)?)).collect()
}

/// The MoE layers' configuration and devices: the job's EP group, or on one device
/// (`Dims::one_device`) one EP-1 layer over all `ep` ranks' tokens whose replicated weights'
/// gradients come in `ep` chunks (the EP ranks' reduction order).
fn moe_group(spec: &StageSpec, d: &Dims) -> (MoeConfig, Vec<Device>) {
    let mut cfg = spec.config.moe_config();
    if !d.one_device {
        return (cfg, spec.devices.clone());
    }
    let ep = spec.devices.len() as u32;
    cfg.nodes = 1;
    cfg.gpus_per_node = 1;
    cfg.tokens *= ep;
    cfg.wgrad_chunks = ep;
    (cfg, spec.devices[..1].to_vec())
}

/// Builds every layer of the stage (MoE layers over the stage's devices).
pub(crate) fn build_layers(
    spec: &StageSpec,
    cxs: &[Ctx],
    d: &Dims,
    p: &Params,
) -> Result<Vec<Layer>> {
    let mut out = Vec::new();
    for l in spec.layers.clone() {
        let ffn = if l < d.dense_layers {
            Ffn::Dense(dense_all(cxs, d, p, l)?)
        } else {
            let (cfg, devices) = moe_group(spec, d);
            let layer = MoeLayer::new(cfg, devices, moe_weights(d, p, l)?, &Quiet)
                .map_err(|e| moe_err(l, e))?;
            Ffn::Moe {
                norms: norms(cxs, p, l)?,
                layer: Box::new(layer),
            }
        };
        out.push(Layer {
            index: l,
            attn: attn_all(cxs, d, p, l)?,
            ffn,
        });
    }
    Ok(out)
}

/// Re-uploads every layer's weights (MoE: re-quantised through [`MoeLayer::set_weights`]).
pub(crate) fn reload_layers(layers: &mut [Layer], cxs: &[Ctx], d: &Dims, p: &Params) -> Result<()> {
    for layer in layers {
        let l = layer.index;
        layer.attn = attn_all(cxs, d, p, l)?;
        match &mut layer.ffn {
            Ffn::Dense(w) => *w = dense_all(cxs, d, p, l)?,
            Ffn::Moe { norms: n, layer: m } => {
                *n = norms(cxs, p, l)?;
                m.set_weights(moe_weights(d, p, l)?, &Quiet)
                    .map_err(|e| moe_err(l, e))?;
            }
        }
    }
    Ok(())
}

/// Per rank the embedding (first stage) and the head (last stage).
pub(crate) type Ends = (Option<Vec<EmbedW>>, Option<Vec<HeadW>>);

/// The embedding (first stage) and head (last stage) of every rank.
pub(crate) fn ends(spec: &StageSpec, cxs: &[Ctx], d: &Dims, p: &Params) -> Result<Ends> {
    let embed = match spec.is_first() {
        true => {
            let t = p.get("embed")?;
            Some(
                cxs.iter()
                    .map(|cx| EmbedW::upload(cx, d, t))
                    .collect::<Result<_>>()?,
            )
        }
        false => None,
    };
    let head = match spec.is_last() {
        true => {
            let (n, h) = (p.get("final_norm")?, p.get("head")?);
            Some(
                cxs.iter()
                    .map(|cx| HeadW::upload(cx, d, n, h))
                    .collect::<Result<_>>()?,
            )
        }
        false => None,
    };
    Ok((embed, head))
}
