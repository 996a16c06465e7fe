//! Execution of control flow: branches, `exit`, `trap`, `nanosleep` (calls are in
//! [`super::call`]).

use super::*;

impl Cta {
    /// Executes the control-flow ops ([`Cta::exec`] sends them here).
    #[inline(always)]
    pub(super) fn exec_control(
        &mut self,
        _ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        match &inst.op {
            Op::Bra { target } => {
                let w = &mut self.warps[wi];
                if m == w.group {
                    w.group_pc = *target;
                    return Ok(Flow::Stay);
                }
                if m != 0 {
                    for l in lanes_of(m) {
                        w.pc[l] = *target;
                    }
                    let rest = w.group & !m;
                    for l in lanes_of(rest) {
                        w.pc[l] = w.group_pc + 1;
                    }
                    w.group = 0;
                    return Ok(Flow::Stay);
                }
            }
            Op::BrxIdx { idx, targets } => {
                let w = &mut self.warps[wi];
                for l in lanes_of(m) {
                    let i = w.regs[*idx as usize][l] as usize;
                    let t = *targets.get(i).ok_or_else(|| {
                        FaultKind::Other(format!(
                            "brx.idx index {i} out of range ({} targets)",
                            targets.len()
                        ))
                    })?;
                    w.pc[l] = t;
                }
                for l in lanes_of(w.group & !m) {
                    w.pc[l] = w.group_pc + 1;
                }
                // Lanes in m already have their pcs; group lanes are written by regroup first,
                // so clear the group without letting regroup overwrite them.
                let g = w.group;
                w.group = 0;
                let _ = g;
                return Ok(Flow::Stay);
            }
            Op::Exit => {
                let w = &mut self.warps[wi];
                let gone = m;
                w.live &= !gone;
                w.group &= !gone;
                self.exited_threads += gone.count_ones();
                if gone != 0 {
                    Cta::lanes_exited(w);
                }
                if w.group != 0 {
                    return Ok(Flow::Next);
                }
                self.release_ready_barriers();
                return Ok(Flow::Blocked);
            }
            Op::Trap => {
                if m != 0 {
                    return Err(FaultKind::Trap);
                }
            }
            Op::Sleep { t } => {
                // `nanosleep t` suspends for up to ~t ns (PTX: at most 1 ms); the warp's clock
                // moves on by t and its host time slice ends.
                let w = &mut self.warps[wi];
                let ns = lanes_of(m).map(|l| w.regs[*t as usize][l] as u32).max();
                w.slept += u64::from(ns.unwrap_or(0).min(1_000_000));
                // polling: this iteration loaded something and saw what the last one saw
                let polling = w.poll != 0 && w.poll == w.last_poll;
                w.last_poll = std::mem::take(&mut w.poll);
                if polling {
                    w.wait_pc = w.group_pc;
                    self.waits += 1;
                }
                return Ok(Flow::Yield);
            }
            Op::Nop => {}
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }
}
