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
        let arg = |i: usize| operand(kernel, ins, i);
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
                let (d, rest) = if ins.op == O::Atom {
                    (self.dst(ins, arg(0)?)?, 1)
                } else {
                    (NONE, 0)
                };
                let (addr, off, sym_space) = self.addr(ins, arg(rest)?)?;
                let b = self.src(ins, arg(rest + 1)?)?;
                let c = if aop == AtomOp::Cas {
                    self.src(ins, arg(rest + 2)?)?
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
