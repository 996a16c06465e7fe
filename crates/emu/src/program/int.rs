//! Decoding of the integer, bit-manipulation, comparison and selection instructions
//! (`add`..`bfe` on integer types, `div`/`rem`, `bfi`, `shf`, `lop3`, `setp`/`set` including the
//! packed `f16x2`/`bf16x2` comparisons, `selp`/`slct`; `dp2a`, `fns`, `bmsk`, `szext`, `prmt`
//! modes go through `alu::int_fn`).

use super::*;

impl Decoder<'_> {
    /// Decodes one instruction of the integer/bit family: the opcodes [`family`] sends here.
    pub(super) fn decode_int(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let ty = ins.ty();
        use Opcode as O;
        use Role as R;
        let op = match ins.op {
            O::Div | O::Rem => {
                let t = ty.ok_or_else(|| self.err(ins, "div without type"))?;
                let d = self.role_dst(ins)?;
                let [x, y, _] = self.role_srcs(ins, &[R::A, R::B])?;
                Op::IntDiv {
                    ty: t,
                    rem: ins.op == O::Rem,
                    d,
                    a: x,
                    b: y,
                }
            }
            O::Bfi => {
                let t = ty.ok_or_else(|| self.err(ins, "bfi without type"))?;
                let d = self.role_dst(ins)?;
                let [x, y, pos] = self.role_srcs(ins, &[R::A, R::B, R::Pos])?;
                let [len, _, _] = self.role_srcs(ins, &[R::Len])?;
                Op::Bfi {
                    bits: t.bits(),
                    d,
                    a: x,
                    b: y,
                    c: pos,
                    e: len,
                }
            }
            O::Shf => {
                let d = self.role_dst(ins)?;
                let [x, y, z] = self.role_srcs(ins, &[R::A, R::B, R::Shift])?;
                Op::Shf {
                    left: ins.has(Flag::L),
                    wrap: ins.has(Flag::Wrap),
                    d,
                    a: x,
                    b: y,
                    c: z,
                }
            }
            O::Lop3 => return self.decode_lop3(ins, ins0, guard),
            O::Selp | O::Slct => {
                let d = self.role_dst(ins)?;
                let [x, y, z] = self.role_srcs(ins, &[R::A, R::B, R::C])?;
                let f = if ins.op == O::Selp {
                    alu::selp()
                } else {
                    alu::slct(ins.last_ty() == Some(Ty::F32))
                };
                Op::Alu {
                    f,
                    d,
                    a: x,
                    b: y,
                    c: z,
                }
            }
            _ => {
                let f = alu::int_fn(ins)
                    .ok_or_else(|| self.err(ins, "operation/type combination not supported"))?;
                let d = self.role_dst(ins)?;
                let [a, b, c] = self.role_srcs(ins, alu_roles(ins.op))?;
                Op::Alu { f, d, a, b, c }
            }
        };
        self.push(op, ins0, guard);
        Ok(())
    }

    /// `lop3`, and its predicate form `lop3.{and,or}.b32 d|p, a, b, c, immLut, q` (PTX 8.2):
    /// `d` as the plain form, then `p = (d != 0) BoolOp q`.
    fn decode_lop3(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let (d, p) = match role(self.f, ins, Role::Dst)? {
            Operand::Pair(d, p) => (self.dst(ins, d)?, Some(self.dst(ins, p)?)),
            o => (self.dst(ins, o)?, None),
        };
        let [a, b, c] = self.role_srcs(ins, &[Role::A, Role::B, Role::C])?;
        let lut = match role(self.f, ins, Role::Lut)? {
            Operand::Imm(i) => i.bits() as u8,
            _ => return Err(self.err(ins, "lop3 needs an immediate LUT")),
        };
        self.push(Op::Lop3 { lut, d, a, b, c }, ins0, guard);
        let Some(p) = p else { return Ok(()) };
        let comb = [Flag::And, Flag::Or]
            .into_iter()
            .find(|f| ins.has(*f))
            .ok_or_else(|| self.err(ins, "lop3 with a predicate result needs .and or .or"))?;
        let q = self.src(ins, role(self.f, ins, Role::PredIn)?)?;
        let ne =
            alu::int_cmp(Ty::U32, Flag::Ne).ok_or_else(|| self.err(ins, "no u32 comparison"))?;
        let t = self.new_slot(1);
        let nonzero = Op::Alu {
            f: ne,
            d: t,
            a: d,
            b: ZERO,
            c: ZERO,
        };
        self.push(nonzero, ins0, guard);
        let combine = Op::Alu {
            f: alu::bool_combine(comb, false),
            d: p,
            a: t,
            b: q,
            c: ZERO,
        };
        self.push(combine, ins0, guard);
        Ok(())
    }

    /// Decodes one instruction of the comparison (`setp`, `set`) family: the opcodes [`family`] sends here.
    /// Packed `f16x2`/`bf16x2` comparisons compare each half: `setp` writes the low half's
    /// result to `p` and the high half's to `q`, `set` fills each half of `d`.
    pub(super) fn decode_compare(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        if !matches!(ins.op, Opcode::Setp | Opcode::Set) {
            return Err(misrouted(self, ins));
        }
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        let tys: Vec<Ty> = ins.types().collect();
        let cmp_ty = *tys
            .last()
            .ok_or_else(|| self.err(ins, "setp without type"))?;
        let cmp = ins
            .mods
            .iter()
            .find_map(|m| match m {
                Mod::Flag(f) if alu::is_comparison(*f) => Some(*f),
                _ => None,
            })
            .ok_or_else(|| self.err(ins, "comparison operator missing"))?;
        let combine = [Flag::And, Flag::Or, Flag::Xor]
            .into_iter()
            .find(|f| ins.has(*f));
        let x = self.src(ins, arg(Role::A)?)?;
        let y = self.src(ins, arg(Role::B)?)?;
        let c = if combine.is_some() {
            self.src(ins, arg(Role::C)?)?
        } else {
            ZERO
        };
        let comb = combine.unwrap_or(Flag::Rn);
        let packed = matches!(cmp_ty, Ty::F16x2 | Ty::Bf16x2);
        let ftz = ins.has(Flag::Ftz);
        // the comparison of each element into a predicate temporary
        let mut preds = Vec::new();
        for hi in if packed {
            &[false, true][..]
        } else {
            &[false][..]
        } {
            let f = if packed || (ftz && cmp_ty.is_float()) {
                alu::float_cmp_elem(cmp_ty, *hi, ftz, cmp)
            } else if cmp_ty.is_float() {
                alu::float_cmp(cmp_ty, cmp)
            } else {
                alu::int_cmp(cmp_ty, cmp)
            };
            let f = f.ok_or_else(|| self.err(ins, "unsupported comparison type"))?;
            let t = self.new_slot(1);
            let op = Op::Alu {
                f,
                d: t,
                a: x,
                b: y,
                c: ZERO,
            };
            self.push(op, ins0, guard);
            preds.push(t);
        }
        let (d0, d1) = match arg(Role::Dst)? {
            Operand::Pair(p, q) => (self.dst(ins, p)?, Some(self.dst(ins, q)?)),
            o => (self.dst(ins, o)?, None),
        };
        if ins.op == Opcode::Setp {
            self.setp_outputs(ins, ins0, guard, (&preds, c, comb), (d0, d1))
        } else {
            self.set_output(ins0, guard, (&preds, c, comb), tys[0], d0);
            Ok(())
        }
    }

    /// `setp`'s predicates: `p` (and `q`, the complement; for packed types the high half).
    fn setp_outputs(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
        (preds, c, comb): (&[u32], u32, Flag),
        (d0, d1): (u32, Option<u32>),
    ) -> Result<(), EmuError> {
        let alu = |f, d, a| Op::Alu {
            f,
            d,
            a,
            b: c,
            c: ZERO,
        };
        match (preds, d1) {
            ([t], q) => {
                if let Some(q) = q {
                    self.push(alu(alu::bool_combine(comb, true), q, *t), ins0, guard);
                }
                self.push(alu(alu::bool_combine(comb, false), d0, *t), ins0, guard);
            }
            ([lo, hi], Some(q)) => {
                // both read the comparisons, so a destination that is also a source is safe
                self.push(alu(alu::bool_combine(comb, false), q, *hi), ins0, guard);
                self.push(alu(alu::bool_combine(comb, false), d0, *lo), ins0, guard);
            }
            _ => return Err(self.err(ins, "packed setp needs a p|q destination pair")),
        }
        Ok(())
    }

    /// `set`'s value: 1.0 or all ones per element where the combined comparison holds.
    fn set_output(
        &mut self,
        ins0: &Instruction,
        guard: (u32, bool),
        (preds, c, comb): (&[u32], u32, Flag),
        dty: Ty,
        d: u32,
    ) {
        let mut combined = Vec::new();
        for t in preds {
            let t2 = self.new_slot(1);
            let op = Op::Alu {
                f: alu::bool_combine(comb, false),
                d: t2,
                a: *t,
                b: c,
                c: ZERO,
            };
            self.push(op, ins0, guard);
            combined.push(t2);
        }
        let (f, a, b) = match combined[..] {
            [lo, hi] => (alu::set_result_x2(dty), lo, hi),
            _ => (alu::set_result_ty(dty), combined[0], ZERO),
        };
        let op = Op::Alu {
            f,
            d,
            a,
            b,
            c: ZERO,
        };
        self.push(op, ins0, guard);
    }
}

/// The source roles of an `alu::int_fn` instruction, in the function's `a, b, c` order.
fn alu_roles(op: Opcode) -> &'static [Role] {
    match op {
        Opcode::Shl | Opcode::Shr => &[Role::A, Role::Shift],
        Opcode::Bfe => &[Role::A, Role::Pos, Role::Len],
        Opcode::Szext => &[Role::A, Role::Len],
        Opcode::Prmt => &[Role::A, Role::B, Role::Selector],
        _ => &[Role::A, Role::B, Role::C],
    }
}
