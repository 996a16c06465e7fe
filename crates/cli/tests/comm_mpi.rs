//! `ptxforge comm` (feature `mpi`): one process vs `mpirun -np 2` (one process per node) give
//! the same hash for every output of every rank, and the JSON reports time and bytes per leg of
//! every process. Run with `cargo test -p ptxforge-cli --features mpi --test comm_mpi`.
#![cfg(feature = "mpi")]
use std::collections::BTreeSet;
use std::process::Command;

fn report(out: std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn hashes(v: &serde_json::Value) -> BTreeSet<String> {
    v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            p["hashes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h.to_string())
        })
        .collect()
}

#[test]
fn comm_across_two_processes_matches_one_process() {
    let exe = env!("CARGO_BIN_EXE_ptxforge");
    let args = [
        "comm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--tokens",
        "12",
        "--json",
    ];
    let single = report(Command::new(exe).args(args).output().unwrap());
    let multi = report(
        Command::new("mpirun")
            .args(["--allow-run-as-root", "--oversubscribe", "-np", "2", exe])
            .args(args)
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .output()
            .unwrap(),
    );
    let (a, b) = (hashes(&single), hashes(&multi));
    assert_eq!(a.len(), 4 * 8);
    assert_eq!(a, b);
    let procs = multi["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2);
    for p in procs {
        let ops = p["ops"].as_array().unwrap();
        assert_eq!(ops.len(), 6);
        assert!(ops
            .iter()
            .all(|o| o["inter_node_bytes"].as_u64().unwrap() > 0));
        assert!(ops[0]["proxy_put_bytes"].as_u64().unwrap() > 0);
    }
}
