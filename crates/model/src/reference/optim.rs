//! The reference's optimizer step, modelled on the device kernels (`kernels::train::optim`):
//! global L2 gradient norm over every AdamW parameter, clip factor `c = min(1, clip / norm)`,
//! AdamW on the FP32 master weights with BF16 moments:
//! `g' = c g`, `m = bf16(b1 m + (1-b1) g')`, `v = bf16(b2 v + (1-b2) g'^2)`,
//! `p = f32(p - lr (m bc1 / (sqrt(v bc2) + eps) + wd p))`, `bc_i = 1 / (1 - b_i^t)`, with weight
//! decay on `Matrix`/`Embedding` parameters only (the update reads the rounded moments, as the
//! kernel does); then the aux-loss-free bias update
//! `bias_e += speed * sign(mean_load - load_e)`. The arithmetic is f64 (the kernel's is f32).

use super::{loss_and_grads_mtp, RefError, RefOptions};
use crate::config::TrainConfig;
use crate::params::{ParamKind, Params};
use crate::stage::{ExpertLoad, MicroBatch};
use half::bf16;

/// AdamW hyper-parameters of one step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamHyper {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Global-norm clip threshold (`None`: no clipping).
    pub clip: Option<f64>,
    /// Store the moments in BF16 (as the device and V3 do).
    pub bf16_moments: bool,
}

impl AdamHyper {
    /// The step's hyper-parameters from the configuration (`step` 0-based: lr from
    /// `TrainConfig::lr_at(step)`).
    pub fn of(cfg: &TrainConfig, step: u32) -> AdamHyper {
        let t = &cfg.train;
        AdamHyper {
            lr: cfg.lr_at(step) as f64,
            beta1: t.adam_beta1 as f64,
            beta2: t.adam_beta2 as f64,
            eps: t.adam_eps as f64,
            weight_decay: t.weight_decay as f64,
            clip: (t.grad_clip > 0.0).then_some(t.grad_clip as f64),
            bf16_moments: true,
        }
    }
}

/// AdamW moments of every parameter ([`crate::params::specs`] order) and the steps taken.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamState {
    /// Steps completed (the next step's bias correction uses `step + 1`).
    pub step: u32,
    pub m: Vec<Vec<f64>>,
    pub v: Vec<Vec<f64>>,
}

impl AdamState {
    /// Zero moments for `p`.
    pub fn new(p: &Params) -> AdamState {
        let z: Vec<Vec<f64>> = p.data.iter().map(|d| vec![0.0; d.len()]).collect();
        AdamState {
            step: 0,
            m: z.clone(),
            v: z,
        }
    }
}

fn adamw_param(kind: ParamKind) -> bool {
    kind != ParamKind::RouteBias
}

/// Global L2 norm of the gradients of every AdamW parameter (route biases excluded).
pub fn grad_norm(p: &Params, g: &[Vec<f64>]) -> f64 {
    p.specs
        .iter()
        .zip(g)
        .filter(|(s, _)| adamw_param(s.kind))
        .flat_map(|(_, g)| g.iter())
        .map(|v| v * v)
        .sum::<f64>()
        .sqrt()
}

