//! The f32 tile kernel: [`crate::tc_numerics::tile`] for the tiles of `mma.sync` and `wgmma`
//! (up to 16 rows, a multiple of 8 columns), with output columns in the vector lanes: 16 columns
//! of one row or 8 columns of two rows (AVX-512F), or 8 columns of one row (AVX2). Same results as
//! the portable code, bit for bit (tested); cheaper because:
//!
//! - **products in f32**: every supported input (f16, bf16, tf32, e4m3, e5m2) has at most 11
//!   significant bits, so a product has at most 22 and is exact in f32 whenever it is a normal
//!   f32. Checked per tile: every input must convert to f32 exactly with the low 13 significand
//!   bits zero, and every C must be finite and exact in f32; else the tile takes the f64 path;
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
//! - every input is converted once per tile by contiguous vector loads (no gathers or scatters:
//!   on the hardware they cost more than the products), A's element is broadcast into the
//!   multiply (or, for two rows per vector, a precomputed half-and-half vector), B's row of one
//!   k is one load shared by G row groups, and the common block lengths are compiled as
//!   constants.

use super::Tile16Fn;
use crate::tc_numerics::{block_sum, TcModel};
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Largest row count, k and column count of a tile (the scratch space is sized for them).
const MAX_ROWS: usize = 16;
const MAX_K: usize = 64;
const MAX_COLS: usize = 256;
/// Biased f32 exponents of a block's largest term that the f32 arithmetic handles exactly
/// (see the module docs: -101..=120 unbiased).
pub(super) const E_LO: i32 = 26;
pub(super) const E_HI: i32 = 247;
/// Significand bits below the 11 an input may have.
const LOW_BITS: u32 = 0x1fff;
/// Row groups processed together (independent dependency chains sharing each B load).
const G: usize = 4;

/// Whether this CPU has the AVX-512 subsets the 16-lane kernels use (F, DQ, VL).
pub(super) fn has_avx512() -> bool {
    std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512dq")
        && std::is_x86_feature_detected!("avx512vl")
}

/// The kernel for this CPU: AVX-512F+DQ+VL, else AVX2, else `None`.
pub(crate) fn select() -> Option<Tile16Fn> {
    if has_avx512() {
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
        v.push(("f32-avx2", tile_y));
    }
    if has_avx512() {
        v.push(("f32-avx512", tile_z));
    }
    v
}

/// The tile's shape: rows (a multiple of `rows_mult`), k and cols, when the kernel handles this
/// model and shape.
fn shape(m: &TcModel, a: &[f64], bt: &[f64], k: usize, cols: usize, acc: &[f64]) -> Option<usize> {
    let rows = acc.len().checked_div(cols)?;
    let ok = m.block_len() <= 32
        && m.align_frac <= 24
        && m.out_frac <= 23
        && (1..=MAX_K).contains(&k)
        && (8..=MAX_COLS).contains(&cols)
        && cols.is_multiple_of(8)
        && (1..=MAX_ROWS).contains(&rows)
        && acc.len() == rows * cols
        && a.len() >= rows * k
        && bt.len() >= k * cols;
    ok.then_some(rows)
}

fn tile_z(m: &TcModel, a: &[f64], bt: &[f64], k: usize, cols: usize, acc: &mut [f64]) -> bool {
    match shape(m, a, bt, k, cols, acc) {
        // SAFETY: `select` hands this function out only when the CPU reports AVX-512F, DQ, VL;
        // `shape` checked the slice lengths and the limits the scratch space is sized for, and
        // that the rows fill whole groups of the layout.
        Some(rows) if cols.is_multiple_of(16) && rows.is_multiple_of(G) => {
            SCRATCH.with_borrow_mut(|sc| unsafe { tile_zw(sc, m, a, bt, k, cols, acc) })
        }
        Some(rows) if rows.is_multiple_of(2 * G) => {
            SCRATCH.with_borrow_mut(|sc| unsafe { tile_zp(sc, m, a, bt, k, cols, acc) })
        }
        _ => false,
    }
}

