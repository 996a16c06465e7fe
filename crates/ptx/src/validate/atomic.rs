//! Operation/type rules of the atomic and asynchronous memory forms: `atom`, `red`,
//! `red.async`, `st.async` and `cp.reduce.async.bulk`. The tables follow the PTX ISA 9.x and
//! agree with ptxas 13.5 for sm_90a (each pair was tried); the validator reports a form outside
//! them as a type mismatch naming the operation and type.

use crate::ir::Instruction;
use crate::isa::Opcode;
use crate::mods::Flag;
use crate::types::{Space, Ty};

/// The reduction/atomic operation of `i` as written (`add`, `min`, ..., `cas`).
fn op_name(i: &Instruction) -> Option<&'static str> {
    [
        (Flag::Add, "add"),
        (Flag::Min, "min"),
        (Flag::Max, "max"),
        (Flag::Inc, "inc"),
        (Flag::Dec, "dec"),
        (Flag::And, "and"),
        (Flag::Or, "or"),
        (Flag::Xor, "xor"),
        (Flag::Exch, "exch"),
        (Flag::Cas, "cas"),
    ]
    .into_iter()
    .find(|(f, _)| i.has(*f))
    .map(|x| x.1)
}

/// What is wrong with the operation/type/vector form of `i`, if anything.
pub(super) fn form_error(i: &Instruction) -> Option<String> {
    let ty = i.last_ty()?;
    match i.op {
        Opcode::Atom | Opcode::Red => atom_error(i, ty),
        Opcode::RedAsync => {
            let op = op_name(i)?;
            let ok = match op {
                "add" => matches!(ty, Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64),
                "min" | "max" => matches!(ty, Ty::U32 | Ty::S32),
                "inc" | "dec" => ty == Ty::U32,
                "and" | "or" | "xor" => ty == Ty::B32,
                _ => false,
            };
            (!ok).then(|| format!("`red.async` has no .{op} on .{ty}"))
        }
        Opcode::StAsync => {
            let bits = ty.size() * 8 * u32::from(i.vec_width().unwrap_or(1));
            if !matches!(ty.size(), 4 | 8) || ty.is_float() && !matches!(ty, Ty::F32 | Ty::F64) {
                Some(format!("`st.async` stores 32- or 64-bit types, not .{ty}"))
            } else if bits > 128 {
                Some(format!("`st.async` vector of .{ty} exceeds 128 bits"))
            } else {
                None
            }
        }
        Opcode::CpReduceAsyncBulk => bulk_error(i, ty),
        _ => None,
    }
}

/// `atom`/`red`: scalar operation/type pairs, `.noftz` on half-precision adds, and the
/// vector forms (global only; `.add` on .f32, `.add/.min/.max.noftz` on f16/bf16 types).
fn atom_error(i: &Instruction, ty: Ty) -> Option<String> {
    let op = op_name(i)?;
    let name = i.op.name();
    let half = matches!(ty, Ty::F16 | Ty::Bf16 | Ty::F16x2 | Ty::Bf16x2);
    if half != i.has(Flag::Noftz) {
        return Some(if half {
            format!("`{name}.{op}` on .{ty} needs .noftz")
        } else {
            format!("`{name}` takes .noftz only on f16/bf16 types, not .{ty}")
        });
    }
    if let Some(n) = i.vec_width() {
        let ok_ty = match ty {
            Ty::F32 => op == "add" && n <= 4,
            Ty::F16 | Ty::Bf16 => matches!(op, "add" | "min" | "max"),
            Ty::F16x2 | Ty::Bf16x2 => matches!(op, "add" | "min" | "max") && n <= 4,
            _ => false,
        };
        if !ok_ty {
            return Some(format!("`{name}` has no .v{n} .{op} on .{ty}"));
        }
        if i.space().is_some_and(|s| s != Space::Global) {
            return Some(format!("vector `{name}` operates on .global only"));
        }
        return None;
    }
    let ok = match op {
        "add" => matches!(ty, Ty::U32 | Ty::S32 | Ty::U64 | Ty::F32 | Ty::F64) || half,
        "min" | "max" => matches!(ty, Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64),
        "inc" | "dec" => ty == Ty::U32,
        "and" | "or" | "xor" => matches!(ty, Ty::B32 | Ty::B64),
        "exch" => matches!(ty, Ty::B32 | Ty::B64 | Ty::B128) && i.op == Opcode::Atom,
        "cas" => matches!(ty, Ty::B16 | Ty::B32 | Ty::B64 | Ty::B128) && i.op == Opcode::Atom,
        _ => false,
    };
    (!ok).then(|| format!("`{name}` has no .{op} on .{ty}"))
}

/// `cp.reduce.async.bulk`: to .global the full table, to .shared::cluster the 32-bit integer
/// forms and `.add.u64`; `.add` on .f16/.bf16 needs `.noftz`.
fn bulk_error(i: &Instruction, ty: Ty) -> Option<String> {
    let op = op_name(i)?;
    let global = i.spaces().next() == Some(Space::Global);
    let ok = match op {
        "and" | "or" | "xor" => ty == Ty::B32 || global && ty == Ty::B64,
        "inc" | "dec" => ty == Ty::U32,
        "add" if global => {
            matches!(ty, Ty::U32 | Ty::S32 | Ty::U64 | Ty::F32 | Ty::F64)
                || matches!(ty, Ty::F16 | Ty::Bf16) && i.has(Flag::Noftz)
        }
        "add" => matches!(ty, Ty::U32 | Ty::S32 | Ty::U64),
        "min" | "max" if global => {
            matches!(
                ty,
                Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64 | Ty::F16 | Ty::Bf16
            )
        }
        "min" | "max" => matches!(ty, Ty::U32 | Ty::S32),
        _ => false,
    };
    let dst = if global { "global" } else { "shared::cluster" };
    (!ok).then(|| format!("`cp.reduce.async.bulk` to .{dst} has no .{op} on .{ty}"))
}
