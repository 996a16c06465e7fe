//! The Volta `mma.sync.aligned.m8n8k4.alayout.blayout.dtype.f16.f16.ctype` forms: f16 inputs,
//! `.row`/`.col` for A and for B (all four combinations), f16 or f32 C and D.
//!
//! ptxas 13.5 assembles these for every target it has (sm_75 .. sm_90a; it has no sm_70/sm_72)
//! with `.version` 6.4 or later, in the combinations `.f32.f16.f16.f32`, `.f32.f16.f16.f16` and
//! `.f16.f16.f16.f16`; it rejects `.f16.f16.f16.f32` (".dtype must be '.f32' when .ctype is
//! '.f32'"), `.satfinite`, rounding modifiers, and other input types. The validator
//! (`ptx::validate`) and [`VoltaSpec::from_instruction`] agree with it. ptxas 13.5 also
//! accepts an undocumented `.f32.bf16.bf16.f32` m8n8k4 on sm_80+, for which it emits no
//! arithmetic (the SASS stores D unwritten): the validator warns about it and the emulator
//! refuses it with that explanation.
//!
//! # Fragments
//! PTX ISA "Matrix Fragments for mma.m8n8k4 with .f16 floating point type": the warp computes
//! four independent 8x8x4 products, one per quad-pair: quad-pair `p = (lane >> 2) & 3` holds
//! lanes `4p..4p+3` (the low group) and `16+4p..16+4p+3` (the high group). With `q = lane % 4`
//! and `h = 4` for the high group, `0` for the low group, element `i` of lane `lane` is:
//! - A (two f16x2 registers, `a0..a3`): row-major `(row q + h, k i)`; column-major
//!   `(row i + h, k q)`;
//! - B (two f16x2 registers, `b0..b3`): row-major `(k q, col i + h)`; column-major
//!   `(k i, col q + h)`;
//! - C/D f16 (four f16x2 registers, `c0..c7`): `(row q + h, col i)`;
//! - C/D f32 (eight f32 registers): `(row X + h, col (i & 4) + (lane & 2) + (i & 1))` with
//!   `X = (lane & 1) + (i & 2)`.
//!
//! Element `2r` of a packed register is its low half.
//!
//! # Numerics ([`VoltaNumerics`])
//! - Exact ([`crate::Numerics::Exact`]): the four products and C are summed exactly (a
//!   fixed-point accumulator wide enough for every f16 product and f32 C, no f64 rounding),
//!   then rounded once to D's type, nearest even; an overflowing f16/f32 result is infinite;
//!   an exact zero is +0 unless every term is -0 (IEEE).
//! - Hardware on sm_70/sm_72 (Volta): the V100 model of Khattak and Mikaitis, "Accurate Models
//!   of NVIDIA Tensor Cores" (arXiv 2512.07004), as published in their MATLAB models
//!   (github.com/north-numerical-computing/MATLAB-tensor-core, `models/V100TC.m` and
//!   `models/tools/Generic_BFMA_TC.m`, commit 109e412): one fused block of 4 products plus C
//!   (`fma = 4`), no extra alignment bits (`neab = 0`). Every non-zero term is aligned to the
//!   largest exponent `E` among the terms and truncated toward zero to `23 + s` fraction bits
//!   below it, where `s = 1` when the largest product by nominal exponent (the sum of the
//!   inputs' exponents, subnormals counting as 2^-14) has a significand product of 2 or more
//!   and C's exponent does not exceed that nominal exponent (the model's "special case"),
//!   else `s = 0`. The aligned terms are added exactly, and the sum is rounded once: toward
//!   zero to f32 for an f32 D (`frmode = rz`), to nearest even to f16 for an f16 D
//!   (`frmode = rne`), subnormal results included. A sum of exactly zero is +0. A NaN or
//!   infinite term gives the IEEE sum of the terms (NaN becomes D's canonical NaN). One choice
//!   here is the emulator's, not the model's: an f32 result beyond the f32 range becomes the
//!   largest finite f32 (round toward zero, as [`crate::tc_numerics`]); the MATLAB model
//!   returns infinity there. Only a C within 2^34 of f32's largest value can reach it. Another:
//!   when only one term is non-zero and an f16 D is subnormal, the MATLAB model's one-term path
//!   rounds to 10 fraction bits before shifting into the subnormal range (two roundings); the
//!   emulator rounds once, as the model's multi-term path does.
//! - Hardware on sm_75 and later: these targets still assemble the instruction; the emulator
//!   applies the target's own f16 model ([`crate::tc_numerics::model_for`]; sm_75 has the
//!   sm_80 one) to the k = 4 dot product (one block), giving an FP32 result that an f16 D then
//!   rounds to nearest even, as the target's other f16 `mma` forms. What ptxas 13.5 emits
//!   differs by target (seen for `.row.col.f32.f16.f16.f32`): sm_75 has a native
//!   `HMMA.884.F32.F32` (four steps); for sm_80 and sm_90 it emits no tensor-core instruction
//!   and no lane exchange, only four FFMA and eight FADD per lane, which cannot compute the
//!   quad-pair product the PTX ISA defines. The emulator follows the PTX ISA.

