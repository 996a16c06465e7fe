//! `ptxforge train`: trains the V3-shaped model of a `--config` (default preset otherwise)
//! with `model::train::Trainer`, and `ptxforge bench train`: a few steps' tokens/s and phase
//! times. A thin layer: it resolves the configuration and every output path before any work
//! (a bad field or an unwritable path fails at once), then prints per step, evaluates every
//! `--eval-every` steps (saving the checkpoint then), and at the end writes the checkpoint,
//! the loss curve and the JSON report.
//!
//! Started by a launcher (`ptxforge launch`, torchrun, `mpirun`) it runs one process per
//! pipeline rank (`WORLD_SIZE == parallel.pp`): [`super::procs::join`] checks that every rank
//! agrees on the configuration and opens the engine, `Trainer::new_rank` runs the rank's two
//! stages, and rank 0 prints and writes every output (the others write nothing).

use super::procs::{self, EngineKind};
use anyhow::{bail, Context, Result};
use model::config::{DeviceKind, TrainConfig};
use model::data::{self, Corpus};
use model::train::{PhaseHook, PipeRank, StepReport, TrainOptions, Trainer};
use serde::Serialize;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(clap::Args, Clone)]
pub struct Args {
    /// Optimizer steps in all (a resumed run continues up to this count).
    #[arg(long)]
    pub steps: Option<u32>,
    /// Job configuration (.toml or .json; missing fields take the default preset).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Training text or `.npy` token ids (default: the built-in corpus).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// `emu` or `cuda` (default: the configuration's `device`).
    #[arg(long)]
    pub device: Option<String>,
    /// Continue from this checkpoint (same model and parallel shape, same data).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Checkpoint written at every evaluation and at the end (atomically).
    #[arg(long, default_value = "train.ckpt")]
    pub save: PathBuf,
    /// Evaluate (and save) every N steps (default: the configuration's `train.eval_every`).
    #[arg(long)]
    pub eval_every: Option<u32>,
    /// Validation batches per evaluation (0: the whole validation split).
    #[arg(long, default_value_t = 8)]
    pub eval_batches: usize,
    /// Loss curve, `.svg` or `.png`.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Perfetto trace of the run's first step.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Run the micro-batches unpipelined (reference order) instead of DualPipeV.
    #[arg(long)]
    pub unpipelined: bool,
    /// Stop after this step, evaluating and saving the checkpoint, as an interruption after a
    /// save would (the learning-rate schedule stays that of `train.steps`; `--resume` goes on).
    #[arg(long)]
    pub stop_after: Option<u32>,
    /// Emit one JSON object at the end instead of the per-step lines.
    #[arg(long)]
    pub json: bool,
    /// Under a launcher (one process per pipeline rank): the engine that carries the stage
    /// boundaries (default: `mpi` under mpirun with the `mpi` feature, else `tcp`).
    #[arg(long, value_enum)]
    pub engine: Option<EngineKind>,
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Job configuration (.toml or .json; default preset otherwise).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Steps timed (after one warm-up step).
    #[arg(long, default_value_t = 3)]
    pub steps: u32,
    /// `emu` or `cuda`.
    #[arg(long)]
    pub device: Option<String>,
    #[arg(long)]
    pub json: bool,
}

/// The configuration with the flags applied, validated (every bad field named).
fn resolve_config(
    path: Option<&Path>,
    steps: Option<u32>,
    eval_every: Option<u32>,
    device: Option<&str>,
) -> Result<TrainConfig> {
    let mut cfg = match path {
        Some(p) => TrainConfig::load(p).with_context(|| format!("--config {}", p.display()))?,
        None => TrainConfig::default(),
    };
    if let Some(s) = steps {
        cfg.train.steps = s;
    }
    if let Some(e) = eval_every {
        cfg.train.eval_every = e;
    }
    cfg.device = match device {
        None => cfg.device,
        Some("emu") => DeviceKind::Emu,
        Some("cuda") => DeviceKind::Cuda,
        Some(o) => bail!("--device: unknown device `{o}` (emu, cuda)"),
    };
    cfg.validate()?;
    Ok(cfg)
}

