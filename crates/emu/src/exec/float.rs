//! Execution of floating-point ops outside the ALU fast paths ([`Op::Float`]) and `testp`.

use super::*;

impl Cta {
    /// Executes the float ops ([`Cta::exec`] sends them here).
    #[inline(always)]
    pub(super) fn exec_float(
        &mut self,
        _ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        match &inst.op {
            Op::Float {
                op,
                ty,
                mode,
                d,
                a,
                b,
                c,
            } => {
                let w = &mut self.warps[wi];
                for l in lanes_of(m) {
                    let v = fp::fop(
                        *op,
                        *ty,
                        *mode,
                        w.regs[*a as usize][l],
                        w.regs[*b as usize][l],
                        w.regs[*c as usize][l],
                    );
                    w.regs[*d as usize][l] = v;
                }
            }
            Op::Testp { kind, ty, d, a } => {
                let w = &mut self.warps[wi];
                for l in lanes_of(m) {
                    w.regs[*d as usize][l] = fp::testp(*kind, *ty, w.regs[*a as usize][l]) as u64;
                }
            }
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }
}
