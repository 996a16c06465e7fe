//! The CUDA backend of the `ptxforge` binary on the fake driver (`crates/fakecuda`, the driver API
//! on the emulator): devices, every library kernel against its CPU reference, and a small
//! two-device MoE step with green-context partitions, peer access and TMA kernels.

use std::process::Output;

#[path = "../../runtime/tests/support/fakecuda.rs"]
mod fakecuda_support;
use fakecuda_support::FakeCuda;

fn run(f: &FakeCuda, args: &[&str]) -> String {
    let Output {
        status,
        stdout,
        stderr,
    } = f
        .command(env!("CARGO_BIN_EXE_ptxforge"))
        .args(args)
        .output()
        .expect("run ptxforge");
    let out = String::from_utf8_lossy(&stdout).into_owned();
    let err = String::from_utf8_lossy(&stderr);
    assert!(
        status.success(),
        "ptxforge {args:?} failed: {status}\n{out}\n{err}"
    );
    out
}

#[test]
fn ptxforge_runs_on_the_fake_cuda_driver() {
    let Some(f) = FakeCuda::new("cli") else {
        return;
    };
    let devices = run(&f, &["devices"]);
    assert!(
        devices.contains("cuda:0") && devices.contains("cuda:1"),
        "{devices}"
    );
    assert!(devices.contains("fakecuda"), "{devices}");

    let kernels = run(&f, &["kernels", "--check", "--device", "cuda"]);
    let last = kernels.lines().last().unwrap_or_default();
    assert!(
        last.contains("on cuda") && last.contains(" 0 failed"),
        "{kernels}"
    );

    // the main job with each grouped-GEMM kernel: mma.sync, and the sm_90a TMA/wgmma one
    // (tensor maps encoded by the driver, clusters off, persistent grid on the compute partition)
    for gemm in ["mma", "wgmma"] {
        let moe = run(
            &f,
            &[
                "moe",
                "--gemm",
                gemm,
                "--device",
                "cuda",
                "--nodes",
                "1",
                "--gpus-per-node",
                "2",
                "--experts",
                "8",
                "--hidden",
                "512",
                "--intermediate",
                "256",
                "--tokens",
                "128",
                "--topk",
                "2",
                "--groups",
                "2",
                "--topk-groups",
                "1",
                "--check-tokens",
                "16",
            ],
        );
        assert!(
            moe.contains("SM partitions disjoint: true"),
            "{gemm}: {moe}"
        );
        assert!(
            !moe.lines().any(|l| l.trim_end().ends_with(" no")),
            "{gemm}: {moe}"
        );
    }
}