/// Every output path writable and the resumed checkpoint compatible, before any work.
fn preflight(a: &Args, cfg: &TrainConfig) -> Result<()> {
    model::checkpoint::preflight(&a.save)
        .with_context(|| format!("--save {}", a.save.display()))?;
    if let Some(p) = &a.plot {
        match p.extension().and_then(|e| e.to_str()) {
            Some("svg" | "png") => {}
            _ => bail!("--plot {}: the file must end in .svg or .png", p.display()),
        }
        model::atomic::preflight(p).with_context(|| format!("--plot {}", p.display()))?;
    }
    if let Some(p) = &a.trace {
        model::atomic::preflight(p).with_context(|| format!("--trace {}", p.display()))?;
    }
    if let Some(r) = &a.resume {
        let ck = model::checkpoint::load(r).with_context(|| format!("--resume {}", r.display()))?;
        ck.check_config(cfg)
            .with_context(|| format!("--resume {}", r.display()))?;
    }
    Ok(())
}

fn corpus(data: Option<&Path>, cfg: &TrainConfig) -> Result<Corpus> {
    Ok(match data {
        Some(p) => data::load_file(p, cfg.model.vocab)
            .with_context(|| format!("--data {}", p.display()))?,
        None => data::builtin_corpus(),
    })
}

fn step_line(r: &StepReport) -> String {
    let p = &r.phases;
    // with an MTP module (model.mtp_depth = 1) its loss follows the main one
    let mtp = r
        .mtp_loss
        .map_or(String::new(), |m| format!("  mtp {m:.4}"));
    format!(
        "step {:>4}  loss {:.4}{mtp}  lr {:.2e}  |g| {:.3}  {:>7.0} tok/s  fwd {:.2}s bwd {:.2}s \
         copy {:.2}s opt {:.2}s  F&B overlap {:.0}%  comm/compute {:.3}",
        r.step,
        r.loss,
        r.lr,
        r.grad_norm,
        r.tokens_per_s,
        p.forward,
        p.backward,
        p.transfer,
        p.optimizer,
        100.0 * r.overlap.ratio,
        r.comm_compute
    )
}

fn write_plot(t: &Trainer, path: &Path) -> Result<()> {
    let c = t.loss_curve();
    if path.extension().and_then(|e| e.to_str()) == Some("png") {
        c.write_png(path)?;
    } else {
        c.write_svg(path)?;
    }
    Ok(())
}

/// Steps up to `train.steps`, evaluating and saving every `eval_every` steps and at the end;
/// returns the step reports and the validation losses as JSON.
fn train_loop(
    t: &mut Trainer,
    a: &Args,
    cfg: &TrainConfig,
    lead: bool,
) -> Result<(Vec<Value>, Vec<Value>)> {
    let mut steps: Vec<Value> = Vec::new();
    let mut valid: Vec<Value> = Vec::new();
    let first = t.steps_done();
    let end = a
        .stop_after
        .map_or(cfg.train.steps, |n| n.min(cfg.train.steps)) as u64;
    while t.steps_done() < end {
        let traced = a.trace.is_some() && t.steps_done() == first;
        let r = if traced { t.step_traced()? } else { t.step()? };
        if r.step == first + 1 && lead {
            if let Some(p) = &a.trace {
                t.trace().write(p)?;
            }
        }
        if !a.json && lead {
            println!("{}", step_line(&r));
        }
        steps.push(serde_json::to_value(&r)?);
        let last = t.steps_done() == end;
        if r.step.is_multiple_of(cfg.train.eval_every as u64) || last {
            let v = t.evaluate()?;
            t.save(&a.save)?;
            if !a.json && lead {
                println!(
                    "step {:>4}  validation loss {v:.4}  (saved {})",
                    r.step,
                    a.save.display()
                );
            }
            valid.push(json!({"step": r.step, "loss": v}));
        }
    }
    Ok((steps, valid))
}

/// What every rank of a multi-process run must agree on (checked at bootstrap).
#[derive(Serialize)]
struct Agreed<'a> {
    config: &'a TrainConfig,
    corpus: String,
    eval_batches: usize,
    stop_after: Option<u32>,
    resume: bool,
}

pub fn run(a: Args) -> Result<()> {
    let cfg = resolve_config(
        a.config.as_deref(),
        a.steps,
        a.eval_every,
        a.device.as_deref(),
    )?;
    if !procs::launched()? {
        preflight(&a, &cfg)?;
        let corpus = corpus(a.data.as_deref(), &cfg)?;
        let mut t = Trainer::new(cfg.clone(), &corpus, &*factory(), options(&a))?;
        return train(&mut t, &a, &cfg, &corpus, true);
    }
    run_ranks(&a, &cfg)
}

