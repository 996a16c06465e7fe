//! Static checks over a [`Module`]: typed [`Diagnostic`]s, all of them in one run (never
//! first-error-only).
//!
//! What is checked, per function:
//! - registers: used but undeclared (`%r<39>` ranges, `{ }` block scoping, special registers
//!   allowed), declared twice in one scope;
//! - operand types and widths by PTX's rules (bit-size types match any same-size type,
//!   signed/unsigned of one size are interchangeable, floats must match exactly): from the type
//!   classes of the opcode table's role lists ([`crate::roles::TyClass`]: plain arithmetic and
//!   bit operations, shift amounts, `setp`, `selp`/`slct`, `ld`/`st`/`atom`/`red` values and
//!   vector counts, warp-level operands, ...), plus the rules a class cannot say (`mul`/`mad`
//!   `.wide` destinations, `mov` packing, `cvt`, `mma`/`wgmma`/`wmma` fragments, stack
//!   instructions, video and texture forms);
//! - guards are `.pred`; operand counts per the opcode table (the role list for this
//!   instruction's modifiers where the table has one);
//! - state spaces (`ld.param` of a non-parameter, `st.const`, `.param::entry` in a `.func`,
//!   unknown symbols in addresses);
//! - labels (missing branch targets, duplicates);
//! - the module's `.target` / `.version` against [`crate::isa::requirement`];
//! - `.reqntid` / `.maxntid` beyond 1024 threads.

use crate::ir::*;
use crate::isa::{requirement, Opcode};
use crate::mods::{Flag, Mod};
use crate::roles::{Role, TyClass};
use crate::types::{Space, Ty, TyKind};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::fmt;

mod atomic;
mod mma_volta;
mod multimem;
mod tc;
mod texture;

/// How bad a diagnostic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        })
    }
}

/// What a diagnostic is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiagKind {
    /// A register used without a `.reg` declaration in scope.
    UndeclaredRegister,
    /// A register declared twice in the same scope.
    DuplicateRegister,
    /// An operand whose register type does not fit the instruction's type.
    TypeMismatch,
    /// A vector operand with the wrong number of elements (`.v2`/`.v4`, `ldmatrix .x4`).
    VectorWidth,
    /// An `mma` fragment with the wrong register count or type.
    MmaFragment,
    /// A guard (`@p`) that is not a `.pred` register.
    GuardNotPredicate,
    /// Too few or too many operands for the opcode.
    OperandCount,
    /// An operand of the wrong form (an immediate as destination, a non-address for `ld`).
    BadOperand,
    /// A memory access in the wrong state space.
    StateSpace,
    /// A symbol (variable, parameter, function) that is not declared.
    UnknownSymbol,
    /// A branch to a label that does not exist.
    UndefinedLabel,
    /// A label defined twice in one block (labels are scoped to their `{ }` block).
    DuplicateLabel,
    /// An instruction the module's `.target` does not have.
    TargetUnsupported,
    /// An instruction newer than the module's `.version`.
    PtxVersion,
    /// A launch-bound directive beyond the hardware limits.
    ThreadCount,
}

impl DiagKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DiagKind::UndeclaredRegister => "undeclared-register",
            DiagKind::DuplicateRegister => "duplicate-register",
            DiagKind::TypeMismatch => "type-mismatch",
            DiagKind::VectorWidth => "vector-width",
            DiagKind::MmaFragment => "mma-fragment",
            DiagKind::GuardNotPredicate => "guard-not-predicate",
            DiagKind::OperandCount => "operand-count",
            DiagKind::BadOperand => "bad-operand",
            DiagKind::StateSpace => "state-space",
            DiagKind::UnknownSymbol => "unknown-symbol",
            DiagKind::UndefinedLabel => "undefined-label",
            DiagKind::DuplicateLabel => "duplicate-label",
            DiagKind::TargetUnsupported => "target-unsupported",
            DiagKind::PtxVersion => "ptx-version",
            DiagKind::ThreadCount => "thread-count",
        }
    }
}

impl fmt::Display for DiagKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One finding, with the source position of the statement it is about (0:0 for IR built
/// without positions).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnostic {
    pub severity: Severity,
    pub kind: DiagKind,
    pub line: u32,
    pub col: u32,
    /// The function it was found in (`None` for module-level findings).
    pub function: Option<String>,
    pub message: String,
    /// `file:line` of the Rust builder call that emitted the instruction (builder-made modules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rust: Option<String>,
}

impl Diagnostic {
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {}: {}",
            self.line, self.col, self.severity, self.message
        )?;
        if let Some(r) = &self.rust {
            write!(f, " (emitted at {r})")?;
        }
        Ok(())
    }
}

/// Only the errors of a diagnostic list.
pub fn errors(diags: &[Diagnostic]) -> impl Iterator<Item = &Diagnostic> {
    diags.iter().filter(|d| d.is_error())
}

/// Checks a module; returns every finding, in source order.
/// What is wrong with the operation, type, vector width or memory semantics of a
/// `multimem.*` instruction (None when the form is one ptxas accepts, or for other opcodes);
/// the emulator's decoder asks it too.
pub fn multimem_form_error(i: &Instruction) -> Option<String> {
    multimem::form_error(i)
}

pub fn validate(m: &Module) -> Vec<Diagnostic> {
    let mut symbols: HashMap<&str, Space> = HashMap::new();
    // Function name -> index of its first declaration or definition among the module's items:
    // a call is valid only after it (ptxas: "Call to 'g' requires call prototype").
    let mut funcs: HashMap<&str, usize> = HashMap::new();
    for (k, item) in m.items.iter().enumerate() {
        match item {
            Item::Var(v) => {
                symbols.insert(&v.name, v.space);
            }
            Item::Func(f) => {
                funcs.entry(&f.name).or_insert(k);
            }
            Item::Alias { .. } => {}
        }
    }
    let mut out = Vec::new();
    let functions = m.items.iter().enumerate().filter_map(|(k, i)| match i {
        Item::Func(f) => Some((k, f)),
        Item::Var(_) | Item::Alias { .. } => None,
    });
    for (item, f) in functions {
        let mut c = FnCheck {
            m,
            f,
            item,
            globals: &symbols,
            funcs: &funcs,
            locals: HashMap::new(),
            scopes: Vec::new(),
            labels: HashMap::new(),
            diags: Vec::new(),
        };
        c.run();
        out.extend(c.diags);
    }
    out.extend(texture::ref_decls(m));
    out.sort_by_key(|d| (d.line, d.col));
    out
}

/// Checks a module and returns only the errors (convenience for tests and the builder).
pub fn validate_errors(m: &Module) -> Vec<Diagnostic> {
    validate(m).into_iter().filter(|d| d.is_error()).collect()
}

#[derive(Clone, Copy, Debug)]
struct RegInfo {
    ty: Ty,
    vec: Option<u8>,
}

#[derive(Default)]
struct Scope {
    exact: HashMap<String, RegInfo>,
    /// `%r<39>`: prefix -> (count, info).
    ranges: HashMap<String, (u32, RegInfo)>,
}

impl Scope {
    fn lookup(&self, name: &str) -> Option<RegInfo> {
        if let Some(r) = self.exact.get(name) {
            return Some(*r);
        }
        let digits = name
            .bytes()
            .rev()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if digits == 0 || self.ranges.is_empty() {
            return None;
        }
        let (prefix, num) = name.split_at(name.len() - digits);
        if num.len() > 1 && num.starts_with('0') {
            return None;
        }
        let n: u64 = num.parse().ok()?;
        match self.ranges.get(prefix) {
            Some((count, info)) if n < *count as u64 => Some(*info),
            _ => None,
        }
    }
}

