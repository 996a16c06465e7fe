//! The local launcher behind `ptxforge launch`: starts `nodes x procs_per_node` processes of
//! one command on this machine with the rank environment ([`crate::env`]), each "node" a
//! group of `procs_per_node` processes, and supervises them:
//!
//! - SIGINT, SIGTERM and SIGHUP sent to the launcher are forwarded to every rank;
//! - when a rank exits non-zero or by a signal, the others get `stop_after` to stop by
//!   themselves (their watchdogs report the dead peer), then SIGTERM, then SIGKILL after
//!   `kill_grace`; the launcher fails naming the first rank that failed;
//! - every child has `PR_SET_PDEATHSIG = SIGKILL`, so even a SIGKILLed launcher leaves no
//!   orphans (the death signal follows the *thread* that spawned the child: the children
//!   are spawned and supervised from the calling thread, which lives until they are reaped);
//! - at the end the job's shared-memory segments (`/dev/shm/ptxforge-{job}-*`) are removed;
//! - each line a rank prints is prefixed `[rank R] ` (unless `prefix` is off).

use crate::error::{DistError, Result};
use crate::shm;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most ranks one launcher starts.
pub const MAX_RANKS: usize = 1024;
/// How often the launcher polls its children and pending signals.
const POLL: Duration = Duration::from_millis(10);

/// `ptxforge launch` options.
#[derive(clap::Args, Debug, Clone)]
pub struct LaunchArgs {
    /// Number of "nodes" (groups of local processes).
    #[arg(long, default_value_t = 1)]
    pub nodes: usize,
    /// Processes (ranks) per node.
    #[arg(long, default_value_t = 1)]
    pub procs_per_node: usize,
    /// MASTER_PORT of the job (default: a free port).
    #[arg(long)]
    pub master_port: Option<u16>,
    /// Peer timeout in seconds, passed to the ranks as PTXFORGE_PEER_TIMEOUT; also how long
    /// the others get to stop by themselves after a rank fails (default 5 s).
    #[arg(long, value_parser = parse_seconds)]
    pub timeout: Option<Duration>,
    /// Seconds between SIGTERM and SIGKILL when stopping ranks.
    #[arg(long, default_value = "3", value_parser = parse_seconds)]
    pub kill_grace: Duration,
    /// The job id (PTXFORGE_JOB_ID; names its shared-memory segments). Default: derived from
    /// the launcher's pid and the port.
    #[arg(long)]
    pub job_id: Option<String>,
    /// Do not prefix the ranks' output lines with `[rank R]`.
    #[arg(long)]
    pub no_prefix: bool,
    /// The command each rank runs, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

/// Seconds as a positive finite number.
pub fn parse_seconds(s: &str) -> std::result::Result<Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !v.is_finite() || v <= 0.0 || v > 1e6 {
        return Err(format!("`{s}` must be above 0 and at most 1e6 seconds"));
    }
    Ok(Duration::from_secs_f64(v))
}

/// A validated launch.
#[derive(Debug, Clone)]
struct Plan {
    nodes: usize,
    ppn: usize,
    port: u16,
    job: String,
    stop_after: Duration,
    a: LaunchArgs,
}

impl Plan {
    fn new(a: LaunchArgs) -> Result<Plan> {
        let bad = |field, reason: &str| DistError::BadOption {
            field,
            reason: reason.to_string(),
        };
        if a.nodes == 0 {
            return Err(bad("--nodes", "must be at least 1"));
        }
        if a.procs_per_node == 0 {
            return Err(bad("--procs-per-node", "must be at least 1"));
        }
        if a.nodes.saturating_mul(a.procs_per_node) > MAX_RANKS {
            return Err(bad("--nodes x --procs-per-node", "more than 1024 ranks"));
        }
        if a.cmd.first().is_none_or(|c| c.is_empty()) {
            return Err(bad("CMD", "no command after `--`"));
        }
        let port = match a.master_port {
            Some(0) => return Err(bad("--master-port", "must be 1..=65535")),
            Some(p) => p,
            None => free_port()?,
        };
        let job = a
            .job_id
            .clone()
            .unwrap_or_else(|| format!("l{}_{port}", std::process::id()));
        if !crate::env::valid_job_id(&job) {
            return Err(bad(
                "--job-id",
                "must be 1 to 40 of A-Z, a-z, 0-9, `_`, `.`",
            ));
        }
        Ok(Plan {
            nodes: a.nodes,
            ppn: a.procs_per_node,
            port,
            job,
            stop_after: a.timeout.unwrap_or(Duration::from_secs(5)),
            a,
        })
    }

