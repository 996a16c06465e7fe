//! Typed kernels: a kernel whose parameter list is part of its Rust type.
//!
//! [`KernelBuilder::typed`] turns a builder into a [`TypedBuilder<()>`]; each
//! [`TypedBuilder::param`] declares one parameter and appends its marker type to the signature
//! tuple, so after `x: GlobalPtr<f32>`, `a: f32` and `n: u32` the builder is a
//! `TypedBuilder<(GlobalPtr<f32>, f32, u32)>`. [`TypedBuilder::finish`] gives a
//! [`TypedKernel`] of that signature, which `runtime` loads into a typed function and launches
//! with a tuple of host arguments checked by the Rust compiler (`runtime::Stream::launch_typed`).
//!
//! ```
//! use builder::*;
//! let k = KernelBuilder::new("scale", Target::sm80()).typed();
//! let (k, x) = k.param::<GlobalPtr<f32>>("x");
//! let (k, a) = k.param::<f32>("a");
//! let (mut k, n) = k.param::<u32>("n");
//! let i = k.global_index_x();
//! let p = k.lt(i, n);
//! k.if_(p, |k| {
//!     let v = k.ld(x.offset(i));
//!     let v = k.mul(v, a);
//!     k.st(x.offset(i), v);
//! });
//! let kernel: TypedKernel<(GlobalPtr<f32>, f32, u32)> = k.finish().unwrap();
//! assert_eq!(kernel.name(), "scale");
//! ```
//!
//! The signature is also checked against the PTX: declaring an extra parameter through the
//! untyped [`KernelBuilder::param`] (reachable through `DerefMut`) makes `finish` fail, and
//! [`TypedKernel::from_module`] types a module built elsewhere only if its parameter list
//! matches.

use crate::error::BuildError;
use crate::kernel::{KernelBuilder, KernelParam};
use crate::ty::{GlobalPtr, PtxType};
use ptx::{Module, Ty};
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

/// A tuple of [`KernelParam`] marker types: a kernel signature.
pub trait ParamList {
    /// The `.param` types in order.
    fn param_tys() -> Vec<Ty>;
}

/// Appends one parameter marker to a signature tuple: `(A, B)` + `C` = `(A, B, C)`.
pub trait Append<Q> {
    type Out: ParamList;
}

macro_rules! tuples {
    ($( ($($p:ident),*) + $q:ident; )*) => {$(
        impl<$($p: KernelParam,)*> ParamList for ($($p,)*) {
            fn param_tys() -> Vec<Ty> {
                vec![$($p::PARAM_TY),*]
            }
        }
        impl<$($p: KernelParam,)* $q: KernelParam> Append<$q> for ($($p,)*) {
            type Out = ($($p,)* $q,);
        }
    )*};
}
tuples! {
    () + A;
    (A) + B;
    (A, B) + C;
    (A, B, C) + D;
    (A, B, C, D) + E;
    (A, B, C, D, E) + F;
    (A, B, C, D, E, F) + G;
    (A, B, C, D, E, F, G) + H;
    (A, B, C, D, E, F, G, H) + I;
    (A, B, C, D, E, F, G, H, I) + J;
    (A, B, C, D, E, F, G, H, I, J) + K;
    (A, B, C, D, E, F, G, H, I, J, K) + L;
    (A, B, C, D, E, F, G, H, I, J, K, L) + M;
    (A, B, C, D, E, F, G, H, I, J, K, L, M) + N;
    (A, B, C, D, E, F, G, H, I, J, K, L, M, N) + O;
    (A, B, C, D, E, F, G, H, I, J, K, L, M, N, O) + P;
}
// The 16-parameter tuple is reachable by appending to a 15-tuple, so it needs a signature too.
impl<A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P> ParamList
    for (A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P)
where
    A: KernelParam,
    B: KernelParam,
    C: KernelParam,
    D: KernelParam,
    E: KernelParam,
    F: KernelParam,
    G: KernelParam,
    H: KernelParam,
    I: KernelParam,
    J: KernelParam,
    K: KernelParam,
    L: KernelParam,
    M: KernelParam,
    N: KernelParam,
    O: KernelParam,
    P: KernelParam,
{
    fn param_tys() -> Vec<Ty> {
        vec![
            A::PARAM_TY,
            B::PARAM_TY,
            C::PARAM_TY,
            D::PARAM_TY,
            E::PARAM_TY,
            F::PARAM_TY,
            G::PARAM_TY,
            H::PARAM_TY,
            I::PARAM_TY,
            J::PARAM_TY,
            K::PARAM_TY,
            L::PARAM_TY,
            M::PARAM_TY,
            N::PARAM_TY,
            O::PARAM_TY,
            P::PARAM_TY,
        ]
    }
}

/// A [`KernelBuilder`] that records its parameters in its type (see the module docs).
/// Everything but parameter declaration goes through `Deref`/`DerefMut` to the builder.
pub struct TypedBuilder<P> {
    k: KernelBuilder,
    _p: PhantomData<fn() -> P>,
}

impl KernelBuilder {
    /// This builder as a [`TypedBuilder`]: declare parameters with [`TypedBuilder::param`] so
    /// that [`TypedBuilder::finish`] returns a [`TypedKernel`] of that signature.
    pub fn typed(self) -> TypedBuilder<()> {
        TypedBuilder {
            k: self,
            _p: PhantomData,
        }
    }
}

