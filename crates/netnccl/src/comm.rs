//! Communicators and the data-parallel collectives.
//!
//! Calls are synchronous from the caller's view: each waits for the device's queued work
//! (`Device::synchronize`, which also makes the device's context current on this thread, as
//! NCCL requires), issues the NCCL call on the legacy default stream, and polls until it
//! completed: `ncclCommGetAsyncError` (still `ncclInProgress` while a non-blocking
//! communicator enqueues; an error once a peer is lost) and then a marker event recorded on
//! the NULL stream. An error or [`Comm::timeout`] without completion aborts the communicator
//! (`ncclCommAbort`) and is [`NcclError::Aborted`] naming the operation, so a dead or hung
//! peer never leaves the caller blocked inside NCCL. Reductions on the fake NCCL are
//! deterministic (rank order); a real NCCL's are deterministic for a fixed topology and
//! algorithm choice but not specified.

use crate::api::{api, Api, NcclConfig, IN_PROGRESS};
use crate::api::{NcclComm, NcclDataType, NcclRedOp, NcclUniqueId};
use crate::{NcclError, Result};
use runtime::{Backend, Buffer, Device, Pod};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The 128-byte id every rank of a communicator passes to `ncclCommInitRank`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UniqueId(pub [u8; 128]);

impl UniqueId {
    /// A fresh id (`ncclGetUniqueId`); rank 0 makes it and shares it.
    pub fn new() -> Result<UniqueId> {
        let a = api()?;
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: out-pointer to a local of NCCL's layout.
        let r = unsafe { (a.get_unique_id)(&mut id) };
        a.check("ncclGetUniqueId", r, std::ptr::null_mut())?;
        Ok(UniqueId(std::array::from_fn(|i| id.internal[i] as u8)))
    }

    /// From the bytes of [`UniqueId::0`] (e.g. received from rank 0).
    pub fn from_bytes(b: &[u8]) -> Result<UniqueId> {
        let a: [u8; 128] = b.try_into().map_err(|_| NcclError::Invalid {
            field: "unique id",
            why: format!("{} bytes, an NCCL unique id has 128", b.len()),
        })?;
        Ok(UniqueId(a))
    }
}

/// Element types NCCL moves and reduces.
pub trait NcclElem: Pod {
    const NCCL_TYPE: NcclDataType;
}

macro_rules! elem {
    ($($t:ty => $d:literal),*) => {$(
        impl NcclElem for $t { const NCCL_TYPE: NcclDataType = $d; }
    )*};
}
// ncclInt8 = 0, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64, ncclFloat16,
// ncclFloat32, ncclFloat64, ncclBfloat16 = 9 (nccl.h, 2.10+)
elem!(i8 => 0, u8 => 1, i32 => 2, u32 => 3, i64 => 4, u64 => 5, half::f16 => 6, f32 => 7,
      f64 => 8, half::bf16 => 9);
const NCCL_UINT8: NcclDataType = 1;

/// Built-in reductions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
}

impl ReduceOp {
    fn raw(self) -> NcclRedOp {
        match self {
            // ncclSum = 0, ncclProd, ncclMax, ncclMin, ncclAvg = 4
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Avg => 4,
        }
    }
}

/// How long an operation may take before the communicator is aborted: `PTXFORGE_NCCL_TIMEOUT`
/// seconds, else 10 minutes (NCCL's and PyTorch's usual collective timeout: a peer still busy
/// with its compute before the collective is not dead).
pub fn default_timeout() -> Duration {
    std::env::var("PTXFORGE_NCCL_TIMEOUT")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v > 0.0 && *v <= 1e6)
        .map(Duration::from_secs_f64)
        .unwrap_or(Duration::from_secs(600))
}

/// Longest pause between two completion polls.
const POLL_MAX: Duration = Duration::from_millis(1);

type Guard<'a> = std::sync::MutexGuard<'a, usize>;

/// One rank's NCCL communicator on one CUDA device. Destroyed on drop (`ncclCommDestroy`);
/// [`Comm::abort`] tears it down without waiting for peers, and every operation that fails or
/// outlives [`Comm::timeout`] aborts it and returns [`NcclError::Aborted`].
///
/// Non-blocking (`ncclCommInitRankConfig` with `blocking = 0`, NCCL 2.14+) where the library
/// has it: no NCCL call then blocks the caller (init and enqueue return `ncclInProgress`), so
/// a dead or hung peer is met by polling `ncclCommGetAsyncError` and a marker event on the
/// stream, never by a thread stuck inside NCCL.
pub struct Comm {
    /// `NcclComm` as an address, so the type is `Send` (a communicator may be used from any
    /// thread, one thread at a time: the mutex serialises the `&self` methods); 0 once aborted.
    raw: std::sync::Mutex<usize>,
    rank: u32,
    nranks: u32,
    device: Device,
    api: &'static Api,
    nonblocking: bool,
    timeout_ns: AtomicU64,
}

