//! The process group of a multi-process verb (`ptxforge moe`, `ptxforge train`): one rank per
//! process, started by `ptxforge launch`, torchrun or `mpirun`. [`join`] reads the launcher's
//! variables (`dist::DistEnv`; `None`: a single-process run), prepares the emulator for peer
//! memory (the rank's address slot, shared segments when a node has several processes, the
//! job id that names them), bootstraps the `dist` group with the verb's configuration (every
//! rank must agree; the watchdog names a rank that dies and the operation it announced) and
//! opens the inter-node engine the verb's `ep::ProxyTransport` or pipeline runs on:
//!
//! - `mpi` (feature `mpi`, the default under `mpirun`): `netmpi::MpiEngine`;
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
    let Some(env) = dist::DistEnv::detect(std::env::vars())? else {
        return Ok(None);
    };
    let under_mpirun = std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some();
    let kind = engine.unwrap_or(match under_mpirun && cfg!(feature = "mpi") {
        true => EngineKind::Mpi,
        false => EngineKind::Tcp,
    });
    if kind == EngineKind::Mpi && !under_mpirun {
        bail!("--engine mpi: start the job with mpirun (this process has no MPI world)");
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
    open_engine(group, kind)
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
    Ok(())
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
