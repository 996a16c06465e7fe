//! The emulator's limits on sizes that come from input — a module's declarations (registers,
//! `.local`, `.shared`, `.global`, parameters) and a launch's shape — in one place. Each is
//! checked with overflow-free arithmetic before anything is allocated, and a violation is an
//! error naming the field and the limit (docs/RELIABILITY.md, "Limits", lists them and why).

use crate::error::EmuError;
use ptx::{Function, Module, Space, Statement};

/// Virtual register slots one function may declare (the emulator keeps every slot for every
/// lane: 256 bytes per warp each, so 65,536 slots are 16 MiB per warp). PTX from compilers uses
/// a few thousand at most.
pub const MAX_REGISTERS: u64 = 1 << 16;
/// `.local` bytes per thread (CUDA's limit: 512 KiB).
pub const MAX_LOCAL_BYTES: u64 = 512 * 1024;
/// Static `.shared` bytes a module or kernel may declare (the largest opt-in shared memory of
/// any target, sm_90's 227 KiB; the launch then checks the kernel's own target).
pub const MAX_SHARED_BYTES: u64 = 227 * 1024;
/// Parameter bytes of a kernel (CUDA 12.1+ on Hopper: 32,764).
pub const MAX_PARAM_BYTES: u64 = 32_764;
/// Threads per CTA, and the CTA's z dimension.
pub const MAX_BLOCK_THREADS: u64 = 1024;
pub const MAX_BLOCK_Z: u32 = 64;
/// Grid x (2^31 - 1) and y/z (65,535) dimensions, as on every CUDA GPU since sm_30.
pub const MAX_GRID_X: u32 = (1 << 31) - 1;
pub const MAX_GRID_YZ: u32 = 65_535;

fn too_big(kernel: &str, what: impl Into<String>) -> EmuError {
    EmuError::Decode {
        kernel: kernel.to_string(),
        msg: what.into(),
    }
}

/// Checks one function's declarations: register slots, `.local` and `.shared` bytes and
/// parameter bytes, each summed without overflow against its limit.
pub fn check_function(f: &Function) -> Result<(), EmuError> {
    let (mut regs, mut local, mut shared) = (0u64, 0u64, 0u64);
    f.walk(&mut |s| match s {
        Statement::Reg(d) => {
            for n in &d.names {
                let k = n.count.map_or(d.vec.unwrap_or(1) as u64, u64::from);
                regs = regs.saturating_add(k);
            }
        }
        Statement::Var(v) if v.space == Space::Local => {
            local = local.saturating_add(v.size_bytes());
        }
        Statement::Var(v) if v.space.is_shared() => {
            shared = shared.saturating_add(v.size_bytes());
        }
        _ => {}
    });
    let params = f
        .params
        .iter()
        .fold(0u64, |acc, p| acc.saturating_add(p.size_bytes()));
    for (field, v, limit) in [
        ("registers declared", regs, MAX_REGISTERS),
        (".local bytes per thread", local, MAX_LOCAL_BYTES),
        (".shared bytes declared", shared, MAX_SHARED_BYTES),
        ("parameter bytes", params, MAX_PARAM_BYTES),
    ] {
        if v > limit {
            return Err(too_big(
                &f.name,
                format!(
                    "{field}: {} exceeds the emulator's limit of {limit}",
                    show(v)
                ),
            ));
        }
    }
    Ok(())
}

/// Checks the module-scope `.shared` declarations (their sum) and every function.
pub fn check_module(m: &Module) -> Result<(), EmuError> {
    let shared = m
        .globals()
        .filter(|g| g.space.is_shared())
        .fold(0u64, |acc, g| acc.saturating_add(g.size_bytes()));
    if shared > MAX_SHARED_BYTES {
        return Err(too_big(
            "(module)",
            format!(
                "module .shared variables: {} bytes exceed the emulator's limit of {MAX_SHARED_BYTES}",
                show(shared)
            ),
        ));
    }
    m.functions().try_for_each(check_function)
}

/// Checks a launch's shape: block dimensions and their product, grid dimensions.
pub fn check_shape(grid: [u32; 3], block: [u32; 3]) -> Result<(), EmuError> {
    let threads: u64 = block.iter().map(|&d| d as u64).product();
    if threads == 0 || threads > MAX_BLOCK_THREADS {
        return Err(EmuError::Launch(format!(
            "block {}x{}x{} has {threads} threads (must be 1..={MAX_BLOCK_THREADS})",
            block[0], block[1], block[2]
        )));
    }
    if block[2] > MAX_BLOCK_Z {
        return Err(EmuError::Launch(format!(
            "block z dimension {} is above {MAX_BLOCK_Z}",
            block[2]
        )));
    }
    if grid.contains(&0) {
        return Err(EmuError::Launch("empty grid".into()));
    }
    if grid[0] > MAX_GRID_X {
        return Err(EmuError::Launch(format!(
            "grid x dimension {} is above {MAX_GRID_X}",
            grid[0]
        )));
    }
    if grid[1] > MAX_GRID_YZ || grid[2] > MAX_GRID_YZ {
        return Err(EmuError::Launch(format!(
            "grid y/z dimension ({}, {}) above {MAX_GRID_YZ}",
            grid[1], grid[2]
        )));
    }
    Ok(())
}

/// A size for a message (`u64::MAX` is what an overflowing sum saturated to).
fn show(v: u64) -> String {
    if v == u64::MAX {
        "more than 2^64".into()
    } else {
        v.to_string()
    }
}

/// Largest single emulated allocation (device memory is host memory here).
pub const MAX_ALLOC_BYTES: u64 = 1 << 36;

/// Host memory available now (`MemAvailable` of `/proc/meminfo`), when the platform says.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Checks an allocation of `size` bytes against [`MAX_ALLOC_BYTES`] and, for large ones (over
/// 1 GiB), the host memory available now, so a huge request fails with a message instead of
/// the process aborting.
pub fn check_alloc(size: u64) -> Result<(), EmuError> {
    if size > MAX_ALLOC_BYTES {
        return Err(EmuError::Memory(format!(
            "allocation of {size} bytes exceeds the emulator's limit of {MAX_ALLOC_BYTES} bytes (64 GiB)"
        )));
    }
    if size > 1 << 30 {
        if let Some(avail) = available_memory().filter(|&a| size > a) {
            return Err(EmuError::Memory(format!(
                "allocation of {size} bytes exceeds the {avail} bytes of host memory available"
            )));
        }
    }
    Ok(())
}
