//! Multicast objects and the virtual-memory calls that map them, on [`emu::multicast`]:
//! `cuMulticastGetGranularity`, `cuMulticastCreate`, `cuMulticastAddDevice`,
//! `cuMulticastBindAddr`, `cuMulticastUnbind`, `cuMemAddressReserve`/`cuMemAddressFree`,
//! `cuMemMap`/`cuMemUnmap` of a multicast handle, `cuMemSetAccess` and `cuMemRelease`.
//!
//! What the fake models: the object's granularity (2 MiB, minimum = recommended), every member
//! added before the first binding or mapping, bindings of plain device pointers (`cuMemAlloc` memory; the real
//! driver wants `cuMemCreate`/pool memory there), whole-object mappings at reserved addresses.
//! What it does not: `cuMemCreate` physical memory (so no `cuMulticastBindMem` and no `cuMemMap`
//! of anything but a multicast handle), partial mappings, and access rights (`cuMemSetAccess`
//! checks its descriptors but kernels may use a mapping without it).
//! `PTXFORGE_FAKECUDA_MULTICAST=0` makes every device report
//! `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 0` and refuse `cuMulticastCreate`.

use crate::state::{check_dev, check_range, current, drv, fail, lock, out, Driver, Res};
use crate::{ffi, CUdeviceptr, CUresult};
use cudarc::driver::sys::CUmulticastObjectProp;
use emu::multicast::{MulticastObject, GRANULARITY};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_uint, c_ulonglong};
use std::sync::Arc;

/// `CUmemGenericAllocationHandle`.
type Handle = c_ulonglong;

/// The fake's multicast tables (one per driver).
#[derive(Default)]
pub(crate) struct McTables {
    objects: std::sync::Mutex<HashMap<Handle, Arc<MulticastObject>>>,
    /// Reserved address ranges: base -> size.
    reserved: std::sync::Mutex<BTreeMap<u64, u64>>,
    /// Mapped multicast ranges: base -> the object mapped there.
    mapped: std::sync::Mutex<HashMap<u64, Arc<MulticastObject>>>,
}

/// `CUmemAccessDesc` as raw integers, so an out-of-range enum value is an error, not UB.
#[repr(C)]
pub struct AccessDesc {
    location_type: c_uint,
    location_id: c_int,
    flags: c_uint,
}

/// Whether devices support multicast (`PTXFORGE_FAKECUDA_MULTICAST`, default on).
pub(crate) fn supported() -> bool {
    std::env::var("PTXFORGE_FAKECUDA_MULTICAST").as_deref() != Ok("0")
}

fn invalid(why: impl FnOnce() -> String) -> CUresult {
    fail(CUresult::CUDA_ERROR_INVALID_VALUE, why)
}

fn object(d: &Driver, h: Handle) -> Res<Arc<MulticastObject>> {
    lock(&d.mc.objects).get(&h).cloned().ok_or_else(|| {
        fail(CUresult::CUDA_ERROR_INVALID_HANDLE, || {
            format!("multicast handle {h:#x}")
        })
    })
}

/// The driver binds and maps an object only once all its `numDevices` devices were added.
fn all_added(obj: &MulticastObject) -> Res {
    let n = obj.devices().len();
    if (n as u32) < obj.num_devices {
        return Err(invalid(|| {
            format!(
                "only {n} of the object's {} devices were added",
                obj.num_devices
            )
        }));
    }
    Ok(())
}

/// Reads a `CUmulticastObjectProp` (null is an error).
///
/// # Safety
/// `prop` must be null or point to a `CUmulticastObjectProp`.
unsafe fn read_prop(prop: *const CUmulticastObjectProp) -> Res<CUmulticastObjectProp> {
    if prop.is_null() {
        return Err(invalid(|| "prop is null".into()));
    }
    // SAFETY: non-null, and a valid prop per the caller's contract.
    let p = unsafe { prop.read_unaligned() };
    if p.flags != 0 {
        return Err(invalid(|| format!("prop.flags {:#x} (must be 0)", p.flags)));
    }
    Ok(p)
}

