//! The process group of a multi-process verb (`ptxforge moe`, `ptxforge train`): one rank per
//! process, started by `ptxforge launch`, torchrun or `mpirun`. [`join`] reads the launcher's
//! variables (`dist::DistEnv`; `None`: a single-process run), prepares the emulator for peer
//! memory (the rank's address slot, shared segments when a node has several processes, the
//! job id that names them), bootstraps the `dist` group with the verb's configuration (every
//! rank must agree; the watchdog names a rank that dies and the operation it announced) and
//! opens the inter-node engine the verb's `ep::ProxyTransport` or pipeline runs on:
//!
//! - `mpi` (feature `mpi`, the default under `mpirun`): `netmpi::MpiEngine`;
//! - `nccl` (`--engine nccl`, for a verb on CUDA devices, see [`JoinCfg::cuda`]):
//!   `netnccl::NcclEngine` on a communicator of the process's CUDA device (libnccl is opened at
//!   run time: a machine without it gets `NCCL unavailable`, on every rank alike);
//! - `tcp` (the default otherwise): `ep::MeshEngine`, one TCP connection per pair of ranks,
//!   addresses exchanged through the `dist` store.
//!
//! The engine's endpoint is the group rank.

use anyhow::{bail, Context};
use runtime::Device;
use serde::Serialize;
use std::sync::Arc;

/// Which inter-node engine a multi-process run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineKind {
    /// Open MPI (builds with the `mpi` feature; processes started by `mpirun`).
    Mpi,
    /// One TCP connection per pair of ranks (any launcher).
    Tcp,
    /// NCCL point-to-point between the processes' CUDA devices (libnccl is loaded at run
    /// time); no verb runs on it yet (docs/SCALE.md, "On GPUs").
    Nccl,
}

/// Picks the CUDA device of this process's NCCL communicator, once the group is joined.
pub type CudaPick<'a> = &'a dyn Fn(&dist::Group) -> anyhow::Result<Device>;

/// How a verb joins a multi-process run.
pub struct JoinCfg<'a> {
    /// The verb (`moe`, `train`): part of what every rank must agree on.
    pub verb: &'a str,
    /// `--engine`, when given.
    pub engine: Option<EngineKind>,
    /// Set when the verb can run the NCCL engine: the process's CUDA device for it. `None`:
    /// `--engine nccl` is refused (emulated devices).
    pub cuda: Option<CudaPick<'a>>,
}

/// A joined multi-process run.
pub struct Procs {
    /// Store, config check and watchdog (`set_op` names what this rank is doing).
    pub group: dist::Group,
    /// The inter-node engine; endpoint = `group.rank()`.
    pub engine: Arc<dyn ep::Engine>,
    pub kind: EngineKind,
    /// Keeps MPI initialised while the engine runs.
    #[cfg(feature = "mpi")]
    _mpi: Option<netmpi::Mpi>,
}

impl Procs {
    pub fn rank(&self) -> usize {
        self.group.rank()
    }
    pub fn world_size(&self) -> usize {
        self.group.world_size()
    }
    /// Last barrier and goodbye (the exit is then not a death); the engine is dropped first.
    pub fn finish(self) -> anyhow::Result<()> {
        drop(self.engine);
        self.group.finish().context("leaving the process group")?;
        Ok(())
    }
}

/// Whether a launcher started this process as one rank of several.
pub fn launched() -> anyhow::Result<bool> {
    Ok(dist::DistEnv::detect(std::env::vars())?.is_some())
}

/// Joins the run (see the module docs); `None` when no launcher variable is set. `config` is
/// what every rank must agree on (with `verb` and the ptxforge version); call before the
/// first emulator allocation.
pub fn join<C: Serialize>(
    verb: &str,
    config: &C,
    engine: Option<EngineKind>,
) -> anyhow::Result<Option<Procs>> {
    let how = JoinCfg {
        verb,
        engine,
        cuda: None,
    };
    join_with(&how, config)
}

/// [`join`] with the verb's devices: see [`JoinCfg`].
pub fn join_with<C: Serialize>(how: &JoinCfg, config: &C) -> anyhow::Result<Option<Procs>> {
    let Some(env) = dist::DistEnv::detect(std::env::vars())? else {
        return Ok(None);
    };
    let verb = how.verb;
    let under_mpirun = std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some();
    let kind = how
        .engine
        .unwrap_or(match under_mpirun && cfg!(feature = "mpi") {
            true => EngineKind::Mpi,
            false => EngineKind::Tcp,
        });
    if kind == EngineKind::Mpi && !under_mpirun {
        bail!("--engine mpi: start the job with mpirun (this process has no MPI world)");
    }
    if kind == EngineKind::Nccl && how.cuda.is_none() {
        bail!("--engine nccl: `ptxforge {verb}` does not run on the NCCL engine yet (tcp, mpi)");
    }
    prepare_emulator(&env)?;
    let job = env.job_id.clone();
    let group = dist::Bootstrap::new(env)
        .config(&(verb, config))?
        .on_peer_death(move |_| {
            dist::shm::remove_job_segments(&job);
        })
        .connect()
        .with_context(|| format!("joining the {verb} job"))?;
    match (kind, how.cuda) {
        (EngineKind::Nccl, Some(pick)) => nccl_procs(group, pick),
        _ => open_engine(group, kind),
    }
}

