//! Optimiser step of the V3 recipe: global gradient L2 norm (deterministic two-stage reduction
//! over several tensors) and AdamW on FP32 master weights with BF16 first/second moments and the
//! clip applied inside the step (the norm is read from device memory: no host round-trip).
//!
//! - `grad_sumsq_partial`: one launch per gradient tensor (f32); CTA b sums the squares of its
//!   4096 elements (16 per thread, coalesced) into `part[part0 + b]` (thread sums, butterfly, the
//!   8 warps in order).
//! - `grad_norm`: one CTA sums all partials (thread-strided, then the fixed tree) and writes
//!   `sqrt(sum)` (`sqrt.rn`). Partials are laid out tensor after tensor, so the order is fixed.
//! - `adamw_step`: four consecutive elements per thread (16-byte p/g, 8-byte m/v accesses). With `c = min(1, clip / norm)` (1 without a clip):
//!   `g' = c g`, `m = b1 m + (1-b1) g'`, `v = b2 v + (1-b2) g'^2`, both rounded to bf16 and stored;
//!   the update uses the stored (rounded) moments: `p -= lr (m bc1 / (sqrt(v bc2) + eps) + wd p)`
//!   with `bc1 = 1/(1-b1^t)`, `bc2 = 1/(1-b2^t)` computed on the host in f64.
//!
//! Limits: each tensor < 2^32 - 4096 elements.

use super::*;
use crate::host::{check_target, function};
use crate::reference as r;
use rand::Rng;
use runtime::{args, Arg, LaunchConfig};
use std::time::Instant;

pub const SUMSQ_NAME: &str = "grad_sumsq_partial";
pub const NORM_NAME: &str = "grad_norm";
pub const ADAMW_NAME: &str = "adamw_step";
/// Elements per CTA of the partial sums.
pub const CHUNK: usize = 4096;

/// AdamW hyper-parameters of one step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// 1-based step number (bias correction).
    pub step: u32,
    /// Global-norm clip threshold (None: no clipping).
    pub clip: Option<f32>,
}

impl AdamWConfig {
    /// DeepSeek-V3's recipe: beta1 0.9, beta2 0.95, weight decay 0.1, eps 1e-8, clip 1.0.
    pub fn deepseek_v3(lr: f32, step: u32) -> AdamWConfig {
        AdamWConfig {
            lr,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            step,
            clip: Some(1.0),
        }
    }
    fn validate(&self) -> Result<()> {
        let ok = self.step >= 1
            && (0.0..1.0).contains(&self.beta1)
            && (0.0..1.0).contains(&self.beta2)
            && self.lr.is_finite()
            && self.eps > 0.0
            && self.weight_decay.is_finite()
            && self.clip.into_iter().all(|c| c > 0.0);
        if !ok {
            return shape_err(ADAMW_NAME, format!("bad hyper-parameters {self:?}"));
        }
        Ok(())
    }
    /// (1/(1-b1^t), 1/(1-b2^t)) in f64.
    pub fn bias_corrections(&self) -> (f64, f64) {
        let t = i32::try_from(self.step).unwrap_or(i32::MAX);
        (
            1.0 / (1.0 - f64::from(self.beta1).powi(t)),
            1.0 / (1.0 - f64::from(self.beta2).powi(t)),
        )
    }
}

