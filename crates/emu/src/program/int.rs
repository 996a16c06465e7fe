//! Decoding of the integer, bit-manipulation, comparison and selection instructions
//! (`add`..`bfe` on integer types, `div`/`rem`, `bfi`, `shf`, `lop3`, `setp`/`set`, `selp`/`slct`).

use super::*;

impl Decoder<'_> {
    /// Decodes one instruction of the integer/bit family: the opcodes [`family`] sends here.
    pub(super) fn decode_int(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let a = &ins.args;
        let kernel = self.f;
        let arg = |i: usize| operand(kernel, ins, i);
        let ty = ins.ty();
        use Opcode as O;
        let op = match ins.op {
            O::Div | O::Rem => {
                let t = ty.ok_or_else(|| self.err(ins, "div without type"))?;
                let d = self.dst(ins, arg(0)?)?;
                let (x, y) = (self.src(ins, arg(1)?)?, self.src(ins, arg(2)?)?);
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
                let d = self.dst(ins, arg(0)?)?;
                let s: Vec<u32> = a[1..5.min(a.len())]
                    .iter()
                    .map(|x| self.src(ins, x))
                    .collect::<Result<_, _>>()?;
                if s.len() != 4 {
                    return Err(self.err(ins, "bfi needs four sources"));
                }
                Op::Bfi {
                    bits: t.bits(),
                    d,
                    a: s[0],
                    b: s[1],
                    c: s[2],
                    e: s[3],
                }
            }
            O::Shf => {
                let d = self.dst(ins, arg(0)?)?;
                let (x, y, z) = (
                    self.src(ins, arg(1)?)?,
                    self.src(ins, arg(2)?)?,
                    self.src(ins, arg(3)?)?,
                );
                Op::Shf {
                    left: ins.has(Flag::L),
                    wrap: ins.has(Flag::Wrap),
                    d,
                    a: x,
                    b: y,
                    c: z,
                }
            }
            O::Lop3 => {
                let d = self.dst(ins, arg(0)?)?;
                let (x, y, z) = (
                    self.src(ins, arg(1)?)?,
                    self.src(ins, arg(2)?)?,
                    self.src(ins, arg(3)?)?,
                );
                let lut = match arg(4)? {
                    Operand::Imm(i) => i.bits() as u8,
                    _ => return Err(self.err(ins, "lop3 needs an immediate LUT")),
                };
                Op::Lop3 {
                    lut,
                    d,
                    a: x,
                    b: y,
                    c: z,
                }
            }
            O::Prmt => {
                let f = alu::int_fn(ins)
                    .ok_or_else(|| self.err(ins, "operation/type combination not supported"))?;
                let op = |r: Role| role(kernel, ins, r);
                Op::Alu {
                    f,
                    d: self.dst(ins, op(Role::Dst)?)?,
                    a: self.src(ins, op(Role::A)?)?,
                    b: self.src(ins, op(Role::B)?)?,
                    c: self.src(ins, op(Role::Selector)?)?,
                }
            }
            O::Selp | O::Slct => {
                let d = self.dst(ins, arg(0)?)?;
                let (x, y, z) = (
                    self.src(ins, arg(1)?)?,
                    self.src(ins, arg(2)?)?,
                    self.src(ins, arg(3)?)?,
                );
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
                let d = self.dst(ins, arg(0)?)?;
                let s: Vec<u32> = a[1..]
                    .iter()
                    .map(|x| self.src(ins, x))
                    .collect::<Result<_, _>>()?;
                Op::Alu {
                    f,
                    d,
                    a: s.first().copied().unwrap_or(ZERO),
                    b: s.get(1).copied().unwrap_or(ZERO),
                    c: s.get(2).copied().unwrap_or(ZERO),
                }
            }
        };
        self.push(op, ins0, guard);
        Ok(())
    }

    /// Decodes one instruction of the comparison (`setp`, `set`) family: the opcodes [`family`] sends here.
    pub(super) fn decode_compare(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        use Opcode as O;
        let op = match ins.op {
            O::Setp | O::Set => {
                let tys: Vec<Ty> = ins.types().collect();
                let cmp_ty = *tys
                    .last()
                    .ok_or_else(|| self.err(ins, "setp without type"))?;
                let cmp = ins
                    .cmp_op()
                    .ok_or_else(|| self.err(ins, "comparison operator missing"))?
                    .flag();
                let f = if cmp_ty.is_float() {
                    alu::float_cmp(cmp_ty, cmp)
                } else {
                    alu::int_cmp(cmp_ty, cmp)
                };
                let f = f.ok_or_else(|| self.err(ins, "unsupported comparison type"))?;
                let combine = ins.bool_op().map(|b| b.flag());
                let (d0, d1) = match arg(Role::Dst)? {
                    Operand::Pair(p, q) => (self.dst(ins, p)?, Some(self.dst(ins, q)?)),
                    o => (self.dst(ins, o)?, None),
                };
                let x = self.src(ins, arg(Role::A)?)?;
                let y = self.src(ins, arg(Role::B)?)?;
                let c = if combine.is_some() {
                    self.src(ins, arg(Role::C)?)?
                } else {
                    ZERO
                };
                let t = self.new_slot(1);
                self.push(
                    Op::Alu {
                        f,
                        d: t,
                        a: x,
                        b: y,
                        c: ZERO,
                    },
                    ins0,
                    guard,
                );
                let comb = combine.unwrap_or(Flag::Rn);
                if ins.op == O::Set {
                    let t2 = self.new_slot(1);
                    self.push(
                        Op::Alu {
                            f: alu::bool_combine(comb, false),
                            d: t2,
                            a: t,
                            b: c,
                            c: ZERO,
                        },
                        ins0,
                        guard,
                    );
                    let float = tys.first() == Some(&Ty::F32);
                    Op::Alu {
                        f: alu::set_result(float),
                        d: d0,
                        a: t2,
                        b: ZERO,
                        c: ZERO,
                    }
                } else {
                    if let Some(q) = d1 {
                        self.push(
                            Op::Alu {
                                f: alu::bool_combine(comb, true),
                                d: q,
                                a: t,
                                b: c,
                                c: ZERO,
                            },
                            ins0,
                            guard,
                        );
                    }
                    Op::Alu {
                        f: alu::bool_combine(comb, false),
                        d: d0,
                        a: t,
                        b: c,
                        c: ZERO,
                    }
                }
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }
}
