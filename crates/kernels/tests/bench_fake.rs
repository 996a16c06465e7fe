//! The Hopper benchmark (`examples/bench_hopper.rs`, what the first GPU session runs) works end
//! to end through the CUDA backend on the fake driver (`crates/fakecuda`): prepared launches,
//! event timing, the configuration sweep (A-multicast clusters included) and its own spot check
//! of the results, on small shapes.

#[path = "../../runtime/tests/support/fakecuda.rs"]
mod fakecuda_support;
use fakecuda_support::{artifact, FakeCuda};

#[test]
fn bench_hopper_runs_on_the_fake_driver() {
    let Some(f) = FakeCuda::new("bench") else {
        return;
    };
    let bench = artifact(
        "examples/bench_hopper",
        &["-p", "kernels", "--example", "bench_hopper"],
    );
    for (dtype, shapes, n_shapes) in [
        ("fp8", "shapes=256x512x512,128x384x256", 2),
        ("bf16", "shapes=192x256x256", 1),
    ] {
        let out = f
            .command(&bench)
            .args(["cuda:0", dtype, "2", "sweep", shapes])
            .output()
            .expect("run bench_hopper");
        let text = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{dtype}: {text}");
        assert!(!text.contains("skip:"), "{dtype}: {text}");
        assert_eq!(
            text.matches("[chosen]").count(),
            n_shapes,
            "{dtype}: {text}"
        );
        assert_eq!(text.matches(" ok\n").count(), n_shapes, "{dtype}: {text}");
        assert!(
            text.contains("<- best") && text.contains("_mc2"),
            "{dtype}: {text}"
        );
        assert!(!text.contains("error"), "{dtype}: {text}");
    }
}
