//! The f32 tile kernel: [`crate::tc_numerics::tile`] for the 16-row tiles of `mma.sync` and
//! `wgmma` (one warp's rows), with the 16 rows in the 16 lanes of one f32 vector (AVX-512F) or
//! two (AVX2). Same results as the portable code, bit for bit (tested); cheaper because:
//!
//! - **products in f32**: every supported input (f16, bf16, tf32, e4m3, e5m2) has at most 11
//!   significant bits, so a product has at most 22 and is exact in f32 whenever it is a normal
//!   f32 (checked per tile: each input must convert to f32 exactly with the low 13 significand
//!   bits zero, else the tile takes the f64 path);
//! - **a safe exponent range per block**: when the largest term of a block is zero or has an
//!   exponent e in [-101, 120], the f32 arithmetic is exact where it matters: a product too
//!   small to be a normal f32 (< 2^-126, possibly rounded) aligns below the truncation point
//!   (2^(e-F), F <= 24) and truncates to 0 either way; the scale factors 2^(F-e) and 2^(e-F)
//!   are normal f32; the block result (below 33 * 2^(e+1)) neither overflows nor is subnormal.
//!   Lanes outside that range (bf16/tf32 values near the ends of the FP32 range, subnormal
//!   accumulators) run [`block_sum`] for that block;
//! - aligned terms are truncated by one `cvttps2dq` and summed in i32 lanes (each below
//!   2^(F+1) <= 2^25, at most 33 of them);
//! - the exact integer sum is rounded toward zero to FP32 by the conversion itself
//!   (AVX-512's embedded rounding; on AVX2 a conversion to nearest, stepped back one ulp where
//!   it rounded away from zero), masked to `out_frac` fraction bits and scaled by 2^(e-F);
//! - the block's largest magnitude is one `vrangeps` per product vector (AVX-512DQ); on AVX2,
//!   where an absolute value is an extra operation, pass 1 multiplies |A| and |B| stored with
//!   the converted inputs, so it is one multiply and one max per product vector;
//! - a products' operand B value is broadcast from memory into the multiply, A's 16 rows of
//!   one k are one register, and G output columns are processed together (independent
//!   dependency chains), the common block lengths compiled as constants.
//!
//! Inputs are converted once per tile (A: gathers of 16 rows per k; B: 16-column chunks; C:
//! gathers of each column), so the conversion cost is per input, not per product.

use super::Tile16Fn;
use crate::tc_numerics::{block_sum, scalar_cols, TcModel};
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// Rows of a tile this kernel handles (one per vector lane).
const ROWS: usize = 16;
/// Largest k of a tile (the A columns are kept in a stack array).
const MAX_K: usize = 64;
/// Columns of B converted to f32 at a time.
const CHUNK: usize = 16;
/// Biased f32 exponents of a block's largest term that the f32 arithmetic handles exactly
/// (see the module docs: -101..=120 unbiased).
const E_LO: i32 = 26;
const E_HI: i32 = 247;
/// Significand bits below the 11 an input may have.
const LOW_BITS: u32 = 0x1fff;

/// The kernel for this CPU: AVX-512F+DQ, else AVX2, else `None`.
pub(crate) fn select() -> Option<Tile16Fn> {
    if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512dq") {
        return Some(tile_z);
    }
    if std::is_x86_feature_detected!("avx2") {
        return Some(tile_y);
    }
    None
}

/// Every kernel this CPU can run, by name (for the tests).
#[cfg(test)]
pub(crate) fn all() -> Vec<(&'static str, Tile16Fn)> {
    let mut v: Vec<(&'static str, Tile16Fn)> = Vec::new();
    if std::is_x86_feature_detected!("avx2") {
        v.push(("rows16-avx2", tile_y));
    }
    if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512dq") {
        v.push(("rows16-avx512", tile_z));
    }
    v
}

/// Whether the kernel handles this model and shape.
fn applies(m: &TcModel, a: &[f64], bt: &[f64], k: usize, cols: usize, acc: &[f64]) -> bool {
    m.block_len() <= 32
        && m.align_frac <= 24
        && m.out_frac <= 23
        && (1..=MAX_K).contains(&k)
        && (1..=1 << 20).contains(&cols)
        && acc.len() == ROWS * cols
        && a.len() >= ROWS * k
        && bt.len() >= k * cols
}

fn tile_z(m: &TcModel, a: &[f64], bt: &[f64], k: usize, cols: usize, acc: &mut [f64]) -> bool {
    if !applies(m, a, bt, k, cols, acc) {
        return false;
    }
    // SAFETY: `select` hands this function out only when the CPU reports AVX-512F and DQ;
    // `applies` checked the slice lengths and index ranges the kernel relies on.
    unsafe { tile_z_impl(m, a, bt, k, cols, acc) }
}

