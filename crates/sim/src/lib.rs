//! `sim`: a first-principles cluster simulator for one training step of an MoE model
//! (DeepSeek-V3-like: MLA attention, DeepSeekMoE with node-limited routing) on many GPUs.
//!
//! The crate owns: configuration and presets ([`config`]), the router sampler ([`routing`]),
//! the per-kernel cost model ([`cost`]), computation/communication overlap inside an op
//! ([`overlap`]), the discrete-event pipeline timeline ([`timeline`]), and the outputs: the
//! [`Report`], the SM-budget sweep, plots ([`plot`]) and Perfetto traces ([`trace`]).
//! Modelling assumptions and calibration sources are in `docs/SIM.md`.

pub mod calibrate;
pub mod comm;
pub mod compute;
pub mod config;
pub mod cost;
pub mod error;
pub mod overlap;
pub mod plot;
pub mod routing;
pub mod serve;
pub mod serve_plot;
pub mod timeline;
pub mod trace;
pub mod traffic;

pub use config::{Config, Precision, ScheduleKind};
pub use error::{Result, SimError};

use cost::{BlockCost, BlockKind, CostModel, Kernel, LayerBreakdown, Memory};
use overlap::OpSchedule;
use routing::FanOut;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::HashMap;
use timeline::{OpCosts, OpTime, Timeline};

/// Per-stage summary (one micro-batch).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageInfo {
    pub stage: usize,
    pub blocks: Vec<String>,
    pub f_ms: f64,
    pub b_ms: f64,
    pub w_ms: f64,
    /// This stage's forward overlapped with its own full backward (F&B), for reference.
    pub fb_ms: f64,
}

/// Everything one simulated step produces.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub model: String,
    pub hardware: String,
    pub gpus: usize,
    pub schedule: String,
    pub comm_sms: usize,
    pub step_time_s: f64,
    pub pipeline_s: f64,
    /// Exposed end-of-step time: ZeRO-1 gradient/parameter sync and optimizer update.
    pub step_end_s: f64,
    pub tokens_per_step: f64,
    pub tokens_per_s_per_gpu: f64,
    /// Model FLOPs utilisation against the training precision's dense peak.
    pub mfu: f64,
    /// The same against the BF16 dense peak.
    pub mfu_bf16_peak: f64,
    pub model_tflop_per_token: f64,
    /// Communication not hidden by computation on the critical rank, whole step.
    pub exposed_comm_s: f64,
    /// Idle time of the critical rank (pipeline bubble).
    pub bubble_s: f64,
    pub critical_rank: usize,
    pub memory: Memory,
    pub fanout: FanOut,
    pub dispatch_bytes_ib_mb: f64,
    pub dispatch_bytes_nvl_mb: f64,
    /// Per-layer breakdown, one entry per block of the model (dense, moe, mtp, head).
    pub layers: Vec<LayerBreakdown>,
    pub stages: Vec<StageInfo>,
}

/// Per-stage kernel chains with cached op schedules; implements [`OpCosts`].
pub struct StageModel {
    pub fwd: Vec<Vec<Kernel>>,
    pub bwd: Vec<Vec<Kernel>>,
    pub wgrad: Vec<Vec<Kernel>>,
    /// Backward with each block's weight gradient right after its input gradient.
    pub full_bwd: Vec<Vec<Kernel>>,
    pub p2p: f64,
    pub slowdown: f64,
    cache: RefCell<HashMap<(u8, usize, usize), OpSchedule>>,
}

