//! Multicast objects (NVLink SHARP / NVLS on Hopper): one object binds same-offset ranges of
//! several devices' memories, and a multicast address range mapped onto it lets
//! `multimem.ld_reduce`, `multimem.st` and `multimem.red` reach every bound device's memory
//! with one instruction. This module owns the objects and their address ranges; the
//! instructions run in `exec/multimem.rs`.
//!
//! The API follows the CUDA driver's:
//!
//! | CUDA | here |
//! |---|---|
//! | `cuMulticastCreate(&h, {numDevices, size})` | [`GlobalMemory::multicast_create`] |
//! | `cuMulticastGetGranularity` | [`GRANULARITY`] |
//! | `cuMulticastAddDevice(h, dev)` | [`MulticastObject::add_device`] |
//! | `cuMulticastBindMem(h, mcOffset, mem, memOffset, size)` | [`MulticastObject::bind_mem`] |
//! | `cuMemMap(va, size, 0, h, 0)` + `cuMemSetAccess` | [`GlobalMemory::multicast_map`] |
//! | `cuMemAddressReserve`, then `cuMemMap` there | [`GlobalMemory::multicast_reserve`], [`GlobalMemory::multicast_map_at`] |
//! | `cuMulticastUnbind(h, dev, mcOffset, size)` | [`MulticastObject::unbind`] |
//! | `cuMemCreate` + `cuMemMap` at a reserved address | [`GlobalMemory::alloc_at`] |
//! | `cuMemUnmap` | [`GlobalMemory::multicast_unmap`] |
//!
//! Every member device must have memory bound at the offsets an instruction touches: an
//! access where one has none is a fault naming the device (on hardware the object cannot be
//! used before every added device has bound memory). Only `multimem.*` may access a
//! multicast address; PTX makes any other access (`ld`, `st`, `atom`, ...) undefined
//! behaviour, and the emulator stops such an access with
//! [`crate::FaultKind::MulticastPlainAccess`]. A `multimem.*` on any other address is
//! [`crate::FaultKind::NotMulticast`]. The unified address space of the emulator makes one
//! device's mapping usable from another device's kernels; each device still gets its own range,
//! as `cuMemMap` gives it on hardware.

use crate::error::EmuError;
use crate::memory::{fits, Allocation, GlobalMemory};
use std::sync::{Arc, RwLock};

/// Size and alignment unit of multicast objects, bindings and mappings
/// (`CU_MULTICAST_GRANULARITY_RECOMMENDED` on Hopper: 2 MiB).
pub const GRANULARITY: u64 = 2 << 20;
/// First multicast address handed out (a window no allocation or other space uses).
pub const MULTICAST_WINDOW: u64 = 0x0000_5000_0000_0000;

/// One device's memory bound into a multicast object.
#[derive(Clone)]
pub struct Binding {
    pub device: u32,
    /// Offset in the multicast object.
    pub mc_offset: u64,
    pub size: u64,
    pub alloc: Arc<Allocation>,
    /// Offset in `alloc`.
    pub mem_offset: u64,
}

#[derive(Default)]
struct McState {
    devices: Vec<u32>,
    bindings: Vec<Binding>,
}

/// A multicast object: `size` bytes, up to `num_devices` member devices.
pub struct MulticastObject {
    pub size: u64,
    pub num_devices: u32,
    state: RwLock<McState>,
}

/// Where one element of a multimem access lies in one member device's memory.
pub struct Target<'a> {
    pub device: u32,
    pub alloc: &'a Arc<Allocation>,
    pub offset: u64,
}

impl MulticastObject {
    fn state(&self) -> std::sync::RwLockReadGuard<'_, McState> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The member devices, in the order they were added.
    pub fn devices(&self) -> Vec<u32> {
        self.state().devices.clone()
    }

    /// Adds `device` as a member (`cuMulticastAddDevice`): at most `num_devices`, each once,
    /// all before the first binding.
    pub fn add_device(&self, device: u32) -> Result<(), EmuError> {
        let mut s = self.state.write().unwrap_or_else(|p| p.into_inner());
        if s.devices.contains(&device) {
            return Err(mc_err(format!("device {device} was already added")));
        }
        if s.devices.len() as u32 >= self.num_devices {
            return Err(mc_err(format!(
                "num_devices: the object was created for {} devices",
                self.num_devices
            )));
        }
        if !s.bindings.is_empty() {
            return Err(mc_err("add every device before binding memory".into()));
        }
        s.devices.push(device);
        Ok(())
    }

    /// Binds `size` bytes of `alloc` from `mem_offset` at `mc_offset` of the object, for the
    /// device owning `alloc` (`cuMulticastBindMem`). Offsets and size are multiples of
    /// [`GRANULARITY`]; the device must be a member; bindings of one device do not overlap.
    pub fn bind_mem(
        &self,
        mc_offset: u64,
        alloc: &Arc<Allocation>,
        mem_offset: u64,
        size: u64,
    ) -> Result<(), EmuError> {
        let device = alloc.device;
        for (name, v) in [
            ("mc_offset", mc_offset),
            ("mem_offset", mem_offset),
            ("size", size),
        ] {
            if !v.is_multiple_of(GRANULARITY) {
                return Err(mc_err(format!(
                    "{name} {v:#x} is not a multiple of the granularity {GRANULARITY:#x}"
                )));
            }
        }
        if size == 0 || !fits(mc_offset, size, self.size) {
            return Err(mc_err(format!(
                "size: [{mc_offset:#x}, +{size:#x}) is outside the {:#x}-byte object",
                self.size
            )));
        }
        if !fits(mem_offset, size, alloc.size) {
            return Err(mc_err(format!(
                "mem_offset: [{mem_offset:#x}, +{size:#x}) is outside the {:#x}-byte allocation",
                alloc.size
            )));
        }
        let mut s = self.state.write().unwrap_or_else(|p| p.into_inner());
        if !s.devices.contains(&device) {
            return Err(mc_err(format!(
                "device {device} (owner of the memory) was not added to the object"
            )));
        }
        let overlaps = |b: &Binding| {
            b.device == device && mc_offset < b.mc_offset + b.size && b.mc_offset < mc_offset + size
        };
        if s.bindings.iter().any(overlaps) {
            return Err(mc_err(format!(
                "device {device} already has memory bound in [{mc_offset:#x}, +{size:#x})"
            )));
        }
        s.bindings.push(Binding {
            device,
            mc_offset,
            size,
            alloc: alloc.clone(),
            mem_offset,
        });
        Ok(())
    }

