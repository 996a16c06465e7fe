//! [`MoeLayer`]: the weights on the devices, the EP group, and the forward/backward phases.
//!
//! Two interfaces: over device buffers ([`MoeLayer::forward_dev`], [`MoeLayer::backward_dev`]:
//! each rank's BF16 `[T, H]` input on its own device, outputs left there; the trainer's) and
//! over host tensors ([`MoeLayer::forward`], [`MoeLayer::backward`]: thin wrappers that upload
//! and download; `ptxforge moe` and the tests). Both run the same kernels; the host interface's
//! f32 input feeds the FP8 quantisation unrounded (the gate reads its BF16 rounding).

use super::exec::{overlapped, per_rank, Progress, Span, Trace, TraceSpan};
use super::host::{quant_expert, transpose, ExpertQ};
use super::mlp::{Fp8, Mlp, MlpDgrad, MlpFwd, MlpW, Rows};
use super::{GemmKind, MoeConfig, MoeError, MoeWeights, Result};
use ep::comm::{CommStats, EpConfig, EpGroup, XRef};
use ep::grad::TopkGrad;
use ep::{DispatchOut, Handle, InProcessTransport, Payload};
use half::bf16;
use kernels::train::ops;
use kernels::{GemmBufs, GemmProblem, InTy, OutTy, ScaleMode};
use runtime::{Buffer, Device, Stream};
use std::time::Instant;

mod device;
pub use device::MoeDeviceWeights;

/// One rank's device state fixed at construction.
struct RankDev {
    device: Device,
    /// The compute partition's stream.
    compute: Stream,
    routed: MlpW,
    shared: Option<MlpW>,
    /// `[E, H]` and `[H, E]` BF16 router weight (the gate GEMM's and the gate dgrad's operand).
    gate: Buffer<bf16>,
    gate_t: Buffer<bf16>,
    bias: Buffer<f32>,
    /// The shared expert's row layout: every local token in one group (`m_indices` 0), weight
    /// 1, wgrad k-segments `[0, T/c, 2T/c, .., T]` (`c = wgrad_chunks`).
    sh_mi: Buffer<i32>,
    sh_ones: Buffer<f32>,
    sh_ks: Buffer<i32>,
    /// Stand-in output of a rank that received no rows.
    empty: Buffer<bf16>,
}

/// The compute side of the layer (everything but the EP group, so a communication call and the
/// compute kernels can borrow the layer's two halves at once).
struct Compute {
    cfg: MoeConfig,
    ranks: Vec<RankDev>,
    mlp: Mlp,
    trace: Trace,
    compute_sms: u32,
}

/// An MoE layer over `cfg.ranks()` devices: routed experts spread evenly over the ranks, the
/// shared expert and the gate replicated on every rank.
pub struct MoeLayer {
    group: EpGroup,
    dev: Compute,
    /// Host FP8 copies of every expert (routed `0..E`, then the shared one).
    experts: Vec<ExpertQ>,
    weights: MoeWeights,
}

/// One rank's routing and quantised input, kept for backward.
pub(crate) struct RankRoute {
    /// `[T, topk]` selected experts and their weights.
    pub idx: Buffer<i32>,
    pub w: Buffer<f32>,
    /// `[T, H]` FP8 input and `[T, H/128]` scales.
    pub q: Buffer<u8>,
    pub sc: Buffer<f32>,
    /// `[T, E]` f32 gate logits.
    pub logits: Buffer<f32>,
    /// `[T, H]` X in BF16 (the gate GEMM's operand; the dispatch payload with `Payload::Bf16`).
    xbf: Buffer<bf16>,
    /// Per wgrad chunk `[H, T/c]` X^T in BF16 (the gate wgrad's operand).
    xt: Vec<Buffer<bf16>>,
}

/// A communication/compute pair that ran concurrently (unless `sequential`).
#[derive(Clone, Copy, Debug)]
pub struct Overlap {
    pub pair: &'static str,
    pub comm: Span,
    pub compute: Span,
}

/// Per-phase figures of a forward.
#[derive(Clone, Debug)]
pub struct ForwardStats {
    /// Gate GEMM + routing + 1x128 quantisation, every rank.
    pub route_seconds: f64,
    pub dispatch: CommStats,
    pub dispatch_span: Span,
    /// Bytes the FP8 payload saved over BF16 in the dispatch (0 with a BF16 payload).
    pub fp8_saved_bytes: f64,
    /// Bytes of one dispatch record (token payload, scales and metadata).
    pub record_bytes: u64,
    /// The shared expert's forward (overlapped with the dispatch).
    pub shared_span: Span,
    pub routed_seconds: f64,
    /// Rows (padded to 128 per expert) each rank's experts ran on.
    pub rows_per_rank: Vec<usize>,
    pub combine: CommStats,
    pub overlaps: Vec<Overlap>,
}

/// Per-phase figures of a backward.
#[derive(Clone, Debug)]
pub struct BackwardStats {
    /// Cached dispatch of dY (= combine^T).
    pub dispatch_dy: CommStats,
    pub dispatch_dy_span: Span,
    pub shared_span: Span,
    /// Top-k weight gradients put back to the home ranks.
    pub topk_intra_bytes: u64,
    pub topk_inter_bytes: u64,
    pub topk_span: Span,
    pub dgrad_span: Span,
    /// Combine of the experts' dX (= dispatch^T).
    pub combine_dx: CommStats,
    pub combine_dx_span: Span,
    /// Gate backward + routed wgrad (overlapped with the combine of dX).
    pub wgrad_span: Span,
    pub overlaps: Vec<Overlap>,
}

/// A forward's outputs and what its backward needs.
pub struct Forward {
    /// Per rank `[T, H]` output Y = combine + shared expert (BF16 values) on the host: filled by
    /// [`MoeLayer::forward`], empty after [`MoeLayer::forward_dev`].
    pub y: Vec<Vec<f32>>,
    /// Per rank `[T, H]` BF16 output Y on the rank's device.
    pub y_dev: Vec<Buffer<bf16>>,
    pub stats: ForwardStats,
    pub(crate) routes: Vec<RankRoute>,
    pub(crate) outs: Vec<DispatchOut>,
    handle: Handle,
    shared: Vec<Option<MlpFwd>>,
    routed: Vec<Option<MlpFwd>>,
    /// Per rank the expert-side FP8 of a BF16 dispatch payload (`None` with FP8).
    recv_q: Vec<Option<Fp8Buf>>,
    k_starts: Vec<Buffer<i32>>,
    /// With `slot_combine`: per top-k slot, per rank the `[m_pad]` row mask of that slot.
    slot_masks: Vec<Vec<Buffer<f32>>>,
}

/// One rank's gate gradients.
#[derive(Clone, Debug)]
pub struct GateGrad {
    /// `[T, E]` f32 logits gradient, and its BF16 transpose `[E, T]` (the wgrad operand).
    pub dlogits: Vec<f32>,
    pub dlogits_t: Vec<bf16>,
    /// `[T, H]` f32 input gradient through the gate.
    pub dx: Vec<f32>,
    /// Per wgrad chunk of this rank's tokens (`MoeConfig::wgrad_chunks`, token order) the
    /// `[E, H]` f32 partial of dW_gate.
    pub dw: Vec<Vec<f32>>,
}

