//! Host access to a buffer *while kernels run on it*: what a communication proxy thread needs
//! (NVSHMEM's host proxy, DeepEP's CPU-driven RDMA path). [`Buffer::to_bytes`] and friends wait
//! for the device's queued work first, which would deadlock with a kernel that polls a ring the
//! proxy is about to fill; a [`HostView`] reads and writes immediately, with the memory-model
//! ordering the kernels pair with (`ld.acquire.sys` / `st.release.sys` of ring counters).
//!
//! Emulator only: on GPUs the same role needs host-mapped (pinned, `cuMemHostAlloc` +
//! `cuMemHostGetDevicePointer`) windows or GPU-initiated engines (NCCL / NVSHMEM IBGDA), so the
//! CUDA backend returns an error instead of a view.

use crate::storage::Storage;
use crate::{Buffer, Pod, Result, RuntimeError};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Immediate host view of one emulator allocation (cheap to clone; keeps the memory alive).
#[derive(Clone)]
pub struct HostView {
    alloc: Arc<emu::Allocation>,
    bytes: u64,
}

impl<T: Pod> Buffer<T> {
    /// A [`HostView`] of this buffer (emulator backend only; see the module docs).
    pub fn host_view(&self) -> Result<HostView> {
        match &self.mem {
            Storage::Emu(m) => Ok(HostView {
                alloc: m.alloc.clone(),
                bytes: (self.len * T::SIZE) as u64,
            }),
            Storage::Cuda(_) => Err(RuntimeError::Buffer(
                "host views of device memory need the emulator backend (GPUs use NCCL)".into(),
            )),
        }
    }
}

impl HostView {
    /// Size of the viewed buffer in bytes.
    pub fn len(&self) -> u64 {
        self.bytes
    }
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
    fn check(&self, off: u64, len: u64, align: u64) -> Result<()> {
        if !off.is_multiple_of(align) || off.checked_add(len).is_none_or(|e| e > self.bytes) {
            return Err(RuntimeError::Buffer(format!(
                "host view access of {len} bytes at offset {off} (align {align}) outside a buffer of {}",
                self.bytes
            )));
        }
        Ok(())
    }
    /// `ld.acquire.sys` of the u32 at byte offset `off` (4-aligned).
    pub fn load_acquire_u32(&self, off: u64) -> Result<u32> {
        self.check(off, 4, 4)?;
        Ok(self.alloc.read(off, 4, Ordering::Acquire) as u32)
    }
    /// `st.release.sys` of the u32 at byte offset `off` (4-aligned): the bytes written before
    /// it through this view are visible to a kernel that acquires the value.
    pub fn store_release_u32(&self, off: u64, v: u32) -> Result<()> {
        self.check(off, 4, 4)?;
        self.alloc.write(off, 4, v as u64, Ordering::Release);
        Ok(())
    }
    /// Plain (relaxed) copy out of `out.len()` bytes at `off`.
    pub fn read(&self, off: u64, out: &mut [u8]) -> Result<()> {
        self.check(off, out.len() as u64, 1)?;
        self.alloc.read_bytes(off, out);
        Ok(())
    }
    /// Plain (relaxed) copy in of `data` at `off`.
    pub fn write(&self, off: u64, data: &[u8]) -> Result<()> {
        self.check(off, data.len() as u64, 1)?;
        self.alloc.write_bytes(off, data);
        Ok(())
    }
    /// Sets `len` bytes at `off` to `byte`.
    pub fn fill(&self, off: u64, len: u64, byte: u8) -> Result<()> {
        self.check(off, len, 1)?;
        self.alloc.fill(off, len, &[byte]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::Device;

    #[test]
    fn host_view_reads_writes_and_checks_bounds() {
        let d = Device::emu(950);
        let b = d.upload(&[7u32, 8, 9, 10]).unwrap();
        let v = b.host_view().unwrap();
        assert_eq!(v.len(), 16);
        assert_eq!(v.load_acquire_u32(4).unwrap(), 8);
        v.store_release_u32(8, 0xdead_beef).unwrap();
        v.write(0, &[1, 0, 0, 0]).unwrap();
        assert_eq!(b.to_vec().unwrap(), vec![1, 8, 0xdead_beef, 10]);
        let mut out = [0u8; 4];
        v.read(12, &mut out).unwrap();
        assert_eq!(u32::from_le_bytes(out), 10);
        v.fill(12, 4, 0xff).unwrap();
        assert_eq!(b.to_vec().unwrap()[3], u32::MAX);
        assert!(v.load_acquire_u32(2).is_err(), "misaligned");
        assert!(v.load_acquire_u32(16).is_err(), "past the end");
        assert!(v.write(14, &[0; 4]).is_err(), "past the end");
        assert!(v.read(u64::MAX, &mut out).is_err(), "overflow");
    }
}
