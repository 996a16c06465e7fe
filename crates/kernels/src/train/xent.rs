//! Softmax cross-entropy over the vocabulary from logits [T, V] (bf16 or f32), with an ignore
//! index and label smoothing; no probability matrix is ever stored.
//!
//! With `q = eps/V + (1 - eps) onehot(label)`:
//! `loss_t = lse_t - (1 - eps) x[label] - (eps/V) sum_j x_j`, `lse_t = log sum_j exp(x_j)`,
//! `dlogits = (softmax(x) - q) * dloss_t`. Ignored tokens (label == ignore_index): loss 0 (lse is
//! still written), dlogits 0, and they are excluded from the mean's count.
//!
//! - `xent_fwd_{bf16,f32}`: one 256-thread CTA per token; thread j streams 8-column chunks
//!   j*8 + 2048i keeping an online (max, sum of exp, sum of x); (max, sum) pairs are merged by a
//!   butterfly, then the 8 warps' partials in warp order. exp is `ex2.approx` of `(x - m) log2 e`;
//!   log is `lg2.approx`.
//! - `xent_mean`: one CTA sums the per-token losses (thread-strided, then the fixed CTA tree) and
//!   divides by the host-known count of non-ignored tokens: deterministic.
//! - `xent_bwd_{bf16,f32}`: one CTA per token recomputes `p = exp(x - lse)` and writes dlogits in
//!   the logits' type. The upstream gradient is per token (`dloss [T]` f32) or, for the mean
//!   loss, a scalar `dmean / count` passed by value (no host round-trip: count is host data).
//!
//! Labels are validated on the host ([`Labels::new`]): each in [0, V) or the ignore index.
//! Limits: V a positive multiple of 8 (16-byte loads), T * V < 2^32.

use super::*;
use crate::host::{check_target, function};
use crate::reference as r;
use rand::Rng;
use runtime::{args, Arg, LaunchConfig};
use std::time::Instant;

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2: f32 = std::f32::consts::LN_2;
/// Columns one CTA pass covers (256 threads x 8).
const STEP: u32 = 2048;

pub fn fwd_name(bf: bool) -> &'static str {
    if bf {
        "xent_fwd_bf16"
    } else {
        "xent_fwd_f32"
    }
}
pub fn bwd_name(bf: bool) -> &'static str {
    if bf {
        "xent_bwd_bf16"
    } else {
        "xent_bwd_f32"
    }
}
pub const MEAN_NAME: &str = "xent_mean";

/// One cross-entropy problem's constants.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct XentSpec {
    pub vocab: usize,
    /// Labels equal to this are ignored (PyTorch: -100).
    pub ignore_index: i32,
    /// eps in [0, 1): 0 = plain cross-entropy.
    pub label_smoothing: f32,
}

/// Labels [T] on the device, validated on the host, with the count of non-ignored tokens.
pub struct Labels {
    pub buf: Buffer<i32>,
    pub tokens: usize,
    pub valid: usize,
    spec: XentSpec,
}

impl Labels {
    pub fn new(dev: &Device, labels: &[i32], spec: &XentSpec) -> Result<Labels> {
        let name = fwd_name(true);
        if spec.vocab == 0 || spec.vocab % 8 != 0 {
            return shape_err(
                name,
                format!("vocab = {} must be a positive multiple of 8", spec.vocab),
            );
        }
        if !(0.0..1.0).contains(&spec.label_smoothing) {
            return shape_err(
                name,
                format!(
                    "label_smoothing = {} must be in [0, 1)",
                    spec.label_smoothing
                ),
            );
        }
        fits_u32(name, labels.len().saturating_mul(spec.vocab))?;
        let mut valid = 0;
        for (t, &l) in labels.iter().enumerate() {
            if l == spec.ignore_index {
                continue;
            }
            if l < 0 || l as usize >= spec.vocab {
                return shape_err(
                    name,
                    format!(
                        "label {l} of token {t} is outside [0, {}) and not the ignore index {}",
                        spec.vocab, spec.ignore_index
                    ),
                );
            }
            valid += 1;
        }
        Ok(Labels {
            buf: dev.upload(labels)?,
            tokens: labels.len(),
            valid,
            spec: *spec,
        })
    }
    pub fn spec(&self) -> &XentSpec {
        &self.spec
    }
}

/// Online state of one thread: running max, sum of exp(x - max), sum of x.
struct Online {
    m: Reg<f32>,
    s: Reg<f32>,
    sx: Reg<f32>,
}

