//! Decoding of asynchronous copies and mbarriers: `cp.async*`, `cp.async.bulk[.tensor]`
//! (tile and im2col), `tensormap.replace` / `tensormap.cp_fenceproxy`, `mbarrier.*`.

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
            // L2 prefetches are hints with no effect a thread can observe
            O::CpAsyncBulkCommitGroup
            | O::CpAsyncBulkWaitGroup
            | O::CpAsyncBulkPrefetchTensor
            | O::CpAsyncBulkPrefetch => Op::Nop,
            // `tensormap.cp_fenceproxy` copies the 128-byte map like a bulk copy without an
            // mbarrier; the proxy fence has nothing to order in the emulator (maps are decoded
            // from memory at each use)
            O::CpAsyncBulk | O::TensormapCpFenceproxy => {
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
            O::CpReduceAsyncBulk => self.decode_bulk_reduce(ins)?,
            O::StAsync | O::RedAsync => self.decode_async_remote(ins)?,
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }

    /// `cp.reduce.async.bulk.dst.src.completion.op.type [dst], [src], size{, [mbar] | policy}`.
    fn decode_bulk_reduce(&mut self, ins: &Instruction) -> Result<Op, EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        let op = atom::atom_op(ins)
            .ok_or_else(|| self.err(ins, "cp.reduce.async.bulk without a reduction operation"))?;
        let ty = ins
            .last_ty()
            .ok_or_else(|| self.err(ins, "cp.reduce.async.bulk without a type"))?;
        let dspace = match ins.spaces().next() {
            Some(Space::Global) => MSpace::Global,
            Some(s) if s.is_shared() => MSpace::Shared,
            _ => {
                return Err(self.err(
                    ins,
                    "cp.reduce.async.bulk needs a .global or .shared::cluster destination",
                ))
            }
        };
        if !bulk_reduce_ok(op, ty, dspace) {
            return Err(self.err(
                ins,
                format!("cp.reduce.async.bulk has no .{ty} form of this operation"),
            ));
        }
        let (dst, doff, _) = self.addr(ins, arg(Role::Dst)?)?;
        let (src, soff, _) = self.addr(ins, arg(Role::Src)?)?;
        let size = self.src(ins, arg(Role::Size)?)?;
        let mbar = if ins.has(Flag::CompleteTxBytes) {
            let (m, mo, _) = self.addr(ins, arg(Role::Mbar)?)?;
            Some((m, mo))
        } else {
            None
        };
        Ok(Op::BulkReduce {
            op,
            ty,
            dst,
            doff,
            dspace,
            src,
            soff,
            size,
            mbar,
        })
    }

    /// `st.async ... [a], b, [mbar]` and `red.async ... .op.type [a], b, [mbar]`.
    fn decode_async_remote(&mut self, ins: &Instruction) -> Result<Op, EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        let ty = ins
            .last_ty()
            .ok_or_else(|| self.err(ins, format!("{} without a type", ins.op)))?;
        let red = if ins.op == Opcode::RedAsync {
            let op = atom::atom_op(ins)
                .filter(|o| !matches!(o, AtomOp::Cas | AtomOp::Exch))
                .ok_or_else(|| self.err(ins, "red.async without a reduction operation"))?;
            Some(op)
        } else {
            None
        };
        let src = if ins.op == Opcode::RedAsync {
            Role::B
        } else {
            Role::Src
        };
        let (addr, off, _) = self.addr(ins, arg(Role::Addr)?)?;
        let srcs = self.vec_srcs(ins, arg(src)?)?;
        let (mbar, moff, _) = self.addr(ins, arg(Role::Mbar)?)?;
        Ok(Op::AsyncRemote {
            red,
            ty,
            elem: ty.size(),
            srcs,
            addr,
            off,
            mbar,
            moff,
        })
    }

    /// Decodes one instruction of the TMA family (`cp.async.bulk.tensor`,
    /// `cp.reduce.async.bulk.tensor`, `tensormap.replace`): the opcodes [`family`] sends here.
    pub(super) fn decode_bulk_tensor(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        use Opcode as O;
        let op = match ins.op {
            O::CpReduceAsyncBulkTensor => {
                let red = atom::atom_op(ins)
                    .filter(|o| !matches!(o, AtomOp::Cas | AtomOp::Exch))
                    .ok_or_else(|| {
                        self.err(
                            ins,
                            "cp.reduce.async.bulk.tensor without a reduction operation",
                        )
                    })?;
                self.decode_tensor_copy(ins, Some(red))?
            }
            O::CpAsyncBulkTensor => self.decode_tensor_copy(ins, None)?,
            O::TensormapReplace => self.decode_tensormap_replace(ins)?,
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }

    /// A tensor copy: a load (global -> shared::cluster, completing on an mbarrier, im2col
    /// offsets and multicast mask when given), a store (`red: None`) or a reduction into the
    /// tensor, `.tile` or im2col.
    fn decode_tensor_copy(
        &mut self,
        ins: &Instruction,
        red: Option<AtomOp>,
    ) -> Result<Op, EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        // A load writes shared memory (`Dst`) from the tensor (`Src`); a store the reverse.
        let load = red.is_none() && ins.space() != Some(Space::Global);
        let im2col = ins.has(Flag::Im2col) || ins.has(Flag::Im2colNoOffs);
        if load && ins.has(Flag::Im2colNoOffs) || !load && ins.has(Flag::Im2col) {
            return Err(self.err(
                ins,
                "tensor loads take .im2col, stores and reductions .im2col_no_offs",
            ));
        }
        let (s_role, t_role) = if load {
            (Role::Dst, Role::Src)
        } else {
            (Role::Src, Role::Dst)
        };
        let (smem, soff, _) = self.addr(ins, arg(s_role)?)?;
        let (tmap, toff, tspace, coords) = self.tensor_addr(ins, arg(t_role)?)?;
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
        let offsets = match ins.operand(Role::Im2colOffsets) {
            Some(o) => self.vec_srcs(ins, o)?,
            None => Vec::new(),
        };
        if load && im2col && offsets.len() + 2 != coords.len() {
            return Err(self.err(
                ins,
                format!(
                    "an im2col load of {} coordinates takes {} im2col offsets, found {}",
                    coords.len(),
                    coords.len().saturating_sub(2),
                    offsets.len()
                ),
            ));
        }
        Ok(Op::BulkTensor {
            load,
            smem,
            soff,
            tmap,
            toff,
            tspace,
            coords,
            mbar,
            cta_mask,
            red,
            im2col,
            offsets,
        })
    }

    /// `tensormap.replace.tile.FIELD.SPACE.b1024.bN [map], {ord,} value`.
    fn decode_tensormap_replace(&mut self, ins: &Instruction) -> Result<Op, EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        let field = ins
            .tensormap_field()
            .ok_or_else(|| self.err(ins, "tensormap.replace without a field"))?;
        let space = match ins.spaces().next() {
            Some(Space::Global) => MSpace::Global,
            Some(s) if s.is_shared() => MSpace::Shared,
            _ => MSpace::Generic,
        };
        let ord = match ins.operand(Role::Ord) {
            Some(Operand::Imm(i)) => i.bits() as u32,
            Some(_) => return Err(self.err(ins, "tensormap.replace: ord must be an immediate")),
            None => 0,
        };
        let (addr, off, _) = self.addr(ins, arg(Role::Addr)?)?;
        let value = self.src(ins, arg(Role::Value)?)?;
        Ok(Op::TensormapReplace {
            field,
            addr,
            off,
            space,
            ord,
            value,
        })
    }

    /// A `[tensorMap, {coords}]` operand: (map slot, offset, space, coordinate slots).
    fn tensor_addr(
        &mut self,
        ins: &Instruction,
        o: &Operand,
    ) -> Result<(u32, i64, MSpace, Vec<u32>), EmuError> {
        match o {
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
                Ok((slot, off, sp.unwrap_or(MSpace::Generic), cs))
            }
            _ => Err(self.err(ins, "expected [tensorMap, {coords}]")),
        }
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
            O::CpAsyncMbarrierArrive => {
                let (addr, off, _) = self.addr(ins, arg(Role::Addr)?)?;
                Op::CpAsyncArrive {
                    addr,
                    off,
                    noinc: ins.has(Flag::Noinc),
                }
            }
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

