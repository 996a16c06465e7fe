//! The device trainer (`model::train::Trainer` over `model::net::DeviceStage`: DualPipeV over
//! 2 pipeline ranks, FP8 FFN/expert GEMMs, AdamW on the devices) against the independent f64
//! reference trainer (`model::reference`, host loops, FP8/BF16 roundings modelled at the
//! device's storage points): the step-1 loss and every parameter's gradient, then the first 5
//! steps' losses on the same micro-batches.
//!
//! Tolerances (stated here; measured values, printed by each test, in brackets):
//! - step-1 loss: relative 2e-3 [1.0e-4];
//! - gradients, per tensor, relative Frobenius `||dev - ref|| / ||ref||`: 0.1 for each tensor
//!   [attention, norms, head, embedding, dense FFN, shared expert 1e-2..1e-1], 0.35 for each
//!   routed expert's, each gate's (the routed experts' outputs times dY) and each MoE layer's
//!   `ffn_norm` (the MoE input gradient, routed FP8 dgrads included, times the normed input)
//!   [3.5e-2..1.9e-1 on the committed corpus `tests-data/train/fixed_corpus.txt`] and 0.06
//!   over all parameters [5.4e-2]. The independent reference rounds to BF16 at the points its author
//!   chose from the kernels' interfaces, not at every point the device stores (it does not
//!   model the attention kernel's BF16 probabilities, for one), and an FP8 E4M3 rounding flip
//!   moves a value by a whole e4m3 step (6e-2 relative): a lower layer's expert dgrad quantises
//!   an incoming gradient that already carries the upper layers' differences, so the routed
//!   experts' weight gradients (few tokens each) differ most. `tests/net.rs` checks the same
//!   device stages against a bit-level reference to 1e-5..1e-2;
//! - 5-step losses: relative 1e-3 each [<= 1.7e-4].

use model::config::{
    DeviceKind, LrSchedule, ModelConfig, ParallelConfig, TrainConfig, TrainingConfig,
};
use model::data;
use model::params::ParamKind;
use model::reference::{self, RefOptions};
use model::stage::MicroBatch;
use model::train::{device_stage_factory, TrainOptions, Trainer};

fn config() -> TrainConfig {
    TrainConfig {
        model: ModelConfig {
            layers: 4,
            ..ModelConfig::tiny()
        },
        train: TrainingConfig {
            seq_len: 128,
            micro_batch: 1,
            micro_batches: 4,
            steps: 5,
            // pinned (not the default preset's): the bounds below were measured with it
            lr: LrSchedule {
                peak: 3e-3,
                min: 3e-4,
                warmup_steps: 10,
            },
            ..TrainingConfig::default()
        },
        parallel: ParallelConfig {
            pp: 2,
            ep: 1,
            ep_nodes: 1,
            dp: 1,
            nodes: 1,
            devices_per_node: 2,
            comm_sms: 4,
        },
        device: DeviceKind::Emu,
    }
}

fn trainer(base: u32) -> Trainer {
    let cfg = config();
    cfg.validate()
        .expect("the test configuration is a valid job");
    let corpus = fixed_corpus();
    let opts = TrainOptions {
        emu_base: base,
        ..TrainOptions::default()
    };
    Trainer::new(cfg, &corpus, &*device_stage_factory(), opts).expect("trainer")
}

/// A committed text (docs/TRAIN.md and README.md as of commit f433d20), not the built-in
/// corpus: that one embeds the project's current docs and sources, so its batches, and with
/// them the measured errors below, would move with every doc edit.
fn fixed_corpus() -> data::Corpus {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests-data/train/fixed_corpus.txt");
    data::load_file(&path, 256).expect("tests-data/train/fixed_corpus.txt")
}

fn rel(got: &[f32], want: &[f32]) -> (f64, f64) {
    let (mut d, mut n) = (0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        d += (*g as f64 - *w as f64).powi(2);
        n += (*w as f64).powi(2);
    }
    (d, n)
}

