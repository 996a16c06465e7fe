//! `fakecuda`: a fake `libcuda.so` built on the ptxforge emulator, so the CUDA backend of
//! `runtime` (FFI marshalling, `kernelParams` layout, JIT logs, streams/events, graphs, tensor
//! maps, green contexts, peer access) runs in CI without a GPU. See docs/CUDA.md ("The fake
//! driver") for what it models and what it cannot.
//!
//! The library exports the driver API's C symbols (`cuInit`, `cuLaunchKernelEx`, ...) with the
//! exact signatures of CUDA 12.8's `cuda.h` (taken from `cudarc::driver::sys`; enum arguments are
//! received as their `u32` representation so out-of-range values are errors, not undefined
//! behaviour). Every entry point catches panics and returns `CUDA_ERROR_UNKNOWN` instead of
//! unwinding into the caller. Build it with `cargo build -p fakecuda` and put it on the loader
//! path as `libcuda.so.1` (`scripts/fakecuda.sh` does that).

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

mod exec;
mod jit;
mod multicast;
mod state;
mod tmap;

use cudarc::driver::sys::{
    self, CUcontext, CUdevResource, CUdevResourceDesc, CUdevice, CUdeviceptr, CUevent, CUfunction,
    CUgraph, CUgraphExec, CUgreenCtx, CUipcMemHandle, CUlaunchConfig, CUlinkState, CUmodule,
    CUresult, CUstream, CUtensorMap,
};
use exec::{Event, Op, Stream};
use state::{
    capture_guard, check_dev, check_range, current, drv, fail, lock, out, sticky, Ctx, Desc, Green,
    Res, DEFAULT_SHARED, DRIVER_VERSION, NAME, OPTIN_SHARED, SMS, SM_VERSION, TOTAL_MEM,
};
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Runs an entry point: `Ok` is `CUDA_SUCCESS`; a panic is reported and becomes
/// `CUDA_ERROR_UNKNOWN` (never unwinds across the C ABI).
fn ffi(name: &str, f: impl FnOnce() -> Res) -> CUresult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUresult::CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            eprintln!("fakecuda: internal error in {name}: {msg}");
            CUresult::CUDA_ERROR_UNKNOWN
        }
    }
}

fn h<T>(p: *mut T) -> usize {
    p as usize
}

fn ctx_of(d: &state::Driver, c: CUcontext) -> Res<Arc<Ctx>> {
    lock(&d.ctxs).get(&h(c)).cloned().ok_or_else(|| {
        fail(CUresult::CUDA_ERROR_INVALID_CONTEXT, || {
            format!("context {:#x}", h(c))
        })
    })
}

fn event_of(d: &state::Driver, e: CUevent) -> Res<Arc<Event>> {
    lock(&d.events).get(&h(e)).cloned().ok_or_else(|| {
        fail(CUresult::CUDA_ERROR_INVALID_HANDLE, || {
            format!("event {:#x}", h(e))
        })
    })
}

// ---------------------------------------------------------------------------------------------
// Initialisation, devices

