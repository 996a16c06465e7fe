//! Bit-exact floating-point conversions and arithmetic on raw register bits.
//!
//! Every function here is pure and total: any input bits give a defined result, nothing panics.
//! Register values are raw bits zero-extended to `u64` (f32 in the low 32 bits, f16/bf16 in the
//! low 16 bits, packed `x2` types in the low 32 bits with element 0 in the low half).
//!
//! # How results are computed
//! All finite operands are decoded into an exact value `(-1)^s * (m + f) * 2^e` with an integer
//! significand `m: u128` and a "sticky" flag for `f > 0` (`Exact`). Addition, multiplication,
//! fused multiply-add, division and square root are carried out exactly (or with a sticky bit
//! far below the target precision) and rounded **once** to the destination format in the requested
//! rounding mode. This makes `add/sub/mul/fma/div.rn|rz|rm|rp`, `sqrt.rn...`, `rcp.rn...` and
//! every `cvt` correctly rounded for f16, bf16, tf32, f32, f64, e4m3 and e5m2, with no double
//! rounding.
//!
//! Approximate functions (`ex2 lg2 sin cos tanh rsqrt .approx`) are computed in f64 with the host
//! libm and rounded once to the destination; this is within the PTX accuracy bounds (it is almost
//! always the correctly rounded result). `rcp.approx`, `sqrt.approx`, `div.approx` and `div.full`
//! are computed correctly rounded, except `rcp.approx.ftz.f64` and `rsqrt.approx.ftz.f64`,
//! whose upper-word-only semantics the ISA spells out (`gross_f64`).
//!
//! # NaN policy (decided from the PTX ISA; documented here because the ISA leaves some open)
//! * Arithmetic results that are NaN are the **canonical NaN** of the result type, the all-ones
//!   positive pattern: f32 `0x7FFFFFFF`, f16/bf16 `0x7FFF`, f64 `0x7FFFFFFFFFFFFFFF` (the f32 value
//!   is what NVIDIA hardware produces; the ISA names `0x7FFF`/`0x7FFFFFFF` as canonical NaN for
//!   `.relu`/`.NaN` forms; for f64 the ISA does not say, we use the same rule).
//! * `neg`, `abs`, `copysign` are sign-bit operations and keep NaN payloads.
//! * `cvt` narrowing (f64->f32, f32->f16/bf16/tf32/e4m3/e5m2, ...) yields the canonical NaN of the
//!   destination (e4m3/e5m2: `0x7F`); widening (f16/bf16->f32, f32->f64, fp8->f16) keeps sign and
//!   payload, sets the quiet bit. `.relu` forms always give the canonical NaN.
//!
//! # Flush to zero
//! `.ftz` flushes subnormal inputs and subnormal (after rounding) results to sign-preserving zero
//! for f32 and f16/f16x2 arithmetic; bf16 and f64 ignore it. For `cvt`, `.ftz` applies to f32
//! sources and f32 destinations.
//!
//! # Saturation
//! `.sat` clamps to `[+0.0, 1.0]`, NaN -> `+0.0`, and `-0.0` -> `+0.0`. `.relu` maps negative
//! results (and `-0.0`) to `+0.0` and NaN to the canonical NaN. `.satfinite` maps ±Inf and
//! overflow to ±MAX finite of the destination, NaN stays NaN.

use ptx::ops::Rounding;
use ptx::{Flag, Instruction, Mod, Ty};

/// Floating-point rounding mode (`.rn .rz .rm .rp .rna`): the executor's float half of
/// [`ptx::ops::Rounding`] (decoded from it by [`Rnd::of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Rnd {
    /// To nearest, ties to even.
    #[default]
    Rn,
    /// Toward zero.
    Rz,
    /// Toward -Inf.
    Rm,
    /// Toward +Inf.
    Rp,
    /// To nearest, ties away from zero.
    Rna,
}

/// Rounding to an integral value (`.rni .rzi .rmi .rpi`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IRnd {
    /// Nearest, ties to even.
    Rni,
    /// Toward zero.
    Rzi,
    /// Toward -Inf (floor).
    Rmi,
    /// Toward +Inf (ceil).
    Rpi,
}

impl Rnd {
    /// The float rounding modifier of an instruction, if any.
    pub fn of(ins: &Instruction) -> Option<Rnd> {
        match ins.rounding()? {
            Rounding::Rn => Some(Rnd::Rn),
            Rounding::Rz => Some(Rnd::Rz),
            Rounding::Rm => Some(Rnd::Rm),
            Rounding::Rp => Some(Rnd::Rp),
            Rounding::Rna => Some(Rnd::Rna),
            _ => None,
        }
    }
}

