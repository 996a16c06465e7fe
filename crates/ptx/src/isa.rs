//! The instruction table: one description per opcode (name, operand counts, the target and ISA
//! version it first needs, and for instructions whose operands play different parts, the
//! operands by role with their type classes: [`crate::roles`]). The parser, printer, validator,
//! builder and the emulator's decoder all read this table; adding an instruction starts here.
//!
//! Opcodes are the dotted prefix PTX uses to name an instruction family (`mbarrier.try_wait`,
//! `cp.async.bulk.tensor`); the parser matches the longest known prefix and treats the remaining
//! dotted parts as modifiers ([`crate::Mod`]).

use crate::ir::Instruction;
use crate::mods::{Flag, Mod};
use crate::roles::{Cond, Role, Slot, TyClass};
use crate::types::Ty;
use std::fmt;

/// Static description of an opcode.
#[derive(Clone, Copy, Debug)]
pub struct OpInfo {
    pub name: &'static str,
    /// Number of leading destination operands (a `p|q` pair counts as one).
    pub dsts: u8,
    /// Minimum and maximum number of source operands.
    pub min_srcs: u8,
    pub max_srcs: u8,
    /// Lowest `sm_XX` that has the base form (refined per modifier in [`requirement`]).
    pub min_sm: u32,
    /// Lowest PTX ISA version (major*10 + minor).
    pub min_ptx: u32,
}

macro_rules! opcodes {
    ($($var:ident $name:literal $d:literal $lo:literal $hi:literal $sm:literal $ptx:literal $([$($slot:tt)*])?;)*) => {
        /// A PTX instruction family.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Opcode { $($var),* }
        impl Opcode {
            pub const ALL: &'static [Opcode] = &[$(Opcode::$var),*];
            /// The instruction's description.
            pub fn info(self) -> &'static OpInfo {
                match self { $(Opcode::$var => &OpInfo { name: $name, dsts: $d, min_srcs: $lo, max_srcs: $hi, min_sm: $sm, min_ptx: $ptx }),* }
            }
            /// Looks an opcode up by its dotted name.
            pub fn from_name(s: &str) -> Option<Opcode> {
                match s { $($name => Some(Opcode::$var),)* _ => None }
            }
            /// The operands by role, in PTX order (empty for opcodes whose operands are only
            /// counted); see [`Slot`].
            pub fn slots(self) -> &'static [Slot] {
                match self {
                    $(Opcode::$var => {
                        const SLOTS: &[Slot] = &[$($(slot!($slot)),*)?];
                        SLOTS
                    })*
                }
            }
        }
    };
}

/// One entry of an opcode's operand list: `Role` or `(Role: Class)` (the operand's type class,
/// [`TyClass`], checked by the validator; `Any` when omitted), optionally prefixed with `?`
/// (optional: present when the instruction has more operands than the required ones after it)
/// and followed by `if Flag` / `unless Flag` (present with / without a modifier), `list`
/// (present when the operand there is a `( ... )` list) or `unless_vec N` (absent when operand
/// N is a `{ ... }` vector).
macro_rules! slot {
    (($($t:tt)*)) => { slot!($($t)*) };
    ($r:ident $(: $c:ident)?) => { slot!(@ $r, Cond::Always, false $(, $c)?) };
    (? $r:ident $(: $c:ident)?) => { slot!(@ $r, Cond::Always, true $(, $c)?) };
    ($r:ident $(: $c:ident)? if $f:ident) => { slot!(@ $r, Cond::Flag(Flag::$f), false $(, $c)?) };
    ($r:ident $(: $c:ident)? unless $f:ident) => {
        slot!(@ $r, Cond::NoFlag(Flag::$f), false $(, $c)?)
    };
    (? $r:ident $(: $c:ident)? unless $f:ident) => {
        slot!(@ $r, Cond::NoFlag(Flag::$f), true $(, $c)?)
    };
    (? $r:ident $(: $c:ident)? list) => { slot!(@ $r, Cond::List, true $(, $c)?) };
    (? $r:ident $(: $c:ident)? vec) => { slot!(@ $r, Cond::Vec, true $(, $c)?) };
    (? $r:ident $(: $c:ident)? unless_vec $n:literal) => {
        slot!(@ $r, Cond::NotVec($n), true $(, $c)?)
    };
    (@ $r:ident, $cond:expr, $opt:literal) => { slot!(@ $r, $cond, $opt, Any) };
    (@ $r:ident, $cond:expr, $opt:literal, $c:ident) => {
        Slot { role: Role::$r, cond: $cond, optional: $opt, ty: TyClass::$c }
    };
}