impl Comm {
    /// `ncclCommInitRank(Config)` on `device` (must be a CUDA device); collective over all
    /// ranks. Waits at most [`default_timeout`] for the other ranks.
    pub fn init(device: &Device, id: &UniqueId, rank: u32, nranks: u32) -> Result<Comm> {
        Comm::init_with(device, id, (rank, nranks), default_timeout())
    }

    /// [`Comm::init`] with the communicator's [`Comm::timeout`]: a non-blocking init that has
    /// not completed by then (a rank missing) is aborted, [`NcclError::Aborted`] of `init`.
    pub fn init_with(
        device: &Device,
        id: &UniqueId,
        (rank, nranks): (u32, u32),
        timeout: Duration,
    ) -> Result<Comm> {
        let api = api()?;
        if device.backend() != Backend::Cuda {
            return Err(NcclError::Invalid {
                field: "device",
                why: "NCCL needs a CUDA device, not an emulated one".into(),
            });
        }
        if nranks == 0 || rank >= nranks || nranks > i32::MAX as u32 {
            return Err(NcclError::Invalid {
                field: "rank",
                why: format!("rank {rank} of {nranks} ranks"),
            });
        }
        device.synchronize()?; // makes the device's context current on this thread
        let mut raw: NcclComm = std::ptr::null_mut();
        let uid = || NcclUniqueId {
            internal: std::array::from_fn(|i| id.0[i] as std::ffi::c_char),
        };
        let (n, r) = (nranks as i32, rank as i32);
        let (call, code, nonblocking) = match api.comm_init_rank_config {
            Some(f) => {
                let mut cfg = NcclConfig::new(false);
                // SAFETY: out-pointer to a local; the id by value as nccl.h declares; the config
                // is a live NCCL 2.14 ncclConfig_t (NCCL reads `size` bytes of it).
                let code = unsafe { f(&mut raw, n, uid(), r, &mut cfg) };
                ("ncclCommInitRankConfig", code, true)
            }
            // SAFETY: out-pointer to a local; the id is passed by value as nccl.h declares.
            None => (
                "ncclCommInitRank",
                unsafe { (api.comm_init_rank)(&mut raw, n, uid(), r) },
                false,
            ),
        };
        if code != 0 && !(nonblocking && code == IN_PROGRESS) {
            if !raw.is_null() {
                // SAFETY: the half-made communicator NCCL returned; never used again.
                let _ = unsafe { (api.comm_abort)(raw) };
            }
            return Err(api.call_error(call, code, std::ptr::null_mut()));
        }
        let comm = Comm {
            raw: std::sync::Mutex::new(raw as usize),
            rank,
            nranks,
            device: device.clone(),
            api,
            nonblocking,
            timeout_ns: AtomicU64::new(0),
        };
        comm.set_timeout(timeout);
        let mut g = comm.lock();
        comm.settle("init", call, raw, &mut g, false)?;
        drop(g);
        Ok(comm)
    }

    /// The communicator of a `dist` job: rank 0 makes the id, every rank gets it through the
    /// store's `all_gather`, and all ranks join (one rank per process).
    pub fn bootstrap(group: &dist::Group, device: &Device) -> Result<Comm> {
        let mine = if group.rank() == 0 {
            UniqueId::new()?.0.to_vec()
        } else {
            Vec::new()
        };
        let all = group.all_gather(&mine)?;
        let id = UniqueId::from_bytes(all.first().map(Vec::as_slice).unwrap_or_default())?;
        Comm::init(device, &id, group.rank() as u32, group.world_size() as u32)
    }

