//! The trainer: a DualPipeV pipeline of `2 pp` stages ([`crate::stage::Stage`] objects made by a
//! [`StageFactory`]) driven step by step — sample micro-batches, run the pipeline
//! ([`exec::Executor`]), take and check the gradients, clip and apply AdamW on the devices
//! ([`optim::Optimizer`]), update the MoE biases there, reload the stages from the devices — plus evaluation,
//! checkpoints (save / bit-exact resume), the loss curve and a trace of a step.
//!
//! The trainer only knows the `Stage` trait. `ptxforge train` passes
//! [`device_stage_factory`] (the device model); tests pass host mocks.
//!
//! - [`exec`]: the pipelined and unpipelined executors and the boundary transfers
//!   (`worker`: one pipeline rank's thread).
//! - [`optim`]: device AdamW (FP32 master weights, BF16 moments), global-norm clip, biases.
//! - [`layout`]: devices, stage specs, parameter ownership, micro-batch splitting.
//! - [`timing`]: spans, per-phase sums, overlap, the trace of a step.
//! - `state`: checkpoint save and resume.
//! - `link`: across processes ([`Trainer::new_rank`], one process per pipeline rank): the
//!   boundary messages and the collectives of a step over an `ep::Engine`.

pub mod exec;
pub mod layout;
mod link;
pub mod optim;
mod state;
pub mod timing;
mod worker;

use crate::config::TrainConfig;
use crate::data::{self, Corpus, Entropy, SamplerState, Split};
use crate::guard::{check_finite, Site};
use crate::params::{ParamSpec, Params};
use crate::plot::LossCurve;
use crate::stage::{ExpertLoad, MicroBatch, Stage, StageSpec};
use crate::trace::Trace;
use crate::TrainError;
use exec::Executor;
use link::{Link, Reader, Tag};
pub use link::{PhaseHook, PipeRank, DEFAULT_TIMEOUT as PEER_TIMEOUT};
use optim::{Optimizer, StepHyper};
use serde::Serialize;
use std::cell::OnceCell;
use std::sync::Arc;
use std::time::Instant;
use timing::{Overlap, Phases, Span, SpanKind};

/// Per parameter ([`crate::params::specs`] order) its step gradient, `None` for parameters
/// without one (the route biases).
pub type StepGrads = Vec<Option<Vec<f32>>>;

/// Makes the stage object of one stage spec, loaded with `params`.
pub type StageFactory = dyn Fn(StageSpec, &Params) -> Result<Box<dyn Stage>, TrainError>;

/// The device model's stage factory.
///
pub fn device_stage_factory() -> Box<StageFactory> {
    Box::new(|spec, p| Ok(Box::new(crate::net::DeviceStage::new(spec, p)?) as Box<dyn Stage>))
}

/// Trainer options that are not part of the job's configuration.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// Run the DualPipeV schedule (false: the unpipelined reference order, same stages).
    pub pipelined: bool,
    /// Emulated devices are `emu_base..emu_base + pp*ep*dp` (tests use distinct ranges).
    pub emu_base: u32,
    /// Validation batches per evaluation (`None`: the whole validation split).
    pub eval_batches: Option<usize>,
    /// Run every stage and every expert on one device ([`layout::single_device`]): the
    /// reference run the parallel one is bit-identical to.
    pub single_device: bool,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            pipelined: true,
            emu_base: 0,
            eval_batches: None,
            single_device: false,
        }
    }
}

/// What one step did.
#[derive(Clone, Debug, Serialize)]
pub struct StepReport {
    /// Steps completed after this one (1 for the first).
    pub step: u64,
    /// Step loss: summed cross-entropy over the micro-batches / labelled tokens (nats).
    pub loss: f64,
    pub lr: f32,
    /// Global gradient L2 norm before clipping.
    pub grad_norm: f32,
    pub tokens: u64,
    pub labelled: u64,
    pub tokens_per_s: f64,
    pub phases: Phases,
    pub overlap: Overlap,
    /// Transfer seconds / (forward + backward) seconds.
    pub comm_compute: f64,
    /// With an MTP module (`model.mtp_depth = 1`): the MTP cross-entropy summed over the
    /// micro-batches / labelled tokens of the step (V3's normalisation, the same count as
    /// `loss`); the step minimises `loss + train.mtp_loss_weight * mtp_loss`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtp_loss: Option<f64>,
}