#[target_feature(enable = "avx512f,avx512dq,avx2")]
unsafe fn tile_z_impl(
    m: &TcModel,
    a: &[f64],
    bt: &[f64],
    k: usize,
    cols: usize,
    acc: &mut [f64],
) -> bool {
    drive::<Z, 4>(m, a, bt, k, cols, acc)
}

fn tile_y(m: &TcModel, a: &[f64], bt: &[f64], k: usize, cols: usize, acc: &mut [f64]) -> bool {
    if !applies(m, a, bt, k, cols, acc) {
        return false;
    }
    // SAFETY: `select` hands this function out only when the CPU reports AVX2; `applies`
    // checked the slice lengths and index ranges the kernel relies on.
    unsafe { tile_y_impl(m, a, bt, k, cols, acc) }
}

#[target_feature(enable = "avx2")]
unsafe fn tile_y_impl(
    m: &TcModel,
    a: &[f64],
    bt: &[f64],
    k: usize,
    cols: usize,
    acc: &mut [f64],
) -> bool {
    drive::<Y, 2>(m, a, bt, k, cols, acc)
}

/// The f64 inputs of the tile (for the per-block fallback).
struct Src<'a> {
    a: &'a [f64],
    bt: &'a [f64],
    k: usize,
    cols: usize,
}

/// A's columns as 16-row vectors (declines the tile when an input is not exact in f32 with 11
/// significant bits), then B in chunks of [`CHUNK`] columns.
#[inline(always)]
unsafe fn drive<V: Lanes16, const G: usize>(
    m: &TcModel,
    a: &[f64],
    bt: &[f64],
    k: usize,
    cols: usize,
    acc: &mut [f64],
) -> bool {
    let sa = V::stride();
    let mut at = [MaybeUninit::<V>::uninit(); 2 * MAX_K];
    let (mut ok, mut low) = (true, V::zero());
    for j in 0..k {
        let (v, o) = V::gather(a.as_ptr().add(j), k);
        ok &= o;
        low = low.or(v);
        at[j * sa].write(v);
        if V::PRE_ABS {
            at[j * sa + 1].write(v.abs());
        }
    }
    if !ok || low.low_bits() {
        return false;
    }
    // SAFETY (of the cast): the first k * sa entries were written above.
    let at = std::slice::from_raw_parts(at.as_ptr() as *const V, k * sa);
    let src = Src { a, bt, k, cols };
    let mut c0 = 0;
    while c0 < cols {
        let w = CHUNK.min(cols - c0);
        chunk::<V, G>(m, at, &src, c0, w, acc);
        c0 += w;
    }
    true
}

/// Columns `c0..c0 + w` (w <= [`CHUNK`]): B and C converted, G columns at a time through the
/// blocks, C written back. A chunk with an input the kernel cannot take (non-finite, not exact
/// in f32, or more than 11 significant bits in B) runs the portable per-output code.
#[inline(always)]
unsafe fn chunk<V: Lanes16, const G: usize>(
    m: &TcModel,
    at: &[V],
    src: &Src,
    c0: usize,
    w: usize,
    acc: &mut [f64],
) {
    let (k, cols) = (src.k, src.cols);
    let sb = V::stride() * CHUNK;
    let mut bf = [MaybeUninit::<f32>::uninit(); 2 * MAX_K * CHUNK];
    let (mut ok, mut low) = (true, V::zero());
    for j in 0..k {
        let dst = bf.as_mut_ptr().add(j * sb) as *mut f32;
        let (v, o) = V::load16(src.bt.as_ptr().add(j * cols + c0), w);
        v.store(dst);
        if V::PRE_ABS {
            v.abs().store(dst.add(CHUNK));
        }
        ok &= o;
        low = low.or(v);
    }
    let mut x = [V::zero(); CHUNK];
    for (cc, xc) in x[..w].iter_mut().enumerate() {
        let (v, o) = V::gather(acc.as_ptr().add(c0 + cc), cols);
        ok &= o;
        *xc = v;
    }
    if !ok || low.low_bits() {
        for r in 0..ROWS {
            let row = &mut acc[r * cols..r * cols + c0 + w];
            scalar_cols(m, &src.a[r * k..(r + 1) * k], src.bt, cols, c0, row);
        }
        return;
    }
    let bf = bf.as_ptr() as *const f32;
    for g in (0..w).step_by(G) {
        let xs: &mut [V; G] = (&mut x[g..g + G])
            .try_into()
            .unwrap_or_else(|_| unreachable!("CHUNK is a multiple of G"));
        columns::<V, G>(m, at, bf.add(g), src, c0 + g, xs);
    }
    for (cc, xc) in x[..w].iter().enumerate() {
        xc.scatter(acc.as_mut_ptr().add(c0 + cc), cols);
    }
}

