//! Streams, events, graphs and kernel launches (`cuLaunchKernelEx`).

use super::module::CuModule;
use super::{check, green::GreenCtx, Ctx};
use crate::{LaunchConfig, Result, RuntimeError};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// A bare `CUstream` (destroyed on drop).
pub(crate) struct RawStream(pub sys::CUstream);

// SAFETY: stream handles may be used from any thread (the driver API is thread-safe).
unsafe impl Send for RawStream {}
// SAFETY: see above; the handle itself is immutable.
unsafe impl Sync for RawStream {}

impl RawStream {
    /// A non-blocking stream in `ctx` with a CUDA priority (lower number = higher priority).
    pub fn create(ctx: sys::CUcontext, cuda_priority: i32) -> Result<RawStream> {
        // SAFETY: `ctx` is a live context handle owned by the caller.
        check(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")?;
        let mut s = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(
            unsafe {
                sys::cuStreamCreateWithPriority(
                    &mut s,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                    cuda_priority,
                )
            },
            "cuStreamCreateWithPriority",
        )?;
        Ok(RawStream(s))
    }
}

impl Drop for RawStream {
    fn drop(&mut self) {
        // SAFETY: destroys the stream created in `create`, exactly once (work still queued on it
        // completes first, per the driver's semantics).
        unsafe {
            sys::cuStreamDestroy_v2(self.0);
        }
    }
}

/// Maps the runtime's priority (higher = favoured) into the context's CUDA range.
pub(crate) fn cuda_priority(ctx: sys::CUcontext, p: i32) -> Result<i32> {
    // SAFETY: `ctx` is live; out-pointers to locals.
    let (mut least, mut greatest) = (0, 0);
    unsafe {
        check(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent")?;
        check(
            sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest),
            "cuCtxGetStreamPriorityRange",
        )?;
    }
    Ok((-p).clamp(greatest.min(least), least.max(greatest)))
}

/// A stream of a device (in its primary context, or in a green context of a partition).
pub(crate) struct CuStream {
    pub raw: RawStream,
    /// The context launches on this stream run in.
    pub ctx: sys::CUcontext,
    pub dev: Arc<Ctx>,
    /// Keeps the partition's green context alive while the stream exists.
    pub green: Option<Arc<GreenCtx>>,
    /// Host sources of queued async copies, numbered in queue order (with the next number),
    /// released by the first synchronize that began after they were queued.
    pub keep: Mutex<KeptSources>,
}

// SAFETY: the raw handles are thread-agnostic driver handles; mutable state is behind a Mutex.
unsafe impl Send for CuStream {}
// SAFETY: see above.
unsafe impl Sync for CuStream {}

/// The next copy's number and the sources still in flight with their numbers.
pub(crate) type KeptSources = (u64, Vec<(u64, Vec<u8>)>);

/// See [`CuStream::enter`].
pub(crate) struct CtxGuard<'a>(&'a CuStream);

impl Drop for CtxGuard<'_> {
    fn drop(&mut self) {
        if self.0.green.is_some() {
            let _ = self.0.dev.bind();
        }
    }
}

impl Drop for CuStream {
    fn drop(&mut self) {
        // `raw` (destroyed next) may be dropped on a thread that never bound the device.
        let _ = self.dev.bind();
        // Copies may still read `keep`, which is freed right after: wait for them.
        if !self.keep.get_mut().map(|k| k.1.is_empty()).unwrap_or(true) {
            // SAFETY: live stream handle.
            unsafe {
                sys::cuStreamSynchronize(self.raw.0);
            }
        }
    }
}

/// Checks a launch's shape before it reaches the driver (clusters must tile the grid).
pub(crate) fn check_launch_shape(cfg: &LaunchConfig) -> Result<()> {
    if cfg.grid.contains(&0) || cfg.block.contains(&0) {
        return Err(RuntimeError::Launch(format!(
            "empty launch: grid {:?}, block {:?}",
            cfg.grid, cfg.block
        )));
    }
    if cfg.cluster.contains(&0) {
        return Err(RuntimeError::Launch(format!(
            "cluster dims {:?} must all be at least 1",
            cfg.cluster
        )));
    }
    for i in 0..3 {
        if !cfg.grid[i].is_multiple_of(cfg.cluster[i]) {
            return Err(RuntimeError::Launch(format!(
                "grid {:?} is not a multiple of the cluster dims {:?}",
                cfg.grid, cfg.cluster
            )));
        }
    }
    Ok(())
}

