//! Build errors: everything a user mistake can produce that Rust typing does not already rule out.

/// Why a kernel or module could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BuildError {
    /// Raw PTX text did not parse.
    #[error("raw PTX does not parse: {0}")]
    RawParse(#[from] ptx::ParseError),
    /// Raw PTX used registers the builder never declared.
    #[error("raw PTX uses undeclared register(s) {}: `{text}`", .regs.join(", "))]
    UnknownRegisters { regs: Vec<String>, text: String },
    /// Raw PTX redeclared a name in the builder's register namespace.
    #[error("raw PTX declares `{0}`, which clashes with the builder's register names (%p/%rs/%r/%f/%rd/%fd + number)")]
    RawRedeclare(String),
    /// An instruction needs a newer architecture than the target.
    #[error("`{instr}` needs sm_{need}, target is {arch}")]
    ArchTooOld {
        instr: String,
        need: u32,
        arch: String,
    },
    /// An instruction needs an architecture-specific target (`sm_90a`).
    #[error("`{instr}` needs an architecture-specific target (e.g. sm_90a), target is {arch}")]
    NeedsArchSpecific { instr: String, arch: String },
    /// The user-chosen PTX ISA version is too old for the instructions used.
    #[error("PTX ISA {}.{} is too old: `{instr}` needs {}.{}", .have / 10, .have % 10, .need / 10, .need % 10)]
    PtxVersionTooOld { instr: String, need: u32, have: u32 },
    /// Two parameters, kernels or variables share a name.
    #[error("duplicate name `{0}`")]
    Duplicate(String),
    /// `break_`/`continue_` outside a loop, branches inside `when`, ...
    #[error("control flow misuse: {0}")]
    ControlFlow(String),
    /// A typed kernel's parameter list differs from its signature type.
    #[error("kernel signature: {0}")]
    Signature(String),
    /// An operand combination the PTX ISA does not allow (vector width, fragment count, ...).
    #[error("invalid operation: {0}")]
    Invalid(String),
}
