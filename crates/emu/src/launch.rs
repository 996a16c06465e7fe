//! Launching a grid: CTAs are admitted to *resident slots* (at most what the emulated SMs hold,
//! or the SM budget of the launch) and run on several host threads. Each host thread round-robins
//! its resident CTAs in time slices, so CTAs that spin on flags written by other CTAs — or by
//! other devices — make progress as on hardware. A worker admits another CTA when its resident
//! CTAs stop finishing, which keeps the common case (independent CTAs) cache-friendly. A worker
//! whose round only polled sleeps until a polling launch makes progress (`emu::park`).

use crate::error::{EmuError, FaultKind, FaultSite};
use crate::exec::{Cta, Fault, LaunchCtx};
use crate::memory::MemMap;
use crate::program::Program;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use worker::{Plan, Shared};

mod worker;

/// Shape and placement of a launch.
#[derive(Clone, Debug)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory bytes.
    pub shared_bytes: u32,
    /// SMs this launch may occupy (the SM budget); `%smid` runs over `sm_offset..sm_offset+sms`.
    pub sms: u32,
    pub sm_offset: u32,
    /// SMs the device has (`%nsmid`).
    pub device_sms: u32,
    /// Cluster dimensions (`[1,1,1]` when not clustered). The CTAs of a cluster are co-resident,
    /// share distributed shared memory and run on one host thread.
    pub cluster: [u32; 3],
}

impl LaunchConfig {
    /// A 1-D launch on the whole of a 132-SM device.
    pub fn linear(grid: u32, block: u32) -> LaunchConfig {
        LaunchConfig {
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_bytes: 0,
            sms: 132,
            sm_offset: 0,
            device_sms: 132,
            cluster: [1, 1, 1],
        }
    }
}

/// Execution limits and host resources of a launch.
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    /// Host threads running CTAs.
    pub threads: usize,
    /// Stop with a hang diagnostic after this many warp-instructions.
    pub max_warp_instructions: u64,
    /// Stop with a hang diagnostic after this wall time.
    pub timeout: Duration,
    /// Incremented as CTAs finish (for progress bars).
    pub progress: Option<Arc<AtomicU64>>,
    /// Collects device `printf` output instead of writing it to stdout.
    pub printf: Option<Arc<Mutex<String>>>,
    /// Counts shared-memory wavefronts and bank conflicts per instruction
    /// ([`LaunchStats::banks`]). Default: on when `PTXFORGE_EMU_BANKS=1`.
    pub bank_profile: bool,
    /// A hold on emulated time ([`crate::clock::Hold`]) that the launch releases once its
    /// workers are on the timeline (a stream holds time while its launch is queued).
    pub hold: Option<Arc<Mutex<Option<crate::clock::Hold>>>>,
    /// Tensor-core numerics of `mma`/`wgmma` float forms. Default: `PTXFORGE_TC_NUMERICS`
    /// (`exact` | `hw`), else the kernel target's hardware model.
    pub numerics: crate::Numerics,
    /// Sanitizer tools ([`crate::sanitize`]); a launch that finds something fails with
    /// [`EmuError::Sanitizer`]. Default: [`crate::sanitize::process_default`]
    /// (`PTXFORGE_SANITIZE`).
    pub sanitize: crate::sanitize::Tools,
    /// Call-stack bytes per thread, like CUDA's `cudaLimitStackSize`: device-function frames
    /// (parameters, return values, `.local` variables) plus the registers a recursive call
    /// saves (8 bytes each). A call past it stops the launch with
    /// [`crate::FaultKind::StackOverflow`]. Default: `PTXFORGE_EMU_STACK_BYTES`, else
    /// [`DEFAULT_STACK_BYTES`]. Host memory grows with the stack actually used, not the limit.
    pub stack_bytes: u32,
    /// Set from another thread to stop the launch (a host interrupt, e.g. Ctrl-C in Python):
    /// workers check it between slices and the launch fails with
    /// [`crate::FaultKind::Interrupted`] naming where a warp was.
    pub cancel: Option<Arc<AtomicBool>>,
}

/// Largest call-stack limit (the stack lives in the upper half of the 32-bit local window).
const STACK_LIMIT_MAX: u32 = 1 << 30;

/// Default call-stack limit per thread (512 KiB: recursion about 1,500 deep for a function
/// with 40 registers and a 64-byte frame).
pub const DEFAULT_STACK_BYTES: u32 = 512 * 1024;

