//! The expression layer: arithmetic and comparison on registers and immediates written as Rust
//! expressions, one PTX instruction per operator, exactly what the method API emits.
//!
//! [`KernelBuilder::expr`] runs a closure with an [`ExprScope`]; inside it, [`Ex<T>`] values
//! (registers bound to the scope) take `+ - * / % & | ^ << >>`, unary `-` and `!`, and
//! comparison methods (`lt`, `le`, `gt`, `ge`, `eq`, `ne`) giving predicates. [`ExPtr`] reads and
//! writes elements (`x.get(i)`, `y.set(i, v)`: the same `mad.wide` + `ld`/`st` as
//! `k.ld(x.offset(i))`). Nothing is fused behind your back: `a * x + y` is `mul` then `add`;
//! `a.mul_add(x, y)` is one `fma.rn`. Both styles mix: [`ExprScope::k`] lends the builder for
//! method calls, [`ExprScope::val`] binds any register, [`Ex::reg`] gives it back.
//!
//! ```
//! use builder::*;
//! let k = KernelBuilder::new("saxpy", Target::sm80()).typed();
//! let (k, x) = k.param::<GlobalPtr<f32>>("x");
//! let (k, y) = k.param::<GlobalPtr<f32>>("y");
//! let (k, a) = k.param::<f32>("a");
//! let (mut k, n) = k.param::<u32>("n");
//! k.expr(|e| {
//!     let (x, y, a, i) = (e.ptr(x), e.ptr(y), e.val(a), e.global_index_x());
//!     e.if_(i.lt(n), || y.set(i, a.mul_add(x.get(i), y.get(i))));
//! });
//! let saxpy = k.finish().unwrap();
//! ```
//!
//! Every operator is `#[track_caller]`, so instructions remember the Rust line of the operator.

use crate::kernel::KernelBuilder;
use crate::ty::*;
use ptx::Operand;
use std::cell::{RefCell, RefMut};
use std::ops;

/// The builder, lent to expression values for the duration of [`KernelBuilder::expr`].
pub struct ExprScope {
    k: RefCell<KernelBuilder>,
}

impl KernelBuilder {
    /// Runs `f` with an [`ExprScope`] over this builder (see [`crate::expr`]).
    pub fn expr<R>(&mut self, f: impl for<'s> FnOnce(&'s ExprScope) -> R) -> R {
        let placeholder = KernelBuilder::new(self.name(), self.target().clone());
        let scope = ExprScope {
            k: RefCell::new(std::mem::replace(self, placeholder)),
        };
        let r = f(&scope);
        *self = scope.k.into_inner();
        r
    }
}

/// A register of type `T` bound to an [`ExprScope`]: operators on it emit instructions.
pub struct Ex<'s, T> {
    s: &'s ExprScope,
    r: Reg<T>,
}

impl<T> Clone for Ex<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Ex<'_, T> {}

impl<T: PtxType> std::fmt::Debug for Ex<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ex({:?})", self.r)
    }
}

impl<T: PtxType> Src<T> for Ex<'_, T> {
    fn operand(&self) -> Operand {
        self.r.op()
    }
}

impl<A, T: PtxType> Index<A> for Ex<'_, T>
where
    Reg<T>: Index<A>,
{
    fn index(&self) -> IndexVal {
        self.r.index()
    }
}

impl ExprScope {
    /// The builder, for method-style calls (do not hold it across an operator).
    pub fn k(&self) -> RefMut<'_, KernelBuilder> {
        self.k.borrow_mut()
    }
    /// Binds a register to this scope (no instruction).
    pub fn val<T: PtxType>(&self, r: Reg<T>) -> Ex<'_, T> {
        Ex { s: self, r }
    }
    /// Binds a pointer to this scope (no instruction).
    pub fn ptr<T: Scalar, S: StateSpace>(&self, p: Ptr<T, S>) -> ExPtr<'_, T, S> {
        ExPtr { s: self, p }
    }
    /// `mov` of an immediate into a fresh register.
    #[track_caller]
    pub fn imm<T: PtxType>(&self, v: impl Src<T>) -> Ex<'_, T> {
        let r = self.k().mov(v);
        self.val(r)
    }
    /// [`KernelBuilder::global_index_x`].
    #[track_caller]
    pub fn global_index_x(&self) -> Ex<'_, u32> {
        let r = self.k().global_index_x();
        self.val(r)
    }
    /// [`KernelBuilder::tid_x`].
    #[track_caller]
    pub fn tid_x(&self) -> Ex<'_, u32> {
        let r = self.k().tid_x();
        self.val(r)
    }
    /// [`KernelBuilder::ctaid_x`].
    #[track_caller]
    pub fn ctaid_x(&self) -> Ex<'_, u32> {
        let r = self.k().ctaid_x();
        self.val(r)
    }
    /// [`KernelBuilder::lane_id`].
    #[track_caller]
    pub fn lane_id(&self) -> Ex<'_, u32> {
        let r = self.k().lane_id();
        self.val(r)
    }
    /// `@!p bra END; <then> END:` (as [`KernelBuilder::if_`]).
    #[track_caller]
    pub fn if_(&self, p: Ex<'_, Pred>, then: impl FnOnce()) {
        let end = {
            let mut k = self.k();
            let end = k.new_label();
            k.bra_unless(p.r, end);
            end
        };
        then();
        self.k().place(end);
    }
    /// `bar.sync 0` (as [`KernelBuilder::bar_sync`]).
    #[track_caller]
    pub fn sync_threads(&self) {
        self.k().bar_sync(0u32);
    }
    /// `d = v` into an existing register (`mov`), for loop-carried values.
    #[track_caller]
    pub fn assign<T: PtxType>(&self, d: Ex<'_, T>, v: impl Src<T>) {
        self.k().mov_to(d.r, v);
    }
    /// `select(p, a, b)` = `selp`: `a` where `p`, else `b`.
    #[track_caller]
    pub fn select<T: Scalar>(&self, p: Ex<'_, Pred>, a: impl Src<T>, b: impl Src<T>) -> Ex<'_, T> {
        let r = self.k().selp(a, b, p.r);
        self.val(r)
    }
}

