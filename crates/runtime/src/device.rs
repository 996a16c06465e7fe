//! Devices, typed buffers, modules and functions.

use crate::args::{ArgError, ArgProblem};
use crate::storage::{EmuMem, EmuOrigin, Storage};
use crate::stream::Stream;
use crate::{Result, RuntimeError};
use emu::{GlobalMemory, LoadedModule};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, OnceLock};

/// Which implementation runs a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Backend {
    Emu,
    Cuda,
}

/// Static properties of a device.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DeviceProps {
    pub name: String,
    pub sms: u32,
    /// Compute capability (major*10 + minor) the device behaves as.
    pub sm_version: u32,
    pub max_shared_per_block: u32,
    pub total_memory: u64,
}

/// One line of `ptxforge devices`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DeviceInfo {
    pub backend: Backend,
    pub index: u32,
    pub props: DeviceProps,
}

/// A contiguous range of SMs a launch may occupy (the SM budget of communication kernels).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SmPartition {
    pub offset: u32,
    pub count: u32,
}

pub(crate) struct DeviceInner {
    pub backend: Backend,
    pub index: u32,
    pub props: DeviceProps,
    pub streams: Mutex<Vec<std::sync::Weak<crate::stream::StreamInner>>>,
    pub default_stream: OnceLock<Stream>,
    /// The CUDA context (CUDA devices only).
    pub cuda: Option<Arc<crate::cuda::Ctx>>,
    /// Emulator tensor-core numerics set with [`Device::set_numerics`] (None: the environment's
    /// `PTXFORGE_TC_NUMERICS`, else the kernel target's hardware model).
    pub numerics: Mutex<Option<emu::Numerics>>,
}

/// A device: an emulated GPU, or a real one through the CUDA driver.
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

/// The process-wide emulated global memory (one unified address space for all emulated
/// devices), configured from the environment on first use (`storage::configure_from_env`).
pub(crate) fn emu_memory() -> &'static GlobalMemory {
    static MEM: OnceLock<GlobalMemory> = OnceLock::new();
    MEM.get_or_init(|| {
        let m = GlobalMemory::new();
        let err = crate::storage::configure_from_env(&m).err();
        let _ = crate::storage::env_error().set(err);
        m
    })
}

/// [`emu_memory`], or the error its environment settings gave.
pub(crate) fn emu_memory_checked() -> Result<&'static GlobalMemory> {
    let m = emu_memory();
    match crate::storage::env_error().get() {
        Some(Some(e)) => Err(e.clone()),
        _ => Ok(m),
    }
}