use crate::mma::{round_to, to_f64};
use crate::tc_numerics::{self as tc, Numerics, TcModel};
use crate::Lanes;
use ptx::{Flag, Instruction, Mod, Ty};

/// A decoded Volta `mma.m8n8k4` f16 form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VoltaSpec {
    /// A is `.row` (else `.col`).
    pub a_row: bool,
    /// B is `.row` (else `.col`).
    pub b_row: bool,
    /// D's type: f16 or f32.
    pub dty: Ty,
    /// C's type: f16 or f32.
    pub cty: Ty,
}

/// The numerics one Volta `mma` uses (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VoltaNumerics {
    /// Exact sum, one rounding to nearest even.
    Exact,
    /// The V100 tensor-core model (sm_70, sm_72).
    V100,
    /// The target's own f16 model on sm_75 and later.
    Model(TcModel),
}

impl VoltaNumerics {
    /// The numerics for launch numerics `n` on target `sm`.
    pub fn select(n: Numerics, sm: u32) -> VoltaNumerics {
        match (n, tc::model_for(sm, Ty::F16)) {
            (Numerics::Exact, _) => VoltaNumerics::Exact,
            (Numerics::Hardware, _) if sm < 75 => VoltaNumerics::V100,
            (Numerics::Hardware, Some(m)) => VoltaNumerics::Model(m),
            (Numerics::Hardware, None) => VoltaNumerics::Exact,
        }
    }
}

/// The `.row` / `.col` layouts of an instruction, in order (A's, then B's).
fn layouts(ins: &Instruction) -> Vec<bool> {
    ins.mods
        .iter()
        .filter_map(|m| match m {
            Mod::Flag(Flag::Row) => Some(true),
            Mod::Flag(Flag::Col) => Some(false),
            _ => None,
        })
        .collect()
}

impl VoltaSpec {
    /// Whether `mma` instruction `ins` is an m8n8k4 form with f16 (or the undocumented bf16,
    /// which [`VoltaSpec::from_instruction`] refuses) inputs.
    pub fn is_form(ins: &Instruction) -> bool {
        let shape = matches!(
            ins.shape(),
            Some(Mod::Shape {
                m: 8,
                n: 8,
                k: Some(4)
            })
        );
        shape && matches!(ins.types().nth(1), Some(Ty::F16 | Ty::Bf16))
    }

