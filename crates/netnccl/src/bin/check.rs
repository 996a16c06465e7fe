//! `netnccl-check`: the launcher and the rank programs of the NCCL tests.
//!
//! - `netnccl-check launch --nodes N --procs-per-node P -- CMD...`: `ptxforge launch`;
//! - `netnccl-check collectives [--count C] [--exact] [--seed S]`: every rank of the job checks
//!   all-reduce / reduce-scatter / all-gather against the host reference;
//! - `netnccl-check proxy [--seed S]`: 2 ranks exchange records through the proxy transport
//!   over the NCCL engine;
//!   (`--skew-rank R`: rank R uses `C + 1`, which must fail with an NCCL error; `--die-rank R`:
//!   rank R exits after joining, and the others must fail naming it);
//! - `netnccl-check ep [--single] [--nodes N] [--gpus-per-node G] [--seed S]`: EP dispatch
//!   and combine in one process, or one process per node over the NCCL engine (`hash` lines);
//! - `netnccl-check fault --op all-reduce|engine --kind kill|hang [--victim R]
//!   [--nccl-timeout S]`: 2 ranks run the operation until the victim dies or hangs; the survivor
//!   prints the error it met and fails (the `dist` watchdog only reports here, so the NCCL
//!   path alone must stop it);
//! - `netnccl-check abort [--nccl-timeout S] [--expect aborted|call]` (one process, CUDA device
//!   0): a 1-rank communicator runs an all-reduce and is aborted, then a 2-rank init whose
//!   second rank never comes must fail as expected (the fault path one GPU allows);
//! - `netnccl-check unavailable`: succeeds only if loading NCCL fails with `NcclUnavailable`.
//!
//! Each rank uses CUDA device `RANK % devices`. Without `--seed`, rank 0 draws one from
//! the clock and shares it. Prints one `rank R: ... OK` line per check, or the error (exit 1).