/// The training run.
pub struct Trainer {
    cfg: TrainConfig,
    options: TrainOptions,
    split: Split,
    corpus_fingerprint: String,
    sampler: SamplerState,
    step: u64,
    /// Every parameter's spec ([`crate::params::specs`] order).
    specs: Vec<ParamSpec>,
    /// Host copies of the parameters, downloaded from the optimizer on request (emptied by
    /// every step: the weights live on the devices).
    host: OnceCell<Params>,
    /// The stage objects this process runs (every stage, or across processes the two of its
    /// pipeline rank), in stage order; `local[k]` is `stages[k]`'s stage index.
    stages: Vec<Box<dyn Stage>>,
    local: Vec<usize>,
    /// Per stage (all of them) the parameters it owns.
    owners: Vec<Vec<usize>>,
    opt: Optimizer,
    exec: Executor,
    entropy: Entropy,
    train_curve: Vec<(u32, f64)>,
    valid_curve: Vec<(u32, f64)>,
    last_spans: Vec<Span>,
    /// When the last step's pipeline started (the origin of `last_spans`).
    last_t0: Option<Instant>,
    /// The kernels of the last [`Trainer::step_traced`].
    last_kernels: Vec<runtime::profile::KernelSpan>,
    /// The MTP loss of the last forward-backward (with an MTP module).
    last_mtp_loss: Option<f64>,
    /// Across processes: this process's pipeline rank and the link to the others.
    link: Option<Arc<Link>>,
}

/// What runs in this process: the executor, the stages (all, or across processes its pipeline
/// rank's two: `local`) and their optimizer groups.
struct Here {
    exec: Executor,
    local: Vec<usize>,
    opt: Optimizer,
    stages: Vec<Box<dyn Stage>>,
}

impl Here {
    fn build(
        specs: Vec<StageSpec>,
        micro_batches: usize,
        params: &Params,
        owners: &[Vec<usize>],
        link: Option<Arc<Link>>,
        factory: &StageFactory,
    ) -> Result<Here, TrainError> {
        let exec = match link {
            None => Executor::new(&specs, micro_batches)?,
            Some(l) => Executor::for_rank(&specs, micro_batches, l)?,
        };
        let local = exec.local_stages();
        let first: Vec<_> = local.iter().map(|&s| specs[s].devices[0].clone()).collect();
        let own: Vec<_> = local.iter().map(|&s| owners[s].clone()).collect();
        let opt = Optimizer::for_stages(params, &local, &own, &first, specs.len())?;
        let stages = specs
            .into_iter()
            .filter(|s| local.contains(&s.index))
            .map(|s| factory(s, params))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Here {
            exec,
            local,
            opt,
            stages,
        })
    }
}

/// The rank holding the last stage (loss, head, MTP) under DualPipeV: rank 0.
const LOSS_RANK: usize = 0;

impl Trainer {
    /// Validates `cfg`, splits `data`, places the stages on the job's devices, initialises the
    /// parameters (seed `train.seed`) and builds every stage with `factory`.
    pub fn new(
        cfg: TrainConfig,
        data: &Corpus,
        factory: &StageFactory,
        options: TrainOptions,
    ) -> Result<Trainer, TrainError> {
        Trainer::build(cfg, data, factory, options, None)
    }

    /// The trainer of pipeline rank `rank.rank` of a run with one process per pipeline rank
    /// (`rank.engine` joins `parallel.pp` processes): it builds and runs that rank's two stages
    /// (DualPipeV: `r` and `2 pp - 1 - r`, with their EP group) and the rest of the job crosses
    /// the engine. Every process calls the same methods in the same order ([`Trainer::step`],
    /// [`Trainer::evaluate`], [`Trainer::save`] are collective); the results (losses, norms,
    /// parameters, checkpoint bytes) are bit-identical to [`Trainer::new`]'s of the same
    /// configuration. After an error the trainer is not usable (its peers were told to stop).
    pub fn new_rank(
        cfg: TrainConfig,
        data: &Corpus,
        factory: &StageFactory,
        options: TrainOptions,
        rank: PipeRank,
    ) -> Result<Trainer, TrainError> {
        if options.single_device || !options.pipelined {
            return Err(TrainError::Unsupported(
                "across processes the step is pipelined over the job's devices (no \
                 single-device or unpipelined run)"
                    .into(),
            ));
        }
        Trainer::build(cfg, data, factory, options, Some(rank))
    }

