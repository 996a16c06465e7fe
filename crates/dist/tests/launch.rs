//! Multi-process jobs: `ptxforge-dist launch` (the library behind `ptxforge launch`) runs the
//! selftest program as 2 nodes x 2 processes. Checked: all_gather across processes, a late
//! rank, a config mismatch on every rank, a rank SIGKILLed inside an operation (every other
//! rank stops within the timeout naming it and the operation; no process and no shared-memory
//! segment of the job remains), Ctrl-C and a SIGKILLed launcher (no orphans), bad input.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ptxforge-dist");

/// A unique job id per test (names its shm segments).
fn job(name: &str) -> String {
    format!("t{}_{name}", std::process::id())
}

/// What a finished launch left: status, output, the ranks' pids and the time it took.
struct Run {
    code: Option<i32>,
    out: String,
    err: String,
    pids: Vec<u32>,
    took: Duration,
}

fn launch_cmd(job: &str, extra: &[&str], selftest: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args([
        "launch",
        "--nodes",
        "2",
        "--procs-per-node",
        "2",
        "--job-id",
        job,
    ])
    .args(extra)
    .args(["--", BIN, "selftest"])
    .args(selftest)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c
}

/// Waits for `child` at most `limit` (killing it then, so a hang fails instead of blocking).
fn finish(child: Child, t0: Instant, limit: Duration) -> Run {
    // (a sleeping job's standard output is already being read by its readiness thread)
    let f = dist::testing::finish_within(child, t0, limit).unwrap();
    let (status, out, err) = (f.status, f.stdout, f.stderr);
    let pids = rank_pids(&err);
    Run {
        code: status.code(),
        out,
        err,
        pids,
        took: t0.elapsed(),
    }
}

fn run(job: &str, extra: &[&str], selftest: &[&str]) -> Run {
    let t0 = Instant::now();
    let child = launch_cmd(job, extra, selftest).spawn().unwrap();
    finish(child, t0, Duration::from_secs(40))
}

/// The ranks' pids from the launcher's `rank R pid P` lines.
fn rank_pids(err: &str) -> Vec<u32> {
    err.lines()
        .filter_map(|l| l.strip_prefix("ptxforge launch: rank "))
        .filter_map(|l| l.split_once(" pid "))
        .filter_map(|(_, p)| p.trim().parse().ok())
        .collect()
}

/// No process of the job remains: every rank pid is gone (or reused by something else).
fn assert_no_ranks_left(pids: &[u32]) {
    assert_eq!(pids.len(), 4, "expected 4 rank pids");
    for p in pids {
        let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains("selftest"),
            "rank pid {p} is still running"
        );
    }
}

fn assert_no_segments(job: &str) {
    let left = dist::shm::job_segments(job);
    assert!(left.is_empty(), "segments left: {left:?}");
}

#[test]
fn all_gather_across_2x2_processes_with_a_late_rank() {
    let j = job("ok");
    let r = run(&j, &[], &["--delay", "3:1", "--shm", "--rounds", "3"]);
    assert_eq!(r.code, Some(0), "{}\n{}", r.out, r.err);
    for rank in 0..4 {
        let node = rank / 2;
        assert!(
            r.out.contains(&format!(
                "[rank {rank}] rank {rank} (node {node}, local {}): all_gather ok over 3 rounds",
                rank % 2
            )),
            "{}",
            r.out
        );
        assert!(
            r.out.contains(&format!("[rank {rank}] rank {rank}: ok")),
            "{}",
            r.out
        );
    }
    assert!(r.out.contains("[rank 3] rank 3: starting 1 s late"));
    assert!(r.took >= Duration::from_secs(1));
    assert!(
        r.err.contains("removed 4 shared-memory segment(s)"),
        "{}",
        r.err
    );
    assert_no_segments(&j);
    assert_no_ranks_left(&r.pids);
}

