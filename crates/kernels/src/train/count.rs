//! Small deterministic reductions of a training step's bookkeeping (no atomics, fixed order):
//!
//! - `expert_count`: the per-expert token histogram of the routed expert indices, `out[e] =
//!   #{i : idx[i] == e}` for `e < experts` and `out[experts]` = indices outside `[0,
//!   experts)` (the load the aux-loss-free bias update balances; a non-zero last entry is a
//!   routing bug the caller reports). Thread per output entry, each scanning the indices in
//!   order: exact integer counts, any launch order.
//! - `f32_sum_f64`: `acc[0] = (accumulate ? acc[0] : 0) + f64(x[0]) + f64(x[1]) + ...` summed
//!   in f64 in index order by one thread (the ranks' summed losses, in rank order, as the host
//!   summed them before: f32 values added in f64).

use super::*;
use crate::host::{check_target, function};
use crate::reference as r;
use rand::Rng;
use runtime::{args, LaunchConfig};
use std::time::Instant;

pub const COUNT_NAME: &str = "expert_count";
pub const SUM_F64_NAME: &str = "f32_sum_f64";

const BLOCK: u32 = 128;

/// `expert_count`: params (idx, out, n, experts).
pub fn gen_count(t: &Target) -> Result<ptx::Module> {
    check_target(COUNT_NAME, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(COUNT_NAME, t.clone());
    k.reqntid(&[BLOCK]);
    let idx = k.param_ptr_aligned::<i32>("idx", 4);
    let out = k.param_ptr_aligned::<u32>("out", 4);
    let n = k.param::<u32>("n");
    let experts = k.param::<u32>("experts");
    let gi = k.global_index_x();
    let valid = k.le(gi, experts);
    k.if_(valid, |k| {
        let c = k.mov(0u32);
        k.for_range(0u32, n, 1u32, |k, i| {
            let v = k.ld_nc(idx.offset(i));
            let vu: Reg<u32> = k.bitcast(v);
            // an index outside [0, experts) (negative ones wrap above) lands on `experts`
            let key = k.min(vu, experts);
            let hit = k.eq(key, gi);
            let one = k.selp(1u32, 0u32, hit);
            k.add_to(c, c, one);
        });
        k.st(out.offset(gi), c);
    });
    Ok(k.finish()?)
}

/// `f32_sum_f64`: params (x, acc, n, accumulate).
pub fn gen_sum_f64(t: &Target) -> Result<ptx::Module> {
    check_target(SUM_F64_NAME, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(SUM_F64_NAME, t.clone());
    k.reqntid(&[32]);
    let x = k.param_ptr_aligned::<f32>("x", 4);
    let acc = k.param_ptr_aligned::<f64>("acc", 8);
    let n = k.param::<u32>("n");
    let accumulate = k.param::<u32>("accumulate");
    let tid = k.tid_x();
    let first = k.eq(tid, 0u32);
    k.if_(first, |k| {
        let s = k.mov(0f64);
        let more = k.ne(accumulate, 0u32);
        k.if_(more, |k| {
            let a = k.ld(acc.at(0));
            k.mov_to(s, a);
        });
        k.for_range(0u32, n, 1u32, |k, i| {
            let v = k.ld_nc(x.offset(i));
            let w: Reg<f64> = k.cvt(v);
            k.add_to(s, s, w);
        });
        k.st(acc.at(0), s);
    });
    Ok(k.finish()?)
}

// ---------------------------------------------------------------------------------------------
// host wrappers

/// `out[e]` = how many of the `n` indices in `idx` equal `e` (`e < experts`); `out[experts]` =
/// how many lie outside `[0, experts)`. `out` holds at least `experts + 1` counts.
pub fn expert_count(
    stream: &Stream,
    idx: &Buffer<i32>,
    out: &mut Buffer<u32>,
    n: usize,
    experts: usize,
) -> Result<()> {
    need(COUNT_NAME, "idx", idx, n)?;
    need(COUNT_NAME, "out", out, experts.saturating_add(1))?;
    fits_u32(COUNT_NAME, n.max(experts.saturating_add(1)))?;
    let f = function(stream.device(), COUNT_NAME, "", gen_count)?;
    let grid = (experts + 1).div_ceil(BLOCK as usize) as u32;
    let a = args![idx, &*out, n as u32, experts as u32];
    stream.launch(&f, &LaunchConfig::linear(grid, BLOCK), &a)?;
    Ok(())
}

/// `acc[0] = (accumulate ? acc[0] : 0) + sum_i f64(x[i])` over `n` f32 values, in index order.
pub fn f32_sum_f64(
    stream: &Stream,
    x: &Buffer<f32>,
    acc: &mut Buffer<f64>,
    n: usize,
    accumulate: bool,
) -> Result<()> {
    need(SUM_F64_NAME, "x", x, n)?;
    need(SUM_F64_NAME, "acc", acc, 1)?;
    fits_u32(SUM_F64_NAME, n)?;
    let f = function(stream.device(), SUM_F64_NAME, "", gen_sum_f64)?;
    let a = args![x, &*acc, n as u32, u32::from(accumulate)];
    stream.launch(&f, &LaunchConfig::linear(1, 32), &a)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// checks

/// `expert_count` of `n` random indices over `experts` experts (a few outside the range,
/// negative and too large; output poisoned): every count exact against a host count.
pub fn check_count(stream: &Stream, n: usize, experts: usize, seed: u64) -> Result<OpCheck> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let hi = experts as i32;
    let idx: Vec<i32> = (0..n)
        .map(|_| match rg.gen_range(0..16) {
            0 => rg.gen_range(-3..0),
            1 => rg.gen_range(hi..hi + 3),
            _ => rg.gen_range(0..hi.max(1)),
        })
        .collect();
    let ib = dev.upload(&idx)?;
    let mut out = poisoned(&dev, experts + 1, u32::MAX)?;
    let t0 = Instant::now();
    expert_count(stream, &ib, &mut out, n, experts)?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let mut want = vec![0u64; experts + 1];
    for &v in &idx {
        let e = usize::try_from(v).ok().filter(|&e| e < experts);
        want[e.unwrap_or(experts)] += 1;
    }
    let mut c = OpCheck::default();
    for (got, w) in out.to_vec()?.iter().zip(&want) {
        c.bound(f64::from(*got), *w as f64, 0.0);
    }
    Ok(c.finish(stream, seconds))
}

/// `f32_sum_f64` of random f32 values, fresh and accumulated onto a previous sum (accumulator
/// poisoned with NaN for the fresh sum): bit-exact against the host's in-order f64 sum.
pub fn check_sum_f64(stream: &Stream, n: usize, seed: u64) -> Result<OpCheck> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let x: Vec<f32> = (0..n).map(|_| rg.gen_range(-1e4f32..1e4)).collect();
    let y: Vec<f32> = (0..n).map(|_| rg.gen_range(-3.0f32..3.0)).collect();
    let (xb, yb) = (dev.upload(&x)?, dev.upload(&y)?);
    let mut acc = poisoned(&dev, 1, f64::NAN)?;
    let t0 = Instant::now();
    f32_sum_f64(stream, &xb, &mut acc, n, false)?;
    stream.synchronize()?;
    let fresh = acc.to_vec()?[0];
    f32_sum_f64(stream, &yb, &mut acc, n, true)?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let both = acc.to_vec()?[0];
    let want_x = x.iter().fold(0f64, |s, &v| s + f64::from(v));
    let want = y.iter().fold(want_x, |s, &v| s + f64::from(v));
    let mut c = OpCheck::default();
    c.bound(fresh, want_x, 0.0);
    c.bound(both, want, 0.0);
    Ok(c.finish(stream, seconds))
}
