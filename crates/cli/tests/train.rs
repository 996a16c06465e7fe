//! `ptxforge train` refuses bad input before any work: a bad configuration field (named), an
//! unwritable `--save` path, a `--plot` of another format, an unknown `--device`, a `--resume`
//! checkpoint that is missing or of another configuration (the differing field named). Each
//! must fail in preflight, so the message never comes from the training itself.

use std::path::PathBuf;
use std::process::Command;

/// Runs `ptxforge train ARGS`, expects failure, returns stderr.
fn train_fails(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .arg("train")
        .args(args)
        .output()
        .expect("spawn ptxforge");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "succeeded: {args:?}\n{err}");
    assert!(err.starts_with("ptxforge: error:"), "{err}");
    // refused in preflight: no stage was built, no step ran
    assert!(
        !err.contains("device stages") && !err.contains("step "),
        "{err}"
    );
    err
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ptxforge-cli-train-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn s(p: &std::path::Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

#[test]
fn a_bad_config_field_is_named() {
    let dir = tempdir("cfg");
    let cfg = dir.join("bad.toml");
    std::fs::write(&cfg, "[model]\nheads = 3\n\n[parallel]\npp = 3\n").expect("write");
    let save = dir.join("x.ckpt");
    let e = train_fails(&["--config", s(&cfg), "--save", s(&save)]);
    assert!(
        e.contains("model.heads") && e.contains("parallel.pp"),
        "{e}"
    );
    let unknown = dir.join("unknown.toml");
    std::fs::write(&unknown, "[model]\nhiden = 128\n").expect("write");
    let e = train_fails(&["--config", s(&unknown), "--save", s(&save)]);
    assert!(e.contains("hiden"), "{e}");
    let e = train_fails(&["--steps", "0", "--save", s(&save)]);
    assert!(e.contains("train.steps"), "{e}");
    assert!(!save.exists(), "nothing was written");
}

#[test]
fn unwritable_outputs_are_refused_before_work() {
    let dir = tempdir("paths");
    let missing = dir.join("no-such-dir").join("run.ckpt");
    let e = train_fails(&["--save", s(&missing)]);
    assert!(e.contains("--save") && e.contains("no-such-dir"), "{e}");
    let save = dir.join("ok.ckpt");
    let e = train_fails(&["--save", s(&save), "--plot", s(&dir.join("curve.jpg"))]);
    assert!(e.contains("--plot") && e.contains(".svg or .png"), "{e}");
    let trace = dir.join("nope").join("t.json");
    let e = train_fails(&["--save", s(&save), "--trace", s(&trace)]);
    assert!(e.contains("--trace"), "{e}");
    let e = train_fails(&["--save", s(&save), "--device", "tpu"]);
    assert!(e.contains("--device") && e.contains("tpu"), "{e}");
    assert!(!save.exists());
}

#[test]
fn a_checkpoint_of_another_config_is_refused_naming_the_field() {
    let dir = tempdir("resume");
    let save = dir.join("new.ckpt");
    let e = train_fails(&["--save", s(&save), "--resume", s(&dir.join("absent.ckpt"))]);
    assert!(e.contains("--resume") && e.contains("absent.ckpt"), "{e}");
    let mut other = model::config::TrainConfig::default();
    other.model.hidden = 256;
    let ck = dir.join("other.ckpt");
    model::checkpoint::save(&ck, &model::checkpoint::Checkpoint::new(&other, 3)).expect("save");
    let e = train_fails(&["--save", s(&save), "--resume", s(&ck)]);
    assert!(
        e.contains("model.hidden is 256 in the checkpoint, 128 now"),
        "{e}"
    );
}
