//! Tensor-core inner-product numerics: how `mma.sync` and `wgmma` add their products on real
//! GPUs, per architecture, and which numerics a launch uses ([`Numerics`]).
//!
//! # The model
//! NVIDIA's tensor cores do not add products one by one in IEEE arithmetic. Published probes
//! agree on one shape (sources below); this module implements it with the parameters of
//! [`TcModel`]:
//!
//! 1. every product `a_i * b_i` of two inputs is exact;
//! 2. the K terms of one output are processed in blocks of [`TcModel::block`] products; one block
//!    plus the accumulator `c` is a single multi-term addition;
//! 3. every term of that addition (including `c`) is aligned to the largest exponent among the
//!    non-zero terms and its significand is truncated toward zero to
//!    [`TcModel::align_frac`] fraction bits below that exponent's leading bit;
//! 4. the aligned terms are added exactly (enough carry bits: no overflow of the adder);
//! 5. the sum is normalised once and rounded toward zero to an FP32 value with
//!    [`TcModel::out_frac`] fraction bits (23 = a full FP32; fewer for Hopper/Ada FP8);
//! 6. that value is the `c` of the next block; after the last block it is D (an f16 D is then
//!    rounded to nearest even, as the binary16 mode of the tensor cores does).
//!
//! Sources for the facts and parameters:
//! - [FHMP21] M. Fasi, N. J. Higham, M. Mikaitis, S. Pranesh, "Numerical behavior of NVIDIA
//!   tensor cores", PeerJ Computer Science 7:e330 (2021), and its test suite
//!   (github.com/north-numerical-computing/tensor-cores-numerical-behavior): exact products,
//!   alignment to the largest magnitude, truncation (round-down for positive and round-up for
//!   negative sums), no guard bits, carry-out bits, one normalisation at the end; round to
//!   nearest for a binary16 D; A100 adds 8 products at once for binary16/bfloat16 and 4 for TF32.
//! - [KM25] F. A. Khattak, M. Mikaitis, "Accurate Models of NVIDIA Tensor Cores",
//!   arXiv 2512.07004 (2025): the same structure is bit-accurate on V100, A100, H100 and B200 for
//!   8-, 16- and 19-bit inputs (accumulator width, rounding, normalisation points, carry bits).
//! - [PROBE] public probes (github.com/huweim/emulation_sys, summarised in
//!   /work/shared/reference.md): FP16 inputs with FP32 accumulation keep 24 aligned significand
//!   bits (23 fraction bits) on A100 (sm_80) and Ada (sm_89) and 25 (24 fraction bits) on H100
//!   (sm_90), round-toward-zero; H100 FP8 `wgmma` keeps 13 fraction bits, truncated; the FP8
//!   accumulator of Ada (RTX 4000 series) and Hopper is e8m13 (PyTorch blog on FP8 GEMM
//!   verification, summarised by scorpiitech.com "Truncation in Tensor Cores").
//! - [DSV3] DeepSeek-V3 technical report: Hopper's FP8 accumulation keeps about 14 bits
//!   (1 + 13), giving ~2% maximum relative error at K = 4096 without promotion.
//!
//! Parameters not pinned down by those sources are marked "assumed" in [`model_for`].
//!
//! Specials: a block with a NaN or infinite term is added in IEEE f64 (NaN and infinity
//! propagate as in the exact mode); a finite result too large for FP32 becomes the largest
//! finite FP32 value (round toward zero); an exactly-zero sum is +0.
//!
//! # Implementations
//! [`dot`] is the emulator's fast path for one output: products in f64 (exact for every
//! supported input type), alignment by scaling with a power of two and `trunc`, the aligned
//! integers summed in f64 (exact: at most 33 terms below 2^25). [`reference_dot`] is the slow,
//! obviously-correct one on raw bits and `i128` integers; the tests cross-check the two on
//! random inputs for every form.
//!
//! [`tile`] (the mma and wgmma tiles) tries, in order: the f32 kernel for tiles of up to 16 rows
//! and a multiple of 8 columns (`tc_simd::rows16`: products in f32, aligned terms summed in i32
//! lanes, AVX-512 or AVX2), which declines tiles whose A and B are not all finite and exact in
//! f32 with at most 11 significant bits or whose C is not finite and exact in f32; the f64 SIMD
//! kernel (`tc_simd`, AVX2) for finite tiles; the portable
//! column groups ([`tile_portable`]). All give the bits of [`block_sum`] (tested against each
//! other and against [`reference_dot`]). The `mma.sync` fast path bypasses [`tile`]: it decodes
//! its fragments into f32 and calls the column-vector kernel `tc_simd::cols16` (same arithmetic
//! per output as `rows16`, tested against [`tile_portable`]), falling back to [`tile`] for the
//! tiles that kernel declines.

