//! The fake driver's state: devices, contexts (primary and green), memory, and the handle tables.
//! Every handle the fake gives out is a small integer id (never a pointer), looked up in a
//! table, so a stale or foreign handle is an error code, not undefined behaviour.

use crate::exec::{Event, Stream};
use crate::jit::{Func, Module};
use cudarc::driver::sys::CUresult;
use emu::{Allocation, GlobalMemory};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

pub(crate) type Res<T = ()> = Result<T, CUresult>;

/// Streaming multiprocessors of a fake device (an H100/H200 SXM).
pub(crate) const SMS: u32 = 132;
/// Compute capability 9.0.
pub(crate) const SM_VERSION: u32 = 90;
pub(crate) const DRIVER_VERSION: i32 = 12080;
pub(crate) const TOTAL_MEM: usize = 80 << 30;
/// Shared memory a CTA may use without opting in, and with (227 KiB on Hopper).
pub(crate) const DEFAULT_SHARED: u32 = 48 * 1024;
pub(crate) const OPTIN_SHARED: u32 = 227 * 1024;
pub(crate) const NAME: &str = "ptxforge fakecuda (emulated sm_90a)";

/// Locks a mutex, ignoring poisoning (a panic elsewhere already became an error code).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Prints why a call failed when `PTXFORGE_FAKECUDA_TRACE=1`, and returns the code.
pub(crate) fn fail(code: CUresult, why: impl FnOnce() -> String) -> CUresult {
    static TRACE: OnceLock<bool> = OnceLock::new();
    if *TRACE.get_or_init(|| std::env::var("PTXFORGE_FAKECUDA_TRACE").is_ok_and(|v| v == "1")) {
        eprintln!("fakecuda: {code:?}: {}", why());
    }
    code
}

/// A context: a device's primary context, or the context view of a green context (an SM range).
pub(crate) struct Ctx {
    pub id: usize,
    pub dev: u32,
    pub sm_offset: u32,
    pub sm_count: u32,
    pub green: bool,
}

/// An SM range handed out by `cuDevResourceGenerateDesc`.
#[derive(Clone, Copy)]
pub(crate) struct Desc {
    pub dev: u32,
    pub offset: u32,
    pub count: u32,
}

/// A green context: its `CUcontext` view.
pub(crate) struct Green {
    pub ctx: Arc<Ctx>,
}

/// Per-device state.
pub(crate) struct DevState {
    /// A kernel fault makes the device's contexts unusable (a "sticky" error, as on CUDA).
    pub sticky: Mutex<Option<CUresult>>,
}

/// State of an active stream capture (see `exec`).
pub(crate) struct ActiveCapture {
    pub stream: usize,
    pub mode: u32,
    pub thread: std::thread::ThreadId,
}

pub(crate) struct Driver {
    pub mem: GlobalMemory,
    pub ndev: u32,
    next: AtomicUsize,
    pub primary: Vec<Arc<Ctx>>,
    pub devs: Vec<DevState>,
    pub ctxs: Mutex<HashMap<usize, Arc<Ctx>>>,
    pub allocs: Mutex<BTreeMap<u64, Arc<Allocation>>>,
    pub host: Mutex<HashMap<usize, std::alloc::Layout>>,
    pub modules: Mutex<HashMap<usize, Arc<Module>>>,
    pub funcs: Mutex<HashMap<usize, Arc<Func>>>,
    pub streams: Mutex<HashMap<usize, Arc<Stream>>>,
    pub events: Mutex<HashMap<usize, Arc<Event>>>,
    pub graphs: Mutex<HashMap<usize, Arc<Vec<crate::exec::Op>>>>,
    pub execs: Mutex<HashMap<usize, Arc<Vec<crate::exec::Op>>>>,
    pub greens: Mutex<HashMap<usize, Arc<Green>>>,
    pub descs: Mutex<HashMap<usize, Desc>>,
    pub links: Mutex<HashMap<usize, Arc<Mutex<crate::jit::Link>>>>,
    /// (context, peer context) pairs with peer access enabled.
    pub peers: Mutex<HashSet<(usize, usize)>>,
    pub captures: Mutex<Vec<ActiveCapture>>,
    /// Multicast objects, reserved ranges and multicast mappings.
    pub mc: crate::multicast::McTables,
}

static DRIVER: OnceLock<Driver> = OnceLock::new();
static INITIALISED: AtomicBool = AtomicBool::new(false);

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

impl Driver {
    fn new() -> Driver {
        let ndev = std::env::var("PTXFORGE_FAKECUDA_DEVICES")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .unwrap_or(2)
            .min(64);
        let d = Driver {
            mem: shareable_memory(),
            ndev,
            next: AtomicUsize::new(0x1000),
            primary: Vec::new(),
            devs: (0..ndev)
                .map(|_| DevState {
                    sticky: Mutex::new(None),
                })
                .collect(),
            ctxs: Default::default(),
            allocs: Default::default(),
            host: Default::default(),
            modules: Default::default(),
            funcs: Default::default(),
            streams: Default::default(),
            events: Default::default(),
            graphs: Default::default(),
            execs: Default::default(),
            greens: Default::default(),
            descs: Default::default(),
            links: Default::default(),
            peers: Default::default(),
            captures: Default::default(),
            mc: Default::default(),
        };
        let mut d = d;
        for dev in 0..ndev {
            let c = Arc::new(Ctx {
                id: d.new_id(),
                dev,
                sm_offset: 0,
                sm_count: SMS,
                green: false,
            });
            lock(&d.ctxs).insert(c.id, c.clone());
            d.primary.push(c);
        }
        d
    }

