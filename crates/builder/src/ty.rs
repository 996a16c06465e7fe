//! Rust-level typing of PTX values: register classes, the [`PtxType`] trait and its marker types,
//! typed register handles [`Reg<T>`], immediate/register sources [`Src`], state-space markers and
//! typed pointers [`Ptr<T, S>`] with lazy addresses [`Addr<T, S>`].

use ptx::{Imm, Operand, Ty};
use std::fmt;
use std::marker::PhantomData;

/// The physical register class a value lives in; one `.reg` declaration per class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RegClass {
    /// `.reg .pred %p<N>`
    Pred,
    /// `.reg .b16 %rs<N>` (8/16-bit integers, f16, bf16, fp8x2)
    B16,
    /// `.reg .b32 %r<N>` (32-bit integers, packed f16x2/bf16x2/fp8x4, tf32)
    B32,
    /// `.reg .f32 %f<N>`
    F32,
    /// `.reg .b64 %rd<N>` (64-bit integers, addresses)
    B64,
    /// `.reg .f64 %fd<N>`
    F64,
}

impl RegClass {
    pub const ALL: [RegClass; 6] = [
        RegClass::Pred,
        RegClass::B16,
        RegClass::B32,
        RegClass::F32,
        RegClass::B64,
        RegClass::F64,
    ];
    /// Register name prefix (`%r`, `%rd`, ...).
    pub fn prefix(self) -> &'static str {
        match self {
            RegClass::Pred => "%p",
            RegClass::B16 => "%rs",
            RegClass::B32 => "%r",
            RegClass::F32 => "%f",
            RegClass::B64 => "%rd",
            RegClass::F64 => "%fd",
        }
    }
    /// Declared type of the class.
    pub fn decl_ty(self) -> Ty {
        match self {
            RegClass::Pred => Ty::Pred,
            RegClass::B16 => Ty::B16,
            RegClass::B32 => Ty::B32,
            RegClass::F32 => Ty::F32,
            RegClass::B64 => Ty::B64,
            RegClass::F64 => Ty::F64,
        }
    }
    pub(crate) fn index(self) -> usize {
        self as usize
    }
    /// Splits a builder register name (`%rd12`) into its class and number.
    pub fn parse_name(name: &str) -> Option<(RegClass, u32)> {
        // Longest prefixes first: `%rd`/`%rs` before `%r`, `%fd` before `%f`.
        for c in [
            RegClass::B64,
            RegClass::B16,
            RegClass::F64,
            RegClass::B32,
            RegClass::F32,
            RegClass::Pred,
        ] {
            if let Some(rest) = name.strip_prefix(c.prefix()) {
                if !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()) {
                    return rest.parse().ok().map(|n| (c, n));
                }
            }
        }
        None
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A PTX value type usable as the type of a [`Reg`].
pub trait PtxType: Copy + 'static + sealed::Sealed {
    /// Type modifier of arithmetic/compare/convert instructions (`.u32`, `.f32`, `.bf16x2`).
    const TY: Ty;
    /// Register class holding the value.
    const CLASS: RegClass;
    /// Type used by `ld`/`st`/`.param` (`.u8` for u8, `.b16` for f16, ...).
    const MEM_TY: Ty;
    /// Type used by `mov`/`selp` (bit type for 8-bit and packed values).
    const MOV_TY: Ty;
    /// Size in bytes (1 for pred).
    const SIZE: u32;
}

