//! `ptxforge launch --nodes N --procs-per-node P [--master-port PORT] [--timeout S] -- CMD...`:
//! a local multi-process job (each "node" a group of P processes) with torchrun's rank
//! environment, signal forwarding, no orphans, and clean-up of the job's shared-memory
//! segments; a thin caller of `dist::launch` (docs/SCALE.md). Also the hidden verb
//! `ptxforge dist-selftest`, the test program of the process layer (`dist::selftest`).

use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub launch: dist::launch::LaunchArgs,
    /// On failure, also print a JSON error object on standard output.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<()> {
    Ok(dist::launch::run(a.launch)?)
}

#[derive(clap::Args)]
pub struct DistSelftestArgs {
    #[command(flatten)]
    pub test: dist::selftest::SelftestArgs,
    /// On failure, also print a JSON error object on standard output.
    #[arg(long)]
    pub json: bool,
}

pub fn selftest(a: DistSelftestArgs) -> Result<()> {
    Ok(dist::selftest::run(a.test)?)
}
