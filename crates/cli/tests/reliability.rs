//! Issue 20, items 1 (closed pipe / full disk), 4 (errors that point at the right thing) and 5
//! (outputs checked first, written atomically), end to end through the `ptxforge` binary.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn ptxforge() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ptxforge"))
}

fn run_in(dir: &Path, args: &[&str]) -> Output {
    ptxforge()
        .args(args)
        .current_dir(dir)
        .output()
        .expect("spawn ptxforge")
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ptxforge-rel-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A valid kernel of `n` instructions (its formatted text is far larger than a pipe's buffer).
fn big_ptx(n: usize) -> String {
    let mut s = String::from(
        ".version 8.0\n.target sm_80\n.address_size 64\n\n.visible .entry big()\n{\n    .reg .b32 %r<4>;\n",
    );
    for i in 0..n {
        s.push_str(&format!("    add.u32 %r1, %r1, {i};\n"));
    }
    s.push_str("    ret;\n}\n");
    s
}

/// A kernel that stores its `u32` parameter through dynamic (`extern .shared`) memory into
/// `out[0]`: it needs `--shared 4`.
const EXTERN_SHARED: &str = r#".version 8.0
.target sm_80
.address_size 64

.extern .shared .align 4 .b8 smem[];

.visible .entry k(.param .u64 out, .param .u32 v)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    mov.u32 %r1, smem;
    ld.param.u32 %r2, [v];
    st.shared.u32 [%r1], %r2;
    ld.shared.u32 %r3, [%r1];
    ld.param.u64 %rd1, [out];
    cvta.to.global.u64 %rd2, %rd1;
    st.global.u32 [%rd2], %r3;
    ret;
}
"#;

/// Commands of every printing verb that are cheap enough to run twice here (`fmt`, `check`,
/// `kernels`, `emit`, `devices`, `schedule`, `sim`, `run`); `big.ptx` and `k.ptx` are in `dir`.
fn printing_commands() -> Vec<Vec<&'static str>> {
    vec![
        vec!["fmt", "big.ptx"],
        vec!["fmt", "big.ptx", "--json"],
        vec!["check", "big.ptx", "--no-ptxas"],
        vec!["kernels"],
        vec!["emit", "swiglu_fwd_fp8"],
        vec!["devices"],
        vec!["schedule", "1f1b", "--pp", "4", "--chunks", "8"],
        vec!["sim", "v3"],
        vec!["sim", "v3", "--print-config"],
        vec![
            "run",
            "k.ptx",
            "--grid",
            "1",
            "--block",
            "32",
            "--shared",
            "4",
            "--arg",
            "out:u32:1",
            "--arg",
            "u32:5",
        ],
    ]
}

fn printing_dir(name: &str) -> PathBuf {
    let d = scratch(name);
    std::fs::write(d.join("big.ptx"), big_ptx(20_000)).unwrap();
    std::fs::write(d.join("k.ptx"), EXTERN_SHARED).unwrap();
    d
}

