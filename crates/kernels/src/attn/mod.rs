//! MLA attention: the training forward/backward (FlashAttention-2 style, causal, variable
//! lengths through cumulative offsets) and FlashMLA-style decoding against a paged latent KV
//! cache, `mma.sync.m16n8k16` BF16 with FP32 accumulation, and sm_90a training kernels with
//! `wgmma` math and TMA loads.
//!
//! This module owns the shared-tile layout and fragment loaders the attention kernels share:
//! a tile of `rows` x `d` bf16 lives in shared memory as `ceil(d/64)` *panels* of `rows` 128-byte
//! rows (64 columns each), every panel with the XOR swizzle of [`crate::tile`] (16-byte chunk `c`
//! of row `r` at chunk `c ^ (r & 7)`), so `ldmatrix` phases and `cp.async` rows are
//! conflict-free for any head dimension that is a multiple of 16. The same panels are the
//! 128B-swizzle canonical layout of `wgmma` descriptors and of TMA boxes of 64 columns.
//!
//! - [`fwd`]: training forward (O, per-row log-sum-exp).
//! - [`bwd`]: training backward (D = rowsum(dO*O), then dK/dV per key tile, then dQ per query
//!   tile: deterministic, no atomics).
//! - [`fwd90`], [`bwd90`]: the sm_90a forward and backward kernels (TMA loads through
//!   mbarrier rings, a producer warp, `wgmma` math), selected by the same host calls on an
//!   sm_90a device; [`sm90`]: the TMA / tensor-map / wgmma pieces they share.
//! - [`decode`]: absorbed-MLA decoding over a paged cache, split-KV + LSE-weighted combine.
//! - [`reference`]: f64 CPU references; [`registry`]: registry entries and their checks.

pub mod bwd;
pub mod bwd90;
pub mod decode;
pub mod fwd;
pub mod fwd90;
pub mod reference;
pub mod registry;
pub mod sm90;

use crate::tile::ROW_BYTES;
use crate::{shape_err, Result};
use builder::*;
use runtime::{Buffer, Pod};

/// Targets of the attention kernels (`mma.sync` BF16, `cp.async`, `ldmatrix`).
pub const TARGETS: &[&str] = &["sm_80", "sm_89", "sm_90a"];
/// Head dimensions accepted by the training kernels: multiples of 16 in this range.
pub const D_MIN: usize = 32;
pub const D_MAX: usize = 256;
/// Longest sequence the training kernels accept (32-bit row indexing with margin).
pub const MAX_SEQLEN: usize = 1 << 20;

pub(crate) type Frag = Reg<Bf16x2>;
pub(crate) type Mma = M16N8K16Bf16;

/// Bytes of a `rows` x `d` bf16 panel tile.
pub(crate) fn tile_bytes(rows: u32, d: u32) -> u32 {
    d.div_ceil(64) * rows * ROW_BYTES
}

/// A panel tile in shared memory.
#[derive(Clone, Copy)]
pub(crate) struct Tile {
    pub base: Reg<u32>,
    pub rows: u32,
    pub d: u32,
    /// 0: columns contiguous (column c in panel c / 64). Else the first column that starts a
    /// fresh panel (a K tile TMA-loaded as [nope panels | rope panels], `split` = d_nope; read
    /// only by the wgmma products of [`sm90`], the `ldmatrix` loaders take contiguous tiles).
    pub split: u32,
}

impl Tile {
    /// A tile with contiguous columns.
    pub fn new(base: Reg<u32>, rows: u32, d: u32) -> Tile {
        Tile {
            base,
            rows,
            d,
            split: 0,
        }
    }
}

