//! `ptxforge._native`: the Rust half of the `ptxforge` Python package (PyO3, abi3 for CPython
//! >= 3.9). The pure-Python half lives in `python/ptxforge/`.
//!
//! - [`device`]: `devices()`, `Device("emu:0" | "cuda:0")`.
//! - [`array`]: device arrays (numpy round trip, DLPack, `__cuda_array_interface__`).
//! - [`module`]: `Module(ptx)` and `Module.launch` with checked arguments.
//! - [`errors`]: the Python exception types and the mapping from Rust errors.
//! - [`kernels`]: the kernel library (FP8 quantisation, FP8/BF16 GEMMs).
//! - [`ep`]: the DeepEP-shaped expert-parallel buffer.

use pyo3::prelude::*;

pub mod array;
pub mod device;
pub mod ep;
pub mod errors;
pub mod kernels;
pub mod module;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    device::register(m)?;
    array::register(m)?;
    module::register(m)?;
    kernels::register(m)?;
    ep::register(m)?;
    Ok(())
}
