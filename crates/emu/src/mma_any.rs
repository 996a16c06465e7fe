//! Warp-level `mma` forms outside [`crate::mma`]'s table, computed by one general routine over
//! any `m16n8kK` / `m8n8kK` shape: the sub-byte integer forms (`.s4`/`.u4` m8n8k32, m16n8k32,
//! m16n8k64), the single-bit forms (`.b1` m8n8k128, m16n8k128, m16n8k256 with `.xor.popc` or
//! `.and.popc`), `.s8`/`.u8` m8n8k16, the sub-byte `wmma.mma` forms (whose fragments this
//! emulator lays out as the matching `mma` fragments, see [`crate::wmma`]), and the dense
//! equivalents of every sparse `mma.sp` form ([`crate::mma_sp`] expands the compressed A into
//! a dense A fragment of the shapes here: f16/bf16 m16n8k32, tf32 m16n8k16, e4m3/e5m2 and
//! s8/u8 m16n8k64, s4/u4 m16n8k128).
//!
//! # Fragments
//! For lane `l`, `g = l >> 2`, `q = l & 3`, and `pr = 32 / bits` elements per 32-bit register
//! (element `j` in bits `j*bits ..`, little-endian), the PTX ISA fragments of every shape here
//! ("Matrix fragments for mma.m16n8k*", "mma.m8n8k*") follow one rule:
//! - A register `i`, element `j`: row `g + 8*(i & 1)` and k `pr*q + j + 4*pr*(i >> 1)` for
//!   m16; row `g` and k `pr*q + j + 4*pr*i` for m8;
//! - B register `r`, element `j`: k `pr*q + j + 4*pr*r`, column `g`;
//! - C/D element `e` (f32/s32: one per register, f16: two): row `g + 8*(e >> 1)`, column
//!   `2q + (e & 1)` for m16; row `g`, column `2q + e` for m8.
//!
//! # Numerics
//! Integer forms are exact: products summed in i64, C added, then wrapped to 32 bits or, with
//! `.satfinite`, clamped to the s32 range. `.b1` forms add `popc(a_row OP b_col)` over k
//! (OP = xor or and) to C, wrapping. Float forms use the tensor-core model of the target
//! ([`crate::tc_numerics::dot`]) or, in exact mode, f64 products summed in k order plus C with
//! one rounding to D's type (nearest even; NaN gives D's canonical NaN), as [`crate::mma`].

use crate::mma::{round_to, to_f64};
use crate::tc_numerics::{self as tc, TcModel};
use crate::Lanes;
use ptx::{Flag, Instruction, Mod, Ty};

/// The bit operation of a `.b1` form (`.xor.popc` / `.and.popc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BitOp {
    Xor,
    And,
}

/// A general warp-level mma form: shape, types, `.satfinite`, and the `.b1` operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AnySpec {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub dty: Ty,
    pub aty: Ty,
    pub bty: Ty,
    pub cty: Ty,
    pub satfinite: bool,
    pub bop: Option<BitOp>,
}

/// Bits of one element of an mma operand of type `t`.
pub fn bits(t: Ty) -> u32 {
    match t {
        Ty::B1 => 1,
        Ty::S4 | Ty::U4 => 4,
        Ty::S8 | Ty::U8 | Ty::E4m3 | Ty::E5m2 => 8,
        Ty::F16 | Ty::Bf16 => 16,
        _ => 32,
    }
}

fn is_int(t: Ty) -> bool {
    matches!(t, Ty::S4 | Ty::U4 | Ty::S8 | Ty::U8 | Ty::B1)
}

/// The shape `(m, n, k)` of an instruction.
pub fn shape(ins: &Instruction) -> Result<(u32, u32, u32), String> {
    match ins.shape() {
        Some(Mod::Shape { m, n, k: Some(k) }) => Ok((m as u32, n as u32, k as u32)),
        _ => Err(format!("`{}` needs a .mMnNkK shape", ins.op.name())),
    }
}

