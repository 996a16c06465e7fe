//! RMSNorm over rows of width H: `y = x * rstd * w`, `rstd = 1 / sqrt(mean(x^2) + eps)`.
//! BF16 x / y / dy / dx, FP32 weight, FP32 math.
//!
//! - `rmsnorm_fwd_bf16`: one warp per row (4 rows per 128-thread CTA); lane l owns the 8-column
//!   chunks l*8 + 256j (16-byte loads). Pass 1 sums x^2 (butterfly), pass 2 re-reads the row
//!   (L1/L2-resident) and writes y. Also writes rstd [rows] f32 for the backward pass.
//! - `rmsnorm_fwd_fp8[_pow2]`: the same, quantising y (the f32 values, never rounded to bf16)
//!   into e4m3 1x128 tiles with the scales of `quantize_fp8_1x128` (Float or Pow2): in each
//!   256-column step lanes 0-15 own one 128-column group and lanes 16-31 the next; the group amax
//!   is a 16-lane butterfly. H must be a multiple of 128.
//! - backward, three launches: `rmsnorm_bwd_dx` (warp per row: dot = sum w dy x, then
//!   dx = rstd w dy - x rstd^3 dot / H); `rmsnorm_bwd_dw_partial` (grid (H/256, rows/32), thread
//!   owns 2 columns and sums dy x rstd over its CTA's 32 rows in row order into a workspace
//!   [ceil(rows/32), H]); `rmsnorm_dw_reduce` (thread per column sums the partials in block order).
//!   The weight gradient is therefore bitwise deterministic; it is written, or with
//!   `accumulate` added to the existing dweight after the partials are summed (gradient
//!   accumulation over micro-batches).
//!
//! Limits: H a positive multiple of 8 (128 for FP8), rows * H < 2^32, backward rows <= 65535 * 32.

use super::*;
use crate::host::{check_target, fp8_ptx, function};
use crate::quant::{quant8, QUANT_TARGETS};
use crate::reference as r;
use crate::tile::*;
use crate::ScaleMode;
use rand::Rng;
use runtime::{args, LaunchConfig};
use std::time::Instant;

/// Rows per CTA of the partial weight-gradient kernel.
pub const DW_ROWS: usize = 32;

/// What the forward kernel writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormOut {
    /// y [rows, H] bf16.
    Bf16,
    /// y quantised to e4m3 [rows, H] + 1x128 f32 scales [rows, H/128] (Float or Pow2).
    Fp8(ScaleMode),
}

/// Kernel name of the forward variant.
pub fn fwd_name(out: NormOut) -> &'static str {
    match out {
        NormOut::Bf16 => "rmsnorm_fwd_bf16",
        NormOut::Fp8(ScaleMode::Pow2) => "rmsnorm_fwd_fp8_pow2",
        NormOut::Fp8(_) => "rmsnorm_fwd_fp8",
    }
}
pub const BWD_DX_NAME: &str = "rmsnorm_bwd_dx";
pub const BWD_DW_PARTIAL_NAME: &str = "rmsnorm_bwd_dw_partial";
pub const DW_REDUCE_NAME: &str = "rmsnorm_dw_reduce";

/// One RMSNorm problem.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNormSpec {
    pub rows: usize,
    pub hidden: usize,
    pub eps: f32,
}

impl RmsNormSpec {
    fn validate(&self, kernel: &str, multiple: usize) -> Result<()> {
        if self.hidden == 0 || self.hidden % multiple != 0 {
            return shape_err(
                kernel,
                format!(
                    "hidden = {} must be a positive multiple of {multiple}",
                    self.hidden
                ),
            );
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return shape_err(
                kernel,
                format!("eps = {} must be finite and >= 0", self.eps),
            );
        }
        fits_u32(kernel, self.rows.saturating_mul(self.hidden))
    }
    /// f32 elements of the weight-gradient workspace: [ceil(rows/32), hidden].
    pub fn dw_workspace_len(&self) -> usize {
        self.rows.div_ceil(DW_ROWS) * self.hidden
    }
}

