//! Lane-parallel ALU kernels. Each decoded ALU instruction holds one `WFn`: a monomorphic
//! function that computes the active lanes of its destination register row from up to three
//! source rows, in place in the warp's register file ([`lanewise`]): the destination row is
//! borrowed mutably and the source rows immutably, so the lane loop stays branch-free and
//! vectorisable and nothing is cleared or copied per instruction. Only when a source is the
//! destination itself (`add r1, r1, 1`) is that row copied first. The functions built with
//! `lanes_fn!` exist twice, for the baseline target and with AVX2 (four 64-bit lanes per
//! vector op instead of two); the decoder takes the AVX2 one when the CPU has it (the same
//! lane code, so the same bits: `simd_builds_match_baseline`).

use crate::Lanes;
use ptx::{Flag, Instruction, Opcode, Ty};

/// The register slots and active-lane mask of one ALU instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slots {
    /// Active lanes (bit `l` = lane `l`): only these are written.
    pub m: u32,
    pub d: u32,
    pub a: u32,
    pub b: u32,
    pub c: u32,
}

/// A warp-wide pure operation: `regs[d][l] = f(regs[a][l], regs[b][l], regs[c][l])` for every
/// lane `l` in `m`.
pub type WFn = fn(&mut [Lanes], Slots);

/// Runs the lane function `g` over the active lanes of `s` (see the module docs). Slots out of
/// range of `regs` (never produced by the decoder) leave the registers unchanged.
#[inline(always)]
pub fn lanewise(regs: &mut [Lanes], s: Slots, g: impl Fn(u64, u64, u64) -> u64) {
    let (d, a, b, c) = (s.d as usize, s.a as usize, s.b as usize, s.c as usize);
    let n = regs.len();
    if d >= n || a >= n || b >= n || c >= n {
        debug_assert!(false, "ALU slots {s:?} outside a register file of {n}");
        return;
    }
    let (lo, rest) = regs.split_at_mut(d);
    let Some((dst, hi)) = rest.split_first_mut() else {
        return;
    };
    if a != d && b != d && c != d {
        let row = |r: usize| if r < d { &lo[r] } else { &hi[r - d - 1] };
        rows_op(dst, [row(a), row(b), row(c)], s.m, &g);
    } else {
        // a source is the destination: read it from a copy taken before any lane is written
        let cur: Lanes = *dst;
        let row = |r: usize| {
            if r == d {
                &cur
            } else if r < d {
                &lo[r]
            } else {
                &hi[r - d - 1]
            }
        };
        rows_op(dst, [row(a), row(b), row(c)], s.m, &g);
    }
}

/// `dst[l] = g(x[l], y[l], z[l])` for the lanes `l` in `m` (inlined: the FMA kernel is compiled
/// with the `fma` target feature, which a separate function would not have).
#[inline(always)]
fn rows_op(dst: &mut Lanes, [x, y, z]: [&Lanes; 3], m: u32, g: &impl Fn(u64, u64, u64) -> u64) {
    if m == u32::MAX {
        for i in 0..32 {
            dst[i] = g(x[i], y[i], z[i]);
        }
    } else {
        for i in 0..32 {
            let v = g(x[i], y[i], z[i]);
            dst[i] = if m >> i & 1 != 0 { v } else { dst[i] };
        }
    }
}

/// A [`WFn`] running [`lanewise`] with the lane function `$g`, compiled twice: for the
/// baseline target, and with AVX2 (four 64-bit lanes per vector op instead of two), which
/// [`pick`] chooses when the CPU has it. Same results: the lane function is the same code.
macro_rules! lanes_fn {
    ($g:expr) => {{
        #[allow(clippy::unnecessary_cast, unused_parens, unused_variables)]
        fn f(r: &mut [Lanes], s: Slots) {
            lanewise(r, s, $g)
        }
        #[cfg(target_arch = "x86_64")]
        #[allow(clippy::unnecessary_cast, unused_parens, unused_variables)]
        #[target_feature(enable = "avx2")]
        fn f_avx2_impl(r: &mut [Lanes], s: Slots) {
            lanewise(r, s, $g)
        }
        #[cfg(target_arch = "x86_64")]
        fn f_avx2(r: &mut [Lanes], s: Slots) {
            // SAFETY: `pick` selects this only when the CPU reports AVX2.
            unsafe { f_avx2_impl(r, s) }
        }
        #[cfg(target_arch = "x86_64")]
        let picked = pick(f, f_avx2);
        #[cfg(not(target_arch = "x86_64"))]
        let picked = f as WFn;
        picked
    }};
}