#[test]
fn mismatched_config_is_detected_on_every_rank() {
    let r = run(&job("cfg"), &["--timeout", "3"], &["--mismatch-rank", "2"]);
    assert_ne!(r.code, Some(0));
    for rank in 0..4 {
        let line = format!(
            "[rank {rank}] ptxforge-dist: rank {rank}: error: configuration differs between ranks: rank 2 has `config.hidden` = 128 where rank 0 has 64"
        );
        assert!(r.err.contains(&line), "rank {rank}: {}", r.err);
    }
    assert!(!r.err.contains("died"), "{}", r.err);
    assert_no_ranks_left(&r.pids);
}

/// Rank `die` kills itself (SIGKILL) after announcing `op`; the others sleep (so only their
/// watchdogs can notice) or wait in a barrier.
fn killed_rank(die: usize, op: &str, sleep: bool) {
    let j = job(&format!("kill{die}{sleep}"));
    let d = die.to_string();
    let mut args = vec!["--die-rank", &d, "--op", op, "--shm"];
    if sleep {
        args.extend(["--sleep", "30"]);
    }
    let r = run(&j, &["--timeout", "3"], &args);
    assert_eq!(r.code, Some(1), "{}", r.err);
    assert!(r.took < Duration::from_secs(12), "took {:?}", r.took);
    let named = format!("rank {die} died during `{op}`");
    for rank in (0..4).filter(|&x| x != die) {
        let ok = r
            .err
            .lines()
            .any(|l| l.starts_with(&format!("[rank {rank}] ")) && l.contains(&named));
        assert!(ok, "rank {rank} did not report `{named}`:\n{}", r.err);
        assert!(
            r.err.contains(&format!("rank {rank} exited with status 1")),
            "{}",
            r.err
        );
    }
    let fail = format!(
        "error: rank {die} (node {}) was killed by signal 9 (SIGKILL)",
        die / 2
    );
    assert!(r.err.contains(&fail), "{}", r.err);
    assert_no_ranks_left(&r.pids);
    assert_no_segments(&j);
}

#[test]
fn a_sigkilled_rank_stops_every_other_rank_naming_it() {
    killed_rank(2, "dispatch", true);
}

#[test]
fn a_sigkilled_store_rank_stops_the_others_blocked_in_a_barrier() {
    killed_rank(0, "combine", false);
}

/// Starts a job whose ranks sleep 30 s after bootstrap; returns it once every rank is ready.
fn sleeping_job(j: &str, extra: &[&str]) -> (Child, Vec<u32>) {
    let mut child = launch_cmd(j, extra, &["--sleep", "30", "--shm"])
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut ready = 0;
    while ready < 4 {
        let l = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("ranks not ready");
        ready += l.contains("all_gather ok") as usize;
    }
    let pids: Vec<u32> = (0..4).map(|r| child_pid_of_rank(child.id(), r)).collect();
    (child, pids)
}

/// The pid of the launcher's child that is rank `r` (from /proc: its RANK variable).
fn child_pid_of_rank(launcher: u32, r: usize) -> u32 {
    let want = format!("RANK={r}");
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().nth(1));
        if ppid != Some(&launcher.to_string()) {
            continue;
        }
        let envs = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if envs.split(|&b| b == 0).any(|v| v == want.as_bytes()) {
            return pid;
        }
    }
    panic!("no child of {launcher} with {want}");
}

fn wait_gone(pids: &[u32], limit: Duration) {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if pids
            .iter()
            .all(|p| !Path::new(&format!("/proc/{p}")).exists())
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_no_ranks_left(pids);
}

#[test]
fn ctrl_c_stops_every_rank() {
    let j = job("int");
    let (child, pids) = sleeping_job(&j, &["--kill-grace", "1"]);
    let t0 = Instant::now();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let r = finish(child, t0, Duration::from_secs(10));
    assert_eq!(r.code, Some(1), "{}", r.err);
    assert!(
        r.err
            .contains("received SIGINT: forwarding it to every rank"),
        "{}",
        r.err
    );
    assert!(r.err.contains("error: interrupted by SIGINT"), "{}", r.err);
    assert!(r.took < Duration::from_secs(5));
    wait_gone(&pids, Duration::from_secs(2));
    assert_no_segments(&j);
}

