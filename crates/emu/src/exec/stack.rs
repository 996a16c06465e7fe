//! Execution of `stacksave`, `stackrestore` and `alloca`: allocations on each lane's call stack
//! (`exec/call.rs`), which a function's return frees with its frame. The bytes in use are
//! limited by [`crate::LaunchOptions::stack_bytes`], as for calls; an allocation past it stops
//! the launch with a clear fault.

use super::call::{set_stack_sp, stack_state, STACK_BASE};
use super::*;

impl Cta {
    /// Executes [`Op::Stack`] for the lanes in `m`.
    #[inline(never)]
    pub(super) fn exec_stack(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        op: &StackOp,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        let w = &mut self.warps[wi];
        for l in lanes_of(m) {
            let (sp, used, frame) = stack_state(w, l);
            match *op {
                StackOp::Save { d } => w.regs[d as usize][l] = STACK_BASE + sp as u64,
                StackOp::Restore { a } => {
                    let v = w.regs[a as usize][l];
                    let to = v.wrapping_sub(STACK_BASE);
                    if v < STACK_BASE || to > sp as u64 || to < frame as u64 {
                        LAST_LANE.with(|c| c.set(l as u32));
                        return Err(FaultKind::Other(format!(
                            "stackrestore: {v:#x} is not a stack pointer stacksave returned in \
                             this function (stack {:#x}..{:#x})",
                            STACK_BASE + frame as u64,
                            STACK_BASE + sp as u64
                        )));
                    }
                    set_stack_sp(w, l, to as u32);
                }
                StackOp::Alloca { d, size, align } => {
                    let n = w.regs[size as usize][l];
                    let start = (sp as u64).next_multiple_of(align as u64);
                    let need = (used + (start - sp as u64)).saturating_add(n);
                    if need > ctx.stack_bytes as u64 {
                        LAST_LANE.with(|c| c.set(l as u32));
                        return Err(FaultKind::Other(format!(
                            "alloca of {n} bytes overflows the {}-byte stack per thread \
                             ({used} bytes in use; emu::LaunchOptions::stack_bytes, \
                             PTXFORGE_EMU_STACK_BYTES)",
                            ctx.stack_bytes
                        )));
                    }
                    set_stack_sp(w, l, (start + n) as u32);
                    w.regs[d as usize][l] = STACK_BASE + start;
                }
            }
        }
        Ok(Flow::Next)
    }
}
