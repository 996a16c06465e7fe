//! Multicast objects and the virtual-memory calls around them, on [`emu::multicast`]:
//! `cuMulticastGetGranularity`, `cuMulticastCreate`, `cuMulticastAddDevice`,
//! `cuMulticastBindMem`/`cuMulticastBindAddr`, `cuMulticastUnbind`,
//! `cuMemGetAllocationGranularity`, `cuMemCreate`, `cuMemAddressReserve`/`cuMemAddressFree`,
//! `cuMemMap`/`cuMemUnmap` of a multicast or physical handle, `cuMemSetAccess`, `cuMemRelease`.
//!
//! What the fake models: a 2 MiB granularity (minimum = recommended, for multicast objects and
//! physical memory), every member added before the first binding or mapping, bindings of
//! `cuMemCreate` memory (by handle or address) and, unlike the real driver, of `cuMemAlloc`
//! memory by address; whole-object mappings at reserved addresses. What it does not: a physical
//! handle mapped more than once or partially (its memory comes into being at its one mapping,
//! so `cuMulticastBindMem` needs it mapped), and access rights (`cuMemSetAccess` checks its
//! descriptors but kernels may use a mapping without it).
//! `PTXFORGE_FAKECUDA_MULTICAST=0` makes every device report
//! `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 0` and refuse `cuMulticastCreate`.

use crate::state::{check_dev, check_range, current, drv, fail, lock, out, Driver, Res};
use crate::{ffi, CUdeviceptr, CUresult};
use cudarc::driver::sys::CUmulticastObjectProp;
use emu::multicast::{MulticastObject, GRANULARITY};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_uint, c_ulonglong};
use std::sync::Arc;
use std::sync::Mutex;

/// `CUmemGenericAllocationHandle`.
type Handle = c_ulonglong;

/// The fake's multicast tables (one per driver).
#[derive(Default)]
pub(crate) struct McTables {
    objects: Mutex<HashMap<Handle, Arc<MulticastObject>>>,
    /// Reserved address ranges: base -> size.
    reserved: Mutex<BTreeMap<u64, u64>>,
    /// Mapped multicast ranges: base -> the object mapped there.
    mapped: Mutex<HashMap<u64, Arc<MulticastObject>>>,
    /// `cuMemCreate` handles.
    phys: Mutex<HashMap<Handle, Arc<Phys>>>,
    /// Mapped physical memory: base -> its handle's memory.
    phys_mapped: Mutex<HashMap<u64, Arc<Phys>>>,
}

/// Physical memory of `cuMemCreate`: its emulator allocation exists while it is mapped.
pub(crate) struct Phys {
    size: u64,
    dev: u32,
    mapped: Mutex<Option<Arc<emu::Allocation>>>,
}

/// `CUmemAllocationProp` as raw integers (enums as `u32`).
#[repr(C)]
pub struct AllocProp {
    alloc_type: c_uint,
    handle_types: c_uint,
    location_type: c_uint,
    location_id: c_int,
    win32: *mut std::ffi::c_void,
    alloc_flags: [u8; 8],
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
        let mapped = |b: &u64| *b >= ptr && *b < end;
        if lock(&d.mc.mapped).keys().any(mapped) || lock(&d.mc.phys_mapped).keys().any(mapped) {
            return Err(invalid(|| {
                format!("[{ptr:#x}, +{size:#x}) is still mapped")
            }));
        }
        r.remove(&ptr);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: Handle) -> CUresult {
    ffi("cuMemRelease", || {
        let d = drv()?;
        // Mappings keep the memory alive (as on the driver: freed once unmapped).
        let obj = lock(&d.mc.objects).remove(&handle).is_some();
        if obj || lock(&d.mc.phys).remove(&handle).is_some() {
            return Ok(());
        }
        Err(fail(CUresult::CUDA_ERROR_INVALID_HANDLE, || {
            format!("cuMemRelease: handle {handle:#x}")
        }))
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
        let inside = lock(&d.mc.reserved)
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, &s)| ptr + size as u64 <= b + s);
        if !inside {
            return Err(invalid(|| {
                format!("[{ptr:#x}, +{size:#x}) is not reserved")
            }));
        }
        if let Some(p) = lock(&d.mc.phys).get(&handle).cloned() {
            return map_phys(d, &p, ptr, size);
        }
        let obj = object(d, handle)?;
        all_added(&obj)?;
        if size as u64 != obj.size {
            return Err(fail(CUresult::CUDA_ERROR_NOT_SUPPORTED, || {
                format!(
                    "cuMemMap: size {size:#x} (the fake maps whole objects of {:#x})",
                    obj.size
                )
            }));
        }
        d.mem
            .multicast_map_at(&obj, c.dev, ptr)
            .map_err(|e| invalid(|| e.to_string()))?;
        lock(&d.mc.mapped).insert(ptr, obj);
        Ok(())
    })
}