impl StageModel {
    fn new(stage_costs: &[Vec<&BlockCost>], p2p: f64, slowdown: f64) -> Self {
        let mut sm = StageModel {
            fwd: vec![],
            bwd: vec![],
            wgrad: vec![],
            full_bwd: vec![],
            p2p,
            slowdown,
            cache: RefCell::new(HashMap::new()),
        };
        for blocks in stage_costs {
            sm.fwd
                .push(blocks.iter().flat_map(|b| b.fwd.iter().cloned()).collect());
            sm.bwd.push(
                blocks
                    .iter()
                    .rev()
                    .flat_map(|b| b.bwd.iter().cloned())
                    .collect(),
            );
            sm.wgrad.push(
                blocks
                    .iter()
                    .rev()
                    .flat_map(|b| b.wgrad.iter().cloned())
                    .collect(),
            );
            sm.full_bwd.push(
                blocks
                    .iter()
                    .rev()
                    .flat_map(|b| b.bwd.iter().chain(b.wgrad.iter()).cloned())
                    .collect(),
            );
        }
        sm
    }

    /// Schedule of an op kind (0 F, 1 B input-only, 2 full B, 3 W, 4 F&B, 5 F&I) for stages (a, b).
    pub fn op_schedule(&self, kind: u8, a: usize, b: usize) -> OpSchedule {
        if let Some(s) = self.cache.borrow().get(&(kind, a, b)) {
            return s.clone();
        }
        let s = match kind {
            0 => overlap::schedule(&[&self.fwd[a]], self.slowdown),
            1 => overlap::schedule(&[&self.bwd[a]], self.slowdown),
            2 => overlap::schedule(&[&self.full_bwd[a]], self.slowdown),
            3 => overlap::schedule(&[&self.wgrad[a]], self.slowdown),
            4 => overlap::schedule(&[&self.fwd[a], &self.full_bwd[b]], self.slowdown),
            _ => overlap::schedule(&[&self.fwd[a], &self.bwd[b]], self.slowdown),
        };
        self.cache.borrow_mut().insert((kind, a, b), s.clone());
        s
    }

    fn time(&self, kind: u8, a: usize, b: usize) -> OpTime {
        let s = self.op_schedule(kind, a, b);
        let chain_end = |c: usize| {
            s.kernels
                .iter()
                .filter(|k| k.chain == c)
                .map(|k| k.end)
                .fold(0.0, f64::max)
        };
        let (f_end, b_end) = if kind >= 4 {
            (chain_end(0), chain_end(1))
        } else {
            (s.makespan, s.makespan)
        };
        OpTime {
            dur: s.makespan,
            f_end,
            b_end,
            exposed_comm: s.exposed_comm(),
        }
    }
}

impl OpCosts for StageModel {
    fn f(&self, s: usize) -> Result<OpTime> {
        Ok(self.time(0, s, s))
    }
    fn b(&self, s: usize) -> Result<OpTime> {
        Ok(self.time(1, s, s))
    }
    fn bw(&self, s: usize) -> Result<OpTime> {
        Ok(self.time(2, s, s))
    }
    fn w(&self, s: usize) -> Result<OpTime> {
        Ok(self.time(3, s, s))
    }
    fn fb(&self, a: usize, b: usize, full: bool) -> Result<OpTime> {
        Ok(self.time(if full { 4 } else { 5 }, a, b))
    }
    fn p2p(&self) -> f64 {
        self.p2p
    }
}

/// Everything built for one configuration: costs, stage layout, timeline.
pub struct Simulation {
    pub report: Report,
    pub timeline: Timeline,
    pub stages: StageModel,
}

/// Simulate one training step. Validates the configuration first.
pub fn simulate(cfg: &Config) -> Result<Report> {
    Ok(run(cfg)?.report)
}

/// Like [`simulate`] but keeps the timeline and stage model (for traces).
pub fn run(cfg: &Config) -> Result<Simulation> {
    cfg.validate()?;
    let cm = CostModel::new(cfg);
    run_with(cfg, &cm)
}

