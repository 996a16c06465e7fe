//! Decoding of warp-level instructions: `bar.warp.sync`, `shfl`, `vote`, `redux`, `match`,
//! `activemask`, `elect`.

use super::*;

impl Decoder<'_> {
    /// Decodes one instruction of the warp-level family: the opcodes [`family`] sends here.
    pub(super) fn decode_warp(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let a = &ins.args;
        let kernel = self.f;
        let arg = |i: usize| operand(kernel, ins, i);
        let ty = ins.ty();
        use Opcode as O;
        let op = match ins.op {
            O::BarWarpSync => {
                let m = self.src(ins, arg(0)?)?;
                Op::WarpSync { mask: m }
            }
            O::Shfl => {
                let mode = ins.shfl_mode().unwrap_or(ShflMode::Idx);
                let (d, p) = match arg(0)? {
                    Operand::Pair(x, y) => (self.dst(ins, x)?, self.dst(ins, y)?),
                    o => (self.dst(ins, o)?, NONE),
                };
                let x = self.src(ins, arg(1)?)?;
                let b = self.src(ins, arg(2)?)?;
                let c = self.src(ins, arg(3)?)?;
                let mask = match a.get(4) {
                    Some(o) => self.src(ins, o)?,
                    None => self.konst(0xffff_ffff),
                };
                Op::Shfl {
                    mode,
                    d,
                    p,
                    a: x,
                    b,
                    c,
                    mask,
                }
            }
            O::Vote => {
                let mode = ins.vote_mode().unwrap_or(VoteMode::Uni);
                let d = self.dst(ins, arg(0)?)?;
                let (po, aneg) = match &ins0.args.get(1) {
                    Some(Operand::Not(x)) => (x.as_ref().clone(), true),
                    Some(x) => ((*x).clone(), false),
                    None => return Err(self.err(ins, "vote needs a predicate")),
                };
                let x = self.src(ins, &po)?;
                let mask = match a.get(2) {
                    Some(o) => self.src(ins, o)?,
                    None => self.konst(0xffff_ffff),
                };
                Op::Vote {
                    mode,
                    d,
                    a: x,
                    aneg,
                    mask,
                }
            }
            O::Redux => {
                let rop = ins
                    .redux_op()
                    .ok_or_else(|| self.err(ins, "redux without operation"))?;
                let t = ty.unwrap_or(Ty::U32);
                if t.is_float() {
                    return Err(self.err(ins, "floating-point redux is not supported"));
                }
                let d = self.dst(ins, arg(0)?)?;
                let x = self.src(ins, arg(1)?)?;
                let mask = self.src(ins, arg(2)?)?;
                Op::Redux {
                    op: rop,
                    signed: t.is_signed(),
                    d,
                    a: x,
                    mask,
                }
            }
            O::Match => {
                let (d, p) = match arg(0)? {
                    Operand::Pair(x, y) => (self.dst(ins, x)?, self.dst(ins, y)?),
                    o => (self.dst(ins, o)?, NONE),
                };
                let x = self.src(ins, arg(1)?)?;
                let mask = self.src(ins, arg(2)?)?;
                Op::Match {
                    all: ins.has(Flag::All),
                    bits: ty.map(|t| t.bits()).unwrap_or(32),
                    d,
                    p,
                    a: x,
                    mask,
                }
            }
            O::Activemask => Op::Activemask {
                d: self.dst(ins, arg(0)?)?,
            },
            O::Elect => {
                let (d, p) = match arg(0)? {
                    Operand::Pair(x, y) => (self.dst(ins, x)?, self.dst(ins, y)?),
                    o => (self.dst(ins, o)?, NONE),
                };
                let mask = self.src(ins, arg(1)?)?;
                Op::Elect { d, p, mask }
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }
}
