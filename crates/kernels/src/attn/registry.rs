//! Registry entries of the attention kernels and their checks against the f64 references
//! (run by [`crate::registry::KernelInfo::check`] for `Kind::Attn`).
//!
//! Shape encoding: training kernels use `m` = longest sequence, `n` = d_v, `k` = d_qk,
//! `groups` = batch (ragged lengths drawn from the seed, the first one = `m`, 2 heads);
//! decoding uses `m` = longest cached length, `n` = kv_lora_rank (d_v), `k` = d_v + 64 (d_k),
//! `groups` = batch.

use super::bwd::{self, BwdArgs, BwdSpec};
use super::decode::{self, DecodeArgs, DecodeShape, DecodeSpec};
use super::fwd::{self, AttnShape, FwdArgs, FwdSpec};
use super::reference::RefProblem;
use crate::reference::{self as r, rel_fro};
use crate::registry::{CheckReport, KernelInfo, Kind, ParamInfo, Shape};
use crate::Result;
use builder::Target;
use half::bf16;
use rand::Rng;
use runtime::{Buffer, Device, Pod, Stream};
use std::time::Instant;

/// The attention kernel a registry entry stands for.
#[derive(Clone, Debug)]
pub enum AttnKind {
    Fwd(FwdSpec),
    BwdPre,
    BwdDkdv(BwdSpec),
    BwdDq(BwdSpec),
    Decode(DecodeSpec),
    Combine,
}

fn params(v: &[(&'static str, &'static str)]) -> Vec<ParamInfo> {
    v.iter().map(|&(name, ty)| ParamInfo { name, ty }).collect()
}

/// The registered attention kernels.
pub fn registry_entries() -> Vec<KernelInfo> {
    let mut v = Vec::new();
    // (d_qk, d_v, shared RoPE key width, shapes): V3's 192/128 both with K concatenated and
    // with its 64-wide RoPE key passed once for all heads
    let cases = [
        (32u32, 32u32, 0u32, vec![Shape::grouped(77, 32, 32, 3)]),
        (192, 128, 0, vec![Shape::grouped(70, 128, 192, 2)]),
        (192, 128, 64, vec![Shape::grouped(45, 128, 192, 2)]),
        (256, 256, 0, vec![Shape::grouped(40, 256, 256, 2)]),
    ];
    let fwd_cases = &cases;
    for (wgmma, (dqk, dv, rope, shapes)) in fwd_cases
        .iter()
        .map(|c| (false, c.clone()))
        .chain(fwd_cases.iter().map(|c| (true, c.clone())))
    {
        let s = FwdSpec {
            d_qk: dqk,
            d_v: dv,
            wgmma,
            k_rope: rope,
        };
        let how = if wgmma {
            "sm_90a TMA + 2-stage mbarrier ring (producer warp) and wgmma m64 (Q/K/V by 128B-swizzle descriptors, P from registers)"
        } else {
            "mma.sync"
        };
        v.push(KernelInfo {
            name: s.name(),
            summary: format!(
                "MLA attention training forward, causal varlen FlashAttention-2, {how} (d_qk {dqk}, d_v {dv}{}; 64 q rows x {} keys per tile), O bf16 + LSE f32",
                rope_note(rope),
                s.bn()
            ),
            params: params(s.params()),
            launch: s.launch_rule(),
            targets: s.targets(),
            host: "attn::fwd::mla_attn_fwd",
            test_shapes: shapes,
            kind: Kind::Attn(AttnKind::Fwd(s)),
        });
    }
    v.push(KernelInfo {
        name: bwd::PRE_NAME.into(),
        summary:
            "MLA attention backward preprocessing: delta = rowsum(dO * O) per (token, head), f32"
                .into(),
        params: params(bwd::PRE_PARAMS),
        launch: "rows = total*heads; grid = ceil(rows/8), block = 256 (one warp per row)".into(),
        targets: super::TARGETS,
        host: "attn::bwd::mla_attn_bwd",
        test_shapes: vec![Shape::grouped(50, 128, 192, 2)],
        kind: Kind::Attn(AttnKind::BwdPre),
    });
    let bwd_cases = cases
        .iter()
        .map(|c| (false, c.clone()))
        .chain(cases.iter().map(|c| (true, c.clone())));
    for (wgmma, (dqk, dv, rope, shapes)) in bwd_cases {
        let s = BwdSpec {
            d_qk: dqk,
            d_v: dv,
            k_rope: rope,
            wgmma,
        };
        let how = if wgmma {
            ", sm_90a TMA (producer warp, 2-stage mbarrier ring) + wgmma"
        } else {
            ""
        };
        v.push(KernelInfo {
            name: s.dkdv_name(),
            summary: format!(
                "MLA attention backward dK/dV (d_qk {dqk}, d_v {dv}{}{how}): 64 keys per CTA, {}-query tiles from the diagonal, P from the LSE, {} {} per 16 keys",
                rope_note(rope),
                s.bq(),
                s.splits(),
                if wgmma { "warpgroup(s) (dK/dV columns split)" } else { "warp(s)" }
            ),
            params: params(&s.dkdv_params()),
            launch: format!(
                "grid = (ceil(max_seqlen/{}), heads, batch), block = {}, dynamic shared = {} bytes",
                bwd::BKV,
                s.dkdv_threads(),
                s.dkdv_shared()
            ),
            targets: s.targets(),
            host: "attn::bwd::mla_attn_bwd",
            test_shapes: shapes.clone(),
            kind: Kind::Attn(AttnKind::BwdDkdv(s)),
        });
        v.push(KernelInfo {
            name: s.dq_name(),
            summary: format!(
                "MLA attention backward dQ (d_qk {dqk}, d_v {dv}{}{how}): 64 queries per CTA, 32-key tiles up to the diagonal (deterministic, no atomics)",
                rope_note(rope)
            ),
            params: params(&s.dq_params()),
            launch: format!(
                "grid = (ceil(max_seqlen/{}), heads, batch), block = {}, dynamic shared = {} bytes",
                bwd::BM_DQ,
                s.dq_threads(),
                s.dq_shared()
            ),
            targets: s.targets(),
            host: "attn::bwd::mla_attn_bwd",
            test_shapes: shapes,
            kind: Kind::Attn(AttnKind::BwdDq(s)),
        });
    }
    v.extend(decode_entries());
    v
}

