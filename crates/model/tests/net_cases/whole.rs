//! The whole tiny model as one stage, and the fixed-order reduction over micro-batches.

use super::*;

fn grads_f64(g: &NamedGrads) -> Vec<Vec<f64>> {
    g.iter()
        .map(|(_, v)| v.iter().map(|&x| f64::from(x)).collect())
        .collect()
}

#[test]
fn whole_model_forward_backward_matches_the_reference() {
    let c = tiny();
    let p = params(&c, 41);
    let mut st = stage(spec(&c, 0, 1, 0..2, 200), &p);
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mb = micro_batch(&mut rng, 0);
    let scale = 1.0 / mb.labelled() as f32;
    st.set_loss_scale(scale);
    let t0 = Instant::now();
    let StageOut::Loss(loss) = st.forward(&mb, None).unwrap() else {
        panic!("a single stage returns the loss")
    };
    assert!(st.backward(0, None).unwrap().is_none());
    let (g, load) = st.take_grads().unwrap();
    eprintln!("whole model forward + backward: {:.2?}", t0.elapsed());
    let (ids, labels) = (mb.inputs.concat(), mb.labels.concat());
    let want = run(&RefRun {
        m: &c.model,
        p: &p,
        layers: 0..2,
        seq: SEQ,
        t: T,
        ids: Some(&ids),
        x: None,
        labels: Some(&labels),
        dy: None,
        loss_scale: f64::from(scale),
    });
    let el = (loss - want.loss).abs() / want.loss;
    eprintln!("loss {loss:.6} vs {:.6}: rel {el:.2e}", want.loss);
    // every parameter of the model but the route biases has a gradient
    let n_params = p
        .specs
        .iter()
        .filter(|s| s.kind != ParamKind::RouteBias)
        .count();
    assert_eq!(g.len(), n_params);
    assert!(g
        .iter()
        .zip(p.specs.iter().filter(|s| s.kind != ParamKind::RouteBias))
        .all(|((n, v), s)| *n == s.name && v.len() == s.len()));
    // the forward is modelled rounding for rounding: measured 4e-8 with the one-combine MoE
    // path, 4.9e-6 with the slot-order combine the trainer uses (its f32 sum of the top-k and
    // shared outputs, one BF16 rounding, against the reference's exact sum, one rounding; the
    // MoE layer alone matches bit for bit, see `each_layer_kind_...`). Why the whole model
    // moves 100x more than the one-combine path is not understood yet; the loss is sensitive
    // at this level (the reference's own double- vs single-rounding model moves it by 2e-5)
    assert!(el < 1e-5, "loss rel error {el:.3e}");
    // two layers deep (see `deep_tol`)
    // (measured: BF16 parameters 7e-4..4.5e-3, FFN/MoE 1.5e-3..1.05e-2)
    let (name, worst) = check_grads(&g, &want, &deep_tol);
    eprintln!("worst gradient: {name} {worst:.2e}");
    assert_eq!(load.len(), 1);
    assert_eq!(load[0].1.iter().sum::<u64>(), (N * 2) as u64);
}

#[test]
fn micro_batch_gradients_sum_in_index_order_whatever_the_backward_order() {
    let c = tiny();
    let p = params(&c, 51);
    let mut st = stage(spec(&c, 0, 1, 0..2, 210), &p);
    st.set_loss_scale(1e-3);
    let mut rng = rand::rngs::StdRng::seed_from_u64(52);
    let mbs = [micro_batch(&mut rng, 0), micro_batch(&mut rng, 1)];
    let mut pass = |order: [usize; 2]| {
        let mut losses = Vec::new();
        for mb in &mbs {
            let StageOut::Loss(l) = st.forward(mb, None).unwrap() else {
                panic!("loss")
            };
            losses.push(l);
        }
        for i in order {
            st.backward(i, None).unwrap();
        }
        let (g, load) = st.take_grads().unwrap();
        (losses, g, load)
    };
    let (l01, g01, load01) = pass([0, 1]);
    let (l10, g10, load10) = pass([1, 0]);
    assert_eq!(l01, l10);
    assert_eq!(load01, load10);
    for ((n, a), (_, b)) in g01.iter().zip(&g10) {
        let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{n}: backward order changed the gradient bits");
    }
    // and the sum is micro-batch 0's gradient plus micro-batch 1's, in that order (f32)
    let mut single = Vec::new();
    for mb in &mbs {
        st.forward(mb, None).unwrap();
        st.backward(mb.index, None).unwrap();
        single.push(st.take_grads().unwrap().0);
    }
    for (k, (n, g)) in g01.iter().enumerate() {
        let (a, b) = (&single[0][k].1, &single[1][k].1);
        let sum_ok = g
            .iter()
            .zip(a.iter().zip(b))
            .all(|(s, (x, y))| s.to_bits() == (x + y).to_bits());
        assert!(sum_ok, "{n}: not g(mb 0) + g(mb 1)");
    }
    // the two micro-batches' gradients differ (the check above is not vacuous)
    let (a, b) = (grads_f64(&single[0]), grads_f64(&single[1]));
    assert!(a.iter().zip(&b).all(|(x, y)| x != y));
}

