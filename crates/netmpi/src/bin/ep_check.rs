//! `netmpi-ep-check [--single] [--gpus-per-node G]`: [`netmpi::check`] at its default sizes
//! (2 nodes x 2 GPUs unless G is given), in one process (`--single`) or one process per node
//! under `mpirun -np 2`. Prints one
//! `hash <rank> <output> <fnv64>` line per hosted rank and output (the test compares both
//! modes' lines) and one `stats` line per operation.

use netmpi::check::{run, CheckCfg};
use netmpi::Mpi;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let single = args.iter().any(|a| a == "--single");
    let mut cfg = CheckCfg::default();
    if let Some(i) = args.iter().position(|a| a == "--gpus-per-node") {
        match args.get(i + 1).and_then(|v| v.parse().ok()) {
            Some(g) => cfg.gpus_per_node = g,
            None => {
                eprintln!("netmpi-ep-check: --gpus-per-node needs a number");
                return ExitCode::FAILURE;
            }
        }
    }
    let mpi = match (!single).then(Mpi::init).transpose() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("netmpi-ep-check: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rep = match run(&cfg, mpi.as_ref()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("netmpi-ep-check: {e}");
            return ExitCode::FAILURE;
        }
    };
    for o in &rep.ops {
        println!(
            "stats {} ranks {:?} seconds {:.3} inter_bytes {} intra_bytes {} proxy_put_bytes {}",
            o.op, rep.hosted, o.seconds, o.inter_node_bytes, o.intra_node_bytes, o.proxy_put_bytes
        );
    }
    for (r, what, h) in &rep.hashes {
        println!("hash {r} {what} {h}");
    }
    if let Some(m) = &mpi {
        m.barrier();
    }
    ExitCode::SUCCESS
}