/// The `.xor.popc` / `.and.popc` operation of an instruction (`None` without `.popc`).
pub fn bit_op(ins: &Instruction) -> Result<Option<BitOp>, String> {
    match (ins.has(Flag::Popc), ins.has(Flag::Xor), ins.has(Flag::And)) {
        (false, false, false) => Ok(None),
        (true, true, false) => Ok(Some(BitOp::Xor)),
        (true, false, true) => Ok(Some(BitOp::And)),
        _ => Err("a .b1 mma needs exactly one of .xor.popc and .and.popc".into()),
    }
}

impl AnySpec {
    /// Whether dense `mma` instruction `ins` is one of the forms of this module (sub-byte,
    /// `.b1`, or s8/u8 m8n8k16) rather than one of [`crate::mma`]'s.
    pub fn is_dense_form(ins: &Instruction) -> bool {
        let sub = ins.types().any(|t| matches!(t, Ty::S4 | Ty::U4 | Ty::B1));
        let m8k16 = matches!(shape(ins), Ok((8, 8, 16)));
        sub || m8k16
    }

    /// Decodes dense `mma.sync.aligned.shape.row.col{.satfinite}.s32.atype.btype.s32{.bitop.popc}`
    /// of [`AnySpec::is_dense_form`].
    pub fn from_mma(ins: &Instruction) -> Result<AnySpec, String> {
        if !(ins.has(Flag::Row) && ins.has(Flag::Col)) {
            return Err("mma needs .row.col".into());
        }
        let tys: Vec<Ty> = ins.types().collect();
        let [dty, aty, bty, cty] = tys[..] else {
            return Err(format!(
                "mma needs four types (d, a, b, c), got {}",
                tys.len()
            ));
        };
        let s = AnySpec::new(shape(ins)?, [dty, aty, bty, cty], ins)?;
        let ok = matches!(
            (s.m, s.n, s.k, aty),
            (8, 8, 16, Ty::S8 | Ty::U8)
                | (8, 8, 32, Ty::S4 | Ty::U4)
                | (16, 8, 32 | 64, Ty::S4 | Ty::U4)
                | (8, 8, 128, Ty::B1)
                | (16, 8, 128 | 256, Ty::B1)
        );
        if !ok {
            return Err(s.unsupported());
        }
        Ok(s)
    }

    /// Decodes a sub-byte `wmma.mma{.xor.popc|.and.popc}.sync.aligned.row.col.shape.s32.atype.btype.s32{.satfinite}`
    /// (m8n8k32 `.s4`/`.u4`, m8n8k128 `.b1`): the same arithmetic and fragments as the `mma`
    /// of that shape ([`crate::wmma`] lays wmma fragments out as mma fragments).
    pub fn from_wmma(ins: &Instruction) -> Result<AnySpec, String> {
        let row = ins.mods.iter().position(|x| *x == Mod::Flag(Flag::Row));
        let col = ins.mods.iter().position(|x| *x == Mod::Flag(Flag::Col));
        if !matches!((row, col), (Some(r), Some(c)) if r < c) {
            return Err("sub-byte and .b1 wmma.mma need .row.col".into());
        }
        let tys: Vec<Ty> = ins.types().collect();
        let [dty, aty, bty, cty] = tys[..] else {
            return Err("wmma.mma needs .dtype.atype.btype.ctype".into());
        };
        let s = AnySpec::new(shape(ins)?, [dty, aty, bty, cty], ins)?;
        match (s.m, s.n, s.k, aty) {
            // wmma, unlike mma, takes no mix of signed and unsigned inputs
            _ if aty != bty => Err(s.unsupported()),
            (8, 8, 32, Ty::S4 | Ty::U4) | (8, 8, 128, Ty::B1) => Ok(s),
            _ => Err(s.unsupported()),
        }
    }

