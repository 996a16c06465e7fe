//! The sm_90a backward kernels `mla_attn_bwd_{dkdv,dq}_wgmma_*`: the math of [`super::bwd`]'s
//! `mma.sync` kernels (same tiles, loop bounds, masks, P from the LSE, deterministic stores)
//! with every product as a warpgroup `wgmma` reading the panel tiles through 128B-swizzle
//! descriptors (the layout of [`super::fwd90`]); loads stay `cp.async` (+ `fence.proxy.async`
//! before the tiles are read by wgmma), one copy then compute per tile as in the `mma.sync`
//! kernels.
//!
//! - dK/dV: `splits` warpgroups (1, or 2 when d_qk + d_v > 320) per 64-key CTA. Per query tile
//!   each warpgroup computes S^T = K Q^T (`wgmma m64n{bq}k16`, K and Q K-major) and dP^T =
//!   V dO^T, then P^T and dS^T in registers (the wgmma accumulator layout equals the per-warp
//!   `mma.sync` one, so the masks and statistics are shared), then dV += P^T dO and dK += dS^T Q
//!   as `wgmma m64n{cols}k16` with A from registers and dO / Q MN-major descriptors; with 2
//!   warpgroups each owns a panel-aligned half of the dK and dV columns ([`col_split`]).
//! - dQ: one warpgroup per 64-query CTA; per 32-key tile S = Q K^T, dP = dO V^T (`m64n32k16`),
//!   P and dS in registers, dQ += dS K (`m64n{d_qk}k16`, K MN-major).

use super::bwd::{
    column_stats, declare_common, mask_transposed, p_and_ds, row_stats, store_rows, BwdSpec, Seq,
    BKV, BM_DQ, BN_DQ,
};
use super::fwd90::panel_desc;
use super::*;

/// `acc = A B^T` (`overwrite`) or `acc += A B^T` over `d` columns with `wgmma m64n{n}k16`: A the
/// 64-row panel tile at `a`, B the `n`-row panel tile at `b`, both K-major.
fn ss_wgmma(
    k: &mut KernelBuilder,
    (a, b): (&Tile, &Tile),
    d: u32,
    acc: &[[Reg<f32>; 4]],
    preds: (Reg<Pred>, Reg<Pred>),
) {
    let flat: Vec<Reg<f32>> = acc.iter().flatten().copied().collect();
    k.wgmma_fence();
    for ks in 0..d / 16 {
        let off = |rows: u32| (ks / 4) * rows * ROW_BYTES + (ks % 4) * 32;
        let ad = panel_desc(k, a.base, a.rows, off(a.rows));
        let bd = panel_desc(k, b.base, b.rows, off(b.rows));
        let scale_d = if ks == 0 { preds.0 } else { preds.1 };
        k.wgmma_mma_async::<Bf16>(b.rows as u16, &flat, ad, bd, scale_d, false, false);
    }
    k.wgmma_commit_group();
    k.wgmma_wait_group(0);
}

/// `acc += A B` with `wgmma m64n{n}k16`: A (64 x 16 * `a.len() / 2`) from accumulator-layout
/// registers, B columns `c0..c0 + n` of the [k][n] panel tile `b` (MN-major; `c0` a multiple
/// of 64, so the descriptor starts on a panel).
fn rs_wgmma(
    k: &mut KernelBuilder,
    a: &[[Reg<f32>; 4]],
    b: &Tile,
    (c0, n): (u32, u32),
    acc: &[[Reg<f32>; 4]],
    always: Reg<Pred>,
) {
    let flat: Vec<Reg<f32>> = acc.iter().flatten().copied().collect();
    k.wgmma_fence();
    for kk in 0..a.len() / 2 {
        let af = acc_to_a(k, a[2 * kk], a[2 * kk + 1]);
        let af: [Reg<B32>; 4] = af.map(|x| x.reinterpret());
        let start = (c0 / 64) * b.rows * ROW_BYTES + kk as u32 * 16 * ROW_BYTES;
        let bd = panel_desc(k, b.base, b.rows, start);
        k.wgmma_mma_async_rs::<Bf16>(n as u16, &flat, af, bd, always, true);
    }
    k.wgmma_commit_group();
    k.wgmma_wait_group(0);
}