impl<'s, T: PtxType> Ex<'s, T> {
    /// The register (for method-style calls).
    pub fn reg(self) -> Reg<T> {
        self.r
    }
    fn wrap<U>(self, r: Reg<U>) -> Ex<'s, U> {
        Ex { s: self.s, r }
    }
    /// `cvt` to `D` with the C-like default rounding (as [`KernelBuilder::cvt`]).
    #[track_caller]
    pub fn cvt<D: CvtTy>(self) -> Ex<'s, D>
    where
        T: CvtTy,
    {
        let r = self.s.k().cvt::<D, T>(self.r);
        self.wrap(r)
    }
}

impl<'s, T: FloatLike> Ex<'s, T> {
    /// `fma.rn`: `self * b + c` rounded once.
    #[track_caller]
    pub fn mul_add(self, b: impl Src<T>, c: impl Src<T>) -> Ex<'s, T> {
        let r = self.s.k().fma(self, b, c);
        self.wrap(r)
    }
}

impl<'s, T: Int> Ex<'s, T> {
    /// `mad.lo`: `self * b + c` (low half).
    #[track_caller]
    pub fn mad_lo(self, b: impl Src<T>, c: impl Src<T>) -> Ex<'s, T> {
        let r = self.s.k().mad_lo(self, b, c);
        self.wrap(r)
    }
}

impl<'s, T: Arith> Ex<'s, T> {
    /// `min`.
    #[track_caller]
    pub fn min(self, b: impl Src<T>) -> Ex<'s, T> {
        let r = self.s.k().min(self, b);
        self.wrap(r)
    }
    /// `max`.
    #[track_caller]
    pub fn max(self, b: impl Src<T>) -> Ex<'s, T> {
        let r = self.s.k().max(self, b);
        self.wrap(r)
    }
}

macro_rules! cmp_methods {
    ($($name:ident: $doc:literal;)*) => {
        impl<'s, T: Cmp> Ex<'s, T> {$(
            #[doc = $doc]
            #[track_caller]
            pub fn $name(self, b: impl Src<T>) -> Ex<'s, Pred> {
                let r = self.s.k().$name(self, b);
                self.wrap(r)
            }
        )*}
    };
}
cmp_methods! {
    lt: "`setp.lt`: `self < b`.";
    le: "`setp.le`: `self <= b`.";
    gt: "`setp.gt`: `self > b`.";
    ge: "`setp.ge`: `self >= b`.";
    eq: "`setp.eq`: `self == b`.";
    ne: "`setp.ne`: `self != b`.";
}

macro_rules! binop {
    ($($tr:ident $m:ident => $bound:ident $op:ident;)*) => {$(
        impl<'s, T: $bound, U: Src<T>> ops::$tr<U> for Ex<'s, T> {
            type Output = Ex<'s, T>;
            #[track_caller]
            fn $m(self, rhs: U) -> Ex<'s, T> {
                let r = self.s.k().$op(self, rhs);
                self.wrap(r)
            }
        }
    )*};
}
binop! {
    Add add => Arith add;
    Sub sub => Arith sub;
    Mul mul => Arith mul;
    BitAnd bitand => Logic and;
    BitOr bitor => Logic or;
    BitXor bitxor => Logic xor;
}

