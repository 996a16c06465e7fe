//! The MoE layer called as a library: forward + backward on 2 nodes x 1 emulated device (so the
//! dispatch crosses nodes), every token and every routed expert checked against the f64
//! reference within the layer's tolerances; the check catches a corrupted output; bad
//! configurations and inputs are refused with typed errors.

use model::moe::{
    check, random_step, Backward, CheckConfig, Forward, MoeConfig, MoeError, MoeLayer, Quiet,
    StepData,
};
use rand::SeedableRng;
use runtime::Device;

/// A small layer: hidden 128, 8 routed experts (4 per rank) + 1 shared, top-4 of 4 groups (2
/// used), 128 tokens per rank.
fn small(seed: u64) -> MoeConfig {
    MoeConfig {
        nodes: 2,
        gpus_per_node: 1,
        hidden: 128,
        experts: 8,
        intermediate: 128,
        tokens: 128,
        topk: 4,
        groups: 4,
        topk_groups: 2,
        num_sms: 4,
        seed,
        ..MoeConfig::small()
    }
}

/// The devices, with exact tensor-core numerics: the f64 reference models every FP8 and BF16
/// rounding of the device path but sums each block of products exactly, so these all-token
/// checks hold the layer to that model. The hardware models (the emulator's default) are
/// exercised by the `ptxforge moe` CLI tests, whose sampled checks they pass.
fn devices(c: &MoeConfig, base: u32) -> Vec<Device> {
    (0..c.ranks() as u32)
        .map(|i| {
            let d = Device::emu(base + i);
            d.set_numerics(Some(emu::Numerics::Exact));
            d
        })
        .collect()
}