    /// Decodes `mma.sync.aligned.m8n8k4.alayout.blayout.dtype.f16.f16.ctype` (the forms
    /// ptxas 13.5 accepts; module docs).
    pub fn from_instruction(ins: &Instruction) -> Result<VoltaSpec, String> {
        if !(ins.has(Flag::Sync) && ins.has(Flag::Aligned)) {
            return Err("mma.m8n8k4 needs .sync.aligned".into());
        }
        let [a_row, b_row] = layouts(ins)[..] else {
            return Err(
                "mma.m8n8k4 with .f16 inputs needs .alayout.blayout (.row or .col each)".into(),
            );
        };
        let tys: Vec<Ty> = ins.types().collect();
        let [dty, aty, bty, cty] = tys[..] else {
            return Err(format!(
                "mma.m8n8k4 needs four types (d, a, b, c), got {}",
                tys.len()
            ));
        };
        if aty == Ty::Bf16 {
            return Err(
                "mma.m8n8k4 .bf16 is not emulated: the form is not in the PTX ISA, and \
                        ptxas 13.5 (which accepts .f32.bf16.bf16.f32 on sm_80+) emits no \
                        arithmetic for it"
                    .into(),
            );
        }
        let acc = |t: Ty| matches!(t, Ty::F16 | Ty::F32);
        if aty != Ty::F16 || bty != Ty::F16 || !acc(dty) || !acc(cty) {
            return Err(format!(
                "unsupported mma form: .m8n8k4.{dty}.{aty}.{bty}.{cty} (f16 inputs take f16 or f32 C and D)"
            ));
        }
        if dty == Ty::F16 && cty == Ty::F32 {
            return Err("mma.m8n8k4: .dtype must be .f32 when .ctype is .f32".into());
        }
        if ins.has(Flag::Satfinite) {
            return Err("mma.m8n8k4 with .f16 inputs takes no .satfinite".into());
        }
        if ins.rounding().is_some() {
            return Err("mma.m8n8k4 takes no rounding modifier".into());
        }
        Ok(VoltaSpec {
            a_row,
            b_row,
            dty,
            cty,
        })
    }

    /// Registers per lane of the A, B, C and D fragments.
    pub fn frag_counts(&self) -> (usize, usize, usize, usize) {
        let acc = |t: Ty| if t == Ty::F16 { 4 } else { 8 };
        (2, 2, acc(self.cty), acc(self.dty))
    }

    /// Position `(row, k)` in its quad-pair's A of element `i` of lane `lane`.
    pub fn a_pos(&self, lane: usize, i: usize) -> (usize, usize) {
        let (q, h) = (lane % 4, high(lane));
        if self.a_row {
            (q + h, i)
        } else {
            (i + h, q)
        }
    }

    /// Position `(k, col)` in its quad-pair's B of element `i` of lane `lane`.
    pub fn b_pos(&self, lane: usize, i: usize) -> (usize, usize) {
        let (q, h) = (lane % 4, high(lane));
        if self.b_row {
            (q, i + h)
        } else {
            (i, q + h)
        }
    }

    /// Position `(row, col)` in its quad-pair's C/D of accumulator element `i` of lane `lane`
    /// for accumulator type `t`.
    pub fn acc_pos(lane: usize, i: usize, t: Ty) -> (usize, usize) {
        let h = high(lane);
        if t == Ty::F16 {
            (lane % 4 + h, i)
        } else {
            ((lane & 1) + (i & 2) + h, (i & 4) + (lane & 2) + (i & 1))
        }
    }
}

/// Row/column offset of a lane's group: 4 for the high group (lanes 16..32).
fn high(lane: usize) -> usize {
    if lane >= 16 {
        4
    } else {
        0
    }
}

/// Element `e` of a register of element type `t` (f16: two per register, low half first).
fn elem(v: u64, e: usize, t: Ty) -> f64 {
    if t == Ty::F16 {
        to_f64(Ty::F16, (v >> (16 * (e % 2))) & 0xffff)
    } else {
        to_f64(t, v & 0xffff_ffff)
    }
}

/// Elements of type `t` per register.
fn per(t: Ty) -> usize {
    if t == Ty::F16 {
        2
    } else {
        1
    }
}

/// One quad-pair's operands: A `8 x 4` row-major, B as columns (`b[col][k]`), C `8 x 8`.
struct Quad {
    a: [[f64; 4]; 8],
    b: [[f64; 4]; 8],
    c: [[f64; 8]; 8],
}