fn emu_registry() -> &'static Mutex<HashMap<u32, Device>> {
    static REG: OnceLock<Mutex<HashMap<u32, Device>>> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Device {
    /// Emulated device `index` (created on first use; the same object afterwards). It behaves as
    /// an sm_90a part with 132 SMs.
    pub fn emu(index: u32) -> Device {
        let mut reg = emu_registry().lock().unwrap_or_else(|p| p.into_inner());
        reg.entry(index)
            .or_insert_with(|| Device {
                inner: Arc::new(DeviceInner {
                    backend: Backend::Emu,
                    index,
                    props: DeviceProps {
                        name: format!("ptxforge emulator #{index} (sm_90a, 132 SMs)"),
                        sms: 132,
                        sm_version: 90,
                        max_shared_per_block: emu::launch::max_shared_per_block(90),
                        total_memory: 1 << 36,
                    },
                    streams: Mutex::new(Vec::new()),
                    default_stream: OnceLock::new(),
                    cuda: None,
                    numerics: Mutex::new(None),
                }),
            })
            .clone()
    }

    /// CUDA device `index`, through libcuda loaded at run time (the same object on every call).
    /// Without a driver or GPU this is [`RuntimeError::CudaUnavailable`] saying why.
    pub fn cuda(index: u32) -> Result<Device> {
        static REG: OnceLock<Mutex<HashMap<u32, Device>>> = OnceLock::new();
        crate::cuda::driver()?;
        let mut reg = REG
            .get_or_init(|| Mutex::new(HashMap::new()))
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(d) = reg.get(&index) {
            return Ok(d.clone());
        }
        let (ctx, props) = crate::cuda::Ctx::open(index)?;
        let d = Device {
            inner: Arc::new(DeviceInner {
                backend: Backend::Cuda,
                index,
                props,
                streams: Mutex::new(Vec::new()),
                default_stream: OnceLock::new(),
                cuda: Some(ctx),
                numerics: Mutex::new(None),
            }),
        };
        reg.insert(index, d.clone());
        Ok(d)
    }

    /// Number of CUDA devices (0 when there is no driver or GPU).
    pub fn cuda_count() -> u32 {
        crate::cuda::driver()
            .map(|d| d.devices.max(0) as u32)
            .unwrap_or(0)
    }

    pub(crate) fn cuda_ctx(&self) -> Option<&Arc<crate::cuda::Ctx>> {
        self.inner.cuda.as_ref()
    }

    /// Parses `emu`, `emu:3`, `cuda`, `cuda:1`.
    pub fn from_name(s: &str) -> Result<Device> {
        let (kind, idx) = match s.split_once(':') {
            Some((k, i)) => (
                k,
                i.parse::<u32>()
                    .map_err(|_| RuntimeError::NoDevice(s.to_string()))?,
            ),
            None => (s, 0),
        };
        match kind {
            "emu" => Ok(Device::emu(idx)),
            "cuda" => Device::cuda(idx),
            _ => Err(RuntimeError::NoDevice(format!(
                "`{s}` (use emu[:N] or cuda[:N])"
            ))),
        }
    }

    /// Devices available in this process: emulated device 0 always, CUDA devices when a driver
    /// is present. The second element explains why CUDA is absent, if it is.
    pub fn list() -> (Vec<DeviceInfo>, Option<String>) {
        let d = Device::emu(0);
        let mut v = vec![DeviceInfo {
            backend: Backend::Emu,
            index: 0,
            props: d.props().clone(),
        }];
        let mut why = None;
        match crate::cuda::driver() {
            Ok(drv) => {
                for i in 0..drv.devices.max(0) as u32 {
                    match Device::cuda(i) {
                        Ok(c) => v.push(DeviceInfo {
                            backend: Backend::Cuda,
                            index: i,
                            props: c.props().clone(),
                        }),
                        Err(e) => why = Some(e.to_string()),
                    }
                }
            }
            Err(e) => why = Some(e.to_string()),
        }
        (v, why)
    }

    pub fn backend(&self) -> Backend {
        self.inner.backend
    }
    pub fn index(&self) -> u32 {
        self.inner.index
    }
    pub fn props(&self) -> &DeviceProps {
        &self.inner.props
    }
    pub fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Emulator: the tensor-core numerics of later launches on this device that do not set
    /// [`crate::LaunchConfig::numerics`] (`None`: `PTXFORGE_TC_NUMERICS`, else the hardware model
    /// of the kernel's target). Emulated devices are process-wide, so this affects every user of
    /// the device. Real GPUs ignore it.
    pub fn set_numerics(&self, n: Option<emu::Numerics>) {
        *self
            .inner
            .numerics
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = n;
    }

    /// The numerics set with [`Device::set_numerics`], if any.
    pub fn numerics(&self) -> Option<emu::Numerics> {
        *self
            .inner
            .numerics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Allocates `len` elements (zeroed). On the emulator the memory is a shared segment other
    /// processes can open when the process's default says so (`PTXFORGE_EMU_SHM`, on in a
    /// multi-process job; see [`Device::alloc_shared`]).
    pub fn alloc<T: Pod>(&self, len: usize) -> Result<Buffer<T>> {
        self.alloc_with::<T>(len, false)
    }

    /// Allocates `len` elements (zeroed) that another process can map from
    /// [`Buffer::ipc_handle`]: on the emulator a POSIX shared-memory segment, on CUDA the same
    /// as [`Device::alloc`] (every `cuMemAlloc` allocation is IPC-exportable).
    pub fn alloc_shared<T: Pod>(&self, len: usize) -> Result<Buffer<T>> {
        self.alloc_with::<T>(len, true)
    }

    fn alloc_with<T: Pod>(&self, len: usize, shared: bool) -> Result<Buffer<T>> {
        let bytes = len * T::SIZE;
        let mem = match &self.inner.cuda {
            Some(ctx) => Storage::Cuda(crate::cuda::memory::DevMem::alloc(ctx, bytes)?),
            None => {
                let mem = emu_memory_checked()?;
                let alloc = if shared {
                    mem.alloc_shared(bytes as u64, self.inner.index)?
                } else {
                    mem.alloc(bytes as u64, self.inner.index)?
                };
                // zero-filled by contract (cuMemsetD8 on CUDA): written, for initcheck
                alloc.mark_written(0, bytes as u64);
                Storage::Emu(EmuMem {
                    alloc,
                    origin: EmuOrigin::Owned,
                })
            }
        };
        Ok(Buffer {
            device: self.clone(),
            mem,
            len,
            _t: PhantomData,
        })
    }

    /// Allocates and fills from host data.
    pub fn upload<T: Pod>(&self, data: &[T]) -> Result<Buffer<T>> {
        let b = self.alloc::<T>(data.len())?;
        b.copy_from_host(data)?;
        Ok(b)
    }

    /// The device's default stream.
    pub fn default_stream(&self) -> Stream {
        self.inner
            .default_stream
            .get_or_init(|| Stream::new(self, 0))
            .clone()
    }

    /// A new stream with scheduling priority `priority`. The argument is a **priority, not a
    /// stream number**: every call creates a new stream; `0` is the normal priority and higher
    /// values are favoured (CUDA: mapped to `-priority`, clamped to the context's stream
    /// priority range, so 1 or more is "high" on current GPUs; the emulator records it but
    /// runs every stream on its own host thread). Same as [`Device::stream_with_priority`].
    pub fn stream(&self, priority: i32) -> Stream {
        Stream::new(self, priority)
    }

    /// A new stream of normal priority (0).
    pub fn new_stream(&self) -> Stream {
        Stream::new(self, 0)
    }

    /// A new stream with scheduling priority `priority` (0 normal, higher favoured; see
    /// [`Device::stream`]).
    pub fn stream_with_priority(&self, priority: i32) -> Stream {
        Stream::new(self, priority)
    }

    fn live_streams(&self) -> Vec<Arc<crate::stream::StreamInner>> {
        let mut g = self.inner.streams.lock().unwrap_or_else(|p| p.into_inner());
        g.retain(|w| w.strong_count() > 0);
        g.iter().filter_map(|w| w.upgrade()).collect()
    }

    /// Waits for all work queued on this device's streams without consuming their errors
    /// (host copies use this; errors belong to the stream that ran the failing launch).
    /// CUDA: every live stream is synchronised, including partitions' green-context streams,
    /// which the primary context's `cuCtxSynchronize` (in the copy itself) does not cover.
    pub(crate) fn quiesce(&self) {
        for s in self.live_streams() {
            let _ = crate::stream::wait_inner(&s, false);
            if let Some(Ok(cs)) = &s.cuda {
                let _ = cs.synchronize();
            }
        }
    }

    /// Waits for all work queued on this device's streams (CUDA: each stream, green-context
    /// ones included, then the primary context). Returns the first launch error.
    pub fn synchronize(&self) -> Result<()> {
        let mut first = Ok(());
        for s in self.live_streams() {
            let mut r = crate::stream::sync_inner(&s);
            if let (Ok(()), Some(Ok(cs))) = (&r, &s.cuda) {
                r = cs.synchronize();
            }
            if first.is_ok() {
                first = r;
            }
        }
        if let (Ok(()), Some(ctx)) = (&first, self.cuda_ctx()) {
            first = ctx.synchronize();
        }
        first
    }
}

/// Plain data that can live in device memory.
pub trait Pod: Copy + Send + Sync + 'static {
    const SIZE: usize;
    /// numpy-style dtype name.
    const DTYPE: &'static str;
    fn to_bytes(&self, out: &mut Vec<u8>);
    fn from_bytes(b: &[u8]) -> Self;
}

