//! The runnable examples (`cargo run --example NAME -p builder`) run here too, so CI checks
//! them: each `main` returns an error when its result differs from its host reference.

#[path = "../examples/saxpy.rs"]
mod saxpy;

#[path = "../examples/block_reduce.rs"]
mod block_reduce;

#[path = "../examples/warp_scan.rs"]
mod warp_scan;

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