opcodes! {
    // integer and float arithmetic (`mul`/`mad` `.wide` widen d and c: the validator's rule)
    Add "add" 1 2 2 20 10 [(Dst: T) (A: T) (B: T)]; Addc "addc" 1 2 2 20 12 [(Dst: T) (A: T) (B: T)];
    Sub "sub" 1 2 2 20 10 [(Dst: T) (A: T) (B: T)]; Subc "subc" 1 2 2 20 12 [(Dst: T) (A: T) (B: T)];
    Mul "mul" 1 2 2 20 10 [Dst A B]; Mad "mad" 1 3 3 20 10 [Dst A B C];
    Madc "madc" 1 3 3 20 30 [(Dst: T) (A: T) (B: T) (C: T)];
    Mul24 "mul24" 1 2 2 20 10 [(Dst: T) (A: T) (B: T)]; Mad24 "mad24" 1 3 3 20 10 [(Dst: T) (A: T) (B: T) (C: T)];
    Sad "sad" 1 3 3 20 10 [(Dst: T) (A: T) (B: T) (C: T)];
    Div "div" 1 2 2 20 10 [(Dst: T) (A: T) (B: T)]; Rem "rem" 1 2 2 20 10 [(Dst: T) (A: T) (B: T)];
    Abs "abs" 1 1 1 20 10 [(Dst: T) (A: T)]; Neg "neg" 1 1 1 20 10 [(Dst: T) (A: T)];
    Min "min" 1 2 3 20 10 [(Dst: T) (A: T) (B: T) (?C: T)];
    Max "max" 1 2 3 20 10 [(Dst: T) (A: T) (B: T) (?C: T)];
    Fma "fma" 1 3 3 20 14 [(Dst: T) (A: T) (B: T) (C: T)];
    Copysign "copysign" 1 2 2 20 30 [(Dst: T) (A: T) (B: T)]; Testp "testp" 1 1 1 20 20 [(Dst: Pred) (A: T)];
    Rcp "rcp" 1 1 1 20 10 [(Dst: T) (A: T)]; Sqrt "sqrt" 1 1 1 20 10 [(Dst: T) (A: T)];
    Rsqrt "rsqrt" 1 1 1 20 10 [(Dst: T) (A: T)]; Sin "sin" 1 1 1 20 10 [(Dst: T) (A: T)];
    Cos "cos" 1 1 1 20 10 [(Dst: T) (A: T)]; Lg2 "lg2" 1 1 1 20 10 [(Dst: T) (A: T)]; Ex2 "ex2" 1 1 1 20 10 [(Dst: T) (A: T)];
    Tanh "tanh" 1 1 1 75 70 [(Dst: T) (A: T)];
    // bit manipulation
    And "and" 1 2 2 20 10 [(Dst: T) (A: T) (B: T)]; Or "or" 1 2 2 20 10 [(Dst: T) (A: T) (B: T)];
    Xor "xor" 1 2 2 20 10 [(Dst: T) (A: T) (B: T)]; Not "not" 1 1 1 20 10 [(Dst: T) (A: T)];
    Cnot "cnot" 1 1 1 20 10 [(Dst: T) (A: T)];
    Shl "shl" 1 2 2 20 10 [(Dst: T) (A: T) (Shift: U32)];
    Shr "shr" 1 2 2 20 10 [(Dst: T) (A: T) (Shift: U32)];
    Shf "shf" 1 3 3 32 31 [(Dst: B32) (A: B32) (B: B32) (Shift: U32)];
    Bfe "bfe" 1 3 3 20 20 [(Dst: T) (A: T) (Pos: U32) (Len: U32)];
    Bfi "bfi" 1 4 4 20 20 [(Dst: T) (A: T) (B: T) (Pos: U32) (Len: U32)];
    Prmt "prmt" 1 3 3 20 20 [(Dst: B32) (A: B32) (B: B32) (Selector: B32)];
    Popc "popc" 1 1 1 20 20 [(Dst: U32) (A: T)]; Clz "clz" 1 1 1 20 20 [(Dst: U32) (A: T)];
    Brev "brev" 1 1 1 20 20 [(Dst: T) (A: T)]; Bfind "bfind" 1 1 1 20 20 [(Dst: U32) (A: T)];
    // `lop3.{and,or}.b32 d|p, a, b, c, immLut, q` (PTX 8.2): p = (d != 0) BoolOp q
    Lop3 "lop3" 1 4 5 50 43 [(Dst: B32Pair) (A: B32) (B: B32) (C: B32) Lut (?PredIn: Pred)];
    Dp4a "dp4a" 1 3 3 61 50 [(Dst: B32) (A: B32) (B: B32) (C: B32)];
    Dp2a "dp2a" 1 3 3 61 50 [(Dst: B32) (A: B32) (B: B32) (C: B32)];
    Fns "fns" 1 3 3 30 60 [(Dst: B32) (A: B32) (B: B32) (C: B32)];
    Bmsk "bmsk" 1 2 2 70 76 [(Dst: B32) (A: B32) (B: B32)];
    Szext "szext" 1 2 2 70 76 [(Dst: T) (A: T) (Len: U32)];
    // video: scalar (a third operand for the secondary op or the merge form) and SIMD
    Vadd "vadd" 1 2 3 20 20 [Dst A B (?C)]; Vsub "vsub" 1 2 3 20 20 [Dst A B (?C)];
    Vabsdiff "vabsdiff" 1 2 3 20 20 [Dst A B (?C)]; Vmin "vmin" 1 2 3 20 20 [Dst A B (?C)];
    Vmax "vmax" 1 2 3 20 20 [Dst A B (?C)]; Vshl "vshl" 1 2 3 20 20 [Dst A B (?C)];
    Vshr "vshr" 1 2 3 20 20 [Dst A B (?C)]; Vmad "vmad" 1 3 3 20 20 [Dst A B C];
    Vset "vset" 1 2 3 20 20 [Dst A B (?C)]; Vadd2 "vadd2" 1 3 3 30 30 [Dst A B C];
    Vsub2 "vsub2" 1 3 3 30 30 [Dst A B C]; Vavrg2 "vavrg2" 1 3 3 30 30 [Dst A B C];
    Vabsdiff2 "vabsdiff2" 1 3 3 30 30 [Dst A B C]; Vmin2 "vmin2" 1 3 3 30 30 [Dst A B C];
    Vmax2 "vmax2" 1 3 3 30 30 [Dst A B C]; Vset2 "vset2" 1 3 3 30 30 [Dst A B C];
    Vadd4 "vadd4" 1 3 3 30 30 [Dst A B C]; Vsub4 "vsub4" 1 3 3 30 30 [Dst A B C];
    Vavrg4 "vavrg4" 1 3 3 30 30 [Dst A B C]; Vabsdiff4 "vabsdiff4" 1 3 3 30 30 [Dst A B C];
    Vmin4 "vmin4" 1 3 3 30 30 [Dst A B C]; Vmax4 "vmax4" 1 3 3 30 30 [Dst A B C];
    Vset4 "vset4" 1 3 3 30 30 [Dst A B C];
    // comparison and selection
    Setp "setp" 1 2 3 20 10 [(Dst: PredPair) (A: T) (B: T) (?C: Pred)];
    Set "set" 1 2 3 20 10 [(Dst: T) (A: T2) (B: T2) (?C: Pred)];
    Selp "selp" 1 3 3 20 10 [(Dst: T) (A: T) (B: T) (C: Pred)];
    Slct "slct" 1 3 3 20 10 [(Dst: T) (A: T) (B: T) (C: T2)];
    // data movement and conversion
    Mov "mov" 1 1 1 20 10 [Dst A]; Cvt "cvt" 1 1 3 20 10 [Dst A (?B) (?C)]; Cvta "cvta" 1 1 1 20 20 [(Dst: T) (A: T)];
    Isspacep "isspacep" 1 1 1 20 20 [(Dst: Pred) (A: T)];
    Ldu "ldu" 1 1 1 20 20 [(Dst: TWideVec) (Addr: Addr)];
    Ld "ld" 1 1 2 20 10 [(Dst: TWideVec) (Addr: Addr) (CacheHint: B64 if L2CacheHint)];
    St "st" 0 2 3 20 10 [(Addr: Addr) (Src: TWideVec) (CacheHint: B64 if L2CacheHint)];
    StAsync "st.async" 0 3 3 90 81 [Addr Src Mbar]; Prefetch "prefetch" 0 1 1 20 20;
    Prefetchu "prefetchu" 0 1 1 20 20; Createpolicy "createpolicy" 1 1 3 80 74
        [Dst A (?B) (?C)];
    Discard "discard" 0 2 2 80 74; Applypriority "applypriority" 0 2 2 80 74;
    // atomics
    Atom "atom" 1 2 4 20 11
        [(Dst: TVec) (Addr: Addr) (B: TVec) (C: TVec if Cas) (CacheHint: B64 if L2CacheHint)];
    Red "red" 0 2 3 20 12 [(Addr: Addr) (B: TVec) (CacheHint: B64 if L2CacheHint)];
    RedAsync "red.async" 0 3 3 90 81 [Addr B Mbar];
    // multimem: loads-with-reduction, stores and reductions on a multicast address (every
    // device bound to the multicast object; the op/type/sem rules: `validate/multimem.rs`)
    MultimemLdReduce "multimem.ld_reduce" 1 1 1 90 81 [(Dst: TVec) (Addr: Addr)];
    MultimemSt "multimem.st" 0 2 2 90 81 [(Addr: Addr) (Src: TVec)];
    MultimemRed "multimem.red" 0 2 2 90 81 [(Addr: Addr) (B: TVec)];
    // barriers and fences
    Bar "bar" 0 0 3 20 10 [(Dst if Red) (?A) (?B) (C if Red)];
    Barrier "barrier" 0 0 3 20 60 [(Dst if Red) (?A) (?B) (C if Red)];
    BarWarpSync "bar.warp.sync" 0 1 1 30 60 [(Membermask: U32)];
    BarrierCluster "barrier.cluster" 0 0 0 90 78; Membar "membar" 0 0 0 20 14;
    Fence "fence" 0 0 2 70 60;
    // warp-level
    Shfl "shfl" 1 3 4 30 30
        [(Dst: TPair) (A: T) (Lane: U32) (Clamp: U32) (Membermask: U32 if Sync)];
    Vote "vote" 1 1 2 20 12 [(Dst: T) (A: Pred) (Membermask: U32 if Sync)];
    Match "match" 1 2 2 70 60 [(Dst: B32Pair) (A: T) (Membermask: U32)];
    Redux "redux" 1 2 2 80 70 [(Dst: T) (A: T) (Membermask: U32)];
    Activemask "activemask" 1 0 0 30 62 [Dst];
    Elect "elect" 1 1 1 90 80 [Dst (Membermask: U32)];
    // control flow
    Bra "bra" 0 1 1 20 10 [Target]; BrxIdx "brx.idx" 0 2 2 30 60 [Index Target];
    Call "call" 0 1 4 20 10 [(?Rets list) Func (?Params list) (?Proto)];
    Ret "ret" 0 0 0 20 10; Exit "exit" 0 0 0 20 10; Trap "trap" 0 0 0 20 10;
    Brkpt "brkpt" 0 0 0 20 11; Nanosleep "nanosleep" 0 1 1 70 63 [Time];
    // tensor cores (Ampere/Ada)
    Mma "mma" 1 3 3 70 64 [Dst A B C];
    Ldmatrix "ldmatrix" 1 1 1 75 65 [(Dst: B32X) (Addr: AddrOnly)];
    Stmatrix "stmatrix" 0 2 2 90 78 [(Addr: AddrOnly) (Src: B32X)];
    // warp matrix functions, sparse mma, movmatrix (emulated in the emulator's `wmma` modules)
    WmmaLoadA "wmma.load.a" 1 1 2 70 60 [Dst Addr (?Stride)];
    WmmaLoadB "wmma.load.b" 1 1 2 70 60 [Dst Addr (?Stride)];
    WmmaLoadC "wmma.load.c" 1 1 2 70 60 [Dst Addr (?Stride)];
    WmmaStoreD "wmma.store.d" 0 2 3 70 60 [Addr Src (?Stride)];
    WmmaMma "wmma.mma" 1 3 3 70 60 [Dst A B C];
    MmaSp "mma.sp" 1 5 5 80 71 [Dst A B C Meta SparsitySel];
    MmaSpOrdered "mma.sp::ordered_metadata" 1 5 5 80 85 [Dst A B C Meta SparsitySel];
    Movmatrix "movmatrix" 1 1 1 75 78 [Dst A];
    // per-thread stack allocation
    Stacksave "stacksave" 1 0 0 52 73 [Dst]; Stackrestore "stackrestore" 0 1 1 52 73 [A];
    Alloca "alloca" 1 1 2 52 73 [Dst Size (?Align)];
    // asynchronous copies
    CpAsync "cp.async" 0 3 5 80 70 [Dst Src CpSize (?SrcSize) (CacheHint if L2CacheHint)];
    CpAsyncCommitGroup "cp.async.commit_group" 0 0 0 80 70;
    CpAsyncWaitGroup "cp.async.wait_group" 0 1 1 80 70 [N]; CpAsyncWaitAll "cp.async.wait_all" 0 0 0 80 70;
    CpAsyncMbarrierArrive "cp.async.mbarrier.arrive" 0 1 1 80 70 [Addr];
    CpAsyncBulk "cp.async.bulk" 0 3 6 90 80
        [Dst Src Size (Mbar if CompleteTxBytes) (CtaMask if MulticastCluster)
         (CacheHint if L2CacheHint)];
    CpAsyncBulkTensor "cp.async.bulk.tensor" 0 2 6 90 80
        [Dst Src (Mbar if CompleteTxBytes) (Im2colOffsets if Im2col) (CtaMask if MulticastCluster)
         (CacheHint if L2CacheHint)];
    CpAsyncBulkCommitGroup "cp.async.bulk.commit_group" 0 0 0 90 80;
    CpAsyncBulkWaitGroup "cp.async.bulk.wait_group" 0 1 1 90 80 [N];
    CpAsyncBulkPrefetchTensor "cp.async.bulk.prefetch.tensor" 0 1 3 90 80;
    CpAsyncBulkPrefetch "cp.async.bulk.prefetch" 0 2 3 90 80;
    CpReduceAsyncBulk "cp.reduce.async.bulk" 0 3 4 90 80
        [Dst Src Size (Mbar if CompleteTxBytes) (CacheHint if L2CacheHint)];
    CpReduceAsyncBulkTensor "cp.reduce.async.bulk.tensor" 0 2 3 90 80
        [Dst Src (CacheHint if L2CacheHint)];
    // tensor-map objects (sm_90a): edit a map's field in place; copy a map to global memory
    // with the tensormap proxy release fence
    TensormapReplace "tensormap.replace" 0 2 3 90 83 [(Addr: AddrOnly) (?Ord: U32) (Value: T)];
    TensormapCpFenceproxy "tensormap.cp_fenceproxy" 0 3 3 90 83
        [(Dst: AddrOnly) (Src: AddrOnly) (Size: U32)];
    // mbarrier
    MbarrierInit "mbarrier.init" 0 2 2 80 70 [Addr Count];
    MbarrierInval "mbarrier.inval" 0 1 1 80 70 [Addr];
    MbarrierArrive "mbarrier.arrive" 1 1 2 80 70
        [State Addr (?Count unless ExpectTx) (TxCount if ExpectTx)];
    MbarrierArriveDrop "mbarrier.arrive_drop" 1 1 2 80 70
        [State Addr (?Count unless ExpectTx) (TxCount if ExpectTx)];
    MbarrierExpectTx "mbarrier.expect_tx" 0 2 2 90 80 [Addr TxCount];
    MbarrierCompleteTx "mbarrier.complete_tx" 0 2 2 90 80 [Addr TxCount];
    MbarrierTestWait "mbarrier.test_wait" 1 2 2 80 70
        [WaitComplete Addr (State unless Parity) (Phase if Parity)];
    MbarrierTryWait "mbarrier.try_wait" 1 2 3 90 78
        [WaitComplete Addr (State unless Parity) (Phase if Parity) (?SuspendHint)];
    MbarrierPendingCount "mbarrier.pending_count" 1 1 1 80 70 [Dst State];
    // Hopper warpgroup MMA and friends
    WgmmaFence "wgmma.fence" 0 0 0 90 80; WgmmaCommitGroup "wgmma.commit_group" 0 0 0 90 80;
    WgmmaWaitGroup "wgmma.wait_group" 0 1 1 90 80 [N];
    WgmmaMmaAsync "wgmma.mma_async" 1 3 7 90 80
        [Dst A BDesc ScaleD (?ImmScaleA) (?ImmScaleB) (?ImmTransA unless_vec 1) (?ImmTransB)];
    // sparse A (compressed, from registers or a descriptor) with its metadata and selector
    WgmmaMmaAsyncSp "wgmma.mma_async.sp" 1 5 9 90 82
        [Dst A BDesc (Meta: B32) SparsitySel ScaleD (?ImmScaleA) (?ImmScaleB)
         (?ImmTransA unless_vec 1) (?ImmTransB)];
    Setmaxnreg "setmaxnreg" 0 1 1 90 80 [RegCount]; Griddepcontrol "griddepcontrol" 0 0 0 90 78;
    // performance-monitor events (`pmevent N`, `pmevent.mask M`)
    Pmevent "pmevent" 0 1 1 20 14 [A];
    Mapa "mapa" 1 2 2 90 78 [(Dst: T) (A: T) (CtaRank: U32)]; Getctarank "getctarank" 1 1 1 90 78 [Dst A];
    // textures and surfaces (unified mode: the handle is a .u64 operand; emu::texture)
    Tex "tex" 1 1 5 20 10
        [Dst Addr (Lod if Level) (Dpdx if Grad) (Dpdy if Grad) (?TexOffset vec) (?DepthCompare)];
    Tld4 "tld4" 1 1 3 20 22 [Dst Addr (?TexOffset vec) (?DepthCompare)];
    Txq "txq" 1 1 2 20 15 [Dst Addr (Lod if Level)]; Suld "suld" 1 1 1 20 15 [Dst Addr];
    Sust "sust" 0 2 2 20 15 [Addr Src]; Sured "sured" 0 2 2 20 20 [Addr Src];
    Suq "suq" 1 1 1 20 15 [Dst Addr]; Istypep "istypep" 1 1 1 30 40 [Dst A];
}