/// Simulate with a given cost model (e.g. a fan-out from supplied gate scores).
pub fn run_with(cfg: &Config, cm: &CostModel) -> Result<Simulation> {
    let p = &cfg.parallelism;
    let kinds = cm.blocks();
    let blocks: Vec<BlockCost> = kinds
        .iter()
        .enumerate()
        .map(|(i, &k)| cm.block(k, i))
        .collect::<Result<_>>()?;
    let sched = timeline::generate(cfg.schedule, p.pp, cfg.training.micro_batches)?;
    let stage_blocks = place_blocks(&kinds, &blocks, sched.num_stages())?;
    let stage_costs: Vec<Vec<&BlockCost>> = stage_blocks
        .iter()
        .map(|v| v.iter().map(|&i| &blocks[i]).collect())
        .collect();
    let sm = StageModel::new(
        &stage_costs,
        cm.p2p_time(),
        cfg.calibration.overlap_slowdown,
    );
    let tl = timeline::simulate(&sched, &sm)?;
    let ranks_stages: Vec<Vec<usize>> = (0..p.pp)
        .map(|r| {
            let mut v: Vec<usize> = (0..sched.dirs_per_rank())
                .filter_map(|d| sched.locate(r, d).map(|x| x.1))
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        })
        .collect();
    let stage_kinds: Vec<Vec<BlockKind>> = stage_blocks
        .iter()
        .map(|v| v.iter().map(|&i| kinds[i]).collect())
        .collect();
    let memory = cm.memory(&stage_kinds, &ranks_stages);
    let step_end = cm.step_end_time(&stage_kinds, &ranks_stages);
    let step = tl.makespan + step_end;
    if !step.is_finite() || step <= 0.0 {
        return Err(SimError::CannotComplete(format!(
            "step time is {step} s: the configuration gives no finite positive step"
        )));
    }
    let stages = stage_infos(&stage_blocks, &kinds, &sm);
    let parts = Parts {
        blocks: &blocks,
        tl: &tl,
        step_end,
        memory,
        stages,
    };
    Ok(Simulation {
        report: report(cfg, cm, parts),
        timeline: tl,
        stages: sm,
    })
}

/// Blocks per pipeline stage, balanced on one micro-batch's compute + communication time.
/// Heads must follow the last transformer block: they are merged into the final block's
/// weight for the partition and always land on the last stage.
fn place_blocks(
    kinds: &[BlockKind],
    blocks: &[BlockCost],
    n_stages: usize,
) -> Result<Vec<Vec<usize>>> {
    let weights: Vec<f64> = blocks.iter().map(|b| b.compute_time()).collect();
    let n_heads = kinds.iter().filter(|&&k| k == BlockKind::Head).count();
    let core = kinds.len() - n_heads;
    let mut w_core: Vec<f64> = weights[..core].to_vec();
    if let Some(last) = w_core.last_mut() {
        *last += weights[core..].iter().sum::<f64>();
    }
    let sizes = cost::partition(&w_core, n_stages);
    if sizes.len() != n_stages || sizes.contains(&0) {
        return Err(SimError::config(
            "parallelism.pp",
            format!("cannot give each of {n_stages} stages at least one block"),
        ));
    }
    let mut stage_blocks = Vec::with_capacity(n_stages);
    let mut at = 0;
    for (s, &n) in sizes.iter().enumerate() {
        let mut v: Vec<usize> = (at..at + n).collect();
        at += n;
        if s == n_stages - 1 {
            v.extend(core..kinds.len());
        }
        stage_blocks.push(v);
    }
    Ok(stage_blocks)
}

/// Each stage's blocks and op times, for the report.
fn stage_infos(
    stage_blocks: &[Vec<usize>],
    kinds: &[BlockKind],
    sm: &StageModel,
) -> Vec<StageInfo> {
    stage_blocks
        .iter()
        .enumerate()
        .map(|(s, v)| StageInfo {
            stage: s,
            blocks: v
                .iter()
                .map(|&i| format!("{:?}", kinds[i]).to_lowercase())
                .collect(),
            f_ms: sm.time(0, s, s).dur * 1e3,
            b_ms: sm.time(1, s, s).dur * 1e3,
            w_ms: sm.time(3, s, s).dur * 1e3,
            fb_ms: sm.time(4, s, s).dur * 1e3,
        })
        .collect()
}

/// What [`report`] summarises besides the configuration and cost model.
struct Parts<'a> {
    blocks: &'a [BlockCost],
    tl: &'a timeline::Timeline,
    step_end: f64,
    memory: Memory,
    stages: Vec<StageInfo>,
}