/// This process's pipeline rank of a launched run (see the module docs).
fn run_ranks(a: &Args, cfg: &TrainConfig) -> Result<()> {
    check_world(a, cfg)?;
    let corpus = corpus(a.data.as_deref(), cfg)?;
    let agreed = Agreed {
        config: cfg,
        corpus: corpus.fingerprint(),
        eval_batches: a.eval_batches,
        stop_after: a.stop_after,
        resume: a.resume.is_some(),
    };
    let p =
        procs::join("train", &agreed, a.engine)?.context("the launcher's variables vanished")?;
    let (rank, lead) = (p.rank(), p.rank() == 0);
    if p.world_size() != cfg.parallel.pp as usize {
        bail!(
            "the process group has {} ranks for parallel.pp = {}",
            p.world_size(),
            cfg.parallel.pp
        );
    }
    if lead {
        preflight(a, cfg)?;
        if !a.json {
            println!(
                "{} processes, one per pipeline rank; engine {:?}",
                p.world_size(),
                p.kind
            );
        }
    }
    // the hook must be 'static, and the process group (MPI inside) cannot be shared with it:
    // a scoped thread announces the operations the hook sends it
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let group = &p.group;
    let r = std::thread::scope(|sc| -> Result<()> {
        sc.spawn(move || {
            for op in rx {
                // a failed announcement (the store gone) is the watchdog's to report
                let _ = group.set_op(&op);
            }
        });
        let me = PipeRank {
            rank,
            engine: p.engine.clone(),
            timeout: p.group.env().peer_timeout,
            on_phase: Some(phase_hook(tx, die_phase(rank)?)),
        };
        // the trainer (and with it the hook's sender) is dropped at the end of this scope
        let mut t = Trainer::new_rank(cfg.clone(), &corpus, &*factory(), options(a), me)
            .with_context(|| format!("pipeline rank {rank}"))?;
        train(&mut t, a, cfg, &corpus, lead).with_context(|| format!("pipeline rank {rank}"))
    });
    if let Err(e) = r {
        return Err(match peer_death(&p.group) {
            Some(death) => e.context(death),
            None => e,
        });
    }
    p.finish()
}

/// After a failure: the death of a peer (naming it and the operation it announced) if the
/// group's watchdog sees one within a few seconds (a lost connection is often seen first by
/// the engine, whose error does not know the operation).
fn peer_death(group: &dist::Group) -> Option<dist::DistError> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while std::time::Instant::now() < until {
        if let Err(e) = group.check() {
            return Some(e);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    None
}

/// Sends each phase to be announced to the group (a death then names it) and, under the test
/// hook, dies in the phase `die` names.
fn phase_hook(tx: std::sync::mpsc::Sender<String>, die: Option<String>) -> Arc<PhaseHook> {
    let tx = std::sync::Mutex::new(tx);
    Arc::new(move |op: &str| {
        if let Ok(tx) = tx.lock() {
            let _ = tx.send(op.to_string());
        }
        if die.as_deref().is_some_and(|d| op.contains(d)) {
            kill_self(op);
        }
    })
}

fn factory() -> Box<model::train::StageFactory> {
    model::train::device_stage_factory()
}

fn options(a: &Args) -> TrainOptions {
    TrainOptions {
        pipelined: !a.unpipelined,
        eval_batches: (a.eval_batches > 0).then_some(a.eval_batches),
        ..TrainOptions::default()
    }
}

/// One process per pipeline rank, and the options that run in one process only refused.
fn check_world(a: &Args, cfg: &TrainConfig) -> Result<()> {
    let env = dist::DistEnv::detect(std::env::vars())?.context("no launcher variables")?;
    let pp = cfg.parallel.pp as usize;
    if env.world_size != pp {
        bail!(
            "WORLD_SIZE {}: `ptxforge train` across processes runs one process per pipeline \
             rank (parallel.pp = {pp})",
            env.world_size
        );
    }
    if a.unpipelined {
        bail!("--unpipelined: the unpipelined reference order runs in one process only");
    }
    Ok(())
}

/// `PTXFORGE_TEST_DIE=RANK:OP` (the fault tests' hook): this rank SIGKILLs itself 20 ms after
/// announcing an operation whose name contains OP.
fn die_phase(rank: usize) -> Result<Option<String>> {
    let Ok(v) = std::env::var("PTXFORGE_TEST_DIE") else {
        return Ok(None);
    };
    let (r, op) = v
        .split_once(':')
        .with_context(|| format!("PTXFORGE_TEST_DIE={v:?}: want RANK:OP"))?;
    let r: usize = r
        .parse()
        .with_context(|| format!("PTXFORGE_TEST_DIE={v:?}: bad rank"))?;
    Ok((r == rank).then(|| op.to_string()))
}

fn kill_self(op: &str) {
    eprintln!("ptxforge: test hook: SIGKILL in 20 ms (operation `{op}`)");
    std::thread::spawn(|| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        // kill(1) rather than libc (an optional dependency): a test hook, Linux only
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &std::process::id().to_string()])
            .status();
    });
}