/// A backward's gradients.
pub struct Backward {
    /// Per rank `[T, H]` dX = combine of the experts' dX + shared expert + gate (BF16 values) on
    /// the host: filled by [`MoeLayer::backward`], empty after [`MoeLayer::backward_dev`].
    pub dx: Vec<Vec<f32>>,
    /// Per rank `[T, H]` BF16 dX on the rank's device.
    pub dx_dev: Vec<Buffer<bf16>>,
    /// Per rank (dW_gate|up `[E_local, 2I, H]`, dW_down `[E_local, H, I]`) f32; empty when the
    /// rank received no rows.
    pub routed_dw: Vec<(Vec<f32>, Vec<f32>)>,
    /// Per rank, per wgrad chunk of its tokens (token order), the shared expert's
    /// (dW_gate|up, dW_down) partial.
    pub shared_dw: Vec<Option<Vec<ExpertDw>>>,
    pub gate: Vec<GateGrad>,
    pub stats: BackwardStats,
}

impl Backward {
    /// dW_gate: the ranks' (and chunks') f32 partials summed in f64 in rank order (the
    /// data-parallel all-reduce, on the host; a check aid: the trainer sums on the device).
    pub fn dw_gate_sum(&self) -> Vec<f64> {
        let parts: Vec<&Vec<f32>> = self.gate.iter().flat_map(|g| &g.dw).collect();
        let mut s = vec![0f64; parts.first().map_or(0, |d| d.len())];
        for d in parts {
            s.iter_mut().zip(d).for_each(|(a, v)| *a += *v as f64);
        }
        s
    }

    /// The replicated shared expert's gradient: the ranks' (and chunks') partials summed in f32
    /// (host; a check aid: the trainer sums on the device).
    pub fn shared_dw_sum(&self) -> Option<(Vec<f32>, Vec<f32>)> {
        let parts: Vec<&(Vec<f32>, Vec<f32>)> = self.shared_dw.iter().flatten().flatten().collect();
        let first = parts.first()?;
        let mut s1 = vec![0f32; first.0.len()];
        let mut s2 = vec![0f32; first.1.len()];
        for b in parts {
            s1.iter_mut().zip(&b.0).for_each(|(a, v)| *a += v);
            s2.iter_mut().zip(&b.1).for_each(|(a, v)| *a += v);
        }
        Some((s1, s2))
    }
}

/// Where the communication and compute kernels ran.
#[derive(Clone, Debug)]
pub struct Placement {
    /// Sorted union of the SMs the dispatch/combine kernels ran on (all ranks).
    pub comm_sms: Vec<u32>,
    /// Sorted union of the SMs the compute partitions' kernels ran on.
    pub compute_sms: Vec<u32>,
    pub disjoint: bool,
    pub comm_max_per_rank: usize,
    /// Disjoint and no rank's communication used more than `num_sms` SMs.
    pub ok: bool,
}

/// Checks against the devices (before any work on them): `num_sms` must leave every device at
/// least one SM for the compute partition. [`MoeLayer::new`] runs it too.
pub fn check_devices(cfg: &MoeConfig, devices: &[Device]) -> Result<()> {
    let Some(sms) = devices.iter().map(|d| d.props().sms).min() else {
        return Ok(());
    };
    if cfg.num_sms >= sms {
        return Err(MoeError::Config {
            field: "num_sms",
            msg: format!(
                "{} SMs for communication leave none for compute: the devices have {sms} SMs, \
                 so at most {}",
                cfg.num_sms,
                sms - 1
            ),
        });
    }
    Ok(())
}

fn check_shapes(cfg: &MoeConfig, devices: &[Device], ranks: usize, w: &MoeWeights) -> Result<()> {
    let (h, e_n, i_n) = (
        cfg.hidden as usize,
        cfg.experts as usize,
        cfg.intermediate as usize,
    );
    let n_w = e_n + cfg.shared as usize;
    let bad = if devices.len() != ranks {
        Some(format!("{} devices for {ranks} ranks", devices.len()))
    } else if w.gate.len() != e_n * h || w.bias.len() != e_n {
        Some(format!("gate must be [{e_n}, {h}] and bias [{e_n}]"))
    } else if w.w1.len() != n_w || w.w2.len() != n_w {
        Some(format!("{n_w} experts' weights needed (routed + shared)"))
    } else if w.w1.iter().any(|v| v.len() != 2 * i_n * h) || w.w2.iter().any(|v| v.len() != h * i_n)
    {
        Some(format!(
            "expert weights must be [{}, {h}] and [{h}, {i_n}]",
            2 * i_n
        ))
    } else {
        None
    };
    bad.map_or(Ok(()), |m| Err(MoeError::Shape(m)))
}

impl MoeLayer {
    /// Splits every device's SMs, builds the EP group, quantises the experts' weights (128x128
    /// FP8, W and W^T, each rank its own experts) and uploads them with the gate.
    pub fn new(
        cfg: MoeConfig,
        devices: Vec<Device>,
        weights: MoeWeights,
        progress: &dyn Progress,
    ) -> Result<MoeLayer> {
        // every rank lives here: one device each (checked before the transport is built)
        if devices.len() != cfg.ranks() {
            return Err(MoeError::Shape(format!(
                "{} devices for {} ranks: the in-process layer needs one device per rank",
                devices.len(),
                cfg.ranks()
            )));
        }
        let tr = InProcessTransport {
            devices: devices.clone(),
            gpus_per_node: cfg.gpus_per_node,
        };
        let hosted = (0..devices.len() as u32).collect();
        MoeLayer::hosting(cfg, hosted, devices, Box::new(tr), weights, progress)
    }

    /// [`MoeLayer::new`] for a process that hosts only the ranks `hosted` (whole nodes,
    /// ascending; `devices[i]` is rank `hosted[i]`'s) and reaches the others through
    /// `transport` (e.g. `ep::ProxyTransport` over MPI). Every per-rank input and output of the
    /// layer is then indexed like `hosted`; `weights` are the whole model's (each rank uploads
    /// its own experts).
    pub fn hosting(
        cfg: MoeConfig,
        hosted: Vec<u32>,
        devices: Vec<Device>,
        transport: Box<dyn ep::Transport>,
        weights: MoeWeights,
        progress: &dyn Progress,
    ) -> Result<MoeLayer> {
        cfg.validate()?;
        check_shapes(&cfg, &devices, hosted.len(), &weights)?;
        check_devices(&cfg, &devices)?;
        // communication partition (top `num_sms` SMs) and compute partition (the rest)
        let parts = devices
            .iter()
            .map(|d| d.partition(cfg.num_sms))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let cs: Vec<Stream> = parts
            .iter()
            .map(|p| p.1.stream())
            .collect::<std::result::Result<_, _>>()?;
        let mut ec = EpConfig::new(
            cfg.ranks() as u32,
            cfg.gpus_per_node,
            cfg.experts,
            cfg.hidden,
            cfg.topk,
            cfg.tokens,
        );
        ec.num_sms = cfg.num_sms;
        ec.sm_offset = parts[0].0.sms().offset;
        if let Some(t) = cfg.comm_timeout {
            ec.timeout = t;
        }
        let mut group = EpGroup::hosting(ec, hosted.clone(), devices.clone(), transport)?;
        group.use_streams(
            parts
                .iter()
                .map(|p| p.0.stream())
                .collect::<std::result::Result<_, _>>()?,
        )?;
        let experts = quantise_experts(&cfg, &weights, progress)?;
        let ranks = upload_ranks(&cfg, (&hosted, &devices), cs, &experts, &weights, progress)?;
        let mlp = Mlp {
            h: cfg.hidden as usize,
            i_n: cfg.intermediate as usize,
            wgmma: cfg.gemm == GemmKind::Wgmma,
        };
        Ok(MoeLayer {
            group,
            dev: Compute {
                compute_sms: parts[0].1.sms().count,
                cfg,
                ranks,
                mlp,
                trace: Trace::default(),
            },
            experts,
            weights,
        })
    }

