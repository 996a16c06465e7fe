//! `builder`: write GPU kernels in Rust at PTX level.
//!
//! A [`KernelBuilder`] appends one PTX instruction per call and hands back typed, `Copy`
//! register handles ([`Reg<T>`]); registers are allocated and declared automatically
//! (`.reg .b32 %r<N>;` ...). Types are checked by Rust: `k.add(x_f32, y_u32)` does not compile,
//! `k.fma` only takes floats, `k.shfl_bfly` only 32-bit values. Mistakes Rust cannot see (an
//! unknown register in raw PTX, an instruction the target lacks, `.v3` loads) are reported by
//! [`KernelBuilder::finish`] as a [`BuildError`].
//!
//! ```
//! use builder::*;
//! fn vector_add(t: Target) -> Result<ptx::Module, BuildError> {
//!     let mut k = KernelBuilder::new("vector_add", t);
//!     let (a, b) = (k.param::<GlobalPtr<f32>>("a"), k.param::<GlobalPtr<f32>>("b"));
//!     let out = k.param::<GlobalPtr<f32>>("out");
//!     let n = k.param::<u32>("n");
//!     let i = k.global_index_x();
//!     let p = k.lt(i, n);
//!     k.if_(p, |k| {
//!         let x = k.ld(a.offset(i));
//!         let y = k.ld(b.offset(i));
//!         let s = k.add(x, y);
//!         k.st(out.offset(i), s);
//!     });
//!     k.finish()
//! }
//! let m = vector_add(Target::sm80()).unwrap();
//! assert_eq!(ptx::parse(&ptx::print(&m)).unwrap(), m);
//! ```
//!
//! Layout:
//! - [`ty`]: register classes, [`PtxType`] and its marker types ([`Pred`], [`Bf16x2`],
//!   [`E4m3x2`], ...), [`Reg`], [`Src`] (registers or Rust immediates), state spaces and typed
//!   pointers ([`GlobalPtr`], [`SharedPtr`]) with lazy indexed addresses ([`Addr`]);
//! - [`kernel`]: [`Target`], [`KernelBuilder`] (params, shared memory, attributes, control flow,
//!   raw PTX, finish) and [`ModuleBuilder`];
//! - [`ops`]: the instruction families (arithmetic, bits, setp/selp, cvt, ld/st, atomics,
//!   barriers/fences, warp-level, mma/ldmatrix/wgmma, cp.async(.bulk), mbarrier, cluster);
//! - [`hopper`]: warpgroup roles with register budgets, wgmma descriptors and the FP8 form,
//!   swizzled shared tiles, tensor-map parameters / TMA, the mbarrier pipeline state;
//! - [`mod@expr`]: [`ExprScope`] / [`Ex`], operators on registers and immediates emitting the
//!   same one instruction per operation as the methods;
//! - [`typed`]: [`TypedBuilder`] / [`TypedKernel`], kernels whose parameter list is a Rust type
//!   (launched with `runtime::Stream::launch_typed`);
//! - [`examples`]: `vector_add`, `warp_reduce_sum`, `transpose_tiled`.

pub mod error;
pub mod examples;
pub mod expr;
pub mod hopper;
pub mod kernel;
pub mod ops;
pub mod ty;
pub mod typed;

pub use error::BuildError;
pub use expr::{Ex, ExPtr, ExprScope};
pub use hopper::{
    Fp8, MatrixDesc, PipeState, Pipeline, RegBudget, SmemLayout, SmemTile, Swizzle as SmemSwizzle,
};
pub use kernel::{KernelBuilder, KernelParam, ModuleBuilder, RetSlot, Target};
pub use ops::*;
/// The PTX IR module type every builder produces (`ptx::Module`), under a name that does not
/// clash with `runtime::Module` (a module loaded on a device).
pub use ptx::Module as PtxModule;
pub use ptx::SReg;
pub use ty::*;
pub use typed::{Append, ParamList, TypedBuilder, TypedKernel};
