//! `EpBuffer` (`ptxforge.ep.Buffer`'s native half): layout, dispatch and combine over every rank
//! of one process.

use super::config::{Config, RawConfig};
use super::handle::{EpHandle, RecvMeta};
use crate::kernels::convert::{self, ep_err, interruptible, HostArray};
use ep::comm::{EpGroup, XRef};
use ep::transport::InProcessTransport;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use runtime::half::bf16;
use runtime::{Buffer, Device};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The expert-parallel buffer of one process that holds every rank (see the module docs of
/// `ep`); the Python face is `ptxforge.ep.Buffer`.
#[pyclass(name = "EpBuffer", module = "ptxforge.ep", frozen)]
pub struct EpBuffer {
    cfg: Config,
    devices: Vec<Device>,
    id: u64,
    /// One group per top-k (the kernels are generated for it), made at its first dispatch.
    groups: Mutex<HashMap<u32, EpGroup>>,
}

/// One rank's dispatch payload on the host.
enum Payload {
    Bf16(Vec<bf16>),
    Fp8(Vec<u8>, Vec<f32>),
}

/// What a fresh dispatch adds to its handle: the library's handle and the top-k weights.
type Fresh = (ep::Handle, Vec<Buffer<f32>>);

/// One rank's dispatch payload on its device.
enum DevPayload {
    Bf16(Buffer<bf16>),
    Fp8(Buffer<u8>, Buffer<f32>),
}

/// One rank's dispatch input on the host (routing empty for a cached dispatch).
struct RankIn {
    x: Payload,
    topk_idx: Vec<i32>,
    topk_w: Vec<f32>,
}

/// One rank's received rows on the host.
struct RankRecv {
    x: Payload,
    meta: RecvMeta,
}

fn bad(field: &str, msg: String) -> PyErr {
    PyValueError::new_err(format!("{field}: {msg}"))
}

/// Parses rank `r`'s `x`: a floating `[T, H]` array (BF16 payload) or a tuple `(q, scales)`.
fn payload(obj: &Bound<'_, PyAny>, r: usize, hidden: usize) -> PyResult<(Payload, usize)> {
    let name = format!("x[{r}]");
    if let Ok(t) = obj.cast::<PyTuple>() {
        if t.len() != 2 {
            return Err(bad(
                &name,
                format!(
                    "an FP8 payload is a (q, scales) pair, got {} items",
                    t.len()
                ),
            ));
        }
        let q = convert::e4m3_bytes(&t.get_item(0)?, &format!("{name}[0]"))?;
        let s = convert::floats(&t.get_item(1)?, &format!("{name}[1]"))?;
        let [tok, h] = q.dims::<2>(&format!("{name}[0]"), "[tokens, hidden]")?;
        check_hidden(&format!("{name}[0]"), h, hidden)?;
        if s.shape != [tok, hidden / 128] {
            return Err(bad(
                &format!("{name}[1]"),
                format!(
                    "shape {} should be ({tok}, {})",
                    convert::shape_str(&s.shape),
                    hidden / 128
                ),
            ));
        }
        return Ok((Payload::Fp8(q.data, s.data), tok));
    }
    let a = convert::floats(obj, &name)?;
    let [tok, h] = a.dims::<2>(&name, "[tokens, hidden]")?;
    check_hidden(&name, h, hidden)?;
    Ok((Payload::Bf16(convert::f32_to_bf16(&a.data)), tok))
}

fn check_hidden(name: &str, h: usize, hidden: usize) -> PyResult<()> {
    if h != hidden {
        return Err(bad(
            name,
            format!("hidden = {h} differs from the Buffer's hidden = {hidden}"),
        ));
    }
    Ok(())
}

/// Checks one rank's `topk_idx` `[T, topk]`: entries in `-1..experts` (-1: no expert), no
/// expert twice in a row. Returns `topk`.
fn check_topk_idx(a: &HostArray<i32>, name: &str, tokens: usize, experts: u32) -> PyResult<usize> {
    let [t, k] = a.dims::<2>(name, "[tokens, topk]")?;
    if t != tokens {
        return Err(bad(name, format!("{t} rows for {tokens} tokens")));
    }
    if k == 0 || k > 32 || k > experts as usize {
        return Err(bad(
            name,
            format!("topk = {k} outside 1..={}", experts.min(32)),
        ));
    }
    for (row, ids) in a.data.chunks(k).enumerate() {
        for (j, &e) in ids.iter().enumerate() {
            if e < -1 || e >= experts as i32 {
                return Err(bad(
                    name,
                    format!("[{row}, {j}] = {e} outside -1..{experts} (-1: no expert)"),
                ));
            }
            if e >= 0 && ids[..j].contains(&e) {
                return Err(bad(name, format!("row {row} names expert {e} twice")));
            }
        }
    }
    Ok(k)
}

/// `list` as exactly `ranks` items, or a `ValueError` naming `name`.
fn per_rank<'py>(list: &[Bound<'py, PyAny>], name: &str, ranks: u32) -> PyResult<()> {
    if list.len() != ranks as usize {
        return Err(bad(
            name,
            format!(
                "{} arrays for num_ranks = {ranks} (one per rank)",
                list.len()
            ),
        ));
    }
    Ok(())
}

