//! Operand rules of the warp matrix functions (`wmma.*`), `mma.sp`, `movmatrix` and the stack
//! instructions (`stacksave`, `stackrestore`, `alloca`). Fragment register counts per form are
//! checked where the forms are decoded (the emulator's `wmma` module).

use super::*;

impl FnCheck<'_> {
    /// Checks one instruction of these families (called from `types`).
    pub(super) fn isa_tc(&mut self, i: &Instruction) {
        use Opcode::*;
        let bad = |s: &mut Self, why: String| s.diag(DiagKind::BadOperand, i.loc, why);
        match i.op {
            WmmaLoadA | WmmaLoadB | WmmaLoadC | WmmaStoreD => {
                let frag = if i.op == WmmaStoreD {
                    Role::Src
                } else {
                    Role::Dst
                };
                if !matches!(i.operand(frag), Some(Operand::Vec(_))) {
                    bad(
                        self,
                        format!("`{}` needs a {{...}} fragment operand", i.op.name()),
                    );
                }
                if let Some(o) = i.operand(Role::Addr) {
                    self.require_addr(i, o);
                }
                if let Some(o) = i.operand(Role::Stride) {
                    self.check(i, o, Want::T(Ty::U32), "stride");
                }
                if i.has(Flag::Row) == i.has(Flag::Col) {
                    bad(
                        self,
                        format!("`{}` needs one of .row and .col", i.op.name()),
                    );
                }
            }
            WmmaMma | MmaSp | MmaSpOrdered => {
                let frags = [Role::Dst, Role::A, Role::B, Role::C];
                for (k, o) in frags.iter().filter_map(|r| i.operand(*r)).enumerate() {
                    if !matches!(o, Operand::Vec(_)) {
                        bad(
                            self,
                            format!(
                                "operand {k} of `{}` must be a {{...}} fragment",
                                i.op.name()
                            ),
                        );
                    }
                }
                if i.op != WmmaMma {
                    if let Some(o) = i.operand(Role::Meta) {
                        self.check(i, o, Want::T(Ty::B32), "sparsity metadata");
                    }
                    if !matches!(i.operand(Role::SparsitySel), Some(Operand::Imm(_))) {
                        bad(
                            self,
                            "the sparsity selector of `mma.sp` must be an immediate".into(),
                        );
                    }
                }
            }
            Movmatrix => {
                let shape = matches!(
                    i.shape(),
                    Some(Mod::Shape {
                        m: 8,
                        n: 8,
                        k: None
                    })
                );
                if !(shape && i.has(Flag::Trans) && i.ty() == Some(Ty::B16)) {
                    bad(self, "`movmatrix` is `.sync.aligned.m8n8.trans.b16`".into());
                }
                for o in &i.args {
                    self.check(i, o, Want::T(Ty::B32), "operand");
                }
            }
            Stacksave | Stackrestore | Alloca => self.stack_form(i),
            _ => {}
        }
    }

    fn stack_form(&mut self, i: &Instruction) {
        let Some(t @ (Ty::U32 | Ty::U64)) = i.ty() else {
            let why = format!("`{}` needs .u32 or .u64", i.op.name());
            return self.diag(DiagKind::TypeMismatch, i.loc, why);
        };
        let a = &i.args;
        for o in a.iter().take(2) {
            self.check(i, o, Want::T(t), "operand");
        }
        if let Some(al) = a.get(2) {
            let ok =
                matches!(al, Operand::Imm(Imm::Int(v)) if *v > 0 && (*v as u64).is_power_of_two());
            if !ok {
                let why = "the alignment of `alloca` must be an immediate power of two".into();
                self.diag(DiagKind::BadOperand, i.loc, why);
            }
        }
    }
}
