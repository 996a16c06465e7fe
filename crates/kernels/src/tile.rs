//! Small typed building blocks the library kernels are written with: register vectors of packed
//! values (bf16 / e4m3 <-> f32), warp reductions, FP8 scale computation, and 128-byte-row shared
//! tiles with an XOR swizzle (16-byte chunk `c` of row `r` lives at chunk `c ^ (r & 7)`, so the 8
//! rows an `ldmatrix` phase reads, and the 8 chunks a `cp.async` row writes, hit distinct banks).

use builder::*;

/// Rows of every shared tile are 128 bytes (BK = 64 bf16 or 128 e4m3): 8 chunks of 16 bytes.
pub const ROW_BYTES: u32 = 128;

/// How the per-group FP8 scale is formed from the group's absolute maximum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum ScaleMode {
    /// scale = max(amax, 1e-4) / 448
    Float,
    /// scale rounded up to a power of two (exact inverse; DeepSeek's dispatch format)
    Pow2,
    /// power of two, stored as its UE8M0 exponent byte (scale = 2^(e - 127))
    Ue8m0,
}

/// Largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;
/// Floor on the group amax (keeps all-zero groups finite).
pub const AMAX_FLOOR: f32 = 1e-4;

/// `[lo, hi]` f32 of a b32 word holding two bf16 (`shl.b32` / `and.b32`, exact).
pub fn bf16x2_to_f32(k: &mut KernelBuilder, w: Reg<B32>) -> [Reg<f32>; 2] {
    let w: Reg<u32> = w.reinterpret();
    let lo = k.shl(w, 16u32);
    let hi = k.and(w, 0xffff_0000u32);
    [k.bitcast(lo), k.bitcast(hi)]
}

/// The four e4m3 bytes of a b32 word as f32, lowest byte first (`cvt.rn.f16x2.e4m3x2`, exact).
pub fn e4m3x4_to_f32(k: &mut KernelBuilder, w: Reg<B32>) -> [Reg<f32>; 4] {
    let [p01, p23]: [Reg<E4m3x2>; 2] = k.unpack(w);
    let h01 = k.cvt_f16x2_from_e4m3x2(p01);
    let h23 = k.cvt_f16x2_from_e4m3x2(p23);
    let [a, b]: [Reg<F16>; 2] = k.unpack(h01);
    let [c, d]: [Reg<F16>; 2] = k.unpack(h23);
    [k.cvt(a), k.cvt(b), k.cvt(c), k.cvt(d)]
}

/// One e4m3 byte (low byte of a b16 register) as f32.
pub fn e4m3_to_f32(k: &mut KernelBuilder, b: Reg<u8>) -> Reg<f32> {
    let p: Reg<E4m3x2> = b.reinterpret();
    let h = k.cvt_f16x2_from_e4m3x2(p);
    let [lo, _hi]: [Reg<F16>; 2] = k.unpack(h);
    k.cvt(lo)
}

/// Four f32 -> one b32 word of e4m3 (`cvt.rn.satfinite.e4m3x2.f32`, `v[0]` in the lowest byte).
pub fn f32x4_to_e4m3x4(k: &mut KernelBuilder, v: [Reg<f32>; 4]) -> Reg<B32> {
    let lo = k.cvt_e4m3x2(v[1], v[0]);
    let hi = k.cvt_e4m3x2(v[3], v[2]);
    k.pack([lo, hi])
}

/// `x * s` with `mul.rn.f32` (never contracted into an fma).
pub fn mul_rn(k: &mut KernelBuilder, x: Reg<f32>, s: Reg<f32>) -> Reg<f32> {
    k.mul_m(FMods::rn(), x, s)
}

/// Max over `lanes` consecutive lanes (a power of two <= 32) with `shfl.sync.bfly`.
pub fn warp_max(k: &mut KernelBuilder, v: Reg<f32>, lanes: u32) -> Reg<f32> {
    let mut m = v;
    let mut d = lanes / 2;
    while d >= 1 {
        let o = k.shfl_bfly(m, d);
        m = k.max(m, o);
        d /= 2;
    }
    m
}

/// Max of |v_i| and `acc`.
pub fn amax_into(k: &mut KernelBuilder, acc: Reg<f32>, v: &[Reg<f32>]) {
    for &x in v {
        let a = k.abs(x);
        k.max_to(acc, acc, a);
    }
}

/// (scale, 1/scale) from a group amax: `max(amax, 1e-4) / 448`, rounded up to a power of two for
/// [`ScaleMode::Pow2`] / [`ScaleMode::Ue8m0`] (bits + 0x7fffff, masked to the exponent).
pub fn fp8_scale(k: &mut KernelBuilder, amax: Reg<f32>, mode: ScaleMode) -> (Reg<f32>, Reg<f32>) {
    let a = k.max(amax, AMAX_FLOOR);
    let mut s = k.div(a, E4M3_MAX);
    if mode != ScaleMode::Float {
        let b: Reg<u32> = k.bitcast(s);
        let up = k.add(b, 0x007f_ffffu32);
        let e = k.and(up, 0x7f80_0000u32);
        s = k.bitcast(e);
    }
    let inv = k.rcp(s);
    (s, inv)
}

/// The UE8M0 byte of a power-of-two scale (its biased exponent), in a b16 register.
pub fn ue8m0_byte(k: &mut KernelBuilder, s: Reg<f32>) -> Reg<u8> {
    let b: Reg<u32> = k.bitcast(s);
    let e = k.shr(b, 23u32);
    let e16: Reg<u16> = k.cvt(e);
    e16.reinterpret()
}

/// CPU mirror of [`fp8_scale`] (bit-identical f32 operations).
pub fn fp8_scale_host(amax: f32, mode: ScaleMode) -> (f32, f32) {
    let a = amax.max(AMAX_FLOOR);
    let mut s = a / E4M3_MAX;
    if mode != ScaleMode::Float {
        s = f32::from_bits((s.to_bits() + 0x007f_ffff) & 0x7f80_0000);
    }
    (s, 1.0 / s)
}

/// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled 128-byte-row tile.
pub fn swz(row: u32, chunk: u32) -> u32 {
    row * ROW_BYTES + ((chunk ^ (row & 7)) << 4)
}

/// Runtime version of [`swz`]: `row * 128 + ((chunk ^ (row & 7)) << 4)`.
pub fn swz_reg(k: &mut KernelBuilder, row: Reg<u32>, chunk: Reg<u32>) -> Reg<u32> {
    let r7 = k.and(row, 7u32);
    let c = k.xor(chunk, r7);
    let c16 = k.shl(c, 4u32);
    let base = k.shl(row, 7u32);
    k.add(base, c16)
}
