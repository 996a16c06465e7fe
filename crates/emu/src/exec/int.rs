//! Execution of integer and bit-manipulation ops: the function-pointer ALU ops ([`Op::Alu`]:
//! integer, comparison, selection and the f32 fast paths the decoder chose), integer
//! division, `bfi`, `shf`, `lop3`.

use super::*;

impl Cta {
    /// Executes the integer/bit ops ([`Cta::exec`] sends them here).
    #[inline(always)]
    pub(super) fn exec_int(
        &mut self,
        _ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        match &inst.op {
            Op::Alu { f, d, a, b, c } => {
                let s = crate::alu::Slots {
                    m,
                    d: *d,
                    a: *a,
                    b: *b,
                    c: *c,
                };
                f(&mut self.warps[wi].regs, s);
            }
            Op::IntDiv { ty, rem, d, a, b } => {
                let w = &mut self.warps[wi];
                for l in lanes_of(m) {
                    let (x, y) = (w.regs[*a as usize][l], w.regs[*b as usize][l]);
                    let mk = crate::memory::mask(ty.size());
                    if y & mk == 0 {
                        LAST_LANE.with(|c| c.set(l as u32));
                        return Err(FaultKind::DivideByZero);
                    }
                    let v = if ty.is_signed() {
                        let bits = ty.bits();
                        let (x, y) = (sext(x, bits) as i64, sext(y, bits) as i64);
                        (if *rem {
                            x.wrapping_rem(y)
                        } else {
                            x.wrapping_div(y)
                        }) as u64
                    } else {
                        let (x, y) = (x & mk, y & mk);
                        if *rem {
                            x % y
                        } else {
                            x / y
                        }
                    };
                    w.regs[*d as usize][l] = v & mk;
                }
            }
            Op::Bfi {
                bits,
                d,
                a,
                b,
                c,
                e,
            } => {
                let w = &mut self.warps[wi];
                for l in lanes_of(m) {
                    let r = &w.regs;
                    let v = crate::alu::bfi(
                        r[*a as usize][l],
                        r[*b as usize][l],
                        r[*c as usize][l],
                        r[*e as usize][l],
                        *bits,
                    );
                    w.regs[*d as usize][l] = v;
                }
            }
            Op::Shf {
                left,
                wrap,
                d,
                a,
                b,
                c,
            } => {
                let w = &mut self.warps[wi];
                for l in lanes_of(m) {
                    let r = &w.regs;
                    let v = crate::alu::shf(
                        r[*a as usize][l],
                        r[*b as usize][l],
                        r[*c as usize][l],
                        *left,
                        *wrap,
                    );
                    w.regs[*d as usize][l] = v;
                }
            }
            Op::Lop3 { lut, d, a, b, c } => {
                let w = &mut self.warps[wi];
                for l in lanes_of(m) {
                    let r = &w.regs;
                    let v = crate::alu::lop3(
                        r[*a as usize][l] as u32,
                        r[*b as usize][l] as u32,
                        r[*c as usize][l] as u32,
                        *lut,
                    );
                    w.regs[*d as usize][l] = v as u64;
                }
            }
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }
}
