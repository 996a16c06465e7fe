//! `mpirun -np NODES ptxforge moe --nodes NODES ...` (cargo feature `mpi`): one process per
//! node, each hosting only its node's emulated devices (`MoeLayer::hosting`); the other nodes'
//! ranks are reached through `ep::ProxyTransport` over MPI. With `-np NODES*GPUS_PER_NODE`
//! (or `--procs-per-node GPUS_PER_NODE`) one process per rank: each hosts one device, its node
//! peers' buffers are mapped through IPC (emulated memory in shared segments, each process in
//! the address slot of its MPI rank), and each runs its own proxy endpoint. Every process draws the whole step
//! from the seed (as the single-process run does) and feeds its ranks' inputs. Process 0 prints
//! every process's per-leg time and bytes (and with `--dump-hash` the hashes of every output and
//! gradient, equal to the single-process run's). The f64 reference check is not run here: it
//! needs every rank's intermediates in one place; compare the hashes with a checked
//! single-process run instead.
use super::moe::{Args, Bars};
use super::moe_hash::{hashes, sum_hashes, OutHash, Partials};
use anyhow::{bail, Context};
use ep::{EpConfig, ProxyTransport};
use model::moe::{random_step, MoeConfig, MoeLayer, Progress};
use netmpi::Mpi;
use rand::SeedableRng;
use runtime::Device;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Time and bytes of one communication leg on this process's ranks.
#[derive(Debug, Serialize, Deserialize)]
struct Leg {
    leg: String,
    seconds: f64,
    inter_node_bytes: u64,
    intra_node_bytes: u64,
}

/// What one process reports.
#[derive(Debug, Serialize, Deserialize)]
struct ProcReport {
    process: u32,
    ranks: Vec<u32>,
    seconds: f64,
    legs: Vec<Leg>,
    hashes: Vec<OutHash>,
    /// This process's ranks' gradient partials of the replicated weights (gate chunks, shared
    /// expert chunks) as f32 bits (exact through JSON), for the data-parallel sums on process 0.
    partials: Partials<u32>,
}

fn leg(name: &str, s: &ep::comm::CommStats) -> Leg {
    Leg {
        leg: name.into(),
        seconds: s.seconds,
        inter_node_bytes: s.inter_node_bytes,
        intra_node_bytes: s.intra_node_bytes,
    }
}

/// This process's layer step; it hosts `per_proc` consecutive ranks (a node, or one rank).
fn step(
    cfg: &MoeConfig,
    mpi: &Mpi,
    per_proc: u32,
    progress: &dyn Progress,
) -> anyhow::Result<ProcReport> {
    let t0 = std::time::Instant::now();
    let (me, gpn) = (mpi.rank(), cfg.gpus_per_node);
    let hosted: Vec<u32> = (me * per_proc..(me + 1) * per_proc).collect();
    let mut all: Vec<Option<Device>> = vec![None; cfg.ranks()];
    for &r in &hosted {
        // the devices the single-process run gives these ranks
        all[r as usize] = Some(Device::emu(1000 + r));
    }
    let devices: Vec<Device> = all.iter().flatten().cloned().collect();
    model::moe::check_devices(cfg, &devices).context("--num-sms")?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
    let (weights, data) = random_step(cfg, &mut rng);
    let timeout = cfg.comm_timeout.unwrap_or(EpConfig::default_timeout());
    let engines: Vec<Box<dyn ep::Engine>> = vec![Box::new(mpi.engine()?)];
    let tr = ProxyTransport::new(all, gpn, engines, timeout)?;
    let mut layer = MoeLayer::hosting(
        cfg.clone(),
        hosted.clone(),
        devices,
        Box::new(tr),
        weights,
        progress,
    )
    .context("building the MoE layer")?;
    let pick = |v: &[Vec<f32>]| -> Vec<Vec<f32>> {
        hosted.iter().map(|&r| v[r as usize].clone()).collect()
    };
    let f = layer.forward(&pick(&data.x), progress)?;
    let b = layer.backward(&f, &pick(&data.dy), progress)?;
    let (fs, bs) = (&f.stats, &b.stats);
    let topk = Leg {
        leg: "top-k weight grads put home".into(),
        seconds: bs.topk_span.secs(),
        inter_node_bytes: bs.topk_inter_bytes,
        intra_node_bytes: bs.topk_intra_bytes,
    };
    Ok(ProcReport {
        process: me,
        ranks: hosted.clone(),
        seconds: t0.elapsed().as_secs_f64(),
        legs: vec![
            leg("dispatch", &fs.dispatch),
            leg("combine", &fs.combine),
            leg("cached dispatch of dY", &bs.dispatch_dy),
            topk,
            leg("combine of dX", &bs.combine_dx),
        ],
        hashes: hashes(&hosted, &f, &b),
        partials: Partials::of(&b).to_bits(),
    })
}

