//! Backward of the gate: the gradient of each (token, k) routing weight, returned to the token's
//! home rank, and the routing backward down to the gate logits.
//!
//! * `ep_topk_grad` (expert side, after the cached dispatch of dY): the combine computes
//!   `Y_t = sum_k w_tk y_tk`, so `dL/dw_tk = <dY_t, y_tk>`. Every received row holds one
//!   (token, k) pair's unweighted expert output `y` and the token's `dY`; a warp reduces the row's
//!   dot product in f32 (fixed butterfly order) and lane 0 puts it with one remote store into
//!   `dw[token, k]` of the home rank: intra-node through the peer mapping, across nodes through
//!   [`crate::Transport::remote_ptr`] (a one-sided RDMA-style put), counting the bytes per link
//!   class. Each (token, k) pair has exactly one row, so nothing is reduced on the way.
//! * `ep_route_bwd` (home side): with `s = sigmoid(logits)`, `S = sum_j s_{e_j}` over the
//!   selected experts and `w_k = c s_{e_k} / S`:
//!   `ds_{e_k} = (c dw_k - sum_j dw_j w_j) / S`, `dlogit_e = ds_e s_e (1 - s_e)` on the selected
//!   experts and 0 elsewhere (the balancing bias and the group limit only select). Writes the
//!   logits gradient as f32 `[T, E]`, BF16 `[T, E]` and BF16 `[E, T]` (the operands of the gate's
//!   dgrad and wgrad GEMMs).
use crate::comm::{bf16_lo_hi, DispatchOut, EpGroup};
use crate::kutil::{self, sigmoid};
use crate::peers;
use crate::proxy::{WindowKind, WindowSpec, WIN_DW};
use crate::routing::RoutingCfg;
use crate::transport::LinkClass;
use crate::{EpError, Result};
use builder::*;
use half::bf16;
use runtime::{Buffer, LaunchConfig, Stream};

/// The home buffers' windows: single-word puts, 0xff-poisoned (never a computed value).
const DW_WINDOW: WindowSpec = WindowSpec {
    key: WIN_DW,
    kind: WindowKind::Sparse { poison: 0xff },
};

/// Rows per CTA of `ep_topk_grad` (one warp each).
const ROWS_PER_CTA: u32 = 4;

/// `ep_topk_grad(y, dy, recv_src, recv_k, dst_tab, bytes, rank, rows)` for hidden `h` and
/// `topk` (`gpn` GPUs per node for the byte counters).
pub fn topk_grad_kernel(t: &Target, h: u32, topk: u32, gpn: u32) -> Result<ptx::Module> {
    if h == 0 || h % 64 != 0 {
        return Err(EpError::Config(format!(
            "hidden {h} must be a multiple of 64"
        )));
    }
    let mut k = KernelBuilder::new("ep_topk_grad", t.clone());
    let y = k.param::<GlobalPtr<u32>>("y");
    let dy = k.param::<GlobalPtr<u32>>("dy");
    let src_p = k.param::<GlobalPtr<i32>>("recv_src");
    let k_p = k.param::<GlobalPtr<i32>>("recv_k");
    let tab = k.param::<GlobalPtr<u64>>("dst_tab");
    let bytes = k.param::<GlobalPtr<u64>>("bytes");
    let rank = k.param::<u32>("rank");
    let rows = k.param::<u32>("rows");
    let lane = k.lane_id();
    let warp = k.warp_id();
    let cta = k.ctaid_x();
    let row = k.mad_lo(cta, ROWS_PER_CTA, warp);
    let inb = k.lt(row, rows);
    k.if_(inb, |k| {
        let src = k.ld(src_p.offset(row));
        let valid = k.ge(src, 0i32);
        k.if_(valid, |k| {
            // each lane sums the bf16 pairs at words lane, lane + 32, ... of the row
            let acc = k.mov(0.0f32);
            let base = k.mul(row, h / 2);
            k.for_range(0u32, h / 64, 1u32, |k, it| {
                let w = k.mad_lo(it, 32u32, lane);
                let wi = k.add(base, w);
                let a = k.ld(y.offset(wi));
                let b = k.ld(dy.offset(wi));
                let (a0, a1) = bf16_lo_hi(k, a);
                let (b0, b1) = bf16_lo_hi(k, b);
                let p = k.fma(a0, b0, acc);
                let p2 = k.fma(a1, b1, p);
                k.mov_to(acc, p2);
            });
            let mut s = acc;
            for d in [16u32, 8, 4, 2, 1] {
                let o = k.shfl_bfly(s, d);
                s = k.add_m(FMods::rn(), s, o);
            }
            let l0 = k.eq(lane, 0u32);
            k.if_(l0, |k| {
                let su = k.bitcast::<u32, i32>(src);
                let home = k.shr(su, 24u32);
                let tok = k.and(su, 0x00ff_ffffu32);
                let kk = k.ld(k_p.offset(row));
                let kku = k.bitcast::<u32, i32>(kk);
                let slot = k.mad_lo(tok, topk, kku);
                let base = k.ld(tab.offset(home));
                let off = k.mul_wide(slot, 4u32);
                let addr = k.add(base, off);
                let g = k.cvta_to_global(GenericPtr::<f32>::from_reg(addr));
                k.st(g, s);
                // bytes per link class: [0] inter-node, [1] intra-node (local: none)
                let hn = k.div(home, gpn);
                let mn = k.div(rank, gpn);
                let other = k.ne(home, rank);
                k.if_(other, |k| {
                    let same_node = k.eq(hn, mn);
                    let idx = k.selp(1u32, 0u32, same_node);
                    k.red_add(bytes.offset(idx), 4u64);
                });
            });
        });
    });
    Ok(k.finish()?)
}