/// The step's throughput, MFU, exposed communication and traffic figures.
fn report(cfg: &Config, cm: &CostModel, x: Parts) -> Report {
    let p = &cfg.parallelism;
    let step = x.tl.makespan + x.step_end;
    let gpus = cfg.gpus();
    let tokens_step =
        cfg.training.micro_batch_tokens as f64 * cfg.training.micro_batches as f64 * p.dp as f64;
    let tps = tokens_step / step / gpus as f64;
    let flops = cm.model_flops_per_token();
    let peak = match cfg.training.precision {
        Precision::Fp8 => cfg.hardware.tflops_fp8,
        Precision::Bf16 => cfg.hardware.tflops_bf16,
    } * 1e12;
    let crit = x.tl.critical_rank();
    let db = cm.comm_bytes(cfg.training.precision == Precision::Fp8);
    Report {
        model: cfg.model.name.clone(),
        hardware: cfg.hardware.name.clone(),
        gpus,
        schedule: cfg.schedule.to_string(),
        comm_sms: cfg.comm.sms,
        step_time_s: step,
        pipeline_s: x.tl.makespan,
        step_end_s: x.step_end,
        tokens_per_step: tokens_step,
        tokens_per_s_per_gpu: tps,
        mfu: flops * tps / peak,
        mfu_bf16_peak: flops * tps / (cfg.hardware.tflops_bf16 * 1e12),
        model_tflop_per_token: flops / 1e12,
        exposed_comm_s: x.tl.exposed_comm[crit],
        bubble_s: x.tl.bubble(),
        critical_rank: crit,
        memory: x.memory,
        fanout: cm.fanout,
        dispatch_bytes_ib_mb: db.ib / 1e6,
        dispatch_bytes_nvl_mb: db.nvl / 1e6,
        layers: x.blocks.iter().map(|b| b.breakdown.clone()).collect(),
        stages: x.stages,
    }
}

/// One point of an SM-budget sweep; `None` values mean the step cannot complete.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepPoint {
    pub comm_sms: usize,
    pub step_time_s: Option<f64>,
    pub exposed_comm_s: Option<f64>,
    pub tokens_per_s_per_gpu: Option<f64>,
    pub error: Option<String>,
}

/// Result of a sweep over the communication SM budget.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sweep {
    pub points: Vec<SweepPoint>,
    /// Budget with the shortest step.
    pub best_sms: Option<usize>,
    /// Smallest budget whose step is within 1% of the best: enough SMs to hide communication.
    pub knee_sms: Option<usize>,
    /// Largest budget below the knee: where the budget stops being enough.
    pub not_enough_below: Option<usize>,
}

/// Parse `comm-sms=LO..HI` (inclusive).
pub fn parse_sweep(spec: &str) -> Result<(usize, usize)> {
    let bad = |rule: &str| SimError::Sweep {
        spec: spec.to_string(),
        rule: rule.to_string(),
    };
    let range = spec
        .strip_prefix("comm-sms=")
        .ok_or_else(|| bad("expected comm-sms=LO..HI"))?;
    let (lo, hi) = range
        .split_once("..")
        .ok_or_else(|| bad("expected LO..HI"))?;
    let hi = hi.trim_start_matches('=');
    let lo: usize = lo.trim().parse().map_err(|_| bad("LO is not a number"))?;
    let hi: usize = hi.trim().parse().map_err(|_| bad("HI is not a number"))?;
    if lo > hi {
        return Err(bad("LO must not exceed HI"));
    }
    Ok((lo, hi))
}

