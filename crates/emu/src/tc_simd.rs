//! SIMD kernels for [`crate::tc_numerics::tile`], written with `std::arch` intrinsics and
//! selected at run time:
//! - [`cols16`]: 16-row tiles whose operands the caller already holds as f32 in its layouts
//!   (A transposed, C column-major; the `mma.sync` fast path decodes its fragments into them),
//!   AVX-512F+DQ+VL or AVX2;
//! - [`rows16`] (first choice of [`crate::tc_numerics::tile`]): tiles of up to 16 rows and a multiple of 8 columns (every
//!   mma.sync and wgmma tile) in f32 with i32 sums, AVX-512F+DQ+VL or AVX2 (see its docs);
//! - the f64 kernel below: the tensor-core model's block sums for two rows x 8 adjacent outputs
//!   at a time (AVX2), for finite tiles `rows16` declines.
//!
//! The f64 kernel:
//! Same arithmetic as the portable `tc_numerics::group` (which stays the fallback and the test
//! oracle, compared bit for bit in the tests): exact f64 products, alignment to the largest
//! exponent by a power-of-two scale, truncation toward zero, exact sum, one rounding toward
//! zero. What makes it cheaper:
//! - the caller guarantees every input and accumulator is finite, so there is no per-product
//!   NaN/infinity check (a tile with a special takes the portable path);
//! - aligned terms are below 2^(F+1) <= 2^25 and a block has at most 33 of them, so each is
//!   truncated by one `cvttpd2dq` and the sum is an exact 32-bit integer add;
//! - the result `s * 2^(e-F)` is an exact f64, so rounding toward zero to `out_frac` fraction
//!   bits is a mask of its significand whenever it lies in the normal FP32 range (otherwise the
//!   portable rounding runs for that block);
//! - two rows share each load of B, and the common block lengths (4, 8, 16, 32) are compiled
//!   as constants so the k loops unroll.
//!
//! The kernel is built twice: for AVX2, and for AVX2 with AVX-512VL (the same instructions,
//! 32 vector registers instead of 16, so the two rows' accumulators stay in registers).

use crate::tc_numerics::{TcModel, GROUP};

#[cfg(target_arch = "x86_64")]
mod cols16;
#[cfg(target_arch = "x86_64")]
mod rows16;

/// The operands of a 16-row tile in the layouts of the [`cols16`] kernel. `at_abs` and
/// `b_abs` hold the magnitudes of `at` and `b` (pass 1 multiplies magnitudes, so it is one
/// multiply and one max per product vector).
pub(crate) struct Cols<'a> {
    pub at: &'a [f32],
    pub at_abs: &'a [f32],
    pub b: &'a [f32],
    pub b_abs: &'a [f32],
    pub k: usize,
    pub cols: usize,
}

/// The kernel's signature: `c` (column-major, `cols * 16`) holds C on entry and D on exit;
/// `false` (and `c` untouched) for a tile it does not handle.
pub(crate) type Cols16Fn = fn(&TcModel, &Cols, &mut [f32]) -> bool;

