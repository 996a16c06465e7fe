//! FlashMLA-style MLA decoding in the absorbed form: each sequence's `s_q` new query tokens x
//! `heads` query heads attend over a paged cache of `d_k = d_v + d_rope` values per token (V3:
//! 512 latent + 64 RoPE = 576), values = the first `d_v` (latent) columns of the same rows.
//!
//! Layouts: Q `[batch, s_q, heads, d_k]` bf16 (row r = t * heads + h), cache `[num_blocks, 64,
//! d_k]` bf16, `block_table` `[batch, max_blocks]` i32, `seqlens` `[batch]` i32 (cached tokens,
//! the `s_q` new ones included; query token t sees cached positions <= len - s_q + t). Outputs:
//! O `[batch, s_q, heads, d_v]` bf16 and LSE `[batch, s_q, heads]` f32 (natural log).
//!
//! Tiling: a CTA owns `16 * row_groups` query rows of one sequence and one split of its cache
//! blocks; warp (rg, cw) of `row_groups` x 4 computes S for rows 16rg.. against keys 16cw.. of
//! the 64-token block (`ldmatrix` from the block in shared memory), the row max is exchanged
//! through shared memory, P goes to shared memory as bf16, and each warp accumulates O for its
//! quarter of the `d_v` columns (the V operand is the latent part of the same shared block; K
//! and V are read from memory once). Splits write f32 partial O and LSE; the combine kernel
//! merges them with LSE weights into bf16 O and the final LSE.

use super::*;
use crate::host::{check_target, function};
use half::bf16;
use runtime::{args, LaunchConfig, Stream};

/// Tokens per cache block.
pub const BLOCK: u32 = 64;
/// Latent widths accepted: multiples of 64 in [64, 512]; RoPE widths: multiples of 16 <= 128.
pub const DV_MAX: usize = 512;
pub const DROPE_MAX: usize = 128;
/// Most splits per sequence.
pub const MAX_SPLITS: usize = 64;

/// One generated decoding kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct DecodeSpec {
    pub d_v: u32,
    pub d_rope: u32,
    /// 16-row groups per CTA (1 or 4)
    pub row_groups: u32,
    /// cache blocks in flight per CTA: 1, or 2 (the next block's copy overlaps this block's
    /// math; needs sm_90's shared memory for d_k = 576)
    pub stages: u32,
}

impl DecodeSpec {
    pub fn d_k(&self) -> u32 {
        self.d_v + self.d_rope
    }
    pub fn name(&self) -> String {
        let st = if self.stages == 2 { "_s2" } else { "" };
        format!(
            "mla_decode_v{}_r{}_m{}{st}",
            self.d_v,
            self.d_rope,
            16 * self.row_groups
        )
    }
    pub fn threads(&self) -> u32 {
        128 * self.row_groups
    }
    fn rows(&self) -> u32 {
        16 * self.row_groups
    }
    pub fn shared_bytes(&self) -> u32 {
        let rows = self.rows();
        tile_bytes(rows, self.d_k())
            + self.stages * tile_bytes(BLOCK, self.d_k())
            + tile_bytes(rows, 64)
            + rows * 4 * 4
    }
    /// The targets whose per-block shared memory holds the CTA's tiles (sm_89 99 KiB, sm_80
    /// 163 KiB, sm_90 227 KiB; none past that).
    pub fn targets(&self) -> &'static [&'static str] {
        match self.shared_bytes() {
            b if b <= 99 * 1024 => TARGETS,
            b if b <= 163 * 1024 => &["sm_80", "sm_90a"],
            b if b <= 227 * 1024 => &["sm_90a"],
            _ => &[],
        }
    }
    pub fn params() -> &'static [(&'static str, &'static str)] {
        &[
            ("q", "bf16*"),
            ("kv", "bf16*"),
            ("block_table", "i32*"),
            ("seqlens", "i32*"),
            ("o_part", "f32*"),
            ("lse_part", "f32*"),
            ("rows", "u32"),
            ("heads", "u32"),
            ("s_q", "u32"),
            ("max_blocks", "u32"),
            ("splits", "u32"),
            ("scale_log2", "f32"),
        ]
    }
    pub fn launch_rule(&self) -> String {
        format!(
            "grid = (splits, ceil(s_q*heads/{}), batch), block = {}, dynamic shared = {} bytes",
            self.rows(),
            self.threads(),
            self.shared_bytes()
        )
    }
}

struct DecParams {
    q: GlobalPtr<u8>,
    kv: GlobalPtr<u8>,
    table: GlobalPtr<i32>,
    lens: GlobalPtr<i32>,
    o_part: GlobalPtr<f32>,
    lse_part: GlobalPtr<f32>,
    rows: Reg<u32>,
    heads: Reg<u32>,
    s_q: Reg<u32>,
    max_blocks: Reg<u32>,
    splits: Reg<u32>,
    c: Reg<f32>,
}

