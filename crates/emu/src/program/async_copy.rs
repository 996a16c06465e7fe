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
        let a = &ins.args;
        let kernel = self.f;
        let arg = |i: usize| operand(kernel, ins, i);
        use Opcode as O;
        let op = match ins.op {
            O::CpAsync => {
                let (dst, doff, _) = self.addr(ins, arg(0)?)?;
                let (src, soff, _) = self.addr(ins, arg(1)?)?;
                let size = match arg(2)? {
                    Operand::Imm(i) => i.bits() as u32,
                    _ => return Err(self.err(ins, "cp.async size must be an immediate")),
                };
                if ![4, 8, 16].contains(&size) {
                    return Err(self.err(ins, "cp.async size must be 4, 8 or 16"));
                }
                let src_size = match a.get(3) {
                    Some(Operand::Imm(Imm::Int(_))) | Some(Operand::Reg(_))
                        if !ins.has(Flag::L2CacheHint) || a.len() == 5 =>
                    {
                        self.src(ins, &a[3])?
                    }
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
                let (dst, doff, _) = self.addr(ins, arg(0)?)?;
                let (src, soff, _) = self.addr(ins, arg(1)?)?;
                let size = self.src(ins, arg(2)?)?;
                let mbar = if ins.has(Flag::CompleteTxBytes) {
                    let (m, mo, _) = self.addr(ins, arg(3)?)?;
                    Some((m, mo))
                } else {
                    None
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
        let arg = |i: usize| operand(kernel, ins, i);
        use Opcode as O;
        let op = match ins.op {
            O::CpAsyncBulkTensor => {
                if ins.has(Flag::Im2col) {
                    return Err(self.err(
                        ins,
                        "im2col tensor copies are not supported by the emulator",
                    ));
                }
                let first_global = ins.space() == Some(Space::Global);
                let (load, t_idx, s_idx) = if first_global {
                    (false, 0, 1)
                } else {
                    (true, 1, 0)
                };
                let (smem, soff, _) = self.addr(ins, arg(s_idx)?)?;
                let (tmap, toff, tspace, coords) = match arg(t_idx)? {
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
                    let (m, mo, _) = self.addr(ins, arg(2)?)?;
                    Some((m, mo))
                } else {
                    None
                };
                let cta_mask = if ins.has(Flag::MulticastCluster) {
                    self.src(ins, arg(3)?)?
                } else {
                    NONE
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
        let a = &ins.args;
        let kernel = self.f;
        let arg = |i: usize| operand(kernel, ins, i);
        use Opcode as O;
        let op = match ins.op {
            O::MbarrierInit => {
                let (addr, off, _) = self.addr(ins, arg(0)?)?;
                let count = self.src(ins, arg(1)?)?;
                Op::MbarInit { addr, off, count }
            }
            O::MbarrierInval => {
                let (addr, off, _) = self.addr(ins, arg(0)?)?;
                Op::MbarInval { addr, off }
            }
            O::MbarrierArrive | O::MbarrierArriveDrop => {
                let d = self.dst(ins, arg(0)?)?;
                let (addr, off, _) = self.addr(ins, arg(1)?)?;
                let extra = match a.get(2) {
                    Some(o) => self.src(ins, o)?,
                    None => NONE,
                };
                let (count, tx) = if ins.has(Flag::ExpectTx) {
                    (NONE, extra)
                } else {
                    (extra, NONE)
                };
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
                let (addr, off, _) = self.addr(ins, arg(0)?)?;
                let bytes = self.src(ins, arg(1)?)?;
                Op::MbarTx {
                    addr,
                    off,
                    bytes,
                    complete: ins.op == O::MbarrierCompleteTx,
                }
            }
            O::MbarrierTestWait | O::MbarrierTryWait => {
                let d = self.dst(ins, arg(0)?)?;
                let (addr, off, _) = self.addr(ins, arg(1)?)?;
                let x = self.src(ins, arg(2)?)?;
                Op::MbarWait {
                    d,
                    addr,
                    off,
                    arg: x,
                    parity: ins.has(Flag::Parity),
                }
            }
            O::MbarrierPendingCount => {
                let d = self.dst(ins, arg(0)?)?;
                let st = self.src(ins, arg(1)?)?;
                Op::MbarPending { d, state: st }
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }
}
