//! The builder core: targets, register allocation, parameters, shared memory, structured control
//! flow, the raw-PTX escape, and assembling the finished [`ptx::Module`].

use crate::error::BuildError;
use crate::ty::*;
use ptx::{
    AddrBase, FuncKind, Guard, Instruction, Item, Linkage, Loc, Mod, Module, Opcode, Operand,
    Param, PerfDirective, PtrAttr, RegDecl, RegName, Space, Statement, Ty, VarDecl,
};
use std::collections::{BTreeMap, HashSet};

/// Compilation target: architecture plus (optionally) a fixed PTX ISA version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `sm_80`, `sm_89`, `sm_90a`, ...
    pub arch: String,
    /// PTX ISA version as major*10+minor; `None` picks the lowest version that has every
    /// instruction used (and the architecture).
    pub ptx: Option<u32>,
}

impl Target {
    pub fn new(arch: &str) -> Target {
        Target {
            arch: arch.to_string(),
            ptx: None,
        }
    }
    pub fn sm80() -> Target {
        Target::new("sm_80")
    }
    pub fn sm86() -> Target {
        Target::new("sm_86")
    }
    pub fn sm89() -> Target {
        Target::new("sm_89")
    }
    pub fn sm90() -> Target {
        Target::new("sm_90")
    }
    pub fn sm90a() -> Target {
        Target::new("sm_90a")
    }
    /// Fixes the PTX ISA version (major*10+minor, e.g. 83 for 8.3).
    pub fn with_ptx(mut self, version: u32) -> Target {
        self.ptx = Some(version);
        self
    }
    /// Numeric SM version (`sm_90a` -> 90).
    pub fn sm(&self) -> u32 {
        ptx::Target::new(&self.arch).sm()
    }
    /// `sm_90a`-style architecture-specific target.
    pub fn arch_specific(&self) -> bool {
        ptx::Target::new(&self.arch).arch_specific()
    }
    /// The lowest PTX ISA version that knows this architecture.
    pub fn base_ptx(&self) -> u32 {
        let sm = self.sm();
        let v = match sm {
            0..=70 => 60,
            71..=75 => 63,
            76..=80 => 70,
            81..=86 => 71,
            87 => 74,
            88..=89 => 78,
            90 => 78,
            91..=100 => 86,
            101..=120 => 87,
            _ => 88,
        };
        if self.arch_specific() && sm == 90 {
            80
        } else {
            v
        }
    }
}

/// Loop labels of an enclosing structured loop.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LoopLabels {
    pub(crate) cont: Label,
    pub(crate) brk: Label,
}

/// A function slot for a `.func` return value (see [`KernelBuilder::ret_param`]).
#[derive(Clone, Debug)]
pub struct RetSlot<T> {
    name: String,
    _t: std::marker::PhantomData<fn() -> T>,
}

/// Builds one `.entry` kernel or `.func` function.
///
/// Every method that emits PTX appends exactly one instruction (or, for helpers such as
/// [`KernelBuilder::global_index_x`], a short fixed sequence documented on the method) and
/// returns `Copy` register handles, so closures passed to the control-flow helpers can borrow the
/// builder mutably.
pub struct KernelBuilder {
    pub(crate) name: String,
    pub(crate) target: Target,
    pub(crate) kind: FuncKind,
    pub(crate) linkage: Option<Linkage>,
    pub(crate) params: Vec<Param>,
    pub(crate) rets: Vec<Param>,
    pub(crate) directives: Vec<PerfDirective>,
    counts: [u32; 6],
    pub(crate) body: Vec<Statement>,
    stack: Vec<Vec<Statement>>,
    locals: Vec<Statement>,
    pub(crate) module_vars: Vec<VarDecl>,
    labels: u32,
    pub(crate) guard: Option<Guard>,
    loops: Vec<LoopLabels>,
    pub(crate) error: Option<BuildError>,
    raw_regs: HashSet<String>,
    names: HashSet<String>,
    /// Extra (sm, ptx) requirements of forms the opcode table does not refine.
    pub(crate) need: (u32, u32),
    smem_count: u32,
    call_count: u32,
}

impl KernelBuilder {
    /// Starts an `.entry` kernel.
    pub fn new(name: &str, target: Target) -> KernelBuilder {
        KernelBuilder {
            name: name.to_string(),
            target,
            kind: FuncKind::Entry,
            linkage: Some(Linkage::Visible),
            params: Vec::new(),
            rets: Vec::new(),
            directives: Vec::new(),
            counts: [0; 6],
            body: Vec::new(),
            stack: Vec::new(),
            locals: Vec::new(),
            module_vars: Vec::new(),
            labels: 0,
            guard: None,
            loops: Vec::new(),
            error: None,
            raw_regs: HashSet::new(),
            names: HashSet::new(),
            need: (0, 0),
            smem_count: 0,
            call_count: 0,
        }
    }

