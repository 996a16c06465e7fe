//! `ptxforge sim`: simulate a training step of an MoE model on a cluster (crate `sim`).
use anyhow::Context;
use serde_json::json;
use sim::{Config, ScheduleKind};

#[derive(clap::Args)]
pub struct Args {
    /// Preset (`v3`, `h200-node`) or a TOML/JSON configuration file.
    pub config: String,
    /// SMs reserved for dispatch/combine (overrides the configuration).
    #[arg(long)]
    pub comm_sms: Option<usize>,
    /// Pipeline schedule: dualpipe, dualpipev, 1f1b, zb1p.
    #[arg(long)]
    pub schedule: Option<String>,
    /// Sweep the communication SM budget, e.g. `comm-sms=0..40` (inclusive).
    #[arg(long)]
    pub sweep: Option<String>,
    /// Emit JSON.
    #[arg(long)]
    pub json: bool,
    /// Write the sweep plot as SVG.
    #[arg(long)]
    pub svg: Option<String>,
    /// Write the sweep plot as PNG.
    #[arg(long)]
    pub png: Option<String>,
    /// Write a Perfetto (Chrome JSON) trace of one pipeline rank.
    #[arg(long)]
    pub trace: Option<String>,
    /// Rank for --trace (default: the critical rank).
    #[arg(long)]
    pub rank: Option<usize>,
    /// Print the resolved configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let mut cfg = Config::load(&a.config)?;
    if let Some(n) = a.comm_sms {
        cfg.comm.sms = n;
    }
    if let Some(s) = &a.schedule {
        cfg.schedule = s.parse::<ScheduleKind>()?;
    }
    cfg.validate()?;
    if a.print_config {
        print!("{}", cfg.to_toml());
        return Ok(());
    }
    if let Some(spec) = &a.sweep {
        if a.trace.is_some() {
            anyhow::bail!("--trace applies to a single simulation, not to --sweep");
        }
        let (lo, hi) = sim::parse_sweep(spec)?;
        let sw = sim::sweep(&cfg, lo, hi)?;
        let title = format!(
            "{} on {} GPUs ({}): step time and exposed communication vs communication SMs",
            cfg.model.name,
            cfg.gpus(),
            cfg.schedule
        );
        if let Some(p) = &a.svg {
            std::fs::write(p, sim::plot::svg(&sw, &title)?)
                .with_context(|| format!("writing {p}"))?;
        }
        if let Some(p) = &a.png {
            std::fs::write(p, sim::plot::png(&sw, &title)?)
                .with_context(|| format!("writing {p}"))?;
        }
        if a.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&json!({"config": cfg, "sweep": sw}))?
            );
        } else {
            print!("{}", sw.text());
        }
        return Ok(());
    }
    if a.svg.is_some() || a.png.is_some() {
        anyhow::bail!("--svg/--png plot a sweep: add --sweep comm-sms=LO..HI");
    }
    let s = sim::run(&cfg)?;
    if let Some(p) = &a.trace {
        let rank = a.rank.unwrap_or(s.report.critical_rank);
        let t = sim::trace::rank_trace(&s, rank).ok_or_else(|| {
            anyhow::anyhow!(
                "--rank {rank}: the pipeline has {} ranks",
                cfg.parallelism.pp
            )
        })?;
        std::fs::write(p, serde_json::to_vec(&t)?).with_context(|| format!("writing {p}"))?;
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"config": cfg, "report": s.report}))?
        );
    } else {
        print!("{}", s.report.text());
    }
    Ok(())
}
