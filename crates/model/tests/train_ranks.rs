//! The trainer across processes, in one process: `pp` trainers made by `Trainer::new_rank`, one
//! per pipeline rank on its own thread, joined by `ep::InProcessEngine::mesh(pp)` (the same
//! messages a TCP or MPI engine carries between processes), against the single-process
//! `Trainer::new` of the same configuration and a fresh seed: per-step losses (and MTP losses),
//! gradient norms, every parameter after the steps, the validation loss and the checkpoint
//! file's bytes are bit-identical. Then a resume from that checkpoint across ranks continues
//! bit-identically, a rank that fails stops its peers with its error (no hang), a silent peer
//! times out naming itself and the boundary, and a wrong rank count is refused. (PP 4 runs in
//! `crates/cli/tests/train_procs.rs`, as four processes.)

use model::config::{DeviceKind, ModelConfig, ParallelConfig, TrainConfig, TrainingConfig};
use model::data;
use model::params::Params;
use model::stage::{
    Boundary, ExpertLoad, MicroBatch, NamedGrads, Stage, StageOut, StageResult, StageSpec,
};
use model::train::optim::DeviceParams;
use model::train::{device_stage_factory, PipeRank, StepReport, TrainOptions, Trainer};
use model::TrainError;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// PP `pp` x EP `ep`, one layer per stage, MTP optional; small shapes (seconds per step).
fn config(pp: u32, ep: u32, mtp: bool, seed: u64) -> TrainConfig {
    TrainConfig {
        model: ModelConfig {
            layers: 2 * pp,
            mtp_depth: mtp as u32,
            groups: 4,
            topk_groups: 2,
            ..ModelConfig::tiny()
        },
        train: TrainingConfig {
            seq_len: 128,
            micro_batch: ep,
            micro_batches: 2 * pp,
            steps: 3,
            seed,
            ..TrainingConfig::default()
        },
        parallel: ParallelConfig {
            pp,
            ep,
            ep_nodes: 1,
            dp: 1,
            nodes: 1,
            devices_per_node: pp * ep,
            comm_sms: 4,
        },
        device: DeviceKind::Emu,
    }
}

/// A seed no earlier run used (the clock's nanoseconds and the process id).
fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64;
    t ^ ((std::process::id() as u64) << 40)
}

fn options(base: u32) -> TrainOptions {
    TrainOptions {
        emu_base: base,
        eval_batches: Some(1),
        ..TrainOptions::default()
    }
}

