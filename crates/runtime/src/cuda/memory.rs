//! Device memory (`cuMemAlloc`, or `cuMemCreate` + `cuMemMap` for multicast binding), pinned
//! host staging, copies through the device's copy stream,
//! and IPC handles.

use super::{check, launch::RawStream, Ctx};
use crate::{Result, RuntimeError};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::Arc;

/// Host<->device copies go through a pinned buffer of at most this size, chunk by chunk.
const STAGING_CHUNK: usize = 8 << 20;

/// Page-locked host memory (`cuMemHostAlloc`), the source/target of async copies.
pub(crate) struct Pinned {
    ptr: *mut c_void,
    bytes: usize,
}

// SAFETY: the pointer is an exclusively owned host allocation; moving it between threads is fine.
unsafe impl Send for Pinned {}

impl Pinned {
    pub fn new(ctx: &Ctx, bytes: usize) -> Result<Pinned> {
        ctx.bind()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; portable pinned memory of `bytes` (>= 1) bytes.
        check(
            unsafe { sys::cuMemHostAlloc(&mut ptr, bytes.max(1), sys::CU_MEMHOSTALLOC_PORTABLE) },
            "cuMemHostAlloc",
        )?;
        Ok(Pinned {
            ptr,
            bytes: bytes.max(1),
        })
    }
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `bytes` bytes owned by self, and &mut self makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.bytes) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: frees the allocation made in `new`, exactly once.
        unsafe {
            sys::cuMemFreeHost(self.ptr);
        }
    }
}

fn copy_stream(ctx: &Ctx) -> Result<sys::CUstream> {
    if let Some(s) = ctx.copy_stream.get() {
        return Ok(s.0);
    }
    let s = RawStream::create(ctx.ctx, 0)?;
    // A racing thread may have set it first; ours is then dropped (destroyed).
    let _ = ctx.copy_stream.set(s);
    Ok(ctx
        .copy_stream
        .get()
        .map(|s| s.0)
        .unwrap_or(std::ptr::null_mut()))
}

/// How a [`DevMem`] came to be: what its drop undoes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// `cuMemAlloc` (`cuMemFree`).
    Alloc,
    /// `cuIpcOpenMemHandle` (`cuIpcCloseMemHandle`).
    Ipc,
    /// `cuMemCreate` memory of `size` bytes mapped at a `cuMemAddressReserve`d range
    /// (`cuMemUnmap`, `cuMemAddressFree`, `cuMemRelease`): what multicast objects bind.
    Vmm {
        handle: sys::CUmemGenericAllocationHandle,
        size: usize,
    },
}

/// A device allocation (owned, or opened from another process's IPC handle).
pub(crate) struct DevMem {
    pub ptr: u64,
    pub bytes: usize,
    pub ctx: Arc<Ctx>,
    pub origin: Origin,
}