/// Consecutive panel tiles of `(rows, d)` from `base` (each a multiple of 1024 bytes, so a
/// 1024-aligned base keeps every tile 1024-aligned).
pub(crate) fn tiles<const N: usize>(
    k: &mut KernelBuilder,
    base: Reg<u32>,
    dims: [(u32, u32); N],
) -> [Tile; N] {
    let mut off = 0;
    dims.map(|(rows, d)| {
        let b = if off == 0 { base } else { k.add(base, off) };
        off += tile_bytes(rows, d);
        Tile::new(b, rows, d)
    })
}

/// Causal key tiles of `bn` keys a block of `rows` query rows from `q0` attends to (up to its
/// last row inside the sequence of length `len`).
pub(crate) fn causal_key_tiles(
    k: &mut KernelBuilder,
    q0: Reg<u32>,
    rows: u32,
    len: Reg<u32>,
    bn: u32,
) -> Reg<u32> {
    let qe = k.add(q0, rows);
    let kend = k.min(qe, len);
    let nt = k.add(kend, bn - 1);
    k.div(nt, bn)
}

/// This CTA's sequence (`cu_seqlens[ctaid.z]..`) and head (`ctaid.y`).
#[derive(Clone, Copy)]
pub(crate) struct Seq {
    pub start: Reg<u32>,
    pub len: Reg<u32>,
    pub h: Reg<u32>,
    pub heads: Reg<u32>,
}

impl Seq {
    pub(crate) fn load(k: &mut KernelBuilder, cup: GlobalPtr<i32>, heads: Reg<u32>) -> Seq {
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
    pub(crate) fn row(&self, k: &mut KernelBuilder, r: Reg<u32>) -> Reg<u32> {
        let t = k.add(self.start, r);
        k.mad_lo(t, self.heads, self.h)
    }
    pub(crate) fn ptr(
        &self,
        k: &mut KernelBuilder,
        p: GlobalPtr<u8>,
        r: Reg<u32>,
        d: u32,
    ) -> Reg<u64> {
        let gr = self.row(k, r);
        wide_off(k, p.reg(), gr, d * 2)
    }
    /// `cp.async` of sequence rows `r0..` of `[total, heads, t.d]` tensor `p` (row stride
    /// `stride` bytes) into tile `t` (rows past the sequence's end zero-filled; the caller
    /// commits).
    pub(crate) fn load_tile(
        &self,
        k: &mut KernelBuilder,
        (nt, t): (u32, &Tile),
        (p, stride): (GlobalPtr<u8>, Reg<u32>),
        r0: Reg<u32>,
    ) {
        let tid = k.tid_x();
        let src = self.ptr(k, p, r0, t.d);
        let valid = k.sub(self.len, r0);
        load_tile(k, tid, nt, t, src, stride, valid);
    }
    /// Row stride in bytes of a `[total, heads, d]` tensor.
    pub(crate) fn stride(&self, k: &mut KernelBuilder, d: u32) -> Reg<u32> {
        k.mul(self.heads, d * 2)
    }
    /// `cp.async` of the K rows `r0..` (both K sources) into tile `t`.
    pub(crate) fn load_k(&self, k: &mut KernelBuilder, nt: u32, t: &Tile, ks: &KSrc, r0: Reg<u32>) {
        let tid = k.tid_x();
        let valid = k.sub(self.len, r0);
        let tok0 = k.add(self.start, r0);
        load_k(k, tid, nt, t, ks, (tok0, self.heads, self.h), valid);
    }
}

/// Sequence of this CTA and its first row `ctaid.x * rows` (the CTA exits when that is past
/// the sequence's end).
pub(crate) fn start_cta(
    k: &mut KernelBuilder,
    cu: GlobalPtr<i32>,
    heads: Reg<u32>,
    rows: u32,
) -> (Seq, Reg<u32>) {
    let sq = Seq::load(k, cu, heads);
    let bx = k.ctaid_x();
    let r0 = k.mul(bx, rows);
    let done = k.ge(r0, sq.len);
    k.when(done, |k| k.exit());
    (sq, r0)
}

/// Per-lane constants of the fragment loaders.
pub(crate) struct Lanes {
    /// g = lane / 4 (accumulator row), q = lane % 4 (accumulator column pair)
    pub g: Reg<u32>,
    pub q: Reg<u32>,
    l7: Reg<u32>,
    l16: Reg<u32>,
    l8: Reg<u32>,
    /// "A-style" addressing (rows l7 + 8*l8, chunk + l16): A operands and transposed B operands.
    ra: Reg<u32>,
    xa: [Reg<u32>; 4],
    /// "B-style" addressing (rows l7 + 8*l16, chunk + l8): non-transposed B operands.
    rb: Reg<u32>,
    xb: [Reg<u32>; 4],
}

impl Lanes {
    pub fn new(k: &mut KernelBuilder, lane: Reg<u32>) -> Lanes {
        let g = k.shr(lane, 2u32);
        let q = k.and(lane, 3u32);
        let l7 = k.and(lane, 7u32);
        let l8 = k.shr(lane, 3u32);
        let l8 = k.and(l8, 1u32);
        let l16 = k.shr(lane, 4u32);
        let ra = k.mad_lo(l8, 8u32, l7);
        let ra = k.shl(ra, 7u32);
        let rb = k.mad_lo(l16, 8u32, l7);
        let rb = k.shl(rb, 7u32);
        let mut xa = Vec::new();
        let mut xb = Vec::new();
        for i in 0..4u32 {
            let x = k.add(l16, 2 * i);
            let x = k.xor(x, l7);
            xa.push(k.shl(x, 4u32));
            let y = k.add(l8, 2 * i);
            let y = k.xor(y, l7);
            xb.push(k.shl(y, 4u32));
        }
        Lanes {
            g,
            q,
            l7,
            l16,
            l8,
            ra,
            xa: [xa[0], xa[1], xa[2], xa[3]],
            rb,
            xb: [xb[0], xb[1], xb[2], xb[3]],
        }
    }
}

/// Which lanes address which rows / chunks of the four 8x8 matrices of an `ldmatrix.x4`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    /// rows 0-15 x chunks {c0, c0+1}, matrices (r0-7,c0) (r8-15,c0) (r0-7,c0+1) (r8-15,c0+1):
    /// an A fragment, or (with `.trans`) the B fragments of two n-tiles from a [k][n] tile.
    A,
    /// matrices (r0-7,c0) (r0-7,c0+1) (r8-15,c0) (r8-15,c0+1): the B fragments of two n-tiles
    /// from an [n][k] tile.
    B,
}