impl Opcode {
    pub fn name(self) -> &'static str {
        self.info().name
    }
    /// Instructions that end a thread's straight-line flow.
    pub fn is_branch(self) -> bool {
        matches!(
            self,
            Opcode::Bra | Opcode::BrxIdx | Opcode::Ret | Opcode::Exit | Opcode::Trap
        )
    }
    /// The longest number of dotted parts any opcode name has (`cp.reduce.async.bulk.tensor`).
    pub const MAX_PARTS: usize = 5;
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What an instruction needs from the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub min_sm: u32,
    pub min_ptx: u32,
    /// Needs an architecture-specific target (`sm_90a`).
    pub arch_specific: bool,
}

/// The target and ISA version an instruction needs, refined by its modifiers (FP8 `mma` needs
/// sm_89, `wgmma` needs sm_90a, ...). Numbers follow the "Target ISA notes" of the PTX ISA
/// reference, cross-checked against ptxas 13 where it still accepts the target.
pub fn requirement(ins: &Instruction) -> Requirement {
    let info = ins.op.info();
    let mut r = Requirement {
        min_sm: info.min_sm,
        min_ptx: info.min_ptx,
        arch_specific: false,
    };
    let mut need = |sm: u32, ptx: u32| {
        r.min_sm = r.min_sm.max(sm);
        r.min_ptx = r.min_ptx.max(ptx);
    };
    let t = TypeFacts::of(ins);
    let has_flag = |f: Flag| ins.mods.contains(&Mod::Flag(f));
    let arch_specific = match ins.op {
        Opcode::Mma => {
            mma_needs(ins, t.fp8, &mut need);
            false
        }
        Opcode::WgmmaFence
        | Opcode::WgmmaCommitGroup
        | Opcode::WgmmaWaitGroup
        | Opcode::WgmmaMmaAsync
        | Opcode::Setmaxnreg
        | Opcode::TensormapReplace => true,
        Opcode::WgmmaMmaAsyncSp => {
            // mixed s8/u8 inputs arrived in PTX 8.4
            let tys: Vec<Ty> = ins.types().collect();
            if matches!(tys[..], [_, Ty::S8, Ty::U8] | [_, Ty::U8, Ty::S8]) {
                need(90, 84);
            }
            true
        }
        _ => {
            other_needs(ins, &t, &has_flag, &mut need);
            false
        }
    };
    r.arch_specific = arch_specific;
    r
}

