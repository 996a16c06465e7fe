//! The executor: runs a verified [`Schedule`] for real.
//!
//! One worker thread per device owns the stages the layout gives it of a small MLP (one
//! `tanh(W x + b)` layer per stage; the last stage adds a squared-error loss). Workers run
//! their ops in schedule order and pass activations (forward) and input gradients (backward)
//! over channels — non-blocking sends, blocking receives, exactly the verifier's model.
//! A split backward runs `I` (input gradient, sent on at once) and parks what `W` needs in
//! a per-worker **W store** until the schedule's `W` pass computes the weight gradient.
//! An overlapped F&B op runs its two passes one after the other: overlap is a timing notion.
//!
//! Exactness: each micro-batch's weight-gradient contribution is kept apart and all
//! contributions (and losses) are reduced in one fixed order — chain, then micro-batch —
//! both here and in the unpipelined reference. Every per-micro-batch computation is the same
//! f32 arithmetic in both, so the pipelined loss and gradients are **bit-identical** to the
//! reference, whatever the schedule's execution order. In DualPipe both directions use the
//! same layer weights, held twice (rank `s` for direction 0, rank `PP-1-s` for direction 1);
//! their gradients are summed, again in the fixed order.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::schedule::{PassKind, Schedule, StageRef};
use crate::verify::verify;
use crate::ScheduleError;

/// Size of the model and data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecConfig {
    /// Width of every layer.
    pub width: usize,
    /// Rows per micro-batch.
    pub batch: usize,
    /// Seed of the deterministic weights and data.
    pub seed: u64,
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            width: 8,
            batch: 2,
            seed: 7,
        }
    }
}

/// Weight and bias gradient of one layer (row-major `width x width`, and `width`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerGrad {
    pub w: Vec<f32>,
    pub b: Vec<f32>,
}

/// Result of a training step: total loss and per-layer gradients.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepResult {
    pub loss: f32,
    pub grads: Vec<LayerGrad>,
}

/// Pipelined step compared with the reference.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecCheck {
    pub workers: usize,
    pub loss: f32,
    pub reference_loss: f32,
    pub max_grad_diff: f32,
    /// Loss and every gradient element bit-identical.
    pub exact: bool,
}

/// Tiny deterministic generator (SplitMix64) so weights and data need no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// One layer's parameters.
#[derive(Clone, Debug)]
struct Layer {
    w: Vec<f32>,
    b: Vec<f32>,
}

/// Model and data of a step, derived from the config and the schedule's shape.
struct Problem {
    width: usize,
    batch: usize,
    layers: Vec<Layer>,
    /// Per (chain, mb): input and target, `batch x width`.
    data: HashMap<(usize, usize), (Vec<f32>, Vec<f32>)>,
}

impl Problem {
    fn new(cfg: &ExecConfig, layers: usize, chains: usize, mbs: usize) -> Problem {
        let mut rng = Rng(cfg.seed);
        let d = cfg.width;
        let scale = 1.0 / (d as f32).sqrt();
        let layers = (0..layers)
            .map(|_| Layer {
                w: (0..d * d).map(|_| rng.next() * scale).collect(),
                b: (0..d).map(|_| rng.next() * 0.1).collect(),
            })
            .collect();
        let mut data = HashMap::new();
        for c in 0..chains {
            for m in 0..mbs {
                let x = (0..cfg.batch * d).map(|_| rng.next()).collect();
                let t = (0..cfg.batch * d).map(|_| rng.next() * 0.5).collect();
                data.insert((c, m), (x, t));
            }
        }
        Problem {
            width: d,
            batch: cfg.batch,
            layers,
            data,
        }
    }
}

/// `y = tanh(x W^T + b)`.
fn layer_forward(l: &Layer, x: &[f32], batch: usize, d: usize) -> Vec<f32> {
    let mut y = vec![0.0f32; batch * d];
    for r in 0..batch {
        for o in 0..d {
            let mut acc = l.b[o];
            for i in 0..d {
                acc += x[r * d + i] * l.w[o * d + i];
            }
            y[r * d + o] = acc.tanh();
        }
    }
    y
}

/// Loss `0.5 * sum((y - t)^2)` and its gradient `y - t`.
fn loss_and_grad(y: &[f32], t: &[f32]) -> (f32, Vec<f32>) {
    let mut loss = 0.0f32;
    let g: Vec<f32> = y
        .iter()
        .zip(t)
        .map(|(a, b)| {
            let e = a - b;
            loss += 0.5 * e * e;
            e
        })
        .collect();
    (loss, g)
}

