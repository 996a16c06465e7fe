//! The memory behind a `Buffer`, per backend, and the process's emulated memory settings
//! (address slot, shared-memory allocations) taken from the environment. IPC handles are in
//! `ipc.rs`.

use crate::cuda::memory::DevMem;
use crate::{Result, RuntimeError};
use emu::GlobalMemory;
use std::sync::{Arc, OnceLock};

/// Where an emulator buffer's allocation came from, which decides what dropping it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EmuOrigin {
    /// Allocated by this buffer: dropping frees it (and unlinks its segment, if shared).
    Owned,
    /// Another buffer's allocation in this process, opened from an IPC handle: nothing to do.
    Alias,
    /// A peer process's segment mapped here: dropping closes this open (unmaps at the last).
    Peer,
}

/// An emulator allocation and where it came from.
pub(crate) struct EmuMem {
    pub alloc: Arc<emu::Allocation>,
    pub origin: EmuOrigin,
}

impl EmuMem {
    /// A peer buffer whose owner freed it (or exited) can no longer be copied to or from.
    fn check_live(&self) -> Result<()> {
        if self.origin == EmuOrigin::Peer && self.alloc.peer_freed() {
            let seg = self
                .alloc
                .segment()
                .map(|s| s.id().name())
                .unwrap_or_default();
            return Err(RuntimeError::Ipc {
                handle: format!("segment {seg} at {:#x}", self.alloc.base),
                msg: "its owner freed the buffer (or exited)".into(),
            });
        }
        Ok(())
    }
}

impl Drop for EmuMem {
    fn drop(&mut self) {
        let mem = crate::device::emu_memory();
        match self.origin {
            EmuOrigin::Owned => mem.free(self.alloc.base),
            EmuOrigin::Peer => mem.close_shared(self.alloc.base),
            EmuOrigin::Alias => {}
        }
    }
}

pub(crate) enum Storage {
    Emu(EmuMem),
    Cuda(DevMem),
}

impl Storage {
    pub fn ptr(&self) -> u64 {
        match self {
            Storage::Emu(m) => m.alloc.base,
            Storage::Cuda(m) => m.ptr,
        }
    }
    pub fn write(&self, off: usize, data: &[u8]) -> Result<()> {
        match self {
            Storage::Emu(m) => {
                m.check_live()?;
                m.alloc.write_bytes(off as u64, data);
                Ok(())
            }
            Storage::Cuda(m) => m.write(off, data),
        }
    }
    pub fn read(&self, off: usize, out: &mut [u8]) -> Result<()> {
        match self {
            Storage::Emu(m) => {
                m.check_live()?;
                m.alloc.read_bytes(off as u64, out);
                Ok(())
            }
            Storage::Cuda(m) => m.read(off, out),
        }
    }
    pub fn fill(&self, bytes: usize, pattern: &[u8]) -> Result<()> {
        match self {
            Storage::Emu(m) => {
                m.check_live()?;
                m.alloc.fill(0, bytes as u64, pattern);
                Ok(())
            }
            Storage::Cuda(m) => m.fill(pattern),
        }
    }
}

/// The environment's emulated-memory settings, applied to the process's memory when it is
/// first used: the address slot (`PTXFORGE_EMU_SLOT`, else `RANK`, else 0) and whether every
/// allocation is a shared segment (`PTXFORGE_EMU_SHM=1|0`; default: on when `RANK` is set, i.e.
/// in a multi-process job). Bad values are reported by the first allocation.
pub(crate) fn configure_from_env(mem: &GlobalMemory) -> Result<()> {
    let var = |k: &str| std::env::var(k).ok().map(|v| (k.to_string(), v));
    if let Some((k, v)) = var("PTXFORGE_EMU_SLOT").or_else(|| var("RANK")) {
        let slot: u32 = v.trim().parse().map_err(|_| {
            RuntimeError::Buffer(format!("{k}=`{v}`: not an address slot (a rank number)"))
        })?;
        mem.set_address_slot(slot)
            .map_err(|e| RuntimeError::Buffer(format!("{k}=`{v}`: {e}")))?;
    }
    let shared = match var("PTXFORGE_EMU_SHM") {
        Some((_, v)) if v == "1" => true,
        Some((_, v)) if v == "0" => false,
        Some((k, v)) => {
            return Err(RuntimeError::Buffer(format!("{k}=`{v}`: must be 1 or 0")));
        }
        None => var("RANK").is_some(),
    };
    mem.set_shared_default(shared);
    Ok(())
}

/// The error [`configure_from_env`] returned, if any (set once, with the process's memory).
pub(crate) fn env_error() -> &'static OnceLock<Option<RuntimeError>> {
    static ERR: OnceLock<Option<RuntimeError>> = OnceLock::new();
    &ERR
}