    /// Builds and checks the type combination of a form (the shape is checked by the caller).
    pub fn new(
        (m, n, k): (u32, u32, u32),
        [dty, aty, bty, cty]: [Ty; 4],
        ins: &Instruction,
    ) -> Result<AnySpec, String> {
        let s = AnySpec {
            m,
            n,
            k,
            dty,
            aty,
            bty,
            cty,
            satfinite: ins.has(Flag::Satfinite),
            bop: bit_op(ins)?,
        };
        let int = is_int(aty);
        let same_width = bits(aty) == bits(bty) && is_int(bty) == int;
        let types_ok = if int {
            same_width && dty == Ty::S32 && cty == Ty::S32
        } else {
            same_width && is_float_in(aty) && is_float_in(bty) && float_acc(s)
        };
        if !types_ok || (m, n) != (16, 8) && (m, n) != (8, 8) {
            return Err(s.unsupported());
        }
        if (aty == Ty::B1) != s.bop.is_some() {
            return Err(".xor.popc / .and.popc go with .b1 inputs (and .b1 needs one)".into());
        }
        if s.satfinite && (!int || aty == Ty::B1) {
            return Err(".satfinite is only for the s8/u8/s4/u4 forms".into());
        }
        Ok(s)
    }

    fn unsupported(&self) -> String {
        format!(
            "unsupported mma form: .m{}n{}k{}.{}.{}.{}.{}",
            self.m, self.n, self.k, self.dty, self.aty, self.bty, self.cty
        )
    }

    /// Registers per lane of the A, B, C and D fragments.
    pub fn frag_counts(&self) -> (usize, usize, usize, usize) {
        let (m, n, k) = (self.m as usize, self.n as usize, self.k as usize);
        let regs = |elems: usize, t: Ty| (elems * bits(t) as usize).div_ceil(32 * 32);
        (
            regs(m * k, self.aty),
            regs(k * n, self.bty),
            regs(m * n, self.cty),
            regs(m * n, self.dty),
        )
    }

    /// Position `(row, k)` of element `j` of A register `i` of lane `lane` (module docs).
    pub fn a_pos(&self, lane: usize, i: usize, j: usize) -> (usize, usize) {
        let (g, q, pr) = (lane >> 2, lane & 3, 32 / bits(self.aty) as usize);
        if self.m == 16 {
            (g + 8 * (i & 1), pr * q + j + 4 * pr * (i >> 1))
        } else {
            (g, pr * q + j + 4 * pr * i)
        }
    }

    /// Position `(k, col)` of element `j` of B register `r` of lane `lane`.
    pub fn b_pos(&self, lane: usize, r: usize, j: usize) -> (usize, usize) {
        let (g, q, pr) = (lane >> 2, lane & 3, 32 / bits(self.bty) as usize);
        (pr * q + j + 4 * pr * r, g)
    }

    /// Position `(row, col)` of accumulator element `e` of lane `lane`.
    pub fn c_pos(&self, lane: usize, e: usize) -> (usize, usize) {
        let (g, q) = (lane >> 2, lane & 3);
        if self.m == 16 {
            (g + 8 * (e >> 1), 2 * q + (e & 1))
        } else {
            (g, 2 * q + e)
        }
    }
}

fn is_float_in(t: Ty) -> bool {
    matches!(t, Ty::F16 | Ty::Bf16 | Ty::Tf32 | Ty::E4m3 | Ty::E5m2)
}

/// The accumulator types a float form takes: f32, or f16 for f16 inputs; C and D alike
/// (ptxas 13.5 rejects mixed accumulators in `mma.sp`).
fn float_acc(s: AnySpec) -> bool {
    match (s.dty, s.cty) {
        (Ty::F32, Ty::F32) => true,
        (Ty::F16, Ty::F16) => s.aty == Ty::F16,
        _ => false,
    }
}

/// Raw bits of element `j` (of `bits` bits) of a register value.
fn field(v: u64, j: usize, bits: u32) -> u64 {
    if bits >= 32 {
        v & 0xffff_ffff
    } else {
        (v >> (j as u32 * bits)) & ((1u64 << bits) - 1)
    }
}

/// An integer element's value (sign-extended for the signed types).
fn int_val(t: Ty, raw: u64) -> i64 {
    match t {
        Ty::S4 => ((raw as i64) << 60) >> 60,
        Ty::S8 => raw as u8 as i8 as i64,
        Ty::S32 => raw as u32 as i32 as i64,
        _ => raw as i64,
    }
}

