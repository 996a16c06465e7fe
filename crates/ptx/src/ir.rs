//! The PTX module model. A [`Module`] is what the parser produces, the printer consumes, the
//! builder emits and the emulator decodes. Everything is a typed value; source positions ([`Loc`])
//! ride along for diagnostics but never take part in equality, so `parse(print(m)) == m`.

use crate::isa::Opcode;
use crate::mods::{Flag, Mod};
use crate::types::{Space, Ty};

/// A source position (1-based line and column of the PTX text). Equality ignores it on purpose.
///
/// Instructions a `builder` method emitted also remember the Rust call that emitted them
/// (`rust`, from `#[track_caller]`); for builder-made modules `line` is the line of the
/// instruction in `print(&module)` (see [`crate::printer::number_lines`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Loc {
    pub line: u32,
    pub col: u32,
    /// The Rust source location that emitted this instruction (builder-made modules).
    pub rust: Option<&'static std::panic::Location<'static>>,
}

impl Loc {
    /// A PTX text position without a Rust location.
    pub fn at(line: u32, col: u32) -> Loc {
        Loc {
            line,
            col,
            rust: None,
        }
    }
    /// `file:line` of the Rust call that emitted the instruction, if known.
    pub fn rust_location(&self) -> Option<String> {
        self.rust.map(|l| format!("{}:{}", l.file(), l.line()))
    }
}

impl PartialEq for Loc {
    fn eq(&self, _: &Loc) -> bool {
        true
    }
}
impl Eq for Loc {}

/// `.target sm_90a[, debug]`
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Architecture name as written, e.g. `sm_90a`.
    pub arch: String,
    /// Further target options (`texmode_independent`, `debug`, `map_f64_to_f32`).
    pub options: Vec<String>,
}

impl Target {
    pub fn new(arch: &str) -> Target {
        Target {
            arch: arch.to_string(),
            options: Vec::new(),
        }
    }
    /// The numeric SM version (`sm_90a` -> 90, `sm_100f` -> 100); 0 when unrecognised.
    pub fn sm(&self) -> u32 {
        let digits: String = self
            .arch
            .trim_start_matches("sm_")
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        digits.parse().unwrap_or(0)
    }
    /// Architecture-specific targets (`sm_90a`) unlock wgmma / setmaxnreg.
    pub fn arch_specific(&self) -> bool {
        self.arch.ends_with('a') || self.arch.ends_with('f')
    }
}

/// A module: header directives and module-scope items in source order.
#[derive(Clone, Debug, PartialEq)]
pub struct Module {
    /// `.version major.minor`, stored as major*10 + minor.
    pub version: u32,
    pub target: Target,
    pub address_size: u32,
    pub items: Vec<Item>,
}