/// Column ranges `(c0, n)` of a `d`-wide accumulator owned by each of `sp` warpgroups: all of
/// it for one; for two, the first ceil(panels / 2) 64-column panels and the rest (n may be 0).
pub(crate) fn col_split(d: u32, sp: u32) -> Vec<(u32, u32)> {
    if sp == 1 {
        return vec![(0, d)];
    }
    let c = (64 * d.div_ceil(64).div_ceil(2)).min(d);
    vec![(0, c), (c, d - c)]
}

/// (false, true) predicates (wgmma's scale-d: overwrite / accumulate).
fn preds(k: &mut KernelBuilder) -> (Reg<Pred>, Reg<Pred>) {
    let zero = k.mov(0u32);
    (k.ne(zero, 0u32), k.eq(zero, 0u32))
}

/// Waits for this thread's copies and makes every thread's tile writes visible to wgmma (the
/// async proxy).
fn tiles_ready(k: &mut KernelBuilder) {
    k.cp_async_wait_group(0);
    k.fence_proxy_async();
    k.sync_threads();
}

/// Generates the wgmma dK/dV kernel (`s.wgmma`; checked by the caller).
pub(crate) fn gen_dkdv(t: &Target, s: &BwdSpec) -> Result<ptx::Module> {
    let (dqk, dv, sp, bq) = (s.d_qk, s.d_v, s.splits(), s.bq());
    let nt = s.dkdv_threads();
    let mut k = KernelBuilder::new(&s.dkdv_name(), t.clone());
    k.reqntid(&[nt]);
    k.maxnreg(255);
    let p = declare_common(&mut k, s.k_rope);
    let dkp = k.param_ptr_aligned::<u8>("dk", 4);
    let dvp = k.param_ptr_aligned::<u8>("dv", 4);
    let heads = k.param::<u32>("heads");
    let c = k.param::<f32>("scale_log2");
    let scale = k.param::<f32>("scale");
    let smem = k.dynamic_shared::<u8>(1024);
    let tid = k.tid_x();
    let lane = k.and(tid, 31u32);
    let warp = k.shr(tid, 5u32);
    let kg = k.and(warp, 3u32);
    let wg = k.shr(warp, 2u32);
    let ln = Lanes::new(&mut k, lane);
    let sq = Seq::load(&mut k, p.cu, heads);
    let bx = k.ctaid_x();
    let kv0 = k.mul(bx, BKV);
    let done = k.ge(kv0, sq.len);
    k.when(done, |k| k.exit());
    let dims = [(BKV, dqk), (BKV, dv), (bq, dqk), (bq, dv)];
    let [tk, tv, tq, tdo] = tiles(&mut k, smem.reg(), dims);
    let sqs = k.mul(heads, dqk * 2);
    let svs = k.mul(heads, dv * 2);
    let kvalid = k.sub(sq.len, kv0);
    let tok0 = k.add(sq.start, kv0);
    load_k(&mut k, tid, nt, &tk, &p.k, (tok0, heads, sq.h), kvalid);
    let src = sq.ptr(&mut k, p.v, kv0, dv);
    load_tile(&mut k, tid, nt, &tv, src, svs, kvalid);
    k.cp_async_commit_group();
    let r0 = k.mad_lo(kg, 16u32, kv0);
    let r0 = k.add(r0, ln.g);
    let krows = [r0, k.add(r0, 8u32)];
    let (ks, vs) = (col_split(dqk, sp), col_split(dv, sp));
    let dk = zero_acc(&mut k, (ks[0].1 / 8) as usize);
    let dva = zero_acc(&mut k, (vs[0].1 / 8) as usize);
    let st = zero_acc(&mut k, (bq / 8) as usize);
    let dpt = zero_acc(&mut k, (bq / 8) as usize);
    let col_q = k.shl(ln.q, 1u32);
    let pr = preds(&mut k);
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
        tiles_ready(k);
        ss_wgmma(k, (&tk, &tq), dqk, &st, pr);
        mask_transposed(k, &st, &stats, krows);
        ss_wgmma(k, (&tv, &tdo), dv, &dpt, pr);
        let get = |n: usize, e: usize| {
            let s = stats[2 * n + (e & 1)];
            (s.1, s.2)
        };
        p_and_ds(k, &st, &dpt, c, &get);
        for hf in 0..sp as usize {
            let sel = k.eq(wg, hf as u32);
            let ((kc, kn), (vc, vn)) = (ks[hf], vs[hf]);
            k.if_(sel, |k| {
                if vn > 0 {
                    rs_wgmma(k, &st, &tdo, (vc, vn), &dva[..vn as usize / 8], pr.1);
                }
                if kn > 0 {
                    rs_wgmma(k, &dpt, &tq, (kc, kn), &dk[..kn as usize / 8], pr.1);
                }
            });
        }
        k.sync_threads();
    });
    for hf in 0..sp as usize {
        let sel = k.eq(wg, hf as u32);
        let ((kc, kn), (vc, vn)) = (ks[hf], vs[hf]);
        k.if_(sel, |k| {
            let kp = |k: &mut KernelBuilder, r: Reg<u32>| sq.ptr(k, dkp, r, dqk);
            let dk = &dk[..kn as usize / 8];
            store_rows(k, &ln, dk, Some(scale), krows, sq.len, kc, &kp);
            let vp = |k: &mut KernelBuilder, r: Reg<u32>| sq.ptr(k, dvp, r, dv);
            store_rows(
                k,
                &ln,
                &dva[..vn as usize / 8],
                None,
                krows,
                sq.len,
                vc,
                &vp,
            );
        });
    }
    Ok(k.finish()?)
}

