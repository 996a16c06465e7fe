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
//! value that is finite); this kernel checks that C is finite (vector compares over C before
//! anything is written) and declines the tile otherwise.
//!
//! What keeps it short (instructions per `mma.sync` m16n8k16 tile matter: the emulator runs
//! one per warp-level mma):
//! - the scales come from the exponent bits of the block maxima by integer subtraction (no
//!   shifts; the inverse scale is derived from the scale when rounding), and whether any
//!   lane's maximum lies outside the f32-safe exponent range is one unsigned minimum and one
//!   maximum per vector, tested once per block of G columns; such a (rare) block runs
//!   [`crate::tc_numerics::block_sum`] in f64 for all its outputs;
//! - each block reads C from and writes D to the tile in place, so no column registers are
//!   carried (and spilled) across blocks;
//! - pass 1 runs two k values per iteration (a block of 8 unrolls completely), pass 2 one
//!   (each scale is then used once and read from the stack inside its multiply);
//! - the rounding masks the significand only for models that keep fewer than 23 fraction
//!   bits.
//!
//! (Measured with callgrind and the `cols16_timing` harness below; docs/PERF.md, session 10.)

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
/// The f32 exponent field.
const EXP: i32 = 0x7f80_0000;
/// The smallest bits of a maximum in the safe range (`E_LO`, zero fraction).
const LO_BITS: i32 = E_LO << 23;
/// The smallest bits of a maximum above the safe range.
const HI_BITS: i32 = (E_HI + 1) << 23;

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

/// Whether the kernel handles this model and shape (C's finiteness is the kernel's check).
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
}

fn tile_z(m: &TcModel, o: &Cols, c: &mut [f32]) -> bool {
    // SAFETY: `select` hands this function out only when the CPU reports AVX-512F, DQ and VL;
    // `accepts` checked every slice length the kernel reads or writes.
    accepts(m, o, c) && unsafe { tile_z_impl(m, o, c) }
}

#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2")]
unsafe fn tile_z_impl(m: &TcModel, o: &Cols, c: &mut [f32]) -> bool {
    drive::<Z>(m, o, c)
}

fn tile_y(m: &TcModel, o: &Cols, c: &mut [f32]) -> bool {
    // SAFETY: `select` hands this function out only when the CPU reports AVX2; `accepts`
    // checked every slice length the kernel reads or writes.
    accepts(m, o, c) && unsafe { tile_y_impl(m, o, c) }
}

#[target_feature(enable = "avx2")]
unsafe fn tile_y_impl(m: &TcModel, o: &Cols, c: &mut [f32]) -> bool {
    drive::<Y>(m, o, c)
}

/// Checks C, then runs the blocks of G columns at a time in place. `false` (nothing written)
/// when C has a non-finite value. No closures: a closure would not inherit the caller's
/// target features.
#[inline(always)]
unsafe fn drive<V: Col>(m: &TcModel, o: &Cols, c: &mut [f32]) -> bool {
    let cp = c.as_mut_ptr();
    let mut top = V::zero().bits();
    for col in 0..o.cols {
        top = V::max_bits(top, V::load(cp.add(col * 16)).abs().bits());
    }
    // a finite |x| has bits below those of infinity (NaN above)
    if V::any_gt(top, EXP - 1) {
        return false;
    }
    let keep = !((1u32 << (23 - m.out_frac)) - 1);
    let bl = m.block_len();
    // D of a block is written over its C, the next block's C (the columns are independent)
    for c0 in (0..o.cols).step_by(G) {
        let x = cp.add(c0 * 16);
        let mut k0 = 0;
        while k0 < o.k {
            let n = bl.min(o.k - k0);
            let at = At { m, o, c0, k0, keep };
            match n {
                8 => block::<V>(&at, 8, x),
                16 => block::<V>(&at, 16, x),
                32 => block::<V>(&at, 32, x),
                _ => block::<V>(&at, n, x),
            }
            k0 += n;
        }
    }
    true
}

/// Where a block is: the model, the operands, its first column and first k, and the mask
/// that keeps the model's `out_frac` fraction bits.
struct At<'a> {
    m: &'a TcModel,
    o: &'a Cols<'a>,
    c0: usize,
    k0: usize,
    keep: u32,
}

