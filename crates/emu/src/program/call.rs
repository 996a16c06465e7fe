//! Decoding device-function calls. PTX registers, parameters, return values and `.local`
//! variables are function-scoped: every invocation has its own. The decoder gives each device
//! function
//!
//! - a *frame*: its return values and parameters (at fixed offsets, the layout every call site
//!   agrees on), its `.local` variables (nvcc's `__local_depot`) and the `.param` variables of
//!   its own call sites, addressed relative to a per-lane frame-base register; the executor
//!   pushes a frame per call on the lane's stack ([`crate::exec`]'s `call` module);
//! - its own register slots (decoded once); a *recursive* function (one that can reach itself
//!   through calls) has them saved at each call and restored at its return, so the caller's
//!   values survive. Calls to non-recursive functions save nothing (their registers are dead
//!   whenever they are called).
//!
//! The kernel's own `.local` and call-site `.param` variables stay in static local memory.
//!
//! Indirect calls (`call (r), %fptr, (a), proto;`) go through a function address
//! ([`function_address`], what `mov.u64 %rd, fname;` and a `{f1, f2}` initialiser give): the
//! decoder makes one call site per function whose address the module takes and whose signature
//! matches the `.callprototype`, and the executor picks each lane's site by its pointer.

use super::*;
use crate::memory::FUNC_BASE;
use std::collections::HashSet;

/// The address of device function `name` (a code address: calls through it work, loads and
/// stores fault), or `None` when the module has no `.func` of that name.
pub fn function_address(module: &Module, name: &str) -> Option<u64> {
    let mut seen: Vec<&str> = Vec::new();
    for f in module.functions().filter(|f| f.kind == ptx::FuncKind::Func) {
        if f.name == name {
            let k = seen.iter().position(|n| *n == name).unwrap_or(seen.len());
            return Some(FUNC_BASE + 16 * k as u64);
        }
        if !seen.contains(&f.name.as_str()) {
            seen.push(&f.name);
        }
    }
    None
}

