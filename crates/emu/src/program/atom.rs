//! Decoding of atomics and reductions (`atom`, `red`): scalar forms, the `.v2`/`.v4`/`.v8`
//! vector forms (global, `.add`/`.min`/`.max` on f32, f16, bf16, f16x2, bf16x2) and the 128-bit
//! `atom.cas.b128` / `atom.exch.b128`.

use super::*;

/// The reduction/atomic operation named by `ins`'s modifiers (`.add`, `.min`, ..., `.cas`).
pub(super) fn atom_op(ins: &Instruction) -> Option<AtomOp> {
    [
        (Flag::Add, AtomOp::Add),
        (Flag::Min, AtomOp::Min),
        (Flag::Max, AtomOp::Max),
        (Flag::Inc, AtomOp::Inc),
        (Flag::Dec, AtomOp::Dec),
        (Flag::And, AtomOp::And),
        (Flag::Or, AtomOp::Or),
        (Flag::Xor, AtomOp::Xor),
        (Flag::Exch, AtomOp::Exch),
        (Flag::Cas, AtomOp::Cas),
    ]
    .iter()
    .find(|(f, _)| ins.has(*f))
    .map(|x| x.1)
}

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
        if !matches!(ins.op, Opcode::Atom | Opcode::Red) {
            return Err(misrouted(self, ins));
        }
        let t = ins
            .last_ty()
            .ok_or_else(|| self.err(ins, "atom without type"))?;
        let aop = atom_op(ins).ok_or_else(|| self.err(ins, "atom without operation"))?;
        let rest = usize::from(ins.op == Opcode::Atom);
        let (addr, off, sym_space) = self.addr(ins, arg(Role::Addr)?)?;
        let space = self.resolve_space(ins, sym_space);
        let ord = self.ord_of(ins);
        let op = if ins.vec_width().is_some() {
            self.decode_atom_vec(ins, aop, t, (addr, off, space), ord)?
        } else if t == Ty::B128 {
            if !matches!(aop, AtomOp::Cas | AtomOp::Exch) || rest == 0 {
                return Err(self.err(ins, "128-bit atomics are atom.cas.b128 and atom.exch.b128"));
            }
            let d = self.dst(ins, arg(Role::Dst)?)?;
            let b = self.src(ins, arg(Role::B)?)?;
            let c = if aop == AtomOp::Cas {
                self.src(ins, arg(Role::C)?)?
            } else {
                ZERO
            };
            let operands = [Role::B, Role::C, Role::CacheHint].map(|r| ins.operand(r));
            if operands
                .into_iter()
                .flatten()
                .any(|o| !matches!(o, Operand::Reg(_)))
            {
                return Err(self.err(ins, "128-bit atomic operands must be .b128 registers"));
            }
            Op::Atom128 {
                space,
                cas: aop == AtomOp::Cas,
                d,
                addr,
                off,
                b,
                c,
                ord,
            }
        } else {
            let d = if rest == 1 {
                self.dst(ins, arg(Role::Dst)?)?
            } else {
                NONE
            };
            let b = self.src(ins, arg(Role::B)?)?;
            let c = if aop == AtomOp::Cas {
                self.src(ins, arg(Role::C)?)?
            } else {
                ZERO
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
        };
        self.push(op, ins0, guard);
        Ok(())
    }

    /// A vector `atom`/`red`: `.add`/`.min`/`.max` in global memory, one atomic per element.
    fn decode_atom_vec(
        &mut self,
        ins: &Instruction,
        aop: AtomOp,
        t: Ty,
        (addr, off, space): (u32, i64, MSpace),
        ord: Ord,
    ) -> Result<Op, EmuError> {
        if !matches!(aop, AtomOp::Add | AtomOp::Min | AtomOp::Max) {
            return Err(self.err(ins, "vector atomics are .add, .min or .max"));
        }
        if !matches!(t, Ty::F32 | Ty::F16 | Ty::Bf16 | Ty::F16x2 | Ty::Bf16x2) {
            return Err(self.err(ins, format!("vector atomics on .{t} are not defined")));
        }
        if !matches!(space, MSpace::Global | MSpace::Generic) {
            return Err(self.err(ins, "vector atomics operate on global memory only"));
        }
        let atom = ins.op == Opcode::Atom;
        let ds = if atom {
            self.vec_dsts(ins, role(self.f, ins, Role::Dst)?)?
        } else {
            Vec::new()
        };
        let bs = self.vec_srcs(ins, role(self.f, ins, Role::B)?)?;
        if ins.vec_width() != Some(bs.len() as u8) || (atom && ds.len() != bs.len()) {
            return Err(self.err(ins, "vector atomic operands do not match the vector width"));
        }
        Ok(Op::AtomVec {
            op: aop,
            ty: t,
            ds,
            addr,
            off,
            bs,
            ord,
        })
    }
}