/// One clipped AdamW step on `p` with gradients `g` (f64, `p`'s order and lengths); returns the
/// gradient norm before clipping.
pub fn adamw_step(
    p: &mut Params,
    g: &[Vec<f64>],
    st: &mut AdamState,
    h: &AdamHyper,
) -> Result<f64, RefError> {
    let lens_ok = |v: &[Vec<f64>]| {
        v.len() == p.data.len() && v.iter().zip(&p.data).all(|(a, b)| a.len() == b.len())
    };
    if !lens_ok(g) || !lens_ok(&st.m) || !lens_ok(&st.v) {
        return Err(RefError::Params(
            "gradients or moments do not match the parameters' lengths".into(),
        ));
    }
    let ok = (0.0..1.0).contains(&h.beta1)
        && (0.0..1.0).contains(&h.beta2)
        && h.eps > 0.0
        && h.lr.is_finite()
        && h.clip.is_none_or(|c| c > 0.0);
    if !ok {
        return Err(RefError::Config {
            field: "train",
            msg: format!("bad AdamW hyper-parameters {h:?}"),
        });
    }
    let norm = grad_norm(p, g);
    let c = h.clip.map_or(1.0, |clip| (clip / norm).min(1.0));
    st.step += 1;
    let t = st.step as i32;
    let (bc1, bc2) = (1.0 / (1.0 - h.beta1.powi(t)), 1.0 / (1.0 - h.beta2.powi(t)));
    let store = |x: f64| {
        if h.bf16_moments {
            bf16::from_f32(x as f32).to_f64()
        } else {
            x
        }
    };
    for (i, spec) in p.specs.iter().enumerate() {
        if !adamw_param(spec.kind) {
            continue;
        }
        let wd = if spec.decays() { h.weight_decay } else { 0.0 };
        let (pv, m, v) = (&mut p.data[i], &mut st.m[i], &mut st.v[i]);
        for j in 0..pv.len() {
            let gg = c * g[i][j];
            m[j] = store(h.beta1 * m[j] + (1.0 - h.beta1) * gg);
            v[j] = store(h.beta2 * v[j] + (1.0 - h.beta2) * gg * gg);
            let upd = m[j] * bc1 / ((v[j] * bc2).sqrt() + h.eps);
            let w = pv[j] as f64;
            pv[j] = (w - h.lr * (upd + wd * w)) as f32;
        }
    }
    Ok(norm)
}

/// The aux-loss-free balancing step: for each MoE layer in `load` (global layer index, tokens
/// per expert over the step), `bias_e += speed * sign(mean_load - load_e)` (no change where
/// equal to the mean).
pub fn bias_update(p: &mut Params, load: &ExpertLoad, speed: f64) -> Result<(), RefError> {
    for (l, counts) in load {
        let b = p.get_mut(&format!("layers.{l}.moe.bias"))?;
        if b.len() != counts.len() {
            return Err(RefError::Params(format!(
                "layer {l}: {} loads for {} experts",
                counts.len(),
                b.len()
            )));
        }
        let mean = counts.iter().sum::<u64>() as f64 / counts.len().max(1) as f64;
        for (bv, &c) in b.iter_mut().zip(counts) {
            let s = mean - c as f64;
            let sign = if s > 0.0 {
                1.0
            } else if s < 0.0 {
                -1.0
            } else {
                0.0
            };
            *bv = (*bv as f64 + speed * sign) as f32;
        }
    }
    Ok(())
}

/// The result of [`train_steps`].
#[derive(Clone, Debug)]
pub struct RefRun {
    /// Each step's loss (before its update).
    pub losses: Vec<f64>,
    /// Each step's gradient norm before clipping.
    pub grad_norms: Vec<f64>,
    /// The parameters after the last step.
    pub params: Params,
}

/// `steps` training steps from `p0` on `batches(step)` (0-based step): loss and gradients,
/// clipped AdamW with the configuration's schedule, then the bias update.
pub fn train_steps(
    cfg: &TrainConfig,
    p0: &Params,
    batches: impl Fn(u32) -> Vec<MicroBatch>,
    steps: u32,
    opts: &RefOptions,
) -> Result<RefRun, RefError> {
    let mut p = p0.clone();
    let mut st = AdamState::new(&p);
    let (mut losses, mut grad_norms) = (Vec::new(), Vec::new());
    for step in 0..steps {
        let mbs = batches(step);
        let w = f64::from(cfg.train.mtp_loss_weight);
        let r = loss_and_grads_mtp(&cfg.model, cfg.train.seq_len as usize, &p, &mbs, opts, w)?;
        let h = AdamHyper::of(cfg, step);
        grad_norms.push(adamw_step(&mut p, &r.grads64, &mut st, &h)?);
        bias_update(&mut p, &r.expert_load, cfg.train.bias_update_speed as f64)?;
        losses.push(r.loss);
    }
    Ok(RefRun {
        losses,
        grad_norms,
        params: p,
    })
}