/// Shared address of this lane's row for an `ldmatrix` at tile row `row0 + row_reg` (`row_reg`
/// a per-warp row offset, a multiple of 8), chunk `c0` (16-byte chunks along `d`).
pub(crate) fn frag_addr(
    k: &mut KernelBuilder,
    ln: &Lanes,
    t: &Tile,
    row_reg: Option<Reg<u32>>,
    row0: u32,
    c0: u32,
    style: Style,
) -> Reg<u32> {
    let (rl, xs, cl) = match style {
        Style::A => (ln.ra, &ln.xa, ln.l16),
        Style::B => (ln.rb, &ln.xb, ln.l8),
    };
    let mut a = k.add(t.base, rl);
    if let Some(r) = row_reg {
        let rb = k.shl(r, 7u32);
        a = k.add(a, rb);
    }
    if c0 % 2 == 0 {
        // both chunks of the pair are in panel c0 / 8
        let off = (c0 / 8) * t.rows * ROW_BYTES + row0 * ROW_BYTES;
        let a = k.add(a, xs[((c0 % 8) / 2) as usize]);
        k.add(a, off)
    } else {
        // the pair straddles chunks c0, c0 + 1, possibly two panels: per-lane panel arithmetic
        let c = k.add(cl, c0);
        let off = chunk_off(k, ln, t, c);
        let a = k.add(a, off);
        k.add(a, row0 * ROW_BYTES)
    }
}