/// Generates the wgmma dQ kernel (`s.wgmma`; checked by the caller).
pub(crate) fn gen_dq(t: &Target, s: &BwdSpec) -> Result<ptx::Module> {
    let (dqk, dv) = (s.d_qk, s.d_v);
    let nt = 128;
    let mut k = KernelBuilder::new(&s.dq_name(), t.clone());
    k.reqntid(&[nt]);
    k.maxnreg(255);
    let p = declare_common(&mut k, s.k_rope);
    let dqp = k.param_ptr_aligned::<u8>("dq", 4);
    let heads = k.param::<u32>("heads");
    let c = k.param::<f32>("scale_log2");
    let scale = k.param::<f32>("scale");
    let smem = k.dynamic_shared::<u8>(1024);
    let tid = k.tid_x();
    let lane = k.and(tid, 31u32);
    let warp = k.shr(tid, 5u32);
    let ln = Lanes::new(&mut k, lane);
    let sq = Seq::load(&mut k, p.cu, heads);
    let bx = k.ctaid_x();
    let q0 = k.mul(bx, BM_DQ);
    let done = k.ge(q0, sq.len);
    k.when(done, |k| k.exit());
    let dims = [(BM_DQ, dqk), (BM_DQ, dv), (BN_DQ, dqk), (BN_DQ, dv)];
    let [tq, tdo, tk, tv] = tiles(&mut k, smem.reg(), dims);
    let sqs = k.mul(heads, dqk * 2);
    let svs = k.mul(heads, dv * 2);
    let qvalid = k.sub(sq.len, q0);
    let src = sq.ptr(&mut k, p.q, q0, dqk);
    load_tile(&mut k, tid, nt, &tq, src, sqs, qvalid);
    let src = sq.ptr(&mut k, p.dout, q0, dv);
    load_tile(&mut k, tid, nt, &tdo, src, svs, qvalid);
    k.cp_async_commit_group();
    let r0 = k.mad_lo(warp, 16u32, q0);
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
    let pr = preds(&mut k);
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
        tiles_ready(k);
        ss_wgmma(k, (&tq, &tk), dqk, &s_acc, pr);
        let kv_end = k.add(kv0, BN_DQ);
        let diag = k.gt(kv_end, q0);
        k.if_(diag, |k| {
            super::fwd::causal_mask(k, &s_acc, kv0, col_q, rows)
        });
        ss_wgmma(k, (&tdo, &tv), dv, &dp, pr);
        let get = |_n: usize, e: usize| st[e >> 1];
        p_and_ds(k, &s_acc, &dp, c, &get);
        rs_wgmma(k, &dp, &tk, (0, dqk), &dq, pr.1);
        k.sync_threads();
    });
    let qp = |k: &mut KernelBuilder, r: Reg<u32>| sq.ptr(k, dqp, r, dqk);
    store_rows(&mut k, &ln, &dq, Some(scale), rows, sq.len, 0, &qp);
    Ok(k.finish()?)
}