impl IRnd {
    /// The integer rounding modifier of an instruction, if any.
    pub fn of(ins: &Instruction) -> Option<IRnd> {
        match ins.rounding()? {
            Rounding::Rni => Some(IRnd::Rni),
            Rounding::Rzi => Some(IRnd::Rzi),
            Rounding::Rmi => Some(IRnd::Rmi),
            Rounding::Rpi => Some(IRnd::Rpi),
            _ => None,
        }
    }
    /// Rounds an f64 to an integral f64 (exact).
    fn apply(self, x: f64) -> f64 {
        match self {
            IRnd::Rni => x.round_ties_even(),
            IRnd::Rzi => x.trunc(),
            IRnd::Rmi => x.floor(),
            IRnd::Rpi => x.ceil(),
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Formats and exact values
// ------------------------------------------------------------------------------------------------

/// A binary floating-point format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fmt {
    ebits: u32,
    mbits: u32,
    /// IEEE-style: all-ones exponent encodes Inf/NaN. Otherwise (e4m3 "fn"): no Inf, and only
    /// `S.1111.111` is NaN.
    ieee: bool,
}

const F64: Fmt = Fmt {
    ebits: 11,
    mbits: 52,
    ieee: true,
};
const F32: Fmt = Fmt {
    ebits: 8,
    mbits: 23,
    ieee: true,
};
const F16: Fmt = Fmt {
    ebits: 5,
    mbits: 10,
    ieee: true,
};
const BF16: Fmt = Fmt {
    ebits: 8,
    mbits: 7,
    ieee: true,
};
const TF32: Fmt = Fmt {
    ebits: 8,
    mbits: 10,
    ieee: true,
};
const E4M3: Fmt = Fmt {
    ebits: 4,
    mbits: 3,
    ieee: false,
};
const E5M2: Fmt = Fmt {
    ebits: 5,
    mbits: 2,
    ieee: true,
};

impl Fmt {
    fn bias(self) -> i64 {
        (1i64 << (self.ebits - 1)) - 1
    }
    fn emin(self) -> i64 {
        1 - self.bias()
    }
    fn mmask(self) -> u64 {
        (1u64 << self.mbits) - 1
    }
    fn emask(self) -> u64 {
        (1u64 << self.ebits) - 1
    }
    fn sign(self) -> u64 {
        1u64 << (self.ebits + self.mbits)
    }
    fn width_mask(self) -> u64 {
        (self.sign() << 1).wrapping_sub(1)
    }
    /// Largest finite magnitude encoding.
    fn max_finite(self) -> u64 {
        if self.ieee {
            ((self.emask() - 1) << self.mbits) | self.mmask()
        } else {
            (self.emask() << self.mbits) | (self.mmask() - 1)
        }
    }
    fn inf(self) -> u64 {
        self.emask() << self.mbits
    }
    /// Canonical NaN: all ones except the sign.
    fn nan(self) -> u64 {
        self.sign() - 1
    }
    fn one(self) -> u64 {
        (self.bias() as u64) << self.mbits
    }
    fn is_nan(self, bits: u64) -> bool {
        let ex = (bits >> self.mbits) & self.emask();
        let m = bits & self.mmask();
        if self.ieee {
            ex == self.emask() && m != 0
        } else {
            ex == self.emask() && m == self.mmask()
        }
    }
    fn is_subnormal(self, bits: u64) -> bool {
        (bits >> self.mbits) & self.emask() == 0 && bits & self.mmask() != 0
    }
    /// Flushes a subnormal to a signed zero.
    fn flush(self, bits: u64) -> u64 {
        if self.is_subnormal(bits) {
            bits & self.sign()
        } else {
            bits
        }
    }
}

/// An exact finite nonzero value `(-1)^neg * (m + f) * 2^e` with `0 <= f < 1`, `sticky = f > 0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Exact {
    neg: bool,
    m: u128,
    e: i64,
    sticky: bool,
}

/// A decoded value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Val {
    /// NaN with sign and payload (fraction bits, left-aligned in a u64).
    Nan(bool, u64),
    Inf(bool),
    Zero(bool),
    Fin(Exact),
}

impl Val {
    fn neg(self) -> bool {
        match self {
            Val::Nan(n, _) | Val::Inf(n) | Val::Zero(n) => n,
            Val::Fin(x) => x.neg,
        }
    }
    fn negate(self) -> Val {
        match self {
            Val::Nan(n, p) => Val::Nan(!n, p),
            Val::Inf(n) => Val::Inf(!n),
            Val::Zero(n) => Val::Zero(!n),
            Val::Fin(x) => Val::Fin(Exact { neg: !x.neg, ..x }),
        }
    }
    fn is_nan(self) -> bool {
        matches!(self, Val::Nan(..))
    }
    /// The value as f64 (exact for every format narrower than or equal to f64).
    fn to_f64(self) -> f64 {
        f64::from_bits(encode(F64, self, Rnd::Rn, false))
    }
}

fn decode(f: Fmt, bits: u64) -> Val {
    let bits = bits & f.width_mask();
    let neg = bits & f.sign() != 0;
    let ex = (bits >> f.mbits) & f.emask();
    let m = bits & f.mmask();
    if f.is_nan(bits) {
        return Val::Nan(neg, m << (64 - f.mbits));
    }
    if f.ieee && ex == f.emask() {
        return Val::Inf(neg);
    }
    if ex == 0 {
        if m == 0 {
            return Val::Zero(neg);
        }
        return Val::Fin(Exact {
            neg,
            m: m as u128,
            e: f.emin() - f.mbits as i64,
            sticky: false,
        });
    }
    Val::Fin(Exact {
        neg,
        m: (m | (1u64 << f.mbits)) as u128,
        e: ex as i64 - f.bias() - f.mbits as i64,
        sticky: false,
    })
}

fn decode_f64(x: f64) -> Val {
    decode(F64, x.to_bits())
}

/// Encodes a value into format `f`, rounding finite values with `rnd`. NaN gives the canonical
/// NaN (positive). With `satfinite`, ±Inf and overflow give ±MAX finite. For formats without
/// Inf (e4m3) and no `satfinite`, ±Inf and overflow give NaN with the sign kept.
fn encode(f: Fmt, v: Val, rnd: Rnd, satfinite: bool) -> u64 {
    match v {
        Val::Nan(..) => f.nan(),
        Val::Zero(n) => sign_of(f, n),
        Val::Inf(n) => sign_of(f, n) | overflow_mag(f, n, Rnd::Rn, satfinite),
        Val::Fin(x) => round(f, x, rnd, satfinite),
    }
}

fn sign_of(f: Fmt, neg: bool) -> u64 {
    if neg {
        f.sign()
    } else {
        0
    }
}

/// Magnitude encoding of an overflowed result.
fn overflow_mag(f: Fmt, neg: bool, rnd: Rnd, satfinite: bool) -> u64 {
    let to_inf = match rnd {
        Rnd::Rn | Rnd::Rna => true,
        Rnd::Rz => false,
        Rnd::Rp => !neg,
        Rnd::Rm => neg,
    };
    if !to_inf || satfinite {
        f.max_finite()
    } else if f.ieee {
        f.inf()
    } else {
        f.nan()
    }
}

