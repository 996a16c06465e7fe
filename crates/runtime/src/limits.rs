//! Limits on sizes the runner takes from its input (`ptxforge run`'s `out:` counts, `.npy`
//! shapes, launch shapes), in one place; the emulator's own limits are in `emu::limits`.
//! docs/RELIABILITY.md ("Limits") lists them and why.

use crate::RuntimeError;

/// Largest buffer one argument may have (`out:DTYPE:COUNT`, an `.npy` file's data): the
/// emulator's largest allocation, 64 GiB.
pub const MAX_BUFFER_BYTES: u64 = emu::limits::MAX_ALLOC_BYTES;

/// Largest dynamic shared memory of a launch (sm_90's opt-in maximum, 227 KiB; the launch
/// also checks the kernel's own target and its static shared memory).
pub const MAX_DYNAMIC_SHARED_BYTES: u32 = 227 * 1024;

/// Checks a launch's shape before any buffer is built: block and grid dimensions (products in
/// 64 bits) and the dynamic shared memory.
pub fn check_launch(grid: [u32; 3], block: [u32; 3], shared: u32) -> Result<(), RuntimeError> {
    emu::limits::check_shape(grid, block)?;
    if shared > MAX_DYNAMIC_SHARED_BYTES {
        return Err(RuntimeError::Launch(format!(
            "dynamic shared memory of {shared} bytes is above {MAX_DYNAMIC_SHARED_BYTES} (227 KiB)"
        )));
    }
    Ok(())
}