    /// Starts a device `.func` (callable with [`KernelBuilder::call`] from kernels in the same
    /// [`ModuleBuilder`]).
    pub fn func(name: &str, target: Target) -> KernelBuilder {
        let mut k = KernelBuilder::new(name, target);
        k.kind = FuncKind::Func;
        k.linkage = None;
        k
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn target(&self) -> &Target {
        &self.target
    }

    // -----------------------------------------------------------------------------------------
    // errors and requirements

    /// Records the first user mistake; [`KernelBuilder::finish`] reports it.
    #[track_caller]
    pub(crate) fn fail(&mut self, e: BuildError) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }
    /// Raises the minimum (sm, ptx) beyond what the opcode table says.
    #[track_caller]
    pub(crate) fn require(&mut self, sm: u32, ptx: u32) {
        self.need = (self.need.0.max(sm), self.need.1.max(ptx));
    }

    // -----------------------------------------------------------------------------------------
    // registers

    /// Allocates a fresh register of type `T` (declared automatically).
    #[track_caller]
    pub fn reg<T: PtxType>(&mut self) -> Reg<T> {
        let c = T::CLASS.index();
        let id = self.counts[c];
        self.counts[c] += 1;
        Reg::new(id)
    }
    /// Allocates `N` fresh registers (fragments, vector loads).
    #[track_caller]
    pub fn regs<T: PtxType, const N: usize>(&mut self) -> [Reg<T>; N] {
        std::array::from_fn(|_| self.reg::<T>())
    }
    /// Allocates `n` fresh registers.
    #[track_caller]
    pub fn reg_vec<T: PtxType>(&mut self, n: usize) -> Vec<Reg<T>> {
        (0..n).map(|_| self.reg::<T>()).collect()
    }

    fn is_declared(&self, name: &str) -> bool {
        if let Some((c, n)) = RegClass::parse_name(name) {
            if n < self.counts[c.index()] {
                return true;
            }
        }
        self.raw_regs.contains(name)
    }

    // -----------------------------------------------------------------------------------------
    // emission

    /// Appends one instruction (under the active [`KernelBuilder::when`] guard, if any).
    /// The low-level door to any instruction the typed API does not cover.
    #[track_caller]
    pub fn emit(
        &mut self,
        op: Opcode,
        mods: impl IntoIterator<Item = Mod>,
        args: impl IntoIterator<Item = Operand>,
    ) {
        let mut ins = Instruction::new(op, mods.into_iter().collect(), args.into_iter().collect());
        ins.guard = self.guard.clone();
        ins.loc.rust = Some(std::panic::Location::caller());
        self.body.push(Statement::Instr(ins));
    }
    /// Appends one instruction with an explicit guard (`@p` / `@!p`).
    #[track_caller]
    pub fn emit_guarded(
        &mut self,
        guard: Reg<Pred>,
        negated: bool,
        op: Opcode,
        mods: impl IntoIterator<Item = Mod>,
        args: impl IntoIterator<Item = Operand>,
    ) {
        let mut ins = Instruction::new(op, mods.into_iter().collect(), args.into_iter().collect());
        ins.guard = Some(Guard {
            negated,
            reg: guard.name(),
        });
        ins.loc.rust = Some(std::panic::Location::caller());
        self.body.push(Statement::Instr(ins));
    }
    /// Appends a statement as is (labels, declarations). Registers are not checked.
    #[track_caller]
    pub fn push_statement(&mut self, s: Statement) {
        self.body.push(s);
    }

    /// Runs `f` with every emitted instruction predicated on `p` (`@p op ...;`), without branches.
    #[track_caller]
    pub fn when(&mut self, p: Reg<Pred>, f: impl FnOnce(&mut Self)) {
        self.with_guard(
            Guard {
                negated: false,
                reg: p.name(),
            },
            f,
        )
    }
    /// Like [`KernelBuilder::when`] with `@!p`.
    #[track_caller]
    pub fn when_not(&mut self, p: Reg<Pred>, f: impl FnOnce(&mut Self)) {
        self.with_guard(
            Guard {
                negated: true,
                reg: p.name(),
            },
            f,
        )
    }
    #[track_caller]
    fn with_guard(&mut self, g: Guard, f: impl FnOnce(&mut Self)) {
        if self.guard.is_some() {
            self.fail(BuildError::ControlFlow(
                "nested when(): a PTX instruction takes one guard".into(),
            ));
        }
        let old = self.guard.replace(g);
        f(self);
        self.guard = old;
    }

    // -----------------------------------------------------------------------------------------
    // attributes