    /// How long one operation may take before the communicator is aborted.
    pub fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Ordering::Relaxed))
    }

    /// Sets [`Comm::timeout`] (default [`default_timeout`]).
    pub fn set_timeout(&self, d: Duration) {
        let ns = d.as_nanos().clamp(1, u64::MAX as u128) as u64;
        self.timeout_ns.store(ns, Ordering::Relaxed);
    }

    /// True when the communicator is non-blocking (NCCL 2.14+).
    pub fn nonblocking(&self) -> bool {
        self.nonblocking
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }
    pub fn nranks(&self) -> u32 {
        self.nranks
    }
    pub fn device(&self) -> &Device {
        &self.device
    }

    fn lock(&self) -> Guard<'_> {
        self.raw.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` (the NCCL calls of operation `op`, `call` naming the last) after the device's
    /// queued work and waits for it to complete (see [`Comm::settle`]).
    fn run(
        &self,
        op: &'static str,
        call: &'static str,
        f: impl FnOnce(&Api, NcclComm) -> i32,
    ) -> Result<()> {
        let mut g = self.lock();
        let raw = self.live(op, &g)?;
        self.device.synchronize()?;
        let code = f(self.api, raw);
        if code != 0 && !(self.nonblocking && code == IN_PROGRESS) {
            let e = self.api.call_error(call, code, raw);
            return Err(self.fail(op, e.to_string(), &mut g));
        }
        self.settle(op, call, raw, &mut g, true)
    }

    /// The communicator, or [`NcclError::Aborted`] once an earlier failure aborted it.
    fn live(&self, op: &'static str, g: &Guard<'_>) -> Result<NcclComm> {
        match **g {
            0 => Err(NcclError::Aborted {
                op,
                peer: None,
                why: "an earlier failure already aborted the communicator".into(),
            }),
            raw => Ok(raw as NcclComm),
        }
    }

    /// Waits until operation `op` completed: `ncclCommGetAsyncError` leaves `ncclInProgress`
    /// (the enqueue finished) and, with `stream`, a marker event recorded on the NULL stream
    /// after it completes. An asynchronous error (a lost peer, mismatched ranks) or no
    /// completion within [`Comm::timeout`] aborts the communicator.
    fn settle(
        &self,
        op: &'static str,
        call: &'static str,
        raw: NcclComm,
        g: &mut Guard<'_>,
        stream: bool,
    ) -> Result<()> {
        let timeout = self.timeout();
        let deadline = Instant::now() + timeout;
        let mut marker: Option<runtime::Event> = None;
        let mut pause = Duration::from_micros(20);
        loop {
            let mut code = 0;
            // SAFETY: our live communicator; out-pointer to a local.
            let r = unsafe { (self.api.comm_get_async_error)(raw, &mut code) };
            let code = if r != 0 { r } else { code };
            match code {
                0 if !stream => return Ok(()),
                0 => {
                    if marker.is_none() {
                        marker = Some(runtime::Event::legacy(&self.device)?);
                    }
                    if marker.as_ref().is_some_and(runtime::Event::is_complete) {
                        return Ok(());
                    }
                }
                IN_PROGRESS => {}
                c => {
                    let e = self.api.call_error(call, c, raw);
                    return Err(self.fail(op, e.to_string(), g));
                }
            }
            if Instant::now() >= deadline {
                let why = format!(
                    "{call} did not complete within {timeout:?} (a peer died or hangs, or did \
                     not reach the operation)"
                );
                return Err(self.fail(op, why, g));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(POLL_MAX);
        }
    }

    /// Aborts the communicator (`ncclCommAbort`: its kernels and proxy threads stop without
    /// waiting for peers) and returns the error of `op`.
    fn fail(&self, op: &'static str, why: String, g: &mut Guard<'_>) -> NcclError {
        let raw = **g as NcclComm;
        // SAFETY: the caller holds the lock: `g` is our communicator, not yet aborted.
        let aborted = unsafe { (self.api.comm_abort)(raw) };
        **g = 0; // never used again: later calls fail, Drop does not destroy it
        let why = if aborted == 0 {
            why
        } else {
            format!("{why} (and ncclCommAbort returned {aborted})")
        };
        NcclError::Aborted {
            op,
            peer: peer_named(&why),
            why,
        }
    }

    fn same_device<T: Pod>(&self, field: &'static str, b: &Buffer<T>) -> Result<()> {
        if b.device().same(&self.device) {
            Ok(())
        } else {
            Err(NcclError::Invalid {
                field,
                why: "the buffer is not on the communicator's device".into(),
            })
        }
    }

    fn check_len(field: &'static str, got: usize, want: usize) -> Result<()> {
        if got == want {
            Ok(())
        } else {
            Err(NcclError::Invalid {
                field,
                why: format!("{got} elements, expected {want}"),
            })
        }
    }

    /// Checks that both buffers are on the communicator's device and of the (send, recv)
    /// lengths `want`; returns their device addresses.
    fn operands<T: Pod>(
        &self,
        send: &Buffer<T>,
        recv: &Buffer<T>,
        want: (usize, usize),
    ) -> Result<(u64, u64)> {
        self.same_device("send", send)?;
        self.same_device("recv", recv)?;
        Self::check_len("send", send.len(), want.0)?;
        Self::check_len("recv", recv.len(), want.1)?;
        Ok((send.device_ptr(), recv.device_ptr()))
    }

    /// `recv = op over ranks of send` (same length on every rank; `recv` may be `send`).
    pub fn all_reduce<T: NcclElem>(
        &self,
        send: &Buffer<T>,
        recv: &Buffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        let n = send.len();
        let (s, d) = self.operands(send, recv, (n, n))?;
        self.run("all_reduce", "ncclAllReduce", |a, c| {
            // SAFETY: both ranges are live device buffers of `n` elements of T on our device.
            unsafe { (a.all_reduce)(ptr(s), ptr(d), n, T::NCCL_TYPE, op.raw(), c, null()) }
        })
    }

    /// `recv` (n elements) = `op` over ranks of block `rank` of `send` (`nranks * n`).
    pub fn reduce_scatter<T: NcclElem>(
        &self,
        send: &Buffer<T>,
        recv: &Buffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        let n = recv.len();
        let (s, d) = self.operands(send, recv, (n * self.nranks as usize, n))?;
        self.run("reduce_scatter", "ncclReduceScatter", |a, c| {
            // SAFETY: send holds nranks * n elements, recv n, both on our device.
            unsafe { (a.reduce_scatter)(ptr(s), ptr(d), n, T::NCCL_TYPE, op.raw(), c, null()) }
        })
    }

    /// `recv` (`nranks * n`) = every rank's `send` (n elements), in rank order.
    pub fn all_gather<T: NcclElem>(&self, send: &Buffer<T>, recv: &Buffer<T>) -> Result<()> {
        let n = send.len();
        let (s, d) = self.operands(send, recv, (n, n * self.nranks as usize))?;
        self.run("all_gather", "ncclAllGather", |a, c| {
            // SAFETY: send holds n elements, recv nranks * n, both on our device.
            unsafe { (a.all_gather)(ptr(s), ptr(d), n, T::NCCL_TYPE, c, null()) }
        })
    }

    /// One group of byte sends and receives of operation `op`: `(peer, device address,
    /// bytes)` each; all are issued between `ncclGroupStart` and `ncclGroupEnd`, so pairwise
    /// exchanges cannot deadlock, and NCCL matches them in order per peer. Completes (or
    /// aborts) like the collectives.
    pub(crate) fn exchange(
        &self,
        op: &'static str,
        sends: &[(u32, u64, usize)],
        recvs: &[(u32, u64, usize)],
    ) -> Result<()> {
        self.run(op, "ncclGroupEnd", |a, c| {
            // SAFETY: no arguments.
            let mut first = unsafe { (a.group_start)() };
            if first != 0 {
                return first;
            }
            for &(p, addr, n) in sends {
                // SAFETY: `addr` is a live device buffer of at least `n` bytes (the staging).
                let r = unsafe { (a.send)(ptr(addr), n, NCCL_UINT8, p as i32, c, null()) };
                first = if first == 0 { r } else { first };
            }
            for &(p, addr, n) in recvs {
                // SAFETY: as above, for the receive staging.
                let r = unsafe { (a.recv)(ptr(addr), n, NCCL_UINT8, p as i32, c, null()) };
                first = if first == 0 { r } else { first };
            }
            // The group is always closed, even after a failed enqueue.
            // SAFETY: no arguments.
            let end = unsafe { (a.group_end)() };
            if first == 0 {
                end
            } else {
                first
            }
        })
    }

    /// `ncclCommGetAsyncError`: `Err` once a peer was lost or the communicator failed
    /// (`ncclInProgress`, an operation still being enqueued, is not an error).
    pub fn async_error(&self) -> Result<()> {
        let g = self.lock();
        let raw = self.live("async error query", &g)?;
        let mut e = 0;
        // SAFETY: our communicator; out-pointer to a local.
        let r = unsafe { (self.api.comm_get_async_error)(raw, &mut e) };
        self.api.check("ncclCommGetAsyncError", r, raw)?;
        if e == IN_PROGRESS {
            return Ok(());
        }
        self.api.check("asynchronous error", e, raw)
    }

    /// Tears the communicator down without waiting for peers (`ncclCommAbort`).
    pub fn abort(self) -> Result<()> {
        let raw = std::mem::replace(&mut *self.lock(), 0) as NcclComm;
        if raw.is_null() {
            return Ok(()); // an earlier failure aborted it
        }
        // SAFETY: our communicator, never used again (the handle is cleared for Drop).
        let r = unsafe { (self.api.comm_abort)(raw) };
        self.api.check("ncclCommAbort", r, std::ptr::null_mut())
    }
}

/// The rank an NCCL error text names (`... rank 3 ...`), if any: the fake NCCL names the peer
/// it lost that way; a real NCCL's texts usually name hosts, not ranks.
fn peer_named(text: &str) -> Option<u32> {
    text.match_indices("rank ").find_map(|(i, m)| {
        let digits: String = text[i + m.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    })
}

impl Drop for Comm {
    fn drop(&mut self) {
        let raw = *self.lock();
        if raw != 0 {
            // SAFETY: our communicator, destroyed once. A failure has nobody to report to.
            let _ = unsafe { (self.api.comm_destroy)(raw as NcclComm) };
        }
    }
}

fn ptr(addr: u64) -> *mut c_void {
    addr as usize as *mut c_void
}

fn null() -> *mut c_void {
    std::ptr::null_mut()
}