    fn world(&self) -> usize {
        self.nodes * self.ppn
    }
}

/// A port nobody listens on now (the OS's choice for an ephemeral bind).
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(l.local_addr()?.port())
}

/// The signal the launcher received and has not yet forwarded (0: none).
static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // only an atomic store: async-signal-safe
    PENDING.store(sig, Ordering::SeqCst);
}

const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Installs the forwarding handlers; returns the previous dispositions.
fn install_handlers() -> Result<Vec<libc::sigaction>> {
    let mut old = Vec::new();
    for sig in FORWARDED {
        // SAFETY: `sa` is fully initialised (zeroed, then handler and empty mask set), the
        // handler only stores to an atomic, and `prev` is a valid out-pointer.
        let r = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut prev: libc::sigaction = std::mem::zeroed();
            let r = libc::sigaction(sig, &sa, &mut prev);
            old.push(prev);
            r
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
    }
    Ok(old)
}

fn restore_handlers(old: &[libc::sigaction]) {
    for (sig, prev) in FORWARDED.iter().zip(old) {
        // SAFETY: `prev` was filled by sigaction for this signal.
        unsafe {
            libc::sigaction(*sig, prev, std::ptr::null_mut());
        }
    }
}

/// Sends `sig` to a child that has not been reaped (so its pid cannot have been reused).
fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our unreaped child.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// Set while a launch runs: the signal handlers and [`PENDING`] are process-wide.
static RUNNING: AtomicBool = AtomicBool::new(false);

/// Runs the job; `Ok` when every rank exited with status 0. One launch at a time per process.
pub fn run(a: LaunchArgs) -> Result<()> {
    let plan = Plan::new(a)?;
    if RUNNING.swap(true, Ordering::SeqCst) {
        return Err(DistError::BadOption {
            field: "launch",
            reason: "another launch is running in this process".into(),
        });
    }
    let result = install_handlers().and_then(|old| {
        PENDING.store(0, Ordering::SeqCst);
        let r = run_plan(&plan);
        restore_handlers(&old);
        r
    });
    RUNNING.store(false, Ordering::SeqCst);
    let (removed, failed) = shm::remove_job_segments(&plan.job);
    if !removed.is_empty() {
        note(&format!(
            "removed {} shared-memory segment(s) of job {}",
            removed.len(),
            plan.job
        ));
    }
    for (p, e) in failed {
        note(&format!("cannot remove {}: {e}", p.display()));
    }
    result
}

/// One line from the launcher on standard error.
fn note(s: &str) {
    let _ = writeln!(std::io::stderr().lock(), "ptxforge launch: {s}");
}

struct Rank {
    child: Child,
    status: Option<ExitStatus>,
    pumps: Vec<JoinHandle<()>>,
}

fn run_plan(plan: &Plan) -> Result<()> {
    note(&format!(
        "job {}: {} ranks ({} nodes x {}), master 127.0.0.1:{}",
        plan.job,
        plan.world(),
        plan.nodes,
        plan.ppn,
        plan.port
    ));
    let mut ranks = Vec::with_capacity(plan.world());
    for r in 0..plan.world() {
        match spawn(plan, r) {
            Ok(k) => {
                note(&format!("rank {r} pid {}", k.child.id()));
                ranks.push(k);
            }
            Err(e) => {
                stop_all(&mut ranks, plan.a.kill_grace);
                return Err(e);
            }
        }
    }
    let outcome = supervise(plan, &mut ranks);
    for k in &mut ranks {
        for p in k.pumps.drain(..) {
            let _ = p.join();
        }
    }
    outcome
}