impl Default for LaunchOptions {
    fn default() -> Self {
        let timeout = std::env::var("PTXFORGE_EMU_TIMEOUT_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(600);
        LaunchOptions {
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
            max_warp_instructions: u64::MAX,
            timeout: Duration::from_secs(timeout),
            progress: None,
            printf: None,
            bank_profile: std::env::var("PTXFORGE_EMU_BANKS").is_ok_and(|v| v == "1"),
            hold: None,
            numerics: crate::Numerics::from_env(),
            sanitize: crate::sanitize::process_default(),
            stack_bytes: std::env::var("PTXFORGE_EMU_STACK_BYTES")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(DEFAULT_STACK_BYTES),
            cancel: None,
        }
    }
}

/// What a launch did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct LaunchStats {
    pub ctas: u64,
    pub warp_instructions: u64,
    pub lane_instructions: u64,
    pub seconds: f64,
    /// Distinct SMs that ran at least one CTA.
    pub sms_used: Vec<u32>,
    pub max_resident: u32,
    /// Shared-memory bank profile (when [`LaunchOptions::bank_profile`] is set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub banks: Option<crate::banks::BankReport>,
    /// The sanitizers that checked this launch (and found nothing), when any ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sanitized: Option<crate::sanitize::Tools>,
}

/// Per-SM limits of the emulated target.
pub fn max_shared_per_block(sm: u32) -> u32 {
    match sm {
        0..=72 => 48 * 1024,
        75 => 64 * 1024,
        80 | 87 => 163 * 1024,
        86 | 89 => 99 * 1024,
        90.. => 227 * 1024,
        _ => 96 * 1024,
    }
}

/// Runs a decoded kernel over a grid. A panic in the emulator (a bug, in a worker thread or
/// here) becomes the launch's error, [`EmuError::Internal`] with the panic's message: the
/// other workers stop at once ([`StopOnPanic`]) and whoever waits for the launch gets an
/// answer.
pub fn launch(
    prog: Arc<Program>,
    mem: MemMap,
    params: Vec<u8>,
    cfg: &LaunchConfig,
    opts: &LaunchOptions,
) -> Result<LaunchStats, EmuError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        launch_workers(prog, mem, params, cfg, opts)
    }))
    .unwrap_or_else(|p| Err(EmuError::Internal(crate::error::panic_message(&*p))))
}

/// Sets the launch's abort flag when a worker unwinds from a panic, so the other workers stop
/// and the scope joins them (and records the panic as the launch's error) at once.
struct StopOnPanic<'a>(&'a AtomicBool);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

