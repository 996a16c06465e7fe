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

/// The `hash` lines of a run, sorted.
fn hashes(stdout: &[u8]) -> Vec<String> {
    let mut v: Vec<String> = String::from_utf8_lossy(stdout)
        .lines()
        .filter(|l| l.starts_with("hash "))
        .map(String::from)
        .collect();
    v.sort();
    v
}

#[test]
fn dispatch_combine_across_processes_is_bit_identical_to_one_process() {
    same_hashes(2);
}

#[test]
fn two_nodes_of_four_gpus_across_processes() {
    same_hashes(4);
}

/// 2 nodes x `gpn` GPUs: one process vs one process per node.
fn same_hashes(gpn: u32) {
    let exe = env!("CARGO_BIN_EXE_netmpi-ep-check");
    let g = gpn.to_string();
    let t0 = Instant::now();
    let single = Command::new(exe)
        .args(["--single", "--gpus-per-node", &g])
        .output()
        .unwrap();
    assert!(
        single.status.success(),
        "{}",
        String::from_utf8_lossy(&single.stderr)
    );
    let t1 = Instant::now();
    let multi = mpirun(2)
        .args([exe, "--gpus-per-node", &g])
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&multi.stdout);
    assert!(
        multi.status.success(),
        "stdout:\n{so}\nstderr:\n{}",
        String::from_utf8_lossy(&multi.stderr)
    );
    let (a, b) = (hashes(&single.stdout), hashes(&multi.stdout));
    assert_eq!(a.len(), 2 * gpn as usize * 8, "{a:?}");
    assert_eq!(a, b, "multi-process stdout:\n{so}");
    // the proxies moved the inter-node legs, exactly the bytes the kernels counted as leaving
    // the node (records of every operation, BF16 and FP8 dispatch and combine of different
    // sizes, and the weight gradients' words), in each process
    let stats: Vec<&str> = so.lines().filter(|l| l.starts_with("stats ")).collect();
    assert!(
        stats.iter().any(|l| !l.ends_with("proxy_put_bytes 0")),
        "{so}"
    );
    for l in &stats {
        let field = |k: &str| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.iter()
                .position(|&x| x == k)
                .and_then(|i| w.get(i + 1))
                .copied()
        };
        assert!(field("inter_bytes").is_some(), "{l}");
        assert_eq!(field("inter_bytes"), field("proxy_put_bytes"), "{l}");
    }
    eprintln!("{so}single {:?}, 2 processes {:?}", t1 - t0, t1.elapsed());
}
