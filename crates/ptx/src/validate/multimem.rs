//! Operation/type/semantics rules of `multimem.ld_reduce`, `multimem.st` and `multimem.red`
//! (and two rules the same ISA audit found missing: where `ld`'s `[a].unified` attribute may
//! appear, `lop3`'s predicate form and `fma.oob`)
//! (sm_90, PTX 8.1; `.acc::f32` PTX 8.2). The tables are what ptxas 13.5 accepts for sm_90
//! and sm_90a, each combination of operation, vector width, type and `.acc::f32` tried
//! (`crates/emu/tests/multimem.rs` asks ptxas again for every form it runs); the validator
//! reports a form outside them naming the operation and type.

use crate::ir::Instruction;
use crate::isa::Opcode;
use crate::mods::Flag;
use crate::types::{Space, Ty};

/// `[a].unified` (kept as the `.unified` modifier) is an `ld` attribute of global or generic
/// addresses only, as ptxas 13.5 has it.
pub(super) fn unified_error(i: &Instruction) -> Option<String> {
    if !i.has(Flag::Unified) {
        return None;
    }
    if i.op != Opcode::Ld {
        return Some(format!(
            "`{}` takes no `.unified` address attribute (only `ld`)",
            i.op.name()
        ));
    }
    match i.space() {
        Some(sp) if sp != Space::Global => Some(format!(
            "`ld [a].unified` addresses global or generic memory, not .{sp}"
        )),
        _ => None,
    }
}

/// `lop3`: the predicate form `d|p, a, b, c, immLut, q` needs `.and` or `.or`, the plain form
/// takes neither (ptxas 13.5).
pub(super) fn lop3_error(i: &Instruction) -> Option<String> {
    if i.op != Opcode::Lop3 {
        return None;
    }
    let pred_form = i.args.len() > 5;
    let bool_op = i.has(Flag::And) || i.has(Flag::Or);
    match (pred_form, bool_op) {
        (true, false) => Some("`lop3` with a predicate result needs .and or .or".into()),
        (false, true) => Some("`lop3.and`/`.or` needs a `d|p` result and a predicate `q`".into()),
        _ if i.has(Flag::Xor) => Some("`lop3` combines its predicate with .and or .or only".into()),
        _ => None,
    }
}

/// `fma.oob` (sm_90): `.rn` on f16, bf16 and their x2 forms only, no `.ftz` (ptxas 13.5).
pub(super) fn oob_error(i: &Instruction) -> Option<String> {
    if !i.has(Flag::Oob) {
        return None;
    }
    let half = matches!(i.ty(), Some(Ty::F16 | Ty::F16x2 | Ty::Bf16 | Ty::Bf16x2));
    (i.op != Opcode::Fma || !half || !i.has(Flag::Rn) || i.has(Flag::Ftz)).then(|| {
        "`.oob` is an `fma.rn` modifier of f16/bf16 (and x2) types, without .ftz".to_string()
    })
}

/// The reduction operation of `i` as written.
fn op_name(i: &Instruction) -> Option<&'static str> {
    [
        (Flag::Add, "add"),
        (Flag::Min, "min"),
        (Flag::Max, "max"),
        (Flag::And, "and"),
        (Flag::Or, "or"),
        (Flag::Xor, "xor"),
    ]
    .into_iter()
    .find(|(f, _)| i.has(*f))
    .map(|x| x.1)
}

