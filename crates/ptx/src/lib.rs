//! `ptx`: the PTX IR at the bottom of ptxforge.
//!
//! What this crate owns:
//! - [`types`]: scalar types and state spaces;
//! - [`mods`]: instruction modifiers (`.rn`, `.global`, `.v4`, `.m16n8k16`, ...);
//! - [`ops`]: the typed modifier families every layer uses (`ShflMode`, `AtomOp`, `Rounding`,
//!   `CmpOp`, `Scope`, `MemOrder`, `Swizzle`, `MatrixDesc`, ...) and their `Instruction`
//!   accessors;
//! - [`isa`]: the opcode table — one description per instruction (operand counts and roles,
//!   minimum target and ISA version), read by every other layer;
//! - [`roles`]: named operand roles (`inst.operand(Role::Mbar)`), listed per opcode in the
//!   table;
//! - [`ir`]: modules, functions, statements, instructions and operands as typed values;
//! - [`parser`] / [`printer`]: PTX text <-> IR, with `parse(print(m)) == m`;
//! - [`mod@validate`]: typed diagnostics (undeclared registers, type mismatches, target checks);
//! - [`texture`]: texture/surface geometries, mipmap modes, query attributes and `.texref`
//!   initialisers as typed values;
//! - [`video`]: the video instructions (`vadd`..`vset4`) as one typed form;
//! - [`ptxas`]: the offline `ptxas` wrapper (registers, spills, errors mapped to PTX lines).
//!
//! Data flow: text --parser--> [`Module`] --validate--> diagnostics; builder --> [`Module`]
//! --printer--> text --ptxas--> SASS/resources; the emulator decodes a [`Module`] directly.

pub mod ir;
pub mod isa;
mod lexer;
pub mod mods;
pub mod ops;
pub mod parser;
pub mod printer;
pub mod ptxas;
pub mod roles;
pub mod texture;
pub mod types;
pub mod validate;
pub mod video;

pub use ir::*;
pub use isa::{requirement, OpInfo, Opcode, Requirement};
pub use mods::{Flag, Mod};
pub use parser::{parse, parse_statements, ParseError};
pub use printer::print;
pub use roles::Role;
pub use types::{Space, Ty, TyKind};
pub use validate::{validate, DiagKind, Diagnostic};
