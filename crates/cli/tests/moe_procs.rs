//! `ptxforge launch ... -- ptxforge moe` (default features: the TCP engine): 2 nodes x 2
//! processes (one per rank, node peers mapped through IPC), 2 x 1 (one per node) and 2 x 4 give
//! every output and gradient of every rank, and the data-parallel sums as every process folded
//! them, bit-identical to the single-process run, whose f64 reference checks pass; the
//! processes' dispatch bytes add up to the single-process figure. Faults: a rank SIGKILLed
//! mid-dispatch fails the job with every other rank naming it and the operation, leaving no
//! process and no segment of the job; a rank that starts late is waited for; a rank with a
//! different `--hidden` fails the bootstrap on every rank naming the field.
use serde_json::Value;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod common;
mod leftovers;
use leftovers::assert_nothing_left;

const BIN: &str = env!("CARGO_BIN_EXE_ptxforge");

/// The CLI tests' small MoE ([`common::SMALL_MOE`]) without `--gpus-per-node` and `--hidden`:
/// each test names its layout, and the mismatch test gives one rank another size.
fn base_args() -> Vec<String> {
    let mut a = common::small_moe(&[]);
    for flag in ["--gpus-per-node", "--hidden"] {
        if let Some(i) = a.iter().position(|s| s == flag) {
            a.drain(i..i + 2);
        }
    }
    a
}

/// The moe command line of `gpn` GPUs per node, with the small size's hidden.
fn moe_args(gpn: u32, extra: &[&str]) -> Vec<String> {
    let mut a = base_args();
    a.extend(["--gpus-per-node", &gpn.to_string(), "--hidden", "256"].map(String::from));
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: stdout:\n{}", text(&out.stdout)))
}

/// The single-process run of `gpn` GPUs per node (`--dump-hash --json`), once per test binary.
fn single(gpn: u32) -> &'static Value {
    static TWO: OnceLock<Value> = OnceLock::new();
    static FOUR: OnceLock<Value> = OnceLock::new();
    let cell = match gpn {
        2 => &TWO,
        4 => &FOUR,
        _ => panic!("no cached single-process run for {gpn} GPUs per node"),
    };
    cell.get_or_init(|| {
        let out = Command::new(BIN)
            .args(moe_args(gpn, &["--dump-hash", "--json"]))
            .output()
            .unwrap();
        let v = json(&out);
        assert_eq!(
            v["ok"], true,
            "the single-process run passes its f64 checks"
        );
        v
    })
}

/// A unique job id per test (names its segments; the launcher picks a free MASTER_PORT).
fn job(name: &str) -> String {
    format!("mp{}_{name}", std::process::id())
}

/// `ptxforge launch --nodes 2 --procs-per-node ppn` of `cmd`, waited for at most `limit`.
fn launch(job: &str, ppn: u32, prefix: bool, cmd: &[String], limit: Duration) -> Output {
    let mut c = Command::new(BIN);
    c.args([
        "launch",
        "--nodes",
        "2",
        "--procs-per-node",
        &ppn.to_string(),
    ])
    .args(["--timeout", "5", "--job-id", job]);
    if !prefix {
        c.arg("--no-prefix");
    }
    let child = c
        .arg("--")
        .args(cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SIGKILL the launcher: its ranks die with it (PR_SET_PDEATHSIG)
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("the job did not end within {limit:?}");
        }
    }
}

/// `ptxforge moe` with `args` as every rank's command.
fn moe_cmd(args: Vec<String>) -> Vec<String> {
    std::iter::once(BIN.to_string()).chain(args).collect()
}

/// `ptxforge moe` through `sh -c SCRIPT` (the script ends with `exec "$0" "$@"`, `$RANK` set).
fn wrapped(script: &str, args: Vec<String>) -> Vec<String> {
    let mut c = vec!["sh".into(), "-c".into(), script.into()];
    c.extend(moe_cmd(args));
    c
}

fn sorted(v: &Value) -> Vec<String> {
    let mut h: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.to_string())
        .collect();
    h.sort();
    h
}

