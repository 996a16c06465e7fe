//! The main job: the default `ptxforge train` (the preset of `examples/train/default.toml`:
//! PP 2 x EP 2 over 2 nodes x 2 emulated devices, DualPipeV, FP8 expert/FFN GEMMs, 30 steps)
//! learns: its final validation loss ends below the corpus's unigram bound (the best a
//! context-free model can do), the loss falls, and it writes its checkpoint, loss curve and
//! trace (every kernel of the first step on its device, stream and SM partition). About 3 minutes on 2 idle cores (the release build takes 2 min 43 s; docs/TRAIN.md).

use std::process::Command;

#[test]
fn the_default_run_learns_below_the_unigram_entropy() {
    let dir = std::env::temp_dir().join(format!("ptxforge-train-default-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (ckpt, svg, trace) = (
        dir.join("train.ckpt"),
        dir.join("loss.svg"),
        dir.join("trace.json"),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .args(["train", "--json", "--save"])
        .arg(&ckpt)
        .arg("--plot")
        .arg(&svg)
        .arg("--trace")
        .arg(&trace)
        .output()
        .expect("spawn ptxforge");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let steps = j["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 30);
    let loss = |i: usize| steps[i]["loss"].as_f64().expect("loss");
    assert!(loss(29) < loss(0) - 1.0, "{} -> {}", loss(0), loss(29));
    let valid = j["valid"].as_array().expect("valid");
    let last = valid
        .last()
        .and_then(|v| v["loss"].as_f64())
        .expect("a validation loss");
    let h = j["unigram_entropy_nats"].as_f64().expect("entropy");
    let cross = j["unigram_cross_entropy_nats"]
        .as_f64()
        .expect("cross-entropy");
    eprintln!("final validation loss {last:.4}, unigram entropy {h:.4}, cross {cross:.4}");
    assert!(
        last < h.min(cross),
        "validation {last} not below the unigram bound {h} / {cross}"
    );
    assert_eq!(j["below_unigram"], true);
    for f in [&ckpt, &svg, &trace] {
        let n = std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
        assert!(n > 100, "{} missing or empty", f.display());
    }
    let svg_text = std::fs::read_to_string(&svg).expect("svg");
    assert!(svg_text.starts_with("<svg") || svg_text.starts_with("<?xml"));
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).expect("trace")).expect("json");
    let ev = t["traceEvents"].as_array().expect("traceEvents");
    // every kernel of the first step on its device, stream and SM partition: dispatch on the
    // 20-SM communication partition (the top SMs), the expert GEMMs on the compute partition
    let on = |kernel: &str, part: &str| {
        ev.iter().any(|e| {
            e["name"].as_str().is_some_and(|n| n.starts_with(kernel))
                && e["tid"].as_str().is_some_and(|t| t.ends_with(part))
        })
    };
    assert!(
        on("ep_dispatch", "[SMs 112..131]"),
        "no dispatch on the comm SMs"
    );
    assert!(
        on("grouped_gemm_fp8", "[SMs 0..111]"),
        "no expert GEMM on the compute SMs"
    );
    assert!(on("mla_attn_fwd", "]"), "no attention kernel");
    assert!(ev.iter().any(|e| e["name"].as_str() == Some("optimizer")));
    let _ = std::fs::remove_dir_all(&dir);
}