/// Input-gradient half of the backward: returns `dz` (kept for W) and `dx` (sent on).
fn layer_backward_input(
    l: &Layer,
    y: &[f32],
    dy: &[f32],
    batch: usize,
    d: usize,
) -> (Vec<f32>, Vec<f32>) {
    let dz: Vec<f32> = y.iter().zip(dy).map(|(y, g)| g * (1.0 - y * y)).collect();
    let mut dx = vec![0.0f32; batch * d];
    for r in 0..batch {
        for i in 0..d {
            let mut acc = 0.0f32;
            for o in 0..d {
                acc += dz[r * d + o] * l.w[o * d + i];
            }
            dx[r * d + i] = acc;
        }
    }
    (dz, dx)
}

/// Weight-gradient half: `dW = dz^T x`, `db = sum_rows dz`.
fn layer_backward_weight(x: &[f32], dz: &[f32], batch: usize, d: usize) -> LayerGrad {
    let mut w = vec![0.0f32; d * d];
    let mut b = vec![0.0f32; d];
    for r in 0..batch {
        for o in 0..d {
            b[o] += dz[r * d + o];
            for i in 0..d {
                w[o * d + i] += dz[r * d + o] * x[r * d + i];
            }
        }
    }
    LayerGrad { w, b }
}

/// Sum per-micro-batch contributions in (chain, mb) order — the order fixes the f32 result.
fn reduce(
    layers: usize,
    d: usize,
    losses: &HashMap<(usize, usize), f32>,
    grads: &HashMap<(usize, usize, usize), LayerGrad>,
    chains: usize,
    mbs: usize,
) -> StepResult {
    let mut loss = 0.0f32;
    for c in 0..chains {
        for m in 0..mbs {
            loss += losses[&(c, m)];
        }
    }
    let out = (0..layers)
        .map(|s| {
            let mut acc = LayerGrad {
                w: vec![0.0; d * d],
                b: vec![0.0; d],
            };
            for c in 0..chains {
                for m in 0..mbs {
                    let g = &grads[&(c, m, s)];
                    acc.w.iter_mut().zip(&g.w).for_each(|(a, v)| *a += v);
                    acc.b.iter_mut().zip(&g.b).for_each(|(a, v)| *a += v);
                }
            }
            acc
        })
        .collect();
    StepResult { loss, grads: out }
}

/// The model layer a stage runs: for every layout, stage `s` of any chain is layer `s`.
fn layer_of(stage: usize) -> usize {
    stage
}

/// The unpipelined step: every micro-batch forward through all layers, then backward.
pub fn reference_step(s: &Schedule, cfg: &ExecConfig) -> StepResult {
    let (chains, mbs, stages) = (s.num_chains(), s.mbs_per_chain(), s.num_stages());
    let p = Problem::new(cfg, stages, chains, mbs);
    let (d, bt) = (p.width, p.batch);
    let mut losses = HashMap::new();
    let mut grads = HashMap::new();
    for c in 0..chains {
        for m in 0..mbs {
            let (x, t) = &p.data[&(c, m)];
            let mut acts = vec![x.clone()];
            for st in 0..stages {
                let y = layer_forward(&p.layers[layer_of(st)], &acts[st], bt, d);
                acts.push(y);
            }
            let (loss, mut dy) = loss_and_grad(&acts[stages], t);
            losses.insert((c, m), loss);
            for st in (0..stages).rev() {
                let l = &p.layers[layer_of(st)];
                let (dz, dx) = layer_backward_input(l, &acts[st + 1], &dy, bt, d);
                grads.insert(
                    (c, m, layer_of(st)),
                    layer_backward_weight(&acts[st], &dz, bt, d),
                );
                dy = dx;
            }
        }
    }
    reduce(stages, d, &losses, &grads, chains, mbs)
}

enum Msg {
    /// Activation for stage `to.stage` (forward direction).
    Act(StageRef, Vec<f32>),
    /// Gradient w.r.t. the output of stage `to.stage` (backward direction).
    Grad(StageRef, Vec<f32>),
}

/// What one worker returns: per-(chain, mb) losses it computed and per-(chain, mb, layer)
/// weight gradients.
type WorkerOut = (
    HashMap<(usize, usize), f32>,
    HashMap<(usize, usize, usize), LayerGrad>,
);

struct Worker<'a> {
    rank: usize,
    s: &'a Schedule,
    p: &'a Problem,
    /// This device's own copy of the layers it holds (2 copies' worth for DualPipe).
    params: HashMap<usize, Layer>,
    rx: Receiver<Msg>,
    tx: Vec<Sender<Msg>>,
    /// Messages received before they were needed.
    inbox_act: HashMap<StageRef, Vec<f32>>,
    inbox_grad: HashMap<StageRef, Vec<f32>>,
    /// Per stage-of-micro-batch: (input, output) kept from F for the backward.
    saved: HashMap<StageRef, (Vec<f32>, Vec<f32>)>,
    /// The W store: (input, dz) parked by I until the W pass.
    w_store: HashMap<StageRef, (Vec<f32>, Vec<f32>)>,
    losses: HashMap<(usize, usize), f32>,
    grads: HashMap<(usize, usize, usize), LayerGrad>,
    /// Output gradients of last stages, produced by F's loss for the B/I that follows.
    loss_grads: HashMap<StageRef, Vec<f32>>,
}