/// Rounds an exact value into format `f` (correct rounding, one step).
fn round(f: Fmt, x: Exact, rnd: Rnd, satfinite: bool) -> u64 {
    let s = sign_of(f, x.neg);
    let mut m = x.m;
    let mut e = x.e;
    if m == 0 {
        if !x.sticky {
            return s;
        }
        // (0 + f) * 2^e: a value below one unit; represent it as a tiny nonzero value.
        m = 1;
        e -= 1000;
    }
    if !x.sticky {
        let lz = m.leading_zeros() as i64;
        if lz > 1 {
            m <<= lz - 1;
            e -= lz - 1;
        }
    }
    let nb = 128 - m.leading_zeros() as i64;
    let top = e + nb - 1; // exponent of the leading bit
    let mut qe = top.max(f.emin()) - f.mbits as i64; // exponent of the result's last bit
    let shift = qe - e;
    let (mut q, rem_cmp, inexact) = if shift <= 0 {
        // Cannot happen for the callers here (m always has more bits than the format), but keep
        // it total: exact up to the sticky bit, which is below half a unit only if shift == 0.
        let sh = (-shift).min(127) as u32;
        (
            m.checked_shl(sh).unwrap_or(0),
            std::cmp::Ordering::Less,
            x.sticky,
        )
    } else if shift >= 128 {
        // all of m is below the last bit; m < 2^127 <= half, so strictly below half a unit
        (0u128, std::cmp::Ordering::Less, true)
    } else {
        let sh = shift as u32;
        let q = m >> sh;
        let rem = m & ((1u128 << sh) - 1);
        let half = 1u128 << (sh - 1);
        let cmp = rem.cmp(&half).then(if x.sticky {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        });
        (q, cmp, rem != 0 || x.sticky)
    };
    use std::cmp::Ordering::*;
    let up = match rnd {
        Rnd::Rn => rem_cmp == Greater || (rem_cmp == Equal && q & 1 == 1),
        Rnd::Rna => rem_cmp != Less,
        Rnd::Rz => false,
        Rnd::Rp => !x.neg && inexact,
        Rnd::Rm => x.neg && inexact,
    };
    if up {
        q += 1;
    }
    if q >> (f.mbits + 1) != 0 {
        q >>= 1;
        qe += 1;
    }
    if q == 0 {
        return s;
    }
    if q >> f.mbits == 0 {
        // subnormal (qe == emin - mbits)
        return s | q as u64;
    }
    let biased = qe + f.mbits as i64 + f.bias();
    let frac = (q as u64) & f.mmask();
    let max_biased = if f.ieee {
        f.emask() as i64 - 1
    } else {
        f.emask() as i64
    };
    if biased > max_biased || (!f.ieee && biased == max_biased && frac == f.mmask()) {
        return s | overflow_mag(f, x.neg, rnd, satfinite);
    }
    s | ((biased as u64) << f.mbits) | frac
}

/// Shifts the significand so that its leading bit is at position `pos` (only for sticky-free
/// values; values already longer are left alone).
fn normalize(mut x: Exact, pos: u32) -> Exact {
    if x.m == 0 {
        return x;
    }
    let lead = 127 - x.m.leading_zeros();
    if lead < pos {
        let sh = pos - lead;
        x.m <<= sh;
        x.e -= sh as i64;
    }
    x
}

/// Exact sum of two sticky-free exact values, rounded later. Returns `None` for an exact zero.
fn add_exact(a: Exact, b: Exact) -> Option<Exact> {
    // Leading bits at 125: the sum of two such values fits in u128 with room to spare.
    let a = normalize(a, 125);
    let b = normalize(b, 125);
    let (a, b) = if (a.e, a.m) >= (b.e, b.m) {
        (a, b)
    } else {
        (b, a)
    };
    let d = (a.e - b.e) as u128; // >= 0
    let (mb, st) = if d == 0 {
        (b.m, false)
    } else if d < 128 {
        let d = d as u32;
        (b.m >> d, b.m & ((1u128 << d) - 1) != 0)
    } else {
        (0, true)
    };
    if a.neg == b.neg {
        Some(Exact {
            neg: a.neg,
            m: a.m + mb,
            e: a.e,
            sticky: st,
        })
    } else {
        // |a| >= |b|: a.m >= mb, and equality without sticky means exact cancellation
        let m = a.m - mb;
        if m == 0 && !st {
            return None;
        }
        // the true b is slightly larger than mb when sticky: borrow one unit
        let m = if st { m - 1 } else { m };
        Some(Exact {
            neg: a.neg,
            m,
            e: a.e,
            sticky: st,
        })
    }
}

fn add_val(a: Val, b: Val, rnd: Rnd) -> Val {
    match (a, b) {
        (Val::Nan(..), _) => a,
        (_, Val::Nan(..)) => b,
        (Val::Inf(x), Val::Inf(y)) => {
            if x == y {
                a
            } else {
                Val::Nan(false, 0)
            }
        }
        (Val::Inf(_), _) => a,
        (_, Val::Inf(_)) => b,
        (Val::Zero(x), Val::Zero(y)) => {
            if x == y {
                a
            } else {
                Val::Zero(rnd == Rnd::Rm)
            }
        }
        (Val::Zero(_), _) => b,
        (_, Val::Zero(_)) => a,
        (Val::Fin(x), Val::Fin(y)) => match add_exact(x, y) {
            Some(s) => Val::Fin(s),
            None => Val::Zero(rnd == Rnd::Rm),
        },
    }
}

fn mul_val(a: Val, b: Val) -> Val {
    let neg = a.neg() != b.neg();
    match (a, b) {
        (Val::Nan(..), _) => a,
        (_, Val::Nan(..)) => b,
        (Val::Inf(_), Val::Zero(_)) | (Val::Zero(_), Val::Inf(_)) => Val::Nan(false, 0),
        (Val::Inf(_), _) | (_, Val::Inf(_)) => Val::Inf(neg),
        (Val::Zero(_), _) | (_, Val::Zero(_)) => Val::Zero(neg),
        (Val::Fin(x), Val::Fin(y)) => {
            // significands from decoding have at most 53 bits: the product fits in u128
            let (x, y) = (shrink(x), shrink(y));
            Val::Fin(Exact {
                neg,
                m: x.m * y.m,
                e: x.e + y.e,
                sticky: false,
            })
        }
    }
}

