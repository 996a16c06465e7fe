//! Shared by the multi-process CLI tests (`mod leftovers;`): nothing of a job may outlive it.

use std::time::{Duration, Instant};

/// Asserts that no `/dev/shm` segment and no process of job `job` is left, giving processes
/// that are still exiting (the survivors of an `mpirun` job after `mpirun` returned) up to
/// 10 s; `context` (the job's output) goes into the failure message.
pub fn assert_nothing_left(job: &str, context: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let segments = dist::shm::job_segments(job);
        let processes = dist::launch::job_processes(job);
        if segments.is_empty() && processes.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "job {job} left segments {segments:?} and processes {processes:?}:\n{context}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
