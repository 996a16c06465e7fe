//! Where the interpreter calls the sanitizers (only in sanitized launches): per-lane memory
//! accesses of `ld`/`st`/`atom`/`cp.async`/`ldmatrix`/`stmatrix`, classified into shared and
//! global memory, and the synchronising instructions.

use super::cta::{Kind, Span, Who};
use super::{code, Report, Tool};
use crate::error::FaultKind;
use crate::exec::{Cta, LaunchCtx};
use crate::memory::{LOCAL_WINDOW, PARAM_WINDOW, SHARED_WINDOW};
use crate::program::MSpace;

impl Cta {
    /// The accesses of `bytes` bytes per lane at `reg[lane] + off` by the lanes in `m`.
    pub(crate) fn san_lanes(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        m: u32,
        (space, reg, off): (MSpace, u32, i64),
        bytes: u32,
        kind: Kind,
    ) {
        let pc = self.warps[wi].group_pc;
        let addrs = self.warps[wi].regs[reg as usize];
        for lane in 0..32 {
            if m >> lane & 1 != 0 {
                let addr = addrs[lane].wrapping_add(off as u64);
                let sp = Span {
                    addr,
                    size: bytes,
                    kind,
                };
                self.san_one(ctx, Who { wi, lane, pc }, space, sp);
            }
        }
    }

    /// The row accesses of an `ldmatrix`/`stmatrix` of `count` matrices (16 bytes per row, row
    /// addresses from lanes `8 * mat + row`).
    pub(crate) fn san_matrix(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        (count, space): (u32, MSpace),
        (reg, off): (u32, i64),
        kind: Kind,
    ) {
        let m = if count >= 4 {
            u32::MAX
        } else {
            (1u32 << (8 * count)) - 1
        };
        self.san_lanes(ctx, wi, m, (space, reg, off), 16, kind);
        if let Some(s) = self.san.as_mut() {
            s.warp_converged(wi);
        }
    }

    /// One lane's access `sp` in `space`.
    pub(crate) fn san_one(&mut self, ctx: &LaunchCtx, who: Who, space: MSpace, sp: Span) {
        let (addr, size) = (sp.addr, sp.size);
        if size.is_power_of_two() && !addr.is_multiple_of(size as u64) {
            return; // misaligned: memcheck's (the access itself faults)
        }
        let shared = match space {
            MSpace::Shared => Some(addr),
            MSpace::Generic if (SHARED_WINDOW..SHARED_WINDOW + (1 << 32)).contains(&addr) => {
                Some(addr - SHARED_WINDOW)
            }
            MSpace::Generic if (LOCAL_WINDOW..LOCAL_WINDOW + (1 << 32)).contains(&addr) => return,
            // kernel parameters (`cvta.param`): read-only, never racy or uninitialised
            MSpace::Generic if (PARAM_WINDOW..PARAM_WINDOW + (1 << 32)).contains(&addr) => return,
            MSpace::Generic | MSpace::Global => None,
            MSpace::Local | MSpace::Param => return,
        };
        if let Some(sa) = shared {
            let (peer, o) = self.split_rank(sa);
            let fits = o
                .checked_add(size as u64)
                .is_some_and(|e| e <= self.shared.len() as u64);
            if peer.is_none() && fits {
                if let Some(s) = self.san.as_mut() {
                    s.shared_access(ctx, who, Span { addr: o, ..sp });
                }
            }
            return;
        }
        self.san_global(ctx, who, sp);
    }

    /// A global access: initcheck against the allocation's written-bitmap, then the race table
    /// (or, for atomics and strong accesses, the CTA counts as synchronising).
    fn san_global(&mut self, ctx: &LaunchCtx, who: Who, sp: Span) {
        let Who { wi, lane, pc } = who;
        let (addr, size, kind) = (sp.addr, sp.size, sp.kind);
        let (Some(ls), Some(a)) = (ctx.san.as_ref(), ctx.mem.find(addr, size as u64)) else {
            return;
        };
        let tid = wi as u32 * 32 + lane as u32;
        let id = self.id;
        if ls.tools.initcheck && kind != Kind::Write {
            if let Some(b) = a.first_unwritten(addr - a.base, size as u64) {
                ls.push((code::INIT, pc, 1), || Report {
                    tool: Tool::Initcheck,
                    kind: "read of uninitialized global memory".into(),
                    kernel: ctx.prog.name.clone(),
                    cta: id,
                    accesses: vec![super::access(ctx, id, "read", pc, tid)],
                    space: Some("global".into()),
                    addr: Some(a.base + b),
                    size,
                    detail: format!(
                        "nothing (host copy, fill, or kernel store) wrote this byte of the \
                         {}-byte allocation at {:#x} before",
                        a.size, a.base
                    ),
                });
            }
        }
        let Some(g) = &ls.global else { return };
        let strong = ls.info.get(pc as usize).is_some_and(|i| i.strong);
        if kind == Kind::Atomic || strong {
            self.san_synced(ctx);
        } else {
            g.access(id, tid, pc, addr, size, kind == Kind::Write);
        }
    }

