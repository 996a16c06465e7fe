//! Streams and events. An emulator stream is a host thread that runs its queue in order, so two
//! streams (a communication stream and a compute stream, or streams of different devices) run
//! concurrently, as on hardware. Launch errors are sticky: they surface at the next
//! `synchronize`.

use crate::device::{Device, Function, SmPartition};
use crate::{Arg, Result, RuntimeError};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Launch shape and placement.
#[derive(Clone, Debug)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory bytes.
    pub shared_bytes: u32,
    /// Cluster dimensions (1,1,1 when not clustered).
    pub cluster: [u32; 3],
    /// Run on at most these SMs (None: the whole device).
    pub sm_budget: Option<SmPartition>,
    /// Stop a kernel that runs longer than this (emulator hang detection).
    pub timeout: Option<Duration>,
    /// Stop after this many warp-instructions (emulator hang detection).
    pub max_warp_instructions: Option<u64>,
    /// Incremented as CTAs complete (progress bars).
    pub progress: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
    /// Cooperative launch (`CU_LAUNCH_ATTRIBUTE_COOPERATIVE`: all CTAs co-resident).
    pub cooperative: bool,
    /// Emulator tensor-core numerics for this launch (None: the device's setting, see
    /// [`crate::Device::set_numerics`]). Real GPUs ignore it.
    pub numerics: Option<emu::Numerics>,
    /// Emulator sanitizers for this launch (None: the process default, `PTXFORGE_SANITIZE`; see
    /// [`emu::sanitize`]). A launch that finds something fails with `EmuError::Sanitizer`,
    /// surfacing at `synchronize`. Real GPUs ignore it (use compute-sanitizer there).
    pub sanitize: Option<emu::Tools>,
    /// Emulator: set from any thread to stop this launch; it then fails with
    /// `FaultKind::Interrupted` (at `synchronize`). Real GPUs cannot stop a running kernel and
    /// ignore it.
    pub cancel: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl LaunchConfig {
    /// 1-D grid of `grid` CTAs of `block` threads.
    pub fn linear(grid: u32, block: u32) -> LaunchConfig {
        LaunchConfig {
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_bytes: 0,
            cluster: [1, 1, 1],
            sm_budget: None,
            timeout: None,
            max_warp_instructions: None,
            progress: None,
            cooperative: false,
            numerics: None,
            sanitize: None,
            cancel: None,
        }
    }
    /// A persistent kernel on an SM budget: one CTA per budgeted SM (grid = `p.count`).
    pub fn persistent(p: SmPartition, block: u32) -> LaunchConfig {
        LaunchConfig::linear(p.count, block).budget(p)
    }
    pub fn cooperative(mut self) -> Self {
        self.cooperative = true;
        self
    }
    pub fn grid3(grid: [u32; 3], block: [u32; 3]) -> LaunchConfig {
        LaunchConfig {
            grid,
            block,
            ..LaunchConfig::linear(1, 1)
        }
    }
    pub fn shared(mut self, bytes: u32) -> Self {
        self.shared_bytes = bytes;
        self
    }
    pub fn budget(mut self, p: SmPartition) -> Self {
        self.sm_budget = Some(p);
        self
    }
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }
    /// Emulator tensor-core numerics for this launch.
    pub fn numerics(mut self, n: emu::Numerics) -> Self {
        self.numerics = Some(n);
        self
    }
}

type Job = Box<dyn FnOnce(&StreamInner) + Send>;

pub(crate) struct StreamInner {
    tx: Mutex<Option<Sender<Job>>>,
    state: Mutex<State>,
    cv: Condvar,
    pub priority: i32,
    /// The CUDA stream (CUDA devices; the error if creating it failed).
    pub(crate) cuda: Option<std::result::Result<crate::cuda::launch::CuStream, RuntimeError>>,
    /// SM range launches default to (streams of a `Partition`).
    pub(crate) default_budget: Option<SmPartition>,
    /// Launches recorded while capturing a graph (emulator).
    pub(crate) capture: Mutex<Option<Vec<crate::graph::Recorded>>>,
    /// Emulator launches on this stream count shared-memory bank conflicts.
    bank_profile: std::sync::atomic::AtomicBool,
    /// Emulated time stands still while this stream has queued work and no kernel of it runs
    /// (`emu::clock`): host delays before a launch are not emulated time.
    hold: Arc<Mutex<Option<emu::clock::Hold>>>,
    /// Process-unique number (the stream's track in kernel traces, `profile::KernelSpan`).
    pub(crate) id: u64,
}