/// Byte offset of this lane's chunk `c` (a full chunk index along `d`) in a panel tile row:
/// its panel's base plus the swizzled position (rows are multiples of 8 plus `l7`).
fn chunk_off(k: &mut KernelBuilder, ln: &Lanes, t: &Tile, c: Reg<u32>) -> Reg<u32> {
    let panel = k.shr(c, 3u32);
    let c7 = k.and(c, 7u32);
    let x = k.xor(c7, ln.l7);
    let x = k.shl(x, 4u32);
    k.mad_lo(panel, t.rows * ROW_BYTES, x)
}

/// A-style lane address (rows `row0 + l7 + 8*l8`, chunk `c0 + l16`) with a runtime first chunk.
pub(crate) fn frag_addr_rt(
    k: &mut KernelBuilder,
    ln: &Lanes,
    t: &Tile,
    row0: u32,
    c0: Reg<u32>,
) -> Reg<u32> {
    let c = k.add(c0, ln.l16);
    let off = chunk_off(k, ln, t, c);
    let a = k.add(t.base, ln.ra);
    let a = k.add(a, off);
    k.add(a, row0 * ROW_BYTES)
}

/// `ldmatrix.x4` of 16 rows x 2 chunks (see [`Style`]).
pub(crate) fn ld_x4(
    k: &mut KernelBuilder,
    ln: &Lanes,
    t: &Tile,
    row_reg: Option<Reg<u32>>,
    row0: u32,
    c0: u32,
    style: Style,
    trans: bool,
) -> [Frag; 4] {
    let a = frag_addr(k, ln, t, row_reg, row0, c0, style);
    k.ldmatrix::<Bf16x2, u8, 4>(SharedPtr::<u8>::from_reg(a), trans)
}

/// `ldmatrix.x2.trans` of 16 rows x chunk `c0`: the B fragment of one n-tile from a [k][n] tile.
pub(crate) fn ld_x2_trans(
    k: &mut KernelBuilder,
    ln: &Lanes,
    t: &Tile,
    row_reg: Option<Reg<u32>>,
    row0: u32,
    c0: u32,
) -> [Frag; 2] {
    // lanes 0-15 address rows 0-15 of chunk c0 (A-style); lanes 16-31 are ignored by .x2
    let a = frag_addr(k, ln, t, row_reg, row0, c0, Style::A);
    k.ldmatrix::<Bf16x2, u8, 2>(SharedPtr::<u8>::from_reg(a), true)
}

/// B fragments (`[b0, b1]` per n-tile) of `ntiles` n-tiles starting at chunk `c0`, k rows
/// `row0..row0+16`, from a [k][n] tile (`.trans`).
pub(crate) fn ld_b_trans(
    k: &mut KernelBuilder,
    ln: &Lanes,
    t: &Tile,
    row0: u32,
    c0: u32,
    ntiles: u32,
) -> Vec<[Frag; 2]> {
    let mut v = Vec::new();
    let mut j = 0;
    while j + 2 <= ntiles {
        let r = ld_x4(k, ln, t, None, row0, c0 + j, Style::A, true);
        v.push([r[0], r[1]]);
        v.push([r[2], r[3]]);
        j += 2;
    }
    if j < ntiles {
        v.push(ld_x2_trans(k, ln, t, None, row0, c0 + j));
    }
    v
}

/// Copies a `rows` x `t.d` bf16 tile from global rows `src + r * stride` (r < `valid`; the
/// rest are zero-filled) into panel tile `t` with `cp.async` (the caller commits).
///
/// Threads enumerate (row, panel, *physical* chunk): the 8 lanes of a 128-byte phase fill the 8
/// distinct bank groups of one swizzled panel row (conflict-free even for partial panels, e.g.
/// d = 32 or 48, whose unused chunks are skipped) and read one 128-byte span of a global row.
pub(crate) fn load_tile(
    k: &mut KernelBuilder,
    tid: Reg<u32>,
    nthreads: u32,
    t: &Tile,
    src: Reg<u64>,
    stride: Reg<u32>,
    valid: Reg<u32>,
) {
    let rows = RowSrc { src, stride, valid };
    load_tile_cols(k, tid, nthreads, t, rows, 0..t.d / 8);
}

