//! `ptxforge run --sanitize`: reports as text and JSON, exit status 1 when something was found,
//! 0 and an empty summary when not; bad tool names are refused.

use std::path::PathBuf;
use std::process::Command;

/// Writes a kernel (two warps store to one shared word, no barrier; then every CTA increments a
/// global counter without an atomic) with `fixed` choosing the correct variant.
fn kernel(dir: &std::path::Path, fixed: bool) -> PathBuf {
    let (bar, inc) = if fixed {
        ("bar.sync 0;", "atom.global.add.u32 %r5, [%rd1], 1;")
    } else {
        (
            "",
            "ld.global.u32 %r5, [%rd1];\nadd.u32 %r5, %r5, 1;\nst.global.u32 [%rd1], %r5;",
        )
    };
    let text = format!(
        ".version 8.0\n.target sm_90\n.address_size 64\n.shared .align 16 .b8 sm[64];\n\
         .visible .entry k(.param .u64 p0)\n{{\n.reg .pred %p<4>;\n.reg .b32 %r<8>;\n\
         .reg .b64 %rd<4>;\nld.param.u64 %rd1, [p0];\nmov.u32 %r1, %tid.x;\nmov.u32 %r2, sm;\n\
         setp.eq.u32 %p1, %r1, 0;\n@%p1 st.shared.u32 [%r2], %r1;\n{bar}\n\
         setp.eq.u32 %p2, %r1, 32;\n@%p2 st.shared.u32 [%r2], %r1;\n{inc}\nret;\n}}\n"
    );
    let p = dir.join(if fixed { "fixed.ptx" } else { "racy.ptx" });
    std::fs::write(&p, text).unwrap();
    p
}

fn run(file: &std::path::Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .args([
            "run",
            file.to_str().unwrap(),
            "--grid",
            "2",
            "--block",
            "64",
        ])
        .args(["--arg", "out:u32:4"])
        .args(extra)
        .output()
        .expect("spawn ptxforge")
}

#[test]
fn run_sanitize_reports_and_exit_status() {
    let dir = std::env::temp_dir().join(format!("ptxforge-sanitize-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let racy = kernel(&dir, false);
    let fixed = kernel(&dir, true);

    let o = run(&racy, &["--sanitize", "all"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("racecheck: shared-memory write-after-write hazard"),
        "{out}"
    );
    assert!(
        out.contains("PTX line 14") && out.contains("PTX line 17"),
        "{out}"
    );
    assert!(
        out.contains("global-memory read-write race between CTAs"),
        "{out}"
    );
    assert!(out.contains("ERROR SUMMARY: 2 error(s)"), "{out}");

    let o = run(&racy, &["--sanitize", "racecheck", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["ok"], false);
    assert_eq!(j["sanitizer"]["errors"], 2);
    let r = &j["sanitizer"]["reports"][0];
    assert_eq!(r["tool"], "racecheck");
    assert_eq!(r["accesses"][0]["line"], 14);
    assert_eq!(r["accesses"][1]["line"], 17);

    // only the tools asked for run: initcheck and synccheck find nothing here
    let o = run(&racy, &["--sanitize", "initcheck,synccheck"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );

    let o = run(&fixed, &["--sanitize", "all"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("ERROR SUMMARY: 0 errors"), "{out}");

    // the environment variable alone turns them on
    let o = Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .args([
            "run",
            racy.to_str().unwrap(),
            "--grid",
            "2",
            "--block",
            "64",
        ])
        .args(["--arg", "out:u32:4"])
        .env("PTXFORGE_SANITIZE", "racecheck")
        .output()
        .expect("spawn ptxforge");
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("ERROR SUMMARY: 2 error(s)"));

    let o = run(&fixed, &["--sanitize", "memchek"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown sanitizer `memchek`"));
    let _ = std::fs::remove_dir_all(&dir);
}
