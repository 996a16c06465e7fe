//! The optimizer step on the devices: per stage, the FP32 master weights of the parameters it
//! owns (the route biases included) live on the stage's first device, with the BF16 AdamW
//! moments of the AdamW ones. A step uploads the gradients, computes each device group's
//! gradient norm (`kernels::train::optim::grad_norm`), combines them into the global norm on
//! the first group's device (`kernels::train::balance::grad_norm_combine`: each group's norm
//! copied there, an f64 sum of squares in stage order, one rounding to f32: the former host
//! combine's bits), copies it back to every group and runs `adamw_step` (clip inside the
//! kernel) on each tensor. The MoE biases follow the aux-loss-free rule on their device
//! (`kernels::train::balance::moe_bias_update`). The weights stay on the devices: the stages
//! reload from [`DeviceParams`]; host copies are made only on request ([`Optimizer::download`]:
//! checkpoints, [`crate::train::Trainer::params`]).
//!
//! Across processes each process's optimizer holds its own stages' groups
//! ([`Optimizer::for_stages`]); the per-stage norms are exchanged and every process runs the same
//! stage-order combine ([`Optimizer::step_with`]), so the clip is bit-identical to one process's.

use crate::params::{ParamKind, ParamSpec, Params};
use crate::TrainError;
use half::bf16;
use kernels::train::balance::{grad_norm_combine, moe_bias_update};
use kernels::train::optim::{adamw_step, grad_norm, grad_norm_workspace, AdamWConfig, ParamState};
use runtime::{Buffer, Device, Stream};

/// An AdamW parameter's gradient and moments.
struct Adam {
    g: Buffer<f32>,
    m: Buffer<bf16>,
    v: Buffer<bf16>,
}

/// One parameter tensor's device state.
struct Slot {
    /// Index into [`Params`].
    index: usize,
    decays: bool,
    p: Buffer<f32>,
    /// `None` for a route bias (not a gradient parameter).
    adam: Option<Adam>,
}

/// The tensors of one stage, on one device.
struct Group {
    /// The stage (its norm's place in the combine).
    stage: usize,
    stream: Stream,
    slots: Vec<Slot>,
    work: Buffer<f32>,
    norm: Buffer<f32>,
}

/// The global-norm combine on the first group's device: each group's norm lands in its own
/// buffer there; `acc` is the f64 running sum, `out` the global norm.
struct Combine {
    stream: Stream,
    landing: Vec<Buffer<f32>>,
    acc: Buffer<f64>,
    out: Buffer<f32>,
}

/// Hyper-parameters of one step.
#[derive(Clone, Copy, Debug)]
pub struct StepHyper {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// Global-norm clip (`None`: no clip).
    pub clip: Option<f32>,
    /// 1-based step (bias correction).
    pub step: u32,
}

/// One parameter's AdamW moments (BF16, as stored on the device).
pub struct Moments {
    /// Index into [`Params`].
    pub index: usize,
    pub m: Vec<bf16>,
    pub v: Vec<bf16>,
}

/// The FP32 master weights of every parameter on the devices the optimizer keeps them on (each
/// on its owning stage's first device): what a stage reloads from after a step
/// ([`crate::stage::Stage::load_device_params`]).
pub struct DeviceParams<'a> {
    specs: &'a [ParamSpec],
    bufs: Vec<Option<&'a Buffer<f32>>>,
}

impl<'a> DeviceParams<'a> {
    /// Every parameter's spec, in [`crate::params::specs`] order.
    pub fn specs(&self) -> &'a [ParamSpec] {
        self.specs
    }

    /// Parameter `name`'s FP32 master weights (on its owner's device).
    pub fn get(&self, name: &str) -> Result<&'a Buffer<f32>, TrainError> {
        let i = self.specs.iter().position(|s| s.name == name);
        i.and_then(|i| self.bufs[i])
            .ok_or_else(|| TrainError::Shape(format!("no device copy of parameter `{name}`")))
    }

    /// Host copies of every parameter (a download: checkpoints, and stages without a device
    /// reload).
    pub fn download(&self) -> Result<Params, TrainError> {
        let data = self
            .specs
            .iter()
            .zip(&self.bufs)
            .map(|(s, b)| match b {
                Some(b) => Ok(b.to_vec()?),
                None => Err(TrainError::Shape(format!(
                    "no device copy of parameter `{}`",
                    s.name
                ))),
            })
            .collect::<Result<_, TrainError>>()?;
        Ok(Params {
            specs: self.specs.to_vec(),
            data,
        })
    }
}

