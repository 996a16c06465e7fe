//! Which decoder module handles which opcode. [`family`] is the one place that places every
//! opcode of [`ptx::Opcode`] (exhaustively, without a wildcard, so a new opcode does not compile
//! until it is placed); the decoder dispatches through it and the coverage report
//! ([`crate::coverage`]) reads it.

use super::{Decoder, ZERO};
use crate::error::EmuError;
use ptx::{Function, Instruction, Opcode, Operand, Role};

/// The instruction families the decoder (`program/*.rs`) and executor (`exec/*.rs`) are split by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// Integer arithmetic, bit manipulation, comparison and selection (`program/int.rs`).
    Int,
    /// Floating-point arithmetic and `testp` (`program/float.rs`).
    Float,
    /// Moves and conversions (`program/convert.rs`).
    Convert,
    /// Loads, stores, cache hints (`program/ldst.rs`).
    Memory,
    /// Atomics and reductions (`program/atom.rs`).
    Atomic,
    /// Warp-level instructions (`program/warp.rs`).
    Warp,
    /// Barriers, fences and cluster addressing (`program/barrier.rs`).
    Barrier,
    /// Tensor cores (`program/tensor.rs`).
    Tensor,
    /// Asynchronous copies, TMA and mbarriers (`program/async_copy.rs`).
    AsyncCopy,
    /// Control flow (`program/control.rs`).
    Control,
    /// Calls (`program/call.rs`).
    Call,
    /// Video instructions, scalar and SIMD (`program/video.rs`).
    Video,
    /// Textures and surfaces (`program/tex.rs`).
    Texture,
    /// Parsed and validated, but the emulator cannot run it.
    NotEmulated,
}

impl Family {
    /// Every family, in report order.
    pub const ALL: [Family; 14] = [
        Family::Int,
        Family::Float,
        Family::Convert,
        Family::Memory,
        Family::Atomic,
        Family::Warp,
        Family::Barrier,
        Family::Tensor,
        Family::AsyncCopy,
        Family::Control,
        Family::Call,
        Family::Video,
        Family::Texture,
        Family::NotEmulated,
    ];

    /// Short name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Family::Int => "integer/bit",
            Family::Float => "float",
            Family::Convert => "conversion",
            Family::Memory => "memory",
            Family::Atomic => "atomic",
            Family::Warp => "warp",
            Family::Barrier => "barrier/fence",
            Family::Tensor => "tensor core",
            Family::AsyncCopy => "async copy/TMA/mbarrier",
            Family::Control => "control flow",
            Family::Call => "call",
            Family::Video => "video",
            Family::Texture => "texture/surface",
            Family::NotEmulated => "not emulated",
        }
    }
}