#[no_mangle]
pub unsafe extern "C" fn cuMulticastGetGranularity(
    granularity: *mut usize,
    prop: *const CUmulticastObjectProp,
    option: c_uint,
) -> CUresult {
    ffi("cuMulticastGetGranularity", || {
        drv()?;
        // SAFETY: the caller passes a prop pointer (checked for null).
        unsafe { read_prop(prop)? };
        if option > 1 {
            return Err(invalid(|| format!("granularity option {option}")));
        }
        // SAFETY: out-pointer from the caller.
        unsafe { out(granularity, GRANULARITY as usize) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMulticastCreate(
    handle: *mut Handle,
    prop: *const CUmulticastObjectProp,
) -> CUresult {
    ffi("cuMulticastCreate", || {
        let d = drv()?;
        // SAFETY: the caller passes a prop pointer (checked for null).
        let p = unsafe { read_prop(prop)? };
        if !supported() {
            return Err(fail(CUresult::CUDA_ERROR_NOT_SUPPORTED, || {
                "multicast is off (PTXFORGE_FAKECUDA_MULTICAST=0)".into()
            }));
        }
        if handle.is_null() {
            return Err(invalid(|| "handle is null".into()));
        }
        let obj = d
            .mem
            .multicast_create(p.size as u64, p.numDevices)
            .map_err(|e| invalid(|| e.to_string()))?;
        let h = d.new_id() as Handle;
        lock(&d.mc.objects).insert(h, obj);
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(handle, h) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMulticastAddDevice(handle: Handle, dev: c_int) -> CUresult {
    ffi("cuMulticastAddDevice", || {
        let d = drv()?;
        let dev = check_dev(d, dev)?;
        object(d, handle)?
            .add_device(dev)
            .map_err(|e| invalid(|| e.to_string()))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMulticastBindAddr(
    handle: Handle,
    mc_offset: usize,
    memptr: CUdeviceptr,
    size: usize,
    flags: c_ulonglong,
) -> CUresult {
    ffi("cuMulticastBindAddr", || {
        let d = drv()?;
        current(d)?;
        if flags != 0 {
            return Err(invalid(|| format!("flags {flags:#x} (must be 0)")));
        }
        let obj = object(d, handle)?;
        all_added(&obj)?;
        let alloc = check_range(d, memptr, size)?;
        obj.bind_mem(mc_offset as u64, &alloc, memptr - alloc.base, size as u64)
            .map_err(|e| invalid(|| e.to_string()))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMulticastUnbind(
    handle: Handle,
    dev: c_int,
    mc_offset: usize,
    size: usize,
) -> CUresult {
    ffi("cuMulticastUnbind", || {
        let d = drv()?;
        let dev = check_dev(d, dev)?;
        object(d, handle)?
            .unbind(dev, mc_offset as u64, size as u64)
            .map_err(|e| invalid(|| e.to_string()))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: Handle) -> CUresult {
    ffi("cuMemRelease", || {
        let d = drv()?;
        // Mappings keep the object alive (as on the driver: released once unmapped).
        match lock(&d.mc.objects).remove(&handle) {
            Some(_) => Ok(()),
            None => Err(fail(CUresult::CUDA_ERROR_INVALID_HANDLE, || {
                format!("cuMemRelease: handle {handle:#x} (the fake has multicast handles only)")
            })),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    _addr: CUdeviceptr,
    flags: c_ulonglong,
) -> CUresult {
    ffi("cuMemAddressReserve", || {
        let d = drv()?;
        if flags != 0 || ptr.is_null() {
            return Err(invalid(|| "cuMemAddressReserve: flags must be 0".into()));
        }
        if alignment > GRANULARITY as usize || (alignment != 0 && !alignment.is_power_of_two()) {
            return Err(invalid(|| {
                format!("alignment {alignment:#x} (the fake aligns to {GRANULARITY:#x})")
            }));
        }
        let base = d
            .mem
            .multicast_reserve(size as u64)
            .map_err(|e| invalid(|| e.to_string()))?;
        lock(&d.mc.reserved).insert(base, size as u64);
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(ptr, base) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    ffi("cuMemAddressFree", || {
        let d = drv()?;
        let mut r = lock(&d.mc.reserved);
        if r.get(&ptr) != Some(&(size as u64)) {
            return Err(invalid(|| {
                format!("[{ptr:#x}, +{size:#x}) was not reserved")
            }));
        }
        let end = ptr + size as u64;
        if lock(&d.mc.mapped).keys().any(|&b| b >= ptr && b < end) {
            return Err(invalid(|| {
                format!("[{ptr:#x}, +{size:#x}) is still mapped")
            }));
        }
        r.remove(&ptr);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: Handle,
    flags: c_ulonglong,
) -> CUresult {
    ffi("cuMemMap", || {
        let d = drv()?;
        let c = current(d)?;
        if offset != 0 || flags != 0 {
            return Err(invalid(|| "cuMemMap: offset and flags must be 0".into()));
        }
        let obj = lock(&d.mc.objects).get(&handle).cloned().ok_or_else(|| {
            fail(CUresult::CUDA_ERROR_NOT_SUPPORTED, || {
                format!("cuMemMap: handle {handle:#x} is not a multicast handle (the fake maps only those)")
            })
        })?;
        all_added(&obj)?;
        if size as u64 != obj.size {
            return Err(fail(CUresult::CUDA_ERROR_NOT_SUPPORTED, || {
                format!(
                    "cuMemMap: size {size:#x} (the fake maps whole objects of {:#x})",
                    obj.size
                )
            }));
        }
        let inside = lock(&d.mc.reserved)
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, &s)| ptr + size as u64 <= b + s);
        if !inside {
            return Err(invalid(|| {
                format!("[{ptr:#x}, +{size:#x}) is not reserved")
            }));
        }
        d.mem
            .multicast_map_at(&obj, c.dev, ptr)
            .map_err(|e| invalid(|| e.to_string()))?;
        lock(&d.mc.mapped).insert(ptr, obj);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    ffi("cuMemUnmap", || {
        let d = drv()?;
        let mut m = lock(&d.mc.mapped);
        if m.get(&ptr).map(|o| o.size) != Some(size as u64) {
            return Err(invalid(|| {
                format!("[{ptr:#x}, +{size:#x}) is not a mapping")
            }));
        }
        m.remove(&ptr);
        d.mem.multicast_unmap(ptr);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const AccessDesc,
    count: usize,
) -> CUresult {
    ffi("cuMemSetAccess", || {
        let d = drv()?;
        if desc.is_null() || count == 0 {
            return Err(invalid(|| "cuMemSetAccess: no descriptors".into()));
        }
        let obj = lock(&d.mc.mapped)
            .get(&ptr)
            .cloned()
            .ok_or_else(|| invalid(|| format!("cuMemSetAccess: {ptr:#x} is not a mapping")))?;
        if size as u64 != obj.size {
            return Err(invalid(|| format!("cuMemSetAccess: size {size:#x}")));
        }
        // SAFETY: the caller passes `count` descriptors at `desc` (non-null).
        let descs = unsafe { std::slice::from_raw_parts(desc, count) };
        for a in descs {
            // CU_MEM_LOCATION_TYPE_DEVICE; PROT_NONE, READ or READWRITE
            if a.location_type != 1 || !matches!(a.flags, 0 | 1 | 3) {
                return Err(invalid(|| {
                    format!(
                        "access descriptor type {} flags {}",
                        a.location_type, a.flags
                    )
                }));
            }
            check_dev(d, a.location_id)?;
        }
        Ok(())
    })
}
