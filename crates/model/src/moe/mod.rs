//! The DeepSeek-V3 MoE layer (routed experts + an optional shared expert), forward and backward,
//! across expert-parallel ranks (one device each). Every step is a device kernel (the sums of
//! the combined, shared-expert and gate-path tensors too: `f32_add` and conversions on the
//! compute stream); the host moves tensors and scalars and checks.
//!
//! Each device is split into a communication partition (`num_sms`, the top SMs) and a compute
//! partition (the rest, `Device::partition`). Communication runs on its own streams while the
//! compute kernels run on the compute partition's stream, so they overlap:
//!
//! ```text
//! forward   route+quantise | dispatch (fp8)           || shared expert fwd
//!                          | routed experts fwd: gemm gate/up -> swiglu+quant -> gemm down
//!                          | combine (bf16, weighted)  -> Y = combine + shared
//! backward  cached dispatch of dY (= combine^T)      || shared expert dgrad + wgrad
//!           top-k weight grads (comm SMs)            || routed dgrad: quant dY -> gemm down^T
//!                                                       -> swiglu bwd (+quant) -> gemm gate/up^T
//!           combine of dX_e (= dispatch^T, weighted) || gate bwd + routed wgrad (k-grouped FP8)
//!           dX = combine + shared dX + gate dX
//! ```
//!
//! Weight gradients use DeepGEMM's k-grouped FP8 wgrad: both operands quantised 1x128 along the
//! token dimension, one GEMM over all local experts' token segments, FP32 out. The shared expert
//! is replicated on every rank (its gradient is each rank's partial; the data-parallel
//! all-reduce is a host sum here).
//!
//! This module owns: the configuration ([`MoeConfig`]), the weights and their FP8 copies
//! ([`MoeWeights`], [`MoeLayer`]), the forward/backward phases ([`MoeLayer::forward_dev`],
//! [`MoeLayer::backward_dev`] over each rank's `[tokens, hidden]` BF16 device buffer; the
//! host-tensor wrappers [`MoeLayer::forward`], [`MoeLayer::backward`] over f32 host tensors)
//! with their per-phase statistics, the per-expert token counts ([`MoeLayer::expert_counts`],
//! a device kernel), and the f64 host reference ([`reference::check`]). The weights and all
//! intermediates stay on the devices.

mod exec;
pub(crate) mod host;
mod layer;
pub(crate) mod mlp;
pub mod reference;

pub use exec::{Progress, ProgressPhase, Quiet, Span, TraceSpan};
pub use layer::{
    check_devices, Backward, BackwardStats, ExpertDw, Forward, ForwardStats, GateGrad,
    MoeDeviceWeights, MoeLayer, Overlap, Placement,
};
pub use reference::{check, CheckConfig, CheckReport, ErrStats, Tolerances};

use half::bf16;
use rand::Rng;
use std::time::Duration;