    /// This CTA synchronises with other CTAs (fence, global atomic, strong access, cluster
    /// barrier): its global accesses are trusted.
    pub(crate) fn san_synced(&mut self, ctx: &LaunchCtx) {
        let Some(s) = self.san.as_mut() else { return };
        if !s.synced {
            s.synced = true;
            if let Some(g) = ctx.san.as_ref().and_then(|l| l.global.as_ref()) {
                g.mark_synced(self.id);
            }
        }
    }

    /// A `.sync` warp operation with member-mask register `mask` executed by lanes `m`.
    #[inline]
    pub(crate) fn san_warp_sync(&mut self, ctx: &LaunchCtx, wi: usize, m: u32, mask: u32) {
        if self.san.is_none() {
            return;
        }
        let w = &self.warps[wi];
        let masks = w.regs[mask as usize];
        let op = super::sync::WarpOp {
            m,
            masks: &masks,
            exists: w.exists,
            live: w.live,
            pc: w.group_pc,
        };
        if let Some(s) = self.san.as_mut() {
            s.warp_sync(ctx, wi, &op);
        }
    }

    /// `cp.async`: each lane writes `size` bytes of shared memory and reads its `src_size`
    /// (at most `size`) bytes of global memory.
    pub(crate) fn san_cp_async(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        m: u32,
        (dspace, dst, doff): (MSpace, u32, i64),
        (src, soff, src_size): (u32, i64, u32),
        size: u32,
    ) {
        self.san_lanes(ctx, wi, m, (dspace, dst, doff), size, Kind::Write);
        let pc = self.warps[wi].group_pc;
        let regs = &self.warps[wi].regs;
        let (sa, ns) = (regs[src as usize], regs[src_size as usize]);
        for lane in 0..32 {
            let n = (ns[lane] as u32).min(size);
            if m >> lane & 1 != 0 && n > 0 {
                let sp = Span {
                    addr: sa[lane].wrapping_add(soff as u64),
                    size: n,
                    kind: Kind::Read,
                };
                self.san_one(ctx, Who { wi, lane, pc }, MSpace::Global, sp);
            }
        }
    }

    /// memcheck: an out-of-bounds or misaligned `ld`/`st`/`atom` of lane `lane` is reported and
    /// skipped (loads read 0, stores are dropped) so the launch goes on and later bad accesses
    /// are reported too. Without memcheck (or for other faults) the fault is returned as is.
    #[cold]
    pub(crate) fn memcheck(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        lane: usize,
        f: FaultKind,
    ) -> Result<(), FaultKind> {
        let Some(ls) = ctx.san.as_ref().filter(|s| s.tools.memcheck) else {
            return Err(f);
        };
        let (space, addr, size, kind) = match &f {
            FaultKind::OutOfBounds { space, addr, size } => {
                (*space, *addr, *size, "out-of-bounds access")
            }
            FaultKind::Misaligned { space, addr, size } => {
                (*space, *addr, *size, "misaligned access")
            }
            _ => return Err(f),
        };
        let (pc, id) = (self.warps[wi].group_pc, self.id);
        let tid = wi as u32 * 32 + lane as u32;
        ls.push((code::MEM, pc, 0), || Report {
            tool: Tool::Memcheck,
            kind: kind.into(),
            kernel: ctx.prog.name.clone(),
            cta: id,
            accesses: vec![super::access(ctx, id, "access", pc, tid)],
            space: Some(space.into()),
            addr: Some(addr),
            size,
            detail: format!("{f}; the access was skipped and the launch went on"),
        });
        Ok(())
    }
}