/// Hashes of the single-process run without its data-parallel sums, and the sums.
fn split_sums(hashes: &Value) -> (Vec<String>, Vec<String>) {
    let all = sorted(hashes);
    let is_sum = |h: &String| h.contains("_sum\"");
    (
        all.iter().filter(|h| !is_sum(h)).cloned().collect(),
        all.iter().filter(|h| is_sum(h)).cloned().collect(),
    )
}

/// The multi-process report `multi` of 2 nodes x `gpn` GPUs, `ppn` processes per node, equals
/// the single-process run: every rank's hashes, every process's sums, the dispatch bytes.
fn assert_identical(multi: &Value, gpn: u32, ppn: u32) {
    let one = single(gpn);
    let (ranks, sums) = split_sums(&one["hashes"]);
    assert_eq!(ranks.len(), 2 * gpn as usize * 8, "8 hashes per rank");
    assert_eq!(sums.len(), 2, "dw_gate_sum and shared_dw_sum");
    assert_eq!(sorted(&multi["hashes"]), sorted(&one["hashes"]));
    assert_eq!(multi["engine"], "tcp mesh", "{multi}");
    let procs = multi["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2 * ppn as usize);
    let per = gpn / ppn;
    for (i, p) in procs.iter().enumerate() {
        let want: Vec<u64> = (0..per).map(|k| (i as u32 * per + k) as u64).collect();
        let got: Vec<u64> = p["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_u64().unwrap())
            .collect();
        assert_eq!(got, want, "process {i} hosts its ranks");
        assert_eq!(
            sorted(&p["dp_sums"]),
            sums,
            "process {i}'s data-parallel sums"
        );
    }
    let sum = |leg: &str, key: &str| -> u64 {
        procs
            .iter()
            .flat_map(|p| p["legs"].as_array().unwrap())
            .filter(|l| l["leg"] == leg)
            .map(|l| l[key].as_u64().unwrap())
            .sum()
    };
    let row = one["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["phase"]
                .as_str()
                .is_some_and(|p| p.starts_with("dispatch ("))
        })
        .expect("a dispatch row");
    assert_eq!(sum("dispatch", "inter_node_bytes"), row["inter_bytes"]);
    assert_eq!(sum("dispatch", "intra_node_bytes"), row["intra_bytes"]);
    assert!(
        sum("dispatch", "inter_node_bytes") > 0 && sum("combine of dX", "inter_node_bytes") > 0
    );
}

fn multi_process(name: &str, gpn: u32, ppn: u32) {
    let j = job(name);
    let args = moe_args(
        gpn,
        &[
            "--procs-per-node",
            &ppn.to_string(),
            "--dump-hash",
            "--json",
        ],
    );
    let out = launch(&j, ppn, false, &moe_cmd(args), Duration::from_secs(180));
    assert_identical(&json(&out), gpn, ppn);
    assert_nothing_left(&j, &text(&out.stderr));
}

#[test]
fn moe_2x2_one_process_per_rank_is_bit_identical() {
    multi_process("r22", 2, 2);
}

#[test]
fn moe_2x1_one_process_per_node_is_bit_identical() {
    multi_process("n21", 2, 1);
}

#[test]
fn moe_2x4_one_process_per_rank_is_bit_identical() {
    multi_process("r24", 4, 4);
}

/// Rank 1 starts 2 s after the others: they wait for it at bootstrap and the run completes,
/// still bit-identical.
#[test]
fn moe_late_rank_is_waited_for() {
    let j = job("late");
    let args = moe_args(2, &["--dump-hash", "--json"]);
    let script = r#"[ "$RANK" = 1 ] && sleep 2; exec "$0" "$@""#;
    let t0 = Instant::now();
    let out = launch(
        &j,
        1,
        false,
        &wrapped(script, args),
        Duration::from_secs(120),
    );
    assert!(t0.elapsed() >= Duration::from_secs(2));
    assert_identical(&json(&out), 2, 1);
    assert_nothing_left(&j, &text(&out.stderr));
}

/// Rank 1 runs with `--hidden 128`, the others with 256: every rank fails at bootstrap naming
/// the field and both values.
#[test]
fn moe_config_mismatch_fails_at_bootstrap_naming_the_field() {
    let j = job("cfg");
    let script = r#"h=256; [ "$RANK" = 1 ] && h=128; exec "$0" "$@" --hidden $h"#;
    let mut args = base_args();
    args.extend(["--gpus-per-node", "2"].map(String::from));
    let out = launch(&j, 1, true, &wrapped(script, args), Duration::from_secs(60));
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let named = "rank 1 has `config[1].hidden` = 128 where rank 0 has 256";
    for r in 0..2 {
        let ok = err
            .lines()
            .any(|l| l.starts_with(&format!("[rank {r}] ")) && l.contains(named));
        assert!(ok, "rank {r} does not name the field:\n{err}");
    }
    assert_nothing_left(&j, &err);
}

/// Rank 3 SIGKILLs itself while the dispatch is in flight: the launcher fails naming it, every
/// other rank stops within the peer timeout naming rank 3 and the dispatch, and nothing of
/// the job is left.
#[test]
fn moe_rank_killed_mid_dispatch_is_named_by_every_rank() {
    let j = job("kill");
    let args = moe_args(2, &["--procs-per-node", "2"]);
    let script = r#"export PTXFORGE_TEST_DIE='3:|| dispatch'; exec "$0" "$@""#;
    let t0 = Instant::now();
    let out = launch(
        &j,
        2,
        true,
        &wrapped(script, args),
        Duration::from_secs(120),
    );
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("test hook: SIGKILL"), "the hook fired:\n{err}");
    assert!(
        err.contains("rank 3 (node 1) was killed by signal 9 (SIGKILL)"),
        "the launcher names rank 3:\n{err}"
    );
    for r in 0..3 {
        let ok = err.lines().any(|l| {
            l.starts_with(&format!("[rank {r}] "))
                && l.contains("rank 3 died during `moe: dispatch")
        });
        assert!(ok, "rank {r} does not name rank 3 and the dispatch:\n{err}");
        assert!(
            err.contains(&format!("rank {r} exited with status 1")),
            "{err}"
        );
    }
    // the survivors stop by themselves: before the launcher's SIGTERM (5 s after the death)
    assert!(!err.contains("stopping the remaining ranks"), "{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(90),
        "took {:?}",
        t0.elapsed()
    );
    assert_nothing_left(&j, &err);
}

