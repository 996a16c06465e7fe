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

/// `ptxforge train --device cuda` on four fake CUDA devices (PP 2 x EP 2: the pipeline's
/// boundary transfers and the MoE dispatch/combine over peer memory go through the driver API)
/// writes the same checkpoint, byte for byte, as the same run on the emulator backend.
#[test]
fn train_on_the_fake_cuda_driver_matches_the_emulator_run() {
    let Some(f) = FakeCuda::new("train") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("ptxforge-cli-train-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let cfg = dir.join("tiny.toml");
    std::fs::write(
        &cfg,
        "[train]\nmicro_batch = 2\nmicro_batches = 4\nsteps = 1\n",
    )
    .expect("write config");
    let (cuda, emu) = (dir.join("cuda.ckpt"), dir.join("emu.ckpt"));
    let args = |device: &str, save: &std::path::Path| {
        let common = ["train", "--config", s(&cfg), "--eval-batches", "1"];
        let mut a: Vec<String> = common.iter().map(|x| x.to_string()).collect();
        a.extend([
            "--device".into(),
            device.into(),
            "--save".into(),
            s(save).into(),
        ]);
        a
    };
    let mut c = f.command(env!("CARGO_BIN_EXE_ptxforge"));
    let out = c
        .env("PTXFORGE_FAKECUDA_DEVICES", "4")
        .args(args("cuda", &cuda))
        .output()
        .expect("run ptxforge");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("step    1  loss"), "{text}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .args(args("emu", &emu))
        .output()
        .expect("run ptxforge");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (a, b) = (
        std::fs::read(&cuda).expect("cuda checkpoint"),
        std::fs::read(&emu).expect("emu checkpoint"),
    );
    assert!(
        a == b,
        "the CUDA-backend checkpoint differs from the emulator's"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn s(p: &std::path::Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}
