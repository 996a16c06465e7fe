//! SM partitioning: "run this on N SMs".
//!
//! * [`crate::LaunchConfig::sm_budget`] on any stream. The emulator schedules the launch's CTAs on
//!   exactly that SM range. On CUDA it is advisory: the usual pattern is a persistent kernel whose
//!   grid equals the budget ([`crate::LaunchConfig::persistent`]) on a high-priority stream next
//!   to compute kernels sized to the remaining SMs; the hardware scheduler does not pin CTAs to
//!   SMs, so use [`sms_used`] to see where they actually ran.
//! * [`Device::partition`]: a hard split. CUDA (driver 12.4+): two green contexts
//!   (`cuDevSmResourceSplitByCount` + `cuGreenCtxCreate`), streams in each. Emulator: streams whose
//!   launches default to the partition's SM range. Older drivers: priority streams with an
//!   advisory budget ([`PartitionKind::Streams`]).

use crate::cuda::green::{self, GreenCtx};
use crate::device::{Device, SmPartition};
use crate::stream::{LaunchConfig, Stream};
use crate::{Result, RuntimeError};
use std::sync::Arc;

/// How a partition's SMs are held apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PartitionKind {
    /// Emulator: launches are scheduled on the partition's SM range.
    Emulated,
    /// CUDA green context: the driver runs the partition's work on its SMs only.
    GreenContext,
    /// CUDA without green contexts: streams with priorities; the SM range is advisory (reason).
    Streams(String),
}

/// One side of a device split ([`Device::partition`]).
#[derive(Clone)]
pub struct Partition {
    device: Device,
    sms: SmPartition,
    kind: PartitionKind,
    priority: i32,
    green: Option<Arc<GreenCtx>>,
}

impl Partition {
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// The partition's SMs. Emulator: the exact range. CUDA green contexts: the granted count
    /// (which SM ids the driver picked is not exposed; use [`sms_used`]).
    pub fn sms(&self) -> SmPartition {
        self.sms
    }
    pub fn kind(&self) -> &PartitionKind {
        &self.kind
    }
    /// A new stream of this partition (communication partitions get high priority).
    pub fn stream(&self) -> Result<Stream> {
        self.stream_with_priority(self.priority)
    }
    pub fn stream_with_priority(&self, priority: i32) -> Result<Stream> {
        let cuda = match (&self.green, self.device.cuda_ctx()) {
            (Some(g), _) => Some(green::stream(g, priority)),
            (None, Some(c)) => Some(crate::cuda::launch::CuStream::new(c, priority)),
            (None, None) => None,
        };
        if let Some(Err(e)) = &cuda {
            return Err(e.clone());
        }
        Ok(Stream::with_parts(
            &self.device,
            priority,
            cuda,
            Some(self.sms),
        ))
    }
}

impl Device {
    /// Splits the device into a communication partition of `comm_sms` SMs and a compute
    /// partition of the rest; returns `(comm, compute)`. Emulator: comm takes the top SMs
    /// (`sms - comm_sms ..`), compute the bottom ones.
    pub fn partition(&self, comm_sms: u32) -> Result<(Partition, Partition)> {
        let sms = self.props().sms;
        if comm_sms == 0 || comm_sms >= sms {
            return Err(RuntimeError::Launch(format!(
                "cannot give {comm_sms} of {sms} SMs to communication (at least 1 and at most {}, \
                 leaving compute at least one)",
                sms.saturating_sub(1)
            )));
        }
        let part = |sms: SmPartition, kind: PartitionKind, priority, green| Partition {
            device: self.clone(),
            sms,
            kind,
            priority,
            green,
        };
        let Some(ctx) = self.cuda_ctx() else {
            let comm = SmPartition {
                offset: sms - comm_sms,
                count: comm_sms,
            };
            let compute = SmPartition {
                offset: 0,
                count: sms - comm_sms,
            };
            return Ok((
                part(comm, PartitionKind::Emulated, 1, None),
                part(compute, PartitionKind::Emulated, 0, None),
            ));
        };
        match green::split(ctx, self.props().sm_version, sms, comm_sms) {
            Ok((c, r)) => {
                let comm = SmPartition {
                    offset: 0,
                    count: c.sms,
                };
                let compute = SmPartition {
                    offset: c.sms,
                    count: r.sms,
                };
                Ok((
                    part(comm, PartitionKind::GreenContext, 1, Some(c)),
                    part(compute, PartitionKind::GreenContext, 0, Some(r)),
                ))
            }
            Err(e) => {
                let why = format!("no green contexts ({e}); SM ranges are advisory");
                let comm = SmPartition {
                    offset: sms - comm_sms,
                    count: comm_sms,
                };
                let compute = SmPartition {
                    offset: 0,
                    count: sms - comm_sms,
                };
                Ok((
                    part(comm, PartitionKind::Streams(why.clone()), 1, None),
                    part(compute, PartitionKind::Streams(why), 0, None),
                ))
            }
        }
    }
}

const SMID_PTX: &str = r#".version 7.0
.target sm_70
.address_size 64
.visible .entry ptxforge_smid(.param .u64 out)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    setp.ne.u32 %p1, %r1, 0;
    @%p1 bra DONE;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ctaid.y;
    mov.u32 %r4, %nctaid.x;
    mad.lo.u32 %r5, %r3, %r4, %r2;
    mov.u32 %r6, %smid;
    mul.wide.u32 %rd2, %r5, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r6;
DONE:
    ret;
}
"#;

/// Diagnostic: runs a tiny `%smid`-recording kernel with `cfg`'s grid (x*y CTAs), block and SM
/// budget on `stream` and returns the distinct SMs its CTAs ran on, sorted. On a partition's
/// stream this shows the SMs the partition really gets (green contexts), or where the hardware
/// scheduler placed an advisory budget. (The emulator also reports this for every launch in
/// `LaunchStats::sms_used`.)
pub fn sms_used(stream: &Stream, cfg: &LaunchConfig) -> Result<Vec<u32>> {
    let dev = stream.device();
    let m = crate::Module::load_ptx(dev, SMID_PTX)?;
    let f = m.function("ptxforge_smid")?;
    let n = (cfg.grid[0] as usize) * (cfg.grid[1] as usize);
    let mut probe = LaunchConfig::grid3([cfg.grid[0], cfg.grid[1], 1], cfg.block);
    probe.sm_budget = cfg.sm_budget;
    let out = dev.alloc::<u32>(n.max(1))?;
    out.fill(u32::MAX)?;
    stream.launch(&f, &probe, &[crate::Arg::from(&out)])?;
    stream.synchronize()?;
    let mut v: Vec<u32> = out
        .to_vec()?
        .into_iter()
        .filter(|&s| s != u32::MAX)
        .collect();
    v.sort_unstable();
    v.dedup();
    Ok(v)
}
