//! Moves of `mma.sync` m16n8 fragments between a warp's registers and the f32 tile layouts of
//! the column kernel (`tc_simd::cols16`), as 8 x 4 transposes in AVX2 registers.
//!
//! Every m16n8 fragment register has the same shape: lane `4g + q` (`g` 0..8, `q` 0..4) holds
//! element `(g, q)` of an 8 x 4 matrix, and the tile layouts want the 8 `g` values of one `q`
//! next to each other (C column-major: register `i`, lane `4g + q` is row `g + 8 (i / 2)` of
//! column `2q + i % 2`; A transposed and B `k`-major put `g` on the fastest axis too). So each
//! register is read as eight 4-lane rows, packed to 32 bits and transposed with in-lane
//! unpacks (no gathers), and D goes back the other way, zero-extended to the 64-bit lanes.
//!
//! This module owns those transposes, the SIMD element decoders of the A and B fragments
//! (bf16 and fp8 by shifts, f16 by the exact scale of [`crate::mma::f16_to_f32`]), the
//! fragment cache's compare ([`find`]) and `ldmatrix` (the rows' address checks at once, one
//! 16-byte load per row, the `.trans` 8 x 8 transpose of 16-bit elements in registers). The
//! caller proves AVX2 once per instruction ([`Simd::detect`]); without it every entry point
//! runs the scalar code, which the tests use as the oracle (bit for bit).

use crate::Lanes;
use ptx::Ty;

/// The element format of an A or B fragment the decoders handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Elem {
    Bf16,
    F16,
    E4m3,
    E5m2,
}

impl Elem {
    /// The format of `t`, or `None` for a type the fast path does not decode.
    pub(crate) fn of(t: Ty) -> Option<Elem> {
        match t {
            Ty::Bf16 => Some(Elem::Bf16),
            Ty::F16 => Some(Elem::F16),
            Ty::E4m3 => Some(Elem::E4m3),
            Ty::E5m2 => Some(Elem::E5m2),
            _ => None,
        }
    }

    /// Elements per 32-bit register.
    fn per_reg(self) -> usize {
        match self {
            Elem::Bf16 | Elem::F16 => 2,
            _ => 4,
        }
    }

    /// The value of one code (the low 8 or 16 bits of `x`) as an f32: exact for finite codes,
    /// non-finite for the others (their bits are never used: a fragment with one is declined).
    pub(crate) fn scalar(self, x: u32) -> f32 {
        match self {
            Elem::Bf16 => f32::from_bits((x & 0xffff) << 16),
            Elem::F16 => crate::mma::f16_to_f32(x & 0xffff),
            Elem::E4m3 => crate::mma::fp8_table32()[0][(x & 0xff) as usize],
            Elem::E5m2 => crate::mma::fp8_table32()[1][(x & 0xff) as usize],
        }
    }
}

/// Proof that this CPU runs the SIMD paths (AVX2), taken once per instruction by the caller
/// and passed to every entry point; `None` runs the scalar code.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Simd(());

impl Simd {
    /// `Some` where the CPU has AVX2.
    #[inline]
    pub(crate) fn detect() -> Option<Simd> {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            return Some(Simd(()));
        }
        None
    }
}

/// The low 32 bits of each lane of each register of `src`.
#[inline]
pub(crate) fn lo32<const N: usize>(simd: Option<Simd>, src: [&Lanes; N], dst: &mut [[u32; 32]; N]) {
    #[cfg(target_arch = "x86_64")]
    if simd.is_some() {
        // SAFETY: AVX2 is present (`Simd` proves it).
        unsafe { x86::lo32(src, dst) };
        return;
    }
    lo32_scalar(src, dst)
}

fn lo32_scalar<const N: usize>(src: [&Lanes; N], dst: &mut [[u32; 32]; N]) {
    for (d, r) in dst.iter_mut().zip(src) {
        *d = r.map(|v| v as u32);
    }
}

/// The first of the entries in `valid` (a bit mask) equal to `raw`: the first 8 words of every
/// valid entry are compared at once (unequal fragments nearly always differ there), then the
/// rest of the candidates.
#[inline]
pub(crate) fn find<const R: usize, const E: usize>(
    simd: Option<Simd>,
    entries: &[[[u32; 32]; R]; E],
    valid: u32,
    raw: &[[u32; 32]; R],
) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if simd.is_some() && R > 0 {
        // SAFETY: AVX2 is present (`Simd` proves it); every entry holds R > 0 registers.
        return unsafe { x86::find(entries, valid, raw) };
    }
    (0..E).find(|&e| valid >> e & 1 != 0 && entries[e] == *raw)
}

