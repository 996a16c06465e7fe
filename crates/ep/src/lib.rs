//! `ep`: expert-parallel communication for MoE layers, DeepEP-style, written with the typed PTX
//! builder and run through `runtime` (the emulator, or GPUs).
//!
//! - [`routing`]: sigmoid gating with aux-loss-free bias and group-limited top-k (device kernel +
//!   CPU reference, bit-identical selection).
//! - [`layout`]: dispatch layout (tokens per rank / node / expert, token-in-rank mask) and the
//!   per-(token, k) slot of each copy inside its expert's segment.
//! - [`eplb`]: the expert load balancer (hierarchical and global policies).
//! - [`transport`]: the inter-node [`transport::Transport`] trait and its in-process emulation.
//! - [`proxy`]: the host-proxy transport (send windows, doorbells, proxy threads; NVSHMEM/IBGDA
//!   style) over an [`engine::Engine`] (in-process channels and the TCP [`mesh::MeshEngine`]
//!   here, MPI in `netmpi`, NCCL in `netnccl`).
//! - `peers` (private): same-node peers in other processes (one rank per process): their workspaces'
//!   IPC handles gathered and mapped.
//! - [`selfcheck`]: the cross-process check the engines' check programs share (seeded inputs,
//!   group, report, row check).
//! - [`grad`]: gate backward: per-(token, k) weight gradients put back to the home ranks, and
//!   the routing backward to the logits.
//! - [`comm`]: [`comm::EpGroup`] (ring buffers, counters, error buffers of all ranks), hierarchical
//!   dispatch and combine kernels, handles, typed timeouts.
//!
//! See `docs/EP.md` for the design.

// `is_multiple_of` needs Rust 1.87; the workspace supports 1.80. Rank loops index several
// parallel per-rank vectors at once.
#![allow(
    clippy::manual_is_multiple_of,
    clippy::needless_range_loop,
    clippy::useless_vec
)]

pub mod comm;
pub mod engine;
pub mod eplb;
pub mod grad;
pub mod kutil;
pub mod layout;
pub mod mesh;
mod peers;
pub mod proxy;
pub mod routing;
pub mod selfcheck;
pub mod transport;

pub use comm::{CombineOut, DispatchOut, EpConfig, EpGroup, Handle, Payload};
pub use engine::{Engine, InProcessEngine};
pub use eplb::{rebalance, EplbPlan};
pub use layout::{DispatchLayout, LayoutCfg};
pub use mesh::MeshEngine;
pub use proxy::{ProxyTransport, WindowKind, WindowSpec};
pub use routing::{RoutingCfg, RoutingOut};
pub use transport::{InProcessTransport, LinkClass, Transport};

/// Errors of the expert-parallel layer. Hangs become [`EpError::Timeout`].
#[derive(Debug, thiserror::Error)]
pub enum EpError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("shape: {0}")]
    Shape(String),
    #[error(
        "timeout on rank {rank}, channel {channel} ({role}): head {head}, tail {tail}, expected {expected} \
         (a peer stopped sending or consuming)"
    )]
    Timeout {
        rank: u32,
        channel: u32,
        role: String,
        head: u32,
        tail: u32,
        expected: u32,
    },
    #[error("building PTX: {0}")]
    Build(#[from] builder::BuildError),
    #[error("inter-node engine: {0}")]
    Engine(String),
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
}

pub type Result<T> = std::result::Result<T, EpError>;

pub(crate) fn cfg_err<T>(msg: impl Into<String>) -> Result<T> {
    Err(EpError::Config(msg.into()))
}