/// Global rows feeding a tile: row r at `src + r * stride` for r < `valid` (zeros after).
#[derive(Clone, Copy)]
pub(crate) struct RowSrc {
    pub src: Reg<u64>,
    pub stride: Reg<u32>,
    pub valid: Reg<u32>,
}

/// [`load_tile`] of the 16-byte chunks `cols` of each row only, chunk c read from
/// `src + (c - cols.start) * 16` (a tile filled from two tensors, e.g. K = [k_nope | k_rope]).
pub(crate) fn load_tile_cols(
    k: &mut KernelBuilder,
    tid: Reg<u32>,
    nthreads: u32,
    t: &Tile,
    rs: RowSrc,
    cols: std::ops::Range<u32>,
) {
    let (p0, p1) = (cols.start / 8, cols.end.div_ceil(8));
    let np = p1 - p0;
    let total = t.rows * np * 8;
    let last = k.sub(rs.valid, 1u32);
    let pc = k.and(tid, 7u32);
    let pc16 = k.shl(pc, 4u32);
    let partial = cols.start % 8 != 0 || cols.end % 8 != 0;
    let mut it = 0;
    while it * nthreads < total {
        let idx = k.add(tid, it * nthreads);
        let rp = k.shr(idx, 3u32);
        let (row, panel) = if np == 1 {
            (rp, None)
        } else {
            (k.div(rp, np), Some(k.rem(rp, np)))
        };
        let panel = match panel {
            Some(p) if p0 > 0 => Some(k.add(p, p0)),
            Some(p) => Some(p),
            None if p0 > 0 => Some(k.mov(p0)),
            None => None,
        };
        let r7 = k.and(row, 7u32);
        let mut c = k.xor(pc, r7);
        if let Some(p) = panel {
            c = k.mad_lo(p, 8u32, c);
        }
        let ok = k.lt(row, rs.valid);
        let rc = k.min(row, last);
        let off = k.mul_wide(rc, rs.stride);
        let cs = k.sub(c, cols.start);
        let c16 = k.shl(cs, 4u32);
        let c64: Reg<u64> = k.cvt(c16);
        let s = k.add(rs.src, off);
        let s = k.add(s, c64);
        let rb = k.shl(row, 7u32);
        let mut d = k.add(rb, pc16);
        if let Some(p) = panel {
            d = k.mad_lo(p, t.rows * ROW_BYTES, d);
        }
        let d = k.add(d, t.base);
        let sz = k.selp::<u32>(16u32, 0u32, ok);
        let copy = |k: &mut KernelBuilder| {
            k.cp_async_zfill(
                SharedPtr::<u8>::from_reg(d),
                GlobalPtr::<u8>::from_reg(s),
                sz,
            )
        };
        let mut live = None;
        if (it + 1) * nthreads > total {
            live = Some(k.lt(idx, total));
        }
        if partial {
            let lo = k.ge(c, cols.start);
            let hi = k.lt(c, cols.end);
            let inside = k.and(lo, hi);
            live = Some(match live {
                Some(l) => k.and(l, inside),
                None => inside,
            });
        }
        match live {
            Some(l) => k.if_(l, copy),
            None => copy(k),
        }
        it += 1;
    }
}

/// Where K comes from: `[total, heads, d_qk]` (`rope == 0`), or `[total, heads, d_qk - rope]`
/// plus one RoPE key `[total, rope]` shared by all heads (MLA's decoupled key, not broadcast).
#[derive(Clone, Copy)]
pub(crate) struct KSrc {
    pub k: GlobalPtr<u8>,
    pub k_rope: GlobalPtr<u8>,
    pub rope: u32,
}

