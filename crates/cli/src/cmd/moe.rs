//! `ptxforge moe`: one MoE layer step (64 routed experts + 1 shared expert by default), forward
//! and backward, across emulated (or CUDA) devices: a thin client of `model::moe` (the layer,
//! its phases and its f64 reference check live there; see its module docs for the data flow).
//! This file parses the flags into a [`MoeConfig`], runs forward, backward and the check, and
//! prints the per-phase table, the JSON report and the trace. `--sequential` runs the
//! overlapped communication/compute pairs one after the other (compare the wall times).
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use model::moe::{
    check, random_step, Backward, CheckConfig, CheckReport, Forward, GemmKind, MoeConfig, MoeLayer,
    Placement, Progress, ProgressPhase, TraceSpan,
};
use rand::SeedableRng;
use runtime::Device;
use serde_json::{json, Value};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// `emu` (emulated devices) or `cuda`.
    #[arg(long, default_value = "emu")]
    pub device: String,
    /// `default` (2x4 emulated devices, hidden 1024, 64 experts) or `v3`.
    #[arg(long, default_value = "default")]
    pub config: String,
    #[arg(long)]
    pub nodes: Option<u32>,
    #[arg(long)]
    pub gpus_per_node: Option<u32>,
    /// In a multi-process run (`ptxforge launch`, torchrun, `mpirun`): processes per node, 1
    /// (each hosts a node) or `--gpus-per-node` (each hosts one rank); checked against the
    /// job's process count, which decides it when this is not given.
    #[arg(long)]
    pub procs_per_node: Option<u32>,
    /// In a multi-process run: the inter-node engine, `mpi` (needs the `mpi` feature and
    /// `mpirun`) or `tcp` (any launcher); `nccl` is refused by the moe for now (see
    /// docs/SCALE.md, "On GPUs"). Default: `mpi` under `mpirun` when built with it, else `tcp`.
    #[arg(long, value_enum)]
    pub engine: Option<super::procs::EngineKind>,
    #[arg(long)]
    pub hidden: Option<u32>,
    #[arg(long)]
    pub experts: Option<u32>,
    #[arg(long)]
    pub intermediate: Option<u32>,
    #[arg(long)]
    pub tokens: Option<u32>,
    #[arg(long)]
    pub topk: Option<u32>,
    #[arg(long)]
    pub groups: Option<u32>,
    #[arg(long)]
    pub topk_groups: Option<u32>,
    /// Shared experts (0 or 1; same intermediate size as the routed ones, as in V3).
    #[arg(long, default_value_t = 1)]
    pub shared: u32,
    /// SMs for dispatch/combine (even); compute kernels get the rest of the device.
    #[arg(long, default_value_t = 20)]
    pub num_sms: u32,
    /// Run communication and compute one after the other instead of overlapped.
    #[arg(long)]
    pub sequential: bool,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Tokens per rank checked against the f64 reference (all their expert paths, forward
    /// output and dX); 0 = all.
    #[arg(long, default_value_t = 32)]
    pub check_tokens: usize,
    /// Routed experts whose weight gradients are checked in full against the f64 reference.
    #[arg(long, default_value_t = 2)]
    pub check_experts: usize,
    /// Forward dispatch payload: `fp8` (quantised 1x128 on the home rank, as V3) or `bf16`
    /// (quantised 1x128 on the expert side after the dispatch).
    #[arg(long, default_value = "fp8")]
    pub payload: String,
    /// Grouped FP8 GEMM kernel: `mma` (mma.sync, any sm_89+) or `wgmma` (the sm_90a persistent
    /// TMA/wgmma kernel; needs an sm_90a target).
    #[arg(long, default_value = "mma")]
    pub gemm: String,
    /// How long a dispatch/combine wait loop may see no progress from its peer before it fails
    /// with a timeout naming rank, channel and role (e.g. `50ms`, `2s`, `0.5`). On the emulator
    /// this is emulated time (`%globaltimer`, which only advances while some emulated device
    /// makes progress), so a busy or single-core host does not trigger it; on GPUs it is wall
    /// time. Default: the library's (`EpConfig::default_timeout`).
    #[arg(long, value_parser = crate::cmd::parse_duration)]
    pub comm_timeout: Option<std::time::Duration>,
    #[arg(long)]
    pub json: bool,
    /// Print (JSON: include) an FNV-1a hash of every output and gradient of every rank (Y, dX,
    /// routed, shared and gate gradients): what a multi-process run is compared with.
    #[arg(long)]
    pub dump_hash: bool,
    /// Write a Chrome/Perfetto trace (host timestamps of each device's kernels per stream).
    #[arg(long)]
    pub trace: Option<std::path::PathBuf>,
}