/// Names of the functions whose address the module takes: named by an operand of an
/// instruction other than a direct call's target, or by a variable initialiser.
fn address_taken(module: &Module) -> HashSet<&str> {
    let funcs: HashSet<&str> = module.functions().map(|f| f.name.as_str()).collect();
    let mut out = HashSet::new();
    for v in module.globals() {
        for i in v.init.iter().flatten() {
            if let ptx::Init::Sym { name, .. } = i {
                out.extend(funcs.get(name.as_str()));
            }
        }
    }
    for f in module.functions() {
        for ins in f.instructions() {
            let target = (ins.op == Opcode::Call)
                .then(|| call_target_index(ins))
                .flatten();
            for (k, a) in ins.args.iter().enumerate() {
                match a {
                    Operand::Sym { name, .. } if Some(k) != target => {
                        out.extend(funcs.get(name.as_str()));
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

/// Index of a direct call's target operand (after the optional return list).
fn call_target_index(ins: &Instruction) -> Option<usize> {
    let k = ins.operand_index(Role::Func)?;
    matches!(ins.args[k], Operand::Sym { .. }).then_some(k)
}

/// The device functions (with bodies) kernel `k` can reach: by direct calls, and (through
/// pointers) every function whose address the module takes, with what they reach in turn.
pub(super) fn reachable_functions<'m>(module: &'m Module, k: &'m Function) -> Vec<&'m Function> {
    let mut names: Vec<&str> = address_taken(module).into_iter().collect();
    names.sort_unstable(); // a deterministic shared-memory layout
    let mut out: Vec<&Function> = Vec::new();
    let mut todo = vec![k];
    let mut seen: HashSet<&str> = HashSet::new();
    while let Some(f) = todo.pop() {
        let mut syms = std::mem::take(&mut names);
        for ins in f.instructions() {
            for a in &ins.args {
                if let Operand::Sym { name, .. } = a {
                    syms.push(name);
                }
            }
        }
        for n in syms {
            if let Some(g) = module.function(n).filter(|g| g.kind == ptx::FuncKind::Func) {
                if g.body.is_some() && seen.insert(&g.name) {
                    out.push(g);
                    todo.push(g);
                }
            }
        }
    }
    out
}

/// A per-lane local-memory place: the value of register `base` (a frame base; [`ZERO`] for the
/// kernel's static local memory) plus `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub base: u32,
    pub off: u32,
}

/// Where a `__assertfail` call passes its arguments: generic addresses of the NUL-terminated
/// message, file and function names, and the 32-bit line number.
#[derive(Clone, Copy, Debug)]
pub struct AssertFail {
    pub message: Place,
    pub file: Place,
    pub line: Place,
    pub function: Place,
}

/// A parameter or return value copied between a caller's `.param` variable and the callee's
/// frame.
#[derive(Clone, Copy, Debug)]
pub struct ParamCopy {
    pub caller: Place,
    /// Offset in the callee's frame.
    pub callee_off: u32,
    pub bytes: u32,
}

/// A decoded `call`.
#[derive(Clone, Debug)]
pub struct CallSite {
    pub target: u32,
    pub callee: String,
    /// Bytes of the callee's frame (a multiple of 16).
    pub frame_bytes: u32,
    /// The callee's frame-base register.
    pub frame_slot: u32,
    /// Registers saved at the call and restored at the return (recursive callees only).
    pub save: Vec<u32>,
    pub args: Vec<ParamCopy>,
    /// `.reg` arguments: (caller source slot, callee parameter register), copied in parallel.
    pub reg_args: Vec<(u32, u32)>,
    /// `.reg` return values: (callee return register, caller destination), copied at `ret`.
    pub reg_rets: Vec<(u32, u32)>,
}

/// A decoded indirect call: the lane's function pointer chooses among `sites`.
#[derive(Clone, Debug)]
pub struct IndirectCall {
    /// The register holding the function address.
    pub fptr: u32,
    /// (function address, call site) for each function the pointer may name.
    pub sites: Vec<(u64, CallSite)>,
    /// The `.callprototype` or `.calltargets` label (for the fault of a pointer to nothing
    /// callable).
    pub proto: String,
}

/// The frame of the device function being decoded.
pub(super) struct Frame {
    pub slot: u32,
    pub syms: HashMap<String, u32>,
    pub size: u32,
}

impl Frame {
    fn new(slot: u32) -> Frame {
        Frame {
            slot,
            syms: HashMap::new(),
            size: 0,
        }
    }

    /// Places variable `name` in the frame; returns its offset.
    pub fn alloc(&mut self, name: &str, size: u32, align: u32) -> u32 {
        let align = align.max(1);
        let off = self.size.div_ceil(align) * align;
        self.size = off + size;
        self.syms.insert(name.to_string(), off);
        off
    }
}

/// A decoded device function.
pub(super) struct FuncInfo {
    entry: u32,
    frame_slot: u32,
    frame_bytes: u32,
    /// Its register slots (constants excluded).
    regs: Vec<u32>,
}

/// The first register and element count of a `.reg` parameter or return value.
type RegParam = Option<(u32, u8)>;

/// Frame offsets and sizes of a function's return values, then its parameters (every call site
/// and the function body use this one layout); `None` for `.reg` parameters, which live in
/// registers.
fn param_layout(f: &Function, fr: &mut Frame) -> Vec<Option<(u32, u32)>> {
    f.rets
        .iter()
        .chain(&f.params)
        .map(|p| {
            let size = p.size_bytes() as u32;
            (p.space != Space::Reg).then(|| (fr.alloc(&p.name, size, p.alignment() as u32), size))
        })
        .collect()
}

fn reg_bits_of(t: Ty) -> u8 {
    if t == Ty::Pred {
        1
    } else {
        (t.size() * 8).min(64) as u8
    }
}

/// The callee of `call{.uni} [(rets),] func[, (args)]` (or `fptr, ..., proto`) and its
/// operands.
struct CallOperands {
    name: String,
    rets: Vec<Operand>,
    args: Vec<Operand>,
    /// Indirect calls: the function-pointer operand and the `.callprototype` label.
    indirect: Option<(Operand, String)>,
}

/// What an indirect call's last operand names.
enum Targets {
    /// `.callprototype`: (return values, parameters).
    Proto(Vec<ptx::Param>, Vec<ptx::Param>),
    /// `.calltargets`: the functions.
    List(Vec<String>),
}

/// Do a function's return values and parameters have the prototype's spaces, element counts
/// and sizes?
fn matches_prototype(f: &Function, rets: &[ptx::Param], params: &[ptx::Param]) -> bool {
    let same = |a: &[ptx::Param], b: &[ptx::Param]| {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| {
                (x.space == Space::Reg) == (y.space == Space::Reg)
                    && x.size_bytes() == y.size_bytes()
                    && x.lanes() == y.lanes()
            })
    };
    same(&f.rets, rets) && same(&f.params, params)
}

impl<'a> Decoder<'a> {
    /// Frame offset of a symbol of the current device function.
    pub(super) fn frame_off(&self, name: &str) -> Option<u32> {
        self.frame.as_ref()?.syms.get(name).copied()
    }

    /// (frame-base register, offset) of a symbol of the current device function.
    pub(super) fn frame_place(&self, name: &str) -> Option<(u32, u32)> {
        let fr = self.frame.as_ref()?;
        fr.syms.get(name).map(|&o| (fr.slot, o))
    }

    /// A register holding the local address frame base + `off` (a frame symbol as a value).
    pub(super) fn frame_addr(&mut self, ins: &Instruction, off: i64) -> u32 {
        let base = self.frame.as_ref().map_or(ZERO, |f| f.slot);
        let k = self.konst(off as u64);
        let t = self.new_slot(64);
        let add = Instruction::new(Opcode::Add, vec![Mod::Type(Ty::U64)], vec![]);
        let f = alu::int_fn(&add).unwrap_or_else(|| alu::mov(8));
        self.push(
            Op::Alu {
                f,
                d: t,
                a: base,
                b: k,
                c: ZERO,
            },
            ins,
            (NONE, false),
        );
        t
    }

    /// The place of a `.param` variable named by a call operand.
    fn place_of(&self, ins: &Instruction, o: &Operand, what: &str) -> Result<Place, EmuError> {
        let Operand::Sym { name, offset } = o else {
            return Err(self.err(ins, format!("call {what}s must be .param variables")));
        };
        let (base, off) = match self.frame_place(name) {
            Some(p) => p,
            None => match self.local_syms.get(name) {
                Some(&o) if !self.in_func => (ZERO, o),
                _ => {
                    return Err(self.err(
                        ins,
                        format!("call {what} `{name}` is not a .param variable"),
                    ))
                }
            },
        };
        Ok(Place {
            base,
            off: (off as i64 + offset) as u32,
        })
    }

    fn call_operands(&self, ins: &Instruction) -> Result<CallOperands, EmuError> {
        let list = |r: Role| match ins.operand(r) {
            Some(Operand::List(v)) => v.clone(),
            _ => Vec::new(),
        };
        let rets = list(Role::Rets);
        let first = ins
            .operand(Role::Func)
            .ok_or_else(|| self.err(ins, "call without target"))?;
        let args = list(Role::Params);
        if ins.roles().len() < ins.args.len() {
            return Err(self.err(ins, "malformed call operands"));
        }
        let proto = match ins.operand(Role::Proto) {
            Some(Operand::Sym { name, .. }) => Some(name.clone()),
            Some(_) => return Err(self.err(ins, "malformed call prototype")),
            None => None,
        };
        match (first, proto) {
            (Operand::Sym { name, .. }, None) => Ok(CallOperands {
                name: name.clone(),
                rets,
                args,
                indirect: None,
            }),
            (Operand::Reg(_), Some(proto)) => Ok(CallOperands {
                name: String::new(),
                rets,
                args,
                indirect: Some((first.clone(), proto)),
            }),
            (Operand::Reg(_), None) => Err(self.err(
                ins,
                "an indirect call needs a `.callprototype` label as its last operand",
            )),
            _ => Err(self.err(ins, "malformed call target")),
        }
    }

    /// `call`: copies the arguments into a new frame and jumps; the return values are copied out
    /// by an `Op::CallRet` right after.
    pub(super) fn call(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let c = self.call_operands(ins)?;
        if c.indirect.is_some() {
            return self.call_indirect(ins, ins0, guard, &c);
        }
        let module = self.module;
        let f = module
            .function(&c.name)
            .ok_or_else(|| self.err(ins, format!("call to unknown function `{}`", c.name)))?;
        if f.kind == ptx::FuncKind::Entry {
            return Err(self.err(ins, "calling a kernel entry is not allowed"));
        }
        if f.body.is_none() && c.name == "vprintf" {
            return self.vprintf(ins, ins0, guard, (f, &c));
        }
        if f.body.is_none() && c.name == "__assertfail" {
            return self.assertfail(ins, ins0, guard, &c);
        }
        if f.body.is_none() {
            return Err(self.err(
                ins,
                format!(
                    "function `{}` is only declared (external functions are not supported)",
                    c.name
                ),
            ));
        }
        if f.rets.len() != c.rets.len() || f.params.len() != c.args.len() {
            return Err(self.err(
                ins,
                format!(
                    "call to `{}` passes {} results / {} arguments, function has {} / {}",
                    c.name,
                    c.rets.len(),
                    c.args.len(),
                    f.rets.len(),
                    f.params.len()
                ),
            ));
        }
        let (site, rets) = self.call_site(ins, f, &c)?;
        self.note_call(0, &c.name);
        self.push(Op::Call(Box::new(site)), ins0, guard);
        if !rets.is_empty() {
            self.push(Op::CallRet(Box::new(rets)), ins0, guard);
        }
        Ok(())
    }

    /// Records call site `k` of the instruction about to be pushed (completed once every
    /// function is decoded) and queues the callee for decoding.
    fn note_call(&mut self, k: usize, callee: &str) {
        self.call_fixups.push((
            self.prog.insts.len(),
            k,
            self.current.clone(),
            callee.to_string(),
        ));
        if !self.func_info.contains_key(callee) && !self.pending.iter().any(|p| p == callee) {
            self.pending.push(callee.to_string());
        }
    }

    /// The `.callprototype` or `.calltargets` named `label` in the function being decoded.
    fn call_targets(&self, label: &str) -> Option<Targets> {
        let f = match &self.current {
            Some(n) => self.module.function(n)?,
            None => self.f,
        };
        let mut found = None;
        f.walk(&mut |s| match s {
            Statement::CallPrototype {
                label: l,
                rets,
                params,
                ..
            } if l == label && found.is_none() => {
                found = Some(Targets::Proto(rets.clone(), params.clone()));
            }
            Statement::CallTargets { label: l, targets } if l == label && found.is_none() => {
                found = Some(Targets::List(targets.clone()));
            }
            _ => {}
        });
        found
    }

    /// The functions an indirect call may reach, and whether each must be callable (a
    /// `.calltargets` list) rather than skipped when its results are laid out differently.
    fn indirect_candidates(
        &self,
        ins: &Instruction,
        label: &str,
        c: &CallOperands,
    ) -> Result<(Vec<&'a Function>, bool), EmuError> {
        let module: &'a Module = self.module;
        let counts = |f: &Function| f.rets.len() == c.rets.len() && f.params.len() == c.args.len();
        match self.call_targets(label) {
            Some(Targets::Proto(prets, pparams)) => {
                if prets.len() != c.rets.len() || pparams.len() != c.args.len() {
                    return Err(self.err(
                        ins,
                        format!(
                            "call passes {} results / {} arguments, prototype `{label}` has \
                             {} / {}",
                            c.rets.len(),
                            c.args.len(),
                            prets.len(),
                            pparams.len()
                        ),
                    ));
                }
                let taken = address_taken(module);
                let fs = module.functions().filter(|f| {
                    f.kind == ptx::FuncKind::Func
                        && f.body.is_some()
                        && taken.contains(f.name.as_str())
                        && module
                            .function(&f.name)
                            .is_some_and(|g| std::ptr::eq(g, *f))
                        && matches_prototype(f, &prets, &pparams)
                });
                Ok((fs.collect(), false))
            }
            Some(Targets::List(names)) => {
                let mut fs = Vec::new();
                for n in &names {
                    let f = module
                        .function(n)
                        .filter(|f| f.kind == ptx::FuncKind::Func && f.body.is_some())
                        .ok_or_else(|| {
                            self.err(
                                ins,
                                format!(
                                    "`.calltargets` {label} names `{n}`, which is not a device \
                                     function defined in this module"
                                ),
                            )
                        })?;
                    if !counts(f) {
                        return Err(self.err(
                            ins,
                            format!("`{n}` of `.calltargets` {label} does not fit this call"),
                        ));
                    }
                    fs.push(f);
                }
                Ok((fs, true))
            }
            None => Err(self.err(
                ins,
                format!("`{label}` is not a .callprototype or .calltargets label"),
            )),
        }
    }

    /// An indirect call: one call site per function it may reach (see
    /// [`Self::indirect_candidates`]); the `.param` return values are copied out by one layout,
    /// which all of them share.
    fn call_indirect(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
        c: &CallOperands,
    ) -> Result<(), EmuError> {
        let Some((fptr, label)) = &c.indirect else {
            return Err(self.err(ins, "internal: not an indirect call"));
        };
        let (candidates, strict) = self.indirect_candidates(ins, label, c)?;
        let fptr = self.src(ins, fptr)?;
        let mut sites = Vec::new();
        let mut ret_copies: Option<Vec<ParamCopy>> = None;
        for f in candidates {
            let Some(addr) = function_address(self.module, &f.name) else {
                continue;
            };
            let named = CallOperands {
                name: f.name.clone(),
                rets: c.rets.clone(),
                args: c.args.clone(),
                indirect: None,
            };
            let (site, rets) = self.call_site(ins, f, &named)?;
            // every candidate must put its `.param` results where the copy after the call
            // reads them (same sizes give the same layout unless `.align` differs)
            match &ret_copies {
                Some(r) if !same_copies(r, &rets) && strict => {
                    return Err(self.err(
                        ins,
                        format!("`{}` lays out its results unlike the other targets", f.name),
                    ))
                }
                Some(r) if !same_copies(r, &rets) => continue,
                Some(_) => {}
                None => ret_copies = Some(rets),
            }
            self.note_call(sites.len(), &f.name);
            sites.push((addr, site));
        }
        let op = IndirectCall {
            fptr,
            sites,
            proto: label.clone(),
        };
        self.push(Op::CallIndirect(Box::new(op)), ins0, guard);
        if let Some(rets) = ret_copies.filter(|r| !r.is_empty()) {
            self.push(Op::CallRet(Box::new(rets)), ins0, guard);
        }
        Ok(())
    }

    /// The slots a `.reg` parameter or return value of `lanes` elements is passed in: a scalar
    /// operand, a whole vector register, or a `{a, b}` vector.
    fn reg_operand(
        &mut self,
        ins: &Instruction,
        o: &Operand,
        lanes: u8,
        dst: bool,
    ) -> Result<Vec<u32>, EmuError> {
        let slots = match o {
            Operand::Vec(v) => v
                .iter()
                .map(|x| {
                    if dst {
                        self.dst(ins, x)
                    } else {
                        self.src(ins, x)
                    }
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ if lanes > 1 => self.vec_reg(o).unwrap_or_default(),
            _ if dst => vec![self.dst(ins, o)?],
            _ => vec![self.src(ins, o)?],
        };
        if slots.len() != lanes as usize {
            return Err(self.err(
                ins,
                format!("call operand {o:?} does not have {lanes} elements"),
            ));
        }
        Ok(slots)
    }

    /// The call site's argument copies, and the copies of `.param` return values after it.
    fn call_site(
        &mut self,
        ins: &Instruction,
        f: &Function,
        c: &CallOperands,
    ) -> Result<(CallSite, Vec<ParamCopy>), EmuError> {
        let layout = param_layout(f, &mut Frame::new(NONE));
        let regs = self.reg_param_slots(f);
        let nr = f.rets.len();
        let mut site = CallSite {
            target: u32::MAX,
            callee: c.name.clone(),
            frame_bytes: 0,
            frame_slot: NONE,
            save: Vec::new(),
            args: Vec::new(),
            reg_args: Vec::new(),
            reg_rets: Vec::new(),
        };
        let mut rets = Vec::new();
        for (k, o) in c.rets.iter().chain(&c.args).enumerate() {
            let what = if k < nr { "result" } else { "argument" };
            match (layout[k], regs[k]) {
                (_, Some((r, n))) if k < nr => {
                    let ds = self.reg_operand(ins, o, n, true)?;
                    site.reg_rets.extend((r..).zip(ds));
                }
                (_, Some((r, n))) => {
                    let ss = self.reg_operand(ins, o, n, false)?;
                    site.reg_args.extend(ss.into_iter().zip(r..));
                }
                (Some((callee_off, bytes)), None) => {
                    let pc = ParamCopy {
                        caller: self.place_of(ins, o, what)?,
                        callee_off,
                        bytes,
                    };
                    if k < nr {
                        rets.push(pc);
                    } else {
                        site.args.push(pc);
                    }
                }
                (None, None) => return Err(self.err(ins, "internal: parameter without a place")),
            }
        }
        Ok((site, rets))
    }

    /// The registers of a function's `.reg` return values and parameters (`None` for `.param`
    /// ones), in declaration order: allocated at the first call, declared in its body.
    fn reg_param_slots(&mut self, f: &Function) -> Vec<RegParam> {
        if let Some(v) = self.reg_params.get(&f.name) {
            return v.clone();
        }
        let v: Vec<RegParam> = f
            .rets
            .iter()
            .chain(&f.params)
            .map(|p| {
                let n = p.vec.unwrap_or(1);
                (p.space == Space::Reg).then(|| (self.new_reg(reg_bits_of(p.ty), n), n))
            })
            .collect();
        self.reg_params.insert(f.name.clone(), v.clone());
        v
    }

    /// CUDA's `vprintf(format, args)`, executed by the emulator itself: the call's parameters
    /// are read by [`PrintfRole`], after checking `vprintf`'s declaration `f`.
    fn vprintf(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
        (decl, c): (&Function, &CallOperands),
    ) -> Result<(), EmuError> {
        let call = check_vprintf_decl(decl)
            .and_then(|()| VprintfCall::new(c))
            .map_err(|m| self.err(ins, m))?;
        let place =
            |r: PrintfRole| self.place_of(ins, call.param(r), &format!("`{}` argument", r.name()));
        let (format, args) = (place(PrintfRole::Format)?, place(PrintfRole::Args)?);
        let ret = match call.ret {
            Some(o) => Some(self.place_of(ins, o, "result")?),
            None => None,
        };
        self.push(
            Op::Vprintf {
                fmt: format,
                args,
                ret,
            },
            ins0,
            guard,
        );
        Ok(())
    }

    /// CUDA's `__assertfail(message, file, line, function, charSize)`, executed by the
    /// emulator itself (nvcc's `assert` and Triton's `tl.device_assert` call it; the declaration
    /// is `.extern`): the first four parameters are read where the call passes them.
    fn assertfail(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
        c: &CallOperands,
    ) -> Result<(), EmuError> {
        let [message, file, line, function, _char_size] = c.args.as_slice() else {
            return Err(self.err(
                ins,
                format!(
                    "__assertfail takes (message, file, line, function, charSize): the call \
                     passes {} arguments",
                    c.args.len()
                ),
            ));
        };
        let op = AssertFail {
            message: self.place_of(ins, message, "`message` argument")?,
            file: self.place_of(ins, file, "`file` argument")?,
            line: self.place_of(ins, line, "`line` argument")?,
            function: self.place_of(ins, function, "`function` argument")?,
        };
        self.push(Op::AssertFail(Box::new(op)), ins0, guard);
        Ok(())
    }

    /// Decodes one device function body after the kernel.
    fn decode_function(&mut self, name: &str) -> Result<(), EmuError> {
        let module = self.module;
        let decode_err = |msg: String| EmuError::Decode {
            kernel: self.f.name.clone(),
            msg,
        };
        let f = module
            .function(name)
            .ok_or_else(|| decode_err(format!("call to unknown function `{name}`")))?;
        let body = f.body.as_ref().ok_or_else(|| {
            decode_err(format!(
                "function `{name}` is only declared (external functions are not supported)"
            ))
        })?;
        let entry = self.prog.insts.len() as u32;
        let first_reg = self.prog.nregs;
        self.scopes = vec![HashMap::new()];
        self.labels.clear();
        self.tables.clear();
        self.local_syms.clear();
        self.in_func = true;
        self.current = Some(name.to_string());
        let mut fr = Frame::new(self.new_slot(64));
        param_layout(f, &mut fr);
        let reg_params = self.reg_param_slots(f);
        for (p, r) in f.rets.iter().chain(&f.params).zip(&reg_params) {
            if let Some((r, _)) = r {
                self.scopes[0].insert(p.name.clone(), *r);
            }
        }
        f.walk(&mut |s| {
            if let Statement::Var(v) = s {
                if v.space == Space::Local {
                    let align = v.align.unwrap_or(v.ty.size());
                    fr.alloc(&v.name, v.size_bytes() as u32, align);
                }
            }
        });
        self.frame = Some(fr);
        self.block(body)?;
        self.prog.insts.push(Inst {
            progress: false,
            op: Op::Ret,
            guard: NONE,
            guard_neg: false,
            src: self.prog.source.len() as u32,
        });
        self.prog
            .source
            .push(Instruction::new(Opcode::Ret, vec![], vec![]));
        self.resolve_labels(name)?;
        let fr = self.frame.take().unwrap_or_else(|| Frame::new(NONE));
        let consts: std::collections::HashSet<u32> = self.consts.values().copied().collect();
        let regs = (first_reg..self.prog.nregs)
            .filter(|s| !consts.contains(s))
            .chain(
                reg_params
                    .iter()
                    .flatten()
                    .flat_map(|&(r, n)| r..r + n as u32),
            )
            .collect();
        let info = FuncInfo {
            entry,
            frame_slot: fr.slot,
            frame_bytes: fr.size.div_ceil(16) * 16,
            regs,
        };
        self.func_info.insert(name.to_string(), info);
        Ok(())
    }

    /// Decodes every device function reachable through `call`, then completes the call sites
    /// (target, frame, registers to save for recursive callees).
    pub(super) fn decode_functions(&mut self) -> Result<(), EmuError> {
        while let Some(name) = self.pending.pop() {
            if !self.func_info.contains_key(&name) {
                self.decode_function(&name)?;
            }
        }
        let edges: Vec<(Option<String>, String)> = self
            .call_fixups
            .iter()
            .map(|(_, _, a, b)| (a.clone(), b.clone()))
            .collect();
        let recursive = |g: &str| -> bool {
            // does g reach g?
            let mut seen = std::collections::HashSet::new();
            let mut todo = vec![g.to_string()];
            while let Some(x) = todo.pop() {
                for (a, b) in &edges {
                    if a.as_deref() == Some(x.as_str()) {
                        if b == g {
                            return true;
                        }
                        if seen.insert(b.clone()) {
                            todo.push(b.clone());
                        }
                    }
                }
            }
            false
        };
        let fix = std::mem::take(&mut self.call_fixups);
        for (i, k, _, name) in &fix {
            let rec = recursive(name);
            let info = &self.func_info[name];
            let site = match &mut self.prog.insts[*i].op {
                Op::Call(site) => Some(&mut **site),
                Op::CallIndirect(ic) => ic.sites.get_mut(*k).map(|s| &mut s.1),
                _ => None,
            };
            if let Some(site) = site {
                site.target = info.entry;
                site.frame_slot = info.frame_slot;
                site.frame_bytes = info.frame_bytes;
                site.save = if rec { info.regs.clone() } else { Vec::new() };
            }
        }
        self.call_fixups = fix;
        self.in_func = false;
        self.current = None;
        Ok(())
    }
}

/// Do two lists of return-value copies read and write the same bytes?
fn same_copies(a: &[ParamCopy], b: &[ParamCopy]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.caller == y.caller && x.callee_off == y.callee_off && x.bytes == y.bytes
        })
}

/// The parameters of CUDA's `vprintf(const char *format, void *args)` by role (the call's
/// parameter list is read through [`VprintfCall::param`], never by position).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PrintfRole {
    /// The generic address of the NUL-terminated format string.
    Format,
    /// The generic address of the packed argument buffer (each argument at its natural
    /// alignment, as nvcc packs them).
    Args,
}

impl PrintfRole {
    /// The roles in the order `vprintf` declares its parameters.
    const ORDER: [PrintfRole; 2] = [PrintfRole::Format, PrintfRole::Args];

    /// The name errors use (CUDA's parameter names).
    pub(super) fn name(self) -> &'static str {
        match self {
            PrintfRole::Format => "format",
            PrintfRole::Args => "args",
        }
    }
}

/// A `vprintf` call's operands: its parameters by [`PrintfRole`], and its optional result.
struct VprintfCall<'a> {
    params: &'a [Operand],
    ret: Option<&'a Operand>,
}

impl<'a> VprintfCall<'a> {
    /// Checks the call against `vprintf`'s signature: one parameter per role, at most one
    /// result.
    fn new(c: &'a CallOperands) -> Result<VprintfCall<'a>, String> {
        if c.args.len() != PrintfRole::ORDER.len() {
            return Err(format!(
                "vprintf takes (format, args): the call passes {} arguments",
                c.args.len()
            ));
        }
        if c.rets.len() > 1 {
            return Err(format!(
                "vprintf returns one .b32 result: the call takes {}",
                c.rets.len()
            ));
        }
        Ok(VprintfCall {
            params: &c.args,
            ret: c.rets.first(),
        })
    }

    /// The parameter playing `role`.
    fn param(&self, role: PrintfRole) -> &'a Operand {
        let k = PrintfRole::ORDER
            .iter()
            .position(|r| *r == role)
            .unwrap_or_default();
        &self.params[k]
    }
}

/// Checks `vprintf`'s declaration `f`: a 64-bit `.param` per [`PrintfRole`] and at most one
/// 32-bit result (what nvcc declares); errors name the role.
fn check_vprintf_decl(f: &Function) -> Result<(), String> {
    if f.params.len() != PrintfRole::ORDER.len() {
        return Err(format!(
            "vprintf is declared with {} parameters; it takes (format, args)",
            f.params.len()
        ));
    }
    for (p, r) in f.params.iter().zip(PrintfRole::ORDER) {
        if p.space != Space::Param || p.ty.bits() != 64 || p.vec.is_some() || p.array.is_some() {
            return Err(format!(
                "vprintf's `{}` parameter `{}` must be a 64-bit .param (a generic address)",
                r.name(),
                p.name
            ));
        }
    }
    match f.rets.as_slice() {
        [] => Ok(()),
        [r] if r.ty.bits() == 32 && r.vec.is_none() && r.array.is_none() => Ok(()),
        _ => Err("vprintf's result must be one 32-bit value".into()),
    }
}
