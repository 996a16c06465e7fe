//! The fault checks of `netnccl-check fault` (run as every rank of a 2-rank `dist` job whose
//! watchdog only reports, so what stops the survivor is NCCL's own error path): one rank,
//! the victim, dies by SIGKILL while both run collectives or NCCL engine rounds, or stops
//! taking part (hangs); the survivor must fail within its communicator timeout with
//! [`crate::NcclError::Aborted`] naming the operation and, for a dead peer, the victim.

use crate::check::Res;
use crate::{Comm, NcclEngine, ReduceOp};
use ep::engine::Engine;
use std::time::{Duration, Instant};

/// What runs when the victim dies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FaultOp {
    /// f32 all-reduces, back to back.
    AllReduce,
    /// NCCL engine rounds (small messages both ways).
    Engine,
}

/// How the victim fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FaultKind {
    /// SIGKILL from a thread of its own, whatever the main thread is doing then.
    Kill,
    /// Stops making NCCL calls (sleeps) while the survivor waits in a collective.
    Hang,
}

/// One fault check.
#[derive(Clone, Debug)]
pub struct FaultCfg {
    pub op: FaultOp,
    pub kind: FaultKind,
    pub victim: u32,
    /// When the victim fails, after the communicator is up.
    pub after: Duration,
    /// How long the survivor runs before it reports that nothing failed.
    pub limit: Duration,
}

/// Runs the check on this rank; the survivor returns the error it met, as `Err` (the test
/// reads the message), or `Err` saying no failure came within the limit.
pub fn run(comm: Comm, c: &FaultCfg) -> Res<String> {
    let me = comm.rank();
    if comm.nranks() != 2 || c.victim > 1 {
        return Err(format!(
            "the fault check runs on 2 ranks (victim 0 or 1), not {}",
            comm.nranks()
        )
        .into());
    }
    if me == c.victim && c.kind == FaultKind::Kill {
        kill_self_after(c.after)?;
    }
    let hang_at = (me == c.victim && c.kind == FaultKind::Hang).then(|| Instant::now() + c.after);
    let t0 = Instant::now();
    let (n, e) = match c.op {
        FaultOp::AllReduce => all_reduces(&comm, c.limit, hang_at),
        FaultOp::Engine => engine_rounds(comm, c.limit),
    };
    let what = match c.op {
        FaultOp::AllReduce => "all-reduces",
        FaultOp::Engine => "engine messages",
    };
    Err(format!(
        "rank {me}: stopped after {n} {what} in {:.2} s: {e}",
        t0.elapsed().as_secs_f64()
    )
    .into())
}

/// SIGKILLs this process after `after`, from a thread of its own.
fn kill_self_after(after: Duration) -> Res<()> {
    std::thread::Builder::new()
        .name("fault-kill".into())
        .spawn(move || {
            std::thread::sleep(after);
            // SAFETY: kill(2) on our own pid; no memory is involved.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        })?;
    Ok(())
}

/// All-reduces until one fails (returns how many completed and the error); at `hang_at` this
/// rank stops making calls instead.
fn all_reduces(comm: &Comm, limit: Duration, hang_at: Option<Instant>) -> (u64, String) {
    let d = comm.device().clone();
    let r = (|| -> Res<(u64, String)> {
        let x = d.upload(&vec![1.0f32 + comm.rank() as f32; 4096])?;
        let y = d.alloc::<f32>(4096)?;
        let (t0, mut n) = (Instant::now(), 0u64);
        while t0.elapsed() < limit {
            if hang_at.is_some_and(|t| Instant::now() >= t) {
                std::thread::sleep(limit);
                return Ok((n, "the hung rank woke up".into()));
            }
            if let Err(e) = comm.all_reduce(&x, &y, ReduceOp::Sum) {
                return Ok((n, e.to_string()));
            }
            n += 1;
        }
        Ok((n, format!("no failure within {limit:?}")))
    })();
    r.unwrap_or_else(|e| (0, format!("setting up: {e}")))
}

/// Sends a small message to the peer every millisecond and drains what arrives, until the
/// engine fails.
fn engine_rounds(comm: Comm, limit: Duration) -> (u64, String) {
    let peer = 1 - comm.rank();
    let engine = match NcclEngine::new(comm) {
        Ok(e) => e,
        Err(e) => return (0, e.to_string()),
    };
    let (t0, mut n) = (Instant::now(), 0u64);
    while t0.elapsed() < limit {
        let r = engine
            .blob(peer, n as u32, vec![7u8; 64])
            .and_then(|()| while_some(|| engine.poll()));
        if let Err(e) = r {
            return (n, e.to_string());
        }
        n += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    (n, format!("no failure within {limit:?}"))
}

fn while_some<T>(mut f: impl FnMut() -> ep::Result<Option<T>>) -> ep::Result<()> {
    while f()?.is_some() {}
    Ok(())
}

/// What `netnccl-check abort` must see when a rank never joins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum InitFailure {
    /// [`crate::NcclError::Aborted`] of `init` after the timeout (a non-blocking init, aborted).
    Aborted,
    /// [`crate::NcclError::Call`] of the init call: a blocking init (NCCL before 2.14) that
    /// gave up by itself.
    Call,
}

/// The fault path one GPU allows: a 1-rank communicator (non-blocking where NCCL has it)
/// runs an all-reduce (checked: the sum over one rank is the input) and is aborted; then a
/// 2-rank communicator whose second rank never joins must fail as `expect` says, within
/// `timeout` (plus slack). Returns the lines to print.
pub fn abort_paths(dev: &runtime::Device, timeout: Duration, expect: InitFailure) -> Res<String> {
    let comm = Comm::init_with(dev, &crate::UniqueId::new()?, (0, 1), timeout)?;
    let x: Vec<f32> = (0..1024).map(|i| i as f32 * 0.25 - 7.0).collect();
    let (s, r) = (dev.upload(&x)?, dev.alloc::<f32>(x.len())?);
    comm.all_reduce(&s, &r, ReduceOp::Sum)?;
    if r.to_vec()? != x {
        return Err("a 1-rank all-reduce sum differs from its input".into());
    }
    let nonblocking = comm.nonblocking();
    comm.abort()?;
    let t0 = Instant::now();
    let lost = Comm::init_with(dev, &crate::UniqueId::new()?, (0, 2), timeout);
    let took = t0.elapsed();
    let e = match lost {
        Ok(_) => return Err("a 2-rank communicator formed with one rank".into()),
        Err(e) => e,
    };
    let ok = match (expect, &e) {
        (InitFailure::Aborted, crate::NcclError::Aborted { op, .. }) => *op == "init",
        (InitFailure::Call, crate::NcclError::Call { .. }) => true,
        _ => false,
    };
    if !ok || took > timeout + Duration::from_secs(10) {
        return Err(
            format!("expected a {expect:?} failure of init, got after {took:?}: {e}").into(),
        );
    }
    Ok(format!(
        "abort OK: 1-rank all-reduce + ncclCommAbort (non-blocking {nonblocking}); missing rank \
         after {:.1} s: {e}",
        took.as_secs_f64()
    ))
}
