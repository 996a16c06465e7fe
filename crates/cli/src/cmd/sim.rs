//! `ptxforge sim`: simulate a training step or a prefill/decode serving deployment of an MoE
//! model on a cluster, fit a hardware profile to benchmark files, or print the reproduction of
//! DeepEP's and DeepGEMM's published tables (crate `sim`).
use anyhow::bail;
use serde_json::json;
use sim::calibrate::{self, HardwareProfile};
use sim::serve::{self, ServeConfig};
use sim::{AnyConfig, Config, ScheduleKind};

#[derive(clap::Args)]
pub struct Args {
    /// Preset (`v3`, `h200-node`, `v3-serve`) or a TOML/JSON configuration file (a file with a
    /// `workload` table is a serving configuration).
    pub config: Option<String>,
    /// SMs reserved for dispatch/combine (training; prefill for serving).
    #[arg(long)]
    pub comm_sms: Option<usize>,
    /// Pipeline schedule (training): dualpipe, dualpipev, 1f1b, zb1p.
    #[arg(long)]
    pub schedule: Option<String>,
    /// Sweep: `comm-sms=LO..HI` (training) or `batch=LO..HI` (serving decode), inclusive.
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
    /// Write a Perfetto (Chrome JSON) trace of one pipeline rank (training).
    #[arg(long)]
    pub trace: Option<String>,
    /// Rank for --trace (default: the critical rank).
    #[arg(long)]
    pub rank: Option<usize>,
    /// Print the resolved configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Use a hardware profile written by `--calibrate`.
    #[arg(long, value_name = "PROFILE")]
    pub hardware: Option<String>,
    /// Fit a hardware profile to `ptxforge bench gemm --json` / `ptxforge moe --json` files
    /// (starting from the configuration's hardware, H800 by default).
    #[arg(long, value_name = "FILE", num_args = 1..)]
    pub calibrate: Vec<String>,
    /// Where --calibrate writes the profile (TOML; default: standard output).
    #[arg(long, value_name = "PROFILE")]
    pub out: Option<String>,
    /// Print the published DeepEP and DeepGEMM tables next to the model's reproduction.
    #[arg(long)]
    pub tables: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    for (flag, p) in [
        ("--svg", &a.svg),
        ("--png", &a.png),
        ("--trace", &a.trace),
        ("--out", &a.out),
    ] {
        if let Some(p) = p {
            crate::out::preflight(flag, std::path::Path::new(p))?;
        }
    }
    if a.tables {
        return tables(&a);
    }
    if !a.calibrate.is_empty() {
        return run_calibrate(&a);
    }
    if a.out.is_some() {
        bail!("--out names the profile --calibrate writes");
    }
    let Some(name) = a.config.as_deref() else {
        bail!("give a preset (v3, h200-node, v3-serve) or a configuration file, or --calibrate FILE...");
    };
    let profile = match &a.hardware {
        Some(p) => Some(HardwareProfile::load(p)?),
        None => None,
    };
    match sim::load_any(name)? {
        AnyConfig::Training(mut cfg) => {
            if let Some(p) = &profile {
                calibrate::apply_to_training(&mut cfg, p);
            }
            run_training(&a, *cfg)
        }
        AnyConfig::Serving(mut cfg) => {
            if let Some(p) = &profile {
                calibrate::apply_to_serving(&mut cfg, p);
            }
            run_serving(&a, *cfg)
        }
    }
}

fn tables(a: &Args) -> anyhow::Result<()> {
    let hw = match &a.hardware {
        Some(p) => HardwareProfile::load(p)?,
        None => HardwareProfile {
            hardware: sim::config::h800(),
            gemm: sim::compute::GemmCal::h800(),
            sources: vec![],
            gemm_samples: 0,
            comm_samples: 0,
            gemm_rms_error: 0.0,
            comm_rms_error: 0.0,
            attn: None,
            mla_decode: None,
        },
    };
    let ep = sim::comm::deepep_table(&hw.hardware, &sim::comm::DeepEpBench::default());
    let gm = sim::compute::deepgemm_table(&hw.hardware, &hw.gemm);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"deepep": ep, "deepgemm": gm}))?
        );
    } else {
        println!("DeepEP (H800, 4096 tokens normal / 128 low-latency, hidden 7168, top-8):");
        print!("{}", sim::comm::deepep_markdown(&ep));
        println!("\nDeepGEMM (H800, FP8):");
        for r in &gm {
            println!(
                "{:>6}x{:>6}x{:>6} g{}: published {:6.0} TFLOP/s, simulated {:6.0} ({:+.1}%)",
                r.m,
                r.n,
                r.k,
                r.groups,
                r.published_tflops,
                r.simulated_tflops,
                r.error * 100.0
            );
        }
    }
    Ok(())
}