    /// `.reqntid x[, y[, z]]`
    #[track_caller]
    pub fn reqntid(&mut self, dims: &[u32]) -> &mut Self {
        self.directives.push(PerfDirective::Reqntid(dims.to_vec()));
        self
    }
    /// `.maxntid x[, y[, z]]`
    #[track_caller]
    pub fn maxntid(&mut self, dims: &[u32]) -> &mut Self {
        self.directives.push(PerfDirective::Maxntid(dims.to_vec()));
        self
    }
    /// `.maxnreg n`
    #[track_caller]
    pub fn maxnreg(&mut self, n: u32) -> &mut Self {
        self.directives.push(PerfDirective::Maxnreg(n));
        self
    }
    /// `.minnctapersm n`
    #[track_caller]
    pub fn minnctapersm(&mut self, n: u32) -> &mut Self {
        self.directives.push(PerfDirective::Minnctapersm(n));
        self
    }
    /// `.reqnctapercluster x[, y[, z]]` (sm_90).
    #[track_caller]
    pub fn cluster_dims(&mut self, dims: &[u32]) -> &mut Self {
        self.require(90, 78);
        self.directives
            .push(PerfDirective::Reqnctapercluster(dims.to_vec()));
        self
    }
    /// `.explicitcluster` (sm_90).
    #[track_caller]
    pub fn explicit_cluster(&mut self) -> &mut Self {
        self.require(90, 78);
        self.directives.push(PerfDirective::ExplicitCluster);
        self
    }
    /// `.maxclusterrank n` (sm_90).
    #[track_caller]
    pub fn max_cluster_rank(&mut self, n: u32) -> &mut Self {
        self.require(90, 78);
        self.directives.push(PerfDirective::Maxclusterrank(n));
        self
    }

    // -----------------------------------------------------------------------------------------
    // parameters

    #[track_caller]
    fn claim_name(&mut self, name: &str) {
        if !self.names.insert(name.to_string()) {
            self.fail(BuildError::Duplicate(name.to_string()));
        }
    }

    /// Declares a parameter and loads it: `k.param::<u32>("n")` gives a `Reg<u32>`,
    /// `k.param::<GlobalPtr<f32>>("a")` a global pointer (`ld.param.u64` + `cvta.to.global`).
    #[track_caller]
    pub fn param<P: KernelParam>(&mut self, name: &str) -> P::Handle {
        self.claim_name(name);
        P::declare(self, name)
    }

    /// A global pointer parameter with an explicit `.align` (e.g. 16 for vectorised access).
    #[track_caller]
    pub fn param_ptr_aligned<T: PtxType>(&mut self, name: &str, align: u32) -> GlobalPtr<T> {
        self.claim_name(name);
        declare_global_ptr(self, name, align)
    }

    /// A `CUtensorMap` kernel parameter (`.param .align 64 .b8 name[128]`); returns its
    /// generic address for `cp.async.bulk.tensor` (`mov.b64 %rd, name;`).
    #[track_caller]
    pub fn param_tensormap(&mut self, name: &str) -> Reg<u64> {
        self.claim_name(name);
        self.params.push(Param {
            space: Space::Param,
            ty: Ty::B8,
            align: Some(64),
            ptr: None,
            vec: None,
            name: name.to_string(),
            array: Some(128),
        });
        let r = self.reg::<u64>();
        self.emit(
            Opcode::Mov,
            [Mod::Type(Ty::B64)],
            [r.op(), Operand::sym(name)],
        );
        r
    }

    /// Declares a `.func` return value `(.param .T name)`; write it with
    /// [`KernelBuilder::set_ret`].
    #[track_caller]
    pub fn ret_param<T: Scalar>(&mut self, name: &str) -> RetSlot<T> {
        self.claim_name(name);
        self.rets.push(Param {
            space: Space::Param,
            ty: T::MEM_TY,
            align: None,
            ptr: None,
            vec: None,
            name: name.into(),
            array: None,
        });
        RetSlot {
            name: name.to_string(),
            _t: std::marker::PhantomData,
        }
    }
    /// `st.param.T [ret], v;`
    #[track_caller]
    pub fn set_ret<T: Scalar>(&mut self, slot: &RetSlot<T>, v: Reg<T>) {
        self.emit(
            Opcode::St,
            [Mod::Space(Space::Param), Mod::Type(T::MEM_TY)],
            [
                Operand::Addr {
                    base: AddrBase::Sym(slot.name.clone()),
                    offset: 0,
                },
                v.op(),
            ],
        );
    }

    /// Calls a `.func` of the same module with the calling-convention block
    /// `{ .param ...; st.param ...; call.uni (rets), f, (args); ld.param ...; }`.
    #[track_caller]
    pub fn call(&mut self, func: &str, rets: &[AnyReg], args: &[AnyReg]) {
        let n = self.call_count;
        self.call_count += 1;
        let mut block = Vec::new();
        let mut arg_names = Vec::new();
        for (i, a) in args.iter().enumerate() {
            let pn = format!("param{n}_{i}");
            block.push(Statement::Var(param_var(&pn, a.mem_ty)));
            let mut st = Instruction::new(
                Opcode::St,
                vec![Mod::Space(Space::Param), Mod::Type(a.mem_ty)],
                vec![
                    Operand::Addr {
                        base: AddrBase::Sym(pn.clone()),
                        offset: 0,
                    },
                    Operand::reg(a.name.clone()),
                ],
            );
            st.guard = self.guard.clone();
            st.loc.rust = Some(std::panic::Location::caller());
            block.push(Statement::Instr(st));
            arg_names.push(Operand::sym(pn));
        }
        let mut ret_names = Vec::new();
        for (i, r) in rets.iter().enumerate() {
            let rn = format!("retval{n}_{i}");
            block.push(Statement::Var(param_var(&rn, r.mem_ty)));
            ret_names.push(Operand::sym(rn));
        }
        let mut cargs = Vec::new();
        if !rets.is_empty() {
            cargs.push(Operand::List(ret_names.clone()));
        }
        cargs.push(Operand::sym(func));
        if !args.is_empty() {
            cargs.push(Operand::List(arg_names));
        }
        let mut call = Instruction::new(Opcode::Call, vec![Mod::Flag(ptx::Flag::Uni)], cargs);
        call.guard = self.guard.clone();
        call.loc.rust = Some(std::panic::Location::caller());
        block.push(Statement::Instr(call));
        for (r, rn) in rets.iter().zip(ret_names) {
            let Operand::Sym { name, .. } = rn else {
                unreachable!()
            };
            let mut ld = Instruction::new(
                Opcode::Ld,
                vec![Mod::Space(Space::Param), Mod::Type(r.mem_ty)],
                vec![
                    Operand::reg(r.name.clone()),
                    Operand::Addr {
                        base: AddrBase::Sym(name),
                        offset: 0,
                    },
                ],
            );
            ld.guard = self.guard.clone();
            ld.loc.rust = Some(std::panic::Location::caller());
            block.push(Statement::Instr(ld));
        }
        self.body.push(Statement::Block(block));
    }

