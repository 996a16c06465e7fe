//! `model`: layers of a DeepSeek-V3-shaped model built only from device kernels (crate
//! `kernels`) and expert-parallel communication (crate `ep`), run through `runtime` on emulated
//! devices or GPUs, and the infrastructure of the trainer that will compose them.
//!
//! - [`moe`]: the MoE layer (gate + group-limited routing, FP8 dispatch/combine on a
//!   communication SM partition overlapped with the shared expert, grouped FP8 expert GEMMs,
//!   backward through the same kernels) and its f64 host reference. `ptxforge moe` is a thin
//!   caller of it.
//! - [`net`]: the device implementation of one pipeline stage ([`net::DeviceStage`]): MLA
//!   attention, dense FP8 FFN, MoE layers, embedding and head, forward and backward.
//! - [`params`]: every parameter's name, shape, kind and deterministic initial value (the
//!   one list the device model, the reference trainer and checkpoints share).
//! - [`reference`](mod@reference): the independent f64 reference trainer (plain host loops, the device path's
//!   FP8/BF16 roundings modelled on request): step loss, every gradient, AdamW, bias update.
//! - [`stage`]: the contract between the pipeline executor and one pipeline stage's layers.
//! - [`train`]: the trainer: DualPipeV executor over `Stage` objects, device AdamW, the step,
//!   evaluation, checkpoints (bit-exact resume), loss curve and step trace.
//! - [`config`]: the training job's configuration ([`config::TrainConfig`]: model sizes,
//!   training, parallelism, device), loaded from TOML/JSON and validated before any work.
//! - [`data`]: the byte-level corpus shipped in the binary, `--data` files (text or `.npy`),
//!   the train/validation split, the seeded batch sampler and the unigram entropy.
//! - [`checkpoint`]: the self-describing, checksummed checkpoint format, written atomically.
//! - [`plot`]: the loss curve as SVG and PNG.
//! - [`trace`]: Chrome/Perfetto trace files (kernels on device, stream and SM-partition tracks).
//! - [`guard`]: non-finite detection naming step, layer and tensor.
//! - [`atomic`]: write-to-temp-then-rename, shared by everything above that writes a file.
//!
//! See `docs/ARCHITECTURE.md`, `docs/EP.md` and `docs/TRAIN.md`.

pub mod atomic;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod guard;
pub mod moe;
pub mod net;
pub mod params;
pub mod plot;
pub mod reference;
pub mod stage;
pub mod trace;
pub mod train;

/// Errors of the trainer and of the model's stages: each names what failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Data(#[from] data::DataError),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error(transparent)]
    Plot(#[from] plot::PlotError),
    #[error(transparent)]
    Io(#[from] atomic::IoError),
    #[error(transparent)]
    Param(#[from] params::ParamError),
    #[error("non-finite value: {0}")]
    NonFinite(#[from] guard::NonFinite),
    #[error("MoE layer {layer}: {source}")]
    Moe {
        layer: usize,
        #[source]
        source: moe::MoeError,
    },
    #[error(transparent)]
    Kernel(#[from] kernels::KernelError),
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
    #[error(transparent)]
    Pipeline(#[from] pipeline::ScheduleError),
    #[error("shape: {0}")]
    Shape(String),
    #[error("{0}: a worker thread panicked")]
    Panicked(String),
    #[error("not supported: {0}")]
    Unsupported(String),
    /// Multi-process training: a peer process (pipeline rank `rank`) failed, stopped, sent
    /// nothing within the timeout, or sent a malformed message.
    #[error("pipeline rank {rank}: {msg}")]
    Peer { rank: usize, msg: String },
}