/// Optimizer state of every parameter, grouped per stage on that stage's device.
pub struct Optimizer {
    groups: Vec<Group>,
    combine: Combine,
}

/// Across processes: gives this process's `(stage, norm)` pairs to the others and returns every
/// stage's norm in stage order.
pub type NormExchange<'a> = dyn Fn(&[(usize, f32)]) -> Result<Vec<f32>, TrainError> + 'a;

/// Whether a parameter is updated by AdamW (the route biases are not).
pub fn is_adamw(kind: ParamKind) -> bool {
    kind != ParamKind::RouteBias
}

fn adam_state(dev: &Device, n: usize) -> Result<Adam, TrainError> {
    let m = dev.alloc::<bf16>(n)?;
    let v = dev.alloc::<bf16>(n)?;
    m.fill(bf16::ZERO)?;
    v.fill(bf16::ZERO)?;
    Ok(Adam {
        g: dev.alloc::<f32>(n)?,
        m,
        v,
    })
}

/// `dst` (on `st`'s device) = `src` (on any device of the same backend).
fn device_copy<T: runtime::Pod>(
    st: &Stream,
    src: &Buffer<T>,
    dst: &Buffer<T>,
) -> Result<(), TrainError> {
    if !src.device().same(st.device()) {
        src.peer_ptr(st.device())?;
    }
    st.copy_bytes(src, dst)?;
    Ok(())
}

impl Optimizer {
    /// Uploads `params` (those among `owners[s]`) to `devices[s]`, moments zero.
    pub fn new(
        params: &Params,
        owners: &[Vec<usize>],
        devices: &[Device],
    ) -> Result<Optimizer, TrainError> {
        let stages: Vec<usize> = (0..owners.len()).collect();
        Optimizer::for_stages(params, &stages, owners, devices, owners.len())
    }

    /// The optimizer of some of the `total` stages (one process's, across processes): group `k`
    /// is stage `stages[k]`, owning `owners[k]` on `devices[k]`.
    pub fn for_stages(
        params: &Params,
        stages: &[usize],
        owners: &[Vec<usize>],
        devices: &[Device],
        total: usize,
    ) -> Result<Optimizer, TrainError> {
        if stages.len() != owners.len() || stages.iter().any(|&s| s >= total) {
            return Err(TrainError::Shape(format!(
                "optimizer: stages {stages:?} of {total} for {} owner lists",
                owners.len()
            )));
        }
        let mut groups = Vec::with_capacity(owners.len());
        for ((own, dev), &stage) in owners.iter().zip(devices).zip(stages) {
            let mut slots = Vec::new();
            for &i in own {
                let spec = &params.specs[i];
                let adam = match is_adamw(spec.kind) {
                    true => Some(adam_state(dev, params.data[i].len())?),
                    false => None,
                };
                slots.push(Slot {
                    index: i,
                    decays: spec.decays(),
                    p: dev.upload(&params.data[i])?,
                    adam,
                });
            }
            let lens: Vec<usize> = slots
                .iter()
                .filter(|s| s.adam.is_some())
                .map(|s| s.p.len())
                .collect();
            groups.push(Group {
                stage,
                work: dev.alloc::<f32>(grad_norm_workspace(&lens))?,
                norm: dev.alloc::<f32>(1)?,
                stream: dev.stream(0),
                slots,
            });
        }
        let first = devices
            .first()
            .ok_or_else(|| TrainError::Shape("an optimizer without stages".into()))?;
        let combine = Combine {
            stream: first.stream(0),
            landing: (0..total)
                .map(|_| first.alloc::<f32>(1))
                .collect::<Result<_, _>>()?,
            acc: first.alloc::<f64>(1)?,
            out: first.alloc::<f32>(1)?,
        };
        Ok(Optimizer { groups, combine })
    }