macro_rules! pod {
    ($($t:ty, $d:literal);*) => {$(
        impl Pod for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            const DTYPE: &'static str = $d;
            fn to_bytes(&self, out: &mut Vec<u8>) { out.extend_from_slice(&self.to_le_bytes()) }
            fn from_bytes(b: &[u8]) -> Self { let mut a = [0u8; std::mem::size_of::<$t>()]; a.copy_from_slice(b); <$t>::from_le_bytes(a) }
        }
    )*};
}
pod!(u8, "u8"; i8, "i8"; u16, "u16"; i16, "i16"; u32, "u32"; i32, "i32"; u64, "u64"; i64, "i64"; f32, "f32"; f64, "f64"; half::f16, "f16"; half::bf16, "bf16");

/// Typed device memory.
pub struct Buffer<T: Pod> {
    pub(crate) device: Device,
    pub(crate) mem: Storage,
    pub(crate) len: usize,
    pub(crate) _t: PhantomData<T>,
}

impl<T: Pod> Buffer<T> {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// The emulator allocation behind this buffer (None on the CUDA backend).
    pub(crate) fn emu_alloc(&self) -> Option<&Arc<emu::Allocation>> {
        match &self.mem {
            Storage::Emu(m) => Some(&m.alloc),
            Storage::Cuda(_) => None,
        }
    }
    /// The device address (for kernel arguments).
    pub fn device_ptr(&self) -> u64 {
        self.mem.ptr()
    }
    /// A pointer to this buffer that kernels on `other` can use (peer access over NVLink on
    /// GPUs; the unified address space on the emulator).
    pub fn peer_ptr(&self, other: &Device) -> Result<u64> {
        if other.backend() != self.device.backend() {
            return Err(RuntimeError::Buffer("peer access across backends".into()));
        }
        if let (Some(mine), Some(theirs)) = (self.device.cuda_ctx(), other.cuda_ctx()) {
            // Unified virtual addressing: the same address, once `other` may access our memory.
            theirs.enable_peer_access(mine)?;
        }
        Ok(self.mem.ptr())
    }
    /// Copies host data in (waits for queued work on the device first).
    pub fn copy_from_host(&self, data: &[T]) -> Result<()> {
        if data.len() > self.len {
            return Err(RuntimeError::Buffer(format!(
                "copy of {} elements into a buffer of {}",
                data.len(),
                self.len
            )));
        }
        self.device.quiesce();
        let mut bytes = Vec::with_capacity(data.len() * T::SIZE);
        for x in data {
            x.to_bytes(&mut bytes);
        }
        self.mem.write(0, &bytes)
    }
    /// Copies the whole buffer out (waits for queued work on the device first).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.device.quiesce();
        let mut bytes = vec![0u8; self.len * T::SIZE];
        self.mem.read(0, &mut bytes)?;
        Ok(bytes.chunks_exact(T::SIZE).map(T::from_bytes).collect())
    }
    /// Raw bytes of the buffer.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.device.quiesce();
        let mut bytes = vec![0u8; self.len * T::SIZE];
        self.mem.read(0, &mut bytes)?;
        Ok(bytes)
    }
    /// Copies raw bytes in.
    pub fn copy_from_bytes(&self, data: &[u8]) -> Result<()> {
        if data.len() > self.len * T::SIZE {
            return Err(RuntimeError::Buffer("too many bytes for the buffer".into()));
        }
        self.device.quiesce();
        self.mem.write(0, data)
    }
    /// Sets every element to `v`.
    pub fn fill(&self, v: T) -> Result<()> {
        self.device.quiesce();
        let mut pat = Vec::new();
        v.to_bytes(&mut pat);
        self.mem.fill(self.len * T::SIZE, &pat)
    }
}