    pub fn config(&self) -> &MoeConfig {
        &self.dev.cfg
    }

    /// The ranks this process hosts (every per-rank vector of the layer is indexed like it).
    pub fn hosted(&self) -> &[u32] {
        &self.group.hosted
    }

    /// Replaces the weights (after an optimizer step): re-quantises the experts (128x128 FP8,
    /// W and W^T) and re-uploads them with the gate and the bias. The EP group, the SM
    /// partitions and the row layouts are kept.
    pub fn set_weights(&mut self, weights: MoeWeights, progress: &dyn Progress) -> Result<()> {
        let cfg = &self.dev.cfg;
        let devices: Vec<Device> = self.dev.ranks.iter().map(|r| r.device.clone()).collect();
        check_shapes(cfg, &devices, self.group.hosted.len(), &weights)?;
        let experts = quantise_experts(cfg, &weights, progress)?;
        let (h, e_n, el) = (
            cfg.hidden as usize,
            cfg.experts as usize,
            cfg.local_experts(),
        );
        let gate_t = transpose(&weights.gate, e_n, h);
        for (&r, rd) in self.group.hosted.iter().zip(self.dev.ranks.iter_mut()) {
            let (r, d) = (r as usize, &rd.device);
            let mine: Vec<&ExpertQ> = experts[r * el..(r + 1) * el].iter().collect();
            rd.routed = MlpW::upload(d, &mine)?;
            if rd.shared.is_some() {
                rd.shared = Some(MlpW::upload(d, &[&experts[e_n]])?);
            }
            rd.gate = d.upload(&weights.gate)?;
            rd.gate_t = d.upload(&gate_t)?;
            rd.bias = d.upload(&weights.bias)?;
        }
        self.experts = experts;
        self.weights = weights;
        Ok(())
    }

    /// The FP32 master weights the layer was built from.
    pub fn weights(&self) -> &MoeWeights {
        &self.weights
    }

    /// SMs of each device's compute partition.
    pub fn compute_sms(&self) -> u32 {
        self.dev.compute_sms
    }

    /// The dequantised FP8 (W_gate|up, W_down) of expert `e` (routed `0..E`, shared `E`): the
    /// weights the device computes with.
    pub fn dequantised(&self, e: usize) -> Option<(&[f32], &[f32])> {
        self.experts.get(e).map(|q| (&q.w1.2[..], &q.w2.2[..]))
    }

    /// Takes the trace spans recorded since the last call.
    pub fn take_trace(&self) -> Vec<TraceSpan> {
        self.dev.trace.take()
    }

    /// Where the communication kernels (of `f` and `b`) and the compute kernels (so far) ran.
    pub fn placement(&self, f: &ForwardStats, b: &BackwardStats) -> Placement {
        let comms = [&f.dispatch, &f.combine, &b.dispatch_dy, &b.combine_dx];
        let mut comm_sms: Vec<u32> = comms.iter().flat_map(|c| c.sms_used.clone()).collect();
        comm_sms.sort_unstable();
        comm_sms.dedup();
        let mut compute_sms: Vec<u32> = self
            .dev
            .ranks
            .iter()
            .flat_map(|r| r.compute.sms_touched())
            .collect();
        compute_sms.sort_unstable();
        compute_sms.dedup();
        let disjoint = comm_sms
            .iter()
            .all(|s| compute_sms.binary_search(s).is_err());
        let comm_max_per_rank = comms.iter().map(|c| c.max_sms_per_rank).max().unwrap_or(0);
        Placement {
            ok: disjoint && comm_max_per_rank <= self.dev.cfg.num_sms as usize,
            comm_sms,
            compute_sms,
            disjoint,
            comm_max_per_rank,
        }
    }

    fn check_input(&self, what: &str, v: &[Vec<f32>]) -> Result<()> {
        let c = &self.dev.cfg;
        let n = c.tokens as usize * c.hidden as usize;
        if v.len() != self.dev.ranks.len() || v.iter().any(|x| x.len() != n) {
            return Err(MoeError::Shape(format!(
                "{what}: need {} (hosted) ranks of [{}, {}]",
                self.dev.ranks.len(),
                c.tokens,
                c.hidden
            )));
        }
        Ok(())
    }

    /// Checks device inputs: one BF16 buffer of at least `[T, H]` per rank, on that rank's
    /// device.
    fn check_dev_input(&self, what: &str, v: &[Buffer<bf16>]) -> Result<()> {
        let c = &self.dev.cfg;
        let n = c.tokens as usize * c.hidden as usize;
        if v.len() != self.dev.ranks.len() || v.iter().any(|x| x.len() < n) {
            return Err(MoeError::Shape(format!(
                "{what}: need {} (hosted) ranks of [{}, {}] bf16 buffers",
                self.dev.ranks.len(),
                c.tokens,
                c.hidden
            )));
        }
        let on = |(b, rd): (&Buffer<bf16>, &RankDev)| b.device().same(&rd.device);
        if let Some(r) = v.iter().zip(&self.dev.ranks).position(|p| !on(p)) {
            return Err(MoeError::Shape(format!(
                "{what}: rank {r}'s buffer is not on the layer's device {r}"
            )));
        }
        Ok(())
    }

    /// Forward of the per-rank host inputs `x` (`[T, H]` f32 each; see the module docs): the
    /// device forward, with Y also downloaded to [`Forward::y`].
    pub fn forward(&mut self, x: &[Vec<f32>], progress: &dyn Progress) -> Result<Forward> {
        self.check_input("x", x)?;
        let xs = x.iter().map(|v| RankIn::Host(v)).collect();
        let mut f = self.forward_in(xs, progress)?;
        f.y = f.y_dev.iter().map(download).collect::<Result<_>>()?;
        Ok(f)
    }

    /// Forward of the per-rank device inputs `x` (`[T, H]` BF16, rank `r`'s on the layer's
    /// device `r`): gate + routing + quantisation, dispatch (FP8) || shared expert, routed
    /// experts, combine; Y = combine + shared in [`Forward::y_dev`] (nothing crosses the host).
    pub fn forward_dev(
        &mut self,
        x: Vec<Buffer<bf16>>,
        progress: &dyn Progress,
    ) -> Result<Forward> {
        self.check_dev_input("x", &x)?;
        self.forward_in(x.into_iter().map(RankIn::Dev).collect(), progress)
    }

    /// Tokens routed to each expert (all ranks' top-k selections of `f`), `[E]`: the load the
    /// aux-loss-free bias update balances. Counted on each rank's device (`expert_count`); the
    /// ranks' small count vectors are read back and added in rank order (integers: exact).
    pub fn expert_counts(&self, f: &Forward) -> Result<Vec<u64>> {
        let c = &self.dev.cfg;
        let (e_n, n) = (c.experts as usize, c.tokens as usize * c.topk as usize);
        let mut total = vec![0u64; e_n];
        for (rd, route) in self.dev.ranks.iter().zip(&f.routes) {
            let mut out = rd.device.alloc::<u32>(e_n + 1)?;
            kernels::train::count::expert_count(&rd.compute, &route.idx, &mut out, n, e_n)?;
            let counts = rd.compute.read(&out)?;
            if let Some(&bad) = counts.get(e_n).filter(|&&b| b > 0) {
                return Err(MoeError::Shape(format!(
                    "{bad} routed expert indices outside [0, {e_n})"
                )));
            }
            total
                .iter_mut()
                .zip(&counts)
                .for_each(|(t, &v)| *t += u64::from(v));
        }
        Ok(total)
    }