/// The rank's address slot, peer-mappable memory when the node has several processes, and
/// the job id the emulator names its segments with (`mpirun` sets none of these).
fn prepare_emulator(env: &dist::DistEnv) -> anyhow::Result<()> {
    if std::env::var_os("PTXFORGE_JOB_ID").is_none() {
        // process-global: set before the bootstrap starts this process's first threads, and
        // before the emulator reads it for its first shared segment
        std::env::set_var("PTXFORGE_JOB_ID", &env.job_id);
    }
    Device::emu_set_address_slot(env.rank as u32).context("the emulator address slot")?;
    if env.local_world_size > 1 {
        Device::emu_set_shared_default(true);
    }
    // the same for the fake CUDA driver's emulator (`crates/fakecuda`, read when the driver
    // starts), which finds RANK under `ptxforge launch` but nothing under mpirun; a real driver
    // ignores them
    if std::env::var_os("PTXFORGE_EMU_SLOT").is_none() {
        std::env::set_var("PTXFORGE_EMU_SLOT", env.rank.to_string());
    }
    if env.local_world_size > 1 && std::env::var_os("PTXFORGE_EMU_SHM").is_none() {
        std::env::set_var("PTXFORGE_EMU_SHM", "1");
    }
    Ok(())
}

/// The NCCL engine on the device `pick` gives. Every rank first learns whether every rank has
/// its device and a libnccl: if one has not, all leave the group cleanly (no death reported)
/// and fail, each naming the first rank that could not (its own error when it is that rank).
fn nccl_procs(group: dist::Group, pick: CudaPick) -> anyhow::Result<Option<Procs>> {
    let device = pick(&group).and_then(|d| {
        netnccl::version().context("--engine nccl")?;
        Ok(d)
    });
    let failed = group
        .all_gather(if device.is_ok() { b"" } else { b"x" })
        .context("checking every rank's CUDA device and NCCL")?
        .iter()
        .position(|s| !s.is_empty());
    if let Some(r) = failed {
        group.finish().context("leaving the process group")?;
        return Err(device.err().unwrap_or_else(|| {
            anyhow::anyhow!("rank {r} has no usable CUDA device or NCCL (see its error)")
        }));
    }
    let device = device?;
    let comm = netnccl::Comm::bootstrap(&group, &device).context("the NCCL communicator")?;
    let engine = netnccl::NcclEngine::new(comm).context("starting the NCCL engine")?;
    Ok(Some(Procs {
        group,
        engine: Arc::new(engine),
        kind: EngineKind::Nccl,
        #[cfg(feature = "mpi")]
        _mpi: None,
    }))
}

#[cfg(feature = "mpi")]
fn open_engine(group: dist::Group, kind: EngineKind) -> anyhow::Result<Option<Procs>> {
    if kind == EngineKind::Tcp {
        let engine = tcp_engine(&group)?;
        return Ok(Some(Procs {
            group,
            engine,
            kind,
            _mpi: None,
        }));
    }
    let mpi = netmpi::Mpi::init()?;
    if mpi.rank() as usize != group.rank() || mpi.size() as usize != group.world_size() {
        bail!(
            "MPI rank {} of {} is rank {} of {} in the launcher's variables",
            mpi.rank(),
            mpi.size(),
            group.rank(),
            group.world_size()
        );
    }
    let engine: Arc<dyn ep::Engine> = Arc::new(mpi.engine()?);
    Ok(Some(Procs {
        group,
        engine,
        kind,
        _mpi: Some(mpi),
    }))
}

#[cfg(not(feature = "mpi"))]
fn open_engine(group: dist::Group, kind: EngineKind) -> anyhow::Result<Option<Procs>> {
    if kind == EngineKind::Mpi {
        bail!("--engine mpi: this ptxforge was built without the `mpi` feature");
    }
    let engine = tcp_engine(&group)?;
    Ok(Some(Procs {
        group,
        engine,
        kind,
    }))
}

/// The TCP mesh engine over the group's store.
fn tcp_engine(group: &dist::Group) -> anyhow::Result<Arc<dyn ep::Engine>> {
    let engine = ep::MeshEngine::connect(group).context("opening the TCP mesh engine")?;
    Ok(Arc::new(engine))
}