/// The size of the mapping (multicast or physical) at `ptr`.
fn mapping_size(d: &Driver, ptr: u64) -> Option<u64> {
    let mc = lock(&d.mc.mapped).get(&ptr).map(|o| o.size);
    mc.or_else(|| lock(&d.mc.phys_mapped).get(&ptr).map(|p| p.size))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    ffi("cuMemUnmap", || {
        let d = drv()?;
        if mapping_size(d, ptr) != Some(size as u64) {
            return Err(invalid(|| {
                format!("[{ptr:#x}, +{size:#x}) is not a mapping")
            }));
        }
        if lock(&d.mc.mapped).remove(&ptr).is_some() {
            d.mem.multicast_unmap(ptr);
        }
        if let Some(p) = lock(&d.mc.phys_mapped).remove(&ptr) {
            // the device's queued work may still use it (cuMemUnmap does not wait on hardware
            // either: the caller synchronises first)
            *lock(&p.mapped) = None;
            d.mem.free(ptr);
        }
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
        if mapping_size(d, ptr) != Some(size as u64) {
            return Err(invalid(|| {
                format!("cuMemSetAccess: [{ptr:#x}, +{size:#x}) is not a mapping")
            }));
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

/// Reads a `CUmemAllocationProp`: pinned device memory of a valid device; returns the device.
///
/// # Safety
/// `prop` must be null or point to a `CUmemAllocationProp`.
unsafe fn read_alloc_prop(d: &Driver, prop: *const AllocProp) -> Res<u32> {
    if prop.is_null() {
        return Err(invalid(|| "prop is null".into()));
    }
    // SAFETY: non-null, and a valid prop per the caller's contract.
    let p = unsafe { prop.read_unaligned() };
    // CU_MEM_ALLOCATION_TYPE_PINNED at CU_MEM_LOCATION_TYPE_DEVICE
    if p.alloc_type != 1 || p.location_type != 1 {
        return Err(invalid(|| {
            format!(
                "prop: type {} at location type {} (the fake has pinned device memory only)",
                p.alloc_type, p.location_type
            )
        }));
    }
    check_dev(d, p.location_id)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const AllocProp,
    option: c_uint,
) -> CUresult {
    ffi("cuMemGetAllocationGranularity", || {
        let d = drv()?;
        // SAFETY: the caller passes a prop pointer (checked for null).
        unsafe { read_alloc_prop(d, prop)? };
        if option > 1 {
            return Err(invalid(|| format!("granularity option {option}")));
        }
        // SAFETY: out-pointer from the caller.
        unsafe { out(granularity, GRANULARITY as usize) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut Handle,
    size: usize,
    prop: *const AllocProp,
    flags: c_ulonglong,
) -> CUresult {
    ffi("cuMemCreate", || {
        let d = drv()?;
        // SAFETY: the caller passes a prop pointer (checked for null).
        let dev = unsafe { read_alloc_prop(d, prop)? };
        if flags != 0 || handle.is_null() {
            return Err(invalid(|| "cuMemCreate: flags must be 0".into()));
        }
        if size == 0 || !(size as u64).is_multiple_of(GRANULARITY) {
            return Err(invalid(|| {
                format!("cuMemCreate: size {size:#x} is not a multiple of {GRANULARITY:#x}")
            }));
        }
        let h = d.new_id() as Handle;
        let p = Phys {
            size: size as u64,
            dev,
            mapped: Mutex::new(None),
        };
        lock(&d.mc.phys).insert(h, Arc::new(p));
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(handle, h) }
    })
}

/// `cuMemMap` of physical memory: its allocation comes into being at `ptr`.
fn map_phys(d: &Driver, p: &Arc<Phys>, ptr: u64, size: usize) -> Res {
    let mut m = lock(&p.mapped);
    if m.is_some() || size as u64 != p.size {
        return Err(fail(CUresult::CUDA_ERROR_NOT_SUPPORTED, || {
            "cuMemMap: the fake maps physical memory once, whole".into()
        }));
    }
    let a = d
        .mem
        .alloc_at(ptr, p.size, p.dev)
        .map_err(|e| invalid(|| e.to_string()))?;
    *m = Some(a);
    lock(&d.mc.phys_mapped).insert(ptr, p.clone());
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuMulticastBindMem(
    handle: Handle,
    mc_offset: usize,
    mem: Handle,
    mem_offset: usize,
    size: usize,
    flags: c_ulonglong,
) -> CUresult {
    ffi("cuMulticastBindMem", || {
        let d = drv()?;
        if flags != 0 {
            return Err(invalid(|| format!("flags {flags:#x} (must be 0)")));
        }
        let obj = object(d, handle)?;
        all_added(&obj)?;
        let p = lock(&d.mc.phys).get(&mem).cloned().ok_or_else(|| {
            fail(CUresult::CUDA_ERROR_INVALID_HANDLE, || {
                format!("cuMulticastBindMem: memory handle {mem:#x}")
            })
        })?;
        let alloc = lock(&p.mapped).clone().ok_or_else(|| {
            fail(CUresult::CUDA_ERROR_NOT_SUPPORTED, || {
                "cuMulticastBindMem: the fake binds physical memory once it is mapped".into()
            })
        })?;
        obj.bind_mem(mc_offset as u64, &alloc, mem_offset as u64, size as u64)
            .map_err(|e| invalid(|| e.to_string()))
    })
}
