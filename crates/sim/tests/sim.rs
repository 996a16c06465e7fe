//! End-to-end checks of the simulator: internal consistency, the V3 public record, the
//! SM-budget knee, refusal of bad configurations, speed, outputs.

use sim::{Config, SimError};

fn v3_at(sms: usize) -> Config {
    let mut c = Config::v3();
    c.comm.sms = sms;
    c
}

/// Public record: 2.664M H800 GPU-hours of pre-training for 14.8T tokens (DeepSeek-V3 report)
/// = ~1,543 tokens/s per GPU including every real-world loss. Band documented in docs/SIM.md.
#[test]
fn v3_tokens_per_gpu_within_band_of_public_record() {
    let r = sim::simulate(&Config::v3()).unwrap();
    assert!(
        (1000.0..=2200.0).contains(&r.tokens_per_s_per_gpu),
        "{} tokens/s/GPU",
        r.tokens_per_s_per_gpu
    );
    // MFU vs FP8 dense peak: the record implies ~20%.
    assert!(r.mfu > 0.12 && r.mfu < 0.30, "mfu {}", r.mfu);
    assert_eq!(r.gpus, 2048);
    // 15360 sequences of 4096 tokens per step.
    assert_eq!(r.tokens_per_step, 15360.0 * 4096.0);
    // ~37B activated params + attention: 6N + attention ~ 0.25-0.27 TFLOP/token.
    assert!(r.model_tflop_per_token > 0.24 && r.model_tflop_per_token < 0.28);
    // The real run fit in 80 GB; the estimate is documented as +-30%.
    assert!(
        r.memory.total_gb > 56.0 && r.memory.total_gb < 104.0,
        "{:?}",
        r.memory
    );
}

/// V3 report: computation-to-communication ratio of a cross-node MoE layer is about 1:1.
#[test]
fn v3_compute_to_comm_ratio_near_one() {
    let r = sim::simulate(&Config::v3()).unwrap();
    let moe = r.layers.iter().find(|l| l.kind == "moe").unwrap();
    let compute = moe.attn_ms + moe.moe_gemm_ms;
    let comm = moe.dispatch_ms + moe.combine_ms;
    let ratio = compute / comm;
    assert!(ratio > 0.6 && ratio < 1.7, "forward compute/comm = {ratio}");
}

#[test]
fn doubling_bandwidth_halves_communication_time() {
    let mut a = Config::v3();
    a.hardware.inter_node_latency_us = 0.0;
    a.hardware.intra_node_latency_us = 0.0;
    a.hardware.comm_gbps_per_sm = 1e6; // SMs never the limit
    let mut b = a.clone();
    b.hardware.inter_node_gbps *= 2.0;
    b.hardware.intra_node_gbps *= 2.0;
    let ra = sim::simulate(&a).unwrap();
    let rb = sim::simulate(&b).unwrap();
    let (la, lb) = (&ra.layers[5], &rb.layers[5]);
    assert_eq!(la.kind, "moe");
    for (x, y) in [
        (la.dispatch_ms, lb.dispatch_ms),
        (la.combine_ms, lb.combine_ms),
        (la.bwd_dispatch_ms, lb.bwd_dispatch_ms),
        (la.bwd_combine_ms, lb.bwd_combine_ms),
    ] {
        assert!(x > 0.0 && (x / y - 2.0).abs() < 1e-9, "{x} vs {y}");
    }
    // Compute untouched.
    assert_eq!(la.moe_gemm_ms, lb.moe_gemm_ms);
}

#[test]
fn fewer_sms_cap_communication() {
    let a = sim::simulate(&v3_at(4)).unwrap();
    let b = sim::simulate(&v3_at(20)).unwrap();
    assert!(a.layers[5].dispatch_ms > 2.0 * b.layers[5].dispatch_ms);
}

#[test]
fn zero_comm_sms_cannot_complete() {
    let e = sim::simulate(&v3_at(0)).unwrap_err();
    assert!(matches!(e, SimError::CannotComplete(_)), "{e}");
    assert!(e.to_string().contains("cannot progress"));
    // Without cross-GPU experts (EP = 1) zero SMs is fine.
    let mut c = Config::h200_node();
    c.parallelism.ep = 1;
    c.comm.sms = 0;
    let r = sim::simulate(&c).unwrap();
    assert_eq!(r.exposed_comm_s, 0.0);
}