#[test]
fn step_one_loss_and_every_gradient_agree_with_the_f64_reference() {
    let mut t = trainer(600);
    let mbs = t.peek_batches().unwrap();
    let (loss, grads) = t.gradients().unwrap();
    let cfg = config();
    let r = reference::loss_and_grads(
        &cfg.model,
        cfg.train.seq_len as usize,
        t.params().unwrap(),
        &mbs,
        &RefOptions::DEVICE,
    )
    .unwrap();
    let lerr = (loss - r.loss).abs() / r.loss;
    eprintln!(
        "step-1 loss: device {loss:.6}, reference {:.6}, rel {lerr:.2e}",
        r.loss
    );
    assert!(lerr < 2e-3, "loss {loss} vs {}", r.loss);
    let (mut dt, mut nt, mut worst) = (0f64, 0f64, (0f64, String::new()));
    for (i, spec) in t.params().unwrap().specs.iter().enumerate() {
        if spec.kind == ParamKind::RouteBias {
            assert!(
                grads[i].is_none(),
                "{}: the route bias has no gradient",
                spec.name
            );
            continue;
        }
        let g = grads[i]
            .as_ref()
            .unwrap_or_else(|| panic!("no gradient for {}", spec.name));
        assert!(g.iter().all(|v| v.is_finite()), "{}", spec.name);
        let (d, n) = rel(g, &r.grads.data[i]);
        assert!(n > 0.0, "{}: the reference gradient is zero", spec.name);
        let e = (d / n).sqrt();
        if e > worst.0 {
            worst = (e, spec.name.clone());
        }
        eprintln!("  {:<32} rel {e:.3e}  |ref| {:.3e}", spec.name, n.sqrt());
        let routed = spec.name.contains(".moe.experts.")
            || spec.name.ends_with(".moe.gate")
            || (spec.name.ends_with(".ffn_norm") && spec.layer >= Some(1));
        let bound = if routed { 0.35 } else { 0.1 };
        assert!(e < bound, "{}: relative error {e:.3e}", spec.name);
        dt += d;
        nt += n;
    }
    let all = (dt / nt).sqrt();
    eprintln!(
        "gradients: all parameters rel {all:.3e}, worst {:.3e} ({})",
        worst.0, worst.1
    );
    assert!(all < 0.06, "all-parameter relative error {all}");
}

#[test]
fn the_first_five_losses_agree_with_the_f64_reference_trainer() {
    let mut t = trainer(610);
    let p0 = t.params().unwrap().clone();
    let mut batches: Vec<Vec<MicroBatch>> = Vec::new();
    let mut dev = Vec::new();
    for _ in 0..5 {
        batches.push(t.peek_batches().unwrap());
        dev.push(t.step().unwrap().loss);
    }
    let cfg = config();
    let run = reference::train_steps(
        &cfg,
        &p0,
        |s| batches[s as usize].clone(),
        5,
        &RefOptions::DEVICE,
    )
    .unwrap();
    for (i, (d, r)) in dev.iter().zip(&run.losses).enumerate() {
        let e = (d - r).abs() / r;
        eprintln!(
            "step {}: device {d:.5}, reference {r:.5}, rel {e:.2e}",
            i + 1
        );
        assert!(e < 1e-3, "step {}: {d} vs {r}", i + 1);
    }
    assert!(dev[4] < dev[0], "the loss falls: {dev:?}");
}

/// The same step pipelined (DualPipeV, F&B pairs on two threads) and unpipelined (every
/// forward, then every backward, one thread) on the device stages: bit-identical loss and
/// gradients (each stage reduces micro-batches in index order, whatever order they ran in).
#[test]
fn pipelined_and_unpipelined_device_steps_are_bit_identical() {
    let run = |base: u32, pipelined: bool| {
        let cfg = config();
        let opts = TrainOptions {
            emu_base: base,
            pipelined,
            ..TrainOptions::default()
        };
        let mut t =
            Trainer::new(cfg, &fixed_corpus(), &*device_stage_factory(), opts).expect("trainer");
        t.gradients().unwrap()
    };
    let (la, ga) = run(620, true);
    let (lb, gb) = run(630, false);
    assert_eq!(la.to_bits(), lb.to_bits(), "loss {la} vs {lb}");
    let p = model::params::Params::init(&config().model, config().train.seed);
    for (i, (a, b)) in ga.iter().zip(&gb).enumerate() {
        let same = match (a, b) {
            (Some(a), Some(b)) => a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            (None, None) => true,
            _ => false,
        };
        assert!(
            same,
            "{}: pipelined and unpipelined gradients differ",
            p.specs[i].name
        );
    }
}

/// Two steps, a checkpoint, two more steps after a resume in a new trainer: the same losses
/// and the same parameters, bit for bit, as four uninterrupted steps.
#[test]
fn resume_on_device_stages_reproduces_the_uninterrupted_run_bit_for_bit() {
    let dir = std::env::temp_dir().join(format!("ptxforge-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ckpt = dir.join("two.ckpt");
    let mut full = trainer(640);
    let all: Vec<f64> = (0..4).map(|_| full.step().unwrap().loss).collect();
    let mut first = trainer(650);
    for _ in 0..2 {
        first.step().unwrap();
    }
    first.save(&ckpt).unwrap();
    drop(first);
    let mut resumed = trainer(660);
    resumed.resume(&ckpt).unwrap();
    let rest: Vec<f64> = (0..2).map(|_| resumed.step().unwrap().loss).collect();
    for (k, (a, b)) in all[2..].iter().zip(&rest).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "step {}: {a} vs {b}", k + 3);
    }
    for ((s, a), b) in full
        .params()
        .unwrap()
        .specs
        .iter()
        .zip(&full.params().unwrap().data)
        .zip(&resumed.params().unwrap().data)
    {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{}: parameters differ after the resumed run",
            s.name
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