macro_rules! ptx_type {
    ($($(#[$m:meta])* $t:ty => $ty:ident, $class:ident, $mem:ident, $mov:ident, $size:literal;)*) => {$(
        impl sealed::Sealed for $t {}
        $(#[$m])*
        impl PtxType for $t {
            const TY: Ty = Ty::$ty;
            const CLASS: RegClass = RegClass::$class;
            const MEM_TY: Ty = Ty::$mem;
            const MOV_TY: Ty = Ty::$mov;
            const SIZE: u32 = $size;
        }
    )*};
}

macro_rules! marker {
    ($($(#[$m:meta])* $name:ident;)*) => {$(
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $name;
    )*};
}

marker! {
    /// A predicate (`.pred`).
    Pred;
    /// IEEE half (`.f16`, in a b16 register).
    F16;
    /// bfloat16 (`.bf16`, in a b16 register).
    Bf16;
    /// Two packed halves (`.f16x2`, b32 register).
    F16x2;
    /// Two packed bfloat16 (`.bf16x2`, b32 register).
    Bf16x2;
    /// Two packed FP8 E4M3 values (`.e4m3x2`, b16 register).
    E4m3x2;
    /// Two packed FP8 E5M2 values (`.e5m2x2`, b16 register).
    E5m2x2;
    /// Four packed FP8 E4M3 values (`.e4m3x4`, b32 register; mma fragments).
    E4m3x4;
    /// Four packed FP8 E5M2 values (`.e5m2x4`, b32 register; mma fragments).
    E5m2x4;
    /// Untyped 16 bits.
    B16;
    /// Untyped 32 bits.
    B32;
    /// Untyped 64 bits.
    B64;
    /// TensorFloat-32 in a b32 register (mma.m16n8k8 operands).
    Tf32;
}

ptx_type! {
    Pred => Pred, Pred, Pred, Pred, 1;
    u8 => U8, B16, U8, B16, 1;
    i8 => S8, B16, S8, B16, 1;
    u16 => U16, B16, U16, U16, 2;
    i16 => S16, B16, S16, S16, 2;
    u32 => U32, B32, U32, U32, 4;
    i32 => S32, B32, S32, S32, 4;
    u64 => U64, B64, U64, U64, 8;
    i64 => S64, B64, S64, S64, 8;
    f32 => F32, F32, F32, F32, 4;
    f64 => F64, F64, F64, F64, 8;
    F16 => F16, B16, B16, B16, 2;
    Bf16 => Bf16, B16, B16, B16, 2;
    F16x2 => F16x2, B32, B32, B32, 4;
    Bf16x2 => Bf16x2, B32, B32, B32, 4;
    E4m3x2 => E4m3x2, B16, B16, B16, 2;
    E5m2x2 => E5m2x2, B16, B16, B16, 2;
    E4m3x4 => E4m3x4, B32, B32, B32, 4;
    E5m2x4 => E5m2x4, B32, B32, B32, 4;
    B16 => B16, B16, B16, B16, 2;
    B32 => B32, B32, B32, B32, 4;
    B64 => B64, B64, B64, B64, 8;
    Tf32 => Tf32, B32, B32, B32, 4;
}

macro_rules! impl_trait {
    ($tr:ident: $($t:ty),*) => {$(impl $tr for $t {})*};
}

/// Values that live in memory (everything but `Pred`): `ld`, `st`, `selp`, `.param`.
pub trait Scalar: PtxType {}
impl_trait!(Scalar: u8, i8, u16, i16, u32, i32, u64, i64, f32, f64, F16, Bf16, F16x2, Bf16x2, E4m3x2, E5m2x2, E4m3x4, E5m2x4, B16, B32, B64, Tf32);

/// Types with `add`/`sub`/`min`/`max` (and `mul`: `.lo` for integers).
pub trait Arith: PtxType {
    const IS_INT: bool;
}
macro_rules! arith {
    ($v:literal: $($t:ty),*) => {$(impl Arith for $t { const IS_INT: bool = $v; })*};
}
arith!(true: u16, i16, u32, i32, u64, i64);
arith!(false: f32, f64, F16, Bf16, F16x2, Bf16x2);

/// Integer types (`mul.hi`, `div`, `rem`, `mad.lo`).
pub trait Int: Arith + Cmp + Scalar {}
impl_trait!(Int: u16, i16, u32, i32, u64, i64);

/// Integer types with a widening multiply (`mul.wide`): the result type.
pub trait Widen: Int {
    type Wide: Int;
}
impl Widen for u16 {
    type Wide = u32;
}
impl Widen for i16 {
    type Wide = i32;
}
impl Widen for u32 {
    type Wide = u64;
}
impl Widen for i32 {
    type Wide = i64;
}

/// Types with `abs`/`neg`.
pub trait Signed: Arith {}
impl_trait!(Signed: i16, i32, i64, f32, f64, F16, Bf16, F16x2, Bf16x2);

/// Floating-point types with `fma.rn` (f32, f64, halves and packed halves).
pub trait FloatLike: Arith {}
impl_trait!(FloatLike: f32, f64, F16, Bf16, F16x2, Bf16x2);

/// IEEE f32/f64 (`div.rn`, `sqrt.rn`, `rcp.rn`).
pub trait Float: FloatLike {}
impl_trait!(Float: f32, f64);

/// Types valid in `setp` comparisons.
pub trait Cmp: PtxType {}
impl_trait!(Cmp: u16, i16, u32, i32, u64, i64, f32, f64, F16, Bf16, B16, B32, B64);

/// Types with `and`/`or`/`xor`/`not` (predicates use `.pred`, the rest their bit type).
pub trait Logic: PtxType {
    const LOGIC_TY: Ty;
}
macro_rules! logic {
    ($($t:ty => $l:ident),*) => {$(impl Logic for $t { const LOGIC_TY: Ty = Ty::$l; })*};
}
logic!(Pred => Pred, u16 => B16, i16 => B16, B16 => B16, u32 => B32, i32 => B32, B32 => B32, u64 => B64, i64 => B64, B64 => B64);

/// Integer/bit types with shifts and bit-field operations.
pub trait Bits: Logic + Scalar {}
impl_trait!(Bits: u16, i16, B16, u32, i32, B32, u64, i64, B64);

/// 32- or 64-bit integer/bit types (`popc`, `clz`, `brev`, `bfe`, `bfi`, `bfind`).
pub trait Bits3264: Bits {}
impl_trait!(Bits3264: u32, i32, B32, u64, i64, B64);

/// 32-bit integer/bit types (`prmt`, `lop3`, `shf`).
pub trait Bits32: Bits3264 {}
impl_trait!(Bits32: u32, i32, B32);

/// Any 32-bit value (`shfl.sync`, `ldmatrix` fragments, `match`).
pub trait Word32: Scalar {}
impl_trait!(Word32: u32, i32, f32, B32, F16x2, Bf16x2, E4m3x4, E5m2x4, Tf32);

/// Types usable with `atom`/`red`.
pub trait AtomTy: Scalar {}
impl_trait!(AtomTy: u32, i32, u64, i64, f32, f64, B32, B64);

/// Types accepted by `redux.sync` (u32/s32).
pub trait ReduxTy: Scalar {}
impl_trait!(ReduxTy: u32, i32);

/// Numeric types accepted by the scalar `cvt`.
pub trait CvtTy: PtxType {}
impl_trait!(CvtTy: u8, i8, u16, i16, u32, i32, u64, i64, f32, f64, F16, Bf16);

/// A typed register. `Copy`; its name is fixed when allocated by a builder.
pub struct Reg<T> {
    pub(crate) id: u32,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for Reg<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Reg<T> {}
impl<T> PartialEq for Reg<T> {
    fn eq(&self, o: &Self) -> bool {
        self.id == o.id
    }
}
impl<T> Eq for Reg<T> {}
impl<T> std::hash::Hash for Reg<T> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.id.hash(h)
    }
}

impl<T: PtxType> Reg<T> {
    pub(crate) fn new(id: u32) -> Reg<T> {
        Reg {
            id,
            _t: PhantomData,
        }
    }
    /// The PTX name (`%r3`), for use in [`crate::KernelBuilder::raw`] text.
    pub fn name(&self) -> String {
        format!("{}{}", T::CLASS.prefix(), self.id)
    }
    /// The register as an IR operand.
    pub fn op(&self) -> Operand {
        Operand::Reg(self.name())
    }
    /// The same register viewed as another type of the same register class (`i32` <-> `u32`,
    /// `B32` <-> `Bf16x2`, ...): no instruction, checked at compile time.
    pub fn reinterpret<U: PtxType>(self) -> Reg<U> {
        const {
            assert!(
                T::CLASS as u8 == U::CLASS as u8,
                "reinterpret needs the same register class"
            )
        };
        Reg::new(self.id)
    }
    /// A type-erased view (for calls).
    pub fn any(&self) -> AnyReg {
        AnyReg {
            name: self.name(),
            mem_ty: T::MEM_TY,
        }
    }
}

impl<T: PtxType> fmt::Display for Reg<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", T::CLASS.prefix(), self.id)
    }
}
impl<T: PtxType> fmt::Debug for Reg<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reg<{}>({}{})", T::TY, T::CLASS.prefix(), self.id)
    }
}

