//! Training-step kernels (`kernels::train`) on the emulator against their f64 references, on
//! fresh random inputs with poisoned outputs (bounds documented at each `check_*`), plus the
//! host API's bad-input errors and the YaRN frequency rule.

use half::bf16;
use kernels::registry::{registry, Kind};
use kernels::train::{embed, norm, optim, rope, xent, OpCheck};
use kernels::{KernelError, ScaleMode};

fn stream(dev: u32) -> runtime::Stream {
    runtime::Device::emu(dev).default_stream()
}

fn ok(what: &str, c: OpCheck) {
    eprintln!(
        "{what}: {} out of bound, worst err/bound {:.3}, {} boundary, rel fro {:.2e}, {:.3}s, {:?} lane-instr",
        c.mismatches, c.worst, c.boundary, c.rel_fro, c.seconds, c.lane_instructions
    );
    assert_eq!(c.mismatches, 0, "{what}: {c:?}");
    assert!(c.worst <= 1.0, "{what}: {c:?}");
}

/// Every registered training kernel at its registry shapes (what `ptxforge kernels --check` runs).
#[test]
fn registry_entries_pass_their_checks() {
    let st = stream(80);
    let mut n = 0;
    for info in registry()
        .iter()
        .filter(|k| matches!(k.kind, Kind::Train(_)))
    {
        for (i, s) in info.test_shapes.iter().enumerate() {
            let rep = info.check(&st, s, 7000 + i as u64).unwrap();
            eprintln!(
                "{:<24} {:?}: {} mismatches, worst {:.3}, {:.3}s",
                info.name, s, rep.mismatches, rep.rel_err_rounded, rep.seconds
            );
            assert!(rep.pass, "{} {s:?}: {rep:?}", info.name);
            n += 1;
        }
    }
    assert!(n >= 30, "{n} checks");
}

#[test]
fn rmsnorm_v3_width_and_odd_rows() {
    let st = stream(81);
    ok(
        "rmsnorm fwd 3x1536",
        norm::check_fwd(&st, 3, 1536, norm::NormOut::Bf16, 1).unwrap(),
    );
    let o = norm::NormOut::Fp8(ScaleMode::Pow2);
    ok(
        "rmsnorm fwd fp8 pow2 5x1536",
        norm::check_fwd(&st, 5, 1536, o, 2).unwrap(),
    );
    ok(
        "rmsnorm bwd 65x136",
        norm::check_bwd(&st, 65, 136, 3).unwrap(),
    );
    ok("rmsnorm bwd 1x8", norm::check_bwd(&st, 1, 8, 4).unwrap());
}

/// The fused FP8 output is the FP8 quantisation of the bf16 output's f32 values: dequantised,
/// it is within an e4m3 half-ulp of y, and the scales follow the row quantiser's rule.
#[test]
fn rmsnorm_fp8_float_scales() {
    let st = stream(82);
    let o = norm::NormOut::Fp8(ScaleMode::Float);
    ok(
        "rmsnorm fwd fp8 float 33x128",
        norm::check_fwd(&st, 33, 128, o, 5).unwrap(),
    );
}

#[test]
fn cross_entropy_dtypes_and_settings() {
    let st = stream(83);
    ok(
        "xent bf16 4x16",
        xent::check_xent(&st, 4, 16, true, 8).unwrap(),
    );
    ok(
        "xent f32 2x6000",
        xent::check_xent(&st, 2, 6000, false, 9).unwrap(),
    );
}

#[test]
fn adamw_single_and_many_tensors() {
    let st = stream(84);
    ok("adamw 1 x 1", optim::check_step(&st, 1, 1, 10).unwrap());
    ok(
        "adamw 9000 over 5",
        optim::check_step(&st, 9000, 5, 11).unwrap(),
    );
}

#[test]
fn rope_v3_q_layout() {
    let st = stream(85);
    ok(
        "rope fwd 4 tok x 4 heads x 64",
        rope::check_rope(&st, 4, 4, 64, rope::RopeDir::Forward, 12).unwrap(),
    );
    ok(
        "rope bwd 3 tok x 2 heads x 8",
        rope::check_rope(&st, 3, 2, 8, rope::RopeDir::Backward, 13).unwrap(),
    );
}