fn launch_workers(
    prog: Arc<Program>,
    mem: MemMap,
    params: Vec<u8>,
    cfg: &LaunchConfig,
    opts: &LaunchOptions,
) -> Result<LaunchStats, EmuError> {
    check_launch(&prog, &params, cfg)?;
    let ctx = LaunchCtx {
        prog: prog.clone(),
        mem,
        params,
        grid: cfg.grid,
        block: cfg.block,
        dyn_shared: cfg.shared_bytes,
        cluster: cfg.cluster,
        nsm: cfg.device_sms,
        launch_id: NEXT_LAUNCH.fetch_add(1, Ordering::Relaxed),
        start: Instant::now(),
        printf: opts.printf.clone(),
        bank_profile: opts.bank_profile,
        numerics: opts.numerics,
        san: opts
            .sanitize
            .any()
            .then(|| crate::sanitize::LaunchSan::new(opts.sanitize, &prog)),
        stack_bytes: opts.stack_bytes.min(STACK_LIMIT_MAX),
    };
    let plan = plan(&ctx, cfg, opts)?;
    let sh = Shared::new(cfg.sms, plan.nworkers);
    // Every worker is on the emulated timeline before any runs; then the queued launch's hold
    // on time can go.
    let clocks: Vec<_> = (0..plan.nworkers)
        .map(|_| crate::clock::WorkerClock::join(crate::clock::Timeline::global()))
        .collect();
    if let Some(h) = &opts.hold {
        h.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
    let start = Instant::now();
    std::thread::scope(|s| {
        let mut workers = Vec::with_capacity(plan.nworkers);
        for (w, clock) in clocks.into_iter().enumerate() {
            let env = worker::Env {
                ctx: &ctx,
                plan: &plan,
                sh: &sh,
                opts,
            };
            workers.push(s.spawn(move || {
                let _stop = StopOnPanic(&env.sh.abort);
                worker::Worker::new(w, env, clock).run();
            }));
        }
        // joined here, a worker's panic is this launch's error (with the panic's message)
        for h in workers {
            if let Err(p) = h.join() {
                let mut g = sh.first_err.lock().unwrap_or_else(|p| p.into_inner());
                g.get_or_insert(EmuError::Internal(crate::error::panic_message(&*p)));
            }
        }
    });
    let err = std::mem::take(&mut *sh.first_err.lock().unwrap_or_else(|p| p.into_inner()));
    let err = match &ctx.san {
        Some(s) => s.finish(&ctx, err),
        None => err,
    };
    if let Some(e) = err {
        return Err(e);
    }
    Ok(stats(&ctx, cfg, opts, &sh, start))
}

/// The launch's shape against the kernel's directives, its parameters and the cluster rules.
fn check_launch(prog: &Program, params: &[u8], cfg: &LaunchConfig) -> Result<(), EmuError> {
    // products in u64 first: a block of 134217729x32 must not wrap to 32 threads
    crate::limits::check_shape(cfg.grid, cfg.block)?;
    let threads = cfg.block.iter().product::<u32>();
    if let Some(r) = prog.reqntid {
        if r != cfg.block {
            return Err(EmuError::Launch(format!(
                "kernel requires block {:?} (.reqntid), launched with {:?}",
                r, cfg.block
            )));
        }
    }
    if let Some(mx) = prog.maxntid {
        if threads > mx.iter().product::<u32>() {
            return Err(EmuError::Launch(format!(
                "block of {threads} threads exceeds .maxntid {mx:?}"
            )));
        }
    }
    if params.len() < prog.param_bytes as usize {
        return Err(EmuError::Launch(format!(
            "{} parameter bytes given, kernel needs {}",
            params.len(),
            prog.param_bytes
        )));
    }
    if cfg.sms == 0 {
        return Err(EmuError::Launch("SM budget of 0".into()));
    }
    let csize: u32 = cfg.cluster.iter().product();
    if csize == 0
        || csize > 16
        || (0..3).any(|d| !cfg.grid[d].is_multiple_of(cfg.cluster[d].max(1)))
    {
        return Err(EmuError::Launch(format!(
            "cluster {:?} must have 1..=16 CTAs and divide the grid {:?}",
            cfg.cluster, cfg.grid
        )));
    }
    Ok(())
}

/// Residency (CTAs per SM from warps and shared memory), clusters and the workers' slots.
fn plan(ctx: &LaunchCtx, cfg: &LaunchConfig, opts: &LaunchOptions) -> Result<Plan, EmuError> {
    let prog = &ctx.prog;
    let smem = ctx.shared_bytes();
    let limit = max_shared_per_block(prog.target_sm);
    if smem > limit {
        return Err(EmuError::Launch(format!(
            "kernel `{}` needs {smem} bytes of shared memory per CTA; sm_{} allows {limit}",
            prog.name, prog.target_sm
        )));
    }
    let threads = cfg.block.iter().product::<u32>();
    let warps = threads.div_ceil(32);
    let mut per_sm = (64 / warps).min(32);
    if smem > 0 {
        per_sm = per_sm.min((228 * 1024) / smem.max(1));
    }
    let cluster = cfg.cluster;
    let csize = cluster.iter().product::<u32>() as u64;
    let ctas_total = cfg.grid.iter().map(|&x| x as u64).product::<u64>();
    let units_total = ctas_total / csize;
    let capacity = ((cfg.sms as u64 * per_sm.max(1) as u64) / csize)
        .max(1)
        .min(units_total) as u32;
    let nworkers = (opts.threads.max(1) as u64).min(capacity as u64) as usize;
    Ok(Plan {
        threads,
        csize,
        cluster,
        cgrid: [
            cfg.grid[0] / cluster[0],
            cfg.grid[1] / cluster[1],
            cfg.grid[2] / cluster[2],
        ],
        units_total,
        capacity,
        nworkers,
        per_worker: capacity.div_ceil(nworkers as u32),
        sms: cfg.sms,
        sm_offset: cfg.sm_offset,
    })
}

/// The statistics of a launch that completed.
fn stats(
    ctx: &LaunchCtx,
    cfg: &LaunchConfig,
    opts: &LaunchOptions,
    sh: &Shared,
    start: Instant,
) -> LaunchStats {
    LaunchStats {
        ctas: cfg.grid.iter().map(|&x| x as u64).product::<u64>(),
        warp_instructions: sh.executed.load(Ordering::Relaxed),
        lane_instructions: sh.lane_ops.load(Ordering::Relaxed),
        seconds: start.elapsed().as_secs_f64(),
        sms_used: sh
            .sm_used
            .iter()
            .enumerate()
            .filter(|(_, v)| v.load(Ordering::Relaxed) != 0)
            .map(|(i, _)| cfg.sm_offset + i as u32)
            .collect(),
        max_resident: sh.max_res.load(Ordering::Relaxed),
        banks: opts.bank_profile.then(|| {
            sh.banks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .report(&ctx.prog)
        }),
        sanitized: opts.sanitize.any().then_some(opts.sanitize),
    }
}

static NEXT_LAUNCH: AtomicU64 = AtomicU64::new(1);

/// What the round just run over `resident` did: (only waited: some wait, no observable
/// progress; made observable progress: a store, atomic, copy, arrive or exit). Resets the CTAs'
/// counters for the next round.
fn round_activity(resident: &mut [(Vec<Cta>, u32)]) -> (bool, bool) {
    let (mut progress, mut waits) = (0u64, 0u64);
    for c in resident.iter_mut().flat_map(|(g, _)| g.iter_mut()) {
        progress += std::mem::take(&mut c.progress);
        waits += std::mem::take(&mut c.waits);
    }
    (progress == 0 && waits > 0, progress > 0)
}

/// Writes down the waiting warps of this worker's CTAs with their PTX lines.
fn note_waiting(ctx: &LaunchCtx, resident: &[(Vec<Cta>, u32)], into: &Mutex<Vec<String>>) {
    let mut v = Vec::new();
    for c in resident.iter().flat_map(|(g, _)| g.iter()) {
        for w in c.warps.iter().filter(|w| w.live != 0) {
            v.push(format!(
                "CTA {:?} warp {} at PTX line {}",
                c.id,
                w.id,
                ctx.prog.line_of(w.wait_pc)
            ));
        }
    }
    *into.lock().unwrap_or_else(|p| p.into_inner()) = v;
}

/// The deadlock diagnostic: every waiting warp of every worker of the launch.
fn deadlock(
    ctx: &LaunchCtx,
    resident: &[(Vec<Cta>, u32)],
    waiting: &[Mutex<Vec<String>>],
    ns: u64,
) -> EmuError {
    let all: Vec<String> = waiting
        .iter()
        .flat_map(|m| m.lock().unwrap_or_else(|p| p.into_inner()).clone())
        .collect();
    let shown = all.len().min(8);
    let mut why = format!(
        "{:.0} s of emulated time (every resident warp is waiting); waiting: {}",
        ns as f64 * 1e-9,
        all[..shown].join(", ")
    );
    if all.len() > shown {
        why.push_str(&format!(" and {} more", all.len() - shown));
    }
    let first = resident
        .iter()
        .flat_map(|(g, _)| g.iter())
        .find_map(|c| c.warps.iter().find(|w| w.live != 0).map(|w| (c, w)));
    match first {
        Some((cta, w)) => site_error(
            ctx,
            cta,
            Fault {
                kind: FaultKind::Deadlock(why),
                warp: w.id,
                lane: w.live.trailing_zeros(),
                pc: w.wait_pc,
            },
        ),
        None => EmuError::Launch(format!("deadlock: {why}")),
    }
}

fn site_error(ctx: &LaunchCtx, cta: &Cta, f: Fault) -> EmuError {
    let prog = &ctx.prog;
    let t = f.warp * 32 + f.lane;
    let b = ctx.block;
    let thread = [t % b[0], (t / b[0]) % b[1], t / (b[0] * b[1])];
    let (line, instruction, rust) = prog
        .insts
        .get(f.pc as usize)
        .and_then(|i| prog.source.get(i.src as usize))
        .map(|s| (s.loc.line, s.to_string(), s.loc.rust_location()))
        .unwrap_or((0, String::new(), None));
    EmuError::Fault {
        kind: f.kind,
        site: Box::new(FaultSite {
            kernel: prog.name.clone(),
            cta: cta.id,
            thread,
            line,
            instruction,
            rust,
        }),
    }
}

/// Moves the shared state of every other CTA of the cluster into `group[c].peers` so the
/// running CTA can reach distributed shared memory and remote mbarriers.
fn lend_peers(group: &mut [Cta], c: usize) {
    if group.len() == 1 {
        return;
    }
    let mut peers: Vec<crate::exec::PeerMem> = Vec::with_capacity(group.len());
    for (j, other) in group.iter_mut().enumerate() {
        if j == c {
            peers.push(Default::default());
        } else {
            peers.push(other.take_mem());
        }
    }
    group[c].peers = peers;
}

/// Gives the lent shared state back to its owners.
fn return_peers(group: &mut [Cta], c: usize) {
    if group.len() == 1 {
        return;
    }
    let peers = std::mem::take(&mut group[c].peers);
    for (j, p) in peers.into_iter().enumerate() {
        if j != c {
            group[j].put_mem(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic in one worker stops the others (which would otherwise spin until the timeout)
    /// and its join gives the panic's message, which `launch` records as [`EmuError::Internal`].
    #[test]
    fn a_worker_panic_stops_the_other_workers() {
        let abort = AtomicBool::new(false);
        let p = std::thread::scope(|s| {
            let h = s.spawn(|| {
                let _stop = StopOnPanic(&abort);
                panic!("planted panic {}", 7);
            });
            s.spawn(|| {
                let t0 = Instant::now();
                while !abort.load(Ordering::Relaxed) {
                    assert!(t0.elapsed() < Duration::from_secs(60), "not stopped");
                    std::thread::yield_now();
                }
            });
            h.join().unwrap_err()
        });
        assert_eq!(crate::error::panic_message(&*p), "planted panic 7");
        assert!(abort.load(Ordering::Relaxed));
    }
}