thread_local! {
    /// Set (by tests, on their own thread) to decode the baseline functions even where AVX2
    /// is available, to compare the two.
    static SCALAR_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `simd` when the CPU has AVX2 (and this thread does not ask for the baseline), else `base`.
#[cfg(target_arch = "x86_64")]
fn pick(base: WFn, simd: WFn) -> WFn {
    if !SCALAR_ONLY.with(|c| c.get()) && std::is_x86_feature_detected!("avx2") {
        simd
    } else {
        base
    }
}

/// Runs `f` with the ALU functions it decodes on this thread being the baseline ones (for
/// tests comparing them with the SIMD ones).
#[cfg(test)]
pub(crate) fn scalar_only<R>(f: impl FnOnce() -> R) -> R {
    SCALAR_ONLY.with(|c| c.set(true));
    let r = f();
    SCALAR_ONLY.with(|c| c.set(false));
    r
}

macro_rules! w1 {
    ($T:ty, $U:ty, |$a:ident| $e:expr) => {
        lanes_fn!(|x, _, _| {
            let $a = x as $T;
            ($e) as $U as u64
        })
    };
}
macro_rules! w2 {
    ($T:ty, $U:ty, |$a:ident, $b:ident| $e:expr) => {
        lanes_fn!(|x, y, _| {
            let $a = x as $T;
            let $b = y as $T;
            ($e) as $U as u64
        })
    };
}
macro_rules! w3 {
    ($T:ty, $U:ty, |$a:ident, $b:ident, $c:ident| $e:expr) => {
        lanes_fn!(|x, y, z| {
            let $a = x as $T;
            let $b = y as $T;
            let $c = z as $T;
            ($e) as $U as u64
        })
    };
}
/// Raw u64 lanes in, u64 out (for ops that need mixed widths).
macro_rules! r3 {
    (|$a:ident, $b:ident, $c:ident| $e:expr) => {
        lanes_fn!(|$a, $b, $c| $e)
    };
}

/// Dispatch an integer type to a macro taking (signed-or-unsigned type, unsigned type, bits).
macro_rules! by_int {
    ($ty:expr, $m:ident $(, $extra:tt)*) => {
        match $ty {
            Ty::U8 | Ty::B8 => Some($m!(u8, u8, 8 $(, $extra)*)),
            Ty::S8 => Some($m!(i8, u8, 8 $(, $extra)*)),
            Ty::U16 | Ty::B16 => Some($m!(u16, u16, 16 $(, $extra)*)),
            Ty::S16 => Some($m!(i16, u16, 16 $(, $extra)*)),
            Ty::U32 | Ty::B32 => Some($m!(u32, u32, 32 $(, $extra)*)),
            Ty::S32 => Some($m!(i32, u32, 32 $(, $extra)*)),
            Ty::U64 | Ty::B64 => Some($m!(u64, u64, 64 $(, $extra)*)),
            Ty::S64 => Some($m!(i64, u64, 64 $(, $extra)*)),
            _ => None,
        }
    };
}

macro_rules! i_add {
    ($T:ty, $U:ty, $n:tt) => {
        w2!($T, $U, |a, b| a.wrapping_add(b))
    };
}
macro_rules! i_sub {
    ($T:ty, $U:ty, $n:tt) => {
        w2!($T, $U, |a, b| a.wrapping_sub(b))
    };
}
macro_rules! i_add_sat {
    ($T:ty, $U:ty, $n:tt) => {
        w2!($T, $U, |a, b| a.saturating_add(b))
    };
}
macro_rules! i_sub_sat {
    ($T:ty, $U:ty, $n:tt) => {
        w2!($T, $U, |a, b| a.saturating_sub(b))
    };
}
macro_rules! i_mul_lo {
    ($T:ty, $U:ty, $n:tt) => {
        w2!($T, $U, |a, b| a.wrapping_mul(b))
    };
}
macro_rules! i_mul_hi {
    ($T:ty, $U:ty, $n:tt) => {
        w2!($T, $U, |a, b| ((a as i128).wrapping_mul(b as i128) >> $n)
            as $T)
    };
}
macro_rules! i_mul_wide {
    ($T:ty, $U:ty, $n:tt) => {
        w2!($T, u64, |a, b| ((a as i128).wrapping_mul(b as i128) as u64)
            & (u64::MAX >> (64 - (2 * $n).min(64))))
    };
}
macro_rules! i_mad_lo {
    ($T:ty, $U:ty, $n:tt) => {
        w3!($T, $U, |a, b, c| a.wrapping_mul(b).wrapping_add(c))
    };
}
macro_rules! i_mad_hi {
    ($T:ty, $U:ty, $n:tt) => {
        w3!($T, $U, |a, b, c| {
            ((((a as i128).wrapping_mul(b as i128)) >> $n) as $T).wrapping_add(c)
        })
    };
}
macro_rules! i_min {
    ($T:ty, $U:ty, $n:tt) => {
        w2!($T, $U, |a, b| if a < b { a } else { b })
    };
}
macro_rules! i_max {
    ($T:ty, $U:ty, $n:tt) => {
        w2!($T, $U, |a, b| if a > b { a } else { b })
    };
}
macro_rules! i_abs {
    ($T:ty, $U:ty, $n:tt) => {
        w1!($T, $U, |a| if a < (0 as $T) {
            (0 as $T).wrapping_sub(a)
        } else {
            a
        })
    };
}
macro_rules! i_neg {
    ($T:ty, $U:ty, $n:tt) => {
        w1!($T, $U, |a| (0 as $T).wrapping_sub(a))
    };
}
macro_rules! i_and {
    ($T:ty, $U:ty, $n:tt) => {
        w2!($U, $U, |a, b| a & b)
    };
}
macro_rules! i_or {
    ($T:ty, $U:ty, $n:tt) => {
        w2!($U, $U, |a, b| a | b)
    };
}
macro_rules! i_xor {
    ($T:ty, $U:ty, $n:tt) => {
        w2!($U, $U, |a, b| a ^ b)
    };
}
macro_rules! i_not {
    ($T:ty, $U:ty, $n:tt) => {
        w1!($U, $U, |a| !a)
    };
}
macro_rules! i_cnot {
    ($T:ty, $U:ty, $n:tt) => {
        w1!($U, $U, |a| (a == 0) as $U)
    };
}
macro_rules! i_shl {
    ($T:ty, $U:ty, $n:tt) => {
        r3!(|a, b, c| {
            let s = b as u32;
            if s >= $n {
                0
            } else {
                ((a as $U) << s) as u64
            }
        })
    };
}
macro_rules! i_shr {
    ($T:ty, $U:ty, $n:tt) => {
        r3!(|a, b, c| {
            let s = b as u32;
            let v = a as $T;
            // Signed shifts fill with the sign bit past the width; unsigned ones give 0.
            let r = if <$T>::MIN != (0 as $T) {
                v >> s.min($n - 1)
            } else if s >= $n {
                0 as $T
            } else {
                v >> s
            };
            (r as $U) as u64
        })
    };
}
macro_rules! i_popc {
    ($T:ty, $U:ty, $n:tt) => {
        w1!($U, u32, |a| a.count_ones())
    };
}
macro_rules! i_clz {
    ($T:ty, $U:ty, $n:tt) => {
        w1!($U, u32, |a| a.leading_zeros())
    };
}
macro_rules! i_brev {
    ($T:ty, $U:ty, $n:tt) => {
        w1!($U, $U, |a| a.reverse_bits())
    };
}
macro_rules! i_bfind {
    ($T:ty, $U:ty, $n:tt) => {
        w1!($T, u32, |a| {
            // Signed: position of the most significant bit that differs from the sign bit.
            let v = if a < (0 as $T) { !a } else { a } as $U;
            if v == 0 {
                u32::MAX
            } else {
                $n - 1 - v.leading_zeros()
            }
        })
    };
}
macro_rules! i_bfind_shiftamt {
    ($T:ty, $U:ty, $n:tt) => {
        w1!($T, u32, |a| {
            let v = if a < (0 as $T) { !a } else { a } as $U;
            if v == 0 {
                u32::MAX
            } else {
                v.leading_zeros()
            }
        })
    };
}
macro_rules! i_bfe {
    ($T:ty, $U:ty, $n:tt) => {
        r3!(|a, b, c| {
            let pos = (b & 0xff) as u32;
            let len = (c & 0xff) as u32;
            let v = a as $U as u64;
            let signed = <$T>::MIN != (0 as $T);
            let msb = if len == 0 {
                0
            } else {
                (pos + len - 1).min($n - 1)
            };
            let sbit = if signed && len > 0 { (v >> msb) & 1 } else { 0 };
            // bits 0..k are the field (bit i taken while i < len and pos + i < n); the rest,
            // up to n, are the sign bit
            let k = if pos >= $n { 0 } else { len.min($n - pos) };
            let low = if k >= 64 { u64::MAX } else { (1u64 << k) - 1 };
            let field = if k == 0 { 0 } else { (v >> pos) & low };
            let d = if sbit != 0 { field | !low } else { field };
            (d as $U) as u64
        })
    };
}
macro_rules! cmp_int {
    ($T:ty, $U:ty, $n:tt, $op:tt) => { w2!($T, u8, |a, b| (a $op b) as u8) };
}

/// Integer/bit ALU functions for the common opcodes. `None` when the combination is not an
/// integer op handled here.
pub fn int_fn(ins: &Instruction) -> Option<WFn> {
    let ty = ins.ty()?;
    let sat = ins.has(Flag::Sat);
    use Opcode::*;
    match ins.op {
        Add if sat && ty == Ty::S32 => by_int!(ty, i_add_sat),
        Sub if sat && ty == Ty::S32 => by_int!(ty, i_sub_sat),
        Add => by_int!(ty, i_add),
        Sub => by_int!(ty, i_sub),
        Mul if ins.has(Flag::Wide) => by_int!(ty, i_mul_wide),
        Mul if ins.has(Flag::Hi) => by_int!(ty, i_mul_hi),
        Mul => by_int!(ty, i_mul_lo),
        Mad if ins.has(Flag::Wide) => match ty {
            Ty::U16 => Some(r3!(|a, b, c| ((a as u16 as u32) * (b as u16 as u32))
                .wrapping_add(c as u32)
                as u64)),
            Ty::S16 => Some(r3!(|a, b, c| ((a as i16 as i32) * (b as i16 as i32))
                .wrapping_add(c as i32) as u32
                as u64)),
            Ty::U32 => Some(r3!(
                |a, b, c| ((a as u32 as u64) * (b as u32 as u64)).wrapping_add(c)
            )),
            Ty::S32 => Some(r3!(|a, b, c| ((a as i32 as i64) * (b as i32 as i64))
                .wrapping_add(c as i64)
                as u64)),
            _ => None,
        },
        Mad if ins.has(Flag::Hi) => by_int!(ty, i_mad_hi),
        Mad => by_int!(ty, i_mad_lo),
        Min => by_int!(ty, i_min),
        Max => by_int!(ty, i_max),
        Abs => by_int!(ty, i_abs),
        Neg => by_int!(ty, i_neg),
        And if ty == Ty::Pred => Some(r3!(|a, b, c| a & b & 1)),
        Or if ty == Ty::Pred => Some(r3!(|a, b, c| (a | b) & 1)),
        Xor if ty == Ty::Pred => Some(r3!(|a, b, c| (a ^ b) & 1)),
        Not if ty == Ty::Pred => Some(r3!(|a, b, c| (a ^ 1) & 1)),
        And => by_int!(ty, i_and),
        Or => by_int!(ty, i_or),
        Xor => by_int!(ty, i_xor),
        Not => by_int!(ty, i_not),
        Cnot => by_int!(ty, i_cnot),
        Shl => by_int!(ty, i_shl),
        Shr => by_int!(ty, i_shr),
        Popc => by_int!(ty, i_popc),
        Clz => by_int!(ty, i_clz),
        Brev => by_int!(ty, i_brev),
        Bfind if ins.has(Flag::Shiftamt) => by_int!(ty, i_bfind_shiftamt),
        Bfind => by_int!(ty, i_bfind),
        Bfe => by_int!(ty, i_bfe),
        Bfi => None, // four sources: handled by the decoder as a special op
        Mul24 if ins.has(Flag::Hi) => match ty {
            Ty::U32 => Some(r3!(|a, b, c| ((((a as u32 & 0xff_ffff) as u64)
                * ((b as u32 & 0xff_ffff) as u64))
                >> 16) as u32 as u64)),
            Ty::S32 => Some(r3!(|a, b, c| ((sx24(a) * sx24(b)) >> 16) as u32 as u64)),
            _ => None,
        },
        Mul24 => match ty {
            Ty::U32 => Some(r3!(|a, b, c| ((a as u32 & 0xff_ffff)
                .wrapping_mul(b as u32 & 0xff_ffff))
                as u64)),
            Ty::S32 => Some(r3!(|a, b, c| (sx24(a).wrapping_mul(sx24(b))) as u32 as u64)),
            _ => None,
        },
        // bits 47..16 of the 48-bit product plus c; `.sat` (s32 only) clamps the sum
        Mad24 if ins.has(Flag::Hi) => match (ty, ins.has(Flag::Sat)) {
            (Ty::U32, false) => Some(r3!(|a, b, c| {
                let p = (a & 0xff_ffff) * (b & 0xff_ffff);
                ((p >> 16) as u32).wrapping_add(c as u32) as u64
            })),
            (Ty::S32, false) => Some(r3!(|a, b, c| (((sx24(a) * sx24(b)) >> 16) as u32)
                .wrapping_add(c as u32)
                as u64)),
            (Ty::S32, true) => Some(r3!(|a, b, c| {
                let s = ((sx24(a) * sx24(b)) >> 16) as i32 as i64 + c as i32 as i64;
                s.clamp(i32::MIN as i64, i32::MAX as i64) as i32 as u32 as u64
            })),
            _ => None,
        },
        Mad24 if !ins.has(Flag::Hi) => match ty {
            Ty::U32 => Some(r3!(|a, b, c| ((a as u32 & 0xff_ffff)
                .wrapping_mul(b as u32 & 0xff_ffff))
            .wrapping_add(c as u32) as u64)),
            Ty::S32 => Some(r3!(|a, b, c| (sx24(a).wrapping_mul(sx24(b)) as u32)
                .wrapping_add(c as u32)
                as u64)),
            _ => None,
        },
        Sad => match ty {
            Ty::U32 => Some(r3!(
                |a, b, c| ((a as u32).abs_diff(b as u32)).wrapping_add(c as u32) as u64
            )),
            Ty::S32 => Some(r3!(
                |a, b, c| ((a as i32).abs_diff(b as i32)).wrapping_add(c as u32) as u64
            )),
            Ty::U64 => Some(r3!(|a, b, c| a.abs_diff(b).wrapping_add(c))),
            Ty::S64 => Some(r3!(|a, b, c| (a as i64).abs_diff(b as i64).wrapping_add(c))),
            _ => None,
        },
        Prmt => Some(prmt_fn(ins)),
        Dp2a => dp2a_fn(ins),
        Fns if ty == Ty::B32 => Some(r3!(|a, b, c| fns(a as u32, b as u32, c as u32) as u64)),
        Bmsk if ty == Ty::B32 => Some(match (ins.has(Flag::Clamp), ins.has(Flag::Wrap)) {
            (true, false) => r3!(|a, b, c| bmsk(a as u32, b as u32, true) as u64),
            (false, true) => r3!(|a, b, c| bmsk(a as u32, b as u32, false) as u64),
            _ => return None,
        }),
        Szext => {
            let clamp = match (ins.has(Flag::Clamp), ins.has(Flag::Wrap)) {
                (true, false) => true,
                (false, true) => false,
                _ => return None,
            };
            Some(match (ty, clamp) {
                (Ty::U32, true) => r3!(|a, b, c| szext(a as u32, b as u32, true, false) as u64),
                (Ty::U32, false) => r3!(|a, b, c| szext(a as u32, b as u32, false, false) as u64),
                (Ty::S32, true) => r3!(|a, b, c| szext(a as u32, b as u32, true, true) as u64),
                (Ty::S32, false) => r3!(|a, b, c| szext(a as u32, b as u32, false, true) as u64),
                _ => return None,
            })
        }
        Dp4a => {
            let tys: Vec<Ty> = ins.types().collect();
            match (tys.first(), tys.get(1)) {
                (Some(Ty::U32), Some(Ty::U32)) => Some(r3!(|a, b, c| dp4a(
                    a as u32, b as u32, c as u32, false, false
                ) as u64)),
                (Some(Ty::S32), Some(Ty::S32)) => Some(r3!(|a, b, c| dp4a(
                    a as u32, b as u32, c as u32, true, true
                ) as u64)),
                (Some(Ty::U32), Some(Ty::S32)) => Some(r3!(|a, b, c| dp4a(
                    a as u32, b as u32, c as u32, false, true
                ) as u64)),
                (Some(Ty::S32), Some(Ty::U32)) => Some(r3!(|a, b, c| dp4a(
                    a as u32, b as u32, c as u32, true, false
                ) as u64)),
                _ => None,
            }
        }
        _ => None,
    }
}

fn sx24(a: u64) -> i64 {
    (((a as u32) << 8) as i32 >> 8) as i64
}

/// `prmt.b32` default mode: select bytes of {b, a} by the four nibbles of c (msb replicate on bit 3).
pub fn prmt(a: u32, b: u32, c: u32) -> u32 {
    let bytes = ((b as u64) << 32 | a as u64).to_le_bytes();
    let mut d = 0u32;
    for i in 0..4 {
        let sel = (c >> (4 * i)) & 0xf;
        let byte = bytes[(sel & 7) as usize];
        let v = if sel & 8 != 0 {
            if byte & 0x80 != 0 {
                0xff
            } else {
                0
            }
        } else {
            byte
        };
        d |= (v as u32) << (8 * i);
    }
    d
}

/// `prmt.b32.mode`: the source byte (of `{b, a}`) for each result byte, per mode and `c & 3`,
/// as tabled in the PTX ISA (`.f4e .b4e .rc8 .ecl .ecr .rc16`), result byte 0 first.
const PRMT_MODES: [[[u8; 4]; 4]; 6] = [
    // f4e: forward 4 extract
    [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]],
    // b4e: backward 4 extract
    [[0, 7, 6, 5], [1, 0, 7, 6], [2, 1, 0, 7], [3, 2, 1, 0]],
    // rc8: replicate 8
    [[0, 0, 0, 0], [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]],
    // ecl: edge clamp left
    [[0, 1, 2, 3], [1, 1, 2, 3], [2, 2, 2, 3], [3, 3, 3, 3]],
    // ecr: edge clamp right
    [[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 2, 2], [0, 1, 2, 3]],
    // rc16: replicate 16
    [[0, 1, 0, 1], [2, 3, 2, 3], [0, 1, 0, 1], [2, 3, 2, 3]],
];