/// Drops trailing zero bits of a sticky-free significand (keeps products in range).
fn shrink(mut x: Exact) -> Exact {
    if x.m != 0 && !x.sticky {
        let tz = x.m.trailing_zeros();
        x.m >>= tz;
        x.e += tz as i64;
    }
    if x.m >> 63 != 0 {
        // only reachable for non-decoded inputs; keep the top 63 bits with a sticky
        let sh = 128 - x.m.leading_zeros() - 63;
        x.sticky |= x.m & ((1u128 << sh) - 1) != 0;
        x.m >>= sh;
        x.e += sh as i64;
    }
    x
}

fn div_val(a: Val, b: Val) -> Val {
    let neg = a.neg() != b.neg();
    match (a, b) {
        (Val::Nan(..), _) => a,
        (_, Val::Nan(..)) => b,
        (Val::Inf(_), Val::Inf(_)) | (Val::Zero(_), Val::Zero(_)) => Val::Nan(false, 0),
        (Val::Inf(_), _) | (_, Val::Zero(_)) => Val::Inf(neg),
        (_, Val::Inf(_)) | (Val::Zero(_), _) => Val::Zero(neg),
        (Val::Fin(x), Val::Fin(y)) => {
            let x = normalize(shrink(x), 126);
            let y = shrink(y);
            let q = x.m / y.m;
            let r = x.m % y.m;
            Val::Fin(Exact {
                neg,
                m: q,
                e: x.e - y.e,
                sticky: r != 0,
            })
        }
    }
}

fn sqrt_val(a: Val) -> Val {
    match a {
        Val::Nan(..) => a,
        Val::Zero(_) => a,
        Val::Inf(false) => a,
        Val::Inf(true) => Val::Nan(false, 0),
        Val::Fin(x) if x.neg => Val::Nan(false, 0),
        Val::Fin(x) => {
            let mut x = normalize(shrink(x), 125);
            if x.e & 1 != 0 {
                x.m <<= 1;
                x.e -= 1;
            }
            let r = isqrt(x.m);
            let rem = x.m - r * r;
            Val::Fin(Exact {
                neg: false,
                m: r,
                e: x.e / 2,
                sticky: rem != 0,
            })
        }
    }
}

/// floor(sqrt(n)) for n < 2^127.
fn isqrt(n: u128) -> u128 {
    if n < 2 {
        return n;
    }
    // start above the root, then Newton steps decrease monotonically to floor(sqrt(n))
    let est = (n as f64).sqrt() as u128;
    let mut r = est + (est >> 20) + 2;
    loop {
        let y = (r + n / r) >> 1;
        if y >= r {
            break;
        }
        r = y;
    }
    while r * r > n {
        r -= 1;
    }
    while (r + 1) * (r + 1) <= n {
        r += 1;
    }
    r
}

/// Rounds to an integral value (keeps NaN/Inf/zero, sign of zero results preserved).
fn round_int_val(v: Val, ir: IRnd) -> Val {
    match v {
        Val::Fin(_) => {
            let x = v.to_f64();
            let r = ir.apply(x);
            if r == 0.0 {
                Val::Zero(x.is_sign_negative())
            } else {
                decode_f64(r)
            }
        }
        _ => v,
    }
}

// ------------------------------------------------------------------------------------------------
// Public scalar helpers
// ------------------------------------------------------------------------------------------------

/// f32 -> e4m3 (round to nearest even). With `satfinite`, ±Inf and overflow clamp to ±448;
/// without it they give NaN (e4m3 has no Inf). NaN -> `0x7F`.
pub fn f32_to_e4m3(x: f32, satfinite: bool) -> u8 {
    encode(E4M3, decode(F32, x.to_bits() as u64), Rnd::Rn, satfinite) as u8
}

/// e4m3 -> f32 (exact). `S.1111.111` is NaN (f32 canonical NaN with the sign kept).
/// Table-driven: the 256 results of the exact float unit, built once.
pub fn e4m3_to_f32(x: u8) -> f32 {
    static T: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let t = T.get_or_init(|| std::array::from_fn(|i| widen(E4M3, F32, i as u64) as u32));
    f32::from_bits(t[x as usize])
}

/// f32 -> e5m2 (round to nearest even). With `satfinite`, ±Inf and overflow clamp to ±57344;
/// without it they give ±Inf. NaN -> `0x7F`.
pub fn f32_to_e5m2(x: f32, satfinite: bool) -> u8 {
    encode(E5M2, decode(F32, x.to_bits() as u64), Rnd::Rn, satfinite) as u8
}

/// e5m2 -> f32 (exact, NaN payload kept and quieted). Table-driven like [`e4m3_to_f32`].
pub fn e5m2_to_f32(x: u8) -> f32 {
    static T: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let t = T.get_or_init(|| std::array::from_fn(|i| widen(E5M2, F32, i as u64) as u32));
    f32::from_bits(t[x as usize])
}

/// bf16 -> f32 (exact; NaN payload kept and quieted).
#[inline]
pub fn bf16_to_f32(x: u16) -> f32 {
    static T: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    widen16(&T, BF16, x)
}

/// A 16-bit format widened to f32 through a table built once from the exact unit (wgmma
/// operand decoding is hot).
fn widen16(t: &std::sync::OnceLock<Vec<u32>>, fmt: Fmt, x: u16) -> f32 {
    let t = t.get_or_init(|| {
        (0..=u16::MAX)
            .map(|i| widen(fmt, F32, i as u64) as u32)
            .collect()
    });
    f32::from_bits(t[x as usize])
}

/// f32 -> bf16, round to nearest even; overflow -> ±Inf, NaN -> `0x7FFF`.
pub fn f32_to_bf16_rn(x: f32) -> u16 {
    encode(BF16, decode(F32, x.to_bits() as u64), Rnd::Rn, false) as u16
}

/// f16 -> f32 (exact; NaN payload kept and quieted).
#[inline]
pub fn f16_to_f32(x: u16) -> f32 {
    static T: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    widen16(&T, F16, x)
}

/// f32 -> f16, round to nearest even; overflow -> ±Inf, NaN -> `0x7FFF`.
pub fn f32_to_f16_rn(x: f32) -> u16 {
    encode(F16, decode(F32, x.to_bits() as u64), Rnd::Rn, false) as u16
}

