//! Calibration end to end on synthetic benchmark files: GEMM rows in the format of
//! `ptxforge bench gemm --json` and EP phases in the format of `ptxforge moe --json`, generated
//! from known parameters (random shapes and sizes, 1% noise), must give back a profile whose
//! model reproduces the measurements and whose parameters are near the truth.

use rand::{Rng, SeedableRng};
use serde_json::json;
use sim::calibrate::{self, HardwareProfile};
use sim::comm::{self, CommLoad};
use sim::compute::{self, Gemm, GemmCal};
use sim::config::h800;

fn tmp(name: &str) -> String {
    let d = std::env::temp_dir().join(format!("sim-calib-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name).to_string_lossy().into_owned()
}

#[test]
fn calibration_recovers_known_parameters() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut truth = h800();
    truth.inter_node_gbps = 31.0;
    truth.intra_node_gbps = 97.0;
    truth.comm_gbps_per_sm = 4.2;
    let tg = GemmCal {
        tile_eff: 0.58,
        tile_overhead_us: 1.3,
        hbm_eff: 0.71,
        launch_us: 5.0,
    };
    let mut noise = move || 1.0 + rng.gen_range(-0.01..0.01);
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let rows: Vec<_> = (0..24)
        .map(|i| {
            // Half the rows decode-like (small M, memory-bound), half large.
            let m = if i % 2 == 0 {
                16 * rng.gen_range(1..8usize)
            } else {
                64 * rng.gen_range(8..128usize)
            };
            let n = 128 * rng.gen_range(1..64usize);
            let k = 128 * rng.gen_range(4..64usize);
            let g = Gemm {
                m,
                n,
                k,
                in_bytes: 1,
                weights: 1,
            };
            let s = compute::gemm_time(&truth, &tg, truth.sms, &g) * noise();
            json!({"kernel": "gemm_fp8_nt", "m": m, "n": n, "k": k, "groups": 1, "seconds": s,
                   "tflops": g.flops() / s / 1e12})
        })
        .collect();
    let gemm_file = tmp("gemm.json");
    std::fs::write(&gemm_file, serde_json::to_string(&rows).unwrap()).unwrap();
    // EP runs: one intranode (no IB), two internode at different SM budgets.
    let mut files = vec![gemm_file];
    for (i, (ranks, nodes, sms)) in [(8usize, 1usize, 24usize), (16, 2, 8), (32, 4, 40)]
        .into_iter()
        .enumerate()
    {
        let mut phases =
            vec![json!({"phase": "gate gemm", "seconds": 0.1, "intra_bytes": 0, "inter_bytes": 0})];
        for name in ["dispatch (fp8)", "combine (bf16, weighted) + shared"] {
            let per = rng.gen_range(20e6..60e6);
            let ib = if nodes > 1 {
                per * rng.gen_range(0.3..0.6)
            } else {
                0.0
            };
            let load = CommLoad {
                ib,
                nvl: per,
                sm: ib + per,
            };
            let t = comm::normal_time(&truth, sms, &load).unwrap() * noise();
            phases.push(json!({"phase": name, "seconds": t, "comm_sms": sms,
                "inter_bytes": (ib * ranks as f64) as u64, "intra_bytes": (per * ranks as f64) as u64}));
        }
        let f = tmp(&format!("moe{i}.json"));
        let doc = json!({"ranks": ranks, "nodes": nodes, "num_sms": sms, "phases": phases});
        std::fs::write(&f, serde_json::to_string(&doc).unwrap()).unwrap();
        files.push(f);
    }
    let p = calibrate::calibrate(&h800(), &GemmCal::h800(), &files).unwrap();
    println!("{}", p.to_toml());
    assert_eq!(p.gemm_samples, 24);
    assert_eq!(p.comm_samples, 6);
    assert!(p.gemm_rms_error < 0.03, "{p:?}");
    assert!(p.comm_rms_error < 0.03, "{p:?}");
    let near = |a: f64, b: f64, tol: f64| (a / b - 1.0).abs() < tol;
    assert!(near(p.gemm.tile_eff, tg.tile_eff, 0.1), "{:?}", p.gemm);
    assert!(near(p.gemm.hbm_eff, tg.hbm_eff, 0.1), "{:?}", p.gemm);
    assert!(
        near(p.hardware.inter_node_gbps, 31.0, 0.1),
        "{:?}",
        p.hardware
    );
    assert!(
        near(p.hardware.comm_gbps_per_sm, 4.2, 0.1),
        "{:?}",
        p.hardware
    );
    // The profile round-trips and drives a training and a serving simulation.
    let path = tmp("profile.toml");
    std::fs::write(&path, p.to_toml()).unwrap();
    let back = HardwareProfile::load(&path).unwrap();
    assert_eq!(back.hardware, p.hardware);
    let mut cfg = sim::Config::v3();
    calibrate::apply_to_training(&mut cfg, &back);
    let slow = sim::simulate(&cfg).unwrap();
    let fast = sim::simulate(&sim::Config::v3()).unwrap();
    assert!(
        slow.step_time_s > fast.step_time_s,
        "slower links and GEMMs must slow the step"
    );
    let mut sc = sim::serve::ServeConfig::v3();
    calibrate::apply_to_serving(&mut sc, &back);
    assert_eq!(sc.hardware.inter_node_gbps, p.hardware.inter_node_gbps);
}

#[test]
fn calibration_refuses_bad_files() {
    let f = tmp("bad.json");
    std::fs::write(&f, "{\"hello\": 1}").unwrap();
    let e = calibrate::calibrate(&h800(), &GemmCal::h800(), std::slice::from_ref(&f)).unwrap_err();
    assert!(e.to_string().contains("bench gemm"), "{e}");
    std::fs::write(&f, "[{\"m\": 0, \"n\": 1, \"k\": 1, \"seconds\": 1}]").unwrap();
    let e = calibrate::calibrate(&h800(), &GemmCal::h800(), std::slice::from_ref(&f)).unwrap_err();
    assert!(e.to_string().contains("`m`"), "{e}");
    let e = calibrate::calibrate(&h800(), &GemmCal::h800(), &["/nonexistent/x.json".into()])
        .unwrap_err();
    assert!(e.to_string().contains("/nonexistent/x.json"), "{e}");
    assert!(calibrate::calibrate(&h800(), &GemmCal::h800(), &[]).is_err());
}

/// `ptxforge bench attn --json` rows (training forward/backward, decode) generated from known
/// efficiencies and decode rates give them back, and the profile changes the simulations.
#[test]
fn calibration_reads_attention_rows() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    let hw = h800();
    let peak = hw.tflops_bf16 * 1e12;
    let (fwd_eff, bwd_eff, gbps, tflops) = (0.31, 0.22, 2100.0, 410.0);
    let mut rows = Vec::new();
    for _ in 0..5 {
        let fl = rng.gen_range(1e11..1e13);
        let n = 1.0 + rng.gen_range(-0.01..0.01);
        rows.push(json!({"stage": "train fwd", "flops": fl, "bytes": 0.0,
                         "seconds": n * fl / (fwd_eff * peak)}));
        // the bench counts 3.5x the forward FLOPs in the backward; the model 2.5x
        rows.push(
            json!({"stage": "train bwd", "flops": 3.5 * fl, "bytes": 0.0,
                         "seconds": n * 2.5 * fl / (bwd_eff * peak)}),
        );
        // memory-bound decode (few query heads x tokens) and compute-bound decode
        let bytes = rng.gen_range(1e8..1e10);
        rows.push(
            json!({"stage": "decode", "flops": bytes * 0.5, "bytes": bytes,
                         "seconds": n * bytes / (gbps * 1e9)}),
        );
        let fl = rng.gen_range(1e12..1e13);
        rows.push(json!({"stage": "decode", "flops": fl, "bytes": fl / 1000.0,
                         "seconds": n * fl / (tflops * 1e12)}));
    }
    let f = tmp("attn.json");
    std::fs::write(&f, serde_json::to_string(&rows).unwrap()).unwrap();
    let p = calibrate::calibrate(&hw, &GemmCal::h800(), std::slice::from_ref(&f)).unwrap();
    let a = p.attn.expect("attention efficiencies fitted");
    let d = p.mla_decode.expect("decode model fitted");
    let near = |x: f64, t: f64| (x / t - 1.0).abs() < 0.02;
    assert!(
        near(a.fwd_eff, fwd_eff) && near(a.bwd_eff, bwd_eff),
        "{a:?}"
    );
    assert!(near(d.gbps, gbps) && near(d.tflops, tflops), "{d:?}");
    // the profile round-trips through TOML and reaches both simulations
    let back = HardwareProfile::from_toml(&p.to_toml(), "profile").unwrap();
    assert_eq!(back, p);
    let mut cfg = sim::Config::v3();
    let before = sim::simulate(&cfg).unwrap().step_time_s;
    calibrate::apply_to_training(&mut cfg, &back);
    assert_eq!(cfg.calibration.attn_fwd_eff, a.fwd_eff);
    let after = sim::simulate(&cfg).unwrap().step_time_s;
    assert!(
        after > before,
        "lower attention efficiency must slow the step"
    );
    let mut sc = sim::serve::ServeConfig::v3();
    calibrate::apply_to_serving(&mut sc, &back);
    assert_eq!(sc.calibration.mla_decode.gbps, d.gbps);
    assert_eq!(sc.calibration.attn_prefill_eff, a.fwd_eff);
    // an unknown stage is an error naming it
    std::fs::write(
        &f,
        "[{\"stage\": \"train sideways\", \"flops\": 1, \"bytes\": 0, \"seconds\": 1}]",
    )
    .unwrap();
    let e = calibrate::calibrate(&hw, &GemmCal::h800(), std::slice::from_ref(&f)).unwrap_err();
    assert!(e.to_string().contains("train sideways"), "{e}");
}
