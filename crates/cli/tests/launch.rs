//! `ptxforge launch` runs `ptxforge dist-selftest` as 2 nodes x 2 processes (the CLI verbs are
//! thin callers of `dist`; crates/dist/tests has the fault tests): a clean run, and a rank
//! killed inside an operation failing the job with every other rank naming it.
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ptxforge");

fn launch(job: &str, selftest: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN)
        .args([
            "launch",
            "--nodes",
            "2",
            "--procs-per-node",
            "2",
            "--timeout",
            "3",
        ])
        .args(["--job-id", job, "--", BIN, "dist-selftest"])
        .args(selftest)
        .output()
        .expect("spawn ptxforge");
    let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), s(&out.stdout), s(&out.stderr))
}

#[test]
fn launch_runs_the_selftest_on_2x2_ranks() {
    let job = format!("cli{}", std::process::id());
    let (code, out, err) = launch(&job, &["--shm", "--delay", "1:0.5"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    for r in 0..4 {
        assert!(out.contains(&format!("[rank {r}] rank {r}: ok")), "{out}");
    }
    assert!(err.contains("removed 4 shared-memory segment(s)"), "{err}");
}

#[test]
fn launch_fails_naming_a_killed_rank_and_its_operation() {
    let job = format!("clik{}", std::process::id());
    let (code, _, err) = launch(&job, &["--die-rank", "3", "--op", "dispatch"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("ptxforge: error: rank 3 (node 1) was killed by signal 9 (SIGKILL)"),
        "{err}"
    );
    for r in 0..3 {
        let named = err.lines().any(|l| {
            l.starts_with(&format!("[rank {r}] ")) && l.contains("rank 3 died during `dispatch`")
        });
        assert!(named, "rank {r}:\n{err}");
    }
}

/// The launcher's job ids must fit the emulator's IPC handles (which store the id): the two
/// crates keep their own constant (dist depends on no workspace crate), so check they agree.
#[test]
fn job_id_limits_of_launcher_and_emulator_agree() {
    assert_eq!(dist::env::MAX_JOB_ID, emu::memory::shm::MAX_JOB_ID);
    assert!(dist::env::valid_job_id(&"j".repeat(dist::env::MAX_JOB_ID)));
    assert!(!dist::env::valid_job_id(
        &"j".repeat(dist::env::MAX_JOB_ID + 1)
    ));
}
