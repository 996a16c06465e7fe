//! The independent f64 reference trainer of the V3-shaped model (issue 14): plain loops on the
//! host, no device kernels, its own code; the FP8 and BF16 roundings of the device path
//! modelled when asked for ([`RefOptions`]). The device trainer's step-1 loss and gradients and
//! its first steps' losses are compared against it.
//!
//! The math is `docs/TRAIN.md`'s contract (names and shapes: [`crate::params`]). Each
//! `seq_len` chunk of an EP rank's tokens is its own sequence (positions restart, causal mask
//! within it); routing is per token.
//!
//! What is modelled (`fp8`): the dense FFN and every expert GEMM with FP8 E4M3 operands in
//! forward, dgrad and wgrad, power-of-two scales: weights 128x128, the input, the SwiGLU output,
//! dY and dG|dU 1x128 per token, the wgrad operands along the tokens (128x1 blocks of each
//! GEMM's token segment; the cached input re-tiled with exact scales) — the scheme of
//! `model::moe` and `model::moe::reference` (see `reference/ffn.rs`). (`bf16`): BF16 copies of the
//! embedding and of the BF16-GEMM weights (attention projections, MoE gate, head), BF16 GEMM
//! operands and stored outputs, q/k/v/o of the attention, the residual stream and its gradient
//! at layer boundaries, the norms' input gradients, the FFN's BF16 intermediates (see
//! `reference/attn.rs`, `reference/model.rs`). Not modelled: f32 accumulation and f32 elementwise math (all f64
//! here), the attention kernel's BF16 P, any rounding of logits or gate logits (f32).
//!
//! - [`loss_and_grads`]: one step's loss, every parameter's gradient, the expert loads.
//! - [`forward`]: loss only, with per-token losses and the routing (for tests).
//! - [`optim`]: AdamW with BF16 moments and global-norm clipping, the aux-loss-free bias
//!   update, [`train_steps`].

mod attn;
mod ffn;
mod model;
mod moe;
pub mod optim;
mod tensor;

pub use attn::rope;
pub use moe::{route, RouteCfg};
pub use optim::{adamw_step, bias_update, grad_norm, train_steps, AdamHyper, AdamState, RefRun};

use crate::config::ModelConfig;
use crate::data::IGNORE_INDEX;
use crate::params::{specs, ParamError, Params};
use crate::stage::{ExpertLoad, MicroBatch};
use model::{Batch, MbResult, Model};

/// Which of the device path's roundings the reference models.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RefOptions {
    /// FP8 quantisation of the dense FFN's and the experts' GEMM operands (forward, dgrad,
    /// wgrad) as the device does.
    pub fp8: bool,
    /// BF16 storage where the device stores BF16 (see the module docs).
    pub bf16: bool,
}

impl RefOptions {
    /// Exact f64 math (differentiable: what finite differences check).
    pub const EXACT: RefOptions = RefOptions {
        fp8: false,
        bf16: false,
    };
    /// The device path's roundings.
    pub const DEVICE: RefOptions = RefOptions {
        fp8: true,
        bf16: true,
    };
}

