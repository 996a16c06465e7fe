//! The memory behind a `Buffer`, per backend, and IPC handles.

use crate::cuda::memory::DevMem;
use crate::{Result, RuntimeError};
use std::sync::Arc;

/// An emulator allocation; freed on drop unless it was opened from an IPC handle.
pub(crate) struct EmuMem {
    pub alloc: Arc<emu::Allocation>,
    pub owned: bool,
}

impl Drop for EmuMem {
    fn drop(&mut self) {
        if self.owned {
            crate::device::emu_memory().free(self.alloc.base);
        }
    }
}

pub(crate) enum Storage {
    Emu(EmuMem),
    Cuda(DevMem),
}

impl Storage {
    pub fn ptr(&self) -> u64 {
        match self {
            Storage::Emu(m) => m.alloc.base,
            Storage::Cuda(m) => m.ptr,
        }
    }
    pub fn write(&self, off: usize, data: &[u8]) -> Result<()> {
        match self {
            Storage::Emu(m) => {
                m.alloc.write_bytes(off as u64, data);
                Ok(())
            }
            Storage::Cuda(m) => m.write(off, data),
        }
    }
    pub fn read(&self, off: usize, out: &mut [u8]) -> Result<()> {
        match self {
            Storage::Emu(m) => {
                m.alloc.read_bytes(off as u64, out);
                Ok(())
            }
            Storage::Cuda(m) => m.read(off, out),
        }
    }
    pub fn fill(&self, bytes: usize, pattern: &[u8]) -> Result<()> {
        match self {
            Storage::Emu(m) => {
                m.alloc.fill(0, bytes as u64, pattern);
                Ok(())
            }
            Storage::Cuda(m) => m.fill(pattern),
        }
    }
}

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
    /// `CUipcMemHandle` bytes (CUDA), or the allocation's base address in the first 8 (emulator).
    pub handle: [u8; 64],
    /// Process that exported it.
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
    pub fn from_text(s: &str) -> Result<IpcHandle> {
        let bad = || RuntimeError::Buffer(format!("malformed IPC handle `{s}`"));
        let p: Vec<&str> = s.trim().split(':').collect();
        if p.len() != 5 || p[4].len() != 128 {
            return Err(bad());
        }
        let backend = match p[0] {
            "emu" => crate::Backend::Emu,
            "cuda" => crate::Backend::Cuda,
            _ => return Err(bad()),
        };
        let mut handle = [0u8; 64];
        for (i, h) in handle.iter_mut().enumerate() {
            *h = u8::from_str_radix(&p[4][2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(IpcHandle {
            backend,
            device: p[1].parse().map_err(|_| bad())?,
            bytes: p[2].parse().map_err(|_| bad())?,
            pid: p[3].parse().map_err(|_| bad())?,
            handle,
        })
    }
}

impl<T: crate::Pod> crate::Buffer<T> {
    /// Exports this buffer for [`crate::Device::open_ipc`] (CUDA: `cuIpcGetMemHandle`).
    pub fn ipc_handle(&self) -> Result<IpcHandle> {
        let bytes = (self.len * T::SIZE) as u64;
        let handle = match &self.mem {
            Storage::Emu(m) => {
                let mut h = [0u8; 64];
                h[..8].copy_from_slice(&m.alloc.base.to_le_bytes());
                h
            }
            Storage::Cuda(m) => m.ipc_handle()?,
        };
        Ok(IpcHandle {
            backend: self.device.backend(),
            device: self.device.index(),
            bytes,
            handle,
            pid: std::process::id(),
        })
    }
}

impl crate::Device {
    /// Maps memory exported with [`crate::Buffer::ipc_handle`] as a buffer of this device
    /// (CUDA: `cuIpcOpenMemHandle`, from another process; emulator: any emulated device of the
    /// exporting process). The memory stays owned by the exporter: dropping this buffer unmaps it.
    pub fn open_ipc<T: crate::Pod>(&self, h: &IpcHandle) -> Result<crate::Buffer<T>> {
        if h.backend != self.backend() {
            return Err(RuntimeError::Buffer(format!(
                "IPC handle of a {:?} device opened on a {:?} device",
                h.backend,
                self.backend()
            )));
        }
        let len = h.bytes as usize / T::SIZE.max(1);
        let mem = match self.cuda_ctx() {
            Some(ctx) => Storage::Cuda(DevMem::open_ipc(ctx, &h.handle, h.bytes as usize)?),
            None => {
                if h.pid != std::process::id() {
                    return Err(RuntimeError::Buffer(
                        "emulator IPC handles only open in the exporting process".into(),
                    ));
                }
                let mut b = [0u8; 8];
                b.copy_from_slice(&h.handle[..8]);
                let base = u64::from_le_bytes(b);
                let snap = crate::device::emu_memory().snapshot();
                let alloc = snap
                    .find(base, h.bytes)
                    .filter(|a| a.base == base)
                    .cloned()
                    .ok_or_else(|| {
                        RuntimeError::Buffer(format!(
                            "IPC handle refers to freed memory at {base:#x}"
                        ))
                    })?;
                Storage::Emu(EmuMem {
                    alloc,
                    owned: false,
                })
            }
        };
        Ok(crate::Buffer {
            device: self.clone(),
            mem,
            len,
            _t: std::marker::PhantomData,
        })
    }
}