/// The `CUlaunchAttribute`s for `cfg`: the cluster shape when clustered, cooperative when asked.
pub(crate) fn launch_attributes(cfg: &LaunchConfig) -> Vec<sys::CUlaunchAttribute> {
    let mut attrs: Vec<sys::CUlaunchAttribute> = Vec::new();
    if cfg.cluster != [1, 1, 1] {
        // SAFETY: CUlaunchAttribute is a plain C struct/union; all-zero is a valid value.
        let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        a.value.clusterDim.x = cfg.cluster[0];
        a.value.clusterDim.y = cfg.cluster[1];
        a.value.clusterDim.z = cfg.cluster[2];
        attrs.push(a);
    }
    if cfg.cooperative {
        // SAFETY: as above.
        let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        a.value.cooperative = 1;
        attrs.push(a);
    }
    attrs
}

/// The packed parameter bytes copied into 8-byte-aligned storage for `kernelParams`: a pointer
/// at byte offset `o` of the storage is then as aligned as the IR layout made `o` (up to 8),
/// which a `Vec<u8>` does not promise. Every offset must lie within the packed bytes.
pub(crate) fn param_storage(offsets: &[usize], packed: &[u8]) -> Result<Vec<u64>> {
    if offsets.iter().any(|&o| o > packed.len()) {
        return Err(RuntimeError::Launch(
            "parameter offset outside the packed buffer".into(),
        ));
    }
    let mut storage = vec![0u64; packed.len().div_ceil(8).max(1)];
    for (w, chunk) in storage.iter_mut().zip(packed.chunks(8)) {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        *w = u64::from_le_bytes(b);
    }
    Ok(storage)
}

impl CuStream {
    pub fn new(dev: &Arc<Ctx>, priority: i32) -> Result<CuStream> {
        let p = cuda_priority(dev.ctx, priority)?;
        Ok(CuStream {
            raw: RawStream::create(dev.ctx, p)?,
            ctx: dev.ctx,
            dev: dev.clone(),
            green: None,
            keep: Mutex::new((0, Vec::new())),
        })
    }

