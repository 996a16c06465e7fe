//! IPC handles: exporting a buffer so another process (or, on the emulator, another part of
//! this process) maps the same memory, and the process-wide emulated-memory settings that make
//! that possible (address slot, shared allocations). Design: `docs/SCALE.md`, "Intra-node
//! memory (IPC)".
//!
//! Emulator handle (the 64 `handle` bytes): `[0..8)` base address (little-endian), `[8..12)`
//! `PFS1` when the memory is a shared segment (zeros: process-local memory, openable only by
//! the exporting process), `[16..24)` the segment's number, `[24..64)` the job id
//! (`PTXFORGE_JOB_ID`, NUL-padded); with `pid` that names the segment
//! `/ptxforge-{job}-p{pid}-{n}`, and `bytes` its size. CUDA handle: the `CUipcMemHandle`.

use crate::cuda::memory::DevMem;
use crate::storage::{EmuMem, EmuOrigin, Storage};
use crate::{Result, RuntimeError};
use emu::{SegmentId, SegmentSpec};

const SHARED_MAGIC: &[u8; 4] = b"PFS1";
const JOB_AT: usize = 24;

/// A handle another process (or, on the emulator, another part of this process) opens with
/// [`crate::Device::open_ipc`] to map the same memory. On CUDA it wraps the 64-byte
/// `CUipcMemHandle` (`cuIpcGetMemHandle`), which only a *different* process may open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcHandle {
    pub backend: crate::Backend,
    /// Device that owns the memory.
    pub device: u32,
    /// Size in bytes.
    pub bytes: u64,
    /// `CUipcMemHandle` bytes (CUDA), or the emulator's encoding (module docs).
    pub handle: [u8; 64],
    /// Process that exported it (on the emulator: that owns the shared segment).
    pub pid: u32,
}

impl IpcHandle {
    /// Hex text, to pass through a pipe, file or environment variable.
    pub fn to_text(&self) -> String {
        let b = match self.backend {
            crate::Backend::Emu => "emu",
            crate::Backend::Cuda => "cuda",
        };
        let h: String = self.handle.iter().map(|x| format!("{x:02x}")).collect();
        format!("{b}:{}:{}:{}:{h}", self.device, self.bytes, self.pid)
    }

    /// Parses [`IpcHandle::to_text`]; the error names the field that is wrong.
    pub fn from_text(s: &str) -> Result<IpcHandle> {
        let bad = |field: &str| RuntimeError::Ipc {
            handle: format!("`{s}`"),
            msg: format!("malformed {field} (want backend:device:bytes:pid:128 hex digits)"),
        };
        let p: Vec<&str> = s.trim().split(':').collect();
        if p.len() != 5 {
            return Err(bad("text"));
        }
        let backend = match p[0] {
            "emu" => crate::Backend::Emu,
            "cuda" => crate::Backend::Cuda,
            _ => return Err(bad("backend")),
        };
        let mut handle = [0u8; 64];
        if p[4].len() != 128 || !p[4].is_ascii() {
            return Err(bad("handle bytes"));
        }
        for (i, h) in handle.iter_mut().enumerate() {
            *h =
                u8::from_str_radix(&p[4][2 * i..2 * i + 2], 16).map_err(|_| bad("handle bytes"))?;
        }
        Ok(IpcHandle {
            backend,
            device: p[1].parse().map_err(|_| bad("device"))?,
            bytes: p[2].parse().map_err(|_| bad("bytes"))?,
            pid: p[3].parse().map_err(|_| bad("pid"))?,
            handle,
        })
    }

    /// The emulated base address the handle refers to.
    fn emu_base(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.handle[..8]);
        u64::from_le_bytes(b)
    }

    /// The shared segment an emulator handle names (None: process-local memory).
    fn emu_segment(&self) -> Option<SegmentSpec> {
        if &self.handle[8..12] != SHARED_MAGIC {
            return None;
        }
        let mut n = [0u8; 8];
        n.copy_from_slice(&self.handle[16..24]);
        let job = &self.handle[JOB_AT..];
        let len = job.iter().position(|&c| c == 0).unwrap_or(job.len());
        Some(SegmentSpec {
            id: SegmentId {
                job: String::from_utf8_lossy(&job[..len]).into_owned(),
                pid: self.pid,
                n: u64::from_le_bytes(n),
            },
            base: self.emu_base(),
            size: self.bytes,
            device: self.device,
        })
    }

    /// A short description for messages: backend, device, pid, and the emulator's segment name
    /// and address.
    pub fn describe(&self) -> String {
        match (self.backend, self.emu_segment()) {
            (crate::Backend::Cuda, _) => {
                format!("cuda device {} pid {}", self.device, self.pid)
            }
            (crate::Backend::Emu, Some(s)) => format!(
                "emu device {} pid {} segment {} at {:#x}",
                self.device,
                self.pid,
                s.id.name(),
                s.base
            ),
            (crate::Backend::Emu, None) => format!(
                "emu device {} pid {} (process-local) at {:#x}",
                self.device,
                self.pid,
                self.emu_base()
            ),
        }
    }

    fn error(&self, msg: impl Into<String>) -> RuntimeError {
        RuntimeError::Ipc {
            handle: self.describe(),
            msg: msg.into(),
        }
    }
}

