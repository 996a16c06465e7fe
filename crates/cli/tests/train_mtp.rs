//! `ptxforge train` with the MTP module switched on by `--config` (`model.mtp_depth = 1`): the
//! step line prints the MTP loss after the main one, `--json` rows carry `mtp_loss`, and a
//! `--resume` continues the MTP run. Tiny run: the default model with MTP on PP 2 x EP 1, one
//! 128-token sequence per micro-batch, one evaluation batch.

use std::path::PathBuf;
use std::process::Command;

fn train(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .arg("train")
        .args(args)
        .output()
        .expect("spawn ptxforge");
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "failed: {args:?}\n{o}\n{e}");
    o
}

#[test]
fn an_mtp_run_prints_and_reports_the_mtp_loss() {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("ptxforge-cli-mtp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let cfg = dir.join("mtp.toml");
    std::fs::write(
        &cfg,
        "[model]\nmtp_depth = 1\n\n[train]\nmicro_batch = 1\nmicro_batches = 4\nsteps = 2\n\
         mtp_loss_weight = 0.3\n\n[parallel]\nep = 1\nep_nodes = 1\nnodes = 1\n\
         devices_per_node = 2\n",
    )
    .expect("write");
    let (cfg, save) = (cfg.to_str().unwrap(), dir.join("mtp.ckpt"));
    let save = save.to_str().unwrap();
    let common = ["--config", cfg, "--save", save, "--eval-batches", "1"];
    let text = train(&[&common[..], &["--steps", "1"]].concat());
    let line = text
        .lines()
        .find(|l| l.starts_with("step    1  loss"))
        .unwrap_or_else(|| panic!("no step line:\n{text}"));
    let mtp: f64 = line
        .split("  mtp ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no MTP loss in {line:?}"));
    // at initialisation both predictions are near uniform over 256 bytes (ln 256 = 5.55)
    assert!(mtp > 4.0 && mtp < 7.0, "{line}");
    let json = train(&[&common[..], &["--resume", save, "--json"]].concat());
    let v: serde_json::Value = serde_json::from_str(&json).expect("one JSON document");
    let rows = v["steps"].as_array().expect("steps");
    assert_eq!(rows.len(), 1, "the resumed run did step 2 only: {json}");
    assert_eq!(rows[0]["step"], 2);
    let m = rows[0]["mtp_loss"].as_f64().expect("mtp_loss");
    assert!(m.is_finite() && m > 0.0, "{json}");
    let _ = std::fs::remove_dir_all(&dir);
}