/// The block loop of G columns (`at`: A's vectors, `bf`: B's converted row 0, column 0 of the
/// group, with their magnitudes interleaved when `V::PRE_ABS`; `col` is that column's index in
/// the tile), the common block lengths as constants.
#[inline(always)]
unsafe fn columns<V: Lanes16, const G: usize>(
    m: &TcModel,
    at: &[V],
    bf: *const f32,
    src: &Src,
    col: usize,
    x: &mut [V; G],
) {
    let (k, bl) = (at.len() / V::stride(), m.block_len());
    let mut k0 = 0;
    while k0 < k {
        let n = bl.min(k - k0);
        let (a, b) = (
            at.as_ptr().add(k0 * V::stride()),
            bf.add(k0 * V::stride() * CHUNK),
        );
        let blk = Blk { m, src, col, k0 };
        match n {
            4 => block::<V, G>(&blk, 4, a, b, x),
            8 => block::<V, G>(&blk, 8, a, b, x),
            16 => block::<V, G>(&blk, 16, a, b, x),
            32 => block::<V, G>(&blk, 32, a, b, x),
            _ => block::<V, G>(&blk, n, a, b, x),
        }
        k0 += n;
    }
}

/// Where a block is: its model, the tile's f64 inputs, its first column and first k.
struct Blk<'a> {
    m: &'a TcModel,
    src: &'a Src<'a>,
    col: usize,
    k0: usize,
}

/// One block of `n` products plus C for 16 rows x G columns: `a` points at the block's first
/// A vector, `b` at its first converted B row (G adjacent columns; with `V::PRE_ABS`, each A
/// vector and B row is followed by its magnitudes).
#[inline(always)]
unsafe fn block<V: Lanes16, const G: usize>(
    blk: &Blk,
    n: usize,
    a: *const V,
    b: *const f32,
    x: &mut [V; G],
) {
    let (sa, sb, m1) = (V::stride(), V::stride() * CHUNK, V::PRE_ABS as usize);
    // pass 1: the largest magnitude per output (products recomputed in pass 2)
    let mut big = [V::zero(); G];
    for g in 0..G {
        big[g] = x[g].abs();
    }
    for j in 0..n {
        let aj = *a.add(j * sa + m1);
        for (g, bg) in big.iter_mut().enumerate() {
            *bg = bg.max_mag(aj.mul_bcast(b.add(j * sb + m1 * CHUNK + g)));
        }
    }
    let f = blk.m.align_frac as i32;
    let (mut up, mut down, mut bad) = ([V::zero(); G], [V::zero(); G], [0u16; G]);
    for g in 0..G {
        (up[g], down[g], bad[g]) = big[g].scales(f);
    }
    // pass 2: aligned, truncated, summed in i32 lanes
    let mut s = [V::zero().trunc(); G];
    for g in 0..G {
        s[g] = x[g].mul(up[g]).trunc();
    }
    for j in 0..n {
        let aj = *a.add(j * sa);
        for (g, sg) in s.iter_mut().enumerate() {
            let t = aj.mul_bcast(b.add(j * sb + g)).mul(up[g]).trunc();
            *sg = V::add(*sg, t);
        }
    }
    let keep = !((1u32 << (23 - blk.m.out_frac)) - 1);
    for g in 0..G {
        let r = V::finish(s[g], keep, down[g]);
        x[g] = if bad[g] != 0 {
            redo_lanes(blk, n, g, x[g], r, bad[g])
        } else {
            r
        };
    }
}

/// The block of column `blk.col + g` through [`block_sum`] (f64) for the rows in `bad` (their
/// largest term is outside the safe range); `old` holds C, `new` the f32 results of the others.
#[cold]
#[inline(never)]
unsafe fn redo_lanes<V: Lanes16>(blk: &Blk, n: usize, g: usize, old: V, new: V, bad: u16) -> V {
    let (src, col) = (blk.src, blk.col + g);
    let (old, mut new) = (old.to_array(), new.to_array());
    let mut prods = [0f64; 32];
    for r in (0..ROWS).filter(|r| bad >> r & 1 == 1) {
        for (j, p) in prods[..n].iter_mut().enumerate() {
            let kk = blk.k0 + j;
            *p = src.a[r * src.k + kk] * src.bt[kk * src.cols + col];
        }
        new[r] = block_sum(blk.m, &prods[..n], old[r] as f64) as f32;
    }
    V::from_array(new)
}