/// The lanes of quad-pair `p`: its low group, then its high group.
fn quad_lanes(p: usize) -> impl Iterator<Item = usize> {
    (4 * p..4 * p + 4).chain(16 + 4 * p..16 + 4 * p + 4)
}

fn gather(s: &VoltaSpec, p: usize, (a, b, c): (&[&Lanes], &[&Lanes], &[&Lanes])) -> Quad {
    let mut x = Quad {
        a: [[0.0; 4]; 8],
        b: [[0.0; 4]; 8],
        c: [[0.0; 8]; 8],
    };
    for lane in quad_lanes(p) {
        for i in 0..4 {
            let (row, k) = s.a_pos(lane, i);
            x.a[row][k] = elem(a[i / 2][lane], i, Ty::F16);
            let (k, col) = s.b_pos(lane, i);
            x.b[col][k] = elem(b[i / 2][lane], i, Ty::F16);
        }
        for i in 0..8 {
            let (row, col) = VoltaSpec::acc_pos(lane, i, s.cty);
            x.c[row][col] = elem(c[i / per(s.cty)][lane], i, s.cty);
        }
    }
    x
}

/// `D = A * B + C` of form `s` over whole-warp fragments under numerics `num`. `a`, `b`, `c`
/// hold [`VoltaSpec::frag_counts`] registers; `d` receives the D registers.
pub fn mma_volta(
    s: &VoltaSpec,
    num: VoltaNumerics,
    (a, b, c): (&[&Lanes], &[&Lanes], &[&Lanes]),
    d: &mut [Lanes],
) {
    for r in d.iter_mut() {
        *r = [0; 32];
    }
    let (pd, width) = (per(s.dty), if s.dty == Ty::F16 { 16 } else { 32 });
    for p in 0..4 {
        let x = gather(s, p, (a, b, c));
        for lane in quad_lanes(p) {
            for i in 0..8 {
                let (row, col) = VoltaSpec::acc_pos(lane, i, s.dty);
                let bits = element(num, s.dty, &x.a[row], &x.b[col], x.c[row][col]);
                d[i / pd][lane] |= bits << (width * (i % pd));
            }
        }
    }
}

/// One element of D: raw bits of `a . b + c` in type `dty`.
fn element(num: VoltaNumerics, dty: Ty, a: &[f64; 4], b: &[f64; 4], c: f64) -> u64 {
    let prods = [a[0] * b[0], a[1] * b[1], a[2] * b[2], a[3] * b[3]];
    if prods.iter().any(|p| !p.is_finite()) || !c.is_finite() {
        return round_to(dty, prods.iter().sum::<f64>() + c);
    }
    let x = match num {
        VoltaNumerics::Exact => exact_sum(&prods, c, dty),
        VoltaNumerics::V100 => v100_sum(a, b, c, dty),
        VoltaNumerics::Model(m) => tc::dot(&m, a, b, c as f32) as f64,
    };
    round_to(dty, x)
}

/// The exact sum of the products and `c`, rounded to nearest even to `dty` (returned as an
/// f64 holding a `dty` value, or an infinity).
fn exact_sum(prods: &[f64; 4], c: f64, dty: Ty) -> f64 {
    let mut acc = Wide::default();
    for &p in prods {
        acc.add(p);
    }
    acc.add(c);
    if prods
        .iter()
        .chain([&c])
        .all(|x| *x == 0.0 && x.is_sign_negative())
    {
        // IEEE: a sum of negative zeros is -0 (any other exact zero sum is +0)
        return -0.0;
    }
    acc.round(Format::of(dty), Rounding::NearestEven)
}

/// IEEE exponent of an f16 value for the model's nominal product exponents: `floor(log2|x|)`,
/// at least -14 (subnormals).
fn f16_exp(x: f64) -> i32 {
    exponent(x).max(-14)
}

