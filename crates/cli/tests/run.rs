//! `ptxforge run` end to end: a corpus kernel with `--save`, compared to the corpus expectation,
//! and error cases (non-zero exit, one-line message).

use runtime::runner::{self, Manifest};
use std::path::{Path, PathBuf};
use std::process::Command;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests-data/corpus/sm_80")
}

fn ptxforge(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .args(args)
        .current_dir(corpus())
        .output()
        .expect("spawn ptxforge")
}

fn gemm_args(n_args: usize) -> Vec<String> {
    let m: Manifest =
        serde_json::from_str(&std::fs::read_to_string(corpus().join("gemm_bf16.json")).unwrap())
            .unwrap();
    let mut v: Vec<String> = vec![
        "run".into(),
        "gemm_bf16.ptx".into(),
        "--entry".into(),
        m.entry.clone(),
        "--grid".into(),
        "2".into(),
    ];
    v.extend([
        "--block".into(),
        "128".into(),
        "--shared".into(),
        m.shared.to_string(),
    ]);
    for a in m.args.iter().take(n_args) {
        v.push("--arg".into());
        v.push(a.clone());
    }
    v
}

fn one_line_error(o: &std::process::Output) -> String {
    assert!(
        !o.status.success(),
        "expected failure, got success: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one-line message expected, got:\n{err}"
    );
    assert!(err.starts_with("ptxforge: error: "), "{err}");
    err
}

