//! `ptxforge kernels --check`: registered kernels against their CPU references on a device.
use std::process::Command;

#[test]
fn kernels_check_runs_registered_shapes_and_reports_json() {
    let out = Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .args(["kernels", "--check", "--filter", "swiglu", "--json"])
        .output()
        .expect("spawn ptxforge");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(v["failed"], 0);
    let checks = v["checks"].as_array().expect("checks");
    assert!(checks.len() >= 2, "{stdout}");
    for c in checks {
        assert_eq!(c["pass"], true, "{c}");
        assert!(c["kernel"].as_str().unwrap_or("").contains("swiglu"));
    }
}

#[test]
fn kernels_check_with_no_match_is_an_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .args(["kernels", "--check", "--filter", "no_such_kernel"])
        .output()
        .expect("spawn ptxforge");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no kernel matched"));
}

fn gemm(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .arg("gemm")
        .args(args)
        .output()
        .expect("spawn ptxforge")
}

/// `ptxforge gemm` runs the chosen kernel family on random inputs against the f64 reference:
/// mma.sync by default on the emulator, the sm_90a TMA/wgmma kernels with `--kernel wgmma`
/// (plain and MoE-grouped), and typed errors for what does not exist.
#[test]
fn gemm_runs_each_kernel_family_and_rejects_bad_requests() {
    for (args, prefix) in [
        (vec!["--m", "96", "--n", "256", "--k", "256"], "gemm_fp8_nt"),
        (
            vec!["--m", "96", "--n", "256", "--k", "256", "--kernel", "wgmma"],
            "hopper_gemm_fp8_nt",
        ),
        (
            vec![
                "--m", "64", "--n", "128", "--k", "256", "--groups", "2", "--layout", "masked",
                "--kernel", "wgmma",
            ],
            "hopper_grouped_gemm_fp8_masked",
        ),
        (
            vec![
                "--m", "80", "--n", "136", "--k", "128", "--dtype", "bf16", "--kernel", "wgmma",
            ],
            "hopper_gemm_bf16_nt",
        ),
    ] {
        let mut a = args.clone();
        a.extend(["--check", "--json"]);
        let out = gemm(&a);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
        assert_eq!(v["pass"], true, "{v}");
        assert!(
            v["kernel"].as_str().unwrap_or("").starts_with(prefix),
            "{args:?}: {v}"
        );
        assert!(v["rel_err"].as_f64().unwrap_or(1.0) < 1e-2, "{v}");
    }
    for (args, msg) in [
        (
            vec!["--m", "64", "--n", "128", "--k", "128", "--kernel", "tpu"],
            "use auto, mma or wgmma",
        ),
        (
            vec![
                "--m",
                "128",
                "--n",
                "128",
                "--k",
                "128",
                "--dtype",
                "bf16",
                "--groups",
                "2",
                "--layout",
                "contiguous",
                "--kernel",
                "wgmma",
            ],
            "not grouped",
        ),
        (vec!["--m", "64", "--n", "100", "--k", "128"], "multiple"),
    ] {
        let out = gemm(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(err.contains(msg), "{args:?}: {err}");
    }
}

#[test]
fn emit_annotate_names_the_rust_builder_calls() {
    let run = |annotate: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ptxforge"));
        c.args(["emit", "swiglu_fwd_fp8", "--arch", "sm_90a"]);
        if annotate {
            c.arg("--annotate");
        }
        let out = c.output().expect("spawn ptxforge");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (plain, ann) = (run(false), run(true));
    assert_eq!(plain.lines().count(), ann.lines().count());
    let annotated: Vec<&str> = ann.lines().filter(|l| l.contains(" // ")).collect();
    assert!(!annotated.is_empty(), "{ann}");
    for l in &annotated {
        let loc = l.rsplit(" // ").next().unwrap_or("");
        assert!(loc.contains(".rs:"), "{l}");
    }
    for (p, a) in plain.lines().zip(ann.lines()) {
        assert!(a.starts_with(p), "{a}");
    }
}
