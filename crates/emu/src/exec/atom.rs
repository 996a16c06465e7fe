//! Execution of atomics and reductions (`atom`, `red`; vector and 128-bit forms) and the
//! element-wise read-modify-write the asynchronous reductions (`red.async`,
//! `cp.reduce.async.bulk[.tensor]`) share with them.

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
            Op::AtomVec {
                op,
                ty,
                ds,
                addr,
                off,
                bs,
                ord,
            } => {
                let size = ty.size();
                for l in lanes_of(m) {
                    let base = self.warps[wi].regs[*addr as usize][l].wrapping_add(*off as u64);
                    // the whole vector is naturally aligned
                    let whole = size * bs.len() as u32;
                    if let Err(f) = self.locate(ctx, MSpace::Global, base, whole, l, 0) {
                        self.memcheck(ctx, wi, l, f)?;
                        continue;
                    }
                    for (k, b) in bs.iter().enumerate() {
                        let a = base + (k as u32 * size) as u64;
                        let loc = self.locate(ctx, MSpace::Global, a, size, l, 0)?;
                        let bv = self.warps[wi].regs[*b as usize][l];
                        let old = self.rmw_at(ctx, wi, &loc, (*op, *ty), bv, rmw_ord(*ord));
                        if let Some(d) = ds.get(k) {
                            self.warps[wi].regs[*d as usize][l] = old;
                        }
                    }
                }
            }
            Op::Atom128 {
                space,
                cas,
                d,
                addr,
                off,
                b,
                c,
                ord,
            } => {
                for l in lanes_of(m) {
                    let a = self.warps[wi].regs[*addr as usize][l].wrapping_add(*off as u64);
                    let loc = match self.locate(ctx, *space, a, 16, l, ctx.prog.local_bytes) {
                        Ok(loc) => loc,
                        Err(f) => {
                            self.memcheck(ctx, wi, l, f)?;
                            continue;
                        }
                    };
                    let r = &self.warps[wi].regs;
                    let pair = |s: u32| [r[s as usize][l], r[s as usize + 1][l]];
                    let (bv, cv) = (pair(*b), if *cas { pair(*c) } else { [0; 2] });
                    let old = self.rmw128(ctx, wi, &loc, *ord, |old| match *cas {
                        true if old == bv => cv,
                        true => old,
                        false => bv,
                    });
                    let w = &mut self.warps[wi];
                    w.regs[*d as usize][l] = old[0];
                    w.regs[*d as usize + 1][l] = old[1];
                }
            }
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }

    /// One atomic read-modify-write of `size` (= `ty.size()`) bytes at `loc` with `op`; returns
    /// the old value. Global memory is updated atomically (other CTAs run on other host
    /// threads); shared memory belongs to this host thread while the CTA (or cluster) runs.
    pub(super) fn rmw_at(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        loc: &Loc,
        (op, ty): (AtomOp, Ty),
        b: u64,
        o: Ordering,
    ) -> u64 {
        let size = ty.size();
        match *loc {
            // SAFETY: allocation kept alive by the launch's memory snapshot.
            Loc::Global(al, off) => {
                unsafe { &*al }.rmw(off, size, o, |old| atom_apply(op, ty, old, b, 0))
            }
            _ => {
                let old = self.load(ctx, wi, loc, size, Ordering::Relaxed);
                let new = atom_apply(op, ty, old, b, 0) & crate::memory::mask(size);
                self.store(wi, loc, size, new, Ordering::Relaxed);
                old
            }
        }
    }

    /// A 128-bit atomic read-modify-write at the 16-byte aligned `loc` (low word first).
    /// Global memory holds 64-bit atomic words, so 128-bit atomics on the same address are
    /// serialised by an address-striped lock (against each other, not against 64-bit accesses
    /// to the same bytes, which PTX leaves unordered with them anyway).
    fn rmw128(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        loc: &Loc,
        ord: Ord,
        f: impl Fn([u64; 2]) -> [u64; 2],
    ) -> [u64; 2] {
        static LOCKS: [std::sync::Mutex<()>; 64] = [const { std::sync::Mutex::new(()) }; 64];
        if let Loc::Global(al, off) = *loc {
            // SAFETY: allocation kept alive by the launch's memory snapshot.
            let al = unsafe { &*al };
            let stripe = ((al.base + off) >> 4) as usize % LOCKS.len();
            let _held = LOCKS[stripe].lock().unwrap_or_else(|p| p.into_inner());
            let (lo, so) = (load_ord(ord), store_ord(ord));
            let old = [al.read(off, 8, lo), al.read(off + 8, 8, lo)];
            let new = f(old);
            al.write(off, 8, new[0], so);
            al.write(off + 8, 8, new[1], so);
            return old;
        }
        let hi = loc_plus(loc, 8);
        let old = [
            self.load(ctx, wi, loc, 8, Ordering::Relaxed),
            self.load(ctx, wi, &hi, 8, Ordering::Relaxed),
        ];
        let new = f(old);
        self.store(wi, loc, 8, new[0], Ordering::Relaxed);
        self.store(wi, &hi, 8, new[1], Ordering::Relaxed);
        old
    }
}

/// `loc` moved `k` bytes further (within the access [`Cta::locate`] checked).
fn loc_plus(loc: &Loc, k: usize) -> Loc {
    match *loc {
        Loc::Global(a, o) => Loc::Global(a, o + k as u64),
        Loc::Shared(o) => Loc::Shared(o + k),
        Loc::Peer(r, o) => Loc::Peer(r, o + k),
        Loc::Local(o) => Loc::Local(o + k),
        Loc::Stack(l, o) => Loc::Stack(l, o + k),
        Loc::Param(o) => Loc::Param(o + k),
    }
}