fn declare(k: &mut KernelBuilder) -> DecParams {
    DecParams {
        q: k.param_ptr_aligned::<u8>("q", 16),
        kv: k.param_ptr_aligned::<u8>("kv", 16),
        table: k.param_ptr_aligned::<i32>("block_table", 4),
        lens: k.param_ptr_aligned::<i32>("seqlens", 4),
        o_part: k.param_ptr_aligned::<f32>("o_part", 8),
        lse_part: k.param_ptr_aligned::<f32>("lse_part", 4),
        rows: k.param::<u32>("rows"),
        heads: k.param::<u32>("heads"),
        s_q: k.param::<u32>("s_q"),
        max_blocks: k.param::<u32>("max_blocks"),
        splits: k.param::<u32>("splits"),
        c: k.param::<f32>("scale_log2"),
    }
}

/// Shared-memory layout of a CTA.
struct Smem {
    tq: Tile,
    tkv: Tile,
    tp: Tile,
    /// f32 [row_groups][4][16]: per-warp row maxima, then partial row sums
    xch: Reg<u32>,
}

/// This warp's place in the CTA and its running softmax state.
struct Warp {
    ln: Lanes,
    /// row group and column quarter
    rg: Reg<u32>,
    cw: Reg<u32>,
    /// the `[row_groups][4][16]` f32 exchange area
    xch: Reg<u32>,
    /// running row max (log2 units) and this warp's partial row sums
    m: [Reg<f32>; 2],
    l: [Reg<f32>; 2],
    /// O accumulators of this warp's column quarter (`nv` n-tiles)
    o: Vec<[Reg<f32>; 4]>,
    nv: u32,
}

impl Warp {
    /// Address of row `h` of this lane (row g + 8h) in warp column 0 of this row group's
    /// exchange area (recomputed at each use: fewer registers live across the block loop).
    fn xaddr(&self, k: &mut KernelBuilder, h: usize) -> Reg<u32> {
        let a = k.mad_lo(self.rg, 256u32, self.xch);
        let a = k.mad_lo(self.ln.g, 4u32, a);
        k.add(a, 32 * h as u32)
    }
    /// The 4 column warps' values of this lane's row `h` from the exchange area, folded with
    /// `f` as they are loaded (max or sum).
    fn fold(
        &self,
        k: &mut KernelBuilder,
        h: usize,
        f: impl Fn(&mut KernelBuilder, Reg<f32>, Reg<f32>) -> Reg<f32>,
    ) -> Reg<f32> {
        let a = self.xaddr(k, h);
        let mut acc = k.ld(SharedPtr::<f32>::from_reg(a));
        for w in 1..4 {
            let v = k.ld(SharedPtr::<f32>::from_reg(a).add_bytes(w * 64));
            acc = f(k, acc, v);
        }
        acc
    }
    /// Publishes this warp's value of row `h` (lanes q == 0).
    fn publish(&self, k: &mut KernelBuilder, h: usize, v: Reg<f32>) {
        let a = self.xaddr(k, h);
        let a = k.mad_lo(self.cw, 64u32, a);
        let q0 = k.eq(self.ln.q, 0u32);
        k.when(q0, |k| k.st(SharedPtr::<f32>::from_reg(a), v));
    }
}

/// Generates the decoding kernel of `s`.
pub fn gen_decode(t: &Target, s: &DecodeSpec) -> Result<ptx::Module> {
    let name = s.name();
    check_target(&name, t, s.targets())?;
    if s.d_v % 64 != 0
        || s.d_v as usize > DV_MAX
        || s.d_rope % 16 != 0
        || s.d_rope as usize > DROPE_MAX
        || !matches!(s.row_groups, 1 | 4)
        || !matches!(s.stages, 1 | 2)
    {
        return shape_err(&name, "d_v must be a multiple of 64 <= 512, d_rope a multiple of 16 <= 128, row_groups 1 or 4, stages 1 or 2");
    }
    if s.row_groups == 4 && s.d_rope % 64 != 0 {
        // (at the 128-register cap of 512 threads, partial 64-column panels spill on sm_90a)
        return shape_err(&name, "the 64-row variant needs d_rope a multiple of 64");
    }
    let nt = s.threads();
    let mut k = KernelBuilder::new(&name, t.clone());
    k.reqntid(&[nt]);
    // the whole register file for one CTA (ptxas otherwise aims at 2 CTAs per SM and spills)
    k.maxnreg((65536 / nt).min(255));
    let p = declare(&mut k);
    let cx = DecCta::setup(&mut k, s, &p);
    if s.stages == 1 {
        cx.one_stage(&mut k);
    } else {
        cx.two_stages(&mut k);
    }
    let bs = k.mad_lo(cx.b, p.splits, cx.split); // partial rows of (b, split) start at bs * rows
    write_partial(&mut k, &p, &cx.w, cx.rows, bs);
    Ok(k.finish()?)
}

