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
        let a = &ins.args;
        let kernel = self.f;
        let arg = |i: usize| operand(kernel, ins, i);
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
                let base = if red { 1 } else { 0 };
                let d = if red { self.dst(ins, arg(0)?)? } else { NONE };
                let id = match a.get(base) {
                    Some(o) => self.src(ins, o)?,
                    None => ZERO,
                };
                let n_rest = a.len().saturating_sub(base + 1);
                let (count, p, pneg) = if red {
                    let po = &a[a.len() - 1];
                    let (po, neg) = match po {
                        Operand::Not(x) => (x.as_ref(), true),
                        x => (x, false),
                    };
                    let p = self.src(ins, po)?;
                    let count = if n_rest == 2 {
                        self.src(ins, &a[base + 1])?
                    } else {
                        NONE
                    };
                    (count, p, neg)
                } else {
                    let count = if n_rest >= 1 {
                        self.src(ins, &a[base + 1])?
                    } else {
                        NONE
                    };
                    (count, NONE, false)
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
                let d = self.dst(ins, arg(0)?)?;
                let x = self.src(ins, arg(1)?)?;
                let r = self.src(ins, arg(2)?)?;
                let generic = !ins.spaces().any(|s| s.is_shared());
                Op::Mapa {
                    generic,
                    d,
                    a: x,
                    b: r,
                }
            }
            O::Getctarank => {
                let d = self.dst(ins, arg(0)?)?;
                let x = self.src(ins, arg(1)?)?;
                Op::Getctarank { d, a: x }
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }
}