    // -----------------------------------------------------------------------------------------
    // shared memory

    /// A static shared array `.shared .align A .T smemN[len];` and its address
    /// (`mov.u32 %r, smemN;`).
    #[track_caller]
    pub fn shared_array<T: Scalar>(&mut self, len: u64, align: u32) -> SharedPtr<T> {
        let name = format!("smem{}", self.smem_count);
        self.smem_count += 1;
        self.shared_array_named(&name, len, align)
    }
    /// [`KernelBuilder::shared_array`] with a chosen name.
    #[track_caller]
    pub fn shared_array_named<T: Scalar>(
        &mut self,
        name: &str,
        len: u64,
        align: u32,
    ) -> SharedPtr<T> {
        self.claim_name(name);
        self.locals.push(Statement::Var(VarDecl {
            linkage: None,
            space: Space::Shared,
            align: Some(align.max(T::SIZE)),
            vec: None,
            ty: T::MEM_TY,
            name: name.to_string(),
            dims: vec![Some(len)],
            init: None,
            loc: Loc::default(),
        }));
        let r = self.reg::<u32>();
        self.emit(
            Opcode::Mov,
            [Mod::Type(Ty::U32)],
            [r.op(), Operand::sym(name)],
        );
        Ptr::from_reg(r)
    }
    /// A per-thread `.local .align A .T localN[len];` array and its address
    /// (`mov.u64 %rd, localN;`).
    #[track_caller]
    pub fn local_array<T: Scalar>(&mut self, len: u64, align: u32) -> Ptr<T, Local> {
        let name = format!("local{}", self.smem_count);
        self.smem_count += 1;
        self.claim_name(&name);
        self.locals.push(Statement::Var(VarDecl {
            linkage: None,
            space: Space::Local,
            align: Some(align.max(T::SIZE)),
            vec: None,
            ty: T::MEM_TY,
            name: name.clone(),
            dims: vec![Some(len)],
            init: None,
            loc: Loc::default(),
        }));
        let r = self.reg::<u64>();
        self.emit(
            Opcode::Mov,
            [Mod::Type(Ty::U64)],
            [r.op(), Operand::sym(name)],
        );
        Ptr::from_reg(r)
    }

    /// A module-scope constant table `.const .align A .T name[n] = {..};` (u32 values) and its
    /// address (`mov.u64 %rd, name;`), read with `k.ld(ptr.offset(i))`.
    #[track_caller]
    pub fn const_table_u32(&mut self, name: &str, values: &[u32]) -> Ptr<u32, Const> {
        self.claim_name(name);
        self.module_vars.push(VarDecl {
            linkage: None,
            space: Space::Const,
            align: Some(4),
            vec: None,
            ty: Ty::U32,
            name: name.to_string(),
            dims: vec![Some(values.len() as u64)],
            init: Some(values.iter().map(|v| ptx::Init::Int(*v as i128)).collect()),
            loc: Loc::default(),
        });
        let r = self.reg::<u64>();
        self.emit(
            Opcode::Mov,
            [Mod::Type(Ty::U64)],
            [r.op(), Operand::sym(name)],
        );
        Ptr::from_reg(r)
    }

    /// The dynamic shared memory window (`.extern .shared .align A .b8 dyn_smem[];` at module
    /// scope), typed as `T`.
    #[track_caller]
    pub fn dynamic_shared<T: Scalar>(&mut self, align: u32) -> SharedPtr<T> {
        let name = "dyn_smem";
        if let Some(v) = self.module_vars.iter_mut().find(|v| v.name == name) {
            v.align = Some(v.align.unwrap_or(1).max(align));
        } else {
            self.module_vars.push(VarDecl {
                linkage: Some(Linkage::Extern),
                space: Space::Shared,
                align: Some(align),
                vec: None,
                ty: Ty::B8,
                name: name.to_string(),
                dims: vec![None],
                init: None,
                loc: Loc::default(),
            });
        }
        let r = self.reg::<u32>();
        self.emit(
            Opcode::Mov,
            [Mod::Type(Ty::U32)],
            [r.op(), Operand::sym(name)],
        );
        Ptr::from_reg(r)
    }

