//! Decoding of moves and conversions: `mov` (pack/unpack included), `cvt`, `cvta`, `isspacep`.

use super::*;

impl Decoder<'_> {
    /// Decodes one instruction of the conversion and move family: the opcodes [`family`] sends here.
    pub(super) fn decode_convert(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        use Opcode as O;
        let op = match ins.op {
            O::Mov if ins.vec_width().is_some() => return self.mov_vector(ins, ins0, guard),
            O::Mov => self.decode_mov(ins)?,
            O::Cvt if ins.has(Flag::Pack) => {
                let f = alu::cvt_pack(ins)
                    .ok_or_else(|| self.err(ins, "cvt.pack form not supported"))?;
                let d = self.role_dst(ins)?;
                let [x, y, z] = self.role_srcs(ins, &[Role::A, Role::B, Role::C])?;
                Op::Alu {
                    f,
                    d,
                    a: x,
                    b: y,
                    c: z,
                }
            }
            O::Cvt => {
                let spec = CvtSpec::from_instruction(ins).map_err(|e| self.err(ins, e))?;
                let d = self.role_dst(ins)?;
                let [x, y, _] = self.role_srcs(ins, &[Role::A, Role::B])?;
                // A signed result narrower than its register is sign-extended to the whole
                // register (`cvt.s16.s8` into a .b32 gives 0xffffffc2 for -62): the general
                // path does that; the fast paths zero-extend.
                let widen = spec.dst.is_signed()
                    && u32::from(self.prog.reg_bits[d as usize]) > spec.dst.bits();
                if let Some(f) = alu::cvt_fast(&spec).filter(|_| !widen) {
                    self.push(
                        Op::Alu {
                            f,
                            d,
                            a: x,
                            b: y,
                            c: ZERO,
                        },
                        ins0,
                        guard,
                    );
                    return Ok(());
                }
                Op::Cvt {
                    spec,
                    d,
                    a: x,
                    b: y,
                }
            }
            O::Cvta => self.decode_cvta(ins)?,
            O::Isspacep => {
                let d = self.role_dst(ins)?;
                let [x, _, _] = self.role_srcs(ins, &[Role::A])?;
                Op::Isspacep {
                    space: self.space_of(ins),
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

impl Decoder<'_> {
    /// Scalar `mov`: unpack into `{...}`, pack from `{...}` (two halves as a lane-parallel ALU
    /// op), a `.b128` slot pair, or a plain register move.
    fn decode_mov(&mut self, ins: &Instruction) -> Result<Op, EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        let t = ins.ty().ok_or_else(|| self.err(ins, "mov without type"))?;
        Ok(match (arg(Role::Dst)?, arg(Role::A)?) {
            (Operand::Vec(ds), src) => {
                let src = self.src(ins, src)?;
                let ds = ds
                    .iter()
                    .map(|x| self.dst(ins, x))
                    .collect::<Result<Vec<_>, _>>()?;
                let part_bits = t.bits() / ds.len() as u32;
                Op::Unpack {
                    part_bits,
                    ds,
                    a: src,
                }
            }
            (dst, Operand::Vec(parts)) => {
                let d = self.dst(ins, dst)?;
                let parts = parts
                    .iter()
                    .map(|x| self.src(ins, x))
                    .collect::<Result<Vec<_>, _>>()?;
                let part_bits = t.bits() / parts.len() as u32;
                match (&parts[..], alu::pack2(part_bits)) {
                    // two halves: a lane-parallel ALU op (same bits as `Op::Pack`)
                    (&[a, b], Some(f)) => Op::Alu {
                        f,
                        d,
                        a,
                        b,
                        c: ZERO,
                    },
                    _ => Op::Pack {
                        part_bits,
                        d,
                        parts,
                    },
                }
            }
            (dst, src @ Operand::Reg(_)) if t == Ty::B128 => {
                // a .b128 register is a slot pair: copy both halves
                let d = self.dst(ins, dst)?;
                let s = self.src(ins, src)?;
                Op::Pack {
                    part_bits: 64,
                    d,
                    parts: vec![s, s + 1],
                }
            }
            (dst, src) => {
                let d = self.dst(ins, dst)?;
                let s = self.src(ins, src)?;
                Op::Alu {
                    f: alu::mov(if t == Ty::Pred { 1 } else { t.size() }),
                    d,
                    a: s,
                    b: ZERO,
                    c: ZERO,
                }
            }
        })
    }

    /// `cvta[.to].space`: the window between a state-space address and its generic address.
    fn decode_cvta(&mut self, ins: &Instruction) -> Result<Op, EmuError> {
        let d = self.role_dst(ins)?;
        let [x, _, _] = self.role_srcs(ins, &[Role::A])?;
        let bits = ins.ty().map(|t| t.bits()).unwrap_or(64);
        let space = ins.space().unwrap_or(Space::Global);
        let window = if space.is_shared() {
            crate::memory::SHARED_WINDOW
        } else if space == Space::Local {
            crate::memory::LOCAL_WINDOW
        } else if space == Space::Global || space == Space::Const {
            0
        } else if space.is_param() && !self.in_func {
            crate::memory::PARAM_WINDOW
        } else {
            return Err(self.err(ins, format!("cvta of .{space} is not supported")));
        };
        let dir = if ins.has(Flag::To) {
            CvtaDir::FromGeneric(window)
        } else {
            CvtaDir::ToGeneric(window)
        };
        Ok(Op::Cvta { dir, d, a: x, bits })
    }

    /// `mov.v4.f32 %w, %v` / `mov.v2.b32 {%a, %b}, %v`: element-wise moves between vector
    /// registers and `{...}` vectors. All sources are read before any destination is written
    /// (`mov.v2.b32 {%a, %b}, {%b, %a}` swaps).
    fn mov_vector(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let t = ins.ty().ok_or_else(|| self.err(ins, "mov without type"))?;
        let n = ins.vec_width().unwrap_or(1) as usize;
        let ds = self.vec_dsts(ins, role(self.f, ins, Role::Dst)?)?;
        let mut ss = self.vec_srcs(ins, role(self.f, ins, Role::A)?)?;
        if ds.len() != n || ss.len() != n {
            return Err(self.err(
                ins,
                format!("`mov` with .v{n} needs {n} destination and {n} source elements"),
            ));
        }
        let f = alu::mov(if t == Ty::Pred { 1 } else { t.size() });
        let mv = |d, a| Op::Alu {
            f,
            d,
            a,
            b: ZERO,
            c: ZERO,
        };
        if ss.iter().any(|s| ds.contains(s)) {
            for s in ss.iter_mut() {
                let tmp = self.new_slot(64);
                self.push(mv(tmp, *s), ins0, guard);
                *s = tmp;
            }
        }
        for (d, s) in ds.into_iter().zip(ss) {
            self.push(mv(d, s), ins0, guard);
        }
        Ok(())
    }
}
