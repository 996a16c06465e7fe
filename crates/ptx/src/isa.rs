//! The instruction table: one description per opcode (name, operand counts, the target and ISA
//! version it first needs). The parser, printer, validator, builder and the emulator's decoder all
//! read this table; adding an instruction starts here.
//!
//! Opcodes are the dotted prefix PTX uses to name an instruction family (`mbarrier.try_wait`,
//! `cp.async.bulk.tensor`); the parser matches the longest known prefix and treats the remaining
//! dotted parts as modifiers ([`crate::Mod`]).

use crate::ir::Instruction;
use crate::mods::{Flag, Mod};
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
    ($($var:ident $name:literal $d:literal $lo:literal $hi:literal $sm:literal $ptx:literal;)*) => {
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
        }
    };
}

opcodes! {
    // integer and float arithmetic
    Add "add" 1 2 2 20 10; Addc "addc" 1 2 2 20 12; Sub "sub" 1 2 2 20 10; Subc "subc" 1 2 2 20 12;
    Mul "mul" 1 2 2 20 10; Mad "mad" 1 3 3 20 10; Madc "madc" 1 3 3 20 30;
    Mul24 "mul24" 1 2 2 20 10; Mad24 "mad24" 1 3 3 20 10; Sad "sad" 1 3 3 20 10;
    Div "div" 1 2 2 20 10; Rem "rem" 1 2 2 20 10; Abs "abs" 1 1 1 20 10; Neg "neg" 1 1 1 20 10;
    Min "min" 1 2 3 20 10; Max "max" 1 2 3 20 10; Fma "fma" 1 3 3 20 14;
    Copysign "copysign" 1 2 2 20 30; Testp "testp" 1 1 1 20 20;
    Rcp "rcp" 1 1 1 20 10; Sqrt "sqrt" 1 1 1 20 10; Rsqrt "rsqrt" 1 1 1 20 10;
    Sin "sin" 1 1 1 20 10; Cos "cos" 1 1 1 20 10; Lg2 "lg2" 1 1 1 20 10; Ex2 "ex2" 1 1 1 20 10;
    Tanh "tanh" 1 1 1 75 70;
    // bit manipulation
    And "and" 1 2 2 20 10; Or "or" 1 2 2 20 10; Xor "xor" 1 2 2 20 10; Not "not" 1 1 1 20 10;
    Cnot "cnot" 1 1 1 20 10; Shl "shl" 1 2 2 20 10; Shr "shr" 1 2 2 20 10; Shf "shf" 1 3 3 32 31;
    Bfe "bfe" 1 3 3 20 20; Bfi "bfi" 1 4 4 20 20; Prmt "prmt" 1 3 3 20 20;
    Popc "popc" 1 1 1 20 20; Clz "clz" 1 1 1 20 20; Brev "brev" 1 1 1 20 20;
    Bfind "bfind" 1 1 1 20 20; Lop3 "lop3" 1 4 4 50 43; Dp4a "dp4a" 1 3 3 61 50;
    Dp2a "dp2a" 1 3 3 61 50; Fns "fns" 1 3 3 30 60; Bmsk "bmsk" 1 2 2 70 76;
    Szext "szext" 1 2 2 70 76;
    // video: scalar (a third operand for the secondary op or the merge form) and SIMD
    Vadd "vadd" 1 2 3 20 20; Vsub "vsub" 1 2 3 20 20; Vabsdiff "vabsdiff" 1 2 3 20 20;
    Vmin "vmin" 1 2 3 20 20; Vmax "vmax" 1 2 3 20 20; Vshl "vshl" 1 2 3 20 20;
    Vshr "vshr" 1 2 3 20 20; Vmad "vmad" 1 3 3 20 20; Vset "vset" 1 2 3 20 20;
    Vadd2 "vadd2" 1 3 3 30 30; Vsub2 "vsub2" 1 3 3 30 30; Vavrg2 "vavrg2" 1 3 3 30 30;
    Vabsdiff2 "vabsdiff2" 1 3 3 30 30; Vmin2 "vmin2" 1 3 3 30 30; Vmax2 "vmax2" 1 3 3 30 30;
    Vset2 "vset2" 1 3 3 30 30; Vadd4 "vadd4" 1 3 3 30 30; Vsub4 "vsub4" 1 3 3 30 30;
    Vavrg4 "vavrg4" 1 3 3 30 30; Vabsdiff4 "vabsdiff4" 1 3 3 30 30; Vmin4 "vmin4" 1 3 3 30 30;
    Vmax4 "vmax4" 1 3 3 30 30; Vset4 "vset4" 1 3 3 30 30;
    // comparison and selection
    Setp "setp" 1 2 3 20 10; Set "set" 1 2 3 20 10; Selp "selp" 1 3 3 20 10;
    Slct "slct" 1 3 3 20 10;
    // data movement and conversion
    Mov "mov" 1 1 1 20 10; Cvt "cvt" 1 1 3 20 10; Cvta "cvta" 1 1 1 20 20;
    Isspacep "isspacep" 1 1 1 20 20; Ld "ld" 1 1 2 20 10; Ldu "ldu" 1 1 1 20 20;
    St "st" 0 2 3 20 10; StAsync "st.async" 0 3 3 90 81; Prefetch "prefetch" 0 1 1 20 20;
    Prefetchu "prefetchu" 0 1 1 20 20; Createpolicy "createpolicy" 1 1 3 80 74;
    Discard "discard" 0 2 2 80 74; Applypriority "applypriority" 0 2 2 80 74;
    // atomics
    Atom "atom" 1 2 4 20 11; Red "red" 0 2 3 20 12; RedAsync "red.async" 0 3 3 90 81;
    // barriers and fences
    Bar "bar" 0 0 3 20 10; Barrier "barrier" 0 0 3 20 60; BarWarpSync "bar.warp.sync" 0 1 1 30 60;
    BarrierCluster "barrier.cluster" 0 0 0 90 78; Membar "membar" 0 0 0 20 14;
    Fence "fence" 0 0 2 70 60;
    // warp-level
    Shfl "shfl" 1 3 4 30 30; Vote "vote" 1 1 2 20 12; Match "match" 1 2 2 70 60;
    Redux "redux" 1 2 2 80 70; Activemask "activemask" 1 0 0 30 62; Elect "elect" 1 1 1 90 80;
    // control flow
    Bra "bra" 0 1 1 20 10; BrxIdx "brx.idx" 0 2 2 30 60; Call "call" 0 1 3 20 10;
    Ret "ret" 0 0 0 20 10; Exit "exit" 0 0 0 20 10; Trap "trap" 0 0 0 20 10;
    Brkpt "brkpt" 0 0 0 20 11; Nanosleep "nanosleep" 0 1 1 70 63;
    // tensor cores (Ampere/Ada)
    Mma "mma" 1 3 3 70 64; Ldmatrix "ldmatrix" 1 1 1 75 65; Stmatrix "stmatrix" 0 2 2 90 78;
    // asynchronous copies
    CpAsync "cp.async" 0 3 5 80 70; CpAsyncCommitGroup "cp.async.commit_group" 0 0 0 80 70;
    CpAsyncWaitGroup "cp.async.wait_group" 0 1 1 80 70; CpAsyncWaitAll "cp.async.wait_all" 0 0 0 80 70;
    CpAsyncMbarrierArrive "cp.async.mbarrier.arrive" 0 1 1 80 70;
    CpAsyncBulk "cp.async.bulk" 0 3 6 90 80; CpAsyncBulkTensor "cp.async.bulk.tensor" 0 2 6 90 80;
    CpAsyncBulkCommitGroup "cp.async.bulk.commit_group" 0 0 0 90 80;
    CpAsyncBulkWaitGroup "cp.async.bulk.wait_group" 0 1 1 90 80;
    CpAsyncBulkPrefetchTensor "cp.async.bulk.prefetch.tensor" 0 2 3 90 80;
    CpReduceAsyncBulk "cp.reduce.async.bulk" 0 3 4 90 80;
    CpReduceAsyncBulkTensor "cp.reduce.async.bulk.tensor" 0 2 3 90 80;
    // mbarrier
    MbarrierInit "mbarrier.init" 0 2 2 80 70; MbarrierInval "mbarrier.inval" 0 1 1 80 70;
    MbarrierArrive "mbarrier.arrive" 1 1 2 80 70; MbarrierArriveDrop "mbarrier.arrive_drop" 1 1 2 80 70;
    MbarrierExpectTx "mbarrier.expect_tx" 0 2 2 90 80; MbarrierCompleteTx "mbarrier.complete_tx" 0 2 2 90 80;
    MbarrierTestWait "mbarrier.test_wait" 1 2 2 80 70; MbarrierTryWait "mbarrier.try_wait" 1 2 3 90 78;
    MbarrierPendingCount "mbarrier.pending_count" 1 1 1 80 70;
    // Hopper warpgroup MMA and friends
    WgmmaFence "wgmma.fence" 0 0 0 90 80; WgmmaCommitGroup "wgmma.commit_group" 0 0 0 90 80;
    WgmmaWaitGroup "wgmma.wait_group" 0 1 1 90 80; WgmmaMmaAsync "wgmma.mma_async" 1 3 7 90 80;
    Setmaxnreg "setmaxnreg" 0 1 1 90 80; Griddepcontrol "griddepcontrol" 0 0 0 90 78;
    Mapa "mapa" 1 2 2 90 78; Getctarank "getctarank" 1 1 1 90 78;
    // textures and surfaces (unified mode: the handle is a .u64 operand; emu::texture)
    Tex "tex" 1 1 1 20 10; Tld4 "tld4" 1 1 1 20 22; Txq "txq" 1 1 1 20 15;
    Suld "suld" 1 1 1 20 15; Sust "sust" 0 2 2 20 15; Sured "sured" 0 2 2 20 20;
    Suq "suq" 1 1 1 20 15; Istypep "istypep" 1 1 1 30 40;
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
    /// The longest number of dotted parts any opcode name has.
    pub const MAX_PARTS: usize = 4;
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
    let fp8 = ins.mods.iter().any(|m| {
        matches!(
            m,
            Mod::Type(Ty::E4m3 | Ty::E5m2 | Ty::E4m3x2 | Ty::E5m2x2 | Ty::E4m3x4 | Ty::E5m2x4)
        )
    });
    let has_ty = |t: Ty| ins.mods.contains(&Mod::Type(t));
    let bf16 = has_ty(Ty::Bf16) || has_ty(Ty::Bf16x2);
    let f16 = has_ty(Ty::F16) || has_ty(Ty::F16x2);
    let has_flag = |f: Flag| ins.mods.contains(&Mod::Flag(f));
    match ins.op {
        Opcode::Mma => {
            let at = ins.types().nth(1);
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
        Opcode::Cvt => {
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
        Opcode::WgmmaFence
        | Opcode::WgmmaCommitGroup
        | Opcode::WgmmaWaitGroup
        | Opcode::WgmmaMmaAsync
        | Opcode::Setmaxnreg => r.arch_specific = true,
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
        Opcode::Rcp | Opcode::Sqrt | Opcode::Rsqrt if bf16 || f16 => need(75, 70),
        Opcode::Shfl | Opcode::Vote if ins.has(Flag::Sync) => need(30, 60),
        Opcode::Ld | Opcode::St | Opcode::Atom | Opcode::Red => {
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
            }
        }
        Opcode::Fence => {
            if ins.has(Flag::Proxy) && ins.has(Flag::Tensormap) || ins.has(Flag::TensormapGeneric) {
                need(90, 83);
            } else if ins.has(Flag::Proxy) && ins.has(Flag::Async) || ins.has(Flag::MbarrierInit) {
                need(90, 80);
            } else if ins.has(Flag::Proxy) && ins.has(Flag::Alias) {
                need(70, 75);
            }
        }
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
        Opcode::Cvta | Opcode::Isspacep => {
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
        Opcode::Bar | Opcode::Barrier if ins.has(Flag::Red) => need(20, 20),
        _ => {}
    }
    r
}