use ptx::Ty;

/// Which tensor-core numerics a launch uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Numerics {
    /// Products summed in f64 in k order, plus C, rounded once to nearest (the emulator's
    /// original behaviour: one admissible result under the PTX specification).
    Exact,
    /// The model of the kernel's target architecture ([`model_for`]).
    #[default]
    Hardware,
}

impl Numerics {
    /// Parses `exact` or `hw` (also `hardware`).
    pub fn parse(s: &str) -> Result<Numerics, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "exact" => Ok(Numerics::Exact),
            "hw" | "hardware" => Ok(Numerics::Hardware),
            o => Err(format!(
                "unknown tensor-core numerics `{o}` (use exact or hw)"
            )),
        }
    }

    /// `PTXFORGE_TC_NUMERICS` (`exact` | `hw`) when set and valid, else the default (hw).
    pub fn from_env() -> Numerics {
        std::env::var("PTXFORGE_TC_NUMERICS")
            .ok()
            .and_then(|v| Numerics::parse(&v).ok())
            .unwrap_or_default()
    }

    /// The model for a float tensor-core instruction with input type `aty` on target `sm`
    /// (`None`: exact numerics, or an integer / f64 form).
    pub fn model(self, sm: u32, aty: Ty) -> Option<TcModel> {
        match self {
            Numerics::Exact => None,
            Numerics::Hardware => model_for(sm, aty),
        }
    }
}

/// Parameters of one architecture's inner product for one input format (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcModel {
    /// Products added at once (together with the accumulator).
    pub block: usize,
    /// Fraction bits kept below the leading bit of the largest term when aligning.
    pub align_frac: u32,
    /// Fraction bits of the normalised block result (23: a full FP32).
    pub out_frac: u32,
}

impl TcModel {
    /// The block size the implementations use: `block` within 1..=64 (a hand-built model with
    /// 0 or more than 64 would otherwise not terminate or overflow the scratch space).
    pub fn block_len(&self) -> usize {
        self.block.clamp(1, 64)
    }
}

/// The model of target `sm` for input type `aty`; `None` for integer and f64 forms (exact).
///
/// | target        | f16 / bf16          | tf32               | e4m3 / e5m2            |
/// |---------------|---------------------|--------------------|------------------------|
/// | sm_80, sm_86  | 8 terms, 23 bits    | 4 terms, 23 bits   | (sm_89 model)          |
/// | sm_89         | 8 terms, 23 bits    | 4 terms, 23 bits   | 16 terms, 13 / 13 bits |
/// | sm_90         | 16 terms, 24 bits   | 8 terms, 24 bits   | 32 terms, 13 / 13 bits |
///
/// Targets before sm_80 use the sm_80 model; targets after sm_90 the sm_90 one.
pub fn model_for(sm: u32, aty: Ty) -> Option<TcModel> {
    let hopper = sm >= 90;
    let m = |block, align_frac, out_frac| TcModel {
        block,
        align_frac,
        out_frac,
    };
    Some(match aty {
        // [FHMP21]: A100 adds 8 binary16/bfloat16 products at once; [PROBE]: 24 aligned
        // significand bits on A100/Ada, 25 on H100, RZ. H100 block of 16 = one m64nNk16 k-slice
        // (assumed; [KM25] models H100 with a wider adder than A100). bf16 shares the f16 path
        // (assumed, as in [FHMP21] for A100).
        Ty::F16 | Ty::Bf16 if hopper => m(16, 24, 23),
        Ty::F16 | Ty::Bf16 => m(8, 23, 23),
        // [FHMP21]: A100 adds 4 TF32 products at once. H100: 8 (one k8 slice) and the 25-bit
        // alignment of its 16-bit path (assumed).
        Ty::Tf32 if hopper => m(8, 24, 23),
        Ty::Tf32 => m(4, 23, 23),
        // [PROBE] / [DSV3]: 13 fraction bits, truncated, for the alignment and the accumulator
        // (e8m13) on Ada and Hopper. Block: a whole k32 wgmma slice on Hopper, half of the
        // m16n8k32 instruction on Ada (both assumed). FP8 mma needs sm_89, so earlier targets
        // (which ptxas rejects) get the Ada model.
        Ty::E4m3 | Ty::E5m2 if hopper => m(32, 13, 13),
        Ty::E4m3 | Ty::E5m2 => m(16, 13, 13),
        _ => return None,
    })
}