impl Module {
    pub fn new(version: u32, target: Target) -> Module {
        Module {
            version,
            target,
            address_size: 64,
            items: Vec::new(),
        }
    }
    /// All functions and entries.
    pub fn functions(&self) -> impl Iterator<Item = &Function> {
        self.items.iter().filter_map(|i| match i {
            Item::Func(f) => Some(f),
            _ => None,
        })
    }
    /// Kernel entry points.
    pub fn entries(&self) -> impl Iterator<Item = &Function> {
        self.functions().filter(|f| f.kind == FuncKind::Entry)
    }
    /// The function named `name`: its definition (the one with a body) when the module has
    /// one, so a forward declaration earlier in the module never shadows it; else the
    /// declaration.
    pub fn function(&self, name: &str) -> Option<&Function> {
        let mut decl = None;
        for f in self.functions().filter(|f| f.name == name) {
            if f.body.is_some() {
                return Some(f);
            }
            decl = decl.or(Some(f));
        }
        // `.alias name, target;` makes the declaration `name` run the definition of `target`
        let target = self.items.iter().find_map(|i| match i {
            Item::Alias { name: n, target } if n == name => Some(target.as_str()),
            _ => None,
        });
        match target {
            Some(t) if t != name => self
                .functions()
                .find(|f| f.name == t && f.body.is_some())
                .or(decl),
            _ => decl,
        }
    }
    pub fn globals(&self) -> impl Iterator<Item = &VarDecl> {
        self.items.iter().filter_map(|i| match i {
            Item::Var(v) => Some(v),
            _ => None,
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Var(VarDecl),
    Func(Function),
    /// `.alias name, target;`: calls of the declared function `name` run `target`.
    Alias {
        name: String,
        target: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Linkage {
    Visible,
    Extern,
    Weak,
    Common,
}

impl Linkage {
    pub fn as_str(self) -> &'static str {
        match self {
            Linkage::Visible => "visible",
            Linkage::Extern => "extern",
            Linkage::Weak => "weak",
            Linkage::Common => "common",
        }
    }
}

/// A variable in a state space: module-scope `.global`/`.const`/`.shared`, or function-scope
/// `.local`/`.shared`/`.param`.
#[derive(Clone, Debug, PartialEq)]
pub struct VarDecl {
    pub linkage: Option<Linkage>,
    pub space: Space,
    pub align: Option<u32>,
    /// `.v2`/`.v4` element vectors.
    pub vec: Option<u8>,
    pub ty: Ty,
    pub name: String,
    /// Array dimensions; `Some(None)` entries are unsized (`[]`, e.g. extern dynamic shared).
    pub dims: Vec<Option<u64>>,
    pub init: Option<Vec<Init>>,
    pub loc: Loc,
}

impl VarDecl {
    /// Total size in bytes (0 for unsized arrays).
    pub fn size_bytes(&self) -> u64 {
        // saturating: dimensions from the source may overflow; callers compare with limits
        self.dims.iter().map(|d| d.unwrap_or(0)).fold(
            self.ty.size() as u64 * self.vec.unwrap_or(1) as u64,
            u64::saturating_mul,
        )
    }
}

/// One initialiser value.
#[derive(Clone, Debug, PartialEq)]
pub enum Init {
    Int(i128),
    /// An f32 or f64 given as bits with its width (`0f...` / `0d...`).
    F32(u32),
    F64(u64),
    /// Address of a symbol, optionally `generic(sym)`, plus an offset.
    Sym {
        name: String,
        generic: bool,
        offset: i64,
    },
    /// `field = value` of a `.texref`/`.samplerref` initialiser (`{ filter_mode = linear }`;
    /// [`crate::texture::ref_fields`] reads them).
    Field {
        name: String,
        value: Box<Init>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuncKind {
    Entry,
    Func,
}

/// `.ptr .global .align 16` attributes of a kernel pointer parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtrAttr {
    pub space: Option<Space>,
    pub align: Option<u32>,
}

/// A kernel or function parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    /// `.param` for kernels and most functions, `.reg` for register parameters of `.func`.
    pub space: Space,
    pub ty: Ty,
    pub align: Option<u32>,
    pub ptr: Option<PtrAttr>,
    /// `.v2`/`.v4` vector parameters and return values (`.reg .v4 .b32 a`).
    pub vec: Option<u8>,
    pub name: String,
    /// Byte-array parameters (`.param .align 8 .b8 p[16]`).
    pub array: Option<u64>,
}

impl Param {
    /// A scalar parameter of type `ty` in `space` (`.param` or `.reg`).
    pub fn new(space: Space, ty: Ty, name: impl Into<String>) -> Param {
        Param {
            space,
            ty,
            align: None,
            ptr: None,
            vec: None,
            name: name.into(),
            array: None,
        }
    }
    /// Elements of a vector parameter (1 for a scalar).
    pub fn lanes(&self) -> u64 {
        self.vec.map_or(1, u64::from)
    }
    pub fn size_bytes(&self) -> u64 {
        (self.ty.size() as u64)
            .saturating_mul(self.lanes())
            .saturating_mul(self.array.unwrap_or(1))
    }
    pub fn alignment(&self) -> u64 {
        self.align
            .map(u64::from)
            .unwrap_or(self.ty.size() as u64 * self.lanes())
    }
}

/// Performance-tuning directives on an entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PerfDirective {
    Maxntid(Vec<u32>),
    Reqntid(Vec<u32>),
    Minnctapersm(u32),
    Maxnctapersm(u32),
    Maxnreg(u32),
    ExplicitCluster,
    Reqnctapercluster(Vec<u32>),
    Maxclusterrank(u32),
    Noreturn,
    Pragma(Vec<String>),
}

/// An `.entry` or `.func`.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub kind: FuncKind,
    pub linkage: Option<Linkage>,
    pub name: String,
    /// Return parameters of a `.func`.
    pub rets: Vec<Param>,
    pub params: Vec<Param>,
    pub directives: Vec<PerfDirective>,
    /// `None` for a declaration without a body.
    pub body: Option<Vec<Statement>>,
    pub loc: Loc,
}

impl Function {
    /// Visits every statement, descending into `{ }` blocks.
    pub fn walk<'a>(&'a self, f: &mut impl FnMut(&'a Statement)) {
        fn go<'a>(s: &'a [Statement], f: &mut impl FnMut(&'a Statement)) {
            for st in s {
                f(st);
                if let Statement::Block(b) = st {
                    go(b, f);
                }
            }
        }
        if let Some(b) = &self.body {
            go(b, f);
        }
    }
    /// All instructions in order, descending into blocks.
    pub fn instructions(&self) -> Vec<&Instruction> {
        let mut v = Vec::new();
        self.walk(&mut |s| {
            if let Statement::Instr(i) = s {
                v.push(i);
            }
        });
        v
    }
}

/// A register declaration: `.reg .b32 %r<39>;`, `.reg .v4 .f32 %v;`, `.reg .pred p, q;`.
#[derive(Clone, Debug, PartialEq)]
pub struct RegDecl {
    pub ty: Ty,
    pub vec: Option<u8>,
    pub align: Option<u32>,
    pub names: Vec<RegName>,
    pub loc: Loc,
}

/// One declared name; with `count` it declares `name0 .. name{count-1}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegName {
    pub name: String,
    pub count: Option<u32>,
}

/// A statement inside a function body.
#[derive(Clone, Debug, PartialEq)]
pub enum Statement {
    Reg(RegDecl),
    Var(VarDecl),
    Label(String, Loc),
    Instr(Instruction),
    Block(Vec<Statement>),
    Pragma(Vec<String>),
    /// `name: .branchtargets L1, L2;` used by `brx.idx`.
    BranchTargets {
        label: String,
        targets: Vec<String>,
    },
    /// `name: .calltargets f1, f2;`: the functions an indirect call through `name` may reach.
    CallTargets {
        label: String,
        targets: Vec<String>,
    },
    /// `name: .callprototype ...;` used by indirect calls; params kept structured.
    CallPrototype {
        label: String,
        rets: Vec<Param>,
        params: Vec<Param>,
        noreturn: bool,
    },
}

/// `@p` / `@!p` guard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guard {
    pub negated: bool,
    pub reg: String,
}