/// The registered decoding kernels and the combine kernel.
fn decode_entries() -> Vec<KernelInfo> {
    let mut v = Vec::new();
    for (d_v, rg, stages, shapes) in [
        (64u32, 1u32, 1u32, vec![Shape::grouped(150, 64, 128, 3)]),
        (64, 1, 2, vec![Shape::grouped(150, 64, 128, 3)]),
        (512, 1, 1, vec![Shape::grouped(100, 512, 576, 2)]),
        (512, 1, 2, vec![Shape::grouped(100, 512, 576, 2)]),
        (512, 4, 1, vec![Shape::grouped(130, 512, 576, 2)]),
        (512, 4, 2, vec![Shape::grouped(130, 512, 576, 2)]),
    ] {
        let s = DecodeSpec {
            d_v,
            d_rope: 64,
            row_groups: rg,
            stages,
        };
        v.push(KernelInfo {
            name: s.name(),
            summary: format!(
                "FlashMLA-style absorbed MLA decoding, paged cache (block 64, d_k {} = {d_v} latent + 64 rope, V = latent), {} query rows per CTA, {} cache block(s) in flight, split-KV partials f32",
                s.d_k(),
                16 * rg,
                stages
            ),
            params: params(DecodeSpec::params()),
            launch: s.launch_rule(),
            targets: s.targets(),
            host: "attn::decode::mla_decode",
            test_shapes: shapes,
            kind: Kind::Attn(AttnKind::Decode(s)),
        });
    }
    v.push(KernelInfo {
        name: decode::COMBINE_NAME.into(),
        summary:
            "MLA decoding split-KV combine: LSE-weighted sum of the f32 partials -> bf16 O, f32 LSE"
                .into(),
        params: params(decode::COMBINE_PARAMS),
        launch: "grid = ceil(batch*s_q*heads/8), block = 256 (one warp per row)".into(),
        targets: super::TARGETS,
        host: "attn::decode::mla_decode",
        test_shapes: vec![Shape::grouped(150, 64, 128, 3)],
        kind: Kind::Attn(AttnKind::Combine),
    });
    v
}

