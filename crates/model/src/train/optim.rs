//! The optimizer step on the devices: per stage, the FP32 master weights of the parameters it
//! owns and their BF16 AdamW moments live on the stage's first device; a step uploads the
//! gradients, computes each device group's gradient norm (`kernels::train::optim::grad_norm`),
//! combines them into the global norm on the host (f64 sum of squares, in stage order), writes
//! it back to every group and runs `adamw_step` (clip inside the kernel) on each tensor, then
//! reads the weights back. The MoE biases follow the aux-loss-free rule on the host.

use crate::params::{ParamKind, Params};
use crate::TrainError;
use half::bf16;
use kernels::train::optim::{adamw_step, grad_norm, grad_norm_workspace, AdamWConfig, ParamState};
use runtime::{Buffer, Device, Stream};

/// One parameter tensor's device state.
struct Slot {
    /// Index into [`Params`].
    index: usize,
    decays: bool,
    p: Buffer<f32>,
    g: Buffer<f32>,
    m: Buffer<bf16>,
    v: Buffer<bf16>,
}

/// The tensors of one stage, on one device.
struct Group {
    stream: Stream,
    slots: Vec<Slot>,
    work: Buffer<f32>,
    norm: Buffer<f32>,
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

/// AdamW state of every AdamW parameter, grouped per stage on that stage's device.
pub struct Optimizer {
    groups: Vec<Group>,
}

/// Whether a parameter is updated by AdamW (the route biases are not).
pub fn is_adamw(kind: ParamKind) -> bool {
    kind != ParamKind::RouteBias
}

impl Optimizer {
    /// Uploads `params` (the AdamW ones among `owners[s]`) to `devices[s]`, moments zero.
    pub fn new(
        params: &Params,
        owners: &[Vec<usize>],
        devices: &[Device],
    ) -> Result<Optimizer, TrainError> {
        let mut groups = Vec::with_capacity(owners.len());
        for (own, dev) in owners.iter().zip(devices) {
            let stream = dev.stream(0);
            let mut slots = Vec::new();
            for &i in own.iter().filter(|&&i| is_adamw(params.specs[i].kind)) {
                let n = params.data[i].len();
                let m = dev.alloc::<bf16>(n)?;
                let v = dev.alloc::<bf16>(n)?;
                m.fill(bf16::ZERO)?;
                v.fill(bf16::ZERO)?;
                slots.push(Slot {
                    index: i,
                    decays: params.specs[i].decays(),
                    p: dev.upload(&params.data[i])?,
                    g: dev.alloc::<f32>(n)?,
                    m,
                    v,
                });
            }
            let lens: Vec<usize> = slots.iter().map(|s| s.p.len()).collect();
            groups.push(Group {
                work: dev.alloc::<f32>(grad_norm_workspace(&lens))?,
                norm: dev.alloc::<f32>(1)?,
                stream,
                slots,
            });
        }
        Ok(Optimizer { groups })
    }

    /// One clipped AdamW step with `grads[i]` the gradient of parameter `i` (every AdamW
    /// parameter present); returns the global gradient norm (before clipping).
    pub fn step(&mut self, grads: &[Option<Vec<f32>>], h: &StepHyper) -> Result<f32, TrainError> {
        let mut sumsq = 0.0f64;
        for g in &mut self.groups {
            for s in &g.slots {
                let data = grads[s.index].as_deref().ok_or_else(|| {
                    TrainError::Shape(format!("no gradient for parameter {}", s.index))
                })?;
                g.stream.copy_to_device(&s.g, data)?;
            }
            let refs: Vec<&Buffer<f32>> = g.slots.iter().map(|s| &s.g).collect();
            grad_norm(&g.stream, &refs, &mut g.work, &mut g.norm)?;
            let n = g.stream.read(&g.norm)?[0] as f64;
            sumsq += n * n;
        }
        let norm = sumsq.sqrt() as f32;
        for g in &mut self.groups {
            g.stream.copy_to_device(&g.norm, &[norm])?;
            for s in &mut g.slots {
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
                    g: &s.g,
                    m: &mut s.m,
                    v: &mut s.v,
                };
                adamw_step(&g.stream, &cfg, st, Some(&g.norm))?;
            }
            g.stream.synchronize()?;
        }
        Ok(norm)
    }

    /// Reads the master weights back into `params`.
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
            for s in &g.slots {
                out.push(Moments {
                    index: s.index,
                    m: g.stream.read(&s.m)?,
                    v: g.stream.read(&s.v)?,
                });
            }
        }
        Ok(out)
    }

    /// Restores master weights and moments (resume). `moments(i)` gives parameter `i`'s (m, v).
    pub fn restore(
        &mut self,
        params: &Params,
        moments: &dyn Fn(usize) -> Result<(Vec<bf16>, Vec<bf16>), TrainError>,
    ) -> Result<(), TrainError> {
        for g in &mut self.groups {
            for s in &mut g.slots {
                let (m, v) = moments(s.index)?;
                s.p.copy_from_host(&params.data[s.index])?;
                s.m.copy_from_host(&m)?;
                s.v.copy_from_host(&v)?;
            }
        }
        Ok(())
    }
}

/// The aux-loss-free bias update of one MoE layer: `bias_e += speed * sign(mean - load_e)`
/// (f32; `sign(0) = 0`), `mean` the average load over the layer's experts.
pub fn update_bias(bias: &mut [f32], load: &[u64], speed: f32) {
    let total: u64 = load.iter().sum();
    let mean = total as f64 / load.len().max(1) as f64;
    for (b, &l) in bias.iter_mut().zip(load) {
        let d = mean - l as f64;
        let sign = if d > 0.0 {
            1.0
        } else if d < 0.0 {
            -1.0
        } else {
            0.0
        };
        *b += speed * sign;
    }
}
