//! Support for the tests of multi-process programs (this crate's, `ep`'s, the CLI's): a free
//! port, the environment of a rank of a one-node job, and a child process waited for with a
//! deadline (killed then, so a hung job fails its test instead of blocking it).

use crate::env::DistEnv;
use crate::error::Result;
use std::io::Read;
use std::process::{Child, ExitStatus};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use crate::launch::free_port;

/// Rank `rank` of a one-node job of `world` ranks whose store is `127.0.0.1:port`, named `job`
/// (timeouts from the process environment or the defaults; `Bootstrap` sets others).
pub fn local_env(rank: usize, world: usize, port: u16, job: &str) -> Result<DistEnv> {
    DistEnv::from_vars(
        [
            ("RANK", rank.to_string()),
            ("WORLD_SIZE", world.to_string()),
            ("LOCAL_RANK", rank.to_string()),
            ("LOCAL_WORLD_SIZE", world.to_string()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.to_string()),
            ("PTXFORGE_JOB_ID", job.into()),
        ]
        .map(|(k, v)| (k.to_string(), v)),
    )
}

/// What a finished child printed.
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Reads a pipe to its end on a thread (a full pipe must never stall the child).
pub fn drain(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// Waits for `child` (its piped stdout/stderr read meanwhile) until `limit` after `t0`; past
/// it the child is killed and the error says so with what it had printed.
pub fn finish_within(
    mut child: Child,
    t0: Instant,
    limit: Duration,
) -> std::result::Result<Finished, String> {
    let out = child.stdout.take().map(drain);
    let err = child.stderr.take().map(drain);
    let text = |h: Option<JoinHandle<String>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if t0.elapsed() <= limit => std::thread::sleep(Duration::from_millis(20)),
            waited => {
                let _ = child.kill();
                let _ = child.wait();
                let why = match waited {
                    Err(e) => format!("waiting for it failed: {e}"),
                    _ => format!("still running after {limit:?}: killed"),
                };
                return Err(format!("{why}\n{}\n{}", text(out), text(err)));
            }
        }
    };
    Ok(Finished {
        status,
        stdout: text(out),
        stderr: text(err),
    })
}