/// 16 f32 lanes (rows) and the operations the kernel needs. Every method is `unsafe`: the
/// caller runs on a CPU with the implementation's target features, and pointers are valid for
/// the lanes read or written.
trait Lanes16: Copy {
    /// 16 i32 lanes.
    type I: Copy;
    /// Whether pass 1 multiplies stored magnitudes |A| and |B| (one max per product, no
    /// absolute value) instead of A and B.
    const PRE_ABS: bool;
    /// Vectors per k in the A array (and B rows per k, in units of [`CHUNK`]).
    #[inline(always)]
    fn stride() -> usize {
        1 + Self::PRE_ABS as usize
    }
    unsafe fn zero() -> Self;
    /// Lane r = `p[r * stride]` as f32, and whether every lane is finite and exact in f32.
    unsafe fn gather(p: *const f64, stride: usize) -> (Self, bool);
    /// `p[r * stride]` = lane r as f64.
    unsafe fn scatter(self, p: *mut f64, stride: usize);
    /// `p[0..w]` as f32 (0 beyond w), and whether all are finite and exact.
    unsafe fn load16(p: *const f64, w: usize) -> (Self, bool);
    /// `dst[0..16]` = the lanes.
    unsafe fn store(self, dst: *mut f32);
    unsafe fn or(self, o: Self) -> Self;
    /// Whether any lane has a bit of [`LOW_BITS`] set.
    unsafe fn low_bits(self) -> bool;
    unsafe fn abs(self) -> Self;
    /// max(self, |p|) for a non-negative self (p is non-negative when `PRE_ABS`).
    unsafe fn max_mag(self, p: Self) -> Self;
    unsafe fn mul(self, o: Self) -> Self;
    unsafe fn mul_bcast(self, s: *const f32) -> Self;
    /// From the largest magnitudes: 2^(F - e), 2^(e - F) for their exponents e (clamped to
    /// [`E_LO`]..=[`E_HI`]) and the mask of lanes outside the safe range (non-zero, e outside).
    unsafe fn scales(self, f: i32) -> (Self, Self, u16);
    /// Truncation toward zero to i32.
    unsafe fn trunc(self) -> Self::I;
    unsafe fn add(a: Self::I, b: Self::I) -> Self::I;
    /// `s` rounded toward zero to f32, masked with `keep`, times `down` (exact).
    unsafe fn finish(s: Self::I, keep: u32, down: Self) -> Self;
    unsafe fn to_array(self) -> [f32; 16];
    unsafe fn from_array(v: [f32; 16]) -> Self;
}

/// AVX-512: one zmm register.
#[derive(Clone, Copy)]
struct Z(__m512);

impl Lanes16 for Z {
    type I = __m512i;
    const PRE_ABS: bool = false;

    #[inline(always)]
    unsafe fn zero() -> Self {
        Z(_mm512_setzero_ps())
    }

    #[inline(always)]
    unsafe fn gather(p: *const f64, stride: usize) -> (Self, bool) {
        let s = stride as i32;
        let idx = _mm256_setr_epi32(0, s, 2 * s, 3 * s, 4 * s, 5 * s, 6 * s, 7 * s);
        let lo = _mm512_i32gather_pd::<8>(idx, p);
        let hi = _mm512_i32gather_pd::<8>(idx, p.add(8 * stride));
        z_from_halves(lo, hi)
    }

    #[inline(always)]
    unsafe fn scatter(self, p: *mut f64, stride: usize) {
        let s = stride as i32;
        let idx = _mm256_setr_epi32(0, s, 2 * s, 3 * s, 4 * s, 5 * s, 6 * s, 7 * s);
        let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(self.0));
        let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
            _mm512_castps_pd(self.0),
        )));
        _mm512_i32scatter_pd::<8>(p, idx, lo);
        _mm512_i32scatter_pd::<8>(p.add(8 * stride), idx, hi);
    }

    #[inline(always)]
    unsafe fn load16(p: *const f64, w: usize) -> (Self, bool) {
        let lanes = |n: usize| ((1u32 << n.min(8)) - 1) as __mmask8;
        let lo = _mm512_maskz_loadu_pd(lanes(w), p);
        let hi = _mm512_maskz_loadu_pd(lanes(w.saturating_sub(8)), p.add(8));
        z_from_halves(lo, hi)
    }

    #[inline(always)]
    unsafe fn store(self, dst: *mut f32) {
        _mm512_storeu_ps(dst, self.0);
    }

    #[inline(always)]
    unsafe fn or(self, o: Self) -> Self {
        Z(_mm512_or_ps(self.0, o.0))
    }

    #[inline(always)]
    unsafe fn low_bits(self) -> bool {
        let low = _mm512_set1_epi32(LOW_BITS as i32);
        _mm512_test_epi32_mask(_mm512_castps_si512(self.0), low) != 0
    }

    #[inline(always)]
    unsafe fn abs(self) -> Self {
        Z(_mm512_abs_ps(self.0))
    }

    #[inline(always)]
    unsafe fn max_mag(self, p: Self) -> Self {
        // imm8: bits 1:0 = 11 (larger magnitude), bits 3:2 = 10 (sign cleared)
        Z(_mm512_range_ps::<0b1011>(self.0, p.0))
    }

    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        Z(_mm512_mul_ps(self.0, o.0))
    }

    #[inline(always)]
    unsafe fn mul_bcast(self, s: *const f32) -> Self {
        Z(_mm512_mul_ps(self.0, _mm512_set1_ps(*s)))
    }

    #[inline(always)]
    unsafe fn scales(self, f: i32) -> (Self, Self, u16) {
        let bits = _mm512_castps_si512(self.0);
        let e = _mm512_srli_epi32::<23>(bits);
        let (lo, hi) = (_mm512_set1_epi32(E_LO), _mm512_set1_epi32(E_HI));
        let tiny = _mm512_test_epi32_mask(bits, bits) & _mm512_cmplt_epi32_mask(e, lo);
        let bad = tiny | _mm512_cmpgt_epi32_mask(e, hi);
        let e = _mm512_min_epi32(_mm512_max_epi32(e, lo), hi);
        let up = _mm512_slli_epi32::<23>(_mm512_sub_epi32(_mm512_set1_epi32(254 + f), e));
        let down = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(f)));
        (
            Z(_mm512_castsi512_ps(up)),
            Z(_mm512_castsi512_ps(down)),
            bad,
        )
    }

    #[inline(always)]
    unsafe fn trunc(self) -> __m512i {
        _mm512_cvttps_epi32(self.0)
    }

    #[inline(always)]
    unsafe fn add(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(a, b)
    }

    #[inline(always)]
    unsafe fn finish(s: __m512i, keep: u32, down: Self) -> Self {
        let f = _mm512_cvt_roundepi32_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(s);
        let f = _mm512_and_ps(f, _mm512_castsi512_ps(_mm512_set1_epi32(keep as i32)));
        Z(_mm512_mul_ps(f, down.0))
    }

    #[inline(always)]
    unsafe fn to_array(self) -> [f32; 16] {
        let mut v = [0f32; 16];
        _mm512_storeu_ps(v.as_mut_ptr(), self.0);
        v
    }

    #[inline(always)]
    unsafe fn from_array(v: [f32; 16]) -> Self {
        Z(_mm512_loadu_ps(v.as_ptr()))
    }
}