/// The registers of a `.reg` parameter.
fn param_reg(p: &Param) -> RegInfo {
    RegInfo {
        ty: p.ty,
        vec: p.vec,
    }
}

struct FnCheck<'a> {
    m: &'a Module,
    f: &'a Function,
    globals: &'a HashMap<&'a str, Space>,
    /// Index of this function among the module's items.
    item: usize,
    /// Function name -> index of its first declaration or definition.
    funcs: &'a HashMap<&'a str, usize>,
    /// Function-scope variables and `.param` parameters.
    locals: HashMap<&'a str, Space>,
    scopes: Vec<Scope>,
    /// label -> location of its definition
    labels: HashMap<&'a str, Loc>,
    diags: Vec<Diagnostic>,
}

/// Why an immediate cannot be an operand of type `want` (as ptxas rejects it): an integer
/// literal for a `.f32`/`.f64` operand (`add.f32 %f1, %f2, 1;`: write `0f3F800000` or `1.0`),
/// or a float literal for a signed/unsigned integer operand. Bit types take either (`mov.b32
/// %r1, 0f3F800000;`).
fn imm_kind_mismatch(imm: &Imm, want: Ty) -> Option<String> {
    let int = matches!(imm, Imm::Int(_) | Imm::U64(_));
    if int && matches!(want, Ty::F32 | Ty::F64) {
        let v = match imm {
            Imm::Int(v) => v.to_string(),
            Imm::U64(v) => v.to_string(),
            _ => String::new(),
        };
        return Some(format!(
            "integer immediate `{v}` where a .{want} is expected (write a float literal, e.g. `{v}.0` or `0f...`)"
        ));
    }
    if !int && matches!(want.kind(), TyKind::Signed | TyKind::Unsigned) {
        return Some(format!(
            "float immediate where a .{want} integer is expected"
        ));
    }
    None
}

/// Is an operand of register type `have` acceptable where the instruction wants `want`?
fn compatible(have: Ty, want: Ty) -> bool {
    if have == want {
        return true;
    }
    let (hk, wk) = (have.kind(), want.kind());
    if hk == TyKind::Pred || wk == TyKind::Pred || hk == TyKind::Opaque || wk == TyKind::Opaque {
        return false;
    }
    if have.size() != want.size() {
        return false;
    }
    if hk == TyKind::Bits || wk == TyKind::Bits {
        return true;
    }
    matches!(
        (hk, wk),
        (
            TyKind::Signed | TyKind::Unsigned,
            TyKind::Signed | TyKind::Unsigned
        )
    )
}

/// `ld`/`st`/`cvt` also accept integer registers wider than the instruction type.
fn compatible_wide(have: Ty, want: Ty) -> bool {
    if compatible(have, want) {
        return true;
    }
    let int_like = |t: Ty| matches!(t.kind(), TyKind::Bits | TyKind::Signed | TyKind::Unsigned);
    int_like(have) && int_like(want) && have.size() > want.size()
        || (have.kind() == TyKind::Bits
            && have.size() > want.size()
            && want.kind() == TyKind::Float)
}

fn doubled(t: Ty) -> Ty {
    let s = t.size() * 2;
    match t.kind() {
        TyKind::Signed => Ty::signed_of(s).unwrap_or(Ty::B128),
        TyKind::Unsigned => Ty::unsigned_of(s).unwrap_or(Ty::B128),
        _ => match s {
            2 => Ty::B16,
            4 => Ty::B32,
            8 => Ty::B64,
            _ => Ty::B128,
        },
    }
}

/// How an operand is checked against its expected type.
#[derive(Clone, Copy)]
enum Want {
    /// Exactly compatible with this type.
    T(Ty),
    /// Compatible, or an integer register wider than the type (`ld`/`st`/`cvt`).
    Wide(Ty),
}

impl<'a> FnCheck<'a> {
    fn diag(&mut self, kind: DiagKind, loc: Loc, message: String) {
        self.diags.push(Diagnostic {
            severity: Severity::Error,
            kind,
            line: loc.line,
            col: loc.col,
            function: Some(self.f.name.clone()),
            message,
            rust: loc.rust_location(),
        });
    }

    fn run(&mut self) {
        self.check_directives();
        let f = self.f;
        // Parameters: `.param` ones are symbols, `.reg` ones registers of the outer scope.
        let mut outer = Scope::default();
        for p in f.rets.iter().chain(&f.params) {
            if p.space == Space::Reg {
                outer.exact.insert(p.name.clone(), param_reg(p));
            } else {
                self.locals.insert(&p.name, p.space);
            }
        }
        self.scopes.push(outer);
        for p in f.rets.iter().chain(&f.params) {
            if p.vec.is_some() && p.space != Space::Reg {
                self.vector_param(&p.name, f.loc);
            }
        }
        if f.rets.len() > 1 && f.rets.iter().any(|p| p.space != Space::Reg) {
            self.diag(
                DiagKind::BadOperand,
                f.loc,
                format!(
                    "`{}` returns {} values: several return values must all be .reg (ptxas: \
                     \"Multiple return parameters require .register state space\")",
                    f.name,
                    f.rets.len()
                ),
            );
        }
        let Some(body) = &f.body else { return };
        // Labels and local variables are function-wide.
        self.collect(body);
        self.block(body);
    }

    /// Vectors live in registers only: ptxas cannot allocate a `.v2`/`.v4` `.param`.
    fn vector_param(&mut self, name: &str, loc: Loc) {
        self.diag(
            DiagKind::BadOperand,
            loc,
            format!(
                "`{name}`: vector parameters must be .reg (ptxas: \"cannot be allocated in \
                 .param state space\")"
            ),
        );
    }

    fn check_directives(&mut self) {
        let f = self.f;
        for d in &f.directives {
            let (name, v) = match d {
                PerfDirective::Reqntid(v) => ("reqntid", v),
                PerfDirective::Maxntid(v) => ("maxntid", v),
                _ => continue,
            };
            let total: u64 = v.iter().map(|&x| x as u64).product();
            let limits = [1024u32, 1024, 64];
            if total > 1024 {
                self.diag(
                    DiagKind::ThreadCount,
                    f.loc,
                    format!(
                        ".{name} {} asks for {total} threads per block; the limit is 1024",
                        join(v)
                    ),
                );
            } else if let Some((i, x)) = v
                .iter()
                .enumerate()
                .find(|(i, x)| **x > *limits.get(*i).unwrap_or(&1))
            {
                let dim = ["x", "y", "z"].get(i).copied().unwrap_or("?");
                let lim = limits.get(i).copied().unwrap_or(1);
                self.diag(
                    DiagKind::ThreadCount,
                    f.loc,
                    format!(".{name} {dim} dimension {x} exceeds {lim}"),
                );
            }
            if v.contains(&0) {
                self.diag(
                    DiagKind::ThreadCount,
                    f.loc,
                    format!(".{name} {} has a zero dimension", join(v)),
                );
            }
        }
    }