#[test]
fn embedding_repeats_and_wide_rows() {
    let st = stream(86);
    ok(
        "embed fwd f32",
        embed::check_fwd(&st, 64, 5, 8, false, 14).unwrap(),
    );
    ok(
        "embed bwd bf16",
        embed::check_bwd(&st, 64, 5, 8, true, 15).unwrap(),
    );
    ok(
        "embed bwd f32",
        embed::check_bwd(&st, 9, 300, 520, false, 16).unwrap(),
    );
}

/// YaRN: without scaling inv_freq[i] = theta^(-2i/d); with it, the fastest dimensions keep
/// their frequency, the slowest are divided by the factor, and the ramp is monotone between.
#[test]
fn yarn_frequencies() {
    let mut c = rope::RopeConfig::deepseek_v3();
    let plain = rope::RopeConfig { yarn: None, ..c };
    let f0 = plain.inv_freq();
    for (i, f) in f0.iter().enumerate() {
        let want = 10000f64.powf(-(2.0 * i as f64) / 64.0);
        assert!((f - want).abs() <= 1e-15 * want, "{i}");
    }
    let f = c.inv_freq();
    assert_eq!(f[0], f0[0]);
    let last = f.len() - 1;
    assert!((f[last] - f0[last] / 40.0).abs() <= 1e-15 * f0[last]);
    let ratio: Vec<f64> = f.iter().zip(&f0).map(|(a, b)| a / b).collect();
    assert!(ratio.windows(2).all(|w| w[1] <= w[0] + 1e-15), "{ratio:?}");
    assert!(
        ratio.iter().any(|r| *r < 1.0 && *r > 1.0 / 40.0),
        "a ramp region exists"
    );
    assert_eq!(c.table_scale(), 1.0);
    if let Some(y) = c.yarn.as_mut() {
        y.mscale = 0.707;
    }
    let want = (0.1 * 0.707 * 40f64.ln() + 1.0) / (0.1 * 40f64.ln() + 1.0);
    assert!((c.table_scale() - want).abs() < 1e-15);
}