/// V3 report: 20 of 132 SMs for communication suffice to hide dispatch/combine; the sweep
/// finds the knee near there and reports where fewer stops being enough.
#[test]
fn sweep_knee_near_twenty_sms() {
    let t = std::time::Instant::now();
    let sw = sim::sweep(&Config::v3(), 0, 40).unwrap();
    assert!(t.elapsed().as_secs_f64() < 10.0);
    assert_eq!(sw.points.len(), 41);
    assert!(sw.points[0].step_time_s.is_none() && sw.points[0].error.is_some());
    let knee = sw.knee_sms.unwrap();
    assert!((14..=24).contains(&knee), "knee {knee}");
    let below = sw.not_enough_below.unwrap();
    let step = |n: usize| sw.points[n].step_time_s.unwrap();
    assert!(step(below) > step(knee));
    // Step time falls steeply before the knee and rises slowly (fewer compute SMs) after it.
    assert!(step(4) > 1.2 * step(knee));
    assert!(step(40) > step(knee));
    assert!(step(40) < 1.25 * step(knee));
    // Exposed communication falls with the budget.
    let ex = |n: usize| sw.points[n].exposed_comm_s.unwrap();
    assert!(ex(4) > ex(knee) && ex(knee) >= ex(40));
}

#[test]
fn v3_simulates_under_a_second() {
    let t = std::time::Instant::now();
    sim::simulate(&Config::v3()).unwrap();
    assert!(t.elapsed().as_secs_f64() < 1.0);
}

#[test]
fn dualpipe_beats_1f1b_and_bubble_is_smaller() {
    let d = sim::simulate(&Config::v3()).unwrap();
    let mut c = Config::v3();
    c.schedule = sim::ScheduleKind::OneFOneB;
    let o = sim::simulate(&c).unwrap();
    assert!(d.step_time_s < o.step_time_s);
    assert!(d.bubble_s < o.bubble_s);
    assert!(d.exposed_comm_s < o.exposed_comm_s);
}

fn field_of(e: SimError) -> String {
    match e {
        SimError::Config { field, .. } => field,
        other => panic!("expected a config error, got {other}"),
    }
}

#[test]
fn bad_configurations_are_refused_with_field_and_rule() {
    let mut c = Config::v3();
    c.parallelism.ep = 48; // does not divide 128 GPUs per stage
    assert_eq!(field_of(sim::simulate(&c).unwrap_err()), "parallelism.ep");

    let mut c = Config::v3();
    c.model.top_groups = 9;
    let e = sim::simulate(&c).unwrap_err();
    assert!(e.to_string().contains("must not exceed groups"));
    assert_eq!(field_of(e), "model.top_groups");

    let mut c = Config::v3();
    c.comm.sms = 200;
    assert_eq!(field_of(sim::simulate(&c).unwrap_err()), "comm.sms");

    let mut c = Config::v3();
    c.parallelism.nodes = 255;
    assert_eq!(field_of(sim::simulate(&c).unwrap_err()), "parallelism.dp");

    let mut c = Config::v3();
    c.training.micro_batches = 15; // DualPipe needs an even count >= 2 pp
    assert_eq!(
        field_of(sim::simulate(&c).unwrap_err()),
        "training.micro_batches"
    );

    let mut c = Config::v3();
    c.hardware.inter_node_gbps = f64::NAN;
    assert_eq!(
        field_of(sim::simulate(&c).unwrap_err()),
        "hardware.inter_node_gbps"
    );

    let mut c = Config::v3();
    c.training.micro_batch_tokens = 1000;
    assert_eq!(
        field_of(sim::simulate(&c).unwrap_err()),
        "training.micro_batch_tokens"
    );

    assert!(sim::sweep(&Config::v3(), 0, 132).is_err());
    assert!(sim::parse_sweep("comm-sms=5..2").is_err());
    assert_eq!(sim::parse_sweep("comm-sms=0..40").unwrap(), (0, 40));
}