use clap::{Parser, Subcommand};
use dist::FaultAction;
use netnccl::check::{collectives, proxy, CollCfg, Res};
use netnccl::epcheck;
use netnccl::faultcheck::{self, FaultCfg, FaultKind, FaultOp, InitFailure};
use netnccl::{Comm, NcclEngine, NcclError};
use runtime::Device;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "netnccl-check", about = "NCCL engine and collectives checks")]
struct Cli {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand)]
enum Verb {
    Launch(dist::launch::LaunchArgs),
    Collectives {
        #[arg(long, default_value_t = 300)]
        count: usize,
        #[arg(long)]
        exact: bool,
        #[arg(long)]
        seed: Option<u64>,
        /// This rank uses `count + 1` (to check that mismatched ranks fail clearly).
        #[arg(long)]
        skew_rank: Option<u32>,
        /// This rank dies (exit 3, its sockets closed by the kernel as on SIGKILL) right after
        /// joining the communicator: the others must fail with an NCCL error naming it.
        #[arg(long)]
        die_rank: Option<u32>,
    },
    Proxy {
        #[arg(long)]
        seed: Option<u64>,
    },
    /// EP dispatch + combine: `--single` in this process, else one process per node with the
    /// NCCL engine between them; prints `hash` lines.
    Ep {
        #[arg(long)]
        single: bool,
        #[arg(long, default_value_t = 2)]
        nodes: u32,
        #[arg(long, default_value_t = 1)]
        gpus_per_node: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// A peer dies or hangs mid-operation; the survivor must fail naming the operation.
    Fault {
        #[arg(long, value_enum)]
        op: FaultOp,
        #[arg(long, value_enum, default_value = "kill")]
        kind: FaultKind,
        #[arg(long, default_value_t = 1)]
        victim: u32,
        /// Seconds before the victim fails.
        #[arg(long, default_value = "0.5", value_parser = dist::launch::parse_seconds)]
        after: Duration,
        /// The communicator's timeout (seconds).
        #[arg(long, default_value = "20", value_parser = dist::launch::parse_seconds)]
        nccl_timeout: Duration,
    },
    /// The non-blocking init / abort paths on one GPU (see the module docs).
    Abort {
        #[arg(long, default_value = "5", value_parser = dist::launch::parse_seconds)]
        nccl_timeout: Duration,
        #[arg(long, value_enum, default_value = "aborted")]
        expect: InitFailure,
    },
    Unavailable,
}

fn main() -> ExitCode {
    let r = match Cli::parse().verb {
        Verb::Launch(a) => dist::launch::run(a).map_err(Into::into),
        Verb::Collectives {
            count,
            exact,
            seed,
            skew_rank,
            die_rank,
        } => rank(seed, |comm, seed| {
            if die_rank == Some(comm.rank()) {
                std::process::exit(3);
            }
            let count = count + usize::from(skew_rank == Some(comm.rank()));
            collectives(&comm, &CollCfg { count, exact, seed })
        }),
        Verb::Proxy { seed } => rank(seed, |comm, seed| proxy(NcclEngine::new(comm)?, seed)),
        Verb::Ep {
            single,
            nodes,
            gpus_per_node,
            seed,
        } => {
            let cfg = ep::selfcheck::CheckCfg {
                nodes,
                gpus_per_node,
                seed,
                ..epcheck::default_cfg()
            };
            if single {
                epcheck::run(&cfg, None).map(|l| println!("{}", l.join("\n")))
            } else {
                rank(Some(seed), |comm, _| {
                    Ok(epcheck::run(&cfg, Some(NcclEngine::new(comm)?))?.join("\n"))
                })
            }
        }
        Verb::Fault {
            op,
            kind,
            victim,
            after,
            nccl_timeout,
        } => {
            let cfg = FaultCfg {
                op,
                kind,
                victim,
                after,
                limit: nccl_timeout * 3,
            };
            join(Some(1), FaultAction::Report, |comm, _| {
                comm.set_timeout(nccl_timeout);
                faultcheck::run(comm, &cfg)
            })
        }
        Verb::Abort {
            nccl_timeout,
            expect,
        } => Device::cuda(0)
            .map_err(Into::into)
            .and_then(|d| faultcheck::abort_paths(&d, nccl_timeout, expect))
            .map(|l| println!("{l}")),
        Verb::Unavailable => unavailable(),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("netnccl-check: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Joins the job, makes the communicator and runs `f` with it and the job's seed.
fn rank(seed: Option<u64>, f: impl FnOnce(Comm, u64) -> Res<String>) -> Res<()> {
    join(seed, FaultAction::Exit, f)
}

/// [`rank`] with the watchdog's action on a peer's death.
fn join(
    seed: Option<u64>,
    action: FaultAction,
    f: impl FnOnce(Comm, u64) -> Res<String>,
) -> Res<()> {
    let group = dist::Bootstrap::from_env()?
        .fault_action(action)
        .connect()?;
    let n = Device::cuda_count().max(1);
    // RANK, not LOCAL_RANK: distinct GPUs also when a test runs several one-process "nodes" on
    // one machine (NCCL refuses two ranks of a communicator on one GPU)
    let dev = Device::cuda(group.rank() as u32 % n)?;
    let drawn = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let all = group.all_gather(&drawn.to_le_bytes())?;
    let seed = u64::from_le_bytes(all[0].as_slice().try_into()?);
    let comm = Comm::bootstrap(&group, &dev)?;
    println!("{}", f(comm, seed)?);
    group.finish()?;
    Ok(())
}

fn unavailable() -> Res<()> {
    match netnccl::UniqueId::new() {
        Err(NcclError::NcclUnavailable(why)) => {
            println!("NcclUnavailable: {why}");
            Ok(())
        }
        Err(e) => Err(format!("expected NcclUnavailable, got: {e}").into()),
        Ok(_) => Err("expected NcclUnavailable, but NCCL loaded".into()),
    }
}
