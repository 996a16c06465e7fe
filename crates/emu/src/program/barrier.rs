//! Decoding of barriers, fences and cluster addressing: `bar`/`barrier`, `membar`/`fence`,
//! `barrier.cluster`, `mapa`, `getctarank`.

use super::*;

impl Decoder<'_> {
    /// Decodes one instruction of the barrier/fence family: the opcodes [`family`] sends here.
    pub(super) fn decode_barrier(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        use Opcode as O;
        let op = match ins.op {
            O::Bar | O::Barrier => {
                let kind = if ins.has(Flag::Red) {
                    if ins.has(Flag::Popc) {
                        BarKind::RedPopc
                    } else if ins.has(Flag::And) {
                        BarKind::RedAnd
                    } else {
                        BarKind::RedOr
                    }
                } else if ins.has(Flag::Arrive) {
                    BarKind::Arrive
                } else {
                    BarKind::Sync
                };
                let red = matches!(kind, BarKind::RedPopc | BarKind::RedAnd | BarKind::RedOr);
                let d = if red { self.role_dst(ins)? } else { NONE };
                let id = match ins.operand(Role::A) {
                    Some(o) => self.src(ins, o)?,
                    None => ZERO,
                };
                let count = match ins.operand(Role::B) {
                    Some(o) => self.src(ins, o)?,
                    None => NONE,
                };
                let (p, pneg) = if red {
                    let (po, neg) = match arg(Role::C)? {
                        Operand::Not(x) => (x.as_ref(), true),
                        x => (x, false),
                    };
                    (self.src(ins, po)?, neg)
                } else {
                    (NONE, false)
                };
                Op::Bar {
                    kind,
                    id,
                    count,
                    d,
                    p,
                    pneg,
                }
            }
            O::Membar | O::Fence => Op::Fence,
            O::BarrierCluster => {
                if ins.has(Flag::Arrive) {
                    Op::ClusterArrive
                } else if ins.has(Flag::Wait) {
                    Op::ClusterWait
                } else {
                    return Err(self.err(ins, "barrier.cluster needs .arrive or .wait"));
                }
            }
            O::Mapa => {
                let d = self.role_dst(ins)?;
                let x = self.src(ins, arg(Role::A)?)?;
                let r = self.src(ins, arg(Role::CtaRank)?)?;
                let generic = !ins.spaces().any(|s| s.is_shared());
                Op::Mapa {
                    generic,
                    d,
                    a: x,
                    b: r,
                }
            }
            O::Getctarank => {
                let d = self.role_dst(ins)?;
                let x = self.src(ins, arg(Role::A)?)?;
                Op::Getctarank { d, a: x }
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }
}