/// Resumes, trains and reports; `lead`: this process prints and writes the outputs (every
/// collective call is made by every process, in the same order).
fn train(t: &mut Trainer, a: &Args, cfg: &TrainConfig, corpus: &Corpus, lead: bool) -> Result<()> {
    if let Some(r) = &a.resume {
        t.resume(r)
            .with_context(|| format!("--resume {}", r.display()))?;
    }
    let split = t.split();
    let h = t.entropy();
    let cross = data::unigram_cross_entropy(&split.train, &split.valid, corpus.vocab);
    let quiet = a.json || !lead;
    if !quiet {
        println!(
            "{}: {} training / {} validation tokens; unigram entropy {:.4} nats ({:.4} bits), \
             validation under the training unigram {:.4} nats",
            corpus.name,
            split.train.len(),
            split.valid.len(),
            h.nats,
            h.bits,
            cross.nats
        );
    }
    let (steps, valid) = train_loop(t, a, cfg, lead)?;
    if !lead {
        return Ok(());
    }
    if let Some(p) = &a.plot {
        write_plot(t, p)?;
        if !a.json {
            println!("loss curve: {}", p.display());
        }
    }
    let last = valid.last().and_then(|v| v["loss"].as_f64());
    if a.json {
        let out = json!({
            "steps": steps,
            "valid": valid,
            "unigram_entropy_nats": h.nats,
            "unigram_cross_entropy_nats": cross.nats,
            "below_unigram": last.map(|l| l < h.nats.min(cross.nats)),
            "checkpoint": a.save.display().to_string(),
        });
        println!("{out}");
    } else if let Some(l) = last {
        let bar = h.nats.min(cross.nats);
        let verdict = if l < bar { "below" } else { "NOT below" };
        println!(
            "final validation loss {l:.4} nats: {verdict} the unigram bound {bar:.4} \
             (a context-free model's best)"
        );
    }
    print_profile(a.json);
    Ok(())
}

/// With `PTXFORGE_PROFILE=1`: the emulated kernels' launches and host time (to stderr).
fn print_profile(json: bool) {
    let rows = runtime::profile::rows();
    if rows.is_empty() || json {
        return;
    }
    let total: f64 = rows.iter().map(|r| r.seconds).sum();
    eprintln!("kernel host time (PTXFORGE_PROFILE=1; concurrent launches overlap): {total:.2} s");
    for r in rows.iter().take(25) {
        eprintln!(
            "  {:>8.3} s {:>5.1}% {:>7} launches  {}",
            r.seconds,
            100.0 * r.seconds / total.max(1e-12),
            r.launches,
            r.kernel
        );
    }
}

/// `ptxforge bench train`: one warm-up step, then the mean of `steps` timed ones.
pub fn bench(a: BenchArgs) -> Result<()> {
    if a.steps == 0 {
        bail!("--steps: at least one timed step is needed");
    }
    let cfg = resolve_config(
        a.config.as_deref(),
        Some(a.steps + 1),
        None,
        a.device.as_deref(),
    )?;
    let factory = model::train::device_stage_factory();
    let mut t = Trainer::new(
        cfg,
        &data::builtin_corpus(),
        &*factory,
        TrainOptions::default(),
    )?;
    t.step()?;
    let rs = (0..a.steps)
        .map(|_| t.step())
        .collect::<Result<Vec<_>, _>>()?;
    let n = rs.len() as f64;
    let mean = |f: &dyn Fn(&StepReport) -> f64| rs.iter().map(f).sum::<f64>() / n;
    let out = json!({
        "steps": rs.len(),
        "tokens_per_step": rs[0].tokens,
        "tokens_per_s": mean(&|r| r.tokens_per_s),
        "step_seconds": mean(&|r| r.phases.step_wall),
        "forward_seconds": mean(&|r| r.phases.forward),
        "backward_seconds": mean(&|r| r.phases.backward),
        "transfer_seconds": mean(&|r| r.phases.transfer),
        "optimizer_seconds": mean(&|r| r.phases.optimizer),
        "overlap": mean(&|r| r.overlap.ratio),
        "comm_compute": mean(&|r| r.comm_compute),
    });
    if a.json {
        println!("{out}");
    } else {
        for r in &rs {
            println!("{}", step_line(r));
        }
        println!(
            "mean: {:.0} tokens/s, {:.3} s per step",
            out["tokens_per_s"].as_f64().unwrap_or(0.0),
            out["step_seconds"].as_f64().unwrap_or(0.0)
        );
    }
    Ok(())
}