fn rope_note(rope: u32) -> String {
    if rope == 0 {
        String::new()
    } else {
        format!(", RoPE key [total, {rope}] shared by the heads")
    }
}

/// Generates the kernel of `a` for `t`.
pub fn generate(a: &AttnKind, t: &Target) -> Result<ptx::Module> {
    match a {
        AttnKind::Fwd(s) => fwd::gen_fwd(t, s),
        AttnKind::BwdPre => bwd::gen_pre(t),
        AttnKind::BwdDkdv(s) => bwd::gen_dkdv(t, s),
        AttnKind::BwdDq(s) => bwd::gen_dq(t, s),
        AttnKind::Decode(s) => decode::gen_decode(t, s),
        AttnKind::Combine => decode::gen_combine(t),
    }
}

/// Causal attention FLOPs of a packed batch: 2 (d_qk + d_v) per (query, visible key), per head.
pub fn causal_flops(lens: &[usize], heads: usize, d_qk: usize, d_v: usize) -> f64 {
    let pairs: f64 = lens.iter().map(|&n| (n * (n + 1) / 2) as f64).sum();
    2.0 * pairs * heads as f64 * (d_qk + d_v) as f64
}

/// FLOPs of one launch at the registered shape (lengths as drawn by the check).
pub fn flops(a: &AttnKind, s: &Shape) -> f64 {
    match a {
        AttnKind::Fwd(_) => causal_flops(&vec![s.m; s.groups.max(1)], CHECK_HEADS, s.k, s.n),
        // dK/dV: S, dP, dV, dK (4 products); dQ: S, dP, dQ (3)
        AttnKind::BwdDkdv(_) => {
            2.0 * causal_flops(&vec![s.m; s.groups.max(1)], CHECK_HEADS, s.k, s.n)
        }
        AttnKind::BwdDq(_) => {
            1.5 * causal_flops(&vec![s.m; s.groups.max(1)], CHECK_HEADS, s.k, s.n)
        }
        AttnKind::BwdPre | AttnKind::Combine => 0.0,
        // QK^T over d_k and PV over d_v, per (row, cached token)
        AttnKind::Decode(d) => {
            let rows = (DECODE_S_Q * DECODE_HEADS_PER_GROUP * d.row_groups as usize) as f64;
            2.0 * rows * (s.m * s.groups.max(1)) as f64 * (s.k + s.n) as f64
        }
    }
}

pub const CHECK_HEADS: usize = 2;

/// Ragged lengths for a check: the first = `max`, the others random in [1, max].
pub fn random_lens(rg: &mut impl Rng, max: usize, batch: usize) -> Vec<usize> {
    (0..batch.max(1))
        .map(|i| if i == 0 { max } else { rg.gen_range(1..=max) })
        .collect()
}

/// bf16 values (device) and their f64 values (reference), uniform in [-amp, amp).
pub fn random_bf16(rg: &mut impl Rng, len: usize, amp: f32) -> (Vec<bf16>, Vec<f64>) {
    let b: Vec<bf16> = (0..len)
        .map(|_| bf16::from_f32(rg.gen_range(-amp..amp)))
        .collect();
    let f = b.iter().map(|x| x.to_f64()).collect();
    (b, f)
}

pub fn poisoned<T: Pod>(dev: &Device, len: usize, v: T) -> Result<Buffer<T>> {
    let b = dev.alloc::<T>(len.max(1))?;
    b.fill(v)?;
    Ok(b)
}

pub fn nan_bf16() -> bf16 {
    bf16::from_bits(0x7fc1)
}