/// What the modifiers say about an instruction's types.
struct TypeFacts {
    fp8: bool,
    bf16: bool,
    f16: bool,
}

impl TypeFacts {
    fn of(ins: &Instruction) -> TypeFacts {
        let has_ty = |t: Ty| ins.mods.contains(&Mod::Type(t));
        TypeFacts {
            fp8: ins.mods.iter().any(|m| {
                matches!(
                    m,
                    Mod::Type(
                        Ty::E4m3 | Ty::E5m2 | Ty::E4m3x2 | Ty::E5m2x2 | Ty::E4m3x4 | Ty::E5m2x4
                    )
                )
            }),
            bf16: has_ty(Ty::Bf16) || has_ty(Ty::Bf16x2),
            f16: has_ty(Ty::F16) || has_ty(Ty::F16x2),
        }
    }
}

/// The rules of every instruction that is not arch-specific and not `mma.sync`.
fn other_needs(
    ins: &Instruction,
    t: &TypeFacts,
    has_flag: &dyn Fn(Flag) -> bool,
    need: &mut dyn FnMut(u32, u32),
) {
    let (fp8, bf16, f16) = (t.fp8, t.bf16, t.f16);
    match ins.op {
        // FP8 sparse mma: sm_89 and PTX 8.4 (`::ordered_metadata` itself needs 8.5: its row)
        Opcode::MmaSp | Opcode::MmaSpOrdered if fp8 => need(89, 84),
        Opcode::Cvt => cvt_needs(ins, t, need),
        Opcode::Add
        | Opcode::Sub
        | Opcode::Mul
        | Opcode::Min
        | Opcode::Max
        | Opcode::Neg
        | Opcode::Abs
        | Opcode::Fma
        | Opcode::Setp
        | Opcode::Set
        | Opcode::Ex2
        | Opcode::Tanh => half_needs(ins, t, has_flag, need),
        Opcode::Rcp | Opcode::Sqrt | Opcode::Rsqrt if bf16 || f16 => need(75, 70),
        Opcode::Shfl | Opcode::Vote if ins.has(Flag::Sync) => need(30, 60),
        Opcode::Ld | Opcode::St | Opcode::Atom | Opcode::Red => memory_needs(ins, need),
        Opcode::Fence => fence_needs(ins, need),
        Opcode::MbarrierArrive | Opcode::MbarrierArriveDrop
            if ins.has(Flag::ExpectTx)
                || ins.has(Flag::Cluster)
                || ins.has(Flag::Release)
                || ins.has(Flag::Relaxed)
                || ins
                    .mods
                    .contains(&Mod::Space(crate::types::Space::SharedCluster)) =>
        {
            need(90, 80)
        }
        Opcode::MbarrierTestWait if ins.has(Flag::Parity) => need(80, 71),
        Opcode::Pmevent if ins.has(Flag::Mask) => need(20, 30),
        Opcode::Lop3 if ins.args.len() > 5 => need(50, 82),
        Opcode::Createpolicy if ins.has(Flag::Range) || ins.has(Flag::CvtPolicy) => need(80, 74),
        Opcode::MultimemLdReduce | Opcode::MultimemRed if ins.has(Flag::AccF32) => need(90, 82),
        Opcode::Cvta | Opcode::Isspacep => space_needs(ins, need),
        Opcode::Bar | Opcode::Barrier if ins.has(Flag::Red) => need(20, 20),
        Opcode::WmmaLoadA
        | Opcode::WmmaLoadB
        | Opcode::WmmaLoadC
        | Opcode::WmmaStoreD
        | Opcode::WmmaMma => wmma_needs(ins, t, need),
        _ => {}
    }
}