/// `prmt.b32.mode d, a, b, c` for mode `M` (an index into [`PRMT_MODES`]).
fn prmt_mode<const M: usize>(r: &mut [Lanes], s: Slots) {
    lanewise(r, s, |x, y, z| {
        let bytes = ((y as u32 as u64) << 32 | x as u32 as u64).to_le_bytes();
        let sel = &PRMT_MODES[M][(z & 3) as usize];
        let mut d = 0u32;
        for (k, s) in sel.iter().enumerate() {
            d |= (bytes[*s as usize] as u32) << (8 * k);
        }
        d as u64
    })
}

fn prmt_fn(ins: &Instruction) -> WFn {
    let modes = [
        Flag::F4e,
        Flag::B4e,
        Flag::Rc8,
        Flag::Ecl,
        Flag::Ecr,
        Flag::Rc16,
    ];
    match modes.iter().position(|f| ins.has(*f)) {
        Some(0) => prmt_mode::<0>,
        Some(1) => prmt_mode::<1>,
        Some(2) => prmt_mode::<2>,
        Some(3) => prmt_mode::<3>,
        Some(4) => prmt_mode::<4>,
        Some(5) => prmt_mode::<5>,
        _ => prmt_default,
    }
}

/// A decoded `prmt` selector: per result byte, the shift that brings its source byte of
/// `{b, a}` (or, for a sign-replicating nibble, that byte's sign bit) to bit 0, the mask of a
/// plain byte (0xff, or 0 when replicating) and of a replicated sign (0 or 0xff).
type PrmtSel = [(u32, u64, u64); 4];

/// Decodes the four selector nibbles of `c`.
#[inline(always)]
fn prmt_decode(c: u32) -> PrmtSel {
    std::array::from_fn(|i| {
        let sel = (c >> (4 * i)) & 0xf;
        let sh = 8 * (sel & 7);
        if sel & 8 != 0 {
            (sh + 7, 0, 0xff)
        } else {
            (sh, 0xff, 0)
        }
    })
}

/// [`prmt`] with a decoded selector (the same bits), branch-free.
#[inline(always)]
fn prmt_with(a: u32, b: u32, sel: &PrmtSel) -> u32 {
    let x = (b as u64) << 32 | a as u64;
    let mut d = 0u64;
    for (i, &(sh, byte, sign)) in sel.iter().enumerate() {
        let t = x >> sh;
        let v = (t & byte) | (0u64.wrapping_sub(t & 1) & sign);
        d |= v << (8 * i);
    }
    d as u32
}

/// `prmt.b32` default mode. Compilers pass the selector as an immediate, the same in every
/// lane: it is then decoded once for the warp.
fn prmt_default(r: &mut [Lanes], s: Slots) {
    let uniform = r.get(s.c as usize).and_then(|z| {
        z.iter()
            .all(|&v| v as u16 == z[0] as u16)
            .then_some(z[0] as u32)
    });
    match uniform {
        Some(c) => {
            let sel = prmt_decode(c);
            lanewise(r, s, |a, b, _| prmt_with(a as u32, b as u32, &sel) as u64)
        }
        None => lanewise(r, s, |a, b, c| {
            prmt_with(a as u32, b as u32, &prmt_decode(c as u32)) as u64
        }),
    }
}

