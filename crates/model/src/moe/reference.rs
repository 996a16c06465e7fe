//! The f64 host reference of the MoE layer and the checks of a device step against it.
//!
//! The reference models the device path's roundings (FP8 of x, weights 128x128, SwiGLU output,
//! dY and dG|dU 1x128; BF16 storage of the GEMM outputs; the wgrad operands' FP8 along tokens),
//! so what is left is f32-vs-f64 accumulation and the rare rounding-boundary flip it causes.
//! With a BF16 dispatch payload the routed experts' input is X rounded to BF16 and then
//! quantised 1x128 on the expert side; the shared expert keeps the home rank's FP8 of X.
//! Checked: routing (bit-exact vs the CPU routing on the device's logits) and the FP8 input
//! (bit-exact); the inter-node dispatch volume (one record per (token, remote node)); for a
//! random sample of tokens per rank (every routed path plus the shared one) the gate logits, Y,
//! dlogits and dX; dW_gate (every element); for a random sample of routed experts (all their
//! rows) and one rank's shared-expert partial, the weight gradients.

use super::exec::{per_rank, Progress};
use super::host::{bf, dsilu, fp8_cols, fp8_row, silu};
use super::layer::{Backward, Forward};
use super::{MoeError, MoeLayer, Result, StepData};
use half::bf16;
use kernels::ScaleMode;
use rand::seq::SliceRandom;
use rand::Rng;
use std::time::Instant;

/// Error accumulator: max |got - want|, max |want|, sum (got - want)^2, sum want^2.
#[derive(Clone, Copy, Debug, Default)]
pub struct ErrStats {
    pub max_err: f64,
    pub max_ref: f64,
    pub ss_err: f64,
    pub ss_ref: f64,
}

impl ErrStats {
    pub fn add(&mut self, got: f64, want: f64) {
        let d = got - want;
        self.max_err = self.max_err.max(d.abs());
        self.max_ref = self.max_ref.max(want.abs());
        self.ss_err += d * d;
        self.ss_ref += want * want;
    }
    pub fn merge(self, o: ErrStats) -> ErrStats {
        ErrStats {
            max_err: self.max_err.max(o.max_err),
            max_ref: self.max_ref.max(o.max_ref),
            ss_err: self.ss_err + o.ss_err,
            ss_ref: self.ss_ref + o.ss_ref,
        }
    }
    /// max |err| / max |ref|
    pub fn rel(&self) -> f64 {
        self.max_err / self.max_ref.max(1e-30)
    }
    /// ||err||_F / ||ref||_F
    pub fn fro(&self) -> f64 {
        (self.ss_err / self.ss_ref.max(1e-300)).sqrt()
    }
}

/// How much of a step is checked.
#[derive(Clone, Copy, Debug)]
pub struct CheckConfig {
    /// Tokens per rank checked (all their expert paths, Y, dX, logits, dlogits); 0 = all.
    pub tokens: usize,
    /// Routed experts whose weight gradients are checked in full.
    pub experts: usize,
}

/// Tolerances of the checks. Y, dX, logits, dlogits: max |err| / max |ref|; weight gradients
/// and dW_gate: ||err||_F / ||ref||_F.
#[derive(Clone, Copy, Debug)]
pub struct Tolerances {
    pub y: f64,
    pub dx: f64,
    pub dw: f64,
    pub logits: f64,
    pub dlogits: f64,
    pub dw_gate: f64,
}

impl Default for Tolerances {
    /// Y, dX: FP8 paths with f32 accumulation; dW: FP8 operands, norm-wise. Gate: logits and
    /// dW_gate are BF16-input GEMMs with f32 accumulation checked against f64 on the same
    /// inputs; dlogits carry the top-k weight gradients' BF16 expert outputs.
    fn default() -> Tolerances {
        Tolerances {
            y: 0.02,
            dx: 0.02,
            dw: 0.01,
            logits: 1e-4,
            dlogits: 0.02,
            dw_gate: 1e-4,
        }
    }
}

