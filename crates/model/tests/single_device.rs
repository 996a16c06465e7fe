//! The parallel run (DualPipeV over PP 2 x EP 2 on 2 nodes x 2 emulated devices, each EP group
//! spanning both nodes) against the single-device run of the same job (`TrainOptions::
//! single_device`: every stage and all 8 experts on one emulated device, unpipelined, each MoE
//! layer one EP-1 layer over all the micro-batch's tokens): the same kernels on the same
//! micro-batches give bit-identical gradients, losses and parameters, because every reduction
//! has a fixed order that does not depend on the layout:
//!
//! - a token's top-k expert outputs (and, backward, their input gradients) are summed on its
//!   home rank in slot order (`MoeConfig::slot_combine`), whatever ranks hold the experts;
//! - each expert's rows are its tokens in token order (the dispatch's source-rank-then-token
//!   order is the single device's token order), padded to 128 per expert;
//! - weight gradients of replicated parameters are summed per EP-rank token slice, in rank
//!   order (the single device computes the same slices: `MoeConfig::wgrad_chunks` in its MoE
//!   layers, one slice after the other in the data-parallel blocks);
//! - micro-batches are reduced in index order, losses summed in index order.

use model::config::{DeviceKind, ModelConfig, ParallelConfig, TrainConfig, TrainingConfig};
use model::data;
use model::params::Params;
use model::train::{device_stage_factory, StepGrads, TrainOptions, Trainer};

fn config() -> TrainConfig {
    TrainConfig {
        model: ModelConfig {
            layers: 4,
            // 2 of 4 groups of 2 experts: a token's experts may sit on both EP ranks (with
            // 1 of 2 groups they never would: each rank holds one group)
            groups: 4,
            topk_groups: 2,
            ..ModelConfig::tiny()
        },
        train: TrainingConfig {
            seq_len: 128,
            micro_batch: 2,
            micro_batches: 4,
            steps: 2,
            ..TrainingConfig::default()
        },
        parallel: ParallelConfig {
            pp: 2,
            ep: 2,
            ep_nodes: 2,
            dp: 1,
            nodes: 2,
            devices_per_node: 2,
            comm_sms: 4,
        },
        device: DeviceKind::Emu,
    }
}

/// Step-1 gradients, then `steps` optimizer steps: (gradients, losses, final parameters).
fn run(base: u32, single_device: bool, steps: usize) -> (StepGrads, Vec<f64>, Params) {
    let opts = TrainOptions {
        emu_base: base,
        pipelined: !single_device,
        single_device,
        ..TrainOptions::default()
    };
    let mut t = Trainer::new(
        config(),
        &data::builtin_corpus(),
        &*device_stage_factory(),
        opts,
    )
    .expect("trainer");
    let (_, g) = t.gradients().expect("gradients");
    let losses = (0..steps).map(|_| t.step().expect("step").loss).collect();
    (g, losses, t.params().unwrap().clone())
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn pp2_ep2_run_is_bit_identical_to_the_single_device_run() {
    let t0 = std::time::Instant::now();
    let (ga, la, pa) = run(700, false, 1);
    let t1 = t0.elapsed().as_secs_f64();
    let (gb, lb, pb) = run(710, true, 1);
    eprintln!(
        "parallel {t1:.1} s, single device {:.1} s; losses {la:?}",
        t0.elapsed().as_secs_f64() - t1
    );
    let specs = &pa.specs;
    let mut differ = Vec::new();
    for (i, (a, b)) in ga.iter().zip(&gb).enumerate() {
        let same = match (a, b) {
            (Some(a), Some(b)) => same_bits(a, b),
            (None, None) => true,
            _ => false,
        };
        if !same {
            differ.push(format!("gradient {}", specs[i].name));
        }
    }
    for (i, (a, b)) in pa.data.iter().zip(&pb.data).enumerate() {
        if !same_bits(a, b) {
            differ.push(format!("parameter {}", specs[i].name));
        }
    }
    assert!(differ.is_empty(), "differ:\n{}", differ.join("\n"));
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&la), bits(&lb), "losses {la:?} vs {lb:?}");
    // the run trained: the parameters moved from their initial values
    let p0 = Params::init(&config().model, config().train.seed);
    assert_ne!(p0.data, pa.data);
}
