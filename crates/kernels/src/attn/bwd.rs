//! Training backward of MLA attention (FlashAttention-2 style, P recomputed from the LSE), in
//! three deterministic launches (no atomics):
//!
//! 1. `mla_attn_bwd_pre`: `delta[row] = sum_c dO[row, c] * O[row, c]` (one warp per (token, head)).
//! 2. `mla_attn_bwd_dkdv_*`: a CTA per (64-key tile, head, sequence) keeps K and V in shared
//!    memory and loops over the 32-row (16 when d_qk + d_v > 256) query tiles at or after the
//!    diagonal: S^T = K Q^T,
//!    P^T = 2^(S^T c - lse), dP^T = V dO^T, dS^T = P^T (dP^T - delta); dV += P^T dO and
//!    dK += dS^T Q accumulate in registers (warp = 16 keys; with `d_qk + d_v` > 320 the
//!    accumulator columns are split over 2 warps per key group, S^T and dP^T recomputed by both).
//! 3. `mla_attn_bwd_dq_*`: a CTA per 64-row query tile keeps Q and dO in shared memory and loops
//!    over 32-key tiles up to the diagonal: dQ += dS K in registers.
//!
//! Layouts as the forward (the shared RoPE key too; dK stays per head); `delta` is an f32
//! `[total, heads]` workspace.

use super::fwd::{qk_tile, AttnShape};
use super::*;
use crate::host::{check_target, function};
use half::bf16;
use runtime::{args, LaunchConfig, Stream};

/// Keys per dK/dV CTA (4 key groups of 16).
pub const BKV: u32 = 64;
/// Query rows per dQ CTA (4 warps x 16) and keys per tile of its loop.
pub const BM_DQ: u32 = 64;
pub const BN_DQ: u32 = 32;

/// One generated backward configuration (head dims compiled in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct BwdSpec {
    pub d_qk: u32,
    pub d_v: u32,
    /// shared RoPE key width (see [`super::fwd::FwdSpec::k_rope`]); 0 = K concatenated
    pub k_rope: u32,
    /// sm_90a variant: every product as a warpgroup `wgmma` ([`super::bwd90`])
    pub wgmma: bool,
}

impl BwdSpec {
    /// The kernels of a head-dim pair with K concatenated per head.
    pub fn new(d_qk: u32, d_v: u32) -> BwdSpec {
        BwdSpec {
            d_qk,
            d_v,
            k_rope: 0,
            wgmma: false,
        }
    }
    fn tag(&self) -> String {
        let w = if self.wgmma { "_wgmma" } else { "" };
        let r = rope_tag(self.k_rope);
        format!("{w}_qk{}_v{}{r}", self.d_qk, self.d_v)
    }
    pub fn dkdv_name(&self) -> String {
        format!("mla_attn_bwd_dkdv{}", self.tag())
    }
    pub fn dq_name(&self) -> String {
        format!("mla_attn_bwd_dq{}", self.tag())
    }
    /// Targets of the dK/dV and dQ kernels (`wgmma`: sm_90a only).
    pub fn targets(&self) -> &'static [&'static str] {
        if self.wgmma {
            &["sm_90a"]
        } else {
            TARGETS
        }
    }
    /// Column splits of the dK/dV accumulators (keeps them within the register file).
    pub fn splits(&self) -> u32 {
        if self.d_qk + self.d_v > 320 {
            2
        } else {
            1
        }
    }
    /// Queries per tile of the dK/dV loop: 16 when d_qk + d_v > 256 (the transposed score,
    /// dP and per-column statistics registers shrink by half next to the large dK/dV
    /// accumulators; ptxas spills some pairs at 32), else 32.
    pub fn bq(&self) -> u32 {
        if self.d_qk + self.d_v > 256 {
            16
        } else {
            32
        }
    }
    pub fn dkdv_threads(&self) -> u32 {
        4 * self.splits() * 32
    }
    pub fn dkdv_shared(&self) -> u32 {
        let (q, v) = (self.d_qk, self.d_v);
        let bq = self.bq();
        tile_bytes(BKV, q) + tile_bytes(BKV, v) + tile_bytes(bq, q) + tile_bytes(bq, v)
    }
    pub fn dq_shared(&self) -> u32 {
        let (q, v) = (self.d_qk, self.d_v);
        tile_bytes(BM_DQ, q) + tile_bytes(BM_DQ, v) + tile_bytes(BN_DQ, q) + tile_bytes(BN_DQ, v)
    }
    pub fn dkdv_params() -> &'static [(&'static str, &'static str)] {
        &[
            ("q", "bf16*"),
            ("k", "bf16*"),
            ("k_rope", "bf16* (k_rope > 0)"),
            ("v", "bf16*"),
            ("dout", "bf16*"),
            ("lse", "f32*"),
            ("delta", "f32*"),
            ("cu_seqlens", "i32*"),
            ("dk", "bf16*"),
            ("dv", "bf16*"),
            ("heads", "u32"),
            ("scale_log2", "f32"),
            ("scale", "f32"),
        ]
    }
    pub fn dq_params() -> &'static [(&'static str, &'static str)] {
        &[
            ("q", "bf16*"),
            ("k", "bf16*"),
            ("k_rope", "bf16* (k_rope > 0)"),
            ("v", "bf16*"),
            ("dout", "bf16*"),
            ("lse", "f32*"),
            ("delta", "f32*"),
            ("cu_seqlens", "i32*"),
            ("dq", "bf16*"),
            ("heads", "u32"),
            ("scale_log2", "f32"),
            ("scale", "f32"),
        ]
    }
}

