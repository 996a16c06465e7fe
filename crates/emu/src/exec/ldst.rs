//! Execution of the memory family: `ld` and `st` in every state space.

use super::*;

impl Cta {
    /// Executes the load/store ops ([`Cta::exec`] sends them here).
    #[inline(always)]
    pub(super) fn exec_memory(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        let prog = &*ctx.prog;
        match &inst.op {
            Op::Ld {
                space,
                elem,
                sext: sx,
                ds,
                addr,
                off,
                ord,
            } => {
                let total = elem * ds.len() as u32;
                let o = load_ord(*ord);
                if self.banks.is_some() {
                    self.profile_lanes(wi, inst.src, m, *space, (*addr, *off), total);
                }
                if self.san.is_some() {
                    self.san_lanes(ctx, wi, m, (*space, *addr, *off), total, SanKind::Read);
                }
                let acc = fastmem::Access {
                    space: *space,
                    addr: *addr,
                    off: *off,
                    elem: *elem,
                    n: ds.len() as u32,
                };
                if self.ld_warp(ctx, (wi, m), acc, (ds, *sx, o)) {
                    return Ok(Flow::Next);
                }
                for l in lanes_of(m) {
                    let base = self.warps[wi].regs[*addr as usize][l].wrapping_add(*off as u64);
                    if !self.vector_aligned(ctx, (wi, l), *space, base, (*elem, total))? {
                        continue;
                    }
                    let mut vals = [0u64; 8];
                    for k in 0..ds.len() {
                        let a = base + (k as u32 * elem) as u64;
                        match self.locate_fast(ctx, *space, a, *elem, l) {
                            Ok(loc) => vals[k] = self.load(ctx, wi, &loc, *elem, o),
                            // memcheck reported it: the element reads 0
                            Err(f) => self.memcheck(ctx, wi, l, f)?,
                        }
                    }
                    fastmem::put_loaded(&mut self.warps[wi], prog, l, (ds, *sx, *elem), &vals);
                }
            }
            Op::St {
                space,
                elem,
                srcs,
                addr,
                off,
                ord,
            } => {
                let total = elem * srcs.len() as u32;
                let o = store_ord(*ord);
                if self.banks.is_some() {
                    self.profile_lanes(wi, inst.src, m, *space, (*addr, *off), total);
                }
                if self.san.is_some() {
                    self.san_lanes(ctx, wi, m, (*space, *addr, *off), total, SanKind::Write);
                }
                let acc = fastmem::Access {
                    space: *space,
                    addr: *addr,
                    off: *off,
                    elem: *elem,
                    n: srcs.len() as u32,
                };
                if self.st_warp(ctx, (wi, m), acc, (srcs, o)) {
                    return Ok(Flow::Next);
                }
                for l in lanes_of(m) {
                    let base = self.warps[wi].regs[*addr as usize][l].wrapping_add(*off as u64);
                    if !self.vector_aligned(ctx, (wi, l), *space, base, (*elem, total))? {
                        continue;
                    }
                    for (k, s) in srcs.iter().enumerate() {
                        let a = base + (k as u32 * elem) as u64;
                        match self.locate_fast(ctx, *space, a, *elem, l) {
                            Ok(loc) => {
                                let v = self.warps[wi].regs[*s as usize][l];
                                self.store(wi, &loc, *elem, v, o);
                            }
                            // memcheck reported it: the store is dropped
                            Err(f) => self.memcheck(ctx, wi, l, f)?,
                        }
                    }
                }
            }
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }

    /// Vector accesses must be aligned to their full size (`total` bytes of `elem`-byte
    /// elements): false, after memcheck reported the misaligned address, when lane `l`'s is not.
    #[inline(always)]
    fn vector_aligned(
        &mut self,
        ctx: &LaunchCtx,
        (wi, l): (usize, usize),
        space: MSpace,
        base: u64,
        (elem, total): (u32, u32),
    ) -> Result<bool, FaultKind> {
        if total <= elem || base.is_multiple_of(total as u64) {
            return Ok(true);
        }
        LAST_LANE.with(|c| c.set(l as u32));
        let f = FaultKind::Misaligned {
            space: space.name(),
            addr: base,
            size: total,
        };
        self.memcheck(ctx, wi, l, f)?;
        Ok(false)
    }
}
