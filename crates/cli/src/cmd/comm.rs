//! `ptxforge comm` (cargo feature `mpi`): the expert-parallel communication check
//! ([`netmpi::check`]) in one process, or one process per node under
//! `mpirun -np NODES ptxforge comm --nodes NODES ...` (detected from Open MPI's
//! `OMPI_COMM_WORLD_SIZE`): dispatch (BF16, FP8), combine (weighted, unweighted), cached
//! dispatch and the top-k weight gradients, with per-rank-group time and bytes per leg and a hash
//! of every output (equal in both modes). Under MPI, process 0 prints every process's report.

use anyhow::Context;
use clap::Parser;
use netmpi::check::{run as run_check, CheckCfg, Report};
use netmpi::Mpi;

#[derive(Parser)]
pub struct Args {
    #[arg(long, default_value_t = 2)]
    nodes: u32,
    #[arg(long, default_value_t = 2)]
    gpus_per_node: u32,
    #[arg(long, default_value_t = 16)]
    experts: u32,
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    #[arg(long, default_value_t = 4)]
    topk: usize,
    /// Tokens of rank 0 (rank r has 3 r more, up to --max-tokens).
    #[arg(long, default_value_t = 20)]
    tokens: usize,
    #[arg(long, default_value_t = 32)]
    max_tokens: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Communication timeout (e.g. 500ms, 20s).
    #[arg(long, value_parser = super::parse_duration, default_value = "60s")]
    comm_timeout: std::time::Duration,
    /// Print the hash of every output of every rank.
    #[arg(long)]
    hashes: bool,
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let cfg = CheckCfg {
        nodes: a.nodes,
        gpus_per_node: a.gpus_per_node,
        experts: a.experts,
        hidden: a.hidden,
        topk: a.topk,
        tokens: a.tokens,
        max_tokens: a.max_tokens,
        seed: a.seed,
        timeout: a.comm_timeout,
    };
    let under_mpi = std::env::var("OMPI_COMM_WORLD_SIZE").is_ok();
    let mpi = under_mpi.then(Mpi::init).transpose()?;
    let rep = run_check(&cfg, mpi.as_ref()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let reports: Vec<Report> = match &mpi {
        None => vec![rep],
        Some(m) => {
            let mine = serde_json::to_vec(&rep)?;
            let all = m.all_gather_bytes(&mine);
            m.barrier();
            if m.rank() != 0 {
                return Ok(());
            }
            all.iter()
                .map(|b| serde_json::from_slice(b).context("a process's report"))
                .collect::<anyhow::Result<_>>()?
        }
    };
    if a.json {
        let v = serde_json::json!({ "config": cfg, "processes": reports });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print_table(&reports, a.hashes);
    Ok(())
}

fn print_table(reports: &[Report], hashes: bool) {
    println!("process  ranks     op                   seconds   inter B    intra B    proxy B");
    for r in reports {
        for o in &r.ops {
            println!(
                "{:>7}  {:<8}  {:<19} {:>8.3} {:>9} {:>10} {:>10}",
                r.process,
                format!("{:?}", r.hosted),
                o.op,
                o.seconds,
                o.inter_node_bytes,
                o.intra_node_bytes,
                o.proxy_put_bytes
            );
        }
    }
    if hashes {
        for r in reports {
            for (rank, what, h) in &r.hashes {
                println!("hash {rank} {what} {h}");
            }
        }
    }
}