/// 2^e as an f64 (`e` within the normal exponent range).
fn pow2(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// Exponent of the leading bit of a finite, non-zero, normal f64.
fn exponent(x: f64) -> i32 {
    ((x.to_bits() >> 52) & 0x7ff) as i32 - 1023
}

/// Rounds toward zero to an FP32 with `frac` fraction bits (finite results stay finite).
#[inline(always)]
pub fn round_rz(x: f64, frac: u32) -> f32 {
    if x == 0.0 {
        return 0.0;
    }
    let mut f = x as f32;
    if (f as f64).abs() > x.abs() {
        // `as` rounded away from zero (or overflowed): step one FP32 ulp toward zero
        f = f32::from_bits(f.to_bits() - 1);
    }
    let drop = 23 - frac.min(23);
    f32::from_bits(f.to_bits() & !((1u32 << drop) - 1))
}

/// One block: `terms` (exact products) plus `c`, as the model adds them. Returns the block
/// result (an FP32 value with `out_frac` fraction bits).
pub(crate) fn block_sum(m: &TcModel, terms: &[f64], c: f64) -> f64 {
    let mut emax = i32::MIN;
    let mut special = !c.is_finite();
    for &t in terms.iter().chain(std::iter::once(&c)) {
        if t != 0.0 {
            emax = emax.max(exponent(t));
        }
        special |= !t.is_finite();
    }
    if special {
        return terms.iter().sum::<f64>() + c;
    }
    if emax == i32::MIN {
        return 0.0;
    }
    let lsb = emax - m.align_frac as i32;
    let (up, down) = (pow2(-lsb), pow2(lsb));
    let mut s = (c * up).trunc();
    for &t in terms {
        s += (t * up).trunc();
    }
    round_rz(s * down, m.out_frac) as f64
}

/// D = sum_k a[k] * b[k] + c under model `m`: products of decoded inputs (exact in f64), blocks
/// of `m.block` in k order. Returns the FP32 result (before any f16 rounding of D).
pub fn dot(m: &TcModel, a: &[f64], b: &[f64], c: f32) -> f32 {
    let mut acc = c as f64;
    let mut prods = [0f64; 64];
    for (ac, bc) in a.chunks(m.block_len()).zip(b.chunks(m.block_len())) {
        let n = ac.len();
        for i in 0..n {
            prods[i] = ac[i] * bc[i];
        }
        acc = block_sum(m, &prods[..n], acc);
    }
    acc as f32
}

/// Accumulates a `rows x cols` tile of dot products under model `m`: `acc[r * cols + c]` is the
/// C of output (r, c) on entry and its D on exit. `a` is `rows x k` (row-major) and `bt` is
/// `k x cols` (row kk holds B[kk][..]). The emulator's mma and wgmma paths call this. Tiles of
/// up to 16 rows and a multiple of 8 columns with f32-exact inputs go through the f32 kernel
/// (see the module docs); otherwise groups
/// of [`GROUP`] columns go through [`group`] (same results as [`dot`], laid out so the column
/// loops vectorise), the remainder through [`dot`]'s block sum.
pub fn tile(m: &TcModel, a: &[f64], bt: &[f64], k: usize, cols: usize, acc: &mut [f64]) {
    if let Some(t16) = crate::tc_simd::fast_tile16() {
        if t16(m, a, bt, k, cols, acc) {
            return;
        }
    }
    let fast = crate::tc_simd::fast_tile();
    match fast {
        Some(t)
            if all_finite(a) && all_finite(&bt[..bt.len().min(k * cols)]) && all_finite(acc) =>
        {
            t(m, a, bt, k, cols, acc)
        }
        _ => tile_with(group_dispatch(), m, a, bt, k, cols, acc),
    }
}

/// Whether every value is finite (the SIMD tile kernel's precondition); no early exit, so
/// the loop vectorises.
fn all_finite(v: &[f64]) -> bool {
    v.iter().fold(true, |ok, x| ok & x.is_finite())
}

/// [`tile`] with the column groups of the portable kernel (no hand-written SIMD), dispatched
/// to the AVX-512F / AVX2 builds of the same code: the oracle the SIMD kernel is checked with.
pub fn tile_portable(m: &TcModel, a: &[f64], bt: &[f64], k: usize, cols: usize, acc: &mut [f64]) {
    tile_with(group_dispatch(), m, a, bt, k, cols, acc)
}

/// [`tile`] with the column groups compiled for the baseline target only (no AVX): the
/// fallback the tests compare the dispatched version with.
pub fn tile_baseline(m: &TcModel, a: &[f64], bt: &[f64], k: usize, cols: usize, acc: &mut [f64]) {
    tile_with(group, m, a, bt, k, cols, acc)
}

/// The signature of [`group`].
type GroupFn = fn(&TcModel, &[f64], &[f64], usize, &mut [f64; GROUP]);

/// [`group`] compiled for AVX-512F or AVX2 when the CPU has them (checked at run time), else
/// the baseline build.
fn group_dispatch() -> GroupFn {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        fn avx2_impl(m: &TcModel, ar: &[f64], bt: &[f64], stride: usize, x: &mut [f64; GROUP]) {
            group(m, ar, bt, stride, x)
        }
        fn avx2(m: &TcModel, ar: &[f64], bt: &[f64], stride: usize, x: &mut [f64; GROUP]) {
            // SAFETY: `avx2` is only selected below when the CPU reports AVX2 support.
            unsafe { avx2_impl(m, ar, bt, stride, x) }
        }
        #[target_feature(enable = "avx512f")]
        fn avx512_impl(m: &TcModel, ar: &[f64], bt: &[f64], stride: usize, x: &mut [f64; GROUP]) {
            group(m, ar, bt, stride, x)
        }
        fn avx512(m: &TcModel, ar: &[f64], bt: &[f64], stride: usize, x: &mut [f64; GROUP]) {
            // SAFETY: `avx512` is only selected below when the CPU reports AVX-512F support.
            unsafe { avx512_impl(m, ar, bt, stride, x) }
        }
        if std::is_x86_feature_detected!("avx512f") {
            return avx512;
        }
        if std::is_x86_feature_detected!("avx2") {
            return avx2;
        }
    }
    group
}