/// The dense operands of one warp-wide mma, decoded: A row-major `m x k`, B column-major (each
/// column's k values together), C row-major, as f64 (exact for every input type here).
struct Dense {
    a: Vec<f64>,
    b: Vec<f64>,
    c: Vec<f64>,
}

fn scatter(s: &AnySpec, (a, b, c): (&[&Lanes], &[&Lanes], &[&Lanes])) -> Dense {
    let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
    let mut d = Dense {
        a: vec![0.0; m * k],
        b: vec![0.0; k * n],
        c: vec![0.0; m * n],
    };
    let val = |t: Ty, raw: u64| {
        if is_int(t) || t == Ty::S32 {
            int_val(t, raw) as f64
        } else {
            to_f64(t, raw)
        }
    };
    let (pa, pb) = (32 / bits(s.aty) as usize, 32 / bits(s.bty) as usize);
    let cw = bits(s.cty);
    for lane in 0..32 {
        for (i, r) in a.iter().enumerate() {
            for j in 0..pa {
                let (row, kk) = s.a_pos(lane, i, j);
                d.a[row * k + kk] = val(s.aty, field(r[lane], j, bits(s.aty)));
            }
        }
        for (i, r) in b.iter().enumerate() {
            for j in 0..pb {
                let (kk, col) = s.b_pos(lane, i, j);
                d.b[col * k + kk] = val(s.bty, field(r[lane], j, bits(s.bty)));
            }
        }
        for e in 0..m * n / 32 {
            let per = (32 / cw) as usize;
            let raw = c.get(e / per).map_or(0, |r| field(r[lane], e % per, cw));
            let (row, col) = s.c_pos(lane, e);
            d.c[row * n + col] = val(s.cty, raw);
        }
    }
    d
}

/// `D = A * B + C` over whole-warp fragments for form `s` under `model` (`None`: exact; the
/// integer forms ignore it). `a`, `b`, `c` hold [`AnySpec::frag_counts`] registers; `d`
/// receives the D registers.
pub fn mma_any(
    s: &AnySpec,
    model: Option<&TcModel>,
    (a, b, c): (&[&Lanes], &[&Lanes], &[&Lanes]),
    d: &mut [Lanes],
) {
    let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
    let dense = scatter(s, (a, b, c));
    let dw = bits(s.dty);
    let per = (32 / dw) as usize;
    let mut out = vec![[0u64; 32]; (m * n / 32).div_ceil(per)];
    for lane in 0..32 {
        for e in 0..m * n / 32 {
            let (row, col) = s.c_pos(lane, e);
            let ar = &dense.a[row * k..row * k + k];
            let bc = &dense.b[col * k..col * k + k];
            let bits = element(s, model, ar, bc, dense.c[row * n + col]);
            let sh = (e % per) as u32 * dw;
            out[e / per][lane] |= (bits & ((1u64 << dw) - 1)) << sh;
        }
    }
    for (dst, src) in d.iter_mut().zip(out) {
        *dst = src;
    }
}

/// One element of D: raw bits of `a . b + c` in D's type.
fn element(s: &AnySpec, model: Option<&TcModel>, a: &[f64], b: &[f64], c: f64) -> u64 {
    if is_int(s.aty) {
        // every input is an integer of at most 8 bits: the products and sums are exact
        let dot: i64 = match s.bop {
            Some(BitOp::Xor) => a.iter().zip(b).map(|(x, y)| (*x != *y) as i64).sum(),
            Some(BitOp::And) => a.iter().zip(b).map(|(x, y)| (*x * *y) as i64).sum(),
            None => a.iter().zip(b).map(|(x, y)| (*x * *y) as i64).sum(),
        };
        let v = dot + c as i64;
        let v = if s.satfinite {
            v.clamp(i32::MIN as i64, i32::MAX as i64)
        } else {
            v
        };
        return v as i32 as u32 as u64;
    }
    let x = match model {
        Some(model) => tc::dot(model, a, b, c as f32) as f64,
        None => a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>() + c,
    };
    round_to(s.dty, x)
}
