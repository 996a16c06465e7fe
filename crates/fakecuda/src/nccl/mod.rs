//! A fake `libnccl.so` in the same library as the fake driver: NCCL's device pointers are the
//! fake driver's emulator addresses, so the two must share one emulator instance per process.
//! `scripts/fakecuda.sh` installs this cdylib as `libnccl.so` / `libnccl.so.2` next to
//! `libcuda.so`.
//!
//! Modelled: communicators across processes (TCP between ranks; [`net`]), point-to-point
//! `ncclSend`/`ncclRecv` inside `ncclGroupStart`/`ncclGroupEnd` (sends are matched to receives
//! in order per pair of ranks, as NCCL does), and `ncclAllReduce`, `ncclReduceScatter`,
//! `ncclAllGather` for every built-in type and reduction. Reductions are exact and
//! deterministic: contributions are folded in rank order 0..n-1 on every rank ([`reduce`]).
//!
//! Stream semantics: an operation first waits for the work queued on its stream (the legacy
//! stream: every stream of the communicator's device), then runs to completion on the calling
//! thread before the call returns — synchronous completion, which is one valid schedule of the
//! stream order a real NCCL gives. Collectives inside a group run at once (not deferred to
//! `ncclGroupEnd`); point-to-point operations are deferred to the group's end, where all sends
//! are queued before any receive waits, so grouped exchanges cannot deadlock.
//!
//! Faults: a communicator made with `ncclCommInitRankConfig` and `blocking = 0` is
//! non-blocking: its operations run in order on a worker thread of the communicator, the calls
//! return `ncclInProgress`, and `ncclCommGetAsyncError` says `ncclInProgress` until they are
//! done, then `ncclSuccess` or the first error (a peer lost mid-operation is
//! `ncclRemoteError` as soon as its connection closes, which for a dead process is at once;
//! a peer that hangs is only caught by the caller's timeout or `PTXFORGE_FAKENCCL_TIMEOUT`).
//! `ncclCommAbort` shuts the connections down, so an operation blocked on a peer fails at
//! once and the worker stops; queued operations are skipped.
//! A non-blocking init joins on the worker too (abortable while it waits for peers).
//! Not modelled: user reduction ops, `ncclCommSplit`, config attributes other than
//! `blocking`, registration, NVLS/CollNet.

mod net;
mod reduce;

use crate::exec;
use crate::state::drv;
use net::{Link, NetResult, COLL, INVALID_ARGUMENT, INVALID_USAGE, IN_PROGRESS, P2P, REMOTE_ERROR};
use reduce::{fold, Dtype, RedOp};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;

/// NCCL 2.27.3 (`NCCL_VERSION_CODE`).
const VERSION: c_int = 22703;
const UNHANDLED_CUDA_ERROR: i32 = 1;
const INTERNAL_ERROR: i32 = 3;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
pub struct NcclUniqueId {
    internal: [c_char; 128],
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One rank's communicator.
struct Comm {
    rank: usize,
    nranks: usize,
    dev: u32,
    /// Set once the ranks are connected (at init, or by a non-blocking init's worker).
    links: OnceLock<Vec<Option<Link>>>,
    /// Messages this rank sent to itself, in order.
    own: Mutex<VecDeque<Vec<u8>>>,
    /// Number of the next collective (frames carry it, so mismatched programs are detected).
    seq: AtomicU64,
    status: Arc<Status>,
    /// Non-blocking communicators (`ncclCommInitRankConfig`, `blocking = 0`) run their
    /// operations here; blocking ones on the calling thread.
    worker: Option<Worker>,
}

/// What `ncclCommGetAsyncError` reports: the first error, else `ncclInProgress` while
/// operations are queued or running on the worker.
#[derive(Default)]
struct Status {
    err: AtomicI32,
    pending: AtomicUsize,
    /// The first error's text (`ncclGetLastError` of the communicator).
    last: Mutex<String>,
    /// `ncclCommAbort` was called: a join still waiting for peers gives up.
    aborted: AtomicBool,
}

impl Status {
    fn fail(&self, (code, msg): (i32, String)) {
        if self
            .err
            .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            *lock(&self.last) = msg;
        }
    }
    fn code(&self) -> i32 {
        match self.err.load(Ordering::Acquire) {
            0 if self.pending.load(Ordering::Acquire) > 0 => IN_PROGRESS,
            e => e,
        }
    }
}