fn tile_with(
    group: GroupFn,
    m: &TcModel,
    a: &[f64],
    bt: &[f64],
    k: usize,
    cols: usize,
    acc: &mut [f64],
) {
    if cols == 0 {
        return;
    }
    let rows = acc.len() / cols;
    for r in 0..rows {
        let ar = &a[r * k..(r + 1) * k];
        let row = &mut acc[r * cols..(r + 1) * cols];
        let mut c0 = 0;
        // the column-parallel path sums up to 33 aligned terms (< 2^(F+1)) exactly in f64
        let grouped = m.block_len() <= 32 && m.align_frac <= 24;
        while grouped && c0 + GROUP <= cols {
            let x: &mut [f64; GROUP] = (&mut row[c0..c0 + GROUP])
                .try_into()
                .unwrap_or_else(|_| unreachable!("slice of GROUP elements"));
            group(m, ar, &bt[c0..], cols, x);
            c0 += GROUP;
        }
        scalar_cols(m, ar, bt, cols, c0, row);
    }
}

/// Columns `c0..` of one row of [`tile`] (`row` = the whole row), one output at a time.
pub(crate) fn scalar_cols(
    m: &TcModel,
    ar: &[f64],
    bt: &[f64],
    cols: usize,
    c0: usize,
    row: &mut [f64],
) {
    let k = ar.len();
    let mut prods = [0f64; 64];
    for (c, x) in row.iter_mut().enumerate().skip(c0) {
        let mut k0 = 0;
        while k0 < k {
            let n = m.block_len().min(k - k0);
            for i in 0..n {
                prods[i] = ar[k0 + i] * bt[(k0 + i) * cols + c];
            }
            *x = block_sum(m, &prods[..n], *x);
            k0 += n;
        }
    }
}