/// The C fragment (registers `c[0..4]`, f32 in the low 32 bits) as the column-major 16 x 8
/// tile: `tile[col * 16 + row]` from register `(col & 1) + 2 (row / 8)`, lane
/// `4 (row % 8) + col / 2`.
#[inline]
pub(crate) fn c_tile(simd: Option<Simd>, c: [&Lanes; 4]) -> [f32; 128] {
    #[cfg(target_arch = "x86_64")]
    if simd.is_some() {
        // SAFETY: AVX2 is present (`Simd` proves it).
        return unsafe { x86::c_tile(c) };
    }
    c_tile_scalar(c)
}

fn c_tile_scalar(c: [&Lanes; 4]) -> [f32; 128] {
    let mut t = [0f32; 128];
    for (col, cc) in t.chunks_exact_mut(16).enumerate() {
        for (row, x) in cc.iter_mut().enumerate() {
            let reg = c[(col & 1) + 2 * (row >> 3)];
            *x = f32::from_bits(reg[4 * (row & 7) + (col >> 1)] as u32);
        }
    }
    t
}

/// The D fragment: registers `regs[slots[i]]`, `i` in 0..4, of the lanes in `m` from the
/// column-major tile (each as [`d_reg`]). Returns false (nothing written) when a slot is
/// outside `regs`.
#[inline]
pub(crate) fn d_tile(
    simd: Option<Simd>,
    tile: &[f32; 128],
    regs: &mut [Lanes],
    slots: [u32; 4],
    m: u32,
) -> bool {
    if slots.iter().any(|&s| s as usize >= regs.len()) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if simd.is_some() {
        // SAFETY: AVX2 is present (`Simd` proves it); every slot indexes `regs` (checked above).
        unsafe { x86::d_tile(tile, regs, slots, m) };
        return true;
    }
    for (i, &slot) in slots.iter().enumerate() {
        d_reg_scalar(tile, i, &mut regs[slot as usize], m);
    }
    true
}

/// D register `i` (0..4) of the lanes in `m` from the column-major tile (the layout of
/// [`c_tile`]), the f32 bits zero-extended.
fn d_reg_scalar(tile: &[f32; 128], i: usize, dst: &mut Lanes, m: u32) {
    for (lane, x) in dst.iter_mut().enumerate() {
        let at = (2 * (lane & 3) + (i & 1)) * 16 + (lane >> 2) + 8 * (i >> 1);
        if m >> lane & 1 != 0 {
            *x = tile[at].to_bits() as u64;
        }
    }
}