pub const PRE_NAME: &str = "mla_attn_bwd_pre";
pub const PRE_PARAMS: &[(&str, &str)] = &[
    ("o", "bf16*"),
    ("dout", "bf16*"),
    ("delta", "f32*"),
    ("rows", "u32"),
    ("d_v", "u32"),
];

/// `delta[row] = sum dO[row] * O[row]`: one warp per row, 8 warps per CTA.
pub fn gen_pre(t: &Target) -> Result<ptx::Module> {
    check_target(PRE_NAME, t, TARGETS)?;
    let mut k = KernelBuilder::new(PRE_NAME, t.clone());
    k.reqntid(&[256]);
    let op = k.param_ptr_aligned::<u8>("o", 16);
    let dp = k.param_ptr_aligned::<u8>("dout", 16);
    let delta = k.param_ptr_aligned::<f32>("delta", 4);
    let rows = k.param::<u32>("rows");
    let dv = k.param::<u32>("d_v");
    let tid = k.tid_x();
    let lane = k.and(tid, 31u32);
    let w = k.shr(tid, 5u32);
    let bx = k.ctaid_x();
    let row = k.mad_lo(bx, 8u32, w);
    let out = k.ge(row, rows);
    k.when(out, |k| k.exit());
    let rb = k.mul(dv, 2u32);
    let roff = k.mul_wide(row, rb);
    let chunks = k.shr(dv, 3u32);
    let acc = k.mov(0f32);
    k.for_range(lane, chunks, 32u32, |k, c| {
        let c16 = k.mul_wide(c, 16u32);
        let off = k.add(roff, c16);
        let a = k.add(op.reg(), off);
        let b = k.add(dp.reg(), off);
        let x: [Reg<B32>; 4] = k.ld_v(GlobalPtr::<B32>::from_reg(a));
        let y: [Reg<B32>; 4] = k.ld_v(GlobalPtr::<B32>::from_reg(b));
        for i in 0..4 {
            let xs = crate::tile::bf16x2_to_f32(k, x[i]);
            let ys = crate::tile::bf16x2_to_f32(k, y[i]);
            for j in 0..2 {
                k.fma_to(acc, xs[j], ys[j], acc);
            }
        }
    });
    let mut sum = acc;
    for d in [16u32, 8, 4, 2, 1] {
        let o = k.shfl_bfly(sum, d);
        sum = k.add(sum, o);
    }
    let l0 = k.eq(lane, 0u32);
    k.when(l0, |k| k.st(delta.offset(row), sum));
    Ok(k.finish()?)
}

