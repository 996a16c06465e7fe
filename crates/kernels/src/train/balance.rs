//! Two small kernels of the optimizer step that used to be host arithmetic:
//!
//! - `moe_bias_update`: DeepSeek-V3's aux-loss-free load balancing, `bias_e += speed *
//!   sign(mean - load_e)` over one MoE layer's `E` experts (`sign(0) = 0`, `mean` the layer's
//!   average load). The sign is decided in integers (`total` vs `E * load_e`, u64), which is
//!   the sign of the f64 `total / E - load_e` for every load below 2^32; the update is one f32
//!   `mul.rn` and one `add.rn`, so the result is bit for bit the host rule's. One CTA; thread
//!   `e` (strided) sums all loads itself (integer adds: the order cannot matter).
//! - `grad_norm_combine`: the global gradient norm from per-group norms `n_g` (each group's
//!   `grad_norm` on its own device, copied to one device): `sqrt(sum_g f64(n_g)^2)` in f64,
//!   summed in group order (one single-thread launch per group, the running sum in an f64
//!   buffer), rounded once to f32. Every operation is `.rn` (no contraction into `fma`), so
//!   the result equals the host's `f64` loop bit for bit.

use super::*;
use crate::host::{check_target, function};
use crate::reference as r;
use rand::Rng;
use runtime::{args, LaunchConfig};
use std::time::Instant;

pub const BIAS_UPDATE_NAME: &str = "moe_bias_update";
pub const NORM_COMBINE_NAME: &str = "grad_norm_combine";
/// Most experts one bias update takes (each thread reads every load).
pub const MAX_BIAS_EXPERTS: usize = 1 << 16;

