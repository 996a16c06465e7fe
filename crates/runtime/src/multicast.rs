//! Multicast objects for `multimem.*` kernels, mirroring CUDA's `cuMulticastCreate` /
//! `cuMulticastAddDevice` / `cuMulticastBindAddr` / `cuMemMap` of the multicast handle, on both
//! backends: emulated devices use [`emu::multicast`], CUDA devices the driver
//! (`crate::cuda::multicast`). An object belongs to the backend it was created for
//! ([`Multicast::create`]: emulated; [`Multicast::create_on`]: `dev`'s backend); members of the
//! other backend are refused. Refusals are [`RuntimeError::Multicast`] naming the field.
//!
//! ```
//! use runtime::{Device, Multicast};
//! let devs = [Device::emu(0), Device::emu(1)];
//! let g = Multicast::granularity_on(&devs[0], 2).unwrap();
//! let mc = Multicast::create_on(&devs[0], g, devs.len() as u32).unwrap();
//! let bufs: Vec<_> = devs.iter().map(|d| d.alloc::<f32>(g / 4).unwrap()).collect();
//! for d in &devs {
//!     mc.add_device(d).unwrap();
//! }
//! for b in &bufs {
//!     mc.bind(0, b, 0, g).unwrap();
//! }
//! // the multicast address device 0's kernels pass to `multimem.*`
//! let addr = mc.map(&devs[0]).unwrap();
//! assert_ne!(addr, bufs[0].device_ptr());
//! ```
//!
//! On CUDA, buffers from [`Multicast::alloc_buffer`] (`cuMemCreate` memory) are bound with
//! `cuMulticastBindMem`, others with `cuMulticastBindAddr` by address, which the real driver
//! accepts only for `cuMemCreate` or memory-pool memory: `Device::alloc` (`cuMemAlloc`) buffers
//! get the driver's error there. A bound buffer must outlive the object (it is unbound on drop).

use crate::cuda::memory::{DevMem, Origin};
use crate::cuda::multicast::{BindMem, McObject};
use crate::device::emu_memory;
use crate::storage::Storage;
use crate::{Buffer, Device, Pod, Result, RuntimeError};
use emu::multicast::MulticastObject;
use std::sync::{Arc, Mutex};

/// A multicast object and the address ranges mapped onto it (unbound and unmapped on drop).
pub struct Multicast {
    inner: Inner,
}

enum Inner {
    Emu {
        obj: Arc<MulticastObject>,
        maps: Mutex<Vec<u64>>,
    },
    Cuda(McObject),
}

pub(crate) fn mc_err(field: &'static str, msg: String) -> RuntimeError {
    RuntimeError::Multicast { field, msg }
}

