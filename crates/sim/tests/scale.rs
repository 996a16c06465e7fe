//! Scale and speed: a 100,000-GPU training step and serving deployment each simulate in under
//! a second, and a 100-point sweep (SM budget x EP degree for training, batch size for
//! serving) in under ten seconds (debug profile, as CI runs it).

use sim::serve::{self, ServeConfig};
use sim::Config;
use std::time::Instant;

#[test]
fn training_step_on_100k_gpus_under_a_second() {
    let mut c = Config::v3();
    // 12,544 nodes x 8 = 100,352 GPUs: PP16 x DP6272 (98 EP64 groups per stage).
    c.parallelism.nodes = 12_544;
    c.parallelism.dp = 6272;
    c.training.micro_batches = 120;
    let t = Instant::now();
    let r = sim::simulate(&c).unwrap();
    let secs = t.elapsed().as_secs_f64();
    println!(
        "100,352 GPUs: {secs:.3} s, {:.1} tokens/s/GPU",
        r.tokens_per_s_per_gpu
    );
    assert_eq!(r.gpus, 100_352);
    assert!(secs < 1.0, "{secs} s");
    // Same per-GPU pipeline work, more data parallelism: the ZeRO-1 sync over 6272 ranks
    // costs a little more than over 128.
    let base = sim::simulate(&Config::v3()).unwrap();
    assert!(r.step_time_s >= base.step_time_s);
    assert!(r.step_time_s < 1.2 * base.step_time_s);
}

#[test]
fn serving_on_100k_gpus_under_a_second() {
    let mut c = ServeConfig::v3();
    c.prefill.units = 1000; // 32,000 prefill GPUs
    c.decode.units = 472; // 67,968 decode GPUs
    let t = Instant::now();
    let r = serve::simulate(&c).unwrap();
    let secs = t.elapsed().as_secs_f64();
    println!("{} GPUs: {secs:.3} s", r.gpus);
    assert_eq!(r.gpus, 99_968);
    assert!(secs < 1.0, "{secs} s");
    let per_node = r.cluster_output_tokens_per_s / (472.0 * 18.0);
    assert!((per_node / r.decode.output_tokens_per_s_per_node - 1.0).abs() < 1e-9);
}

#[test]
fn hundred_point_sweeps_under_ten_seconds() {
    let t = Instant::now();
    let mut points = 0;
    for ep in [8, 16, 32, 64] {
        let mut c = Config::v3();
        c.parallelism.ep = ep;
        let sw = sim::sweep(&c, 0, 24).unwrap();
        points += sw.points.len();
        assert!(sw.best_sms.is_some(), "EP{ep}: no budget completes");
    }
    let train = t.elapsed().as_secs_f64();
    assert_eq!(points, 100);
    let t = Instant::now();
    let sw = serve::decode_sweep(&ServeConfig::v3(), 1, 100).unwrap();
    let serve_secs = t.elapsed().as_secs_f64();
    assert_eq!(sw.points.len(), 100);
    // Larger batches: more throughput per node, less speed per user.
    let (a, b) = (&sw.points[9], &sw.points[99]);
    assert!(b.output_tokens_per_s_per_node > a.output_tokens_per_s_per_node);
    assert!(b.tokens_per_s_per_user < a.tokens_per_s_per_user);
    println!("training sweep {train:.2} s, serving sweep {serve_secs:.2} s");
    assert!(
        train < 10.0 && serve_secs < 10.0,
        "{train} s, {serve_secs} s"
    );
}