/// `dp2a.{lo,hi}.atype.btype d, a, b, c`: two signed/unsigned half-words of `a` times two
/// bytes of `b` (its low or high pair), plus `c`.
fn dp2a_lanes<const SA: bool, const SB: bool, const HI: bool>(r: &mut [Lanes], s: Slots) {
    lanewise(r, s, |x, y, z| {
        let (a, b) = (x as u32, y as u32);
        let mut acc = z as u32;
        for k in 0..2 {
            let h = (a >> (16 * k)) as u16;
            let va = if SA { h as i16 as i32 } else { h as i32 };
            let byte = (b >> (8 * (k + if HI { 2 } else { 0 }))) as u8;
            let vb = if SB { byte as i8 as i32 } else { byte as i32 };
            acc = acc.wrapping_add(va.wrapping_mul(vb) as u32);
        }
        acc as u64
    })
}

fn dp2a_fn(ins: &Instruction) -> Option<WFn> {
    let tys: Vec<Ty> = ins.types().collect();
    let signed = |t: Option<&Ty>| match t {
        Some(Ty::U32) => Some(false),
        Some(Ty::S32) => Some(true),
        _ => None,
    };
    let (sa, sb) = (signed(tys.first())?, signed(tys.get(1))?);
    let hi = match (ins.has(Flag::Lo), ins.has(Flag::Hi)) {
        (true, false) => false,
        (false, true) => true,
        _ => return None,
    };
    Some(match (sa, sb, hi) {
        (false, false, false) => dp2a_lanes::<false, false, false>,
        (false, false, true) => dp2a_lanes::<false, false, true>,
        (false, true, false) => dp2a_lanes::<false, true, false>,
        (false, true, true) => dp2a_lanes::<false, true, true>,
        (true, false, false) => dp2a_lanes::<true, false, false>,
        (true, false, true) => dp2a_lanes::<true, false, true>,
        (true, true, false) => dp2a_lanes::<true, true, false>,
        (true, true, true) => dp2a_lanes::<true, true, true>,
    })
}

/// `fns.b32 d, mask, base, offset`: the position of the `offset`-th set bit of `mask` counting
/// from `base` (upwards for positive, downwards for negative offsets; `base` itself for 0),
/// 0xffffffff when there is none. A base above 31 is undefined in PTX; it finds nothing here.
pub fn fns(mask: u32, base: u32, offset: u32) -> u32 {
    let offset = offset as i32;
    if base > 31 {
        return u32::MAX;
    }
    if offset == 0 {
        return if (mask >> base) & 1 == 1 {
            base
        } else {
            u32::MAX
        };
    }
    let inc: i64 = if offset > 0 { 1 } else { -1 };
    let mut count = offset.unsigned_abs() - 1;
    let mut pos = base as i64;
    while (0..32).contains(&pos) {
        if (mask >> pos) & 1 == 1 {
            if count == 0 {
                return pos as u32;
            }
            count -= 1;
        }
        pos += inc;
    }
    u32::MAX
}

/// `bmsk.{clamp,wrap}.b32 d, a, b`: `b` one-bits starting at bit `a`.
pub fn bmsk(a: u32, b: u32, clamp: bool) -> u32 {
    let a1 = a & 0x1f;
    let b1 = b & 0x1f;
    let mut mask0 = u32::MAX << a1;
    let sum = a1 + b1;
    let mut overflow = sum >= 32;
    if clamp {
        if a >= 32 {
            overflow = true;
            mask0 = 0;
        }
        if b >= 32 {
            overflow = true;
        }
    }
    let mask1 = if overflow {
        0
    } else if b1 == 0 {
        u32::MAX
    } else {
        u32::MAX << sum
    };
    mask0 & !mask1
}

/// `szext.{clamp,wrap}.{u32,s32} d, a, b`: sign- or zero-extends the low `b` bits of `a`.
pub fn szext(a: u32, b: u32, clamp: bool, signed: bool) -> u32 {
    let b1 = b & 0x1f;
    let too_large = b >= 32 && clamp;
    let mask = if too_large { 0 } else { u32::MAX << b1 };
    let sign_pos = b1.wrapping_sub(1) & 0x1f;
    let sign = !(b1 == 0 || too_large || !signed) && (a >> sign_pos) & 1 == 1;
    (a & !mask) | if sign { mask } else { 0 }
}

/// `cvt.pack.sat.{u16,s16}.s32 d, a, b` and `cvt.pack.sat.{u8,s8}.s32.b32 d, a, b, c`: `a` and
/// `b` saturated to the narrow type, `b` in the low field, `a` above it, the rest of `d` from
/// the low bits of `c`.
pub fn cvt_pack(ins: &Instruction) -> Option<WFn> {
    let tys: Vec<Ty> = ins.types().collect();
    if !ins.has(Flag::Sat) || tys.get(1) != Some(&Ty::S32) {
        return None;
    }
    Some(match (tys[0], tys.len()) {
        (Ty::U16, 2) => r3!(|a, b, c| pack_sat(a, b, c, 16, false)),
        (Ty::S16, 2) => r3!(|a, b, c| pack_sat(a, b, c, 16, true)),
        (Ty::U8, 3) => r3!(|a, b, c| pack_sat(a, b, c, 8, false)),
        (Ty::S8, 3) => r3!(|a, b, c| pack_sat(a, b, c, 8, true)),
        (Ty::U4, 3) => r3!(|a, b, c| pack_sat(a, b, c, 4, false)),
        (Ty::S4, 3) => r3!(|a, b, c| pack_sat(a, b, c, 4, true)),
        (Ty::U2, 3) => r3!(|a, b, c| pack_sat(a, b, c, 2, false)),
        (Ty::S2, 3) => r3!(|a, b, c| pack_sat(a, b, c, 2, true)),
        _ => return None,
    })
}

fn pack_sat(a: u64, b: u64, c: u64, bits: u32, signed: bool) -> u64 {
    let (lo, hi) = if signed {
        (-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1)
    } else {
        (0, (1i64 << bits) - 1)
    };
    let m = (1u64 << bits) - 1;
    let sat = |x: u64| ((x as u32 as i32 as i64).clamp(lo, hi) as u64) & m;
    let low = (sat(a) << bits) | sat(b);
    ((low | (c << (2 * bits))) as u32) as u64
}

fn dp4a(a: u32, b: u32, c: u32, sa: bool, sb: bool) -> u32 {
    let mut acc = c as i64;
    for i in 0..4 {
        let x = (a >> (8 * i)) as u8;
        let y = (b >> (8 * i)) as u8;
        let x = if sa { x as i8 as i64 } else { x as i64 };
        let y = if sb { y as i8 as i64 } else { y as i64 };
        acc += x * y;
    }
    acc as u32
}

/// `bfi.bN d, a, b, c(pos), len`: insert the low `len` bits of a into b at `pos`.
pub fn bfi(a: u64, b: u64, pos: u64, len: u64, bits: u32) -> u64 {
    let pos = (pos & 0xff) as u32;
    let len = (len & 0xff) as u32;
    let mut d = b;
    for i in 0..len {
        let p = pos + i;
        if p >= bits {
            break;
        }
        d = (d & !(1 << p)) | (((a >> i) & 1) << p);
    }
    d & crate::memory::mask(bits / 8)
}

/// `shf.{l,r}.{wrap,clamp}.b32 d, a, b, c`: funnel shift of {b:a}.
pub fn shf(a: u64, b: u64, c: u64, left: bool, wrap: bool) -> u64 {
    let n = if wrap {
        (c as u32) & 31
    } else {
        (c as u32).min(32)
    };
    let v = ((b as u32 as u64) << 32) | a as u32 as u64;
    if left {
        ((v << n) >> 32) as u32 as u64
    } else {
        (v >> n) as u32 as u64
    }
}

/// `lop3.b32 d, a, b, c, lut`.
pub fn lop3(a: u32, b: u32, c: u32, lut: u8) -> u32 {
    let mut d = 0u32;
    for i in 0..32 {
        let idx = (((a >> i) & 1) << 2) | (((b >> i) & 1) << 1) | ((c >> i) & 1);
        d |= (((lut >> idx) & 1) as u32) << i;
    }
    d
}

/// Is `f` a comparison operator of `setp`/`set`?
pub fn is_comparison(f: Flag) -> bool {
    matches!(
        f,
        Flag::Eq
            | Flag::Ne
            | Flag::Lt
            | Flag::Le
            | Flag::Gt
            | Flag::Ge
            | Flag::Lo
            | Flag::Ls
            | Flag::Hi
            | Flag::Hs
            | Flag::Equ
            | Flag::Neu
            | Flag::Ltu
            | Flag::Leu
            | Flag::Gtu
            | Flag::Geu
            | Flag::Num
            | Flag::Nan
    )
}

