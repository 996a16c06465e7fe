//! `netmpi-ep-check [--single]`: [`netmpi::check`] at its default sizes (2 nodes x 2 GPUs), in
//! one process (`--single`) or one process per node under `mpirun -np 2`. Prints one
//! `hash <rank> <output> <fnv64>` line per hosted rank and output (the test compares both
//! modes' lines) and one `stats` line per operation.

use netmpi::check::{run, CheckCfg};
use netmpi::Mpi;
use std::process::ExitCode;

fn main() -> ExitCode {
    let single = std::env::args().any(|a| a == "--single");
    let mpi = match (!single).then(Mpi::init).transpose() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("netmpi-ep-check: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rep = match run(&CheckCfg::default(), mpi.as_ref()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("netmpi-ep-check: {e}");
            return ExitCode::FAILURE;
        }
    };
    for o in &rep.ops {
        println!(
            "stats {} ranks {:?} seconds {:.3} inter_bytes {} intra_bytes {} proxy_put_bytes_total {}",
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
