//! Decoding of tensor-core instructions: `mma`, `ldmatrix`/`stmatrix`, `wgmma.*`, `setmaxnreg`.

use super::*;

impl Decoder<'_> {
    /// Decodes one instruction of the tensor-core family: the opcodes [`family`] sends here.
    pub(super) fn decode_tensor(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let kernel = self.f;
        let arg = |i: usize| operand(kernel, ins, i);
        use Opcode as O;
        let op = match ins.op {
            O::Mma => {
                let spec = MmaSpec::from_instruction(ins).map_err(|e| self.err(ins, e))?;
                let d = self.vec_dsts(ins, arg(0)?)?;
                let x = self.vec_srcs(ins, arg(1)?)?;
                let y = self.vec_srcs(ins, arg(2)?)?;
                let z = self.vec_srcs(ins, arg(3)?)?;
                let (na, nb, nc, nd) = spec.frag_counts();
                if x.len() != na || y.len() != nb || z.len() != nc || d.len() != nd {
                    return Err(self.err(
                        ins,
                        format!("fragment register counts must be A {na}, B {nb}, C {nc}, D {nd}"),
                    ));
                }
                Op::Mma {
                    spec: Box::new(spec),
                    d,
                    a: x,
                    b: y,
                    c: z,
                }
            }
            O::Ldmatrix | O::Stmatrix => {
                let count = ins.x_count().unwrap_or(1) as u32;
                let trans = ins.has(Flag::Trans);
                let space = match self.space_of(ins) {
                    MSpace::Generic => MSpace::Generic,
                    _ => MSpace::Shared,
                };
                if ins.op == O::Ldmatrix {
                    let ds = self.vec_dsts(ins, arg(0)?)?;
                    let (addr, off, _) = self.addr(ins, arg(1)?)?;
                    if ds.len() != count as usize {
                        return Err(self.err(
                            ins,
                            format!(".x{count} needs {count} destination registers"),
                        ));
                    }
                    Op::Ldmatrix {
                        count,
                        trans,
                        ds,
                        addr,
                        off,
                        space,
                    }
                } else {
                    let (addr, off, _) = self.addr(ins, arg(0)?)?;
                    let srcs = self.vec_srcs(ins, arg(1)?)?;
                    if srcs.len() != count as usize {
                        return Err(
                            self.err(ins, format!(".x{count} needs {count} source registers"))
                        );
                    }
                    Op::Stmatrix {
                        count,
                        trans,
                        srcs,
                        addr,
                        off,
                        space,
                    }
                }
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }

    /// Decodes one instruction of the Hopper warpgroup (`wgmma.*`, `setmaxnreg`) family: the opcodes [`family`] sends here.
    pub(super) fn decode_wgmma(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let a = &ins.args;
        let kernel = self.f;
        let arg = |i: usize| operand(kernel, ins, i);
        use Opcode as O;
        let op = match ins.op {
            O::WgmmaFence => Op::Nop,
            O::WgmmaCommitGroup => Op::WgmmaCommit,
            O::WgmmaWaitGroup => {
                let n = match arg(0)? {
                    Operand::Imm(i) => i.bits() as u32,
                    _ => return Err(self.err(ins, "wgmma.wait_group needs an immediate")),
                };
                Op::WgmmaWait { n }
            }
            O::WgmmaMmaAsync => {
                let spec = crate::hopper::WgmmaSpec::from_instruction(ins)
                    .map_err(|e| self.err(ins, e))?;
                let d = self.vec_dsts(ins, arg(0)?)?;
                if d.len() != spec.d_regs() {
                    return Err(self.err(
                        ins,
                        format!(
                            "wgmma m64n{} needs {} accumulator registers, got {}",
                            spec.n,
                            spec.d_regs(),
                            d.len()
                        ),
                    ));
                }
                let (a_desc, av) = if spec.a_regs {
                    let v = self.vec_srcs(ins, arg(1)?)?;
                    if v.len() != 4 {
                        return Err(self.err(ins, "wgmma A from registers needs 4 registers"));
                    }
                    (NONE, v)
                } else {
                    (self.src(ins, arg(1)?)?, Vec::new())
                };
                let b_desc = self.src(ins, arg(2)?)?;
                let scale_d = match a.get(3) {
                    Some(o) => self.src(ins, o)?,
                    None => self.konst(1),
                };
                let imm = |i: usize, default: i64| -> i64 {
                    match a.get(i) {
                        Some(Operand::Imm(ptx::Imm::Int(v))) => *v,
                        _ => default,
                    }
                };
                let (neg_a, neg_b) = (imm(4, 1) == -1, imm(5, 1) == -1);
                let (trans_a, trans_b) = if spec.a_regs {
                    (false, imm(6, 0) == 1)
                } else {
                    (imm(6, 0) == 1, imm(7, 0) == 1)
                };
                Op::Wgmma(Box::new(WgmmaOp {
                    spec,
                    d,
                    a_desc,
                    a: av,
                    b_desc,
                    scale_d,
                    neg_a,
                    neg_b,
                    trans_a,
                    trans_b,
                }))
            }
            O::Setmaxnreg => {
                let n = match arg(0)? {
                    Operand::Imm(i) => i.bits() as u32,
                    _ => return Err(self.err(ins, "setmaxnreg needs an immediate")),
                };
                if !(24..=256).contains(&n) || n % 8 != 0 {
                    return Err(
                        self.err(ins, "setmaxnreg count must be a multiple of 8 in 24..256")
                    );
                }
                Op::Setmaxnreg {
                    inc: ins.has(Flag::Inc),
                    n,
                }
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }
}