#[test]
fn a_closed_pipe_ends_every_verb_quietly() {
    let d = printing_dir("pipe");
    for args in printing_commands() {
        let mut child = ptxforge()
            .args(&args)
            .current_dir(&d)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // the reader goes away before (or while) the verb prints, as `| head -0` would
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = stderr(&o);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_full_disk_on_stdout_is_an_error_for_every_verb() {
    if !Path::new("/dev/full").exists() {
        eprintln!("no /dev/full on this system: skipped");
        return;
    }
    let d = printing_dir("full");
    for args in printing_commands() {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let o = ptxforge()
            .args(&args)
            .current_dir(&d)
            .stdout(full)
            .output()
            .unwrap();
        let err = stderr(&o);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("writing to standard output") && err.contains("No space left"),
            "{args:?}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// One failing invocation per verb that takes `--json` (sub-benchmarks included).
fn failing_json_commands() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        ("fmt", vec!["fmt", "missing.ptx", "--json"]),
        ("check", vec!["check", "missing.ptx", "--json"]),
        ("isa", vec!["isa", "--json", "--no-such-flag"]),
        (
            "schedule",
            vec!["schedule", "1f1b", "--svg", "no/dir/s.svg", "--json"],
        ),
        ("sim", vec!["sim", "no-such-config.toml", "--json"]),
        (
            "run",
            vec![
                "run",
                "missing.ptx",
                "--grid",
                "1",
                "--block",
                "1",
                "--json",
            ],
        ),
        ("devices", vec!["devices", "--json", "--no-such-flag"]),
        ("bench", vec!["bench", "emu", "--json", "--size", "-1"]),
        (
            "bench",
            vec!["bench", "train", "--json", "--config", "no-such.toml"],
        ),
        ("bench", vec!["bench", "gemm", "--json", "--no-such-flag"]),
        ("bench", vec!["bench", "attn", "--json", "--no-such-flag"]),
        (
            "kernels",
            vec!["kernels", "--check", "--json", "--sanitize", "nonsense"],
        ),
        ("emit", vec!["emit", "no_such_kernel", "--json"]),
        (
            "gemm",
            vec![
                "gemm", "--m", "128", "--n", "128", "--k", "128", "--layout", "bogus", "--json",
            ],
        ),
        ("moe", vec!["moe", "--config", "bogus", "--json"]),
        (
            "docs",
            vec!["docs", "--check", "--root", "no/such/root", "--json"],
        ),
        ("train", vec!["train", "--config", "no-such.toml", "--json"]),
        (
            "launch",
            vec!["launch", "--nodes", "0", "--json", "--", "true"],
        ),
    ]
}

#[test]
fn every_verb_prints_a_json_error_object() {
    let d = scratch("json");
    for (verb, args) in failing_json_commands() {
        let o = run_in(&d, &args);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(!o.status.success(), "{args:?} succeeded");
        let last = out.lines().last().unwrap_or_default();
        let j: serde_json::Value = serde_json::from_str(last)
            .unwrap_or_else(|e| panic!("{args:?}: no JSON on stdout ({e}): {out:?}"));
        assert_eq!(j["ok"], false, "{args:?}: {j}");
        assert_eq!(j["verb"], verb, "{args:?}: {j}");
        let msg = j["error"]["message"].as_str().unwrap_or_default();
        assert!(!msg.is_empty(), "{args:?}: {j}");
        assert_eq!(out.lines().count(), 1, "{args:?}: one object: {out}");
        // the one-line reason still goes to standard error
        assert!(stderr(&o).contains("error"), "{args:?}");
    }
    // a verb that prints its own failure object (check's diagnostics) prints only that one
    std::fs::write(d.join("bad.ptx"), ".version 8.0\n.target sm_80\nnot ptx\n").unwrap();
    let o = run_in(&d, &["check", "bad.ptx", "--no-ptxas", "--json"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.lines().count(), 1, "{out}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (j["ok"].clone(), j["errors"].clone()),
        (false.into(), 1.into())
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn invalid_utf8_is_reported_with_its_line() {
    let d = scratch("utf8");
    let mut bytes = b".version 8.0\n.target sm_80\n// caf".to_vec();
    bytes.extend([0xe9, b'\n']); // Latin-1 e-acute: not UTF-8
    std::fs::write(d.join("latin1.ptx"), &bytes).unwrap();
    for verb in ["fmt", "check"] {
        let o = run_in(&d, &[verb, "latin1.ptx"]);
        let err = stderr(&o);
        assert!(
            err.contains("latin1.ptx:3:7: invalid UTF-8 (byte 0xe9)"),
            "{verb}: {err}"
        );
    }
    let o = run_in(&d, &["fmt", "latin1.ptx", "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (j["error"]["line"].clone(), j["error"]["col"].clone()),
        (3.into(), 7.into())
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_missing_config_file_is_not_found() {
    let d = scratch("config");
    for args in [
        vec!["sim", "no-such.toml"],
        vec!["sim", "v3", "--hardware", "no-such-profile.toml"],
    ] {
        let err = stderr(&run_in(&d, &args));
        assert!(
            err.contains("`no-such") && err.contains("not found"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("unknown preset"), "{args:?}: {err}");
    }
    let err = stderr(&run_in(&d, &["sim", "nope"]));
    assert!(err.contains("unknown preset `nope`"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn num_sms_errors_name_the_flag_and_the_real_limit() {
    let mut args = common::small_moe(&[]);
    let i = args.iter().position(|a| a == "--num-sms").unwrap();
    args[i + 1] = "132".into();
    let t = std::time::Instant::now();
    let o = ptxforge().args(&args).output().unwrap();
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("--num-sms") && err.contains("num_sms"),
        "{err}"
    );
    assert!(err.contains("at most 131"), "{err}");
    assert!(!err.contains("1..132"), "{err}");
    // refused before the inputs are made or any device work
    assert!(t.elapsed().as_secs_f64() < 20.0, "{:?}", t.elapsed());
}

#[test]
fn extern_shared_without_shared_says_so() {
    let d = scratch("extern");
    std::fs::write(d.join("k.ptx"), EXTERN_SHARED).unwrap();
    let v: u32 = rand::random::<u32>() | 1;
    let vs = format!("u32:{v}");
    let base = [
        "run",
        "k.ptx",
        "--grid",
        "1",
        "--block",
        "1",
        "--arg",
        "out:u32:1",
        "--arg",
        &vs,
        "--save",
        "0=o.npy",
    ];
    // an existing output must survive the failed run untouched
    std::fs::write(d.join("o.npy"), b"previous").unwrap();
    let o = run_in(&d, &base);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("extern .shared") && err.contains("smem"),
        "{err}"
    );
    assert!(err.contains("--shared"), "{err}");
    assert_eq!(std::fs::read(d.join("o.npy")).unwrap(), b"previous");
    // with the dynamic shared memory the same launch works
    let mut ok = base.to_vec();
    ok.extend(["--shared", "4"]);
    let o = run_in(&d, &ok);
    assert!(o.status.success(), "{}", stderr(&o));
    let a = runtime::runner::read_npy(&d.join("o.npy")).unwrap();
    assert_eq!(a.data, v.to_le_bytes().to_vec());
    assert!(!d.join(".o.npy.tmp").exists());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn unwritable_outputs_fail_before_the_work() {
    let d = scratch("outputs");
    std::fs::write(d.join("k.ptx"), EXTERN_SHARED).unwrap();
    let moe = common::small_moe(&["--trace", "no/dir/t.json"]);
    let moe: Vec<&str> = moe.iter().map(|s| s.as_str()).collect();
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("--trace", moe),
        ("--trace", vec!["sim", "v3", "--trace", "no/dir/t.json"]),
        (
            "--svg",
            vec![
                "sim",
                "v3",
                "--sweep",
                "comm-sms=8..10",
                "--svg",
                "no/dir/p.svg",
            ],
        ),
        (
            "--png",
            vec!["schedule", "dualpipev", "--png", "no/dir/s.png"],
        ),
        ("-o", vec!["fmt", "k.ptx", "-o", "no/dir/k.ptx"]),
        (
            "--save",
            vec![
                "run",
                "k.ptx",
                "--grid",
                "1",
                "--block",
                "1",
                "--shared",
                "4",
                "--arg",
                "out:u32:1",
                "--arg",
                "u32:1",
                "--save",
                "0=no/dir/o.npy",
            ],
        ),
        (
            "--save",
            vec!["train", "--steps", "1", "--save", "no/dir/c.ckpt"],
        ),
    ];
    for (flag, args) in cases {
        let t = std::time::Instant::now();
        let o = run_in(&d, &args);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?}");
        assert!(err.contains(&format!("{flag} no/dir/")), "{args:?}: {err}");
        assert!(err.contains("not an existing directory"), "{args:?}: {err}");
        assert!(
            t.elapsed().as_secs_f64() < 20.0,
            "{args:?}: {:?}",
            t.elapsed()
        );
    }
    // a directory is not a file either
    std::fs::create_dir_all(d.join("out.svg")).unwrap();
    let err = stderr(&run_in(&d, &["schedule", "1f1b", "--svg", "out.svg"]));
    assert!(
        err.contains("--svg out.svg") && err.contains("is a directory"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn outputs_replace_the_old_file_whole() {
    let d = scratch("atomic");
    std::fs::write(d.join("k.ptx"), EXTERN_SHARED).unwrap();
    std::fs::write(d.join("bad.ptx"), ".version 8.0\nnot ptx\n").unwrap();
    std::fs::write(d.join("f.ptx"), "previous").unwrap();
    // a failed run leaves the previous output alone
    assert!(!run_in(&d, &["fmt", "bad.ptx", "-o", "f.ptx"])
        .status
        .success());
    assert_eq!(
        std::fs::read_to_string(d.join("f.ptx")).unwrap(),
        "previous"
    );
    // a successful one replaces it whole, with no temporary left behind
    let o = run_in(&d, &["fmt", "k.ptx", "-o", "f.ptx"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(d.join("f.ptx")).unwrap();
    assert!(ptx::parse(&text).is_ok() && text.contains("smem"), "{text}");
    let o = run_in(
        &d,
        &["schedule", "1f1b", "--svg", "s.svg", "--trace", "s.json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::read_to_string(d.join("s.svg"))
        .unwrap()
        .ends_with("</svg>\n"));
    let t: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("s.json")).unwrap()).unwrap();
    assert!(t.is_object() || t.is_array());
    let leftovers: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp") || n.ends_with(".preflight"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let _ = std::fs::remove_dir_all(&d);
}