fn run_calibrate(a: &Args) -> anyhow::Result<()> {
    let base = match a.config.as_deref() {
        None => sim::config::h800(),
        Some(n) => match sim::load_any(n)? {
            AnyConfig::Training(c) => c.hardware,
            AnyConfig::Serving(c) => c.hardware,
        },
    };
    let p = calibrate::calibrate(&base, &sim::compute::GemmCal::h800(), &a.calibrate)?;
    let text = p.to_toml();
    match &a.out {
        Some(path) => {
            crate::out::write(path.as_ref(), text.as_bytes())?;
            eprintln!(
                "profile written to {path}: {} GEMM samples (rms error {:.1}%), {} dispatch/combine samples (rms error {:.1}%)",
                p.gemm_samples,
                p.gemm_rms_error * 100.0,
                p.comm_samples,
                p.comm_rms_error * 100.0
            );
            if a.json {
                println!("{}", serde_json::to_string_pretty(&p)?);
            }
        }
        None if a.json => println!("{}", serde_json::to_string_pretty(&p)?),
        None => print!("{text}"),
    }
    Ok(())
}

fn write_plots(
    a: &Args,
    svg: impl Fn() -> sim::Result<String>,
    png: impl Fn() -> sim::Result<Vec<u8>>,
) -> anyhow::Result<()> {
    if let Some(p) = &a.svg {
        crate::out::write(p.as_ref(), svg()?.as_bytes())?;
    }
    if let Some(p) = &a.png {
        crate::out::write(p.as_ref(), &png()?)?;
    }
    Ok(())
}

fn run_serving(a: &Args, mut cfg: ServeConfig) -> anyhow::Result<()> {
    if a.schedule.is_some() || a.trace.is_some() || a.rank.is_some() {
        bail!("--schedule, --trace and --rank apply to training configurations, not to serving");
    }
    if let Some(n) = a.comm_sms {
        cfg.prefill.comm_sms = n;
    }
    cfg.validate()?;
    if a.print_config {
        print!("{}", cfg.to_toml());
        return Ok(());
    }
    if let Some(spec) = &a.sweep {
        let (lo, hi) = serve::parse_batch_sweep(spec)?;
        let sw = serve::decode_sweep(&cfg, lo, hi)?;
        let title = format!(
            "{} decode, EP{} ({} nodes): throughput per node vs speed per user",
            cfg.model.name,
            cfg.decode.nodes * cfg.decode.gpus_per_node,
            cfg.decode.nodes
        );
        write_plots(
            a,
            || sim::serve_plot::svg(&sw, &title),
            || sim::serve_plot::png(&sw, &title),
        )?;
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
        bail!("--svg/--png plot a sweep: add --sweep batch=LO..HI");
    }
    let r = serve::simulate(&cfg)?;
    let cmp = serve::compare_published(&r);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"config": cfg, "report": r, "published": cmp}))?
        );
    } else {
        print!("{}", r.text());
        for p in &cmp {
            println!(
                "  {}: DeepSeek {}, simulated {:.1} ({:+.1}%)",
                p.what,
                p.published,
                p.simulated,
                p.error * 100.0
            );
        }
    }
    Ok(())
}

fn run_training(a: &Args, mut cfg: Config) -> anyhow::Result<()> {
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
            bail!("--trace applies to a single simulation, not to --sweep");
        }
        let (lo, hi) = sim::parse_sweep(spec)?;
        let sw = sim::sweep(&cfg, lo, hi)?;
        let title = format!(
            "{} on {} GPUs ({}): step time and exposed communication vs communication SMs",
            cfg.model.name,
            cfg.gpus(),
            cfg.schedule
        );
        write_plots(
            a,
            || sim::plot::svg(&sw, &title),
            || sim::plot::png(&sw, &title),
        )?;
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
        bail!("--svg/--png plot a sweep: add --sweep comm-sms=LO..HI");
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
        crate::out::write(p.as_ref(), &serde_json::to_vec(&t)?)?;
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