/// An immediate value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Imm {
    /// Integer literal (two's complement bits as written; negative values allowed).
    Int(i64),
    /// Unsigned literal too large for i64.
    U64(u64),
    /// `0fXXXXXXXX` (bits) or a decimal float literal given to an f32 instruction.
    F32(u32),
    /// `0dXXXXXXXXXXXXXXXX` or a decimal float literal.
    F64(u64),
}

impl Imm {
    /// Raw bits as u64 (sign-extended for negative integers).
    pub fn bits(self) -> u64 {
        match self {
            Imm::Int(v) => v as u64,
            Imm::U64(v) => v,
            Imm::F32(b) => b as u64,
            Imm::F64(b) => b,
        }
    }
}

/// Special registers (`%tid.x`, `%laneid`, ...). Dimension index 0..=2 for x/y/z.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SReg {
    Tid(u8),
    Ntid(u8),
    Ctaid(u8),
    Nctaid(u8),
    Laneid,
    Warpid,
    Nwarpid,
    Smid,
    Nsmid,
    Gridid,
    Clock,
    ClockHi,
    Clock64,
    Globaltimer,
    GlobaltimerLo,
    GlobaltimerHi,
    LanemaskEq,
    LanemaskLe,
    LanemaskLt,
    LanemaskGe,
    LanemaskGt,
    ClusterId(u8),
    ClusterNctaid(u8),
    ClusterCtaid(u8),
    Nclusterid(u8),
    ClusterCtarank,
    ClusterNctarank,
    IsExplicitCluster,
    DynamicSmemSize,
    TotalSmemSize,
    AggrSmemSize,
    Envreg(u8),
    /// `WARP_SZ`, the predefined constant warp size (32).
    WarpSz,
    /// `%pm0`..`%pm7`: performance-monitoring counters.
    Pm(u8),
    /// `%pm0_64`..`%pm7_64`: their 64-bit forms.
    Pm64(u8),
    /// `%reserved_smem_offset_begin` / `_end` / `_cap`: the CTA's reserved shared memory.
    ReservedSmemBegin,
    ReservedSmemEnd,
    ReservedSmemCap,
    /// `%reserved_smem_offset_0` / `_1`.
    ReservedSmemOffset(u8),
    /// `%current_graph_exec`: the executing CUDA graph (0 outside graphs).
    CurrentGraphExec,
}