fn is_shape_err<T>(r: Result<T, KernelError>, needle: &str) {
    match r.map(|_| ()) {
        Err(e @ KernelError::Shape { .. }) => {
            assert!(e.to_string().contains(needle), "`{e}` lacks `{needle}`")
        }
        other => panic!("expected a shape error containing `{needle}`, got {other:?}"),
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    let dev = runtime::Device::emu(87);
    let st = dev.default_stream();
    let x = dev.alloc::<bf16>(4 * 192).unwrap();
    let w = dev.alloc::<f32>(192).unwrap();
    let mut y = dev.alloc::<bf16>(4 * 192).unwrap();
    let mut rs = dev.alloc::<f32>(4).unwrap();
    let spec = |hidden| norm::RmsNormSpec {
        rows: 4,
        hidden,
        eps: 1e-6,
    };
    // width not a multiple of 8, buffer too short, fp8 width not a multiple of 128, bad eps
    is_shape_err(
        norm::rmsnorm_fwd(&st, &spec(190), &x, &w, &mut y, &mut rs),
        "multiple of 8",
    );
    is_shape_err(
        norm::rmsnorm_fwd(&st, &spec(256), &x, &w, &mut y, &mut rs),
        "holds",
    );
    let (mut q, mut s) = (
        dev.alloc::<u8>(4 * 192).unwrap(),
        dev.alloc::<f32>(8).unwrap(),
    );
    let o = norm::Fp8Out {
        q: &mut q,
        s: &mut s,
        mode: ScaleMode::Float,
    };
    is_shape_err(
        norm::rmsnorm_fwd_fp8(&st, &spec(192), &x, &w, o, &mut rs),
        "multiple of 128",
    );
    let bad_eps = norm::RmsNormSpec {
        rows: 4,
        hidden: 192,
        eps: f32::NAN,
    };
    is_shape_err(
        norm::rmsnorm_fwd(&st, &bad_eps, &x, &w, &mut y, &mut rs),
        "eps",
    );
    // cross-entropy: label out of range, vocab not a multiple of 8
    let xs = xent::XentSpec {
        vocab: 16,
        ignore_index: -100,
        label_smoothing: 0.0,
    };
    is_shape_err(xent::Labels::new(&dev, &[3, 16], &xs), "outside [0, 16)");
    let xs12 = xent::XentSpec { vocab: 12, ..xs };
    is_shape_err(xent::Labels::new(&dev, &[3], &xs12), "multiple of 8");
    let labels = xent::Labels::new(&dev, &[3, -100], &xs).unwrap();
    let logits = dev.alloc::<f32>(31).unwrap();
    let (mut l, mut lse) = (dev.alloc::<f32>(2).unwrap(), dev.alloc::<f32>(2).unwrap());
    is_shape_err(
        xent::xent_fwd(&st, &labels, &logits, &mut l, &mut lse),
        "logits",
    );
    // embedding: id out of range
    let es = embed::EmbedSpec {
        vocab: 10,
        hidden: 16,
    };
    is_shape_err(
        embed::TokenBatch::new(&dev, &[1, 10, 2], &es),
        "token 1 has id 10",
    );
    is_shape_err(embed::TokenBatch::new(&dev, &[-1], &es), "id -1");
    // rope: position beyond the table, rope part wider than the row
    let cfg = rope::RopeConfig::deepseek_v3();
    let tables = rope::RopeTables::new(&dev, &cfg, 16).unwrap();
    is_shape_err(
        rope::Positions::new(&dev, &[0, 16], &tables),
        "outside the table",
    );
    let pos = rope::Positions::new(&dev, &[0, 15], &tables).unwrap();
    let mut xr = dev.alloc::<bf16>(2 * 64).unwrap();
    let lay = rope::RopeLayout {
        heads: 1,
        row_stride: 64,
        head_stride: 64,
        col0: 2,
    };
    is_shape_err(
        rope::rope_apply(&st, rope::RopeDir::Forward, &mut xr, &lay, &pos, &tables),
        "does not fit",
    );
    // adamw: clip without a norm buffer, bad beta
    let (mut p, g) = (dev.alloc::<f32>(4).unwrap(), dev.alloc::<f32>(4).unwrap());
    let (mut m, mut v) = (dev.alloc::<bf16>(4).unwrap(), dev.alloc::<bf16>(4).unwrap());
    let cfg = optim::AdamWConfig::deepseek_v3(1e-3, 1);
    let ps = optim::ParamState {
        p: &mut p,
        g: &g,
        m: &mut m,
        v: &mut v,
    };
    is_shape_err(optim::adamw_step(&st, &cfg, ps, None), "no norm buffer");
    let bad = optim::AdamWConfig { beta2: 1.0, ..cfg };
    let ps = optim::ParamState {
        p: &mut p,
        g: &g,
        m: &mut m,
        v: &mut v,
    };
    is_shape_err(optim::adamw_step(&st, &bad, ps, None), "hyper-parameters");
}

/// The reductions run in a fixed order: two runs of the RMSNorm weight gradient and of the
/// global gradient norm on the same inputs give the same bits.
#[test]
fn reductions_are_bitwise_reproducible() {
    let dev = runtime::Device::emu(88);
    let st = dev.default_stream();
    let mut rg = kernels::reference::rng(21);
    let (rows, h) = (100, 264);
    let xv = kernels::reference::random_activations(&mut rg, rows * h, h);
    let xb: Vec<bf16> = xv.iter().map(|v| bf16::from_f32(*v)).collect();
    let x = dev.upload(&xb).unwrap();
    let w = dev.upload(&vec![0.75f32; h]).unwrap();
    let rstd = dev.upload(&vec![1.25f32; rows]).unwrap();
    let spec = norm::RmsNormSpec {
        rows,
        hidden: h,
        eps: 1e-6,
    };
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut dx = dev.alloc::<bf16>(rows * h).unwrap();
        let mut dw = dev.alloc::<f32>(h).unwrap();
        dw.fill(f32::NAN).unwrap();
        let mut ws = dev.alloc::<f32>(spec.dw_workspace_len()).unwrap();
        let io = norm::RmsNormBwd {
            x: &x,
            weight: &w,
            dy: &x,
            rstd: &rstd,
            dx: &mut dx,
            dweight: &mut dw,
            accumulate: false,
            workspace: &mut ws,
        };
        norm::rmsnorm_bwd(&st, &spec, io).unwrap();
        st.synchronize().unwrap();
        runs.push(
            dw.to_vec()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>(),
        );
    }
    assert!(runs[1].iter().all(|b| f32::from_bits(*b).is_finite()));
    assert_eq!(runs[0], runs[1]);
    // accumulate: dweight += the same gradient gives exactly twice it (sum first, then add)
    let mut dx = dev.alloc::<bf16>(rows * h).unwrap();
    let once: Vec<f32> = runs[0].iter().map(|b| f32::from_bits(*b)).collect();
    let mut dw = dev.upload(&once).unwrap();
    let mut ws = dev.alloc::<f32>(spec.dw_workspace_len()).unwrap();
    let io = norm::RmsNormBwd {
        x: &x,
        weight: &w,
        dy: &x,
        rstd: &rstd,
        dx: &mut dx,
        dweight: &mut dw,
        accumulate: true,
        workspace: &mut ws,
    };
    norm::rmsnorm_bwd(&st, &spec, io).unwrap();
    st.synchronize().unwrap();
    let twice: Vec<f32> = once.iter().map(|v| 2.0 * v).collect();
    assert_eq!(dw.to_vec().unwrap(), twice);
    let g = dev.upload(&xv).unwrap();
    let mut norms = Vec::new();
    for _ in 0..2 {
        let mut ws = dev
            .alloc::<f32>(optim::grad_norm_workspace(&[g.len(), g.len()]))
            .unwrap();
        let mut out = dev.alloc::<f32>(1).unwrap();
        out.fill(f32::NAN).unwrap();
        optim::grad_norm(&st, &[&g, &g], &mut ws, &mut out).unwrap();
        st.synchronize().unwrap();
        norms.push(out.to_vec().unwrap()[0].to_bits());
    }
    let want = 2f64.sqrt() * xv.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
    assert!((f64::from(f32::from_bits(norms[0])) - want).abs() < 1e-5 * want);
    assert_eq!(norms[0], norms[1]);
}

