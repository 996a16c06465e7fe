//! `mpirun -np 2 ptxforge moe --nodes 2 --gpus-per-node 2` (feature `mpi`: one process per
//! node, other nodes through the MPI engine), and `mpirun -np 4 ... --procs-per-node 2` (one
//! process per rank: node peers mapped through IPC, a proxy per rank), give every output and
//! gradient of every rank bit-identical to the single-process run, whose f64 reference checks
//! pass; the JSON reports per process the time and bytes of each communication leg, and the
//! bytes add up to the single-process run's; no shared-memory segment of the job is left.
//! `crates/cli/tests/moe_procs.rs` runs the same under `ptxforge launch` (TCP engine). Each job
//! gets its own MASTER_PORT (the `dist` bootstrap runs under mpirun too). Run with
//! `cargo test -p ptxforge-cli --features mpi --test moe_mpi`.
#![cfg(feature = "mpi")]
use serde_json::Value;
use std::process::Command;

mod common;
mod leftovers;
use leftovers::assert_nothing_left;

/// The CLI tests' small MoE ([`common::SMALL_MOE`]) without its `--gpus-per-node`: each test
/// names its own layout.
fn base_args() -> Vec<String> {
    let mut a = common::small_moe(&[]);
    if let Some(i) = a.iter().position(|s| s == "--gpus-per-node") {
        a.drain(i..i + 2);
    }
    a
}

fn json(out: std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
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

#[test]
fn moe_one_process_per_node_is_bit_identical() {
    multi_process(2, 1, None);
}

#[test]
fn moe_two_nodes_of_four_gpus() {
    multi_process(4, 1, None);
}

#[test]
fn moe_one_process_per_rank_is_bit_identical() {
    multi_process(2, 2, None);
}

#[test]
fn moe_two_nodes_of_four_gpus_one_process_per_rank() {
    multi_process(4, 4, None);
}

/// `--engine tcp` under mpirun: the TCP mesh engine instead of MPI, same results.
#[test]
fn moe_one_process_per_rank_over_tcp_under_mpirun() {
    multi_process(2, 2, Some("tcp"));
}

/// `mpirun` with root allowed, oversubscription, and a free MASTER_PORT of its own exported
/// to the ranks (with `vars`, which must be set on the command).
fn mpirun(np: u32, vars: &[&str]) -> Command {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let mut c = Command::new("mpirun");
    c.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-x",
        "MASTER_PORT",
    ])
    .env("MASTER_PORT", port.to_string())
    .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
    .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    for v in vars {
        c.args(["-x", v]);
    }
    c.args(["-np", &np.to_string(), env!("CARGO_BIN_EXE_ptxforge")]);
    c
}

/// `--procs-per-node` must agree with the process count mpirun started.
#[test]
fn moe_procs_per_node_must_match_mpirun() {
    let out = mpirun(4, &[])
        .args(base_args())
        .args(["--gpus-per-node", "2", "--procs-per-node", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--procs-per-node 1: the job has 2 process(es) per node (4 in all)"),
        "{err}"
    );
}

/// 2 nodes of `gpn` GPUs under `mpirun`, `ppn` processes per node (1, or `gpn`: one per rank),
/// on `engine` (`--engine`; None: the default, MPI).
fn multi_process(gpn: u32, ppn: u32, engine: Option<&str>) {
    let exe = env!("CARGO_BIN_EXE_ptxforge");
    let g = gpn.to_string();
    let job = format!(
        "moempi{}_{gpn}_{ppn}_{}",
        std::process::id(),
        engine.unwrap_or("mpi")
    );
    let single = json(
        Command::new(exe)
            .args(base_args())
            .args(["--gpus-per-node", &g])
            .args(["--dump-hash", "--json"])
            .output()
            .unwrap(),
    );
    let multi = json(
        mpirun(2 * ppn, &["PTXFORGE_JOB_ID"])
            .args(base_args())
            .args(["--gpus-per-node", &g, "--procs-per-node", &ppn.to_string()])
            .args(["--dump-hash", "--json"])
            .args(engine.map(|e| ["--engine", e]).into_iter().flatten())
            .env("PTXFORGE_JOB_ID", &job)
            .output()
            .unwrap(),
    );
    let (a, b) = (sorted(&single["hashes"]), sorted(&multi["hashes"]));
    assert_eq!(
        a.len(),
        2 * gpn as usize * 8 + 2,
        "per-rank hashes and the two data-parallel sums"
    );
    assert_eq!(a, b);
    assert_nothing_left(&job, "");
    let name = match engine {
        Some("tcp") => "tcp mesh",
        _ => "MPI point-to-point (Open MPI)",
    };
    assert_eq!(multi["engine"], name, "{multi}");
    // per-leg bytes of the processes add up to the single-process run's dispatch
    let procs = multi["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2 * ppn as usize);
    for (i, p) in procs.iter().enumerate() {
        let want: Vec<u64> = (0..gpn / ppn)
            .map(|k| (i as u32 * gpn / ppn + k) as u64)
            .collect();
        let ranks: Vec<u64> = p["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_u64().unwrap())
            .collect();
        assert_eq!(ranks, want, "process {i} hosts its ranks");
    }
    let sum = |leg: &str, key: &str| -> u64 {
        procs
            .iter()
            .flat_map(|p| p["legs"].as_array().unwrap())
            .filter(|l| l["leg"] == leg)
            .map(|l| l[key].as_u64().unwrap())
            .sum()
    };
    let rows = single["phases"].as_array().unwrap();
    let row = rows
        .iter()
        .find(|r| {
            r["phase"]
                .as_str()
                .is_some_and(|p| p.starts_with("dispatch ("))
        })
        .expect("a dispatch row");
    assert_eq!(
        sum("dispatch", "inter_node_bytes"),
        row["inter_bytes"].as_u64().unwrap()
    );
    assert_eq!(
        sum("dispatch", "intra_node_bytes"),
        row["intra_bytes"].as_u64().unwrap()
    );
    assert_eq!(
        single["ok"], true,
        "the single-process run passes its f64 checks"
    );
    assert!(
        sum("dispatch", "inter_node_bytes") > 0 && sum("combine of dX", "inter_node_bytes") > 0
    );
}

/// One rank per process; rank 3 SIGKILLs itself while the dispatch is in flight: mpirun
/// names it and fails, the other processes stop (SIGTERM from mpirun) after removing every
/// segment of the job, and nothing of the job is left.
#[test]
fn moe_rank_killed_mid_dispatch_stops_the_job() {
    let job = format!("moekill{}", std::process::id());
    let t0 = std::time::Instant::now();
    let mut child = mpirun(4, &["PTXFORGE_JOB_ID", "PTXFORGE_TEST_DIE"])
        .args(base_args())
        .args(["--gpus-per-node", "2", "--procs-per-node", "2", "--json"])
        .env("PTXFORGE_JOB_ID", &job)
        .env("PTXFORGE_TEST_DIE", "3:|| dispatch")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > std::time::Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("the job did not stop within 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "stderr:\n{err}");
    assert!(err.contains("test hook: SIGKILL"), "the hook fired:\n{err}");
    assert!(
        err.contains("process rank 3") && err.contains("signal 9"),
        "the dead rank is named:\n{err}"
    );
    // the survivors may still be removing segments and exiting when mpirun returns
    assert_nothing_left(&job, &err);
}