    fn build(
        cfg: TrainConfig,
        data: &Corpus,
        factory: &StageFactory,
        options: TrainOptions,
        rank: Option<PipeRank>,
    ) -> Result<Trainer, TrainError> {
        cfg.validate()?;
        let link = match rank {
            Some(r) => Some(Arc::new(Link::new(r, cfg.parallel.pp as usize)?)),
            None => None,
        };
        if data.vocab > cfg.model.vocab {
            return Err(TrainError::Shape(format!(
                "model.vocab {} is smaller than the corpus's vocabulary {}",
                cfg.model.vocab, data.vocab
            )));
        }
        let split = data.split(cfg.train.seq_len as usize)?;
        let entropy = data::unigram_entropy(&split.train);
        let devices = match options.single_device {
            true => layout::single_device(&cfg, options.emu_base)?,
            false => layout::job_devices(&cfg, options.emu_base)?,
        };
        let specs = layout::stage_specs(&cfg, &devices)?;
        let params = Params::init(&cfg.model, cfg.train.seed);
        let owners: Vec<Vec<usize>> = specs
            .iter()
            .map(|s| layout::stage_params(s, &params.specs))
            .collect();
        let mbs = cfg.train.micro_batches as usize;
        let here = Here::build(specs, mbs, &params, &owners, link.clone(), factory)?;
        // a fresh sampler validates the training split against the batch shape
        let t = &cfg.train;
        let sampler = data::Sampler::new(
            &split.train,
            t.seq_len as usize,
            t.micro_batch as usize,
            t.seed,
        )?
        .state();
        Ok(Trainer {
            corpus_fingerprint: data.fingerprint(),
            cfg,
            options,
            split,
            sampler,
            step: 0,
            specs: params.specs.clone(),
            host: OnceCell::from(params),
            stages: here.stages,
            local: here.local,
            owners,
            opt: here.opt,
            exec: here.exec,
            entropy,
            train_curve: Vec::new(),
            valid_curve: Vec::new(),
            last_spans: Vec::new(),
            last_t0: None,
            last_kernels: Vec::new(),
            last_mtp_loss: None,
            link,
        })
    }

    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }
    /// Steps completed.
    pub fn steps_done(&self) -> u64 {
        self.step
    }
    /// The current FP32 master weights (and route biases): downloaded from the devices on the
    /// first call after a step.
    ///
    /// Across processes a process holds only its stages' parameters: see
    /// [`Trainer::owned_params`] (and [`Trainer::save`], which gathers them all).
    pub fn params(&self) -> Result<&Params, TrainError> {
        if let Some(l) = &self.link {
            return Err(TrainError::Unsupported(format!(
                "Trainer::params on pipeline rank {}: it holds stages {:?} only (owned_params, \
                 or save, which gathers every rank's)",
                l.rank(),
                self.local
            )));
        }
        if let Some(p) = self.host.get() {
            return Ok(p);
        }
        let p = self.opt.device_params(&self.specs).download()?;
        Ok(self.host.get_or_init(|| p))
    }

    /// The parameters this process's stages own (every parameter in one process), by index
    /// into [`crate::params::specs`], with their current FP32 master weights (route biases
    /// included).
    pub fn owned_params(&self) -> Result<Vec<(usize, Vec<f32>)>, TrainError> {
        let dp = self.opt.device_params(&self.specs);
        self.local
            .iter()
            .flat_map(|&s| self.owners[s].iter())
            .map(|&i| Ok((i, dp.get(&self.specs[i].name)?.to_vec()?)))
            .collect()
    }

    /// This process's pipeline rank (`None`: every rank runs in this process).
    pub fn pipeline_rank(&self) -> Option<usize> {
        self.link.as_ref().map(|l| l.rank())
    }

    /// Tells the phase hook (across processes).
    fn phase(&self, name: &str) {
        if let Some(l) = &self.link {
            l.phase(&format!("train: {name} ({} steps done)", self.step));
        }
    }

    /// Unigram entropy of the training split (the learning bar).
    pub fn entropy(&self) -> Entropy {
        self.entropy
    }
    pub fn split(&self) -> &Split {
        &self.split
    }
    /// The stage objects (tests inspect their mocks through this).
    pub fn stages_mut(&mut self) -> &mut [Box<dyn Stage>] {
        &mut self.stages
    }
    /// The schedule the pipeline runs.
    pub fn schedule(&self) -> &pipeline::Schedule {
        &self.exec.schedule
    }

    /// The next step's micro-batches (does not advance the sampler).
    fn sample(&self) -> Result<(Vec<MicroBatch>, SamplerState), TrainError> {
        let t = &self.cfg.train;
        let mut s = data::Sampler::resume(
            &self.split.train,
            t.seq_len as usize,
            t.micro_batch as usize,
            self.sampler,
        )?;
        let ep = self.cfg.parallel.ep as usize;
        let mbs = (0..t.micro_batches as usize)
            .map(|i| layout::micro_batch(i, &s.next_batch(), ep))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((mbs, s.state()))
    }

    /// The micro-batches the next [`Trainer::step`] will train on (the sampler does not move).
    pub fn peek_batches(&self) -> Result<Vec<MicroBatch>, TrainError> {
        Ok(self.sample()?.0)
    }

    /// The next step's loss and gradients (`[params::specs]` order; `None` for parameters
    /// without a gradient, the route biases) without applying them: the sampler, parameters
    /// and optimizer do not move (a gradient check against `model::reference`).
    ///
    /// Across processes (collective): the gradients of this process's parameters only.
    pub fn gradients(&mut self) -> Result<(f64, StepGrads), TrainError> {
        let (mbs, _) = self.sample()?;
        let (out, labelled) = self.forward_backward(&mbs)?;
        let losses = self.step_losses(out.losses)?;
        let loss = losses.iter().sum::<f64>() / labelled as f64;
        let (grads, _) = self.collect_grads()?;
        Ok((loss, grads))
    }

    /// The MTP loss (see [`StepReport::mtp_loss`]) of the last [`Trainer::step`] or
    /// [`Trainer::gradients`]; `None` without an MTP module.
    pub fn last_mtp_loss(&self) -> Option<f64> {
        self.last_mtp_loss
    }

    /// [`Trainer::step`] with every emulated kernel launch of the step kept for
    /// [`Trainer::trace`] (device, stream, SM partition, host time).
    pub fn step_traced(&mut self) -> Result<StepReport, TrainError> {
        runtime::profile::start_capture();
        let r = self.step();
        self.last_kernels = runtime::profile::stop_capture();
        r
    }

    /// One optimizer step. On error (a stage failure, a non-finite loss or gradient) nothing
    /// of the trainer's state advances, the stages drop what the step left in them, and no file
    /// is written: the last checkpoint stays the last good one.
    pub fn step(&mut self) -> Result<StepReport, TrainError> {
        let t0 = Instant::now();
        let (mbs, next_sampler) = self.sample()?;
        let r = self.run_step(&mbs, t0);
        if let (Err(e), Some(l)) = (&r, &self.link) {
            if !matches!(e, TrainError::Peer { .. }) {
                l.abort(e); // the peers stop with this error instead of a timeout
            }
        }
        if r.is_err() {
            for s in &mut self.stages {
                mbs.iter().for_each(|m| s.discard(m.index));
                // the partial gradients and loads of the failed step; a second error is moot
                let _ = s.take_grads();
            }
            return r;
        }
        self.sampler = next_sampler;
        self.step += 1;
        r.map(|mut rep| {
            rep.step = self.step;
            self.train_curve.push((self.step as u32, rep.loss));
            rep
        })
    }

    /// Sets the stages' loss scale (1 / labelled tokens) and runs every micro-batch forward
    /// and backward, pipelined or not; returns the executor's output and the labelled count.
    fn forward_backward(
        &mut self,
        mbs: &[MicroBatch],
    ) -> Result<(exec::ExecOut, usize), TrainError> {
        let labelled: usize = mbs.iter().map(MicroBatch::labelled).sum();
        if labelled == 0 {
            return Err(TrainError::Shape("a step without labelled tokens".into()));
        }
        for s in &mut self.stages {
            s.set_loss_scale(1.0 / labelled as f32);
        }
        self.last_mtp_loss = None;
        self.phase("pipeline (forward, backward, boundaries)");
        let out = if self.options.pipelined {
            self.exec.run_pipelined(&mut self.stages, mbs)?
        } else {
            self.exec.run_unpipelined(&mut self.stages, mbs)?
        };
        if self.losses_here() {
            self.last_mtp_loss = self.mtp_loss(mbs.len(), labelled)?;
        }
        Ok((out, labelled))
    }

    /// Whether the last stage (the losses) runs in this process.
    fn losses_here(&self) -> bool {
        self.exec.is_local(self.exec.stages() - 1)
    }

    /// The step's per-micro-batch losses, checked finite; across processes the loss rank's
    /// (and its MTP loss) broadcast to every rank.
    fn step_losses(&mut self, losses: Vec<f64>) -> Result<Vec<f64>, TrainError> {
        let checked = self.check_losses(&losses);
        let Some(link) = self.link.clone() else {
            return checked.map(|_| losses);
        };
        self.phase("losses");
        let mine = checked.map(|_| {
            let mut b = link::f64_bytes(&[self.last_mtp_loss.unwrap_or(f64::NAN)]);
            b.extend(link::f64_bytes(&losses));
            b
        });
        let t = link::tag(Tag::Losses, 0, 0)?;
        let b = link.broadcast(LOSS_RANK, t, mine, "step losses")?;
        let mut r = Reader::new(&b, LOSS_RANK, "step losses");
        let mtp = r.f64()?;
        self.last_mtp_loss = (self.cfg.model.mtp_depth > 0).then_some(mtp);
        let out = (0..self.cfg.train.micro_batches)
            .map(|_| r.f64())
            .collect::<Result<Vec<_>, _>>()?;
        r.done()?;
        Ok(out)
    }

    /// Every micro-batch's loss finite (where the losses are).
    fn check_losses(&self, losses: &[f64]) -> Result<(), TrainError> {
        for (i, l) in losses.iter().enumerate() {
            let site = || Site {
                step: self.step,
                layer: None,
                tensor: format!("loss of micro-batch {i}"),
            };
            check_finite(site, &[*l as f32])?;
        }
        Ok(())
    }

    /// The step's MTP loss from the stages' per-micro-batch sums (summed in index order, so
    /// any schedule gives the same bits), checked finite; `None` without an MTP module.
    fn mtp_loss(&mut self, mbs: usize, labelled: usize) -> Result<Option<f64>, TrainError> {
        if self.cfg.model.mtp_depth == 0 {
            return Ok(None);
        }
        let mut per: Vec<(usize, f64)> = self
            .stages
            .iter_mut()
            .flat_map(|s| s.take_mtp_losses())
            .collect();
        per.sort_by_key(|(i, _)| *i);
        if per.len() != mbs || per.iter().enumerate().any(|(k, (i, _))| k != *i) {
            return Err(TrainError::Shape(format!(
                "MTP: {} micro-batch losses for {mbs} micro-batches",
                per.len()
            )));
        }
        for (i, l) in &per {
            let site = || Site {
                step: self.step,
                layer: None,
                tensor: format!("MTP loss of micro-batch {i}"),
            };
            check_finite(site, &[*l as f32])?;
        }
        Ok(Some(
            per.iter().map(|(_, l)| l).sum::<f64>() / labelled as f64,
        ))
    }

    fn run_step(&mut self, mbs: &[MicroBatch], t0: Instant) -> Result<StepReport, TrainError> {
        let (mut out, labelled) = self.forward_backward(mbs)?;
        let losses = self.step_losses(std::mem::take(&mut out.losses))?;
        let loss = losses.iter().sum::<f64>() / labelled as f64;
        self.last_t0 = Some(out.t0);
        let opt_start = out.t0.elapsed().as_secs_f64();
        let grad_norm = self.apply_update()?;
        let opt_end = out.t0.elapsed().as_secs_f64();
        let mut spans = out.spans;
        // one optimizer span per pipeline rank here, on its devices (those of stage `rank`)
        let ranks: Vec<usize> = match &self.link {
            None => (0..self.exec.schedule.num_ranks()).collect(),
            Some(l) => vec![l.rank()],
        };
        spans.extend(ranks.into_iter().map(|r| Span {
            kind: SpanKind::Optimizer,
            rank: r,
            stage: r,
            mb: 0,
            start: opt_start,
            end: opt_end,
            pair: None,
        }));
        let mut phases = timing::phases(&spans);
        phases.optimizer = opt_end - opt_start;
        phases.pipeline_wall = out.wall;
        phases.step_wall = t0.elapsed().as_secs_f64();
        let overlap = timing::overlap(&spans);
        self.last_spans = spans;
        let tokens = self.cfg.tokens_per_step();
        Ok(StepReport {
            step: self.step + 1,
            loss,
            lr: self.cfg.lr_at(self.step as u32),
            grad_norm,
            tokens,
            labelled: labelled as u64,
            tokens_per_s: tokens as f64 / phases.step_wall.max(1e-12),
            comm_compute: phases.transfer / (phases.forward + phases.backward).max(1e-12),
            phases,
            overlap,
            mtp_loss: self.last_mtp_loss,
        })
    }

    /// Takes and checks every stage's gradients, runs AdamW on the devices, updates the
    /// biases there and reloads the stages from the devices' master weights; returns the
    /// global gradient norm.
    fn apply_update(&mut self) -> Result<f32, TrainError> {
        let (grads, loads) = self.collect_grads()?;
        self.phase("optimizer");
        let here: Vec<usize> = self
            .local
            .iter()
            .flat_map(|&s| self.owners[s].clone())
            .collect();
        for (i, spec) in self.specs.iter().enumerate() {
            if !optim::is_adamw(spec.kind) || !here.contains(&i) {
                continue;
            }
            let g = grads[i].as_deref().ok_or_else(|| {
                TrainError::Shape(format!("no stage returned a gradient for {}", spec.name))
            })?;
            let site = || Site {
                step: self.step,
                layer: spec.layer.map(|l| l as u32),
                tensor: format!("{}.grad", spec.name),
            };
            check_finite(site, g)?;
        }
        let t = &self.cfg.train;
        let hyper = StepHyper {
            lr: self.cfg.lr_at(self.step as u32),
            beta1: t.adam_beta1,
            beta2: t.adam_beta2,
            eps: t.adam_eps,
            weight_decay: t.weight_decay,
            clip: (t.grad_clip > 0.0).then_some(t.grad_clip),
            step: self.step as u32 + 1,
        };
        let norm = match self.link.clone() {
            None => self.opt.step(&grads, &hyper)?,
            Some(l) => {
                let stages = self.exec.stages();
                let x = |mine: &[(usize, f32)]| exchange_norms(&l, mine, stages);
                self.opt.step_with(&grads, &hyper, Some(&x))?
            }
        };
        self.host = OnceCell::new();
        self.update_biases(&loads)?;
        let dp = self.opt.device_params(&self.specs);
        for s in &mut self.stages {
            s.load_device_params(&dp)?;
        }
        Ok(norm)
    }

    /// Every stage's gradients placed by parameter index, and the expert loads.
    fn collect_grads(&mut self) -> Result<(StepGrads, ExpertLoad), TrainError> {
        let mut grads: StepGrads = vec![None; self.specs.len()];
        let mut loads: ExpertLoad = Vec::new();
        let mut shared = Vec::new();
        for (&s, stage) in self.local.iter().zip(self.stages.iter_mut()) {
            let (named, load) = stage.take_grads()?;
            for (name, g) in named {
                let i = param_index(&self.specs, &name)?;
                if self.cfg.model.mtp_depth > 0 && name == "embed" && !self.owners[s].contains(&i) {
                    shared.push((s, i, g)); // the MTP module's part of the shared embedding
                    continue;
                }
                place_grad(&self.specs, &self.owners[s], s, i, g, &mut grads)?;
            }
            loads.extend(load);
        }
        for (s, i, g) in shared {
            self.add_shared_grad(s, i, g, &mut grads)?;
        }
        Ok((grads, loads))
    }

    /// Adds stage `s`'s part `g` of the shared parameter `i` (MTP: the embedding) to its
    /// owner's gradient, owner's first, on stage `s`'s first device (under DualPipeV the last
    /// stage shares the first stage's devices).
    fn add_shared_grad(
        &self,
        s: usize,
        i: usize,
        g: Vec<f32>,
        grads: &mut StepGrads,
    ) -> Result<(), TrainError> {
        let name = &self.specs[i].name;
        let owner = grads[i].as_mut().ok_or_else(|| {
            TrainError::Shape(format!(
                "stage {s} returned a part of {name}, its owner none"
            ))
        })?;
        if owner.len() != g.len() {
            return Err(TrainError::Shape(format!(
                "stage {s}: its part of {name} has {} values, the owner's {}",
                g.len(),
                owner.len()
            )));
        }
        let k = self.local.iter().position(|&l| l == s);
        let stage = k.and_then(|k| self.stages.get(k));
        let dev = &stage
            .ok_or_else(|| TrainError::Shape(format!("stage {s} does not run here")))?
            .devices()[0];
        *owner = crate::net::add_on_device(dev, self.cfg.parallel.comm_sms, owner, &g)?;
        Ok(())
    }

    fn update_biases(&mut self, loads: &[(usize, Vec<u64>)]) -> Result<(), TrainError> {
        let e = self.cfg.model.routed_experts as usize;
        let mut per_layer: std::collections::BTreeMap<usize, Vec<u64>> = Default::default();
        for (layer, load) in loads {
            if load.len() != e {
                return Err(TrainError::Shape(format!(
                    "layer {layer}: expert load of {} experts, the model has {e}",
                    load.len()
                )));
            }
            let acc = per_layer.entry(*layer).or_insert_with(|| vec![0; e]);
            acc.iter_mut().zip(load).for_each(|(a, l)| *a += l);
        }
        let speed = self.cfg.train.bias_update_speed;
        for (layer, load) in per_layer {
            let i = param_index(&self.specs, &format!("layers.{layer}.moe.bias"))?;
            self.opt.update_bias(i, &load, speed)?;
        }
        Ok(())
    }

    /// Validation loss (nats per labelled token) over the validation split (or the first
    /// `options.eval_batches` batches), forward only; recorded on the loss curve.
    pub fn evaluate(&mut self) -> Result<f64, TrainError> {
        let t = &self.cfg.train;
        let mut batches = data::eval_batches(
            &self.split.valid,
            t.seq_len as usize,
            t.micro_batch as usize,
        )?;
        if let Some(n) = self.options.eval_batches {
            batches.truncate(n.max(1));
        }
        self.phase("evaluation");
        let r = self.validation_loss(&batches);
        let loss = match self.link.clone() {
            None => r?,
            Some(l) => share_validation_loss(&l, r)?,
        };
        self.valid_curve.push((self.step as u32, loss));
        Ok(loss)
    }

    /// The forward-only pass over `batches` through this process's stages; the loss, checked
    /// finite, where the last stage runs (NaN elsewhere: the loss rank broadcasts it).
    fn validation_loss(&mut self, batches: &[data::Batch]) -> Result<f64, TrainError> {
        let ep = self.cfg.parallel.ep as usize;
        let (mut sum, mut labelled) = (0.0f64, 0usize);
        for (i, b) in batches.iter().enumerate() {
            let mb = layout::micro_batch(i, b, ep)?;
            labelled += mb.labelled();
            sum += self
                .exec
                .forward_local(&mut self.stages, &mb)?
                .unwrap_or(f64::NAN);
        }
        // the expert loads counted by these forwards must not move the biases
        for s in &mut self.stages {
            s.take_grads()?;
        }
        if !self.losses_here() {
            return Ok(f64::NAN);
        }
        let loss = sum / labelled.max(1) as f64;
        check_finite(
            || Site {
                step: self.step,
                layer: None,
                tensor: "validation loss".into(),
            },
            &[loss as f32],
        )?;
        Ok(loss)
    }

    /// The loss curve so far, with the unigram entropy as the reference line.
    pub fn loss_curve(&self) -> LossCurve {
        LossCurve {
            title: format!(
                "ptxforge train: PP {} x EP {}, {} layers, hidden {}",
                self.cfg.parallel.pp,
                self.cfg.parallel.ep,
                self.cfg.model.layers,
                self.cfg.model.hidden
            ),
            train: self.train_curve.clone(),
            valid: self.valid_curve.clone(),
            reference: Some(("unigram entropy".into(), self.entropy.nats)),
        }
    }

    /// The last step's timeline as a trace (every pass on each device of its stage).
    pub fn trace(&self) -> Trace {
        let devices: Vec<_> = (0..self.exec.stages())
            .map(|s| self.exec.devices_of(s).to_vec())
            .collect();
        let mut t = timing::trace(&self.last_spans, &devices);
        if let Some(t0) = self.last_t0 {
            timing::add_kernels(&mut t, t0, &self.last_kernels);
        }
        t
    }

    /// The last step's spans.
    pub fn spans(&self) -> &[Span] {
        &self.last_spans
    }
}

