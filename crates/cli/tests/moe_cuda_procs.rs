//! The multi-process `ptxforge moe` on CUDA devices, on the fake driver (`crates/fakecuda`):
//! `ptxforge launch --nodes 1 --procs-per-node P -- ptxforge moe --device cuda` (one process per
//! rank, node peers' buffers mapped through CUDA IPC, the TCP engine under the proxy's fences)
//! gives every output and gradient of every rank, and the data-parallel sums as every process
//! folded them, bit-identical to the single-process `ptxforge moe --device cuda` on the fake
//! driver (whose f64 checks pass) and to the emulator run. Refusals, on every rank alike with no
//! rank reported dead: CUDA across nodes (the proxy needs host views of device memory) and
//! `--engine nccl` (its rounds deadlock with the kernels). A rank SIGKILLed mid-dispatch is
//! named by the survivor and the launcher. Nothing of a job is left behind.
use serde_json::Value;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "../../runtime/tests/support/fakecuda.rs"]
mod fakecuda_support;
mod leftovers;
use fakecuda_support::FakeCuda;
use leftovers::assert_nothing_left;

const BIN: &str = env!("CARGO_BIN_EXE_ptxforge");

/// The CLI tests' small MoE on one node of `gpn` GPUs, with `extra`.
fn moe_args(gpn: u32, extra: &[&str]) -> Vec<String> {
    let gpn = gpn.to_string();
    let mut a: Vec<String> = [
        "moe",
        "--nodes",
        "1",
        "--gpus-per-node",
        &gpn,
        "--hidden",
        "256",
        "--experts",
        "16",
        "--intermediate",
        "128",
        "--tokens",
        "128",
        "--topk",
        "4",
        "--groups",
        "4",
        "--topk-groups",
        "2",
        "--num-sms",
        "4",
    ]
    .map(String::from)
    .to_vec();
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

/// `ptxforge` with the fake driver of `devices` GPUs.
fn fake_cmd(f: &FakeCuda, devices: u32) -> Command {
    let mut c = f.command(BIN);
    c.env("PTXFORGE_FAKECUDA_DEVICES", devices.to_string())
        .env_remove("RANK")
        .env_remove("OMPI_COMM_WORLD_RANK");
    c
}

/// The single-process run of `gpn` GPUs on `device` (`--dump-hash --json`), its f64 checks
/// passed.
fn single(f: &FakeCuda, gpn: u32, device: &str) -> Value {
    let out = fake_cmd(f, gpn)
        .args(moe_args(
            gpn,
            &["--device", device, "--dump-hash", "--json"],
        ))
        .output()
        .unwrap();
    let v = json(&out);
    assert_eq!(v["ok"], true, "the {device} run passes its f64 checks: {v}");
    v
}

/// A unique job id per test (names its segments; the launcher picks a free MASTER_PORT).
fn job(name: &str) -> String {
    format!("gpuprocs{}_{name}", std::process::id())
}

/// `ptxforge launch --nodes NODES --procs-per-node PPN` of `ptxforge moe ARGS` on the fake
/// driver of `devices` GPUs per process, with `env`, waited for at most `limit`.
struct Job<'a> {
    name: &'a str,
    nodes: u32,
    ppn: u32,
    devices: u32,
    env: &'a [(&'a str, &'a str)],
    /// `[rank N] ` before each line (`false`: `--no-prefix`, for the JSON of rank 0).
    prefix: bool,
    args: Vec<String>,
}

