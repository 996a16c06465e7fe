//! The CUDA driver backend. `libcuda.so` is loaded at run time through `cudarc`'s dynamically
//! loaded `sys` bindings, so building needs no CUDA toolkit and a machine without a driver builds
//! and runs everything else: asking for a CUDA device there returns
//! [`RuntimeError::CudaUnavailable`], never a panic.
//!
//! Everything here is a thin layer over the driver API; the public objects (`Device`, `Buffer`,
//! `Module`, `Stream`, `Event`, `Graph`, `Partition`) hold these handles next to their emulator
//! equivalents and dispatch by backend.

pub(crate) mod green;
pub(crate) mod launch;
pub(crate) mod memory;
pub(crate) mod module;
pub(crate) mod multicast;
pub(crate) mod tensor_map;

use crate::device::DeviceProps;
use crate::{Result, RuntimeError};
use cudarc::driver::sys;
use std::ffi::CStr;
use std::sync::{Arc, Mutex, OnceLock};

pub(crate) use sys::CUresult;

/// What `cuInit` told us.
pub(crate) struct Driver {
    /// `cuDriverGetVersion` (e.g. 12080 for CUDA 12.8).
    pub version: i32,
    pub devices: i32,
}

/// Initialises the driver once. Errors are [`RuntimeError::CudaUnavailable`] with the reason.
pub(crate) fn driver() -> Result<&'static Driver> {
    static D: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();
    D.get_or_init(init)
        .as_ref()
        .map_err(|e| RuntimeError::CudaUnavailable(e.clone()))
}

fn init() -> std::result::Result<Driver, String> {
    if std::env::var_os("PTXFORGE_NO_CUDA").is_some_and(|v| !v.is_empty() && v != "0") {
        return Err("disabled by PTXFORGE_NO_CUDA".into());
    }
    // SAFETY: only dlopen()s the candidate library names; no driver function is called. The
    // catch_unwind guards against cudarc versions that panic instead of returning false.
    let present = std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
    if !present {
        return Err("libcuda.so not found (no NVIDIA driver on this machine; the dynamic loader found neither \
                    libcuda.so nor libcuda.so.1 — set LD_LIBRARY_PATH if it is installed elsewhere)"
            .into());
    }
    let r = std::panic::catch_unwind(|| {
        // SAFETY: cuInit/cuDriverGetVersion/cuDeviceGetCount take plain out-pointers to locals.
        unsafe {
            let r = sys::cuInit(0);
            if r != CUresult::CUDA_SUCCESS {
                return Err(format!("cuInit failed: {}", err_text(r)));
            }
            let mut v = 0;
            let r = sys::cuDriverGetVersion(&mut v);
            if r != CUresult::CUDA_SUCCESS {
                return Err(format!("cuDriverGetVersion failed: {}", err_text(r)));
            }
            let mut n = 0;
            let r = sys::cuDeviceGetCount(&mut n);
            if r != CUresult::CUDA_SUCCESS {
                return Err(format!("cuDeviceGetCount failed: {}", err_text(r)));
            }
            Ok(Driver {
                version: v,
                devices: n,
            })
        }
    });
    match r {
        Ok(Ok(d)) if d.devices == 0 => Err(format!(
            "no CUDA devices (driver {})",
            version_text(d.version)
        )),
        Ok(r) => r,
        Err(_) => Err("libcuda.so could not be used (a required driver symbol is missing)".into()),
    }
}

pub(crate) fn version_text(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// `CUDA_ERROR_X (description)`.
pub(crate) fn err_text(r: CUresult) -> String {
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorString stores a pointer to a static NUL-terminated string (or leaves null).
    let desc = unsafe {
        if sys::cuGetErrorString(r, &mut p) == CUresult::CUDA_SUCCESS && !p.is_null() {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        } else {
            String::new()
        }
    };
    if desc.is_empty() {
        format!("{r:?}")
    } else {
        format!("{r:?} ({desc})")
    }
}

/// Maps a driver status to `Result`, naming the call.
pub(crate) fn check(r: CUresult, what: &str) -> Result<()> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(RuntimeError::Cuda(format!("{what}: {}", err_text(r))))
    }
}

/// Runs a driver call that may be missing from an old libcuda (cudarc panics on a missing
/// symbol): the panic becomes an error.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .map_err(|_| RuntimeError::Cuda(format!("{what}: not provided by this driver")))
}

