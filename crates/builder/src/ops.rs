//! Typed instruction methods on [`KernelBuilder`]: one call, one PTX instruction (destination
//! first: methods return the fresh destination register; `*_to` variants write an existing one).

use crate::error::BuildError;
use crate::kernel::KernelBuilder;
use crate::ty::*;
use ptx::{AddrBase, Flag, Imm, Mod, Opcode, Operand, SReg, Space, Ty};
// The modifier families are defined once, in `ptx::ops`; the builder's names for them.
pub use ptx::ops::{
    AtomOp, CmpOp, MemOrder as AtomSem, ReduxOp, Rounding as Rnd, Rounding as CvtRnd, Scope,
    ShflMode,
};

fn t(ty: Ty) -> Mod {
    Mod::Type(ty)
}
fn f(fl: Flag) -> Mod {
    Mod::Flag(fl)
}
fn sp(s: Space) -> Mod {
    Mod::Space(s)
}
fn imm(v: i64) -> Operand {
    Operand::Imm(Imm::Int(v))
}
fn vec_op<T: PtxType>(r: &[Reg<T>]) -> Operand {
    Operand::Vec(r.iter().map(|x| x.op()).collect())
}

/// Float modifiers: rounding, flush-to-zero, saturation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FMods {
    pub rnd: Option<Rnd>,
    pub ftz: bool,
    pub sat: bool,
}
impl FMods {
    pub fn rn() -> FMods {
        FMods {
            rnd: Some(Rnd::Rn),
            ..FMods::default()
        }
    }
    pub fn rnd(r: Rnd) -> FMods {
        FMods {
            rnd: Some(r),
            ..FMods::default()
        }
    }
    pub fn ftz(mut self) -> FMods {
        self.ftz = true;
        self
    }
    pub fn sat(mut self) -> FMods {
        self.sat = true;
        self
    }
    fn mods(self) -> Vec<Mod> {
        let mut v = Vec::new();
        if let Some(r) = self.rnd {
            v.push(f(r.flag()));
        }
        if self.ftz {
            v.push(f(Flag::Ftz));
        }
        if self.sat {
            v.push(f(Flag::Sat));
        }
        v
    }
}

/// `cvt` modifiers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CvtMods {
    pub rnd: Option<CvtRnd>,
    pub ftz: bool,
    pub sat: bool,
    pub relu: bool,
    pub satfinite: bool,
}
impl CvtMods {
    fn mods(self) -> Vec<Mod> {
        let mut v = Vec::new();
        if let Some(r) = self.rnd {
            v.push(f(r.flag()));
        }
        if self.ftz {
            v.push(f(Flag::Ftz));
        }
        if self.sat {
            v.push(f(Flag::Sat));
        }
        if self.relu {
            v.push(f(Flag::Relu));
        }
        if self.satfinite {
            v.push(f(Flag::Satfinite));
        }
        v
    }
}

/// Memory ordering of `ld`/`st`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sem {
    /// Plain (weak) access: no modifier.
    #[default]
    Weak,
    Volatile,
    Relaxed(Scope),
    Acquire(Scope),
    Release(Scope),
}

/// Cache operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOp {
    Ca,
    Cg,
    Cs,
    Lu,
    Cv,
    Wb,
    Wt,
}
impl CacheOp {
    fn flag(self) -> Flag {
        match self {
            CacheOp::Ca => Flag::Ca,
            CacheOp::Cg => Flag::Cg,
            CacheOp::Cs => Flag::Cs,
            CacheOp::Lu => Flag::Lu,
            CacheOp::Cv => Flag::Cv,
            CacheOp::Wb => Flag::Wb,
            CacheOp::Wt => Flag::Wt,
        }
    }
}

/// L1 eviction priority (`.L1::evict_*`, `.L1::no_allocate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evict {
    Normal,
    Unchanged,
    First,
    Last,
    NoAllocate,
}
impl Evict {
    fn flag(self) -> Flag {
        match self {
            Evict::Normal => Flag::L1EvictNormal,
            Evict::Unchanged => Flag::L1EvictUnchanged,
            Evict::First => Flag::L1EvictFirst,
            Evict::Last => Flag::L1EvictLast,
            Evict::NoAllocate => Flag::L1NoAllocate,
        }
    }
}

/// Options of `ld`/`st`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemOpts {
    pub sem: Sem,
    pub cache: Option<CacheOp>,
    pub evict: Option<Evict>,
    /// `ld.global.nc` (read-only data path).
    pub nc: bool,
}
impl MemOpts {
    pub fn sem(sem: Sem) -> MemOpts {
        MemOpts {
            sem,
            ..MemOpts::default()
        }
    }
    pub fn cache(c: CacheOp) -> MemOpts {
        MemOpts {
            cache: Some(c),
            ..MemOpts::default()
        }
    }
    pub fn nc() -> MemOpts {
        MemOpts {
            nc: true,
            ..MemOpts::default()
        }
    }
}

/// `membar` levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MembarLevel {
    Cta,
    Gl,
    Sys,
}

/// Approximate math functions (`.approx.f32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApproxFn {
    Ex2,
    Lg2,
    Rcp,
    Sqrt,
    Rsqrt,
    Sin,
    Cos,
    Tanh,
}

/// `mma.sync` shapes with their fragment types: A has 4 registers, B 2, C/D 4 per thread.
pub trait MmaShape {
    type A: PtxType;
    type B: PtxType;
    type C: PtxType;
    /// (m, n, k)
    const SHAPE: (u16, u16, u16);
    /// Type modifiers `.dtype.atype.btype.ctype`.
    const TYPES: [Ty; 4];
}