/// Three processes for 2 nodes x 2 GPUs fit neither layout: every rank refuses it alike and
/// leaves the group cleanly (no rank is reported dead).
#[test]
fn moe_process_count_must_fit_a_layout() {
    let j = job("np3");
    let mut c = Command::new(BIN);
    c.args([
        "launch",
        "--nodes",
        "1",
        "--procs-per-node",
        "3",
        "--timeout",
        "5",
    ])
    .args(["--job-id", &j, "--"])
    .args(moe_cmd(moe_args(2, &[])));
    let out = c.output().unwrap();
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let named =
        "--nodes 2 --gpus-per-node 2: start one process per node (2 in all) or per rank (4), not 3";
    for r in 0..3 {
        let ok = err
            .lines()
            .any(|l| l.starts_with(&format!("[rank {r}] ")) && l.contains(named));
        assert!(ok, "rank {r}:\n{err}");
    }
    assert!(
        !err.contains("died"),
        "a clean refusal, not a death:\n{err}"
    );
    assert_nothing_left(&j, &err);
}

/// `--engine` and `--procs-per-node` belong to a multi-process run.
#[test]
fn moe_multi_process_flags_need_a_launcher() {
    for (flag, value) in [("--engine", "tcp"), ("--procs-per-node", "2")] {
        let out = Command::new(BIN)
            .args(moe_args(2, &[flag, value]))
            .env_remove("RANK")
            .env_remove("OMPI_COMM_WORLD_RANK")
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains(&format!("{flag} {value}: only for a multi-process run")),
            "{err}"
        );
    }
}
