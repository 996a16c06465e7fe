//! Faults of a multi-process verb (`ptxforge moe` under `ptxforge launch`, torchrun or
//! `mpirun`). A dead peer is the `dist` watchdog's: every other rank exits non-zero naming the
//! dead rank and the operation it announced, after `procs::join`'s hook removed the job's
//! segments. What is left here is a stop from outside: `mpirun` SIGTERMs (then SIGKILLs) the
//! others when a process dies, the launchers forward Ctrl-C, and a process that exits by a
//! signal never unlinks its emulator segments (`/dev/shm/ptxforge-{job}-p{pid}-{n}`), nor does
//! a SIGKILLed one. [`clean_on_termination`] makes every process, on SIGTERM/SIGINT/SIGHUP,
//! remove the segments of *every process of this job* (their pids are all-gathered at start, so
//! another job's segments with the same job id are never touched) before it exits.
//!
//! [`DieIn`] is the fault-injection hook of the tests: `PTXFORGE_TEST_DIE=RANK:PHASE` makes the
//! process of group rank RANK SIGKILL itself 20 ms after a progress phase whose name contains
//! PHASE starts (e.g. `|| dispatch`: the shared expert's phase, run while the dispatch is in
//! flight).
use anyhow::{bail, Context};
use model::moe::{Progress, ProgressPhase};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

static TERM: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_term(sig: libc::c_int) {
    // async-signal-safe: only an atomic store; the watcher thread does the work
    TERM.store(sig, Ordering::SeqCst);
}

/// Installs the handlers and the watcher thread (see the module docs). `pids`: every process
/// of the job.
pub fn clean_on_termination(job: String, pids: Vec<u64>, me: usize) -> anyhow::Result<()> {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction with a handler that only stores to an atomic is valid;
        // the pointers passed live for the call.
        let r = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_term as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if r != 0 {
            bail!(
                "installing the handler of signal {sig}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    std::thread::Builder::new()
        .name("moe-term".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_millis(5));
            let sig = TERM.load(Ordering::SeqCst);
            if sig != 0 {
                let n = remove_segments(&job, &pids);
                eprintln!(
                    "ptxforge: rank {me}: stopped by signal {sig}; removed {n} shared-memory segment(s) of the job"
                );
                // SAFETY: _exit(2) ends the process without running atexit handlers (an MPI
                // library's could block on peers that are gone); nothing is borrowed.
                unsafe { libc::_exit(128 + sig) };
            }
        })
        .context("spawning the termination watcher")?;
    Ok(())
}

/// Removes `/dev/shm/ptxforge-{job}-p{pid}-*` of every pid; returns how many.
fn remove_segments(job: &str, pids: &[u64]) -> usize {
    let pre: Vec<String> = pids
        .iter()
        .map(|p| format!("{}p{p}-", dist::shm::segment_prefix(job)))
        .collect();
    dist::shm::job_segments(job)
        .iter()
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| pre.iter().any(|x| n.starts_with(x)))
        })
        .filter(|p| std::fs::remove_file(p).is_ok())
        .count()
}

/// A [`Progress`] that forwards to `inner` and may kill this process (module docs).
pub struct DieIn<'a> {
    pub inner: &'a dyn Progress,
    /// The phase-name fragment that kills this process (None: never).
    pub phase: Option<String>,
}

impl<'a> DieIn<'a> {
    /// Reads `PTXFORGE_TEST_DIE` for group rank `me`.
    pub fn from_env(inner: &'a dyn Progress, me: usize) -> anyhow::Result<DieIn<'a>> {
        let phase = match std::env::var("PTXFORGE_TEST_DIE") {
            Err(_) => None,
            Ok(v) => {
                let (r, p) = v
                    .split_once(':')
                    .with_context(|| format!("PTXFORGE_TEST_DIE={v:?}: want RANK:PHASE"))?;
                let r: usize = r
                    .parse()
                    .with_context(|| format!("PTXFORGE_TEST_DIE={v:?}: bad rank"))?;
                (r == me).then(|| p.to_string())
            }
        };
        Ok(DieIn { inner, phase })
    }
}

impl Progress for DieIn<'_> {
    fn phase(&self, name: &str, units: usize) -> Box<dyn ProgressPhase + '_> {
        if self.phase.as_deref().is_some_and(|p| name.contains(p)) {
            eprintln!("ptxforge: test hook: SIGKILL in 20 ms (phase `{name}`)");
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                // SAFETY: kill(2) on our own pid; no memory is involved.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            });
        }
        self.inner.phase(name, units)
    }
    fn note(&self, name: &str, secs: f64) {
        self.inner.note(name, secs)
    }
}
