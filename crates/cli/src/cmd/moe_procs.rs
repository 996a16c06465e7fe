//! `ptxforge moe` as one rank of a multi-process job, under any launcher: `ptxforge launch
//! --nodes N --procs-per-node P -- ptxforge moe ...`, torchrun, or `mpirun` (see
//! [`super::procs`] for the join and the engine: MPI under `mpirun` with the `mpi` feature,
//! TCP otherwise). With one process per node each hosts its node's emulated devices
//! (`MoeLayer::hosting`); with one process per rank each hosts one device and maps its node
//! peers' buffers through IPC (emulated memory in shared segments, each process in the address
//! slot of its group rank). Other nodes' ranks are reached through `ep::ProxyTransport` over
//! the job's engine, one proxy endpoint per process. Every process draws the whole step from
//! the seed (as the single-process run does) and feeds its ranks' inputs.
//!
//! On CUDA devices (`--device cuda`) rank r runs on `cuda:(r mod device count)` and a node's
//! processes map each other's buffers through CUDA IPC. One node only: the proxy of the
//! inter-node legs reads and writes device memory from the host while kernels run
//! (`runtime::HostView`), which the CUDA backend does not offer, so `--nodes` > 1 is refused on
//! every rank alike; and not over the NCCL engine ([`join`] says why).
//!
//! After the step the processes all-gather (through the `dist` store) their ranks' gradient
//! partials of the replicated weights and every process folds them in rank order: the
//! data-parallel sums, bit-identical on every process (all-reduce semantics). Process 0 prints
//! every process's per-leg time and bytes, and with `--dump-hash` the hashes of every output
//! and gradient and of every process's sums (equal to the single-process run's). Each phase of
//! the step is announced to the group (`dist::Group::set_op`), so if this rank dies the others'
//! watchdogs name it and the phase. The f64 reference check is not run here: it needs every
//! rank's intermediates in one place; compare the hashes with a checked single-process run.
use super::fault::{self, DieIn};
use super::moe::{Args, Bars};
use super::moe_hash::{hashes, DpSums, OutHash, Partials};
use super::procs::{EngineKind, JoinCfg, Procs};
use anyhow::{bail, Context};
use ep::{EpConfig, ProxyTransport};
use model::moe::{random_step, MoeConfig, MoeLayer, Progress, ProgressPhase};
use rand::SeedableRng;
use runtime::Device;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What every rank must agree on: checked at bootstrap, a difference is reported naming the
/// field (e.g. `config[1].hidden`).
#[derive(Serialize)]
pub struct Agreed<'a> {
    nodes: u32,
    gpus_per_node: u32,
    procs_per_node: Option<u32>,
    hidden: u32,
    experts: u32,
    intermediate: u32,
    tokens: u32,
    topk: u32,
    groups: u32,
    topk_groups: u32,
    route_scaling: f32,
    shared: bool,
    num_sms: u32,
    sequential: bool,
    seed: u64,
    payload: &'a str,
    gemm: &'a str,
    comm_timeout_s: Option<f64>,
    slot_combine: bool,
    wgrad_chunks: u32,
    device: &'a str,
    trace: bool,
}

impl<'a> Agreed<'a> {
    pub fn of(a: &'a Args, c: &MoeConfig) -> Agreed<'a> {
        Agreed {
            nodes: c.nodes,
            gpus_per_node: c.gpus_per_node,
            procs_per_node: a.procs_per_node,
            hidden: c.hidden,
            experts: c.experts,
            intermediate: c.intermediate,
            tokens: c.tokens,
            topk: c.topk,
            groups: c.groups,
            topk_groups: c.topk_groups,
            route_scaling: c.route_scaling,
            shared: c.shared,
            num_sms: c.num_sms,
            sequential: c.sequential,
            seed: c.seed,
            payload: &a.payload,
            gemm: &a.gemm,
            comm_timeout_s: c.comm_timeout.map(|t| t.as_secs_f64()),
            slot_combine: c.slot_combine,
            wgrad_chunks: c.wgrad_chunks,
            device: &a.device,
            trace: a.trace.is_some(),
        }
    }
}

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
    engine: String,
    seconds: f64,
    legs: Vec<Leg>,
    hashes: Vec<OutHash>,
    /// Hashes of the data-parallel sums as this process folded them (equal on every process).
    dp_sums: Vec<OutHash>,
}