/// `floor(log2|x|)` of a finite non-zero f64.
fn exponent(x: f64) -> i32 {
    let e = ((x.to_bits() >> 52) & 0x7ff) as i32;
    if e == 0 {
        // f64 subnormal: not reachable from f16/f32 operands, computed for completeness
        -1023 - (x.to_bits() << 12).leading_zeros() as i32
    } else {
        e - 1023
    }
}

/// The V100 model's block (module docs), returned as an f64 holding a `dty` value.
fn v100_sum(a: &[f64; 4], b: &[f64; 4], c: f64, dty: Ty) -> f64 {
    let live: Vec<usize> = (0..4).filter(|&i| a[i] * b[i] != 0.0).collect();
    if live.is_empty() {
        // only C: exact in D's type (C is f16 whenever D is)
        return if c == 0.0 { 0.0 } else { c };
    }
    let nominal = |i: usize| f16_exp(a[i]) + f16_exp(b[i]);
    let e_nom = live.iter().map(|&i| nominal(i)).max().unwrap_or(0);
    let big = live
        .iter()
        .any(|&i| nominal(i) == e_nom && (a[i] * b[i]).abs() >= pow2(e_nom) * 2.0);
    let special = big && (c == 0.0 || exponent(c) <= e_nom);
    let mut e_max = live
        .iter()
        .map(|&i| exponent(a[i] * b[i]))
        .max()
        .unwrap_or(0);
    if c != 0.0 {
        e_max = e_max.max(exponent(c));
    }
    let lsb = e_max - 23 - special as i32;
    let trunc = |x: f64| (x * pow2(-lsb)).trunc() * pow2(lsb);
    let mut acc = Wide::default();
    for &i in &live {
        acc.add(trunc(a[i] * b[i]));
    }
    acc.add(trunc(c));
    let (fmt, mode) = match dty {
        Ty::F16 => (Format::of(Ty::F16), Rounding::NearestEven),
        _ => (Format::of(Ty::F32), Rounding::TowardZero),
    };
    let x = acc.round(fmt, mode);
    if x.is_infinite() && mode == Rounding::TowardZero {
        // round toward zero never overflows to infinity: the largest finite f32
        return f32::MAX.copysign(x as f32) as f64;
    }
    x
}

