//! `netnccl-check` as 2 nodes x 1 and 2 x 2 processes under the `dist` launcher, on the fake
//! NCCL + fake driver (`crates/fakecuda`, linked as libcuda.so / libnccl.so in a temporary
//! directory): collectives against the host reference (bit for bit with the fake's rank-order
//! reductions, and within f64 tolerance), the proxy transport over the NCCL engine, clear
//! errors, and faults (a rank SIGKILLed mid-collective or mid-engine-round, a hung rank: the
//! survivor fails by itself naming the operation, nothing is left). With
//! `PTXFORGE_TEST_NCCL=1` (scripts/gpu-check.sh) the collectives run instead on the real NCCL
//! and GPU(s): `PTXFORGE_TEST_NCCL_RANKS` ranks (default 1) in one node.

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_netnccl-check");

#[path = "../../runtime/tests/support/fakecuda.rs"]
mod fakecuda_support;

/// The fake driver + NCCL (`fakecuda_support::FakeCuda`) with this crate's settings.
struct Fake(fakecuda_support::FakeCuda);

impl Fake {
    fn new(tag: &str) -> Option<Fake> {
        fakecuda_support::FakeCuda::new(&format!("netnccl-{tag}")).map(Fake)
    }

    fn command(&self) -> Command {
        let mut c = self.0.command(BIN);
        c.env("PTXFORGE_FAKENCCL_TIMEOUT", "30")
            .env_remove("PTXFORGE_NCCL_LIB")
            .env_remove("PTXFORGE_NO_NCCL");
        c
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `netnccl-check launch --nodes N --procs-per-node P -- netnccl-check ARGS`.
fn launch(mut c: Command, nodes: usize, ppn: usize, args: &[&str]) -> Output {
    c.args(["launch", "--nodes", &nodes.to_string(), "--procs-per-node"])
        .arg(ppn.to_string())
        .args(["--timeout", "30", "--", BIN])
        .args(args)
        .output()
        .expect("run netnccl-check launch")
}

#[test]
fn collectives_match_the_host_reference_on_the_fake_nccl() {
    let Some(f) = Fake::new("coll") else { return };
    // 1 x 1: the one-rank communicator the one-GPU check machine runs
    for (nodes, ppn, count) in [(1, 1, "33"), (2, 1, "257"), (2, 2, "64")] {
        let o = launch(
            f.command(),
            nodes,
            ppn,
            &["collectives", "--exact", "--count", count],
        );
        let t = text(&o);
        assert!(o.status.success(), "{nodes}x{ppn}: {t}");
        for r in 0..nodes * ppn {
            let want = format!("rank {r}: collectives OK ({} ranks", nodes * ppn);
            assert!(t.contains(&want), "{nodes}x{ppn}: no `{want}` in\n{t}");
        }
    }
}

#[test]
fn proxy_transport_runs_over_the_nccl_engine() {
    let Some(f) = Fake::new("proxy") else { return };
    let o = launch(f.command(), 2, 1, &["proxy"]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for r in 0..2 {
        assert!(t.contains(&format!("rank {r}: proxy over NCCL OK")), "{t}");
    }
}

/// Ranks that disagree on a collective's size fail with an NCCL error naming the call, not a
/// hang or a wrong result.
#[test]
fn mismatched_counts_are_an_nccl_error() {
    let Some(f) = Fake::new("mismatch") else {
        return;
    };
    let o = launch(
        f.command(),
        2,
        1,
        &["collectives", "--count", "8", "--skew-rank", "1"],
    );
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(
        t.contains("ncclAllReduce failed with ncclResult_t 5"),
        "{t}"
    );
    assert!(t.contains("mismatched operations or counts"), "{t}");
}

#[test]
fn missing_libnccl_is_nccl_unavailable() {
    let o = Command::new(BIN)
        .arg("unavailable")
        .env("PTXFORGE_NCCL_LIB", "/nonexistent/libnccl.so.2")
        .output()
        .expect("run netnccl-check");
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("NcclUnavailable: libnccl not found"), "{t}");
    assert!(t.contains("/nonexistent/libnccl.so.2"), "{t}");
}

/// The real NCCL on GPU(s) (scripts/gpu-check.sh sets PTXFORGE_TEST_NCCL=1).
#[test]
fn collectives_on_the_real_nccl() {
    if std::env::var("PTXFORGE_TEST_NCCL").as_deref() != Ok("1") {
        eprintln!("skip: real-NCCL tests need PTXFORGE_TEST_NCCL=1, a GPU and libnccl");
        return;
    }
    let ranks: usize = std::env::var("PTXFORGE_TEST_NCCL_RANKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let o = launch(
        Command::new(BIN),
        1,
        ranks,
        &["collectives", "--count", "4096"],
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for r in 0..ranks {
        assert!(t.contains(&format!("rank {r}: collectives OK")), "{t}");
    }
}

/// The sorted `hash` lines of a run.
fn hashes(o: &Output) -> Vec<String> {
    let mut v: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_once("hash ").map(|(_, h)| format!("hash {h}")))
        .collect();
    v.sort();
    v
}

/// EP dispatch (BF16, FP8) + combine with the inter-node legs over the NCCL engine (one process per node,
/// 1 and 2 GPUs per node) is bit-identical to the single-process in-process transport.
#[test]
fn ep_dispatch_combine_over_nccl_is_bit_identical_to_in_process() {
    let Some(f) = Fake::new("ep") else { return };
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64;
    let seed = seed.to_string();
    for gpn in ["1", "2"] {
        let args = ["ep", "--gpus-per-node", gpn, "--seed", &seed];
        let one = Command::new(BIN)
            .args(args)
            .arg("--single")
            .output()
            .expect("run netnccl-check ep --single");
        assert!(one.status.success(), "{}", text(&one));
        let multi = launch(f.command(), 2, 1, &args);
        assert!(multi.status.success(), "{}", text(&multi));
        let (a, b) = (hashes(&one), hashes(&multi));
        assert_eq!(
            a.len(),
            2 * 5 * gpn.parse::<usize>().expect("gpn"),
            "{}",
            text(&one)
        );
        assert_eq!(
            a,
            b,
            "seed {seed}, {gpn} GPU(s) per node:\n{}",
            text(&multi)
        );
    }
}

/// A rank that dies after joining makes the others' next collective fail with an NCCL remote
/// error naming it (the fake sees the closed connection), not hang.
#[test]
fn a_dead_rank_is_an_nccl_remote_error() {
    let Some(f) = Fake::new("dead") else { return };
    let t0 = std::time::Instant::now();
    let o = launch(
        f.command(),
        2,
        1,
        &["collectives", "--count", "8", "--die-rank", "1"],
    );
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(
        t.contains("ncclAllReduce failed with ncclResult_t 6"),
        "{t}"
    );
    assert!(t.contains("receiving from rank 1"), "{t}");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(25),
        "took {:?}",
        t0.elapsed()
    );
}

/// `netnccl-check fault ARGS` as 2 nodes x 1 process (job `tag`, the launcher stopping the
/// others 5 s after the first failure); returns the output and how long the job took, after
/// checking that no process and no shared-memory segment of the job is left.
fn fault(f: &Fake, tag: &str, args: &[&str]) -> (Output, std::time::Duration) {
    let job = format!("ncclfault_{tag}_{}", std::process::id());
    let t0 = std::time::Instant::now();
    let o = f
        .command()
        .args([
            "launch",
            "--nodes",
            "2",
            "--procs-per-node",
            "1",
            "--timeout",
            "5",
        ])
        .args(["--kill-grace", "1", "--job-id", &job, "--", BIN, "fault"])
        .args(args)
        .output()
        .expect("run netnccl-check launch");
    let took = t0.elapsed();
    let procs = dist::launch::job_processes(&job);
    assert!(procs.is_empty(), "processes left: {procs:?}\n{}", text(&o));
    let segs = dist::shm::job_segments(&job);
    assert!(segs.is_empty(), "segments left: {segs:?}");
    (o, took)
}

/// The survivor (rank 0) stopped by itself with the error `want` (not the launcher's SIGTERM),
/// well within the launcher's 5 s grace.
fn survivor_failed(o: &Output, took: std::time::Duration, want: &[&str]) {
    let t = text(o);
    assert!(!o.status.success(), "{t}");
    let line = t
        .lines()
        .find(|l| l.starts_with("[rank 0] netnccl-check: error: rank 0: stopped after"))
        .unwrap_or_else(|| panic!("no error line of the survivor in\n{t}"));
    for w in want {
        assert!(line.contains(w), "no `{w}` in `{line}`");
    }
    assert!(line.contains("communicator aborted"), "{line}");
    assert!(
        !t.contains("SIGTERM"),
        "the survivor had to be stopped:\n{t}"
    );
    assert!(
        took < std::time::Duration::from_secs(5),
        "took {took:?}:\n{t}"
    );
}

/// Rank 1 SIGKILLs itself while both run all-reduces back to back: rank 0's all-reduce meets
/// the closed connection as NCCL's asynchronous error, aborts the communicator and fails
/// naming the operation and rank 1, within a few seconds; nothing of the job is left.
#[test]
fn a_rank_killed_mid_all_reduce_stops_the_survivor() {
    let Some(f) = Fake::new("killar") else { return };
    let (o, took) = fault(&f, "ar", &["--op", "all-reduce", "--kind", "kill"]);
    survivor_failed(
        &o,
        took,
        &["NCCL all_reduce failed (peer rank 1)", "ncclResult_t 6"],
    );
    assert!(
        text(&o).contains("rank 1 was killed by signal 9"),
        "{}",
        text(&o)
    );
}

/// The same with the NCCL engine's rounds in flight: the engine's progress thread fails, and
/// the next `send`/`poll` reports the engine round and rank 1.
#[test]
fn a_rank_killed_mid_engine_round_stops_the_survivor() {
    let Some(f) = Fake::new("killeng") else {
        return;
    };
    let (o, took) = fault(&f, "eng", &["--op", "engine", "--kind", "kill"]);
    survivor_failed(&o, took, &["NCCL engine round failed (peer rank 1)"]);
}

/// Rank 1 stops making NCCL calls without dying: rank 0's all-reduce never completes, its
/// 1 s communicator timeout aborts the communicator (which interrupts the blocked receive)
/// and it fails naming the operation; the launcher then stops rank 1.
#[test]
fn a_hung_rank_times_out_and_aborts_the_communicator() {
    let Some(f) = Fake::new("hang") else { return };
    let args = [
        "--op",
        "all-reduce",
        "--kind",
        "hang",
        "--nccl-timeout",
        "1",
    ];
    let t0 = std::time::Instant::now();
    let (o, _) = fault(&f, "hang", &args);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    let line = t
        .lines()
        .find(|l| l.starts_with("[rank 0] netnccl-check: error: rank 0: stopped after"))
        .unwrap_or_else(|| panic!("no error line of the survivor in\n{t}"));
    assert!(
        line.contains("NCCL all_reduce failed: ncclAllReduce did not complete within 1s"),
        "{line}"
    );
    assert!(line.contains("communicator aborted"), "{line}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(15), "{t}");
}

/// The fault path of one GPU, as scripts/gpu-check.sh runs it on the real NCCL: a
/// non-blocking 1-rank communicator runs an all-reduce and is aborted, and a 2-rank
/// non-blocking init whose second rank never comes is aborted after the 2 s timeout (the
/// fake's own join timeout, 30 s, is far off: the abort must stop the join).
#[test]
fn one_gpu_abort_paths_on_the_fake() {
    let Some(f) = Fake::new("abort") else { return };
    let t0 = std::time::Instant::now();
    let o = f
        .command()
        .args(["abort", "--nccl-timeout", "2", "--expect", "aborted"])
        .output()
        .expect("run netnccl-check abort");
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("abort OK: 1-rank all-reduce + ncclCommAbort (non-blocking true)"),
        "{t}"
    );
    assert!(
        t.contains("NCCL init failed: ncclCommInitRankConfig did not complete within 2s"),
        "{t}"
    );
    assert!(t0.elapsed() < std::time::Duration::from_secs(10), "{t}");
}