/// The emulator's 64 handle bytes for `alloc` (see the module docs).
fn emu_handle_bytes(alloc: &emu::Allocation) -> ([u8; 64], u32) {
    let mut h = [0u8; 64];
    h[..8].copy_from_slice(&alloc.base.to_le_bytes());
    let Some(spec) = alloc.shared_spec() else {
        return (h, std::process::id());
    };
    h[8..12].copy_from_slice(SHARED_MAGIC);
    h[16..24].copy_from_slice(&spec.id.n.to_le_bytes());
    // job ids are checked to fit (emu::memory::shm::MAX_JOB_ID) when the segment is made
    let job = spec.id.job.as_bytes();
    h[JOB_AT..JOB_AT + job.len()].copy_from_slice(job);
    (h, spec.id.pid)
}

impl<T: crate::Pod> crate::Buffer<T> {
    /// Exports this buffer for [`crate::Device::open_ipc`] (CUDA: `cuIpcGetMemHandle`). On the
    /// emulator another process can open it only when the buffer is a shared segment
    /// ([`crate::Device::alloc_shared`], or any allocation in a multi-process job); a buffer
    /// opened from a peer exports the peer's segment again.
    pub fn ipc_handle(&self) -> Result<IpcHandle> {
        let bytes = (self.len * T::SIZE) as u64;
        let (handle, pid) = match &self.mem {
            Storage::Emu(m) => emu_handle_bytes(&m.alloc),
            Storage::Cuda(m) => (m.ipc_handle()?, std::process::id()),
        };
        Ok(IpcHandle {
            backend: self.device.backend(),
            device: self.device.index(),
            bytes,
            handle,
            pid,
        })
    }
}

impl crate::Device {
    /// Maps memory exported with [`crate::Buffer::ipc_handle`] as a buffer of this device.
    /// CUDA: `cuIpcOpenMemHandle`, from another process. Emulator: in the exporting process,
    /// the same allocation; in another process, the exporter's shared segment mapped
    /// read-write at the exporter's address (so pointers into it are valid in both). The
    /// memory stays owned by the exporter: dropping this buffer unmaps it here. Errors
    /// ([`RuntimeError::Ipc`], naming the handle): wrong backend, process-local memory of
    /// another process, a segment whose owner freed it or exited, an address range that
    /// overlaps memory of this process.
    pub fn open_ipc<T: crate::Pod>(&self, h: &IpcHandle) -> Result<crate::Buffer<T>> {
        if h.backend != self.backend() {
            return Err(h.error(format!("opened on a {:?} device", self.backend())));
        }
        let len = h.bytes as usize / T::SIZE.max(1);
        let mem = match self.cuda_ctx() {
            Some(ctx) => Storage::Cuda(
                DevMem::open_ipc(ctx, &h.handle, h.bytes as usize)
                    .map_err(|e| h.error(e.to_string()))?,
            ),
            None => Storage::Emu(open_emu(h)?),
        };
        Ok(crate::Buffer {
            device: self.clone(),
            mem,
            len,
            _t: std::marker::PhantomData,
        })
    }

    /// Moves this process's emulated allocations to address slot `slot` (normally the rank;
    /// set from `PTXFORGE_EMU_SLOT` or `RANK` when present): `[GLOBAL_BASE + slot * 2^44,
    /// +2^44)`. Only before the process's first emulator allocation.
    pub fn emu_set_address_slot(slot: u32) -> Result<()> {
        Ok(crate::device::emu_memory_checked()?.set_address_slot(slot)?)
    }

    /// This process's emulator address slot.
    pub fn emu_address_slot() -> u32 {
        crate::device::emu_memory().address_slot()
    }

    /// Makes every later emulator allocation a shared segment ([`crate::Device::alloc_shared`])
    /// or process-local again (`PTXFORGE_EMU_SHM` sets the starting value).
    pub fn emu_set_shared_default(on: bool) {
        crate::device::emu_memory().set_shared_default(on);
    }
}

/// Opens an emulator handle: the allocation itself in the exporting process, the exporter's
/// segment in another (never an allocation of this process that happens to have the address).
fn open_emu(h: &IpcHandle) -> Result<EmuMem> {
    let mem = crate::device::emu_memory_checked()?;
    if h.pid == std::process::id() {
        let base = h.emu_base();
        let alloc = mem
            .snapshot()
            .find(base, h.bytes)
            .filter(|a| a.base == base && a.size == h.bytes)
            .cloned()
            .ok_or_else(|| h.error("the buffer was freed"))?;
        return Ok(EmuMem {
            alloc,
            origin: EmuOrigin::Alias,
        });
    }
    let Some(spec) = h.emu_segment() else {
        return Err(h.error(
            "process-local memory of another process: the exporter must allocate shared \
             memory (Device::alloc_shared, or PTXFORGE_EMU_SHM=1)",
        ));
    };
    let alloc = mem.open_shared(&spec).map_err(|e| h.error(e.to_string()))?;
    Ok(EmuMem {
        alloc,
        origin: EmuOrigin::Peer,
    })
}
