//! Group-limited sigmoid routing with aux-loss-free balancing bias (DeepSeek-V3 gating).
//!
//! Per token: `s_e = sigmoid(logit_e)`; selection uses `b_e = s_e + bias_e`. Experts are split into
//! `groups` contiguous groups; a group's score is the sum of its two largest `b_e`; the best
//! `topk_groups` groups are kept; then the `topk` largest `b_e` inside kept groups are chosen.
//! Weights are the *unbiased* `s_e` of the chosen experts, normalised to sum 1, times
//! `scaling`. **Ties: the lowest index wins** (strict `>` while scanning in ascending order), for
//! groups and experts alike, in the kernel and in [`route_ref`].
//!
//! The kernel runs one thread per token and uses a `[T, E]` f32 scratch (biased scores, taken
//! experts overwritten with -inf) and a `[T, G]` scratch of group scores. Arithmetic is spelled
//! out (`mul.rn/add.rn/div.rn`, `ex2.approx` without ftz) so that the CPU reference computes the
//! same f32 values and the selected indices match exactly.

use crate::kutil::{self, sigmoid, sigmoid_ref};
use crate::{cfg_err, EpError, Result};
use builder::{FMods, GlobalPtr, KernelBuilder, Target};
use runtime::{Buffer, Device, LaunchConfig, Stream};
use serde::Serialize;

/// Routing shape.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RoutingCfg {
    pub experts: u32,
    pub groups: u32,
    pub topk_groups: u32,
    pub topk: u32,
    /// Routed scaling factor applied after normalisation (V3: 2.5).
    pub scaling: f32,
}

impl RoutingCfg {
    pub fn validate(&self) -> Result<()> {
        let c = self;
        if c.experts == 0 || c.groups == 0 || c.experts % c.groups != 0 {
            return cfg_err(format!(
                "{} experts do not split into {} groups",
                c.experts, c.groups
            ));
        }
        if c.groups > 32 {
            return cfg_err("at most 32 expert groups");
        }
        if c.experts / c.groups < 2 {
            return cfg_err("group scores need at least 2 experts per group");
        }
        if c.topk_groups == 0 || c.topk_groups > c.groups {
            return cfg_err(format!(
                "topk_groups {} not in 1..={}",
                c.topk_groups, c.groups
            ));
        }
        if c.topk == 0 || c.topk > c.topk_groups * (c.experts / c.groups) {
            return cfg_err(format!(
                "top-{} does not fit in {} groups of {} experts",
                c.topk,
                c.topk_groups,
                c.experts / c.groups
            ));
        }
        if !c.scaling.is_finite() {
            return cfg_err("scaling must be finite");
        }
        Ok(())
    }
    pub(crate) fn key(&self) -> String {
        format!(
            "{}-{}-{}-{}-{:08x}",
            self.experts,
            self.groups,
            self.topk_groups,
            self.topk,
            self.scaling.to_bits()
        )
    }
}

/// Routing result on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct RoutingOut {
    /// `[T, topk]` expert indices.
    pub idx: Vec<i32>,
    /// `[T, topk]` weights.
    pub weights: Vec<f32>,
}