    fn forward_in(&mut self, x: Vec<RankIn<'_>>, progress: &dyn Progress) -> Result<Forward> {
        let rn = self.dev.ranks.len();
        let t0 = Instant::now();
        let routes = per_rank(rn, "route + quantise (device)", progress, |r| {
            self.dev.route(r, &x[r])
        })?;
        let route_seconds = t0.elapsed().as_secs_f64();
        progress.note("gate gemm + route + quantise (device)", route_seconds);
        let Dispatched {
            outs,
            handle,
            shared,
            stats,
            comm,
            compute,
            fp8_saved,
            record_bytes,
        } = self.dispatch_x(&routes, progress)?;
        let k_starts: Vec<Buffer<i32>> = (0..rn)
            .map(|r| {
                let o = &outs[r];
                let mut k: Vec<i32> = o.expert_base.iter().map(|&b| b as i32).collect();
                k.push(o.m_pad as i32);
                self.dev.ranks[r].device.upload(&k)
            })
            .collect::<std::result::Result<_, _>>()?;
        let t0 = Instant::now();
        let (routed, recv_q): (Vec<_>, Vec<_>) = per_rank(
            rn,
            "routed experts fwd (fp8 gemm x2, swiglu)",
            progress,
            |r| self.dev.routed_fwd(r, &outs[r]),
        )?
        .into_iter()
        .unzip();
        let routed_seconds = t0.elapsed().as_secs_f64();
        progress.note("routed experts fwd", routed_seconds);
        let mut f = Forward {
            y: Vec::new(),
            y_dev: Vec::new(),
            stats: ForwardStats {
                route_seconds,
                dispatch: stats,
                dispatch_span: comm,
                fp8_saved_bytes: fp8_saved,
                record_bytes,
                shared_span: compute,
                routed_seconds,
                rows_per_rank: outs.iter().map(|o| o.m_pad).collect(),
                combine: CommStats::default(),
                overlaps: vec![Overlap {
                    pair: "dispatch || shared expert fwd",
                    comm,
                    compute,
                }],
            },
            routes,
            outs,
            handle,
            shared,
            routed,
            recv_q,
            k_starts,
            slot_masks: Vec::new(),
        };
        self.combine_y(&mut f, progress)?;
        Ok(f)
    }

    /// Dispatch of the inputs (FP8 or BF16 payload; communication SMs) || the shared expert's
    /// forward (compute).
    fn dispatch_x(&mut self, routes: &[RankRoute], progress: &dyn Progress) -> Result<Dispatched> {
        let (group, dev) = (&mut self.group, &self.dev);
        let rn = dev.ranks.len();
        let payload = dev.cfg.payload;
        let xr: Vec<XRef> = routes
            .iter()
            .map(|r| match payload {
                Payload::Fp8 => XRef::Fp8(&r.q, &r.sc),
                Payload::Bf16 => XRef::Bf16(&r.xbf),
            })
            .collect();
        let idx: Vec<&Buffer<i32>> = routes.iter().map(|r| &r.idx).collect();
        let w: Vec<&Buffer<f32>> = routes.iter().map(|r| &r.w).collect();
        let (disp, shared, sp_c, sp_x) = overlapped(
            dev.cfg.sequential,
            || {
                group
                    .dispatch(&xr, &idx, &w, None)
                    .map(|r| (r, group.last.clone()))
            },
            || {
                per_rank(rn, "shared expert fwd (|| dispatch)", progress, |r| {
                    dev.shared_fwd(r, &routes[r])
                })
            },
        );
        let ((outs, handle), stats) = disp?;
        let shared = shared?;
        let handle = handle.ok_or_else(|| MoeError::Shape("dispatch returned no handle".into()))?;
        let name = match payload {
            Payload::Fp8 => "dispatch (fp8)",
            Payload::Bf16 => "dispatch (bf16)",
        };
        dev.trace.comm_all(&format!("ep_{name}"), rn, sp_c);
        let rb8 = group.cfg.record_bytes(Payload::Fp8) as f64;
        let rb16 = group.cfg.record_bytes(Payload::Bf16) as f64;
        let fp8_saved = match payload {
            Payload::Fp8 => {
                (stats.inter_node_bytes + stats.intra_node_bytes) as f64 / rb8 * (rb16 - rb8)
            }
            Payload::Bf16 => 0.0,
        };
        progress.note(name, sp_c.secs());
        progress.note("shared expert fwd (overlapped with dispatch)", sp_x.secs());
        Ok(Dispatched {
            outs,
            handle,
            shared,
            stats,
            comm: sp_c,
            compute: sp_x,
            fp8_saved,
            record_bytes: group.cfg.record_bytes(payload) as u64,
        })
    }

    /// Combine (BF16, weighted by the top-k weights; per top-k slot with `slot_combine`);
    /// Y = combine + shared expert output, summed in f32 on the device, one BF16 rounding.
    fn combine_y(&mut self, f: &mut Forward, progress: &dyn Progress) -> Result<()> {
        let rn = self.dev.ranks.len();
        let t0 = Instant::now();
        if self.dev.cfg.slot_combine {
            f.slot_masks = self.dev.slot_masks(&f.outs)?;
        }
        let rw: Vec<&Buffer<f32>> = f.outs.iter().map(|o| &o.recv_w).collect();
        let ys = self.dev.outputs(&f.routed);
        let (comb, stats) = combine_rows(&mut self.group, &ys, &rw, &f.slot_masks, &f.handle)?;
        f.stats.combine = stats;
        let span = Span {
            start: t0,
            end: Instant::now(),
        };
        self.dev
            .trace
            .comm_all("ep_combine (bf16, weighted)", rn, span);
        progress.note("combine (bf16)", f.stats.combine.seconds);
        let acc = self.dev.combined_f32(comb, &f.routes)?;
        f.y_dev = (0..rn)
            .map(|r| {
                let sh = f.shared[r].as_ref().map(|s| &s.y);
                self.dev.finish_sum(r, &acc[r], sh, None)
            })
            .collect::<Result<_>>()?;
        Ok(())
    }

    /// Backward of host `dy` (`[T, H]` f32 per rank, rounded to BF16 on upload) through the
    /// forward `f`: the device backward, with dX also downloaded to [`Backward::dx`].
    pub fn backward(
        &mut self,
        f: &Forward,
        dy: &[Vec<f32>],
        progress: &dyn Progress,
    ) -> Result<Backward> {
        self.check_input("dy", dy)?;
        let gyb: Vec<Buffer<bf16>> = self
            .dev
            .ranks
            .iter()
            .zip(dy)
            .map(|(rd, v)| {
                let v: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
                rd.device.upload(&v)
            })
            .collect::<std::result::Result<_, _>>()?;
        let mut b = self.backward_in(f, &gyb, progress)?;
        b.dx = b.dx_dev.iter().map(download).collect::<Result<_>>()?;
        Ok(b)
    }

    /// Backward of the per-rank device gradients `dy` (`[T, H]` BF16, rank `r`'s on the layer's
    /// device `r`) through the forward `f`: dX in [`Backward::dx_dev`], the expert-weight and
    /// gate gradients.
    pub fn backward_dev(
        &mut self,
        f: &Forward,
        dy: &[Buffer<bf16>],
        progress: &dyn Progress,
    ) -> Result<Backward> {
        self.check_dev_input("dy", dy)?;
        self.backward_in(f, dy, progress)
    }