#[test]
fn run_gemm_and_save() {
    let dir = std::env::temp_dir().join(format!("ptxforge-run-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out_path = dir.join("c.npy");
    let mut args = gemm_args(9);
    args.extend([
        "--save".into(),
        format!("2={}", out_path.display()),
        "--stats".into(),
    ]);
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let o = ptxforge(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("2 CTAs") && stdout.contains("lane-instr/s"),
        "{stdout}"
    );

    let m: Manifest =
        serde_json::from_str(&std::fs::read_to_string(corpus().join("gemm_bf16.json")).unwrap())
            .unwrap();
    let ck = &m.checks[0];
    let saved = runner::read_npy(&out_path).unwrap();
    assert_eq!(
        saved.dtype,
        runner::DType::U16,
        "bf16 is saved as uint16 bits"
    );
    assert_eq!(saved.len(), 8192);
    let expect = runner::read_npy(&corpus().join(&ck.expect)).unwrap();
    let r = runner::apply_check(ck, &saved, &expect, None).unwrap();
    assert!(r.ok(), "{r}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_json() {
    let mut args = gemm_args(9);
    args.push("--json".into());
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let o = ptxforge(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["ok"], true);
    assert_eq!(j["stats"]["ctas"], 2);
    assert!(j["stats"]["lane_instructions"].as_u64().unwrap() > 0);
}

#[test]
fn wrong_argument_count() {
    let args = gemm_args(8);
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let err = one_line_error(&ptxforge(&args));
    assert!(err.contains("8 arguments given, kernel takes 9"), "{err}");
}

#[test]
fn wrong_argument_size() {
    let mut args = gemm_args(9);
    let i = args.len() - 5;
    args[i] = "i64:64".into(); // argument 6 (stride_cm, .u32) as 8 bytes
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let err = one_line_error(&ptxforge(&args));
    assert!(
        err.contains("argument 6") && err.contains("8 bytes given"),
        "{err}"
    );
}

#[test]
fn bad_specs() {
    for (bad, needle) in [
        ("out:f8:16", "unknown dtype"),
        ("in:does-not-exist.npy", "does-not-exist.npy"),
        ("u32:-3", "bad integer"),
        ("x:1", "unknown kind"),
    ] {
        let mut args = gemm_args(9);
        args[11] = bad.into(); // the first --arg value
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let err = one_line_error(&ptxforge(&args));
        assert!(err.contains(needle), "{bad}: {err}");
    }
    let mut args = gemm_args(9);
    args.extend(["--save".into(), "3=x.npy".into()]);
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let err = one_line_error(&ptxforge(&args));
    assert!(err.contains("scalar"), "{err}");
    let err = one_line_error(&ptxforge(&[
        "run",
        "gemm_bf16.ptx",
        "--grid",
        "0",
        "--block",
        "128",
    ]));
    assert!(err.contains("positive"), "{err}");
}

#[test]
fn devices_lists_the_emulator() {
    let o = ptxforge(&["devices", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["devices"][0]["backend"], "Emu");
    let o = ptxforge(&["devices"]);
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("emu:0"));
}

#[test]
fn float_for_integer_parameter() {
    let mut args = gemm_args(9);
    let i = args.len() - 5;
    args[i] = "f32:64".into();
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let err = one_line_error(&ptxforge(&args));
    assert!(
        err.contains("argument 6") && err.contains("an integer"),
        "{err}"
    );
}

/// `ptxforge run --banks` on the transpose example: both kernels transpose exactly (vs the host
/// transpose of pseudo-random inputs, every element checked); the
/// unpadded tile's column read is the one 32-way-conflicting line, the padded tile has none.
#[test]
fn bank_profile_finds_the_transpose_conflict() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let file = root.join("examples/ptx/transpose_smem.ptx");
    let text = std::fs::read_to_string(&file).unwrap();
    if ptx::ptxas::find_ptxas().is_some() {
        let rep = ptx::ptxas::assemble(&text, "sm_80", &Default::default()).unwrap();
        for e in ["transpose_naive", "transpose_padded"] {
            let k = rep.kernel(e).expect("kernel in ptxas report");
            assert_eq!(k.spill_stores_bytes + k.spill_loads_bytes, 0, "{e}");
        }
    }
    let n = 64usize;
    let dir = std::env::temp_dir().join(format!("ptxforge-banks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input: Vec<f32> = (0..n * n)
        .map(|i| ((i as u64 * 2654435761) % 1000) as f32 / 7.0 - 60.0)
        .collect();
    let inp = dir.join("in.npy");
    runner::write_npy(
        &inp,
        &runner::HostArray {
            dtype: runner::DType::F32,
            shape: vec![(n * n) as u64],
            data: input.iter().flat_map(|v| v.to_le_bytes()).collect(),
        },
    )
    .unwrap();
    let mut conflicts = Vec::new();
    for e in ["transpose_naive", "transpose_padded"] {
        let out = dir.join(format!("{e}.npy"));
        let o = ptxforge(&[
            "run",
            file.to_str().unwrap(),
            "--entry",
            e,
            "--grid",
            "2,2",
            "--block",
            "32,8",
            "--arg",
            &format!("in:{}", inp.display()),
            "--arg",
            "out:f32:4096",
            "--arg",
            "u32:64",
            "--save",
            &format!("1={}", out.display()),
            "--banks",
            "--json",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let got = runner::read_npy(&out).unwrap();
        let got: Vec<f32> = got
            .data
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        for r in 0..n {
            for c in 0..n {
                assert_eq!(got[c * n + r], input[r * n + c], "{e} ({r}, {c})");
            }
        }
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let b = &j["stats"]["banks"];
        // 4 CTAs x 8 warps x (4 stores + 4 loads)
        assert_eq!(b["total"]["requests"], 256, "{b}");
        conflicts.push((
            b["total"]["wavefronts"].as_u64().unwrap() - b["total"]["ideal"].as_u64().unwrap(),
            b["lines"][0].clone(),
        ));
    }
    let (naive, worst) = &conflicts[0];
    assert_eq!(
        *naive,
        128 * 31,
        "128 column reads, 31 extra wavefronts each"
    );
    assert!(worst["instruction"]
        .as_str()
        .unwrap()
        .starts_with("ld.shared.f32"));
    let line = worst["line"].as_u64().unwrap() as usize;
    assert!(text
        .lines()
        .nth(line - 1)
        .unwrap()
        .contains("ld.shared.f32"));
    assert_eq!(conflicts[1].0, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `PTXAS` naming a missing file is an error naming it, not a silent fallback to another ptxas.
#[test]
fn check_with_ptxas_pointing_at_a_missing_file_is_an_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .args(["check", "gemm_bf16.ptx"])
        .current_dir(corpus())
        .env("PTXAS", "/nonexistent/ptxas")
        .output()
        .expect("spawn ptxforge");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("PTXAS=/nonexistent/ptxas names no file"),
        "{err}"
    );
}