    // -----------------------------------------------------------------------------------------
    // control flow

    /// A fresh, not yet placed label.
    #[track_caller]
    pub fn new_label(&mut self) -> Label {
        self.labels += 1;
        Label(self.labels)
    }
    /// Places a label here.
    #[track_caller]
    pub fn place(&mut self, l: Label) {
        self.body.push(Statement::Label(l.name(), Loc::default()));
    }
    /// `bra L;` (guarded by an active `when`).
    #[track_caller]
    pub fn bra(&mut self, l: Label) {
        self.emit(Opcode::Bra, [], [Operand::sym(l.name())]);
    }
    /// `bra.uni L;` (the branch is known to be non-divergent).
    #[track_caller]
    pub fn bra_uni(&mut self, l: Label) {
        self.emit(
            Opcode::Bra,
            [Mod::Flag(ptx::Flag::Uni)],
            [Operand::sym(l.name())],
        );
    }
    /// `@p bra L;`
    #[track_caller]
    pub fn bra_if(&mut self, p: Reg<Pred>, l: Label) {
        self.cf_check("bra_if");
        self.emit_guarded(p, false, Opcode::Bra, [], [Operand::sym(l.name())]);
    }
    /// `@!p bra L;`
    #[track_caller]
    pub fn bra_unless(&mut self, p: Reg<Pred>, l: Label) {
        self.cf_check("bra_unless");
        self.emit_guarded(p, true, Opcode::Bra, [], [Operand::sym(l.name())]);
    }
    #[track_caller]
    fn cf_check(&mut self, what: &str) {
        if self.guard.is_some() {
            self.fail(BuildError::ControlFlow(format!(
                "{what} inside when(): use if_ for branches"
            )));
        }
    }

    /// `@!p bra END; <then> END:`
    #[track_caller]
    pub fn if_(&mut self, p: Reg<Pred>, then: impl FnOnce(&mut Self)) {
        let end = self.new_label();
        self.bra_unless(p, end);
        then(self);
        self.place(end);
    }
    /// `@p bra END; <then> END:` — runs `then` when `p` is false.
    #[track_caller]
    pub fn if_not(&mut self, p: Reg<Pred>, then: impl FnOnce(&mut Self)) {
        let end = self.new_label();
        self.bra_if(p, end);
        then(self);
        self.place(end);
    }
    /// `@!p bra ELSE; <then> bra END; ELSE: <else> END:`
    #[track_caller]
    pub fn if_else(
        &mut self,
        p: Reg<Pred>,
        then: impl FnOnce(&mut Self),
        else_: impl FnOnce(&mut Self),
    ) {
        let (els, end) = (self.new_label(), self.new_label());
        self.bra_unless(p, els);
        then(self);
        self.cf_check("if_else");
        self.bra(end);
        self.place(els);
        else_(self);
        self.place(end);
    }
    /// An endless loop `HEAD: <body> bra HEAD; END:`; leave it with [`KernelBuilder::break_`] /
    /// [`KernelBuilder::break_if`].
    #[track_caller]
    pub fn loop_(&mut self, body: impl FnOnce(&mut Self)) {
        let (head, end) = (self.new_label(), self.new_label());
        self.place(head);
        self.loops.push(LoopLabels {
            cont: head,
            brk: end,
        });
        body(self);
        self.loops.pop();
        self.cf_check("loop_");
        self.bra(head);
        self.place(end);
    }
    /// `HEAD: p = cond; @!p bra END; <body> bra HEAD; END:`
    #[track_caller]
    pub fn while_(
        &mut self,
        cond: impl FnOnce(&mut Self) -> Reg<Pred>,
        body: impl FnOnce(&mut Self),
    ) {
        let (head, end) = (self.new_label(), self.new_label());
        self.place(head);
        let p = cond(self);
        self.bra_unless(p, end);
        self.loops.push(LoopLabels {
            cont: head,
            brk: end,
        });
        body(self);
        self.loops.pop();
        self.cf_check("while_");
        self.bra(head);
        self.place(end);
    }
    /// A runtime counted loop `for (i = start; i < end; i += step)` (ascending, `setp.lt`).
    /// [`KernelBuilder::continue_`] jumps to the increment.
    #[track_caller]
    pub fn for_range<T: Int>(
        &mut self,
        start: impl Src<T>,
        end: impl Src<T>,
        step: impl Src<T>,
        body: impl FnOnce(&mut Self, Reg<T>),
    ) {
        let i = self.mov::<T>(start);
        let (head, cont, brk) = (self.new_label(), self.new_label(), self.new_label());
        self.place(head);
        let p = self.setp(crate::ops::CmpOp::Lt, i, end);
        self.bra_unless(p, brk);
        self.loops.push(LoopLabels { cont, brk });
        body(self, i);
        self.loops.pop();
        self.place(cont);
        self.add_to(i, i, step);
        self.cf_check("for_range");
        self.bra(head);
        self.place(brk);
    }
    /// Compile-time unrolled repetition: calls `f(k, i)` for `i in 0..n`.
    #[track_caller]
    pub fn unroll(&mut self, n: u32, mut f: impl FnMut(&mut Self, u32)) {
        for i in 0..n {
            f(self, i);
        }
    }
    #[track_caller]
    fn innermost(&mut self, what: &str) -> Option<LoopLabels> {
        let l = self.loops.last().copied();
        if l.is_none() {
            self.fail(BuildError::ControlFlow(format!("{what} outside a loop")));
        }
        l
    }
    /// Leaves the innermost structured loop.
    #[track_caller]
    pub fn break_(&mut self) {
        if let Some(l) = self.innermost("break_") {
            self.bra(l.brk);
        }
    }
    /// `@p bra END` of the innermost loop.
    #[track_caller]
    pub fn break_if(&mut self, p: Reg<Pred>) {
        if let Some(l) = self.innermost("break_if") {
            self.bra_if(p, l.brk);
        }
    }
    /// Jumps to the next iteration of the innermost loop.
    #[track_caller]
    pub fn continue_(&mut self) {
        if let Some(l) = self.innermost("continue_") {
            self.bra(l.cont);
        }
    }
    /// `@p bra CONTINUE` of the innermost loop.
    #[track_caller]
    pub fn continue_if(&mut self, p: Reg<Pred>) {
        if let Some(l) = self.innermost("continue_if") {
            self.bra_if(p, l.cont);
        }
    }
    /// Emits a `{ ... }` scope block around `f`.
    #[track_caller]
    pub fn block(&mut self, f: impl FnOnce(&mut Self)) {
        let outer = std::mem::take(&mut self.body);
        self.stack.push(outer);
        f(self);
        let inner = std::mem::replace(&mut self.body, self.stack.pop().unwrap_or_default());
        self.body.push(Statement::Block(inner));
    }

