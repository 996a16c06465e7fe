//! The GEMM tile model against DeepGEMM's published H800 table (FP8, 132 SMs), and the
//! FlashMLA-class decode model against FlashMLA's published regimes.

use sim::compute::{self, GemmCal, MlaDecodeCal};
use sim::config::h800;

#[test]
fn deepgemm_table_within_12_percent() {
    let rows = compute::deepgemm_table(&h800(), &GemmCal::h800());
    assert_eq!(rows.len(), 7);
    for r in &rows {
        println!(
            "{}x{}x{} (groups {}): published {} TFLOP/s, simulated {:.0} ({:+.1}%)",
            r.m,
            r.n,
            r.k,
            r.groups,
            r.published_tflops,
            r.simulated_tflops,
            r.error * 100.0
        );
        assert!(r.error.abs() <= 0.12, "{r:?}");
    }
}

#[test]
fn mla_decode_switches_from_memory_to_compute_bound() {
    // FlashMLA: memory-bound at small query counts, compute-bound once heads x query tokens
    // reaches ~128 per request... here the regimes follow from the two throughputs.
    let cal = MlaDecodeCal {
        gbps: 3000.0,
        tflops: 660.0,
        kv_bytes: 2.0,
        page_tokens: 64.0,
    };
    let (seqs, kv) = (64.0, 4096.0);
    let bytes = seqs * (kv + 32.0) * 576.0 * 2.0; // half a 64-token page on average
    let t1 = compute::mla_decode_time(&cal, seqs, kv, 1.0, 16.0, 512.0, 64.0);
    assert!((t1 - bytes / 3000e9).abs() < 1e-12, "memory-bound: {t1}");
    let t2 = compute::mla_decode_time(&cal, seqs, kv, 2.0, 128.0, 512.0, 64.0);
    let flops = 2.0 * seqs * 2.0 * 128.0 * kv * (1024.0 + 64.0);
    assert!((t2 - flops / 660e12).abs() < 1e-12, "compute-bound: {t2}");
    assert!(t2 > t1);
}