/// exp(a - b) factor that is exactly 1 when a == b (also for -inf == -inf).
fn rescale(k: &mut KernelBuilder, a: Reg<f32>, b: Reg<f32>) -> Reg<f32> {
    let d = k.sub(a, b);
    let d = k.mul(d, LOG2E);
    let e = k.ex2(d);
    let same = k.eq(a, b);
    k.selp(1f32, e, same)
}

/// Merges (om, os, osx) into `o`.
fn merge(k: &mut KernelBuilder, o: &Online, om: Reg<f32>, os: Reg<f32>, osx: Reg<f32>) {
    let nm = k.max(o.m, om);
    let fa = rescale(k, o.m, nm);
    let fb = rescale(k, om, nm);
    let a = k.mul(o.s, fa);
    k.fma_to(o.s, os, fb, a);
    k.add_to(o.sx, o.sx, osx);
    k.mov_to(o.m, nm);
}

/// Forward: params (logits, labels, loss, lse, v, ignore, smoothing); grid T x 256.
pub fn gen_xent_fwd(t: &Target, bf: bool) -> Result<ptx::Module> {
    let name = fwd_name(bf);
    check_target(name, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(name, t.clone());
    k.reqntid(&[256]);
    let x = k.param_ptr_aligned::<B32>("logits", 16);
    let labels = k.param_ptr_aligned::<i32>("labels", 4);
    let loss = k.param_ptr_aligned::<f32>("loss", 4);
    let lse_out = k.param_ptr_aligned::<f32>("lse", 4);
    let v = k.param::<u32>("v");
    let ignore = k.param::<i32>("ignore");
    let eps = k.param::<f32>("smoothing");
    let red = k.shared_array::<f32>(24, 16);
    let row = k.ctaid_x();
    let tid = k.tid_x();
    let rbase = k.mul(row, v);
    let c0 = k.shl(tid, 3u32);
    let o = Online {
        m: k.mov(f32::NEG_INFINITY),
        s: k.mov(0f32),
        sx: k.mov(0f32),
    };
    k.for_range(c0, v, STEP, |k, c| {
        let i = k.add(rbase, c);
        let xs = load8_any(k, x, i, bf);
        let cm = k.max(xs[0], xs[1]);
        for &e in &xs[2..] {
            k.max_to(cm, cm, e);
        }
        let nm = k.max(o.m, cm);
        let f = rescale(k, o.m, nm);
        k.mul_to(o.s, o.s, f);
        for &e in &xs {
            let d = k.sub(e, nm);
            let d = k.mul(d, LOG2E);
            let p = k.ex2(d);
            k.add_to(o.s, o.s, p);
            k.add_to(o.sx, o.sx, e);
        }
        k.mov_to(o.m, nm);
    });
    for d in [16u32, 8, 4, 2, 1] {
        let om = k.shfl_bfly(o.m, d);
        let os = k.shfl_bfly(o.s, d);
        let osx = k.shfl_bfly(o.sx, d);
        merge(&mut k, &o, om, os, osx);
    }
    let warp = k.shr(tid, 5u32);
    let lane = k.and(tid, 31u32);
    let l0 = k.eq(lane, 0u32);
    k.when(l0, |k| {
        k.st(red.offset(warp), o.m);
        let w8 = k.add(warp, 8u32);
        k.st(red.offset(w8), o.s);
        let w16 = k.add(warp, 16u32);
        k.st(red.offset(w16), o.sx);
    });
    k.sync_threads();
    let t0 = k.eq(tid, 0u32);
    k.if_(t0, |k| {
        let f = Online {
            m: k.ld(red.at(0)),
            s: k.ld(red.at(8)),
            sx: k.ld(red.at(16)),
        };
        for w in 1..8i64 {
            let (om, os, osx) = (k.ld(red.at(w)), k.ld(red.at(8 + w)), k.ld(red.at(16 + w)));
            merge(k, &f, om, os, osx);
        }
        let l2 = k.lg2(f.s);
        let lse = k.fma(l2, LN2, f.m);
        let lab = k.ld_nc(labels.offset(row));
        let ign = k.eq(lab, ignore);
        let lab_u: Reg<u32> = lab.reinterpret();
        let li = k.add(rbase, lab_u);
        let li = k.selp(rbase, li, ign);
        let xl = load_one(k, x, li, bf);
        let vf: Reg<f32> = k.cvt(v);
        let ev = k.div(eps, vf);
        let onem = k.sub(1f32, eps);
        let a = k.mul(onem, xl);
        let b = k.mul(ev, f.sx);
        let ab = k.add(a, b);
        let l = k.sub(lse, ab);
        let l = k.selp(0f32, l, ign);
        k.st(loss.offset(row), l);
        k.st(lse_out.offset(row), lse);
    });
    Ok(k.finish()?)
}

/// One bf16 / f32 element at index `i` as f32.
fn load_one(k: &mut KernelBuilder, x: GlobalPtr<B32>, i: Reg<u32>, bf: bool) -> Reg<f32> {
    if bf {
        let h = k.ld_nc(x.cast::<u16>().offset(i));
        bf16_to_f32(k, h)
    } else {
        k.ld_nc(x.cast::<f32>().offset(i))
    }
}

/// Backward: params (logits, labels, lse, dloss (0 = scalar), dloss_scale, dlogits, v, ignore,
/// smoothing); grid T x 256. dl_t = (dloss ? dloss[t] : 1) * dloss_scale.
pub fn gen_xent_bwd(t: &Target, bf: bool) -> Result<ptx::Module> {
    let name = bwd_name(bf);
    check_target(name, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(name, t.clone());
    k.reqntid(&[256]);
    let x = k.param_ptr_aligned::<B32>("logits", 16);
    let labels = k.param_ptr_aligned::<i32>("labels", 4);
    let lse_in = k.param_ptr_aligned::<f32>("lse", 4);
    let dloss = k.param_ptr_aligned::<f32>("dloss", 4);
    let scale = k.param::<f32>("dloss_scale");
    let dx = k.param_ptr_aligned::<B32>("dlogits", 16);
    let v = k.param::<u32>("v");
    let ignore = k.param::<i32>("ignore");
    let eps = k.param::<f32>("smoothing");
    let row = k.ctaid_x();
    let tid = k.tid_x();
    let rbase = k.mul(row, v);
    let c0 = k.shl(tid, 3u32);
    let lse = k.ld_nc(lse_in.offset(row));
    let lab = k.ld_nc(labels.offset(row));
    let ign = k.eq(lab, ignore);
    let lab_u: Reg<u32> = lab.reinterpret();
    let dl = k.mov(scale);
    let has = k.ne(dloss.reg(), 0u64);
    k.if_(has, |k| {
        let d = k.ld_nc(dloss.offset(row));
        k.mul_to(dl, dl, d);
    });
    let dl = k.selp(0f32, dl, ign);
    let vf: Reg<f32> = k.cvt(v);
    let ev = k.div(eps, vf);
    let onem = k.sub(1f32, eps);
    let hit = k.add(ev, onem);
    k.for_range(c0, v, STEP, |k, c| {
        let i = k.add(rbase, c);
        let xs = load8_any(k, x, i, bf);
        let out: [Reg<f32>; 8] = std::array::from_fn(|e| {
            let d = k.sub(xs[e], lse);
            let d = k.mul(d, LOG2E);
            let p = k.ex2(d);
            let col = k.add(c, e as u32);
            let is_l = k.eq(col, lab_u);
            let q = k.selp(hit, ev, is_l);
            let g = k.sub(p, q);
            k.mul(g, dl)
        });
        store8(k, dx, i, &out, bf);
    });
    Ok(k.finish()?)
}

/// Mean: params (loss, out, tokens, count); grid 1 x 256; out[0] = sum(loss) / count (0 if none).
pub fn gen_xent_mean(t: &Target) -> Result<ptx::Module> {
    let name = MEAN_NAME;
    check_target(name, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(name, t.clone());
    k.reqntid(&[256]);
    let loss = k.param_ptr_aligned::<f32>("loss", 4);
    let out = k.param_ptr_aligned::<f32>("out", 4);
    let tokens = k.param::<u32>("tokens");
    let count = k.param::<u32>("count");
    let red = k.shared_array::<f32>(8, 16);
    let tid = k.tid_x();
    let acc = k.mov(0f32);
    k.for_range(tid, tokens, 256u32, |k, i| {
        let l = k.ld_nc(loss.offset(i));
        k.add_to(acc, acc, l);
    });
    let total = cta_sum(&mut k, acc, red, 8);
    let t0 = k.eq(tid, 0u32);
    k.if_(t0, |k| {
        let cf: Reg<f32> = k.cvt(count);
        let m = k.div(total, cf);
        let none = k.eq(count, 0u32);
        let m = k.selp(0f32, m, none);
        k.st(out.at(0), m);
    });
    Ok(k.finish()?)
}

// ---------------------------------------------------------------------------------------------
// host wrappers

/// Forward: per-token loss [T] and lse [T] (f32) from logits [T, V].
pub fn xent_fwd<T: Elem>(
    stream: &Stream,
    labels: &Labels,
    logits: &Buffer<T>,
    loss: &mut Buffer<f32>,
    lse: &mut Buffer<f32>,
) -> Result<()> {
    let name = fwd_name(T::IS_BF16);
    let (t, sp) = (labels.tokens, labels.spec);
    need(name, "logits", logits, t * sp.vocab)?;
    need(name, "loss", loss, t)?;
    need(name, "lse", lse, t)?;
    if t == 0 {
        return Ok(());
    }
    let f = function(stream.device(), name, "", |tg| gen_xent_fwd(tg, T::IS_BF16))?;
    let a = args![
        logits,
        &labels.buf,
        &*loss,
        &*lse,
        sp.vocab as u32,
        sp.ignore_index,
        sp.label_smoothing
    ];
    stream.launch(&f, &LaunchConfig::linear(t as u32, 256), &a)?;
    Ok(())
}

/// Mean of the per-token losses over the non-ignored tokens into `out[0]` (deterministic).
pub fn xent_mean(
    stream: &Stream,
    labels: &Labels,
    loss: &Buffer<f32>,
    out: &mut Buffer<f32>,
) -> Result<()> {
    need(MEAN_NAME, "loss", loss, labels.tokens)?;
    need(MEAN_NAME, "out", out, 1)?;
    let f = function(stream.device(), MEAN_NAME, "", gen_xent_mean)?;
    let a = args![loss, &*out, labels.tokens as u32, labels.valid as u32];
    stream.launch(&f, &LaunchConfig::linear(1, 256), &a)?;
    Ok(())
}

/// Upstream gradient of the loss.
pub enum XentGrad<'a> {
    /// Of the mean loss: every non-ignored token gets `dmean / count`.
    Mean { dmean: f32 },
    /// Per token, [T] f32.
    PerToken(&'a Buffer<f32>),
}

/// Backward: dlogits [T, V] (same type as the logits) from logits, lse [T] and the upstream
/// gradient.
pub fn xent_bwd<T: Elem>(
    stream: &Stream,
    labels: &Labels,
    logits: &Buffer<T>,
    lse: &Buffer<f32>,
    grad: XentGrad<'_>,
    dlogits: &mut Buffer<T>,
) -> Result<()> {
    let name = bwd_name(T::IS_BF16);
    let (t, sp) = (labels.tokens, labels.spec);
    need(name, "logits", logits, t * sp.vocab)?;
    need(name, "lse", lse, t)?;
    need(name, "dlogits", dlogits, t * sp.vocab)?;
    let (dptr, scale) = match grad {
        XentGrad::Mean { dmean } => (Arg::Ptr(0), dmean / labels.valid.max(1) as f32),
        XentGrad::PerToken(b) => {
            need(name, "dloss", b, t)?;
            (Arg::from(b), 1.0)
        }
    };
    if t == 0 {
        return Ok(());
    }
    let f = function(stream.device(), name, "", |tg| gen_xent_bwd(tg, T::IS_BF16))?;
    let mut a = args![logits, &labels.buf, lse];
    a.push(dptr);
    a.extend(args![
        scale,
        &*dlogits,
        sp.vocab as u32,
        sp.ignore_index,
        sp.label_smoothing
    ]);
    stream.launch(&f, &LaunchConfig::linear(t as u32, 256), &a)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// f64 reference and check

/// f64 (lse, loss, sum |x|) of one row.
fn ref_row(x: &[f64], label: Option<usize>, eps: f64) -> (f64, f64, f64) {
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
    let sx: f64 = x.iter().sum();
    let sa: f64 = x.iter().map(|v| v.abs()).sum();
    let loss = match label {
        Some(l) => lse - (1.0 - eps) * x[l] - eps / x.len() as f64 * sx,
        None => 0.0,
    };
    (lse, loss, sa)
}

/// Runs forward, mean and backward on random logits (per-row magnitudes up to 2^4 x 4, about
/// one token in five ignored; outputs poisoned) for label smoothing 0.1 with per-token dloss and
/// for no smoothing with the mean-loss gradient, against f64. Bounds: lse and loss within
/// 4e-6 (1 + |lse| + |x_label|) + the f32 summation slack of eps/V sum x; the mean within the
/// mean of those bounds; dlogits within |dl| p 8e-6 (2 + |lse|) + 1e-7 |dl| (+ half a bf16 ulp).
pub fn check_xent(
    stream: &Stream,
    tokens: usize,
    vocab: usize,
    bf: bool,
    seed: u64,
) -> Result<OpCheck> {
    let mut total = OpCheck::default();
    for (i, eps) in [0.1f32, 0.0].into_iter().enumerate() {
        let c = check_once(stream, tokens, vocab, bf, eps, seed + i as u64)?;
        total.mismatches += c.mismatches;
        total.worst = total.worst.max(c.worst);
        total.rel_fro = total.rel_fro.max(c.rel_fro);
        total.seconds += c.seconds;
        total.lane_instructions = c.lane_instructions;
    }
    Ok(total)
}

fn check_once(
    stream: &Stream,
    tokens: usize,
    vocab: usize,
    bf: bool,
    eps: f32,
    seed: u64,
) -> Result<OpCheck> {
    if bf {
        run_check::<bf16>(stream, tokens, vocab, eps, seed)
    } else {
        run_check::<f32>(stream, tokens, vocab, eps, seed)
    }
}

fn run_check<T: Elem>(
    stream: &Stream,
    tokens: usize,
    vocab: usize,
    eps: f32,
    seed: u64,
) -> Result<OpCheck> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let spec = XentSpec {
        vocab,
        ignore_index: -100,
        label_smoothing: eps,
    };
    let xs: Vec<T> = r::random_activations(&mut rg, tokens * vocab, vocab)
        .into_iter()
        .map(|v| T::from_f32(4.0 * v))
        .collect();
    let lab: Vec<i32> = (0..tokens)
        .map(|t| {
            if t % 5 == 3 {
                -100
            } else {
                rg.gen_range(0..vocab as i32)
            }
        })
        .collect();
    let per_token = eps > 0.0;
    let dloss: Vec<f32> = (0..tokens).map(|_| rg.gen_range(0.5f32..1.5)).collect();
    let labels = Labels::new(&dev, &lab, &spec)?;
    let (xb, db) = (dev.upload(&xs)?, dev.upload(&dloss)?);
    let mut loss = poisoned(&dev, tokens, f32::NAN)?;
    let mut lse = poisoned(&dev, tokens, f32::NAN)?;
    let mut mean = poisoned(&dev, 1, f32::NAN)?;
    let mut dx = poisoned(&dev, tokens * vocab, T::from_f32(f32::NAN))?;
    let t0 = Instant::now();
    xent_fwd(stream, &labels, &xb, &mut loss, &mut lse)?;
    xent_mean(stream, &labels, &loss, &mut mean)?;
    let grad = if per_token {
        XentGrad::PerToken(&db)
    } else {
        XentGrad::Mean { dmean: 1.5 }
    };
    xent_bwd(stream, &labels, &xb, &lse, grad, &mut dx)?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let (lv, sv, mv, dv) = (loss.to_vec()?, lse.to_vec()?, mean.to_vec()?, dx.to_vec()?);
    let mut c = OpCheck::default();
    let e = f64::from(eps);
    let (mut msum, mut mbound) = (0f64, 0f64);
    let u = 2f64.powi(-24);
    for t in 0..tokens {
        let row: Vec<f64> = xs[t * vocab..(t + 1) * vocab]
            .iter()
            .map(|v| v.to_f64())
            .collect();
        let label = (lab[t] >= 0).then_some(lab[t] as usize);
        let (lw, lossw, sa) = ref_row(&row, label, e);
        let xl = label.map_or(0.0, |l| row[l].abs());
        let bound = 4e-6 * (1.0 + lw.abs() + xl)
            + e / vocab as f64 * (vocab as f64 / 2048.0 + 16.0) * u * sa;
        c.bound(f64::from(sv[t]), lw, bound);
        c.bound(f64::from(lv[t]), lossw, bound);
        msum += lossw;
        mbound += bound;
        let dl = match (label, per_token) {
            (None, _) => 0.0,
            (Some(_), true) => f64::from(dloss[t]),
            (Some(_), false) => f64::from(1.5f32 / labels.valid as f32),
        };
        for j in 0..vocab {
            let p = (row[j] - lw).exp();
            let q = e / vocab as f64 + if label == Some(j) { 1.0 - e } else { 0.0 };
            let want = (p - q) * dl;
            let slack = dl.abs() * (p * 8e-6 * (2.0 + lw.abs()) + 1e-7) + 1e-30;
            let got = dv[t * vocab + j].to_f64();
            if T::IS_BF16 {
                c.bf16(half::bf16::from_f64(got), want, slack);
            } else {
                c.bound(got, want, slack);
            }
        }
    }
    let n = labels.valid.max(1) as f64;
    c.bound(
        f64::from(mv[0]),
        msum / n,
        mbound / n + 1e-6 * (msum / n).abs(),
    );
    Ok(c.finish(stream, seconds))
}
