//! Multicast objects on the driver: `cuMulticastGetGranularity`, `cuMulticastCreate`,
//! `cuMulticastAddDevice`, `cuMulticastBindMem` (`cuMemCreate` buffers) or `cuMulticastBindAddr`
//! (other memory), and the multicast handle mapped per device with
//! `cuMemAddressReserve` + `cuMemMap` + `cuMemSetAccess`; on drop `cuMulticastUnbind` of every
//! binding, `cuMemUnmap` + `cuMemAddressFree` of every mapping, then `cuMemRelease`.
//!
//! The driver's own checks would come back as a bare `CUDA_ERROR_INVALID_VALUE`; this layer
//! checks what it can first (granularity multiples, membership, add-before-bind, the device's
//! `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`) and returns [`RuntimeError::Multicast`] naming the
//! field. All multicast entry points are CUDA 12.1+: an older libcuda lacks them, which
//! [`guarded`] turns into an error instead of cudarc's panic.

use super::{check, guarded, Ctx};
use crate::multicast::{check_bind, check_multiples, mc_err};
use crate::{Result, RuntimeError};
use cudarc::driver::sys;
use std::sync::{Arc, Mutex};

/// A driver call that may be missing from an old libcuda, checked.
fn call(what: &str, f: impl FnOnce() -> sys::CUresult) -> Result<()> {
    check(guarded(what, f)?, what)
}

fn prop(num_devices: u32, size: usize) -> sys::CUmulticastObjectProp {
    sys::CUmulticastObjectProp {
        numDevices: num_devices,
        size,
        handleTypes: 0,
        flags: 0,
    }
}

/// Read-write access for device `ordinal` (`cuMemSetAccess`).
pub(crate) fn rw_access(ordinal: u32) -> sys::CUmemAccessDesc {
    sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal as i32,
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }
}

/// Fails unless `ctx`'s device reports `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`.
pub(crate) fn require_support(ctx: &Ctx) -> Result<()> {
    let mut v = 0;
    // SAFETY: out-pointer to a local; `ctx.dev` is a valid device.
    check(
        unsafe {
            sys::cuDeviceGetAttribute(
                &mut v,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED,
                ctx.dev,
            )
        },
        "cuDeviceGetAttribute(MULTICAST_SUPPORTED)",
    )?;
    if v == 0 {
        return Err(mc_err(
            "device",
            format!(
                "cuda:{} does not support multicast objects (CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED \
                 = 0: needs NVLink SHARP, i.e. an NVSwitch system with fabric manager)",
                ctx.ordinal
            ),
        ));
    }
    Ok(())
}

/// `cuMulticastGetGranularity` (the minimum: what bindings and mappings must be multiples of).
pub(crate) fn granularity(ctx: &Ctx, num_devices: u32, size: usize) -> Result<usize> {
    ctx.bind()?;
    let p = prop(num_devices, size);
    let mut g = 0usize;
    // SAFETY: out-pointer to a local; `p` lives across the call.
    call("cuMulticastGetGranularity", || unsafe {
        sys::cuMulticastGetGranularity(
            &mut g,
            &p,
            sys::CUmulticastGranularity_flags::CU_MULTICAST_GRANULARITY_MINIMUM,
        )
    })?;
    if g == 0 {
        return Err(RuntimeError::Cuda(
            "cuMulticastGetGranularity returned 0".into(),
        ));
    }
    Ok(g)
}

#[derive(Default)]
struct McState {
    /// Member devices (ordinals), in the order they were added.
    members: Vec<u32>,
    /// (device, mc_offset, size) of every binding, for `cuMulticastUnbind`.
    bindings: Vec<(Arc<Ctx>, usize, usize)>,
    /// (base, device context) of every mapping, for `cuMemUnmap` + `cuMemAddressFree`.
    maps: Vec<(u64, Arc<Ctx>)>,
}

/// Device memory to bind (see [`McObject::bind`]).
pub(crate) struct BindMem<'a> {
    pub ctx: &'a Arc<Ctx>,
    /// The `cuMemCreate` handle of the buffer's memory (bound with `cuMulticastBindMem`), or
    /// `None` for other memory (bound by address, `cuMulticastBindAddr`).
    pub handle: Option<sys::CUmemGenericAllocationHandle>,
    /// The address bound (the buffer's base plus `buf_offset`).
    pub ptr: u64,
    pub buf_offset: usize,
    /// Bytes of the buffer from `ptr` on.
    pub bytes_left: usize,
    pub size: usize,
}

/// A driver multicast object (`CUmemGenericAllocationHandle`) and what was bound and mapped.
pub(crate) struct McObject {
    handle: sys::CUmemGenericAllocationHandle,
    pub size: usize,
    pub num_devices: u32,
    pub granularity: usize,
    /// The context the object was created in (its calls are made there).
    ctx: Arc<Ctx>,
    state: Mutex<McState>,
}