#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2")]
unsafe fn tile_zw(
    sc: &mut Scratch,
    m: &TcModel,
    a: &[f64],
    bt: &[f64],
    k: usize,
    cols: usize,
    acc: &mut [f64],
) -> bool {
    drive::<ZW>(sc, m, a, bt, k, cols, acc)
}

#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2")]
unsafe fn tile_zp(
    sc: &mut Scratch,
    m: &TcModel,
    a: &[f64],
    bt: &[f64],
    k: usize,
    cols: usize,
    acc: &mut [f64],
) -> bool {
    drive::<ZP>(sc, m, a, bt, k, cols, acc)
}

fn tile_y(m: &TcModel, a: &[f64], bt: &[f64], k: usize, cols: usize, acc: &mut [f64]) -> bool {
    match shape(m, a, bt, k, cols, acc) {
        // SAFETY: `select` hands this function out only when the CPU reports AVX2; `shape`
        // checked the slice lengths and limits, and that the rows fill whole groups.
        Some(rows) if rows.is_multiple_of(G) => {
            SCRATCH.with_borrow_mut(|sc| unsafe { tile_y_impl(sc, m, a, bt, k, cols, acc) })
        }
        _ => false,
    }
}

#[target_feature(enable = "avx2")]
unsafe fn tile_y_impl(
    sc: &mut Scratch,
    m: &TcModel,
    a: &[f64],
    bt: &[f64],
    k: usize,
    cols: usize,
    acc: &mut [f64],
) -> bool {
    drive::<Y>(sc, m, a, bt, k, cols, acc)
}

/// The converted inputs of one tile (per thread, reused: no allocation per tile).
struct Scratch {
    /// A as f32, row-major (rows x k).
    a: Vec<f32>,
    /// A in the layout's A operands (see [`Lanes::A_W`]), and their magnitudes.
    av: Vec<f32>,
    av_abs: Vec<f32>,
    /// B as f32 (k x cols), and the magnitudes.
    b: Vec<f32>,
    b_abs: Vec<f32>,
    /// C as f32 (rows x cols): the accumulators, D on exit.
    c: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch {
        a: vec![0.0; MAX_ROWS * MAX_K],
        av: vec![0.0; MAX_ROWS * MAX_K * 8],
        av_abs: vec![0.0; MAX_ROWS * MAX_K * 8],
        b: vec![0.0; MAX_K * MAX_COLS],
        b_abs: vec![0.0; MAX_K * MAX_COLS],
        c: vec![0.0; MAX_ROWS * MAX_COLS],
    });
}

/// The f64 inputs of the tile (for the per-block fallback).
struct Src<'a> {
    a: &'a [f64],
    bt: &'a [f64],
    k: usize,
    cols: usize,
}

