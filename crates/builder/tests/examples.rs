//! The runnable examples (`cargo run --example NAME -p builder`) run here too, so CI checks
//! them: each `main` returns an error when its result differs from its host reference.

#[path = "../examples/saxpy.rs"]
mod saxpy;

#[path = "../examples/block_reduce.rs"]
mod block_reduce;

#[path = "../examples/warp_scan.rs"]
mod warp_scan;

#[path = "../examples/mma_gemm.rs"]
mod mma_gemm;

#[path = "../examples/tma_wgmma.rs"]
mod tma_wgmma;

mod common;

#[test]
fn saxpy_example() {
    saxpy::main().unwrap();
}

#[test]
fn block_reduce_example() {
    block_reduce::main().unwrap();
}

#[test]
fn warp_scan_example() {
    warp_scan::main().unwrap();
}

/// The block reduction written with the expression layer (`builder::expr`, 13 lines of kernel
/// body in `block_reduce::block_sum_expr`) is the same PTX as the method-call style, instruction
/// for instruction.
#[test]
fn block_reduce_in_expression_style_is_the_same_ptx() {
    use builder::Target;
    let expr = block_reduce::block_sum_expr(Target::sm80()).unwrap();
    let methods = block_reduce::block_sum(Target::sm80()).unwrap();
    assert_eq!(ptx::print(expr.module()), ptx::print(methods.module()));
}

#[test]
fn mma_gemm_example() {
    mma_gemm::main().unwrap();
}

/// The GEMM example passes the validator and ptxas (0 spills) for sm_80.
#[test]
fn mma_gemm_example_assembles() {
    let k = mma_gemm::mma_gemm(builder::Target::sm80()).unwrap();
    common::check(k.module(), "sm_80");
}

#[test]
fn tma_wgmma_example() {
    tma_wgmma::main().unwrap();
}

/// The producer/consumer example passes the validator and ptxas (0 spills) for sm_90a.
#[test]
fn tma_wgmma_example_assembles() {
    let k = tma_wgmma::tma_wgmma(builder::Target::sm90a()).unwrap();
    common::check(k.module(), "sm_90a");
}