/// `cvt`: FP8, bf16, tf32, `.relu`, `.satfinite`, f16x2 and `.pack` forms.
fn cvt_needs(ins: &Instruction, t: &TypeFacts, need: &mut dyn FnMut(u32, u32)) {
    let (fp8, bf16) = (t.fp8, t.bf16);
    let has_flag = |f: Flag| ins.mods.contains(&Mod::Flag(f));
    let dst = ins.ty();
    let src = ins.types().nth(1);
    if fp8 {
        // PTX 7.8 introduced the forms for sm_90; sm_89 needs 8.1. The table has one
        // answer per instruction, so it asks for 8.1 (valid on both targets).
        need(89, 81);
    }
    if bf16 {
        if dst == Some(Ty::F32) && src == Some(Ty::Bf16) {
            // cvt.f32.bf16; with .ftz it is an sm_90 form
            if has_flag(Flag::Ftz) {
                need(90, 78);
            } else {
                need(80, 71);
            }
        } else if src == Some(Ty::F32) && !ins.has(Flag::Rs) {
            need(80, 70);
        } else {
            // bf16 <-> integers, f16, f64, bf16
            need(90, 78);
        }
    }
    if dst == Some(Ty::Tf32) {
        if ins.has(Flag::Rna) {
            need(80, 70);
        } else {
            need(90, 78);
        }
    }
    if ins.has(Flag::Relu) && !fp8 {
        need(80, 70);
    }
    if ins.has(Flag::Satfinite) && !fp8 {
        need(0, 81);
    }
    if dst == Some(Ty::F16x2) && src == Some(Ty::F32) {
        need(80, 70);
    }
    if ins.has(Flag::Pack) {
        need(72, 65);
    }
}

