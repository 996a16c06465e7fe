//! `ptxforge isa` and the emulator warnings of `ptxforge check`: a file `check` passes but
//! `run` would refuse gets a warning naming the line; the coverage table lists every opcode.

use std::process::Command;

fn ptxforge(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .args(args)
        .output()
        .expect("spawn ptxforge")
}

#[test]
fn isa_json_lists_every_opcode_with_its_status() {
    let out = ptxforge(&["isa", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.len(), ptx::Opcode::ALL.len());
    let row = |name: &str| rows.iter().find(|r| r["opcode"] == name).unwrap().clone();
    assert_eq!(row("mma")["emulate"], true);
    assert_eq!(row("mma")["builder"], true);
    assert_eq!(row("st.async")["emulate"], true);
    assert_eq!(row("cp.reduce.async.bulk.tensor")["emulate"], true);
    for op in [
        "wmma.load.a",
        "wmma.store.d",
        "wmma.mma",
        "mma.sp",
        "movmatrix",
        "alloca",
    ] {
        assert_eq!(row(op)["emulate"], true, "{op}");
    }
    assert!(rows.iter().all(|r| r["parse"] == true));
    let missing = ptxforge(&["isa", "--missing", "--json"]);
    let missing: Vec<serde_json::Value> = serde_json::from_slice(&missing.stdout).unwrap();
    let not_emulated = rows.iter().filter(|r| r["emulate"] == false).count();
    assert_eq!(missing.len(), not_emulated);
}

#[test]
fn check_warns_with_the_line_about_what_the_emulator_cannot_run() {
    let dir = std::env::temp_dir().join(format!("ptxforge-isa-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("k.ptx");
    let text = ".version 8.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 p)
{
.reg .b64 %rd<2>;
.reg .b32 %r<4>;
.reg .f32 %f<4>;
ld.param.u64 %rd1, [p];
redux.sync.min.f32 %f1, %f2, 0xffffffff;
st.global.u32 [%rd1], %r2;
ret;
}
";
    std::fs::write(&file, text).unwrap();
    let f = file.to_str().unwrap();
    let out = ptxforge(&["check", f, "--no-ptxas", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let diags = j["diagnostics"].as_array().unwrap();
    let emu: Vec<&serde_json::Value> = diags.iter().filter(|d| d["source"] == "emulator").collect();
    assert_eq!(emu.len(), 1, "{diags:?}");
    assert_eq!(emu[0]["line"], 10); // the floating-point redux
    assert_eq!(emu[0]["severity"], "warning");
    // and `run` refuses the same file at the same line
    let run = ptxforge(&[
        "run",
        f,
        "--entry",
        "k",
        "--grid",
        "1",
        "--block",
        "32",
        "--arg",
        "out:u32:32",
    ]);
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("line 10"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