/// `y` truncated toward zero, for |y| < 2^51, with plain f64 arithmetic (vectorises, unlike
/// `trunc` and the saturating float-to-integer casts on baseline x86-64): adding and
/// subtracting 1.5 * 2^52 rounds to the nearest integer; one step back toward zero where that
/// rounded away from it.
#[inline(always)]
fn trunc_small(y: f64) -> f64 {
    const MAGIC: f64 = 6755399441055744.0; // 1.5 * 2^52
    let r = (y + MAGIC) - MAGIC;
    if r.abs() > y.abs() {
        r - 1f64.copysign(y)
    } else {
        r
    }
}

/// The branch-free rounding of [`group`] (toward zero to an FP32 with `frac` fraction bits) for
/// finite, exact sums that are never -0.0.
#[inline(always)]
pub(crate) fn round_group(x: &mut [f64], frac: u32) {
    let keep = !((1u32 << (23 - frac.min(23))) - 1);
    for v in x.iter_mut() {
        let f = *v as f32;
        let away = ((f as f64).abs() > v.abs()) as u32;
        *v = f32::from_bits((f.to_bits() - away) & keep) as f64;
    }
}

/// Columns [`group`] handles at once.
pub const GROUP: usize = 8;

/// Biased f64 exponent field (0 for zero; every value here is zero, normal or special in f64).
#[inline(always)]
fn bexp(x: f64) -> u64 {
    (x.to_bits() >> 52) & 0x7ff
}

/// One row of [`tile`] for `GROUP` adjacent columns: `bt[kk * stride + c]` is B[kk][c] and `x`
/// holds the accumulators. Same arithmetic as [`block_sum`] (exact products, alignment by a
/// power-of-two scale, truncation toward zero, exact sum, one rounding toward zero),
/// column-parallel.
#[inline(always)]
fn group(m: &TcModel, ar: &[f64], bt: &[f64], stride: usize, x: &mut [f64; GROUP]) {
    let k = ar.len();
    let f = m.align_frac as u64;
    let brow = |kk: usize| -> &[f64] { &bt[kk * stride..kk * stride + GROUP] };
    // rows k0..k0+n of B for this group, as fixed-size arrays (no per-element bounds checks)
    let rows = |k0: usize, n: usize| {
        ar[k0..k0 + n].iter().zip(
            bt[k0 * stride..]
                .chunks(stride)
                .map(|r| <&[f64; GROUP]>::try_from(&r[..GROUP])),
        )
    };
    let mut k0 = 0;
    while k0 < k {
        let n = m.block_len().min(k - k0);
        // pass 1: the largest magnitude of each column (its exponent is the largest exponent;
        // `>` keeps NaN out, the plain sum `chk` turns non-finite when any term is NaN or
        // infinite). Products are recomputed in pass 2: cheaper than storing them.
        let mut big = [0f64; GROUP];
        let mut chk = [0f64; GROUP];
        for c in 0..GROUP {
            big[c] = x[c].abs();
            chk[c] = x[c];
        }
        for (&av, br) in rows(k0, n) {
            let Ok(br) = br else { break };
            for c in 0..GROUP {
                let p = av * br[c];
                let a = p.abs();
                big[c] = if a > big[c] { a } else { big[c] };
                chk[c] += p;
            }
        }
        let mut emax = [0u64; GROUP];
        for c in 0..GROUP {
            emax[c] = if chk[c].is_finite() {
                bexp(big[c])
            } else {
                0x7ff
            };
        }
        // 2^(F - e) and 2^(e - F) for the largest exponent e of each column; columns that are
        // all zero or hold a special take the scalar path
        let mut up = [0f64; GROUP];
        let mut down = [0f64; GROUP];
        let mut odd = false;
        for c in 0..GROUP {
            odd |= emax[c] <= f || emax[c] == 0x7ff;
            up[c] = f64::from_bits(((2046 + f).saturating_sub(emax[c]) & 0x7ff) << 52);
            down[c] = f64::from_bits((emax[c].saturating_sub(f) & 0x7ff) << 52);
        }
        if odd {
            let mut col = [0f64; 64];
            for c in 0..GROUP {
                let n = n.min(64);
                for (jj, p) in col[..n].iter_mut().enumerate() {
                    *p = ar[k0 + jj] * brow(k0 + jj)[c];
                }
                x[c] = block_sum(m, &col[..n], x[c]);
            }
        } else {
            // pass 2: aligned, truncated (float-to-integer conversion) and summed exactly
            // (aligned terms are below 2^(F+1) <= 2^25, so the f64 sum of 33 of them is exact)
            let mut s = [0f64; GROUP];
            for c in 0..GROUP {
                s[c] = trunc_small(x[c] * up[c]);
            }
            for (&av, br) in rows(k0, n) {
                let Ok(br) = br else { break };
                for c in 0..GROUP {
                    s[c] += trunc_small(av * br[c] * up[c]);
                }
            }
            // round toward zero, branch-free (`round_rz` for finite, non-NaN values: the sums
            // here are never -0.0, and a too-large value steps back from infinity to MAX)
            for c in 0..GROUP {
                x[c] = s[c] * down[c];
            }
            round_group(x, m.out_frac);
        }
        k0 += n;
    }
}