    fn backward_in(
        &mut self,
        f: &Forward,
        gyb: &[Buffer<bf16>],
        progress: &dyn Progress,
    ) -> Result<Backward> {
        let (gouts, shared, p1) = self.dispatch_dy(f, gyb, progress)?;
        let (tg, dgr, p2) = self.topk_grad_and_dgrad(f, &gouts, progress)?;
        let (gx, wg, p3) = self.combine_dx_and_wgrad(f, &tg, &dgr, progress)?;
        let acc = self.dev.combined_f32(gx, &f.routes)?;
        let mut routed_dw = Vec::new();
        let mut gate = Vec::new();
        let mut dx = Vec::new();
        // dX = combine + shared expert + gate path, summed in f32 in that order on the
        // device, one BF16 rounding
        for (r, (dw, (g, gdx))) in wg.into_iter().enumerate() {
            let sh = shared[r].as_ref().map(|b| &b.0);
            dx.push(self.dev.finish_sum(r, &acc[r], sh, Some(&gdx))?);
            routed_dw.push(dw);
            gate.push(g);
        }
        let overlaps = vec![
            p1.overlap("cached dispatch of dY || shared expert bwd"),
            p2.overlap("top-k weight grads || routed dgrad"),
            p3.overlap("combine of dX || gate bwd + routed wgrad"),
        ];
        let stats = BackwardStats {
            dispatch_dy: p1.stats,
            dispatch_dy_span: p1.comm,
            shared_span: p1.compute,
            topk_intra_bytes: tg.intra_node_bytes,
            topk_inter_bytes: tg.inter_node_bytes,
            topk_span: p2.comm,
            dgrad_span: p2.compute,
            combine_dx: p3.stats,
            combine_dx_span: p3.comm,
            wgrad_span: p3.compute,
            overlaps,
        };
        Ok(Backward {
            dx: Vec::new(),
            dx_dev: dx,
            routed_dw,
            shared_dw: shared.into_iter().map(|s| s.map(|s| s.1)).collect(),
            gate,
            stats,
        })
    }

    /// Cached dispatch of dY (= combine^T, BF16) || the shared expert's dgrad + wgrad.
    fn dispatch_dy(
        &mut self,
        f: &Forward,
        gyb: &[Buffer<bf16>],
        progress: &dyn Progress,
    ) -> Result<(Vec<DispatchOut>, Vec<Option<SharedGrad>>, Pair)> {
        let (group, dev) = (&mut self.group, &self.dev);
        let rn = dev.ranks.len();
        let xr: Vec<XRef> = gyb.iter().map(XRef::Bf16).collect();
        let idx: Vec<&Buffer<i32>> = f.routes.iter().map(|r| &r.idx).collect();
        let w: Vec<&Buffer<f32>> = f.routes.iter().map(|r| &r.w).collect();
        let (disp, shared, comm, compute) = overlapped(
            dev.cfg.sequential,
            || {
                group
                    .dispatch(&xr, &idx, &w, Some(&f.handle))
                    .map(|r| (r.0, group.last.clone()))
            },
            || {
                per_rank(rn, "shared expert bwd (|| dispatch of dY)", progress, |r| {
                    dev.shared_bwd(r, f, &gyb[r])
                })
            },
        );
        let (gouts, stats) = disp?;
        let shared = shared?;
        dev.trace
            .comm_all("ep_dispatch cached (bf16, dY)", rn, comm);
        progress.note("bwd: combine^T = cached dispatch", comm.secs());
        progress.note(
            "bwd: shared expert dgrad+wgrad (overlapped)",
            compute.secs(),
        );
        Ok((
            gouts,
            shared,
            Pair {
                stats,
                comm,
                compute,
            },
        ))
    }

    /// dL/dw[t, k] = <dY_t, y_tk> on the expert side, put back to the home ranks (communication
    /// SMs) || the routed experts' dgrad.
    fn topk_grad_and_dgrad(
        &mut self,
        f: &Forward,
        gouts: &[DispatchOut],
        progress: &dyn Progress,
    ) -> Result<(TopkGrad, Vec<Option<MlpDgrad>>, Pair)> {
        let (group, dev) = (&mut self.group, &self.dev);
        let rn = dev.ranks.len();
        let ys = dev.outputs(&f.routed);
        let dys: Vec<&Buffer<u8>> = gouts.iter().map(|o| &o.recv_x).collect();
        let ntoks = vec![dev.cfg.tokens as usize; rn];
        let (tg, dgr, comm, compute) = overlapped(
            dev.cfg.sequential,
            || group.topk_weight_grad(&ys, &dys, &f.outs, &ntoks),
            || {
                per_rank(
                    rn,
                    "routed experts dgrad (|| top-k weight grads)",
                    progress,
                    |r| dev.routed_dgrad(r, f, &gouts[r]),
                )
            },
        );
        let tg = tg?;
        let dgr = dgr?;
        dev.trace.comm_all("ep_topk_grad (put to home)", rn, comm);
        progress.note("bwd: top-k weight grads (comm SMs)", comm.secs());
        progress.note("bwd: routed experts dgrad (overlapped)", compute.secs());
        let stats = CommStats::default();
        Ok((
            tg,
            dgr,
            Pair {
                stats,
                comm,
                compute,
            },
        ))
    }

    /// dispatch^T = combine of the experts' dX weighted by the top-k weights (communication
    /// SMs) || gate backward + routed wgrad (compute).
    fn combine_dx_and_wgrad(
        &mut self,
        f: &Forward,
        tg: &TopkGrad,
        dgr: &[Option<MlpDgrad>],
        progress: &dyn Progress,
    ) -> Result<(Combined, Vec<RankGrads>, Pair)> {
        let (group, dev) = (&mut self.group, &self.dev);
        let rn = dev.ranks.len();
        let rw: Vec<&Buffer<f32>> = f.outs.iter().map(|o| &o.recv_w).collect();
        let dxs: Vec<&Buffer<bf16>> = (0..rn)
            .map(|r| dgr[r].as_ref().map_or(&dev.ranks[r].empty, |d| &d.dx))
            .collect();
        let (comb, wg, comm, compute) = overlapped(
            dev.cfg.sequential,
            || combine_rows(group, &dxs, &rw, &f.slot_masks, &f.handle),
            || {
                per_rank(rn, "gate bwd + routed wgrad (|| combine)", progress, |r| {
                    let gate = dev.gate_bwd(r, f, &tg.dw[r])?;
                    Ok((dev.routed_wgrad(r, f, dgr[r].as_ref())?, gate))
                })
            },
        );
        let (gx, stats) = comb?;
        let wg = wg?;
        dev.trace.comm_all("ep_combine (bf16, dX)", rn, comm);
        progress.note("bwd: dispatch^T = combine", comm.secs());
        progress.note("bwd: gate bwd + routed wgrad (overlapped)", compute.secs());
        Ok((
            gx,
            wg,
            Pair {
                stats,
                comm,
                compute,
            },
        ))
    }
}

/// (dW_gate|up, dW_down) of one MLP (grouped over its experts), f32.
pub type ExpertDw = (Vec<f32>, Vec<f32>);

/// One rank's layer input (see the module docs).
enum RankIn<'a> {
    /// `[T, H]` f32 on the host.
    Host(&'a [f32]),
    /// `[T, H]` BF16 on the rank's device.
    Dev(Buffer<bf16>),
}

/// Per wgrad chunk X^T `[H, T/c]` in BF16.
type XChunks = Vec<Buffer<bf16>>;

/// A device tensor's BF16 values as f32 on the host.
fn download(b: &Buffer<bf16>) -> Result<Vec<f32>> {
    Ok(b.to_vec()?.iter().map(|v| v.to_f32()).collect())
}

/// An owned FP8 tensor: bytes and 1x128 scales.
type Fp8Buf = (Buffer<u8>, Buffer<f32>);

