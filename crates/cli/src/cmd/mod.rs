//! One module per verb.
pub mod schedule;
pub mod sim;
pub mod check;
pub mod fmt;
pub mod bench;
pub mod devices;
pub mod run;
pub mod moe;
pub mod bench_gemm;
pub mod emit;
pub mod gemm;
pub mod kernels;
