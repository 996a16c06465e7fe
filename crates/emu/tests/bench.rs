//! The benchmark kernels run and compute the right thing (small sizes).
//!
//! Numerics: the default (sm_80 model for the corpus GEMM); its error bound (8e-3 of max|C|, the
//! bf16 output rounding) holds under it and under exact sums alike.

#[test]
fn bench_kernels_small() {
    let o = emu::bench::BenchOptions {
        threads: 2,
        alu_iters: 4,
        alu_ctas: 4,
        gemm_size: 128,
    };
    let r = emu::bench::run(&o).expect("bench runs");
    // 4 CTAs x 256 threads x 4 iterations x 27 instructions in the loop, plus the rest.
    assert!(r.alu.lane_instructions >= 4 * 256 * 4 * 27, "{:?}", r.alu);
    assert!(
        r.alu.lane_instructions < 4 * 256 * (4 * 27 + 40),
        "{:?}",
        r.alu
    );
    assert!(r.mma_gemm.lane_instructions > 0);
    // bf16 output rounding only (2^-8 relative) against the f32 CPU reference.
    assert!(r.gemm.max_error_rel_to_max < 8e-3, "{:?}", r.gemm);
}