    /// One clipped AdamW step with `grads[i]` the gradient of parameter `i` (every AdamW
    /// parameter present); returns the global gradient norm (before clipping).
    pub fn step(&mut self, grads: &[Option<Vec<f32>>], h: &StepHyper) -> Result<f32, TrainError> {
        self.step_with(grads, h, None)
    }

    /// [`Optimizer::step`] of one process's stages: `exchange` gathers every stage's norm, which
    /// every process combines in stage order as [`Optimizer::step`] does (the same bits).
    pub fn step_with(
        &mut self,
        grads: &[Option<Vec<f32>>],
        h: &StepHyper,
        exchange: Option<&NormExchange<'_>>,
    ) -> Result<f32, TrainError> {
        for g in &mut self.groups {
            for (s, a) in g.slots.iter().filter_map(|s| Some((s, s.adam.as_ref()?))) {
                let data = grads[s.index].as_deref().ok_or_else(|| {
                    TrainError::Shape(format!("no gradient for parameter {}", s.index))
                })?;
                g.stream.copy_to_device(&a.g, data)?;
            }
            let refs: Vec<&Buffer<f32>> = g
                .slots
                .iter()
                .filter_map(|s| s.adam.as_ref().map(|a| &a.g))
                .collect();
            grad_norm(&g.stream, &refs, &mut g.work, &mut g.norm)?;
        }
        match exchange {
            None => self.combine_norms()?,
            Some(x) => self.combine_exchanged(x)?,
        }
        for g in &mut self.groups {
            for s in &mut g.slots {
                let Some(a) = s.adam.as_mut() else { continue };
                let cfg = AdamWConfig {
                    lr: h.lr,
                    beta1: h.beta1,
                    beta2: h.beta2,
                    eps: h.eps,
                    weight_decay: if s.decays { h.weight_decay } else { 0.0 },
                    step: h.step,
                    clip: h.clip,
                };
                let st = ParamState {
                    p: &mut s.p,
                    g: &a.g,
                    m: &mut a.m,
                    v: &mut a.v,
                };
                adamw_step(&g.stream, &cfg, st, Some(&g.norm))?;
            }
            g.stream.synchronize()?;
        }
        // the report's scalar
        Ok(self.combine.stream.read(&self.combine.out)?[0])
    }

    /// The groups' norms (their streams' `grad_norm` results) combined on the first group's
    /// device in stage order; the global norm copied back into every group's norm buffer.
    fn combine_norms(&mut self) -> Result<(), TrainError> {
        let c = &mut self.combine;
        for g in &self.groups {
            g.stream.synchronize()?;
            device_copy(&c.stream, &g.norm, &c.landing[g.stage])?;
        }
        self.combine_landed()
    }

    /// Across processes: this process's group norms read back and exchanged; every stage's norm
    /// uploaded to its landing buffer (the f32 bits a device copy would have put there).
    fn combine_exchanged(&mut self, exchange: &NormExchange<'_>) -> Result<(), TrainError> {
        let mine = self
            .groups
            .iter()
            .map(|g| Ok((g.stage, g.stream.read(&g.norm)?[0])))
            .collect::<Result<Vec<_>, TrainError>>()?;
        let all = exchange(&mine)?;
        let c = &self.combine;
        if all.len() != c.landing.len() {
            return Err(TrainError::Shape(format!(
                "gradient norms of {} stages for {}",
                all.len(),
                c.landing.len()
            )));
        }
        for (land, n) in c.landing.iter().zip(&all) {
            c.stream.copy_to_device(land, &[*n])?;
        }
        self.combine_landed()
    }

