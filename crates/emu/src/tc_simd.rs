//! AVX2 kernel for the column groups of [`crate::tc_numerics::tile`]: the tensor-core model's
//! block sums for 8 adjacent outputs of one row, written with `std::arch` intrinsics.
//!
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
//!   portable rounding runs for that block).

use crate::tc_numerics::{TcModel, GROUP};

/// The AVX2 group kernel when the CPU has AVX2 (checked once per call site at run time).
pub(crate) type FastGroupFn = fn(&TcModel, &[f64], &[f64], usize, &mut [f64; GROUP]);

/// [`FastGroupFn`] for this CPU, or `None` (no AVX2, or not x86-64).
pub(crate) fn fast_group() -> Option<FastGroupFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            return Some(x86::group_checked);
        }
    }
    None
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use crate::tc_numerics::{block_sum, round_group};
    use std::arch::x86_64::*;

    /// Checks the slice bounds the kernel reads, then runs it (or the portable code when the
    /// model or the shapes are outside what the kernel handles).
    pub(super) fn group_checked(
        m: &TcModel,
        ar: &[f64],
        bt: &[f64],
        stride: usize,
        x: &mut [f64; GROUP],
    ) {
        let k = ar.len();
        let fits = k == 0 || (stride >= GROUP && bt.len() >= (k - 1) * stride + GROUP);
        if !fits || m.block_len() > 32 || m.align_frac > 24 || m.out_frac > 23 {
            crate::tc_numerics::group_portable(m, ar, bt, stride, x);
            return;
        }
        // SAFETY: `fast_group` hands this function out only when the CPU reports AVX2, and the
        // check above keeps every load within `ar` and `bt`.
        unsafe { group_avx2(m, ar, bt, stride, x) }
    }

    /// Two 4-lane halves of the 8 columns.
    type Pair = [__m256d; 2];

    /// # Safety
    /// The CPU must support AVX2; `bt` must hold `(ar.len() - 1) * stride + GROUP` elements;
    /// `m.block_len() <= 32`, `m.align_frac <= 24`; every value finite.
    #[target_feature(enable = "avx2")]
    unsafe fn group_avx2(m: &TcModel, ar: &[f64], bt: &[f64], stride: usize, x: &mut [f64; 8]) {
        let k = ar.len();
        let f = m.align_frac as i64;
        let abs = _mm256_castsi256_pd(_mm256_set1_epi64x(i64::MAX));
        let bp = bt.as_ptr();
        let mut xs: Pair = [
            _mm256_loadu_pd(x.as_ptr()),
            _mm256_loadu_pd(x.as_ptr().add(4)),
        ];
        let mut k0 = 0;
        while k0 < k {
            let n = m.block_len().min(k - k0);
            // pass 1: the largest magnitude per column (products recomputed in pass 2)
            let mut big: Pair = [_mm256_and_pd(xs[0], abs), _mm256_and_pd(xs[1], abs)];
            for j in k0..k0 + n {
                let av = _mm256_set1_pd(*ar.get_unchecked(j));
                let row = bp.add(j * stride);
                for h in 0..2 {
                    let p = _mm256_mul_pd(av, _mm256_loadu_pd(row.add(4 * h)));
                    big[h] = _mm256_max_pd(big[h], _mm256_and_pd(p, abs));
                }
            }
            let Some((up, down)) = scales(big, f) else {
                scalar_block(m, ar, bt, stride, k0, n, &mut xs);
                k0 += n;
                continue;
            };
            // pass 2: aligned, truncated, summed in 32-bit integers (exact, see module docs)
            let mut s = [
                _mm256_cvttpd_epi32(_mm256_mul_pd(xs[0], up[0])),
                _mm256_cvttpd_epi32(_mm256_mul_pd(xs[1], up[1])),
            ];
            for j in k0..k0 + n {
                let av = _mm256_set1_pd(*ar.get_unchecked(j));
                let row = bp.add(j * stride);
                for h in 0..2 {
                    let p = _mm256_mul_pd(av, _mm256_loadu_pd(row.add(4 * h)));
                    let t = _mm256_cvttpd_epi32(_mm256_mul_pd(p, up[h]));
                    s[h] = _mm_add_epi32(s[h], t);
                }
            }
            for h in 0..2 {
                let v = _mm256_mul_pd(_mm256_cvtepi32_pd(s[h]), down[h]);
                xs[h] = round_rz(v, m.out_frac);
            }
            k0 += n;
        }
        _mm256_storeu_pd(x.as_mut_ptr(), xs[0]);
        _mm256_storeu_pd(x.as_mut_ptr().add(4), xs[1]);
    }

    /// 2^(F - e) and 2^(e - F) per column from the largest magnitudes `big`, for biased
    /// exponents e. An all-zero column (e = 0) gets the scales of e = F + 1 (its terms and sum
    /// are zero whatever the scale). `None` when a column's largest non-zero term is below
    /// 2^(F - 1022) (not reachable from tensor-core inputs, handled by the portable code).
    #[inline(always)]
    unsafe fn scales(big: Pair, f: i64) -> Option<(Pair, Pair)> {
        let zero = _mm256_setzero_si256();
        let lo = _mm256_set1_epi64x(f + 1);
        let mut up = big;
        let mut down = big;
        for h in 0..2 {
            let e = _mm256_srli_epi64::<52>(_mm256_castpd_si256(big[h]));
            let tiny = _mm256_and_si256(_mm256_cmpgt_epi64(e, zero), _mm256_cmpgt_epi64(lo, e));
            if _mm256_movemask_epi8(tiny) != 0 {
                return None;
            }
            // exponents are below 2^11: the 32-bit max of the low halves is the 64-bit max
            let e = _mm256_max_epi32(e, lo);
            let u = _mm256_sub_epi64(_mm256_set1_epi64x(2046 + f), e);
            up[h] = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(u));
            let d = _mm256_sub_epi64(e, _mm256_set1_epi64x(f));
            down[h] = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(d));
        }
        Some((up, down))
    }

    /// Rounds exact f64 values toward zero to FP32 values with `frac` fraction bits: a mask of
    /// the significand when every lane is zero or in the normal FP32 range, else the portable
    /// per-lane rounding.
    #[inline(always)]
    unsafe fn round_rz(v: __m256d, frac: u32) -> __m256d {
        let abs = _mm256_and_pd(v, _mm256_castsi256_pd(_mm256_set1_epi64x(i64::MAX)));
        let lo = _mm256_cmp_pd::<_CMP_GE_OQ>(abs, _mm256_set1_pd(f32::MIN_POSITIVE as f64));
        let hi = _mm256_cmp_pd::<_CMP_LT_OQ>(abs, _mm256_set1_pd(2f64.powi(128)));
        let zero = _mm256_cmp_pd::<_CMP_EQ_OQ>(abs, _mm256_setzero_pd());
        let ok = _mm256_or_pd(_mm256_and_pd(lo, hi), zero);
        if _mm256_movemask_pd(ok) == 0xf {
            let keep = !((1u64 << (52 - frac)) - 1);
            // +0 for a zero sum (the integer sum converts to +0.0; `down` is positive)
            return _mm256_and_pd(v, _mm256_castsi256_pd(_mm256_set1_epi64x(keep as i64)));
        }
        let mut l = [0f64; 4];
        _mm256_storeu_pd(l.as_mut_ptr(), v);
        round_group(&mut l, frac);
        _mm256_loadu_pd(l.as_ptr())
    }

    /// The portable block sum of every column of one block (the rare `scales` fallback).
    #[inline(never)]
    unsafe fn scalar_block(
        m: &TcModel,
        ar: &[f64],
        bt: &[f64],
        stride: usize,
        k0: usize,
        n: usize,
        xs: &mut Pair,
    ) {
        let mut x = [0f64; 8];
        _mm256_storeu_pd(x.as_mut_ptr(), xs[0]);
        _mm256_storeu_pd(x.as_mut_ptr().add(4), xs[1]);
        let mut col = [0f64; 32];
        for (c, xc) in x.iter_mut().enumerate() {
            for (jj, p) in col[..n].iter_mut().enumerate() {
                *p = ar[k0 + jj] * bt[(k0 + jj) * stride + c];
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
                let cols = if trial % 5 == 4 { 21 } else { 8 * (1 + trial % 3) };
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
                let (mut x, mut y, mut z) = (acc.clone(), acc.clone(), acc);
                tile(m, &a, &b, k, cols, &mut x);
                tile_portable(m, &a, &b, k, cols, &mut y);
                tile_baseline(m, &a, &b, k, cols, &mut z);
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&x), bits(&y), "model {m:?} trial {trial}");
                assert_eq!(bits(&x), bits(&z), "model {m:?} trial {trial} (baseline)");
            }
        }
    }

    /// The kernel is really selected on this host when it has AVX2 (the test above would
    /// otherwise compare the portable kernel with itself).
    #[test]
    fn simd_kernel_is_used_where_available() {
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            super::fast_group().is_some(),
            std::is_x86_feature_detected!("avx2")
        );
    }
}