/// 2^e as an f64 (`e` within the normal f64 exponent range).
fn pow2(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// A binary floating-point result format: significand bits (with the leading one) and the
/// smallest normal exponent.
#[derive(Clone, Copy)]
struct Format {
    prec: u32,
    emin: i32,
}

impl Format {
    fn of(t: Ty) -> Format {
        match t {
            Ty::F16 => Format {
                prec: 11,
                emin: -14,
            },
            _ => Format {
                prec: 24,
                emin: -126,
            },
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Rounding {
    NearestEven,
    TowardZero,
}

/// Units of the [`Wide`] accumulator: 2^-UNIT. Every term added here is a multiple of 2^-149
/// (f32 subnormals; f16 products are multiples of 2^-48) and below 2^129.
const UNIT: i32 = 200;
const LIMBS: usize = 6;

/// An exact sum of finite f64 terms: a 384-bit two's-complement integer in units of
/// 2^-[`UNIT`] (terms must be multiples of 2^-200 and below 2^180 in magnitude).
#[derive(Default)]
struct Wide {
    limbs: [u64; LIMBS],
}

impl Wide {
    /// Adds the finite value `x`.
    fn add(&mut self, x: f64) {
        if x == 0.0 {
            return;
        }
        let bits = x.to_bits();
        let (be, frac) = (((bits >> 52) & 0x7ff) as i32, bits & ((1 << 52) - 1));
        let (m, e) = if be == 0 {
            (frac, -1074)
        } else {
            (frac | 1 << 52, be - 1075)
        };
        // x = ±m * 2^e; the terms here are multiples of 2^-149, so the shift is non-negative
        let sh = (e + UNIT).max(0) as u32;
        let (at, off) = ((sh / 64) as usize, sh % 64);
        let v = (m as u128) << off;
        let parts = [v as u64, (v >> 64) as u64];
        if x < 0.0 {
            self.sub_at(at, parts);
        } else {
            self.add_at(at, parts);
        }
    }

    fn add_at(&mut self, at: usize, parts: [u64; 2]) {
        let mut carry = 0u64;
        for i in at..LIMBS {
            let p = parts.get(i - at).copied().unwrap_or(0);
            let (s1, c1) = self.limbs[i].overflowing_add(p);
            let (s2, c2) = s1.overflowing_add(carry);
            self.limbs[i] = s2;
            carry = (c1 || c2) as u64;
        }
    }

    fn sub_at(&mut self, at: usize, parts: [u64; 2]) {
        let mut borrow = 0u64;
        for i in at..LIMBS {
            let p = parts.get(i - at).copied().unwrap_or(0);
            let (s1, b1) = self.limbs[i].overflowing_sub(p);
            let (s2, b2) = s1.overflowing_sub(borrow);
            self.limbs[i] = s2;
            borrow = (b1 || b2) as u64;
        }
    }

    fn negative(&self) -> bool {
        self.limbs[LIMBS - 1] >> 63 == 1
    }

    /// The magnitude (two's-complement negation of a negative value).
    fn magnitude(&self) -> [u64; LIMBS] {
        if !self.negative() {
            return self.limbs;
        }
        let mut out = [0u64; LIMBS];
        let mut carry = 1u64;
        for i in 0..LIMBS {
            let (s, c) = (!self.limbs[i]).overflowing_add(carry);
            out[i] = s;
            carry = c as u64;
        }
        out
    }

    /// The value rounded to format `f` in mode `mode`, as an f64 (an infinity when the rounded
    /// magnitude reaches 2^(emax+1)); +0 for an exact zero.
    fn round(&self, f: Format, mode: Rounding) -> f64 {
        let mag = self.magnitude();
        let Some(top) = (0..LIMBS * 64).rev().find(|&i| bit(&mag, i)) else {
            return 0.0;
        };
        // lowest kept bit: `prec` bits from the top, but no finer than the subnormal spacing
        let q = (top as i32 + 1 - f.prec as i32).max(f.emin + 1 - f.prec as i32 + UNIT) as usize;
        let mut k = (q..=top)
            .rev()
            .fold(0u64, |acc, i| acc << 1 | bit(&mag, i) as u64);
        if mode == Rounding::NearestEven && q > 0 && bit(&mag, q - 1) {
            let sticky = (0..q - 1).any(|i| bit(&mag, i));
            if sticky || k & 1 == 1 {
                k += 1;
            }
        }
        let emax = f.emin.abs() + 1;
        let v = k as f64 * pow2(q as i32 - UNIT);
        let v = if v >= pow2(emax + 1) {
            f64::INFINITY
        } else {
            v
        };
        if self.negative() {
            -v
        } else {
            v
        }
    }
}

fn bit(limbs: &[u64; LIMBS], i: usize) -> bool {
    i < LIMBS * 64 && limbs[i / 64] >> (i % 64) & 1 == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_rounds_exact_sums() {
        let mut w = Wide::default();
        w.add(1.0);
        w.add(2f64.powi(-30));
        assert_eq!(w.round(Format::of(Ty::F32), Rounding::NearestEven), 1.0);
        w.add(2f64.powi(-24));
        // 1 + 2^-24 + 2^-30: above the tie, rounds up
        assert_eq!(
            w.round(Format::of(Ty::F32), Rounding::NearestEven),
            1.0 + 2f64.powi(-23)
        );
        assert_eq!(w.round(Format::of(Ty::F32), Rounding::TowardZero), 1.0);
        let mut n = Wide::default();
        n.add(-3.0);
        n.add(2f64.powi(-149));
        assert_eq!(
            n.round(Format::of(Ty::F32), Rounding::TowardZero),
            -(3.0 - 2f64.powi(-22))
        );
        let mut o = Wide::default();
        o.add(65504.0);
        o.add(16.0);
        assert_eq!(
            o.round(Format::of(Ty::F16), Rounding::NearestEven),
            f64::INFINITY
        );
    }
}