/// The next stream's `id`.
static NEXT_STREAM_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl StreamInner {
    /// Holds emulated time (if not held already) while work is queued.
    fn hold_time(&self) {
        if self.cuda.is_none() {
            let mut h = self.hold.lock().unwrap_or_else(|p| p.into_inner());
            h.get_or_insert_with(emu::clock::Hold::new);
        }
    }
}

#[derive(Default)]
struct State {
    queued: u64,
    done: u64,
    error: Option<RuntimeError>,
    last_stats: Option<emu::LaunchStats>,
    /// Union of the SMs every emulated launch on this stream ran on.
    sms_touched: std::collections::BTreeSet<u32>,
}

/// An ordered queue of work on one device.
#[derive(Clone)]
pub struct Stream {
    pub(crate) device: Device,
    pub(crate) inner: Arc<StreamInner>,
}

impl Stream {
    pub(crate) fn new(device: &Device, priority: i32) -> Stream {
        let cuda = device
            .cuda_ctx()
            .map(|c| crate::cuda::launch::CuStream::new(c, priority));
        Stream::with_parts(device, priority, cuda, None)
    }

    pub(crate) fn with_parts(
        device: &Device,
        priority: i32,
        cuda: Option<Result<crate::cuda::launch::CuStream>>,
        default_budget: Option<SmPartition>,
    ) -> Stream {
        let (tx, rx) = channel::<Job>();
        let inner = Arc::new(StreamInner {
            tx: Mutex::new(Some(tx)),
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            priority,
            cuda,
            default_budget,
            id: NEXT_STREAM_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            capture: Mutex::new(None),
            bank_profile: Default::default(),
            hold: Default::default(),
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name(format!("ptxforge-stream-{}", device.index()))
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    let Some(s) = weak.upgrade() else { return };
                    // A panicking job must still count as done (else `synchronize` waits
                    // forever); its panic becomes the stream's error.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&s)));
                    let mut st = s.state.lock().unwrap_or_else(|p| p.into_inner());
                    if let Err(p) = r {
                        st.error
                            .get_or_insert(RuntimeError::Emu(emu::EmuError::Internal(
                                emu::error::panic_message(&*p),
                            )));
                    }
                    st.done += 1;
                    if st.done == st.queued {
                        s.hold.lock().unwrap_or_else(|p| p.into_inner()).take();
                    } else {
                        s.hold_time();
                    }
                    s.cv.notify_all();
                }
            })
            .ok();
        device
            .inner
            .streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::downgrade(&inner));
        Stream {
            device: device.clone(),
            inner,
        }
    }

    /// True when both handles are the same stream.
    pub fn same(&self, other: &Stream) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The priority this stream was created with.
    pub fn priority(&self) -> i32 {
        self.inner.priority
    }

    fn enqueue(&self, job: Job) -> Result<()> {
        let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        st.queued += 1;
        self.inner.hold_time();
        drop(st);
        let tx = self.inner.tx.lock().unwrap_or_else(|p| p.into_inner());
        tx.as_ref()
            .ok_or_else(|| RuntimeError::Launch("stream is closed".into()))?
            .send(job)
            .map_err(|_| RuntimeError::Launch("stream worker has stopped".into()))
    }

    /// Queues a kernel launch. Arguments are checked against the kernel's parameters now;
    /// execution errors surface at `synchronize`.
    pub fn launch(&self, f: &Function, cfg: &LaunchConfig, args: &[Arg]) -> Result<()> {
        if !f.device().same(&self.device) {
            return Err(RuntimeError::Launch(format!(
                "kernel `{}` was loaded on another device",
                f.name
            )));
        }
        // Emulator graph capture records the launch (CUDA captures in the driver).
        if let (None, Some(rec)) = (
            &self.inner.cuda,
            self.inner
                .capture
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_mut(),
        ) {
            f.pack_args(args)?;
            rec.push(crate::graph::Recorded {
                f: f.clone(),
                cfg: cfg.clone(),
                args: args.to_vec(),
            });
            return Ok(());
        }
        let params = f.pack_args(args)?;
        let props = self.device.props();
        let part = cfg
            .sm_budget
            .or(self.inner.default_budget)
            .unwrap_or(SmPartition {
                offset: 0,
                count: props.sms,
            });
        if part.count == 0 || part.offset + part.count > props.sms {
            return Err(RuntimeError::Launch(format!(
                "SM budget {}..{} does not fit the device's {} SMs",
                part.offset,
                part.offset + part.count,
                props.sms
            )));
        }
        if let Some(cs) = &self.inner.cuda {
            // CUDA: the budget is advisory on a plain stream (the hardware scheduler places CTAs)
            // and enforced by the green context on a partition's stream; see docs/CUDA.md.
            let cs = cs.as_ref().map_err(|e| e.clone())?;
            let cm = f.module.cuda.as_ref().ok_or_else(|| {
                RuntimeError::Launch(format!("kernel `{}` has no CUDA module", f.name))
            })?;
            return cs.launch(cm, &f.name, &f.param_offsets(), &params, cfg);
        }
        let prog = f.module.loaded.kernel(&f.name)?;
        let ecfg = emu::LaunchConfig {
            grid: cfg.grid,
            block: cfg.block,
            shared_bytes: cfg.shared_bytes,
            sms: part.count,
            sm_offset: part.offset,
            device_sms: props.sms,
            cluster: cfg.cluster,
        };
        let mut opts = emu::LaunchOptions::default();
        if let Some(t) = cfg.timeout {
            opts.timeout = t;
        }
        if let Some(n) = cfg.max_warp_instructions {
            opts.max_warp_instructions = n;
        }
        opts.progress = cfg.progress.clone();
        opts.hold = Some(self.inner.hold.clone());
        if let Some(n) = cfg.numerics.or_else(|| self.device.numerics()) {
            opts.numerics = n;
        }
        if let Some(t) = cfg.sanitize {
            opts.sanitize = t;
        }
        // the launch's own flag, else the enqueuing thread's scope (`crate::cancel`)
        opts.cancel = cfg.cancel.clone().or_else(crate::cancel::current);
        opts.bank_profile |= self
            .inner
            .bank_profile
            .load(std::sync::atomic::Ordering::Relaxed);
        let name = f.name.clone();
        let device = self.device.index();
        self.enqueue(Box::new(move |s: &StreamInner| {
            if s.state.lock().map(|st| st.error.is_some()).unwrap_or(true) {
                return; // sticky error: skip further work
            }
            let mem = crate::device::emu_memory().snapshot();
            let t0 = (crate::profile::enabled() || crate::profile::capturing())
                .then(std::time::Instant::now);
            let r = emu::launch(prog, mem, params, &ecfg, &opts);
            if let Some(t0) = t0 {
                crate::profile::record(&name, t0.elapsed());
                crate::profile::record_span(crate::profile::KernelSpan {
                    kernel: name,
                    device,
                    stream: s.id,
                    sms: (ecfg.sm_offset, ecfg.sms),
                    start: t0,
                    end: std::time::Instant::now(),
                });
            }
            let mut st = s.state.lock().unwrap_or_else(|p| p.into_inner());
            match r {
                Ok(stats) => {
                    st.sms_touched.extend(stats.sms_used.iter().copied());
                    st.last_stats = Some(stats)
                }
                Err(e) => st.error = Some(e.into()),
            }
        }))
    }

    /// Waits for everything queued so far; returns (and clears) the first error.
    pub fn synchronize(&self) -> Result<()> {
        if let Some(cs) = &self.inner.cuda {
            sync_inner(&self.inner)?;
            return cs.as_ref().map_err(|e| e.clone())?.synchronize();
        }
        sync_inner(&self.inner)
    }

    /// SMs kernels launched here should size their grids for: the partition's count on a
    /// partition's stream, else the device's SM count.
    pub fn sm_count(&self) -> u32 {
        self.inner
            .default_budget
            .map(|p| p.count)
            .unwrap_or_else(|| self.device.props().sms)
    }

    /// Emulator: the union of the SMs every launch on this stream has run on so far (sorted;
    /// empty on CUDA, where `sms_used` probes placement instead).
    pub fn sms_touched(&self) -> Vec<u32> {
        self.inner
            .state
            .lock()
            .map(|s| s.sms_touched.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The SM range launches on this stream default to (streams of a [`crate::Partition`]).
    pub fn default_budget(&self) -> Option<SmPartition> {
        self.inner.default_budget
    }

    /// Queues a host-to-device copy; returns before it runs (ordered with this stream's launches).
    /// On CUDA: `cuMemcpyHtoDAsync` from a copy of `data` that the stream keeps until its next
    /// `synchronize`.
    pub fn copy_to_device<T: crate::Pod>(&self, dst: &crate::Buffer<T>, data: &[T]) -> Result<()> {
        if data.len() > dst.len() {
            return Err(RuntimeError::Buffer(format!(
                "copy of {} elements into a buffer of {}",
                data.len(),
                dst.len()
            )));
        }
        let mut bytes = Vec::with_capacity(data.len() * T::SIZE);
        for x in data {
            x.to_bytes(&mut bytes);
        }
        if let Some(cs) = &self.inner.cuda {
            return cs
                .as_ref()
                .map_err(|e| e.clone())?
                .copy_htod_async(dst.device_ptr(), bytes);
        }
        let addr = dst.device_ptr();
        self.enqueue(Box::new(move |s: &StreamInner| {
            let mem = crate::device::emu_memory().snapshot();
            match mem.find(addr, bytes.len() as u64) {
                Some(a) => a.write_bytes(addr - a.base, &bytes),
                None => {
                    let mut st = s.state.lock().unwrap_or_else(|p| p.into_inner());
                    st.error.get_or_insert(RuntimeError::Buffer(
                        "async copy into a freed buffer".into(),
                    ));
                }
            }
        }))
    }

    /// Queues setting every element of `dst` to `v`, ordered with this stream's work (no wait on
    /// the device's other streams). CUDA: `cuMemsetD8/16/32Async` on this stream.
    pub fn fill<T: crate::Pod>(&self, dst: &crate::Buffer<T>, v: T) -> Result<()> {
        let mut pat = Vec::new();
        v.to_bytes(&mut pat);
        let bytes = dst.len() * T::SIZE;
        if let Some(cs) = &self.inner.cuda {
            return cs
                .as_ref()
                .map_err(|e| e.clone())?
                .memset_async(dst.device_ptr(), bytes, &pat);
        }
        let addr = dst.device_ptr();
        self.enqueue(Box::new(move |s: &StreamInner| {
            let mem = crate::device::emu_memory().snapshot();
            match mem.find(addr, bytes as u64) {
                Some(a) => {
                    let mut buf = Vec::with_capacity(bytes);
                    while buf.len() < bytes {
                        buf.extend_from_slice(&pat);
                    }
                    buf.truncate(bytes);
                    a.write_bytes(addr - a.base, &buf)
                }
                None => {
                    let mut st = s.state.lock().unwrap_or_else(|p| p.into_inner());
                    st.error
                        .get_or_insert(RuntimeError::Buffer("fill of a freed buffer".into()));
                }
            }
        }))
    }

    /// Allocates a buffer on this stream's device and queues the copy of `data` into it.
    pub fn upload<T: crate::Pod>(&self, data: &[T]) -> Result<crate::Buffer<T>> {
        let b = self.device.alloc::<T>(data.len())?;
        self.copy_to_device(&b, data)?;
        Ok(b)
    }

    /// Waits for this stream only, then copies `src` out: the stream-ordered read that does not
    /// wait for the device's other streams (a communication kernel on another stream keeps
    /// running).
    pub fn read<T: crate::Pod>(&self, src: &crate::Buffer<T>) -> Result<Vec<T>> {
        let mut bytes = vec![0u8; src.len() * T::SIZE];
        if let Some(cs) = &self.inner.cuda {
            sync_inner(&self.inner)?;
            cs.as_ref()
                .map_err(|e| e.clone())?
                .copy_dtoh(&mut bytes, src.device_ptr())?;
        } else {
            self.synchronize()?;
            src.mem.read(0, &mut bytes)?;
        }
        Ok(bytes.chunks_exact(T::SIZE).map(T::from_bytes).collect())
    }

    /// Stream-ordered copy of `src`'s bytes into `dst` (`dst` at least as large; the element
    /// types may differ, e.g. BF16 rows received as bytes). Emulator: queued; CUDA:
    /// `cuMemcpyDtoDAsync` on this stream.
    pub fn copy_bytes<A: crate::Pod, B: crate::Pod>(
        &self,
        src: &crate::Buffer<A>,
        dst: &crate::Buffer<B>,
    ) -> Result<()> {
        let n = src.len() * A::SIZE;
        if n > dst.len() * B::SIZE {
            return Err(RuntimeError::Buffer(format!(
                "copy of {n} bytes into a buffer of {}",
                dst.len() * B::SIZE
            )));
        }
        self.copy_ptrs(src.device_ptr(), dst.device_ptr(), n)
    }

    /// Queues a copy of `n` bytes from device address `sa` to `da` (both inside live buffers:
    /// the callers check the ranges).
    fn copy_ptrs(&self, sa: u64, da: u64, n: usize) -> Result<()> {
        if let Some(cs) = &self.inner.cuda {
            return cs
                .as_ref()
                .map_err(|e| e.clone())?
                .copy_dtod_async(da, sa, n);
        }
        self.enqueue(Box::new(move |s: &StreamInner| {
            let mem = crate::device::emu_memory().snapshot();
            match (mem.find(sa, n as u64), mem.find(da, n as u64)) {
                (Some(a), Some(b)) => {
                    let mut bytes = vec![0u8; n];
                    a.read_bytes(sa - a.base, &mut bytes);
                    b.write_bytes(da - b.base, &bytes);
                }
                _ => {
                    let mut st = s.state.lock().unwrap_or_else(|p| p.into_inner());
                    st.error
                        .get_or_insert(RuntimeError::Buffer("copy with a freed buffer".into()));
                }
            }
        }))
    }

    /// Stream-ordered copy of `len` elements from `src[src_at..]` into `dst[dst_at..]` (same
    /// element type; the buffers may sit on different devices, a peer copy, or be one buffer's
    /// disjoint ranges; both ranges checked): the slicing and concatenation of device tensors
    /// without a host round trip. Emulator:
    /// queued; CUDA: `cuMemcpyDtoDAsync` on this stream.
    pub fn copy_range<T: crate::Pod>(
        &self,
        (src, src_at): (&crate::Buffer<T>, usize),
        (dst, dst_at): (&crate::Buffer<T>, usize),
        len: usize,
    ) -> Result<()> {
        let fits = |at: usize, n: usize| at.checked_add(len).is_some_and(|e| e <= n);
        if !fits(src_at, src.len()) || !fits(dst_at, dst.len()) {
            return Err(RuntimeError::Buffer(format!(
                "copy of {len} elements from [{src_at}..] of a buffer of {} into [{dst_at}..] of \
                 a buffer of {}",
                src.len(),
                dst.len()
            )));
        }
        if len == 0 {
            return Ok(());
        }
        let n = len * T::SIZE;
        let sa = src.device_ptr() + (src_at * T::SIZE) as u64;
        let da = dst.device_ptr() + (dst_at * T::SIZE) as u64;
        self.copy_ptrs(sa, da, n)
    }

    /// Emulator only: later launches on this stream count shared-memory wavefronts and bank
    /// conflicts per PTX instruction, reported in [`emu::LaunchStats::banks`] of
    /// [`Stream::last_stats`] (the model is described in [`emu::banks`]). Also on for every
    /// stream when `PTXFORGE_EMU_BANKS=1`. CUDA streams ignore it (use Nsight Compute there).
    pub fn set_bank_profile(&self, on: bool) {
        self.inner
            .bank_profile
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Statistics of the most recent completed launch.
    pub fn last_stats(&self) -> Option<emu::LaunchStats> {
        self.inner
            .state
            .lock()
            .ok()
            .and_then(|s| s.last_stats.clone())
    }

    /// Records an event that completes when all work queued before it has run.
    pub fn record(&self) -> Result<Event> {
        if let Some(cs) = &self.inner.cuda {
            let e = crate::cuda::launch::CuEvent::record(cs.as_ref().map_err(|e| e.clone())?)?;
            return Ok(Event {
                inner: Arc::new((Mutex::new(None), Condvar::new())),
                cuda: Some(Arc::new(e)),
            });
        }
        let ev = Event {
            inner: Arc::new((Mutex::new(None), Condvar::new())),
            cuda: None,
        };
        let e2 = ev.clone();
        self.enqueue(Box::new(move |_| {
            let (m, cv) = &*e2.inner;
            *m.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            cv.notify_all();
        }))?;
        Ok(ev)
    }

    /// Makes later work on this stream wait for `ev`.
    pub fn wait_event(&self, ev: &Event) -> Result<()> {
        if let (Some(cs), Some(ce)) = (&self.inner.cuda, &ev.cuda) {
            return ce.wait_on(cs.as_ref().map_err(|e| e.clone())?);
        }
        let e2 = ev.clone();
        self.enqueue(Box::new(move |_| {
            e2.synchronize();
        }))
    }
}

pub(crate) fn sync_inner(s: &StreamInner) -> Result<()> {
    wait_inner(s, true)
}

/// Waits for queued work; `take` consumes (and returns) the stream's sticky error.
pub(crate) fn wait_inner(s: &StreamInner, take: bool) -> Result<()> {
    let mut st = s.state.lock().unwrap_or_else(|p| p.into_inner());
    let target = st.queued;
    while st.done < target {
        st = s.cv.wait(st).unwrap_or_else(|p| p.into_inner());
    }
    if !take {
        return Ok(());
    }
    match st.error.take() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// A point in a stream's work.
#[derive(Clone)]
pub struct Event {
    inner: Arc<(Mutex<Option<Instant>>, Condvar)>,
    cuda: Option<Arc<crate::cuda::launch::CuEvent>>,
}

impl Event {
    /// A marker on `device`'s legacy NULL stream: on CUDA an event recorded there (it
    /// completes once the work queued on that stream before it has run, e.g. NCCL kernels
    /// launched on the NULL stream); on the emulator, which has no NULL stream, an event that
    /// completes once every stream of the device has drained.
    pub fn legacy(device: &crate::Device) -> Result<Event> {
        if let Some(ctx) = device.cuda_ctx() {
            let e = crate::cuda::launch::CuEvent::record_legacy(ctx)?;
            return Ok(Event {
                inner: Arc::new((Mutex::new(None), Condvar::new())),
                cuda: Some(Arc::new(e)),
            });
        }
        device.synchronize()?;
        Ok(Event {
            inner: Arc::new((Mutex::new(Some(Instant::now())), Condvar::new())),
            cuda: None,
        })
    }

    /// Blocks until the event completes; returns when it did.
    pub fn synchronize(&self) -> Instant {
        if let Some(e) = &self.cuda {
            let _ = e.synchronize();
            let mut g = self.inner.0.lock().unwrap_or_else(|p| p.into_inner());
            return *g.get_or_insert_with(Instant::now);
        }
        let (m, cv) = &*self.inner;
        let mut g = m.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(t) = *g {
                return t;
            }
            g = cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }
    pub fn is_complete(&self) -> bool {
        if let Some(e) = &self.cuda {
            return e.is_complete();
        }
        self.inner.0.lock().map(|g| g.is_some()).unwrap_or(false)
    }
    /// Time from `start` to this event (both synchronised).
    pub fn elapsed_since(&self, start: &Event) -> Duration {
        if let (Some(a), Some(b)) = (&start.cuda, &self.cuda) {
            if let Ok(ms) = b.elapsed_ms(a) {
                return Duration::from_secs_f64(ms.max(0.0) as f64 / 1e3);
            }
        }
        let a = start.synchronize();
        let b = self.synchronize();
        b.saturating_duration_since(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job that panics (an emulator bug) is reported by `synchronize`, which returns instead
    /// of waiting forever, and the stream keeps working for later launches' bookkeeping.
    #[test]
    fn a_panicking_job_is_an_error_not_a_hang() {
        let dev = Device::emu(0);
        let s = dev.stream(0);
        s.enqueue(Box::new(|_: &StreamInner| panic!("planted worker panic")))
            .unwrap();
        let e = s.synchronize().unwrap_err().to_string();
        assert!(
            e.contains("internal emulator error") && e.contains("planted worker panic"),
            "{e}"
        );
        s.synchronize().unwrap();
    }
}