/// The family that decodes `op`. Arithmetic opcodes are integer or float by the instruction's
/// type (`float`: its type is a floating-point type).
pub fn family(op: Opcode, float: bool) -> Family {
    use Family as F;
    use Opcode as O;
    match op {
        O::Add
        | O::Sub
        | O::Mul
        | O::Mad
        | O::Fma
        | O::Min
        | O::Max
        | O::Neg
        | O::Abs
        | O::Div
        | O::Rcp
        | O::Sqrt
        | O::Rsqrt
        | O::Sin
        | O::Cos
        | O::Lg2
        | O::Ex2
        | O::Tanh
        | O::Copysign
            if float =>
        {
            F::Float
        }
        O::Testp => F::Float,
        O::Add | O::Addc | O::Sub | O::Subc | O::Mul | O::Mad | O::Madc | O::Mul24 | O::Mad24 => {
            F::Int
        }
        O::Sad | O::Div | O::Rem | O::Abs | O::Neg | O::Min | O::Max | O::Fma | O::Copysign => {
            F::Int
        }
        O::Rcp | O::Sqrt | O::Rsqrt | O::Sin | O::Cos | O::Lg2 | O::Ex2 | O::Tanh => F::Int,
        O::And | O::Or | O::Xor | O::Not | O::Cnot | O::Shl | O::Shr | O::Shf => F::Int,
        O::Bfe | O::Bfi | O::Prmt | O::Popc | O::Clz | O::Brev | O::Bfind | O::Lop3 => F::Int,
        O::Dp4a | O::Dp2a | O::Fns | O::Setp | O::Set | O::Selp | O::Slct => F::Int,
        O::Bmsk | O::Szext => F::Int,
        O::Vadd | O::Vsub | O::Vabsdiff | O::Vmin | O::Vmax | O::Vshl | O::Vshr | O::Vmad => {
            F::Video
        }
        O::Vset | O::Vadd2 | O::Vsub2 | O::Vavrg2 | O::Vabsdiff2 | O::Vmin2 | O::Vmax2 => F::Video,
        O::Vset2 | O::Vadd4 | O::Vsub4 | O::Vavrg4 | O::Vabsdiff4 | O::Vmin4 | O::Vmax4 => F::Video,
        O::Vset4 => F::Video,
        O::Mov | O::Cvt | O::Cvta | O::Isspacep => F::Convert,
        O::Ld | O::Ldu | O::St | O::Prefetch | O::Prefetchu | O::Createpolicy => F::Memory,
        O::Discard | O::Applypriority => F::Memory,
        O::Atom | O::Red => F::Atomic,
        O::MultimemLdReduce | O::MultimemSt | O::MultimemRed => F::Atomic,
        O::Bar | O::Barrier | O::BarrierCluster | O::Membar | O::Fence => F::Barrier,
        O::Mapa | O::Getctarank => F::Barrier,
        O::Tex | O::Tld4 | O::Txq | O::Suld | O::Sust | O::Sured | O::Suq | O::Istypep => {
            F::Texture
        }
        O::BarWarpSync | O::Shfl | O::Vote | O::Match | O::Redux | O::Activemask | O::Elect => {
            F::Warp
        }
        O::Bra | O::BrxIdx | O::Ret | O::Exit | O::Trap | O::Brkpt | O::Nanosleep => F::Control,
        O::Griddepcontrol | O::Pmevent => F::Control,
        O::Call => F::Call,
        O::Stacksave | O::Stackrestore | O::Alloca => F::Call,
        O::WmmaLoadA | O::WmmaLoadB | O::WmmaLoadC | O::WmmaStoreD | O::WmmaMma => F::Tensor,
        O::MmaSp | O::MmaSpOrdered | O::Movmatrix => F::Tensor,
        O::Mma | O::Ldmatrix | O::Stmatrix | O::WgmmaFence | O::WgmmaCommitGroup => F::Tensor,
        O::WgmmaWaitGroup | O::WgmmaMmaAsync | O::Setmaxnreg => F::Tensor,
        O::WgmmaMmaAsyncSp => F::Tensor,
        O::CpAsync | O::CpAsyncCommitGroup | O::CpAsyncWaitGroup | O::CpAsyncWaitAll => {
            F::AsyncCopy
        }
        O::CpAsyncBulk | O::CpAsyncBulkTensor | O::CpAsyncBulkCommitGroup => F::AsyncCopy,
        O::CpAsyncBulkWaitGroup | O::CpAsyncBulkPrefetchTensor => F::AsyncCopy,
        O::CpAsyncBulkPrefetch => F::AsyncCopy,
        O::MbarrierInit | O::MbarrierInval | O::MbarrierArrive | O::MbarrierArriveDrop => {
            F::AsyncCopy
        }
        O::MbarrierExpectTx | O::MbarrierCompleteTx | O::MbarrierTestWait => F::AsyncCopy,
        O::MbarrierTryWait | O::MbarrierPendingCount => F::AsyncCopy,
        O::CpReduceAsyncBulk | O::CpReduceAsyncBulkTensor | O::CpAsyncMbarrierArrive => {
            F::AsyncCopy
        }
        O::StAsync | O::RedAsync => F::AsyncCopy,
        O::TensormapReplace | O::TensormapCpFenceproxy => F::AsyncCopy,
    }
}

/// The operand of `ins` with `role`, or an error naming the missing operand.
pub(super) fn role<'i>(
    f: &Function,
    ins: &'i Instruction,
    role: Role,
) -> Result<&'i Operand, EmuError> {
    ins.operand(role).ok_or_else(|| EmuError::Unsupported {
        kernel: f.name.clone(),
        line: ins.loc.line,
        text: ins.to_string(),
        why: format!("missing operand `{role}`"),
    })
}