#[test]
fn load_params_replaces_every_weight() {
    let c = tiny();
    let (p1, p2) = (params(&c, 61), params(&c, 62));
    let mut rng = rand::rngs::StdRng::seed_from_u64(63);
    let mb = micro_batch(&mut rng, 0);
    let step = |st: &mut DeviceStage| {
        let StageOut::Loss(l) = st.forward(&mb, None).unwrap() else {
            panic!("loss")
        };
        st.backward(0, None).unwrap();
        (l, st.take_grads().unwrap().0)
    };
    let mut loaded = stage(spec(&c, 0, 1, 0..2, 230), &p1);
    let (l1, _) = step(&mut loaded);
    loaded.load_params(&p2).unwrap();
    let (l2, g2) = step(&mut loaded);
    let (lf, gf) = step(&mut stage(spec(&c, 0, 1, 0..2, 232), &p2));
    assert_ne!(l1, l2);
    assert_eq!(l2.to_bits(), lf.to_bits(), "reloaded vs fresh loss");
    for ((n, a), (_, b)) in g2.iter().zip(&gf) {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{n}"
        );
    }
}

/// Two MoE layers in one stage (two `MoeLayer`s, each with its EP group and SM partition, on
/// the same devices), driven through `Box<dyn Stage>` as the pipeline executor holds it.
#[test]
fn two_moe_layers_on_the_same_devices_match_the_reference() {
    let mut c = tiny();
    c.model.layers = 3;
    let p = params(&c, 71);
    let s = spec(&c, 1, 3, 1..3, 240);
    let devs = s.devices.clone();
    let mut st: Box<dyn Stage> = Box::new(stage(s, &p));
    let mut rng = rand::rngs::StdRng::seed_from_u64(72);
    let x = bf_values(&mut rng, N * 128, 1.0);
    let dy = bf_values(&mut rng, N * 128, 1.0);
    let mb = micro_batch(&mut rng, 0);
    let StageOut::Hidden(y) = st.forward(&mb, Some(boundary(&devs, &x))).unwrap() else {
        panic!("activations")
    };
    let dx = st.backward(0, Some(boundary(&devs, &dy))).unwrap().unwrap();
    let (g, load) = st.take_grads().unwrap();
    let xf: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    let dyf: Vec<f64> = dy.iter().map(|&v| f64::from(v)).collect();
    let want = run(&RefRun {
        m: &c.model,
        p: &p,
        layers: 1..3,
        seq: SEQ,
        t: T,
        ids: None,
        x: Some(&xf),
        labels: None,
        dy: Some(&dyf),
        loss_scale: 1.0,
    });
    let (ey, edx) = (rel(&read(&y), &want.y), rel(&read(&dx), &want.dx));
    eprintln!("two MoE layers: output rel {ey:.2e}, input gradient rel {edx:.2e}");
    // measured 4.5e-4 (FP8 flips in layer 2 fed by layer 1's rounding flips), 1.7e-3
    assert!(ey < 2e-3 && edx < 1e-2, "y {ey:.3e}, dx {edx:.3e}");
    check_grads(&g, &want, &deep_tol);
    let layers: Vec<usize> = load.iter().map(|l| l.0).collect();
    assert_eq!(layers, vec![1, 2]);
}