#[test]
fn forward_and_backward_match_the_f64_reference() {
    let cfg = small(0x5eed_0e11);
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
    let (weights, data) = random_step(&cfg, &mut rng);
    let mut layer =
        MoeLayer::new(cfg.clone(), devices(&cfg, 1200), weights, &Quiet).expect("layer");
    let f = layer.forward(&data.x, &Quiet).expect("forward");
    let b = layer.backward(&f, &data.dy, &Quiet).expect("backward");
    let (rn, n) = (cfg.ranks(), (cfg.tokens * cfg.hidden) as usize);
    assert_eq!(f.y.len(), rn);
    assert!(f.y.iter().chain(&b.dx).all(|v| v.len() == n));
    let cc = CheckConfig {
        tokens: 0,
        experts: cfg.experts as usize,
    };
    let rep = check(&layer, &data, &f, &b, &cc, &mut rng, &Quiet).expect("check");
    assert!(rep.quant_ok && rep.inter_ok, "{rep:?}");
    assert!(rep.inter_node_records > 0, "the dispatch crossed no node");
    // every checked quantity is non-trivial and within its tolerance
    for (name, e) in [
        ("y", rep.y),
        ("dx", rep.dx),
        ("logits", rep.logits),
        ("dlogits", rep.dlogits),
        ("dw_gate", rep.dw_gate),
        ("dw_gate_up", rep.dw_gate_up),
        ("dw_down", rep.dw_down),
        ("shared_dw_gate_up", rep.shared_dw_gate_up),
        ("shared_dw_down", rep.shared_dw_down),
    ] {
        assert!(e.max_ref > 0.0 && e.max_err.is_finite(), "{name}: {e:?}");
    }
    assert!(rep.ok(true), "{rep:?}");
    assert_eq!(rep.sampled_tokens(), rn * cfg.tokens as usize);
    assert_eq!(rep.experts.len(), cfg.experts as usize);
    let p = layer.placement(&f.stats, &b.stats);
    assert!(p.ok && p.disjoint, "{p:?}");
    assert!(
        p.comm_sms.iter().all(|&s| s >= layer.compute_sms()),
        "{p:?}"
    );
    assert_eq!(f.stats.overlaps.len() + b.stats.overlaps.len(), 4);
    assert!(!layer.take_trace().is_empty());

    // a wrong output, input gradient or weight gradient fails its check
    let mut f2 = f;
    f2.y[1][7] += 0.5;
    let mut b2 = b;
    b2.dx[0][3] -= 0.5;
    b2.routed_dw[0].0[11] += 1.0;
    let rep2 = check(&layer, &data, &f2, &b2, &cc, &mut rng, &Quiet).expect("check");
    assert!(
        !rep2.ok_y() && !rep2.ok_dx() && !rep2.ok_routed_dw(),
        "{rep2:?}"
    );
    assert!(!rep2.ok(true));

    // inputs of the wrong shape are refused before any work
    let bad = vec![vec![0.5; n - 1]; rn];
    match layer.forward(&bad, &Quiet) {
        Err(MoeError::Shape(m)) => assert!(m.contains("x:"), "{m}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("short input accepted"),
    }
}

/// BF16 dispatch payload (quantised on the expert side), no shared expert, sequential
/// communication and compute, 1 node x 2 devices: every check passes with the reference's
/// BF16-then-FP8 rounding of the routed inputs, and the dispatch moves BF16 records.
#[test]
fn bf16_payload_sequential_without_shared_expert_matches_the_reference() {
    let cfg = MoeConfig {
        nodes: 1,
        gpus_per_node: 2,
        shared: false,
        sequential: true,
        payload: ep::Payload::Bf16,
        ..small(0xbf16)
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
    let (weights, data) = random_step(&cfg, &mut rng);
    let mut layer =
        MoeLayer::new(cfg.clone(), devices(&cfg, 1400), weights, &Quiet).expect("layer");
    let f = layer.forward(&data.x, &Quiet).expect("forward");
    let b = layer.backward(&f, &data.dy, &Quiet).expect("backward");
    assert!(b.shared_dw.iter().all(|s| s.is_none()));
    assert_eq!(f.stats.fp8_saved_bytes, 0.0);
    let cc = CheckConfig {
        tokens: 0,
        experts: cfg.experts as usize,
    };
    let rep = check(&layer, &data, &f, &b, &cc, &mut rng, &Quiet).expect("check");
    assert!(rep.ok(false), "{rep:?}");
    for e in [rep.y, rep.dx, rep.dw_gate_up, rep.dw_down] {
        assert!(e.max_ref > 0.0, "{rep:?}");
    }
    // the routed inputs' BF16 + expert-side FP8 rounding is modelled, so the weight gradients
    // (whose operands the reference rounds exactly as the device does) agree far below 1e-2
    assert!(
        rep.dw_gate_up.fro() < 1e-4 && rep.dw_down.fro() < 1e-4,
        "{rep:?}"
    );
    // one node: every record stays inside it; sequential pairs never overlap
    assert_eq!(f.stats.dispatch.inter_node_bytes, 0);
    assert!(f.stats.dispatch.intra_node_bytes > 0);
    for o in f.stats.overlaps.iter().chain(&b.stats.overlaps) {
        assert_eq!(o.comm.overlap(&o.compute), 0.0, "{}", o.pair);
    }
}

#[test]
fn bad_configurations_are_refused_naming_the_field() {
    let field = |c: MoeConfig| match c.validate() {
        Err(MoeError::Config { field, .. }) => field,
        Err(e) => panic!("wrong error: {e}"),
        Ok(()) => panic!("accepted {c:?}"),
    };
    assert_eq!(
        field(MoeConfig {
            hidden: 100,
            ..small(1)
        }),
        "hidden"
    );
    assert_eq!(
        field(MoeConfig {
            experts: 9,
            ..small(1)
        }),
        "experts"
    );
    assert_eq!(
        field(MoeConfig {
            gpus_per_node: 0,
            ..small(1)
        }),
        "nodes"
    );
    assert_eq!(
        field(MoeConfig {
            num_sms: 0,
            ..small(1)
        }),
        "num_sms"
    );
    // routing constraints come from `ep` (top-k groups above the group count)
    let c = MoeConfig {
        topk_groups: 5,
        ..small(1)
    };
    assert!(matches!(c.validate(), Err(MoeError::Ep(_))));
    // a device count that does not match the ranks
    let c = small(1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let (w, _) = random_step(&c, &mut rng);
    match MoeLayer::new(c.clone(), devices(&c, 1300)[..1].to_vec(), w, &Quiet) {
        Err(MoeError::Shape(m)) => assert!(m.contains("devices"), "{m}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("1 device accepted for 2 ranks"),
    }
}

/// Downloads a device tensor's BF16 values as f32.
fn download(b: &runtime::Buffer<half::bf16>) -> Vec<f32> {
    b.to_vec().unwrap().iter().map(|v| v.to_f32()).collect()
}

/// BF16 uploads of per-rank host tensors, rank `r`'s on `devs[r]`.
fn upload_bf16(v: &[Vec<f32>], devs: &[Device]) -> Vec<runtime::Buffer<half::bf16>> {
    v.iter()
        .zip(devs)
        .map(|(x, d)| {
            let b: Vec<half::bf16> = x.iter().map(|&a| half::bf16::from_f32(a)).collect();
            d.upload(&b).unwrap()
        })
        .collect()
}

/// A layer over fresh devices and BF16-valued step data (so the host and device interfaces see
/// the same inputs), and its forward + backward through the device interface with Y and dX
/// downloaded into the host fields; the per-expert counts.
fn device_step(cfg: &MoeConfig, base: u32) -> (MoeLayer, StepData, Forward, Backward, Vec<u64>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
    let (weights, mut data) = random_step(cfg, &mut rng);
    for v in data.x.iter_mut().flatten() {
        *v = half::bf16::from_f32(*v).to_f32();
    }
    let devs = devices(cfg, base);
    let mut layer = MoeLayer::new(cfg.clone(), devs.clone(), weights, &Quiet).expect("layer");
    let x = upload_bf16(&data.x, &devs);
    let mut f = layer.forward_dev(x, &Quiet).expect("forward_dev");
    let counts = layer.expert_counts(&f).expect("counts");
    let dy = upload_bf16(&data.dy, &devs);
    let mut b = layer.backward_dev(&f, &dy, &Quiet).expect("backward_dev");
    assert!(f.y.is_empty() && b.dx.is_empty());
    f.y = f.y_dev.iter().map(download).collect();
    b.dx = b.dx_dev.iter().map(download).collect();
    (layer, data, f, b, counts)
}

/// The device-buffer interface (the trainer's), BF16 inputs on the ranks' devices: Y and dX,
/// downloaded from the device outputs, pass the f64 reference on every token; the per-expert
/// counts (the `expert_count` kernel) cover every routed token; misplaced or short inputs are
/// refused.
#[test]
fn device_interface_matches_the_f64_reference() {
    let cfg = small(0xde71);
    let (mut layer, data, f, b, counts) = device_step(&cfg, 1600);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let cc = CheckConfig {
        tokens: 0,
        experts: cfg.experts as usize,
    };
    let rep = check(&layer, &data, &f, &b, &cc, &mut rng, &Quiet).expect("check");
    assert!(rep.ok(true), "{rep:?}");
    assert!(rep.y.max_ref > 0.0 && rep.dx.max_ref > 0.0, "{rep:?}");
    let routed = cfg.ranks() as u64 * u64::from(cfg.tokens) * u64::from(cfg.topk);
    assert_eq!(counts.iter().sum::<u64>(), routed);
    assert!(counts.iter().filter(|&&c| c > 0).count() > 1, "{counts:?}");

    // a rank's input on another rank's device, or too short, is refused before any work
    let devs = devices(&cfg, 1600);
    let mut swapped = upload_bf16(&data.x, &devs);
    swapped.swap(0, 1);
    match layer.forward_dev(swapped, &Quiet) {
        Err(MoeError::Shape(m)) => assert!(m.contains("rank 0"), "{m}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("misplaced input accepted"),
    }
    let short = devs.iter().map(|d| d.alloc(7).unwrap()).collect();
    match layer.forward_dev(short, &Quiet) {
        Err(MoeError::Shape(m)) => assert!(m.contains("x:"), "{m}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("short input accepted"),
    }
}

/// With the gate's wgrad in 2 chunks (X^T chunks transposed on the device; the host interface
/// transposes them on the host) the device and host interfaces give the same bits: Y, dX, the
/// routed and gate weight gradients, the per-expert counts.
#[test]
fn device_and_host_interfaces_agree_bit_for_bit() {
    let cfg = MoeConfig {
        tokens: 256,
        wgrad_chunks: 2,
        ..small(0xc4a2)
    };
    let (mut layer, data, f, b, counts) = device_step(&cfg, 1700);
    let fh = layer.forward(&data.x, &Quiet).expect("forward");
    let bh = layer.backward(&fh, &data.dy, &Quiet).expect("backward");
    assert!(fh.y == f.y && bh.dx == b.dx, "Y or dX differ");
    assert!(
        bh.routed_dw == b.routed_dw,
        "routed weight gradients differ"
    );
    assert!(b.gate.iter().all(|g| g.dw.len() == 2));
    let gate_dw =
        |b: &Backward| -> Vec<Vec<f32>> { b.gate.iter().flat_map(|g| g.dw.clone()).collect() };
    assert!(gate_dw(&bh) == gate_dw(&b), "gate weight gradients differ");
    assert_eq!(layer.expert_counts(&fh).expect("counts"), counts);
}