/// Converts A, B and C into `sc` (declining the tile when one is not exact in f32, B or A has
/// more than 11 significant bits, or C is not finite), runs the column chunks, writes D back.
/// No closures here: a closure would not inherit the caller's target features, and the
/// intrinsics would become calls.
#[inline(always)]
unsafe fn drive<V: Lanes>(
    sc: &mut Scratch,
    m: &TcModel,
    a: &[f64],
    bt: &[f64],
    k: usize,
    cols: usize,
    acc: &mut [f64],
) -> bool {
    let rows = acc.len() / cols;
    let (oa, la) = V::cvt(&a[..rows * k], &mut sc.a);
    let (ob, lb) = V::cvt(&bt[..k * cols], &mut sc.b);
    let (oc, _) = V::cvt(acc, &mut sc.c);
    if !(oa && ob && oc) || (la | lb) & LOW_BITS != 0 {
        return false;
    }
    V::prep_a(&sc.a[..rows * k], k, &mut sc.av, &mut sc.av_abs);
    if V::PRE_ABS {
        for (d, s) in sc.b_abs[..k * cols].iter_mut().zip(&sc.b[..k * cols]) {
            *d = s.abs();
        }
    }
    let src = Src { a, bt, k, cols };
    let ops = Ops {
        a: sc.av.as_ptr(),
        a_abs: if V::PRE_ABS {
            sc.av_abs.as_ptr()
        } else {
            sc.av.as_ptr()
        },
        b: sc.b.as_ptr(),
        b_abs: if V::PRE_ABS {
            sc.b_abs.as_ptr()
        } else {
            sc.b.as_ptr()
        },
    };
    let c = sc.c.as_mut_ptr();
    for c0 in (0..cols).step_by(V::CW) {
        for g0 in (0..rows / V::RG).step_by(G) {
            let mut x = [V::zero(); G];
            for (g, xg) in x.iter_mut().enumerate() {
                *xg = V::load_c(c.add((g0 + g) * V::RG * cols + c0), cols);
            }
            columns::<V>(m, &ops, &src, g0, c0, &mut x);
            for (g, xg) in x.iter().enumerate() {
                xg.store_c(c.add((g0 + g) * V::RG * cols + c0), cols);
            }
        }
    }
    for (d, s) in acc.iter_mut().zip(&sc.c) {
        *d = *s as f64;
    }
    true
}

/// The operand arrays of a tile (see [`Scratch`]); with `V::PRE_ABS` the `_abs` ones hold
/// magnitudes, else they are the same as the others.
struct Ops {
    a: *const f32,
    a_abs: *const f32,
    b: *const f32,
    b_abs: *const f32,
}

/// The block loop of G row groups from `g0` at columns `c0..c0 + CW`, the common block lengths
/// as constants.
#[inline(always)]
unsafe fn columns<V: Lanes>(
    m: &TcModel,
    ops: &Ops,
    src: &Src,
    g0: usize,
    c0: usize,
    x: &mut [V; G],
) {
    let (k, bl) = (src.k, m.block_len());
    let mut k0 = 0;
    while k0 < k {
        let n = bl.min(k - k0);
        let blk = Blk { m, src, g0, c0, k0 };
        match n {
            4 => block::<V>(&blk, ops, 4, x),
            8 => block::<V>(&blk, ops, 8, x),
            16 => block::<V>(&blk, ops, 16, x),
            32 => block::<V>(&blk, ops, 32, x),
            _ => block::<V>(&blk, ops, n, x),
        }
        k0 += n;
    }
}

/// Where a block is: its model, the tile's f64 inputs, its first row group, first column and
/// first k.
struct Blk<'a> {
    m: &'a TcModel,
    src: &'a Src<'a>,
    g0: usize,
    c0: usize,
    k0: usize,
}