/// Integer comparison for `setp`/`set`: returns a WFn producing 0/1.
pub fn int_cmp(ty: Ty, cmp: Flag) -> Option<WFn> {
    macro_rules! c {
        ($op:tt) => {
            by_int!(ty, cmp_int, $op)
        };
    }
    let unsigned_view = |t: Ty| match t {
        Ty::S8 => Ty::U8,
        Ty::S16 => Ty::U16,
        Ty::S32 => Ty::U32,
        Ty::S64 => Ty::U64,
        t => t,
    };
    match cmp {
        Flag::Eq => c!(==),
        Flag::Ne => c!(!=),
        Flag::Lt => c!(<),
        Flag::Le => c!(<=),
        Flag::Gt => c!(>),
        Flag::Ge => c!(>=),
        Flag::Lo => int_cmp(unsigned_view(ty), Flag::Lt),
        Flag::Ls => int_cmp(unsigned_view(ty), Flag::Le),
        Flag::Hi => int_cmp(unsigned_view(ty), Flag::Gt),
        Flag::Hs => int_cmp(unsigned_view(ty), Flag::Ge),
        _ => None,
    }
}

/// Float comparisons on f32 / f64 / f16 / bf16. The unordered forms are written as negated
/// ordered comparisons on purpose: they must be true when either operand is NaN.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
pub fn float_cmp(ty: Ty, cmp: Flag) -> Option<WFn> {
    macro_rules! fc {
        ($conv:expr, |$a:ident, $b:ident| $e:expr) => {{
            fn f(r: &mut [Lanes], s: Slots) {
                lanewise(r, s, |x, y, _| {
                    let $a = $conv(x);
                    let $b = $conv(y);
                    ($e) as u64
                })
            }
            Some(f as WFn)
        }};
    }
    macro_rules! all {
        ($conv:expr) => {
            match cmp {
                Flag::Eq => fc!($conv, |a, b| a == b),
                Flag::Ne => fc!($conv, |a, b| a != b && !a.is_nan() && !b.is_nan()),
                Flag::Lt => fc!($conv, |a, b| a < b),
                Flag::Le => fc!($conv, |a, b| a <= b),
                Flag::Gt => fc!($conv, |a, b| a > b),
                Flag::Ge => fc!($conv, |a, b| a >= b),
                Flag::Equ => fc!($conv, |a, b| a == b || a.is_nan() || b.is_nan()),
                Flag::Neu => fc!($conv, |a, b| a != b),
                Flag::Ltu => fc!($conv, |a, b| !(a >= b)),
                Flag::Leu => fc!($conv, |a, b| !(a > b)),
                Flag::Gtu => fc!($conv, |a, b| !(a <= b)),
                Flag::Geu => fc!($conv, |a, b| !(a < b)),
                Flag::Num => fc!($conv, |a, b| !a.is_nan() && !b.is_nan()),
                Flag::Nan => fc!($conv, |a, b| a.is_nan() || b.is_nan()),
                _ => None,
            }
        };
    }
    match ty {
        Ty::F32 => all!(|v: u64| f32::from_bits(v as u32)),
        Ty::F64 => all!(f64::from_bits),
        Ty::F16 => all!(|v: u64| half::f16::from_bits(v as u16).to_f32()),
        Ty::Bf16 => all!(|v: u64| half::bf16::from_bits(v as u16).to_f32()),
        _ => None,
    }
}

/// Value of a float operand for the comparisons of [`float_cmp_elem`]: `K` picks the format,
/// the half of a packed pair and flushing (0: f32, 1: f32 ftz, 2/3: f16 low/high, 4/5: bf16
/// low/high, 6/7: f16 low/high ftz).
#[inline(always)]
fn cmp_elem<const K: u8>(v: u64) -> f32 {
    let x = match K {
        0 | 1 => f32::from_bits(v as u32),
        2 | 6 => half::f16::from_bits(v as u16).to_f32(),
        3 | 7 => half::f16::from_bits((v >> 16) as u16).to_f32(),
        4 => half::bf16::from_bits(v as u16).to_f32(),
        _ => half::bf16::from_bits((v >> 16) as u16).to_f32(),
    };
    match K {
        1 => flush(x),
        // f16 subnormals are below 2^-14
        6 | 7 if x.abs() < 6.103_515_6e-5 => 0.0,
        _ => x,
    }
}

/// Comparison `C` (0..14: eq ne lt le gt ge equ neu ltu leu gtu geu num nan) of two floats;
/// the unordered forms are true when either operand is NaN.
#[inline(always)]
#[allow(clippy::neg_cmp_op_on_partial_ord)]
fn fcmp<const C: u8>(a: f32, b: f32) -> bool {
    let nan = a.is_nan() || b.is_nan();
    match C {
        0 => a == b,
        1 => a != b && !nan,
        2 => a < b,
        3 => a <= b,
        4 => a > b,
        5 => a >= b,
        6 => a == b || nan,
        7 => a != b,
        8 => !(a >= b),
        9 => !(a > b),
        10 => !(a <= b),
        11 => !(a < b),
        12 => !nan,
        _ => nan,
    }
}

fn cmp_lanes<const K: u8, const C: u8>(r: &mut [Lanes], s: Slots) {
    lanewise(r, s, |x, y, _| {
        fcmp::<C>(cmp_elem::<K>(x), cmp_elem::<K>(y)) as u64
    })
}

fn cmp_pick<const K: u8>(cmp: Flag) -> Option<WFn> {
    Some(match cmp {
        Flag::Eq => cmp_lanes::<K, 0>,
        Flag::Ne => cmp_lanes::<K, 1>,
        Flag::Lt => cmp_lanes::<K, 2>,
        Flag::Le => cmp_lanes::<K, 3>,
        Flag::Gt => cmp_lanes::<K, 4>,
        Flag::Ge => cmp_lanes::<K, 5>,
        Flag::Equ => cmp_lanes::<K, 6>,
        Flag::Neu => cmp_lanes::<K, 7>,
        Flag::Ltu => cmp_lanes::<K, 8>,
        Flag::Leu => cmp_lanes::<K, 9>,
        Flag::Gtu => cmp_lanes::<K, 10>,
        Flag::Geu => cmp_lanes::<K, 11>,
        Flag::Num => cmp_lanes::<K, 12>,
        Flag::Nan => cmp_lanes::<K, 13>,
        _ => return None,
    })
}

/// Float comparison of one element: f32 (with `.ftz`), f16 (with `.ftz`) or bf16, scalar or
/// the low/high (`hi`) half of an `f16x2`/`bf16x2` pair.
pub fn float_cmp_elem(ty: Ty, hi: bool, ftz: bool, cmp: Flag) -> Option<WFn> {
    match (ty, hi, ftz) {
        (Ty::F32, _, false) => cmp_pick::<0>(cmp),
        (Ty::F32, _, true) => cmp_pick::<1>(cmp),
        (Ty::F16 | Ty::F16x2, false, false) => cmp_pick::<2>(cmp),
        (Ty::F16 | Ty::F16x2, true, false) => cmp_pick::<3>(cmp),
        (Ty::F16 | Ty::F16x2, false, true) => cmp_pick::<6>(cmp),
        (Ty::F16 | Ty::F16x2, true, true) => cmp_pick::<7>(cmp),
        (Ty::Bf16 | Ty::Bf16x2, false, _) => cmp_pick::<4>(cmp),
        (Ty::Bf16 | Ty::Bf16x2, true, _) => cmp_pick::<5>(cmp),
        _ => None,
    }
}

/// `set` result for destination type `dty` when the predicate in `a` is true: 1.0 in a float
/// destination, all ones in an integer one.
pub fn set_result_ty(dty: Ty) -> WFn {
    match dty {
        Ty::F32 => r3!(|a, b, c| if a & 1 != 0 { 0x3f80_0000 } else { 0 }),
        Ty::F16 => r3!(|a, b, c| if a & 1 != 0 { 0x3c00 } else { 0 }),
        Ty::Bf16 => r3!(|a, b, c| if a & 1 != 0 { 0x3f80 } else { 0 }),
        Ty::U16 | Ty::S16 | Ty::B16 => r3!(|a, b, c| if a & 1 != 0 { 0xffff } else { 0 }),
        _ => r3!(|a, b, c| if a & 1 != 0 { 0xffff_ffff } else { 0 }),
    }
}

/// Packed `set` result: the predicates of the low (`a`) and high (`b`) halves, each giving 1.0
/// (`f16x2`, `bf16x2` destinations) or 0xffff (integer destinations) in its half.
pub fn set_result_x2(dty: Ty) -> WFn {
    match dty {
        Ty::F16x2 => r3!(|a, b, c| ((a & 1) * 0x3c00) | ((b & 1) * 0x3c00_0000)),
        Ty::Bf16x2 => r3!(|a, b, c| ((a & 1) * 0x3f80) | ((b & 1) * 0x3f80_0000)),
        _ => r3!(|a, b, c| ((a & 1) * 0xffff) | ((b & 1) * 0xffff_0000)),
    }
}

