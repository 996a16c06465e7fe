//! Decoding of the warp matrix functions (`wmma.load`, `wmma.store`, `wmma.mma`), sparse
//! `mma.sp`, the Volta `mma.m8n8k4` f16 forms and `movmatrix` into [`Op::Wmma`] ([`crate::wmma`] has the forms and layouts).

use super::*;
use crate::mma_any::AnySpec;
use crate::mma_sp::SparseSpec;
use crate::mma_volta::VoltaSpec;
use crate::wmma::{self as wm, WmmaOp};

/// The opcodes this module decodes (the rest of the tensor family goes to `tensor.rs`).
pub(super) fn is_wmma_family(op: Opcode) -> bool {
    use Opcode as O;
    matches!(
        op,
        O::WmmaLoadA | O::WmmaLoadB | O::WmmaLoadC | O::WmmaStoreD | O::WmmaMma | O::MmaSp
    ) || matches!(op, O::MmaSpOrdered | O::Movmatrix)
}

/// The D, A, B and C fragment registers of an mma-like instruction.
type Frags = (Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>);

impl Decoder<'_> {
    /// Decodes one instruction of [`is_wmma_family`].
    pub(super) fn decode_wmma(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        use Opcode as O;
        let op = match ins.op {
            O::WmmaLoadA | O::WmmaLoadB | O::WmmaLoadC | O::WmmaStoreD => self.wmma_ldst(ins)?,
            O::WmmaMma if ins.types().any(wm::is_sub_byte) => {
                let spec = AnySpec::from_wmma(ins).map_err(|e| self.err(ins, e))?;
                let (d, a, b, c) = self.mma_frags(ins, spec.frag_counts())?;
                WmmaOp::Any { spec, d, a, b, c }
            }
            O::WmmaMma => self.wmma_mma(ins)?,
            O::MmaSp | O::MmaSpOrdered => self.mma_sparse(ins)?,
            O::Mma if VoltaSpec::is_form(ins) => {
                let spec = VoltaSpec::from_instruction(ins).map_err(|e| self.err(ins, e))?;
                let (d, a, b, c) = self.mma_frags(ins, spec.frag_counts())?;
                WmmaOp::Volta { spec, d, a, b, c }
            }
            O::Mma => self.mma_any(ins)?,
            O::Movmatrix => {
                if !(ins.has(Flag::Trans) && ins.ty() == Some(Ty::B16)) {
                    return Err(self.err(ins, "movmatrix needs .m8n8.trans.b16"));
                }
                let kernel = self.f;
                let d = self.dst(ins, role(kernel, ins, Role::Dst)?)?;
                let a = self.src(ins, role(kernel, ins, Role::A)?)?;
                WmmaOp::Movmatrix { d, a }
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(Op::Wmma(Box::new(op)), ins0, guard);
        Ok(())
    }

    fn wmma_ldst(&mut self, ins: &Instruction) -> Result<WmmaOp, EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        let (frag, row) = wm::ldst_frag(ins).map_err(|e| self.err(ins, e))?;
        let load = ins.op != Opcode::WmmaStoreD;
        let regs = if load {
            self.vec_dsts(ins, arg(Role::Dst)?)?
        } else {
            self.vec_srcs(ins, arg(Role::Src)?)?
        };
        if regs.len() != frag.regs() {
            return Err(self.err(
                ins,
                format!("this wmma fragment needs {} registers", frag.regs()),
            ));
        }
        let (addr, off, sym) = self.addr(ins, arg(Role::Addr)?)?;
        let space = self.resolve_space(ins, sym);
        if !matches!(space, MSpace::Global | MSpace::Shared | MSpace::Generic) {
            return Err(self.err(
                ins,
                "wmma.load/store address must be .global, .shared or generic",
            ));
        }
        let stride = match ins.operand(Role::Stride) {
            Some(o) => Some(self.src(ins, o)?),
            None => None,
        };
        Ok(WmmaOp::LdSt {
            load,
            frag,
            row,
            regs,
            addr,
            off,
            stride,
            space,
        })
    }

    fn wmma_mma(&mut self, ins: &Instruction) -> Result<WmmaOp, EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        let spec = wm::WmmaSpec::from_instruction(ins).map_err(|e| self.err(ins, e))?;
        let d = self.vec_dsts(ins, arg(Role::Dst)?)?;
        let a = self.vec_srcs(ins, arg(Role::A)?)?;
        let b = self.vec_srcs(ins, arg(Role::B)?)?;
        let c = self.vec_srcs(ins, arg(Role::C)?)?;
        use crate::wmma::FragKind as K;
        let want = [
            (d.len(), spec.d_frag().regs(), "D"),
            (a.len(), spec.frag(K::A).regs(), "A"),
            (b.len(), spec.frag(K::B).regs(), "B"),
            (c.len(), spec.frag(K::C).regs(), "C"),
        ];
        for (got, need, what) in want {
            if got != need {
                return Err(self.err(
                    ins,
                    format!("wmma.mma fragment {what} needs {need} registers, got {got}"),
                ));
            }
        }
        Ok(WmmaOp::Mma { spec, d, a, b, c })
    }

    fn mma_sparse(&mut self, ins: &Instruction) -> Result<WmmaOp, EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        let spec = SparseSpec::from_instruction(ins).map_err(|e| self.err(ins, e))?;
        let (d, a, b, c) = self.mma_frags(ins, spec.frag_counts())?;
        let meta = self.src(ins, arg(Role::Meta)?)?;
        let max = spec.max_selector();
        let sel = match arg(Role::SparsitySel)? {
            Operand::Imm(i) if i.bits() <= max as u64 => i.bits() as u32,
            _ => {
                return Err(self.err(
                    ins,
                    format!(
                        "the sparsity selector of this mma.sp form must be an immediate 0..={max}"
                    ),
                ))
            }
        };
        Ok(WmmaOp::Sparse {
            spec,
            d,
            a,
            b,
            c,
            meta,
            sel,
        })
    }

    /// A dense `mma` form of [`crate::mma_any`] (sub-byte, `.b1`, s8/u8 m8n8k16).
    fn mma_any(&mut self, ins: &Instruction) -> Result<WmmaOp, EmuError> {
        let spec = AnySpec::from_mma(ins).map_err(|e| self.err(ins, e))?;
        let (d, a, b, c) = self.mma_frags(ins, spec.frag_counts())?;
        Ok(WmmaOp::Any { spec, d, a, b, c })
    }

    /// The D, A, B and C fragment registers of an mma-like instruction, checked against the
    /// counts `(a, b, c, d)` its form needs.
    fn mma_frags(
        &mut self,
        ins: &Instruction,
        (na, nb, nc, nd): (usize, usize, usize, usize),
    ) -> Result<Frags, EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        let d = self.vec_dsts(ins, arg(Role::Dst)?)?;
        let a = self.vec_srcs(ins, arg(Role::A)?)?;
        let b = self.vec_srcs(ins, arg(Role::B)?)?;
        let c = self.vec_srcs(ins, arg(Role::C)?)?;
        if a.len() != na || b.len() != nb || c.len() != nc || d.len() != nd {
            return Err(self.err(
                ins,
                format!(
                    "`{}`: fragment register counts must be A {na}, B {nb}, C {nc}, D {nd}",
                    ins.op.name()
                ),
            ));
        }
        Ok((d, a, b, c))
    }
}