/// Half-precision (f16/bf16) arithmetic, comparisons and special functions, and their flags.
fn half_needs(
    ins: &Instruction,
    t: &TypeFacts,
    has_flag: &dyn Fn(Flag) -> bool,
    need: &mut dyn FnMut(u32, u32),
) {
    let (bf16, f16) = (t.bf16, t.f16);
    match ins.op {
        Opcode::Add | Opcode::Sub | Opcode::Mul => {
            if bf16 {
                need(90, 78);
            } else if f16 {
                need(53, 42);
            }
        }
        Opcode::Min | Opcode::Max => {
            if bf16 || f16 {
                need(80, 70);
            }
            if has_flag(Flag::NaN) {
                need(80, 70);
            }
            if has_flag(Flag::Xorsign) {
                need(86, 72);
            }
            if ins.args.len() > 3 {
                // three-input min/max
                need(100, 88);
            }
        }
        Opcode::Neg | Opcode::Abs => {
            if bf16 {
                need(80, 70);
            } else if f16 {
                need(53, if ins.op == Opcode::Neg { 60 } else { 65 });
            }
        }
        Opcode::Fma => {
            if bf16 {
                need(80, 70);
            } else if f16 {
                need(53, 42);
            }
            if ins.has(Flag::Relu) {
                need(80, 70);
            }
            if ins.has(Flag::Oob) {
                need(90, 81);
            }
        }
        Opcode::Setp | Opcode::Set => {
            if bf16 {
                need(90, 78);
            } else if f16 {
                need(53, 42);
            }
        }
        Opcode::Ex2 | Opcode::Tanh => {
            if bf16 {
                need(90, 78);
            } else if f16 {
                need(75, 70);
            }
        }
        _ => {}
    }
}

