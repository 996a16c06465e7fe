//! The trainer (`model::train`) over host-side mock stages: the DualPipeV executor against the
//! unpipelined order (bit-identical losses and gradients), concurrency of the F&B pairs,
//! boundary placement, bit-exact resume, the non-finite guard, checkpoint refusal, error
//! propagation without deadlock, and learning.
//!
//! The mock stage (`Mock`) is a small f32 model over the real parameter names: the first stage
//! embeds the ids (`embed`), every layer `l` computes `tanh(x wo^T + attn_norm)` with
//! `layers.{l}.attn.wo` `[H, H]` and `attn_norm` as the bias, and the last stage computes the
//! logits with `head` and the summed cross-entropy. Boundaries live in device buffers on the
//! stage's emulated devices (the mock reads them back and checks they are on its own devices);
//! MoE layers report expert loads `id % E` for the bias update. Its backward is the exact f32
//! derivative; its per-micro-batch gradients are summed in index order, as the contract asks.

use model::config::TrainConfig;
use model::data::{self, IGNORE_INDEX};
use model::params::Params;
use model::stage::{
    Boundary, ExpertLoad, MicroBatch, NamedGrads, Stage, StageOut, StageResult, StageSpec,
};
use model::train::{exec::Executor, layout, timing, TrainOptions, Trainer};
use model::TrainError;
use runtime::Device;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Test controls shared by every mock stage of a run.
#[derive(Default)]
struct Ctl {
    /// Boundary buffers checked to be on the receiving stage's devices.
    checked: AtomicUsize,
    /// Sleep in every pass (makes the F&B overlap measurable).
    delay_ms: u64,
    /// (stage, micro-batch) whose forward fails.
    fail: Option<(usize, usize)>,
    /// Poisons one gradient element of `layers.{l}.attn.wo` at the next `take_grads`.
    poison: AtomicBool,
}

/// What a forward keeps per EP rank: each layer's input and output, the ids, and (last
/// stage) the softmax probabilities.
struct Saved {
    /// Per layer (then the head), per EP rank: the input rows.
    xs: Vec<Vec<Vec<f32>>>,
    /// Per layer, per EP rank: the output rows.
    ys: Vec<Vec<Vec<f32>>>,
    probs: Vec<Vec<f32>>,
    labels: Vec<Vec<i32>>,
    ids: Vec<Vec<i32>>,
}

struct Mock {
    spec: StageSpec,
    ctl: Arc<Ctl>,
    h: usize,
    v: usize,
    /// Owned parameters: (index into Params, name, values).
    own: Vec<(usize, String, Vec<f32>)>,
    scale: f32,
    saved: HashMap<usize, Saved>,
    /// Per micro-batch, per owned parameter, its gradient.
    grads: BTreeMap<usize, Vec<Vec<f32>>>,
    loads: BTreeMap<usize, ExpertLoad>,
}

