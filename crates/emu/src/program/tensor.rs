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
        let arg = |r: Role| role(kernel, ins, r);
        use Opcode as O;
        let op = match ins.op {
            // sub-byte, .b1 and m8n8k16 forms (`crate::mma_any`) and the Volta m8n8k4 f16 forms
            // (`crate::mma_volta`): decoded with the wmma family
            O::Mma
                if crate::mma_any::AnySpec::is_dense_form(ins)
                    || crate::mma_volta::VoltaSpec::is_form(ins) =>
            {
                return self.decode_wmma(ins, ins0, guard)
            }
            O::Mma => {
                let spec = MmaSpec::from_instruction(ins).map_err(|e| self.err(ins, e))?;
                let d = self.vec_dsts(ins, arg(Role::Dst)?)?;
                let x = self.vec_srcs(ins, arg(Role::A)?)?;
                let y = self.vec_srcs(ins, arg(Role::B)?)?;
                let z = self.vec_srcs(ins, arg(Role::C)?)?;
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
                    let ds = self.vec_dsts(ins, arg(Role::Dst)?)?;
                    let (addr, off, _) = self.addr(ins, arg(Role::Addr)?)?;
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
                    let (addr, off, _) = self.addr(ins, arg(Role::Addr)?)?;
                    let srcs = self.vec_srcs(ins, arg(Role::Src)?)?;
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
        let kernel = self.f;
        let arg_r = |r: Role| role(kernel, ins, r);
        use Opcode as O;
        let op = match ins.op {
            O::WgmmaFence => Op::Nop,
            O::WgmmaCommitGroup => Op::WgmmaCommit,
            O::WgmmaWaitGroup => {
                let n = match arg_r(Role::N)? {
                    Operand::Imm(i) => i.bits() as u32,
                    _ => return Err(self.err(ins, "wgmma.wait_group needs an immediate")),
                };
                Op::WgmmaWait { n }
            }
            O::WgmmaMmaAsync | O::WgmmaMmaAsyncSp => {
                let spec = crate::hopper::WgmmaSpec::from_instruction(ins)
                    .map_err(|e| self.err(ins, e))?;
                let d = self.vec_dsts(ins, arg_r(Role::Dst)?)?;
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
                    let v = self.vec_srcs(ins, arg_r(Role::A)?)?;
                    if v.len() != 4 {
                        return Err(self.err(ins, "wgmma A from registers needs 4 registers"));
                    }
                    (NONE, v)
                } else {
                    (self.src(ins, arg_r(Role::A)?)?, Vec::new())
                };
                let b_desc = self.src(ins, arg_r(Role::BDesc)?)?;
                let scale_d = self.src(ins, arg_r(Role::ScaleD)?)?;
                // the immediates are optional (integer forms have none); A in registers has no
                // `imm-trans-a`
                let imm = |r: Role, default: i64| -> i64 {
                    match ins.operand(r) {
                        Some(Operand::Imm(ptx::Imm::Int(v))) => *v,
                        _ => default,
                    }
                };
                let neg_a = imm(Role::ImmScaleA, 1) == -1;
                let neg_b = imm(Role::ImmScaleB, 1) == -1;
                let trans_a = imm(Role::ImmTransA, 0) == 1;
                let trans_b = imm(Role::ImmTransB, 0) == 1;
                let sparse = if ins.op == O::WgmmaMmaAsyncSp {
                    Some(self.wgmma_sparse(ins, &spec)?)
                } else {
                    None
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
                    sparse,
                    satfinite: ins.has(Flag::Satfinite),
                }))
            }
            O::Setmaxnreg => {
                let n = match arg_r(Role::RegCount)? {
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

impl Decoder<'_> {
    /// The metadata slot and sparsity selector of `wgmma.mma_async.sp` ([`crate::mma_sp`]).
    fn wgmma_sparse(
        &mut self,
        ins: &Instruction,
        spec: &crate::hopper::WgmmaSpec,
    ) -> Result<(u32, u32), EmuError> {
        let kernel = self.f;
        let layout = crate::mma_sp::SparseLayout::for_wgmma(spec.aty);
        let meta = self.src(ins, role(kernel, ins, Role::Meta)?)?;
        let max = layout.max_selector();
        match role(kernel, ins, Role::SparsitySel)? {
            Operand::Imm(i) if i.bits() <= max as u64 => Ok((meta, i.bits() as u32)),
            _ => Err(self.err(
                ins,
                format!("the sparsity selector of this wgmma.mma_async.sp must be an immediate 0..={max}"),
            )),
        }
    }
}