/// Runs `$body` with `$j` = 0..$n, two at a time while at least two are left: half the loop
/// control, and LLVM unrolls the short loops (pass 1 of a block of 8) completely. (Unrolled
/// by 8, LLVM hoists all of A's loads of a block and spills them.) A macro, not a closure: a
/// closure would not inherit the caller's target features.
macro_rules! by2 {
    ($n:expr, $j:ident => $body:block) => {{
        let mut j0 = 0;
        while j0 + 2 <= $n {
            for $j in [j0, j0 + 1] $body
            j0 += 2;
        }
        if j0 < $n {
            let $j = j0;
            $body
        }
    }};
}

/// One block of `n` products plus C for G columns x 16 rows: C read from and D written to the
/// G column-major columns at `x`.
#[inline(always)]
unsafe fn block<V: Col>(at: &At, n: usize, x: *mut f32) {
    let (o, cols) = (at.o, at.o.cols);
    let (a_abs, b_abs) = (o.at_abs.as_ptr().add(at.k0 * 16), o.b_abs.as_ptr());
    let b_abs = b_abs.add(at.k0 * cols + at.c0);
    // pass 1: the largest magnitude per output (products recomputed in pass 2)
    let mut big = [V::zero(); G];
    for g in 0..G {
        big[g] = V::load(x.add(g * 16)).abs();
    }
    by2!(n, j => {
        let a = V::load(a_abs.add(j * 16));
        let b = b_abs.add(j * cols);
        for (g, bg) in big.iter_mut().enumerate() {
            *bg = bg.max(a.mul_s(b.add(g)));
        }
    });
    let f = at.m.align_frac as i32;
    let mut up = [V::zero(); G];
    let (mut lo, mut hi) = (V::ones().bits(), V::zero().bits());
    for g in 0..G {
        up[g] = big[g].scales(f);
        (lo, hi) = big[g].track(lo, hi);
    }
    if V::any_lt_u(lo, LO_BITS - 1) || V::any_gt(hi, HI_BITS - 1) {
        return redo_block(at, n, x);
    }
    // pass 2: aligned, truncated, summed in i32 lanes
    let (a, b) = (o.at.as_ptr().add(at.k0 * 16), o.b.as_ptr());
    let b = b.add(at.k0 * cols + at.c0);
    // C read again: `black_box` keeps LLVM from holding the first reads in registers through
    // pass 1 (they would be spilled and reloaded)
    let xc = std::hint::black_box(x);
    let mut s = [V::zero().trunc(); G];
    for g in 0..G {
        s[g] = V::load(xc.add(g * 16)).mul(up[g]).trunc();
    }
    // one k per iteration: each scale is used once, so LLVM reads the ones it cannot keep in
    // registers straight from the stack inside the multiply
    for j in 0..n {
        let a = V::load(a.add(j * 16));
        let b = b.add(j * cols);
        for (g, sg) in s.iter_mut().enumerate() {
            *sg = V::add(*sg, a.mul_s(b.add(g)).mul(up[g]).trunc());
        }
    }
    for g in 0..G {
        V::finish(s[g], at.keep, up[g]).store(x.add(g * 16));
    }
}

/// The block through [`block_sum`] (f64, products exact) for every output of its G columns
/// (some output's largest term is outside the f32-safe range; `block_sum` gives the other
/// outputs the bits of the f32 arithmetic). `x` (G columns) holds C on entry, D on exit.
#[cold]
#[inline(never)]
unsafe fn redo_block(at: &At, n: usize, x: *mut f32) {
    let o = at.o;
    let mut prods = [0f64; 32];
    for g in 0..G {
        // SAFETY: `x` points at column `at.c0 + g` < `o.cols` of C, which holds 16 per column
        let v = std::slice::from_raw_parts_mut(x.add(g * 16), 16);
        for (row, out) in v.iter_mut().enumerate() {
            for (j, p) in prods[..n].iter_mut().enumerate() {
                let kk = at.k0 + j;
                *p = o.at[kk * 16 + row] as f64 * o.b[kk * o.cols + at.c0 + g] as f64;
            }
            *out = block_sum(at.m, &prods[..n], *out as f64) as f32;
        }
    }
}

