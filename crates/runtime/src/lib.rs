//! `runtime`: the one API kernels, the kernel library and tools program against, with backends
//! behind it (the CPU emulator, and the CUDA driver).
//!
//! Shape (after cudarc): [`Device`] (by backend and index) -> [`Buffer<T>`] typed device memory,
//! [`Module`] loaded from IR or PTX text -> [`Function`]s, [`Stream`]s that run launches in order
//! (concurrently with other streams), [`Event`]s that record completion and time. Launches take a
//! [`LaunchConfig`] (grid, block, dynamic shared memory, cluster, SM budget) and [`Arg`]s checked
//! against the kernel's parameter list. Errors are typed ([`RuntimeError`]), never panics.
//!
//! Emulated devices share one unified address space, so `buffer.peer_ptr(&other)` is a pointer a
//! kernel on `other` can dereference — the P2P pattern of expert-parallel communication kernels.
//! Across processes (one rank each), [`Buffer::ipc_handle`] / [`Device::open_ipc`] map a peer's
//! buffer at the same address: POSIX shared memory on the emulator (each process allocates in
//! its own address slot), CUDA IPC on GPUs (`docs/SCALE.md`, "Intra-node memory (IPC)").

pub mod args;
pub mod cancel;
mod cuda;
mod device;
mod graph;
mod hostview;
mod ipc;
pub mod limits;
pub mod module_cache;
mod multicast;
mod partition;
pub mod profile;
pub mod runner;
mod storage;
mod stream;
pub mod tensor_map;
mod typed;

pub use cuda::module::JitOptions;
pub use device::{
    Backend, Buffer, Device, DeviceInfo, DeviceProps, Function, Module, Pod, SmPartition,
};
pub use graph::Graph;
pub use hostview::HostView;
pub use ipc::IpcHandle;
pub use multicast::Multicast;
pub use partition::{sms_used, Partition, PartitionKind};
pub use stream::{Event, LaunchConfig, Stream};
pub use tensor_map::{Im2col, TensorMap};
pub use typed::{ArgFor, HostElem, LaunchArgs, RawPtr, TypedFunction};

/// `half` (the `f16`/`bf16` host types of [`Buffer`]s and [`Arg`]s), re-exported so dependents
/// need not add it themselves.
pub use half;
/// The PTX IR module (what the builder produces and [`Module::load`] takes), named apart from
/// [`Module`], a module loaded on a device.
pub use ptx::Module as PtxModule;