/// f32 -> tf32 with `.rna` (ties away from zero), as f32 bits with the low 13 bits zero.
pub fn f32_to_tf32_rna(x: f32) -> u32 {
    cvt_float(
        &CvtSpec::new(Ty::Tf32, Ty::F32).rnd(Rnd::Rna),
        x.to_bits() as u64,
    ) as u32
}

/// Converts between float formats where `to` is at least as wide as `from` in both fields
/// (exact). NaN keeps sign and payload and gets the quiet bit.
fn widen(from: Fmt, to: Fmt, bits: u64) -> u64 {
    match decode(from, bits) {
        Val::Nan(n, p) => {
            let payload = (p >> (64 - to.mbits)) | (1u64 << (to.mbits - 1));
            sign_of(to, n) | to.inf() | payload
        }
        v => encode(to, v, Rnd::Rn, false),
    }
}

// ------------------------------------------------------------------------------------------------
// cvt
// ------------------------------------------------------------------------------------------------

/// A decoded `cvt` instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CvtSpec {
    pub dst: Ty,
    pub src: Ty,
    pub rnd: Option<Rnd>,
    pub irnd: Option<IRnd>,
    pub ftz: bool,
    pub sat: bool,
    pub satfinite: bool,
    pub relu: bool,
}

fn fmt_of(t: Ty) -> Option<Fmt> {
    Some(match t {
        Ty::F16 | Ty::F16x2 => F16,
        Ty::Bf16 | Ty::Bf16x2 => BF16,
        Ty::F32 => F32,
        Ty::F64 => F64,
        Ty::Tf32 => TF32,
        Ty::E4m3 | Ty::E4m3x2 => E4M3,
        Ty::E5m2 | Ty::E5m2x2 => E5M2,
        _ => None?,
    })
}

fn is_int(t: Ty) -> bool {
    matches!(
        t,
        Ty::U8
            | Ty::U16
            | Ty::U32
            | Ty::U64
            | Ty::S8
            | Ty::S16
            | Ty::S32
            | Ty::S64
            | Ty::B8
            | Ty::B16
            | Ty::B32
            | Ty::B64
    )
}

fn is_scalar_float(t: Ty) -> bool {
    matches!(t, Ty::F16 | Ty::Bf16 | Ty::F32 | Ty::F64 | Ty::Tf32)
}

fn is_f8x2(t: Ty) -> bool {
    matches!(t, Ty::E4m3x2 | Ty::E5m2x2)
}

impl CvtSpec {
    /// A spec with no modifiers.
    pub fn new(dst: Ty, src: Ty) -> CvtSpec {
        CvtSpec {
            dst,
            src,
            rnd: None,
            irnd: None,
            ftz: false,
            sat: false,
            satfinite: false,
            relu: false,
        }
    }
    /// Builder: sets the float rounding mode.
    pub fn rnd(mut self, r: Rnd) -> CvtSpec {
        self.rnd = Some(r);
        self
    }
    /// Builder: sets the integer rounding mode.
    pub fn irnd(mut self, r: IRnd) -> CvtSpec {
        self.irnd = Some(r);
        self
    }

    /// Decodes `cvt{.rnd}{.ftz}{.sat}{.satfinite}{.relu}.dtype.stype`. The first type modifier
    /// is the destination, the second the source.
    pub fn from_instruction(ins: &Instruction) -> Result<CvtSpec, String> {
        let tys: Vec<Ty> = ins.types().collect();
        let [dst, src] = tys[..] else {
            return Err(format!(
                "cvt needs exactly two types (dst, src), got {}",
                tys.len()
            ));
        };
        let spec = CvtSpec {
            dst,
            src,
            rnd: Rnd::of(ins),
            irnd: IRnd::of(ins),
            ftz: ins.has(Flag::Ftz),
            sat: ins.has(Flag::Sat),
            satfinite: ins.has(Flag::Satfinite),
            relu: ins.has(Flag::Relu),
        };
        spec.check()?;
        Ok(spec)
    }

    /// Checks that this combination of types and modifiers is one `cvt` can execute.
    pub fn check(&self) -> Result<(), String> {
        let (d, s) = (self.dst, self.src);
        let scalar = (is_int(d) || is_scalar_float(d))
            && (is_int(s) || is_scalar_float(s))
            && (d != Ty::Tf32 || s == Ty::F32);
        let pack16 = matches!(d, Ty::F16x2 | Ty::Bf16x2) && (s == Ty::F32 || is_f8x2(s));
        let pack8 = is_f8x2(d) && matches!(s, Ty::F32 | Ty::F16x2 | Ty::Bf16x2);
        let ok = scalar || pack16 || pack8;
        if !ok {
            return Err(format!("cvt.{d}.{s} is not a supported conversion"));
        }
        if self.rnd.is_some() && self.irnd.is_some() {
            return Err("cvt cannot have both a float and an integer rounding modifier".into());
        }
        if self.irnd.is_some() && !is_scalar_float(s) {
            return Err(format!("integer rounding needs a float source, not .{s}"));
        }
        if is_f8x2(d) && !self.satfinite {
            return Err(format!("cvt to .{d} requires .satfinite"));
        }
        Ok(())
    }
}

/// Executes `cvt` on raw bits. `a` is the (first) source; `b` the second source of the packing
/// forms `cvt.*x2.f32 d, a, b`, where `a` goes to the upper half of `d`. Unsupported combinations
/// (see [`CvtSpec::check`]) return 0.
pub fn cvt(spec: &CvtSpec, a: u64, b: u64) -> u64 {
    let (d, s) = (spec.dst, spec.src);
    match (d, s) {
        (Ty::F16x2 | Ty::Bf16x2 | Ty::E4m3x2 | Ty::E5m2x2, Ty::F32) => {
            let w = if is_f8x2(d) { 8 } else { 16 };
            let elem = CvtSpec {
                dst: elem_ty(d),
                ..*spec
            };
            (cvt_float(&elem, a & 0xFFFF_FFFF) << w) | cvt_float(&elem, b & 0xFFFF_FFFF)
        }
        (Ty::E4m3x2 | Ty::E5m2x2, Ty::F16x2 | Ty::Bf16x2)
        | (Ty::F16x2 | Ty::Bf16x2, Ty::E4m3x2 | Ty::E5m2x2) => {
            let (wi, wo) = if is_f8x2(s) { (8, 16) } else { (16, 8) };
            let elem = CvtSpec {
                dst: elem_ty(d),
                src: elem_ty(s),
                ..*spec
            };
            let mi = (1u64 << wi) - 1;
            (cvt_float(&elem, (a >> wi) & mi) << wo) | cvt_float(&elem, a & mi)
        }
        _ if is_int(d) && is_int(s) => cvt_int_int(spec, a),
        _ if is_int(d) && is_scalar_float(s) => cvt_float_int(spec, a),
        _ if is_scalar_float(d) && is_int(s) => cvt_int_float(spec, a),
        _ if is_scalar_float(d) && is_scalar_float(s) => cvt_float(spec, a),
        _ => 0,
    }
}

