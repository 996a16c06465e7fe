//! The TCP mesh engine across processes: `ep-mesh-check launch` starts 2 nodes of 2 ranks, as
//! one process per node (hosting both ranks) or one per rank (node peers mapped through shared
//! segments), the other node reached through the proxy transport over `ep::MeshEngine`; dispatch (BF16, FP8) and combine on fresh random inputs must give outputs
//! bit-identical to the same config in one process over the direct in-process transport, and
//! every received row must be its source token's (checked in the processes).

use ep::selfcheck::{dispatch_combine_hashes, CheckCfg};
use std::collections::hash_map::RandomState;
use std::collections::BTreeSet;
use std::hash::BuildHasher;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ep-mesh-check");

/// The bin's default sizes with 2 nodes x 2 GPUs and `seed`.
fn cfg(seed: u64) -> CheckCfg {
    CheckCfg {
        nodes: 2,
        gpus_per_node: 2,
        experts: 8,
        hidden: 128,
        topk: 2,
        tokens: 6,
        max_tokens: 16,
        seed,
        timeout: Duration::from_secs(60),
    }
}

/// Runs the job (killed after `limit`); returns exit code, stdout, stderr.
fn launch(job: &str, ppn: u32, seed: u64, limit: Duration) -> (Option<i32>, String, String) {
    let t0 = Instant::now();
    let seed = seed.to_string();
    let child = Command::new(BIN)
        .args([
            "launch",
            "--nodes",
            "2",
            "--procs-per-node",
            &ppn.to_string(),
        ])
        .args(["--job-id", job, "--timeout", "10", "--", BIN, "check"])
        .args(["--gpus-per-node", "2", "--seed", &seed])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let f = dist::testing::finish_within(child, t0, limit).unwrap();
    (f.status.code(), f.stdout, f.stderr)
}

/// Runs 2 nodes of `ppn` processes (2 ranks per node) and compares every output's hash with
/// the single-process run on a fresh seed.
fn matches_one_process(ppn: u32) {
    let seed = RandomState::new().hash_one(0u8);
    let job = format!("epmesh{}_{ppn}", std::process::id());
    let (code, out, err) = launch(&job, ppn, seed, Duration::from_secs(240));
    assert_eq!(code, Some(0), "seed {seed}\n{out}\n{err}");
    for r in 0..2 * ppn {
        assert!(
            out.contains(&format!("[rank {r}] engine: tcp mesh")),
            "{out}"
        );
    }
    let got: BTreeSet<String> = out
        .lines()
        .filter_map(|l| l.split_once("] ").map(|(_, rest)| rest))
        .filter(|l| l.starts_with("hash "))
        .map(str::to_string)
        .collect();
    let want: BTreeSet<String> = dispatch_combine_hashes(&cfg(seed), None)
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(want.len(), 4 * 5, "{want:?}");
    assert_eq!(
        got, want,
        "seed {seed}: the processes' outputs differ\n{out}\n{err}"
    );
    assert!(dist::shm::job_segments(&job).is_empty());
}

#[test]
fn one_process_per_node_matches_one_process() {
    matches_one_process(1);
}

#[test]
fn one_process_per_rank_matches_one_process() {
    matches_one_process(2);
}