macro_rules! mma_shape {
    ($($(#[$m:meta])* $name:ident: $a:ty, $b:ty, $c:ty, ($mm:literal, $nn:literal, $kk:literal), [$d:ident, $at:ident, $bt:ident, $ct:ident];)*) => {$(
        $(#[$m])*
        #[derive(Clone, Copy, Debug)]
        pub struct $name;
        impl MmaShape for $name {
            type A = $a;
            type B = $b;
            type C = $c;
            const SHAPE: (u16, u16, u16) = ($mm, $nn, $kk);
            const TYPES: [Ty; 4] = [Ty::$d, Ty::$at, Ty::$bt, Ty::$ct];
        }
    )*};
}
mma_shape! {
    /// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` (sm_80)
    M16N8K16Bf16: Bf16x2, Bf16x2, f32, (16, 8, 16), [F32, Bf16, Bf16, F32];
    /// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32` (sm_80)
    M16N8K16F16: F16x2, F16x2, f32, (16, 8, 16), [F32, F16, F16, F32];
    /// `mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32` (sm_89)
    M16N8K32E4m3: E4m3x4, E4m3x4, f32, (16, 8, 32), [F32, E4m3, E4m3, F32];
    /// `mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32` (sm_89)
    M16N8K32E5m2: E5m2x4, E5m2x4, f32, (16, 8, 32), [F32, E5m2, E5m2, F32];
    /// `mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32` (sm_80)
    M16N8K32S8: B32, B32, i32, (16, 8, 32), [S32, S8, S8, S32];
    /// `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32` (sm_80)
    M16N8K8Tf32: Tf32, Tf32, f32, (16, 8, 8), [F32, Tf32, Tf32, F32];
}

/// Input types of `wgmma.mma_async` with f32 accumulators (K = 16).
pub trait WgmmaIn: PtxType {}
impl WgmmaIn for Bf16 {}
impl WgmmaIn for F16 {}

impl KernelBuilder {
    // =========================================================================================
    // addresses

    /// Materialises a lazy address into an `[reg+off]` operand (one `mad` when indexed).
    #[track_caller]
    pub fn addr_operand<T, S: StateSpace>(&mut self, a: impl Into<Addr<T, S>>) -> Operand {
        let a = a.into();
        match a.index {
            None => Operand::Addr {
                base: AddrBase::Reg(a.ptr.base.name()),
                offset: a.ptr.off,
            },
            Some(ix) => {
                let r = self.reg::<S::A>();
                let half = if ix.wide { Flag::Wide } else { Flag::Lo };
                self.emit(
                    Opcode::Mad,
                    [f(half), t(ix.ty)],
                    [r.op(), ix.op, imm(ix.scale as i64), a.ptr.base.op()],
                );
                Operand::Addr {
                    base: AddrBase::Reg(r.name()),
                    offset: a.ptr.off,
                }
            }
        }
    }
    /// Materialises a lazy address into a pointer register (`mad.wide`), for reuse.
    #[track_caller]
    pub fn addr<T, S: StateSpace>(&mut self, a: impl Into<Addr<T, S>>) -> Ptr<T, S> {
        let a = a.into();
        match a.index {
            None => a.ptr,
            Some(ix) => {
                let r = self.reg::<S::A>();
                let half = if ix.wide { Flag::Wide } else { Flag::Lo };
                self.emit(
                    Opcode::Mad,
                    [f(half), t(ix.ty)],
                    [r.op(), ix.op, imm(ix.scale as i64), a.ptr.base.op()],
                );
                Ptr::from_reg(r).add_bytes(a.ptr.off)
            }
        }
    }

    // =========================================================================================
    // moves and special registers

    /// `mov.T d, a;`
    #[track_caller]
    pub fn mov<T: PtxType>(&mut self, a: impl Src<T>) -> Reg<T> {
        let d = self.reg::<T>();
        self.mov_to(d, a);
        d
    }
    /// `mov.T d, a;` into an existing register (loop-carried values, accumulators).
    #[track_caller]
    pub fn mov_to<T: PtxType>(&mut self, d: Reg<T>, a: impl Src<T>) {
        self.emit(Opcode::Mov, [t(T::MOV_TY)], [d.op(), a.operand()]);
    }
    /// Same as [`KernelBuilder::mov`]: a constant in a register.
    #[track_caller]
    pub fn imm<T: PtxType>(&mut self, v: impl Src<T>) -> Reg<T> {
        self.mov(v)
    }
    /// Reinterprets bits: `mov.bN d, a;` (sizes must match; checked at compile time).
    #[track_caller]
    pub fn bitcast<U: PtxType, T: PtxType>(&mut self, a: Reg<T>) -> Reg<U> {
        const {
            assert!(
                T::SIZE == U::SIZE,
                "bitcast between types of different sizes"
            )
        };
        let d = self.reg::<U>();
        self.emit(Opcode::Mov, [t(T::MOV_TY.bit_ty())], [d.op(), a.op()]);
        d
    }
    /// Packs `N` narrow registers into one: `mov.b32 d, {lo, hi};` (first element lowest).
    #[track_caller]
    pub fn pack<D: PtxType, S: PtxType, const N: usize>(&mut self, parts: [Reg<S>; N]) -> Reg<D> {
        const { assert!(S::SIZE * N as u32 == D::SIZE, "pack: sizes do not add up") };
        let d = self.reg::<D>();
        self.emit(Opcode::Mov, [t(D::TY.bit_ty())], [d.op(), vec_op(&parts)]);
        d
    }
    /// Splits a register into `N` narrow ones: `mov.b32 {lo, hi}, a;`.
    #[track_caller]
    pub fn unpack<D: PtxType, S: PtxType, const N: usize>(&mut self, a: Reg<S>) -> [Reg<D>; N] {
        const { assert!(D::SIZE * N as u32 == S::SIZE, "unpack: sizes do not add up") };
        let d: [Reg<D>; N] = self.regs();
        self.emit(Opcode::Mov, [t(S::TY.bit_ty())], [vec_op(&d), a.op()]);
        d
    }
    /// `mov.u32 d, %sreg;` for any 32-bit special register.
    #[track_caller]
    pub fn sreg(&mut self, s: SReg) -> Reg<u32> {
        let d = self.reg::<u32>();
        self.emit(Opcode::Mov, [t(Ty::U32)], [d.op(), Operand::SReg(s)]);
        d
    }
    /// `mov.u64 d, %sreg;` (`%clock64`, `%globaltimer`, `%gridid`).
    #[track_caller]
    pub fn sreg64(&mut self, s: SReg) -> Reg<u64> {
        let d = self.reg::<u64>();
        self.emit(Opcode::Mov, [t(Ty::U64)], [d.op(), Operand::SReg(s)]);
        d
    }
    #[track_caller]
    pub fn tid_x(&mut self) -> Reg<u32> {
        self.sreg(SReg::Tid(0))
    }
    #[track_caller]
    pub fn tid_y(&mut self) -> Reg<u32> {
        self.sreg(SReg::Tid(1))
    }
    #[track_caller]
    pub fn tid_z(&mut self) -> Reg<u32> {
        self.sreg(SReg::Tid(2))
    }
    #[track_caller]
    pub fn ntid_x(&mut self) -> Reg<u32> {
        self.sreg(SReg::Ntid(0))
    }
    #[track_caller]
    pub fn ntid_y(&mut self) -> Reg<u32> {
        self.sreg(SReg::Ntid(1))
    }
    #[track_caller]
    pub fn ctaid_x(&mut self) -> Reg<u32> {
        self.sreg(SReg::Ctaid(0))
    }
    #[track_caller]
    pub fn ctaid_y(&mut self) -> Reg<u32> {
        self.sreg(SReg::Ctaid(1))
    }
    #[track_caller]
    pub fn ctaid_z(&mut self) -> Reg<u32> {
        self.sreg(SReg::Ctaid(2))
    }
    #[track_caller]
    pub fn nctaid_x(&mut self) -> Reg<u32> {
        self.sreg(SReg::Nctaid(0))
    }
    #[track_caller]
    pub fn nctaid_y(&mut self) -> Reg<u32> {
        self.sreg(SReg::Nctaid(1))
    }
    /// `%laneid`
    #[track_caller]
    pub fn lane_id(&mut self) -> Reg<u32> {
        self.sreg(SReg::Laneid)
    }
    /// Warp index inside the CTA: `tid.x >> 5` (two instructions). For the hardware slot use
    /// `sreg(SReg::Warpid)`.
    #[track_caller]
    pub fn warp_id(&mut self) -> Reg<u32> {
        let t = self.tid_x();
        self.shr(t, 5u32)
    }
    /// `ctaid.x * ntid.x + tid.x` (three `mov`s and one `mad.lo.u32`).
    #[track_caller]
    pub fn global_index_x(&mut self) -> Reg<u32> {
        let c = self.ctaid_x();
        let n = self.ntid_x();
        let t = self.tid_x();
        self.mad_lo(c, n, t)
    }
    /// `%clock64`
    #[track_caller]
    pub fn clock64(&mut self) -> Reg<u64> {
        self.sreg64(SReg::Clock64)
    }
    /// `%globaltimer`
    #[track_caller]
    pub fn globaltimer(&mut self) -> Reg<u64> {
        self.sreg64(SReg::Globaltimer)
    }
    /// `%cluster_ctarank` (sm_90)
    #[track_caller]
    pub fn cluster_ctarank(&mut self) -> Reg<u32> {
        self.sreg(SReg::ClusterCtarank)
    }

    // =========================================================================================
    // arithmetic

    #[track_caller]
    fn bin<T: PtxType>(&mut self, op: Opcode, mods: Vec<Mod>, d: Reg<T>, a: Operand, b: Operand) {
        self.emit(op, mods, [d.op(), a, b]);
    }
    #[track_caller]
    fn tern<T: PtxType>(
        &mut self,
        op: Opcode,
        mods: Vec<Mod>,
        d: Reg<T>,
        a: Operand,
        b: Operand,
        c: Operand,
    ) {
        self.emit(op, mods, [d.op(), a, b, c]);
    }

    /// `add.T d, a, b;`
    #[track_caller]
    pub fn add<T: Arith>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.add_to(d, a, b);
        d
    }
    /// `add.T d, a, b;` into `d`.
    #[track_caller]
    pub fn add_to<T: Arith>(&mut self, d: Reg<T>, a: impl Src<T>, b: impl Src<T>) {
        self.bin(Opcode::Add, vec![t(T::TY)], d, a.operand(), b.operand());
    }
    /// `add.rnd.ftz.sat.T d, a, b;`
    #[track_caller]
    pub fn add_m<T: FloatLike>(&mut self, m: FMods, a: impl Src<T>, b: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        let mut mods = m.mods();
        mods.push(t(T::TY));
        self.bin(Opcode::Add, mods, d, a.operand(), b.operand());
        d
    }
    /// `add.sat.s32 d, a, b;`
    #[track_caller]
    pub fn add_sat(&mut self, a: impl Src<i32>, b: impl Src<i32>) -> Reg<i32> {
        let d = self.reg();
        self.bin(
            Opcode::Add,
            vec![f(Flag::Sat), t(Ty::S32)],
            d,
            a.operand(),
            b.operand(),
        );
        d
    }
    /// `sub.T d, a, b;`
    #[track_caller]
    pub fn sub<T: Arith>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.sub_to(d, a, b);
        d
    }
    #[track_caller]
    pub fn sub_to<T: Arith>(&mut self, d: Reg<T>, a: impl Src<T>, b: impl Src<T>) {
        self.bin(Opcode::Sub, vec![t(T::TY)], d, a.operand(), b.operand());
    }
    /// `sub.rnd.ftz.sat.T d, a, b;`
    #[track_caller]
    pub fn sub_m<T: FloatLike>(&mut self, m: FMods, a: impl Src<T>, b: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        let mut mods = m.mods();
        mods.push(t(T::TY));
        self.bin(Opcode::Sub, mods, d, a.operand(), b.operand());
        d
    }
    /// `mul.lo.T` for integers, `mul.T` for floats.
    #[track_caller]
    pub fn mul<T: Arith>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.mul_to(d, a, b);
        d
    }
    #[track_caller]
    pub fn mul_to<T: Arith>(&mut self, d: Reg<T>, a: impl Src<T>, b: impl Src<T>) {
        let mods = if T::IS_INT {
            vec![f(Flag::Lo), t(T::TY)]
        } else {
            vec![t(T::TY)]
        };
        self.bin(Opcode::Mul, mods, d, a.operand(), b.operand());
    }
    /// `mul.rnd.ftz.sat.T d, a, b;`
    #[track_caller]
    pub fn mul_m<T: FloatLike>(&mut self, m: FMods, a: impl Src<T>, b: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        let mut mods = m.mods();
        mods.push(t(T::TY));
        self.bin(Opcode::Mul, mods, d, a.operand(), b.operand());
        d
    }
    /// `mul.hi.T d, a, b;`
    #[track_caller]
    pub fn mul_hi<T: Int>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.bin(
            Opcode::Mul,
            vec![f(Flag::Hi), t(T::TY)],
            d,
            a.operand(),
            b.operand(),
        );
        d
    }
    /// `mul.wide.T d, a, b;` (u32 x u32 -> u64, ...)
    #[track_caller]
    pub fn mul_wide<T: Widen>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<T::Wide> {
        let d = self.reg::<T::Wide>();
        self.emit(
            Opcode::Mul,
            [f(Flag::Wide), t(T::TY)],
            [d.op(), a.operand(), b.operand()],
        );
        d
    }
    /// `mad.lo.T` (integers) / `fma.rn.T` is [`KernelBuilder::fma`].
    #[track_caller]
    pub fn mad_lo<T: Int>(&mut self, a: impl Src<T>, b: impl Src<T>, c: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.mad_lo_to(d, a, b, c);
        d
    }
    #[track_caller]
    pub fn mad_lo_to<T: Int>(&mut self, d: Reg<T>, a: impl Src<T>, b: impl Src<T>, c: impl Src<T>) {
        self.tern(
            Opcode::Mad,
            vec![f(Flag::Lo), t(T::TY)],
            d,
            a.operand(),
            b.operand(),
            c.operand(),
        );
    }
    /// `mad.hi.T d, a, b, c;`
    #[track_caller]
    pub fn mad_hi<T: Int>(&mut self, a: impl Src<T>, b: impl Src<T>, c: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.tern(
            Opcode::Mad,
            vec![f(Flag::Hi), t(T::TY)],
            d,
            a.operand(),
            b.operand(),
            c.operand(),
        );
        d
    }
    /// `mad.wide.T d, a, b, c;`
    #[track_caller]
    pub fn mad_wide<T: Widen>(
        &mut self,
        a: impl Src<T>,
        b: impl Src<T>,
        c: impl Src<T::Wide>,
    ) -> Reg<T::Wide> {
        let d = self.reg::<T::Wide>();
        self.emit(
            Opcode::Mad,
            [f(Flag::Wide), t(T::TY)],
            [d.op(), a.operand(), b.operand(), c.operand()],
        );
        d
    }
    /// `fma.rn.T d, a, b, c;`
    #[track_caller]
    pub fn fma<T: FloatLike>(&mut self, a: impl Src<T>, b: impl Src<T>, c: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.fma_to(d, a, b, c);
        d
    }
    /// `fma.rn.T d, a, b, c;` into `d` (accumulators: `k.fma_to(acc, x, y, acc)`).
    #[track_caller]
    pub fn fma_to<T: FloatLike>(
        &mut self,
        d: Reg<T>,
        a: impl Src<T>,
        b: impl Src<T>,
        c: impl Src<T>,
    ) {
        self.tern(
            Opcode::Fma,
            vec![f(Flag::Rn), t(T::TY)],
            d,
            a.operand(),
            b.operand(),
            c.operand(),
        );
    }
    /// `fma.rnd.ftz.sat.T d, a, b, c;` (rounding defaults to `.rn` when unset).
    #[track_caller]
    pub fn fma_m<T: FloatLike>(
        &mut self,
        m: FMods,
        a: impl Src<T>,
        b: impl Src<T>,
        c: impl Src<T>,
    ) -> Reg<T> {
        let d = self.reg();
        let m = FMods {
            rnd: m.rnd.or(Some(Rnd::Rn)),
            ..m
        };
        let mut mods = m.mods();
        mods.push(t(T::TY));
        self.tern(Opcode::Fma, mods, d, a.operand(), b.operand(), c.operand());
        d
    }
    /// Integer `div.T` / float `div.rn.T`.
    #[track_caller]
    pub fn div<T: Arith>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        let mods = if T::IS_INT {
            vec![t(T::TY)]
        } else {
            vec![f(Flag::Rn), t(T::TY)]
        };
        self.bin(Opcode::Div, mods, d, a.operand(), b.operand());
        d
    }
    /// `div.approx.f32` / `div.full.f32` (`full = true`).
    #[track_caller]
    pub fn div_fast(&mut self, a: impl Src<f32>, b: impl Src<f32>, full: bool) -> Reg<f32> {
        let d = self.reg();
        let fl = if full { Flag::Full } else { Flag::Approx };
        self.bin(
            Opcode::Div,
            vec![f(fl), t(Ty::F32)],
            d,
            a.operand(),
            b.operand(),
        );
        d
    }
    /// `div.rnd.ftz.T` for f32/f64.
    #[track_caller]
    pub fn div_m<T: Float>(&mut self, m: FMods, a: impl Src<T>, b: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        let m = FMods {
            rnd: m.rnd.or(Some(Rnd::Rn)),
            ..m
        };
        let mut mods = m.mods();
        mods.push(t(T::TY));
        self.bin(Opcode::Div, mods, d, a.operand(), b.operand());
        d
    }
    /// `rem.T d, a, b;`
    #[track_caller]
    pub fn rem<T: Int>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.bin(Opcode::Rem, vec![t(T::TY)], d, a.operand(), b.operand());
        d
    }
    /// `min.T d, a, b;`
    #[track_caller]
    pub fn min<T: Arith>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.bin(Opcode::Min, vec![t(T::TY)], d, a.operand(), b.operand());
        d
    }
    /// `max.T d, a, b;`
    #[track_caller]
    pub fn max<T: Arith>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.max_to(d, a, b);
        d
    }
    #[track_caller]
    pub fn max_to<T: Arith>(&mut self, d: Reg<T>, a: impl Src<T>, b: impl Src<T>) {
        self.bin(Opcode::Max, vec![t(T::TY)], d, a.operand(), b.operand());
    }
    /// `abs.T d, a;`
    #[track_caller]
    pub fn abs<T: Signed>(&mut self, a: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.emit(Opcode::Abs, [t(T::TY)], [d.op(), a.operand()]);
        d
    }
    /// `neg.T d, a;`
    #[track_caller]
    pub fn neg<T: Signed>(&mut self, a: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.emit(Opcode::Neg, [t(T::TY)], [d.op(), a.operand()]);
        d
    }
    /// `copysign.T d, a, b;` (sign of `a`, magnitude of `b`).
    #[track_caller]
    pub fn copysign<T: Float>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.bin(
            Opcode::Copysign,
            vec![t(T::TY)],
            d,
            a.operand(),
            b.operand(),
        );
        d
    }

    // ---------------------------------------------------------------- float math

    /// `rcp.rn.T` (IEEE).
    #[track_caller]
    pub fn rcp<T: Float>(&mut self, a: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.emit(Opcode::Rcp, [f(Flag::Rn), t(T::TY)], [d.op(), a.operand()]);
        d
    }
    /// `sqrt.rn.T` (IEEE).
    #[track_caller]
    pub fn sqrt<T: Float>(&mut self, a: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.emit(Opcode::Sqrt, [f(Flag::Rn), t(T::TY)], [d.op(), a.operand()]);
        d
    }
    /// `<fn>.approx[.ftz].f32 d, a;` (`tanh` ignores `ftz`).
    #[track_caller]
    pub fn approx(&mut self, func: ApproxFn, ftz: bool, a: impl Src<f32>) -> Reg<f32> {
        let d = self.reg();
        let op = match func {
            ApproxFn::Ex2 => Opcode::Ex2,
            ApproxFn::Lg2 => Opcode::Lg2,
            ApproxFn::Rcp => Opcode::Rcp,
            ApproxFn::Sqrt => Opcode::Sqrt,
            ApproxFn::Rsqrt => Opcode::Rsqrt,
            ApproxFn::Sin => Opcode::Sin,
            ApproxFn::Cos => Opcode::Cos,
            ApproxFn::Tanh => Opcode::Tanh,
        };
        let mut mods = vec![f(Flag::Approx)];
        if ftz && func != ApproxFn::Tanh {
            mods.push(f(Flag::Ftz));
        }
        mods.push(t(Ty::F32));
        self.emit(op, mods, [d.op(), a.operand()]);
        d
    }
    /// `ex2.approx.ftz.f32`
    #[track_caller]
    pub fn ex2(&mut self, a: impl Src<f32>) -> Reg<f32> {
        self.approx(ApproxFn::Ex2, true, a)
    }
    /// `lg2.approx.ftz.f32`
    #[track_caller]
    pub fn lg2(&mut self, a: impl Src<f32>) -> Reg<f32> {
        self.approx(ApproxFn::Lg2, true, a)
    }
    /// `rcp.approx.ftz.f32`
    #[track_caller]
    pub fn rcp_approx(&mut self, a: impl Src<f32>) -> Reg<f32> {
        self.approx(ApproxFn::Rcp, true, a)
    }
    /// `sqrt.approx.ftz.f32`
    #[track_caller]
    pub fn sqrt_approx(&mut self, a: impl Src<f32>) -> Reg<f32> {
        self.approx(ApproxFn::Sqrt, true, a)
    }
    /// `rsqrt.approx.ftz.f32`
    #[track_caller]
    pub fn rsqrt(&mut self, a: impl Src<f32>) -> Reg<f32> {
        self.approx(ApproxFn::Rsqrt, true, a)
    }
    /// `sin.approx.ftz.f32`
    #[track_caller]
    pub fn sin(&mut self, a: impl Src<f32>) -> Reg<f32> {
        self.approx(ApproxFn::Sin, true, a)
    }
    /// `cos.approx.ftz.f32`
    #[track_caller]
    pub fn cos(&mut self, a: impl Src<f32>) -> Reg<f32> {
        self.approx(ApproxFn::Cos, true, a)
    }
    /// `tanh.approx.f32` (sm_75)
    #[track_caller]
    pub fn tanh(&mut self, a: impl Src<f32>) -> Reg<f32> {
        self.approx(ApproxFn::Tanh, false, a)
    }
    /// `testp.op.T p, a;` with `op` one of `Flag::{Finite, Infinite, Number, Notanumber, Normal, Subnormal}`.
    #[track_caller]
    pub fn testp<T: Float>(&mut self, op: Flag, a: Reg<T>) -> Reg<Pred> {
        let d = self.reg();
        self.emit(Opcode::Testp, [f(op), t(T::TY)], [d.op(), a.op()]);
        d
    }

    // =========================================================================================
    // bit manipulation

    /// `and.b32 d, a, b;` (`and.pred` on predicates)
    #[track_caller]
    pub fn and<T: Logic>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.bin(
            Opcode::And,
            vec![t(T::LOGIC_TY)],
            d,
            a.operand(),
            b.operand(),
        );
        d
    }
    /// `or.b32 d, a, b;`
    #[track_caller]
    pub fn or<T: Logic>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.bin(
            Opcode::Or,
            vec![t(T::LOGIC_TY)],
            d,
            a.operand(),
            b.operand(),
        );
        d
    }
    /// `xor.b32 d, a, b;`
    #[track_caller]
    pub fn xor<T: Logic>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.bin(
            Opcode::Xor,
            vec![t(T::LOGIC_TY)],
            d,
            a.operand(),
            b.operand(),
        );
        d
    }
    /// `not.b32 d, a;`
    #[track_caller]
    pub fn not<T: Logic>(&mut self, a: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.emit(Opcode::Not, [t(T::LOGIC_TY)], [d.op(), a.operand()]);
        d
    }
    /// `cnot.b32 d, a;`
    #[track_caller]
    pub fn cnot<T: Bits>(&mut self, a: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.emit(Opcode::Cnot, [t(T::LOGIC_TY)], [d.op(), a.operand()]);
        d
    }
    /// `shl.bN d, a, n;`
    #[track_caller]
    pub fn shl<T: Bits>(&mut self, a: impl Src<T>, n: impl Src<u32>) -> Reg<T> {
        let d = self.reg();
        self.bin(
            Opcode::Shl,
            vec![t(T::LOGIC_TY)],
            d,
            a.operand(),
            n.operand(),
        );
        d
    }
    /// `shr.T d, a, n;` (arithmetic for signed types, logical otherwise)
    #[track_caller]
    pub fn shr<T: Bits>(&mut self, a: impl Src<T>, n: impl Src<u32>) -> Reg<T> {
        let d = self.reg();
        let ty = if T::TY.is_signed() || T::TY.kind() == ptx::TyKind::Unsigned {
            T::TY
        } else {
            T::LOGIC_TY
        };
        self.bin(Opcode::Shr, vec![t(ty)], d, a.operand(), n.operand());
        d
    }
    /// `shf.{l,r}.{wrap,clamp}.b32 d, lo, hi, n;` (funnel shift)
    #[track_caller]
    pub fn shf<T: Bits32>(
        &mut self,
        left: bool,
        clamp: bool,
        lo: impl Src<T>,
        hi: impl Src<T>,
        n: impl Src<u32>,
    ) -> Reg<T> {
        let d = self.reg();
        let dir = if left { Flag::L } else { Flag::R };
        let mode = if clamp { Flag::Clamp } else { Flag::Wrap };
        self.tern(
            Opcode::Shf,
            vec![f(dir), f(mode), t(Ty::B32)],
            d,
            lo.operand(),
            hi.operand(),
            n.operand(),
        );
        d
    }
    /// `bfe.T d, a, pos, len;` (sign-extending for signed `T`)
    #[track_caller]
    pub fn bfe<T: Bits3264>(
        &mut self,
        a: impl Src<T>,
        pos: impl Src<u32>,
        len: impl Src<u32>,
    ) -> Reg<T> {
        let d = self.reg();
        let ty = match T::TY.kind() {
            ptx::TyKind::Bits => Ty::unsigned_of(T::SIZE).unwrap_or(Ty::U32),
            _ => T::TY,
        };
        self.tern(
            Opcode::Bfe,
            vec![t(ty)],
            d,
            a.operand(),
            pos.operand(),
            len.operand(),
        );
        d
    }
    /// `bfi.bN d, a, b, pos, len;` (insert bits of `a` into `b`)
    #[track_caller]
    pub fn bfi<T: Bits3264>(
        &mut self,
        a: impl Src<T>,
        b: impl Src<T>,
        pos: impl Src<u32>,
        len: impl Src<u32>,
    ) -> Reg<T> {
        let d = self.reg();
        self.emit(
            Opcode::Bfi,
            [t(T::LOGIC_TY)],
            [
                d.op(),
                a.operand(),
                b.operand(),
                pos.operand(),
                len.operand(),
            ],
        );
        d
    }
    /// `prmt.b32 d, a, b, sel;`
    #[track_caller]
    pub fn prmt<T: Bits32>(
        &mut self,
        a: impl Src<T>,
        b: impl Src<T>,
        sel: impl Src<u32>,
    ) -> Reg<T> {
        let d = self.reg();
        self.tern(
            Opcode::Prmt,
            vec![t(Ty::B32)],
            d,
            a.operand(),
            b.operand(),
            sel.operand(),
        );
        d
    }
    /// `popc.bN d, a;`
    #[track_caller]
    pub fn popc<T: Bits3264>(&mut self, a: impl Src<T>) -> Reg<u32> {
        let d = self.reg();
        self.emit(Opcode::Popc, [t(T::LOGIC_TY)], [d.op(), a.operand()]);
        d
    }
    /// `clz.bN d, a;`
    #[track_caller]
    pub fn clz<T: Bits3264>(&mut self, a: impl Src<T>) -> Reg<u32> {
        let d = self.reg();
        self.emit(Opcode::Clz, [t(T::LOGIC_TY)], [d.op(), a.operand()]);
        d
    }
    /// `brev.bN d, a;`
    #[track_caller]
    pub fn brev<T: Bits3264>(&mut self, a: impl Src<T>) -> Reg<T> {
        let d = self.reg();
        self.emit(Opcode::Brev, [t(T::LOGIC_TY)], [d.op(), a.operand()]);
        d
    }
    /// `bfind[.shiftamt].T d, a;`
    #[track_caller]
    pub fn bfind<T: Bits3264>(&mut self, a: impl Src<T>, shiftamt: bool) -> Reg<u32> {
        let d = self.reg();
        let ty = match T::TY.kind() {
            ptx::TyKind::Bits => Ty::unsigned_of(T::SIZE).unwrap_or(Ty::U32),
            _ => T::TY,
        };
        let mut mods = Vec::new();
        if shiftamt {
            mods.push(f(Flag::Shiftamt));
        }
        mods.push(t(ty));
        self.emit(Opcode::Bfind, mods, [d.op(), a.operand()]);
        d
    }
    /// `lop3.b32 d, a, b, c, lut;`
    #[track_caller]
    pub fn lop3<T: Bits32>(
        &mut self,
        a: impl Src<T>,
        b: impl Src<T>,
        c: impl Src<T>,
        lut: u8,
    ) -> Reg<T> {
        let d = self.reg();
        self.emit(
            Opcode::Lop3,
            [t(Ty::B32)],
            [
                d.op(),
                a.operand(),
                b.operand(),
                c.operand(),
                imm(lut as i64),
            ],
        );
        d
    }

    // =========================================================================================
    // comparison and selection

    /// `setp.cmp.T p, a, b;`
    #[track_caller]
    pub fn setp<T: Cmp>(&mut self, cmp: CmpOp, a: impl Src<T>, b: impl Src<T>) -> Reg<Pred> {
        let d = self.reg();
        self.emit(
            Opcode::Setp,
            [f(cmp.flag()), t(T::TY)],
            [d.op(), a.operand(), b.operand()],
        );
        d
    }
    #[track_caller]
    pub fn lt<T: Cmp>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<Pred> {
        self.setp(CmpOp::Lt, a, b)
    }
    #[track_caller]
    pub fn le<T: Cmp>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<Pred> {
        self.setp(CmpOp::Le, a, b)
    }
    #[track_caller]
    pub fn gt<T: Cmp>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<Pred> {
        self.setp(CmpOp::Gt, a, b)
    }
    #[track_caller]
    pub fn ge<T: Cmp>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<Pred> {
        self.setp(CmpOp::Ge, a, b)
    }
    #[track_caller]
    pub fn eq<T: Cmp>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<Pred> {
        self.setp(CmpOp::Eq, a, b)
    }
    #[track_caller]
    pub fn ne<T: Cmp>(&mut self, a: impl Src<T>, b: impl Src<T>) -> Reg<Pred> {
        self.setp(CmpOp::Ne, a, b)
    }
    /// `selp.T d, a, b, p;` (`p ? a : b`)
    #[track_caller]
    pub fn selp<T: Scalar>(&mut self, a: impl Src<T>, b: impl Src<T>, p: Reg<Pred>) -> Reg<T> {
        let d = self.reg();
        self.tern(
            Opcode::Selp,
            vec![t(T::MOV_TY)],
            d,
            a.operand(),
            b.operand(),
            p.op(),
        );
        d
    }

    // =========================================================================================
    // conversions

    fn default_cvt_rnd(d: Ty, s: Ty) -> Option<CvtRnd> {
        match (d.is_float(), s.is_float()) {
            (true, true) if d.size() < s.size() => Some(CvtRnd::Rn),
            (true, false) => Some(CvtRnd::Rn),
            (false, true) => Some(CvtRnd::Rzi),
            _ => None,
        }
    }
    /// `cvt[.rnd].D.S d, a;` with C-like default rounding: `.rn` into floats (when narrowing or
    /// from integers), `.rzi` float -> integer, none otherwise.
    #[track_caller]
    pub fn cvt<D: CvtTy, S: CvtTy>(&mut self, a: Reg<S>) -> Reg<D> {
        let m = CvtMods {
            rnd: Self::default_cvt_rnd(D::TY, S::TY),
            ..CvtMods::default()
        };
        self.cvt_m(m, a)
    }
    /// `cvt.mods.D.S d, a;` with explicit modifiers.
    #[track_caller]
    pub fn cvt_m<D: CvtTy, S: CvtTy>(&mut self, m: CvtMods, a: Reg<S>) -> Reg<D> {
        let d = self.reg::<D>();
        let mut mods = m.mods();
        mods.push(t(D::TY));
        mods.push(t(S::TY));
        self.emit(Opcode::Cvt, mods, [d.op(), a.op()]);
        d
    }
    /// `cvt.rn.bf16x2.f32 d, hi, lo;` (`hi` lands in the upper half)
    #[track_caller]
    pub fn cvt_bf16x2(&mut self, hi: Reg<f32>, lo: Reg<f32>) -> Reg<Bf16x2> {
        let d = self.reg();
        self.bin(
            Opcode::Cvt,
            vec![f(Flag::Rn), t(Ty::Bf16x2), t(Ty::F32)],
            d,
            hi.op(),
            lo.op(),
        );
        d
    }
    /// `cvt.rn.f16x2.f32 d, hi, lo;`
    #[track_caller]
    pub fn cvt_f16x2(&mut self, hi: Reg<f32>, lo: Reg<f32>) -> Reg<F16x2> {
        let d = self.reg();
        self.bin(
            Opcode::Cvt,
            vec![f(Flag::Rn), t(Ty::F16x2), t(Ty::F32)],
            d,
            hi.op(),
            lo.op(),
        );
        d
    }
    /// `cvt.rn.satfinite.e4m3x2.f32 d, hi, lo;` (sm_89)
    #[track_caller]
    pub fn cvt_e4m3x2(&mut self, hi: Reg<f32>, lo: Reg<f32>) -> Reg<E4m3x2> {
        let d = self.reg();
        self.bin(
            Opcode::Cvt,
            vec![f(Flag::Rn), f(Flag::Satfinite), t(Ty::E4m3x2), t(Ty::F32)],
            d,
            hi.op(),
            lo.op(),
        );
        d
    }
    /// `cvt.rn.satfinite.e5m2x2.f32 d, hi, lo;` (sm_89)
    #[track_caller]
    pub fn cvt_e5m2x2(&mut self, hi: Reg<f32>, lo: Reg<f32>) -> Reg<E5m2x2> {
        let d = self.reg();
        self.bin(
            Opcode::Cvt,
            vec![f(Flag::Rn), f(Flag::Satfinite), t(Ty::E5m2x2), t(Ty::F32)],
            d,
            hi.op(),
            lo.op(),
        );
        d
    }
    /// `cvt.rn.satfinite.e4m3x2.f16x2 d, a;` (sm_89)
    #[track_caller]
    pub fn cvt_e4m3x2_from_f16x2(&mut self, a: Reg<F16x2>) -> Reg<E4m3x2> {
        let d = self.reg();
        self.emit(
            Opcode::Cvt,
            [f(Flag::Rn), f(Flag::Satfinite), t(Ty::E4m3x2), t(Ty::F16x2)],
            [d.op(), a.op()],
        );
        d
    }
    /// `cvt.rn.f16x2.e4m3x2 d, a;` (sm_89)
    #[track_caller]
    pub fn cvt_f16x2_from_e4m3x2(&mut self, a: Reg<E4m3x2>) -> Reg<F16x2> {
        let d = self.reg();
        self.emit(
            Opcode::Cvt,
            [f(Flag::Rn), t(Ty::F16x2), t(Ty::E4m3x2)],
            [d.op(), a.op()],
        );
        d
    }
    /// `cvt.rn.f16x2.e5m2x2 d, a;` (sm_89)
    #[track_caller]
    pub fn cvt_f16x2_from_e5m2x2(&mut self, a: Reg<E5m2x2>) -> Reg<F16x2> {
        let d = self.reg();
        self.emit(
            Opcode::Cvt,
            [f(Flag::Rn), t(Ty::F16x2), t(Ty::E5m2x2)],
            [d.op(), a.op()],
        );
        d
    }
    /// `cvt.rna.tf32.f32 d, a;`
    #[track_caller]
    pub fn cvt_tf32(&mut self, a: Reg<f32>) -> Reg<Tf32> {
        let d = self.reg();
        self.emit(
            Opcode::Cvt,
            [f(Flag::Rna), t(Ty::Tf32), t(Ty::F32)],
            [d.op(), a.op()],
        );
        d
    }
    /// `cvta.to.global.u64 d, a;`
    #[track_caller]
    pub fn cvta_to_global<T>(&mut self, a: GenericPtr<T>) -> GlobalPtr<T> {
        let d = self.reg::<u64>();
        self.emit(
            Opcode::Cvta,
            [f(Flag::To), sp(Space::Global), t(Ty::U64)],
            [d.op(), a.reg().op()],
        );
        Ptr::from_reg(d).add_bytes(a.byte_offset())
    }
    /// `cvta.global.u64 d, a;` (global -> generic)
    #[track_caller]
    pub fn cvta_global<T>(&mut self, a: GlobalPtr<T>) -> GenericPtr<T> {
        let d = self.reg::<u64>();
        self.emit(
            Opcode::Cvta,
            [sp(Space::Global), t(Ty::U64)],
            [d.op(), a.reg().op()],
        );
        Ptr::from_reg(d).add_bytes(a.byte_offset())
    }
    /// Shared -> generic: `cvt.u64.u32` + `cvta.shared.u64`.
    #[track_caller]
    pub fn cvta_shared<T>(&mut self, a: SharedPtr<T>) -> GenericPtr<T> {
        let w = self.reg::<u64>();
        self.emit(
            Opcode::Cvt,
            [t(Ty::U64), t(Ty::U32)],
            [w.op(), a.reg().op()],
        );
        let d = self.reg::<u64>();
        self.emit(
            Opcode::Cvta,
            [sp(Space::Shared), t(Ty::U64)],
            [d.op(), w.op()],
        );
        Ptr::from_reg(d).add_bytes(a.byte_offset())
    }

    // =========================================================================================
    // loads and stores

    fn mem_mods<S: StateSpace>(opts: MemOpts, vec: Option<usize>, ty: Ty) -> Vec<Mod> {
        let mut m = Vec::new();
        match opts.sem {
            Sem::Weak => {}
            Sem::Volatile => m.push(f(Flag::Volatile)),
            Sem::Relaxed(s) => m.extend([f(Flag::Relaxed), f(s.flag())]),
            Sem::Acquire(s) => m.extend([f(Flag::Acquire), f(s.flag())]),
            Sem::Release(s) => m.extend([f(Flag::Release), f(s.flag())]),
        }
        if let Some(s) = S::SPACE {
            m.push(sp(s));
        }
        if opts.nc {
            m.push(f(Flag::Nc));
        }
        if let Some(c) = opts.cache {
            m.push(f(c.flag()));
        }
        if let Some(e) = opts.evict {
            m.push(f(e.flag()));
        }
        if let Some(n) = vec {
            m.push(Mod::Vec(n as u8));
        }
        m.push(t(ty));
        m
    }
    /// Requirements of `ld`/`st` forms the opcode table does not know.
    #[track_caller]
    fn mem_need<S: StateSpace>(&mut self, o: MemOpts) {
        if S::SPACE == Some(Space::Local) && o.sem == Sem::Volatile {
            // ptxas: "ld/st with .local.volatile requires PTX ISA 9.1"
            self.require(0, 91);
        }
    }
    #[track_caller]
    fn check_vec(&mut self, n: usize) -> bool {
        if matches!(n, 2 | 4 | 8) {
            true
        } else {
            self.fail(BuildError::Invalid(format!(
                "vector width {n}: ld/st take .v2, .v4 or .v8"
            )));
            false
        }
    }

    /// `ld.space.T d, [addr];`
    #[track_caller]
    pub fn ld<T: Scalar, S: StateSpace>(&mut self, a: impl Into<Addr<T, S>>) -> Reg<T> {
        self.ld_with(MemOpts::default(), a)
    }
    /// `ld{.sem.scope}.space{.nc}{.cop}{.evict}.T d, [addr];`
    #[track_caller]
    pub fn ld_with<T: Scalar, S: StateSpace>(
        &mut self,
        o: MemOpts,
        a: impl Into<Addr<T, S>>,
    ) -> Reg<T> {
        self.mem_need::<S>(o);
        let addr = self.addr_operand(a);
        let d = self.reg::<T>();
        self.emit(
            Opcode::Ld,
            Self::mem_mods::<S>(o, None, T::MEM_TY),
            [d.op(), addr],
        );
        d
    }
    /// `ld.global.nc.T d, [addr];`
    #[track_caller]
    pub fn ld_nc<T: Scalar>(&mut self, a: impl Into<Addr<T, Global>>) -> Reg<T> {
        self.ld_with(MemOpts::nc(), a)
    }
    /// `ld.space.vN.T {d0, ..}, [addr];`
    #[track_caller]
    pub fn ld_v<T: Scalar, S: StateSpace, const N: usize>(
        &mut self,
        a: impl Into<Addr<T, S>>,
    ) -> [Reg<T>; N] {
        self.ld_v_with(MemOpts::default(), a)
    }
    /// Vector load with options.
    #[track_caller]
    pub fn ld_v_with<T: Scalar, S: StateSpace, const N: usize>(
        &mut self,
        o: MemOpts,
        a: impl Into<Addr<T, S>>,
    ) -> [Reg<T>; N] {
        self.mem_need::<S>(o);
        let addr = self.addr_operand(a);
        let d: [Reg<T>; N] = self.regs();
        if self.check_vec(N) {
            self.emit(
                Opcode::Ld,
                Self::mem_mods::<S>(o, Some(N), T::MEM_TY),
                [vec_op(&d), addr],
            );
        }
        d
    }
    /// `st.space.T [addr], v;`
    #[track_caller]
    pub fn st<T: Scalar, S: StateSpace>(&mut self, a: impl Into<Addr<T, S>>, v: Reg<T>) {
        self.st_with(MemOpts::default(), a, v)
    }
    /// `st{.sem.scope}.space{.cop}.T [addr], v;`
    #[track_caller]
    pub fn st_with<T: Scalar, S: StateSpace>(
        &mut self,
        o: MemOpts,
        a: impl Into<Addr<T, S>>,
        v: Reg<T>,
    ) {
        self.mem_need::<S>(o);
        let addr = self.addr_operand(a);
        self.emit(
            Opcode::St,
            Self::mem_mods::<S>(o, None, T::MEM_TY),
            [addr, v.op()],
        );
    }
    /// `st.space.vN.T [addr], {v0, ..};`
    #[track_caller]
    pub fn st_v<T: Scalar, S: StateSpace, const N: usize>(
        &mut self,
        a: impl Into<Addr<T, S>>,
        v: [Reg<T>; N],
    ) {
        self.st_v_with(MemOpts::default(), a, v)
    }
    /// Vector store with options.
    #[track_caller]
    pub fn st_v_with<T: Scalar, S: StateSpace, const N: usize>(
        &mut self,
        o: MemOpts,
        a: impl Into<Addr<T, S>>,
        v: [Reg<T>; N],
    ) {
        self.mem_need::<S>(o);
        let addr = self.addr_operand(a);
        if self.check_vec(N) {
            self.emit(
                Opcode::St,
                Self::mem_mods::<S>(o, Some(N), T::MEM_TY),
                [addr, vec_op(&v)],
            );
        }
    }
    /// `prefetch.global.L2::evict_last [addr];` (`last = false`: `L2::evict_normal`; sm_80)
    #[track_caller]
    pub fn prefetch_l2<T>(&mut self, a: GlobalPtr<T>, last: bool) {
        let addr = self.addr_operand(a);
        let e = if last {
            Flag::L2EvictLast
        } else {
            Flag::L2EvictNormal
        };
        self.require(80, 74);
        self.emit(Opcode::Prefetch, [sp(Space::Global), f(e)], [addr]);
    }

    // =========================================================================================
    // atomics

    fn atom_mods<T: AtomTy, S: StateSpace>(
        op: Option<AtomOp>,
        sem: Option<AtomSem>,
        scope: Option<Scope>,
    ) -> Vec<Mod> {
        let mut m = Vec::new();
        if let Some(s) = sem {
            m.push(f(s.flag()));
        }
        if let Some(s) = scope {
            m.push(f(s.flag()));
        }
        if let Some(s) = S::SPACE {
            m.push(sp(s));
        }
        let ty = match op {
            Some(o) if o.bitwise() => T::TY.bit_ty(),
            None => T::TY.bit_ty(),
            _ => T::TY,
        };
        match op {
            Some(o) => m.push(f(o.flag())),
            None => m.push(f(Flag::Cas)),
        }
        m.push(t(ty));
        m
    }
    /// `atom.space.op.T d, [addr], v;`
    #[track_caller]
    pub fn atom<T: AtomTy, S: StateSpace>(
        &mut self,
        op: AtomOp,
        a: impl Into<Addr<T, S>>,
        v: impl Src<T>,
    ) -> Reg<T> {
        self.atom_with(op, None, None, a, v)
    }
    /// `atom{.sem}{.scope}.space.op.T d, [addr], v;`
    #[track_caller]
    pub fn atom_with<T: AtomTy, S: StateSpace>(
        &mut self,
        op: AtomOp,
        sem: Option<AtomSem>,
        scope: Option<Scope>,
        a: impl Into<Addr<T, S>>,
        v: impl Src<T>,
    ) -> Reg<T> {
        if op == AtomOp::Cas {
            self.fail(BuildError::Invalid(
                "atom: `cas` takes a compare and a new value; use atom_cas".into(),
            ));
        }
        let addr = self.addr_operand(a);
        let d = self.reg::<T>();
        self.emit(
            Opcode::Atom,
            Self::atom_mods::<T, S>(Some(op), sem, scope),
            [d.op(), addr, v.operand()],
        );
        d
    }
    /// `atom.space.add.T d, [addr], v;`
    #[track_caller]
    pub fn atom_add<T: AtomTy, S: StateSpace>(
        &mut self,
        a: impl Into<Addr<T, S>>,
        v: impl Src<T>,
    ) -> Reg<T> {
        self.atom(AtomOp::Add, a, v)
    }
    /// `atom.space.exch.bN d, [addr], v;`
    #[track_caller]
    pub fn atom_exch<T: AtomTy, S: StateSpace>(
        &mut self,
        a: impl Into<Addr<T, S>>,
        v: impl Src<T>,
    ) -> Reg<T> {
        self.atom(AtomOp::Exch, a, v)
    }
    /// `atom{.sem}{.scope}.space.cas.bN d, [addr], cmp, new;`
    #[track_caller]
    pub fn atom_cas<T: AtomTy, S: StateSpace>(
        &mut self,
        a: impl Into<Addr<T, S>>,
        cmp: impl Src<T>,
        new: impl Src<T>,
    ) -> Reg<T> {
        self.atom_cas_with(None, None, a, cmp, new)
    }
    /// `atom.cas` with ordering and scope.
    #[track_caller]
    pub fn atom_cas_with<T: AtomTy, S: StateSpace>(
        &mut self,
        sem: Option<AtomSem>,
        scope: Option<Scope>,
        a: impl Into<Addr<T, S>>,
        cmp: impl Src<T>,
        new: impl Src<T>,
    ) -> Reg<T> {
        let addr = self.addr_operand(a);
        let d = self.reg::<T>();
        self.emit(
            Opcode::Atom,
            Self::atom_mods::<T, S>(None, sem, scope),
            [d.op(), addr, cmp.operand(), new.operand()],
        );
        d
    }
    /// `red.space.op.T [addr], v;`
    #[track_caller]
    pub fn red<T: AtomTy, S: StateSpace>(
        &mut self,
        op: AtomOp,
        a: impl Into<Addr<T, S>>,
        v: impl Src<T>,
    ) {
        self.red_with(op, None, None, a, v)
    }
    /// `red{.sem}{.scope}.space.op.T [addr], v;`
    #[track_caller]
    pub fn red_with<T: AtomTy, S: StateSpace>(
        &mut self,
        op: AtomOp,
        sem: Option<AtomSem>,
        scope: Option<Scope>,
        a: impl Into<Addr<T, S>>,
        v: impl Src<T>,
    ) {
        if matches!(op, AtomOp::Cas | AtomOp::Exch) {
            self.fail(BuildError::Invalid(format!(
                "red: `.{op}` is not a reduction (red takes add/min/max/inc/dec/and/or/xor)"
            )));
        }
        let addr = self.addr_operand(a);
        self.emit(
            Opcode::Red,
            Self::atom_mods::<T, S>(Some(op), sem, scope),
            [addr, v.operand()],
        );
    }
    /// `red.space.add.T [addr], v;`
    #[track_caller]
    pub fn red_add<T: AtomTy, S: StateSpace>(&mut self, a: impl Into<Addr<T, S>>, v: impl Src<T>) {
        self.red(AtomOp::Add, a, v)
    }

    // =========================================================================================
    // barriers and fences

    /// `bar.sync 0;` (`__syncthreads()`)
    #[track_caller]
    pub fn sync_threads(&mut self) {
        self.bar_sync(0u32);
    }
    /// `bar.sync id;`
    #[track_caller]
    pub fn bar_sync(&mut self, id: impl Src<u32>) {
        self.emit(Opcode::Bar, [f(Flag::Sync)], [id.operand()]);
    }
    /// `bar.sync id, count;` (named barrier over `count` threads)
    #[track_caller]
    pub fn bar_sync_count(&mut self, id: impl Src<u32>, count: impl Src<u32>) {
        self.emit(
            Opcode::Bar,
            [f(Flag::Sync)],
            [id.operand(), count.operand()],
        );
    }
    /// `bar.arrive id, count;`
    #[track_caller]
    pub fn bar_arrive(&mut self, id: impl Src<u32>, count: impl Src<u32>) {
        self.emit(
            Opcode::Bar,
            [f(Flag::Arrive)],
            [id.operand(), count.operand()],
        );
    }
    /// `barrier.sync id;` (non-`.aligned` form, sm_70)
    #[track_caller]
    pub fn barrier_sync(&mut self, id: impl Src<u32>) {
        self.emit(Opcode::Barrier, [f(Flag::Sync)], [id.operand()]);
    }
    /// `barrier.sync id, count;`
    #[track_caller]
    pub fn barrier_sync_count(&mut self, id: impl Src<u32>, count: impl Src<u32>) {
        self.emit(
            Opcode::Barrier,
            [f(Flag::Sync)],
            [id.operand(), count.operand()],
        );
    }
    /// `bar.red.popc.u32 d, id, p;` (count of threads with `p`)
    #[track_caller]
    pub fn bar_red_popc(&mut self, id: impl Src<u32>, p: Reg<Pred>) -> Reg<u32> {
        let d = self.reg();
        self.emit(
            Opcode::Bar,
            [f(Flag::Red), f(Flag::Popc), t(Ty::U32)],
            [d.op(), id.operand(), p.op()],
        );
        d
    }
    /// `bar.red.and.pred d, id, p;` (`and = false`: `.or`)
    #[track_caller]
    pub fn bar_red_pred(&mut self, and: bool, id: impl Src<u32>, p: Reg<Pred>) -> Reg<Pred> {
        let d = self.reg();
        let op = if and { Flag::And } else { Flag::Or };
        self.emit(
            Opcode::Bar,
            [f(Flag::Red), f(op), t(Ty::Pred)],
            [d.op(), id.operand(), p.op()],
        );
        d
    }
    /// `bar.warp.sync mask;`
    #[track_caller]
    pub fn bar_warp_sync(&mut self, mask: impl Src<u32>) {
        self.emit(Opcode::BarWarpSync, [], [mask.operand()]);
    }
    /// `membar.{cta,gl,sys};`
    #[track_caller]
    pub fn membar(&mut self, level: MembarLevel) {
        let fl = match level {
            MembarLevel::Cta => Flag::Cta,
            MembarLevel::Gl => Flag::Gl,
            MembarLevel::Sys => Flag::Sys,
        };
        self.emit(Opcode::Membar, [f(fl)], []);
    }
    /// `fence.{sc,acq_rel}.scope;`
    #[track_caller]
    pub fn fence(&mut self, sem: AtomSem, scope: Scope) {
        self.emit(Opcode::Fence, [f(sem.flag()), f(scope.flag())], []);
    }
    /// `fence.proxy.tensormap::generic.acquire.sys [map], 128;` (sm_90): a tensor map in global
    /// memory that the host wrote through the generic proxy becomes visible to the tensor-map
    /// proxy of this thread's TMA instructions (CUDA programming guide, "Usage of a modified
    /// tensor map"); one thread per CTA, followed by a CTA barrier.
    #[track_caller]
    pub fn fence_proxy_tensormap_acquire(&mut self, map: Reg<u64>) {
        let a = self.addr_operand(GenericPtr::<u8>::from_reg(map));
        self.emit(
            Opcode::Fence,
            [
                f(Flag::Proxy),
                f(Flag::TensormapGeneric),
                f(Flag::Acquire),
                f(Flag::Sys),
            ],
            [a, imm(128)],
        );
    }
    /// `fence.proxy.async.shared::cta;` (generic-proxy writes visible to TMA/wgmma; sm_90)
    #[track_caller]
    pub fn fence_proxy_async(&mut self) {
        self.emit(
            Opcode::Fence,
            [f(Flag::Proxy), f(Flag::Async), sp(Space::SharedCta)],
            [],
        );
    }
    /// `fence.mbarrier_init.release.cluster;` (sm_90)
    #[track_caller]
    pub fn fence_mbarrier_init(&mut self) {
        self.emit(
            Opcode::Fence,
            [f(Flag::MbarrierInit), f(Flag::Release), f(Flag::Cluster)],
            [],
        );
    }

    // =========================================================================================
    // warp-level

    /// `shfl.sync.mode.b32 d, a, b, c, mask;`
    #[track_caller]
    pub fn shfl_sync<T: Word32>(
        &mut self,
        mode: ShflMode,
        a: Reg<T>,
        b: impl Src<u32>,
        c: impl Src<u32>,
        mask: impl Src<u32>,
    ) -> Reg<T> {
        let d = self.reg();
        self.emit(
            Opcode::Shfl,
            [f(Flag::Sync), f(mode.flag()), t(Ty::B32)],
            [d.op(), a.op(), b.operand(), c.operand(), mask.operand()],
        );
        d
    }
    /// `shfl.sync.bfly.b32 d, a, lane_mask, 31, 0xffffffff;`
    #[track_caller]
    pub fn shfl_bfly<T: Word32>(&mut self, a: Reg<T>, lane_mask: impl Src<u32>) -> Reg<T> {
        self.shfl_sync(ShflMode::Bfly, a, lane_mask, 31u32, 0xffff_ffffu32)
    }
    /// `shfl.sync.down.b32 d, a, delta, 31, 0xffffffff;`
    #[track_caller]
    pub fn shfl_down<T: Word32>(&mut self, a: Reg<T>, delta: impl Src<u32>) -> Reg<T> {
        self.shfl_sync(ShflMode::Down, a, delta, 31u32, 0xffff_ffffu32)
    }
    /// `shfl.sync.up.b32 d, a, delta, 0, 0xffffffff;`
    #[track_caller]
    pub fn shfl_up<T: Word32>(&mut self, a: Reg<T>, delta: impl Src<u32>) -> Reg<T> {
        self.shfl_sync(ShflMode::Up, a, delta, 0u32, 0xffff_ffffu32)
    }
    /// `shfl.sync.idx.b32 d, a, lane, 31, 0xffffffff;`
    #[track_caller]
    pub fn shfl_idx<T: Word32>(&mut self, a: Reg<T>, lane: impl Src<u32>) -> Reg<T> {
        self.shfl_sync(ShflMode::Idx, a, lane, 31u32, 0xffff_ffffu32)
    }
    #[track_caller]
    fn vote(&mut self, mode: Flag, p: Reg<Pred>, mask: impl Src<u32>) -> Reg<Pred> {
        let d = self.reg();
        self.emit(
            Opcode::Vote,
            [f(Flag::Sync), f(mode), t(Ty::Pred)],
            [d.op(), p.op(), mask.operand()],
        );
        d
    }
    /// `vote.sync.all.pred d, p, mask;`
    #[track_caller]
    pub fn vote_all(&mut self, p: Reg<Pred>, mask: impl Src<u32>) -> Reg<Pred> {
        self.vote(Flag::All, p, mask)
    }
    /// `vote.sync.any.pred d, p, mask;`
    #[track_caller]
    pub fn vote_any(&mut self, p: Reg<Pred>, mask: impl Src<u32>) -> Reg<Pred> {
        self.vote(Flag::Any, p, mask)
    }
    /// `vote.sync.uni.pred d, p, mask;`
    #[track_caller]
    pub fn vote_uni(&mut self, p: Reg<Pred>, mask: impl Src<u32>) -> Reg<Pred> {
        self.vote(Flag::Uni, p, mask)
    }
    /// `vote.sync.ballot.b32 d, p, mask;`
    #[track_caller]
    pub fn vote_ballot(&mut self, p: Reg<Pred>, mask: impl Src<u32>) -> Reg<u32> {
        let d = self.reg();
        self.emit(
            Opcode::Vote,
            [f(Flag::Sync), f(Flag::Ballot), t(Ty::B32)],
            [d.op(), p.op(), mask.operand()],
        );
        d
    }
    /// `redux.sync.op.T d, a, mask;` (sm_80; `and/or/xor` use `.b32`)
    #[track_caller]
    pub fn redux<T: ReduxTy>(&mut self, op: ReduxOp, a: Reg<T>, mask: impl Src<u32>) -> Reg<T> {
        let d = self.reg();
        let ty = match op {
            ReduxOp::Add | ReduxOp::Min | ReduxOp::Max => T::TY,
            ReduxOp::And | ReduxOp::Or | ReduxOp::Xor => Ty::B32,
        };
        self.emit(
            Opcode::Redux,
            [f(Flag::Sync), f(op.flag()), t(ty)],
            [d.op(), a.op(), mask.operand()],
        );
        d
    }
    /// `match.any.sync.bN d, a, mask;` (lanes holding the same value)
    #[track_caller]
    pub fn match_any<T: Bits3264>(&mut self, a: Reg<T>, mask: impl Src<u32>) -> Reg<u32> {
        let d = self.reg();
        self.emit(
            Opcode::Match,
            [f(Flag::Any), f(Flag::Sync), t(T::LOGIC_TY)],
            [d.op(), a.op(), mask.operand()],
        );
        d
    }
    /// `match.all.sync.bN d|p, a, mask;`
    #[track_caller]
    pub fn match_all<T: Bits3264>(
        &mut self,
        a: Reg<T>,
        mask: impl Src<u32>,
    ) -> (Reg<u32>, Reg<Pred>) {
        let d = self.reg();
        let p = self.reg();
        self.emit(
            Opcode::Match,
            [f(Flag::All), f(Flag::Sync), t(T::LOGIC_TY)],
            [
                Operand::Pair(Box::new(d.op()), Box::new(p.op())),
                a.op(),
                mask.operand(),
            ],
        );
        (d, p)
    }
    /// `activemask.b32 d;`
    #[track_caller]
    pub fn activemask(&mut self) -> Reg<u32> {
        let d = self.reg();
        self.emit(Opcode::Activemask, [t(Ty::B32)], [d.op()]);
        d
    }
    /// `elect.sync _|p, mask;` (true in exactly one active lane; sm_90)
    #[track_caller]
    pub fn elect_sync(&mut self, mask: impl Src<u32>) -> Reg<Pred> {
        let p = self.reg();
        self.emit(
            Opcode::Elect,
            [f(Flag::Sync)],
            [
                Operand::Pair(Box::new(Operand::Sink), Box::new(p.op())),
                mask.operand(),
            ],
        );
        p
    }

    // =========================================================================================
    // tensor cores

    /// `mma.sync.aligned.mMnNkK.row.col.D.A.B.C {d}, {a}, {b}, {c};`
    #[track_caller]
    pub fn mma<S: MmaShape>(
        &mut self,
        a: [Reg<S::A>; 4],
        b: [Reg<S::B>; 2],
        c: [Reg<S::C>; 4],
    ) -> [Reg<S::C>; 4] {
        let d = self.regs();
        self.mma_to::<S>(d, a, b, c);
        d
    }
    /// `mma` into existing accumulators (`d` may equal `c`).
    #[track_caller]
    pub fn mma_to<S: MmaShape>(
        &mut self,
        d: [Reg<S::C>; 4],
        a: [Reg<S::A>; 4],
        b: [Reg<S::B>; 2],
        c: [Reg<S::C>; 4],
    ) {
        let (m, n, k) = S::SHAPE;
        let mut mods = vec![
            f(Flag::Sync),
            f(Flag::Aligned),
            Mod::Shape { m, n, k: Some(k) },
            f(Flag::Row),
            f(Flag::Col),
        ];
        mods.extend(S::TYPES.iter().map(|x| t(*x)));
        self.emit(
            Opcode::Mma,
            mods,
            [vec_op(&d), vec_op(&a), vec_op(&b), vec_op(&c)],
        );
    }
    #[track_caller]
    fn x_count(&mut self, n: usize, what: &str) -> Option<u8> {
        if matches!(n, 1 | 2 | 4) {
            Some(n as u8)
        } else {
            self.fail(BuildError::Invalid(format!(
                "{what}: .x{n} (need 1, 2 or 4 matrices)"
            )));
            None
        }
    }
    /// `ldmatrix.sync.aligned.m8n8.xN{.trans}.shared.b16 {d..}, [addr];`
    #[track_caller]
    pub fn ldmatrix<T: Word32, U, const N: usize>(
        &mut self,
        a: impl Into<Addr<U, Shared>>,
        trans: bool,
    ) -> [Reg<T>; N] {
        let addr = self.addr_operand(a);
        let d: [Reg<T>; N] = self.regs();
        if let Some(x) = self.x_count(N, "ldmatrix") {
            let mut mods = vec![
                f(Flag::Sync),
                f(Flag::Aligned),
                Mod::Shape {
                    m: 8,
                    n: 8,
                    k: None,
                },
                Mod::X(x),
            ];
            if trans {
                mods.push(f(Flag::Trans));
            }
            mods.extend([sp(Space::Shared), t(Ty::B16)]);
            self.emit(Opcode::Ldmatrix, mods, [vec_op(&d), addr]);
        }
        d
    }
    /// `stmatrix.sync.aligned.m8n8.xN{.trans}.shared.b16 [addr], {v..};` (sm_90)
    #[track_caller]
    pub fn stmatrix<T: Word32, U, const N: usize>(
        &mut self,
        a: impl Into<Addr<U, Shared>>,
        v: [Reg<T>; N],
        trans: bool,
    ) {
        let addr = self.addr_operand(a);
        if let Some(x) = self.x_count(N, "stmatrix") {
            let mut mods = vec![
                f(Flag::Sync),
                f(Flag::Aligned),
                Mod::Shape {
                    m: 8,
                    n: 8,
                    k: None,
                },
                Mod::X(x),
            ];
            if trans {
                mods.push(f(Flag::Trans));
            }
            mods.extend([sp(Space::Shared), t(Ty::B16)]);
            self.emit(Opcode::Stmatrix, mods, [addr, vec_op(&v)]);
        }
    }
    /// `wgmma.fence.sync.aligned;` (sm_90a)
    #[track_caller]
    pub fn wgmma_fence(&mut self) {
        self.emit(Opcode::WgmmaFence, [f(Flag::Sync), f(Flag::Aligned)], []);
    }
    /// `wgmma.commit_group.sync.aligned;`
    #[track_caller]
    pub fn wgmma_commit_group(&mut self) {
        self.emit(
            Opcode::WgmmaCommitGroup,
            [f(Flag::Sync), f(Flag::Aligned)],
            [],
        );
    }
    /// `wgmma.wait_group.sync.aligned n;`
    #[track_caller]
    pub fn wgmma_wait_group(&mut self, n: u32) {
        self.emit(
            Opcode::WgmmaWaitGroup,
            [f(Flag::Sync), f(Flag::Aligned)],
            [imm(n as i64)],
        );
    }
    /// `wgmma.mma_async.sync.aligned.m64nNk16.f32.I.I {d..}, adesc, bdesc, scale_d, 1, 1, ta, tb;`
    /// with shared-memory descriptors for A and B; `d` holds `N/2` f32 accumulators.
    #[allow(clippy::too_many_arguments)]
    #[track_caller]
    pub fn wgmma_mma_async<I: WgmmaIn>(
        &mut self,
        n: u16,
        d: &[Reg<f32>],
        a_desc: Reg<u64>,
        b_desc: Reg<u64>,
        scale_d: Reg<Pred>,
        trans_a: bool,
        trans_b: bool,
    ) {
        if n == 0 || n > 256 || n & 7 != 0 || d.len() != n as usize / 2 {
            self.fail(BuildError::Invalid(format!(
                "wgmma m64n{n}k16: N must be a multiple of 8 in 8..=256 with N/2 accumulators (got {})",
                d.len()
            )));
            return;
        }
        let mods = [
            f(Flag::Sync),
            f(Flag::Aligned),
            Mod::Shape {
                m: 64,
                n,
                k: Some(16),
            },
            t(Ty::F32),
            t(I::TY),
            t(I::TY),
        ];
        self.emit(
            Opcode::WgmmaMmaAsync,
            mods,
            [
                vec_op(d),
                a_desc.op(),
                b_desc.op(),
                scale_d.op(),
                imm(1),
                imm(1),
                imm(trans_a as i64),
                imm(trans_b as i64),
            ],
        );
    }

    /// `wgmma.mma_async.sync.aligned.m64nNk16.f32.I.I {d..}, {a0..a3}, bdesc, scale_d, 1, 1, tb;`
    /// with A from registers (each warp's 16 rows in the `mma.m16n8k16` A-fragment layout) and
    /// B from a shared-memory descriptor; `d` holds `N/2` f32 accumulators.
    #[track_caller]
    pub fn wgmma_mma_async_rs<I: WgmmaIn>(
        &mut self,
        n: u16,
        d: &[Reg<f32>],
        a: [Reg<B32>; 4],
        b_desc: Reg<u64>,
        scale_d: Reg<Pred>,
        trans_b: bool,
    ) {
        if n == 0 || n > 256 || n & 7 != 0 || d.len() != n as usize / 2 {
            self.fail(BuildError::Invalid(format!(
                "wgmma m64n{n}k16: N must be a multiple of 8 in 8..=256 with N/2 accumulators (got {})",
                d.len()
            )));
            return;
        }
        let mods = [
            f(Flag::Sync),
            f(Flag::Aligned),
            Mod::Shape {
                m: 64,
                n,
                k: Some(16),
            },
            t(Ty::F32),
            t(I::TY),
            t(I::TY),
        ];
        self.emit(
            Opcode::WgmmaMmaAsync,
            mods,
            [
                vec_op(d),
                vec_op(&a),
                b_desc.op(),
                scale_d.op(),
                imm(1),
                imm(1),
                imm(trans_b as i64),
            ],
        );
    }

    // =========================================================================================
    // asynchronous copies

    /// `cp.async.{ca,cg}.shared.global [dst], [src], bytes;` (bytes 4, 8 or 16; `.cg` when 16)
    #[track_caller]
    pub fn cp_async<U, V>(
        &mut self,
        dst: impl Into<Addr<U, Shared>>,
        src: impl Into<Addr<V, Global>>,
        bytes: u32,
    ) {
        if !matches!(bytes, 4 | 8 | 16) {
            self.fail(BuildError::Invalid(format!(
                "cp.async copies 4, 8 or 16 bytes, not {bytes}"
            )));
            return;
        }
        let d = self.addr_operand(dst);
        let s = self.addr_operand(src);
        let c = if bytes == 16 { Flag::Cg } else { Flag::Ca };
        self.emit(
            Opcode::CpAsync,
            [f(c), sp(Space::Shared), sp(Space::Global)],
            [d, s, imm(bytes as i64)],
        );
    }
    /// `cp.async.cg.shared.global [dst], [src], 16, src_size;` (zero-fills beyond `src_size`)
    #[track_caller]
    pub fn cp_async_zfill<U, V>(
        &mut self,
        dst: impl Into<Addr<U, Shared>>,
        src: impl Into<Addr<V, Global>>,
        src_size: impl Src<u32>,
    ) {
        let d = self.addr_operand(dst);
        let s = self.addr_operand(src);
        self.emit(
            Opcode::CpAsync,
            [f(Flag::Cg), sp(Space::Shared), sp(Space::Global)],
            [d, s, imm(16), src_size.operand()],
        );
    }
    /// `cp.async.commit_group;`
    #[track_caller]
    pub fn cp_async_commit_group(&mut self) {
        self.emit(Opcode::CpAsyncCommitGroup, [], []);
    }
    /// `cp.async.wait_group n;`
    #[track_caller]
    pub fn cp_async_wait_group(&mut self, n: u32) {
        self.emit(Opcode::CpAsyncWaitGroup, [], [imm(n as i64)]);
    }
    /// `cp.async.wait_all;`
    #[track_caller]
    pub fn cp_async_wait_all(&mut self) {
        self.emit(Opcode::CpAsyncWaitAll, [], []);
    }
    /// `cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], bytes, [mbar];` (sm_90)
    #[track_caller]
    pub fn cp_async_bulk_g2s<U, V>(
        &mut self,
        dst: impl Into<Addr<U, Shared>>,
        src: impl Into<Addr<V, Global>>,
        bytes: impl Src<u32>,
        mbar: SharedPtr<u64>,
    ) {
        let d = self.addr_operand(dst);
        let s = self.addr_operand(src);
        let m = self.addr_operand(mbar);
        self.emit(
            Opcode::CpAsyncBulk,
            [
                sp(Space::SharedCluster),
                sp(Space::Global),
                f(Flag::CompleteTxBytes),
            ],
            [d, s, bytes.operand(), m],
        );
    }
    /// `cp.async.bulk.global.shared::cta.bulk_group [dst], [src], bytes;` (sm_90)
    #[track_caller]
    pub fn cp_async_bulk_s2g<U, V>(
        &mut self,
        dst: impl Into<Addr<U, Global>>,
        src: impl Into<Addr<V, Shared>>,
        bytes: impl Src<u32>,
    ) {
        let d = self.addr_operand(dst);
        let s = self.addr_operand(src);
        self.emit(
            Opcode::CpAsyncBulk,
            [sp(Space::Global), sp(Space::SharedCta), f(Flag::BulkGroup)],
            [d, s, bytes.operand()],
        );
    }
    /// `cp.async.bulk.tensor.Nd.shared::cluster.global.tile.mbarrier::complete_tx::bytes [dst], [tmap, {c..}], [mbar];`
    #[track_caller]
    pub fn cp_async_bulk_tensor_g2s<U>(
        &mut self,
        dst: impl Into<Addr<U, Shared>>,
        tmap: Reg<u64>,
        coords: &[Reg<i32>],
        mbar: SharedPtr<u64>,
    ) {
        if coords.is_empty() || coords.len() > 5 {
            self.fail(BuildError::Invalid(format!(
                "cp.async.bulk.tensor takes 1..=5 coordinates, not {}",
                coords.len()
            )));
            return;
        }
        let d = self.addr_operand(dst);
        let m = self.addr_operand(mbar);
        let ta = Operand::TensorAddr {
            base: AddrBase::Reg(tmap.name()),
            coords: coords.iter().map(|c| c.op()).collect(),
        };
        self.emit(
            Opcode::CpAsyncBulkTensor,
            [
                Mod::Dim(coords.len() as u8),
                sp(Space::SharedCluster),
                sp(Space::Global),
                f(Flag::Tile),
                f(Flag::CompleteTxBytes),
            ],
            [d, ta, m],
        );
    }
    /// `cp.async.bulk.tensor.Nd.global.shared::cta.tile.bulk_group [tmap, {c..}], [src];`
    #[track_caller]
    pub fn cp_async_bulk_tensor_s2g<U>(
        &mut self,
        tmap: Reg<u64>,
        coords: &[Reg<i32>],
        src: impl Into<Addr<U, Shared>>,
    ) {
        if coords.is_empty() || coords.len() > 5 {
            self.fail(BuildError::Invalid(format!(
                "cp.async.bulk.tensor takes 1..=5 coordinates, not {}",
                coords.len()
            )));
            return;
        }
        let s = self.addr_operand(src);
        let ta = Operand::TensorAddr {
            base: AddrBase::Reg(tmap.name()),
            coords: coords.iter().map(|c| c.op()).collect(),
        };
        self.emit(
            Opcode::CpAsyncBulkTensor,
            [
                Mod::Dim(coords.len() as u8),
                sp(Space::Global),
                sp(Space::SharedCta),
                f(Flag::Tile),
                f(Flag::BulkGroup),
            ],
            [ta, s],
        );
    }
    /// `cp.async.bulk.commit_group;`
    #[track_caller]
    pub fn cp_async_bulk_commit_group(&mut self) {
        self.emit(Opcode::CpAsyncBulkCommitGroup, [], []);
    }
    /// `cp.async.bulk.wait_group{.read} n;`
    #[track_caller]
    pub fn cp_async_bulk_wait_group(&mut self, n: u32, read: bool) {
        let mods = if read { vec![f(Flag::Read)] } else { vec![] };
        self.emit(Opcode::CpAsyncBulkWaitGroup, mods, [imm(n as i64)]);
    }

    // =========================================================================================
    // mbarrier

    /// `mbarrier.init.shared.b64 [bar], count;`
    #[track_caller]
    pub fn mbarrier_init(&mut self, bar: SharedPtr<u64>, count: impl Src<u32>) {
        let a = self.addr_operand(bar);
        self.emit(
            Opcode::MbarrierInit,
            [sp(Space::Shared), t(Ty::B64)],
            [a, count.operand()],
        );
    }
    /// `mbarrier.inval.shared.b64 [bar];`
    #[track_caller]
    pub fn mbarrier_inval(&mut self, bar: SharedPtr<u64>) {
        let a = self.addr_operand(bar);
        self.emit(Opcode::MbarrierInval, [sp(Space::Shared), t(Ty::B64)], [a]);
    }
    /// `mbarrier.arrive.shared.b64 state, [bar];`
    #[track_caller]
    pub fn mbarrier_arrive(&mut self, bar: SharedPtr<u64>) -> Reg<u64> {
        let a = self.addr_operand(bar);
        let d = self.reg();
        self.emit(
            Opcode::MbarrierArrive,
            [sp(Space::Shared), t(Ty::B64)],
            [d.op(), a],
        );
        d
    }
    /// `mbarrier.arrive.expect_tx.shared::cta.b64 state, [bar], tx;` (sm_90)
    #[track_caller]
    pub fn mbarrier_arrive_expect_tx(
        &mut self,
        bar: SharedPtr<u64>,
        tx: impl Src<u32>,
    ) -> Reg<u64> {
        let a = self.addr_operand(bar);
        let d = self.reg();
        self.emit(
            Opcode::MbarrierArrive,
            [f(Flag::ExpectTx), sp(Space::SharedCta), t(Ty::B64)],
            [d.op(), a, tx.operand()],
        );
        d
    }
    /// `mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [bar], tx;` (sm_90)
    #[track_caller]
    pub fn mbarrier_expect_tx(&mut self, bar: SharedPtr<u64>, tx: impl Src<u32>) {
        let a = self.addr_operand(bar);
        self.emit(
            Opcode::MbarrierExpectTx,
            [
                f(Flag::Relaxed),
                f(Flag::Cta),
                sp(Space::SharedCta),
                t(Ty::B64),
            ],
            [a, tx.operand()],
        );
    }
    /// `mbarrier.test_wait.shared.b64 p, [bar], state;`
    #[track_caller]
    pub fn mbarrier_test_wait(&mut self, bar: SharedPtr<u64>, state: Reg<u64>) -> Reg<Pred> {
        let a = self.addr_operand(bar);
        let p = self.reg();
        self.emit(
            Opcode::MbarrierTestWait,
            [sp(Space::Shared), t(Ty::B64)],
            [p.op(), a, state.op()],
        );
        p
    }
    /// `mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity;` (sm_90)
    #[track_caller]
    pub fn mbarrier_try_wait_parity(
        &mut self,
        bar: SharedPtr<u64>,
        parity: impl Src<u32>,
    ) -> Reg<Pred> {
        let a = self.addr_operand(bar);
        let p = self.reg();
        self.emit(
            Opcode::MbarrierTryWait,
            [f(Flag::Parity), sp(Space::SharedCta), t(Ty::B64)],
            [p.op(), a, parity.operand()],
        );
        p
    }
    /// Spins on [`KernelBuilder::mbarrier_try_wait_parity`] until the phase completes
    /// (`L: try_wait; @!p bra L;`).
    #[track_caller]
    pub fn mbarrier_wait_parity(&mut self, bar: SharedPtr<u64>, parity: impl Src<u32>) {
        let head = self.new_label();
        self.place(head);
        let p = self.mbarrier_try_wait_parity(bar, parity);
        self.bra_unless(p, head);
    }

    // =========================================================================================
    // Hopper miscellany and control

    /// `setmaxnreg.inc.sync.aligned.u32 n;` (sm_90a)
    #[track_caller]
    pub fn setmaxnreg_inc(&mut self, n: u32) {
        self.emit(
            Opcode::Setmaxnreg,
            [f(Flag::Inc), f(Flag::Sync), f(Flag::Aligned), t(Ty::U32)],
            [imm(n as i64)],
        );
    }
    /// `setmaxnreg.dec.sync.aligned.u32 n;` (sm_90a)
    #[track_caller]
    pub fn setmaxnreg_dec(&mut self, n: u32) {
        self.emit(
            Opcode::Setmaxnreg,
            [f(Flag::Dec), f(Flag::Sync), f(Flag::Aligned), t(Ty::U32)],
            [imm(n as i64)],
        );
    }
    /// `griddepcontrol.wait;` (sm_90)
    #[track_caller]
    pub fn griddepcontrol_wait(&mut self) {
        self.emit(Opcode::Griddepcontrol, [f(Flag::Wait)], []);
    }
    /// `griddepcontrol.launch_dependents;` (sm_90)
    #[track_caller]
    pub fn griddepcontrol_launch_dependents(&mut self) {
        self.emit(Opcode::Griddepcontrol, [f(Flag::LaunchDependents)], []);
    }
    /// `mapa.shared::cluster.u32 d, a, rank;` (address of the same variable in CTA `rank`)
    #[track_caller]
    pub fn mapa<T>(&mut self, a: SharedPtr<T>, rank: impl Src<u32>) -> Ptr<T, SharedCluster> {
        let d = self.reg::<u32>();
        self.emit(
            Opcode::Mapa,
            [sp(Space::SharedCluster), t(Ty::U32)],
            [d.op(), a.reg().op(), rank.operand()],
        );
        Ptr::from_reg(d).add_bytes(a.byte_offset())
    }
    /// `getctarank.shared::cluster.u32 d, a;`
    #[track_caller]
    pub fn getctarank<T>(&mut self, a: Ptr<T, SharedCluster>) -> Reg<u32> {
        let d = self.reg::<u32>();
        self.emit(
            Opcode::Getctarank,
            [sp(Space::SharedCluster), t(Ty::U32)],
            [d.op(), a.reg().op()],
        );
        d
    }
    /// `barrier.cluster.arrive;` (sm_90)
    #[track_caller]
    pub fn barrier_cluster_arrive(&mut self) {
        self.emit(Opcode::BarrierCluster, [f(Flag::Arrive)], []);
    }
    /// `barrier.cluster.wait;` (sm_90)
    #[track_caller]
    pub fn barrier_cluster_wait(&mut self) {
        self.emit(Opcode::BarrierCluster, [f(Flag::Wait)], []);
    }
    /// `nanosleep.u32 ns;`
    #[track_caller]
    pub fn nanosleep(&mut self, ns: impl Src<u32>) {
        self.emit(Opcode::Nanosleep, [t(Ty::U32)], [ns.operand()]);
    }
    /// `trap;`
    #[track_caller]
    pub fn trap(&mut self) {
        self.emit(Opcode::Trap, [], []);
    }
    /// `exit;`
    #[track_caller]
    pub fn exit(&mut self) {
        self.emit(Opcode::Exit, [], []);
    }
    /// `ret;`
    #[track_caller]
    pub fn ret(&mut self) {
        self.emit(Opcode::Ret, [], []);
    }
    /// `brkpt;`
    #[track_caller]
    pub fn brkpt(&mut self) {
        self.emit(Opcode::Brkpt, [], []);
    }
}