/// Runtime errors.
#[derive(Clone, Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{0}")]
    Emu(#[from] emu::EmuError),
    #[error("PTX parse error: {0}")]
    Parse(#[from] ptx::ParseError),
    #[error("CUDA backend unavailable: {0}")]
    CudaUnavailable(String),
    #[error("CUDA error: {0}")]
    Cuda(String),
    #[error("no device {0}")]
    NoDevice(String),
    #[error("kernel `{kernel}`: {msg}")]
    Args { kernel: String, msg: String },
    #[error("buffer: {0}")]
    Buffer(String),
    /// An IPC handle could not be parsed, exported or opened; `handle` says which (backend,
    /// device, exporting pid and, on the emulator, the shared segment and address).
    #[error("IPC handle {handle}: {msg}")]
    Ipc { handle: String, msg: String },
    #[error("launch: {0}")]
    Launch(String),
    #[error("tensor map: {0}")]
    TensorMap(String),
    /// A multicast object call ([`Multicast`]) refused; `field` names the offending argument
    /// (`size`, `mc_offset`, `buf_offset`, `num_devices`, `device`, `backend`).
    #[error("multicast {field}: {msg}")]
    Multicast { field: &'static str, msg: String },
}

pub type Result<T> = std::result::Result<T, RuntimeError>;

// The Rust snippets of the README and docs/BUILDER.md compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
#[cfg(doctest)]
#[doc = include_str!("../../../docs/BUILDER.md")]
struct BuilderDocDoctests;

/// A kernel argument, passed by value. Launches check each argument's kind against the PTX
/// parameter it is passed for ([`Arg::fits`]): integers must match the parameter's signedness
/// and width exactly (`.u32` takes [`Arg::U32`], never an `i32`), floats their type; untyped
/// `.bN` parameters take any value of their width.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F16(half::f16),
    Bf16(half::bf16),
    F32(f32),
    F64(f64),
    /// A device pointer.
    Ptr(u64),
}

impl Arg {
    pub fn size(&self) -> usize {
        match self {
            Arg::U8(_) | Arg::I8(_) => 1,
            Arg::U16(_) | Arg::I16(_) | Arg::F16(_) | Arg::Bf16(_) => 2,
            Arg::U32(_) | Arg::I32(_) | Arg::F32(_) => 4,
            _ => 8,
        }
    }
    pub fn bytes(&self) -> Vec<u8> {
        match *self {
            Arg::U8(v) => vec![v],
            Arg::I8(v) => v.to_le_bytes().to_vec(),
            Arg::U16(v) => v.to_le_bytes().to_vec(),
            Arg::I16(v) => v.to_le_bytes().to_vec(),
            Arg::U32(v) => v.to_le_bytes().to_vec(),
            Arg::I32(v) => v.to_le_bytes().to_vec(),
            Arg::U64(v) | Arg::Ptr(v) => v.to_le_bytes().to_vec(),
            Arg::I64(v) => v.to_le_bytes().to_vec(),
            Arg::F16(v) => v.to_le_bytes().to_vec(),
            Arg::Bf16(v) => v.to_le_bytes().to_vec(),
            Arg::F32(v) => v.to_le_bytes().to_vec(),
            Arg::F64(v) => v.to_le_bytes().to_vec(),
        }
    }
    /// The Rust name of the argument's kind (`u32`, `i32`, `pointer`, ...), for messages.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Arg::U8(_) => "u8",
            Arg::I8(_) => "i8",
            Arg::U16(_) => "u16",
            Arg::I16(_) => "i16",
            Arg::U32(_) => "u32",
            Arg::I32(_) => "i32",
            Arg::U64(_) => "u64",
            Arg::I64(_) => "i64",
            Arg::F16(_) => "f16",
            Arg::Bf16(_) => "bf16",
            Arg::F32(_) => "f32",
            Arg::F64(_) => "f64",
            Arg::Ptr(_) => "pointer",
        }
    }
    /// Whether this argument may be passed for a parameter of PTX type `ty` (scalar, not an
    /// array): unsigned integers for `.uN`, signed for `.sN`, `f32`/`f64`/`f16`/`bf16` for their
    /// own type, pointers and `u64` for `.u64`, any value of the right width for `.bN`, and
    /// unsigned integers for packed types (`.f16x2`, `.e4m3x4`, ...) given as bits.
    pub fn fits(&self, ty: ptx::Ty) -> bool {
        use ptx::{Ty, TyKind};
        if self.size() != ty.size() as usize {
            return false;
        }
        let unsigned = matches!(self, Arg::U8(_) | Arg::U16(_) | Arg::U32(_) | Arg::U64(_));
        match ty.kind() {
            TyKind::Bits => true,
            TyKind::Unsigned => unsigned || (ty == Ty::U64 && matches!(self, Arg::Ptr(_))),
            TyKind::Signed => matches!(self, Arg::I8(_) | Arg::I16(_) | Arg::I32(_) | Arg::I64(_)),
            TyKind::Float => match ty {
                Ty::F16 => matches!(self, Arg::F16(_)),
                Ty::Bf16 => matches!(self, Arg::Bf16(_)),
                Ty::F32 => matches!(self, Arg::F32(_)),
                Ty::F64 => matches!(self, Arg::F64(_)),
                _ => unsigned,
            },
            TyKind::Pred | TyKind::Opaque => false,
        }
    }
}

macro_rules! arg_from {
    ($($t:ty => $v:ident),*) => { $(impl From<$t> for Arg { fn from(x: $t) -> Arg { Arg::$v(x) } })* };
}
arg_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64, i64 => I64, half::f16 => F16, half::bf16 => Bf16, f32 => F32, f64 => F64);

impl<T: Pod> From<&Buffer<T>> for Arg {
    fn from(b: &Buffer<T>) -> Arg {
        Arg::Ptr(b.device_ptr())
    }
}
impl<T: Pod> From<&mut Buffer<T>> for Arg {
    fn from(b: &mut Buffer<T>) -> Arg {
        Arg::Ptr(b.device_ptr())
    }
}

/// Builds an argument list: `args![&a, &b, n]`.
#[macro_export]
macro_rules! args {
    // A `Vec` (callers may extend it) built without `vec!`, so borrowing it as a slice at a
    // call site is not flagged as a needless allocation.
    ($($x:expr),* $(,)?) => { ::std::vec::Vec::<$crate::Arg>::from([$($crate::Arg::from($x)),*]) };
}