/// One decoding CTA: its tiles, block range, rows and per-warp state.
struct DecCta<'a> {
    s: DecodeSpec,
    p: &'a DecParams,
    sm: Smem,
    w: Warp,
    tid: Reg<u32>,
    b: Reg<u32>,
    split: Reg<u32>,
    len: Reg<u32>,
    /// this CTA's blocks [j0, j1)
    j0: Reg<u32>,
    j1: Reg<u32>,
    wrow: Reg<u32>,
    rows: [Reg<u32>; 2],
    /// causal limit per row: key <= len - s_q + token(row)
    lims: Vec<Reg<u32>>,
    sacc: Vec<[Reg<f32>; 4]>,
    /// this warp's key-row byte offset, table row, row stride, column pair, first V chunk
    koff: Reg<u32>,
    tstride: Reg<u32>,
    kvstride: Reg<u32>,
    col_q: Reg<u32>,
    cq: Reg<u32>,
}

impl<'a> DecCta<'a> {
    fn setup(k: &mut KernelBuilder, s: &DecodeSpec, p: &'a DecParams) -> DecCta<'a> {
        let (dk, dv, nrows, nt) = (s.d_k(), s.d_v, s.rows(), s.threads());
        let smem = k.dynamic_shared::<u8>(128);
        let tid = k.tid_x();
        let lane = k.and(tid, 31u32);
        let warp = k.shr(tid, 5u32);
        let rg = k.shr(warp, 2u32);
        let cw = k.and(warp, 3u32);
        let ln = Lanes::new(k, lane);
        let (split, rt, b) = (k.ctaid_x(), k.ctaid_y(), k.ctaid_z());
        let base = smem.reg();
        let b1 = k.add(base, tile_bytes(nrows, dk));
        let b2 = k.add(b1, s.stages * tile_bytes(BLOCK, dk));
        let b3 = k.add(b2, tile_bytes(nrows, 64));
        let sm = Smem {
            tq: Tile::new(base, nrows, dk),
            tkv: Tile::new(b1, BLOCK, dk),
            tp: Tile::new(b2, nrows, 64),
            xch: b3,
        };
        let len = k.ld_nc(p.lens.offset(b));
        let len: Reg<u32> = len.reinterpret();
        let nblk = k.add(len, BLOCK - 1);
        let nblk = k.shr(nblk, 6u32);
        let bps = k.add(nblk, p.splits);
        let bps = k.sub(bps, 1u32);
        let bps = k.div(bps, p.splits);
        let j0 = k.mul(split, bps);
        let j1 = k.add(j0, bps);
        let j1 = k.min(j1, nblk);
        // query rows
        let r_first = k.mul(rt, nrows);
        let qrow0 = k.mad_lo(b, p.rows, r_first);
        let qsrc = wide_off(k, p.q.reg(), qrow0, dk * 2);
        let qvalid = k.sub(p.rows, r_first);
        let qstride = k.mov(dk * 2);
        load_tile(k, tid, nt, &sm.tq, qsrc, qstride, qvalid);
        k.cp_async_commit_group();
        let wrow = k.mul(rg, 16u32);
        let r0 = k.add(r_first, wrow);
        let r0 = k.add(r0, ln.g);
        let rows = [r0, k.add(r0, 8u32)];
        let base_lim = k.sub(len, p.s_q);
        let lims: Vec<Reg<u32>> = rows
            .iter()
            .map(|&r| {
                let tok = k.div(r, p.heads);
                k.add(base_lim, tok)
            })
            .collect();
        let nv = dv / 32; // n-tiles per column warp
        let w = Warp {
            rg,
            cw,
            xch: sm.xch,
            m: [k.mov(f32::NEG_INFINITY), k.mov(f32::NEG_INFINITY)],
            l: [k.mov(0f32), k.mov(0f32)],
            o: zero_acc(k, nv as usize),
            nv,
            ln,
        };
        let sacc = zero_acc(k, 2);
        let koff = k.mul(cw, 16 * ROW_BYTES);
        let tstride = k.mul(p.max_blocks, b);
        let kvstride = k.mov(dk * 2);
        let col_q = k.shl(w.ln.q, 1u32);
        let cq = k.mul(cw, nv);
        DecCta {
            s: *s,
            p,
            sm,
            w,
            tid,
            b,
            split,
            len,
            j0,
            j1,
            wrow,
            rows,
            lims,
            sacc,
            koff,
            tstride,
            kvstride,
            col_q,
            cq,
        }
    }

    /// Copies cache block j into the stage `dst` (the caller commits).
    fn copy(&self, k: &mut KernelBuilder, j: Reg<u32>, dst: &Tile) {
        let p = self.p;
        let ti = k.add(self.tstride, j);
        let phys = k.ld_nc(p.table.offset(ti));
        let phys: Reg<u32> = phys.reinterpret();
        let src = wide_off(k, p.kv.reg(), phys, BLOCK * self.s.d_k() * 2);
        let kv0 = k.shl(j, 6u32);
        let kvalid = k.sub(self.len, kv0);
        load_tile(
            k,
            self.tid,
            self.s.threads(),
            dst,
            src,
            self.kvstride,
            kvalid,
        );
    }

    /// S, mask, softmax and O += P V for block j resident in `tkv` (`tk`: this warp's 16 keys).
    fn compute(&self, k: &mut KernelBuilder, j: Reg<u32>, tkv: &Tile, tk: &Tile) {
        let (w, sm, sacc) = (&self.w, &self.sm, &self.sacc);
        let ln = &w.ln;
        clear(k, sacc);
        super::fwd::qk_tile(k, ln, &sm.tq, Some(self.wrow), tk, self.s.d_k(), 16, sacc);
        let kv0 = k.shl(j, 6u32);
        let key0 = k.mad_lo(w.cw, 16u32, kv0);
        let key0 = k.add(key0, self.col_q);
        mask_keys(k, sacc, key0, &self.lims, self.len);
        block_softmax(k, sm, w, sacc, self.p.c);
        k.sync_threads();
        // O[:, quarter cw] += P V (V = the first d_v columns of the same block)
        for kk in 0..BLOCK / 16 {
            let a = ld_x4(k, ln, &sm.tp, Some(self.wrow), 0, 2 * kk, Style::A, false);
            let bq = ld_b_trans_at(k, ln, tkv, 16 * kk, self.cq, w.nv);
            for (n, bb) in bq.iter().enumerate() {
                k.mma_to::<Mma>(w.o[n], a, *bb, w.o[n]);
            }
        }
        k.sync_threads();
    }

    /// One block in flight: copy, wait, compute.
    fn one_stage(&self, k: &mut KernelBuilder) {
        let kb = k.add(self.sm.tkv.base, self.koff);
        let tk = Tile {
            base: kb,
            ..self.sm.tkv
        };
        k.for_range(self.j0, self.j1, 1u32, |k, j| {
            self.copy(k, j, &self.sm.tkv);
            k.cp_async_commit_group();
            k.cp_async_wait_group(0);
            k.sync_threads();
            self.compute(k, j, &self.sm.tkv, &tk);
        });
    }

    /// Two stages: blocks alternate between them (`cur` holds this block's stage base) and
    /// block j + 1's copy overlaps block j's math.
    fn two_stages(&self, k: &mut KernelBuilder) {
        let tkv = self.sm.tkv;
        let cur = k.mov(tkv.base);
        let sum = k.add(tkv.base, tkv.base);
        let sum = k.add(sum, tile_bytes(BLOCK, tkv.d)); // base0 + base1
        let issue = |k: &mut KernelBuilder, j: Reg<u32>, dst: Reg<u32>| {
            let live = k.lt(j, self.j1);
            let t = Tile { base: dst, ..tkv };
            k.if_(live, |k| self.copy(k, j, &t));
            k.cp_async_commit_group();
        };
        issue(k, self.j0, cur);
        k.for_range(self.j0, self.j1, 1u32, |k, j| {
            let next = k.add(j, 1u32);
            let other = k.sub(sum, cur);
            issue(k, next, other);
            k.cp_async_wait_group(1); // block j (and Q) landed; block j + 1 in flight
            k.sync_threads();
            let cur_t = Tile { base: cur, ..tkv };
            let kb = k.add(cur, self.koff);
            let tk = Tile { base: kb, ..tkv };
            self.compute(k, j, &cur_t, &tk);
            k.mov_to(cur, other);
        });
    }
}

/// [`ld_b_trans`] from a warp-dependent first chunk `c0` (general panel addressing).
fn ld_b_trans_at(
    k: &mut KernelBuilder,
    ln: &Lanes,
    t: &Tile,
    row0: u32,
    c0: Reg<u32>,
    ntiles: u32,
) -> Vec<[Frag; 2]> {
    let mut v = Vec::new();
    let mut j = 0;
    while j < ntiles {
        let c = k.add(c0, j);
        let a = frag_addr_rt(k, ln, t, row0, c);
        if j + 2 <= ntiles {
            let r = k.ldmatrix::<Bf16x2, u8, 4>(SharedPtr::<u8>::from_reg(a), true);
            v.push([r[0], r[1]]);
            v.push([r[2], r[3]]);
            j += 2;
        } else {
            let r = k.ldmatrix::<Bf16x2, u8, 2>(SharedPtr::<u8>::from_reg(a), true);
            v.push(r);
            j += 1;
        }
    }
    v
}

/// `-inf` for keys past the row's causal limit or the cached length.
fn mask_keys(
    k: &mut KernelBuilder,
    s: &[[Reg<f32>; 4]],
    key0: Reg<u32>,
    lims: &[Reg<u32>],
    len: Reg<u32>,
) {
    for (n, a) in s.iter().enumerate() {
        for e in 0..4 {
            let key = k.add(key0, (8 * n + (e & 1)) as u32);
            let past = k.gt(key, lims[e >> 1]);
            let end = k.ge(key, len);
            let bad = k.or(past, end);
            let v = k.selp(f32::NEG_INFINITY, a[e], bad);
            k.mov_to(a[e], v);
        }
    }
}

/// Online softmax of one block across the 4 column warps of a row group: warp maxima through
/// shared memory, P (bf16) into the P tile, O and the per-warp partial sums rescaled.
fn block_softmax(k: &mut KernelBuilder, sm: &Smem, w: &Warp, s: &[[Reg<f32>; 4]], c: Reg<f32>) {
    for h in 0..2usize {
        let mut mx = k.mov(f32::NEG_INFINITY);
        for a in s {
            mx = k.max(mx, a[2 * h]);
            mx = k.max(mx, a[2 * h + 1]);
        }
        let mx = quad_reduce(k, mx, true);
        w.publish(k, h, mx);
    }
    k.sync_threads();
    for h in 0..2usize {
        let mx = w.fold(k, h, |k, a, b| k.max(a, b));
        let mx = k.mul(mx, c);
        let mnew = k.max(w.m[h], mx);
        // a row with nothing visible yet keeps m = -inf: exponentiate against 0 instead
        let none = k.eq(mnew, f32::NEG_INFINITY);
        let muse = k.selp(0f32, mnew, none);
        let dm = k.sub(w.m[h], muse);
        let alpha = k.ex2(dm);
        k.mov_to(w.m[h], mnew);
        let neg = k.neg(muse);
        let mut sum = k.mov(0f32);
        for a in s {
            for e in [2 * h, 2 * h + 1] {
                let x = k.fma(a[e], c, neg);
                let pv = k.ex2(x);
                k.mov_to(a[e], pv);
                sum = k.add(sum, pv);
            }
        }
        k.fma_to(w.l[h], w.l[h], alpha, sum);
        for a in &w.o {
            k.mul_to(a[2 * h], a[2 * h], alpha);
            k.mul_to(a[2 * h + 1], a[2 * h + 1], alpha);
        }
    }
    // P (bf16) -> P tile rows 16rg + g + 8h, columns 16cw + 8n + 2q
    let wrow = k.mul(w.rg, 16u32);
    for h in 0..2u32 {
        let r = k.add(wrow, w.ln.g);
        let r = k.add(r, 8 * h);
        for (n, a) in s.iter().enumerate() {
            let chunk = k.mad_lo(w.cw, 2u32, n as u32);
            let off = crate::tile::swz_reg(k, r, chunk);
            let q4 = k.shl(w.ln.q, 2u32);
            let off = k.add(off, q4);
            let addr = k.add(sm.tp.base, off);
            let v = k.cvt_bf16x2(a[2 * h as usize + 1], a[2 * h as usize]);
            k.st(SharedPtr::<Bf16x2>::from_reg(addr), v);
        }
    }
}

/// Final per-split output (partial rows from `bs * rows`): row sums over the 4 column warps,
/// O / l (f32) and LSE (natural log; -inf and O = 0 for rows that saw no key in this split).
fn write_partial(
    k: &mut KernelBuilder,
    p: &DecParams,
    w: &Warp,
    rows: [Reg<u32>; 2],
    bs: Reg<u32>,
) {
    k.sync_threads();
    for h in 0..2usize {
        let ls = quad_reduce(k, w.l[h], false);
        w.publish(k, h, ls);
    }
    k.sync_threads();
    let cbase = k.mul(w.cw, w.nv * 8);
    let col = k.shl(w.ln.q, 1u32);
    let col = k.add(col, cbase);
    for h in 0..2usize {
        let lt = w.fold(k, h, |k, a, b| k.add(a, b));
        let ok = k.lt(rows[h], p.rows);
        let pr = k.mad_lo(bs, p.rows, rows[h]);
        let empty = k.eq(lt, 0f32);
        let inv = k.rcp(lt);
        let inv = k.selp(0f32, inv, empty);
        k.if_(ok, |k| {
            let e = k.mul(pr, w.nv * 32); // f32 elements per row = d_v = 32 nv
            let e = k.add(e, col);
            for (n, acc) in w.o.iter().enumerate() {
                let v0 = k.mul(acc[2 * h], inv);
                let v1 = k.mul(acc[2 * h + 1], inv);
                let en = k.add(e, (8 * n) as u32);
                k.st_v(p.o_part.offset(en), [v0, v1]);
            }
            let lg = k.lg2(lt);
            let s = k.add(w.m[h], lg);
            let lse = k.mul(s, std::f32::consts::LN_2);
            let lse = k.selp(f32::NEG_INFINITY, lse, empty);
            let w0 = k.eq(w.cw, 0u32);
            let q0 = k.eq(w.ln.q, 0u32);
            let lse_lane = k.and(w0, q0);
            k.when(lse_lane, |k| k.st(p.lse_part.offset(pr), lse));
        });
    }
}

pub const COMBINE_NAME: &str = "mla_decode_combine";
pub const COMBINE_PARAMS: &[(&str, &str)] = &[
    ("o_part", "f32*"),
    ("lse_part", "f32*"),
    ("o", "bf16*"),
    ("lse", "f32*"),
    ("batch_rows", "u32"),
    ("rows", "u32"),
    ("splits", "u32"),
    ("d_v", "u32"),
];

/// Combine: one warp per (sequence, row): LSE = log sum exp(lse_s), O = sum exp(lse_s - LSE) O_s.
pub fn gen_combine(t: &Target) -> Result<ptx::Module> {
    check_target(COMBINE_NAME, t, TARGETS)?;
    let mut k = KernelBuilder::new(COMBINE_NAME, t.clone());
    k.reqntid(&[256]);
    let op = k.param_ptr_aligned::<f32>("o_part", 16);
    let lp = k.param_ptr_aligned::<f32>("lse_part", 4);
    let out = k.param_ptr_aligned::<u8>("o", 8);
    let lse = k.param_ptr_aligned::<f32>("lse", 4);
    let brows = k.param::<u32>("batch_rows");
    let rows = k.param::<u32>("rows");
    let splits = k.param::<u32>("splits");
    let dv = k.param::<u32>("d_v");
    let tid = k.tid_x();
    let lane = k.and(tid, 31u32);
    let w = k.shr(tid, 5u32);
    let bx = k.ctaid_x();
    let gr = k.mad_lo(bx, 8u32, w);
    let done = k.ge(gr, brows);
    k.when(done, |k| k.exit());
    let b = k.div(gr, rows);
    let r = k.rem(gr, rows);
    let bs = k.mul(b, splits);
    // partial (b, s, r) at (bs + s) * rows + r
    let first = k.mad_lo(bs, rows, r);
    let mx = k.mov(f32::NEG_INFINITY);
    k.for_range(0u32, splits, 1u32, |k, s| {
        let i = k.mad_lo(s, rows, first);
        let v = k.ld(lp.offset(i));
        k.max_to(mx, mx, v);
    });
    let none = k.eq(mx, f32::NEG_INFINITY);
    let muse = k.selp(0f32, mx, none);
    let sum = k.mov(0f32);
    k.for_range(0u32, splits, 1u32, |k, s| {
        let i = k.mad_lo(s, rows, first);
        let v = k.ld(lp.offset(i));
        let d = k.sub(v, muse);
        let d = k.mul(d, LOG2E);
        let e = k.ex2(d);
        k.add_to(sum, sum, e);
    });
    let inv = k.rcp(sum);
    let lg = k.lg2(sum);
    let lg = k.mul(lg, std::f32::consts::LN_2);
    let total = k.add(muse, lg);
    let l0 = k.eq(lane, 0u32);
    k.when(l0, |k| k.st(lse.offset(gr), total));
    // columns: 4 per lane per pass
    let c0 = k.shl(lane, 2u32);
    k.for_range(c0, dv, 128u32, |k, c| {
        let acc: [Reg<f32>; 4] = k.regs();
        for x in acc {
            k.mov_to(x, 0f32);
        }
        k.for_range(0u32, splits, 1u32, |k, s| {
            let i = k.mad_lo(s, rows, first);
            let v = k.ld(lp.offset(i));
            let d = k.sub(v, muse);
            let d = k.mul(d, LOG2E);
            let wgt = k.ex2(d);
            let wgt = k.mul(wgt, inv);
            let e = k.mad_lo(i, dv, c);
            let x: [Reg<f32>; 4] = k.ld_v(op.offset(e));
            for j in 0..4 {
                k.fma_to(acc[j], x[j], wgt, acc[j]);
            }
        });
        let lo = k.cvt_bf16x2(acc[1], acc[0]);
        let hi = k.cvt_bf16x2(acc[3], acc[2]);
        let e = k.mad_lo(gr, dv, c);
        let e2 = k.mul_wide(e, 2u32);
        let a = k.add(out.reg(), e2);
        let wlo: Reg<B32> = k.bitcast(lo);
        let whi: Reg<B32> = k.bitcast(hi);
        k.st_v(GlobalPtr::<B32>::from_reg(a), [wlo, whi]);
    });
    Ok(k.finish()?)
}

/// A decoding problem.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeShape {
    /// query heads
    pub heads: usize,
    /// new query tokens per sequence (1, or a few for speculative decoding)
    pub s_q: usize,
    /// latent width (kv_lora_rank; V3 512) = value width
    pub d_v: usize,
    /// decoupled RoPE key width (V3 64)
    pub d_rope: usize,
    pub scale: f32,
    /// blocks in the cache
    pub num_blocks: usize,
    /// width of the block table
    pub max_blocks: usize,
    /// KV splits per sequence (0 = choose from the device size)
    pub num_splits: usize,
}