    // -----------------------------------------------------------------------------------------
    // raw PTX

    /// Raw PTX statements, parsed with [`ptx::parse_statements`]. Registers it uses must be
    /// builder registers (write them with `{reg}` / [`Reg::name`]) or declared by the raw text;
    /// otherwise [`KernelBuilder::finish`] reports [`BuildError::UnknownRegisters`].
    #[track_caller]
    pub fn raw(&mut self, text: impl AsRef<str>) {
        if let Err(e) = self.try_raw(text) {
            self.fail(e);
        }
    }
    /// [`KernelBuilder::raw`] reporting its error immediately.
    #[track_caller]
    pub fn try_raw(&mut self, text: impl AsRef<str>) -> Result<(), BuildError> {
        let text = text.as_ref();
        let stmts = ptx::parse_statements(text)?;
        let mut declared = HashSet::new();
        fn decls(s: &[Statement], out: &mut HashSet<String>, clash: &mut Option<String>) {
            for st in s {
                match st {
                    Statement::Reg(d) => {
                        for n in &d.names {
                            let names: Vec<String> = match n.count {
                                None => vec![n.name.clone()],
                                Some(c) => (0..c).map(|i| format!("{}{i}", n.name)).collect(),
                            };
                            for x in names {
                                if RegClass::parse_name(&x).is_some() && clash.is_none() {
                                    *clash = Some(x.clone());
                                }
                                out.insert(x);
                            }
                        }
                    }
                    Statement::Block(b) => decls(b, out, clash),
                    _ => {}
                }
            }
        }
        let mut clash = None;
        decls(&stmts, &mut declared, &mut clash);
        if let Some(c) = clash {
            return Err(BuildError::RawRedeclare(c));
        }
        fn uses<'a>(s: &'a [Statement], out: &mut Vec<&'a str>) {
            for st in s {
                match st {
                    Statement::Instr(i) => {
                        if let Some(g) = &i.guard {
                            out.push(&g.reg);
                        }
                        i.args.iter().for_each(|a| a.regs(out));
                    }
                    Statement::Block(b) => uses(b, out),
                    _ => {}
                }
            }
        }
        // Registers declared without `%` parse as symbols (the module parser resolves them per
        // function); resolve them here so the built IR equals what parsing the output gives.
        let mut stmts = stmts;
        fn fix(o: &mut Operand, set: &HashSet<String>) {
            match o {
                Operand::Sym { name, offset: 0 } if set.contains(name.as_str()) => {
                    *o = Operand::Reg(std::mem::take(name))
                }
                Operand::Addr { base, .. } => {
                    if let AddrBase::Sym(n) = base {
                        if set.contains(n.as_str()) {
                            *base = AddrBase::Reg(std::mem::take(n));
                        }
                    }
                }
                Operand::Not(x) => fix(x, set),
                Operand::Vec(v) | Operand::List(v) => v.iter_mut().for_each(|x| fix(x, set)),
                Operand::Pair(a, b) => {
                    fix(a, set);
                    fix(b, set);
                }
                _ => {}
            }
        }
        fn walk(b: &mut [Statement], set: &HashSet<String>) {
            for s in b {
                match s {
                    Statement::Instr(i) => i.args.iter_mut().for_each(|a| fix(a, set)),
                    Statement::Block(b) => walk(b, set),
                    _ => {}
                }
            }
        }
        let plain: HashSet<String> = declared
            .iter()
            .chain(self.raw_regs.iter())
            .filter(|n| !n.starts_with('%'))
            .cloned()
            .collect();
        if !plain.is_empty() {
            walk(&mut stmts, &plain);
        }
        let mut used = Vec::new();
        uses(&stmts, &mut used);
        let mut unknown: Vec<String> = Vec::new();
        for u in used {
            if !self.is_declared(u) && !declared.contains(u) && !unknown.iter().any(|x| x == u) {
                unknown.push(u.to_string());
            }
        }
        if !unknown.is_empty() {
            return Err(BuildError::UnknownRegisters {
                regs: unknown,
                text: text.trim().to_string(),
            });
        }
        self.raw_regs.extend(declared);
        // Guards of an enclosing `when` apply to raw instructions without their own guard.
        let guard = self.guard.clone();
        let caller = std::panic::Location::caller();
        for mut s in stmts {
            if let Statement::Instr(i) = &mut s {
                i.loc.rust = Some(caller);
                if let (None, Some(g)) = (&i.guard, &guard) {
                    i.guard = Some(g.clone());
                }
            }
            self.body.push(s);
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // finishing

    /// The finished function and module-scope variables, plus the PTX version it needs.
    pub(crate) fn into_parts(mut self) -> Result<(ptx::Function, Vec<VarDecl>, u32), BuildError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        while let Some(outer) = self.stack.pop() {
            let inner = std::mem::replace(&mut self.body, outer);
            self.body.push(Statement::Block(inner));
        }
        let mut body = Vec::new();
        for c in RegClass::ALL {
            let n = self.counts[c.index()];
            if n > 0 {
                body.push(Statement::Reg(RegDecl {
                    ty: c.decl_ty(),
                    vec: None,
                    align: None,
                    names: vec![RegName {
                        name: c.prefix().to_string(),
                        count: Some(n),
                    }],
                    loc: Loc::default(),
                }));
            }
        }
        body.append(&mut self.locals);
        body.append(&mut self.body);
        let f = ptx::Function {
            kind: self.kind,
            linkage: self.linkage,
            name: self.name.clone(),
            rets: self.rets,
            params: self.params,
            directives: self.directives,
            body: Some(body),
            loc: Loc::default(),
        };
        let version = check_target(&f, &self.target, self.need)?;
        Ok((f, self.module_vars, version))
    }

