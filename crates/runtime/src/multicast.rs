//! Multicast objects for `multimem.*` kernels: the runtime face of [`emu::multicast`],
//! mirroring CUDA's `cuMulticastCreate` / `cuMulticastAddDevice` / `cuMulticastBindMem` /
//! `cuMemMap` of the multicast handle. Emulated devices only: on the CUDA backend every call
//! is [`RuntimeError::Buffer`] saying so.
//!
//! ```
//! use runtime::{Device, Multicast};
//! let devs = [Device::emu(0), Device::emu(1)];
//! let g = Multicast::granularity();
//! let mc = Multicast::create(g, devs.len() as u32).unwrap();
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

use crate::device::emu_memory;
use crate::{Buffer, Device, Pod, Result, RuntimeError};
use std::sync::{Arc, Mutex};

/// A multicast object and the address ranges mapped onto it (unmapped on drop).
pub struct Multicast {
    obj: Arc<emu::multicast::MulticastObject>,
    maps: Mutex<Vec<u64>>,
}

fn emu_only(dev: &Device, what: &str) -> Result<()> {
    if dev.cuda_ctx().is_some() {
        return Err(RuntimeError::Buffer(format!(
            "multicast {what}: the CUDA backend has no multicast objects here (emulated devices only)"
        )));
    }
    Ok(())
}

impl Multicast {
    /// The size and alignment unit of objects, bindings and mappings
    /// (`cuMulticastGetGranularity`).
    pub fn granularity() -> usize {
        emu::multicast::GRANULARITY as usize
    }

    /// A multicast object of `size` bytes for up to `num_devices` devices (`cuMulticastCreate`).
    pub fn create(size: usize, num_devices: u32) -> Result<Multicast> {
        let obj = emu_memory().multicast_create(size as u64, num_devices)?;
        Ok(Multicast {
            obj,
            maps: Mutex::new(Vec::new()),
        })
    }

    /// Adds `dev` as a member (`cuMulticastAddDevice`); every member before the first bind.
    pub fn add_device(&self, dev: &Device) -> Result<()> {
        emu_only(dev, "add_device")?;
        Ok(self.obj.add_device(dev.index())?)
    }

    /// Binds `size` bytes of `buf` from byte `buf_offset` at byte `mc_offset` of the object,
    /// for `buf`'s device (`cuMulticastBindMem`); offsets and size are multiples of
    /// [`Multicast::granularity`].
    pub fn bind<T: Pod>(
        &self,
        mc_offset: usize,
        buf: &Buffer<T>,
        buf_offset: usize,
        size: usize,
    ) -> Result<()> {
        emu_only(buf.device(), "bind")?;
        let alloc = buf.emu_alloc().ok_or_else(|| {
            RuntimeError::Buffer("multicast bind: buffer has no emulator memory".into())
        })?;
        Ok(self
            .obj
            .bind_mem(mc_offset as u64, alloc, buf_offset as u64, size as u64)?)
    }

    /// Maps the object for `dev` (`cuMemAddressReserve` + `cuMemMap` + `cuMemSetAccess`) and
    /// returns the multicast address kernels on `dev` pass to `multimem.*`. Plain loads and
    /// stores through it fault.
    pub fn map(&self, dev: &Device) -> Result<u64> {
        emu_only(dev, "map")?;
        let base = emu_memory().multicast_map(&self.obj, dev.index())?;
        self.maps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(base);
        Ok(base)
    }

    /// The size in bytes.
    pub fn size(&self) -> usize {
        self.obj.size as usize
    }
}

impl Drop for Multicast {
    fn drop(&mut self) {
        let maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
        for base in maps.iter() {
            emu_memory().multicast_unmap(*base);
        }
    }
}