/// A module loaded on a device.
#[derive(Clone)]
pub struct Module {
    pub(crate) device: Device,
    pub(crate) loaded: Arc<LoadedModule>,
    /// The module loaded through the driver (CUDA devices).
    pub(crate) cuda: Option<Arc<crate::cuda::module::CuModule>>,
}

impl Module {
    /// Loads a module from IR.
    pub fn load(device: &Device, module: &ptx::Module) -> Result<Module> {
        if device.cuda_ctx().is_some() {
            return Module::load_ptx(device, &ptx::print(module));
        }
        let loaded = LoadedModule::load(emu_memory(), module.clone(), device.index())?;
        Ok(Module {
            device: device.clone(),
            loaded: Arc::new(loaded),
            cuda: None,
        })
    }
    /// Loads a module from PTX text.
    pub fn load_ptx(device: &Device, text: &str) -> Result<Module> {
        Module::load_ptx_with(device, text, &crate::JitOptions::default())
    }
    /// Loads PTX text with JIT options (CUDA: max registers, optimisation level, target, cubin
    /// cache; JIT errors name the PTX line). The emulator ignores the options.
    pub fn load_ptx_with(device: &Device, text: &str, opts: &crate::JitOptions) -> Result<Module> {
        let m = ptx::parse(text)?;
        let Some(ctx) = device.cuda_ctx() else {
            return Module::load(device, &m);
        };
        let cm =
            crate::cuda::module::CuModule::load_ptx(ctx, device.props().sm_version, text, opts)?;
        Module::with_cuda(device, m, cm)
    }
    /// Loads a cubin assembled offline (e.g. `ptx::ptxas::assemble`) for the kernels of `ir`.
    /// On the emulator the IR runs instead.
    pub fn load_cubin(device: &Device, ir: &ptx::Module, cubin: &[u8]) -> Result<Module> {
        let Some(ctx) = device.cuda_ctx() else {
            return Module::load(device, ir);
        };
        let cm = crate::cuda::module::CuModule::load_cubin(ctx, cubin)?;
        Module::with_cuda(device, ir.clone(), cm)
    }
    fn with_cuda(
        device: &Device,
        ir: ptx::Module,
        cm: crate::cuda::module::CuModule,
    ) -> Result<Module> {
        // The IR (parameter lists) lives in an emulator module; its globals are never touched.
        let loaded = LoadedModule::load(emu_memory(), ir, device.index())?;
        Ok(Module {
            device: device.clone(),
            loaded: Arc::new(loaded),
            cuda: Some(Arc::new(cm)),
        })
    }
    /// The driver JIT's info log (registers, spills) when this module was compiled on CUDA.
    pub fn jit_log(&self) -> Option<&str> {
        self.cuda.as_ref().map(|c| c.info_log.as_str())
    }
    pub fn ir(&self) -> &ptx::Module {
        &self.loaded.module
    }
    /// Looks a kernel up by name.
    pub fn function(&self, name: &str) -> Result<Function> {
        let f = self
            .loaded
            .module
            .entries()
            .find(|f| f.name == name)
            .ok_or_else(|| RuntimeError::Args {
                kernel: name.to_string(),
                msg: "no such kernel in the module".into(),
            })?;
        Ok(Function {
            module: self.clone(),
            name: name.to_string(),
            params: f.params.clone(),
        })
    }
}