/// The results of [`check`].
#[derive(Clone, Debug)]
pub struct CheckReport {
    /// Every rank's FP8 input bytes and scales equal the CPU quantiser's.
    pub quant_ok: bool,
    /// Inter-node dispatch records: one per (token, remote node), and what one per (token,
    /// remote expert) would have been.
    pub inter_node_records: u64,
    pub inter_node_records_without_node_limit: u64,
    /// The dispatch's inter-node bytes equal `inter_node_records` x record size.
    pub inter_ok: bool,
    pub y: ErrStats,
    pub dx: ErrStats,
    pub logits: ErrStats,
    pub dlogits: ErrStats,
    pub dw_gate: ErrStats,
    pub dw_gate_up: ErrStats,
    pub dw_down: ErrStats,
    /// The shared expert's partial of `shared_rank` (zero stats without a shared expert).
    pub shared_dw_gate_up: ErrStats,
    pub shared_dw_down: ErrStats,
    /// Sampled tokens per rank (sorted), sampled routed experts (sorted), the rank whose
    /// shared-expert partial was checked.
    pub tokens: Vec<Vec<usize>>,
    pub experts: Vec<usize>,
    pub shared_rank: usize,
    pub tol: Tolerances,
    pub seconds: f64,
}

impl CheckReport {
    pub fn ok_y(&self) -> bool {
        self.y.rel() <= self.tol.y
    }
    pub fn ok_dx(&self) -> bool {
        self.dx.rel() <= self.tol.dx
    }
    pub fn ok_routed_dw(&self) -> bool {
        self.dw_gate_up.fro() <= self.tol.dw && self.dw_down.fro() <= self.tol.dw
    }
    pub fn ok_shared_dw(&self) -> bool {
        self.shared_dw_gate_up.fro() <= self.tol.dw && self.shared_dw_down.fro() <= self.tol.dw
    }
    pub fn ok_logits(&self) -> bool {
        self.logits.rel() <= self.tol.logits
    }
    pub fn ok_dlogits(&self) -> bool {
        self.dlogits.rel() <= self.tol.dlogits
    }
    pub fn ok_dw_gate(&self) -> bool {
        self.dw_gate.fro() <= self.tol.dw_gate
    }
    /// Every check passed (`shared`: the layer has a shared expert).
    pub fn ok(&self, shared: bool) -> bool {
        self.quant_ok
            && self.inter_ok
            && self.ok_y()
            && self.ok_dx()
            && self.ok_routed_dw()
            && (!shared || self.ok_shared_dw())
            && self.ok_logits()
            && self.ok_dlogits()
            && self.ok_dw_gate()
    }
    /// Total sampled tokens.
    pub fn sampled_tokens(&self) -> usize {
        self.tokens.iter().map(|v| v.len()).sum()
    }
}

/// What the reference needs from the device, per rank, on the host.
struct RankHost {
    /// `[T, E]` device logits.
    logits: Vec<f32>,
    /// `[T, topk]` selection and weights.
    idx: Vec<i32>,
    w: Vec<f32>,
    /// `[T, H]` the device's FP8 input, dequantised.
    xq: Vec<f32>,
    /// `[T, H]` what the routed experts see with a BF16 dispatch payload: X rounded to BF16,
    /// then 1x128 FP8 on the expert side (`None` with FP8: they see `xq`).
    xq_routed: Option<Vec<f32>>,
    quant_ok: bool,
    /// Per received row: `src_rank << 24 | token`, top-k weight.
    src: Vec<i32>,
    row_w: Vec<f32>,
}

impl RankHost {
    /// Token `t`'s input row `[h]` as the routed experts see it.
    fn routed_row(&self, t: usize, h: usize) -> &[f32] {
        &self.xq_routed.as_ref().unwrap_or(&self.xq)[t * h..(t + 1) * h]
    }
}