    pub fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is the primary context (retained by `dev`) or a green context kept alive
        // by `green`.
        check(unsafe { sys::cuCtxSetCurrent(self.ctx) }, "cuCtxSetCurrent")
    }

    /// Makes this stream's context current until the guard drops. A green context is then
    /// replaced by the device's primary context again: the driver documents that a green
    /// context may be current to only one thread at a time, so it is never left current on a
    /// thread (ptxforge drives a device from several host threads).
    pub fn enter(&self) -> Result<CtxGuard<'_>> {
        self.bind()?;
        Ok(CtxGuard(self))
    }

    pub fn synchronize(&self) -> Result<()> {
        let _cx = self.enter()?;
        // Only the sources queued before this synchronisation began are done with: another
        // host thread may queue a copy on this stream meanwhile (`Device::quiesce` synchronises
        // every stream of a device), and its source must outlive that copy.
        let done = self.keep.lock().unwrap_or_else(|p| p.into_inner()).0;
        // SAFETY: live stream handle.
        let r = check(
            unsafe { sys::cuStreamSynchronize(self.raw.0) },
            "cuStreamSynchronize",
        );
        self.keep
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .retain(|(seq, _)| *seq >= done);
        r
    }

    /// Queues a host-to-device copy ordered with this stream's work; returns at once.
    ///
    /// The source is ordinary (pageable) memory, kept alive in `keep` until the stream's next
    /// `synchronize` (the driver stages pageable sources through its own pinned buffers and may
    /// do so after returning). Not a pinned buffer per copy: it would have to be freed later,
    /// and `cuMemFreeHost` (like `cuMemHostAlloc`) implicitly synchronises the device — freeing
    /// it while a kernel on another stream is still running (a communication kernel spinning
    /// on a flag) would block until that kernel ends, which is exactly what stream-ordered
    /// copies exist to avoid.
    pub fn copy_htod_async(&self, dst: u64, data: Vec<u8>) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let _cx = self.enter()?;
        // SAFETY: `data` is moved into `keep` below and stays alive (its heap buffer does not
        // move) until the stream has been synchronised; the device range is in bounds (checked
        // by the caller); live stream of the current context.
        check(
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    dst,
                    data.as_ptr() as *const c_void,
                    data.len(),
                    self.raw.0,
                )
            },
            "cuMemcpyHtoDAsync",
        )?;
        let mut keep = self.keep.lock().unwrap_or_else(|p| p.into_inner());
        let seq = keep.0;
        keep.0 += 1;
        keep.1.push((seq, data));
        Ok(())
    }

    /// Queues `cuMemsetD8/16/32Async` of `bytes` at `dst` with a 1-, 2- or 4-byte pattern.
    pub fn memset_async(&self, dst: u64, bytes: usize, pattern: &[u8]) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let _cx = self.enter()?;
        let n = bytes / pattern.len().max(1);
        // SAFETY: `dst .. dst + bytes` lies inside one live allocation (the caller's buffer);
        // the stream handle is live and belongs to the current context.
        let r = unsafe {
            match pattern.len() {
                1 => sys::cuMemsetD8Async(dst, pattern[0], n, self.raw.0),
                2 => sys::cuMemsetD16Async(
                    dst,
                    u16::from_le_bytes([pattern[0], pattern[1]]),
                    n,
                    self.raw.0,
                ),
                4 => sys::cuMemsetD32Async(
                    dst,
                    u32::from_le_bytes([pattern[0], pattern[1], pattern[2], pattern[3]]),
                    n,
                    self.raw.0,
                ),
                _ => {
                    let data: Vec<u8> = pattern.iter().copied().cycle().take(bytes).collect();
                    return self.copy_htod_async(dst, data);
                }
            }
        };
        check(r, "cuMemsetAsync")
    }

    /// Queues a device-to-device copy of `bytes` (`cuMemcpyDtoDAsync`).
    pub fn copy_dtod_async(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let _cx = self.enter()?;
        // SAFETY: both ranges lie inside live allocations (checked by the caller); live stream.
        check(
            unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.raw.0) },
            "cuMemcpyDtoDAsync",
        )
    }

    /// Waits for this stream, then copies `out.len()` bytes from `src` on this stream (no
    /// context-wide synchronisation: other streams keep running). The destination is the
    /// caller's memory, filled before this returns (the stream is synchronised after the copy);
    /// no pinned buffer is allocated or freed (see [`CuStream::copy_htod_async`]).
    pub fn copy_dtoh(&self, out: &mut [u8], src: u64) -> Result<()> {
        self.synchronize()?;
        if out.is_empty() {
            return Ok(());
        }
        let _cx = self.enter()?;
        // SAFETY: `out` has room for `out.len()` bytes and is only read after the stream has
        // been synchronised; the device range is in bounds (checked by the caller).
        unsafe {
            check(
                sys::cuMemcpyDtoHAsync_v2(
                    out.as_mut_ptr() as *mut c_void,
                    src,
                    out.len(),
                    self.raw.0,
                ),
                "cuMemcpyDtoHAsync",
            )?;
            check(sys::cuStreamSynchronize(self.raw.0), "cuStreamSynchronize")
        }
    }

    /// Launches `name` from `module` with packed parameters laid out per `offsets`.
    pub fn launch(
        &self,
        module: &CuModule,
        name: &str,
        offsets: &[usize],
        packed: &[u8],
        cfg: &LaunchConfig,
    ) -> Result<()> {
        check_launch_shape(cfg)?;
        let _cx = self.enter()?;
        let f = module.function(self.ctx, self.green.as_ref(), name)?;
        module.prepare_launch(f, cfg)?;
        let mut attrs = launch_attributes(cfg);
        let lc = sys::CUlaunchConfig {
            gridDimX: cfg.grid[0],
            gridDimY: cfg.grid[1],
            gridDimZ: cfg.grid[2],
            blockDimX: cfg.block[0],
            blockDimY: cfg.block[1],
            blockDimZ: cfg.block[2],
            sharedMemBytes: cfg.shared_bytes,
            hStream: self.raw.0,
            attrs: if attrs.is_empty() {
                std::ptr::null_mut()
            } else {
                attrs.as_mut_ptr()
            },
            numAttrs: attrs.len() as u32,
        };
        // One pointer per kernel parameter, into an 8-byte-aligned copy of the packed buffer.
        let mut storage = param_storage(offsets, packed)?;
        let base = storage.as_mut_ptr() as *mut u8;
        let mut ptrs: Vec<*mut c_void> = offsets
            .iter()
            // SAFETY: `param_storage` checked every offset is within the packed bytes, which
            // `storage` holds (rounded up to whole words).
            .map(|&o| unsafe { base.add(o) } as *mut c_void)
            .collect();
        // SAFETY: `lc`, `attrs`, `storage` and `ptrs` outlive the call; each pointer addresses
        // the bytes of one parameter, whose size and alignment `Function::pack_args` checked
        // against the IR. The driver copies the parameter values before returning.
        check(
            unsafe {
                sys::cuLaunchKernelEx(
                    &lc,
                    f,
                    if ptrs.is_empty() {
                        std::ptr::null_mut()
                    } else {
                        ptrs.as_mut_ptr()
                    },
                    std::ptr::null_mut(),
                )
            },
            &format!("cuLaunchKernelEx(`{name}`)"),
        )
    }
}

