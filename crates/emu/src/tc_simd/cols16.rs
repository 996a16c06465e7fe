//! The column-vector f32 tile kernel: the tensor-core model ([`crate::tc_numerics`]) for a
//! tile of exactly 16 rows (one warp's `mma.sync` m16 tile) whose operands are already f32,
//! with the 16 rows of one output column in the vector lanes (one AVX-512 vector, or two AVX2
//! vectors). The `mma.sync` fast path decodes its fragments straight into this kernel's
//! layouts ([`Cols`]): A transposed (`at[kk * 16 + row]`), B row-major (`b[kk * cols + col]`),
//! C and D column-major (`c[col * 16 + row]`), so there is no conversion from f64, no
//! operand preparation per tile and no gather or scatter: A's column `kk` is one vector load,
//! B's element is broadcast into the multiply, and G columns share each A load.
//!
//! The arithmetic per output is that of [`super::rows16`] (the same f32 products, the same
//! largest magnitude, scales, truncations, exact i32 sums and rounding; see its module docs for
//! why it is exact), so the bits are those of [`crate::tc_numerics::tile`] (tested against the
//! portable kernel). The caller guarantees what `rows16` checks per tile: every A and B value
//! is finite with at most 11 significant bits (true of every decoded f16, bf16, e4m3 and e5m2
//! value that is finite); this kernel checks that C is finite and declines the tile otherwise.
//! Lanes whose block maximum lies outside the f32-safe exponent range run
//! [`crate::tc_numerics::block_sum`] in f64 for that block.

use super::{Cols, Cols16Fn};
use crate::tc_numerics::{block_sum, TcModel};
use std::arch::x86_64::*;

/// Largest k of a tile.
const MAX_K: usize = 64;
// Biased f32 exponents of a block's largest term that the f32 arithmetic handles exactly: the
// range of `super::rows16`.
use super::rows16::{has_avx512, E_HI, E_LO};
/// Columns processed together (independent dependency chains sharing each A load).
const G: usize = 4;

