//! Small element-wise and re-layout kernels a training step needs between the big ones: one
//! thread per output element, 256 threads per CTA, f32 math, BF16 results rounded once
//! (`cvt.rn`).
//!
//! - `bf16_add`: `out = bf16(a + b)` (residual adds and gradient sums of the residual stream).
//! - `f32_add`: `out = a + b` in f32 (fixed-order gradient accumulation).
//! - `cvt_f32_bf16` / `cvt_bf16_f32`: precision changes at stage boundaries.
//! - `transpose_{bf16,f32}_bf16`: `out [cols, rows] = x [rows, cols]^T` as BF16 (the operands of
//!   the weight-gradient GEMMs `dW = dY^T X`, which take both operands K-contiguous).
//! - `head_sum_bf16`: `out[t, g*w + c] = bf16(sum_{s<nsum} x[t*row_in + g*blk + off + c +
//!   s*sstride])` summed in `s` order: extracts per-head column slices (MLA's `dK_nope` from the
//!   attention backward's per-head dK) and sums them over heads (the shared RoPE key's gradient).
//! - `topk_slot_mask`: `out[r] = 1` where `slot[r] == k`, else 0 (the expert side of a per-slot
//!   MoE combine: each combine then carries exactly one of a token's top-k rows).
//! - `topk_slot_acc`: `acc[t, c] = w[t, k] * part[t, c] (+ acc[t, c] for k > 0)` in f32 (fma):
//!   the home side of a per-slot MoE combine, summing a token's expert outputs in slot order
//!   whatever ranks they came from.
//!
//! Limits: every element count < 2^32 - 4096.

use super::*;
use crate::host::{check_target, function};
use crate::reference as r;
use rand::Rng;
use runtime::{args, LaunchConfig};
use std::time::Instant;

pub const ADD_NAME: &str = "bf16_add";
pub const ADD_F32_NAME: &str = "f32_add";
pub const CVT_TO_BF16_NAME: &str = "cvt_f32_bf16";
pub const CVT_TO_F32_NAME: &str = "cvt_bf16_f32";
pub const HEAD_SUM_NAME: &str = "head_sum_bf16";
pub const SLOT_MASK_NAME: &str = "topk_slot_mask";
pub const SLOT_ACC_NAME: &str = "topk_slot_acc";

/// Name of the transpose reading bf16 (`bf`) or f32.
pub fn transpose_name(bf: bool) -> &'static str {
    if bf {
        "transpose_bf16_bf16"
    } else {
        "transpose_f32_bf16"
    }
}

const BLOCK: u32 = 256;

fn linear(n: usize) -> LaunchConfig {
    LaunchConfig::linear(n.div_ceil(BLOCK as usize) as u32, BLOCK)
}

/// Loads element `i` of a bf16 (`bf`) or f32 array as f32.
fn load_any(k: &mut KernelBuilder, x: GlobalPtr<u16>, i: Reg<u32>, bf: bool) -> Reg<f32> {
    if bf {
        let h = k.ld_nc(x.offset(i));
        bf16_to_f32(k, h)
    } else {
        k.ld_nc(x.cast::<f32>().offset(i))
    }
}

fn store_bf16(k: &mut KernelBuilder, out: GlobalPtr<u16>, i: Reg<u32>, v: Reg<f32>) {
    let b = f32_to_bf16_bits(k, v);
    k.st(out.offset(i), b);
}

