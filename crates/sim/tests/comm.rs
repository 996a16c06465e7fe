//! The kernel-level communication model against every figure DeepEP published (H800, CX7 IB):
//! one parameter set (the `h800` hardware preset) must land within +-15% of each.

use sim::comm::{self, CommLoad, DeepEpBench};
use sim::config::h800;

#[test]
fn every_published_deepep_figure_within_15_percent() {
    let rows = comm::deepep_table(&h800(), &DeepEpBench::default());
    assert_eq!(rows.len(), 20);
    println!("{}", comm::deepep_markdown(&rows));
    for r in &rows {
        assert!(
            r.error.abs() <= 0.15,
            "{:?} {} EP{}: published {} {}, simulated {:.1} ({:+.1}%)",
            r.mode,
            r.op,
            r.ep,
            r.published,
            r.unit,
            r.simulated,
            r.error * 100.0
        );
    }
}

#[test]
fn bandwidth_saturates_with_sms() {
    // Per-SM limit below the knee (time ~ 1/SMs), link limit above it (time flat).
    let hw = h800();
    let load = CommLoad {
        ib: 80e6,
        nvl: 150e6,
        sm: 200e6,
    };
    let t = |s| comm::normal_time(&hw, s, &load).unwrap();
    let (t4, t8, t40, t80) = (t(4), t(8), t(40), t(80));
    assert!((t4 / t8 - 2.0).abs() < 0.01, "{t4} {t8}");
    assert!((t40 - t80).abs() < 1e-12, "{t40} {t80}");
    let ib = 80e6 / (hw.inter_node_gbps * 1e9);
    assert!(t80 > ib && t80 < ib + 20e-6);
    assert_eq!(comm::normal_time(&hw, 0, &load), None);
}