/// Common kernel prologue: (start, len, head) of this CTA's sequence.
pub(super) struct Seq {
    pub start: Reg<u32>,
    pub len: Reg<u32>,
    pub h: Reg<u32>,
    pub heads: Reg<u32>,
}

impl Seq {
    pub(super) fn load(k: &mut KernelBuilder, cup: GlobalPtr<i32>, heads: Reg<u32>) -> Seq {
        let (h, b) = (k.ctaid_y(), k.ctaid_z());
        let st = k.ld_nc(cup.offset(b));
        let b1 = k.add(b, 1u32);
        let en = k.ld_nc(cup.offset(b1));
        let start: Reg<u32> = st.reinterpret();
        let en: Reg<u32> = en.reinterpret();
        let len = k.sub(en, start);
        Seq {
            start,
            len,
            h,
            heads,
        }
    }
    /// (token, head) row index of sequence row `r`.
    pub(super) fn row(&self, k: &mut KernelBuilder, r: Reg<u32>) -> Reg<u32> {
        let t = k.add(self.start, r);
        k.mad_lo(t, self.heads, self.h)
    }
    pub(super) fn ptr(
        &self,
        k: &mut KernelBuilder,
        p: GlobalPtr<u8>,
        r: Reg<u32>,
        d: u32,
    ) -> Reg<u64> {
        let gr = self.row(k, r);
        wide_off(k, p.reg(), gr, d * 2)
    }
}

/// Parameters shared by the dK/dV and dQ kernels.
pub(super) struct BwdParams {
    pub q: GlobalPtr<u8>,
    pub k: KSrc,
    pub v: GlobalPtr<u8>,
    pub dout: GlobalPtr<u8>,
    pub lse: GlobalPtr<f32>,
    pub delta: GlobalPtr<f32>,
    pub cu: GlobalPtr<i32>,
}

pub(super) fn declare_common(k: &mut KernelBuilder, rope: u32) -> BwdParams {
    BwdParams {
        q: k.param_ptr_aligned::<u8>("q", 16),
        k: KSrc {
            k: k.param_ptr_aligned::<u8>("k", 16),
            k_rope: k.param_ptr_aligned::<u8>("k_rope", 16),
            rope,
        },
        v: k.param_ptr_aligned::<u8>("v", 16),
        dout: k.param_ptr_aligned::<u8>("dout", 16),
        lse: k.param_ptr_aligned::<f32>("lse", 4),
        delta: k.param_ptr_aligned::<f32>("delta", 4),
        cu: k.param_ptr_aligned::<i32>("cu_seqlens", 4),
    }
}

/// `lse * log2(e)` and `delta` of sequence row `r` (clamped to the sequence).
pub(super) fn row_stats(
    k: &mut KernelBuilder,
    sq: &Seq,
    p: &BwdParams,
    r: Reg<u32>,
) -> (Reg<f32>, Reg<f32>) {
    let last = k.sub(sq.len, 1u32);
    let rc = k.min(r, last);
    let gr = sq.row(k, rc);
    let l = k.ld(p.lse.offset(gr));
    let l2 = k.mul(l, LOG2E);
    let d = k.ld(p.delta.offset(gr));
    (l2, d)
}

/// P = 2^(s c - lse2) and dS = P (dP - delta) in place (`s` -> P, `dp` -> dS), with
/// `stats(n, e)` the (lse2, delta) of element e of n-tile n.
pub(super) fn p_and_ds(
    k: &mut KernelBuilder,
    s: &[[Reg<f32>; 4]],
    dp: &[[Reg<f32>; 4]],
    c: Reg<f32>,
    stats: &dyn Fn(usize, usize) -> (Reg<f32>, Reg<f32>),
) {
    for (n, (a, b)) in s.iter().zip(dp).enumerate() {
        for e in 0..4 {
            let (l2, d) = stats(n, e);
            let nl = k.neg(l2);
            let x = k.fma(a[e], c, nl);
            let p = k.ex2(x);
            k.mov_to(a[e], p);
            let t = k.sub(b[e], d);
            k.mul_to(b[e], p, t);
        }
    }
}

