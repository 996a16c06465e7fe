//! Green contexts (CUDA 12.4+): a hard split of a device's SMs into a communication partition
//! and a compute partition, each with its own context and streams.

use super::launch::{cuda_priority, CuStream, RawStream};
use super::{check, guarded, version_text, Ctx};
use crate::{Result, RuntimeError};
use cudarc::driver::sys;
use std::sync::{Arc, Mutex};

/// A green context holding a fixed set of SMs.
pub(crate) struct GreenCtx {
    pub green: sys::CUgreenCtx,
    /// The `CUcontext` view of the green context (for cuCtxSetCurrent and module loads).
    pub ctx: sys::CUcontext,
    /// SMs the driver actually granted (rounded up to the architecture's granularity).
    pub sms: u32,
    pub dev: Arc<Ctx>,
}

// SAFETY: green context handles are thread-agnostic driver handles.
unsafe impl Send for GreenCtx {}
// SAFETY: see above.
unsafe impl Sync for GreenCtx {}

impl Drop for GreenCtx {
    fn drop(&mut self) {
        // SAFETY: destroys the green context created in `split`, exactly once (streams, events
        // and module loads in it hold an Arc to it, so they are gone).
        unsafe {
            sys::cuGreenCtxDestroy(self.green);
        }
        let _ = self.dev.bind();
    }
}

/// Driver 12.4 introduced green contexts.
pub(crate) const MIN_DRIVER: i32 = 12040;

/// The SM-count rules of `cuDevSmResourceSplitByCount` per architecture, as (minimum,
/// multiple) — NVIDIA's guideline: CC 6.x 1 SM; 7.x at least 2, a multiple of 2; 8.x at least 4,
/// a multiple of 2; 9.0+ at least 8, a multiple of 8.
pub(crate) fn split_granularity(sm_version: u32) -> (u32, u32) {
    match sm_version {
        0..=69 => (1, 1),
        70..=79 => (2, 2),
        80..=89 => (4, 2),
        _ => (8, 8),
    }
}

/// `comm_sms` rounded up to the architecture's split granularity.
pub(crate) fn round_comm_sms(comm_sms: u32, sm_version: u32) -> u32 {
    let (min, mult) = split_granularity(sm_version);
    comm_sms.max(min).div_ceil(mult) * mult
}

/// Splits the device's SMs: `comm_sms` (rounded up to the architecture's granularity, e.g. a
/// multiple of 8 on Hopper) for communication, the rest for compute. Returns (comm, compute).
pub(crate) fn split(
    dev: &Arc<Ctx>,
    sm_version: u32,
    total_sms: u32,
    comm_sms: u32,
) -> Result<(Arc<GreenCtx>, Arc<GreenCtx>)> {
    if dev.driver_version < MIN_DRIVER {
        return Err(RuntimeError::Cuda(format!(
            "green contexts need driver 12.4+, this one is {}",
            version_text(dev.driver_version)
        )));
    }
    let want = round_comm_sms(comm_sms, sm_version);
    if want >= total_sms {
        return Err(RuntimeError::Cuda(format!(
            "{comm_sms} SMs round up to {want} (the sm_{sm_version} split granularity), leaving none of the {total_sms} for compute"
        )));
    }
    dev.bind()?;
    guarded(
        "green contexts",
        || -> Result<(Arc<GreenCtx>, Arc<GreenCtx>)> {
            // SAFETY: CUdevResource is a plain C struct; zeroed is a valid "empty" value that the
            // driver overwrites. All pointers below are to locals that outlive each call.
            unsafe {
                let mut all: sys::CUdevResource = std::mem::zeroed();
                check(
                    sys::cuDeviceGetDevResource(
                        dev.dev,
                        &mut all,
                        sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
                    ),
                    "cuDeviceGetDevResource(SM)",
                )?;
                let mut comm: sys::CUdevResource = std::mem::zeroed();
                let mut rest: sys::CUdevResource = std::mem::zeroed();
                let mut groups = 1u32;
                check(
                    sys::cuDevSmResourceSplitByCount(
                        &mut comm,
                        &mut groups,
                        &all,
                        &mut rest,
                        0,
                        want,
                    ),
                    &format!("cuDevSmResourceSplitByCount(minCount = {want})"),
                )?;
                let (got, left) = (
                    comm.__bindgen_anon_1.sm.smCount,
                    rest.__bindgen_anon_1.sm.smCount,
                );
                if groups != 1 || got < comm_sms || left == 0 {
                    return Err(RuntimeError::Cuda(format!(
                        "cannot carve {comm_sms} SMs out of the device's {total_sms}: the driver made {groups} group(s) of {got} SMs, {left} left"
                    )));
                }
                let comm = make(dev, &mut comm)?;
                let rest = make(dev, &mut rest)?;
                Ok((Arc::new(comm), Arc::new(rest)))
            }
        },
    )?
}

