//! The main job does not depend on how busy the host is (issue: emulated time). Communication
//! waits time out on emulated time, which only passes while some emulated device makes
//! progress, so `ptxforge moe` passes pinned to one core and beside CPU-burning threads, with
//! results bit-identical to the idle run.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

/// Runs the small `moe` (behind `prefix`, e.g. `taskset -c 0`) and returns its report.
fn run(prefix: &[&str]) -> serde_json::Value {
    let bin = env!("CARGO_BIN_EXE_ptxforge");
    let mut cmd = match prefix.split_first() {
        Some((p, rest)) => {
            let mut c = Command::new(p);
            c.args(rest).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let args = common::small_moe(&["--check-tokens", "0", "--check-experts", "4", "--json"]);
    let out = cmd.args(&args).output().expect("spawn ptxforge");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{prefix:?}: exit {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(v["ok"], serde_json::Value::Bool(true), "{stdout}");
    v
}

/// Everything in the report that is a function of the computed values (errors of every output
/// and gradient against the f64 reference over all tokens, byte counts, checks), not of time.
fn results(v: &serde_json::Value) -> Vec<String> {
    let mut r: Vec<String> = v
        .as_object()
        .expect("report object")
        .iter()
        .filter(|(k, _)| k.ends_with("_rel_err") || k.ends_with("_norm"))
        .map(|(k, x)| format!("{k}={x}"))
        .collect();
    for p in v["phases"].as_array().expect("phases") {
        let f = |k: &str| p.get(k).map(|x| x.to_string()).unwrap_or_default();
        r.push(format!(
            "{}: inter {} intra {} max_err {} rel {} ok {}",
            f("phase"),
            f("inter_bytes"),
            f("intra_bytes"),
            f("max_err"),
            f("max_rel_err"),
            f("ok")
        ));
    }
    r
}

/// Runs `f` while `2 x cores` threads of this process burn CPU.
fn beside_busy_threads<T>(f: impl FnOnce() -> T) -> T {
    let stop = AtomicBool::new(false);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..2 * cores {
            s.spawn(|| {
                let mut x = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                }
                std::hint::black_box(x);
            });
        }
        let r = f();
        stop.store(true, Ordering::Relaxed);
        r
    })
}

#[test]
fn moe_on_one_core_and_on_a_busy_host_matches_the_idle_run_bit_for_bit() {
    let idle = results(&run(&[]));
    assert!(idle.len() > 10, "{idle:?}");
    // util-linux's taskset pins the run (and every thread it starts) to core 0
    let one_core = results(&run(&["taskset", "-c", "0"]));
    assert_eq!(idle, one_core, "pinned to one core");
    let busy = beside_busy_threads(|| results(&run(&[])));
    assert_eq!(idle, busy, "beside CPU-burning threads");
}

#[test]
fn a_nonsensical_comm_timeout_is_refused() {
    for bad in ["0", "-2s", "5 parsecs", "1e300"] {
        let out = Command::new(env!("CARGO_BIN_EXE_ptxforge"))
            .args(["moe", &format!("--comm-timeout={bad}")])
            .output()
            .expect("spawn ptxforge");
        assert!(!out.status.success(), "{bad} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--comm-timeout"), "{bad}: {err}");
    }
}