/// Row index of this warp and the predicate `row < rows` (warp-uniform).
fn warp_row(k: &mut KernelBuilder, rows: Reg<u32>) -> (Reg<u32>, Reg<u32>, Reg<Pred>) {
    let tid = k.tid_x();
    let warp = k.shr(tid, 5u32);
    let lane = k.and(tid, 31u32);
    let cta = k.ctaid_x();
    let row = k.mad_lo(cta, 4u32, warp);
    let valid = k.lt(row, rows);
    (row, lane, valid)
}

/// Forward: params (x, w, y | q s, rstd, rows, h, eps); grid ceil(rows/4) x 128.
pub fn gen_rmsnorm_fwd(t: &Target, out: NormOut) -> Result<ptx::Module> {
    let name = fwd_name(out);
    let fp8 = matches!(out, NormOut::Fp8(_));
    check_target(name, t, if fp8 { QUANT_TARGETS } else { TRAIN_TARGETS })?;
    let mut k = KernelBuilder::new(name, fp8_ptx(t));
    k.reqntid(&[128]);
    let x = k.param_ptr_aligned::<B32>("x", 16);
    let w = k.param_ptr_aligned::<f32>("w", 16);
    let (y, s) = if fp8 {
        let q = k.param_ptr_aligned::<B32>("q", 8);
        (q, Some(k.param_ptr_aligned::<f32>("s", 4)))
    } else {
        (k.param_ptr_aligned::<B32>("y", 16), None)
    };
    let rstd = k.param_ptr_aligned::<f32>("rstd", 4);
    let rows = k.param::<u32>("rows");
    let h = k.param::<u32>("h");
    let eps = k.param::<f32>("eps");
    let (row, lane, valid) = warp_row(&mut k, rows);
    k.if_(valid, |k| {
        let rbase = k.mul(row, h);
        let c0 = k.shl(lane, 3u32);
        let ss = k.mov(0f32);
        k.for_range(c0, h, 256u32, |k, c| {
            let i = k.add(rbase, c);
            for v in load8_any(k, x, i, true) {
                k.fma_to(ss, v, v, ss);
            }
        });
        let ss = warp_sum(k, ss);
        let hf: Reg<f32> = k.cvt(h);
        let ms = k.div(ss, hf);
        let ms = k.add(ms, eps);
        let sq = k.sqrt(ms);
        let rs = k.rcp(sq);
        let l0 = k.eq(lane, 0u32);
        k.when(l0, |k| k.st(rstd.offset(row), rs));
        let norm = |k: &mut KernelBuilder, i: Reg<u32>, c: Reg<u32>| -> [Reg<f32>; 8] {
            let xv = load8_any(k, x, i, true);
            let wv = load8_f32(k, w, c);
            std::array::from_fn(|e| {
                let a = k.mul(xv[e], rs);
                k.mul(a, wv[e])
            })
        };
        match (out, s) {
            (NormOut::Fp8(mode), Some(s)) => {
                k.for_range(0u32, h, 256u32, |k, base| {
                    let c = k.add(base, c0);
                    let gvalid = k.lt(c, h);
                    let hm8 = k.sub(h, 8u32);
                    let cc = k.min(c, hm8);
                    let i = k.add(rbase, cc);
                    let yv = norm(k, i, cc);
                    let gi = k.add(rbase, c);
                    quant_group(k, &yv, mode, gvalid, (y, s), gi);
                });
            }
            _ => k.for_range(c0, h, 256u32, |k, c| {
                let i = k.add(rbase, c);
                let yv = norm(k, i, c);
                store8(k, y, i, &yv, true);
            }),
        }
    });
    Ok(k.finish()?)
}

/// Quantises this lane's 8 values of a 16-lane 128-value group at element index `i` (stores
/// predicated on `valid`, the half-warp-uniform group predicate).
fn quant_group(
    k: &mut KernelBuilder,
    v: &[Reg<f32>; 8],
    mode: ScaleMode,
    valid: Reg<Pred>,
    (q, s): (GlobalPtr<B32>, GlobalPtr<f32>),
    i: Reg<u32>,
) {
    let amax = k.mov(0f32);
    amax_into(k, amax, v);
    let amax = warp_max(k, amax, 16);
    let (sc, inv) = fp8_scale(k, amax, mode);
    let words = quant8(k, v, inv);
    let qi = k.shr(i, 2u32);
    k.when(valid, |k| k.st_v(q.offset(qi), words));
    let lane = k.lane_id();
    let sub = k.and(lane, 15u32);
    let first = k.eq(sub, 0u32);
    let st = k.and(first, valid);
    let si = k.shr(i, 7u32);
    k.when(st, |k| k.st(s.offset(si), sc));
}

