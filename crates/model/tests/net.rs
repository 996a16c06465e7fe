//! `model::net::DeviceStage` on 1 node x 2 emulated devices (EP 2) against an independent f64
//! reference (`net_ref`): each kind of layer, the embedding and the head as stages of their
//! own, then the whole tiny model as one stage; gradients of two micro-batches summed in index
//! order whatever order their backward passes ran in; bad inputs refused with clear errors.
//!
//! Tolerances (relative Frobenius error per tensor, `||got - want|| / ||want||`): the reference
//! rounds where the device stores (BF16 activations, weights and GEMM outputs, including the
//! GEMMs that add a BF16 C; the FFN's FP8 quantisation points; the attention kernels' tiled
//! online softmax with BF16 P and BF16 dS), so each layer's forward and the dense layer's input
//! gradient match bit for bit; what is left is f32-vs-f64 accumulation and the rounding flips
//! it causes, which FP8 quantisation amplifies several layers deep. Measured values are
//! printed by each test; the bounds (`layer_tol`, `deep_tol`, and at each assertion) state
//! them and their reason.

mod net_ref;

use model::config::{DeviceKind, ModelConfig, ParallelConfig, TrainConfig, TrainingConfig};
use model::net::DeviceStage;
use model::params::{ParamKind, Params};
use model::stage::{Boundary, MicroBatch, NamedGrads, Stage, StageOut, StageSpec};
use model::TrainError;
use net_ref::{run, RefOut, RefRun};
use rand::{Rng, SeedableRng};
use runtime::Device;
use std::time::Instant;

const SEQ: usize = 128;
const EP: usize = 2;
/// Tokens per rank (micro_batch 2 over EP 2: one sequence each).
const T: usize = 128;
const N: usize = EP * T;

fn tiny() -> TrainConfig {
    TrainConfig {
        model: ModelConfig {
            ..ModelConfig::tiny()
        },
        train: TrainingConfig {
            seq_len: SEQ as u32,
            micro_batch: 2,
            micro_batches: 2,
            ..TrainingConfig::default()
        },
        parallel: ParallelConfig {
            pp: 1,
            ep: EP as u32,
            ep_nodes: 1,
            dp: 1,
            nodes: 1,
            devices_per_node: EP as u32,
            comm_sms: 4,
        },
        device: DeviceKind::Emu,
    }
}

/// Initial parameters with larger matrices (x3: attention patterns far from uniform), norm
/// scales in [0.8, 1.2) and small route biases, so every path carries signal; the embedding x30
/// (rms 0.6, as the layer tests' inputs): the residual stream then dominates each block's
/// output, as in a trained model. With the init's 0.02 the blocks' outputs dominate and every
/// BF16-level difference between device and reference that reaches an FP8 quantisation is
/// amplified far more (each rounding flip is a whole e4m3 step, 6e-2): measured before the
/// reference modelled the attention kernel's BF16 probabilities, 2e-2 per layer and 1e-1 in
/// the gradients two layers down.
fn params(c: &TrainConfig, seed: u64) -> Params {
    let mut p = Params::init(&c.model, seed);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for (s, d) in p.specs.iter().zip(p.data.iter_mut()) {
        match s.kind {
            ParamKind::Matrix => d.iter_mut().for_each(|v| *v *= 3.0),
            ParamKind::Norm => d.iter_mut().for_each(|v| *v = rng.gen_range(0.8..1.2)),
            ParamKind::RouteBias => d.iter_mut().for_each(|v| *v = rng.gen_range(-0.02..0.02)),
            ParamKind::Embedding => d.iter_mut().for_each(|v| *v *= 30.0),
        }
    }
    p
}

/// Exact tensor-core numerics (as tests/moe.rs): the reference sums exactly.
fn devices(base: u32) -> Vec<Device> {
    (0..EP as u32)
        .map(|i| {
            let d = Device::emu(base + i);
            d.set_numerics(Some(emu::Numerics::Exact));
            d
        })
        .collect()
}

fn spec(
    c: &TrainConfig,
    index: usize,
    stages: usize,
    layers: std::ops::Range<usize>,
    dev: u32,
) -> StageSpec {
    StageSpec {
        index,
        stages,
        layers,
        pp_rank: 0,
        devices: devices(dev),
        config: c.clone(),
    }
}

fn stage(s: StageSpec, p: &Params) -> DeviceStage {
    let mut st = DeviceStage::new(s, p).expect("stage");
    st.set_poison(true);
    st
}

/// BF16-representable values in [-a, a).
fn bf_values(rng: &mut impl Rng, n: usize, a: f32) -> Vec<f32> {
    (0..n)
        .map(|_| half::bf16::from_f32(rng.gen_range(-a..a)).to_f32())
        .collect()
}

fn boundary(devs: &[Device], v: &[f32]) -> Boundary {
    Boundary {
        ranks: devs
            .iter()
            .enumerate()
            .map(|(r, d)| d.upload(&v[r * T * 128..(r + 1) * T * 128]).unwrap())
            .collect(),
    }
}

