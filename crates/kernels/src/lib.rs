//! `kernels`: the compute half of the DeepSeek-V3 FP8 recipe, written with the typed PTX builder.
//!
//! This crate owns the library kernels (generators `fn(Target, &Shape) -> ptx::Module`), their
//! typed host API over runtime buffers (shape/layout validation, configuration choice, a module
//! cache keyed by (kernel, target, config, device)), f64 CPU references, and the one
//! [`registry()`] that the CLI (`ptxforge kernels|emit|gemm|bench`) and the test suite iterate.
//!
//! - [`quant`]: FP8 E4M3 quantisation (1x128 per token group, 128x128 per weight block, power-of-two
//!   and UE8M0 scales), dequantisation, and the transposing 1x128 -> 128x1 re-tiling.
//! - [`gemm()`] ([`gemm_api`]): the one GEMM entry point: a [`GemmProblem`] (input type, layout,
//!   shapes, output, C, kernel choice) and its [`GemmBufs`], run by the `mma.sync` or the
//!   Hopper kernel.
//! - [`mod@gemm`]: `mma.sync` GEMMs, D = A x B^T ("NT"): BF16 (m16n8k16) and FP8 block-scaled
//!   (m16n8k32 e4m3, promotion of every 128-wide K block into FP32 with sa*sb), normal, MoE
//!   contiguous-grouped and masked-grouped; plus the un-promoted ablation kernel.
//! - [`moe`]: MoE expert-layer kernels: SwiGLU forward fused with FP8 1x128 quantisation,
//!   SwiGLU backward (FP8 dGU for dgrad, weighted bf16 dGU and activation for wgrad), and the
//!   transposing 1x128 ("128x1") quantiser feeding the K-grouped weight-gradient GEMM.
//! - [`train`]: the rest of a V3 training step: RMSNorm (+ fused FP8 quantisation), RoPE,
//!   softmax cross-entropy, gradient norm + AdamW, embedding gather / scatter-add.
//! - [`attn`]: MLA attention: causal varlen training forward/backward (FlashAttention-2 style)
//!   and FlashMLA-style paged decoding with split-KV, `mma.sync` BF16.
//! - [`tile`]: the small typed tile helpers kernels are written with (swizzled shared tiles,
//!   fragments, `cp.async` tile loads).
//! - [`mod@reference`]: f64 CPU references and error metrics.
//! - [`mod@registry`]: [`KernelInfo`] for every kernel.
//! - [`host`]: target choice and access to the shared module cache (`runtime::module_cache`).

// `is_multiple_of` needs Rust 1.87 (workspace MSRV 1.80); fragment loops index several arrays.
#![allow(
    clippy::manual_is_multiple_of,
    clippy::needless_range_loop,
    clippy::too_many_arguments,
    clippy::useless_vec
)]

pub mod attn;
pub mod gemm;
pub mod gemm_api;
pub mod hopper;
pub mod host;
pub mod moe;
pub mod quant;
pub mod reference;
pub mod registry;
pub mod tile;
pub mod train;

pub use gemm::{GemmConfig, InTy, Layout, OutTy};
pub use gemm_api::{
    gemm, GemmBufs, GemmProblem, GemmRun, KernelChoice, Operand, OutBuf, Resolved, Scales,
};
pub use moe::{quantize_fp8_1x128_t, swiglu_bwd, swiglu_fwd_fp8};
pub use quant::{
    dequantize_fp8_1x128, quantize_fp8_128x128, quantize_fp8_1x128, quantize_fp8_1x128_ue8m0,
    requantize_fp8_1x128_to_128x1_t, QuantSrc, ScaleMode,
};
pub use registry::{registry, CheckReport, KernelInfo, ParamInfo, Shape};
pub use train::embed::{embed_bwd, embed_fwd, EmbedSpec, TokenBatch};
pub use train::norm::{rmsnorm_bwd, rmsnorm_fwd, rmsnorm_fwd_fp8, RmsNormBwd, RmsNormSpec};
pub use train::optim::{adamw_step, grad_norm, AdamWConfig, ParamState};
pub use train::rope::{rope_apply, Positions, RopeConfig, RopeDir, RopeLayout, RopeTables, Yarn};
pub use train::xent::{xent_bwd, xent_fwd, xent_mean, Labels, XentGrad, XentSpec};

/// Errors of the kernel library. Bad shapes and layouts are reported, never panicked on.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("{kernel}: {msg}")]
    Shape { kernel: String, msg: String },
    #[error("{kernel}: target {arch} is not supported (supported: {supported})")]
    Target {
        kernel: String,
        arch: String,
        supported: String,
    },
    #[error("building PTX: {0}")]
    Build(#[from] builder::BuildError),
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
    #[error("unknown kernel `{0}` (see `ptxforge kernels`)")]
    Unknown(String),
}

pub type Result<T> = std::result::Result<T, KernelError>;

pub(crate) fn shape_err<T>(kernel: &str, msg: impl Into<String>) -> Result<T> {
    Err(KernelError::Shape {
        kernel: kernel.to_string(),
        msg: msg.into(),
    })
}
