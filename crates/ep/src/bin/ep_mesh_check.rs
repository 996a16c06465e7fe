//! `ep-mesh-check`: the launcher and the rank program of the TCP mesh engine's test.
//!
//! - `ep-mesh-check launch --nodes N --procs-per-node 1 -- CMD...`: `ptxforge launch`;
//! - `ep-mesh-check check [--gpus-per-node G] [--seed S] ...`: every process joins the `dist`
//!   group, opens [`ep::MeshEngine`] and runs [`ep::selfcheck::dispatch_combine_hashes`] over
//!   the proxy transport, printing the `hash <rank> <output> <fnv64>` lines of its ranks (every
//!   received row is checked). With one process per node (`--procs-per-node 1`) a process
//!   hosts `G` ranks; with several it hosts its own rank (`G` = processes per node), and its
//!   node peers' buffers are mapped from shared segments.

use clap::{Parser, Subcommand};
use ep::selfcheck::{dispatch_combine_hashes, CheckCfg, Res};
use ep::{Engine, MeshEngine};
use runtime::Device;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "ep-mesh-check",
    about = "the TCP mesh engine's cross-process check"
)]
struct Cli {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand)]
enum Verb {
    Launch(dist::launch::LaunchArgs),
    /// One process per node: dispatch + combine through the proxy over the mesh engine.
    Check(Sizes),
}

/// The check's sizes (the test computes the same config in one process).
#[derive(clap::Args)]
struct Sizes {
    /// Ranks per node when a process hosts a node (ignored with several processes per node).
    #[arg(long, default_value_t = 2)]
    gpus_per_node: u32,
    #[arg(long, default_value_t = 8)]
    experts: u32,
    #[arg(long, default_value_t = 128)]
    hidden: usize,
    #[arg(long, default_value_t = 2)]
    topk: usize,
    #[arg(long, default_value_t = 6)]
    tokens: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn check(s: Sizes) -> Res<()> {
    let env = dist::DistEnv::from_env()?;
    let (lws, nodes) = (env.local_world_size, env.world_size / env.local_world_size);
    if lws > 1 {
        // before the first emulator allocation: node peers map this process's buffers
        Device::emu_set_address_slot(env.rank as u32)?;
        Device::emu_set_shared_default(true);
    }
    let group = dist::Bootstrap::new(env).connect()?;
    let c = CheckCfg {
        nodes: nodes as u32,
        gpus_per_node: if lws > 1 { lws as u32 } else { s.gpus_per_node },
        experts: s.experts,
        hidden: s.hidden,
        topk: s.topk,
        tokens: s.tokens,
        max_tokens: 16,
        seed: s.seed,
        timeout: Duration::from_secs(60),
    };
    let engine = MeshEngine::connect(&group)?;
    println!("engine: {}", engine.name());
    println!(
        "{}",
        dispatch_combine_hashes(&c, Some(Box::new(engine)))?.join("\n")
    );
    group.finish()?;
    Ok(())
}

fn main() -> ExitCode {
    let r = match Cli::parse().verb {
        Verb::Launch(a) => dist::launch::run(a).map_err(Into::into),
        Verb::Check(s) => check(s),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ep-mesh-check: error: {e}");
            ExitCode::FAILURE
        }
    }
}