/// Across processes: the loss rank's validation loss (`r` there) on every rank; a rank whose
/// evaluation failed tells the others and returns its error.
fn share_validation_loss(l: &Link, r: Result<f64, TrainError>) -> Result<f64, TrainError> {
    if let Err(e) = &r {
        if !matches!(e, TrainError::Peer { .. }) {
            l.abort(e); // the peers stop with this error instead of a timeout
        }
        if l.rank() != LOSS_RANK {
            return r;
        }
    }
    let mine = r.map(|v| link::f64_bytes(&[v]));
    let t = link::tag(Tag::Valid, 0, 0)?;
    let b = l.broadcast(LOSS_RANK, t, mine, "validation loss")?;
    let mut rd = Reader::new(&b, LOSS_RANK, "validation loss");
    let v = rd.f64()?;
    rd.done()?;
    Ok(v)
}

/// Across processes: this rank's `(stage, norm)` pairs all-gathered; every stage's norm in
/// stage order.
fn exchange_norms(l: &Link, mine: &[(usize, f32)], stages: usize) -> Result<Vec<f32>, TrainError> {
    let mut b = Vec::new();
    for (s, n) in mine {
        b.extend((*s as u64).to_le_bytes());
        b.extend(link::f32_bytes(&[*n]));
    }
    let parts = l.all_gather(link::tag(Tag::Norms, 0, 0)?, Ok(b), "gradient norms")?;
    let mut all = vec![None; stages];
    for (r, p) in parts.iter().enumerate() {
        let mut rd = Reader::new(p, r, "gradient norms");
        while !rd.is_empty() {
            let s = rd.u64()? as usize;
            let n = rd.f32()?;
            let slot = all.get_mut(s).ok_or_else(|| TrainError::Peer {
                rank: r,
                msg: format!("sent the gradient norm of stage {s} of {stages}"),
            })?;
            *slot = Some(n);
        }
    }
    all.into_iter()
        .enumerate()
        .map(|(s, n)| n.ok_or_else(|| TrainError::Shape(format!("no gradient norm of stage {s}"))))
        .collect()
}

