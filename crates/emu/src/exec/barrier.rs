//! Execution of barriers, fences and cluster ops: `bar`/`barrier`, `fence`/`membar`,
//! `barrier.cluster`, `mapa`, `getctarank`.

use super::*;

impl Cta {
    /// Executes the CTA barrier (`bar`, `barrier`) ops ([`Cta::exec`] sends them here).
    #[inline(always)]
    pub(super) fn exec_bar(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        match &inst.op {
            Op::Bar {
                kind,
                id,
                count,
                d,
                p,
                pneg,
            } => {
                if m == 0 {
                    return Ok(Flow::Next);
                }
                let w = &self.warps[wi];
                let l0 = m.trailing_zeros() as usize;
                let bid = w.regs[*id as usize][l0] as usize;
                if bid >= 16 {
                    return Err(FaultKind::Other(format!(
                        "barrier id {bid} out of range (0..15)"
                    )));
                }
                let cnt = if *count != NONE {
                    Some(w.regs[*count as usize][l0] as u32)
                } else {
                    None
                };
                let nthreads = m.count_ones();
                let (mut popc, mut all, mut any) = (0u32, true, false);
                if *p != NONE {
                    for l in lanes_of(m) {
                        let v = (w.regs[*p as usize][l] & 1 != 0) ^ *pneg;
                        popc += v as u32;
                        all &= v;
                        any |= v;
                    }
                }
                let group_pc = w.group_pc;
                if let Some(s) = self.san.as_mut() {
                    let a = crate::sanitize::BarArrival {
                        wi,
                        lanes: m,
                        live: w.live,
                        bid,
                        count: cnt,
                        pc: group_pc,
                    };
                    s.bar_arrive(ctx, &a);
                }
                let b = &mut self.barriers[bid];
                if b.waiters.is_empty() && b.arrived == 0 {
                    b.popc = 0;
                    b.all = true;
                    b.any = false;
                }
                b.used = true;
                b.arrived += nthreads;
                if cnt.is_some() {
                    b.expected = cnt;
                }
                b.popc += popc;
                b.all &= all;
                b.any |= any;
                let dkind = match kind {
                    BarKind::RedPopc => 0u32,
                    BarKind::RedAnd => 1,
                    _ => 2,
                };
                if *kind != BarKind::Arrive {
                    b.waiters.push(Waiter {
                        warp: wi as u32,
                        lanes: m,
                        d: if *d != NONE { *d | (dkind << 30) } else { NONE },
                    });
                    let w = &mut self.warps[wi];
                    w.blocked |= m;
                    for l in lanes_of(w.group) {
                        w.pc[l] = group_pc + 1;
                    }
                    // Lanes of the group that were predicated off just move on.
                    let rest = w.group & !m;
                    w.group = 0;
                    let _ = rest;
                }
                let exp = self.barriers[bid].expected.unwrap_or(self.total_threads);
                let counted = self.barriers[bid].arrived
                    + if self.barriers[bid].expected.is_none() {
                        self.exited_threads
                    } else {
                        0
                    };
                if counted >= exp {
                    self.release(bid);
                }
                if *kind == BarKind::Arrive {
                    return Ok(Flow::Next);
                }
                Ok(Flow::Blocked)
            }
            _ => Err(misrouted(inst)),
        }
    }

    /// Executes the fence and cluster ops ([`Cta::exec`] sends them here).
    #[inline(always)]
    pub(super) fn exec_barrier(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        match &inst.op {
            Op::Fence => {
                std::sync::atomic::fence(Ordering::SeqCst);
                if self.san.is_some() {
                    self.san_synced(ctx);
                }
            }
            Op::Mapa { generic, d, a, b } => {
                let w = &mut self.warps[wi];
                for l in lanes_of(m) {
                    let x = w.regs[*a as usize][l];
                    let off = if *generic {
                        x.wrapping_sub(SHARED_WINDOW)
                    } else {
                        x
                    };
                    let off = off & ((1 << CLUSTER_RANK_SHIFT) - 1);
                    let r = w.regs[*b as usize][l] & 0xffff;
                    let v = ((r + 1) << CLUSTER_RANK_SHIFT) | off;
                    w.regs[*d as usize][l] = if *generic {
                        v + SHARED_WINDOW
                    } else {
                        v & 0xffff_ffff
                    };
                }
            }
            Op::Getctarank { d, a } => {
                let rank = self.rank as u64;
                let w = &mut self.warps[wi];
                for l in lanes_of(m) {
                    let x = w.regs[*a as usize][l];
                    let x = if x >= SHARED_WINDOW {
                        x - SHARED_WINDOW
                    } else {
                        x
                    };
                    let r = x >> CLUSTER_RANK_SHIFT;
                    w.regs[*d as usize][l] = if r == 0 { rank } else { r - 1 };
                }
            }
            Op::ClusterArrive => {
                if self.san.is_some() {
                    self.san_synced(ctx);
                }
                if let Some(s) = self.san.as_mut() {
                    s.cluster_arrive(wi);
                }
                let mut cb = self.cluster_bar.borrow_mut();
                self.cluster_wait[wi] = cb.phase + 1;
                cb.arrived += m.count_ones();
                if cb.arrived >= cb.threads {
                    cb.arrived = 0;
                    cb.phase += 1;
                }
            }
            Op::ClusterWait => {
                if self.cluster_bar.borrow().phase < self.cluster_wait[wi] {
                    self.warps[wi].wait_pc = self.warps[wi].group_pc;
                    return Ok(Flow::Spin);
                }
                if let Some(s) = self.san.as_mut() {
                    s.cluster_acquire(wi);
                }
            }
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }
}
