//! Execution of atomics and reductions (`atom`, `red`).

use super::*;

impl Cta {
    /// Executes the atomic ops ([`Cta::exec`] sends them here).
    #[inline(always)]
    pub(super) fn exec_atomic(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        let prog = &*ctx.prog;
        match &inst.op {
            Op::Atom {
                space,
                op,
                ty,
                d,
                addr,
                off,
                b,
                c,
                ord,
            } => {
                let size = ty.size();
                let o = rmw_ord(*ord);
                if self.banks.is_some() {
                    self.profile_lanes(wi, inst.src, m, *space, (*addr, *off), size);
                }
                if self.san.is_some() {
                    self.san_lanes(ctx, wi, m, (*space, *addr, *off), size, SanKind::Atomic);
                }
                for l in lanes_of(m) {
                    let a = self.warps[wi].regs[*addr as usize][l].wrapping_add(*off as u64);
                    let loc = match self.locate(ctx, *space, a, size, l, prog.local_bytes) {
                        Ok(loc) => loc,
                        Err(f) => {
                            self.memcheck(ctx, wi, l, f)?;
                            continue;
                        }
                    };
                    let (bv, cv) = (
                        self.warps[wi].regs[*b as usize][l],
                        self.warps[wi].regs[*c as usize][l],
                    );
                    let old = match loc {
                        // SAFETY: allocation kept alive by the launch's memory snapshot.
                        Loc::Global(al, off) => unsafe { &*al }
                            .rmw(off, size, o, |old| atom_apply(*op, *ty, old, bv, cv)),
                        _ => {
                            let old = self.load(ctx, wi, &loc, size, Ordering::Relaxed);
                            let new = atom_apply(*op, *ty, old, bv, cv) & crate::memory::mask(size);
                            self.store(wi, &loc, size, new, Ordering::Relaxed);
                            old
                        }
                    };
                    if *d != NONE {
                        self.warps[wi].regs[*d as usize][l] = old;
                    }
                }
            }
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }
}
