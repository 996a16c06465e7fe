//! The embedding (a first stage without layers) and the head (a last stage without layers).

use super::*;

#[test]
fn embedding_matches_the_reference_as_a_stage() {
    let c = tiny();
    let p = params(&c, 21);
    let mut rng = rand::rngs::StdRng::seed_from_u64(22);
    let mb = micro_batch(&mut rng, 0);
    let ids: Vec<i32> = mb.inputs.concat();

    // embedding: the rows of the BF16 table, and the scatter-add of dy
    let s = spec(&c, 0, 2, 0..0, 130);
    let devs = s.devices.clone();
    let mut st = stage(s, &p);
    let StageOut::Hidden(x) = st.forward(&mb, None).unwrap() else {
        panic!("the first of two stages returns activations")
    };
    let dy = bf_values(&mut rng, N * 128, 1.0);
    assert!(st
        .backward(0, Some(boundary(&devs, &dy)))
        .unwrap()
        .is_none());
    let (g, _) = st.take_grads().unwrap();
    let dyf: Vec<f64> = dy.iter().map(|&v| f64::from(v)).collect();
    let want = run(&RefRun {
        m: &c.model,
        p: &p,
        layers: 0..0,
        seq: SEQ,
        t: T,
        ids: Some(&ids),
        x: None,
        labels: None,
        dy: Some(&dyf),
        loss_scale: 1.0,
    });
    assert_eq!(
        read(&x),
        want.y,
        "the gather is a bit-exact copy of BF16 rows"
    );
    assert_eq!(g.len(), 1);
    // f32 sums of at most a few BF16 rows per id (measured ~1e-8)
    let e = rel(
        &g[0].1.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
        &want.grads["embed"],
    );
    assert!(g[0].0 == "embed" && e < 1e-6, "{}: {e:.3e}", g[0].0);
}

#[test]
fn head_matches_the_reference_as_a_stage() {
    let c = tiny();
    let p = params(&c, 21);
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let mb = micro_batch(&mut rng, 0);
    let labels: Vec<i32> = mb.labels.concat();
    // head: summed loss, dx, final norm and head gradients, with a loss scale
    let s = spec(&c, 1, 2, 2..2, 140);
    let devs = s.devices.clone();
    let mut st = stage(s, &p);
    let scale = 1.0 / mb.labelled() as f32;
    st.set_loss_scale(scale);
    let xv = bf_values(&mut rng, N * 128, 2.0);
    let StageOut::Loss(loss) = st.forward(&mb, Some(boundary(&devs, &xv))).unwrap() else {
        panic!("the last stage returns the loss")
    };
    let dx = st.backward(0, None).unwrap().unwrap();
    let (g, load) = st.take_grads().unwrap();
    assert!(load.is_empty());
    let xf: Vec<f64> = xv.iter().map(|&v| f64::from(v)).collect();
    let want = run(&RefRun {
        m: &c.model,
        p: &p,
        layers: 2..2,
        seq: SEQ,
        t: T,
        ids: None,
        x: Some(&xf),
        labels: Some(&labels),
        dy: None,
        loss_scale: f64::from(scale),
    });
    let el = (loss - want.loss).abs() / want.loss;
    let edx = rel(&read(&dx), &want.dx);
    eprintln!(
        "head: loss {loss:.6} vs {:.6} (rel {el:.2e}), dx rel {edx:.2e}",
        want.loss
    );
    // the roundings modelled: the loss 1.5e-7, dx 4.2e-5, gradients 2.4e-5..3.4e-5 (f32
    // accumulation and the rounding flips it causes)
    assert!(el < 1e-6 && edx < 2e-4, "loss {el:.3e}, dx {edx:.3e}");
    check_grads(&g, &want, &|_| 2e-4);
}