/// Errors of the reference: each names what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum RefError {
    #[error("{field}: {msg}")]
    Config { field: &'static str, msg: String },
    #[error("micro-batch {mb}: {msg}")]
    Batch { mb: usize, msg: String },
    #[error("parameters: {0}")]
    Params(String),
    #[error(transparent)]
    Param(#[from] ParamError),
    #[error("the step has no labelled token")]
    NoLabels,
    #[error("a reference worker thread panicked")]
    Panicked,
}

/// One step of the reference.
#[derive(Clone, Debug)]
pub struct RefStep {
    /// Step loss: the cross-entropy summed over every micro-batch / labelled tokens of the step.
    pub loss: f64,
    pub labelled: usize,
    /// Each micro-batch's summed cross-entropy (nats, not divided), in the order given (what a
    /// last stage's `StageOut::Loss` returns).
    pub per_microbatch_loss: Vec<f64>,
    /// d(step loss)/d(parameter), f64, [`crate::params::specs`] order (`moe.bias`: zeros).
    pub grads64: Vec<Vec<f64>>,
    /// The same rounded to f32.
    pub grads: Params,
    /// Per MoE layer (global index) the tokens routed to each expert, all micro-batches.
    pub expert_load: ExpertLoad,
    /// With an MTP module: its cross-entropy summed over every micro-batch / labelled tokens
    /// of the step (the main loss's count, V3's normalisation); the gradients are those of
    /// `loss + mtp_weight x mtp_loss`.
    pub mtp_loss: Option<f64>,
    /// Each micro-batch's summed MTP cross-entropy (empty without MTP).
    pub per_microbatch_mtp_loss: Vec<f64>,
}

/// A forward pass of the reference.
#[derive(Clone, Debug)]
pub struct RefForward {
    pub loss: f64,
    pub labelled: usize,
    pub per_microbatch_loss: Vec<f64>,
    /// Per micro-batch, per token row (ranks in order, each rank's tokens in order), the token's
    /// cross-entropy (0 where unlabelled).
    pub token_losses: Vec<Vec<f64>>,
    /// Per micro-batch: for each MoE layer in order, each token row in order, its selected
    /// experts (selection order), concatenated.
    pub routes: Vec<Vec<usize>>,
    /// With an MTP module: its summed cross-entropy / labelled tokens (see [`RefStep`]).
    pub mtp_loss: Option<f64>,
}

/// The step loss of `mbs` (sequences of `seq_len` tokens) under parameters `p`, forward only.
pub fn forward(
    m: &ModelConfig,
    seq_len: usize,
    p: &Params,
    mbs: &[MicroBatch],
    opts: &RefOptions,
) -> Result<RefForward, RefError> {
    let (model, batches, labelled) = prepare(m, seq_len, p, mbs, opts, 0.0)?;
    let res = run_all(&model, &batches, 1.0 / labelled as f64, false)?;
    let per: Vec<f64> = res.iter().map(|r| r.loss).collect();
    let mtp = (m.mtp_depth > 0).then(|| res.iter().map(|r| r.mtp_loss).sum::<f64>());
    Ok(RefForward {
        loss: per.iter().sum::<f64>() / labelled as f64,
        labelled,
        mtp_loss: mtp.map(|s| s / labelled as f64),
        per_microbatch_loss: per,
        token_losses: res.iter().map(|r| r.token_losses.clone()).collect(),
        routes: res.into_iter().map(|r| r.routes).collect(),
    })
}

/// The step loss and every parameter's gradient of `mbs` under `p` (a model without MTP:
/// [`loss_and_grads_mtp`] takes the MTP loss weight).
pub fn loss_and_grads(
    m: &ModelConfig,
    seq_len: usize,
    p: &Params,
    mbs: &[MicroBatch],
    opts: &RefOptions,
) -> Result<RefStep, RefError> {
    if m.mtp_depth > 0 {
        return Err(RefError::Config {
            field: "model.mtp_depth",
            msg: "an MTP model needs its loss weight: use loss_and_grads_mtp".into(),
        });
    }
    loss_and_grads_mtp(m, seq_len, p, mbs, opts, 0.0)
}

/// [`loss_and_grads`] of a model with or without an MTP module: the gradients are those of
/// `loss + mtp_weight x mtp_loss` (`train.mtp_loss_weight`; unused without MTP).
pub fn loss_and_grads_mtp(
    m: &ModelConfig,
    seq_len: usize,
    p: &Params,
    mbs: &[MicroBatch],
    opts: &RefOptions,
    mtp_weight: f64,
) -> Result<RefStep, RefError> {
    let (model, batches, labelled) = prepare(m, seq_len, p, mbs, opts, mtp_weight)?;
    let res = run_all(&model, &batches, 1.0 / labelled as f64, true)?;
    let mut grads64: Vec<Vec<f64>> = p.data.iter().map(|d| vec![0.0; d.len()]).collect();
    let mut load: ExpertLoad = Vec::new();
    for r in &res {
        if let Some(g) = &r.grads {
            for (a, b) in grads64.iter_mut().zip(g) {
                moe::add(a, b);
            }
        }
        for (l, counts) in &r.loads {
            match load.iter_mut().find(|(ll, _)| ll == l) {
                Some((_, acc)) => acc.iter_mut().zip(counts).for_each(|(a, c)| *a += c),
                None => load.push((*l, counts.clone())),
            }
        }
    }
    let per: Vec<f64> = res.iter().map(|r| r.loss).collect();
    let per_mtp: Vec<f64> = match m.mtp_depth {
        0 => Vec::new(),
        _ => res.iter().map(|r| r.mtp_loss).collect(),
    };
    let grads = Params {
        specs: p.specs.clone(),
        data: grads64
            .iter()
            .map(|g| g.iter().map(|&v| v as f32).collect())
            .collect(),
    };
    Ok(RefStep {
        loss: per.iter().sum::<f64>() / labelled as f64,
        labelled,
        per_microbatch_loss: per,
        grads64,
        grads,
        expert_load: load,
        mtp_loss: (!per_mtp.is_empty()).then(|| per_mtp.iter().sum::<f64>() / labelled as f64),
        per_microbatch_mtp_loss: per_mtp,
    })
}

/// Runs every micro-batch (in parallel threads; results in the given order).
fn run_all(
    model: &Model,
    batches: &[Batch],
    scale: f64,
    backward: bool,
) -> Result<Vec<MbResult>, RefError> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, batches.len().max(1));
    let mut out = Vec::with_capacity(batches.len());
    for chunk in batches.chunks(threads) {
        let res: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = chunk
                .iter()
                .map(|b| s.spawn(move || model.run(b, scale, backward)))
                .collect();
            hs.into_iter().map(|h| h.join()).collect()
        });
        for r in res {
            out.push(r.map_err(|_| RefError::Panicked)?);
        }
    }
    Ok(out)
}