/// Partial sums of squares: params (g, n, part, part0); grid ceil(n/4096) x 256.
pub fn gen_grad_sumsq(t: &Target) -> Result<ptx::Module> {
    check_target(SUMSQ_NAME, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(SUMSQ_NAME, t.clone());
    k.reqntid(&[256]);
    let g = k.param_ptr_aligned::<f32>("g", 4);
    let n = k.param::<u32>("n");
    let part = k.param_ptr_aligned::<f32>("part", 4);
    let part0 = k.param::<u32>("part0");
    let red = k.shared_array::<f32>(8, 16);
    let tid = k.tid_x();
    let cta = k.ctaid_x();
    let base = k.mul(cta, CHUNK as u32);
    let base = k.add(base, tid);
    let acc = k.mov(0f32);
    for j in 0..(CHUNK / 256) as u32 {
        let i = k.add(base, j * 256);
        let valid = k.lt(i, n);
        k.when(valid, |k| {
            let v = k.ld_nc(g.offset(i));
            k.fma_to(acc, v, v, acc);
        });
    }
    let total = cta_sum(&mut k, acc, red, 8);
    let t0 = k.eq(tid, 0u32);
    let pi = k.add(part0, cta);
    k.when(t0, |k| k.st(part.offset(pi), total));
    Ok(k.finish()?)
}

/// Final norm: params (part, nparts, out); grid 1 x 256.
pub fn gen_grad_norm(t: &Target) -> Result<ptx::Module> {
    check_target(NORM_NAME, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(NORM_NAME, t.clone());
    k.reqntid(&[256]);
    let part = k.param_ptr_aligned::<f32>("part", 4);
    let nparts = k.param::<u32>("nparts");
    let out = k.param_ptr_aligned::<f32>("out", 4);
    let red = k.shared_array::<f32>(8, 16);
    let tid = k.tid_x();
    let acc = k.mov(0f32);
    k.for_range(tid, nparts, 256u32, |k, i| {
        let v = k.ld_nc(part.offset(i));
        k.add_to(acc, acc, v);
    });
    let total = cta_sum(&mut k, acc, red, 8);
    let t0 = k.eq(tid, 0u32);
    let nrm = k.sqrt(total);
    k.when(t0, |k| k.st(out.at(0), nrm));
    Ok(k.finish()?)
}

/// Launch-constant AdamW operands of one thread.
struct AdamRegs {
    lr: Reg<f32>,
    b1: Reg<f32>,
    b2: Reg<f32>,
    omb1: Reg<f32>,
    omb2: Reg<f32>,
    eps: Reg<f32>,
    wd: Reg<f32>,
    bc1: Reg<f32>,
    bc2: Reg<f32>,
    scale: Reg<f32>,
}

/// One element's update: (p, g, m bits, v bits) -> (new p, new m bits, new v bits); the update
/// uses the bf16-rounded moments it stores.
fn adam_one(
    k: &mut KernelBuilder,
    a: &AdamRegs,
    pv: Reg<f32>,
    gv: Reg<f32>,
    mh: Reg<u16>,
    vh: Reg<u16>,
) -> (Reg<f32>, Reg<u16>, Reg<u16>) {
    let gg = k.mul(gv, a.scale);
    let m0 = bf16_to_f32(k, mh);
    let v0 = bf16_to_f32(k, vh);
    let t = k.mul(a.omb1, gg);
    let m1 = k.fma(a.b1, m0, t);
    let g2 = k.mul(gg, gg);
    let t = k.mul(a.omb2, g2);
    let v1 = k.fma(a.b2, v0, t);
    let mb = f32_to_bf16_bits(k, m1);
    let vb = f32_to_bf16_bits(k, v1);
    let mr = bf16_to_f32(k, mb);
    let vr = bf16_to_f32(k, vb);
    let mhat = k.mul(mr, a.bc1);
    let vhat = k.mul(vr, a.bc2);
    let sq = k.sqrt(vhat);
    let den = k.add(sq, a.eps);
    let upd = k.div(mhat, den);
    let tu = k.fma(a.wd, pv, upd);
    let nlr = k.neg(a.lr);
    (k.fma(nlr, tu, pv), mb, vb)
}

/// AdamW: params (p, g, m, v, norm (0 = no clip), n, lr, beta1, beta2, eps, wd, bc1, bc2, clip);
/// grid ceil(n/1024) x 256, 4 consecutive elements per thread (16-byte p/g and 8-byte m/v
/// accesses; the last partial group element by element).
pub fn gen_adamw(t: &Target) -> Result<ptx::Module> {
    check_target(ADAMW_NAME, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(ADAMW_NAME, t.clone());
    k.reqntid(&[256]);
    let p = k.param_ptr_aligned::<f32>("p", 16);
    let g = k.param_ptr_aligned::<f32>("g", 16);
    let m = k.param_ptr_aligned::<u16>("m", 8);
    let v = k.param_ptr_aligned::<u16>("v", 8);
    let norm = k.param_ptr_aligned::<f32>("norm", 4);
    let n = k.param::<u32>("n");
    let names = ["lr", "beta1", "beta2", "eps", "wd", "bc1", "bc2", "clip"];
    let [lr, b1, b2, eps, wd, bc1, bc2, clip] = names.map(|s| k.param::<f32>(s));
    let gi = k.global_index_x();
    let i = k.shl(gi, 2u32);
    let valid = k.lt(i, n);
    k.if_(valid, |k| {
        let scale = k.mov(1f32);
        let has = k.ne(norm.reg(), 0u64);
        k.if_(has, |k| {
            let nv = k.ld_nc(norm.at(0));
            let c = k.div(clip, nv);
            let s2 = k.min(scale, c);
            k.mov_to(scale, s2);
        });
        let (omb1, omb2) = (k.sub(1f32, b1), k.sub(1f32, b2));
        let a = AdamRegs {
            lr,
            b1,
            b2,
            omb1,
            omb2,
            eps,
            wd,
            bc1,
            bc2,
            scale,
        };
        let i4 = k.add(i, 4u32);
        let full = k.le(i4, n);
        k.if_else(
            full,
            |k| {
                let pv: [Reg<f32>; 4] = k.ld_v(p.offset(i));
                let gv: [Reg<f32>; 4] = k.ld_v_with(MemOpts::nc(), g.offset(i));
                let mw: [Reg<B32>; 2] = k.ld_v(m.offset(i).cast::<B32>());
                let vw: [Reg<B32>; 2] = k.ld_v(v.offset(i).cast::<B32>());
                let [m01, m23]: [[Reg<u16>; 2]; 2] = mw.map(|w| k.unpack(w));
                let [v01, v23]: [[Reg<u16>; 2]; 2] = vw.map(|w| k.unpack(w));
                let (mh, vh) = (
                    [m01[0], m01[1], m23[0], m23[1]],
                    [v01[0], v01[1], v23[0], v23[1]],
                );
                let r: [(Reg<f32>, Reg<u16>, Reg<u16>); 4] =
                    std::array::from_fn(|j| adam_one(k, &a, pv[j], gv[j], mh[j], vh[j]));
                k.st_v(p.offset(i), r.map(|x| x.0));
                let mo: [Reg<B32>; 2] = [k.pack([r[0].1, r[1].1]), k.pack([r[2].1, r[3].1])];
                let vo: [Reg<B32>; 2] = [k.pack([r[0].2, r[1].2]), k.pack([r[2].2, r[3].2])];
                k.st_v(m.offset(i).cast::<B32>(), mo);
                k.st_v(v.offset(i).cast::<B32>(), vo);
            },
            |k| {
                k.for_range(i, n, 1u32, |k, e| {
                    let pv = k.ld(p.offset(e));
                    let gv = k.ld_nc(g.offset(e));
                    let mh = k.ld(m.offset(e));
                    let vh = k.ld(v.offset(e));
                    let (p1, mb, vb) = adam_one(k, &a, pv, gv, mh, vh);
                    k.st(p.offset(e), p1);
                    k.st(m.offset(e), mb);
                    k.st(v.offset(e), vb);
                });
            },
        );
    });
    Ok(k.finish()?)
}

// ---------------------------------------------------------------------------------------------
// host wrappers

/// f32 elements of the partial-sum workspace for gradient tensors of `lens` elements.
pub fn grad_norm_workspace(lens: &[usize]) -> usize {
    lens.iter().map(|n| n.div_ceil(CHUNK)).sum::<usize>().max(1)
}

/// Global L2 norm of `grads` (f32 tensors) into `out[0]`, deterministic: one partial launch per
/// tensor, then one final launch. `workspace` holds [`grad_norm_workspace`] f32.
pub fn grad_norm(
    stream: &Stream,
    grads: &[&Buffer<f32>],
    workspace: &mut Buffer<f32>,
    out: &mut Buffer<f32>,
) -> Result<()> {
    let lens: Vec<usize> = grads.iter().map(|g| g.len()).collect();
    let nparts = grad_norm_workspace(&lens);
    need(SUMSQ_NAME, "workspace", workspace, nparts)?;
    need(NORM_NAME, "out", out, 1)?;
    let dev = stream.device();
    let f = function(dev, SUMSQ_NAME, "", gen_grad_sumsq)?;
    let mut part0 = 0usize;
    for g in grads {
        fits_u32(SUMSQ_NAME, g.len())?;
        let blocks = g.len().div_ceil(CHUNK);
        if blocks == 0 {
            continue;
        }
        let a = args![*g, g.len() as u32, &*workspace, part0 as u32];
        stream.launch(&f, &LaunchConfig::linear(blocks as u32, 256), &a)?;
        part0 += blocks;
    }
    if part0 == 0 {
        workspace.fill(0.0)?;
        part0 = 1;
    }
    let f = function(dev, NORM_NAME, "", gen_grad_norm)?;
    let a = args![&*workspace, part0 as u32, &*out];
    stream.launch(&f, &LaunchConfig::linear(1, 256), &a)?;
    Ok(())
}

/// One parameter tensor's optimiser state: FP32 master weights, FP32 gradient, BF16 moments.
pub struct ParamState<'a> {
    pub p: &'a mut Buffer<f32>,
    pub g: &'a Buffer<f32>,
    pub m: &'a mut Buffer<bf16>,
    pub v: &'a mut Buffer<bf16>,
}

/// One AdamW step on `st` (all `st.p.len()` elements); `norm` is the device buffer
/// [`grad_norm`] wrote, required when `cfg.clip` is set.
pub fn adamw_step(
    stream: &Stream,
    cfg: &AdamWConfig,
    st: ParamState<'_>,
    norm: Option<&Buffer<f32>>,
) -> Result<()> {
    cfg.validate()?;
    let n = st.p.len();
    fits_u32(ADAMW_NAME, n)?;
    need(ADAMW_NAME, "g", st.g, n)?;
    need(ADAMW_NAME, "m", st.m, n)?;
    need(ADAMW_NAME, "v", st.v, n)?;
    let (nptr, clip) = match (cfg.clip, norm) {
        (Some(c), Some(b)) => {
            need(ADAMW_NAME, "norm", b, 1)?;
            (Arg::from(b), c)
        }
        (Some(_), None) => return shape_err(ADAMW_NAME, "clip is set but no norm buffer given"),
        (None, _) => (Arg::Ptr(0), f32::INFINITY),
    };
    if n == 0 {
        return Ok(());
    }
    let f = function(stream.device(), ADAMW_NAME, "", gen_adamw)?;
    let (bc1, bc2) = cfg.bias_corrections();
    let mut a = args![&*st.p, st.g, &*st.m, &*st.v];
    a.push(nptr);
    a.extend(args![
        n as u32,
        cfg.lr,
        cfg.beta1,
        cfg.beta2,
        cfg.eps,
        cfg.weight_decay,
        bc1 as f32,
        bc2 as f32,
        clip
    ]);
    stream.launch(&f, &LaunchConfig::linear(n.div_ceil(1024) as u32, 256), &a)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// f64 reference and check

/// f64 value `want` rounded to bf16 as the kernel stored it: (value to continue with, ok,
/// boundary). `got` is accepted when it is the round-to-nearest of some value within `tol` (the
/// f32 error of computing `want`, which cancellation can make many bf16 ulps of a tiny result)
/// of `want`; elements where that interval spans more than one bf16 value count as boundary,
/// and the kernel's value is carried on to the weight update.
fn bf16_moment(got: bf16, want: f64, tol: f64) -> (f64, bool, bool) {
    let (lo, hi) = (bf16::from_f64(want - tol), bf16::from_f64(want + tol));
    let g = got.to_f64();
    if g >= lo.to_f64() && g <= hi.to_f64() {
        (g, true, lo.to_bits() != hi.to_bits())
    } else {
        (bf16::from_f64(want).to_f64(), false, false)
    }
}

/// One tensor's f64 AdamW reference against the kernel's results.
struct StepRef<'a> {
    cfg: &'a AdamWConfig,
    scale: f64,
}

impl StepRef<'_> {
    fn check(
        &self,
        c: &mut OpCheck,
        before: (&[f32], &[f32], &[bf16], &[bf16]),
        after: (&[f32], &[bf16], &[bf16]),
    ) {
        let cfg = self.cfg;
        let (b1, b2) = (f64::from(cfg.beta1), f64::from(cfg.beta2));
        let (bc1, bc2) = cfg.bias_corrections();
        let (lr, wd, eps) = (
            f64::from(cfg.lr),
            f64::from(cfg.weight_decay),
            f64::from(cfg.eps),
        );
        let (p0, g, m0, v0) = before;
        let (p1, m1, v1) = after;
        for i in 0..p0.len() {
            let gg = f64::from(g[i]) * self.scale;
            let mw = b1 * m0[i].to_f64() + (1.0 - b1) * gg;
            let vw = b2 * v0[i].to_f64() + (1.0 - b2) * gg * gg;
            // f32 slack: a few ulps of the terms (and the clip scale's f32 error)
            let mmag = b1 * m0[i].to_f64().abs() + (1.0 - b1) * gg.abs();
            let vmag = b2 * v0[i].to_f64().abs() + (1.0 - b2) * gg * gg;
            let (mr, okm, bm) = bf16_moment(m1[i], mw, 4e-6 * mmag);
            let (vr, okv, bv) = bf16_moment(v1[i], vw, 4e-6 * vmag);
            c.mismatches += (!okm) as usize + (!okv) as usize;
            c.boundary += bm as usize + bv as usize;
            let pw = f64::from(p0[i]);
            let upd = mr * bc1 / ((vr * bc2).sqrt() + eps);
            let want = pw - lr * (upd + wd * pw);
            let bound =
                2f64.powi(-23) * want.abs() + lr * 1e-5 * (upd.abs() + wd * pw.abs()) + 1e-30;
            c.bound(f64::from(p1[i]), want, bound);
        }
    }
}

/// Splits `n` elements over `tensors` random tensor lengths (each >= 1), computes the global
/// gradient norm on the device, then runs one clipped AdamW step (step 3, clip = half the norm,
/// so clipping is active) on every tensor, against f64: the norm within its f32 summation
/// slack; each moment a bf16 rounding of its f64 value +- 4e-6 x the magnitude of its terms
/// (elements where that admits more than one bf16 value count as boundary); each weight within 2^-23 relative +
/// 1e-5 lr |update|.
pub fn check_step(stream: &Stream, n: usize, tensors: usize, seed: u64) -> Result<OpCheck> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let tensors = tensors.clamp(1, n.max(1));
    let mut lens = vec![1usize; tensors];
    for _ in tensors..n {
        let j = rg.gen_range(0..tensors);
        lens[j] += 1;
    }
    let mut host = Vec::new();
    for &len in &lens {
        let g = r::random_activations(&mut rg, len, 64);
        let p: Vec<f32> = (0..len).map(|_| rg.gen_range(-1.0f32..1.0)).collect();
        let m: Vec<bf16> = (0..len)
            .map(|_| bf16::from_f32(rg.gen_range(-0.5f32..0.5)))
            .collect();
        let v: Vec<bf16> = (0..len)
            .map(|_| bf16::from_f32(rg.gen_range(0.0f32..0.5)))
            .collect();
        host.push((p, g, m, v));
    }
    let bufs: Vec<_> = host
        .iter()
        .map(|(p, g, m, v)| {
            Ok((
                dev.upload(p)?,
                dev.upload(g)?,
                dev.upload(m)?,
                dev.upload(v)?,
            ))
        })
        .collect::<Result<_>>()?;
    let mut bufs = bufs;
    let mut ws = poisoned(&dev, grad_norm_workspace(&lens), f32::NAN)?;
    let mut norm = poisoned(&dev, 1, f32::NAN)?;
    let ss: f64 = host
        .iter()
        .flat_map(|h| h.1.iter())
        .map(|g| f64::from(*g).powi(2))
        .sum();
    let norm64 = ss.sqrt();
    let mut cfg = AdamWConfig::deepseek_v3(1e-3, 3);
    cfg.clip = Some((norm64 / 2.0) as f32);
    let t0 = Instant::now();
    let grads: Vec<&Buffer<f32>> = bufs.iter().map(|b| &b.1).collect();
    grad_norm(stream, &grads, &mut ws, &mut norm)?;
    for (p, g, m, v) in bufs.iter_mut() {
        let st = ParamState { p, g, m, v };
        adamw_step(stream, &cfg, st, Some(&norm))?;
    }
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let mut c = OpCheck::default();
    let nv = f64::from(norm.to_vec()?[0]);
    let nparts = grad_norm_workspace(&lens) as f64;
    c.bound(nv, norm64, (48.0 + nparts) * 2f64.powi(-24) * norm64);
    let sref = StepRef {
        cfg: &cfg,
        scale: (f64::from(cfg.clip.unwrap_or(f32::INFINITY)) / norm64).min(1.0),
    };
    for ((p0, g, m0, v0), (pb, _, mb, vb)) in host.iter().zip(&bufs) {
        let after = (pb.to_vec()?, mb.to_vec()?, vb.to_vec()?);
        sref.check(&mut c, (p0, g, m0, v0), (&after.0, &after.1, &after.2));
    }
    Ok(c.finish(stream, seconds))
}