// ---------------------------------------------------------------------------------------------
// The slow reference: raw bits, integers only.

/// A finite input as `(-1)^neg * sig * 2^exp` (`sig` an integer), or `None` for NaN/infinity.
fn decode_exact(t: Ty, bits: u64) -> Option<(bool, i128, i32)> {
    // (exponent bits, fraction bits, bias, has infinities/NaN at the top exponent)
    let (ebits, fbits, bias, ieee) = match t {
        Ty::F16 => (5, 10, 15, true),
        Ty::Bf16 => (8, 7, 127, true),
        Ty::Tf32 => (8, 23, 127, true),
        Ty::F32 => (8, 23, 127, true),
        Ty::E5m2 => (5, 2, 15, true),
        Ty::E4m3 => (4, 3, 7, false),
        _ => return None,
    };
    let width = 1 + ebits + fbits;
    let mut bits = bits & ((1u64 << width) - 1);
    if t == Ty::Tf32 {
        bits &= !0x1fff; // tf32 reads only the upper 19 bits of the register
    }
    let neg = (bits >> (width - 1)) & 1 == 1;
    let e = ((bits >> fbits) & ((1 << ebits) - 1)) as i32;
    let f = (bits & ((1 << fbits) - 1)) as i128;
    let emax = (1 << ebits) - 1;
    if ieee && e == emax {
        return None;
    }
    if !ieee && e == emax && f == (1 << fbits) - 1 {
        return None; // e4m3 NaN (S.1111.111); e4m3 has no infinities
    }
    let (sig, exp) = if e == 0 {
        (f, 1 - bias - fbits)
    } else {
        (f | (1 << fbits), e - bias - fbits)
    };
    Some((neg, sig, exp))
}

/// Bit length of a non-zero magnitude.
fn bitlen(x: i128) -> i32 {
    128 - x.unsigned_abs().leading_zeros() as i32
}

