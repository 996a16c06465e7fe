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
    AddrBase, Flag, Function, Imm, Instruction, Mod, Module, Opcode, Operand, Role, SReg, Space,
    Statement, Ty,
};
use std::collections::HashMap;

mod async_copy;
mod atom;
mod barrier;
mod call;
mod carry;
mod control;
mod convert;
mod family;
mod float;
mod int;
mod ldst;
mod multimem;
mod stack;
mod tensor;
mod tex;
mod video;
mod warp;
mod wmma;
pub use call::{function_address, AssertFail, CallSite, IndirectCall, ParamCopy, Place};
pub use carry::{CarryKind, CarryOp};
pub use family::{family, Family};
use family::{misrouted, role};

pub use multimem::{MultimemKind, MultimemOp};
/// The modifier families are `ptx`'s; `Ord` is the memory order a decoded access asks for
/// (`ld.volatile` decodes as acquire, `st.volatile` as release).
pub use ptx::ops::{AtomOp, MemOrder as Ord, ReduxOp, ShflMode, VoteMode};
pub use stack::StackOp;
pub use tex::{Mip, Oob, TexAttr, TexKind, TexOp, TexRet};

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarKind {
    Sync,
    Arrive,
    RedPopc,
    RedAnd,
    RedOr,
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
    /// A video instruction (`vadd`..`vset4`; `exec/video.rs`); `c` is `ZERO` when absent.
    Video {
        form: Box<ptx::video::VideoForm>,
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
    /// An indirect call through a function pointer: each lane calls the site its pointer names.
    CallIndirect(Box<IndirectCall>),
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
    /// CUDA's `__assertfail` (a failed `assert`, Triton's `tl.device_assert`): faults with the
    /// assertion's message, file, line and function.
    AssertFail(Box<AssertFail>),
    Trap,
    /// `nanosleep t`: advances the warp's clock by `t` ns and ends its host time slice.
    Sleep {
        t: u32,
    },
    Nop,
    /// A texture or surface instruction (`program/tex.rs`, `exec/tex.rs`).
    Texture(Box<TexOp>),
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
    /// `wmma.load`, `wmma.store`, `wmma.mma`, `mma.sp`, `movmatrix` ([`crate::wmma`]).
    Wmma(Box<crate::wmma::WmmaOp>),
    /// `stacksave`, `stackrestore`, `alloca` on the lane's call stack.
    Stack(StackOp),
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
        /// `cp.reduce.async.bulk.tensor`: reduce the box into global memory with this
        /// operation (element type from the tensor map) instead of storing it.
        red: Option<AtomOp>,
        /// `.im2col` / `.im2col_no_offs` (the map must be an im2col one), else `.tile`.
        im2col: bool,
        /// The im2col offsets (16-bit registers, one per spatial dimension); empty otherwise.
        offsets: Vec<u32>,
    },
    /// `tensormap.replace.tile.FIELD [map], {ord,} value`: rewrites one field of the tensor
    /// map at `reg[addr] + off` in `space` (shared or global).
    TensormapReplace {
        field: ptx::ops::TensormapField,
        addr: u32,
        off: i64,
        space: MSpace,
        ord: u32,
        value: u32,
    },
    /// `cp.async.mbarrier.arrive[.noinc]`: arrive on the mbarrier once the thread's prior
    /// `cp.async` operations completed (they complete at issue in the emulator).
    CpAsyncArrive {
        addr: u32,
        off: i64,
        noinc: bool,
    },
    /// `st.async` (`red: None`) / `red.async`: a store or reduction into (possibly another CTA's)
    /// shared memory that completes `elem * srcs.len()` transaction bytes on the mbarrier at
    /// `mbar + moff` in the destination's CTA.
    AsyncRemote {
        red: Option<AtomOp>,
        ty: Ty,
        elem: u32,
        srcs: Vec<u32>,
        addr: u32,
        off: i64,
        mbar: u32,
        moff: i64,
    },
    /// `cp.reduce.async.bulk`: reduce `size` bytes of shared memory element-wise into global or
    /// shared::cluster memory; `mbar` completes the bytes on arrival (shared::cluster form).
    BulkReduce {
        op: AtomOp,
        ty: Ty,
        dst: u32,
        doff: i64,
        dspace: MSpace,
        src: u32,
        soff: i64,
        size: u32,
        mbar: Option<(u32, i64)>,
    },
    /// Vector `atom`/`red` (`.v2`/`.v4`/`.v8`, global): one atomic operation per element.
    AtomVec {
        op: AtomOp,
        ty: Ty,
        ds: Vec<u32>,
        addr: u32,
        off: i64,
        bs: Vec<u32>,
        ord: Ord,
    },
    /// `multimem.ld_reduce` / `.st` / `.red` on a multicast address (`program/multimem.rs`).
    Multimem(Box<MultimemOp>),
    /// 128-bit `atom.cas.b128` / `atom.exch.b128`: each operand is a slot pair (low, high).
    Atom128 {
        space: MSpace,
        cas: bool,
        d: u32,
        addr: u32,
        off: i64,
        b: u32,
        c: u32,
        ord: Ord,
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
    /// `wgmma.mma_async.sp`: the metadata register slot and the sparsity selector.
    pub sparse: Option<(u32, u32)>,
    /// `.satfinite` (integer forms): clamp D to the s32 range instead of wrapping.
    pub satfinite: bool,
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
                | Op::Wmma(_)
                | Op::Bulk { .. }
                | Op::BulkTensor { .. }
                | Op::TensormapReplace { .. }
                | Op::BulkReduce { .. }
                | Op::AsyncRemote { .. }
                | Op::CpAsyncArrive { .. }
                | Op::AtomVec { .. }
                | Op::Atom128 { .. }
                | Op::CpAsync { .. }
                | Op::MbarInit { .. }
                | Op::MbarArrive { .. }
                | Op::MbarTx { .. }
                | Op::Bar { .. }
                | Op::ClusterArrive
                | Op::Exit
                | Op::Vprintf { .. }
        ) || matches!(self, Op::Texture(t) if t.writes())
            || matches!(self, Op::Multimem(m) if m.kind != MultimemKind::LdReduce)
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
    /// `.maxnreg`: the registers per thread each warp holds until it executes `setmaxnreg`.
    pub maxnreg: Option<u32>,
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

/// The key under which a `.global`/`.const`/`.shared` variable declared inside the body of
/// function `func` is found among the loader's symbols (function scope: two functions may each
/// declare their own `g`). `/` cannot occur in a PTX name, so no module variable clashes.
pub fn scoped_name(func: &str, var: &str) -> String {
    format!("{func}/{var}")
}

/// Every `.global`/`.const` variable the loader allocates, with the key the decoder finds it
/// under: module-scope ones by name, those declared in a function body by [`scoped_name`].
pub fn global_variables(module: &Module) -> Vec<(String, &ptx::VarDecl)> {
    let mut vars: Vec<(String, &ptx::VarDecl)> =
        module.globals().map(|v| (v.name.clone(), v)).collect();
    for f in module.functions() {
        f.walk(&mut |s| {
            if let Statement::Var(v) = s {
                vars.push((scoped_name(&f.name, &v.name), v));
            }
        });
    }
    vars.retain(|(_, v)| matches!(v.space, Space::Global | Space::Const));
    vars
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
    /// Labels of the nested `{ }` blocks being decoded, innermost last: name -> the unique name
    /// it is recorded under. PTX scopes a label to its block, and inline asm that Triton and
    /// CUTLASS repeat (`{ waitLoop: ... bra waitLoop; }`) defines one name in many blocks.
    label_scopes: Vec<HashMap<String, String>>,
    /// Nested blocks with labels seen so far (numbers their unique label names).
    label_blocks: u32,
    tables: HashMap<String, Vec<String>>,
    /// (inst index, label) fixups for branches.
    fixups: Vec<(usize, Vec<String>)>,
    shared_syms: HashMap<String, u32>,
    local_syms: HashMap<String, u32>,
    param_syms: HashMap<String, u32>,
    pending: Vec<String>,
    /// Call sites: (inst index, site index (indirect calls have several), caller (None: the
    /// kernel), callee).
    call_fixups: Vec<(usize, usize, Option<String>, String)>,
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
    /// Registers of the `.reg` parameters of device functions (first slot, elements; see
    /// `call`).
    reg_params: HashMap<String, Vec<Option<(u32, u8)>>>,
    /// When collecting (`decode_collecting`): unsupported instructions, skipped.
    refused: Option<Vec<EmuError>>,
    /// Vector registers (`.reg .v4 .f32 %v`): first slot -> elements; the elements occupy
    /// consecutive slots, so `%v.y` is the first slot + 1.
    vec_regs: HashMap<u32, u8>,
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
        let found = self.scopes.iter().rev().find_map(|s| s.get(name).copied());
        if found.is_some() {
            return found;
        }
        // `%v.x`..`%v.w` / `%v.r`..`%v.a`: an element of a vector register
        let (base, c) = ptx::split_component(name)?;
        let s = self
            .scopes
            .iter()
            .rev()
            .find_map(|s| s.get(base).copied())?;
        (c < *self.vec_regs.get(&s)?).then_some(s + c as u32)
    }

    /// The slots of a whole vector register named by `o` (`%v` of `.reg .v4 .f32 %v`).
    fn vec_reg(&self, o: &Operand) -> Option<Vec<u32>> {
        let Operand::Reg(r) = o else { return None };
        let s = self.scopes.iter().rev().find_map(|s| s.get(r).copied())?;
        let n = *self.vec_regs.get(&s)?;
        Some((s..s + n as u32).collect())
    }

    /// Allocates `lanes` consecutive slots of `bits` (a vector register when `lanes > 1`).
    fn new_reg(&mut self, bits: u8, lanes: u8) -> u32 {
        let s = self.new_slot(bits);
        for _ in 1..lanes {
            self.new_slot(bits);
        }
        if lanes > 1 {
            self.vec_regs.insert(s, lanes);
        }
        s
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
        let lanes = d.vec.unwrap_or(1);
        for n in &d.names {
            match n.count {
                None => {
                    let s = self.declare_one(d.ty, bits, lanes);
                    self.innermost().insert(n.name.clone(), s);
                }
                Some(c) => {
                    for i in 0..c {
                        let s = self.declare_one(d.ty, bits, lanes);
                        self.innermost().insert(format!("{}{}", n.name, i), s);
                    }
                }
            }
        }
    }

    /// Slots of one declared register: a vector's lanes, or a `.b128`'s pair of 64-bit slots
    /// (low, high; not a vector: no components, vectors of `.b128` do not exist).
    fn declare_one(&mut self, ty: Ty, bits: u8, lanes: u8) -> u32 {
        if ty == Ty::B128 {
            let s = self.new_slot(bits);
            self.new_slot(bits);
            return s;
        }
        self.new_reg(bits, lanes)
    }

    /// Address of a symbol used as a value or as the base of `[sym+off]`.
    fn sym_value(&self, ins: &Instruction, name: &str) -> Result<(u64, MSpace), EmuError> {
        if let Some(&o) = self.local_syms.get(name) {
            return Ok((o as u64, MSpace::Local));
        }
        if let Some(&o) = self.param_syms.get(name) {
            return Ok((o as u64, MSpace::Param));
        }
        // variables declared in the body of the function being decoded shadow module ones
        let scoped = scoped_name(self.current.as_deref().unwrap_or(&self.f.name), name);
        let shared = self.shared_syms.get(&scoped);
        if let Some(&o) = shared.or_else(|| self.shared_syms.get(name)) {
            return Ok((o as u64, MSpace::Shared));
        }
        match self.globals.get(&scoped).or_else(|| self.globals.get(name)) {
            Some(SymAddr::Global(a)) => Ok((*a, MSpace::Global)),
            Some(SymAddr::Shared(o)) => Ok((*o as u64, MSpace::Shared)),
            None => match call::function_address(self.module, name) {
                Some(a) => Ok((a, MSpace::Global)),
                None => Err(self.err(ins, format!("unknown symbol `{name}`"))),
            },
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

    /// The destinations of a vector operand: `{a, _, c}` or a whole vector register.
    fn vec_dsts(&mut self, ins: &Instruction, o: &Operand) -> Result<Vec<u32>, EmuError> {
        match o {
            Operand::Vec(v) => v.iter().map(|x| self.dst(ins, x)).collect(),
            x if ins.vec_width().is_some() && self.vec_reg(x).is_some() => {
                Ok(self.vec_reg(x).unwrap_or_default())
            }
            x => Ok(vec![self.dst(ins, x)?]),
        }
    }
    /// The sources of a vector operand: `{a, b}` or a whole vector register.
    fn vec_srcs(&mut self, ins: &Instruction, o: &Operand) -> Result<Vec<u32>, EmuError> {
        match o {
            Operand::Vec(v) => v.iter().map(|x| self.src(ins, x)).collect(),
            x if ins.vec_width().is_some() && self.vec_reg(x).is_some() => {
                Ok(self.vec_reg(x).unwrap_or_default())
            }
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
        let volatile = ins.has(Flag::Volatile);
        match ins.mem_order() {
            Some(o @ (Ord::AcqRel | Ord::Acquire | Ord::Release)) => o,
            _ if volatile && ins.op == Opcode::Ld => Ord::Acquire,
            _ if volatile && ins.op == Opcode::St => Ord::Release,
            _ => Ord::Relaxed,
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
            Operand::Sel(x, _) | Operand::Neg(x) => self.materialise_operand(ins, x, guard)?,
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
    decode_with(module, kernel, globals, false).map(|(p, _)| p)
}

/// Decodes `kernel` but goes on past instructions the emulator does not support, returning all
/// of them (each an [`EmuError::Unsupported`] with its line); other errors end decoding.
pub fn decode_collecting(
    module: &Module,
    kernel: &str,
    globals: &HashMap<String, SymAddr>,
) -> Result<Vec<EmuError>, EmuError> {
    decode_with(module, kernel, globals, true).map(|(_, refused)| refused)
}

fn decode_with(
    module: &Module,
    kernel: &str,
    globals: &HashMap<String, SymAddr>,
    collect: bool,
) -> Result<(Program, Vec<EmuError>), EmuError> {
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
    let mut maxnreg = None;
    for d in &f.directives {
        match d {
            ptx::PerfDirective::Reqntid(v) => reqntid = Some(dir3(v)),
            ptx::PerfDirective::Maxntid(v) => maxntid = Some(dir3(v)),
            ptx::PerfDirective::Maxnreg(n) => maxnreg = Some(*n),
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
        maxnreg,
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
        label_scopes: Vec::new(),
        label_blocks: 0,
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
        refused: collect.then(Vec::new),
        vec_regs: HashMap::new(),
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
    Ok((d.prog, d.refused.unwrap_or_default()))
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
                        msg: format!(
                            "branch to unknown label `{}`",
                            t.split('%').next().unwrap_or(&t)
                        ),
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
        let mut place = |v: &ptx::VarDecl, key: String, off: &mut u32, map: &mut HashMap<_, _>| {
            let align = v.align.unwrap_or(v.ty.size()).max(1);
            if v.dims.iter().any(|d| d.is_none()) {
                dyn_align = dyn_align.max(align);
                dyn_names.push(key);
                return;
            }
            *off = off.div_ceil(align) * align;
            map.insert(key, *off);
            *off += v.size_bytes() as u32;
        };
        let mut shared = HashMap::new();
        for g in self.module.globals() {
            if g.space.is_shared() {
                place(g, g.name.clone(), &mut off, &mut shared);
            }
        }
        // `.shared` variables declared in the bodies of device functions the kernel can reach
        for f in call::reachable_functions(self.module, self.f) {
            f.walk(&mut |s| {
                if let Statement::Var(v) = s {
                    if v.space.is_shared() {
                        place(v, scoped_name(&f.name, &v.name), &mut off, &mut shared);
                    }
                }
            });
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
                place(v, v.name.clone(), &mut off, &mut shared);
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
                    let name = self.scoped_label(l);
                    self.labels.insert(name, self.prog.insts.len() as u32);
                }
                Statement::Block(inner) => {
                    self.scopes.push(HashMap::new());
                    self.push_label_scope(inner);
                    self.block(inner)?;
                    self.label_scopes.pop();
                    self.scopes.pop();
                }
                Statement::Instr(i) => self.instruction_or_refuse(i)?,
                Statement::BranchTargets { label, targets } => {
                    let targets = targets.iter().map(|t| self.scoped_label(t)).collect();
                    self.tables.insert(self.scoped_label(label), targets);
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
                Statement::Var(_)
                | Statement::Pragma(_)
                | Statement::CallPrototype { .. }
                | Statement::CallTargets { .. } => {}
            }
        }
        Ok(())
    }

    /// Opens the label scope of nested block `b`: its own labels (and `.branchtargets` names)
    /// get names no other block uses.
    fn push_label_scope(&mut self, b: &[Statement]) {
        let mut scope = HashMap::new();
        for s in b {
            let (Statement::Label(l, _) | Statement::BranchTargets { label: l, .. }) = s else {
                continue;
            };
            // `%` cannot appear in a PTX identifier, so the unique name meets no real label.
            scope.insert(l.clone(), format!("{l}%{}", self.label_blocks));
        }
        if !scope.is_empty() {
            self.label_blocks += 1;
        }
        self.label_scopes.push(scope);
    }

    /// The name label `l` is recorded under where it is used: the innermost enclosing block's
    /// own label of that name, else the function's.
    pub(super) fn scoped_label(&self, l: &str) -> String {
        self.label_scopes
            .iter()
            .rev()
            .find_map(|s| s.get(l).cloned())
            .unwrap_or_else(|| l.to_string())
    }

    /// Decodes one instruction; when collecting, an unsupported one is noted and skipped.
    fn instruction_or_refuse(&mut self, ins: &Instruction) -> Result<(), EmuError> {
        match (self.instruction(ins), &mut self.refused) {
            (Err(e @ EmuError::Unsupported { .. }), Some(refused)) => {
                refused.push(e);
                Ok(())
            }
            (res, _) => res,
        }
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
        self.dispatch(ins, ins0, guard)
    }
}
