//! Decoding of atomics and reductions (`atom`, `red`).

use super::*;

impl Decoder<'_> {
    /// Decodes one instruction of the atomic/reduction family: the opcodes [`family`] sends here.
    pub(super) fn decode_atomic(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        use Opcode as O;
        let op = match ins.op {
            O::Atom | O::Red => {
                let t = ins
                    .last_ty()
                    .ok_or_else(|| self.err(ins, "atom without type"))?;
                let aop = ins
                    .atom_op()
                    .ok_or_else(|| self.err(ins, "atom without operation"))?;
                if ins.vec_width().is_some() {
                    return Err(self.err(ins, "vector atomics are not supported"));
                }
                let d = if ins.op == O::Atom {
                    self.dst(ins, arg(Role::Dst)?)?
                } else {
                    NONE
                };
                let (addr, off, sym_space) = self.addr(ins, arg(Role::Addr)?)?;
                let b = self.src(ins, arg(Role::B)?)?;
                let c = if aop == AtomOp::Cas {
                    self.src(ins, arg(Role::C)?)?
                } else {
                    ZERO
                };
                let space = self.resolve_space(ins, sym_space);
                let ord = match self.ord_of(ins) {
                    Ord::Relaxed if !ins.has(Flag::Relaxed) => Ord::Relaxed,
                    o => o,
                };
                Op::Atom {
                    space,
                    op: aop,
                    ty: t,
                    d,
                    addr,
                    off,
                    b,
                    c,
                    ord,
                }
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }
}