/// `acc[n] += A x B` with A from accumulator-layout registers `a` (16 rows x 16*len/2 k) and
/// B from the [k][n] tile `tb` (k rows from 0), `ntiles` n-tiles starting at chunk `c0`.
fn acc_times_tile(
    k: &mut KernelBuilder,
    ln: &Lanes,
    a: &[[Reg<f32>; 4]],
    tb: &Tile,
    c0: u32,
    ntiles: u32,
    acc: &[[Reg<f32>; 4]],
) {
    for kk in 0..a.len() / 2 {
        let af = acc_to_a(k, a[2 * kk], a[2 * kk + 1]);
        let b = ld_b_trans(k, ln, tb, 16 * kk as u32, c0, ntiles);
        for (n, bb) in b.iter().enumerate() {
            k.mma_to::<Mma>(acc[n], af, *bb, acc[n]);
        }
    }
}

/// Stores 16 rows x `acc.len()*8` columns (starting at column `col0`) of `acc * scale` as bf16
/// into rows `row_ptr(r)` for this lane's rows `rows` when `< len`.
pub(super) fn store_rows(
    k: &mut KernelBuilder,
    ln: &Lanes,
    acc: &[[Reg<f32>; 4]],
    scale: Option<Reg<f32>>,
    rows: [Reg<u32>; 2],
    len: Reg<u32>,
    col0: u32,
    row_ptr: &dyn Fn(&mut KernelBuilder, Reg<u32>) -> Reg<u64>,
) {
    let col = k.shl(ln.q, 2u32);
    let col = k.add(col, col0 * 2);
    let col64: Reg<u64> = k.cvt(col);
    for h in 0..2 {
        let ok = k.lt(rows[h], len);
        let p = row_ptr(k, rows[h]);
        let p = k.add(p, col64);
        k.if_(ok, |k| {
            for (n, a) in acc.iter().enumerate() {
                let (mut v0, mut v1) = (a[2 * h], a[2 * h + 1]);
                if let Some(s) = scale {
                    v0 = k.mul(v0, s);
                    v1 = k.mul(v1, s);
                }
                let w = k.cvt_bf16x2(v1, v0);
                let pp = GlobalPtr::<u8>::from_reg(p).add_bytes(16 * n as i64);
                k.st(pp.cast::<Bf16x2>(), w);
            }
        });
    }
}

/// (query, lse * log2 e, delta) of this lane's accumulator columns `q0 + 8n + 2q + e` of a
/// transposed score tile; queries past the end get lse = +inf (P = 0).
pub(super) fn column_stats(
    k: &mut KernelBuilder,
    sq: &Seq,
    p: &BwdParams,
    q0: Reg<u32>,
    col_q: Reg<u32>,
    bq: u32,
) -> Vec<(Reg<u32>, Reg<f32>, Reg<f32>)> {
    let mut stats = Vec::new();
    for n in 0..bq / 8 {
        for e in 0..2u32 {
            let qc = k.add(q0, col_q);
            let qc = k.add(qc, 8 * n + e);
            let (l2, d) = row_stats(k, sq, p, qc);
            let past = k.ge(qc, sq.len);
            let l2 = k.selp(f32::INFINITY, l2, past);
            stats.push((qc, l2, d));
        }
    }
    stats
}

/// Causal mask of a transposed (keys x queries) score tile: `-inf` where the query precedes the key.
pub(super) fn mask_transposed(
    k: &mut KernelBuilder,
    st: &[[Reg<f32>; 4]],
    stats: &[(Reg<u32>, Reg<f32>, Reg<f32>)],
    krows: [Reg<u32>; 2],
) {
    for (n, a) in st.iter().enumerate() {
        for e in 0..4 {
            let bad = k.lt(stats[2 * n + (e & 1)].0, krows[e >> 1]);
            let v = k.selp(f32::NEG_INFINITY, a[e], bad);
            k.mov_to(a[e], v);
        }
    }
}

