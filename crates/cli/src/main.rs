//! `ptxforge`: one binary, one verb per job. Each verb lives in `cmd/<verb>.rs` with its own
//! clap `Args` and a `run` function; this file only dispatches. Every verb takes `--json` and
//! exits non-zero with a one-line reason on standard error on failure; with `--json` it also
//! prints a JSON error object on standard output (`out::json_error`), argument errors included.
//! All printing goes through `out` (a closed pipe or a full disk never panics).

use clap::{Parser, Subcommand};

// First: its `println!`/`print!`/`eprintln!` shadow std's in every module declared after it.
#[macro_use]
mod out;
mod cmd;

#[derive(Parser)]
#[command(
    name = "ptxforge",
    version,
    about = "PTX-level GPU programming toolkit"
)]
struct Cli {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand)]
enum Verb {
    /// Parse a PTX file and print it back, formatted.
    Fmt(cmd::fmt::Args),
    /// Parse, validate and (when available) assemble a PTX file with ptxas.
    Check(cmd::check::Args),
    /// Every instruction opcode with its parse / validate / emulate / builder status.
    Isa(cmd::isa::Args),
    /// Generate, verify, time and draw a pipeline-parallel schedule.
    Schedule(cmd::schedule::Args),
    /// Simulate a training step or a prefill/decode serving deployment of an MoE model on a
    /// cluster; fit a hardware profile to benchmarks (--calibrate).
    Sim(cmd::sim::Args),
    /// Launch one kernel from a PTX file with .npy inputs and outputs.
    Run(cmd::run::Args),
    /// List the devices (emulated, and CUDA when a driver is present).
    Devices(cmd::devices::Args),
    /// Benchmarks (`bench emu`: emulator throughput).
    Bench(cmd::bench::Args),
    /// List the library kernels (parameters in launch order, launch-shape rule, targets).
    Kernels(cmd::kernels::Args),
    /// Print a library kernel's PTX.
    Emit(cmd::emit::Args),
    /// Run a library GEMM on random inputs against the f64 reference.
    Gemm(cmd::gemm::Args),
    /// One MoE layer step (route, dispatch, grouped FP8 GEMMs, combine) across devices.
    Moe(cmd::moe::Args),
    /// Expert-parallel communication across processes (`mpirun -np NODES ptxforge comm`):
    /// per-leg time and bytes, output hashes.
    #[cfg(feature = "mpi")]
    Comm(cmd::comm::Args),
    /// Check (`--check`) or rewrite (`--write`) the documents' generated tables.
    Docs(cmd::docs::Args),
    /// Train the DeepSeek-V3-shaped model (DualPipeV x EP, FP8): loss per step, validation,
    /// checkpoints, loss curve, trace.
    Train(cmd::train::Args),
    /// Start a local multi-process job: N nodes x P processes of CMD with the rank
    /// environment (RANK, WORLD_SIZE, LOCAL_RANK, ...), signals forwarded, no orphans.
    Launch(cmd::launch::Args),
    /// The process layer's test program, run as each rank of a launched job.
    #[command(hide = true)]
    DistSelftest(cmd::launch::DistSelftestArgs),
}

impl Verb {
    /// The verb's name and whether it was given `--json`.
    fn name_and_json(&self) -> (&'static str, bool) {
        match self {
            Verb::Fmt(a) => ("fmt", a.json),
            Verb::Check(a) => ("check", a.json),
            Verb::Isa(a) => ("isa", a.json),
            Verb::Schedule(a) => ("schedule", a.json),
            Verb::Sim(a) => ("sim", a.json),
            Verb::Run(a) => ("run", a.json),
            Verb::Devices(a) => ("devices", a.json),
            Verb::Bench(a) => ("bench", a.target.json()),
            Verb::Kernels(a) => ("kernels", a.json),
            Verb::Emit(a) => ("emit", a.json),
            Verb::Gemm(a) => ("gemm", a.json),
            Verb::Moe(a) => ("moe", a.json),
            #[cfg(feature = "mpi")]
            Verb::Comm(a) => ("comm", a.json),
            Verb::Docs(a) => ("docs", a.json),
            Verb::Train(a) => ("train", a.json),
            Verb::Launch(a) => ("launch", a.json),
            Verb::DistSelftest(a) => ("dist-selftest", a.json),
        }
    }

    fn run(self) -> anyhow::Result<()> {
        match self {
            Verb::Fmt(a) => cmd::fmt::run(a),
            Verb::Check(a) => cmd::check::run(a),
            Verb::Isa(a) => cmd::isa::run(a),
            Verb::Schedule(a) => cmd::schedule::run(a),
            Verb::Sim(a) => cmd::sim::run(a),
            Verb::Moe(a) => cmd::moe::run(a),
            #[cfg(feature = "mpi")]
            Verb::Comm(a) => cmd::comm::run(a),
            Verb::Run(a) => cmd::run::run(a),
            Verb::Devices(a) => cmd::devices::run(a),
            Verb::Bench(a) => cmd::bench::run(a),
            Verb::Kernels(a) => cmd::kernels::run(a),
            Verb::Emit(a) => cmd::emit::run(a),
            Verb::Gemm(a) => cmd::gemm::run(a),
            Verb::Docs(a) => cmd::docs::run(a),
            Verb::Train(a) => cmd::train::run(a),
            Verb::Launch(a) => cmd::launch::run(a),
            Verb::DistSelftest(a) => cmd::launch::selftest(a),
        }
    }
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => bad_arguments(e),
    };
    let (verb, json) = cli.verb.name_and_json();
    if let Err(e) = cli.verb.run() {
        // One line, non-zero exit: the contract every verb follows.
        let msg = format!("{e:#}").replace('\n', " ");
        if json && !out::is_reported(&e) {
            println!("{}", out::json_error(verb, &msg, Some(&e)));
        }
        out::finish();
        eprintln!("ptxforge: error: {msg}");
        std::process::exit(1);
    }
    out::finish();
}

/// A command line clap refuses: with `--json` anywhere in it, the JSON error object too.
fn bad_arguments(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    let help = matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if !help && std::env::args().any(|a| a == "--json") {
        let verb = std::env::args().nth(1).unwrap_or_default();
        let text = e.render().to_string();
        let msg = text
            .lines()
            .next()
            .unwrap_or("bad arguments")
            .trim_start_matches("error: ");
        println!("{}", out::json_error(&verb, msg, None));
        out::finish();
    }
    e.exit()
}