/// Errors of the MoE layer. Per-rank failures name the phase and the rank.
#[derive(Debug, thiserror::Error)]
pub enum MoeError {
    #[error("invalid MoE configuration: {field}: {msg}")]
    Config { field: &'static str, msg: String },
    #[error("shape: {0}")]
    Shape(String),
    #[error("{phase}: rank {rank}: {source}")]
    Rank {
        phase: String,
        rank: usize,
        #[source]
        source: Box<MoeError>,
    },
    #[error("{0}: a worker thread panicked")]
    Panicked(String),
    #[error("check: {0}")]
    Check(String),
    #[error(transparent)]
    Ep(#[from] ep::EpError),
    #[error(transparent)]
    Kernel(#[from] kernels::KernelError),
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
}

pub type Result<T> = std::result::Result<T, MoeError>;

fn cfg_err<T>(field: &'static str, msg: impl Into<String>) -> Result<T> {
    Err(MoeError::Config {
        field,
        msg: msg.into(),
    })
}

/// Limits of [`MoeConfig::validate`] (docs/RELIABILITY.md, "Limits"): each rank is an
/// emulated device with its own threads, and every size multiplies into buffers.
pub const MAX_NODES: u32 = 64;
pub const MAX_GPUS_PER_NODE: u32 = 16;
/// Hidden and intermediate sizes (V3: 7168 and 2048).
pub const MAX_HIDDEN: u32 = 1 << 16;
/// Tokens per rank (V3: 4096).
pub const MAX_TOKENS: u32 = 1 << 20;
/// Routed experts (V3: 256).
pub const MAX_EXPERTS: u32 = 4096;

/// Which grouped FP8 GEMM kernel the experts use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmKind {
    /// `mma.sync` (any sm_89+).
    Mma,
    /// The sm_90a persistent TMA/wgmma kernel (needs an sm_90a target).
    Wgmma,
}

/// Sizes and execution choices of one MoE layer over `nodes x gpus_per_node` ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub hidden: u32,
    /// Routed experts (spread evenly over the ranks).
    pub experts: u32,
    /// Intermediate size of every expert (routed and shared).
    pub intermediate: u32,
    /// Tokens per rank.
    pub tokens: u32,
    pub topk: u32,
    /// Expert groups for group-limited routing, and how many of them a token may use.
    pub groups: u32,
    pub topk_groups: u32,
    /// Routed weights are multiplied by this after normalisation (V3: 2.5).
    pub route_scaling: f32,
    /// One shared expert (replicated on every rank) or none.
    pub shared: bool,
    /// SMs of each device given to dispatch/combine (even); compute gets the rest.
    pub num_sms: u32,
    /// Run communication and compute one after the other instead of overlapped.
    pub sequential: bool,
    /// What the forward dispatch carries: FP8 (1x128 quantised on the home rank, as V3) or BF16
    /// (quantised 1x128 on the expert side after the dispatch).
    pub payload: ep::Payload,
    /// Seed of the random weights and inputs (for [`random_step`]; the layer itself draws no
    /// random numbers).
    pub seed: u64,
    pub gemm: GemmKind,
    /// No-progress timeout of the dispatch/combine wait loops (`EpConfig::timeout`); `None`:
    /// the library's default.
    pub comm_timeout: Option<Duration>,
    /// Combine one top-k slot at a time (`topk` combines, each carrying exactly one of a token's
    /// rows, unweighted) and sum a token's weighted expert outputs on its home rank in slot order
    /// (`kernels::train::ops::topk_slot_acc`): the sum no longer depends on which ranks hold
    /// the experts (the one-combine path sums each rank's, then each node's, partials in BF16).
    pub slot_combine: bool,
    /// The replicated weights' (gate, shared expert) gradients are computed per chunk of
    /// `tokens / wgrad_chunks` tokens of each rank, in token order, and returned apart
    /// ([`GateGrad::dw`], [`Backward::shared_dw`]): an EP-1 layer over `n x T` tokens with `n`
    /// chunks reduces in the order of an EP-`n` layer's ranks.
    pub wgrad_chunks: u32,
}

impl MoeConfig {
    /// 2 nodes x 4 devices, hidden 1024, 64 experts (intermediate 512), 512 tokens per rank,
    /// top-8 of 8 groups (4 used): the emulator-sized default of `ptxforge moe`.
    pub fn small() -> MoeConfig {
        MoeConfig {
            nodes: 2,
            gpus_per_node: 4,
            hidden: 1024,
            experts: 64,
            intermediate: 512,
            tokens: 512,
            topk: 8,
            groups: 8,
            topk_groups: 4,
            route_scaling: 2.5,
            shared: true,
            num_sms: 20,
            sequential: false,
            payload: ep::Payload::Fp8,
            seed: 1,
            gemm: GemmKind::Mma,
            comm_timeout: None,
            slot_combine: false,
            wgrad_chunks: 1,
        }
    }

    /// DeepSeek-V3's sizes: 8 nodes x 8 GPUs, hidden 7168, 256 experts (2048), 4096 tokens.
    pub fn v3() -> MoeConfig {
        MoeConfig {
            nodes: 8,
            gpus_per_node: 8,
            hidden: 7168,
            experts: 256,
            intermediate: 2048,
            tokens: 4096,
            ..MoeConfig::small()
        }
    }

    pub fn ranks(&self) -> usize {
        // in usize: two u32 factors cannot overflow it on a 64-bit host
        self.nodes as usize * self.gpus_per_node as usize
    }

    /// About how many bytes of host memory a step needs (the emulator's device memory is host
    /// memory too): every expert's weights with their FP8 copies and gradients (the shared
    /// expert once per rank), and per rank the activations, dispatched tokens and expert
    /// intermediates of forward and backward, with the f64 reference's share. An estimate to
    /// refuse hopeless configurations up front, within a factor of about 2.
    pub fn host_bytes(&self) -> u128 {
        let (h, i, t, k) = (
            self.hidden as u128,
            self.intermediate as u128,
            self.tokens as u128,
            self.topk as u128,
        );
        let ranks = self.ranks() as u128;
        let experts = self.experts as u128 + if self.shared { ranks } else { 0 };
        let weights = experts * 3 * i * h * 13;
        let activations = ranks * t * (h * 48 + k * (h * 16 + i * 24));
        weights + activations
    }

    /// Refuses a configuration whose step would not fit the host memory available now, saying
    /// what it needs (e.g. `--config v3`: hundreds of GiB).
    pub fn check_memory(&self) -> Result<()> {
        let need = self.host_bytes();
        match emu::limits::available_memory() {
            Some(avail) if need > avail as u128 => cfg_err(
                "memory",
                format!(
                    "this configuration needs about {} GiB of host memory (weights, FP8 copies and \
                     gradients of {} experts of {}x{}, activations of {} ranks x {} tokens); {} GiB \
                     are available: use fewer experts, tokens or ranks, or a smaller hidden size",
                    need >> 30,
                    self.experts,
                    self.hidden,
                    self.intermediate,
                    self.ranks(),
                    self.tokens,
                    avail >> 30
                ),
            ),
            _ => Ok(()),
        }
    }