    /// Records the labels and variables of `body`. A label is scoped to its block (PTX: inline
    /// asm repeated in `{ }` blocks defines one name many times), so duplicates are looked for
    /// within one block; `self.labels` holds every label of the function for the use checks.
    fn collect(&mut self, body: &'a [Statement]) {
        let mut block_labels: HashMap<&'a str, Loc> = HashMap::new();
        for s in body {
            match s {
                Statement::Label(l, loc) => {
                    if let Some(prev) = block_labels.get(l.as_str()).copied() {
                        self.diag(
                            DiagKind::DuplicateLabel,
                            *loc,
                            format!("label `{l}` defined twice (first at line {})", prev.line),
                        );
                    } else {
                        block_labels.insert(l, *loc);
                        self.labels.entry(l).or_insert(*loc);
                    }
                }
                Statement::BranchTargets { label, .. }
                | Statement::CallTargets { label, .. }
                | Statement::CallPrototype { label, .. } => {
                    self.labels.entry(label).or_default();
                }
                Statement::Var(v) => {
                    if v.vec.is_some() && v.space.is_param() {
                        self.vector_param(&v.name, v.loc);
                    }
                    self.locals.insert(&v.name, v.space);
                }
                Statement::Block(b) => self.collect(b),
                _ => {}
            }
        }
    }

    fn lookup(&self, name: &str) -> Option<RegInfo> {
        let found = self.scopes.iter().rev().find_map(|s| s.lookup(name));
        if found.is_some() {
            return found;
        }
        // `%v.x`: one element of a vector register with at least that many elements
        let (base, c) = split_component(name)?;
        let info = self.scopes.iter().rev().find_map(|s| s.lookup(base))?;
        (c < info.vec?).then_some(RegInfo {
            ty: info.ty,
            vec: None,
        })
    }

    fn symbol_space(&self, name: &str) -> Option<Space> {
        self.locals
            .get(name)
            .or_else(|| self.globals.get(name))
            .copied()
    }

    /// The innermost scope (the function scope is always there; recreated if not).
    fn innermost(&mut self) -> &mut Scope {
        if self.scopes.is_empty() {
            self.scopes.push(Scope::default());
        }
        let i = self.scopes.len() - 1;
        &mut self.scopes[i]
    }

    fn declare(&mut self, d: &RegDecl) {
        let info = RegInfo {
            ty: d.ty,
            vec: d.vec,
        };
        for n in &d.names {
            let scope = self.innermost();
            let dup = match n.count {
                None => scope.lookup(&n.name).is_some(),
                Some(c) => {
                    scope.ranges.contains_key(&n.name)
                        || scope.exact.keys().any(|k| {
                            k.strip_prefix(n.name.as_str()).is_some_and(|rest| {
                                !rest.is_empty()
                                    && rest.bytes().all(|b| b.is_ascii_digit())
                                    && rest.parse::<u64>().is_ok_and(|x| x < c as u64)
                            })
                        })
                }
            };
            if dup {
                let shown = match n.count {
                    Some(c) => format!("{}<{c}>", n.name),
                    None => n.name.clone(),
                };
                self.diag(
                    DiagKind::DuplicateRegister,
                    d.loc,
                    format!("register `{shown}` declared twice in the same scope"),
                );
            }
            let scope = self.innermost();
            match n.count {
                None => {
                    scope.exact.insert(n.name.clone(), info);
                }
                Some(c) => {
                    scope.ranges.insert(n.name.clone(), (c, info));
                }
            }
        }
    }