/// The routed experts' FP8 input: the dispatched bytes (FP8 payload) or `q`, the expert-side
/// quantisation of a BF16 payload.
fn expert_input<'a>(o: &'a DispatchOut, q: &'a Option<Fp8Buf>) -> Fp8<'a> {
    q.as_ref()
        .map_or((&o.recv_x, &o.recv_scales), |q| (&q.0, &q.1))
}

/// One rank's routed-expert weight gradients, gate gradients and `[T, H]` f32 gate-path dX.
type RankGrads = (ExpertDw, (GateGrad, Buffer<f32>));

/// The shared expert's (dX `[T, H]` BF16, per wgrad chunk (dW_gate|up, dW_down) partials) on
/// one rank.
type SharedGrad = (Buffer<bf16>, Vec<ExpertDw>);

/// What a combine produced: one weighted combine, or one unweighted combine per top-k slot.
enum Combined {
    One(Vec<Buffer<bf16>>),
    Slots(Vec<Vec<Buffer<bf16>>>),
}

/// `rows` combined to their home ranks: weighted by `rw` in one combine, or (`masks` given:
/// per top-k slot, per rank the row mask) one combine per slot.
fn combine_rows(
    group: &mut EpGroup,
    rows: &[&Buffer<bf16>],
    rw: &[&Buffer<f32>],
    masks: &[Vec<Buffer<f32>>],
    handle: &Handle,
) -> Result<(Combined, CommStats)> {
    if masks.is_empty() {
        let c = group.combine(rows, Some(rw), handle)?;
        return Ok((Combined::One(c), group.last.clone()));
    }
    let mut stats = CommStats::default();
    let mut out = Vec::new();
    for m in masks {
        let mr: Vec<&Buffer<f32>> = m.iter().collect();
        out.push(group.combine(rows, Some(&mr), handle)?);
        let l = &group.last;
        stats.seconds += l.seconds;
        stats.inter_node_bytes += l.inter_node_bytes;
        stats.intra_node_bytes += l.intra_node_bytes;
        stats.sms_used.extend(&l.sms_used);
        stats.max_sms_per_rank = stats.max_sms_per_rank.max(l.max_sms_per_rank);
    }
    stats.sms_used.sort_unstable();
    stats.sms_used.dedup();
    Ok((Combined::Slots(out), stats))
}

/// What the forward dispatch (and the shared expert beside it) produced.
struct Dispatched {
    outs: Vec<DispatchOut>,
    handle: Handle,
    shared: Vec<Option<MlpFwd>>,
    stats: CommStats,
    comm: Span,
    compute: Span,
    fp8_saved: f64,
    record_bytes: u64,
}

/// An overlapped pair's communication figures and both spans.
struct Pair {
    stats: CommStats,
    comm: Span,
    compute: Span,
}

impl Pair {
    fn overlap(&self, pair: &'static str) -> Overlap {
        Overlap {
            pair,
            comm: self.comm,
            compute: self.compute,
        }
    }
}

/// Quantises every expert's weights (128x128 FP8, W and W^T) on the host, each rank its own
/// experts (rank 0 also the shared one), in expert order.
fn quantise_experts(
    cfg: &MoeConfig,
    w: &MoeWeights,
    progress: &dyn Progress,
) -> Result<Vec<ExpertQ>> {
    let (h, e_n, i_n, el) = (
        cfg.hidden as usize,
        cfg.experts as usize,
        cfg.intermediate as usize,
        cfg.local_experts(),
    );
    let per = per_rank(
        cfg.ranks(),
        "quantise weights 128x128 (host)",
        progress,
        |r| {
            let mut v: Vec<ExpertQ> = (0..el)
                .map(|le| quant_expert(&w.w1[r * el + le], &w.w2[r * el + le], h, i_n))
                .collect();
            if cfg.shared && r == 0 {
                v.push(quant_expert(&w.w1[e_n], &w.w2[e_n], h, i_n));
            }
            Ok(v)
        },
    )?;
    let mut all: Vec<ExpertQ> = Vec::new();
    let mut sh = None;
    for (r, mut v) in per.into_iter().enumerate() {
        if cfg.shared && r == 0 {
            sh = v.pop();
        }
        all.extend(v);
    }
    all.extend(sh);
    Ok(all)
}

/// `[0, T/c, 2T/c, .., T]`: the token segments of `c` wgrad chunks.
fn chunk_starts(t_n: usize, c: usize) -> Vec<i32> {
    let c = c.max(1);
    (0..=c).map(|i| (i * t_n / c) as i32).collect()
}

/// Uploads each rank's experts, the shared expert, the gate and the shared expert's row layout.
fn upload_ranks(
    cfg: &MoeConfig,
    (hosted, devices): (&[u32], &[Device]),
    cs: Vec<Stream>,
    experts: &[ExpertQ],
    w: &MoeWeights,
    progress: &dyn Progress,
) -> Result<Vec<RankDev>> {
    let (h, e_n, t_n, el) = (
        cfg.hidden as usize,
        cfg.experts as usize,
        cfg.tokens as usize,
        cfg.local_experts(),
    );
    let gate_t = transpose(&w.gate, e_n, h);
    let ups = per_rank(devices.len(), "upload weights", progress, |i| {
        let (d, r) = (&devices[i], hosted[i] as usize);
        let mine: Vec<&ExpertQ> = experts[r * el..(r + 1) * el].iter().collect();
        let routed = MlpW::upload(d, &mine)?;
        let shared = match cfg.shared {
            true => Some(MlpW::upload(d, &[&experts[e_n]])?),
            false => None,
        };
        Ok((routed, shared))
    })?;
    devices
        .iter()
        .zip(cs)
        .zip(ups)
        .map(|((d, compute), (routed, shared))| {
            Ok(RankDev {
                device: d.clone(),
                compute,
                routed,
                shared,
                gate: d.upload(&w.gate)?,
                gate_t: d.upload(&gate_t)?,
                bias: d.upload(&w.bias)?,
                sh_mi: d.upload(&vec![0i32; t_n])?,
                sh_ones: d.upload(&vec![1f32; t_n])?,
                sh_ks: d.upload(&chunk_starts(t_n, cfg.wgrad_chunks as usize))?,
                empty: d.alloc::<bf16>(1)?,
            })
        })
        .collect()
}

impl Compute {
    fn span_since(&self, name: &str, r: usize, start: Instant) {
        let end = Instant::now();
        self.trace.push(name, r, "compute", Span { start, end });
    }

    /// Per rank the routed experts' `[m_pad, H]` outputs (a stand-in where no rows came).
    fn outputs<'a>(&'a self, routed: &'a [Option<MlpFwd>]) -> Vec<&'a Buffer<bf16>> {
        (0..self.ranks.len())
            .map(|r| routed[r].as_ref().map_or(&self.ranks[r].empty, |f| &f.y))
            .collect()
    }