/// Target, head dims and RoPE width of a backward spec.
fn check_spec(name: &str, t: &Target, s: &BwdSpec) -> Result<()> {
    check_target(name, t, s.targets())?;
    check_head_dim(name, "d_qk", s.d_qk as usize)?;
    check_head_dim(name, "d_v", s.d_v as usize)?;
    check_k_rope(name, s.d_qk as usize, s.k_rope as usize)
}

/// Generates the dK/dV kernel.
pub fn gen_dkdv(t: &Target, s: &BwdSpec) -> Result<ptx::Module> {
    let name = s.dkdv_name();
    check_spec(&name, t, s)?;
    if s.wgmma {
        return super::bwd90::gen_dkdv(t, s);
    }
    let (dqk, dv, sp, bq) = (s.d_qk, s.d_v, s.splits(), s.bq());
    let nt = s.dkdv_threads();
    let mut k = KernelBuilder::new(&name, t.clone());
    k.reqntid(&[nt]);
    k.maxnreg(255); // (without it ptxas trades registers for small spills on some head dims)
    let p = declare_common(&mut k, s.k_rope);
    let dkp = k.param_ptr_aligned::<u8>("dk", 4);
    let dvp = k.param_ptr_aligned::<u8>("dv", 4);
    let heads = k.param::<u32>("heads");
    let c = k.param::<f32>("scale_log2");
    let scale = k.param::<f32>("scale");
    let smem = k.dynamic_shared::<u8>(128);
    let tid = k.tid_x();
    let lane = k.and(tid, 31u32);
    let warp = k.shr(tid, 5u32);
    let kg = k.and(warp, 3u32);
    let half = k.shr(warp, 2u32);
    let ln = Lanes::new(&mut k, lane);
    let sq = Seq::load(&mut k, p.cu, heads);
    let bx = k.ctaid_x();
    let kv0 = k.mul(bx, BKV);
    let done = k.ge(kv0, sq.len);
    k.when(done, |k| k.exit());
    let [tk, tv, tq, tdo] = tiles(
        &mut k,
        smem.reg(),
        [(BKV, dqk), (BKV, dv), (bq, dqk), (bq, dv)],
    );
    let sqs = k.mul(heads, dqk * 2);
    let svs = k.mul(heads, dv * 2);
    let kvalid = k.sub(sq.len, kv0);
    let tok0 = k.add(sq.start, kv0);
    load_k(&mut k, tid, nt, &tk, &p.k, (tok0, heads, sq.h), kvalid);
    let src = sq.ptr(&mut k, p.v, kv0, dv);
    load_tile(&mut k, tid, nt, &tv, src, svs, kvalid);
    k.cp_async_commit_group();
    // this warp's key rows and accumulator column slices
    let wrow = k.mul(kg, 16u32);
    let r0 = k.add(kv0, wrow);
    let r0 = k.add(r0, ln.g);
    let krows = [r0, k.add(r0, 8u32)];
    let (nk, nv) = (dqk / 8 / sp, dv / 8 / sp);
    let dk = zero_acc(&mut k, nk as usize);
    let dva = zero_acc(&mut k, nv as usize);
    let st = zero_acc(&mut k, (bq / 8) as usize);
    let dpt = zero_acc(&mut k, (bq / 8) as usize);
    let col_q = k.shl(ln.q, 1u32);
    let it0 = k.div(kv0, bq);
    let iend = k.add(sq.len, bq - 1);
    let iend = k.div(iend, bq);
    k.for_range(it0, iend, 1u32, |k, it| {
        let q0 = k.mul(it, bq);
        let qvalid = k.sub(sq.len, q0);
        let src = sq.ptr(k, p.q, q0, dqk);
        load_tile(k, tid, nt, &tq, src, sqs, qvalid);
        let src = sq.ptr(k, p.dout, q0, dv);
        load_tile(k, tid, nt, &tdo, src, svs, qvalid);
        k.cp_async_commit_group();
        let stats = column_stats(k, &sq, &p, q0, col_q, bq);
        k.cp_async_wait_group(0);
        k.sync_threads();
        clear(k, &st);
        clear(k, &dpt);
        qk_tile(k, &ln, &tk, Some(wrow), &tq, dqk, bq, &st);
        mask_transposed(k, &st, &stats, krows);
        qk_tile(k, &ln, &tv, Some(wrow), &tdo, dv, bq, &dpt);
        let get = |n: usize, e: usize| {
            let s = stats[2 * n + (e & 1)];
            (s.1, s.2)
        };
        p_and_ds(k, &st, &dpt, c, &get);
        for hf in 0..sp {
            let sel = k.eq(half, hf);
            k.if_(sel, |k| {
                acc_times_tile(k, &ln, &st, &tdo, hf * nv, nv, &dva);
                acc_times_tile(k, &ln, &dpt, &tq, hf * nk, nk, &dk);
            });
        }
        k.sync_threads();
    });
    for hf in 0..sp {
        let sel = k.eq(half, hf);
        k.if_(sel, |k| {
            let kp = |k: &mut KernelBuilder, r: Reg<u32>| sq.ptr(k, dkp, r, dqk);
            store_rows(k, &ln, &dk, Some(scale), krows, sq.len, hf * nk * 8, &kp);
            let vp = |k: &mut KernelBuilder, r: Reg<u32>| sq.ptr(k, dvp, r, dv);
            store_rows(k, &ln, &dva, None, krows, sq.len, hf * nv * 8, &vp);
        });
    }
    Ok(k.finish()?)
}