impl SReg {
    /// Parses a special register name (with its `.x` component when it has one).
    pub fn parse(s: &str) -> Option<SReg> {
        let dim = |c: &str| match c {
            "x" => Some(0),
            "y" => Some(1),
            "z" => Some(2),
            _ => None,
        };
        if let Some((base, c)) = s.split_once('.') {
            let d = dim(c)?;
            return Some(match base {
                "%tid" => SReg::Tid(d),
                "%ntid" => SReg::Ntid(d),
                "%ctaid" => SReg::Ctaid(d),
                "%nctaid" => SReg::Nctaid(d),
                "%clusterid" => SReg::ClusterId(d),
                "%cluster_nctaid" => SReg::ClusterNctaid(d),
                "%cluster_ctaid" => SReg::ClusterCtaid(d),
                "%nclusterid" => SReg::Nclusterid(d),
                _ => return None,
            });
        }
        Some(match s {
            "%laneid" => SReg::Laneid,
            "%warpid" => SReg::Warpid,
            "%nwarpid" => SReg::Nwarpid,
            "%smid" => SReg::Smid,
            "%nsmid" => SReg::Nsmid,
            "%gridid" => SReg::Gridid,
            "%clock" => SReg::Clock,
            "%clock_hi" => SReg::ClockHi,
            "%clock64" => SReg::Clock64,
            "%globaltimer" => SReg::Globaltimer,
            "%globaltimer_lo" => SReg::GlobaltimerLo,
            "%globaltimer_hi" => SReg::GlobaltimerHi,
            "%lanemask_eq" => SReg::LanemaskEq,
            "%lanemask_le" => SReg::LanemaskLe,
            "%lanemask_lt" => SReg::LanemaskLt,
            "%lanemask_ge" => SReg::LanemaskGe,
            "%lanemask_gt" => SReg::LanemaskGt,
            "%cluster_ctarank" => SReg::ClusterCtarank,
            "%cluster_nctarank" => SReg::ClusterNctarank,
            "%is_explicit_cluster" => SReg::IsExplicitCluster,
            "%dynamic_smem_size" => SReg::DynamicSmemSize,
            "%total_smem_size" => SReg::TotalSmemSize,
            "%aggr_smem_size" => SReg::AggrSmemSize,
            "WARP_SZ" => SReg::WarpSz,
            "%reserved_smem_offset_begin" => SReg::ReservedSmemBegin,
            "%reserved_smem_offset_end" => SReg::ReservedSmemEnd,
            "%reserved_smem_offset_cap" => SReg::ReservedSmemCap,
            "%reserved_smem_offset_0" => SReg::ReservedSmemOffset(0),
            "%reserved_smem_offset_1" => SReg::ReservedSmemOffset(1),
            "%current_graph_exec" => SReg::CurrentGraphExec,
            _ => return SReg::numbered(s),
        })
    }
    /// `%envreg<32>`, `%pm<8>`, `%pm<8>_64`.
    fn numbered(s: &str) -> Option<SReg> {
        // a single decimal digit below `limit`
        let index = |x: &str, limit: u8| match x.as_bytes() {
            [d @ b'0'..=b'9'] if d - b'0' < limit => Some(d - b'0'),
            _ => None,
        };
        if let Some(n) = s.strip_prefix("%envreg") {
            let n = n.parse::<u8>().ok()?;
            return (n < 32).then_some(SReg::Envreg(n));
        }
        let n = s.strip_prefix("%pm")?;
        match n.strip_suffix("_64") {
            Some(n) => index(n, 8).map(SReg::Pm64),
            None => index(n, 8).map(SReg::Pm),
        }
    }
    /// Is this a name that needs a `.x/.y/.z` component?
    pub fn needs_dim(base: &str) -> bool {
        matches!(
            base,
            "%tid"
                | "%ntid"
                | "%ctaid"
                | "%nctaid"
                | "%clusterid"
                | "%cluster_nctaid"
                | "%cluster_ctaid"
                | "%nclusterid"
        )
    }
    /// Natural type of the register (u64 for clocks/timers, u32 otherwise).
    pub fn ty(self) -> Ty {
        match self {
            SReg::Clock64
            | SReg::Globaltimer
            | SReg::Gridid
            | SReg::Pm64(_)
            | SReg::CurrentGraphExec => Ty::U64,
            SReg::IsExplicitCluster => Ty::Pred,
            _ => Ty::U32,
        }
    }
    pub fn name(self) -> String {
        const D: [&str; 3] = ["x", "y", "z"];
        match self {
            SReg::Tid(d) => format!("%tid.{}", D[d as usize]),
            SReg::Ntid(d) => format!("%ntid.{}", D[d as usize]),
            SReg::Ctaid(d) => format!("%ctaid.{}", D[d as usize]),
            SReg::Nctaid(d) => format!("%nctaid.{}", D[d as usize]),
            SReg::ClusterId(d) => format!("%clusterid.{}", D[d as usize]),
            SReg::ClusterNctaid(d) => format!("%cluster_nctaid.{}", D[d as usize]),
            SReg::ClusterCtaid(d) => format!("%cluster_ctaid.{}", D[d as usize]),
            SReg::Nclusterid(d) => format!("%nclusterid.{}", D[d as usize]),
            SReg::Laneid => "%laneid".into(),
            SReg::Warpid => "%warpid".into(),
            SReg::Nwarpid => "%nwarpid".into(),
            SReg::Smid => "%smid".into(),
            SReg::Nsmid => "%nsmid".into(),
            SReg::Gridid => "%gridid".into(),
            SReg::Clock => "%clock".into(),
            SReg::ClockHi => "%clock_hi".into(),
            SReg::Clock64 => "%clock64".into(),
            SReg::Globaltimer => "%globaltimer".into(),
            SReg::GlobaltimerLo => "%globaltimer_lo".into(),
            SReg::GlobaltimerHi => "%globaltimer_hi".into(),
            SReg::LanemaskEq => "%lanemask_eq".into(),
            SReg::LanemaskLe => "%lanemask_le".into(),
            SReg::LanemaskLt => "%lanemask_lt".into(),
            SReg::LanemaskGe => "%lanemask_ge".into(),
            SReg::LanemaskGt => "%lanemask_gt".into(),
            SReg::ClusterCtarank => "%cluster_ctarank".into(),
            SReg::ClusterNctarank => "%cluster_nctarank".into(),
            SReg::IsExplicitCluster => "%is_explicit_cluster".into(),
            SReg::DynamicSmemSize => "%dynamic_smem_size".into(),
            SReg::TotalSmemSize => "%total_smem_size".into(),
            SReg::AggrSmemSize => "%aggr_smem_size".into(),
            SReg::Envreg(n) => format!("%envreg{n}"),
            SReg::WarpSz => "WARP_SZ".into(),
            SReg::Pm(n) => format!("%pm{n}"),
            SReg::Pm64(n) => format!("%pm{n}_64"),
            SReg::ReservedSmemBegin => "%reserved_smem_offset_begin".into(),
            SReg::ReservedSmemEnd => "%reserved_smem_offset_end".into(),
            SReg::ReservedSmemCap => "%reserved_smem_offset_cap".into(),
            SReg::ReservedSmemOffset(n) => format!("%reserved_smem_offset_{n}"),
            SReg::CurrentGraphExec => "%current_graph_exec".into(),
        }
    }
}