/// A type-erased register: call arguments and return values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnyReg {
    pub name: String,
    pub mem_ty: Ty,
}

/// A source operand of type `T`: a [`Reg<T>`] or a Rust immediate of the matching type.
pub trait Src<T> {
    fn operand(&self) -> Operand;
}

impl<T: PtxType> Src<T> for Reg<T> {
    fn operand(&self) -> Operand {
        self.op()
    }
}

fn int_imm(v: i64) -> Operand {
    Operand::Imm(Imm::Int(v))
}
fn uint_imm(v: u64) -> Operand {
    if v <= i64::MAX as u64 {
        Operand::Imm(Imm::Int(v as i64))
    } else {
        Operand::Imm(Imm::U64(v))
    }
}

macro_rules! int_src {
    ($($rust:ty => $($t:ty),*;)*) => {$($(
        impl Src<$t> for $rust {
            fn operand(&self) -> Operand { uint_imm(*self as u64) }
        }
    )*)*};
}
int_src! {
    u16 => u16;
    u32 => u32;
    u64 => u64;
}

/// An untyped-bits immediate for [`B16`]/[`B32`]/[`B64`] operands (`k.and(bits, BitsImm(0xff))`).
/// Plain Rust integers only stand for their own type so that `k.mov(1u32)` infers `Reg<u32>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BitsImm(pub u64);
impl Src<B16> for BitsImm {
    fn operand(&self) -> Operand {
        uint_imm(self.0 & 0xffff)
    }
}
impl Src<B32> for BitsImm {
    fn operand(&self) -> Operand {
        uint_imm(self.0 & 0xffff_ffff)
    }
}
impl Src<B64> for BitsImm {
    fn operand(&self) -> Operand {
        uint_imm(self.0)
    }
}
macro_rules! sint_src {
    ($($rust:ty => $t:ty),*) => {$(
        impl Src<$t> for $rust {
            fn operand(&self) -> Operand { int_imm(*self as i64) }
        }
    )*};
}
sint_src!(i16 => i16, i32 => i32, i64 => i64);