/// A kernel ready to launch.
#[derive(Clone)]
pub struct Function {
    pub(crate) module: Module,
    pub name: String,
    /// Parameters in launch order (from the IR).
    pub params: Vec<ptx::Param>,
}

impl Function {
    /// Checks arguments against the parameter list and lays them out as the parameter buffer.
    pub fn pack_args(&self, args: &[crate::Arg]) -> Result<Vec<u8>> {
        self.check_args(args)?;
        let mut buf = Vec::new();
        for (a, p) in args.iter().zip(&self.params) {
            let align = p.alignment().max(1) as usize;
            while buf.len() % align != 0 {
                buf.push(0);
            }
            buf.extend_from_slice(&a.bytes());
        }
        Ok(buf)
    }

    /// Checks arguments against the parameter list: their count, each one's size, and its kind
    /// ([`crate::Arg::fits`]). [`crate::args::resolve`] checks arguments given without a
    /// definite type first.
    pub fn check_args(&self, args: &[crate::Arg]) -> std::result::Result<(), ArgError> {
        if args.len() != self.params.len() {
            return Err(ArgError::count(&self.name, args.len(), self.params.len()));
        }
        for (i, (a, p)) in args.iter().zip(&self.params).enumerate() {
            let size = p.size_bytes() as usize;
            if a.size() != size {
                return Err(ArgError::at(
                    &self.name,
                    i,
                    p,
                    ArgProblem::Size,
                    format!(
                        "{} bytes given, parameter is .{} ({size} bytes)",
                        a.size(),
                        p.ty
                    ),
                ));
            }
            // A byte-array parameter (`.b8 p[8]`) takes any argument of its size.
            let fits = match p.array {
                Some(_) => p.ty.kind() == ptx::TyKind::Bits,
                None => a.fits(p.ty),
            };
            if !fits {
                return Err(ArgError::at(
                    &self.name,
                    i,
                    p,
                    ArgProblem::Kind,
                    format!(
                        "{} given, parameter is .{} (no implicit conversion: pass exactly that \
                         kind)",
                        a.kind_name(),
                        p.ty
                    ),
                ));
            }
        }
        Ok(())
    }
    pub fn device(&self) -> &Device {
        &self.module.device
    }
    /// Byte offset of each parameter in the buffer [`Function::pack_args`] builds.
    pub fn param_offsets(&self) -> Vec<usize> {
        let mut off = 0usize;
        let mut v = Vec::with_capacity(self.params.len());
        for p in &self.params {
            let align = p.alignment().max(1) as usize;
            off = off.div_ceil(align) * align;
            v.push(off);
            off += p.size_bytes() as usize;
        }
        v
    }
}
