//! Decoding of control flow: `bra`, `brx.idx`, `exit`, `ret`, `trap`/`brkpt`, `nanosleep`,
//! `griddepcontrol` (calls are in [`super::call`]).

use super::*;

impl Decoder<'_> {
    /// Decodes one instruction of the control-flow family: the opcodes [`family`] sends here.
    pub(super) fn decode_control(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        use Opcode as O;
        let op = match ins.op {
            O::Bra => {
                let l = match arg(Role::Target)? {
                    Operand::Sym { name, .. } => self.scoped_label(name),
                    _ => return Err(self.err(ins, "bra needs a label")),
                };
                self.fixups.push((self.prog.insts.len(), vec![l]));
                Op::Bra { target: 0 }
            }
            O::BrxIdx => {
                let idx = self.src(ins, arg(Role::Index)?)?;
                let l = match arg(Role::Target)? {
                    Operand::Sym { name, .. } => self.scoped_label(name),
                    _ => return Err(self.err(ins, "brx.idx needs a .branchtargets label")),
                };
                self.fixups.push((self.prog.insts.len(), vec![l]));
                Op::BrxIdx {
                    idx,
                    targets: Vec::new(),
                }
            }
            O::Exit => Op::Exit,
            O::Ret => {
                if self.in_func {
                    Op::Ret
                } else {
                    Op::Exit
                }
            }
            O::Trap | O::Brkpt => Op::Trap,
            O::Nanosleep => Op::Sleep {
                t: self.src(ins, arg(Role::Time)?)?,
            },
            O::Griddepcontrol => Op::Nop,
            // performance-monitor events: no counters are programmed (`%pm0`..`%pm7` read 0)
            O::Pmevent => Op::Nop,
            _ => return Err(misrouted(self, ins)),
        };
        self.push(op, ins0, guard);
        Ok(())
    }
}
