//! What the emulator can run, derived from the decoder itself rather than kept as a list:
//! [`crate::program::family`] places every opcode of [`ptx::Opcode`] (exhaustively, so a new
//! opcode does not compile until it is placed), the integer catch-all of the decoder
//! ([`crate::alu::int_fn`] and the carry chain) is probed type by type, and [`unsupported`] runs
//! the real decoder over a module, reporting every instruction it refuses with its line.
//! `ptxforge isa` and `ptxforge check` read this module.

use crate::error::EmuError;
use crate::program::{self, family, Family, SymAddr};
use ptx::{Mod, Module, Opcode, Ty};
use std::collections::HashMap;

/// Integer types the integer catch-all is probed with.
const INT_TYPES: [Ty; 11] = [
    Ty::Pred,
    Ty::B16,
    Ty::B32,
    Ty::B64,
    Ty::U16,
    Ty::U32,
    Ty::U64,
    Ty::S16,
    Ty::S32,
    Ty::S64,
    Ty::U8,
];

/// Opcodes of the integer family that have a decoder arm of their own in `program/int.rs`
/// (all others go through the catch-all, which is probed).
const INT_ARMS: [Opcode; 9] = [
    Opcode::Div,
    Opcode::Rem,
    Opcode::Bfi,
    Opcode::Shf,
    Opcode::Lop3,
    Opcode::Setp,
    Opcode::Set,
    Opcode::Selp,
    Opcode::Slct,
];

/// How far the emulator covers one opcode.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OpcodeCoverage {
    /// The dotted opcode name (`cp.async.bulk.tensor`).
    pub opcode: &'static str,
    /// Families that decode it: integer and float forms of arithmetic opcodes differ.
    pub families: Vec<&'static str>,
    /// Does the emulator decode at least one form?
    pub emulated: bool,
    /// For opcodes decoded by the integer catch-all: the integer types it runs (empty: not probed).
    pub int_types: Vec<String>,
    /// Why it is not emulated, or which forms are missing.
    pub note: String,
}

/// Does the decoder's integer catch-all run `op` on type `t` (as `op.t` or, for opcodes with
/// two type modifiers such as `dp4a.u32.u32`, `op.t.t`)?
fn int_catch_all(op: Opcode, t: Ty) -> bool {
    let carry = matches!(op, Opcode::Addc | Opcode::Subc | Opcode::Madc)
        && matches!(t, Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64);
    let probe = |mods: Vec<Mod>| crate::alu::int_fn(&ptx::Instruction::new(op, mods, Vec::new()));
    // forms that need a mode: `dp2a.lo`, `bmsk.wrap`, `szext.wrap`
    let moded = |f: ptx::Flag, n: usize| {
        let mut mods = vec![Mod::Flag(f)];
        mods.extend(std::iter::repeat_n(Mod::Type(t), n));
        probe(mods).is_some()
    };
    carry
        || probe(vec![Mod::Type(t)]).is_some()
        || probe(vec![Mod::Type(t), Mod::Type(t)]).is_some()
        || moded(ptx::Flag::Lo, 2)
        || moded(ptx::Flag::Wrap, 1)
}

/// The coverage of one opcode.
pub fn opcode_coverage(op: Opcode) -> OpcodeCoverage {
    let (fi, ff) = (family(op, false), family(op, true));
    let mut families: Vec<Family> = vec![fi, ff];
    families.dedup();
    let mut int_types = Vec::new();
    let mut emulated = families.iter().any(|f| *f != Family::NotEmulated);
    let mut note = String::new();
    if !emulated {
        note = "not yet supported by the emulator".into();
    } else if op == Opcode::Mma {
        // ptxas 13.5 accepts it (sm_80+) but the PTX ISA has no such form (`crate::mma_volta`)
        note = "all forms but the undocumented m8n8k4 .f32.bf16.bf16.f32".into();
    } else if fi == Family::Int && !INT_ARMS.contains(&op) {
        int_types = INT_TYPES
            .into_iter()
            .filter(|t| int_catch_all(op, *t))
            .map(|t| t.to_string())
            .collect();
        if int_types.is_empty() {
            if ff == Family::Float {
                note = "float forms only".into();
            } else {
                emulated = false;
                note = "the integer decoder has no form of it".into();
            }
        }
    }
    OpcodeCoverage {
        opcode: op.name(),
        families: families
            .into_iter()
            .filter(|f| *f != Family::NotEmulated || !emulated)
            .map(Family::name)
            .collect(),
        emulated,
        int_types,
        note,
    }
}

/// The coverage of every opcode the parser knows, in table order.
pub fn coverage() -> Vec<OpcodeCoverage> {
    Opcode::ALL.iter().map(|op| opcode_coverage(*op)).collect()
}

/// One instruction the emulator's decoder refuses.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Refusal {
    pub kernel: String,
    /// PTX source line (0 when the module was not parsed from text).
    pub line: u32,
    pub text: String,
    pub why: String,
}

/// Runs the emulator's decoder over every kernel of `module` (and the device functions it
/// calls) and returns every instruction it refuses, and kernels it cannot decode at all. An
/// empty result means `run` will not refuse the module at load time. Module variables get
/// placeholder addresses (decoding does not read memory).
pub fn unsupported(module: &Module) -> Vec<Refusal> {
    let mut symbols = HashMap::new();
    for (i, (key, _)) in program::global_variables(module).into_iter().enumerate() {
        symbols.insert(key, SymAddr::Global(0x1000_0000 + 0x1_0000 * i as u64));
    }
    let mut out = Vec::new();
    for f in module.entries() {
        match program::decode_collecting(module, &f.name, &symbols) {
            Ok(refused) => out.extend(refused.into_iter().map(|e| refusal(&f.name, e))),
            Err(e) => out.push(refusal(&f.name, e)),
        }
    }
    out
}

fn refusal(kernel: &str, e: EmuError) -> Refusal {
    match e {
        EmuError::Unsupported {
            kernel,
            line,
            text,
            why,
        } => Refusal {
            kernel,
            line,
            text,
            why,
        },
        other => Refusal {
            kernel: kernel.to_string(),
            line: 0,
            text: String::new(),
            why: other.to_string(),
        },
    }
}