const RECV_TIMEOUT: Duration = Duration::from_secs(20);

impl Worker<'_> {
    fn wait(&mut self, want: StageRef, act: bool) -> Result<Vec<f32>, ScheduleError> {
        loop {
            let have = if act {
                self.inbox_act.remove(&want)
            } else {
                self.inbox_grad.remove(&want)
            };
            if let Some(v) = have {
                return Ok(v);
            }
            match self.rx.recv_timeout(RECV_TIMEOUT) {
                Ok(Msg::Act(k, v)) => {
                    self.inbox_act.insert(k, v);
                }
                Ok(Msg::Grad(k, v)) => {
                    self.inbox_grad.insert(k, v);
                }
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                    return Err(ScheduleError::Exec(format!(
                        "rank {} never received {} for {want:?}",
                        self.rank,
                        if act { "activation" } else { "gradient" }
                    )))
                }
            }
        }
    }

    fn send(&self, msg: Msg) -> Result<(), ScheduleError> {
        let to = match &msg {
            Msg::Act(k, _) | Msg::Grad(k, _) => self.s.rank_of(k.chain, k.stage),
        };
        self.tx[to]
            .send(msg)
            .map_err(|_| ScheduleError::Exec(format!("rank {to} hung up")))
    }

    fn forward(&mut self, at: StageRef) -> Result<(), ScheduleError> {
        let (d, bt) = (self.p.width, self.p.batch);
        let x = if at.stage == 0 {
            self.p.data[&(at.chain, at.mb)].0.clone()
        } else {
            self.wait(at, true)?
        };
        let y = layer_forward(&self.params[&layer_of(at.stage)], &x, bt, d);
        if at.stage + 1 == self.s.num_stages() {
            let (loss, g) = loss_and_grad(&y, &self.p.data[&(at.chain, at.mb)].1);
            self.losses.insert((at.chain, at.mb), loss);
            self.loss_grads.insert(at, g);
        } else {
            self.send(Msg::Act(
                StageRef {
                    stage: at.stage + 1,
                    ..at
                },
                y.clone(),
            ))?;
        }
        self.saved.insert(at, (x, y));
        Ok(())
    }

    fn backward_input(&mut self, at: StageRef) -> Result<(), ScheduleError> {
        let (d, bt) = (self.p.width, self.p.batch);
        let dy = match self.loss_grads.remove(&at) {
            Some(g) => g,
            None => self.wait(at, false)?,
        };
        let (x, y) = self
            .saved
            .remove(&at)
            .ok_or_else(|| ScheduleError::Exec(format!("backward before forward at {at:?}")))?;
        let (dz, dx) = layer_backward_input(&self.params[&layer_of(at.stage)], &y, &dy, bt, d);
        if at.stage > 0 {
            self.send(Msg::Grad(
                StageRef {
                    stage: at.stage - 1,
                    ..at
                },
                dx,
            ))?;
        }
        self.w_store.insert(at, (x, dz));
        Ok(())
    }

    fn backward_weight(&mut self, at: StageRef) -> Result<(), ScheduleError> {
        let (x, dz) = self
            .w_store
            .remove(&at)
            .ok_or_else(|| ScheduleError::Exec(format!("W before its I at {at:?}")))?;
        let g = layer_backward_weight(&x, &dz, self.p.batch, self.p.width);
        self.grads.insert((at.chain, at.mb, layer_of(at.stage)), g);
        Ok(())
    }

    fn run(mut self) -> Result<WorkerOut, ScheduleError> {
        let s = self.s;
        for op in &s.ranks[self.rank] {
            for p in &op.passes {
                let (chain, stage) = s.locate(self.rank, p.dir).ok_or_else(|| {
                    ScheduleError::Exec(format!("bad dir {} on rank {}", p.dir, self.rank))
                })?;
                let at = StageRef {
                    chain,
                    mb: p.mb,
                    stage,
                };
                match p.kind {
                    PassKind::F => self.forward(at)?,
                    PassKind::B => {
                        self.backward_input(at)?;
                        self.backward_weight(at)?;
                    }
                    PassKind::I => self.backward_input(at)?,
                    PassKind::W => self.backward_weight(at)?,
                }
            }
        }
        if !self.w_store.is_empty() || !self.saved.is_empty() {
            return Err(ScheduleError::Exec(format!(
                "rank {} finished with unconsumed state",
                self.rank
            )));
        }
        Ok((self.losses, self.grads))
    }
}

