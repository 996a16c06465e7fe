//! Decoding of asynchronous copies and mbarriers: `cp.async*`, `cp.async.bulk[.tensor]`,
//! `mbarrier.*`.

use super::*;

impl Decoder<'_> {
    /// Decodes one instruction of the async copy family: the opcodes [`family`] sends here.
    pub(super) fn decode_async_copy(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        use Opcode as O;
        let op = match ins.op {
            O::CpAsync => {
                let (dst, doff, _) = self.addr(ins, arg(Role::Dst)?)?;
                let (src, soff, _) = self.addr(ins, arg(Role::Src)?)?;
                let size = match arg(Role::CpSize)? {
                    Operand::Imm(i) => i.bits() as u32,
                    _ => return Err(self.err(ins, "cp.async size must be an immediate")),
                };
                if ![4, 8, 16].contains(&size) {
                    return Err(self.err(ins, "cp.async size must be 4, 8 or 16"));
                }
                let src_size = match ins.operand(Role::SrcSize) {
                    Some(o @ (Operand::Imm(Imm::Int(_)) | Operand::Reg(_))) => self.src(ins, o)?,
                    _ => self.konst(size as u64),
                };
                Op::CpAsync {
                    dst,
                    doff,
                    src,
                    soff,
                    size,
                    src_size,
                    dspace: MSpace::Shared,
                }
            }
            O::CpAsyncCommitGroup | O::CpAsyncWaitGroup | O::CpAsyncWaitAll => Op::Nop,
            O::CpAsyncBulkCommitGroup | O::CpAsyncBulkWaitGroup | O::CpAsyncBulkPrefetchTensor => {
                Op::Nop
            }
            O::CpAsyncBulk => {
                let sp: Vec<Space> = ins.spaces().collect();
                let to_ms = |s: Option<&Space>| match s {
                    Some(Space::Global) => MSpace::Global,
                    Some(x) if x.is_shared() => MSpace::Shared,
                    _ => MSpace::Generic,
                };
                let (dspace, sspace) = (to_ms(sp.first()), to_ms(sp.get(1)));
                let (dst, doff, _) = self.addr(ins, arg(Role::Dst)?)?;
                let (src, soff, _) = self.addr(ins, arg(Role::Src)?)?;
                let size = self.src(ins, arg(Role::Size)?)?;
                let mbar = match ins.operand(Role::Mbar) {
                    Some(o) => {
                        let (m, mo, _) = self.addr(ins, o)?;
                        Some((m, mo))
                    }
                    None => None,
                };
                Op::Bulk {
                    dst,
                    doff,
                    dspace,
                    src,
                    soff,
                    sspace,
                    size,
                    mbar,
                }
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }

    /// Decodes one instruction of the TMA (`cp.async.bulk.tensor`) family: the opcodes [`family`] sends here.
    pub(super) fn decode_bulk_tensor(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        use Opcode as O;
        let op = match ins.op {
            O::CpAsyncBulkTensor => {
                if ins.has(Flag::Im2col) {
                    return Err(self.err(
                        ins,
                        "im2col tensor copies are not supported by the emulator",
                    ));
                }
                // A load writes shared memory (`Dst`) from the tensor (`Src`); a store the reverse.
                let load = ins.space() != Some(Space::Global);
                let (s_role, t_role) = if load {
                    (Role::Dst, Role::Src)
                } else {
                    (Role::Src, Role::Dst)
                };
                let (smem, soff, _) = self.addr(ins, arg(s_role)?)?;
                let (tmap, toff, tspace, coords) = match arg(t_role)? {
                    Operand::TensorAddr { base, coords } => {
                        let (slot, off, sp) = self.addr(
                            ins,
                            &Operand::Addr {
                                base: base.clone(),
                                offset: 0,
                            },
                        )?;
                        let cs = coords
                            .iter()
                            .map(|c| self.src(ins, c))
                            .collect::<Result<Vec<_>, _>>()?;
                        (slot, off, sp.unwrap_or(MSpace::Generic), cs)
                    }
                    _ => return Err(self.err(ins, "expected [tensorMap, {coords}]")),
                };
                let mbar = if load {
                    let (m, mo, _) = self.addr(ins, arg(Role::Mbar)?)?;
                    Some((m, mo))
                } else {
                    None
                };
                let cta_mask = match ins.operand(Role::CtaMask) {
                    Some(o) => self.src(ins, o)?,
                    None => NONE,
                };
                Op::BulkTensor {
                    load,
                    smem,
                    soff,
                    tmap,
                    toff,
                    tspace,
                    coords,
                    mbar,
                    cta_mask,
                }
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }

    /// Decodes one instruction of the mbarrier family: the opcodes [`family`] sends here.
    pub(super) fn decode_mbarrier(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        use Opcode as O;
        let op = match ins.op {
            O::MbarrierInit => {
                let (addr, off, _) = self.addr(ins, arg(Role::Addr)?)?;
                let count = self.src(ins, arg(Role::Count)?)?;
                Op::MbarInit { addr, off, count }
            }
            O::MbarrierInval => {
                let (addr, off, _) = self.addr(ins, arg(Role::Addr)?)?;
                Op::MbarInval { addr, off }
            }
            O::MbarrierArrive | O::MbarrierArriveDrop => {
                let d = self.dst(ins, arg(Role::State)?)?;
                let (addr, off, _) = self.addr(ins, arg(Role::Addr)?)?;
                let mut opt = |r: Role| match ins.operand(r) {
                    Some(o) => self.src(ins, o),
                    None => Ok(NONE),
                };
                let (count, tx) = (opt(Role::Count)?, opt(Role::TxCount)?);
                let remote = ins.mods.contains(&Mod::Space(Space::SharedCluster));
                Op::MbarArrive {
                    d,
                    addr,
                    off,
                    count,
                    tx,
                    drop: ins.op == O::MbarrierArriveDrop,
                    remote,
                }
            }
            O::MbarrierExpectTx | O::MbarrierCompleteTx => {
                let (addr, off, _) = self.addr(ins, arg(Role::Addr)?)?;
                let bytes = self.src(ins, arg(Role::TxCount)?)?;
                Op::MbarTx {
                    addr,
                    off,
                    bytes,
                    complete: ins.op == O::MbarrierCompleteTx,
                }
            }
            O::MbarrierTestWait | O::MbarrierTryWait => {
                let d = self.dst(ins, arg(Role::WaitComplete)?)?;
                let (addr, off, _) = self.addr(ins, arg(Role::Addr)?)?;
                let phase = if ins.has(Flag::Parity) {
                    Role::Phase
                } else {
                    Role::State
                };
                let x = self.src(ins, arg(phase)?)?;
                Op::MbarWait {
                    d,
                    addr,
                    off,
                    arg: x,
                    parity: ins.has(Flag::Parity),
                }
            }
            O::MbarrierPendingCount => {
                let d = self.dst(ins, arg(Role::Dst)?)?;
                let st = self.src(ins, arg(Role::State)?)?;
                Op::MbarPending { d, state: st }
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }
}