/// Simulate each budget in `lo..=hi`. Budgets that cannot complete are reported, not fatal;
/// budgets that break a configuration rule (e.g. above the SM count) are refused.
pub fn sweep(cfg: &Config, lo: usize, hi: usize) -> Result<Sweep> {
    cfg.validate()?;
    if hi >= cfg.hardware.sms {
        return Err(SimError::config(
            "comm.sms",
            format!(
                "sweep upper bound {hi} must be below the SM count ({})",
                cfg.hardware.sms
            ),
        ));
    }
    // The router fan-out does not depend on the SM budget: sample it once.
    let fan = CostModel::new(cfg).fanout;
    let mut points = Vec::new();
    for sms in lo..=hi {
        let mut c = cfg.clone();
        c.comm.sms = sms;
        let cm = CostModel::with_fanout(&c, fan);
        match run_with(&c, &cm) {
            Ok(s) => points.push(SweepPoint {
                comm_sms: sms,
                step_time_s: Some(s.report.step_time_s),
                exposed_comm_s: Some(s.report.exposed_comm_s),
                tokens_per_s_per_gpu: Some(s.report.tokens_per_s_per_gpu),
                error: None,
            }),
            Err(e @ SimError::CannotComplete(_)) => points.push(SweepPoint {
                comm_sms: sms,
                step_time_s: None,
                exposed_comm_s: None,
                tokens_per_s_per_gpu: None,
                error: Some(e.to_string()),
            }),
            Err(e) => return Err(e),
        }
    }
    let best = points
        .iter()
        .filter_map(|p| p.step_time_s.map(|t| (t, p.comm_sms)))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    let knee = best.and_then(|(bt, _)| {
        points
            .iter()
            .find(|p| p.step_time_s.is_some_and(|t| t <= bt * 1.01))
            .map(|p| p.comm_sms)
    });
    let not_enough = knee.and_then(|k| if k > lo { Some(k - 1) } else { None });
    Ok(Sweep {
        points,
        best_sms: best.map(|b| b.1),
        knee_sms: knee,
        not_enough_below: not_enough,
    })
}

impl Report {
    /// Human-readable summary.
    pub fn text(&self) -> String {
        let mut s = String::new();
        use std::fmt::Write;
        let _ = writeln!(
            s,
            "{} on {} x {} ({}), comm SMs {}",
            self.model, self.gpus, self.hardware, self.schedule, self.comm_sms
        );
        let _ = writeln!(
            s,
            "step time          {:10.3} s  (pipeline {:.3} s + step end {:.3} s)",
            self.step_time_s, self.pipeline_s, self.step_end_s
        );
        let _ = writeln!(s, "tokens/s per GPU   {:10.1}", self.tokens_per_s_per_gpu);
        let _ = writeln!(
            s,
            "MFU                {:10.1} %  ({:.1} % of BF16 peak; {:.3} TFLOP/token)",
            self.mfu * 100.0,
            self.mfu_bf16_peak * 100.0,
            self.model_tflop_per_token
        );
        let _ = writeln!(
            s,
            "exposed comm       {:10.3} s  (critical rank {})",
            self.exposed_comm_s, self.critical_rank
        );
        let _ = writeln!(s, "pipeline bubble    {:10.3} s", self.bubble_s);
        let m = &self.memory;
        let _ = writeln!(
            s,
            "memory per GPU     {:10.1} GB of {:.0} (params {:.1}, grads {:.1}, optimizer {:.1}, activations {:.1}){}",
            m.total_gb, m.capacity_gb, m.params_gb, m.grads_gb, m.optimizer_gb, m.activations_gb,
            if m.fits { "" } else { "  DOES NOT FIT" }
        );
        let _ = writeln!(
            s,
            "fan-out per token  {:.2} IB nodes, {:.2} NVLink copies, {:.2} nodes touched",
            self.fanout.ib_copies, self.fanout.nvl_copies, self.fanout.nodes_touched
        );
        let _ = writeln!(s, "per layer, one micro-batch (ms):");
        let _ = writeln!(s, "  kind   attn  dispatch moe_gemm combine | bwd: combine moe_gemm dispatch attn | wgrad");
        let mut seen: Vec<&str> = Vec::new();
        for l in &self.layers {
            if seen.contains(&l.kind.as_str()) {
                continue;
            }
            seen.push(&l.kind);
            let _ = writeln!(
                s,
                "  {:5} {:6.2} {:8.2} {:8.2} {:7.2} | {:12.2} {:8.2} {:8.2} {:5.2} | {:5.2}",
                l.kind,
                l.attn_ms,
                l.dispatch_ms,
                l.moe_gemm_ms,
                l.combine_ms,
                l.bwd_combine_ms,
                l.bwd_moe_gemm_ms,
                l.bwd_dispatch_ms,
                l.bwd_attn_ms,
                l.wgrad_ms
            );
        }
        s
    }
}

