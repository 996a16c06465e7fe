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
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        let ty = ins.ty();
        use Opcode as O;
        let op = match ins.op {
            O::BarWarpSync => {
                let m = self.src(ins, arg(Role::Membermask)?)?;
                Op::WarpSync { mask: m }
            }
            O::Shfl => {
                let mode = ins.shfl_mode().unwrap_or(ShflMode::Idx);
                let (d, p) = match arg(Role::Dst)? {
                    Operand::Pair(x, y) => (self.dst(ins, x)?, self.dst(ins, y)?),
                    o => (self.dst(ins, o)?, NONE),
                };
                let x = self.src(ins, arg(Role::A)?)?;
                let b = self.src(ins, arg(Role::Lane)?)?;
                let c = self.src(ins, arg(Role::Clamp)?)?;
                let mask = match ins.operand(Role::Membermask) {
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
                let d = self.dst(ins, arg(Role::Dst)?)?;
                let (po, aneg) = match ins0.operand(Role::A) {
                    Some(Operand::Not(x)) => (x.as_ref().clone(), true),
                    Some(x) => (x.clone(), false),
                    None => return Err(self.err(ins, "vote needs a predicate")),
                };
                let x = self.src(ins, &po)?;
                let mask = match ins.operand(Role::Membermask) {
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
                let d = self.dst(ins, arg(Role::Dst)?)?;
                let x = self.src(ins, arg(Role::A)?)?;
                let mask = self.src(ins, arg(Role::Membermask)?)?;
                Op::Redux {
                    op: rop,
                    signed: t.is_signed(),
                    d,
                    a: x,
                    mask,
                }
            }
            O::Match => {
                let (d, p) = match arg(Role::Dst)? {
                    Operand::Pair(x, y) => (self.dst(ins, x)?, self.dst(ins, y)?),
                    o => (self.dst(ins, o)?, NONE),
                };
                let x = self.src(ins, arg(Role::A)?)?;
                let mask = self.src(ins, arg(Role::Membermask)?)?;
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
                d: self.dst(ins, arg(Role::Dst)?)?,
            },
            O::Elect => {
                let (d, p) = match arg(Role::Dst)? {
                    Operand::Pair(x, y) => (self.dst(ins, x)?, self.dst(ins, y)?),
                    o => (self.dst(ins, o)?, NONE),
                };
                let mask = self.src(ins, arg(Role::Membermask)?)?;
                Op::Elect { d, p, mask }
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }
}