/// The kernel for this CPU: AVX-512F+VL+DQ, else AVX2, else `None`.
pub(crate) fn select() -> Option<Cols16Fn> {
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
pub(crate) fn all() -> Vec<(&'static str, Cols16Fn)> {
    let mut v: Vec<(&'static str, Cols16Fn)> = Vec::new();
    if std::is_x86_feature_detected!("avx2") {
        v.push(("cols16-avx2", tile_y));
    }
    if has_avx512() {
        v.push(("cols16-avx512", tile_z));
    }
    v
}

/// Whether the kernel handles this model and shape, and C is finite.
fn accepts(m: &TcModel, o: &Cols, c: &[f32]) -> bool {
    let (k, cols) = (o.k, o.cols);
    m.block_len() <= 32
        && m.align_frac <= 24
        && m.out_frac <= 23
        && (1..=MAX_K).contains(&k)
        && cols > 0
        && cols.is_multiple_of(G)
        && o.at.len() >= 16 * k
        && o.at_abs.len() >= 16 * k
        && o.b.len() >= k * cols
        && o.b_abs.len() >= k * cols
        && c.len() == 16 * cols
        && c.iter().fold(true, |ok, x| ok & x.is_finite())
}

fn tile_z(m: &TcModel, o: &Cols, c: &mut [f32]) -> bool {
    if !accepts(m, o, c) {
        return false;
    }
    // SAFETY: `select` hands this function out only when the CPU reports AVX-512F, DQ and VL;
    // `accepts` checked every slice length the kernel reads or writes.
    unsafe { tile_z_impl(m, o, c) };
    true
}

#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2")]
unsafe fn tile_z_impl(m: &TcModel, o: &Cols, c: &mut [f32]) {
    drive::<Z>(m, o, c)
}

fn tile_y(m: &TcModel, o: &Cols, c: &mut [f32]) -> bool {
    if !accepts(m, o, c) {
        return false;
    }
    // SAFETY: `select` hands this function out only when the CPU reports AVX2; `accepts`
    // checked every slice length the kernel reads or writes.
    unsafe { tile_y_impl(m, o, c) };
    true
}

#[target_feature(enable = "avx2")]
unsafe fn tile_y_impl(m: &TcModel, o: &Cols, c: &mut [f32]) {
    drive::<Y>(m, o, c)
}

/// G columns at a time: C loaded, the blocks run, D stored. No closures: a closure would not
/// inherit the caller's target features.
#[inline(always)]
unsafe fn drive<V: Col>(m: &TcModel, o: &Cols, c: &mut [f32]) {
    let cp = c.as_mut_ptr();
    for c0 in (0..o.cols).step_by(G) {
        let mut x = [V::zero(); G];
        for (g, xg) in x.iter_mut().enumerate() {
            *xg = V::load(cp.add((c0 + g) * 16));
        }
        let (bl, mut k0) = (m.block_len(), 0);
        while k0 < o.k {
            let n = bl.min(o.k - k0);
            let at = At { m, o, c0, k0 };
            match n {
                8 => block::<V>(&at, 8, &mut x),
                16 => block::<V>(&at, 16, &mut x),
                32 => block::<V>(&at, 32, &mut x),
                _ => block::<V>(&at, n, &mut x),
            }
            k0 += n;
        }
        for (g, xg) in x.iter().enumerate() {
            xg.store(cp.add((c0 + g) * 16));
        }
    }
}

/// Where a block is: the model, the operands, its first column and first k.
struct At<'a> {
    m: &'a TcModel,
    o: &'a Cols<'a>,
    c0: usize,
    k0: usize,
}

/// One block of `n` products plus C for G columns x 16 rows.
#[inline(always)]
unsafe fn block<V: Col>(at: &At, n: usize, x: &mut [V; G]) {
    let (o, cols) = (at.o, at.o.cols);
    let ai = |j: usize| (at.k0 + j) * 16;
    let bi = |j: usize| (at.k0 + j) * cols + at.c0;
    // pass 1: the largest magnitude per output (products recomputed in pass 2)
    let mut big = [V::zero(); G];
    for g in 0..G {
        big[g] = x[g].abs();
    }
    for j in 0..n {
        let a = V::load(o.at_abs.as_ptr().add(ai(j)));
        let b = o.b_abs.as_ptr().add(bi(j));
        for (g, bg) in big.iter_mut().enumerate() {
            *bg = bg.max(a.mul_s(b.add(g)));
        }
    }
    let f = at.m.align_frac as i32;
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
        let a = V::load(o.at.as_ptr().add(ai(j)));
        let b = o.b.as_ptr().add(bi(j));
        for (g, sg) in s.iter_mut().enumerate() {
            *sg = V::add(*sg, a.mul_s(b.add(g)).mul(up[g]).trunc());
        }
    }
    let keep = !((1u32 << (23 - at.m.out_frac)) - 1);
    for g in 0..G {
        let r = V::finish(s[g], keep, down[g]);
        x[g] = if bad[g] != 0 {
            redo_lanes(at, n, g, x[g], r, bad[g])
        } else {
            r
        };
    }
}

/// The block through [`block_sum`] (f64, products exact) for the rows in `bad` of column
/// `at.c0 + g` (their largest term is outside the safe range); `old` holds C, `new` the f32
/// results.
#[cold]
#[inline(never)]
unsafe fn redo_lanes<V: Col>(at: &At, n: usize, g: usize, old: V, new: V, bad: u16) -> V {
    let o = at.o;
    let (old, mut new) = (old.to_array(), new.to_array());
    let mut prods = [0f64; 32];
    for row in (0..16).filter(|r| bad >> r & 1 == 1) {
        for (j, p) in prods[..n].iter_mut().enumerate() {
            let kk = at.k0 + j;
            *p = o.at[kk * 16 + row] as f64 * o.b[kk * o.cols + at.c0 + g] as f64;
        }
        new[row] = block_sum(at.m, &prods[..n], old[row] as f64) as f32;
    }
    V::from_array(new)
}