/// A timing event.
pub(crate) struct CuEvent {
    pub ev: sys::CUevent,
    dev: Arc<Ctx>,
    /// An event recorded on a partition's stream belongs to its green context: keep it alive.
    _green: Option<Arc<GreenCtx>>,
}

// SAFETY: event handles are thread-agnostic driver handles.
unsafe impl Send for CuEvent {}
// SAFETY: see above.
unsafe impl Sync for CuEvent {}

impl CuEvent {
    /// Creates an event and records it on `s`.
    pub fn record(s: &CuStream) -> Result<CuEvent> {
        let _cx = s.enter()?;
        // SAFETY: the stream is live and its context current (the guard).
        unsafe { CuEvent::create_on(&s.dev, s.green.clone(), s.raw.0, "cuEventRecord") }
    }
    /// Creates an event and records it on the legacy NULL stream (`CU_STREAM_LEGACY`) of
    /// `ctx`: it completes once everything queued there before it has run (libraries such as
    /// NCCL that are handed the NULL stream queue their kernels there).
    pub fn record_legacy(ctx: &Arc<Ctx>) -> Result<CuEvent> {
        ctx.bind()?;
        let legacy = 0x1 as sys::CUstream; // CU_STREAM_LEGACY in cuda.h
                                           // SAFETY: the legacy stream of the context just made current.
        unsafe { CuEvent::create_on(ctx, None, legacy, "cuEventRecord(CU_STREAM_LEGACY)") }
    }
    /// An event of `dev`, recorded on `stream`.
    ///
    /// # Safety
    /// `stream` must be a live stream (or a special handle) of `dev`'s context, current on
    /// this thread.
    unsafe fn create_on(
        dev: &Arc<Ctx>,
        green: Option<Arc<GreenCtx>>,
        stream: sys::CUstream,
        what: &str,
    ) -> Result<CuEvent> {
        let mut ev = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; then records on the caller's stream.
        unsafe {
            check(
                sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DEFAULT as u32),
                "cuEventCreate",
            )?;
            let e = CuEvent {
                ev,
                dev: dev.clone(),
                _green: green,
            };
            check(sys::cuEventRecord(ev, stream), what)?;
            Ok(e)
        }
    }
    /// Event queries and waits work with any context of the device current; bind the primary
    /// one so a thread that never touched the device has one.
    fn bind_any(&self) -> Result<()> {
        self.dev.bind()
    }
    pub fn synchronize(&self) -> Result<()> {
        self.bind_any()?;
        // SAFETY: live event handle.
        check(
            unsafe { sys::cuEventSynchronize(self.ev) },
            "cuEventSynchronize",
        )
    }
    pub fn is_complete(&self) -> bool {
        if self.bind_any().is_err() {
            return false;
        }
        // SAFETY: live event handle.
        unsafe { sys::cuEventQuery(self.ev) == sys::CUresult::CUDA_SUCCESS }
    }
    /// Milliseconds from `start` to `self`.
    pub fn elapsed_ms(&self, start: &CuEvent) -> Result<f32> {
        self.synchronize()?;
        start.synchronize()?;
        let mut ms = 0f32;
        // SAFETY: both events are live and complete; out-pointer to a local.
        check(
            unsafe { sys::cuEventElapsedTime(&mut ms, start.ev, self.ev) },
            "cuEventElapsedTime",
        )?;
        Ok(ms)
    }
    /// Makes `s` wait for this event.
    pub fn wait_on(&self, s: &CuStream) -> Result<()> {
        let _cx = s.enter()?;
        // SAFETY: live stream and event handles (the event may belong to another context of
        // the device; cuStreamWaitEvent accepts that).
        check(
            unsafe { sys::cuStreamWaitEvent(s.raw.0, self.ev, 0) },
            "cuStreamWaitEvent",
        )
    }
}

impl Drop for CuEvent {
    fn drop(&mut self) {
        let _ = self.bind_any();
        // SAFETY: destroys the event created in `record`, exactly once.
        unsafe {
            sys::cuEventDestroy_v2(self.ev);
        }
    }
}

/// An instantiated CUDA graph captured from a stream.
pub(crate) struct CuGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    _dev: Arc<Ctx>,
}

// SAFETY: graph handles are thread-agnostic driver handles; launching is thread-safe.
unsafe impl Send for CuGraph {}
// SAFETY: see above.
unsafe impl Sync for CuGraph {}