type Job = Box<dyn FnOnce() -> NetResult<()> + Send>;

/// The thread of a non-blocking communicator: runs its operations in order; after the first
/// error it skips the rest (the communicator must be aborted, as with NCCL).
struct Worker {
    tx: Mutex<Option<Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Worker {
    fn start(status: Arc<Status>) -> NetResult<Worker> {
        let (tx, rx) = channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("fakenccl-worker".into())
            .spawn(move || {
                for job in rx {
                    if status.err.load(Ordering::Acquire) == 0 {
                        if let Err(e) = job() {
                            status.fail(e);
                        }
                    }
                    status.pending.fetch_sub(1, Ordering::AcqRel);
                }
            })
            .map_err(|e| (net::SYSTEM_ERROR, format!("spawn a worker thread: {e}")))?;
        Ok(Worker {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }
    /// Lets the thread finish what is queued (skipped after an error), then joins it.
    fn stop(&self) {
        lock(&self.tx).take();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

impl Comm {
    fn link(&self, peer: usize) -> NetResult<&Link> {
        let links = self.links.get().ok_or((
            INVALID_USAGE,
            "the communicator has not finished joining".to_string(),
        ))?;
        links.get(peer).and_then(|l| l.as_ref()).ok_or((
            INVALID_ARGUMENT,
            format!("peer {peer} of {} ranks", self.nranks),
        ))
    }
    /// Records a lost peer as the communicator's asynchronous error.
    fn note<T>(&self, r: NetResult<T>) -> NetResult<T> {
        if let Err(e @ (REMOTE_ERROR, _)) = &r {
            self.status.fail(e.clone());
        }
        r
    }
}

/// Runs operation `job` of `c`: now on a blocking communicator; on a non-blocking one it is
/// queued to the worker and the call returns `ncclInProgress` (its outcome is the
/// communicator's asynchronous error, as a real NCCL reports a failed kernel or proxy).
fn submit(c: &Comm, job: impl FnOnce() -> NetResult<()> + Send + 'static) -> NetResult<()> {
    let Some(w) = &c.worker else {
        return job();
    };
    let e = c.status.err.load(Ordering::Acquire);
    if e != 0 {
        let why = lock(&c.status.last).clone();
        return Err((
            e,
            format!("the communicator failed earlier ({why}); abort it"),
        ));
    }
    c.status.pending.fetch_add(1, Ordering::AcqRel);
    let queued = lock(&w.tx).as_ref().map(|t| t.send(Box::new(job)));
    if !matches!(queued, Some(Ok(()))) {
        c.status.pending.fetch_sub(1, Ordering::AcqRel);
        return Err((INVALID_USAGE, "the communicator is being destroyed".into()));
    }
    Err((IN_PROGRESS, String::new()))
}

fn comms() -> &'static Mutex<HashMap<usize, Arc<Comm>>> {
    static C: OnceLock<Mutex<HashMap<usize, Arc<Comm>>>> = OnceLock::new();
    C.get_or_init(Default::default)
}

fn comm_of(h: *mut c_void) -> NetResult<Arc<Comm>> {
    lock(comms())
        .get(&(h as usize))
        .cloned()
        .ok_or((INVALID_ARGUMENT, format!("communicator {h:p}")))
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
    static GROUP: RefCell<(u32, Vec<P2p>)> = const { RefCell::new((0, Vec::new())) };
}

/// Runs an entry point: errors are remembered for `ncclGetLastError` (and printed with
/// `PTXFORGE_FAKECUDA_TRACE=1` or `NCCL_DEBUG` set); a panic becomes `ncclInternalError`.
fn entry(name: &str, f: impl FnOnce() -> NetResult<()>) -> c_int {
    let (code, msg) = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => return 0,
        Ok(Err((IN_PROGRESS, _))) => return IN_PROGRESS,
        Ok(Err(e)) => e,
        Err(_) => (INTERNAL_ERROR, "internal error (panic)".to_string()),
    };
    let text = format!("{name}: {msg}");
    if std::env::var_os("PTXFORGE_FAKECUDA_TRACE").is_some_and(|v| v == "1")
        || std::env::var_os("NCCL_DEBUG").is_some()
    {
        eprintln!("fakenccl: {text}");
    }
    LAST.with(|l| *l.borrow_mut() = CString::new(text).unwrap_or_default());
    code
}

/// # Safety
/// `p` must be null or valid for a write of `T`.
unsafe fn out<T>(p: *mut T, v: T) -> NetResult<()> {
    if p.is_null() {
        return Err((INVALID_ARGUMENT, "null output pointer".into()));
    }
    // SAFETY: non-null and valid for writes per the caller's contract.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

fn driver() -> NetResult<&'static crate::state::Driver> {
    drv().map_err(|_| {
        (
            UNHANDLED_CUDA_ERROR,
            "the CUDA driver is not initialised".into(),
        )
    })
}

fn read_dev(ptr: usize, len: usize) -> NetResult<Vec<u8>> {
    let mut v = vec![0u8; len];
    if len > 0 {
        let snap = driver()?.mem.snapshot();
        let a = snap.find(ptr as u64, len as u64).ok_or_else(|| {
            (
                INVALID_ARGUMENT,
                format!("device range {ptr:#x}+{len} is not allocated"),
            )
        })?;
        a.read_bytes(ptr as u64 - a.base, &mut v);
    }
    Ok(v)
}

fn write_dev(ptr: usize, data: &[u8]) -> NetResult<()> {
    if !data.is_empty() {
        let snap = driver()?.mem.snapshot();
        let len = data.len();
        let a = snap.find(ptr as u64, len as u64).ok_or_else(|| {
            (
                INVALID_ARGUMENT,
                format!("device range {ptr:#x}+{len} is not allocated"),
            )
        })?;
        a.write_bytes(ptr as u64 - a.base, data);
    }
    Ok(())
}

/// Waits for the work queued before this operation in stream order.
fn settle(c: &Comm, stream: usize) -> NetResult<()> {
    let d = driver()?;
    match exec::stream(d, stream) {
        Ok(Some(s)) => s.drain(),
        Ok(None) => exec::drain_device(d, c.dev),
        Err(_) => return Err((INVALID_ARGUMENT, format!("stream {stream:#x}"))),
    }
    Ok(())
}

fn bytes_of(count: usize, dt: u32) -> NetResult<(Dtype, usize)> {
    let t = Dtype::from_raw(dt).ok_or((INVALID_ARGUMENT, format!("datatype {dt}")))?;
    let n = count
        .checked_mul(t.size())
        .ok_or((INVALID_ARGUMENT, format!("count {count} overflows")))?;
    Ok((t, n))
}

// ---------------------------------------------------------------------------------------------
// Version, errors, unique ids, communicators

#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> c_int {
    // SAFETY: out-pointer from the caller.
    entry("ncclGetVersion", || unsafe { out(version, VERSION) })
}

#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: c_int) -> *const c_char {
    let s: &'static std::ffi::CStr = match result {
        0 => c"no error",
        1 => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        2 => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        3 => c"internal error - please report this issue to the NCCL developers",
        4 => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        5 => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        6 => c"remote process exited or there was a network error",
        7 => c"NCCL operation in progress",
        _ => c"unknown result code",
    };
    s.as_ptr()
}