/// One output column (16 rows) in vector registers, and the operations the kernel needs.
/// Every method is `unsafe`: the caller runs on a CPU with the implementation's target
/// features, and pointers are valid for 16 f32.
trait Col: Copy {
    /// Lanes as i32.
    type I: Copy;
    unsafe fn zero() -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    /// self times the scalar at `p`.
    unsafe fn mul_s(self, p: *const f32) -> Self;
    unsafe fn abs(self) -> Self;
    unsafe fn max(self, o: Self) -> Self;
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

/// AVX-512: one 16-lane vector.
#[derive(Clone, Copy)]
struct Z(__m512);

impl Col for Z {
    type I = __m512i;

    #[inline(always)]
    unsafe fn zero() -> Self {
        Z(_mm512_setzero_ps())
    }

    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Z(_mm512_loadu_ps(p))
    }

    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        _mm512_storeu_ps(p, self.0)
    }

    #[inline(always)]
    unsafe fn mul_s(self, p: *const f32) -> Self {
        Z(_mm512_mul_ps(self.0, _mm512_set1_ps(*p)))
    }

    #[inline(always)]
    unsafe fn abs(self) -> Self {
        Z(_mm512_abs_ps(self.0))
    }

    #[inline(always)]
    unsafe fn max(self, o: Self) -> Self {
        Z(_mm512_max_ps(self.0, o.0))
    }

    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        Z(_mm512_mul_ps(self.0, o.0))
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

/// AVX2: two 8-lane vectors (rows 0..8 and 8..16).
#[derive(Clone, Copy)]
struct Y([__m256; 2]);

impl Col for Y {
    type I = [__m256i; 2];