fn elem_ty(t: Ty) -> Ty {
    match t {
        Ty::F16x2 => Ty::F16,
        Ty::Bf16x2 => Ty::Bf16,
        Ty::E4m3x2 => Ty::E4m3,
        Ty::E5m2x2 => Ty::E5m2,
        t => t,
    }
}

fn int_bits(t: Ty) -> u32 {
    t.bits().min(64)
}

/// Source integer value, sign- or zero-extended from its width.
fn int_value(t: Ty, a: u64) -> i128 {
    let w = int_bits(t);
    let m = if w >= 64 { a } else { a & ((1u64 << w) - 1) };
    if t.is_signed() && w < 128 {
        let sh = 128 - w;
        ((m as i128) << sh) >> sh
    } else {
        m as i128
    }
}

fn int_range(t: Ty) -> (i128, i128) {
    let w = int_bits(t);
    if t.is_signed() {
        (-(1i128 << (w - 1)), (1i128 << (w - 1)) - 1)
    } else {
        (0, (1i128 << w) - 1)
    }
}

fn int_result(t: Ty, v: i128) -> u64 {
    let w = int_bits(t);
    let v = v as u64;
    if w >= 64 {
        v
    } else {
        v & ((1u64 << w) - 1)
    }
}

fn cvt_int_int(spec: &CvtSpec, a: u64) -> u64 {
    let v = int_value(spec.src, a);
    let v = if spec.sat {
        let (lo, hi) = int_range(spec.dst);
        v.clamp(lo, hi)
    } else {
        v
    };
    int_result(spec.dst, v)
}

/// Float -> integer: rounds with the integer rounding mode (default `.rzi`), saturates to the
/// destination range, NaN -> 0 (PTX float-to-int conversions always saturate).
fn cvt_float_int(spec: &CvtSpec, a: u64) -> u64 {
    let Some(sf) = fmt_of(spec.src) else { return 0 };
    let sf = if spec.src == Ty::Tf32 { F32 } else { sf };
    let mut a = a & sf.width_mask();
    if spec.ftz && spec.src == Ty::F32 {
        a = sf.flush(a);
    }
    let v = decode(sf, a);
    if v.is_nan() {
        return 0;
    }
    let x = spec.irnd.unwrap_or(IRnd::Rzi).apply(v.to_f64());
    let (lo, hi) = int_range(spec.dst);
    // i128 `as` from f64 saturates; the clamp then saturates to the destination width.
    let r = (x as i128).clamp(lo, hi);
    int_result(spec.dst, r)
}

fn cvt_int_float(spec: &CvtSpec, a: u64) -> u64 {
    let v = int_value(spec.src, a);
    let val = if v == 0 {
        Val::Zero(false)
    } else {
        Val::Fin(Exact {
            neg: v < 0,
            m: v.unsigned_abs(),
            e: 0,
            sticky: false,
        })
    };
    finish_float(spec, val, spec.rnd.unwrap_or(Rnd::Rn))
}

/// Float -> float (scalar), including tf32 and the element conversions of the packed forms.
fn cvt_float(spec: &CvtSpec, a: u64) -> u64 {
    let Some(sf) = fmt_of(spec.src) else { return 0 };
    // tf32 sources are f32 bit patterns
    let sf = if spec.src == Ty::Tf32 { F32 } else { sf };
    let mut a = a & sf.width_mask();
    if spec.ftz && spec.src == Ty::F32 {
        a = sf.flush(a);
    }
    let mut v = decode(sf, a);
    if let Some(ir) = spec.irnd {
        v = round_int_val(v, ir);
    }
    if let Val::Nan(..) = v {
        let Some(df) = fmt_of(spec.dst) else { return 0 };
        let widening = df.ebits >= sf.ebits && df.mbits >= sf.mbits && spec.dst != Ty::Tf32;
        return if spec.relu || spec.sat || !widening {
            if spec.sat {
                0
            } else if spec.dst == Ty::Tf32 {
                F32.nan() & !0x1FFF
            } else {
                df.nan()
            }
        } else {
            widen(sf, df, a)
        };
    }
    finish_float(spec, v, spec.rnd.unwrap_or(Rnd::Rn))
}

/// Rounds a (non-NaN or NaN) value into the destination float type with `.relu/.sat/.ftz/
/// .satfinite` applied.
fn finish_float(spec: &CvtSpec, mut v: Val, rnd: Rnd) -> u64 {
    let Some(df) = fmt_of(spec.dst) else { return 0 };
    if spec.relu && v.neg() && !v.is_nan() {
        v = Val::Zero(false);
    }
    let mut r = encode(df, v, rnd, spec.satfinite);
    if spec.ftz && spec.dst == Ty::F32 {
        r = df.flush(r);
    }
    if spec.sat {
        r = saturate(df, r);
    }
    if spec.dst == Ty::Tf32 {
        r <<= 13;
    }
    r
}

/// `.sat`: clamp to [+0, 1], NaN -> +0, -0 -> +0.
fn saturate(f: Fmt, bits: u64) -> u64 {
    if f.is_nan(bits) || bits & f.sign() != 0 {
        return 0;
    }
    // positive values order like their bit patterns
    bits.min(f.one())
}

// ------------------------------------------------------------------------------------------------
// Float arithmetic
// ------------------------------------------------------------------------------------------------