/// The routing kernel `ep_route(logits, bias, scratch, gscratch, topk_idx, topk_w, T)`.
pub fn route_kernel(t: &Target, c: &RoutingCfg) -> Result<ptx::Module> {
    c.validate()?;
    let (e_n, g_n, eg) = (c.experts, c.groups, c.experts / c.groups);
    let mut k = KernelBuilder::new("ep_route", t.clone());
    let logits = k.param::<GlobalPtr<f32>>("logits");
    let bias = k.param::<GlobalPtr<f32>>("bias");
    let scratch = k.param::<GlobalPtr<f32>>("scratch");
    let gscr = k.param::<GlobalPtr<f32>>("gscratch");
    let out_idx = k.param::<GlobalPtr<i32>>("topk_idx");
    let out_w = k.param::<GlobalPtr<f32>>("topk_w");
    let ntok = k.param::<u32>("num_tokens");
    let tok = k.global_index_x();
    let inb = k.lt(tok, ntok);
    let ninf = f32::NEG_INFINITY;
    k.if_(inb, |k| {
        let row = k.mul(tok, e_n);
        let grow = k.mul(tok, g_n);
        let krow = k.mul(tok, c.topk);
        // biased scores
        k.for_range(0u32, e_n, 1u32, |k, e| {
            let i = k.add(row, e);
            let x = k.ld(logits.offset(i));
            let s = sigmoid(k, x);
            let b = k.ld(bias.offset(e));
            let v = k.add_m(FMods::rn(), s, b);
            k.st(scratch.offset(i), v);
        });
        // group scores: sum of the top-2 biased scores
        k.for_range(0u32, g_n, 1u32, |k, g| {
            let m1 = k.mov(ninf);
            let m2 = k.mov(ninf);
            let gbase = k.mad_lo(g, eg, row);
            k.for_range(0u32, eg, 1u32, |k, j| {
                let i = k.add(gbase, j);
                let v = k.ld(scratch.offset(i));
                let p1 = k.gt(v, m1);
                let p2 = k.gt(v, m2);
                let n2a = k.selp(v, m2, p2);
                let n2 = k.selp(m1, n2a, p1);
                let n1 = k.selp(v, m1, p1);
                k.mov_to(m2, n2);
                k.mov_to(m1, n1);
            });
            let gs = k.add_m(FMods::rn(), m1, m2);
            let gi = k.add(grow, g);
            k.st(gscr.offset(gi), gs);
        });
        // keep the best topk_groups groups (lowest index wins ties)
        let mask = k.mov(0u32);
        k.for_range(0u32, c.topk_groups, 1u32, |k, _r| {
            let best = k.mov(ninf);
            let bi = k.mov(0u32);
            k.for_range(0u32, g_n, 1u32, |k, g| {
                let gi = k.add(grow, g);
                let v = k.ld(gscr.offset(gi));
                let p = k.gt(v, best);
                let nb = k.selp(v, best, p);
                let ni = k.selp(g, bi, p);
                k.mov_to(best, nb);
                k.mov_to(bi, ni);
            });
            let gi = k.add(grow, bi);
            let ni = k.mov(ninf);
            k.st(gscr.offset(gi), ni);
            let bit = k.shl(1u32, bi);
            let nm = k.or(mask, bit);
            k.mov_to(mask, nm);
        });
        // top-k experts inside the kept groups
        let sum = k.mov(0.0f32);
        k.for_range(0u32, c.topk, 1u32, |k, kk| {
            let best = k.mov(ninf);
            let bi = k.mov(0u32);
            k.for_range(0u32, e_n, 1u32, |k, e| {
                let i = k.add(row, e);
                let v = k.ld(scratch.offset(i));
                let g = k.div(e, eg);
                let sh = k.shr(mask, g);
                let bit = k.and(sh, 1u32);
                let allowed = k.ne(bit, 0u32);
                let ve = k.selp(v, ninf, allowed);
                let p = k.gt(ve, best);
                let nb = k.selp(ve, best, p);
                let ni = k.selp(e, bi, p);
                k.mov_to(best, nb);
                k.mov_to(bi, ni);
            });
            let i = k.add(row, bi);
            let ni = k.mov(ninf);
            k.st(scratch.offset(i), ni);
            let x = k.ld(logits.offset(i));
            let s = sigmoid(k, x);
            let oi = k.add(krow, kk);
            let bis = k.bitcast::<i32, u32>(bi);
            k.st(out_idx.offset(oi), bis);
            k.st(out_w.offset(oi), s);
            let ns = k.add_m(FMods::rn(), sum, s);
            k.mov_to(sum, ns);
        });
        k.for_range(0u32, c.topk, 1u32, |k, kk| {
            let oi = k.add(krow, kk);
            let s = k.ld(out_w.offset(oi));
            let w = k.div(s, sum);
            let w2 = k.mul_m(FMods::rn(), w, c.scaling);
            k.st(out_w.offset(oi), w2);
        });
    });
    Ok(k.finish()?)
}

