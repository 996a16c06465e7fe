//! Decoding of the memory family: `ld`/`ldu`, `st`, cache hints and `createpolicy`.

use super::*;

impl Decoder<'_> {
    /// Decodes one instruction of the memory family: the opcodes [`family`] sends here.
    pub(super) fn decode_memory(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let kernel = self.f;
        let arg_r = |r: Role| role(kernel, ins, r);
        use Opcode as O;
        let op = match ins.op {
            O::Ld | O::Ldu => {
                let t = ins
                    .last_ty()
                    .ok_or_else(|| self.err(ins, "ld without type"))?;
                let mut ds = self.vec_dsts(ins, arg_r(Role::Dst)?)?;
                let (addr, off, sym_space) = self.addr(ins, arg_r(Role::Addr)?)?;
                let space = self.resolve_space(ins, sym_space);
                let elem = if t == Ty::B128 {
                    // a .b128 register is a slot pair: a 16-byte aligned pair of 8-byte words
                    ds = self.b128_pair(ins, &ds)?;
                    8
                } else {
                    elem_size(t)
                };
                Op::Ld {
                    space,
                    elem,
                    sext: t.is_signed(),
                    ds,
                    addr,
                    off,
                    ord: self.ord_of(ins),
                }
            }
            O::St => {
                let t = ins
                    .last_ty()
                    .ok_or_else(|| self.err(ins, "st without type"))?;
                let (addr, off, sym_space) = self.addr(ins, arg_r(Role::Addr)?)?;
                let mut srcs = self.vec_srcs(ins, arg_r(Role::Src)?)?;
                let space = self.resolve_space(ins, sym_space);
                if space == MSpace::Param {
                    return Err(self.err(ins, "stores to the parameter space are not supported"));
                }
                let elem = if t == Ty::B128 {
                    if !matches!(arg_r(Role::Src)?, Operand::Reg(_)) {
                        return Err(self.err(ins, "a .b128 store needs a .b128 register"));
                    }
                    srcs = self.b128_pair(ins, &srcs)?;
                    8
                } else {
                    elem_size(t)
                };
                Op::St {
                    space,
                    elem,
                    srcs,
                    addr,
                    off,
                    ord: self.ord_of(ins),
                }
            }
            O::Prefetch | O::Prefetchu | O::Discard | O::Applypriority => Op::Nop,
            O::Createpolicy => {
                let d = self.dst(ins, arg_r(Role::Dst)?)?;
                Op::Alu {
                    f: alu::mov(8),
                    d,
                    a: ZERO,
                    b: ZERO,
                    c: ZERO,
                }
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }
}

impl Decoder<'_> {
    /// The slots of one `.b128` register operand (low, high).
    fn b128_pair(&self, ins: &Instruction, slots: &[u32]) -> Result<Vec<u32>, EmuError> {
        match slots {
            [s] => Ok(vec![*s, s + 1]),
            _ => Err(self.err(ins, "vectors of .b128 are not supported")),
        }
    }
}