fn read(b: &Boundary) -> Vec<f64> {
    b.ranks
        .iter()
        .flat_map(|r| r.to_vec().unwrap())
        .map(f64::from)
        .collect()
}

/// Micro-batch `index` of random ids and labels (about one in eight ignored).
fn micro_batch(rng: &mut impl Rng, index: usize) -> MicroBatch {
    let mut ids = || (0..T).map(|_| rng.gen_range(0..256)).collect::<Vec<i32>>();
    let inputs: Vec<Vec<i32>> = (0..EP).map(|_| ids()).collect();
    let labels = (0..EP)
        .map(|_| {
            (0..T)
                .map(|_| match rng.gen_range(0..8) {
                    0 => -100,
                    _ => rng.gen_range(0..256),
                })
                .collect()
        })
        .collect();
    MicroBatch {
        index,
        inputs,
        labels,
    }
}

/// Relative Frobenius error of `got` vs `want` (NaN counts as infinite).
fn rel(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut e, mut w) = (0f64, 0f64);
    for (g, r) in got.iter().zip(want) {
        let d = if g.is_finite() { g - r } else { f64::INFINITY };
        e += d * d;
        w += r * r;
    }
    assert!(w > 0.0, "reference is all zeros");
    (e / w).sqrt()
}

/// Checks every gradient against the reference: `tol(name)` bounds its relative error;
/// returns the worst (name, error).
fn check_grads(got: &NamedGrads, want: &RefOut, tol: &dyn Fn(&str) -> f64) -> (String, f64) {
    assert_eq!(got.len(), want.grads.len(), "gradient names");
    let mut worst = (String::new(), 0.0);
    let mut bad = Vec::new();
    for (name, g) in got {
        let w = want
            .grads
            .get(name)
            .unwrap_or_else(|| panic!("{name}: no reference"));
        let gd: Vec<f64> = g.iter().map(|&v| f64::from(v)).collect();
        if w.iter().all(|&v| v == 0.0) {
            // a path cut by a zeroed weight: exactly zero on the device too
            assert!(gd.iter().all(|&v| v == 0.0), "{name}: the reference is 0");
            eprintln!("  {name:<34} 0 (as the reference)");
            continue;
        }
        let e = rel(&gd, w);
        eprintln!("  {name:<34} rel {e:.2e}");
        if e > tol(name) {
            bad.push(format!("{name}: relative error {e:.3e} > {}", tol(name)));
        }
        if e > worst.1 {
            worst = (name.clone(), e);
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    worst
}

/// Which parameters sit on the FP8 side: the dense FFN, its norm (whose gradient is the FP8
/// dgrad's output) and the MoE layer (gate, experts).
fn fp8_side(name: &str) -> bool {
    name.contains("ffn") || name.contains("moe.")
}

/// Gradient bounds one layer deep (measured x ~4). The reference models every rounding of the
/// forward and of the backward's BF16 storage (each layer's output and the dense layer's input
/// gradient match bit for bit); what is left is f32-vs-f64 accumulation and the rounding flips
/// it causes, largest in the attention backward (its dS and P are BF16 MMA operands): the
/// attention parameters' gradients differ by 1e-8..2e-4 (bound 1e-3), the FP8 side by
/// 1e-8..2.5e-5 (bound 1e-4).
fn layer_tol(name: &str) -> f64 {
    if fp8_side(name) {
        1e-4
    } else {
        1e-3
    }
}

/// Gradient bounds several layers deep: a lower layer's FFN dgrad quantises (FP8 1x128) an
/// incoming gradient that carries the upper layers' rounding flips, and each FP8 flip moves an
/// element by an e4m3 step (6e-2): measured up to 1.05e-2 on the FP8 side (bound 3e-2) and
/// 5e-3 elsewhere (bound 1.5e-2).
fn deep_tol(name: &str) -> f64 {
    if fp8_side(name) {
        3e-2
    } else {
        1.5e-2
    }
}

#[test]
fn each_layer_kind_matches_the_reference_as_a_stage() {
    let c = tiny();
    let p = params(&c, 11);
    for (layers, dev) in [(0..1, 100), (1..2, 110)] {
        let s = spec(&c, 1, 3, layers.clone(), dev);
        let devs = s.devices.clone();
        let mut st = stage(s, &p);
        let mut rng = rand::rngs::StdRng::seed_from_u64(5 + dev as u64);
        let x = bf_values(&mut rng, N * 128, 1.0);
        let dy = bf_values(&mut rng, N * 128, 1.0);
        let mb = micro_batch(&mut rng, 0);
        let t0 = Instant::now();
        let StageOut::Hidden(y) = st.forward(&mb, Some(boundary(&devs, &x))).unwrap() else {
            panic!("a middle stage returns activations")
        };
        let dx = st.backward(0, Some(boundary(&devs, &dy))).unwrap().unwrap();
        let (g, load) = st.take_grads().unwrap();
        eprintln!("layers {layers:?}: forward + backward {:.2?}", t0.elapsed());
        let xf: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let dyf: Vec<f64> = dy.iter().map(|&v| f64::from(v)).collect();
        let want = run(&RefRun {
            m: &c.model,
            p: &p,
            layers: layers.clone(),
            seq: SEQ,
            t: T,
            ids: None,
            x: Some(&xf),
            labels: None,
            dy: Some(&dyf),
            loss_scale: 1.0,
        });
        let (ey, edx) = (rel(&read(&y), &want.y), rel(&read(&dx), &want.dx));
        eprintln!("  output rel {ey:.2e}, input gradient rel {edx:.2e}");
        // the output bit for bit (measured 0), the input gradient bit for bit (dense) or
        // within the MoE backward's f32 accumulation flips (2e-5)
        assert!(ey < 1e-6 && edx < 1e-4, "y {ey:.3e}, dx {edx:.3e}");
        check_grads(&g, &want, &layer_tol);
        let moe = layers.start >= c.model.dense_layers as usize;
        assert_eq!(load.len(), moe as usize, "{load:?}");
        if let Some((l, counts)) = load.first() {
            assert_eq!(*l, 1);
            assert_eq!(
                counts.iter().sum::<u64>(),
                (N * 2) as u64,
                "top-2 of every token"
            );
        }
    }
}

/// The attention block alone (the FFN's `w2` zeroed: the FFN adds exactly 0) and the dense FFN
/// block alone (`wo` zeroed), on small inputs (rms 0.03) so the block's own output dominates.
#[test]
fn attention_and_dense_ffn_blocks_in_isolation() {
    let c = tiny();
    for (zero, dev) in [("layers.0.ffn.w2", 180), ("layers.0.attn.wo", 190)] {
        let mut p = params(&c, 81);
        p.get_mut(zero).unwrap().iter_mut().for_each(|v| *v = 0.0);
        let s = spec(&c, 1, 3, 0..1, dev);
        let devs = s.devices.clone();
        let mut st = stage(s, &p);
        let mut rng = rand::rngs::StdRng::seed_from_u64(82);
        let x = bf_values(&mut rng, N * 128, 0.05);
        let dy = bf_values(&mut rng, N * 128, 1.0);
        let mb = micro_batch(&mut rng, 0);
        let StageOut::Hidden(y) = st.forward(&mb, Some(boundary(&devs, &x))).unwrap() else {
            panic!("activations")
        };
        let dx = st.backward(0, Some(boundary(&devs, &dy))).unwrap().unwrap();
        let (g, _) = st.take_grads().unwrap();
        let xf: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let dyf: Vec<f64> = dy.iter().map(|&v| f64::from(v)).collect();
        let want = run(&RefRun {
            m: &c.model,
            p: &p,
            layers: 0..1,
            seq: SEQ,
            t: T,
            ids: None,
            x: Some(&xf),
            labels: None,
            dy: Some(&dyf),
            loss_scale: 1.0,
        });
        // the block's own output and input gradient (the residual paths subtracted)
        let minus = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(u, v)| u - v).collect::<Vec<_>>();
        let ey = rel(&minus(&read(&y), &xf), &minus(&want.y, &xf));
        let edx = rel(&minus(&read(&dx), &dyf), &minus(&want.dx, &dyf));
        eprintln!("{zero} = 0: block output rel {ey:.2e}, block input gradient rel {edx:.2e}");
        if zero.contains("ffn") {
            // attention alone, on small inputs so it dominates: the output within the f32
            // rounding flips of the BF16 P (measured 5.2e-4), the input gradient 1.2e-3, the
            // attention parameters' gradients up to 8.5e-4 (bound 3e-3); ffn.w2's gradient
            // reads the FFN of an attention-dominated input, where those flips cross FP8
            // rounding boundaries (5.8e-3)
            assert!(
                ey < 2e-3 && edx < 5e-3,
                "attention: y {ey:.3e}, dx {edx:.3e}"
            );
            let tol = |n: &str| if fp8_side(n) { deep_tol(n) } else { 3e-3 };
            check_grads(&g, &want, &tol);
        } else {
            // the FP8 FFN alone: every rounding modelled, output and input gradient match bit
            // for bit, its weight gradients to f32 accumulation (measured 2e-8..1.3e-7)
            assert!(ey == 0.0 && edx == 0.0, "FFN: y {ey:.3e}, dx {edx:.3e}");
            let tol = |n: &str| {
                if n.contains("ffn") {
                    1e-6
                } else {
                    layer_tol(n)
                }
            };
            check_grads(&g, &want, &tol);
        }
    }
}

#[path = "net_cases/ends.rs"]
mod ends;
#[path = "net_cases/whole.rs"]
mod whole;
