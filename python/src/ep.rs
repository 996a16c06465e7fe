//! The DeepEP-shaped expert-parallel buffer (`ptxforge.ep.Buffer`) over the `ep` crate's
//! hierarchical dispatch and combine kernels ([`ep::EpGroup`]).
//!
//! One process holds every rank (as `ptxforge moe` does): per-rank inputs and outputs are lists
//! with one array per rank, rank `r` living on device `devices[r]` (default `emu:r`). The
//! native class `EpBuffer` takes its configuration as one dict; the pure-Python
//! `ptxforge.ep.Buffer` gives it DeepEP's keyword constructor and docstrings.
//!
//! - [`config`]: the constructor's configuration, checked field by field.
//! - [`buffer`]: `EpBuffer` (`get_dispatch_layout`, `dispatch`, `combine`).
//! - [`handle`]: `EpHandle`, what a dispatch fixed (for combine and the backward passes).

use pyo3::prelude::*;

pub mod buffer;
pub mod config;
pub mod handle;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<buffer::EpBuffer>()?;
    m.add_class::<handle::EpHandle>()?;
    Ok(())
}