impl Src<f32> for f32 {
    fn operand(&self) -> Operand {
        Operand::Imm(Imm::F32(self.to_bits()))
    }
}
impl Src<f64> for f64 {
    fn operand(&self) -> Operand {
        Operand::Imm(Imm::F64(self.to_bits()))
    }
}

/// Address-register types: u32 (shared windows) and u64 (global/generic).
pub trait AddrTy: PtxType + Int {}
impl AddrTy for u32 {}
impl AddrTy for u64 {}

/// A PTX state space at the type level.
pub trait StateSpace: Copy + 'static {
    /// The `.space` modifier of `ld`/`st` (None for generic addressing).
    const SPACE: Option<ptx::Space>;
    /// Type of an address in this space.
    type A: AddrTy;
}

macro_rules! spaces {
    ($($(#[$m:meta])* $name:ident => $sp:expr, $a:ty;)*) => {$(
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $name;
        impl StateSpace for $name {
            const SPACE: Option<ptx::Space> = $sp;
            type A = $a;
        }
    )*};
}
spaces! {
    /// `.global` (64-bit addresses).
    Global => Some(ptx::Space::Global), u64;
    /// `.shared` (32-bit shared-window addresses).
    Shared => Some(ptx::Space::Shared), u32;
    /// `.shared::cluster` (32-bit addresses, possibly of another CTA via `mapa`).
    SharedCluster => Some(ptx::Space::SharedCluster), u32;
    /// Generic addressing (64-bit, no space modifier).
    Generic => None, u64;
    /// `.local` (64-bit here).
    Local => Some(ptx::Space::Local), u64;
    /// `.const` (64-bit).
    Const => Some(ptx::Space::Const), u64;
}

/// A typed pointer: an address register of space `S` plus a constant byte offset.
pub struct Ptr<T, S: StateSpace> {
    pub(crate) base: Reg<S::A>,
    pub(crate) off: i64,
    _t: PhantomData<fn() -> T>,
}

impl<T, S: StateSpace> Clone for Ptr<T, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T, S: StateSpace> Copy for Ptr<T, S> {}
impl<T, S: StateSpace> fmt::Debug for Ptr<T, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ptr({:?}+{})", self.base, self.off)
    }
}

/// `.global` pointer to `T`.
pub type GlobalPtr<T> = Ptr<T, Global>;
/// `.shared` pointer to `T` (32-bit).
pub type SharedPtr<T> = Ptr<T, Shared>;
/// Generic pointer to `T`.
pub type GenericPtr<T> = Ptr<T, Generic>;