/// Creates a green context from one SM resource.
///
/// # Safety
/// `res` must be an SM resource produced by the driver for `dev`.
unsafe fn make(dev: &Arc<Ctx>, res: &mut sys::CUdevResource) -> Result<GreenCtx> {
    let sms = res.__bindgen_anon_1.sm.smCount;
    let mut desc = std::ptr::null_mut();
    check(
        sys::cuDevResourceGenerateDesc(&mut desc, res, 1),
        "cuDevResourceGenerateDesc",
    )?;
    let mut green = std::ptr::null_mut();
    check(
        sys::cuGreenCtxCreate(
            &mut green,
            desc,
            dev.dev,
            sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
        ),
        "cuGreenCtxCreate",
    )?;
    let mut ctx = std::ptr::null_mut();
    if let Err(e) = check(sys::cuCtxFromGreenCtx(&mut ctx, green), "cuCtxFromGreenCtx") {
        sys::cuGreenCtxDestroy(green);
        return Err(e);
    }
    Ok(GreenCtx {
        green,
        ctx,
        sms,
        dev: dev.clone(),
    })
}

/// A stream whose kernels run only on the green context's SMs.
pub(crate) fn stream(g: &Arc<GreenCtx>, priority: i32) -> Result<CuStream> {
    let p = cuda_priority(g.ctx, priority)?;
    let raw = if g.dev.driver_version >= 12050 {
        let mut s = std::ptr::null_mut();
        guarded("cuGreenCtxStreamCreate", || {
            // SAFETY: live green context; out-pointer to a local.
            check(
                unsafe {
                    sys::cuGreenCtxStreamCreate(
                        &mut s,
                        g.green,
                        sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                        p,
                    )
                },
                "cuGreenCtxStreamCreate",
            )
        })??;
        RawStream(s)
    } else {
        // 12.4: a stream created while the green context's CUcontext is current belongs to it.
        RawStream::create(g.ctx, p)?
    };
    // Do not leave the green context current on this thread (see `CuStream::enter`).
    g.dev.bind()?;
    Ok(CuStream {
        raw,
        ctx: g.ctx,
        dev: g.dev.clone(),
        green: Some(g.clone()),
        keep: Mutex::new((0, Vec::new())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comm_sms_round_to_the_split_granularity() {
        // Hopper: at least 8, a multiple of 8.
        assert_eq!(round_comm_sms(1, 90), 8);
        assert_eq!(round_comm_sms(8, 90), 8);
        assert_eq!(round_comm_sms(16, 90), 16);
        assert_eq!(round_comm_sms(20, 90), 24);
        assert_eq!(round_comm_sms(20, 100), 24);
        // Ampere: at least 4, a multiple of 2.
        assert_eq!(round_comm_sms(3, 80), 4);
        assert_eq!(round_comm_sms(5, 86), 6);
        // Volta/Turing: at least 2, a multiple of 2.
        assert_eq!(round_comm_sms(1, 75), 2);
        assert_eq!(round_comm_sms(3, 70), 4);
        assert_eq!(round_comm_sms(3, 61), 3);
    }
}