/// One GPU: its ordinal and retained primary context.
pub(crate) struct Ctx {
    pub dev: sys::CUdevice,
    pub ctx: sys::CUcontext,
    pub ordinal: u32,
    pub driver_version: i32,
    /// Pinned host staging buffer and the stream host<->device copies run on.
    pub(crate) staging: Mutex<Option<memory::Pinned>>,
    pub(crate) copy_stream: OnceLock<launch::RawStream>,
}

// SAFETY: a CUcontext/CUdevice is a process-wide handle that the (thread-safe) driver API accepts
// from any thread once made current there; `bind` does that before every use.
unsafe impl Send for Ctx {}
// SAFETY: see above; shared mutable state (staging) is behind a Mutex.
unsafe impl Sync for Ctx {}

impl Ctx {
    /// Retains device `ordinal`'s primary context and reads its properties.
    pub fn open(ordinal: u32) -> Result<(Arc<Ctx>, DeviceProps)> {
        let d = driver()?;
        if ordinal as i32 >= d.devices {
            return Err(RuntimeError::NoDevice(format!(
                "cuda:{ordinal} (this machine has {} CUDA devices)",
                d.devices
            )));
        }
        let mut dev = 0;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: out-pointers to locals; the ordinal was range-checked.
        unsafe {
            check(sys::cuDeviceGet(&mut dev, ordinal as i32), "cuDeviceGet")?;
            check(
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                "cuDevicePrimaryCtxRetain",
            )?;
        }
        let c = Arc::new(Ctx {
            dev,
            ctx,
            ordinal,
            driver_version: d.version,
            staging: Mutex::new(None),
            copy_stream: OnceLock::new(),
        });
        c.bind()?;
        let attr = |a: sys::CUdevice_attribute| -> Result<i32> {
            let mut v = 0;
            // SAFETY: out-pointer to a local.
            check(
                unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) },
                "cuDeviceGetAttribute",
            )?;
            Ok(v)
        };
        use sys::CUdevice_attribute as A;
        let sms = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32;
        let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32;
        let smem = attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as u32;
        let mut name = [0 as std::ffi::c_char; 256];
        let mut total = 0usize;
        // SAFETY: the name buffer is 256 bytes and its length is passed; out-pointer to a local.
        let name = unsafe {
            check(
                sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev),
                "cuDeviceGetName",
            )?;
            check(
                sys::cuDeviceTotalMem_v2(&mut total, dev),
                "cuDeviceTotalMem",
            )?;
            CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned()
        };
        let props = DeviceProps {
            name: format!(
                "{name} (sm_{major}{minor}, {sms} SMs, driver {})",
                version_text(d.version)
            ),
            sms,
            sm_version: major * 10 + minor,
            max_shared_per_block: smem,
            total_memory: total as u64,
        };
        Ok((c, props))
    }

    /// Makes this device's primary context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained for the lifetime of `self`.
        check(unsafe { sys::cuCtxSetCurrent(self.ctx) }, "cuCtxSetCurrent")
    }

    /// Waits for all work in the primary context (kernel faults surface here).
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: no arguments; the context is current.
        check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
    }

    /// Lets kernels running in `self` dereference memory allocated in `peer` (NVLink/PCIe P2P).
    pub fn enable_peer_access(&self, peer: &Ctx) -> Result<()> {
        if self.dev == peer.dev {
            return Ok(());
        }
        let mut can = 0;
        // SAFETY: out-pointer to a local; both devices are valid ordinals.
        check(
            unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.dev, peer.dev) },
            "cuDeviceCanAccessPeer",
        )?;
        if can == 0 {
            return Err(RuntimeError::Cuda(format!(
                "cuda:{} cannot access memory of cuda:{} (no P2P path between them)",
                self.ordinal, peer.ordinal
            )));
        }
        self.bind()?;
        // SAFETY: `peer.ctx` is a retained context; the current context is `self.ctx`.
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer.ctx, 0) };
        if r == CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check(r, "cuCtxEnablePeerAccess")
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        drop(self.staging.get_mut().map(|s| s.take()));
        drop(self.copy_stream.take());
        // SAFETY: releases the retain taken in `open`.
        unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(self.dev);
        }
    }
}