/// Ranks per process: a node (`-np NODES`) or one (`-np RANKS`); `--procs-per-node`, when
/// given, must agree with the process count.
fn procs_layout(a: &Args, cfg: &MoeConfig, procs: u32) -> anyhow::Result<u32> {
    let ranks = cfg.nodes * cfg.gpus_per_node;
    let per_node = match procs {
        p if p == cfg.nodes => 1,
        p if p == ranks => cfg.gpus_per_node,
        p => bail!(
            "--nodes {} --gpus-per-node {}: start one process per node (mpirun -np {}) or per \
             rank (-np {ranks}), not {p}",
            cfg.nodes,
            cfg.gpus_per_node,
            cfg.nodes
        ),
    };
    if let Some(want) = a.procs_per_node.filter(|&w| w != per_node) {
        bail!("--procs-per-node {want}: mpirun started {per_node} process(es) per node ({procs} in all)");
    }
    Ok(cfg.gpus_per_node / per_node)
}

pub fn run(a: &Args, cfg: MoeConfig, progress: &Bars) -> anyhow::Result<()> {
    if a.device != "emu" {
        bail!(
            "--device {}: the multi-process moe runs on emulated devices",
            a.device
        );
    }
    if a.trace.is_some() {
        bail!("--trace: not supported by the multi-process moe yet");
    }
    let mpi = Mpi::init()?;
    let per_proc = procs_layout(a, &cfg, mpi.size())?;
    // before the first emulator allocation: distinct address slots, and (one process per rank)
    // every allocation a shared segment that node peers map at the same address
    Device::emu_set_address_slot(mpi.rank()).context("the emulator address slot")?;
    if per_proc == 1 && cfg.gpus_per_node > 1 {
        Device::emu_set_shared_default(true);
    }
    // a killed peer makes mpirun SIGTERM the rest: every process then removes the job's segments
    let job = emu::memory::shm::job_id()?;
    let pids = mpi.all_gather_u64(&[std::process::id() as u64]);
    super::mpi_fault::clean_on_termination(job, pids, mpi.rank())?;
    let progress = super::mpi_fault::DieIn::from_env(progress, mpi.rank())?;
    let rep = step(&cfg, &mpi, per_proc, &progress)?;
    let all = mpi.all_gather_bytes(&serde_json::to_vec(&rep)?);
    mpi.barrier();
    if mpi.rank() != 0 {
        return Ok(());
    }
    let mut reps: Vec<ProcReport> = all
        .iter()
        .map(|b| serde_json::from_slice(b).context("a process's report"))
        .collect::<anyhow::Result<_>>()?;
    // the data-parallel sums over every rank, in rank order (processes hold consecutive ranks)
    let (mut gate, mut shared) = (Vec::new(), Vec::new());
    for r in &mut reps {
        let p = std::mem::take(&mut r.partials).to_f32();
        gate.extend(p.gate);
        shared.extend(p.shared);
    }
    let sums = sum_hashes(&gate, &shared);
    if let Some(r0) = reps.first_mut() {
        r0.hashes.extend(sums);
    }
    if a.json {
        let hs: Vec<&OutHash> = reps.iter().flat_map(|r| &r.hashes).collect();
        let v =
            json!({"processes": reps, "hashes": if a.dump_hash { json!(hs) } else { json!(null) }});
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("process  ranks     leg                            seconds    inter B    intra B");
    for r in &reps {
        for l in &r.legs {
            println!(
                "{:>7}  {:<8}  {:<30} {:>7.3} {:>10} {:>10}",
                r.process,
                format!("{:?}", r.ranks),
                l.leg,
                l.seconds,
                l.inter_node_bytes,
                l.intra_node_bytes
            );
        }
    }
    if a.dump_hash {
        for h in reps.iter().flat_map(|r| &r.hashes) {
            println!("hash {} {} {}", h.rank, h.what, h.fnv64);
        }
    }
    Ok(())
}
