//! Decoding of floating-point arithmetic (`add`..`copysign` on float types) and `testp`.

use super::*;

impl Decoder<'_> {
    /// Decodes one instruction of the float family: the opcodes [`family`] sends here.
    pub(super) fn decode_float(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let ty = ins.ty();
        use Opcode as O;
        let op = match ins.op {
            O::Add
            | O::Sub
            | O::Mul
            | O::Mad
            | O::Fma
            | O::Min
            | O::Max
            | O::Neg
            | O::Abs
            | O::Div
            | O::Rcp
            | O::Sqrt
            | O::Rsqrt
            | O::Sin
            | O::Cos
            | O::Lg2
            | O::Ex2
            | O::Tanh
            | O::Copysign
                if ty.is_some_and(|t| t.is_float()) =>
            {
                let t = ty.unwrap_or(Ty::F32);
                let d = self.role_dst(ins)?;
                let s = self.role_srcs(ins, &[Role::A, Role::B, Role::C])?;
                let get = |i: usize| s[i];
                let plain = !ins.mods.iter().any(|m| {
                    matches!(
                        m,
                        Mod::Flag(
                            Flag::Rz
                                | Flag::Rm
                                | Flag::Rp
                                | Flag::Ftz
                                | Flag::Sat
                                | Flag::Relu
                                | Flag::NaN
                                | Flag::Xorsign
                        )
                    )
                });
                if t == Ty::F32 && plain {
                    if let Some(f) = alu::f32_fast(ins.op) {
                        self.push(
                            Op::Alu {
                                f,
                                d,
                                a: get(0),
                                b: get(1),
                                c: get(2),
                            },
                            ins0,
                            guard,
                        );
                        return Ok(());
                    }
                }
                // Round-to-nearest f32 with or without .ftz: fast, exact or within bounds.
                let only_ftz = !ins.mods.iter().any(|m| {
                    matches!(
                        m,
                        Mod::Flag(
                            Flag::Rz
                                | Flag::Rm
                                | Flag::Rp
                                | Flag::Sat
                                | Flag::Relu
                                | Flag::NaN
                                | Flag::Xorsign
                        )
                    )
                });
                // `div.f32` without .rn/.full/.approx is left to the exact unit.
                let div_mode = ins
                    .mods
                    .iter()
                    .any(|m| matches!(m, Mod::Flag(Flag::Rn | Flag::Full | Flag::Approx)));
                if t == Ty::F32 && only_ftz && (ins.op != O::Div || div_mode) {
                    if let Some(f) = alu::f32_special(ins.op, ins.has(Flag::Ftz)) {
                        self.push(
                            Op::Alu {
                                f,
                                d,
                                a: get(0),
                                b: get(1),
                                c: get(2),
                            },
                            ins0,
                            guard,
                        );
                        return Ok(());
                    }
                }
                let fop = match ins.op {
                    O::Add => FOp::Add,
                    O::Sub => FOp::Sub,
                    O::Mul => FOp::Mul,
                    O::Mad | O::Fma => FOp::Fma,
                    O::Min => FOp::Min,
                    O::Max => FOp::Max,
                    O::Neg => FOp::Neg,
                    O::Abs => FOp::Abs,
                    O::Div => FOp::Div,
                    O::Rcp => FOp::Rcp,
                    O::Sqrt => FOp::Sqrt,
                    O::Rsqrt => FOp::Rsqrt,
                    O::Sin => FOp::Sin,
                    O::Cos => FOp::Cos,
                    O::Lg2 => FOp::Lg2,
                    O::Ex2 => FOp::Ex2,
                    O::Tanh => FOp::Tanh,
                    _ => FOp::Copysign,
                };
                let op = Op::Float {
                    op: fop,
                    ty: t,
                    mode: FMode::from_instruction(ins),
                    d,
                    a: get(0),
                    b: get(1),
                    c: get(2),
                };
                if ins.has(Flag::Oob) {
                    return self.fma_oob(op, (d, s), ins0, guard);
                }
                op
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }

    /// `fma.oob`: the mask of halves with no out-of-bounds NaN input (computed before the
    /// fma, which may overwrite an input), the fma, then the mask applied to `d`.
    fn fma_oob(
        &mut self,
        fma: Op,
        (d, s): (u32, [u32; 3]),
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let t = self.new_slot(32);
        let mask = Op::Alu {
            f: alu::oob_keep_mask(),
            d: t,
            a: s[0],
            b: s[1],
            c: s[2],
        };
        self.push(mask, ins0, guard);
        self.push(fma, ins0, guard);
        let apply = Op::Alu {
            f: alu::and_bits(),
            d,
            a: d,
            b: t,
            c: ZERO,
        };
        self.push(apply, ins0, guard);
        Ok(())
    }

    /// Decodes one instruction of the `testp` family: the opcodes [`family`] sends here.
    pub(super) fn decode_testp(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let ty = ins.ty();
        use Opcode as O;
        let op = match ins.op {
            O::Testp => {
                let kind = fp::TestpKind::from_instruction(ins).map_err(|e| self.err(ins, e))?;
                let d = self.role_dst(ins)?;
                let [x, _, _] = self.role_srcs(ins, &[Role::A])?;
                Op::Testp {
                    kind,
                    ty: ty.unwrap_or(Ty::F32),
                    d,
                    a: x,
                }
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }
}