/// Generates the dQ kernel.
pub fn gen_dq(t: &Target, s: &BwdSpec) -> Result<ptx::Module> {
    let name = s.dq_name();
    check_spec(&name, t, s)?;
    if s.wgmma {
        return super::bwd90::gen_dq(t, s);
    }
    let (dqk, dv) = (s.d_qk, s.d_v);
    let nt = 128;
    let mut k = KernelBuilder::new(&name, t.clone());
    k.reqntid(&[nt]);
    k.maxnreg(255); // (without it ptxas trades registers for small spills on some head dims)
    let p = declare_common(&mut k, s.k_rope);
    let dqp = k.param_ptr_aligned::<u8>("dq", 4);
    let heads = k.param::<u32>("heads");
    let c = k.param::<f32>("scale_log2");
    let scale = k.param::<f32>("scale");
    let smem = k.dynamic_shared::<u8>(128);
    let tid = k.tid_x();
    let lane = k.and(tid, 31u32);
    let warp = k.shr(tid, 5u32);
    let ln = Lanes::new(&mut k, lane);
    let sq = Seq::load(&mut k, p.cu, heads);
    let bx = k.ctaid_x();
    let q0 = k.mul(bx, BM_DQ);
    let done = k.ge(q0, sq.len);
    k.when(done, |k| k.exit());
    let [tq, tdo, tk, tv] = tiles(
        &mut k,
        smem.reg(),
        [(BM_DQ, dqk), (BM_DQ, dv), (BN_DQ, dqk), (BN_DQ, dv)],
    );
    let sqs = k.mul(heads, dqk * 2);
    let svs = k.mul(heads, dv * 2);
    let qvalid = k.sub(sq.len, q0);
    let src = sq.ptr(&mut k, p.q, q0, dqk);
    load_tile(&mut k, tid, nt, &tq, src, sqs, qvalid);
    let src = sq.ptr(&mut k, p.dout, q0, dv);
    load_tile(&mut k, tid, nt, &tdo, src, svs, qvalid);
    k.cp_async_commit_group();
    let wrow = k.mul(warp, 16u32);
    let r0 = k.add(q0, wrow);
    let r0 = k.add(r0, ln.g);
    let rows = [r0, k.add(r0, 8u32)];
    let st: Vec<(Reg<f32>, Reg<f32>)> = rows
        .iter()
        .map(|&r| row_stats(&mut k, &sq, &p, r))
        .collect();
    let dq = zero_acc(&mut k, (dqk / 8) as usize);
    let s_acc = zero_acc(&mut k, (BN_DQ / 8) as usize);
    let dp = zero_acc(&mut k, (BN_DQ / 8) as usize);
    let col_q = k.shl(ln.q, 1u32);
    let qe = k.add(q0, BM_DQ);
    let kend = k.min(qe, sq.len);
    let ntiles = k.add(kend, BN_DQ - 1);
    let ntiles = k.div(ntiles, BN_DQ);
    k.for_range(0u32, ntiles, 1u32, |k, j| {
        let kv0 = k.mul(j, BN_DQ);
        let kvalid = k.sub(sq.len, kv0);
        let tok0 = k.add(sq.start, kv0);
        load_k(k, tid, nt, &tk, &p.k, (tok0, heads, sq.h), kvalid);
        let src = sq.ptr(k, p.v, kv0, dv);
        load_tile(k, tid, nt, &tv, src, svs, kvalid);
        k.cp_async_commit_group();
        k.cp_async_wait_group(0);
        k.sync_threads();
        clear(k, &s_acc);
        clear(k, &dp);
        qk_tile(k, &ln, &tq, Some(wrow), &tk, dqk, BN_DQ, &s_acc);
        let kv_end = k.add(kv0, BN_DQ);
        let diag = k.gt(kv_end, q0);
        k.if_(diag, |k| {
            super::fwd::causal_mask(k, &s_acc, kv0, col_q, rows)
        });
        qk_tile(k, &ln, &tdo, Some(wrow), &tv, dv, BN_DQ, &dp);
        let get = |_n: usize, e: usize| st[e >> 1];
        p_and_ds(k, &s_acc, &dp, c, &get);
        acc_times_tile(k, &ln, &dp, &tk, 0, dqk / 8, &dq);
        k.sync_threads();
    });
    let qp = |k: &mut KernelBuilder, r: Reg<u32>| sq.ptr(k, dqp, r, dqk);
    store_rows(&mut k, &ln, &dq, Some(scale), rows, sq.len, 0, &qp);
    Ok(k.finish()?)
}