/// Boolean combine of `setp ... .and/.or/.xor` with the third predicate source; `neg_a` applies
/// to the comparison result (for the second `|q` output).
pub fn bool_combine(op: Flag, neg_a: bool) -> WFn {
    match (op, neg_a) {
        (Flag::And, false) => r3!(|a, b, c| a & b & 1),
        (Flag::Or, false) => r3!(|a, b, c| (a | b) & 1),
        (Flag::Xor, false) => r3!(|a, b, c| (a ^ b) & 1),
        (Flag::And, true) => r3!(|a, b, c| (a ^ 1) & b & 1),
        (Flag::Or, true) => r3!(|a, b, c| ((a ^ 1) | b) & 1),
        (Flag::Xor, true) => r3!(|a, b, c| (a ^ 1 ^ b) & 1),
        (_, false) => r3!(|a, b, c| a & 1),
        (_, true) => r3!(|a, b, c| (a ^ 1) & 1),
    }
}

/// `selp d, a, b, p`: a if p else b.
/// `fma.oob` (sm_90): per 16-bit half, all ones unless one of the three inputs holds the
/// out-of-bounds NaN 0x7fff there (the result of that half is then +0.0).
pub fn oob_keep_mask() -> WFn {
    r3!(|a, b, c| {
        let keep = |h: u32| {
            let oob = [a, b, c].iter().any(|x| (x >> h) as u16 == 0x7fff);
            if oob {
                0
            } else {
                0xffffu64 << h
            }
        };
        keep(0) | keep(16)
    })
}

/// `d = a & b` on raw bits (applies a mask such as [`oob_keep_mask`]'s).
pub fn and_bits() -> WFn {
    r3!(|a, b, c| a & b)
}

pub fn selp() -> WFn {
    r3!(|a, b, c| if c & 1 != 0 { a } else { b })
}

/// Plain copy (`mov`), masked to `bytes`.
pub fn mov(bytes: u32) -> WFn {
    match bytes {
        1 => r3!(|a, b, c| a & 0xff),
        2 => r3!(|a, b, c| a & 0xffff),
        4 => r3!(|a, b, c| a & 0xffff_ffff),
        _ => r3!(|a, b, c| a),
    }
}

/// `mov.bN d, {a, b}`: two parts of `bits` (8, 16 or 32) each, `a` in the low half (`None`
/// for other widths). Lane-parallel, so the common pack of two halves runs as an ALU op.
pub fn pack2(bits: u32) -> Option<WFn> {
    Some(match bits {
        8 => r3!(|a, b, c| (a & 0xff) | (b & 0xff) << 8),
        16 => r3!(|a, b, c| (a & 0xffff) | (b & 0xffff) << 16),
        32 => r3!(|a, b, c| (a & 0xffff_ffff) | (b & 0xffff_ffff) << 32),
        _ => return None,
    })
}

/// Fast paths for the hottest f32 operations with default rounding (`rn`, no ftz/sat):
/// NaN results are canonicalised to 0x7fffffff as the hardware does.
pub fn f32_fast(op: Opcode) -> Option<WFn> {
    #[inline(always)]
    fn canon(r: f32) -> u64 {
        if r.is_nan() {
            0x7fff_ffff
        } else {
            r.to_bits() as u64
        }
    }
    #[inline(always)]
    fn fl(v: u64) -> f32 {
        f32::from_bits(v as u32)
    }
    Some(match op {
        Opcode::Add => r3!(|a, b, c| canon(fl(a) + fl(b))),
        Opcode::Sub => r3!(|a, b, c| canon(fl(a) - fl(b))),
        Opcode::Mul => r3!(|a, b, c| canon(fl(a) * fl(b))),
        Opcode::Fma | Opcode::Mad => fma_lanes(),
        Opcode::Neg => r3!(|a, b, c| (a as u32 ^ 0x8000_0000) as u64),
        Opcode::Abs => r3!(|a, b, c| (a as u32 & 0x7fff_ffff) as u64),
        _ => return None,
    })
}

/// Predicate negation.
pub fn pred_not() -> WFn {
    r3!(|a, b, c| (a ^ 1) & 1)
}

/// `slct.dtype.s32 d, a, b, c` / `slct.dtype.f32`: a if c >= 0 else b.
pub fn slct(float: bool) -> WFn {
    if float {
        r3!(|a, b, c| if f32::from_bits(c as u32) >= 0.0 {
            a
        } else {
            b
        })
    } else {
        r3!(|a, b, c| if (c as u32 as i32) >= 0 { a } else { b })
    }
}

/// Lane-wise f32 fused multiply-add. Uses the hardware FMA unit when the host has one
/// (detected at run time): `f32::mul_add` is a slow software routine on baseline x86-64.
fn fma_lanes() -> WFn {
    #[inline(always)]
    fn one(a: u64, b: u64, c: u64) -> u64 {
        let r =
            f32::from_bits(a as u32).mul_add(f32::from_bits(b as u32), f32::from_bits(c as u32));
        if r.is_nan() {
            0x7fff_ffff
        } else {
            r.to_bits() as u64
        }
    }
    fn soft(r: &mut [Lanes], s: Slots) {
        lanewise(r, s, one)
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "fma")]
        fn hw_impl(r: &mut [Lanes], s: Slots) {
            lanewise(r, s, one)
        }
        fn hw(r: &mut [Lanes], s: Slots) {
            // SAFETY: `hw` is only selected below when the CPU reports FMA support.
            unsafe { hw_impl(r, s) }
        }
        if std::is_x86_feature_detected!("fma") {
            return hw;
        }
    }
    soft
}

#[inline(always)]
fn f32_canon(r: f32) -> u64 {
    if r.is_nan() {
        0x7fff_ffff
    } else {
        r.to_bits() as u64
    }
}

#[inline(always)]
fn flush(x: f32) -> f32 {
    if x.is_subnormal() {
        f32::from_bits(x.to_bits() & 0x8000_0000)
    } else {
        x
    }
}

macro_rules! f32_un {
    ($ftz:expr, |$x:ident| $e:expr) => {{
        fn f(r: &mut [Lanes], s: Slots) {
            lanewise(r, s, |a, _, _| {
                let mut $x = f32::from_bits(a as u32);
                if $ftz {
                    $x = flush($x);
                }
                let r: f32 = $e;
                f32_canon(if $ftz { flush(r) } else { r })
            })
        }
        f as WFn
    }};
}
macro_rules! f32_bin {
    ($ftz:expr, |$x:ident, $y:ident| $e:expr) => {{
        fn f(r: &mut [Lanes], s: Slots) {
            lanewise(r, s, |a, b, _| {
                let mut $x = f32::from_bits(a as u32);
                let mut $y = f32::from_bits(b as u32);
                if $ftz {
                    $x = flush($x);
                    $y = flush($y);
                }
                let r: f32 = $e;
                f32_canon(if $ftz { flush(r) } else { r })
            })
        }
        f as WFn
    }};
}

fn pmin(a: f32, b: f32) -> f32 {
    if a.is_nan() {
        b
    } else if b.is_nan() || a < b {
        a
    } else if b < a {
        b
    } else if a.is_sign_negative() {
        a
    } else {
        b
    }
}
fn pmax(a: f32, b: f32) -> f32 {
    if a.is_nan() {
        b
    } else if b.is_nan() || a > b {
        a
    } else if b > a {
        b
    } else if a.is_sign_positive() {
        a
    } else {
        b
    }
}

/// Fast f32 paths for division, min/max and the special functions in round-to-nearest (with or
/// without `.ftz`). Approximate functions are computed in f64 and rounded once — within (and
/// usually far better than) the PTX bounds; `div.rn`, `rcp.rn` and `sqrt.rn` are the IEEE
/// operations. Everything else goes through `fp::fop`.
pub fn f32_special(op: Opcode, ftz: bool) -> Option<WFn> {
    macro_rules! both {
        (un |$x:ident| $e:expr) => {
            if ftz {
                f32_un!(true, |$x| $e)
            } else {
                f32_un!(false, |$x| $e)
            }
        };
        (bin |$x:ident, $y:ident| $e:expr) => {
            if ftz {
                f32_bin!(true, |$x, $y| $e)
            } else {
                f32_bin!(false, |$x, $y| $e)
            }
        };
    }
    Some(match op {
        Opcode::Div => both!(bin | x, y | x / y),
        Opcode::Min => both!(bin | x, y | pmin(x, y)),
        Opcode::Max => both!(bin | x, y | pmax(x, y)),
        Opcode::Add => both!(bin | x, y | x + y),
        Opcode::Sub => both!(bin | x, y | x - y),
        Opcode::Mul => both!(bin | x, y | x * y),
        Opcode::Rcp => both!(un | x | 1.0 / x),
        Opcode::Sqrt => both!(un | x | x.sqrt()),
        Opcode::Rsqrt => both!(un | x | (1.0 / (x as f64).sqrt()) as f32),
        Opcode::Ex2 => both!(un | x | (x as f64).exp2() as f32),
        Opcode::Lg2 => both!(un | x | (x as f64).log2() as f32),
        Opcode::Sin => both!(un | x | (x as f64).sin() as f32),
        Opcode::Cos => both!(un | x | (x as f64).cos() as f32),
        Opcode::Tanh => both!(un | x | (x as f64).tanh() as f32),
        _ => return None,
    })
}