/// LSE values off by more than 1e-3 (absolute) from the reference, or not finite.
pub fn lse_mismatches(got: &[f32], want: &[f64]) -> usize {
    got.iter()
        .zip(want)
        .filter(|(g, w)| !g.is_finite() || (**g as f64 - **w).abs() > 1e-3)
        .count()
}

fn to_f64<T: Copy + Into<f64>>(v: &[T]) -> Vec<f64> {
    v.iter().map(|&x| x.into()).collect()
}

pub fn bf16_f64(v: &[bf16]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Error summary of one output: (relative Frobenius error, NaN count).
pub fn compare(got: &[f64], want: &[f64]) -> (f64, usize) {
    let nans = got.iter().filter(|x| !x.is_finite()).count();
    let rel = if nans > 0 {
        f64::INFINITY
    } else {
        rel_fro(got, want)
    };
    (rel, nans)
}

/// A random packed training problem (2 heads, scale 1/sqrt(d_qk), |q|,|k| < 2, |v| < 1).
pub struct TrainProblem {
    pub sh: AttnShape,
    pub p: RefProblem,
    pub lens: Vec<usize>,
    pub total: usize,
    pub q: (Vec<bf16>, Vec<f64>),
    /// device K (`[total, heads, d_qk - k_rope]`) and the reference's per-head K
    pub k: (Vec<bf16>, Vec<f64>),
    /// the shared RoPE key `[total, k_rope]` (with `sh.k_rope > 0`)
    pub k_rope: Option<Vec<bf16>>,
    pub v: (Vec<bf16>, Vec<f64>),
}

impl TrainProblem {
    pub fn random(s: &Shape, seed: u64) -> TrainProblem {
        let mut rg = r::rng(seed);
        let lens = random_lens(&mut rg, s.m, s.groups);
        Self::with_lens(&mut rg, lens, s.k, s.n)
    }
    pub fn with_lens(rg: &mut impl Rng, lens: Vec<usize>, d_qk: usize, d_v: usize) -> TrainProblem {
        let heads = CHECK_HEADS;
        let mut cu = vec![0usize];
        for &l in &lens {
            cu.push(cu.last().unwrap_or(&0) + l);
        }
        let total = *cu.last().unwrap_or(&0);
        let scale = 1.0 / (d_qk as f32).sqrt();
        let sh = AttnShape {
            heads,
            d_qk,
            d_v,
            scale,
            max_seqlen: lens.iter().copied().max().unwrap_or(0),
            k_rope: 0,
        };
        // |q|, |k| up to 2 so the softmax is far from uniform
        let q = random_bf16(rg, total * heads * d_qk, 2.0);
        let k = random_bf16(rg, total * heads * d_qk, 2.0);
        let v = random_bf16(rg, total * heads * d_v, 1.0);
        let p = RefProblem {
            cu,
            heads,
            d_qk,
            d_v,
            scale: scale as f64,
        };
        TrainProblem {
            sh,
            p,
            lens,
            total,
            q,
            k,
            k_rope: None,
            v,
        }
    }
    /// The same problem with MLA's RoPE key shared by the heads: head 0's last `rope` key
    /// columns become `k_rope` `[total, rope]`, the device K keeps the other columns per head,
    /// and the reference K broadcasts the shared part to every head (`rope` 0: unchanged).
    pub fn with_shared_rope(mut self, rope: usize) -> TrainProblem {
        if rope == 0 {
            return self;
        }
        let (h, d) = (self.sh.heads, self.sh.d_qk);
        let nope = d - rope;
        let shared: Vec<bf16> = (0..self.total)
            .flat_map(|t| self.k.0[t * h * d + nope..][..rope].to_vec())
            .collect();
        let mut dev = Vec::with_capacity(self.total * h * nope);
        let mut reference = Vec::with_capacity(self.total * h * d);
        for t in 0..self.total {
            for hh in 0..h {
                let row = &self.k.0[(t * h + hh) * d..][..d];
                dev.extend_from_slice(&row[..nope]);
                reference.extend(row[..nope].iter().map(|x| x.to_f64()));
                reference.extend(shared[t * rope..][..rope].iter().map(|x| x.to_f64()));
            }
        }
        self.k = (dev, reference);
        self.k_rope = Some(shared);
        self.sh.k_rope = rope;
        self
    }
    pub fn cu_i32(&self) -> Vec<i32> {
        self.p.cu.iter().map(|&x| x as i32).collect()
    }
}

/// Device outputs of the forward.
pub struct FwdOut {
    pub o: Vec<bf16>,
    pub lse: Vec<f32>,
    pub seconds: f64,
}

/// Runs the forward of `tp` on `stream` with poisoned outputs.
pub fn run_fwd(stream: &Stream, tp: &TrainProblem, wgmma: bool) -> Result<FwdOut> {
    let dev = stream.device().clone();
    let (q, k, v) = (
        dev.upload(&tp.q.0)?,
        dev.upload(&tp.k.0)?,
        dev.upload(&tp.v.0)?,
    );
    let kr = match &tp.k_rope {
        Some(x) => Some(dev.upload(x)?),
        None => None,
    };
    let cu = dev.upload(&tp.cu_i32())?;
    let mut o = poisoned(&dev, tp.total * tp.sh.heads * tp.sh.d_v, nan_bf16())?;
    let mut lse = poisoned(&dev, tp.total * tp.sh.heads, f32::NAN)?;
    let t0 = Instant::now();
    fwd::mla_attn_fwd_with(
        stream,
        &tp.sh,
        FwdArgs {
            q: &q,
            k: &k,
            k_rope: kr.as_ref(),
            v: &v,
            cu_seqlens: &cu,
            o: &mut o,
            lse: &mut lse,
        },
        wgmma,
    )?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    Ok(FwdOut {
        o: o.to_vec()?,
        lse: lse.to_vec()?,
        seconds,
    })
}

/// Checks the forward: O (bf16) relative Frobenius error <= 1e-2 and every LSE within 1e-3
/// (absolute) of the f64 reference; NaNs (unwritten outputs) fail.
fn check_fwd(
    stream: &Stream,
    info: &KernelInfo,
    f: &FwdSpec,
    s: &Shape,
    seed: u64,
) -> Result<CheckReport> {
    let tp = TrainProblem::random(s, seed).with_shared_rope(f.k_rope as usize);
    let out = run_fwd(stream, &tp, f.wgmma)?;
    let want = tp.p.forward(&tp.q.1, &tp.k.1, &tp.v.1);
    let (rel, nans) = compare(&bf16_f64(&out.o), &want.o);
    let bad_lse = lse_mismatches(&out.lse, &want.lse);
    let tol = 1e-2;
    Ok(CheckReport {
        kernel: info.name.clone(),
        shape: *s,
        mismatches: nans + bad_lse,
        rel_err: rel,
        rel_err_rounded: rel,
        // element-wise relative errors: not computed by this checker
        max_rel_err: f64::NAN,
        mean_rel_err: f64::NAN,
        tolerance: tol,
        pass: nans + bad_lse == 0 && rel <= tol,
        seconds: out.seconds,
        flops: causal_flops(&tp.lens, tp.sh.heads, tp.sh.d_qk, tp.sh.d_v),
        lane_instructions: stream.last_stats().map(|st| st.lane_instructions),
    })
}

/// Runs the check of an attention entry.
pub fn check(
    stream: &Stream,
    info: &KernelInfo,
    a: &AttnKind,
    s: &Shape,
    seed: u64,
) -> Result<CheckReport> {
    match a {
        AttnKind::Fwd(f) => check_fwd(stream, info, f, s, seed),
        AttnKind::Decode(d) => check_decode(stream, info, d, s, seed),
        AttnKind::Combine => {
            let d = DecodeSpec {
                d_v: s.n as u32,
                d_rope: (s.k - s.n) as u32,
                row_groups: 1,
                stages: 1,
            };
            check_decode(stream, info, &d, s, seed)
        }
        _ => check_bwd(stream, info, a, s, seed),
    }
}

/// Device outputs of the backward.
pub struct BwdOut {
    pub dq: Vec<bf16>,
    pub dk: Vec<bf16>,
    pub dv: Vec<bf16>,
    pub delta: Vec<f32>,
    pub o: Vec<bf16>,
    pub seconds: f64,
}

/// Runs forward then backward of `tp` with upstream gradient `dout` (outputs poisoned); the
/// backward's dK/dV and dQ kernels are the `wgmma` ones when `wgmma`.
pub fn run_bwd(stream: &Stream, tp: &TrainProblem, dout: &[bf16], wgmma: bool) -> Result<BwdOut> {
    let dev = stream.device().clone();
    let (q, k, v) = (
        dev.upload(&tp.q.0)?,
        dev.upload(&tp.k.0)?,
        dev.upload(&tp.v.0)?,
    );
    let kr = match &tp.k_rope {
        Some(x) => Some(dev.upload(x)?),
        None => None,
    };
    let cu = dev.upload(&tp.cu_i32())?;
    let rows = tp.total * tp.sh.heads;
    let (nq, nv) = (rows * tp.sh.d_qk, rows * tp.sh.d_v);
    let mut o = poisoned(&dev, nv, nan_bf16())?;
    let mut lse = poisoned(&dev, rows, f32::NAN)?;
    fwd::mla_attn_fwd(
        stream,
        &tp.sh,
        FwdArgs {
            q: &q,
            k: &k,
            k_rope: kr.as_ref(),
            v: &v,
            cu_seqlens: &cu,
            o: &mut o,
            lse: &mut lse,
        },
    )?;
    let dob = dev.upload(dout)?;
    let mut delta = poisoned(&dev, rows, f32::NAN)?;
    let mut dq = poisoned(&dev, nq, nan_bf16())?;
    let mut dk = poisoned(&dev, nq, nan_bf16())?;
    let mut dvb = poisoned(&dev, nv, nan_bf16())?;
    stream.synchronize()?;
    let t0 = Instant::now();
    bwd::mla_attn_bwd_with(
        stream,
        &tp.sh,
        BwdArgs {
            q: &q,
            k: &k,
            k_rope: kr.as_ref(),
            v: &v,
            o: &o,
            lse: &lse,
            dout: &dob,
            cu_seqlens: &cu,
            delta: &mut delta,
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dvb,
        },
        wgmma,
        &mut |_| {},
    )?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    Ok(BwdOut {
        dq: dq.to_vec()?,
        dk: dk.to_vec()?,
        dv: dvb.to_vec()?,
        delta: delta.to_vec()?,
        o: o.to_vec()?,
        seconds,
    })
}

/// Checks a backward kernel (the whole backward runs; the entry's own outputs are compared):
/// the pre-pass's delta against rowsum(dO * O) of the device O (relative error <= 1e-5),
/// dK/dV or dQ against the f64 backward (relative Frobenius error <= 2e-2 each).
fn check_bwd(
    stream: &Stream,
    info: &KernelInfo,
    a: &AttnKind,
    s: &Shape,
    seed: u64,
) -> Result<CheckReport> {
    let (rope, wgmma) = match a {
        AttnKind::BwdDkdv(b) | AttnKind::BwdDq(b) => (b.k_rope as usize, b.wgmma),
        _ => (0, false),
    };
    let tp = TrainProblem::random(s, seed).with_shared_rope(rope);
    let mut rg = r::rng(seed ^ 0x5eed);
    let dout = random_bf16(&mut rg, tp.total * tp.sh.heads * tp.sh.d_v, 1.0);
    let out = run_bwd(stream, &tp, &dout.0, wgmma)?;
    let lane_instructions = stream.last_stats().map(|st| st.lane_instructions);
    let (rel, nans, tol) = match a {
        AttnKind::BwdPre => {
            let o = bf16_f64(&out.o);
            let want: Vec<f64> = o
                .chunks(tp.sh.d_v)
                .zip(dout.1.chunks(tp.sh.d_v))
                .map(|(x, y)| x.iter().zip(y).map(|(a, b)| a * b).sum())
                .collect();
            let (rel, nans) = compare(&to_f64(&out.delta), &want);
            (rel, nans, 1e-5)
        }
        _ => {
            let want = tp.p.backward(&tp.q.1, &tp.k.1, &tp.v.1, &dout.1);
            let pairs: Vec<(&[bf16], &[f64])> = match a {
                AttnKind::BwdDq(_) => vec![(&out.dq, &want.dq)],
                _ => vec![(&out.dk, &want.dk), (&out.dv, &want.dv)],
            };
            let mut worst = (0f64, 0usize);
            for (g, w) in pairs {
                let (r, n) = compare(&bf16_f64(g), w);
                worst = (worst.0.max(r), worst.1 + n);
            }
            (worst.0, worst.1, 2e-2)
        }
    };
    let flops = match a {
        AttnKind::BwdPre => 0.0,
        _ => 2.5 * causal_flops(&tp.lens, tp.sh.heads, tp.sh.d_qk, tp.sh.d_v),
    };
    Ok(CheckReport {
        kernel: info.name.clone(),
        shape: *s,
        mismatches: nans,
        rel_err: rel,
        rel_err_rounded: rel,
        // element-wise relative errors: not computed by this checker
        max_rel_err: f64::NAN,
        mean_rel_err: f64::NAN,
        tolerance: tol,
        pass: nans == 0 && rel <= tol,
        seconds: out.seconds,
        flops,
        lane_instructions,
    })
}

/// Query tokens per sequence and heads per 16-row group in the decoding checks.
pub(crate) const DECODE_S_Q: usize = 2;
pub(crate) const DECODE_HEADS_PER_GROUP: usize = 8;

/// A random paged decoding problem: lengths in [s_q, max] (the first = max), every sequence's
/// blocks at random places of a cache with spare blocks, table entries past a sequence's end
/// poisoned (never read).
pub struct DecodeProblem {
    pub sh: DecodeShape,
    pub lens: Vec<usize>,
    pub table: Vec<i32>,
    pub q: (Vec<bf16>, Vec<f64>),
    pub kv: (Vec<bf16>, Vec<f64>),
}

impl DecodeProblem {
    pub fn random(
        rg: &mut impl Rng,
        sh0: DecodeShape,
        max_len: usize,
        batch: usize,
    ) -> DecodeProblem {
        let mut lens = random_lens(rg, max_len, batch);
        for l in lens.iter_mut() {
            *l = (*l).max(sh0.s_q);
        }
        let max_blocks = max_len.div_ceil(64) + 1;
        let used: usize = lens.iter().map(|l| l.div_ceil(64)).sum();
        let num_blocks = used + 3;
        let mut perm: Vec<i32> = (0..num_blocks as i32).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, rg.gen_range(0..=i));
        }
        let mut table = vec![i32::MAX; batch * max_blocks];
        let mut next = 0;
        for (b, l) in lens.iter().enumerate() {
            for j in 0..l.div_ceil(64) {
                table[b * max_blocks + j] = perm[next];
                next += 1;
            }
        }
        let sh = DecodeShape {
            num_blocks,
            max_blocks,
            ..sh0
        };
        let dk = sh.d_v + sh.d_rope;
        let q = random_bf16(rg, batch * sh.s_q * sh.heads * dk, 1.0);
        let kv = random_bf16(rg, num_blocks * 64 * dk, 1.0);
        DecodeProblem {
            sh,
            lens,
            table,
            q,
            kv,
        }
    }

    /// f64 reference (O, LSE).
    pub fn reference(&self) -> (Vec<f64>, Vec<f64>) {
        let dk = self.sh.d_v + self.sh.d_rope;
        let mb = self.sh.max_blocks;
        let kvf = |b: usize, pos: usize| -> Vec<f64> {
            let blk = self.table[b * mb + pos / 64] as usize;
            self.kv.1[(blk * 64 + pos % 64) * dk..][..dk].to_vec()
        };
        let rd = super::reference::RefDecode {
            s_q: self.sh.s_q,
            heads: self.sh.heads,
            d_k: dk,
            d_v: self.sh.d_v,
            scale: self.sh.scale as f64,
            kv: &kvf,
        };
        rd.run(&self.q.1, &self.lens)
    }

    /// Runs decoding with `spec` (outputs and workspaces poisoned): (O, LSE, seconds).
    pub fn run(&self, stream: &Stream, spec: &DecodeSpec) -> Result<(Vec<bf16>, Vec<f32>, f64)> {
        let dev = stream.device().clone();
        let batch = self.lens.len();
        let rows = batch * self.sh.s_q * self.sh.heads;
        let splits = decode::choose_splits(&self.sh, batch, stream.sm_count());
        let (wo, wl) = decode::workspace_len(&self.sh, batch, splits);
        let q = dev.upload(&self.q.0)?;
        let kv = dev.upload(&self.kv.0)?;
        let table = dev.upload(&self.table)?;
        let lens: Vec<i32> = self.lens.iter().map(|&l| l as i32).collect();
        let lens = dev.upload(&lens)?;
        let mut o_part = poisoned(&dev, wo, f32::NAN)?;
        let mut lse_part = poisoned(&dev, wl, f32::NAN)?;
        let mut o = poisoned(&dev, rows * self.sh.d_v, nan_bf16())?;
        let mut lse = poisoned(&dev, rows, f32::NAN)?;
        let t0 = Instant::now();
        decode::mla_decode_with(
            stream,
            spec,
            &self.sh,
            DecodeArgs {
                q: &q,
                kv_cache: &kv,
                block_table: &table,
                seqlens: &lens,
                o_part: &mut o_part,
                lse_part: &mut lse_part,
                o: &mut o,
                lse: &mut lse,
            },
        )?;
        stream.synchronize()?;
        let secs = t0.elapsed().as_secs_f64();
        Ok((o.to_vec()?, lse.to_vec()?, secs))
    }
}