/// Result of [`EpGroup::topk_weight_grad`].
pub struct TopkGrad {
    /// Per rank `[T_r, topk]` f32 (as bytes: the transport's windows are byte buffers).
    pub dw: Vec<Buffer<u8>>,
    pub inter_node_bytes: u64,
    pub intra_node_bytes: u64,
}

impl TopkGrad {
    /// Rank `r`'s `dL/dw` `[T_r, topk]`.
    pub fn to_vec(&self, r: usize) -> Result<Vec<f32>> {
        Ok(self.dw[r]
            .to_bytes()?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

impl EpGroup {
    /// `dL/dw[t, k] = <dY_t, y_tk>` for every rank's tokens: `y[r]` is rank `r`'s expert output
    /// rows `[m_pad, H]` (BF16, unweighted, the layout of `outs[r]`), `dy[r]` the same rows of
    /// the token gradient (the cached dispatch of dY, BF16 bytes). Runs on the communication
    /// streams and SM budget; `num_tokens[r]` sizes the home buffers. Every slice is indexed
    /// like [`EpGroup::hosted`] (all ranks in a single-process group).
    pub fn topk_weight_grad(
        &mut self,
        y: &[&Buffer<bf16>],
        dy: &[&Buffer<u8>],
        outs: &[DispatchOut],
        num_tokens: &[usize],
    ) -> Result<TopkGrad> {
        let cfg = self.cfg.clone();
        let r_n = self.hosted.len();
        let (h, kk) = (cfg.hidden as usize, cfg.topk as usize);
        if y.len() != r_n || dy.len() != r_n || outs.len() != r_n || num_tokens.len() != r_n {
            return Err(EpError::Shape(format!(
                "need inputs for the {r_n} hosted ranks"
            )));
        }
        for r in 0..r_n {
            let m = outs[r].m_pad;
            if m > 0 && (y[r].len() < m * h || dy[r].len() < m * h * 2) {
                return Err(EpError::Shape(format!("rank {r}: {m} rows of {h} needed")));
            }
        }
        let mut dw = Vec::new();
        for r in 0..r_n {
            let b = self.devices[r].alloc::<u8>((num_tokens[r] * kk * 4).max(4))?;
            self.streams[r].fill(&b, 0xff)?; // NaN poison: every (token, k) must be written
            dw.push(b);
        }
        // every home buffer is poisoned before any rank puts into it
        for r in 0..r_n {
            self.streams[r].synchronize()?;
        }
        // every rank's window table first: a proxy registers its send windows, and its begin
        // fence orders every home buffer's poison before any put
        let mine: Vec<Vec<u32>> = num_tokens
            .iter()
            .map(|&t| vec![(t * kk * 4) as u32])
            .collect();
        let rows = peers::gather(&*self.transport, &self.hosted, &dw, &mine)?;
        let dw_bytes: Vec<usize> = rows
            .iter()
            .map(|p| p.extra.first().copied().unwrap_or(0) as usize)
            .collect();
        // node peers' home buffers of other processes, mapped until the operation ends
        let peer_dw = match self.hosted.len() < cfg.ranks as usize {
            true => peers::map_node_peers(&*self.transport, &self.hosted, &self.devices, &rows)?,
            false => Vec::new(),
        };
        let mut tabs = Vec::new();
        for r in 0..r_n {
            self.expose_dw(r, &dw[r])?;
            tabs.push(match outs[r].m_pad {
                0 => None,
                _ => Some(self.dw_table(r, &dw, &peer_dw, &dw_bytes)?),
            });
        }
        self.transport.begin()?;
        let mut counters = Vec::new();
        for (r, tab) in tabs.into_iter().enumerate() {
            counters.push(match tab {
                Some(tab) => Some(self.launch_topk_grad(r, y[r], dy[r], &outs[r], tab)?),
                None => None,
            });
        }
        let (mut inter, mut intra) = (0, 0);
        let mut first = None;
        for r in 0..r_n {
            if let Err(e) = self.streams[r].synchronize() {
                first.get_or_insert(e);
            }
        }
        if let Some(e) = first {
            self.transport.abort();
            return Err(e.into());
        }
        // the sparse send windows (inter-node puts) land at the home ranks
        self.transport.end()?;
        for r in 0..r_n {
            if let Some((_, b)) = &counters[r] {
                let v = self.streams[r].read(b)?;
                inter += v[0];
                intra += v[1];
            }
        }
        Ok(TopkGrad {
            dw,
            inter_node_bytes: inter,
            intra_node_bytes: intra,
        })
    }
}

impl EpGroup {
    /// Hosted rank `i`'s home buffer, exposed to the ranks of other processes on other nodes.
    fn expose_dw(&self, i: usize, b: &Buffer<u8>) -> Result<()> {
        let me = self.hosted[i];
        for src in (0..self.cfg.ranks).filter(|s| !self.hosted.contains(s)) {
            if self.transport.link(src, me) == LinkClass::InterNode {
                self.transport.expose(me, src, b, &DW_WINDOW)?;
            }
        }
        Ok(())
    }

    /// Hosted rank `i`'s table of the addresses it puts `dw` of every home rank through
    /// (`dw_bytes`: every rank's home buffer size).
    /// (`peer_dw`: node peers' home buffers of other processes, mapped here, index = rank).
    fn dw_table(
        &self,
        i: usize,
        dw: &[Buffer<u8>],
        peer_dw: &[Option<Buffer<u8>>],
        dw_bytes: &[usize],
    ) -> Result<Buffer<u64>> {
        let (dev, r) = (&self.devices[i], self.hosted[i]);
        let mut tab = Vec::new();
        for dst in 0..self.cfg.ranks {
            let local = self.hosted.iter().position(|&h| h == dst);
            tab.push(match (self.transport.link(r, dst), local) {
                (LinkClass::InterNode, Some(j)) => {
                    self.transport.window(r, dst, &dw[j], &DW_WINDOW)?
                }
                (LinkClass::InterNode, None) => {
                    let bytes = dw_bytes.get(dst as usize).copied().unwrap_or(0).max(4);
                    self.transport.attach(r, dst, bytes, &DW_WINDOW)?
                }
                (_, Some(j)) => dw[j].peer_ptr(dev)?,
                (_, None) => match peer_dw.get(dst as usize) {
                    Some(Some(b)) => b.peer_ptr(dev)?,
                    _ => {
                        return Err(EpError::Config(format!(
                            "rank {dst} shares a node with hosted rank {r} but is not mapped here"
                        )))
                    }
                },
            });
        }
        Ok(self.streams[i].upload(&tab)?)
    }

    /// Launches `ep_topk_grad` on rank `r`; returns its table and byte counters.
    fn launch_topk_grad(
        &self,
        r: usize,
        y: &Buffer<bf16>,
        dy: &Buffer<u8>,
        out: &DispatchOut,
        tab: Buffer<u64>,
    ) -> Result<(Buffer<u64>, Buffer<u64>)> {
        let cfg = &self.cfg;
        let dev = &self.devices[r];
        let key = format!("h{}_k{}_g{}", cfg.hidden, cfg.topk, cfg.gpus_per_node);
        let f = kutil::function(dev, "ep_topk_grad", &key, |t| {
            topk_grad_kernel(t, cfg.hidden, cfg.topk, cfg.gpus_per_node)
        })?;
        let st = &self.streams[r];
        let bytes = dev.alloc::<u64>(2)?;
        st.fill(&bytes, 0)?;
        let rows = out.m_pad as u32;
        let lc = LaunchConfig::linear(rows.div_ceil(ROWS_PER_CTA), 32 * ROWS_PER_CTA).budget(
            runtime::SmPartition {
                offset: cfg.sm_offset,
                count: cfg.num_sms,
            },
        );
        st.launch(
            &f,
            &lc,
            &runtime::args![
                y,
                dy,
                &out.recv_src,
                &out.recv_k,
                &tab,
                &bytes,
                self.hosted[r],
                rows
            ],
        )?;
        Ok((tab, bytes))
    }
}

/// The routing backward kernel `ep_route_bwd(logits, idx, w, dw, dl, dl_bf, dlt_bf, T)`.
pub fn route_bwd_kernel(t: &Target, c: &RoutingCfg) -> Result<ptx::Module> {
    c.validate()?;
    let e_n = c.experts;
    let mut k = KernelBuilder::new("ep_route_bwd", t.clone());
    let logits = k.param::<GlobalPtr<f32>>("logits");
    let idx = k.param::<GlobalPtr<i32>>("topk_idx");
    let wp = k.param::<GlobalPtr<f32>>("topk_w");
    let dwp = k.param::<GlobalPtr<f32>>("dw");
    let dl = k.param::<GlobalPtr<f32>>("dlogits");
    let dlb = k.param::<GlobalPtr<u16>>("dlogits_bf16");
    let dltb = k.param::<GlobalPtr<u16>>("dlogits_t_bf16");
    let ntok = k.param::<u32>("num_tokens");
    let tok = k.global_index_x();
    let inb = k.lt(tok, ntok);
    k.if_(inb, |k| {
        let row = k.mul(tok, e_n);
        let krow = k.mul(tok, c.topk);
        let z = k.mov(0.0f32);
        let zb = k.mov(0u16);
        k.for_range(0u32, e_n, 1u32, |k, e| {
            let i = k.add(row, e);
            k.st(dl.offset(i), z);
            k.st(dlb.offset(i), zb);
            let ti = k.mad_lo(e, ntok, tok);
            k.st(dltb.offset(ti), zb);
        });
        // S = sum of the selected unbiased scores; A = sum_j dw_j w_j
        let ssum = k.mov(0.0f32);
        let asum = k.mov(0.0f32);
        k.for_range(0u32, c.topk, 1u32, |k, j| {
            let oi = k.add(krow, j);
            let e = k.ld(idx.offset(oi));
            let eu = k.bitcast::<u32, i32>(e);
            let li = k.add(row, eu);
            let x = k.ld(logits.offset(li));
            let s = sigmoid(k, x);
            let ns = k.add_m(FMods::rn(), ssum, s);
            k.mov_to(ssum, ns);
            let w = k.ld(wp.offset(oi));
            let d = k.ld(dwp.offset(oi));
            let na = k.fma(d, w, asum);
            k.mov_to(asum, na);
        });
        k.for_range(0u32, c.topk, 1u32, |k, j| {
            let oi = k.add(krow, j);
            let e = k.ld(idx.offset(oi));
            let eu = k.bitcast::<u32, i32>(e);
            let li = k.add(row, eu);
            let x = k.ld(logits.offset(li));
            let s = sigmoid(k, x);
            let d = k.ld(dwp.offset(oi));
            // ds = (c dw - A) / S; dlogit = ds s (1 - s)
            let cd = k.mul_m(FMods::rn(), d, c.scaling);
            let num = k.sub(cd, asum);
            let ds = k.div(num, ssum);
            let om = k.sub(1.0f32, s);
            let ss = k.mul_m(FMods::rn(), s, om);
            let g = k.mul_m(FMods::rn(), ds, ss);
            k.st(dl.offset(li), g);
            let gb: Reg<Bf16> = k.cvt(g);
            let gbu = k.bitcast::<u16, Bf16>(gb);
            k.st(dlb.offset(li), gbu);
            let ti = k.mad_lo(eu, ntok, tok);
            k.st(dltb.offset(ti), gbu);
        });
    });
    Ok(k.finish()?)
}

/// Device buffers of [`route_backward`].
pub struct RouteGrad {
    /// `[T, E]` f32.
    pub dlogits: Buffer<f32>,
    /// `[T, E]` BF16 (dgrad operand: dX_gate = dlogits W_gate).
    pub dlogits_bf16: Buffer<bf16>,
    /// `[E, T]` BF16 (wgrad operand: dW_gate = dlogits^T X).
    pub dlogits_t_bf16: Buffer<bf16>,
}

/// Routing backward on `stream`: `logits` `[T, E]`, the forward's `idx`/`w` `[T, topk]` and
/// `dw` `[T, topk]` (e.g. [`TopkGrad::dw`], f32 bytes) to the logits gradient.
pub fn route_backward(
    stream: &Stream,
    logits: &Buffer<f32>,
    idx: &Buffer<i32>,
    w: &Buffer<f32>,
    dw: &Buffer<u8>,
    c: &RoutingCfg,
) -> Result<RouteGrad> {
    c.validate()?;
    let dev = stream.device();
    let (e_n, kk) = (c.experts as usize, c.topk as usize);
    if logits.len() % e_n != 0 {
        return Err(EpError::Shape(format!(
            "logits of {} values for {e_n} experts",
            logits.len()
        )));
    }
    let t_n = logits.len() / e_n;
    if idx.len() < t_n * kk || w.len() < t_n * kk || dw.len() < t_n * kk * 4 {
        return Err(EpError::Shape(format!(
            "top-k buffers for {t_n} tokens x {kk} too small"
        )));
    }
    let f = kutil::function(dev, "ep_route_bwd", &c.key(), |t| route_bwd_kernel(t, c))?;
    let out = RouteGrad {
        dlogits: dev.alloc((t_n * e_n).max(1))?,
        dlogits_bf16: dev.alloc((t_n * e_n).max(1))?,
        dlogits_t_bf16: dev.alloc((t_n * e_n).max(1))?,
    };
    if t_n > 0 {
        let block = 128u32;
        stream.launch(
            &f,
            &LaunchConfig::linear((t_n as u32).div_ceil(block), block),
            &runtime::args![
                logits,
                idx,
                w,
                runtime::Arg::Ptr(dw.device_ptr()),
                &out.dlogits,
                &out.dlogits_bf16,
                &out.dlogits_t_bf16,
                t_n as u32
            ],
        )?;
        stream.synchronize()?;
    }
    Ok(out)
}

/// CPU reference of [`route_backward`] (f64 from the same f32 inputs): `dlogits` `[T, E]`.
/// Every top-k index must be a valid expert and the buffers must hold `T * topk` entries.
pub fn route_backward_ref(
    logits: &[f32],
    idx: &[i32],
    w: &[f32],
    dw: &[f32],
    c: &RoutingCfg,
) -> Result<Vec<f64>> {
    c.validate()?;
    let (e_n, kk) = (c.experts as usize, c.topk as usize);
    let t_n = logits.len() / e_n;
    if idx.len() < t_n * kk || w.len() < t_n * kk || dw.len() < t_n * kk {
        return Err(EpError::Shape(format!(
            "top-k buffers for {t_n} tokens x {kk} too small"
        )));
    }
    let experts: Vec<usize> = idx[..t_n * kk]
        .iter()
        .map(|&e| {
            usize::try_from(e)
                .ok()
                .filter(|&e| e < e_n)
                .ok_or_else(|| EpError::Shape(format!("top-k index {e} is not an expert of {e_n}")))
        })
        .collect::<Result<_>>()?;
    let mut out = vec![0f64; t_n * e_n];
    for t in 0..t_n {
        let sg = |e: usize| 1.0 / (1.0 + (-(logits[t * e_n + e] as f64)).exp());
        let sel = &experts[t * kk..(t + 1) * kk];
        let s: f64 = sel.iter().map(|&e| sg(e)).sum();
        let a: f64 = (0..kk)
            .map(|j| dw[t * kk + j] as f64 * w[t * kk + j] as f64)
            .sum();
        for (j, &e) in sel.iter().enumerate() {
            let ds = (c.scaling as f64 * dw[t * kk + j] as f64 - a) / s;
            out[t * e_n + e] = ds * sg(e) * (1.0 - sg(e));
        }
    }
    Ok(out)
}