/// A vector-register component `%v.x` split into the register and the component index: `.x`
/// and `.r` are 0, `.y`/`.g` 1, `.z`/`.b` 2, `.w`/`.a` 3 (PTX ISA, "Vector operands"). The
/// parser keeps the component in the operand's register name (`Operand::Reg("%v.x")`), so the
/// text prints back as written.
pub fn split_component(name: &str) -> Option<(&str, u8)> {
    let (base, c) = name.rsplit_once('.')?;
    let i = match c {
        "x" | "r" => 0,
        "y" | "g" => 1,
        "z" | "b" => 2,
        "w" | "a" => 3,
        _ => return None,
    };
    (!base.is_empty()).then_some((base, i))
}

/// Base of a memory address `[base+offset]`.
#[derive(Clone, Debug, PartialEq)]
pub enum AddrBase {
    Reg(String),
    /// A variable, parameter or function name.
    Sym(String),
    /// An absolute address `[0x1000]`.
    Imm(u64),
}

/// An instruction operand.
#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    Reg(String),
    SReg(SReg),
    /// `!%p` (negated predicate source).
    Not(Box<Operand>),
    Imm(Imm),
    /// A label, variable, parameter or function name (optionally `sym+offset`).
    Sym {
        name: String,
        offset: i64,
    },
    Addr {
        base: AddrBase,
        offset: i64,
    },
    /// `[tensorMap, {c0, c1, ...}]` (bulk tensor copies).
    TensorAddr {
        base: AddrBase,
        coords: Vec<Operand>,
    },
    /// `[texture, sampler, {c0, c1, ...}]` (independent-mode texture fetches).
    SampledAddr {
        base: AddrBase,
        sampler: AddrBase,
        coords: Vec<Operand>,
    },
    /// `{a, b, c, d}`; elements may be `_`.
    Vec(Vec<Operand>),
    /// `d|p`: second predicate output of setp / shfl / elect.
    Pair(Box<Operand>, Box<Operand>),
    /// `_`, the sink.
    Sink,
    /// `(a, b)` argument list of `call`.
    List(Vec<Operand>),
    /// `-%r` (negated source of `vmad`).
    Neg(Box<Operand>),
    /// `%r.b0`, `%r.h1`, `%r.h10`, `%r.b3210`: a byte or half-word selector on a video
    /// instruction operand (source selector, destination merge position or mask).
    Sel(Box<Operand>, Sel),
}

