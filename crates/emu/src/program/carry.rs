//! Decoding extended-precision integer arithmetic with the carry flag: `add.cc`, `addc[.cc]`,
//! `sub.cc`, `subc[.cc]`, `mad{.lo,.hi}.cc`, `madc{.lo,.hi}[.cc]` on u32/s32/u64/s64. The
//! condition code `CC.CF` is a hidden one-bit register per thread (one slot per program,
//! allocated on first use), so it follows lanes through divergence like any register.

use super::*;

/// Which arithmetic a carry instruction does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CarryKind {
    /// `d = a + b (+ CF)`, carry out.
    Add,
    /// `d = a - (b + CF)`, borrow out (PTX: `CC.CF` is the borrow for subtraction).
    Sub,
    /// `d = lo(a * b) + c (+ CF)`.
    MadLo,
    /// `d = hi(a * b) + c (+ CF)` (signed product for s32/s64).
    MadHi,
}

/// A decoded carry instruction.
#[derive(Clone, Copy, Debug)]
pub struct CarryOp {
    pub kind: CarryKind,
    pub wide: bool,
    pub signed: bool,
    /// Adds `CC.CF` (addc/subc/madc).
    pub cin: bool,
    /// Writes `CC.CF` (`.cc`).
    pub cout: bool,
    pub d: u32,
    pub a: u32,
    pub b: u32,
    pub c: u32,
    /// The `CC.CF` slot.
    pub cc: u32,
}

impl<'a> Decoder<'a> {
    /// `Some` when `ins` reads or writes the carry flag (it is then decoded here).
    pub(super) fn carry(&mut self, ins: &Instruction) -> Result<Option<Op>, EmuError> {
        use Opcode as O;
        let (kind, cin) = match ins.op {
            O::Add if ins.has(Flag::Cc) => (CarryKind::Add, false),
            O::Sub if ins.has(Flag::Cc) => (CarryKind::Sub, false),
            O::Mad if ins.has(Flag::Cc) => (mad_kind(ins), false),
            O::Addc => (CarryKind::Add, true),
            O::Subc => (CarryKind::Sub, true),
            O::Madc => (mad_kind(ins), true),
            _ => return Ok(None),
        };
        let ty = ins
            .ty()
            .filter(|t| matches!(t, Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64))
            .ok_or_else(|| self.err(ins, "carry arithmetic needs .u32, .s32, .u64 or .s64"))?;
        if matches!(ins.op, O::Mad | O::Madc) && !(ins.has(Flag::Lo) || ins.has(Flag::Hi)) {
            return Err(self.err(ins, "mad/madc with the carry flag needs .lo or .hi"));
        }
        let nsrc = if matches!(kind, CarryKind::MadLo | CarryKind::MadHi) {
            3
        } else {
            2
        };
        if ins.args.len() != 1 + nsrc {
            return Err(self.err(ins, format!("expected {} operands", 1 + nsrc)));
        }
        let d = self.role_dst(ins)?;
        let s = self.role_srcs(ins, &[Role::A, Role::B, Role::C])?;
        let cc = match self.cc_slot {
            Some(c) => c,
            None => {
                let c = self.new_slot(1);
                self.cc_slot = Some(c);
                c
            }
        };
        Ok(Some(Op::Carry(CarryOp {
            kind,
            wide: ty.size() == 8,
            signed: ty == Ty::S32 || ty == Ty::S64,
            cin,
            cout: ins.has(Flag::Cc),
            d,
            a: s[0],
            b: s[1],
            c: s[2],
            cc,
        })))
    }
}

fn mad_kind(ins: &Instruction) -> CarryKind {
    if ins.has(Flag::Hi) {
        CarryKind::MadHi
    } else {
        CarryKind::MadLo
    }
}

impl CarryOp {
    /// One lane: (d, carry out) from the operands and the carry in.
    #[inline]
    pub fn eval(&self, a: u64, b: u64, c: u64, cf: u64) -> (u64, u64) {
        let w = if self.wide { 64 } else { 32 };
        let mask: u128 = if self.wide {
            u64::MAX as u128
        } else {
            0xffff_ffff
        };
        let (a, b, c) = (a as u128 & mask, b as u128 & mask, c as u128 & mask);
        let cin = if self.cin { (cf & 1) as u128 } else { 0 };
        let sum = match self.kind {
            CarryKind::Add => a + b + cin,
            CarryKind::Sub => {
                let s = b + cin;
                return ((a.wrapping_sub(s) & mask) as u64, (s > a) as u64);
            }
            CarryKind::MadLo => ((a * b) & mask) + c + cin,
            CarryKind::MadHi => {
                let hi = if self.signed {
                    let sx = |x: u128| ((x << (128 - w)) as i128) >> (128 - w);
                    ((sx(a) * sx(b)) >> w) as u128 & mask
                } else {
                    (a * b) >> w
                };
                hi + c + cin
            }
        };
        ((sum & mask) as u64, (sum >> w) as u64)
    }
}
