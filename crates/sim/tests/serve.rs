//! V3 serving against DeepSeek's published day of production (Feb 2025, H800), and the
//! serving model's behaviour and refusals.

use sim::serve::{self, ServeConfig};
use sim::SimError;

#[test]
fn v3_serving_within_20_percent_of_published_per_node_throughput() {
    let r = serve::simulate(&ServeConfig::v3()).unwrap();
    print!("{}", r.text());
    for p in serve::compare_published(&r) {
        println!(
            "{}: published {}, simulated {:.1} ({:+.1}%)",
            p.what,
            p.published,
            p.simulated,
            p.error * 100.0
        );
        assert!(p.error.abs() <= 0.20, "{p:?}");
    }
    // Published average output speed 20-22 tokens/s per user.
    let u = r.decode.tokens_per_s_per_user;
    assert!((20.0..=22.0).contains(&u), "{u}");
    assert_eq!(r.prefill.ep, 32);
    assert_eq!(r.decode.ep, 144);
    assert_eq!(r.gpus, 14 * 32 + 9 * 144);
    // The KV cache of the chosen batch fits next to the weights.
    assert!(r.decode.kv_cache_gb_per_gpu + r.decode.weights_gb_per_gpu < 80.0);
}

#[test]
fn serving_responds_to_the_workload() {
    let base = serve::simulate(&ServeConfig::v3()).unwrap();
    // More cache hits: more input tokens per node.
    let mut c = ServeConfig::v3();
    c.workload.cache_hit_rate = 0.8;
    let r = serve::simulate(&c).unwrap();
    assert!(r.prefill.input_tokens_per_s_per_node > 1.5 * base.prefill.input_tokens_per_s_per_node);
    // A stricter per-user speed: smaller batches, less throughput per node.
    let mut c = ServeConfig::v3();
    c.workload.target_tokens_per_s_per_user = 35.0;
    let r = serve::simulate(&c).unwrap();
    assert!(r.decode.tokens_per_s_per_user >= 35.0);
    assert!(r.decode.batch_per_gpu < base.decode.batch_per_gpu);
    assert!(r.decode.output_tokens_per_s_per_node < base.decode.output_tokens_per_s_per_node);
    // Without the second micro-batch, communication is exposed and decode slows.
    let mut c = ServeConfig::v3();
    c.decode.micro_batches = 1;
    let one = serve::decode_at(&c, 64, "test").unwrap();
    let two = serve::decode_at(&ServeConfig::v3(), 64, "test").unwrap();
    assert!(one.step_s > two.step_s, "{} vs {}", one.step_s, two.step_s);
}

#[test]
fn impossible_speed_target_is_an_error_not_a_number() {
    let mut c = ServeConfig::v3();
    c.workload.target_tokens_per_s_per_user = 5000.0;
    let e = serve::simulate(&c).unwrap_err();
    assert!(matches!(e, SimError::CannotComplete(_)), "{e}");
    assert!(
        e.to_string().contains("target_tokens_per_s_per_user"),
        "{e}"
    );
}

fn field(e: SimError) -> String {
    match e {
        SimError::Config { field, .. } => field,
        other => panic!("expected a configuration error, got {other}"),
    }
}

#[test]
fn bad_serving_configurations_name_the_field() {
    type Edit = fn(&mut ServeConfig);
    let cases: Vec<(&str, Edit)> = vec![
        ("prefill.nodes", |c| c.prefill.nodes = 0),
        ("decode.nodes", |c| c.decode.nodes = 0),
        ("decode.nodes", |c| c.decode.nodes = usize::MAX / 4),
        ("prefill.units", |c| c.prefill.units = usize::MAX),
        ("decode.redundant_experts", |c| {
            c.decode.redundant_experts = 31
        }),
        ("prefill.comm_sms", |c| c.prefill.comm_sms = 132),
        ("prefill.redundant_experts", |c| {
            c.prefill.redundant_experts = usize::MAX
        }),
        ("workload.cache_hit_rate", |c| {
            c.workload.cache_hit_rate = 1.0
        }),
        ("workload.avg_kv_len", |c| c.workload.avg_kv_len = f64::NAN),
        ("model.hidden", |c| c.model.hidden = 0),
        ("model.hidden", |c| c.model.hidden = usize::MAX),
        ("hardware.hbm_gbps", |c| c.hardware.hbm_gbps = -1.0),
        ("calibration.delivered_fraction", |c| {
            c.calibration.delivered_fraction = 1.5
        }),
        ("prefill.tokens_per_gpu", |c| {
            c.prefill.tokens_per_gpu = 1 << 30
        }),
        // parse, but make no sense: no decode GPUs, times that overflow toward inf
        ("decode.units", |c| c.decode.units = 0),
        ("hardware.tflops_fp8", |c| c.hardware.tflops_fp8 = 1e-300),
        ("hardware.inter_node_latency_us", |c| {
            c.hardware.inter_node_latency_us = 1e300
        }),
    ];
    for (want, f) in cases {
        let mut c = ServeConfig::v3();
        f(&mut c);
        assert_eq!(field(serve::simulate(&c).unwrap_err()), want);
    }
    // Memory: a GPU too small for the weights is refused with the field named.
    let mut c = ServeConfig::v3();
    c.hardware.hbm_gb = 20.0;
    let e = serve::simulate(&c).unwrap_err();
    assert!(e.to_string().contains("hardware.hbm_gb"), "{e}");
}

#[test]
fn serve_config_round_trips_through_toml() {
    let c = ServeConfig::v3();
    let text = c.to_toml();
    let back = ServeConfig::from_str_named(&text, "v3-serve.toml").unwrap();
    assert_eq!(back, c);
    let broken = text.replace("cache_hit_rate", "cache_hits");
    let e = ServeConfig::from_str_named(&broken, "x.toml").unwrap_err();
    assert!(e.to_string().contains("cache_hit"), "{e}");
}