/// A floating-point operation of [`fop`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FOp {
    Add,
    Sub,
    Mul,
    /// `a * b + c`, one rounding.
    Fma,
    Div,
    Min,
    Max,
    Neg,
    Abs,
    Rcp,
    Sqrt,
    Rsqrt,
    Ex2,
    Lg2,
    Sin,
    Cos,
    Tanh,
    /// `copysign d, a, b`: `b` with the sign of `a`.
    Copysign,
}

/// Modifiers of a float instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FMode {
    pub rnd: Rnd,
    pub ftz: bool,
    pub sat: bool,
    pub relu: bool,
    /// `.NaN` on min/max: a NaN operand gives NaN.
    pub nan: bool,
    /// `.approx` or `.full`.
    pub approx: bool,
    /// `.xorsign.abs` on min/max: the minimum/maximum of the magnitudes, with the XOR of the
    /// operands' signs.
    pub xorsign: bool,
}

impl FMode {
    /// Reads `.rn/.rz/.rm/.rp` (default `.rn`), `.ftz`, `.sat`, `.relu`, `.NaN`, `.approx`/`.full`.
    pub fn from_instruction(ins: &Instruction) -> FMode {
        FMode {
            rnd: Rnd::of(ins).unwrap_or_default(),
            ftz: ins.has(Flag::Ftz),
            sat: ins.has(Flag::Sat),
            relu: ins.has(Flag::Relu),
            nan: ins.has(Flag::NaN),
            approx: ins.has(Flag::Approx) || ins.has(Flag::Full),
            xorsign: ins.has(Flag::Xorsign),
        }
    }
}

/// Executes a float operation on raw bits. Packed `f16x2`/`bf16x2` types work lane-wise (low
/// half = element 0). Unary operations read `a`; binary `a, b`; `Fma` `a, b, c`. Non-float
/// types give 0.
pub fn fop(op: FOp, ty: Ty, mode: FMode, a: u64, b: u64, c: u64) -> u64 {
    match ty {
        Ty::F16x2 | Ty::Bf16x2 => {
            let s = elem_ty(ty);
            let lo = fop_scalar(op, s, mode, a & 0xFFFF, b & 0xFFFF, c & 0xFFFF);
            let hi = fop_scalar(
                op,
                s,
                mode,
                (a >> 16) & 0xFFFF,
                (b >> 16) & 0xFFFF,
                (c >> 16) & 0xFFFF,
            );
            (hi << 16) | lo
        }
        Ty::F16 | Ty::Bf16 | Ty::F32 | Ty::F64 => fop_scalar(op, ty, mode, a, b, c),
        _ => 0,
    }
}

fn fop_scalar(op: FOp, ty: Ty, mode: FMode, a: u64, b: u64, c: u64) -> u64 {
    let Some(f) = fmt_of(ty) else { return 0 };
    // bf16 flushes only in `ex2.approx.ftz.bf16` (elsewhere PTX has no .ftz for it)
    let ftz = mode.ftz && (matches!(ty, Ty::F32 | Ty::F16) || (ty == Ty::Bf16 && op == FOp::Ex2));
    let inp = |x: u64| {
        let x = x & f.width_mask();
        if ftz {
            f.flush(x)
        } else {
            x
        }
    };
    if ty == Ty::F64 && mode.approx && mode.ftz && matches!(op, FOp::Rcp | FOp::Rsqrt) {
        return gross_f64(op, a);
    }
    let (a, b, c) = (inp(a), inp(b), inp(c));
    let (va, vb, vc) = (decode(f, a), decode(f, b), decode(f, c));
    let rnd = mode.rnd;
    let result = match op {
        FOp::Neg => return a ^ f.sign(),
        FOp::Abs => return a & !f.sign(),
        FOp::Copysign => return (b & !f.sign()) | (a & f.sign()),
        FOp::Min | FOp::Max if mode.xorsign => {
            let sign = (a ^ b) & f.sign();
            let (a, b) = (a & !f.sign(), b & !f.sign());
            let r = min_max(
                f,
                op == FOp::Max,
                mode.nan,
                a,
                b,
                decode(f, a),
                decode(f, b),
            );
            let r = if f.is_nan(r) { r } else { r | sign };
            return post(f, mode, ftz, r);
        }
        FOp::Min | FOp::Max => {
            let r = min_max(f, op == FOp::Max, mode.nan, a, b, va, vb);
            return post(f, mode, ftz, r);
        }
        FOp::Add => encode(f, add_val(va, vb, rnd), rnd, false),
        FOp::Sub => encode(f, add_val(va, vb.negate(), rnd), rnd, false),
        FOp::Mul => encode(f, mul_val(va, vb), rnd, false),
        FOp::Fma => encode(f, add_val(mul_val(va, vb), vc, rnd), rnd, false),
        FOp::Div => encode(f, div_val(va, vb), rnd, false),
        FOp::Rcp => encode(
            f,
            div_val(
                Val::Fin(Exact {
                    neg: false,
                    m: 1,
                    e: 0,
                    sticky: false,
                }),
                va,
            ),
            rnd,
            false,
        ),
        FOp::Sqrt => encode(f, sqrt_val(va), rnd, false),
        FOp::Rsqrt => approx(f, va, |x| {
            if x == 0.0 {
                // rsqrt(±0) = ±Inf
                1.0 / x
            } else if x < 0.0 {
                f64::NAN
            } else {
                // sqrt of f64 then divide: error well below one ulp of f32 (and < 2 ulp of f64)
                1.0 / x.sqrt()
            }
        }),
        FOp::Ex2 => approx(f, va, f64::exp2),
        FOp::Lg2 => approx(f, va, |x| {
            if x == 0.0 {
                f64::NEG_INFINITY
            } else {
                x.log2()
            }
        }),
        FOp::Sin => approx(f, va, f64::sin),
        FOp::Cos => approx(f, va, f64::cos),
        FOp::Tanh => approx(f, va, f64::tanh),
    };
    post(f, mode, ftz, result)
}