impl DevMem {
    /// `cuMemAlloc` of `bytes`, zeroed before this returns.
    ///
    /// The zeroing runs on the device's (non-blocking) copy stream, which is then synchronised:
    /// the synchronous `cuMemsetD8` runs on the legacy NULL stream and returns before it completes
    /// (memsets of device memory are asynchronous with respect to the host), and the runtime's
    /// streams are all `CU_STREAM_NON_BLOCKING`, so they do not wait for the NULL stream: a copy or
    /// launch queued on a stream right after `alloc` could run before the zeroing and then be
    /// overwritten by it. Synchronising only the copy stream (not the context) keeps `alloc`
    /// from waiting on kernels of other streams (a spinning communication kernel).
    pub fn alloc(ctx: &Arc<Ctx>, bytes: usize) -> Result<DevMem> {
        ctx.bind()?;
        let mut ptr = 0;
        // SAFETY: out-pointer to a local.
        check(
            unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(1)) },
            "cuMemAlloc",
        )?;
        let m = DevMem {
            ptr,
            bytes,
            ctx: ctx.clone(),
            origin: Origin::Alloc,
        };
        m.memset_now(&[0])?;
        Ok(m)
    }

    /// `cuMemCreate` memory of `bytes` (rounded up to the allocation granularity), mapped at a
    /// reserved range with read-write access for its device, zeroed: memory multicast objects
    /// can bind (`cuMulticastBindMem`).
    pub fn alloc_vmm(ctx: &Arc<Ctx>, bytes: usize) -> Result<DevMem> {
        ctx.bind()?;
        let prop = vmm_prop(ctx.ordinal);
        let mut g = 0usize;
        let call = |what: &str, f: &mut dyn FnMut() -> sys::CUresult| {
            check(super::guarded(what, f)?, what)
        };
        // SAFETY: out-pointer to a local; `prop` lives across the call.
        call("cuMemGetAllocationGranularity", &mut || unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        let size = bytes.max(1).div_ceil(g.max(1)) * g.max(1);
        let mut handle = 0;
        // SAFETY: out-pointer to a local; `prop` lives across the call.
        call("cuMemCreate", &mut || unsafe {
            sys::cuMemCreate(&mut handle, size, &prop, 0)
        })?;
        let mut ptr = 0;
        // SAFETY: out-pointer to a local.
        let r = call("cuMemAddressReserve", &mut || unsafe {
            sys::cuMemAddressReserve(&mut ptr, size, g, 0, 0)
        });
        if let Err(e) = r {
            // SAFETY: releases the handle created above, once.
            unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
        // from here on, drop undoes what was done (an unmap of nothing fails harmlessly)
        let m = DevMem {
            ptr,
            bytes,
            ctx: ctx.clone(),
            origin: Origin::Vmm { handle, size },
        };
        // SAFETY: maps the whole handle at the fresh reservation.
        call("cuMemMap", &mut || unsafe {
            sys::cuMemMap(ptr, size, 0, handle, 0)
        })?;
        let desc = super::multicast::rw_access(ctx.ordinal);
        // SAFETY: one descriptor alive across the call; the range was just mapped.
        call("cuMemSetAccess", &mut || unsafe {
            sys::cuMemSetAccess(ptr, size, &desc, 1)
        })?;
        m.memset_now(&[0])?;
        Ok(m)
    }

    /// Sets the whole allocation to `pattern` (1, 2 or 4 bytes) on the copy stream and waits for
    /// that stream only.
    fn memset_now(&self, pattern: &[u8]) -> Result<()> {
        let s = copy_stream(&self.ctx)?;
        self.ctx.bind()?;
        let len = self.bytes.max(1);
        let n = len / pattern.len().max(1);
        // SAFETY: `n` elements of the pattern's size lie within the allocation; `s` is the live
        // copy stream of this allocation's context, which is current.
        unsafe {
            let r = match pattern.len() {
                1 => sys::cuMemsetD8Async(self.ptr, pattern[0], n, s),
                2 => sys::cuMemsetD16Async(
                    self.ptr,
                    u16::from_le_bytes([pattern[0], pattern[1]]),
                    n,
                    s,
                ),
                4 => sys::cuMemsetD32Async(
                    self.ptr,
                    u32::from_le_bytes([pattern[0], pattern[1], pattern[2], pattern[3]]),
                    n,
                    s,
                ),
                _ => {
                    return Err(RuntimeError::Buffer(format!(
                        "memset pattern of {} bytes",
                        pattern.len()
                    )))
                }
            };
            check(r, "cuMemsetAsync")?;
            check(sys::cuStreamSynchronize(s), "cuStreamSynchronize")
        }
    }

    /// Maps another process's allocation (`cuIpcOpenMemHandle`).
    pub fn open_ipc(ctx: &Arc<Ctx>, handle: &[u8; 64], bytes: usize) -> Result<DevMem> {
        ctx.bind()?;
        let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
        for (d, s) in h.reserved.iter_mut().zip(handle) {
            *d = *s as std::ffi::c_char;
        }
        let mut ptr = 0;
        // SAFETY: out-pointer to a local; the handle is passed by value.
        check(
            unsafe {
                sys::cuIpcOpenMemHandle_v2(
                    &mut ptr,
                    h,
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                )
            },
            "cuIpcOpenMemHandle (handles cannot be opened in the process that created them)",
        )?;
        Ok(DevMem {
            ptr,
            bytes,
            ctx: ctx.clone(),
            origin: Origin::Ipc,
        })
    }

    /// `cuIpcGetMemHandle` for this allocation.
    pub fn ipc_handle(&self) -> Result<[u8; 64]> {
        match self.origin {
            Origin::Alloc => {}
            Origin::Ipc => {
                return Err(RuntimeError::Buffer(
                    "an IPC-opened buffer cannot be exported again".into(),
                ))
            }
            Origin::Vmm { .. } => {
                return Err(RuntimeError::Buffer(
                    "a cuMemCreate buffer (multicast-bindable) has no cuIpcGetMemHandle".into(),
                ))
            }
        }
        self.ctx.bind()?;
        let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: out-pointer to a local; `ptr` is the base of a cuMemAlloc allocation.
        check(
            unsafe { sys::cuIpcGetMemHandle(&mut h, self.ptr) },
            "cuIpcGetMemHandle",
        )?;
        let mut out = [0u8; 64];
        for (d, s) in out.iter_mut().zip(h.reserved) {
            *d = s as u8;
        }
        Ok(out)
    }

    /// Copies `data` to byte offset `off`, after all queued work (as the emulator does).
    pub fn write(&self, off: usize, data: &[u8]) -> Result<()> {
        if off + data.len() > self.bytes {
            return Err(RuntimeError::Buffer(
                "write past the end of the buffer".into(),
            ));
        }
        self.ctx.synchronize()?;
        let s = copy_stream(&self.ctx)?;
        let mut g = self.ctx.staging.lock().unwrap_or_else(|p| p.into_inner());
        let pinned = staging(&self.ctx, &mut g, data.len())?;
        let mut o = off;
        for chunk in data.chunks(STAGING_CHUNK) {
            pinned.as_mut_slice()[..chunk.len()].copy_from_slice(chunk);
            // SAFETY: the pinned buffer holds `chunk.len()` valid bytes and outlives the copy
            // (we synchronise the stream before touching it again); the range is in bounds.
            unsafe {
                check(
                    sys::cuMemcpyHtoDAsync_v2(self.ptr + o as u64, pinned.as_ptr(), chunk.len(), s),
                    "cuMemcpyHtoDAsync",
                )?;
                check(sys::cuStreamSynchronize(s), "cuStreamSynchronize")?;
            }
            o += chunk.len();
        }
        Ok(())
    }

    /// Copies bytes from offset `off` into `out`, after all queued work.
    pub fn read(&self, off: usize, out: &mut [u8]) -> Result<()> {
        if off + out.len() > self.bytes {
            return Err(RuntimeError::Buffer(
                "read past the end of the buffer".into(),
            ));
        }
        self.ctx.synchronize()?;
        let s = copy_stream(&self.ctx)?;
        let mut g = self.ctx.staging.lock().unwrap_or_else(|p| p.into_inner());
        let pinned = staging(&self.ctx, &mut g, out.len())?;
        let mut o = off;
        for chunk in out.chunks_mut(STAGING_CHUNK) {
            // SAFETY: the pinned buffer has room for `chunk.len()` bytes; we synchronise before
            // reading it; the device range is in bounds.
            unsafe {
                check(
                    sys::cuMemcpyDtoHAsync_v2(pinned.as_ptr(), self.ptr + o as u64, chunk.len(), s),
                    "cuMemcpyDtoHAsync",
                )?;
                check(sys::cuStreamSynchronize(s), "cuStreamSynchronize")?;
            }
            chunk.copy_from_slice(&pinned.as_mut_slice()[..chunk.len()]);
            o += chunk.len();
        }
        Ok(())
    }

    /// Repeats `pattern` over the whole allocation (after all queued work, like `write`).
    /// 1-, 2- and 4-byte patterns are memsets on the copy stream, waited for before returning
    /// (see [`DevMem::alloc`] for why not the synchronous `cuMemsetD*`).
    pub fn fill(&self, pattern: &[u8]) -> Result<()> {
        self.ctx.synchronize()?;
        if matches!(pattern.len(), 1 | 2 | 4) {
            if self.bytes == 0 {
                return Ok(());
            }
            return self.memset_now(pattern);
        }
        let n = self.bytes / pattern.len().max(1);
        let data: Vec<u8> = pattern
            .iter()
            .copied()
            .cycle()
            .take(n * pattern.len())
            .collect();
        self.write(0, &data)
    }
}

/// Pinned device memory of device `ordinal`, no exportable handle types.
fn vmm_prop(ordinal: u32) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal as i32,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

fn staging<'a>(ctx: &Ctx, slot: &'a mut Option<Pinned>, want: usize) -> Result<&'a mut Pinned> {
    let want = want.clamp(1, STAGING_CHUNK);
    if !matches!(slot, Some(p) if p.bytes >= want) {
        *slot = None;
        *slot = Some(Pinned::new(
            ctx,
            want.next_power_of_two().min(STAGING_CHUNK),
        )?);
    }
    slot.as_mut()
        .ok_or_else(|| RuntimeError::Buffer("no staging buffer".into()))
}

impl Drop for DevMem {
    fn drop(&mut self) {
        if self.ctx.bind().is_err() {
            return;
        }
        // SAFETY: frees/unmaps the allocation this object owns, exactly once.
        unsafe {
            match self.origin {
                Origin::Alloc => {
                    sys::cuMemFree_v2(self.ptr);
                }
                Origin::Ipc => {
                    sys::cuIpcCloseMemHandle(self.ptr);
                }
                Origin::Vmm { handle, size } => {
                    // queued work may still use it (cuMemFree would wait; cuMemUnmap does not)
                    let _ = self.ctx.synchronize();
                    sys::cuMemUnmap(self.ptr, size);
                    sys::cuMemAddressFree(self.ptr, size);
                    sys::cuMemRelease(handle);
                }
            }
        }
    }
}
