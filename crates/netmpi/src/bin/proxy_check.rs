//! `mpirun -np 2 netmpi-proxy-check`: the proxy transport between two processes over the MPI
//! engine, the host playing the kernels' part (`ep::proxycheck`: records both ways through a
//! ring with flow control, then a sparse window). Prints one `OK` line per rank and exits 0,
//! or names what went wrong and exits 1.

use ep::proxycheck::PairCfg;
use netmpi::Mpi;
use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

const RECORDS: u32 = 50;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("netmpi-proxy-check: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let mpi = Mpi::init()?;
    let p = mpi.rank();
    let cfg = PairCfg {
        records: RECORDS,
        seed: 0,
        timeout: Duration::from_secs(20),
    };
    let stats = ep::proxycheck::run(Box::new(mpi.engine()?), &cfg)?;
    println!("rank {p}: OK {RECORDS} records each way, sparse words landed; proxy {stats:?}");
    mpi.barrier();
    Ok(())
}