    fn block(&mut self, body: &'a [Statement]) {
        for s in body {
            match s {
                Statement::Reg(d) => self.declare(d),
                Statement::Block(b) => {
                    self.scopes.push(Scope::default());
                    self.block(b);
                    self.scopes.pop();
                }
                Statement::Instr(i) => self.instruction(i),
                Statement::CallTargets { targets, label } => {
                    for t in targets {
                        let known = self.funcs.get(t.as_str());
                        if known.is_none_or(|&k| k > self.item) {
                            self.diag(
                                DiagKind::UnknownSymbol,
                                Loc::default(),
                                format!(
                                    "`.calltargets` {label} names `{t}`, which is not a function \
                                     declared before it"
                                ),
                            );
                        }
                    }
                }
                Statement::BranchTargets { targets, label } => {
                    for t in targets {
                        if !self.labels.contains_key(t.as_str()) {
                            let loc = Loc::default();
                            self.diag(
                                DiagKind::UndefinedLabel,
                                loc,
                                format!("`.branchtargets` {label} names undefined label `{t}`"),
                            );
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// The declared type of a register, reporting it when undeclared.
    fn reg_ty(&mut self, name: &str, loc: Loc) -> Option<RegInfo> {
        match self.lookup(name) {
            Some(r) => Some(r),
            None => {
                self.diag(
                    DiagKind::UndeclaredRegister,
                    loc,
                    format!("register `{name}` is not declared"),
                );
                None
            }
        }
    }

    fn instruction(&mut self, i: &'a Instruction) {
        let loc = i.loc;
        // Every register mentioned must be declared.
        let mut names = Vec::new();
        for a in &i.args {
            a.regs(&mut names);
        }
        let mut seen: HashSet<&str> = HashSet::new();
        for n in names {
            if seen.insert(n) {
                self.reg_ty(n, loc);
            }
        }
        if let Some(g) = &i.guard {
            if let Some(r) = self.reg_ty(&g.reg, loc) {
                if r.ty != Ty::Pred {
                    self.diag(
                        DiagKind::GuardNotPredicate,
                        loc,
                        format!(
                            "guard `@{}{}` is .{}, not .pred",
                            if g.negated { "!" } else { "" },
                            g.reg,
                            r.ty
                        ),
                    );
                }
            }
        }
        self.target(i);
        let info = i.op.info();
        let n = i.args.len();
        // The role list, where the table has one, knows which operands this instruction's
        // modifiers call for; else the counted columns.
        let (lo, hi) = i.operand_range().unwrap_or((
            info.dsts as usize + info.min_srcs as usize,
            info.dsts as usize + info.max_srcs as usize,
        ));
        if n < lo || n > hi || (i.op.has_roles() && i.roles().len() < n) {
            let want = if lo == hi {
                format!("{lo}")
            } else {
                format!("{lo} to {hi}")
            };
            self.diag(
                DiagKind::OperandCount,
                loc,
                format!("`{}` takes {want} operands, found {n}", i.op.name()),
            );
            self.symbols_and_labels(i);
            return;
        }
        // only `fence.proxy.tensormap::generic.acquire` takes operands: `[map], 128`
        if i.op == Opcode::Fence {
            let want = if i.has(Flag::TensormapGeneric) && i.has(Flag::Acquire) {
                2
            } else {
                0
            };
            if n != want {
                self.diag(
                    DiagKind::OperandCount,
                    loc,
                    format!("this `fence` form takes {want} operands, found {n}"),
                );
                return;
            }
        }
        if i.op == Opcode::TensormapReplace && !self.tensormap_replace(i, loc) {
            return;
        }
        if !self.tensor_copy_forms(i, loc) {
            return;
        }
        for d in i.dsts() {
            if matches!(
                d,
                Operand::Imm(_) | Operand::Addr { .. } | Operand::Sym { .. } | Operand::Not(_)
            ) {
                self.diag(
                    DiagKind::BadOperand,
                    loc,
                    format!("destination of `{}` must be a register", i.op.name()),
                );
            }
        }
        self.sink_sources(i);
        self.symbols_and_labels(i);
        self.spaces(i);
        self.types(i);
    }

    /// `tensormap.replace` as ptxas 13.5 checks it: one field; `ord` (an immediate 0..4)
    /// exactly for the per-dimension fields; `.b64` for `global_address`/`global_stride` and
    /// `.b32` otherwise; `elemtype`, `interleave_layout`, `swizzle_mode`, `fill_mode` values are
    /// immediates (`elemtype` 0..12). Returns false (diagnosed) when the form is wrong.
    fn tensormap_replace(&mut self, i: &Instruction, loc: Loc) -> bool {
        use crate::ops::TensormapField as F;
        let Some(field) = i.tensormap_field() else {
            self.diag(
                DiagKind::BadOperand,
                loc,
                "`tensormap.replace` needs a field (`.global_address`, `.box_dim`, ...)".into(),
            );
            return false;
        };
        let want = if field.has_ord() { 3 } else { 2 };
        if i.args.len() != want {
            self.diag(
                DiagKind::OperandCount,
                loc,
                format!(
                    "`tensormap.replace.{field}` takes {want} operands, found {}",
                    i.args.len()
                ),
            );
            return false;
        }
        let imm = |o: Option<&Operand>| match o {
            Some(Operand::Imm(Imm::Int(v))) => Some(*v),
            _ => None,
        };
        let bad = |s: &mut Self, why: String| {
            s.diag(
                DiagKind::BadOperand,
                loc,
                format!("`tensormap.replace.{field}`: {why}"),
            );
        };
        if field.has_ord() && !matches!(imm(i.operand(Role::Ord)), Some(0..=4)) {
            bad(self, "`ord` must be an immediate 0..4".into());
        }
        let wide = matches!(field, F::GlobalAddress | F::GlobalStride);
        if i.ty() != Some(if wide { Ty::B64 } else { Ty::B32 }) {
            let t = if wide { "b64" } else { "b32" };
            bad(self, format!("the value type must be .{t}"));
        }
        let coded = matches!(
            field,
            F::Elemtype | F::InterleaveLayout | F::SwizzleMode | F::FillMode
        );
        let v = imm(i.operand(Role::Value));
        if coded && v.is_none() {
            bad(self, "the value must be an immediate".into());
        }
        if field == F::Elemtype && !matches!(v, Some(0..=12)) {
            bad(self, "the element type code must be 0..12".into());
        }
        true
    }

    /// The TMA forms ptxas 13.5 refuses that the operand counts do not catch: `.im2col` only on
    /// loads (3d-5d, one offset per spatial dimension), `.im2col_no_offs` only on stores and
    /// reductions (3d-5d), and `tensormap.cp_fenceproxy`'s size the immediate 128. Returns
    /// false (diagnosed) when the form is wrong.
    fn tensor_copy_forms(&mut self, i: &Instruction, loc: Loc) -> bool {
        let why = match i.op {
            Opcode::TensormapCpFenceproxy => {
                let ok = matches!(i.operand(Role::Size), Some(Operand::Imm(Imm::Int(128))));
                (!ok).then(|| "the size must be the immediate 128".to_string())
            }
            Opcode::CpAsyncBulkTensor | Opcode::CpReduceAsyncBulkTensor => {
                let load = i.op == Opcode::CpAsyncBulkTensor && i.space() != Some(Space::Global);
                let dims = i.mods.iter().find_map(|m| match m {
                    Mod::Dim(d) => Some(*d as usize),
                    _ => None,
                });
                let offsets = match i.operand(Role::Im2colOffsets) {
                    Some(Operand::Vec(v)) => v.len(),
                    _ => 0,
                };
                let im2col = i.has(Flag::Im2col) || i.has(Flag::Im2colNoOffs);
                if i.has(Flag::Im2col) && !load {
                    Some(
                        "`.im2col` is for loads; stores and reductions take `.im2col_no_offs`"
                            .into(),
                    )
                } else if i.has(Flag::Im2colNoOffs) && load {
                    Some(
                        "`.im2col_no_offs` is for stores and reductions; loads take `.im2col`"
                            .into(),
                    )
                } else if im2col && !matches!(dims, Some(3..=5)) {
                    Some("im2col copies are 3d to 5d".into())
                } else if load && i.has(Flag::Im2col) && offsets + 2 != dims.unwrap_or(0) {
                    Some(format!(
                        "an im2col load takes {} offsets, found {offsets}",
                        dims.unwrap_or(2) - 2
                    ))
                } else {
                    None
                }
            }
            _ => None,
        };
        match why {
            Some(w) => {
                self.diag(DiagKind::BadOperand, loc, format!("`{}`: {w}", i.op.name()));
                false
            }
            None => true,
        }
    }

    /// `_` is a sink for results only: ptxas rejects it among the elements of a source vector
    /// (`st.v4 [a], {%r1, _, %r2, %r3}`: "Sink '_' not allowed as a source operand").
    fn sink_sources(&mut self, i: &Instruction) {
        use Opcode::*;
        if !matches!(i.op, Mov | St | Red | Atom | Cvt) {
            return;
        }
        let sink = i
            .srcs()
            .iter()
            .any(|o| matches!(o, Operand::Vec(v) if v.contains(&Operand::Sink)));
        if sink {
            self.diag(
                DiagKind::BadOperand,
                i.loc,
                format!("`_` cannot be a source element of `{}`", i.op.name()),
            );
        }
    }

    fn target(&mut self, i: &Instruction) {
        let req = requirement(i);
        let t = &self.m.target;
        let sm = t.sm();
        let base = i.op.info();
        let what = if req.min_sm != base.min_sm || req.min_ptx != base.min_ptx {
            format!(
                "`{}`",
                i.op.name().to_string()
                    + &i.mods.iter().map(|m| format!(".{m}")).collect::<String>()
            )
        } else {
            i.op.name().to_string()
        };
        if sm != 0 {
            let need_arch = req.arch_specific && !t.arch_specific();
            if sm < req.min_sm || need_arch {
                let a = if req.arch_specific { "a" } else { "" };
                self.diag(
                    DiagKind::TargetUnsupported,
                    i.loc,
                    format!(
                        "{what} requires sm_{}{a}, module targets {}",
                        req.min_sm, t.arch
                    ),
                );
            } else if matches!(
                i.op,
                Opcode::WgmmaMmaAsync
                    | Opcode::WgmmaMmaAsyncSp
                    | Opcode::WgmmaFence
                    | Opcode::WgmmaCommitGroup
                    | Opcode::WgmmaWaitGroup
            ) && sm != 90
            {
                self.diag(
                    DiagKind::TargetUnsupported,
                    i.loc,
                    format!(
                        "{what} is only available on sm_90a, module targets {}",
                        t.arch
                    ),
                );
            }
        }
        if self.m.version != 0 && self.m.version < req.min_ptx {
            self.diag(
                DiagKind::PtxVersion,
                i.loc,
                format!(
                    "{what} requires PTX ISA {}.{}, module declares .version {}.{}",
                    req.min_ptx / 10,
                    req.min_ptx % 10,
                    self.m.version / 10,
                    self.m.version % 10
                ),
            );
        }
    }

    fn symbols_and_labels(&mut self, i: &'a Instruction) {
        let loc = i.loc;
        match i.op {
            Opcode::Bra => {
                if let Some(Operand::Sym { name, .. }) = i.operand(Role::Target) {
                    if !self.labels.contains_key(name.as_str()) {
                        self.diag(
                            DiagKind::UndefinedLabel,
                            loc,
                            format!("branch to undefined label `{name}`"),
                        );
                    }
                }
                return;
            }
            Opcode::BrxIdx => {
                if let Some(Operand::Sym { name, .. }) = i.operand(Role::Target) {
                    if !self.labels.contains_key(name.as_str()) {
                        self.diag(
                            DiagKind::UndefinedLabel,
                            loc,
                            format!("`brx.idx` names undefined target list `{name}`"),
                        );
                    }
                }
                return;
            }
            Opcode::Call => {
                for a in &i.args {
                    match a {
                        Operand::Sym { name, .. }
                            if !self.funcs.contains_key(name.as_str())
                                && !self.labels.contains_key(name.as_str()) =>
                        {
                            self.diag(
                                DiagKind::UnknownSymbol,
                                loc,
                                format!("call of undeclared function `{name}`"),
                            );
                        }
                        Operand::Sym { name, .. }
                            if self
                                .funcs
                                .get(name.as_str())
                                .is_some_and(|&k| k > self.item) =>
                        {
                            self.diag(
                                DiagKind::UnknownSymbol,
                                loc,
                                format!(
                                    "call of `{name}` before its declaration: declare it (a \
                                     `.func` prototype) before the caller, as ptxas requires"
                                ),
                            );
                        }
                        Operand::List(v) => {
                            for x in v {
                                if let Operand::Sym { name, .. } = x {
                                    if self.symbol_space(name).is_none() {
                                        self.diag(
                                            DiagKind::UnknownSymbol,
                                            loc,
                                            format!("call argument `{name}` is not declared"),
                                        );
                                    }
                                }
                            }
                        }
                        _ => {}
                    }
                }
                return;
            }
            _ => {}
        }
        let mut syms = Vec::new();
        for a in &i.args {
            collect_syms(a, &mut syms);
        }
        for s in syms {
            if self.symbol_space(s).is_none() && !self.funcs.contains_key(s) {
                self.diag(
                    DiagKind::UnknownSymbol,
                    loc,
                    format!("`{s}` is not a declared variable, parameter or function"),
                );
            }
        }
    }

    fn spaces(&mut self, i: &Instruction) {
        let loc = i.loc;
        let is_mem = matches!(
            i.op,
            Opcode::Ld | Opcode::Ldu | Opcode::St | Opcode::Atom | Opcode::Red
        );
        if !is_mem {
            return;
        }
        let space = i.space();
        let is_store = matches!(i.op, Opcode::St | Opcode::Atom | Opcode::Red);
        let kind = self.f.kind;
        if let Some(sp) = space {
            if is_store && sp == Space::Const {
                self.diag(
                    DiagKind::StateSpace,
                    loc,
                    format!(
                        "`{}` cannot write to the read-only .const space",
                        i.op.name()
                    ),
                );
            }
            if (i.op == Opcode::Atom || i.op == Opcode::Red)
                && (sp.is_param() || sp == Space::Local || sp == Space::Const)
            {
                self.diag(
                    DiagKind::StateSpace,
                    loc,
                    format!("`{}` does not operate on .{sp}", i.op.name()),
                );
            }
            if sp == Space::ParamEntry && kind != FuncKind::Entry {
                self.diag(
                    DiagKind::StateSpace,
                    loc,
                    "`.param::entry` is only accessible inside an .entry".to_string(),
                );
            }
            if sp == Space::ParamFunc && kind == FuncKind::Entry && i.op == Opcode::Ld {
                self.diag(
                    DiagKind::StateSpace,
                    loc,
                    "`ld.param::func` is not valid in an .entry".to_string(),
                );
            }
        }
        let addr = i.args.iter().find_map(|a| match a {
            Operand::Addr {
                base: AddrBase::Sym(s),
                ..
            } => Some(s.as_str()),
            _ => None,
        });
        let Some(sym) = addr else { return };
        let Some(decl) = self.symbol_space(sym) else {
            return;
        };
        let Some(sp) = space else { return };
        let same = |a: Space, b: Space| {
            a == b || (a.is_shared() && b.is_shared()) || (a.is_param() && b.is_param())
        };
        if sp.is_param() && !decl.is_param() {
            self.diag(
                DiagKind::StateSpace,
                loc,
                format!(
                    "`{}.{sp}` of `{sym}`, which is a .{decl} variable, not a parameter",
                    i.op.name()
                ),
            );
        } else if !same(sp, decl) {
            self.diag(
                DiagKind::StateSpace,
                loc,
                format!(
                    "`{}.{sp}` of `{sym}`, which is declared in .{decl}",
                    i.op.name()
                ),
            );
        } else if sp.is_param()
            && is_store
            && kind == FuncKind::Entry
            && self.f.params.iter().any(|p| p.name == sym)
        {
            self.diag(
                DiagKind::StateSpace,
                loc,
                format!("kernel parameter `{sym}` is read-only"),
            );
        }
    }

    /// Checks one operand against an expected type.
    fn check(&mut self, i: &Instruction, o: &Operand, want: Want, what: &str) {
        let (Want::T(want_ty) | Want::Wide(want_ty)) = want;
        let (name, have) = match o {
            Operand::Reg(r) => match self.lookup(r) {
                Some(info) => {
                    if info.vec.is_some() {
                        return;
                    }
                    (r.clone(), info.ty)
                }
                None => return,
            },
            Operand::SReg(s) => (s.name(), s.ty()),
            Operand::Not(x) => return self.check(i, x, Want::T(Ty::Pred), what),
            Operand::Imm(imm) => {
                if want_ty == Ty::Pred {
                    return;
                }
                if let Some(why) = imm_kind_mismatch(imm, want_ty) {
                    self.diag(
                        DiagKind::TypeMismatch,
                        i.loc,
                        format!("{what} of `{}`: {why}", i.op.name()),
                    );
                    return;
                }
                if let (Imm::F64(_), 4) | (Imm::F32(_), 8) = (imm, want_ty.size()) {
                    if want_ty.is_float() {
                        self.diag(
                            DiagKind::TypeMismatch,
                            i.loc,
                            format!(
                                "{what} of `{}`: float literal width does not match .{want_ty}",
                                i.op.name()
                            ),
                        );
                    }
                }
                return;
            }
            _ => return,
        };
        let ok = match want {
            Want::Wide(t) => compatible_wide(have, t),
            Want::T(t) => compatible(have, t),
        };
        if !ok {
            self.diag(
                DiagKind::TypeMismatch,
                i.loc,
                format!(
                    "{what} `{name}` of `{}` is .{have}, expected .{want_ty}",
                    i.op.name()
                ),
            );
        }
    }

    /// Checks a value operand that is a `{...}` vector of `n` elements (or a scalar when `n` is 1).
    fn check_value(&mut self, i: &Instruction, o: &Operand, n: usize, want: Want, what: &str) {
        match o {
            Operand::Vec(v) => {
                if v.len() != n && !(n == 1 && v.len() == 1) {
                    self.diag(
                        DiagKind::VectorWidth,
                        i.loc,
                        format!(
                            "`{}` with {} expects {n} elements in its vector operand, found {}",
                            i.op.name(),
                            vec_name(n),
                            v.len()
                        ),
                    );
                }
                for x in v {
                    self.check(i, x, want, what);
                }
            }
            _ => {
                if n > 1 {
                    if let Operand::Reg(r) = o {
                        if self.lookup(r).is_some_and(|info| info.vec == Some(n as u8)) {
                            return;
                        }
                    }
                    self.diag(
                        DiagKind::VectorWidth,
                        i.loc,
                        format!(
                            "`{}` with {} expects a {{...}} vector of {n} elements",
                            i.op.name(),
                            vec_name(n)
                        ),
                    );
                } else {
                    self.check(i, o, want, what);
                }
            }
        }
    }

    /// Rounding to an integral value (`.rni/.rzi/.rmi/.rpi`), `.rna` and `.rs` are `cvt`
    /// forms; arithmetic takes only `.rn/.rz/.rm/.rp`.
    fn rounding_form(&mut self, i: &Instruction) {
        use crate::ops::Rounding;
        let Some(r) = i.rounding() else { return };
        if i.op != Opcode::Cvt && (r.is_integer() || matches!(r, Rounding::Rna | Rounding::Rs)) {
            self.diag(
                DiagKind::BadOperand,
                i.loc,
                format!(
                    "`.{r}` rounding is a `cvt` form, not allowed on `{}`",
                    i.op.name()
                ),
            );
        }
    }

    /// Carry-flag arithmetic (`add.cc`, `addc`, `sub.cc`, `subc`, `mad.cc`, `madc`): only on
    /// .u32/.s32/.u64/.s64; `mad`/`madc` need `.lo` or `.hi`; no `.sat`.
    fn carry_form(&mut self, i: &Instruction, t: Ty) {
        use Opcode::*;
        if !(i.has(Flag::Cc) || matches!(i.op, Addc | Subc | Madc)) {
            return;
        }
        let name = i.op.name();
        let why = if !matches!(i.op, Add | Sub | Mad | Addc | Subc | Madc) {
            Some((
                DiagKind::BadOperand,
                format!("`.cc` is not allowed on `{name}`"),
            ))
        } else if !matches!(t, Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64) {
            Some((
                DiagKind::TypeMismatch,
                format!("`{name}` with the carry flag needs .u32, .s32, .u64 or .s64, not .{t}"),
            ))
        } else if matches!(i.op, Mad | Madc) && !(i.has(Flag::Lo) || i.has(Flag::Hi)) {
            Some((
                DiagKind::BadOperand,
                format!("`{name}` with the carry flag needs .lo or .hi"),
            ))
        } else if i.has(Flag::Sat) || i.has(Flag::Wide) {
            Some((
                DiagKind::BadOperand,
                format!("`{name}` with the carry flag takes no .sat or .wide"),
            ))
        } else {
            None
        };
        if let Some((kind, msg)) = why {
            self.diag(kind, i.loc, msg);
        }
    }

    fn require_addr(&mut self, i: &Instruction, o: &Operand) {
        if !matches!(o, Operand::Addr { .. } | Operand::TensorAddr { .. }) {
            self.diag(
                DiagKind::BadOperand,
                i.loc,
                format!("`{}` needs a [address] operand", i.op.name()),
            );
        }
    }

    fn types(&mut self, i: &'a Instruction) {
        use Opcode::*;
        let a = &i.args;
        if texture::is_texture(i.op) {
            return self.texture(i);
        }
        if crate::video::video_op(i.op).is_some() {
            return self.video(i);
        }
        if i.args
            .iter()
            .any(|o| matches!(o, Operand::Sel(..) | Operand::Neg(_)))
        {
            let why = format!(
                "`{}` takes no operand selectors (`.b0`, `.h1`) or negations; only video instructions do",
                i.op.name()
            );
            return self.diag(DiagKind::BadOperand, i.loc, why);
        }
        let tys: Vec<Ty> = i.types().collect();
        if i.op.has_roles() {
            // operand types listed in the table
            self.slot_types(i, tys.first().copied());
        }
        self.rounding_form(i);
        let Some(&t) = tys.first() else { return };
        self.carry_form(i, t);
        if let Some(why) = atomic::form_error(i) {
            self.diag(DiagKind::TypeMismatch, i.loc, why);
        }
        if let Some(why) = multimem::form_error(i) {
            self.diag(DiagKind::TypeMismatch, i.loc, why);
        }
        if let Some(why) = multimem::oob_error(i) {
            self.diag(DiagKind::BadOperand, i.loc, why);
        }
        if let Some(why) = multimem::lop3_error(i) {
            self.diag(DiagKind::BadOperand, i.loc, why);
        }
        if let Some(why) = multimem::unified_error(i) {
            self.diag(DiagKind::BadOperand, i.loc, why);
        }
        let all = |s: &mut Self, w: Want| {
            for (k, o) in a.iter().enumerate() {
                s.check(
                    i,
                    o,
                    w,
                    if k < i.op.info().dsts as usize {
                        "destination"
                    } else {
                        "source"
                    },
                );
            }
        };
        match i.op {
            // (the uniform arithmetic and bit rows check their operands by the table's classes)
            Mul | Mad if i.has(Flag::Wide) => {
                let wants = [
                    (Role::Dst, Want::T(doubled(t)), "destination"),
                    (Role::A, Want::T(t), "source"),
                    (Role::B, Want::T(t), "source"),
                    (Role::C, Want::T(doubled(t)), "addend"),
                ];
                for (r, w, what) in wants {
                    if let Some(o) = i.operand(r) {
                        self.check(i, o, w, what);
                    }
                }
            }
            Mul | Mad => all(self, Want::T(t)),
            Mov => self.mov(i, t),
            Cvt if i.has(Flag::Pack) => self.cvt_pack(i, &tys),
            Cvt => {
                if a.len() > 3 {
                    self.diag(
                        DiagKind::OperandCount,
                        i.loc,
                        "only `cvt.pack` takes a third source".into(),
                    );
                }
                if let Some(d) = i.operand(Role::Dst) {
                    self.check(i, d, Want::Wide(t), "destination");
                }
                let st = tys.get(1).copied().unwrap_or(t);
                for o in [Role::A, Role::B, Role::C]
                    .into_iter()
                    .filter_map(|r| i.operand(r))
                {
                    match o {
                        Operand::Vec(v) => {
                            for x in v {
                                self.check(i, x, Want::Wide(st), "source");
                            }
                        }
                        _ => self.check(i, o, Want::Wide(st), "source"),
                    }
                }
            }
            Mma => self.mma(i, &tys),
            WgmmaMmaAsync | WgmmaMmaAsyncSp => self.wgmma(i, &tys),
            WmmaLoadA | WmmaLoadB | WmmaLoadC | WmmaStoreD | WmmaMma | MmaSp | MmaSpOrdered
            | Movmatrix | Stacksave | Stackrestore | Alloca => self.isa_tc(i),
            _ => {}
        }
    }

    /// Video instructions (`crate::video`): the form's rules, then 32-bit integer registers.
    fn video(&mut self, i: &Instruction) {
        if let Err(why) = crate::video::VideoForm::from_instruction(i) {
            self.diag(DiagKind::BadOperand, i.loc, why);
            return;
        }
        for o in &i.args {
            self.check(
                i,
                crate::video::base_operand(o),
                Want::T(Ty::S32),
                "operand",
            );
        }
    }

    /// `cvt.pack.sat.{u16,s16}.s32 d, a, b` and `cvt.pack.sat.{u8,s8}.s32.b32 d, a, b, c`.
    fn cvt_pack(&mut self, i: &Instruction, tys: &[Ty]) {
        let a = &i.args;
        let wide = matches!(tys, [Ty::U16 | Ty::S16, Ty::S32]);
        let narrow = matches!(
            tys,
            [
                Ty::U8 | Ty::S8 | Ty::U4 | Ty::S4 | Ty::U2 | Ty::S2,
                Ty::S32,
                Ty::B32
            ]
        );
        let why = if !i.has(Flag::Sat) {
            Some("`cvt.pack` needs .sat".to_string())
        } else if !(wide || narrow) {
            Some(
                "`cvt.pack` takes .{u16,s16}.s32 or .{u8,s8}.s32.b32 (also .u4, .s4, .u2, .s2)"
                    .to_string(),
            )
        } else if a.len() != if wide { 3 } else { 4 } {
            Some(format!(
                "this `cvt.pack` form takes {} operands, found {}",
                if wide { 3 } else { 4 },
                a.len()
            ))
        } else {
            None
        };
        if let Some(why) = why {
            self.diag(DiagKind::BadOperand, i.loc, why);
            return;
        }
        if let Some(d) = i.operand(Role::Dst) {
            self.check(i, d, Want::T(Ty::B32), "destination");
        }
        for o in [Role::A, Role::B, Role::C]
            .into_iter()
            .filter_map(|r| i.operand(r))
        {
            self.check(i, o, Want::T(Ty::B32), "source");
        }
    }

    /// Checks every operand the role list places against its type class (`t`: the
    /// instruction's type modifier; classes relative to it are skipped without one).
    fn slot_types(&mut self, i: &Instruction, t: Option<Ty>) {
        let vec_n = i.vec_width().unwrap_or(1) as usize;
        let x_n = i.x_count().unwrap_or(1) as usize;
        for (slot, o) in i.placed_slots().into_iter().zip(&i.args) {
            let what = role_label(slot.role);
            let relative = matches!(
                slot.ty,
                TyClass::T
                    | TyClass::T2
                    | TyClass::TWide
                    | TyClass::TVec
                    | TyClass::TWideVec
                    | TyClass::TPair
            );
            let Some(t) = t.or((!relative).then_some(Ty::B32)) else {
                continue;
            };
            // (the placeholder type is read only by classes not relative to the instruction's)
            let t2 = i.types().nth(1).unwrap_or(t);
            match slot.ty {
                TyClass::Any => {}
                TyClass::T => self.check(i, o, Want::T(t), what),
                TyClass::T2 => self.check(i, o, Want::T(t2), what),
                TyClass::PredPair => self.check_pred_dst(i, o),
                TyClass::TWide => self.check(i, o, Want::Wide(t), what),
                TyClass::TVec => self.check_value(i, o, vec_n, Want::T(t), what),
                TyClass::TWideVec => self.check_value(i, o, vec_n, Want::Wide(t), what),
                TyClass::TPair => self.check_first_of_pair(i, o, t),
                TyClass::B32Pair => self.check_first_of_pair(i, o, Ty::B32),
                TyClass::B32 => self.check(i, o, Want::T(Ty::B32), what),
                TyClass::B64 => self.check(i, o, Want::T(Ty::B64), what),
                TyClass::U32 => self.check(i, o, Want::T(Ty::U32), what),
                TyClass::Pred => self.check(i, o, Want::T(Ty::Pred), what),
                TyClass::B32X => self.check_value(i, o, x_n, Want::T(Ty::B32), what),
                TyClass::Addr => {
                    self.require_addr(i, o);
                    self.check_addr_reg(i, o);
                }
                TyClass::AddrOnly => self.require_addr(i, o),
            }
        }
    }

    fn check_addr_reg(&mut self, i: &Instruction, o: &Operand) {
        if let Operand::Addr {
            base: AddrBase::Reg(r),
            ..
        } = o
        {
            if let Some(info) = self.lookup(r) {
                let ok = matches!(
                    info.ty.kind(),
                    TyKind::Bits | TyKind::Signed | TyKind::Unsigned
                ) && matches!(info.ty.size(), 4 | 8);
                if !ok {
                    self.diag(
                        DiagKind::TypeMismatch,
                        i.loc,
                        format!("address register `{r}` of `{}` is .{}, expected a 32- or 64-bit integer", i.op.name(), info.ty),
                    );
                }
            }
        }
    }

    fn check_pred_dst(&mut self, i: &Instruction, o: &Operand) {
        match o {
            Operand::Pair(p, q) => {
                self.check(i, p, Want::T(Ty::Pred), "destination");
                self.check(i, q, Want::T(Ty::Pred), "destination");
            }
            Operand::Sink => {}
            _ => self.check(i, o, Want::T(Ty::Pred), "destination"),
        }
    }

    fn check_first_of_pair(&mut self, i: &Instruction, o: &Operand, t: Ty) {
        match o {
            Operand::Pair(d, p) => {
                self.check(i, d, Want::T(t), "destination");
                self.check(i, p, Want::T(Ty::Pred), "predicate destination");
            }
            _ => self.check(i, o, Want::T(t), "destination"),
        }
    }

    fn mov(&mut self, i: &Instruction, t: Ty) {
        let (Some(d), Some(s)) = (i.operand(Role::Dst), i.operand(Role::A)) else {
            return; // the operand count is reported by the count check
        };
        // `mov.v4.f32 %w, %v` / `mov.v2.b32 {%a, %b}, %v`: element-wise vector moves
        if let Some(n) = i.vec_width() {
            self.check_value(i, d, n as usize, Want::T(t), "destination");
            self.check_value(i, s, n as usize, Want::T(t), "source");
            return;
        }
        let vec_pack = |s: &mut Self, o: &Operand, what: &str| {
            if let Operand::Vec(v) = o {
                let n = v.len() as u32;
                if !matches!(n, 2 | 4) || t.size() < n {
                    s.diag(
                        DiagKind::VectorWidth,
                        i.loc,
                        format!("`mov.{t}` cannot (un)pack {n} elements"),
                    );
                    return true;
                }
                let et = match t.size() / n {
                    1 => Ty::B8,
                    2 => Ty::B16,
                    4 => Ty::B32,
                    8 => Ty::B64,
                    _ => Ty::B128,
                };
                for x in v {
                    s.check(i, x, Want::T(et), what);
                }
                return true;
            }
            false
        };
        if !vec_pack(self, d, "destination element") {
            self.check(i, d, Want::T(t), "destination");
        }
        if !vec_pack(self, s, "source element") {
            self.check(i, s, Want::T(t), "source");
        }
    }

    fn mma(&mut self, i: &Instruction, tys: &[Ty]) {
        let Some(Mod::Shape { m, n, k: Some(k) }) = i.shape() else {
            return;
        };
        if tys.len() < 2 {
            return;
        }
        // dtype, atype, btype, ctype (or dtype, ctype-less forms).
        let dt = tys[0];
        let at = tys[1];
        if (m, n, k) == (8, 8, 4) && at != Ty::F64 {
            return self.mma_m8n8k4(i, tys);
        }
        let ct = *tys.last().unwrap_or(&dt);
        // (A regs, B regs) and the register type of A/B fragments.
        let ab = match (m, n, k, at) {
            (16, 8, 16, Ty::F16 | Ty::Bf16) => Some((4, 2)),
            (16, 8, 8, Ty::F16 | Ty::Bf16) => Some((2, 1)),
            (16, 8, 32, Ty::E4m3 | Ty::E5m2 | Ty::S8 | Ty::U8) => Some((4, 2)),
            (16, 8, 16, Ty::S8 | Ty::U8 | Ty::E4m3 | Ty::E5m2) => Some((2, 1)),
            (16, 8, 8, Ty::Tf32) => Some((4, 2)),
            (16, 8, 4, Ty::Tf32) => Some((2, 1)),
            _ => None,
        };
        let Some((na, nb)) = ab else { return };
        // C/D: 4 x f32 / s32, or 2 x f16x2 (b32) for f16 accumulators.
        let frag = |t: Ty| -> (usize, Ty) {
            match t {
                Ty::F16 => (2, Ty::B32),
                Ty::S32 => (4, Ty::S32),
                _ => (4, Ty::F32),
            }
        };
        let (nd, dty) = frag(dt);
        let (nc, cty) = frag(ct);
        let parts = [
            ("D", nd, dty, Role::Dst),
            ("A", na, Ty::B32, Role::A),
            ("B", nb, Ty::B32, Role::B),
            ("C", nc, cty, Role::C),
        ];
        self.mma_parts(i, &format!("mma .m{m}n{n}k{k} .{at}"), parts);
    }

    /// Checks the register count and register type of each mma fragment: `(label, count,
    /// register type, role)`; `what` names the form in messages.
    fn mma_parts(&mut self, i: &Instruction, what: &str, parts: [(&str, usize, Ty, Role); 4]) {
        for (label, cnt, ty, role) in parts {
            let Some(o) = i.operand(role) else { continue };
            let elems: Vec<&Operand> = match o {
                Operand::Vec(v) => v.iter().collect(),
                other => vec![other],
            };
            if elems.len() != cnt {
                self.diag(
                    DiagKind::MmaFragment,
                    i.loc,
                    format!(
                        "{what}: fragment {label} needs {cnt} registers, found {}",
                        elems.len()
                    ),
                );
                continue;
            }
            let mut bad = Vec::new();
            for e in elems {
                if let Operand::Reg(r) = e {
                    if let Some(info) = self.lookup(r) {
                        if !compatible(info.ty, ty) {
                            bad.push(format!("`{r}` (.{})", info.ty));
                        }
                    }
                }
            }
            if !bad.is_empty() {
                self.diag(
                    DiagKind::MmaFragment,
                    i.loc,
                    format!(
                        "{what}: fragment {label} needs .{ty} registers, found {}",
                        bad.join(", ")
                    ),
                );
            }
        }
    }
}

impl FnCheck<'_> {
    /// `wgmma.mma_async.sync.aligned.m64nNkK.dtype.atype.btype d, a, b-desc, scale-d, ...`:
    /// the shape for the input type, the accumulator count (N/2 f32 or s32 registers, N/4 b32
    /// for f16), A as a 64-bit descriptor or 4 b32 registers, B a 64-bit descriptor, scale-d a
    /// predicate or an immediate.
    fn wgmma(&mut self, i: &Instruction, tys: &[Ty]) {
        let Some(Mod::Shape { m, n, k: Some(k) }) = i.shape() else {
            return;
        };
        if tys.len() < 2 {
            return;
        }
        let (dt, at) = (tys[0], tys[1]);
        let want_k = match at {
            Ty::F16 | Ty::Bf16 => Some(16),
            Ty::Tf32 => Some(8),
            Ty::E4m3 | Ty::E5m2 | Ty::S8 | Ty::U8 => Some(32),
            _ => None,
        };
        // the sparse form's k counts the dense A columns: twice the dense form's
        let want_k = want_k.map(|k| {
            if i.op == Opcode::WgmmaMmaAsyncSp {
                2 * k
            } else {
                k
            }
        });
        let shape = format!("m{m}n{n}k{k}");
        let n_ok = if matches!(at, Ty::S8 | Ty::U8) {
            n % 8 == 0 && (8..=256).contains(&n) && (n <= 24 || n % 16 == 0)
        } else {
            n % 8 == 0 && (8..=256).contains(&n)
        };
        if m != 64 || want_k.is_some_and(|w| w != k) || !n_ok {
            self.diag(
                DiagKind::MmaFragment,
                i.loc,
                format!(
                    "wgmma .{shape} is not a shape of .{at} inputs (m64nNk{}, N a multiple of 8 up to 256)",
                    want_k.unwrap_or(k)
                ),
            );
            return;
        }
        let (nd, dty) = match dt {
            Ty::F16 => ((n / 4) as usize, Ty::B32),
            Ty::S32 => ((n / 2) as usize, Ty::S32),
            _ => ((n / 2) as usize, Ty::F32),
        };
        let regs = |o: &Operand| -> Vec<Operand> {
            match o {
                Operand::Vec(v) => v.clone(),
                other => vec![other.clone()],
            }
        };
        let bad_ty = |s: &mut Self, label: &str, elems: &[Operand], want: Ty| {
            let bad: Vec<String> = elems
                .iter()
                .filter_map(|e| match e {
                    Operand::Reg(r) => s
                        .lookup(r)
                        .filter(|info| !compatible(info.ty, want))
                        .map(|info| format!("`{r}` (.{})", info.ty)),
                    _ => None,
                })
                .collect();
            if !bad.is_empty() {
                s.diag(
                    DiagKind::MmaFragment,
                    i.loc,
                    format!(
                        "wgmma .{shape}: {label} needs .{want} registers, found {}",
                        bad.join(", ")
                    ),
                );
            }
        };
        if let Some(d) = i.operand(Role::Dst) {
            let e = regs(d);
            if e.len() != nd {
                self.diag(
                    DiagKind::MmaFragment,
                    i.loc,
                    format!(
                        "wgmma .{shape} .{dt}: accumulator D needs {nd} registers, found {}",
                        e.len()
                    ),
                );
            } else {
                bad_ty(self, "accumulator D", &e, dty);
            }
        }
        // A: a descriptor (64-bit register) or a register fragment of 4 x b32
        if let Some(a) = i.operand(Role::A) {
            match a {
                Operand::Vec(v) if v.len() != 4 => self.diag(
                    DiagKind::MmaFragment,
                    i.loc,
                    format!(
                        "wgmma .{shape}: A from registers needs 4 registers, found {}",
                        v.len()
                    ),
                ),
                Operand::Vec(v) => bad_ty(self, "A", v, Ty::B32),
                other => bad_ty(
                    self,
                    "the A descriptor",
                    std::slice::from_ref(other),
                    Ty::B64,
                ),
            }
        }
        if let Some(b) = i.operand(Role::BDesc) {
            if matches!(b, Operand::Vec(_)) {
                self.diag(
                    DiagKind::MmaFragment,
                    i.loc,
                    format!("wgmma .{shape}: B must be a shared-memory matrix descriptor (.b64)"),
                );
            } else {
                bad_ty(self, "the B descriptor", std::slice::from_ref(b), Ty::B64);
            }
        }
        if let Some(Operand::Reg(r)) = i.operand(Role::ScaleD) {
            if let Some(info) = self.lookup(r) {
                if info.ty != Ty::Pred {
                    self.diag(
                        DiagKind::MmaFragment,
                        i.loc,
                        format!("wgmma .{shape}: scale-d must be a predicate or an immediate, `{r}` is .{}", info.ty),
                    );
                }
            }
        }
    }
}

/// How a diagnostic names an operand of a role.
fn role_label(r: Role) -> &'static str {
    match r {
        Role::Dst => "destination",
        Role::Src => "value",
        Role::A | Role::B | Role::C => "source",
        Role::Lane => "lane operand",
        Role::Clamp => "clamp operand",
        Role::Membermask => "member mask",
        Role::CtaRank => "CTA rank",
        Role::Selector => "selector",
        Role::Shift => "shift amount",
        Role::Pos => "bit position",
        Role::Len => "field length",
        Role::CacheHint => "cache policy",
        r => r.name(),
    }
}

fn vec_name(n: usize) -> String {
    format!(".v{n}")
}

fn join(v: &[u32]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Symbol names referenced as values or address bases (not labels or call targets).
fn collect_syms<'a>(o: &'a Operand, out: &mut Vec<&'a str>) {
    match o {
        Operand::Sym { name, .. } => out.push(name),
        Operand::Addr {
            base: AddrBase::Sym(s),
            ..
        } => out.push(s),
        Operand::TensorAddr { base, coords } => {
            if let AddrBase::Sym(s) = base {
                out.push(s);
            }
            coords.iter().for_each(|c| collect_syms(c, out));
        }
        Operand::SampledAddr {
            base,
            sampler,
            coords,
        } => {
            for b in [base, sampler] {
                if let AddrBase::Sym(s) = b {
                    out.push(s);
                }
            }
            coords.iter().for_each(|c| collect_syms(c, out));
        }
        Operand::Vec(v) | Operand::List(v) => v.iter().for_each(|x| collect_syms(x, out)),
        Operand::Pair(a, b) => {
            collect_syms(a, out);
            collect_syms(b, out);
        }
        Operand::Not(x) => collect_syms(x, out),
        _ => {}
    }
}
