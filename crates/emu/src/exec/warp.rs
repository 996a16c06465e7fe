//! Execution of warp-level ops: `bar.warp.sync`, `shfl`, `vote`, `redux`, `match`,
//! `activemask`, `elect`.

use super::*;

impl Cta {
    /// Executes the warp shuffle/vote ops ([`Cta::exec`] sends them here).
    #[inline(always)]
    pub(super) fn exec_shfl_vote(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        match &inst.op {
            Op::WarpSync { mask } => {
                if self.warp_sync_members(ctx, wi, m, *mask).is_none() {
                    return Ok(Flow::Stay);
                }
            }
            Op::Shfl {
                mode,
                d,
                p,
                a,
                b,
                c,
                mask,
            } => {
                if self.warp_sync_members(ctx, wi, m, *mask).is_none() {
                    return Ok(Flow::Stay);
                }
                let w = &mut self.warps[wi];
                let src = w.regs[*a as usize];
                let mut out = [0u64; 32];
                let mut pout = [0u64; 32];
                for l in lanes_of(m) {
                    let bval = (w.regs[*b as usize][l] & 31) as i32;
                    let cv = w.regs[*c as usize][l] as u32;
                    let cval = (cv & 31) as i32;
                    let segmask = ((cv >> 8) & 31) as i32;
                    let lane = l as i32;
                    let max_lane = (lane & segmask) | (cval & !segmask);
                    let min_lane = lane & segmask;
                    let (j, pval) = match mode {
                        ShflMode::Up => (lane - bval, lane - bval >= max_lane),
                        ShflMode::Down => (lane + bval, lane + bval <= max_lane),
                        ShflMode::Bfly => (lane ^ bval, (lane ^ bval) <= max_lane),
                        ShflMode::Idx => {
                            let j = min_lane | (bval & !segmask);
                            (j, j <= max_lane)
                        }
                    };
                    let j = if pval && (0..32).contains(&j) {
                        j as usize
                    } else {
                        l
                    };
                    out[l] = src[j];
                    pout[l] = pval as u64;
                }
                Cta::write_masked(w, *d, m, &out);
                if *p != NONE {
                    Cta::write_masked(w, *p, m, &pout);
                }
            }
            Op::Vote {
                mode,
                d,
                a,
                aneg,
                mask,
            } => {
                let Some(member) = self.warp_sync_members(ctx, wi, m, *mask) else {
                    return Ok(Flow::Stay);
                };
                let w = &mut self.warps[wi];
                let pm = pred_mask(&w.regs[*a as usize]) ^ if *aneg { u32::MAX } else { 0 };
                let part = m & member;
                let ballot = pm & part;
                let v = match mode {
                    VoteMode::Ballot => ballot as u64,
                    VoteMode::All => (ballot == part) as u64,
                    VoteMode::Any => (ballot != 0) as u64,
                    VoteMode::Uni => (ballot == part || ballot == 0) as u64,
                };
                Cta::write_masked(w, *d, m, &[v; 32]);
            }
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }

    /// Executes the warp reduce/match/elect ops ([`Cta::exec`] sends them here).
    #[inline(always)]
    pub(super) fn exec_warp_reduce(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        match &inst.op {
            Op::Redux {
                op,
                signed,
                d,
                a,
                mask,
            } => {
                let Some(member) = self.warp_sync_members(ctx, wi, m, *mask) else {
                    return Ok(Flow::Stay);
                };
                let w = &mut self.warps[wi];
                let part = m & member;
                let vals = lanes_of(part).map(|l| w.regs[*a as usize][l] as u32);
                let v: u32 = match (op, signed) {
                    (ReduxOp::Add, _) => vals.fold(0u32, |x, y| x.wrapping_add(y)),
                    (ReduxOp::And, _) => vals.fold(u32::MAX, |x, y| x & y),
                    (ReduxOp::Or, _) => vals.fold(0, |x, y| x | y),
                    (ReduxOp::Xor, _) => vals.fold(0, |x, y| x ^ y),
                    (ReduxOp::Min, false) => vals.fold(u32::MAX, |x, y| x.min(y)),
                    (ReduxOp::Max, false) => vals.fold(0, |x, y| x.max(y)),
                    (ReduxOp::Min, true) => vals.fold(i32::MAX, |x, y| x.min(y as i32)) as u32,
                    (ReduxOp::Max, true) => vals.fold(i32::MIN, |x, y| x.max(y as i32)) as u32,
                };
                Cta::write_masked(w, *d, m, &[v as u64; 32]);
            }
            Op::Match {
                all,
                bits,
                d,
                p,
                a,
                mask,
            } => {
                let Some(member) = self.warp_sync_members(ctx, wi, m, *mask) else {
                    return Ok(Flow::Stay);
                };
                let w = &mut self.warps[wi];
                let part = m & member;
                let mk = reg_mask(*bits as u8);
                let vals = w.regs[*a as usize];
                let mut out = [0u64; 32];
                let mut pout = [0u64; 32];
                for l in lanes_of(m) {
                    let same: u32 = lanes_of(part)
                        .filter(|&k| vals[k] & mk == vals[l] & mk)
                        .fold(0, |x, k| x | 1 << k);
                    if *all {
                        let ok = same == part;
                        out[l] = if ok { part as u64 } else { 0 };
                        pout[l] = ok as u64;
                    } else {
                        out[l] = same as u64;
                    }
                }
                Cta::write_masked(w, *d, m, &out);
                if *p != NONE {
                    Cta::write_masked(w, *p, m, &pout);
                }
            }
            Op::Activemask { d } => {
                let w = &mut self.warps[wi];
                let g = w.group as u64;
                Cta::write_masked(w, *d, m, &[g; 32]);
            }
            Op::Elect { d, p, mask } => {
                self.san_warp_sync(ctx, wi, m, *mask);
                let w = &mut self.warps[wi];
                let l0 = m.trailing_zeros().min(31) as usize;
                let member = w.regs[*mask as usize][l0] as u32;
                let part = m & member;
                let leader = part.trailing_zeros();
                let mut pout = [0u64; 32];
                for l in lanes_of(m) {
                    pout[l] = (l as u32 == leader) as u64;
                }
                Cta::write_masked(w, *d, m, &[leader as u64; 32]);
                if *p != NONE {
                    Cta::write_masked(w, *p, m, &pout);
                }
            }
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }

    /// The member mask of a warp-synchronous instruction (read in the first active lane), once
    /// every member lane that still exists has arrived (`None`: not yet, the warp stays); the
    /// sanitizer's synccheck of the mask runs then.
    #[inline(always)]
    fn warp_sync_members(&mut self, ctx: &LaunchCtx, wi: usize, m: u32, mask: u32) -> Option<u32> {
        let w = &mut self.warps[wi];
        let member = w.regs[mask as usize][m.trailing_zeros().min(31) as usize] as u32;
        if Cta::sync_wait(w, member & w.exists) {
            return None;
        }
        self.san_warp_sync(ctx, wi, m, mask);
        Some(member)
    }
}