/// One block of `n` products plus C for G row groups x `V::CW` columns.
#[inline(always)]
unsafe fn block<V: Lanes>(blk: &Blk, ops: &Ops, n: usize, x: &mut [V; G]) {
    let (k, cols) = (blk.src.k, blk.src.cols);
    // A operand of row group g0 + g at k index k0 + j; B row k0 + j at column c0
    let ai = |g: usize, j: usize| ((blk.g0 + g) * k + blk.k0 + j) * V::A_W;
    let bi = |j: usize| (blk.k0 + j) * cols + blk.c0;
    // pass 1: the largest magnitude per output (products recomputed in pass 2)
    let mut big = [V::zero(); G];
    for g in 0..G {
        big[g] = x[g].abs();
    }
    for j in 0..n {
        let bj = V::load_b(ops.b_abs.add(bi(j)));
        for (g, bg) in big.iter_mut().enumerate() {
            *bg = bg.max_mag(bj.mul_a(ops.a_abs.add(ai(g, j))));
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
        let bj = V::load_b(ops.b.add(bi(j)));
        for (g, sg) in s.iter_mut().enumerate() {
            let t = bj.mul_a(ops.a.add(ai(g, j))).mul(up[g]).trunc();
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

/// The block through [`block_sum`] (f64) for the lanes in `bad` of row group `blk.g0 + g`
/// (their largest term is outside the safe range); `old` holds C, `new` the f32 results.
#[cold]
#[inline(never)]
unsafe fn redo_lanes<V: Lanes>(blk: &Blk, n: usize, g: usize, old: V, new: V, bad: u16) -> V {
    let src = blk.src;
    let (old, mut new) = (old.to_array(), new.to_array());
    let mut prods = [0f64; 32];
    for l in (0..V::RG * V::CW).filter(|l| bad >> l & 1 == 1) {
        let (row, col) = ((blk.g0 + g) * V::RG + l / V::CW, blk.c0 + l % V::CW);
        for (j, p) in prods[..n].iter_mut().enumerate() {
            let kk = blk.k0 + j;
            *p = src.a[row * src.k + kk] * src.bt[kk * src.cols + col];
        }
        new[l] = block_sum(blk.m, &prods[..n], old[l] as f64) as f32;
    }
    V::from_array(new)
}

/// One f32 vector of outputs: `RG` rows x `CW` adjacent columns, and the operations the kernel
/// needs. Every method is `unsafe`: the caller runs on a CPU with the implementation's target
/// features, and pointers are valid for the lanes read or written.
trait Lanes: Copy {
    /// Lanes as i32.
    type I: Copy;
    /// Rows and columns per vector.
    const RG: usize;
    const CW: usize;
    /// f32 values per A operand in [`Scratch::av`] (1: a scalar broadcast into the multiply).
    const A_W: usize;
    /// Whether pass 1 multiplies stored magnitudes |A| and |B| (one max per product, no
    /// absolute value) instead of A and B.
    const PRE_ABS: bool;
    unsafe fn zero() -> Self;
    /// `dst[i]` = `src[i]` as f32; whether all are finite and exact in f32, and the OR of the
    /// f32 bits.
    unsafe fn cvt(src: &[f64], dst: &mut [f32]) -> (bool, u32);
    /// The A operands ([`Scratch::av`], and magnitudes when `PRE_ABS`) from A (rows x k).
    unsafe fn prep_a(a: &[f32], k: usize, av: &mut [f32], av_abs: &mut [f32]);
    /// C of `RG` rows from `p` (rows `stride` apart), and the store back.
    unsafe fn load_c(p: *const f32, stride: usize) -> Self;
    unsafe fn store_c(self, p: *mut f32, stride: usize);
    /// B's `CW` values at `p` (repeated for each of the `RG` rows).
    unsafe fn load_b(p: *const f32) -> Self;
    /// self times the A operand at `a`.
    unsafe fn mul_a(self, a: *const f32) -> Self;
    unsafe fn abs(self) -> Self;
    /// max(self, |p|) for a non-negative self (p is non-negative when `PRE_ABS`).
    unsafe fn max_mag(self, p: Self) -> Self;
    unsafe fn mul(self, o: Self) -> Self;
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

/// f64 to f32 for AVX-512: 8 at a time (the tail masked); exact and finite checks on the
/// vectors, one test at the end.
#[inline(always)]
unsafe fn cvt_z(src: &[f64], dst: &mut [f32]) -> (bool, u32) {
    let (mut bad, mut bits) = (0u8, _mm256_setzero_si256());
    let inf = _mm256_set1_ps(f32::INFINITY);
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    for i in (0..src.len()).step_by(8) {
        let mask = ((1u32 << (src.len() - i).min(8)) - 1) as __mmask8;
        let v = _mm512_maskz_loadu_pd(mask, src.as_ptr().add(i));
        let f = _mm512_cvtpd_ps(v);
        bad |= !_mm512_cmp_pd_mask::<_CMP_EQ_OQ>(_mm512_cvtps_pd(f), v);
        bad |= !_mm256_cmp_ps_mask::<_CMP_LT_OQ>(_mm256_and_ps(f, abs), inf);
        bits = _mm256_or_si256(bits, _mm256_castps_si256(f));
        _mm256_mask_storeu_ps(dst.as_mut_ptr().add(i), mask, f);
    }
    let b = _mm256_or_si256(bits, _mm256_permute2x128_si256::<1>(bits, bits));
    let b = _mm256_or_si256(b, _mm256_shuffle_epi32::<0b01_00_11_10>(b));
    let b = _mm256_or_si256(b, _mm256_shuffle_epi32::<0b10_11_00_01>(b));
    (bad == 0, _mm256_cvtsi256_si32(b) as u32)
}

/// The safe-range scales of [`Lanes::scales`] on a 16-lane vector.
#[inline(always)]
unsafe fn scales_z(big: __m512, f: i32) -> (__m512, __m512, u16) {
    let bits = _mm512_castps_si512(big);
    let e = _mm512_srli_epi32::<23>(bits);
    let (lo, hi) = (_mm512_set1_epi32(E_LO), _mm512_set1_epi32(E_HI));
    let tiny = _mm512_test_epi32_mask(bits, bits) & _mm512_cmplt_epi32_mask(e, lo);
    let bad = tiny | _mm512_cmpgt_epi32_mask(e, hi);
    let e = _mm512_min_epi32(_mm512_max_epi32(e, lo), hi);
    let up = _mm512_slli_epi32::<23>(_mm512_sub_epi32(_mm512_set1_epi32(254 + f), e));
    let down = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(f)));
    (_mm512_castsi512_ps(up), _mm512_castsi512_ps(down), bad)
}

/// The rounding of [`Lanes::finish`] on a 16-lane vector (embedded round-toward-zero).
#[inline(always)]
unsafe fn finish_z(s: __m512i, keep: u32, down: __m512) -> __m512 {
    let f = _mm512_cvt_roundepi32_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(s);
    let f = _mm512_and_ps(f, _mm512_castsi512_ps(_mm512_set1_epi32(keep as i32)));
    _mm512_mul_ps(f, down)
}

/// Implements the 16-lane operations shared by the AVX-512 layouts.
macro_rules! z_common {
    () => {
        type I = __m512i;
        const PRE_ABS: bool = false;

        #[inline(always)]
        unsafe fn zero() -> Self {
            Self(_mm512_setzero_ps())
        }

        #[inline(always)]
        unsafe fn cvt(src: &[f64], dst: &mut [f32]) -> (bool, u32) {
            cvt_z(src, dst)
        }

        #[inline(always)]
        unsafe fn abs(self) -> Self {
            Self(_mm512_abs_ps(self.0))
        }

        #[inline(always)]
        unsafe fn max_mag(self, p: Self) -> Self {
            // imm8: bits 1:0 = 11 (larger magnitude), bits 3:2 = 10 (sign cleared)
            Self(_mm512_range_ps::<0b1011>(self.0, p.0))
        }

        #[inline(always)]
        unsafe fn mul(self, o: Self) -> Self {
            Self(_mm512_mul_ps(self.0, o.0))
        }

        #[inline(always)]
        unsafe fn scales(self, f: i32) -> (Self, Self, u16) {
            let (u, d, b) = scales_z(self.0, f);
            (Self(u), Self(d), b)
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
            Self(finish_z(s, keep, down.0))
        }

        #[inline(always)]
        unsafe fn to_array(self) -> [f32; 16] {
            let mut v = [0f32; 16];
            _mm512_storeu_ps(v.as_mut_ptr(), self.0);
            v
        }

        #[inline(always)]
        unsafe fn from_array(v: [f32; 16]) -> Self {
            Self(_mm512_loadu_ps(v.as_ptr()))
        }
    };
}

/// AVX-512, 16 columns of one row (column counts that are a multiple of 16).
#[derive(Clone, Copy)]
struct ZW(__m512);

impl Lanes for ZW {
    z_common!();
    const RG: usize = 1;
    const CW: usize = 16;
    const A_W: usize = 1;

    #[inline(always)]
    unsafe fn prep_a(a: &[f32], _k: usize, av: &mut [f32], _abs: &mut [f32]) {
        av[..a.len()].copy_from_slice(a);
    }

    #[inline(always)]
    unsafe fn load_c(p: *const f32, _stride: usize) -> Self {
        ZW(_mm512_loadu_ps(p))
    }

    #[inline(always)]
    unsafe fn store_c(self, p: *mut f32, _stride: usize) {
        _mm512_storeu_ps(p, self.0)
    }

    #[inline(always)]
    unsafe fn load_b(p: *const f32) -> Self {
        ZW(_mm512_loadu_ps(p))
    }

    #[inline(always)]
    unsafe fn mul_a(self, a: *const f32) -> Self {
        ZW(_mm512_mul_ps(self.0, _mm512_set1_ps(*a)))
    }
}

/// AVX-512, 8 columns of two rows (lanes 0..8 and 8..16).
#[derive(Clone, Copy)]
struct ZP(__m512);

impl Lanes for ZP {
    z_common!();
    const RG: usize = 2;
    const CW: usize = 8;
    const A_W: usize = 16;

    #[inline(always)]
    unsafe fn prep_a(a: &[f32], k: usize, av: &mut [f32], _abs: &mut [f32]) {
        for p in 0..a.len() / (2 * k) {
            for j in 0..k {
                let lo = _mm256_set1_ps(a[2 * p * k + j]);
                let hi = _mm256_set1_ps(a[(2 * p + 1) * k + j]);
                let v = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(lo), hi);
                _mm512_storeu_ps(av.as_mut_ptr().add((p * k + j) * 16), v);
            }
        }
    }

    #[inline(always)]
    unsafe fn load_c(p: *const f32, stride: usize) -> Self {
        let lo = _mm256_loadu_ps(p);
        ZP(_mm512_insertf32x8::<1>(
            _mm512_castps256_ps512(lo),
            _mm256_loadu_ps(p.add(stride)),
        ))
    }

    #[inline(always)]
    unsafe fn store_c(self, p: *mut f32, stride: usize) {
        _mm256_storeu_ps(p, _mm512_castps512_ps256(self.0));
        _mm256_storeu_ps(p.add(stride), _mm512_extractf32x8_ps::<1>(self.0));
    }

    #[inline(always)]
    unsafe fn load_b(p: *const f32) -> Self {
        ZP(_mm512_broadcast_f32x8(_mm256_loadu_ps(p)))
    }

    #[inline(always)]
    unsafe fn mul_a(self, a: *const f32) -> Self {
        ZP(_mm512_mul_ps(self.0, _mm512_loadu_ps(a)))
    }
}

/// AVX2: 8 columns of one row.
#[derive(Clone, Copy)]
struct Y(__m256);

impl Lanes for Y {
    type I = __m256i;
    const RG: usize = 1;
    const CW: usize = 8;
    const A_W: usize = 1;
    const PRE_ABS: bool = true;

    #[inline(always)]
    unsafe fn zero() -> Self {
        Y(_mm256_setzero_ps())
    }

    #[inline(always)]
    unsafe fn cvt(src: &[f64], dst: &mut [f32]) -> (bool, u32) {
        let (mut ok, mut bits) = (
            _mm256_castsi256_pd(_mm256_set1_epi64x(-1)),
            _mm_setzero_si128(),
        );
        let inf = _mm_set1_ps(f32::INFINITY);
        let abs = _mm_castsi128_ps(_mm_set1_epi32(i32::MAX));
        let full = src.len() / 4 * 4;
        for i in (0..full).step_by(4) {
            let v = _mm256_loadu_pd(src.as_ptr().add(i));
            let f = _mm256_cvtpd_ps(v);
            let fin = _mm256_cvtps_pd(_mm_cmplt_ps(_mm_and_ps(f, abs), inf));
            let eq = _mm256_cmp_pd::<_CMP_EQ_OQ>(_mm256_cvtps_pd(f), v);
            ok = _mm256_and_pd(ok, _mm256_and_pd(eq, fin));
            bits = _mm_or_si128(bits, _mm_castps_si128(f));
            _mm_storeu_ps(dst.as_mut_ptr().add(i), f);
        }
        let mut good = _mm256_movemask_pd(ok) == 0xf;
        let b = _mm_or_si128(bits, _mm_shuffle_epi32::<0b01_00_11_10>(bits));
        let b = _mm_or_si128(b, _mm_shuffle_epi32::<0b10_11_00_01>(b));
        let mut low = _mm_cvtsi128_si32(b) as u32;
        for i in full..src.len() {
            let f = src[i] as f32;
            good &= f as f64 == src[i] && f.is_finite();
            low |= f.to_bits();
            dst[i] = f;
        }
        (good, low)
    }

    #[inline(always)]
    unsafe fn prep_a(a: &[f32], _k: usize, av: &mut [f32], av_abs: &mut [f32]) {
        av[..a.len()].copy_from_slice(a);
        for (d, s) in av_abs.iter_mut().zip(a) {
            *d = s.abs();
        }
    }

    #[inline(always)]
    unsafe fn load_c(p: *const f32, _stride: usize) -> Self {
        Y(_mm256_loadu_ps(p))
    }

    #[inline(always)]
    unsafe fn store_c(self, p: *mut f32, _stride: usize) {
        _mm256_storeu_ps(p, self.0)
    }

    #[inline(always)]
    unsafe fn load_b(p: *const f32) -> Self {
        Y(_mm256_loadu_ps(p))
    }

    #[inline(always)]
    unsafe fn mul_a(self, a: *const f32) -> Self {
        Y(_mm256_mul_ps(self.0, _mm256_set1_ps(*a)))
    }

    #[inline(always)]
    unsafe fn abs(self) -> Self {
        Y(_mm256_and_ps(
            self.0,
            _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX)),
        ))
    }

    #[inline(always)]
    unsafe fn max_mag(self, p: Self) -> Self {
        Y(_mm256_max_ps(self.0, p.0))
    }

    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        Y(_mm256_mul_ps(self.0, o.0))
    }

    #[inline(always)]
    unsafe fn scales(self, f: i32) -> (Self, Self, u16) {
        let (lo, hi) = (_mm256_set1_epi32(E_LO), _mm256_set1_epi32(E_HI));
        let bits = _mm256_castps_si256(self.0);
        let e = _mm256_srli_epi32::<23>(bits);
        let nz = _mm256_cmpgt_epi32(bits, _mm256_setzero_si256());
        let tiny = _mm256_and_si256(nz, _mm256_cmpgt_epi32(lo, e));
        let b = _mm256_or_si256(tiny, _mm256_cmpgt_epi32(e, hi));
        let bad = _mm256_movemask_ps(_mm256_castsi256_ps(b)) as u16;
        let e = _mm256_min_epi32(_mm256_max_epi32(e, lo), hi);
        let u = _mm256_sub_epi32(_mm256_set1_epi32(254 + f), e);
        let d = _mm256_sub_epi32(e, _mm256_set1_epi32(f));
        (
            Y(_mm256_castsi256_ps(_mm256_slli_epi32::<23>(u))),
            Y(_mm256_castsi256_ps(_mm256_slli_epi32::<23>(d))),
            bad,
        )
    }

    #[inline(always)]
    unsafe fn trunc(self) -> __m256i {
        _mm256_cvttps_epi32(self.0)
    }

    #[inline(always)]
    unsafe fn add(a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(a, b)
    }

    #[inline(always)]
    unsafe fn finish(s: __m256i, keep: u32, down: Self) -> Self {
        let keep = _mm256_castsi256_ps(_mm256_set1_epi32(keep as i32));
        // to nearest, then one ulp back toward zero where that rounded away from zero
        // (|s| < 2^31, so the conversion back is exact)
        let f = _mm256_cvtepi32_ps(s);
        let back = _mm256_abs_epi32(_mm256_cvttps_epi32(f));
        let away = _mm256_cmpgt_epi32(back, _mm256_abs_epi32(s));
        let f = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(f), away));
        Y(_mm256_mul_ps(_mm256_and_ps(f, keep), down.0))
    }

    #[inline(always)]
    unsafe fn to_array(self) -> [f32; 16] {
        let mut v = [0f32; 16];
        _mm256_storeu_ps(v.as_mut_ptr(), self.0);
        v
    }

    #[inline(always)]
    unsafe fn from_array(v: [f32; 16]) -> Self {
        Y(_mm256_loadu_ps(v.as_ptr()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tc_numerics::{model_for, tile, tile_portable};
    use ptx::Ty;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    const FORMS: [Ty; 5] = [Ty::F16, Ty::Bf16, Ty::Tf32, Ty::E4m3, Ty::E5m2];
    /// Rows of the tiles (one warp's, as in mma.sync and wgmma).
    const ROWS: usize = 16;

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
        let cols = b.len() / k;
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
                let cols = [8, 16, 24, 48, 40, 256][trial % 6];
                let rows = if trial % 4 == 3 { 8 } else { ROWS };
                let wide = trial % 2 == 0;
                let a: Vec<f64> = (0..rows * k)
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
                let acc = accs(rows * cols, &mut rng);
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
                let (k, cols) = (16, if trial % 3 == 0 { 16 } else { 8 });
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

    /// Tiles the kernel declines, leaving them to the f64 path (which the tiles still match):
    /// NaN, infinity, a value with more than 11 significant bits or not exact in f32 in A or
    /// B; NaN, infinity or a value not exact in f32 in C; shapes outside its limits.
    #[test]
    fn rows16_declines() {
        let mut rng = StdRng::seed_from_u64(0xdec);
        let (t, m) = (Ty::Bf16, model_for(80, Ty::Bf16).unwrap());
        let (k, cols) = (16, 24);
        let fresh = |rng: &mut StdRng, rows: usize, cols: usize| {
            let v = |n: usize, rng: &mut StdRng| -> Vec<f64> {
                (0..n).map(|_| value(t, exps(t, false), rng)).collect()
            };
            (v(rows * k, rng), v(k * cols, rng), accs(rows * cols, rng))
        };
        let odd = [f64::NAN, f64::INFINITY, 1.0 + 2f64.powi(-20), 0.1];
        for (i, &v) in odd.iter().enumerate() {
            let (mut a, b, acc) = fresh(&mut rng, ROWS, cols);
            a[5 * k + 3] = v;
            check(&m, &a, &b, k, &acc, false, &format!("A holds {v}"));
            let (a, mut b, acc) = fresh(&mut rng, ROWS, cols);
            b[3 * cols + 17] = v;
            check(&m, &a, &b, k, &acc, false, &format!("B holds {v}"));
            let (a, b, mut acc) = fresh(&mut rng, ROWS, cols);
            acc[7 * cols + 2 + i] = if i == 2 { 1e300 } else { v };
            check(&m, &a, &b, k, &acc, false, &format!("C holds {v}"));
        }
        // shapes: 6 rows (not whole row groups), 12 columns (not a multiple of 8), 17 rows,
        // 264 columns, k = 65
        for (rows, cols, k) in [
            (6, 24, 16),
            (16, 12, 16),
            (17, 8, 16),
            (16, 264, 8),
            (16, 8, 65),
        ] {
            let a: Vec<f64> = (0..rows * k)
                .map(|_| value(t, exps(t, false), &mut rng))
                .collect();
            let b: Vec<f64> = (0..k * cols)
                .map(|_| value(t, exps(t, false), &mut rng))
                .collect();
            let acc = accs(rows * cols, &mut rng);
            check(
                &m,
                &a,
                &b,
                k,
                &acc,
                false,
                &format!("{rows}x{cols}, k = {k}"),
            );
        }
    }
}
