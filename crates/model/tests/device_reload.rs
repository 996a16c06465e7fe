//! The stages' reload from the optimizer's device-resident FP32 master weights
//! (`Stage::load_device_params`: device copies, the conversion kernels and the on-device FP8
//! quantisation) against the host reload (`Stage::load_params`: host rounding and
//! `quant_expert`) of the same values: a tiny model (a dense and an MoE layer over EP 2, the
//! embedding, the head and the MTP module; PP 1, so two stages on the same two devices, the
//! optimizer's copy on the first) built from one set of parameters, reloaded with another
//! (every weight different), then one micro-batch forward and backward through both stages.
//! The boundary activations, both losses, the input gradient and every parameter gradient must
//! be bit-identical: any weight the device path rounded or quantised differently would show.

use model::config::{DeviceKind, ModelConfig, ParallelConfig, TrainConfig, TrainingConfig};
use model::net::DeviceStage;
use model::params::Params;
use model::stage::{Boundary, MicroBatch, NamedGrads, Stage, StageOut};
use model::train::layout;
use model::train::optim::Optimizer;
use rand::{Rng, SeedableRng};

fn tiny() -> TrainConfig {
    TrainConfig {
        model: ModelConfig {
            mtp_depth: 1,
            ..ModelConfig::tiny()
        },
        train: TrainingConfig {
            seq_len: 128,
            micro_batch: 2,
            micro_batches: 2,
            ..TrainingConfig::default()
        },
        parallel: ParallelConfig {
            pp: 1,
            ep: 2,
            ep_nodes: 1,
            dp: 1,
            nodes: 1,
            devices_per_node: 2,
            comm_sms: 4,
        },
        device: DeviceKind::Emu,
    }
}

/// What one forward + backward of the micro-batch through both stages gave.
struct Out {
    hidden: Vec<Vec<u32>>,
    loss: u64,
    dx: Vec<Vec<u32>>,
    grads: Vec<(String, Vec<u32>)>,
}

fn bits(b: &Boundary) -> Vec<Vec<u32>> {
    b.ranks
        .iter()
        .map(|r| r.to_vec().unwrap().into_iter().map(f32::to_bits).collect())
        .collect()
}

fn grad_bits(g: NamedGrads) -> Vec<(String, Vec<u32>)> {
    let mut v: Vec<_> = g
        .into_iter()
        .map(|(n, g)| (n, g.into_iter().map(f32::to_bits).collect()))
        .collect();
    v.sort();
    v
}

fn run(stages: &mut [DeviceStage], mb: &MicroBatch) -> Out {
    for s in stages.iter_mut() {
        s.set_loss_scale(1.0 / 200.0);
    }
    let StageOut::Hidden(h) = stages[0].forward(mb, None).unwrap() else {
        panic!("stage 0 returned a loss")
    };
    let hidden = bits(&h);
    let StageOut::Loss(loss) = stages[1].forward(mb, Some(h)).unwrap() else {
        panic!("stage 1 returned activations")
    };
    let dx = stages[1].backward(mb.index, None).unwrap().unwrap();
    let dxb = bits(&dx);
    assert!(stages[0].backward(mb.index, Some(dx)).unwrap().is_none());
    let mut grads = Vec::new();
    for s in stages.iter_mut() {
        grads.extend(grad_bits(s.take_grads().unwrap().0));
    }
    Out {
        hidden,
        loss: loss.to_bits(),
        dx: dxb,
        grads,
    }
}

#[test]
fn the_device_reload_is_the_host_reload_bit_for_bit() {
    let cfg = tiny();
    // PP 1 (two stages on the same devices): not a DualPipeV job, `validate` would refuse it;
    // the stages and the optimizer only need the sizes
    let devices = layout::job_devices(&cfg, 960).unwrap();
    let specs = layout::stage_specs(&cfg, &devices).unwrap();
    let p0 = Params::init(&cfg.model, 1);
    // the reloaded values: another init, the matrices scaled up so the FP8 blocks' scales vary,
    // biases non-zero (they steer the routing)
    let mut rg = rand::rngs::StdRng::seed_from_u64(14);
    let mut p1 = Params::init(&cfg.model, 2);
    for (spec, d) in p1.specs.iter().zip(p1.data.iter_mut()) {
        let scale = 2f32.powi(rg.gen_range(0..5));
        d.iter_mut()
            .for_each(|v| *v = *v * scale + rg.gen_range(-1e-3..1e-3));
        if spec.name.ends_with("moe.bias") {
            d.iter_mut().for_each(|v| *v = rg.gen_range(-0.05..0.05));
        }
    }
    let owners: Vec<Vec<usize>> = specs
        .iter()
        .map(|s| layout::stage_params(s, &p1.specs))
        .collect();
    let first: Vec<_> = specs.iter().map(|s| s.devices[0].clone()).collect();
    let opt = Optimizer::new(&p1, &owners, &first).unwrap();
    let dp = opt.device_params(&p1.specs);
    let build = || -> Vec<DeviceStage> {
        specs
            .iter()
            .map(|s| {
                let mut st = DeviceStage::new(s.clone(), &p0).unwrap();
                st.set_poison(true);
                st
            })
            .collect()
    };
    let t = 128;
    let mb = MicroBatch {
        index: 0,
        inputs: (0..2)
            .map(|_| (0..t).map(|_| rg.gen_range(0..256)).collect())
            .collect(),
        labels: (0..2)
            .map(|_| (0..t).map(|_| rg.gen_range(0..256)).collect())
            .collect(),
    };
    let mut host = build();
    host.iter_mut().for_each(|s| s.load_params(&p1).unwrap());
    let want = run(&mut host, &mb);
    drop(host);
    let mut dev = build();
    dev.iter_mut()
        .for_each(|s| s.load_device_params(&dp).unwrap());
    let got = run(&mut dev, &mb);
    assert!(f64::from_bits(want.loss).is_finite());
    assert!(want.grads.len() > 40, "{} gradients", want.grads.len());
    // (bit vectors compared with `==`: a failure names the tensor, not a megabyte of bits)
    assert!(got.hidden == want.hidden, "stage 0's output differs");
    assert_eq!(got.loss, want.loss, "loss");
    assert!(got.dx == want.dx, "stage 1's input gradient differs");
    for ((gn, g), (wn, w)) in got.grads.iter().zip(&want.grads) {
        assert_eq!(gn, wn);
        assert!(g == w, "gradient of {gn} differs");
    }
    assert_eq!(got.grads.len(), want.grads.len());
    // and the reload took: a stage still on p0 gives another loss
    let mut stale = build();
    let old = run(&mut stale, &mb);
    assert_ne!(old.loss, want.loss, "p1 must change the loss");
}