/// What a run produced: step reports, validation loss, parameters by index, checkpoint bytes.
struct Run {
    reports: Vec<StepReport>,
    valid: f64,
    params: Vec<(usize, Vec<f32>)>,
    ckpt: Vec<u8>,
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ptxforge-train-ranks-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// `steps` steps, an evaluation and a save to `path` on one trainer (resumed from `resume`).
fn drive(
    t: &mut Trainer,
    steps: usize,
    path: &Path,
    resume: Option<&Path>,
) -> Result<Run, TrainError> {
    if let Some(r) = resume {
        t.resume(r)?;
    }
    let reports = (0..steps)
        .map(|_| t.step())
        .collect::<Result<Vec<_>, _>>()?;
    let valid = t.evaluate()?;
    t.save(path)?;
    Ok(Run {
        reports,
        valid,
        params: t.owned_params()?,
        ckpt: std::fs::read(path).unwrap_or_default(),
    })
}

fn single(cfg: &TrainConfig, base: u32, steps: usize, path: &Path, resume: Option<&Path>) -> Run {
    let mut t = Trainer::new(
        cfg.clone(),
        &data::builtin_corpus(),
        &*device_stage_factory(),
        options(base),
    )
    .expect("trainer");
    drive(&mut t, steps, path, resume).expect("single-process run")
}

/// Every rank's result of `pp` trainers on threads over an in-process mesh; `fail` makes the
/// stage factory of that rank's trainers fail after construction (see `ranked_failure`).
fn ranked(
    cfg: &TrainConfig,
    base: u32,
    steps: usize,
    path: &Path,
    resume: Option<&Path>,
) -> Vec<Result<Run, TrainError>> {
    let pp = cfg.parallel.pp;
    let engines = ep::InProcessEngine::mesh(pp);
    std::thread::scope(|sc| {
        let hs: Vec<_> = engines
            .into_iter()
            .enumerate()
            .map(|(r, e)| {
                let cfg = cfg.clone();
                sc.spawn(move || {
                    let mut rank = PipeRank::new(r, Arc::new(e));
                    rank.timeout = Duration::from_secs(60);
                    let mut t = Trainer::new_rank(
                        cfg,
                        &data::builtin_corpus(),
                        &*device_stage_factory(),
                        options(base),
                        rank,
                    )?;
                    drive(&mut t, steps, path, resume)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The ranks' results against the single run's, bit for bit.
fn assert_same(one: &Run, ranks: Vec<Result<Run, TrainError>>) {
    let mut seen = vec![false; one.params.len()];
    for (r, run) in ranks.into_iter().enumerate() {
        let run = run.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert_eq!(run.reports.len(), one.reports.len());
        for (a, b) in run.reports.iter().zip(&one.reports) {
            assert_eq!(a.step, b.step);
            assert_eq!(
                a.loss.to_bits(),
                b.loss.to_bits(),
                "rank {r} step {}: loss {} vs {}",
                a.step,
                a.loss,
                b.loss
            );
            assert_eq!(
                a.grad_norm.to_bits(),
                b.grad_norm.to_bits(),
                "rank {r} step {}: |g|",
                a.step
            );
            assert_eq!(
                a.mtp_loss.map(f64::to_bits),
                b.mtp_loss.map(f64::to_bits),
                "rank {r}: mtp"
            );
        }
        assert_eq!(
            run.valid.to_bits(),
            one.valid.to_bits(),
            "rank {r}: validation loss"
        );
        for (i, p) in &run.params {
            let (j, q) = &one.params[*i];
            assert_eq!(i, j);
            assert!(!seen[*i], "parameter {i} on two ranks");
            seen[*i] = true;
            assert_eq!(bits(p), bits(q), "rank {r}: parameter {i}");
        }
    }
    assert!(seen.iter().all(|&s| s), "every parameter on some rank");
}

#[test]
fn pp2_ep2_with_mtp_across_ranks_is_bit_identical_and_resumes() {
    let t0 = std::time::Instant::now();
    let cfg = config(2, 2, true, fresh_seed());
    let dir = tmp("pp2");
    let (a, b) = (dir.join("one.ckpt"), dir.join("ranks.ckpt"));
    let one = single(&cfg, 1200, 1, &a, None);
    assert!(one
        .reports
        .iter()
        .all(|r| r.loss.is_finite() && r.mtp_loss.is_some()));
    let ranks = ranked(&cfg, 1210, 1, &b, None);
    let ck = std::fs::read(&b).expect("rank 0 wrote the checkpoint");
    assert!(
        ck == one.ckpt,
        "checkpoint bytes differ ({} vs {} bytes)",
        ck.len(),
        one.ckpt.len()
    );
    assert_same(&one, ranks);
    // step 2 from the checkpoint: every rank resumes its part
    let (a3, b3) = (dir.join("one3.ckpt"), dir.join("ranks3.ckpt"));
    let one3 = single(&cfg, 1200, 1, &a3, Some(&a));
    let ranks3 = ranked(&cfg, 1210, 1, &b3, Some(&b));
    assert!(
        std::fs::read(&b3).expect("written") == one3.ckpt,
        "resumed checkpoint bytes differ"
    );
    assert_same(&one3, ranks3);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("pp2 x ep2 with MTP: {:.1} s", t0.elapsed().as_secs_f64());
}

#[test]
fn a_wrong_rank_count_is_refused() {
    let cfg = config(2, 1, false, 7);
    let engines = ep::InProcessEngine::mesh(3);
    let e = Trainer::new_rank(
        cfg,
        &data::builtin_corpus(),
        &*device_stage_factory(),
        options(1400),
        PipeRank::new(0, Arc::new(engines.into_iter().next().expect("endpoint"))),
    )
    .err()
    .expect("refused");
    let msg = e.to_string();
    assert!(
        msg.contains("parallel.pp = 2") && msg.contains("of 3"),
        "{msg}"
    );
}

#[test]
fn a_silent_peer_times_out_naming_it_and_the_boundary() {
    // rank 1 never starts: rank 0's first wait for a boundary from it ends at the timeout
    let cfg = config(2, 1, false, 9);
    let mut engines = ep::InProcessEngine::mesh(2).into_iter();
    let e0 = engines.next().expect("endpoint");
    let _e1 = engines.next(); // kept open: a silent peer, not a closed one
    let mut rank = PipeRank::new(0, Arc::new(e0));
    rank.timeout = Duration::from_millis(300);
    let mut t = Trainer::new_rank(
        cfg,
        &data::builtin_corpus(),
        &*device_stage_factory(),
        options(1500),
        rank,
    )
    .expect("trainer");
    let t0 = std::time::Instant::now();
    let msg = t.step().expect_err("timed out").to_string();
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    assert!(msg.starts_with("pipeline rank 1:"), "{msg}");
    assert!(
        msg.contains("stage") && msg.contains("micro-batch"),
        "{msg}"
    );
}

/// A device stage whose forward of one micro-batch fails.
struct Failing {
    inner: Box<dyn Stage>,
    mb: usize,
}

impl Stage for Failing {
    fn devices(&self) -> &[runtime::Device] {
        self.inner.devices()
    }
    fn forward(&mut self, mb: &MicroBatch, x: Option<Boundary>) -> StageResult<StageOut> {
        if mb.index == self.mb {
            return Err(TrainError::Shape(format!(
                "injected failure at micro-batch {}",
                mb.index
            )));
        }
        self.inner.forward(mb, x)
    }
    fn backward(&mut self, mb: usize, dy: Option<Boundary>) -> StageResult<Option<Boundary>> {
        self.inner.backward(mb, dy)
    }
    fn discard(&mut self, mb: usize) {
        self.inner.discard(mb)
    }
    fn set_loss_scale(&mut self, scale: f32) {
        self.inner.set_loss_scale(scale)
    }
    fn take_grads(&mut self) -> StageResult<(NamedGrads, ExpertLoad)> {
        self.inner.take_grads()
    }
    fn load_params(&mut self, p: &Params) -> StageResult<()> {
        self.inner.load_params(p)
    }
    fn load_device_params(&mut self, p: &DeviceParams<'_>) -> StageResult<()> {
        self.inner.load_device_params(p)
    }
}

#[test]
fn a_failing_rank_stops_its_peer_with_its_error() {
    // stage 1 (pipeline rank 1) fails its forward of micro-batch 1: rank 1 returns that error,
    // rank 0 (waiting for a boundary from it) is told at once, long before the timeout
    let cfg = config(2, 1, false, fresh_seed());
    let engines = ep::InProcessEngine::mesh(2);
    let t0 = std::time::Instant::now();
    let errs: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = engines
            .into_iter()
            .enumerate()
            .map(|(r, e)| {
                let cfg = cfg.clone();
                sc.spawn(move || {
                    let device = device_stage_factory();
                    let factory = move |spec: StageSpec, p: &Params| {
                        let index = spec.index;
                        let inner = device(spec, p)?;
                        Ok(match index {
                            1 => Box::new(Failing { inner, mb: 1 }) as Box<dyn Stage>,
                            _ => inner,
                        })
                    };
                    let mut rank = PipeRank::new(r, Arc::new(e));
                    rank.timeout = Duration::from_secs(120);
                    let mut t = Trainer::new_rank(
                        cfg,
                        &data::builtin_corpus(),
                        &factory,
                        options(1600),
                        rank,
                    )
                    .expect("trainer");
                    t.step().expect_err("the step fails").to_string()
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
    assert!(
        errs[1].contains("injected failure at micro-batch 1"),
        "{}",
        errs[1]
    );
    assert!(
        errs[0].starts_with("pipeline rank 1: stopped:") && errs[0].contains("injected failure"),
        "{}",
        errs[0]
    );
}