impl Decoder<'_> {
    /// The destination of `ins` (its `Role::Dst` operand) as a register slot.
    pub(super) fn role_dst(&mut self, ins: &Instruction) -> Result<u32, EmuError> {
        let o = role(self.f, ins, Role::Dst)?;
        self.dst(ins, o)
    }

    /// The source operands of `ins` with `roles`, in that order, as register slots (at most
    /// three). A role the table does not give this opcode, or an optional one the instruction
    /// leaves out (`min`'s third input), reads as [`ZERO`]; a missing required one is an error.
    pub(super) fn role_srcs(
        &mut self,
        ins: &Instruction,
        roles: &[Role],
    ) -> Result<[u32; 3], EmuError> {
        let mut s = [ZERO; 3];
        for (k, &r) in roles.iter().enumerate().take(3) {
            match ins.operand(r) {
                Some(o) => s[k] = self.src(ins, o)?,
                None if ins.op.slots().iter().any(|t| t.role == r && !t.optional) => {
                    role(self.f, ins, r)?;
                }
                None => {}
            }
        }
        Ok(s)
    }
}

/// A family decoder was handed an opcode [`family`] does not send to it (a bug in the
/// dispatch, reported as an error rather than a panic).
pub(super) fn misrouted(d: &Decoder<'_>, ins: &Instruction) -> EmuError {
    d.err(
        ins,
        format!("decoder dispatch sent `{}` to the wrong family", ins.op),
    )
}

impl Decoder<'_> {
    /// Decodes `ins` (materialised; `ins0` as written) with its family's decoder.
    pub(super) fn dispatch(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let float = ins.ty().is_some_and(|t| t.is_float());
        match family(ins.op, float) {
            Family::Int if matches!(ins.op, Opcode::Setp | Opcode::Set) => {
                self.decode_compare(ins, ins0, guard)
            }
            Family::Int => self.decode_int(ins, ins0, guard),
            Family::Float if ins.op == Opcode::Testp => self.decode_testp(ins, ins0, guard),
            Family::Float => self.decode_float(ins, ins0, guard),
            Family::Convert => self.decode_convert(ins, ins0, guard),
            Family::Memory => self.decode_memory(ins, ins0, guard),
            Family::Atomic if super::multimem::is_multimem(ins.op) => {
                self.decode_multimem(ins, ins0, guard)
            }
            Family::Atomic => self.decode_atomic(ins, ins0, guard),
            Family::Warp => self.decode_warp(ins, ins0, guard),
            Family::Barrier => self.decode_barrier(ins, ins0, guard),
            Family::Tensor
                if matches!(ins.op, Opcode::Mma | Opcode::Ldmatrix | Opcode::Stmatrix) =>
            {
                self.decode_tensor(ins, ins0, guard)
            }
            Family::Tensor if super::wmma::is_wmma_family(ins.op) => {
                self.decode_wmma(ins, ins0, guard)
            }
            Family::Tensor => self.decode_wgmma(ins, ins0, guard),
            Family::AsyncCopy
                if matches!(
                    ins.op,
                    Opcode::CpAsyncBulkTensor
                        | Opcode::CpReduceAsyncBulkTensor
                        | Opcode::TensormapReplace
                ) =>
            {
                self.decode_bulk_tensor(ins, ins0, guard)
            }
            Family::AsyncCopy
                if ins.op.name().starts_with("mbarrier.")
                    || ins.op == Opcode::CpAsyncMbarrierArrive =>
            {
                self.decode_mbarrier(ins, ins0, guard)
            }
            Family::AsyncCopy => self.decode_async_copy(ins, ins0, guard),
            Family::Control => self.decode_control(ins, ins0, guard),
            Family::Call if super::stack::is_stack_op(ins.op) => {
                self.decode_stack(ins, ins0, guard)
            }
            Family::Call => self.call(ins, ins0, guard),
            Family::Video => self.decode_video(ins, ins0, guard),
            Family::Texture => self.decode_tex(ins, ins0, guard),
            Family::NotEmulated => {
                Err(self.err(ins, "instruction not yet supported by the emulator"))
            }
        }
    }
}