fn leg(name: &str, s: &ep::comm::CommStats) -> Leg {
    Leg {
        leg: name.into(),
        seconds: s.seconds,
        inter_node_bytes: s.inter_node_bytes,
        intra_node_bytes: s.intra_node_bytes,
    }
}

/// The job's engine, shared with [`Procs`] (the proxy takes its engines boxed).
struct SharedEngine(Arc<dyn ep::Engine>);

impl ep::Engine for SharedEngine {
    fn endpoint(&self) -> u32 {
        self.0.endpoint()
    }
    fn endpoints(&self) -> u32 {
        self.0.endpoints()
    }
    fn send(&self, to: u32, msg: ep::engine::Msg) -> ep::Result<()> {
        self.0.send(to, msg)
    }
    fn poll(&self) -> ep::Result<Option<ep::engine::Msg>> {
        self.0.poll()
    }
    fn name(&self) -> &'static str {
        self.0.name()
    }
}

/// Announces each phase of the step as this rank's operation (`moe: dispatch || shared expert
/// fwd`), then forwards to `inner`.
struct Announce<'a> {
    inner: &'a dyn Progress,
    group: &'a dist::Group,
}

/// The operation a progress phase stands for: a phase that runs beside a communication leg
/// (`shared expert fwd (|| dispatch)`) names the leg first.
fn op_name(phase: &str) -> String {
    match phase.split_once(" (|| ") {
        Some((compute, leg)) => format!("moe: {} || {compute}", leg.trim_end_matches(')')),
        None => format!("moe: {phase}"),
    }
}

impl Progress for Announce<'_> {
    fn phase(&self, name: &str, units: usize) -> Box<dyn ProgressPhase + '_> {
        // an error here is a dead peer: the watchdog (FaultAction::Exit) ends this process
        // with the message naming it, so the phase itself goes on
        let _ = self.group.set_op(&op_name(name));
        self.inner.phase(name, units)
    }
    fn note(&self, name: &str, secs: f64) {
        self.inner.note(name, secs)
    }
}

/// This process's layer step; it hosts `per_proc` consecutive ranks (a node, or one rank).
/// Returns its report (without the sums) and its ranks' gradient partials.
fn step(
    cfg: &MoeConfig,
    device: &str,
    procs: &Procs,
    per_proc: u32,
    progress: &dyn Progress,
) -> anyhow::Result<(ProcReport, Partials)> {
    let t0 = std::time::Instant::now();
    let me = procs.rank() as u32;
    let hosted: Vec<u32> = (me * per_proc..(me + 1) * per_proc).collect();
    let mut all: Vec<Option<Device>> = vec![None; cfg.ranks()];
    for (&r, d) in hosted.iter().zip(hosted_devices(device, &hosted)?) {
        all[r as usize] = Some(d);
    }
    let devices: Vec<Device> = all.iter().flatten().cloned().collect();
    model::moe::check_devices(cfg, &devices).context("--num-sms")?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
    let (weights, data) = random_step(cfg, &mut rng);
    let timeout = cfg.comm_timeout.unwrap_or(EpConfig::default_timeout());
    let engines: Vec<Box<dyn ep::Engine>> = vec![Box::new(SharedEngine(procs.engine.clone()))];
    let tr = ProxyTransport::new(all, cfg.gpus_per_node, engines, timeout)?;
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
    let rep = ProcReport {
        process: me,
        ranks: hosted.clone(),
        engine: procs.engine.name().to_string(),
        seconds: t0.elapsed().as_secs_f64(),
        legs: vec![
            leg("dispatch", &fs.dispatch),
            leg("combine", &fs.combine),
            leg("cached dispatch of dY", &bs.dispatch_dy),
            topk,
            leg("combine of dX", &bs.combine_dx),
        ],
        hashes: hashes(&hosted, &f, &b),
        dp_sums: Vec::new(),
    };
    Ok((rep, Partials::of(&b)))
}