/// The (operation, type) pairs `cp.reduce.async.bulk` defines (PTX ISA, ptxas 13.5): to global
/// memory `.and/.or/.xor` on .b32/.b64, `.add` on .u32/.s32/.u64/.f32/.f64/.f16/.bf16 (f16/bf16
/// with `.noftz`), `.min/.max` on .u32/.s32/.u64/.s64/.f16/.bf16, `.inc/.dec` on .u32; to
/// shared::cluster the 32-bit integer forms and `.add.u64`.
fn bulk_reduce_ok(op: AtomOp, ty: Ty, dspace: MSpace) -> bool {
    use AtomOp as A;
    use Ty as T;
    let global = dspace == MSpace::Global;
    match op {
        A::And | A::Or | A::Xor => matches!(ty, T::B32) || global && ty == T::B64,
        A::Inc | A::Dec => ty == T::U32,
        A::Add if global => matches!(
            ty,
            T::U32 | T::S32 | T::U64 | T::F32 | T::F64 | T::F16 | T::Bf16
        ),
        A::Add => matches!(ty, T::U32 | T::S32 | T::U64),
        A::Min | A::Max if global => {
            matches!(ty, T::U32 | T::S32 | T::U64 | T::S64 | T::F16 | T::Bf16)
        }
        A::Min | A::Max => matches!(ty, T::U32 | T::S32),
        A::Exch | A::Cas => false,
    }
}