    /// A fresh handle value (never 0, never reused).
    pub fn new_id(&self) -> usize {
        self.next.fetch_add(0x10, Ordering::Relaxed)
    }
}

/// The fake device memory, set up as the emulator runtime sets up its own
/// (`runtime::storage::configure_from_env`): address slot `PTXFORGE_EMU_SLOT`, else `RANK`;
/// shared-memory allocations (so another process's fake driver can open them with
/// `cuIpcOpenMemHandle`) with `PTXFORGE_EMU_SHM=1`, or by default when `RANK` is set. Values
/// that do not parse leave the single-process defaults (with a `PTXFORGE_FAKECUDA_TRACE` note).
fn shareable_memory() -> GlobalMemory {
    let mem = GlobalMemory::new();
    let var = |k: &str| std::env::var(k).ok();
    if let Some(v) = var("PTXFORGE_EMU_SLOT").or_else(|| var("RANK")) {
        let r = v.trim().parse::<u32>().map_err(|e| e.to_string());
        if let Err(e) = r.and_then(|s| mem.set_address_slot(s).map_err(|e| e.to_string())) {
            fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                format!("address slot `{v}`: {e}")
            });
        }
    }
    let shared = match var("PTXFORGE_EMU_SHM").as_deref() {
        Some("1") => true,
        Some(_) => false,
        None => var("RANK").is_some(),
    };
    mem.set_shared_default(shared);
    mem
}

/// `cuInit`.
pub(crate) fn init(flags: u32) -> Res {
    if flags != 0 {
        return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
            "cuInit flags must be 0".into()
        }));
    }
    DRIVER.get_or_init(|| {
        // The host enqueues a collective's kernels one device at a time: quiescence may only
        // fast-forward emulated time while the host waits in a synchronising call.
        emu::clock::gate_fast_forward_on_host_waits();
        Driver::new()
    });
    INITIALISED.store(true, Ordering::Release);
    Ok(())
}

/// The driver, once `cuInit` has run.
pub(crate) fn drv() -> Res<&'static Driver> {
    if !INITIALISED.load(Ordering::Acquire) {
        return Err(CUresult::CUDA_ERROR_NOT_INITIALIZED);
    }
    DRIVER.get().ok_or(CUresult::CUDA_ERROR_NOT_INITIALIZED)
}

pub(crate) fn check_dev(d: &Driver, dev: i32) -> Res<u32> {
    if dev < 0 || dev as u32 >= d.ndev {
        return Err(fail(CUresult::CUDA_ERROR_INVALID_DEVICE, || {
            format!("device {dev} (there are {})", d.ndev)
        }));
    }
    Ok(dev as u32)
}

pub(crate) fn set_current(id: usize) {
    CURRENT.with(|c| c.set(id));
}

pub(crate) fn current_id() -> usize {
    CURRENT.with(|c| c.get())
}

/// The calling thread's current context (`CUDA_ERROR_INVALID_CONTEXT` if none, or if it was
/// destroyed).
pub(crate) fn current(d: &Driver) -> Res<Arc<Ctx>> {
    let id = current_id();
    if id == 0 {
        return Err(fail(CUresult::CUDA_ERROR_INVALID_CONTEXT, || {
            "no context is current on this thread".into()
        }));
    }
    lock(&d.ctxs).get(&id).cloned().ok_or_else(|| {
        fail(CUresult::CUDA_ERROR_INVALID_CONTEXT, || {
            format!("the current context {id:#x} was destroyed")
        })
    })
}

/// The device's sticky error, if a kernel faulted.
pub(crate) fn sticky(d: &Driver, dev: u32) -> Res {
    match *lock(&d.devs[dev as usize].sticky) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Fails calls that are not allowed while a stream capture is active (`cuMemAlloc`,
/// `cuCtxSynchronize`, ...: "potentially unsafe" calls), invalidating the capture as the driver
/// does: a global-mode capture forbids them on every thread, a thread-local one on its thread.
pub(crate) fn capture_guard(d: &Driver, what: &str) -> Res {
    let me = std::thread::current().id();
    let hit: Vec<usize> = lock(&d.captures)
        .iter()
        .filter(|c| {
            c.mode == cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL as u32
                || (c.mode
                    == cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
                        as u32
                    && c.thread == me)
        })
        .map(|c| c.stream)
        .collect();
    if hit.is_empty() {
        return Ok(());
    }
    for s in hit {
        if let Some(s) = lock(&d.streams).get(&s).cloned() {
            s.invalidate_capture();
        }
    }
    Err(fail(
        CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        || format!("{what} during a stream capture (the capture is invalidated)"),
    ))
}

/// Checks that `[addr, addr+len)` lies inside one live allocation.
pub(crate) fn check_range(d: &Driver, addr: u64, len: usize) -> Res<Arc<Allocation>> {
    let snap = d.mem.snapshot();
    snap.find(addr, len.max(1) as u64).cloned().ok_or_else(|| {
        fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
            format!("device range {addr:#x}+{len} is not inside one allocation")
        })
    })
}

/// Writes `v` through an out-pointer, `CUDA_ERROR_INVALID_VALUE` when it is null.
///
/// # Safety
/// `p` must be null or valid for a write of `T`.
pub(crate) unsafe fn out<T>(p: *mut T, v: T) -> Res {
    if p.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for writes per the caller's contract.
    unsafe { p.write_unaligned(v) };
    Ok(())
}