impl Mock {
    fn new(spec: StageSpec, p: &Params, ctl: Arc<Ctl>) -> Mock {
        let own = layout::stage_params(&spec, &p.specs)
            .into_iter()
            .filter(|&i| p.specs[i].kind != model::params::ParamKind::RouteBias)
            .map(|i| (i, p.specs[i].name.clone(), p.data[i].clone()))
            .collect();
        let m = &spec.config.model;
        Mock {
            h: m.hidden as usize,
            v: m.vocab as usize,
            spec,
            ctl,
            own,
            scale: 1.0,
            saved: HashMap::new(),
            grads: BTreeMap::new(),
            loads: BTreeMap::new(),
        }
    }
    fn slot(&self, name: &str) -> usize {
        self.own.iter().position(|o| o.1 == name).expect("owned")
    }
    fn param(&self, name: &str) -> &[f32] {
        &self.own[self.slot(name)].2
    }
    fn read(&self, b: &Boundary) -> StageResult<Vec<Vec<f32>>> {
        let devs = &self.spec.devices;
        if b.ranks.len() != devs.len() {
            return Err(TrainError::Shape("mock: boundary rank count".into()));
        }
        for (buf, d) in b.ranks.iter().zip(devs) {
            if !buf.device().same(d) {
                return Err(TrainError::Shape(format!(
                    "mock stage {}: boundary on device {}, expected {}",
                    self.spec.index,
                    buf.device().index(),
                    d.index()
                )));
            }
            self.ctl.checked.fetch_add(1, Ordering::SeqCst);
        }
        Ok(b.ranks
            .iter()
            .map(|r| r.to_vec())
            .collect::<Result<_, _>>()?)
    }
    fn write(&self, rows: Vec<Vec<f32>>) -> StageResult<Boundary> {
        let ranks = rows
            .iter()
            .zip(&self.spec.devices)
            .map(|(r, d)| d.upload(r))
            .collect::<Result<_, _>>()?;
        Ok(Boundary { ranks })
    }
    fn layer_fwd(&self, l: usize, x: &[f32]) -> Vec<f32> {
        let (w, b, h) = (self.param(&wo(l)), self.param(&norm(l)), self.h);
        let mut y = vec![0.0f32; x.len()];
        for (xr, yr) in x.chunks(h).zip(y.chunks_mut(h)) {
            for o in 0..h {
                let acc: f32 = (0..h).fold(b[o], |a, i| a + xr[i] * w[o * h + i]);
                yr[o] = acc.tanh();
            }
        }
        y
    }
    /// Cross-entropy of one rank: (summed loss, probabilities).
    fn head_fwd(&self, x: &[f32], labels: &[i32]) -> (f64, Vec<f32>) {
        let (w, h, v) = (self.param("head"), self.h, self.v);
        let mut probs = vec![0.0f32; labels.len() * v];
        let mut loss = 0.0f64;
        for (t, (xr, pr)) in x.chunks(h).zip(probs.chunks_mut(v)).enumerate() {
            for (c, p) in pr.iter_mut().enumerate() {
                *p = (0..h).fold(0.0f32, |a, i| a + xr[i] * w[c * h + i]);
            }
            let mx = pr.iter().cloned().fold(f32::MIN, f32::max);
            let z: f32 = pr.iter().map(|p| (p - mx).exp()).sum();
            pr.iter_mut().for_each(|p| *p = (*p - mx).exp() / z);
            if labels[t] != IGNORE_INDEX {
                loss -= (pr[labels[t] as usize] as f64).ln();
            }
        }
        (loss, probs)
    }
    fn moe_loads(&self, mb: &MicroBatch) -> ExpertLoad {
        let m = &self.spec.config.model;
        let e = m.routed_experts as usize;
        self.spec
            .layers
            .clone()
            .filter(|&l| l >= m.dense_layers as usize)
            .map(|l| {
                let mut load = vec![0u64; e];
                mb.inputs
                    .iter()
                    .flatten()
                    .for_each(|&t| load[t as usize % e] += 1);
                (l, load)
            })
            .collect()
    }
}

fn wo(l: usize) -> String {
    format!("layers.{l}.attn.wo")
}
fn norm(l: usize) -> String {
    format!("layers.{l}.attn_norm")
}

impl Mock {
    fn embed_rows(&self, ids: &[i32]) -> Vec<f32> {
        let (e, h) = (self.param("embed"), self.h);
        ids.iter()
            .flat_map(|&t| e[t as usize * h..(t as usize + 1) * h].to_vec())
            .collect()
    }

    /// d(loss)/d(head input) of one rank, accumulating the head's gradient into `gw`.
    fn head_bwd(&self, x: &[f32], probs: &[f32], labels: &[i32], gw: &mut [f32]) -> Vec<f32> {
        let (w, h, v) = (self.param("head"), self.h, self.v);
        let mut dx = vec![0.0f32; x.len()];
        for (t, pr) in probs.chunks(v).enumerate() {
            if labels[t] == IGNORE_INDEX {
                continue;
            }
            for (c, &p) in pr.iter().enumerate() {
                let onehot = if c == labels[t] as usize { 1.0 } else { 0.0 };
                let g = (p - onehot) * self.scale;
                for i in 0..h {
                    gw[c * h + i] += g * x[t * h + i];
                    dx[t * h + i] += g * w[c * h + i];
                }
            }
        }
        dx
    }

    /// One tanh layer's backward of one rank: dx, accumulating dW and db.
    fn layer_bwd(
        &self,
        l: usize,
        x: &[f32],
        y: &[f32],
        dy: &[f32],
        g: (&mut [f32], &mut [f32]),
    ) -> Vec<f32> {
        let (w, h) = (self.param(&wo(l)), self.h);
        let (gw, gb) = g;
        let mut dx = vec![0.0f32; x.len()];
        for t in 0..x.len() / h {
            for o in 0..h {
                let dz = dy[t * h + o] * (1.0 - y[t * h + o] * y[t * h + o]);
                gb[o] += dz;
                for i in 0..h {
                    gw[o * h + i] += dz * x[t * h + i];
                    dx[t * h + i] += dz * w[o * h + i];
                }
            }
        }
        dx
    }
}