/// Two f64 halves as one f32 vector, and whether all 16 are finite and exact in f32.
#[inline(always)]
unsafe fn z_from_halves(lo: __m512d, hi: __m512d) -> (Z, bool) {
    let (l, h) = (_mm512_cvtpd_ps(lo), _mm512_cvtpd_ps(hi));
    let exact = _mm512_cmp_pd_mask::<_CMP_EQ_OQ>(_mm512_cvtps_pd(l), lo)
        & _mm512_cmp_pd_mask::<_CMP_EQ_OQ>(_mm512_cvtps_pd(h), hi);
    let v = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(l), h);
    let finite = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_abs_ps(v), _mm512_set1_ps(f32::INFINITY));
    (Z(v), exact == 0xff && finite == 0xffff)
}

/// AVX2: rows 0..8 and 8..16 in two ymm registers.
#[derive(Clone, Copy)]
struct Y([__m256; 2]);

impl Y {
    #[inline(always)]
    unsafe fn map(self, f: impl Fn(__m256) -> __m256) -> Self {
        Y([f(self.0[0]), f(self.0[1])])
    }

    #[inline(always)]
    unsafe fn zip(self, o: Self, f: impl Fn(__m256, __m256) -> __m256) -> Self {
        Y([f(self.0[0], o.0[0]), f(self.0[1], o.0[1])])
    }
}

/// Four f64 as f32, and whether they are finite and exact in f32.
#[inline(always)]
unsafe fn y_quarter(v: __m256d) -> (__m128, bool) {
    let f = _mm256_cvtpd_ps(v);
    let exact = _mm256_movemask_pd(_mm256_cmp_pd::<_CMP_EQ_OQ>(_mm256_cvtps_pd(f), v)) == 0xf;
    let abs = _mm_and_ps(f, _mm_castsi128_ps(_mm_set1_epi32(i32::MAX)));
    let finite = _mm_movemask_ps(_mm_cmplt_ps(abs, _mm_set1_ps(f32::INFINITY))) == 0xf;
    (f, exact && finite)
}

impl Lanes16 for Y {
    type I = [__m256i; 2];
    const PRE_ABS: bool = true;

    #[inline(always)]
    unsafe fn zero() -> Self {
        Y([_mm256_setzero_ps(); 2])
    }

    #[inline(always)]
    unsafe fn gather(p: *const f64, stride: usize) -> (Self, bool) {
        let s = stride as i32;
        let idx = _mm_setr_epi32(0, s, 2 * s, 3 * s);
        let mut q = [_mm_setzero_ps(); 4];
        let mut ok = true;
        for (i, qi) in q.iter_mut().enumerate() {
            let (f, o) = y_quarter(_mm256_i32gather_pd::<8>(p.add(4 * i * stride), idx));
            *qi = f;
            ok &= o;
        }
        let v = [_mm256_set_m128(q[1], q[0]), _mm256_set_m128(q[3], q[2])];
        (Y(v), ok)
    }

