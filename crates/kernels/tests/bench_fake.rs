//! The Hopper benchmark (`examples/bench_hopper.rs`, what the first GPU session runs) works end
//! to end through the CUDA backend on the fake driver (`crates/fakecuda`): prepared launches,
//! event timing, the configuration sweep (A-multicast clusters included) and its own spot check
//! of the results, on small shapes.

#[path = "../../runtime/tests/support/fakecuda.rs"]
mod fakecuda_support;
use fakecuda_support::FakeCuda;

#[test]
fn bench_hopper_runs_on_the_fake_driver() {
    let Some(f) = FakeCuda::new("bench") else {
        return;
    };
    let bench = bench_binary();
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

/// The example's executable: `<profile>/examples/bench_hopper` (plain `cargo test` and
/// `scripts/test.sh` build it there; `--all-targets` builds examples as test harnesses instead),
/// else built now into a separate target directory (the outer cargo may hold this one's lock).
fn bench_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let profile = exe.parent().and_then(|d| d.parent()).expect("profile dir");
    let bench = profile.join("examples").join("bench_hopper");
    if bench.exists() {
        return bench;
    }
    let target = profile.join("fakecuda-build");
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    eprintln!("note: building bench_hopper into {}", target.display());
    let st = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "build",
            "-p",
            "kernels",
            "--example",
            "bench_hopper",
            "--manifest-path",
        ])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .status()
        .expect("run cargo build --example bench_hopper");
    assert!(st.success(), "cargo build --example bench_hopper failed");
    target.join("debug").join("examples").join("bench_hopper")
}