/// `fence` variants: proxy kinds and restrictions.
fn fence_needs(ins: &Instruction, need: &mut dyn FnMut(u32, u32)) {
    if ins.has(Flag::SyncRestrictSharedCluster) || ins.has(Flag::SyncRestrictSharedCta) {
        need(90, 86);
    }
    if ins.has(Flag::AsyncGeneric) {
        need(90, 83);
    }
    if ins.has(Flag::Proxy) && ins.has(Flag::Tensormap) || ins.has(Flag::TensormapGeneric) {
        need(90, 83);
    } else if ins.has(Flag::Proxy) && ins.has(Flag::Async) || ins.has(Flag::MbarrierInit) {
        need(90, 80);
    } else if ins.has(Flag::Proxy) && ins.has(Flag::Alias) {
        need(70, 75);
    }
}

/// `cvta`/`isspacep` on `.shared::cluster` and the parameter spaces.
fn space_needs(ins: &Instruction, need: &mut dyn FnMut(u32, u32)) {
    if ins
        .mods
        .contains(&Mod::Space(crate::types::Space::SharedCluster))
    {
        need(90, 78);
    }
    if ins
        .mods
        .iter()
        .any(|m| matches!(m, Mod::Space(s) if s.is_param()))
    {
        need(70, 77);
    }
}

/// `wmma.*`: integer forms arrived with sm_72, sub-byte and `.b1` with sm_75, bf16/tf32/f64
/// with sm_80, `.and.popc` with sm_80 and PTX 7.1.
fn wmma_needs(ins: &Instruction, t: &TypeFacts, need: &mut dyn FnMut(u32, u32)) {
    let has_ty = |ty: Ty| ins.mods.contains(&Mod::Type(ty));
    let bf16 = t.bf16;
    if has_ty(Ty::S8) || has_ty(Ty::U8) || has_ty(Ty::S32) {
        need(72, 63);
    }
    if has_ty(Ty::S4) || has_ty(Ty::U4) || has_ty(Ty::B1) {
        need(75, 63);
    }
    if ins.has(Flag::And) {
        need(80, 71);
    }
    if bf16 || has_ty(Ty::Tf32) || has_ty(Ty::F64) {
        need(80, 70);
    }
}