/// A launcher killed by SIGKILL cannot forward anything: PR_SET_PDEATHSIG kills the ranks.
#[test]
fn a_sigkilled_launcher_leaves_no_orphans() {
    let j = job("orphan");
    let (mut child, pids) = sleeping_job(&j, &["--kill-grace", "1"]);
    child.kill().unwrap();
    child.wait().unwrap();
    wait_gone(&pids, Duration::from_secs(3));
    // nobody was left to clean up: the test removes the selftest's segments itself
    let (removed, _) = dist::shm::remove_job_segments(&j);
    assert_eq!(removed.len(), 4);
}

#[test]
fn bad_environment_values_are_named() {
    let out = Command::new(BIN)
        .arg("selftest")
        .env_clear()
        .envs([
            ("RANK", "5"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.contains("environment variable RANK=\"5\" is invalid: must be below WORLD_SIZE=4"),
        "{err}"
    );
}

#[test]
fn a_command_that_cannot_start_is_named() {
    let out = Command::new(BIN)
        .args(["launch", "--nodes", "1", "--procs-per-node", "2", "--"])
        .arg("/nonexistent/ptxforge-rank")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.contains("cannot start rank 0 (`/nonexistent/ptxforge-rank`)"),
        "{err}"
    );
}

/// A rank that hangs (SIGSTOP: its heartbeat stops, its socket stays open) is declared dead
/// after the peer timeout; the launcher then kills it.
#[test]
fn a_hung_rank_is_declared_dead_after_the_peer_timeout() {
    let j = job("hang");
    let (child, pids) = sleeping_job(&j, &["--timeout", "1", "--kill-grace", "1"]);
    let t0 = Instant::now();
    // SAFETY: kill(2) on a rank of our own job.
    unsafe { libc::kill(pids[1] as i32, libc::SIGSTOP) };
    let r = finish(child, t0, Duration::from_secs(20));
    assert_eq!(r.code, Some(1), "{}", r.err);
    for rank in [0, 2, 3] {
        let line = format!(
            "[rank {rank}] ptxforge: rank {rank} (node {}): error: rank 1 died during `dispatch`",
            rank / 2
        );
        assert!(r.err.contains(&line), "{line}\n{}", r.err);
    }
    assert!(
        r.err.contains("rank 1 was killed by signal 9 (SIGKILL)"),
        "{}",
        r.err
    );
    assert!(r.took < Duration::from_secs(10), "took {:?}", r.took);
    wait_gone(&pids, Duration::from_secs(2));
    assert_no_segments(&j);
}

/// Under Open MPI's `mpirun` the ranks read `OMPI_COMM_WORLD_*` (this machine is one node:
/// LOCAL_WORLD_SIZE 4) and derive the job id from MASTER_ADDR:MASTER_PORT. Skipped, saying
/// so, where Open MPI is not installed.
#[test]
fn ranks_bootstrap_under_mpirun() {
    if Command::new("mpirun").arg("--version").output().is_err() {
        eprintln!("mpirun not found: skipping the Open MPI bootstrap test");
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
        .args(["-x", "MASTER_PORT", BIN, "selftest", "--shm"])
        .env("MASTER_PORT", port.to_string())
        .output()
        .unwrap();
    let job = format!("m127_0_0_1_{port}");
    let (removed, _) = dist::shm::remove_job_segments(&job);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for r in 0..4 {
        let line = format!("rank {r} (node 0, local {r}): all_gather ok over 2 rounds");
        assert!(text.contains(&line), "{text}");
    }
    assert_eq!(removed.len(), 4, "segments of job {job}");
}

#[test]
fn no_prefix_passes_the_output_through() {
    let out = Command::new(BIN)
        .args([
            "launch",
            "--nodes",
            "1",
            "--procs-per-node",
            "2",
            "--no-prefix",
        ])
        .args(["--", BIN, "selftest", "--rounds", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.lines().any(|l| l == "rank 1: ok"), "{text}");
    assert!(!text.contains("[rank"), "{text}");
}
