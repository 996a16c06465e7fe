//! `model`: layers of a DeepSeek-V3-shaped model built only from device kernels (crate
//! `kernels`) and expert-parallel communication (crate `ep`), run through `runtime` on emulated
//! devices or GPUs.
//!
//! - [`moe`]: the MoE layer (gate + group-limited routing, FP8 dispatch/combine on a
//!   communication SM partition overlapped with the shared expert, grouped FP8 expert GEMMs,
//!   backward through the same kernels) and its f64 host reference. `ptxforge moe` is a thin
//!   caller of it.
//!
//! See `docs/ARCHITECTURE.md` and `docs/EP.md`.

pub mod moe;