/// Checks decoding (split kernel + combine) with 3 splits: O relative Frobenius error <= 1e-2,
/// every LSE within 1e-3 of the f64 reference.
fn check_decode(
    stream: &Stream,
    info: &KernelInfo,
    d: &DecodeSpec,
    s: &Shape,
    seed: u64,
) -> Result<CheckReport> {
    let mut rg = r::rng(seed);
    let sh0 = DecodeShape {
        heads: DECODE_HEADS_PER_GROUP * d.row_groups as usize,
        s_q: DECODE_S_Q,
        d_v: d.d_v as usize,
        d_rope: d.d_rope as usize,
        scale: 1.0 / 192f32.sqrt(),
        num_blocks: 0,
        max_blocks: 0,
        num_splits: 3,
    };
    let dp = DecodeProblem::random(&mut rg, sh0, s.m, s.groups.max(1));
    let (o, lse, seconds) = dp.run(stream, d)?;
    let lane_instructions = stream.last_stats().map(|st| st.lane_instructions);
    let (wo, wl) = dp.reference();
    let (rel, nans) = compare(&bf16_f64(&o), &wo);
    let bad = lse_mismatches(&lse, &wl);
    let tol = 1e-2;
    let rows = (dp.sh.s_q * dp.sh.heads) as f64;
    let tokens: usize = dp.lens.iter().sum();
    Ok(CheckReport {
        kernel: info.name.clone(),
        shape: *s,
        mismatches: nans + bad,
        rel_err: rel,
        rel_err_rounded: rel,
        // element-wise relative errors: not computed by this checker
        max_rel_err: f64::NAN,
        mean_rel_err: f64::NAN,
        tolerance: tol,
        pass: nans + bad == 0 && rel <= tol,
        seconds,
        flops: 2.0 * rows * tokens as f64 * (2 * dp.sh.d_v + dp.sh.d_rope) as f64,
        lane_instructions,
    })
}