    /// Finishes the kernel into a module of its own.
    pub fn finish(self) -> Result<Module, BuildError> {
        let target = self.target.clone();
        let mut mb = ModuleBuilder::new(target);
        mb.add(self);
        mb.finish()
    }
}

fn param_var(name: &str, ty: Ty) -> VarDecl {
    VarDecl {
        linkage: None,
        space: Space::Param,
        align: None,
        vec: None,
        ty,
        name: name.to_string(),
        dims: Vec::new(),
        init: None,
        loc: Loc::default(),
    }
}

/// Checks every instruction against the target; returns the PTX version to use.
fn check_target(f: &ptx::Function, t: &Target, need: (u32, u32)) -> Result<u32, BuildError> {
    let sm = t.sm();
    let mut version = t.base_ptx().max(need.1);
    if need.0 > sm {
        return Err(BuildError::ArchTooOld {
            instr: "kernel attribute/operation".into(),
            need: need.0,
            arch: t.arch.clone(),
        });
    }
    let mut worst: Option<(u32, String)> = None;
    for ins in f.instructions() {
        let r = ptx::requirement(ins);
        if r.min_sm > sm {
            return Err(BuildError::ArchTooOld {
                instr: ins.to_string(),
                need: r.min_sm,
                arch: t.arch.clone(),
            });
        }
        if r.arch_specific && !t.arch_specific() {
            return Err(BuildError::NeedsArchSpecific {
                instr: ins.to_string(),
                arch: t.arch.clone(),
            });
        }
        if r.min_ptx > version {
            version = r.min_ptx;
            worst = Some((r.min_ptx, ins.to_string()));
        }
    }
    match t.ptx {
        Some(have) => {
            if have < version {
                let instr = worst
                    .map(|w| w.1)
                    .unwrap_or_else(|| format!("target {}", t.arch));
                return Err(BuildError::PtxVersionTooOld {
                    instr,
                    need: version,
                    have,
                });
            }
            Ok(have)
        }
        None => Ok(version),
    }
}

/// Several kernels and `.func`s in one module (functions in the order added; add callees first).
pub struct ModuleBuilder {
    target: Target,
    funcs: Vec<KernelBuilder>,
}