/// Checks that each `(field, value)` is a multiple of the granularity `g`.
pub(crate) fn check_multiples(g: usize, values: &[(&'static str, usize)]) -> Result<()> {
    for &(field, v) in values {
        if !v.is_multiple_of(g) {
            return Err(mc_err(
                field,
                format!("{v:#x} is not a multiple of the multicast granularity {g:#x}"),
            ));
        }
    }
    Ok(())
}

/// The checks of a bind both backends make before asking the object: granularity multiples,
/// the range inside the object and inside the buffer.
pub(crate) fn check_bind(
    g: usize,
    obj_size: usize,
    mc_offset: usize,
    buf_offset: usize,
    bytes_left: usize,
    size: usize,
) -> Result<()> {
    check_multiples(
        g,
        &[
            ("mc_offset", mc_offset),
            ("buf_offset", buf_offset),
            ("size", size),
        ],
    )?;
    if size == 0 || mc_offset.checked_add(size).is_none_or(|e| e > obj_size) {
        return Err(mc_err(
            "size",
            format!("[{mc_offset:#x}, +{size:#x}) is outside the {obj_size:#x}-byte object"),
        ));
    }
    if size > bytes_left {
        return Err(mc_err(
            "size",
            format!(
                "{size:#x} bytes from buf_offset {buf_offset:#x} run past the buffer \
                 ({bytes_left:#x} bytes left)"
            ),
        ));
    }
    Ok(())
}

/// Binding and mapping wait for every one of the object's `num_devices` members.
pub(crate) fn require_all_added(what: &str, added: usize, num_devices: u32) -> Result<()> {
    if added < num_devices as usize {
        return Err(mc_err(
            "num_devices",
            format!(
                "{what}: only {added} of the object's {num_devices} devices were added (add \
                 every device first)"
            ),
        ));
    }
    Ok(())
}

/// The emulated object's check before a bind or map by `dev`: a member, all members added.
fn emu_member(obj: &MulticastObject, dev: u32, what: &str) -> Result<()> {
    let members = obj.devices();
    if !members.contains(&dev) {
        return Err(mc_err(
            "device",
            format!(
                "{what}: emulated device {dev} was not added to the object (members: {members:?})"
            ),
        ));
    }
    require_all_added(what, members.len(), obj.num_devices)
}

fn other_backend(dev: &Device, what: &str) -> RuntimeError {
    mc_err(
        "device",
        format!(
            "{what}: {:?} device {} is not of the object's backend",
            dev.backend(),
            dev.index()
        ),
    )
}

impl Multicast {
    /// The size and alignment unit of emulated objects, bindings and mappings
    /// (`cuMulticastGetGranularity`; [`Multicast::granularity_on`] for any device).
    pub fn granularity() -> usize {
        emu::multicast::GRANULARITY as usize
    }

    /// The unit of sizes and offsets of an object for `num_devices` devices on `dev`'s backend
    /// (`cuMulticastGetGranularity`, minimum granularity, on CUDA).
    pub fn granularity_on(dev: &Device, num_devices: u32) -> Result<usize> {
        match dev.cuda_ctx() {
            None => Ok(Self::granularity()),
            Some(ctx) => {
                crate::cuda::multicast::require_support(ctx)?;
                crate::cuda::multicast::granularity(ctx, num_devices.max(1), Self::granularity())
            }
        }
    }

    /// An emulated multicast object of `size` bytes for up to `num_devices` devices.
    pub fn create(size: usize, num_devices: u32) -> Result<Multicast> {
        if num_devices == 0 {
            return Err(mc_err("num_devices", "must be at least 1".into()));
        }
        if size == 0 {
            return Err(mc_err("size", "must be positive".into()));
        }
        check_multiples(Self::granularity(), &[("size", size)])?;
        let obj = emu_memory().multicast_create(size as u64, num_devices)?;
        Ok(Multicast {
            inner: Inner::Emu {
                obj,
                maps: Mutex::new(Vec::new()),
            },
        })
    }

    /// A multicast object of `size` bytes for up to `num_devices` devices of `dev`'s backend
    /// (`cuMulticastCreate`, made from `dev`'s context on CUDA; `dev` need not be a member).
    pub fn create_on(dev: &Device, size: usize, num_devices: u32) -> Result<Multicast> {
        match dev.cuda_ctx() {
            None => Self::create(size, num_devices),
            Some(ctx) => Ok(Multicast {
                inner: Inner::Cuda(McObject::create(ctx, size, num_devices)?),
            }),
        }
    }

    /// A zeroed buffer of `len` elements on `dev` that multicast objects can bind: on CUDA
    /// `cuMemCreate` memory mapped with `cuMemAddressReserve` + `cuMemMap` + `cuMemSetAccess`
    /// (its size rounded up to the allocation granularity; bound with `cuMulticastBindMem`),
    /// on an emulated device an ordinary allocation.
    pub fn alloc_buffer<T: Pod>(dev: &Device, len: usize) -> Result<Buffer<T>> {
        let Some(ctx) = dev.cuda_ctx() else {
            return dev.alloc(len);
        };
        let bytes = len.checked_mul(T::SIZE).ok_or_else(|| {
            RuntimeError::Buffer(format!("len: {len} elements of {} bytes overflow", T::SIZE))
        })?;
        Ok(Buffer {
            device: dev.clone(),
            mem: Storage::Cuda(DevMem::alloc_vmm(ctx, bytes)?),
            len,
            _t: std::marker::PhantomData,
        })
    }

    /// Adds `dev` as a member (`cuMulticastAddDevice`); every member before the first bind.
    pub fn add_device(&self, dev: &Device) -> Result<()> {
        match (&self.inner, dev.cuda_ctx()) {
            (Inner::Emu { obj, .. }, None) => {
                if obj.devices().len() as u32 >= obj.num_devices
                    && !obj.devices().contains(&dev.index())
                {
                    return Err(mc_err(
                        "num_devices",
                        format!("the object was created for {} devices", obj.num_devices),
                    ));
                }
                obj.add_device(dev.index())
                    .map_err(|e| mc_err("device", e.to_string()))
            }
            (Inner::Cuda(o), Some(ctx)) => o.add_device(ctx),
            _ => Err(other_backend(dev, "add_device")),
        }
    }

    /// Binds `size` bytes of `buf` from byte `buf_offset` at byte `mc_offset` of the object,
    /// for `buf`'s device, a member (`cuMulticastBindAddr`); offsets and size are multiples of
    /// the granularity ([`Multicast::granularity_on`]).
    pub fn bind<T: Pod>(
        &self,
        mc_offset: usize,
        buf: &Buffer<T>,
        buf_offset: usize,
        size: usize,
    ) -> Result<()> {
        let bytes = buf.len() * std::mem::size_of::<T>();
        let bytes_left = bytes.checked_sub(buf_offset).ok_or_else(|| {
            mc_err(
                "buf_offset",
                format!("{buf_offset:#x} is past the end of the {bytes:#x}-byte buffer"),
            )
        })?;
        match (&self.inner, buf.device().cuda_ctx()) {
            (Inner::Emu { obj, .. }, None) => {
                check_bind(
                    Self::granularity(),
                    obj.size as usize,
                    mc_offset,
                    buf_offset,
                    bytes_left,
                    size,
                )?;
                emu_member(obj, buf.device().index(), "bind")?;
                let alloc = buf
                    .emu_alloc()
                    .ok_or_else(|| mc_err("buf", "the buffer has no emulator memory".into()))?;
                obj.bind_mem(mc_offset as u64, alloc, buf_offset as u64, size as u64)
                    // what is left: an overlap with this device's earlier binding
                    .map_err(|e| mc_err("mc_offset", e.to_string()))
            }
            (Inner::Cuda(o), Some(ctx)) => o.bind(
                mc_offset,
                &BindMem {
                    ctx,
                    handle: match &buf.mem {
                        Storage::Cuda(DevMem {
                            origin: Origin::Vmm { handle, .. },
                            ..
                        }) => Some(*handle),
                        _ => None,
                    },
                    ptr: buf.device_ptr() + buf_offset as u64,
                    buf_offset,
                    bytes_left,
                    size,
                },
            ),
            _ => Err(other_backend(buf.device(), "bind")),
        }
    }

    /// Maps the object for `dev`, a member (`cuMemAddressReserve` + `cuMemMap` +
    /// `cuMemSetAccess`), and returns the multicast address kernels on `dev` pass to
    /// `multimem.*`. Plain loads and stores through it fault.
    pub fn map(&self, dev: &Device) -> Result<u64> {
        match (&self.inner, dev.cuda_ctx()) {
            (Inner::Emu { obj, maps }, None) => {
                emu_member(obj, dev.index(), "map")?;
                let base = emu_memory().multicast_map(obj, dev.index())?;
                maps.lock().unwrap_or_else(|p| p.into_inner()).push(base);
                Ok(base)
            }
            (Inner::Cuda(o), Some(ctx)) => o.map(ctx),
            _ => Err(other_backend(dev, "map")),
        }
    }

    /// The size in bytes.
    pub fn size(&self) -> usize {
        match &self.inner {
            Inner::Emu { obj, .. } => obj.size as usize,
            Inner::Cuda(o) => o.size,
        }
    }
}

impl Drop for Multicast {
    fn drop(&mut self) {
        // The CUDA object unbinds, unmaps and releases in its own drop.
        if let Inner::Emu { maps, .. } = &self.inner {
            let maps = maps.lock().unwrap_or_else(|p| p.into_inner());
            for base in maps.iter() {
                emu_memory().multicast_unmap(*base);
            }
        }
    }
}