    /// The landed norms combined (stage order) and the global norm copied to every group.
    fn combine_landed(&mut self) -> Result<(), TrainError> {
        let c = &mut self.combine;
        let refs: Vec<&Buffer<f32>> = c.landing.iter().collect();
        grad_norm_combine(&c.stream, &refs, &mut c.acc, &mut c.out)?;
        for g in &self.groups {
            // the copy runs on the combining device: it must reach the group's memory
            if !g.norm.device().same(c.stream.device()) {
                g.norm.peer_ptr(c.stream.device())?;
            }
            c.stream.copy_bytes(&c.out, &g.norm)?;
        }
        c.stream.synchronize()?;
        Ok(())
    }

    /// Applies the aux-loss-free rule to route-bias parameter `index` on its device:
    /// `bias += speed * sign(mean(load) - load)` (`load`: tokens per expert in the step).
    pub fn update_bias(
        &mut self,
        index: usize,
        load: &[u64],
        speed: f32,
    ) -> Result<(), TrainError> {
        let (g, s) = self
            .groups
            .iter_mut()
            .find_map(|g| {
                let k = g
                    .slots
                    .iter()
                    .position(|s| s.index == index && s.adam.is_none())?;
                Some((&g.stream, &mut g.slots[k]))
            })
            .ok_or_else(|| TrainError::Shape(format!("parameter {index} is not a route bias")))?;
        if load.len() != s.p.len() {
            return Err(TrainError::Shape(format!(
                "route bias {index}: {} expert loads for {} experts",
                load.len(),
                s.p.len()
            )));
        }
        let l32 = load
            .iter()
            .map(|&l| u32::try_from(l))
            .collect::<Result<Vec<u32>, _>>()
            .map_err(|_| TrainError::Shape(format!("route bias {index}: a load above 2^32")))?;
        let lb = g.device().upload(&l32)?;
        moe_bias_update(g, &mut s.p, &lb, speed)?;
        g.synchronize()?;
        Ok(())
    }

    /// Every parameter's master weights where they live (see [`DeviceParams`]).
    pub fn device_params<'a>(&'a self, specs: &'a [ParamSpec]) -> DeviceParams<'a> {
        let mut bufs = vec![None; specs.len()];
        for s in self.groups.iter().flat_map(|g| &g.slots) {
            if let Some(b) = bufs.get_mut(s.index) {
                *b = Some(&s.p);
            }
        }
        DeviceParams { specs, bufs }
    }

    /// Reads the master weights (and route biases) back into `params`.
    pub fn download(&self, params: &mut Params) -> Result<(), TrainError> {
        for g in &self.groups {
            for s in &g.slots {
                params.data[s.index] = g.stream.read(&s.p)?;
            }
        }
        Ok(())
    }

    /// Every AdamW parameter's moments.
    pub fn moments(&self) -> Result<Vec<Moments>, TrainError> {
        let mut out = Vec::new();
        for g in &self.groups {
            for (s, a) in g.slots.iter().filter_map(|s| Some((s, s.adam.as_ref()?))) {
                out.push(Moments {
                    index: s.index,
                    m: g.stream.read(&a.m)?,
                    v: g.stream.read(&a.v)?,
                });
            }
        }
        Ok(out)
    }

    /// Restores master weights, route biases and moments (resume). `moments(i)` gives AdamW
    /// parameter `i`'s (m, v).
    pub fn restore(
        &mut self,
        params: &Params,
        moments: &dyn Fn(usize) -> Result<(Vec<bf16>, Vec<bf16>), TrainError>,
    ) -> Result<(), TrainError> {
        for g in &mut self.groups {
            for s in &mut g.slots {
                s.p.copy_from_host(&params.data[s.index])?;
                if let Some(a) = &mut s.adam {
                    let (m, v) = moments(s.index)?;
                    a.m.copy_from_host(&m)?;
                    a.v.copy_from_host(&v)?;
                }
            }
        }
        Ok(())
    }
}
