//! The process layer's test program (`ptxforge dist-selftest`, `ptxforge-dist selftest`), run
//! as every rank of a launched job: bootstrap (optionally late, optionally with a differing
//! config), check `all_gather` and `set`/`wait` against the values every rank computes alike,
//! barrier, and on request create a shared-memory segment of the job, sleep in an operation,
//! or die by SIGKILL inside one. It prints `rank R: ok` at a clean end. With `--mesh` it then
//! exchanges frames of every size class with every rank over a [`Mesh`] (contents and order
//! checked), and a `--die-rank` dies with the mesh open: the others must get
//! [`DistError::PeerLost`] naming it from the mesh (their watchdogs only report).

use crate::error::{DistError, Result};
use crate::group::{Bootstrap, Group};
use crate::mesh::Mesh;
use crate::shm;
use crate::watchdog::FaultAction;
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
    /// After the rounds, check a TCP mesh between the ranks (see the module docs).
    #[arg(long)]
    pub mesh: bool,
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
    let mut boot = boot.config(&config)?;
    if a.mesh {
        boot = boot.fault_action(FaultAction::Report);
    }
    let g = boot.on_peer_death(move |_| {
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
    if a.mesh {
        mesh_check(&g, a.die_rank)?;
    } else {
        in_op(&g, &a)?;
    }
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

/// The frame number `i` from rank `from` to rank `to`: sizes cycle through 0 bytes, small,
/// odd and about 1 MiB; the bytes follow from the shared `seed`.
pub fn mesh_frame(seed: u64, from: usize, to: usize, i: usize) -> Vec<u8> {
    const SIZES: [usize; 5] = [0, 1, 13, 4099, (1 << 20) + 7];
    let mut x = seed ^ ((from as u64) << 40 | (to as u64) << 20 | i as u64);
    (0..SIZES[i % SIZES.len()] + from)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Frames each rank sends to each rank (itself included) in the mesh check.
pub const MESH_FRAMES: usize = 12;

/// Every rank sends [`MESH_FRAMES`] frames to every rank and checks what it receives (bytes
/// and per-sender order); then the optional death with the mesh open.
fn mesh_check(g: &Group, die: Option<usize>) -> Result<()> {
    let drawn = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let seed = u64::from_le_bytes(
        g.all_gather(&drawn.to_le_bytes())?[0]
            .as_slice()
            .try_into()
            .map_err(|_| DistError::Protocol("seed of 8 bytes expected".into()))?,
    );
    let mesh = Mesh::connect(g)?;
    let (me, w) = (g.rank(), g.world_size());
    for i in 0..MESH_FRAMES {
        for to in 0..w {
            mesh.send(to, mesh_frame(seed, me, to, i))?;
        }
    }
    let mut next = vec![0usize; w];
    while next.iter().any(|&n| n < MESH_FRAMES) {
        let (from, b) = mesh
            .recv_timeout(Duration::from_secs(30))?
            .ok_or_else(|| DistError::Protocol(format!("mesh: missing frames {next:?}")))?;
        if next[from] >= MESH_FRAMES || b != mesh_frame(seed, from, me, next[from]) {
            return Err(DistError::Protocol(format!(
                "mesh: frame {} from rank {from} ({} bytes) is not the one sent",
                next[from],
                b.len()
            )));
        }
        next[from] += 1;
    }
    say(&format!(
        "rank {me}: mesh ok ({MESH_FRAMES} frames with each of {w} ranks)"
    ));
    if let Some(d) = die {
        return mesh_death(g, &mesh, d);
    }
    drop(mesh);
    g.barrier("mesh-closed")
}

/// Rank `die` dies (SIGKILL) with the mesh open; the others wait for the mesh to report it.
fn mesh_death(g: &Group, mesh: &Mesh, die: usize) -> Result<()> {
    g.set_op("mesh")?;
    g.barrier("mesh-open")?;
    if g.rank() == die {
        say(&format!("rank {die}: dying (SIGKILL) with the mesh open"));
        // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
    match mesh.recv_timeout(Duration::from_secs(30)) {
        Err(e) => Err(e),
        Ok(got) => Err(DistError::Protocol(format!(
            "mesh: expected rank {die}'s loss, got {:?}",
            got.map(|(from, b)| (from, b.len()))
        ))),
    }
}