/// What is wrong with the multimem instruction `i`, if anything (None for other opcodes).
pub(super) fn form_error(i: &Instruction) -> Option<String> {
    if !matches!(
        i.op,
        Opcode::MultimemLdReduce | Opcode::MultimemSt | Opcode::MultimemRed
    ) {
        return None;
    }
    let name = i.op.name();
    let Some(ty) = i.last_ty() else {
        return Some(format!("`{name}` needs a type"));
    };
    if let Some(sp) = i.space().filter(|s| *s != Space::Global) {
        return Some(format!(
            "`{name}` operates on .global (or generic) addresses, not .{sp}"
        ));
    }
    if let Some(why) = sem_error(i) {
        return Some(why);
    }
    let vec = i.vec_width().unwrap_or(1);
    if !vec_ok(ty, vec) {
        return Some(format!("`{name}` has no .v{vec} form of .{ty}"));
    }
    let op = match (i.op, op_name(i)) {
        (Opcode::MultimemSt, None) => return None,
        (Opcode::MultimemSt, Some(op)) => return Some(format!("`{name}` takes no .{op}")),
        (_, None) => return Some(format!("`{name}` needs an operation (.add, .min, ...)")),
        (_, Some(op)) => op,
    };
    let red = i.op == Opcode::MultimemRed;
    if !op_ok(op, ty, vec, red) {
        return Some(format!("`{name}` has no .{op} on .{ty}"));
    }
    // ptxas accepts (and ignores) `.acc::f32` on every `multimem.red`
    let half = matches!(ty, Ty::F16 | Ty::Bf16 | Ty::F16x2 | Ty::Bf16x2);
    if i.has(Flag::AccF32) && !red && !(half && op == "add") {
        return Some(format!(
            "`{name}` takes .acc::f32 only with .add on f16/bf16 types, not .{op} .{ty}"
        ));
    }
    None
}

/// Memory semantics: `.weak` (ld_reduce, st), `.relaxed`, `.acquire` (ld_reduce) or
/// `.release` (st, red); a strong one needs a scope.
fn sem_error(i: &Instruction) -> Option<String> {
    let name = i.op.name();
    let allowed: &[Flag] = match i.op {
        Opcode::MultimemLdReduce => &[Flag::Weak, Flag::Relaxed, Flag::Acquire],
        Opcode::MultimemSt => &[Flag::Weak, Flag::Relaxed, Flag::Release],
        _ => &[Flag::Relaxed, Flag::Release],
    };
    let sems = [
        Flag::Weak,
        Flag::Relaxed,
        Flag::Acquire,
        Flag::Release,
        Flag::AcqRel,
        Flag::Volatile,
    ];
    if let Some(bad) = sems.iter().find(|f| i.has(**f) && !allowed.contains(f)) {
        return Some(format!("`{name}` takes no .{bad}"));
    }
    let scoped = [Flag::Cta, Flag::Cluster, Flag::Gpu, Flag::Sys]
        .iter()
        .any(|f| i.has(*f));
    let strong = [Flag::Relaxed, Flag::Acquire, Flag::Release]
        .iter()
        .find(|f| i.has(**f));
    match strong {
        Some(f) if !scoped => Some(format!("`{name}` .{f} needs a scope (.cta, .gpu, ...)")),
        None if scoped => Some(format!(
            "`{name}` takes a scope only with .relaxed, .acquire or .release"
        )),
        _ => None,
    }
}

/// Vector widths per type: integers scalar only; f16/bf16 elements in 32-, 64- or 128-bit
/// vectors (.v2/.v4/.v8); f32, f16x2 and bf16x2 scalar, .v2 or .v4; f64 scalar.
fn vec_ok(ty: Ty, vec: u8) -> bool {
    match ty {
        Ty::F16 | Ty::Bf16 => matches!(vec, 2 | 4 | 8),
        Ty::F32 | Ty::F16x2 | Ty::Bf16x2 => matches!(vec, 1 | 2 | 4),
        _ => vec == 1,
    }
}

/// The operations per type (`red` as `ld_reduce`, except that a scalar f16x2/bf16x2 `red`
/// has only `.add`, as ptxas 13.5 has it).
fn op_ok(op: &str, ty: Ty, vec: u8, red: bool) -> bool {
    match ty {
        Ty::B32 | Ty::B64 => matches!(op, "and" | "or" | "xor"),
        Ty::U32 | Ty::S32 | Ty::U64 => matches!(op, "add" | "min" | "max"),
        Ty::S64 => matches!(op, "min" | "max"),
        Ty::F32 | Ty::F64 => op == "add",
        Ty::F16 | Ty::Bf16 => matches!(op, "add" | "min" | "max"),
        Ty::F16x2 | Ty::Bf16x2 if red && vec == 1 => op == "add",
        Ty::F16x2 | Ty::Bf16x2 => matches!(op, "add" | "min" | "max"),
        _ => false,
    }
}
