//! Typed launches: a [`builder::TypedKernel<P>`] loads into a [`TypedFunction<P>`], and
//! [`crate::Stream::launch_typed`] takes its arguments as a tuple whose element types the Rust
//! compiler checks against the signature `P`: a `&Buffer<f32>` for a `GlobalPtr<f32>`, a `u32`
//! for a `u32` parameter, in the right number.
//!
//! ```
//! use builder::*;
//! use runtime::{Device, LaunchConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let k = KernelBuilder::new("saxpy", Target::sm80()).typed();
//! let (k, x) = k.param::<GlobalPtr<f32>>("x");
//! let (k, y) = k.param::<GlobalPtr<f32>>("y");
//! let (k, a) = k.param::<f32>("a");
//! let (mut k, n) = k.param::<u32>("n");
//! let i = k.global_index_x();
//! let p = k.lt(i, n);
//! k.if_(p, |k| {
//!     let (xv, yv) = (k.ld(x.offset(i)), k.ld(y.offset(i)));
//!     let r = k.fma(a, xv, yv);
//!     k.st(y.offset(i), r);
//! });
//! let saxpy = k.finish()?;
//!
//! let dev = Device::emu(0);
//! let f = dev.load_kernel(&saxpy)?;
//! let (xs, ys) = (vec![1.0f32, 2.0, 3.0], vec![10.0f32, 20.0, 30.0]);
//! let (xb, yb) = (dev.upload(&xs)?, dev.upload(&ys)?);
//! let s = dev.default_stream();
//! s.launch_typed(&f, &LaunchConfig::linear(1, 32), (&xb, &yb, 2.0f32, 3u32))?;
//! assert_eq!(s.read(&yb)?, vec![12.0, 24.0, 36.0]);
//! # Ok(()) }
//! ```
//!
//! A wrong argument type does not compile (`i32` for the `u32` parameter):
//!
//! ```compile_fail,E0277
//! # use builder::*;
//! # use runtime::{Device, LaunchConfig};
//! # fn f(s: &runtime::Stream, f: &runtime::TypedFunction<(GlobalPtr<f32>, GlobalPtr<f32>, f32, u32)>,
//! #      xb: &runtime::Buffer<f32>, yb: &runtime::Buffer<f32>) -> runtime::Result<()> {
//! s.launch_typed(f, &LaunchConfig::linear(1, 32), (xb, yb, 2.0f32, 3i32))
//! # }
//! ```
//!
//! nor does a buffer of the wrong element type (`Buffer<u32>` for a `GlobalPtr<f32>`):
//!
//! ```compile_fail,E0277
//! # use builder::*;
//! # use runtime::{Device, LaunchConfig};
//! # fn f(s: &runtime::Stream, f: &runtime::TypedFunction<(GlobalPtr<f32>, GlobalPtr<f32>, f32, u32)>,
//! #      xb: &runtime::Buffer<u32>, yb: &runtime::Buffer<f32>) -> runtime::Result<()> {
//! s.launch_typed(f, &LaunchConfig::linear(1, 32), (xb, yb, 2.0f32, 3u32))
//! # }
//! ```
//!
//! nor a missing argument:
//!
//! ```compile_fail,E0277
//! # use builder::*;
//! # use runtime::{Device, LaunchConfig};
//! # fn f(s: &runtime::Stream, f: &runtime::TypedFunction<(GlobalPtr<f32>, GlobalPtr<f32>, f32, u32)>,
//! #      xb: &runtime::Buffer<f32>, yb: &runtime::Buffer<f32>) -> runtime::Result<()> {
//! s.launch_typed(f, &LaunchConfig::linear(1, 32), (xb, yb, 2.0f32))
//! # }
//! ```
//!
//! and the same call with the right types compiles:
//!
//! ```
//! # use builder::*;
//! # use runtime::{Device, LaunchConfig};
//! # fn f(s: &runtime::Stream, f: &runtime::TypedFunction<(GlobalPtr<f32>, GlobalPtr<f32>, f32, u32)>,
//! #      xb: &runtime::Buffer<f32>, yb: &runtime::Buffer<f32>) -> runtime::Result<()> {
//! s.launch_typed(f, &LaunchConfig::linear(1, 32), (xb, yb, 2.0f32, 3u32))
//! # }
//! ```

use crate::device::{Buffer, Device, Function, Module, Pod};
use crate::{Arg, Result, RuntimeError};
use builder::{KernelParam, ParamList, Ptr, PtxType, StateSpace, TypedKernel};
use std::marker::PhantomData;

/// A loaded kernel whose parameter list is the signature `P` (see the module docs).
#[derive(Clone)]
pub struct TypedFunction<P> {
    f: Function,
    _p: PhantomData<fn() -> P>,
}

impl<P> TypedFunction<P> {
    /// The untyped function (for [`crate::Stream::launch`] or graphs).
    pub fn function(&self) -> &Function {
        &self.f
    }
    pub fn name(&self) -> &str {
        &self.f.name
    }
}

impl Module {
    /// Entry `k.name()` of this module as a typed function (the module should be the one
    /// loaded from `k.module()`); fails naming the parameter when the signature differs.
    pub fn typed_function<P: ParamList>(&self, k: &TypedKernel<P>) -> Result<TypedFunction<P>> {
        let f = self.function(k.name())?;
        builder::typed::check_signature(&f.name, &f.params, &P::param_tys()).map_err(|e| {
            RuntimeError::Args {
                kernel: f.name.clone(),
                msg: e.to_string(),
            }
        })?;
        Ok(TypedFunction { f, _p: PhantomData })
    }
}