/// Progress bars on stderr (one per phase, ticked per rank) and `[moe]` timing notes.
pub(crate) struct Bars;

struct Bar(ProgressBar);

impl ProgressPhase for Bar {
    fn tick(&self) {
        self.0.inc(1);
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

impl Progress for Bars {
    fn phase(&self, name: &str, units: usize) -> Box<dyn ProgressPhase + '_> {
        let pb = ProgressBar::new(units as u64);
        pb.set_style(
            ProgressStyle::with_template(
                "{spinner} {msg:<44} [{bar:20}] {pos}/{len} devices {elapsed}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        pb.set_message(name.to_string());
        pb.enable_steady_tick(std::time::Duration::from_millis(200));
        Box::new(Bar(pb))
    }
    fn note(&self, name: &str, secs: f64) {
        eprintln!("[moe] {name:<52} {secs:>8.2} s");
    }
}

/// The layer configuration from `--config` and the size/execution flags.
fn config(a: &Args) -> anyhow::Result<MoeConfig> {
    let mut c = match a.config.as_str() {
        "default" => MoeConfig::small(),
        "v3" => MoeConfig::v3(),
        o => bail!("unknown --config `{o}` (default, v3)"),
    };
    let set = |v: Option<u32>, f: &mut u32| {
        if let Some(v) = v {
            *f = v;
        }
    };
    set(a.nodes, &mut c.nodes);
    set(a.gpus_per_node, &mut c.gpus_per_node);
    set(a.hidden, &mut c.hidden);
    set(a.experts, &mut c.experts);
    set(a.intermediate, &mut c.intermediate);
    set(a.tokens, &mut c.tokens);
    set(a.topk, &mut c.topk);
    set(a.groups, &mut c.groups);
    set(a.topk_groups, &mut c.topk_groups);
    if a.shared > 1 {
        bail!("--shared is 0 or 1");
    }
    c.shared = a.shared == 1;
    c.num_sms = a.num_sms;
    c.sequential = a.sequential;
    c.seed = a.seed;
    c.comm_timeout = a.comm_timeout;
    c.payload = match a.payload.as_str() {
        "fp8" => ep::Payload::Fp8,
        "bf16" => ep::Payload::Bf16,
        o => bail!("unknown --payload `{o}` (fp8, bf16)"),
    };
    c.gemm = match a.gemm.as_str() {
        "mma" => GemmKind::Mma,
        "wgmma" => GemmKind::Wgmma,
        o => bail!("unknown --gemm `{o}` (mma, wgmma)"),
    };
    c.validate()?;
    c.check_memory()?;
    Ok(c)
}

fn devices(kind: &str, ranks: u32) -> anyhow::Result<Vec<Device>> {
    Ok(match kind {
        "emu" => (0..ranks).map(|i| Device::emu(1000 + i)).collect(),
        "cuda" => (0..ranks)
            .map(Device::cuda)
            .collect::<Result<_, _>>()
            .context("--device cuda")?,
        o => bail!("unknown --device `{o}` (emu, cuda)"),
    })
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if let Some(p) = &a.trace {
        crate::out::preflight("--trace", p)?;
    }
    let cfg = config(&a)?;
    // started by a launcher: one rank of a multi-process job (one process per node or per
    // rank), see `moe_procs`
    if let Some(procs) = super::moe_procs::join(&a, &cfg)? {
        return super::moe_procs::run(&a, cfg, procs, &Bars);
    }
    if let Some(p) = a.procs_per_node {
        bail!("--procs-per-node {p}: only for a multi-process run (`ptxforge launch`, torchrun or mpirun)");
    }
    if let Some(e) = a.engine {
        let e = format!("{e:?}").to_lowercase();
        bail!("--engine {e}: only for a multi-process run (`ptxforge launch`, torchrun or mpirun)");
    }
    let devices = devices(&a.device, cfg.ranks() as u32)?;
    // before the inputs are made: a bad --num-sms fails at once
    model::moe::check_devices(&cfg, &devices).context("--num-sms")?;
    let t_all = Instant::now();
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
    let t0 = Instant::now();
    let (weights, data) = random_step(&cfg, &mut rng);
    let mut layer =
        MoeLayer::new(cfg.clone(), devices, weights, &Bars).context("building the MoE layer")?;
    Bars.note(
        "inputs + weight quantisation (host)",
        t0.elapsed().as_secs_f64(),
    );
    let f = layer.forward(&data.x, &Bars)?;
    let b = layer.backward(&f, &data.dy, &Bars)?;
    let placement = layer.placement(&f.stats, &b.stats);
    let cc = CheckConfig {
        tokens: a.check_tokens,
        experts: a.check_experts,
    };
    let rep = check(&layer, &data, &f, &b, &cc, &mut rng, &Bars)?;
    Bars.note("f64 reference (sampled)", rep.seconds);
    let out = Outcome {
        a: &a,
        cfg: &cfg,
        compute_sms: layer.compute_sms(),
        f: &f,
        b: &b,
        rep: &rep,
        placement: &placement,
    };
    let mut report = out.report(t_all);
    let all: Vec<u32> = (0..cfg.ranks() as u32).collect();
    let mut hashes = super::moe_hash::hashes(&all, &f, &b);
    let parts = super::moe_hash::Partials::of(&b);
    hashes.extend(super::moe_hash::DpSums::fold(&parts).hashes());
    if a.dump_hash {
        report["hashes"] = serde_json::to_value(&hashes)?;
    }
    if let Some(p) = &a.trace {
        write_trace(p, t_all, &layer.take_trace())?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        out.print(&report, t_all);
        if a.dump_hash {
            hashes
                .iter()
                .for_each(|h| println!("hash {} {} {}", h.rank, h.what, h.fnv64));
        }
    }
    let ok = rep.ok(cfg.shared) && placement.ok;
    if !ok {
        let (r1, r2) = (rep.dw_gate_up.fro(), rep.dw_down.fro());
        let (rs1, rs2) = (rep.shared_dw_gate_up.fro(), rep.shared_dw_down.fro());
        bail!("MoE step failed its checks (Y {:.3e}, dX {:.3e}, dW {r1:.3e}/{r2:.3e}, shared dW {rs1:.3e}/{rs2:.3e}, \
               logits {:.1e}, dlogits {:.3e}, dW_gate {:.1e}, SM partitions disjoint {})",
              rep.y.rel(), rep.dx.rel(), rep.logits.rel(), rep.dlogits.rel(), rep.dw_gate.fro(), placement.disjoint);
    }
    Ok(())
}

/// Chrome/Perfetto trace of the layer's spans (microseconds since `t0`), written atomically.
fn write_trace(p: &std::path::Path, t0: Instant, spans: &[TraceSpan]) -> anyhow::Result<()> {
    Ok(model::trace::Trace::from_spans(t0, spans).write(p)?)
}

/// Everything the report is made of.
struct Outcome<'a> {
    a: &'a Args,
    cfg: &'a MoeConfig,
    compute_sms: u32,
    f: &'a Forward,
    b: &'a Backward,
    rep: &'a CheckReport,
    placement: &'a Placement,
}

impl Outcome<'_> {
    /// The forward's rows of the phase table.
    fn forward_rows(&self) -> Vec<Value> {
        let (fs, rep, compute_sms) = (&self.f.stats, self.rep, self.compute_sms);
        let rb8 = fs.record_bytes;
        let (node_copies, expert_copies) = (
            rep.inter_node_records,
            rep.inter_node_records_without_node_limit,
        );
        let d = &fs.dispatch;
        vec![
            json!({"phase": "gate gemm (bf16) + route + quantise 1x128", "seconds": fs.route_seconds, "intra_bytes": 0, "inter_bytes": 0,
                "max_err": 0.0, "check": "routing idx (on the device logits) and FP8 bytes/scales bit-exact vs CPU", "ok": rep.quant_ok, "comm_sms": 0, "compute_sms": compute_sms}),
            json!({"phase": format!("dispatch ({})", self.a.payload), "seconds": fs.dispatch_span.secs(), "intra_bytes": d.intra_node_bytes, "inter_bytes": d.inter_node_bytes,
                "fp8_saved_bytes": fs.fp8_saved_bytes, "max_err": 0.0, "comm_sms": d.max_sms_per_rank, "compute_sms": 0, "ok": rep.inter_ok,
                "check": format!("inter-node bytes = {node_copies} (token, node) records x {rb8} B = {}; \
                    one record per (token, expert) would be {expert_copies} records ({} B)", node_copies * rb8, expert_copies * rb8),
                "inter_node_records": node_copies, "inter_node_records_without_node_limit": expert_copies}),
            json!({"phase": "  || shared expert fwd (gemm, swiglu+quant, gemm)", "seconds": fs.shared_span.secs(), "intra_bytes": 0, "inter_bytes": 0,
                "max_err": 0.0, "comm_sms": 0, "compute_sms": compute_sms}),
            json!({"phase": "routed experts fwd (grouped fp8 gemm, swiglu+quant, gemm)", "seconds": fs.routed_seconds, "intra_bytes": 0, "inter_bytes": 0,
                "max_err": 0.0, "comm_sms": 0, "compute_sms": compute_sms, "rows_per_rank": fs.rows_per_rank}),
        ]
    }

    /// The checked rows: gate logits, combine (Y), and the backward's phases.
    fn backward_rows(&self) -> Vec<Value> {
        let (fs, bs, rep, compute_sms) = (&self.f.stats, &self.b.stats, self.rep, self.compute_sms);
        let (tol, ntok) = (rep.tol, rep.sampled_tokens());
        let (c, bd, bc) = (&fs.combine, &bs.dispatch_dy, &bs.combine_dx);
        let (es1, es2, e1, e2) = (
            rep.shared_dw_gate_up,
            rep.shared_dw_down,
            rep.dw_gate_up,
            rep.dw_down,
        );
        let (rs1, rs2, r1, r2) = (es1.fro(), es2.fro(), e1.fro(), e2.fro());
        let mut rows = vec![
            json!({"phase": "gate logits (bf16 gemm, f32 out)", "seconds": 0.0, "intra_bytes": 0, "inter_bytes": 0,
                "max_err": rep.logits.max_err, "max_rel_err": rep.logits.rel(), "tolerance": tol.logits, "ok": rep.ok_logits(),
                "check": format!("logits of {ntok} sampled tokens vs f64"), "comm_sms": 0, "compute_sms": compute_sms}),
            json!({"phase": "combine (bf16, weighted) + shared", "seconds": c.seconds, "intra_bytes": c.intra_node_bytes, "inter_bytes": c.inter_node_bytes,
                "max_err": rep.y.max_err, "max_rel_err": rep.y.rel(), "tolerance": tol.y, "ok": rep.ok_y(),
                "check": format!("output Y vs f64 reference, {ntok} sampled tokens (all routed paths + shared)"),
                "comm_sms": c.max_sms_per_rank, "compute_sms": 0}),
            json!({"phase": "bwd: combine^T = dispatch (bf16, cached)", "seconds": bs.dispatch_dy_span.secs(), "intra_bytes": bd.intra_node_bytes, "inter_bytes": bd.inter_node_bytes,
                "max_err": 0.0, "comm_sms": bd.max_sms_per_rank, "compute_sms": 0}),
        ];
        if self.cfg.shared {
            rows.push(json!({"phase": "  || shared expert dgrad + wgrad", "seconds": bs.shared_span.secs(), "intra_bytes": 0, "inter_bytes": 0,
                "max_err": es1.max_err.max(es2.max_err), "max_rel_err": rs1.max(rs2), "max_abs_over_max_ref": es1.rel().max(es2.rel()), "tolerance": tol.dw, "ok": rep.ok_shared_dw(),
                "check": format!("shared dW_gate/up, dW_down partial of rank {} (all {} tokens) vs f64", rep.shared_rank, self.cfg.tokens),
                "comm_sms": 0, "compute_sms": compute_sms}));
        }
        rows.extend([
            json!({"phase": "bwd: top-k weight grads <dY, y> put to home", "seconds": bs.topk_span.secs(), "intra_bytes": bs.topk_intra_bytes, "inter_bytes": bs.topk_inter_bytes,
                "max_err": rep.dlogits.max_err, "max_rel_err": rep.dlogits.rel(), "tolerance": tol.dlogits, "ok": rep.ok_dlogits(),
                "check": format!("dlogits (routing backward of the weight grads) of {ntok} sampled tokens vs f64"),
                "comm_sms": self.cfg.num_sms, "compute_sms": 0}),
            json!({"phase": "  || routed dgrad (fp8 gemm x2, swiglu bwd)", "seconds": bs.dgrad_span.secs(), "intra_bytes": 0, "inter_bytes": 0,
                "max_err": 0.0, "comm_sms": 0, "compute_sms": compute_sms}),
            json!({"phase": "bwd: dispatch^T = combine (bf16, weighted) + shared", "seconds": bs.combine_dx_span.secs(), "intra_bytes": bc.intra_node_bytes, "inter_bytes": bc.inter_node_bytes,
                "max_err": rep.dx.max_err, "max_rel_err": rep.dx.rel(), "tolerance": tol.dx, "ok": rep.ok_dx(),
                "check": format!("dX vs f64 reference, {ntok} sampled tokens"),
                "comm_sms": bc.max_sms_per_rank, "compute_sms": 0}),
            json!({"phase": "  || gate bwd: dW_gate (all ranks summed)", "seconds": 0.0, "intra_bytes": 0, "inter_bytes": 0,
                "max_err": rep.dw_gate.max_err, "max_rel_err": rep.dw_gate.fro(), "tolerance": tol.dw_gate, "ok": rep.ok_dw_gate(),
                "check": "dW_gate = sum_r dlogits_r^T X_r (the device's BF16 dlogits) vs f64, every element".to_string(),
                "comm_sms": 0, "compute_sms": compute_sms}),
            json!({"phase": "  || routed wgrad (k-grouped fp8, f32 out)", "seconds": bs.wgrad_span.secs(), "intra_bytes": 0, "inter_bytes": 0,
                "max_err": e1.max_err.max(e2.max_err), "max_rel_err": r1.max(r2), "max_abs_over_max_ref": e1.rel().max(e2.rel()), "tolerance": tol.dw, "ok": rep.ok_routed_dw(),
                "check": format!("dW_gate/up, dW_down of experts {:?} (all rows) vs f64 reference", rep.experts),
                "dw_gate_up_rel_err": r1, "dw_down_rel_err": r2, "comm_sms": 0, "compute_sms": compute_sms}),
        ]);
        rows
    }

    fn overlaps(&self) -> impl Iterator<Item = &model::moe::Overlap> {
        self.f.stats.overlaps.iter().chain(&self.b.stats.overlaps)
    }

    /// The JSON report (also the source of the table).
    fn report(&self, t_all: Instant) -> Value {
        let (rep, p, a) = (self.rep, self.placement, self.a);
        let mut rows = self.forward_rows();
        rows.extend(self.backward_rows());
        let concurrent: f64 = self.overlaps().map(|o| o.comm.overlap(&o.compute)).sum();
        rows.push(json!({"phase": "SM placement (comm vs compute partitions)", "seconds": concurrent, "intra_bytes": 0, "inter_bytes": 0, "max_err": 0.0,
            "ok": p.ok, "check": format!("comm kernels on SMs {:?}..{:?} (<= {} per rank), compute on {:?}..{:?}, disjoint: {}; seconds = comm and compute concurrent",
                p.comm_sms.first(), p.comm_sms.last(), a.num_sms, p.compute_sms.first(), p.compute_sms.last(), p.disjoint),
            "comm_sms": p.comm_max_per_rank, "compute_sms": p.compute_sms.len()}));
        rows.push(json!({"phase": "f64 reference (sampled)", "seconds": rep.seconds, "intra_bytes": 0, "inter_bytes": 0, "max_err": 0.0, "comm_sms": 0, "compute_sms": 0}));
        let ov_json: Vec<Value> = self
            .overlaps()
            .map(|o| json!({"pair": o.pair, "comm_seconds": o.comm.secs(), "compute_seconds": o.compute.secs(), "concurrent_seconds": o.comm.overlap(&o.compute)}))
            .collect();
        let c = self.cfg;
        let tol = rep.tol;
        let sh_norm = self.b.shared_dw_sum().map(|(a, b)| {
            a.iter()
                .chain(&b)
                .map(|v| (*v as f64).powi(2))
                .sum::<f64>()
                .sqrt()
        });
        json!({"ranks": c.ranks(), "nodes": c.nodes, "hidden": c.hidden, "experts": c.experts, "shared_experts": a.shared, "intermediate": c.intermediate, "tokens_per_rank": c.tokens,
            "topk": c.topk, "num_sms": a.num_sms, "compute_sms": self.compute_sms, "sequential": a.sequential, "phases": rows, "overlap": ov_json,
            "sampled_tokens_per_rank": rep.tokens.first().map(|v| v.len()).unwrap_or(0),
            "sampled_experts": rep.experts, "shared_checked_rank": rep.shared_rank, "forward_rel_err": rep.y.rel(), "dx_rel_err": rep.dx.rel(),
            "dw_gate_up_rel_err": rep.dw_gate_up.fro(), "dw_down_rel_err": rep.dw_down.fro(),
            "shared_dw_gate_up_rel_err": rep.shared_dw_gate_up.fro(), "shared_dw_down_rel_err": rep.shared_dw_down.fro(),
            "logits_rel_err": rep.logits.rel(), "dlogits_rel_err": rep.dlogits.rel(), "dw_gate_rel_err": rep.dw_gate.fro(),
            "shared_dw_sum_norm": sh_norm,
            "comm_sms_used": p.comm_sms, "compute_sms_used": p.compute_sms.len(),
            "tolerance": {"y": tol.y, "dx": tol.dx, "dw": tol.dw, "logits": tol.logits, "dlogits": tol.dlogits, "dw_gate": tol.dw_gate},
            "ok": rep.ok(c.shared) && p.ok, "total_seconds": t_all.elapsed().as_secs_f64()})
    }

    /// The human-readable table, overlaps and check summary.
    fn print(&self, report: &Value, t_all: Instant) {
        println!(
            "{:<56} {:>8} {:>11} {:>11} {:>11} {:>5} {:>7} {:>10} {:>5}",
            "phase",
            "time s",
            "intra B",
            "inter B",
            "fp8 saved",
            "comm",
            "compute",
            "rel err",
            "ok"
        );
        for r in report["phases"].as_array().into_iter().flatten() {
            println!(
                "{:<56} {:>8.2} {:>11} {:>11} {:>11.0} {:>5} {:>7} {:>10.3e} {:>5}",
                r["phase"].as_str().unwrap_or(""),
                r["seconds"].as_f64().unwrap_or(0.0),
                r["intra_bytes"].as_u64().unwrap_or(0),
                r["inter_bytes"].as_u64().unwrap_or(0),
                r["fp8_saved_bytes"].as_f64().unwrap_or(0.0),
                r["comm_sms"].as_u64().unwrap_or(0),
                r["compute_sms"].as_u64().unwrap_or(0),
                r["max_rel_err"].as_f64().unwrap_or(0.0),
                r["ok"]
                    .as_bool()
                    .map(|b| if b { "yes" } else { "NO" })
                    .unwrap_or("")
            );
        }
        for o in self.overlaps() {
            println!(
                "overlap {:<44} comm {:>7.2} s, compute {:>7.2} s, concurrent {:>7.2} s",
                o.pair,
                o.comm.secs(),
                o.compute.secs(),
                o.comm.overlap(&o.compute)
            );
        }
        let (rep, tol) = (self.rep, self.rep.tol);
        println!(
            "checks: Y {:.3e} (max|err|/max|ref|, tol {}), dX {:.3e} (tol {}); ||err||/||ref||: dW_gate/up {:.3e}, dW_down {:.3e}, \
             shared dW {:.3e}/{:.3e} (tol {}); inter-node dispatch {} records (per-expert copies would be {}): {}; gate: logits {:.1e}, dlogits {:.3e}, dW_gate {:.1e}; {} sampled tokens, experts {:?}; SM partitions disjoint: {}; total {:.1} s",
            rep.y.rel(), tol.y, rep.dx.rel(), tol.dx, rep.dw_gate_up.fro(), rep.dw_down.fro(),
            rep.shared_dw_gate_up.fro(), rep.shared_dw_down.fro(), tol.dw,
            rep.inter_node_records, rep.inter_node_records_without_node_limit, rep.inter_ok,
            rep.logits.rel(), rep.dlogits.rel(), rep.dw_gate.fro(), rep.sampled_tokens(), rep.experts,
            self.placement.disjoint, t_all.elapsed().as_secs_f64()
        );
    }
}
