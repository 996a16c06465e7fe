//! Decoding of the per-thread stack instructions `stacksave`, `stackrestore` and `alloca`
//! (PTX 7.3): allocations on the lane's call stack (`exec/call.rs` owns the stack, `exec/stack.rs`
//! runs these).

use super::*;

/// A decoded stack instruction (register slots).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackOp {
    /// `stacksave d`: d = the lane's stack pointer (a `.local` address).
    Save { d: u32 },
    /// `stackrestore a`: the stack pointer becomes `a` (a value `stacksave` returned),
    /// freeing every `alloca` since.
    Restore { a: u32 },
    /// `alloca d, size{, align}`: `size` bytes aligned to `align` (a power of two, default 8);
    /// d = their `.local` address.
    Alloca { d: u32, size: u32, align: u32 },
}

/// The opcodes this module decodes (the rest of the call family goes to `call.rs`).
pub(super) fn is_stack_op(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::Stacksave | Opcode::Stackrestore | Opcode::Alloca
    )
}

impl Decoder<'_> {
    /// Decodes one instruction of [`is_stack_op`].
    pub(super) fn decode_stack(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        if !matches!(ins.ty(), Some(Ty::U32 | Ty::U64)) {
            return Err(self.err(ins, "stack instructions need .u32 or .u64"));
        }
        let op = match ins.op {
            Opcode::Stacksave => StackOp::Save {
                d: self.dst(ins, arg(Role::Dst)?)?,
            },
            Opcode::Stackrestore => StackOp::Restore {
                a: self.src(ins, arg(Role::A)?)?,
            },
            Opcode::Alloca => {
                let align = match ins.operand(Role::Align) {
                    None => 8,
                    Some(Operand::Imm(i)) if i.bits().is_power_of_two() && i.bits() <= 1 << 16 => {
                        i.bits() as u32
                    }
                    Some(_) => {
                        return Err(
                            self.err(ins, "alloca alignment must be an immediate power of two")
                        )
                    }
                };
                StackOp::Alloca {
                    d: self.dst(ins, arg(Role::Dst)?)?,
                    size: self.src(ins, arg(Role::Size)?)?,
                    align,
                }
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(Op::Stack(op), ins0, guard);
        Ok(())
    }
}