#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    ffi("cuInit", || state::init(flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    // SAFETY: out-pointer from the caller (null is an error).
    ffi("cuDriverGetVersion", || unsafe { out(v, DRIVER_VERSION) })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> CUresult {
    ffi("cuDeviceGetCount", || {
        let d = drv()?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(n, d.ndev as c_int) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) -> CUresult {
    ffi("cuDeviceGet", || {
        let d = drv()?;
        let o = check_dev(d, ordinal)?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(dev, o as CUdevice) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    ffi("cuDeviceGetName", || {
        let d = drv()?;
        check_dev(d, dev)?;
        if name.is_null() || len <= 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let n = NAME.len().min(len as usize - 1);
        // SAFETY: the caller's buffer holds `len` bytes; we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(NAME.as_ptr() as *const c_char, name, n);
            *name.add(n) = 0;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    ffi("cuDeviceTotalMem_v2", || {
        let d = drv()?;
        check_dev(d, dev)?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(bytes, TOTAL_MEM) }
    })
}

fn attribute(a: u32, dev: u32) -> Res<i32> {
    use sys::CUdevice_attribute as A;
    let is = |x: A| a == x as u32;
    let v = if is(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) {
        SMS as i32
    } else if is(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) {
        (SM_VERSION / 10) as i32
    } else if is(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) {
        (SM_VERSION % 10) as i32
    } else if is(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN) {
        OPTIN_SHARED as i32
    } else if is(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK) {
        DEFAULT_SHARED as i32
    } else if is(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR) {
        228 * 1024
    } else if is(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
        || is(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)
        || is(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)
    {
        1024
    } else if is(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z) {
        64
    } else if is(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X) {
        i32::MAX
    } else if is(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y) || is(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)
    {
        65535
    } else if is(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE) {
        32
    } else if is(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) {
        2048
    } else if is(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR) {
        32
    } else if is(A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK)
        || is(A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)
        || is(A::CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY)
    {
        65536
    } else if is(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE) {
        1_980_000
    } else if is(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE) {
        2_619_000
    } else if is(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH) {
        5120
    } else if is(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE) {
        50 << 20
    } else if is(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) {
        0x18 + dev as i32
    } else if is(A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT) {
        3
    } else if is(A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)
        || is(A::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS)
        || is(A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)
        || is(A::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH)
        || is(A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)
        || is(A::CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED)
        || is(A::CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED)
        || is(A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
        || is(A::CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED)
    {
        1
    } else if is(A::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED) {
        multicast::supported() as i32
    } else if a < A::CU_DEVICE_ATTRIBUTE_MAX as u32 && a > 0 {
        0
    } else {
        return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
            format!("device attribute {a}")
        }));
    };
    Ok(v)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: u32,
    dev: CUdevice,
) -> CUresult {
    ffi("cuDeviceGetAttribute", || {
        let d = drv()?;
        let dev = check_dev(d, dev)?;
        let v = attribute(attrib, dev)?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(pi, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    ffi("cuDeviceCanAccessPeer", || {
        let d = drv()?;
        let a = check_dev(d, dev)?;
        let b = check_dev(d, peer)?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(can, (a != b) as c_int) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: u32, p: *mut *const c_char) -> CUresult {
    ffi("cuGetErrorString", || {
        let s: &'static [u8] = match error {
            0 => b"no error\0",
            1 => b"invalid argument\0",
            2 => b"out of memory\0",
            3 => b"initialization error\0",
            100 => b"no CUDA-capable device is detected\0",
            101 => b"invalid device ordinal\0",
            200 => b"device kernel image is invalid\0",
            201 => b"invalid device context\0",
            209 => b"no kernel image is available for execution on the device\0",
            218 => b"a PTX JIT compilation failed\0",
            400 => b"invalid resource handle\0",
            401 => b"the operation cannot be performed in the present state\0",
            500 => b"named symbol not found\0",
            600 => b"device not ready\0",
            700 => b"an illegal memory access was encountered\0",
            702 => b"the launch timed out and was terminated\0",
            704 => b"peer access is already enabled\0",
            705 => b"peer access has not been enabled\0",
            716 => b"misaligned address\0",
            719 => b"unspecified launch failure\0",
            720 => b"too many blocks in cooperative launch\0",
            801 => b"operation not supported\0",
            900 => b"operation not permitted when stream is capturing\0",
            901 => b"operation failed due to a previous error during capture\0",
            908 => b"attempt to terminate a thread-local capture sequence from another thread\0",
            912 => b"invalid cluster size\0",
            914 => b"invalid resource type\0",
            915 => b"invalid resource configuration\0",
            999 => b"unknown error\0",
            _ => {
                if !p.is_null() {
                    // SAFETY: non-null out-pointer from the caller.
                    unsafe { *p = std::ptr::null() };
                }
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
        };
        // SAFETY: out-pointer from the caller; the string is static and NUL-terminated.
        unsafe { out(p, s.as_ptr() as *const c_char) }
    })
}

// ---------------------------------------------------------------------------------------------
// Contexts

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    ffi("cuDevicePrimaryCtxRetain", || {
        let d = drv()?;
        let dev = check_dev(d, dev)?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(pctx, d.primary[dev as usize].id as CUcontext) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    ffi("cuDevicePrimaryCtxRelease_v2", || {
        let d = drv()?;
        check_dev(d, dev)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    ffi("cuCtxSetCurrent", || {
        let d = drv()?;
        if ctx.is_null() {
            state::set_current(0);
            return Ok(());
        }
        let c = ctx_of(d, ctx)?;
        state::set_current(c.id);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    ffi("cuCtxGetCurrent", || {
        drv()?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(pctx, state::current_id() as CUcontext) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    ffi("cuCtxSynchronize", || {
        let d = drv()?;
        let c = current(d)?;
        capture_guard(d, "cuCtxSynchronize")?;
        for s in exec::streams_of(d, c.id, false) {
            s.drain();
        }
        sticky(d, c.dev)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    ffi("cuCtxGetStreamPriorityRange", || {
        let d = drv()?;
        current(d)?;
        // SAFETY: out-pointers from the caller (either may be null).
        unsafe {
            if !least.is_null() {
                *least = 0;
            }
            if !greatest.is_null() {
                *greatest = -5;
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) -> CUresult {
    ffi("cuCtxEnablePeerAccess", || {
        let d = drv()?;
        let me = current(d)?;
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let p = ctx_of(d, peer)?;
        if p.dev == me.dev {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_DEVICE, || {
                "peer access to a context of the same device".into()
            }));
        }
        if !lock(&d.peers).insert((me.id, p.id)) {
            return Err(CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Memory

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    ffi("cuMemAlloc_v2", || {
        let d = drv()?;
        let c = current(d)?;
        capture_guard(d, "cuMemAlloc")?;
        sticky(d, c.dev)?;
        if bytes == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if dptr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let a = d
            .mem
            .alloc(bytes as u64, c.dev)
            .map_err(|e| fail(CUresult::CUDA_ERROR_OUT_OF_MEMORY, || e.to_string()))?;
        let base = a.base;
        lock(&d.allocs).insert(base, a);
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(dptr, base) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    ffi("cuMemFree_v2", || {
        let d = drv()?;
        current(d)?;
        capture_guard(d, "cuMemFree")?;
        let Some(a) = lock(&d.allocs).get(&dptr).cloned() else {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                format!("cuMemFree({dptr:#x}): not an allocation base")
            }));
        };
        // cuMemFree synchronises the device implicitly (work still using it completes first).
        if std::env::var("PTXFORGE_FAKECUDA_FREE_SYNC").as_deref() != Ok("0") {
            exec::drain_device(d, a.device);
        }
        lock(&d.allocs).remove(&dptr);
        d.mem.free(dptr);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytes: usize,
    _flags: c_uint,
) -> CUresult {
    ffi("cuMemHostAlloc", || {
        let d = drv()?;
        current(d)?;
        capture_guard(d, "cuMemHostAlloc")?;
        if bytes == 0 || pp.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let layout = std::alloc::Layout::from_size_align(bytes, 4096)
            .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: non-zero size layout.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        lock(&d.host).insert(p as usize, layout);
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(pp, p as *mut c_void) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    ffi("cuMemFreeHost", || {
        let d = drv()?;
        capture_guard(d, "cuMemFreeHost")?;
        let Some(layout) = lock(&d.host).remove(&(p as usize)) else {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                format!("cuMemFreeHost({p:?}): not from cuMemHostAlloc")
            }));
        };
        // SAFETY: allocated by cuMemHostAlloc with this layout, freed once (removed above).
        unsafe { std::alloc::dealloc(p as *mut u8, layout) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    s: CUstream,
) -> CUresult {
    ffi("cuMemcpyHtoDAsync_v2", || {
        let d = drv()?;
        if n == 0 {
            return Ok(());
        }
        if src.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        check_range(d, dst, n)?;
        exec::submit(
            d,
            h(s),
            Op::HtoD {
                dst,
                src: src as usize,
                len: n,
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    ffi("cuMemcpyDtoHAsync_v2", || {
        let d = drv()?;
        if n == 0 {
            return Ok(());
        }
        if dst.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        check_range(d, src, n)?;
        exec::submit(
            d,
            h(s),
            Op::DtoH {
                dst: dst as usize,
                src,
                len: n,
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    ffi("cuMemcpyDtoDAsync_v2", || {
        let d = drv()?;
        if n == 0 {
            return Ok(());
        }
        check_range(d, dst, n)?;
        check_range(d, src, n)?;
        exec::submit(d, h(s), Op::DtoD { dst, src, len: n })
    })
}

fn memset(dst: CUdeviceptr, pattern: Vec<u8>, n: usize, s: CUstream) -> Res {
    let d = drv()?;
    if n == 0 {
        return Ok(());
    }
    let len = n * pattern.len();
    if !dst.is_multiple_of(pattern.len() as u64) {
        return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
            format!(
                "memset of {}-byte elements at unaligned {dst:#x}",
                pattern.len()
            )
        }));
    }
    check_range(d, dst, len)?;
    exec::submit(d, h(s), Op::Memset { dst, len, pattern })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(
    dst: CUdeviceptr,
    v: u8,
    n: usize,
    s: CUstream,
) -> CUresult {
    ffi("cuMemsetD8Async", || memset(dst, vec![v], n, s))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16Async(
    dst: CUdeviceptr,
    v: u16,
    n: usize,
    s: CUstream,
) -> CUresult {
    ffi("cuMemsetD16Async", || {
        memset(dst, v.to_le_bytes().to_vec(), n, s)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32Async(
    dst: CUdeviceptr,
    v: u32,
    n: usize,
    s: CUstream,
) -> CUresult {
    ffi("cuMemsetD32Async", || {
        memset(dst, v.to_le_bytes().to_vec(), n, s)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attr: u32,
    ptr: CUdeviceptr,
) -> CUresult {
    use sys::CUpointer_attribute as P;
    ffi("cuPointerGetAttribute", || {
        let d = drv()?;
        if data.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let a = check_range(d, ptr, 1)?;
        // SAFETY: `data` points to storage of the attribute's type (the API contract).
        unsafe {
            if attr == P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL as u32 {
                out(data as *mut c_int, a.device as c_int)
            } else if attr == P::CU_POINTER_ATTRIBUTE_CONTEXT as u32 {
                out(
                    data as *mut CUcontext,
                    d.primary[a.device as usize].id as CUcontext,
                )
            } else if attr == P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE as u32 {
                out(
                    data as *mut c_uint,
                    sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as c_uint,
                )
            } else if attr == P::CU_POINTER_ATTRIBUTE_DEVICE_POINTER as u32 {
                out(data as *mut CUdeviceptr, ptr)
            } else if attr == P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR as u32 {
                out(data as *mut CUdeviceptr, a.base)
            } else if attr == P::CU_POINTER_ATTRIBUTE_RANGE_SIZE as u32 {
                out(data as *mut usize, a.size as usize)
            } else {
                Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                    format!("pointer attribute {attr}")
                }))
            }
        }
    })
}

const IPC_MAGIC: &[u8; 8] = b"FAKEIPC\0";
/// A handle of a shared-memory allocation: another process's fake driver can open it.
const SHM_MAGIC: &[u8; 8] = b"FAKESHM\0";

/// Handle bytes: magic, base, size, pid; for shared allocations also the device and the
/// segment number (`[28..32)`, `[32..40)`). The opener names the segment with its own
/// `PTXFORGE_JOB_ID`: processes of one job share it.
fn ipc_bytes(a: &emu::Allocation) -> [u8; 64] {
    let mut r = [0u8; 64];
    let spec = a.shared_spec();
    r[..8].copy_from_slice(if spec.is_some() { SHM_MAGIC } else { IPC_MAGIC });
    r[8..16].copy_from_slice(&a.base.to_le_bytes());
    r[16..24].copy_from_slice(&a.size.to_le_bytes());
    let pid = spec.as_ref().map_or(std::process::id(), |s| s.id.pid);
    r[24..28].copy_from_slice(&pid.to_le_bytes());
    if let Some(s) = spec {
        r[28..32].copy_from_slice(&s.device.to_le_bytes());
        r[32..40].copy_from_slice(&s.id.n.to_le_bytes());
    }
    r
}

fn le_u64(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[..8]);
    u64::from_le_bytes(w)
}

fn le_u32(b: &[u8]) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[..4]);
    u32::from_le_bytes(w)
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(ph: *mut CUipcMemHandle, dptr: CUdeviceptr) -> CUresult {
    ffi("cuIpcGetMemHandle", || {
        let d = drv()?;
        let Some(a) = lock(&d.allocs).get(&dptr).cloned() else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        let mut hd = CUipcMemHandle { reserved: [0; 64] };
        for (o, b) in hd.reserved.iter_mut().zip(ipc_bytes(&a)) {
            *o = b as c_char;
        }
        // SAFETY: out-pointer from the caller.
        unsafe { out(ph, hd) }
    })
}

/// Maps another process's shared allocation (`FAKESHM` handle) at its address.
fn open_peer(d: &state::Driver, r: &[u8]) -> Res<u64> {
    let job = emu::memory::shm::job_id()
        .map_err(|e| fail(CUresult::CUDA_ERROR_INVALID_VALUE, || e.to_string()))?;
    let spec = emu::SegmentSpec {
        id: emu::SegmentId {
            job,
            pid: le_u32(&r[24..28]),
            n: le_u64(&r[32..40]),
        },
        base: le_u64(&r[8..16]),
        size: le_u64(&r[16..24]),
        device: le_u32(&r[28..32]),
    };
    let a = d
        .mem
        .open_shared(&spec)
        .map_err(|e| fail(CUresult::CUDA_ERROR_INVALID_VALUE, || e.to_string()))?;
    Ok(a.base)
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    pd: *mut CUdeviceptr,
    hd: CUipcMemHandle,
    _flags: c_uint,
) -> CUresult {
    ffi("cuIpcOpenMemHandle_v2", || {
        let d = drv()?;
        current(d)?;
        let r: Vec<u8> = hd.reserved.iter().map(|&c| c as u8).collect();
        let shared = &r[..8] == SHM_MAGIC;
        if !shared && &r[..8] != IPC_MAGIC {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let base = le_u64(&r[8..16]);
        let base = if shared && le_u32(&r[24..28]) != std::process::id() {
            open_peer(d, &r)?
        } else if lock(&d.allocs).contains_key(&base) {
            base
        } else {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                "IPC handle of freed memory (or of process-local memory of another process: \
                 set PTXFORGE_EMU_SHM=1 in the exporter)"
                    .into()
            }));
        };
        // SAFETY: out-pointer from the caller.
        unsafe { out(pd, base) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult {
    ffi("cuIpcCloseMemHandle", || {
        // unmaps a peer's segment at its last close (no-op for same-process opens)
        drv()?.mem.close_shared(dptr);
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Modules and JIT

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut CUmodule,
    image: *const c_void,
    n: c_uint,
    keys: *mut u32,
    vals: *mut *mut c_void,
) -> CUresult {
    ffi("cuModuleLoadDataEx", || {
        let d = drv()?;
        let c = current(d)?;
        if image.is_null() || module.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: option arrays of `n` entries per the API contract.
        let o = unsafe { jit::JitOpts::parse(n, keys, vals)? };
        // SAFETY: the image is a NUL-terminated PTX string or a binary image (API contract).
        let (text, cubin) = match unsafe { jit::image_text(image) } {
            Ok(t) => t,
            Err((code, log)) => {
                o.write_error(&log);
                return Err(fail(code, || log));
            }
        };
        let checked = if cubin {
            ptx::parse(&text).map_err(|e| (CUresult::CUDA_ERROR_INVALID_IMAGE, e.to_string()))
        } else {
            jit::check_ptx(&text, &o)
        };
        let loaded = checked.and_then(|m| jit::load(d, c, m));
        match loaded {
            Ok((m, info)) => {
                o.write_info(&info);
                let id = d.new_id();
                lock(&d.modules).insert(id, Arc::new(m));
                // SAFETY: non-null out-pointer from the caller.
                unsafe { out(module, id as CUmodule) }
            }
            Err((code, log)) => {
                o.write_error(&log);
                Err(fail(code, || log))
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(m: CUmodule) -> CUresult {
    ffi("cuModuleUnload", || {
        let d = drv()?;
        let Some(m) = lock(&d.modules).remove(&h(m)) else {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        };
        jit::unload(d, &m);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    pf: *mut CUfunction,
    m: CUmodule,
    name: *const c_char,
) -> CUresult {
    ffi("cuModuleGetFunction", || {
        let d = drv()?;
        if name.is_null() || pf.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let Some(m) = lock(&d.modules).get(&h(m)).cloned() else {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        };
        // SAFETY: NUL-terminated name (API contract).
        let name = unsafe { std::ffi::CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?
            .to_string();
        let mut funcs = lock(&m.funcs);
        if let Some(&id) = funcs.get(&name) {
            // SAFETY: non-null out-pointer.
            return unsafe { out(pf, id as CUfunction) };
        }
        if m.loaded.module.entries().all(|f| f.name != name) {
            return Err(fail(CUresult::CUDA_ERROR_NOT_FOUND, || {
                format!("no kernel `{name}`")
            }));
        }
        let prog = m
            .loaded
            .kernel(&name)
            .map_err(|e| fail(CUresult::CUDA_ERROR_NOT_FOUND, || e.to_string()))?;
        let id = d.new_id();
        let f = jit::Func {
            module: m.clone(),
            max_dynamic_shared: (DEFAULT_SHARED.saturating_sub(prog.static_shared)).into(),
            prog,
            non_portable_clusters: false.into(),
        };
        lock(&d.funcs).insert(id, Arc::new(f));
        funcs.insert(name, id);
        // SAFETY: non-null out-pointer.
        unsafe { out(pf, id as CUfunction) }
    })
}

fn func_of(d: &state::Driver, f: CUfunction) -> Res<Arc<jit::Func>> {
    lock(&d.funcs).get(&h(f)).cloned().ok_or_else(|| {
        fail(CUresult::CUDA_ERROR_INVALID_HANDLE, || {
            format!("function {:#x}", h(f))
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(pi: *mut c_int, attr: u32, f: CUfunction) -> CUresult {
    use sys::CUfunction_attribute as F;
    ffi("cuFuncGetAttribute", || {
        let d = drv()?;
        let f = func_of(d, f)?;
        let p = &f.prog;
        let is = |x: F| attr == x as u32;
        let v = if is(F::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES) {
            p.static_shared as i32
        } else if is(F::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK) {
            p.maxntid
                .or(p.reqntid)
                .map(|t| t.iter().product::<u32>() as i32)
                .unwrap_or(1024)
        } else if is(F::CU_FUNC_ATTRIBUTE_NUM_REGS) {
            p.nregs.min(255) as i32
        } else if is(F::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES) {
            p.local_bytes as i32
        } else if is(F::CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES) {
            0
        } else if is(F::CU_FUNC_ATTRIBUTE_PTX_VERSION) || is(F::CU_FUNC_ATTRIBUTE_BINARY_VERSION) {
            SM_VERSION as i32
        } else if is(F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
            f.max_dynamic_shared.load(Ordering::Relaxed) as i32
        } else if is(F::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED) {
            f.non_portable_clusters.load(Ordering::Relaxed) as i32
        } else {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                format!("function attribute {attr}")
            }));
        };
        // SAFETY: out-pointer from the caller.
        unsafe { out(pi, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncSetAttribute(f: CUfunction, attr: u32, value: c_int) -> CUresult {
    use sys::CUfunction_attribute as F;
    ffi("cuFuncSetAttribute", || {
        let d = drv()?;
        let f = func_of(d, f)?;
        if attr == F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as u32 {
            if value < 0 || value as u32 + f.prog.static_shared > OPTIN_SHARED {
                return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                    format!(
                        "MAX_DYNAMIC_SHARED_SIZE_BYTES = {value} + {} static exceeds {OPTIN_SHARED}",
                        f.prog.static_shared
                    )
                }));
            }
            f.max_dynamic_shared.store(value as u32, Ordering::Relaxed);
            Ok(())
        } else if attr == F::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED as u32 {
            f.non_portable_clusters.store(value != 0, Ordering::Relaxed);
            Ok(())
        } else if attr == F::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT as u32
            || attr == F::CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE as u32
        {
            Ok(())
        } else {
            Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                format!("cuFuncSetAttribute({attr})")
            }))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkCreate_v2(
    n: c_uint,
    keys: *mut u32,
    vals: *mut *mut c_void,
    st: *mut CUlinkState,
) -> CUresult {
    ffi("cuLinkCreate_v2", || {
        let d = drv()?;
        current(d)?;
        if st.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: option arrays of `n` entries (API contract); they (and the log buffers) stay
        // valid until cuLinkDestroy.
        let opts = unsafe { jit::JitOpts::parse(n, keys, vals)? };
        let id = d.new_id();
        lock(&d.links).insert(
            id,
            Arc::new(std::sync::Mutex::new(jit::Link {
                opts,
                ptx: None,
                cubin: Vec::new(),
            })),
        );
        // SAFETY: non-null out-pointer.
        unsafe { out(st, id as CUlinkState) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkAddData_v2(
    st: CUlinkState,
    ty: u32,
    data: *mut c_void,
    size: usize,
    _name: *const c_char,
    n: c_uint,
    keys: *mut u32,
    vals: *mut *mut c_void,
) -> CUresult {
    ffi("cuLinkAddData_v2", || {
        let d = drv()?;
        let Some(l) = lock(&d.links).get(&h(st)).cloned() else {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        };
        // SAFETY: option arrays of `n` entries (API contract).
        unsafe { jit::JitOpts::parse(n, keys, vals)? };
        if data.is_null() || size == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut l = lock(&l);
        if ty != sys::CUjitInputType::CU_JIT_INPUT_PTX as u32 {
            let log = "fakecuda: only PTX can be linked (cubins, fatbins and objects hold SASS the emulator cannot run)\n";
            l.opts.write_error(log);
            return Err(fail(CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU, || log.into()));
        }
        if l.ptx.is_some() {
            let log = "fakecuda: linking several PTX inputs is not modelled\n";
            l.opts.write_error(log);
            return Err(fail(CUresult::CUDA_ERROR_NOT_SUPPORTED, || log.into()));
        }
        // SAFETY: `size` bytes of PTX at `data` (API contract).
        let bytes = unsafe { std::slice::from_raw_parts(data as *const u8, size) };
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        let text =
            std::str::from_utf8(&bytes[..end]).map_err(|_| CUresult::CUDA_ERROR_INVALID_PTX)?;
        match jit::check_ptx(text, &l.opts) {
            Ok(_) => {
                l.ptx = Some(text.to_string());
                Ok(())
            }
            Err((code, log)) => {
                l.opts.write_error(&log);
                Err(fail(code, || log))
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkComplete(
    st: CUlinkState,
    cubin: *mut *mut c_void,
    size: *mut usize,
) -> CUresult {
    ffi("cuLinkComplete", || {
        let d = drv()?;
        let Some(l) = lock(&d.links).get(&h(st)).cloned() else {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        };
        let mut l = lock(&l);
        let Some(text) = l.ptx.clone() else {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                "nothing to link".into()
            }));
        };
        l.cubin = jit::fake_cubin(&text);
        let entries = ptx::parse(&text)
            .map(|m| {
                m.entries()
                    .map(|f| f.name.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        l.opts.write_info(&format!(
            "fakecuda: linked a fake cubin (PTX kept) with entries {entries}\n"
        ));
        // SAFETY: out-pointers from the caller; the cubin lives until cuLinkDestroy.
        unsafe {
            out(cubin, l.cubin.as_mut_ptr() as *mut c_void)?;
            out(size, l.cubin.len())
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkDestroy(st: CUlinkState) -> CUresult {
    ffi("cuLinkDestroy", || {
        let d = drv()?;
        lock(&d.links)
            .remove(&h(st))
            .map(|_| ())
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    })
}

// ---------------------------------------------------------------------------------------------
// Launch

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    cfg: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    ffi("cuLaunchKernelEx", || {
        let d = drv()?;
        if cfg.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null config from the caller.
        let c = unsafe { &*cfg };
        let f = func_of(d, f)?;
        let (ctx, stream) = match exec::stream(d, h(c.hStream))? {
            Some(s) => (s.ctx.clone(), Some(s)),
            None => (current(d)?, None),
        };
        if ctx.id != f.module.ctx.id {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_HANDLE, || {
                format!(
                    "kernel `{}` belongs to context {:#x}, the stream to context {:#x} (a CUfunction is per context)",
                    f.prog.name, f.module.ctx.id, ctx.id
                )
            }));
        }
        sticky(d, ctx.dev)?;
        let grid = [c.gridDimX, c.gridDimY, c.gridDimZ];
        let block = [c.blockDimX, c.blockDimY, c.blockDimZ];
        let threads: u64 = block.iter().map(|&x| x as u64).product();
        let bad = |why: String| fail(CUresult::CUDA_ERROR_INVALID_VALUE, || why);
        if grid.contains(&0)
            || block.contains(&0)
            || grid[0] > i32::MAX as u32
            || grid[1] > 65535
            || grid[2] > 65535
        {
            return Err(bad(format!("grid {grid:?} / block {block:?}")));
        }
        let max_threads = f
            .prog
            .maxntid
            .map(|t| t.iter().product::<u32>() as u64)
            .unwrap_or(1024);
        if threads > max_threads.min(1024) || block[0] > 1024 || block[1] > 1024 || block[2] > 64 {
            return Err(bad(format!(
                "block {block:?} exceeds the kernel's limit of {max_threads} threads"
            )));
        }
        // Attributes.
        let mut cluster = [1u32; 3];
        let mut cooperative = false;
        if c.numAttrs > 0 {
            if c.attrs.is_null() {
                return Err(bad("numAttrs > 0 with null attrs".into()));
            }
            for i in 0..c.numAttrs as usize {
                // SAFETY: `numAttrs` entries at `attrs` (API contract); the id is read as its
                // raw u32 and the union only for the ids that select a member.
                let (id, a) = unsafe {
                    let p = c.attrs.add(i);
                    (*(p as *const u32), &*p)
                };
                use sys::CUlaunchAttributeID as L;
                if id == L::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION as u32 {
                    // SAFETY: the id selects the clusterDim member.
                    let cd = unsafe { a.value.clusterDim };
                    cluster = [cd.x, cd.y, cd.z];
                } else if id == L::CU_LAUNCH_ATTRIBUTE_COOPERATIVE as u32 {
                    // SAFETY: the id selects the cooperative member.
                    cooperative = unsafe { a.value.cooperative } != 0;
                } else if id > 64 {
                    return Err(bad(format!("launch attribute id {id}")));
                }
            }
        }
        let csize: u32 = cluster.iter().product();
        if cluster.contains(&0) || (0..3).any(|i| grid[i] % cluster[i] != 0) {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_CLUSTER_SIZE, || {
                format!("cluster {cluster:?} does not tile grid {grid:?}")
            }));
        }
        let max_cluster = if f.non_portable_clusters.load(Ordering::Relaxed) {
            16
        } else {
            8
        };
        if csize > max_cluster {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_CLUSTER_SIZE, || {
                format!("cluster of {csize} CTAs (limit {max_cluster}; more than 8 needs NON_PORTABLE_CLUSTER_SIZE_ALLOWED)")
            }));
        }
        // Shared memory: 48 KiB in total unless the kernel opted in to more dynamic memory.
        let st = f.prog.static_shared;
        let dynamic = c.sharedMemBytes;
        let limit = f.max_dynamic_shared.load(Ordering::Relaxed);
        if st as u64 + dynamic as u64 > OPTIN_SHARED as u64
            || (st as u64 + dynamic as u64 > DEFAULT_SHARED as u64 && dynamic > limit)
        {
            return Err(bad(format!(
                "kernel `{}`: {dynamic} bytes of dynamic shared memory (+ {st} static) exceed its limit of {limit} (raise CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                f.prog.name
            )));
        }
        let ctas: u64 = grid.iter().map(|&x| x as u64).product();
        if cooperative {
            let warps = threads.div_ceil(32);
            let per_sm = (64 / warps.max(1)).clamp(1, 32);
            let smem = st as u64 + dynamic as u64;
            let per_sm = match (228 * 1024u64).checked_div(smem) {
                Some(q) => per_sm.min(q.max(1)),
                None => per_sm,
            };
            if ctas > per_sm * ctx.sm_count as u64 {
                return Err(fail(
                    CUresult::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
                    || format!("{ctas} CTAs cannot all be resident on {} SMs", ctx.sm_count),
                ));
            }
        }
        if !extra.is_null() {
            return Err(fail(CUresult::CUDA_ERROR_NOT_SUPPORTED, || {
                "`extra` launch parameters".into()
            }));
        }
        // Parameters: kernelParams[i] points to the value of parameter i.
        let slots = &f.prog.params;
        let mut buf = vec![0u8; f.prog.param_bytes as usize];
        if !slots.is_empty() && params.is_null() {
            return Err(bad(format!(
                "kernel `{}` has {} parameters but kernelParams is null",
                f.prog.name,
                slots.len()
            )));
        }
        for (i, p) in slots.iter().enumerate() {
            // SAFETY: kernelParams has one pointer per kernel parameter, each to `size` bytes
            // of the value (the API contract this fake exists to check).
            unsafe {
                let v = *params.add(i) as *const u8;
                if v.is_null() {
                    return Err(bad(format!("kernelParams[{i}] is null")));
                }
                let o = p.offset as usize;
                std::ptr::copy_nonoverlapping(
                    v,
                    buf[o..o + p.size as usize].as_mut_ptr(),
                    p.size as usize,
                );
            }
        }
        let job = exec::LaunchJob {
            prog: f.prog.clone(),
            params: buf,
            cfg: emu::LaunchConfig {
                grid,
                block,
                shared_bytes: dynamic,
                sms: ctx.sm_count,
                sm_offset: ctx.sm_offset,
                device_sms: SMS,
                cluster,
            },
            _module: f.module.clone(),
        };
        let op = Op::Launch(Arc::new(job));
        match stream {
            Some(s) => s.push(op),
            None => exec::submit(d, 0, op),
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Streams, events, graphs

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    ps: *mut CUstream,
    flags: c_uint,
    _prio: c_int,
) -> CUresult {
    ffi("cuStreamCreateWithPriority", || {
        let d = drv()?;
        let c = current(d)?;
        if flags > 1 || ps.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let s = Stream::new(d, c, flags == 0)?;
        // SAFETY: non-null out-pointer.
        unsafe { out(ps, s.id as CUstream) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(s: CUstream) -> CUresult {
    ffi("cuStreamDestroy_v2", || {
        let d = drv()?;
        let Some(s) = lock(&d.streams).remove(&h(s)) else {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        };
        lock(&d.captures).retain(|c| c.stream != s.id);
        s.close();
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(s: CUstream) -> CUresult {
    ffi("cuStreamSynchronize", || {
        let d = drv()?;
        match exec::stream(d, h(s))? {
            Some(s) => {
                if s.is_capturing() {
                    s.invalidate_capture();
                    return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
                }
                s.drain();
                sticky(d, s.ctx.dev)
            }
            None => {
                let c = current(d)?;
                for s in exec::streams_of(d, c.id, true) {
                    s.drain();
                }
                sticky(d, c.dev)
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(s: CUstream, e: CUevent, flags: c_uint) -> CUresult {
    ffi("cuStreamWaitEvent", || {
        let d = drv()?;
        if flags > 1 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let ev = event_of(d, e)?;
        let gen = lock(&ev.st).recorded;
        if gen == 0 {
            return Ok(());
        }
        match exec::stream(d, h(s))? {
            Some(s) => s.push(Op::Wait(ev, gen)),
            None => {
                ev.wait_for(gen);
                Ok(())
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(s: CUstream, mode: u32) -> CUresult {
    ffi("cuStreamBeginCapture_v2", || {
        let d = drv()?;
        if mode > 2 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let Some(s) = exec::stream(d, h(s))? else {
            return Err(fail(
                CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                || "the legacy stream cannot be captured".into(),
            ));
        };
        let mut c = lock(&s.capture);
        if c.is_some() {
            return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
        }
        let thread = std::thread::current().id();
        *c = Some(exec::Capture {
            ops: Vec::new(),
            mode,
            thread,
            invalidated: false,
        });
        lock(&d.captures).push(state::ActiveCapture {
            stream: s.id,
            mode,
            thread,
        });
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(s: CUstream, pg: *mut CUgraph) -> CUresult {
    ffi("cuStreamEndCapture", || {
        let d = drv()?;
        let Some(s) = exec::stream(d, h(s))? else {
            return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
        };
        let mut c = lock(&s.capture);
        let Some(cap) = c.as_ref() else {
            return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
        };
        if cap.mode == sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL as u32
            && cap.thread != std::thread::current().id()
        {
            return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
        }
        let cap = c.take().ok_or(CUresult::CUDA_ERROR_ILLEGAL_STATE)?;
        lock(&d.captures).retain(|x| x.stream != s.id);
        if cap.invalidated {
            if !pg.is_null() {
                // SAFETY: non-null out-pointer.
                unsafe { *pg = std::ptr::null_mut() };
            }
            return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        let id = d.new_id();
        lock(&d.graphs).insert(id, Arc::new(cap.ops));
        // SAFETY: out-pointer from the caller.
        unsafe { out(pg, id as CUgraph) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    pe: *mut CUgraphExec,
    g: CUgraph,
    _flags: c_ulonglong,
) -> CUresult {
    ffi("cuGraphInstantiateWithFlags", || {
        let d = drv()?;
        let Some(ops) = lock(&d.graphs).get(&h(g)).cloned() else {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        };
        let id = d.new_id();
        lock(&d.execs).insert(id, Arc::new(ops.as_ref().clone()));
        // SAFETY: out-pointer from the caller.
        unsafe { out(pe, id as CUgraphExec) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(e: CUgraphExec, s: CUstream) -> CUresult {
    ffi("cuGraphLaunch", || {
        let d = drv()?;
        let Some(ops) = lock(&d.execs).get(&h(e)).cloned() else {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        };
        for op in ops.iter() {
            exec::submit(d, h(s), op.clone())?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(g: CUgraph) -> CUresult {
    ffi("cuGraphDestroy", || {
        let d = drv()?;
        lock(&d.graphs)
            .remove(&h(g))
            .map(|_| ())
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(e: CUgraphExec) -> CUresult {
    ffi("cuGraphExecDestroy", || {
        let d = drv()?;
        lock(&d.execs)
            .remove(&h(e))
            .map(|_| ())
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(pe: *mut CUevent, flags: c_uint) -> CUresult {
    ffi("cuEventCreate", || {
        let d = drv()?;
        let c = current(d)?;
        if flags & !0x7 != 0 || pe.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let id = d.new_id();
        lock(&d.events).insert(id, Arc::new(Event::new(flags & 0x2 == 0, c.dev)));
        // SAFETY: non-null out-pointer.
        unsafe { out(pe, id as CUevent) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(e: CUevent) -> CUresult {
    ffi("cuEventDestroy_v2", || {
        let d = drv()?;
        lock(&d.events)
            .remove(&h(e))
            .map(|_| ())
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(e: CUevent, s: CUstream) -> CUresult {
    ffi("cuEventRecord", || {
        let d = drv()?;
        let ev = event_of(d, e)?;
        let stream = exec::stream(d, h(s))?;
        let dev = match &stream {
            Some(s) => s.ctx.dev,
            None => current(d)?.dev,
        };
        if dev != ev.dev {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_HANDLE, || {
                "event and stream belong to different devices".into()
            }));
        }
        if stream.as_ref().is_some_and(|s| s.is_capturing()) {
            return Ok(()); // a capture dependency, not a node
        }
        let gen = {
            let mut g = lock(&ev.st);
            g.recorded += 1;
            g.recorded
        };
        exec::submit(d, h(s), Op::Record(ev, gen))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(e: CUevent) -> CUresult {
    ffi("cuEventQuery", || {
        let d = drv()?;
        let ev = event_of(d, e)?;
        let g = lock(&ev.st);
        if g.completed < g.recorded {
            Err(CUresult::CUDA_ERROR_NOT_READY)
        } else {
            Ok(())
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(e: CUevent) -> CUresult {
    ffi("cuEventSynchronize", || {
        let d = drv()?;
        let ev = event_of(d, e)?;
        let gen = lock(&ev.st).recorded;
        let _waiting = emu::clock::HostWait::begin();
        ev.wait_for(gen);
        sticky(d, ev.dev)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    ffi("cuEventElapsedTime", || {
        let d = drv()?;
        let (a, b) = (event_of(d, start)?, event_of(d, end)?);
        if !a.timing || !b.timing {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_HANDLE, || {
                "an event created with CU_EVENT_DISABLE_TIMING".into()
            }));
        }
        let (ga, gb) = (lock(&a.st), lock(&b.st));
        if ga.recorded == 0 || gb.recorded == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        if ga.completed < ga.recorded || gb.completed < gb.recorded {
            return Err(CUresult::CUDA_ERROR_NOT_READY);
        }
        let (Some(ta), Some(tb)) = (ga.time, gb.time) else {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        };
        let v = if tb >= ta {
            (tb - ta).as_secs_f64() * 1e3
        } else {
            -((ta - tb).as_secs_f64() * 1e3)
        };
        // SAFETY: out-pointer from the caller.
        unsafe { out(ms, v as f32) }
    })
}

// ---------------------------------------------------------------------------------------------
// Green contexts

const RES_MAGIC: &[u8; 4] = b"FKSM";

fn write_res(r: &mut CUdevResource, dev: u32, offset: u32, count: u32) {
    r.type_ = sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM;
    r._internal_padding = [0; 92];
    r._internal_padding[..4].copy_from_slice(RES_MAGIC);
    r._internal_padding[4..8].copy_from_slice(&dev.to_le_bytes());
    r._internal_padding[8..12].copy_from_slice(&offset.to_le_bytes());
    r.__bindgen_anon_1._oversize = [0; 48];
    r.__bindgen_anon_1.sm.smCount = count;
}

/// # Safety
/// `r` must point to a `CUdevResource`.
unsafe fn read_res(r: *const CUdevResource) -> Res<Desc> {
    if r.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's resource; its type is read as a raw u32 before trusting it.
    let (ty, pad, count) = unsafe {
        (
            *(r as *const u32),
            (*r)._internal_padding,
            (*r).__bindgen_anon_1.sm.smCount,
        )
    };
    if ty != sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM as u32 {
        return Err(CUresult::CUDA_ERROR_INVALID_RESOURCE_TYPE);
    }
    if &pad[..4] != RES_MAGIC {
        return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
            "an SM resource not produced by the driver".into()
        }));
    }
    let u = |o: usize| u32::from_le_bytes([pad[o], pad[o + 1], pad[o + 2], pad[o + 3]]);
    Ok(Desc {
        dev: u(4),
        offset: u(8),
        count,
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDevResource(
    dev: CUdevice,
    res: *mut CUdevResource,
    ty: u32,
) -> CUresult {
    ffi("cuDeviceGetDevResource", || {
        let d = drv()?;
        let dev = check_dev(d, dev)?;
        if ty != sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM as u32 {
            return Err(CUresult::CUDA_ERROR_INVALID_RESOURCE_TYPE);
        }
        if res.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null out-pointer to a CUdevResource.
        write_res(unsafe { &mut *res }, dev, 0, SMS);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevSmResourceSplitByCount(
    result: *mut CUdevResource,
    nb: *mut c_uint,
    input: *const CUdevResource,
    remaining: *mut CUdevResource,
    _flags: c_uint,
    min_count: c_uint,
) -> CUresult {
    ffi("cuDevSmResourceSplitByCount", || {
        drv()?;
        // SAFETY: the caller's input resource.
        let inp = unsafe { read_res(input)? };
        if nb.is_null() || min_count == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // Hopper: groups of at least 8 SMs, in multiples of 8.
        let count = min_count.max(8).div_ceil(8) * 8;
        let possible = inp.count / count;
        if result.is_null() {
            // SAFETY: non-null out-pointer.
            unsafe { *nb = possible };
            return Ok(());
        }
        // SAFETY: non-null in/out pointer.
        let want = unsafe { *nb };
        let n = want.min(possible);
        if n == 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
                || format!("cannot make a group of {count} SMs out of {}", inp.count),
            ));
        }
        for i in 0..n {
            // SAFETY: `result` has room for `*nb >= n` resources (API contract).
            write_res(
                unsafe { &mut *result.add(i as usize) },
                inp.dev,
                inp.offset + i * count,
                count,
            );
        }
        if !remaining.is_null() {
            // SAFETY: non-null out-pointer.
            write_res(
                unsafe { &mut *remaining },
                inp.dev,
                inp.offset + n * count,
                inp.count - n * count,
            );
        }
        // SAFETY: non-null out-pointer.
        unsafe { *nb = n };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevResourceGenerateDesc(
    pd: *mut CUdevResourceDesc,
    res: *mut CUdevResource,
    n: c_uint,
) -> CUresult {
    ffi("cuDevResourceGenerateDesc", || {
        let d = drv()?;
        if n == 0 || res.is_null() || pd.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut v = Vec::new();
        for i in 0..n as usize {
            // SAFETY: `n` resources at `res` (API contract).
            v.push(unsafe { read_res(res.add(i))? });
        }
        v.sort_by_key(|r| r.offset);
        let first = v[0];
        let mut end = first.offset + first.count;
        for r in &v[1..] {
            if r.dev != first.dev || r.offset != end {
                return Err(fail(
                    CUresult::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
                    || "the fake only combines adjacent SM groups of one device".into(),
                ));
            }
            end += r.count;
        }
        if first.count == 0 && v.len() == 1 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
                || "an empty SM resource".into(),
            ));
        }
        let id = d.new_id();
        lock(&d.descs).insert(
            id,
            Desc {
                dev: first.dev,
                offset: first.offset,
                count: end - first.offset,
            },
        );
        // SAFETY: non-null out-pointer.
        unsafe { out(pd, id as CUdevResourceDesc) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxCreate(
    pg: *mut CUgreenCtx,
    desc: CUdevResourceDesc,
    dev: CUdevice,
    flags: c_uint,
) -> CUresult {
    ffi("cuGreenCtxCreate", || {
        let d = drv()?;
        let dev = check_dev(d, dev)?;
        if flags != sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32 {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                "cuGreenCtxCreate flags must be CU_GREEN_CTX_DEFAULT_STREAM".into()
            }));
        }
        let Some(r) = lock(&d.descs).get(&h(desc)).copied() else {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        };
        if r.dev != dev {
            return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
        }
        let ctx = Arc::new(Ctx {
            id: d.new_id(),
            dev,
            sm_offset: r.offset,
            sm_count: r.count,
            green: true,
        });
        lock(&d.ctxs).insert(ctx.id, ctx.clone());
        let id = d.new_id();
        lock(&d.greens).insert(id, Arc::new(Green { ctx }));
        // SAFETY: out-pointer from the caller.
        unsafe { out(pg, id as CUgreenCtx) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxDestroy(g: CUgreenCtx) -> CUresult {
    ffi("cuGreenCtxDestroy", || {
        let d = drv()?;
        let Some(g) = lock(&d.greens).remove(&h(g)) else {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        };
        debug_assert!(g.ctx.green);
        lock(&d.ctxs).remove(&g.ctx.id);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxFromGreenCtx(pc: *mut CUcontext, g: CUgreenCtx) -> CUresult {
    ffi("cuCtxFromGreenCtx", || {
        let d = drv()?;
        let Some(g) = lock(&d.greens).get(&h(g)).cloned() else {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        };
        // SAFETY: out-pointer from the caller.
        unsafe { out(pc, g.ctx.id as CUcontext) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxStreamCreate(
    ps: *mut CUstream,
    g: CUgreenCtx,
    flags: c_uint,
    _prio: c_int,
) -> CUresult {
    ffi("cuGreenCtxStreamCreate", || {
        let d = drv()?;
        let Some(g) = lock(&d.greens).get(&h(g)).cloned() else {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        };
        if flags != sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32 {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                "cuGreenCtxStreamCreate flags must be CU_STREAM_NON_BLOCKING".into()
            }));
        }
        if ps.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let s = Stream::new(d, g.ctx.clone(), false)?;
        // SAFETY: non-null out-pointer.
        unsafe { out(ps, s.id as CUstream) }
    })
}

// ---------------------------------------------------------------------------------------------
// Tensor maps

#[no_mangle]
pub unsafe extern "C" fn cuTensorMapEncodeTiled(
    map: *mut CUtensorMap,
    dtype: u32,
    rank: u32,
    addr: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    box_dims: *const u32,
    elem_strides: *const u32,
    interleave: u32,
    swizzle: u32,
    l2: u32,
    oob: u32,
) -> CUresult {
    ffi("cuTensorMapEncodeTiled", || {
        let d = drv()?;
        current(d)?;
        if map.is_null()
            || dims.is_null()
            || box_dims.is_null()
            || elem_strides.is_null()
            || !(1..=5).contains(&rank)
        {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                format!("cuTensorMapEncodeTiled: null array or rank {rank}")
            }));
        }
        if rank > 1 && strides.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let r = rank as usize;
        // SAFETY: the arrays hold `rank` (strides: rank - 1) entries (API contract).
        let (dm, st, bx, es) = unsafe {
            (
                std::slice::from_raw_parts(dims, r),
                if r > 1 {
                    std::slice::from_raw_parts(strides, r - 1)
                } else {
                    &[][..]
                },
                std::slice::from_raw_parts(box_dims, r),
                std::slice::from_raw_parts(elem_strides, r),
            )
        };
        let bytes = tmap::encode(&tmap::Args {
            dtype,
            rank,
            addr: addr as u64,
            dims: dm,
            strides: st,
            box_dims: bx,
            elem_strides: es,
            im2col: None,
            interleave,
            swizzle,
            l2,
            oob,
        })?;
        let mut m = CUtensorMap { opaque: [0; 16] };
        for (i, w) in m.opaque.iter_mut().enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            *w = u64::from_le_bytes(b);
        }
        // SAFETY: non-null out-pointer.
        unsafe { out(map, m) }
    })
}

/// `cuTensorMapEncodeIm2col`: validated like the driver, encoded in the emulator's layout.
#[no_mangle]
pub unsafe extern "C" fn cuTensorMapEncodeIm2col(
    map: *mut CUtensorMap,
    dtype: u32,
    rank: u32,
    addr: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    lower: *const c_int,
    upper: *const c_int,
    channels: u32,
    pixels: u32,
    elem_strides: *const u32,
    interleave: u32,
    swizzle: u32,
    l2: u32,
    oob: u32,
) -> CUresult {
    ffi("cuTensorMapEncodeIm2col", || {
        let d = drv()?;
        current(d)?;
        let null = map.is_null() || dims.is_null() || strides.is_null() || elem_strides.is_null();
        if null || lower.is_null() || upper.is_null() || !(3..=5).contains(&rank) {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
                format!("cuTensorMapEncodeIm2col: null array or rank {rank} (must be 3..=5)")
            }));
        }
        let r = rank as usize;
        // SAFETY: the arrays hold `rank` (strides: rank - 1, corners: rank - 2) entries (API
        // contract).
        let (dm, st, es, lo, hi) = unsafe {
            (
                std::slice::from_raw_parts(dims, r),
                std::slice::from_raw_parts(strides, r - 1),
                std::slice::from_raw_parts(elem_strides, r),
                std::slice::from_raw_parts(lower, r - 2),
                std::slice::from_raw_parts(upper, r - 2),
            )
        };
        let bytes = tmap::encode(&tmap::Args {
            dtype,
            rank,
            addr: addr as u64,
            dims: dm,
            strides: st,
            box_dims: &[],
            elem_strides: es,
            im2col: Some(tmap::Im2colArgs {
                lower: lo,
                upper: hi,
                channels,
                pixels,
            }),
            interleave,
            swizzle,
            l2,
            oob,
        })?;
        let mut m = CUtensorMap { opaque: [0; 16] };
        for (i, w) in m.opaque.iter_mut().enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            *w = u64::from_le_bytes(b);
        }
        // SAFETY: non-null out-pointer.
        unsafe { out(map, m) }
    })
}