/// The column-vector f32 kernel for 16-row tiles whose operands are already f32 in its layouts
/// ([`cols16`]: the `mma.sync` fast path), for this CPU (checked once), or `None` (no AVX2, or
/// not x86-64).
pub(crate) fn fast_cols16() -> Option<Cols16Fn> {
    #[cfg(target_arch = "x86_64")]
    {
        static K: std::sync::OnceLock<Option<Cols16Fn>> = std::sync::OnceLock::new();
        *K.get_or_init(cols16::select)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// The signature of the f32 kernels: [`crate::tc_numerics::tile`]'s, returning `false` (and
/// leaving `acc` untouched) for a tile the kernel does not handle.
pub(crate) type Tile16Fn = fn(&TcModel, &[f64], &[f64], usize, usize, &mut [f64]) -> bool;

/// The f32 tile kernel ([`rows16`]) for this CPU (checked at run time), or `None`
/// (no AVX2, or not x86-64). It returns `false`, leaving the tile untouched, for a tile it does
/// not handle.
pub(crate) fn fast_tile16() -> Option<Tile16Fn> {
    #[cfg(target_arch = "x86_64")]
    {
        rows16::select()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// The signature of [`crate::tc_numerics::tile`].
pub(crate) type TileFn = fn(&TcModel, &[f64], &[f64], usize, usize, &mut [f64]);

/// The SIMD tile for this CPU (checked at run time), or `None` (no AVX2, or not x86-64). Its
/// precondition: every input and accumulator finite.
pub(crate) fn fast_tile() -> Option<TileFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512vl") && std::is_x86_feature_detected!("avx2") {
            return Some(x86::tile_vl);
        }
        if std::is_x86_feature_detected!("avx2") {
            return Some(x86::tile_avx2);
        }
    }
    None
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use crate::tc_numerics::{block_sum, round_group, scalar_cols, tile_portable};
    use std::arch::x86_64::*;

    /// Whether the kernel handles this model and shape (else the portable tile runs).
    fn supported(m: &TcModel, a: &[f64], bt: &[f64], k: usize, cols: usize, acc: &[f64]) -> bool {
        let rows = acc.len().checked_div(cols).unwrap_or(0);
        m.block_len() <= 32
            && m.align_frac <= 24
            && m.out_frac <= 23
            && k > 0
            && cols > 0
            && a.len() >= rows * k
            && bt.len() >= k * cols
    }

    pub(super) fn tile_avx2(
        m: &TcModel,
        a: &[f64],
        bt: &[f64],
        k: usize,
        cols: usize,
        acc: &mut [f64],
    ) {
        if !supported(m, a, bt, k, cols, acc) {
            return tile_portable(m, a, bt, k, cols, acc);
        }
        // SAFETY: `fast_tile` hands this function out only when the CPU reports AVX2;
        // `supported` checked the slice lengths the kernel relies on.
        unsafe { tile_avx2_impl(m, a, bt, k, cols, acc) }
    }

    pub(super) fn tile_vl(
        m: &TcModel,
        a: &[f64],
        bt: &[f64],
        k: usize,
        cols: usize,
        acc: &mut [f64],
    ) {
        if !supported(m, a, bt, k, cols, acc) {
            return tile_portable(m, a, bt, k, cols, acc);
        }
        // SAFETY: `fast_tile` hands this function out only when the CPU reports AVX2 and
        // AVX-512VL; `supported` checked the slice lengths the kernel relies on.
        unsafe { tile_vl_impl(m, a, bt, k, cols, acc) }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn tile_avx2_impl(
        m: &TcModel,
        a: &[f64],
        bt: &[f64],
        k: usize,
        cols: usize,
        acc: &mut [f64],
    ) {
        tile_rows(m, a, bt, k, cols, acc)
    }

    #[target_feature(enable = "avx2,avx512f,avx512vl")]
    unsafe fn tile_vl_impl(
        m: &TcModel,
        a: &[f64],
        bt: &[f64],
        k: usize,
        cols: usize,
        acc: &mut [f64],
    ) {
        tile_rows(m, a, bt, k, cols, acc)
    }

    /// Row pairs (an odd last row alone) x full column groups through the kernel; remainder
    /// columns through the portable scalar code.
    #[inline(always)]
    unsafe fn tile_rows(
        m: &TcModel,
        a: &[f64],
        bt: &[f64],
        k: usize,
        cols: usize,
        acc: &mut [f64],
    ) {
        let rows = acc.len() / cols;
        let full = cols / GROUP * GROUP;
        let mut r = 0;
        while r < rows {
            let pair = r + 1 < rows;
            for c0 in (0..full).step_by(GROUP) {
                let b = bt.as_ptr().add(c0);
                let x0 = acc.as_mut_ptr().add(r * cols + c0);
                let a0 = a.as_ptr().add(r * k);
                if pair {
                    let x1 = acc.as_mut_ptr().add((r + 1) * cols + c0);
                    by_block::<2>(m, [a0, a0.add(k)], b, k, cols, [x0, x1]);
                } else {
                    by_block::<1>(m, [a0, a0], b, k, cols, [x0, x0]);
                }
            }
            for rr in r..(r + 1 + pair as usize) {
                let row = &mut acc[rr * cols..(rr + 1) * cols];
                scalar_cols(m, &a[rr * k..(rr + 1) * k], bt, cols, full, row);
            }
            r += 1 + pair as usize;
        }
    }

    /// The block loop for `R` rows (1 or 2) of one column group, with the common block lengths
    /// as constants.
    #[inline(always)]
    unsafe fn by_block<const R: usize>(
        m: &TcModel,
        a: [*const f64; 2],
        b: *const f64,
        k: usize,
        stride: usize,
        x: [*mut f64; 2],
    ) {
        let mut xs = [[_mm256_setzero_pd(); 2]; R];
        for (r, xr) in xs.iter_mut().enumerate() {
            *xr = [_mm256_loadu_pd(x[r]), _mm256_loadu_pd(x[r].add(4))];
        }
        let bl = m.block_len();
        let mut k0 = 0;
        while k0 < k {
            let n = bl.min(k - k0);
            let ak = [a[0].add(k0), a[1].add(k0)];
            let bk = b.add(k0 * stride);
            match n {
                4 => block::<R>(m, 4, ak, bk, stride, &mut xs),
                8 => block::<R>(m, 8, ak, bk, stride, &mut xs),
                16 => block::<R>(m, 16, ak, bk, stride, &mut xs),
                32 => block::<R>(m, 32, ak, bk, stride, &mut xs),
                _ => block::<R>(m, n, ak, bk, stride, &mut xs),
            }
            k0 += n;
        }
        for (r, xr) in xs.iter().enumerate() {
            _mm256_storeu_pd(x[r], xr[0]);
            _mm256_storeu_pd(x[r].add(4), xr[1]);
        }
    }

    /// One block of `n` products for `R` rows x 8 columns: `a[r]` points at row r's first
    /// input of the block, `b` at B's first row of the block (rows `stride` apart).
    #[inline(always)]
    unsafe fn block<const R: usize>(
        m: &TcModel,
        n: usize,
        a: [*const f64; 2],
        b: *const f64,
        stride: usize,
        xs: &mut [[__m256d; 2]; R],
    ) {
        let abs = _mm256_castsi256_pd(_mm256_set1_epi64x(i64::MAX));
        // pass 1: the largest magnitude per output (products recomputed in pass 2)
        let mut big = [[_mm256_setzero_pd(); 2]; R];
        for r in 0..R {
            big[r] = [_mm256_and_pd(xs[r][0], abs), _mm256_and_pd(xs[r][1], abs)];
        }
        for j in 0..n {
            let row = b.add(j * stride);
            let bv = [_mm256_loadu_pd(row), _mm256_loadu_pd(row.add(4))];
            for r in 0..R {
                let av = _mm256_set1_pd(*a[r].add(j));
                for h in 0..2 {
                    let p = _mm256_and_pd(_mm256_mul_pd(av, bv[h]), abs);
                    big[r][h] = _mm256_max_pd(big[r][h], p);
                }
            }
        }
        let f = m.align_frac as i64;
        let mut sc = [([_mm256_setzero_pd(); 2], [_mm256_setzero_pd(); 2]); R];
        let mut tiny = _mm256_setzero_si256();
        for r in 0..R {
            let (up, down, t) = scales(big[r], f);
            sc[r] = (up, down);
            tiny = _mm256_or_si256(tiny, t);
        }
        if _mm256_movemask_epi8(tiny) != 0 {
            // rare: the portable block sums of every output of this block
            for (rr, xr) in xs.iter_mut().enumerate() {
                scalar_block(m, n, a[rr], b, stride, xr);
            }
            return;
        }
        // pass 2: aligned, truncated, summed in 32-bit integers (exact, see module docs)
        let mut s = [[_mm_setzero_si128(); 2]; R];
        for r in 0..R {
            for h in 0..2 {
                s[r][h] = _mm256_cvttpd_epi32(_mm256_mul_pd(xs[r][h], sc[r].0[h]));
            }
        }
        for j in 0..n {
            let row = b.add(j * stride);
            let bv = [_mm256_loadu_pd(row), _mm256_loadu_pd(row.add(4))];
            for r in 0..R {
                let av = _mm256_set1_pd(*a[r].add(j));
                for h in 0..2 {
                    let p = _mm256_mul_pd(_mm256_mul_pd(av, bv[h]), sc[r].0[h]);
                    s[r][h] = _mm_add_epi32(s[r][h], _mm256_cvttpd_epi32(p));
                }
            }
        }
        let mut ok = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
        for r in 0..R {
            for h in 0..2 {
                xs[r][h] = _mm256_mul_pd(_mm256_cvtepi32_pd(s[r][h]), sc[r].1[h]);
                ok = _mm256_and_pd(ok, in_range(xs[r][h]));
            }
        }
        round_rz(xs, m.out_frac, _mm256_movemask_pd(ok) == 0xf);
    }
    /// Two 4-lane halves of the 8 columns.
    type Pair = [__m256d; 2];

    /// 2^(F - e) and 2^(e - F) per column from the largest magnitudes `big`, for biased
    /// exponents e, and a mask of the columns whose largest non-zero term is below 2^(F - 1022)
    /// (not reachable from tensor-core inputs; the caller then runs the portable code). An
    /// all-zero column (e = 0) gets the scales of e = F + 1 (its terms and sum are zero
    /// whatever the scale).
    #[inline(always)]
    unsafe fn scales(big: Pair, f: i64) -> (Pair, Pair, __m256i) {
        let zero = _mm256_setzero_si256();
        let lo = _mm256_set1_epi64x(f + 1);
        let (mut up, mut down, mut tiny) = (big, big, zero);
        for h in 0..2 {
            let e = _mm256_srli_epi64::<52>(_mm256_castpd_si256(big[h]));
            let t = _mm256_and_si256(_mm256_cmpgt_epi64(e, zero), _mm256_cmpgt_epi64(lo, e));
            tiny = _mm256_or_si256(tiny, t);
            // exponents are below 2^11: the 32-bit max of the low halves is the 64-bit max
            let e = _mm256_max_epi32(e, lo);
            let u = _mm256_sub_epi64(_mm256_set1_epi64x(2046 + f), e);
            up[h] = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(u));
            let d = _mm256_sub_epi64(e, _mm256_set1_epi64x(f));
            down[h] = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(d));
        }
        (up, down, tiny)
    }

    /// All-ones lanes where `v` is zero or its magnitude is in the normal FP32 range.
    #[inline(always)]
    unsafe fn in_range(v: __m256d) -> __m256d {
        let abs = _mm256_and_pd(v, _mm256_castsi256_pd(_mm256_set1_epi64x(i64::MAX)));
        let lo = _mm256_cmp_pd::<_CMP_GE_OQ>(abs, _mm256_set1_pd(f32::MIN_POSITIVE as f64));
        let hi = _mm256_cmp_pd::<_CMP_LT_OQ>(abs, _mm256_set1_pd(2f64.powi(128)));
        let zero = _mm256_cmp_pd::<_CMP_EQ_OQ>(abs, _mm256_setzero_pd());
        _mm256_or_pd(_mm256_and_pd(lo, hi), zero)
    }

    /// Rounds exact f64 values toward zero to FP32 values with `frac` fraction bits: a mask of
    /// the significand when every lane is zero or in the normal FP32 range (`all_in_range`),
    /// else the portable per-lane rounding.
    #[inline(always)]
    unsafe fn round_rz<const R: usize>(xs: &mut [Pair; R], frac: u32, all_in_range: bool) {
        if all_in_range {
            let keep = !((1u64 << (52 - frac)) - 1);
            let keep = _mm256_castsi256_pd(_mm256_set1_epi64x(keep as i64));
            // +0 for a zero sum (the integer sum converts to +0.0; the scale is positive)
            for x in xs.iter_mut().flatten() {
                *x = _mm256_and_pd(*x, keep);
            }
            return;
        }
        for x in xs.iter_mut().flatten() {
            let mut l = [0f64; 4];
            _mm256_storeu_pd(l.as_mut_ptr(), *x);
            round_group(&mut l, frac);
            *x = _mm256_loadu_pd(l.as_ptr());
        }
    }

    /// The portable block sums of one row's 8 outputs (the rare `scales` fallback).
    #[inline(never)]
    unsafe fn scalar_block(
        m: &TcModel,
        n: usize,
        a: *const f64,
        b: *const f64,
        stride: usize,
        xs: &mut Pair,
    ) {
        let mut x = [0f64; 8];
        _mm256_storeu_pd(x.as_mut_ptr(), xs[0]);
        _mm256_storeu_pd(x.as_mut_ptr().add(4), xs[1]);
        let mut col = [0f64; 32];
        for (c, xc) in x.iter_mut().enumerate() {
            for (j, p) in col[..n].iter_mut().enumerate() {
                *p = *a.add(j) * *b.add(j * stride + c);
            }
            *xc = block_sum(m, &col[..n], *xc);
        }
        xs[0] = _mm256_loadu_pd(x.as_ptr());
        xs[1] = _mm256_loadu_pd(x.as_ptr().add(4));
    }
}