/// Device buffers of decoding.
pub struct DecodeArgs<'a> {
    pub q: &'a Buffer<bf16>,
    pub kv_cache: &'a Buffer<bf16>,
    pub block_table: &'a Buffer<i32>,
    pub seqlens: &'a Buffer<i32>,
    /// f32 workspaces: `[batch, splits, s_q*heads, d_v]` and `[batch, splits, s_q*heads]`
    /// (see [`workspace_len`])
    pub o_part: &'a mut Buffer<f32>,
    pub lse_part: &'a mut Buffer<f32>,
    pub o: &'a mut Buffer<bf16>,
    pub lse: &'a mut Buffer<f32>,
}

/// Splits used for `batch` sequences on a device with `sms` SMs (`sh.num_splits` when set):
/// enough CTAs to cover the SMs twice, at most one split per block of the longest sequence.
pub fn choose_splits(sh: &DecodeShape, batch: usize, sms: u32) -> usize {
    if sh.num_splits > 0 {
        return sh.num_splits;
    }
    let ctas = batch * (sh.s_q * sh.heads).div_ceil(64);
    (2 * sms as usize)
        .div_ceil(ctas.max(1))
        .clamp(1, sh.max_blocks.clamp(1, MAX_SPLITS))
}

/// (o_part, lse_part) element counts for `batch` sequences and `splits`.
pub fn workspace_len(sh: &DecodeShape, batch: usize, splits: usize) -> (usize, usize) {
    let rows = batch * splits * sh.s_q * sh.heads;
    (rows * sh.d_v, rows)
}

