//! Execution of tensor-core ops: `mma`, `ldmatrix`/`stmatrix`, `wgmma.*`, `setmaxnreg`.

use super::*;

impl Cta {
    /// Executes the tensor-core ops ([`Cta::exec`] sends them here).
    #[inline]
    pub(super) fn exec_tensor(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        let prog = &*ctx.prog;
        match &inst.op {
            Op::Mma { spec, d, a, b, c } => {
                // mma.sync.aligned needs the whole warp converged.
                if self.wait_converged(wi) {
                    return Ok(Flow::Stay);
                }
                let w = &mut self.warps[wi];
                // Fragments have at most 4 registers each (decode checked the counts): gather
                // references on the stack, no allocation on this hot path.
                const Z: Lanes = [0; 32];
                let (mut ar, mut br, mut cr) = ([&Z; 8], [&Z; 8], [&Z; 8]);
                for (dst, src) in [(&mut ar, a), (&mut br, b), (&mut cr, c)] {
                    for (k, s) in src.iter().take(8).enumerate() {
                        dst[k] = &w.regs[*s as usize];
                    }
                }
                let mut outs = [[0u64; 32]; 8];
                let nd = d.len().min(8);
                let model = ctx.numerics.model(prog.target_sm, spec.aty);
                crate::mma::mma_sync_with(
                    spec,
                    model.as_ref(),
                    &ar[..a.len().min(8)],
                    &br[..b.len().min(8)],
                    &cr[..c.len().min(8)],
                    &mut outs[..nd],
                );
                for (k, s) in d.iter().take(nd).enumerate() {
                    Cta::write_masked(w, *s, m, &outs[k]);
                }
            }
            Op::Wgmma(op) => {
                let model = ctx.numerics.model(ctx.prog.target_sm, op.spec.aty);
                self.wgmma(wi, op, m, model)?
            }
            Op::WgmmaCommit => {
                let w = &mut self.warps[wi];
                let g = std::mem::take(&mut w.wg_open);
                w.wg_groups.push_back(g);
                let r = std::mem::take(&mut w.wg_reads_open);
                w.wg_read_groups.push_back(r);
            }
            Op::WgmmaWait { n } => {
                let w = &mut self.warps[wi];
                while w.wg_groups.len() > *n as usize {
                    if let Some(g) = w.wg_groups.pop_front() {
                        for (slot, v) in g {
                            w.regs[slot as usize] = v;
                        }
                    }
                    if let Some(r) = w.wg_read_groups.pop_front() {
                        for c in r {
                            if let Some(x) = self.wg_lock.get_mut(c as usize) {
                                *x = x.saturating_sub(1);
                            }
                        }
                    }
                }
            }
            Op::Setmaxnreg { inc: _, n } => {
                self.warps[wi].maxnreg = *n;
                let total: u64 = self.warps.iter().map(|w| w.maxnreg as u64 * 32).sum();
                if total > 65536 {
                    return Err(FaultKind::Other(format!(
                        "setmaxnreg: the CTA's warps ask for {total} registers; an SM has 65536"
                    )));
                }
            }
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }

    /// Executes the matrix load/store ops ([`Cta::exec`] sends them here).
    #[inline]
    pub(super) fn exec_ldst_matrix(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        let prog = &*ctx.prog;
        match &inst.op {
            Op::Ldmatrix {
                count,
                trans,
                ds,
                addr,
                off,
                space,
            } => {
                if self.wait_converged(wi) {
                    return Ok(Flow::Stay);
                }
                if self.banks.is_some() {
                    self.profile_matrices(wi, inst.src, *count, *space, *addr, *off);
                }
                if self.san.is_some() {
                    self.san_matrix(ctx, wi, (*count, *space), (*addr, *off), SanKind::Read);
                }
                let mut out = [[0u64; 32]; 4];
                for mat in 0..*count as usize {
                    for row in 0..8usize {
                        let src_lane = mat * 8 + row;
                        let ra =
                            self.warps[wi].regs[*addr as usize][src_lane].wrapping_add(*off as u64);
                        let mut rowv = [0u64; 8];
                        // Rows are 16 contiguous, 16-byte-aligned bytes: locate the whole row
                        // once (which checks bounds and alignment) and read it directly.
                        let loc = self.locate(ctx, *space, ra, 16, src_lane, prog.local_bytes);
                        match loc {
                            Ok(Loc::Shared(o)) => {
                                for (e, rv) in rowv.iter_mut().enumerate() {
                                    *rv = u16::from_le_bytes([
                                        self.shared[o + 2 * e],
                                        self.shared[o + 2 * e + 1],
                                    ]) as u64;
                                }
                            }
                            _ => {
                                for (e, rv) in rowv.iter_mut().enumerate() {
                                    let loc = self.locate(
                                        ctx,
                                        *space,
                                        ra + 2 * e as u64,
                                        2,
                                        src_lane,
                                        prog.local_bytes,
                                    )?;
                                    *rv = self.load(ctx, wi, &loc, 2, Ordering::Relaxed);
                                }
                            }
                        }
                        for q in 0..4usize {
                            if !*trans {
                                let lane = row * 4 + q;
                                out[mat][lane] = rowv[2 * q] | (rowv[2 * q + 1] << 16);
                            } else {
                                // Transposed: lane (r, q) gets column r, rows 2q and 2q+1.
                                for half in 0..2usize {
                                    let col = 2 * q + half;
                                    let lane = col * 4 + row / 2;
                                    let shift = 16 * (row % 2);
                                    out[mat][lane] |= rowv[col] << shift;
                                }
                            }
                        }
                    }
                }
                let w = &mut self.warps[wi];
                for (k, dslot) in ds.iter().enumerate() {
                    Cta::write_masked(w, *dslot, m, &out[k]);
                }
            }
            Op::Stmatrix {
                count,
                trans,
                srcs,
                addr,
                off,
                space,
            } => {
                if self.wait_converged(wi) {
                    return Ok(Flow::Stay);
                }
                if self.banks.is_some() {
                    self.profile_matrices(wi, inst.src, *count, *space, *addr, *off);
                }
                if self.san.is_some() {
                    self.san_matrix(ctx, wi, (*count, *space), (*addr, *off), SanKind::Write);
                }
                for mat in 0..*count as usize {
                    let vals = self.warps[wi].regs[srcs[mat] as usize];
                    for row in 0..8usize {
                        let dst_lane = mat * 8 + row;
                        let ra =
                            self.warps[wi].regs[*addr as usize][dst_lane].wrapping_add(*off as u64);
                        for col in 0..8usize {
                            let v = if !*trans {
                                let lane = row * 4 + col / 2;
                                (vals[lane] >> (16 * (col % 2))) & 0xffff
                            } else {
                                let lane = col * 4 + row / 2;
                                (vals[lane] >> (16 * (row % 2))) & 0xffff
                            };
                            let loc = self.locate(
                                ctx,
                                *space,
                                ra + 2 * col as u64,
                                2,
                                dst_lane,
                                prog.local_bytes,
                            )?;
                            self.store(wi, &loc, 2, v, Ordering::Relaxed);
                        }
                    }
                }
            }
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }
}
