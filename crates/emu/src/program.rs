//! Decoding: a kernel's PTX IR -> a compact [`Program`] the executor runs. Decode happens once
//! per kernel load: registers become slot indices, immediates and symbol addresses become
//! constant slots (pre-splatted across lanes), labels become instruction indices, and each
//! instruction becomes an [`Op`] whose semantics were chosen here, so the inner loop never looks
//! at strings, modifiers or hash maps.

use crate::alu::{self, WFn};
use crate::error::EmuError;
use crate::fp::{self, CvtSpec, FMode, FOp};
use crate::mma::MmaSpec;
use ptx::{
    AddrBase, Flag, Function, Imm, Instruction, Mod, Module, Opcode, Operand, SReg, Space,
    Statement, Ty,
};
use std::collections::HashMap;

mod call;
mod carry;
pub use call::{CallSite, ParamCopy, Place};
pub use carry::{CarryKind, CarryOp};

/// Slot 0 always holds zero in every lane.
pub const ZERO: u32 = 0;
/// "No register" marker.
pub const NONE: u32 = u32::MAX;

/// Memory space of a decoded access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MSpace {
    Global,
    Shared,
    Local,
    /// The kernel parameter buffer.
    Param,
    Generic,
}

impl MSpace {
    pub fn name(self) -> &'static str {
        match self {
            MSpace::Global => "global",
            MSpace::Shared => "shared",
            MSpace::Local => "local",
            MSpace::Param => "param",
            MSpace::Generic => "generic",
        }
    }
}

