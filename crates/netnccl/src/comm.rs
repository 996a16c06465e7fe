//! Communicators and the data-parallel collectives.
//!
//! Calls are synchronous from the caller's view: each waits for the device's queued work
//! (`Device::synchronize`, which also makes the device's context current on this thread, as
//! NCCL requires), issues the NCCL call on the legacy default stream, and waits for it to
//! complete. Reductions on the fake NCCL are deterministic (rank order); a real NCCL's are
//! deterministic for a fixed topology and algorithm choice but not specified.

use crate::api::{api, Api};
use crate::api::{NcclComm, NcclDataType, NcclRedOp, NcclUniqueId};
use crate::{NcclError, Result};
use runtime::{Backend, Buffer, Device, Pod};
use std::ffi::c_void;

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

/// One rank's NCCL communicator on one CUDA device. Destroyed on drop (`ncclCommDestroy`);
/// [`Comm::abort`] tears it down without waiting for peers.
pub struct Comm {
    /// `NcclComm`, kept as an address so the type is `Send` (NCCL communicators may be used
    /// from any thread, one thread at a time; `&mut`-free methods are serialised by `lock`).
    raw: usize,
    lock: std::sync::Mutex<()>,
    rank: u32,
    nranks: u32,
    device: Device,
    api: &'static Api,
}

impl Comm {
    /// `ncclCommInitRank` on `device` (must be a CUDA device); collective over all ranks.
    pub fn init(device: &Device, id: &UniqueId, rank: u32, nranks: u32) -> Result<Comm> {
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
        let uid = NcclUniqueId {
            internal: std::array::from_fn(|i| id.0[i] as std::ffi::c_char),
        };
        // SAFETY: out-pointer to a local; the id is passed by value as nccl.h declares.
        let r = unsafe { (api.comm_init_rank)(&mut raw, nranks as i32, uid, rank as i32) };
        api.check("ncclCommInitRank", r, std::ptr::null_mut())?;
        Ok(Comm {
            raw: raw as usize,
            lock: Default::default(),
            rank,
            nranks,
            device: device.clone(),
            api,
        })
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

    pub fn rank(&self) -> u32 {
        self.rank
    }
    pub fn nranks(&self) -> u32 {
        self.nranks
    }
    pub fn device(&self) -> &Device {
        &self.device
    }

    fn raw(&self) -> NcclComm {
        self.raw as NcclComm
    }

    /// Runs `f` (one or more NCCL calls) between two device synchronisations.
    fn run(&self, call: &'static str, f: impl FnOnce(&Api, NcclComm) -> i32) -> Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.device.synchronize()?;
        let r = f(self.api, self.raw());
        self.api.check(call, r, self.raw())?;
        self.device.synchronize()?;
        Ok(())
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

    /// `recv = op over ranks of send` (same length on every rank; `recv` may be `send`).
    pub fn all_reduce<T: NcclElem>(
        &self,
        send: &Buffer<T>,
        recv: &Buffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.same_device("send", send)?;
        self.same_device("recv", recv)?;
        Self::check_len("recv", recv.len(), send.len())?;
        let (s, d, n) = (send.device_ptr(), recv.device_ptr(), send.len());
        self.run("ncclAllReduce", |a, c| {
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
        self.same_device("send", send)?;
        self.same_device("recv", recv)?;
        Self::check_len("send", send.len(), recv.len() * self.nranks as usize)?;
        let (s, d, n) = (send.device_ptr(), recv.device_ptr(), recv.len());
        self.run("ncclReduceScatter", |a, c| {
            // SAFETY: send holds nranks * n elements, recv n, both on our device.
            unsafe { (a.reduce_scatter)(ptr(s), ptr(d), n, T::NCCL_TYPE, op.raw(), c, null()) }
        })
    }

    /// `recv` (`nranks * n`) = every rank's `send` (n elements), in rank order.
    pub fn all_gather<T: NcclElem>(&self, send: &Buffer<T>, recv: &Buffer<T>) -> Result<()> {
        self.same_device("send", send)?;
        self.same_device("recv", recv)?;
        Self::check_len("recv", recv.len(), send.len() * self.nranks as usize)?;
        let (s, d, n) = (send.device_ptr(), recv.device_ptr(), send.len());
        self.run("ncclAllGather", |a, c| {
            // SAFETY: send holds n elements, recv nranks * n, both on our device.
            unsafe { (a.all_gather)(ptr(s), ptr(d), n, T::NCCL_TYPE, c, null()) }
        })
    }

    /// One group of byte sends and receives: `(peer, device address, bytes)` each; all are
    /// issued between `ncclGroupStart` and `ncclGroupEnd`, so pairwise exchanges cannot
    /// deadlock, and NCCL matches them in order per peer.
    pub(crate) fn exchange(
        &self,
        sends: &[(u32, u64, usize)],
        recvs: &[(u32, u64, usize)],
    ) -> Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.device.synchronize()?;
        let (a, c) = (self.api, self.raw());
        // SAFETY: no arguments.
        a.check("ncclGroupStart", unsafe { (a.group_start)() }, c)?;
        let mut first = Ok(());
        for &(p, addr, n) in sends {
            // SAFETY: `addr` is a live device buffer of at least `n` bytes (the engine's staging).
            let r = unsafe { (a.send)(ptr(addr), n, NCCL_UINT8, p as i32, c, null()) };
            first = first.and(a.check("ncclSend", r, c));
        }
        for &(p, addr, n) in recvs {
            // SAFETY: as above, for the receive staging.
            let r = unsafe { (a.recv)(ptr(addr), n, NCCL_UINT8, p as i32, c, null()) };
            first = first.and(a.check("ncclRecv", r, c));
        }
        // The group is always closed, even after a failed enqueue.
        // SAFETY: no arguments.
        let end = a.check("ncclGroupEnd", unsafe { (a.group_end)() }, c);
        first.and(end)?;
        self.device.synchronize()?;
        Ok(())
    }

    /// `ncclCommGetAsyncError`: `Err` once a peer was lost or the communicator failed.
    pub fn async_error(&self) -> Result<()> {
        let mut e = 0;
        // SAFETY: our communicator; out-pointer to a local.
        let r = unsafe { (self.api.comm_get_async_error)(self.raw(), &mut e) };
        self.api.check("ncclCommGetAsyncError", r, self.raw())?;
        self.api.check("asynchronous error", e, self.raw())
    }

    /// Tears the communicator down without waiting for peers (`ncclCommAbort`).
    pub fn abort(mut self) -> Result<()> {
        let raw = std::mem::replace(&mut self.raw, 0) as NcclComm;
        // SAFETY: our communicator, never used again (raw is cleared for Drop).
        let r = unsafe { (self.api.comm_abort)(raw) };
        self.api.check("ncclCommAbort", r, std::ptr::null_mut())
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if self.raw != 0 {
            // SAFETY: our communicator, destroyed once. A failure has nobody to report to.
            let _ = unsafe { (self.api.comm_destroy)(self.raw()) };
        }
    }
}

fn ptr(addr: u64) -> *mut c_void {
    addr as usize as *mut c_void
}

fn null() -> *mut c_void {
    std::ptr::null_mut()
}