/// The communicator's asynchronous error text when it has one, else this thread's last error.
#[no_mangle]
pub extern "C" fn ncclGetLastError(comm: *mut c_void) -> *const c_char {
    let async_text = comm_of(comm)
        .ok()
        .filter(|c| c.status.err.load(Ordering::Acquire) != 0)
        .map(|c| lock(&c.status.last).clone());
    LAST.with(|l| {
        if let Some(t) = async_text {
            *l.borrow_mut() = CString::new(t).unwrap_or_default();
        }
        l.borrow().as_ptr()
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(id: *mut NcclUniqueId) -> c_int {
    entry("ncclGetUniqueId", || {
        let bytes = net::new_id()?;
        let mut u = NcclUniqueId { internal: [0; 128] };
        for (o, b) in u.internal.iter_mut().zip(bytes) {
            *o = b as c_char;
        }
        // SAFETY: out-pointer from the caller.
        unsafe { out(id, u) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut *mut c_void,
    nranks: c_int,
    id: NcclUniqueId,
    rank: c_int,
) -> c_int {
    // SAFETY: out-pointer from the caller.
    entry("ncclCommInitRank", || unsafe {
        init(comm, nranks, &id, rank, true)
    })
}

/// `ncclCommInitRankConfig`: only the config's `blocking` is honoured. Non-blocking: the
/// ranks connect on the communicator's worker thread (the call returns `ncclInProgress`, the
/// handle already set; `ncclCommGetAsyncError` tells when it is done), and `ncclCommAbort`
/// stops a join still waiting for peers.
///
/// # Safety
/// `config` must be null or point to an `ncclConfig_t` of at least its `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut *mut c_void,
    nranks: c_int,
    id: NcclUniqueId,
    rank: c_int,
    config: *const c_void,
) -> c_int {
    entry("ncclCommInitRankConfig", || {
        // SAFETY: the caller's config pointer (null or a live ncclConfig_t).
        let blocking = unsafe { config_blocking(config.cast()) }?;
        // SAFETY: out-pointer from the caller.
        unsafe { init(comm, nranks, &id, rank, blocking) }
    })
}

/// The `blocking` attribute of an `ncclConfig_t` (layout: size_t size, u32 magic, u32 version,
/// int blocking, ...); unset (`NCCL_CONFIG_UNDEF_INT`), absent or pre-2.14: blocking.
///
/// # Safety
/// `cfg` must be null or point to at least its `size` readable bytes.
unsafe fn config_blocking(cfg: *const u8) -> NetResult<bool> {
    if cfg.is_null() {
        return Ok(true);
    }
    // SAFETY: every ncclConfig_t starts with size, magic and version (16 bytes).
    let (size, magic, version) = unsafe {
        (
            cfg.cast::<usize>().read_unaligned(),
            cfg.add(8).cast::<u32>().read_unaligned(),
            cfg.add(12).cast::<u32>().read_unaligned(),
        )
    };
    if magic != 0xcafe_beef {
        return Err((
            INVALID_ARGUMENT,
            "ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER".into(),
        ));
    }
    if size < 20 || version < 21400 {
        return Ok(true);
    }
    // SAFETY: `size` covers the blocking attribute at offset 16.
    let b = unsafe { cfg.add(16).cast::<i32>().read_unaligned() };
    Ok(b != 0)
}

/// Joins the communicator and stores its handle in `*comm`.
///
/// # Safety
/// `comm` must be null or valid for a write of a pointer.
unsafe fn init(
    comm: *mut *mut c_void,
    nranks: c_int,
    id: &NcclUniqueId,
    rank: c_int,
    blocking: bool,
) -> NetResult<()> {
    if nranks < 1 || rank < 0 || rank >= nranks {
        return Err((INVALID_ARGUMENT, format!("rank {rank} of nranks {nranks}")));
    }
    let d = driver()?;
    let dev = crate::state::current(d)
        .map_err(|_| {
            (
                UNHANDLED_CUDA_ERROR,
                "no current CUDA context on this thread (set the device first)".to_string(),
            )
        })?
        .dev;
    let raw: [u8; 128] = std::array::from_fn(|i| id.internal[i] as u8);
    let parsed = net::parse_id(&raw)?;
    let (nranks, rank) = (nranks as usize, rank as usize);
    static NEXT: AtomicUsize = AtomicUsize::new(0x5000);
    let h = NEXT.fetch_add(0x10, Ordering::Relaxed);
    let status = Arc::new(Status::default());
    let worker = if blocking {
        None
    } else {
        Some(Worker::start(status.clone())?)
    };
    let c = Comm {
        rank,
        nranks,
        dev,
        links: OnceLock::new(),
        own: Mutex::default(),
        seq: AtomicU64::new(0),
        status,
        worker,
    };
    let c = Arc::new(c);
    lock(comms()).insert(h, c.clone());
    // SAFETY: out-pointer from the caller; NCCL sets the handle before a non-blocking init
    // completes too.
    unsafe { out(comm, h as *mut c_void) }?;
    let c2 = c.clone();
    let joined = submit(&c, move || {
        let links = net::connect_all(&parsed, nranks, rank, &c2.status.aborted)?;
        c2.links
            .set(links)
            .map_err(|_| (INTERNAL_ERROR, "joined twice".to_string()))
    });
    if let Err((code, _)) = &joined {
        if *code != IN_PROGRESS {
            lock(comms()).remove(&h); // a failed blocking init leaves no communicator
        }
    }
    joined
}

/// Destroy (`flush`: queued operations finish, queued frames are sent) or abort (receives
/// blocked on a peer fail at once, queued operations are skipped, frames dropped).
fn close(comm: *mut c_void, flush: bool) -> NetResult<()> {
    let c = lock(comms())
        .remove(&(comm as usize))
        .ok_or((INVALID_ARGUMENT, format!("communicator {comm:p}")))?;
    let links = || c.links.get().into_iter().flatten().flatten();
    if !flush {
        c.status.aborted.store(true, Ordering::Release);
        c.status
            .fail((REMOTE_ERROR, "the communicator was aborted".into()));
        links().for_each(Link::interrupt);
    }
    if let Some(w) = &c.worker {
        w.stop();
    }
    links().for_each(|l| l.close(flush));
    Ok(())
}

#[no_mangle]
pub extern "C" fn ncclCommDestroy(comm: *mut c_void) -> c_int {
    entry("ncclCommDestroy", || close(comm, true))
}

#[no_mangle]
pub extern "C" fn ncclCommAbort(comm: *mut c_void) -> c_int {
    entry("ncclCommAbort", || close(comm, false))
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(comm: *mut c_void, err: *mut c_int) -> c_int {
    entry("ncclCommGetAsyncError", || {
        let c = comm_of(comm)?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(err, c.status.code()) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(comm: *mut c_void, count: *mut c_int) -> c_int {
    entry("ncclCommCount", || {
        let c = comm_of(comm)?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(count, c.nranks as c_int) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(comm: *mut c_void, rank: *mut c_int) -> c_int {
    entry("ncclCommUserRank", || {
        let c = comm_of(comm)?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(rank, c.rank as c_int) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(comm: *mut c_void, device: *mut c_int) -> c_int {
    entry("ncclCommCuDevice", || {
        let c = comm_of(comm)?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(device, c.dev as c_int) }
    })
}

// ---------------------------------------------------------------------------------------------
// Groups and point-to-point

/// A send or receive waiting for its group's end.
struct P2p {
    comm: Arc<Comm>,
    send: bool,
    ptr: usize,
    bytes: usize,
    peer: usize,
    stream: usize,
}

#[no_mangle]
pub extern "C" fn ncclGroupStart() -> c_int {
    entry("ncclGroupStart", || {
        GROUP.with(|g| g.borrow_mut().0 += 1);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> c_int {
    entry("ncclGroupEnd", || {
        let ops = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.0 == 0 {
                return Err((INVALID_USAGE, "ncclGroupEnd without ncclGroupStart".into()));
            }
            g.0 -= 1;
            Ok(if g.0 == 0 {
                std::mem::take(&mut g.1)
            } else {
                Vec::new()
            })
        })?;
        run_group(ops)
    })
}

/// Runs a group's point-to-point operations: on their communicator's worker when they share
/// one non-blocking communicator.
fn run_group(ops: Vec<P2p>) -> NetResult<()> {
    match ops.first().map(|o| o.comm.clone()) {
        Some(c) if ops.iter().all(|o| Arc::ptr_eq(&o.comm, &c)) => submit(&c, move || run_p2p(ops)),
        _ => run_p2p(ops),
    }
}

/// Queues every send, then completes every receive in order.
fn run_p2p(ops: Vec<P2p>) -> NetResult<()> {
    for o in ops.iter().filter(|o| o.send) {
        settle(&o.comm, o.stream)?;
        let data = read_dev(o.ptr, o.bytes)?;
        if o.peer == o.comm.rank {
            lock(&o.comm.own).push_back(data);
        } else {
            o.comm.note(o.comm.link(o.peer)?.send(P2P, 0, &data))?;
        }
    }
    for o in ops.iter().filter(|o| !o.send) {
        settle(&o.comm, o.stream)?;
        let data = if o.peer == o.comm.rank {
            lock(&o.comm.own).pop_front().ok_or((
                INVALID_USAGE,
                "a receive from self with no send to self".into(),
            ))?
        } else {
            o.comm.note(o.comm.link(o.peer)?.recv(P2P, 0, o.bytes))?
        };
        if data.len() != o.bytes {
            return Err((
                INVALID_USAGE,
                format!(
                    "a send of {} bytes matched a receive of {}",
                    data.len(),
                    o.bytes
                ),
            ));
        }
        write_dev(o.ptr, &data)?;
    }
    Ok(())
}

/// Defers `op` to the group's end (a call outside a group is a group of one).
fn p2p(op: P2p) -> NetResult<()> {
    if op.peer >= op.comm.nranks {
        return Err((
            INVALID_ARGUMENT,
            format!("peer {} of {} ranks", op.peer, op.comm.nranks),
        ));
    }
    let alone = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 == 0 {
            return Some(op);
        }
        g.1.push(op);
        None
    });
    match alone {
        Some(op) => run_group(vec![op]),
        None => Ok(()),
    }
}

/// `ncclSend` (`send`) or `ncclRecv` of `count` elements of type `dt` with rank `peer`.
fn p2p_call(
    send: bool,
    ptr: usize,
    (count, dt, peer): (usize, u32, c_int),
    comm: *mut c_void,
    stream: usize,
) -> NetResult<()> {
    let (_, bytes) = bytes_of(count, dt)?;
    p2p(P2p {
        comm: comm_of(comm)?,
        send,
        ptr,
        bytes,
        peer: usize::try_from(peer).map_err(|_| (INVALID_ARGUMENT, "peer".to_string()))?,
        stream,
    })
}

#[no_mangle]
pub extern "C" fn ncclSend(
    buf: *const c_void,
    count: usize,
    dt: u32,
    peer: c_int,
    comm: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    entry("ncclSend", || {
        p2p_call(true, buf as usize, (count, dt, peer), comm, stream as usize)
    })
}

#[no_mangle]
pub extern "C" fn ncclRecv(
    buf: *mut c_void,
    count: usize,
    dt: u32,
    peer: c_int,
    comm: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    entry("ncclRecv", || {
        p2p_call(
            false,
            buf as usize,
            (count, dt, peer),
            comm,
            stream as usize,
        )
    })
}

// ---------------------------------------------------------------------------------------------
// Collectives

/// Sends `part(q)` to every peer q and returns every rank's part for this rank, in rank order
/// (this rank's own from `part(rank)`).
fn exchange<'a>(c: &Comm, part: impl Fn(usize) -> &'a [u8], len: usize) -> NetResult<Vec<Vec<u8>>> {
    let seq = c.seq.fetch_add(1, Ordering::Relaxed);
    for q in (0..c.nranks).filter(|&q| q != c.rank) {
        c.note(c.link(q)?.send(COLL, seq, part(q)))?;
    }
    (0..c.nranks)
        .map(|q| {
            if q == c.rank {
                Ok(part(q).to_vec())
            } else {
                c.note(c.link(q)?.recv(COLL, seq, len))
            }
        })
        .collect()
}

fn reduce_parts(dt: Dtype, op: u32, parts: &[Vec<u8>]) -> NetResult<Vec<u8>> {
    let op = RedOp::from_raw(op).ok_or((INVALID_ARGUMENT, format!("reduction op {op}")))?;
    fold(dt, op, parts).ok_or((INVALID_ARGUMENT, format!("no reduction for {dt:?}")))
}

/// The common part of the collectives: this rank's `send_bytes` at `send` go through
/// [`exchange`] (`part(mine, q)` is peer q's share) and `finish(parts)` makes what lands at
/// `recv`, in stream order (see [`submit`] for when it runs).
struct Coll {
    send: usize,
    recv: usize,
    send_bytes: usize,
    part_bytes: usize,
    stream: usize,
}

impl Coll {
    /// `send_bytes` from `send`, peers' shares of `part_bytes`, the result at `recv`.
    fn new(
        (send, recv): (*const c_void, *mut c_void),
        send_bytes: usize,
        part_bytes: usize,
        stream: *mut c_void,
    ) -> Coll {
        Coll {
            send: send as usize,
            recv: recv as usize,
            send_bytes,
            part_bytes,
            stream: stream as usize,
        }
    }
}

fn collective(
    c: Arc<Comm>,
    k: Coll,
    part: fn(&[u8], usize, usize) -> &[u8],
    finish: impl FnOnce(&[Vec<u8>]) -> NetResult<Vec<u8>> + Send + 'static,
) -> NetResult<()> {
    let c2 = c.clone();
    submit(&c, move || {
        settle(&c2, k.stream)?;
        let mine = read_dev(k.send, k.send_bytes)?;
        let parts = exchange(&c2, |q| part(&mine, q, k.part_bytes), k.part_bytes)?;
        write_dev(k.recv, &finish(&parts)?)
    })
}

/// Every peer gets the whole buffer (all-reduce, all-gather).
fn whole(mine: &[u8], _q: usize, _n: usize) -> &[u8] {
    mine
}

/// Peer q gets block q (reduce-scatter).
fn block(mine: &[u8], q: usize, n: usize) -> &[u8] {
    &mine[q * n..(q + 1) * n]
}

#[no_mangle]
pub extern "C" fn ncclAllReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dt: u32,
    op: u32,
    comm: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    entry("ncclAllReduce", || {
        let (t, bytes) = bytes_of(count, dt)?;
        let k = Coll::new((send, recv), bytes, bytes, stream);
        collective(comm_of(comm)?, k, whole, move |p| reduce_parts(t, op, p))
    })
}

#[no_mangle]
pub extern "C" fn ncclReduceScatter(
    send: *const c_void,
    recv: *mut c_void,
    recvcount: usize,
    dt: u32,
    op: u32,
    comm: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    entry("ncclReduceScatter", || {
        let c = comm_of(comm)?;
        let (t, bytes) = bytes_of(recvcount, dt)?;
        let total = bytes
            .checked_mul(c.nranks)
            .ok_or((INVALID_ARGUMENT, "recvcount overflows".to_string()))?;
        let k = Coll::new((send, recv), total, bytes, stream);
        collective(c, k, block, move |p| reduce_parts(t, op, p))
    })
}

#[no_mangle]
pub extern "C" fn ncclAllGather(
    send: *const c_void,
    recv: *mut c_void,
    sendcount: usize,
    dt: u32,
    comm: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    entry("ncclAllGather", || {
        let (_, bytes) = bytes_of(sendcount, dt)?;
        let k = Coll::new((send, recv), bytes, bytes, stream);
        collective(comm_of(comm)?, k, whole, |p| Ok(p.concat()))
    })
}