/// Device buffers of the backward.
pub struct BwdArgs<'a> {
    pub q: &'a Buffer<bf16>,
    pub k: &'a Buffer<bf16>,
    /// the shared RoPE key (with `AttnShape::k_rope > 0`); dK stays per head
    /// `[total, heads, d_qk]`: the shared key's gradient is the sum over heads of its last
    /// `k_rope` columns
    pub k_rope: Option<&'a Buffer<bf16>>,
    pub v: &'a Buffer<bf16>,
    /// forward output and its log-sum-exp
    pub o: &'a Buffer<bf16>,
    pub lse: &'a Buffer<f32>,
    /// upstream gradient of O
    pub dout: &'a Buffer<bf16>,
    pub cu_seqlens: &'a Buffer<i32>,
    /// f32 workspace `[total, heads]` (rowsum(dO * O))
    pub delta: &'a mut Buffer<f32>,
    pub dq: &'a mut Buffer<bf16>,
    pub dk: &'a mut Buffer<bf16>,
    pub dv: &'a mut Buffer<bf16>,
}

/// Runs the backward (three launches, deterministic): dQ, dK, dV in the layouts of Q, K, V.
pub fn mla_attn_bwd(stream: &Stream, sh: &AttnShape, a: BwdArgs) -> Result<()> {
    mla_attn_bwd_observed(stream, sh, a, &mut |_| {})
}

