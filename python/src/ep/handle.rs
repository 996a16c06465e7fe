//! `EpHandle` (`ptxforge.ep.Handle`): the routing a dispatch fixed, reused by combine and by a
//! cached dispatch (the backward passes), with the host copy of where every received row came
//! from.

use crate::kernels::convert;
use pyo3::prelude::*;
use runtime::Buffer;

/// What a dispatch fixed: the library's handle, the dispatch's top-k weights (reused by a
/// cached dispatch) and the host copy of where every received row came from.
#[pyclass(name = "EpHandle", module = "ptxforge.ep", frozen)]
pub struct EpHandle {
    pub(super) buffer_id: u64,
    pub(super) topk: u32,
    pub(super) inner: ep::Handle,
    pub(super) topk_w: Vec<Buffer<f32>>,
    pub(super) recv: Vec<RecvMeta>,
}

/// Host copy of one rank's received rows' metadata (`m_pad` rows each).
#[derive(Clone)]
pub(super) struct RecvMeta {
    pub(super) src: Vec<i32>,
    pub(super) slot: Vec<i32>,
    pub(super) expert: Vec<i32>,
    pub(super) weights: Vec<f32>,
    pub(super) counts: Vec<u32>,
}

/// Per-rank int32 arrays of one metadata field.
fn meta_arrays<'py>(
    py: Python<'py>,
    h: &EpHandle,
    f: impl Fn(&RecvMeta) -> Vec<i32>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    h.recv
        .iter()
        .map(|m| {
            let v = f(m);
            let n = v.len();
            convert::to_numpy(py, v, &[n])
        })
        .collect()
}

#[pymethods]
impl EpHandle {
    /// Tokens each rank dispatched.
    #[getter]
    fn num_tokens(&self) -> Vec<usize> {
        self.inner.ranks.iter().map(|r| r.num_tokens).collect()
    }
    /// Rows each rank received (every local expert's segment padded to 128 rows).
    #[getter]
    fn num_recv_rows(&self) -> Vec<usize> {
        self.inner.ranks.iter().map(|r| r.m_pad).collect()
    }
    /// Top-k of the dispatch.
    #[getter]
    fn topk(&self) -> u32 {
        self.topk
    }
    /// Per rank, int32 ``[rows]``: the source rank of each received row (-1: padding).
    #[getter]
    fn recv_src_rank<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        meta_arrays(py, self, |m| {
            m.src
                .iter()
                .map(|&s| if s < 0 { -1 } else { s >> 24 })
                .collect()
        })
    }
    /// Per rank, int32 ``[rows]``: the source token (its index on its source rank; -1: padding).
    #[getter]
    fn recv_src_token<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        meta_arrays(py, self, |m| {
            m.src
                .iter()
                .map(|&s| if s < 0 { -1 } else { s & 0xff_ffff })
                .collect()
        })
    }
    /// Per rank, int32 ``[rows]``: which top-k slot of its token each row is (-1: padding).
    #[getter]
    fn recv_topk_slot<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        meta_arrays(py, self, |m| m.slot.clone())
    }
    /// Per rank, int32 ``[rows]``: the local expert of each row (-1: padding); the
    /// ``m_indices`` of ``m_grouped_gemm_fp8_contiguous``.
    #[getter]
    fn recv_expert<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        meta_arrays(py, self, |m| m.expert.clone())
    }
    /// Per rank, the rows received per local expert (before padding).
    #[getter]
    fn num_recv_tokens_per_expert_list(&self) -> Vec<Vec<u32>> {
        self.recv.iter().map(|m| m.counts.clone()).collect()
    }
    fn __repr__(&self) -> String {
        format!(
            "ptxforge.ep.Handle(num_tokens={:?}, num_recv_rows={:?}, topk={})",
            self.num_tokens(),
            self.num_recv_rows(),
            self.topk
        )
    }
}
