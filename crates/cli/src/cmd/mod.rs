//! One module per verb.
pub mod bench;
pub mod bench_gemm;
pub mod check;
pub mod devices;
pub mod emit;
pub mod fmt;
pub mod gemm;
pub mod kernels;
pub mod moe;
pub mod run;
pub mod schedule;
pub mod sim;