/// `rcp.approx.ftz.f64` and `rsqrt.approx.ftz.f64` as the PTX ISA defines them (9.7.3.14,
/// 9.7.3.17): only the upper word of `a` is read (1.11.20 format), subnormal inputs and results
/// flush to sign-preserving zero, NaN gives `0x7fffffff00000000`, and the result is the upper
/// word (here: 1/x or 1/sqrt(x) rounded to nearest-even at 20 fraction bits) with the lower 32
/// bits zero. libdevice refines these with Newton steps, so their precision matters.
fn gross_f64(op: FOp, a: u64) -> u64 {
    const NAN: u64 = 0x7fff_ffff_0000_0000;
    let x = f64::from_bits(a & 0xffff_ffff_0000_0000);
    if x.is_nan() {
        return NAN;
    }
    let x = if x.is_subnormal() {
        0f64.copysign(x)
    } else {
        x
    };
    let y = if op == FOp::Rcp {
        1.0 / x
    } else if x == 0.0 {
        f64::INFINITY.copysign(x)
    } else {
        1.0 / x.sqrt() // NaN for x < 0
    };
    if y.is_nan() {
        return NAN;
    }
    let (hi, lo) = (y.to_bits() >> 32, y.to_bits() & 0xffff_ffff);
    let half = 0x8000_0000;
    let hi = if lo > half || (lo == half && hi & 1 == 1) {
        hi + 1 // a carry into the exponent is the correct rounding (up to Inf)
    } else {
        hi
    };
    let r = hi << 32;
    if f64::from_bits(r).is_subnormal() {
        r & (1 << 63)
    } else {
        r
    }
}

/// Approximate function through f64 and one rounding to the destination.
fn approx(f: Fmt, v: Val, g: impl Fn(f64) -> f64) -> u64 {
    if v.is_nan() {
        return f.nan();
    }
    let y = g(v.to_f64());
    if y.is_nan() {
        return f.nan();
    }
    encode(f, decode_f64(y), Rnd::Rn, false)
}

/// `.ftz` output flush, `.sat`, `.relu`, NaN canonicalisation.
fn post(f: Fmt, mode: FMode, ftz: bool, mut r: u64) -> u64 {
    if f.is_nan(r) {
        return if mode.sat { 0 } else { f.nan() };
    }
    if ftz {
        r = f.flush(r);
    }
    if mode.sat {
        r = saturate(f, r);
    }
    if mode.relu && r & f.sign() != 0 {
        r = 0;
    }
    r
}

fn min_max(f: Fmt, max: bool, nan_mode: bool, a: u64, b: u64, va: Val, vb: Val) -> u64 {
    match (va.is_nan(), vb.is_nan()) {
        (true, true) => return f.nan(),
        (true, false) | (false, true) if nan_mode => return f.nan(),
        (true, false) => return b,
        (false, true) => return a,
        _ => {}
    }
    let (x, y) = (va.to_f64(), vb.to_f64());
    // -0 orders below +0
    let a_less = x < y || (x == y && va.neg() && !vb.neg());
    if a_less != max {
        a
    } else {
        b
    }
}

// ------------------------------------------------------------------------------------------------
// testp
// ------------------------------------------------------------------------------------------------

/// The predicate of `testp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TestpKind {
    Finite,
    Infinite,
    Number,
    NotANumber,
    Normal,
    Subnormal,
}

impl TestpKind {
    /// Reads `.finite .infinite .number .notanumber .normal .subnormal`.
    pub fn from_instruction(ins: &Instruction) -> Result<TestpKind, String> {
        ins.mods
            .iter()
            .find_map(|m| match m {
                Mod::Flag(Flag::Finite) => Some(TestpKind::Finite),
                Mod::Flag(Flag::Infinite) => Some(TestpKind::Infinite),
                Mod::Flag(Flag::Number) => Some(TestpKind::Number),
                Mod::Flag(Flag::Notanumber) => Some(TestpKind::NotANumber),
                Mod::Flag(Flag::Normal) => Some(TestpKind::Normal),
                Mod::Flag(Flag::Subnormal) => Some(TestpKind::Subnormal),
                _ => None,
            })
            .ok_or_else(|| {
                "testp needs one of .finite .infinite .number .notanumber .normal .subnormal"
                    .to_string()
            })
    }
}

/// `testp.kind.ty a` (f32, f64; f16/bf16 also accepted). Zero is neither normal nor subnormal.
/// Non-float types give false.
pub fn testp(kind: TestpKind, ty: Ty, a: u64) -> bool {
    let Some(f) = fmt_of(elem_ty(ty)) else {
        return false;
    };
    let v = decode(f, a);
    match kind {
        TestpKind::Finite => matches!(v, Val::Zero(_) | Val::Fin(_)),
        TestpKind::Infinite => matches!(v, Val::Inf(_)),
        TestpKind::Number => !v.is_nan(),
        TestpKind::NotANumber => v.is_nan(),
        TestpKind::Normal => matches!(v, Val::Fin(_)) && !f.is_subnormal(a & f.width_mask()),
        TestpKind::Subnormal => f.is_subnormal(a & f.width_mask()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brief_vectors() {
        let spec = CvtSpec::new(Ty::E4m3x2, Ty::F32).rnd(Rnd::Rn);
        let spec = CvtSpec {
            satfinite: true,
            ..spec
        };
        assert_eq!(
            cvt(&spec, 0.40625f32.to_bits() as u64, 12.9f32.to_bits() as u64),
            0x2D55
        );
        let spec = CvtSpec::new(Ty::Bf16x2, Ty::F32).rnd(Rnd::Rn);
        assert_eq!(
            cvt(&spec, 0.40625f32.to_bits() as u64, 12.9f32.to_bits() as u64),
            0x3ED0414E
        );
        let spec = CvtSpec::new(Ty::F16x2, Ty::E4m3x2).rnd(Rnd::Rn);
        assert_eq!(cvt(&spec, 0x2D55, 0), 0x36804A80);
    }

    #[test]
    fn isqrt_small() {
        for n in 0u128..2000 {
            let r = isqrt(n);
            assert!(r * r <= n && (r + 1) * (r + 1) > n, "{n}");
        }
        let n = (1u128 << 126) + 12345;
        let r = isqrt(n);
        assert!(r * r <= n && (r + 1) * (r + 1) > n);
    }
}