/// `mma.sync`: the target and ISA version of each shape and input type (FP8 on sm_89).
fn mma_needs(ins: &Instruction, fp8: bool, need: &mut dyn FnMut(u32, u32)) {
    let at = ins.types().nth(1);
    // `.b1` `.and.popc` needs sm_80 and PTX 7.1; m8n8k128 `.b1` PTX 7.0 (ptxas 13.5)
    if ins.has(Flag::And) {
        need(80, 71);
    }
    if at == Some(Ty::B1) {
        need(75, 70);
    }
    match (ins.shape(), at) {
        // f16 accumulators with FP8 inputs arrived in PTX 8.7.
        _ if fp8 && ins.types().next() == Some(Ty::F16) => need(89, 87),
        _ if fp8 => need(89, 84),
        // m8n8k4 .f16 (Volta)
        (
            Some(Mod::Shape {
                m: 8,
                n: 8,
                k: Some(4),
            }),
            Some(Ty::F16),
        ) => need(70, 64),
        // m8n8k4 .bf16: undocumented, ptxas 13.5 takes it on sm_80 with PTX 7.0
        (
            Some(Mod::Shape {
                m: 8,
                n: 8,
                k: Some(4),
            }),
            Some(Ty::Bf16),
        ) => need(80, 70),
        (
            Some(Mod::Shape {
                m: 8,
                n: 8,
                k: Some(4),
            }),
            Some(Ty::F64),
        ) => need(80, 70),
        // m8n8k16 / m8n8k32 integer, m8n8k128 .b1 (Turing)
        (
            Some(Mod::Shape {
                m: 8,
                n: 8,
                k: Some(_),
            }),
            _,
        ) => need(75, 65),
        (
            Some(Mod::Shape {
                m: 16,
                n: 8,
                k: Some(8),
            }),
            Some(Ty::F16),
        ) => need(75, 65),
        (
            Some(Mod::Shape {
                m: 16,
                n: 8,
                k: Some(_),
            }),
            _,
        ) => need(80, 70),
        _ => need(75, 65),
    }
}

/// Loads, stores and atomics: memory-order qualifiers, cluster spaces, cache hints and
/// eviction priorities, vector and 128-bit forms, and the atomic types added over time.
fn memory_needs(ins: &Instruction, need: &mut dyn FnMut(u32, u32)) {
    let has_ty = |t: Ty| ins.mods.contains(&Mod::Type(t));
    let bf16 = has_ty(Ty::Bf16) || has_ty(Ty::Bf16x2);
    if ins.mods.iter().any(|m| {
        matches!(
            m,
            Mod::Flag(Flag::Relaxed | Flag::Acquire | Flag::Release | Flag::AcqRel)
        )
    }) {
        need(70, 60);
    }
    if ins
        .mods
        .contains(&Mod::Space(crate::types::Space::SharedCluster))
        || ins.has(Flag::Cluster)
    {
        need(90, 78);
    }
    if ins
        .mods
        .iter()
        .any(|m| matches!(m, Mod::Flag(Flag::L2CacheHint)))
    {
        need(80, 74);
    }
    if ins.mods.iter().any(|m| {
        matches!(
            m,
            Mod::Flag(
                Flag::L1EvictNormal
                    | Flag::L1EvictUnchanged
                    | Flag::L1EvictFirst
                    | Flag::L1EvictLast
                    | Flag::L1NoAllocate
                    | Flag::L2EvictNormal
                    | Flag::L2EvictFirst
                    | Flag::L2EvictLast
            )
        )
    }) {
        need(70, 74);
    }
    if ins
        .mods
        .iter()
        .any(|m| matches!(m, Mod::Flag(Flag::L264B | Flag::L2128B | Flag::L2256B)))
    {
        need(75, 74);
    }
    let atomic = ins.op == Opcode::Atom || ins.op == Opcode::Red;
    if atomic && ins.vec_width().is_some() {
        need(90, 81);
    } else if ins.vec_width() == Some(8) {
        // 256-bit loads and stores
        need(100, 88);
    }
    if atomic && bf16 {
        need(90, 78);
    }
    if atomic && has_ty(Ty::F16x2) {
        need(60, 63);
    }
    if atomic && has_ty(Ty::F16) {
        need(70, 63);
    }
    if atomic && has_ty(Ty::F64) {
        need(60, 20);
    }
    if atomic && has_ty(Ty::B128) {
        need(90, 83);
    } else if has_ty(Ty::B128) {
        // ld/st .b128
        need(70, 83);
    }
    if atomic && has_ty(Ty::B16) {
        // atom.cas.b16
        need(70, 63);
    }
}