impl ModuleBuilder {
    pub fn new(target: Target) -> ModuleBuilder {
        ModuleBuilder {
            target,
            funcs: Vec::new(),
        }
    }
    /// A new kernel builder for this module's target (add it back with [`ModuleBuilder::add`]).
    pub fn kernel(&self, name: &str) -> KernelBuilder {
        KernelBuilder::new(name, self.target.clone())
    }
    /// A new `.func` builder for this module's target.
    pub fn func(&self, name: &str) -> KernelBuilder {
        KernelBuilder::func(name, self.target.clone())
    }
    /// Adds a finished kernel or function body.
    #[track_caller]
    pub fn add(&mut self, k: KernelBuilder) -> &mut Self {
        self.funcs.push(k);
        self
    }
    /// Builds the module: module-scope variables first (deduplicated), then functions.
    pub fn finish(self) -> Result<Module, BuildError> {
        let mut version = self.target.base_ptx();
        let mut vars: BTreeMap<String, VarDecl> = BTreeMap::new();
        let mut var_order: Vec<String> = Vec::new();
        let mut funcs = Vec::new();
        let mut names = HashSet::new();
        for mut k in self.funcs {
            k.target = Target {
                arch: self.target.arch.clone(),
                ptx: self.target.ptx,
            };
            let (f, mv, v) = k.into_parts()?;
            if !names.insert(f.name.clone()) {
                return Err(BuildError::Duplicate(f.name));
            }
            version = version.max(v);
            for var in mv {
                match vars.get_mut(&var.name) {
                    Some(old) => old.align = old.align.max(var.align),
                    None => {
                        var_order.push(var.name.clone());
                        vars.insert(var.name.clone(), var);
                    }
                }
            }
            funcs.push(f);
        }
        if let Some(p) = self.target.ptx {
            version = p;
        }
        let mut m = Module::new(version, ptx::Target::new(&self.target.arch));
        for n in var_order {
            if let Some(v) = vars.remove(&n) {
                m.items.push(Item::Var(v));
            }
        }
        m.items.extend(funcs.into_iter().map(Item::Func));
        // Diagnostics name the line of the printed module (the emitting Rust call rides along).
        ptx::printer::number_lines(&mut m);
        Ok(m)
    }
}

/// Types usable with [`KernelBuilder::param`].
pub trait KernelParam {
    /// What the kernel body gets: a register or a pointer.
    type Handle;
    /// The `.param` type the kernel declares (`.u64` for pointers), which
    /// [`crate::TypedKernel`] checks a module's signature against.
    const PARAM_TY: Ty;
    fn declare(k: &mut KernelBuilder, name: &str) -> Self::Handle;
}

impl<T: Scalar> KernelParam for T {
    type Handle = Reg<T>;
    const PARAM_TY: Ty = T::MEM_TY;
    #[track_caller]
    fn declare(k: &mut KernelBuilder, name: &str) -> Reg<T> {
        k.params.push(Param {
            space: Space::Param,
            ty: T::MEM_TY,
            align: None,
            ptr: None,
            vec: None,
            name: name.into(),
            array: None,
        });
        let r = k.reg::<T>();
        k.emit(
            Opcode::Ld,
            [Mod::Space(Space::Param), Mod::Type(T::MEM_TY)],
            [
                r.op(),
                Operand::Addr {
                    base: AddrBase::Sym(name.into()),
                    offset: 0,
                },
            ],
        );
        r
    }
}

#[track_caller]
fn declare_global_ptr<T: PtxType>(k: &mut KernelBuilder, name: &str, align: u32) -> GlobalPtr<T> {
    let ptr = if k.kind == FuncKind::Entry {
        Some(PtrAttr {
            space: Some(Space::Global),
            align: Some(align.max(1)),
        })
    } else {
        None
    };
    k.params.push(Param {
        space: Space::Param,
        ty: Ty::U64,
        align: None,
        ptr,
        vec: None,
        name: name.into(),
        array: None,
    });
    let r = k.reg::<u64>();
    k.emit(
        Opcode::Ld,
        [Mod::Space(Space::Param), Mod::Type(Ty::U64)],
        [
            r.op(),
            Operand::Addr {
                base: AddrBase::Sym(name.into()),
                offset: 0,
            },
        ],
    );
    let g = k.reg::<u64>();
    k.emit(
        Opcode::Cvta,
        [
            Mod::Flag(ptx::Flag::To),
            Mod::Space(Space::Global),
            Mod::Type(Ty::U64),
        ],
        [g.op(), r.op()],
    );
    Ptr::from_reg(g)
}

impl<T: PtxType> KernelParam for Ptr<T, Global> {
    type Handle = GlobalPtr<T>;
    const PARAM_TY: Ty = Ty::U64;
    #[track_caller]
    fn declare(k: &mut KernelBuilder, name: &str) -> GlobalPtr<T> {
        declare_global_ptr(k, name, T::SIZE)
    }
}

impl<T: PtxType> KernelParam for Ptr<T, Generic> {
    type Handle = GenericPtr<T>;
    const PARAM_TY: Ty = Ty::U64;
    #[track_caller]
    fn declare(k: &mut KernelBuilder, name: &str) -> GenericPtr<T> {
        k.params.push(Param {
            space: Space::Param,
            ty: Ty::U64,
            align: None,
            ptr: None,
            vec: None,
            name: name.into(),
            array: None,
        });
        let r = k.reg::<u64>();
        k.emit(
            Opcode::Ld,
            [Mod::Space(Space::Param), Mod::Type(Ty::U64)],
            [
                r.op(),
                Operand::Addr {
                    base: AddrBase::Sym(name.into()),
                    offset: 0,
                },
            ],
        );
        Ptr::from_reg(r)
    }
}