#[test]
fn bad_micro_batches_are_refused_with_clear_errors() {
    let c = tiny();
    let p = params(&c, 31);
    let mut st = stage(spec(&c, 0, 2, 0..0, 155), &p);
    let mut rng = rand::rngs::StdRng::seed_from_u64(32);
    let mut mb = micro_batch(&mut rng, 0);
    mb.inputs[1].pop();
    let m = msg(st.forward(&mb, None).map(|_| ()));
    assert!(m.contains("inputs") && m.contains("128 token ids"), "{m}");
    // an id outside the vocabulary
    let mut mb = micro_batch(&mut rng, 0);
    mb.inputs[0][5] = 300;
    let m = msg(st.forward(&mb, None).map(|_| ()));
    assert!(m.contains("300") && m.contains("vocabulary"), "{m}");
    // backward without a forward
    let m = msg(st.backward(3, None).map(|_| ()));
    assert!(
        m.contains("micro-batch 3") && m.contains("without its forward"),
        "{m}"
    );
    // a forward run twice, a backward after discard
    let ok = micro_batch(&mut rng, 0);
    st.forward(&ok, None).unwrap();
    let m = msg(st.forward(&ok, None).map(|_| ()));
    assert!(
        m.contains("micro-batch 0") && m.contains("already ran"),
        "{m}"
    );
    st.discard(0);
    let m = msg(st.backward(0, None).map(|_| ()));
    assert!(m.contains("without its forward"), "{m}");
}

fn msg(r: Result<(), TrainError>) -> String {
    match r {
        Err(e) => e.to_string(),
        Ok(()) => panic!("accepted"),
    }
}

#[test]
fn bad_boundaries_and_parameters_are_refused_with_clear_errors() {
    let c = tiny();
    let p = params(&c, 31);
    let s = spec(&c, 0, 2, 0..0, 150);
    let devs = s.devices.clone();
    let mut st = stage(s.clone(), &p);
    let mut rng = rand::rngs::StdRng::seed_from_u64(33);
    // a middle stage given a boundary of the wrong size
    let mid = spec(&c, 1, 3, 0..1, 160);
    let mdevs = mid.devices.clone();
    let mut ms = stage(mid, &p);
    let short = Boundary {
        ranks: mdevs
            .iter()
            .map(|d| d.upload(&vec![0.5f32; 100]).unwrap())
            .collect(),
    };
    let m = msg(ms
        .forward(&micro_batch(&mut rng, 0), Some(short))
        .map(|_| ()));
    assert!(
        m.contains("forward input") && m.contains("[128, 128]"),
        "{m}"
    );
    // ... or one on other devices
    let elsewhere = boundary(&devs, &vec![0.5f32; N * 128]);
    let m = msg(ms
        .forward(&micro_batch(&mut rng, 0), Some(elsewhere))
        .map(|_| ()));
    assert!(
        m.contains("rank 0's buffer is not on the stage's device"),
        "{m}"
    );
    // parameters of the wrong shape, at construction and at load
    let mut bad = p.clone();
    let i = bad.index("layers.0.attn.wq_b").unwrap();
    bad.specs[i].shape = vec![96, 16];
    bad.data[i].truncate(96 * 16);
    let m = match DeviceStage::new(s, &bad) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted"),
    };
    assert!(
        m.contains("layers.0.attn.wq_b") && m.contains("[96, 16]"),
        "{m}"
    );
    let m = msg(st.load_params(&bad));
    assert!(m.contains("layers.0.attn.wq_b"), "{m}");
    // a micro-batch size the EP group cannot split
    let mut c3 = tiny();
    c3.train.micro_batch = 3;
    let m = match DeviceStage::new(spec(&c3, 0, 1, 0..2, 170), &p) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted"),
    };
    assert!(m.contains("micro_batch = 3"), "{m}");
    // an EP group of another size than parallel.ep
    let mut one = spec(&c, 0, 1, 0..2, 175);
    one.devices.truncate(1);
    let m = match DeviceStage::new(one, &p) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted"),
    };
    assert!(
        m.contains("1 devices") && m.contains("parallel.ep = 2"),
        "{m}"
    );
}