impl<T, S: StateSpace> Ptr<T, S> {
    /// Wraps an address register.
    pub fn from_reg(r: Reg<S::A>) -> Self {
        Ptr {
            base: r,
            off: 0,
            _t: PhantomData,
        }
    }
    /// The base address register (without the constant offset).
    pub fn reg(&self) -> Reg<S::A> {
        self.base
    }
    /// Constant byte offset folded into the address operand.
    pub fn byte_offset(&self) -> i64 {
        self.off
    }
    /// Adds a constant byte offset (no instruction).
    pub fn add_bytes(self, bytes: i64) -> Self {
        Ptr {
            base: self.base,
            off: self.off + bytes,
            _t: PhantomData,
        }
    }
    /// Reinterprets the pointee type.
    pub fn cast<U>(self) -> Ptr<U, S> {
        Ptr {
            base: self.base,
            off: self.off,
            _t: PhantomData,
        }
    }
}

impl<T: PtxType, S: StateSpace> Ptr<T, S> {
    /// Element `i` at a compile-time index (folded into the address, no instruction).
    pub fn at(self, i: i64) -> Self {
        self.add_bytes(i * T::SIZE as i64)
    }
    /// Element at a runtime index: a lazy address; the `ld`/`st` using it emits one
    /// `mad.wide`/`mad.lo` to form it.
    pub fn offset<I: Index<S::A>>(self, i: I) -> Addr<T, S> {
        let mut ix = i.index();
        ix.scale = T::SIZE;
        Addr {
            ptr: self,
            index: Some(ix),
        }
    }
}

/// A runtime index usable with addresses of type `A`.
pub trait Index<A> {
    fn index(&self) -> IndexVal;
}

/// Type-erased runtime index.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexVal {
    pub(crate) op: Operand,
    /// The `mad` type to use: `wide.u32`, `wide.s32`, `lo.u64`, `lo.u32`...
    pub(crate) ty: Ty,
    pub(crate) wide: bool,
    /// Element size in bytes (set by [`Ptr::offset`]).
    pub(crate) scale: u32,
}

impl Index<u64> for Reg<u32> {
    fn index(&self) -> IndexVal {
        IndexVal {
            op: self.op(),
            ty: Ty::U32,
            wide: true,
            scale: 1,
        }
    }
}
impl Index<u64> for Reg<i32> {
    fn index(&self) -> IndexVal {
        IndexVal {
            op: self.op(),
            ty: Ty::S32,
            wide: true,
            scale: 1,
        }
    }
}
impl Index<u64> for Reg<u64> {
    fn index(&self) -> IndexVal {
        IndexVal {
            op: self.op(),
            ty: Ty::U64,
            wide: false,
            scale: 1,
        }
    }
}
impl Index<u64> for Reg<i64> {
    fn index(&self) -> IndexVal {
        IndexVal {
            op: self.op(),
            ty: Ty::S64,
            wide: false,
            scale: 1,
        }
    }
}
impl Index<u32> for Reg<u32> {
    fn index(&self) -> IndexVal {
        IndexVal {
            op: self.op(),
            ty: Ty::U32,
            wide: false,
            scale: 1,
        }
    }
}
impl Index<u32> for Reg<i32> {
    fn index(&self) -> IndexVal {
        IndexVal {
            op: self.op(),
            ty: Ty::S32,
            wide: false,
            scale: 1,
        }
    }
}

/// A (lazy) memory address of a `T` in space `S`: a pointer plus an optional runtime index.
pub struct Addr<T, S: StateSpace> {
    pub(crate) ptr: Ptr<T, S>,
    pub(crate) index: Option<IndexVal>,
}

impl<T, S: StateSpace> Clone for Addr<T, S> {
    fn clone(&self) -> Self {
        Addr {
            ptr: self.ptr,
            index: self.index.clone(),
        }
    }
}

impl<T, S: StateSpace> From<Ptr<T, S>> for Addr<T, S> {
    fn from(p: Ptr<T, S>) -> Self {
        Addr {
            ptr: p,
            index: None,
        }
    }
}

impl<T, S: StateSpace> Addr<T, S> {
    /// Reinterprets the pointee type (a runtime index keeps the scale of the original type).
    pub fn cast<U>(self) -> Addr<U, S> {
        Addr {
            ptr: self.ptr.cast(),
            index: self.index,
        }
    }
}

/// A label in the current function (see [`crate::KernelBuilder::new_label`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Label(pub(crate) u32);

impl Label {
    pub fn name(&self) -> String {
        format!("$L__{}", self.0)
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "$L__{}", self.0)
    }
}