/// A video-instruction operand selector: `.b` or `.h` followed by one to four lane digits,
/// written most significant lane first (`.b3210` puts byte 0 in lane 0, `.h10` half 0 in lane 0).
/// A scalar video operand takes one digit (`.b0`..`.b3`, `.h0`, `.h1`); `vadd2`-style sources
/// take two half digits (0-3), `vadd4`-style sources four byte digits (0-7); destination masks
/// list the lanes written (`.h10`, `.b310`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sel {
    /// Half-word (`.h`) rather than byte (`.b`) lanes.
    pub half: bool,
    /// The digits as written, most significant first; only the first `len` are used.
    pub digits: [u8; 4],
    pub len: u8,
}

impl Sel {
    /// Parses a selector suffix without its dot (`b0`, `h10`, `b7654`); `None` for anything else.
    pub fn parse(s: &str) -> Option<Sel> {
        let b = s.as_bytes();
        let half = match b.first() {
            Some(b'h') => true,
            Some(b'b') => false,
            _ => return None,
        };
        let ds = &b[1..];
        if ds.is_empty() || ds.len() > 4 || !ds.iter().all(|c| (b'0'..=b'7').contains(c)) {
            return None;
        }
        let mut digits = [0u8; 4];
        for (k, c) in ds.iter().enumerate() {
            digits[k] = c - b'0';
        }
        Some(Sel {
            half,
            digits,
            len: ds.len() as u8,
        })
    }
    /// The digits as written (most significant first).
    pub fn digits(&self) -> &[u8] {
        &self.digits[..self.len as usize]
    }
}