/// Ranks per process: a node's (one process per node) or one (one process per rank);
/// `--procs-per-node`, when given, must agree with the process count. Every rank computes the
/// same answer (the inputs are agreed at bootstrap).
fn layout(a: &Args, cfg: &MoeConfig, p: &dist::Group) -> anyhow::Result<u32> {
    if !matches!(a.device.as_str(), "emu" | "cuda") {
        bail!("unknown --device `{}` (emu, cuda)", a.device);
    }
    if a.trace.is_some() {
        bail!("--trace: not supported by the multi-process moe yet");
    }
    if a.device == "cuda" && cfg.nodes > 1 {
        // ep::ProxyTransport's proxy threads read and write the send windows and rings while
        // kernels run (runtime::HostView), which only emulated memory offers
        bail!(
            "--device cuda --nodes {}: the multi-process moe runs one node on CUDA devices; \
             the inter-node proxy needs host views of device memory, which the CUDA backend \
             does not have yet (docs/SCALE.md, \"On GPUs\")",
            cfg.nodes
        );
    }
    let (procs, gpn) = (p.world_size() as u32, cfg.gpus_per_node);
    let ranks = cfg.nodes * gpn;
    let per_node = match procs {
        p if p == cfg.nodes => 1,
        p if p == ranks => gpn,
        p => bail!(
            "--nodes {} --gpus-per-node {gpn}: start one process per node ({} in all) or per \
             rank ({ranks}), not {p}",
            cfg.nodes,
            cfg.nodes
        ),
    };
    if let Some(want) = a.procs_per_node.filter(|&w| w != per_node) {
        bail!(
            "--procs-per-node {want}: the job has {per_node} process(es) per node ({procs} in all)"
        );
    }
    // a node's processes map each other's memory: the launcher must keep them on one machine
    let local = p.local_world_size();
    if per_node > 1 && !local.is_multiple_of(per_node as usize) {
        bail!(
            "LOCAL_WORLD_SIZE {}: not a multiple of the {per_node} processes of a node (they \
             share memory, so each node's processes must run on one machine)",
            local
        );
    }
    Ok(gpn / per_node)
}

/// The devices of the ranks `hosted`: on the emulator those the single-process run gives
/// them; on CUDA rank r runs on `cuda:(r mod device count)`. That is LOCAL_RANK (the
/// torchrun/DeepEP convention) where each machine runs one process per GPU, and keeps the
/// "nodes" of `ptxforge launch`, which all run on this machine, on distinct GPUs while there are
/// enough (NCCL refuses two ranks on one GPU).
fn hosted_devices(device: &str, hosted: &[u32]) -> anyhow::Result<Vec<Device>> {
    if device != "cuda" {
        return Ok(hosted.iter().map(|&r| Device::emu(1000 + r)).collect());
    }
    let count = Device::cuda_count();
    if count == 0 {
        // the driver's own error says why (no libcuda, no device)
        Device::cuda(0).context("--device cuda")?;
    }
    if hosted.len() > count as usize {
        bail!(
            "--device cuda: this process hosts {} ranks but sees {count} CUDA device(s)",
            hosted.len()
        );
    }
    hosted
        .iter()
        .map(|&r| Device::cuda(r % count).with_context(|| format!("--device cuda (rank {r})")))
        .collect()
}