impl<'s, T: Bits, U: Src<u32>> ops::Shl<U> for Ex<'s, T> {
    type Output = Ex<'s, T>;
    #[track_caller]
    fn shl(self, n: U) -> Ex<'s, T> {
        let r = self.s.k().shl(self, n);
        self.wrap(r)
    }
}
impl<'s, T: Bits, U: Src<u32>> ops::Shr<U> for Ex<'s, T> {
    type Output = Ex<'s, T>;
    #[track_caller]
    fn shr(self, n: U) -> Ex<'s, T> {
        let r = self.s.k().shr(self, n);
        self.wrap(r)
    }
}
impl<'s, T: Signed> ops::Neg for Ex<'s, T> {
    type Output = Ex<'s, T>;
    #[track_caller]
    fn neg(self) -> Ex<'s, T> {
        let r = self.s.k().neg(self);
        self.wrap(r)
    }
}
impl<'s, T: Logic> ops::Not for Ex<'s, T> {
    type Output = Ex<'s, T>;
    #[track_caller]
    fn not(self) -> Ex<'s, T> {
        let r = self.s.k().not(self);
        self.wrap(r)
    }
}

// `/` is `div` (integers) or `div.rn` (f32/f64); `%` is `rem` (integers). Not for halves, which
// have no `div`.
macro_rules! div_rem {
    (div: $($t:ty),*) => {$(
        impl<'s, U: Src<$t>> ops::Div<U> for Ex<'s, $t> {
            type Output = Ex<'s, $t>;
            #[track_caller]
            fn div(self, rhs: U) -> Ex<'s, $t> {
                let r = self.s.k().div(self, rhs);
                self.wrap(r)
            }
        }
    )*};
    (rem: $($t:ty),*) => {$(
        impl<'s, U: Src<$t>> ops::Rem<U> for Ex<'s, $t> {
            type Output = Ex<'s, $t>;
            #[track_caller]
            fn rem(self, rhs: U) -> Ex<'s, $t> {
                let r = self.s.k().rem(self, rhs);
                self.wrap(r)
            }
        }
    )*};
}
div_rem!(div: u16, i16, u32, i32, u64, i64, f32, f64);
div_rem!(rem: u16, i16, u32, i32, u64, i64);

// Immediates on the left: `2.0f32 * x`, `1u32 + i`.
macro_rules! lhs_imm {
    ($($t:ty),*) => {$(
        impl<'s> ops::Add<Ex<'s, $t>> for $t {
            type Output = Ex<'s, $t>;
            #[track_caller]
            fn add(self, rhs: Ex<'s, $t>) -> Ex<'s, $t> {
                let r = rhs.s.k().add(self, rhs);
                rhs.wrap(r)
            }
        }
        impl<'s> ops::Sub<Ex<'s, $t>> for $t {
            type Output = Ex<'s, $t>;
            #[track_caller]
            fn sub(self, rhs: Ex<'s, $t>) -> Ex<'s, $t> {
                let r = rhs.s.k().sub(self, rhs);
                rhs.wrap(r)
            }
        }
        impl<'s> ops::Mul<Ex<'s, $t>> for $t {
            type Output = Ex<'s, $t>;
            #[track_caller]
            fn mul(self, rhs: Ex<'s, $t>) -> Ex<'s, $t> {
                let r = rhs.s.k().mul(self, rhs);
                rhs.wrap(r)
            }
        }
    )*};
}
lhs_imm!(u16, i16, u32, i32, u64, i64, f32, f64);

/// A pointer bound to an [`ExprScope`]: element reads and writes.
pub struct ExPtr<'s, T, S: StateSpace> {
    s: &'s ExprScope,
    p: Ptr<T, S>,
}

impl<T, S: StateSpace> Clone for ExPtr<'_, T, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T, S: StateSpace> Copy for ExPtr<'_, T, S> {}

impl<'s, T: Scalar, S: StateSpace> ExPtr<'s, T, S> {
    /// `p[i]`: `ld` of element `i` (as `k.ld(p.offset(i))`: one `mad` + `ld`).
    #[track_caller]
    pub fn get<I: Index<S::A>>(self, i: I) -> Ex<'s, T> {
        let r = self.s.k().ld(self.p.offset(i));
        Ex { s: self.s, r }
    }
    /// `p[i] = v`: `st` of element `i` (as `k.st(p.offset(i), v)`).
    #[track_caller]
    pub fn set<I: Index<S::A>>(self, i: I, v: Ex<'_, T>) {
        self.s.k().st(self.p.offset(i), v.r);
    }
    /// Element `i` at a compile-time index: `ld [p+i*size]`.
    #[track_caller]
    pub fn get_at(self, i: i64) -> Ex<'s, T> {
        let r = self.s.k().ld(self.p.at(i));
        Ex { s: self.s, r }
    }
    /// Element `i` at a compile-time index: `st [p+i*size]`.
    #[track_caller]
    pub fn set_at(self, i: i64, v: Ex<'_, T>) {
        self.s.k().st(self.p.at(i), v.r);
    }
    /// The pointer (for method-style calls).
    pub fn ptr(self) -> Ptr<T, S> {
        self.p
    }
}