/// Bias update: params (bias, load, experts, speed); grid 1 x 256.
pub fn gen_bias_update(t: &Target) -> Result<ptx::Module> {
    check_target(BIAS_UPDATE_NAME, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(BIAS_UPDATE_NAME, t.clone());
    k.reqntid(&[256]);
    let bias = k.param_ptr_aligned::<f32>("bias", 4);
    let load = k.param_ptr_aligned::<u32>("load", 4);
    let experts = k.param::<u32>("experts");
    let speed = k.param::<f32>("speed");
    let tid = k.tid_x();
    k.for_range(tid, experts, 256u32, |k, e| {
        let total = k.mov(0u64);
        let z = k.mov(0u32);
        k.for_range(z, experts, 1u32, |k, j| {
            let l = k.ld_nc(load.offset(j));
            let l64 = k.cvt::<u64, u32>(l);
            k.add_to(total, total, l64);
        });
        let mine = k.ld_nc(load.offset(e));
        let (m64, e64) = (k.cvt::<u64, u32>(mine), k.cvt::<u64, u32>(experts));
        let scaled = k.mul(m64, e64);
        let (above, below) = (k.gt(total, scaled), k.lt(total, scaled));
        let s = k.selp(1f32, 0f32, above);
        let s = k.selp(-1f32, s, below);
        let step = k.mul_m(FMods::rn(), speed, s);
        let b = k.ld(bias.offset(e));
        let nb = k.add_m(FMods::rn(), b, step);
        k.st(bias.offset(e), nb);
    });
    Ok(k.finish()?)
}

/// Norm combine: params (norm, acc, out, first, last); grid 1 x 32, thread 0 works.
pub fn gen_norm_combine(t: &Target) -> Result<ptx::Module> {
    check_target(NORM_COMBINE_NAME, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(NORM_COMBINE_NAME, t.clone());
    k.reqntid(&[32]);
    let norm = k.param_ptr_aligned::<f32>("norm", 4);
    let acc = k.param_ptr_aligned::<f64>("acc", 8);
    let out = k.param_ptr_aligned::<f32>("out", 4);
    let first = k.param::<u32>("first");
    let last = k.param::<u32>("last");
    let tid = k.tid_x();
    let t0 = k.eq(tid, 0u32);
    k.if_(t0, |k| {
        let sum = k.mov(0f64);
        let cont = k.eq(first, 0u32);
        k.when(cont, |k| {
            let a = k.ld(acc.at(0));
            k.mov_to(sum, a);
        });
        let n = k.ld_nc(norm.at(0));
        let n64 = k.cvt::<f64, f32>(n);
        let sq = k.mul_m(FMods::rn(), n64, n64);
        let s1 = k.add_m(FMods::rn(), sum, sq);
        k.st(acc.at(0), s1);
        let fin = k.ne(last, 0u32);
        k.when(fin, |k| {
            let r = k.sqrt(s1);
            let r32 = k.cvt::<f32, f64>(r);
            k.st(out.at(0), r32);
        });
    });
    Ok(k.finish()?)
}

// ---------------------------------------------------------------------------------------------
// host wrappers

/// `bias[e] += speed * sign(mean(load) - load[e])` for the `bias.len()` experts of one MoE
/// layer (`load` the tokens routed to each expert in the step).
pub fn moe_bias_update(
    stream: &Stream,
    bias: &mut Buffer<f32>,
    load: &Buffer<u32>,
    speed: f32,
) -> Result<()> {
    let e = bias.len();
    if e > MAX_BIAS_EXPERTS {
        return shape_err(
            BIAS_UPDATE_NAME,
            format!("{e} experts: at most {MAX_BIAS_EXPERTS}"),
        );
    }
    need(BIAS_UPDATE_NAME, "load", load, e)?;
    if !speed.is_finite() {
        return shape_err(BIAS_UPDATE_NAME, format!("speed {speed} is not finite"));
    }
    if e == 0 {
        return Ok(());
    }
    let f = function(stream.device(), BIAS_UPDATE_NAME, "", gen_bias_update)?;
    let a = args![&*bias, load, e as u32, speed];
    stream.launch(&f, &LaunchConfig::linear(1, 256), &a)?;
    Ok(())
}

/// `out[0] = f32(sqrt(sum_g f64(norms[g][0])^2))`, summed in the order of `norms` (one launch
/// each; every buffer on `stream`'s device). `acc` is a one-element f64 workspace. No norms
/// give 0.
pub fn grad_norm_combine(
    stream: &Stream,
    norms: &[&Buffer<f32>],
    acc: &mut Buffer<f64>,
    out: &mut Buffer<f32>,
) -> Result<()> {
    need(NORM_COMBINE_NAME, "acc", acc, 1)?;
    need(NORM_COMBINE_NAME, "out", out, 1)?;
    for n in norms {
        need(NORM_COMBINE_NAME, "norm", *n, 1)?;
    }
    if norms.is_empty() {
        return Ok(stream.fill(&*out, 0.0)?);
    }
    let f = function(stream.device(), NORM_COMBINE_NAME, "", gen_norm_combine)?;
    let last = norms.len() - 1;
    for (g, n) in norms.iter().enumerate() {
        let a = args![*n, &*acc, &*out, (g == 0) as u32, (g == last) as u32];
        stream.launch(&f, &LaunchConfig::linear(1, 32), &a)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// CPU references and checks

/// The host rule (f64 mean, f32 update): what [`moe_bias_update`] must produce bit for bit.
pub fn ref_bias_update(bias: &mut [f32], load: &[u64], speed: f32) {
    let total: u64 = load.iter().sum();
    let mean = total as f64 / load.len().max(1) as f64;
    for (b, &l) in bias.iter_mut().zip(load) {
        let d = mean - l as f64;
        let sign = if d > 0.0 {
            1.0
        } else if d < 0.0 {
            -1.0
        } else {
            0.0
        };
        *b += speed * sign;
    }
}

/// The host combine (f64 sum of squares in order, one rounding to f32).
pub fn ref_norm_combine(norms: &[f32]) -> f32 {
    let mut s = 0.0f64;
    for &n in norms {
        let v = f64::from(n);
        s += v * v;
    }
    s.sqrt() as f32
}

/// Counts the elements of `got` whose bits differ from `want` (each one a mismatch).
fn bitwise(c: &mut OpCheck, got: &[f32], want: &[f32]) {
    for (g, w) in got.iter().zip(want) {
        if g.to_bits() == w.to_bits() {
            c.bound(f64::from(*g), f64::from(*w), 1.0);
        } else {
            c.mismatches += 1;
            c.worst = f64::INFINITY;
        }
    }
}

/// Random loads of `e` experts with expert 0's load exactly the mean (so `sign = 0` is taken):
/// the others random, expert 1 nudged so their sum divides by `e - 1`, expert 0 their mean.
fn loads_with_a_tie(rg: &mut impl Rng, e: usize) -> Vec<u64> {
    let mut load: Vec<u64> = (0..e).map(|_| rg.gen_range(0..5000u64)).collect();
    if e < 2 {
        return load;
    }
    let rest: u64 = load[1..].iter().sum();
    let k = e as u64 - 1;
    load[1] += (k - rest % k) % k;
    load[0] = load[1..].iter().sum::<u64>() / k;
    load
}

/// Random biases and loads of `experts` experts in three cases (one expert's load on the mean;
/// every load equal; the same with another speed), against [`ref_bias_update`] bit for bit.
pub fn check_bias_update(stream: &Stream, experts: usize, seed: u64) -> Result<OpCheck> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let mut c = OpCheck::default();
    let mut seconds = 0.0;
    let e = experts.max(1);
    for (case, speed) in [1e-3f32, 0.37, 3e-5].into_iter().enumerate() {
        let load = match case {
            1 => vec![77u64; e],
            _ => loads_with_a_tie(&mut rg, e),
        };
        let bias0: Vec<f32> = (0..e).map(|_| rg.gen_range(-0.5f32..0.5)).collect();
        let mut want = bias0.clone();
        ref_bias_update(&mut want, &load, speed);
        let mut bias = dev.upload(&bias0)?;
        let l32: Vec<u32> = load.iter().map(|&l| l as u32).collect();
        let lb = dev.upload(&l32)?;
        let t0 = Instant::now();
        moe_bias_update(stream, &mut bias, &lb, speed)?;
        stream.synchronize()?;
        seconds += t0.elapsed().as_secs_f64();
        bitwise(&mut c, &bias.to_vec()?, &want);
    }
    Ok(c.finish(stream, seconds))
}

/// `groups` random per-group norms (spread over 8 binades) combined on the device against the
/// f64 reference rounded once, bit for bit; the output poisoned first.
pub fn check_norm_combine(stream: &Stream, groups: usize, seed: u64) -> Result<OpCheck> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let norms: Vec<f32> = (0..groups)
        .map(|_| rg.gen_range(0.5f32..1.0) * 2f32.powi(rg.gen_range(-4..4)))
        .collect();
    let bufs = norms
        .iter()
        .map(|n| Ok(dev.upload(&[*n])?))
        .collect::<Result<Vec<_>>>()?;
    let refs: Vec<&Buffer<f32>> = bufs.iter().collect();
    let mut acc = poisoned(&dev, 1, f64::NAN)?;
    let mut out = poisoned(&dev, 1, f32::NAN)?;
    let t0 = Instant::now();
    grad_norm_combine(stream, &refs, &mut acc, &mut out)?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let ss: f64 = norms.iter().map(|&n| f64::from(n).powi(2)).sum();
    let mut c = OpCheck::default();
    bitwise(&mut c, &out.to_vec()?, &[ss.sqrt() as f32]);
    Ok(c.finish(stream, seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_rule_moves_each_bias_toward_balance() {
        let mut b = vec![0.0f32, 0.0, 0.0];
        ref_bias_update(&mut b, &[1, 2, 3], 0.5);
        assert_eq!(b, [0.5, 0.0, -0.5]);
        assert_eq!(ref_norm_combine(&[3.0, 4.0]), 5.0);
        assert_eq!(ref_norm_combine(&[]), 0.0);
    }

    #[test]
    fn both_kernels_match_their_references_bit_for_bit_on_the_emulator() {
        let st = Device::emu(0).stream(0);
        for (e, seed) in [(1, 1), (7, 2), (64, 3), (300, 4)] {
            let c = check_bias_update(&st, e, seed).unwrap();
            assert_eq!(c.mismatches, 0, "{e} experts: {c:?}");
        }
        for (g, seed) in [(1, 5), (4, 6), (9, 7)] {
            let c = check_norm_combine(&st, g, seed).unwrap();
            assert_eq!(c.mismatches, 0, "{g} groups: {c:?}");
        }
    }

    #[test]
    fn bad_sizes_are_refused_naming_the_buffer() {
        let dev = Device::emu(0);
        let st = dev.stream(0);
        let mut bias = dev.upload(&[0.0f32; 4]).unwrap();
        let load = dev.upload(&[1u32; 3]).unwrap();
        let e = moe_bias_update(&st, &mut bias, &load, 0.1).unwrap_err();
        assert!(e.to_string().contains("load"), "{e}");
        let load = dev.upload(&[1u32; 4]).unwrap();
        let e = moe_bias_update(&st, &mut bias, &load, f32::NAN).unwrap_err();
        assert!(e.to_string().contains("speed"), "{e}");
    }
}
