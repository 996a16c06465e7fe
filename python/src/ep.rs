//! (being written this session; see `src/lib.rs` for what this module will own)

use pyo3::prelude::*;

pub fn register(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