/// Index of parameter `name` in `specs`.
fn param_index(specs: &[ParamSpec], name: &str) -> Result<usize, TrainError> {
    specs
        .iter()
        .position(|s| s.name == name)
        .ok_or_else(|| crate::params::ParamError::Unknown(name.to_string()).into())
}

/// Files gradient `g` of parameter `i` from stage `s`, refusing a parameter the stage does
/// not own, a duplicate or a wrong length.
fn place_grad(
    specs: &[ParamSpec],
    owned: &[usize],
    s: usize,
    i: usize,
    g: Vec<f32>,
    grads: &mut [Option<Vec<f32>>],
) -> Result<(), TrainError> {
    let spec = &specs[i];
    if !owned.contains(&i) {
        return Err(TrainError::Shape(format!(
            "stage {s} returned a gradient for {}, which it does not hold",
            spec.name
        )));
    }
    if g.len() != spec.len() {
        return Err(TrainError::Shape(format!(
            "stage {s}: gradient of {} has {} values for shape {:?}",
            spec.name,
            g.len(),
            spec.shape
        )));
    }
    if !optim::is_adamw(spec.kind) {
        return Ok(()); // a route bias: not a gradient parameter
    }
    if grads[i].replace(g).is_some() {
        return Err(TrainError::Shape(format!(
            "stage {s} returned two gradients for {}",
            spec.name
        )));
    }
    Ok(())
}
