//! The job's shared-memory segments: every segment of job J is `/dev/shm/ptxforge-{J}-...`
//! (the naming dist-mem's emulator memory uses). The launcher removes them when the job ends,
//! and a rank's `on_peer_death` hook can remove them before it exits.

use std::path::PathBuf;

/// Where POSIX shared-memory objects live on Linux.
pub const SHM_DIR: &str = "/dev/shm";

/// The file-name prefix of job `job`'s segments.
pub fn segment_prefix(job: &str) -> String {
    format!("ptxforge-{job}-")
}

/// The job's segments present now (none when /dev/shm cannot be read).
pub fn job_segments(job: &str) -> Vec<PathBuf> {
    let prefix = segment_prefix(job);
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = dir
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// Removes the job's segments; returns those removed and the errors of those that could not be.
pub fn remove_job_segments(job: &str) -> (Vec<PathBuf>, Vec<(PathBuf, std::io::Error)>) {
    let mut removed = Vec::new();
    let mut failed = Vec::new();
    for p in job_segments(job) {
        match std::fs::remove_file(&p) {
            Ok(()) => removed.push(p),
            // another rank's hook got there first
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => failed.push((p, e)),
        }
    }
    (removed, failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_only_this_jobs_segments() {
        let job = format!("shmtest{}", std::process::id());
        let mine = PathBuf::from(SHM_DIR).join(format!("ptxforge-{job}-a"));
        let other = PathBuf::from(SHM_DIR).join(format!("ptxforge-{job}x-a"));
        if std::fs::write(&mine, b"x").is_err() {
            return; // no /dev/shm here: nothing to clean either
        }
        std::fs::write(&other, b"y").unwrap();
        assert_eq!(job_segments(&job), vec![mine.clone()]);
        let (removed, failed) = remove_job_segments(&job);
        assert_eq!((removed, failed.len()), (vec![mine.clone()], 0));
        assert!(!mine.exists() && other.exists());
        std::fs::remove_file(other).unwrap();
    }
}