fn validate(name: &str, sh: &DecodeShape) -> Result<()> {
    if sh.d_v % 64 != 0 || sh.d_v == 0 || sh.d_v > DV_MAX {
        return shape_err(
            name,
            format!(
                "d_v (kv_lora_rank) = {}: must be a multiple of 64 in [64, {DV_MAX}]",
                sh.d_v
            ),
        );
    }
    if sh.d_rope % 16 != 0 || sh.d_rope > DROPE_MAX {
        return shape_err(
            name,
            format!(
                "d_rope = {}: must be a multiple of 16 <= {DROPE_MAX}",
                sh.d_rope
            ),
        );
    }
    if sh.heads == 0 || sh.s_q == 0 || sh.s_q * sh.heads > 1 << 16 {
        return shape_err(name, "heads and s_q must be >= 1 with s_q*heads <= 65536");
    }
    if sh.num_splits > MAX_SPLITS {
        return shape_err(
            name,
            format!("num_splits = {} exceeds {MAX_SPLITS}", sh.num_splits),
        );
    }
    check_scale(name, sh.scale)
}

/// Checks lengths and block-table entries (downloaded: a few bytes per sequence).
fn check_table(name: &str, sh: &DecodeShape, lens: &[i32], table: &[i32]) -> Result<()> {
    for (b, &len) in lens.iter().enumerate() {
        let len = len as i64;
        if len < sh.s_q as i64 || len > (sh.max_blocks * BLOCK as usize) as i64 {
            return shape_err(
                name,
                format!(
                    "seqlens[{b}] = {len}: must be in [s_q = {}, max_blocks*64 = {}]",
                    sh.s_q,
                    sh.max_blocks * 64
                ),
            );
        }
        let used = (len as usize).div_ceil(BLOCK as usize);
        for j in 0..used {
            let e = table[b * sh.max_blocks + j];
            if e < 0 || e as usize >= sh.num_blocks {
                return shape_err(
                    name,
                    format!(
                        "block_table[{b}][{j}] = {e} is outside the cache ({} blocks)",
                        sh.num_blocks
                    ),
                );
            }
        }
    }
    Ok(())
}