impl EpBuffer {
    /// Every rank's payload, with the same format on all ranks.
    fn payloads(&self, x: &[Bound<'_, PyAny>]) -> PyResult<Vec<(Payload, usize)>> {
        per_rank(x, "x", self.cfg.ranks)?;
        let mut out = Vec::new();
        for (r, o) in x.iter().enumerate() {
            let (p, t) = payload(o, r, self.cfg.hidden as usize)?;
            if t > self.cfg.max_tokens as usize {
                return Err(bad(
                    &format!("x[{r}]"),
                    format!(
                        "{t} tokens exceed max_tokens_per_rank = {}",
                        self.cfg.max_tokens
                    ),
                ));
            }
            if let Some((p0, _)) = out.first() {
                if matches!(p0, Payload::Fp8(..)) != matches!(p, Payload::Fp8(..)) {
                    return Err(bad(
                        "x",
                        "every rank must use the same payload (all FP8 tuples or all arrays)"
                            .into(),
                    ));
                }
            }
            out.push((p, t));
        }
        Ok(out)
    }

    /// Every rank's routing for a fresh dispatch; returns the inputs and top-k.
    fn routed(
        &self,
        xs: Vec<(Payload, usize)>,
        topk_idx: &[Bound<'_, PyAny>],
        topk_w: &[Bound<'_, PyAny>],
    ) -> PyResult<(Vec<RankIn>, u32)> {
        per_rank(topk_idx, "topk_idx", self.cfg.ranks)?;
        per_rank(topk_w, "topk_weights", self.cfg.ranks)?;
        let mut topk = None;
        let mut ins = Vec::new();
        for (r, (x, tokens)) in xs.into_iter().enumerate() {
            let (ni, nw) = (format!("topk_idx[{r}]"), format!("topk_weights[{r}]"));
            let idx = convert::ints(&topk_idx[r], &ni)?;
            let k = check_topk_idx(&idx, &ni, tokens, self.cfg.experts)?;
            if *topk.get_or_insert(k) != k {
                return Err(bad(
                    &ni,
                    format!("topk = {k} differs from rank 0's {}", topk.unwrap_or(k)),
                ));
            }
            let w = convert::floats(&topk_w[r], &nw)?;
            if w.shape != idx.shape {
                return Err(bad(
                    &nw,
                    format!(
                        "shape {} differs from topk_idx's {}",
                        convert::shape_str(&w.shape),
                        convert::shape_str(&idx.shape)
                    ),
                ));
            }
            ins.push(RankIn {
                x,
                topk_idx: idx.data,
                topk_w: w.data,
            });
        }
        Ok((ins, topk.unwrap_or(1) as u32))
    }

    fn handle_of<'a>(&self, h: &'a EpHandle) -> PyResult<&'a EpHandle> {
        if h.buffer_id != self.id {
            return Err(bad("handle", "comes from another Buffer".into()));
        }
        Ok(h)
    }

    /// The group for `topk`, made on first use.
    fn group<'a>(
        &self,
        groups: &'a mut HashMap<u32, EpGroup>,
        topk: u32,
    ) -> ep::Result<&'a mut EpGroup> {
        use std::collections::hash_map::Entry;
        Ok(match groups.entry(topk) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                let tr = InProcessTransport {
                    devices: self.devices.clone(),
                    gpus_per_node: self.cfg.gpus_per_node,
                };
                let cfg = self.cfg.ep_config(topk);
                v.insert(EpGroup::new(cfg, self.devices.clone(), Box::new(tr))?)
            }
        })
    }

    /// Uploads, dispatches and reads back (GIL released by the caller).
    fn run_dispatch(
        &self,
        topk: u32,
        ins: &[RankIn],
        cached: Option<&EpHandle>,
    ) -> ep::Result<(Vec<RankRecv>, Option<Fresh>)> {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let g = self.group(&mut groups, topk)?;
        let mut xb = Vec::new();
        let (mut ib, mut wb) = (Vec::new(), Vec::new());
        for (r, i) in ins.iter().enumerate() {
            let d = &self.devices[r];
            xb.push(match &i.x {
                Payload::Bf16(v) => DevPayload::Bf16(d.upload(v)?),
                Payload::Fp8(q, s) => DevPayload::Fp8(d.upload(q)?, d.upload(s)?),
            });
            if cached.is_none() {
                ib.push(d.upload(&i.topk_idx)?);
                wb.push(d.upload(&i.topk_w)?);
            }
        }
        let xr: Vec<XRef> = xb
            .iter()
            .map(|b| match b {
                DevPayload::Bf16(b) => XRef::Bf16(b),
                DevPayload::Fp8(q, s) => XRef::Fp8(q, s),
            })
            .collect();
        let (idx, w): (Vec<&Buffer<i32>>, Vec<&Buffer<f32>>) = match cached {
            Some(h) => (
                h.inner.ranks.iter().map(|r| &r.topk_idx).collect(),
                h.topk_w.iter().collect(),
            ),
            None => (ib.iter().collect(), wb.iter().collect()),
        };
        let (outs, fresh) = g.dispatch(&xr, &idx, &w, cached.map(|h| &h.inner))?;
        let hidden = self.cfg.hidden as usize;
        let recv = outs
            .iter()
            .zip(ins)
            .map(|(o, i)| read_recv(o, matches!(i.x, Payload::Fp8(..)), hidden))
            .collect::<ep::Result<Vec<_>>>()?;
        Ok((recv, fresh.map(|h| (h, wb))))
    }
}