impl Device {
    /// Loads a typed kernel's module on this device and returns the kernel, ready for
    /// [`crate::Stream::launch_typed`].
    pub fn load_kernel<P: ParamList>(&self, k: &TypedKernel<P>) -> Result<TypedFunction<P>> {
        Module::load(self, k.module())?.typed_function(k)
    }
}

/// A host value that may be passed for a kernel parameter of marker type `P`.
pub trait ArgFor<P: KernelParam> {
    fn to_arg(&self) -> Arg;
}

/// `T` is the host representation of device element type `E` (`f32` of `f32`, `half::f16` of
/// `builder::F16`, `u32` of `builder::B32`, ...): a `&Buffer<T>` may be passed for a pointer
/// to `E`.
pub trait HostElem<E: PtxType>: Pod {}

macro_rules! host_elem {
    ($($h:ty => $e:ty),* $(,)?) => {$( impl HostElem<$e> for $h {} )*};
}
host_elem!(
    u8 => u8, i8 => i8, u16 => u16, i16 => i16, u32 => u32, i32 => i32, u64 => u64, i64 => i64,
    f32 => f32, f64 => f64, half::f16 => builder::F16, half::bf16 => builder::Bf16,
    u16 => builder::B16, u32 => builder::B32, u64 => builder::B64,
);

macro_rules! scalar_arg {
    ($($t:ty),*) => {$(
        impl ArgFor<$t> for $t {
            fn to_arg(&self) -> Arg { Arg::from(*self) }
        }
    )*};
}
scalar_arg!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);
impl ArgFor<builder::F16> for half::f16 {
    fn to_arg(&self) -> Arg {
        Arg::F16(*self)
    }
}
impl ArgFor<builder::Bf16> for half::bf16 {
    fn to_arg(&self) -> Arg {
        Arg::Bf16(*self)
    }
}

impl<E: PtxType, S: StateSpace, T: HostElem<E>> ArgFor<Ptr<E, S>> for &Buffer<T>
where
    Ptr<E, S>: KernelParam,
{
    fn to_arg(&self) -> Arg {
        Arg::Ptr(self.device_ptr())
    }
}
impl<E: PtxType, S: StateSpace, T: HostElem<E>> ArgFor<Ptr<E, S>> for &mut Buffer<T>
where
    Ptr<E, S>: KernelParam,
{
    fn to_arg(&self) -> Arg {
        Arg::Ptr(self.device_ptr())
    }
}

/// A raw device address for any pointer parameter: the explicit, unchecked escape (peer
/// pointers from [`Buffer::peer_ptr`], addresses inside a buffer, null).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawPtr(pub u64);

impl<E: PtxType, S: StateSpace> ArgFor<Ptr<E, S>> for RawPtr
where
    Ptr<E, S>: KernelParam,
{
    fn to_arg(&self) -> Arg {
        Arg::Ptr(self.0)
    }
}

/// A tuple of host arguments for signature `P`, one [`ArgFor`] per parameter.
pub trait LaunchArgs<P> {
    fn to_args(&self) -> Vec<Arg>;
}

macro_rules! launch_args {
    ($( ($($p:ident $a:ident $i:tt),*); )*) => {$(
        impl<$($p: KernelParam, $a: ArgFor<$p>,)*> LaunchArgs<($($p,)*)> for ($($a,)*) {
            fn to_args(&self) -> Vec<Arg> {
                vec![$(self.$i.to_arg()),*]
            }
        }
    )*};
}
launch_args! {
    ();
    (P0 A0 0);
    (P0 A0 0, P1 A1 1);
    (P0 A0 0, P1 A1 1, P2 A2 2);
    (P0 A0 0, P1 A1 1, P2 A2 2, P3 A3 3);
    (P0 A0 0, P1 A1 1, P2 A2 2, P3 A3 3, P4 A4 4);
    (P0 A0 0, P1 A1 1, P2 A2 2, P3 A3 3, P4 A4 4, P5 A5 5);
    (P0 A0 0, P1 A1 1, P2 A2 2, P3 A3 3, P4 A4 4, P5 A5 5, P6 A6 6);
    (P0 A0 0, P1 A1 1, P2 A2 2, P3 A3 3, P4 A4 4, P5 A5 5, P6 A6 6, P7 A7 7);
    (P0 A0 0, P1 A1 1, P2 A2 2, P3 A3 3, P4 A4 4, P5 A5 5, P6 A6 6, P7 A7 7, P8 A8 8);
    (P0 A0 0, P1 A1 1, P2 A2 2, P3 A3 3, P4 A4 4, P5 A5 5, P6 A6 6, P7 A7 7, P8 A8 8,
     P9 A9 9);
    (P0 A0 0, P1 A1 1, P2 A2 2, P3 A3 3, P4 A4 4, P5 A5 5, P6 A6 6, P7 A7 7, P8 A8 8,
     P9 A9 9, P10 A10 10);
    (P0 A0 0, P1 A1 1, P2 A2 2, P3 A3 3, P4 A4 4, P5 A5 5, P6 A6 6, P7 A7 7, P8 A8 8,
     P9 A9 9, P10 A10 10, P11 A11 11);
}

impl crate::Stream {
    /// Queues a launch of a typed kernel: `args` is a tuple with one value per parameter, each
    /// of the type the signature asks for (checked at compile time; see the module docs).
    /// Asynchronous like [`crate::Stream::launch`]: errors of the run surface at the next
    /// synchronising call.
    pub fn launch_typed<P, A: LaunchArgs<P>>(
        &self,
        f: &TypedFunction<P>,
        cfg: &crate::LaunchConfig,
        args: A,
    ) -> Result<()> {
        self.launch(&f.f, cfg, &args.to_args())
    }
}
