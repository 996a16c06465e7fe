//! Runs `netmpi-proxy-check` under `mpirun -np 2` (Open MPI, installed by scripts/test.sh).
use std::process::Command;
use std::time::{Duration, Instant};

/// `mpirun` with what CI (root, few cores) needs.
pub fn mpirun(np: u32) -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(np.to_string())
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_mpi_yield_when_idle", "1");
    c
}

#[test]
fn proxy_between_two_processes_over_mpi() {
    let t0 = Instant::now();
    let out = mpirun(2)
        .arg(env!("CARGO_BIN_EXE_netmpi-proxy-check"))
        .output()
        .expect("mpirun must be installed (scripts/test.sh installs openmpi-bin)");
    let so = String::from_utf8_lossy(&out.stdout);
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{so}\nstderr:\n{se}");
    for r in 0..2 {
        assert!(so.contains(&format!("rank {r}: OK")), "stdout:\n{so}");
    }
    eprintln!("{so}took {:?}", t0.elapsed());
    assert!(t0.elapsed() < Duration::from_secs(120));
}