/// Joins the job when a launcher started this process (`None`: a single-process run).
/// `--engine nccl` is refused: `netnccl::NcclEngine` runs its rounds on the device's legacy
/// stream after waiting for all of the device's queued work, so a round waits for a dispatch
/// kernel that itself waits for a peer whose host waits for that round (a deadlock seen on the
/// fake driver, and what a real GPU's legacy stream would do too).
pub fn join(a: &Args, cfg: &MoeConfig) -> anyhow::Result<Option<Procs>> {
    if a.engine == Some(EngineKind::Nccl) {
        bail!(
            "--engine nccl: not for the moe yet: the NCCL engine's rounds wait for all work \
             queued on the device, which deadlocks with dispatch kernels waiting for a peer; \
             use --engine tcp (or mpi)"
        );
    }
    let how = JoinCfg {
        verb: "moe",
        engine: a.engine,
        cuda: None,
    };
    super::procs::join_with(&how, &Agreed::of(a, cfg))
}

/// Raw bytes one rank sends per store round of [`all_gather_large`], for all ranks together:
/// the store's messages are JSON (up to 4 characters per byte) and at most 64 MiB.
const STORE_ROUND_BYTES: usize = 8 << 20;

/// Every rank's `v`, in rank order.
fn all_gather_u64(g: &dist::Group, v: u64) -> anyhow::Result<Vec<u64>> {
    g.all_gather(&v.to_le_bytes())?
        .iter()
        .map(|b| Ok(u64::from_le_bytes(b.as_slice().try_into()?)))
        .collect::<anyhow::Result<Vec<u64>>>()
        .context("a gathered u64")
}

/// Every rank's `bytes`, in rank order, through the store in rounds of at most `round_bytes`
/// from all ranks together (the store's messages have a size limit).
fn all_gather_large(
    g: &dist::Group,
    bytes: &[u8],
    round_bytes: usize,
) -> anyhow::Result<Vec<Vec<u8>>> {
    let chunk = (round_bytes / g.world_size()).max(1);
    let lens: Vec<usize> = all_gather_u64(g, bytes.len() as u64)?
        .into_iter()
        .map(|l| l as usize)
        .collect();
    let rounds = lens.iter().map(|l| l.div_ceil(chunk)).max().unwrap_or(0);
    let mut out: Vec<Vec<u8>> = lens.iter().map(|&l| Vec::with_capacity(l)).collect();
    for i in 0..rounds {
        let lo = (i * chunk).min(bytes.len());
        let hi = ((i + 1) * chunk).min(bytes.len());
        for (o, part) in out.iter_mut().zip(g.all_gather(&bytes[lo..hi])?) {
            o.extend(part);
        }
    }
    if let Some(r) = (0..out.len()).find(|&r| out[r].len() != lens[r]) {
        bail!(
            "rank {r} sent {} bytes, announced {}",
            out[r].len(),
            lens[r]
        );
    }
    Ok(out)
}

/// The data-parallel sums: every process's partials gathered, folded in rank order.
fn dp_sums(g: &dist::Group, mine: &Partials) -> anyhow::Result<DpSums> {
    let mut all = Partials::default();
    let all_bytes = all_gather_large(g, &mine.to_bytes(), STORE_ROUND_BYTES)?;
    for (r, b) in all_bytes.iter().enumerate() {
        all.extend(Partials::from_bytes(b).with_context(|| format!("rank {r}'s partials"))?);
    }
    Ok(DpSums::fold(&all))
}

/// How long a failed step waits for the store to confirm a peer's death as its cause.
const DEATH_GRACE: Duration = Duration::from_secs(1);