/// One output column (16 rows) in vector registers, and the operations the kernel needs.
/// Every method is `unsafe`: the caller runs on a CPU with the implementation's target
/// features, and pointers are valid for 16 f32.
trait Col: Copy {
    /// Lanes as i32.
    type I: Copy;
    unsafe fn zero() -> Self;
    /// All bits set.
    unsafe fn ones() -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    /// self times the scalar at `p`.
    unsafe fn mul_s(self, p: *const f32) -> Self;
    unsafe fn abs(self) -> Self;
    unsafe fn max(self, o: Self) -> Self;
    unsafe fn mul(self, o: Self) -> Self;
    /// The lanes' bits.
    unsafe fn bits(self) -> Self::I;
    /// Lane-wise signed maximum.
    unsafe fn max_bits(a: Self::I, b: Self::I) -> Self::I;
    /// Whether a lane of `a` is above `t` (signed).
    unsafe fn any_gt(a: Self::I, t: i32) -> bool;
    /// Whether a lane of `a` is below `t` (unsigned).
    unsafe fn any_lt_u(a: Self::I, t: i32) -> bool;
    /// From the largest magnitudes (non-negative): the scales 2^(F - e) for their exponents
    /// e, raised to at least [`E_LO`] (a zero maximum: its terms and sum are zero whatever
    /// the scale; a lane outside the safe range is redone, see `track`).
    unsafe fn scales(self, f: i32) -> Self;
    /// Folds the largest magnitudes into the running unsigned minimum of `bits - 1` (below
    /// `LO_BITS - 1` for a non-zero maximum under the safe range; a zero maximum wraps to the
    /// top) and the signed maximum of the bits (above `HI_BITS - 1` over the range).
    unsafe fn track(self, lo: Self::I, hi: Self::I) -> (Self::I, Self::I);
    /// Truncation toward zero to i32.
    unsafe fn trunc(self) -> Self::I;
    unsafe fn add(a: Self::I, b: Self::I) -> Self::I;
    /// `s` rounded toward zero to f32, masked with `keep`, times the inverse 2^(e - F) of the
    /// scale `up` (exact; its bits are `254 << 23` minus those of `up`, computed here rather
    /// than kept through pass 2).
    unsafe fn finish(s: Self::I, keep: u32, up: Self) -> Self;
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
    unsafe fn ones() -> Self {
        Z(_mm512_castsi512_ps(_mm512_set1_epi32(-1)))
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
    unsafe fn bits(self) -> __m512i {
        _mm512_castps_si512(self.0)
    }

    #[inline(always)]
    unsafe fn max_bits(a: __m512i, b: __m512i) -> __m512i {
        _mm512_max_epi32(a, b)
    }

    #[inline(always)]
    unsafe fn any_gt(a: __m512i, t: i32) -> bool {
        _mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(t)) != 0
    }

    #[inline(always)]
    unsafe fn any_lt_u(a: __m512i, t: i32) -> bool {
        _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(t)) != 0
    }

    #[inline(always)]
    unsafe fn scales(self, f: i32) -> Self {
        let e = _mm512_and_si512(self.bits(), _mm512_set1_epi32(EXP));
        let e = _mm512_max_epi32(e, _mm512_set1_epi32(LO_BITS));
        let up = _mm512_sub_epi32(_mm512_set1_epi32((254 + f) << 23), e);
        Z(_mm512_castsi512_ps(up))
    }

    #[inline(always)]
    unsafe fn track(self, lo: __m512i, hi: __m512i) -> (__m512i, __m512i) {
        let b = self.bits();
        let lo = _mm512_min_epu32(lo, _mm512_add_epi32(b, _mm512_set1_epi32(-1)));
        (lo, _mm512_max_epi32(hi, b))
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
    unsafe fn finish(s: __m512i, keep: u32, up: Self) -> Self {
        let mut f = _mm512_cvt_roundepi32_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(s);
        if keep != u32::MAX {
            f = _mm512_and_ps(f, _mm512_castsi512_ps(_mm512_set1_epi32(keep as i32)));
        }
        let down = _mm512_sub_epi32(_mm512_set1_epi32(254 << 23), up.bits());
        Z(_mm512_mul_ps(f, _mm512_castsi512_ps(down)))
    }
}