/// One rank's dispatch output on the host, trimmed to its `m_pad` rows.
fn read_recv(o: &ep::DispatchOut, fp8: bool, hidden: usize) -> ep::Result<RankRecv> {
    let m = o.m_pad;
    let trim = |mut v: Vec<i32>| {
        v.truncate(m);
        v
    };
    let x = if fp8 {
        let mut q = o.recv_x.to_vec()?;
        q.truncate(m * hidden);
        let mut s = o.recv_scales.to_vec()?;
        s.truncate(m * hidden / 128);
        Payload::Fp8(q, s)
    } else {
        let b = o.recv_x.to_vec()?;
        Payload::Bf16(
            b.chunks_exact(2)
                .take(m * hidden)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        )
    };
    let mut weights = o.recv_w.to_vec()?;
    weights.truncate(m);
    Ok(RankRecv {
        x,
        meta: RecvMeta {
            src: trim(o.recv_src.to_vec()?),
            slot: trim(o.recv_k.to_vec()?),
            expert: o.m_indices_host.iter().copied().take(m).collect(),
            weights,
            counts: o.counts.clone(),
        },
    })
}

/// A payload as Python returns it: float32 `[rows, H]`, or `(q, scales)`.
fn payload_py<'py>(py: Python<'py>, p: Payload, hidden: usize) -> PyResult<Bound<'py, PyAny>> {
    match p {
        Payload::Bf16(v) => {
            let rows = v.len() / hidden;
            convert::to_numpy(py, convert::bf16_to_f32(&v), &[rows, hidden])
        }
        Payload::Fp8(q, s) => {
            let rows = q.len() / hidden;
            let q = convert::to_numpy(py, q, &[rows, hidden])?;
            let s = convert::to_numpy(py, s, &[rows, hidden / 128])?;
            Ok(PyTuple::new(py, [q, s])?.into_any())
        }
    }
}