/// Reads rank `r`'s routing and FP8 input back and checks them bit-exact against the CPU
/// (routing on the device's logits; quantisation of `x`).
fn rank_host(layer: &MoeLayer, f: &Forward, r: usize, x: &[f32]) -> Result<RankHost> {
    let c = layer.config();
    let (h, t_n, kk) = (c.hidden as usize, c.tokens as usize, c.topk as usize);
    let route = &f.routes[r];
    let logits = route.logits.to_vec()?;
    let rf = ep::routing::route_ref(&logits, &layer.weights().bias, &c.routing())?;
    let idx = route.idx.to_vec()?;
    if idx[..t_n * kk] != rf.idx[..] {
        return Err(MoeError::Check(
            "routing differs from the CPU reference".into(),
        ));
    }
    let (qr, sr) = kernels::quant::ref_quant_1x128(x, t_n, h, ScaleMode::Pow2);
    let (qd, sd) = (route.q.to_vec()?, route.sc.to_vec()?);
    let xq = (0..t_n * h)
        .map(|i| emu::fp::e4m3_to_f32(qd[i]) * sd[i / 128])
        .collect();
    let xq_routed = match c.payload {
        ep::Payload::Fp8 => None,
        ep::Payload::Bf16 => {
            let xb: Vec<f32> = x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
            let (q, s) = kernels::quant::ref_quant_1x128(&xb, t_n, h, ScaleMode::Pow2);
            Some(
                (0..t_n * h)
                    .map(|i| emu::fp::e4m3_to_f32(q[i]) * s[i / 128])
                    .collect(),
            )
        }
    };
    Ok(RankHost {
        logits,
        idx,
        w: route.w.to_vec()?,
        xq,
        xq_routed,
        quant_ok: qd == qr && sd == sr,
        src: f.outs[r].recv_src.to_vec()?,
        row_w: f.outs[r].recv_w.to_vec()?,
    })
}

/// Node-limited dispatch: one inter-node record per (token, destination node other than home),
/// versus one per (token, expert on another node) without the forwarding hop.
fn inter_node_records(layer: &MoeLayer, hosts: &[RankHost]) -> (u64, u64) {
    let c = layer.config();
    let (t_n, kk, el, gpn) = (
        c.tokens as usize,
        c.topk as usize,
        c.local_experts(),
        c.gpus_per_node as usize,
    );
    let (mut node_copies, mut expert_copies) = (0u64, 0u64);
    for (r, hr) in hosts.iter().enumerate() {
        let home = r / gpn;
        for t in 0..t_n {
            let mut nodes = std::collections::BTreeSet::new();
            for &e in &hr.idx[t * kk..(t + 1) * kk] {
                let node = (e as usize / el) / gpn;
                if node != home {
                    nodes.insert(node);
                    expert_copies += 1;
                }
            }
            node_copies += nodes.len() as u64;
        }
    }
    (node_copies, expert_copies)
}