impl Stage for Mock {
    fn devices(&self) -> &[Device] {
        &self.spec.devices
    }

    fn forward(&mut self, mb: &MicroBatch, x: Option<Boundary>) -> StageResult<StageOut> {
        std::thread::sleep(Duration::from_millis(self.ctl.delay_ms));
        if self.ctl.fail == Some((self.spec.index, mb.index)) {
            return Err(TrainError::Shape(format!(
                "mock failure in stage {} at micro-batch {}",
                self.spec.index, mb.index
            )));
        }
        let mut cur = match x {
            Some(b) => self.read(&b)?,
            None => mb.inputs.iter().map(|ids| self.embed_rows(ids)).collect(),
        };
        let mut s = Saved {
            xs: vec![],
            ys: vec![],
            probs: vec![],
            labels: mb.labels.clone(),
            ids: mb.inputs.clone(),
        };
        for l in self.spec.layers.clone() {
            let y: Vec<Vec<f32>> = cur.iter().map(|x| self.layer_fwd(l, x)).collect();
            s.xs.push(std::mem::replace(&mut cur, y.clone()));
            s.ys.push(y);
        }
        self.loads.insert(mb.index, self.moe_loads(mb));
        let out = if self.spec.is_last() {
            let mut loss = 0.0;
            for (x, lab) in cur.iter().zip(&mb.labels) {
                let (l, p) = self.head_fwd(x, lab);
                loss += l;
                s.probs.push(p);
            }
            s.xs.push(cur);
            StageOut::Loss(loss)
        } else {
            StageOut::Hidden(self.write(cur)?)
        };
        self.saved.insert(mb.index, s);
        Ok(out)
    }

    fn backward(&mut self, mb: usize, dy: Option<Boundary>) -> StageResult<Option<Boundary>> {
        std::thread::sleep(Duration::from_millis(self.ctl.delay_ms));
        let s = self
            .saved
            .remove(&mb)
            .ok_or_else(|| TrainError::Shape(format!("mock: backward of {mb} before forward")))?;
        let mut g: Vec<Vec<f32>> = self.own.iter().map(|o| vec![0.0; o.2.len()]).collect();
        let n = self.spec.layers.len();
        let mut d: Vec<Vec<f32>> = match dy {
            Some(b) => self.read(&b)?,
            None => {
                let hs = self.slot("head");
                (0..s.probs.len())
                    .map(|r| self.head_bwd(&s.xs[n][r], &s.probs[r], &s.labels[r], &mut g[hs]))
                    .collect()
            }
        };
        for (k, l) in self.spec.layers.clone().enumerate().rev() {
            let (iw, ib) = (self.slot(&wo(l)), self.slot(&norm(l)));
            let (mut gw, mut gb) = (std::mem::take(&mut g[iw]), std::mem::take(&mut g[ib]));
            d = (0..d.len())
                .map(|r| self.layer_bwd(l, &s.xs[k][r], &s.ys[k][r], &d[r], (&mut gw, &mut gb)))
                .collect();
            g[iw] = gw;
            g[ib] = gb;
        }
        if !self.spec.is_first() {
            self.grads.insert(mb, g);
            return Ok(Some(self.write(d)?));
        }
        let (ie, h) = (self.slot("embed"), self.h);
        for (ids, dr) in s.ids.iter().zip(&d) {
            for (t, &id) in ids.iter().enumerate() {
                let row = &mut g[ie][id as usize * h..(id as usize + 1) * h];
                row.iter_mut()
                    .zip(&dr[t * h..(t + 1) * h])
                    .for_each(|(a, b)| *a += b);
            }
        }
        self.grads.insert(mb, g);
        Ok(None)
    }

    fn discard(&mut self, mb: usize) {
        self.saved.remove(&mb);
    }

    fn set_loss_scale(&mut self, scale: f32) {
        self.scale = scale;
    }

