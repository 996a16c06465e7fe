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

pub mod exec;
pub mod layout;
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
use optim::{Optimizer, StepHyper};
use serde::Serialize;
use std::cell::OnceCell;
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
    stages: Vec<Box<dyn Stage>>,
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
}

impl Trainer {
    /// Validates `cfg`, splits `data`, places the stages on the job's devices, initialises the
    /// parameters (seed `train.seed`) and builds every stage with `factory`.
    pub fn new(
        cfg: TrainConfig,
        data: &Corpus,
        factory: &StageFactory,
        options: TrainOptions,
    ) -> Result<Trainer, TrainError> {
        cfg.validate()?;
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
        let first: Vec<_> = specs.iter().map(|s| s.devices[0].clone()).collect();
        let opt = Optimizer::new(&params, &owners, &first)?;
        let exec = Executor::new(&specs, cfg.train.micro_batches as usize)?;
        let stages = specs
            .into_iter()
            .map(|s| factory(s, &params))
            .collect::<Result<Vec<_>, _>>()?;
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
            stages,
            owners,
            opt,
            exec,
            entropy,
            train_curve: Vec::new(),
            valid_curve: Vec::new(),
            last_spans: Vec::new(),
            last_t0: None,
            last_kernels: Vec::new(),
            last_mtp_loss: None,
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
    pub fn params(&self) -> Result<&Params, TrainError> {
        if let Some(p) = self.host.get() {
            return Ok(p);
        }
        let p = self.opt.device_params(&self.specs).download()?;
        Ok(self.host.get_or_init(|| p))
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
    pub fn gradients(&mut self) -> Result<(f64, StepGrads), TrainError> {
        let (mbs, _) = self.sample()?;
        let (out, labelled) = self.forward_backward(&mbs)?;
        let loss = out.losses.iter().sum::<f64>() / labelled as f64;
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
        let out = if self.options.pipelined {
            self.exec.run_pipelined(&mut self.stages, mbs)?
        } else {
            self.exec.run_unpipelined(&mut self.stages, mbs)?
        };
        self.last_mtp_loss = self.mtp_loss(mbs.len(), labelled)?;
        Ok((out, labelled))
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
        let (out, labelled) = self.forward_backward(mbs)?;
        let loss = out.losses.iter().sum::<f64>() / labelled as f64;
        for (i, l) in out.losses.iter().enumerate() {
            let site = || Site {
                step: self.step,
                layer: None,
                tensor: format!("loss of micro-batch {i}"),
            };
            check_finite(site, &[*l as f32])?;
        }
        self.last_t0 = Some(out.t0);
        let opt_start = out.t0.elapsed().as_secs_f64();
        let grad_norm = self.apply_update()?;
        let opt_end = out.t0.elapsed().as_secs_f64();
        let mut spans = out.spans;
        // one optimizer span per pipeline rank, on its devices (those of stage `rank`)
        spans.extend((0..self.exec.schedule.num_ranks()).map(|r| Span {
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
        for (i, spec) in self.specs.iter().enumerate() {
            if !optim::is_adamw(spec.kind) {
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
        let norm = self.opt.step(&grads, &hyper)?;
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
        for (s, stage) in self.stages.iter_mut().enumerate() {
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
        let dev = &self.stages[s].devices()[0];
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
        let ep = self.cfg.parallel.ep as usize;
        let (mut sum, mut labelled) = (0.0f64, 0usize);
        for (i, b) in batches.iter().enumerate() {
            let mb = layout::micro_batch(i, b, ep)?;
            labelled += mb.labelled();
            sum += self.exec.forward_only(&mut self.stages, &mb)?;
        }
        // the expert loads counted by these forwards must not move the biases
        for s in &mut self.stages {
            s.take_grads()?;
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
        self.valid_curve.push((self.step as u32, loss));
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
        let devices: Vec<_> = self.stages.iter().map(|s| s.devices().to_vec()).collect();
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