/// f32 -> bf16 bits, round to nearest even; NaN becomes the canonical 0x7fff.
#[inline(always)]
pub fn bf16_rn(x: f32) -> u64 {
    if x.is_nan() {
        return 0x7fff;
    }
    let u = x.to_bits();
    ((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u64
}

/// f32 -> e4m3 bits with `.satfinite`, round to nearest even; NaN becomes 0x7f.
#[inline(always)]
pub fn e4m3_satfinite(x: f32) -> u64 {
    if x.is_nan() {
        return 0x7f;
    }
    let s = ((x.to_bits() >> 24) & 0x80) as u64;
    let a = x.abs();
    if a >= 448.0 {
        return s | 0x7e;
    }
    if a < 0.015625 {
        // Subnormal range: multiples of 2^-9 (8 means the smallest normal, code 0x08).
        return s | (a * 512.0).round_ties_even() as u64;
    }
    let u = a.to_bits();
    let r = u + 0x7_ffff + ((u >> 20) & 1);
    let e = ((r >> 23) as i64 - 127 + 7) as u64;
    let m = ((r >> 20) & 7) as u64;
    s | ((e << 3) | m).min(0x7e)
}

/// Fast paths for the hottest conversions (those compilers emit in inner loops and epilogues).
/// `None` means: use the exact general routine.
pub fn cvt_fast(spec: &crate::fp::CvtSpec) -> Option<WFn> {
    use crate::fp::Rnd;
    let rn = matches!(spec.rnd, None | Some(Rnd::Rn));
    let plain = !spec.ftz && !spec.sat && !spec.relu && spec.irnd.is_none();
    if !plain {
        // Only the satfinite e4m3 pack below tolerates a modifier.
        if !(spec.satfinite && !spec.ftz && !spec.sat && !spec.relu && rn) {
            return None;
        }
    }
    Some(match (spec.dst, spec.src) {
        (Ty::Bf16x2, Ty::F32) if rn && !spec.satfinite => {
            r3!(|a, b, c| (bf16_rn(f32::from_bits(a as u32)) << 16)
                | bf16_rn(f32::from_bits(b as u32)))
        }
        (Ty::Bf16, Ty::F32) if rn && !spec.satfinite => {
            r3!(|a, b, c| bf16_rn(f32::from_bits(a as u32)))
        }
        (Ty::F32, Ty::Bf16) if !spec.satfinite => r3!(|a, b, c| {
            let v = (a as u32 & 0xffff) << 16;
            (if f32::from_bits(v).is_nan() {
                v | 0x0040_0000
            } else {
                v
            }) as u64
        }),
        (Ty::E4m3x2, Ty::F32) if spec.satfinite && rn => {
            r3!(|a, b, c| (e4m3_satfinite(f32::from_bits(a as u32)) << 8)
                | e4m3_satfinite(f32::from_bits(b as u32)))
        }
        (Ty::F16x2, Ty::E4m3x2) if rn && !spec.satfinite => r3!(|a, b, c| {
            let t = e4m3_to_f16_table();
            ((t[(a as usize >> 8) & 0xff] as u64) << 16) | t[a as usize & 0xff] as u64
        }),
        (Ty::F32, Ty::F16) if !spec.satfinite => r3!(|a, b, c| {
            let h = half::f16::from_bits(a as u16);
            let v = h.to_f32().to_bits();
            (if h.is_nan() { v | 0x0040_0000 } else { v }) as u64
        }),
        (Ty::U64 | Ty::B64, Ty::U32 | Ty::B32) | (Ty::U32 | Ty::B32, Ty::U16 | Ty::B16)
            if !spec.satfinite =>
        {
            r3!(|a, b, c| a)
        }
        (Ty::S64, Ty::S32) if !spec.satfinite => r3!(|a, b, c| a as u32 as i32 as i64 as u64),
        (Ty::U64 | Ty::S64, Ty::S32) if !spec.satfinite => {
            r3!(|a, b, c| a as u32 as i32 as i64 as u64)
        }
        (Ty::S32, Ty::S16) if !spec.satfinite => {
            r3!(|a, b, c| a as u16 as i16 as i32 as u32 as u64)
        }
        (Ty::U32 | Ty::S32 | Ty::B32, Ty::U64 | Ty::S64 | Ty::B64) if !spec.satfinite => {
            r3!(|a, b, c| a & 0xffff_ffff)
        }
        (Ty::U16 | Ty::S16 | Ty::B16, Ty::U32 | Ty::S32 | Ty::B32) if !spec.satfinite => {
            r3!(|a, b, c| a & 0xffff)
        }
        (Ty::F32, Ty::S32) if rn && !spec.satfinite => {
            r3!(|a, b, c| (a as u32 as i32 as f32).to_bits() as u64)
        }
        (Ty::F32, Ty::U32) if rn && !spec.satfinite => {
            r3!(|a, b, c| (a as u32 as f32).to_bits() as u64)
        }
        _ => return None,
    })
}

/// `cvt.rn.f16x2.e4m3x2`'s per-byte results (every e4m3 value is exact in f16), taken from the
/// general conversion [`crate::fp::cvt`] once so the fast path cannot differ from it (NaNs
/// included). The FP8 requantiser widens through this form.
fn e4m3_to_f16_table() -> &'static [u16; 256] {
    static TABLE: std::sync::OnceLock<[u16; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let spec = crate::fp::CvtSpec::new(Ty::F16x2, Ty::E4m3x2).rnd(crate::fp::Rnd::Rn);
        std::array::from_fn(|x| (crate::fp::cvt(&spec, x as u64, 0) & 0xffff) as u16)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The decoded-selector `prmt` (uniform or per-lane selectors) gives the bits of the
    /// byte-by-byte reference `prmt` for random operands and selectors.
    #[test]
    fn prmt_default_matches_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..2000 {
            let (a, b, c) = (rng.gen::<u32>(), rng.gen::<u32>(), rng.gen::<u32>());
            assert_eq!(
                prmt_with(a, b, &prmt_decode(c)),
                prmt(a, b, c),
                "{a:#x} {b:#x} {c:#x}"
            );
        }
        for uniform in [true, false] {
            let mut regs: Vec<Lanes> = (0..4)
                .map(|_| std::array::from_fn(|_| rng.gen::<u64>() & 0xffff_ffff))
                .collect();
            if uniform {
                regs[3] = [rng.gen::<u64>() & 0xffff; 32];
            }
            let old = regs.clone();
            prmt_default(
                &mut regs,
                Slots {
                    m: u32::MAX,
                    d: 0,
                    a: 1,
                    b: 2,
                    c: 3,
                },
            );
            for l in 0..32 {
                let want = prmt(old[1][l] as u32, old[2][l] as u32, old[3][l] as u32) as u64;
                assert_eq!(regs[0][l], want, "uniform {uniform}, lane {l}");
            }
        }
    }

    /// `bfe` (closed form) against the bit-by-bit definition for every width and signedness,
    /// on random values with positions and lengths over 0..=255 (the edges of each width
    /// included: the field's end past the width, zero length, positions at and past it).
    #[test]
    fn bfe_matches_bitwise_reference() {
        fn reference(v: u64, pos: u32, len: u32, n: u32, signed: bool) -> u64 {
            let v = if n == 64 { v } else { v & ((1u64 << n) - 1) };
            let msb = if len == 0 {
                0
            } else {
                (pos + len - 1).min(n - 1)
            };
            let sbit = if signed && len > 0 { (v >> msb) & 1 } else { 0 };
            let mut d = 0u64;
            for i in 0..n {
                let bit = if i < len && pos + i < n {
                    (v >> (pos + i)) & 1
                } else {
                    sbit
                };
                d |= bit << i;
            }
            d
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
        let fns: [(WFn, u32, bool); 8] = [
            (i_bfe!(u8, u8, 8), 8, false),
            (i_bfe!(i8, u8, 8), 8, true),
            (i_bfe!(u16, u16, 16), 16, false),
            (i_bfe!(i16, u16, 16), 16, true),
            (i_bfe!(u32, u32, 32), 32, false),
            (i_bfe!(i32, u32, 32), 32, true),
            (i_bfe!(u64, u64, 64), 64, false),
            (i_bfe!(i64, u64, 64), 64, true),
        ];
        for (f, n, signed) in fns {
            let edges = [0, 1, n - 1, n, n + 1, 2 * n, 255];
            let pick = |rng: &mut rand::rngs::StdRng| -> u64 {
                let x = if rng.gen_bool(0.5) {
                    edges[rng.gen_range(0..edges.len())]
                } else {
                    rng.gen_range(0..=255)
                };
                // the operand's bits above the low byte are ignored
                x as u64 | (rng.gen::<u64>() << 8)
            };
            for _ in 0..200 {
                let mut regs: Vec<Lanes> = vec![[0; 32]; 4];
                for l in 0..32 {
                    regs[1][l] = rng.gen();
                    regs[2][l] = pick(&mut rng);
                    regs[3][l] = pick(&mut rng);
                }
                let old = regs.clone();
                let s = Slots {
                    m: u32::MAX,
                    d: 0,
                    a: 1,
                    b: 2,
                    c: 3,
                };
                f(&mut regs, s);
                for l in 0..32 {
                    let (pos, len) = ((old[2][l] & 0xff) as u32, (old[3][l] & 0xff) as u32);
                    let want = reference(old[1][l], pos, len, n, signed);
                    assert_eq!(
                        regs[0][l], want,
                        "bfe width {n} signed {signed}: {:#x} pos {pos} len {len}",
                        old[1][l]
                    );
                }
            }
        }
    }

    /// Every ALU function built with [`lanes_fn`] gives the same register file with its AVX2
    /// build as with its baseline build, bit for bit: integer, comparison, selection, move,
    /// pack, float and conversion functions over random rows with non-finite and extreme f32,
    /// f16 and bf16 patterns, full, partial and empty lane masks, and a source that is the
    /// destination. (On a CPU without AVX2 both builds are the baseline one.)
    #[test]
    fn simd_builds_match_baseline() {
        let texts = [
            "add.s32 %r1, %r2, %r3;",
            "add.sat.s32 %r1, %r2, %r3;",
            "sub.u64 %rd1, %rd2, %rd3;",
            "mul.lo.u32 %r1, %r2, %r3;",
            "mul.wide.s32 %rd1, %r2, %r3;",
            "mul.hi.u64 %rd1, %rd2, %rd3;",
            "mad.lo.s32 %r1, %r2, %r3, %r4;",
            "mad.hi.u64 %rd1, %rd2, %rd3, %rd4;",
            "mad.wide.u32 %rd1, %r2, %r3, %rd4;",
            "min.s16 %rs1, %rs2, %rs3;",
            "max.u32 %r1, %r2, %r3;",
            "abs.s32 %r1, %r2;",
            "neg.s64 %rd1, %rd2;",
            "and.b32 %r1, %r2, %r3;",
            "or.b64 %rd1, %rd2, %rd3;",
            "xor.b16 %rs1, %rs2, %rs3;",
            "not.b32 %r1, %r2;",
            "shl.b32 %r1, %r2, %r3;",
            "shr.s32 %r1, %r2, %r3;",
            "shr.u64 %rd1, %rd2, %r3;",
            "popc.b32 %r1, %r2;",
            "clz.b64 %r1, %rd2;",
            "brev.b32 %r1, %r2;",
            "bfe.s32 %r1, %r2, %r3, %r4;",
            "bfe.u64 %rd1, %rd2, %r3, %r4;",
            "bfind.s32 %r1, %r2;",
            "and.pred %p1, %p2, %p3;",
        ];
        let ins = |t: &str| match ptx::parse_statements(t).unwrap().remove(0) {
            ptx::Statement::Instr(i) => i,
            s => panic!("not an instruction: {s:?}"),
        };
        let mut makers: Vec<(String, Box<dyn Fn() -> WFn>)> = Vec::new();
        for t in texts {
            let i = ins(t);
            assert!(int_fn(&i).is_some(), "{t}");
            makers.push((t.into(), Box::new(move || int_fn(&i).unwrap())));
        }
        for (ty, cmp) in [
            (Ty::S32, Flag::Lt),
            (Ty::U64, Flag::Ge),
            (Ty::S16, Flag::Ne),
        ] {
            makers.push((
                format!("int_cmp {ty:?} {cmp:?}"),
                Box::new(move || int_cmp(ty, cmp).unwrap()),
            ));
        }
        for (ty, cmp) in [
            (Ty::F32, Flag::Lt),
            (Ty::F32, Flag::Nan),
            (Ty::F64, Flag::Geu),
        ] {
            makers.push((
                format!("float_cmp {ty:?} {cmp:?}"),
                Box::new(move || float_cmp(ty, cmp).unwrap()),
            ));
        }
        for op in [
            Opcode::Add,
            Opcode::Sub,
            Opcode::Mul,
            Opcode::Neg,
            Opcode::Abs,
        ] {
            makers.push((
                format!("f32_fast {op:?}"),
                Box::new(move || f32_fast(op).unwrap()),
            ));
        }
        for (op, ftz) in [
            (Opcode::Min, false),
            (Opcode::Max, true),
            (Opcode::Div, false),
        ] {
            if f32_special(op, ftz).is_some() {
                makers.push((
                    format!("f32_special {op:?}"),
                    Box::new(move || f32_special(op, ftz).unwrap()),
                ));
            }
        }
        for t in [
            "cvt.rn.bf16x2.f32 %r1, %r2, %r3;",
            "cvt.rn.bf16.f32 %rs1, %r2;",
            "cvt.f32.bf16 %r1, %rs2;",
            "cvt.f32.f16 %r1, %rs2;",
            "cvt.rn.satfinite.e4m3x2.f32 %rs1, %r2, %r3;",
            "cvt.rn.f16x2.e4m3x2 %r1, %rs2;",
            "cvt.s64.s32 %rd1, %r2;",
        ] {
            let spec = crate::fp::CvtSpec::from_instruction(&ins(t)).unwrap();
            assert!(cvt_fast(&spec).is_some(), "{t}");
            makers.push((t.into(), Box::new(move || cvt_fast(&spec).unwrap())));
        }
        makers.push(("pack2 16".into(), Box::new(|| pack2(16).unwrap())));
        makers.push(("pack2 32".into(), Box::new(|| pack2(32).unwrap())));
        makers.push(("mov 2".into(), Box::new(|| mov(2))));
        makers.push(("selp".into(), Box::new(selp)));
        makers.push(("slct f32".into(), Box::new(|| slct(true))));
        makers.push(("pred_not".into(), Box::new(pred_not)));
        makers.push((
            "bool_combine".into(),
            Box::new(|| bool_combine(Flag::Xor, true)),
        ));
        let specials: [u64; 10] = [
            0x7fc0_0000,
            0xffc0_0001,
            0x7f80_0000,
            0xff80_0000,
            0x8000_0000,
            0x0000_0001,
            0x7f7f_ffff,
            0x7e00_7c00,
            0xfc00_0001,
            0x7fff_ffff,
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
        for (name, make) in &makers {
            let (base, simd) = (scalar_only(make), make());
            for (d, a) in [(0, 1), (1, 1)] {
                for m in [u32::MAX, rng.gen::<u32>(), 0x8000_0001, 0] {
                    let regs: Vec<Lanes> = (0..4)
                        .map(|_| {
                            std::array::from_fn(|_| match rng.gen_range(0..4) {
                                0 => specials[rng.gen_range(0..specials.len())],
                                1 => rng.gen::<u64>() & 0xffff_ffff,
                                _ => rng.gen(),
                            })
                        })
                        .collect();
                    let s = Slots {
                        m,
                        d,
                        a,
                        b: 2,
                        c: 3,
                    };
                    let (mut x, mut y) = (regs.clone(), regs);
                    base(&mut x, s);
                    simd(&mut y, s);
                    assert_eq!(x, y, "{name}: d{d} a{a} m {m:#x}");
                }
            }
        }
    }

    /// `lanewise` in place: every aliasing of the destination with the sources and random
    /// active masks give, lane by lane, `selp` of the values before the instruction; inactive
    /// lanes keep their old value.
    #[test]
    fn lanewise_in_place_matches_per_lane_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let f = selp();
        for (d, a, b, c) in [
            (0, 1, 2, 3),
            (1, 1, 2, 3),
            (2, 1, 2, 3),
            (3, 1, 2, 3),
            (1, 1, 1, 1),
        ] {
            for m in [u32::MAX, rng.gen::<u32>(), 0x8000_0001] {
                let mut regs: Vec<Lanes> = (0..4)
                    .map(|_| std::array::from_fn(|_| rng.gen::<u64>()))
                    .collect();
                let old = regs.clone();
                f(&mut regs, Slots { m, d, a, b, c });
                for l in 0..32 {
                    let (x, y, p) = (old[a as usize][l], old[b as usize][l], old[c as usize][l]);
                    let want = if m >> l & 1 == 0 {
                        old[d as usize][l]
                    } else if p & 1 != 0 {
                        x
                    } else {
                        y
                    };
                    assert_eq!(
                        regs[d as usize][l], want,
                        "d{d} a{a} b{b} c{c} m {m:#x} lane {l}"
                    );
                }
                for r in 0..4 {
                    if r != d as usize {
                        assert_eq!(regs[r], old[r], "row {r} changed");
                    }
                }
            }
        }
    }
}
