//! NCCL on GPUs, loaded at run time (no NCCL needed to build; a machine without it gets
//! [`NcclError::NcclUnavailable`], never a panic). This crate owns
//!
//! - [`Comm`]: an NCCL communicator over one CUDA [`runtime::Device`] per rank, created from a
//!   [`UniqueId`] that rank 0 makes and the job exchanges during bootstrap ([`Comm::bootstrap`]
//!   uses `dist`'s store `all_gather`), with the data-parallel collectives
//!   [`Comm::all_reduce`], [`Comm::reduce_scatter`] and [`Comm::all_gather`] on
//!   `runtime::Buffer`s (f32, bf16, f16, f64, integers);
//! - [`NcclEngine`]: an [`ep::Engine`] for the proxy transport's inter-node legs: messages
//!   ([`ep::engine::Msg::encode`]) move in rounds of grouped `ncclSend`/`ncclRecv` between
//!   device staging buffers, in order per pair of endpoints;
//! - the `netnccl-check` program (`src/bin/check.rs`) every rank runs in the multi-process tests
//!   (its checks: [`check`], [`epcheck`], [`faultcheck`]).
//!
//! No call blocks forever on a dead or hung peer: communicators are non-blocking where NCCL
//! allows (2.14+), every operation polls `ncclCommGetAsyncError` and a completion event, and
//! an error or [`Comm::timeout`] aborts the communicator (`ncclCommAbort`) with
//! [`NcclError::Aborted`] naming the operation.
//!
//! CI runs all of it on the fake NCCL in `crates/fakecuda` (`scripts/fakecuda.sh` installs it
//! as `libnccl.so`); `scripts/gpu-check.sh` runs the same checks with the real NCCL on a GPU.
//! docs/SCALE.md ("NCCL engine (GPUs)") describes the design.

mod api;
pub mod check;
mod comm;
mod engine;
pub mod epcheck;
pub mod faultcheck;

pub use comm::{default_timeout, Comm, NcclElem, ReduceOp, UniqueId};
pub use engine::NcclEngine;

/// What can go wrong with NCCL.
#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    /// No usable libnccl (not installed, not on the loader path, missing entry points, or
    /// disabled with `PTXFORGE_NO_NCCL`).
    #[error("NCCL unavailable: {0}")]
    NcclUnavailable(String),
    /// An NCCL call returned `code` (`name` is NCCL's text for it, `detail` its last error).
    #[error("{call} failed with ncclResult_t {code} ({name}){}", if detail.is_empty() { String::new() } else { format!(": {detail}") })]
    Call {
        call: &'static str,
        code: i32,
        name: String,
        detail: String,
    },
    /// Operation `op` (`all_reduce`, `engine round`, `init`, ...) failed or did not complete
    /// within the communicator's timeout: a peer died or hangs, or the ranks disagree. The
    /// communicator was aborted (`ncclCommAbort`); `peer` is the rank NCCL's error names, when
    /// it names one.
    #[error("NCCL {op} failed{}: {why}; communicator aborted", peer.map(|p| format!(" (peer rank {p})")).unwrap_or_default())]
    Aborted {
        op: &'static str,
        peer: Option<u32>,
        why: String,
    },
    /// A bad argument; `field` names it.
    #[error("invalid {field}: {why}")]
    Invalid { field: &'static str, why: String },
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
    #[error("bootstrap: {0}")]
    Dist(#[from] dist::DistError),
    /// The engine's progress thread stopped (the first error it met).
    #[error("NCCL engine: {0}")]
    Engine(String),
}

pub type Result<T> = std::result::Result<T, NcclError>;

/// The NCCL version the library reports (`ncclGetVersion`, e.g. 22703 for 2.27.3) and its path.
pub fn version() -> Result<(i32, String)> {
    let a = api::api()?;
    Ok((a.version, a.path.clone()))
}