impl std::fmt::Display for Sel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.half { "h" } else { "b" })?;
        for d in self.digits() {
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl Operand {
    pub fn reg(name: impl Into<String>) -> Operand {
        Operand::Reg(name.into())
    }
    pub fn sym(name: impl Into<String>) -> Operand {
        Operand::Sym {
            name: name.into(),
            offset: 0,
        }
    }
    pub fn int(v: i64) -> Operand {
        Operand::Imm(Imm::Int(v))
    }
    /// Register names this operand reads or writes (through vectors, pairs, negations, addresses).
    pub fn regs<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            Operand::Reg(r) => out.push(r),
            Operand::Not(o) | Operand::Neg(o) | Operand::Sel(o, _) => o.regs(out),
            Operand::Addr {
                base: AddrBase::Reg(r),
                ..
            } => out.push(r),
            Operand::TensorAddr { base, coords } => {
                if let AddrBase::Reg(r) = base {
                    out.push(r);
                }
                coords.iter().for_each(|o| o.regs(out));
            }
            Operand::SampledAddr {
                base,
                sampler,
                coords,
            } => {
                for b in [base, sampler] {
                    if let AddrBase::Reg(r) = b {
                        out.push(r);
                    }
                }
                coords.iter().for_each(|o| o.regs(out));
            }
            Operand::Vec(v) | Operand::List(v) => v.iter().for_each(|o| o.regs(out)),
            Operand::Pair(a, b) => {
                a.regs(out);
                b.regs(out);
            }
            _ => {}
        }
    }
}

/// One instruction: optional guard, opcode, modifiers in source order, operands.
#[derive(Clone, Debug, PartialEq)]
pub struct Instruction {
    pub guard: Option<Guard>,
    pub op: Opcode,
    pub mods: Vec<Mod>,
    pub args: Vec<Operand>,
    pub loc: Loc,
}

impl Instruction {
    pub fn new(op: Opcode, mods: Vec<Mod>, args: Vec<Operand>) -> Instruction {
        Instruction {
            guard: None,
            op,
            mods,
            args,
            loc: Loc::default(),
        }
    }
    pub fn has(&self, f: Flag) -> bool {
        self.mods.contains(&Mod::Flag(f))
    }
    /// Type modifiers in order (`cvt.f32.bf16` -> [f32, bf16]).
    pub fn types(&self) -> impl Iterator<Item = Ty> + '_ {
        self.mods.iter().filter_map(|m| match m {
            Mod::Type(t) => Some(*t),
            _ => None,
        })
    }
    /// The first type modifier.
    pub fn ty(&self) -> Option<Ty> {
        self.types().next()
    }
    /// The last type modifier.
    pub fn last_ty(&self) -> Option<Ty> {
        self.types().last()
    }
    /// The state-space modifiers in order.
    pub fn spaces(&self) -> impl Iterator<Item = Space> + '_ {
        self.mods.iter().filter_map(|m| match m {
            Mod::Space(s) => Some(*s),
            _ => None,
        })
    }
    pub fn space(&self) -> Option<Space> {
        self.spaces().next()
    }
    pub fn vec_width(&self) -> Option<u8> {
        self.mods.iter().find_map(|m| match m {
            Mod::Vec(n) => Some(*n),
            _ => None,
        })
    }
    pub fn shape(&self) -> Option<Mod> {
        self.mods
            .iter()
            .copied()
            .find(|m| matches!(m, Mod::Shape { .. }))
    }
    pub fn x_count(&self) -> Option<u8> {
        self.mods.iter().find_map(|m| match m {
            Mod::X(n) => Some(*n),
            _ => None,
        })
    }
    pub fn dim(&self) -> Option<u8> {
        self.mods.iter().find_map(|m| match m {
            Mod::Dim(n) => Some(*n),
            _ => None,
        })
    }
    /// Destination operands (per the opcode table).
    pub fn dsts(&self) -> &[Operand] {
        let n = (self.op.info().dsts as usize).min(self.args.len());
        &self.args[..n]
    }
    /// Source operands.
    pub fn srcs(&self) -> &[Operand] {
        let n = (self.op.info().dsts as usize).min(self.args.len());
        &self.args[n..]
    }
}