/// Copies K rows of tokens `tok0..` (`valid` of them, zeros after) of head `h` into tile `t`.
pub(crate) fn load_k(
    k: &mut KernelBuilder,
    tid: Reg<u32>,
    nthreads: u32,
    t: &Tile,
    ks: &KSrc,
    (tok0, heads, h): (Reg<u32>, Reg<u32>, Reg<u32>),
    valid: Reg<u32>,
) {
    let d_nope = t.d - ks.rope;
    let rh = k.mad_lo(tok0, heads, h);
    let src = wide_off(k, ks.k.reg(), rh, d_nope * 2);
    let stride = k.mul(heads, d_nope * 2);
    let rows = RowSrc { src, stride, valid };
    load_tile_cols(k, tid, nthreads, t, rows, 0..d_nope / 8);
    if ks.rope > 0 {
        let src = wide_off(k, ks.k_rope.reg(), tok0, ks.rope * 2);
        let stride = k.mov(ks.rope * 2);
        let rows = RowSrc { src, stride, valid };
        load_tile_cols(k, tid, nthreads, t, rows, d_nope / 8..t.d / 8);
    }
}

/// Name suffix of a shared-RoPE-key kernel.
pub(crate) fn rope_tag(rope: u32) -> String {
    if rope == 0 {
        String::new()
    } else {
        format!("_kr{rope}")
    }
}

/// `k` / `k_rope` buffer checks of a training call: element counts for `total` tokens, and
/// `k_rope` present exactly when `sh_rope > 0`.
pub(crate) fn check_k_buffers(
    kernel: &str,
    k: &Buffer<half::bf16>,
    k_rope: Option<&Buffer<half::bf16>>,
    (total, heads, d_qk, rope): (usize, usize, usize, usize),
) -> Result<()> {
    check_k_rope(kernel, d_qk, rope)?;
    need(kernel, "k", k, total * heads * (d_qk - rope))?;
    match (rope, k_rope) {
        (0, None) => Ok(()),
        (0, Some(_)) => shape_err(kernel, "`k_rope` given but the shape's k_rope is 0"),
        (_, None) => shape_err(kernel, "the shape's k_rope > 0 needs the `k_rope` buffer"),
        (r, Some(b)) => need(kernel, "k_rope", b, total * r),
    }
}

/// Checks a shared-RoPE-key width against d_qk (0 = K concatenated per head).
pub(crate) fn check_k_rope(kernel: &str, d_qk: usize, rope: usize) -> Result<()> {
    if rope % 16 != 0 || (rope > 0 && rope + 16 > d_qk) {
        return shape_err(
            kernel,
            format!(
                "k_rope = {rope}: a multiple of 16 leaving d_qk - k_rope >= 16 (d_qk = {d_qk})"
            ),
        );
    }
    Ok(())
}

/// Max (`max = true`) or sum over the 4 lanes of a quad (the lanes sharing an accumulator row).
pub(crate) fn quad_reduce(k: &mut KernelBuilder, v: Reg<f32>, max: bool) -> Reg<f32> {
    let mut m = v;
    for d in [1u32, 2] {
        let o = k.shfl_bfly(m, d);
        m = if max { k.max(m, o) } else { k.add(m, o) };
    }
    m
}

/// A fragment of the m16n8k16 A operand from two f32 accumulator n-tiles (`lo` = columns 0-7,
/// `hi` = 8-15 of the 16-wide k-step): the FlashAttention register reuse of P.
pub(crate) fn acc_to_a(k: &mut KernelBuilder, lo: [Reg<f32>; 4], hi: [Reg<f32>; 4]) -> [Frag; 4] {
    [
        k.cvt_bf16x2(lo[1], lo[0]),
        k.cvt_bf16x2(lo[3], lo[2]),
        k.cvt_bf16x2(hi[1], hi[0]),
        k.cvt_bf16x2(hi[3], hi[2]),
    ]
}