/// A failed step's error, led by a peer's death when that caused it: the engine may see the
/// dead peer's connection close a moment before the store does (every store request answers
/// a death it knows of), and the death names the rank and its operation.
fn blame(g: &dist::Group, e: anyhow::Error) -> anyhow::Error {
    let end = Instant::now() + DEATH_GRACE;
    loop {
        match g.get("moe.peer_check") {
            Err(d @ dist::DistError::PeerDied { .. }) => return e.context(d.to_string()),
            Err(_) => return e,
            Ok(_) if Instant::now() >= end => return e,
            Ok(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Runs this process's part of the job (see the module docs).
pub fn run(a: &Args, cfg: MoeConfig, procs: Procs, progress: &Bars) -> anyhow::Result<()> {
    let per_proc = match layout(a, &cfg, &procs.group) {
        Ok(n) => n,
        Err(e) => {
            // every rank fails alike: leave cleanly, so nobody reports a death
            procs.finish()?;
            return Err(e);
        }
    };
    let (g, me) = (&procs.group, procs.rank());
    // a stop from outside (mpirun's SIGTERM, a forwarded Ctrl-C): every process removes the
    // job's segments
    let pids = all_gather_u64(g, std::process::id() as u64).context("the job's pids")?;
    fault::clean_on_termination(g.job_id().to_string(), pids, me)?;
    let die = DieIn::from_env(progress, me)?;
    let announce = Announce {
        inner: &die,
        group: g,
    };
    g.set_op("moe: build layer")?;
    let (mut rep, partials) =
        step(&cfg, &a.device, &procs, per_proc, &announce).map_err(|e| blame(g, e))?;
    g.set_op("moe: data-parallel sums")?;
    rep.dp_sums = dp_sums(g, &partials)?.hashes();
    g.set_op("moe: gather reports")?;
    let all = g.all_gather(&serde_json::to_vec(&rep)?)?;
    procs.finish()?;
    if me != 0 {
        return Ok(());
    }
    let reps: Vec<ProcReport> = all
        .iter()
        .map(|b| serde_json::from_slice(b).context("a process's report"))
        .collect::<anyhow::Result<_>>()?;
    print(a, &reps)
}

/// Process 0's output: every process's legs (table or JSON) and, with `--dump-hash`, every
/// rank's hashes and the sums' (as process 0 folded them; the JSON has every process's).
fn print(a: &Args, reps: &[ProcReport]) -> anyhow::Result<()> {
    let mut hs: Vec<&OutHash> = reps.iter().flat_map(|r| &r.hashes).collect();
    hs.extend(reps.first().map(|r| &r.dp_sums).into_iter().flatten());
    let engine = reps.first().map_or("", |r| r.engine.as_str());
    if a.json {
        let hashes = if a.dump_hash { json!(hs) } else { json!(null) };
        let v = json!({"engine": engine, "processes": reps, "hashes": hashes});
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("engine: {engine}");
    println!("process  ranks     leg                            seconds    inter B    intra B");
    for r in reps {
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
        for h in hs {
            println!("hash {} {} {}", h.rank, h.what, h.fnv64);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{all_gather_large, op_name};
    use dist::{Bootstrap, FaultAction};
    use rand::{Rng, SeedableRng};

    /// Rank `rank` of `world` threads on the store at `port`.
    fn boot(rank: usize, world: usize, port: u16) -> dist::Group {
        let env = dist::testing::local_env(rank, world, port, &format!("moeag{port}")).unwrap();
        Bootstrap::new(env)
            .fault_action(FaultAction::Report)
            .connect()
            .unwrap()
    }

    /// Random lengths (one rank sends nothing) in rounds of a few bytes: every rank gets every
    /// rank's bytes whole, in rank order.
    #[test]
    fn large_all_gather_crosses_in_rounds() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
        let world = 3;
        let data: Vec<Vec<u8>> = (0..world)
            .map(|r| match r {
                1 => Vec::new(),
                _ => (0..rng.gen_range(20..200)).map(|_| rng.gen()).collect(),
            })
            .collect();
        let hs: Vec<_> = (0..world)
            .map(|r| {
                let mine = data[r].clone();
                std::thread::spawn(move || {
                    let g = boot(r, world, port);
                    let got = all_gather_large(&g, &mine, 3 * 7).unwrap();
                    g.finish().unwrap();
                    got
                })
            })
            .collect();
        for h in hs {
            assert_eq!(h.join().unwrap(), data);
        }
    }

    #[test]
    fn phases_name_the_leg_they_run_beside() {
        assert_eq!(
            op_name("shared expert fwd (|| dispatch)"),
            "moe: dispatch || shared expert fwd"
        );
        assert_eq!(
            op_name("gate bwd + routed wgrad (|| combine)"),
            "moe: combine || gate bwd + routed wgrad"
        );
        assert_eq!(op_name("upload weights"), "moe: upload weights");
    }
}