/// Validates the configuration, the parameters and the micro-batches; builds the model and the
/// flattened batches; counts the labelled tokens.
fn prepare(
    m: &ModelConfig,
    seq_len: usize,
    p: &Params,
    mbs: &[MicroBatch],
    opts: &RefOptions,
    mtp_weight: f64,
) -> Result<(Model, Vec<Batch>, usize), RefError> {
    check_config(m, opts)?;
    let want = specs(m);
    if p.specs != want || p.data.iter().zip(&want).any(|(d, s)| d.len() != s.len()) {
        return Err(RefError::Params(
            "names, shapes or lengths differ from the model configuration's".into(),
        ));
    }
    if seq_len == 0 {
        return Err(RefError::Config {
            field: "train.seq_len",
            msg: "must be positive".into(),
        });
    }
    let batches = mbs
        .iter()
        .enumerate()
        .map(|(i, mb)| batch(m, seq_len, i, mb))
        .collect::<Result<Vec<_>, _>>()?;
    let labelled: usize = mbs.iter().map(|mb| mb.labelled()).sum();
    if labelled == 0 {
        return Err(RefError::NoLabels);
    }
    Ok((Model::new(m, p, opts, mtp_weight)?, batches, labelled))
}

fn check_config(m: &ModelConfig, opts: &RefOptions) -> Result<(), RefError> {
    let bad = |field: &'static str, msg: String| Err(RefError::Config { field, msg });
    let dims = [
        ("model.vocab", m.vocab),
        ("model.hidden", m.hidden),
        ("model.heads", m.heads),
        ("model.q_lora_rank", m.q_lora_rank),
        ("model.kv_lora_rank", m.kv_lora_rank),
        ("model.qk_nope_head_dim", m.qk_nope_head_dim),
        ("model.qk_rope_head_dim", m.qk_rope_head_dim),
        ("model.v_head_dim", m.v_head_dim),
        ("model.layers", m.layers),
    ];
    for (f, v) in dims {
        if v == 0 {
            return bad(f, "must be positive".into());
        }
    }
    if !m.qk_rope_head_dim.is_multiple_of(2) {
        return bad("model.qk_rope_head_dim", "RoPE needs an even dim".into());
    }
    if m.mtp_depth > 1 {
        return bad(
            "model.mtp_depth",
            format!("{} is not 0 or 1 (one MTP module at most)", m.mtp_depth),
        );
    }
    if m.dense_layers > m.layers {
        return bad("model.dense_layers", "exceeds model.layers".into());
    }
    if !(m.norm_eps > 0.0 && m.rope_theta > 0.0) {
        return bad(
            "model.norm_eps",
            "norm_eps and rope_theta must be positive".into(),
        );
    }
    let moe = m.dense_layers < m.layers;
    if moe {
        RouteCfg::of(m).validate()?;
        if m.expert_intermediate == 0 || m.shared_experts > 1 {
            return bad(
                "model.expert_intermediate",
                "needs a positive intermediate and 0 or 1 shared experts".into(),
            );
        }
    }
    let mut ffn_dims = vec![("model.hidden", m.hidden)];
    if m.dense_layers > 0 || m.mtp_depth > 0 {
        ffn_dims.push(("model.dense_intermediate", m.dense_intermediate));
    }
    if moe {
        ffn_dims.push(("model.expert_intermediate", m.expert_intermediate));
    }
    for (f, v) in ffn_dims {
        if v == 0 || (opts.fp8 && v % 128 != 0) {
            return bad(f, format!("{v}: FP8 GEMM operands need multiples of 128"));
        }
    }
    Ok(())
}

/// Flattens one micro-batch (validating ids, labels and sequence lengths).
fn batch(m: &ModelConfig, seq_len: usize, i: usize, mb: &MicroBatch) -> Result<Batch, RefError> {
    let err = |msg: String| Err(RefError::Batch { mb: i, msg });
    if mb.inputs.len() != mb.labels.len() {
        return err(format!(
            "{} ranks of inputs, {} of labels",
            mb.inputs.len(),
            mb.labels.len()
        ));
    }
    let mut b = Batch {
        ids: Vec::new(),
        labels: Vec::new(),
        ranks: Vec::new(),
        seqs: Vec::new(),
    };
    for (r, (inp, lab)) in mb.inputs.iter().zip(&mb.labels).enumerate() {
        if inp.len() != lab.len() || inp.len() % seq_len != 0 {
            return err(format!(
                "rank {r}: {} inputs, {} labels: not equal whole sequences of {seq_len}",
                inp.len(),
                lab.len()
            ));
        }
        let t0 = b.ids.len();
        for (pos, (&id, &l)) in inp.iter().zip(lab).enumerate() {
            if id < 0 || id as u32 >= m.vocab {
                return err(format!(
                    "rank {r} token {pos}: id {id} not in 0..{}",
                    m.vocab
                ));
            }
            if l != IGNORE_INDEX && (l < 0 || l as u32 >= m.vocab) {
                return err(format!("rank {r} token {pos}: label {l} not a token id"));
            }
            b.ids.push(id as usize);
            b.labels.push(l);
        }
        let t1 = b.ids.len();
        b.ranks.push(t0..t1);
        b.seqs
            .extend((t0..t1).step_by(seq_len).map(|s| s..s + seq_len));
    }
    Ok(b)
}