    #[inline(always)]
    unsafe fn scatter(self, p: *mut f64, stride: usize) {
        for (r, v) in self.to_array().iter().enumerate() {
            *p.add(r * stride) = *v as f64;
        }
    }

    #[inline(always)]
    unsafe fn load16(p: *const f64, w: usize) -> (Self, bool) {
        let mut ok = true;
        let mut q = [_mm_setzero_ps(); 4];
        for (i, qi) in q.iter_mut().enumerate() {
            let n = w.saturating_sub(4 * i).min(4) as i64;
            let mask = _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), _mm256_setr_epi64x(0, 1, 2, 3));
            let (f, o) = y_quarter(_mm256_maskload_pd(p.add(4 * i), mask));
            *qi = f;
            ok &= o;
        }
        let v = [_mm256_set_m128(q[1], q[0]), _mm256_set_m128(q[3], q[2])];
        (Y(v), ok)
    }

    #[inline(always)]
    unsafe fn store(self, dst: *mut f32) {
        _mm256_storeu_ps(dst, self.0[0]);
        _mm256_storeu_ps(dst.add(8), self.0[1]);
    }

    #[inline(always)]
    unsafe fn or(self, o: Self) -> Self {
        self.zip(o, |a, b| _mm256_or_ps(a, b))
    }

    #[inline(always)]
    unsafe fn low_bits(self) -> bool {
        let low = _mm256_set1_epi32(LOW_BITS as i32);
        let v = _mm256_castps_si256(_mm256_or_ps(self.0[0], self.0[1]));
        _mm256_testz_si256(v, low) == 0
    }

    #[inline(always)]
    unsafe fn abs(self) -> Self {
        let m = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
        self.map(|v| _mm256_and_ps(v, m))
    }

    #[inline(always)]
    unsafe fn max_mag(self, p: Self) -> Self {
        self.zip(p, |a, b| _mm256_max_ps(a, b))
    }

    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        self.zip(o, |a, b| _mm256_mul_ps(a, b))
    }

    #[inline(always)]
    unsafe fn mul_bcast(self, s: *const f32) -> Self {
        let b = _mm256_set1_ps(*s);
        self.map(|v| _mm256_mul_ps(v, b))
    }

    #[inline(always)]
    unsafe fn scales(self, f: i32) -> (Self, Self, u16) {
        let (mut up, mut down, mut bad) = (self, self, 0u16);
        let (lo, hi) = (_mm256_set1_epi32(E_LO), _mm256_set1_epi32(E_HI));
        for h in 0..2 {
            let bits = _mm256_castps_si256(self.0[h]);
            let e = _mm256_srli_epi32::<23>(bits);
            let nz = _mm256_cmpgt_epi32(bits, _mm256_setzero_si256());
            let tiny = _mm256_and_si256(nz, _mm256_cmpgt_epi32(lo, e));
            let b = _mm256_or_si256(tiny, _mm256_cmpgt_epi32(e, hi));
            bad |= (_mm256_movemask_ps(_mm256_castsi256_ps(b)) as u16) << (8 * h);
            let e = _mm256_min_epi32(_mm256_max_epi32(e, lo), hi);
            let u = _mm256_sub_epi32(_mm256_set1_epi32(254 + f), e);
            up.0[h] = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(u));
            let d = _mm256_sub_epi32(e, _mm256_set1_epi32(f));
            down.0[h] = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(d));
        }
        (up, down, bad)
    }

    #[inline(always)]
    unsafe fn trunc(self) -> [__m256i; 2] {
        [
            _mm256_cvttps_epi32(self.0[0]),
            _mm256_cvttps_epi32(self.0[1]),
        ]
    }

    #[inline(always)]
    unsafe fn add(a: [__m256i; 2], b: [__m256i; 2]) -> [__m256i; 2] {
        [_mm256_add_epi32(a[0], b[0]), _mm256_add_epi32(a[1], b[1])]
    }

    #[inline(always)]
    unsafe fn finish(s: [__m256i; 2], keep: u32, down: Self) -> Self {
        let keep = _mm256_castsi256_ps(_mm256_set1_epi32(keep as i32));
        let mut out = down;
        for h in 0..2 {
            // to nearest, then one ulp back toward zero where that rounded away from zero
            // (|s| < 2^31, so the conversion back is exact)
            let f = _mm256_cvtepi32_ps(s[h]);
            let back = _mm256_abs_epi32(_mm256_cvttps_epi32(f));
            let away = _mm256_cmpgt_epi32(back, _mm256_abs_epi32(s[h]));
            let f = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(f), away));
            out.0[h] = _mm256_mul_ps(_mm256_and_ps(f, keep), down.0[h]);
        }
        out
    }

    #[inline(always)]
    unsafe fn to_array(self) -> [f32; 16] {
        let mut v = [0f32; 16];
        _mm256_storeu_ps(v.as_mut_ptr(), self.0[0]);
        _mm256_storeu_ps(v.as_mut_ptr().add(8), self.0[1]);
        v
    }

    #[inline(always)]
    unsafe fn from_array(v: [f32; 16]) -> Self {
        Y([
            _mm256_loadu_ps(v.as_ptr()),
            _mm256_loadu_ps(v.as_ptr().add(8)),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tc_numerics::{model_for, tile, tile_portable};
    use ptx::Ty;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    const FORMS: [Ty; 5] = [Ty::F16, Ty::Bf16, Ty::Tf32, Ty::E4m3, Ty::E5m2];

    /// Every architecture's model of every form, and a hand-built one with an odd block.
    fn models() -> Vec<(Ty, TcModel)> {
        let mut v: Vec<(Ty, TcModel)> = [80, 89, 90]
            .iter()
            .flat_map(|&sm| FORMS.map(|t| (t, model_for(sm, t).unwrap())))
            .collect();
        let odd = TcModel {
            block: 5,
            align_frac: 24,
            out_frac: 10,
        };
        v.push((Ty::Bf16, odd));
        v
    }

    /// A random finite value of type `t` with a biased exponent in `e` (0: subnormal), or zero
    /// one time in 16.
    fn value(t: Ty, e: std::ops::RangeInclusive<i32>, rng: &mut StdRng) -> f64 {
        let (ebits, fbits): (u32, u32) = match t {
            Ty::F16 => (5, 10),
            Ty::Bf16 => (8, 7),
            Ty::Tf32 => (8, 10),
            Ty::E4m3 => (4, 3),
            _ => (5, 2),
        };
        let bias = (1i32 << (ebits - 1)) - 1;
        let emax = (1i32 << ebits) - 2;
        if rng.gen_range(0..16) == 0 {
            return 0.0;
        }
        let e = rng.gen_range(e).clamp(0, emax);
        let f = rng.gen_range(0..1u64 << fbits) as f64 / (1u64 << fbits) as f64;
        let v = if e == 0 {
            f * 2f64.powi(1 - bias)
        } else {
            (1.0 + f) * 2f64.powi(e - bias)
        };
        if rng.gen() {
            -v
        } else {
            v
        }
    }

    /// Biased exponents of type `t`: all of them, or a window around 1.0.
    fn exps(t: Ty, wide: bool) -> std::ops::RangeInclusive<i32> {
        let ebits = match t {
            Ty::F16 | Ty::E5m2 => 5,
            Ty::E4m3 => 4,
            _ => 8,
        };
        let bias = (1i32 << (ebits - 1)) - 1;
        if wide {
            0..=(1 << ebits) - 2
        } else {
            bias - 3..=bias + 3
        }
    }

    /// Random C values: zeros, +-FP32 max, subnormals and ordinary values.
    fn accs(n: usize, rng: &mut StdRng) -> Vec<f64> {
        (0..n)
            .map(|i| match i % 7 {
                0 => 0.0,
                1 => f32::MAX as f64 * if i % 2 == 0 { 1.0 } else { -1.0 },
                2 => f32::from_bits(rng.gen_range(1..0x0080_0000)) as f64,
                _ => rng.gen_range(-1e3f32..1e3) as f64,
            })
            .collect()
    }

    fn bits(v: &[f64]) -> Vec<u64> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The first output whose bits differ, as (index, got, want), for short messages.
    fn first_diff(got: &[f64], want: &[f64]) -> Option<(usize, f64, f64)> {
        let i = got
            .iter()
            .zip(want)
            .position(|(x, y)| x.to_bits() != y.to_bits())?;
        Some((i, got[i], want[i]))
    }

    /// Runs every kernel on the tile and compares with the portable tile bit for bit; `takes`:
    /// whether the kernel must accept the tile (else it must decline and leave `acc` alone).
    fn check(m: &TcModel, a: &[f64], b: &[f64], k: usize, acc: &[f64], takes: bool, what: &str) {
        let cols = acc.len() / ROWS;
        let mut want = acc.to_vec();
        tile_portable(m, a, b, k, cols, &mut want);
        for (name, f) in all() {
            let mut x = acc.to_vec();
            let took = f(m, a, b, k, cols, &mut x);
            assert_eq!(took, takes, "{name}: {what}: accepted");
            if took {
                let d = first_diff(&x, &want);
                assert_eq!(d, None, "{name}: {what}: model {m:?} (index, got, want)");
            } else {
                assert_eq!(bits(&x), bits(acc), "{name}: {what}: declined but wrote");
            }
        }
        let mut x = acc.to_vec();
        tile(m, a, b, k, cols, &mut x);
        let d = first_diff(&x, &want);
        assert_eq!(d, None, "tile: {what}: model {m:?} (index, got, want)");
    }

    /// Random tiles of every form and architecture (whole exponent ranges, subnormal inputs,
    /// zero rows and columns, C at the ends of the FP32 range, column counts that are not a
    /// multiple of the chunk or of 8, k that is not a multiple of the block) give the portable
    /// kernel's bits.
    #[test]
    fn rows16_matches_portable() {
        assert!(!all().is_empty() || !std::is_x86_feature_detected!("avx2"));
        let mut rng = StdRng::seed_from_u64(0x16);
        for (t, m) in models() {
            for trial in 0..12 {
                let k = [16, 32, 8, 4, 7, 64][trial % 6];
                let cols = [8, 16, 24, 12, 40, 256][trial % 6];
                let wide = trial % 2 == 0;
                let a: Vec<f64> = (0..ROWS * k)
                    .map(|i| {
                        if i / k == 3 {
                            0.0
                        } else {
                            value(t, exps(t, wide), &mut rng)
                        }
                    })
                    .collect();
                let b: Vec<f64> = (0..k * cols)
                    .map(|i| {
                        if i % cols == 5 {
                            0.0
                        } else {
                            value(t, exps(t, wide), &mut rng)
                        }
                    })
                    .collect();
                let acc = accs(ROWS * cols, &mut rng);
                check(&m, &a, &b, k, &acc, true, &format!("{t} trial {trial}"));
            }
        }
    }

    /// Products whose largest exponent sits at and around both ends of the safe range
    /// (2^-101 and 2^120), products that overflow f32, and sums that round to the largest
    /// finite FP32 value, with C = 0 and with random C.
    #[test]
    fn rows16_safe_range_boundaries() {
        let mut rng = StdRng::seed_from_u64(0xb0);
        for (t, m) in models()
            .into_iter()
            .filter(|(t, _)| matches!(t, Ty::Bf16 | Ty::Tf32))
        {
            // product exponents near 2^(2 * (ea - 127)): ea around 76..78 and 186..188
            for (trial, lo) in [74, 75, 76, 77, 78, 184, 185, 186, 187, 188, 190, 253]
                .iter()
                .enumerate()
            {
                let (k, cols) = (16, 8);
                let e = *lo..=*lo + 1;
                let a: Vec<f64> = (0..ROWS * k)
                    .map(|_| value(t, e.clone(), &mut rng))
                    .collect();
                let b: Vec<f64> = (0..k * cols)
                    .map(|_| value(t, e.clone(), &mut rng))
                    .collect();
                let mut acc = accs(ROWS * cols, &mut rng);
                if trial % 2 == 0 {
                    acc.iter_mut().for_each(|v| *v = 0.0);
                }
                check(&m, &a, &b, k, &acc, true, &format!("{t} exponents {lo}"));
            }
        }
    }

    /// Tiles the kernel declines (NaN, infinity, inputs with more than 11 significant bits or
    /// not exact in f32 in A) and chunks it hands to the portable code (the same in B or C).
    #[test]
    fn rows16_declines_and_falls_back() {
        let mut rng = StdRng::seed_from_u64(0xdec);
        let (t, m) = (Ty::Bf16, model_for(80, Ty::Bf16).unwrap());
        let (k, cols) = (16, 24);
        let fresh = |rng: &mut StdRng| {
            let a: Vec<f64> = (0..ROWS * k)
                .map(|_| value(t, exps(t, false), rng))
                .collect();
            let b: Vec<f64> = (0..k * cols)
                .map(|_| value(t, exps(t, false), rng))
                .collect();
            (a, b, accs(ROWS * cols, rng))
        };
        let odd = [f64::NAN, f64::INFINITY, 1.0 + 2f64.powi(-20), 0.1];
        for (i, &v) in odd.iter().enumerate() {
            let (mut a, b, acc) = fresh(&mut rng);
            a[5 * k + 3] = v;
            check(&m, &a, &b, k, &acc, false, &format!("A holds {v}"));
            let (a, mut b, acc) = fresh(&mut rng);
            b[3 * cols + 17] = v;
            check(&m, &a, &b, k, &acc, true, &format!("B holds {v}"));
            let (a, b, mut acc) = fresh(&mut rng);
            acc[7 * cols + 2 + i] = if i == 2 { 1e300 } else { v };
            check(&m, &a, &b, k, &acc, true, &format!("C holds {v}"));
        }
        // shapes it does not take: 8 rows, k above MAX_K
        let (a, b, acc) = fresh(&mut rng);
        for (name, f) in all() {
            let mut x = acc[..8 * cols].to_vec();
            assert!(!f(&m, &a, &b, k, cols, &mut x), "{name}: 8 rows");
            assert!(
                !f(&m, &a, &b, 65, 1, &mut x[..16].to_vec()),
                "{name}: k = 65"
            );
        }
    }
}