    /// X on rank `r` as the gate and the quantisation read it: BF16 `[T, H]`, per wgrad chunk
    /// BF16 X^T `[H, T/c]`, and the f32 values the FP8 quantisation reads (a host input's own,
    /// a device input's exact widening).
    fn rank_input(&self, r: usize, x: &RankIn<'_>) -> Result<(Buffer<bf16>, XChunks, Buffer<f32>)> {
        let c = &self.cfg;
        let (h, t_n) = (c.hidden as usize, c.tokens as usize);
        let (st, d) = (&self.ranks[r].compute, &self.ranks[r].device);
        let tc = t_n / c.wgrad_chunks.max(1) as usize;
        match x {
            RankIn::Host(x) => {
                let xbf: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
                let xt = xbf
                    .chunks(tc * h)
                    .map(|x| d.upload(&transpose(x, tc, h)))
                    .collect::<std::result::Result<_, _>>()?;
                Ok((d.upload(&xbf)?, xt, d.upload(x)?))
            }
            RankIn::Dev(xb) => {
                let n = t_n * h;
                let x16 = d.alloc::<bf16>(n)?;
                st.copy_range((xb, 0), (&x16, 0), n)?;
                let mut xf = d.alloc::<f32>(n)?;
                ops::cvt_bf16_f32(st, &x16, &mut xf, n)?;
                let chunks = c.wgrad_chunks.max(1) as usize;
                let mut xt = Vec::new();
                let part = d.alloc::<bf16>(if chunks > 1 { tc * h } else { 1 })?;
                for i in 0..chunks {
                    // chunk i is rows [i tc, (i + 1) tc) of X: its own buffer (one chunk: X)
                    let src = match chunks {
                        1 => &x16,
                        _ => {
                            st.copy_range((&x16, i * tc * h), (&part, 0), tc * h)?;
                            &part
                        }
                    };
                    let mut t = d.alloc::<bf16>(tc * h)?;
                    ops::transpose_bf16(st, src, &mut t, tc, h)?;
                    // `part` is rewritten by the next chunk's copy: the transpose must have read it
                    st.synchronize()?;
                    xt.push(t);
                }
                Ok((x16, xt, xf))
            }
        }
    }

    /// Gate: logits `[T, E]` = X (BF16) W_gate^T (f32 out), routing, and the 1x128 FP8
    /// quantisation of X.
    fn route(&self, r: usize, x: &RankIn<'_>) -> Result<RankRoute> {
        let c = &self.cfg;
        let (h, e_n, t_n) = (c.hidden as usize, c.experts as usize, c.tokens as usize);
        let rd = &self.ranks[r];
        let (st, d) = (&rd.compute, &rd.device);
        let ts = Instant::now();
        let (xb16, xt, xb) = self.rank_input(r, x)?;
        let logits = d.alloc::<f32>(t_n * e_n)?;
        let p = GemmProblem::new(InTy::Bf16, t_n, e_n, h).out(OutTy::F32);
        kernels::gemm(st, &p, GemmBufs::new(&xb16, &rd.gate, &logits))?;
        let out = ep::routing::route(st, &logits, &rd.bias, &c.routing())?;
        let mut q = d.alloc::<u8>(t_n * h)?;
        let mut sc = d.alloc::<f32>(t_n * h / 128)?;
        kernels::quantize_fp8_1x128(st, &xb, &mut q, &mut sc, t_n, h, ScaleMode::Pow2)?;
        st.synchronize()?;
        self.span_since("gate gemm + route + quantise_1x128", r, ts);
        Ok(RankRoute {
            idx: out.idx,
            w: out.weights,
            q,
            sc,
            logits,
            xbf: xb16,
            xt,
        })
    }