/// Rank `r`'s combine rows: floating `[m_pad, H]`, rounded to BF16.
fn combine_rows(
    obj: &Bound<'_, PyAny>,
    r: usize,
    m_pad: usize,
    hidden: usize,
) -> PyResult<Vec<bf16>> {
    let name = format!("x[{r}]");
    let a = convert::floats(obj, &name)?;
    let [rows, h] = a.dims::<2>(&name, "[rows, hidden]")?;
    if rows != m_pad {
        return Err(bad(
            &name,
            format!("{rows} rows; rank {r} received {m_pad} (the handle's dispatch)"),
        ));
    }
    check_hidden(&name, h, hidden)?;
    Ok(convert::f32_to_bf16(&a.data))
}

fn combine_weights(obj: &Bound<'_, PyAny>, r: usize, m_pad: usize) -> PyResult<Vec<f32>> {
    let name = format!("topk_weights[{r}]");
    let a = convert::floats(obj, &name)?;
    if a.shape != [m_pad] {
        return Err(bad(
            &name,
            format!(
                "shape {} should be ({m_pad},), one weight per received row",
                convert::shape_str(&a.shape)
            ),
        ));
    }
    Ok(a.data)
}

impl EpBuffer {
    /// Uploads, combines and reads back (GIL released by the caller).
    fn run_combine(
        &self,
        h: &EpHandle,
        ys: &[Vec<bf16>],
        ws: Option<&[Vec<f32>]>,
    ) -> ep::Result<Vec<Vec<f32>>> {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let g = self.group(&mut groups, h.topk)?;
        let yb = ys
            .iter()
            .zip(&self.devices)
            .map(|(y, d)| d.upload(y))
            .collect::<runtime::Result<Vec<_>>>()?;
        let wb = match ws {
            Some(ws) => Some(
                ws.iter()
                    .zip(&self.devices)
                    .map(|(w, d)| d.upload(w))
                    .collect::<runtime::Result<Vec<_>>>()?,
            ),
            None => None,
        };
        let yr: Vec<&Buffer<bf16>> = yb.iter().collect();
        let wr: Option<Vec<&Buffer<f32>>> = wb.as_ref().map(|w| w.iter().collect());
        let outs = g.combine(&yr, wr.as_deref(), &h.inner)?;
        let hidden = self.cfg.hidden as usize;
        outs.iter()
            .zip(&h.inner.ranks)
            .map(|(o, rh)| {
                let mut v = convert::bf16_to_f32(&o.to_vec()?);
                v.truncate(rh.num_tokens * hidden);
                Ok(v)
            })
            .collect()
    }

    /// The Python result of a dispatch: the tuple of per-rank lists, and the handle.
    fn dispatch_result<'py>(
        &self,
        py: Python<'py>,
        recv: Vec<RankRecv>,
        handle: Bound<'py, EpHandle>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let hidden = self.cfg.hidden as usize;
        let (mut xs, mut experts, mut weights, mut counts) = (vec![], vec![], vec![], vec![]);
        for r in recv {
            xs.push(payload_py(py, r.x, hidden)?);
            let m = r.meta.expert.len();
            experts.push(convert::to_numpy(py, r.meta.expert, &[m])?);
            weights.push(convert::to_numpy(py, r.meta.weights, &[m])?);
            counts.push(PyList::new(py, r.meta.counts)?.into_any());
        }
        let items: [Bound<'py, PyAny>; 5] = [
            PyList::new(py, xs)?.into_any(),
            PyList::new(py, experts)?.into_any(),
            PyList::new(py, weights)?.into_any(),
            PyList::new(py, counts)?.into_any(),
            handle.into_any(),
        ];
        PyTuple::new(py, items)
    }
}