/// The offsets `addrs[i] + delta` (wrapping) of `ldmatrix` rows into `out`, when every one
/// is a multiple of 16, below `2^shift` and at most `last`; false otherwise (`out` partly
/// written). Rows are `min(addrs.len(), out.len())`.
#[inline]
pub(crate) fn row_offsets(
    simd: Option<Simd>,
    addrs: &[u64],
    (delta, shift, last): (u64, u32, u64),
    out: &mut [usize],
) -> bool {
    let rows = addrs.len().min(out.len());
    let (head, tail) = (rows / 4 * 4, rows % 4);
    let (a, o) = (&addrs[..head], &mut out[..head]);
    #[cfg(target_arch = "x86_64")]
    let ok = if simd.is_some() && shift < 64 && last < 1 << 63 {
        // SAFETY: AVX2 is present (`Simd` proves it); `head` rows lie within both slices.
        unsafe { x86::row_offsets(a, (delta, shift, last), o) }
    } else {
        rows_scalar(a, (delta, shift, last), o)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let ok = {
        let _ = simd;
        rows_scalar(a, (delta, shift, last), o)
    };
    let (a, o) = (&addrs[head..head + tail], &mut out[head..head + tail]);
    ok & rows_scalar(a, (delta, shift, last), o)
}

fn rows_scalar(addrs: &[u64], (delta, shift, last): (u64, u32, u64), out: &mut [usize]) -> bool {
    let mut bad = 0u64;
    for (o, a) in out.iter_mut().zip(addrs) {
        let x = a.wrapping_add(delta);
        bad |= (x & 15) | x.checked_shr(shift).unwrap_or(0) | (x > last) as u64;
        *o = x as usize;
    }
    bad == 0
}

/// One 8 x 8 b16 matrix of `ldmatrix` into register `dst` (the lanes in `m`): row `r` is the
/// 16 bytes at `shared[offs[r]..]`; lane `4r + q` gets word `q` of row `r`, or with `trans`
/// lane `4c + r` gets column `c` of rows `2r` (low half) and `2r + 1`, zero-extended. Returns
/// false (nothing written) when a row does not lie inside `shared`.
#[inline]
pub(crate) fn ldmatrix(
    simd: Option<Simd>,
    shared: &[u8],
    offs: &[usize; 8],
    (trans, m): (bool, u32),
    dst: &mut Lanes,
) -> bool {
    let Some(last) = shared.len().checked_sub(16) else {
        return false;
    };
    if offs.iter().fold(0, |a, &o| a.max(o)) > last {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if simd.is_some() {
        // SAFETY: AVX2 is present (`Simd` proves it); every row's 16 bytes lie inside `shared`
        // (checked above).
        unsafe { x86::ldmatrix(shared, offs, trans, dst, m) };
        return true;
    }
    ldmatrix_scalar(shared, offs, trans, dst, m);
    true
}

fn ldmatrix_scalar(shared: &[u8], offs: &[usize; 8], trans: bool, dst: &mut Lanes, m: u32) {
    let e = |r: usize, c: usize| {
        let o = offs[r] + 2 * c;
        u16::from_le_bytes([shared[o], shared[o + 1]]) as u64
    };
    for (lane, x) in dst.iter_mut().enumerate() {
        let (hi, lo) = (lane >> 2, lane & 3);
        let v = if trans {
            e(2 * lo, hi) | e(2 * lo + 1, hi) << 16
        } else {
            e(hi, 2 * lo) | e(hi, 2 * lo + 1) << 16
        };
        if m >> lane & 1 != 0 {
            *x = v;
        }
    }
}

/// Where the 8 values (`g` = 0..8) of element `j` of column `q` of fragment register `r` go:
/// A transposed (`at[kk * 16 + row]`, row `g + 8 (r & 1)`), or B `k`-major (`b[kk * 8 + g]`).
#[inline(always)]
fn dst_at(a: bool, e: Elem, r: usize, q: usize, j: usize) -> usize {
    match (a, e.per_reg()) {
        // 16-bit A: k 2q + 8 (r / 2) + j;  8-bit A: k 4q + 16 (r / 2) + j
        (true, 2) => (2 * q + 8 * (r >> 1) + j) * 16 + 8 * (r & 1),
        (true, _) => (4 * q + 16 * (r >> 1) + j) * 16 + 8 * (r & 1),
        // 16-bit B: k 2q + 8r + j;  8-bit B: k 4q + 16r + j
        (false, 2) => (2 * q + 8 * r + j) * 8,
        (false, _) => (4 * q + 16 * r + j) * 8,
    }
}

/// The A fragment (4 registers, `raw[r][lane]`) decoded transposed into `v`
/// (`v[kk * 16 + row]`, `kk` < 16 for 16-bit formats, < 32 for fp8) with the magnitudes in
/// `abs`; returns whether every value is finite. Entries past `16 k` are left alone.
pub(crate) fn decode_a(
    simd: Option<Simd>,
    e: Elem,
    raw: &[[u32; 32]; 4],
    v: &mut [f32; 512],
    abs: &mut [f32; 512],
) -> bool {
    decode(simd, (e, true), raw.as_flattened(), v, abs)
}

/// The B fragment (2 registers) decoded `k`-major into `v` (`v[kk * 8 + col]`) with the
/// magnitudes; returns whether every value is finite.
pub(crate) fn decode_b(
    simd: Option<Simd>,
    e: Elem,
    raw: &[[u32; 32]; 2],
    v: &mut [f32; 256],
    abs: &mut [f32; 256],
) -> bool {
    decode(simd, (e, false), raw.as_flattened(), v, abs)
}

/// [`decode_a`] (`a`) or [`decode_b`]: `raw` holds `raw.len() / 32` registers.
#[inline(always)]
fn decode(
    simd: Option<Simd>,
    (e, a): (Elem, bool),
    raw: &[u32],
    v: &mut [f32],
    abs: &mut [f32],
) -> bool {
    let (words, values) = if a { (128, 512) } else { (64, 256) };
    let sizes = raw.len() == words && v.len() == values && abs.len() == values;
    #[cfg(target_arch = "x86_64")]
    if simd.is_some() && sizes {
        // SAFETY: AVX2 is present (`Simd` proves it) and the lengths are those of A or B
        // (checked above); `dst_at` + 8 stays within 16 k (A) or 8 k (B) entries, k <= 32.
        return unsafe { x86::decode(e, a, raw, v, abs) };
    }
    let _ = (simd, sizes);
    decode_scalar(e, a, raw, v, abs)
}

fn decode_scalar(e: Elem, a: bool, raw: &[u32], v: &mut [f32], abs: &mut [f32]) -> bool {
    let (pr, w) = (e.per_reg(), 32 / e.per_reg() as u32);
    let mut finite = true;
    for (i, x) in raw.iter().enumerate() {
        let (r, g, q) = (i >> 5, (i >> 2) & 7, i & 3);
        for j in 0..pr {
            let y = e.scalar(x >> (w * j as u32));
            let at = dst_at(a, e, r, q, j) + g;
            v[at] = y;
            abs[at] = y.abs();
            finite &= y.is_finite();
        }
    }
    finite
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// Rows `g` and `h` (4 lanes of u64 each at `p`) packed to 32 bits: `[g q0..q3 | h q0..q3]`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn pack_rows(p: *const u64, g: usize, h: usize) -> __m256 {
        let x = _mm256_loadu_si256(p.add(4 * g) as *const __m256i);
        let y = _mm256_loadu_si256(p.add(4 * h) as *const __m256i);
        // in-lane: [g0 g1 h0 h1 | g2 g3 h2 h3], then the 64-bit pairs in order
        let s = _mm256_shuffle_ps::<0b10_00_10_00>(_mm256_castsi256_ps(x), _mm256_castsi256_ps(y));
        _mm256_castsi256_ps(_mm256_permute4x64_epi64::<0b11_01_10_00>(
            _mm256_castps_si256(s),
        ))
    }

    /// The 8 x 4 transpose: from rows `(g0|g4), (g2|g6), (g1|g5), (g3|g7)` (each 128-bit half
    /// one row's q0..q3) to the four columns `q`, each `g0..g7`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn columns(x: [__m256; 4]) -> [__m256; 4] {
        let t0 = _mm256_unpacklo_ps(x[0], x[1]); // g0q0 g2q0 g0q1 g2q1 | g4.. g6..
        let t1 = _mm256_unpackhi_ps(x[0], x[1]); // q2, q3
        let t2 = _mm256_unpacklo_ps(x[2], x[3]); // g1q0 g3q0 g1q1 g3q1 | g5.. g7..
        let t3 = _mm256_unpackhi_ps(x[2], x[3]);
        [
            _mm256_unpacklo_ps(t0, t2), // g0 g1 g2 g3 | g4 g5 g6 g7 of q0
            _mm256_unpackhi_ps(t0, t2),
            _mm256_unpacklo_ps(t1, t3),
            _mm256_unpackhi_ps(t1, t3),
        ]
    }

    /// The columns of one 32-lane u64 register (its low 32 bits).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn reg_columns(p: &Lanes) -> [__m256; 4] {
        let p = p.as_ptr();
        columns([
            pack_rows(p, 0, 4),
            pack_rows(p, 2, 6),
            pack_rows(p, 1, 5),
            pack_rows(p, 3, 7),
        ])
    }

    /// The columns of one register of 32 u32 words at `p`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn raw_columns(p: *const u32) -> [__m256; 4] {
        let l = |i: usize| _mm256_loadu_ps(p.add(8 * i) as *const f32);
        let (r01, r23, r45, r67) = (l(0), l(1), l(2), l(3));
        columns([
            _mm256_permute2f128_ps::<0x20>(r01, r45),
            _mm256_permute2f128_ps::<0x20>(r23, r67),
            _mm256_permute2f128_ps::<0x31>(r01, r45),
            _mm256_permute2f128_ps::<0x31>(r23, r67),
        ])
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn lo32<const N: usize>(src: [&Lanes; N], dst: &mut [[u32; 32]; N]) {
        for (reg, d) in src.iter().zip(dst) {
            let o = d.as_mut_ptr() as *mut f32;
            for i in 0..4 {
                _mm256_storeu_ps(o.add(8 * i), pack_rows(reg.as_ptr(), 2 * i, 2 * i + 1));
            }
        }
    }

    /// [`super::row_offsets`] of a multiple of 4 rows; `shift` < 64, `last` < 2^63.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn row_offsets(
        addrs: &[u64],
        (delta, shift, last): (u64, u32, u64),
        out: &mut [usize],
    ) -> bool {
        let (d, l) = (
            _mm256_set1_epi64x(delta as i64),
            _mm256_set1_epi64x(last as i64),
        );
        let (sh, low) = (_mm_cvtsi32_si128(shift as i32), _mm256_set1_epi64x(15));
        let mut bad = _mm256_setzero_si256();
        for (a, o) in addrs.chunks_exact(4).zip(out.chunks_exact_mut(4)) {
            let x = _mm256_add_epi64(_mm256_loadu_si256(a.as_ptr() as *const __m256i), d);
            // x above `last` as signed: an x >= 2^63 is caught by the shift instead
            let big = _mm256_or_si256(_mm256_srl_epi64(x, sh), _mm256_cmpgt_epi64(x, l));
            bad = _mm256_or_si256(bad, _mm256_or_si256(_mm256_and_si256(x, low), big));
            _mm256_storeu_si256(o.as_mut_ptr() as *mut __m256i, x);
        }
        _mm256_testz_si256(bad, bad) != 0
    }

    /// [`super::find`].
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn find<const R: usize, const E: usize>(
        entries: &[[[u32; 32]; R]; E],
        valid: u32,
        raw: &[[u32; 32]; R],
    ) -> Option<usize> {
        let probe = _mm256_loadu_si256(raw.as_ptr() as *const __m256i);
        let mut cand = 0u32;
        for (e, x) in entries.iter().enumerate() {
            let d = _mm256_xor_si256(_mm256_loadu_si256(x.as_ptr() as *const __m256i), probe);
            cand |= (((valid >> e & 1) as i32 & _mm256_testz_si256(d, d)) as u32) << e;
        }
        while cand != 0 {
            let e = cand.trailing_zeros() as usize;
            if same(&entries[e], raw) {
                return Some(e);
            }
            cand &= cand - 1;
        }
        None
    }

    /// `x == y`; most unequal fragments differ in their first 8 words, so those are compared
    /// first.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn same<const N: usize>(x: &[[u32; 32]; N], y: &[[u32; 32]; N]) -> bool {
        let (x, y) = (x.as_ptr() as *const __m256i, y.as_ptr() as *const __m256i);
        let d =
            |i: usize| _mm256_xor_si256(_mm256_loadu_si256(x.add(i)), _mm256_loadu_si256(y.add(i)));
        let first = d(0);
        if _mm256_testz_si256(first, first) == 0 {
            return false;
        }
        let mut diff = _mm256_setzero_si256();
        for i in 1..4 * N {
            diff = _mm256_or_si256(diff, d(i));
        }
        _mm256_testz_si256(diff, diff) != 0
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn c_tile(c: [&Lanes; 4]) -> [f32; 128] {
        let mut t = std::mem::MaybeUninit::<[f32; 128]>::uninit();
        let o = t.as_mut_ptr() as *mut f32;
        for (i, reg) in c.iter().enumerate() {
            for (q, col) in reg_columns(reg).into_iter().enumerate() {
                _mm256_storeu_ps(o.add((2 * q + (i & 1)) * 16 + 8 * (i >> 1)), col);
            }
        }
        // SAFETY: the loops store 8 values at (2q + i % 2) * 16 + 8 (i / 2) for every i, q
        // in 0..4: all 128 entries.
        t.assume_init()
    }

    /// [`super::d_tile`]; every slot indexes `regs`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn d_tile(tile: &[f32; 128], regs: &mut [Lanes], slots: [u32; 4], m: u32) {
        let base = regs.as_mut_ptr();
        for (i, &slot) in slots.iter().enumerate() {
            // one register at a time: a repeated slot gets the later register, as in order
            d_reg(tile, i, &mut *base.add(slot as usize), m);
        }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn d_reg(tile: &[f32; 128], i: usize, dst: &mut Lanes, m: u32) {
        let c =
            |q: usize| _mm256_loadu_ps(tile.as_ptr().add((2 * q + (i & 1)) * 16 + 8 * (i >> 1)));
        let (c0, c1, c2, c3) = (c(0), c(1), c(2), c(3));
        let (x0, x1) = (_mm256_unpacklo_ps(c0, c1), _mm256_unpacklo_ps(c2, c3));
        let (x2, x3) = (_mm256_unpackhi_ps(c0, c1), _mm256_unpackhi_ps(c2, c3));
        let pd = _mm256_castps_pd;
        // rows (g|g+4) for g = 0..4, each half q0..q3
        let rows = [
            _mm256_unpacklo_pd(pd(x0), pd(x1)),
            _mm256_unpackhi_pd(pd(x0), pd(x1)),
            _mm256_unpacklo_pd(pd(x2), pd(x3)),
            _mm256_unpackhi_pd(pd(x2), pd(x3)),
        ];
        let mut out = [_mm256_setzero_si256(); 8];
        for (g, r) in rows.into_iter().enumerate() {
            let r = _mm256_castpd_si256(r);
            out[g] = _mm256_cvtepu32_epi64(_mm256_castsi256_si128(r));
            out[g + 4] = _mm256_cvtepu32_epi64(_mm256_extracti128_si256::<1>(r));
        }
        store_rows(dst, out, m);
    }

    /// Lanes `4g..4g + 4` of `dst` from `rows[g]`, for the lanes in `m`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn store_rows(dst: &mut Lanes, rows: [__m256i; 8], m: u32) {
        let d = dst.as_mut_ptr() as *mut __m256i;
        if m == u32::MAX {
            for (g, v) in rows.into_iter().enumerate() {
                _mm256_storeu_si256(d.add(g), v);
            }
        } else {
            let bits = _mm256_setr_epi64x(1, 2, 4, 8);
            for (g, v) in rows.into_iter().enumerate() {
                let sel = _mm256_set1_epi64x((m >> (4 * g) & 0xf) as i64);
                let keep = _mm256_cmpeq_epi64(_mm256_and_si256(sel, bits), bits);
                _mm256_maskstore_epi64(d.add(g) as *mut i64, keep, v);
            }
        }
    }

    /// [`super::ldmatrix`]; every `offs[r] + 16 <= shared.len()`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn ldmatrix(
        shared: &[u8],
        offs: &[usize; 8],
        trans: bool,
        dst: &mut Lanes,
        m: u32,
    ) {
        let row = |r: usize| _mm_loadu_si128(shared.as_ptr().add(offs[r]) as *const __m128i);
        let r: [__m128i; 8] = std::array::from_fn(row);
        let words = if trans {
            // the 8 x 8 transpose of 16-bit elements: word c of the result is column c
            let a: [__m128i; 8] = std::array::from_fn(|i| {
                let (x, y) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
                if i % 2 == 0 {
                    _mm_unpacklo_epi16(x, y)
                } else {
                    _mm_unpackhi_epi16(x, y)
                }
            });
            // b[2j]: columns 2j, 2j + 1 of rows 0..4; b[2j + 1]: the same of rows 4..8
            let b: [__m128i; 8] = std::array::from_fn(|i| {
                let (j, h) = (i / 2, i % 2);
                let (x, y) = (a[4 * h + (j & 2) / 2], a[4 * h + 2 + (j & 2) / 2]);
                if j % 2 == 0 {
                    _mm_unpacklo_epi32(x, y)
                } else {
                    _mm_unpackhi_epi32(x, y)
                }
            });
            std::array::from_fn(|c| {
                let (x, y) = (b[2 * (c / 2)], b[2 * (c / 2) + 1]);
                if c % 2 == 0 {
                    _mm_unpacklo_epi64(x, y)
                } else {
                    _mm_unpackhi_epi64(x, y)
                }
            })
        } else {
            r
        };
        store_rows(dst, words.map(|w| _mm256_cvtepu32_epi64(w)), m);
    }

    /// Eight codes (one per 32-bit lane, in the low bits after `x >> shift`) decoded to f32.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn elems(e: Elem, x: __m256i, j: usize) -> __m256 {
        let set = _mm256_set1_epi32;
        let f = _mm256_castsi256_ps;
        match e {
            Elem::Bf16 if j == 0 => f(_mm256_slli_epi32::<16>(x)),
            Elem::Bf16 => f(_mm256_and_si256(x, set(0xffff_0000u32 as i32))),
            Elem::F16 => {
                let h = if j == 0 {
                    x
                } else {
                    _mm256_srli_epi32::<16>(x)
                };
                let sign = _mm256_slli_epi32::<16>(_mm256_and_si256(h, set(0x8000)));
                let em = _mm256_and_si256(h, set(0x7fff));
                let fin = _mm256_mul_ps(f(_mm256_slli_epi32::<13>(em)), f(set(0x7780_0000)));
                let inf = f(_mm256_or_si256(
                    _mm256_slli_epi32::<13>(em),
                    set(0x7f80_0000),
                ));
                let special = f(_mm256_cmpgt_epi32(em, set(0x7bff)));
                _mm256_or_ps(_mm256_blendv_ps(fin, inf, special), f(sign))
            }
            Elem::E4m3 | Elem::E5m2 => {
                let b = _mm256_and_si256(_mm256_srlv_epi32(x, set(8 * j as i32)), set(0xff));
                let sign = _mm256_slli_epi32::<24>(_mm256_and_si256(b, set(0x80)));
                let em = _mm256_and_si256(b, set(0x7f));
                let (fin, special) = if e == Elem::E4m3 {
                    // s.eeee.mmm: exponent bias 7; 0x7f is NaN (no infinities)
                    let v = _mm256_mul_ps(f(_mm256_slli_epi32::<20>(em)), f(set(0x7b80_0000)));
                    (v, _mm256_cmpeq_epi32(em, set(0x7f)))
                } else {
                    // s.eeeee.mm: exponent bias 15; 0x7c.. are infinities and NaNs
                    let v = _mm256_mul_ps(f(_mm256_slli_epi32::<21>(em)), f(set(0x7780_0000)));
                    (v, _mm256_cmpgt_epi32(em, set(0x7b)))
                };
                let nan = f(set(0x7fc0_0000));
                _mm256_or_ps(_mm256_blendv_ps(fin, nan, f(special)), f(sign))
            }
        }
    }

    /// [`super::decode`]: one copy per format and operand, so the loops unroll with constant
    /// destinations.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn decode(
        e: Elem,
        a: bool,
        raw: &[u32],
        v: &mut [f32],
        abs: &mut [f32],
    ) -> bool {
        match (e, a) {
            (Elem::Bf16, true) => decode_as::<0, true>(raw, v, abs),
            (Elem::F16, true) => decode_as::<1, true>(raw, v, abs),
            (Elem::E4m3, true) => decode_as::<2, true>(raw, v, abs),
            (Elem::E5m2, true) => decode_as::<3, true>(raw, v, abs),
            (Elem::Bf16, false) => decode_as::<0, false>(raw, v, abs),
            (Elem::F16, false) => decode_as::<1, false>(raw, v, abs),
            (Elem::E4m3, false) => decode_as::<2, false>(raw, v, abs),
            (Elem::E5m2, false) => decode_as::<3, false>(raw, v, abs),
        }
    }

    /// [`decode`] of format `E` (0..4: bf16, f16, e4m3, e5m2) into A (`A`: `raw` holds 4
    /// registers) or B (2 registers).
    #[target_feature(enable = "avx2")]
    unsafe fn decode_as<const E: u8, const A: bool>(
        raw: &[u32],
        v: &mut [f32],
        abs: &mut [f32],
    ) -> bool {
        let e = [Elem::Bf16, Elem::F16, Elem::E4m3, Elem::E5m2][E as usize];
        let a = A;
        let mag = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let exp = _mm256_set1_epi32(0x7f80_0000);
        let mut bad = _mm256_setzero_si256();
        let (vp, ap) = (v.as_mut_ptr(), abs.as_mut_ptr());
        // `raw` holds 4 registers for A, 2 for B (the callers' arrays)
        for r in 0..if A { 4 } else { 2 } {
            for (q, col) in raw_columns(raw.as_ptr().add(32 * r))
                .into_iter()
                .enumerate()
            {
                let col = _mm256_castps_si256(col);
                for j in 0..e.per_reg() {
                    let y = elems(e, col, j);
                    let at = dst_at(a, e, r, q, j);
                    _mm256_storeu_ps(vp.add(at), y);
                    _mm256_storeu_ps(ap.add(at), _mm256_and_ps(y, mag));
                    let ey = _mm256_and_si256(_mm256_castps_si256(y), exp);
                    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(ey, exp));
                }
            }
        }
        _mm256_testz_si256(bad, bad) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn rand_lanes(rng: &mut rand::rngs::StdRng) -> Lanes {
        std::array::from_fn(|_| rng.gen::<u64>())
    }

    /// The transposes of C, D and the raw read equal the scalar code bit for bit, for full
    /// and partial lane masks (the SIMD paths run where the CPU has AVX2).
    #[test]
    fn transposes_match_scalar() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(10);
        for round in 0..64 {
            let regs: Vec<Lanes> = (0..4).map(|_| rand_lanes(&mut rng)).collect();
            let c = [&regs[0], &regs[1], &regs[2], &regs[3]];
            let simd = Simd::detect();
            let (x, y) = (c_tile(simd, c), c_tile_scalar(c));
            assert_eq!(x.map(f32::to_bits), y.map(f32::to_bits), "round {round}");
            let (mut p, mut q) = ([[0; 32]; 4], [[1; 32]; 4]);
            lo32(simd, c, &mut p);
            lo32_scalar(c, &mut q);
            assert_eq!(p, q);
            let mut raw = [p[1], p[2]];
            assert_eq!(find(simd, &[[p[1], p[2]]], 1, &raw), Some(0));
            raw[round % 2][(round * 7) % 32] ^= 1 << (round % 32);
            assert_eq!(find(simd, &[[p[1], p[2]]], 1, &raw), None);
            // four entries: the probe, one differing late, one early, one masked out
            let probe = [p[1], p[2]];
            let mut late = probe;
            late[1][31] ^= 1;
            let mut early = probe;
            early[0][0] ^= 2;
            let entries = [late, early, probe, probe];
            for (valid, want) in [(0xf, Some(2)), (0b1011, Some(3)), (0b0011, None), (0, None)] {
                let got = find(simd, &entries, valid, &probe);
                assert_eq!(got, want, "valid {valid:#b}");
                assert_eq!(find(None, &entries, valid, &probe), want);
            }
            let tile: [f32; 128] = std::array::from_fn(|_| f32::from_bits(rng.gen()));
            let m = match round % 4 {
                0 => u32::MAX,
                1 => 0,
                _ => rng.gen(),
            };
            let mut regs: Vec<Lanes> = (0..6).map(|_| rand_lanes(&mut rng)).collect();
            let mut want = regs.clone();
            let slots = [5, 1, (round % 6) as u32, 3];
            for (i, &s) in slots.iter().enumerate() {
                d_reg_scalar(&tile, i, &mut want[s as usize], m);
            }
            assert!(d_tile(simd, &tile, &mut regs, slots, m));
            assert_eq!(regs, want, "round {round}: D tile");
            assert!(!d_tile(simd, &tile, &mut regs, [0, 1, 6, 2], m));
            assert_eq!(regs, want, "an invalid slot writes nothing");
        }
    }

    /// The row checks equal the scalar ones: random aligned and in-range offsets, then one
    /// row misaligned, above `last`, above `2^shift`, or below the window (wrapping).
    #[test]
    fn row_offsets_match_scalar() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        let (base, last) = (0x1000_0000_0000u64, 8192 - 16);
        for round in 0..200 {
            let rows = [8, 16, 32, 12][round % 4];
            let mut addrs: Vec<u64> = (0..rows)
                .map(|_| base + 16 * rng.gen_range(0..512))
                .collect();
            let i = rng.gen_range(0..rows);
            match round % 6 {
                1 => addrs[i] += 8,
                2 => addrs[i] = base + last + 16,
                3 => addrs[i] = base + (1 << 24),
                4 => addrs[i] = base - 16,
                5 => addrs[i] = u64::MAX - 15,
                _ => {}
            }
            let args = (0u64.wrapping_sub(base), 24, last);
            let (mut x, mut y) = ([0usize; 32], [1usize; 32]);
            let got = row_offsets(Simd::detect(), &addrs, args, &mut x);
            let want = rows_scalar(&addrs, args, &mut y);
            assert_eq!(got, want, "round {round}");
            assert_eq!(got, round % 6 == 0, "round {round}");
            if want {
                assert_eq!(x[..rows], y[..rows]);
            }
        }
    }

    /// `ldmatrix` of one matrix (plain and `.trans`) equals the scalar code bit for bit, for
    /// full and partial lane masks; rows outside the memory are refused, nothing written.
    #[test]
    fn ldmatrix_matches_scalar() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        let shared: Vec<u8> = (0..1024).map(|_| rng.gen()).collect();
        for round in 0..64 {
            let offs: [usize; 8] = std::array::from_fn(|_| 16 * rng.gen_range(0..64));
            let m = [u32::MAX, 0, rng.gen(), rng.gen()][round % 4];
            let trans = round % 3 == 0;
            let (mut d, mut e) = (rand_lanes(&mut rng), [0; 32]);
            e.copy_from_slice(&d);
            assert!(ldmatrix(Simd::detect(), &shared, &offs, (trans, m), &mut d));
            ldmatrix_scalar(&shared, &offs, trans, &mut e, m);
            assert_eq!(d, e, "round {round}, trans {trans}, mask {m:#x}");
        }
        let mut offs = [0usize; 8];
        offs[5] = 1024 - 15;
        let (mut d, e) = ([7u64; 32], [7u64; 32]);
        assert!(!ldmatrix(
            Simd::detect(),
            &shared,
            &offs,
            (false, u32::MAX),
            &mut d
        ));
        assert_eq!(d, e);
    }

    /// The decoders equal the scalar ones: the finite flag always, the values and magnitudes
    /// bit for bit where every code is finite (random codes of the whole range, then a few
    /// non-finite ones: infinities, NaNs).
    #[test]
    fn decoders_match_scalar() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for round in 0..200 {
            let e = [Elem::Bf16, Elem::F16, Elem::E4m3, Elem::E5m2][round % 4];
            // the largest finite magnitude code, and the sign bit
            let (code_max, sign) = match e {
                Elem::Bf16 => (0x7f7f, 0x8000),
                Elem::F16 => (0x7bff, 0x8000),
                Elem::E4m3 => (0x7e, 0x80),
                Elem::E5m2 => (0x7b, 0x80),
            };
            let w = 32 / e.per_reg();
            let mut raw: [[u32; 32]; 4] = std::array::from_fn(|_| {
                std::array::from_fn(|_| {
                    (0..e.per_reg()).fold(0u32, |v, j| {
                        let c = rng.gen_range(0..=code_max) | if rng.gen() { sign } else { 0 };
                        v | c << (w * j)
                    })
                })
            });
            if round % 3 == 1 {
                let special = match e {
                    Elem::Bf16 => 0x7f80 + rng.gen_range(0..0x80),
                    Elem::F16 => 0x7c00 + rng.gen_range(0..0x400),
                    Elem::E4m3 => 0x7f,
                    Elem::E5m2 => 0x7c + rng.gen_range(0..4),
                };
                raw[rng.gen_range(0..4)][rng.gen_range(0..32)] =
                    special | ((round % 2) as u32) << 31;
            }
            let b_raw = [raw[1], raw[2]];
            let (mut v, mut abs) = ([f32::NAN; 512], [f32::NAN; 512]);
            let (mut v2, mut abs2) = ([f32::NAN; 512], [f32::NAN; 512]);
            let fa = decode_a(Simd::detect(), e, &raw, &mut v, &mut abs);
            let fs = decode_scalar(e, true, raw.as_flattened(), &mut v2, &mut abs2);
            assert_eq!(fa, fs, "round {round} {e:?}: finite flag of A");
            if fs {
                assert_eq!(
                    v.map(f32::to_bits),
                    v2.map(f32::to_bits),
                    "round {round} {e:?} A"
                );
                assert_eq!(abs.map(f32::to_bits), abs2.map(f32::to_bits), "{e:?} |A|");
            }
            let (mut v, mut abs) = ([f32::NAN; 256], [f32::NAN; 256]);
            let (mut v2, mut abs2) = ([f32::NAN; 256], [f32::NAN; 256]);
            let fb = decode_b(Simd::detect(), e, &b_raw, &mut v, &mut abs);
            let fs = decode_scalar(e, false, b_raw.as_flattened(), &mut v2, &mut abs2);
            assert_eq!(fb, fs, "round {round} {e:?}: finite flag of B");
            if fs {
                assert_eq!(
                    v.map(f32::to_bits),
                    v2.map(f32::to_bits),
                    "round {round} {e:?} B"
                );
                assert_eq!(abs.map(f32::to_bits), abs2.map(f32::to_bits), "{e:?} |B|");
            }
        }
    }
}