impl McObject {
    /// `cuMulticastCreate` of `size` bytes for `num_devices` devices, from `ctx`'s device.
    pub fn create(ctx: &Arc<Ctx>, size: usize, num_devices: u32) -> Result<McObject> {
        require_support(ctx)?;
        if num_devices == 0 {
            return Err(mc_err("num_devices", "must be at least 1".into()));
        }
        if size == 0 {
            return Err(mc_err("size", "must be positive".into()));
        }
        let g = granularity(ctx, num_devices, size)?;
        check_multiples(g, &[("size", size)])?;
        let p = prop(num_devices, size);
        let mut handle = 0;
        // SAFETY: out-pointer to a local; `p` lives across the call.
        call("cuMulticastCreate", || unsafe {
            sys::cuMulticastCreate(&mut handle, &p)
        })?;
        Ok(McObject {
            handle,
            size,
            num_devices,
            granularity: g,
            ctx: ctx.clone(),
            state: Mutex::new(McState::default()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, McState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `cuMulticastAddDevice`: every member before the first binding, each once.
    pub fn add_device(&self, dev: &Ctx) -> Result<()> {
        require_support(dev)?;
        let mut s = self.state();
        if !s.bindings.is_empty() {
            return Err(mc_err(
                "device",
                format!(
                    "cuda:{} added after memory was bound (add every device first)",
                    dev.ordinal
                ),
            ));
        }
        if s.members.contains(&dev.ordinal) {
            return Err(mc_err(
                "device",
                format!("cuda:{} was already added", dev.ordinal),
            ));
        }
        if s.members.len() as u32 >= self.num_devices {
            return Err(mc_err(
                "num_devices",
                format!("the object was created for {} devices", self.num_devices),
            ));
        }
        self.ctx.bind()?;
        // SAFETY: plain values; the handle is live until drop.
        call("cuMulticastAddDevice", || unsafe {
            sys::cuMulticastAddDevice(self.handle, dev.dev)
        })?;
        s.members.push(dev.ordinal);
        Ok(())
    }

    /// `dev` is a member and every member was added (the driver binds and maps only then).
    fn require_member(&self, s: &McState, dev: &Ctx, what: &str) -> Result<()> {
        if !s.members.contains(&dev.ordinal) {
            return Err(mc_err(
                "device",
                format!(
                    "{what}: cuda:{} was not added to the object (members: {:?})",
                    dev.ordinal, s.members
                ),
            ));
        }
        crate::multicast::require_all_added(what, s.members.len(), self.num_devices)
    }

    /// `cuMulticastBindAddr` of `b.size` bytes of `b.ctx`'s memory at `b.ptr` (`b.buf_offset`
    /// bytes into a buffer with `b.bytes_left` bytes from there) at `mc_offset`.
    pub fn bind(&self, mc_offset: usize, b: &BindMem<'_>) -> Result<()> {
        check_bind(
            self.granularity,
            self.size,
            mc_offset,
            b.buf_offset,
            b.bytes_left,
            b.size,
        )?;
        let size = b.size;
        let (mem, ptr) = (b.ctx, b.ptr);
        let mut s = self.state();
        self.require_member(&s, mem, "bind")?;
        mem.bind()?;
        match b.handle {
            // SAFETY: plain values; the range lies inside the handle's memory.
            Some(h) => call("cuMulticastBindMem", || unsafe {
                sys::cuMulticastBindMem(self.handle, mc_offset, h, b.buf_offset, size, 0)
            })?,
            // SAFETY: plain values; the range lies inside a live allocation of `mem`'s device.
            None => call("cuMulticastBindAddr", || unsafe {
                sys::cuMulticastBindAddr(self.handle, mc_offset, ptr, size, 0)
            })?,
        }
        s.bindings.push((mem.clone(), mc_offset, size));
        Ok(())
    }

    /// Reserves an address range on `dev`, maps the object there and grants `dev` read-write
    /// access; returns the base.
    pub fn map(&self, dev: &Arc<Ctx>) -> Result<u64> {
        let mut s = self.state();
        self.require_member(&s, dev, "map")?;
        dev.bind()?;
        let mut base = 0;
        // SAFETY: out-pointer to a local; size and alignment are multiples of the granularity.
        call("cuMemAddressReserve", || unsafe {
            sys::cuMemAddressReserve(&mut base, self.size, self.granularity, 0, 0)
        })?;
        if let Err(e) = self.map_reserved(dev, base) {
            // SAFETY: frees the range reserved just above (nothing is mapped in it).
            unsafe { sys::cuMemAddressFree(base, self.size) };
            return Err(e);
        }
        s.maps.push((base, dev.clone()));
        Ok(base)
    }

    fn map_reserved(&self, dev: &Ctx, base: u64) -> Result<()> {
        // SAFETY: `base` is a fresh reservation of `size` bytes; the handle is live.
        call("cuMemMap", || unsafe {
            sys::cuMemMap(base, self.size, 0, self.handle, 0)
        })?;
        let desc = rw_access(dev.ordinal);
        // SAFETY: one descriptor, alive across the call; the range was just mapped.
        let r = call("cuMemSetAccess", || unsafe {
            sys::cuMemSetAccess(base, self.size, &desc, 1)
        });
        if r.is_err() {
            // SAFETY: unmaps what was mapped just above.
            unsafe { sys::cuMemUnmap(base, self.size) };
        }
        r
    }
}

impl Drop for McObject {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        // Errors cannot be returned from drop; the driver frees everything at exit anyway.
        // Kernels still using the multicast address finish first (unbinding under them faults).
        for ctx in s
            .maps
            .iter()
            .map(|m| &m.1)
            .chain(s.bindings.iter().map(|b| &b.0))
        {
            let _ = ctx.synchronize();
        }
        for (ctx, off, size) in s.bindings.drain(..) {
            if ctx.bind().is_ok() {
                let h = self.handle;
                // SAFETY: undoes a binding made in `bind`, once.
                let _ = guarded("cuMulticastUnbind", || unsafe {
                    sys::cuMulticastUnbind(h, ctx.dev, off, size)
                });
            }
        }
        for (base, ctx) in s.maps.drain(..) {
            if ctx.bind().is_ok() {
                // SAFETY: undoes a mapping and reservation made in `map`, once.
                unsafe {
                    sys::cuMemUnmap(base, self.size);
                    sys::cuMemAddressFree(base, self.size);
                }
            }
        }
        if self.ctx.bind().is_ok() {
            // SAFETY: releases the handle created in `create`, once.
            unsafe { sys::cuMemRelease(self.handle) };
        }
    }
}
