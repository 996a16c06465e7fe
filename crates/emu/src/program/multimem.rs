//! Decoding of `multimem.ld_reduce`, `multimem.st` and `multimem.red` (multicast memory,
//! [`crate::multicast`]): every type, vector width and operation the validator accepts
//! (`ptx::validate`'s multimem rules, which follow ptxas 13.5), executed in `exec/multimem.rs`.

use super::*;

/// Which multimem instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MultimemKind {
    /// `multimem.ld_reduce`: read every member device's value and reduce them into registers.
    LdReduce,
    /// `multimem.st`: write the registers to every member device.
    St,
    /// `multimem.red`: reduce the registers into every member device's memory.
    Red,
}

/// One decoded multimem instruction.
#[derive(Clone, Debug)]
pub struct MultimemOp {
    pub kind: MultimemKind,
    /// The reduction (unused by `st`).
    pub op: AtomOp,
    /// The element type (`.f16` of `.v8.f16`, `.f16x2` of `.v4.f16x2`).
    pub ty: Ty,
    /// `.acc::f32`: `ld_reduce` of f16/bf16 values sums in f32 and rounds once.
    pub acc_f32: bool,
    /// Destinations (`ld_reduce`) or sources (`st`, `red`), one per vector element.
    pub regs: Vec<u32>,
    pub addr: u32,
    pub off: i64,
    pub ord: Ord,
}

/// Whether `op` is a multimem instruction (decoded here).
pub(super) fn is_multimem(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::MultimemLdReduce | Opcode::MultimemSt | Opcode::MultimemRed
    )
}

impl Decoder<'_> {
    /// Decodes a multimem instruction (the atomic family sends them here).
    pub(super) fn decode_multimem(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        let kind = match ins.op {
            Opcode::MultimemLdReduce => MultimemKind::LdReduce,
            Opcode::MultimemSt => MultimemKind::St,
            Opcode::MultimemRed => MultimemKind::Red,
            _ => return Err(misrouted(self, ins)),
        };
        // the operation/type/vector rules are the validator's; decode only what runs
        if let Some(d) = ptx::validate::multimem_form_error(ins) {
            return Err(self.err(ins, d));
        }
        let ty = ins
            .last_ty()
            .ok_or_else(|| self.err(ins, "multimem without type"))?;
        let op = match kind {
            MultimemKind::St => AtomOp::Exch,
            _ => atom::atom_op(ins).ok_or_else(|| self.err(ins, "multimem without operation"))?,
        };
        let (addr, off, sym) = self.addr(ins, arg(Role::Addr)?)?;
        if sym.is_some() {
            return Err(self.err(
                ins,
                "a multimem address is a register holding a multicast address",
            ));
        }
        let regs = match kind {
            MultimemKind::LdReduce => self.vec_dsts(ins, arg(Role::Dst)?)?,
            MultimemKind::St => self.vec_srcs(ins, arg(Role::Src)?)?,
            MultimemKind::Red => self.vec_srcs(ins, arg(Role::B)?)?,
        };
        if regs.len() != usize::from(ins.vec_width().unwrap_or(1)) {
            return Err(self.err(ins, "multimem operands do not match the vector width"));
        }
        let op = Op::Multimem(Box::new(MultimemOp {
            kind,
            op,
            ty,
            acc_f32: ins.has(Flag::AccF32),
            regs,
            addr,
            off,
            ord: self.ord_of(ins),
        }));
        self.push(op, ins0, guard);
        Ok(())
    }
}
