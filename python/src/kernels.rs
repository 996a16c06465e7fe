//! The kernel library from Python: FP8 quantisation (1x128, 128x128, UE8M0) and the FP8/BF16
//! GEMMs (normal, MoE grouped contiguous and masked) of the `kernels` crate, on numpy data.
//!
//! Functions take array-likes and a `device=` keyword (spec string or `ptxforge.Device`,
//! default `"emu:0"`), copy the inputs to the device, run the library's host wrapper with the
//! GIL released, and return numpy arrays. BF16 results come back as float32 (exact: numpy has
//! no bfloat16). The pure-Python `ptxforge.kernels` re-exports these with DeepGEMM's flat
//! argument lists (`gemm_fp8(a_q, a_s, b_q, b_s)`).
//!
//! - [`convert`]: array-likes in, numpy out, `device=`, error mapping (shared with `ep`).
//! - [`quant`]: `quantize_fp8`, `dequantize_fp8`.
//! - [`gemm`]: `gemm_bf16`, `gemm_fp8_nt`, `m_grouped_gemm_fp8_nt_contiguous`,
//!   `m_grouped_gemm_fp8_nt_masked`.

use pyo3::prelude::*;

pub mod convert;
pub mod gemm;
pub mod quant;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(quant::quantize_fp8, m)?)?;
    m.add_function(wrap_pyfunction!(quant::dequantize_fp8, m)?)?;
    m.add_function(wrap_pyfunction!(gemm::gemm_bf16, m)?)?;
    m.add_function(wrap_pyfunction!(gemm::gemm_fp8_nt, m)?)?;
    m.add_function(wrap_pyfunction!(gemm::m_grouped_gemm_fp8_nt_contiguous, m)?)?;
    m.add_function(wrap_pyfunction!(gemm::m_grouped_gemm_fp8_nt_masked, m)?)?;
    Ok(())
}