#[cfg(test)]
mod tests {
    use crate::tc_numerics::{model_for, tile, tile_baseline, tile_portable, TcModel};
    use ptx::Ty;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    /// Every SIMD build this CPU can run (both the AVX2 and the AVX-512VL one where present).
    fn kernels() -> Vec<(&'static str, super::TileFn)> {
        let mut v: Vec<(&'static str, super::TileFn)> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                v.push(("avx2", super::x86::tile_avx2));
            }
            if std::is_x86_feature_detected!("avx512vl") && std::is_x86_feature_detected!("avx2") {
                v.push(("avx512vl", super::x86::tile_vl));
            }
        }
        v
    }

    /// A random finite input of type `t`: half of them near 1, half over the whole exponent
    /// range (subnormals included), a few exact zeros.
    fn value(t: Ty, rng: &mut StdRng) -> f64 {
        let (ebits, fbits): (u32, u32) = match t {
            Ty::F16 => (5, 10),
            Ty::Bf16 => (8, 7),
            Ty::Tf32 => (8, 10),
            Ty::E4m3 => (4, 3),
            _ => (5, 2),
        };
        let emax = (1i32 << ebits) - 2;
        let bias = (1i32 << (ebits - 1)) - 1;
        if rng.gen_range(0..16) == 0 {
            return 0.0;
        }
        let e = if rng.gen() {
            rng.gen_range(0..=emax)
        } else {
            rng.gen_range(bias - 3..=bias + 3)
        };
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

    /// The AVX2 group kernel (through `tile`) equals the portable kernel and its baseline
    /// build bit for bit on random finite tiles of every form and architecture, with all-zero
    /// rows and columns, accumulators at the ends of the FP32 range and a column remainder.
    #[test]
    fn simd_tile_matches_portable() {
        let mut rng = StdRng::seed_from_u64(0x7c5);
        let forms = [Ty::F16, Ty::Bf16, Ty::Tf32, Ty::E4m3, Ty::E5m2];
        let mut models: Vec<TcModel> = [80, 89, 90]
            .iter()
            .flat_map(|&sm| forms.map(|t| model_for(sm, t).unwrap()))
            .collect();
        models.push(TcModel {
            block: 5,
            align_frac: 24,
            out_frac: 10,
        });
        for (mi, m) in models.iter().enumerate() {
            let t = forms[mi % forms.len()];
            for trial in 0..40 {
                let (rows, k) = (4, [16, 32, 64, 7][trial % 4]);
                let cols = if trial % 5 == 4 {
                    21
                } else {
                    8 * (1 + trial % 3)
                };
                let mut a: Vec<f64> = (0..rows * k).map(|_| value(t, &mut rng)).collect();
                let mut b: Vec<f64> = (0..k * cols).map(|_| value(t, &mut rng)).collect();
                a[k..2 * k].iter_mut().for_each(|v| *v = 0.0); // row 1 all zero
                (0..k).for_each(|kk| b[kk * cols + 3] = 0.0); // column 3 all zero
                let mut acc: Vec<f64> = (0..rows * cols)
                    .map(|i| match i % 7 {
                        0 => 0.0,
                        1 => f32::MAX as f64 * if i % 2 == 0 { 1.0 } else { -1.0 },
                        2 => f32::from_bits(rng.gen_range(1..0x0080_0000)) as f64,
                        _ => rng.gen_range(-1e3f32..1e3) as f64,
                    })
                    .collect();
                if trial % 3 == 0 {
                    // tiny products: sums below the normal FP32 range
                    a.iter_mut().for_each(|v| *v *= 2f64.powi(-60));
                    acc.iter_mut().for_each(|v| *v = 0.0);
                }
                let rows = if trial % 4 == 1 { 3 } else { rows };
                acc.truncate(rows * cols);
                let (mut y, mut z) = (acc.clone(), acc.clone());
                tile_portable(m, &a, &b, k, cols, &mut y);
                tile_baseline(m, &a, &b, k, cols, &mut z);
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&y), bits(&z), "model {m:?} trial {trial} (baseline)");
                for (name, f) in kernels() {
                    let mut x = acc.clone();
                    f(m, &a, &b, k, cols, &mut x);
                    assert_eq!(bits(&x), bits(&y), "{name}: model {m:?} trial {trial}");
                }
                let mut x = acc;
                tile(m, &a, &b, k, cols, &mut x);
                assert_eq!(bits(&x), bits(&y), "tile: model {m:?} trial {trial}");
            }
        }
    }

    /// The kernel is really selected on this host when it has AVX2 (the test above would
    /// otherwise compare the portable kernel with itself).
    #[test]
    fn simd_kernel_is_used_where_available() {
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            super::fast_tile().is_some(),
            std::is_x86_feature_detected!("avx2")
        );
    }
}