    /// Removes `device`'s binding at `[mc_offset, +size)` (`cuMulticastUnbind`), which must be
    /// exactly one earlier [`MulticastObject::bind_mem`]. Kernels launched later fault there.
    pub fn unbind(&self, device: u32, mc_offset: u64, size: u64) -> Result<(), EmuError> {
        let mut s = self.state.write().unwrap_or_else(|p| p.into_inner());
        let at = s
            .bindings
            .iter()
            .position(|b| b.device == device && b.mc_offset == mc_offset && b.size == size)
            .ok_or_else(|| {
                mc_err(format!(
                    "mc_offset: device {device} has no binding of [{mc_offset:#x}, +{size:#x})"
                ))
            })?;
        s.bindings.remove(at);
        Ok(())
    }

    /// Calls `f` with where `[off, off+len)` of the object lies in each member device's
    /// memory, in the order the devices were added; an error names a device with no memory
    /// bound there.
    pub fn for_each_target<R>(
        &self,
        off: u64,
        len: u64,
        mut f: impl FnMut(Target<'_>) -> R,
    ) -> Result<Vec<R>, String> {
        let s = self.state();
        let mut out = Vec::with_capacity(s.devices.len());
        for &dev in &s.devices {
            let b = s
                .bindings
                .iter()
                .find(|b| {
                    b.device == dev && off >= b.mc_offset && off + len <= b.mc_offset + b.size
                })
                .ok_or_else(|| {
                    format!("device {dev} has no memory bound at multicast offset {off:#x}")
                })?;
            out.push(f(Target {
                device: dev,
                alloc: &b.alloc,
                offset: b.mem_offset + (off - b.mc_offset),
            }));
        }
        if out.is_empty() {
            return Err("the multicast object has no member devices".into());
        }
        Ok(out)
    }
}

fn mc_err(msg: String) -> EmuError {
    EmuError::Memory(format!("multicast: {msg}"))
}

/// A multicast address range: `[base, base + obj.size)` maps the object, for `device`.
#[derive(Clone)]
pub struct McMapping {
    pub base: u64,
    pub device: u32,
    pub obj: Arc<MulticastObject>,
}

impl McMapping {
    /// Whether `[addr, addr+len)` lies in this range.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.base && fits(addr - self.base, len, self.obj.size)
    }
}

impl GlobalMemory {
    /// Creates a multicast object of `size` bytes (a multiple of [`GRANULARITY`]) for up to
    /// `num_devices` devices (`cuMulticastCreate`).
    pub fn multicast_create(
        &self,
        size: u64,
        num_devices: u32,
    ) -> Result<Arc<MulticastObject>, EmuError> {
        if size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(mc_err(format!(
                "size {size:#x} is not a positive multiple of the granularity {GRANULARITY:#x}"
            )));
        }
        if num_devices == 0 {
            return Err(mc_err("num_devices must be at least 1".into()));
        }
        crate::limits::check_alloc(size)?;
        Ok(Arc::new(MulticastObject {
            size,
            num_devices,
            state: RwLock::default(),
        }))
    }

    /// Maps `obj` at a fresh multicast address range for `device` (`cuMemAddressReserve` +
    /// `cuMemMap` of the multicast handle + `cuMemSetAccess`); returns its base. The device
    /// must be a member.
    pub fn multicast_map(&self, obj: &Arc<MulticastObject>, device: u32) -> Result<u64, EmuError> {
        let base = self.multicast_reserve(obj.size)?;
        self.multicast_map_at(obj, device, base)?;
        Ok(base)
    }

    /// Reserves `size` bytes (a positive multiple of [`GRANULARITY`]) of address space
    /// (`cuMemAddressReserve`) for [`GlobalMemory::multicast_map_at`] and
    /// [`GlobalMemory::alloc_at`]; returns the base. Reserved ranges are never handed out again.
    pub fn multicast_reserve(&self, size: u64) -> Result<u64, EmuError> {
        if size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(mc_err(format!(
                "size {size:#x} is not a positive multiple of the granularity {GRANULARITY:#x}"
            )));
        }
        self.reserve_mc_range(size)
    }

    /// Maps `obj` for `device` at `base`, inside a range from
    /// [`GlobalMemory::multicast_reserve`] and overlapping no other mapping (`cuMemMap` of the
    /// multicast handle at a reserved address). The device must be a member.
    pub fn multicast_map_at(
        &self,
        obj: &Arc<MulticastObject>,
        device: u32,
        base: u64,
    ) -> Result<(), EmuError> {
        if !obj.devices().contains(&device) {
            return Err(mc_err(format!(
                "device {device} was not added to the object it maps"
            )));
        }
        self.add_mc_mapping(obj, device, base)
    }

    /// Removes the multicast range at `base` (`cuMemUnmap`); kernels launched later fault on it.
    pub fn multicast_unmap(&self, base: u64) {
        self.remove_mc_mapping(base);
    }
}
