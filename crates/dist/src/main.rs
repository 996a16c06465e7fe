//! `ptxforge-dist`: the launcher and the test program of the `dist` crate as one small binary,
//! so the crate's tests need not build the CLI. `ptxforge launch` and `ptxforge dist-selftest`
//! call the same library functions.

use clap::{Parser, Subcommand};
use std::io::Write;

#[derive(Parser)]
#[command(name = "ptxforge-dist", version, about = "ptxforge's process layer")]
struct Cli {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand)]
enum Verb {
    /// Start a local multi-process job (see `ptxforge launch`).
    Launch(dist::launch::LaunchArgs),
    /// The test program each rank of a launched job runs.
    Selftest(dist::selftest::SelftestArgs),
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.verb {
        Verb::Launch(a) => dist::launch::run(a),
        Verb::Selftest(a) => dist::selftest::run(a),
    };
    if let Err(e) = r {
        let rank = std::env::var("RANK")
            .map(|r| format!(" rank {r}:"))
            .unwrap_or_default();
        // a closed standard error has nobody left to tell: ignore write errors
        let _ = writeln!(std::io::stderr().lock(), "ptxforge-dist:{rank} error: {e}");
        std::process::exit(1);
    }
}