    /// Routed experts per rank.
    pub fn local_experts(&self) -> usize {
        self.experts as usize / self.ranks().max(1)
    }

    pub fn routing(&self) -> ep::RoutingCfg {
        ep::RoutingCfg {
            experts: self.experts,
            groups: self.groups,
            topk_groups: self.topk_groups,
            topk: self.topk,
            scaling: self.route_scaling,
        }
    }

    /// Checks the sizes before any work; the error names the field.
    pub fn validate(&self) -> Result<()> {
        if self.nodes == 0 || self.gpus_per_node == 0 {
            return cfg_err("nodes", "nodes and gpus_per_node must be at least 1");
        }
        for (field, v, limit) in [
            ("nodes", self.nodes, MAX_NODES),
            ("gpus_per_node", self.gpus_per_node, MAX_GPUS_PER_NODE),
            ("hidden", self.hidden, MAX_HIDDEN),
            ("intermediate", self.intermediate, MAX_HIDDEN),
            ("tokens", self.tokens, MAX_TOKENS),
            ("experts", self.experts, MAX_EXPERTS),
        ] {
            if v > limit {
                return cfg_err(field, format!("{v} is above the limit of {limit}"));
            }
        }
        for (field, v) in [
            ("hidden", self.hidden),
            ("intermediate", self.intermediate),
            ("tokens", self.tokens),
        ] {
            if v == 0 || v % 128 != 0 {
                return cfg_err(field, format!("{v} is not a positive multiple of 128"));
            }
        }
        if self.experts == 0 || (self.experts as usize).checked_rem(self.ranks()) != Some(0) {
            return cfg_err(
                "experts",
                format!(
                    "{} is not a positive multiple of the {} ranks",
                    self.experts,
                    self.ranks()
                ),
            );
        }
        if self.num_sms == 0 {
            return cfg_err("num_sms", "communication needs at least one SM");
        }
        let chunks = self.wgrad_chunks.max(1);
        if self.wgrad_chunks == 0 || !self.tokens.is_multiple_of(128 * chunks) {
            return cfg_err(
                "wgrad_chunks",
                format!(
                    "{} chunks of the {} tokens per rank must be positive multiples of 128 tokens",
                    self.wgrad_chunks, self.tokens
                ),
            );
        }
        self.routing().validate()?;
        Ok(())
    }
}

/// The layer's FP32 master weights (the gate in BF16: DeepSeek keeps it out of FP8).
#[derive(Clone, Debug)]
pub struct MoeWeights {
    /// `[E, H]` router weight.
    pub gate: Vec<bf16>,
    /// `[E]` aux-loss-free selection bias.
    pub bias: Vec<f32>,
    /// Per expert (routed `0..E`, then the shared one) W_gate|up `[2I, H]`.
    pub w1: Vec<Vec<f32>>,
    /// Per expert W_down `[H, I]`.
    pub w2: Vec<Vec<f32>>,
}

/// One step's per-rank inputs `[T, H]` and output gradients `[T, H]`.
#[derive(Clone, Debug)]
pub struct StepData {
    pub x: Vec<Vec<f32>>,
    pub dy: Vec<Vec<f32>>,
}

/// Uniform random weights and step data drawn from `rng` in a fixed order (x, gate, bias, W1s,
/// W2s, dY), so a seed fixes every number: x, dY in [-1, 1), gate in [-0.1, 0.1), bias in
/// [-0.05, 0.05), expert weights in [-0.05, 0.05).
pub fn random_step(c: &MoeConfig, rng: &mut impl Rng) -> (MoeWeights, StepData) {
    let (rn, h, e_n, i_n, t_n) = (
        c.ranks(),
        c.hidden as usize,
        c.experts as usize,
        c.intermediate as usize,
        c.tokens as usize,
    );
    let mut uniform =
        |n: usize, a: f32| -> Vec<f32> { (0..n).map(|_| rng.gen_range(-a..a)).collect() };
    let x: Vec<Vec<f32>> = (0..rn).map(|_| uniform(t_n * h, 1.0)).collect();
    let gate = uniform(e_n * h, 0.1)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let bias = uniform(e_n, 0.05);
    let n_w = e_n + c.shared as usize;
    let w1 = (0..n_w).map(|_| uniform(2 * i_n * h, 0.05)).collect();
    let w2 = (0..n_w).map(|_| uniform(h * i_n, 0.05)).collect();
    let dy = (0..rn).map(|_| uniform(t_n * h, 1.0)).collect();
    (MoeWeights { gate, bias, w1, w2 }, StepData { x, dy })
}