fn spawn(plan: &Plan, r: usize) -> Result<Rank> {
    let mut c = Command::new(&plan.a.cmd[0]);
    c.args(&plan.a.cmd[1..])
        .env("RANK", r.to_string())
        .env("WORLD_SIZE", plan.world().to_string())
        .env("LOCAL_RANK", (r % plan.ppn).to_string())
        .env("LOCAL_WORLD_SIZE", plan.ppn.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", plan.port.to_string())
        .env("PTXFORGE_JOB_ID", &plan.job)
        .stdin(Stdio::null());
    if let Some(t) = plan.a.timeout {
        c.env("PTXFORGE_PEER_TIMEOUT", t.as_secs_f64().to_string());
    }
    if !plan.a.no_prefix {
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (prctl, getppid, _exit); it touches no Rust-managed memory.
    unsafe {
        c.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // the launcher died between fork and prctl: nobody will signal us
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let mut child = c.spawn().map_err(|source| DistError::Spawn {
        rank: r,
        cmd: plan.a.cmd.join(" "),
        source,
    })?;
    let mut pumps = Vec::new();
    if let Some(o) = child.stdout.take() {
        pumps.push(pump(o, r, false)?);
    }
    if let Some(e) = child.stderr.take() {
        pumps.push(pump(e, r, true)?);
    }
    Ok(Rank {
        child,
        status: None,
        pumps,
    })
}

/// Copies a child's output line by line with the `[rank R] ` prefix. Write errors are
/// ignored (the child must never block on a full pipe).
fn pump(src: impl Read + Send + 'static, r: usize, err: bool) -> Result<JoinHandle<()>> {
    let h = std::thread::Builder::new()
        .name(format!("launch-out-{r}"))
        .spawn(move || {
            let mut rd = BufReader::new(src);
            let mut line = Vec::new();
            let prefix = format!("[rank {r}] ");
            while matches!(rd.read_until(b'\n', &mut line), Ok(n) if n > 0) {
                if !line.ends_with(b"\n") {
                    line.push(b'\n');
                }
                let _ = if err {
                    let mut o = std::io::stderr().lock();
                    o.write_all(prefix.as_bytes())
                        .and_then(|_| o.write_all(&line))
                } else {
                    let mut o = std::io::stdout().lock();
                    o.write_all(prefix.as_bytes())
                        .and_then(|_| o.write_all(&line))
                        .and_then(|_| o.flush())
                };
                line.clear();
            }
        })?;
    Ok(h)
}

/// Pids of the live processes whose environment carries `PTXFORGE_JOB_ID={job}` (none may
/// outlive the job: tests check it after a run; empty when `/proc` cannot be read).
pub fn job_processes(job: &str) -> Vec<u32> {
    let tag = format!("PTXFORGE_JOB_ID={job}");
    let Ok(d) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    d.flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.path())))
        .filter(|(_, p)| {
            std::fs::read(p.join("environ"))
                .map(|env| env.split(|&b| b == 0).any(|v| v == tag.as_bytes()))
                .unwrap_or(false)
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// Names an exit status: `exited with status 3`, `was killed by signal 9 (SIGKILL)`.
pub fn describe(s: ExitStatus) -> String {
    if let Some(c) = s.code() {
        return format!("exited with status {c}");
    }
    let sig = s.signal().unwrap_or(0);
    let name = match sig {
        libc::SIGKILL => " (SIGKILL)",
        libc::SIGTERM => " (SIGTERM)",
        libc::SIGINT => " (SIGINT)",
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGABRT => " (SIGABRT)",
        libc::SIGBUS => " (SIGBUS)",
        libc::SIGHUP => " (SIGHUP)",
        _ => "",
    };
    format!("was killed by signal {sig}{name}")
}

/// What the supervisor is waiting for.
struct Deadlines {
    /// First failure (the job's error message).
    failure: Option<String>,
    term_at: Option<Instant>,
    kill_at: Option<Instant>,
    /// Ranks that failed after the first.
    also_failed: Vec<usize>,
}

fn supervise(plan: &Plan, ranks: &mut [Rank]) -> Result<()> {
    let mut d = Deadlines {
        failure: None,
        term_at: None,
        kill_at: None,
        also_failed: Vec::new(),
    };
    loop {
        // a signal first: with Ctrl-C in a terminal the ranks get SIGINT too, and the job's
        // error is the interrupt, not the ranks it killed
        let sig = PENDING.swap(0, Ordering::SeqCst);
        if sig != 0 {
            forward(ranks, sig, plan, &mut d);
        }
        reap(ranks, plan, &mut d);
        if ranks.iter().all(|k| k.status.is_some()) {
            break;
        }
        let now = Instant::now();
        if d.term_at.is_some_and(|t| now >= t) {
            note("stopping the remaining ranks (SIGTERM)");
            live(ranks).for_each(|k| signal(&k.child, libc::SIGTERM));
            d.term_at = None;
            d.kill_at = Some(now + plan.a.kill_grace);
        }
        if d.kill_at.is_some_and(|t| now >= t) {
            note("killing the remaining ranks (SIGKILL)");
            live(ranks).for_each(|k| signal(&k.child, libc::SIGKILL));
            d.kill_at = None;
        }
        std::thread::sleep(POLL);
    }
    let Some(mut f) = d.failure else {
        return Ok(());
    };
    if !d.also_failed.is_empty() {
        let r: Vec<String> = d.also_failed.iter().map(|r| r.to_string()).collect();
        f.push_str(&format!(" (then rank(s) {} failed too)", r.join(", ")));
    }
    Err(DistError::JobFailed(f))
}

fn live(ranks: &mut [Rank]) -> impl Iterator<Item = &mut Rank> {
    ranks.iter_mut().filter(|k| k.status.is_none())
}

/// Collects exited ranks; the first failure starts the stop sequence. Of the ranks that
/// failed in one pass, one killed by a signal is named first: the others most likely
/// exited because their watchdogs saw it die.
fn reap(ranks: &mut [Rank], plan: &Plan, d: &mut Deadlines) {
    let mut failed = Vec::new();
    for (r, k) in ranks.iter_mut().enumerate() {
        if k.status.is_some() {
            continue;
        }
        let s = match k.child.try_wait() {
            Ok(Some(s)) => s,
            Ok(None) => continue,
            Err(e) => {
                note(&format!("cannot wait for rank {r}: {e}; killing it"));
                let _ = k.child.kill();
                match k.child.wait() {
                    Ok(s) => s,
                    Err(_) => continue,
                }
            }
        };
        k.status = Some(s);
        if !s.success() {
            failed.push((r, s));
        }
    }
    failed.sort_by_key(|(r, s)| (s.signal().is_none(), *r));
    for (r, s) in failed {
        note(&format!("rank {r} {}", describe(s)));
        if d.failure.is_none() {
            d.failure = Some(format!(
                "rank {r} (node {}) {}; the job failed",
                r / plan.ppn,
                describe(s)
            ));
            d.term_at = Some(Instant::now() + plan.stop_after);
        } else {
            d.also_failed.push(r);
        }
    }
}

fn forward(ranks: &mut [Rank], sig: libc::c_int, plan: &Plan, d: &mut Deadlines) {
    let name = if sig == libc::SIGINT {
        "SIGINT"
    } else if sig == libc::SIGTERM {
        "SIGTERM"
    } else {
        "SIGHUP"
    };
    note(&format!("received {name}: forwarding it to every rank"));
    live(ranks).for_each(|k| signal(&k.child, sig));
    if d.failure.is_none() {
        d.failure = Some(format!("interrupted by {name}; every rank was stopped"));
    }
    d.term_at = None;
    d.kill_at = Some(Instant::now() + plan.a.kill_grace);
}

/// Stops the ranks started so far (a later rank could not be started).
fn stop_all(ranks: &mut [Rank], grace: Duration) {
    live(ranks).for_each(|k| signal(&k.child, libc::SIGTERM));
    let end = Instant::now() + grace;
    while Instant::now() < end
        && ranks
            .iter_mut()
            .any(|k| matches!(k.child.try_wait(), Ok(None)))
    {
        std::thread::sleep(POLL);
    }
    for k in ranks.iter_mut() {
        let _ = k.child.kill();
        let _ = k.child.wait();
        for p in k.pumps.drain(..) {
            let _ = p.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: LaunchArgs,
    }

    fn plan(args: &[&str]) -> Result<Plan> {
        let mut v = vec!["t"];
        v.extend_from_slice(args);
        Plan::new(
            T::try_parse_from(v)
                .map_err(|e| DistError::Protocol(e.to_string()))?
                .a,
        )
    }

    #[test]
    fn options_are_checked_naming_the_flag() {
        let p = plan(&["--nodes", "2", "--procs-per-node", "3", "--", "true"]).unwrap();
        assert_eq!((p.world(), p.port > 0), (6, true));
        let e = |a: &[&str]| plan(a).unwrap_err().to_string();
        assert!(e(&["--nodes", "0", "--", "true"]).contains("--nodes"));
        assert!(e(&["--procs-per-node", "0", "--", "true"]).contains("--procs-per-node"));
        assert!(e(&["--nodes", "2000", "--", "true"]).contains("1024"));
        assert!(e(&["--job-id", "a/b", "--", "true"]).contains("--job-id"));
        assert!(e(&["--master-port", "0", "--", "true"]).contains("--master-port"));
        assert!(e(&["--timeout", "-1", "--", "true"]).contains("-1"));
        assert!(plan(&["--nodes", "2"]).is_err());
    }

    #[test]
    fn statuses_are_named() {
        assert_eq!(
            describe(ExitStatus::from_raw(3 << 8)),
            "exited with status 3"
        );
        assert_eq!(
            describe(ExitStatus::from_raw(9)),
            "was killed by signal 9 (SIGKILL)"
        );
    }
}