impl<P: ParamList> TypedBuilder<P> {
    /// Declares parameter `name` of kind `Q` (as [`KernelBuilder::param`]) and appends `Q` to
    /// the signature.
    #[track_caller]
    pub fn param<Q: KernelParam>(mut self, name: &str) -> (TypedBuilder<P::Out>, Q::Handle)
    where
        P: Append<Q>,
    {
        let h = self.k.param::<Q>(name);
        (self.retype(), h)
    }

    /// A global pointer parameter with an explicit `.align` (as
    /// [`KernelBuilder::param_ptr_aligned`]); the signature records `GlobalPtr<T>`.
    #[track_caller]
    pub fn param_ptr_aligned<T: PtxType>(
        mut self,
        name: &str,
        align: u32,
    ) -> (TypedBuilder<P::Out>, GlobalPtr<T>)
    where
        P: Append<GlobalPtr<T>>,
    {
        let h = self.k.param_ptr_aligned::<T>(name, align);
        (self.retype(), h)
    }

    fn retype<Q>(self) -> TypedBuilder<Q> {
        TypedBuilder {
            k: self.k,
            _p: PhantomData,
        }
    }

    /// The untyped builder (the signature is forgotten).
    pub fn into_inner(self) -> KernelBuilder {
        self.k
    }

    /// Finishes the kernel into its own module, typed by the declared signature. Fails like
    /// [`KernelBuilder::finish`], and with [`BuildError::Signature`] when parameters were
    /// declared around the typed API.
    pub fn finish(self) -> Result<TypedKernel<P>, BuildError> {
        let name = self.k.name().to_string();
        let m = self.k.finish()?;
        TypedKernel::from_module(m, &name)
    }
}

impl<P> Deref for TypedBuilder<P> {
    type Target = KernelBuilder;
    fn deref(&self) -> &KernelBuilder {
        &self.k
    }
}
impl<P> DerefMut for TypedBuilder<P> {
    fn deref_mut(&mut self) -> &mut KernelBuilder {
        &mut self.k
    }
}

/// A finished kernel whose parameter list is the signature `P` (a tuple of [`KernelParam`]
/// markers such as `(GlobalPtr<f32>, f32, u32)`): its module plus the entry's name.
#[derive(Clone, Debug)]
pub struct TypedKernel<P> {
    module: Module,
    name: String,
    _p: PhantomData<fn() -> P>,
}

impl<P: ParamList> TypedKernel<P> {
    /// Types entry `name` of `module` as signature `P`; fails with [`BuildError::Signature`]
    /// naming the first parameter whose `.param` type differs (or the count).
    pub fn from_module(module: Module, name: &str) -> Result<TypedKernel<P>, BuildError> {
        let f = module
            .entries()
            .find(|f| f.name == name)
            .ok_or_else(|| BuildError::Signature(format!("no kernel `{name}` in the module")))?;
        check_signature(name, &f.params, &P::param_tys())?;
        Ok(TypedKernel {
            module,
            name: name.to_string(),
            _p: PhantomData,
        })
    }
}

impl<P> TypedKernel<P> {
    /// The kernel's (entry's) name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The module holding the kernel.
    pub fn module(&self) -> &Module {
        &self.module
    }
    /// The module, dropping the signature.
    pub fn into_module(self) -> Module {
        self.module
    }
}

/// Checks a parameter list against signature types.
pub fn check_signature(kernel: &str, params: &[ptx::Param], tys: &[Ty]) -> Result<(), BuildError> {
    if params.len() != tys.len() {
        return Err(BuildError::Signature(format!(
            "kernel `{kernel}` declares {} parameters, the signature has {}",
            params.len(),
            tys.len()
        )));
    }
    for (i, (p, &t)) in params.iter().zip(tys).enumerate() {
        if p.ty != t || p.array.is_some() {
            let arr = p.array.map(|n| format!("[{n}]")).unwrap_or_default();
            return Err(BuildError::Signature(format!(
                "kernel `{kernel}` parameter {i} (`{}`) is .{}{arr}, the signature says .{t}",
                p.name, p.ty
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::*;

    #[test]
    fn signature_is_built_up_and_checked() {
        let k = KernelBuilder::new("k", Target::sm80()).typed();
        let (k, _x) = k.param::<GlobalPtr<f32>>("x");
        let (k, _a) = k.param_ptr_aligned::<u32>("a", 16);
        let (mut k, _n) = k.param::<i32>("n");
        k.ret();
        let t: TypedKernel<(GlobalPtr<f32>, GlobalPtr<u32>, i32)> = k.finish().unwrap();
        let tys: Vec<_> = t
            .module()
            .entries()
            .next()
            .unwrap()
            .params
            .iter()
            .map(|p| p.ty)
            .collect();
        assert_eq!(tys, vec![ptx::Ty::U64, ptx::Ty::U64, ptx::Ty::S32]);
    }

    #[test]
    fn parameters_declared_around_the_typed_api_are_an_error() {
        let k = KernelBuilder::new("k", Target::sm80()).typed();
        let (mut k, _x) = k.param::<GlobalPtr<f32>>("x");
        let _n = (*k).param::<u32>("n"); // untyped, through DerefMut
        let e = k.finish().unwrap_err();
        assert!(matches!(e, BuildError::Signature(_)), "{e}");
        assert!(e.to_string().contains("2 parameters"), "{e}");
    }
}
