//! Lane-parallel ALU kernels. Each decoded ALU instruction holds one `WFn`: a monomorphic
//! function that computes all 32 lanes from up to three source register rows. Masking is applied
//! by the caller when writing the destination, so these stay branch-free and vectorisable.

use crate::Lanes;
use ptx::{Flag, Instruction, Opcode, Ty};

/// A warp-wide pure operation: `out[l] = f(a[l], b[l], c[l])`.
pub type WFn = fn(&mut Lanes, &Lanes, &Lanes, &Lanes);

macro_rules! w1 {
    ($T:ty, $U:ty, |$a:ident| $e:expr) => {{
        #[allow(clippy::unnecessary_cast, unused_parens)]
        fn f(o: &mut Lanes, x: &Lanes, _: &Lanes, _: &Lanes) {
            for i in 0..32 {
                let $a = x[i] as $T;
                o[i] = ($e) as $U as u64;
            }
        }
        f as WFn
    }};
}
macro_rules! w2 {
    ($T:ty, $U:ty, |$a:ident, $b:ident| $e:expr) => {{
        #[allow(clippy::unnecessary_cast, unused_parens)]
        fn f(o: &mut Lanes, x: &Lanes, y: &Lanes, _: &Lanes) {
            for i in 0..32 {
                let $a = x[i] as $T;
                let $b = y[i] as $T;
                o[i] = ($e) as $U as u64;
            }
        }
        f as WFn
    }};
}
macro_rules! w3 {
    ($T:ty, $U:ty, |$a:ident, $b:ident, $c:ident| $e:expr) => {{
        #[allow(clippy::unnecessary_cast, unused_parens)]
        fn f(o: &mut Lanes, x: &Lanes, y: &Lanes, z: &Lanes) {
            for i in 0..32 {
                let $a = x[i] as $T;
                let $b = y[i] as $T;
                let $c = z[i] as $T;
                o[i] = ($e) as $U as u64;
            }
        }
        f as WFn
    }};
}
/// Raw u64 lanes in, u64 out (for ops that need mixed widths).
macro_rules! r3 {
    (|$a:ident, $b:ident, $c:ident| $e:expr) => {{
        #[allow(clippy::unnecessary_cast, unused_parens, unused_variables)]
        fn f(o: &mut Lanes, x: &Lanes, y: &Lanes, z: &Lanes) {
            for i in 0..32 {
                let $a = x[i];
                let $b = y[i];
                let $c = z[i];
                o[i] = $e;
            }
        }
        f as WFn
    }};
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
        w2!($T, $U, |a, b| ((a as i128 * b as i128) >> $n) as $T)
    };
}
macro_rules! i_mul_wide {
    ($T:ty, $U:ty, $n:tt) => {
        w2!($T, u64, |a, b| ((a as i128 * b as i128) as u64)
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
        w3!($T, $U, |a, b, c| (((a as i128 * b as i128) >> $n) as $T)
            .wrapping_add(c))
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
            let mut d: u64 = 0;
            for i in 0..$n as u32 {
                let bit = if i < len && pos + i < $n {
                    (v >> (pos + i)) & 1
                } else {
                    sbit
                };
                d |= bit << i;
            }
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
        Prmt => {
            if ins.mods.iter().any(|m| {
                matches!(
                    m,
                    ptx::Mod::Flag(
                        Flag::F4e | Flag::B4e | Flag::Rc8 | Flag::Ecl | Flag::Ecr | Flag::Rc16
                    )
                )
            }) {
                None
            } else {
                Some(r3!(|a, b, c| prmt(a as u32, b as u32, c as u32) as u64))
            }
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
/// ordered comparisons on purpose: they must be true when either operand is NaN. `ftz`
/// (`setp.ftz`/`set.ftz`, f32 and f16 only) compares subnormal operands as zero.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
pub fn float_cmp(ty: Ty, cmp: Flag, ftz: bool) -> Option<WFn> {
    macro_rules! fc {
        ($conv:expr, |$a:ident, $b:ident| $e:expr) => {{
            fn f(o: &mut Lanes, x: &Lanes, y: &Lanes, _: &Lanes) {
                for i in 0..32 {
                    let $a = $conv(x[i]);
                    let $b = $conv(y[i]);
                    o[i] = ($e) as u64;
                }
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
    // subnormal -> zero (its sign does not matter to a comparison)
    fn flush(x: f32) -> f32 {
        if x.is_subnormal() {
            0.0
        } else {
            x
        }
    }
    match (ty, ftz) {
        (Ty::F32, false) => all!(|v: u64| f32::from_bits(v as u32)),
        (Ty::F32, true) => all!(|v: u64| flush(f32::from_bits(v as u32))),
        (Ty::F64, _) => all!(f64::from_bits),
        (Ty::F16, false) => all!(|v: u64| half::f16::from_bits(v as u16).to_f32()),
        // f16 subnormals are normal f32 values: test them in f16
        (Ty::F16, true) => all!(|v: u64| {
            let h = v as u16;
            if h & 0x7c00 == 0 {
                0.0 // zero or subnormal
            } else {
                half::f16::from_bits(h).to_f32()
            }
        }),
        (Ty::Bf16, _) => all!(|v: u64| half::bf16::from_bits(v as u16).to_f32()),
        _ => None,
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

/// `set` result: all-ones (integer destination) or 1.0f (f32 destination) when the predicate
/// in `a` is true.
pub fn set_result(float: bool) -> WFn {
    if float {
        r3!(|a, b, c| if a & 1 != 0 { 0x3f80_0000 } else { 0 })
    } else {
        r3!(|a, b, c| if a & 1 != 0 { 0xffff_ffff } else { 0 })
    }
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
    fn soft(o: &mut Lanes, x: &Lanes, y: &Lanes, z: &Lanes) {
        for i in 0..32 {
            o[i] = one(x[i], y[i], z[i]);
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "fma")]
        fn hw_impl(o: &mut Lanes, x: &Lanes, y: &Lanes, z: &Lanes) {
            for i in 0..32 {
                o[i] = one(x[i], y[i], z[i]);
            }
        }
        fn hw(o: &mut Lanes, x: &Lanes, y: &Lanes, z: &Lanes) {
            // SAFETY: `hw` is only selected below when the CPU reports FMA support.
            unsafe { hw_impl(o, x, y, z) }
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
        fn f(o: &mut Lanes, a: &Lanes, _: &Lanes, _: &Lanes) {
            for i in 0..32 {
                let mut $x = f32::from_bits(a[i] as u32);
                if $ftz {
                    $x = flush($x);
                }
                let r: f32 = $e;
                o[i] = f32_canon(if $ftz { flush(r) } else { r });
            }
        }
        f as WFn
    }};
}
macro_rules! f32_bin {
    ($ftz:expr, |$x:ident, $y:ident| $e:expr) => {{
        fn f(o: &mut Lanes, a: &Lanes, b: &Lanes, _: &Lanes) {
            for i in 0..32 {
                let mut $x = f32::from_bits(a[i] as u32);
                let mut $y = f32::from_bits(b[i] as u32);
                if $ftz {
                    $x = flush($x);
                    $y = flush($y);
                }
                let r: f32 = $e;
                o[i] = f32_canon(if $ftz { flush(r) } else { r });
            }
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