#[test]
fn config_files_round_trip_and_missing_fields_are_named() {
    let c = Config::v3();
    let text = c.to_toml();
    let back = Config::from_str_named(&text, "v3.toml").unwrap();
    assert_eq!(back, c);
    let json = serde_json::to_string(&c).unwrap();
    assert_eq!(Config::from_str_named(&json, "v3.json").unwrap(), c);
    // Drop a field: the error names it.
    let cut: String = text
        .lines()
        .filter(|l| !l.starts_with("top_groups"))
        .collect::<Vec<_>>()
        .join("\n");
    let e = Config::from_str_named(&cut, "cut.toml").unwrap_err();
    assert!(matches!(e, SimError::Parse { .. }));
    assert!(e.to_string().contains("top_groups"), "{e}");
    assert!(matches!(
        Config::load("nope-preset"),
        Err(SimError::UnknownPreset(_))
    ));
    // a file name that does not exist is "not found", not an unknown preset
    for missing in ["no-such-config.toml", "no/such/dir/c.json"] {
        let Err(e) = sim::load_any(missing) else {
            panic!("{missing}: a missing file accepted")
        };
        assert!(matches!(e, SimError::FileNotFound(_)), "{e}");
        assert!(e.to_string().contains("not found"), "{e}");
        assert!(matches!(
            Config::load(missing),
            Err(SimError::FileNotFound(_))
        ));
    }
    // a file that is not UTF-8 is located by line
    let p = std::env::temp_dir().join(format!("sim-latin1-{}.toml", std::process::id()));
    std::fs::write(&p, b"# ok\n# caf\xe9\n").unwrap();
    let Err(e) = sim::load_any(p.to_str().unwrap()) else {
        panic!("a Latin-1 file accepted")
    };
    let _ = std::fs::remove_file(&p);
    assert!(
        e.to_string().contains("line 2: invalid UTF-8 (byte 0xe9)"),
        "{e}"
    );
}

#[test]
fn h200_node_preset_runs() {
    let r = sim::simulate(&Config::h200_node()).unwrap();
    assert_eq!(r.gpus, 8);
    assert_eq!(r.fanout.ib_copies, 0.0);
    assert!(r.tokens_per_s_per_gpu > 0.0 && r.mfu < 0.6);
}

#[test]
fn outputs_trace_svg_png() {
    let s = sim::run(&Config::v3()).unwrap();
    let t = sim::trace::rank_trace(&s, s.report.critical_rank).unwrap();
    let ev = t["traceEvents"].as_array().unwrap();
    assert!(ev.iter().any(|e| e["name"] == "dispatch"));
    assert!(ev.iter().any(|e| e["tid"] == 0 && e["ph"] == "X"));
    assert!(sim::trace::rank_trace(&s, 99).is_none());
    let sw = sim::sweep(&Config::v3(), 0, 8).unwrap();
    let svg = sim::plot::svg(&sw, "t").unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("<path"));
    let png = sim::plot::png(&sw, "t").unwrap();
    assert_eq!(&png[1..4], b"PNG");
    let json = serde_json::to_value(&s.report).unwrap();
    for k in [
        "step_time_s",
        "tokens_per_s_per_gpu",
        "mfu",
        "exposed_comm_s",
        "bubble_s",
        "memory",
        "layers",
    ] {
        assert!(json.get(k).is_some(), "{k}");
    }
    assert!(json["layers"][5].get("dispatch_ms").is_some());
}

/// Absurd sizes and values that would overflow are refused with the field named, never a panic.
#[test]
fn absurd_sizes_are_refused_not_panics() {
    type Edit = fn(&mut Config);
    let cases: Vec<(&str, Edit)> = vec![
        ("parallelism.nodes", |c| c.parallelism.nodes = usize::MAX),
        ("parallelism.gpus_per_node", |c| {
            c.parallelism.gpus_per_node = usize::MAX
        }),
        ("parallelism.nodes", |c| c.parallelism.nodes = 0),
        ("parallelism.pp", |c| c.parallelism.pp = usize::MAX),
        ("training.micro_batch_tokens", |c| {
            c.training.micro_batch_tokens = 4096 << 40
        }),
        ("training.micro_batches", |c| {
            c.training.micro_batches = usize::MAX
        }),
        ("model.layers", |c| c.model.layers = 1_000_000_000),
        ("model.hidden", |c| c.model.hidden = usize::MAX),
        ("model.vocab", |c| c.model.vocab = usize::MAX),
        ("model.heads", |c| c.model.heads = 0),
        ("comm.router_samples", |c| {
            c.comm.router_samples = usize::MAX
        }),
        ("comm.router_samples", |c| {
            c.comm.router_samples = 1 << 20;
            c.model.routed_experts = 512;
        }),
        ("hardware.sms", |c| c.hardware.sms = usize::MAX),
        ("hardware.ll_latency_us", |c| {
            c.hardware.ll_latency_us = f64::INFINITY
        }),
    ];
    for (want, edit) in cases {
        let mut c = Config::v3();
        edit(&mut c);
        let got = field_of(sim::simulate(&c).unwrap_err());
        assert_eq!(got, want);
    }
}