#[pymethods]
impl EpBuffer {
    /// ``EpBuffer(config: dict)``; use ``ptxforge.ep.Buffer``, which documents the keys.
    #[new]
    fn new(config: RawConfig<'_>) -> PyResult<EpBuffer> {
        let (cfg, devices) = config.check()?;
        Ok(EpBuffer {
            cfg,
            devices,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            groups: Mutex::new(HashMap::new()),
        })
    }

    /// ``(num_tokens_per_rank, num_tokens_per_rdma_rank, num_tokens_per_expert,
    /// is_token_in_rank)`` of one rank's ``topk_idx`` ``[T, topk]``, computed on device
    /// ``devices[rank]`` by the ``ep_layout`` kernel. See ``ptxforge.ep.Buffer``.
    #[pyo3(signature = (topk_idx, rank=0))]
    fn get_dispatch_layout<'py>(
        &self,
        py: Python<'py>,
        topk_idx: &Bound<'py, PyAny>,
        rank: usize,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let c = &self.cfg;
        let dev = self
            .devices
            .get(rank)
            .ok_or_else(|| bad("rank", format!("{rank} outside 0..{}", c.ranks)))?;
        let idx = convert::ints(topk_idx, "topk_idx")?;
        let tokens = idx.shape.first().copied().unwrap_or(0);
        let k = check_topk_idx(&idx, "topk_idx", tokens, c.experts)?;
        let lc = ep::LayoutCfg {
            experts: c.experts,
            ranks: c.ranks,
            gpus_per_node: c.gpus_per_node,
            topk: k as u32,
        };
        let l = interruptible(py, || -> ep::Result<ep::DispatchLayout> {
            let b = dev.upload(&idx.data)?;
            ep::layout::get_dispatch_layout(&dev.default_stream(), &b, tokens, &lc)?.to_host()
        })?
        .map_err(ep_err)?;
        let i32s = |v: Vec<u32>| v.into_iter().map(|x| x as i32).collect::<Vec<_>>();
        let (r, n, e) = (c.ranks as usize, c.nodes() as usize, c.experts as usize);
        let in_rank: Vec<bool> = l
            .token_in_rank
            .iter()
            .take(tokens * r)
            .map(|&v| v != 0)
            .collect();
        let items: [Bound<'py, PyAny>; 4] = [
            convert::to_numpy(py, i32s(l.tokens_per_rank), &[r])?,
            convert::to_numpy(py, i32s(l.tokens_per_node), &[n])?,
            convert::to_numpy(py, i32s(l.tokens_per_expert), &[e])?,
            convert::to_numpy(py, in_rank, &[tokens, r])?,
        ];
        PyTuple::new(py, items)
    }

    /// Dispatch from every rank; see ``ptxforge.ep.Buffer.dispatch``.
    #[pyo3(signature = (x, topk_idx=None, topk_weights=None, handle=None))]
    fn dispatch<'py>(
        slf: &Bound<'py, Self>,
        x: Vec<Bound<'py, PyAny>>,
        topk_idx: Option<Vec<Bound<'py, PyAny>>>,
        topk_weights: Option<Vec<Bound<'py, PyAny>>>,
        handle: Option<Bound<'py, EpHandle>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let this = slf.get();
        let xs = this.payloads(&x)?;
        let Some(h) = handle else {
            let (Some(ti), Some(tw)) = (topk_idx, topk_weights) else {
                return Err(bad(
                    "topk_idx",
                    "topk_idx and topk_weights are required without a handle".into(),
                ));
            };
            let (ins, topk) = this.routed(xs, &ti, &tw)?;
            let (recv, fresh) =
                interruptible(py, || this.run_dispatch(topk, &ins, None))?.map_err(ep_err)?;
            let Some((inner, topk_w)) = fresh else {
                return Err(bad("handle", "the dispatch made no handle".into()));
            };
            let meta = recv.iter().map(|r| r.meta.clone()).collect();
            let handle = EpHandle {
                buffer_id: this.id,
                topk,
                inner,
                topk_w,
                recv: meta,
            };
            return this.dispatch_result(py, recv, Bound::new(py, handle)?);
        };
        if topk_idx.is_some() || topk_weights.is_some() {
            return Err(bad("topk_idx", "a dispatch with a handle reuses the handle's routing: pass neither topk_idx nor topk_weights".into()));
        }
        let hd = this.handle_of(h.get())?;
        for (r, ((_, t), rh)) in xs.iter().zip(&hd.inner.ranks).enumerate() {
            if *t != rh.num_tokens {
                return Err(bad(
                    &format!("x[{r}]"),
                    format!("{t} tokens; the handle's dispatch had {}", rh.num_tokens),
                ));
            }
        }
        let ins: Vec<RankIn> = xs
            .into_iter()
            .map(|(x, _)| RankIn {
                x,
                topk_idx: vec![],
                topk_w: vec![],
            })
            .collect();
        let (recv, _) =
            interruptible(py, || this.run_dispatch(hd.topk, &ins, Some(hd)))?.map_err(ep_err)?;
        this.dispatch_result(py, recv, h)
    }

    /// Combine back to every rank's tokens; see ``ptxforge.ep.Buffer.combine``.
    #[pyo3(signature = (x, handle, topk_weights=None))]
    fn combine<'py>(
        &self,
        py: Python<'py>,
        x: Vec<Bound<'py, PyAny>>,
        handle: Bound<'py, EpHandle>,
        topk_weights: Option<Vec<Bound<'py, PyAny>>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let h = self.handle_of(handle.get())?;
        per_rank(&x, "x", self.cfg.ranks)?;
        let hidden = self.cfg.hidden as usize;
        let pads: Vec<usize> = h.inner.ranks.iter().map(|r| r.m_pad).collect();
        let ys = x
            .iter()
            .enumerate()
            .map(|(r, o)| combine_rows(o, r, pads[r], hidden))
            .collect::<PyResult<Vec<_>>>()?;
        let ws = match &topk_weights {
            Some(list) => {
                per_rank(list, "topk_weights", self.cfg.ranks)?;
                Some(
                    list.iter()
                        .enumerate()
                        .map(|(r, o)| combine_weights(o, r, pads[r]))
                        .collect::<PyResult<Vec<_>>>()?,
                )
            }
            None => None,
        };
        let outs =
            interruptible(py, || self.run_combine(h, &ys, ws.as_deref()))?.map_err(ep_err)?;
        let arrays = outs
            .into_iter()
            .zip(&h.inner.ranks)
            .map(|(v, rh)| convert::to_numpy(py, v, &[rh.num_tokens, hidden]))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, arrays)
    }

    /// Ranks in the group.
    #[getter]
    fn num_ranks(&self) -> u32 {
        self.cfg.ranks
    }
    /// Ranks per node.
    #[getter]
    fn gpus_per_node(&self) -> u32 {
        self.cfg.gpus_per_node
    }
    /// Hidden size of a token.
    #[getter]
    fn hidden(&self) -> u32 {
        self.cfg.hidden
    }
    /// Experts in total.
    #[getter]
    fn num_experts(&self) -> u32 {
        self.cfg.experts
    }
    /// SMs of the communication kernels per rank.
    #[getter]
    fn num_sms(&self) -> u32 {
        self.cfg.num_sms
    }
    /// The most tokens one rank dispatches per call.
    #[getter]
    fn max_tokens_per_rank(&self) -> u32 {
        self.cfg.max_tokens
    }
    /// The device of each rank, as spec strings (``"emu:0"``).
    #[getter]
    fn devices(&self) -> Vec<String> {
        self.devices
            .iter()
            .map(|d| {
                format!(
                    "{}:{}",
                    if d.backend() == runtime::Backend::Emu {
                        "emu"
                    } else {
                        "cuda"
                    },
                    d.index()
                )
            })
            .collect()
    }
    fn __repr__(&self) -> String {
        let c = &self.cfg;
        format!(
            "ptxforge.ep.Buffer(num_ranks={}, gpus_per_node={}, hidden={}, num_experts={}, num_sms={}, max_tokens_per_rank={})",
            c.ranks, c.gpus_per_node, c.hidden, c.experts, c.num_sms, c.max_tokens
        )
    }
}