fn launch(f: &FakeCuda, j: &Job, limit: Duration) -> Output {
    let mut c = fake_cmd(f, j.devices);
    c.args(["launch", "--nodes", &j.nodes.to_string()])
        .args(["--procs-per-node", &j.ppn.to_string()])
        .args(["--timeout", "5", "--job-id", j.name])
        .args((!j.prefix).then_some("--no-prefix"))
        .args(["--", BIN])
        .args(&j.args)
        .envs(j.env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
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

fn sorted(v: &Value) -> Vec<String> {
    let mut h: Vec<String> = v
        .as_array()
        .unwrap_or_else(|| panic!("an array: {v}"))
        .iter()
        .map(|x| x.to_string())
        .collect();
    h.sort();
    h
}

/// Every rank's hashes and every process's data-parallel sums of the `gpn` processes on the
/// fake CUDA driver equal the single-process emulator run's (whose f64 checks pass).
fn one_process_per_rank(f: &FakeCuda, gpn: u32) {
    // The reference is the single-process emulator run. (Not the single-process CUDA run on
    // the fake: with several devices and host threads in one process, the fake lets emulated
    // time fast-forward while any host thread synchronises, even if another is still about to
    // launch the kernel the waiting one depends on: on a loaded host its dispatch timed out
    // once. Each process of the launched run has one device and maps its peers, so its time
    // never fast-forwards.)
    let emu = single(f, gpn, "emu");
    let want = sorted(&emu["hashes"]);
    assert_eq!(want.len(), gpn as usize * 8 + 2, "8 per rank and 2 sums");
    let name = job(&format!("r1x{gpn}"));
    let j = Job {
        name: &name,
        nodes: 1,
        ppn: gpn,
        devices: gpn,
        env: &[],
        prefix: false,
        args: moe_args(gpn, &["--device", "cuda", "--dump-hash", "--json"]),
    };
    let out = launch(f, &j, Duration::from_secs(120));
    let err = text(&out.stderr);
    let multi = json(&out);
    assert_eq!(multi["engine"], "tcp mesh", "{multi}");
    assert_eq!(sorted(&multi["hashes"]), want, "{err}");
    let sums: Vec<String> = want
        .iter()
        .filter(|h| h.contains("_sum\""))
        .cloned()
        .collect();
    assert_eq!(sums.len(), 2);
    let procs = multi["processes"].as_array().unwrap();
    assert_eq!(procs.len(), gpn as usize);
    for (i, p) in procs.iter().enumerate() {
        assert_eq!(
            p["ranks"],
            serde_json::json!([i]),
            "process {i} hosts rank {i}"
        );
        assert_eq!(
            sorted(&p["dp_sums"]),
            sums,
            "process {i}'s data-parallel sums"
        );
    }
    assert_nothing_left(&name, &err);
}

#[test]
fn moe_cuda_one_process_per_rank_is_bit_identical() {
    let Some(f) = FakeCuda::new("moeprocs-id") else {
        return;
    };
    for gpn in [2, 4] {
        let t0 = Instant::now();
        one_process_per_rank(&f, gpn);
        eprintln!("1 x {gpn}: {:?}", t0.elapsed());
    }
}

/// A failed job whose every rank printed `named` (with the launcher's prefix), none reported
/// dead, and nothing of it left.
fn assert_refused(f: &FakeCuda, j: &Job, named: &str) {
    let out = launch(f, j, Duration::from_secs(60));
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    for r in 0..j.nodes * j.ppn {
        let ok = err
            .lines()
            .any(|l| l.starts_with(&format!("[rank {r}] ")) && l.contains(named));
        assert!(ok, "rank {r} does not say `{named}`:\n{err}");
    }
    assert!(
        !err.contains("died"),
        "a clean refusal, not a death:\n{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert_nothing_left(j.name, &err);
}

/// Two nodes on CUDA devices: every rank refuses alike (after joining, where the layout is
/// checked) and leaves the group cleanly.
#[test]
fn moe_cuda_across_nodes_is_refused_by_every_rank() {
    let Some(f) = FakeCuda::new("moeprocs-nodes") else {
        return;
    };
    let name = job("nodes");
    let mut args = moe_args(2, &["--device", "cuda"]);
    let i = args.iter().position(|a| a == "--nodes").unwrap();
    args[i + 1] = "2".into();
    let j = Job {
        name: &name,
        nodes: 2,
        ppn: 2,
        devices: 2,
        env: &[],
        prefix: true,
        args,
    };
    assert_refused(
        &f,
        &j,
        "--device cuda --nodes 2: the multi-process moe runs one node on CUDA devices",
    );
}

/// `--engine nccl` is refused by the moe (its rounds wait for the device's queued work, which
/// deadlocks with the dispatch kernels; the fake driver showed it), on every rank alike.
#[test]
fn moe_nccl_engine_is_refused() {
    let Some(f) = FakeCuda::new("moeprocs-nccl") else {
        return;
    };
    for device in ["cuda", "emu"] {
        let name = job(&format!("nccl{device}"));
        let j = Job {
            name: &name,
            nodes: 1,
            ppn: 2,
            devices: 2,
            env: &[],
            prefix: true,
            args: moe_args(2, &["--device", device, "--engine", "nccl"]),
        };
        assert_refused(&f, &j, "--engine nccl: not for the moe yet");
    }
}

/// Rank 1 SIGKILLs itself while the dispatch is in flight: the launcher names it, rank 0 stops
/// naming rank 1 and the dispatch, and nothing of the job is left.
#[test]
fn moe_cuda_rank_killed_mid_dispatch_is_named() {
    let Some(f) = FakeCuda::new("moeprocs-kill") else {
        return;
    };
    let name = job("kill");
    let j = Job {
        name: &name,
        nodes: 1,
        ppn: 2,
        devices: 2,
        env: &[("PTXFORGE_TEST_DIE", "1:|| dispatch")],
        prefix: true,
        args: moe_args(2, &["--device", "cuda"]),
    };
    let t0 = Instant::now();
    let out = launch(&f, &j, Duration::from_secs(90));
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("test hook: SIGKILL"), "the hook fired:\n{err}");
    assert!(
        err.contains("rank 1 (node 0) was killed by signal 9 (SIGKILL)"),
        "the launcher names rank 1:\n{err}"
    );
    let named = err
        .lines()
        .any(|l| l.starts_with("[rank 0] ") && l.contains("rank 1 died during `moe: dispatch"));
    assert!(
        named,
        "rank 0 does not name rank 1 and the dispatch:\n{err}"
    );
    assert!(err.contains("rank 0 exited with status 1"), "{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t0.elapsed()
    );
    assert_nothing_left(&name, &err);
}