/// Backward dx: params (x, w, dy, rstd, dx, rows, h); grid ceil(rows/4) x 128.
pub fn gen_rmsnorm_bwd_dx(t: &Target) -> Result<ptx::Module> {
    let name = BWD_DX_NAME;
    check_target(name, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(name, t.clone());
    k.reqntid(&[128]);
    let x = k.param_ptr_aligned::<B32>("x", 16);
    let w = k.param_ptr_aligned::<f32>("w", 16);
    let dy = k.param_ptr_aligned::<B32>("dy", 16);
    let rstd = k.param_ptr_aligned::<f32>("rstd", 4);
    let dx = k.param_ptr_aligned::<B32>("dx", 16);
    let rows = k.param::<u32>("rows");
    let h = k.param::<u32>("h");
    let (row, lane, valid) = warp_row(&mut k, rows);
    k.if_(valid, |k| {
        let rbase = k.mul(row, h);
        let c0 = k.shl(lane, 3u32);
        let rs = k.ld_nc(rstd.offset(row));
        let dot = k.mov(0f32);
        let gy = |k: &mut KernelBuilder, i: Reg<u32>, c: Reg<u32>| -> [Reg<f32>; 8] {
            let d = load8_any(k, dy, i, true);
            let wv = load8_f32(k, w, c);
            std::array::from_fn(|e| k.mul(wv[e], d[e]))
        };
        k.for_range(c0, h, 256u32, |k, c| {
            let i = k.add(rbase, c);
            let g = gy(k, i, c);
            let xv = load8_any(k, x, i, true);
            for e in 0..8 {
                k.fma_to(dot, g[e], xv[e], dot);
            }
        });
        let dot = warp_sum(k, dot);
        let r2 = k.mul(rs, rs);
        let r3 = k.mul(r2, rs);
        let cd = k.mul(r3, dot);
        let hf: Reg<f32> = k.cvt(h);
        let coef = k.div(cd, hf);
        let ncoef = k.neg(coef);
        k.for_range(c0, h, 256u32, |k, c| {
            let i = k.add(rbase, c);
            let g = gy(k, i, c);
            let xv = load8_any(k, x, i, true);
            let v: [Reg<f32>; 8] = std::array::from_fn(|e| {
                let a = k.mul(rs, g[e]);
                k.fma(ncoef, xv[e], a)
            });
            store8(k, dx, i, &v, true);
        });
    });
    Ok(k.finish()?)
}

/// Partial weight gradient: params (x, dy, rstd, part, rows, h); grid (ceil(h/256),
/// ceil(rows/32)) x 128; part[by][c] = sum over rows 32by.. of dy x rstd (row order).
pub fn gen_rmsnorm_bwd_dw_partial(t: &Target) -> Result<ptx::Module> {
    let name = BWD_DW_PARTIAL_NAME;
    check_target(name, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(name, t.clone());
    k.reqntid(&[128]);
    let x = k.param_ptr_aligned::<B32>("x", 16);
    let dy = k.param_ptr_aligned::<B32>("dy", 16);
    let rstd = k.param_ptr_aligned::<f32>("rstd", 4);
    let part = k.param_ptr_aligned::<f32>("part", 8);
    let rows = k.param::<u32>("rows");
    let h = k.param::<u32>("h");
    let tid = k.tid_x();
    let (bx, by) = (k.ctaid_x(), k.ctaid_y());
    let c = k.shl(bx, 8u32);
    let col = k.mad_lo(tid, 2u32, c);
    let valid = k.lt(col, h);
    k.if_(valid, |k| {
        let r0 = k.mul(by, DW_ROWS as u32);
        let r1 = k.add(r0, DW_ROWS as u32);
        let r1 = k.min(r1, rows);
        let (a0, a1) = (k.mov(0f32), k.mov(0f32));
        let hw = k.shr(h, 1u32);
        let cw = k.shr(col, 1u32);
        k.for_range(r0, r1, 1u32, |k, r| {
            let wi = k.mad_lo(r, hw, cw);
            let xw = k.ld_nc(x.offset(wi));
            let dw = k.ld_nc(dy.offset(wi));
            let rs = k.ld_nc(rstd.offset(r));
            let [x0, x1] = bf16x2_to_f32(k, xw);
            let [d0, d1] = bf16x2_to_f32(k, dw);
            let p0 = k.mul(d0, x0);
            let p1 = k.mul(d1, x1);
            k.fma_to(a0, p0, rs, a0);
            k.fma_to(a1, p1, rs, a1);
        });
        let pi = k.mad_lo(by, h, col);
        k.st_v(part.offset(pi), [a0, a1]);
    });
    Ok(k.finish()?)
}

/// Fixed-order column sum: params (part, dw, nparts, h, accumulate); grid ceil(h/256) x 256;
/// dw[c] = sum_p part[p][c] in p order (+ the old dw[c] when `accumulate` != 0).
pub fn gen_dw_reduce(t: &Target) -> Result<ptx::Module> {
    let name = DW_REDUCE_NAME;
    check_target(name, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(name, t.clone());
    k.reqntid(&[256]);
    let part = k.param_ptr_aligned::<f32>("part", 4);
    let dw = k.param_ptr_aligned::<f32>("dw", 4);
    let nparts = k.param::<u32>("nparts");
    let h = k.param::<u32>("h");
    let accumulate = k.param::<u32>("accumulate");
    let col = k.global_index_x();
    let valid = k.lt(col, h);
    k.if_(valid, |k| {
        let acc = k.mov(0f32);
        k.for_range(0u32, nparts, 1u32, |k, p| {
            let i = k.mad_lo(p, h, col);
            let v = k.ld_nc(part.offset(i));
            k.add_to(acc, acc, v);
        });
        let add = k.ne(accumulate, 0u32);
        k.if_(add, |k| {
            let old = k.ld(dw.offset(col));
            k.add_to(acc, acc, old);
        });
        k.st(dw.offset(col), acc);
    });
    Ok(k.finish()?)
}

// ---------------------------------------------------------------------------------------------
// host wrappers

/// FP8 output buffers of [`rmsnorm_fwd_fp8`]: q [rows, H] e4m3, s [rows, H/128] f32.
pub struct Fp8Out<'a> {
    pub q: &'a mut Buffer<u8>,
    pub s: &'a mut Buffer<f32>,
    /// [`ScaleMode::Float`] or [`ScaleMode::Pow2`].
    pub mode: ScaleMode,
}

fn launch_fwd(
    stream: &Stream,
    spec: &RmsNormSpec,
    out: NormOut,
    x: &Buffer<bf16>,
    w: &Buffer<f32>,
    outs: Vec<runtime::Arg>,
    rstd: &mut Buffer<f32>,
) -> Result<()> {
    let name = fwd_name(out);
    need(name, "x", x, spec.rows * spec.hidden)?;
    need(name, "weight", w, spec.hidden)?;
    need(name, "rstd", rstd, spec.rows)?;
    if spec.rows == 0 {
        return Ok(());
    }
    let f = function(stream.device(), name, "", |t| gen_rmsnorm_fwd(t, out))?;
    let mut a = args![x, w];
    a.extend(outs);
    a.extend(args![
        &*rstd,
        spec.rows as u32,
        spec.hidden as u32,
        spec.eps
    ]);
    let cfg = LaunchConfig::linear(spec.rows.div_ceil(4) as u32, 128);
    stream.launch(&f, &cfg, &a)?;
    Ok(())
}

/// RMSNorm forward: x [rows, H] bf16, weight [H] f32 -> y [rows, H] bf16 and rstd [rows] f32.
pub fn rmsnorm_fwd(
    stream: &Stream,
    spec: &RmsNormSpec,
    x: &Buffer<bf16>,
    weight: &Buffer<f32>,
    y: &mut Buffer<bf16>,
    rstd: &mut Buffer<f32>,
) -> Result<()> {
    let name = fwd_name(NormOut::Bf16);
    spec.validate(name, 8)?;
    need(name, "y", y, spec.rows * spec.hidden)?;
    launch_fwd(stream, spec, NormOut::Bf16, x, weight, args![&*y], rstd)
}

/// RMSNorm forward fused with FP8 1x128 quantisation of y (H a multiple of 128): the bytes and
/// scales `quantize_fp8_1x128` would give for the f32 y, plus rstd [rows] f32.
pub fn rmsnorm_fwd_fp8(
    stream: &Stream,
    spec: &RmsNormSpec,
    x: &Buffer<bf16>,
    weight: &Buffer<f32>,
    out: Fp8Out<'_>,
    rstd: &mut Buffer<f32>,
) -> Result<()> {
    let kind = NormOut::Fp8(out.mode);
    let name = fwd_name(kind);
    if out.mode == ScaleMode::Ue8m0 {
        return shape_err(name, "UE8M0 scales are not produced by the fused norm");
    }
    spec.validate(name, 128)?;
    need(name, "q", out.q, spec.rows * spec.hidden)?;
    need(name, "s", out.s, spec.rows * spec.hidden / 128)?;
    launch_fwd(stream, spec, kind, x, weight, args![&*out.q, &*out.s], rstd)
}

/// Buffers of [`rmsnorm_bwd`].
pub struct RmsNormBwd<'a> {
    pub x: &'a Buffer<bf16>,
    pub weight: &'a Buffer<f32>,
    pub dy: &'a Buffer<bf16>,
    /// rstd [rows] from the forward pass.
    pub rstd: &'a Buffer<f32>,
    pub dx: &'a mut Buffer<bf16>,
    /// dweight [H] f32: overwritten, or added to when `accumulate`.
    pub dweight: &'a mut Buffer<f32>,
    pub accumulate: bool,
    /// f32 scratch of [`RmsNormSpec::dw_workspace_len`] elements.
    pub workspace: &'a mut Buffer<f32>,
}

/// RMSNorm backward: dx [rows, H] bf16 and the deterministic dweight [H] f32 (three launches).
pub fn rmsnorm_bwd(stream: &Stream, spec: &RmsNormSpec, b: RmsNormBwd<'_>) -> Result<()> {
    let name = BWD_DX_NAME;
    spec.validate(name, 8)?;
    let (rows, h) = (spec.rows, spec.hidden);
    need(name, "x", b.x, rows * h)?;
    need(name, "weight", b.weight, h)?;
    need(name, "dy", b.dy, rows * h)?;
    need(name, "rstd", b.rstd, rows)?;
    need(name, "dx", b.dx, rows * h)?;
    need(name, "dweight", b.dweight, h)?;
    need(name, "workspace", b.workspace, spec.dw_workspace_len())?;
    if rows.div_ceil(DW_ROWS) > 65535 {
        return shape_err(
            name,
            format!(
                "rows = {rows}: at most {} (grid.y of the dweight partials)",
                65535 * DW_ROWS
            ),
        );
    }
    if rows == 0 {
        if !b.accumulate {
            b.dweight.fill(0.0)?;
        }
        return Ok(());
    }
    let dev = stream.device();
    let f = function(dev, name, "", gen_rmsnorm_bwd_dx)?;
    let cfg = LaunchConfig::linear(rows.div_ceil(4) as u32, 128);
    let a = args![b.x, b.weight, b.dy, b.rstd, &*b.dx, rows as u32, h as u32];
    stream.launch(&f, &cfg, &a)?;
    let nparts = rows.div_ceil(DW_ROWS);
    let f = function(dev, BWD_DW_PARTIAL_NAME, "", gen_rmsnorm_bwd_dw_partial)?;
    let cfg = LaunchConfig::grid3([h.div_ceil(256) as u32, nparts as u32, 1], [128, 1, 1]);
    let a = args![b.x, b.dy, b.rstd, &*b.workspace, rows as u32, h as u32];
    stream.launch(&f, &cfg, &a)?;
    let f = function(dev, DW_REDUCE_NAME, "", gen_dw_reduce)?;
    let cfg = LaunchConfig::linear(h.div_ceil(256) as u32, 256);
    let a = args![
        &*b.workspace,
        &*b.dweight,
        nparts as u32,
        h as u32,
        u32::from(b.accumulate)
    ];
    stream.launch(&f, &cfg, &a)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// f64 references and checks

/// Random inputs of a norm check: x bf16 (per-row magnitudes, outliers), weight f32 in
/// +-[0.5, 1.5), dy bf16.
fn inputs(rows: usize, h: usize, seed: u64) -> (Vec<bf16>, Vec<f32>, Vec<bf16>) {
    let mut rg = r::rng(seed);
    let x = r::random_activations(&mut rg, rows * h, h);
    let w: Vec<f32> = (0..h)
        .map(|_| {
            let m = rg.gen_range(0.5f32..1.5);
            if rg.gen_bool(0.5) {
                m
            } else {
                -m
            }
        })
        .collect();
    let dy = r::random_activations(&mut rg, rows * h, h);
    let b = |v: Vec<f32>| v.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
    (b(x), w, b(dy))
}

/// f64 rstd of each row.
pub fn ref_rstd(x: &[bf16], rows: usize, h: usize, eps: f32) -> Vec<f64> {
    (0..rows)
        .map(|row| {
            let ss: f64 = x[row * h..(row + 1) * h]
                .iter()
                .map(|v| v.to_f64() * v.to_f64())
                .sum();
            1.0 / (ss / h as f64 + f64::from(eps)).sqrt()
        })
        .collect()
}

const EPS: f32 = 1e-6;

/// Runs the forward kernel (`out`) on random inputs with poisoned outputs against f64: y (bf16)
/// within half a bf16 ulp + 1e-6 relative; FP8: scale within the rule applied to the f64 amax
/// +-1e-6 relative, each element within half an e4m3 ulp (x s) + 1e-6 relative; rstd 1e-6 rel.
pub fn check_fwd(
    stream: &Stream,
    rows: usize,
    h: usize,
    out: NormOut,
    seed: u64,
) -> Result<OpCheck> {
    let dev = stream.device().clone();
    let (x, w, _) = inputs(rows, h, seed);
    let spec = RmsNormSpec {
        rows,
        hidden: h,
        eps: EPS,
    };
    let (xb, wb) = (dev.upload(&x)?, dev.upload(&w)?);
    let mut rstd = poisoned(&dev, rows, f32::NAN)?;
    let rs = ref_rstd(&x, rows, h, EPS);
    let yref = |i: usize| x[i].to_f64() * rs[i / h] * f64::from(w[i % h]);
    let mut c = OpCheck::default();
    let t0 = Instant::now();
    let seconds;
    match out {
        NormOut::Bf16 => {
            let mut y = poisoned(&dev, rows * h, POISON_BF16)?;
            rmsnorm_fwd(stream, &spec, &xb, &wb, &mut y, &mut rstd)?;
            stream.synchronize()?;
            seconds = t0.elapsed().as_secs_f64();
            let yv = y.to_vec()?;
            for (i, &g) in yv[..rows * h].iter().enumerate() {
                let want = yref(i);
                c.bf16(g, want, 1e-6 * want.abs());
            }
        }
        NormOut::Fp8(mode) => {
            let mut q = poisoned(&dev, rows * h, 0xffu8)?;
            let mut s = poisoned(&dev, rows * h / 128, f32::NAN)?;
            let o = Fp8Out {
                q: &mut q,
                s: &mut s,
                mode,
            };
            rmsnorm_fwd_fp8(stream, &spec, &xb, &wb, o, &mut rstd)?;
            stream.synchronize()?;
            seconds = t0.elapsed().as_secs_f64();
            check_fp8(&mut c, &q.to_vec()?, &s.to_vec()?, mode, rows * h, &yref);
        }
    }
    let rel = c.rel_fro;
    for (g, w) in rstd.to_vec()?.iter().zip(&rs) {
        c.bound(f64::from(*g), *w, 1e-6 * w);
    }
    let mut c = c.finish(stream, seconds);
    if rel > 0.0 {
        c.rel_fro = rel; // of the dequantised FP8 output, not diluted by rstd
    }
    Ok(c)
}

/// Holds 1x128 FP8 output (q, s over `n` values) to the f64 values `want(i)` (slack 1e-6 rel).
pub(crate) fn check_fp8(
    c: &mut OpCheck,
    q: &[u8],
    s: &[f32],
    mode: ScaleMode,
    n: usize,
    want: &dyn Fn(usize) -> f64,
) {
    const SLACK: f64 = 1e-6;
    let (mut got_all, mut want_all) = (Vec::new(), Vec::new());
    for g in 0..n / 128 {
        let amax = (0..128).fold(0f64, |m, j| m.max(want(g * 128 + j).abs()));
        let lo = fp8_scale_host((amax * (1.0 - SLACK)) as f32, mode).0;
        let hi = fp8_scale_host((amax * (1.0 + SLACK)) as f32, mode).0;
        c.boundary += (mode != ScaleMode::Float && lo != hi) as usize;
        let sg = s[g];
        if !(sg >= lo && sg <= hi) {
            c.mismatches += 1;
        }
        let s64 = f64::from(sg);
        for j in 0..128 {
            let i = g * 128 + j;
            let w = want(i);
            let got = f64::from(emu::fp::e4m3_to_f32(q[i])) * s64;
            let half = crate::moe::e4m3_half_ulp(w.abs() * (1.0 + SLACK) / s64) * s64;
            c.bound(got, w, half + SLACK * w.abs() + 1e-30);
            got_all.push(got);
            want_all.push(w);
        }
    }
    c.rel_fro = rel_fro(&got_all, &want_all);
}

/// Runs [`rmsnorm_bwd`] on random inputs (rstd from the f64 reference, rounded to f32; dx,
/// dweight and the workspace poisoned) against f64: dx within half a bf16 ulp + the f32
/// summation slack of its terms, dweight within the summation slack of its terms.
pub fn check_bwd(stream: &Stream, rows: usize, h: usize, seed: u64) -> Result<OpCheck> {
    let dev = stream.device().clone();
    let (x, w, dy) = inputs(rows, h, seed);
    let spec = RmsNormSpec {
        rows,
        hidden: h,
        eps: EPS,
    };
    let rs = ref_rstd(&x, rows, h, EPS);
    let rs32: Vec<f32> = rs.iter().map(|v| *v as f32).collect();
    let (xb, wb, dyb, rb) = (
        dev.upload(&x)?,
        dev.upload(&w)?,
        dev.upload(&dy)?,
        dev.upload(&rs32)?,
    );
    let mut dx = poisoned(&dev, rows * h, POISON_BF16)?;
    let mut dw = poisoned(&dev, h, f32::NAN)?;
    let mut ws = poisoned(&dev, spec.dw_workspace_len(), f32::NAN)?;
    let t0 = Instant::now();
    let io = RmsNormBwd {
        x: &xb,
        weight: &wb,
        dy: &dyb,
        rstd: &rb,
        dx: &mut dx,
        dweight: &mut dw,
        accumulate: false,
        workspace: &mut ws,
    };
    rmsnorm_bwd(stream, &spec, io)?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let (dxv, dwv) = (dx.to_vec()?, dw.to_vec()?);
    let u = 2f64.powi(-24);
    let mut c = OpCheck::default();
    let f = |v: &bf16| v.to_f64();
    for row in 0..rows {
        let r = f64::from(rs32[row]);
        let xr = &x[row * h..(row + 1) * h];
        let dr = &dy[row * h..(row + 1) * h];
        let (mut dot, mut mag) = (0f64, 0f64);
        for j in 0..h {
            let t = f64::from(w[j]) * f(&dr[j]) * f(&xr[j]);
            dot += t;
            mag += t.abs();
        }
        let hf = h as f64;
        let eps_dot = (hf / 32.0 + 8.0) * u;
        for j in 0..h {
            let a = r * f64::from(w[j]) * f(&dr[j]);
            let b = f(&xr[j]) * r * r * r / hf;
            let want = a - b * dot;
            let slack = eps_dot * b.abs() * mag + 6.0 * u * (a.abs() + (b * dot).abs());
            c.bf16(dxv[row * h + j], want, slack);
        }
    }
    let nparts = rows.div_ceil(DW_ROWS) as f64;
    for j in 0..h {
        let (mut want, mut mag) = (0f64, 0f64);
        for row in 0..rows {
            let t = f(&dy[row * h + j]) * f(&x[row * h + j]) * f64::from(rs32[row]);
            want += t;
            mag += t.abs();
        }
        c.bound(
            f64::from(dwv[j]),
            want,
            (DW_ROWS as f64 + nparts + 4.0) * u * mag + 1e-30,
        );
    }
    Ok(c.finish(stream, seconds))
}