/// Integer rounding toward zero of `sum * 2^lsb` to FP32 bits with `frac` fraction bits.
fn reference_round(sum: i128, lsb: i32, frac: u32) -> u32 {
    if sum == 0 {
        return 0;
    }
    let sign = if sum < 0 { 0x8000_0000u32 } else { 0 };
    let mag = sum.unsigned_abs();
    let lead = 128 - mag.leading_zeros() as i32 - 1 + lsb; // exponent of the leading bit
    let shr = |v: u128, s: i32| if s >= 0 { v >> s.min(127) } else { v << (-s) };
    let bits = if lead > 127 {
        0x7f7f_ffff // round toward zero: the largest finite value
    } else if lead >= -126 {
        // normal: the leading bit and 23 fraction bits
        let q = shr(mag, lead - 23 - lsb) as u32;
        (((lead + 127) as u32) << 23) | (q & 0x7f_ffff)
    } else {
        // subnormal: multiples of 2^-149
        shr(mag, -149 - lsb) as u32
    };
    let drop = 23 - frac.min(23);
    sign | (bits & !((1u32 << drop) - 1))
}

/// The slow, obviously-correct model: inputs as raw bits of types `aty` / `bty`, `c` as FP32
/// bits; products, alignment, sums and rounding on integers. Returns the FP32 bits of D, or
/// `None` when an input is NaN or infinite (those blocks follow IEEE f64, tested separately).
pub fn reference_dot(m: &TcModel, aty: Ty, bty: Ty, a: &[u64], b: &[u64], c: u32) -> Option<u32> {
    let mut acc = c;
    for (ac, bc) in a.chunks(m.block_len()).zip(b.chunks(m.block_len())) {
        let mut terms = vec![decode_exact(Ty::F32, acc as u64)?];
        for (&x, &y) in ac.iter().zip(bc) {
            let (na, sa, ea) = decode_exact(aty, x)?;
            let (nb, sb, eb) = decode_exact(bty, y)?;
            terms.push((na != nb, sa * sb, ea + eb));
        }
        let emax = terms
            .iter()
            .filter(|t| t.1 != 0)
            .map(|&(_, s, e)| e + bitlen(s) - 1)
            .max();
        let Some(emax) = emax else {
            acc = 0;
            continue;
        };
        let lsb = emax - m.align_frac as i32;
        let mut sum: i128 = 0;
        for (neg, sig, e) in terms {
            let sh = e - lsb;
            let v = if sh >= 0 {
                sig << sh
            } else if -sh >= 127 {
                0
            } else {
                sig >> (-sh)
            };
            sum += if neg { -v } else { v };
        }
        acc = reference_round(sum, lsb, m.out_frac);
    }
    Some(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_env_names() {
        assert_eq!(Numerics::parse("exact"), Ok(Numerics::Exact));
        assert_eq!(Numerics::parse("HW"), Ok(Numerics::Hardware));
        assert!(Numerics::parse("fast").is_err());
        assert_eq!(Numerics::Exact.model(90, Ty::Bf16), None);
        assert_eq!(Numerics::Hardware.model(90, Ty::S8), None);
    }

    /// Hand-built models with a block of 0 or more than 64 terminate (blocks clamp to 1..=64).
    #[test]
    fn degenerate_blocks_are_clamped() {
        let a = [1.5f64; 70];
        for block in [0, 65, 1000] {
            let m = TcModel {
                block,
                align_frac: 23,
                out_frac: 23,
            };
            assert_eq!(dot(&m, &a, &a, 0.0), 70.0 * 2.25, "block {block}");
            let mut acc = [0f64; 8];
            tile(&m, &a[..70], &[1.5f64; 70 * 8], 70, 8, &mut acc);
            assert_eq!(acc, [70.0 * 2.25; 8], "block {block}");
        }
    }

    #[test]
    fn round_rz_truncates_toward_zero() {
        let x = 1.0 + 2f64.powi(-23) * 1.75;
        assert_eq!(round_rz(x, 23), 1.0 + 2f32.powi(-23));
        assert_eq!(round_rz(-x, 23), -(1.0 + 2f32.powi(-23)));
        assert_eq!(round_rz(1e300, 23), f32::MAX);
        assert_eq!(round_rz(1.0 + 2f64.powi(-14), 13), 1.0);
        assert_eq!(round_rz(1.0 + 2f64.powi(-13), 13), 1.0 + 2f32.powi(-13));
        assert_eq!(round_rz(2f64.powi(-149) * 1.9, 23), 2f32.powi(-149));
    }
}
