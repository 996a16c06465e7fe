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
//!
//! The per-tile work of steps 2 and 3 (`Dkdv::tile`, `Dq::tile`: statistics, masks, P
//! and dS, the dV-then-dK and dQ accumulation order, the stores) is shared with the sm_90a
//! kernels of [`super::bwd90`]; a variant supplies its loads and a `Products` (here
//! `ldmatrix` + `mma.sync` per warp, there `wgmma` per warpgroup).

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
    /// sm_90a variant: TMA loads (producer warp, mbarrier ring) and every product a warpgroup
    /// `wgmma` ([`super::bwd90`])
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
    /// Threads of a dK/dV CTA: 4 warps per column split (the wgmma variant adds its TMA
    /// producer warp).
    pub fn dkdv_threads(&self) -> u32 {
        let math = 4 * self.splits() * 32;
        if self.wgmma {
            math + 32
        } else {
            math
        }
    }
    /// Threads of a dQ CTA: 4 warps (+ the wgmma variant's producer warp).
    pub fn dq_threads(&self) -> u32 {
        if self.wgmma {
            160
        } else {
            128
        }
    }
    pub fn dkdv_shared(&self) -> u32 {
        if self.wgmma {
            return super::bwd90::Plan::dkdv(self).total();
        }
        let (q, v) = (self.d_qk, self.d_v);
        let bq = self.bq();
        tile_bytes(BKV, q) + tile_bytes(BKV, v) + tile_bytes(bq, q) + tile_bytes(bq, v)
    }
    pub fn dq_shared(&self) -> u32 {
        if self.wgmma {
            return super::bwd90::Plan::dq(self).total();
        }
        let (q, v) = (self.d_qk, self.d_v);
        tile_bytes(BM_DQ, q) + tile_bytes(BM_DQ, v) + tile_bytes(BN_DQ, q) + tile_bytes(BN_DQ, v)
    }
    /// Parameters of the dK/dV kernel in launch order: (name, type).
    pub fn dkdv_params(&self) -> Vec<(&'static str, &'static str)> {
        self.params(&[("dk", "bf16*"), ("dv", "bf16*")])
    }
    /// Parameters of the dQ kernel in launch order.
    pub fn dq_params(&self) -> Vec<(&'static str, &'static str)> {
        self.params(&[("dq", "bf16*")])
    }
    fn params(&self, outs: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        let mut v = if self.wgmma {
            super::bwd90::MAP_PARAMS.to_vec()
        } else {
            vec![
                ("q", "bf16*"),
                ("k", "bf16*"),
                ("k_rope", "bf16* (k_rope > 0)"),
                ("v", "bf16*"),
                ("dout", "bf16*"),
            ]
        };
        v.extend([("lse", "f32*"), ("delta", "f32*"), ("cu_seqlens", "i32*")]);
        v.extend_from_slice(outs);
        v.extend([("heads", "u32"), ("scale_log2", "f32"), ("scale", "f32")]);
        v
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

/// The Q/K/V/dO sources of the `mma.sync` kernels (the wgmma kernels take tensor maps).
struct Sources {
    q: GlobalPtr<u8>,
    k: KSrc,
    v: GlobalPtr<u8>,
    dout: GlobalPtr<u8>,
}

fn declare_sources(k: &mut KernelBuilder, rope: u32) -> Sources {
    Sources {
        q: k.param_ptr_aligned::<u8>("q", 16),
        k: KSrc {
            k: k.param_ptr_aligned::<u8>("k", 16),
            k_rope: k.param_ptr_aligned::<u8>("k_rope", 16),
            rope,
        },
        v: k.param_ptr_aligned::<u8>("v", 16),
        dout: k.param_ptr_aligned::<u8>("dout", 16),
    }
}

/// The parameters after the sources (both variants): statistics, offsets, outputs, scalars.
pub(super) struct Tail {
    pub lse: GlobalPtr<f32>,
    pub delta: GlobalPtr<f32>,
    pub cu: GlobalPtr<i32>,
    /// dK, dV (dK/dV kernel) or dQ
    pub outs: Vec<GlobalPtr<u8>>,
    pub heads: Reg<u32>,
    /// scale * log2(e), and scale
    pub c: Reg<f32>,
    pub scale: Reg<f32>,
}

pub(super) fn declare_tail(k: &mut KernelBuilder, outs: &[&str]) -> Tail {
    Tail {
        lse: k.param_ptr_aligned::<f32>("lse", 4),
        delta: k.param_ptr_aligned::<f32>("delta", 4),
        cu: k.param_ptr_aligned::<i32>("cu_seqlens", 4),
        outs: outs
            .iter()
            .map(|n| k.param_ptr_aligned::<u8>(n, 4))
            .collect(),
        heads: k.param::<u32>("heads"),
        c: k.param::<f32>("scale_log2"),
        scale: k.param::<f32>("scale"),
    }
}

/// `lse * log2(e)` and `delta` of sequence row `r` (clamped to the sequence).
fn row_stats(k: &mut KernelBuilder, sq: &Seq, p: &Tail, r: Reg<u32>) -> (Reg<f32>, Reg<f32>) {
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
fn p_and_ds(
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

/// Stores 16 rows x `acc.len()*8` columns (starting at column `col0`) of `acc * scale` as bf16
/// into rows `row_ptr(r)` for this lane's rows `rows` when `< len`.
fn store_rows(
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
fn column_stats(
    k: &mut KernelBuilder,
    sq: &Seq,
    p: &Tail,
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
fn mask_transposed(
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

/// The instructions of the backward's tile products. The `mma.sync` and `wgmma` kernels each
/// implement it; the per-tile code shared by both (`Dkdv::tile`, `Dq::tile`) fixes what
/// is computed and in which order.
pub(super) trait Products {
    /// `acc = A B^T` over `d` columns: A = this thread's rows of tile `a` (its warp's 16, or its
    /// warpgroup's 64), B = every row of `b`.
    fn scores(&self, k: &mut KernelBuilder, a: &Tile, b: &Tile, d: u32, acc: &[[Reg<f32>; 4]]);
    /// `acc += P B[:, c0..c0 + n]` with P in accumulator-layout registers (its columns are the
    /// k dimension) and `b` a [k][n] tile; `acc` holds the `n / 8` n-tiles.
    fn accumulate(
        &self,
        k: &mut KernelBuilder,
        p: &[[Reg<f32>; 4]],
        b: &Tile,
        cols: (u32, u32),
        acc: &[[Reg<f32>; 4]],
    );
}

/// `mma.sync.m16n8k16` products: per warp, fragments through `ldmatrix`.
struct MmaProducts<'a> {
    ln: &'a Lanes,
    /// this warp's first row in the A tiles
    wrow: Reg<u32>,
}

impl Products for MmaProducts<'_> {
    fn scores(&self, k: &mut KernelBuilder, a: &Tile, b: &Tile, d: u32, acc: &[[Reg<f32>; 4]]) {
        clear(k, acc);
        qk_tile(k, self.ln, a, Some(self.wrow), b, d, b.rows, acc);
    }
    fn accumulate(
        &self,
        k: &mut KernelBuilder,
        p: &[[Reg<f32>; 4]],
        b: &Tile,
        (c0, n): (u32, u32),
        acc: &[[Reg<f32>; 4]],
    ) {
        for kk in 0..p.len() / 2 {
            let af = acc_to_a(k, p[2 * kk], p[2 * kk + 1]);
            let bf = ld_b_trans(k, self.ln, b, 16 * kk as u32, c0 / 8, n / 8);
            for (j, bb) in bf.iter().enumerate() {
                k.mma_to::<Mma>(acc[j], af, *bb, acc[j]);
            }
        }
    }
}

/// This thread's place in a backward CTA: warp `w` computes rows `16 (w % 4)..` of its tiles
/// (the mma.sync warp slice and the wgmma accumulator layout agree) for column split `w / 4`.
pub(super) struct Warps {
    pub ln: Lanes,
    pub wrow: Reg<u32>,
    pub group: Reg<u32>,
    /// accumulator column pair (2q) of this lane
    pub col_q: Reg<u32>,
}

impl Warps {
    pub(super) fn new(k: &mut KernelBuilder) -> Warps {
        let tid = k.tid_x();
        let lane = k.and(tid, 31u32);
        let warp = k.shr(tid, 5u32);
        let w4 = k.and(warp, 3u32);
        let ln = Lanes::new(k, lane);
        Warps {
            wrow: k.mul(w4, 16u32),
            group: k.shr(warp, 2u32),
            col_q: k.shl(ln.q, 1u32),
            ln,
        }
    }
    /// This lane's two rows (g, g + 8) of the block from `r0`.
    fn rows(&self, k: &mut KernelBuilder, r0: Reg<u32>) -> [Reg<u32>; 2] {
        let r = k.add(r0, self.wrow);
        let r = k.add(r, self.ln.g);
        [r, k.add(r, 8u32)]
    }
}

/// The math threads' state of a dK/dV CTA (64 keys from `kv0`) over its query-tile loop, for
/// both variants.
pub(super) struct Dkdv {
    pub sq: Seq,
    pub kv0: Reg<u32>,
    pub w: Warps,
    krows: [Reg<u32>; 2],
    /// (dK columns, dV columns) `(c0, n)` of each column split
    cols: Vec<[(u32, u32); 2]>,
    dk: Vec<[Reg<f32>; 4]>,
    dv: Vec<[Reg<f32>; 4]>,
    st: Vec<[Reg<f32>; 4]>,
    dpt: Vec<[Reg<f32>; 4]>,
    s: BwdSpec,
}

impl Dkdv {
    /// Accumulators sized for the widest split of `cols`.
    pub(super) fn new(
        k: &mut KernelBuilder,
        (w, sq, kv0): (Warps, Seq, Reg<u32>),
        s: &BwdSpec,
        cols: Vec<[(u32, u32); 2]>,
    ) -> Dkdv {
        let widest = |i: usize| cols.iter().map(|c| c[i].1).max().unwrap_or(0) as usize / 8;
        Dkdv {
            krows: w.rows(k, kv0),
            dk: zero_acc(k, widest(0)),
            dv: zero_acc(k, widest(1)),
            st: zero_acc(k, (s.bq() / 8) as usize),
            dpt: zero_acc(k, (s.bq() / 8) as usize),
            sq,
            kv0,
            w,
            cols,
            s: *s,
        }
    }
    /// The query tiles at or after the diagonal: `[it0, iend)` of `bq` rows.
    pub(super) fn q_tiles(&self, k: &mut KernelBuilder) -> (Reg<u32>, Reg<u32>) {
        let bq = self.s.bq();
        let it0 = k.div(self.kv0, bq);
        let iend = k.add(self.sq.len, bq - 1);
        (it0, k.div(iend, bq))
    }
    /// One query tile from `q0`: its column statistics, `ready` (the tiles `[tk, tv, tq,
    /// tdo]` are readable after it), S^T = K Q^T, mask, dP^T = V dO^T, P^T and dS^T, then per
    /// column split dV += P^T dO and dK += dS^T Q.
    pub(super) fn tile(
        &self,
        k: &mut KernelBuilder,
        m: &dyn Products,
        p: &Tail,
        [tk, tv, tq, tdo]: [&Tile; 4],
        q0: Reg<u32>,
        ready: &mut dyn FnMut(&mut KernelBuilder),
    ) {
        let stats = column_stats(k, &self.sq, p, q0, self.w.col_q, self.s.bq());
        ready(k);
        m.scores(k, tk, tq, self.s.d_qk, &self.st);
        mask_transposed(k, &self.st, &stats, self.krows);
        m.scores(k, tv, tdo, self.s.d_v, &self.dpt);
        let get = |n: usize, e: usize| {
            let s = stats[2 * n + (e & 1)];
            (s.1, s.2)
        };
        p_and_ds(k, &self.st, &self.dpt, p.c, &get);
        self.per_split(k, |k, [kc, vc]| {
            if vc.1 > 0 {
                m.accumulate(k, &self.st, tdo, vc, &self.dv[..vc.1 as usize / 8]);
            }
            if kc.1 > 0 {
                m.accumulate(k, &self.dpt, tq, kc, &self.dk[..kc.1 as usize / 8]);
            }
        });
    }
    /// Runs `f` with the columns of this thread's split, under a branch on the split even when
    /// there is one (with the branch ptxas fits the mma.sync 192/128 kernels without spills;
    /// straight-line code spilled 8 bytes at 192/128 with the shared RoPE key).
    fn per_split(&self, k: &mut KernelBuilder, f: impl Fn(&mut KernelBuilder, [(u32, u32); 2])) {
        for (i, &c) in self.cols.iter().enumerate() {
            let sel = k.eq(self.w.group, i as u32);
            k.if_(sel, |k| f(k, c));
        }
    }
    /// Stores dK (times the softmax scale) and dV of the valid key rows.
    pub(super) fn store(&self, k: &mut KernelBuilder, p: &Tail) {
        let (sq, s, ln) = (&self.sq, &self.s, &self.w.ln);
        let kp = |k: &mut KernelBuilder, r: Reg<u32>| sq.ptr(k, p.outs[0], r, s.d_qk);
        let vp = |k: &mut KernelBuilder, r: Reg<u32>| sq.ptr(k, p.outs[1], r, s.d_v);
        self.per_split(k, |k, [kc, vc]| {
            let dk = &self.dk[..kc.1 as usize / 8];
            store_rows(k, ln, dk, Some(p.scale), self.krows, sq.len, kc.0, &kp);
            let dv = &self.dv[..vc.1 as usize / 8];
            store_rows(k, ln, dv, None, self.krows, sq.len, vc.0, &vp);
        });
    }
}

/// The math threads' state of a dQ CTA (64 queries from `q0`) over its key-tile loop.
pub(super) struct Dq {
    pub sq: Seq,
    pub q0: Reg<u32>,
    pub w: Warps,
    rows: [Reg<u32>; 2],
    /// (lse2, delta) of this lane's two rows
    stats: [(Reg<f32>, Reg<f32>); 2],
    dq: Vec<[Reg<f32>; 4]>,
    s_acc: Vec<[Reg<f32>; 4]>,
    dp: Vec<[Reg<f32>; 4]>,
    s: BwdSpec,
}

impl Dq {
    pub(super) fn new(
        k: &mut KernelBuilder,
        (w, sq, q0): (Warps, Seq, Reg<u32>),
        s: &BwdSpec,
        p: &Tail,
    ) -> Dq {
        let rows = w.rows(k, q0);
        let stats = rows.map(|r| row_stats(k, &sq, p, r));
        Dq {
            dq: zero_acc(k, (s.d_qk / 8) as usize),
            s_acc: zero_acc(k, (BN_DQ / 8) as usize),
            dp: zero_acc(k, (BN_DQ / 8) as usize),
            rows,
            stats,
            sq,
            q0,
            w,
            s: *s,
        }
    }
    /// The key tiles up to the diagonal.
    pub(super) fn k_tiles(&self, k: &mut KernelBuilder) -> Reg<u32> {
        causal_key_tiles(k, self.q0, BM_DQ, self.sq.len, BN_DQ)
    }
    /// One key tile from `kv0` (tiles `[tq, tdo, tk, tv]` readable): S = Q K^T, causal mask
    /// on tiles reaching the diagonal, dP = dO V^T, P and dS, dQ += dS K.
    pub(super) fn tile(
        &self,
        k: &mut KernelBuilder,
        m: &dyn Products,
        c: Reg<f32>,
        [tq, tdo, tk, tv]: [&Tile; 4],
        kv0: Reg<u32>,
    ) {
        m.scores(k, tq, tk, self.s.d_qk, &self.s_acc);
        let kv_end = k.add(kv0, BN_DQ);
        let diag = k.gt(kv_end, self.q0);
        k.if_(diag, |k| {
            super::fwd::causal_mask(k, &self.s_acc, kv0, self.w.col_q, self.rows)
        });
        m.scores(k, tdo, tv, self.s.d_v, &self.dp);
        let get = |_n: usize, e: usize| self.stats[e >> 1];
        p_and_ds(k, &self.s_acc, &self.dp, c, &get);
        m.accumulate(k, &self.dp, tk, (0, self.s.d_qk), &self.dq);
    }
    /// Stores dQ (times the softmax scale) of the valid query rows.
    pub(super) fn store(&self, k: &mut KernelBuilder, p: &Tail) {
        let (sq, d) = (&self.sq, self.s.d_qk);
        let qp = |k: &mut KernelBuilder, r: Reg<u32>| sq.ptr(k, p.outs[0], r, d);
        let (ln, rows) = (&self.w.ln, self.rows);
        store_rows(k, ln, &self.dq, Some(p.scale), rows, sq.len, 0, &qp);
    }
}

/// Target, head dims and RoPE width of a backward spec.
fn check_spec(name: &str, t: &Target, s: &BwdSpec) -> Result<()> {
    check_target(name, t, s.targets())?;
    check_head_dim(name, "d_qk", s.d_qk as usize)?;
    check_head_dim(name, "d_v", s.d_v as usize)?;
    check_k_rope(name, s.d_qk as usize, s.k_rope as usize)
}

/// A new kernel of `threads` threads (`.maxnreg 255`: without it ptxas trades registers for
/// small spills on some head dims).
pub(super) fn new_kernel(name: &str, t: &Target, threads: u32) -> KernelBuilder {
    let mut k = KernelBuilder::new(name, t.clone());
    k.reqntid(&[threads]);
    k.maxnreg(255);
    k
}

/// Generates the dK/dV kernel.
pub fn gen_dkdv(t: &Target, s: &BwdSpec) -> Result<ptx::Module> {
    let name = s.dkdv_name();
    check_spec(&name, t, s)?;
    if s.wgmma {
        return super::bwd90::gen_dkdv(t, s);
    }
    let (dqk, dv, sp, bq, nt) = (s.d_qk, s.d_v, s.splits(), s.bq(), s.dkdv_threads());
    let mut k = new_kernel(&name, t, nt);
    let src = declare_sources(&mut k, s.k_rope);
    let p = declare_tail(&mut k, &["dk", "dv"]);
    let smem = k.dynamic_shared::<u8>(128);
    let w = Warps::new(&mut k);
    let (sq, kv0) = start_cta(&mut k, p.cu, p.heads, BKV);
    let dims = [(BKV, dqk), (BKV, dv), (bq, dqk), (bq, dv)];
    let [tk, tv, tq, tdo] = tiles(&mut k, smem.reg(), dims);
    let (sqs, svs) = (sq.stride(&mut k, dqk), sq.stride(&mut k, dv));
    sq.load_k(&mut k, nt, &tk, &src.k, kv0);
    sq.load_tile(&mut k, (nt, &tv), (src.v, svs), kv0);
    k.cp_async_commit_group();
    // even column splits (one per 4 warps)
    let cols = (0..sp)
        .map(|i| [(i * dqk / sp, dqk / sp), (i * dv / sp, dv / sp)])
        .collect();
    let cx = Dkdv::new(&mut k, (w, sq, kv0), s, cols);
    let m = MmaProducts {
        ln: &cx.w.ln,
        wrow: cx.w.wrow,
    };
    let (it0, iend) = cx.q_tiles(&mut k);
    k.for_range(it0, iend, 1u32, |k, it| {
        let q0 = k.mul(it, bq);
        cx.sq.load_tile(k, (nt, &tq), (src.q, sqs), q0);
        cx.sq.load_tile(k, (nt, &tdo), (src.dout, svs), q0);
        k.cp_async_commit_group();
        let mut ready = |k: &mut KernelBuilder| {
            k.cp_async_wait_group(0);
            k.sync_threads();
        };
        cx.tile(k, &m, &p, [&tk, &tv, &tq, &tdo], q0, &mut ready);
        k.sync_threads(); // every warp is done with this Q / dO tile
    });
    cx.store(&mut k, &p);
    Ok(k.finish()?)
}

/// Generates the dQ kernel.
pub fn gen_dq(t: &Target, s: &BwdSpec) -> Result<ptx::Module> {
    let name = s.dq_name();
    check_spec(&name, t, s)?;
    if s.wgmma {
        return super::bwd90::gen_dq(t, s);
    }
    let (dqk, dv, nt) = (s.d_qk, s.d_v, s.dq_threads());
    let mut k = new_kernel(&name, t, nt);
    let src = declare_sources(&mut k, s.k_rope);
    let p = declare_tail(&mut k, &["dq"]);
    let smem = k.dynamic_shared::<u8>(128);
    let w = Warps::new(&mut k);
    let (sq, q0) = start_cta(&mut k, p.cu, p.heads, BM_DQ);
    let dims = [(BM_DQ, dqk), (BM_DQ, dv), (BN_DQ, dqk), (BN_DQ, dv)];
    let [tq, tdo, tk, tv] = tiles(&mut k, smem.reg(), dims);
    let (sqs, svs) = (sq.stride(&mut k, dqk), sq.stride(&mut k, dv));
    sq.load_tile(&mut k, (nt, &tq), (src.q, sqs), q0);
    sq.load_tile(&mut k, (nt, &tdo), (src.dout, svs), q0);
    k.cp_async_commit_group();
    let cx = Dq::new(&mut k, (w, sq, q0), s, &p);
    let m = MmaProducts {
        ln: &cx.w.ln,
        wrow: cx.w.wrow,
    };
    let ntiles = cx.k_tiles(&mut k);
    k.for_range(0u32, ntiles, 1u32, |k, j| {
        let kv0 = k.mul(j, BN_DQ);
        cx.sq.load_k(k, nt, &tk, &src.k, kv0);
        cx.sq.load_tile(k, (nt, &tv), (src.v, svs), kv0);
        k.cp_async_commit_group();
        k.cp_async_wait_group(0);
        k.sync_threads();
        cx.tile(k, &m, p.c, [&tq, &tdo, &tk, &tv], kv0);
        k.sync_threads(); // every warp is done with this K / V tile
    });
    cx.store(&mut k, &p);
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
/// On an sm_90a device the dK/dV and dQ launches are the TMA + `wgmma` kernels (the call then
/// synchronises the stream before returning: their tensor maps live in a buffer freed then),
/// elsewhere the `mma.sync` ones (asynchronous).
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
    if wgmma {
        return super::bwd90::launch(stream, &spec, sh, &a, (total, batch), after);
    }
    let (c, sc, h) = (sh.scale * LOG2E, sh.scale, sh.heads as u32);
    let kr = a.k_rope.unwrap_or(a.k);
    let f = function(dev, &name, "", |t| gen_dkdv(t, &spec))?;
    let cfg = LaunchConfig::grid3(dkdv_grid(sh, batch), [spec.dkdv_threads(), 1, 1])
        .shared(spec.dkdv_shared());
    let mut v = args![a.q, a.k, kr, a.v, a.dout, a.lse, &*a.delta, a.cu_seqlens];
    v.extend(args![&*a.dk, &*a.dv, h, c, sc]);
    stream.launch(&f, &cfg, &v)?;
    after(&name);
    let f = function(dev, &spec.dq_name(), "", |t| gen_dq(t, &spec))?;
    let cfg =
        LaunchConfig::grid3(dq_grid(sh, batch), [spec.dq_threads(), 1, 1]).shared(spec.dq_shared());
    let mut v = args![a.q, a.k, kr, a.v, a.dout, a.lse, &*a.delta, a.cu_seqlens];
    v.extend(args![&*a.dq, h, c, sc]);
    stream.launch(&f, &cfg, &v)?;
    after(&spec.dq_name());
    Ok(())
}

/// Grid of the dK/dV kernels: (key tiles of the longest sequence, heads, batch).
pub(super) fn dkdv_grid(sh: &AttnShape, batch: usize) -> [u32; 3] {
    let x = sh.max_seqlen.div_ceil(BKV as usize) as u32;
    [x, sh.heads as u32, batch as u32]
}

/// Grid of the dQ kernels: (query tiles of the longest sequence, heads, batch).
pub(super) fn dq_grid(sh: &AttnShape, batch: usize) -> [u32; 3] {
    let x = sh.max_seqlen.div_ceil(BM_DQ as usize) as u32;
    [x, sh.heads as u32, batch as u32]
}