    fn shared_rows(&self, r: usize) -> Rows<'_> {
        Rows {
            mi: &self.ranks[r].sh_mi,
            m: self.cfg.tokens as usize,
            groups: 1,
        }
    }

    fn expert_rows<'a>(&self, o: &'a DispatchOut) -> Rows<'a> {
        Rows {
            mi: &o.m_indices,
            m: o.m_pad,
            groups: self.cfg.local_experts(),
        }
    }

    fn shared_fwd(&self, r: usize, route: &RankRoute) -> Result<Option<MlpFwd>> {
        let Some(w) = &self.ranks[r].shared else {
            return Ok(None);
        };
        let ts = Instant::now();
        let rows = self.shared_rows(r);
        let f = self
            .mlp
            .fwd(&self.ranks[r].compute, (&route.q, &route.sc), w, rows)?;
        self.span_since("shared expert fwd", r, ts);
        Ok(Some(f))
    }

    /// Grouped FP8 GEMM gate/up -> SwiGLU + quantise -> grouped FP8 down over the rows rank `r`
    /// received.
    fn routed_fwd(&self, r: usize, o: &DispatchOut) -> Result<(Option<MlpFwd>, Option<Fp8Buf>)> {
        if o.m_pad == 0 {
            return Ok((None, None));
        }
        let ts = Instant::now();
        let rd = &self.ranks[r];
        let q = match self.cfg.payload {
            Payload::Fp8 => None,
            Payload::Bf16 => Some(self.quantise_received(r, o)?),
        };
        let x = expert_input(o, &q);
        let f = self
            .mlp
            .fwd(&rd.compute, x, &rd.routed, self.expert_rows(o))?;
        self.span_since(&format!("routed experts fwd {} rows", o.m_pad), r, ts);
        Ok((Some(f), q))
    }

    /// 1x128 FP8 quantisation of the BF16 rows rank `r` received (the expert-side quantisation
    /// of a BF16 dispatch).
    fn quantise_received(&self, r: usize, o: &DispatchOut) -> Result<Fp8Buf> {
        let (h, m, rd) = (self.cfg.hidden as usize, o.m_pad, &self.ranks[r]);
        let xb = rd.device.alloc::<bf16>(m * h)?;
        rd.compute.copy_bytes(&o.recv_x, &xb)?;
        let mut q = rd.device.alloc::<u8>(m * h)?;
        let mut s = rd.device.alloc::<f32>(m * h / 128)?;
        kernels::quantize_fp8_1x128(&rd.compute, &xb, &mut q, &mut s, m, h, ScaleMode::Pow2)?;
        // `xb` is freed on return: the queued kernel must have read it
        rd.compute.synchronize()?;
        Ok((q, s))
    }

    fn shared_bwd(&self, r: usize, f: &Forward, gy: &Buffer<bf16>) -> Result<Option<SharedGrad>> {
        let rd = &self.ranks[r];
        let (Some(w), Some(sf)) = (&rd.shared, &f.shared[r]) else {
            return Ok(None);
        };
        let ts = Instant::now();
        let c = &self.cfg;
        let dy = rd
            .device
            .alloc::<bf16>(c.tokens as usize * c.hidden as usize)?;
        rd.compute.copy_bytes(gy, &dy)?;
        let rows = self.shared_rows(r);
        let d = self.mlp.dgrad(&rd.compute, dy, sf, &rd.sh_ones, w, rows)?;
        let route = &f.routes[r];
        let x = (&route.q, &route.sc);
        // one k-group per wgrad chunk: the chunks' partials come out apart
        let chunks = c.wgrad_chunks.max(1) as usize;
        let wrows = Rows {
            groups: chunks,
            ..rows
        };
        let (dw1, dw2) = self.mlp.wgrad(&rd.compute, &d, x, wrows, &rd.sh_ks)?;
        let (n1, n2) = (dw1.len() / chunks, dw2.len() / chunks);
        let dw = (0..chunks)
            .map(|i| {
                (
                    dw1[i * n1..(i + 1) * n1].to_vec(),
                    dw2[i * n2..(i + 1) * n2].to_vec(),
                )
            })
            .collect();
        self.span_since("shared expert dgrad+wgrad", r, ts);
        Ok(Some((d.dx, dw)))
    }

    /// quantise dY -> down^T -> SwiGLU backward -> gate/up^T over the rows rank `r` received.
    fn routed_dgrad(&self, r: usize, f: &Forward, g: &DispatchOut) -> Result<Option<MlpDgrad>> {
        let (o, Some(rf)) = (&f.outs[r], &f.routed[r]) else {
            return Ok(None);
        };
        let rd = &self.ranks[r];
        let ts = Instant::now();
        let dy = rd
            .device
            .alloc::<bf16>(o.m_pad * self.cfg.hidden as usize)?;
        rd.compute.copy_bytes(&g.recv_x, &dy)?;
        let rows = self.expert_rows(o);
        let d = self
            .mlp
            .dgrad(&rd.compute, dy, rf, &o.recv_w, &rd.routed, rows)?;
        self.span_since("routed experts dgrad", r, ts);
        Ok(Some(d))
    }

    /// Routing backward, dX_gate = dlogits W_gate, dW_gate = dlogits^T X per wgrad chunk (BF16
    /// GEMMs, f32 out); also returns dX_gate on the device.
    fn gate_bwd(&self, r: usize, f: &Forward, dw: &Buffer<u8>) -> Result<(GateGrad, Buffer<f32>)> {
        let c = &self.cfg;
        let (h, e_n, t_n) = (c.hidden as usize, c.experts as usize, c.tokens as usize);
        let (rd, route) = (&self.ranks[r], &f.routes[r]);
        let (st, d) = (&rd.compute, &rd.device);
        let ts = Instant::now();
        let rg =
            ep::grad::route_backward(st, &route.logits, &route.idx, &route.w, dw, &c.routing())?;
        let dxg = d.alloc::<f32>(t_n * h)?;
        let p = GemmProblem::new(InTy::Bf16, t_n, h, e_n).out(OutTy::F32);
        kernels::gemm(st, &p, GemmBufs::new(&rg.dlogits_bf16, &rd.gate_t, &dxg))?;
        st.synchronize()?;
        let dlogits_t = st.read(&rg.dlogits_t_bf16)?;
        let dw = self.gate_wgrad(r, &dlogits_t, &rg.dlogits_t_bf16, &route.xt)?;
        self.span_since("gate bwd (route bwd + bf16 gemm x2)", r, ts);
        let g = GateGrad {
            dlogits: st.read(&rg.dlogits)?,
            dlogits_t,
            dx: st.read(&dxg)?,
            dw,
        };
        Ok((g, dxg))
    }

    /// dW_gate `[E, H]` per wgrad chunk: `dlogits^T [E, T/c] x (X^T [H, T/c])^T`. With one
    /// chunk the device's `dlt` is the operand; with more, each chunk's columns of the host
    /// copy `dlt_host` are uploaded as its own operand.
    fn gate_wgrad(
        &self,
        r: usize,
        dlt_host: &[bf16],
        dlt: &Buffer<bf16>,
        xt: &[Buffer<bf16>],
    ) -> Result<Vec<Vec<f32>>> {
        let c = &self.cfg;
        let (h, e_n, t_n) = (c.hidden as usize, c.experts as usize, c.tokens as usize);
        let (st, d) = (&self.ranks[r].compute, &self.ranks[r].device);
        let tc = t_n / xt.len().max(1);
        let mut out = Vec::new();
        for (i, x) in xt.iter().enumerate() {
            let dwg = d.alloc::<f32>(e_n * h)?;
            let p = GemmProblem::new(InTy::Bf16, e_n, h, tc).out(OutTy::F32);
            if xt.len() == 1 {
                kernels::gemm(st, &p, GemmBufs::new(dlt, x, &dwg))?;
            } else {
                let cols: Vec<bf16> = (0..e_n)
                    .flat_map(|e| dlt_host[e * t_n + i * tc..e * t_n + (i + 1) * tc].to_vec())
                    .collect();
                let a = d.upload(&cols)?;
                kernels::gemm(st, &p, GemmBufs::new(&a, x, &dwg))?;
                // `a` is freed on return: the queued GEMM must have read it
                st.synchronize()?;
            }
            out.push(st.read(&dwg)?);
        }
        Ok(out)
    }

    /// With `slot_combine`: per top-k slot, per rank the mask of the rows of that slot.
    fn slot_masks(&self, outs: &[DispatchOut]) -> Result<Vec<Vec<Buffer<f32>>>> {
        let mut all = Vec::new();
        for k in 0..self.cfg.topk {
            let mut per = Vec::new();
            for (rd, o) in self.ranks.iter().zip(outs) {
                let mut m = rd.device.alloc::<f32>(o.m_pad.max(1))?;
                ops::topk_slot_mask(&rd.compute, &o.recv_k, &mut m, k, o.m_pad)?;
                per.push(m);
            }
            all.push(per);
        }
        for rd in &self.ranks {
            rd.compute.synchronize()?;
        }
        Ok(all)
    }

    /// Per rank the combined rows as f32 `[T, H]`: the one combine's BF16 values, or the
    /// per-slot combines summed in slot order, weighted by the home rank's top-k weights.
    fn combined_f32(&self, c: Combined, routes: &[RankRoute]) -> Result<Vec<Buffer<f32>>> {
        let cfg = &self.cfg;
        let (h, t_n, kk) = (cfg.hidden as usize, cfg.tokens as usize, cfg.topk as usize);
        let n = t_n * h;
        let mut out = Vec::new();
        for (r, rd) in self.ranks.iter().enumerate() {
            let mut acc = rd.device.alloc::<f32>(n)?;
            match &c {
                Combined::One(v) => ops::cvt_bf16_f32(&rd.compute, &v[r], &mut acc, n)?,
                Combined::Slots(v) => {
                    for (k, part) in v.iter().enumerate() {
                        let s = ops::SlotAcc {
                            tokens: t_n,
                            h,
                            k,
                            topk: kk,
                        };
                        ops::topk_slot_acc(&rd.compute, &part[r], &routes[r].w, &mut acc, s)?;
                    }
                }
            }
            rd.compute.synchronize()?;
            out.push(acc);
        }
        Ok(out)
    }

    /// `bf16(acc + part + extra)` summed in f32 in that order on rank `r`'s compute stream
    /// (`part`, `extra` optional), on rank `r`'s device.
    fn finish_sum(
        &self,
        r: usize,
        acc: &Buffer<f32>,
        part: Option<&Buffer<bf16>>,
        extra: Option<&Buffer<f32>>,
    ) -> Result<Buffer<bf16>> {
        let n = self.cfg.tokens as usize * self.cfg.hidden as usize;
        let (st, d) = (&self.ranks[r].compute, &self.ranks[r].device);
        let mut sum: Option<Buffer<f32>> = None;
        if let Some(p) = part {
            let mut pf = d.alloc::<f32>(n)?;
            ops::cvt_bf16_f32(st, p, &mut pf, n)?;
            let mut o = d.alloc::<f32>(n)?;
            ops::f32_add(st, acc, &pf, &mut o, n)?;
            st.synchronize()?;
            sum = Some(o);
        }
        if let Some(e) = extra {
            let mut o = d.alloc::<f32>(n)?;
            ops::f32_add(st, sum.as_ref().unwrap_or(acc), e, &mut o, n)?;
            st.synchronize()?;
            sum = Some(o);
        }
        let mut out = d.alloc::<bf16>(n)?;
        ops::cvt_f32_bf16(st, sum.as_ref().unwrap_or(acc), &mut out, n)?;
        st.synchronize()?;
        Ok(out)
    }

    /// k-grouped FP8 wgrad of the routed experts of rank `r` (empty when it received no rows).
    fn routed_wgrad(
        &self,
        r: usize,
        f: &Forward,
        d: Option<&MlpDgrad>,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (o, Some(d)) = (&f.outs[r], d) else {
            return Ok((Vec::new(), Vec::new()));
        };
        let ts = Instant::now();
        let st = &self.ranks[r].compute;
        let x = expert_input(o, &f.recv_q[r]);
        let dw = self
            .mlp
            .wgrad(st, d, x, self.expert_rows(o), &f.k_starts[r])?;
        self.span_since("routed wgrad (k-grouped fp8)", r, ts);
        Ok(dw)
    }
}