/// Checks a forward `f` and backward `b` of `layer` on `data` against the f64 reference. The
/// samples are drawn from `rng` (tokens per rank, then experts, then the shared rank). Fails
/// only when the device's routing differs from the CPU's or a shape is inconsistent; numerical
/// results are in the report (see [`CheckReport::ok`]).
pub fn check(
    layer: &MoeLayer,
    data: &StepData,
    f: &Forward,
    b: &Backward,
    cc: &CheckConfig,
    rng: &mut impl Rng,
    progress: &dyn Progress,
) -> Result<CheckReport> {
    let c = layer.config();
    let (rn, t_n) = (c.ranks(), c.tokens as usize);
    let t0 = Instant::now();
    let hosts = per_rank(rn, "routing + FP8 input vs CPU", progress, |r| {
        rank_host(layer, f, r, &data.x[r])
    })?;
    let (node_copies, expert_copies) = inter_node_records(layer, &hosts);
    let inter_ok = f.stats.dispatch.inter_node_bytes == node_copies * f.stats.record_bytes;
    let tokens: Vec<Vec<usize>> = (0..rn)
        .map(|_| {
            let mut v: Vec<usize> = (0..t_n).collect();
            v.shuffle(rng);
            if cc.tokens > 0 {
                v.truncate(cc.tokens.min(t_n));
            }
            v.sort_unstable();
            v
        })
        .collect();
    // W_gate `[E, H]` in f32 (BF16 values, exact) for the logits' row sums
    let gate: Vec<f32> = layer.weights().gate.iter().map(|g| g.to_f32()).collect();
    let ctx = Ctx {
        layer,
        data,
        f,
        b,
        hosts: &hosts,
        gate: &gate,
    };
    let tok = per_rank(rn, "f64 reference (sampled tokens)", progress, |r| {
        ctx.token_errors(r, &tokens[r])
    })?;
    let tok = tok.into_iter().fold([ErrStats::default(); 4], |a, t| {
        [0, 1, 2, 3].map(|i| a[i].merge(t[i]))
    });
    let dw_gate = ctx.dw_gate_errors(progress)?;
    let e_n = c.experts as usize;
    let mut experts: Vec<usize> = (0..e_n).collect();
    experts.shuffle(rng);
    experts.truncate(cc.experts.min(e_n));
    experts.sort_unstable();
    let shared_rank = rng.gen_range(0..rn);
    let (routed, shared) = ctx.dw_errors(&experts, shared_rank, progress)?;
    Ok(CheckReport {
        quant_ok: hosts.iter().all(|h| h.quant_ok),
        inter_node_records: node_copies,
        inter_node_records_without_node_limit: expert_copies,
        inter_ok,
        logits: tok[0],
        y: tok[1],
        dx: tok[2],
        dlogits: tok[3],
        dw_gate,
        dw_gate_up: routed.0,
        dw_down: routed.1,
        shared_dw_gate_up: shared.0,
        shared_dw_down: shared.1,
        tokens,
        experts,
        shared_rank,
        tol: Tolerances::default(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Everything the per-rank reference jobs read.
struct Ctx<'a> {
    layer: &'a MoeLayer,
    data: &'a StepData,
    f: &'a Forward,
    b: &'a Backward,
    hosts: &'a [RankHost],
    /// `[E, H]` W_gate as f32.
    gate: &'a [f32],
}

/// (dW_gate|up, dW_down) errors.
type DwErr = (ErrStats, ErrStats);

impl Ctx<'_> {
    fn dequantised(&self, e: usize) -> Result<(&[f32], &[f32])> {
        self.layer
            .dequantised(e)
            .ok_or_else(|| MoeError::Shape(format!("no expert {e}")))
    }

    /// Rank `r`'s dY row `t` as the device holds it (BF16).
    fn dy_bf16(&self, r: usize, t: usize) -> Vec<f32> {
        let h = self.layer.config().hidden as usize;
        self.data.dy[r][t * h..(t + 1) * h]
            .iter()
            .map(|&v| bf16::from_f32(v).to_f32())
            .collect()
    }

    /// Errors of rank `r`'s sampled tokens: [logits, Y, dX, dlogits].
    fn token_errors(&self, r: usize, tokens: &[usize]) -> Result<[ErrStats; 4]> {
        let c = self.layer.config();
        let (h, e_n) = (c.hidden as usize, c.experts as usize);
        let (hr, x) = (&self.hosts[r], &self.data.x[r]);
        let mut err = [ErrStats::default(); 4];
        for &t in tokens {
            // gate logits: BF16 x and W_gate, f64 sums
            let xb: Vec<f64> = x[t * h..(t + 1) * h]
                .iter()
                .map(|&v| bf(v as f64) as f64)
                .collect();
            for (e, want) in dots(&xb, self.gate).into_iter().enumerate() {
                err[0].add(hr.logits[t * e_n + e] as f64, want);
            }
            let (y, dx) = self.token_paths(r, t, &mut err[3])?;
            for c in 0..h {
                err[1].add(self.f.y[r][t * h + c] as f64, y[c]);
                err[2].add(self.b.dx[r][t * h + c] as f64, dx[c]);
            }
        }
        Ok(err)
    }

    /// Y and dX of rank `r`'s token `t` through every routed path, the shared expert and the
    /// gate (routing backward on the device's logits and selection); adds the dlogits errors
    /// to `ed`.
    fn token_paths(&self, r: usize, t: usize, ed: &mut ErrStats) -> Result<(Vec<f64>, Vec<f64>)> {
        let c = self.layer.config();
        let (h, e_n, kk) = (c.hidden as usize, c.experts as usize, c.topk as usize);
        let hr = &self.hosts[r];
        let (xr, xs) = (hr.routed_row(t, h), &hr.xq[t * h..(t + 1) * h]);
        let dyb = self.dy_bf16(r, t);
        let dyq: Vec<f64> = fp8_row(&dyb).iter().map(|&v| v as f64).collect();
        let mut y = vec![0f64; h];
        let mut dx = vec![0f64; h];
        let mut dw = vec![0f32; kk];
        for (k, dwk) in dw.iter_mut().enumerate() {
            let e = hr.idx[t * kk + k] as usize;
            let wk = hr.w[t * kk + k] as f64;
            let yp = ref_path(xr, &dyq, wk, self.dequantised(e)?, &mut y, &mut dx);
            // dL/dw_tk = <dY_t, y_tk> (y_tk stored in BF16 on the device)
            *dwk = (0..h)
                .map(|c| dyb[c] as f64 * bf(yp[c]) as f64)
                .sum::<f64>() as f32;
        }
        if c.shared {
            ref_path(xs, &dyq, 1.0, self.dequantised(e_n)?, &mut y, &mut dx);
        }
        let dl = ep::grad::route_backward_ref(
            &hr.logits[t * e_n..(t + 1) * e_n],
            &hr.idx[t * kk..(t + 1) * kk],
            &hr.w[t * kk..(t + 1) * kk],
            &dw,
            &c.routing(),
        )?;
        let gate = &self.layer.weights().gate;
        for e in 0..e_n {
            ed.add(self.b.gate[r].dlogits[t * e_n + e] as f64, dl[e]);
            let d = bf(dl[e]) as f64;
            if d != 0.0 {
                for c in 0..h {
                    dx[c] += d * gate[e * h + c].to_f64();
                }
            }
        }
        Ok((y, dx))
    }

    /// dW_gate = sum over ranks of dlogits^T X: the GEMM stage checked in f64 on the device's
    /// BF16 dlogits (themselves checked on the sampled tokens) and BF16 X, all tokens.
    fn dw_gate_errors(&self, progress: &dyn Progress) -> Result<ErrStats> {
        let c = self.layer.config();
        let (h, e_n, t_n) = (c.hidden as usize, c.experts as usize, c.tokens as usize);
        let parts = per_rank(c.ranks(), "f64 reference (dW_gate)", progress, |r| {
            let dlt = &self.b.gate[r].dlogits_t;
            // X in BF16, converted once (the same values the sums below multiply by)
            let xb: Vec<f64> = self.data.x[r]
                .iter()
                .map(|&v| bf(v as f64) as f64)
                .collect();
            let mut part = vec![0f64; e_n * h];
            for e in 0..e_n {
                for t in 0..t_n {
                    let d = dlt[e * t_n + t].to_f64();
                    if d != 0.0 {
                        let pr = &mut part[e * h..(e + 1) * h];
                        for (p, &xv) in pr.iter_mut().zip(&xb[t * h..(t + 1) * h]) {
                            *p += d * xv;
                        }
                    }
                }
            }
            Ok(part)
        })?;
        let got = self.b.dw_gate_sum();
        let mut err = ErrStats::default();
        for (i, g) in got.iter().enumerate() {
            let want: f64 = parts.iter().map(|p| p[i]).sum();
            err.add(*g, want);
        }
        Ok(err)
    }

    /// Weight-gradient errors of the routed `experts` (all their rows; expert `e` lives on rank
    /// `e / E_local`), merged, and of rank `shared_rank`'s shared-expert partial (all tokens).
    fn dw_errors(
        &self,
        experts: &[usize],
        shared_rank: usize,
        progress: &dyn Progress,
    ) -> Result<(DwErr, DwErr)> {
        let mut jobs: Vec<Option<usize>> = experts.iter().map(|&e| Some(e)).collect();
        if self.layer.config().shared {
            jobs.push(None);
        }
        let errs = per_rank(
            jobs.len(),
            "f64 reference (sampled dW)",
            progress,
            |i| match jobs[i] {
                Some(e) => self.routed_dw_error(e),
                None => self.shared_dw_error(shared_rank),
            },
        )?;
        let routed = errs[..experts.len()]
            .iter()
            .fold(DwErr::default(), |a, e| (a.0.merge(e.0), a.1.merge(e.1)));
        Ok((routed, errs.get(experts.len()).copied().unwrap_or_default()))
    }

    fn routed_dw_error(&self, e: usize) -> Result<DwErr> {
        let c = self.layer.config();
        let (h, i_n, el) = (
            c.hidden as usize,
            c.intermediate as usize,
            c.local_experts(),
        );
        let (r, le) = (e / el, e % el);
        let o = &self.f.outs[r];
        let base = o.expert_base[le] as usize;
        let hr = &self.hosts[r];
        let rows: Vec<WRow> = (base..base + o.counts[le] as usize)
            .map(|row| {
                let src = hr.src[row];
                let (sr, t) = ((src >> 24) as usize, (src & 0xff_ffff) as usize);
                let xr = self.hosts[sr].routed_row(t, h);
                (xr, self.dy_bf16(sr, t), hr.row_w[row] as f64)
            })
            .collect();
        let (g1, g2) = &self.b.routed_dw[r];
        let (n1, n2) = (2 * i_n * h, h * i_n);
        let (Some(g1), Some(g2)) = (
            g1.get(le * n1..(le + 1) * n1),
            g2.get(le * n2..(le + 1) * n2),
        ) else {
            return Err(MoeError::Shape(format!("no weight gradient of expert {e}")));
        };
        Ok(dw_error(&rows, self.dequantised(e)?, (g1, g2), h))
    }

    fn shared_dw_error(&self, r: usize) -> Result<DwErr> {
        let c = self.layer.config();
        let (h, t_n) = (c.hidden as usize, c.tokens as usize);
        let rows: Vec<WRow> = (0..t_n)
            .map(|t| {
                (
                    &self.hosts[r].xq[t * h..(t + 1) * h],
                    self.dy_bf16(r, t),
                    1.0,
                )
            })
            .collect();
        let Some([(g1, g2)]) = self.b.shared_dw[r].as_deref() else {
            return Err(MoeError::Check(format!(
                "no shared-expert gradient of one chunk on rank {r} (wgrad_chunks must be 1)"
            )));
        };
        Ok(dw_error(
            &rows,
            self.dequantised(c.experts as usize)?,
            (g1, g2),
            h,
        ))
    }
}

/// Errors of a device (dW_gate|up, dW_down) against the reference over `rows`.
fn dw_error(rows: &[WRow], w: (&[f32], &[f32]), got: (&[f32], &[f32]), h: usize) -> DwErr {
    let i_n = w.1.len() / h;
    let (dw1, dw2) = ref_wgrad(rows, w, h, i_n);
    let (mut e1, mut e2) = (ErrStats::default(), ErrStats::default());
    for (gv, wv) in got.0.iter().zip(&dw1) {
        e1.add(*gv as f64, *wv);
    }
    for (gv, wv) in got.1.iter().zip(&dw2) {
        e2.add(*gv as f64, *wv);
    }
    (e1, e2)
}

/// Gate and up pre-activations of one token row through W_gate|up `[2I, H]`: f64 products,
/// stored in BF16 as the device stores the GEMM output.
fn gate_up(xr: &[f32], w1: &[f32], i_n: usize) -> (Vec<f64>, Vec<f64>) {
    let x: Vec<f64> = xr.iter().map(|&v| v as f64).collect();
    let mut gu: Vec<f64> = dots(&x, w1).into_iter().map(|v| bf(v) as f64).collect();
    let up = gu.split_off(i_n.min(gu.len()));
    (gu, up)
}

/// `x . w[r]` for every row `r` of `w` `[rows, x.len()]`, each a sum of f64 products in column
/// order from -0.0: bit for bit what `(0..n).map(|c| x[c] * w[r][c] as f64).sum::<f64>()`
/// gives. Eight rows at a time share each `x[c]` and keep eight independent add chains in
/// flight (the sums themselves stay sequential, so the result does not depend on this).
pub(crate) fn dots(x: &[f64], w: &[f32]) -> Vec<f64> {
    let n = x.len();
    if n == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(w.len() / n);
    let mut blocks = w.chunks_exact(8 * n);
    for blk in blocks.by_ref() {
        let rows: [&[f32]; 8] = std::array::from_fn(|i| &blk[i * n..(i + 1) * n]);
        let mut acc = [-0.0f64; 8];
        for (c, &xc) in x.iter().enumerate() {
            for (a, row) in acc.iter_mut().zip(&rows) {
                *a += xc * row[c] as f64;
            }
        }
        out.extend(acc);
    }
    for row in blocks.remainder().chunks_exact(n) {
        out.push(x.iter().zip(row).map(|(&a, &b)| a * b as f64).sum());
    }
    out
}

/// dH = dY W_down (`w2` `[H, I]`): f64 products, stored in BF16 as the device stores it.
fn down_t(dyq: &[f64], w2: &[f32], i_n: usize) -> Vec<f64> {
    let mut dh = vec![0f64; i_n];
    for (c, &d) in dyq.iter().enumerate() {
        let wr = &w2[c * i_n..(c + 1) * i_n];
        for j in 0..i_n {
            dh[j] += d * wr[j] as f64;
        }
    }
    dh.iter().map(|&v| bf(v) as f64).collect()
}

/// One token through one expert (weights `(w1, w2)`, routing weight `wk`): adds its output to
/// `y` and its input gradient to `dx` (FP8 roundings of the device path: SwiGLU output and
/// dG|dU 1x128; `dyq` is the token's dY after BF16 and 1x128 FP8); returns the path's
/// unweighted output.
pub(crate) fn ref_path(
    xr: &[f32],
    dyq: &[f64],
    wk: f64,
    (w1, w2): (&[f32], &[f32]),
    y: &mut [f64],
    dx: &mut [f64],
) -> Vec<f64> {
    let h = xr.len();
    let i_n = w2.len() / h;
    let (gt, up) = gate_up(xr, w1, i_n);
    let act: Vec<f32> = (0..i_n).map(|j| (silu(gt[j]) * up[j]) as f32).collect();
    let actq: Vec<f64> = fp8_row(&act).iter().map(|&v| v as f64).collect();
    let yp = dots(&actq, w2);
    for (yc, &acc) in y.iter_mut().zip(&yp) {
        *yc += wk * acc;
    }
    let dh = down_t(dyq, w2, i_n);
    let mut dgu = vec![0f32; 2 * i_n];
    for j in 0..i_n {
        dgu[j] = (dh[j] * up[j] * dsilu(gt[j])) as f32;
        dgu[i_n + j] = (dh[j] * silu(gt[j])) as f32;
    }
    let dguq = fp8_row(&dgu);
    for (j, &d) in dguq.iter().enumerate() {
        let wr = &w1[j * h..(j + 1) * h];
        for c in 0..h {
            dx[c] += wk * d as f64 * wr[c] as f64;
        }
    }
    yp
}

/// One row of an MLP's wgrad input: (x dequantised `[H]`, dY as BF16 values `[H]`, row weight).
pub(crate) type WRow<'a> = (&'a [f32], Vec<f32>, f64);

/// f64 weight gradients of one MLP (`(w1, w2)`: `[2I, H]`, `[H, I]`) over `rows` (one token
/// segment, in order): dW_down = dY^T (w act), dW_gu = (w dGU)^T X, with the device path's
/// operand roundings (BF16 storage, then 1x128 FP8 along the tokens). Returns (dW_gu
/// `[2I, H]`, dW_down `[H, I]`).
pub(crate) fn ref_wgrad(
    rows: &[WRow],
    (w1, w2): (&[f32], &[f32]),
    h: usize,
    i_n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let n = rows.len().div_ceil(128) * 128;
    let (mut a2, mut b2) = (vec![0f32; n * h], vec![0f32; n * i_n]);
    let (mut a1, mut b1) = (vec![0f32; n * 2 * i_n], vec![0f32; n * h]);
    for (r, (xr, dyb, wk)) in rows.iter().enumerate() {
        let dyq: Vec<f64> = fp8_row(dyb).iter().map(|&v| v as f64).collect();
        let (gt, up) = gate_up(xr, w1, i_n);
        let dh = down_t(&dyq, w2, i_n);
        a2[r * h..(r + 1) * h].copy_from_slice(dyb);
        b1[r * h..(r + 1) * h].copy_from_slice(xr);
        for j in 0..i_n {
            b2[r * i_n + j] = bf(wk * silu(gt[j]) * up[j]);
            a1[r * 2 * i_n + j] = bf(wk * dh[j] * up[j] * dsilu(gt[j]));
            a1[r * 2 * i_n + i_n + j] = bf(wk * dh[j] * silu(gt[j]));
        }
    }
    // dY, act, dG|dU: the Pow2 transposing quantiser; X: the 1x128 -> 128x1 re-tiling of the
    // cached FP8 input (Float scales)
    fp8_cols(&mut a2, n, h, ScaleMode::Pow2);
    fp8_cols(&mut b2, n, i_n, ScaleMode::Pow2);
    fp8_cols(&mut a1, n, 2 * i_n, ScaleMode::Pow2);
    fp8_cols(&mut b1, n, h, ScaleMode::Float);
    let (mut dw1, mut dw2) = (vec![0f64; 2 * i_n * h], vec![0f64; h * i_n]);
    for r in 0..rows.len() {
        outer_add(
            &mut dw2,
            &a2[r * h..(r + 1) * h],
            &b2[r * i_n..(r + 1) * i_n],
        );
        outer_add(
            &mut dw1,
            &a1[r * 2 * i_n..(r + 1) * 2 * i_n],
            &b1[r * h..(r + 1) * h],
        );
    }
    (dw1, dw2)
}

/// `d [a.len(), b.len()] += a b^T` in f64.
fn outer_add(d: &mut [f64], a: &[f32], b: &[f32]) {
    for (i, &av) in a.iter().enumerate() {
        let av = av as f64;
        if av != 0.0 {
            for (dv, &bv) in d[i * b.len()..(i + 1) * b.len()].iter_mut().zip(b) {
                *dv += av * bv as f64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::dots;
    use rand::{Rng, SeedableRng};

    /// `dots` is bit for bit the sequential `Iterator::sum` it replaces, for row counts that
    /// are and are not multiples of its block of 8, on random values of mixed sign and size.
    #[test]
    fn dots_equal_the_sequential_sums_bit_for_bit() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for (rows, n) in [(1, 1), (7, 3), (8, 128), (13, 257), (64, 100)] {
            let x: Vec<f64> = (0..n)
                .map(|_| rng.gen_range(-1.0..1.0) * 2f64.powi(rng.gen_range(-20..20)))
                .collect();
            let w: Vec<f32> = (0..rows * n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            let got = dots(&x, &w);
            assert_eq!(got.len(), rows);
            for (r, g) in got.iter().enumerate() {
                let want: f64 = (0..n).map(|c| x[c] * w[r * n + c] as f64).sum();
                assert_eq!(g.to_bits(), want.to_bits(), "row {r} of {rows}x{n}");
            }
        }
        // all products -0.0 or 0.0: the sum's sign follows `Iterator::sum`'s -0.0 start
        let x = vec![-0.0f64, 0.0];
        let w: Vec<f32> = (0..18).map(|i| [1.0, -1.0, 0.0, -0.0][i % 4]).collect();
        let want: Vec<u64> = w
            .chunks(2)
            .map(|r| {
                x.iter()
                    .zip(r)
                    .map(|(&a, &b)| a * b as f64)
                    .sum::<f64>()
                    .to_bits()
            })
            .collect();
        let got: Vec<u64> = dots(&x, &w).iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want);
    }
}