/// Memory ordering requested by an access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ord {
    Relaxed,
    Acquire,
    Release,
    AcqRel,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomOp {
    Add,
    Min,
    Max,
    Inc,
    Dec,
    And,
    Or,
    Xor,
    Exch,
    Cas,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarKind {
    Sync,
    Arrive,
    RedPopc,
    RedAnd,
    RedOr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShflMode {
    Up,
    Down,
    Bfly,
    Idx,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VoteMode {
    All,
    Any,
    Uni,
    Ballot,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduxOp {
    Add,
    Min,
    Max,
    And,
    Or,
    Xor,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CvtaDir {
    /// generic = space address + window
    ToGeneric(u64),
    /// space address = generic - window
    FromGeneric(u64),
}

/// A decoded instruction.
#[derive(Clone, Debug)]
pub enum Op {
    /// Pure lane-wise ALU op.
    Alu {
        f: WFn,
        d: u32,
        a: u32,
        b: u32,
        c: u32,
    },
    /// Float op through the exact software float unit.
    Float {
        op: FOp,
        ty: Ty,
        mode: FMode,
        d: u32,
        a: u32,
        b: u32,
        c: u32,
    },
    Cvt {
        spec: CvtSpec,
        d: u32,
        a: u32,
        b: u32,
    },
    /// Integer division/remainder (faults on a zero divisor in an active lane).
    IntDiv {
        ty: Ty,
        rem: bool,
        d: u32,
        a: u32,
        b: u32,
    },
    Bfi {
        bits: u32,
        d: u32,
        a: u32,
        b: u32,
        c: u32,
        e: u32,
    },
    Shf {
        left: bool,
        wrap: bool,
        d: u32,
        a: u32,
        b: u32,
        c: u32,
    },
    Lop3 {
        lut: u8,
        d: u32,
        a: u32,
        b: u32,
        c: u32,
    },
    Testp {
        kind: fp::TestpKind,
        ty: Ty,
        d: u32,
        a: u32,
    },
    Isspacep {
        space: MSpace,
        d: u32,
        a: u32,
    },
    Cvta {
        dir: CvtaDir,
        d: u32,
        a: u32,
        bits: u32,
    },
    /// mov of a vector into one register (`mov.b64 d, {a, b}`): parts low first.
    Pack {
        part_bits: u32,
        d: u32,
        parts: Vec<u32>,
    },
    /// mov of one register into a vector of registers.
    Unpack {
        part_bits: u32,
        ds: Vec<u32>,
        a: u32,
    },
    SReg {
        d: u32,
        r: SReg,
    },
    Ld {
        space: MSpace,
        elem: u32,
        sext: bool,
        ds: Vec<u32>,
        addr: u32,
        off: i64,
        ord: Ord,
    },
    St {
        space: MSpace,
        elem: u32,
        srcs: Vec<u32>,
        addr: u32,
        off: i64,
        ord: Ord,
    },
    Atom {
        space: MSpace,
        op: AtomOp,
        ty: Ty,
        d: u32,
        addr: u32,
        off: i64,
        b: u32,
        c: u32,
        ord: Ord,
    },
    Bra {
        target: u32,
    },
    BrxIdx {
        idx: u32,
        targets: Vec<u32>,
    },
    Bar {
        kind: BarKind,
        id: u32,
        count: u32,
        d: u32,
        p: u32,
        pneg: bool,
    },
    Shfl {
        mode: ShflMode,
        d: u32,
        p: u32,
        a: u32,
        b: u32,
        c: u32,
        mask: u32,
    },
    Vote {
        mode: VoteMode,
        d: u32,
        a: u32,
        aneg: bool,
        mask: u32,
    },
    Redux {
        op: ReduxOp,
        signed: bool,
        d: u32,
        a: u32,
        mask: u32,
    },
    Match {
        all: bool,
        bits: u32,
        d: u32,
        p: u32,
        a: u32,
        mask: u32,
    },
    Activemask {
        d: u32,
    },
    Elect {
        d: u32,
        p: u32,
        mask: u32,
    },
    /// `bar.warp.sync mask`
    WarpSync {
        mask: u32,
    },
    Fence,
    Exit,
    /// Call a device function: a new frame per lane (arguments copied in, registers of a
    /// recursive callee saved), then jump.
    Call(Box<CallSite>),
    /// Return from a device function (exits the thread at the outermost level).
    Ret,
    /// After a call returns: copy the callee's return values out of its (popped) frame.
    CallRet(Box<Vec<ParamCopy>>),
    /// Integer arithmetic reading and/or writing the carry flag `CC.CF`.
    Carry(CarryOp),
    /// CUDA's device-side `printf` (`vprintf(format, args)`): the two arguments and the result
    /// live in local-memory parameter variables.
    Vprintf {
        fmt: Place,
        args: Place,
        ret: Option<Place>,
    },
    Trap,
    /// `nanosleep t`: advances the warp's clock by `t` ns and ends its host time slice.
    Sleep {
        t: u32,
    },
    Nop,
    Mma {
        spec: Box<MmaSpec>,
        d: Vec<u32>,
        a: Vec<u32>,
        b: Vec<u32>,
        c: Vec<u32>,
    },
    Ldmatrix {
        count: u32,
        trans: bool,
        ds: Vec<u32>,
        addr: u32,
        off: i64,
        space: MSpace,
    },
    Stmatrix {
        count: u32,
        trans: bool,
        srcs: Vec<u32>,
        addr: u32,
        off: i64,
        space: MSpace,
    },
    CpAsync {
        dst: u32,
        doff: i64,
        src: u32,
        soff: i64,
        size: u32,
        src_size: u32,
        dspace: MSpace,
    },
    Wgmma(Box<WgmmaOp>),
    WgmmaCommit,
    WgmmaWait {
        n: u32,
    },
    MbarInit {
        addr: u32,
        off: i64,
        count: u32,
    },
    MbarInval {
        addr: u32,
        off: i64,
    },
    /// arrive / arrive_drop / arrive.expect_tx (count and tx are slots or NONE).
    MbarArrive {
        d: u32,
        addr: u32,
        off: i64,
        count: u32,
        tx: u32,
        drop: bool,
        remote: bool,
    },
    MbarTx {
        addr: u32,
        off: i64,
        bytes: u32,
        complete: bool,
    },
    MbarWait {
        d: u32,
        addr: u32,
        off: i64,
        arg: u32,
        parity: bool,
    },
    MbarPending {
        d: u32,
        state: u32,
    },
    /// cp.async.bulk (non-tensor): `size` bytes; `mbar` completes on arrival when set.
    Bulk {
        dst: u32,
        doff: i64,
        dspace: MSpace,
        src: u32,
        soff: i64,
        sspace: MSpace,
        size: u32,
        mbar: Option<(u32, i64)>,
    },
    /// cp.async.bulk.tensor load (global -> shared) or store (shared -> global).
    BulkTensor {
        load: bool,
        smem: u32,
        soff: i64,
        tmap: u32,
        toff: i64,
        tspace: MSpace,
        coords: Vec<u32>,
        mbar: Option<(u32, i64)>,
        /// Multicast destination CTAs (bit per cluster rank); 0 = this CTA only.
        cta_mask: u32,
    },
    Setmaxnreg {
        inc: bool,
        n: u32,
    },
    /// `mapa`: address of the same shared location in CTA `b` of the cluster.
    Mapa {
        generic: bool,
        d: u32,
        a: u32,
        b: u32,
    },
    Getctarank {
        d: u32,
        a: u32,
    },
    ClusterArrive,
    ClusterWait,
}

/// A decoded `wgmma.mma_async`.
#[derive(Clone, Debug)]
pub struct WgmmaOp {
    pub spec: crate::hopper::WgmmaSpec,
    pub d: Vec<u32>,
    /// A descriptor slot, or A fragment registers.
    pub a_desc: u32,
    pub a: Vec<u32>,
    pub b_desc: u32,
    /// Predicate slot: accumulate into D when true.
    pub scale_d: u32,
    pub neg_a: bool,
    pub neg_b: bool,
    pub trans_a: bool,
    pub trans_b: bool,
}

/// One decoded instruction with its guard and source position.
#[derive(Clone, Debug)]
pub struct Inst {
    pub op: Op,
    /// Guard predicate slot (`NONE` for unguarded) and whether it is negated.
    pub guard: u32,
    pub guard_neg: bool,
    /// Index into [`Program::source`].
    pub src: u32,
    /// Executing it is progress another warp could observe ([`Op::makes_progress`]).
    pub progress: bool,
}

impl Op {
    /// Whether executing this changes state other warps can observe: memory writes, copies,
    /// barrier and mbarrier arrivals, exits. A round of a worker in which nothing but waiting
    /// and none of these happened is quiet (`crate::clock`).
    pub fn makes_progress(&self) -> bool {
        matches!(
            self,
            Op::St { .. }
                | Op::Atom { .. }
                | Op::Stmatrix { .. }
                | Op::Bulk { .. }
                | Op::BulkTensor { .. }
                | Op::CpAsync { .. }
                | Op::MbarInit { .. }
                | Op::MbarArrive { .. }
                | Op::MbarTx { .. }
                | Op::Bar { .. }
                | Op::ClusterArrive
                | Op::Exit
                | Op::Vprintf { .. }
        )
    }
}

/// Kernel parameter layout.
#[derive(Clone, Debug)]
pub struct ParamSlot {
    pub name: String,
    pub ty: Ty,
    pub offset: u32,
    pub size: u32,
}

/// A decoded kernel.
#[derive(Clone, Debug)]
pub struct Program {
    pub name: String,
    pub insts: Vec<Inst>,
    /// The IR instruction each decoded instruction came from (for diagnostics).
    pub source: Vec<Instruction>,
    pub nregs: u32,
    /// (slot, value) pairs splatted into every warp's register file at start.
    pub consts: Vec<(u32, u64)>,
    /// Bit width of each register slot (loads sign-extend to it).
    pub reg_bits: Vec<u8>,
    pub params: Vec<ParamSlot>,
    pub param_bytes: u32,
    /// Static shared memory bytes; dynamic shared memory starts at `dyn_shared_offset`.
    pub static_shared: u32,
    pub dyn_shared_offset: u32,
    pub uses_dyn_shared: bool,
    /// Local memory per thread.
    pub local_bytes: u32,
    pub reqntid: Option<[u32; 3]>,
    pub maxntid: Option<[u32; 3]>,
    pub target_sm: u32,
}

impl Program {
    /// The PTX source line of instruction `pc` (0 when unknown).
    pub fn line_of(&self, pc: u32) -> u32 {
        self.insts
            .get(pc as usize)
            .and_then(|i| self.source.get(i.src as usize))
            .map_or(0, |s| s.loc.line)
    }
}

/// Where a module-scope symbol lives.
#[derive(Clone, Copy, Debug)]
pub enum SymAddr {
    /// Global or const variable at an absolute address.
    Global(u64),
    /// Shared-window offset.
    Shared(u32),
}

struct Decoder<'a> {
    f: &'a Function,
    module: &'a Module,
    globals: &'a HashMap<String, SymAddr>,
    prog: Program,
    scopes: Vec<HashMap<String, u32>>,
    consts: HashMap<u64, u32>,
    labels: HashMap<String, u32>,
    tables: HashMap<String, Vec<String>>,
    /// (inst index, label) fixups for branches.
    fixups: Vec<(usize, Vec<String>)>,
    shared_syms: HashMap<String, u32>,
    local_syms: HashMap<String, u32>,
    param_syms: HashMap<String, u32>,
    pending: Vec<String>,
    /// Call sites: (inst index, caller (None: the kernel), callee).
    call_fixups: Vec<(usize, Option<String>, String)>,
    /// Are we decoding a `.func` body (ret returns) or the kernel (ret exits)?
    in_func: bool,
    /// The frame of the device function being decoded (None in the kernel).
    frame: Option<call::Frame>,
    /// Decoded device functions.
    func_info: HashMap<String, call::FuncInfo>,
    /// The device function being decoded (None: the kernel).
    current: Option<String>,
    /// The slot of the carry flag `CC.CF` (allocated on first use).
    cc_slot: Option<u32>,
    /// Registers of the `.reg` parameters of device functions (see `call`).
    reg_params: HashMap<String, Vec<Option<u32>>>,
}

fn elem_size(t: Ty) -> u32 {
    t.size()
}

impl<'a> Decoder<'a> {
    fn err(&self, ins: &Instruction, why: impl Into<String>) -> EmuError {
        EmuError::Unsupported {
            kernel: self.f.name.clone(),
            line: ins.loc.line,
            text: ins.to_string(),
            why: why.into(),
        }
    }

    fn new_slot(&mut self, bits: u8) -> u32 {
        let s = self.prog.nregs;
        self.prog.nregs += 1;
        self.prog.reg_bits.push(bits);
        s
    }

    fn konst(&mut self, v: u64) -> u32 {
        if v == 0 {
            return ZERO;
        }
        if let Some(&s) = self.consts.get(&v) {
            return s;
        }
        let s = self.new_slot(64);
        self.consts.insert(v, s);
        self.prog.consts.push((s, v));
        s
    }

    fn lookup(&self, name: &str) -> Option<u32> {
        self.scopes.iter().rev().find_map(|s| s.get(name).copied())
    }

    /// The innermost register scope (the function scope is always there; recreated if not).
    fn innermost(&mut self) -> &mut HashMap<String, u32> {
        if self.scopes.is_empty() {
            self.scopes.push(HashMap::new());
        }
        let i = self.scopes.len() - 1;
        &mut self.scopes[i]
    }

    fn declare(&mut self, d: &ptx::RegDecl) {
        let bits = if d.ty == Ty::Pred {
            1
        } else {
            (d.ty.size() * 8).min(64) as u8
        };
        for n in &d.names {
            match n.count {
                None => {
                    let lanes = d.vec.unwrap_or(1);
                    let s = self.new_slot(bits);
                    for _ in 1..lanes {
                        self.new_slot(bits);
                    }
                    self.innermost().insert(n.name.clone(), s);
                }
                Some(c) => {
                    for i in 0..c {
                        let s = self.new_slot(bits);
                        self.innermost().insert(format!("{}{}", n.name, i), s);
                    }
                }
            }
        }
    }

    /// Address of a symbol used as a value or as the base of `[sym+off]`.
    fn sym_value(&self, ins: &Instruction, name: &str) -> Result<(u64, MSpace), EmuError> {
        if let Some(&o) = self.local_syms.get(name) {
            return Ok((o as u64, MSpace::Local));
        }
        if let Some(&o) = self.param_syms.get(name) {
            return Ok((o as u64, MSpace::Param));
        }
        if let Some(&o) = self.shared_syms.get(name) {
            return Ok((o as u64, MSpace::Shared));
        }
        match self.globals.get(name) {
            Some(SymAddr::Global(a)) => Ok((*a, MSpace::Global)),
            Some(SymAddr::Shared(o)) => Ok((*o as u64, MSpace::Shared)),
            None => Err(self.err(ins, format!("unknown symbol `{name}`"))),
        }
    }

    /// A source operand as a register slot (immediates and symbols become constant slots).
    fn src(&mut self, ins: &Instruction, o: &Operand) -> Result<u32, EmuError> {
        match o {
            Operand::Reg(r) => self
                .lookup(r)
                .ok_or_else(|| self.err(ins, format!("undeclared register `{r}`"))),
            Operand::Imm(i) => Ok(self.konst(i.bits())),
            Operand::Sym { name, offset } if self.frame_off(name).is_some() => {
                let off = self.frame_off(name).unwrap_or(0) as i64 + *offset;
                Ok(self.frame_addr(ins, off))
            }
            Operand::Sym { name, offset } => {
                let (a, _) = self.sym_value(ins, name)?;
                Ok(self.konst(a.wrapping_add(*offset as u64)))
            }
            Operand::SReg(_) | Operand::Not(_) => {
                Err(self.err(ins, "internal: operand needs materialising"))
            }
            Operand::Sink => Ok(self.new_slot(64)),
            _ => Err(self.err(ins, format!("unexpected operand {o:?}"))),
        }
    }

    /// A destination operand.
    fn dst(&mut self, ins: &Instruction, o: &Operand) -> Result<u32, EmuError> {
        match o {
            Operand::Reg(r) => self
                .lookup(r)
                .ok_or_else(|| self.err(ins, format!("undeclared register `{r}`"))),
            Operand::Sink => Ok(self.new_slot(64)),
            _ => Err(self.err(ins, format!("bad destination {o:?}"))),
        }
    }

    fn vec_dsts(&mut self, ins: &Instruction, o: &Operand) -> Result<Vec<u32>, EmuError> {
        match o {
            Operand::Vec(v) => v.iter().map(|x| self.dst(ins, x)).collect(),
            x => Ok(vec![self.dst(ins, x)?]),
        }
    }
    fn vec_srcs(&mut self, ins: &Instruction, o: &Operand) -> Result<Vec<u32>, EmuError> {
        match o {
            Operand::Vec(v) => v.iter().map(|x| self.src(ins, x)).collect(),
            x => Ok(vec![self.src(ins, x)?]),
        }
    }

    /// An address operand `[base+off]` -> (slot, offset, space implied by a symbol base).
    fn addr(
        &mut self,
        ins: &Instruction,
        o: &Operand,
    ) -> Result<(u32, i64, Option<MSpace>), EmuError> {
        match o {
            Operand::Addr {
                base: AddrBase::Reg(r),
                offset,
            } => {
                let s = self
                    .lookup(r)
                    .ok_or_else(|| self.err(ins, format!("undeclared register `{r}`")))?;
                Ok((s, *offset, None))
            }
            Operand::Addr {
                base: AddrBase::Sym(n),
                offset,
            } if self.frame_off(n).is_some() => {
                let (slot, off) = self.frame_place(n).unwrap_or((ZERO, 0));
                Ok((slot, off as i64 + *offset, Some(MSpace::Local)))
            }
            Operand::Addr {
                base: AddrBase::Sym(n),
                offset,
            } => {
                let (a, sp) = self.sym_value(ins, n)?;
                Ok((ZERO, (a as i64).wrapping_add(*offset), Some(sp)))
            }
            Operand::Addr {
                base: AddrBase::Imm(a),
                offset,
            } => Ok((ZERO, (*a as i64).wrapping_add(*offset), None)),
            // Some compilers pass a plain register where an address is expected (cp.async.bulk).
            Operand::Reg(_) => Ok((self.src(ins, o)?, 0, None)),
            _ => Err(self.err(ins, format!("expected an address, found {o:?}"))),
        }
    }

    fn space_of(&self, ins: &Instruction) -> MSpace {
        match ins.space() {
            Some(Space::Global) | Some(Space::Const) => MSpace::Global,
            Some(s) if s.is_shared() => MSpace::Shared,
            Some(Space::Local) => MSpace::Local,
            Some(s) if s.is_param() => MSpace::Param,
            _ => MSpace::Generic,
        }
    }

    /// The space of an access: a symbol base decides for `.param` variables that live in local
    /// memory (call arguments) and for accesses without a state space.
    fn resolve_space(&self, ins: &Instruction, sym: Option<MSpace>) -> MSpace {
        match (sym, ins.space()) {
            (Some(MSpace::Local), Some(s)) if s.is_param() || s == Space::Local => MSpace::Local,
            (Some(sp), None) => sp,
            _ => self.space_of(ins),
        }
    }

    fn ord_of(&self, ins: &Instruction) -> Ord {
        if ins.has(Flag::AcqRel) {
            Ord::AcqRel
        } else if ins.has(Flag::Acquire) || ins.has(Flag::Volatile) && ins.op == Opcode::Ld {
            Ord::Acquire
        } else if ins.has(Flag::Release) || ins.has(Flag::Volatile) && ins.op == Opcode::St {
            Ord::Release
        } else {
            Ord::Relaxed
        }
    }

    fn push(&mut self, op: Op, ins: &Instruction, guard: (u32, bool)) {
        self.prog.insts.push(Inst {
            progress: op.makes_progress(),
            op,
            guard: guard.0,
            guard_neg: guard.1,
            src: self.prog.source.len() as u32,
        });
        self.prog.source.push(ins.clone());
    }

    /// Makes every source operand a plain register: special registers and negated predicates
    /// are materialised into temporaries by extra instructions.
    fn materialise(
        &mut self,
        ins: &Instruction,
        guard: (u32, bool),
    ) -> Result<Instruction, EmuError> {
        let mut out = ins.clone();
        let nd = ins.op.info().dsts as usize;
        for (i, a) in out.args.iter_mut().enumerate() {
            if i < nd {
                continue;
            }
            self.materialise_operand(ins, a, guard)?;
        }
        Ok(out)
    }

    fn materialise_operand(
        &mut self,
        ins: &Instruction,
        a: &mut Operand,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        match a {
            Operand::SReg(r) => {
                let t = self.new_slot(64);
                let r = *r;
                self.push(Op::SReg { d: t, r }, ins, guard);
                *a = Operand::Reg(self.temp_name(t));
            }
            Operand::Not(inner) => {
                if let Operand::Reg(r) = inner.as_ref() {
                    let s = self
                        .lookup(r)
                        .ok_or_else(|| self.err(ins, format!("undeclared register `{r}`")))?;
                    let t = self.new_slot(1);
                    self.push(
                        Op::Alu {
                            f: alu::pred_not(),
                            d: t,
                            a: s,
                            b: ZERO,
                            c: ZERO,
                        },
                        ins,
                        guard,
                    );
                    *a = Operand::Reg(self.temp_name(t));
                }
            }
            Operand::Vec(v) => {
                for x in v.iter_mut() {
                    self.materialise_operand(ins, x, guard)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn temp_name(&mut self, slot: u32) -> String {
        let n = format!("%__t{slot}");
        self.scopes[0].insert(n.clone(), slot);
        n
    }
}

/// Decodes one kernel of a module. `globals` maps module-scope variables to their addresses
/// (allocated by the loader).
pub fn decode(
    module: &Module,
    kernel: &str,
    globals: &HashMap<String, SymAddr>,
) -> Result<Program, EmuError> {
    let f = module
        .entries()
        .find(|f| f.name == kernel)
        .ok_or_else(|| EmuError::NoSuchKernel(kernel.to_string()))?;
    let body = f.body.as_ref().ok_or_else(|| EmuError::Decode {
        kernel: kernel.to_string(),
        msg: "kernel has no body".into(),
    })?;
    let mut params = Vec::new();
    let mut off = 0u32;
    let mut param_syms = HashMap::new();
    for p in &f.params {
        let align = p.alignment().max(1) as u32;
        off = off.div_ceil(align) * align;
        let size = p.size_bytes() as u32;
        params.push(ParamSlot {
            name: p.name.clone(),
            ty: p.ty,
            offset: off,
            size,
        });
        param_syms.insert(p.name.clone(), off);
        off += size;
    }
    let dir3 = |v: &Vec<u32>| {
        let mut a = [1u32; 3];
        for (i, x) in v.iter().take(3).enumerate() {
            a[i] = *x;
        }
        a
    };
    let mut reqntid = None;
    let mut maxntid = None;
    for d in &f.directives {
        match d {
            ptx::PerfDirective::Reqntid(v) => reqntid = Some(dir3(v)),
            ptx::PerfDirective::Maxntid(v) => maxntid = Some(dir3(v)),
            _ => {}
        }
    }
    let prog = Program {
        name: f.name.clone(),
        insts: Vec::new(),
        source: Vec::new(),
        nregs: 0,
        consts: Vec::new(),
        reg_bits: Vec::new(),
        params,
        param_bytes: off,
        static_shared: 0,
        dyn_shared_offset: 0,
        uses_dyn_shared: false,
        local_bytes: 0,
        reqntid,
        maxntid,
        target_sm: module.target.sm(),
    };
    let mut d = Decoder {
        f,
        module,
        globals,
        prog,
        scopes: vec![HashMap::new()],
        consts: HashMap::new(),
        labels: HashMap::new(),
        tables: HashMap::new(),
        fixups: Vec::new(),
        shared_syms: HashMap::new(),
        local_syms: HashMap::new(),
        param_syms,
        pending: Vec::new(),
        call_fixups: Vec::new(),
        in_func: false,
        frame: None,
        func_info: HashMap::new(),
        current: None,
        cc_slot: None,
        reg_params: HashMap::new(),
    };
    d.new_slot(64); // ZERO
    d.layout_shared(body);
    d.block(body)?;
    // The kernel ends: falling off the end exits.
    d.prog.insts.push(Inst {
        progress: true,
        op: Op::Exit,
        guard: NONE,
        guard_neg: false,
        src: d.prog.source.len() as u32,
    });
    d.prog
        .source
        .push(Instruction::new(Opcode::Exit, vec![], vec![]));
    d.resolve_labels(kernel)?;
    d.decode_functions()?;
    Ok(d.prog)
}

impl<'a> Decoder<'a> {
    fn alloc_local(&mut self, size: u32, align: u32) -> u32 {
        let align = align.max(1);
        let off = self.prog.local_bytes.div_ceil(align) * align;
        self.prog.local_bytes = (off + size).div_ceil(8) * 8;
        off
    }

    fn resolve_labels(&mut self, kernel: &str) -> Result<(), EmuError> {
        let d = self;
        let fixups = std::mem::take(&mut d.fixups);
        for (i, labels) in fixups {
            let mut pcs = Vec::new();
            for l in &labels {
                let targets = if let Some(t) = d.tables.get(l) {
                    t.clone()
                } else {
                    vec![l.clone()]
                };
                for t in targets {
                    let pc = *d.labels.get(&t).ok_or_else(|| EmuError::Decode {
                        kernel: kernel.to_string(),
                        msg: format!("branch to unknown label `{t}`"),
                    })?;
                    pcs.push(pc);
                }
            }
            match &mut d.prog.insts[i].op {
                Op::Bra { target } => *target = pcs[0],
                Op::BrxIdx { targets, .. } => *targets = pcs,
                _ => {}
            }
        }
        Ok(())
    }
}

impl<'a> Decoder<'a> {
    /// Assigns shared-window offsets to module and function shared variables, and local offsets
    /// to `.local` variables.
    fn layout_shared(&mut self, body: &[Statement]) {
        let mut off = 0u32;
        let mut dyn_align = 16u32;
        let mut dyn_names = Vec::new();
        let mut place = |v: &ptx::VarDecl, off: &mut u32, map: &mut HashMap<String, u32>| {
            let align = v.align.unwrap_or(v.ty.size()).max(1);
            if v.dims.iter().any(|d| d.is_none()) {
                dyn_align = dyn_align.max(align);
                dyn_names.push(v.name.clone());
                return;
            }
            *off = off.div_ceil(align) * align;
            map.insert(v.name.clone(), *off);
            *off += v.size_bytes() as u32;
        };
        let mut shared = HashMap::new();
        for g in self.module.globals() {
            if g.space.is_shared() {
                place(g, &mut off, &mut shared);
            }
        }
        let mut local_off = 0u32;
        let mut locals = HashMap::new();
        fn walk(b: &[Statement], f: &mut dyn FnMut(&ptx::VarDecl)) {
            for s in b {
                match s {
                    Statement::Var(v) => f(v),
                    Statement::Block(b) => walk(b, f),
                    _ => {}
                }
            }
        }
        let mut fvars = Vec::new();
        walk(body, &mut |v| fvars.push(v.clone()));
        for v in &fvars {
            if v.space.is_shared() {
                place(v, &mut off, &mut shared);
            } else if v.space == Space::Local {
                let align = v.align.unwrap_or(v.ty.size()).max(1);
                local_off = local_off.div_ceil(align) * align;
                locals.insert(v.name.clone(), local_off);
                local_off += v.size_bytes() as u32;
            }
        }
        let dyn_off = off.div_ceil(dyn_align) * dyn_align;
        for n in &dyn_names {
            shared.insert(n.clone(), dyn_off);
        }
        self.prog.static_shared = off;
        self.prog.dyn_shared_offset = dyn_off;
        self.prog.uses_dyn_shared = !dyn_names.is_empty();
        self.prog.local_bytes = local_off.div_ceil(8) * 8;
        self.shared_syms = shared;
        self.local_syms = locals;
    }

    fn block(&mut self, b: &[Statement]) -> Result<(), EmuError> {
        for s in b {
            match s {
                Statement::Reg(r) => self.declare(r),
                Statement::Label(l, _) => {
                    self.labels.insert(l.clone(), self.prog.insts.len() as u32);
                }
                Statement::Block(inner) => {
                    self.scopes.push(HashMap::new());
                    self.block(inner)?;
                    self.scopes.pop();
                }
                Statement::Instr(i) => self.instruction(i)?,
                Statement::BranchTargets { label, targets } => {
                    self.tables.insert(label.clone(), targets.clone());
                }
                Statement::Var(v) if v.space == Space::Param => {
                    // Call-site argument / return variables live in per-thread local memory:
                    // the kernel's static local memory, or the frame of a device function.
                    let align = v.align.unwrap_or(v.ty.size());
                    if let Some(fr) = &mut self.frame {
                        fr.alloc(&v.name, v.size_bytes() as u32, align);
                    } else {
                        let off = self.alloc_local(v.size_bytes() as u32, align);
                        self.local_syms.insert(v.name.clone(), off);
                    }
                }
                Statement::Var(_) | Statement::Pragma(_) | Statement::CallPrototype { .. } => {}
            }
        }
        Ok(())
    }

    fn instruction(&mut self, ins0: &Instruction) -> Result<(), EmuError> {
        let guard = match &ins0.guard {
            Some(g) => {
                let s = self
                    .lookup(&g.reg)
                    .ok_or_else(|| self.err(ins0, format!("undeclared guard `{}`", g.reg)))?;
                (s, g.negated)
            }
            None => (NONE, false),
        };
        let ins = &self.materialise(ins0, guard)?;
        if let Some(op) = self.carry(ins)? {
            self.push(op, ins0, guard);
            return Ok(());
        }
        let a = &ins.args;
        let arg = |i: usize| -> Result<&Operand, EmuError> {
            a.get(i).ok_or_else(|| EmuError::Unsupported {
                kernel: self.f.name.clone(),
                line: ins.loc.line,
                text: ins.to_string(),
                why: format!("missing operand {i}"),
            })
        };
        let ty = ins.ty();
        use Opcode as O;
        let op = match ins.op {
            O::Mov => {
                let t = ty.ok_or_else(|| self.err(ins, "mov without type"))?;
                match (arg(0)?, arg(1)?) {
                    (Operand::Vec(ds), src) => {
                        let src = self.src(ins, src)?;
                        let ds = ds
                            .iter()
                            .map(|x| self.dst(ins, x))
                            .collect::<Result<Vec<_>, _>>()?;
                        let part_bits = t.bits() / ds.len() as u32;
                        Op::Unpack {
                            part_bits,
                            ds,
                            a: src,
                        }
                    }
                    (dst, Operand::Vec(parts)) => {
                        let d = self.dst(ins, dst)?;
                        let parts = parts
                            .iter()
                            .map(|x| self.src(ins, x))
                            .collect::<Result<Vec<_>, _>>()?;
                        let part_bits = t.bits() / parts.len() as u32;
                        Op::Pack {
                            part_bits,
                            d,
                            parts,
                        }
                    }
                    (dst, src) => {
                        let d = self.dst(ins, dst)?;
                        let s = self.src(ins, src)?;
                        Op::Alu {
                            f: alu::mov(if t == Ty::Pred { 1 } else { t.size() }),
                            d,
                            a: s,
                            b: ZERO,
                            c: ZERO,
                        }
                    }
                }
            }
            O::Ld | O::Ldu => {
                let t = ins
                    .last_ty()
                    .ok_or_else(|| self.err(ins, "ld without type"))?;
                let ds = self.vec_dsts(ins, arg(0)?)?;
                let (addr, off, sym_space) = self.addr(ins, arg(1)?)?;
                let space = self.resolve_space(ins, sym_space);
                if t == Ty::B128 {
                    return Err(self.err(ins, "128-bit scalar loads are not supported"));
                }
                Op::Ld {
                    space,
                    elem: elem_size(t),
                    sext: t.is_signed(),
                    ds,
                    addr,
                    off,
                    ord: self.ord_of(ins),
                }
            }
            O::St => {
                let t = ins
                    .last_ty()
                    .ok_or_else(|| self.err(ins, "st without type"))?;
                let (addr, off, sym_space) = self.addr(ins, arg(0)?)?;
                let srcs = self.vec_srcs(ins, arg(1)?)?;
                let space = self.resolve_space(ins, sym_space);
                if space == MSpace::Param {
                    return Err(self.err(ins, "stores to the parameter space are not supported"));
                }
                Op::St {
                    space,
                    elem: elem_size(t),
                    srcs,
                    addr,
                    off,
                    ord: self.ord_of(ins),
                }
            }
            O::Atom | O::Red => {
                let t = ins
                    .last_ty()
                    .ok_or_else(|| self.err(ins, "atom without type"))?;
                let aop = [
                    (Flag::Add, AtomOp::Add),
                    (Flag::Min, AtomOp::Min),
                    (Flag::Max, AtomOp::Max),
                    (Flag::Inc, AtomOp::Inc),
                    (Flag::Dec, AtomOp::Dec),
                    (Flag::And, AtomOp::And),
                    (Flag::Or, AtomOp::Or),
                    (Flag::Xor, AtomOp::Xor),
                    (Flag::Exch, AtomOp::Exch),
                    (Flag::Cas, AtomOp::Cas),
                ]
                .iter()
                .find(|(f, _)| ins.has(*f))
                .map(|x| x.1)
                .ok_or_else(|| self.err(ins, "atom without operation"))?;
                if ins.vec_width().is_some() {
                    return Err(self.err(ins, "vector atomics are not supported"));
                }
                let (d, rest) = if ins.op == O::Atom {
                    (self.dst(ins, arg(0)?)?, 1)
                } else {
                    (NONE, 0)
                };
                let (addr, off, sym_space) = self.addr(ins, arg(rest)?)?;
                let b = self.src(ins, arg(rest + 1)?)?;
                let c = if aop == AtomOp::Cas {
                    self.src(ins, arg(rest + 2)?)?
                } else {
                    ZERO
                };
                let space = self.resolve_space(ins, sym_space);
                let ord = match self.ord_of(ins) {
                    Ord::Relaxed if !ins.has(Flag::Relaxed) => Ord::Relaxed,
                    o => o,
                };
                Op::Atom {
                    space,
                    op: aop,
                    ty: t,
                    d,
                    addr,
                    off,
                    b,
                    c,
                    ord,
                }
            }
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
                if ty.is_some_and(|t| t.is_float()) =>
            {
                let t = ty.unwrap_or(Ty::F32);
                let d = self.dst(ins, arg(0)?)?;
                let s: Vec<u32> = a[1..]
                    .iter()
                    .map(|x| self.src(ins, x))
                    .collect::<Result<_, _>>()?;
                let get = |i: usize| s.get(i).copied().unwrap_or(ZERO);
                let plain = !ins.mods.iter().any(|m| {
                    matches!(
                        m,
                        Mod::Flag(
                            Flag::Rz
                                | Flag::Rm
                                | Flag::Rp
                                | Flag::Ftz
                                | Flag::Sat
                                | Flag::Relu
                                | Flag::NaN
                                | Flag::Xorsign
                        )
                    )
                });
                if t == Ty::F32 && plain {
                    if let Some(f) = alu::f32_fast(ins.op) {
                        self.push(
                            Op::Alu {
                                f,
                                d,
                                a: get(0),
                                b: get(1),
                                c: get(2),
                            },
                            ins0,
                            guard,
                        );
                        return Ok(());
                    }
                }
                // Round-to-nearest f32 with or without .ftz: fast, exact or within bounds.
                let only_ftz = !ins.mods.iter().any(|m| {
                    matches!(
                        m,
                        Mod::Flag(
                            Flag::Rz
                                | Flag::Rm
                                | Flag::Rp
                                | Flag::Sat
                                | Flag::Relu
                                | Flag::NaN
                                | Flag::Xorsign
                        )
                    )
                });
                // `div.f32` without .rn/.full/.approx is left to the exact unit.
                let div_mode = ins
                    .mods
                    .iter()
                    .any(|m| matches!(m, Mod::Flag(Flag::Rn | Flag::Full | Flag::Approx)));
                if t == Ty::F32 && only_ftz && (ins.op != O::Div || div_mode) {
                    if let Some(f) = alu::f32_special(ins.op, ins.has(Flag::Ftz)) {
                        self.push(
                            Op::Alu {
                                f,
                                d,
                                a: get(0),
                                b: get(1),
                                c: get(2),
                            },
                            ins0,
                            guard,
                        );
                        return Ok(());
                    }
                }
                let fop = match ins.op {
                    O::Add => FOp::Add,
                    O::Sub => FOp::Sub,
                    O::Mul => FOp::Mul,
                    O::Mad | O::Fma => FOp::Fma,
                    O::Min => FOp::Min,
                    O::Max => FOp::Max,
                    O::Neg => FOp::Neg,
                    O::Abs => FOp::Abs,
                    O::Div => FOp::Div,
                    O::Rcp => FOp::Rcp,
                    O::Sqrt => FOp::Sqrt,
                    O::Rsqrt => FOp::Rsqrt,
                    O::Sin => FOp::Sin,
                    O::Cos => FOp::Cos,
                    O::Lg2 => FOp::Lg2,
                    O::Ex2 => FOp::Ex2,
                    O::Tanh => FOp::Tanh,
                    _ => FOp::Copysign,
                };
                Op::Float {
                    op: fop,
                    ty: t,
                    mode: FMode::from_instruction(ins),
                    d,
                    a: get(0),
                    b: get(1),
                    c: get(2),
                }
            }
            O::Div | O::Rem => {
                let t = ty.ok_or_else(|| self.err(ins, "div without type"))?;
                let d = self.dst(ins, arg(0)?)?;
                let (x, y) = (self.src(ins, arg(1)?)?, self.src(ins, arg(2)?)?);
                Op::IntDiv {
                    ty: t,
                    rem: ins.op == O::Rem,
                    d,
                    a: x,
                    b: y,
                }
            }
            O::Bfi => {
                let t = ty.ok_or_else(|| self.err(ins, "bfi without type"))?;
                let d = self.dst(ins, arg(0)?)?;
                let s: Vec<u32> = a[1..5.min(a.len())]
                    .iter()
                    .map(|x| self.src(ins, x))
                    .collect::<Result<_, _>>()?;
                if s.len() != 4 {
                    return Err(self.err(ins, "bfi needs four sources"));
                }
                Op::Bfi {
                    bits: t.bits(),
                    d,
                    a: s[0],
                    b: s[1],
                    c: s[2],
                    e: s[3],
                }
            }
            O::Shf => {
                let d = self.dst(ins, arg(0)?)?;
                let (x, y, z) = (
                    self.src(ins, arg(1)?)?,
                    self.src(ins, arg(2)?)?,
                    self.src(ins, arg(3)?)?,
                );
                Op::Shf {
                    left: ins.has(Flag::L),
                    wrap: ins.has(Flag::Wrap),
                    d,
                    a: x,
                    b: y,
                    c: z,
                }
            }
            O::Lop3 => {
                let d = self.dst(ins, arg(0)?)?;
                let (x, y, z) = (
                    self.src(ins, arg(1)?)?,
                    self.src(ins, arg(2)?)?,
                    self.src(ins, arg(3)?)?,
                );
                let lut = match arg(4)? {
                    Operand::Imm(i) => i.bits() as u8,
                    _ => return Err(self.err(ins, "lop3 needs an immediate LUT")),
                };
                Op::Lop3 {
                    lut,
                    d,
                    a: x,
                    b: y,
                    c: z,
                }
            }
            O::Setp | O::Set => {
                let tys: Vec<Ty> = ins.types().collect();
                let cmp_ty = *tys
                    .last()
                    .ok_or_else(|| self.err(ins, "setp without type"))?;
                let cmp = ins
                    .mods
                    .iter()
                    .find_map(|m| match m {
                        Mod::Flag(
                            f @ (Flag::Eq
                            | Flag::Ne
                            | Flag::Lt
                            | Flag::Le
                            | Flag::Gt
                            | Flag::Ge
                            | Flag::Lo
                            | Flag::Ls
                            | Flag::Hi
                            | Flag::Hs
                            | Flag::Equ
                            | Flag::Neu
                            | Flag::Ltu
                            | Flag::Leu
                            | Flag::Gtu
                            | Flag::Geu
                            | Flag::Num
                            | Flag::Nan),
                        ) => Some(*f),
                        _ => None,
                    })
                    .ok_or_else(|| self.err(ins, "comparison operator missing"))?;
                let f = if cmp_ty.is_float() {
                    alu::float_cmp(cmp_ty, cmp)
                } else {
                    alu::int_cmp(cmp_ty, cmp)
                };
                let f = f.ok_or_else(|| self.err(ins, "unsupported comparison type"))?;
                let combine = [Flag::And, Flag::Or, Flag::Xor]
                    .into_iter()
                    .find(|f| ins.has(*f));
                let (d0, d1) = match arg(0)? {
                    Operand::Pair(p, q) => (self.dst(ins, p)?, Some(self.dst(ins, q)?)),
                    o => (self.dst(ins, o)?, None),
                };
                let x = self.src(ins, arg(1)?)?;
                let y = self.src(ins, arg(2)?)?;
                let c = if combine.is_some() {
                    self.src(ins, arg(3)?)?
                } else {
                    ZERO
                };
                let t = self.new_slot(1);
                self.push(
                    Op::Alu {
                        f,
                        d: t,
                        a: x,
                        b: y,
                        c: ZERO,
                    },
                    ins0,
                    guard,
                );
                let comb = combine.unwrap_or(Flag::Rn);
                if ins.op == O::Set {
                    let t2 = self.new_slot(1);
                    self.push(
                        Op::Alu {
                            f: alu::bool_combine(comb, false),
                            d: t2,
                            a: t,
                            b: c,
                            c: ZERO,
                        },
                        ins0,
                        guard,
                    );
                    let float = tys.first() == Some(&Ty::F32);
                    Op::Alu {
                        f: alu::set_result(float),
                        d: d0,
                        a: t2,
                        b: ZERO,
                        c: ZERO,
                    }
                } else {
                    if let Some(q) = d1 {
                        self.push(
                            Op::Alu {
                                f: alu::bool_combine(comb, true),
                                d: q,
                                a: t,
                                b: c,
                                c: ZERO,
                            },
                            ins0,
                            guard,
                        );
                    }
                    Op::Alu {
                        f: alu::bool_combine(comb, false),
                        d: d0,
                        a: t,
                        b: c,
                        c: ZERO,
                    }
                }
            }
            O::Selp | O::Slct => {
                let d = self.dst(ins, arg(0)?)?;
                let (x, y, z) = (
                    self.src(ins, arg(1)?)?,
                    self.src(ins, arg(2)?)?,
                    self.src(ins, arg(3)?)?,
                );
                let f = if ins.op == O::Selp {
                    alu::selp()
                } else {
                    alu::slct(ins.last_ty() == Some(Ty::F32))
                };
                Op::Alu {
                    f,
                    d,
                    a: x,
                    b: y,
                    c: z,
                }
            }
            O::Cvt => {
                let spec = CvtSpec::from_instruction(ins).map_err(|e| self.err(ins, e))?;
                let d = self.dst(ins, arg(0)?)?;
                let x = self.src(ins, arg(1)?)?;
                let y = match a.get(2) {
                    Some(o) => self.src(ins, o)?,
                    None => ZERO,
                };
                // A signed result narrower than its register is sign-extended to the whole
                // register (`cvt.s16.s8` into a .b32 gives 0xffffffc2 for -62): the general
                // path does that; the fast paths zero-extend.
                let widen = spec.dst.is_signed()
                    && u32::from(self.prog.reg_bits[d as usize]) > spec.dst.bits();
                if let Some(f) = alu::cvt_fast(&spec).filter(|_| !widen) {
                    self.push(
                        Op::Alu {
                            f,
                            d,
                            a: x,
                            b: y,
                            c: ZERO,
                        },
                        ins0,
                        guard,
                    );
                    return Ok(());
                }
                Op::Cvt {
                    spec,
                    d,
                    a: x,
                    b: y,
                }
            }
            O::Cvta => {
                let d = self.dst(ins, arg(0)?)?;
                let x = self.src(ins, arg(1)?)?;
                let bits = ty.map(|t| t.bits()).unwrap_or(64);
                let space = ins.space().unwrap_or(Space::Global);
                let window = if space.is_shared() {
                    crate::memory::SHARED_WINDOW
                } else if space == Space::Local {
                    crate::memory::LOCAL_WINDOW
                } else if space == Space::Global || space == Space::Const {
                    0
                } else {
                    return Err(self.err(ins, "cvta for this state space is not supported"));
                };
                let dir = if ins.has(Flag::To) {
                    CvtaDir::FromGeneric(window)
                } else {
                    CvtaDir::ToGeneric(window)
                };
                Op::Cvta { dir, d, a: x, bits }
            }
            O::Isspacep => {
                let d = self.dst(ins, arg(0)?)?;
                let x = self.src(ins, arg(1)?)?;
                Op::Isspacep {
                    space: self.space_of(ins),
                    d,
                    a: x,
                }
            }
            O::Testp => {
                let kind = fp::TestpKind::from_instruction(ins).map_err(|e| self.err(ins, e))?;
                let d = self.dst(ins, arg(0)?)?;
                let x = self.src(ins, arg(1)?)?;
                Op::Testp {
                    kind,
                    ty: ty.unwrap_or(Ty::F32),
                    d,
                    a: x,
                }
            }
            O::Bra => {
                let l = match arg(0)? {
                    Operand::Sym { name, .. } => name.clone(),
                    _ => return Err(self.err(ins, "bra needs a label")),
                };
                self.fixups.push((self.prog.insts.len(), vec![l]));
                Op::Bra { target: 0 }
            }
            O::BrxIdx => {
                let idx = self.src(ins, arg(0)?)?;
                let l = match arg(1)? {
                    Operand::Sym { name, .. } => name.clone(),
                    _ => return Err(self.err(ins, "brx.idx needs a .branchtargets label")),
                };
                self.fixups.push((self.prog.insts.len(), vec![l]));
                Op::BrxIdx {
                    idx,
                    targets: Vec::new(),
                }
            }
            O::Exit => Op::Exit,
            O::Ret => {
                if self.in_func {
                    Op::Ret
                } else {
                    Op::Exit
                }
            }
            O::Trap | O::Brkpt => Op::Trap,
            O::Nanosleep => Op::Sleep {
                t: self.src(ins, arg(0)?)?,
            },
            O::Membar | O::Fence => Op::Fence,
            O::Prefetch | O::Prefetchu | O::Discard | O::Applypriority | O::Griddepcontrol => {
                Op::Nop
            }
            O::CpAsyncCommitGroup | O::CpAsyncWaitGroup | O::CpAsyncWaitAll => Op::Nop,
            O::Createpolicy => {
                let d = self.dst(ins, arg(0)?)?;
                Op::Alu {
                    f: alu::mov(8),
                    d,
                    a: ZERO,
                    b: ZERO,
                    c: ZERO,
                }
            }
            O::Bar | O::Barrier => {
                let kind = if ins.has(Flag::Red) {
                    if ins.has(Flag::Popc) {
                        BarKind::RedPopc
                    } else if ins.has(Flag::And) {
                        BarKind::RedAnd
                    } else {
                        BarKind::RedOr
                    }
                } else if ins.has(Flag::Arrive) {
                    BarKind::Arrive
                } else {
                    BarKind::Sync
                };
                let red = matches!(kind, BarKind::RedPopc | BarKind::RedAnd | BarKind::RedOr);
                let base = if red { 1 } else { 0 };
                let d = if red { self.dst(ins, arg(0)?)? } else { NONE };
                let id = match a.get(base) {
                    Some(o) => self.src(ins, o)?,
                    None => ZERO,
                };
                let n_rest = a.len().saturating_sub(base + 1);
                let (count, p, pneg) = if red {
                    let po = &a[a.len() - 1];
                    let (po, neg) = match po {
                        Operand::Not(x) => (x.as_ref(), true),
                        x => (x, false),
                    };
                    let p = self.src(ins, po)?;
                    let count = if n_rest == 2 {
                        self.src(ins, &a[base + 1])?
                    } else {
                        NONE
                    };
                    (count, p, neg)
                } else {
                    let count = if n_rest >= 1 {
                        self.src(ins, &a[base + 1])?
                    } else {
                        NONE
                    };
                    (count, NONE, false)
                };
                Op::Bar {
                    kind,
                    id,
                    count,
                    d,
                    p,
                    pneg,
                }
            }
            O::BarWarpSync => {
                let m = self.src(ins, arg(0)?)?;
                Op::WarpSync { mask: m }
            }
            O::Shfl => {
                let mode = if ins.has(Flag::Up) {
                    ShflMode::Up
                } else if ins.has(Flag::Down) {
                    ShflMode::Down
                } else if ins.has(Flag::Bfly) {
                    ShflMode::Bfly
                } else {
                    ShflMode::Idx
                };
                let (d, p) = match arg(0)? {
                    Operand::Pair(x, y) => (self.dst(ins, x)?, self.dst(ins, y)?),
                    o => (self.dst(ins, o)?, NONE),
                };
                let x = self.src(ins, arg(1)?)?;
                let b = self.src(ins, arg(2)?)?;
                let c = self.src(ins, arg(3)?)?;
                let mask = match a.get(4) {
                    Some(o) => self.src(ins, o)?,
                    None => self.konst(0xffff_ffff),
                };
                Op::Shfl {
                    mode,
                    d,
                    p,
                    a: x,
                    b,
                    c,
                    mask,
                }
            }
            O::Vote => {
                let mode = if ins.has(Flag::Ballot) {
                    VoteMode::Ballot
                } else if ins.has(Flag::All) {
                    VoteMode::All
                } else if ins.has(Flag::Any) {
                    VoteMode::Any
                } else {
                    VoteMode::Uni
                };
                let d = self.dst(ins, arg(0)?)?;
                let (po, aneg) = match &ins0.args.get(1) {
                    Some(Operand::Not(x)) => (x.as_ref().clone(), true),
                    Some(x) => ((*x).clone(), false),
                    None => return Err(self.err(ins, "vote needs a predicate")),
                };
                let x = self.src(ins, &po)?;
                let mask = match a.get(2) {
                    Some(o) => self.src(ins, o)?,
                    None => self.konst(0xffff_ffff),
                };
                Op::Vote {
                    mode,
                    d,
                    a: x,
                    aneg,
                    mask,
                }
            }
            O::Redux => {
                let rop = [
                    (Flag::Add, ReduxOp::Add),
                    (Flag::Min, ReduxOp::Min),
                    (Flag::Max, ReduxOp::Max),
                    (Flag::And, ReduxOp::And),
                    (Flag::Or, ReduxOp::Or),
                    (Flag::Xor, ReduxOp::Xor),
                ]
                .iter()
                .find(|(f, _)| ins.has(*f))
                .map(|x| x.1)
                .ok_or_else(|| self.err(ins, "redux without operation"))?;
                let t = ty.unwrap_or(Ty::U32);
                if t.is_float() {
                    return Err(self.err(ins, "floating-point redux is not supported"));
                }
                let d = self.dst(ins, arg(0)?)?;
                let x = self.src(ins, arg(1)?)?;
                let mask = self.src(ins, arg(2)?)?;
                Op::Redux {
                    op: rop,
                    signed: t.is_signed(),
                    d,
                    a: x,
                    mask,
                }
            }
            O::Match => {
                let (d, p) = match arg(0)? {
                    Operand::Pair(x, y) => (self.dst(ins, x)?, self.dst(ins, y)?),
                    o => (self.dst(ins, o)?, NONE),
                };
                let x = self.src(ins, arg(1)?)?;
                let mask = self.src(ins, arg(2)?)?;
                Op::Match {
                    all: ins.has(Flag::All),
                    bits: ty.map(|t| t.bits()).unwrap_or(32),
                    d,
                    p,
                    a: x,
                    mask,
                }
            }
            O::Activemask => Op::Activemask {
                d: self.dst(ins, arg(0)?)?,
            },
            O::Elect => {
                let (d, p) = match arg(0)? {
                    Operand::Pair(x, y) => (self.dst(ins, x)?, self.dst(ins, y)?),
                    o => (self.dst(ins, o)?, NONE),
                };
                let mask = self.src(ins, arg(1)?)?;
                Op::Elect { d, p, mask }
            }
            O::Mma => {
                let spec = MmaSpec::from_instruction(ins).map_err(|e| self.err(ins, e))?;
                let d = self.vec_dsts(ins, arg(0)?)?;
                let x = self.vec_srcs(ins, arg(1)?)?;
                let y = self.vec_srcs(ins, arg(2)?)?;
                let z = self.vec_srcs(ins, arg(3)?)?;
                let (na, nb, nc, nd) = spec.frag_counts();
                if x.len() != na || y.len() != nb || z.len() != nc || d.len() != nd {
                    return Err(self.err(
                        ins,
                        format!("fragment register counts must be A {na}, B {nb}, C {nc}, D {nd}"),
                    ));
                }
                Op::Mma {
                    spec: Box::new(spec),
                    d,
                    a: x,
                    b: y,
                    c: z,
                }
            }
            O::Ldmatrix | O::Stmatrix => {
                let count = ins.x_count().unwrap_or(1) as u32;
                let trans = ins.has(Flag::Trans);
                let space = match self.space_of(ins) {
                    MSpace::Generic => MSpace::Generic,
                    _ => MSpace::Shared,
                };
                if ins.op == O::Ldmatrix {
                    let ds = self.vec_dsts(ins, arg(0)?)?;
                    let (addr, off, _) = self.addr(ins, arg(1)?)?;
                    if ds.len() != count as usize {
                        return Err(self.err(
                            ins,
                            format!(".x{count} needs {count} destination registers"),
                        ));
                    }
                    Op::Ldmatrix {
                        count,
                        trans,
                        ds,
                        addr,
                        off,
                        space,
                    }
                } else {
                    let (addr, off, _) = self.addr(ins, arg(0)?)?;
                    let srcs = self.vec_srcs(ins, arg(1)?)?;
                    if srcs.len() != count as usize {
                        return Err(
                            self.err(ins, format!(".x{count} needs {count} source registers"))
                        );
                    }
                    Op::Stmatrix {
                        count,
                        trans,
                        srcs,
                        addr,
                        off,
                        space,
                    }
                }
            }
            O::CpAsync => {
                let (dst, doff, _) = self.addr(ins, arg(0)?)?;
                let (src, soff, _) = self.addr(ins, arg(1)?)?;
                let size = match arg(2)? {
                    Operand::Imm(i) => i.bits() as u32,
                    _ => return Err(self.err(ins, "cp.async size must be an immediate")),
                };
                if ![4, 8, 16].contains(&size) {
                    return Err(self.err(ins, "cp.async size must be 4, 8 or 16"));
                }
                let src_size = match a.get(3) {
                    Some(Operand::Imm(Imm::Int(_))) | Some(Operand::Reg(_))
                        if !ins.has(Flag::L2CacheHint) || a.len() == 5 =>
                    {
                        self.src(ins, &a[3])?
                    }
                    _ => self.konst(size as u64),
                };
                Op::CpAsync {
                    dst,
                    doff,
                    src,
                    soff,
                    size,
                    src_size,
                    dspace: MSpace::Shared,
                }
            }
            O::Call => return self.call(ins, ins0, guard),
            O::WgmmaFence
            | O::CpAsyncBulkCommitGroup
            | O::CpAsyncBulkWaitGroup
            | O::CpAsyncBulkPrefetchTensor => Op::Nop,
            O::WgmmaCommitGroup => Op::WgmmaCommit,
            O::WgmmaWaitGroup => {
                let n = match arg(0)? {
                    Operand::Imm(i) => i.bits() as u32,
                    _ => return Err(self.err(ins, "wgmma.wait_group needs an immediate")),
                };
                Op::WgmmaWait { n }
            }
            O::WgmmaMmaAsync => {
                let spec = crate::hopper::WgmmaSpec::from_instruction(ins)
                    .map_err(|e| self.err(ins, e))?;
                let d = self.vec_dsts(ins, arg(0)?)?;
                if d.len() != spec.d_regs() {
                    return Err(self.err(
                        ins,
                        format!(
                            "wgmma m64n{} needs {} accumulator registers, got {}",
                            spec.n,
                            spec.d_regs(),
                            d.len()
                        ),
                    ));
                }
                let (a_desc, av) = if spec.a_regs {
                    let v = self.vec_srcs(ins, arg(1)?)?;
                    if v.len() != 4 {
                        return Err(self.err(ins, "wgmma A from registers needs 4 registers"));
                    }
                    (NONE, v)
                } else {
                    (self.src(ins, arg(1)?)?, Vec::new())
                };
                let b_desc = self.src(ins, arg(2)?)?;
                let scale_d = match a.get(3) {
                    Some(o) => self.src(ins, o)?,
                    None => self.konst(1),
                };
                let imm = |i: usize, default: i64| -> i64 {
                    match a.get(i) {
                        Some(Operand::Imm(ptx::Imm::Int(v))) => *v,
                        _ => default,
                    }
                };
                let (neg_a, neg_b) = (imm(4, 1) == -1, imm(5, 1) == -1);
                let (trans_a, trans_b) = if spec.a_regs {
                    (false, imm(6, 0) == 1)
                } else {
                    (imm(6, 0) == 1, imm(7, 0) == 1)
                };
                Op::Wgmma(Box::new(WgmmaOp {
                    spec,
                    d,
                    a_desc,
                    a: av,
                    b_desc,
                    scale_d,
                    neg_a,
                    neg_b,
                    trans_a,
                    trans_b,
                }))
            }
            O::Setmaxnreg => {
                let n = match arg(0)? {
                    Operand::Imm(i) => i.bits() as u32,
                    _ => return Err(self.err(ins, "setmaxnreg needs an immediate")),
                };
                if !(24..=256).contains(&n) || n % 8 != 0 {
                    return Err(
                        self.err(ins, "setmaxnreg count must be a multiple of 8 in 24..256")
                    );
                }
                Op::Setmaxnreg {
                    inc: ins.has(Flag::Inc),
                    n,
                }
            }
            O::MbarrierInit => {
                let (addr, off, _) = self.addr(ins, arg(0)?)?;
                let count = self.src(ins, arg(1)?)?;
                Op::MbarInit { addr, off, count }
            }
            O::MbarrierInval => {
                let (addr, off, _) = self.addr(ins, arg(0)?)?;
                Op::MbarInval { addr, off }
            }
            O::MbarrierArrive | O::MbarrierArriveDrop => {
                let d = self.dst(ins, arg(0)?)?;
                let (addr, off, _) = self.addr(ins, arg(1)?)?;
                let extra = match a.get(2) {
                    Some(o) => self.src(ins, o)?,
                    None => NONE,
                };
                let (count, tx) = if ins.has(Flag::ExpectTx) {
                    (NONE, extra)
                } else {
                    (extra, NONE)
                };
                let remote = ins.mods.contains(&Mod::Space(Space::SharedCluster));
                Op::MbarArrive {
                    d,
                    addr,
                    off,
                    count,
                    tx,
                    drop: ins.op == O::MbarrierArriveDrop,
                    remote,
                }
            }
            O::MbarrierExpectTx | O::MbarrierCompleteTx => {
                let (addr, off, _) = self.addr(ins, arg(0)?)?;
                let bytes = self.src(ins, arg(1)?)?;
                Op::MbarTx {
                    addr,
                    off,
                    bytes,
                    complete: ins.op == O::MbarrierCompleteTx,
                }
            }
            O::MbarrierTestWait | O::MbarrierTryWait => {
                let d = self.dst(ins, arg(0)?)?;
                let (addr, off, _) = self.addr(ins, arg(1)?)?;
                let x = self.src(ins, arg(2)?)?;
                Op::MbarWait {
                    d,
                    addr,
                    off,
                    arg: x,
                    parity: ins.has(Flag::Parity),
                }
            }
            O::MbarrierPendingCount => {
                let d = self.dst(ins, arg(0)?)?;
                let st = self.src(ins, arg(1)?)?;
                Op::MbarPending { d, state: st }
            }
            O::CpAsyncBulk => {
                let sp: Vec<Space> = ins.spaces().collect();
                let to_ms = |s: Option<&Space>| match s {
                    Some(Space::Global) => MSpace::Global,
                    Some(x) if x.is_shared() => MSpace::Shared,
                    _ => MSpace::Generic,
                };
                let (dspace, sspace) = (to_ms(sp.first()), to_ms(sp.get(1)));
                let (dst, doff, _) = self.addr(ins, arg(0)?)?;
                let (src, soff, _) = self.addr(ins, arg(1)?)?;
                let size = self.src(ins, arg(2)?)?;
                let mbar = if ins.has(Flag::CompleteTxBytes) {
                    let (m, mo, _) = self.addr(ins, arg(3)?)?;
                    Some((m, mo))
                } else {
                    None
                };
                Op::Bulk {
                    dst,
                    doff,
                    dspace,
                    src,
                    soff,
                    sspace,
                    size,
                    mbar,
                }
            }
            O::CpAsyncBulkTensor => {
                if ins.has(Flag::Im2col) {
                    return Err(self.err(
                        ins,
                        "im2col tensor copies are not supported by the emulator",
                    ));
                }
                let first_global = ins.space() == Some(Space::Global);
                let (load, t_idx, s_idx) = if first_global {
                    (false, 0, 1)
                } else {
                    (true, 1, 0)
                };
                let (smem, soff, _) = self.addr(ins, arg(s_idx)?)?;
                let (tmap, toff, tspace, coords) = match arg(t_idx)? {
                    Operand::TensorAddr { base, coords } => {
                        let (slot, off, sp) = self.addr(
                            ins,
                            &Operand::Addr {
                                base: base.clone(),
                                offset: 0,
                            },
                        )?;
                        let cs = coords
                            .iter()
                            .map(|c| self.src(ins, c))
                            .collect::<Result<Vec<_>, _>>()?;
                        (slot, off, sp.unwrap_or(MSpace::Generic), cs)
                    }
                    _ => return Err(self.err(ins, "expected [tensorMap, {coords}]")),
                };
                let mbar = if load {
                    let (m, mo, _) = self.addr(ins, arg(2)?)?;
                    Some((m, mo))
                } else {
                    None
                };
                let cta_mask = if ins.has(Flag::MulticastCluster) {
                    self.src(ins, arg(3)?)?
                } else {
                    NONE
                };
                Op::BulkTensor {
                    load,
                    smem,
                    soff,
                    tmap,
                    toff,
                    tspace,
                    coords,
                    mbar,
                    cta_mask,
                }
            }
            O::CpReduceAsyncBulk
            | O::CpReduceAsyncBulkTensor
            | O::StAsync
            | O::RedAsync
            | O::CpAsyncMbarrierArrive => {
                return Err(self.err(ins, "instruction not yet supported by the emulator"))
            }
            O::Mapa => {
                let d = self.dst(ins, arg(0)?)?;
                let x = self.src(ins, arg(1)?)?;
                let r = self.src(ins, arg(2)?)?;
                let generic = !ins.spaces().any(|s| s.is_shared());
                Op::Mapa {
                    generic,
                    d,
                    a: x,
                    b: r,
                }
            }
            O::Getctarank => {
                let d = self.dst(ins, arg(0)?)?;
                let x = self.src(ins, arg(1)?)?;
                Op::Getctarank { d, a: x }
            }
            O::BarrierCluster => {
                if ins.has(Flag::Arrive) {
                    Op::ClusterArrive
                } else if ins.has(Flag::Wait) {
                    Op::ClusterWait
                } else {
                    return Err(self.err(ins, "barrier.cluster needs .arrive or .wait"));
                }
            }
            _ => {
                let f = alu::int_fn(ins)
                    .ok_or_else(|| self.err(ins, "operation/type combination not supported"))?;
                let d = self.dst(ins, arg(0)?)?;
                let s: Vec<u32> = a[1..]
                    .iter()
                    .map(|x| self.src(ins, x))
                    .collect::<Result<_, _>>()?;
                Op::Alu {
                    f,
                    d,
                    a: s.first().copied().unwrap_or(ZERO),
                    b: s.get(1).copied().unwrap_or(ZERO),
                    c: s.get(2).copied().unwrap_or(ZERO),
                }
            }
        };
        self.push(op, ins0, guard);
        Ok(())
    }
}