/// [`mla_attn_bwd`] calling `after(kernel name)` after each of its launches is queued
/// (benchmarks read the emulator's per-launch statistics there).
///
/// On an sm_90a device the dK/dV and dQ launches are the `wgmma` kernels, elsewhere the
/// `mma.sync` ones.
pub fn mla_attn_bwd_observed(
    stream: &Stream,
    sh: &AttnShape,
    a: BwdArgs,
    after: &mut dyn FnMut(&str),
) -> Result<()> {
    let wgmma = crate::host::target_for(stream.device()).arch == "sm_90a";
    mla_attn_bwd_with(stream, sh, a, wgmma, after)
}

/// [`mla_attn_bwd_observed`] choosing the dK/dV and dQ variant (`wgmma` needs an sm_90a
/// device).
pub fn mla_attn_bwd_with(
    stream: &Stream,
    sh: &AttnShape,
    a: BwdArgs,
    wgmma: bool,
    after: &mut dyn FnMut(&str),
) -> Result<()> {
    let spec = BwdSpec {
        d_qk: sh.d_qk as u32,
        d_v: sh.d_v as u32,
        k_rope: sh.k_rope as u32,
        wgmma,
    };
    let name = spec.dkdv_name();
    sh.validate(&name)?;
    let cu = check_cu_seqlens(&name, a.cu_seqlens, sh.max_seqlen, sh.heads)?;
    let total = *cu.last().unwrap_or(&0) as usize;
    let batch = cu.len() - 1;
    let (rq, rv, rows) = (
        total * sh.heads * sh.d_qk,
        total * sh.heads * sh.d_v,
        total * sh.heads,
    );
    for (w, b, l) in [
        ("q", a.q, rq),
        ("v", a.v, rv),
        ("o", a.o, rv),
        ("dout", a.dout, rv),
    ] {
        need(&name, w, b, l)?;
    }
    check_k_buffers(&name, a.k, a.k_rope, (total, sh.heads, sh.d_qk, sh.k_rope))?;
    need(&name, "lse", a.lse, rows)?;
    need(&name, "delta", a.delta, rows)?;
    need(&name, "dq", a.dq, rq)?;
    need(&name, "dk", a.dk, rq)?;
    need(&name, "dv", a.dv, rv)?;
    if total == 0 || sh.max_seqlen == 0 {
        return Ok(());
    }
    let dev = stream.device();
    let f = function(dev, PRE_NAME, "", gen_pre)?;
    let cfg = LaunchConfig::grid3([rows.div_ceil(8) as u32, 1, 1], [256, 1, 1]);
    stream.launch(
        &f,
        &cfg,
        &args![a.o, a.dout, &*a.delta, rows as u32, sh.d_v as u32],
    )?;
    after(PRE_NAME);
    let (c, sc, h) = (sh.scale * LOG2E, sh.scale, sh.heads as u32);
    let f = function(dev, &name, "", |t| gen_dkdv(t, &spec))?;
    let grid = [sh.max_seqlen.div_ceil(BKV as usize) as u32, h, batch as u32];
    let cfg = LaunchConfig::grid3(grid, [spec.dkdv_threads(), 1, 1]).shared(spec.dkdv_shared());
    stream.launch(
        &f,
        &cfg,
        &args![
            a.q,
            a.k,
            a.k_rope.unwrap_or(a.k),
            a.v,
            a.dout,
            a.lse,
            &*a.delta,
            a.cu_seqlens,
            &*a.dk,
            &*a.dv,
            h,
            c,
            sc
        ],
    )?;
    after(&name);
    let f = function(dev, &spec.dq_name(), "", |t| gen_dq(t, &spec))?;
    let grid = [
        sh.max_seqlen.div_ceil(BM_DQ as usize) as u32,
        h,
        batch as u32,
    ];
    let cfg = LaunchConfig::grid3(grid, [128, 1, 1]).shared(spec.dq_shared());
    stream.launch(
        &f,
        &cfg,
        &args![
            a.q,
            a.k,
            a.k_rope.unwrap_or(a.k),
            a.v,
            a.dout,
            a.lse,
            &*a.delta,
            a.cu_seqlens,
            &*a.dq,
            h,
            c,
            sc
        ],
    )?;
    after(&spec.dq_name());
    Ok(())
}