/// CPU reference with the same arithmetic and tie rule as [`route_kernel`].
pub fn route_ref(logits: &[f32], bias: &[f32], c: &RoutingCfg) -> Result<RoutingOut> {
    c.validate()?;
    let (e_n, g_n, eg, kk) = (
        c.experts as usize,
        c.groups as usize,
        (c.experts / c.groups) as usize,
        c.topk as usize,
    );
    if logits.len() % e_n != 0 || bias.len() != e_n {
        return Err(EpError::Shape(format!(
            "logits {} / bias {} for {} experts",
            logits.len(),
            bias.len(),
            e_n
        )));
    }
    let t_n = logits.len() / e_n;
    let mut idx = Vec::with_capacity(t_n * kk);
    let mut weights = Vec::with_capacity(t_n * kk);
    for t in 0..t_n {
        let lg = &logits[t * e_n..(t + 1) * e_n];
        let mut b: Vec<f32> = (0..e_n).map(|e| sigmoid_ref(lg[e]) + bias[e]).collect();
        let mut gs: Vec<f32> = (0..g_n)
            .map(|g| {
                let (mut m1, mut m2) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
                for &v in &b[g * eg..(g + 1) * eg] {
                    if v > m1 {
                        m2 = m1;
                        m1 = v;
                    } else if v > m2 {
                        m2 = v;
                    }
                }
                m1 + m2
            })
            .collect();
        let mut mask = 0u32;
        for _ in 0..c.topk_groups {
            let (mut best, mut bi) = (f32::NEG_INFINITY, 0usize);
            for (g, &v) in gs.iter().enumerate() {
                if v > best {
                    best = v;
                    bi = g;
                }
            }
            gs[bi] = f32::NEG_INFINITY;
            mask |= 1 << bi;
        }
        let mut sum = 0f32;
        let mut ws = Vec::with_capacity(kk);
        for _ in 0..kk {
            let (mut best, mut bi) = (f32::NEG_INFINITY, 0usize);
            for (e, &v) in b.iter().enumerate() {
                let v = if mask >> (e / eg) & 1 != 0 {
                    v
                } else {
                    f32::NEG_INFINITY
                };
                if v > best {
                    best = v;
                    bi = e;
                }
            }
            b[bi] = f32::NEG_INFINITY;
            let s = sigmoid_ref(lg[bi]);
            idx.push(bi as i32);
            ws.push(s);
            sum += s;
        }
        weights.extend(ws.iter().map(|&s| (s / sum) * c.scaling));
    }
    Ok(RoutingOut { idx, weights })
}

/// Device buffers of a routing result.
pub struct RoutingBufs {
    pub idx: Buffer<i32>,
    pub weights: Buffer<f32>,
}

/// Runs the routing kernel on `stream` for `logits` `[T, E]` already on the device.
pub fn route(
    stream: &Stream,
    logits: &Buffer<f32>,
    bias: &Buffer<f32>,
    c: &RoutingCfg,
) -> Result<RoutingBufs> {
    c.validate()?;
    let dev: &Device = stream.device();
    if logits.len() % c.experts as usize != 0 || bias.len() != c.experts as usize {
        return Err(EpError::Shape(format!(
            "logits {} / bias {} for {} experts",
            logits.len(),
            bias.len(),
            c.experts
        )));
    }
    let t_n = logits.len() / c.experts as usize;
    let f = kutil::function(dev, "ep_route", &c.key(), |t| route_kernel(t, c))?;
    let scratch = dev.alloc::<f32>(logits.len().max(1))?;
    let gscr = dev.alloc::<f32>((t_n * c.groups as usize).max(1))?;
    let idx = dev.alloc::<i32>((t_n * c.topk as usize).max(1))?;
    let weights = dev.alloc::<f32>((t_n * c.topk as usize).max(1))?;
    if t_n > 0 {
        let block = 128u32;
        let grid = (t_n as u32).div_ceil(block);
        stream.launch(
            &f,
            &LaunchConfig::linear(grid, block),
            &runtime::args![logits, bias, &scratch, &gscr, &idx, &weights, t_n as u32],
        )?;
        stream.synchronize()?;
    }
    Ok(RoutingBufs { idx, weights })
}