/// AVX2: two 8-lane vectors (rows 0..8 and 8..16).
#[derive(Clone, Copy)]
struct Y([__m256; 2]);

/// The unsigned minimum (`lo`) and signed maximum (`hi`) of [`Col::track`] for one 8-lane
/// vector of maxima `big`.
#[inline(always)]
unsafe fn track8(big: __m256, lo: __m256i, hi: __m256i) -> (__m256i, __m256i) {
    let b = _mm256_castps_si256(big);
    let lo = _mm256_min_epu32(lo, _mm256_add_epi32(b, _mm256_set1_epi32(-1)));
    (lo, _mm256_max_epi32(hi, b))
}

impl Col for Y {
    /// Both halves' lanes; the tracking of [`Col::track`] folds the two halves into the first.
    type I = [__m256i; 2];

    #[inline(always)]
    unsafe fn zero() -> Self {
        Y([_mm256_setzero_ps(); 2])
    }

    #[inline(always)]
    unsafe fn ones() -> Self {
        Y([_mm256_castsi256_ps(_mm256_set1_epi32(-1)); 2])
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
    unsafe fn bits(self) -> [__m256i; 2] {
        [
            _mm256_castps_si256(self.0[0]),
            _mm256_castps_si256(self.0[1]),
        ]
    }

    #[inline(always)]
    unsafe fn max_bits(a: [__m256i; 2], b: [__m256i; 2]) -> [__m256i; 2] {
        [_mm256_max_epi32(a[0], b[0]), _mm256_max_epi32(a[1], b[1])]
    }

    #[inline(always)]
    unsafe fn any_gt(a: [__m256i; 2], t: i32) -> bool {
        let t = _mm256_set1_epi32(t);
        let m = _mm256_or_si256(_mm256_cmpgt_epi32(a[0], t), _mm256_cmpgt_epi32(a[1], t));
        _mm256_testz_si256(m, m) == 0
    }

    #[inline(always)]
    unsafe fn any_lt_u(a: [__m256i; 2], t: i32) -> bool {
        // a < t (unsigned) where min(a, t - 1) == a; t >= 1 here
        let t = _mm256_set1_epi32(t - 1);
        let (l0, l1) = (_mm256_min_epu32(a[0], t), _mm256_min_epu32(a[1], t));
        let m = _mm256_or_si256(_mm256_cmpeq_epi32(l0, a[0]), _mm256_cmpeq_epi32(l1, a[1]));
        _mm256_testz_si256(m, m) == 0
    }

    #[inline(always)]
    unsafe fn scales(self, f: i32) -> Self {
        let (exp, lo) = (_mm256_set1_epi32(EXP), _mm256_set1_epi32(LO_BITS));
        let cu = _mm256_set1_epi32((254 + f) << 23);
        let mut up = [_mm256_setzero_ps(); 2];
        for h in 0..2 {
            let e = _mm256_and_si256(_mm256_castps_si256(self.0[h]), exp);
            let e = _mm256_max_epi32(e, lo);
            up[h] = _mm256_castsi256_ps(_mm256_sub_epi32(cu, e));
        }
        Y(up)
    }

    #[inline(always)]
    unsafe fn track(self, lo: [__m256i; 2], hi: [__m256i; 2]) -> ([__m256i; 2], [__m256i; 2]) {
        let (l, h) = track8(self.0[0], lo[0], hi[0]);
        let (l, h) = track8(self.0[1], l, h);
        ([l, l], [h, h])
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
    unsafe fn finish(s: [__m256i; 2], keep: u32, up: Self) -> Self {
        let c254 = _mm256_set1_epi32(254 << 23);
        let mut out = [_mm256_setzero_ps(); 2];
        for h in 0..2 {
            // to nearest, then one ulp back toward zero where that rounded away from zero
            // (|s| < 2^31, so the conversion back is exact)
            let f = _mm256_cvtepi32_ps(s[h]);
            let back = _mm256_abs_epi32(_mm256_cvttps_epi32(f));
            let away = _mm256_cmpgt_epi32(back, _mm256_abs_epi32(s[h]));
            let mut f = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(f), away));
            if keep != u32::MAX {
                f = _mm256_and_ps(f, _mm256_castsi256_ps(_mm256_set1_epi32(keep as i32)));
            }
            let down = _mm256_sub_epi32(c254, _mm256_castps_si256(up.0[h]));
            out[h] = _mm256_mul_ps(f, _mm256_castsi256_ps(down));
        }
        Y(out)
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
    /// blocks outside the f32-safe range), a zero row and column, moderate C or C at the ends
    /// of the FP32 range and subnormal (a zero row and column give outputs whose terms are all
    /// zero, and with a subnormal C outputs whose largest term is under the safe range); and
    /// declines a
    /// tile with an infinite or NaN C in any column, leaving it untouched.
    #[test]
    fn cols16_matches_portable() {
        let mut rng = StdRng::seed_from_u64(0xc016);
        let forms = [Ty::F16, Ty::Bf16, Ty::E4m3, Ty::E5m2];
        for sm in [80, 89, 90] {
            for (fi, &t) in forms.iter().enumerate() {
                let Some(m) = model_for(sm, t) else { continue };
                for trial in 0..16 {
                    let k = [16, 32, 8, 64][(trial + fi) % 4];
                    let cols = [8, 16, 4, 24][(trial / 4) % 4];
                    // wide inputs or extreme C send blocks to the f64 path; narrow inputs
                    // with moderate C keep every block on the f32 path
                    let (wide, extreme) = (trial % 2 == 0, (trial / 2) % 2 == 1);
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
                        .map(|i| match (i % 7, extreme) {
                            (0, _) => 0.0,
                            (1, true) => f32::MAX * if i % 2 == 0 { 1.0 } else { -1.0 },
                            (2, true) => f32::from_bits(rng.gen_range(1..0x0080_0000)),
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
                        // a non-finite C in the first, a middle or the last column
                        let last = 16 * cols - 1;
                        for (at, v) in [
                            (3, f32::INFINITY),
                            (last / 2, -f32::INFINITY),
                            (last, f32::NAN),
                        ] {
                            let mut bad = c.clone();
                            bad[at] = v;
                            let before: Vec<u32> = bad.iter().map(|x| x.to_bits()).collect();
                            assert!(!f(&m, &o, &mut bad), "{name}: took C = {v} at {at}");
                            let after: Vec<u32> = bad.iter().map(|x| x.to_bits()).collect();
                            assert_eq!(after, before, "{name}: declined but wrote");
                        }
                    }
                }
            }
        }
    }

    /// Timing harness, not a check (no assertion): ns per call of every kernel on the shapes
    /// the emulator runs: `mma.sync` m16n8k16 bf16 (sm_80) and m16n8k32 e4m3 (sm_89), and
    /// the wgmma widths 64..256 with k 32 e4m3 and k 16 bf16 (sm_90). Run (release, pinned):
    /// `taskset -c 1 cargo test --release -p emu --lib cols16_timing -- --ignored --nocapture`.
    /// `COLS16_CALLS` sets the 16 x 8 output tiles per shape (default 400000; the best of 16
    /// rounds of a sixteenth each is printed), `COLS16_ONLY`
    /// one kernel by name and `COLS16_SHAPE` the shapes whose line contains it (for callgrind:
    /// `tile_y` inclusive / calls is the per-call figure).
    #[test]
    #[ignore = "timing harness without assertions: run by hand in release (see above)"]
    fn cols16_timing() {
        let env = |k: &str| std::env::var(k).ok();
        let tiles: usize = env("COLS16_CALLS")
            .and_then(|v| v.parse().ok())
            .unwrap_or(400_000);
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
                let calls = (tiles * 8 / cols / 16).max(1);
                let mut best = f64::INFINITY;
                for _ in 0..16 {
                    let t0 = std::time::Instant::now();
                    for _ in 0..calls {
                        assert!(f(&m, std::hint::black_box(&o), &mut c));
                    }
                    best = best.min(t0.elapsed().as_nanos() as f64 / calls as f64);
                }
                println!("{line}: {best:.1} ns/call (best of 16 x {calls} calls)");
            }
        }
    }
}