/// Run `s` on one thread per device and return the step's loss and gradients.
/// The schedule is verified first; an invalid one is refused, never run.
pub fn execute(s: &Schedule, cfg: &ExecConfig) -> Result<StepResult, ScheduleError> {
    if cfg.width == 0 || cfg.batch == 0 {
        return Err(ScheduleError::Exec("width and batch must be > 0".into()));
    }
    verify(s)?;
    let (chains, mbs, stages) = (s.num_chains(), s.mbs_per_chain(), s.num_stages());
    let p = Problem::new(cfg, stages, chains, mbs);
    let n = s.num_ranks();
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| channel::<Msg>()).unzip();
    let results: Vec<Result<WorkerOut, ScheduleError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = rxs
            .into_iter()
            .enumerate()
            .map(|(rank, rx)| {
                // Each device copies the parameters of the layers it holds.
                let params = (0..s.dirs_per_rank())
                    .filter_map(|d| s.locate(rank, d))
                    .map(|(_, st)| (layer_of(st), p.layers[layer_of(st)].clone()))
                    .collect();
                let w = Worker {
                    rank,
                    s,
                    p: &p,
                    params,
                    rx,
                    tx: txs.clone(),
                    inbox_act: HashMap::new(),
                    inbox_grad: HashMap::new(),
                    saved: HashMap::new(),
                    w_store: HashMap::new(),
                    losses: HashMap::new(),
                    grads: HashMap::new(),
                    loss_grads: HashMap::new(),
                };
                scope.spawn(move || w.run())
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(ScheduleError::Exec("worker panicked".into())))
            })
            .collect()
    });
    drop(txs);
    let mut losses = HashMap::new();
    let mut grads = HashMap::new();
    for r in results {
        let (l, g) = r?;
        losses.extend(l);
        grads.extend(g);
    }
    if losses.len() != chains * mbs || grads.len() != chains * mbs * stages {
        return Err(ScheduleError::Exec(
            "some micro-batches were not computed".into(),
        ));
    }
    Ok(reduce(stages, p.width, &losses, &grads, chains, mbs))
}

/// Execute `s` and compare with [`reference_step`].
pub fn check_against_reference(s: &Schedule, cfg: &ExecConfig) -> Result<ExecCheck, ScheduleError> {
    let got = execute(s, cfg)?;
    let want = reference_step(s, cfg);
    let mut max = 0.0f32;
    let mut exact = got.loss.to_bits() == want.loss.to_bits();
    for (a, b) in got.grads.iter().zip(&want.grads) {
        for (x, y) in a.w.iter().chain(&a.b).zip(b.w.iter().chain(&b.b)) {
            max = max.max((x - y).abs());
            exact &= x.to_bits() == y.to_bits();
        }
    }
    Ok(ExecCheck {
        workers: s.num_ranks(),
        loss: got.loss,
        reference_loss: want.loss,
        max_grad_diff: max,
        exact,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{generate, Method};

    /// Loss of the whole step with one parameter of one layer nudged.
    fn loss_with(p: &Problem, stages: usize, layer: usize, idx: usize, h: f32) -> f32 {
        let mut layers = p.layers.clone();
        let d = p.width;
        if idx < d * d {
            layers[layer].w[idx] += h;
        } else {
            layers[layer].b[idx - d * d] += h;
        }
        let mut total = 0.0;
        let mut keys: Vec<_> = p.data.keys().copied().collect();
        keys.sort();
        for k in keys {
            let (x, t) = &p.data[&k];
            let mut a = x.clone();
            for l in layers.iter().take(stages) {
                a = layer_forward(l, &a, p.batch, d);
            }
            total += loss_and_grad(&a, t).0;
        }
        total
    }

    #[test]
    fn reference_gradients_match_central_differences() {
        let cfg = ExecConfig {
            width: 4,
            batch: 3,
            seed: 5,
        };
        let s = generate(Method::DualPipe, 4, 8).unwrap();
        let r = reference_step(&s, &cfg);
        let p = Problem::new(&cfg, s.num_stages(), s.num_chains(), s.mbs_per_chain());
        let h = 1e-2f32;
        for layer in 0..4 {
            for idx in [0usize, 5, 15, 16, 19] {
                let num = (loss_with(&p, 4, layer, idx, h) - loss_with(&p, 4, layer, idx, -h))
                    / (2.0 * h);
                let g = &r.grads[layer];
                let ana = if idx < 16 { g.w[idx] } else { g.b[idx - 16] };
                assert!(
                    (num - ana).abs() <= 3e-3 * (1.0 + ana.abs()),
                    "layer {layer} idx {idx}: {num} vs {ana}"
                );
            }
        }
    }
}
