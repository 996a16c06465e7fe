//! The process layer's test program (`ptxforge dist-selftest`, `ptxforge-dist selftest`), run
//! as every rank of a launched job: bootstrap (optionally late, optionally with a differing
//! config), check `all_gather` and `set`/`wait` against the values every rank computes alike,
//! barrier, and on request create a shared-memory segment of the job, sleep in an operation,
//! or die by SIGKILL inside one. It prints `rank R: ok` at a clean end.

use crate::error::{DistError, Result};
use crate::group::{Bootstrap, Group};
use crate::shm;
use std::io::Write;
use std::time::Duration;

/// `selftest` options.
#[derive(clap::Args, Debug, Clone)]
pub struct SelftestArgs {
    /// Ranks that start late, with their delay before bootstrap: `RANK:SECONDS` (repeatable).
    #[arg(long, value_parser = parse_delay)]
    pub delay: Vec<(usize, f64)>,
    /// Rounds of all_gather + set/wait + barrier.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// This rank contributes a config whose `hidden` differs from the others'.
    #[arg(long)]
    pub mismatch_rank: Option<usize>,
    /// Create the segment /dev/shm/ptxforge-{job}-selftest-r{RANK} after bootstrap.
    #[arg(long)]
    pub shm: bool,
    /// After the rounds every rank announces OP (`--op`); this rank then kills itself with
    /// SIGKILL while the others wait for it in a barrier.
    #[arg(long)]
    pub die_rank: Option<usize>,
    /// The operation announced before the death or the sleep.
    #[arg(long, default_value = "dispatch")]
    pub op: String,
    /// Seconds every rank sleeps inside OP after the rounds (for interrupt tests).
    #[arg(long)]
    pub sleep: Option<f64>,
}

fn parse_delay(s: &str) -> std::result::Result<(usize, f64), String> {
    let (r, t) = s
        .split_once(':')
        .ok_or_else(|| format!("`{s}` is not RANK:SECONDS"))?;
    let r = r.parse().map_err(|_| format!("`{r}` is not a rank"))?;
    let t: f64 = t.parse().map_err(|_| format!("`{t}` is not seconds"))?;
    if !(0.0..=600.0).contains(&t) {
        return Err(format!("delay `{t}` must be 0 to 600 seconds"));
    }
    Ok((r, t))
}

fn say(s: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{s}");
}

/// What rank `r` contributes in round `round`: length and bytes depend on both.
pub fn payload(r: usize, round: usize) -> Vec<u8> {
    (0..3 + r + round)
        .map(|i| (r * 31 + round * 7 + i * 13) as u8)
        .collect()
}

/// Runs the test program as this process's rank.
pub fn run(a: SelftestArgs) -> Result<()> {
    let boot = Bootstrap::from_env()?;
    let env = boot.env().clone();
    if let Some((_, t)) = a.delay.iter().find(|(r, _)| *r == env.rank) {
        say(&format!("rank {}: starting {t} s late", env.rank));
        std::thread::sleep(Duration::from_secs_f64(*t));
    }
    let hidden = if a.mismatch_rank == Some(env.rank) {
        128
    } else {
        64
    };
    let config = serde_json::json!({ "hidden": hidden, "experts": 8, "world": env.world_size });
    let job = env.job_id.clone();
    let g = boot.config(&config)?.on_peer_death(move |_| {
        shm::remove_job_segments(&job);
    });
    let g = g.connect()?;
    if a.shm {
        let p = std::path::Path::new(shm::SHM_DIR).join(format!(
            "{}selftest-r{}",
            shm::segment_prefix(g.job_id()),
            g.rank()
        ));
        std::fs::write(&p, payload(g.rank(), 0))?;
    }
    for round in 0..a.rounds {
        check_round(&g, round)?;
    }
    say(&format!(
        "rank {} (node {}, local {}): all_gather ok over {} rounds",
        g.rank(),
        g.node(),
        g.local_rank(),
        a.rounds
    ));
    in_op(&g, &a)?;
    let r = g.rank();
    g.finish()?;
    say(&format!("rank {r}: ok"));
    Ok(())
}

/// One all_gather, one set/wait with the next rank, one barrier; results checked.
fn check_round(g: &Group, round: usize) -> Result<()> {
    let w = g.world_size();
    let got = g.all_gather(&payload(g.rank(), round))?;
    for (r, v) in got.iter().enumerate() {
        if *v != payload(r, round) {
            return Err(DistError::Protocol(format!(
                "all_gather round {round}: rank {r}'s bytes are {v:?}, expected {:?}",
                payload(r, round)
            )));
        }
    }
    g.set(
        &format!("k{round}/{}", g.rank()),
        &payload(g.rank(), round + 1),
    )?;
    let next = (g.rank() + 1) % w;
    let v = g.wait(&format!("k{round}/{next}"), Duration::from_secs(30))?;
    if v != payload(next, round + 1) {
        return Err(DistError::Protocol(format!(
            "wait round {round}: rank {next}'s value is {v:?}"
        )));
    }
    g.barrier("round")
}

/// The announced operation: die in it, sleep in it, or pass through it.
fn in_op(g: &Group, a: &SelftestArgs) -> Result<()> {
    if a.die_rank.is_none() && a.sleep.is_none() {
        return Ok(());
    }
    g.set_op(&a.op)?;
    g.barrier("op-announced")?;
    if a.die_rank == Some(g.rank()) {
        say(&format!("rank {}: dying (SIGKILL) in `{}`", g.rank(), a.op));
        // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
    if let Some(s) = a.sleep {
        std::thread::sleep(Duration::from_secs_f64(s.clamp(0.0, 600.0)));
    }
    g.barrier(&a.op)
}