impl CuGraph {
    pub fn begin_capture(s: &CuStream) -> Result<()> {
        let _cx = s.enter()?;
        // SAFETY: live stream handle.
        check(
            unsafe {
                sys::cuStreamBeginCapture_v2(
                    s.raw.0,
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )
            },
            "cuStreamBeginCapture",
        )
    }
    pub fn end_capture(s: &CuStream) -> Result<CuGraph> {
        let _cx = s.enter()?;
        let mut graph = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the stream is capturing.
        check(
            unsafe { sys::cuStreamEndCapture(s.raw.0, &mut graph) },
            "cuStreamEndCapture",
        )?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: `graph` was just created by the capture; out-pointer to a local.
        let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if let Err(e) = check(r, "cuGraphInstantiateWithFlags") {
            // SAFETY: the graph is ours and not instantiated.
            unsafe {
                sys::cuGraphDestroy(graph);
            }
            return Err(e);
        }
        Ok(CuGraph {
            graph,
            exec,
            _dev: s.dev.clone(),
        })
    }
    pub fn launch(&self, s: &CuStream) -> Result<()> {
        let _cx = s.enter()?;
        // SAFETY: live executable graph and stream.
        check(
            unsafe { sys::cuGraphLaunch(self.exec, s.raw.0) },
            "cuGraphLaunch",
        )
    }
}

impl Drop for CuGraph {
    fn drop(&mut self) {
        let _ = self._dev.bind();
        // SAFETY: destroys the handles created in `end_capture`, exactly once.
        unsafe {
            sys::cuGraphExecDestroy(self.exec);
            sys::cuGraphDestroy(self.graph);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_attributes_encode_cluster_and_cooperative() {
        assert!(launch_attributes(&LaunchConfig::linear(4, 32)).is_empty());
        let mut cfg = LaunchConfig::grid3([8, 2, 1], [128, 1, 1]).cooperative();
        cfg.cluster = [2, 2, 1];
        let a = launch_attributes(&cfg);
        assert_eq!(a.len(), 2);
        assert_eq!(
            a[0].id,
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        );
        // SAFETY: reading the union members written above.
        unsafe {
            assert_eq!(
                (
                    a[0].value.clusterDim.x,
                    a[0].value.clusterDim.y,
                    a[0].value.clusterDim.z
                ),
                (2, 2, 1)
            );
            assert_eq!(a[1].value.cooperative, 1);
        }
        assert_eq!(
            a[1].id,
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        );
        // The driver's layout: 4-byte id, 4 bytes of padding, a 64-byte value union.
        assert_eq!(std::mem::size_of::<sys::CUlaunchAttribute>(), 72);
    }

    #[test]
    fn launch_shapes_are_checked() {
        let mut cfg = LaunchConfig::grid3([6, 1, 1], [64, 1, 1]);
        assert!(check_launch_shape(&cfg).is_ok());
        cfg.cluster = [4, 1, 1];
        let e = check_launch_shape(&cfg).unwrap_err().to_string();
        assert!(e.contains("not a multiple of the cluster"), "{e}");
        cfg.cluster = [2, 1, 1];
        assert!(check_launch_shape(&cfg).is_ok());
        cfg.cluster = [0, 1, 1];
        assert!(check_launch_shape(&cfg).is_err());
        assert!(check_launch_shape(&LaunchConfig::linear(0, 32)).is_err());
    }

    #[test]
    fn kernel_params_point_at_aligned_copies_of_each_value() {
        // .u8 a, .u64 b, .u32 c, .u16 d (offsets 0, 8, 16, 20) as Function::pack_args lays out.
        let mut packed = vec![7u8, 0, 0, 0, 0, 0, 0, 0];
        packed.extend_from_slice(&0x1122_3344_5566_7788u64.to_le_bytes());
        packed.extend_from_slice(&0xdead_beefu32.to_le_bytes());
        packed.extend_from_slice(&0xabcdu16.to_le_bytes());
        let offsets = [0usize, 8, 16, 20];
        let storage = param_storage(&offsets, &packed).unwrap();
        let base = storage.as_ptr() as *const u8;
        assert_eq!(base as usize % 8, 0);
        // SAFETY: every offset plus its size is within the storage (22 bytes in 3 words).
        unsafe {
            assert_eq!(*base, 7);
            assert_eq!(
                (base.add(8) as *const u64).read(),
                0x1122_3344_5566_7788u64.to_le()
            );
            assert_eq!((base.add(16) as *const u32).read(), 0xdead_beefu32.to_le());
            assert_eq!((base.add(20) as *const u16).read(), 0xabcdu16.to_le());
        }
        assert!(param_storage(&[40], &packed).is_err());
        assert_eq!(param_storage(&[], &[]).unwrap().len(), 1);
    }
}