/// The kernel configuration for a device: 64 query rows per CTA when there are that many, the
/// RoPE width is a multiple of 64 and the device has the shared memory, else 16; two cache
/// blocks in flight when the shared memory allows.
pub fn choose_spec(sh: &DecodeShape, max_shared: u32) -> DecodeSpec {
    let big = DecodeSpec {
        d_v: sh.d_v as u32,
        d_rope: sh.d_rope as u32,
        row_groups: 4,
        stages: 1,
    };
    let s = if sh.s_q * sh.heads >= 64 && sh.d_rope % 64 == 0 && big.shared_bytes() <= max_shared {
        big
    } else {
        DecodeSpec {
            row_groups: 1,
            ..big
        }
    };
    let two = DecodeSpec { stages: 2, ..s };
    if two.shared_bytes() <= max_shared {
        two
    } else {
        s
    }
}

/// Decodes: O and LSE for every query row of every sequence (two launches: split kernel and
/// combine). Lengths and block-table entries are validated on the host before launch.
pub fn mla_decode(stream: &Stream, sh: &DecodeShape, a: DecodeArgs) -> Result<()> {
    let dev = stream.device();
    let spec = choose_spec(sh, dev.props().max_shared_per_block);
    mla_decode_with(stream, &spec, sh, a)
}