    fn take_grads(&mut self) -> StageResult<(NamedGrads, ExpertLoad)> {
        let mut sum: Vec<Vec<f32>> = self.own.iter().map(|o| vec![0.0; o.2.len()]).collect();
        for g in std::mem::take(&mut self.grads).into_values() {
            for (a, b) in sum.iter_mut().zip(g) {
                a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
            }
        }
        if self.ctl.poison.load(Ordering::SeqCst) {
            if let Some(i) = self
                .own
                .iter()
                .position(|o| o.1 == wo(self.spec.layers.start))
            {
                sum[i][5] = f32::NAN;
            }
        }
        let mut loads: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for (l, v) in std::mem::take(&mut self.loads).into_values().flatten() {
            let acc = loads.entry(l).or_insert_with(|| vec![0; v.len()]);
            acc.iter_mut().zip(v).for_each(|(a, b)| *a += b);
        }
        let named = self.own.iter().map(|o| o.1.clone()).zip(sum).collect();
        Ok((named, loads.into_iter().collect()))
    }

    fn load_params(&mut self, p: &Params) -> StageResult<()> {
        for o in &mut self.own {
            o.2 = p.data[o.0].clone();
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// configurations and helpers

/// A small valid job: PP `pp` x EP 2 on one node, 2 layers per stage (the first dense, the
/// rest MoE with 2 experts), 4 sequences of 64 tokens per micro-batch.
fn config(pp: u32, micro_batches: u32) -> TrainConfig {
    let mut c = TrainConfig::default();
    let m = &mut c.model;
    m.layers = 4 * pp;
    m.dense_layers = 1;
    (m.q_lora_rank, m.kv_lora_rank) = (16, 16);
    (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) = (16, 16, 32);
    (
        m.routed_experts,
        m.groups,
        m.topk_groups,
        m.topk,
        m.shared_experts,
    ) = (2, 1, 1, 1, 0);
    (m.expert_intermediate, m.dense_intermediate) = (128, 128);
    let t = &mut c.train;
    (t.seq_len, t.micro_batch, t.micro_batches) = (64, 4, micro_batches);
    (t.steps, t.lr.warmup_steps, t.lr.peak, t.lr.min) = (8, 1, 3e-3, 1e-3);
    let p = &mut c.parallel;
    (p.pp, p.ep, p.ep_nodes, p.nodes, p.devices_per_node) = (pp, 2, 1, 1, 2 * pp);
    c.validate().expect("test config is valid");
    c
}

/// A corpus of a few KB from the built-in one (fast split and sampling).
fn corpus() -> data::Corpus {
    let mut c = data::builtin_corpus();
    c.docs.truncate(2);
    c
}

fn factory(ctl: Arc<Ctl>) -> impl Fn(StageSpec, &Params) -> StageResult<Box<dyn Stage>> {
    move |spec, p| Ok(Box::new(Mock::new(spec, p, ctl.clone())) as Box<dyn Stage>)
}

fn trainer(cfg: &TrainConfig, ctl: &Arc<Ctl>, emu_base: u32, pipelined: bool) -> Trainer {
    let opts = TrainOptions {
        pipelined,
        emu_base,
        eval_batches: Some(2),
        ..TrainOptions::default()
    };
    Trainer::new(cfg.clone(), &corpus(), &factory(ctl.clone()), opts).expect("trainer")
}

/// Mock stages, the executor and one step's micro-batches of `cfg` on `emu_base..`.
fn pipeline_parts(
    cfg: &TrainConfig,
    ctl: &Arc<Ctl>,
    emu_base: u32,
) -> (Vec<Box<dyn Stage>>, Executor, Vec<MicroBatch>) {
    let devices = layout::job_devices(cfg, emu_base).expect("devices");
    let specs = layout::stage_specs(cfg, &devices).expect("specs");
    let p = Params::init(&cfg.model, 3);
    let ex = Executor::new(&specs, cfg.train.micro_batches as usize).expect("schedule");
    let stages: Vec<Box<dyn Stage>> = specs
        .into_iter()
        .map(|s| Box::new(Mock::new(s, &p, ctl.clone())) as Box<dyn Stage>)
        .collect();
    let split = corpus().split(cfg.train.seq_len as usize).expect("split");
    let t = &cfg.train;
    let mut s = data::Sampler::new(&split.train, t.seq_len as usize, t.micro_batch as usize, 9)
        .expect("sampler");
    let mbs = (0..t.micro_batches as usize)
        .map(|i| layout::micro_batch(i, &s.next_batch(), cfg.parallel.ep as usize).expect("mb"))
        .collect();
    (stages, ex, mbs)
}

fn all_grads(stages: &mut [Box<dyn Stage>]) -> Vec<(String, Vec<u32>)> {
    stages
        .iter_mut()
        .flat_map(|s| s.take_grads().expect("grads").0)
        .map(|(n, g)| (n, g.iter().map(|v| v.to_bits()).collect()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// tests

#[test]
fn pipelined_step_is_bit_identical_to_the_unpipelined_one() {
    for (k, (pp, mbs)) in [(2u32, 4u32), (2, 8), (4, 8)].into_iter().enumerate() {
        let cfg = config(pp, mbs);
        let base = 100 + 20 * k as u32;
        let ctl = Arc::new(Ctl::default());
        let (mut a, ex, batch) = pipeline_parts(&cfg, &ctl, base);
        let (mut b, _, _) = pipeline_parts(&cfg, &ctl, base);
        for s in a.iter_mut().chain(b.iter_mut()) {
            s.set_loss_scale(1.0 / 1000.0);
        }
        let pa = ex.run_pipelined(&mut a, &batch).expect("pipelined");
        let pb = ex.run_unpipelined(&mut b, &batch).expect("unpipelined");
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&pa.losses),
            bits(&pb.losses),
            "PP {pp}, {mbs} micro-batches"
        );
        assert!(pa.losses.iter().all(|l| l.is_finite() && *l > 0.0));
        let (ga, gb) = (all_grads(&mut a), all_grads(&mut b));
        assert_eq!(ga.len(), gb.len());
        for ((na, va), (nb, vb)) in ga.iter().zip(&gb) {
            assert_eq!(na, nb);
            assert!(va == vb, "PP {pp}, {mbs} mbs: gradient {na} differs");
        }
        // the gradients are not trivially zero
        assert!(ga
            .iter()
            .any(|(n, v)| n.ends_with("attn.wo") && v.iter().any(|&x| x != 0)));
        // every pass ran: 2 pp stages x mbs forwards and backwards
        let n = |k| pa.spans.iter().filter(|s| s.kind == k).count();
        let stages = 2 * pp as usize;
        assert_eq!(n(timing::SpanKind::Forward), stages * mbs as usize);
        assert_eq!(n(timing::SpanKind::Backward), stages * mbs as usize);
        // boundaries were checked on the receiving devices (both runs, both directions)
        let per_run = 2 * (stages - 1) * mbs as usize * 2;
        assert_eq!(ctl.checked.load(Ordering::SeqCst), 2 * per_run);
    }
}

#[test]
fn boundaries_move_to_the_receiving_stage_devices() {
    let cfg = config(2, 4);
    let devices = layout::job_devices(&cfg, 200).expect("devices");
    let specs = layout::stage_specs(&cfg, &devices).expect("specs");
    // stage s and 2pp-1-s share a rank's devices; neighbouring ranks' devices are disjoint
    let idx = |s: usize| {
        specs[s]
            .devices
            .iter()
            .map(|d| d.index())
            .collect::<Vec<_>>()
    };
    assert_eq!(idx(0), idx(3));
    assert_eq!(idx(1), idx(2));
    assert!(idx(0).iter().all(|d| !idx(1).contains(d)));
    // a mock that finds a buffer on another device fails the step, so a passing step with
    // boundaries checked proves every transfer landed on the receiving stage's devices
    let ctl = Arc::new(Ctl::default());
    let (mut st, ex, mbs) = pipeline_parts(&cfg, &ctl, 200);
    ex.run_pipelined(&mut st, &mbs).expect("step");
    assert_eq!(ctl.checked.load(Ordering::SeqCst), 3 * 4 * 2 * 2);
    let transfers = ex
        .run_unpipelined(&mut st, &mbs)
        .expect("step")
        .spans
        .iter()
        .filter(|s| s.kind == timing::SpanKind::Transfer)
        .count();
    assert_eq!(transfers, 3 * 4 * 2);
}

#[test]
fn overlapped_forward_and_backward_run_concurrently() {
    let cfg = config(2, 8);
    let ctl = Arc::new(Ctl {
        delay_ms: 30,
        ..Ctl::default()
    });
    let (mut st, ex, mbs) = pipeline_parts(&cfg, &ctl, 240);
    let pairs_in_schedule: usize = ex
        .schedule
        .ranks
        .iter()
        .flatten()
        .filter(|o| o.is_overlapped())
        .count();
    assert!(pairs_in_schedule > 0);
    let out = ex.run_pipelined(&mut st, &mbs).expect("step");
    let ov = timing::overlap(&out.spans);
    assert_eq!(ov.pairs, pairs_in_schedule);
    // each pair's F and B spans intersect
    let mut by_pair: BTreeMap<(usize, usize), Vec<&timing::Span>> = BTreeMap::new();
    for s in out
        .spans
        .iter()
        .filter(|s| s.kind != timing::SpanKind::Transfer)
    {
        if let Some(p) = s.pair {
            by_pair.entry(p).or_default().push(s);
        }
    }
    for (p, v) in &by_pair {
        assert_eq!(v.len(), 2);
        let both = v[0].end.min(v[1].end) - v[0].start.max(v[1].start);
        assert!(both > 0.0, "pair {p:?}: {v:?}");
        assert_ne!(v[0].kind, v[1].kind);
    }
    assert!(ov.ratio > 0.5, "{ov:?}");
}

#[test]
fn a_failing_stage_stops_every_rank_with_its_error() {
    let cfg = config(2, 8);
    let ctl = Arc::new(Ctl {
        fail: Some((1, 3)),
        ..Ctl::default()
    });
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut st, ex, mbs) = pipeline_parts(&cfg, &ctl, 260);
        let r = ex.run_pipelined(&mut st, &mbs).map(|_| ());
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the pipeline deadlocked after a stage error");
    let e = r.expect_err("the step must fail");
    assert!(
        e.contains("mock failure in stage 1 at micro-batch 3"),
        "{e}"
    );
}

#[test]
fn resume_reproduces_the_uninterrupted_run_bit_for_bit() {
    let cfg = config(2, 4);
    let ctl = Arc::new(Ctl::default());
    let mut full = trainer(&cfg, &ctl, 300, true);
    let losses: Vec<u64> = (0..4)
        .map(|_| full.step().expect("step").loss.to_bits())
        .collect();
    let dir = tempdir("resume");
    let ck = dir.join("run.ckpt");
    let mut first = trainer(&cfg, &ctl, 320, true);
    for l in &losses[..2] {
        assert_eq!(first.step().expect("step").loss.to_bits(), *l);
    }
    first.save(&ck).expect("save");
    drop(first);
    let mut second = trainer(&cfg, &ctl, 340, true);
    second.resume(&ck).expect("resume");
    assert_eq!(second.steps_done(), 2);
    for l in &losses[2..] {
        assert_eq!(second.step().expect("step").loss.to_bits(), *l);
    }
    assert_eq!(
        second.params().unwrap(),
        full.params().unwrap(),
        "parameters after 4 steps"
    );
    assert_eq!(second.loss_curve().train.len(), 4);
}

#[test]
fn training_lowers_the_loss_and_moves_the_biases_by_the_load_rule() {
    let cfg = config(2, 4);
    let ctl = Arc::new(Ctl::default());
    let mut t = trainer(&cfg, &ctl, 400, true);
    let v0 = t.evaluate().expect("eval");
    // the first step's micro-batches, sampled independently, give the expected loads
    let split = t.split().clone();
    let tc = &cfg.train;
    let mut s = data::Sampler::new(
        &split.train,
        tc.seq_len as usize,
        tc.micro_batch as usize,
        tc.seed,
    )
    .expect("sampler");
    let mut load = [0u64; 2];
    for _ in 0..tc.micro_batches {
        s.next_batch()
            .inputs
            .iter()
            .for_each(|&id| load[id as usize % 2] += 1);
    }
    let first = t.step().expect("step");
    let mean = (load[0] + load[1]) as f64 / 2.0;
    for l in 1..cfg.model.layers as usize {
        let b = t
            .params()
            .unwrap()
            .get(&format!("layers.{l}.moe.bias"))
            .expect("bias");
        for e in 0..2 {
            let d = mean - load[e] as f64;
            let want = cfg.train.bias_update_speed * d.signum() as f32 * (d != 0.0) as u8 as f32;
            assert_eq!(b[e].to_bits(), want.to_bits(), "layer {l} expert {e}");
        }
    }
    let mut last = first.loss;
    for _ in 0..5 {
        let r = t.step().expect("step");
        assert!(r.grad_norm.is_finite() && r.grad_norm > 0.0);
        assert!(r.phases.forward > 0.0 && r.phases.backward > 0.0 && r.phases.optimizer > 0.0);
        last = r.loss;
    }
    assert!(last < first.loss - 0.5, "loss {} -> {last}", first.loss);
    let v1 = t.evaluate().expect("eval");
    assert!(v1 < v0, "validation {v0} -> {v1}");
    // the curve and the trace of the last step
    let dir = tempdir("learn");
    t.loss_curve()
        .write_svg(&dir.join("loss.svg"))
        .expect("svg");
    t.loss_curve()
        .write_png(&dir.join("loss.png"))
        .expect("png");
    let tr = t.trace();
    let devs: std::collections::BTreeSet<usize> =
        tr.events.iter().map(|e| e.track.device).collect();
    assert_eq!(devs.len(), 4, "every device has events");
    tr.write(&dir.join("trace.json")).expect("trace");
}

#[test]
fn a_nan_gradient_stops_the_run_naming_step_layer_and_tensor() {
    let cfg = config(2, 4);
    let ctl = Arc::new(Ctl::default());
    let mut t = trainer(&cfg, &ctl, 500, true);
    t.step().expect("step 0");
    let dir = tempdir("nan");
    let ck = dir.join("good.ckpt");
    t.save(&ck).expect("save");
    let before = std::fs::read(&ck).expect("read");
    let params = t.params().unwrap().clone();
    ctl.poison.store(true, Ordering::SeqCst);
    let e = t.step().expect_err("NaN must stop the run").to_string();
    assert!(
        e.contains("step 1") && e.contains("layer 0") && e.contains("layers.0.attn.wo.grad"),
        "{e}"
    );
    assert_eq!(t.steps_done(), 1);
    assert_eq!(t.params().unwrap(), &params, "no update was applied");
    assert_eq!(
        std::fs::read(&ck).expect("read"),
        before,
        "the good checkpoint is intact"
    );
    // the failed step advanced nothing: retrying it gives the uninterrupted run's step 2
    ctl.poison.store(false, Ordering::SeqCst);
    let retry = t.step().expect("step 1 again");
    let mut clean = trainer(&cfg, &Arc::new(Ctl::default()), 520, true);
    clean.step().expect("step 0");
    let want = clean.step().expect("step 1");
    assert_eq!(retry.loss.to_bits(), want.loss.to_bits());
    assert_eq!(t.params().unwrap(), clean.params().unwrap());
}

#[test]
fn a_checkpoint_of_another_config_is_refused_naming_the_field() {
    let cfg = config(2, 4);
    let ctl = Arc::new(Ctl::default());
    let t = trainer(&cfg, &ctl, 600, true);
    let dir = tempdir("mismatch");
    let ck = dir.join("a.ckpt");
    t.save(&ck).expect("save");
    let mut other = cfg.clone();
    other.model.rope_theta = 5000.0;
    let mut u = trainer(&other, &ctl, 620, true);
    let e = u.resume(&ck).expect_err("refused").to_string();
    assert!(
        e.contains("model.rope_theta") && e.contains("10000") && e.contains("5000"),
        "{e}"
    );
    assert_eq!(u.steps_done(), 0);
}

/// A fresh scratch directory, removed when the test that made it ends (pass or fail).
struct TempDir(std::path::PathBuf);

impl std::ops::Deref for TempDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for TempDir {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir(tag: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("ptxforge-train-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    TempDir(d)
}

/// f64 AdamW of one tensor as the V3 recipe (clip scale `c`, BF16 moments): returns the new
/// weights, updating the moments.
fn adamw_ref(p: &[f32], g: &[f32], mv: &mut (Vec<f64>, Vec<f64>), k: AdamRef) -> Vec<f64> {
    let bf = |x: f64| half::bf16::from_f64(x).to_f64();
    let (bc1, bc2) = (1.0 / (1.0 - k.b1.powi(k.t)), 1.0 / (1.0 - k.b2.powi(k.t)));
    (0..p.len())
        .map(|i| {
            let gg = g[i] as f64 * k.c;
            mv.0[i] = bf(k.b1 * mv.0[i] + (1.0 - k.b1) * gg);
            mv.1[i] = bf(k.b2 * mv.1[i] + (1.0 - k.b2) * gg * gg);
            let upd = mv.0[i] * bc1 / ((mv.1[i] * bc2).sqrt() + k.eps);
            p[i] as f64 - k.lr * (upd + k.wd * p[i] as f64)
        })
        .collect()
}

#[derive(Clone, Copy)]
struct AdamRef {
    lr: f64,
    b1: f64,
    b2: f64,
    eps: f64,
    wd: f64,
    c: f64,
    t: i32,
}

/// The gradients the trainer's next step sees: the same mock stages (fresh, loaded with
/// `params`) over the same micro-batches, run unpipelined on the host side.
fn reference_grads(
    cfg: &TrainConfig,
    params: &Params,
    step: u64,
    base: u32,
) -> Vec<Option<Vec<f32>>> {
    let devices = layout::job_devices(cfg, base).expect("devices");
    let specs = layout::stage_specs(cfg, &devices).expect("specs");
    let ex = Executor::new(&specs, cfg.train.micro_batches as usize).expect("schedule");
    let ctl = Arc::new(Ctl::default());
    let mut st: Vec<Box<dyn Stage>> = specs
        .into_iter()
        .map(|s| Box::new(Mock::new(s, params, ctl.clone())) as Box<dyn Stage>)
        .collect();
    let split = corpus().split(cfg.train.seq_len as usize).expect("split");
    let t = &cfg.train;
    let mut s = data::Sampler::new(
        &split.train,
        t.seq_len as usize,
        t.micro_batch as usize,
        t.seed,
    )
    .expect("sampler");
    let mut mbs = Vec::new();
    for k in 0..(step + 1) * t.micro_batches as u64 {
        let b = s.next_batch();
        if k >= step * t.micro_batches as u64 {
            mbs.push(layout::micro_batch(mbs.len(), &b, cfg.parallel.ep as usize).expect("mb"));
        }
    }
    let labelled: usize = mbs.iter().map(MicroBatch::labelled).sum();
    st.iter_mut()
        .for_each(|s| s.set_loss_scale(1.0 / labelled as f32));
    ex.run_unpipelined(&mut st, &mbs).expect("reference step");
    let mut out = vec![None; params.specs.len()];
    for s in &mut st {
        for (n, g) in s.take_grads().expect("grads").0 {
            out[params.index(&n).expect("name")] = Some(g);
        }
    }
    out
}

#[test]
fn the_optimizer_step_matches_an_f64_adamw_with_global_clip() {
    let mut cfg = config(2, 4);
    cfg.train.grad_clip = 0.5; // below the norms seen: clipping is active
    let ctl = Arc::new(Ctl::default());
    let mut t = trainer(&cfg, &ctl, 700, true);
    let tc = cfg.train.clone();
    let mut moments: Vec<(Vec<f64>, Vec<f64>)> = t
        .params()
        .unwrap()
        .data
        .iter()
        .map(|d| (vec![0.0; d.len()], vec![0.0; d.len()]))
        .collect();
    for step in 0..2u64 {
        let before = t.params().unwrap().clone();
        let grads = reference_grads(&cfg, &before, step, 720 + 10 * step as u32);
        let sumsq: f64 = grads
            .iter()
            .flatten()
            .flatten()
            .map(|&g| (g as f64).powi(2))
            .sum();
        let norm = sumsq.sqrt();
        let r = t.step().expect("step");
        assert!(
            ((r.grad_norm as f64) - norm).abs() <= 1e-5 * norm,
            "{} vs {norm}",
            r.grad_norm
        );
        assert!(
            norm > tc.grad_clip as f64,
            "the clip must be active ({norm})"
        );
        let mut worst = 0.0f64;
        for (i, spec) in before.specs.iter().enumerate() {
            let Some(g) = &grads[i] else {
                assert_eq!(
                    spec.kind,
                    model::params::ParamKind::RouteBias,
                    "{}",
                    spec.name
                );
                continue;
            };
            let k = AdamRef {
                lr: cfg.lr_at(step as u32) as f64,
                b1: tc.adam_beta1 as f64,
                b2: tc.adam_beta2 as f64,
                eps: tc.adam_eps as f64,
                wd: if spec.decays() {
                    tc.weight_decay as f64
                } else {
                    0.0
                },
                c: (tc.grad_clip as f64 / norm).min(1.0),
                t: step as i32 + 1,
            };
            let want = adamw_ref(&before.data[i], g, &mut moments[i], k);
            let got = &t.params().unwrap().data[i];
            for (j, (&p, &w)) in got.iter().zip(&want).enumerate() {
                // f32 arithmetic and a moment landing on the other side of a bf16 rounding
                // boundary move the update by at most ~1% of lr
                let err = (p as f64 - w).abs();
                assert!(
                    err <= 1e-2 * k.lr + 1e-7,
                    "step {step} {}[{j}]: {p} vs {w}",
                    spec.name
                );
                worst = worst.max(err / k.lr);
            }
        }
        assert!(worst > 0.0 || step == 0);
    }
}