    #[inline(always)]
    unsafe fn zero() -> Self {
        Y([_mm256_setzero_ps(); 2])
    }

    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Y([_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))])
    }

    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        _mm256_storeu_ps(p, self.0[0]);
        _mm256_storeu_ps(p.add(8), self.0[1]);
    }

    #[inline(always)]
    unsafe fn mul_s(self, p: *const f32) -> Self {
        let b = _mm256_set1_ps(*p);
        Y([_mm256_mul_ps(self.0[0], b), _mm256_mul_ps(self.0[1], b)])
    }

    #[inline(always)]
    unsafe fn abs(self) -> Self {
        let m = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
        Y([_mm256_and_ps(self.0[0], m), _mm256_and_ps(self.0[1], m)])
    }

    #[inline(always)]
    unsafe fn max(self, o: Self) -> Self {
        Y([
            _mm256_max_ps(self.0[0], o.0[0]),
            _mm256_max_ps(self.0[1], o.0[1]),
        ])
    }

    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        Y([
            _mm256_mul_ps(self.0[0], o.0[0]),
            _mm256_mul_ps(self.0[1], o.0[1]),
        ])
    }

    #[inline(always)]
    unsafe fn scales(self, f: i32) -> (Self, Self, u16) {
        let (lo, hi) = (_mm256_set1_epi32(E_LO), _mm256_set1_epi32(E_HI));
        let (mut up, mut down, mut bad) = ([_mm256_setzero_ps(); 2], [_mm256_setzero_ps(); 2], 0);
        for h in 0..2 {
            let bits = _mm256_castps_si256(self.0[h]);
            let e = _mm256_srli_epi32::<23>(bits);
            let nz = _mm256_cmpgt_epi32(bits, _mm256_setzero_si256());
            let tiny = _mm256_and_si256(nz, _mm256_cmpgt_epi32(lo, e));
            let b = _mm256_or_si256(tiny, _mm256_cmpgt_epi32(e, hi));
            bad |= (_mm256_movemask_ps(_mm256_castsi256_ps(b)) as u16) << (8 * h);
            let e = _mm256_min_epi32(_mm256_max_epi32(e, lo), hi);
            let u = _mm256_sub_epi32(_mm256_set1_epi32(254 + f), e);
            let d = _mm256_sub_epi32(e, _mm256_set1_epi32(f));
            up[h] = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(u));
            down[h] = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(d));
        }
        (Y(up), Y(down), bad)
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
        let mut out = [_mm256_setzero_ps(); 2];
        for h in 0..2 {
            // to nearest, then one ulp back toward zero where that rounded away from zero
            // (|s| < 2^31, so the conversion back is exact)
            let f = _mm256_cvtepi32_ps(s[h]);
            let back = _mm256_abs_epi32(_mm256_cvttps_epi32(f));
            let away = _mm256_cmpgt_epi32(back, _mm256_abs_epi32(s[h]));
            let f = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(f), away));
            out[h] = _mm256_mul_ps(_mm256_and_ps(f, keep), down.0[h]);
        }
        Y(out)
    }

    #[inline(always)]
    unsafe fn to_array(self) -> [f32; 16] {
        let mut v = [0f32; 16];
        self.store(v.as_mut_ptr());
        v
    }

    #[inline(always)]
    unsafe fn from_array(v: [f32; 16]) -> Self {
        Y::load(v.as_ptr())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tc_numerics::{model_for, tile_portable};
    use ptx::Ty;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    /// A random finite value of type `t` (raw exponent range `wide` or near 1), zero one time
    /// in 16.
    fn value(t: Ty, wide: bool, rng: &mut StdRng) -> f32 {
        let (ebits, fbits): (u32, u32) = match t {
            Ty::F16 => (5, 10),
            Ty::Bf16 => (8, 7),
            Ty::E4m3 => (4, 3),
            _ => (5, 2),
        };
        let bias = (1i32 << (ebits - 1)) - 1;
        if rng.gen_range(0..16) == 0 {
            return 0.0;
        }
        let e = if wide {
            rng.gen_range(0..=(1 << ebits) - 2)
        } else {
            rng.gen_range(bias - 3..=bias + 3)
        };
        let f = rng.gen_range(0..1u64 << fbits) as f64 / (1u64 << fbits) as f64;
        let v = if e == 0 {
            f * 2f64.powi(1 - bias)
        } else {
            (1.0 + f) * 2f64.powi(e - bias)
        };
        (if rng.gen() { -v } else { v }) as f32
    }

    /// Every kernel gives the portable tile's bits (f64 oracle, row-major layouts) on random
    /// 16-row tiles of every form and architecture: whole exponent ranges (subnormal inputs,
    /// blocks outside the f32-safe range), a zero row and column, C at the ends of the FP32
    /// range and subnormal; and declines a tile with a non-finite C, leaving it untouched.
    #[test]
    fn cols16_matches_portable() {
        let mut rng = StdRng::seed_from_u64(0xc016);
        let forms = [Ty::F16, Ty::Bf16, Ty::E4m3, Ty::E5m2];
        for sm in [80, 89, 90] {
            for (fi, &t) in forms.iter().enumerate() {
                let Some(m) = model_for(sm, t) else { continue };
                for trial in 0..8 {
                    let k = [16, 32, 8, 64][(trial + fi) % 4];
                    let cols = [8, 16, 4, 24][trial % 4];
                    let wide = trial % 2 == 0;
                    let a: Vec<f32> = (0..16 * k)
                        .map(|i| {
                            if i / k == 5 {
                                0.0
                            } else {
                                value(t, wide, &mut rng)
                            }
                        })
                        .collect();
                    let b: Vec<f32> = (0..k * cols)
                        .map(|i| {
                            if i % cols == 2 {
                                0.0
                            } else {
                                value(t, wide, &mut rng)
                            }
                        })
                        .collect();
                    let c: Vec<f32> = (0..16 * cols)
                        .map(|i| match i % 7 {
                            0 => 0.0,
                            1 => f32::MAX * if i % 2 == 0 { 1.0 } else { -1.0 },
                            2 => f32::from_bits(rng.gen_range(1..0x0080_0000)),
                            _ => rng.gen_range(-1e3f32..1e3),
                        })
                        .collect();
                    // the oracle: row-major f64
                    let mut want: Vec<f64> = (0..16 * cols)
                        .map(|i| c[(i % cols) * 16 + i / cols] as f64)
                        .collect();
                    let a64: Vec<f64> = a.iter().map(|&x| x as f64).collect();
                    let b64: Vec<f64> = b.iter().map(|&x| x as f64).collect();
                    tile_portable(&m, &a64, &b64, k, cols, &mut want);
                    // this kernel's layouts
                    let at: Vec<f32> = (0..16 * k).map(|i| a[(i % 16) * k + i / 16]).collect();
                    let at_abs: Vec<f32> = at.iter().map(|x| x.abs()).collect();
                    let b_abs: Vec<f32> = b.iter().map(|x| x.abs()).collect();
                    let o = Cols {
                        at: &at,
                        at_abs: &at_abs,
                        b: &b,
                        b_abs: &b_abs,
                        k,
                        cols,
                    };
                    for (name, f) in all() {
                        let mut x = vec![f32::NAN; 16 * cols];
                        x.copy_from_slice(&c);
                        assert!(f(&m, &o, &mut x), "{name}: declined");
                        for (i, w) in want.iter().enumerate() {
                            let got = x[(i % cols) * 16 + i / cols];
                            assert_eq!(
                                got.to_bits(),
                                (*w as f32).to_bits(),
                                "{name} sm_{sm} {t:?} trial {trial} output {i}: {got} vs {w}"
                            );
                        }
                        let mut bad = c.clone();
                        bad[3] = f32::INFINITY;
                        let before = bad.clone();
                        assert!(!f(&m, &o, &mut bad), "{name}: took a non-finite C");
                        assert_eq!(bad, before, "{name}: declined but wrote");
                    }
                }
            }
        }
    }

    /// Timing harness, not a check (no assertion): ns per call of every kernel on the shapes
    /// the emulator runs: `mma.sync` m16n8k16 bf16 (sm_80) and m16n8k32 e4m3 (sm_89), and
    /// the wgmma widths 64..256 with k 32 e4m3 and k 16 bf16 (sm_90). Run (release, pinned):
    /// `taskset -c 1 cargo test --release -p emu --lib cols16_timing -- --ignored --nocapture`.
    /// `COLS16_CALLS` sets the 16 x 8 output tiles per shape (default 400000), `COLS16_ONLY`
    /// one kernel by name and `COLS16_SHAPE` the shapes whose line contains it (for callgrind:
    /// `tile_y` inclusive / calls is the per-call figure).
    #[test]
    #[ignore]
    fn cols16_timing() {
        let env = |k: &str| std::env::var(k).ok();
        let tiles: usize = env("COLS16_CALLS").and_then(|v| v.parse().ok()).unwrap_or(400_000);
        let (only, shape) = (env("COLS16_ONLY"), env("COLS16_SHAPE").unwrap_or_default());
        let shapes = [
            (80, Ty::Bf16, 16, 8),
            (89, Ty::E4m3, 32, 8),
            (90, Ty::Bf16, 16, 64),
            (90, Ty::Bf16, 16, 256),
            (90, Ty::E4m3, 32, 64),
            (90, Ty::E4m3, 32, 128),
            (90, Ty::E4m3, 32, 256),
        ];
        let mut rng = StdRng::seed_from_u64(0x7157);
        for (name, f) in all() {
            if only.as_deref().is_some_and(|o| o != name) {
                continue;
            }
            for &(sm, t, k, cols) in &shapes {
                let line = format!("{name} sm_{sm} {t:?} k {k} n {cols}");
                if !line.contains(&shape) {
                    continue;
                }
                let m = model_for(sm, t).unwrap();
                let at: Vec<f32> = (0..16 * k).map(|_| value(t, false, &mut rng)).collect();
                let b: Vec<f32> = (0..k * cols).map(|_| value(t, false, &mut rng)).collect();
                let at_abs: Vec<f32> = at.iter().map(|x| x.abs()).collect();
                let b_abs: Vec<f32> = b.iter().map(|x| x.abs()).collect();
                let o = Cols {
                    at: &at,
                    at_abs: &at_abs,
                    b: &b,
                    b_abs: &b_abs,
                    k,
                    cols,
                };
                let mut c: Vec<f32> = (0..16 * cols).map(|_| rng.gen_range(-4f32..4.0)).collect();
                let calls = (tiles * 8 / cols).max(1);
                let mut best = f64::INFINITY;
                for _ in 0..3 {
                    let t0 = std::time::Instant::now();
                    for _ in 0..calls {
                        assert!(f(&m, std::hint::black_box(&o), &mut c));
                    }
                    best = best.min(t0.elapsed().as_nanos() as f64 / calls as f64);
                }
                println!("{line}: {best:.1} ns/call ({calls} calls x 3)");
            }
        }
    }
}