/// [`mla_decode`] with an explicit kernel configuration.
pub fn mla_decode_with(
    stream: &Stream,
    spec: &DecodeSpec,
    sh: &DecodeShape,
    a: DecodeArgs,
) -> Result<()> {
    mla_decode_observed(stream, spec, sh, a, &mut |_| {})
}

/// [`mla_decode_with`] calling `after(kernel name)` after each of its two launches is queued
/// (benchmarks read the emulator's per-launch statistics there).
pub fn mla_decode_observed(
    stream: &Stream,
    spec: &DecodeSpec,
    sh: &DecodeShape,
    a: DecodeArgs,
    after: &mut dyn FnMut(&str),
) -> Result<()> {
    let name = spec.name();
    validate(&name, sh)?;
    let max_shared = stream.device().props().max_shared_per_block;
    if spec.shared_bytes() > max_shared {
        return shape_err(
            &name,
            format!(
                "needs {} bytes of shared memory, the device has {max_shared}",
                spec.shared_bytes()
            ),
        );
    }
    if spec.d_v as usize != sh.d_v || spec.d_rope as usize != sh.d_rope {
        return shape_err(&name, "kernel configuration does not match the shape");
    }
    let lens = a.seqlens.to_vec()?;
    let batch = lens.len();
    need(&name, "block_table", a.block_table, batch * sh.max_blocks)?;
    let table = a.block_table.to_vec()?;
    check_table(&name, sh, &lens, &table)?;
    let dk = sh.d_v + sh.d_rope;
    let rows = sh.s_q * sh.heads;
    need(&name, "q", a.q, batch * rows * dk)?;
    need(
        &name,
        "kv_cache",
        a.kv_cache,
        sh.num_blocks * BLOCK as usize * dk,
    )?;
    need(&name, "o", a.o, batch * rows * sh.d_v)?;
    need(&name, "lse", a.lse, batch * rows)?;
    let splits = choose_splits(sh, batch, stream.sm_count());
    if batch > 65535 || (batch * splits * rows).saturating_mul(sh.d_v) >= 1 << 32 {
        return shape_err(
            &name,
            format!("batch {batch} x {splits} splits x {rows} rows is too large for one launch"),
        );
    }
    let (wo, wl) = workspace_len(sh, batch, splits);
    need(&name, "o_part", a.o_part, wo)?;
    need(&name, "lse_part", a.lse_part, wl)?;
    if batch == 0 {
        return Ok(());
    }
    let f = function(stream.device(), &name, "", |t| gen_decode(t, spec))?;
    let grid = [
        splits as u32,
        rows.div_ceil(spec.rows() as usize) as u32,
        batch as u32,
    ];
    let cfg = LaunchConfig::grid3(grid, [spec.threads(), 1, 1]).shared(spec.shared_bytes());
    let c = sh.scale * LOG2E;
    stream.launch(
        &f,
        &cfg,
        &args![
            a.q,
            a.kv_cache,
            a.block_table,
            a.seqlens,
            &*a.o_part,
            &*a.lse_part,
            rows as u32,
            sh.heads as u32,
            sh.s_q as u32,
            sh.max_blocks as u32,
            splits as u32,
            c
        ],
    )?;
    after(&name);
    let f = function(stream.device(), COMBINE_NAME, "", gen_combine)?;
    let br = batch * rows;
    let cfg = LaunchConfig::grid3([br.div_ceil(8) as u32, 1, 1], [256, 1, 1]);
    stream.launch(
        &f,
        &cfg,
        &args![
            &*a.o_part,
            &*a.lse_part,
            &*a.o,
            &*a.lse,
            br as u32,
            rows as u32,
            splits as u32,
            sh.d_v as u32
        ],
    )?;
    after(COMBINE_NAME);
    Ok(())
}