/// `n` zeroed f32 accumulator fragments.
pub(crate) fn zero_acc(k: &mut KernelBuilder, n: usize) -> Vec<[Reg<f32>; 4]> {
    (0..n)
        .map(|_| {
            let r: [Reg<f32>; 4] = k.regs();
            for x in r {
                k.mov_to(x, 0f32);
            }
            r
        })
        .collect()
}

/// Sets every accumulator element to 0.
pub(crate) fn clear(k: &mut KernelBuilder, acc: &[[Reg<f32>; 4]]) {
    for a in acc {
        for &x in a {
            k.mov_to(x, 0f32);
        }
    }
}

/// `p + i * scale` (64-bit).
pub(crate) fn wide_off(k: &mut KernelBuilder, p: Reg<u64>, i: Reg<u32>, scale: u32) -> Reg<u64> {
    let w = k.mul_wide(i, scale);
    k.add(p, w)
}

/// Checks a head dimension of the training kernels.
pub(crate) fn check_head_dim(kernel: &str, what: &str, d: usize) -> Result<()> {
    if d % 16 != 0 || !(D_MIN..=D_MAX).contains(&d) {
        return shape_err(
            kernel,
            format!("{what} = {d}: must be a multiple of 16 in [{D_MIN}, {D_MAX}]"),
        );
    }
    Ok(())
}

/// Checks that buffer `what` holds at least `len` elements.
pub(crate) fn need<T: Pod>(kernel: &str, what: &str, b: &Buffer<T>, len: usize) -> Result<()> {
    if b.len() < len {
        return shape_err(
            kernel,
            format!("`{what}` holds {} elements, needs {len}", b.len()),
        );
    }
    Ok(())
}

/// Validates cumulative sequence offsets (downloaded from the device: a few bytes per
/// sequence) and returns them: `cu[0] = 0`, non-decreasing, every length <= `max_seqlen` <=
/// [`MAX_SEQLEN`], at most 65535 sequences (grid z), total * heads < 2^31 (row indices).
pub(crate) fn check_cu_seqlens(
    kernel: &str,
    cu: &Buffer<i32>,
    max_seqlen: usize,
    heads: usize,
) -> Result<Vec<i32>> {
    if max_seqlen > MAX_SEQLEN {
        return shape_err(
            kernel,
            format!("max_seqlen = {max_seqlen} exceeds the limit {MAX_SEQLEN}"),
        );
    }
    let v = cu.to_vec()?;
    if v.len() < 2 || v[0] != 0 {
        return shape_err(
            kernel,
            "cu_seqlens must hold batch+1 >= 2 offsets starting at 0",
        );
    }
    if v.len() - 1 > 65535 {
        return shape_err(
            kernel,
            format!("{} sequences: at most 65535 per launch", v.len() - 1),
        );
    }
    for (i, w) in v.windows(2).enumerate() {
        let len = w[1] as i64 - w[0] as i64;
        if len < 0 || len as usize > max_seqlen {
            return shape_err(
                kernel,
                format!("sequence {i} has length {len}: must be in [0, max_seqlen = {max_seqlen}]"),
            );
        }
    }
    let total = *v.last().unwrap_or(&0) as usize;
    if total.saturating_mul(heads) >= 1 << 31 {
        return shape_err(
            kernel,
            format!("total tokens {total} x heads {heads} exceeds 2^31 rows"),
        );
    }
    Ok(v)
}

/// Checks a softmax scale.
pub(crate) fn check_scale(kernel: &str, scale: f32) -> Result<()> {
    if !(scale.is_finite() && scale > 0.0) {
        return shape_err(
            kernel,
            format!("softmax scale {scale} must be finite and > 0"),
        );
    }
    Ok(())
}

/// log2(e): the kernels work in base 2 (`ex2.approx`).
pub(crate) const LOG2E: f32 = std::f32::consts::LOG2_E;