/// `bf16_add`: params (a, b, out, n).
pub fn gen_add(t: &Target) -> Result<ptx::Module> {
    check_target(ADD_NAME, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(ADD_NAME, t.clone());
    k.reqntid(&[BLOCK]);
    let a = k.param_ptr_aligned::<u16>("a", 2);
    let b = k.param_ptr_aligned::<u16>("b", 2);
    let out = k.param_ptr_aligned::<u16>("out", 2);
    let n = k.param::<u32>("n");
    let gi = k.global_index_x();
    let valid = k.lt(gi, n);
    k.if_(valid, |k| {
        let x = load_any(k, a, gi, true);
        let y = load_any(k, b, gi, true);
        let s = k.add(x, y);
        store_bf16(k, out, gi, s);
    });
    Ok(k.finish()?)
}

/// `f32_add`: params (a, b, out, n).
pub fn gen_add_f32(t: &Target) -> Result<ptx::Module> {
    check_target(ADD_F32_NAME, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(ADD_F32_NAME, t.clone());
    k.reqntid(&[BLOCK]);
    let a = k.param_ptr_aligned::<f32>("a", 4);
    let b = k.param_ptr_aligned::<f32>("b", 4);
    let out = k.param_ptr_aligned::<f32>("out", 4);
    let n = k.param::<u32>("n");
    let gi = k.global_index_x();
    let valid = k.lt(gi, n);
    k.if_(valid, |k| {
        let x = k.ld_nc(a.offset(gi));
        let y = k.ld_nc(b.offset(gi));
        let s = k.add(x, y);
        k.st(out.offset(gi), s);
    });
    Ok(k.finish()?)
}

/// `cvt_f32_bf16` (`to_bf16`) or `cvt_bf16_f32`: params (x, out, n).
pub fn gen_cvt(t: &Target, to_bf16: bool) -> Result<ptx::Module> {
    let name = if to_bf16 {
        CVT_TO_BF16_NAME
    } else {
        CVT_TO_F32_NAME
    };
    check_target(name, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(name, t.clone());
    k.reqntid(&[BLOCK]);
    let x = k.param_ptr_aligned::<u16>("x", 2);
    let out = k.param_ptr_aligned::<u16>("out", 2);
    let n = k.param::<u32>("n");
    let gi = k.global_index_x();
    let valid = k.lt(gi, n);
    k.if_(valid, |k| {
        let v = load_any(k, x, gi, !to_bf16);
        if to_bf16 {
            store_bf16(k, out, gi, v);
        } else {
            k.st(out.cast::<f32>().offset(gi), v);
        }
    });
    Ok(k.finish()?)
}

/// Transpose to bf16: params (x, out, rows, cols); thread per output element.
pub fn gen_transpose(t: &Target, bf: bool) -> Result<ptx::Module> {
    let name = transpose_name(bf);
    check_target(name, t, TRAIN_TARGETS)?;
    transpose_kernel::<u16>(t, name, |k, x, out, src, dst| {
        let v = load_any(k, x, src, bf);
        store_bf16(k, out, dst, v);
    })
}

/// A thread-per-output-element transpose `out [cols, rows] = x [rows, cols]^T` over `T`
/// elements, params (x, out, rows, cols), block 256: `copy(k, x, out, src, dst)` moves element
/// `src` of x to element `dst` of out (converting if it likes).
pub(super) fn transpose_kernel<T: PtxType>(
    t: &Target,
    name: &str,
    copy: impl FnOnce(&mut KernelBuilder, GlobalPtr<T>, GlobalPtr<T>, Reg<u32>, Reg<u32>),
) -> Result<ptx::Module> {
    let mut k = KernelBuilder::new(name, t.clone());
    k.reqntid(&[BLOCK]);
    let align = T::SIZE;
    let x = k.param_ptr_aligned::<T>("x", align);
    let out = k.param_ptr_aligned::<T>("out", align);
    let rows = k.param::<u32>("rows");
    let cols = k.param::<u32>("cols");
    let gi = k.global_index_x();
    let n = k.mul(rows, cols);
    let valid = k.lt(gi, n);
    k.if_(valid, |k| {
        let c = k.div(gi, rows);
        let rr = k.rem(gi, rows);
        let src = k.mad_lo(rr, cols, c);
        copy(k, x, out, src, gi);
    });
    Ok(k.finish()?)
}

/// Head slice/sum: params (x, out, rows, w, groups, row_in, blk, off, nsum, sstride).
pub fn gen_head_sum(t: &Target) -> Result<ptx::Module> {
    check_target(HEAD_SUM_NAME, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(HEAD_SUM_NAME, t.clone());
    k.reqntid(&[BLOCK]);
    let x = k.param_ptr_aligned::<u16>("x", 2);
    let out = k.param_ptr_aligned::<u16>("out", 2);
    let rows = k.param::<u32>("rows");
    let w = k.param::<u32>("w");
    let groups = k.param::<u32>("groups");
    let row_in = k.param::<u32>("row_in");
    let blk = k.param::<u32>("blk");
    let off = k.param::<u32>("off");
    let nsum = k.param::<u32>("nsum");
    let sstride = k.param::<u32>("sstride");
    let gi = k.global_index_x();
    let per_row = k.mul(groups, w);
    let n = k.mul(rows, per_row);
    let valid = k.lt(gi, n);
    k.if_(valid, |k| {
        let t = k.div(gi, per_row);
        let j = k.rem(gi, per_row);
        let g = k.div(j, w);
        let c = k.rem(j, w);
        let base = k.mul(t, row_in);
        let base = k.mad_lo(g, blk, base);
        let base = k.add(base, off);
        let base = k.add(base, c);
        let acc = k.mov(0f32);
        k.for_range(0u32, nsum, 1u32, |k, s| {
            let i = k.mad_lo(s, sstride, base);
            let v = load_any(k, x, i, true);
            k.add_to(acc, acc, v);
        });
        store_bf16(k, out, gi, acc);
    });
    Ok(k.finish()?)
}

/// `topk_slot_mask`: params (slot, out, k, n).
pub fn gen_slot_mask(t: &Target) -> Result<ptx::Module> {
    check_target(SLOT_MASK_NAME, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(SLOT_MASK_NAME, t.clone());
    k.reqntid(&[BLOCK]);
    let slot = k.param_ptr_aligned::<i32>("slot", 4);
    let out = k.param_ptr_aligned::<f32>("out", 4);
    let kk = k.param::<i32>("k");
    let n = k.param::<u32>("n");
    let gi = k.global_index_x();
    let valid = k.lt(gi, n);
    k.if_(valid, |k| {
        let s = k.ld_nc(slot.offset(gi));
        let hit = k.eq(s, kk);
        let v = k.selp(1f32, 0f32, hit);
        k.st(out.offset(gi), v);
    });
    Ok(k.finish()?)
}

/// `topk_slot_acc`: params (part, w, acc, k, topk, h, n); `n = tokens * h`.
pub fn gen_slot_acc(t: &Target) -> Result<ptx::Module> {
    check_target(SLOT_ACC_NAME, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(SLOT_ACC_NAME, t.clone());
    k.reqntid(&[BLOCK]);
    let part = k.param_ptr_aligned::<u16>("part", 2);
    let w = k.param_ptr_aligned::<f32>("w", 4);
    let acc = k.param_ptr_aligned::<f32>("acc", 4);
    let slot = k.param::<u32>("k");
    let topk = k.param::<u32>("topk");
    let h = k.param::<u32>("h");
    let n = k.param::<u32>("n");
    let gi = k.global_index_x();
    let valid = k.lt(gi, n);
    k.if_(valid, |k| {
        let t = k.div(gi, h);
        let wi = k.mad_lo(t, topk, slot);
        let wv = k.ld_nc(w.offset(wi));
        let p = load_any(k, part, gi, true);
        let prev = k.mov(0f32);
        let later = k.ne(slot, 0u32);
        k.if_(later, |k| {
            let a = k.ld(acc.offset(gi));
            k.mov_to(prev, a);
        });
        let v = k.fma(wv, p, prev);
        k.st(acc.offset(gi), v);
    });
    Ok(k.finish()?)
}

// ---------------------------------------------------------------------------------------------
// host wrappers

/// `out = bf16(a + b)` over `n` elements.
pub fn bf16_add(
    stream: &Stream,
    a: &Buffer<bf16>,
    b: &Buffer<bf16>,
    out: &mut Buffer<bf16>,
    n: usize,
) -> Result<()> {
    need(ADD_NAME, "a", a, n)?;
    need(ADD_NAME, "b", b, n)?;
    need(ADD_NAME, "out", out, n)?;
    fits_u32(ADD_NAME, n)?;
    if n == 0 {
        return Ok(());
    }
    let f = function(stream.device(), ADD_NAME, "", gen_add)?;
    stream.launch(&f, &linear(n), &args![a, b, &*out, n as u32])?;
    Ok(())
}

/// `out = a + b` (f32, round to nearest even) over `n` elements.
pub fn f32_add(
    stream: &Stream,
    a: &Buffer<f32>,
    b: &Buffer<f32>,
    out: &mut Buffer<f32>,
    n: usize,
) -> Result<()> {
    need(ADD_F32_NAME, "a", a, n)?;
    need(ADD_F32_NAME, "b", b, n)?;
    need(ADD_F32_NAME, "out", out, n)?;
    fits_u32(ADD_F32_NAME, n)?;
    if n == 0 {
        return Ok(());
    }
    let f = function(stream.device(), ADD_F32_NAME, "", gen_add_f32)?;
    stream.launch(&f, &linear(n), &args![a, b, &*out, n as u32])?;
    Ok(())
}

/// `out[r] = 1.0` where `slot[r] == k`, else `0.0`, over `n` rows (padding rows, slot -1,
/// get 0).
pub fn topk_slot_mask(
    stream: &Stream,
    slot: &Buffer<i32>,
    out: &mut Buffer<f32>,
    k: u32,
    n: usize,
) -> Result<()> {
    need(SLOT_MASK_NAME, "slot", slot, n)?;
    need(SLOT_MASK_NAME, "out", out, n)?;
    fits_u32(SLOT_MASK_NAME, n)?;
    let Ok(k) = i32::try_from(k) else {
        return shape_err(SLOT_MASK_NAME, format!("k = {k} does not fit an i32"));
    };
    if n == 0 {
        return Ok(());
    }
    let f = function(stream.device(), SLOT_MASK_NAME, "", gen_slot_mask)?;
    stream.launch(&f, &linear(n), &args![slot, &*out, k, n as u32])?;
    Ok(())
}

/// Shapes of one [`topk_slot_acc`] call: `tokens x h` elements, slot `k` of `topk`.
#[derive(Clone, Copy, Debug)]
pub struct SlotAcc {
    pub tokens: usize,
    pub h: usize,
    pub k: usize,
    pub topk: usize,
}

/// `acc[t, c] = fma(w[t, k], part[t, c], k > 0 ? acc[t, c] : 0)` (f32) over `tokens x h`:
/// called for `k = 0, 1, ..., topk - 1` it sums a token's weighted top-k rows in slot order.
pub fn topk_slot_acc(
    stream: &Stream,
    part: &Buffer<bf16>,
    w: &Buffer<f32>,
    acc: &mut Buffer<f32>,
    s: SlotAcc,
) -> Result<()> {
    let (Some(n), Some(nw)) = (s.tokens.checked_mul(s.h), s.tokens.checked_mul(s.topk)) else {
        return shape_err(SLOT_ACC_NAME, "tokens x h or tokens x topk overflows");
    };
    if s.k >= s.topk || s.h == 0 {
        return shape_err(
            SLOT_ACC_NAME,
            format!("slot k = {} must be < topk = {} and h > 0", s.k, s.topk),
        );
    }
    need(SLOT_ACC_NAME, "part", part, n)?;
    need(SLOT_ACC_NAME, "w", w, nw)?;
    need(SLOT_ACC_NAME, "acc", acc, n)?;
    fits_u32(SLOT_ACC_NAME, n.max(nw))?;
    if n == 0 {
        return Ok(());
    }
    let f = function(stream.device(), SLOT_ACC_NAME, "", gen_slot_acc)?;
    let a = args![
        part,
        w,
        &*acc,
        s.k as u32,
        s.topk as u32,
        s.h as u32,
        n as u32
    ];
    stream.launch(&f, &linear(n), &a)?;
    Ok(())
}

/// `out = bf16(x)` (round to nearest even) over `n` elements.
pub fn cvt_f32_bf16(
    stream: &Stream,
    x: &Buffer<f32>,
    out: &mut Buffer<bf16>,
    n: usize,
) -> Result<()> {
    need(CVT_TO_BF16_NAME, "x", x, n)?;
    need(CVT_TO_BF16_NAME, "out", out, n)?;
    fits_u32(CVT_TO_BF16_NAME, n)?;
    if n == 0 {
        return Ok(());
    }
    let f = function(stream.device(), CVT_TO_BF16_NAME, "", |t| gen_cvt(t, true))?;
    stream.launch(&f, &linear(n), &args![x, &*out, n as u32])?;
    Ok(())
}

/// `out = f32(x)` (exact) over `n` elements.
pub fn cvt_bf16_f32(
    stream: &Stream,
    x: &Buffer<bf16>,
    out: &mut Buffer<f32>,
    n: usize,
) -> Result<()> {
    need(CVT_TO_F32_NAME, "x", x, n)?;
    need(CVT_TO_F32_NAME, "out", out, n)?;
    fits_u32(CVT_TO_F32_NAME, n)?;
    if n == 0 {
        return Ok(());
    }
    let f = function(stream.device(), CVT_TO_F32_NAME, "", |t| gen_cvt(t, false))?;
    stream.launch(&f, &linear(n), &args![x, &*out, n as u32])?;
    Ok(())
}

/// `out [cols, rows] = bf16(x [rows, cols])^T`, x bf16 or f32.
pub fn transpose_bf16<T: Elem>(
    stream: &Stream,
    x: &Buffer<T>,
    out: &mut Buffer<bf16>,
    rows: usize,
    cols: usize,
) -> Result<()> {
    let name = transpose_name(T::IS_BF16);
    let n = rows.saturating_mul(cols);
    need(name, "x", x, n)?;
    need(name, "out", out, n)?;
    fits_u32(name, n)?;
    if n == 0 {
        return Ok(());
    }
    let f = function(stream.device(), name, "", |t| gen_transpose(t, T::IS_BF16))?;
    let a = args![x, &*out, rows as u32, cols as u32];
    stream.launch(&f, &linear(n), &a)?;
    Ok(())
}

/// Layout of one [`head_sum`]: per row `t`, output column `g*w + c` (`g < groups`, `c < w`)
/// is the sum over `s < nsum` of input element `t*row_in + g*blk + off + c + s*sstride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadSum {
    pub rows: usize,
    pub w: usize,
    pub groups: usize,
    pub row_in: usize,
    pub blk: usize,
    pub off: usize,
    pub nsum: usize,
    pub sstride: usize,
}

impl HeadSum {
    /// Elements of the input the layout reads (one past the last).
    pub fn input_len(&self) -> usize {
        if self.rows == 0 || self.groups == 0 || self.w == 0 || self.nsum == 0 {
            return 0;
        }
        (self.rows - 1) * self.row_in
            + (self.groups - 1) * self.blk
            + self.off
            + self.w
            + (self.nsum - 1) * self.sstride
    }
    pub fn output_len(&self) -> usize {
        self.rows * self.groups * self.w
    }
}

/// Per-head slices of `x`, summed over `nsum` (in order), rounded once to bf16.
pub fn head_sum(
    stream: &Stream,
    l: &HeadSum,
    x: &Buffer<bf16>,
    out: &mut Buffer<bf16>,
) -> Result<()> {
    need(HEAD_SUM_NAME, "x", x, l.input_len())?;
    need(HEAD_SUM_NAME, "out", out, l.output_len())?;
    fits_u32(HEAD_SUM_NAME, l.input_len().max(l.output_len()))?;
    if l.output_len() == 0 {
        return Ok(());
    }
    let f = function(stream.device(), HEAD_SUM_NAME, "", gen_head_sum)?;
    let a = args![
        x,
        &*out,
        l.rows as u32,
        l.w as u32,
        l.groups as u32,
        l.row_in as u32,
        l.blk as u32,
        l.off as u32,
        l.nsum as u32,
        l.sstride as u32
    ];
    stream.launch(&f, &linear(l.output_len()), &a)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// checks

fn random_bf16(rg: &mut impl Rng, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rg.gen_range(-2.0f32..2.0)))
        .collect()
}

/// `bf16_add`, `f32_add` and both conversions on random inputs (outputs poisoned): the bf16 sum
/// within half a bf16 ulp of the f64 sum, the f32 sum within half an f32 ulp, the conversions
/// bit-exact against the f64 rounding.
pub fn check_elementwise(stream: &Stream, n: usize, seed: u64) -> Result<OpCheck> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let (a, b) = (random_bf16(&mut rg, n), random_bf16(&mut rg, n));
    let xf: Vec<f32> = (0..n).map(|_| rg.gen_range(-3.0f32..3.0)).collect();
    let (ab, bb, xb) = (dev.upload(&a)?, dev.upload(&b)?, dev.upload(&xf)?);
    let mut sum = poisoned(&dev, n, POISON_BF16)?;
    let mut tob = poisoned(&dev, n, POISON_BF16)?;
    let mut tof = poisoned(&dev, n, f32::NAN)?;
    let yf: Vec<f32> = (0..n).map(|_| rg.gen_range(-3.0f32..3.0)).collect();
    let yb = dev.upload(&yf)?;
    let mut sumf = poisoned(&dev, n, f32::NAN)?;
    let t0 = Instant::now();
    f32_add(stream, &xb, &yb, &mut sumf, n)?;
    bf16_add(stream, &ab, &bb, &mut sum, n)?;
    cvt_f32_bf16(stream, &xb, &mut tob, n)?;
    cvt_bf16_f32(stream, &ab, &mut tof, n)?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let (sum, tob, tof) = (sum.to_vec()?, tob.to_vec()?, tof.to_vec()?);
    let sumf = sumf.to_vec()?;
    let mut c = OpCheck::default();
    for i in 0..n {
        c.bf16(sum[i], a[i].to_f64() + b[i].to_f64(), 0.0);
        c.bf16(tob[i], f64::from(xf[i]), 0.0);
        c.bound(f64::from(tof[i]), a[i].to_f64(), 1e-300);
        let want = f64::from(xf[i]) + f64::from(yf[i]);
        c.bound(
            f64::from(sumf[i]),
            want,
            want.abs() * 2f64.powi(-24) * (1.0 + 1e-9) + 1e-30,
        );
    }
    Ok(c.finish(stream, seconds))
}

/// Transpose of random `[rows, cols]` bf16 or f32 (output poisoned): bit-exact (bf16) or within
/// half a bf16 ulp (f32 input).
pub fn check_transpose(
    stream: &Stream,
    rows: usize,
    cols: usize,
    bf: bool,
    seed: u64,
) -> Result<OpCheck> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let x: Vec<f32> = (0..rows * cols)
        .map(|_| rg.gen_range(-2.0f32..2.0))
        .map(|v| if bf { bf16::from_f32(v).to_f32() } else { v })
        .collect();
    let mut out = poisoned(&dev, rows * cols, POISON_BF16)?;
    // the inputs live until the stream is synchronised
    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let (xbb, xfb) = (dev.upload(&xb)?, dev.upload(&x)?);
    let t0 = Instant::now();
    if bf {
        transpose_bf16(stream, &xbb, &mut out, rows, cols)?;
    } else {
        transpose_bf16(stream, &xfb, &mut out, rows, cols)?;
    }
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let got = out.to_vec()?;
    let mut c = OpCheck::default();
    for rr in 0..rows {
        for cc in 0..cols {
            c.bf16(got[cc * rows + rr], f64::from(x[rr * cols + cc]), 0.0);
        }
    }
    Ok(c.finish(stream, seconds))
}

/// Head slicing and summing as MLA uses them on random per-head `[rows, heads, d]` bf16: the
/// first `nope` columns of every head (bit-exact) and the sum over heads of the last `d - nope`
/// columns (within half a bf16 ulp plus the f32 summation error `heads 2^-24 sum |x|`).
pub fn check_head_sum(
    stream: &Stream,
    rows: usize,
    heads: usize,
    d: usize,
    seed: u64,
) -> Result<OpCheck> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let nope = d / 2;
    let x = random_bf16(&mut rg, rows * heads * d);
    let xb = dev.upload(&x)?;
    let slice = HeadSum {
        rows,
        w: nope,
        groups: heads,
        row_in: heads * d,
        blk: d,
        off: 0,
        nsum: 1,
        sstride: 0,
    };
    let sum = HeadSum {
        rows,
        w: d - nope,
        groups: 1,
        row_in: heads * d,
        blk: 0,
        off: nope,
        nsum: heads,
        sstride: d,
    };
    let mut o1 = poisoned(&dev, slice.output_len(), POISON_BF16)?;
    let mut o2 = poisoned(&dev, sum.output_len(), POISON_BF16)?;
    let t0 = Instant::now();
    head_sum(stream, &slice, &xb, &mut o1)?;
    head_sum(stream, &sum, &xb, &mut o2)?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let (o1, o2) = (o1.to_vec()?, o2.to_vec()?);
    let mut c = OpCheck::default();
    let at = |t: usize, h: usize, j: usize| x[(t * heads + h) * d + j].to_f64();
    for t in 0..rows {
        for h in 0..heads {
            for j in 0..nope {
                c.bf16(o1[(t * heads + h) * nope + j], at(t, h, j), 0.0);
            }
        }
        for j in 0..d - nope {
            let want: f64 = (0..heads).map(|h| at(t, h, nope + j)).sum();
            let mag: f64 = (0..heads).map(|h| at(t, h, nope + j).abs()).sum();
            let slack = heads as f64 * 2f64.powi(-24) * mag;
            c.bf16(o2[t * (d - nope) + j], want, slack);
        }
    }
    Ok(c.finish(stream, seconds))
}

/// `topk_slot_mask` on random slots (padding -1 included) and `topk_slot_acc` over every slot of
/// random BF16 rows and f32 weights (outputs poisoned with NaN: slot 0 must not read the
/// accumulator): the mask exact, the slot-order sum within `topk` f32 roundings of the f64 sum.
pub fn check_topk_slots(
    stream: &Stream,
    tokens: usize,
    h: usize,
    topk: usize,
    seed: u64,
) -> Result<OpCheck> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let rows = tokens * topk;
    let slots: Vec<i32> = (0..rows).map(|_| rg.gen_range(-1..topk as i32)).collect();
    let parts: Vec<Vec<bf16>> = (0..topk)
        .map(|_| random_bf16(&mut rg, tokens * h))
        .collect();
    let w: Vec<f32> = (0..tokens * topk)
        .map(|_| rg.gen_range(0.0f32..2.5))
        .collect();
    let (sb, wb) = (dev.upload(&slots)?, dev.upload(&w)?);
    let pb = parts
        .iter()
        .map(|p| dev.upload(p))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut masks = Vec::new();
    let mut acc = poisoned(&dev, tokens * h, f32::NAN)?;
    let t0 = Instant::now();
    for k in 0..topk {
        let mut m = poisoned(&dev, rows, f32::NAN)?;
        topk_slot_mask(stream, &sb, &mut m, k as u32, rows)?;
        masks.push(m);
        let s = SlotAcc { tokens, h, k, topk };
        topk_slot_acc(stream, &pb[k], &wb, &mut acc, s)?;
    }
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let mut c = OpCheck::default();
    for (k, m) in masks.iter().enumerate() {
        for (got, &s) in m.to_vec()?.iter().zip(&slots) {
            let want = if s == k as i32 { 1.0 } else { 0.0 };
            c.bound(f64::from(*got), want, 0.0);
        }
    }
    let acc = acc.to_vec()?;
    for t in 0..tokens {
        for j in 0..h {
            let term = |k: usize| f64::from(w[t * topk + k]) * parts[k][t * h + j].to_f64();
            let want: f64 = (0..topk).map(term).sum();
            let mag: f64 = (0..topk).map(|k| term(k).abs()).sum();
            let bound = topk as f64 * 2f64.powi(-24) * mag * (1.0 + 1e-9) + 1e-30;
            c.bound(f64::from(acc[t * h + j]), want, bound);
        }
    }
    Ok(c.finish(stream, seconds))
}