/// The fused norm's FP8 output is in the library's 1x128 format: the existing
/// `dequantize_fp8_1x128` reads it back to within an e4m3 half-ulp (x scale) of the f64 norm.
#[test]
fn fused_fp8_norm_feeds_the_library_dequantiser() {
    let dev = runtime::Device::emu(89);
    let st = dev.default_stream();
    let (rows, h) = (6, 256);
    let mut rg = kernels::reference::rng(31);
    let xv: Vec<bf16> = kernels::reference::random_activations(&mut rg, rows * h, h)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let wv: Vec<f32> = (0..h).map(|j| 0.5 + (j % 7) as f32 * 0.125).collect();
    let (x, w) = (dev.upload(&xv).unwrap(), dev.upload(&wv).unwrap());
    let spec = norm::RmsNormSpec {
        rows,
        hidden: h,
        eps: 1e-6,
    };
    let (mut q, mut s) = (
        dev.alloc::<u8>(rows * h).unwrap(),
        dev.alloc::<f32>(rows * 2).unwrap(),
    );
    let mut rs = dev.alloc::<f32>(rows).unwrap();
    let o = norm::Fp8Out {
        q: &mut q,
        s: &mut s,
        mode: ScaleMode::Pow2,
    };
    norm::rmsnorm_fwd_fp8(&st, &spec, &x, &w, o, &mut rs).unwrap();
    let mut y = dev.alloc::<f32>(rows * h).unwrap();
    y.fill(f32::NAN).unwrap();
    kernels::dequantize_fp8_1x128(&st, &q, &s, &mut y, rows, h).unwrap();
    st.synchronize().unwrap();
    let (yv, sv) = (y.to_vec().unwrap(), s.to_vec().unwrap());
    let r = norm::ref_rstd(&xv, rows, h, 1e-6);
    for i in 0..rows * h {
        let want = xv[i].to_f64() * r[i / h] * f64::from(wv[i % h]);
        let sc = f64::from(sv[i / 128]);
        let bound =
            kernels::moe::e4m3_half_ulp(want.abs() * (1.0 + 1e-6) / sc) * sc + 1e-6 * want.abs();
        assert!(
            (f64::from(yv[i]) - want).abs() <= bound,
            "{i}: {} vs {want}",
            yv[i]
        );
    }
}