impl Sweep {
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::from("comm_sms  step_s  exposed_comm_s  tokens/s/GPU\n");
        for p in &self.points {
            match (p.step_time_s, p.exposed_comm_s, p.tokens_per_s_per_gpu) {
                (Some(t), Some(e), Some(x)) => {
                    let _ = writeln!(s, "{:8} {:7.3} {:15.3} {:13.1}", p.comm_sms, t, e, x);
                }
                _ => {
                    let _ = writeln!(
                        s,
                        "{:8}  cannot complete (communication cannot progress)",
                        p.comm_sms
                    );
                }
            }
        }
        if let (Some(b), Some(k)) = (self.best_sms, self.knee_sms) {
            let _ = writeln!(
                s,
                "knee: {k} SMs are enough (within 1% of the best step, at {b} SMs)"
            );
        }
        if let Some(n) = self.not_enough_below {
            let _ = writeln!(s, "at {n} SMs and below the budget is not enough");
        }
        s
    }
}

/// A training or a serving configuration.
#[derive(Debug, Clone, PartialEq)]
pub enum AnyConfig {
    Training(Box<Config>),
    Serving(Box<serve::ServeConfig>),
}

/// Load a preset (`v3`, `h200-node`, `v3-serve`) or a TOML/JSON file; a file with a
/// `workload` table is a serving configuration.
pub fn load_any(preset_or_path: &str) -> Result<AnyConfig> {
    if let Ok(c) = serve::ServeConfig::preset(preset_or_path) {
        return Ok(AnyConfig::Serving(Box::new(c)));
    }
    if let Ok(c) = Config::preset(preset_or_path) {
        return Ok(AnyConfig::Training(Box::new(c)));
    }
    if !is_file_name(preset_or_path) {
        return Err(SimError::UnknownPreset(preset_or_path.to_string()));
    }
    let text = read_config_file(preset_or_path)?;
    let serving = if preset_or_path.ends_with(".json") {
        serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .is_some_and(|v| v.get("workload").is_some())
    } else {
        toml::from_str::<toml::Value>(&text)
            .ok()
            .is_some_and(|v| v.get("workload").is_some())
    };
    if serving {
        serve::ServeConfig::from_str_named(&text, preset_or_path)
            .map(|c| AnyConfig::Serving(Box::new(c)))
    } else {
        Config::from_str_named(&text, preset_or_path).map(|c| AnyConfig::Training(Box::new(c)))
    }
}

/// Whether a `--config` value names a file rather than a preset: it exists, contains a path
/// separator or ends in `.toml`/`.json` (a missing one is then "not found", not "unknown preset").
pub(crate) fn is_file_name(preset_or_path: &str) -> bool {
    let path = std::path::Path::new(preset_or_path);
    path.exists()
        || preset_or_path.contains(std::path::MAIN_SEPARATOR)
        || path.extension().is_some_and(|e| e == "toml" || e == "json")
}

/// Reads a configuration or profile file: a missing file is [`SimError::FileNotFound`], any
/// other failure (permissions, invalid UTF-8, located by line) a [`SimError::Parse`] naming
/// the file.
pub fn read_config_file(path: &str) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => SimError::FileNotFound(path.to_string()),
        _ => SimError::Parse {
            source_name: path.into(),
            message: e.to_string(),
        },
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = 1 + e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count();
        SimError::Parse {
            source_name: path.into(),
            message: format!(
                "line {line}: invalid UTF-8 (byte 0x{:02x})",
                e.as_bytes()[at]
            ),
        }
    })
}
