//! The runnable examples (`cargo run --example NAME -p kernels`) run here too, so CI checks
//! them: each `main` returns an error when its result differs from its host reference.

#[path = "../examples/fp8_gemm.rs"]
mod fp8_gemm;

#[test]
fn fp8_gemm_example() {
    fp8_gemm::main().unwrap();
}
